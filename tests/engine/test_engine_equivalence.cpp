#include "engine_harness.hpp"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <string>
#include <utility>

using zero::dtype;
using zero::testing::run_spec;
using zero::testing::train_reference;
using zero::testing::train_with_engine;

using zero::testing::max_rel_diff;

TEST_CASE("stages 0, 1, 2, 3 give the parameters of a plain single-process AdamW") {
  // fp32: within 1e-6 relative. bf16/fp16: parameters are rounded to 8 (bf16) or 11 (fp16) bits and
  // each rank's gradient is rounded before it is averaged, so the tolerance is one rounding of the
  // parameter (2^-8 relative for bf16, 2^-11 for fp16) plus 10% of the total update (5 steps * lr).
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 3, 4, 8}) {
      for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
        for (int accumulation : {1, 4}) {
          for (double clip : {0.0, 1.0}) {
            run_spec s{.stage = stage, .world = world, .type = type, .accumulation = accumulation, .clip = clip};
            CAPTURE(stage);
            CAPTURE(world);
            CAPTURE(zero::name_of(type));
            CAPTURE(accumulation);
            CAPTURE(clip);
            const auto got = train_with_engine(s);
            const auto want = train_reference(s);
            const double tol =
                type == dtype::f32 ? 1e-6 : (type == dtype::bf16 ? 1.0 / 256 : 1.0 / 2048) + 0.1 * 5 * s.lr;
            CHECK(max_rel_diff(got.params, want.params) <= tol);
            REQUIRE(got.norms.size() == want.norms.size());
            for (std::size_t t = 0; t < want.norms.size(); ++t) {
              CHECK(got.applied[t]);
              CHECK(got.norms[t] == doctest::Approx(want.norms[t]).epsilon(type == dtype::f32 ? 1e-6 : 1e-2));
            }
          }
        }
      }
    }
  }
}

TEST_CASE("OneCycle's lr and betas and LRRangeTest's lr reach every step, at every stage, offloaded too") {
  // OneCycle with momentum: beta1 moves every step and beta2 is 0.99, so an engine that kept the optimizer's
  // betas (0.9, 0.999) or the first step's would leave the reference by far more than 1e-6.
  const std::string one_cycle = R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.002,
      "cycle_max_lr": 0.02, "cycle_first_step_size": 2, "cycle_second_step_size": 1, "decay_step_size": 1,
      "decay_lr_rate": 0.5, "decay_mom_rate": 0.01}})";
  const std::string range_test = R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_min_lr": 0.002,
      "lr_range_test_step_size": 2, "lr_range_test_step_rate": 3}})";
  // No structured bindings here: Clang 14 refuses them inside CAPTURE's lambda.
  for (const auto& schedule : {std::pair{"OneCycle", one_cycle}, {"LRRangeTest", range_test}}) {
    const std::string name = schedule.first;
    const std::string& block = schedule.second;
    for (int stage : {0, 1, 2, 3}) {
      for (const char* offload : {"", R"("offload_optimizer": {"device": "cpu"})"}) {
        if (stage == 0 && *offload != '\0') {
          continue;
        }
        run_spec s{.stage = stage, .world = 2, .steps = 6, .zero_extra = offload, .top_extra = block};
        const std::string where = *offload == '\0' ? "in memory" : "offloaded";
        CAPTURE(name);
        CAPTURE(stage);
        CAPTURE(where);
        const auto cfg = zero::config::from_string(zero::testing::config_json(s));
        auto sched = zero::scheduler_from_config(cfg);
        const auto want = train_reference(s, &sched);
        CHECK(max_rel_diff(train_with_engine(s).params, want.params) <= 1e-6);
        CHECK(max_rel_diff(train_reference(s).params, want.params) > 1e-3); // the schedule matters here
      }
    }
  }
}

TEST_CASE("fp32 results are bit-identical across world sizes 1, 2, 4, 8 with exactly reducible gradients") {
  // Batch 64 splits into power-of-two micro-batches, so every mean and average is exact; without
  // clipping nothing depends on the order of a sum.
  for (int stage : {0, 1, 2, 3}) {
    for (int accumulation : {1, 4}) {
      run_spec base{.stage = stage, .world = 1, .accumulation = accumulation, .batch = 64, .param_coupling = 0};
      const auto one = train_with_engine(base);
      for (int world : {2, 4, 8}) {
        run_spec s = base;
        s.world = world;
        CAPTURE(stage);
        CAPTURE(world);
        CAPTURE(accumulation);
        CHECK(train_with_engine(s).params == one.params);
      }
    }
  }
}

namespace {

/// Trains `s` (an inf injected on rank 0 at optimizer step 2 of 6) and checks that step 2 was skipped on
/// every rank with an infinite norm, as the reference skipped it, and that the parameters follow the
/// reference within `tol`. Returns the run for the loss-scale checks of the caller.
zero::testing::run_result check_overflow_skipped(const run_spec& s, double tol) {
  const auto got = train_with_engine(s);
  const auto want = train_reference(s);
  REQUIRE(got.applied.size() == 6);
  CHECK(got.applied == want.applied);
  for (const auto& per_rank : got.applied_by_rank) {
    CHECK(per_rank == got.applied); // skipped on every rank, not only where the inf was
  }
  CHECK_FALSE(got.applied[2]);
  CHECK(std::isinf(got.norms[2]));
  CHECK(std::isfinite(got.norms[3]));
  CHECK(max_rel_diff(got.params, want.params) <= tol);
  return got;
}

} // namespace

TEST_CASE("an inf in bf16 or fp32 gradients (nothing to unscale: no flag pass, the norm alone finds it) skips "
          "the step on every rank, the scale stays 1, and training goes on as a reference that skipped it") {
  for (dtype type : {dtype::bf16, dtype::f32}) {
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(stage);
      const std::string type_name(zero::name_of(type));
      CAPTURE(type_name);
      const run_spec s{.stage = stage, .world = 4, .type = type, .steps = 6, .overflow_step = 2};
      const auto got = check_overflow_skipped(s, type == dtype::f32 ? 1e-6 : 1.0 / 256 + 0.1 * 6 * s.lr);
      for (const double scale : got.scales) {
        CHECK(scale == 1.0);
      }
    }
  }
}

TEST_CASE("an fp16 overflow skips the step on every rank, halves the scale, and training goes on as a "
          "reference that skipped the same step") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const run_spec s{.stage = stage, .world = 4, .type = dtype::f16, .steps = 6, .overflow_step = 2};
    const auto got = check_overflow_skipped(s, 1.0 / 2048 + 0.1 * 6 * s.lr);
    CHECK(got.scales[2] == 256.0);
    CHECK(got.scales[3] == 128.0);
  }
}
