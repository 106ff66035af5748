#pragma once
/// \file
/// `norm_slots`: which elements of a rank's owned ranges count in the gradient norm, as the slots of
/// squared norms `grad_stats` sums (and `detail::host_gradients` computes on the host). A parameter
/// replicated across the tensor group counts on one tensor rank only (docs/design.md, "every boundary").

#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// Which elements of each owned range count in the gradient norm, as slots of squared norms that
/// every rank of the data group lays out alike (they are summed over it slot by slot). Slot j covers
/// `piece[j]`: (offset in its owned range, elements), possibly none; range k's slots are
/// [first[k], first[k + 1]).
struct norm_slots {
  std::vector<std::size_t> first;
  std::vector<std::pair<std::size_t, std::size_t>> piece;

  /// One slot per owned range, over all of it.
  [[nodiscard]] static norm_slots whole(const std::vector<std::pair<flat_range, std::size_t>>& ranges) {
    norm_slots s;
    for (const auto& [range, off] : ranges) {
      s.first.push_back(s.piece.size());
      s.piece.emplace_back(0, range.size());
    }
    s.first.push_back(s.piece.size());
    return s;
  }

  /// The owned `ranges`, range k a slice of `extent[k]` (its segment; the whole buffer unpartitioned),
  /// without the flat ranges `excluded`: each extent's counted pieces (the extent less `excluded`, the
  /// same on every rank of the data group) become slots, each cut to the rank's slice.
  /// \throws usage_error when the extents are not one per range or do not hold their ranges.
  [[nodiscard]] static norm_slots without(const std::vector<std::pair<flat_range, std::size_t>>& ranges,
                                          const std::vector<flat_range>& extent, std::vector<flat_range> excluded) {
    if (extent.size() != ranges.size()) {
      throw usage_error("norm_slots: " + std::to_string(extent.size()) + " extents for " +
                        std::to_string(ranges.size()) + " owned ranges");
    }
    std::sort(excluded.begin(), excluded.end(),
              [](const flat_range& a, const flat_range& b) { return a.begin < b.begin; });
    norm_slots s;
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      const flat_range& r = ranges[k].first;
      const flat_range& e = extent[k];
      if (r.begin < e.begin || r.end > e.end) {
        throw usage_error("norm_slots: owned range " + std::to_string(k) + " [" + std::to_string(r.begin) + ", " +
                          std::to_string(r.end) + ") is not inside its extent [" + std::to_string(e.begin) + ", " +
                          std::to_string(e.end) + ")");
      }
      s.first.push_back(s.piece.size());
      auto add = [&](std::size_t b, std::size_t end) { // counted [b, end) of the extent, cut to r
        const std::size_t lo = std::max(b, r.begin);
        const std::size_t hi = std::min(end, r.end);
        s.piece.emplace_back(lo < hi ? lo - r.begin : 0, lo < hi ? hi - lo : 0);
      };
      std::size_t at = e.begin;
      for (const flat_range& x : excluded) {
        if (x.end <= at || x.begin >= e.end) {
          continue;
        }
        if (x.begin > at) {
          add(at, x.begin);
        }
        at = std::max(at, x.end);
      }
      if (at < e.end) {
        add(at, e.end);
      }
    }
    s.first.push_back(s.piece.size());
    return s;
  }

  /// Slots.
  [[nodiscard]] std::size_t size() const noexcept { return piece.size(); }
};

} // namespace zero
