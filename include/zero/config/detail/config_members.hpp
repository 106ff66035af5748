#pragma once
/// \file
/// The members of `zero::config` that read and write a whole config: `from_json`, `from_string`, `from_file`,
/// `read_json_file`, `rebatched` and `to_json`, over the block parsers of parse.hpp and the key tables of
/// schema.hpp (which parse.hpp includes, and which includes parse.hpp at its end, which includes this file at its
/// end).

#include "zero/config/detail/parse.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace zero {

inline config config::from_json(const nlohmann::json& j, const config_inputs& inputs, std::string_view source) {
  detail::check_depth(j, source);
  return detail::parse_config(j, inputs, source);
}

inline config config::from_string(std::string_view text, const config_inputs& inputs, std::string_view source) {
  // parse_text has bounded the depth already.
  return detail::parse_config(detail::parse_text(text, source), inputs, source);
}

inline nlohmann::json config::read_json_file(const std::filesystem::path& path) {
  return detail::parse_text(detail::read_config_text(path), path.string());
}

inline config config::from_file(const std::filesystem::path& path, const config_inputs& inputs) {
  return from_string(detail::read_config_text(path), inputs, path.string());
}

inline config config::rebatched(std::int64_t world) const {
  config c = *this;
  const batch_sizes b = resolve_batch(batch_given, world);
  c.world_size = world;
  c.train_batch_size = b.train_batch_size;
  c.train_micro_batch_size_per_gpu = b.train_micro_batch_size_per_gpu;
  c.gradient_accumulation_steps = b.gradient_accumulation_steps;
  return c;
}

inline nlohmann::json config::to_json() const {
  using namespace detail;
  json j = write_keys(top_keys, *this);
  j["fp16"] = write_keys(fp16_keys, fp16);
  j["bf16"] = write_keys(bf16_keys, bf16);
  j["data_types"] = write_keys(data_types_keys, *this);
  if (optimizer) {
    const bool custom = optimizer->type == optimizer_type::custom;
    j["optimizer"] = custom ? json{{"type", optimizer->custom}} : write_keys(optimizer_keys, *optimizer);
    // Only the type's own parameters: another type's would be refused when the written config is read back.
    json params = write_keys(optimizer_params_keys, *optimizer);
    std::vector<std::string_view> theirs;
    if (custom) {
      theirs.assign(optimizer->custom_params.begin(), optimizer->custom_params.end());
    } else {
      const auto builtin = optimizer_params(optimizer->type);
      theirs.assign(builtin.begin(), builtin.end());
    }
    for (auto it = params.begin(); it != params.end();) {
      it = std::find(theirs.begin(), theirs.end(), it.key()) == theirs.end() ? params.erase(it) : std::next(it);
    }
    j["optimizer"]["params"] = std::move(params);
  }
  if (scheduler) {
    json params = json::object();
    for (std::string_view key : schedule_params(scheduler->type)) {
      params[std::string(key)] = row_of<scheduler_config>(scheduler_params_keys, key).write(*scheduler);
    }
    j["scheduler"] = write_keys(scheduler_keys, *scheduler);
    j["scheduler"]["params"] = std::move(params);
  }
  j["zero_optimization"] = write_keys(zero_optimization_keys, zero_optimization);
  j["zero_optimization"]["offload_optimizer"] = write_keys(offload_optimizer_keys, zero_optimization.offload_optimizer);
  if (zero_optimization.offload_optimizer.delayed_update) {
    j["zero_optimization"]["offload_optimizer"]["delayed_update"] =
        write_keys(delayed_update_keys, zero_optimization.offload_optimizer);
  }
  j["zero_optimization"]["offload_param"] = write_keys(offload_param_keys, zero_optimization.offload_param);
  if (zero_optimization.zenflow.enabled) {
    j["zero_optimization"]["zenflow"] = write_keys(zenflow_keys, zero_optimization.zenflow);
  }
  j["aio"] = write_keys(aio_keys, aio);
  j["pipeline"] = write_keys(pipeline_keys, pipeline);
  j["tensor_parallel"] = write_keys(tensor_parallel_keys, tensor_parallel);
  j["activation_checkpointing"] = write_keys(activation_checkpointing_keys, activation_checkpointing);
  return j;
}

} // namespace zero
