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
#include "zero/engine/step/detail/state_split.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
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
/// in host memory; see the file comment. The interface is `partitioned_adamw`'s; the state view and
/// `step` are `detail::state_split_view`'s, the device part the first and the host part the second:
/// state [0, split()) is on the device, [split(), state_size()) on the host.
template <backend Backend, allocator DeviceAlloc, allocator HostAlloc = offload_allocator_t<Backend>>
class partial_adamw : public detail::state_split_view<partial_adamw<Backend, DeviceAlloc, HostAlloc>> {
  using stream_type = typename Backend::stream_type;
  using view = detail::state_split_view<partial_adamw>;
  friend view;

public:
  using view::host;
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
      : backend_(backend), stream_(stream),
        parts_(
            "partial_adamw",
            "on the host; expected more than 0 and fewer than all (use partitioned_adamw or offloaded_adamw for none "
            "or all)",
            layout, place, host_elements,
            [&](const adamw_placement& mine) {
              return on_device(layout, mine, group_of, groups, backend, std::move(device), stream);
            },
            [&](const adamw_placement& mine) {
              return on_host(layout, mine, group_of, groups, backend, std::move(host), stream, opt);
            }),
        side_(backend.make_stream()), ready_(backend.make_event()), landed_(backend.make_event()) {}

  partial_adamw(const partial_adamw&) = delete;
  partial_adamw& operator=(const partial_adamw&) = delete;
  /// Waits for the host part's copies still in flight; never throws.
  ~partial_adamw() {
    try {
      backend_.synchronize(side_);
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  /// Elements of owned range `k` before the host part's piece of it (the device part's share of the
  /// range the split falls in; 0 for a range wholly on either side).
  [[nodiscard]] std::size_t host_offset(std::size_t k) const noexcept { return parts_.second_offset(k); }
  /// Per owned range (segment), the elements the device part steps: its first ones.
  [[nodiscard]] std::vector<std::size_t> device_elements() const {
    std::vector<std::size_t> out;
    for (const auto& [range, off] : device().ranges()) {
      out.push_back(range.size());
    }
    return out;
  }
  /// The first part (its state indices start at 0); the second is `host()`.
  [[nodiscard]] on_device& device() noexcept { return parts_.first(); }
  [[nodiscard]] const on_device& device() const noexcept { return parts_.first(); }

  /// The step of owned range `k` on `s` (see the file comment); ranges are stepped in order.
  /// \throws usage_error for a range that does not exist.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    const std::size_t n = parts_.ranges().size();
    parts_.check_range(k);
    if (k == 0 || !joined_) {
      // A new step: the host part's copies start after what `s` did so far (the gradients are final).
      device().groups() = host().groups();
      backend_.record(ready_, s);
      backend_.wait(side_, ready_);
      joined_ = true;
    }
    device().step_range(k, s, base, group_lr, grad_of);
    host().step_range(k, side_, base, group_lr,
                      [&](const flat_range& r, std::size_t off) { return grad_of(r, off + parts_.split()); });
    if (!host().ranges()[k].first.empty() || k + 1 == n) {
      // What follows range k on `s` (its all-gather, and after the last range the gradients' zeroing)
      // comes after the host part's copies of it.
      backend_.record(landed_, side_);
      backend_.wait(s, landed_);
    }
    joined_ = k + 1 != n;
  }

private:
  Backend& backend_;
  stream_type& stream_;
  detail::state_split<on_device, on_host> parts_;
  /// The host part's copies; `ready_` (on `s`) starts them, `landed_` (on `side_`) ends a range's.
  stream_type side_;
  typename Backend::event_type ready_;
  typename Backend::event_type landed_;
  bool joined_ = false;
};

} // namespace zero
