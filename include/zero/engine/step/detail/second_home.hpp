#pragma once
/// \file
/// `detail::second_home`: the second home of `offloaded_adamw`'s updates during backward
/// (`offload_optimizer.backward_overlap`). The last ranges of a rank's state, a share of it at most,
/// get a second fp32 master, m and v in host memory; each such range's state lives in one of its two homes, and
/// an update during backward reads one and writes the other, so the previous state stays whole until
/// the step keeps the update. This class holds the second home and which home each range is in; the
/// first home is the optimizer's own state.

#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/adamw_placement.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// A range's fp32 master, m and v.
struct state_home {
  float* master;
  float* m;
  float* v;
};

/// The second home; see the file comment. `Alloc` is the counted host allocator (`memory_tag::buffers`).
template <class Alloc> class second_home {
public:
  using ranges_type = std::vector<std::pair<flat_range, std::size_t>>;

  second_home() = default;
  /// Gives the last of `ranges` (flat range, state offset), `share` of the `state` elements at most, a
  /// second home.
  second_home(const ranges_type& ranges, std::size_t state, double share, Alloc alloc)
      : first_(ranges.size()), base_(state) {
    const auto most = static_cast<std::size_t>(share * static_cast<double>(state));
    while (first_ > 0 && state - ranges[first_ - 1].second <= most) {
      --first_;
    }
    if (first_ == ranges.size()) {
      return;
    }
    base_ = ranges[first_].second;
    const std::size_t n = state - base_;
    master_ = buffer<float, Alloc>(alloc, n, memory_tag::buffers);
    m_ = buffer<float, Alloc>(alloc, n, memory_tag::buffers);
    v_ = buffer<float, Alloc>(alloc, n, memory_tag::buffers);
    side_.assign(ranges.size(), 0);
  }

  /// The first range with a second home (the number of ranges when none has).
  [[nodiscard]] std::size_t first() const noexcept { return first_; }
  /// The state elements from the first such range on.
  [[nodiscard]] std::size_t elements() const noexcept { return master_.size(); }
  /// Which home range `k` is in: 0, the optimizer's own state, or 1, this one (0 for a range without).
  [[nodiscard]] std::uint8_t side(std::size_t k) const noexcept { return k < side_.size() ? side_[k] : 0; }
  /// Moves range `k` to its other home.
  void flip(std::size_t k) noexcept { side_[k] ^= 1U; }

  /// The second home of the state at offset `off` (from the first such range on).
  [[nodiscard]] state_home at(std::size_t off) noexcept {
    const std::size_t o = off - base_;
    return {master_.data() + o, m_.data() + o, v_.data() + o};
  }

  /// Calls `f(second, lo, n)` for the pieces of state elements [first, first + n) of tensor `t`:
  /// `second` points at a piece living in its second home, or is null for one in the first.
  /// \throws usage_error for elements outside the `state` elements.
  template <class F>
  void for_each_piece(const ranges_type& ranges, std::size_t state, state_tensor t, std::size_t first, std::size_t n,
                      F&& f) {
    if (first + n > state || first + n < n) {
      throw usage_error("offloaded_adamw: state elements [" + std::to_string(first) + ", " + std::to_string(first + n) +
                        ") are outside this rank's " + std::to_string(state));
    }
    std::size_t cur = first;
    const std::size_t end = first + n;
    while (cur < end) {
      std::size_t hi = end;
      float* second = nullptr;
      for (std::size_t k = first_; k < side_.size(); ++k) { // side_ is empty without a second home
        const std::size_t off = ranges[k].second;
        const std::size_t e = off + ranges[k].first.size();
        if (side_[k] == 0 || e <= cur) {
          continue;
        }
        if (off <= cur) {
          const state_home h = at(off);
          float* base = t == state_tensor::master ? h.master : t == state_tensor::exp_avg ? h.m : h.v;
          second = base + (cur - off);
          hi = std::min(end, e);
        } else {
          hi = std::min(hi, off);
        }
        break;
      }
      f(second, cur, hi - cur);
      cur = hi;
    }
  }

  /// Moves every range living here back to its first home, `first_home(k)`.
  template <class FirstHome> void settle(const ranges_type& ranges, FirstHome&& first_home) {
    for (std::size_t k = first_; k < side_.size(); ++k) {
      if (side_[k] == 0) {
        continue;
      }
      const std::size_t n = ranges[k].first.size();
      const state_home from = at(ranges[k].second);
      const state_home to = first_home(k);
      std::memcpy(to.master, from.master, n * sizeof(float));
      std::memcpy(to.m, from.m, n * sizeof(float));
      std::memcpy(to.v, from.v, n * sizeof(float));
      side_[k] = 0;
    }
  }

private:
  std::size_t first_ = 0;
  std::size_t base_ = 0;
  buffer<float, Alloc> master_;
  buffer<float, Alloc> m_;
  buffer<float, Alloc> v_;
  std::vector<std::uint8_t> side_;
};

} // namespace zero::detail
