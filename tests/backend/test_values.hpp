#pragma once
// What the backend tests share: reproducible random numbers, the bits of a value, type names, a loop
// over the element types, and the SIMD levels to test.
#include "zero/backend/cpu_backend.hpp"
#include "zero/core/dtype.hpp"

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <doctest/doctest.h>
#include <string>
#include <type_traits>
#include <vector>

namespace zero::testing {

/// splitmix64, so every run and every platform sees the same inputs.
struct rng {
  std::uint64_t s;
  std::uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    std::uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::uint32_t u32() { return static_cast<std::uint32_t>(next() >> 32); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }
  /// A typical training value: random sign and mantissa, exponent spread over 2^-20 .. 2^8.
  float typical() {
    const std::uint64_t z = next();
    const auto exponent = static_cast<std::uint32_t>(127 - 20 + (z >> 32) % 29);
    return std::bit_cast<float>((static_cast<std::uint32_t>(z >> 63) << 31) | (exponent << 23) |
                                (static_cast<std::uint32_t>(z) & 0x7fffffu));
  }
};

/// The bits of a float, f16, bf16 or int.
template <class T> std::uint32_t bits_of(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(x);
  } else if constexpr (std::is_same_v<T, int>) {
    return static_cast<std::uint32_t>(x);
  } else {
    return x.bits;
  }
}

/// "float", "f16" or "bf16".
template <class T> std::string type_name() {
  if constexpr (std::is_same_v<T, float>) {
    return "float";
  } else if constexpr (std::is_same_v<T, f16>) {
    return "f16";
  } else {
    return "bf16";
  }
}

/// Calls fn.template operator()<T>() for T in float, f16, bf16.
template <class F> void for_each_type(F&& fn) {
  fn.template operator()<float>();
  fn.template operator()<f16>();
  fn.template operator()<bf16>();
}

/// Every SIMD level this CPU has, or only the one named by ZERO_TEST_SIMD (scalar, avx2, avx512).
inline std::vector<zero::simd_level> simd_levels() {
  if (const char* env = std::getenv("ZERO_TEST_SIMD")) {
    const std::string only = env;
    for (auto s : {zero::simd_level::scalar, zero::simd_level::avx2, zero::simd_level::avx512}) {
      if (zero::name_of(s) == only) {
        REQUIRE_MESSAGE(zero::simd_supported(s), "ZERO_TEST_SIMD=" << only << " is not available on this CPU");
        return {s};
      }
    }
    FAIL("ZERO_TEST_SIMD must be scalar, avx2 or avx512, got " << only);
  }
  std::vector<zero::simd_level> l{zero::simd_level::scalar};
  for (auto s : {zero::simd_level::avx2, zero::simd_level::avx512}) {
    if (zero::simd_supported(s)) {
      l.push_back(s);
    }
  }
  return l;
}

} // namespace zero::testing
