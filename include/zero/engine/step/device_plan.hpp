#pragma once
/// \file
/// `device_plan`: the step with the optimizer state in backend memory (`partitioned_adamw`), ZeRO's
/// own. The reducer keeps the rank's reduced gradients (a shard at stages 2-3, the whole buffer at
/// 0-1: `gradient_intake`, kept), the step checks them there and updates each owned range from them.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <utility>

namespace zero {

/// The step plan of state on the backend; the verbs are `step_plan`'s (see there), `detail::plan_interface`'s
/// but for the master copy stage 3 may cast its gathers from.
template <class Parts, class Optimizer>
class device_plan : public detail::plan_interface<device_plan<Parts, Optimizer>, Parts, Optimizer> {
  friend detail::plan_interface<device_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `partitioned_adamw`'s); `derive`: stage 3 keeps no 16-bit
  /// shard, so its gathers read the parameters from the master copy.
  template <class... Args>
  explicit device_plan(bool derive, Args&&... args) : opt_(std::forward<Args>(args)...), derive_(derive) {}

  [[nodiscard]] float* derived_master() noexcept { return derive_ ? opt_.master() : nullptr; }
  void add_memory(memory_report& /*m*/, const offload_split& /*split*/) const {}
  [[nodiscard]] double host_param_share(const memory_report& /*m*/) const noexcept { return 0.0; }

private:
  Optimizer opt_;
  bool derive_ = false;
  Parts* p_ = nullptr;
  gradient_intake<Parts> intake_;
};

} // namespace zero
