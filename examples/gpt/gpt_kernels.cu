// The GPT example's own kernels (see gpt_kernels.hpp). Every reduction sums in fp32 (the loss total in
// double) in an order fixed by the shapes alone: warp sums by a butterfly of shuffles (every lane ends with
// the same bits, since a + b == b + a), block sums over the warps' results in warp order, and column sums
// over fixed row splits, then over the splits in order. No float atomics, so a run is reproducible bit for
// bit. Compiled without --use_fast_math: expf, tanhf, logf and the division are the accurate ones.

#include "gpt_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string>
#include <zero/core/cuda_check.hpp>
#include <zero/core/error.hpp>

namespace gpt::kernels {

namespace {

static_assert(sizeof(bf16) == sizeof(__nv_bfloat16), "zero::bf16 must be bit-compatible with __nv_bfloat16");

constexpr int threads = 256;                      // elementwise and warp-per-row kernels
constexpr int warps_per_block = threads / 32;     // rows per block of the warp-per-row kernels
constexpr int column_threads = 128;               // columns per block of the column sums
constexpr int row_threads = 512;                  // one block per row of the LM head's cross-entropy
constexpr int total_threads = 1024;               // the one block of sum_losses
constexpr std::size_t max_row_splits = 64;        // partial sums of a column sum, times its columns per thread
constexpr float ln_eps = 1e-5f;                   // GPT-2's LayerNorm epsilon
constexpr float gelu_scale = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float gelu_cube = 0.044715f;

__device__ __forceinline__ float load(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 store(float x) { return __float2bfloat16_rn(x); }
// A gradient added into: fp32 in place, or bf16 read into fp32, added, and rounded once.
__device__ __forceinline__ void add_to(float& dst, float v) { dst += v; }
__device__ __forceinline__ void add_to(__nv_bfloat16& dst, float v) { dst = store(load(dst) + v); }

__nv_bfloat16* dev(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

const __nv_bfloat16* dev(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }

// W consecutive bf16 read or written in one access (W = 8: 16 bytes), for the row and column kernels: they run
// with W = 8 where the row length is a multiple of 8 and the pointers 16-byte aligned, W = 1 otherwise.
template <int W> struct alignas(2 * W) bf16_pack { __nv_bfloat16 e[W]; };
template <int W> __device__ __forceinline__ bf16_pack<W> load_pack(const __nv_bfloat16* p) {
  return *reinterpret_cast<const bf16_pack<W>*>(p);
}
template <int W> __device__ __forceinline__ void store_pack(__nv_bfloat16* p, const bf16_pack<W>& v) {
  *reinterpret_cast<bf16_pack<W>*>(p) = v;
}
// 8 where every pointer is 16-byte aligned and `cols` a multiple of 8, else 1.
template <class... P> int pack_width(std::size_t cols, const P*... ptrs) {
  const bool aligned = ((reinterpret_cast<std::uintptr_t>(ptrs) % 16 == 0) && ...);
  return aligned && cols % 8 == 0 ? 8 : 1;
}

struct sum_op {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};

// The warp's reduction, the same bits in every lane: at each step two lanes combine the same two values.
template <class T, class Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// The block's reduction (blockDim.x a multiple of 32), returned to every thread: the warps' results combined
// in warp order. `scratch` is shared memory of 32 elements; the closing barrier lets the next call reuse it,
// and the opening one means every thread has finished what it did before the call.
template <class T, class Op> __device__ T block_reduce(T v, Op op, T* scratch) {
  v = warp_reduce(v, op);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) {
    scratch[warp] = v;
  }
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
    r = op(r, scratch[w]);
  }
  __syncthreads();
  return r;
}

unsigned grid_for(std::size_t work, int block) {
  const std::size_t blocks = (work + static_cast<std::size_t>(block) - 1) / static_cast<std::size_t>(block);
  return static_cast<unsigned>(std::clamp<std::size_t>(blocks, 1, 65535));
}

unsigned blocks_for_rows(std::size_t rows) {
  return static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block);
}

void check_launch() { ZERO_CHECK_CUDA(cudaGetLastError()); }

void require(bool ok, const char* what) {
  if (!ok) {
    throw zero::usage_error(std::string("gpt kernels: ") + what);
  }
}

// The row splits of a column sum whose threads take `width` columns each: as many threads as at width 1.
std::size_t row_splits(std::size_t rows, std::size_t width) {
  return std::clamp<std::size_t>(rows, 1, max_row_splits * width);
}

#define GPT_GRID_STRIDE(i, n)                                                                                          \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n);                       \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

__global__ void embedding_forward_kernel(__nv_bfloat16* __restrict__ out, const std::int32_t* __restrict__ tokens,
                                         const __nv_bfloat16* __restrict__ wte, const __nv_bfloat16* __restrict__ wpe,
                                         std::size_t n, std::size_t T, std::size_t C) {
  GPT_GRID_STRIDE(i, n) {
    const std::size_t row = i / C;
    const std::size_t c = i % C;
    const std::size_t t = row % T;
    const auto token = static_cast<std::size_t>(tokens[row]);
    out[i] = store(load(wte[token * C + c]) + load(wpe[t * C + c]));
  }
}

// Block u: token ids[u]'s rows rows[offsets[u]..offsets[u+1]), summed in that (ascending) order per channel.
__global__ void embedding_wte_backward_kernel(float* __restrict__ d_wte, const __nv_bfloat16* __restrict__ dout,
                                              const std::int32_t* __restrict__ ids,
                                              const std::int32_t* __restrict__ offsets,
                                              const std::int32_t* __restrict__ rows, std::size_t C) {
  const std::size_t u = blockIdx.x;
  const auto token = static_cast<std::size_t>(ids[u]);
  const std::int32_t first = offsets[u];
  const std::int32_t last = offsets[u + 1];
  for (std::size_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    for (std::int32_t k = first; k < last; ++k) {
      s += load(dout[static_cast<std::size_t>(rows[k]) * C + c]);
    }
    d_wte[token * C + c] += s;
  }
}

// Element i = t * C + c of d_wpe: the sum over b of dout[b, t, c] in b order.
__global__ void embedding_wpe_backward_kernel(float* __restrict__ d_wpe, const __nv_bfloat16* __restrict__ dout,
                                              std::size_t B, std::size_t TC) {
  GPT_GRID_STRIDE(i, TC) {
    float s = 0.0f;
    for (std::size_t b = 0; b < B; ++b) {
      s += load(dout[b * TC + i]);
    }
    d_wpe[i] += s;
  }
}

// One warp per row, W columns per access.
template <int W>
__global__ void layernorm_forward_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ mean,
                                         float* __restrict__ rstd, const __nv_bfloat16* __restrict__ x,
                                         const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ b,
                                         std::size_t rows, int C) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(warps_per_block) + threadIdx.x / 32;
  if (row >= rows) {
    return; // the whole warp: row depends on the warp alone
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const __nv_bfloat16* xr = x + row * static_cast<std::size_t>(C);
  float sum = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const auto xv = load_pack<W>(xr + c);
    for (int k = 0; k < W; ++k) {
      sum += load(xv.e[k]);
    }
  }
  const float m = warp_reduce(sum, sum_op{}) / static_cast<float>(C);
  // The variance about the mean (a second pass, not E[x^2] - m^2, which cancels).
  float sq = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const auto xv = load_pack<W>(xr + c);
    for (int k = 0; k < W; ++k) {
      const float d = load(xv.e[k]) - m;
      sq += d * d;
    }
  }
  const float var = warp_reduce(sq, sum_op{}) / static_cast<float>(C);
  const float s = 1.0f / sqrtf(var + ln_eps);
  __nv_bfloat16* o = out + row * static_cast<std::size_t>(C);
  for (int c = lane * W; c < C; c += 32 * W) {
    const auto xv = load_pack<W>(xr + c), wv = load_pack<W>(w + c), bv = load_pack<W>(b + c);
    bf16_pack<W> ov;
    for (int k = 0; k < W; ++k) {
      ov.e[k] = store((load(xv.e[k]) - m) * s * load(wv.e[k]) + load(bv.e[k]));
    }
    store_pack<W>(o + c, ov);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// One warp per row, W columns per access: dx += (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd,
// dnorm = w * dout.
template <int W>
__global__ void layernorm_backward_dx_kernel(__nv_bfloat16* __restrict__ dx, const __nv_bfloat16* __restrict__ dout,
                                             const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
                                             const float* __restrict__ mean, const float* __restrict__ rstd,
                                             std::size_t rows, int C) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(warps_per_block) + threadIdx.x / 32;
  if (row >= rows) {
    return;
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::size_t base = row * static_cast<std::size_t>(C);
  const float m = mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = lane * W; c < C; c += 32 * W) {
    const auto xv = load_pack<W>(x + base + c), dv = load_pack<W>(dout + base + c), wv = load_pack<W>(w + c);
    for (int k = 0; k < W; ++k) {
      const float norm = (load(xv.e[k]) - m) * s;
      const float dnorm = load(wv.e[k]) * load(dv.e[k]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
  }
  const float dnorm_mean = warp_reduce(dnorm_sum, sum_op{}) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_reduce(dnorm_norm_sum, sum_op{}) / static_cast<float>(C);
  for (int c = lane * W; c < C; c += 32 * W) {
    const auto xv = load_pack<W>(x + base + c), dv = load_pack<W>(dout + base + c), wv = load_pack<W>(w + c);
    auto gv = load_pack<W>(dx + base + c);
    for (int k = 0; k < W; ++k) {
      const float norm = (load(xv.e[k]) - m) * s;
      const float dnorm = load(wv.e[k]) * load(dv.e[k]);
      gv.e[k] = store(load(gv.e[k]) + (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
    }
    store_pack<W>(dx + base + c, gv);
  }
}

// Block (bx, split): columns [bx * column_threads * W, +column_threads * W), W consecutive ones per thread, over
// the rows [split * chunk, +chunk) of the split, in ascending order; partials[split * 2C + c] = sum dout * norm,
// partials[split * 2C + C + c] = sum dout. A split past the last row writes zeros.
template <int W>
__global__ void layernorm_backward_partial_kernel(float* __restrict__ partials, const __nv_bfloat16* __restrict__ dout,
                                                  const __nv_bfloat16* __restrict__ x, const float* __restrict__ mean,
                                                  const float* __restrict__ rstd, std::size_t rows, std::size_t C,
                                                  std::size_t chunk) {
  const std::size_t c = (blockIdx.x * static_cast<std::size_t>(column_threads) + threadIdx.x) * W;
  if (c >= C) {
    return;
  }
  const std::size_t split = blockIdx.y;
  const std::size_t first = split * chunk;
  const std::size_t last = first + chunk < rows ? first + chunk : rows;
  float sw[W] = {};
  float sb[W] = {};
  for (std::size_t r = first; r < last; ++r) {
    const auto dv = load_pack<W>(dout + r * C + c), xv = load_pack<W>(x + r * C + c);
    const float m = mean[r], s = rstd[r];
    for (int k = 0; k < W; ++k) {
      const float d = load(dv.e[k]);
      sw[k] += d * ((load(xv.e[k]) - m) * s);
      sb[k] += d;
    }
  }
  for (int k = 0; k < W; ++k) {
    partials[split * 2 * C + c + k] = sw[k];
    partials[split * 2 * C + C + c + k] = sb[k];
  }
}

// The same split of rows for a bias: partials[split * cols + c] = sum of dout's column c over the split.
template <int W>
__global__ void bias_backward_partial_kernel(float* __restrict__ partials, const __nv_bfloat16* __restrict__ dout,
                                             std::size_t rows, std::size_t cols, std::size_t chunk) {
  const std::size_t c = (blockIdx.x * static_cast<std::size_t>(column_threads) + threadIdx.x) * W;
  if (c >= cols) {
    return;
  }
  const std::size_t split = blockIdx.y;
  const std::size_t first = split * chunk;
  const std::size_t last = first + chunk < rows ? first + chunk : rows;
  float sum[W] = {};
  for (std::size_t r = first; r < last; ++r) {
    const auto dv = load_pack<W>(dout + r * cols + c);
    for (int k = 0; k < W; ++k) {
      sum[k] += load(dv.e[k]);
    }
  }
  for (int k = 0; k < W; ++k) {
    partials[split * cols + c + k] = sum[k];
  }
}

// The second pass: dst[c] (fp32 or bf16) += the sum over the splits k = 0..splits-1 of partials[k * stride + c]. A
// block takes finish_columns columns; its finish_groups rows of threads each sum the splits k = g, g + finish_groups,
// ... in that order, then the first row adds the groups' sums in group order: an order fixed by `splits` alone, with
// finish_groups loads in flight per column instead of one.
constexpr int finish_columns = 32;
constexpr int finish_groups = 8;
template <class T>
__global__ void column_finish_kernel(T* __restrict__ dst, const float* __restrict__ partials, std::size_t stride,
                                     std::size_t splits, std::size_t cols) {
  __shared__ float sums[finish_groups][finish_columns];
  const std::size_t c = blockIdx.x * static_cast<std::size_t>(finish_columns) + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (std::size_t k = threadIdx.y; k < splits; k += finish_groups) {
      s += partials[k * stride + c];
    }
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = sums[0][threadIdx.x];
    for (int g = 1; g < finish_groups; ++g) {
      total += sums[g][threadIdx.x];
    }
    add_to(dst[c], total);
  }
}

// Launches column_finish_kernel over `cols` columns of `dst`, in its dtype.
void column_finish(grad_ref dst, const float* partials, std::size_t stride, std::size_t splits, std::size_t cols,
                   cudaStream_t stream) {
  const dim3 block(finish_columns, finish_groups);
  const auto blocks = static_cast<unsigned>((cols + finish_columns - 1) / finish_columns);
  if (dst.bf16) {
    column_finish_kernel<<<blocks, block, 0, stream>>>(static_cast<__nv_bfloat16*>(dst.data), partials, stride, splits,
                                                       cols);
  } else {
    column_finish_kernel<<<blocks, block, 0, stream>>>(static_cast<float*>(dst.data), partials, stride, splits, cols);
  }
  check_launch();
}

__device__ __forceinline__ float gelu(float x) {
  return 0.5f * x * (1.0f + tanhf(gelu_scale * (x + gelu_cube * x * x * x)));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float th = tanhf(gelu_scale * (x + gelu_cube * x * x * x));
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * gelu_scale * (1.0f + 3.0f * gelu_cube * x * x);
}

__global__ void gelu_forward_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ x,
                                    std::size_t n) {
  GPT_GRID_STRIDE(i, n) { out[i] = store(gelu(load(x[i]))); }
}

// Not __restrict__: dx may be dout (each element is read, then written, by the same thread).
__global__ void gelu_backward_kernel(__nv_bfloat16* dx, const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* dout,
                                     std::size_t n) {
  GPT_GRID_STRIDE(i, n) { dx[i] = store(load(dout[i]) * gelu_grad(load(x[i]))); }
}

__global__ void bias_broadcast_kernel(__nv_bfloat16* __restrict__ out, const __nv_bfloat16* __restrict__ bias,
                                      std::size_t n, std::size_t cols) {
  GPT_GRID_STRIDE(i, n) { out[i] = bias[i % cols]; }
}

// Not __restrict__: out may be x.
__global__ void residual_bias_kernel(__nv_bfloat16* out, const __nv_bfloat16* x, const __nv_bfloat16* __restrict__ bias,
                                     std::size_t n, std::size_t cols) {
  GPT_GRID_STRIDE(i, n) { out[i] = store(load(x[i]) + load(bias[i % cols])); }
}

// The pair (maximum, sum of exp(v - maximum)) of two parts of a row, symmetric in its arguments so that the
// butterfly gives every lane the same bits. A part with no element is (-inf, 0).
__device__ __forceinline__ void softmax_combine(float& m, float& d, float m2, float d2) {
  const float mx = fmaxf(m, m2);
  const float a = m == -INFINITY ? 0.0f : d * expf(m - mx);
  const float b = m2 == -INFINITY ? 0.0f : d2 * expf(m2 - mx);
  m = mx;
  d = a + b;
}

// The warp's pairs combined by a butterfly: every lane ends with the same bits.
__device__ __forceinline__ void warp_softmax_combine(float& m, float& d) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset);
    const float d2 = __shfl_xor_sync(0xffffffffu, d, offset);
    softmax_combine(m, d, m2, d2);
  }
}

// One warp per row; row i is query position t = i % T of matrix i / T. Online: each lane keeps the maximum of
// its scaled scores and the sum of exp relative to it, rescaling the sum when the maximum grows.
__global__ void causal_softmax_forward_kernel(__nv_bfloat16* __restrict__ probs, const float* __restrict__ scores,
                                              std::size_t rows, int T, float scale) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(warps_per_block) + threadIdx.x / 32;
  if (row >= rows) {
    return;
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int t = static_cast<int>(row % static_cast<std::size_t>(T));
  const float* s = scores + row * static_cast<std::size_t>(T);
  float m = -INFINITY;
  float d = 0.0f;
  for (int j = lane; j <= t; j += 32) {
    const float v = scale * s[j];
    if (v > m) {
      d = d * expf(m - v) + 1.0f; // expf(-inf) = 0 for the lane's first element
      m = v;
    } else {
      d += expf(v - m);
    }
  }
  warp_softmax_combine(m, d);
  const float inv = 1.0f / d; // s = 0 is in every row, so d >= 1
  __nv_bfloat16* p = probs + row * static_cast<std::size_t>(T);
  for (int j = lane; j < T; j += 32) {
    // The mask: a position never attends to later ones.
    p[j] = store(j <= t ? expf(scale * s[j] - m) * inv : 0.0f);
  }
}

__global__ void causal_softmax_backward_kernel(__nv_bfloat16* __restrict__ dscores,
                                               const __nv_bfloat16* __restrict__ probs,
                                               const float* __restrict__ dprobs, std::size_t rows, int T) {
  const std::size_t row = blockIdx.x * static_cast<std::size_t>(warps_per_block) + threadIdx.x / 32;
  if (row >= rows) {
    return;
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int t = static_cast<int>(row % static_cast<std::size_t>(T));
  const std::size_t base = row * static_cast<std::size_t>(T);
  float dot = 0.0f;
  for (int j = lane; j <= t; j += 32) {
    dot += load(probs[base + j]) * dprobs[base + j];
  }
  dot = warp_reduce(dot, sum_op{});
  for (int j = lane; j < T; j += 32) {
    dscores[base + j] = store(j <= t ? load(probs[base + j]) * (dprobs[base + j] - dot) : 0.0f);
  }
}

// The pairs (maximum, sum of exp relative to it) of the block's threads combined: a butterfly within each warp,
// then the warps' pairs in warp order. Every thread gets the same bits; `sm` and `sd` are 32 floats of shared
// memory each, reusable after the call.
__device__ void block_softmax_combine(float& m, float& d, float* sm, float* sd) {
  warp_softmax_combine(m, d);
  if (threadIdx.x % 32 == 0) {
    sm[threadIdx.x / 32] = m;
    sd[threadIdx.x / 32] = d;
  }
  __syncthreads();
  m = sm[0];
  d = sd[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) {
    softmax_combine(m, d, sm[w], sd[w]);
  }
  __syncthreads();
}

constexpr int logits_per_load = 8; // bf16 in 16 bytes

// One block per row, read 16 bytes (8 logits) at a time: one pass for the row's maximum and sum of exp (each
// thread's running pair rescaled when its maximum grows, once per 8 logits), a second to write the gradient.
// Every thread reads the target's logit before the first barrier, so the train pass's writes (after the
// last barrier) never overwrite it before it is read. Logits at or past V are not the row's: they count as
// -inf, and the train pass writes zeros there.
__global__ void cross_entropy_kernel(__nv_bfloat16* __restrict__ logits, float* __restrict__ losses,
                                     const std::int32_t* __restrict__ targets, int V, std::size_t ld, float grad_scale,
                                     bool train) {
  __shared__ float sm[32];
  __shared__ float sd[32];
  const std::size_t row = blockIdx.x;
  __nv_bfloat16* x = logits + row * ld;
  auto* packs = reinterpret_cast<uint4*>(x);
  const int target = targets[row];
  const float target_logit = load(x[target]);
  const int n_packs = (V + logits_per_load - 1) / logits_per_load;
  const auto unpack = [V](uint4 raw, int first, float(&v)[logits_per_load]) {
    const auto* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
    for (int k = 0; k < logits_per_load; ++k) {
      v[k] = first + k < V ? load(e[k]) : -INFINITY;
    }
  };
  float m = -INFINITY;
  float d = 0.0f;
  for (int i = static_cast<int>(threadIdx.x); i < n_packs; i += static_cast<int>(blockDim.x)) {
    float v[logits_per_load];
    unpack(packs[i], i * logits_per_load, v);
    float mx = m;
    for (float e : v) {
      mx = fmaxf(mx, e);
    }
    float s = 0.0f;
    for (float e : v) {
      s += expf(e - mx); // expf(-inf) = 0 for the columns past V
    }
    d = (m == -INFINITY ? 0.0f : d * expf(m - mx)) + s;
    m = mx;
  }
  block_softmax_combine(m, d, sm, sd);
  if (threadIdx.x == 0) {
    // log(sum exp(logits)) - logits[target], with the maximum taken out for range.
    losses[row] = logf(d) - (target_logit - m);
  }
  if (!train) {
    return;
  }
  const float inv = 1.0f / d;
  for (int i = static_cast<int>(threadIdx.x); i < n_packs; i += static_cast<int>(blockDim.x)) {
    float v[logits_per_load];
    unpack(packs[i], i * logits_per_load, v);
    uint4 out;
    auto* o = reinterpret_cast<__nv_bfloat16*>(&out);
    for (int k = 0; k < logits_per_load; ++k) {
      const int col = i * logits_per_load + k;
      const float p = expf(v[k] - m) * inv; // 0 past V
      o[k] = store(col < V ? (p - (col == target ? 1.0f : 0.0f)) * grad_scale : 0.0f);
    }
    packs[i] = out;
  }
}

__global__ void sum_losses_kernel(double* __restrict__ out, const float* __restrict__ losses, std::size_t n) {
  __shared__ double scratch[32];
  double v = 0.0;
  for (std::size_t i = threadIdx.x; i < n; i += blockDim.x) {
    v += static_cast<double>(losses[i]);
  }
  v = block_reduce(v, sum_op{}, scratch);
  if (threadIdx.x == 0) {
    *out = v;
  }
}

__global__ void add_into_bf16_kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, std::size_t n) {
  GPT_GRID_STRIDE(i, n) { dst[i] = store(load(dst[i]) + src[i]); }
}

__global__ void add_into_f32_kernel(float* __restrict__ dst, const float* __restrict__ src, std::size_t n) {
  GPT_GRID_STRIDE(i, n) { dst[i] += src[i]; }
}

#undef GPT_GRID_STRIDE

} // namespace

void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                       cudaStream_t stream) {
  require(B > 0 && T > 0 && C > 0, "embedding_forward: B, T and C must be positive");
  const std::size_t n = static_cast<std::size_t>(B) * static_cast<std::size_t>(T) * static_cast<std::size_t>(C);
  embedding_forward_kernel<<<grid_for(n, threads), threads, 0, stream>>>(
      dev(out), tokens, dev(wte), dev(wpe), n, static_cast<std::size_t>(T), static_cast<std::size_t>(C));
  check_launch();
}

void embedding_backward(float* d_wte, float* d_wpe, const bf16* dout, const std::int32_t* plan, std::size_t distinct,
                        int B, int T, int C, cudaStream_t stream) {
  require(B > 0 && T > 0 && C > 0, "embedding_backward: B, T and C must be positive");
  require(distinct > 0 && distinct <= static_cast<std::size_t>(B) * static_cast<std::size_t>(T),
          "embedding_backward: the plan's distinct tokens must be in 1..B*T");
  const std::int32_t* ids = plan;
  const std::int32_t* offsets = ids + distinct;
  const std::int32_t* rows = offsets + distinct + 1;
  const int wte_threads = std::min(threads, ((C + 31) / 32) * 32);
  embedding_wte_backward_kernel<<<static_cast<unsigned>(distinct), wte_threads, 0, stream>>>(
      d_wte, dev(dout), ids, offsets, rows, static_cast<std::size_t>(C));
  check_launch();
  const std::size_t tc = static_cast<std::size_t>(T) * static_cast<std::size_t>(C);
  embedding_wpe_backward_kernel<<<grid_for(tc, threads), threads, 0, stream>>>(d_wpe, dev(dout),
                                                                               static_cast<std::size_t>(B), tc);
  check_launch();
}

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b,
                       std::size_t rows, int C, cudaStream_t stream) {
  require(C > 0, "layernorm_forward: C must be positive");
  if (rows == 0) {
    return;
  }
  const auto launch = [&](auto kernel) {
    kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(dev(out), mean, rstd, dev(x), dev(w), dev(b), rows, C);
  };
  if (pack_width(static_cast<std::size_t>(C), out, x, w, b) == 8) {
    launch(layernorm_forward_kernel<8>);
  } else {
    launch(layernorm_forward_kernel<1>);
  }
  check_launch();
}

std::size_t column_sum_workspace_floats(std::size_t rows, std::size_t cols) { return row_splits(rows, 8) * cols; }

void layernorm_backward(bf16* dx, grad_ref dw, grad_ref db, float* workspace, const bf16* dout, const bf16* x,
                        const bf16* w, const float* mean, const float* rstd, std::size_t rows, int C,
                        cudaStream_t stream) {
  require(C > 0, "layernorm_backward: C must be positive");
  if (rows == 0) {
    return;
  }
  const auto c = static_cast<std::size_t>(C);
  const std::size_t width = static_cast<std::size_t>(pack_width(c, dx, dout, x, w));
  const std::size_t splits = row_splits(rows, width);
  const std::size_t chunk = (rows + splits - 1) / splits;
  const auto launch = [&](auto dx_kernel, auto partial_kernel) {
    dx_kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(dev(dx), dev(dout), dev(x), dev(w), mean, rstd, rows, C);
    check_launch();
    const std::size_t per_block = column_threads * width;
    const dim3 grid(static_cast<unsigned>((c + per_block - 1) / per_block), static_cast<unsigned>(splits));
    partial_kernel<<<grid, column_threads, 0, stream>>>(workspace, dev(dout), dev(x), mean, rstd, rows, c, chunk);
    check_launch();
  };
  if (width == 8) {
    launch(layernorm_backward_dx_kernel<8>, layernorm_backward_partial_kernel<8>);
  } else {
    launch(layernorm_backward_dx_kernel<1>, layernorm_backward_partial_kernel<1>);
  }
  column_finish(dw, workspace, 2 * c, splits, c, stream);
  column_finish(db, workspace + c, 2 * c, splits, c, stream);
}

void gelu_forward(bf16* out, const bf16* x, std::size_t n, cudaStream_t stream) {
  if (n == 0) {
    return;
  }
  gelu_forward_kernel<<<grid_for(n, threads), threads, 0, stream>>>(dev(out), dev(x), n);
  check_launch();
}

void gelu_backward(bf16* dx, const bf16* x, const bf16* dout, std::size_t n, cudaStream_t stream) {
  if (n == 0) {
    return;
  }
  gelu_backward_kernel<<<grid_for(n, threads), threads, 0, stream>>>(dev(dx), dev(x), dev(dout), n);
  check_launch();
}

void bias_broadcast(bf16* out, const bf16* bias, std::size_t rows, int cols, cudaStream_t stream) {
  require(cols > 0, "bias_broadcast: cols must be positive");
  const std::size_t n = rows * static_cast<std::size_t>(cols);
  if (n == 0) {
    return;
  }
  bias_broadcast_kernel<<<grid_for(n, threads), threads, 0, stream>>>(dev(out), dev(bias), n,
                                                                      static_cast<std::size_t>(cols));
  check_launch();
}

void residual_bias(bf16* out, const bf16* x, const bf16* bias, std::size_t rows, int cols, cudaStream_t stream) {
  require(cols > 0, "residual_bias: cols must be positive");
  const std::size_t n = rows * static_cast<std::size_t>(cols);
  if (n == 0) {
    return;
  }
  residual_bias_kernel<<<grid_for(n, threads), threads, 0, stream>>>(dev(out), dev(x), dev(bias), n,
                                                                     static_cast<std::size_t>(cols));
  check_launch();
}

void bias_backward(grad_ref dbias, float* workspace, const bf16* dout, std::size_t rows, int cols,
                   cudaStream_t stream) {
  require(cols > 0, "bias_backward: cols must be positive");
  if (rows == 0) {
    return;
  }
  const auto c = static_cast<std::size_t>(cols);
  const std::size_t width = static_cast<std::size_t>(pack_width(c, dout));
  const std::size_t splits = row_splits(rows, width);
  const std::size_t chunk = (rows + splits - 1) / splits;
  const std::size_t per_block = column_threads * width;
  const dim3 grid(static_cast<unsigned>((c + per_block - 1) / per_block), static_cast<unsigned>(splits));
  if (width == 8) {
    bias_backward_partial_kernel<8><<<grid, column_threads, 0, stream>>>(workspace, dev(dout), rows, c, chunk);
  } else {
    bias_backward_partial_kernel<1><<<grid, column_threads, 0, stream>>>(workspace, dev(dout), rows, c, chunk);
  }
  check_launch();
  column_finish(dbias, workspace, c, splits, c, stream);
}

void causal_softmax_forward(bf16* probs, const float* scores, std::size_t matrices, int T, float scale,
                            cudaStream_t stream) {
  require(T > 0, "causal_softmax_forward: T must be positive");
  const std::size_t rows = matrices * static_cast<std::size_t>(T);
  if (rows == 0) {
    return;
  }
  causal_softmax_forward_kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(dev(probs), scores, rows, T, scale);
  check_launch();
}

void causal_softmax_backward(bf16* dscores, const bf16* probs, const float* dprobs, std::size_t matrices, int T,
                             cudaStream_t stream) {
  require(T > 0, "causal_softmax_backward: T must be positive");
  const std::size_t rows = matrices * static_cast<std::size_t>(T);
  if (rows == 0) {
    return;
  }
  causal_softmax_backward_kernel<<<blocks_for_rows(rows), threads, 0, stream>>>(dev(dscores), dev(probs), dprobs, rows,
                                                                                T);
  check_launch();
}

void cross_entropy(bf16* logits, float* losses, const std::int32_t* targets, std::size_t rows, int V, std::size_t ld,
                   float grad_scale, bool train, cudaStream_t stream) {
  require(V > 0 && ld >= static_cast<std::size_t>(V), "cross_entropy: need 0 < V <= ld");
  if (ld % logits_per_load != 0 || reinterpret_cast<std::uintptr_t>(logits) % 16 != 0) {
    throw zero::usage_error("gpt kernels: cross_entropy: ld " + std::to_string(ld) + ", the logits " +
                            std::to_string(reinterpret_cast<std::uintptr_t>(logits) % 16) +
                            " bytes past 16-byte alignment; expected ld a multiple of 8 and 16-byte aligned logits "
                            "(the rows are read 16 bytes at a time)");
  }
  if (rows == 0) {
    return;
  }
  require(rows <= 0x7fffffffu, "cross_entropy: more rows than a grid holds");
  cross_entropy_kernel<<<static_cast<unsigned>(rows), row_threads, 0, stream>>>(dev(logits), losses, targets, V, ld,
                                                                                grad_scale, train);
  check_launch();
}

void sum_losses(double* out, const float* losses, std::size_t n, cudaStream_t stream) {
  sum_losses_kernel<<<1, total_threads, 0, stream>>>(out, losses, n);
  check_launch();
}

} // namespace gpt::kernels

namespace gpt {

void add_into(void* dst, zero::dtype dst_type, const float* src, std::size_t n, cudaStream_t stream) {
  using namespace kernels; // its kernels and helpers (in its unnamed namespace)
  require(dst_type == zero::dtype::bf16 || dst_type == zero::dtype::f32,
          "add_into: the destination must be bf16 or fp32");
  if (n == 0) {
    return;
  }
  if (dst_type == zero::dtype::bf16) {
    add_into_bf16_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), src, n);
  } else {
    add_into_f32_kernel<<<grid_for(n, threads), threads, 0, stream>>>(static_cast<float*>(dst), src, n);
  }
  check_launch();
}

} // namespace gpt
