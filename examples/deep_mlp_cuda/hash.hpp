#pragma once
// Counter-based random numbers shared by the GPU kernels and the CPU reference: element `i` of a
// stream `seed` is a pure function of (seed, i), so every rank, the device and the host agree on the
// inputs, targets and initial parameters whatever the world size or the order of evaluation.

#include <cstdint>

#if defined(__CUDACC__)
#define DEEP_MLP_HD __host__ __device__ __forceinline__
#else
#define DEEP_MLP_HD inline
#endif

namespace deep_mlp {

/// SplitMix64's finalizer: a bijection on 64-bit words with good avalanche.
DEEP_MLP_HD std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Uniform in [-1, 1) for element `i` of stream `seed` (53 random bits, then rounded to float).
DEEP_MLP_HD float uniform(std::uint64_t seed, std::uint64_t i) {
  const std::uint64_t h = mix64(mix64(seed) + i);
  return static_cast<float>(static_cast<double>(h >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

/// Streams: the input rows, the regression targets, and one per parameter (weight, bias of a block).
inline constexpr std::uint64_t input_seed = 1;
inline constexpr std::uint64_t target_seed = 2;
DEEP_MLP_HD std::uint64_t weight_seed(int block) { return 1000 + 2 * static_cast<std::uint64_t>(block); }
DEEP_MLP_HD std::uint64_t bias_seed(int block) { return 1001 + 2 * static_cast<std::uint64_t>(block); }

} // namespace deep_mlp
