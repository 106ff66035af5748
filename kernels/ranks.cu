/// \file
/// zero::cuda::reduce_ranks: the element-wise sum, average or maximum of up to `max_reduce_ranks` buffers on
/// one device, in rank order, written to up to `max_reduce_ranks` buffers, for every element type a
/// communicator carries. The reduction and the multi-destination copy of `device_group_communicator` (ranks as
/// threads sharing one GPU), with the numerics of `thread_communicator`'s: 16-bit values accumulate in fp32 and
/// round once, other types in their own.

#include "numeric.cuh"
#include "zero/backend/cuda_kernels.hpp"

#include <cuda/std/type_traits>

namespace zero::cuda {
namespace {

// The ranks' buffers, passed by value.
template <class T> struct rank_buffers {
  const T* in[max_reduce_ranks];
  T* out[max_reduce_ranks];
};

// What a reduction of T accumulates in: fp32 for the 16-bit types, T otherwise.
template <class T> struct accum {
  using type = T;
  __device__ __forceinline__ static T load(T x) { return x; }
  __device__ __forceinline__ static T store(T x) { return x; }
};
template <> struct accum<__half> : kernels::element_traits<__half> { using type = float; };
template <> struct accum<__nv_bfloat16> : kernels::element_traits<__nv_bfloat16> { using type = float; };

template <class A> __device__ __forceinline__ A combine(A acc, A v, rank_reduce op) {
  if (op == rank_reduce::max) {
    return v > acc ? v : acc;
  }
  return static_cast<A>(acc + v);
}

// `N` consecutive elements at `i` (a pack, or one element with N = 1): every input's, combined in rank order,
// stored to every output. Every input is read before any output is written, so an output may be an input.
template <int N, class T>
__device__ __forceinline__ void reduce_at(const rank_buffers<T>& b, int ins, int outs, ::cuda::std::size_t i,
                                          rank_reduce op) {
  using A = typename accum<T>::type;
  T raw[N];
  A acc[N];
  if constexpr (N == 1) {
    raw[0] = b.in[0][i];
  } else {
    kernels::load_pack<N>(b.in[0] + i, raw);
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    acc[k] = accum<T>::load(raw[k]);
  }
#pragma unroll
  for (int r = 1; r < static_cast<int>(max_reduce_ranks); ++r) {
    if (r < ins) {
      if constexpr (N == 1) {
        raw[0] = b.in[r][i];
      } else {
        kernels::load_pack<N>(b.in[r] + i, raw);
      }
#pragma unroll
      for (int k = 0; k < N; ++k) {
        acc[k] = combine<A>(acc[k], accum<T>::load(raw[k]), op);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if (op == rank_reduce::avg) {
      acc[k] = static_cast<A>(acc[k] / static_cast<A>(ins));
    }
    raw[k] = accum<T>::store(acc[k]);
  }
#pragma unroll
  for (int o = 0; o < static_cast<int>(max_reduce_ranks); ++o) {
    if (o < outs) {
      if constexpr (N == 1) {
        b.out[o][i] = raw[0];
      } else {
        kernels::store_pack<N>(b.out[o] + i, raw);
      }
    }
  }
}

// 16 bytes per access where every buffer is aligned alike (`head` >= 0), one element per access otherwise.
template <class T>
__global__ void __launch_bounds__(kernels::block_threads)
    reduce_ranks_kernel(rank_buffers<T> b, int ins, int outs, ::cuda::std::size_t n, int head, rank_reduce op) {
  constexpr int N = kernels::pack_elems<T>;
  kernels::for_each_element<N>(
      n, head, [&](::cuda::std::size_t i) { reduce_at<1>(b, ins, outs, i, op); },
      [&](::cuda::std::size_t i) { reduce_at<N>(b, ins, outs, i, op); });
}

// The first index at which every buffer is aligned for packs of N, or -1 (see kernels::common_pack_offset).
template <int N, class T> int pack_offset(const rank_buffers<T>& b, int ins, int outs, std::size_t n) {
  for (int j = 0; j < N; ++j) {
    bool aligned = true;
    for (int r = 0; r < ins; ++r) {
      aligned = aligned && kernels::pack_aligned_at<N>(b.in[r], j);
    }
    for (int o = 0; o < outs; ++o) {
      aligned = aligned && kernels::pack_aligned_at<N>(b.out[o], j);
    }
    if (aligned) {
      return n >= static_cast<std::size_t>(j) + N ? j : -1;
    }
  }
  return -1;
}

} // namespace

template <class T>
void reduce_ranks(std::span<T* const> out, std::span<const T* const> in, std::size_t n, rank_reduce op,
                  cudaStream_t stream) {
  if (in.empty() || in.size() > max_reduce_ranks || out.empty() || out.size() > max_reduce_ranks) {
    throw usage_error("zero::cuda::reduce_ranks: " + std::to_string(in.size()) + " inputs and " +
                      std::to_string(out.size()) + " outputs; expected 1 to " + std::to_string(max_reduce_ranks) +
                      " of each");
  }
  using D = kernels::device_type_t<T>;
  rank_buffers<D> b{};
  for (std::size_t r = 0; r < in.size(); ++r) {
    kernels::require_buffer(in[r], n, "zero::cuda::reduce_ranks", "an input");
    b.in[r] = kernels::to_device(in[r]);
  }
  for (std::size_t o = 0; o < out.size(); ++o) {
    kernels::require_buffer(out[o], n, "zero::cuda::reduce_ranks", "an output");
    b.out[o] = kernels::to_device(out[o]);
  }
  if (n == 0) {
    return;
  }
  constexpr int N = kernels::pack_elems<D>;
  const int ins = static_cast<int>(in.size());
  const int outs = static_cast<int>(out.size());
  const int head = pack_offset<N>(b, ins, outs, n);
  reduce_ranks_kernel<D><<<kernels::grid_blocks(kernels::work_items(n, head, N)), kernels::block_threads, 0, stream>>>(
      b, ins, outs, n, head, op);
  kernels::check_launch("zero::cuda::reduce_ranks_kernel");
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void reduce_ranks<T>(std::span<T* const>, std::span<const T* const>, std::size_t, rank_reduce, cudaStream_t);
ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)
ZERO_INSTANTIATE_ONE(double)
ZERO_INSTANTIATE_ONE(std::int32_t)
ZERO_INSTANTIATE_ONE(std::int64_t)
ZERO_INSTANTIATE_ONE(std::uint8_t)
#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
