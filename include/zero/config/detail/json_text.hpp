#pragma once
/// \file
/// The JSON text of a config (or of any JSON file zero reads: checkpoint manifests, model
/// descriptions), read within bounds: at most `max_config_bytes`, nested at most `max_config_depth`
/// deep, `//` and `/* */` comments allowed, duplicate keys refused. Every refusal is a `config_error`
/// that names the file. Needs nothing of `zero::config`, so readers of other JSON files include it
/// alone.

#include "zero/core/detail/os_path.hpp"
#include "zero/config/detail/reader.hpp"
#include "zero/core/error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

namespace zero {

/// The largest config text `config::from_file` and `config::from_string` read (16 MiB). DeepSpeed
/// configs are a few kilobytes; the bound keeps a wrong path (a log, a device such as /dev/zero)
/// from being read until memory runs out.
inline constexpr std::size_t max_config_bytes = std::size_t{16} << 20;
/// The deepest nesting of arrays and objects a config may have (DeepSpeed's deepest is 4). Deeper
/// text is refused while it is parsed, before anything recursive (copying, printing) touches it.
inline constexpr int max_config_depth = 64;

namespace detail {

/// Strips nlohmann's "[json.exception.parse_error.101] " prefix.
inline std::string parse_error_text(const nlohmann::json::exception& e) {
  std::string s = e.what();
  if (auto close = s.find("] "); !s.empty() && s[0] == '[' && close != std::string::npos) {
    s.erase(0, close + 2);
  }
  return s;
}

/// Refuses a JSON value nested deeper than `max_config_depth`, walking it without recursion (a
/// value built by the caller may be as deep as memory allows).
inline void check_depth(const json& root, std::string_view source) {
  std::vector<std::pair<const json*, int>> todo{{&root, 1}};
  while (!todo.empty()) {
    const auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) {
      continue;
    }
    if (depth > max_config_depth) {
      throw config_error(
          printable(cat("arrays and objects nested ", std::to_string(depth), " deep; expected at most ",
                        std::to_string(max_config_depth), " (zero::max_config_depth)", in_source(source))));
    }
    for (const json& child : *v) {
      todo.emplace_back(&child, depth + 1);
    }
  }
}

/// Parses JSON text with comments allowed, refusing duplicate keys (DeepSpeed refuses them too),
/// text longer than `max_config_bytes` and nesting deeper than `max_config_depth`.
inline json parse_text(std::string_view text, std::string_view source) {
  const std::string where = in_source(source);
  if (text.size() > max_config_bytes) {
    throw config_error(printable(cat("the config is ", std::to_string(text.size()), " bytes; expected at most ",
                                     std::to_string(max_config_bytes), " (zero::max_config_bytes)", where)));
  }
  struct level {
    bool object = false;
    std::set<std::string> keys;
    std::string key;
  };
  std::vector<level> stack;
  // The path of the innermost container: the keys that lead to it.
  auto path = [&] {
    std::string p;
    for (std::size_t i = 0; i + 1 < stack.size(); ++i) {
      if (stack[i].object) {
        p = join_path(p, stack[i].key);
      } else {
        p += "[]";
      }
    }
    return p;
  };
  // Refused as soon as it opens, so the parser never holds more than max_config_depth levels.
  auto push = [&](bool object) {
    if (stack.size() >= static_cast<std::size_t>(max_config_depth)) {
      // Named by the keys of the objects around it (the arrays in between would be 60 "[]"s).
      std::string keys;
      for (const level& l : stack) {
        if (l.object) {
          keys = join_path(keys, l.key);
        }
      }
      throw config_error(printable(cat(keys, (keys.empty() ? "" : ": "), "arrays and objects nested deeper than ",
                                       std::to_string(max_config_depth), " (zero::max_config_depth)", where)));
    }
    stack.push_back(level{object, {}, {}});
  };
  auto callback = [&](int, json::parse_event_t event, json& parsed) {
    switch (event) {
    case json::parse_event_t::object_start:
      push(true);
      break;
    case json::parse_event_t::array_start:
      push(false);
      break;
    case json::parse_event_t::object_end:
    case json::parse_event_t::array_end:
      if (!stack.empty()) {
        stack.pop_back();
      }
      break;
    case json::parse_event_t::key: {
      level& l = stack.back();
      std::string k = parsed.get<std::string>();
      if (!l.keys.insert(k).second) {
        const std::string parent = path();
        l.key = k;
        throw config_error(printable(join_path(parent, k) + ": duplicate key; give each key once" + where));
      }
      l.key = std::move(k);
      break;
    }
    case json::parse_event_t::value:
      break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw config_error(printable(cat("not valid JSON: ", parse_error_text(e), where)));
  } catch (const json::out_of_range& e) {
    // A number too large for a double, e.g. 1e400.
    throw config_error(printable(cat("not valid JSON for DeepSpeed: ", parse_error_text(e), where)));
  }
}

/// What a path that is not a regular file is, for messages; empty for a regular file or a pipe,
/// which are read (a pipe up to the size bound).
inline std::string_view unreadable_kind(std::filesystem::file_type t) {
  switch (t) {
  case std::filesystem::file_type::directory:
    return "a folder";
  case std::filesystem::file_type::character:
    return "a character device";
  case std::filesystem::file_type::block:
    return "a block device";
  case std::filesystem::file_type::socket:
    return "a socket";
  case std::filesystem::file_type::regular:
  case std::filesystem::file_type::fifo:
    return {};
  default:
    return "not a regular file";
  }
}

/// The text of a config file: a regular file or a pipe, at most `max_config_bytes`.
/// \param what how messages call the file ("config file", "model description").
/// \throws config_error naming the file and what is wrong with it.
inline std::string read_config_text(const std::filesystem::path& path, std::string_view what = "config file") {
  check_os_path<config_error>(what, path.native());
  const std::string name = path.string();
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || st.type() == std::filesystem::file_type::not_found) {
    const int err = ec ? ec.value() : ENOENT;
    throw config_error(printable(cat("cannot read ", std::string(what), " ", name, ": ", std::strerror(err))), err);
  }
  if (auto kind = unreadable_kind(st.type()); !kind.empty()) {
    throw config_error(printable(
        cat("cannot read ", std::string(what), " ", name, ": it is ", std::string(kind), "; expected a JSON file")));
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    const int err = errno;
    throw config_error(printable(cat("cannot read ", std::string(what), " ", name, ": ", std::strerror(err))), err);
  }
  // Read one byte past the bound, so a longer file (or a pipe that keeps writing) is refused without
  // reading the rest of it.
  std::string text(max_config_bytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (f.bad()) {
    throw config_error(printable(cat("cannot read ", std::string(what), " ", name)));
  }
  text.resize(static_cast<std::size_t>(f.gcount()));
  if (text.size() > max_config_bytes) {
    throw config_error(printable(cat("cannot read ", std::string(what), " ", name, ": it is larger than ",
                                     std::to_string(max_config_bytes), " bytes (zero::max_config_bytes)")));
  }
  return text;
}

} // namespace detail
} // namespace zero
