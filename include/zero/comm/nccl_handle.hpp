#pragma once
/// \file
/// `nccl_handle`, an operation of an `nccl_communicator` in flight (`nccl_communicator::handle`): the
/// completion event recorded on the communication stream after the NCCL call, and the shared state that
/// `wait()` polls for NCCL's errors, the other ranks and the timeout.

#include "zero/comm/detail/nccl_state.hpp"
#include "zero/core/error.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <memory>
#include <nccl.h>
#include <string>
#include <utility>

namespace zero {

/// An operation of an `nccl_communicator` in flight: `wait()` blocks the host until it is complete (see
/// "Streams and ordering" in zero/comm/nccl_communicator.hpp).
/// Dropping a handle without `wait()` is allowed: the operation still completes in stream order, and
/// the destructor does not block. Movable, not copyable.
class nccl_handle {
public:
  /// An empty handle: complete, `wait()` returns at once.
  nccl_handle() = default;
  /// The operation `op` of `bytes` bytes whose completion `done` marks on the communication stream of
  /// `s`; `done` comes from `s`'s event pool and goes back to it. Made by `nccl_communicator`.
  nccl_handle(std::shared_ptr<detail::nccl_state> s, cudaEvent_t done, std::string op, std::size_t bytes)
      : s_(std::move(s)), done_(done), op_(std::move(op)), bytes_(bytes) {}
  /// Takes over `o`'s operation; `o` becomes complete.
  nccl_handle(nccl_handle&& o) noexcept
      : s_(std::move(o.s_)), done_(std::exchange(o.done_, nullptr)), op_(std::move(o.op_)), bytes_(o.bytes_) {}
  /// Lets go of this handle's operation (without waiting) and takes over `o`'s.
  nccl_handle& operator=(nccl_handle&& o) noexcept {
    release();
    s_ = std::move(o.s_);
    done_ = std::exchange(o.done_, nullptr);
    op_ = std::move(o.op_);
    bytes_ = o.bytes_;
    return *this;
  }
  /// Not copyable: one operation has one owner.
  nccl_handle(const nccl_handle&) = delete;
  /// Not copyable, as above.
  nccl_handle& operator=(const nccl_handle&) = delete;
  /// Gives the completion event back; does not wait (see the class comment).
  ~nccl_handle() { release(); }

  /// Blocks the host until the operation is complete: its buffers may then be used by the host and by
  /// work on any stream. Polls the completion event; NCCL's error state, the other ranks of a
  /// `run_gpus` group and the clock are looked at every 64 polls.
  /// \throws timeout_error when the communicator's timeout passes first; nccl_error when NCCL reported
  ///         a failure; comm_error when the communicator was aborted earlier or another rank of a
  ///         `run_gpus` group failed; in each case the communicator is aborted first. cuda_error when the
  ///         event query fails (a sticky CUDA error).
  void wait() {
    if (done_ == nullptr) {
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) {
        release();
        return;
      }
      if (q != cudaErrorNotReady) {
        (void)cudaGetLastError();
        throw cuda_error(op_ + " at rank " + std::to_string(s_->rank) + ": " + cudaGetErrorString(q),
                         static_cast<int>(q));
      }
      // NCCL's error state, the peers and the clock are looked at every 64 polls: the event query alone
      // is what keeps the latency of a finished collective low.
      if (spins % 64 == 63) {
        if (s_->aborted.load()) {
          throw comm_error(op_ + " at rank " + std::to_string(s_->rank) + ": the communicator was aborted (" +
                           s_->reason() + ")");
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(s_->comm, &st) == ncclSuccess && st != ncclSuccess && st != ncclInProgress) {
          s_->fail_nccl(op_, bytes_, st);
        }
        s_->check_deadline(op_, bytes_, start);
        detail::nccl_state::pause(std::chrono::steady_clock::now() - start);
      }
    }
  }

private:
  void release() noexcept {
    if (done_ != nullptr) {
      s_->give_event(done_);
      done_ = nullptr;
    }
  }
  std::shared_ptr<detail::nccl_state> s_;
  cudaEvent_t done_ = nullptr;
  std::string op_;
  std::size_t bytes_ = 0;
};

} // namespace zero
