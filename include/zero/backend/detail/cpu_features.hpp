#pragma once
/// \file
/// Which SIMD code paths `zero::cpu_backend` may take on this CPU, asked at run time.

#include <cstdint>

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__))
/// 1 when the AVX2 and AVX-512 kernels are compiled in (x86-64 with GCC or Clang), 0 otherwise.
#define ZERO_CPU_X86_SIMD 1
#include <cpuid.h>
#else
#define ZERO_CPU_X86_SIMD 0
#endif

namespace zero::detail::cpu {

/// True when the CPU has F16C (CPUID leaf 1, ECX bit 29); asked through CPUID because older
/// Clang releases do not know "f16c" in `__builtin_cpu_supports`.
inline bool has_f16c() noexcept {
#if ZERO_CPU_X86_SIMD
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
#else
  return false;
#endif
}

/// True when the AVX2 kernels may run: AVX2 (whose check includes the OS saving the YMM state) and F16C.
inline bool has_avx2() noexcept {
#if ZERO_CPU_X86_SIMD
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && has_f16c();
#else
  return false;
#endif
}

/// True when the AVX-512 kernels may run: AVX-512F and AVX-512BW (and what AVX2 needs).
inline bool has_avx512() noexcept {
#if ZERO_CPU_X86_SIMD
  __builtin_cpu_init();
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
#else
  return false;
#endif
}

} // namespace zero::detail::cpu
