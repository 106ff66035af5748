// The one-step delayed update (`offload_optimizer.delayed_update`): exact through its warm-up; after it
// each step publishes the update the step before began and begins its own on the host, so every update
// uses the gradients of parameters one step old, as the ZeRO-Offload paper's DPU. Held against the
// single-process AdamW of the harness run the same way (`run_spec::delayed_warmup`), and refused by name
// where the engine cannot delay.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "wide_step.hpp"

#include <doctest/doctest.h>
#include <string>

using zero::dtype;
using zero::testing::check_same_run;
using zero::testing::max_rel_diff;
using zero::testing::run_spec;
using zero::testing::train_reference;
using zero::testing::train_with_engine;

namespace {

std::string delayed_keys(std::int64_t warmup, bool forward_overlap = false) {
  return R"("offload_optimizer": {"device": "cpu", "forward_overlap": )" +
         std::string(forward_overlap ? "true" : "false") + R"(, "delayed_update": {"warmup_steps": )" +
         std::to_string(warmup) + "}}";
}

/// Trains `s` and returns the run and rank 0's count of delayed updates (read after the parameters: a reader
/// publishes the update still pending, which at stages 2-3 all-gathers on every rank).
struct delayed_run {
  zero::testing::run_result run;
  std::size_t delayed = 0;
};
delayed_run train_delayed(const run_spec& s) {
  delayed_run out;
  out.run = zero::testing::train_then_read(s, [&](const auto& host) { out.delayed = host.delayed_steps(); });
  return out;
}

} // namespace

TEST_CASE("the delayed update gives the exact engine's bits while the run is within its warm-up") {
  for (int stage : {2, 3}) {
    for (int world : {1, 3}) {
      for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
        for (bool forward : {false, true}) {
          CAPTURE(stage);
          CAPTURE(world);
          CAPTURE(zero::name_of(type));
          CAPTURE(forward);
          run_spec s{.stage = stage, .world = world, .type = type, .clip = 1.0};
          s.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
          const auto want = train_with_engine(s);
          s.zero_extra = delayed_keys(s.steps, forward);
          const auto got = train_delayed(s);
          check_same_run(got.run, want);
          CHECK(got.delayed == 0);
        }
      }
    }
  }
}

TEST_CASE("after its warm-up each update uses the gradients of the parameters one step old, as the reference's "
          "delayed AdamW") {
  // fp32 within 1e-6 of the single-process AdamW run the same way, and 20 times that from the exact one: the
  // delay changes the run (a parameter's weight in its own gradient, param_coupling, of 0.25 makes it show). The
  // warm-up's steps are exact: warm-up 2 of 6 steps delays 4 updates.
  for (int stage : {2, 3}) {
    for (int world : {1, 2, 3}) {
      for (std::int64_t warmup : {0, 2}) {
        for (double clip : {0.0, 1.0}) {
          CAPTURE(stage);
          CAPTURE(world);
          CAPTURE(warmup);
          CAPTURE(clip);
          run_spec s{.stage = stage, .world = world, .clip = clip, .steps = 6, .param_coupling = 0.25f};
          s.zero_extra = delayed_keys(warmup);
          const auto got = train_delayed(s);
          const auto exact = train_reference(s);
          s.delayed_warmup = warmup;
          const auto want = train_reference(s);
          CHECK(max_rel_diff(got.run.params, want.params) <= 1e-6);
          CHECK(max_rel_diff(exact.params, want.params) > 2e-5); // 20 times the bound above
          REQUIRE(got.run.norms.size() == want.norms.size());
          for (std::size_t t = 0; t < want.norms.size(); ++t) {
            CHECK(got.run.norms[t] == doctest::Approx(want.norms[t]).epsilon(1e-6));
          }
          CHECK(got.delayed == static_cast<std::size_t>(s.steps - warmup));
        }
      }
    }
  }
}

TEST_CASE("an fp16 overflow after the warm-up skips the step and leaves the update before it to the next step") {
  // The skipped step publishes nothing and begins nothing: the next applied step publishes the update
  // still pending, as the reference does.
  for (int stage : {2, 3}) {
    for (int world : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(world);
      run_spec s{.stage = stage, .world = world, .type = dtype::f16, .steps = 6, .overflow_step = 3};
      s.zero_extra = delayed_keys(1);
      const auto got = train_delayed(s);
      s.delayed_warmup = 1;
      const auto want = train_reference(s);
      CHECK(got.run.applied == want.applied);
      CHECK_FALSE(got.run.applied[3]);
      CHECK(max_rel_diff(got.run.params, want.params) <= 1.0 / 2048 + 0.1 * 5 * s.lr);
      CHECK(got.delayed == 4); // steps 1, 2, 4, 5
    }
  }
}

TEST_CASE("a reader publishes the delayed update: parameters read after a step are the state's") {
  // gather_all between backward and the step publishes the update still pending; the step that follows has
  // none to publish. Either way the next forward computes with the parameters the last step published, so
  // the run is the same.
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    run_spec s{.stage = stage, .world = 2, .steps = 5, .param_coupling = 0.25f};
    s.zero_extra = delayed_keys(1);
    const auto plain = train_delayed(s);
    s.read_before_step = 3;
    const auto read = train_delayed(s);
    check_same_run(read.run, plain.run);
    s.delayed_warmup = 1;
    CHECK(max_rel_diff(read.run.params, train_reference(s).params) <= 1e-6);
  }
}

TEST_CASE("the delayed update is refused by name where the engine cannot delay the host's update") {
  struct bad {
    int stage;
    std::string keys;
    int accumulation;
    const char* names;
  };
  const std::string block = R"("delayed_update": {"warmup_steps": 2})";
  for (const bad& b : {
           bad{2, R"("offload_optimizer": {"device": "none", )" + block + "}", 1, "with device \"none\""},
           bad{2, R"("offload_optimizer": {"device": "cpu", "ratio": 0.5, )" + block + "}", 1, "with ratio 0.5"},
           bad{1, R"("offload_optimizer": {"device": "cpu", )" + block + "}", 1, "at stage 1"},
           bad{2, R"("offload_optimizer": {"device": "cpu", )" + block + "}", 2, "gradient_accumulation_steps 2"},
           bad{3, R"("offload_optimizer": {"device": "cpu", )" + block + R"(}, "offload_param": {"device": "cpu"})", 1,
               "with offload_param \"cpu\""},
           bad{2, R"("offload_optimizer": {"device": "cpu", "backward_overlap": 0.5, )" + block + "}", 1,
               "with backward_overlap"},
       }) {
    CAPTURE(b.keys);
    run_spec s{.stage = b.stage, .world = 1, .accumulation = b.accumulation};
    s.zero_extra = b.keys;
    try {
      (void)train_with_engine(s);
      FAIL("the config was accepted");
    } catch (const zero::config_error& e) {
      const std::string what = e.what();
      CHECK(what.find("zero_optimization.offload_optimizer.delayed_update") != std::string::npos);
      CHECK(what.find(b.names) != std::string::npos);
    }
  }
}

TEST_CASE("the delayed update's host memory: the gradient shard twice, counted by the report's formula") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    const auto run = zero::testing::step_a_wide_model(
        R"("stage": )" + std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0, )" + delayed_keys(0));
    for (const auto& r : run.reports) {
      // Host: fp32 master, m, v (12 B), the bf16 parameter shard (2 B) and the bf16 gradient shard twice (4 B).
      const std::size_t shard = (r.parameters + r.padding) / 2;
      CHECK(r.host_optimizer == 12 * shard);
      CHECK(r.host_grads == 2 * 2 * shard);
      CHECK(r.host_formula == doctest::Approx(18.0 * static_cast<double>(r.parameters) / 2));
      CHECK(static_cast<double>(r.host_peak) == doctest::Approx(r.host_formula).epsilon(0.02));
    }
  }
}
