#pragma once
/// \file
/// The AVX-512 kernels of `zero::cpu_backend` (16 fp32 lanes; AVX-512F and AVX-512BW), compiled
/// through `__attribute__((target(...)))` and called only when `has_avx512()` says the CPU has them.
/// Each function computes exactly what its scalar twin in cpu_kernels_scalar.hpp computes, bit for
/// bit, whatever the compiler's -ffp-contract (see there).

#include "zero/backend/detail/cpu_features.hpp"
#include "zero/backend/detail/cpu_kernels_scalar.hpp"

#if ZERO_CPU_X86_SIMD

#include <immintrin.h>

// GCC 12.1/12.2 warn "may be used uninitialized" inside avx512fintrin.h's _mm512_undefined_*()
// placeholders when its intrinsics are inlined (GCC bug 105593, fixed in 12.3); silence that
// false positive for this file's functions only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#define ZERO_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx2,f16c")))

namespace zero::detail::cpu::avx512 {

/// Loads 16 elements as fp32.
ZERO_TARGET_AVX512 inline __m512 load16(const float* p) noexcept { return _mm512_loadu_ps(p); }

ZERO_TARGET_AVX512 inline __m512 load16(const bf16* p) noexcept {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

ZERO_TARGET_AVX512 inline __m512 load16(const f16* p) noexcept {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512i f = _mm512_castps_si512(_mm512_cvtph_ps(h));
  // Keep signalling NaNs signalling, as dtype.hpp does (see the AVX2 twin).
  const __m512i w = _mm512_cvtepu16_epi32(h);
  const __mmask16 nan_exp =
      _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, _mm512_set1_epi32(0x7e00)), _mm512_set1_epi32(0x7c00));
  const __mmask16 snan = _mm512_mask_test_epi32_mask(nan_exp, w, _mm512_set1_epi32(0x01ff));
  return _mm512_castsi512_ps(_mm512_mask_and_epi32(f, snan, f, _mm512_set1_epi32(~0x00400000)));
}

/// Rounds 16 floats to bf16 bits (ties to even, NaN kept quiet), as `bf16::from_float`.
ZERO_TARGET_AVX512 inline __m256i to_bf16_bits(__m512 x) noexcept {
  const __m512i b = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i hi = _mm512_srli_epi32(b, 16);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  const __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x0040));
  return _mm512_cvtepi32_epi16(r); // every lane <= 0xffff: truncation is exact
}

/// Rounds 16 floats to f16 bits (ties to even, subnormals, overflow to inf), as `f16::from_float`.
ZERO_TARGET_AVX512 inline __m256i to_f16_bits(__m512 x) noexcept {
  // Canonical quiet NaN of the lane's sign, as in the AVX2 twin.
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i b = _mm512_castps_si512(x);
  const __m512i canon = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                                        _mm512_set1_epi32(0x7fc00000));
  const __m512 y = _mm512_castsi512_ps(_mm512_mask_mov_epi32(b, is_nan, canon));
  return _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
}

/// Stores 16 floats as `T` (rounding to nearest even for the half types).
ZERO_TARGET_AVX512 inline void store16(float* p, __m512 x) noexcept { _mm512_storeu_ps(p, x); }
ZERO_TARGET_AVX512 inline void store16(bf16* p, __m512 x) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(x));
}
ZERO_TARGET_AVX512 inline void store16(f16* p, __m512 x) noexcept {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_f16_bits(x));
}

/// Stores 16 floats as `T` and returns a nonzero mask where the stored value is inf or NaN.
template <class T> ZERO_TARGET_AVX512 inline unsigned store16_check(T* p, __m512 x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    _mm512_storeu_ps(p, x);
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    return _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(x), e), e);
  } else {
    __m256i h;
    if constexpr (std::is_same_v<T, f16>) {
      h = to_f16_bits(x);
    } else {
      h = to_bf16_bits(x);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
    const __m256i e = _mm256_set1_epi16(static_cast<short>(std::is_same_v<T, f16> ? 0x7c00 : 0x7f80));
    return static_cast<unsigned>(_mm256_movemask_epi8(_mm256_cmpeq_epi16(_mm256_and_si256(h, e), e)));
  }
}

/// a * b rounded to fp32 on its own: the empty asm hides the product from the optimizer, which
/// would otherwise fuse it with the addition that uses it into an FMA (see cpu_kernels_scalar.hpp).
ZERO_TARGET_AVX512 inline __m512 product(__m512 a, __m512 b) noexcept {
  __m512 p = _mm512_mul_ps(a, b);
  __asm__("" : "+v"(p));
  return p;
}

/// One AdamW chunk of n elements (see adamw1); `param` may be null.
template <bool AdamW, class G, class P>
ZERO_TARGET_AVX512 inline void adamw_chunk(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                                           const adamw_consts& c) noexcept {
  const __m512 beta1 = _mm512_set1_ps(c.beta1);
  const __m512 beta2 = _mm512_set1_ps(c.beta2);
  const __m512 omb1 = _mm512_set1_ps(c.one_minus_beta1);
  const __m512 omb2 = _mm512_set1_ps(c.one_minus_beta2);
  const __m512 eps = _mm512_set1_ps(c.eps);
  const __m512 wd = _mm512_set1_ps(c.weight_decay);
  const __m512 gscale = _mm512_set1_ps(c.grad_scale);
  const __m512 step = _mm512_set1_ps(c.step_size);
  const __m512 sqrt_bc2 = _mm512_set1_ps(c.sqrt_bc2);
  const __m512 decay = _mm512_set1_ps(c.decay);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 p = _mm512_loadu_ps(master + i);
    __m512 g = product(load16(grad + i), gscale);
    if constexpr (!AdamW) {
      g = _mm512_add_ps(g, product(wd, p));
    }
    const __m512 mi = _mm512_add_ps(product(beta1, _mm512_loadu_ps(m + i)), product(omb1, g));
    const __m512 vi = _mm512_add_ps(product(beta2, _mm512_loadu_ps(v + i)), product(_mm512_mul_ps(omb2, g), g));
    if constexpr (AdamW) {
      p = product(p, decay);
    }
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), sqrt_bc2), eps);
    p = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step, mi), denom));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(master + i, p);
    if (param != nullptr) {
      store16(param + i, p);
    }
  }
  adamw_tail<AdamW>(master, m, v, grad, param, i, n, c);
}

/// dst[i] = D(src[i]) for one chunk.
template <class S, class D> ZERO_TARGET_AVX512 inline void cast_chunk(const S* src, D* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store16(dst + i, load16(src + i));
  }
  for (; i < n; ++i) {
    store1(dst + i, load1(src + i));
  }
}

/// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
template <class T> ZERO_TARGET_AVX512 inline bool unscale_and_check_chunk(T* x, std::size_t n, float factor) noexcept {
  const __m512 f = _mm512_set1_ps(factor);
  unsigned found = 0;
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    found |= store16_check(x + i, _mm512_mul_ps(load16(x + i), f));
  }
  bool tail = false;
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
    tail = tail || nonfinite1(x + i);
  }
  return found != 0 || tail;
}

/// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes).
template <class T> ZERO_TARGET_AVX512 inline float squared_norm_chunk(const T* x, std::size_t n) noexcept {
  __m512 acc16 = _mm512_setzero_ps(); // lane j holds the interleaved accumulator j (see norm_lanes)
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = load16(x + i);
    acc16 = _mm512_add_ps(acc16, product(a, a));
  }
  alignas(64) float acc[norm_lanes];
  _mm512_store_ps(acc, acc16);
  squared_norm_tail(x, i, n, acc);
  return reduce_lanes(acc);
}

/// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
template <class S, class D>
ZERO_TARGET_AVX512 inline void accumulate_chunk(const S* src, D* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store16(dst + i, _mm512_add_ps(load16(dst + i), load16(src + i)));
  }
  for (; i < n; ++i) {
    store1(dst + i, load1(dst + i) + load1(src + i));
  }
}

/// x[i] = T(float(x[i]) * factor) for one chunk.
template <class T> ZERO_TARGET_AVX512 inline void scale_chunk(T* x, std::size_t n, float factor) noexcept {
  const __m512 f = _mm512_set1_ps(factor);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store16(x + i, _mm512_mul_ps(load16(x + i), f));
  }
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
  }
}

} // namespace zero::detail::cpu::avx512

#undef ZERO_TARGET_AVX512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif // ZERO_CPU_X86_SIMD
