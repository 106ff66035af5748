#pragma once
/// \file
/// What limits and counts stage 3's gathering (`param_coordinator`): `coordinator_options`, from
/// DeepSpeed's stage3_* settings, `gather_stats`, one step's counters, and `detail::gather_pass`, the
/// order of a pass's gathers against the recorded trace.

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

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

namespace detail {
/// One kind of pass's gather order (training, or evaluation): the recorded trace and this pass's order.
struct gather_pass {
  std::vector<int> trace;   // the recorded order
  std::vector<int> current; // this pass's order so far
  bool diverged = false;    // this pass left the trace
  bool borrowed = false;    // the trace is another schedule position's, a guess until this pass ends

  /// Records module `m`'s gather; on the first one that leaves the trace, counts a trace change and
  /// says where on `log` (with `names` of the modules; `kind` names the pass), unless the trace was
  /// `borrowed` (then prefetch just stops for the pass).
  void note(int m, gather_stats& stats, const std::vector<std::string>& names,
            const std::function<void(const std::string&)>& log, const std::string& kind) {
    const std::size_t pos = current.size();
    current.push_back(m);
    if (diverged || trace.empty() || (pos < trace.size() && trace[pos] == m)) {
      return;
    }
    diverged = true;
    if (borrowed) {
      return;
    }
    ++stats.trace_changes;
    if (log) {
      const std::string expected =
          pos < trace.size() ? "\"" + names[static_cast<std::size_t>(trace[pos])] + "\"" : "the end of the trace";
      log("[zero] stage 3: module order changed at gather #" + std::to_string(pos) + " (" + kind + "): expected " +
          expected + ", got \"" + names[static_cast<std::size_t>(m)] +
          "\"; prefetch is off for this pass and the trace will be recorded again");
    }
  }
  /// Ends the pass: its order becomes the trace when it differed, or there was none of its own.
  void finish(gather_stats& stats) {
    if (trace.empty() || diverged || borrowed || current.size() != trace.size()) {
      if (!trace.empty() && !diverged && !borrowed) {
        ++stats.trace_changes; // the pass ended early: fewer gathers than the trace
      }
      trace = current;
    }
    current.clear();
    diverged = false;
    borrowed = false;
  }
};
} // namespace detail

} // namespace zero
