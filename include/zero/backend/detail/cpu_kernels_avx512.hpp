#pragma once
/// \file
/// The AVX-512 kernels of `zero::cpu_backend` (16 fp32 lanes; AVX-512F and AVX-512BW):
/// `avx512::vec`, the operations on 16 lanes, and the kernels of cpu_kernels_simd.hpp over it, all
/// compiled through `__attribute__((target(...)))` and called only when `has_avx512()` says the CPU
/// has them. Each kernel gives the bits of its scalar twin in cpu_kernels_scalar.hpp (AVX-512F has
/// FMA instructions, which the compiler would use for `a * b + c` if `product` did not stop it).

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

/// 16 fp32 lanes: what cpu_kernels_simd.hpp needs of a vector type.
struct vec {
  /// The register: 16 floats, with GCC's and Clang's vector operators.
  using reg = __m512;
  /// Floats per register.
  static constexpr std::size_t lanes = 16;

  ZERO_TARGET_AVX512 static reg set1(float x) noexcept { return _mm512_set1_ps(x); }
  ZERO_TARGET_AVX512 static reg zero() noexcept { return _mm512_setzero_ps(); }
  ZERO_TARGET_AVX512 static reg sqrt(reg x) noexcept { return _mm512_sqrt_ps(x); }

  /// Loads 16 floats.
  ZERO_TARGET_AVX512 static reg load(const float* p) noexcept { return _mm512_loadu_ps(p); }
  /// Loads 16 bf16 as fp32 (exact).
  ZERO_TARGET_AVX512 static reg load(const bf16* p) noexcept {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }

  /// Loads 16 f16 as fp32 (exact), as `f16::to_float`.
  ZERO_TARGET_AVX512 static reg load(const f16* p) noexcept {
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
  ZERO_TARGET_AVX512 static __m256i to_bf16_bits(__m512 x) noexcept {
    const __m512i b = _mm512_castps_si512(x);
    const __m512i abs = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(abs, _mm512_set1_epi32(0x7f800000));
    const __m512i hi = _mm512_srli_epi32(b, 16);
    const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(0x0040));
    return _mm512_cvtepi32_epi16(r); // every lane <= 0xffff: truncation is exact
  }

  /// Rounds 16 floats to f16 bits (ties to even, subnormals, overflow to inf), as `f16::from_float`.
  ZERO_TARGET_AVX512 static __m256i to_f16_bits(__m512 x) noexcept {
    // Canonical quiet NaN of the lane's sign, as in the AVX2 twin.
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i b = _mm512_castps_si512(x);
    const __m512i canon = _mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0x80000000u))),
                                          _mm512_set1_epi32(0x7fc00000));
    const __m512 y = _mm512_castsi512_ps(_mm512_mask_mov_epi32(b, is_nan, canon));
    return _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
  }

  /// Stores 16 floats as `T` (rounding to nearest even for the half types).
  /// Stores 16 floats past the caches (a non-temporal store: no read of the line first), at an
  /// address aligned to `stream_alignment`; `fence` orders such stores before later ones.
  static constexpr std::size_t stream_alignment = 64;
  ZERO_TARGET_AVX512 static void stream(float* p, reg x) noexcept { _mm512_stream_ps(p, x); }
  /// The same for 16 floats rounded to bf16 or f16, at an address aligned to 32 bytes.
  ZERO_TARGET_AVX512 static void stream(bf16* p, reg x) noexcept {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(x));
  }
  ZERO_TARGET_AVX512 static void stream(f16* p, reg x) noexcept {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_f16_bits(x));
  }
  ZERO_TARGET_AVX512 static void fence() noexcept { _mm_sfence(); }
  ZERO_TARGET_AVX512 static void store(float* p, reg x) noexcept { _mm512_storeu_ps(p, x); }
  ZERO_TARGET_AVX512 static void store(bf16* p, reg x) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16_bits(x));
  }
  ZERO_TARGET_AVX512 static void store(f16* p, reg x) noexcept {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_f16_bits(x));
  }

  /// Stores 16 floats as `T`; nonzero when a stored value is inf or NaN.
  template <class T> ZERO_TARGET_AVX512 static unsigned store_check(T* p, reg x) noexcept {
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
};

} // namespace zero::detail::cpu::avx512

#define ZERO_CPU_SIMD_NS avx512
#define ZERO_CPU_SIMD_TARGET ZERO_TARGET_AVX512
#include "zero/backend/detail/cpu_kernels_simd.hpp"
#undef ZERO_CPU_SIMD_TARGET
#undef ZERO_CPU_SIMD_NS
#undef ZERO_TARGET_AVX512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif // ZERO_CPU_X86_SIMD
