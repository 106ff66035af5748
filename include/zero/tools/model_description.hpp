#pragma once
/// \file
/// What `zero-estimate` reads about a model: a description file listing modules and their parameter
/// shapes (`read_model_description`), and counts written as "7e9" or "6.7B" (`parse_count`). Needs
/// nlohmann-json.

#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::tools {

using zero::detail::cat;

// ---- model descriptions --------------------------------------------------------------------------

/// One module of a model description, as written.
struct described_module {
  std::string name;                 ///< its "name" (or "modules[i]")
  std::int64_t repeat = 1;          ///< how many times it occurs
  std::vector<std::int64_t> params; ///< elements of each of its parameters, in file order
};

/// Parameter counts read from a model description.
struct model_summary {
  std::string name;                      ///< "name" of the description, if any
  std::int64_t params = 0;               ///< parameters over all modules
  std::int64_t largest_layer_params = 0; ///< parameters of the largest module
  std::string largest_layer;             ///< its name
  std::int64_t modules = 0;              ///< modules, repeats counted
  std::int64_t largest_param = 0;        ///< elements of the largest single parameter
  /// Elements of each parameter and how many times it occurs (its module's repeat), in file order.
  std::vector<std::pair<std::int64_t, std::int64_t>> param_counts;
  /// The modules in file order, each with its parameters (`padded_sizes_of` lays them out as the engine does).
  std::vector<described_module> module_list;

  /// Parameters (elements, repeats counted) of the parameters smaller than `threshold` elements: the
  /// ones stage 3 keeps whole (`stage3_param_persistence_threshold`).
  [[nodiscard]] std::int64_t params_below(std::int64_t threshold) const noexcept {
    std::int64_t n = 0;
    for (const auto& [count, repeat] : param_counts) {
      n += count < threshold ? count * repeat : 0;
    }
    return n;
  }
};

/// Reads a model description:
///
///     {"name": "gpt-small",
///      "modules": [{"name": "embed", "params": [{"name": "weight", "shape": [50257, 768]}]},
///                  {"name": "block", "repeat": 12, "params": [{"name": "qkv", "shape": [2304, 768]}, ...]}]}
///
/// A module's parameters are gathered together at stage 3, so the largest module bounds stage 3's
/// working set. `repeat` (default 1) counts a module that many times. Every key is checked.
/// \throws config_error naming the JSON path of anything missing, unknown or out of range.
[[nodiscard]] inline model_summary read_model_description(const nlohmann::json& j, std::string_view source = {}) {
  using json = nlohmann::json;
  zero::detail::parse_context ctx;
  ctx.source = std::string(source);
  static constexpr std::string_view top_keys[] = {"name", "modules"};
  static constexpr std::string_view module_keys[] = {"name", "repeat", "params"};
  static constexpr std::string_view param_keys[] = {"name", "shape"};
  static constexpr std::int64_t max_count = std::numeric_limits<std::int64_t>::max() / 4;
  if (!j.is_object()) {
    ctx.fail("", cat("found ", zero::detail::show(j), "; a model description is a JSON object with \"modules\""));
  }
  model_summary m;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(std::begin(top_keys), std::end(top_keys), it.key()) == std::end(top_keys)) {
      auto near = zero::detail::closest_match(it.key(), top_keys);
      ctx.fail(it.key(), std::string("unknown key") +
                             (near.empty() ? "" : cat(" (did you mean \"", std::string(near), "\"?)")) +
                             "; keys: name, modules");
    }
  }
  if (auto it = j.find("name"); it != j.end()) {
    m.name = zero::detail::as_string(ctx, "name", *it);
  }
  auto mods = j.find("modules");
  if (mods == j.end() || !mods->is_array() || mods->empty()) {
    ctx.fail("modules", mods == j.end()
                            ? "missing; expected an array of modules"
                            : cat("found ", zero::detail::show(*mods), "; expected a non-empty array of modules"));
  }
  auto checked_mul = [&](std::string_view path, std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r) || r > max_count) {
      ctx.fail(path, "the parameter count overflows");
    }
    return r;
  };
  for (std::size_t i = 0; i < mods->size(); ++i) {
    const std::string mp = cat("modules[", std::to_string(i), "]");
    const json& mod = (*mods)[i];
    if (!mod.is_object()) {
      ctx.fail(mp, cat("found ", zero::detail::show(mod), "; expected an object {\"name\", \"params\"}"));
    }
    for (auto it = mod.begin(); it != mod.end(); ++it) {
      if (std::find(std::begin(module_keys), std::end(module_keys), it.key()) == std::end(module_keys)) {
        auto near = zero::detail::closest_match(it.key(), module_keys);
        ctx.fail(mp + "." + it.key(), std::string("unknown key") +
                                          (near.empty() ? "" : cat(" (did you mean \"", std::string(near), "\"?)")) +
                                          "; keys: name, repeat, params");
      }
    }
    std::string name = mp;
    if (auto it = mod.find("name"); it != mod.end()) {
      name = zero::detail::as_string(ctx, mp + ".name", *it);
    }
    std::int64_t repeat = 1;
    if (auto it = mod.find("repeat"); it != mod.end()) {
      repeat = zero::detail::as_int(ctx, mp + ".repeat", *it, 1, 1'000'000);
    }
    auto params = mod.find("params");
    if (params == mod.end() || !params->is_array()) {
      ctx.fail(mp + ".params", params == mod.end() ? "missing; expected an array of {\"name\", \"shape\"}"
                                                   : cat("found ", zero::detail::show(*params), "; expected an array"));
    }
    std::int64_t module_params = 0;
    described_module listed{.name = name, .repeat = repeat, .params = {}};
    for (std::size_t k = 0; k < params->size(); ++k) {
      const std::string pp = mp + ".params[" + std::to_string(k) + "]";
      const json& prm = (*params)[k];
      if (!prm.is_object()) {
        ctx.fail(pp, cat("found ", zero::detail::show(prm), "; expected an object {\"name\", \"shape\"}"));
      }
      for (auto it = prm.begin(); it != prm.end(); ++it) {
        if (std::find(std::begin(param_keys), std::end(param_keys), it.key()) == std::end(param_keys)) {
          auto near = zero::detail::closest_match(it.key(), param_keys);
          ctx.fail(pp + "." + it.key(), std::string("unknown key") +
                                            (near.empty() ? "" : cat(" (did you mean \"", std::string(near), "\"?)")) +
                                            "; keys: name, shape");
        }
      }
      if (auto it = prm.find("name"); it != prm.end()) {
        static_cast<void>(zero::detail::as_string(ctx, pp + ".name", *it));
      }
      auto shape = prm.find("shape");
      if (shape == prm.end() || !shape->is_array()) {
        ctx.fail(pp + ".shape", shape == prm.end() ? "missing; expected an array of dimensions, e.g. [4096, 4096]"
                                                   : cat("found ", zero::detail::show(*shape), "; expected an array"));
      }
      std::int64_t count = 1;
      for (std::size_t d = 0; d < shape->size(); ++d) {
        const std::string dp = pp + ".shape[" + std::to_string(d) + "]";
        count = checked_mul(dp, count,
                            zero::detail::as_int(ctx, dp, (*shape)[d], 1, std::numeric_limits<std::int64_t>::max()));
      }
      module_params += count;
      m.largest_param = std::max(m.largest_param, count);
      m.param_counts.emplace_back(count, repeat);
      listed.params.push_back(count);
      if (module_params > max_count) {
        ctx.fail(pp, "the parameter count overflows");
      }
    }
    m.params += checked_mul(mp, module_params, repeat);
    if (m.params > max_count) {
      ctx.fail(mp, "the parameter count overflows");
    }
    m.modules += repeat;
    m.module_list.push_back(std::move(listed));
    if (module_params > m.largest_layer_params) {
      m.largest_layer_params = module_params;
      m.largest_layer = name;
    }
  }
  if (m.params == 0) {
    ctx.fail("modules", "the modules hold no parameters");
  }
  return m;
}

/// Reads a model description file (see `read_model_description`).
/// \throws config_error when the file cannot be read (as a config file: bounded size and depth), is not
///         JSON, or does not describe a model.
[[nodiscard]] inline model_summary read_model_description_file(const std::filesystem::path& path) {
  return read_model_description(
      zero::detail::parse_text(zero::detail::read_config_text(path, "model description"), path.string()),
      path.string());
}

namespace detail {
/// The number `text` spells in full (std::stod's syntax: "7e9", "1.5", "nan"), or nothing when it
/// is empty or has anything after the number.
[[nodiscard]] inline std::optional<double> whole_number_text(const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return used == text.size() ? std::optional<double>(v) : std::nullopt;
}
} // namespace detail

/// Parses a count such as "7e9", "7000000000", "6.7B", "125M", "1.5T" or "350k".
/// \throws usage_error for anything else, or a count that is not a whole number >= 1.
[[nodiscard]] inline std::int64_t parse_count(std::string_view text) {
  std::string s(text);
  double scale = 1;
  if (!s.empty()) {
    switch (s.back()) {
    case 'k':
    case 'K':
      scale = 1e3;
      break;
    case 'm':
    case 'M':
      scale = 1e6;
      break;
    case 'b':
    case 'B':
    case 'g':
    case 'G':
      scale = 1e9;
      break;
    case 't':
    case 'T':
      scale = 1e12;
      break;
    default:
      break;
    }
    if (scale != 1) {
      s.pop_back();
    }
  }
  const std::optional<double> parsed = detail::whole_number_text(s);
  const double v = parsed.value_or(0);
  // With a suffix, 6.7B is 6.7 * 1e9 rounded (the product is not exact in binary); without one the
  // number itself must be whole.
  const double count = scale != 1 ? std::round(v * scale) : v;
  if (!parsed || !(count >= 1) || count >= 9.2e18 || count != std::floor(count)) {
    throw usage_error(cat("\"", std::string(text),
                          "\" is not a count: expected a whole number >= 1 such as 7e9, "
                          "7000000000, 6.7B, 125M or 350k"));
  }
  return static_cast<std::int64_t>(count);
}

} // namespace zero::tools
