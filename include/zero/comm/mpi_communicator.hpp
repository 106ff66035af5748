#pragma once
/// \file
/// `mpi_communicator`: the communicator policy over MPI (written against MPI 3.1, tested with
/// OpenMPI 4.1), for multi-process runs on CPUs and for host-side traffic of multi-node jobs.
///
/// Every operation maps to one non-blocking MPI call (`MPI_Iallreduce`,
/// `MPI_Ireduce_scatter_block`, `MPI_Iallgather`, `MPI_Ibcast`, `MPI_Ibarrier`,
/// `MPI_Isend`/`MPI_Irecv`, `MPI_Ialltoall`) and returns an `mpi_communicator::handle` whose
/// `wait()` polls `MPI_Test` until the operation completes or the communicator's timeout passes.
/// Buffers follow the table in `zero/comm/communicator.hpp` (NCCL's rules, in-place forms
/// included); they stay owned by the caller, who must not touch them until `wait()` returns.
///
/// Timeouts, and what MPI allows after one. MPI 3.1 (section 5.12) makes it erroneous to call
/// `MPI_Cancel` or `MPI_Request_free` on the request of a non-blocking collective, and MPI has no
/// way to withdraw a rank from a collective it has started. So when `wait()` times out it throws
/// `zero::timeout_error`, moves the still-active request (and any scratch buffer the operation
/// writes into) into the communicator's shared state instead of freeing it, and marks the group
/// broken: every later operation on it throws `zero::comm_error`. The caller's buffers of the
/// abandoned operation remain in MPI's hands too: MPI may still read or write them if the missing
/// ranks join later, so keep them alive or end the job (`MPI_Abort`, what NCCL's and DeepSpeed's
/// watchdogs do). A program that wants to finish cleanly instead must let the missing ranks join
/// and call `drain_abandoned()` until it returns 0: `MPI_Finalize` with pending requests is
/// erroneous. A scratch buffer whose request is still active when the last owner of the state goes
/// away is leaked on purpose rather than freed under MPI.
///
/// Matching. MPI leaves collectives that differ between ranks (another operation, count, type or
/// root at the same position) undefined: in practice a crash or a hang. So before a collective
/// starts, every rank's description of it (operation, count, type, root or reduction) is exchanged
/// with a small fixed-size `MPI_Iallgather` on a duplicate of the communicator, under the timeout,
/// and the collective starts only when all agree. When they do not, every rank throws the same
/// `zero::comm_error` ("operation #k does not match across ranks: ranks 0, 1 called
/// all_gather(count=1000, fp32); rank 2 called all_gather(count=500, fp32)") and the group is
/// broken; nothing was started. The price: a collective's start waits until every rank has started
/// it (the exchange is a few bytes). When the exchange times out, the call returns a handle whose
/// `wait()` throws the `timeout_error`, and `drain_abandoned()` starts the collective if the
/// missing ranks join later, so they do not hang. `send` and `recv` are not exchanged: MPI matches
/// them itself, and a recv that gets another count throws `usage_error`.
///
/// Requirements: MPI is initialised before a communicator is built and finalised only after every
/// communicator and handle is gone. Collectives must be started in the same order on every rank
/// of a group, as MPI requires. Operations issued from several threads need
/// `MPI_THREAD_MULTIPLE`, and `set_timeout` must not race with starting operations. Counts are
/// limited to `INT_MAX` elements per call (MPI 3.1's `int` counts). Allocation: none per operation
/// except in-place `reduce_scatter` (a scratch of `recv_count` elements) and `split`.
///
/// The pieces: zero/comm/mpi_check.hpp (`ZERO_CHECK_MPI`), zero/comm/mpi_handle.hpp (the handle),
/// zero/comm/detail/mpi_state.hpp (the state shared with the handles, abandoned operations included) and
/// zero/comm/detail/mpi_types.hpp (datatypes and reductions of zero's element types).

#include "zero/comm/communicator.hpp"
#include "zero/comm/detail/mpi_state.hpp"
#include "zero/comm/detail/mpi_types.hpp"
#include "zero/comm/mpi_check.hpp"
#include "zero/comm/mpi_handle.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mpi.h>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// A communicator over an MPI intra-communicator; satisfies `zero::full_communicator`.
///
/// Cheap to move, not copyable. Moved-from communicators throw `usage_error` from every member.
/// All operations are asynchronous and return a `handle` (see the file comment for timeouts).
class mpi_communicator {
public:
  /// An operation in flight (zero/comm/mpi_handle.hpp): `wait()` completes it or throws.
  using handle = mpi_handle;

  /// Tag of the messages `send` and `recv` exchange; keep it out of your own traffic on `native()`.
  static constexpr int p2p_tag = 0x7a65;

  /// Wraps `comm` without owning it: the caller frees `comm` after this communicator and its
  /// handles are gone. Sets `MPI_ERRORS_RETURN` on `comm` (and leaves it set) so MPI errors become
  /// `mpi_error` exceptions instead of aborting.
  /// \param comm an intra-communicator; MPI must be initialised.
  /// Collective over `comm`'s ranks: it duplicates `comm` for the exchange of operation
  /// descriptions (see the file comment), so every rank builds its communicator in the same order.
  /// \param name the group's name in messages, "world" by default.
  /// \throws usage_error when MPI is not running, `comm` is `MPI_COMM_NULL` or an inter-communicator.
  /// \throws mpi_error when MPI fails.
  explicit mpi_communicator(MPI_Comm comm, std::string name = "world")
      : mpi_communicator(comm, std::move(name), false) {}

  /// Not copyable: copies would share one MPI communicator with no clear owner.
  mpi_communicator(const mpi_communicator&) = delete;
  /// Not copyable, as above.
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  /// Moves the group; `other` is left empty.
  mpi_communicator(mpi_communicator&& other) noexcept = default;
  /// Releases this group (freeing its MPI communicator if owned and no handle still uses it) and
  /// takes `other`'s.
  mpi_communicator& operator=(mpi_communicator&& other) noexcept = default;
  /// Frees an owned MPI communicator (one made by `split`) once no handle uses it. noexcept.
  ~mpi_communicator() = default;

  /// This process's rank in the group, 0 <= rank() < size().
  [[nodiscard]] int rank() const { return state().rank; }
  /// Number of ranks in the group.
  [[nodiscard]] int size() const { return state().size; }
  /// The group's name used in messages ("world", or "<parent>/<color>" for a split); valid while
  /// this communicator lives.
  [[nodiscard]] std::string_view name() const { return state().name; }
  /// How long `wait()` waits before throwing `timeout_error`; `default_comm_timeout` unless set.
  [[nodiscard]] std::chrono::milliseconds timeout() const { return state().timeout; }
  /// Sets the timeout for operations started from now on (handles keep the one they started with).
  /// \throws usage_error when `timeout` is not positive.
  void set_timeout(std::chrono::milliseconds timeout) {
    if (timeout.count() <= 0) {
      throw usage_error("mpi_communicator \"" + std::string(name()) + "\": timeout must be positive, got " +
                        std::to_string(timeout.count()) + " ms");
    }
    state().timeout = timeout;
  }
  /// The wrapped MPI communicator, still owned by this object when it came from `split`.
  [[nodiscard]] MPI_Comm native() const { return state().comm; }

  /// True once an operation on this group timed out; every later operation throws `comm_error`.
  [[nodiscard]] bool broken() const {
    auto& s = state();
    const std::lock_guard lock(s.mutex);
    return !s.broken_reason.empty();
  }

  /// Progresses the operations abandoned by timeouts once (`MPI_Test`), forgets those that have
  /// completed (freeing their scratch) and returns how many are still active. An abandoned exchange
  /// of operation descriptions (see the file comment) that completes starts its collective, which
  /// then counts as active, so the ranks that joined late are not left waiting for this one. Call
  /// it until it returns 0, after the missing ranks joined, before `MPI_Finalize`. Does not
  /// un-break the group.
  /// \throws nothing of its own; an operation whose test or start fails is forgotten as finished.
  std::size_t drain_abandoned() {
    auto& s = state();
    const std::lock_guard lock(s.mutex);
    std::erase_if(s.abandoned, [](detail::mpi_comm_state::abandoned_op& op) {
      int done = 0;
      if (op.request == MPI_REQUEST_NULL || !detail::mpi_succeeded(MPI_Test(&op.request, &done, MPI_STATUS_IGNORE))) {
        return true;
      }
      if (done != 0 && op.then) {
        const auto then = std::move(op.then);
        op.then = nullptr;
        op.scratch.reset(); // the exchanged descriptions
        return !detail::mpi_succeeded(then(&op.request, op.scratch));
      }
      return done != 0;
    });
    return s.abandoned.size();
  }

  /// Starts an all-reduce: every rank's `recv` gets the element-wise `op` over all ranks' `send`.
  /// \param send  `count` elements, read until wait() returns.
  /// \param recv  `count` elements written; `recv == send` runs in place.
  /// \param count elements per rank, at most INT_MAX.
  /// \param op    sum, avg (sum divided by size() when the operation completes) or max; f16/bf16
  ///              accumulate through float and round once per step.
  /// \returns the handle to wait on. \throws usage_error, comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    auto& s = live("all_reduce");
    const int n = count_of("all_reduce", count);
    require("all_reduce", count, send, recv);
    if (send != recv && detail::overlaps(send, count * sizeof(T), recv, count * sizeof(T))) {
      throw usage_error(overlap_message("all_reduce", "recv must equal send or not overlap it"));
    }
    handle h = start(s, "all_reduce", count * sizeof(T));
    const void* from = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
    agree_and_start(
        s, h,
        {0, static_cast<std::int64_t>(count), static_cast<std::int64_t>(dtype_v<T>), static_cast<std::int64_t>(op)},
        [from, recv, n, type = detail::mpi_datatype<T>(), mop = detail::mpi_reduce_op<T>(op),
         comm = s.comm](MPI_Request* r, std::unique_ptr<std::byte[]>&) {
          return MPI_Iallreduce(from, recv, n, type, mop, comm, r);
        });
    if (op == reduce_op::avg) {
      set_average<T>(h, recv, count);
    }
    return h;
  }

  /// Starts a reduce-scatter: rank r's `recv` gets the element-wise `op` over all ranks' block r
  /// of `send` (elements [r*recv_count, (r+1)*recv_count)).
  /// \param send       size()*recv_count elements, read until wait() returns.
  /// \param recv       recv_count elements written; `recv == send + rank()*recv_count` runs in
  ///                   place, and then the other blocks of `send` are left unchanged (the result goes
  ///                   through a scratch buffer the handle allocates and owns).
  /// \param recv_count elements per rank, at most INT_MAX.
  /// \param op         as for all_reduce.
  /// \returns the handle to wait on. \throws usage_error (also for a partial overlap of the
  ///          buffers), comm_error (broken group), mpi_error.
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t recv_count, reduce_op op) {
    auto& s = live("reduce_scatter");
    const int n = count_of("reduce_scatter", recv_count);
    const std::size_t total = recv_count * static_cast<std::size_t>(s.size);
    require("reduce_scatter", recv_count, send, recv);
    const bool in_place = recv == send + static_cast<std::size_t>(s.rank) * recv_count;
    if (!in_place && detail::overlaps(send, total * sizeof(T), recv, recv_count * sizeof(T))) {
      throw usage_error(
          overlap_message("reduce_scatter", "recv must equal send + rank*recv_count or not overlap send"));
    }
    handle h = start(s, "reduce_scatter", total * sizeof(T));
    // In place, MPI_IN_PLACE would leave the result at the start of the buffer, not at block
    // rank(), and MPI forbids aliased send and receive buffers: reduce into scratch, copy when complete.
    agree_and_start(s, h,
                    {1, static_cast<std::int64_t>(recv_count), static_cast<std::int64_t>(dtype_v<T>),
                     static_cast<std::int64_t>(op)},
                    [send, recv, in_place, recv_count, n, type = detail::mpi_datatype<T>(),
                     mop = detail::mpi_reduce_op<T>(op),
                     comm = s.comm](MPI_Request* r, std::unique_ptr<std::byte[]>& scratch) {
                      void* to = recv;
                      if (in_place) {
                        scratch = std::make_unique<std::byte[]>(recv_count * sizeof(T));
                        to = scratch.get();
                      }
                      return MPI_Ireduce_scatter_block(send, to, n, type, mop, comm, r);
                    });
    if (in_place) {
      h.copy_to_ = recv;
      h.copy_bytes_ = recv_count * sizeof(T);
    }
    if (op == reduce_op::avg) {
      set_average<T>(h, recv, recv_count);
    }
    return h;
  }

  /// Starts an all-gather: block r of every rank's `recv` gets rank r's `send`.
  /// \param send       send_count elements, read until wait() returns.
  /// \param recv       size()*send_count elements written; `send == recv + rank()*send_count` runs
  ///                   in place.
  /// \param send_count elements per rank, at most INT_MAX.
  /// \returns the handle to wait on. \throws usage_error (also for a partial overlap),
  ///          comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t send_count) {
    auto& s = live("all_gather");
    const int n = count_of("all_gather", send_count);
    const std::size_t total = send_count * static_cast<std::size_t>(s.size);
    require("all_gather", send_count, send, recv);
    const bool in_place = send == recv + static_cast<std::size_t>(s.rank) * send_count;
    if (!in_place && detail::overlaps(send, send_count * sizeof(T), recv, total * sizeof(T))) {
      throw usage_error(overlap_message("all_gather", "send must equal recv + rank*send_count or not overlap recv"));
    }
    handle h = start(s, "all_gather", total * sizeof(T));
    // MPI_IN_PLACE takes each rank's input from its own block of recv: NCCL's in-place form.
    const void* from = in_place ? MPI_IN_PLACE : static_cast<const void*>(send);
    agree_and_start(s, h, {2, static_cast<std::int64_t>(send_count), static_cast<std::int64_t>(dtype_v<T>), 0},
                    [from, recv, n, type = detail::mpi_datatype<T>(), comm = s.comm](MPI_Request* r,
                                                                                     std::unique_ptr<std::byte[]>&) {
                      return MPI_Iallgather(from, n, type, recv, n, type, comm, r);
                    });
    return h;
  }

  /// Starts a broadcast: every rank's `recv` gets root's `send`.
  /// \param send  count elements on root (copied into root's `recv` before the broadcast starts
  ///              unless `recv == send`); ignored elsewhere and may be null there.
  /// \param recv  count elements written on every rank, root included.
  /// \param count elements, at most INT_MAX.
  /// \param root  the rank that sends, 0 <= root < size().
  /// \returns the handle to wait on. \throws usage_error, comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    auto& s = live("broadcast");
    const int n = count_of("broadcast", count);
    check_rank("broadcast", "root", root);
    require("broadcast", count, s.rank == root ? send : recv, recv);
    handle h = start(s, "broadcast", count * sizeof(T));
    if (s.rank == root && send != recv && count != 0) {
      std::memmove(recv, send, count * sizeof(T));
    }
    agree_and_start(s, h, {3, static_cast<std::int64_t>(count), static_cast<std::int64_t>(dtype_v<T>), root},
                    [recv, n, type = detail::mpi_datatype<T>(), root, comm = s.comm](MPI_Request* r,
                                                                                     std::unique_ptr<std::byte[]>&) {
                      return MPI_Ibcast(recv, n, type, root, comm, r);
                    });
    return h;
  }

  /// Starts a barrier: wait() returns once every rank of the group has entered it.
  /// \returns the handle to wait on. \throws comm_error (broken group), mpi_error.
  [[nodiscard]] handle barrier() {
    auto& s = live("barrier");
    handle h = start(s, "barrier", 0);
    agree_and_start(s, h, {4, 0, 0, 0},
                    [comm = s.comm](MPI_Request* r, std::unique_ptr<std::byte[]>&) { return MPI_Ibarrier(comm, r); });
    return h;
  }

  /// Starts sending `count` elements to `peer`, which must post a matching `recv` of the same
  /// count. Messages between two ranks arrive in the order they were sent.
  /// \param data  count elements, read until wait() returns.
  /// \param count elements, at most INT_MAX.
  /// \param peer  the receiving rank, 0 <= peer < size() (this rank too).
  /// \returns the handle to wait on. \throws usage_error, comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle send(const T* data, std::size_t count, int peer) {
    auto& s = live("send");
    const int n = count_of("send", count);
    check_rank("send", "peer", peer);
    require("send", count, data, data);
    handle h = start(s, "send", count * sizeof(T));
    ZERO_CHECK_MPI(MPI_Isend(data, n, detail::mpi_datatype<T>(), peer, p2p_tag, s.comm, &h.request_));
    return h;
  }

  /// Starts receiving `count` elements from `peer`'s matching `send`.
  /// \param data  count elements written.
  /// \param count elements, at most INT_MAX; the sender must send exactly this many.
  /// \param peer  the sending rank, 0 <= peer < size().
  /// \returns the handle to wait on; its wait() throws usage_error when fewer elements arrived
  ///          (and mpi_error, MPI_ERR_TRUNCATE, when more did).
  /// \throws usage_error, comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle recv(T* data, std::size_t count, int peer) {
    auto& s = live("recv");
    const int n = count_of("recv", count);
    check_rank("recv", "peer", peer);
    require("recv", count, data, data);
    handle h = start(s, "recv", count * sizeof(T));
    h.type_ = detail::mpi_datatype<T>();
    ZERO_CHECK_MPI(MPI_Irecv(data, n, h.type_, peer, p2p_tag, s.comm, &h.request_));
    h.expected_ = n;
    return h;
  }

  /// Starts an all-to-all: block p of this rank's `send` goes to rank p, and block p of `recv`
  /// comes from rank p.
  /// \param send           size()*count_per_peer elements, read until wait() returns.
  /// \param recv           size()*count_per_peer elements written; must not overlap `send`.
  /// \param count_per_peer elements per block, at most INT_MAX.
  /// \returns the handle to wait on. \throws usage_error (also when the buffers overlap),
  ///          comm_error (broken group), mpi_error.
  template <element_type T> [[nodiscard]] handle all_to_all(const T* send, T* recv, std::size_t count_per_peer) {
    auto& s = live("all_to_all");
    const int n = count_of("all_to_all", count_per_peer);
    const std::size_t total = count_per_peer * static_cast<std::size_t>(s.size);
    require("all_to_all", count_per_peer, send, recv);
    if (detail::overlaps(send, total * sizeof(T), recv, total * sizeof(T))) {
      throw usage_error(overlap_message("all_to_all", "it has no in-place form; send and recv must not overlap"));
    }
    handle h = start(s, "all_to_all", total * sizeof(T));
    agree_and_start(s, h, {5, static_cast<std::int64_t>(count_per_peer), static_cast<std::int64_t>(dtype_v<T>), 0},
                    [send, recv, n, type = detail::mpi_datatype<T>(), comm = s.comm](MPI_Request* r,
                                                                                     std::unique_ptr<std::byte[]>&) {
                      return MPI_Ialltoall(send, n, type, recv, n, type, comm, r);
                    });
    return h;
  }

  /// Splits the group, collectively: ranks that pass the same `color` form a new group, ordered by
  /// (key, old rank). The new communicator owns its MPI communicator, is named
  /// "<name()>/<color>" and starts with this one's timeout.
  ///
  /// The colors and keys are first exchanged with a non-blocking all-gather under the timeout, so
  /// a rank that never calls split gives `timeout_error` instead of a hang, and a negative color
  /// anywhere makes every rank throw the same `usage_error`; then `MPI_Comm_split` runs.
  /// \throws usage_error, timeout_error, comm_error (broken group), mpi_error.
  [[nodiscard]] mpi_communicator split(int color, int key) {
    auto& s = live("split");
    const auto ranks = static_cast<std::size_t>(s.size);
    std::vector<int> all(2 * ranks);
    {
      // The exchanged ints live in the handle's scratch so a timed-out exchange keeps them alive:
      // [0, 2*size) receives every rank's (color, key), the last two ints send this rank's.
      handle h = start(s, "split", 2 * ranks * sizeof(int));
      agree_and_start(s, h, {6, 0, 0, 0},
                      [ranks, color, key, comm = s.comm](MPI_Request* r, std::unique_ptr<std::byte[]>& scratch) {
                        scratch = std::make_unique<std::byte[]>((2 * ranks + 2) * sizeof(int));
                        int* ints = reinterpret_cast<int*>(scratch.get());
                        ints[2 * ranks] = color;
                        ints[2 * ranks + 1] = key;
                        return MPI_Iallgather(ints + 2 * ranks, 2, MPI_INT, ints, 2, MPI_INT, comm, r);
                      });
      h.copy_to_ = all.data();
      h.copy_bytes_ = 2 * ranks * sizeof(int);
      h.wait();
    }
    std::string bad;
    for (std::size_t r = 0; r < ranks; ++r) {
      if (all[2 * r] < 0) {
        bad += (bad.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + " passed " +
               std::to_string(all[2 * r]);
      }
    }
    if (!bad.empty()) {
      throw usage_error("split of group \"" + s.name + "\": colors must be >= 0, but " + bad);
    }
    MPI_Comm child = MPI_COMM_NULL;
    ZERO_CHECK_MPI(MPI_Comm_split(s.comm, color, key, &child));
    mpi_communicator result(child, s.name + "/" + std::to_string(color), true);
    result.state_->timeout = s.timeout;
    return result;
  }

private:
  mpi_communicator(MPI_Comm comm, std::string name, bool owns) {
    int initialized = 0;
    int finalized = 0;
    ZERO_CHECK_MPI(MPI_Initialized(&initialized));
    ZERO_CHECK_MPI(MPI_Finalized(&finalized));
    if (!initialized || finalized) {
      throw usage_error("mpi_communicator \"" + name + "\" needs MPI running: call MPI_Init before and MPI_Finalize " +
                        "after every communicator and handle");
    }
    if (comm == MPI_COMM_NULL) {
      throw usage_error("mpi_communicator \"" + name + "\" was given MPI_COMM_NULL");
    }
    // The state owns `comm` from here on, so a failure below frees it.
    auto s = std::make_shared<detail::mpi_comm_state>(comm, owns, std::move(name));
    ZERO_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    int inter = 0;
    ZERO_CHECK_MPI(MPI_Comm_test_inter(comm, &inter));
    if (inter) {
      throw usage_error("mpi_communicator \"" + s->name + "\" needs an intra-communicator, got an inter-communicator");
    }
    ZERO_CHECK_MPI(MPI_Comm_rank(comm, &s->rank));
    ZERO_CHECK_MPI(MPI_Comm_size(comm, &s->size));
    // The descriptions of collectives travel on a duplicate, so their exchange never matches a
    // collective of the caller's (MPI orders collectives per communicator).
    ZERO_CHECK_MPI(MPI_Comm_dup(comm, &s->check_comm));
    ZERO_CHECK_MPI(MPI_Comm_set_errhandler(s->check_comm, MPI_ERRORS_RETURN));
    state_ = std::move(s);
  }

  /// The starter of a collective: issues it into a request (and a scratch it writes into, for the
  /// late start of `drain_abandoned`); returns the MPI error code.
  using starter = std::function<int(MPI_Request*, std::unique_ptr<std::byte[]>&)>;

  /// Exchanges `sig` with every rank (see the file comment) and starts the collective with `go`
  /// when all agree. When the exchange times out, `h` carries the timeout_error for its wait() and
  /// the exchange is abandoned with `go`, for `drain_abandoned`.
  /// \throws comm_error naming every rank's operation when they differ (the group is then broken);
  ///         mpi_error.
  void agree_and_start(detail::mpi_comm_state& s, handle& h, detail::op_signature sig, const starter& go) const {
    const auto n = static_cast<std::size_t>(s.size);
    const std::uint64_t number = s.next_op++;
    handle x = start(s, h.op_, h.bytes_); // a timeout names the operation and its bytes
    x.scratch_ = std::make_unique<std::byte[]>((n + 1) * sizeof(sig));
    auto* sigs = reinterpret_cast<detail::op_signature*>(x.scratch_.get());
    sigs[n] = sig;
    ZERO_CHECK_MPI(MPI_Iallgather(sigs + n, detail::op_signature_fields, MPI_INT64_T, sigs, detail::op_signature_fields,
                                  MPI_INT64_T, s.check_comm, &x.request_));
    x.then_ = go;
    try {
      MPI_Status status{};
      x.poll(status);
    } catch (const timeout_error& e) {
      // Which ranks never reached this operation: the ranks that time out here hear each other.
      h.error_ = std::make_exception_ptr(
          timeout_error(std::string(e.what()).substr(std::string_view("[zero.timeout_error] ").size()) +
                        detail::arrivals_after_timeout(s, number)));
      return;
    }
    if (const std::string calls = detail::mismatched_calls({sigs, n}); !calls.empty()) {
      const std::string reason = "operation #" + std::to_string(number) + " does not match across ranks: " + calls;
      {
        const std::lock_guard lock(s.mutex);
        s.break_locked(reason);
      }
      x.reset();
      throw comm_error(reason + " (group \"" + s.name + "\"; nothing was started)");
    }
    x.reset();
    ZERO_CHECK_MPI(go(&h.request_, h.scratch_));
  }

  [[nodiscard]] detail::mpi_comm_state& state() const {
    if (!state_) {
      throw usage_error("mpi_communicator used after it was moved from");
    }
    return *state_;
  }

  // The state, for starting `op`: the group must not be broken.
  [[nodiscard]] detail::mpi_comm_state& live(const char* op) const {
    auto& s = state();
    const std::lock_guard lock(s.mutex);
    if (!s.broken_reason.empty()) {
      throw as_echo(comm_error("cannot start " + std::string(op) + " on group \"" + s.name + "\" (size " +
                               std::to_string(s.size) + ") at rank " + std::to_string(s.rank) +
                               ": the group is broken (" + s.broken_reason +
                               "); its abandoned operation is still held by MPI, so no rank can rely on " +
                               "this group any more; end the job or build a new communicator"));
    }
    return s;
  }

  [[nodiscard]] handle start(detail::mpi_comm_state& s, const char* op, std::size_t bytes) const {
    handle h;
    h.state_ = state_;
    h.op_ = op;
    h.bytes_ = bytes;
    h.timeout_ = s.timeout;
    return h;
  }

  template <class T> static void set_average(handle& h, T* data, std::size_t count) {
    h.finish_ = &detail::divide_by_size<T>;
    h.finish_data_ = data;
    h.finish_count_ = count;
  }

  [[nodiscard]] int count_of(const char* op, std::size_t count) const {
    if (count > static_cast<std::size_t>(INT_MAX)) {
      throw usage_error(std::string(op) + " on group \"" + state().name + "\": " + std::to_string(count) +
                        " elements exceed MPI's int count limit (" + std::to_string(INT_MAX) +
                        "); split the buffer into several calls");
    }
    return static_cast<int>(count);
  }

  void check_rank(const char* op, const char* what, int r) const {
    if (r < 0 || r >= state().size) {
      throw usage_error(std::string(op) + " on group \"" + state().name + "\" (size " + std::to_string(state().size) +
                        "): " + what + " " + std::to_string(r) + " is not a rank of the group");
    }
  }

  void require(const char* op, std::size_t count, const void* send, const void* recv) const {
    if (count != 0 && (send == nullptr || recv == nullptr)) {
      throw usage_error(std::string(op) + " on group \"" + state().name + "\" at rank " + std::to_string(state().rank) +
                        ": null buffer for " + std::to_string(count) + " elements");
    }
  }

  [[nodiscard]] std::string overlap_message(const char* op, const char* rule) const {
    return std::string(op) + " on group \"" + state().name + "\" at rank " + std::to_string(state().rank) +
           ": the buffers partially overlap; " + rule;
  }

  std::shared_ptr<detail::mpi_comm_state> state_;
};

static_assert(full_communicator<mpi_communicator>);
static_assert(!std::is_copy_constructible_v<mpi_communicator>);

} // namespace zero
