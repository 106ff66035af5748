#pragma once
// What the offload and update-rule suites share: `check_same_run`, two runs of the engine harness end with the
// same bits — parameters, gradient norms, applied steps and loss scales (doctest checks); the engine against a
// reference's bits at every stage and world (`check_reference_bits_at_every_stage`); and
// `for_each_training_shape`, the runs they sweep.

#include "engine_harness.hpp"

#include <doctest/doctest.h>
#include <initializer_list>
#include <vector>

namespace zero::testing {

inline void check_same_run(const run_result& got, const run_result& want) {
  CHECK(got.params == want.params);
  CHECK(got.norms == want.norms);
  CHECK(got.applied == want.applied);
  CHECK(got.scales == want.scales);
}

/// `base` on CPU engines at stages 0-3 on 1, 2 and 4 ranks against `want`, a reference's parameters, bit for bit,
/// every step applied (`base` with gradients that reduce exactly at every world: a batch of 64, no coupling).
inline void check_reference_bits_at_every_stage(const run_spec& base, const run_result& want) {
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 4}) {
      run_spec s = base;
      s.stage = stage;
      s.world = world;
      CAPTURE(stage);
      CAPTURE(world);
      const auto got = train_with_engine(s);
      CHECK(got.params == want.params);
      CHECK(got.applied == std::vector<bool>(static_cast<std::size_t>(base.steps), true));
    }
  }
}

/// `base`'s rule (its optimizer block and weight decay) against `reference(spec)`, a reference written out in the
/// test: with two micro-steps a step (the same global-batch mean: within 1e-6); in fp16 with an inf at step 2,
/// skipped on every rank with the step count kept (the same applied steps, within fp16's rounding and
/// `fp16_slack`); at stage 3 with the parameter shard in host memory (offload_param cpu; within 1e-6).
template <class Reference>
void check_accumulation_overflow_host_params(const run_spec& base, double fp16_slack, Reference&& reference) {
  const auto with = [&](run_spec s) {
    s.optimizer = base.optimizer;
    s.weight_decay = base.weight_decay;
    return s;
  };
  const run_spec a = with({.stage = 2, .world = 2, .accumulation = 2, .steps = 5});
  CHECK(max_rel_diff(train_with_engine(a).params, reference(a).params) <= 1e-6);
  const run_spec h = with({.stage = 1, .world = 2, .type = dtype::f16, .steps = 5, .overflow_step = 2});
  const auto got = train_with_engine(h);
  const auto want = reference(h);
  CHECK(got.applied == want.applied);
  CHECK(max_rel_diff(got.params, want.params) <= 1.0 / 2048 + fp16_slack);
  const run_spec p = with({.stage = 3, .world = 2, .steps = 4, .zero_extra = R"("offload_param": {"device": "cpu"})"});
  CHECK(max_rel_diff(train_with_engine(p).params, reference(p).params) <= 1e-6);
}

/// Trains `s` on CPU engines, collects the parameters (on every rank: a reader that may all-gather), then
/// calls `read(host)` on rank 0 with its host optimizer (`optimizer().host_part()`) for counts a test asks.
template <class Read> run_result train_then_read(const run_spec& s, Read&& read) {
  run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  with_cpu_engines(s, [&](auto& eng, const model_handles& mh, auto& comm) {
    train_steps(eng, mh, comm, s, 0, s.steps, out);
    collect_params(eng, mh, comm, out);
    if (comm.rank() == 0) {
      const auto* host = eng.optimizer().host_part();
      REQUIRE(host != nullptr);
      read(*host);
    }
  });
  return out;
}

/// Calls `fn(s)` with the run_spec of each stage of `stages` x world 1-3 x f32, bf16, f16 x (accumulation 1,
/// no clipping) and (accumulation 2, clipping at 1), each captured for the checks `fn` makes.
template <class Fn> void for_each_training_shape(std::initializer_list<int> stages, Fn&& fn) {
  struct shape {
    int accumulation;
    double clip;
  };
  for (int stage : stages) {
    for (int world : {1, 2, 3}) {
      for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
        for (shape sh : {shape{1, 0.0}, shape{2, 1.0}}) {
          CAPTURE(stage);
          CAPTURE(world);
          CAPTURE(zero::name_of(type));
          CAPTURE(sh.accumulation);
          CAPTURE(sh.clip);
          fn(run_spec{.stage = stage, .world = world, .type = type, .accumulation = sh.accumulation, .clip = sh.clip});
        }
      }
    }
  }
}

} // namespace zero::testing
