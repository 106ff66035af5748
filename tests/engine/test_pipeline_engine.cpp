// Pipeline parallelism through the engine: 2 stages x 2 data ranks run the 1F1B schedule
// (`one_f_one_b`), sending activations and their gradients between stages with send/recv, and
// accumulate the micro-batches' gradients in each stage's engine (gradient_accumulation_steps =
// micro-batches, one step() per micro-batch's backward). The weights equal, bit for bit, those of
// one engine per data rank holding both stages and running the micro-batches one after another.
// The training is pipeline_harness.hpp's, over the CPU's rig (tests/cuda/test_groups_one_gpu.cpp runs it
// on ranks sharing one GPU).

#include "pipeline_harness.hpp"

#include <doctest/doctest.h>

TEST_CASE("1F1B through the engine: micro-batches accumulated in each stage's engine give the weights of one engine "
          "running them in turn") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto want = zero_test::pp_reference(zero::testing::cpu_rig, stage);
    REQUIRE(want.size() == 2);
    CHECK(zero_test::pp_pipelined(zero::testing::cpu_rig, stage) == want);
  }
}
