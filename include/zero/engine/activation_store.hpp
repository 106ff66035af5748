#pragma once
/// \file
/// `activation_store<Backend>`: the activations a framework checkpoints, kept in host memory from forward to
/// backward (ZeRO-R's CPU checkpointing; DeepSpeed's `activation_checkpointing.cpu_checkpointing`).
/// docs/activations.md.

#include "zero/backend/backend.hpp"
#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <cstddef>
#include <deque>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// Where each checkpoint starts in the store's host arena and device ring: a multiple of this many bytes.
inline constexpr std::size_t activation_alignment = 256;
/// The bytes a checkpoint of `bytes` bytes takes in the arena and the ring.
[[nodiscard]] constexpr std::size_t activation_footprint(std::size_t bytes) noexcept {
  return (bytes + activation_alignment - 1) / activation_alignment * activation_alignment;
}

/// Sizes of an `activation_store`.
struct activation_store_options {
  /// Host bytes for one forward's checkpoints (each starts on an `activation_alignment` boundary).
  std::size_t host_bytes = 0;
  /// Device bytes of the ring the backward's checkpoints come back into.
  std::size_t device_bytes = 0;
  /// Checkpoints uploaded ahead of the one backward asks for.
  std::size_t lookahead = 1;
};

/// The store's sizes from the config's `activation_checkpointing` block: a host arena for `number_checkpoints`
/// checkpoints of `checkpoint_bytes` each (or `checkpoints`, the framework's count, where the config leaves it
/// null), and a ring of `ring_checkpoints` of them, the ones after the first fetched ahead.
/// \returns nothing without `cpu_checkpointing` (the framework keeps its checkpoints on the device).
/// \throws config_error when `cpu_checkpointing` is on and neither the config nor `checkpoints` gives the count;
/// usage_error for a checkpoint of 0 bytes or a ring of fewer than 1.
[[nodiscard]] inline std::optional<activation_store_options>
activation_store_options_from(const config& c, std::size_t checkpoint_bytes,
                              std::optional<std::size_t> checkpoints = {}, std::size_t ring_checkpoints = 3) {
  const auto& a = c.activation_checkpointing;
  if (!a.cpu_checkpointing) {
    return std::nullopt;
  }
  if (checkpoint_bytes == 0 || ring_checkpoints == 0) {
    throw usage_error(detail::cat("activation_store_options_from: checkpoints of ", std::to_string(checkpoint_bytes),
                                  " bytes, a ring of ", std::to_string(ring_checkpoints), "; expected both above 0"));
  }
  const std::size_t n =
      a.number_checkpoints ? static_cast<std::size_t>(*a.number_checkpoints) : checkpoints.value_or(0);
  if (n == 0) {
    throw config_error("activation_checkpointing.number_checkpoints: null with cpu_checkpointing true and no count "
                       "from the framework; expected the checkpoints of one forward (e.g. the number of layers), "
                       "which size the host memory");
  }
  const std::size_t each = activation_footprint(checkpoint_bytes);
  return activation_store_options{
      .host_bytes = n * each, .device_bytes = ring_checkpoints * each, .lookahead = ring_checkpoints - 1};
}

/// Forward: `save(src, bytes)` copies a checkpoint down to a host arena on the store's own stream, after the
/// work the compute stream has enqueued so far; `wait_saved(id, s)` orders a stream after that copy, so the
/// framework may reuse the device memory from there on. Backward asks for the checkpoints back in the reverse
/// order: `fetch(id)` returns them in a device ring, uploaded on a second stream of the store's and ordered
/// before the compute stream's next work; each fetch starts the uploads of the next `lookahead` checkpoints
/// (ids below it) while backward computes. `release(id)` hands a checkpoint's ring space back once the work
/// that reads it is enqueued; `clear()` ends the pass. Nothing on the host waits: every order is an event
/// between the three streams. Both memories are allocated once, at their size, through counting allocators.
/// `Backend` copies between its device memory (`DeviceAlloc`) and its host memory (`HostAlloc`, pinned for CUDA:
/// `offload_allocator_t`).
template <backend Backend, allocator DeviceAlloc = typename Backend::allocator_type,
          allocator HostAlloc = offload_allocator_t<Backend>>
requires can_copy<Backend>
class activation_store {
public:
  using stream_type = typename Backend::stream_type;
  using event_type = typename Backend::event_type;

  /// The store over `compute`, the stream the framework's forward and backward run on (kept by reference).
  /// \throws usage_error for a size of 0; memory_error when either memory cannot be had.
  activation_store(Backend& b, const stream_type& compute, activation_store_options o, DeviceAlloc device = {},
                   HostAlloc host = {})
      : b_(b), compute_(compute), opt_(o), device_alloc_(std::move(device)), host_alloc_(std::move(host)),
        down_(b.make_stream()), up_(b.make_stream()), written_(b.make_event()), freed_(b.make_event()),
        cleared_up_(b.make_event()), cleared_compute_(b.make_event()) {
    if (o.host_bytes == 0 || o.device_bytes == 0) {
      throw usage_error(detail::cat("activation_store: host_bytes ", std::to_string(o.host_bytes), ", device_bytes ",
                                    std::to_string(o.device_bytes), "; expected both above 0"));
    }
    host_ = buffer<std::byte, counting_allocator<HostAlloc>>(host_alloc_, o.host_bytes, memory_tag::other);
    ring_ = buffer<std::byte, counting_allocator<DeviceAlloc>>(device_alloc_, o.device_bytes, memory_tag::other);
  }

  /// Copies `bytes` at device address `src` down to host memory after the compute stream's work so far.
  /// \returns the checkpoint's id: 0, 1, ... in save order within the pass.
  /// \throws memory_error naming the bytes this pass needs when the host arena cannot take it (the
  /// checkpoints saved so far stay).
  std::size_t save(const void* src, std::size_t bytes) {
    if (bytes == 0) {
      throw usage_error("activation_store::save: a checkpoint of 0 bytes; expected at least one");
    }
    const std::size_t at = activation_footprint(host_used_);
    if (at + bytes > opt_.host_bytes) {
      throw memory_error(detail::cat("activation_store::save: checkpoint ", std::to_string(count_), " of ",
                                     std::to_string(bytes), " bytes needs ", std::to_string(at + bytes),
                                     " host bytes in this pass, host_bytes is ", std::to_string(opt_.host_bytes),
                                     "; expected a larger host_bytes (activation_checkpointing.number_checkpoints)"));
    }
    if (cleared_) { // the next pass's first save: the last pass's uploads have read the arena
      b_.wait(down_, cleared_up_);
      cleared_ = false;
    }
    if (count_ == slots_.size()) { // a checkpoint's events are made once and serve every pass
      slots_.push_back({.saved = b_.make_event(), .loaded = b_.make_event()});
    }
    checkpoint& c = slots_[count_];
    c.host = at;
    c.bytes = bytes;
    b_.record(written_, compute_); // the compute stream has written src
    b_.wait(down_, written_);
    b_.copy(src, host_.data() + at, bytes, down_);
    b_.record(c.saved, down_);
    host_used_ = at + bytes;
    return count_++;
  }

  /// Orders `s` after checkpoint `id`'s copy down: the framework's device memory it came from may be reused
  /// by work enqueued on `s` from here on. \throws usage_error for an unknown id.
  void wait_saved(std::size_t id, const stream_type& s) { b_.wait(s, at(id, "wait_saved").saved); }

  /// Checkpoint `id` in device memory, ready for the work the compute stream enqueues next, and the uploads
  /// of the `lookahead` checkpoints below it started. The memory holds it until `release(id)`.
  /// \throws usage_error for an unknown or released id; memory_error when the ring cannot take it beside the
  /// checkpoints not released yet (it names them).
  [[nodiscard]] const void* fetch(std::size_t id) {
    checkpoint& c = at(id, "fetch");
    if (c.done) {
      throw usage_error(detail::cat("activation_store::fetch: checkpoint ", std::to_string(id),
                                    " was released in this pass; fetch each checkpoint once, before its release"));
    }
    if (!c.device && !upload(id)) {
      std::string held;
      for (const auto& r : ring_slots_) {
        held += detail::cat(held.empty() ? "" : ", ", std::to_string(r.id));
      }
      throw memory_error(detail::cat("activation_store::fetch: checkpoint ", std::to_string(id), " of ",
                                     std::to_string(c.bytes), " bytes does not fit in the device ring of ",
                                     std::to_string(opt_.device_bytes), " bytes beside checkpoints ", held,
                                     ", not released yet; release(id) each checkpoint once the work that reads it "
                                     "is enqueued, or expected a larger device_bytes"));
    }
    b_.wait(compute_, c.loaded);
    for (std::size_t k = 1; k <= opt_.lookahead && k <= id; ++k) {
      if (!slots_[id - k].device && !slots_[id - k].done && !upload(id - k)) {
        break; // the ring is full: the rest is fetched when asked for
      }
    }
    return ring_.data() + *c.device;
  }

  /// Hands checkpoint `id`'s ring space back after the work the compute stream has enqueued so far (which
  /// reads it). \throws usage_error for an unknown id or one not fetched.
  void release(std::size_t id) {
    checkpoint& c = at(id, "release");
    if (c.done || !c.device) {
      throw usage_error(detail::cat("activation_store::release: checkpoint ", std::to_string(id),
                                    c.done ? " was released already in this pass" : " is not in device memory",
                                    "; expected one fetch(", std::to_string(id), ") before one release"));
    }
    c.done = true;
    // The ring frees from its oldest slot: released ones leave in the order they were uploaded, their space
    // reused by uploads ordered after the work enqueued so far.
    if (ring_slots_.empty() || !slots_[ring_slots_.front().id].done) {
      return;
    }
    while (!ring_slots_.empty() && slots_[ring_slots_.front().id].done) {
      slots_[ring_slots_.front().id].device.reset();
      ring_slots_.pop_front();
    }
    b_.record(freed_, compute_);
    freed_pending_ = true;
  }

  /// Ends the pass: every checkpoint is dropped, both memories free for the next forward once the work
  /// enqueued so far has read them.
  void clear() {
    b_.record(cleared_up_, up_);
    b_.record(cleared_compute_, compute_);
    cleared_ = true;
    cleared_ring_ = true;
    for (std::size_t k = 0; k < count_; ++k) {
      slots_[k].device.reset();
      slots_[k].done = false;
    }
    count_ = 0;
    ring_slots_.clear();
    host_used_ = 0;
  }

  /// Checkpoints saved in this pass, and the host bytes they take (alignment included).
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t host_used() const noexcept { return host_used_; }
  /// What the store holds of each memory (counting_allocator's view: the arena and the ring).
  [[nodiscard]] const counting_allocator<HostAlloc>& host_memory() const noexcept { return host_alloc_; }
  [[nodiscard]] const counting_allocator<DeviceAlloc>& device_memory() const noexcept { return device_alloc_; }

private:
  struct checkpoint {
    std::size_t host = 0;
    std::size_t bytes = 0;
    std::optional<std::size_t> device{}; // its offset in the ring while it is there
    bool done = false;                   // released in this pass
    event_type saved, loaded;
  };
  struct ring_slot {
    std::size_t id, offset, bytes;
  };

  checkpoint& at(std::size_t id, const char* what) {
    if (id >= count_) {
      throw usage_error(detail::cat("activation_store::", what, ": checkpoint ", std::to_string(id), "; this pass has ",
                                    std::to_string(count_), " (ids 0 to size() - 1)"));
    }
    return slots_[id];
  }

  /// Where `bytes` fit in the ring after its newest slot (wrapping to 0), or nothing.
  [[nodiscard]] std::optional<std::size_t> place(std::size_t bytes) const {
    const std::size_t cap = opt_.device_bytes;
    if (ring_slots_.empty()) {
      return bytes <= cap ? std::optional<std::size_t>(0) : std::nullopt;
    }
    const std::size_t head = activation_footprint(ring_slots_.back().offset + ring_slots_.back().bytes);
    const std::size_t tail = ring_slots_.front().offset;
    if (head > tail) { // free: [head, cap) and [0, tail)
      if (head + bytes <= cap) {
        return head;
      }
      return bytes <= tail ? std::optional<std::size_t>(0) : std::nullopt;
    }
    return head + bytes <= tail ? std::optional<std::size_t>(head) : std::nullopt; // wrapped (or full): [head, tail)
  }

  /// Starts checkpoint `id`'s upload into the ring; false when it does not fit now.
  bool upload(std::size_t id) {
    checkpoint& c = slots_[id];
    const auto offset = place(c.bytes);
    if (!offset) {
      return false;
    }
    if (cleared_ring_) { // the last pass's backward has read the ring
      b_.wait(up_, cleared_compute_);
      cleared_ring_ = false;
    }
    if (freed_pending_) { // the space may be a released checkpoint's: after the work that read it
      b_.wait(up_, freed_);
      freed_pending_ = false;
    }
    b_.wait(up_, c.saved);
    b_.copy(host_.data() + c.host, ring_.data() + *offset, c.bytes, up_);
    b_.record(c.loaded, up_);
    c.device = *offset;
    ring_slots_.push_back({id, *offset, c.bytes});
    return true;
  }

  Backend& b_;
  const stream_type& compute_;
  activation_store_options opt_;
  counting_allocator<DeviceAlloc> device_alloc_;
  counting_allocator<HostAlloc> host_alloc_;
  buffer<std::byte, counting_allocator<HostAlloc>> host_;
  buffer<std::byte, counting_allocator<DeviceAlloc>> ring_;
  stream_type down_, up_;
  event_type written_, freed_, cleared_up_, cleared_compute_;
  std::vector<checkpoint> slots_; // kept from pass to pass: the first count_ are this pass's
  std::size_t count_ = 0;
  std::deque<ring_slot> ring_slots_;
  std::size_t host_used_ = 0;
  bool freed_pending_ = false, cleared_ = false, cleared_ring_ = false;
};

} // namespace zero
