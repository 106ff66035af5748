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

} // namespace zero::detail
