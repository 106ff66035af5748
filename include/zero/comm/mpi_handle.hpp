#pragma once
/// \file
/// `mpi_handle`, an operation of an `mpi_communicator` in flight (`mpi_communicator::handle`): the MPI
/// request, the scratch MPI writes into, and what completes the operation on the host (the copy out of
/// an in-place reduce-scatter, avg's division, recv's count check).

#include "zero/comm/communicator.hpp"
#include "zero/comm/detail/mpi_state.hpp"
#include "zero/comm/mpi_check.hpp"
#include "zero/core/error.hpp"

#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mpi.h>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace zero {

class mpi_communicator;

/// An operation of an `mpi_communicator` in flight. `wait()` completes it or throws; the destructor
/// waits without throwing, so a handle dropped without `wait()` neither leaks nor leaves MPI writing
/// into freed memory (it may block up to the timeout). Movable, not copyable. A default-constructed,
/// moved-from or already waited handle is complete and `wait()` returns at once.
class mpi_handle {
public:
  /// An empty handle: complete, `wait()` returns at once.
  mpi_handle() = default;
  /// Not copyable: one operation has one owner.
  mpi_handle(const mpi_handle&) = delete;
  /// Not copyable: one operation has one owner.
  mpi_handle& operator=(const mpi_handle&) = delete;

  /// Takes over `other`'s operation; `other` becomes complete.
  mpi_handle(mpi_handle&& other) noexcept { take(other); }

  /// Completes this handle's own operation (without throwing), then takes over `other`'s.
  mpi_handle& operator=(mpi_handle&& other) noexcept {
    if (this != &other) {
      wait_nothrow();
      take(other);
    }
    return *this;
  }

  /// Waits without throwing; see the class comment.
  ~mpi_handle() { wait_nothrow(); }

  /// Blocks until the local part of the operation is complete: the receive buffer holds the
  /// result and the send buffer may be reused. Polls `MPI_Test`, yielding the CPU after a short
  /// spin; the timeout (the communicator's when the operation started) counts from this call.
  /// \throws timeout_error (message from `detail::timeout_message`) when the timeout passes;
  ///         the group is then broken, see "Timeouts" in zero/comm/mpi_communicator.hpp.
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
  friend class mpi_communicator; // starts the operations and fills the handle's fields

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

  void take(mpi_handle& other) noexcept {
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

} // namespace zero
