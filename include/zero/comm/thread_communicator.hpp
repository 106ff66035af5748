#pragma once
/// \file
/// `thread_communicator`: N ranks as threads of one process. It implements every communicator
/// operation over shared memory with a fixed reduction order (rank 0, 1, ..., N-1, half types
/// accumulated in fp32 and rounded once), so results are bit-identical from run to run, and
/// across world sizes for exactly-reducible inputs. `zero::run_ranks(n, fn)` starts a group.
///
/// Operations are matched by their order of issue on each rank, as NCCL and MPI match them: the
/// k-th collective of every rank of a group is one operation, and a rank that issues another
/// kind, count or type there breaks the group with an error that names both calls.
/// The data movement of a collective is done by whichever ranks wait on it, in chunks, so a rank
/// that posted an operation and went on to other work never stalls the others.

#include "zero/comm/communicator.hpp"
#include "zero/comm/detail/thread_group.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// Options of a group started by `run_ranks`.
struct thread_group_options {
  /// How long any wait may block before it throws `timeout_error`.
  std::chrono::milliseconds timeout = default_comm_timeout;
  /// The group's name in messages.
  std::string name = "world";
};

/// In-process communicator: one object per rank, all sharing one group state.
class thread_communicator {
public:
  /// A posted operation. `wait()` completes it; the destructor waits too (without throwing) when
  /// the caller did not, so buffers are never written after the handle is gone.
  class handle {
  public:
    handle() = default;
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    handle(handle&& o) noexcept { *this = std::move(o); }
    handle& operator=(handle&& o) noexcept {
      if (this != &o) {
        finish_quietly();
        group_ = std::move(o.group_);
        op_ = std::move(o.op_);
        p2p_ = std::move(o.p2p_);
        rank_ = o.rank_;
        bytes_ = o.bytes_;
        timeout_ = o.timeout_;
        what_ = std::move(o.what_);
        deadline_ = o.deadline_;
        o.group_.reset();
      }
      return *this;
    }
    ~handle() { finish_quietly(); }

    /// Blocks until this rank's part is complete.
    /// \throws timeout_error when the operation does not complete within the communicator's timeout
    /// (naming the operation, the group, the rank and the bytes); comm_error when the group broke.
    void wait() {
      if (!group_) {
        return;
      }
      auto group = std::move(group_);
      group_.reset();
      if (op_) {
        wait_collective(*group);
      } else {
        wait_p2p(*group);
      }
    }

    /// True when there is nothing left to wait for.
    [[nodiscard]] bool ready() const noexcept { return !group_; }

  private:
    friend class thread_communicator;

    void finish_quietly() noexcept {
      if (group_) {
        try {
          wait();
        } catch (...) {
          // A destructor cannot report; the group is already marked broken by the failure.
        }
      }
    }

    [[noreturn]] void fail(detail::thread_group& g) {
      // Another rank broke the group first: its exception names the cause, this one echoes it.
      if (g.broken_by_timeout) {
        throw as_echo(timeout_error(detail::timeout_message(what_, g.name, rank_, g.size, bytes_, timeout_) +
                                    "; group broken: " + g.broken_reason));
      }
      throw as_echo(comm_error(what_ + " on group \"" + g.name + "\" at rank " + std::to_string(rank_) +
                               " cannot complete: the group is broken: " + g.broken_reason));
    }

    void time_out(detail::thread_group& g) {
      std::string msg = detail::timeout_message(what_, g.name, rank_, g.size, bytes_, timeout_);
      if (op_) {
        std::string missing;
        for (int q = 0; q < g.size; ++q) {
          if (!op_->joined[q]) {
            missing += (missing.empty() ? "" : ", ") + std::to_string(q);
          }
        }
        if (!missing.empty()) {
          msg += "; ranks that never joined: " + missing;
        }
      }
      g.break_locked(msg, true);
      throw timeout_error(msg);
    }

    void wait_collective(detail::thread_group& g) {
      auto& op = *op_;
      std::unique_lock lock(g.mutex);
      struct release_guard {
        detail::thread_group& g;
        std::shared_ptr<detail::thread_op>& op;
        ~release_guard() {
          // The last rank to let go removes the operation; on a broken group records stay
          // until the group dies, since late ranks may still hold pointers into them.
          if (++op->released == g.size && !g.broken) {
            g.ops.erase(op->seq);
          }
          op.reset();
        }
      } guard{g, op_};
      while (op.arrived < g.size) {
        if (g.broken) {
          fail(g);
        }
        if (g.cv.wait_until(lock, deadline_) == std::cv_status::timeout && op.arrived < g.size && !g.broken) {
          time_out(g);
        }
      }
      // Everyone has posted: help with the data movement, then wait for the chunks others took.
      while (op.next_chunk < op.chunks) {
        const std::size_t c = op.next_chunk++;
        lock.unlock();
        const std::size_t begin = c * detail::thread_chunk_units;
        const std::size_t end = std::min(op.units, begin + detail::thread_chunk_units);
        op.work(op, begin, end);
        lock.lock();
        if (++op.done_chunks == op.chunks) {
          g.cv.notify_all();
        }
      }
      // No timeout here: the chunks left are being copied by ranks that are running.
      g.cv.wait(lock, [&] { return op.done_chunks == op.chunks; });
    }

    void wait_p2p(detail::thread_group& g) {
      auto p = std::move(p2p_);
      std::unique_lock lock(g.mutex);
      while (!(p->has_send && p->has_recv)) {
        if (g.broken) {
          fail(g);
        }
        if (g.cv.wait_until(lock, deadline_) == std::cv_status::timeout && !(p->has_send && p->has_recv) && !g.broken) {
          time_out(g);
        }
      }
      if (!p->claimed) {
        p->claimed = true;
        if (p->send_bytes != p->recv_bytes) {
          p->error = "send of " + std::to_string(p->send_bytes) + " bytes matched a recv of " +
                     std::to_string(p->recv_bytes) + " bytes; counts and types must agree";
        } else {
          lock.unlock();
          std::memcpy(p->dst, p->src, p->send_bytes);
          lock.lock();
        }
        p->done = true;
        g.cv.notify_all();
      }
      g.cv.wait(lock, [&] { return p->done; });
      if (!p->error.empty()) {
        throw usage_error(what_ + " on group \"" + g.name + "\" at rank " + std::to_string(rank_) + ": " + p->error);
      }
    }

    std::shared_ptr<detail::thread_group> group_;
    std::shared_ptr<detail::thread_op> op_;
    std::shared_ptr<detail::thread_p2p> p2p_;
    int rank_ = 0;
    std::size_t bytes_ = 0;
    std::chrono::milliseconds timeout_{};
    std::string what_;
    std::chrono::steady_clock::time_point deadline_{};
  };

  /// Joins `group` as `rank`. Normally made by `run_ranks` or `split`.
  thread_communicator(std::shared_ptr<detail::thread_group> group, int rank,
                      std::chrono::milliseconds timeout = default_comm_timeout)
      : group_(std::move(group)), rank_(rank), timeout_(timeout) {
    if (!group_ || rank_ < 0 || rank_ >= group_->size) {
      throw usage_error("thread_communicator: rank " + std::to_string(rank_) + " is outside the group of size " +
                        std::to_string(group_ ? group_->size : 0));
    }
  }

  /// Makes the shared state of a new group of `size` ranks.
  [[nodiscard]] static std::shared_ptr<detail::thread_group> make_group(int size, std::string name = "world") {
    if (size < 1) {
      throw usage_error("a thread group needs at least one rank, got " + std::to_string(size));
    }
    return std::make_shared<detail::thread_group>(std::move(name), size);
  }

  /// \returns this thread's rank in the group, 0 <= rank() < size().
  [[nodiscard]] int rank() const noexcept { return rank_; }
  /// \returns the number of ranks in the group.
  [[nodiscard]] int size() const noexcept { return group_->size; }
  /// \returns the group's name in messages ("world", or "<parent>/<color>" for a split).
  [[nodiscard]] std::string_view name() const noexcept { return group_->name; }
  /// \returns how long a wait may block before it throws `timeout_error`.
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return timeout_; }
  /// Sets how long any later wait on this rank may block.
  void set_timeout(std::chrono::milliseconds t) noexcept { timeout_ = t; }
  /// True once an operation on the group failed or timed out.
  [[nodiscard]] bool broken() const {
    std::lock_guard lock(group_->mutex);
    return group_->broken;
  }
  /// Breaks the group on purpose (a rank that failed outside the communicator), so that no other
  /// rank waits for it until its timeout.
  void abort(const std::string& reason) {
    std::lock_guard lock(group_->mutex);
    group_->break_locked("rank " + std::to_string(rank_) + " aborted: " + reason, false);
  }

  /// Sum, average or maximum of `count` elements over the group, into every rank's `recv`.
  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    return post<T>(detail::thread_op_kind::all_reduce, send, recv, count, op, 0, count,
                   [](detail::thread_op& o, std::size_t b, std::size_t e) {
                     for (std::size_t i = b; i < e; ++i) {
                       const T v = detail::store_acc<T>(detail::reduce_element<T>(o.send, i, o.op));
                       for (void* r : o.recv) {
                         static_cast<T*>(r)[i] = v;
                       }
                     }
                   });
  }

  /// Reduces `size()*count` elements over the group; rank r receives block r (`count` elements).
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    const auto n = static_cast<std::size_t>(size());
    return post<T>(detail::thread_op_kind::reduce_scatter, send, recv, count, op, 0, n * count,
                   [](detail::thread_op& o, std::size_t b, std::size_t e) {
                     for (std::size_t u = b; u < e; ++u) {
                       const std::size_t q = u / o.count;
                       static_cast<T*>(o.recv[q])[u - q * o.count] =
                           detail::store_acc<T>(detail::reduce_element<T>(o.send, u, o.op));
                     }
                   });
  }

  /// Concatenates every rank's `count` elements, in rank order, into every rank's `recv`.
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t count) {
    return post<T>(detail::thread_op_kind::all_gather, send, recv, count, reduce_op::sum, 0,
                   static_cast<std::size_t>(size()) * count, [](detail::thread_op& o, std::size_t b, std::size_t e) {
                     for (std::size_t u = b; u < e; ++u) {
                       const std::size_t q = u / o.count;
                       const T v = static_cast<const T*>(o.send[q])[u - q * o.count];
                       for (void* r : o.recv) {
                         static_cast<T*>(r)[u] = v;
                       }
                     }
                   });
  }

  /// Copies `root`'s `count` elements into every rank's `recv` (`send` is read on the root only).
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    check_peer(root, "broadcast root");
    return post<T>(detail::thread_op_kind::broadcast, send, recv, count, reduce_op::sum, root, count,
                   [](detail::thread_op& o, std::size_t b, std::size_t e) {
                     const T* src = static_cast<const T*>(o.send[static_cast<std::size_t>(o.root)]);
                     for (void* r : o.recv) {
                       if (r != src) {
                         std::memcpy(static_cast<T*>(r) + b, src + b, (e - b) * sizeof(T));
                       }
                     }
                   });
  }

  /// Returns once every rank of the group has called barrier.
  [[nodiscard]] handle barrier() {
    return post<std::uint8_t>(detail::thread_op_kind::barrier, nullptr, nullptr, 0, reduce_op::sum, 0, 0,
                              [](detail::thread_op&, std::size_t, std::size_t) {});
  }

  /// Block q of rank p's `send` (each `count` elements) lands as block p of rank q's `recv`.
  template <element_type T> [[nodiscard]] handle all_to_all(const T* send, T* recv, std::size_t count) {
    const auto n = static_cast<std::size_t>(size());
    if (count > 0 && send < recv + n * count && recv < send + n * count) {
      throw usage_error("all_to_all on group \"" + group_->name + "\" at rank " + std::to_string(rank_) +
                        ": send and recv overlap; all_to_all has no in-place form");
    }
    return post<T>(detail::thread_op_kind::all_to_all, send, recv, count, reduce_op::sum, 0, n * n * count,
                   [](detail::thread_op& o, std::size_t b, std::size_t e) {
                     const std::size_t n = o.recv.size();
                     for (std::size_t u = b; u < e; ++u) {
                       // u enumerates (destination p, source q, element j).
                       const std::size_t p = u / (n * o.count);
                       const std::size_t q = (u / o.count) % n;
                       const std::size_t j = u % o.count;
                       static_cast<T*>(o.recv[p])[q * o.count + j] = static_cast<const T*>(o.send[q])[p * o.count + j];
                     }
                   });
  }

  /// Sends `count` elements to `peer`; matched in order with `peer`'s recv from this rank.
  template <element_type T> [[nodiscard]] handle send(const T* buf, std::size_t count, int peer) {
    return post_p2p(buf, nullptr, count * sizeof(T), peer, true);
  }
  /// Receives `count` elements from `peer`.
  template <element_type T> [[nodiscard]] handle recv(T* buf, std::size_t count, int peer) {
    return post_p2p(nullptr, buf, count * sizeof(T), peer, false);
  }

  /// Collective: the ranks that pass the same `color` (>= 0) form a new group, ordered by
  /// (`key`, old rank). The new group is named "<name>/<color>".
  [[nodiscard]] thread_communicator split(int color, int key) {
    if (color < 0) {
      throw usage_error("split on group \"" + group_->name + "\": color must be >= 0, got " + std::to_string(color));
    }
    auto h = post<std::uint8_t>(
        detail::thread_op_kind::split, nullptr, nullptr, 0, reduce_op::sum, 0, 1,
        [](detail::thread_op& o, std::size_t, std::size_t) { compute_split(o); }, color, key);
    auto op = h.op_; // keep the record alive past wait()
    h.wait();
    return thread_communicator(op->split_groups[static_cast<std::size_t>(rank_)],
                               op->split_ranks[static_cast<std::size_t>(rank_)], timeout_);
  }

private:
  static void compute_split(detail::thread_op& o) {
    const std::size_t n = o.colors.size();
    std::map<int, std::vector<std::size_t>> members;
    for (std::size_t r = 0; r < n; ++r) {
      members[o.colors[r]].push_back(r);
    }
    for (auto& [color, ranks] : members) {
      std::stable_sort(ranks.begin(), ranks.end(), [&](std::size_t a, std::size_t b) { return o.keys[a] < o.keys[b]; });
      auto g = make_group(static_cast<int>(ranks.size()), o.split_name + "/" + std::to_string(color));
      for (std::size_t i = 0; i < ranks.size(); ++i) {
        o.split_groups[ranks[i]] = g;
        o.split_ranks[ranks[i]] = static_cast<int>(i);
      }
    }
  }

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= group_->size) {
      throw usage_error(std::string(what) + " " + std::to_string(peer) + " is outside group \"" + group_->name +
                        "\" of size " + std::to_string(group_->size));
    }
  }

  template <class T, class Work>
  handle post(detail::thread_op_kind kind, const T* send, T* recv, std::size_t count, reduce_op op, int root,
              std::size_t units, Work work, int color = 0, int key = 0) {
    auto& g = *group_;
    handle h;
    h.rank_ = rank_;
    h.timeout_ = timeout_;
    h.bytes_ = units * sizeof(T);
    h.deadline_ = std::chrono::steady_clock::now() + timeout_;
    const std::uint64_t seq = seq_++;
    std::lock_guard lock(g.mutex);
    auto& slot = g.ops[seq];
    if (!slot) {
      slot = std::make_shared<detail::thread_op>();
      auto& o = *slot;
      o.kind = kind;
      o.type = dtype_v<T>;
      o.count = count;
      o.op = op;
      o.root = root;
      o.seq = seq;
      o.send.assign(static_cast<std::size_t>(g.size), nullptr);
      o.recv.assign(static_cast<std::size_t>(g.size), nullptr);
      o.joined.assign(static_cast<std::size_t>(g.size), false);
      if (kind == detail::thread_op_kind::split) {
        o.colors.assign(static_cast<std::size_t>(g.size), 0);
        o.keys.assign(static_cast<std::size_t>(g.size), 0);
        o.split_groups.resize(static_cast<std::size_t>(g.size));
        o.split_ranks.resize(static_cast<std::size_t>(g.size));
        o.split_name = g.name;
      }
      o.units = units;
      o.chunks = units == 0 ? 0 : (units + detail::thread_chunk_units - 1) / detail::thread_chunk_units;
      o.work = std::move(work);
    }
    auto& o = *slot;
    h.what_ = o.describe();
    if (g.broken) {
      throw as_echo(comm_error(h.what_ + " on group \"" + g.name + "\" at rank " + std::to_string(rank_) +
                               " cannot start: the group is broken: " + g.broken_reason));
    }
    if (o.kind != kind || o.type != dtype_v<T> || o.count != count || o.op != op || o.root != root) {
      detail::thread_op mine;
      mine.kind = kind;
      mine.type = dtype_v<T>;
      mine.count = count;
      mine.op = op;
      mine.root = root;
      const std::string reason = "operation #" + std::to_string(seq) + " does not match across ranks: rank " +
                                 std::to_string(rank_) + " called " + mine.describe() + " where another rank called " +
                                 o.describe();
      g.break_locked(reason, false);
      throw comm_error(reason + " (group \"" + g.name + "\")");
    }
    o.send[static_cast<std::size_t>(rank_)] = send;
    o.recv[static_cast<std::size_t>(rank_)] = recv;
    o.joined[static_cast<std::size_t>(rank_)] = true;
    if (kind == detail::thread_op_kind::split) {
      o.colors[static_cast<std::size_t>(rank_)] = color;
      o.keys[static_cast<std::size_t>(rank_)] = key;
    }
    if (++o.arrived == g.size) {
      g.cv.notify_all();
    }
    h.op_ = slot;
    h.group_ = group_;
    return h;
  }

  handle post_p2p(const void* src, void* dst, std::size_t bytes, int peer, bool is_send) {
    check_peer(peer, is_send ? "send peer" : "recv peer");
    auto& g = *group_;
    handle h;
    h.rank_ = rank_;
    h.timeout_ = timeout_;
    h.bytes_ = bytes;
    h.deadline_ = std::chrono::steady_clock::now() + timeout_;
    h.what_ = std::string(is_send ? "send to " : "recv from ") + std::to_string(peer);
    std::lock_guard lock(g.mutex);
    if (g.broken) {
      throw as_echo(comm_error(h.what_ + " on group \"" + g.name + "\" at rank " + std::to_string(rank_) +
                               " cannot start: the group is broken: " + g.broken_reason));
    }
    const auto key = is_send ? std::pair{rank_, peer} : std::pair{peer, rank_};
    auto& queue = g.pending[key];
    // The FIFO holds transfers waiting for the other side; match the oldest one of the other kind.
    std::shared_ptr<detail::thread_p2p> p;
    if (!queue.empty() && (is_send ? !queue.front()->has_send : !queue.front()->has_recv)) {
      p = queue.front();
      queue.pop_front();
    } else {
      p = std::make_shared<detail::thread_p2p>();
      queue.push_back(p);
    }
    if (is_send) {
      p->src = src;
      p->send_bytes = bytes;
      p->has_send = true;
    } else {
      p->dst = dst;
      p->recv_bytes = bytes;
      p->has_recv = true;
    }
    if (p->has_send && p->has_recv) {
      g.cv.notify_all();
    }
    h.p2p_ = std::move(p);
    h.group_ = group_;
    return h;
  }

  std::shared_ptr<detail::thread_group> group_;
  int rank_ = 0;
  std::uint64_t seq_ = 0;
  std::chrono::milliseconds timeout_ = default_comm_timeout;
};

static_assert(full_communicator<thread_communicator>);

} // namespace zero

// run_ranks, which starts a group of these on threads, is where most users meet this file.
#include "zero/comm/run_ranks.hpp" // IWYU pragma: export
