#pragma once
/// \file
/// The fp16 loss scaler with DeepSpeed's semantics (deepspeed/runtime/fp16/loss_scaler.py,
/// `DynamicLossScaler`, configured from the "fp16" section: loss_scale, initial_scale_power,
/// loss_scale_window, hysteresis, consecutive_hysteresis, min_loss_scale).
///
/// The training loop multiplies the loss by `scale()`, checks the gradients for inf/NaN (one flag
/// all-reduced over the ranks), and calls `update(overflow)` once per optimizer step:
///
/// - **overflow:** the step is skipped. When the hysteresis budget is used up (`hysteresis == 1`,
///   or it has counted down to 1) the scale is divided by the scale factor (2), not below
///   min_loss_scale; otherwise only the budget goes down by one. An overflow while the scale already
///   is min_loss_scale throws `loss_scale_error` instead of skipping forever.
/// - **no overflow:** the step is applied. With consecutive_hysteresis the budget is refilled on
///   every good step; without it (DeepSpeed's default) only when the scale grows. Every
///   loss_scale_window-th iteration since the last overflow, the scale is multiplied by 2.
///
/// With a static scale (loss_scale > 0) nothing changes: an overflow still skips the step. For bf16
/// and fp32 training use `loss_scaler::none()` (scale 1, static), as DeepSpeed does.

#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace zero {

/// The loss scale cannot go lower and the gradients still overflow: training cannot make progress.
/// Derives from `zero::error`; `what()` starts with "[zero.loss_scale_error]".
class loss_scale_error : public error {
public:
  /// \param message what happened and what the user can do.
  explicit loss_scale_error(const std::string& message) : error("loss_scale_error", message) {}
};

/// The "fp16" settings of the loss scaler, with DeepSpeed's names and defaults.
struct loss_scaler_options {
  /// 0 selects dynamic loss scaling; a positive value is a static scale.
  double loss_scale = 0.0;
  /// The dynamic scale starts at 2^initial_scale_power.
  int initial_scale_power = 16;
  /// Good iterations since the last overflow after which the scale doubles.
  std::int64_t loss_scale_window = 1000;
  /// Overflows tolerated before the scale is lowered (DeepSpeed's delayed_shift); 1 lowers at once.
  int hysteresis = 2;
  /// Refill the hysteresis budget after every good step, not only when the scale grows.
  bool consecutive_hysteresis = false;
  /// The scale never goes below this; an overflow at this scale throws `loss_scale_error`.
  double min_loss_scale = 1.0;
};

/// The scaler's checkpoint state (DeepSpeed keeps the same four numbers).
struct loss_scaler_state {
  /// The current scale.
  double cur_scale = 1.0;
  /// Updates seen so far.
  std::int64_t cur_iter = 0;
  /// `cur_iter` of the last overflow, -1 before the first.
  std::int64_t last_overflow_iter = -1;
  /// What is left of the hysteresis budget.
  int cur_hysteresis = 1;
};

/// What `loss_scaler::update` decided for one optimizer step.
struct loss_scale_update {
  /// False when the step must be skipped (its gradients overflowed).
  bool applied = true;
  /// The scale the step's loss was multiplied with.
  double scale_before = 1.0;
  /// The scale for the next step.
  double scale = 1.0;
  /// What is left of the hysteresis budget after this step.
  int hysteresis = 1;
};

/// Dynamic or static loss scaling for fp16 training. Not thread-safe; one per engine.
class loss_scaler {
public:
  /// The factor the dynamic scale is divided or multiplied by, fixed at 2 as in DeepSpeed's config.
  static constexpr double scale_factor = 2.0;

  /// \throws config_error naming the "fp16.<key>" that is out of range: loss_scale < 0 or not
  ///         finite, initial_scale_power outside [0, 127], loss_scale_window or hysteresis < 1,
  ///         min_loss_scale not positive, or an initial scale below min_loss_scale.
  explicit loss_scaler(const loss_scaler_options& o = {}) : o_(o) {
    if (!std::isfinite(o.loss_scale) || o.loss_scale < 0.0) {
      throw config_error("fp16.loss_scale must be 0 (dynamic) or a positive number, got " +
                         std::to_string(o.loss_scale));
    }
    if (o.loss_scale > 0.0) {
      s_.cur_scale = o.loss_scale;
      return;
    }
    if (o.initial_scale_power < 0 || o.initial_scale_power > 127) {
      throw config_error("fp16.initial_scale_power must be in [0, 127] (the scale is 2^power), got " +
                         std::to_string(o.initial_scale_power));
    }
    if (o.loss_scale_window < 1) {
      throw config_error("fp16.loss_scale_window must be at least 1, got " + std::to_string(o.loss_scale_window));
    }
    if (o.hysteresis < 1) {
      throw config_error("fp16.hysteresis must be at least 1, got " + std::to_string(o.hysteresis));
    }
    if (!std::isfinite(o.min_loss_scale) || o.min_loss_scale <= 0.0) {
      throw config_error("fp16.min_loss_scale must be a positive number, got " + std::to_string(o.min_loss_scale));
    }
    s_.cur_scale = std::ldexp(1.0, o.initial_scale_power);
    if (s_.cur_scale < o.min_loss_scale) {
      throw config_error("fp16.initial_scale_power " + std::to_string(o.initial_scale_power) + " gives a scale of " +
                         std::to_string(s_.cur_scale) + ", below fp16.min_loss_scale " +
                         std::to_string(o.min_loss_scale));
    }
    s_.cur_hysteresis = o.hysteresis;
    dynamic_ = true;
  }

  /// A static scale of 1: what bf16 and fp32 training use (no scaling, overflows still skip).
  [[nodiscard]] static loss_scaler none() { return loss_scaler(loss_scaler_options{.loss_scale = 1.0}); }

  /// True for dynamic loss scaling.
  [[nodiscard]] bool dynamic() const noexcept { return dynamic_; }
  /// The scale to multiply the next step's loss with.
  [[nodiscard]] double scale() const noexcept { return s_.cur_scale; }
  /// The options it was built with.
  [[nodiscard]] const loss_scaler_options& options() const noexcept { return o_; }
  /// The checkpoint state.
  [[nodiscard]] const loss_scaler_state& state() const noexcept { return s_; }
  /// Restores a checkpoint state (taken from a scaler with the same options).
  void load_state(const loss_scaler_state& s) noexcept { s_ = s; }

  /// Records whether this step's gradients overflowed and decides the next scale.
  /// \param overflow true when any gradient on any rank was inf or NaN.
  /// \returns whether the step is applied, and the scales before and after.
  /// \throws loss_scale_error when a dynamic scale is already at min_loss_scale with its hysteresis
  ///         used up and the gradients overflow again; the scaler is left unchanged then.
  loss_scale_update update(bool overflow) {
    loss_scale_update u;
    u.applied = !overflow;
    u.scale_before = s_.cur_scale;
    if (dynamic_) {
      if (overflow) {
        if (o_.hysteresis == 1 || s_.cur_hysteresis == 1) {
          if (s_.cur_scale == o_.min_loss_scale) {
            throw loss_scale_error(stuck_message());
          }
          s_.cur_scale = std::max(s_.cur_scale / scale_factor, o_.min_loss_scale);
        } else {
          --s_.cur_hysteresis;
        }
        s_.last_overflow_iter = s_.cur_iter;
      } else {
        if (o_.consecutive_hysteresis) {
          s_.cur_hysteresis = o_.hysteresis;
        }
        if ((s_.cur_iter - s_.last_overflow_iter) % o_.loss_scale_window == 0) {
          if (!o_.consecutive_hysteresis) {
            s_.cur_hysteresis = o_.hysteresis;
          }
          s_.cur_scale *= scale_factor;
        }
      }
    }
    ++s_.cur_iter;
    u.scale = s_.cur_scale;
    u.hysteresis = s_.cur_hysteresis;
    return u;
  }

private:
  [[nodiscard]] std::string stuck_message() const {
    return "gradient overflow (inf or NaN) at loss-scaler iteration " + std::to_string(s_.cur_iter) +
           " with the loss scale already at fp16.min_loss_scale = " + std::to_string(o_.min_loss_scale) +
           ": the scale cannot go lower, so every further step would be skipped. The gradients are not finite "
           "even at this scale; look for a diverging loss, a bad input batch or a learning rate that is too "
           "high (gradient_clipping helps), lower fp16.min_loss_scale, or train in bf16 "
           "(\"bf16\": {\"enabled\": true}), which needs no loss scaling";
  }

  loss_scaler_options o_;
  loss_scaler_state s_;
  bool dynamic_ = false;
};

} // namespace zero
