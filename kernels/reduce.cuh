#pragma once
/// \file
/// The deterministic squared norm: a fixed number of blocks (a function of n alone) each reduce a fixed
/// set of elements into one fp32 partial sum in the workspace, then a single block adds the partial sums
/// in a fixed order. No atomics, so the same input gives the same bits on every run and every GPU.
/// `zero::cuda::squared_norm` (cuda_kernels.hpp) is this, instantiated for float, __half and __nv_bfloat16.

#include "numeric.cuh"

namespace zero::cuda::kernels {

/// The most blocks the first pass uses: 4 KiB of partial sums, about a full H100/H200 of resident threads.
inline constexpr std::size_t squared_norm_max_blocks = 1024;
/// Elements a block takes before another block is added: 32 per thread, whatever the element type.
inline constexpr std::size_t squared_norm_block_elems = static_cast<std::size_t>(block_threads) * 32;

/// Blocks of the first pass for n elements: 0 for n == 0, else ceil(n / squared_norm_block_elems) capped
/// at squared_norm_max_blocks. Depends on n only, never on the device, so results do not either.
[[nodiscard]] inline std::size_t squared_norm_blocks(std::size_t n) noexcept {
  return std::min((n + squared_norm_block_elems - 1) / squared_norm_block_elems, squared_norm_max_blocks);
}

/// Workspace bytes for n elements: one fp32 partial sum per first-pass block.
[[nodiscard]] inline std::size_t squared_norm_workspace(std::size_t n) noexcept {
  return squared_norm_blocks(n) * sizeof(float);
}

/// Sum of `v` over the block, in a fixed butterfly order (warp shuffles, then the first warp over the
/// warp sums); the result is valid in thread 0. Call at most once per kernel: it uses static shared memory.
__device__ __forceinline__ float block_sum(float v) {
  constexpr int warps = block_threads / 32;
  __shared__ float warp_sums[warps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane == 0) {
    warp_sums[warp] = v;
  }
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? warp_sums[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
  }
  return v;
}

/// First pass: `partials[blockIdx.x]` = this block's sum of float(x[i])^2 (fp32, fused multiply-add).
template <class T>
__global__ void __launch_bounds__(block_threads)
    squared_norm_partial_kernel(const T* __restrict__ x, ::cuda::std::size_t n, int head,
                                float* __restrict__ partials) {
  constexpr int N = pack_elems<T>;
  float acc = 0.0f;
  for_each_element<N>(
      n, head,
      [&](::cuda::std::size_t i) {
        const float a = element_traits<T>::load(x[i]);
        acc = __fmaf_rn(a, a, acc);
      },
      [&](::cuda::std::size_t i) {
        float a[N];
        load_pack_float<N>(x + i, a);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          acc = __fmaf_rn(a[k], a[k], acc);
        }
      });
  const float sum = block_sum(acc);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sum;
  }
}

/// Second pass, one block: `*out` = the sum of `count` partial sums in a fixed order (0 when count is 0).
/// A template only so that a user's `.cu` including this header and zero::cuda can both define it.
template <class T>
__global__ void __launch_bounds__(block_threads)
    squared_norm_final_kernel(const float* __restrict__ partials, unsigned count, float* __restrict__ out) {
  float acc = 0.0f;
  for (unsigned i = threadIdx.x; i < count; i += block_threads) {
    acc = __fadd_rn(acc, partials[i]);
  }
  const float sum = block_sum(acc);
  if (threadIdx.x == 0) {
    *out = sum;
  }
}

/// Enqueues the two passes on `stream` (see zero::cuda::squared_norm).
/// \throws usage_error for a null or too small or misaligned buffer; cuda_error if a launch fails.
template <class T>
void launch_squared_norm(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
                         cudaStream_t stream) {
  constexpr const char* function = "zero::cuda::squared_norm";
  require_buffer(x, n, function, "x");
  require_buffer(out, 1, function, "out");
  const std::size_t blocks = squared_norm_blocks(n);
  const std::size_t needed = blocks * sizeof(float);
  if (workspace_bytes < needed) {
    throw zero::usage_error(std::string(function) + ": workspace of " + std::to_string(workspace_bytes) +
                            " bytes is too small; n = " + std::to_string(n) + " needs " + std::to_string(needed) +
                            " (squared_norm_workspace_bytes)");
  }
  require_buffer(workspace, needed, function, "workspace");
  if (reinterpret_cast<std::uintptr_t>(workspace) % alignof(float) != 0) {
    throw zero::usage_error(std::string(function) + ": workspace must be 4-byte aligned");
  }
  auto* partials = static_cast<float*>(workspace);
  if (blocks > 0) {
    const int head = common_pack_offset<pack_elems<T>>(n, x);
    squared_norm_partial_kernel<T><<<static_cast<unsigned>(blocks), block_threads, 0, stream>>>(x, n, head, partials);
    check_launch("zero::cuda::kernels::squared_norm_partial_kernel");
  }
  squared_norm_final_kernel<T><<<1, block_threads, 0, stream>>>(partials, static_cast<unsigned>(blocks), out);
  check_launch("zero::cuda::kernels::squared_norm_final_kernel");
}

} // namespace zero::cuda::kernels
