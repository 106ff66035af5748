#pragma once
/// \file
/// The safetensors format's vocabulary, shared by `safetensors::writer` and `safetensors::reader`: what a
/// tensor is (`tensor_decl` to write, `tensor_info` as a header describes it), the limits a reader
/// enforces, the dtype names, and the POSIX helpers both use (see zero/io/safetensors.hpp).

#include "zero/core/dtype.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace zero::safetensors {

/// A tensor a `writer` is asked to store: its name, element type and shape (row-major).
struct tensor_decl {
  std::string name;                    ///< unique, non-empty, not "__metadata__", valid UTF-8
  zero::dtype type = zero::dtype::f32; ///< element type
  std::vector<std::int64_t> shape;     ///< extents, each >= 0; empty for a scalar
};

/// A tensor as a file's header describes it.
struct tensor_info {
  std::string name;                    ///< the tensor's name
  zero::dtype type = zero::dtype::f32; ///< element type
  std::vector<std::int64_t> shape;     ///< extents, each >= 0; empty for a scalar
  std::uint64_t begin = 0;             ///< first byte within the data section
  std::uint64_t end = 0;               ///< one past the last byte within the data section

  /// Bytes the tensor occupies: `end - begin`.
  [[nodiscard]] std::uint64_t size() const noexcept { return end - begin; }
};

/// The largest header `reader` accepts, as the reference implementation does: 100 MB.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
/// The most dimensions a shape may have in a file `reader` accepts (numpy's limit).
inline constexpr std::size_t max_rank = 64;

namespace detail {

/// The safetensors name of a zero dtype ("F32", "F16", "BF16", "F64", "I32", "I64", "U8").
[[nodiscard]] constexpr std::string_view format_name(zero::dtype t) noexcept {
  switch (t) {
  case zero::dtype::f32:
    return "F32";
  case zero::dtype::f16:
    return "F16";
  case zero::dtype::bf16:
    return "BF16";
  case zero::dtype::f64:
    return "F64";
  case zero::dtype::i32:
    return "I32";
  case zero::dtype::i64:
    return "I64";
  case zero::dtype::u8:
    return "U8";
  }
  return "?";
}

/// The zero dtype of a safetensors dtype name, or nothing when zero does not support it.
[[nodiscard]] inline std::optional<zero::dtype> parse_format_name(std::string_view s) noexcept {
  for (zero::dtype t : {zero::dtype::f32, zero::dtype::f16, zero::dtype::bf16, zero::dtype::f64, zero::dtype::i32,
                        zero::dtype::i64, zero::dtype::u8}) {
    if (s == format_name(t)) {
      return t;
    }
  }
  return std::nullopt;
}

/// The dtype names `reader` accepts, for messages.
inline constexpr std::string_view supported_dtypes = "F32, F16, BF16, F64, I32, I64, U8";

/// Bytes of a tensor of `type` and `shape`, or nothing when an extent is negative or the product
/// does not fit in 64 bits.
[[nodiscard]] inline std::optional<std::uint64_t> byte_size(zero::dtype type,
                                                            std::span<const std::int64_t> shape) noexcept {
  std::uint64_t n = size_of(type);
  for (std::int64_t d : shape) {
    if (d < 0) {
      return std::nullopt;
    }
    const auto u = static_cast<std::uint64_t>(d);
    if (u != 0 && n > std::numeric_limits<std::uint64_t>::max() / u) {
      return std::nullopt;
    }
    n *= u;
  }
  return n;
}

/// "[2, 3]" for messages.
[[nodiscard]] inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

/// Writes all of `bytes` to `fd`, retrying short writes and EINTR; returns 0 or the errno.
[[nodiscard]] inline int write_all(int fd, const std::byte* p, std::size_t n) noexcept {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return 0;
}

/// Reads exactly `n` bytes at `offset`; returns 0, the errno, or -1 when the file ended first.
[[nodiscard]] inline int pread_all(int fd, std::byte* p, std::size_t n, std::uint64_t offset) noexcept {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) {
        continue;
      }
      return errno;
    }
    if (r == 0) {
      return -1;
    }
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += static_cast<std::uint64_t>(r);
  }
  return 0;
}

/// "an object", "an array", "a string", "a number", "a boolean" or "null", for messages.
[[nodiscard]] inline std::string kind(const nlohmann::json& v) {
  const std::string name = v.type_name();
  return v.is_object() || v.is_array() ? "an " + name : v.is_null() ? name : "a " + name;
}

/// "<path>: " for messages.
[[nodiscard]] inline std::string at(const std::filesystem::path& path) { return path.string() + ": "; }

} // namespace detail

} // namespace zero::safetensors
