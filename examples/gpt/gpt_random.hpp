#pragma once
// What the GPT example's model and data draw their numbers from: splitmix64's finaliser, a bijective 64-bit mix
// (Steele, Lea and Flood, 2014), keyed by (seed, parameter, element) for the initialisation and by (seed, step,
// sequence) for the batches, so any rank computes any value alone.

#include <cstdint>

namespace gpt::detail {

constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

} // namespace gpt::detail
