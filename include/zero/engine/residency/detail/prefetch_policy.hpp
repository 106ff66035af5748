#pragma once
/// \file
/// `detail::prefetch_policy`: what stage 3's coordinator (`param_coordinator`) gathers ahead of use and keeps after
/// it, read from the open pass's trace (`detail::gather_pass`, detail/gather_traces.hpp). The policy decides; the
/// coordinator gathers, reads and frees.
///
/// While a pass follows its trace, the all-gathers of the next units start while earlier modules compute, up to
/// stage3_prefetch_bucket_size elements ahead and never more than stage3_max_live_parameters elements gathered at
/// once; past those limits a shard in a file reads the next slices ahead. A released unit that the trace uses again
/// within stage3_max_reuse_distance elements stays gathered (the turn from the last forward layer to the first
/// backward one). A pass that left its trace, or has none, prefetches and keeps nothing.

#include "zero/engine/gather_stats.hpp"
#include "zero/engine/residency/detail/gather_traces.hpp"

#include <cstddef>
#include <vector>

namespace zero::detail {

/// The prefetch policy over one pass, for the length of a call (it keeps its arguments by reference).
/// Its walks see a unit `u` through two callables: `elements(u)`, the elements a gather of it holds
/// (0 for a persistent unit), and `idle(u)`, true for a unit that is not persistent and not gathered,
/// in flight or kept.
class prefetch_policy {
public:
  /// \param pass     the open pass: its trace and how far it got.
  /// \param modules  for each module id, its units.
  /// \param limits   stage3_prefetch_bucket_size, stage3_max_live_parameters, stage3_max_reuse_distance.
  prefetch_policy(const gather_pass& pass, const std::vector<std::vector<std::size_t>>& modules,
                  const coordinator_options& limits) noexcept
      : pass_(pass), modules_(modules), limits_(limits) {}

  /// Calls `start(u, m)` for each idle unit `u` of the modules `m` the trace gathers after the current
  /// position, in order, while it fits: the elements started by this call within prefetch_elements, and
  /// `live` (the elements gathered before the call) plus those within max_live_elements.
  /// \returns the trace position of the first unit that did not fit, or the trace's size.
  template <class Elements, class Idle, class Start>
  std::size_t start_ahead(std::size_t live, Elements&& elements, Idle&& idle, Start&& start) const {
    if (!following()) {
      return pass_.trace.size();
    }
    std::size_t ahead = 0;
    for (std::size_t pos = pass_.current.size(); pos < pass_.trace.size(); ++pos) {
      for (std::size_t u : units_at(pos)) {
        if (!idle(u)) {
          continue;
        }
        const std::size_t n = elements(u);
        if (ahead + n > limits_.prefetch_elements || live + ahead + n > limits_.max_live_elements) {
          return pos;
        }
        start(u, pass_.trace[pos]);
        ahead += n;
      }
    }
    return pass_.trace.size();
  }

  /// A shard in a file: calls `read(u)` for the idle units the trace gathers from position `pos` on,
  /// in order, until it returns false (no buffer is free).
  template <class Idle, class Read> void read_ahead(std::size_t pos, Idle&& idle, Read&& read) const {
    if (!following()) {
      return;
    }
    for (; pos < pass_.trace.size(); ++pos) {
      for (std::size_t u : units_at(pos)) {
        if (idle(u) && !read(u)) {
          return;
        }
      }
    }
  }

  /// True when the trace uses unit `u` again within max_reuse_distance elements of other gathers.
  template <class Elements> [[nodiscard]] bool keep(std::size_t u, Elements&& elements) const {
    if (!following()) {
      return false;
    }
    std::size_t distance = 0;
    for (std::size_t pos = pass_.current.size(); pos < pass_.trace.size(); ++pos) {
      for (std::size_t v : units_at(pos)) {
        if (v == u) {
          return true;
        }
        distance += elements(v);
      }
      if (distance > limits_.max_reuse_distance) {
        return false;
      }
    }
    return false;
  }

private:
  [[nodiscard]] bool following() const noexcept { return !pass_.diverged && !pass_.trace.empty(); }
  [[nodiscard]] const std::vector<std::size_t>& units_at(std::size_t pos) const {
    return modules_[static_cast<std::size_t>(pass_.trace[pos])];
  }

  const gather_pass& pass_;
  const std::vector<std::vector<std::size_t>>& modules_;
  const coordinator_options& limits_;
};

} // namespace zero::detail
