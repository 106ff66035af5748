#pragma once
/// \file
/// `host_plan`: ZeRO-Offload's step, the optimizer state in host memory and AdamW on the host
/// (`offloaded_adamw`). At stages 2-3 the reducer streams each reduced slice to the host during
/// backward (`gradient_intake`) and keeps no gradient shard; without accumulation a range whose slice
/// landed may be updated during backward (`backward_overlap`: kept when the step applies unclipped,
/// else dropped), and the host may step beside the next forward (`forward_overlap`). At stages 0-1 the
/// step copies each range's reduced gradients to the host as it begins. With the delayed update
/// (`offload_optimizer.delayed_update`), after its warm-up a step publishes the update the step before
/// began and begins its own on the host without waiting for it. docs/offload.md.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <functional>
#include <optional>
#include <utility>

namespace zero {

namespace detail {
/// The host AdamW's updates during backward and beside the next forward, for the plans that have one:
/// the whole offloaded state (`host_plan`) and a split state's host share (`split_plan`).
template <class Parts, class HostOptimizer> struct host_updates {
  /// Queues the host's update of owned range `k` during backward, beginning the step's updates with
  /// its first range: the arguments of the step that follows, unclipped.
  static void early(Parts& p, HostOptimizer& host, std::size_t k) {
    if (host.overlap_elements() == 0) {
      return;
    }
    if (!host.early()) {
      // The schedule by value: an update may still run after the step has moved it on.
      host.begin_early(adamw_args_from_config(*p.cfg->optimizer, p.counters->applied_steps + 1, 1.0, *p.scheduler),
                       group_lr(p));
    }
    host.update_early(k);
  }
  /// Ends the updates during backward: kept when the step applies unclipped, else dropped.
  static void end(Parts& p, HostOptimizer& host, bool applied, double norm) {
    host.end_early(applied && clip_coefficient(norm, p.cfg->gradient_clipping) == 1.0, applied);
  }
  /// Hands the step to the host's thread when it runs beside the next forward, after which the
  /// schedule moves on: it keeps this step's.
  static void begin_async(Parts& p, HostOptimizer& host, const adamw_step_args& args) {
    host.begin_async(args, group_lr(p));
  }
  /// The schedule's group learning rate by value (`step_parts::group_lr_by_value`).
  static std::function<double(double)> group_lr(Parts& p) { return p.group_lr_by_value(); }
};
} // namespace detail

/// The step plan of state in host memory; the verbs are `step_plan`'s (see there), `detail::plan_interface`'s
/// but for the host's updates during backward and beside the next forward.
template <class Parts, class Optimizer>
class host_plan : public detail::plan_interface<host_plan<Parts, Optimizer>, Parts, Optimizer> {
  using updates = detail::host_updates<Parts, Optimizer>;
  friend detail::plan_interface<host_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `offloaded_adamw`'s); `streams`: stages 2-3, whose gradients
  /// go to the host during backward.
  template <class... Args>
  explicit host_plan(bool streams, Args&&... args)
      : opt_(std::forward<Args>(args)...), intake_(streams ? &opt_.grads() : nullptr, false) {}

  [[nodiscard]] bool steps_async() const noexcept { return intake_.streams() && opt_.can_run_async(); }

  void connect(Parts& p) {
    p_ = &p;
    intake_.connect(p, {}, [this](std::size_t k) { updates::early(*p_, opt_, k); });
  }
  void begin_micro_step(bool boundary, double unscale) {
    end_early(false, 0.0); // a step that ended early (an error) keeps none of its updates
    intake_.begin_micro_step(boundary, unscale);
  }
  /// Waits for a step running beside the forward.
  void join() {
    if (steps_async()) {
      opt_.join_async();
    }
  }
  void end_early(bool applied, double norm) { updates::end(*p_, opt_, applied, norm); }
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    if (delays()) {
      // The update the step before began reaches the device (the residency acting on each range as after
      // any update); this step's begins on the host, to be published by the next.
      opt_.begin_publish();
      run_update(opt_, *p_, args, after);
      opt_.end_publish();
      opt_.begin_delayed(args, updates::group_lr(*p_));
      return;
    }
    if (steps_async()) {
      updates::begin_async(*p_, opt_, args);
    }
    run_update(opt_, *p_, args, after);
  }
  /// Publishes a delayed update still unpublished on the engine's stream, for a reader of the parameters
  /// or the state. \returns true when there was one (the residency must then make the parameters whole).
  bool settle() { return opt_.publish(*p_->stream); }
  void add_memory(memory_report& m, const offload_split& /*split*/) const {
    add_host_memory(m, opt_.host_memory(), 1.0, intake_.streams() ? 1.0 : 0.0);
    if (opt_.can_delay()) {
      // The delayed update holds the host gradient shard twice (host_gradients::hold_twice): G psi / N more.
      m.host_formula += static_cast<double>(size_of(m.grad_type)) * static_cast<double>(m.parameters) / m.world_size;
    }
  }
  [[nodiscard]] double host_param_share(const memory_report& /*m*/) const noexcept { return 1.0; }

private:
  /// True when this step's update is delayed: the delayed update, past its warm-up.
  [[nodiscard]] bool delays() const {
    return opt_.can_delay() &&
           p_->counters->applied_steps >= p_->cfg->zero_optimization.offload_optimizer.delayed_warmup_steps;
  }

  Optimizer opt_;
  Parts* p_ = nullptr;
  host_gradient_intake<Parts, Optimizer> intake_;
};

} // namespace zero
