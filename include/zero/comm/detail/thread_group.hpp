#pragma once
/// \file
/// The shared state of a `thread_communicator` group: the collectives in flight (every rank's buffers
/// and the work split into chunks the waiting ranks claim), the pending point-to-point transfers, and
/// the reductions in rank order that make results bit-identical. Internal to `thread_communicator`.

#include "zero/comm/communicator.hpp"
#include "zero/core/dtype.hpp"

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero::detail {

/// The collectives of a thread group, for matching and messages; in the order of `op_names`, so that a
/// kind is also the kind of an `op_signature` (zero/comm/communicator.hpp).
enum class thread_op_kind : std::uint8_t {
  all_reduce,
  reduce_scatter,
  all_gather,
  broadcast,
  barrier,
  all_to_all,
  split
};

/// `op_names[k]` of kind `k`.
[[nodiscard]] constexpr std::string_view name_of(thread_op_kind k) noexcept {
  return op_names[static_cast<std::size_t>(k)];
}
static_assert(op_names.size() == static_cast<std::size_t>(thread_op_kind::split) + 1 &&
              name_of(thread_op_kind::all_reduce) == "all_reduce" &&
              name_of(thread_op_kind::broadcast) == "broadcast" && name_of(thread_op_kind::barrier) == "barrier" &&
              name_of(thread_op_kind::split) == "split");

struct thread_group; // below: the state of a group, which a split makes new ones of

/// One collective in flight: every rank's buffers, and the work split into claimable chunks.
struct thread_op {
  thread_op_kind kind{};
  dtype type{};
  std::size_t count = 0;
  reduce_op op{};
  int root = 0;
  std::uint64_t seq = 0;
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<bool> joined;
  std::vector<int> colors, keys;                           // split
  std::vector<std::shared_ptr<thread_group>> split_groups; // split: the new group of each rank
  std::vector<int> split_ranks;                            // split: the new rank of each rank
  std::string split_name;                                  // split: the parent group's name
  int arrived = 0;
  int released = 0;
  std::size_t units = 0;                                          // elements to produce
  std::size_t chunks = 0;                                         // work items
  std::size_t next_chunk = 0;                                     // first unclaimed chunk
  std::size_t done_chunks = 0;                                    // finished chunks
  std::function<void(thread_op&, std::size_t, std::size_t)> work; // produce units [begin, end)

  /// What a rank said it started, in the words every communicator uses (`detail::describe`):
  /// "all_gather(count=1000, fp32)", "broadcast(count=8, u8, root=1)", "barrier".
  [[nodiscard]] std::string describe() const {
    const std::int64_t extra = kind == thread_op_kind::broadcast ? root : static_cast<std::int64_t>(op);
    return detail::describe(op_signature{static_cast<std::int64_t>(kind), static_cast<std::int64_t>(count),
                                         static_cast<std::int64_t>(type), extra});
  }
};

/// A matched or pending point-to-point transfer.
struct thread_p2p {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t send_bytes = 0;
  std::size_t recv_bytes = 0;
  bool has_send = false;
  bool has_recv = false;
  bool claimed = false;
  bool done = false;
  std::string error;
};

/// State shared by the members of one group.
struct thread_group {
  thread_group(std::string n, int s) : name(std::move(n)), size(s) {}
  std::string name;
  int size;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::uint64_t, std::shared_ptr<thread_op>> ops;
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<thread_p2p>>> pending; // (src, dst) -> FIFO
  bool broken = false;
  bool broken_by_timeout = false;
  std::string broken_reason;

  /// Marks the group unusable and wakes every waiter. Call with `mutex` held.
  void break_locked(std::string reason, bool by_timeout) {
    if (!broken) {
      broken = true;
      broken_by_timeout = by_timeout;
      broken_reason = std::move(reason);
    }
    cv.notify_all();
  }
};

/// The type a reduction of `T` accumulates in: float for the half types, `T` otherwise.
template <class T> using accum_t = std::conditional_t<is_half_v<T>, float, T>;

/// Element `i` of the `T` buffer at `p`, widened to `accum_t<T>`.
template <class T> accum_t<T> load_acc(const void* p, std::size_t i) {
  const T v = static_cast<const T*>(p)[i];
  if constexpr (is_half_v<T>) {
    return static_cast<float>(v);
  } else {
    return v;
  }
}

/// `v` rounded (to nearest even, for the half types) back to `T`.
template <class T> T store_acc(accum_t<T> v) {
  if constexpr (is_half_v<T>) {
    return T(v);
  } else {
    return v;
  }
}

/// Reduces element `i` of `n` buffers in rank order.
template <class T> accum_t<T> reduce_element(const std::vector<const void*>& src, std::size_t i, reduce_op op) {
  accum_t<T> acc = load_acc<T>(src[0], i);
  for (std::size_t q = 1; q < src.size(); ++q) {
    const accum_t<T> v = load_acc<T>(src[q], i);
    if (op == reduce_op::max) {
      acc = v > acc ? v : acc;
    } else {
      acc = static_cast<accum_t<T>>(acc + v);
    }
  }
  if (op == reduce_op::avg) {
    acc = static_cast<accum_t<T>>(acc / static_cast<accum_t<T>>(src.size()));
  }
  return acc;
}

/// Elements per chunk of collective work: large enough to amortise locking, small enough that
/// several waiting ranks share a large collective.
inline constexpr std::size_t thread_chunk_units = 1u << 15;

} // namespace zero::detail
