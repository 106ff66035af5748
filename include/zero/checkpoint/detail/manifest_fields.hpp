#pragma once
/// \file
/// What manifest.hpp parses with: 64-bit hashes as hex text, and `detail::fields`, the checked reader
/// of one JSON object's fields that names the source and the path in every error.

#include "zero/config/detail/reader.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace zero::checkpoint {

/// `v` as 16 lowercase hex digits.
[[nodiscard]] inline std::string hex64(std::uint64_t v) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i) {
    s[static_cast<std::size_t>(i)] = digits[v & 0xfu];
    v >>= 4;
  }
  return s;
}

/// The value of exactly 16 lowercase hex digits, or nothing for any other text.
[[nodiscard]] inline std::optional<std::uint64_t> parse_hex64(std::string_view s) {
  if (s.size() != 16) {
    return std::nullopt;
  }
  std::uint64_t v = 0;
  for (char c : s) {
    int d = -1;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    }
    if (d < 0) {
      return std::nullopt;
    }
    v = v << 4 | static_cast<std::uint64_t>(d);
  }
  return v;
}

namespace detail {

using zero::detail::cat;
using json = nlohmann::json;

/// Reads the fields of one JSON object, naming the source and the path in every error.
class fields {
public:
  fields(const json& j, const std::string& source, std::string path) : j_(j), source_(source), path_(std::move(path)) {
    if (!j.is_object()) {
      fail("", cat("expected an object, found ", zero::detail::kind_of(j)));
    }
  }

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    std::string where = path_;
    if (!key.empty()) {
      where = zero::detail::join_path(path_, key);
    }
    throw checkpoint_error(cat(source_, ": ", where.empty() ? "manifest" : where, ": ", what));
  }

  const json& at(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end()) {
      fail(key, "missing");
    }
    return *it;
  }
  /// True when the object has `key` (for the fields a manifest may leave out).
  [[nodiscard]] bool has(std::string_view key) const { return j_.contains(key); }
  std::string str(std::string_view key) const {
    const json& v = at(key);
    if (!v.is_string()) {
      fail(key, cat("expected a string, found ", zero::detail::kind_of(v)));
    }
    return v.get<std::string>();
  }
  std::int64_t integer(std::string_view key, std::int64_t lo, std::int64_t hi) const {
    const json& v = at(key);
    if (!v.is_number_integer()) {
      fail(key, cat("expected an integer, found ", zero::detail::kind_of(v)));
    }
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(hi)) {
      fail(key, cat("found ", zero::detail::show(v), ", expected at most ", std::to_string(hi)));
    }
    const auto x = v.get<std::int64_t>();
    if (x < lo || x > hi) {
      fail(key, cat("found ", std::to_string(x), ", expected a value in [", std::to_string(lo), ", ",
                    std::to_string(hi), "]"));
    }
    return x;
  }
  std::uint64_t count(std::string_view key, std::uint64_t hi) const {
    return static_cast<std::uint64_t>(integer(key, 0, static_cast<std::int64_t>(hi)));
  }
  double number(std::string_view key) const {
    const json& v = at(key);
    if (!v.is_number()) {
      fail(key, cat("expected a number, found ", zero::detail::kind_of(v)));
    }
    return v.get<double>();
  }
  bool boolean(std::string_view key) const {
    const json& v = at(key);
    if (!v.is_boolean()) {
      fail(key, cat("expected true or false, found ", zero::detail::kind_of(v)));
    }
    return v.get<bool>();
  }
  const json& array(std::string_view key) const {
    const json& v = at(key);
    if (!v.is_array()) {
      fail(key, cat("expected an array, found ", zero::detail::kind_of(v)));
    }
    return v;
  }
  std::uint64_t hash(std::string_view key) const {
    const std::string s = str(key);
    const auto v = parse_hex64(s);
    if (!v) {
      fail(key, cat("found \"", s.substr(0, 40), "\", expected 16 lowercase hex digits"));
    }
    return *v;
  }
  dtype type(std::string_view key) const {
    const std::string s = str(key);
    if (s == "fp32") {
      return dtype::f32;
    }
    if (s == "fp16") {
      return dtype::f16;
    }
    if (s == "bf16") {
      return dtype::bf16;
    }
    fail(key, cat("found \"", s.substr(0, 40), "\", expected \"fp32\", \"fp16\" or \"bf16\""));
  }
  const std::string& path() const noexcept { return path_; }
  /// The manifest named in messages.
  const std::string& source() const noexcept { return source_; }

private:
  const json& j_;
  const std::string& source_;
  std::string path_;
};

} // namespace detail

} // namespace zero::checkpoint
