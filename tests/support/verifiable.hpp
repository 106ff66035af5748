#pragma once
// Inputs that reduce exactly, as nccl-tests' verifiable/ does: small integers scaled by a power
// of two. Any sum of up to 64 of them is exact in f32, f16 and bf16, whatever the order, so a
// collective's result must equal the reference bit for bit.

#include "zero/core/dtype.hpp"

#include <cstddef>
#include <cstdint>

namespace zero::testing {

/// Element `i` of rank `rank`'s input: an integer in [-4, 3] times 2^-2 (exact in every dtype),
/// different for every rank and element.
inline float verifiable_value(int rank, std::size_t i, std::uint32_t seed = 0) {
  const std::uint32_t h =
      static_cast<std::uint32_t>(i) * 2654435761u ^ (static_cast<std::uint32_t>(rank) + 1u) * 40503u ^ seed * 97u;
  const int v = static_cast<int>((h >> 7) % 8u) - 4;
  return static_cast<float>(v) * 0.25f;
}

template <class T> T verifiable(int rank, std::size_t i, std::uint32_t seed = 0) {
  return from_float<T>(verifiable_value(rank, i, seed));
}

} // namespace zero::testing
