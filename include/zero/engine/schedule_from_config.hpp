#pragma once
/// \file
/// The `scheduler` block of a config as an `lr_scheduler`.

#include "zero/config/config.hpp"
#include "zero/optim/lr_schedule.hpp"

namespace zero {

/// Builds the schedule a `scheduler` block describes; `optimizer_lr` is the optimizer's lr
/// (WarmupLR's default warmup_max_lr, WarmupCosineLR's base lr).
[[nodiscard]] inline lr_scheduler::schedule schedule_from_config(const scheduler_config& s, double optimizer_lr) {
  const auto curve = s.warmup_type == warmup_curve::log ? warmup_type::log : warmup_type::linear;
  switch (s.type) {
  case scheduler_type::warmup_lr:
    return warmup_lr(warmup_lr_params{.warmup_min_lr = s.warmup_min_lr,
                                      .warmup_max_lr = s.warmup_max_lr.value_or(optimizer_lr),
                                      .warmup_num_steps = s.warmup_num_steps,
                                      .warmup_type = curve});
  case scheduler_type::warmup_decay_lr: {
    warmup_decay_lr_params p;
    p.warmup_min_lr = s.warmup_min_lr;
    p.warmup_max_lr = s.warmup_max_lr.value_or(0.001);
    p.warmup_num_steps = s.warmup_num_steps;
    p.warmup_type = curve;
    p.total_num_steps = s.total_num_steps;
    return warmup_decay_lr(p);
  }
  case scheduler_type::warmup_cosine_lr:
    return warmup_cosine_lr(warmup_cosine_lr_params{.base_lr = optimizer_lr,
                                                    .total_num_steps = s.total_num_steps,
                                                    .warmup_min_ratio = s.warmup_min_ratio,
                                                    .warmup_num_steps = s.warmup_num_steps,
                                                    .cos_min_ratio = s.cos_min_ratio,
                                                    .warmup_type = curve});
  }
  return constant_lr(optimizer_lr);
}

/// An `lr_scheduler` for a config: its schedule at its `last_batch_iteration`, or a constant lr.
[[nodiscard]] inline lr_scheduler scheduler_from_config(const config& c) {
  const double base = c.optimizer ? c.optimizer->lr : 1e-3;
  if (!c.scheduler) {
    return lr_scheduler(constant_lr(base));
  }
  lr_scheduler s(schedule_from_config(*c.scheduler, base));
  s.set_last_batch_iteration(c.scheduler->last_batch_iteration);
  return s;
}

} // namespace zero
