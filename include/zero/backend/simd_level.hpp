#pragma once
/// \file
/// `simd_level`: the instruction sets `cpu_backend`'s kernels are compiled for, and which of them this build and
/// this CPU can run (`simd_supported`, `best_simd_level`).

#include "zero/backend/detail/cpu_features.hpp"

#include <cstdint>
#include <string_view>

namespace zero {

/// Which instruction set `cpu_backend`'s kernels use.
enum class simd_level : std::uint8_t {
  scalar,   ///< portable C++, no intrinsics
  avx2,     ///< AVX2 + F16C, 8 fp32 lanes
  avx512,   ///< AVX-512F + AVX-512BW, 16 fp32 lanes
  automatic ///< the widest level this CPU has
};

/// Name of a SIMD level for reports: "scalar", "avx2", "avx512", "automatic".
[[nodiscard]] constexpr std::string_view name_of(simd_level s) noexcept {
  switch (s) {
  case simd_level::scalar:
    return "scalar";
  case simd_level::avx2:
    return "avx2";
  case simd_level::avx512:
    return "avx512";
  case simd_level::automatic:
    return "automatic";
  }
  return "?";
}

/// True when this build and this CPU can run kernels of level `s` (`automatic` always can).
[[nodiscard]] inline bool simd_supported(simd_level s) noexcept {
  switch (s) {
  case simd_level::scalar:
  case simd_level::automatic:
    return true;
  case simd_level::avx2:
    return detail::cpu::has_avx2();
  case simd_level::avx512:
    return detail::cpu::has_avx512();
  }
  return false;
}

/// The widest SIMD level this build and this CPU support.
[[nodiscard]] inline simd_level best_simd_level() noexcept {
  if (detail::cpu::has_avx512()) {
    return simd_level::avx512;
  }
  if (detail::cpu::has_avx2()) {
    return simd_level::avx2;
  }
  return simd_level::scalar;
}

} // namespace zero
