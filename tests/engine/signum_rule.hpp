#pragma once
// Signum (signSGD with momentum), the framework's own update rule of examples/custom_rule, for the tests that run
// one through the engine (tests/engine/spec_custom_rule.cpp) and checkpoint it (tests/checkpoint/test_resume.cpp).

#include "../../examples/custom_rule/signum.hpp"
#include "engine_harness.hpp"

namespace zero::testing {

/// The example's rule (examples/custom_rule/signum.hpp).
using ::signum;

inline constexpr const char* signum_block =
    R"({"type": "signum", "params": {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.1}})";

inline run_spec with_signum(run_spec s) {
  s.optimizer = signum_block;
  s.weight_decay = 0.1;
  return with_custom_rule<signum>(s);
}

} // namespace zero::testing
