#pragma once
/// \file
/// What the ranks of a `device_group_communicator` group share (zero/comm/device_group_communicator.hpp): each
/// rank's slot (its call in progress and the events its stream records), the host rendezvous every call meets at
/// (bounded by a timeout that names the ranks missing, and failed for all at once when a rank fails), and the
/// mailboxes of send/recv.

#include "zero/backend/cuda_kernels.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

class device_group;

/// A send in flight: the sender's buffer and the point its stream made it ready, and the point the receiver's
/// stream copied it (recorded once the receiver took it: `posted`).
struct p2p_message {
  const void* data = nullptr;
  std::int64_t count = 0;
  dtype type{};
  cudaEvent_t ready = nullptr;
  cudaEvent_t copied = nullptr;
  bool posted = false; // the receiver has recorded `copied` (under the group's lock)
  p2p_message() {
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
  }
  p2p_message(const p2p_message&) = delete;
  p2p_message& operator=(const p2p_message&) = delete;
  ~p2p_message() {
    ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(ready));
    ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(copied));
  }
};

/// One rank's part of the call in progress, and its events (made once, recorded in every call).
struct device_slot {
  op_signature sig{};
  const void* send = nullptr;
  void* recv = nullptr;
  int color = 0, key = 0;             // split
  std::shared_ptr<device_group> made; // split: the group the lowest rank of a color made for it
  cudaEvent_t ready = nullptr;
  cudaEvent_t part = nullptr;
};

/// The state the ranks of one group share: their slots and the host rendezvous.
class device_group {
public:
  device_group(int size, int device, std::string name) : size_(size), device_(device), name_(std::move(name)) {
    if (size < 1 || static_cast<std::size_t>(size) > cuda::max_reduce_ranks) {
      throw usage_error("device_group: " + std::to_string(size) + " ranks; expected 1 to " +
                        std::to_string(cuda::max_reduce_ranks));
    }
    ZERO_CHECK_CUDA(cudaSetDevice(device));
    slots_.resize(static_cast<std::size_t>(size));
    for (auto& s : slots_) {
      for (cudaEvent_t* e : {&s.ready, &s.part}) {
        ZERO_CHECK_CUDA(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
      }
    }
  }
  device_group(const device_group&) = delete;
  device_group& operator=(const device_group&) = delete;
  ~device_group() {
    for (auto& s : slots_) {
      for (cudaEvent_t e : {s.ready, s.part}) {
        ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e));
      }
    }
  }

  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] device_slot& slot(int rank) noexcept { return slots_[static_cast<std::size_t>(rank)]; }

  /// Blocks until every rank has called `meet` as often as this rank has (a counting barrier).
  /// \throws timeout_error naming `what` (the call and the step), the group, the rank and the ranks still
  ///         missing when `timeout` passes first; comm_error once another rank failed (`fail`).
  void meet(int rank, const std::string& what, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    check_failed(rank, what);
    const std::uint64_t round = round_;
    arrived_[rank_index(rank)] = true;
    if (++count_ == size_) {
      count_ = 0;
      arrived_.fill(false);
      ++round_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, timeout, [&] { return round_ != round || failed_; })) {
      std::string missing;
      for (int r = 0; r < size_; ++r) {
        if (!arrived_[rank_index(r)]) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      const std::string why = what + " at rank " + std::to_string(rank) + " of group \"" + name_ + "\": ranks " +
                              missing + " did not arrive within " + std::to_string(timeout.count()) + " ms";
      failed_ = true;
      reason_ = why;
      cv_.notify_all();
      throw timeout_error(why);
    }
    check_failed(rank, what);
  }

  /// Puts a send from rank `from` to rank `to` in their queue (in order; never blocks).
  void post(int from, int to, std::shared_ptr<p2p_message> m) {
    const std::lock_guard lock(m_);
    mail_[{from, to}].push_back(std::move(m));
    cv_.notify_all();
  }
  /// The oldest send from `from` to `to`, once there is one.
  /// \throws timeout_error naming `what` when none comes within `timeout`; comm_error once the group failed.
  std::shared_ptr<p2p_message> take(int from, int to, const std::string& what, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    auto& q = mail_[{from, to}];
    if (!cv_.wait_for(lock, timeout, [&] { return !q.empty() || failed_; })) {
      throw timeout_error(what + ": rank " + std::to_string(from) + " sent nothing within " +
                          std::to_string(timeout.count()) + " ms");
    }
    check_failed(to, what);
    auto m = std::move(q.front());
    q.pop_front();
    return m;
  }
  /// Marks `m` taken: its `copied` event is recorded.
  void mark_posted(p2p_message& m) {
    const std::lock_guard lock(m_);
    m.posted = true;
    cv_.notify_all();
  }
  /// Blocks until the receiver has taken `m`. \throws timeout_error naming `what`; comm_error once the group failed.
  void wait_posted(const p2p_message& m, int rank, const std::string& what, std::chrono::milliseconds timeout) {
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, timeout, [&] { return m.posted || failed_; })) {
      throw timeout_error(what + ": the receiver did not take it within " + std::to_string(timeout.count()) + " ms");
    }
    if (!m.posted) {
      check_failed(rank, what);
    }
  }

  /// Marks the group failed (`reason`): every rank's next or current `meet` throws comm_error.
  void fail(const std::string& reason) {
    const std::lock_guard lock(m_);
    if (!failed_) {
      failed_ = true;
      reason_ = reason;
    }
    cv_.notify_all();
  }

private:
  static std::size_t rank_index(int r) { return static_cast<std::size_t>(r); }
  void check_failed(int rank, const std::string& what) const {
    if (failed_) {
      throw comm_error(what + " at rank " + std::to_string(rank) + " of group \"" + name_ +
                       "\": the group failed before (" + reason_ + ")");
    }
  }

  int size_;
  int device_;
  std::string name_;
  std::vector<device_slot> slots_;
  std::mutex m_;
  std::condition_variable cv_;
  std::uint64_t round_ = 0;
  int count_ = 0;
  std::array<bool, cuda::max_reduce_ranks> arrived_{};
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<p2p_message>>> mail_; // (from, to): sends in order
  bool failed_ = false;
  std::string reason_;
};

/// The reduction of `op` for the kernel.
[[nodiscard]] constexpr cuda::rank_reduce rank_reduce_of(reduce_op op) noexcept {
  return op == reduce_op::max   ? cuda::rank_reduce::max
         : op == reduce_op::avg ? cuda::rank_reduce::avg
                                : cuda::rank_reduce::sum;
}

} // namespace zero::detail
