#pragma once
/// \file
/// Learning-rate schedules with DeepSpeed's semantics (deepspeed/runtime/lr_schedules.py):
/// `WarmupLR`, `WarmupDecayLR`, `WarmupCosineLR`, `LRRangeTest` and `OneCycle` (whose momentum cycle sets Adam's
/// betas too), plus a constant schedule for configs without a scheduler, and `lr_scheduler`, which holds any of
/// them and counts the steps.
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
///
/// LRRangeTest and OneCycle are functions of b = i + 1 (and take i = -1 to b = 0):
///
///     LRRangeTest       lr(i) = min_lr * (1 + step_rate * interval), interval = b / step_size (floor()ed when
///                       staircase)
///     OneCycle          S = first + second (the cycle's steps), r = first / S; for i < S a scale s in [0, 1]:
///                       x = (1 + b / S) - floor(1 + b / S); s = x / r if x <= r, else (x - 1) / (r - 1);
///                       with a stair count c of that half, s = floor(c * (steps into the cycle, or left of it in
///                       the second half) / that half's size) / c;
///                       lr = min_lr + (max_lr - min_lr) * s, beta1 = max_mom - (max_mom - min_mom) * s;
///                       for i >= S, with d = i - S + 1 and decay_step_size D: lr = min_lr / (1 + decay_lr_rate *
///                       d / D), beta1 = max_mom * (1 + decay_mom_rate * d / D) (no decay where D or the rate is
///                       0: lr = min_lr, beta1 = max_mom).
///                       With cycle_momentum, beta2 is 0.99 throughout and the first step (i = -1) runs with
///                       beta1 = min_mom, as DeepSpeed sets them when it builds the schedule.

#include "zero/core/error.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <optional>
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

/// Parameters of DeepSpeed's `LRRangeTest` (names as in the config's "scheduler.params" without the
/// `lr_range_test_` prefix).
struct lr_range_test_params {
  /// The lr at the start of the test.
  double min_lr = 1e-3;
  /// Steps per unit of the interval; at least 1.
  std::int64_t step_size = 2000;
  /// How much the lr grows per interval, in units of min_lr.
  double step_rate = 1.0;
  /// Whole intervals only (the lr rises in stairs) rather than continuously.
  bool staircase = false;
};

/// DeepSpeed's `LRRangeTest`: the lr rises linearly (or in stairs) from min_lr, to find the largest lr a model
/// trains at.
class lr_range_test {
public:
  /// \throws config_error when a value is not finite or step_size < 1 (DeepSpeed refuses it too).
  explicit lr_range_test(const lr_range_test_params& p = {}) : p_(p) {
    detail::require_finite(p.min_lr, "lr_range_test_min_lr");
    detail::require_finite(p.step_rate, "lr_range_test_step_rate");
    if (p.step_size < 1) {
      throw config_error("scheduler.params.lr_range_test_step_size must be a positive integer, got " +
                         std::to_string(p.step_size));
    }
  }
  /// The lr at `last_batch_iteration` (-1 gives min_lr).
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    if (last_batch_iteration < 0) {
      return p_.min_lr;
    }
    double interval = static_cast<double>(last_batch_iteration + 1) / static_cast<double>(p_.step_size);
    if (p_.staircase) {
      interval = std::floor(interval);
    }
    return p_.min_lr * (1.0 + (p_.step_rate * interval));
  }
  /// The parameters as given.
  [[nodiscard]] const lr_range_test_params& params() const noexcept { return p_; }

private:
  lr_range_test_params p_;
};

/// Parameters of DeepSpeed's `OneCycle` (names as in the config's "scheduler.params").
struct one_cycle_params {
  /// The lr at the start and end of the cycle.
  double cycle_min_lr = 0.0;
  /// The lr at the cycle's peak.
  double cycle_max_lr = 0.0;
  /// After the cycle the lr is cycle_min_lr / (1 + decay_lr_rate * d / decay_step_size).
  double decay_lr_rate = 0.0;
  /// Steps of the rising half; more than 0.
  double cycle_first_step_size = 2000;
  /// Steps of the falling half (>= 0); empty: cycle_first_step_size.
  std::optional<double> cycle_second_step_size{};
  /// Stairs of the rising half; 0: continuous.
  std::int64_t cycle_first_stair_count = 0;
  /// Stairs of the falling half; empty: cycle_first_stair_count.
  std::optional<std::int64_t> cycle_second_stair_count{};
  /// Steps per unit of the decay after the cycle; 0: no decay.
  double decay_step_size = 0;
  /// Whether Adam's beta1 cycles against the lr (and beta2 is set to 0.99, as DeepSpeed does).
  bool cycle_momentum = true;
  /// beta1 at the cycle's peak lr.
  double cycle_min_mom = 0.8;
  /// beta1 at the start and end of the cycle.
  double cycle_max_mom = 0.9;
  /// After the cycle beta1 is cycle_max_mom * (1 + decay_mom_rate * d / decay_step_size).
  double decay_mom_rate = 0.0;
};

/// DeepSpeed's `OneCycle`: one cycle of the lr up from cycle_min_lr to cycle_max_lr and back (and of Adam's beta1
/// against it), then a decay; the formulas are in the file comment.
class one_cycle {
public:
  /// \throws config_error when a value is not finite, cycle_first_step_size <= 0 or cycle_second_step_size < 0
  ///         (DeepSpeed refuses both), or a stair count or decay_step_size is negative.
  explicit one_cycle(const one_cycle_params& p = {})
      : p_(p), first_(p.cycle_first_step_size), second_(p.cycle_second_step_size.value_or(first_)),
        first_stairs_(p.cycle_first_stair_count),
        second_stairs_(p.cycle_second_stair_count.value_or(p.cycle_first_stair_count)) {
    for (const auto& [v, key] : {std::pair{p.cycle_min_lr, "cycle_min_lr"},
                                 {p.cycle_max_lr, "cycle_max_lr"},
                                 {p.decay_lr_rate, "decay_lr_rate"},
                                 {first_, "cycle_first_step_size"},
                                 {second_, "cycle_second_step_size"},
                                 {p.decay_step_size, "decay_step_size"},
                                 {p.cycle_min_mom, "cycle_min_mom"},
                                 {p.cycle_max_mom, "cycle_max_mom"},
                                 {p.decay_mom_rate, "decay_mom_rate"}}) {
      detail::require_finite(v, key);
    }
    if (first_ <= 0 || second_ < 0) {
      throw config_error("scheduler.params: OneCycle's cycle_first_step_size must be positive and "
                         "cycle_second_step_size non-negative, got " +
                         std::to_string(first_) + " and " + std::to_string(second_));
    }
    if (first_stairs_ < 0 || second_stairs_ < 0 || p.decay_step_size < 0) {
      throw config_error("scheduler.params: OneCycle's cycle_first_stair_count, cycle_second_stair_count and "
                         "decay_step_size must not be negative, got " +
                         std::to_string(first_stairs_) + ", " + std::to_string(second_stairs_) + " and " +
                         std::to_string(p.decay_step_size));
    }
    total_ = first_ + second_;
    ratio_ = first_ / total_;
  }
  /// The lr at `last_batch_iteration`.
  [[nodiscard]] double lr_at(std::int64_t last_batch_iteration) const noexcept {
    if (last_batch_iteration < 0) {
      return p_.cycle_min_lr;
    }
    if (in_cycle(last_batch_iteration)) {
      const double base_height = (p_.cycle_max_lr - p_.cycle_min_lr) * scale(last_batch_iteration);
      return p_.cycle_min_lr + base_height;
    }
    if (p_.decay_step_size == 0 || p_.decay_lr_rate == 0) {
      return p_.cycle_min_lr;
    }
    return p_.cycle_min_lr / (1.0 + (p_.decay_lr_rate * decay_interval(last_batch_iteration)));
  }
  /// Adam's (beta1, beta2) at `last_batch_iteration`, or nothing without cycle_momentum (the optimizer's own).
  [[nodiscard]] std::optional<std::array<double, 2>> betas_at(std::int64_t last_batch_iteration) const noexcept {
    if (!p_.cycle_momentum) {
      return std::nullopt;
    }
    constexpr double beta2 = 0.99; // DeepSpeed's OneCycle pairs every beta1 with 0.99
    if (last_batch_iteration < 0) {
      return std::array{p_.cycle_min_mom, beta2};
    }
    if (in_cycle(last_batch_iteration)) {
      const double base_height = (p_.cycle_max_mom - p_.cycle_min_mom) * scale(last_batch_iteration);
      return std::array{p_.cycle_max_mom - base_height, beta2};
    }
    if (p_.decay_step_size == 0 || p_.decay_mom_rate == 0) {
      return std::array{p_.cycle_max_mom, beta2};
    }
    return std::array{p_.cycle_max_mom * (1.0 + (p_.decay_mom_rate * decay_interval(last_batch_iteration))), beta2};
  }
  /// The parameters as given.
  [[nodiscard]] const one_cycle_params& params() const noexcept { return p_; }

private:
  [[nodiscard]] bool in_cycle(std::int64_t i) const noexcept { return static_cast<double>(i) < total_; }
  /// (i - S + 1) / decay_step_size.
  [[nodiscard]] double decay_interval(std::int64_t i) const noexcept {
    return (static_cast<double>(i) - total_ + 1.0) / p_.decay_step_size;
  }
  /// The scale in [0, 1] of the cycle at iteration i (DeepSpeed's `_get_scale_factor`).
  [[nodiscard]] double scale(std::int64_t i) const noexcept {
    const auto b = static_cast<double>(i + 1);
    const double cycle = std::floor(1.0 + (b / total_));
    const double x = (1.0 + (b / total_)) - cycle;
    double s = 0;
    std::int64_t stairs = 0;
    if (x <= ratio_) {
      s = x / ratio_;
      stairs = first_stairs_;
    } else {
      s = (x - 1.0) / (ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) { // from the step count, not from s, which may land just under a stair
      const double into = std::fmod(b, total_);
      const auto c = static_cast<double>(stairs);
      const double position = into <= first_ ? (into * c) / first_ : ((total_ - into) * c) / second_;
      s = std::floor(position) / c;
    }
    return s;
  }

  one_cycle_params p_;
  double first_, second_;
  std::int64_t first_stairs_, second_stairs_;
  double total_ = 0, ratio_ = 0;
};

/// Any of the schedules, and the step counter DeepSpeed keeps beside it. The engine calls `step()`
/// after each applied optimizer step and uses `lr()` for the next one.
class lr_scheduler {
public:
  /// The schedules an `lr_scheduler` can hold.
  using schedule = std::variant<constant_lr, warmup_lr, warmup_decay_lr, warmup_cosine_lr, lr_range_test, one_cycle>;

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
  /// The lr of a parameter group whose own lr is `group_lr`, following DeepSpeed: WarmupLR, WarmupDecayLR,
  /// LRRangeTest and OneCycle set every group to the schedule's lr; WarmupCosineLR scales each group's own lr
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
  /// Adam's betas for the next optimizer step: OneCycle's with cycle_momentum, else `optimizer_betas`.
  [[nodiscard]] std::array<double, 2> betas(std::array<double, 2> optimizer_betas) const noexcept {
    if (const auto* c = std::get_if<one_cycle>(&s_)) {
      return c->betas_at(last_batch_iteration_).value_or(optimizer_betas);
    }
    return optimizer_betas;
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
