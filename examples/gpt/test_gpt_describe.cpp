// gpt_describe.hpp: the model description zero-gpt --describe writes lists exactly what zero_gpt registers with the
// engine (its modules in order, each with its parameters' names and shapes in order), and zero-estimate reads it as
// the model's parameters and largest module.

#include "gpt_describe.hpp"
#include "gpt_engine.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <zero/config/config.hpp>
#include <zero/tools/model_description.hpp>

namespace {

/// What zero_gpt's constructor calls on an engine, recorded as a model description.
struct recording_engine {
  zero::config config = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1})", {.world_size = 1});
  nlohmann::json modules = nlohmann::json::array();
  std::size_t params = 0;

  [[nodiscard]] const zero::config& cfg() const noexcept { return config; }
  int add_module(const std::string& name) {
    modules.push_back({{"name", name}, {"params", nlohmann::json::array()}});
    return static_cast<int>(modules.size()) - 1;
  }
  zero::param_handle add_param(int m, const std::string& name, const std::vector<std::int64_t>& shape,
                               const zero::param_options&) {
    modules.at(static_cast<std::size_t>(m))["params"].push_back({{"name", name}, {"shape", shape}});
    return zero::param_handle{params++};
  }
};

} // namespace

TEST_CASE("describe lists the modules and shapes zero_gpt registers, and zero-estimate reads it") {
  for (const gpt::model_config cfg :
       {gpt::model_config{}, gpt::model_config{.vocab = 50257, .seq = 16, .layers = 3, .heads = 4, .d_model = 48}}) {
    CAPTURE(cfg.vocab);
    CAPTURE(cfg.layers);
    recording_engine eng;
    const gpt::zero_gpt<recording_engine> model(eng, cfg, 1);
    const auto described = gpt::describe(cfg);
    CHECK(described.at("modules") == eng.modules);
    REQUIRE(described.at("modules").size() == static_cast<std::size_t>(cfg.layers) + 2);
    CHECK(described["modules"][1].at("name") == "h.0");
    CHECK(described["modules"][1].at("params").size() == static_cast<std::size_t>(gpt::block_tensor_count));

    const auto read = zero::tools::read_model_description(described, "gpt::describe");
    std::int64_t params = 0;
    for (const auto& s : gpt::parameters(cfg)) {
      params += s.numel();
    }
    CHECK(read.params == params);
    CHECK(read.modules == cfg.layers + 2);
    CHECK(read.module_list.size() == static_cast<std::size_t>(cfg.layers) + 2);
    // The largest module (stage 3's working set): a block, 12 C^2 + 13 C, for the default model; embed, V C + T C,
    // for GPT-2's vocabulary.
    const std::int64_t c = cfg.d_model;
    const std::int64_t embed = static_cast<std::int64_t>(cfg.vocab + cfg.seq) * c;
    const std::int64_t block = 12 * c * c + 13 * c;
    CHECK(read.largest_layer == (embed > block ? "embed" : "h.0"));
    CHECK(read.largest_layer_params == std::max(embed, block));
  }
  CHECK_THROWS_AS(static_cast<void>(gpt::describe({.heads = 3})), std::invalid_argument);
}
