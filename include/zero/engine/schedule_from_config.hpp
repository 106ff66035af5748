#pragma once
/// \file
/// The parts of a config the engine's step follows: the `scheduler` block as an `lr_scheduler`,
/// the `fp16` block as a `loss_scaler`, and the settings an engine must refuse.

#include "zero/backend/adamw_args.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/bucket_reducer.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"

#include <string>

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
/// `grad_scale` (the clip coefficient); lr and weight decay come from the parameter groups.
[[nodiscard]] inline adamw_step_args adamw_args_from_config(const optimizer_config& o, std::int64_t step,
                                                            double grad_scale) {
  adamw_step_args args;
  args.beta1 = static_cast<float>(o.betas[0]);
  args.beta2 = static_cast<float>(o.betas[1]);
  args.eps = static_cast<float>(o.eps);
  args.adam_w_mode = o.adam_w_mode;
  args.set_step(step, o.bias_correction);
  args.grad_scale = static_cast<float>(grad_scale);
  return args;
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

namespace detail {
/// Refuses `what` (an overlap key and its value) unless the host holds the optimizer state in memory:
/// device cpu, with ratio 1 or, where `split_ok`, a state split with the device (the host's part then
/// streams its gradients as the whole state does: stages 2-3, no accumulation). `does` says what the
/// host then does, `off` the setting that turns it off.
inline void require_state_on_cpu(const config& c, const std::string& what, const char* does, const char* off,
                                 bool split_ok) {
  const auto& o = c.zero_optimization.offload_optimizer;
  if (o.device != offload_device::cpu) {
    throw config_error(what + " with device \"" + std::string(name_of(o.device)) + "\": the host " + does +
                       " only state it holds in memory; expected device \"cpu\", or " + off);
  }
  if (!(o.ratio_auto || o.ratio < 1)) {
    return;
  }
  const std::string ratio = o.ratio_auto ? std::string("\"auto\"") : std::to_string(o.ratio);
  if (!split_ok) {
    throw config_error(what + " with ratio " + ratio + ": the host " + does +
                       " only when it holds the whole state, or with forward_overlap true; expected ratio 1, "
                       "forward_overlap true, or " +
                       off);
  }
  if (c.stage() >= 2 && c.gradient_accumulation_steps != 1) {
    throw config_error(what + " with ratio " + ratio + " and gradient_accumulation_steps " +
                       std::to_string(c.gradient_accumulation_steps) + ": the host " + does +
                       " on a share of the state only when each micro-step's gradients are the step's (its "
                       "gradients are checked as they stream to the host); expected gradient_accumulation_steps 1, "
                       "ratio 1, or " +
                       off);
  }
}
} // namespace detail

/// Refuses what a config asks and the engine cannot honour, naming the key.
/// \throws config_error for parameter offload other than stage 3's to "cpu" or "nvme", or to "nvme"
/// without nvme_path (a config built in code: the reader refuses these too) or with fp32 parameters
/// and no optimizer offload, an offload ratio outside [0, 1] or below 1 with NVMe (optimizer or
/// parameters), a missing
/// optimizer, or a communication dtype that is neither the gradient nor the parameter dtype.
inline void check_engine_config(const config& c) {
  const auto& op = c.zero_optimization.offload_param;
  const offload_device param = op.device;
  if (param != offload_device::none &&
      ((param != offload_device::cpu && param != offload_device::nvme) || c.stage() != 3)) {
    throw config_error(std::string("zero_optimization.offload_param.device: \"") + std::string(name_of(param)) +
                       "\" at stage " + std::to_string(c.stage()) +
                       "; this engine offloads parameters to \"cpu\" or \"nvme\" at stage 3 only");
  }
  if (param == offload_device::nvme && c.param_dtype() == dtype::f32 &&
      c.zero_optimization.offload_optimizer.device == offload_device::none) {
    throw config_error("zero_optimization.offload_param.device: \"nvme\" with fp32 parameters needs "
                       "offload_optimizer.device \"cpu\" or \"nvme\": fp32 training keeps its master weights in "
                       "the parameters, and with the optimizer state in device memory a step that could not read "
                       "them back from NVMe could not be undone");
  }
  if (param == offload_device::nvme && op.nvme_path.empty()) {
    throw config_error("zero_optimization.offload_param.nvme_path: missing; device \"nvme\" keeps the parameter "
                       "shard in a file under this folder");
  }
  const auto& o = c.zero_optimization.offload_optimizer;
  if (!o.ratio_auto && !(o.ratio >= 0 && o.ratio <= 1)) {
    throw config_error("zero_optimization.offload_optimizer.ratio: " + std::to_string(o.ratio) +
                       "; expected a number >= 0 and <= 1 (the share of the optimizer state offloaded), or \"auto\"");
  }
  if (o.device == offload_device::nvme && (o.ratio_auto || o.ratio < 1)) {
    throw config_error("zero_optimization.offload_optimizer.ratio: " +
                       (o.ratio_auto ? std::string("\"auto\"") : std::to_string(o.ratio)) +
                       " with device \"nvme\"; a ratio below 1 needs device \"cpu\" (with nvme the whole state is "
                       "in the file)");
  }
  if (param == offload_device::nvme && o.device == offload_device::cpu && (o.ratio_auto || o.ratio < 1)) {
    throw config_error("zero_optimization.offload_optimizer.ratio: " +
                       (o.ratio_auto ? std::string("\"auto\"") : std::to_string(o.ratio)) +
                       " with offload_param \"nvme\"; a partial offload needs the parameter shard in memory "
                       "(offload_param \"none\" or \"cpu\"), or set the ratio to 1");
  }
  if (o.backward_overlap != 0) {
    const std::string what =
        "zero_optimization.offload_optimizer.backward_overlap " + std::to_string(o.backward_overlap);
    if (!(o.backward_overlap > 0 && o.backward_overlap <= 1)) {
      throw config_error(what + ": expected a share in [0, 1]");
    }
    detail::require_state_on_cpu(c, what, "updates during backward", "backward_overlap 0", o.forward_overlap);
  }
  if (o.forward_overlap) {
    detail::require_state_on_cpu(c, "zero_optimization.offload_optimizer.forward_overlap true",
                                 "steps beside the forward", "forward_overlap false", true);
  }
  const auto& zq = c.zero_optimization;
  if (zq.zero_quantized_gradients && c.stage() >= 2) {
    if (zq.zero_quantized_gradients_bits != 4 && zq.zero_quantized_gradients_bits != 8) {
      throw config_error("zero_optimization.zero_quantized_gradients_bits: " +
                         std::to_string(zq.zero_quantized_gradients_bits) + "; expected 4 or 8");
    }
    if (o.device != offload_device::none) {
      throw config_error("zero_optimization.zero_quantized_gradients with offload_optimizer.device \"" +
                         std::string(name_of(o.device)) +
                         "\": the quantized reduction keeps the reduced gradients on the device; expected device "
                         "\"none\", or zero_quantized_gradients false");
    }
  }
  if (zq.mics_shard_size > 1 && c.stage() >= 1) {
    // HSDP's replicas all-reduce the reduced shards the device keeps; its shard group is already a node.
    const std::string what = "zero_optimization.mics_shard_size " + std::to_string(zq.mics_shard_size);
    if (o.device != offload_device::none || zq.offload_param.device != offload_device::none) {
      throw config_error(what + " with offload: HSDP all-reduces the reduced gradient shards on the device, which "
                                "offload streams to the host; expected offload_optimizer and offload_param device "
                                "\"none\", or mics_shard_size -1");
    }
    if (zq.zero_quantized_gradients || (c.stage() == 3 && zq.zero_hpz_partition_size > 1)) {
      throw config_error(what + " with " +
                         (zq.zero_quantized_gradients ? "zero_quantized_gradients" : "zero_hpz_partition_size") +
                         ": ZeRO++'s node groups would split the shard group again; expected one of HSDP and "
                         "ZeRO++'s hpZ / qgZ");
    }
  }
  if (!c.optimizer) {
    throw config_error("optimizer: the engine trains with Adam or AdamW from the config; add e.g. "
                       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}");
  }
  if (c.communication_data_type != c.grad_accum_dtype && c.communication_data_type != c.param_dtype()) {
    throw config_error("communication_data_type: " + std::string(name_of(c.communication_data_type)) +
                       " is neither the gradient dtype (" + std::string(name_of(c.grad_accum_dtype)) +
                       ") nor the parameter dtype; gradients are communicated in the gradient dtype");
  }
}

} // namespace zero
