#pragma once
/// \file
/// The portable scalar kernels of `zero::cpu_backend`, one chunk at a time. They are the reference
/// the SIMD variants (cpu_kernels_avx2.hpp, cpu_kernels_avx512.hpp) reproduce bit for bit: the
/// vector code performs the same IEEE operations (multiply, add, divide, square root; never a fused
/// multiply-add) in the same order, and rounds to f16/bf16 exactly as zero/core/dtype.hpp does. The
/// vector loops also finish their tails with the element functions below.
///
/// Bit-identity between variants assumes the compiler does not contract `a * b + c` into an FMA:
/// that is GCC's and Clang's default in ISO mode (`-std=c++20`, which zero's CMake asks for with
/// `CMAKE_CXX_EXTENSIONS OFF`). Under `-ffp-contract=fast` (GCC's default in GNU mode) the scalar
/// tails may be fused and differ from the vector lanes by an ulp.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/dtype.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zero::detail::cpu {

/// The per-call factors of one AdamW step, computed once in fp32 from `adamw_step_args` with the
/// expressions of zero/backend/adamw_args.hpp:
/// step_size = lr / bias_correction1, sqrt_bc2 = sqrt(bias_correction2), decay = 1 - lr * weight_decay.
struct adamw_consts {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float grad_scale;
  float step_size;
  float sqrt_bc2;
  float decay;
  bool adam_w_mode;

  static adamw_consts from(const adamw_step_args& a) noexcept {
    adamw_consts c{};
    c.beta1 = a.beta1;
    c.beta2 = a.beta2;
    c.one_minus_beta1 = 1.0f - a.beta1;
    c.one_minus_beta2 = 1.0f - a.beta2;
    c.eps = a.eps;
    c.weight_decay = a.weight_decay;
    c.grad_scale = a.grad_scale;
    c.step_size = a.lr / a.bias_correction1;
    c.sqrt_bc2 = std::sqrt(a.bias_correction2);
    c.decay = 1.0f - a.lr * a.weight_decay;
    c.adam_w_mode = a.adam_w_mode;
    return c;
  }
};

/// Reads one element as float (exact for every supported type).
template <class T> inline float load1(const T* p) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return static_cast<float>(*p);
  }
}

/// Stores one float as `T`, rounding to nearest even for the half types.
template <class T> inline void store1(T* p, float x) noexcept { *p = from_float<T>(x); }

/// True when the stored element is inf or NaN (its exponent bits are all ones).
template <class T> inline bool nonfinite1(const T* p) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    std::uint32_t b;
    std::memcpy(&b, p, 4);
    return (b & 0x7f800000u) == 0x7f800000u;
  } else if constexpr (std::is_same_v<T, f16>) {
    return (p->bits & 0x7c00u) == 0x7c00u;
  } else {
    return (p->bits & 0x7f80u) == 0x7f80u;
  }
}

/// One element of the AdamW/Adam step (see zero/backend/adamw_args.hpp); every SIMD lane does exactly this.
template <bool AdamW> inline void adamw1(float& p, float& m, float& v, float grad, const adamw_consts& c) noexcept {
  float g = grad * c.grad_scale;
  if constexpr (!AdamW) {
    g = g + c.weight_decay * p;
  }
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  if constexpr (AdamW) {
    p = p * c.decay;
  }
  const float denom = std::sqrt(v) / c.sqrt_bc2 + c.eps;
  p = p - c.step_size * m / denom;
}

/// Elements [0, n) of one AdamW chunk; `param` may be null.
template <bool AdamW, class G, class P>
inline void adamw_tail(float* master, float* m, float* v, const G* grad, P* param, std::size_t i, std::size_t n,
                       const adamw_consts& c) noexcept {
  for (; i < n; ++i) {
    float p = master[i];
    adamw1<AdamW>(p, m[i], v[i], load1(grad + i), c);
    master[i] = p;
    if (param != nullptr) {
      store1(param + i, p);
    }
  }
}

/// Number of interleaved partial sums of `squared_norm` within a chunk: element i of a chunk goes
/// to accumulator i % 16, and the 16 accumulators are then added as a fixed tree
/// (j += j + 8, then j += j + 4, j += j + 2, j += j + 1). Scalar, AVX2 and AVX-512 all follow it.
inline constexpr std::size_t norm_lanes = 16;

/// Adds x[i]^2 for i in [i, n) into the interleaved accumulators, lane i % 16.
template <class T> inline void squared_norm_tail(const T* x, std::size_t i, std::size_t n, float* acc) noexcept {
  for (; i < n; ++i) {
    const float f = load1(x + i);
    acc[i % norm_lanes] = acc[i % norm_lanes] + f * f;
  }
}

/// The fixed tree over the 16 accumulators.
inline float reduce_lanes(float* acc) noexcept {
  for (std::size_t w = norm_lanes / 2; w >= 1; w /= 2) {
    for (std::size_t j = 0; j < w; ++j) {
      acc[j] = acc[j] + acc[j + w];
    }
  }
  return acc[0];
}

/// One AdamW chunk of n elements (see adamw1); `param` may be null.
template <bool AdamW, class G, class P>
inline void adamw_chunk(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                        const adamw_consts& c) noexcept {
  adamw_tail<AdamW>(master, m, v, grad, param, 0, n, c);
}

/// dst[i] = D(src[i]) for one chunk.
template <class S, class D> inline void cast_chunk(const S* src, D* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    store1(dst + i, load1(src + i));
  }
}

/// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
template <class T> inline bool unscale_and_check_chunk(T* x, std::size_t n, float factor) noexcept {
  bool found = false;
  for (std::size_t i = 0; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
    found = found || nonfinite1(x + i);
  }
  return found;
}

/// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes).
template <class T> inline float squared_norm_chunk(const T* x, std::size_t n) noexcept {
  float acc[norm_lanes] = {};
  squared_norm_tail(x, 0, n, acc);
  return reduce_lanes(acc);
}

/// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
template <class S, class D> inline void accumulate_chunk(const S* src, D* dst, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    store1(dst + i, load1(dst + i) + load1(src + i));
  }
}

/// x[i] = T(float(x[i]) * factor) for one chunk.
template <class T> inline void scale_chunk(T* x, std::size_t n, float factor) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
  }
}

} // namespace zero::detail::cpu
