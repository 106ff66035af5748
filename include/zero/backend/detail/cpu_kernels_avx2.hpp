#pragma once
/// \file
/// The AVX2 kernels of `zero::cpu_backend` (8 fp32 lanes; F16C for fp16): `avx2::vec`, the
/// operations on 8 lanes, and the kernels of cpu_kernels_simd.hpp over it, all compiled through
/// `__attribute__((target(...)))` so the rest of the program needs no `-mavx2`, and called only when
/// `has_avx2()` says the CPU has them. Each kernel gives the bits of its scalar twin in
/// cpu_kernels_scalar.hpp.

#include "zero/backend/detail/cpu_features.hpp"
#include "zero/backend/detail/cpu_kernels_scalar.hpp"

#if ZERO_CPU_X86_SIMD

#include <immintrin.h>

#define ZERO_TARGET_AVX2 __attribute__((target("avx2,f16c")))

namespace zero::detail::cpu::avx2 {

/// 8 fp32 lanes: what cpu_kernels_simd.hpp needs of a vector type.
struct vec {
  /// The register: 8 floats, with GCC's and Clang's vector operators.
  using reg = __m256;
  /// Floats per register.
  static constexpr std::size_t lanes = 8;

  ZERO_TARGET_AVX2 static reg set1(float x) noexcept { return _mm256_set1_ps(x); }
  ZERO_TARGET_AVX2 static reg zero() noexcept { return _mm256_setzero_ps(); }
  ZERO_TARGET_AVX2 static reg sqrt(reg x) noexcept { return _mm256_sqrt_ps(x); }

  /// Loads 8 floats.
  ZERO_TARGET_AVX2 static reg load(const float* p) noexcept { return _mm256_loadu_ps(p); }
  /// Loads 8 bf16 as fp32 (exact).
  ZERO_TARGET_AVX2 static reg load(const bf16* p) noexcept {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }

  /// Loads 8 f16 as fp32 (exact), as `f16::to_float`.
  ZERO_TARGET_AVX2 static reg load(const f16* p) noexcept {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m256 f = _mm256_cvtph_ps(h);
    // dtype.hpp keeps a signalling NaN signalling (quiet bit clear); vcvtph2ps may set the quiet bit.
    // Clear it again in exactly those lanes so every variant gives dtype.hpp's bits.
    const __m256i w = _mm256_cvtepu16_epi32(h);
    const __m256i is_nan_exp =
        _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x7e00)), _mm256_set1_epi32(0x7c00));
    const __m256i mant_zero =
        _mm256_cmpeq_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x01ff)), _mm256_setzero_si256());
    const __m256i snan = _mm256_andnot_si256(mant_zero, is_nan_exp);
    const __m256i clear = _mm256_and_si256(snan, _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_andnot_si256(clear, _mm256_castps_si256(f)));
  }

  /// Rounds 8 floats to bf16 bits (ties to even, NaN kept quiet), as `bf16::from_float`.
  ZERO_TARGET_AVX2 static __m128i to_bf16_bits(__m256 x) noexcept {
    const __m256i b = _mm256_castps_si256(x);
    const __m256i abs = _mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff));
    const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    const __m256i hi = _mm256_srli_epi32(b, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i nan = _mm256_or_si256(hi, _mm256_set1_epi32(0x0040));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Every lane is <= 0xffff, so the unsigned-saturating pack is exact; it packs within 128-bit
    // halves, and the permute brings the two halves' results together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    return _mm256_castsi256_si128(packed);
  }

  /// Rounds 8 floats to f16 bits (ties to even, subnormals, overflow to inf), as `f16::from_float`.
  ZERO_TARGET_AVX2 static __m128i to_f16_bits(__m256 x) noexcept {
    // vcvtps2ph keeps NaN payload bits that dtype.hpp drops: give NaN lanes the canonical quiet NaN
    // of their sign first, which both convert to sign | 0x7e00.
    const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    const __m256 canon =
        _mm256_or_ps(_mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)))),
                     _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)));
    return _mm256_cvtps_ph(_mm256_blendv_ps(x, canon, is_nan), _MM_FROUND_TO_NEAREST_INT);
  }

  /// Stores 8 floats as `T` (rounding to nearest even for the half types).
  /// Stores 8 floats past the caches (a non-temporal store: no read of the line first), at an
  /// address aligned to `stream_alignment`; `fence` orders such stores before later ones.
  static constexpr std::size_t stream_alignment = 32;
  ZERO_TARGET_AVX2 static void stream(float* p, reg x) noexcept { _mm256_stream_ps(p, x); }
  /// The same for 8 floats rounded to bf16 or f16, at an address aligned to 16 bytes.
  ZERO_TARGET_AVX2 static void stream(bf16* p, reg x) noexcept {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits(x));
  }
  ZERO_TARGET_AVX2 static void stream(f16* p, reg x) noexcept {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_f16_bits(x));
  }
  ZERO_TARGET_AVX2 static void fence() noexcept { _mm_sfence(); }
  ZERO_TARGET_AVX2 static void store(float* p, reg x) noexcept { _mm256_storeu_ps(p, x); }
  ZERO_TARGET_AVX2 static void store(bf16* p, reg x) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16_bits(x));
  }
  ZERO_TARGET_AVX2 static void store(f16* p, reg x) noexcept {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_f16_bits(x));
  }

  /// Stores 8 floats as `T`; nonzero when a stored value is inf or NaN.
  template <class T> ZERO_TARGET_AVX2 static unsigned store_check(T* p, reg x) noexcept {
    if constexpr (std::is_same_v<T, float>) {
      _mm256_storeu_ps(p, x);
      const __m256i e = _mm256_set1_epi32(0x7f800000);
      return static_cast<unsigned>(
          _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(x), e), e)));
    } else {
      const __m128i h = std::is_same_v<T, f16> ? to_f16_bits(x) : to_bf16_bits(x);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
      const __m128i e = _mm_set1_epi16(static_cast<short>(std::is_same_v<T, f16> ? 0x7c00 : 0x7f80));
      return static_cast<unsigned>(_mm_movemask_epi8(_mm_cmpeq_epi16(_mm_and_si128(h, e), e)));
    }
  }
};

} // namespace zero::detail::cpu::avx2

#define ZERO_CPU_SIMD_NS avx2
#define ZERO_CPU_SIMD_TARGET ZERO_TARGET_AVX2
#include "zero/backend/detail/cpu_kernels_simd.hpp"
#undef ZERO_CPU_SIMD_TARGET
#undef ZERO_CPU_SIMD_NS
#undef ZERO_TARGET_AVX2

#endif // ZERO_CPU_X86_SIMD
