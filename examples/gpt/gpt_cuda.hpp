#pragma once
/// @file gpt_cuda.hpp
/// GPT-2's model math on one GPU: `cuda_model`, the CUDA twin of gpt_model.hpp's `cpu_model`, with the same
/// modules, the same call order and the same numerics up to precision. Parameters are bf16, activations bf16
/// (with fp32 where a statistic needs it: LayerNorm's mean and rstd, the per-token losses), the matmuls run on
/// cuBLAS with bf16 operands and fp32 accumulation, and every gradient is accumulated in fp32 in the caller's
/// buffers. Host code only (compiles with g++); link `zero_gpt_cuda_kernels` (gpt_kernels.cu), CUDA::cublas
/// and the CUDA runtime. `model_config` comes from gpt_model.hpp, which also needs <cblas.h> to compile.

#include "gpt_kernels.hpp"
#include "gpt_model.hpp"
#include "gpt_profile.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <iterator>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#include <zero/backend/cuda_backend.hpp>
#include <zero/core/cuda_check.hpp>
#include <zero/core/dtype.hpp>
#include <zero/core/error.hpp>
#include <zero/core/source_location.hpp>
#include <zero/engine/activation_store.hpp>
#include <zero/memory/buffer.hpp>
#include <zero/memory/device_allocator.hpp>
#include <zero/memory/pinned_allocator.hpp>

namespace gpt {

/// The 12 tensors of block l on the device, bf16, read-only; the same order and layouts as `block_params`.
using cuda_block_params = basic_block_params<zero::bf16>;
/// Where the GPU adds a gradient: fp32, or an engine's bf16 gradient (kernels::grad_ref).
using kernels::grad_ref;
/// The gradients of block l's 12 tensors on the device, added into, each fp32 or bf16.
using cuda_block_grads = basic_block_grads<grad_ref>;

namespace detail {

/// Throws `zero::cuda_error` naming the call, the place and cuBLAS's status text when a cuBLAS call fails.
inline void check_cublas(cublasStatus_t status, const char* expr, const zero::detail::source_location& loc) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw zero::cuda_error(std::string(expr) + " failed at " + zero::detail::where(loc) + ": " +
                               cublasGetStatusString(status),
                           static_cast<int>(status));
  }
}

} // namespace detail

/// Evaluates the cuBLAS call `expr`; throws `zero::cuda_error` when it does not return CUBLAS_STATUS_SUCCESS.
#define GPT_CHECK_CUBLAS(expr) ::gpt::detail::check_cublas((expr), #expr, ::zero::detail::source_location::current())

/// How `cuda_model` computes causal self-attention.
enum class attention_path {
  /// gpt_attention.cu's fused kernels: no [T, T] scores in memory, the rows' log-sum-exp kept per layer
  /// ([B, NH, T] fp32); head sizes 16, 32, 64 and 128.
  fused,
  /// cuBLAS batched GEMMs per sequence over the probabilities [B, NH, T, T] kept per layer (bf16); any head size.
  materialized,
};

/// The path `cuda_model` takes by default: fused where the head size allows it.
[[nodiscard]] inline attention_path default_attention(const model_config& cfg) {
  return kernels::fused_attention_supports(cfg.d_model / cfg.heads) ? attention_path::fused
                                                                    : attention_path::materialized;
}

/// What `cuda_model` keeps between a block's forward and its backward, and how it computes attention.
struct cuda_model_options {
  /// The attention's path; `default_attention(cfg)` when empty.
  std::optional<attention_path> attention{};
  /// Activation checkpointing: each block's input is kept and the rest of its activations are recomputed in its
  /// backward (up to the MLP's GELU: the block's output is not needed), in one block's buffers shared by all.
  /// The recomputation runs the same kernels on the same inputs, so the gradients have the same bits as
  /// without it.
  bool checkpoint = false;
  /// With `checkpoint`: the block inputs in host memory through a `zero::activation_store` of these sizes
  /// (DeepSpeed's `activation_checkpointing.cpu_checkpointing`): two of them on the device during forward,
  /// the ring's during backward.
  std::optional<zero::activation_store_options> offload{};
  /// With `offload`: the zero stream whose handle is the model's stream (the store orders its copies by it).
  const zero::cuda_stream* compute = nullptr;
  /// Time every operation on the stream (`op_timer`; `profile()`): what bounds a step.
  bool profile = false;
  /// The block's projections through cuBLASLt with their elementwise work in the GEMM's epilogue: the biases,
  /// the residual adds (C = the stream, D = the new stream), c_fc's GELU (its input kept as the epilogue's aux
  /// output) and GELU's backward in the c_proj input gradient's GEMM. Saves the bias, residual and GELU kernels'
  /// passes over memory; the sums round once instead of twice (bias and residual added in fp32 with the
  /// product), so the bits differ from the path without it. Off here; zero-gpt-cuda turns it on (-8% of the d12's
  /// step).
  bool gemm_epilogues = false;
};

/// GPT-2's forward and backward on one GPU, module by module, over device parameters the caller owns.
/// The model holds every activation the backward needs (for up to `batch` x `cfg.seq` tokens), the
/// backward's scratch, its cuBLAS handle and workspace, all allocated by the constructor: a step allocates
/// nothing. All device work is enqueued on the constructor's `stream`; only `head_forward_loss` (to read the
/// loss) and `logits()` wait for it.
///
/// One step, with the caller's pointers valid until the stream has passed each call's work:
///   embed_forward, block_forward(0..L-1), final_forward, head_forward_loss(train = true),
///   head_backward, final_backward, block_backward(L-1..0), embed_backward.
/// Every backward ADDS its gradients into the caller's device buffers (cuBLAS with beta = 1, kernels with +=), so
/// micro-batches accumulate and the tied wte collects both of its uses in one buffer. They are fp32, except that
/// final_backward's and block_backward's may each be bf16 (`grad_ref`): an engine's 16-bit gradient, added into
/// in fp32 and rounded once, as an fp32 buffer added into it after the backward would be. wte's and wpe's are fp32. The
/// gradients are those of grad_scale * (sum of the token losses). Every sum runs in an order fixed by the
/// shapes, so the same inputs give the same bits.
///
/// Token ids and targets are HOST arrays: the model checks every id before it uploads anything.
class cuda_model {
public:
  /// Allocates the activations for `batch` sequences of up to `cfg.seq` tokens on the current device, and a
  /// cuBLAS handle bound to `stream` with a workspace of its own.
  /// @param stream the stream every call enqueues on (the caller's; it must outlive the model)
  /// @param o the attention's path and what the model keeps for the backward (see cuda_model_options)
  /// @throws std::invalid_argument when `cfg` does not validate, `batch` < 1, the fused path is asked for
  ///         with a head size it does not take, or `o.offload` comes without `o.checkpoint` or without the
  ///         stream's `o.compute`; zero::memory_error when the device (or the store's host) memory does not
  ///         fit; zero::cuda_error when a CUDA or cuBLAS call fails.
  cuda_model(model_config cfg, int batch, cudaStream_t stream, cuda_model_options o = {})
      : cfg_(cfg), batch_(batch), stream_(stream), checkpoint_(o.checkpoint) {
    cfg_.validate();
    if (batch < 1) {
      throw std::invalid_argument("--batch: expected a whole number >= 1, found " + std::to_string(batch));
    }
    if (o.offload && (!o.checkpoint || o.compute == nullptr || o.compute->get() != stream)) {
      const char* wrong = !o.checkpoint          ? "checkpoint is false"
                          : o.compute == nullptr ? "compute is null"
                                                 : "compute is another stream than the model's";
      throw std::invalid_argument(std::string("cuda_model: offload (the checkpoints in host memory) with ") + wrong +
                                  "; expected checkpoint = true and compute = the zero::cuda_stream whose handle "
                                  "is the model's stream");
    }
    attention_ = o.attention.value_or(default_attention(cfg_));
    if (attention_ == attention_path::fused && !kernels::fused_attention_supports(cfg_.d_model / cfg_.heads)) {
      throw std::invalid_argument("cuda_model: the fused attention takes heads of 16, 32, 64 or 128 elements, found " +
                                  std::to_string(cfg_.d_model / cfg_.heads) + " (--d-model / --heads)");
    }
    const bool fused = attention_ == attention_path::fused;
    const std::size_t bt = static_cast<std::size_t>(batch) * static_cast<std::size_t>(cfg_.seq);
    const std::size_t c = C(), l = static_cast<std::size_t>(cfg_.layers), t = static_cast<std::size_t>(cfg_.seq);
    const std::size_t nh = static_cast<std::size_t>(cfg_.heads);
    // A block's activations: one slice per block, or one shared by all when checkpointing.
    const std::size_t kept = checkpoint_ ? 1 : l;
    encoded_ = device<zero::bf16>(bt * c);
    ln1_ = device<zero::bf16>(kept * bt * c);
    ln1_mean_ = device<float>(kept * bt);
    ln1_rstd_ = device<float>(kept * bt);
    qkv_ = device<zero::bf16>(kept * bt * 3 * c);
    if (fused) {
      lse_ = device<float>(kept * static_cast<std::size_t>(batch) * nh * t);
      dsum_ = device<float>(static_cast<std::size_t>(batch) * nh * t);
    } else {
      att_ = device<zero::bf16>(kept * static_cast<std::size_t>(batch) * nh * t * t);
      scores_ = device<float>(nh * t * t);
      dscores_ = device<zero::bf16>(nh * t * t);
    }
    atty_ = device<zero::bf16>(kept * bt * c);
    res2_ = device<zero::bf16>(kept * bt * c);
    ln2_ = device<zero::bf16>(kept * bt * c);
    ln2_mean_ = device<float>(kept * bt);
    ln2_rstd_ = device<float>(kept * bt);
    fch_ = device<zero::bf16>(kept * bt * 4 * c);
    fch_gelu_ = device<zero::bf16>(kept * bt * 4 * c);
    // The blocks' outputs (the next blocks' inputs): every block's, or two in turn when they go to the host.
    res3_ = device<zero::bf16>((o.offload ? 2 : l) * bt * c);
    ids_.assign(l, 0);
    lnf_ = device<zero::bf16>(bt * c);
    lnf_mean_ = device<float>(bt);
    lnf_rstd_ = device<float>(bt);
    logits_ = device<zero::bf16>(bt * Vp());
    wte_padded_ = device<zero::bf16>(Vp() * c);
    losses_ = device<float>(bt);
    loss_ = device<double>(1);
    dres_ = device<zero::bf16>(bt * c);
    dln_ = device<zero::bf16>(bt * c);
    datty_ = device<zero::bf16>(bt * c);
    dqkv_ = device<zero::bf16>(bt * 3 * c);
    dfch_ = device<zero::bf16>(bt * 4 * c);
    // The widest column sum: c_fc's bias gradient, 4C columns (LayerNorm's needs 2C, c_attn's 3C).
    column_workspace_ = device<float>(kernels::column_sum_workspace_floats(bt, 4 * c));
    tokens_ = device<std::int32_t>(bt);
    targets_ = device<std::int32_t>(bt);
    plan_ = device<std::int32_t>(kernels::embedding_plan_ints(bt));
    cublas_workspace_ = device<std::byte>(cublas_workspace_bytes);

    tokens_host_ = pinned<std::int32_t>(bt);
    targets_host_ = pinned<std::int32_t>(bt);
    plan_host_ = pinned<std::int32_t>(kernels::embedding_plan_ints(bt));
    loss_host_ = pinned<double>(1);
    counts_.resize(V());
    tokens_done_ = make_event();
    targets_done_ = make_event();
    plan_done_ = make_event();

    if (o.profile) {
      timer_ = std::make_unique<op_timer>();
    }
    if (o.offload) {
      int dev = 0;
      ZERO_CHECK_CUDA(cudaGetDevice(&dev));
      store_backend_.emplace(dev);
      compute_ = o.compute;
      store_ = std::make_unique<store_type>(*store_backend_, *compute_, *o.offload);
    }

    if (o.gemm_epilogues) {
      cublasLtHandle_t lt = nullptr;
      GPT_CHECK_CUBLAS(cublasLtCreate(&lt));
      lt_.reset(lt);
    }

    cublasHandle_t handle = nullptr;
    GPT_CHECK_CUBLAS(cublasCreate(&handle));
    cublas_.reset(handle);
    GPT_CHECK_CUBLAS(cublasSetStream(handle, stream_));
    GPT_CHECK_CUBLAS(cublasSetWorkspace(handle, cublas_workspace_.data(), cublas_workspace_.bytes()));
    GPT_CHECK_CUBLAS(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH));

    // wte_padded_'s rows [V, Vp) stay zero, so the logits' padding columns come out of the head's GEMM as zeros
    // (and add nothing to its input gradient's); the GEMM writes every column of the logits it uses.
    ZERO_CHECK_CUDA(cudaMemsetAsync(wte_padded_.data(), 0, wte_padded_.bytes(), stream_));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  cuda_model(const cuda_model&) = delete;
  cuda_model& operator=(const cuda_model&) = delete;
  cuda_model(cuda_model&&) = delete;
  cuda_model& operator=(cuda_model&&) = delete;

  /// Waits for the model's work on the stream, then frees everything (the cuBLAS handle before its workspace).
  ~cuda_model() { ZERO_CHECK_CUDA_NOTHROW(cudaStreamSynchronize(stream_)); }

  /// The model's shape.
  [[nodiscard]] const model_config& config() const { return cfg_; }
  /// The most sequences one pass takes.
  [[nodiscard]] int batch() const { return batch_; }
  /// The stream every call enqueues on.
  [[nodiscard]] cudaStream_t stream() const { return stream_; }
  /// The attention's path.
  [[nodiscard]] attention_path attention() const { return attention_; }
  /// Whether the model checkpoints (see cuda_model_options), and whether its checkpoints go to the host.
  [[nodiscard]] bool checkpointing() const { return checkpoint_; }
  [[nodiscard]] bool offloading() const { return store_ != nullptr; }
  /// Milliseconds per operation on the stream since the last `profile_reset` (empty without
  /// cuda_model_options::profile); "outside the model" is the stream's time between the model's calls (the
  /// engine's work on it, and its waits). Waits for the stream's work so far.
  [[nodiscard]] std::vector<std::pair<std::string, double>> profile() const {
    return timer_ ? timer_->totals() : std::vector<std::pair<std::string, double>>{};
  }
  void profile_reset() {
    if (timer_) {
      timer_->reset();
    }
  }
  /// Starts `name` (a string that outlives the model) in the profile: the caller's work on the model's stream
  /// between the model's calls, which would otherwise count as "outside the model".
  void mark(const char* name) { op(name); }
  /// Host bytes the checkpoints' store holds (pinned), 0 without offload.
  [[nodiscard]] std::size_t checkpoint_host_bytes() const { return store_ ? store_->host_memory().total().live : 0; }

  /// Device bytes the model holds: activations, logits, the backward's scratch, the token buffers and the
  /// workspaces (cuBLAS's included).
  [[nodiscard]] std::size_t activation_bytes() const {
    std::size_t n = 0;
    for (const auto* b : {&encoded_, &ln1_, &qkv_, &att_, &atty_, &res2_, &ln2_, &fch_, &fch_gelu_, &res3_, &lnf_,
                          &logits_, &wte_padded_, &dres_, &dln_, &datty_, &dqkv_, &dfch_, &dscores_}) {
      n += b->bytes();
    }
    for (const auto* b : {&ln1_mean_, &ln1_rstd_, &ln2_mean_, &ln2_rstd_, &lnf_mean_, &lnf_rstd_, &losses_, &scores_,
                          &lse_, &dsum_, &column_workspace_}) {
      n += b->bytes();
    }
    for (const auto* b : {&tokens_, &targets_, &plan_}) {
      n += b->bytes();
    }
    const std::size_t ring = store_ ? store_->device_memory().total().live : 0;
    return n + loss_.bytes() + cublas_workspace_.bytes() + ring;
  }

  /// Starts a pass: the residual stream becomes wte[tokens] + wpe[position] (rounded to bf16).
  /// @param wte [V, C] token embedding; @param wpe [T, C] position embedding (device, bf16)
  /// @param tokens [B, T] row-major token ids on the HOST (uploaded by the call)
  /// @param B sequences, 1..batch(); @param T tokens per sequence, 1..cfg.seq
  /// @throws std::invalid_argument when B or T is out of range; std::out_of_range naming the position
  ///         (b, t) and the id of the first token outside [0, vocab), before anything is uploaded or launched.
  void embed_forward(const zero::bf16* wte, const zero::bf16* wpe, const std::int32_t* tokens, int B, int T) {
    check_batch(B, T, batch_, cfg_.seq, "embed_forward");
    check_tokens(tokens, B, T, "embed_forward", "token");
    B_ = B;
    T_ = T;
    have_dlogits_ = false;
    have_logits_ = false;
    held_ = -1;
    if (store_) {
      // The last pass's checkpoints came from encoded_ and the two output slots this pass overwrites: every
      // copy down has landed first. A pass without backward leaves some unread; the store starts again.
      for (std::size_t id = 0; id < store_->size(); ++id) {
        store_->wait_saved(id, *compute_);
      }
      store_->clear();
    }
    op("embedding");
    upload(tokens, rows(), tokens_host_, tokens_, tokens_done_.get());
    kernels::embedding_forward(encoded_.data(), tokens_.data(), wte, wpe, B, T, cfg_.d_model, stream_);
    op(outside);
  }

  /// Block l's forward: x += attn(ln_1(x)); x += mlp(ln_2(x)). With offload, the block's input is copied down
  /// to the host first (blocks in order 0..L-1).
  /// @throws std::out_of_range when l is not a block; std::logic_error before embed_forward.
  void block_forward(int l, cuda_block_params p) {
    check_layer(l, "block_forward");
    const zero::bf16* x = block_input(l);
    if (store_) {
      ids_[static_cast<std::size_t>(l)] = store_->save(x, rows() * C() * sizeof(zero::bf16));
      if (l >= 2) { // the output slot held block l - 1's input: its copy down has landed
        store_->wait_saved(ids_[static_cast<std::size_t>(l - 1)], *compute_);
      }
    }
    forward_block(l, p, x, block_output(l));
    op(outside);
  }

  /// The final LayerNorm over the last block's output.
  /// @throws std::logic_error before embed_forward.
  void final_forward(const zero::bf16* lnf_w, const zero::bf16* lnf_b) {
    check_pass("final_forward");
    op("layernorm");
    kernels::layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), block_input(cfg_.layers), lnf_w, lnf_b,
                               rows(), cfg_.d_model, stream_);
    op(outside);
  }

  /// The tied LM head and the loss: logits = ln_f(x) · wteᵀ, then softmax and cross-entropy fused per row.
  /// Waits for the stream once, to read the loss.
  /// @param wte [V, C] the token embedding (tied), device bf16
  /// @param targets [B, T] row-major ids on the HOST, each in [0, vocab)
  /// @param grad_scale the factor of the loss whose gradients the backward computes (loss scale / tokens in
  ///        the global batch)
  /// @param train overwrite the logits with dlogits = (softmax - onehot) * grad_scale for head_backward;
  ///        without it the logits stay readable through `logits()`
  /// @returns the sum of the B * T token losses (natural log): per-token losses in fp32, summed in double
  /// @throws std::out_of_range naming the position and id of a target outside [0, vocab), before anything is
  ///         uploaded or launched; std::logic_error before embed_forward.
  double head_forward_loss(const zero::bf16* wte, const std::int32_t* targets, float grad_scale, bool train) {
    check_pass("head_forward_loss");
    check_tokens(targets, B_, T_, "head_forward_loss", "target");
    const std::size_t n = rows();
    const int c = cfg_.d_model, v = cfg_.vocab, vp = static_cast<int>(Vp());
    upload(targets, n, targets_host_, targets_, targets_done_.get());
    // logits[n, Vp] = lnf[n, C] · wte_paddedᵀ (wte [V, C] and Vp - V zero rows): columns [V, Vp) are zeros.
    op("lm head gemm");
    pad_wte(wte, true);
    gemm(false, true, static_cast<int>(n), vp, c, 1.0f, lnf_.data(), c, wte_padded_.data(), c, 0.0f, logits_.data(),
         CUDA_R_16BF, vp);
    op("cross-entropy");
    kernels::cross_entropy(logits_.data(), losses_.data(), targets_.data(), n, v, Vp(), grad_scale, train, stream_);
    kernels::sum_losses(loss_.data(), losses_.data(), n, stream_);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(loss_host_.data(), loss_.data(), sizeof(double), cudaMemcpyDeviceToHost, stream_));
    op(outside);
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_));
    have_dlogits_ = train;
    have_logits_ = !train;
    return loss_host_[0];
  }

  /// The logits [B, T, V] of the last head_forward_loss, which ran with train = false, copied to the host in
  /// fp32 (waits for the stream; for sampling and tests, not for a training step). The span stays valid until
  /// the next call of `logits()` or the model's end.
  /// @throws std::logic_error when the last pass had no head_forward_loss with train = false (a train pass
  ///         overwrote its logits with their gradient).
  [[nodiscard]] std::span<const float> logits() const {
    if (!have_logits_) {
      throw std::logic_error("logits: call head_forward_loss with train = false first");
    }
    const std::size_t n = rows(), v = V(), vp = Vp();
    logits_staging_.resize(n * vp);
    logits_host_.resize(n * v);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(logits_staging_.data(), logits_.data(), n * vp * sizeof(zero::bf16),
                                    cudaMemcpyDeviceToHost, stream_));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_));
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < v; ++i) {
        logits_host_[r * v + i] = static_cast<float>(logits_staging_[r * vp + i]);
      }
    }
    return {logits_host_.data(), n * v};
  }

  /// The head's backward: d_wte += dlogitsᵀ · ln_f(x) (fp32), and the gradient of ln_f(x) kept for
  /// final_backward. @param wte [V, C] device bf16, unchanged since head_forward_loss where it is the same pointer
  /// (the model's padded copy of it is reused then); @param d_wte [V, C] device fp32, added into
  /// @throws std::logic_error unless the last head_forward_loss ran with train = true.
  void head_backward(const zero::bf16* wte, float* d_wte) {
    if (!have_dlogits_) {
      throw std::logic_error("head_backward: call head_forward_loss with train = true first");
    }
    const int n = static_cast<int>(rows()), c = cfg_.d_model, v = cfg_.vocab, vp = static_cast<int>(Vp());
    // dln[n, C] = dlogits[n, Vp] · wte_padded[Vp, C] (the padding's products are zeros); dln holds d ln_f(x) until
    // final_backward.
    op("lm head dgrad");
    pad_wte(wte, false);
    gemm(false, false, n, c, vp, 1.0f, logits_.data(), vp, wte_padded_.data(), c, 0.0f, dln_.data(), CUDA_R_16BF, c);
    // d_wte[V, C] += dlogits[n, V]ᵀ · lnf[n, C] in two products, as an odd M costs cuBLAS what an odd N does: the
    // rows of whole 128-row tiles, then the V % 128 others.
    op("lm head wgrad");
    const int whole = v / 128 * 128;
    if (whole > 0) {
      gemm(true, false, whole, c, n, 1.0f, logits_.data(), vp, lnf_.data(), c, 1.0f, d_wte, CUDA_R_32F, c);
    }
    if (whole < v) {
      gemm(true, false, v - whole, c, n, 1.0f, logits_.data() + whole, vp, lnf_.data(), c, 1.0f,
           d_wte + static_cast<std::size_t>(whole) * C(), CUDA_R_32F, c);
    }
    op(outside);
  }

  /// The final LayerNorm's backward; starts the residual stream's gradient.
  /// @param lnf_w [C] device bf16; @param d_lnf_w, @param d_lnf_b [C] device fp32 or bf16, added into
  /// @throws std::logic_error unless head_backward ran for this pass.
  void final_backward(const zero::bf16* lnf_w, grad_ref d_lnf_w, grad_ref d_lnf_b) {
    if (!have_dlogits_) {
      throw std::logic_error("final_backward: call head_forward_loss with train = true and head_backward first");
    }
    const std::size_t n = rows();
    op("layernorm backward");
    ZERO_CHECK_CUDA(cudaMemsetAsync(dres_.data(), 0, n * C() * sizeof(zero::bf16), stream_));
    kernels::layernorm_backward(dres_.data(), d_lnf_w, d_lnf_b, column_workspace_.data(), dln_.data(),
                                block_input(cfg_.layers), lnf_w, lnf_mean_.data(), lnf_rstd_.data(), n, cfg_.d_model,
                                stream_);
    op(outside);
  }

  /// Block l's backward: the residual stream's gradient goes from block l's output to its input, and the
  /// block's parameter gradients are added into `g` (device fp32 or bf16, per tensor).
  /// @throws std::out_of_range when l is not a block; std::logic_error before a train forward.
  void block_backward(int l, cuda_block_params p, cuda_block_grads g) {
    check_layer(l, "block_backward");
    if (!have_dlogits_) {
      throw std::logic_error("block_backward: call head_forward_loss with train = true first");
    }
    const std::size_t n = rows();
    const int c = cfg_.d_model;
    const auto id = static_cast<std::size_t>(l);
    op("checkpoint fetch");
    const zero::bf16* x = store_ ? static_cast<const zero::bf16*>(store_->fetch(ids_[id])) : block_input(l);
    if (checkpoint_ && held_ != l) {
      forward_block(l, p, x, nullptr, " (recompute)"); // the block's activations again, from its input
    }
    zero::bf16* dres = dres_.data();
    float* ws = column_workspace_.data();

    // mlp: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); dres holds d res3 = d of c_proj's output.
    matmul_backward(dfch_.data(), g.mlp_c_proj_weight, g.mlp_c_proj_bias, dres, at(fch_gelu_, l), p.mlp_c_proj_weight,
                    4 * c, c, "mlp.c_proj", at(fch_, l));
    matmul_backward(dln_.data(), g.c_fc_weight, g.c_fc_bias, dfch_.data(), at(ln2_, l), p.c_fc_weight, c, 4 * c,
                    "c_fc");
    op("layernorm backward");
    kernels::layernorm_backward(dres, g.ln_2_weight, g.ln_2_bias, ws, dln_.data(), at(res2_, l), p.ln_2_weight,
                                at(ln2_mean_, l), at(ln2_rstd_, l), n, c, stream_);

    // attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))); dres now holds d res2.
    matmul_backward(datty_.data(), g.attn_c_proj_weight, g.attn_c_proj_bias, dres, at(atty_, l), p.attn_c_proj_weight,
                    c, c, "attn.c_proj");
    op("attention backward");
    attention_backward(l, dqkv_.data(), datty_.data());
    matmul_backward(dln_.data(), g.c_attn_weight, g.c_attn_bias, dqkv_.data(), at(ln1_, l), p.c_attn_weight, c, 3 * c,
                    "c_attn");
    op("layernorm backward");
    kernels::layernorm_backward(dres, g.ln_1_weight, g.ln_1_bias, ws, dln_.data(), x, p.ln_1_weight, at(ln1_mean_, l),
                                at(ln1_rstd_, l), n, c, stream_);
    if (store_) {
      store_->release(ids_[id]); // the work reading x is enqueued
    }
    op(outside);
  }

  /// The embeddings' backward, deterministic: the rows are sorted by token on the host (a counting sort), each
  /// distinct token's rows summed in (b, t) order into d_wte, and d_wpe[t] the sum over b in order.
  /// @param tokens the same HOST ids as embed_forward's; @param d_wte [V, C], @param d_wpe [T, C] device fp32,
  ///        added into
  /// @throws std::out_of_range as embed_forward; std::logic_error before a train forward.
  void embed_backward(const std::int32_t* tokens, float* d_wte, float* d_wpe) {
    if (!have_dlogits_) {
      throw std::logic_error("embed_backward: call head_forward_loss with train = true first");
    }
    check_tokens(tokens, B_, T_, "embed_backward", "token");
    const std::size_t n = rows();
    // plan_host_ may still be the source of the last call's copy.
    ZERO_CHECK_CUDA(cudaEventSynchronize(plan_done_.get()));
    const std::size_t distinct =
        kernels::build_embedding_plan({tokens, n}, counts_, {plan_host_.data(), kernels::embedding_plan_ints(n)});
    const std::size_t ints = 2 * distinct + 1 + n;
    op("embedding backward");
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(plan_.data(), plan_host_.data(), ints * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CHECK_CUDA(cudaEventRecord(plan_done_.get(), stream_));
    kernels::embedding_backward(d_wte, d_wpe, dres_.data(), plan_.data(), distinct, B_, T_, cfg_.d_model, stream_);
    op(outside);
  }

  /// cuBLAS's workspace: 32 MiB, what PyTorch gives cuBLAS on Hopper (CUBLAS_WORKSPACE_CONFIG=:4096:8).
  static constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20;

private:
  template <class T> using device_buffer = zero::buffer<T, zero::device_allocator>;
  template <class T> using pinned_buffer = zero::buffer<T, zero::pinned_allocator>;

  struct event_deleter {
    void operator()(cudaEvent_t e) const noexcept { ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e)); }
  };
  using event_ptr = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, event_deleter>;
  struct cublas_deleter {
    void operator()(cublasHandle_t h) const noexcept { (void)cublasDestroy(h); }
    void operator()(cublasLtHandle_t h) const noexcept { (void)cublasLtDestroy(h); }
    void operator()(cublasLtMatmulDesc_t d) const noexcept { (void)cublasLtMatmulDescDestroy(d); }
    void operator()(cublasLtMatrixLayout_t m) const noexcept { (void)cublasLtMatrixLayoutDestroy(m); }
  };
  using cublas_ptr = std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, cublas_deleter>;
  using cublaslt_ptr = std::unique_ptr<std::remove_pointer_t<cublasLtHandle_t>, cublas_deleter>;

  template <class T> static device_buffer<T> device(std::size_t n) {
    return device_buffer<T>(zero::device_allocator{}, n, zero::memory_tag::buffers);
  }
  template <class T> static pinned_buffer<T> pinned(std::size_t n) {
    return pinned_buffer<T>(zero::pinned_allocator{}, n, zero::memory_tag::buffers);
  }
  static event_ptr make_event() {
    cudaEvent_t e = nullptr;
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return event_ptr(e);
  }

  [[nodiscard]] std::size_t C() const { return static_cast<std::size_t>(cfg_.d_model); }
  [[nodiscard]] std::size_t V() const { return static_cast<std::size_t>(cfg_.vocab); }
  // The LM head's vocabulary dimension: V rounded up to a multiple of 128, a whole number of cuBLAS's tiles.
  // GPT-2's V = 50257 is odd, and an odd N (the logits' GEMM) or K (their input gradient's) costs cuBLAS 6x on
  // an H100: the d12 at B 32 spent 26.4 and 18.9 ms a step in those two at V, 3.6 and 3.0 at Vp. wte [V, C] is
  // the caller's and stays unpadded: the head's two GEMMs read wte_padded_, a copy with Vp - V zero rows.
  [[nodiscard]] std::size_t Vp() const { return (V() + 127) / 128 * 128; }

  // wte_padded_'s rows [0, V) = wte (77 MB for the d12: 0.05 ms), unless they already hold this pass's copy of
  // the same pointer (head_backward after head_forward_loss); its rows [V, Vp) are zeros from the start.
  void pad_wte(const zero::bf16* wte, bool new_pass) {
    if (!new_pass && wte == padded_from_) {
      return;
    }
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(wte_padded_.data(), wte, V() * C() * sizeof(zero::bf16), cudaMemcpyDeviceToDevice, stream_));
    padded_from_ = wte;
  }
  [[nodiscard]] std::size_t rows() const { return static_cast<std::size_t>(B_) * static_cast<std::size_t>(T_); }

  // Layer l's slice of a per-layer activation: each slice is sized for the full batch, and a pass of fewer rows
  // uses its start. Checkpointing keeps one slice, which every layer uses.
  template <class T> T* at(device_buffer<T>& b, int l) {
    return checkpoint_ ? b.data()
                       : b.data() + static_cast<std::size_t>(l) * (b.size() / static_cast<std::size_t>(cfg_.layers));
  }

  // Block l's output: its own slice, or with offload slot l % 2.
  zero::bf16* block_output(int l) {
    const std::size_t slots = store_ ? 2 : static_cast<std::size_t>(cfg_.layers);
    return res3_.data() + static_cast<std::size_t>(l) % slots * (res3_.size() / slots);
  }

  // The residual stream entering block l (l = layers: entering ln_f), as the forward left it.
  const zero::bf16* block_input(int l) { return l == 0 ? encoded_.data() : block_output(l - 1); }

  void check_pass(const char* what) const { check_pass_open(B_, what); }
  void check_layer(int l, const char* what) const { check_block(B_, l, cfg_.layers, what); }

  void check_tokens(const std::int32_t* ids, int B, int T, const char* what, const char* kind) const {
    check_token_ids(ids, B, T, cfg_.vocab, what, kind);
  }

  // Copies n host ids to `dst` through the pinned `staging`, ordered on the stream; `done` marks the copy's
  // end, which the next upload through the same staging waits for before overwriting it.
  void upload(const std::int32_t* src, std::size_t n, pinned_buffer<std::int32_t>& staging,
              device_buffer<std::int32_t>& dst, cudaEvent_t done) {
    ZERO_CHECK_CUDA(cudaEventSynchronize(done));
    std::copy(src, src + n, staging.data());
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(dst.data(), staging.data(), n * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream_));
    ZERO_CHECK_CUDA(cudaEventRecord(done, stream_));
  }

  // Row-major C[M, N] = alpha · op(A)[M, K] · op(B)[K, N] + beta · C, op(X) = Xᵀ where the flag says so; lda, ldb
  // and ldc are the row-major leading dimensions (elements between the starts of two stored rows). A and B are
  // bf16, C is `c_type` (bf16 or fp32), accumulation fp32. cuBLAS is column-major, where a stored row-major
  // matrix reads as its transpose: it computes Cᵀ[N, M] = op(B)ᵀ · op(A)ᵀ, so B goes first, each operand keeps
  // its own transposition flag, and m = N, n = M.
  void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const zero::bf16* A, int lda,
            const zero::bf16* B, int ldb, float beta, void* C, cudaDataType c_type, int ldc) {
    GPT_CHECK_CUBLAS(cublasGemmEx(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF, ldb, A,
                                  CUDA_R_16BF, lda, &beta, C, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // `batch` of the same row-major product, operand i at A + i·stride_a, B + i·stride_b, C + i·stride_c.
  void gemm_batched(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const zero::bf16* A, int lda,
                    long long stride_a, const zero::bf16* B, int ldb, long long stride_b, float beta, void* C,
                    cudaDataType c_type, int ldc, long long stride_c, int batch) {
    GPT_CHECK_CUBLAS(cublasGemmStridedBatchedEx(cublas_.get(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                                trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_16BF,
                                                ldb, stride_b, A, CUDA_R_16BF, lda, stride_a, &beta, C, c_type, ldc,
                                                stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  // dinp = dout · wᵀ (overwritten: dinp is scratch); dw += inpᵀ · dout; dbias += column sums of dout (dw and dbias
  // fp32 or bf16: cuBLAS reads and writes C in dw's dtype, the product and the add in fp32, one rounding).
  // inp [n, ic], w [ic, oc], dout [n, oc].
  // `name` is the layer's, for the profile. With `gelu_input` (the GELU's input, when inp is its output) dinp
  // becomes the gradient of that input: dinp · GELU'(gelu_input).
  void matmul_backward(zero::bf16* dinp, grad_ref dw, grad_ref dbias, const zero::bf16* dout, const zero::bf16* inp,
                       const zero::bf16* w, int ic, int oc, const char* name, const zero::bf16* gelu_input = nullptr) {
    const int n = static_cast<int>(rows());
    // dinp[n, ic] = dout[n, oc] · w[ic, oc]ᵀ.
    op(name, " dgrad");
    if (lt_ && gelu_input != nullptr) {
      gemm_lt({n, ic, oc, false, true}, dout, w, nullptr, dinp, lt_epilogue::dgelu, nullptr, gelu_input);
    } else {
      gemm(false, true, n, ic, oc, 1.0f, dout, oc, w, oc, 0.0f, dinp, CUDA_R_16BF, ic);
      if (gelu_input != nullptr) {
        op("gelu backward");
        kernels::gelu_backward(dinp, gelu_input, dinp, rows() * static_cast<std::size_t>(ic), stream_);
      }
    }
    // dw[ic, oc] += inp[n, ic]ᵀ · dout[n, oc].
    op(name, " wgrad");
    gemm(true, false, ic, oc, n, 1.0f, inp, ic, dout, oc, 1.0f, dw.data, dw.bf16 ? CUDA_R_16BF : CUDA_R_32F, oc);
    op("bias backward");
    kernels::bias_backward(dbias, column_workspace_.data(), dout, rows(), oc, stream_);
  }

  // Block l's forward from its input x into the layer's slices; its output to res3, or with res3 null only up
  // to the MLP's GELU (a checkpointed block's recomputation: the backward does not read the output).
  void forward_block(int l, const cuda_block_params& p, const zero::bf16* x, zero::bf16* res3, const char* tag = "") {
    const std::size_t n = rows();
    const int c = cfg_.d_model, n_rows = static_cast<int>(n);
    zero::bf16* ln1 = at(ln1_, l);
    zero::bf16* qkv = at(qkv_, l);
    zero::bf16* atty = at(atty_, l);
    zero::bf16* res2 = at(res2_, l);
    zero::bf16* ln2 = at(ln2_, l);
    zero::bf16* fch = at(fch_, l);
    zero::bf16* gelu = at(fch_gelu_, l);
    held_ = l;

    op("layernorm", tag);
    kernels::layernorm_forward(ln1, at(ln1_mean_, l), at(ln1_rstd_, l), x, p.ln_1_weight, p.ln_1_bias, n, c, stream_);
    if (lt_) {
      forward_block_lt(l, p, x, res3, tag);
      return;
    }
    // qkv[n, 3C] = ln1[n, C] · c_attn[C, 3C] + bias: C starts as the bias rows, beta = 1 adds the product.
    op("bias and residual", tag);
    kernels::bias_broadcast(qkv, p.c_attn_bias, n, 3 * c, stream_);
    op("c_attn gemm", tag);
    gemm(false, false, n_rows, 3 * c, c, 1.0f, ln1, c, p.c_attn_weight, 3 * c, 1.0f, qkv, CUDA_R_16BF, 3 * c);
    op("attention", tag);
    attention_forward(l, atty, qkv);
    // res2[n, C] = (x + bias) + atty[n, C] · attn.c_proj[C, C].
    op("bias and residual", tag);
    kernels::residual_bias(res2, x, p.attn_c_proj_bias, n, c, stream_);
    op("attn.c_proj gemm", tag);
    gemm(false, false, n_rows, c, c, 1.0f, atty, c, p.attn_c_proj_weight, c, 1.0f, res2, CUDA_R_16BF, c);
    op("layernorm", tag);
    kernels::layernorm_forward(ln2, at(ln2_mean_, l), at(ln2_rstd_, l), res2, p.ln_2_weight, p.ln_2_bias, n, c,
                               stream_);
    // fch[n, 4C] = ln2[n, C] · c_fc[C, 4C] + bias.
    op("bias and residual", tag);
    kernels::bias_broadcast(fch, p.c_fc_bias, n, 4 * c, stream_);
    op("c_fc gemm", tag);
    gemm(false, false, n_rows, 4 * c, c, 1.0f, ln2, c, p.c_fc_weight, 4 * c, 1.0f, fch, CUDA_R_16BF, 4 * c);
    op("gelu", tag);
    kernels::gelu_forward(gelu, fch, n * 4 * C(), stream_);
    if (res3 == nullptr) {
      return;
    }
    // res3[n, C] = (res2 + bias) + gelu[n, 4C] · mlp.c_proj[4C, C].
    op("bias and residual", tag);
    kernels::residual_bias(res3, res2, p.mlp_c_proj_bias, n, c, stream_);
    op("mlp.c_proj gemm", tag);
    gemm(false, false, n_rows, c, 4 * c, 1.0f, gelu, 4 * c, p.mlp_c_proj_weight, c, 1.0f, res3, CUDA_R_16BF, c);
  }

  // forward_block after ln_1 with cuBLASLt's epilogues (cuda_model_options::gemm_epilogues).
  void forward_block_lt(int l, const cuda_block_params& p, const zero::bf16* x, zero::bf16* res3, const char* tag) {
    const int c = cfg_.d_model, n = static_cast<int>(rows());
    zero::bf16* qkv = at(qkv_, l);
    zero::bf16* atty = at(atty_, l);
    zero::bf16* res2 = at(res2_, l);
    zero::bf16* ln2 = at(ln2_, l);
    op("c_attn gemm", tag);
    gemm_lt({n, 3 * c, c, false, false}, at(ln1_, l), p.c_attn_weight, nullptr, qkv, lt_epilogue::bias, p.c_attn_bias);
    op("attention", tag);
    attention_forward(l, atty, qkv);
    op("attn.c_proj gemm", tag); // res2 = x + atty · attn.c_proj + bias
    gemm_lt({n, c, c, false, false}, atty, p.attn_c_proj_weight, x, res2, lt_epilogue::bias, p.attn_c_proj_bias);
    op("layernorm", tag);
    kernels::layernorm_forward(ln2, at(ln2_mean_, l), at(ln2_rstd_, l), res2, p.ln_2_weight, p.ln_2_bias, rows(), c,
                               stream_);
    op("c_fc gemm", tag); // gelu = GELU(fch), fch = ln2 · c_fc + bias (the aux output)
    gemm_lt({n, 4 * c, c, false, false}, ln2, p.c_fc_weight, nullptr, at(fch_gelu_, l), lt_epilogue::gelu_aux_bias,
            p.c_fc_bias, at(fch_, l));
    if (res3 == nullptr) {
      return;
    }
    op("mlp.c_proj gemm", tag); // res3 = res2 + gelu · mlp.c_proj + bias
    gemm_lt({n, c, 4 * c, false, false}, at(fch_gelu_, l), p.mlp_c_proj_weight, res2, res3, lt_epilogue::bias,
            p.mlp_c_proj_bias);
  }

  // A row-major product of gemm_lt: D[M, N] = op(A)[M, K] · op(B)[K, N], each operand's leading dimension its
  // stored row's length.
  struct lt_shape {
    int M, N, K;
    bool trans_a, trans_b;
  };
  using desc_ptr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, cublas_deleter>;
  using layout_ptr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, cublas_deleter>;
  struct lt_plan {
    desc_ptr desc;
    layout_ptr a, b, d;
    cublasLtMatmulAlgo_t algo{};
  };
  enum class lt_epilogue {
    bias,          // D = A·B + C + bias
    gelu_aux_bias, // D = GELU(A·B + bias), aux = A·B + bias
    dgelu,         // D = (A·B) · GELU'(aux)
  };

  // D (bf16) = the epilogue of op(A) · op(B) (+ C where C is given, beta = 1): cuBLASLt, column-major, so as
  // gemm() the operands go in swapped (Dᵀ = op(B)ᵀ · op(A)ᵀ) and the bias runs along D's rows (N). The
  // descriptor, the layouts and the heuristic's algorithm are made once per shape and epilogue (lt_plan); a call
  // sets the bias and aux pointers only.
  void gemm_lt(lt_shape sh, const zero::bf16* A, const zero::bf16* B, const zero::bf16* C, zero::bf16* D, lt_epilogue e,
               const zero::bf16* bias, const zero::bf16* aux = nullptr) {
    // The pointers' common alignment (up to 256 bytes) is part of the key: the heuristic's choice may rely on it.
    std::uintptr_t bits = 256;
    for (const void* ptr :
         {static_cast<const void*>(A), static_cast<const void*>(B), static_cast<const void*>(C),
          static_cast<const void*>(D), static_cast<const void*>(bias), static_cast<const void*>(aux)}) {
      bits |= reinterpret_cast<std::uintptr_t>(ptr);
    }
    const std::array<int, 7> key{sh.M,
                                 sh.N,
                                 sh.K,
                                 (sh.trans_a ? 1 : 0) + (sh.trans_b ? 2 : 0),
                                 static_cast<int>(e),
                                 C != nullptr ? 1 : 0,
                                 std::countr_zero(bits)};
    auto it = lt_plans_.find(key);
    if (it == lt_plans_.end()) {
      it = lt_plans_.emplace(key, make_lt_plan(sh, e, bias, aux)).first;
    }
    const lt_plan& plan = it->second;
    const auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value) {
      GPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc.get(), attr, &value, sizeof value));
    };
    if (bias != nullptr) {
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    if (aux != nullptr) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux);
    }
    const float alpha = 1.0f, beta = C != nullptr ? 1.0f : 0.0f;
    GPT_CHECK_CUBLAS(cublasLtMatmul(lt_.get(), plan.desc.get(), &alpha, B, plan.a.get(), A, plan.b.get(), &beta,
                                    C != nullptr ? C : D, plan.d.get(), D, plan.d.get(), &plan.algo,
                                    cublas_workspace_.data(), cublas_workspace_.bytes(), stream_));
  }

  // A product's cuBLASLt descriptor (operations, epilogue, dtypes), its operands' layouts and the heuristic's
  // algorithm for them, chosen with the first call's bias and aux pointers (gemm_lt's key keeps calls whose
  // pointers align differently apart).
  lt_plan make_lt_plan(lt_shape sh, lt_epilogue e, const zero::bf16* bias, const zero::bf16* aux) {
    lt_plan plan;
    const auto lda = static_cast<std::int64_t>(sh.trans_a ? sh.M : sh.K);
    const auto ldb = static_cast<std::int64_t>(sh.trans_b ? sh.K : sh.N);
    const auto ldd = static_cast<std::int64_t>(sh.N);
    cublasLtMatmulDesc_t raw = nullptr;
    GPT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&raw, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    plan.desc.reset(raw);
    const auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
      GPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc.get(), attr, &value, sizeof value));
    };
    set(CUBLASLT_MATMUL_DESC_TRANSA, sh.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    set(CUBLASLT_MATMUL_DESC_TRANSB, sh.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N);
    const cublasLtEpilogue_t epi = e == lt_epilogue::bias            ? CUBLASLT_EPILOGUE_BIAS
                                   : e == lt_epilogue::gelu_aux_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                                     : CUBLASLT_EPILOGUE_DGELU;
    set(CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    if (bias != nullptr) {
      set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias));
      set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, CUDA_R_16BF);
    }
    if (aux != nullptr) {
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(aux));
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, ldd);
      set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, CUDA_R_16BF);
    }
    // Stored row-major [r, c] with leading dimension ld reads column-major as [c, r].
    const auto layout = [](std::int64_t stored_rows, std::int64_t stored_cols, std::int64_t ld) {
      cublasLtMatrixLayout_t m = nullptr;
      GPT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&m, CUDA_R_16BF, static_cast<std::uint64_t>(stored_cols),
                                                  static_cast<std::uint64_t>(stored_rows), ld));
      return layout_ptr(m);
    };
    plan.a = sh.trans_b ? layout(sh.N, sh.K, ldb) : layout(sh.K, sh.N, ldb); // cuBLASLt's A: our B
    plan.b = sh.trans_a ? layout(sh.K, sh.M, lda) : layout(sh.M, sh.K, lda); // cuBLASLt's B: our A
    plan.d = layout(sh.M, sh.N, ldd);
    cublasLtMatmulPreference_t pref = nullptr;
    GPT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t ws = cublas_workspace_.bytes();
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    const cublasStatus_t got =
        st == CUBLAS_STATUS_SUCCESS
            ? cublasLtMatmulAlgoGetHeuristic(lt_.get(), plan.desc.get(), plan.a.get(), plan.b.get(), plan.d.get(),
                                             plan.d.get(), pref, 1, &result, &found)
            : st;
    (void)cublasLtMatmulPreferenceDestroy(pref);
    GPT_CHECK_CUBLAS(got);
    if (found == 0) {
      throw zero::cuda_error("cublasLtMatmulAlgoGetHeuristic: no algorithm for a " + std::to_string(sh.M) + " x " +
                                 std::to_string(sh.N) + " x " + std::to_string(sh.K) +
                                 " bf16 product with this epilogue; expected one (run without gemm_epilogues)",
                             static_cast<int>(CUBLAS_STATUS_NOT_SUPPORTED));
    }
    plan.algo = result.algo;
    return plan;
  }

  // Causal self-attention. Fused: gpt_attention.cu's kernels. Materialized: one sequence b at a time, its NH
  // heads as one strided batch: scores = q · kᵀ (fp32),
  // probs = the fused causal softmax of scale · scores (kept per layer, bf16), y = probs · v. q, k, v are the
  // column blocks [0, C), [C, 2C), [2C, 3C) of qkv (row stride 3C), head h the columns [h·hs, (h+1)·hs) of each;
  // probs [B, NH, T, T] for this pass's T; y's head h goes to columns [h·hs, (h+1)·hs) of atty (row stride C).
  void attention_forward(int l, zero::bf16* atty, const zero::bf16* qkv) {
    const int c = cfg_.d_model, nh = cfg_.heads, hs = c / nh, T = T_;
    if (attention_ == attention_path::fused) {
      kernels::fused_attention_forward(atty, at(lse_, l), qkv, B_, T, nh, c, stream_);
      return;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long tt = static_cast<long long>(T) * T;
    zero::bf16* att_l = at(att_, l);
    for (std::size_t b = 0; b < static_cast<std::size_t>(B_); ++b) {
      const zero::bf16* q = qkv + b * static_cast<std::size_t>(T) * 3 * C();
      const zero::bf16* k = q + C();
      const zero::bf16* v = q + 2 * C();
      zero::bf16* probs = att_l + b * static_cast<std::size_t>(nh) * static_cast<std::size_t>(tt);
      // scores_h[T, T] = q_h[T, hs] · k_h[T, hs]ᵀ for each head h.
      gemm_batched(false, true, T, T, hs, 1.0f, q, 3 * c, hs, k, 3 * c, hs, 0.0f, scores_.data(), CUDA_R_32F, T, tt,
                   nh);
      kernels::causal_softmax_forward(probs, scores_.data(), static_cast<std::size_t>(nh), T, scale, stream_);
      // y_h[T, hs] = probs_h[T, T] · v_h[T, hs].
      gemm_batched(false, false, T, hs, T, 1.0f, probs, T, tt, v, 3 * c, hs, 0.0f,
                   atty + b * static_cast<std::size_t>(T) * C(), CUDA_R_16BF, c, hs, nh);
    }
  }

  // dqkv (overwritten) from dy = d atty, per sequence and head: dprobs = dy · vᵀ (fp32), dv = probsᵀ · dy, the
  // softmax's backward on the causal part, then dq = scale · dscores · k and dk = scale · dscoresᵀ · q.
  void attention_backward(int l, zero::bf16* dqkv, const zero::bf16* dy) {
    const int c = cfg_.d_model, nh = cfg_.heads, hs = c / nh, T = T_;
    if (attention_ == attention_path::fused) {
      kernels::fused_attention_backward(dqkv, dsum_.data(), dy, at(atty_, l), at(qkv_, l), at(lse_, l), B_, T, nh, c,
                                        stream_);
      return;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const long long tt = static_cast<long long>(T) * T;
    const zero::bf16* qkv = at(qkv_, l);
    const zero::bf16* att_l = at(att_, l);
    for (std::size_t b = 0; b < static_cast<std::size_t>(B_); ++b) {
      const std::size_t offset = b * static_cast<std::size_t>(T) * 3 * C();
      const zero::bf16* q = qkv + offset;
      const zero::bf16* k = q + C();
      const zero::bf16* v = q + 2 * C();
      zero::bf16* dq = dqkv + offset;
      zero::bf16* dk = dq + C();
      zero::bf16* dv = dq + 2 * C();
      const zero::bf16* probs = att_l + b * static_cast<std::size_t>(nh) * static_cast<std::size_t>(tt);
      const zero::bf16* dyb = dy + b * static_cast<std::size_t>(T) * C();
      // dprobs_h[T, T] = dy_h[T, hs] · v_h[T, hs]ᵀ (into scores_, fp32).
      gemm_batched(false, true, T, T, hs, 1.0f, dyb, c, hs, v, 3 * c, hs, 0.0f, scores_.data(), CUDA_R_32F, T, tt, nh);
      // dv_h[T, hs] = probs_h[T, T]ᵀ · dy_h[T, hs].
      gemm_batched(true, false, T, hs, T, 1.0f, probs, T, tt, dyb, c, hs, 0.0f, dv, CUDA_R_16BF, 3 * c, hs, nh);
      kernels::causal_softmax_backward(dscores_.data(), probs, scores_.data(), static_cast<std::size_t>(nh), T,
                                       stream_);
      // dq_h[T, hs] = scale · dscores_h[T, T] · k_h[T, hs].
      gemm_batched(false, false, T, hs, T, scale, dscores_.data(), T, tt, k, 3 * c, hs, 0.0f, dq, CUDA_R_16BF, 3 * c,
                   hs, nh);
      // dk_h[T, hs] = scale · dscores_h[T, T]ᵀ · q_h[T, hs].
      gemm_batched(true, false, T, hs, T, scale, dscores_.data(), T, tt, q, 3 * c, hs, 0.0f, dk, CUDA_R_16BF, 3 * c, hs,
                   nh);
    }
  }

  using store_type = zero::activation_store<zero::cuda_backend, zero::device_allocator>;

  static constexpr const char* outside = "outside the model";
  // Starts operation `name` + `tag` in the profile (op_timer names must outlive it: the joined names are kept).
  void op(const char* name, const char* tag = "") {
    if (!timer_) {
      return;
    }
    if (*tag == '\0') {
      timer_->mark(name, stream_);
      return;
    }
    std::string joined = std::string(name) + tag;
    auto it = std::find(joined_.begin(), joined_.end(), joined);
    if (it == joined_.end()) {
      joined_.push_back(std::move(joined));
      it = std::prev(joined_.end());
    }
    timer_->mark(it->c_str(), stream_);
  }

  model_config cfg_;
  int batch_;
  cudaStream_t stream_;
  bool checkpoint_;
  attention_path attention_ = attention_path::fused;
  // The layer whose activations the shared slices hold (checkpointing; -1: none).
  int held_ = -1;
  int B_ = 0;
  int T_ = 0;
  bool have_dlogits_ = false;
  bool have_logits_ = false;
  // The residual stream entering block 0, then per block (L slices each): ln_1's output and statistics, q|k|v,
  // the attention probabilities [B, NH, T, T], attention's output, the stream after attention (res2), ln_2's
  // output and statistics, c_fc's output before and after GELU, the stream after the MLP (res3).
  device_buffer<zero::bf16> encoded_, ln1_, qkv_, att_, atty_, res2_, ln2_, fch_, fch_gelu_, res3_;
  device_buffer<float> ln1_mean_, ln1_rstd_, ln2_mean_, ln2_rstd_;
  // The fused path's rows' log-sum-exp per layer [B, NH, T] and the backward's row terms (empty when
  // materialized; att_, scores_ and dscores_ are empty when fused).
  device_buffer<float> lse_, dsum_;
  // ln_f's output and statistics. The logits [B·T, Vp] in bf16, overwritten in place by dlogits in a train pass:
  // head_backward's GEMMs take bf16 operands, so bf16 dlogits cost no conversion and no second buffer of the
  // model's largest activation (B·T·V); a logit's rounding (relative 2^-9) moves a token's loss by about
  // 2^-9 · |logit|, in either direction, which averages out over the tokens of a batch.
  device_buffer<zero::bf16> lnf_, logits_;
  // The tied wte [V, C] copied before each of the head's GEMMs into Vp rows, the last Vp - V zeros (see Vp()).
  device_buffer<zero::bf16> wte_padded_;
  const zero::bf16* padded_from_ = nullptr; // the wte this pass's copy came from
  device_buffer<float> lnf_mean_, lnf_rstd_, losses_;
  device_buffer<double> loss_;
  // The backward's scratch: the residual stream's gradient, a LayerNorm output's gradient, attention output's,
  // q|k|v's, c_fc's; one sequence's attention scores (forward) or dprobs (backward) in fp32 and its dscores;
  // the column sums' partials.
  device_buffer<zero::bf16> dres_, dln_, datty_, dqkv_, dfch_, dscores_;
  device_buffer<float> scores_, column_workspace_;
  // The pass's tokens and targets on the device, and the embedding backward's plan.
  device_buffer<std::int32_t> tokens_, targets_, plan_;
  // Declared before cublas_, so the handle is destroyed first.
  device_buffer<std::byte> cublas_workspace_;
  cublas_ptr cublas_;
  // cuBLASLt (gemm_epilogues) and its plan per shape and epilogue.
  cublaslt_ptr lt_;
  std::map<std::array<int, 7>, lt_plan> lt_plans_;
  // Pinned staging for the uploads and the loss, with the events that mark each upload's copy done.
  pinned_buffer<std::int32_t> tokens_host_, targets_host_, plan_host_;
  pinned_buffer<double> loss_host_;
  event_ptr tokens_done_, targets_done_, plan_done_;
  // The embedding backward's counting sort (vocab counters).
  std::vector<std::int32_t> counts_;
  // logits()'s host copies, sized on first use.
  mutable std::vector<zero::bf16> logits_staging_;
  mutable std::vector<float> logits_host_;
  // With offload: the store (its backend first, so the store goes before it), the compute stream, and each
  // block input's checkpoint id in this pass.
  std::optional<zero::cuda_backend> store_backend_;
  const zero::cuda_stream* compute_ = nullptr;
  std::unique_ptr<store_type> store_;
  std::vector<std::size_t> ids_;
  // The profile's timer and the joined operation names it points into (a list: their addresses stay).
  std::unique_ptr<op_timer> timer_;
  std::list<std::string> joined_;
};

} // namespace gpt
