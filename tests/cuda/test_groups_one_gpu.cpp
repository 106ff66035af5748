/// \file
/// Model-parallel groups and mixture of experts on ranks sharing one GPU (`run_device_group`, `cuda_backend(0)`,
/// `device_io`): the scenarios of tests/engine's test_model_group.cpp, test_moe.cpp and test_pipeline_engine.cpp,
/// trained by the same harnesses (model_group_harness.hpp, moe_harness.hpp, pipeline_harness.hpp) at the same world
/// sizes (4 ranks split into data, pipeline, tensor, expert-data and expert groups), and checked for the same
/// properties against the same references: the single engine's weights and norms, on this GPU and on the CPU, and
/// the skipped steps. Tolerances (`check_same_weights`):
/// - set_model_group (pipeline and tensor parallelism) and MoE: exact. Every gradient is dyadic, so every square,
///   sum and average is exact in any order: the norms, and so the clip coefficients, are the CPU's bits, and the
///   GPU's AdamW rounds every operation as the CPU's (docs/backends.md), so the weights are too.
/// - 1F1B: 1e-6 relative (check_gpu_run's fp32 tolerance). Its gradients are products of trained weights, not
///   dyadic, and the bits of their norm depend on the order of its sums, which the GPU's squared-norm kernel (FMA,
///   a block tree whose order follows a range's length and alignment) and the CPU's differ in.
#include "../engine/model_group_harness.hpp"
#include "../engine/moe_harness.hpp"
#include "../engine/pipeline_harness.hpp"
#include "gpu_engine.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <map>
#include <string>
#include <vector>

namespace {

/// `got` and `want` hold the same tensors, within `tolerance` of each other (`max_rel_diff`; 0: the same bits).
void check_same_weights(const std::map<std::string, std::vector<float>>& got,
                        const std::map<std::string, std::vector<float>>& want, double tolerance) {
  REQUIRE(got.size() == want.size());
  for (const auto& entry : want) {
    const std::string& name = entry.first; // named, not bound: Clang 14 captures no structured binding
    const auto& values = entry.second;
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    if (tolerance == 0) {
      CHECK(got.at(name) == values);
    } else {
      CHECK(zero::testing::max_rel_diff({got.at(name)}, {values}) <= tolerance);
    }
  }
}

} // namespace

TEST_SUITE("groups") {
  TEST_CASE("pipeline stages on 4 ranks sharing one GPU clip by the whole model's norm with set_model_group: the "
            "weights of one engine, the CPU's bits") {
    const auto& gpu = zero::test::one_gpu_rig;
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(stage);
      const auto want = zero_test::mg_whole_model(gpu, stage, 0.05); // a clip the norm exceeds every step
      REQUIRE(want.size() == 2);
      check_same_weights(want, zero_test::mg_whole_model(zero::testing::cpu_rig, stage, 0.05), 0);
      check_same_weights(zero_test::mg_pipelined(gpu, stage, 0.05, true), want, 0);
      // Without the model group each stage clips by its own layers' norm: other weights.
      CHECK(zero_test::mg_pipelined(gpu, stage, 0.05, false) != want);
      // Unclipped, the groups do not matter.
      check_same_weights(zero_test::mg_pipelined(gpu, stage, 0, true), zero_test::mg_whole_model(gpu, stage, 0), 0);
    }
  }

  TEST_CASE("an inf in one pipeline stage's gradients on one GPU skips the step on every stage with "
            "set_model_group") {
    const zero::topology topo({{"pipe", 2}, {"data", 2}});
    for (bool with_model_group : {true, false}) {
      CAPTURE(with_model_group);
      auto applied = zero_test::mg_inf_applied(zero::test::one_gpu_rig, with_model_group);
      for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        const bool stage1 = topo.coord(r, "pipe") == 1;
        // Step 1 is skipped where the inf is, and with the model group on every stage.
        CHECK(applied[r] == std::vector<bool>{true, !(with_model_group || stage1), true});
      }
    }
  }

  TEST_CASE("tensor parallelism on 4 ranks sharing one GPU: a replicated parameter counts once in the clipping "
            "norm; the weights and norms of one engine, the CPU's bits") {
    const auto& gpu = zero::test::one_gpu_rig;
    zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
      const zero_test::tp_result want = zero_test::tp_whole(gpu, set);
      REQUIRE(want.norms.size() == 3);
      const zero_test::tp_result cpu = zero_test::tp_whole(zero::testing::cpu_rig, set);
      CHECK(want.norms == cpu.norms);
      CHECK(want.col == cpu.col);
      CHECK(want.ln == cpu.ln);
      zero_test::check_tp_sliced(gpu, set, want);
    });
  }

  TEST_CASE("MoE on 4 ranks sharing one GPU: experts over the expert-data group, exchanged by all_to_all in device "
            "memory and stepped together with the dense engine, train as one engine holding every expert, the "
            "CPU's bits") {
    const auto& gpu = zero::test::one_gpu_rig;
    zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
      const auto want = zero_test::moe_reference(gpu, set.stage, set.micro, set.top, set.zero_keys);
      REQUIRE(want.weights.size() == 1 + zero_test::moe_experts);
      REQUIRE(want.norms.size() == zero_test::moe_steps);
      const auto cpu = zero_test::moe_reference(zero::testing::cpu_rig, set.stage, set.micro, set.top, set.zero_keys);
      CHECK(want.norms == cpu.norms);
      check_same_weights(want.weights, cpu.weights, 0);
      const auto got = zero_test::moe_parallel(gpu, set.stage, set.micro, set.top, set.zero_keys, true);
      CHECK(got.norms == want.norms);
      check_same_weights(got.weights, want.weights, 0);
      // Each engine alone clips by its own norm: other weights, with a clip every step exceeds.
      const auto alone = zero_test::moe_parallel(gpu, set.stage, set.micro, set.top, set.zero_keys, false);
      CHECK(alone.weights.at("dense.w") != want.weights.at("dense.w"));
      CHECK(alone.weights.at("expert0.w") != want.weights.at("expert0.w"));
    });
  }

  TEST_CASE("MoE on one GPU: without set_gradient_average the experts' gradients are averaged over the expert-data "
            "group only") {
    for (bool average : {true, false}) {
      CAPTURE(average);
      // Averaged over the 4 data ranks every element is 0.5 (norm 2); over the 2 expert-data ranks, 1 (norm 4).
      CHECK(zero_test::moe_average_norm(zero::test::one_gpu_rig, average) == (average ? 2.0 : 4.0));
    }
  }

  TEST_CASE("MoE on one GPU: an inf in one expert's gradients skips the step of both engines stepped together") {
    const auto& gpu = zero::test::one_gpu_rig;
    const auto got = zero_test::moe_parallel(gpu, 2, 1, "", "", true, true);
    CHECK(got.applied == std::vector<bool>{true, false, true});
    // Each engine alone: the dense engine applies step 1.
    const auto alone = zero_test::moe_parallel(gpu, 2, 1, "", "", false, true);
    CHECK(alone.applied == std::vector<bool>{true, true, true});
  }

  TEST_CASE("1F1B through the engine on 4 ranks sharing one GPU, activations and their gradients sent in device "
            "memory: the weights of one engine running the micro-batches in turn, within 1e-6") {
    const auto& gpu = zero::test::one_gpu_rig;
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(stage);
      const auto want = zero_test::pp_reference(gpu, stage);
      REQUIRE(want.size() == 2);
      check_same_weights(zero_test::pp_pipelined(gpu, stage), want, 1e-6);
      check_same_weights(want, zero_test::pp_reference(zero::testing::cpu_rig, stage), 1e-6);
    }
  }
} // TEST_SUITE("groups")
