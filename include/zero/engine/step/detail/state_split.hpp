#pragma once
/// \file
/// `detail::state_split`: a rank's optimizer state elements (its owned ranges, in state order) cut at one
/// index between two optimizers over adjacent element ranges, the first over [0, split) and the second
/// over [split, state_size()). It is the part the composed optimizers share: `partial_adamw` (the
/// device's share and the host's) and `host_nvme_adamw` (the NVMe file's share and host memory's). It
/// makes both parts from one placement (`adamw_placement::state_begin`/`state_end`), keeps the rank's
/// whole owned ranges and the runs of both in state order, and reaches either part by a rank state index
/// (`for_each_part`, what `read_state` and `write_state` of both composites go through). How the two
/// parts step is the composite's. `detail::state_split_view` writes the composites' state view and whole
/// step once, over the split each holds.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/adamw_placement.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// Two optimizers over adjacent state elements of one rank; see the file comment.
template <class First, class Second> class state_split {
public:
  using ranges_type = std::vector<std::pair<flat_range, std::size_t>>;

  /// Makes `first` over the rank's first state elements and `second` over its last `second_elements`.
  /// \param who   the composite's name, and `parts` how its error names the two ("on the host; ...").
  /// \param make_first, make_second called with `place` keeping their elements (`part`), each
  ///              returning its optimizer.
  /// \throws usage_error naming `who` unless 0 < second_elements < the rank's state elements (else one
  ///         optimizer alone does it).
  template <class MakeFirst, class MakeSecond>
  state_split(const char* who, const char* parts, const flat_layout& layout, const adamw_placement& place,
              std::size_t second_elements, MakeFirst&& make_first, MakeSecond&& make_second)
      : who_(who), full_(owned_ranges(layout, place)), split_(checked_split(who, parts, full_.second, second_elements)),
        first_(make_first(part(place, 0, split_, size_of(layout.type())))),
        second_(make_second(part(place, split_, full_.second, size_of(layout.type())))) {
    runs_ = first_.runs();
    for (owned_run r : second_.runs()) {
      r.state_offset += split_;
      runs_.push_back(r);
    }
  }

  /// The owned ranges, whole (the rank's, as `partitioned_adamw` has them).
  [[nodiscard]] const ranges_type& ranges() const noexcept { return full_.first; }
  /// The owned runs in state order: the first part's, then the second's (the range the split falls in
  /// has a run on each side).
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return runs_; }
  [[nodiscard]] std::size_t state_size() const noexcept { return full_.second; }
  /// The first state index of the second part.
  [[nodiscard]] std::size_t split() const noexcept { return split_; }
  /// Elements of owned range `k` before the second part's piece of it (the first part's share of the
  /// range the split falls in; 0 for a range wholly on either side).
  [[nodiscard]] std::size_t second_offset(std::size_t k) const noexcept {
    const flat_range& mine = second_.ranges()[k].first;
    return mine.empty() ? 0 : mine.begin - full_.first[k].first.begin;
  }
  [[nodiscard]] First& first() noexcept { return first_; }
  [[nodiscard]] const First& first() const noexcept { return first_; }
  [[nodiscard]] Second& second() noexcept { return second_; }
  [[nodiscard]] const Second& second() const noexcept { return second_; }

  /// Loads both parts' master copies from their parameters.
  void load_master() {
    first_.load_master();
    second_.load_master();
  }
  /// Reads state tensor `t` over the rank's state indices [state_offset, + out.size()), from either part.
  /// \throws usage_error for a range outside the state.
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    for_each_part(state_offset, out.size(), "read_state",
                  [&](auto& part, std::size_t at, std::size_t done, std::size_t n) {
                    part.read_state(t, at, out.subspan(done, n));
                  });
  }
  /// Writes state tensor `t` over the rank's state indices, into either part (the device parameters are the
  /// caller's to write). \throws usage_error for a range outside the state.
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    for_each_part(state_offset, in.size(), "write_state",
                  [&](auto& part, std::size_t at, std::size_t done, std::size_t n) {
                    part.write_state(t, at, in.subspan(done, n));
                  });
  }
  /// \throws usage_error naming `who::step_range` unless owned range `k` exists.
  void check_range(std::size_t k) const {
    if (k >= full_.first.size()) {
      throw usage_error(cat(who_, "::step_range: range ", std::to_string(k),
                            " does not exist; this rank owns ranges 0 to ", std::to_string(full_.first.size()),
                            " (exclusive), one per segment"));
    }
  }

  /// Calls `f(part, its state index, done, count)` for the pieces of the `n` elements from rank state
  /// index `first` on, the first part's first. \throws usage_error naming `who::what` for elements
  /// outside the state.
  template <class F> void for_each_part(std::size_t first, std::size_t n, const char* what, F&& f) {
    if (first + n > full_.second || first + n < n) {
      throw usage_error(cat(who_, "::", what, ": state elements [", std::to_string(first), ", ",
                            std::to_string(first + n), ") are outside this rank's ", std::to_string(full_.second)));
    }
    const std::size_t in_first = first < split_ ? std::min(n, split_ - first) : 0;
    if (in_first > 0) {
      f(first_, first, 0, in_first);
    }
    if (in_first < n) {
      f(second_, first + in_first - split_, in_first, n - in_first);
    }
  }

private:
  static std::size_t checked_split(const char* who, const char* parts, std::size_t state, std::size_t second) {
    if (second == 0 || second >= state) {
      throw usage_error(
          cat(who, ": ", std::to_string(second), " of ", std::to_string(state), " state elements ", parts));
    }
    return state - second;
  }
  /// `place` keeping the rank's state elements [begin, end); sharded parameters (`bytes` each) from
  /// state index `begin` on.
  static adamw_placement part(adamw_placement place, std::size_t begin, std::size_t end, std::size_t bytes) {
    place.state_begin = begin;
    place.state_end = end;
    if (place.params_sharded && place.params != nullptr) {
      place.params += begin * bytes;
    }
    return place;
  }

  const char* who_;
  std::pair<ranges_type, std::size_t> full_;
  std::size_t split_;
  First first_;
  Second second_;
  std::vector<owned_run> runs_;
};

/// The state view and the whole step of an optimizer composed over a `state_split`, written once for
/// `partial_adamw` and `host_nvme_adamw` (as `std::ranges::view_interface` writes a view's members from a
/// few of its own). It holds nothing: `Derived` holds the split as `parts_` and the engine's stream as
/// `stream_` (and befriends this class), and steps owned range `k` with `step_range(k, s, base, group_lr,
/// grad_of)`. In both composites the second part is the one in host memory.
template <class Derived> class state_split_view {
public:
  /// The owned ranges, whole (the rank's, as `partitioned_adamw` has them).
  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept {
    return parts().ranges();
  }
  /// The owned runs in state order: the first part's, then the second's (the range the split falls in has
  /// a run on each side).
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return parts().runs(); }
  [[nodiscard]] std::size_t state_size() const noexcept { return parts().state_size(); }
  /// The group hyper-parameters: the second part's (the host part's, whose thread may read them while it
  /// updates beside the caller); the first part takes them at each step, on the calling thread.
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return parts().second().groups(); }
  /// Whether the state keeps an fp32 master (both parts do, or neither: the parameters' dtype decides).
  [[nodiscard]] bool has_master() const noexcept { return parts().first().has_master(); }
  /// The first state index of the second part: state [0, split) is the first part's, [split, state_size())
  /// the second's.
  [[nodiscard]] std::size_t split() const noexcept { return parts().split(); }
  /// The second part, in host memory (an `offloaded_adamw`; its state indices start at `split()`).
  [[nodiscard]] auto& host() noexcept { return parts().second(); }
  [[nodiscard]] const auto& host() const noexcept { return parts().second(); }

  void load_master() { parts().load_master(); }
  /// Reads over the rank's state indices, from either part. \throws usage_error for a range outside the state.
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    parts().read_state(t, state_offset, out);
  }
  /// Writes over the rank's state indices, into either part (the device parameters are the caller's to write).
  /// \throws usage_error for a range outside the state.
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    parts().write_state(t, state_offset, in);
  }

  /// One optimizer step over every owned range, on the engine's stream (`Derived::step_range`, in order).
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    auto& self = static_cast<Derived&>(*this);
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      self.step_range(k, self.stream_, base, group_lr, grad_of);
    }
  }

private:
  [[nodiscard]] auto& parts() noexcept { return static_cast<Derived&>(*this).parts_; }
  [[nodiscard]] const auto& parts() const noexcept { return static_cast<const Derived&>(*this).parts_; }
};

} // namespace zero::detail
