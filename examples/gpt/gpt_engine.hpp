#pragma once
// The framework side of the GPT example: a model's math (gpt_model.hpp's `cpu_model` in fp32, or gpt_cuda.hpp's
// `cuda_model` in bf16 on a GPU) with its parameters and gradients living in a zero engine. One module per unit
// stage 3 gathers: "embed" (wte, wpe), "h.<l>" (a block's 12 tensors) and "ln_f". The LM head is tied to wte:
// one parameter, registered once, used by the embedding and by the head; both uses add into its one gradient,
// and grad_ready(wte) comes after the second (docs/gpt.md).
//
// The math reads parameters in its own type (`math_traits<Math>::param_type`): the engine's memory when the
// config's dtype is that type, else (on the CPU) fp32 copies converted after each gather. It adds gradients into
// the engine's buffers when they are fp32, and when they are bf16 and the math adds into bf16 itself (the GPU's,
// `math_traits::adds_bf16`: every tensor but the embedding's two). Otherwise it adds into an fp32 scratch that is
// added into the engine's 16-bit buffer when the tensor's gradient is final (`done`): one region for wte, which
// lives across its two uses (the head's and the embedding's), and wpe's after it; on the CPU also one region for
// the module in backward, so the scratch holds V·C plus the largest module.

#include "gpt_model.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <zero/engine/engine.hpp>

namespace gpt {

/// How `zero_gpt` drives a model's math: the parameter type it reads, how it is made, and the fp32 gradient
/// scratch for 16-bit gradients. Specialised for `cpu_model` here and for `cuda_model` in gpt_cuda_engine.hpp.
template <class Math> struct math_traits;

/// How `zero_gpt` makes its math (`math_traits<M>::make`).
struct math_options {
  /// Activation checkpointing: the math keeps each block's input and recomputes the rest in the backward; where
  /// the config's activation_checkpointing.cpu_checkpointing says so, the inputs go to host memory.
  bool checkpoint = false;
  /// Time each operation (`zero_gpt::profile`).
  bool profile = false;
  /// The GPU's projections through cuBLASLt's epilogues (cuda_model_options::gemm_epilogues).
  bool gemm_epilogues = false;
};

/// Where zero_gpt's fp32 gradient scratch for 16-bit gradients puts each tensor's gradient: wte's region first
/// (it lives across wte's two uses), then one module's tensors at a time from the end of it; and its floats.
/// With `embedding_only` (a math that adds every other gradient into bf16 itself), only the embedding's two
/// tensors have a region, wte's then wpe's, and the others' offsets are `scratch_layout::none`.
struct scratch_layout {
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  std::vector<std::size_t> at; ///< the offset of tensor k's region (0 for wte)
  std::size_t floats = 0;      ///< wte's elements plus the largest module's (embedding_only: plus wpe's)
};
[[nodiscard]] inline scratch_layout gradient_scratch_layout(const std::vector<param_spec>& specs,
                                                            bool embedding_only = false) {
  scratch_layout out;
  if (embedding_only) {
    out.at.assign(specs.size(), scratch_layout::none);
    for (std::size_t k = 0; k < std::min<std::size_t>(2, specs.size()); ++k) {
      out.at[k] = out.floats;
      out.floats += static_cast<std::size_t>(specs[k].numel());
    }
    return out;
  }
  out.at.assign(specs.size(), 0);
  std::size_t module = 0, largest = 0;
  for (std::size_t k = 1; k < specs.size(); ++k) {
    if (k == 2 || (k > 2 && specs[k].block != specs[k - 1].block)) {
      module = 0; // a new module: its tensors start the region again
    }
    out.at[k] = static_cast<std::size_t>(specs[0].numel()) + module;
    module += static_cast<std::size_t>(specs[k].numel());
    largest = std::max(largest, module);
  }
  out.floats = static_cast<std::size_t>(specs.empty() ? 0 : specs[0].numel()) + largest;
  return out;
}

template <> struct math_traits<cpu_model> {
  using param_type = float;
  using block_params_type = block_params;
  using block_grads_type = block_grads;
  /// Where the math adds a gradient: fp32 only.
  using grad_type = float*;
  /// Whether the math adds gradients into a bf16 engine buffer itself (else through the fp32 scratch).
  static constexpr bool adds_bf16 = false;
  /// Whether 16-bit parameters are converted into fp32 copies after each gather (the CPU math is fp32 only).
  static constexpr bool converts_params = true;
  /// @throws std::invalid_argument with `o.checkpoint` or the config's cpu_checkpointing (the CPU math keeps
  /// every activation), or with `o.profile` (it times a GPU's stream).
  template <class Engine> static cpu_model make(Engine& eng, const model_config& cfg, int batch, math_options o) {
    if (o.checkpoint || eng.cfg().activation_checkpointing.cpu_checkpointing) {
      throw std::invalid_argument(
          std::string(o.checkpoint ? "--checkpoint-activations" : "activation_checkpointing.cpu_checkpointing") +
          ": the CPU model (--device cpu) keeps every activation; expected --device cuda");
    }
    if (o.profile || o.gemm_epilogues) {
      throw std::invalid_argument(std::string(o.profile ? "--profile: times the operations on a GPU's stream"
                                                        : "--gemm-epilogues: cuBLASLt's, on a GPU") +
                                  "; expected --device cuda");
    }
    return cpu_model(cfg, batch);
  }
  /// Host memory of `floats` fp32 values.
  class scratch {
  public:
    explicit scratch(std::size_t floats) : v_(floats) {}
    [[nodiscard]] float* data() noexcept { return v_.data(); }

  private:
    std::vector<float> v_;
  };
  template <class Engine> static void zero(Engine&, float* p, std::size_t n) { std::fill_n(p, n, 0.0f); }
  template <class Engine> static void add(Engine&, const zero::tensor_view& dst, const float* src, std::size_t n) {
    zero::add_floats(dst, std::span<const float>(src, n));
  }
};

template <class Engine, class Math = cpu_model> class zero_gpt {
  using traits = math_traits<Math>;
  using param_type = typename traits::param_type;

public:
  /// Registers the model's parameters with `eng` (before `finalize`): 1-D tensors train without weight decay.
  /// `o`: what the math keeps for the backward and whether it times its operations (math_options).
  zero_gpt(Engine& eng, const model_config& cfg, int batch, math_options o = {})
      : eng_(eng), cfg_(cfg), math_(traits::make(eng, cfg, batch, o)) {
    specs_ = parameters(cfg);
    if (!traits::converts_params && eng.cfg().param_dtype() != zero::dtype_v<param_type>) {
      throw std::invalid_argument(
          "gpt: this model computes with " + std::string(zero::name_of(zero::dtype_v<param_type>)) +
          " parameters, but the config's are " + std::string(zero::name_of(eng.cfg().param_dtype())) +
          "; expected a config with bf16.enabled true");
    }
    embed_ = eng.add_module("embed");
    for (int l = 0; l < cfg.layers; ++l) {
      blocks_.push_back(eng.add_module("h." + std::to_string(l)));
    }
    final_ = eng.add_module("ln_f");
    for (const auto& s : specs_) {
      const int m = s.block < 0 ? embed_ : s.block < cfg.layers ? blocks_[static_cast<std::size_t>(s.block)] : final_;
      zero::param_options o;
      if (!s.decay) {
        o.weight_decay = 0.0;
      }
      handles_.push_back(eng.add_param(m, s.name, s.shape, o));
    }
    floats_.resize(specs_.size());
    direct_ = traits::adds_bf16 && eng.cfg().grad_accum_dtype == zero::dtype::bf16;
    auto layout = gradient_scratch_layout(specs_, direct_);
    scratch_at_ = std::move(layout.at);
    if (eng.cfg().grad_accum_dtype != zero::dtype::f32) {
      scratch_.emplace_back(layout.floats);
    }
    live_.assign(specs_.size(), false);
  }

  /// GPT-2's initialisation from `seed`, each rank filling only what it holds (after `finalize`).
  void init(std::uint64_t seed) {
    eng_.init_params([&](const zero::param_info& p, std::size_t first, std::span<float> out) {
      init_gpt2(cfg_, specs_[index_of(p.name)], out, seed, static_cast<std::int64_t>(first));
    });
  }

  /// One micro-batch: forward, loss, and with `train` backward into the engine's gradients (the loss's gradient
  /// scaled by `grad_scale`: the loss scale over the tokens of the global batch). \returns the summed token loss.
  double run(const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool train, float grad_scale) {
    {
      auto on = gather(embed_);
      math_.embed_forward(param(0), param(1), inputs, B, T);
    }
    for (int l = 0; l < cfg_.layers; ++l) {
      auto on = gather(blocks_[static_cast<std::size_t>(l)]);
      math_.block_forward(l, traits::block_params_type::from(block_inputs(l)));
    }
    double loss = 0;
    {
      auto on = gather(final_);
      math_.final_forward(param(last() - 1), param(last()));
    }
    {
      // The head reads wte: the embedding's module again (stage 3 gathers it for its second use).
      auto on = gather(embed_);
      loss = math_.head_forward_loss(param(0), targets, grad_scale, train);
      if (train) {
        math_.head_backward(param(0), grad(0));
      }
    }
    if (!train) {
      return loss;
    }
    {
      auto on = gather(final_);
      math_.final_backward(param(last() - 1), grad_of(last() - 1), grad_of(last()));
      done(last() - 1);
      done(last());
    }
    for (int l = cfg_.layers; l-- > 0;) {
      auto on = gather(blocks_[static_cast<std::size_t>(l)]);
      const auto first = block_first(l);
      std::vector<typename traits::grad_type> g;
      for (std::size_t k = 0; k < block_tensor_count; ++k) {
        g.push_back(grad_of(first + k));
      }
      math_.block_backward(l, traits::block_params_type::from(block_inputs(l)), traits::block_grads_type::from(g));
      for (std::size_t k = 0; k < block_tensor_count; ++k) {
        done(first + k);
      }
    }
    {
      auto on = gather(embed_);
      math_.embed_backward(inputs, grad(0), grad(1));
      done(0); // wte: the head's use and the embedding's, summed
      done(1);
    }
    return loss;
  }

  /// The logits of the last `run` with `train` false.
  [[nodiscard]] std::span<const float> logits() const { return math_.logits(); }
  [[nodiscard]] const model_config& config() const noexcept { return cfg_; }
  [[nodiscard]] std::size_t activation_bytes() const { return math_.activation_bytes(); }
  /// The math's time per operation since `profile_reset` (empty where it does not time them).
  [[nodiscard]] std::vector<std::pair<std::string, double>> profile() const {
    if constexpr (requires { math_.profile(); }) {
      return math_.profile();
    } else {
      return {};
    }
  }
  void profile_reset() {
    if constexpr (requires { math_.profile_reset(); }) {
      math_.profile_reset();
    }
  }
  /// Host bytes of the math's activation checkpoints (0 where it keeps none there).
  [[nodiscard]] std::size_t checkpoint_host_bytes() const {
    if constexpr (requires { math_.checkpoint_host_bytes(); }) {
      return math_.checkpoint_host_bytes();
    } else {
      return 0;
    }
  }
  [[nodiscard]] const std::vector<param_spec>& specs() const noexcept { return specs_; }
  [[nodiscard]] zero::param_handle handle(std::size_t k) const { return handles_[k]; }

  /// Starts `what` in the math's profile, where the math keeps one (the engine's work on the math's stream between
  /// its operations, e.g. "engine: step" before the engine's step; otherwise it counts as "outside the model").
  void mark(const char* what) {
    if constexpr (requires { math_.mark(what); }) {
      math_.mark(what);
    }
  }

private:
  /// The engine's gather of `module`, marked in the profile.
  auto gather(int module) {
    mark("engine: gather");
    return eng_.gather(module);
  }
  std::size_t last() const { return specs_.size() - 1; }
  std::size_t block_first(int l) const { return 2 + static_cast<std::size_t>(l) * block_tensor_count; }
  std::size_t index_of(const std::string& name) const {
    for (std::size_t k = 0; k < specs_.size(); ++k) {
      if (specs_[k].name == name) {
        return k;
      }
    }
    throw std::invalid_argument("gpt: no parameter named " + name);
  }
  std::vector<const param_type*> block_inputs(int l) {
    std::vector<const param_type*> p;
    for (std::size_t k = 0; k < block_tensor_count; ++k) {
      p.push_back(param(block_first(l) + k));
    }
    return p;
  }

  /// Tensor `k` as the math reads it: the engine's memory in the math's type, else (CPU) a copy converted to
  /// fp32 after this gather.
  const param_type* param(std::size_t k) {
    auto p = eng_.param(handles_[k]);
    if (p.type == zero::dtype_v<param_type>) {
      return p.template as<param_type>();
    }
    if constexpr (traits::converts_params) {
      auto& c = floats_[k];
      c.resize(p.numel);
      zero::copy_to_floats(p, c);
      return c.data();
    } else {
      throw std::logic_error("gpt: parameter " + specs_[k].name + " is not " +
                             std::string(zero::name_of(zero::dtype_v<param_type>)));
    }
  }
  /// Where tensor `k`'s fp32 gradient is added: the engine's buffer for fp32, else its zeroed region of the
  /// fp32 scratch, which `done` adds into the engine's buffer (wte's region lives across its two uses).
  float* grad(std::size_t k) {
    if (eng_.cfg().grad_accum_dtype == zero::dtype::f32) {
      return eng_.grad(handles_[k]).template as<float>();
    }
    float* s = scratch_.front().data() + scratch_at_[k];
    if (!live_[k]) {
      mark("engine: gradient scratch zeroed");
      traits::zero(eng_, s, static_cast<std::size_t>(specs_[k].numel()));
      live_[k] = true;
    }
    return s;
  }
  /// Where the math adds tensor `k`'s gradient: the engine's bf16 buffer itself where the math adds into bf16
  /// (not the embedding's two, `direct_`), else `grad(k)`.
  typename traits::grad_type grad_of(std::size_t k) {
    if constexpr (traits::adds_bf16) {
      if (direct_ && k >= 2) {
        return eng_.grad(handles_[k]).template as<zero::bf16>();
      }
    }
    return grad(k);
  }
  /// Tensor `k`'s gradient is final for this micro-step.
  void done(std::size_t k) {
    if (live_[k]) {
      mark("engine: gradients into 16-bit");
      traits::add(eng_, eng_.grad(handles_[k]), scratch_.front().data() + scratch_at_[k],
                  static_cast<std::size_t>(specs_[k].numel()));
      live_[k] = false;
    }
    mark("engine: grad_ready");
    eng_.grad_ready(handles_[k]);
  }

  Engine& eng_;
  model_config cfg_;
  Math math_;
  std::vector<param_spec> specs_;
  int embed_ = -1, final_ = -1;
  std::vector<int> blocks_;
  std::vector<zero::param_handle> handles_;
  std::vector<std::vector<float>> floats_;        // fp32 copies of 16-bit parameters (CPU math)
  std::vector<typename traits::scratch> scratch_; // the fp32 gradient scratch (none for fp32 gradients)
  std::vector<std::size_t> scratch_at_;           // each tensor's offset in it
  std::vector<bool> live_;                        // whether a tensor's region holds this micro-step's sum
  bool direct_ = false; // the math adds the gradients of every tensor but the embedding's into bf16 itself
};

} // namespace gpt
