#pragma once
/// \file
/// `partial_adamw`: DeepSpeed's partial optimizer offload (`zero_optimization.offload_optimizer.ratio`
/// below 1 with device cpu). A rank's optimizer state elements (its owned ranges, in state order) are
/// split at one element: the first part keeps its state on the backend and is stepped there (a
/// `partitioned_adamw`), the rest, the `ratio` share, keeps its state in host memory and is stepped
/// on the host (an `offloaded_adamw`). The host takes the last elements: the last segments of the
/// layout, whose gradients backward reduces first. The range the split falls in is stepped by both,
/// each over its part.
///
/// Per owned range k, on the engine's update stream `s`:
///
///     device  AdamW over range k's device part, writing its parameters in place     (on s)
///     host    range k's host part as offloaded_adamw steps it: gradients down, AdamW, parameters up
///             (the copies on a stream of its own, so they do not wait for the device's kernels)
///     s waits for the host part's upload, so what the residency posts after range k follows it
///
/// The host's gradient copies are posted at range 0, before the device kernels run, and the device's
/// kernels are enqueued before the host steps, so the device's part runs while the host updates.
/// Both parts read the same reduced gradients and run the kernels of the in-memory step with its
/// arguments and element order: on the CPU backend the result is the same bits as without offload.
/// State indices are the rank's (0 to `state_size()`): `read_state` and `write_state` reach either
/// part, so checkpoints save and load across ratios, stages and world sizes.
///
/// With `offload_options::forward_overlap` (stages 2-3, docs/offload.md "Beside the next forward") the
/// engine streams the host part's gradients into `host().grads()` during backward (at `host_offset(k)`
/// in range k's slice) and calls `host().begin_async` before the step's ranges: the host part's
/// `step_range` then only posts, on the side stream, the wait for each range's word and its upload,
/// and the device part's kernels run at once. `groups()` is the host part's (its thread reads them);
/// the device part copies them at each step.

#include "zero/backend/backend.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// State elements the split between host and device is rounded to: 64 fp32 values (256 bytes), so
/// the two parts never share a cache line of state, gradients or parameters.
inline constexpr std::size_t partial_offload_granule = 64;

/// The elements of a rank's `state_elements` that `ratio` (the share offloaded, in [0, 1]) puts in
/// host memory: ratio x state_elements rounded to the nearest multiple of `partial_offload_granule`
/// or to all of them, whichever is nearer (ratio 1 is all, ratio 0 none).
[[nodiscard]] inline std::size_t offloaded_state_elements(double ratio, std::size_t state_elements) {
  const double all = static_cast<double>(state_elements);
  const double exact = std::clamp(ratio, 0.0, 1.0) * all;
  const auto granule = static_cast<double>(partial_offload_granule);
  const double rounded = std::min(all, std::round(exact / granule) * granule);
  return all - exact < std::abs(exact - rounded) ? state_elements : static_cast<std::size_t>(rounded);
}

/// AdamW over a rank's part of the flat buffer, its first state elements on the backend and the rest
/// in host memory; see the file comment. The interface is `partitioned_adamw`'s.
template <backend Backend, allocator DeviceAlloc, allocator HostAlloc = offload_allocator_t<Backend>>
class partial_adamw {
  using stream_type = typename Backend::stream_type;
  using ranges_type = std::vector<std::pair<flat_range, std::size_t>>;

public:
  using on_device = partitioned_adamw<Backend, DeviceAlloc>;
  using on_host = offloaded_adamw<Backend, DeviceAlloc, HostAlloc>;

  /// \param layout, place, group_of, groups as `partitioned_adamw`'s (the placement keeps everything).
  /// \param host_elements the rank's state elements updated on the host (its last ones; see
  ///               `offloaded_state_elements`).
  /// \param device memory for the device part's master, m and v (`memory_tag::optimizer`).
  /// \param host   host memory for the host part's state and staging shards.
  /// \param stream the engine's stream (kept by reference).
  /// \throws usage_error unless 0 < host_elements < the rank's state elements (otherwise one optimizer
  ///         alone does it: `offloaded_adamw` or `partitioned_adamw`).
  partial_adamw(const flat_layout& layout, const adamw_placement& place, const std::vector<std::size_t>& group_of,
                const std::vector<param_group>& groups, Backend& backend, counting_allocator<DeviceAlloc> device,
                HostAlloc host, stream_type& stream, std::size_t host_elements, offload_options opt = {})
      : backend_(backend), stream_(stream), full_(owned_ranges(layout, place)),
        split_(checked_split(full_.second, host_elements)),
        device_(layout, part(place, 0, split_, 0), group_of, groups, backend, std::move(device), stream),
        host_(layout, part(place, split_, full_.second, size_of(layout.type())), group_of, groups, backend,
              std::move(host), stream, opt),
        side_(backend.make_stream()), ready_(backend.make_event()), landed_(backend.make_event()) {
    runs_ = device_.runs();
    for (owned_run r : host_.runs()) {
      r.state_offset += split_;
      runs_.push_back(r);
    }
  }

  partial_adamw(const partial_adamw&) = delete;
  partial_adamw& operator=(const partial_adamw&) = delete;
  /// Waits for the host part's copies still in flight; never throws.
  ~partial_adamw() {
    try {
      backend_.synchronize(side_);
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  /// The owned ranges, whole (the rank's, as `partitioned_adamw` has them).
  [[nodiscard]] const ranges_type& ranges() const noexcept { return full_.first; }
  /// The owned runs in state order: the device part's, then the host part's (the range the split falls
  /// in has a run on each side).
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return runs_; }
  [[nodiscard]] std::size_t state_size() const noexcept { return full_.second; }
  /// The group hyper-parameters (the host part's, which its thread reads while it updates beside the
  /// caller; the device part takes them at each step, on the calling thread).
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return host_.groups(); }
  [[nodiscard]] bool has_master() const noexcept { return device_.has_master(); }
  /// The first state index on the host: state [0, split) is on the device, [split, state_size()) on the host.
  [[nodiscard]] std::size_t split() const noexcept { return split_; }
  /// Elements of owned range `k` before the host part's piece of it (the device part's share of the
  /// range the split falls in; 0 for a range wholly on either side).
  [[nodiscard]] std::size_t host_offset(std::size_t k) const noexcept {
    const flat_range& mine = host_.ranges()[k].first;
    return mine.empty() ? 0 : mine.begin - full_.first[k].first.begin;
  }
  /// Per owned range (segment), the elements the device part steps: its first ones.
  [[nodiscard]] std::vector<std::size_t> device_elements() const {
    std::vector<std::size_t> out;
    for (const auto& [range, off] : device_.ranges()) {
      out.push_back(range.size());
    }
    return out;
  }
  /// The two parts (their state indices start at 0 and at `split()`).
  [[nodiscard]] on_device& device() noexcept { return device_; }
  [[nodiscard]] const on_device& device() const noexcept { return device_; }
  [[nodiscard]] on_host& host() noexcept { return host_; }
  [[nodiscard]] const on_host& host() const noexcept { return host_; }

  void load_master() {
    device_.load_master();
    host_.load_master();
  }
  /// As `partitioned_adamw::read_state`, over the rank's state indices, from either part.
  /// \throws usage_error for a range outside the state.
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    for_each_part(state_offset, out.size(), "read_state",
                  [&](auto& part, std::size_t at, std::size_t done, std::size_t n) {
                    part.read_state(t, at, out.subspan(done, n));
                  });
  }
  /// As `partitioned_adamw::write_state` (the host part's device parameters are the caller's to write,
  /// as for `offloaded_adamw`). \throws usage_error for a range outside the state.
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    for_each_part(state_offset, in.size(), "write_state",
                  [&](auto& part, std::size_t at, std::size_t done, std::size_t n) {
                    part.write_state(t, at, in.subspan(done, n));
                  });
  }

  /// One optimizer step over every owned range, on the engine's stream.
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    for (std::size_t k = 0; k < full_.first.size(); ++k) {
      step_range(k, stream_, base, group_lr, grad_of);
    }
  }

  /// The step of owned range `k` on `s` (see the file comment); ranges are stepped in order.
  /// \throws usage_error for a range that does not exist.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    const std::size_t n = full_.first.size();
    if (k >= n) {
      throw usage_error(detail::cat("partial_adamw::step_range: range ", std::to_string(k),
                                    " does not exist; this rank owns ranges 0 to ", std::to_string(n),
                                    " (exclusive), one per segment"));
    }
    if (k == 0 || !joined_) {
      // A new step: the host part's copies start after what `s` did so far (the gradients are final).
      device_.groups() = host_.groups();
      backend_.record(ready_, s);
      backend_.wait(side_, ready_);
      joined_ = true;
    }
    device_.step_range(k, s, base, group_lr, grad_of);
    host_.step_range(k, side_, base, group_lr,
                     [&](const flat_range& r, std::size_t off) { return grad_of(r, off + split_); });
    if (!host_.ranges()[k].first.empty() || k + 1 == n) {
      // What follows range k on `s` (its all-gather, and after the last range the gradients' zeroing)
      // comes after the host part's copies of it.
      backend_.record(landed_, side_);
      backend_.wait(s, landed_);
    }
    joined_ = k + 1 != n;
  }

private:
  static std::size_t checked_split(std::size_t state, std::size_t host_elements) {
    if (host_elements == 0 || host_elements >= state) {
      throw usage_error(detail::cat("partial_adamw: ", std::to_string(host_elements), " of ", std::to_string(state),
                                    " state elements on the host; expected more than 0 and fewer than all (use "
                                    "partitioned_adamw or offloaded_adamw for none or all)"));
    }
    return state - host_elements;
  }
  /// `place` keeping the rank's state elements [begin, end); sharded parameters (`bytes` each) from
  /// state index `begin` on.
  static adamw_placement part(adamw_placement place, std::size_t begin, std::size_t end, std::size_t bytes) {
    place.state_begin = begin;
    place.state_end = end;
    if (place.params_sharded) {
      place.params += begin * bytes;
    }
    return place;
  }
  /// Calls `f(part, its state index, done, count)` for the pieces of `n` elements from rank state index
  /// `first` on, the device part's first.
  template <class F> void for_each_part(std::size_t first, std::size_t n, const char* what, F&& f) {
    if (first + n > full_.second || first + n < n) {
      throw usage_error(detail::cat("partial_adamw::", what, ": state elements [", std::to_string(first), ", ",
                                    std::to_string(first + n), ") are outside this rank's ",
                                    std::to_string(full_.second)));
    }
    const std::size_t on_device = first < split_ ? std::min(n, split_ - first) : 0;
    if (on_device > 0) {
      f(device_, first, 0, on_device);
    }
    if (on_device < n) {
      f(host_, first + on_device - split_, on_device, n - on_device);
    }
  }

  Backend& backend_;
  stream_type& stream_;
  std::pair<ranges_type, std::size_t> full_;
  std::size_t split_;
  on_device device_;
  on_host host_;
  std::vector<owned_run> runs_;
  /// The host part's copies; `ready_` (on `s`) starts them, `landed_` (on `side_`) ends a range's.
  stream_type side_;
  typename Backend::event_type ready_;
  typename Backend::event_type landed_;
  bool joined_ = false;
};

} // namespace zero
