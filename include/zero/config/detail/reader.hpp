#pragma once
/// \file
/// The strict JSON reader behind `zero::config`: JSON paths, typed access, "did you mean", the
/// wrong-block check (over the blocks the config reader names in `parse_context::elsewhere`) and the
/// unimplemented-feature table, all producing `config_error`s that say where, what was found and
/// what is allowed.

#include "zero/config/detail/edit_distance.hpp"
#include "zero/config/unimplemented.hpp"
#include "zero/core/detail/os_path.hpp"
#include "zero/core/detail/printable.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::detail {

using json = nlohmann::json;

/// `parent.key`, or `key` at the top level.
inline std::string join_path(std::string_view parent, std::string_view key) {
  std::string out(parent);
  if (!out.empty()) {
    out += '.';
  }
  out += key;
  return out;
}

/// A non-finite number by name (NaN, Infinity, -Infinity), which JSON cannot write; empty for others.
inline std::string_view non_finite_name(double v) {
  if (std::isnan(v)) {
    return "NaN";
  }
  if (std::isinf(v)) {
    return v > 0 ? "Infinity" : "-Infinity";
  }
  return {};
}

/// A JSON value as it appears in a message, shortened to one line. NaN and infinities (which can
/// come from outside values such as `config_inputs::lr`) are named, not written as JSON's null.
inline std::string show(const json& v) {
  if (v.is_number_float()) {
    if (auto name = non_finite_name(v.get<double>()); !name.empty()) {
      return std::string(name);
    }
  }
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) {
    s = s.substr(0, 77) + "...";
  }
  return s;
}

/// "a string", "an integer", ... for type mismatches.
inline std::string_view kind_of(const json& v) {
  switch (v.type()) {
  case json::value_t::null:
    return "null";
  case json::value_t::boolean:
    return "a boolean";
  case json::value_t::number_integer:
  case json::value_t::number_unsigned:
    return "an integer";
  case json::value_t::number_float:
    return "a number";
  case json::value_t::string:
    return "a string";
  case json::value_t::array:
    return "an array";
  case json::value_t::object:
    return "an object";
  default:
    return "a value";
  }
}

/// A number as messages print it: integers without a fraction, others in shortest form.
inline std::string show_number(double v) {
  if (auto name = non_finite_name(v); !name.empty()) {
    return std::string(name);
  }
  if (v == std::floor(v) && std::fabs(v) < 1e18) {
    return std::to_string(static_cast<long long>(v));
  }
  return json(v).dump();
}

/// Hugging Face's placeholder.
inline bool is_auto(const json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

/// " (in <source>)", or nothing for an unnamed source.
inline std::string in_source(std::string_view source) {
  return source.empty() ? std::string() : cat(" (in ", std::string(source), ")");
}

/// Parse state: where the config came from, and the notes collected so far.
struct parse_context {
  std::string source;             ///< file name or caller's label; empty for none
  std::vector<std::string> notes; ///< accepted-but-without-effect settings
  /// The other places a key of this name is read, as JSON paths, for "belongs in" hints about a key
  /// in the wrong block; null (no hints) outside the config reader, which knows its blocks.
  std::vector<std::string> (*elsewhere)(std::string_view block, std::string_view key) = nullptr;

  /// Throws the config_error for `path`.
  [[noreturn]] void fail(std::string_view path, const std::string& what) const {
    std::string msg = path.empty() ? std::string("(top level)") : std::string(path);
    msg += ": ";
    msg += what;
    msg += in_source(source);
    throw config_error(printable(msg));
  }
  /// Records that `path` is accepted but has no effect, or was read under another name.
  void note(std::string_view path, const std::string& what) { notes.push_back(std::string(path) + ": " + what); }
};

/// What "auto" may not be used for; appended to type errors that found "auto".
inline std::string auto_hint(const json& v) {
  return is_auto(v) ? "; \"auto\" is resolved only where Hugging Face writes it (see docs/config.md), write a value"
                    : "";
}

/// Reads a boolean.
/// \throws config_error unless `v` is true or false.
inline bool as_bool(const parse_context& ctx, std::string_view path, const json& v) {
  if (!v.is_boolean()) {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected true or false", auto_hint(v)));
  }
  return v.get<bool>();
}

/// Reads an integer in [lo, hi]. Whole numbers written as floats (5e8, 1e14, 2.0) are integers.
/// \throws config_error for another type, a fraction, or a value out of range.
inline std::int64_t as_int(const parse_context& ctx, std::string_view path, const json& v, std::int64_t lo,
                           std::int64_t hi) {
  auto range = [&] {
    if (hi == std::numeric_limits<std::int64_t>::max()) {
      return cat("an integer >= ", std::to_string(lo));
    }
    return cat("an integer from ", std::to_string(lo), " to ", std::to_string(hi));
  };
  std::int64_t out = 0;
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    out = v.get<std::int64_t>();
  } else if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      ctx.fail(path, cat("found ", show(v), "; expected ", range()));
    }
    out = static_cast<std::int64_t>(u);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || d != std::floor(d)) {
      ctx.fail(path, cat("found ", show(v), "; expected ", range(), " (a whole number; 5e8 is fine, 2.5 is not)"));
    }
    // 2^63 is the first double past int64's range.
    if (d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
      ctx.fail(path, cat("found ", show(v), "; expected ", range()));
    }
    out = static_cast<std::int64_t>(d);
  } else {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected ", range(), auto_hint(v)));
  }
  if (out < lo || out > hi) {
    ctx.fail(path, cat("found ", show(v), "; expected ", range()));
  }
  return out;
}

/// The bounds of a number as messages state them, e.g. " >= 0 and < 1"; empty for none (a bound at
/// the largest double is none).
inline std::string number_range(double lo, double hi, bool lo_open, bool hi_open) {
  const bool has_lo = lo > -std::numeric_limits<double>::max();
  const bool has_hi = hi < std::numeric_limits<double>::max();
  if (has_lo && has_hi) {
    return std::string(lo_open ? " > " : " >= ") + show_number(lo) + " and" + (hi_open ? " < " : " <= ") +
           show_number(hi);
  }
  if (has_lo) {
    return std::string(lo_open ? " > " : " >= ") + show_number(lo);
  }
  if (has_hi) {
    return std::string(hi_open ? " < " : " <= ") + show_number(hi);
  }
  return {};
}

/// Reads a finite number in [lo, hi] (or (lo, hi] when `lo_open`, [lo, hi) when `hi_open`).
/// \throws config_error for another type or a value out of range.
inline double as_number(const parse_context& ctx, std::string_view path, const json& v, double lo, double hi,
                        bool lo_open = false, bool hi_open = false) {
  auto range = [&] { return "a number" + number_range(lo, hi, lo_open, hi_open); };
  if (!v.is_number()) {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected ", range(), auto_hint(v)));
  }
  const double d = v.get<double>();
  const bool below = lo_open ? !(d > lo) : !(d >= lo);
  const bool above = hi_open ? !(d < hi) : !(d <= hi);
  if (!std::isfinite(d) || below || above) {
    ctx.fail(path, cat("found ", show(v), "; expected ", range()));
  }
  return d;
}

/// Reads a string. A NUL character (JSON's "\u0000") is refused in any string: every string value
/// is a name or a path, and a path reaches the operating system as a C string cut at its first NUL
/// (`"/tmp/x/victim\u0000/y"` would open `/tmp/x/victim`).
/// \throws config_error for another type, or a string holding a NUL.
inline std::string as_string(const parse_context& ctx, std::string_view path, const json& v) {
  if (!v.is_string()) {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected a string"));
  }
  const auto& s = v.get_ref<const std::string&>();
  if (const std::size_t at = first_nul(s); at != std::string::npos) {
    ctx.fail(path, cat("found \"", printable(s), "\" with a NUL character (\\u0000) at byte ", std::to_string(at),
                       "; expected a string without NUL (as a path, the operating system would read \"",
                       printable(std::string_view(s).substr(0, at)), "\")"));
  }
  return s;
}

/// One accepted spelling of an enumerated value.
template <class E> struct choice {
  std::string_view name;
  E value;
};

/// Reads one of `choices` (compared case-insensitively when `ignore_case`).
/// \throws config_error listing the accepted names, with "did you mean" for a near miss.
template <class E>
E as_choice(const parse_context& ctx, std::string_view path, const json& v, std::span<const choice<E>> choices,
            bool ignore_case) {
  std::string allowed;
  std::vector<std::string_view> names;
  for (const auto& c : choices) {
    allowed += (allowed.empty() ? "\"" : ", \"") + std::string(c.name) + "\"";
    names.push_back(c.name);
  }
  if (!v.is_string()) {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected one of ", allowed));
  }
  const std::string& s = v.get_ref<const std::string&>();
  for (const auto& c : choices) {
    if (ignore_case ? ascii_lower(s) == ascii_lower(c.name) : s == c.name) {
      return c.value;
    }
  }
  std::string msg = cat("found ", show(v), "; expected one of ", allowed);
  if (is_auto(v)) {
    msg += "; \"auto\" is not resolved for this key, write one of them";
  } else if (auto near = closest_match(s, names); !near.empty()) {
    msg += cat("; did you mean \"", std::string(near), "\"?");
  }
  ctx.fail(path, msg);
}

/// Strings compare case-insensitively (DeepSpeed lower-cases device and optimizer names); other
/// values compare as JSON (1 == 1.0).
inline bool same_value(const json& a, const json& b) {
  if (a.is_string() && b.is_string()) {
    return ascii_lower(a.get_ref<const std::string&>()) == ascii_lower(b.get_ref<const std::string&>());
  }
  return a == b;
}

/// A block that asks for nothing: null, false, 0, "", empty, `"enabled": false` (or "auto", which
/// Hugging Face resolves to false for features it cannot turn on), or every member inactive.
inline bool is_inactive(const json& v) {
  switch (v.type()) {
  case json::value_t::null:
    return true;
  case json::value_t::boolean:
    return !v.get<bool>();
  case json::value_t::number_integer:
  case json::value_t::number_unsigned:
  case json::value_t::number_float:
    return v.get<double>() == 0.0;
  case json::value_t::string:
    return v.get_ref<const std::string&>().empty();
  case json::value_t::array:
    return v.empty();
  case json::value_t::object: {
    if (auto it = v.find("enabled"); it != v.end()) {
      return (it->is_boolean() && !it->get<bool>()) || is_auto(*it);
    }
    return std::all_of(v.begin(), v.end(), [](const json& m) { return is_inactive(m); });
  }
  default:
    return false;
  }
}

/// The table's name for a path: `bfloat16.*` is looked up as `bf16.*`.
inline std::string table_path(std::string_view path) {
  constexpr std::string_view old_name = "bfloat16";
  if (path.substr(0, old_name.size()) == old_name && (path.size() == old_name.size() || path[old_name.size()] == '.')) {
    return cat("bf16", std::string(path.substr(old_name.size())));
  }
  return std::string(path);
}

/// True when `path` is a key of `unimplemented_features`.
inline bool is_unimplemented_key(std::string_view path) {
  const std::string p = table_path(path);
  return std::any_of(std::begin(unimplemented_features), std::end(unimplemented_features),
                     [&](const unimplemented_feature& f) { return f.path == p; });
}

/// Refuses `v` at `path` when a row of `unimplemented_features` says it needs a missing feature.
/// \throws config_error naming the feature, its status and what is accepted instead.
inline void check_unimplemented(const parse_context& ctx, std::string_view path, const json& v) {
  const std::string p = table_path(path);
  for (const unimplemented_feature& row : unimplemented_features) {
    if (row.path != p) {
      continue;
    }
    bool hit = false;
    std::string accepted;
    const json operand = row.operand.empty() ? json() : json::parse(row.operand);
    switch (row.when) {
    case unimplemented_when::differs_from:
      hit = !same_value(v, operand);
      accepted = cat("only ", std::string(row.operand), " (DeepSpeed's default)");
      break;
    case unimplemented_when::equals:
      hit = same_value(v, operand);
      accepted = cat("any value but ", std::string(row.operand));
      break;
    case unimplemented_when::one_of:
      hit = std::any_of(operand.begin(), operand.end(), [&](const json& o) { return same_value(v, o); });
      accepted = cat("a value not in ", std::string(row.operand));
      break;
    case unimplemented_when::below:
      hit = v.is_number() && v.get<double>() < operand.get<double>();
      accepted = std::string(row.operand) + " or more";
      break;
    case unimplemented_when::active:
      hit = !is_inactive(v);
      accepted = "the block left out, or switched off (\"enabled\": false, or every value false/0/null)";
      break;
    }
    if (!row.accepted.empty()) {
      accepted = std::string(row.accepted);
    }
    if (hit) {
      ctx.fail(path, cat("found ", show(v), "; this needs ", std::string(row.feature),
                         ", which is not implemented in this version (", std::string(row.status),
                         "); accepted here: ", accepted));
    }
  }
}

/// Keys people put in a DeepSpeed config that DeepSpeed spells differently, with where they go.
inline std::string_view misplaced_key_hint(std::string_view key) {
  if (key == "max_grad_norm") {
    return "gradient_clipping (top level); of DeepSpeed's optimizers only Lamb takes max_grad_norm";
  }
  if (key == "zero_stage") {
    return "zero_optimization.stage";
  }
  if (key == "offload_optimizer_device") {
    return "zero_optimization.offload_optimizer.device";
  }
  if (key == "offload_param_device") {
    return "zero_optimization.offload_param.device";
  }
  return {};
}

/// Every place a key of this name is accepted, other than `block`: the config's blocks (through
/// `ctx.elsewhere`), then the keys of `unimplemented_features`.
inline std::vector<std::string> where_key_belongs(const parse_context& ctx, std::string_view block,
                                                  std::string_view key) {
  std::vector<std::string> out;
  if (ctx.elsewhere != nullptr) {
    out = ctx.elsewhere(block, key);
  }
  for (const unimplemented_feature& f : unimplemented_features) {
    const auto dot = f.path.rfind('.');
    const std::string_view parent = dot == std::string_view::npos ? std::string_view{} : f.path.substr(0, dot);
    const std::string_view last = dot == std::string_view::npos ? f.path : f.path.substr(dot + 1);
    if (last == key && parent != table_path(block) && std::find(out.begin(), out.end(), f.path) == out.end()) {
      out.emplace_back(f.path);
    }
  }
  return out;
}

/// The keys of `unimplemented_features` directly under `block`.
inline std::vector<std::string_view> unimplemented_keys_of(std::string_view block) {
  std::vector<std::string_view> out;
  const std::string b = table_path(block);
  for (const unimplemented_feature& f : unimplemented_features) {
    const auto dot = f.path.rfind('.');
    const std::string_view parent = dot == std::string_view::npos ? std::string_view{} : f.path.substr(0, dot);
    if (parent == b) {
      out.push_back(dot == std::string_view::npos ? f.path : f.path.substr(dot + 1));
    }
  }
  return out;
}

/// Reads one JSON object of the config. On construction it refuses unknown keys (with "did you
/// mean" and "belongs in") and keys whose value needs an unimplemented feature; then the parser
/// reads the known keys through `get`, and `finish` proves that none was left unread.
class object_reader {
public:
  /// \param ctx  parse state (source name, notes).
  /// \param obj  the object; the caller has checked that it is one.
  /// \param path its JSON path.
  /// \param keys the keys zero reads here; keys of `unimplemented_features` under `path` are also accepted.
  /// \throws config_error for the first unknown or refused key, in key order.
  object_reader(parse_context& ctx, const json& obj, std::string path, std::span<const std::string_view> keys)
      : ctx_(ctx), obj_(obj), path_(std::move(path)), keys_(keys) {
    const std::vector<std::string_view> table_keys = unimplemented_keys_of(path_);
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      const std::string& k = it.key();
      const bool known = std::find(keys_.begin(), keys_.end(), k) != keys_.end() ||
                         std::find(table_keys.begin(), table_keys.end(), k) != table_keys.end();
      if (!known) {
        unknown_key(k, table_keys);
      }
    }
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      check_unimplemented(ctx_, join_path(path_, it.key()), it.value());
    }
  }

  /// The value of `key`, or nullptr when absent. Marks the key as read.
  const json* get(std::string_view key) {
    auto it = obj_.find(std::string(key));
    if (it == obj_.end()) {
      return nullptr;
    }
    read_.emplace_back(key);
    return &*it;
  }
  /// True when the object has `key`.
  [[nodiscard]] bool has(std::string_view key) const { return obj_.contains(std::string(key)); }
  /// The JSON path of this object.
  [[nodiscard]] const std::string& path() const noexcept { return path_; }
  /// The JSON path of `key` in this object.
  [[nodiscard]] std::string path_of(std::string_view key) const { return join_path(path_, key); }
  /// The parse state.
  [[nodiscard]] parse_context& ctx() noexcept { return ctx_; }

  /// Checks that the parser read every schema key present. A key accepted but never read would be
  /// silently ignored, which is a bug in zero, not in the config.
  /// \throws std::logic_error naming the key.
  void finish() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      const std::string& k = it.key();
      const bool schema_key = std::find(keys_.begin(), keys_.end(), k) != keys_.end();
      if (schema_key && std::find(read_.begin(), read_.end(), k) == read_.end()) {
        throw std::logic_error(cat("zero::config: ", path_of(k), " was accepted but never read"));
      }
    }
  }

private:
  [[noreturn]] void unknown_key(const std::string& k, const std::vector<std::string_view>& table_keys) const {
    const std::string where = path_.empty() ? std::string("the top level") : path_;
    const std::string p = path_of(k);
    if (auto hint = misplaced_key_hint(k); !hint.empty()) {
      ctx_.fail(p, cat("not a DeepSpeed key here; use ", std::string(hint)));
    }
    if (auto elsewhere = where_key_belongs(ctx_, path_, k); !elsewhere.empty()) {
      std::string list;
      for (const auto& e : elsewhere) {
        list += (list.empty() ? "" : " or ") + e + (e.find('.') == std::string::npos ? " (at the top level)" : "");
      }
      ctx_.fail(p, cat("\"", k, "\" is not a key of ", where, "; it belongs in ", list));
    }
    std::vector<std::string_view> candidates(keys_.begin(), keys_.end());
    candidates.insert(candidates.end(), table_keys.begin(), table_keys.end());
    std::string msg = "unknown key";
    if (auto near = closest_match(k, candidates); !near.empty()) {
      msg += cat(" (did you mean \"", std::string(near), "\"?)");
    }
    std::string allowed;
    for (std::string_view key : keys_) {
      allowed += (allowed.empty() ? "" : ", ") + std::string(key);
    }
    msg += cat("; keys of ", where, ": ", allowed);
    if (!table_keys.empty()) {
      msg += " (and DeepSpeed keys this version refuses unless off; see docs/config.md)";
    }
    ctx_.fail(p, msg);
  }

  parse_context& ctx_;
  const json& obj_;
  std::string path_;
  std::span<const std::string_view> keys_;
  std::vector<std::string> read_;
};

/// The object at `v`, or a config_error saying an object was expected.
inline const json& expect_object(const parse_context& ctx, std::string_view path, const json& v) {
  if (!v.is_object()) {
    ctx.fail(path, cat("found ", show(v), " (", std::string(kind_of(v)), "); expected an object {...}", auto_hint(v)));
  }
  return v;
}

} // namespace zero::detail
