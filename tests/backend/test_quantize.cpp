// ZeRO++'s block quantization (zero/backend/quantize.hpp): the reference's codes by hand, its
// properties over many blocks, and cpu_backend's kernels against it code for code.

#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <limits>
#include <vector>

using zero::quant_format;

namespace {
std::vector<float> wave(std::size_t n) {
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = std::sin(static_cast<float>(i) * 0.37F) * static_cast<float>(1 + (i / 300) % 5);
  }
  return x;
}
} // namespace

TEST_CASE("quantize: codes by hand, round half to even, 4-bit codes packed low nibble first") {
  const float x[] = {1.0F, -0.5F, 0.25F, 0.0F, 3.0F, -6.0F};
  std::uint8_t codes[6] = {};
  float scales[2] = {};
  const quant_format int8{.bits = 8, .block = 4};
  for (std::size_t b = 0; b < 2; ++b) {
    zero::quantize_block(x, 6, int8, b, codes, scales);
  }
  // Block 0: amax 1, x * 127: 127, -63.5 -> -64 (half to even), 31.75 -> 32, 0.
  CHECK(static_cast<std::int8_t>(codes[0]) == 127);
  CHECK(static_cast<std::int8_t>(codes[1]) == -64);
  CHECK(static_cast<std::int8_t>(codes[2]) == 32);
  CHECK(codes[3] == 0);
  CHECK(scales[0] == 1.0F / 127.0F);
  // Block 1, two elements: amax 6: 3 * 127 / 6 = 63.5 -> 64, -127.
  CHECK(static_cast<std::int8_t>(codes[4]) == 64);
  CHECK(static_cast<std::int8_t>(codes[5]) == -127);
  float back[6] = {};
  for (std::size_t b = 0; b < 2; ++b) {
    zero::dequantize_block(codes, scales, 6, int8, b, back);
  }
  CHECK(back[0] == 1.0F);
  CHECK(back[5] == -6.0F);
  CHECK(back[1] == -64.0F * (1.0F / 127.0F));

  const quant_format int4{.bits = 4, .block = 4};
  std::uint8_t packed[3] = {};
  for (std::size_t b = 0; b < 2; ++b) {
    zero::quantize_block(x, 6, int4, b, packed, scales);
  }
  // x * 7: 7, -3.5 -> -4 (0xC), 1.75 -> 2, 0; then 3 * 7 / 6 = 3.5 -> 4, -7 (0x9).
  CHECK(packed[0] == 0xC7);
  CHECK(packed[1] == 0x02);
  CHECK(packed[2] == 0x94);
  CHECK(scales[1] == 6.0F / 7.0F);
  CHECK(int4.code_bytes(6) == 3);
  CHECK(int4.blocks(6) == 2);
}

TEST_CASE("quantize: every code in range, the error at most half a step, zeros stay zeros, inf and NaN poison "
          "their block") {
  for (const quant_format f : {quant_format{.bits = 8, .block = 256}, quant_format{.bits = 4, .block = 64}}) {
    CAPTURE(f.bits);
    const std::size_t n = 5000; // the last block is shorter
    std::vector<float> x = wave(n);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0F); // whole zero blocks
    // A block so small that qmax / amax overflows (amax 1e-38 < 7 / FLT_MAX): its codes still within half
    // a step, its zeros still zeros (x * inf made every value +-qmax, and 0 * inf a NaN code).
    for (std::size_t i = 3072; i < 3072 + f.block; ++i) {
      x[i] = i % 5 == 0 ? 0.0F : static_cast<float>(static_cast<int>(i % 7) - 3) * 1e-38F / 3.0F;
    }
    x[1000] = std::numeric_limits<float>::infinity();
    x[2003] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::uint8_t> codes(f.code_bytes(n));
    std::vector<float> scales(f.blocks(n)), back(n);
    for (std::size_t b = 0; b < f.blocks(n); ++b) {
      zero::quantize_block(x.data(), n, f, b, codes.data(), scales.data());
    }
    for (std::size_t b = 0; b < f.blocks(n); ++b) {
      zero::dequantize_block(codes.data(), scales.data(), n, f, b, back.data());
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t b = i / f.block;
      const int q = zero::detail::get_code(codes.data(), i, f.bits);
      REQUIRE(q >= -f.qmax());
      REQUIRE(q <= f.qmax());
      if (std::isnan(scales[b])) {
        CHECK(std::isnan(back[i]));
        CHECK(((i >= 1000 / f.block * f.block && i < (1000 / f.block + 1) * f.block) ||
               (i >= 2003 / f.block * f.block && i < (2003 / f.block + 1) * f.block)));
        continue;
      }
      REQUIRE(std::fabs(back[i] - x[i]) <= scales[b] * 0.5F * (1.0F + 1e-6F));
      if (x[i] == 0.0F) {
        CHECK(back[i] == 0.0F);
      }
    }
    CHECK(std::isnan(scales[1000 / f.block]));
    CHECK(std::isnan(scales[2003 / f.block]));
  }
}

TEST_CASE("cpu_backend quantizes and dequantizes as the reference, code for code, over its threads") {
  zero::cpu_backend backend({.threads = 4});
  auto s = backend.make_stream();
  for (const quant_format f : {quant_format{.bits = 8, .block = 512}, quant_format{.bits = 4, .block = 128},
                               quant_format{.bits = 8, .block = 100000}}) {
    CAPTURE(f.bits);
    CAPTURE(f.block);
    const std::size_t n = 300001;
    const std::vector<float> x = wave(n);
    std::vector<zero::bf16> xb(n);
    for (std::size_t i = 0; i < n; ++i) {
      xb[i] = zero::bf16(x[i]);
    }
    std::vector<std::uint8_t> codes(f.code_bytes(n)), ref_codes(f.code_bytes(n));
    std::vector<float> scales(f.blocks(n)), ref_scales(f.blocks(n));
    backend.quantize(xb.data(), n, f, codes.data(), scales.data(), s);
    for (std::size_t b = 0; b < f.blocks(n); ++b) {
      zero::quantize_block(xb.data(), n, f, b, ref_codes.data(), ref_scales.data());
    }
    CHECK(codes == ref_codes);
    CHECK(scales == ref_scales);
    std::vector<zero::bf16> back(n), ref_back(n);
    backend.dequantize(codes.data(), scales.data(), n, f, back.data(), s);
    for (std::size_t b = 0; b < f.blocks(n); ++b) {
      zero::dequantize_block(ref_codes.data(), ref_scales.data(), n, f, b, ref_back.data());
    }
    CHECK(std::memcmp(back.data(), ref_back.data(), n * sizeof(zero::bf16)) == 0);
  }
  std::vector<float> x(8), back(8);
  std::uint8_t codes[8];
  float scales[1];
  CHECK_THROWS_WITH_AS(backend.quantize(x.data(), 8, quant_format{.bits = 3, .block = 8}, codes, scales, s),
                       doctest::Contains("quantize: 3-bit codes in blocks of 8; expected 8 or 4 bits and a block of "
                                         "at least 1 element (even for 4)"),
                       zero::usage_error);
  CHECK_THROWS_AS(backend.dequantize(codes, scales, 8, quant_format{.bits = 4, .block = 7}, back.data(), s),
                  zero::usage_error);
}
