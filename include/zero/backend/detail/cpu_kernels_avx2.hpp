#pragma once
/// \file
/// The AVX2 kernels of `zero::cpu_backend` (8 fp32 lanes; F16C for fp16), compiled through
/// `__attribute__((target(...)))` so the rest of the program needs no `-mavx2`, and called only
/// when `has_avx2()` says the CPU has them. Each function computes exactly what its scalar twin in
/// cpu_kernels_scalar.hpp computes, bit for bit, whatever the compiler's -ffp-contract (see there).

#include "zero/backend/detail/cpu_features.hpp"
#include "zero/backend/detail/cpu_kernels_scalar.hpp"

#if ZERO_CPU_X86_SIMD

#include <immintrin.h>

#define ZERO_TARGET_AVX2 __attribute__((target("avx2,f16c")))

namespace zero::detail::cpu::avx2 {

/// Loads 8 elements as fp32.
ZERO_TARGET_AVX2 inline __m256 load8(const float* p) noexcept { return _mm256_loadu_ps(p); }

ZERO_TARGET_AVX2 inline __m256 load8(const bf16* p) noexcept {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

ZERO_TARGET_AVX2 inline __m256 load8(const f16* p) noexcept {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256 f = _mm256_cvtph_ps(h);
  // dtype.hpp keeps a signalling NaN signalling (quiet bit clear); vcvtph2ps may set the quiet bit.
  // Clear it again in exactly those lanes so every variant gives dtype.hpp's bits.
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i is_nan_exp =
      _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)), _mm256_set1_epi32(0x7c00));
  const __m256i mant_zero = _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x01ff)), _mm256_setzero_si256());
  const __m256i snan = _mm256_andnot_si256(mant_zero, is_nan_exp);
  const __m256i clear = _mm256_and_si256(snan, _mm256_set1_epi32(0x00400000));
  return _mm256_castsi256_ps(_mm256_andnot_si256(clear, _mm256_castps_si256(f)));
}

/// Rounds 8 floats to bf16 bits (ties to even, NaN kept quiet), as `bf16::from_float`.
ZERO_TARGET_AVX2 inline __m128i to_bf16_bits(__m256 x) noexcept {
  const __m256i b = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i hi = _mm256_srli_epi32(b, 16);
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
  const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
  // Every lane is <= 0xffff, so the unsigned-saturating pack is exact; it packs within 128-bit
  // halves, and the permute brings the two halves' results together.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

/// Rounds 8 floats to f16 bits (ties to even, subnormals, overflow to inf), as `f16::from_float`.
ZERO_TARGET_AVX2 inline __m128i to_f16_bits(__m256 x) noexcept {
  // vcvtps2ph keeps NaN payload bits that dtype.hpp drops: give NaN lanes the canonical quiet NaN
  // of their sign first, which both convert to sign | 0x7e00.
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 canon =
      _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)))),
                   _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
  return _mm256_cvtps_ph(_mm256_blendv_ps(x, canon, is_nan), _MM_FROUND_TO_NEAREST_INT);
}

/// Stores 8 floats as `T` (rounding to nearest even for the half types).
ZERO_TARGET_AVX2 inline void store8(float* p, __m256 x) noexcept { _mm256_storeu_ps(p, x); }
ZERO_TARGET_AVX2 inline void store8(bf16* p, __m256 x) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits(x));
}
ZERO_TARGET_AVX2 inline void store8(f16* p, __m256 x) noexcept {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_f16_bits(x));
}

/// Stores 8 floats as `T` and returns a mask whose bits are set where the stored value is inf or NaN.
template <class T> ZERO_TARGET_AVX2 inline int store8_check(T* p, __m256 x) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    _mm256_storeu_ps(p, x);
    const __m256i e = _mm256_set1_epi32(0x7f800000);
    return _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), e), e));
  } else {
    const __m128i h = std::is_same_v<T, f16> ? to_f16_bits(x) : to_bf16_bits(x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
    const __m128i e = _mm_set1_epi16(static_cast<short>(std::is_same_v<T, f16> ? 0x7c00 : 0x7f80));
    return _mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, e), e));
  }
}

/// a * b rounded to fp32 on its own: the empty asm hides the product from the optimizer, which
/// would otherwise fuse it with the addition that uses it into an FMA (see cpu_kernels_scalar.hpp).
ZERO_TARGET_AVX2 inline __m256 product(__m256 a, __m256 b) noexcept {
  __m256 p = _mm256_mul_ps(a, b);
  __asm__("" : "+x"(p));
  return p;
}

/// One AdamW chunk of n elements (see adamw1); `param` may be null.
template <bool AdamW, class G, class P>
ZERO_TARGET_AVX2 inline void adamw_chunk(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                                         const adamw_consts& c) noexcept {
  const __m256 beta1 = _mm256_set1_ps(c.beta1);
  const __m256 beta2 = _mm256_set1_ps(c.beta2);
  const __m256 omb1 = _mm256_set1_ps(c.one_minus_beta1);
  const __m256 omb2 = _mm256_set1_ps(c.one_minus_beta2);
  const __m256 eps = _mm256_set1_ps(c.eps);
  const __m256 wd = _mm256_set1_ps(c.weight_decay);
  const __m256 gscale = _mm256_set1_ps(c.grad_scale);
  const __m256 step = _mm256_set1_ps(c.step_size);
  const __m256 sqrt_bc2 = _mm256_set1_ps(c.sqrt_bc2);
  const __m256 decay = _mm256_set1_ps(c.decay);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 p = _mm256_loadu_ps(master + i);
    __m256 g = product(load8(grad + i), gscale);
    if constexpr (!AdamW) {
      g = _mm256_add_ps(g, product(wd, p));
    }
    const __m256 mi = _mm256_add_ps(product(beta1, _mm256_loadu_ps(m + i)), product(omb1, g));
    const __m256 vi = _mm256_add_ps(product(beta2, _mm256_loadu_ps(v + i)), product(_mm256_mul_ps(omb2, g), g));
    if constexpr (AdamW) {
      p = product(p, decay);
    }
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), sqrt_bc2), eps);
    p = _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(step, mi), denom));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(master + i, p);
    if (param != nullptr) {
      store8(param + i, p);
    }
  }
  adamw_tail<AdamW>(master, m, v, grad, param, i, n, c);
}

/// dst[i] = D(src[i]) for one chunk.
template <class S, class D> ZERO_TARGET_AVX2 inline void cast_chunk(const S* src, D* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(dst + i, load8(src + i));
  }
  for (; i < n; ++i) {
    store1(dst + i, load1(src + i));
  }
}

/// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
template <class T> ZERO_TARGET_AVX2 inline bool unscale_and_check_chunk(T* x, std::size_t n, float factor) noexcept {
  const __m256 f = _mm256_set1_ps(factor);
  int found = 0;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    found |= store8_check(x + i, _mm256_mul_ps(load8(x + i), f));
  }
  bool tail = false;
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
    tail = tail || nonfinite1(x + i);
  }
  return found != 0 || tail;
}

/// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes).
template <class T> ZERO_TARGET_AVX2 inline float squared_norm_chunk(const T* x, std::size_t n) noexcept {
  // Accumulators for lanes 0-7 and 8-15 of the interleaved order (see norm_lanes).
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = load8(x + i);
    const __m256 b = load8(x + i + 8);
    acc0 = _mm256_add_ps(acc0, product(a, a));
    acc1 = _mm256_add_ps(acc1, product(b, b));
  }
  alignas(32) float acc[norm_lanes];
  _mm256_store_ps(acc, acc0);
  _mm256_store_ps(acc + 8, acc1);
  squared_norm_tail(x, i, n, acc);
  return reduce_lanes(acc);
}

/// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
template <class S, class D>
ZERO_TARGET_AVX2 inline void accumulate_chunk(const S* src, D* dst, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(dst + i, _mm256_add_ps(load8(dst + i), load8(src + i)));
  }
  for (; i < n; ++i) {
    store1(dst + i, load1(dst + i) + load1(src + i));
  }
}

/// x[i] = T(float(x[i]) * factor) for one chunk.
template <class T> ZERO_TARGET_AVX2 inline void scale_chunk(T* x, std::size_t n, float factor) noexcept {
  const __m256 f = _mm256_set1_ps(factor);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    store8(x + i, _mm256_mul_ps(load8(x + i), f));
  }
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
  }
}

} // namespace zero::detail::cpu::avx2

#undef ZERO_TARGET_AVX2

#endif // ZERO_CPU_X86_SIMD
