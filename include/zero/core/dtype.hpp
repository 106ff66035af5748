#pragma once
/// \file
/// Element types zero stores and communicates: fp32, fp16 and bf16 for model state, plus the
/// integer and fp64 types collectives need for flags and counters. `f16` and `bf16` are plain
/// 16-bit storage types with host conversions that round to nearest even, bit-compatible with
/// CUDA's `__half` and `__nv_bfloat16`.

#include "zero/core/error.hpp"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

namespace zero {

/// Runtime tag of an element type.
enum class dtype : std::uint8_t { f32, f16, bf16, f64, i32, i64, u8 };

/// Bytes of one element of `t`.
[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
  case dtype::i32:
    return 4;
  case dtype::f16:
  case dtype::bf16:
    return 2;
  case dtype::f64:
  case dtype::i64:
    return 8;
  case dtype::u8:
    return 1;
  }
  return 0;
}

/// The name used in configs, manifests and messages: "fp32", "fp16", "bf16", "fp64", "int32", "int64", "uint8".
[[nodiscard]] constexpr std::string_view name_of(dtype t) noexcept {
  switch (t) {
  case dtype::f32:
    return "fp32";
  case dtype::f16:
    return "fp16";
  case dtype::bf16:
    return "bf16";
  case dtype::f64:
    return "fp64";
  case dtype::i32:
    return "int32";
  case dtype::i64:
    return "int64";
  case dtype::u8:
    return "uint8";
  }
  return "?";
}

/// Parses a dtype name ("fp32"/"float32"/"float", "fp16"/"float16"/"half", "bf16"/"bfloat16").
/// \throws usage_error naming the text and the accepted names.
[[nodiscard]] inline dtype parse_dtype(std::string_view s) {
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") {
    return dtype::f32;
  }
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16") {
    return dtype::f16;
  }
  if (s == "bf16" || s == "bfloat16") {
    return dtype::bf16;
  }
  throw usage_error("unknown dtype \"" + std::string(s) + "\"; expected one of fp32, fp16, bf16");
}

/// IEEE 754 binary16 storage. Arithmetic goes through float.
struct f16 {
  std::uint16_t bits = 0;

  constexpr f16() = default;
  /// Rounds `v` to the nearest representable half, ties to even; overflow gives infinity.
  explicit f16(float v) noexcept : bits(from_float(v)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  friend constexpr bool operator==(f16 a, f16 b) noexcept { return a.bits == b.bits; }

  static constexpr f16 from_bits(std::uint16_t b) noexcept {
    f16 h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float v) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) { // inf or NaN; keep NaN quiet and non-zero
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x0200u : 0u));
    }
    if (abs >= 0x477ff000u) { // rounds to >= 65520: overflow to infinity
      return static_cast<std::uint16_t>(sign | 0x7c00u);
    }
    if (abs < 0x38800000u) {   // below the smallest normal half: produce a subnormal
      if (abs < 0x33000000u) { // below half of the smallest subnormal: zero (0x33000000 rounds to even = 0)
        return static_cast<std::uint16_t>(sign);
      }
      const std::uint32_t exp = abs >> 23;
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      const std::uint32_t shift = 126u - exp; // 14..24
      const std::uint32_t half_mant = mant >> shift;
      const std::uint32_t rem = mant & ((1u << shift) - 1u);
      const std::uint32_t halfway = 1u << (shift - 1u);
      std::uint32_t r = half_mant;
      if (rem > halfway || (rem == halfway && (half_mant & 1u))) {
        ++r;
      }
      return static_cast<std::uint16_t>(sign | r);
    }
    // Normal: rebias the exponent from 127 to 15 and round 13 mantissa bits away.
    std::uint32_t r = abs - 0x38000000u;
    const std::uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) {
      ++r;
    }
    return static_cast<std::uint16_t>(sign | r);
  }

  static float to_float(std::uint16_t h) noexcept {
    const std::uint32_t sign = (static_cast<std::uint32_t>(h) & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    const std::uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
      // Zero or subnormal: value = mant * 2^-24, exact in float.
      const float v = std::ldexp(static_cast<float>(mant), -24);
      return sign ? -v : v;
    }
    if (exp == 31) {
      return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
    }
    return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

/// bfloat16 storage: the upper 16 bits of an IEEE float. Arithmetic goes through float.
struct bf16 {
  std::uint16_t bits = 0;

  constexpr bf16() = default;
  /// Rounds `v` to the nearest bf16, ties to even; NaN stays NaN.
  explicit bf16(float v) noexcept : bits(from_float(v)) {}
  explicit operator float() const noexcept { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
  friend constexpr bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }

  static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float v) noexcept {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(v);
    if ((x & 0x7fffffffu) > 0x7f800000u) {
      return static_cast<std::uint16_t>((x >> 16) | 0x0040u); // quiet NaN
    }
    const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<std::uint16_t>((x + rounding) >> 16);
  }
};

/// Converts any supported element type to float (identity for float).
template <class T> [[nodiscard]] inline float to_float(T v) noexcept { return static_cast<float>(v); }

/// Converts float to the element type `T`, rounding to nearest even for f16 and bf16.
template <class T> [[nodiscard]] inline T from_float(float v) noexcept {
  if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
    return T(v);
  } else {
    return static_cast<T>(v);
  }
}

/// Maps a C++ element type to its dtype tag.
template <class T> struct dtype_of;
template <> struct dtype_of<float> : std::integral_constant<dtype, dtype::f32> {};
template <> struct dtype_of<f16> : std::integral_constant<dtype, dtype::f16> {};
template <> struct dtype_of<bf16> : std::integral_constant<dtype, dtype::bf16> {};
template <> struct dtype_of<double> : std::integral_constant<dtype, dtype::f64> {};
template <> struct dtype_of<std::int32_t> : std::integral_constant<dtype, dtype::i32> {};
template <> struct dtype_of<std::int64_t> : std::integral_constant<dtype, dtype::i64> {};
template <> struct dtype_of<std::uint8_t> : std::integral_constant<dtype, dtype::u8> {};

/// The dtype tag of `T`.
template <class T> inline constexpr dtype dtype_v = dtype_of<T>::value;

/// True for the element types zero can store and communicate.
template <class T>
concept element_type = requires {
  dtype_of<std::remove_cv_t<T>>::value;
};

/// True for the 16-bit floating types whose arithmetic goes through float.
template <class T> inline constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2, "f16 and bf16 must be 2-byte storage types");

} // namespace zero
