// The deep MLP's own kernels (see kernels.hpp). Elementwise kernels move 8 bf16 (16 bytes) per
// thread and step; the two reductions (loss, bias gradient) sum in fp32 in an order fixed by the
// shapes alone, so a run is reproducible bit for bit.

#include "hash.hpp"
#include "kernels.hpp"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <zero/core/cuda_check.hpp>
#include <zero/core/error.hpp>

namespace deep_mlp {

namespace {

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16), "zero::bf16 must be bit-compatible with __nv_bfloat16");

constexpr int threads = 256;
constexpr int loss_blocks = 1024; // partial sums of mse_loss; its finalizer runs one block of this size
constexpr std::size_t max_row_splits = 64;

struct alignas(16) pack8 {
  __nv_bfloat16 v[8];
};

__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }

// torch.nn.GELU() (approximate="none"): x * 0.5 * (1 + erf(x / sqrt(2))), in fp32 as PyTorch's kernel.
__device__ __forceinline__ float gelu(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f)); }

// d gelu / dx = Phi(x) + x * phi(x), written as PyTorch's GeluBackward kernel writes it.
__device__ __forceinline__ float gelu_grad(float x) {
  constexpr float beta = 1.12837916709551257f * 0.70710678118654752f * 0.5f; // 2/sqrt(pi) * 1/sqrt(2) / 2
  const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  const float pdf = expf(-0.5f * x * x) * beta;
  return cdf + x * pdf;
}

unsigned grid_for(std::size_t work) {
  return static_cast<unsigned>(std::clamp<std::size_t>((work + threads - 1) / threads, 1, 16384));
}

void check_launch() { ZERO_CHECK_CUDA(cudaGetLastError()); }

__nv_bfloat16* dev(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }
const __nv_bfloat16* dev(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

__global__ void fill_uniform_kernel(__nv_bfloat16* out, std::size_t n, std::uint64_t seed, std::uint64_t first,
                                    float scale) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    out[i] = store(scale * uniform(seed, first + i));
  }
}

__global__ void bias_gelu_residual_kernel(__nv_bfloat16* __restrict__ h, const __nv_bfloat16* __restrict__ bias,
                                          const __nv_bfloat16* __restrict__ x, __nv_bfloat16* __restrict__ y,
                                          std::size_t packs, std::size_t hidden) {
  for (std::size_t p = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t i = p * 8;
    const std::size_t col = i % hidden; // hidden % 8 == 0: the pack lies in one row
    pack8 hv = *reinterpret_cast<const pack8*>(h + i);
    const pack8 xv = *reinterpret_cast<const pack8*>(x + i);
    pack8 yv;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      hv.v[k] = store(load(hv.v[k]) + load(bias[col + k]));
      const __nv_bfloat16 a = store(gelu(load(hv.v[k]))); // autograd's GELU output, a bf16 tensor
      yv.v[k] = store(load(xv.v[k]) + load(a));
    }
    *reinterpret_cast<pack8*>(h + i) = hv;
    *reinterpret_cast<pack8*>(y + i) = yv;
  }
}

__global__ void gelu_backward_kernel(const __nv_bfloat16* __restrict__ dy, const __nv_bfloat16* __restrict__ h,
                                     __nv_bfloat16* __restrict__ dh, std::size_t packs) {
  for (std::size_t p = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const pack8 gv = *reinterpret_cast<const pack8*>(dy + p * 8);
    const pack8 hv = *reinterpret_cast<const pack8*>(h + p * 8);
    pack8 out;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      out.v[k] = store(load(gv.v[k]) * gelu_grad(load(hv.v[k])));
    }
    *reinterpret_cast<pack8*>(dh + p * 8) = out;
  }
}

// Sum of `v` over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0.
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_sums[warp] = v;
  }
  __syncthreads();
  v = 0;
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
      v += __shfl_down_sync(0xffffffffu, v, offset);
    }
  }
  return v;
}

__global__ void mse_loss_kernel(const __nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ t,
                                __nv_bfloat16* __restrict__ dy, std::size_t packs, float inv_n,
                                float* __restrict__ partials) {
  float sum = 0;
  for (std::size_t p = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; p < packs;
       p += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const pack8 yv = *reinterpret_cast<const pack8*>(y + p * 8);
    const pack8 tv = *reinterpret_cast<const pack8*>(t + p * 8);
    pack8 g;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float d = load(yv.v[k]) - load(tv.v[k]);
      sum += d * d;
      g.v[k] = store(d * inv_n); // d(0.5 * mean(d^2)) / dy = d / n
    }
    *reinterpret_cast<pack8*>(dy + p * 8) = g;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = sum;
  }
}

__global__ void mse_loss_finish_kernel(const float* __restrict__ partials, int count, float half_inv_n,
                                       float* __restrict__ loss) {
  float v = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    v += partials[i];
  }
  v = block_sum(v);
  if (threadIdx.x == 0) {
    *loss = v * half_inv_n;
  }
}

// Partial column sums: block (bx, split) covers columns [2 * (bx * blockDim.x + tid), +2) of the rows
// [split * chunk, min(rows, (split + 1) * chunk)).
__global__ void bias_grad_partial_kernel(const __nv_bfloat16* __restrict__ dh, std::size_t rows, std::size_t hidden,
                                         std::size_t chunk, float* __restrict__ partials) {
  const std::size_t col = 2 * (blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x);
  if (col >= hidden) {
    return;
  }
  const std::size_t split = blockIdx.y;
  const std::size_t first = split * chunk;
  const std::size_t last = first + chunk < rows ? first + chunk : rows;
  float s0 = 0;
  float s1 = 0;
  for (std::size_t r = first; r < last; ++r) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(dh + r * hidden + col);
    s0 += __low2float(v);
    s1 += __high2float(v);
  }
  partials[split * hidden + col] = s0;
  partials[split * hidden + col + 1] = s1;
}

__global__ void bias_grad_finish_kernel(const float* __restrict__ partials, std::size_t splits, std::size_t hidden,
                                        __nv_bfloat16* __restrict__ db) {
  const std::size_t col = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (col >= hidden) {
    return;
  }
  float s = 0;
  for (std::size_t k = 0; k < splits; ++k) {
    s += partials[k * hidden + col];
  }
  db[col] = store(load(db[col]) + s); // += : the engine's gradient buffer accumulates
}

void require(bool ok, const char* what) {
  if (!ok) {
    throw zero::usage_error(std::string("deep_mlp kernels: ") + what);
  }
}

std::size_t row_splits(std::size_t rows) { return std::min(rows, max_row_splits); }

} // namespace

void fill_uniform(bf16* out, std::size_t n, std::uint64_t seed, std::uint64_t first, float scale, cudaStream_t stream) {
  if (n == 0) {
    return;
  }
  fill_uniform_kernel<<<grid_for(n), threads, 0, stream>>>(dev(out), n, seed, first, scale);
  check_launch();
}

void bias_gelu_residual(bf16* h, const bf16* bias, const bf16* x, bf16* y, std::size_t rows, std::size_t hidden,
                        cudaStream_t stream) {
  require(hidden % 8 == 0, "bias_gelu_residual: hidden must be a multiple of 8");
  const std::size_t packs = rows * hidden / 8;
  if (packs == 0) {
    return;
  }
  bias_gelu_residual_kernel<<<grid_for(packs), threads, 0, stream>>>(dev(h), dev(bias), dev(x), dev(y), packs, hidden);
  check_launch();
}

void gelu_backward(const bf16* dy, const bf16* h, bf16* dh, std::size_t n, cudaStream_t stream) {
  require(n % 8 == 0, "gelu_backward: n must be a multiple of 8");
  if (n == 0) {
    return;
  }
  gelu_backward_kernel<<<grid_for(n / 8), threads, 0, stream>>>(dev(dy), dev(h), dev(dh), n / 8);
  check_launch();
}

std::size_t mse_loss_workspace_floats() { return loss_blocks; }

void mse_loss(const bf16* y, const bf16* t, bf16* dy, std::size_t n, float* workspace, float* loss,
              cudaStream_t stream) {
  require(n % 8 == 0 && n > 0, "mse_loss: n must be a positive multiple of 8");
  const float inv_n = static_cast<float>(1.0 / static_cast<double>(n));
  mse_loss_kernel<<<loss_blocks, threads, 0, stream>>>(dev(y), dev(t), dev(dy), n / 8, inv_n, workspace);
  check_launch();
  mse_loss_finish_kernel<<<1, loss_blocks, 0, stream>>>(workspace, loss_blocks,
                                                        static_cast<float>(0.5 / static_cast<double>(n)), loss);
  check_launch();
}

std::size_t bias_grad_workspace_floats(std::size_t rows, std::size_t hidden) { return row_splits(rows) * hidden; }

void bias_grad(const bf16* dh, std::size_t rows, std::size_t hidden, float* workspace, bf16* db, cudaStream_t stream) {
  require(hidden % 2 == 0, "bias_grad: hidden must be even");
  if (rows == 0 || hidden == 0) {
    return;
  }
  const std::size_t splits = row_splits(rows);
  const std::size_t chunk = (rows + splits - 1) / splits;
  constexpr unsigned partial_threads = 128;
  const dim3 grid(static_cast<unsigned>((hidden / 2 + partial_threads - 1) / partial_threads),
                  static_cast<unsigned>(splits));
  bias_grad_partial_kernel<<<grid, partial_threads, 0, stream>>>(dev(dh), rows, hidden, chunk, workspace);
  check_launch();
  bias_grad_finish_kernel<<<grid_for(hidden), threads, 0, stream>>>(workspace, splits, hidden, dev(db));
  check_launch();
}

} // namespace deep_mlp
