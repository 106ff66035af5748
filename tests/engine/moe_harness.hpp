#pragma once
/// \file
/// The training of the mixture-of-experts tests (tests/engine/test_moe.cpp on the CPU,
/// tests/cuda/test_groups_one_gpu.cpp on ranks sharing one GPU), over any `rank_rig`: the dense parameters' engine
/// over the data group, the experts' engine over the expert-data group (`set_gradient_average`, the expert axis as
/// its model group), stepped as one optimizer (`step_together`) or each alone. Each expert rank receives its
/// experts' token gradients from the other expert rank by all_to_all, in buffers from the rig's io (device
/// memory on GPUs), and adds them on the host in the same order on every rig. Every gradient is dyadic, so every
/// sum, average, square and norm is exact whatever the order of its sums.

#include "engine_harness.hpp"
#include "parallel_settings.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

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

inline constexpr int moe_experts = 4;         // experts of the layer
inline constexpr std::size_t moe_dense = 72;  // elements of the dense weight
inline constexpr std::size_t moe_expert = 40; // elements of each expert's weight
inline constexpr int moe_steps = 3;

inline zero::config moe_config(int ranks, int stage, const std::string& top = "", const std::string& zero_keys = "") {
  return parallel_config(ranks, stage, top, zero_keys);
}

/// The gradient data rank `rank`'s tokens give parameter `which` (-1: the dense weight, else the
/// expert) at step `step`: dyadic, so every sum, average and square is exact.
inline float moe_grad(int step, int rank, int which, std::size_t i) {
  const auto k = static_cast<int>((i * 5 + static_cast<std::size_t>(step) * 3 +
                                   static_cast<std::size_t>(which + 1) * 7 + static_cast<std::size_t>(rank) * 2) %
                                  19) -
                 9;
  return static_cast<float>(k) / 32.0F;
}

template <class Engine> void moe_init(Engine& eng) {
  eng.init_params([](const zero::param_info& p, std::size_t first, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>((first + i + p.name.size() * 3) % 13) / 16.0F - 0.375F;
    }
  });
}

inline std::string expert_name(int j) { return "expert" + std::to_string(j) + ".w"; }

struct moe_result {
  std::map<std::string, std::vector<float>> weights; // data rank 0's (expert-data rank 0's for experts)
  std::vector<double> norms;
  std::vector<bool> applied;
};

/// Adds `add(i)` to every element of `p`'s gradient, through `io`.
template <class Engine, class Io, class Add>
void moe_add_grad(Engine& eng, zero::param_handle p, const Io& io, Add&& add) {
  const auto view = eng.grad(p);
  auto g = io.template read<float>(eng, view);
  for (std::size_t i = 0; i < g.size(); ++i) {
    g[i] += add(i);
  }
  io.write(eng, view, g);
}

/// The reference: one engine on 4 data ranks holding the dense weight and every expert; data rank
/// r's gradient of expert j is the sum its tokens give.
template <class Rig>
moe_result moe_reference(const Rig& rig, int stage, int micro, const std::string& top, const std::string& zero_keys) {
  moe_result out;
  rig.run_group(4, [&](auto& comm) {
    auto backend = rig.make_backend(comm);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(comm)>> eng(moe_config(4, stage, top, zero_keys), comm,
                                                                             backend);
    const int m = eng.add_module("layer");
    auto dense = eng.add_param(m, "dense.w", {static_cast<std::int64_t>(moe_dense)});
    std::vector<zero::param_handle> experts;
    for (int j = 0; j < moe_experts; ++j) {
      experts.push_back(eng.add_param(m, expert_name(j), {static_cast<std::int64_t>(moe_expert)}));
    }
    eng.finalize();
    moe_init(eng);
    moe_result r;
    for (int step = 0; step < moe_steps * micro; ++step) {
      {
        auto on = eng.gather(m);
        for (int j = 0; j < moe_experts; ++j) {
          moe_add_grad(eng, experts[static_cast<std::size_t>(j)], rig.io,
                       [&](std::size_t i) { return moe_grad(step, comm.rank(), j, i); });
          eng.grad_ready(experts[static_cast<std::size_t>(j)]);
        }
        moe_add_grad(eng, dense, rig.io, [&](std::size_t i) { return moe_grad(step, comm.rank(), -1, i); });
        eng.grad_ready(dense);
      }
      const auto s = eng.step();
      if (s.boundary) {
        r.norms.push_back(s.grad_norm);
        r.applied.push_back(s.applied);
      }
    }
    auto all = eng.gather_all();
    r.weights["dense.w"] = rig.io.template read<float>(eng, eng.param(dense));
    for (int j = 0; j < moe_experts; ++j) {
      r.weights[expert_name(j)] = rig.io.template read<float>(eng, eng.param(experts[static_cast<std::size_t>(j)]));
    }
    if (comm.rank() == 0) {
      out = std::move(r);
    }
  });
  return out;
}

/// Expert parallelism: 4 ranks as (expert-data 2, expert 2). The dense engine spans the 4 data
/// ranks; expert rank x's engine holds experts 2x and 2x + 1 over its 2 expert-data ranks.
/// `together`: stepped by `step_together` (else each engine alone); `infinity`: world rank 3's tokens
/// give expert 0 an inf at step 1.
template <class Rig>
moe_result moe_parallel(const Rig& rig, int stage, int micro, const std::string& top, const std::string& zero_keys,
                        bool together, bool infinity = false) {
  const zero::topology topo({{"edata", 2}, {"expert", 2}});
  constexpr int per_rank = moe_experts / 2;
  constexpr std::size_t block = per_rank * moe_expert; // elements sent to each expert rank
  moe_result out;
  std::mutex mu;
  rig.run_group(4, [&](auto& world) {
    using comm_type = std::remove_cvref_t<decltype(world)>;
    auto data = topo.split(world, {"edata", "expert"});
    auto edata = topo.split(world, {"edata"});
    auto expert_axis = topo.split(world, {"expert"});
    const int x = topo.coord(world.rank(), "expert");
    auto backend = rig.make_backend(world);
    using engine_type = zero::engine<decltype(backend), comm_type>;
    engine_type dense_eng(moe_config(4, stage, top, zero_keys), data, backend);
    engine_type expert_eng(moe_config(2, stage, top, zero_keys), edata, backend);
    expert_eng.set_model_group(expert_axis);
    expert_eng.set_gradient_average(data.size());
    const int dm = dense_eng.add_module("dense");
    auto dense = dense_eng.add_param(dm, "dense.w", {static_cast<std::int64_t>(moe_dense)});
    const int em = expert_eng.add_module("experts");
    std::vector<zero::param_handle> experts;
    for (int j = 0; j < per_rank; ++j) {
      experts.push_back(
          expert_eng.add_param(em, expert_name(x * per_rank + j), {static_cast<std::int64_t>(moe_expert)}));
    }
    dense_eng.finalize();
    expert_eng.finalize();
    moe_init(dense_eng);
    moe_init(expert_eng);
    moe_result r;
    std::vector<float> tokens(2 * block);
    auto send = rig.io.template comm_buffer<float>(2 * block);
    auto recv = rig.io.template comm_buffer<float>(2 * block);
    for (int step = 0; step < moe_steps * micro; ++step) {
      {
        auto on_d = dense_eng.gather(dm);
        auto on_e = expert_eng.gather(em);
        // This rank's tokens' gradients of every expert, sent to the expert rank that holds it.
        for (int j = 0; j < moe_experts; ++j) {
          for (std::size_t i = 0; i < moe_expert; ++i) {
            tokens[static_cast<std::size_t>(j) * moe_expert + i] = moe_grad(step, world.rank(), j, i);
          }
        }
        if (infinity && step == 1 && world.rank() == 3) {
          tokens[5] = std::numeric_limits<float>::infinity(); // expert 0, held by expert rank 0
        }
        rig.io.write_buffer(expert_eng, send, tokens);
        expert_axis.all_to_all(send.data(), recv.data(), block).wait();
        const std::vector<float> got = rig.io.read_buffer(expert_eng, recv);
        for (int j = 0; j < per_rank; ++j) {
          const auto view = expert_eng.grad(experts[static_cast<std::size_t>(j)]);
          auto g = rig.io.template read<float>(expert_eng, view);
          for (int from = 0; from < 2; ++from) {
            for (std::size_t i = 0; i < moe_expert; ++i) {
              g[i] += got[static_cast<std::size_t>(from) * block + static_cast<std::size_t>(j) * moe_expert + i];
            }
          }
          rig.io.write(expert_eng, view, g);
          expert_eng.grad_ready(experts[static_cast<std::size_t>(j)]);
        }
        moe_add_grad(dense_eng, dense, rig.io, [&](std::size_t i) { return moe_grad(step, world.rank(), -1, i); });
        dense_eng.grad_ready(dense);
      }
      zero::step_result sd, se;
      if (together) {
        const auto both = zero::step_together(dense_eng, expert_eng);
        sd = both[0];
        se = both[1];
        CHECK(sd.grad_norm == se.grad_norm);
        CHECK(sd.applied == se.applied);
      } else {
        sd = dense_eng.step();
        se = expert_eng.step();
      }
      if (sd.boundary) {
        r.norms.push_back(sd.grad_norm);
        r.applied.push_back(sd.applied);
      }
    }
    auto all_d = dense_eng.gather_all();
    auto all_e = expert_eng.gather_all();
    auto dense_values = rig.io.template read<float>(dense_eng, dense_eng.param(dense));
    std::vector<std::vector<float>> expert_values;
    for (const auto& e : experts) {
      expert_values.push_back(rig.io.template read<float>(expert_eng, expert_eng.param(e)));
    }
    const std::lock_guard lock(mu);
    if (world.rank() == 0) {
      out.weights["dense.w"] = std::move(dense_values);
      out.norms = r.norms;
      out.applied = r.applied;
    }
    if (edata.rank() == 0) {
      for (int j = 0; j < per_rank; ++j) {
        out.weights[expert_name(x * per_rank + j)] = std::move(expert_values[static_cast<std::size_t>(j)]);
      }
    }
  });
  return out;
}

/// One step of a 16-element expert weight over the expert-data group of 4 ranks as (expert-data 2, expert 2), its
/// gradient 1 on every rank, averaged over the 4 data ranks when `average` (`set_gradient_average(4)`), else over
/// the 2 expert-data ranks. \returns world rank 0's gradient norm.
template <class Rig> double moe_average_norm(const Rig& rig, bool average) {
  const zero::topology topo({{"edata", 2}, {"expert", 2}});
  double norm = 0;
  rig.run_group(4, [&](auto& world) {
    auto edata = topo.split(world, {"edata"});
    auto backend = rig.make_backend(world);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(world)>> eng(moe_config(2, 2), edata, backend);
    if (average) {
      eng.set_gradient_average(4);
    }
    const int m = eng.add_module("e");
    auto w = eng.add_param(m, "w", {16});
    eng.finalize();
    {
      auto on = eng.gather(m);
      rig.io.write(eng, eng.grad(w), std::vector<float>(16, 1.0F)); // the tokens of this expert rank's 2 data ranks
      eng.grad_ready(w);
    }
    const auto r = eng.step();
    if (world.rank() == 0) {
      norm = r.grad_norm;
    }
  });
  return norm;
}

} // namespace zero_test
