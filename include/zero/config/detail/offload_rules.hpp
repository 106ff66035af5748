#pragma once
/// \file
/// The rules of the offload blocks that the reader (`config::from_file`, at the key's path) and
/// `check_engine_config` (for a config built in code too) both apply. Each returns why a setting is
/// refused, the text that follows the key's name, or an empty string when the rule holds: one home per
/// rule, so the two refusals say the same.

#include "zero/config/config.hpp"

#include <nlohmann/json.hpp>
#include <string>

namespace zero::detail {

/// `offload_param.device` `d` at ZeRO stage `stage`: parameters are offloaded at stage 3 only.
[[nodiscard]] inline std::string offload_param_stage_refusal(offload_device d, int stage) {
  if (d == offload_device::none || stage == 3) {
    return {};
  }
  return "found \"" + std::string(name_of(d)) +
         "\", but offload_param needs ZeRO stage 3 and zero_optimization.stage is " + std::to_string(stage);
}

/// The `nvme_path` of an offload block with device `d`: NVMe needs the folder its file of `holds` goes in.
[[nodiscard]] inline std::string nvme_path_refusal(offload_device d, const std::string& path, const char* holds) {
  if (d != offload_device::nvme || !path.empty()) {
    return {};
  }
  return std::string("missing; device \"nvme\" keeps ") + holds + " in a file under this folder";
}

/// `offload_optimizer.ratio` below 1 (or "auto") with device nvme: a split state needs host memory.
[[nodiscard]] inline std::string nvme_ratio_refusal(const offload_optimizer_config& o) {
  if (o.device != offload_device::nvme || !(o.ratio_auto || o.ratio < 1)) {
    return {};
  }
  return "found " + (o.ratio_auto ? std::string("\"auto\"") : nlohmann::json(o.ratio).dump()) +
         " with device \"nvme\"; a ratio below 1 keeps part of the optimizer state on the device and the rest in "
         "host memory, which needs device \"cpu\" (with nvme the whole state is in the file): write 1 or leave it "
         "out";
}

/// `offload_optimizer.host_ratio` `o.host_ratio`: a share in [0, 1) of the state in host memory beside the NVMe
/// file, so only with device nvme and a ratio of 1 (the whole state off the device).
[[nodiscard]] inline std::string host_ratio_refusal(const offload_optimizer_config& o) {
  const std::string found = "found " + nlohmann::json(o.host_ratio).dump();
  if (!(o.host_ratio >= 0 && o.host_ratio < 1)) {
    return found + "; expected a share >= 0 and below 1 of the optimizer state kept in host memory beside the NVMe " +
           "file" + (o.host_ratio == 1 ? " (the whole state in host memory is device \"cpu\")" : "");
  }
  if (o.host_ratio == 0) {
    return {};
  }
  if (o.ratio_auto || o.ratio < 1) {
    return found + " with ratio " + (o.ratio_auto ? std::string("\"auto\"") : nlohmann::json(o.ratio).dump()) +
           "; host_ratio splits the state between host memory and the NVMe file and ratio between the device and "
           "host memory, one split at a time: expected ratio 1 (or leave it out), or host_ratio 0";
  }
  if (o.device != offload_device::nvme) {
    return found + " with device \"" + std::string(name_of(o.device)) +
           "\"; host_ratio keeps that share of the state in host memory and the rest in the NVMe file of device "
           "\"nvme\": expected device \"nvme\" with nvme_path, or host_ratio 0 (device \"cpu\" keeps the whole "
           "state in host memory)";
  }
  return {};
}

/// `offload_optimizer.host_ratio` above 0 with `offload_param.device` `param`: the parameter file's bounce
/// buffers serve whole ranges, which the split state cuts in two.
[[nodiscard]] inline std::string host_ratio_param_refusal(const offload_optimizer_config& o, offload_device param) {
  if (param != offload_device::nvme || !(o.host_ratio > 0)) {
    return {};
  }
  return "found " + nlohmann::json(o.host_ratio).dump() +
         " with offload_param \"nvme\"; a state split between host memory and NVMe needs the parameter shard in "
         "memory (offload_param \"none\" or \"cpu\"): its parameters on NVMe already split by max_in_cpu. "
         "Expected host_ratio 0, or offload_param \"cpu\"";
}

} // namespace zero::detail
