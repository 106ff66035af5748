#pragma once
/// \file
/// What limits and counts stage 3's gathering (`param_coordinator`): `coordinator_options`, from
/// DeepSpeed's stage3_* settings, and `gather_stats`, one step's counters. The order of a pass's gathers
/// against the recorded trace is `detail::gather_pass` (detail/gather_traces.hpp).

#include <cstddef>

namespace zero {

/// Limits of gathering, in parameter elements (DeepSpeed's stage3_* settings).
struct coordinator_options {
  /// Elements the prefetcher may have in flight ahead of use (stage3_prefetch_bucket_size).
  std::size_t prefetch_elements = 50'000'000;
  /// Elements gathered at once, prefetched ones included (stage3_max_live_parameters).
  std::size_t max_live_elements = 1'000'000'000;
  /// A released unit stays gathered when the trace uses it again within this many elements of
  /// other gathers (stage3_max_reuse_distance).
  std::size_t max_reuse_distance = 1'000'000'000;
  /// The shard is not kept: a gather casts the rank's slice from the optimizer's fp32 master copy
  /// (`param_coordinator::derive_from`), and no 16-bit copy lives between steps (16-bit training
  /// with the optimizer on the device; not `zero_optimization.stage3_keep_param_shard`).
  bool params_from_master = false;
};

/// Counters of one step's gathering, for tests and logs.
struct gather_stats {
  std::size_t all_gathers = 0;          ///< all-gathers issued (on demand + prefetch)
  std::size_t on_demand = 0;            ///< gathers that had to wait because nothing was prefetched
  std::size_t prefetched = 0;           ///< all-gathers issued ahead of use
  std::size_t prefetch_used = 0;        ///< prefetched units that were then gathered
  std::size_t prefetch_wasted = 0;      ///< prefetched units freed without being used
  std::size_t reused = 0;               ///< gathers served by a unit kept for reuse
  std::size_t trace_changes = 0;        ///< steps whose module order differed from the trace
  std::size_t persistent_refreshes = 0; ///< all-gathers of persistent units after optimizer steps
  std::size_t quantized_gathers = 0;    ///< all-gathers of int8 codes and scales (qwZ)
  std::size_t node_gathers = 0;         ///< all-gathers over the node group from the secondary partition (hpZ)
};

} // namespace zero
