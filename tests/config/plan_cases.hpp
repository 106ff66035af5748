#pragma once
// The model and rates the plan's costs are worked by hand with (tests/config/test_plan.cpp,
// test_plan_stale.cpp).

#include "zero/tools/estimate.hpp"
#include "zero/tools/rates.hpp"

namespace zero_test {

/// 8e6 bf16 parameters on 2 ranks of one node: each rank updates n = 4e6 elements.
inline zero::tools::estimate_options eight_m_on_two() {
  zero::tools::estimate_options o;
  o.params = 8'000'000;
  o.gpus_per_node = 2;
  return o;
}

/// Round rates for costs worked by hand: device AdamW 4e9 parameters per second, host 1e9 (5e8 per rank of
/// eight_m_on_two), 1e10 B/s up and 2e10 B/s down.
inline zero::tools::machine_rates hand_rates() {
  zero::tools::machine_rates r;
  r.device_adamw = 4e9;
  r.host_adamw = 1e9;
  r.host_to_device = 1e10;
  r.device_to_host = 2e10;
  return r;
}

} // namespace zero_test
