/// \file
/// zero::cuda::gather and scatter for float, zero::f16 and zero::bf16: ZenFlow's copies of the chosen elements
/// (zero::can_index_copy). They move bits, so each element type is copied as an unsigned integer of its size.

#include "numeric.cuh"
#include "zero/backend/cuda_kernels.hpp"

#include <cstdint>

namespace zero::cuda {

namespace kernels {

/// dst[i] = src[index[i]] over [0, n), grid-stride.
template <class U>
__global__ void __launch_bounds__(block_threads)
    gather_kernel(const U* __restrict__ src, const std::uint32_t* __restrict__ index, ::cuda::std::size_t n,
                  U* __restrict__ dst) {
  for (::cuda::std::size_t i = blockIdx.x * static_cast<::cuda::std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<::cuda::std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[index[i]];
  }
}

/// dst[index[i]] = src[i] over [0, n), grid-stride.
template <class U>
__global__ void __launch_bounds__(block_threads)
    scatter_kernel(const U* __restrict__ src, const std::uint32_t* __restrict__ index, ::cuda::std::size_t n,
                   U* __restrict__ dst) {
  for (::cuda::std::size_t i = blockIdx.x * static_cast<::cuda::std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<::cuda::std::size_t>(gridDim.x) * blockDim.x) {
    dst[index[i]] = src[i];
  }
}

/// The unsigned integer of T's size.
template <class T> using bits_of = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint16_t>;

} // namespace kernels

template <float_element T>
void gather(const T* src, const std::uint32_t* index, std::size_t n, T* dst, cudaStream_t stream) {
  kernels::require_buffer(src, n, "zero::cuda::gather", "src");
  kernels::require_buffer(index, n, "zero::cuda::gather", "index");
  kernels::require_buffer(dst, n, "zero::cuda::gather", "dst");
  if (n == 0) {
    return;
  }
  using U = kernels::bits_of<T>;
  kernels::gather_kernel<U><<<kernels::grid_blocks(n), kernels::block_threads, 0, stream>>>(
      reinterpret_cast<const U*>(src), index, n, reinterpret_cast<U*>(dst));
  kernels::check_launch("zero::cuda::kernels::gather_kernel");
}

template <float_element T>
void scatter(const T* src, const std::uint32_t* index, std::size_t n, T* dst, cudaStream_t stream) {
  kernels::require_buffer(src, n, "zero::cuda::scatter", "src");
  kernels::require_buffer(index, n, "zero::cuda::scatter", "index");
  kernels::require_buffer(dst, n, "zero::cuda::scatter", "dst");
  if (n == 0) {
    return;
  }
  using U = kernels::bits_of<T>;
  kernels::scatter_kernel<U><<<kernels::grid_blocks(n), kernels::block_threads, 0, stream>>>(
      reinterpret_cast<const U*>(src), index, n, reinterpret_cast<U*>(dst));
  kernels::check_launch("zero::cuda::kernels::scatter_kernel");
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void gather<T>(const T*, const std::uint32_t*, std::size_t, T*, cudaStream_t);                              \
  template void scatter<T>(const T*, const std::uint32_t*, std::size_t, T*, cudaStream_t);

ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)

#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
