// Mixture of experts: the dense parameters' engine over the data group, the experts' engine over the
// expert-data group (`set_gradient_average`, the expert axis as its model group), the two stepped
// as one optimizer (`step_together`). Trained on 4 in-process ranks as (expert-data 2, expert 2),
// each expert rank holding 2 of the 4 experts and receiving its experts' token gradients from the
// other expert rank by all_to_all, the weights and norms equal those of one engine on the 4 data
// ranks holding every expert, bit for bit. The training is moe_harness.hpp's, over the CPU's rig
// (tests/cuda/test_groups_one_gpu.cpp runs it on ranks sharing one GPU).

#include "moe_harness.hpp"
#include "parallel_settings.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <doctest/doctest.h>
#include <mutex>
#include <string>
#include <vector>

namespace {

using moe_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;
using zero_test::expert_name;
using zero_test::moe_config;

} // namespace

TEST_CASE("MoE: experts over the expert-data group, stepped together with the dense engine, train as one engine "
          "holding every expert") {
  const auto& cpu = zero::testing::cpu_rig;
  zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
    const auto want = zero_test::moe_reference(cpu, set.stage, set.micro, set.top, set.zero_keys);
    REQUIRE(want.weights.size() == 1 + zero_test::moe_experts);
    REQUIRE(want.norms.size() == zero_test::moe_steps);
    const auto got = zero_test::moe_parallel(cpu, set.stage, set.micro, set.top, set.zero_keys, true);
    CHECK(got.norms == want.norms);
    for (const auto& entry : want.weights) {
      CAPTURE(entry.first);
      CHECK(got.weights.at(entry.first) == entry.second);
    }
    // Each engine alone clips by its own norm: other weights, with a clip every step exceeds.
    const auto alone = zero_test::moe_parallel(cpu, set.stage, set.micro, set.top, set.zero_keys, false);
    CHECK(alone.weights.at("dense.w") != want.weights.at("dense.w"));
    CHECK(alone.weights.at("expert0.w") != want.weights.at("expert0.w"));
  });
}

TEST_CASE("MoE: without set_gradient_average the experts' gradients are averaged over the expert-data group only") {
  for (bool average : {true, false}) {
    CAPTURE(average);
    // Averaged over the 4 data ranks every element is 0.5 (norm 2); over the 2 expert-data ranks, 1 (norm 4).
    CHECK(zero_test::moe_average_norm(zero::testing::cpu_rig, average) == (average ? 2.0 : 4.0));
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
  const auto& cpu = zero::testing::cpu_rig;
  const auto got = zero_test::moe_parallel(cpu, 2, 1, "", "", true, true);
  CHECK(got.applied == std::vector<bool>{true, false, true});
  // Each engine alone: the dense engine applies step 1.
  const auto alone = zero_test::moe_parallel(cpu, 2, 1, "", "", false, true);
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
