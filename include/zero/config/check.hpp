#pragma once
/// \file
/// `check_engine_config`: the one rule of which resolved configs zero's engine runs. The reader
/// (`config::from_file`) refuses what no engine could run; this refuses what the reader lets through
/// but the engine does not do: settings that contradict each other only for the engine, a missing
/// `optimizer` block, and node and shard group sizes that do not divide the data-parallel ranks. The
/// engine calls it at construction with its communicator's size, and `zero-report --config` and
/// `zero-estimate --config` call it with `--world-size`, so the three agree on every config.

#include "zero/config/config.hpp"
#include "zero/config/detail/offload_rules.hpp"
#include "zero/core/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace zero {

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
  const std::string ratio = o.ratio_auto ? std::string("\"auto\"") : detail::show_number(o.ratio);
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

/// The refusal of a setting a block (`what`, e.g. "zero_optimization.zenflow") cannot run with: a callable
/// `(found, setting, why, expected)` that throws config_error "<what> <setting>: <why>; expected <expected>, or
/// remove the block" when `found`.
inline auto refuse_in_block(std::string what) {
  return [what = std::move(what)](bool found, const std::string& setting, const char* why, const char* expected) {
    if (found) {
      throw config_error(what + " " + setting + ": " + why + "; expected " + expected + ", or remove the block");
    }
  };
}

/// Refuses `zero_optimization.zenflow`: first where DeepSpeed refuses it (stage 0; stages 1-2 without the
/// optimizer offloaded; `offload` without `overlap_comm`), so that a DeepSpeed config gets DeepSpeed's
/// reason, then where zero's engine does not run it (`zenflow_plan`): it runs at stages 1-3 with the whole
/// state offloaded to the CPU, the parameters on the device and none of the other overlaps (`overlap_step`
/// without accumulation).
inline void check_zenflow(const config& c) {
  const auto& z = c.zero_optimization;
  const auto& o = z.offload_optimizer;
  const std::string what = "zero_optimization.zenflow";
  if (c.stage() == 0) {
    throw config_error(what + " at stage 0: ZenFlow partitions the optimizer state; expected stage 1, 2 or 3");
  }
  if (c.stage() <= 2 && o.device == offload_device::none) {
    throw config_error(what + " at stage " + std::to_string(c.stage()) +
                       " without offload_optimizer: ZenFlow applies the unselected columns on the host; expected "
                       "offload_optimizer.device \"cpu\" (DeepSpeed refuses it too)");
  }
  if (z.zenflow.offload && !z.overlap_comm) {
    throw config_error(what + ".offload true without overlap_comm: DeepSpeed requires overlap_comm true with it");
  }
  // What this version's engine runs: each setting it does not, as found, why, and what it must be instead.
  const auto refuse = refuse_in_block(what);
  refuse(o.device != offload_device::cpu, "with offload_optimizer.device \"" + std::string(name_of(o.device)) + "\"",
         "zero's ZenFlow keeps the whole optimizer state in host memory and the chosen columns' on the device",
         "offload_optimizer.device \"cpu\"");
  refuse(o.ratio_auto || o.ratio < 1,
         "with offload_optimizer.ratio " + (o.ratio_auto ? std::string("\"auto\"") : detail::show_number(o.ratio)),
         "the host holds the whole state", "ratio 1");
  refuse(z.zenflow.overlap_step && c.gradient_accumulation_steps != 1,
         "with overlap_step true and gradient_accumulation_steps " + std::to_string(c.gradient_accumulation_steps),
         "the host's update runs beside the next steps on the threads that would add their micro-steps' gradients",
         "overlap_step false, or gradient_accumulation_steps 1");
  refuse(z.offload_param.device != offload_device::none,
         "with offload_param \"" + std::string(name_of(z.offload_param.device)) + "\"",
         "the device's update scatters into the parameter shard on the device", "offload_param \"none\"");
  refuse(o.delayed_update, "with offload_optimizer.delayed_update",
         "the two change what a step computes each their own way", "one of them");
  refuse(o.backward_overlap != 0 || o.forward_overlap,
         "with offload_optimizer.backward_overlap " + detail::show_number(o.backward_overlap) +
             " and forward_overlap " + (o.forward_overlap ? "true" : "false"),
         "ZenFlow's host step runs after backward, in place", "backward_overlap 0 and forward_overlap false");
  refuse(z.zenflow.offload, "with offload true", "this version keeps the chosen columns' state on the device",
         "offload false");
}

/// Refuses `offload_optimizer.delayed_update` where the engine cannot delay the host's update by one step:
/// the host must hold the whole state (device cpu, ratio 1), the gradients must stream to it during
/// backward into a buffer of their own (stages 2-3, no accumulation), and nothing the next step reads may
/// be what the host rewrites (the parameter shard on the device, no updates during backward).
inline void check_delayed_update(const config& c) {
  const auto& o = c.zero_optimization.offload_optimizer;
  const std::string what = "zero_optimization.offload_optimizer.delayed_update";
  if (o.delayed_warmup_steps < 0) {
    throw config_error(what + ".warmup_steps " + std::to_string(o.delayed_warmup_steps) +
                       ": expected a count of steps >= 0");
  }
  // Each setting the delay cannot run with: the setting as found, why, and what it must be instead.
  const auto refuse = refuse_in_block(what);
  const auto device = [](offload_device d) { return "\"" + std::string(name_of(d)) + "\""; };
  refuse(o.device != offload_device::cpu, "with device " + device(o.device),
         "the host delays only an update of state it holds in memory", "device \"cpu\"");
  refuse(o.ratio_auto || o.ratio < 1,
         "with ratio " + (o.ratio_auto ? std::string("\"auto\"") : detail::show_number(o.ratio)),
         "the delayed update runs on the whole state in host memory", "ratio 1");
  refuse(c.stage() < 2, "at stage " + std::to_string(c.stage()),
         "the next step's gradients must stream to the host during backward while the host still updates, which "
         "they do at stages 2-3",
         "zero_optimization.stage 2 or 3");
  refuse(c.gradient_accumulation_steps != 1,
         "with gradient_accumulation_steps " + std::to_string(c.gradient_accumulation_steps),
         "the host adds accumulated gradients with the threads its delayed update runs on",
         "gradient_accumulation_steps 1");
  refuse(c.zero_optimization.offload_param.device != offload_device::none,
         "with offload_param " + device(c.zero_optimization.offload_param.device),
         "the next step gathers from the parameter shard the host would be rewriting", "offload_param \"none\"");
  refuse(o.backward_overlap != 0, "with backward_overlap " + detail::show_number(o.backward_overlap),
         "an update during backward would use the step's own gradients, not one step old ones", "backward_overlap 0");
}
} // namespace detail

/// Refuses what a config asks and the engine cannot honour, naming the key, the value and what is
/// accepted.
/// \param c     a resolved config (from the reader, or built in code).
/// \param ranks the data-parallel ranks the engine runs on (its communicator's size); empty when not
///              known (a tool given no world size), which skips the checks that need it.
/// \throws config_error for parameter offload other than stage 3's to "cpu" or "nvme", or to "nvme"
/// without nvme_path (a config built in code: the reader refuses these too) or with fp32 parameters
/// and no optimizer offload; NVMe offload with fewer buffers than it needs; an offload ratio outside
/// [0, 1] or below 1 with NVMe (optimizer or parameters); a host_ratio outside [0, 1), or above 0 without
/// device nvme, with a ratio below 1 or with parameters on NVMe; an overlap key without the host holding the
/// state; qgZ with offload or with bits other than 4 and 8; HSDP with offload or with ZeRO++'s node
/// groups; an optimizer other than Adam/AdamW with NVMe offload, backward_overlap, delayed_update or ZenFlow; a
/// missing optimizer; a communication dtype other than the gradient dtype; and, with
/// `ranks`, an HSDP shard group, hpZ partition or qgZ node that does not divide the ranks.
inline void check_engine_config(const config& c, std::optional<std::int64_t> ranks = std::nullopt) {
  const auto& op = c.zero_optimization.offload_param;
  const offload_device param = op.device;
  const auto& o = c.zero_optimization.offload_optimizer;
  const auto refuse = [](const char* key, const std::string& why) {
    if (!why.empty()) {
      throw config_error(std::string("zero_optimization.") + key + ": " + why);
    }
  };
  refuse("offload_param.device", detail::offload_param_stage_refusal(param, c.stage()));
  refuse("offload_param.nvme_path", detail::nvme_path_refusal(param, op.nvme_path, "the parameter shard"));
  refuse("offload_optimizer.nvme_path", detail::nvme_path_refusal(o.device, o.nvme_path, "the optimizer state"));
  if (param == offload_device::nvme && c.param_dtype() == dtype::f32 &&
      c.zero_optimization.offload_optimizer.device == offload_device::none) {
    throw config_error("zero_optimization.offload_param.device: \"nvme\" with fp32 parameters needs "
                       "offload_optimizer.device \"cpu\" or \"nvme\": fp32 training keeps its master weights in "
                       "the parameters, and with the optimizer state in device memory a step that could not read "
                       "them back from NVMe could not be undone");
  }
  if (c.optimizer && c.optimizer->type != optimizer_type::adam && c.optimizer->type != optimizer_type::adamw) {
    // Another update rule runs wherever partitioned_adamw steps it: on the device and in host memory (whole or
    // split); the NVMe file's slots, the updates out of place and the delayed or selective steps are AdamW's.
    const std::string rule = "optimizer.type \"" + optimizer_name(*c.optimizer) + "\"";
    const auto refuse_rule = [&](bool on, const std::string& key) {
      if (on) {
        throw config_error("zero_optimization." + key + " with " + rule + ": this version runs " +
                           optimizer_name(*c.optimizer) +
                           " with its state in device or host memory (offload_optimizer.device \"none\" or "
                           "\"cpu\" with a numeric ratio, without backward_overlap, delayed_update or zenflow; "
                           "\"auto\" measures AdamW's rates); expected optimizer.type \"Adam\" or \"AdamW\" for "
                           "this key");
      }
    };
    refuse_rule(o.device == offload_device::nvme, "offload_optimizer.device \"nvme\"");
    refuse_rule(o.device == offload_device::cpu && o.ratio_auto, "offload_optimizer.ratio \"auto\"");
    refuse_rule(o.backward_overlap != 0, "offload_optimizer.backward_overlap");
    refuse_rule(o.delayed_update, "offload_optimizer.delayed_update");
    refuse_rule(c.zero_optimization.zenflow.enabled, "zenflow");
    if (c.optimizer->type == optimizer_type::lamb && o.device == offload_device::cpu &&
        ((!o.ratio_auto && o.ratio < 1) || o.forward_overlap)) {
      throw config_error(
          "zero_optimization.offload_optimizer." +
          std::string(o.forward_overlap ? "forward_overlap true" : "ratio " + detail::show_number(o.ratio)) + " with " +
          rule +
          ": Lamb's trust ratio sums every parameter over the ranks before any piece moves, so its "
          "host step waits for every gradient and runs once the step begins; this version runs Lamb "
          "with its whole state in device memory or in host memory (offload_optimizer.ratio 1, "
          "forward_overlap false)");
    }
  }
  if (!o.ratio_auto && !(o.ratio >= 0 && o.ratio <= 1)) {
    throw config_error("zero_optimization.offload_optimizer.ratio: " + detail::show_number(o.ratio) +
                       "; expected a number >= 0 and <= 1 (the share of the optimizer state offloaded), or \"auto\"");
  }
  refuse("offload_optimizer.ratio", detail::nvme_ratio_refusal(o));
  refuse("offload_optimizer.host_ratio", detail::host_ratio_refusal(o));
  refuse("offload_optimizer.host_ratio", detail::host_ratio_param_refusal(o, param));
  if (param == offload_device::nvme && o.device == offload_device::cpu && (o.ratio_auto || o.ratio < 1)) {
    throw config_error("zero_optimization.offload_optimizer.ratio: " +
                       (o.ratio_auto ? std::string("\"auto\"") : detail::show_number(o.ratio)) +
                       " with offload_param \"nvme\"; a partial offload needs the parameter shard in memory "
                       "(offload_param \"none\" or \"cpu\"), or set the ratio to 1");
  }
  if (o.backward_overlap != 0) {
    const std::string what =
        "zero_optimization.offload_optimizer.backward_overlap " + detail::show_number(o.backward_overlap);
    if (!(o.backward_overlap > 0 && o.backward_overlap <= 1)) {
      throw config_error(what + ": expected a share in [0, 1]");
    }
    detail::require_state_on_cpu(c, what, "updates during backward", "backward_overlap 0", o.forward_overlap);
  }
  if (o.forward_overlap) {
    detail::require_state_on_cpu(c, "zero_optimization.offload_optimizer.forward_overlap true",
                                 "steps beside the forward", "forward_overlap false", true);
  }
  if (o.delayed_update) {
    detail::check_delayed_update(c);
  }
  if (c.zero_optimization.zenflow.enabled) {
    detail::check_zenflow(c);
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
  if (const auto& nv = c.zero_optimization.offload_optimizer;
      nv.device == offload_device::nvme && nv.buffer_count < 2) {
    throw config_error("zero_optimization.offload_optimizer.buffer_count: " + std::to_string(nv.buffer_count) +
                       " with device \"nvme\"; NVMe offload needs at least 2 chunk buffers (one updating, one "
                       "reading ahead); expected 2 or more (DeepSpeed's default is 4)");
  }
  if (op.device == offload_device::nvme && op.buffer_count < 1) {
    throw config_error("zero_optimization.offload_param.buffer_count: " + std::to_string(op.buffer_count) +
                       " with device \"nvme\"; NVMe offload of the parameters reads each module's slice through a "
                       "buffer; expected 1 or more (DeepSpeed's default is 5)");
  }
  if (!c.optimizer) {
    throw config_error("optimizer: missing; the engine runs the Adam or AdamW that the config's optimizer block "
                       "describes and takes no optimizer from the framework; expected e.g. "
                       "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}");
  }
  if (c.communication_data_type != c.grad_accum_dtype) {
    throw config_error("communication_data_type: " +
                       detail::communication_dtype_refusal(c.communication_data_type, c.grad_accum_dtype));
  }
  if (!ranks) {
    return;
  }
  const std::int64_t n = *ranks;
  // The groups the engine splits its communicator into: each must tile the data-parallel ranks.
  const auto divides = [n](std::int64_t size, const std::string& key, const char* what) {
    if (size < 1 || size > n || n % size != 0) {
      throw config_error(key + " " + std::to_string(size) + " does not divide the " + std::to_string(n) +
                         " data-parallel ranks; expected " + what + ", a divisor of " + std::to_string(n));
    }
  };
  if (zq.hsdp(static_cast<int>(n))) {
    divides(zq.mics_shard_size, "zero_optimization.mics_shard_size", "the ranks of a shard group");
  }
  if (c.stage() == 3 && zq.zero_hpz_partition_size > 1) {
    divides(zq.zero_hpz_partition_size, "zero_optimization.zero_hpz_partition_size", "the ranks of a node");
  }
  if (zq.zero_quantized_gradients && c.stage() >= 2) {
    const std::int64_t h = zq.quantized_gradients_node_size();
    if (h != 1 && h != n) {
      divides(h,
              zq.zero_quantized_gradients_node_size ? "zero_optimization.zero_quantized_gradients_node_size"
                                                    : "zero_optimization.zero_hpz_partition_size",
              "the ranks of a node");
    }
  }
}

} // namespace zero
