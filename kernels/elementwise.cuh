#pragma once
/// \file
/// Elementwise kernels and their launch templates over CUDA element types: fill, cast and
/// unscale-and-check. `zero::cuda::fill` / `cast` / `unscale_and_check` (cuda_kernels.hpp) are these,
/// instantiated for float, __half and __nv_bfloat16. Any type with an `element_traits` specialization works.
///
/// Every launch template enqueues one kernel on `stream`, allocates nothing, and throws `cuda_error` if the
/// launch fails; buffers are read and written in `stream` order.

#include "numeric.cuh"

namespace zero::cuda::kernels {

/// True when the fp32 value is neither inf nor NaN (exponent bits not all ones).
__device__ __forceinline__ bool is_finite(float x) { return (__float_as_uint(x) & 0x7f800000u) != 0x7f800000u; }

/// `data[i] = value` over [0, n).
template <class T>
__global__ void __launch_bounds__(block_threads)
    fill_kernel(T* __restrict__ data, ::cuda::std::size_t n, int head, T value) {
  constexpr int N = pack_elems<T>;
  T pack[N];
#pragma unroll
  for (int k = 0; k < N; ++k) {
    pack[k] = value;
  }
  for_each_element<N>(
      n, head, [&](::cuda::std::size_t i) { data[i] = value; },
      [&](::cuda::std::size_t i) { store_pack<N>(data + i, pack); });
}

/// `dst[i] = D(src[i])` over [0, n); a bit copy when S and D are the same type.
template <class S, class D>
__global__ void __launch_bounds__(block_threads)
    cast_kernel(const S* __restrict__ src, D* __restrict__ dst, ::cuda::std::size_t n, int head) {
  constexpr int N = pack_elems<S, D>;
  if constexpr (::cuda::std::is_same_v<S, D>) {
    for_each_element<N>(
        n, head, [&](::cuda::std::size_t i) { dst[i] = src[i]; },
        [&](::cuda::std::size_t i) {
          S pack[N];
          load_pack<N>(src + i, pack);
          store_pack<N>(dst + i, pack);
        });
  } else {
    for_each_element<N>(
        n, head, [&](::cuda::std::size_t i) { dst[i] = element_traits<D>::store(element_traits<S>::load(src[i])); },
        [&](::cuda::std::size_t i) {
          float pack[N];
          load_pack_float<N>(src + i, pack);
          store_pack_float<N>(dst + i, pack);
        });
  }
}

/// `x[i] = T(float(x[i]) * scale)` over [0, n); `*flag = 1` if an input or a rounded output is not finite.
template <class T>
__global__ void __launch_bounds__(block_threads)
    unscale_and_check_kernel(T* __restrict__ x, ::cuda::std::size_t n, int head, float scale, int* __restrict__ flag) {
  constexpr int N = pack_elems<T>;
  bool bad = false;
  // Check the value after rounding to T: a finite fp32 product can still overflow f16.
  auto one = [&](float in) {
    const T out = element_traits<T>::store(__fmul_rn(in, scale));
    bad |= !(is_finite(in) && is_finite(element_traits<T>::load(out)));
    return out;
  };
  for_each_element<N>(
      n, head, [&](::cuda::std::size_t i) { x[i] = one(element_traits<T>::load(x[i])); },
      [&](::cuda::std::size_t i) {
        T pack[N];
        load_pack<N>(x + i, pack);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          pack[k] = one(element_traits<T>::load(pack[k]));
        }
        store_pack<N>(x + i, pack);
      });
  // One store per block that saw a non-finite value; every writer stores the same 1, so no atomics.
  if (__syncthreads_or(bad) != 0 && threadIdx.x == 0) {
    *flag = 1;
  }
}

/// `dst[i] = D(float(dst[i]) + float(src[i]))` over [0, n): gradient accumulation.
template <class S, class D>
__global__ void __launch_bounds__(block_threads)
    accumulate_kernel(const S* __restrict__ src, D* __restrict__ dst, ::cuda::std::size_t n, int head) {
  constexpr int N = pack_elems<S, D>;
  for_each_element<N>(
      n, head,
      [&](::cuda::std::size_t i) {
        dst[i] = element_traits<D>::store(__fadd_rn(element_traits<D>::load(dst[i]), element_traits<S>::load(src[i])));
      },
      [&](::cuda::std::size_t i) {
        float a[N];
        float b[N];
        load_pack_float<N>(dst + i, a);
        load_pack_float<N>(src + i, b);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          a[k] = __fadd_rn(a[k], b[k]);
        }
        store_pack_float<N>(dst + i, a);
      });
}

/// `x[i] = T(float(x[i]) * factor)` over [0, n).
template <class T>
__global__ void __launch_bounds__(block_threads)
    scale_kernel(T* __restrict__ x, ::cuda::std::size_t n, int head, float factor) {
  constexpr int N = pack_elems<T>;
  for_each_element<N>(
      n, head,
      [&](::cuda::std::size_t i) { x[i] = element_traits<T>::store(__fmul_rn(element_traits<T>::load(x[i]), factor)); },
      [&](::cuda::std::size_t i) {
        float a[N];
        load_pack_float<N>(x + i, a);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          a[k] = __fmul_rn(a[k], factor);
        }
        store_pack_float<N>(x + i, a);
      });
}

/// Enqueues `fill_kernel` on `stream` (see zero::cuda::fill).
/// \throws usage_error for a null `data` with `n > 0`; cuda_error if the launch fails.
template <class T> void launch_fill(T* data, std::size_t n, T value, cudaStream_t stream) {
  require_buffer(data, n, "zero::cuda::fill", "data");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<T>;
  const int head = common_pack_offset<N>(n, static_cast<const T*>(data));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  fill_kernel<T><<<grid, block_threads, 0, stream>>>(data, n, head, value);
  check_launch("zero::cuda::kernels::fill_kernel");
}

/// Enqueues `cast_kernel` on `stream` (see zero::cuda::cast).
/// \throws usage_error for a null pointer with `n > 0`; cuda_error if the launch fails.
template <class S, class D> void launch_cast(const S* src, D* dst, std::size_t n, cudaStream_t stream) {
  require_buffer(src, n, "zero::cuda::cast", "src");
  require_buffer(dst, n, "zero::cuda::cast", "dst");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<S, D>;
  const int head = common_pack_offset<N>(n, src, static_cast<const D*>(dst));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  cast_kernel<S, D><<<grid, block_threads, 0, stream>>>(src, dst, n, head);
  check_launch("zero::cuda::kernels::cast_kernel");
}

/// Enqueues `unscale_and_check_kernel` on `stream` (see zero::cuda::unscale_and_check).
/// \throws usage_error for a null pointer with `n > 0`; cuda_error if the launch fails.
template <class T>
void launch_unscale_and_check(T* x, std::size_t n, float scale, int* found_nonfinite, cudaStream_t stream) {
  require_buffer(x, n, "zero::cuda::unscale_and_check", "x");
  require_buffer(found_nonfinite, n, "zero::cuda::unscale_and_check", "found_nonfinite");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<T>;
  const int head = common_pack_offset<N>(n, static_cast<const T*>(x));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  unscale_and_check_kernel<T><<<grid, block_threads, 0, stream>>>(x, n, head, scale, found_nonfinite);
  check_launch("zero::cuda::kernels::unscale_and_check_kernel");
}

/// Enqueues `accumulate_kernel` on `stream` (see zero::cuda::accumulate).
/// \throws usage_error for a null pointer with `n > 0`; cuda_error if the launch fails.
template <class S, class D> void launch_accumulate(const S* src, D* dst, std::size_t n, cudaStream_t stream) {
  require_buffer(src, n, "zero::cuda::accumulate", "src");
  require_buffer(dst, n, "zero::cuda::accumulate", "dst");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<S, D>;
  const int head = common_pack_offset<N>(n, src, static_cast<const D*>(dst));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  accumulate_kernel<S, D><<<grid, block_threads, 0, stream>>>(src, dst, n, head);
  check_launch("zero::cuda::kernels::accumulate_kernel");
}

/// Enqueues `scale_kernel` on `stream` (see zero::cuda::scale).
/// \throws usage_error for a null `x` with `n > 0`; cuda_error if the launch fails.
template <class T> void launch_scale(T* x, std::size_t n, float factor, cudaStream_t stream) {
  require_buffer(x, n, "zero::cuda::scale", "x");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<T>;
  const int head = common_pack_offset<N>(n, static_cast<const T*>(x));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  scale_kernel<T><<<grid, block_threads, 0, stream>>>(x, n, head, factor);
  check_launch("zero::cuda::kernels::scale_kernel");
}

} // namespace zero::cuda::kernels
