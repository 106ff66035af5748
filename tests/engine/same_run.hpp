#pragma once
// `check_same_run`: two runs of the engine harness end with the same bits — parameters, gradient
// norms, applied steps and loss scales (doctest checks, for the offload suites).

#include "engine_harness.hpp"

#include <doctest/doctest.h>

namespace zero::testing {

inline void check_same_run(const run_result& got, const run_result& want) {
  CHECK(got.params == want.params);
  CHECK(got.norms == want.norms);
  CHECK(got.applied == want.applied);
  CHECK(got.scales == want.scales);
}

} // namespace zero::testing
