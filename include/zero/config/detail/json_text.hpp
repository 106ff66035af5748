#pragma once
/// \file
/// The JSON text of a config (or of any JSON file zero reads: checkpoint manifests, model
/// descriptions), read within bounds: at most `max_config_bytes`, nested at most `max_config_depth`
/// deep, `//` and `/* */` comments allowed, duplicate keys refused. Every refusal is a `config_error`
/// that names the file. Needs nothing of `zero::config`, so readers of other JSON files include it
/// alone.

#include "zero/config/detail/reader.hpp"
#include "zero/core/detail/os_path.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <poll.h>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unistd.h>
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
/// How long `config::from_file` waits for a pipe's writer to write (10 s): a FIFO nobody writes to is
/// an error naming it, not a hang.
inline constexpr std::chrono::milliseconds config_pipe_wait{10'000};

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

/// The text of a pipe (a FIFO, or `--config <(...)`'s /dev/fd/N), read up to `max_config_bytes`
/// while its writer writes. A pipe that nobody writes to for `wait` (a FIFO whose writer never came,
/// or stopped without closing it) is an error, not a hang: it is opened without blocking and each
/// read waits in poll(2) with that deadline.
/// \throws config_error naming the pipe, the bytes read so far and the wait.
inline std::string read_pipe_text(const std::filesystem::path& path, std::string_view what,
                                  std::chrono::milliseconds wait) {
  const std::string name = path.string();
  const auto fail = [&](const std::string& why, int err = 0) {
    throw config_error(printable(cat("cannot read ", std::string(what), " ", name, ": ", why)), err);
  };
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    fail(std::strerror(err), err);
  }
  const struct closer {
    int fd;
    ~closer() { ::close(fd); }
  } close_at_exit{fd};
  std::string text;
  std::vector<char> chunk(std::size_t{64} << 10);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(wait.count(), 1 << 30)));
    if (ready < 0 && errno == EINTR) {
      continue;
    }
    if (ready < 0) {
      const int err = errno;
      fail(cat("poll: ", std::strerror(err)), err);
    }
    if (ready == 0) {
      fail(cat("it is a pipe and nothing was written to it for ", std::to_string(wait.count()), " ms (",
               std::to_string(text.size()),
               " bytes read before); expected a writer that writes the JSON and "
               "closes the pipe"),
           ETIMEDOUT);
    }
    const ssize_t n = ::read(fd, chunk.data(), chunk.size());
    if (n > 0) {
      text.append(chunk.data(), static_cast<std::size_t>(n));
      if (text.size() > max_config_bytes) {
        fail(cat("it is larger than ", std::to_string(max_config_bytes), " bytes (zero::max_config_bytes)"));
      }
    } else if (n == 0) {
      return text; // the writer closed it
    } else if (errno != EAGAIN && errno != EINTR) {
      const int err = errno;
      fail(std::strerror(err), err);
    }
  }
}

/// The text of a config file: a regular file or a pipe (`read_pipe_text`), at most `max_config_bytes`.
/// \param what how messages call the file ("config file", "model description").
/// \param pipe_wait how long a pipe may stay silent (`config_pipe_wait`).
/// \throws config_error naming the file and what is wrong with it.
inline std::string read_config_text(const std::filesystem::path& path, std::string_view what = "config file",
                                    std::chrono::milliseconds pipe_wait = config_pipe_wait) {
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
  if (st.type() == std::filesystem::file_type::fifo) {
    return read_pipe_text(path, what, pipe_wait);
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
