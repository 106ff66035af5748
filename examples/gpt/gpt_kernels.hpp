#pragma once
/// @file gpt_kernels.hpp
/// The GPT example's own CUDA kernels (gpt_kernels.cu): everything `gpt::cuda_model` (gpt_cuda.hpp) runs
/// besides the GEMMs, which cuBLAS runs. Host code only: this header compiles with g++ and clang.
///
/// Conventions of every launcher:
/// - tensors are row-major device memory; `bf16` is `zero::bf16`, bit-compatible with `__nv_bfloat16`;
/// - each element is read into fp32, computed in fp32 and rounded to nearest even where a bf16 is stored;
/// - the launcher enqueues on `stream` and never synchronizes; the caller owns every buffer and keeps it
///   alive until the stream has passed the work;
/// - a failed launch throws `zero::cuda_error` (ZERO_CHECK_CUDA); an argument the kernels cannot take
///   throws `zero::usage_error` before anything is enqueued;
/// - reductions sum in an order fixed by the shapes alone (no float atomics), so the same inputs give the
///   same bits on every run.

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <span>
#include <zero/core/dtype.hpp>

namespace gpt::kernels {

using zero::bf16;

/// Where a kernel adds a parameter's gradient: fp32, or bf16 (an engine's 16-bit gradient: the old value read
/// into fp32, the sum taken in fp32 and rounded once, as adding an fp32 gradient into it would).
struct grad_ref {
  void* data = nullptr;
  bool bf16 = false;
  grad_ref() = default;
  grad_ref(float* p) : data(p) {}                  // NOLINT(google-explicit-constructor): fp32 is the plain case
  grad_ref(zero::bf16* p) : data(p), bf16(true) {} // NOLINT(google-explicit-constructor)
};

/// The residual stream at the input: `out[b, t, :] = bf16(wte[tokens[b, t], :] + wpe[t, :])`.
/// @param out [B, T, C]; @param tokens [B, T] device ids, each in [0, V) (the caller checks them)
/// @param wte [V, C]; @param wpe [>= T, C]
void embedding_forward(bf16* out, const std::int32_t* tokens, const bf16* wte, const bf16* wpe, int B, int T, int C,
                       cudaStream_t stream);

/// Int32 elements of the plan `build_embedding_plan` writes for `rows` tokens: at most 3 * rows + 1.
[[nodiscard]] constexpr std::size_t embedding_plan_ints(std::size_t rows) { return 3 * rows + 1; }

/// The host half of the embedding's deterministic backward: a counting sort of the rows (b * T + t) by
/// token. Writes into `plan`, in this order, the `distinct` token ids that occur (ascending), their
/// `distinct + 1` offsets into the row list, and the rows (ascending within each token).
/// @param tokens the [B, T] ids, row-major, each in [0, counts.size()) (the caller checks them)
/// @param counts host scratch of vocab ints (overwritten)
/// @param plan host buffer of at least `embedding_plan_ints(tokens.size())` ints
/// @returns the number of distinct tokens; the plan's length is `2 * distinct + 1 + tokens.size()`.
inline std::size_t build_embedding_plan(std::span<const std::int32_t> tokens, std::span<std::int32_t> counts,
                                        std::span<std::int32_t> plan) {
  for (auto& c : counts) {
    c = 0;
  }
  for (const std::int32_t t : tokens) {
    ++counts[static_cast<std::size_t>(t)];
  }
  const std::size_t vocab = counts.size();
  std::size_t distinct = 0;
  for (std::size_t v = 0; v < vocab; ++v) {
    distinct += counts[v] > 0 ? 1 : 0;
  }
  std::int32_t* ids = plan.data();
  std::int32_t* offsets = ids + distinct;
  std::int32_t* rows = offsets + distinct + 1;
  // counts[v] becomes the first free slot of token v's rows: a stable placement keeps each token's rows
  // ascending, so the device sums them in (b, t) order.
  std::size_t k = 0;
  std::int32_t next = 0;
  for (std::size_t v = 0; v < vocab; ++v) {
    const std::int32_t n = counts[v];
    if (n > 0) {
      ids[k] = static_cast<std::int32_t>(v);
      offsets[k] = next;
      ++k;
    }
    counts[v] = next;
    next += n;
  }
  offsets[distinct] = next;
  for (std::size_t r = 0; r < tokens.size(); ++r) {
    rows[counts[static_cast<std::size_t>(tokens[r])]++] = static_cast<std::int32_t>(r);
  }
  return distinct;
}

/// The embeddings' backward, deterministic: one thread block per distinct token sums that token's rows of
/// `dout` in ascending order and adds the sum into its row of `d_wte` (fp32 +=); each (t, c) of `d_wpe` adds
/// the sum over b = 0..B-1 of dout[b, t, c], in that order.
/// @param d_wte [V, C] fp32, added into; @param d_wpe [>= T, C] fp32, added into
/// @param dout [B, T, C] the residual stream's gradient at the input
/// @param plan device copy of `build_embedding_plan`'s output; @param distinct its return value
void embedding_backward(float* d_wte, float* d_wpe, const bf16* dout, const std::int32_t* plan, std::size_t distinct,
                        int B, int T, int C, cudaStream_t stream);

/// LayerNorm over the last dimension (eps 1e-5): `out = bf16((x - mean) * rstd * w + b)` per row, with the
/// row's mean and rstd = 1 / sqrt(var + eps) kept in fp32 for the backward.
/// @param out, @param x [rows, C]; @param mean, @param rstd [rows] fp32; @param w, @param b [C]
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* x, const bf16* w, const bf16* b,
                       std::size_t rows, int C, cudaStream_t stream);

/// Floats of workspace `bias_backward` needs for a [rows, cols] gradient, and `layernorm_backward` for
/// cols = 2 * C: one partial column sum per fixed split of the rows.
[[nodiscard]] std::size_t column_sum_workspace_floats(std::size_t rows, std::size_t cols);

/// LayerNorm's backward: `dx = bf16(dx + the input's gradient)` (dx is the residual stream's gradient,
/// which the LayerNorm's branch adds to), `dw += sum over rows of dout * norm`, `db += sum over rows of
/// dout` (fp32, partial sums over fixed row splits, then a second pass over the splits in order).
/// @param dx [rows, C] bf16, added into; @param dw, @param db [C] fp32 or bf16, added into
/// @param workspace `column_sum_workspace_floats(rows, 2 * C)` floats
/// @param dout [rows, C] the gradient at the LayerNorm's output; @param x its input; @param w its weight
/// @param mean, @param rstd the forward's statistics
void layernorm_backward(bf16* dx, grad_ref dw, grad_ref db, float* workspace, const bf16* dout, const bf16* x,
                        const bf16* w, const float* mean, const float* rstd, std::size_t rows, int C,
                        cudaStream_t stream);

/// GELU, tanh form: `out = bf16(0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))))` over n elements.
void gelu_forward(bf16* out, const bf16* x, std::size_t n, cudaStream_t stream);

/// GELU's backward: `dx = bf16(dout * gelu'(x))` over n elements; `dx` may be `dout` (in place).
void gelu_backward(bf16* dx, const bf16* x, const bf16* dout, std::size_t n, cudaStream_t stream);

/// Every row of `out` [rows, cols] becomes `bias` [cols]: the C of a GEMM with beta = 1 that adds the bias
/// with the product's one rounding.
void bias_broadcast(bf16* out, const bf16* bias, std::size_t rows, int cols, cudaStream_t stream);

/// The residual add before a projection: `out = bf16(x + bias)` per row ([rows, cols], bias [cols]); a GEMM
/// with beta = 1 then adds the projection. `out` may be `x`.
void residual_bias(bf16* out, const bf16* x, const bf16* bias, std::size_t rows, int cols, cudaStream_t stream);

/// The bias gradient: `dbias[j] += sum over rows of dout[r, j]` (fp32, fixed row splits, then the splits
/// in order; `dbias` fp32 or bf16). @param dout [rows, cols]; @param workspace `column_sum_workspace_floats(rows,
/// cols)` floats
void bias_backward(grad_ref dbias, float* workspace, const bf16* dout, std::size_t rows, int cols, cudaStream_t stream);

/// The causal softmax of attention, fused with the scale and the mask, one row at a time in fp32 (online
/// maximum and sum): for `matrices` score matrices [T, T] back to back, row t of each becomes
/// `probs[t, s] = bf16(softmax_s(scale * scores[t, s]))` for s <= t and 0 above the diagonal.
/// @param probs [matrices, T, T] bf16; @param scores [matrices, T, T] fp32 (q k^T, unscaled)
void causal_softmax_forward(bf16* probs, const float* scores, std::size_t matrices, int T, float scale,
                            cudaStream_t stream);

/// The causal softmax's backward (without the scale, which the caller's GEMMs apply): per row t,
/// `dscores[t, s] = bf16(p (dp - sum_{s' <= t} p dp))` for s <= t and 0 above the diagonal, with
/// p = probs[t, s], dp = dprobs[t, s]. All three are [matrices, T, T].
void causal_softmax_backward(bf16* dscores, const bf16* probs, const float* dprobs, std::size_t matrices, int T,
                             cudaStream_t stream);

/// Whether the fused attention below takes heads of `head_size` elements: 16, 32, 64 or 128.
[[nodiscard]] bool fused_attention_supports(int head_size);

/// Causal self-attention without the scores in memory (gpt_attention.cu, FlashAttention-2's schedule on the
/// tensor cores): for each sequence b and head h, `out[b, t, h] = sum_{s <= t} softmax_s(q_t · k_s / sqrt(HD)) v_s`,
/// the probabilities rounded to bf16 before they weight v (as the materialized path's bf16 probs), and
/// `lse[b, h, t]`, the row's log-sum-exp of the scaled scores in base 2 (log2 of the softmax's denominator),
/// which the backward reads.
/// @param out [B, T, C] bf16; @param lse [B, NH, T] fp32
/// @param qkv [B, T, 3C] bf16: q, k, v at columns h·HD, C + h·HD, 2C + h·HD, HD = C / NH
/// @throws zero::usage_error unless B, T >= 1, B · NH <= 65535 and fused_attention_supports(C / NH).
void fused_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int C, cudaStream_t stream);

/// The fused attention's backward: `dqkv` [B, T, 3C] overwritten with dq, dk, dv from `dout` = d out, the
/// forward's `out`, `qkv` and `lse`; P recomputed from lse tile by tile. Each element is summed by one warp
/// in a fixed order (dK and dV per key tile, dQ per query tile): no atomics, the same bits every run.
/// @param dsum [B, NH, T] fp32 scratch (the rows' dout · out)
/// @throws zero::usage_error as fused_attention_forward.
void fused_attention_backward(bf16* dqkv, float* dsum, const bf16* dout, const bf16* out, const bf16* qkv,
                              const float* lse, int B, int T, int NH, int C, cudaStream_t stream);

/// The LM head's softmax fused with cross-entropy, one thread block per row of `logits` [rows, V] (leading
/// dimension `ld` >= V, a multiple of 8; `logits` 16-byte aligned: the rows are read 16 bytes at a time): the
/// row's maximum, its sum of exp in fp32, and
/// `losses[r] = log(sum) - (logits[r, target] - max)`. With `train` the row is overwritten in place by its
/// gradient `bf16((softmax - onehot(target)) * grad_scale)` and its columns [V, round_up(V, 8)) by zeros; without
/// it the logits are left as they are.
/// @param targets [rows] device ids in [0, V) (the caller checks them); @param losses [rows] fp32
void cross_entropy(bf16* logits, float* losses, const std::int32_t* targets, std::size_t rows, int V, std::size_t ld,
                   float grad_scale, bool train, cudaStream_t stream);

/// `*out = sum of losses[0..n)` in double, in an order fixed by n (one thread block).
void sum_losses(double* out, const float* losses, std::size_t n, cudaStream_t stream);

} // namespace gpt::kernels

namespace gpt {

/// Adds an fp32 buffer into a buffer of `dst_type`: `dst[i] = bf16(dst[i] + src[i])` (round to nearest even)
/// for bf16, `dst[i] += src[i]` for f32; how the model's fp32 gradients reach an engine's buffers (in namespace
/// gpt, beside the model, rather than among its kernels: the engine side calls it). Enqueued on `stream`.
/// @param dst n elements of `dst_type` (device); @param src n floats (device)
/// @throws zero::usage_error for any other dtype; zero::cuda_error when the launch fails.
void add_into(void* dst, zero::dtype dst_type, const float* src, std::size_t n, cudaStream_t stream);

} // namespace gpt
