#pragma once
/// \file
/// The parts of a config the engine's step follows: the `scheduler` block as an `lr_scheduler`,
/// the `fp16` block as a `loss_scaler`, and the settings an engine must refuse.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/config/check.hpp" // check_engine_config: what the engine refuses
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/gradients/bucket_reducer.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

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
  case scheduler_type::lr_range_test:
    return lr_range_test(lr_range_test_params{.min_lr = s.lr_range_test_min_lr,
                                              .step_size = s.lr_range_test_step_size,
                                              .step_rate = s.lr_range_test_step_rate,
                                              .staircase = s.lr_range_test_staircase});
  case scheduler_type::one_cycle:
    return one_cycle(one_cycle_params{.cycle_min_lr = s.cycle_min_lr,
                                      .cycle_max_lr = s.cycle_max_lr,
                                      .decay_lr_rate = s.decay_lr_rate,
                                      .cycle_first_step_size = s.cycle_first_step_size,
                                      .cycle_second_step_size = s.cycle_second_step_size,
                                      .cycle_first_stair_count = s.cycle_first_stair_count,
                                      .cycle_second_stair_count = s.cycle_second_stair_count,
                                      .decay_step_size = s.decay_step_size,
                                      .cycle_momentum = s.cycle_momentum,
                                      .cycle_min_mom = s.cycle_min_mom,
                                      .cycle_max_mom = s.cycle_max_mom,
                                      .decay_mom_rate = s.decay_mom_rate});
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

/// The loss scaler of a config: DeepSpeed's dynamic (or static) fp16 scaler, none otherwise.
[[nodiscard]] inline loss_scaler scaler_from_config(const config& c) {
  if (!c.fp16.enabled) {
    return loss_scaler::none();
  }
  return loss_scaler(loss_scaler_options{.loss_scale = c.fp16.loss_scale,
                                         .initial_scale_power = static_cast<int>(c.fp16.initial_scale_power),
                                         .loss_scale_window = c.fp16.loss_scale_window,
                                         .hysteresis = static_cast<int>(c.fp16.hysteresis),
                                         .consecutive_hysteresis = c.fp16.consecutive_hysteresis,
                                         .min_loss_scale = c.fp16.min_loss_scale});
}

/// The arguments of AdamW step `step` (1-based, for bias correction) of `o`, its gradients scaled by
/// `grad_scale` (the clip coefficient), with `sched`'s betas for the step (OneCycle cycles them, the others keep
/// `o.betas`); lr and weight decay come from the parameter groups.
[[nodiscard]] inline adamw_step_args adamw_args_from_config(const optimizer_config& o, std::int64_t step,
                                                            double grad_scale, const lr_scheduler& sched) {
  const std::array<double, 2> betas = sched.betas(o.betas);
  adamw_step_args args;
  args.beta1 = static_cast<float>(betas[0]);
  args.beta2 = static_cast<float>(betas[1]);
  args.eps = static_cast<float>(o.eps);
  args.adam_w_mode = o.adam_w_mode;
  args.set_step(step, o.bias_correction);
  args.grad_scale = static_cast<float>(grad_scale);
  args.momentum = static_cast<float>(o.momentum);
  args.dampening = static_cast<float>(o.dampening);
  args.nesterov = o.nesterov;
  args.lr_decay = static_cast<float>(o.lr_decay);
  args.max_coeff = static_cast<float>(o.max_coeff);
  args.min_coeff = static_cast<float>(o.min_coeff);
  args.eps_inside_sqrt = o.eps_inside_sqrt;
  return args;
}

/// The update rule of optimizer type `t`: Adam and AdamW run `adamw_step`, the others their rule of
/// zero/backend/update_rules.hpp.
[[nodiscard]] constexpr update_rule rule_of(optimizer_type t) noexcept {
  switch (t) {
  case optimizer_type::lion:
    return update_rule::lion;
  case optimizer_type::sgd:
    return update_rule::sgd;
  case optimizer_type::adagrad:
    return update_rule::adagrad;
  case optimizer_type::lamb:
    return update_rule::lamb;
  case optimizer_type::custom:
    return update_rule::custom;
  case optimizer_type::adam:
  case optimizer_type::adamw:
    break;
  }
  return update_rule::adamw;
}

/// The name of `o`'s update rule: "AdamW" for Adam and AdamW (which run one rule), the other rules' own
/// (`name_of(update_rule)`), or a framework's rule's (`optimizer_config::custom`). What checkpoints, zero-estimate
/// and zero-report call it.
[[nodiscard]] inline std::string rule_name_of(const optimizer_config& o) {
  return o.type == optimizer_type::custom ? o.custom : std::string(name_of(rule_of(o.type)));
}

/// The fp32 state tensors `o`'s rule keeps per element beside the master copy, and their names (`rule_state`).
[[nodiscard]] inline std::pair<std::size_t, std::array<std::string_view, max_rule_state>>
rule_state_of(const optimizer_config& o) {
  if (o.type == optimizer_type::custom) { // a framework's rule: the names its custom_optimizer gave (at most 2)
    std::array<std::string_view, max_rule_state> names{};
    const std::size_t count = std::min(o.custom_state.size(), max_rule_state);
    for (std::size_t i = 0; i < count; ++i) {
      names[i] = o.custom_state[i];
    }
    return {count, names};
  }
  adamw_step_args a;
  a.momentum = static_cast<float>(o.momentum);
  return rule_state(rule_of(o.type), a);
}

/// DeepSpeed's clip: the factor the gradients are scaled by, `max_norm / (norm + 1e-6)` when that is
/// below 1, else 1 (also for `max_norm <= 0`, no clipping).
[[nodiscard]] inline double clip_coefficient(double norm, double max_norm) noexcept {
  const double coef = max_norm > 0 ? max_norm / (norm + 1e-6) : 1.0;
  return coef < 1.0 ? coef : 1.0;
}

/// The gradient reducer's options for `c` at its stage (`streamed`: reduced slices go to the host).
[[nodiscard]] inline reducer_options reducer_options_from(const config& c, bool streamed) {
  const auto& z = c.zero_optimization;
  reducer_options r{.mode = c.stage() >= 2 ? reduce_mode::reduce_scatter : reduce_mode::all_reduce,
                    .grad_type = c.grad_accum_dtype,
                    .overlap = z.overlap_comm,
                    .streamed = streamed};
  if (z.zero_quantized_gradients && c.stage() >= 2) {
    r.quantized = quant_format{.bits = static_cast<int>(z.zero_quantized_gradients_bits),
                               .block = static_cast<std::size_t>(z.zero_quantization_block_size)};
  }
  return r;
}

} // namespace zero
