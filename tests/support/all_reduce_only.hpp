#pragma once
// A communicator a framework might bring for data parallelism alone: it can only all-reduce (over
// an in-process thread_communicator). ZeRO stage 0 runs on it; stages 1-3 are refused with the
// sentence naming the operation they need.

#include "zero/comm/communicator.hpp"
#include "zero/comm/thread_communicator.hpp"

#include <chrono>
#include <cstddef>
#include <string_view>

namespace zero::testing {

class all_reduce_only {
public:
  explicit all_reduce_only(thread_communicator& c) : c_(&c) {}
  [[nodiscard]] int rank() const { return c_->rank(); }
  [[nodiscard]] int size() const { return c_->size(); }
  [[nodiscard]] std::string_view name() const { return "all_reduce_only"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const { return c_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) { c_->set_timeout(t); }
  template <class T> [[nodiscard]] auto all_reduce(const T* send, T* recv, std::size_t n, reduce_op op) {
    return c_->all_reduce(send, recv, n, op);
  }

private:
  thread_communicator* c_;
};

static_assert(can_all_reduce<all_reduce_only>);
static_assert(!can_all_gather<all_reduce_only> && !can_reduce_scatter<all_reduce_only> &&
              !can_broadcast<all_reduce_only>);

} // namespace zero::testing
