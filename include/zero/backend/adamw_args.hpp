#pragma once
/// \file
/// The arguments of one Adam/AdamW step over a shard, shared by every backend's kernel so the
/// CPU and CUDA kernels compute the same thing. It lives in backend, below optim (docs/design.md),
/// because it is the contract of the backends' `adamw_step` kernel.
///
/// For each element i (PyTorch's `torch.optim.AdamW` / `Adam`, DeepSpeed's FusedAdam):
///
///     g      = grad[i] * grad_scale                    // unscale and clip folded into one factor
///     g     += weight_decay * master[i]                // Adam (L2) only: adam_w_mode == false
///     m[i]   = beta1 * m[i] + (1 - beta1) * g
///     v[i]   = beta2 * v[i] + (1 - beta2) * g * g
///     master[i] *= 1 - lr * weight_decay               // AdamW (decoupled) only: adam_w_mode == true
///     denom  = sqrt(v[i]) / sqrt(bias_correction2) + eps
///     master[i] -= (lr / bias_correction1) * m[i] / denom
///     param[i] = round_to_nearest_even(master[i])      // when a low-precision copy is written
///
/// with bias_correction1 = 1 - beta1^step and bias_correction2 = 1 - beta2^step (1 and 1 when
/// bias correction is off). Every operation is one fp32 operation rounded on its own, products and
/// quotients grouped left to right, never a fused multiply-add: zero/backend/cpu_backend.hpp
/// ("Numerics") spells out the order every backend follows and how a framework reproduces its bits.

#include <cmath>
#include <cstdint>

namespace zero {

/// Hyper-parameters and per-step factors of one Adam/AdamW update, and of the other rules' (update_rules.hpp).
struct adamw_step_args {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  /// 1 - beta1^step, or 1 without bias correction.
  float bias_correction1 = 1.0f;
  /// 1 - beta2^step, or 1 without bias correction.
  float bias_correction2 = 1.0f;
  /// Multiplies every gradient before use: 1 / (loss_scale * accumulation) times the clip factor.
  float grad_scale = 1.0f;
  /// true: AdamW, decoupled weight decay; false: Adam with L2 added to the gradient.
  bool adam_w_mode = true;
  /// The optimizer step (1-based), set by `set_step`: SGD's momentum starts from the gradient at step 1, and
  /// Adagrad decays its lr with it (zero/backend/update_rules.hpp).
  std::int64_t step = 1;
  /// SGD: the momentum factor (0: none, no state), its dampening, and Nesterov's form.
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  /// Adagrad: the lr's decay per step.
  float lr_decay = 0.0f;
  /// LAMB: the trust ratio's bounds, eps inside the square root (DeepSpeed's eps_inside_sqrt), and the ratio of
  /// the parameter tensor a `rule_step` call updates (formed by `rules::trust_ratio` between LAMB's two passes).
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
  bool eps_inside_sqrt = false;
  float trust_ratio = 1.0f;

  /// Sets `step` to optimizer step `index` (1-based) and fills its bias corrections.
  void set_step(std::int64_t index, bool bias_correction = true) {
    step = index;
    bias_correction1 = bias_correction ? 1.0f - static_cast<float>(std::pow(double(beta1), double(index))) : 1.0f;
    bias_correction2 = bias_correction ? 1.0f - static_cast<float>(std::pow(double(beta2), double(index))) : 1.0f;
  }
};

} // namespace zero
