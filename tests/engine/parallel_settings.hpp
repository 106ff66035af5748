#pragma once
// The engine settings a model-parallel or MoE test trains under, against one engine holding the
// whole model: stages 0-3 in memory, and the last with accumulation and the optimizer on the host
// (its norms computed on the host's copy).

#include <string>
#include <vector>

namespace zero_test {

struct parallel_setting {
  int stage;
  std::string top;       ///< top-level config keys, each followed by ", "
  std::string zero_keys; ///< zero_optimization keys, each preceded by ", "
  int micro = 1;         ///< micro-steps per step
};

inline std::vector<parallel_setting> parallel_settings() {
  return {
      {0, "", ""},
      {1, "", ""},
      {2, "", ""},
      {3, "", ""},
      {2, R"("gradient_accumulation_steps": 2, )", R"(, "offload_optimizer": {"device": "cpu"})", 2},
  };
}

} // namespace zero_test
