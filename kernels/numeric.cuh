#pragma once
/// \file
/// Device-side building blocks shared by zero's kernels: element traits (load and store through fp32,
/// rounding to nearest even), the mapping from zero's storage types to CUDA's, vector packs, the
/// head / body / tail split that lets any pointer alignment use 128-bit accesses, and launch geometry.
///
/// To run zero's kernels on another element type, specialize `element_traits` for it in a `.cu` of your
/// own and call the launch templates of `elementwise.cuh`, `reduce.cuh` and `adamw.cuh` directly.
/// Compile with nvcc in C++20 mode (`-std=c++20`) and without `--use_fast_math` / `-ftz=true`.

#include "zero/core/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda/std/bit>
#include <cuda/std/cstddef>
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <source_location>
#include <string>

namespace zero::cuda::kernels {

/// Conversions of an element type to and from fp32 on the device. Specialize for a new type: `load`
/// must be exact or the type's own widening, `store` must round as the type defines (nearest even).
template <class T> struct element_traits;

/// fp32: the identity.
template <> struct element_traits<float> {
  /// The value as fp32.
  __device__ __forceinline__ static float load(float x) { return x; }
  /// `x` as float.
  __device__ __forceinline__ static float store(float x) { return x; }
};

/// IEEE binary16: widening is exact; narrowing is `cvt.rn` (nearest even, overflow to inf, subnormals kept).
template <> struct element_traits<__half> {
  /// The value as fp32, exactly.
  __device__ __forceinline__ static float load(__half x) { return __half2float(x); }
  /// `x` rounded to nearest even.
  __device__ __forceinline__ static __half store(float x) { return __float2half_rn(x); }
};

/// bfloat16: widening is exact; narrowing rounds to nearest even, NaN stays NaN.
template <> struct element_traits<__nv_bfloat16> {
  /// The value as fp32, exactly.
  __device__ __forceinline__ static float load(__nv_bfloat16 x) { return __bfloat162float(x); }
  /// `x` rounded to nearest even.
  __device__ __forceinline__ static __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
};

/// The CUDA type with the same bits as zero's storage type T (`zero::f16` -> `__half`,
/// `zero::bf16` -> `__nv_bfloat16`, anything else -> itself).
template <class T> struct device_type {
  /// The CUDA type.
  using type = T;
};
/// `zero::f16` is stored as `__half`.
template <> struct device_type<zero::f16> {
  /// The CUDA type.
  using type = __half;
};
/// `zero::bf16` is stored as `__nv_bfloat16`.
template <> struct device_type<zero::bf16> {
  /// The CUDA type.
  using type = __nv_bfloat16;
};
/// Shorthand for `device_type<T>::type`, keeping const.
template <class T>
using device_type_t = ::cuda::std::conditional_t<::cuda::std::is_const_v<T>,
                                                 const typename device_type<::cuda::std::remove_const_t<T>>::type,
                                                 typename device_type<T>::type>;

static_assert(sizeof(__half) == sizeof(zero::f16) && alignof(__half) == alignof(zero::f16),
              "zero::f16 must be bit-compatible with __half");
static_assert(sizeof(__nv_bfloat16) == sizeof(zero::bf16) && alignof(__nv_bfloat16) == alignof(zero::bf16),
              "zero::bf16 must be bit-compatible with __nv_bfloat16");

/// `p` seen as a pointer to the bit-identical CUDA type.
template <class T> [[nodiscard]] device_type_t<T>* to_device(T* p) noexcept {
  return reinterpret_cast<device_type_t<T>*>(p);
}

/// `v` with its bits reinterpreted as the CUDA type (host side).
template <class T> [[nodiscard]] typename device_type<T>::type to_device_value(T v) noexcept {
  typename device_type<T>::type d;
  static_assert(sizeof(d) == sizeof(v));
  std::memcpy(static_cast<void*>(&d), &v, sizeof(v));
  return d;
}

/// Elements one thread handles per vector step in a kernel over the element types `T...`: 16 bytes of the
/// widest type (4 when fp32 is involved, 8 for 16-bit types alone). Each thread's elements are consecutive
/// and consecutive threads take consecutive packs, so every access of a warp is contiguous: a 128-bit
/// access per thread for the widest type, a narrower one (64-bit for 16-bit types beside fp32) for the
/// others. (Eight elements per thread would give the 16-bit streams 128-bit accesses too, but then each
/// fp32 access of a warp covers only every other 16 bytes; on an H200 that cost AdamW 7% of bandwidth.)
template <class... T> inline constexpr int pack_elems = static_cast<int>(16 / std::max({sizeof(T)...}));

/// Threads per block of every elementwise kernel.
inline constexpr int block_threads = 256;

namespace detail {
/// The unsigned type of `Bytes` bytes, for one access of a whole pack.
template <std::size_t Bytes> struct pack_word;
template <> struct pack_word<16> { using type = uint4; };
template <> struct pack_word<8> { using type = uint2; };
template <> struct pack_word<4> { using type = unsigned int; };
template <> struct pack_word<2> { using type = unsigned short; };
} // namespace detail

/// Loads `N` consecutive elements from `p` (aligned to `N * sizeof(T)` bytes) in one access.
template <int N, class T> __device__ __forceinline__ void load_pack(const T* p, T (&out)[N]) {
  using word = typename detail::pack_word<N * sizeof(T)>::type;
  const word raw = *reinterpret_cast<const word*>(p);
  ::memcpy(out, &raw, sizeof(raw));
}

/// Stores `N` consecutive elements to `p` (aligned to `N * sizeof(T)` bytes) in one access.
template <int N, class T> __device__ __forceinline__ void store_pack(T* p, const T (&in)[N]) {
  using word = typename detail::pack_word<N * sizeof(T)>::type;
  word raw;
  ::memcpy(&raw, in, sizeof(raw));
  *reinterpret_cast<word*>(p) = raw;
}

/// Loads a pack and widens it to fp32.
template <int N, class T> __device__ __forceinline__ void load_pack_float(const T* p, float (&out)[N]) {
  T raw[N];
  load_pack<N>(p, raw);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    out[k] = element_traits<T>::load(raw[k]);
  }
}

/// Rounds a pack of fp32 values to T and stores it.
template <int N, class T> __device__ __forceinline__ void store_pack_float(T* p, const float (&in)[N]) {
  T raw[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    raw[k] = element_traits<T>::store(in[k]);
  }
  store_pack<N>(p, raw);
}

/// Whether `p + j` is aligned for an access of `N` elements (a null pointer is aligned everywhere: it is
/// not accessed).
template <int N, class T> [[nodiscard]] bool pack_aligned_at(const T* p, int j) noexcept {
  if (p == nullptr) {
    return true;
  }
  const auto addr = reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(j) * sizeof(T);
  return addr % (N * sizeof(T)) == 0;
}

/// The first element index j in [0, N) at which every pointer is aligned for accesses of N elements, or -1
/// when there is none (the pointers are misaligned relative to each other) or `n` is too small for one
/// pack. A kernel then runs elements [0, j) and the tail scalar and the packs in between vectorized. For
/// buffers 16-byte aligned (cudaMalloc, zero's flat layouts) j is 0.
template <int N, class... T> [[nodiscard]] int common_pack_offset(std::size_t n, const T*... p) noexcept {
  for (int j = 0; j < N; ++j) {
    if ((pack_aligned_at<N>(p, j) && ...)) {
      return n >= static_cast<std::size_t>(j) + N ? j : -1;
    }
  }
  return -1;
}

/// Calls `scalar(i)` or `vector(i)` so that every element of [0, n) is handled exactly once by the grid:
/// with `head >= 0`, `vector(i)` handles the pack [i, i + N) for i = head + k * N (grid-stride over k), and
/// the first `head` and the last few elements go to `scalar(i)` on the first threads; with `head < 0`, a
/// grid-stride loop calls `scalar(i)` for every element. The element-to-thread mapping depends only on `n`,
/// `head` and the grid, which keeps reductions built on it deterministic.
template <int N, class Scalar, class Vector>
__device__ __forceinline__ void for_each_element(::cuda::std::size_t n, int head, Scalar&& scalar, Vector&& vector) {
  const ::cuda::std::size_t tid = static_cast<::cuda::std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const ::cuda::std::size_t stride = static_cast<::cuda::std::size_t>(gridDim.x) * blockDim.x;
  if (head < 0) {
    for (::cuda::std::size_t i = tid; i < n; i += stride) {
      scalar(i);
    }
    return;
  }
  const auto h = static_cast<::cuda::std::size_t>(head);
  const ::cuda::std::size_t packs = (n - h) / N;
  for (::cuda::std::size_t k = tid; k < packs; k += stride) {
    vector(h + k * N);
  }
  const ::cuda::std::size_t tail_begin = h + packs * N;
  if (tid < h) {
    scalar(tid);
  }
  if (tid < n - tail_begin) {
    scalar(tail_begin + tid);
  }
}

/// Number of work items (packs of N, or elements on the scalar path) of a launch over n elements.
[[nodiscard]] inline std::size_t work_items(std::size_t n, int head, int N) noexcept {
  return head < 0 ? n : (n - static_cast<std::size_t>(head)) / static_cast<std::size_t>(N);
}

/// Blocks of `block_threads` for a launch over `items` work items: enough for one item per thread (capped at
/// CUDA's grid limit, past which the kernels' grid-stride loops take the rest). Measured on an H200 for the
/// fused AdamW: 0.98 of copy bandwidth this way, 0.81-0.91 with a grid of only the resident blocks looping
/// (as a persistent grid-stride kernel would), whose threads drift apart over memory.
[[nodiscard]] inline unsigned grid_blocks(std::size_t items) noexcept {
  constexpr std::size_t max_blocks = 0x7fffffff;
  const std::size_t needed = (items + block_threads - 1) / block_threads;
  return static_cast<unsigned>(std::clamp<std::size_t>(needed, 1, max_blocks));
}

/// Throws `usage_error` naming `what` and `function` when `p` is null while `n > 0`.
inline void require_buffer(const void* p, std::size_t n, const char* function, const char* what) {
  if (p == nullptr && n > 0) {
    throw zero::usage_error(std::string(function) + ": " + what + " is null with n = " + std::to_string(n));
  }
}

/// Checks the launch just made (`cudaGetLastError`), naming the kernel and the launcher's file:line.
/// \throws cuda_error with the launch's status.
inline void check_launch(const char* kernel, const std::source_location& loc = std::source_location::current()) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw zero::cuda_error(std::string("launch of ") + kernel + " at " + zero::detail::where(loc) +
                               " failed: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")",
                           static_cast<int>(status));
  }
}

} // namespace zero::cuda::kernels
