/// \file
/// zero::cuda::reduce_ranks: the element-wise sum, average or maximum of up to `max_reduce_ranks` buffers on
/// one device, in rank order, written to one buffer or to several, for every element type a communicator carries. The
/// reduction of `device_group_communicator` (ranks as threads sharing one GPU), with the numerics of
/// `thread_communicator`'s: 16-bit values accumulate in fp32 and round once, other types in their own.

#include "numeric.cuh"
#include "zero/backend/cuda_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <cuda/std/type_traits>
#include <string>

namespace zero::cuda {
namespace {

// The ranks' input pointers and the outputs, passed by value.
template <class T> struct rank_inputs { const T* in[max_reduce_ranks]; };
template <class T> struct rank_outputs { T* out[max_reduce_ranks]; };

// What a reduction of T accumulates in: fp32 for the 16-bit types, T otherwise.
template <class T> struct accum {
  using type = T;
  __device__ __forceinline__ static T load(T x) { return x; }
  __device__ __forceinline__ static T store(T x) { return x; }
};
template <> struct accum<__half> : kernels::element_traits<__half> { using type = float; };
template <> struct accum<__nv_bfloat16> : kernels::element_traits<__nv_bfloat16> { using type = float; };

template <class A> __device__ __forceinline__ void combine(A& acc, A v, rank_reduce op) {
  if (op == rank_reduce::max) {
    acc = v > acc ? v : acc;
  } else {
    acc = static_cast<A>(acc + v);
  }
}

// The reduction of V consecutive elements at element i of every input, written at i of every output; V > 1 moves
// them as one 16-byte load or store (every pointer then 16-byte aligned). Each element is read from every input
// before it is written, in rank order, as the scalar case (V = 1) does: the same bits.
template <class T, int V>
__device__ __forceinline__ void reduce_at(const rank_outputs<T>& out, int outs, const rank_inputs<T>& in, int ranks,
                                          std::size_t i, rank_reduce op) {
  using A = typename accum<T>::type;
  using word = ::cuda::std::conditional_t<V == 1, T, uint4>;
  A acc[V];
  T x[V];
  for (int r = 0; r < ranks; ++r) {
    const word raw = *reinterpret_cast<const word*>(in.in[r] + i);
    memcpy(x, &raw, sizeof(word));
#pragma unroll
    for (int j = 0; j < V; ++j) {
      if (r == 0) {
        acc[j] = accum<T>::load(x[j]);
      } else {
        combine(acc[j], static_cast<A>(accum<T>::load(x[j])), op);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (op == rank_reduce::avg) {
      acc[j] = static_cast<A>(acc[j] / static_cast<A>(ranks));
    }
    x[j] = accum<T>::store(acc[j]);
  }
  word result;
  memcpy(&result, x, sizeof(word));
  for (int o = 0; o < outs; ++o) {
    *reinterpret_cast<word*>(out.out[o] + i) = result;
  }
}

// 16-byte vectors over the first n - n % V elements when `vectors`, then one element a thread.
template <class T>
__global__ void reduce_ranks_kernel(rank_outputs<T> out, int outs, rank_inputs<T> in, int ranks, std::size_t n,
                                    bool vectors, rank_reduce op) {
  constexpr int V = sizeof(T) < 16 ? static_cast<int>(16 / sizeof(T)) : 1;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t whole = vectors ? n / V : 0;
  for (std::size_t k = first; k < whole; k += stride) {
    reduce_at<T, V>(out, outs, in, ranks, k * V, op);
  }
  for (std::size_t i = whole * V + first; i < n; i += stride) {
    reduce_at<T, 1>(out, outs, in, ranks, i, op);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

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
  rank_inputs<D> args{};
  rank_outputs<D> outs{};
  bool vectors = true;
  for (std::size_t r = 0; r < in.size(); ++r) {
    kernels::require_buffer(in[r], n, "zero::cuda::reduce_ranks", "an input");
    args.in[r] = kernels::to_device(in[r]);
    vectors = vectors && aligned16(in[r]);
  }
  for (std::size_t o = 0; o < out.size(); ++o) {
    kernels::require_buffer(out[o], n, "zero::cuda::reduce_ranks", "an output");
    outs.out[o] = kernels::to_device(out[o]);
    vectors = vectors && aligned16(out[o]);
  }
  if (n == 0) {
    return;
  }
  constexpr std::size_t V = sizeof(T) < 16 ? 16 / sizeof(T) : 1;
  const std::size_t items = vectors ? std::max<std::size_t>(n / V, n % V) : n;
  reduce_ranks_kernel<D><<<kernels::grid_blocks(items), kernels::block_threads, 0, stream>>>(
      outs, static_cast<int>(out.size()), args, static_cast<int>(in.size()), n, vectors, op);
  kernels::check_launch("zero::cuda::reduce_ranks_kernel");
}

template <class T>
void reduce_ranks(T* out, std::span<const T* const> in, std::size_t n, rank_reduce op, cudaStream_t stream) {
  reduce_ranks(std::span<T* const>(&out, 1), in, n, op, stream);
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void reduce_ranks<T>(T*, std::span<const T* const>, std::size_t, rank_reduce, cudaStream_t);                \
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
