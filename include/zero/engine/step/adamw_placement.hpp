#pragma once
/// \file
/// The types every optimizer of the engine and the parts around them share: a parameter group's
/// hyper-parameters (`param_group`), an owned run (`owned_run`), the three state tensors
/// (`state_tensor`), what a placement asks of parameters in a file (`param_use`), where an optimizer
/// works (`adamw_placement`) and the owned ranges of a placement (`owned_ranges`). The registry,
/// the parameter file and the optimizers include this rather than `partitioned_adamw.hpp`.

#include "zero/backend/update_rules.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/flat_layout.hpp"

#include <algorithm>
#include <any>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

namespace zero {

/// Hyper-parameters of one parameter group.
struct param_group {
  /// The group's own lr (what a schedule scales or replaces, see `lr_scheduler::group_lr`).
  double lr = 1e-3;
  double weight_decay = 0.0;
};

/// A range of the flat buffer a rank owns, where its optimizer state starts, and its group.
struct owned_run {
  flat_range flat;
  std::size_t state_offset = 0;
  std::size_t group = 0;
};

/// One of the fp32 tensors of optimizer state a rank keeps per owned element. `master` is the fp32
/// parameter: the master copy, or for fp32 training the parameter itself. `exp_avg` and `exp_avg_sq` are
/// Adam's moments, and the first and second state tensor of any rule (update_rules.hpp: Lion's exp_avg, SGD's
/// momentum_buffer, Adagrad's sum are its first); `state_slot` numbers them.
enum class state_tensor : std::uint8_t { master, exp_avg, exp_avg_sq };

/// The rule's state tensor `t` stands for: 0 for exp_avg, 1 for exp_avg_sq (not for master).
[[nodiscard]] constexpr std::size_t state_slot(state_tensor t) noexcept { return t == state_tensor::exp_avg ? 0 : 1; }
/// The state tensor of slot `j` (0 or 1): `state_slot`'s inverse.
[[nodiscard]] constexpr state_tensor state_tensor_at(std::size_t j) noexcept {
  return j == 0 ? state_tensor::exp_avg : state_tensor::exp_avg_sq;
}

/// What an optimizer asks of parameters that live in a file (stage 3, offload_param nvme), through
/// `adamw_placement::params_in_file`.
enum class param_use : std::uint8_t {
  update,  ///< host memory that owned range k's step writes its new values into
  restore, ///< where range k's previous values go back after a step no rank keeps; null: nowhere
  whole,   ///< the whole shard in host memory (k is ignored), to read or write
};

/// Where a `partitioned_adamw` works, fixed when the engine is finalized.
struct adamw_placement {
  /// This rank.
  int rank = 0;
  /// The update rule, and the fp32 state tensors it keeps per element beside the master (`rule_state`;
  /// Adam/AdamW's two moments by default) with the value they start at (Adagrad's initial_accumulator_value).
  /// `partitioned_adamw` runs every rule, and with it `offloaded_adamw`'s host step and `partial_adamw`'s two
  /// parts; the optimizers that keep the state in a file, update out of place or delay refuse rules but AdamW.
  update_rule rule = update_rule::adamw;
  std::size_t state_tensors = 2;
  float state_init = 0.0f;
  /// With `rule` custom, the framework's rule's step for each backend it runs on (`custom_rule_step`s,
  /// custom_rule.hpp): the engine's backend and the host's.
  std::vector<std::any> custom_steps{};
  /// Own one slice per segment (stages 1-3) or everything (stage 0).
  bool partitioned = false;
  /// Dtype of the reduced gradients the step reads.
  dtype grad_type = dtype::f32;
  /// The low-precision parameters the step rewrites (their owned part): the whole flat buffer, or
  /// with `params_sharded` only the rank's shard, indexed like the optimizer state (stage 3).
  std::byte* params = nullptr;
  bool params_sharded = false;
  /// No parameters are written (`params` is null): stage 3 derives its shard from the master copy,
  /// so the step updates master, m and v only and `load_master` has nothing to load.
  bool params_from_master = false;
  /// The parameters live in host memory (stage 3's shard with `offload_param.device: cpu`): an
  /// optimizer stepping on the host writes them in place rather than through a staging copy.
  bool params_on_host = false;
  /// Set when the parameters live in a file (stage 3, offload_param nvme; `params` is null and
  /// `params_sharded` true): the memory each use of them goes through (see `param_use`). A step
  /// writes range k into `params_in_file(update, k)` and the residency writes it behind.
  std::function<std::byte*(param_use, std::size_t)> params_in_file{};
  /// The master, m and v live elsewhere (NVMe, streamed through host buffers by the caller, who steps
  /// them with `step_window`): none are allocated here, and `step`, `read_state`, `write_state` and
  /// `load_master` are the caller's.
  bool state_elsewhere = false;
  /// Keep only the rank's state elements [state_begin, state_end) (partial offload splits them between
  /// a device and a host optimizer, `partial_adamw`): the owned ranges are clipped to them, still one per
  /// segment (a range outside is empty), and numbered from 0, so this optimizer's state index i is the
  /// rank's state_begin + i. With `params_sharded`, `params` points at the rank's state index
  /// `state_begin`. The default keeps everything.
  std::size_t state_begin = 0;
  std::size_t state_end = std::numeric_limits<std::size_t>::max();
};

/// The owned ranges of `place` over `layout` (finalized): (flat range, state offset), one per segment
/// (stages 1-3: the rank's slice) or one for everything (stage 0), clipped to the placement's state
/// elements and numbered from its `state_begin`; and the state elements they hold.
[[nodiscard]] inline std::pair<std::vector<std::pair<flat_range, std::size_t>>, std::size_t>
owned_ranges(const flat_layout& layout, const adamw_placement& place) {
  std::vector<std::pair<flat_range, std::size_t>> out;
  if (place.partitioned) {
    for (const auto& s : layout.segments()) {
      out.push_back({s.slice_of(place.rank), s.shard_offset});
    }
  } else {
    out.push_back({{0, layout.total_size()}, 0});
  }
  const std::size_t all = place.partitioned ? layout.shard_size() : layout.total_size();
  const std::size_t end = std::min(place.state_end, all);
  const std::size_t begin = std::min(place.state_begin, end);
  for (auto& [range, offset] : out) {
    const std::size_t lo = std::clamp(offset, begin, end);
    const std::size_t hi = std::clamp(offset + range.size(), begin, end);
    range = {range.begin + (lo - offset), range.begin + (hi - offset)};
    offset = lo - begin;
  }
  return {std::move(out), end - begin};
}

} // namespace zero
