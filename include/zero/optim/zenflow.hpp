#pragma once
/// \file
/// What decides a ZenFlow step (DeepSpeed's ZenFlow, the `zero_optimization.zenflow` block;
/// docs/offload.md, "Selective"): which steps choose the columns again and which end with the host's
/// update (`zenflow_schedule`), and how the columns are chosen: the L1 norm of each column of a 2-D weight's
/// gradient, summed over the parts the ranks hold (`add_column_abs`), its top k (`zenflow_column_count`,
/// `top_columns`), and the elements of a rank's part those columns cover (`column_elements`).
///
/// A weight of shape [rows, cols] lies row-major in the flat buffer, so a column is one element in each
/// row, `cols` apart, and a rank's part of the weight (a contiguous range, which may begin and end inside
/// a row) holds a piece of every column it crosses. A column's norm is therefore the sum of the parts'
/// sums: each rank adds its part's into `cols` sums, the ranks all-reduce them, and every rank then chooses
/// the same columns. DeepSpeed's stages 1-2 instead store each weight transposed and score only the columns
/// whole inside one rank's slice (a column across a slice boundary is never chosen); its stage 3 takes the
/// global top k per weight as here.

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

namespace zero {

/// ZenFlow's schedule over the count m of steps taken (0 for the first), DeepSpeed's rules: W =
/// `full_warm_up_rounds`, U = `update_interval`, S = the select interval in steps
/// (`zenflow_select_steps`; 0: select once).
struct zenflow_schedule {
  std::int64_t warmup = 0;          ///< W: the first W steps update the whole state on the host
  std::int64_t update_interval = 1; ///< U >= 1
  std::int64_t select_interval = 0; ///< S >= 0

  /// \throws usage_error for W or S below 0 or U below 1.
  void check() const {
    if (warmup < 0 || update_interval < 1 || select_interval < 0) {
      throw usage_error("zenflow_schedule: expected warmup >= 0, update_interval >= 1 and "
                        "select_interval >= 0; got " +
                        std::to_string(warmup) + ", " + std::to_string(update_interval) + " and " +
                        std::to_string(select_interval));
    }
  }
  /// Step m runs in the warm-up: no columns chosen, the whole state updated on the host.
  [[nodiscard]] bool warming(std::int64_t m) const noexcept { return m < warmup; }
  /// Step m chooses the columns before its update: the first step after the warm-up, then every S steps
  /// (m a multiple of S, counted from the first step, not from the warm-up's end).
  [[nodiscard]] bool selects(std::int64_t m) const noexcept {
    return m == warmup || (select_interval > 0 && m > warmup && m % select_interval == 0);
  }
  /// Step m ends with the host applying the gradients accumulated since its last update: every step of the
  /// warm-up, every U-th step after it ((m + 1 - W) a multiple of U), and the step before a selection, so
  /// that the columns are chosen again over a state with every update applied.
  [[nodiscard]] bool updates_host(std::int64_t m) const noexcept {
    return m < warmup || (m + 1 - warmup) % update_interval == 0 ||
           (select_interval > 0 && (m + 1) % select_interval == 0);
  }
};

/// Adds |g| of each element of `part`, the elements [first, first + part.size()) of a row-major [rows, cols]
/// weight's gradient, to `sums[c]` of its column c = (first + i) mod cols, in element order.
/// \throws usage_error when `sums` is not `cols` long, cols < 1 or first < 0.
template <class T>
void add_column_abs(std::span<const T> part, std::int64_t first, std::int64_t cols, std::span<float> sums) {
  if (cols < 1 || first < 0 || static_cast<std::int64_t>(sums.size()) != cols) {
    throw usage_error("add_column_abs: expected cols >= 1, first >= 0 and cols sums; got cols " + std::to_string(cols) +
                      ", first " + std::to_string(first) + " and " + std::to_string(sums.size()) + " sums");
  }
  std::int64_t c = first % cols;
  for (const T& g : part) {
    sums[static_cast<std::size_t>(c)] += std::fabs(to_float(g));
    if (++c == cols) {
      c = 0;
    }
  }
}

/// How many of a weight's `cols` columns ZenFlow updates on the device: floor(topk_ratio x cols), at least 1
/// (DeepSpeed's count for a whole weight). \throws usage_error for a ratio outside [0, 1] or cols < 1.
[[nodiscard]] inline std::int64_t zenflow_column_count(double topk_ratio, std::int64_t cols) {
  if (!(topk_ratio >= 0 && topk_ratio <= 1) || cols < 1) {
    throw usage_error("zenflow_column_count: expected a ratio in [0, 1] and cols >= 1; got " +
                      std::to_string(topk_ratio) + " and " + std::to_string(cols));
  }
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::floor(topk_ratio * static_cast<double>(cols))));
}

/// The `k` columns of largest sum, in ascending order of index; of equal sums the lower index first (so
/// every rank, holding the same sums, chooses the same columns). A NaN sum ranks above every number (a
/// gradient that overflowed is not left on the host). \throws usage_error for k outside [0, cols].
[[nodiscard]] inline std::vector<std::int64_t> top_columns(std::span<const float> sums, std::int64_t k) {
  const auto cols = static_cast<std::int64_t>(sums.size());
  if (k < 0 || k > cols) {
    throw usage_error("top_columns: k " + std::to_string(k) + " is not in [0, " + std::to_string(cols) + "]");
  }
  std::vector<std::int64_t> order(sums.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  const auto above = [&](std::int64_t a, std::int64_t b) {
    const float x = sums[static_cast<std::size_t>(a)];
    const float y = sums[static_cast<std::size_t>(b)];
    if (std::isnan(x) != std::isnan(y)) {
      return std::isnan(x);
    }
    return x > y || (!(y > x) && a < b);
  };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), above);
  order.resize(static_cast<std::size_t>(k));
  std::sort(order.begin(), order.end());
  return order;
}

/// Of the elements [first, first + size) of a row-major weight with `cols` columns, the offsets from `first`
/// of those in `columns` (ascending, each below cols), in element order: the part's elements that a rank
/// gathers for the device's update and scatters back. \throws usage_error for a column out of range
/// or out of order, cols < 1, or first or size below 0.
[[nodiscard]] inline std::vector<std::int64_t> column_elements(std::span<const std::int64_t> columns, std::int64_t cols,
                                                               std::int64_t first, std::int64_t size) {
  if (cols < 1 || first < 0 || size < 0) {
    throw usage_error("column_elements: expected cols >= 1, first >= 0 and size >= 0; got " + std::to_string(cols) +
                      ", " + std::to_string(first) + " and " + std::to_string(size));
  }
  for (std::size_t i = 0; i < columns.size(); ++i) {
    if (columns[i] < 0 || columns[i] >= cols || (i > 0 && columns[i] <= columns[i - 1])) {
      throw usage_error("column_elements: columns must ascend, each in [0, " + std::to_string(cols) + ")");
    }
  }
  std::vector<std::int64_t> out;
  if (columns.empty() || size == 0) {
    return out;
  }
  const std::int64_t end = first + size;
  for (std::int64_t row_start = first - first % cols; row_start < end; row_start += cols) {
    for (const std::int64_t c : columns) {
      const std::int64_t at = row_start + c;
      if (at >= end) {
        break;
      }
      if (at >= first) {
        out.push_back(at - first);
      }
    }
  }
  return out;
}

} // namespace zero
