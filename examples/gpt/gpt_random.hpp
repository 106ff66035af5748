#pragma once
// What the GPT example's model and data draw their numbers from: splitmix64's finaliser, a bijective 64-bit mix
// (Steele, Lea and Flood, 2014), keyed by (seed, parameter, element) for the initialisation and by (seed, step,
// sequence) for the batches, so any rank computes any value alone.

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gpt::detail {

constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// FNV-1a's offset basis, where a hash of nothing starts.
inline constexpr std::uint64_t fnv1a_basis = 0xCBF29CE484222325ULL;

/// FNV-1a of `n` bytes at `p`, continuing from `h`: a parameter's name (its own stream of the initialisation) and
/// the final parameters (the trainer's checksum).
constexpr std::uint64_t fnv1a(const void* p, std::size_t n, std::uint64_t h = fnv1a_basis) noexcept {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    h = (h ^ b[i]) * 0x100000001B3ULL;
  }
  return h;
}

} // namespace gpt::detail
