#pragma once
/// \file
/// `zenflow_plan`: DeepSpeed's ZenFlow (`zero_optimization.zenflow`) as a step plan over `zenflow_adamw`. At
/// stages 2-3 the gradients stream to the host during backward as `host_plan`'s do (at stage 1 they stay on the
/// device, where the step gathers the chosen ones, and are copied to the host as it begins); the intake hands each
/// slice to the optimizer first, which gathers the chosen columns' gradients from it on the device, or (with gradient
/// accumulation, whose slices are not final as they leave) takes them from the host shard's sums at the step. At a step
/// that chooses again the plan all-reduces the column sums over the data group; at a host step whose window holds
/// earlier steps it writes the window's mean into the host shard and clips the host's update by that mean's
/// norm (`grad_stats::combine`, one all-reduce). With `overlap_step` that host update runs on the host's thread
/// beside the next steps and the next host step publishes it before it hands over its own (the delayed update's
/// protocol of `offloaded_adamw`); a reader publishes one still pending. docs/offload.md, "Selective".

#include "zero/comm/communicator.hpp"
#include "zero/core/dtype.hpp"
#include "zero/engine/memory_report.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/step_parts.hpp"
#include "zero/engine/step/zenflow_adamw.hpp"

#include <cstddef>
#include <utility>

namespace zero {

/// The step plan of ZenFlow; the verbs are `step_plan`'s, `detail::plan_interface`'s but for the schedule's.
template <class Parts, class Optimizer>
class zenflow_plan : public detail::plan_interface<zenflow_plan<Parts, Optimizer>, Parts, Optimizer> {
  friend detail::plan_interface<zenflow_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `zenflow_adamw`'s); `streams`: stages 2-3, whose gradients stream to the
  /// host during backward (stage 1 keeps them on the device until the step).
  template <class... Args>
  explicit zenflow_plan(bool streams, Args&&... args)
      : opt_(std::forward<Args>(args)...), intake_(streams ? &opt_.grads() : nullptr, false) {}

  void connect(Parts& p) {
    p_ = &p;
    intake_.connect(p, {}, {}, [this](std::size_t k, const std::byte* slice, bool final) {
      opt_.take(k, slice, final, p_->counters->applied_steps);
    });
    opt_.connect([this](float* sums, std::size_t n) {
      if (p_->comm->size() > 1) {
        p_->comm->all_reduce(sums, sums, n, reduce_op::sum).wait();
      }
    });
  }
  void begin_micro_step(bool boundary, double unscale) {
    opt_.begin_step(p_->counters->applied_steps);
    intake_.begin_micro_step(boundary, unscale);
  }
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    opt_.begin_step(p_->counters->applied_steps); // after a load (init_params, a checkpoint) since the micro-step began
    if (!intake_.streams()) {
      opt_.fetch(p_->reduced(), p_->counters->applied_steps); // stage 1: the chosen gradients gathered on the device
    }
    if (opt_.selects()) {
      if (opt_.overlap()) {
        // overlap_step: the host update still beside the steps was begun over the old choice. It lands first (each
        // range uploaded, the chosen elements' own scattered over it; the step's all-gathers follow), then the
        // choice writes the compact state back and moves it.
        static_cast<void>(opt_.publish(*p_->stream));
      }
      opt_.select();
    } else if (intake_.streams() && p_->cfg->gradient_accumulation_steps > 1) {
      opt_.take_from_shard(); // the slices were not final as they left: the chosen gradients are the host shard's sums
    }
    if (opt_.averages()) {
      opt_.mean_into_shard();
      const auto c = opt_.grads().check(1.0, p_->stats->slots());
      const grad_check mean = p_->stats->combine(c.squared_norms, c.nonfinite, false);
      adamw_step_args host = args;
      host.grad_scale = static_cast<float>(clip_coefficient(mean.norm, p_->cfg->gradient_clipping));
      opt_.set_host_args(host);
    }
    if (opt_.overlaps()) {
      // The host update the last host step began reaches the device (each range's upload before its compact
      // scatter); this step's begins on the host's thread, to be published by the next host step.
      opt_.begin_publish();
      run_update(opt_, *p_, args, after);
      opt_.end_publish();
      opt_.begin_delayed(args, p_->group_lr_by_value());
    } else {
      run_update(opt_, *p_, args, after);
    }
    opt_.end_step();
  }
  /// Publishes a host update still unpublished (`overlap_step`) on the engine's stream, for a reader of the
  /// parameters or the state. \returns true when there was one (the residency must then make the parameters whole).
  bool settle() { return opt_.publish(*p_->stream); }
  void add_memory(memory_report& m, const offload_split& /*split*/) const {
    add_host_memory(m, opt_.host_memory(), 1.0, intake_.streams() ? 1.0 : 0.0);
    // The window: an fp32 sum of the gradient shard, 4 psi / N more.
    m.host_formula += 4.0 * static_cast<double>(m.parameters) / m.world_size;
    if (opt_.overlap()) { // overlap_step holds the host gradient shard twice (host_gradients::hold_twice)
      m.host_formula += static_cast<double>(size_of(m.grad_type)) * static_cast<double>(m.parameters) / m.world_size;
    }
    // The device: the chosen elements' compact state, 4 bytes of index, 12 of master, m and v, and the gradient
    // and (16-bit training) the parameter of each.
    const std::size_t param = m.param_type == dtype::f32 ? 0 : size_of(m.param_type);
    m.formula += static_cast<double>(opt_.chosen_elements() * (4 + 12 + size_of(m.grad_type) + param));
  }
  [[nodiscard]] double host_param_share(const memory_report& /*m*/) const noexcept { return 1.0; }

private:
  Optimizer opt_;
  Parts* p_ = nullptr;
  host_gradient_intake<Parts, Optimizer> intake_;
};

} // namespace zero
