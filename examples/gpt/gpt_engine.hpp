#pragma once
// The framework side of the GPT example: gpt_model.hpp's math with its parameters and gradients living in a
// zero engine. One module per unit stage 3 gathers: "embed" (wte, wpe), "h.<l>" (a block's 12 tensors) and
// "ln_f". The LM head is tied to wte: one parameter, registered once, used by the embedding and by the head;
// both uses add into its one gradient, and grad_ready(wte) comes after the second (docs/gpt.md).
//
// The math runs in fp32. With fp32 parameters and gradients the model reads and writes the engine's memory;
// with bf16 or fp16 it converts a module's tensors into fp32 copies after each gather, and adds its fp32
// gradients into the engine's buffers when the module's backward ends.

#include "gpt_model.hpp"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <zero/engine/engine.hpp>

namespace gpt {

template <class Engine> class zero_gpt {
public:
  /// Registers the model's parameters with `eng` (before `finalize`): 1-D tensors train without weight decay.
  zero_gpt(Engine& eng, const model_config& cfg, int batch) : eng_(eng), cfg_(cfg), math_(cfg, batch) {
    specs_ = parameters(cfg);
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
    grads_.resize(specs_.size());
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
      auto on = eng_.gather(embed_);
      math_.embed_forward(param(0), param(1), inputs, B, T);
    }
    for (int l = 0; l < cfg_.layers; ++l) {
      auto on = eng_.gather(blocks_[static_cast<std::size_t>(l)]);
      math_.block_forward(l, block_params::from(block_inputs(l)));
    }
    double loss = 0;
    {
      auto on = eng_.gather(final_);
      math_.final_forward(param(last() - 1), param(last()));
    }
    {
      // The head reads wte: the embedding's module again (stage 3 gathers it for its second use).
      auto on = eng_.gather(embed_);
      loss = math_.head_forward_loss(param(0), targets, grad_scale, train);
      if (train) {
        math_.head_backward(param(0), grad(0));
      }
    }
    if (!train) {
      return loss;
    }
    {
      auto on = eng_.gather(final_);
      math_.final_backward(param(last() - 1), grad(last() - 1), grad(last()));
      done(last() - 1);
      done(last());
    }
    for (int l = cfg_.layers; l-- > 0;) {
      auto on = eng_.gather(blocks_[static_cast<std::size_t>(l)]);
      const auto first = block_first(l);
      std::vector<float*> g;
      for (std::size_t k = 0; k < block_tensor_count; ++k) {
        g.push_back(grad(first + k));
      }
      math_.block_backward(l, block_params::from(block_inputs(l)), block_grads::from(g));
      for (std::size_t k = 0; k < block_tensor_count; ++k) {
        done(first + k);
      }
    }
    {
      auto on = eng_.gather(embed_);
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
  [[nodiscard]] const std::vector<param_spec>& specs() const noexcept { return specs_; }
  [[nodiscard]] zero::param_handle handle(std::size_t k) const { return handles_[k]; }

private:
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
  std::vector<const float*> block_inputs(int l) {
    std::vector<const float*> p;
    for (std::size_t k = 0; k < block_tensor_count; ++k) {
      p.push_back(param(block_first(l) + k));
    }
    return p;
  }

  /// Tensor `k` in fp32: the engine's memory for fp32, else a copy converted after this gather.
  const float* param(std::size_t k) {
    auto p = eng_.param(handles_[k]);
    if (p.type == zero::dtype::f32) {
      return p.template as<float>();
    }
    auto& c = floats_[k];
    c.resize(p.numel);
    zero::copy_to_floats(p, c);
    return c.data();
  }
  /// Where tensor `k`'s fp32 gradient is added: the engine's buffer for fp32, else a zeroed fp32 scratch that
  /// `done` adds into the engine's (wte's scratch lives across its two uses).
  float* grad(std::size_t k) {
    if (eng_.cfg().grad_accum_dtype == zero::dtype::f32) {
      return eng_.grad(handles_[k]).template as<float>();
    }
    auto& s = grads_[k];
    if (s.empty()) {
      s.assign(static_cast<std::size_t>(specs_[k].numel()), 0.0f);
    }
    return s.data();
  }
  /// Tensor `k`'s gradient is final for this micro-step.
  void done(std::size_t k) {
    if (auto& s = grads_[k]; !s.empty()) {
      zero::add_floats(eng_.grad(handles_[k]), s);
      s.clear();
    }
    eng_.grad_ready(handles_[k]);
  }

  Engine& eng_;
  model_config cfg_;
  cpu_model math_;
  std::vector<param_spec> specs_;
  int embed_ = -1, final_ = -1;
  std::vector<int> blocks_;
  std::vector<zero::param_handle> handles_;
  std::vector<std::vector<float>> floats_, grads_;
};

} // namespace gpt
