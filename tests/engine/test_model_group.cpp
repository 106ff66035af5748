// ZeRO over the data-parallel group of a pipeline-parallel job (`set_model_group`): each pipeline
// stage's engine holds its own mg_layers and shards them over its data group, and the gradient norm
// that clipping uses, and fp16's overflow, are the whole model's. Trained on 4 in-process ranks as
// (pipe 2, data 2), the weights equal those of one engine holding every layer on the 2 data ranks.

#include "parallel_settings.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <algorithm>
#include <cstddef>
#include <doctest/doctest.h>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using mg_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;

zero::config mg_config(int data_ranks, int stage, double clip) {
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
const std::vector<std::pair<std::string, std::size_t>> mg_layers = {{"a", 96}, {"b", 160}};

/// A gradient every setting computes the same: dyadic, so squares and sums are exact in fp32 and fp64.
float mg_grad(int step, int data_rank, std::size_t layer, std::size_t i) {
  const auto k = static_cast<int>((i * 7 + static_cast<std::size_t>(step) * 3 + layer * 11) % 17) - 8;
  return static_cast<float>(k + data_rank) / 64.0F;
}

/// Trains the given mg_layers of each rank with the data group `data` (and `model`, the pipeline group,
/// when not null) for `steps` steps, returning each layer's final values (from data rank 0).
void mg_train(mg_engine& eng, zero::thread_communicator& data, const std::vector<std::size_t>& mine, int steps,
              std::map<std::string, std::vector<float>>& out, std::mutex& mu) {
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
      float* g = eng.grad(params[j]).as<float>();
      for (std::size_t i = 0; i < mg_layers[mine[j]].second; ++i) {
        g[i] += mg_grad(step, data.rank(), mine[j], i);
      }
      eng.grad_ready(params[j]);
    }
    CHECK(eng.step().applied);
  }
  auto all = eng.gather_all();
  if (data.rank() == 0) {
    const std::lock_guard lock(mu);
    for (std::size_t j = 0; j < mine.size(); ++j) {
      const float* v = eng.param(params[j]).as<float>();
      out[mg_layers[mine[j]].first].assign(v, v + mg_layers[mine[j]].second);
    }
  }
}

std::map<std::string, std::vector<float>> mg_whole_model(int stage, double clip) {
  std::map<std::string, std::vector<float>> out;
  std::mutex mu;
  zero::run_ranks(2, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(2, stage, clip), comm, backend);
    mg_train(eng, comm, {0, 1}, 4, out, mu);
  });
  return out;
}

std::map<std::string, std::vector<float>> mg_pipelined(int stage, double clip, bool with_model_group) {
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  std::map<std::string, std::vector<float>> out;
  std::mutex mu;
  zero::run_ranks(4, [&](zero::thread_communicator& world) {
    auto data = topo.split(world, {"data"});
    auto pipe = topo.split(world, {"pipe"});
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(2, stage, clip), data, backend);
    if (with_model_group) {
      eng.set_model_group(pipe);
    }
    mg_train(eng, data, {static_cast<std::size_t>(topo.coord(world.rank(), "pipe"))}, 4, out, mu);
  });
  return out;
}

} // namespace

TEST_CASE("pipeline stages with set_model_group clip by the whole model's norm: the weights of one engine") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto want = mg_whole_model(stage, 0.05); // a clip the norm exceeds every step
    REQUIRE(want.size() == 2);
    CHECK(mg_pipelined(stage, 0.05, true) == want);
    // Without the model group each stage clips by its own mg_layers' norm: other weights.
    CHECK(mg_pipelined(stage, 0.05, false) != want);
    // Unclipped, the groups do not matter.
    CHECK(mg_pipelined(stage, 0, true) == mg_whole_model(stage, 0));
  }
}

TEST_CASE("an inf in one pipeline stage's gradients skips the step on every stage with set_model_group") {
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  for (bool with_model_group : {true, false}) {
    CAPTURE(with_model_group);
    std::mutex mu;
    std::map<int, std::vector<bool>> applied; // world rank -> applied per step
    zero::run_ranks(4, [&](zero::thread_communicator& world) {
      auto data = topo.split(world, {"data"});
      auto pipe = topo.split(world, {"pipe"});
      zero::cpu_backend backend({.threads = 1});
      mg_engine eng(mg_config(2, 2, 1.0), data, backend);
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
        float* g = eng.grad(w).as<float>();
        for (std::size_t i = 0; i < 32; ++i) {
          g[i] += 0.25F;
        }
        if (step == 1 && s == 1 && data.rank() == 0) {
          g[5] = std::numeric_limits<float>::infinity(); // stage 1 only
        }
        eng.grad_ready(w);
        mine.push_back(eng.step().applied);
      }
      const std::lock_guard lock(mu);
      applied[world.rank()] = mine;
    });
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      const bool stage1 = topo.coord(r, "pipe") == 1;
      // Step 1 is skipped where the inf is, and with the model group on every stage.
      CHECK(applied[r] == std::vector<bool>{true, !(with_model_group || stage1), true});
    }
  }
}

TEST_CASE("set_model_group after finalize is refused") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(1, 1, 0), comm, backend);
    eng.add_param(eng.add_module("m"), "w", {8});
    eng.finalize();
    CHECK_THROWS_WITH_AS(eng.set_model_group(comm), doctest::Contains("set_model_group after finalize()"),
                         zero::usage_error);
  });
}

namespace {

// Tensor parallelism over 4 in-process ranks as (tensor 2, data 2): a column-split weight "col.w"
// {8, 6}, each tensor rank registering its 4 rows, and a replicated "ln.w" {6}, the same on both
// tensor ranks, gradients too. One engine on 2 data ranks holding both whole is the reference.
constexpr std::int64_t tp_rows = 8, tp_cols = 6;

zero::config tp_config(int stage, const std::string& top, const std::string& zero_keys) {
  return zero_test::parallel_config(2, stage, top, zero_keys);
}

struct tp_result {
  std::vector<float> col, ln; // col: the whole weight (the reference) or this tensor rank's rows
  std::vector<double> norms;
};

/// Trains `steps` steps (`micro` micro-steps each) of rows [row0, row0 + rows) of col.w and ln.w;
/// `replicated` marks ln.w tensor_replicated. Gradients are dyadic, so every norm is exact.
tp_result tp_train(mg_engine& eng, int data_rank, std::int64_t row0, std::int64_t rows, bool replicated, int micro) {
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
      float* gc = eng.grad(col).as<float>();
      for (std::size_t i = 0; i < static_cast<std::size_t>(rows * tp_cols); ++i) {
        gc[i] += mg_grad(step, data_rank, 0, static_cast<std::size_t>(row0 * tp_cols) + i);
      }
      eng.grad_ready(col);
      float* gl = eng.grad(ln).as<float>();
      for (std::size_t i = 0; i < tp_cols; ++i) {
        gl[i] += mg_grad(step, data_rank, 1, i);
      }
      eng.grad_ready(ln);
    }
    const auto s = eng.step();
    if (s.boundary) {
      r.norms.push_back(s.grad_norm);
    }
  }
  auto all = eng.gather_all();
  const float* c = eng.param(col).as<float>();
  const float* l = eng.param(ln).as<float>();
  r.col.assign(c, c + rows * tp_cols);
  r.ln.assign(l, l + tp_cols);
  return r;
}

} // namespace

TEST_CASE("tensor parallelism: a replicated parameter counts once in the clipping norm; the weights and norms of "
          "one engine holding the whole model") {
  zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
    tp_result want;
    zero::run_ranks(2, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      mg_engine eng(tp_config(set.stage, set.top, set.zero_keys), comm, backend);
      auto r = tp_train(eng, comm.rank(), 0, tp_rows, false, set.micro);
      if (comm.rank() == 0) {
        want = std::move(r);
      }
    });
    REQUIRE(want.norms.size() == 3);
    for (bool replicated : {true, false}) {
      CAPTURE(replicated);
      const zero::topology topo({{"tensor", 2}, {"data", 2}});
      std::mutex mu;
      std::map<int, tp_result> got; // tensor rank -> data rank 0's result
      zero::run_ranks(4, [&](zero::thread_communicator& world) {
        auto data = topo.split(world, {"data"});
        auto tensor = topo.split(world, {"tensor"});
        const int t = topo.coord(world.rank(), "tensor");
        zero::cpu_backend backend({.threads = 1});
        mg_engine eng(tp_config(set.stage, set.top, set.zero_keys), data, backend);
        eng.set_model_group(tensor, {.tensor = t, .tensor_size = 2});
        auto r = tp_train(eng, data.rank(), t * (tp_rows / 2), tp_rows / 2, replicated, set.micro);
        if (data.rank() == 0) {
          const std::lock_guard lock(mu);
          got[t] = std::move(r);
        }
      });
      for (int t = 0; t < 2; ++t) {
        CAPTURE(t);
        const auto& g = got[t];
        if (replicated) {
          CHECK(g.norms == want.norms);
          CHECK(g.ln == want.ln);
          CHECK(std::equal(g.col.begin(), g.col.end(), want.col.begin() + t * (tp_rows / 2) * tp_cols));
        } else {
          // ln.w counted on both tensor ranks: a larger norm, a stronger clip, other weights.
          CHECK(g.norms[0] > want.norms[0]);
          CHECK(g.ln != want.ln);
        }
      }
    }
  });
}

TEST_CASE("set_model_group refuses coordinates outside their axes; add_param a tensor_split outside the shape") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(1, 1, 0), comm, backend);
    const auto refused = [&](zero::model_coords at, const std::string& what) {
      CHECK_THROWS_WITH_AS(eng.set_model_group(comm, at), doctest::Contains(what.c_str()), zero::usage_error);
    };
    refused({.tensor = -1, .tensor_size = 2},
            "pipe 0, tensor -1 of 2; expected pipe >= 0 and 0 <= tensor < tensor_size");
    refused({.tensor = 2, .tensor_size = 2}, "tensor 2 of 2");
    refused({.pipe = -1}, "pipe -1, tensor 0 of 1");
    refused({.tensor_size = 0}, "tensor 0 of 0");
    CHECK(eng.model_place() == nullptr);
    eng.set_model_group(comm, {.pipe = 1, .tensor = 1, .tensor_size = 2});
    REQUIRE(eng.model_place() != nullptr);
    CHECK(eng.model_place()->pipe == 1);
    const int m = eng.add_module("m");
    CHECK_THROWS_WITH_AS(eng.add_param(m, "w", {4, 6}, {.tensor_split = 2}),
                         doctest::Contains("add_param(\"w\"): tensor_split 2 is not a dimension of its 2-dimensional "
                                           "shape (expected -1 for a whole parameter, or 0 to 1)"),
                         zero::usage_error);
    CHECK_THROWS_AS(eng.add_param(m, "w", {4, 6}, {.tensor_split = -2}), zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.add_param(m, "w", {4, 6}, {.tensor_replicated = true, .tensor_split = 0}),
                         doctest::Contains("tensor_split 0 and tensor_replicated together"), zero::usage_error);
    eng.add_param(m, "w", {4, 6}, {.tensor_split = 1});
  });
}

TEST_CASE("the config's pipeline.stages and tensor_parallel.autotp_size: the job's layout, and each engine's place "
          "checked at finalize") {
  const auto sized = [](int data_ranks, const std::string& parallel) {
    zero::config_inputs in;
    in.world_size = data_ranks;
    return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, )" + parallel +
                                         R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                                          "zero_optimization": {"stage": 2}})",
                                     in);
  };
  const zero::config cfg = sized(1, R"("pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2})");

  // DeepSpeed's layout: (pipe, data, tensor), tensor peers neighbours.
  const zero::topology eight = zero::topology_from_config(cfg, 8);
  CHECK(eight.axis_size("pipe") == 2);
  CHECK(eight.axis_size("data") == 2);
  CHECK(eight.axis_size("tensor") == 2);
  CHECK(eight.coords(5) == std::vector<int>{1, 0, 1});
  CHECK(zero::topology_from_config(sized(8, R"("pipeline": {"stages": "auto"})"), 8).axis_size("data") == 8);
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::topology_from_config(cfg, 6)),
                       doctest::Contains("pipeline.stages 2 x tensor_parallel.autotp_size 2 does not divide the 6 "
                                         "ranks of the job"),
                       zero::config_error);

  // On 4 ranks (pipe 2, data 1, tensor 2), each engine over its data group, placed by the topology.
  zero::run_ranks(4, [&](zero::thread_communicator& world) {
    const zero::topology topo = zero::topology_from_config(cfg, world.size());
    auto data = topo.split(world, {"data"});
    auto model = topo.split(world, {"pipe", "tensor"});
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(cfg, data, backend);
    eng.set_model_group(
        model,
        {.pipe = topo.coord(world.rank(), "pipe"), .tensor = topo.coord(world.rank(), "tensor"), .tensor_size = 2});
    eng.add_param(eng.add_module("m"), "w", {8}, {.tensor_split = 0});
    eng.finalize();
    CHECK(eng.finalized());
  });

  // A place that disagrees with the config is refused at finalize, naming the key.
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto refused = [&](const zero::config& c, const zero::model_coords* at, const std::string& what) {
      mg_engine eng(c, comm, backend);
      if (at != nullptr) {
        eng.set_model_group(comm, *at);
      }
      eng.add_param(eng.add_module("m"), "w", {8});
      CHECK_THROWS_WITH_AS(eng.finalize(), doctest::Contains(what.c_str()), zero::config_error);
    };
    const zero::config tensor_only = sized(1, R"("tensor_parallel": {"autotp_size": 2})");
    const zero::config pipe_only = sized(1, R"("pipeline": {"stages": 2})");
    refused(tensor_only, nullptr,
            "tensor_parallel.autotp_size is 2, but this engine has no model group; expected "
            "set_model_group(group, {.tensor = t, .tensor_size = autotp_size})");
    refused(pipe_only, nullptr, "pipeline.stages is 2, but this engine has no model group");
    const zero::model_coords one_slice{.tensor = 0, .tensor_size = 1};
    refused(tensor_only, &one_slice,
            "tensor_parallel.autotp_size is 2, but set_model_group gave pipe 0, tensor 0 of 1; expected the same "
            "tensor size in model_coords::tensor_size");
    const zero::model_coords third_stage{.pipe = 2};
    refused(pipe_only, &third_stage, "pipeline.stages is 2, but set_model_group gave pipe 2");
    const zero::model_coords first_stage{.pipe = 0};
    refused(pipe_only, &first_stage,
            "expected a model group of a multiple of stages x tensor size = 2 ranks (it has 1)");
    // Sizes of 1, or "auto", ask for no model group.
    mg_engine plain(sized(1, R"("pipeline": {"stages": 1}, "tensor_parallel": {"autotp_size": 1})"), comm, backend);
    plain.add_param(plain.add_module("m"), "w", {8});
    plain.finalize();
    CHECK(plain.finalized());
  });
}
