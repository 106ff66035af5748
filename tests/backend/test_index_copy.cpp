// cpu_backend's gather and scatter (zero::can_index_copy, ZenFlow's copies of the chosen elements): values by
// hand, bits moved as they are (NaN payloads, signed zeros), across the pool's chunks.

#include "zero/backend/cpu_backend.hpp"

#include <bit>
#include <cstdint>
#include <doctest/doctest.h>
#include <vector>

TEST_CASE("gather and scatter: dst[i] = src[index[i]] and dst[index[i]] = src[i], bits as they are") {
  zero::cpu_backend b({.threads = 1});
  const zero::cpu_backend::stream_type s;
  static_assert(zero::can_index_copy<zero::cpu_backend>);
  const std::vector<float> src = {1.5F, -0.0F, std::bit_cast<float>(0x7fc00123U), 4.0F, -2.25F};
  const std::vector<std::uint32_t> index = {4, 0, 2, 1};
  std::vector<float> got(4, 9.0F);
  b.gather(src.data(), index.data(), index.size(), got.data(), s);
  CHECK(got[0] == -2.25F);
  CHECK(got[1] == 1.5F);
  CHECK(std::bit_cast<std::uint32_t>(got[2]) == 0x7fc00123U); // the NaN's payload kept
  CHECK(std::bit_cast<std::uint32_t>(got[3]) == 0x80000000U); // -0
  std::vector<float> back(5, 7.0F);
  b.scatter(got.data(), index.data(), index.size(), back.data(), s);
  CHECK(back[0] == 1.5F);
  CHECK(std::bit_cast<std::uint32_t>(back[1]) == 0x80000000U);
  CHECK(std::bit_cast<std::uint32_t>(back[2]) == 0x7fc00123U);
  CHECK(back[3] == 7.0F); // not in the index: untouched
  CHECK(back[4] == -2.25F);
  // bf16 and f16: the 16-bit patterns move unchanged.
  const std::vector<zero::bf16> h = {zero::bf16::from_bits(0x3f80), zero::bf16::from_bits(0xffc1)};
  std::vector<zero::bf16> hg(2);
  const std::uint32_t swap[] = {1, 0};
  b.gather(h.data(), swap, 2, hg.data(), s);
  CHECK(hg[0].bits == 0xffc1);
  CHECK(hg[1].bits == 0x3f80);
  std::vector<zero::f16> f(3, zero::f16::from_bits(0x1234));
  const std::vector<zero::f16> one = {zero::f16::from_bits(0x3c00)};
  const std::uint32_t at2[] = {2};
  b.scatter(one.data(), at2, 1, f.data(), s);
  CHECK(f[0].bits == 0x1234);
  CHECK(f[2].bits == 0x3c00);
}

TEST_CASE("gather and scatter over many chunks of a pool of threads: every element once, none else") {
  zero::cpu_backend b({.threads = 4});
  const zero::cpu_backend::stream_type s;
  const std::size_t n = 3 * (std::size_t{1} << 20) + 17; // past several of the pool's chunks
  std::vector<float> src(2 * n);
  for (std::size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<float>(i);
  }
  std::vector<std::uint32_t> index(n);
  for (std::size_t i = 0; i < n; ++i) {
    index[i] = static_cast<std::uint32_t>((i * 7919) % (2 * n)); // distinct: 7919 is prime to 2n
  }
  std::vector<float> got(n);
  b.gather(src.data(), index.data(), n, got.data(), s);
  std::vector<float> back(2 * n, -1.0F);
  b.scatter(got.data(), index.data(), n, back.data(), s);
  std::size_t wrong = 0;
  std::size_t written = 0;
  for (std::size_t i = 0; i < n; ++i) {
    wrong += got[i] == static_cast<float>(index[i]) ? 0 : 1;
  }
  for (std::size_t j = 0; j < back.size(); ++j) {
    if (back[j] >= 0) {
      ++written;
      wrong += back[j] == static_cast<float>(j) ? 0 : 1;
    }
  }
  CHECK(wrong == 0);
  CHECK(written == n);
  CHECK_THROWS_AS(b.gather(src.data(), nullptr, 1, got.data(), s), zero::usage_error);
}
