#pragma once
/// \file
/// The config's model-parallel sizes (`pipeline.stages`, `tensor_parallel.autotp_size`) and the job
/// they describe: the ranks laid out as DeepSpeed lays them out (`topology_from_config`), and the
/// check that an engine's place in the job (`set_model_group`) agrees with them.

#include "zero/comm/topology.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine_types.hpp"

#include <cstdint>
#include <string>

namespace zero {

/// The ranks of a job of `world_size` ranks laid out by the config's sizes, as DeepSpeed's
/// `PipeModelDataParallelTopology`: axes (pipe, data, tensor), the tensor axis fastest, so tensor
/// peers are neighbours (one node). `pipeline.stages` gives the pipe axis (`"auto"`, the default:
/// 1; a framework whose model has more stages writes them), `tensor_parallel.autotp_size` the tensor
/// axis (0: 1), and the data axis takes the rest. The config's batch rule counts data-parallel
/// ranks: read it with `config_inputs::world_size` = the data axis.
/// \throws config_error naming both keys when their product does not divide `world_size`.
[[nodiscard]] inline topology topology_from_config(const config& c, int world_size) {
  const std::int64_t pipe = c.pipeline.stages.value_or(1);
  const std::int64_t tensor = c.tensor_parallel.autotp_size > 0 ? c.tensor_parallel.autotp_size : 1;
  if (world_size < 1 || world_size % (pipe * tensor) != 0) {
    throw config_error("pipeline.stages " + std::to_string(pipe) + " x tensor_parallel.autotp_size " +
                       std::to_string(tensor) + " does not divide the " + std::to_string(world_size) +
                       " ranks of the job; expected sizes whose product divides it (the data axis takes the rest)");
  }
  return topology({{"pipe", static_cast<int>(pipe)},
                   {"data", static_cast<int>(world_size / (pipe * tensor))},
                   {"tensor", static_cast<int>(tensor)}});
}

namespace detail {
/// Refuses an engine whose place in the job disagrees with the config's sizes: `at` is its place
/// (`set_model_group`), null without a model group, and `group_size` that group's ranks.
/// \throws config_error naming the key and the place.
inline void check_model_place(const config& c, const model_coords* at, int group_size) {
  const std::int64_t tensor = c.tensor_parallel.autotp_size;
  const std::int64_t stages = c.pipeline.stages.value_or(0);
  const std::string place = at == nullptr ? std::string("this engine has no model group")
                                          : "set_model_group gave pipe " + std::to_string(at->pipe) + ", tensor " +
                                                std::to_string(at->tensor) + " of " + std::to_string(at->tensor_size);
  const auto refuse = [&](const std::string& key, std::int64_t value, const std::string& expected) {
    throw config_error(key + " is " + std::to_string(value) + ", but " + place + "; expected " + expected);
  };
  if (tensor > 1 && at == nullptr) {
    refuse("tensor_parallel.autotp_size", tensor, "set_model_group(group, {.tensor = t, .tensor_size = autotp_size})");
  }
  if (stages > 1 && at == nullptr) {
    refuse("pipeline.stages", stages, "set_model_group(group, {.pipe = this rank's stage})");
  }
  if (at == nullptr) {
    return;
  }
  if (tensor > 0 && at->tensor_size != tensor) {
    refuse("tensor_parallel.autotp_size", tensor, "the same tensor size in model_coords::tensor_size");
  }
  if (stages > 0 && at->pipe >= stages) {
    refuse("pipeline.stages", stages, "a stage below it in model_coords::pipe");
  }
  // The model group holds every stage and slice of this rank's replica (and, for experts, the other
  // expert ranks): a multiple of stages x tensor size.
  if (stages > 0 && group_size % (stages * at->tensor_size) != 0) {
    refuse("pipeline.stages", stages,
           "a model group of a multiple of stages x tensor size = " + std::to_string(stages * at->tensor_size) +
               " ranks (it has " + std::to_string(group_size) + ")");
  }
}
} // namespace detail

} // namespace zero
