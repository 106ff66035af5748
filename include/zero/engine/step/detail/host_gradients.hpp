#pragma once
/// \file
/// `detail::host_gradients`: the host copy of a rank's reduced gradient shard that an optimizer
/// stepping on the host reads (`offloaded_adamw`, `nvme_adamw`). It is filled one of two ways:
///
/// - **fetched** (stage 1, whose gradients accumulate in place on the device): the first range of a
///   step posts the device-to-host copies of every owned range, each followed by an event, so later
///   ranges travel while earlier ones update; `wait(k)` returns once range k's copy landed.
/// - **streamed** (stages 2-3): the gradient reducer hands over each bucket's reduced slice as soon
///   as its reduce-scatter completes (`take`), during backward. The slice is copied to the host on a
///   copy stream of its own, straight into the shard in an accumulation's first micro-step and into a
///   host staging buffer otherwise, which the host adds into the shard (the backend's `accumulate`
///   kernel, run by the host's) once it landed. The device then keeps no gradient shard at all: the
///   slice's staging memory is reused after the copy's event. `finish` completes every pending
///   addition; `check` computes what `grad_stats` computes on the device (unscale, inf/NaN, each
///   range's squared norm) on the host's shard, with the same kernels.

#include "zero/backend/transfer.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/gradients/norm_slots.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// What `host_gradients::check` found on this rank: the overflow flag and each slot's squared norm.
struct host_grad_check {
  bool nonfinite = false;
  std::vector<float> squared_norms;
};

/// The host gradient shard and its copies; see the file comment. `Alloc` is the host allocator the
/// shard comes from (the shard counted under `memory_tag::grads`, staging under `memory_tag::buffers`);
/// `HostBackend` runs the host's kernels (accumulate, unscale, norms).
template <class Backend, bool DeviceHostAccessible, class Alloc, class HostBackend> class host_gradients {
  using stream_type = typename Backend::stream_type;
  using event_type = typename Backend::event_type;

public:
  /// \param ranges the owned ranges (flat range, state offset), kept by reference.
  /// \param elements the state elements the ranges cover; \param grad_type the gradients' dtype.
  /// \param host the host's kernels (kept by reference).
  host_gradients(Backend& backend, HostBackend& host, const std::vector<std::pair<flat_range, std::size_t>>& ranges,
                 Alloc alloc, std::size_t elements, dtype grad_type)
      : backend_(backend), host_(host), ranges_(ranges), alloc_(alloc), grad_type_(grad_type),
        grad_size_(size_of(grad_type)), shard_(std::move(alloc), elements * grad_size_, memory_tag::grads),
        posted_(ranges.size(), false), fresh_(ranges.size(), true) {
    // Zeroed: padding elements that no range copies stay zero.
    std::fill_n(shard_.data(), shard_.size(), std::byte{0});
    fetched_.reserve(ranges.size());
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      fetched_.push_back(backend_.make_event());
      largest_ = std::max(largest_, ranges[k].first.size());
    }
  }
  host_gradients(const host_gradients&) = delete;
  host_gradients& operator=(const host_gradients&) = delete;
  /// Waits for copies still in flight into the shard; never throws.
  ~host_gradients() {
    if (copy_) {
      try {
        backend_.synchronize(*copy_);
      } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
      }
    }
  }

  /// Range `k`'s reduced gradients in host memory, after posting the copies (fetched: every range's at k = 0
  /// unless `fetch_all` did, range k's alone when range 0 did not post it; streamed: already posted by `take`)
  /// and waiting for k's. `grad_of(range, state offset)` gives the device gradients (fetched only).
  /// \throws usage_error naming `who` for a range that does not exist.
  template <class GradOf> const std::byte* wait(std::size_t k, const stream_type& s, GradOf& grad_of, const char* who) {
    if (k >= ranges_.size()) {
      throw usage_error(cat(who, "::step_range: range ", std::to_string(k),
                            " does not exist; this rank owns ranges 0 to ", std::to_string(ranges_.size()),
                            " (exclusive), one per segment"));
    }
    if (!streamed()) {
      if (k == 0 && !std::exchange(ahead_, false)) {
        for (std::size_t j = 0; j < ranges_.size(); ++j) {
          fetch(j, s, grad_of);
        }
      } else if (k != 0 && !posted_[k]) {
        fetch(k, s, grad_of);
      }
      posted_[k] = false;
    } else {
      finish();
    }
    backend_.synchronize(std::as_const(fetched_[k]));
    return at(ranges_[k].second);
  }

  /// Fetched: posts every range's copy now, for a reader of the shard before the step's `wait`s (ZenFlow's choice
  /// and window); the next `wait(0)` posts none again.
  template <class GradOf> void fetch_all(const stream_type& s, GradOf& grad_of) {
    for (std::size_t j = 0; j < ranges_.size(); ++j) {
      fetch(j, s, grad_of);
    }
    ahead_ = true;
  }

  /// Streams from now on: the gradient reducer hands each reduced slice to `take`.
  void stream() {
    if (!copy_) {
      copy_.emplace(backend_.make_stream());
      queued_.emplace(backend_.make_event());
    }
  }
  [[nodiscard]] bool streamed() const noexcept { return copy_.has_value(); }

  /// Range `k`'s reduced slice for this micro-step, in device memory at `slice`, final in `main`'s
  /// order: copied to the host after `main`'s work so far. \returns the event after which `slice`'s
  /// memory may be written again.
  const event_type& take(std::size_t k, const std::byte* slice, const stream_type& main) {
    const auto& [range, off] = ranges_[k];
    backend_.record(*queued_, main);
    backend_.wait(*copy_, *queued_);
    std::byte* dst = at(off);
    if (!fresh_[k]) {
      if (free_.empty() && !pending_.empty()) {
        complete_oldest();
      }
      if (free_.empty()) {
        staging_.emplace_back(alloc_, largest_ * grad_size_, memory_tag::buffers);
        free_.push_back(staging_.size() - 1);
      }
      const std::size_t slot = free_.back();
      free_.pop_back();
      pending_.push_back({k, slot});
      dst = staging_[slot].data();
    }
    copy_async<DeviceHostAccessible>(backend_, *copy_, slice, dst, range.size() * grad_size_);
    backend_.record(fetched_[k], *copy_);
    fresh_[k] = false;
    return fetched_[k];
  }

  /// Adds every landed staging copy into the shard (streamed; waits for the copies).
  void finish() {
    while (!pending_.empty()) {
      complete_oldest();
    }
  }
  /// An accumulation begins: the next `take` of each range copies into the shard instead of adding.
  void reset() { std::fill(fresh_.begin(), fresh_.end(), true); }

  /// Unscales the shard by `unscale` when it is not 1 (noting an inf or NaN), and computes the
  /// squared norm of each of `slots` (`grad_stats::slots()`: each range's counted pieces), with the
  /// host's kernels in `grad_stats::check`'s order.
  host_grad_check check(double unscale, const norm_slots& slots) {
    finish();
    host_grad_check r;
    r.squared_norms.assign(slots.size(), 0.0F);
    int flag = 0;
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      const std::size_t ws = host_.template squared_norm_workspace_bytes<G>(largest_);
      workspace_.resize(std::max<std::size_t>(ws, 1));
      typename HostBackend::stream_type hs;
      for (std::size_t k = 0; k < ranges_.size(); ++k) {
        const auto& [range, off] = ranges_[k];
        backend_.synchronize(std::as_const(fetched_[k]));
        G* g = reinterpret_cast<G*>(at(off));
        if (unscale != 1.0) {
          host_.unscale_and_check(g, range.size(), static_cast<float>(unscale), &flag, hs);
        }
        for (std::size_t j = slots.first[k]; j < slots.first[k + 1]; ++j) {
          const auto [at, count] = slots.piece[j];
          if (count != 0) {
            host_.squared_norm(g + at, count, &r.squared_norms[j], workspace_.data(), ws, hs);
          }
        }
      }
    });
    r.nonfinite = flag != 0;
    return r;
  }

  /// Waits until range `k`'s copy of this micro-step has landed in host memory (streamed: posted by
  /// `take`). Safe from another thread than the one taking slices, for a range already taken.
  void wait_landed(std::size_t k) const { backend_.synchronize(fetched_[k]); }

  /// The host gradients from state index `state_offset` on.
  [[nodiscard]] std::byte* at(std::size_t state_offset) noexcept { return filled_ + state_offset * grad_size_; }

  /// Holds the shard twice (the delayed update, `offloaded_adamw::begin_delayed`): `flip` then swaps the two,
  /// so the next micro-steps fill one while the host's update reads the other.
  void hold_twice() {
    if (spare_.size() == 0) {
      spare_ = buffer<std::byte, Alloc>(alloc_, shard_.size(), memory_tag::grads);
      std::fill_n(spare_.data(), spare_.size(), std::byte{0}); // padding, as the shard's
      aside_ = spare_.data();
    }
  }
  /// After every copy into the shard has landed and been added: the shard becomes the spare, which
  /// `spare_at` reads, and the spare the shard the next micro-steps fill (as after `reset`).
  /// \throws usage_error without `hold_twice`.
  void flip() {
    if (spare_.size() == 0) {
      throw usage_error("host_gradients::flip: the shard is held once (hold_twice was not called)");
    }
    finish();
    for (const auto& e : fetched_) {
      backend_.synchronize(e);
    }
    std::swap(filled_, aside_);
    reset();
  }
  /// The gradients `flip` set aside, from state index `state_offset` on.
  [[nodiscard]] const std::byte* spare_at(std::size_t state_offset) const noexcept {
    return aside_ + state_offset * grad_size_;
  }

private:
  struct pending {
    std::size_t range;
    std::size_t slot;
  };

  template <class GradOf> void fetch(std::size_t k, const stream_type& s, GradOf& grad_of) {
    const auto& [range, off] = ranges_[k];
    const auto* grads = static_cast<const std::byte*>(grad_of(range, off));
    copy_async<DeviceHostAccessible>(backend_, s, grads, at(off), range.size() * grad_size_);
    backend_.record(fetched_[k], s);
    posted_[k] = true;
  }

  void complete_oldest() {
    const pending p = pending_.front();
    pending_.pop_front();
    backend_.synchronize(std::as_const(fetched_[p.range]));
    const std::size_t off = ranges_[p.range].second;
    const std::size_t n = ranges_[p.range].first.size();
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      typename HostBackend::stream_type hs;
      host_.accumulate(reinterpret_cast<const G*>(staging_[p.slot].data()), reinterpret_cast<G*>(at(off)), n, hs);
    });
    free_.push_back(p.slot);
  }

  Backend& backend_;
  HostBackend& host_;
  const std::vector<std::pair<flat_range, std::size_t>>& ranges_;
  Alloc alloc_;
  dtype grad_type_;
  std::size_t grad_size_;
  buffer<std::byte, Alloc> shard_;
  buffer<std::byte, Alloc> spare_;    // the delayed update's second shard (`hold_twice`), or empty
  std::byte* filled_ = shard_.data(); // the half the micro-steps fill: shard_, or spare_ after a `flip`
  std::byte* aside_ = nullptr;        // the other half (`spare_at`)
  std::vector<event_type> fetched_;
  std::vector<bool> posted_;
  bool ahead_ = false; // fetch_all posted this step's copies
  std::vector<bool> fresh_;
  std::size_t largest_ = 0;
  // Streamed: the copy stream, the engine's stream at a take, host staging for accumulation.
  std::optional<stream_type> copy_;
  std::optional<event_type> queued_;
  std::vector<buffer<std::byte, Alloc>> staging_;
  std::vector<std::size_t> free_;
  std::deque<pending> pending_;
  std::vector<std::byte> workspace_;
};

} // namespace zero::detail
