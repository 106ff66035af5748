#pragma once
/// @file gpt_describe.hpp
/// The model description of a GPT (what `zero-estimate --model FILE` reads, zero/tools/model_description.hpp):
/// the modules gpt_engine.hpp registers, in its order, each with its parameters' names and shapes. `zero-gpt
/// --describe FILE` writes it, so the estimate's memory per rank can be put beside the engine's measured one
/// (docs/gpt.md, ctest example.gpt.estimate_*).

#include "gpt_model.hpp"

#include <cstddef>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace gpt {

/// The model description of `cfg`'s GPT: {"name", "modules": [{"name", "params": [{"name", "shape"}]}]}, one
/// module per unit stage 3 gathers, as `zero_gpt` registers them: "embed" (wte, wpe), "h.<l>" (block l's 12
/// tensors) and "ln_f". Built from `parameters(cfg)`, the list `zero_gpt` registers, by the same rule (a
/// parameter's `block`: below 0 embed, below `layers` its block, else ln_f).
/// @throws std::invalid_argument when `cfg` does not validate.
[[nodiscard]] inline nlohmann::json describe(const model_config& cfg) {
  const auto specs = parameters(cfg); // validates cfg first
  nlohmann::json modules = nlohmann::json::array();
  modules.push_back({{"name", "embed"}, {"params", nlohmann::json::array()}});
  for (int l = 0; l < cfg.layers; ++l) {
    modules.push_back({{"name", "h." + std::to_string(l)}, {"params", nlohmann::json::array()}});
  }
  modules.push_back({{"name", "ln_f"}, {"params", nlohmann::json::array()}});
  for (const auto& s : specs) {
    const std::size_t m = s.block < 0            ? 0
                          : s.block < cfg.layers ? static_cast<std::size_t>(s.block) + 1
                                                 : modules.size() - 1;
    modules[m]["params"].push_back({{"name", s.name}, {"shape", s.shape}});
  }
  return {{"name", "zero-gpt vocab " + std::to_string(cfg.vocab) + ", seq " + std::to_string(cfg.seq) + ", " +
                       std::to_string(cfg.layers) + " layers, " + std::to_string(cfg.heads) + " heads, d_model " +
                       std::to_string(cfg.d_model)},
          {"modules", modules}};
}

/// Writes `j` to `path`, indented, with a final newline (a model description, or the config of a run).
/// @throws std::runtime_error naming `path` when it cannot be written.
inline void write_json_file(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.flush();
  if (!out) {
    throw std::runtime_error(path + ": cannot be written");
  }
}

} // namespace gpt
