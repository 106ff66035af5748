#pragma once
/// \file
/// `counting_allocator<A>`: wraps any allocator and reports live and peak bytes per memory tag.
/// It is how zero's memory claims are tested: the peak of model-state bytes per rank against
/// the ZeRO paper's formula.

#include "zero/memory/allocator.hpp"

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>

namespace zero {

/// Live and peak bytes of one tag, and of all tags together.
struct memory_counts {
  std::size_t live = 0;
  std::size_t peak = 0;
  std::size_t allocations = 0;
};

/// Counts what passes through an inner allocator `A`. Copies share the counters, so an engine,
/// its buffers and a test can all look at one tally. Thread-safe.
template <allocator A> class counting_allocator {
public:
  static constexpr bool host_accessible = A::host_accessible;
  static constexpr bool device_accessible = A::device_accessible;

  /// Wraps `inner`; counters start at zero.
  explicit counting_allocator(A inner = A{}) : state_(std::make_shared<state>(std::move(inner))) {}

  /// Allocates through the inner allocator and counts the bytes under `memory_tag::other`.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
    return allocate(bytes, alignment, memory_tag::other);
  }
  /// Allocates through the inner allocator and counts the bytes under `tag`.
  /// \throws whatever the inner allocator throws; nothing is counted then.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment, memory_tag tag) {
    void* p = state_->inner.allocate(bytes, alignment);
    std::lock_guard lock(state_->mutex);
    add(state_->tags[static_cast<std::size_t>(tag)], bytes);
    add(state_->total, bytes);
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    deallocate(p, bytes, alignment, memory_tag::other);
  }
  /// Returns memory and un-counts it under `tag` (the tag it was allocated with).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment, memory_tag tag) noexcept {
    state_->inner.deallocate(p, bytes, alignment);
    std::lock_guard lock(state_->mutex);
    state_->tags[static_cast<std::size_t>(tag)].live -= bytes;
    state_->total.live -= bytes;
  }

  /// Counts of one tag.
  [[nodiscard]] memory_counts counts(memory_tag tag) const {
    std::lock_guard lock(state_->mutex);
    return state_->tags[static_cast<std::size_t>(tag)];
  }
  /// Counts over all tags; `peak` is the peak of the sum, not the sum of the peaks.
  [[nodiscard]] memory_counts total() const {
    std::lock_guard lock(state_->mutex);
    return state_->total;
  }
  /// Live bytes of `tag`.
  [[nodiscard]] std::size_t live(memory_tag tag) const { return counts(tag).live; }
  /// Peak bytes of `tag`.
  [[nodiscard]] std::size_t peak(memory_tag tag) const { return counts(tag).peak; }
  /// Sets every peak back to the current live bytes (to measure one phase).
  void reset_peaks() {
    std::lock_guard lock(state_->mutex);
    for (auto& c : state_->tags) {
      c.peak = c.live;
    }
    state_->total.peak = state_->total.live;
  }
  /// The wrapped allocator.
  [[nodiscard]] A& inner() noexcept { return state_->inner; }

  friend bool operator==(const counting_allocator& a, const counting_allocator& b) noexcept {
    return a.state_ == b.state_;
  }

private:
  struct state {
    explicit state(A a) : inner(std::move(a)) {}
    A inner;
    mutable std::mutex mutex;
    std::array<memory_counts, memory_tag_count> tags{};
    memory_counts total{};
  };
  static void add(memory_counts& c, std::size_t bytes) {
    c.live += bytes;
    c.allocations += 1;
    if (c.live > c.peak) {
      c.peak = c.live;
    }
  }
  std::shared_ptr<state> state_;
};

} // namespace zero
