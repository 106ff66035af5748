#pragma once
/// \file
/// Block quantization, ZeRO++'s qwZ (int8 weights for the all-gather) and qgZ (int4 or int8
/// gradients): the format, the reference every backend's kernels must match code for code, and the
/// `can_quantize` capability.
///
/// A tensor of n elements is cut into blocks of `block` elements (the last may be shorter). Each
/// block has one fp32 scale and one signed code per element, symmetric around 0:
///
///     amax     = max |x_i| over the block (as float)
///     scale    = amax / qmax                          qmax = 127 (8 bits) or 7 (4 bits)
///     code_i   = clamp(rint(x_i * (qmax / amax)), -qmax, qmax)      (0 when amax is 0;
///                rint(x_i / amax * qmax) when qmax / amax overflows, amax below qmax / FLT_MAX)
///     x'_i     = T(float(code_i) * scale)
///
/// A block holding an inf or a NaN gets the scale NaN and codes 0: it dequantizes to NaN, so a
/// gradient overflow survives quantization and the step's check finds it.
///
/// with IEEE float arithmetic (`qmax / amax` one division, then one product per element) and rint's
/// round-half-to-even, so a CUDA kernel and the CPU give the same codes. 8-bit codes are one byte
/// each (two's complement); 4-bit codes are two to a byte, element 2k in the low nibble (a last odd
/// element's high nibble is 0); a block of 4-bit codes has an even number of elements, so blocks
/// start on a byte.

#include "zero/backend/backend.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

namespace zero {

/// The shape of a quantized tensor: bits per code (8 or 4) and elements per scale.
struct quant_format {
  int bits = 8;
  std::size_t block = 4096;

  /// The largest code: 127 or 7.
  [[nodiscard]] constexpr int qmax() const noexcept { return bits == 8 ? 127 : 7; }
  /// Bytes of the codes of `n` elements.
  [[nodiscard]] constexpr std::size_t code_bytes(std::size_t n) const noexcept { return bits == 8 ? n : (n + 1) / 2; }
  /// Scales of `n` elements.
  [[nodiscard]] constexpr std::size_t blocks(std::size_t n) const noexcept { return (n + block - 1) / block; }
  /// \throws usage_error unless bits is 8 or 4 and block is at least 1 (even for 4 bits).
  void check(const char* what) const {
    if ((bits != 8 && bits != 4) || block == 0 || (bits == 4 && block % 2 != 0)) {
      throw usage_error(std::string(what) + ": " + std::to_string(bits) + "-bit codes in blocks of " +
                        std::to_string(block) +
                        "; expected 8 or 4 bits and a block of at least 1 element (even for 4)");
    }
  }
  friend bool operator==(const quant_format&, const quant_format&) = default;
};

namespace detail {
/// Stores code `q` of element `i` (of a block starting on a byte, its 4-bit codes zeroed first) into `codes`.
inline void put_code(std::uint8_t* codes, std::size_t i, int q, int bits) noexcept {
  const auto bitsq = static_cast<std::uint8_t>(q);
  if (bits == 8) {
    codes[i] = bitsq;
  } else {
    codes[i / 2] = static_cast<std::uint8_t>(codes[i / 2] | ((bitsq & 0x0FU) << (i % 2 == 0 ? 0U : 4U)));
  }
}
/// The code of element `i`.
[[nodiscard]] inline int get_code(const std::uint8_t* codes, std::size_t i, int bits) noexcept {
  if (bits == 8) {
    return static_cast<std::int8_t>(codes[i]);
  }
  const unsigned nibble = (i % 2 == 0 ? codes[i / 2] : codes[i / 2] >> 4U) & 0x0FU;
  return nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble);
}
} // namespace detail

/// Quantizes block `b` of `x` (n elements in all): the reference of the file comment.
template <class T>
void quantize_block(const T* x, std::size_t n, quant_format f, std::size_t b, std::uint8_t* codes,
                    float* scales) noexcept {
  const std::size_t first = b * f.block;
  const std::size_t len = std::min(f.block, n - first);
  float amax = 0.0F;
  bool finite = true;
  for (std::size_t i = 0; i < len; ++i) {
    const float v = static_cast<float>(x[first + i]);
    finite = finite && std::isfinite(v);
    amax = std::max(amax, std::fabs(v));
  }
  const auto qmax = static_cast<float>(f.qmax());
  // A block with an inf or NaN keeps no values: its scale is NaN, so every element dequantizes to NaN
  // and an overflow check downstream sees it.
  scales[b] = finite ? amax / qmax : std::numeric_limits<float>::quiet_NaN();
  const float inv = finite && amax > 0.0F ? qmax / amax : 0.0F;
  std::uint8_t* out = codes + f.code_bytes(first);
  if (f.bits == 4) {
    std::fill_n(out, f.code_bytes(len), std::uint8_t{0}); // an odd block's last high nibble stays 0
  }
  // When qmax / amax overflows (amax below qmax / FLT_MAX, as tiny gradients can be), v * inf would send
  // every value to +-qmax and a zero to NaN: such a block scales by v / amax * qmax instead.
  const bool huge = inv > std::numeric_limits<float>::max();
  for (std::size_t i = 0; i < len; ++i) {
    const float v = static_cast<float>(x[first + i]);
    const float q = finite ? std::clamp(std::nearbyint(huge ? v / amax * qmax : v * inv), -qmax, qmax) : 0.0F;
    detail::put_code(out, i, static_cast<int>(q), f.bits);
  }
}

/// Dequantizes block `b` into `out`.
template <class T>
void dequantize_block(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, std::size_t b,
                      T* out) noexcept {
  const std::size_t first = b * f.block;
  const std::size_t len = std::min(f.block, n - first);
  const std::uint8_t* in = codes + f.code_bytes(first);
  for (std::size_t i = 0; i < len; ++i) {
    out[first + i] = T(static_cast<float>(detail::get_code(in, i, f.bits)) * scales[b]);
  }
}

namespace detail {
template <class B, class T>
concept quantize_for = requires(B& b, const T* x, T* y, std::size_t n, quant_format f, std::uint8_t* codes,
                                float* scales, const typename B::stream_type& s) {
  { b.quantize(x, n, f, codes, scales, s) } -> std::same_as<void>;
  {
    b.dequantize(static_cast<const std::uint8_t*>(codes), static_cast<const float*>(scales), n, f, y, s)
    } -> std::same_as<void>;
};
} // namespace detail

/// Optional: `quantize<T>(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales,
/// s)` and `dequantize<T>(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f,
/// T* out, s)` for T float, f16, bf16: ZeRO++'s block quantization (see the file comment), the same
/// codes as `quantize_block`.
template <class B>
concept can_quantize =
    backend_base<B> && detail::quantize_for<B, float> && detail::quantize_for<B, f16> && detail::quantize_for<B, bf16>;

} // namespace zero
