#pragma once
/// \file
/// `device_plan`: the step with the optimizer state in backend memory (`partitioned_adamw`), ZeRO's
/// own. The reducer keeps the rank's reduced gradients (a shard at stages 2-3, the whole buffer at
/// 0-1: `gradient_intake`, kept), the step checks them there and updates each owned range from them.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <exception>
#include <utility>

namespace zero {

/// The step plan of state on the backend; the verbs are `step_plan`'s (see there).
template <class Parts, class Optimizer> class device_plan {
public:
  using optimizer_type = Optimizer;
  using stream_type = typename Parts::stream_type;

  /// Makes the optimizer from `args` (as `partitioned_adamw`'s); `derive`: stage 3 keeps no 16-bit
  /// shard, so its gathers read the parameters from the master copy.
  template <class... Args>
  explicit device_plan(bool derive, Args&&... args) : opt_(std::forward<Args>(args)...), derive_(derive) {}

  [[nodiscard]] optimizer_type& optimizer() noexcept { return opt_; }
  [[nodiscard]] const optimizer_type& optimizer() const noexcept { return opt_; }
  [[nodiscard]] static constexpr bool streams() noexcept { return false; }
  [[nodiscard]] static constexpr bool steps_async() noexcept { return false; }
  [[nodiscard]] std::vector<std::size_t> kept() const { return {}; }
  [[nodiscard]] float* derived_master() noexcept { return derive_ ? opt_.master() : nullptr; }

  void connect(Parts& p) {
    p_ = &p;
    intake_.connect(p);
  }
  void begin_micro_step(bool /*boundary*/, double /*unscale*/) {}
  void join() {}
  void landed() {}
  grad_check check(double unscale) { return intake_.check(unscale); }
  void end_early(bool /*applied*/, double /*norm*/) {}
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    run_update(opt_, *p_, args, after);
  }
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& /*finish_gathers*/) {
    return end_param_writes(*p_, file);
  }
  void zero_gradients(const stream_type* s) { intake_.zero(s); }
  void add_memory(memory_report& /*m*/, const offload_split& /*split*/) const {}
  [[nodiscard]] double host_param_share(const memory_report& /*m*/) const noexcept { return 0.0; }

private:
  Optimizer opt_;
  bool derive_ = false;
  Parts* p_ = nullptr;
  gradient_intake<Parts> intake_;
};

} // namespace zero
