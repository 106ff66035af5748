#pragma once
/// \file
/// The training of the model-parallel tests (tests/engine/test_model_group.cpp on the CPU,
/// tests/cuda/test_groups_one_gpu.cpp on ranks sharing one GPU), over any `rank_rig`: where the ranks run, their
/// backend, and how the host writes gradients and reads parameters.
///
/// Pipeline parallelism (`set_model_group`): each stage's engine holds its own mg_layers over its data group; the
/// gradient norm that clipping uses, and an overflow, are the whole model's. Tensor parallelism: a column-split
/// weight and a replicated one (`tensor_replicated`), which counts once in the norm. Every gradient is dyadic, so
/// every norm is exact in fp32 and fp64 whatever the order of its sums.

#include "engine_harness.hpp"
#include "parallel_settings.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <limits>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero_test {

inline zero::config mg_config(int data_ranks, int stage, double clip) {
  zero::config_inputs in;
  in.world_size = data_ranks;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": )" +
                                       std::to_string(clip) +
                                       R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
             "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})",
                                   in);
}

/// The mg_layers: (name, elements), one module each; stage s of the pipeline holds mg_layers[s].
inline const std::vector<std::pair<std::string, std::size_t>> mg_layers = {{"a", 96}, {"b", 160}};

/// A gradient every setting computes the same: dyadic, so squares and sums are exact in fp32 and fp64.
inline float mg_grad(int step, int data_rank, std::size_t layer, std::size_t i) {
  const auto k = static_cast<int>((i * 7 + static_cast<std::size_t>(step) * 3 + layer * 11) % 17) - 8;
  return static_cast<float>(k + data_rank) / 64.0F;
}

/// Each layer's final values, by name.
using mg_weights = std::map<std::string, std::vector<float>>;

/// Trains the mg_layers `mine` of each rank with the data group `data` for `steps` steps, writing the gradients
/// and reading the parameters through `io`; data rank 0 puts each layer's final values in `out`.
template <class Engine, class Comm, class Io>
void mg_train(Engine& eng, Comm& data, const std::vector<std::size_t>& mine, int steps, mg_weights& out, std::mutex& mu,
              const Io& io) {
  std::vector<int> modules;
  std::vector<zero::param_handle> params;
  for (const std::size_t l : mine) {
    modules.push_back(eng.add_module(mg_layers[l].first));
    params.push_back(
        eng.add_param(modules.back(), mg_layers[l].first + ".w", {static_cast<std::int64_t>(mg_layers[l].second)}));
  }
  eng.finalize();
  eng.init_params([](const zero::param_info& p, std::size_t first, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>((first + i + p.name.size()) % 13) / 16.0F - 0.25F;
    }
  });
  for (int step = 0; step < steps; ++step) {
    for (std::size_t j = 0; j < mine.size(); ++j) {
      auto on = eng.gather(modules[j]);
      const auto view = eng.grad(params[j]);
      auto g = io.template read<float>(eng, view);
      for (std::size_t i = 0; i < mg_layers[mine[j]].second; ++i) {
        g[i] += mg_grad(step, data.rank(), mine[j], i);
      }
      io.write(eng, view, g);
      eng.grad_ready(params[j]);
    }
    CHECK(eng.step().applied);
  }
  auto all = eng.gather_all();
  if (data.rank() == 0) {
    std::vector<std::vector<float>> values;
    for (const auto& p : params) {
      values.push_back(io.template read<float>(eng, eng.param(p)));
    }
    const std::lock_guard lock(mu);
    for (std::size_t j = 0; j < mine.size(); ++j) {
      out[mg_layers[mine[j]].first] = std::move(values[j]);
    }
  }
}

/// One engine holding every layer on 2 data ranks.
template <class Rig> mg_weights mg_whole_model(const Rig& rig, int stage, double clip) {
  mg_weights out;
  std::mutex mu;
  rig.run_group(2, [&](auto& comm) {
    auto backend = rig.make_backend(comm);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(comm)>> eng(mg_config(2, stage, clip), comm, backend);
    mg_train(eng, comm, {0, 1}, 4, out, mu, rig.io);
  });
  return out;
}

/// 4 ranks as (pipe 2, data 2): stage s's engine holds mg_layers[s] over its data group, with the pipeline group
/// as its model group when `with_model_group`.
template <class Rig> mg_weights mg_pipelined(const Rig& rig, int stage, double clip, bool with_model_group) {
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  mg_weights out;
  std::mutex mu;
  rig.run_group(4, [&](auto& world) {
    auto data = topo.split(world, {"data"});
    auto pipe = topo.split(world, {"pipe"});
    auto backend = rig.make_backend(world);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(world)>> eng(mg_config(2, stage, clip), data, backend);
    if (with_model_group) {
      eng.set_model_group(pipe);
    }
    mg_train(eng, data, {static_cast<std::size_t>(topo.coord(world.rank(), "pipe"))}, 4, out, mu, rig.io);
  });
  return out;
}

/// 4 ranks as (pipe 2, data 2) at stage 2, clipping at 1, each stage's engine holding a 32-element weight of
/// gradients 0.25; at step 1 stage 1's data rank 0 writes an inf into its gradient. \returns each world rank's
/// `applied` per step.
template <class Rig> std::map<int, std::vector<bool>> mg_inf_applied(const Rig& rig, bool with_model_group) {
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  std::mutex mu;
  std::map<int, std::vector<bool>> applied; // world rank -> applied per step
  rig.run_group(4, [&](auto& world) {
    auto data = topo.split(world, {"data"});
    auto pipe = topo.split(world, {"pipe"});
    auto backend = rig.make_backend(world);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(world)>> eng(mg_config(2, 2, 1.0), data, backend);
    if (with_model_group) {
      eng.set_model_group(pipe);
    }
    const int s = topo.coord(world.rank(), "pipe");
    const int m = eng.add_module("m");
    auto w = eng.add_param(m, "w", {32});
    eng.finalize();
    std::vector<bool> mine;
    for (int step = 0; step < 3; ++step) {
      auto on = eng.gather(m);
      const auto view = eng.grad(w);
      auto g = rig.io.template read<float>(eng, view);
      for (std::size_t i = 0; i < 32; ++i) {
        g[i] += 0.25F;
      }
      if (step == 1 && s == 1 && data.rank() == 0) {
        g[5] = std::numeric_limits<float>::infinity(); // stage 1 only
      }
      rig.io.write(eng, view, g);
      eng.grad_ready(w);
      mine.push_back(eng.step().applied);
    }
    const std::lock_guard lock(mu);
    applied[world.rank()] = mine;
  });
  return applied;
}

// Tensor parallelism over 4 ranks as (tensor 2, data 2): a column-split weight "col.w" {8, 6}, each tensor rank
// registering its 4 rows, and a replicated "ln.w" {6}, the same on both tensor ranks, gradients too. One engine on
// 2 data ranks holding both whole is the reference.
inline constexpr std::int64_t tp_rows = 8, tp_cols = 6;

inline zero::config tp_config(int stage, const std::string& top, const std::string& zero_keys) {
  return parallel_config(2, stage, top, zero_keys);
}

struct tp_result {
  std::vector<float> col, ln; // col: the whole weight (the reference) or this tensor rank's rows
  std::vector<double> norms;
};

/// Trains `steps` steps (`micro` micro-steps each) of rows [row0, row0 + rows) of col.w and ln.w;
/// `replicated` marks ln.w tensor_replicated. Gradients are dyadic, so every norm is exact.
template <class Engine, class Io>
tp_result tp_train(Engine& eng, int data_rank, std::int64_t row0, std::int64_t rows, bool replicated, int micro,
                   const Io& io) {
  const int m = eng.add_module("m");
  auto col = eng.add_param(m, "col.w", {rows, tp_cols});
  auto ln = eng.add_param(m, "ln.w", {tp_cols}, {.weight_decay = 0.0, .tensor_replicated = replicated});
  eng.finalize();
  eng.init_params([row0](const zero::param_info& p, std::size_t first, std::span<float> v) {
    const std::size_t base = p.name == "col.w" ? static_cast<std::size_t>(row0 * tp_cols) : 0;
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>((base + first + i + p.name.size()) % 11) / 16.0F - 0.25F;
    }
  });
  tp_result r;
  for (int step = 0; step < 3 * micro; ++step) {
    {
      auto on = eng.gather(m);
      const auto col_grad = eng.grad(col);
      auto gc = io.template read<float>(eng, col_grad);
      for (std::size_t i = 0; i < static_cast<std::size_t>(rows * tp_cols); ++i) {
        gc[i] += mg_grad(step, data_rank, 0, static_cast<std::size_t>(row0 * tp_cols) + i);
      }
      io.write(eng, col_grad, gc);
      eng.grad_ready(col);
      const auto ln_grad = eng.grad(ln);
      auto gl = io.template read<float>(eng, ln_grad);
      for (std::size_t i = 0; i < tp_cols; ++i) {
        gl[i] += mg_grad(step, data_rank, 1, i);
      }
      io.write(eng, ln_grad, gl);
      eng.grad_ready(ln);
    }
    const auto s = eng.step();
    if (s.boundary) {
      r.norms.push_back(s.grad_norm);
    }
  }
  auto all = eng.gather_all();
  r.col = io.template read<float>(eng, eng.param(col));
  r.ln = io.template read<float>(eng, eng.param(ln));
  return r;
}

/// The reference: one engine on 2 data ranks holding col.w and ln.w whole (data rank 0's result).
template <class Rig> tp_result tp_whole(const Rig& rig, const parallel_setting& set) {
  tp_result want;
  rig.run_group(2, [&](auto& comm) {
    auto backend = rig.make_backend(comm);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(comm)>> eng(
        tp_config(set.stage, set.top, set.zero_keys), comm, backend);
    auto r = tp_train(eng, comm.rank(), 0, tp_rows, false, set.micro, rig.io);
    if (comm.rank() == 0) {
      want = std::move(r);
    }
  });
  return want;
}

/// 4 ranks as (tensor 2, data 2), the tensor group the model group: tensor rank -> data rank 0's result.
template <class Rig> std::map<int, tp_result> tp_sliced(const Rig& rig, const parallel_setting& set, bool replicated) {
  const zero::topology topo({{"tensor", 2}, {"data", 2}});
  std::mutex mu;
  std::map<int, tp_result> got;
  rig.run_group(4, [&](auto& world) {
    auto data = topo.split(world, {"data"});
    auto tensor = topo.split(world, {"tensor"});
    const int t = topo.coord(world.rank(), "tensor");
    auto backend = rig.make_backend(world);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(world)>> eng(
        tp_config(set.stage, set.top, set.zero_keys), data, backend);
    eng.set_model_group(tensor, {.tensor = t, .tensor_size = 2});
    auto r = tp_train(eng, data.rank(), t * (tp_rows / 2), tp_rows / 2, replicated, set.micro, rig.io);
    if (data.rank() == 0) {
      const std::lock_guard lock(mu);
      got[t] = std::move(r);
    }
  });
  return got;
}

/// The tensor-parallel job on `rig` against `want` (`tp_whole`'s): a tensor-replicated ln.w counts once in the norm,
/// so each tensor rank's norms and ln.w are the whole model's and its rows of col.w the whole's slice; counted on
/// both tensor ranks, the norm is larger, the clip stronger and ln.w another.
template <class Rig> void check_tp_sliced(const Rig& rig, const parallel_setting& set, const tp_result& want) {
  for (bool replicated : {true, false}) {
    CAPTURE(replicated);
    auto got = tp_sliced(rig, set, replicated); // tensor rank -> data rank 0's result
    for (int t = 0; t < 2; ++t) {
      CAPTURE(t);
      const auto& g = got[t];
      if (replicated) {
        CHECK(g.norms == want.norms);
        CHECK(g.ln == want.ln);
        CHECK(std::equal(g.col.begin(), g.col.end(), want.col.begin() + t * (tp_rows / 2) * tp_cols));
      } else {
        REQUIRE(g.norms.size() == want.norms.size());
        CHECK(g.norms[0] > want.norms[0]);
        CHECK(g.ln != want.ln);
      }
    }
  }
}

} // namespace zero_test
