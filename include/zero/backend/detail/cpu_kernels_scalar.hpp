#pragma once
/// \file
/// The portable scalar kernels of `zero::cpu_backend`, one chunk at a time, and the element
/// functions the SIMD kernels (cpu_kernels_simd.hpp, instantiated by cpu_kernels_avx2.hpp and
/// cpu_kernels_avx512.hpp) finish their tails with.
///
/// Every variant evaluates the formulas of cpu_backend.hpp's "Numerics" section: fp32 operations,
/// each rounded on its own, in the order written there, never a fused multiply-add. The compiler
/// may not keep that by itself: GCC fuses `a * b + c` into an FMA whenever the target has one
/// (`-mfma`, `-march=haswell` and later, and always inside an AVX-512 function) in every C++ mode,
/// `-std=c++20` included, across statements and across intrinsics; Clang does within one
/// expression by default and everywhere under `-ffp-contract=fast`. So every product that feeds an
/// addition or subtraction goes through `product` (or its vector twin), which the compiler cannot
/// see through: the bits do not depend on `-ffp-contract`, `-march` or the compiler.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/dtype.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zero::detail::cpu {

/// Returns `x` unchanged, through an empty `asm` the optimizer cannot look into: a product passed
/// through it is rounded to fp32 and never fused with the addition that uses it. Costs no instruction.
inline float no_fuse(float x) noexcept {
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  // Elsewhere a volatile round trip: slower, but no compiler fuses through it.
  volatile float v = x;
  x = v;
#endif
  return x;
}

/// a * b rounded to fp32 on its own (never fused with the addition that uses it).
inline float product(float a, float b) noexcept { return no_fuse(a * b); }

/// The per-call factors of one AdamW step, computed once in fp32 from `adamw_step_args`:
/// step_size = lr / bias_correction1, sqrt_bc2 = sqrt(bias_correction2),
/// decay = 1 - (lr * weight_decay) (the product rounded first), one_minus_beta = 1 - beta.
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
    c.decay = 1.0f - product(a.lr, a.weight_decay);
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

/// One element of the AdamW/Adam step, in the order of cpu_backend.hpp's "Numerics"; every SIMD
/// lane does exactly this.
template <bool AdamW> inline void adamw1(float& p, float& m, float& v, float grad, const adamw_consts& c) noexcept {
  float g = product(grad, c.grad_scale);
  if constexpr (!AdamW) {
    g = g + product(c.weight_decay, p);
  }
  m = product(c.beta1, m) + product(c.one_minus_beta1, g);
  v = product(c.beta2, v) + product(c.one_minus_beta2 * g, g);
  if constexpr (AdamW) {
    p = product(p, c.decay);
  }
  const float denom = std::sqrt(v) / c.sqrt_bc2 + c.eps;
  p = p - c.step_size * m / denom;
}

/// The state an AdamW chunk reads (fp32 master, m, v)...
struct adamw_state_in {
  const float* master;
  const float* m;
  const float* v;
};
/// ...and where it writes the new state: the same pointers to update in place, or buffers that
/// overlap none of the input's (the previous state is then kept).
struct adamw_state_out {
  float* master;
  float* m;
  float* v;
};

/// Elements [i, n) of one AdamW chunk; `param` may be null.
template <bool AdamW, class G, class P>
inline void adamw_tail(const adamw_state_in& in, const adamw_state_out& out, const G* grad, P* param, std::size_t i,
                       std::size_t n, const adamw_consts& c) noexcept {
  for (; i < n; ++i) {
    float p = in.master[i];
    float m = in.m[i];
    float v = in.v[i];
    adamw1<AdamW>(p, m, v, load1(grad + i), c);
    out.m[i] = m;
    out.v[i] = v;
    out.master[i] = p;
    if (param != nullptr) {
      store1(param + i, p);
    }
  }
}

/// Number of interleaved partial sums of `squared_norm` within a chunk: element i of a chunk goes
/// to accumulator i % 16, and the 16 accumulators are then added as a fixed tree
/// (j += j + 8, then j += j + 4, j += j + 2, j += j + 1). Scalar, AVX2 and AVX-512 all follow it.
inline constexpr std::size_t norm_lanes = 16;

/// Adds x[i]^2 (the square rounded first) for i in [i, n) into the interleaved accumulators, lane i % 16.
template <class T> inline void squared_norm_tail(const T* x, std::size_t i, std::size_t n, float* acc) noexcept {
  for (; i < n; ++i) {
    const float f = load1(x + i);
    acc[i % norm_lanes] = acc[i % norm_lanes] + product(f, f);
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

/// Elements [i, n) of a cast chunk: dst[i] = D(src[i]).
template <class S, class D> inline void cast_tail(const S* src, D* dst, std::size_t i, std::size_t n) noexcept {
  for (; i < n; ++i) {
    store1(dst + i, load1(src + i));
  }
}

/// Elements [i, n) of an unscale_and_check chunk: x[i] = T(x[i] * factor); true when a stored value
/// is inf or NaN.
template <class T> inline bool unscale_and_check_tail(T* x, std::size_t i, std::size_t n, float factor) noexcept {
  bool found = false;
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
    found = found || nonfinite1(x + i);
  }
  return found;
}

/// Elements [i, n) of an accumulate chunk: dst[i] = D(float(dst[i]) + float(src[i])).
template <class S, class D> inline void accumulate_tail(const S* src, D* dst, std::size_t i, std::size_t n) noexcept {
  for (; i < n; ++i) {
    store1(dst + i, load1(dst + i) + load1(src + i));
  }
}

/// Elements [i, n) of a scale chunk: x[i] = T(float(x[i]) * factor).
template <class T> inline void scale_tail(T* x, std::size_t i, std::size_t n, float factor) noexcept {
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
  }
}

namespace scalar {

/// The portable chunk kernels, under the names `cpu_backend` dispatches to (the same as
/// `avx2::kernels` and `avx512::kernels`).
struct kernels {
  /// One AdamW chunk of n elements (see adamw1), from `in` to `out`; `param` may be null. `stream`
  /// (non-temporal stores) and `prefetch` mean nothing to the portable loop.
  template <bool AdamW, class G, class P>
  static void adamw(const adamw_state_in& in, const adamw_state_out& out, const G* grad, P* param, std::size_t n,
                    const adamw_consts& c, bool stream = true, std::size_t prefetch = 0) noexcept {
    (void)stream;
    (void)prefetch;
    adamw_tail<AdamW>(in, out, grad, param, 0, n, c);
  }

  /// dst[i] = D(src[i]) for one chunk.
  template <class S, class D> static void cast(const S* src, D* dst, std::size_t n) noexcept {
    cast_tail(src, dst, 0, n);
  }

  /// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
  template <class T> static bool unscale_and_check(T* x, std::size_t n, float factor) noexcept {
    return unscale_and_check_tail(x, 0, n, factor);
  }

  /// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes).
  template <class T> static float squared_norm(const T* x, std::size_t n) noexcept {
    float acc[norm_lanes] = {};
    squared_norm_tail(x, 0, n, acc);
    return reduce_lanes(acc);
  }

  /// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
  template <class S, class D> static void accumulate(const S* src, D* dst, std::size_t n) noexcept {
    accumulate_tail(src, dst, 0, n);
  }

  /// x[i] = T(float(x[i]) * factor) for one chunk.
  template <class T> static void scale(T* x, std::size_t n, float factor) noexcept { scale_tail(x, 0, n, factor); }
};

} // namespace scalar

} // namespace zero::detail::cpu
