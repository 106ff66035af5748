#pragma once
// What the offload suites share: `check_same_run`, two runs of the engine harness end with the same
// bits — parameters, gradient norms, applied steps and loss scales (doctest checks) — and
// `for_each_training_shape`, the runs they sweep.

#include "engine_harness.hpp"

#include <doctest/doctest.h>
#include <initializer_list>

namespace zero::testing {

inline void check_same_run(const run_result& got, const run_result& want) {
  CHECK(got.params == want.params);
  CHECK(got.norms == want.norms);
  CHECK(got.applied == want.applied);
  CHECK(got.scales == want.scales);
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
