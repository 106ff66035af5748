#pragma once
/// \file
/// `detail::plan_interface`: the verbs of `step_plan` in their plainest form, written once for the five
/// plans (as `std::ranges::view_interface` writes a view's members from a few of its own). It holds
/// nothing: a plan holds its optimizer (`opt_`), the engine's parts (`p_`, set by `connect`) and its
/// gradient intake (`intake_`) as members of its own and befriends this class. A plan that does more in a
/// verb declares its own, which hides this one; what a plan holds in memory (`add_memory`,
/// `host_param_share`) every plan says itself. docs/design.md, "Step plans".

#include "zero/backend/adamw_args.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <cstddef>
#include <exception>
#include <vector>

namespace zero::detail {

/// The plain verbs of a step plan `Derived` over `Parts` (a `step_parts`) and `Optimizer`; see the file
/// comment.
template <class Derived, class Parts, class Optimizer> class plan_interface {
public:
  using optimizer_type = Optimizer;

  [[nodiscard]] Optimizer& optimizer() noexcept { return self().opt_; }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return self().opt_; }
  /// True when the reducer hands the plan its reduced slices during backward (its intake streams).
  [[nodiscard]] bool streams() const noexcept { return self().intake_.streams(); }
  /// No step beside the next forward.
  [[nodiscard]] static constexpr bool steps_async() noexcept { return false; }
  /// Nothing of a streamed slice kept on the device.
  [[nodiscard]] std::vector<std::size_t> kept() const { return {}; }
  /// No master for stage 3's gathers to cast from.
  [[nodiscard]] static constexpr float* derived_master() noexcept { return nullptr; }

  /// Keeps `p` (by reference) and connects the intake to its reducer.
  void connect(Parts& p) {
    self().p_ = &p;
    self().intake_.connect(p);
  }
  void begin_micro_step(bool boundary, double unscale) { self().intake_.begin_micro_step(boundary, unscale); }
  /// Nothing runs beside the forward.
  void join() {}
  void landed() { self().intake_.landed(); }
  grad_check check(double unscale) { return self().intake_.check(unscale); }
  /// Nothing was updated during backward.
  void end_early(bool /*applied*/, double /*norm*/) {}
  /// No update is ever left unpublished.
  static constexpr bool settle() noexcept { return false; }
  /// AdamW over the owned ranges (`run_update`).
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    run_update(self().opt_, *self().p_, args, after);
  }
  /// The state is in memory: only stage 3's parameter file has writes to end (`end_param_writes`).
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& /*finish_gathers*/) {
    return end_param_writes(*self().p_, file);
  }
  void zero_gradients(const typename Parts::stream_type* s) { self().intake_.zero(s); }

private:
  [[nodiscard]] Derived& self() noexcept { return static_cast<Derived&>(*this); }
  [[nodiscard]] const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

} // namespace zero::detail
