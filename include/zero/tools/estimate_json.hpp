#pragma once
/// \file
/// `estimate_json`: the `--json` object of zero-estimate, the options of `estimate_memory` and its rows.

#include "zero/core/dtype.hpp"
#include "zero/tools/estimate.hpp"

#include <nlohmann/json.hpp>
#include <vector>

namespace zero::tools {

/// The `--json` object of zero-estimate: {"params", "largest_layer_params", "gpus", "gpus_per_node",
/// "nodes", "param_dtype", "grad_dtype", "offload_ratio", "offload_forward_overlap", "host_ratio",
/// "hpz_partition_size", "mics_shard_size", "rows": [{"stage", "offload_optimizer", "offload_param",
/// "host_ratio", "delayed_update", "gpu_bytes_per_rank", "host_bytes_per_node", ...}]}.
[[nodiscard]] inline nlohmann::json estimate_json(const estimate_options& o, const std::vector<estimate_row>& rows) {
  nlohmann::json j = {{"params", o.params},
                      {"largest_layer_params", o.largest_layer_params},
                      {"gpus", o.ranks()},
                      {"gpus_per_node", o.gpus_per_node},
                      {"nodes", o.nodes},
                      {"param_dtype", name_of(o.param_dtype)},
                      {"grad_dtype", o.grad_dtype ? nlohmann::json(name_of(*o.grad_dtype)) : nlohmann::json("default")},
                      {"offload_ratio", o.offload_ratio},
                      {"offload_forward_overlap", o.offload_forward_overlap},
                      {"host_ratio", o.host_ratio},
                      {"hpz_partition_size", o.hpz_partition_size},
                      {"mics_shard_size", o.mics_shard_size},
                      {"padded", o.padded ? nlohmann::json{{"bucket_total", o.padded->bucket_total},
                                                           {"bucket_shard", o.padded->bucket_shard},
                                                           {"module_shard", o.padded->module_shard},
                                                           {"persistent_total", o.padded->persistent_total}}
                                          : nlohmann::json(nullptr)},
                      {"rows", nlohmann::json::array()}};
  for (const estimate_row& r : rows) {
    j["rows"].push_back({{"stage", r.stage},
                         {"offload_optimizer", name_of(r.offload_optimizer)},
                         {"offload_param", name_of(r.offload_param)},
                         {"host_ratio", r.host_ratio},
                         {"delayed_update", r.delayed_warmup >= 0},
                         {"zenflow", r.zenflow},
                         {"grad_dtype", name_of(r.grad_dtype)},
                         {"gpu_bytes_per_rank", r.gpu_bytes_per_rank},
                         {"gpu_model_state_bytes", r.gpu_model_state_bytes},
                         {"gpu_buffer_bytes", r.gpu_buffer_bytes},
                         {"host_bytes_per_node", r.host_bytes_per_node},
                         {"nvme_bytes_per_node", r.nvme_bytes_per_node},
                         {"implemented", r.implemented}});
  }
  return j;
}

} // namespace zero::tools
