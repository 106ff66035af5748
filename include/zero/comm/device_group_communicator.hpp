#pragma once
/// \file
/// `device_group_communicator`: ranks that are threads of one process sharing one CUDA device, each with a
/// stream of its own, so that the engine's multi-rank GPU paths run where one GPU is lent (NCCL refuses two
/// ranks on one device). Every operation is stream-ordered as NCCL's are: it starts after the work enqueued
/// so far on the rank's compute stream (`set_compute_stream`), runs as device copies and `reduce_ranks` kernels
/// on the rank's communication stream, and its handle's `wait()` returns once it is complete. Reductions run
/// in rank order with `thread_communicator`'s numerics (16-bit values in fp32, rounded once; avg divides the
/// sum once), so results are deterministic and equal to a CPU group's.
///
/// How one operation runs, on every rank (`detail::device_group` holds the group's shared state):
/// 1. The rank's stream waits for its compute stream; the rank records `ready` and puts its call (what it is,
///    its buffers) in its slot, and waits on the host until every rank has (a rendezvous bounded by the
///    timeout; calls that differ between ranks throw `comm_error` on every rank, naming each rank's call).
/// 2. Its stream waits for every rank's `ready` (every rank's buffers are then free: the work each rank
///    enqueued before the call is done); it then does its share of the call in one pass, reading and writing
///    any rank's buffers (all_reduce: its chunk of the result from every send into every recv; all_gather: its
///    send into every recv; broadcast: the root's send into every recv; reduce_scatter and all_to_all: its own
///    recv from every send), records `part`, and meets the others again.
/// 3. Its stream waits for every rank's `part` and records the handle's event: every rank has read this rank's
///    send and written this rank's recv by then.
/// Every element is moved by one kernel or copy, each byte read and written the least number of times the
/// operation allows (bench/cuda/bench_device_group.cpp measures it against a device copy of that traffic).
/// The host meets the other ranks in every call, as a thread group does; the device work of different calls
/// still overlaps the ranks' compute streams like NCCL's.
///
/// Operations: all_reduce, reduce_scatter, all_gather, broadcast, barrier, all_to_all and split (stages 0-3,
/// HSDP's replica groups, hpZ's and qgZ's node groups, MoE's exchanges), and send/recv (pipeline stages): a
/// send never blocks the host (its handle completes once the receiver's copy ran), a recv blocks until the
/// matching send was started, so two ranks that both send first do not wait for each other.

#include "zero/backend/cuda_kernels.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/comm/detail/device_group.hpp"
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
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// An operation of a `device_group_communicator` in flight: the event recorded on the rank's stream at its
/// end. Dropping it without `wait()` is allowed (the work completes in stream order). Movable, not copyable.
class device_group_handle {
public:
  device_group_handle() = default;
  device_group_handle(cudaEvent_t done, std::string what, std::chrono::milliseconds timeout)
      : done_(done), what_(std::move(what)), timeout_(timeout) {}
  /// A send's: complete once the receiver took it (`sent`) and its copy ran.
  device_group_handle(std::shared_ptr<detail::device_group> g, int rank, std::shared_ptr<detail::p2p_message> sent,
                      std::string what, std::chrono::milliseconds timeout)
      : what_(std::move(what)), timeout_(timeout), g_(std::move(g)), rank_(rank), sent_(std::move(sent)) {}
  device_group_handle(device_group_handle&& o) noexcept
      : done_(std::exchange(o.done_, nullptr)), what_(std::move(o.what_)), timeout_(o.timeout_), g_(std::move(o.g_)),
        rank_(o.rank_), sent_(std::move(o.sent_)) {}
  device_group_handle& operator=(device_group_handle&& o) noexcept {
    release();
    done_ = std::exchange(o.done_, nullptr);
    what_ = std::move(o.what_);
    timeout_ = o.timeout_;
    g_ = std::move(o.g_);
    rank_ = o.rank_;
    sent_ = std::move(o.sent_);
    return *this;
  }
  device_group_handle(const device_group_handle&) = delete;
  device_group_handle& operator=(const device_group_handle&) = delete;
  ~device_group_handle() { release(); }

  /// Blocks the host until the operation is complete.
  /// \throws timeout_error naming the operation when the communicator's timeout passes first; cuda_error
  ///         when the event query fails.
  void wait() {
    const auto start = std::chrono::steady_clock::now();
    cudaEvent_t until = done_;
    if (sent_) { // a send: the receiver's copy, once the receiver has taken it
      g_->wait_posted(*sent_, rank_, what_, timeout_);
      until = sent_->copied;
    }
    if (until == nullptr) {
      return;
    }
    for (;;) {
      const cudaError_t q = cudaEventQuery(until);
      if (q == cudaSuccess) {
        release();
        return;
      }
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        throw cuda_error(what_ + ": " + cudaGetErrorString(q), static_cast<int>(q));
      }
      if (std::chrono::steady_clock::now() - start > timeout_) {
        throw timeout_error(what_ + ": not complete on the device within " + std::to_string(timeout_.count()) + " ms");
      }
      std::this_thread::yield();
    }
  }

private:
  void release() noexcept {
    if (done_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(done_));
      done_ = nullptr;
    }
    sent_.reset();
  }

  cudaEvent_t done_ = nullptr;
  std::string what_;
  std::chrono::milliseconds timeout_{};
  std::shared_ptr<detail::device_group> g_;   // a send's group
  int rank_ = 0;                              // a send's rank
  std::shared_ptr<detail::p2p_message> sent_; // a send's message
};

/// Rank `rank` of a group of ranks sharing one device; see the file comment. Make the group once
/// (`make_device_group`) and one communicator per rank, each used from that rank's thread.
class device_group_communicator {
public:
  using handle = device_group_handle;

  /// \param group the group's shared state (`make_device_group`); \param rank 0 <= rank < group->size().
  /// \throws usage_error for a rank outside the group; cuda_error when the stream cannot be made.
  device_group_communicator(std::shared_ptr<detail::device_group> group, int rank) : g_(std::move(group)), rank_(rank) {
    if (rank < 0 || rank >= g_->size()) {
      throw usage_error("device_group_communicator: rank " + std::to_string(rank) + " of a group of " +
                        std::to_string(g_->size()));
    }
    ZERO_CHECK_CUDA(cudaSetDevice(g_->device()));
    ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&produced_, cudaEventDisableTiming));
  }
  device_group_communicator(device_group_communicator&& o) noexcept { take(o); }
  device_group_communicator& operator=(device_group_communicator&& o) noexcept {
    if (this != &o) {
      destroy();
      take(o);
    }
    return *this;
  }
  device_group_communicator(const device_group_communicator&) = delete;
  device_group_communicator& operator=(const device_group_communicator&) = delete;
  /// Waits for the rank's stream (its buffers are in use until then), then frees them.
  ~device_group_communicator() { destroy(); }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return g_->size(); }
  /// The CUDA device every rank of the group shares.
  [[nodiscard]] int device() const noexcept { return g_->device(); }
  [[nodiscard]] std::string_view name() const noexcept { return g_->name(); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  /// Orders every later operation after the work enqueued so far on `s` (the engine's stream).
  void set_compute_stream(cudaStream_t s) noexcept { compute_ = s; }
  /// The rank's communication stream.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// See `communicator.hpp`: every rank's `recv` gets the element-wise `op` of all ranks' `send`.
  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    check_op<T>("all_reduce", op);
    const std::size_t n = static_cast<std::size_t>(size());
    const std::size_t per = (count + n - 1) / n;
    const std::size_t first = std::min(count, per * static_cast<std::size_t>(rank_));
    const std::size_t mine = std::min(count, first + per) - first;
    return run<T>(0, count, static_cast<std::int64_t>(op), send, recv, [&](auto& s) {
      // My chunk of the result, from every rank's send into every rank's recv in one pass: each element is read
      // from every send before it is written, so an in-place all_reduce (recv == send) is safe too.
      std::array<const T*, cuda::max_reduce_ranks> in{};
      std::array<T*, cuda::max_reduce_ranks> out{};
      for (std::size_t r = 0; r < n; ++r) {
        in[r] = static_cast<const T*>(s[r].send) + first;
        out[r] = static_cast<T*>(s[r].recv) + first;
      }
      cuda::reduce_ranks(std::span<T* const>(out.data(), n), std::span<const T* const>(in.data(), n), mine,
                         detail::rank_reduce_of(op), stream_);
    });
  }

  /// Rank r's `recv` gets the element-wise `op` over all ranks' block r of `send`.
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t recv_count, reduce_op op) {
    check_op<T>("reduce_scatter", op);
    return run<T>(1, recv_count, static_cast<std::int64_t>(op), send, recv, [&](auto& s) {
      std::array<const T*, cuda::max_reduce_ranks> in{};
      for (int r = 0; r < size(); ++r) {
        in[static_cast<std::size_t>(r)] =
            static_cast<const T*>(s[static_cast<std::size_t>(r)].send) + static_cast<std::size_t>(rank_) * recv_count;
      }
      cuda::reduce_ranks(recv, std::span<const T* const>(in.data(), static_cast<std::size_t>(size())), recv_count,
                         detail::rank_reduce_of(op), stream_);
    });
  }

  /// Block r of every rank's `recv` gets rank r's `send`.
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t send_count) {
    return run<T>(2, send_count, 0, send, recv, [&](auto& s) {
      // My send, read once, into block rank() of every rank's recv.
      copy_to_all(s, static_cast<std::size_t>(rank_) * send_count, send, send_count);
    });
  }

  /// Every rank's `recv` gets root's `send`.
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    if (root < 0 || root >= size()) {
      throw usage_error("broadcast: root " + std::to_string(root) + " is outside the group of " +
                        std::to_string(size()));
    }
    return run<T>(3, count, root, send, recv, [&](auto& s) {
      if (rank_ == root) { // the root's send, read once, into every rank's recv
        copy_to_all(s, 0, send, count);
      }
    });
  }

  /// Block p of this rank's `send` goes to rank p's block `rank()` of `recv`; `recv` must not overlap `send`.
  template <element_type T> [[nodiscard]] handle all_to_all(const T* send, T* recv, std::size_t count_per_peer) {
    return run<T>(5, count_per_peer, 0, send, recv, [&](auto& s) {
      for (int q = 0; q < size(); ++q) {
        copy(recv + static_cast<std::size_t>(q) * count_per_peer,
             static_cast<const T*>(s[static_cast<std::size_t>(q)].send) +
                 static_cast<std::size_t>(rank_) * count_per_peer,
             count_per_peer);
      }
    });
  }

  /// Starts sending `count` elements to `peer`, whose matching `recv` copies them (sends to one peer arrive
  /// in order). Never blocks the host: the handle's `wait()` returns once the receiver's copy ran, and the
  /// buffer must stay unchanged until then. \throws usage_error for a peer outside the group or this rank.
  template <element_type T> [[nodiscard]] handle send(const T* data, std::size_t count, int peer) {
    check_peer("send", peer);
    ZERO_CHECK_CUDA(cudaSetDevice(g_->device()));
    order_after_compute();
    auto m = std::make_shared<detail::p2p_message>();
    m->data = data;
    m->count = static_cast<std::int64_t>(count);
    m->type = dtype_v<T>;
    ZERO_CHECK_CUDA(cudaEventRecord(m->ready, stream_));
    g_->post(rank_, peer, m);
    return handle(g_, rank_, std::move(m), p2p_name("send", count, dtype_v<T>, "to", peer), timeout_);
  }

  /// Starts receiving `count` elements from `peer`'s matching `send`: blocks the host until that send was
  /// started, then copies on this rank's stream.
  /// \throws usage_error for a peer outside the group or this rank; comm_error when the send's count or type
  ///         differs (naming both); timeout_error when no send comes within the timeout.
  template <element_type T> [[nodiscard]] handle recv(T* data, std::size_t count, int peer) {
    check_peer("recv", peer);
    ZERO_CHECK_CUDA(cudaSetDevice(g_->device()));
    order_after_compute();
    const std::string what = p2p_name("recv", count, dtype_v<T>, "from", peer);
    auto m = g_->take(peer, rank_, what, timeout_);
    if (m->count != static_cast<std::int64_t>(count) || m->type != dtype_v<T>) {
      const std::string why = what + " met rank " + std::to_string(peer) + "'s " +
                              p2p_name("send", static_cast<std::size_t>(m->count), m->type, "to", rank_);
      g_->fail(why);
      throw comm_error(why);
    }
    ZERO_CHECK_CUDA(cudaStreamWaitEvent(stream_, m->ready, 0));
    copy(data, static_cast<const T*>(m->data), count);
    ZERO_CHECK_CUDA(cudaEventRecord(m->copied, stream_));
    g_->mark_posted(*m);
    cudaEvent_t done = nullptr;
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ZERO_CHECK_CUDA(cudaEventRecord(done, stream_));
    return handle(done, what, timeout_);
  }

  /// The communicator of the ranks that passed the same `color`, ranked by (key, rank here); collective over
  /// this group (every rank calls it). Named "<this group's name>/<color>", with this one's timeout, on the
  /// same device, with a stream of its own. \throws as the other operations; cuda_error.
  [[nodiscard]] device_group_communicator split(int color, int key) {
    auto& me = g_->slot(rank_);
    me.color = color;
    me.key = key;
    int new_rank = 0;
    // run's rendezvous and call check, with no device work: the colors and keys are read between its meetings.
    auto h = run<std::uint8_t>(6, 0, 0, nullptr, nullptr, [&](auto& s) {
      std::vector<std::pair<int, int>> members; // (key, old rank) of my color
      for (int r = 0; r < size(); ++r) {
        if (s[static_cast<std::size_t>(r)].color == color) {
          members.emplace_back(s[static_cast<std::size_t>(r)].key, r);
        }
      }
      std::sort(members.begin(), members.end());
      for (std::size_t k = 0; k < members.size(); ++k) {
        if (members[k].second == rank_) {
          new_rank = static_cast<int>(k);
        }
      }
      // The color's lowest old rank makes its group; the others read it from that rank's slot once the
      // ranks have met again (the end of `run`).
      maker_ = size();
      for (const auto& m : members) {
        maker_ = std::min(maker_, m.second);
      }
      if (maker_ == rank_) {
        me.made = std::make_shared<detail::device_group>(static_cast<int>(members.size()), g_->device(),
                                                         g_->name() + "/" + std::to_string(color));
      }
    });
    h.wait();
    device_group_communicator out(g_->slot(maker_).made, new_rank);
    out.set_timeout(timeout_);
    return out;
  }

  /// Completes once every rank has reached it.
  [[nodiscard]] handle barrier() {
    return run<std::uint8_t>(4, 0, 0, nullptr, nullptr, [](auto&) {});
  }

private:
  void take(device_group_communicator& o) noexcept {
    g_ = std::move(o.g_);
    rank_ = o.rank_;
    timeout_ = o.timeout_;
    stream_ = std::exchange(o.stream_, nullptr);
    produced_ = std::exchange(o.produced_, nullptr);
    compute_ = o.compute_;
    maker_ = o.maker_;
  }
  void destroy() noexcept {
    if (stream_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaStreamSynchronize(stream_));
      ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(produced_));
      ZERO_CHECK_CUDA_NOTHROW(cudaStreamDestroy(stream_));
      stream_ = nullptr;
    }
  }

  void check_peer(const char* what, int peer) const {
    if (peer < 0 || peer >= size() || peer == rank_) {
      throw usage_error(std::string(what) + ": peer " + std::to_string(peer) + " of a group of " +
                        std::to_string(size()) + " at rank " + std::to_string(rank_) +
                        "; expected another rank of the group");
    }
  }
  /// "send(count=8, fp32) to rank 1 at rank 0 of group \"world\"".
  std::string p2p_name(const char* op, std::size_t count, dtype type, const char* dir, int peer) const {
    return std::string(op) + "(count=" + std::to_string(count) + ", " + std::string(name_of(type)) + ") " + dir +
           " rank " + std::to_string(peer) + " at rank " + std::to_string(rank_) + " of group \"" + g_->name() + "\"";
  }
  void order_after_compute() {
    if (compute_ != nullptr) {
      ZERO_CHECK_CUDA(cudaEventRecord(produced_, compute_));
      ZERO_CHECK_CUDA(cudaStreamWaitEvent(stream_, produced_, 0));
    }
  }

  template <element_type T> static void check_op(const char* what, reduce_op op) {
    if (op == reduce_op::avg && !(std::is_floating_point_v<T> || is_half_v<T>)) {
      throw usage_error(std::string(what) + ": reduce_op::avg needs a floating element type");
    }
  }

  /// Every rank's slots, read between meetings.
  using slots = std::vector<detail::device_slot>;

  /// `n` elements of `src` into every rank's recv at `offset`, in one kernel (`reduce_ranks` of one input).
  template <class T> void copy_to_all(const slots& s, std::size_t offset, const T* src, std::size_t n) {
    std::array<T*, cuda::max_reduce_ranks> out{};
    for (std::size_t r = 0; r < s.size(); ++r) {
      out[r] = static_cast<T*>(s[r].recv) + offset;
    }
    const T* const in[1] = {src};
    cuda::reduce_ranks(std::span<T* const>(out.data(), s.size()), std::span<const T* const>(in), n,
                       cuda::rank_reduce::sum, stream_);
  }
  template <class T> void copy(T* dst, const T* src, std::size_t n) {
    if (n > 0 && dst != src) {
      ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, stream_));
    }
  }

  /// Steps 1-3 of the file comment; `work` is step 2's.
  template <class T, class Work>
  handle run(std::int64_t kind, std::size_t count, std::int64_t extra, const T* send, T* recv, Work&& work) {
    const detail::op_signature sig{kind, static_cast<std::int64_t>(count), static_cast<std::int64_t>(dtype_v<T>),
                                   extra};
    const std::string what = detail::describe(sig);
    ZERO_CHECK_CUDA(cudaSetDevice(g_->device()));
    order_after_compute();
    auto& me = g_->slot(rank_);
    me.sig = sig;
    me.send = send;
    me.recv = recv;
    ZERO_CHECK_CUDA(cudaEventRecord(me.ready, stream_));
    try {
      g_->meet(rank_, what, timeout_);
      slots all;
      std::vector<detail::op_signature> sigs;
      for (int r = 0; r < size(); ++r) {
        all.push_back(g_->slot(r));
        sigs.push_back(all.back().sig);
      }
      if (const std::string calls = detail::mismatched_calls(sigs); !calls.empty()) {
        throw comm_error("a call does not match across the ranks of group \"" + g_->name() + "\": " + calls +
                         " (nothing was started)");
      }
      wait_all(all, &detail::device_slot::ready);
      work(all);
      ZERO_CHECK_CUDA(cudaEventRecord(me.part, stream_));
      g_->meet(rank_, what + " (its reads)", timeout_);
      wait_all(all, &detail::device_slot::part);
    } catch (...) { // the other ranks stop waiting for this one
      g_->fail(what + " failed at rank " + std::to_string(rank_));
      throw;
    }
    cudaEvent_t done = nullptr;
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    ZERO_CHECK_CUDA(cudaEventRecord(done, stream_));
    return handle(done, what + " at rank " + std::to_string(rank_) + " of group \"" + g_->name() + "\"", timeout_);
  }

  void wait_all(const slots& s, cudaEvent_t detail::device_slot::*event) {
    for (const auto& slot : s) {
      ZERO_CHECK_CUDA(cudaStreamWaitEvent(stream_, slot.*event, 0));
    }
  }

  std::shared_ptr<detail::device_group> g_;
  int rank_ = 0;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t produced_ = nullptr;
  cudaStream_t compute_ = nullptr;
  int maker_ = 0; // split: the old rank that made this rank's new group
};

/// The shared state of a group of `size` ranks on device `device`, named `name` in messages.
/// \throws usage_error for fewer than 1 or more than `cuda::max_reduce_ranks` ranks; cuda_error.
[[nodiscard]] inline std::shared_ptr<detail::device_group> make_device_group(int size, int device = 0,
                                                                             std::string name = "world") {
  return std::make_shared<detail::device_group>(size, device, std::move(name));
}

/// Runs `fn(device_group_communicator&)` on `n` threads, thread r as rank r of one group on device `device`,
/// and returns when all are done. The first rank's exception that is not another rank's failure echoed (a
/// comm_error) is rethrown, else the first; a failing rank fails the group, so the others stop waiting at once.
/// \param timeout every rank's communicator's timeout.
/// \throws usage_error for fewer than 1 or more than `cuda::max_reduce_ranks` ranks; what a rank threw.
template <class F>
void run_device_group(int n, F&& fn, int device = 0, std::chrono::milliseconds timeout = default_comm_timeout) {
  auto group = make_device_group(n, device);
  detail::run_rank_threads(
      n,
      [&](int r) {
        device_group_communicator comm(group, r);
        comm.set_timeout(timeout);
        fn(comm);
      },
      [&] { group->fail("a rank failed"); });
}

static_assert(full_communicator<device_group_communicator>);

} // namespace zero
