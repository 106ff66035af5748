#pragma once
/// \file
/// `detail::host_gradients`: the host copy of a rank's reduced gradient shard that an optimizer
/// stepping on the host reads (`offloaded_adamw`, `nvme_adamw`). The first range of a step posts the
/// device-to-host copies of every owned range, each followed by an event, so later ranges travel
/// while earlier ones update; `wait(k)` returns once range k's copy landed.

#include "zero/backend/transfer.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// The host gradient shard and its per-range copies; see the file comment. `Alloc` is the host
/// allocator the shard comes from (counted under `memory_tag::grads`).
template <class Backend, bool DeviceHostAccessible, class Alloc> class host_gradients {
  using stream_type = typename Backend::stream_type;

public:
  /// \param ranges the owned ranges (flat range, state offset), kept by reference.
  /// \param elements the state elements the ranges cover; \param grad_size bytes per gradient.
  host_gradients(Backend& backend, const std::vector<std::pair<flat_range, std::size_t>>& ranges, Alloc alloc,
                 std::size_t elements, std::size_t grad_size)
      : backend_(backend), ranges_(ranges), grad_size_(grad_size),
        shard_(std::move(alloc), elements * grad_size, memory_tag::grads), posted_(ranges.size(), false) {
    // Zeroed: padding elements that no range copies stay zero.
    std::fill_n(shard_.data(), shard_.size(), std::byte{0});
    fetched_.reserve(ranges.size());
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      fetched_.push_back(backend_.make_event());
    }
  }

  /// Range `k`'s reduced gradients in host memory, after posting the copies (every range's at k = 0,
  /// range k's alone when range 0 did not post it) and waiting for k's. `grad_of(range, state offset)`
  /// gives the device gradients. \throws usage_error naming `who` for a range that does not exist.
  template <class GradOf> const std::byte* wait(std::size_t k, const stream_type& s, GradOf& grad_of, const char* who) {
    if (k >= ranges_.size()) {
      throw usage_error(cat(who, "::step_range: range ", std::to_string(k),
                            " does not exist; this rank owns ranges 0 to ", std::to_string(ranges_.size()),
                            " (exclusive), one per segment"));
    }
    if (k == 0) {
      for (std::size_t j = 0; j < ranges_.size(); ++j) {
        fetch(j, s, grad_of);
      }
    } else if (!posted_[k]) {
      fetch(k, s, grad_of);
    }
    backend_.synchronize(std::as_const(fetched_[k]));
    posted_[k] = false;
    return at(ranges_[k].second);
  }

  /// The host gradients from state index `state_offset` on.
  [[nodiscard]] std::byte* at(std::size_t state_offset) noexcept { return shard_.data() + state_offset * grad_size_; }

private:
  template <class GradOf> void fetch(std::size_t k, const stream_type& s, GradOf& grad_of) {
    const auto& [range, off] = ranges_[k];
    const auto* grads = static_cast<const std::byte*>(grad_of(range, off));
    copy_async<DeviceHostAccessible>(backend_, s, grads, at(off), range.size() * grad_size_);
    backend_.record(fetched_[k], s);
    posted_[k] = true;
  }

  Backend& backend_;
  const std::vector<std::pair<flat_range, std::size_t>>& ranges_;
  std::size_t grad_size_;
  buffer<std::byte, Alloc> shard_;
  std::vector<typename Backend::event_type> fetched_;
  std::vector<bool> posted_;
};

} // namespace zero::detail
