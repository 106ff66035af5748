#pragma once
/// \file
/// The `optimizer` and `scheduler` blocks of a `zero::config` (config.hpp): the optimizer the engine runs and
/// the learning-rate schedule that drives it, with DeepSpeed's names, defaults and meanings.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero {

/// The optimizers this version runs: DeepSpeed's `"Adam"`, `"AdamW"`, `"Lion"`, `"Adagrad"`, `"Lamb"` and PyTorch's
/// `"SGD"` (which DeepSpeed takes from torch.optim by name). zero/backend/update_rules.hpp has their formulas.
/// `custom` is a framework's own rule, named in `config_inputs::optimizers` (`custom_optimizer`).
enum class optimizer_type : std::uint8_t { adam, adamw, lion, sgd, adagrad, lamb, custom };

/// DeepSpeed's name of an optimizer type: "Adam", "AdamW", "Lion", "SGD", "Adagrad", "Lamb"; "custom" for a
/// framework's own (`optimizer_name` gives its name).
[[nodiscard]] constexpr std::string_view name_of(optimizer_type t) noexcept {
  switch (t) {
  case optimizer_type::adam:
    return "Adam";
  case optimizer_type::lion:
    return "Lion";
  case optimizer_type::sgd:
    return "SGD";
  case optimizer_type::adagrad:
    return "Adagrad";
  case optimizer_type::lamb:
    return "Lamb";
  case optimizer_type::custom:
    return "custom";
  case optimizer_type::adamw:
    break;
  }
  return "AdamW";
}

/// The learning-rate schedules this version runs (DeepSpeed's `deepspeed.runtime.lr_schedules`).
enum class scheduler_type : std::uint8_t { warmup_lr, warmup_decay_lr, warmup_cosine_lr, lr_range_test, one_cycle };

/// DeepSpeed's name of a schedule: "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "LRRangeTest", "OneCycle".
[[nodiscard]] constexpr std::string_view name_of(scheduler_type t) noexcept {
  switch (t) {
  case scheduler_type::warmup_lr:
    return "WarmupLR";
  case scheduler_type::warmup_decay_lr:
    return "WarmupDecayLR";
  case scheduler_type::warmup_cosine_lr:
    return "WarmupCosineLR";
  case scheduler_type::lr_range_test:
    return "LRRangeTest";
  case scheduler_type::one_cycle:
    return "OneCycle";
  }
  return "?";
}

/// How a schedule rises during warm-up: DeepSpeed's `"log"` (default) or `"linear"`.
enum class warmup_curve : std::uint8_t { log, linear };

/// DeepSpeed's name of a warm-up curve: "log", "linear".
[[nodiscard]] constexpr std::string_view name_of(warmup_curve c) noexcept {
  return c == warmup_curve::log ? "log" : "linear";
}

/// The `optimizer` block. Each type takes its own parameters (DeepSpeed passes them to the optimizer's
/// constructor): a parameter of another type is refused by name. Other DeepSpeed optimizers are refused by
/// `unimplemented_features`.
struct optimizer_config {
  /// `optimizer.type`: "Adam", "AdamW", "Lion", "SGD", "Adagrad" or "Lamb" (case-insensitive, as in DeepSpeed).
  optimizer_type type = optimizer_type::adamw;
  /// `optimizer.params.lr`. Default 1e-3 (DeepSpeed's FusedAdam, CPUAdam and Lion, torch.optim.SGD), 1e-2 for
  /// Adagrad (torch.optim.Adagrad, DeepSpeed's CPU Adagrad).
  double lr = 1e-3;
  /// `optimizer.params.betas` (Adam, AdamW, Lion, Lamb): [beta1, beta2]. Default [0.9, 0.999], Lion's [0.9, 0.99].
  std::array<double, 2> betas{0.9, 0.999};
  /// `optimizer.params.eps` (Adam, AdamW, Adagrad, Lamb). Default 1e-8, Adagrad's 1e-10.
  double eps = 1e-8;
  /// `optimizer.params.weight_decay`. Default 0, or 0.01 for AdamW with `torch_adam` (PyTorch's default).
  double weight_decay = 0.0;
  /// Decoupled weight decay (AdamW) when true, L2 added to the gradient (Adam) when false. DeepSpeed
  /// runs AdamW for type "AdamW" and for type "Adam" unless `optimizer.params.adam_w_mode` is false.
  bool adam_w_mode = true;
  /// `optimizer.params.bias_correction` (Adam, AdamW, Lamb). Default true.
  bool bias_correction = true;
  /// `optimizer.params.momentum` (SGD): the momentum factor; 0 (default) keeps no state.
  double momentum = 0.0;
  /// `optimizer.params.dampening` (SGD). Default 0.
  double dampening = 0.0;
  /// `optimizer.params.nesterov` (SGD): Nesterov momentum (needs momentum > 0 and dampening 0). Default false.
  bool nesterov = false;
  /// `optimizer.params.lr_decay` (Adagrad): the lr is lr / (1 + (step - 1) * lr_decay). Default 0.
  double lr_decay = 0.0;
  /// `optimizer.params.initial_accumulator_value` (Adagrad): the sum of squares' first value. Default 0.
  double initial_accumulator_value = 0.0;
  /// `optimizer.params.max_coeff` and `min_coeff` (Lamb): the trust ratio's bounds. Default 10 and 0.01.
  double max_coeff = 10.0;
  double min_coeff = 0.01;
  /// `optimizer.params.eps_inside_sqrt` (Lamb): sqrt(v + eps) rather than sqrt(v) + eps. Default false.
  bool eps_inside_sqrt = false;
  /// `optimizer.params.max_grad_norm` (Lamb): DeepSpeed's FusedLamb clip of the global norm; only 0 (off) is
  /// taken, as zero clips with `gradient_clipping`.
  double max_grad_norm = 0.0;
  /// A framework's own rule (`type` custom): its `optimizer.type`, the `optimizer.params` keys it takes and its
  /// fp32 state tensors' names, from the `custom_optimizer` of `config_inputs::optimizers` that matched.
  std::string custom;
  std::vector<std::string> custom_params;
  std::vector<std::string> custom_state;
  friend bool operator==(const optimizer_config&, const optimizer_config&) = default;
};

/// The name `optimizer.type` gives `o`'s rule: DeepSpeed's, or a framework's own.
[[nodiscard]] inline std::string optimizer_name(const optimizer_config& o) {
  return o.type == optimizer_type::custom ? o.custom : std::string(name_of(o.type));
}

/// A framework's own update rule as the config reads it (docs/optimizers.md, "A framework's own rule"): the
/// `optimizer.type` that names it (compared ignoring case, as DeepSpeed's), the `optimizer.params` keys it takes
/// (zero's names, whose values reach the rule through `adamw_step_args`: lr, betas, eps, weight_decay, momentum,
/// dampening, nesterov, lr_decay, ...) and its fp32 state tensors' names (at most two, the checkpoint's names).
/// The engine runs it once given the rule's type (`engine::use_rule<Rule>()`).
struct custom_optimizer {
  std::string name;
  std::vector<std::string> params;
  std::vector<std::string> state;

  /// The entry of a rule type with update_rules.hpp's members and `params`, an array of the keys it takes.
  template <class Rule> [[nodiscard]] static custom_optimizer of() {
    custom_optimizer c{.name = std::string(Rule::name), .params = {}, .state = {}};
    for (std::string_view k : Rule::params) {
      c.params.emplace_back(k);
    }
    for (std::size_t i = 0; i < Rule::max_state; ++i) {
      c.state.emplace_back(Rule::state_names[i]);
    }
    return c;
  }
};

/// The `scheduler` block: one of DeepSpeed's schedules. Each reads only its own parameters (the others keep
/// their defaults); the names and defaults are DeepSpeed's.
struct scheduler_config {
  /// `scheduler.type`: "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "LRRangeTest" or "OneCycle" (exact case,
  /// as in DeepSpeed).
  scheduler_type type = scheduler_type::warmup_lr;
  /// `warmup_min_lr` (WarmupLR, WarmupDecayLR): the learning rate at step 0. Default 0.
  double warmup_min_lr = 0.0;
  /// `warmup_max_lr` (WarmupLR, WarmupDecayLR): the learning rate after warm-up. WarmupDecayLR
  /// defaults to 0.001; WarmupLR defaults to the optimizer's lr, and stays empty when the config has
  /// no optimizer block (which the engine refuses).
  std::optional<double> warmup_max_lr;
  /// `warmup_num_steps`: length of the warm-up in optimizer steps (>= 1). Default 1000.
  std::int64_t warmup_num_steps = 1000;
  /// `warmup_type`: how the rate rises during warm-up. Default log.
  warmup_curve warmup_type = warmup_curve::log;
  /// `last_batch_iteration`: the step to resume from; -1 (default) starts at the beginning.
  std::int64_t last_batch_iteration = -1;
  /// `total_num_steps` (WarmupDecayLR, WarmupCosineLR; required there): steps of the whole run.
  /// 0 for WarmupLR, which has none.
  std::int64_t total_num_steps = 0;
  /// `warmup_min_ratio` (WarmupCosineLR): the fraction of lr at step 0. Default 0.
  double warmup_min_ratio = 0.0;
  /// `cos_min_ratio` (WarmupCosineLR): the fraction of lr at the end of the cosine. Default 1e-4.
  double cos_min_ratio = 1e-4;
  /// `lr_range_test_min_lr` (LRRangeTest): the lr the test starts at. Default 1e-3.
  double lr_range_test_min_lr = 1e-3;
  /// `lr_range_test_step_size` (LRRangeTest): steps per interval (>= 1). Default 2000.
  std::int64_t lr_range_test_step_size = 2000;
  /// `lr_range_test_step_rate` (LRRangeTest): the lr's growth per interval, in units of the minimum. Default 1.
  double lr_range_test_step_rate = 1.0;
  /// `lr_range_test_staircase` (LRRangeTest): the lr rises in whole intervals. Default false.
  bool lr_range_test_staircase = false;
  /// `cycle_min_lr` (OneCycle; required): the lr at the ends of the cycle.
  double cycle_min_lr = 0.0;
  /// `cycle_max_lr` (OneCycle; required): the lr at the cycle's peak.
  double cycle_max_lr = 0.0;
  /// `decay_lr_rate` (OneCycle): the lr's decay after the cycle. Default 0 (none).
  double decay_lr_rate = 0.0;
  /// `cycle_first_step_size` (OneCycle): steps of the rising half (> 0). Default 2000.
  double cycle_first_step_size = 2000;
  /// `cycle_second_step_size` (OneCycle): steps of the falling half (>= 0). Default null: the first's.
  std::optional<double> cycle_second_step_size{};
  /// `cycle_first_stair_count` (OneCycle): stairs of the rising half. Default 0 (continuous).
  std::int64_t cycle_first_stair_count = 0;
  /// `cycle_second_stair_count` (OneCycle): stairs of the falling half. Default null: the first's.
  std::optional<std::int64_t> cycle_second_stair_count{};
  /// `decay_step_size` (OneCycle): steps per unit of the decay after the cycle. Default 0 (no decay).
  double decay_step_size = 0;
  /// `cycle_momentum` (OneCycle): Adam's beta1 cycles against the lr, and beta2 is 0.99 (DeepSpeed replaces
  /// `optimizer.params.betas` so). Default true.
  bool cycle_momentum = true;
  /// `cycle_min_mom` (OneCycle): beta1 at the peak lr (and at the first step). Default 0.8.
  double cycle_min_mom = 0.8;
  /// `cycle_max_mom` (OneCycle): beta1 at the ends of the cycle. Default 0.9.
  double cycle_max_mom = 0.9;
  /// `decay_mom_rate` (OneCycle): beta1's growth after the cycle. Default 0 (none).
  double decay_mom_rate = 0.0;
  friend bool operator==(const scheduler_config&, const scheduler_config&) = default;
};

} // namespace zero
