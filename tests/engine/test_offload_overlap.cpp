// Updates during backward (`offload_optimizer.backward_overlap`): the host updates each range of its
// second home as soon as its gradients landed, out of place, and the step keeps those updates or
// drops them. The step beside the next forward (`forward_overlap`): the host runs the step on a
// thread of its own and each range's upload waits for that range's word. Either way the run has the
// bits of the in-memory optimizer.

#include "engine_harness.hpp"
#include "same_run.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <string>
#include <utility>

using zero::dtype;
using zero::testing::check_same_run;
using zero::testing::run_spec;
using zero::testing::train_with_engine;

namespace {

std::string overlap_keys(double share, bool params_on_host = false) {
  return R"("offload_optimizer": {"device": "cpu", "backward_overlap": )" + std::to_string(share) + "}" +
         (params_on_host ? R"(, "offload_param": {"device": "cpu"})" : "");
}

/// Trains `s` and returns, besides the run, rank 0's count of updates made during backward that the
/// steps kept and dropped.
struct counted_run {
  zero::testing::run_result run;
  std::size_t kept = 0;
  std::size_t dropped = 0;
  std::size_t cancelled = 0;   // updates during backward the step beside the forward took over
  std::size_t async_steps = 0; // steps the host ran beside the next forward
};
counted_run train_counting(const run_spec& s) {
  counted_run out;
  out.run = zero::testing::train_then_read(s, [&](const auto& host) {
    out.kept = host.early_updates().kept;
    out.dropped = host.early_updates().dropped;
    out.cancelled = host.early_updates().cancelled;
    out.async_steps = host.async_steps();
  });
  return out;
}

} // namespace

TEST_CASE("updates during backward give the bits of the in-memory optimizer at stages 2-3, and are kept when the "
          "step applies unclipped") {
  for (int stage : {2, 3}) {
    for (int world : {1, 3}) {
      for (dtype type : {dtype::bf16, dtype::f16}) {
        for (bool on_host : {false, true}) {
          if (on_host && stage != 3) {
            continue;
          }
          CAPTURE(stage);
          CAPTURE(world);
          CAPTURE(zero::name_of(type));
          CAPTURE(on_host);
          // A clip the norms never reach: every update made during backward is kept.
          run_spec s{.stage = stage, .world = world, .type = type, .clip = 1e6};
          const auto want = train_with_engine(s);
          for (double share : {0.5, 1.0}) {
            CAPTURE(share);
            s.zero_extra = overlap_keys(share, on_host);
            const auto got = train_counting(s);
            check_same_run(got.run, want);
            CHECK(got.kept > 0);
            CHECK(got.dropped == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("a clip that acts, or an fp16 overflow, drops the updates made during backward: the step runs from the "
          "previous state") {
  SUBCASE("clipping") {
    for (int stage : {2, 3}) {
      CAPTURE(stage);
      run_spec s{.stage = stage, .world = 2, .type = dtype::bf16, .clip = 1e-3};
      const auto want = train_with_engine(s);
      s.zero_extra = overlap_keys(1.0, stage == 3);
      const auto got = train_counting(s);
      check_same_run(got.run, want);
      CHECK(got.kept == 0);
      CHECK(got.dropped > 0);
    }
  }
  SUBCASE("overflow") {
    for (const auto& c : {std::pair{2, false}, std::pair{3, false}, std::pair{3, true}}) {
      const int stage = c.first;
      const bool on_host = c.second; // the skipped step puts back the parameters its updates wrote into the host shard
      CAPTURE(stage);
      CAPTURE(on_host);
      run_spec s{.stage = stage, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
      const auto want = train_with_engine(s);
      s.zero_extra = overlap_keys(1.0, on_host);
      const auto got = train_counting(s);
      check_same_run(got.run, want);
      CHECK_FALSE(got.run.applied[2]);
      CHECK(got.kept > 0);    // the other steps keep theirs
      CHECK(got.dropped > 0); // the overflowing step drops its own
    }
  }
}

TEST_CASE("what reads the parameters between backward and the step sees the previous step's, with the updates "
          "during backward writing stage 3's host shard in place") {
  // gather_all (and evaluation, stores, optimizer, init_params) ends the updates during backward
  // first: dropped, the shard put back, and the step runs as without them.
  for (bool forward : {false, true}) {
    CAPTURE(forward);
    run_spec s{.stage = 3, .world = 2, .type = dtype::bf16, .steps = 4, .read_before_step = 2};
    const auto want = train_with_engine(s);
    REQUIRE(!want.params_before_step.empty());
    s.zero_extra = R"("offload_optimizer": {"device": "cpu", "backward_overlap": 1)" +
                   std::string(forward ? R"(, "forward_overlap": true)" : "") +
                   R"(}, "offload_param": {"device": "cpu"})";
    const auto got = train_counting(s);
    CHECK(got.run.params_before_step == want.params_before_step);
    check_same_run(got.run, want);
    if (!forward) {
      CHECK(got.kept > 0);    // the other steps keep theirs
      CHECK(got.dropped > 0); // the read drops step 2's
    } else {
      // The read ends step 2's updates: those started are dropped, those not yet started are
      // cancelled, and the other steps keep theirs or leave them to the step beside the forward.
      // How many of each depends on the threads' timing (a loaded host may start none of them
      // before backward ends), so only their sum is certain.
      CHECK(got.dropped + got.cancelled > 0);
      CHECK(got.kept + got.cancelled > 0);
    }
  }
}

TEST_CASE("backward_overlap has no updates to make with accumulation, fp32 parameters or at stage 1, and trains the "
          "same") {
  struct shape {
    int stage;
    int accumulation;
    dtype type;
  };
  for (shape sh : {shape{1, 1, dtype::bf16}, shape{2, 2, dtype::bf16}, shape{3, 1, dtype::f32}}) {
    CAPTURE(sh.stage);
    CAPTURE(sh.accumulation);
    CAPTURE(zero::name_of(sh.type));
    run_spec s{.stage = sh.stage, .world = 2, .type = sh.type, .accumulation = sh.accumulation};
    const auto want = train_with_engine(s);
    s.zero_extra = overlap_keys(1.0);
    const auto got = train_counting(s);
    check_same_run(got.run, want);
    CHECK(got.kept + got.dropped == 0);
  }
}

TEST_CASE("the second home is host buffers of 12 bytes per element of its share, with the parameters on the host "
          "too (updated in place); the optimizer state stays at the formula") {
  for (bool on_host : {false, true}) {
    CAPTURE(on_host);
    zero::run_ranks(1, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      const auto cfg = zero::config::from_string(
          R"({"train_batch_size": 1, "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {}},
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, )" +
          overlap_keys(0.5, on_host) + "}}");
      zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
      for (int k = 0; k < 4; ++k) {
        eng.add_param(eng.add_module("m" + std::to_string(k)), "w" + std::to_string(k), {1000});
      }
      eng.finalize();
      const auto* host = eng.optimizer().host();
      REQUIRE(host != nullptr);
      // The last two of four equal modules (each padded alike): half of the state.
      const auto r = eng.memory();
      const std::size_t state = r.parameters + r.padding;
      CHECK(host->overlap_elements() == state / 2);
      CHECK(r.host_optimizer == 12 * state);
      CHECK(r.host_buffers == 12 * state / 2);
    });
  }
}

TEST_CASE("forward_overlap: the host steps on a thread of its own beside the next forward, with the whole state or "
          "its share of a split one (ratio below 1), with the bits of the in-memory optimizer at stages 2-3") {
  struct shape {
    int stage;
    int world;
    dtype type;
    bool on_host;
    int accumulation;
    double backward;
    double ratio = 1.0;
  };
  for (shape sh : {shape{2, 1, dtype::bf16, false, 1, 0.0}, shape{2, 3, dtype::f16, false, 1, 0.0},
                   shape{2, 2, dtype::bf16, false, 2, 0.0}, shape{2, 3, dtype::bf16, false, 1, 0.5},
                   shape{3, 1, dtype::bf16, true, 1, 1.0}, shape{3, 3, dtype::f16, false, 1, 1.0},
                   shape{3, 2, dtype::bf16, true, 2, 0.0}, shape{3, 2, dtype::f32, false, 1, 0.0},
                   // The state split: the host's share streams its gradients and steps beside the forward.
                   shape{2, 1, dtype::bf16, false, 1, 0.0, 0.5}, shape{2, 3, dtype::f16, false, 1, 1.0, 0.3},
                   shape{2, 2, dtype::bf16, false, 1, 0.5, 0.8}, shape{3, 2, dtype::bf16, true, 1, 1.0, 0.6},
                   shape{3, 3, dtype::bf16, false, 1, 0.0, 0.5}, shape{3, 1, dtype::f32, false, 1, 1.0, 0.4}}) {
    CAPTURE(sh.stage);
    CAPTURE(sh.world);
    CAPTURE(zero::name_of(sh.type));
    CAPTURE(sh.on_host);
    CAPTURE(sh.accumulation);
    CAPTURE(sh.backward);
    CAPTURE(sh.ratio);
    run_spec s{.stage = sh.stage, .world = sh.world, .type = sh.type, .accumulation = sh.accumulation, .clip = 1e6};
    const auto want = train_with_engine(s);
    s.zero_extra = R"("offload_optimizer": {"device": "cpu", "forward_overlap": true, "backward_overlap": )" +
                   std::to_string(sh.backward) + (sh.ratio < 1 ? R"(, "ratio": )" + std::to_string(sh.ratio) : "") +
                   "}" + (sh.on_host ? R"(, "offload_param": {"device": "cpu"})" : "");
    const auto got = train_counting(s);
    check_same_run(got.run, want);
    const auto applied = static_cast<std::size_t>(std::count(want.applied.begin(), want.applied.end(), true));
    CHECK(applied > 0);
    CHECK(got.async_steps == applied); // every applied step ran on the host's thread
    if (sh.backward > 0 && sh.accumulation == 1 && sh.type != dtype::f32) {
      // Both overlaps at once: every update made during backward is kept, and those not yet started
      // when backward ended are the step's (how many of each depends on the threads' timing).
      CHECK(got.kept + got.cancelled > 0);
      CHECK(got.dropped == 0);
    } else {
      CHECK(got.kept + got.dropped + got.cancelled == 0);
    }
  }
}

TEST_CASE("forward_overlap with a clip that acts, or an fp16 overflow, gives the bits of the in-memory optimizer") {
  for (int stage : {2, 3}) {
    CAPTURE(stage);
    run_spec clipped{.stage = stage, .world = 2, .type = dtype::bf16, .clip = 1e-3};
    run_spec overflow{.stage = stage, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
    for (run_spec* s : {&clipped, &overflow}) {
      const auto want = train_with_engine(*s);
      for (const char* ratio : {"", R"(, "ratio": 0.5)"}) {
        CAPTURE(ratio);
        s->zero_extra = R"("offload_optimizer": {"device": "cpu", "forward_overlap": true, "backward_overlap": 1)" +
                        std::string(ratio) + "}";
        const auto got = train_counting(*s);
        check_same_run(got.run, want);
        CHECK(got.async_steps == static_cast<std::size_t>(std::count(want.applied.begin(), want.applied.end(), true)));
      }
    }
  }
}

TEST_CASE("forward_overlap without the state on the cpu, or split with accumulation, is refused naming the key") {
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    const std::pair<const char*, const char*> refused[] = {
        {R"({"device": "cpu", "ratio": 0.5, "forward_overlap": true}}, "gradient_accumulation_steps": 2)",
         "and gradient_accumulation_steps 2: the host steps beside the forward on a share"},
        {R"({"device": "cpu", "ratio": "auto", "forward_overlap": true}}, "gradient_accumulation_steps": 3)",
         "with ratio \"auto\" and gradient_accumulation_steps 3"},
        {R"({"device": "nvme", "nvme_path": "/tmp", "forward_overlap": true}})", "with device \"nvme\""},
        {R"({"device": "none", "forward_overlap": true}})", "with device \"none\""}};
    for (const auto& r : refused) {
      const char* offload = r.first;
      CAPTURE(offload);
      const auto cfg = zero::config::from_string(
          R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {}},
              "zero_optimization": {"stage": 2, "offload_optimizer": )" +
          std::string(offload) + "}");
      CHECK_THROWS_WITH_AS(eng_t(cfg, comm, backend),
                           doctest::Contains("zero_optimization.offload_optimizer.forward_overlap true"),
                           zero::config_error);
      CHECK_THROWS_WITH_AS(eng_t(cfg, comm, backend), doctest::Contains(r.second), zero::config_error);
    }
  });
}

TEST_CASE("backward_overlap outside [0, 1], or without the whole state on the cpu, is refused naming the key") {
  const auto cfg_with = [](const std::string& offload) {
    return R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
               "zero_optimization": {"stage": 2, "offload_optimizer": )" +
           offload + "}}";
  };
  CHECK_THROWS_WITH_AS((void)zero::config::from_string(cfg_with(R"({"device": "cpu", "backward_overlap": 1.5})")),
                       doctest::Contains("backward_overlap"), zero::config_error);
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    // Each refusal names the key and the setting that is in the way.
    const std::pair<const char*, const char*> refused[] = {
        {R"({"device": "cpu", "ratio": 0.5, "backward_overlap": 0.5})", "with ratio 0.5"},
        {R"({"device": "cpu", "ratio": "auto", "backward_overlap": 0.5})", "with ratio \"auto\""},
        {R"({"device": "nvme", "nvme_path": "/tmp", "backward_overlap": 0.5})", "with device \"nvme\""}};
    for (const auto& r : refused) {
      const char* offload = r.first;
      const char* why = r.second;
      CAPTURE(offload);
      CHECK_THROWS_WITH_AS(eng_t(zero::config::from_string(cfg_with(offload)), comm, backend),
                           doctest::Contains("zero_optimization.offload_optimizer.backward_overlap"),
                           zero::config_error);
      CHECK_THROWS_WITH_AS(eng_t(zero::config::from_string(cfg_with(offload)), comm, backend), doctest::Contains(why),
                           zero::config_error);
    }
  });
}
