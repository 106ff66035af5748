#pragma once
/// \file
/// Learning-rate schedules with DeepSpeed's semantics (deepspeed/runtime/lr_schedules.py):
/// `WarmupLR`, `WarmupDecayLR` and `WarmupCosineLR`, plus a constant schedule for configs without a
/// scheduler, and `lr_scheduler`, which holds any of them and counts the steps.
///
/// DeepSpeed's schedulers are functions of `last_batch_iteration`, which starts at -1 and goes up by
/// one each time the engine calls `scheduler.step()` — after every optimizer step that was applied
/// (a step skipped for fp16 overflow does not advance it). So the first optimizer step runs with
/// the lr of iteration -1, the second with that of iteration 0, and so on. The formulas below are
/// DeepSpeed's, computed in double precision with the same operations in the same order as its
/// Python code (Python floats are IEEE doubles and `math.log`/`math.cos` are the C library's), so
/// the values agree bit for bit on the same platform. With W = max(2, warmup_num_steps), i the
/// iteration and T = total_num_steps:
///
///     warmup gamma(i)   = log: (1 / ln W) * ln(i + 1)        linear: i / W           (i < W)
///     WarmupLR          lr(i) = min_lr + (max_lr - min_lr) * gamma(i), gamma = 1 for i >= W; min_lr for i < 0
///     WarmupDecayLR     as WarmupLR, but for i >= W gamma = max(0, (T - i) / max(1, T - W))
///     WarmupCosineLR    lr(i) = base_lr * ratio(i), ratio(i < 0) = 0,
///                       ratio(i < W) = warmup_min_ratio + gamma(i) * (1 - warmup_min_ratio),
///                       ratio(i >= W) = max(0, cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * (i - W + 1) / (T -
///                       W))) / 2)
///
/// Like DeepSpeed, WarmupCosineLR does not clamp i at T: past T the cosine rises again.

#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace zero {

/// The increasing function of the warmup phase.
enum class warmup_type : std::uint8_t {
  log,   ///< gamma(i) = ln(i + 1) / ln(W), DeepSpeed's default
  linear ///< gamma(i) = i / W
};

/// "log" or "linear".
[[nodiscard]] constexpr std::string_view name_of(warmup_type t) noexcept {
  return t == warmup_type::log ? "log" : "linear";
}

/// Parses DeepSpeed's `warmup_type` value.
/// \throws config_error naming the value and the accepted ones (DeepSpeed only warns and uses "log").
[[nodiscard]] inline warmup_type parse_warmup_type(std::string_view s) {
  if (s == "log") {
    return warmup_type::log;
  }
  if (s == "linear") {
    return warmup_type::linear;
  }
  throw config_error("scheduler.params.warmup_type: unknown value \"" + std::string(s) +
                     "\"; expected \"log\" or \"linear\"");
}

namespace detail {

/// DeepSpeed's effective warmup length: max(2, warmup_num_steps).
constexpr std::int64_t effective_warmup(std::int64_t warmup_num_steps) noexcept {
  return warmup_num_steps < 2 ? 2 : warmup_num_steps;
}

/// gamma(i) of the warmup phase, 0 <= i < W.
inline double warmup_gamma(warmup_type type, std::int64_t i, std::int64_t w) noexcept {
  if (type == warmup_type::log) {
    const double inverse_log_warm_up = 1.0 / std::log(static_cast<double>(w));
    return inverse_log_warm_up * std::log(static_cast<double>(i + 1));
  }
  return static_cast<double>(i) / static_cast<double>(w);
}

inline void require_finite(double v, std::string_view key) {
  if (!std::isfinite(v)) {
    throw config_error("scheduler.params." + std::string(key) + " must be a finite number, got " + std::to_string(v));
  }
}

} // namespace detail

/// A schedule that keeps the optimizer's lr: what a config without "scheduler" gets.
class constant_lr {
public:
  /// \param lr the learning rate of every step.
  explicit constant_lr(double lr = 1e-3) : lr_(lr) { detail::require_finite(lr, "lr"); }
  /// The lr at iteration `last_batch_iteration`: always the constant.
  [[nodiscard]] double lr_at(std::int64_t /*last_batch_iteration*/) const noexcept { return lr_; }

private:
  double lr_;
};

/// Parameters of DeepSpeed's `WarmupLR` (names as in the config's "scheduler.params").
struct warmup_lr_params {
  /// Learning rate at the start of the warmup.
  double warmup_min_lr = 0.0;
  /// Learning rate at the end of the warmup and after it.
  double warmup_max_lr = 0.001;
  /// Steps of the warmup; values below 2 count as 2, as in DeepSpeed.
  std::int64_t warmup_num_steps = 1000;
  /// Shape of the warmup.
  zero::warmup_type warmup_type = zero::warmup_type::log;
};

/// DeepSpeed's `WarmupLR`: from warmup_min_lr to warmup_max_lr over warmup_num_steps, then constant.
class warmup_lr {
public:
  /// \throws config_error when an lr is not finite.
  explicit warmup_lr(const warmup_lr_params& p = {}) : p_(p), w_(detail::effective_warmup(p.warmup_num_steps)) {
    detail::require_finite(p.warmup_min_lr, "warmup_min_lr");
    detail::require_finite(p.warmup_max_lr, "warmup_max_lr");
  }
  /// The lr at `last_batch_iteration` (-1 before the first scheduler step gives warmup_min_lr).
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    if (last_batch_iteration < 0) {
      return p_.warmup_min_lr;
    }
    return p_.warmup_min_lr + (delta() * gamma(last_batch_iteration));
  }
  /// The parameters, with warmup_num_steps as given.
  [[nodiscard]] const warmup_lr_params& params() const noexcept { return p_; }
  /// The warmup length in effect, max(2, warmup_num_steps).
  [[nodiscard]] std::int64_t warmup_steps() const noexcept { return w_; }

protected:
  /// warmup_max_lr - warmup_min_lr.
  [[nodiscard]] double delta() const noexcept { return p_.warmup_max_lr - p_.warmup_min_lr; }
  /// gamma(i) of the warmup phase and 1 after it.
  [[nodiscard]] double gamma(std::int64_t i) const noexcept {
    return i < w_ ? detail::warmup_gamma(p_.warmup_type, i, w_) : 1.0;
  }

  warmup_lr_params p_;
  std::int64_t w_;
};

/// Parameters of DeepSpeed's `WarmupDecayLR`.
struct warmup_decay_lr_params : warmup_lr_params {
  /// Total training steps: after the warmup gamma falls linearly to 0 at this step, where the lr is
  /// back at warmup_min_lr (and stays there).
  std::int64_t total_num_steps = 10000;
};

/// DeepSpeed's `WarmupDecayLR`: `WarmupLR`'s warmup, then a linear decay of gamma to 0 at total_num_steps.
/// A total_num_steps below the warmup is accepted (DeepSpeed only warns): the lr then drops to
/// warmup_min_lr right after the warmup.
class warmup_decay_lr : public warmup_lr {
public:
  /// \throws config_error when an lr is not finite.
  explicit warmup_decay_lr(const warmup_decay_lr_params& p = {}) : warmup_lr(p), total_(p.total_num_steps) {}
  /// The lr at `last_batch_iteration` (-1 gives warmup_min_lr).
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    if (last_batch_iteration < 0) {
      return p_.warmup_min_lr;
    }
    return p_.warmup_min_lr + (delta() * decay_gamma(last_batch_iteration));
  }
  /// total_num_steps.
  [[nodiscard]] std::int64_t total_num_steps() const noexcept { return total_; }

private:
  [[nodiscard]] double decay_gamma(std::int64_t i) const noexcept {
    if (i < w_) {
      return detail::warmup_gamma(p_.warmup_type, i, w_);
    }
    const double left = static_cast<double>(total_ - i);
    const double span = std::max(1.0, static_cast<double>(total_ - w_));
    return std::max(0.0, left / span);
  }

  std::int64_t total_;
};

/// Parameters of DeepSpeed's `WarmupCosineLR`.
struct warmup_cosine_lr_params {
  /// The optimizer's lr ("optimizer.params.lr"), which the ratio multiplies.
  double base_lr = 0.001;
  /// Total training steps; must exceed the effective warmup.
  std::int64_t total_num_steps = 10000;
  /// Ratio of base_lr at the start of the warmup.
  double warmup_min_ratio = 0.0;
  /// Steps of the warmup; values below 2 count as 2.
  std::int64_t warmup_num_steps = 1000;
  /// Ratio of base_lr the cosine ends at.
  double cos_min_ratio = 0.0001;
  /// Shape of the warmup.
  zero::warmup_type warmup_type = zero::warmup_type::log;
};

/// DeepSpeed's `WarmupCosineLR`: the ratio rises from warmup_min_ratio to 1 over the warmup, then
/// follows a half cosine down to cos_min_ratio at total_num_steps; lr = base_lr * ratio. As in
/// DeepSpeed, iteration -1 (the very first optimizer step) gets ratio 0.
class warmup_cosine_lr {
public:
  /// \throws config_error when a value is not finite, or total_num_steps <= max(2, warmup_num_steps)
  ///         (the cosine phase would divide by zero or run backwards; DeepSpeed fails or misbehaves there).
  explicit warmup_cosine_lr(const warmup_cosine_lr_params& p = {})
      : p_(p), w_(detail::effective_warmup(p.warmup_num_steps)) {
    detail::require_finite(p.base_lr, "lr");
    detail::require_finite(p.warmup_min_ratio, "warmup_min_ratio");
    detail::require_finite(p.cos_min_ratio, "cos_min_ratio");
    if (p.total_num_steps <= w_) {
      throw config_error("scheduler.params.total_num_steps (" + std::to_string(p.total_num_steps) +
                         ") must be larger than warmup_num_steps (" + std::to_string(w_) +
                         ", at least 2) for WarmupCosineLR; raise total_num_steps or shorten the warmup");
    }
  }
  /// The ratio lr / base_lr at `last_batch_iteration` (-1 gives 0).
  [[nodiscard]] double ratio_at(std::int64_t last_batch_iteration) const noexcept {
    const std::int64_t i = last_batch_iteration;
    if (i < 0) {
      return 0.0;
    }
    if (i < w_) {
      const double gamma = detail::warmup_gamma(p_.warmup_type, i, w_);
      const double ratio_delta = 1.0 - p_.warmup_min_ratio;
      return p_.warmup_min_ratio + gamma * ratio_delta;
    }
    const double real_last_step = static_cast<double>(i - w_ + 1);
    const double real_total_steps = static_cast<double>(p_.total_num_steps - w_);
    const double ratio_delta = 1.0 - p_.cos_min_ratio;
    const double ratio = (1.0 + std::cos(std::numbers::pi * real_last_step / real_total_steps)) / 2.0;
    return std::max(0.0, p_.cos_min_ratio + ratio_delta * ratio);
  }
  /// base_lr * ratio_at(last_batch_iteration).
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    return p_.base_lr * ratio_at(last_batch_iteration);
  }
  /// The parameters as given.
  [[nodiscard]] const warmup_cosine_lr_params& params() const noexcept { return p_; }
  /// The warmup length in effect, max(2, warmup_num_steps).
  [[nodiscard]] std::int64_t warmup_steps() const noexcept { return w_; }

private:
  warmup_cosine_lr_params p_;
  std::int64_t w_;
};

/// Any of the schedules, and the step counter DeepSpeed keeps beside it. The engine calls `step()`
/// after each applied optimizer step and uses `lr()` for the next one.
class lr_scheduler {
public:
  /// The schedules an `lr_scheduler` can hold.
  using schedule = std::variant<constant_lr, warmup_lr, warmup_decay_lr, warmup_cosine_lr>;

  /// Holds `s`, at iteration -1 (nothing stepped yet).
  explicit lr_scheduler(schedule s = constant_lr{}) : s_(std::move(s)) {}

  /// Advances to the next iteration, as DeepSpeed's `scheduler.step()`; returns the new lr.
  double step() noexcept {
    ++last_batch_iteration_;
    return lr();
  }
  /// The lr for the next optimizer step (DeepSpeed's `get_last_lr()[0]`).
  [[nodiscard]] double lr() const noexcept { return lr_at(last_batch_iteration_); }
  /// The lr of this schedule at any iteration.
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    return std::visit([&](const auto& s) { return s.lr_at(last_batch_iteration); }, s_);
  }
  /// The lr of a parameter group whose own lr is `group_lr`, following DeepSpeed: WarmupLR and
  /// WarmupDecayLR set every group to the schedule's lr; WarmupCosineLR scales each group's own lr
  /// by the ratio; the constant schedule keeps the group's lr.
  [[nodiscard]] double group_lr(double group_lr) const noexcept {
    if (const auto* c = std::get_if<warmup_cosine_lr>(&s_)) {
      return group_lr * c->ratio_at(last_batch_iteration_);
    }
    if (std::holds_alternative<constant_lr>(s_)) {
      return group_lr;
    }
    return lr();
  }
  /// DeepSpeed's `last_batch_iteration` (the scheduler's whole checkpoint state).
  [[nodiscard]] std::int64_t last_batch_iteration() const noexcept { return last_batch_iteration_; }
  /// Restores the iteration from a checkpoint (DeepSpeed's `load_state_dict`).
  void set_last_batch_iteration(std::int64_t i) noexcept { last_batch_iteration_ = i; }
  /// The schedule held.
  [[nodiscard]] const schedule& get() const noexcept { return s_; }

private:
  schedule s_;
  std::int64_t last_batch_iteration_ = -1;
};

} // namespace zero
