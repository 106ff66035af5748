#pragma once
/// @file gpt_model.hpp
/// GPT-2's model math on the CPU in fp32 (the example's framework side, independent of zero's engine):
/// the configuration, the parameter list with Hugging Face GPT-2's names and layouts, GPT-2's
/// initialisation, and `cpu_model`, whose forward and backward passes run one module at a time (the
/// embeddings, each block, the final LayerNorm, the tied LM head) so that a stage-3 trainer can gather
/// one module's parameters, run it and release them. The matmuls go through OpenBLAS's `cblas_sgemm`;
/// everything else is plain loops in a fixed order, so the same inputs give the same bits.

#include "gpt_random.hpp"

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace gpt {

/// The shape of a GPT-2 model. The defaults are a tiny model for tests and smoke runs.
struct model_config {
  int vocab = 256;  ///< tokens in the vocabulary (V); the LM head is tied to the token embedding
  int seq = 64;     ///< longest sequence (T), the rows of the position embedding
  int layers = 2;   ///< transformer blocks (L)
  int heads = 2;    ///< attention heads per block (NH)
  int d_model = 64; ///< channels of the residual stream (C); must divide by `heads`

  /// Checks every field.
  /// @throws std::invalid_argument naming the command-line flag of the first field out of range
  ///         (`--vocab`, `--seq`, `--layers`, `--heads`, `--d-model`).
  void validate() const {
    auto positive = [](int value, const char* flag) {
      if (value <= 0) {
        throw std::invalid_argument(std::string(flag) + ": expected a whole number >= 1, found " +
                                    std::to_string(value));
      }
    };
    positive(vocab, "--vocab");
    positive(seq, "--seq");
    positive(layers, "--layers");
    positive(heads, "--heads");
    positive(d_model, "--d-model");
    if (d_model % heads != 0) {
      throw std::invalid_argument("--d-model: " + std::to_string(d_model) + " does not divide by --heads " +
                                  std::to_string(heads));
    }
  }

  /// GPT-2's published sizes by depth, as llm.c names them: "d12" (124M), "d24" (350M), "d36" (774M),
  /// "d48" (1558M), each with GPT-2's vocabulary (50257, unpadded) and context (1024).
  /// @throws std::invalid_argument naming the preset when it is none of these.
  static model_config preset(std::string_view name) {
    auto make = [](int layers, int heads, int d_model) {
      return model_config{.vocab = 50257, .seq = 1024, .layers = layers, .heads = heads, .d_model = d_model};
    };
    if (name == "d12") {
      return make(12, 12, 768);
    }
    if (name == "d24") {
      return make(24, 16, 1024);
    }
    if (name == "d36") {
      return make(36, 20, 1280);
    }
    if (name == "d48") {
      return make(48, 25, 1600);
    }
    throw std::invalid_argument("--model: unknown preset \"" + std::string(name) + "\"; expected d12, d24, d36 or d48");
  }
};

/// One parameter tensor of the model.
struct param_spec {
  std::string name;                ///< Hugging Face GPT-2's name, e.g. `transformer.h.0.attn.c_attn.weight`
  std::vector<std::int64_t> shape; ///< row-major shape; Conv1D weights are [in, out]
  int block;                       ///< -1: the embeddings; 0..L-1: that block; L: the final LayerNorm
  bool decay;                      ///< whether AdamW decays it (llm.c: the 2-D tensors, wte and wpe included)

  /// Elements of the tensor.
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : shape) {
      n *= d;
    }
    return n;
  }
};

/// The tensors of one block, in registration order (`parameters()`'s order within the block).
constexpr int block_tensor_count = 12;

/// The model's parameters in registration order: `transformer.wte.weight` [V, C], `transformer.wpe.weight`
/// [T, C], then per block the 12 tensors of `block_params` (ln_1, attn.c_attn, attn.c_proj, ln_2,
/// mlp.c_fc, mlp.c_proj, weight before bias), then `transformer.ln_f.weight` and `.bias`. The LM head
/// is tied to wte and has no entry of its own.
/// @throws std::invalid_argument when `cfg` does not validate.
inline std::vector<param_spec> parameters(const model_config& cfg) {
  cfg.validate();
  const std::int64_t v = cfg.vocab, t = cfg.seq, c = cfg.d_model;
  std::vector<param_spec> out;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, int block) {
    const bool decay = shape.size() == 2;
    out.push_back(param_spec{std::move(name), std::move(shape), block, decay});
  };
  add("transformer.wte.weight", {v, c}, -1);
  add("transformer.wpe.weight", {t, c}, -1);
  for (int l = 0; l < cfg.layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {c}, l);
    add(p + "ln_1.bias", {c}, l);
    add(p + "attn.c_attn.weight", {c, 3 * c}, l);
    add(p + "attn.c_attn.bias", {3 * c}, l);
    add(p + "attn.c_proj.weight", {c, c}, l);
    add(p + "attn.c_proj.bias", {c}, l);
    add(p + "ln_2.weight", {c}, l);
    add(p + "ln_2.bias", {c}, l);
    add(p + "mlp.c_fc.weight", {c, 4 * c}, l);
    add(p + "mlp.c_fc.bias", {4 * c}, l);
    add(p + "mlp.c_proj.weight", {4 * c, c}, l);
    add(p + "mlp.c_proj.bias", {c}, l);
  }
  add("transformer.ln_f.weight", {c}, cfg.layers);
  add("transformer.ln_f.bias", {c}, cfg.layers);
  return out;
}

/// The model's training FLOPs per token, as llm.c counts them for its MFU: 6 N for the matmuls of forward and
/// backward over the N parameters (the tied head's GEMM counted once, through wte), plus 6 L C T for attention
/// (PaLM's 12 L C T, Appendix B, halved for the causal mask).
inline double flops_per_token(const model_config& cfg) {
  double n = 0;
  for (const auto& p : parameters(cfg)) {
    n += static_cast<double>(p.numel());
  }
  return 6.0 * n + 6.0 * cfg.layers * static_cast<double>(cfg.d_model) * cfg.seq;
}

namespace detail {

/// A standard normal draw that depends only on (key, index): Box-Muller on the two 32-bit halves of one
/// counter-based hash.
inline double normal_at(std::uint64_t key, std::uint64_t index) {
  const std::uint64_t bits = splitmix64(key ^ splitmix64(index));
  // u1 in (0, 1] keeps the logarithm finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(bits & 0xFFFFFFFFULL) / 4294967296.0;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

} // namespace detail

/// The fewest elements `init_gpt2` gives a thread of its own.
inline constexpr std::size_t init_elements_per_thread = std::size_t{1} << 18;

/// Fills elements [first, first + out.size()) of the parameter `spec` with GPT-2's initialisation:
/// LayerNorm weights 1, biases 0, every other tensor normal with std 0.02, and the residual projections
/// (attn.c_proj.weight and mlp.c_proj.weight) 0.02 / sqrt(2 * layers). Each element depends only on
/// (seed, spec.name, its index), so any rank fills any slice with the same values as a whole-tensor fill.
/// @param cfg the model (for `layers`)
/// @param spec one of `parameters(cfg)`
/// @param out the caller's buffer for the slice
/// @param seed the run's seed
/// @param first the index of out[0] in the tensor
/// @throws std::out_of_range when the slice runs past the tensor's end.
inline void init_gpt2(const model_config& cfg, const param_spec& spec, std::span<float> out, std::uint64_t seed,
                      std::int64_t first = 0) {
  if (first < 0 || first + static_cast<std::int64_t>(out.size()) > spec.numel()) {
    throw std::out_of_range("init_gpt2: " + spec.name + ": elements [" + std::to_string(first) + ", " +
                            std::to_string(first + static_cast<std::int64_t>(out.size())) + ") of " +
                            std::to_string(spec.numel()));
  }
  const std::string_view name = spec.name;
  const bool is_bias = name.ends_with(".bias");
  const bool is_ln_weight =
      name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") || name.ends_with("ln_f.weight");
  if (is_bias || is_ln_weight) {
    std::fill(out.begin(), out.end(), is_ln_weight ? 1.0f : 0.0f);
    return;
  }
  const bool residual_projection = name.ends_with("c_proj.weight");
  const double std_dev = residual_projection ? 0.02 / std::sqrt(2.0 * cfg.layers) : 0.02;
  const std::uint64_t key = detail::splitmix64(seed ^ detail::fnv1a(name.data(), name.size()));
  const auto fill = [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      const auto index = static_cast<std::uint64_t>(first) + i;
      out[i] = static_cast<float>(std_dev * detail::normal_at(key, index));
    }
  };
  // A draw costs 30 to 40 ns: a 10 G-parameter model took 7 minutes on one thread. Large slices are split over
  // the host's threads; each element depends on its index alone, so the values are the same bits.
  const std::size_t n = out.size();
  const std::size_t threads = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t per = std::max(init_elements_per_thread, (n + threads - 1) / threads);
  std::vector<std::jthread> pool;
  for (std::size_t lo = per; lo < n; lo += per) {
    pool.emplace_back(fill, lo, std::min(lo + per, n));
  }
  fill(0, std::min(per, n));
}

/// The 12 tensors of block l, read-only, each laid out as `parameters()` gives it, in the math's type `T`
/// (`block_params`: fp32 on the CPU; gpt_cuda.hpp's `cuda_block_params`: bf16 on the GPU).
template <class T> struct basic_block_params {
  const T* ln_1_weight = nullptr;        ///< [C]
  const T* ln_1_bias = nullptr;          ///< [C]
  const T* c_attn_weight = nullptr;      ///< [C, 3C] (q, k, v along the output)
  const T* c_attn_bias = nullptr;        ///< [3C]
  const T* attn_c_proj_weight = nullptr; ///< [C, C]
  const T* attn_c_proj_bias = nullptr;   ///< [C]
  const T* ln_2_weight = nullptr;        ///< [C]
  const T* ln_2_bias = nullptr;          ///< [C]
  const T* c_fc_weight = nullptr;        ///< [C, 4C]
  const T* c_fc_bias = nullptr;          ///< [4C]
  const T* mlp_c_proj_weight = nullptr;  ///< [4C, C]
  const T* mlp_c_proj_bias = nullptr;    ///< [C]

  /// The block's tensors from pointers in registration order.
  /// @throws std::invalid_argument when `p` does not hold exactly `block_tensor_count` pointers.
  static basic_block_params from(std::span<const T* const> p) {
    if (p.size() != block_tensor_count) {
      throw std::invalid_argument("block_params::from: expected 12 tensors, found " + std::to_string(p.size()));
    }
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
  }
};
using block_params = basic_block_params<float>;

/// The gradients of block l's 12 tensors, same layouts as `block_params`, each where a backward adds into it: `G`
/// (`block_grads`: fp32 on the CPU; gpt_cuda.hpp's `cuda_block_grads`: device memory, fp32 or bf16 per tensor).
template <class G> struct basic_block_grads {
  G ln_1_weight{};        ///< [C]
  G ln_1_bias{};          ///< [C]
  G c_attn_weight{};      ///< [C, 3C]
  G c_attn_bias{};        ///< [3C]
  G attn_c_proj_weight{}; ///< [C, C]
  G attn_c_proj_bias{};   ///< [C]
  G ln_2_weight{};        ///< [C]
  G ln_2_bias{};          ///< [C]
  G c_fc_weight{};        ///< [C, 4C]
  G c_fc_bias{};          ///< [4C]
  G mlp_c_proj_weight{};  ///< [4C, C]
  G mlp_c_proj_bias{};    ///< [C]

  /// The block's gradient buffers in registration order.
  /// @throws std::invalid_argument when `p` does not hold exactly `block_tensor_count` of them.
  static basic_block_grads from(std::span<const G> p) {
    if (p.size() != block_tensor_count) {
      throw std::invalid_argument("block_grads::from: expected 12 tensors, found " + std::to_string(p.size()));
    }
    return {p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
  }
};
using block_grads = basic_block_grads<float*>;

/// Checks B x T token ids before anything reads them: every id in [0, vocab).
/// @throws std::out_of_range naming `what` (the call), `kind` ("token" or "target"), the position (b, t) and the
///         id of the first one outside the vocabulary.
inline void check_token_ids(const std::int32_t* ids, int B, int T, int vocab, const char* what, const char* kind) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::int32_t id =
          ids[static_cast<std::size_t>(b) * static_cast<std::size_t>(T) + static_cast<std::size_t>(t)];
      if (id < 0 || id >= vocab) {
        throw std::out_of_range(std::string(what) + ": " + kind + " at position (" + std::to_string(b) + ", " +
                                std::to_string(t) + ") is " + std::to_string(id) + ", outside the vocabulary [0, " +
                                std::to_string(vocab) + ")");
      }
    }
  }
}

/// Checks a pass's shape: B sequences in 1..`batch`, T tokens in 1..`seq`. @throws std::invalid_argument naming
/// `what` and the value out of range.
inline void check_batch(int B, int T, int batch, int seq, const char* what) {
  if (B < 1 || B > batch) {
    throw std::invalid_argument(std::string(what) + ": B = " + std::to_string(B) + "; expected 1.." +
                                std::to_string(batch));
  }
  if (T < 1 || T > seq) {
    throw std::invalid_argument(std::string(what) + ": T = " + std::to_string(T) + "; expected 1.." +
                                std::to_string(seq));
  }
}

/// Checks that a pass is open: `rows`, its batch, above 0 (embed_forward ran). The CPU and GPU models' check.
/// @throws std::logic_error naming `what`.
inline void check_pass_open(int rows, const char* what) {
  if (rows == 0) {
    throw std::logic_error(std::string(what) + ": call embed_forward first");
  }
}

/// `check_pass_open`, then that block `l` is one of `layers`. @throws std::out_of_range naming `what` and `l`.
inline void check_block(int rows, int l, int layers, const char* what) {
  check_pass_open(rows, what);
  if (l < 0 || l >= layers) {
    throw std::out_of_range(std::string(what) + ": block " + std::to_string(l) + " of " + std::to_string(layers));
  }
}

/// GPT-2's forward and backward on the CPU in fp32, module by module, over parameters the caller owns.
/// The model holds every activation the backward needs (for up to `batch` x `cfg.seq` tokens) and the
/// backward's scratch, all allocated by the constructor: a step allocates nothing.
///
/// One step, with the caller's pointers valid only during each call:
///   embed_forward, block_forward(0..L-1), final_forward, head_forward_loss(train = true),
///   head_backward, final_backward, block_backward(L-1..0), embed_backward.
/// Every backward ADDS its gradients into the caller's fp32 buffers, so micro-batches accumulate and the
/// tied wte collects both of its uses (head_backward and embed_backward) in one buffer. The gradients are
/// those of grad_scale * (sum of the token losses).
class cpu_model {
public:
  /// Allocates the activations for `batch` sequences of up to `cfg.seq` tokens.
  /// @throws std::invalid_argument when `cfg` does not validate or `batch` < 1.
  cpu_model(model_config cfg, int batch) : cfg_(cfg), batch_(batch) {
    cfg_.validate();
    if (batch < 1) {
      throw std::invalid_argument("--batch: expected a whole number >= 1, found " + std::to_string(batch));
    }
    const std::size_t bt = static_cast<std::size_t>(batch) * static_cast<std::size_t>(cfg_.seq);
    const std::size_t c = static_cast<std::size_t>(cfg_.d_model);
    const std::size_t l = static_cast<std::size_t>(cfg_.layers);
    const std::size_t t = static_cast<std::size_t>(cfg_.seq);
    const std::size_t nh = static_cast<std::size_t>(cfg_.heads);
    encoded_.resize(bt * c);
    ln1_.resize(l * bt * c);
    ln1_mean_.resize(l * bt);
    ln1_rstd_.resize(l * bt);
    qkv_.resize(l * bt * 3 * c);
    att_.resize(l * static_cast<std::size_t>(batch) * nh * t * t);
    atty_.resize(l * bt * c);
    res2_.resize(l * bt * c);
    ln2_.resize(l * bt * c);
    ln2_mean_.resize(l * bt);
    ln2_rstd_.resize(l * bt);
    fch_.resize(l * bt * 4 * c);
    fch_gelu_.resize(l * bt * 4 * c);
    res3_.resize(l * bt * c);
    lnf_.resize(bt * c);
    lnf_mean_.resize(bt);
    lnf_rstd_.resize(bt);
    logits_.resize(bt * static_cast<std::size_t>(cfg_.vocab));
    dres_.resize(bt * c);
    dln_.resize(bt * c);
    datty_.resize(bt * c);
    dqkv_.resize(bt * 3 * c);
    dfch_.resize(bt * 4 * c);
    datt_.resize(t * t);
  }

  /// The model's shape.
  [[nodiscard]] const model_config& config() const { return cfg_; }
  /// The most sequences one pass takes.
  [[nodiscard]] int batch() const { return batch_; }

  /// Bytes the model holds: activations, logits and the backward's scratch.
  [[nodiscard]] std::size_t activation_bytes() const {
    std::size_t n = 0;
    for (const auto* v : {&encoded_,  &ln1_,      &ln1_mean_, &ln1_rstd_, &qkv_,      &att_,  &atty_, &res2_,
                          &ln2_,      &ln2_mean_, &ln2_rstd_, &fch_,      &fch_gelu_, &res3_, &lnf_,  &lnf_mean_,
                          &lnf_rstd_, &logits_,   &dres_,     &dln_,      &datty_,    &dqkv_, &dfch_, &datt_}) {
      n += v->size() * sizeof(float);
    }
    return n;
  }

  /// Starts a pass: the residual stream becomes wte[tokens] + wpe[position].
  /// @param wte [V, C] token embedding; @param wpe [T, C] position embedding (read during the call only)
  /// @param tokens [B, T] row-major token ids
  /// @param B sequences, 1..batch(); @param T tokens per sequence, 1..cfg.seq
  /// @throws std::invalid_argument when B or T is out of range; std::out_of_range naming the position
  ///         (b, t) and the id of the first token outside [0, vocab), before anything is read from wte.
  void embed_forward(const float* wte, const float* wpe, const std::int32_t* tokens, int B, int T) {
    check_batch(B, T, batch_, cfg_.seq, "embed_forward");
    check_tokens(tokens, B, T, "embed_forward", "token");
    B_ = B;
    T_ = T;
    have_dlogits_ = false;
    const std::size_t c = C();
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < T; ++t) {
        const std::size_t row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
        const float* e = wte + static_cast<std::size_t>(tokens[row]) * c;
        const float* p = wpe + static_cast<std::size_t>(t) * c;
        float* out = encoded_.data() + row * c;
        for (std::size_t i = 0; i < c; ++i) {
          out[i] = e[i] + p[i];
        }
      }
    }
  }

  /// Block l's forward: x += attn(ln_1(x)); x += mlp(ln_2(x)).
  /// @throws std::out_of_range when l is not a block; std::logic_error before embed_forward.
  void block_forward(int l, block_params p) {
    check_layer(l, "block_forward");
    const std::size_t n = rows(), c = C();
    const float* x = block_input(l);
    float* ln1 = at(ln1_, l);
    float* qkv = at(qkv_, l);
    float* atty = at(atty_, l);
    float* res2 = at(res2_, l);
    float* ln2 = at(ln2_, l);
    float* fch = at(fch_, l);
    float* gelu = at(fch_gelu_, l);
    float* res3 = at(res3_, l);

    layernorm_forward(ln1, at(ln1_mean_, l), at(ln1_rstd_, l), x, p.ln_1_weight, p.ln_1_bias);
    matmul_forward(qkv, ln1, p.c_attn_weight, p.c_attn_bias, c, 3 * c, false);
    attention_forward(l, atty, qkv);
    std::copy(x, x + n * c, res2);
    matmul_forward(res2, atty, p.attn_c_proj_weight, p.attn_c_proj_bias, c, c, true);
    layernorm_forward(ln2, at(ln2_mean_, l), at(ln2_rstd_, l), res2, p.ln_2_weight, p.ln_2_bias);
    matmul_forward(fch, ln2, p.c_fc_weight, p.c_fc_bias, c, 4 * c, false);
    gelu_forward(gelu, fch, n * 4 * c);
    std::copy(res2, res2 + n * c, res3);
    matmul_forward(res3, gelu, p.mlp_c_proj_weight, p.mlp_c_proj_bias, 4 * c, c, true);
  }

  /// The final LayerNorm over the last block's output.
  /// @throws std::logic_error before embed_forward.
  void final_forward(const float* lnf_w, const float* lnf_b) {
    check_pass("final_forward");
    layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), block_input(cfg_.layers), lnf_w, lnf_b);
  }

  /// The tied LM head and the loss: logits = ln_f(x) · wteᵀ, then softmax and cross-entropy fused per row.
  /// @param wte [V, C], the token embedding (tied)
  /// @param targets [B, T] row-major, each in [0, vocab)
  /// @param grad_scale the factor of the loss whose gradients the backward computes (loss scale / tokens
  ///        in the global batch)
  /// @param train keep dlogits = (softmax - onehot) * grad_scale for head_backward; without it the logits
  ///        stay readable through `logits()`
  /// @returns the sum of the B * T token losses (natural log), accumulated in double
  /// @throws std::out_of_range naming the position and id of a target outside [0, vocab);
  ///         std::logic_error before embed_forward.
  double head_forward_loss(const float* wte, const std::int32_t* targets, float grad_scale, bool train) {
    check_pass("head_forward_loss");
    check_tokens(targets, B_, T_, "head_forward_loss", "target");
    const std::size_t n = rows(), c = C(), v = V();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(n), blas_int(v), blas_int(c), 1.0f, lnf_.data(),
                blas_int(c), wte, blas_int(c), 0.0f, logits_.data(), blas_int(v));
    double loss = 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      float* row = logits_.data() + r * v;
      const auto target = static_cast<std::size_t>(targets[r]);
      float max_logit = -std::numeric_limits<float>::infinity();
      for (std::size_t i = 0; i < v; ++i) {
        max_logit = std::max(max_logit, row[i]);
      }
      const float target_logit = row[target];
      // exp in float (one per logit: the head's softmax is the largest loop outside the matmuls), summed in
      // double in vocabulary order; a train pass keeps each exp in place for the gradient.
      double sum = 0.0;
      for (std::size_t i = 0; i < v; ++i) {
        const float e = std::exp(row[i] - max_logit);
        sum += e;
        if (train) {
          row[i] = e;
        }
      }
      // loss = log(sum exp(logits)) - logits[target], with the maximum taken out for range.
      loss += std::log(sum) - static_cast<double>(target_logit - max_logit);
      if (train) {
        const auto inv = static_cast<float>(1.0 / sum);
        for (std::size_t i = 0; i < v; ++i) {
          row[i] = (row[i] * inv - (i == target ? 1.0f : 0.0f)) * grad_scale;
        }
      }
    }
    have_dlogits_ = train;
    return loss;
  }

  /// The logits [B, T, V] of the last head_forward_loss with train = false.
  [[nodiscard]] std::span<const float> logits() const { return {logits_.data(), rows() * V()}; }

  /// The head's backward: d_wte += dlogitsᵀ · ln_f(x), and the gradient of ln_f(x) kept for final_backward.
  /// @throws std::logic_error unless the last head_forward_loss ran with train = true.
  void head_backward(const float* wte, float* d_wte) {
    if (!have_dlogits_) {
      throw std::logic_error("head_backward: call head_forward_loss with train = true first");
    }
    const std::size_t n = rows(), c = C(), v = V();
    // dln_ holds d ln_f(x) until final_backward.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(c), blas_int(v), 1.0f, logits_.data(),
                blas_int(v), wte, blas_int(c), 0.0f, dln_.data(), blas_int(c));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(v), blas_int(c), blas_int(n), 1.0f, logits_.data(),
                blas_int(v), lnf_.data(), blas_int(c), 1.0f, d_wte, blas_int(c));
  }

  /// The final LayerNorm's backward; starts the residual stream's gradient.
  /// @throws std::logic_error unless head_backward ran for this pass.
  void final_backward(const float* lnf_w, float* d_lnf_w, float* d_lnf_b) {
    if (!have_dlogits_) {
      throw std::logic_error("final_backward: call head_forward_loss with train = true and head_backward first");
    }
    std::fill(dres_.begin(), dres_.end(), 0.0f);
    layernorm_backward(dres_.data(), d_lnf_w, d_lnf_b, dln_.data(), block_input(cfg_.layers), lnf_w, lnf_mean_.data(),
                       lnf_rstd_.data());
  }

  /// Block l's backward: the residual stream's gradient goes from block l's output to its input, and the
  /// block's parameter gradients are added into `g`.
  /// @throws std::out_of_range when l is not a block; std::logic_error before a train forward.
  void block_backward(int l, block_params p, block_grads g) {
    check_layer(l, "block_backward");
    if (!have_dlogits_) {
      throw std::logic_error("block_backward: call head_forward_loss with train = true first");
    }
    const std::size_t n = rows(), c = C();
    const float* x = block_input(l);
    float* dres = dres_.data();

    // mlp: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))); dres holds d res3 = d of c_proj's output.
    matmul_backward(dfch_.data(), g.mlp_c_proj_weight, g.mlp_c_proj_bias, dres, at(fch_gelu_, l), p.mlp_c_proj_weight,
                    4 * c, c);
    gelu_backward(dfch_.data(), at(fch_, l), n * 4 * c);
    matmul_backward(dln_.data(), g.c_fc_weight, g.c_fc_bias, dfch_.data(), at(ln2_, l), p.c_fc_weight, c, 4 * c);
    layernorm_backward(dres, g.ln_2_weight, g.ln_2_bias, dln_.data(), at(res2_, l), p.ln_2_weight, at(ln2_mean_, l),
                       at(ln2_rstd_, l));

    // attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))); dres now holds d res2.
    matmul_backward(datty_.data(), g.attn_c_proj_weight, g.attn_c_proj_bias, dres, at(atty_, l), p.attn_c_proj_weight,
                    c, c);
    attention_backward(l, dqkv_.data(), datty_.data());
    matmul_backward(dln_.data(), g.c_attn_weight, g.c_attn_bias, dqkv_.data(), at(ln1_, l), p.c_attn_weight, c, 3 * c);
    layernorm_backward(dres, g.ln_1_weight, g.ln_1_bias, dln_.data(), x, p.ln_1_weight, at(ln1_mean_, l),
                       at(ln1_rstd_, l));
  }

  /// The embeddings' backward: d_wte[token] and d_wpe[position] add the residual stream's gradient at the
  /// input, row by row in (b, t) order.
  /// @param tokens the same ids as embed_forward's
  /// @throws std::out_of_range as embed_forward; std::logic_error before a train forward.
  void embed_backward(const std::int32_t* tokens, float* d_wte, float* d_wpe) {
    if (!have_dlogits_) {
      throw std::logic_error("embed_backward: call head_forward_loss with train = true first");
    }
    check_tokens(tokens, B_, T_, "embed_backward", "token");
    const std::size_t c = C();
    for (int b = 0; b < B_; ++b) {
      for (int t = 0; t < T_; ++t) {
        const std::size_t row =
            static_cast<std::size_t>(b) * static_cast<std::size_t>(T_) + static_cast<std::size_t>(t);
        const float* d = dres_.data() + row * c;
        float* dw = d_wte + static_cast<std::size_t>(tokens[row]) * c;
        float* dp = d_wpe + static_cast<std::size_t>(t) * c;
        for (std::size_t i = 0; i < c; ++i) {
          dw[i] += d[i];
          dp[i] += d[i];
        }
      }
    }
  }

private:
  static constexpr float ln_eps = 1e-5f;

  static int blas_int(std::size_t n) { return static_cast<int>(n); }
  [[nodiscard]] std::size_t C() const { return static_cast<std::size_t>(cfg_.d_model); }
  [[nodiscard]] std::size_t V() const { return static_cast<std::size_t>(cfg_.vocab); }
  [[nodiscard]] std::size_t rows() const { return static_cast<std::size_t>(B_) * static_cast<std::size_t>(T_); }

  // Layer l's slice of a per-layer activation: each layer's slice is sized for the full batch, and a pass
  // of fewer rows uses its start.
  float* at(std::vector<float>& v, int l) {
    return v.data() + static_cast<std::size_t>(l) * (v.size() / static_cast<std::size_t>(cfg_.layers));
  }

  // The residual stream entering block l (l = layers: entering ln_f).
  const float* block_input(int l) { return l == 0 ? encoded_.data() : at(res3_, l - 1); }

  void check_pass(const char* what) const { check_pass_open(B_, what); }
  void check_layer(int l, const char* what) const { check_block(B_, l, cfg_.layers, what); }

  void check_tokens(const std::int32_t* ids, int B, int T, const char* what, const char* kind) const {
    check_token_ids(ids, B, T, cfg_.vocab, what, kind);
  }

  // out = (x - mean) * rstd * w + b per row of C; mean and rstd kept for the backward. The statistics
  // are summed in double in channel order.
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b) {
    const std::size_t n = rows(), c = C();
    for (std::size_t r = 0; r < n; ++r) {
      const float* xr = x + r * c;
      double m = 0.0;
      for (std::size_t i = 0; i < c; ++i) {
        m += xr[i];
      }
      m /= static_cast<double>(c);
      double var = 0.0;
      for (std::size_t i = 0; i < c; ++i) {
        const double d = xr[i] - m;
        var += d * d;
      }
      var /= static_cast<double>(c);
      const double s = 1.0 / std::sqrt(var + static_cast<double>(ln_eps));
      float* o = out + r * c;
      for (std::size_t i = 0; i < c; ++i) {
        o[i] = static_cast<float>((xr[i] - m) * s) * w[i] + b[i];
      }
      mean[r] = static_cast<float>(m);
      rstd[r] = static_cast<float>(s);
    }
  }

  // dx += the LayerNorm's input gradient; dw, db += its parameter gradients.
  void layernorm_backward(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                          const float* mean, const float* rstd) {
    const std::size_t n = rows(), c = C();
    for (std::size_t r = 0; r < n; ++r) {
      const float* xr = x + r * c;
      const float* d = dout + r * c;
      const double m = mean[r], s = rstd[r];
      double dnorm_mean = 0.0, dnorm_norm_mean = 0.0;
      for (std::size_t i = 0; i < c; ++i) {
        const double norm = (xr[i] - m) * s;
        const double dnorm = static_cast<double>(w[i]) * d[i];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<double>(c);
      dnorm_norm_mean /= static_cast<double>(c);
      float* dxr = dx + r * c;
      for (std::size_t i = 0; i < c; ++i) {
        const double norm = (xr[i] - m) * s;
        const double dnorm = static_cast<double>(w[i]) * d[i];
        db[i] += d[i];
        dw[i] += static_cast<float>(norm * d[i]);
        dxr[i] += static_cast<float>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * s);
      }
    }
  }

  // out[n, oc] (= or +=, by accumulate) inp[n, ic] · w[ic, oc] + bias[oc].
  void matmul_forward(float* out, const float* inp, const float* w, const float* bias, std::size_t ic, std::size_t oc,
                      bool accumulate) {
    const std::size_t n = rows();
    for (std::size_t r = 0; r < n; ++r) {
      float* o = out + r * oc;
      for (std::size_t j = 0; j < oc; ++j) {
        o[j] = accumulate ? o[j] + bias[j] : bias[j];
      }
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(n), blas_int(oc), blas_int(ic), 1.0f, inp,
                blas_int(ic), w, blas_int(oc), 1.0f, out, blas_int(oc));
  }

  // dinp = dout · wᵀ (overwritten: dinp is scratch); dw += inpᵀ · dout; dbias += column sums of dout.
  void matmul_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp, const float* w,
                       std::size_t ic, std::size_t oc) {
    const std::size_t n = rows();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(n), blas_int(ic), blas_int(oc), 1.0f, dout,
                blas_int(oc), w, blas_int(oc), 0.0f, dinp, blas_int(ic));
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(ic), blas_int(oc), blas_int(n), 1.0f, inp,
                blas_int(ic), dout, blas_int(oc), 1.0f, dw, blas_int(oc));
    for (std::size_t r = 0; r < n; ++r) {
      const float* d = dout + r * oc;
      for (std::size_t j = 0; j < oc; ++j) {
        dbias[j] += d[j];
      }
    }
  }

  static constexpr float gelu_scale = 0.7978845608028654f; // sqrt(2 / pi)

  static void gelu_forward(float* out, const float* x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i];
      out[i] = 0.5f * v * (1.0f + std::tanh(gelu_scale * (v + 0.044715f * v * v * v)));
    }
  }

  // d (in place): the gradient at GELU's output becomes the gradient at its input.
  static void gelu_backward(float* d, const float* x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      const float v = x[i];
      const float u = gelu_scale * (v + 0.044715f * v * v * v);
      const float th = std::tanh(u);
      const float sech2 = 1.0f - th * th;
      const float local = 0.5f * (1.0f + th) + 0.5f * v * sech2 * gelu_scale * (1.0f + 3.0f * 0.044715f * v * v);
      d[i] *= local;
    }
  }

  // Causal self-attention per (b, head): att = softmax(mask(q · kᵀ / sqrt(hs))), y = att · v. q, k, v are
  // column blocks of qkv (row stride 3C); att [B, NH, T, T] is kept with zeros above the diagonal.
  void attention_forward(int l, float* y, const float* qkv) {
    const std::size_t c = C(), t_len = static_cast<std::size_t>(T_), nh = static_cast<std::size_t>(cfg_.heads);
    const std::size_t hs = c / nh;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    float* att_l = at(att_, l);
    for (std::size_t b = 0; b < static_cast<std::size_t>(B_); ++b) {
      for (std::size_t h = 0; h < nh; ++h) {
        const float* q = qkv + b * t_len * 3 * c + h * hs;
        const float* k = q + c;
        const float* v = q + 2 * c;
        float* att = att_l + (b * nh + h) * t_len * t_len;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(t_len), blas_int(t_len), blas_int(hs), scale, q,
                    blas_int(3 * c), k, blas_int(3 * c), 0.0f, att, blas_int(t_len));
        for (std::size_t t = 0; t < t_len; ++t) {
          float* row = att + t * t_len;
          float max_score = row[0];
          for (std::size_t s = 1; s <= t; ++s) {
            max_score = std::max(max_score, row[s]);
          }
          double sum = 0.0;
          for (std::size_t s = 0; s <= t; ++s) {
            row[s] = std::exp(row[s] - max_score);
            sum += row[s];
          }
          const float inv = static_cast<float>(1.0 / sum);
          for (std::size_t s = 0; s <= t; ++s) {
            row[s] *= inv;
          }
          // The mask: a position never attends to later ones.
          std::fill(row + t + 1, row + t_len, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(t_len), blas_int(hs), blas_int(t_len), 1.0f,
                    att, blas_int(t_len), v, blas_int(3 * c), 0.0f, y + b * t_len * c + h * hs, blas_int(c));
      }
    }
  }

  // dqkv (overwritten) from dy: datt = dy · vᵀ, dv = attᵀ · dy, the softmax's backward on the causal part,
  // then dq = dscores · k * scale and dk = dscoresᵀ · q * scale.
  void attention_backward(int l, float* dqkv, const float* dy) {
    const std::size_t c = C(), t_len = static_cast<std::size_t>(T_), nh = static_cast<std::size_t>(cfg_.heads);
    const std::size_t hs = c / nh;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const float* qkv = at(qkv_, l);
    const float* att_l = at(att_, l);
    float* datt = datt_.data();
    for (std::size_t b = 0; b < static_cast<std::size_t>(B_); ++b) {
      for (std::size_t h = 0; h < nh; ++h) {
        const std::size_t offset = b * t_len * 3 * c + h * hs;
        const float* q = qkv + offset;
        const float* k = q + c;
        const float* v = q + 2 * c;
        float* dq = dqkv + offset;
        float* dk = dq + c;
        float* dv = dq + 2 * c;
        const float* att = att_l + (b * nh + h) * t_len * t_len;
        const float* dyh = dy + b * t_len * c + h * hs;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, blas_int(t_len), blas_int(t_len), blas_int(hs), 1.0f, dyh,
                    blas_int(c), v, blas_int(3 * c), 0.0f, datt, blas_int(t_len));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(t_len), blas_int(hs), blas_int(t_len), 1.0f, att,
                    blas_int(t_len), dyh, blas_int(c), 0.0f, dv, blas_int(3 * c));
        for (std::size_t t = 0; t < t_len; ++t) {
          const float* a = att + t * t_len;
          float* d = datt + t * t_len;
          double dot = 0.0;
          for (std::size_t s = 0; s <= t; ++s) {
            dot += static_cast<double>(a[s]) * d[s];
          }
          for (std::size_t s = 0; s <= t; ++s) {
            d[s] = static_cast<float>(a[s] * (d[s] - dot));
          }
          std::fill(d + t + 1, d + t_len, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, blas_int(t_len), blas_int(hs), blas_int(t_len), scale,
                    datt, blas_int(t_len), k, blas_int(3 * c), 0.0f, dq, blas_int(3 * c));
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, blas_int(t_len), blas_int(hs), blas_int(t_len), scale,
                    datt, blas_int(t_len), q, blas_int(3 * c), 0.0f, dk, blas_int(3 * c));
      }
    }
  }

  model_config cfg_;
  int batch_;
  int B_ = 0;
  int T_ = 0;
  bool have_dlogits_ = false;
  // The residual stream entering block 0, then per block (L slices each): ln_1's output and statistics,
  // q|k|v, the attention probabilities, attention's output, the stream after attention (res2), ln_2's
  // output and statistics, c_fc's output before and after GELU, the stream after the MLP (res3).
  std::vector<float> encoded_, ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, atty_, res2_, ln2_, ln2_mean_, ln2_rstd_, fch_,
      fch_gelu_, res3_;
  // ln_f's output and statistics; the logits, overwritten by dlogits in a train pass.
  std::vector<float> lnf_, lnf_mean_, lnf_rstd_, logits_;
  // The backward's scratch: the residual stream's gradient, a LayerNorm output's gradient, attention
  // output's, q|k|v's, c_fc's, and one (b, head)'s T x T attention gradient.
  std::vector<float> dres_, dln_, datty_, dqkv_, dfch_, datt_;
};

} // namespace gpt
