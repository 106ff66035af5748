#pragma once
/// \file
/// DeepSpeed's own model-state memory formulas, reproduced exactly as `zero-estimate` prints them beside
/// zero's accounting (estimate.hpp): `estimate_zero2_model_states_mem_needs` (deepspeed/runtime/zero/
/// stage_1_and_2.py) and `estimate_zero3_model_states_mem_needs` (deepspeed/runtime/zero/stage3.py), evaluated
/// with the same integer/float mix as its Python, and the tables their `*_all_cold` functions print.

#include "zero/core/detail/text.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace zero::tools {

using zero::detail::cat;

/// One result of DeepSpeed's estimators, in bytes. `cpu_bytes` is per node, `gpu_bytes` per GPU.
struct deepspeed_estimate {
  std::int64_t cpu_bytes = 0; ///< DeepSpeed's "per CPU" column: host memory of one node
  std::int64_t gpu_bytes = 0; ///< DeepSpeed's "per GPU" column
};

/// DeepSpeed's `estimate_zero2_model_states_mem_needs` (stage 1 and 2), evaluated in the same order
/// and with the same integer/float mix as its Python, so the bytes match to the last one.
/// \param total_params      parameters in the model.
/// \param gpus_per_node     GPUs per node (>= 1).
/// \param nodes             nodes (>= 1).
/// \param cpu_offload       offload_optimizer=cpu.
/// \param buffer_factor     DeepSpeed's additional_buffer_factor (1.5).
[[nodiscard]] inline deepspeed_estimate deepspeed_zero2_estimate(std::int64_t total_params, std::int64_t gpus_per_node,
                                                                 std::int64_t nodes, bool cpu_offload,
                                                                 double buffer_factor = 1.5) {
  const std::int64_t total_gpus = nodes * gpus_per_node;
  double cpu = 0;
  double gpu = 0;
  if (cpu_offload) {
    gpu = static_cast<double>(2 * total_params);
    cpu = static_cast<double>(total_params * std::max<std::int64_t>(4 * total_gpus, 16)) * buffer_factor;
  } else {
    // 2 bytes of 16-bit params, plus 18 per parameter sharded: 16-bit and fp32 grads, fp32 master, Adam m and v.
    gpu = static_cast<double>(2 * total_params) +
          static_cast<double>(
              static_cast<std::int64_t>(static_cast<double>(18 * total_params) / static_cast<double>(total_gpus)));
    cpu = static_cast<double>(total_params * 4 * gpus_per_node) * buffer_factor;
  }
  return {static_cast<std::int64_t>(cpu), static_cast<std::int64_t>(gpu)};
}

/// DeepSpeed's `estimate_zero3_model_states_mem_needs`, evaluated as its Python does.
/// \param total_params          parameters in the model.
/// \param largest_layer_params  parameters of the largest module (stage 3 gathers one module at a time).
/// \param gpus_per_node         GPUs per node (>= 1).
/// \param nodes                 nodes (>= 1).
/// \param cpu_offload           offload_optimizer=cpu.
/// \param cpu_offload_params    offload_param=cpu.
/// \param zero_init             the model is built partitioned (deepspeed.zero.Init).
/// \param buffer_factor         DeepSpeed's additional_buffer_factor (1.5).
[[nodiscard]] inline deepspeed_estimate deepspeed_zero3_estimate(std::int64_t total_params,
                                                                 std::int64_t largest_layer_params,
                                                                 std::int64_t gpus_per_node, std::int64_t nodes,
                                                                 bool cpu_offload, bool cpu_offload_params,
                                                                 bool zero_init, double buffer_factor = 1.5) {
  const std::int64_t total_gpus = nodes * gpus_per_node;
  const double gpus_factor = 1.0 / static_cast<double>(nodes);
  const std::int64_t largest_layer_memory = 4 * largest_layer_params;
  const auto P = static_cast<double>(total_params);
  double cpu = 0;
  double gpu = 0;
  // Python's max(int, float) keeps whichever is larger, with its own type; the product is the same.
  const auto max_mixed = [](double a, double b) { return a >= b ? a : b; };
  if (cpu_offload) {
    if (cpu_offload_params) {
      gpu = static_cast<double>(largest_layer_memory);
      cpu = zero_init ? static_cast<double>(total_params * 18) * gpus_factor * buffer_factor
                      : P * max_mixed(static_cast<double>(4 * gpus_per_node), 18 * gpus_factor) * buffer_factor;
    } else {
      gpu = static_cast<double>(largest_layer_memory) +
            static_cast<double>(
                static_cast<std::int64_t>(static_cast<double>(2 * total_params) / static_cast<double>(total_gpus)));
      cpu = zero_init ? static_cast<double>(total_params * 16) * gpus_factor * buffer_factor
                      : P * max_mixed(static_cast<double>(4 * gpus_per_node), 16 * gpus_factor) * buffer_factor;
    }
  } else {
    gpu = static_cast<double>(largest_layer_memory) +
          static_cast<double>(
              static_cast<std::int64_t>(static_cast<double>(18 * total_params) / static_cast<double>(total_gpus)));
    cpu = zero_init ? static_cast<double>(largest_layer_params * 4 * gpus_per_node) * buffer_factor
                    : static_cast<double>(total_params * 4 * gpus_per_node) * buffer_factor;
  }
  return {static_cast<std::int64_t>(cpu), static_cast<std::int64_t>(gpu)};
}

namespace detail {
/// Python's f"{x:{width}.2f}".
inline std::string fixed2(double x, int width) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%*.2f", width, x);
  return buf;
}
inline std::string hw_line(std::int64_t gpus_per_node, std::int64_t nodes) {
  return cat("HW: Setup with ", std::to_string(nodes), (nodes > 1 ? " nodes, " : " node, "),
             std::to_string(gpus_per_node), (gpus_per_node > 1 ? " GPUs" : " GPU"), " per node.\n");
}
} // namespace detail

/// The table DeepSpeed's `estimate_zero2_model_states_mem_needs_all_cold` prints, byte for byte
/// (its "cpu" is padded to 4 characters, as its format string does).
[[nodiscard]] inline std::string deepspeed_zero2_table(std::int64_t total_params, std::int64_t gpus_per_node,
                                                       std::int64_t nodes, double buffer_factor = 1.5) {
  std::string out =
      cat("Estimated memory needed for params, optim states and gradients for a:\n",
          detail::hw_line(gpus_per_node, nodes), "SW: Model with ", std::to_string(total_params / 1'000'000),
          "M total params.\n", "  per CPU  |  per GPU |   Options\n");
  for (bool offload : {true, false}) {
    const auto e = deepspeed_zero2_estimate(total_params, gpus_per_node, nodes, offload, buffer_factor);
    out += cat(" ", detail::fixed2(static_cast<double>(e.cpu_bytes) / 1073741824.0, 7), "GB | ",
               detail::fixed2(static_cast<double>(e.gpu_bytes) / 1073741824.0, 6), "GB | ",
               (offload ? "offload_optimizer=cpu " : "offload_optimizer=none"), "\n");
  }
  return out;
}

/// The table DeepSpeed's `estimate_zero3_model_states_mem_needs_all_cold` prints, byte for byte.
[[nodiscard]] inline std::string deepspeed_zero3_table(std::int64_t total_params, std::int64_t largest_layer_params,
                                                       std::int64_t gpus_per_node, std::int64_t nodes,
                                                       double buffer_factor = 1.5) {
  std::string out =
      cat("Estimated memory needed for params, optim states and gradients for a:\n",
          detail::hw_line(gpus_per_node, nodes), "SW: Model with ", std::to_string(total_params / 1'000'000),
          "M total params, ", std::to_string(largest_layer_params / 1'000'000), "M largest layer params.\n",
          "  per CPU  |  per GPU |   Options\n");
  for (bool offload : {true, false}) {
    for (bool offload_params : {true, false}) {
      if (!offload && offload_params) {
        continue;
      }
      for (bool zero_init : {true, false}) {
        const auto e = deepspeed_zero3_estimate(total_params, largest_layer_params, gpus_per_node, nodes, offload,
                                                offload_params, zero_init, buffer_factor);
        out += cat(" ", detail::fixed2(static_cast<double>(e.cpu_bytes) / 1073741824.0, 7), "GB | ",
                   detail::fixed2(static_cast<double>(e.gpu_bytes) / 1073741824.0, 6), "GB | ",
                   "offload_param=", (offload_params ? "cpu " : "none"),
                   ", offload_optimizer=", (offload ? "cpu " : "none"), ", zero_init=", (zero_init ? "1" : "0"), "\n");
      }
    }
  }
  return out;
}

} // namespace zero::tools
