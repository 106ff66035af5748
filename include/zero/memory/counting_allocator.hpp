#pragma once
/// \file
/// `counting_allocator<A>`: wraps any allocator and reports live and peak bytes per memory tag.
/// It is how zero's memory claims are tested: the peak of model-state bytes per rank against
/// the ZeRO paper's formula.

#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

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

  /// Wraps a default-constructed `A`; only when `A` has a default constructor.
  counting_allocator() requires std::default_initializable<A> : counting_allocator(A{}) {}
  /// Wraps `inner`; counters start at zero.
  explicit counting_allocator(A inner) : state_(std::make_shared<state>(std::move(inner))) {}

  /// Allocates through the inner allocator and counts the bytes under `memory_tag::other`.
  /// \throws as the tagged overload.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
    return allocate(bytes, alignment, memory_tag::other);
  }
  /// Allocates through the inner allocator and counts the bytes under `tag`.
  /// \throws memory_error when the inner allocator fails (throws `memory_error` or `std::bad_alloc`, or
  ///         returns null): "could not allocate <bytes> bytes of <tag> (alignment <n>); live: <tag> <bytes>,
  ///         ..., <bytes> bytes in all; <the inner allocator's message>", the live bytes being this
  ///         counter's (shared by its copies) before the request; the inner `memory_error`'s status is kept.
  ///         What else the inner allocator throws (`usage_error` for a bad alignment) passes unchanged.
  ///         Nothing is counted and nothing is kept when it throws.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment, memory_tag tag) {
    void* p = detail::allocate_or_explain(
        bytes, alignment, tag, [&] { return state_->inner.allocate(bytes, alignment); },
        [&] { return "; live: " + describe_live(); });
    try {
      std::lock_guard lock(state_->mutex);
      add(state_->tags[static_cast<std::size_t>(tag)], bytes);
      add(state_->total, bytes);
    } catch (...) { // the mutex could not be locked: give the memory back rather than lose it
      state_->inner.deallocate(p, bytes, alignment);
      throw;
    }
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
  /// "params 400, grads 200, 600 bytes in all": the live bytes of each tag that has some, and the total.
  [[nodiscard]] std::string describe_live() const {
    std::lock_guard lock(state_->mutex);
    std::string out;
    for (std::size_t t = 0; t < memory_tag_count; ++t) {
      if (state_->tags[t].live != 0) {
        out += std::string(name_of(static_cast<memory_tag>(t))) + " " + std::to_string(state_->tags[t].live) + ", ";
      }
    }
    return out + std::to_string(state_->total.live) + " bytes in all";
  }
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
