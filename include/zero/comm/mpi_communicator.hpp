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

#include "zero/comm/communicator.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mpi.h>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero::detail {

/// The text of an MPI error code, e.g. "MPI_ERR_RANK: invalid rank".
[[nodiscard]] inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS || length <= 0) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text, static_cast<std::size_t>(length));
}

/// Throws `mpi_error` when `code` is not `MPI_SUCCESS`; what() names the call, where it was made,
/// the world rank (when MPI is running) and MPI's error string; status() is `code`.
inline void check_mpi(int code, const char* call, const source_location& loc) {
  if (code == MPI_SUCCESS) {
    return;
  }
  std::string message = std::string(call) + " failed at " + where(loc);
  int initialized = 0;
  int finalized = 1;
  int world_rank = -1;
  if (MPI_Initialized(&initialized) == MPI_SUCCESS && initialized && MPI_Finalized(&finalized) == MPI_SUCCESS &&
      !finalized && MPI_Comm_rank(MPI_COMM_WORLD, &world_rank) == MPI_SUCCESS) {
    message += " on world rank " + std::to_string(world_rank);
  }
  throw mpi_error(message + ": " + mpi_error_text(code), code);
}

/// The non-throwing twin of `check_mpi`, for destructors: true when `code` is `MPI_SUCCESS`.
[[nodiscard]] constexpr bool mpi_succeeded(int code) noexcept { return code == MPI_SUCCESS; }

} // namespace zero::detail

#ifndef ZERO_CHECK_MPI
/// Evaluates an MPI call and throws `zero::mpi_error` (status(): the MPI error code) naming the
/// call, file:line and MPI's error string when it does not return `MPI_SUCCESS`. The communicator
/// it runs on must have `MPI_ERRORS_RETURN` (as `mpi_communicator` sets), or MPI aborts first.
#define ZERO_CHECK_MPI(expr) ::zero::detail::check_mpi((expr), #expr, ::zero::detail::source_location::current())
#endif

namespace zero {

namespace detail {

template <class T> inline constexpr bool always_false_v = false;

/// Commits a 2-byte datatype named `name` for f16 or bf16 storage.
inline MPI_Datatype make_half_datatype(const char* name) {
  MPI_Datatype type = MPI_DATATYPE_NULL;
  ZERO_CHECK_MPI(MPI_Type_contiguous(1, MPI_UINT16_T, &type));
  ZERO_CHECK_MPI(MPI_Type_set_name(type, name));
  ZERO_CHECK_MPI(MPI_Type_commit(&type));
  return type;
}

/// The MPI datatype of an element type. f16 and bf16 get their own committed datatypes, created
/// on first use and never freed: they must stay valid until `MPI_Finalize`, which reclaims them
/// (freeing them from a static destructor would run after `MPI_Finalize`, which is erroneous).
template <class T> [[nodiscard]] MPI_Datatype mpi_datatype() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return MPI_FLOAT;
  } else if constexpr (std::is_same_v<U, double>) {
    return MPI_DOUBLE;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return MPI_INT32_T;
  } else if constexpr (std::is_same_v<U, std::int64_t>) {
    return MPI_INT64_T;
  } else if constexpr (std::is_same_v<U, std::uint8_t>) {
    return MPI_UINT8_T;
  } else if constexpr (std::is_same_v<U, f16>) {
    static const MPI_Datatype type = make_half_datatype("zero_f16");
    return type;
  } else if constexpr (std::is_same_v<U, bf16>) {
    static const MPI_Datatype type = make_half_datatype("zero_bf16");
    return type;
  } else {
    static_assert(always_false_v<U>, "mpi_communicator has no MPI datatype for this element type; use float, double, "
                                     "zero::f16, zero::bf16, int32_t, int64_t or uint8_t");
  }
}

/// `MPI_User_function` for f16/bf16: inout[i] = in[i] (+ or max) inout[i], computed in float and
/// rounded once per step to nearest even, as NCCL does for half types. Max propagates NaN.
template <class T, bool Max> void half_reduce(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    const float x = to_float(a[i]);
    const float y = to_float(b[i]);
    if constexpr (Max) {
      b[i] = (x > y || x != x) ? a[i] : b[i];
    } else {
      b[i] = from_float<T>(x + y);
    }
  }
}

/// The commutative user-defined op for f16/bf16 sum or max, created once and never freed (as
/// the datatypes above).
template <class T, bool Max> [[nodiscard]] MPI_Op half_op() {
  static const MPI_Op op = [] {
    MPI_Op created = MPI_OP_NULL;
    ZERO_CHECK_MPI(MPI_Op_create(&half_reduce<T, Max>, 1, &created));
    return created;
  }();
  return op;
}

/// The MPI op that computes `op` on `T`; avg sums here and divides when the operation completes.
template <class T> [[nodiscard]] MPI_Op mpi_reduce_op(reduce_op op) {
  const bool max = op == reduce_op::max;
  if constexpr (is_half_v<std::remove_cv_t<T>>) {
    return max ? half_op<std::remove_cv_t<T>, true>() : half_op<std::remove_cv_t<T>, false>();
  } else {
    return max ? MPI_MAX : MPI_SUM;
  }
}

/// Divides `count` elements of `T` at `data` by `size`: the second half of avg. Halves divide in
/// float and round once; integers truncate toward zero.
template <class T> void divide_by_size(void* data, std::size_t count, int size) noexcept {
  T* p = static_cast<T*>(data);
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (is_half_v<T>) {
      p[i] = from_float<T>(to_float(p[i]) / static_cast<float>(size));
    } else {
      p[i] = static_cast<T>(p[i] / static_cast<T>(size));
    }
  }
}

/// True when the byte ranges [a, a+a_bytes) and [b, b+b_bytes) share a byte.
[[nodiscard]] inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) noexcept {
  const auto x = reinterpret_cast<std::uintptr_t>(a);
  const auto y = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && x < y + b_bytes && y < x + a_bytes;
}

/// What every `mpi_communicator` moved from the same one, and every handle it returned, share: the
/// MPI communicator, the group's identity, the timeout, and what a timeout left behind.
struct mpi_comm_state {
  /// An operation abandoned by a timeout: its request is still active in MPI, so it and the
  /// scratch buffer MPI may write into are kept here instead of being freed.
  struct abandoned_op {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<std::byte[]> scratch;
    /// For the exchange of operation descriptions that precedes a collective: starts that
    /// collective (its request and any scratch it writes into) once the exchange completes late.
    std::function<int(MPI_Request*, std::unique_ptr<std::byte[]>&)> then;
  };

  mpi_comm_state(MPI_Comm c, bool own, std::string n) : comm(c), owns(own), name(std::move(n)) {}
  mpi_comm_state(const mpi_comm_state&) = delete;
  mpi_comm_state& operator=(const mpi_comm_state&) = delete;

  /// Frees an owned communicator (`MPI_Comm_free` is legal with pending operations: they
  /// complete normally). Scratch of still-active abandoned operations is leaked on purpose.
  ~mpi_comm_state() {
    int finalized = 1;
    if (!mpi_succeeded(MPI_Finalized(&finalized)) || finalized) {
      return; // MPI is gone: it writes nothing any more and has reclaimed its objects.
    }
    for (abandoned_op& op : abandoned) {
      int done = 0;
      if (op.request != MPI_REQUEST_NULL && mpi_succeeded(MPI_Test(&op.request, &done, MPI_STATUS_IGNORE)) && !done) {
        static_cast<void>(op.scratch.release());
      }
    }
    if (check_comm != MPI_COMM_NULL) {
      static_cast<void>(mpi_succeeded(MPI_Comm_free(&check_comm)));
    }
    if (owns && comm != MPI_COMM_NULL) {
      static_cast<void>(mpi_succeeded(MPI_Comm_free(&comm)));
    }
  }

  /// Marks the group broken for `reason` (the first reason stays). Call with `mutex` held.
  void break_locked(std::string reason) {
    if (broken_reason.empty()) {
      broken_reason = std::move(reason);
    }
    broken.store(true, std::memory_order_release);
  }

  MPI_Comm comm;
  bool owns;
  std::string name;
  MPI_Comm check_comm = MPI_COMM_NULL; // owned duplicate of comm: the operation descriptions
  std::uint64_t next_op = 0;           // number of the next collective, for messages
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout = default_comm_timeout;

  std::atomic<bool> broken{false}; // set with broken_reason; read without the mutex by waits
  std::mutex mutex;                // guards broken_reason and abandoned
  std::string broken_reason;       // empty while the group is usable
  std::vector<abandoned_op> abandoned;
};

} // namespace detail

/// A communicator over an MPI intra-communicator; satisfies `zero::full_communicator`.
///
/// Cheap to move, not copyable. Moved-from communicators throw `usage_error` from every member.
/// All operations are asynchronous and return a `handle` (see the file comment for timeouts).
class mpi_communicator {
public:
  /// An operation in flight. `wait()` completes it or throws; the destructor waits without
  /// throwing, so a handle dropped without `wait()` neither leaks nor leaves MPI writing into
  /// freed memory (it may block up to the timeout). Movable, not copyable. A default-constructed,
  /// moved-from or already waited handle is complete and `wait()` returns at once.
  class handle {
  public:
    /// An empty handle: complete, `wait()` returns at once.
    handle() = default;
    /// Not copyable: one operation has one owner.
    handle(const handle&) = delete;
    /// Not copyable: one operation has one owner.
    handle& operator=(const handle&) = delete;

    /// Takes over `other`'s operation; `other` becomes complete.
    handle(handle&& other) noexcept { take(other); }

    /// Completes this handle's own operation (without throwing), then takes over `other`'s.
    handle& operator=(handle&& other) noexcept {
      if (this != &other) {
        wait_nothrow();
        take(other);
      }
      return *this;
    }

    /// Waits without throwing; see the class comment.
    ~handle() { wait_nothrow(); }

    /// Blocks until the local part of the operation is complete: the receive buffer holds the
    /// result and the send buffer may be reused. Polls `MPI_Test`, yielding the CPU after a short
    /// spin; the timeout (the communicator's when the operation started) counts from this call.
    /// \throws timeout_error (message from `detail::timeout_message`) when the timeout passes;
    ///         the group is then broken, see the file comment.
    /// \throws mpi_error when MPI reports an error for the operation.
    /// \throws usage_error when a `recv` got a different number of elements than it asked for.
    void wait() {
      if (!state_) {
        return;
      }
      if (error_) {
        const std::exception_ptr e = error_;
        reset();
        std::rethrow_exception(e);
      }
      MPI_Status status{};
      if (request_ != MPI_REQUEST_NULL) {
        poll(status);
      }
      if (expected_ >= 0) {
        int got = 0;
        try {
          ZERO_CHECK_MPI(MPI_Get_count(&status, type_, &got));
        } catch (...) {
          reset();
          throw;
        }
        if (got != expected_) {
          const std::string message = std::string(op_) + " on group \"" + state_->name + "\" at rank " +
                                      std::to_string(state_->rank) + " asked for " + std::to_string(expected_) +
                                      " elements from rank " + std::to_string(status.MPI_SOURCE) + " but got " +
                                      std::to_string(got) + "; send and recv counts must match";
          reset();
          throw usage_error(message);
        }
      }
      if (copy_to_ != nullptr && copy_bytes_ != 0) {
        std::memcpy(copy_to_, scratch_.get(), copy_bytes_);
      }
      if (finish_ != nullptr) {
        finish_(finish_data_, finish_count_, state_->size);
      }
      reset();
    }

  private:
    friend class mpi_communicator;

    void poll(MPI_Status& status) {
      using clock = std::chrono::steady_clock;
      const auto start = clock::now();
      const auto deadline = start + timeout_;
      for (unsigned polls = 0;; ++polls) {
        int done = 0;
        try {
          ZERO_CHECK_MPI(MPI_Test(&request_, &done, &status));
        } catch (...) {
          abandon();
          throw;
        }
        if (done) {
          return;
        }
        // Spin briefly for latency, then give the core away: under `--oversubscribe` the rank we
        // wait for may need this very core to make progress.
        if (polls < 64) {
          continue;
        }
        const auto now = clock::now();
        if (now >= deadline) {
          timed_out();
        }
        if (state_->broken.load(std::memory_order_acquire)) {
          // Another wait timed out (or the ranks disagreed): its error names the cause, and waiting
          // out a fresh timeout here would only delay it, so a drain of N handles waits one timeout.
          broken_while_waiting();
        }
        if (now - start < std::chrono::milliseconds(20)) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    }

    [[noreturn]] void timed_out() {
      const std::string message =
          detail::timeout_message(op_, state_->name, state_->rank, state_->size, bytes_, timeout_);
      {
        const std::lock_guard lock(state_->mutex);
        state_->break_locked(std::string(op_) + " timed out after " + std::to_string(timeout_.count()) + " ms");
      }
      abandon();
      throw timeout_error(message);
    }

    [[noreturn]] void broken_while_waiting() {
      std::string reason;
      {
        const std::lock_guard lock(state_->mutex);
        reason = state_->broken_reason;
      }
      const std::string message = std::string(op_) + " on group \"" + state_->name + "\" (size " +
                                  std::to_string(state_->size) + ") at rank " + std::to_string(state_->rank) +
                                  " cannot complete: the group broke while it waited (" + reason + ")";
      abandon();
      throw as_echo(comm_error(message));
    }

    // Hands a request that may still be active, and the scratch it may write into, to the shared
    // state (MPI forbids freeing or cancelling an active collective request), then resets.
    void abandon() noexcept {
      if (request_ != MPI_REQUEST_NULL) {
        try {
          const std::lock_guard lock(state_->mutex);
          state_->abandoned.push_back({request_, std::move(scratch_), std::move(then_)});
        } catch (...) {
          static_cast<void>(scratch_.release()); // no room to keep it: leak rather than free under MPI
        }
      }
      request_ = MPI_REQUEST_NULL;
      reset();
    }

    void wait_nothrow() noexcept {
      int finalized = 0;
      if (state_ && (!detail::mpi_succeeded(MPI_Finalized(&finalized)) || finalized)) {
        // Destroyed after MPI_Finalize (a caller's mistake): no MPI call is legal any more, and
        // MPI writes nothing any more, so the scratch can go.
        request_ = MPI_REQUEST_NULL;
        reset();
        return;
      }
      try {
        wait();
      } catch (...) {
        // A destructor must not throw; wait() has already abandoned or reset the operation.
        static_cast<void>(0);
      }
    }

    void reset() noexcept {
      state_.reset();
      request_ = MPI_REQUEST_NULL;
      scratch_.reset();
      copy_to_ = nullptr;
      copy_bytes_ = 0;
      finish_ = nullptr;
      finish_data_ = nullptr;
      finish_count_ = 0;
      expected_ = -1;
      error_ = nullptr;
      then_ = nullptr;
    }

    void take(handle& other) noexcept {
      state_ = std::move(other.state_);
      request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
      op_ = other.op_;
      bytes_ = other.bytes_;
      timeout_ = other.timeout_;
      scratch_ = std::move(other.scratch_);
      copy_to_ = std::exchange(other.copy_to_, nullptr);
      copy_bytes_ = std::exchange(other.copy_bytes_, 0);
      finish_ = std::exchange(other.finish_, nullptr);
      finish_data_ = std::exchange(other.finish_data_, nullptr);
      finish_count_ = std::exchange(other.finish_count_, 0);
      type_ = other.type_;
      expected_ = std::exchange(other.expected_, -1);
      error_ = std::exchange(other.error_, nullptr);
      then_ = std::exchange(other.then_, nullptr);
    }

    std::shared_ptr<detail::mpi_comm_state> state_; // null once complete
    MPI_Request request_ = MPI_REQUEST_NULL;
    const char* op_ = "";
    std::size_t bytes_ = 0;
    std::chrono::milliseconds timeout_{0};
    std::unique_ptr<std::byte[]> scratch_; // owned buffer MPI writes into, when the op needs one
    void* copy_to_ = nullptr;              // on completion, copy_bytes_ of scratch_ go here
    std::size_t copy_bytes_ = 0;
    void (*finish_)(void*, std::size_t, int) noexcept = nullptr; // on completion, e.g. avg's division
    void* finish_data_ = nullptr;
    std::size_t finish_count_ = 0;
    MPI_Datatype type_ = MPI_DATATYPE_NULL; // for recv's count check
    int expected_ = -1;                     // elements a recv must get; -1: no check
    std::exception_ptr error_;              // the start failed (its exchange timed out): wait() throws it
    std::function<int(MPI_Request*, std::unique_ptr<std::byte[]>&)> then_; // see abandoned_op::then
  };

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
    } catch (const timeout_error&) {
      h.error_ = std::current_exception();
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
