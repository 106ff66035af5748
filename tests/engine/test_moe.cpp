// Mixture of experts: the dense parameters' engine over the data group, the experts' engine over the
// expert-data group (`set_gradient_average`, the expert axis as its model group), the two stepped
// as one optimizer (`step_together`). Trained on 4 in-process ranks as (expert-data 2, expert 2),
// each expert rank holding 2 of the 4 experts and receiving its experts' token gradients from the
// other expert rank by all_to_all, the weights and norms equal those of one engine on the 4 data
// ranks holding every expert, bit for bit.

#include "parallel_settings.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

using moe_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;

constexpr int moe_experts = 4;         // experts of the layer
constexpr std::size_t moe_dense = 72;  // elements of the dense weight
constexpr std::size_t moe_expert = 40; // elements of each expert's weight
constexpr int moe_steps = 3;

zero::config moe_config(int ranks, int stage, const std::string& top = "", const std::string& zero_keys = "") {
  return zero_test::parallel_config(ranks, stage, top, zero_keys);
}

/// The gradient data rank `rank`'s tokens give parameter `which` (-1: the dense weight, else the
/// expert) at step `step`: dyadic, so every sum, average and square is exact.
float moe_grad(int step, int rank, int which, std::size_t i) {
  const auto k = static_cast<int>((i * 5 + static_cast<std::size_t>(step) * 3 +
                                   static_cast<std::size_t>(which + 1) * 7 + static_cast<std::size_t>(rank) * 2) %
                                  19) -
                 9;
  return static_cast<float>(k) / 32.0F;
}

void moe_init(moe_engine& eng) {
  eng.init_params([](const zero::param_info& p, std::size_t first, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>((first + i + p.name.size() * 3) % 13) / 16.0F - 0.375F;
    }
  });
}

std::string expert_name(int j) { return "expert" + std::to_string(j) + ".w"; }

struct moe_result {
  std::map<std::string, std::vector<float>> weights; // data rank 0's (expert-data rank 0's for experts)
  std::vector<double> norms;
  std::vector<bool> applied;
};

/// The reference: one engine on 4 data ranks holding the dense weight and every expert; data rank
/// r's gradient of expert j is the sum its tokens give.
moe_result moe_reference(int stage, int micro, const std::string& top, const std::string& zero_keys) {
  moe_result out;
  zero::run_ranks(4, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    moe_engine eng(moe_config(4, stage, top, zero_keys), comm, backend);
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
          float* g = eng.grad(experts[static_cast<std::size_t>(j)]).as<float>();
          for (std::size_t i = 0; i < moe_expert; ++i) {
            g[i] += moe_grad(step, comm.rank(), j, i);
          }
          eng.grad_ready(experts[static_cast<std::size_t>(j)]);
        }
        float* g = eng.grad(dense).as<float>();
        for (std::size_t i = 0; i < moe_dense; ++i) {
          g[i] += moe_grad(step, comm.rank(), -1, i);
        }
        eng.grad_ready(dense);
      }
      const auto s = eng.step();
      if (s.boundary) {
        r.norms.push_back(s.grad_norm);
        r.applied.push_back(s.applied);
      }
    }
    auto all = eng.gather_all();
    const float* d = eng.param(dense).as<float>();
    r.weights["dense.w"].assign(d, d + moe_dense);
    for (int j = 0; j < moe_experts; ++j) {
      const float* e = eng.param(experts[static_cast<std::size_t>(j)]).as<float>();
      r.weights[expert_name(j)].assign(e, e + moe_expert);
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
moe_result moe_parallel(int stage, int micro, const std::string& top, const std::string& zero_keys, bool together,
                        bool infinity = false) {
  const zero::topology topo({{"edata", 2}, {"expert", 2}});
  constexpr int per_rank = moe_experts / 2;
  constexpr std::size_t block = per_rank * moe_expert; // elements sent to each expert rank
  moe_result out;
  std::mutex mu;
  zero::run_ranks(4, [&](zero::thread_communicator& world) {
    auto data = topo.split(world, {"edata", "expert"});
    auto edata = topo.split(world, {"edata"});
    auto expert_axis = topo.split(world, {"expert"});
    const int x = topo.coord(world.rank(), "expert");
    zero::cpu_backend backend({.threads = 1});
    moe_engine dense_eng(moe_config(4, stage, top, zero_keys), data, backend);
    moe_engine expert_eng(moe_config(2, stage, top, zero_keys), edata, backend);
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
    std::vector<float> send(2 * block), recv(2 * block);
    for (int step = 0; step < moe_steps * micro; ++step) {
      {
        auto on_d = dense_eng.gather(dm);
        auto on_e = expert_eng.gather(em);
        // This rank's tokens' gradients of every expert, sent to the expert rank that holds it.
        for (int j = 0; j < moe_experts; ++j) {
          for (std::size_t i = 0; i < moe_expert; ++i) {
            send[static_cast<std::size_t>(j) * moe_expert + i] = moe_grad(step, world.rank(), j, i);
          }
        }
        if (infinity && step == 1 && world.rank() == 3) {
          send[5] = std::numeric_limits<float>::infinity(); // expert 0, held by expert rank 0
        }
        expert_axis.all_to_all(send.data(), recv.data(), block).wait();
        for (int j = 0; j < per_rank; ++j) {
          float* g = expert_eng.grad(experts[static_cast<std::size_t>(j)]).as<float>();
          for (int from = 0; from < 2; ++from) {
            for (std::size_t i = 0; i < moe_expert; ++i) {
              g[i] += recv[static_cast<std::size_t>(from) * block + static_cast<std::size_t>(j) * moe_expert + i];
            }
          }
          expert_eng.grad_ready(experts[static_cast<std::size_t>(j)]);
        }
        float* g = dense_eng.grad(dense).as<float>();
        for (std::size_t i = 0; i < moe_dense; ++i) {
          g[i] += moe_grad(step, world.rank(), -1, i);
        }
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
    const std::lock_guard lock(mu);
    if (world.rank() == 0) {
      const float* d = dense_eng.param(dense).as<float>();
      out.weights["dense.w"].assign(d, d + moe_dense);
      out.norms = r.norms;
      out.applied = r.applied;
    }
    if (edata.rank() == 0) {
      for (int j = 0; j < per_rank; ++j) {
        const float* e = expert_eng.param(experts[static_cast<std::size_t>(j)]).as<float>();
        out.weights[expert_name(x * per_rank + j)].assign(e, e + moe_expert);
      }
    }
  });
  return out;
}

} // namespace

TEST_CASE("MoE: experts over the expert-data group, stepped together with the dense engine, train as one engine "
          "holding every expert") {
  zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
    const auto want = moe_reference(set.stage, set.micro, set.top, set.zero_keys);
    REQUIRE(want.weights.size() == 1 + moe_experts);
    REQUIRE(want.norms.size() == moe_steps);
    const auto got = moe_parallel(set.stage, set.micro, set.top, set.zero_keys, true);
    CHECK(got.norms == want.norms);
    for (const auto& entry : want.weights) {
      CAPTURE(entry.first);
      CHECK(got.weights.at(entry.first) == entry.second);
    }
    // Each engine alone clips by its own norm: other weights, with a clip every step exceeds.
    const auto alone = moe_parallel(set.stage, set.micro, set.top, set.zero_keys, false);
    CHECK(alone.weights.at("dense.w") != want.weights.at("dense.w"));
    CHECK(alone.weights.at("expert0.w") != want.weights.at("expert0.w"));
  });
}

TEST_CASE("MoE: without set_gradient_average the experts' gradients are averaged over the expert-data group only") {
  const zero::topology topo({{"edata", 2}, {"expert", 2}});
  for (bool average : {true, false}) {
    CAPTURE(average);
    double norm = 0;
    zero::run_ranks(4, [&](zero::thread_communicator& world) {
      auto edata = topo.split(world, {"edata"});
      zero::cpu_backend backend({.threads = 1});
      moe_engine eng(moe_config(2, 2), edata, backend);
      if (average) {
        eng.set_gradient_average(4);
      }
      const int m = eng.add_module("e");
      auto w = eng.add_param(m, "w", {16});
      eng.finalize();
      {
        auto on = eng.gather(m);
        float* g = eng.grad(w).as<float>();
        std::fill(g, g + 16, 1.0F); // the tokens of the 2 data ranks of this expert rank
        eng.grad_ready(w);
      }
      const auto r = eng.step();
      if (world.rank() == 0) {
        norm = r.grad_norm;
      }
    });
    // Averaged over the 4 data ranks every element is 0.5 (norm 2); over the 2 expert-data ranks, 1 (norm 4).
    CHECK(norm == (average ? 2.0 : 4.0));
  }
}

TEST_CASE("MoE: set_gradient_average and step_together refuse what they cannot honour") {
  zero::run_ranks(2, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    moe_engine eng(moe_config(2, 1), comm, backend);
    CHECK_THROWS_WITH_AS(eng.set_gradient_average(3),
                         doctest::Contains("3 ranks; expected a multiple of this engine's 2"), zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.set_gradient_average(1), doctest::Contains("1 ranks; expected a multiple"),
                         zero::usage_error);
    moe_engine other(moe_config(2, 1, R"("gradient_accumulation_steps": 2, )"), comm, backend);
    for (auto* e : {&eng, &other}) {
      const int m = e->add_module("m");
      e->add_param(m, "w", {8});
      e->finalize();
    }
    CHECK_THROWS_WITH_AS(eng.set_gradient_average(4), doctest::Contains("set_gradient_average after finalize()"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(zero::step_together(eng, other),
                         doctest::Contains("engine 1 has gradient_accumulation_steps 2, engine 0 has 1"),
                         zero::usage_error);
    // Nothing was done: each engine still steps alone.
    CHECK(eng.step().applied);
  });
}

TEST_CASE("MoE: an inf in one expert's gradients skips the step of both engines stepped together") {
  const auto got = moe_parallel(2, 1, "", "", true, true);
  CHECK(got.applied == std::vector<bool>{true, false, true});
  // Each engine alone: the dense engine applies step 1.
  const auto alone = moe_parallel(2, 1, "", "", false, true);
  CHECK(alone.applied == std::vector<bool>{true, true, true});
}

TEST_CASE("MoE: each engine's model state is the ZeRO formula over its own group") {
  // bf16, 4 experts of 64k elements over 2 expert-data ranks, a dense 128k weight over 4 data ranks.
  const zero::topology topo({{"edata", 2}, {"expert", 2}});
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    std::mutex mu;
    std::vector<zero::memory_report> dense_reports, expert_reports;
    zero::run_ranks(4, [&](zero::thread_communicator& world) {
      auto data = topo.split(world, {"edata", "expert"});
      auto edata = topo.split(world, {"edata"});
      auto expert_axis = topo.split(world, {"expert"});
      zero::cpu_backend backend({.threads = 1});
      const std::string bf16 = R"("bf16": {"enabled": true}, )";
      moe_engine dense_eng(moe_config(4, stage, bf16), data, backend);
      moe_engine expert_eng(moe_config(2, stage, bf16), edata, backend);
      expert_eng.set_model_group(expert_axis);
      expert_eng.set_gradient_average(4);
      const int dm = dense_eng.add_module("dense");
      auto dense = dense_eng.add_param(dm, "dense.w", {1 << 17});
      const int em = expert_eng.add_module("experts");
      std::vector<zero::param_handle> experts;
      for (int j = 0; j < 2; ++j) {
        experts.push_back(expert_eng.add_param(em, expert_name(j), {1 << 16}));
      }
      dense_eng.finalize();
      expert_eng.finalize();
      {
        auto on_d = dense_eng.gather(dm);
        auto on_e = expert_eng.gather(em);
        for (auto p : experts) {
          expert_eng.grad_ready(p);
        }
        dense_eng.grad_ready(dense);
      }
      const auto both = zero::step_together(dense_eng, expert_eng);
      CHECK(both[0].applied);
      const std::lock_guard lock(mu);
      dense_reports.push_back(dense_eng.memory());
      expert_reports.push_back(expert_eng.memory());
    });
    // bf16 parameters and gradients, fp32 master and moments: 2 + 2 + 12 bytes per parameter, the
    // 12 sharded at stage 1, the gradients too at stage 2, all at stage 3 (which keeps no 16-bit shard).
    const auto formula = [stage](double psi, double n) {
      return stage == 1 ? 4 * psi + 12 * psi / n : stage == 2 ? 2 * psi + 14 * psi / n : 14 * psi / n;
    };
    for (const auto& r : expert_reports) {
      CHECK(r.formula == formula(2.0 * (1 << 16), 2));
      CHECK(r.ratio() >= 1.0);
      CHECK(r.ratio() <= 1.02);
    }
    for (const auto& r : dense_reports) {
      CHECK(r.formula == formula(1 << 17, 4));
      CHECK(r.ratio() >= 1.0);
      CHECK(r.ratio() <= 1.02);
    }
  }
}
