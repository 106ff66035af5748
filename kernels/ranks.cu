/// \file
/// zero::cuda::reduce_ranks: the element-wise sum, average or maximum of up to `max_reduce_ranks` buffers on
/// one device, in rank order, for every element type a communicator carries. The reduction of
/// `device_group_communicator` (ranks as threads sharing one GPU), with the numerics of
/// `thread_communicator`'s: 16-bit values accumulate in fp32 and round once, other types in their own.

#include "numeric.cuh"
#include "zero/backend/cuda_kernels.hpp"

#include <cuda/std/type_traits>

namespace zero::cuda {
namespace {

// The ranks' input pointers, passed by value.
template <class T> struct rank_inputs { const T* in[max_reduce_ranks]; };

// What a reduction of T accumulates in: fp32 for the 16-bit types, T otherwise.
template <class T> struct accum {
  using type = T;
  __device__ __forceinline__ static T load(T x) { return x; }
  __device__ __forceinline__ static T store(T x) { return x; }
};
template <> struct accum<__half> : kernels::element_traits<__half> { using type = float; };
template <> struct accum<__nv_bfloat16> : kernels::element_traits<__nv_bfloat16> { using type = float; };

template <class T>
__global__ void reduce_ranks_kernel(T* out, rank_inputs<T> in, int ranks, std::size_t n, rank_reduce op) {
  using A = typename accum<T>::type;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    A acc = accum<T>::load(in.in[0][i]);
    for (int r = 1; r < ranks; ++r) {
      const A v = accum<T>::load(in.in[r][i]);
      if (op == rank_reduce::max) {
        acc = v > acc ? v : acc;
      } else {
        acc = static_cast<A>(acc + v);
      }
    }
    if (op == rank_reduce::avg) {
      acc = static_cast<A>(acc / static_cast<A>(ranks));
    }
    out[i] = accum<T>::store(acc);
  }
}

} // namespace

template <class T>
void reduce_ranks(T* out, std::span<const T* const> in, std::size_t n, rank_reduce op, cudaStream_t stream) {
  if (in.empty() || in.size() > max_reduce_ranks) {
    throw usage_error("zero::cuda::reduce_ranks: " + std::to_string(in.size()) + " inputs; expected 1 to " +
                      std::to_string(max_reduce_ranks));
  }
  kernels::require_buffer(out, n, "zero::cuda::reduce_ranks", "out");
  using D = kernels::device_type_t<T>;
  rank_inputs<D> args{};
  for (std::size_t r = 0; r < in.size(); ++r) {
    kernels::require_buffer(in[r], n, "zero::cuda::reduce_ranks", "an input");
    args.in[r] = kernels::to_device(in[r]);
  }
  if (n == 0) {
    return;
  }
  reduce_ranks_kernel<D><<<kernels::grid_blocks(n), kernels::block_threads, 0, stream>>>(
      kernels::to_device(out), args, static_cast<int>(in.size()), n, op);
  kernels::check_launch("zero::cuda::reduce_ranks_kernel");
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void reduce_ranks<T>(T*, std::span<const T* const>, std::size_t, rank_reduce, cudaStream_t);
ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)
ZERO_INSTANTIATE_ONE(double)
ZERO_INSTANTIATE_ONE(std::int32_t)
ZERO_INSTANTIATE_ONE(std::int64_t)
ZERO_INSTANTIATE_ONE(std::uint8_t)
#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
