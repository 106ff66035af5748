#pragma once
/// \file
/// `failing_allocator<A>`: a failure-injecting allocator for tests. It passes requests to an inner
/// allocator until a chosen allocation (by count) or a byte budget is reached, then throws
/// `memory_error`, so tests can show that an engine that fails half-way leaks nothing.

#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"

#include <concepts>
#include <cstddef>
#include <limits>
#include <memory>
#include <mutex>
#include <string>

namespace zero {

/// When a `failing_allocator` fails.
struct failure_plan {
  /// Fail the allocation with this 0-based index (and every later one when `sticky`).
  std::size_t fail_at = std::numeric_limits<std::size_t>::max();
  /// Fail any allocation that would take live bytes above this budget.
  std::size_t byte_budget = std::numeric_limits<std::size_t>::max();
  /// Keep failing after the first failure.
  bool sticky = false;
};

/// Injects allocation failures according to a `failure_plan`. Copies share the plan and counters.
template <allocator A> class failing_allocator {
public:
  static constexpr bool host_accessible = A::host_accessible;
  static constexpr bool device_accessible = A::device_accessible;

  /// Fails as `plan` says, over a default-constructed `A`; only when `A` has a default constructor.
  explicit failing_allocator(failure_plan plan) requires std::default_initializable<A> : failing_allocator(plan, A{}) {}
  /// Fails as `plan` says, over `inner`.
  failing_allocator(failure_plan plan, A inner) : state_(std::make_shared<state>(plan, std::move(inner))) {}

  /// Allocates, or throws `memory_error` saying which planned failure fired.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
    {
      std::lock_guard lock(state_->mutex);
      const std::size_t index = state_->attempts++;
      const bool by_index = index == state_->plan.fail_at || (state_->plan.sticky && state_->failed > 0);
      const bool by_budget = state_->live + bytes > state_->plan.byte_budget;
      if (by_index || by_budget) {
        ++state_->failed;
        throw memory_error("failing_allocator: injected failure of allocation #" + std::to_string(index) + " (" +
                           std::to_string(bytes) + " bytes; " + std::to_string(state_->live) + " live, budget " +
                           std::to_string(state_->plan.byte_budget) + ")");
      }
      state_->live += bytes;
    }
    void* p = nullptr;
    try {
      p = state_->inner.allocate(bytes, alignment);
    } catch (...) {
      std::lock_guard lock(state_->mutex);
      state_->live -= bytes;
      throw;
    }
    if (p == nullptr) { // the inner allocator's way of failing: nothing to count
      std::lock_guard lock(state_->mutex);
      state_->live -= bytes;
    }
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    state_->inner.deallocate(p, bytes, alignment);
    std::lock_guard lock(state_->mutex);
    state_->live -= bytes;
  }

  /// Bytes handed out and not yet returned.
  [[nodiscard]] std::size_t live() const {
    std::lock_guard lock(state_->mutex);
    return state_->live;
  }
  /// Number of injected failures so far.
  [[nodiscard]] std::size_t failures() const {
    std::lock_guard lock(state_->mutex);
    return state_->failed;
  }
  /// Number of allocation attempts so far, failed ones included.
  [[nodiscard]] std::size_t attempts() const {
    std::lock_guard lock(state_->mutex);
    return state_->attempts;
  }

  friend bool operator==(const failing_allocator& a, const failing_allocator& b) noexcept {
    return a.state_ == b.state_;
  }

private:
  struct state {
    state(failure_plan p, A a) : plan(p), inner(std::move(a)) {}
    failure_plan plan;
    A inner;
    mutable std::mutex mutex;
    std::size_t attempts = 0;
    std::size_t failed = 0;
    std::size_t live = 0;
  };
  std::shared_ptr<state> state_;
};

} // namespace zero
