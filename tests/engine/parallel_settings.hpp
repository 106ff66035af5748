#pragma once
// The engine settings a model-parallel or MoE test trains under, against one engine holding the
// whole model: stages 0-3 in memory, and the last with accumulation and the optimizer on the host
// (its norms computed on the host's copy).

#include "zero/config/config.hpp"

#include <doctest/doctest.h>
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

/// The config these tests train with on `ranks` ranks at `stage`: AdamW (lr 1e-2, weight decay 0.1), clipping at
/// 0.05, `top` and `zero_keys` added (as `parallel_setting`'s).
inline zero::config parallel_config(int ranks, int stage, const std::string& top = "",
                                    const std::string& zero_keys = "") {
  zero::config_inputs in;
  in.world_size = ranks;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.05, )" + top +
                                       R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
             "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0)" +
                                       zero_keys + "}}",
                                   in);
}

/// Runs `fn(setting)` for each of `parallel_settings()`, its stage and keys captured for any check that fails.
template <class Fn> void for_each_parallel_setting(Fn&& fn) {
  for (const auto& set : parallel_settings()) {
    CAPTURE(set.stage);
    CAPTURE(set.zero_keys);
    fn(set);
  }
}

} // namespace zero_test
