#pragma once
/// \file
/// `zero_optimization.zenflow`, DeepSpeed's ZenFlow block, as zero reads it (zero/config/schema.hpp's
/// zenflow_keys and read_zenflow), and the select interval its keys give.

#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>

namespace zero {

/// `zero_optimization.zenflow.select_strategy`: when ZenFlow chooses its columns again.
enum class zenflow_select : std::uint8_t {
  automatic, ///< "auto" (default): every epoch, as "epoch" with select_interval 1
  step,      ///< every select_interval steps
  epoch,     ///< every select_interval epochs of steps_per_epoch steps
};

/// `select_strategy`'s text: "auto", "step" or "epoch".
[[nodiscard]] constexpr std::string_view name_of(zenflow_select s) noexcept {
  switch (s) {
  case zenflow_select::step:
    return "step";
  case zenflow_select::epoch:
    return "epoch";
  case zenflow_select::automatic:
    break;
  }
  return "auto";
}

/// `zero_optimization.zenflow` (DeepSpeed 0.19's ZenFlow; docs/offload.md, "Selective"): the top-k columns of
/// each 2-D weight by gradient norm updated on the device every step, the rest accumulated and applied on the
/// host every `update_interval` steps. Read with DeepSpeed's keys, defaults and rules for "auto"; the engine runs
/// it (`zenflow_plan`) where `check_engine_config` accepts it. `enabled` is true when the block is given (not
/// null).
struct zenflow_config {
  bool enabled = false;
  /// `topk_ratio`: the share of each 2-D weight's columns updated on the device every step, 0 to 1. Default 0.1.
  double topk_ratio = 0.1;
  /// `select_strategy`: "auto" (default), "step" or "epoch".
  zenflow_select select_strategy = zenflow_select::automatic;
  /// `select_interval`: steps ("step") or epochs ("epoch") between selections, >= 0 (0: select once); empty
  /// for "auto" (default), which only select_strategy "auto" takes (as 1 epoch).
  std::optional<std::int64_t> select_interval;
  /// `update_interval`: steps between the host's updates, >= 1; empty for "auto" (default, DeepSpeed's
  /// adaptive interval), which the reader refuses: this version has no adaptive interval.
  std::optional<std::int64_t> update_interval;
  /// `overlap_step`: the host's update runs beside the next steps and lands one interval late. Default false.
  bool overlap_step = false;
  /// `offload`: the selected columns' optimizer state in pinned host memory. Default false.
  bool offload = false;
  /// `auto_ratio`: the adaptive interval's threshold, 0 to 1. Default 0.99.
  double auto_ratio = 0.99;
  /// `full_warm_up_rounds`: steps at the start that update the whole state on the host, >= 0. Default 0.
  std::int64_t full_warm_up_rounds = 0;
  /// `pt_reserved_cores_perc`: with overlap_step, the share of the rank's cores kept for training. Default 0.5.
  double pt_reserved_cores_perc = 0.5;
  /// `steps_per_epoch`: the steps of an epoch, for select_strategy "epoch" and "auto" (DeepSpeed counts its
  /// dataloader's); 0 (default): unknown, and those strategies select once.
  std::int64_t steps_per_epoch = 0;
  friend bool operator==(const zenflow_config&, const zenflow_config&) = default;
};

/// The steps between ZenFlow's selections, DeepSpeed's rule: "step" its select_interval, "epoch" that many
/// epochs of steps_per_epoch steps, "auto" one epoch; 0 (select once, at the end of full_warm_up_rounds) where
/// an epoch's steps are unknown or the interval is 0.
[[nodiscard]] inline std::int64_t zenflow_select_steps(const zenflow_config& z) {
  switch (z.select_strategy) {
  case zenflow_select::step:
    return z.select_interval.value_or(0);
  case zenflow_select::epoch: {
    std::int64_t steps = 0;
    return __builtin_mul_overflow(z.select_interval.value_or(0), z.steps_per_epoch, &steps)
               ? std::numeric_limits<std::int64_t>::max()
               : steps;
  }
  case zenflow_select::automatic:
    return z.steps_per_epoch;
  }
  return 0;
}

} // namespace zero
