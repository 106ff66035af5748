#include "zero/core/dtype.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <doctest/doctest.h>
#include <limits>

using zero::bf16;
using zero::f16;

namespace {
// Reference f16 rounding by exhaustive search over the 65536 halves: the nearest, ties to even.
std::uint16_t reference_f16(float v) {
  if (std::isnan(v)) {
    return 0x7e00;
  }
  double best_err = std::numeric_limits<double>::infinity();
  std::uint16_t best = 0;
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0) {
      continue; // NaN
    }
    const double hv = static_cast<double>(f16::to_float(bits));
    if (std::isinf(hv)) {
      continue;
    }
    const double err = std::fabs(hv - static_cast<double>(v));
    if (err < best_err || (err == best_err && (bits & 1u) == 0 && std::signbit(hv) == std::signbit(v))) {
      best_err = err;
      best = bits;
    }
  }
  // IEEE: values at or beyond 65520 round to infinity.
  if (std::fabs(v) >= 65520.0f) {
    return static_cast<std::uint16_t>((std::signbit(v) ? 0x8000u : 0u) | 0x7c00u);
  }
  if (v == 0.0f || (best & 0x7fffu) == 0) {
    return static_cast<std::uint16_t>(std::signbit(v) ? 0x8000u : 0u);
  }
  return best;
}
} // namespace

TEST_CASE("f16 round-trips every finite half exactly") {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = f16::to_float(bits);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(f16(f))));
      continue;
    }
    CHECK(f16(f).bits == bits);
  }
}

TEST_CASE("f16 rounds to nearest even, including ties, subnormals and overflow") {
  // Midpoints between consecutive halves must go to the even one.
  for (std::uint16_t bits : {std::uint16_t{0x3c00}, std::uint16_t{0x3c01}, std::uint16_t{0x0001}, std::uint16_t{0x03ff},
                             std::uint16_t{0x7bfe}, std::uint16_t{0x0400}}) {
    const float lo = f16::to_float(bits);
    const float hi = f16::to_float(static_cast<std::uint16_t>(bits + 1));
    const float mid = (lo + hi) / 2;
    const std::uint16_t even = (bits & 1u) == 0 ? bits : static_cast<std::uint16_t>(bits + 1);
    CHECK(f16(mid).bits == even);
    CHECK(f16(std::nextafter(mid, hi)).bits == bits + 1);
    CHECK(f16(std::nextafter(mid, lo)).bits == bits);
  }
  const float samples[] = {0.1f,           -0.1f,     1.0f / 3, 65504.0f, 65519.0f,
                           65520.0f,       -70000.0f, 6.0e-8f,  2.9e-8f,  3.0e-8f,
                           5.96046448e-8f, 1e-3f,     123.456f, -0.0f,    std::numeric_limits<float>::infinity()};
  for (float v : samples) {
    CAPTURE(v);
    CHECK(f16(v).bits == reference_f16(v));
  }
  CHECK(std::isnan(static_cast<float>(f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("bf16 rounds to nearest even and keeps NaN") {
  CHECK(bf16(1.0f).bits == 0x3f80);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even gives 1.
  CHECK(bf16(1.0f + 1.0f / 256).bits == 0x3f80);
  // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  CHECK(bf16(1.0f + 3.0f / 256).bits == 0x3f82);
  CHECK(bf16(std::nextafter(1.0f + 1.0f / 256, 2.0f)).bits == 0x3f81);
  CHECK(std::isnan(static_cast<float>(bf16(std::numeric_limits<float>::quiet_NaN()))));
  CHECK(std::isinf(static_cast<float>(bf16(std::numeric_limits<float>::max()))));
  for (std::uint32_t h = 0; h < 0x10000u; h += 7) {
    const auto b = bf16::from_bits(static_cast<std::uint16_t>(h));
    const float f = static_cast<float>(b);
    if (!std::isnan(f)) {
      CHECK(bf16(f).bits == b.bits);
    }
  }
}

TEST_CASE("dtype names, sizes and parsing") {
  CHECK(zero::size_of(zero::dtype::bf16) == 2);
  CHECK(zero::size_of(zero::dtype::f32) == 4);
  CHECK(zero::name_of(zero::dtype::f16) == "fp16");
  CHECK(zero::parse_dtype("bfloat16") == zero::dtype::bf16);
  CHECK(zero::dtype_v<zero::bf16> == zero::dtype::bf16);
  CHECK_THROWS_WITH_AS((void)zero::parse_dtype("fp8"), doctest::Contains("expected one of fp32, fp16, bf16"),
                       zero::usage_error);
}
