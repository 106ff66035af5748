#pragma once
/// \file
/// The state an `nccl_communicator` shares with its handles: the NCCL communicator, the communication
/// stream, a pool of completion events, and the watchdog that bounds blocking calls into NCCL. It aborts
/// the communicator on a failure or a timeout and words the errors that follow (see "Failures" in
/// zero/comm/nccl_communicator.hpp). Internal to `nccl_communicator`.

#include "zero/comm/communicator.hpp"
#include "zero/comm/nccl_check.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <memory>
#include <mutex>
#include <nccl.h>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero::detail {

/// The NCCL data type of `T`.
template <class T> [[nodiscard]] constexpr ncclDataType_t nccl_type() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) {
    return ncclFloat32;
  } else if constexpr (std::is_same_v<U, f16>) {
    return ncclFloat16;
  } else if constexpr (std::is_same_v<U, bf16>) {
    return ncclBfloat16;
  } else if constexpr (std::is_same_v<U, double>) {
    return ncclFloat64;
  } else if constexpr (std::is_same_v<U, std::int32_t>) {
    return ncclInt32;
  } else if constexpr (std::is_same_v<U, std::int64_t>) {
    return ncclInt64;
  } else {
    static_assert(std::is_same_v<U, std::uint8_t>, "zero::nccl_communicator: unsupported element type");
    return ncclUint8;
  }
}

/// The NCCL reduction of `op`.
[[nodiscard]] inline ncclRedOp_t nccl_op(reduce_op op) {
  switch (op) {
  case reduce_op::sum:
    return ncclSum;
  case reduce_op::avg:
    return ncclAvg;
  case reduce_op::max:
    return ncclMax;
  }
  return ncclSum;
}

/// What the communicator and its handles share: the NCCL communicator, the streams and a pool of events.
struct nccl_state {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::string name;
  std::chrono::milliseconds timeout{};
  std::shared_ptr<std::atomic<bool>> group_failed;
  cudaStream_t stream = nullptr;      // the communication stream (owned)
  cudaStream_t compute = nullptr;     // the stream operations are ordered after (not owned)
  cudaEvent_t produced = nullptr;     // recorded on `compute` at each call
  int* scratch = nullptr;             // one device word for barrier
  bool check_matching = false;        // compare collectives across ranks first (see "Matching")
  std::int64_t* signatures = nullptr; // device: size x op_signature_fields words, when check_matching
  std::uint64_t next_op = 0;          // number of the next collective, for mismatch messages
  bool blocking = false;              // `comm` is a blocking NCCL communicator (the fast path)
  std::atomic<bool> aborted{false};
  std::mutex events_mutex;
  std::vector<cudaEvent_t> free_events;

  // The watchdog: a blocking NCCL call (a lazy connection set-up that waits for a peer) cannot time out by
  // itself, so a thread aborts the communicator when a call has been inside NCCL longer than the timeout.
  std::mutex watch_mutex;
  std::condition_variable watch_cv;
  std::thread watchdog;
  bool watch_stop = false;
  const char* call_op = nullptr; // the NCCL call in progress, or null
  std::size_t call_bytes = 0;
  std::chrono::steady_clock::time_point call_since{};
  bool call_timed_out = false;
  std::string abort_reason; // guarded by watch_mutex

  nccl_state() = default;
  nccl_state(const nccl_state&) = delete;
  nccl_state& operator=(const nccl_state&) = delete;

  ~nccl_state() {
    if (watchdog.joinable()) {
      {
        const std::lock_guard lock(watch_mutex);
        watch_stop = true;
      }
      watch_cv.notify_all();
      watchdog.join();
    }
    const int previous = current_device();
    (void)cudaSetDevice(device);
    if (comm != nullptr) {
      if (aborted.load()) {
        // ncclCommAbort already freed it.
      } else if (blocking) {
        // Every operation enqueued has finished when the stream is idle; otherwise a peer is missing and a
        // blocking destroy could wait for it forever.
        if (stream != nullptr && cudaStreamQuery(stream) == cudaSuccess) {
          (void)ncclCommDestroy(comm);
        } else {
          (void)ncclCommAbort(comm);
        }
      } else if (!finalize_quietly()) {
        (void)ncclCommAbort(comm);
      } else {
        (void)ncclCommDestroy(comm);
      }
    }
    for (cudaEvent_t e : free_events) {
      (void)cudaEventDestroy(e);
    }
    if (produced != nullptr) {
      (void)cudaEventDestroy(produced);
    }
    if (scratch != nullptr) {
      (void)cudaFree(scratch);
    }
    if (signatures != nullptr) {
      (void)cudaFree(signatures);
    }
    if (stream != nullptr) {
      (void)cudaStreamDestroy(stream);
    }
    (void)cudaGetLastError();
    (void)cudaSetDevice(previous);
  }

  /// The calling thread's current CUDA device (0 when CUDA cannot say).
  static int current_device() noexcept {
    int d = 0;
    (void)cudaGetDevice(&d);
    return d;
  }

  /// Flushes the communicator before destruction, bounded by the timeout. False: it did not settle.
  bool finalize_quietly() noexcept {
    if (ncclCommFinalize(comm) != ncclSuccess) {
      ncclResult_t st = ncclSuccess;
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || st != ncclInProgress) {
        return false;
      }
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    ncclResult_t st = ncclInProgress;
    while (std::chrono::steady_clock::now() < deadline) {
      if (ncclCommGetAsyncError(comm, &st) != ncclSuccess || st != ncclInProgress) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return st == ncclSuccess;
  }

  /// An event from the pool, or a new one. \throws cuda_error when CUDA cannot make one.
  cudaEvent_t take_event() {
    {
      const std::lock_guard lock(events_mutex);
      if (!free_events.empty()) {
        cudaEvent_t e = free_events.back();
        free_events.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  /// Gives an event of `take_event` back to the pool.
  void give_event(cudaEvent_t e) noexcept {
    const std::lock_guard lock(events_mutex);
    free_events.push_back(e);
  }

  /// True when another rank of a `run_gpus` group failed.
  [[nodiscard]] bool peer_failed() const noexcept { return group_failed && group_failed->load(); }

  /// Aborts the communicator once (kernels stop; later operations are refused).
  void abort(std::string reason) noexcept {
    bool expected = false;
    if (aborted.compare_exchange_strong(expected, true)) {
      {
        const std::lock_guard lock(watch_mutex);
        abort_reason = std::move(reason);
      }
      (void)ncclCommAbort(comm);
    }
  }

  /// Why the communicator was aborted (empty while it was not).
  [[nodiscard]] std::string reason() {
    const std::lock_guard lock(watch_mutex);
    return abort_reason;
  }

  /// Starts the watchdog of blocking calls (see `watchdog`).
  void start_watchdog() {
    watchdog = std::thread([this] {
      std::unique_lock lock(watch_mutex);
      while (!watch_stop) {
        watch_cv.wait_for(lock, std::chrono::milliseconds(50));
        if (call_op != nullptr && !call_timed_out && std::chrono::steady_clock::now() - call_since > timeout) {
          call_timed_out = true;
          std::string text = detail::timeout_message(std::string(call_op) + " (inside the NCCL call)", name, rank, size,
                                                     call_bytes, timeout) +
                             "; the communicator was aborted";
          if (group_failed) {
            group_failed->store(true);
          }
          lock.unlock();
          abort(std::move(text));
          lock.lock();
        }
      }
    });
  }

  /// Marks the start and the end of a call into NCCL for the watchdog.
  void enter_call(const char* op, std::size_t bytes) {
    const std::lock_guard lock(watch_mutex);
    call_op = op;
    call_bytes = bytes;
    call_since = std::chrono::steady_clock::now();
  }
  /// \returns true when the watchdog aborted the communicator during the call.
  bool leave_call() {
    const std::lock_guard lock(watch_mutex);
    call_op = nullptr;
    return std::exchange(call_timed_out, false);
  }

  /// Polls until NCCL's state for this communicator is no longer in progress (a non-blocking call was
  /// enqueued, or start-up finished), or throws as `wait` does.
  void settle(const std::string& op, std::size_t bytes) {
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      ncclResult_t st = ncclInProgress;
      const ncclResult_t q = ncclCommGetAsyncError(comm, &st);
      if (q != ncclSuccess) {
        st = q;
      }
      if (st == ncclSuccess) {
        return;
      }
      if (st != ncclInProgress) {
        fail_nccl(op, bytes, st);
      }
      check_deadline(op, bytes, start);
      pause(std::chrono::steady_clock::now() - start);
    }
  }

  /// Marks the group failed, aborts, and throws `nccl_error` naming `op`, the group, the rank and `bytes`.
  [[noreturn]] void fail_nccl(const std::string& op, std::size_t bytes, ncclResult_t st) {
    std::string text = op + " on group \"" + name + "\" (size " + std::to_string(size) + ") at rank " +
                       std::to_string(rank) + " failed (" + std::to_string(bytes) + " bytes): " + nccl_text(st, comm) +
                       "; the communicator was aborted";
    if (group_failed) {
      group_failed->store(true);
    }
    abort(text);
    throw nccl_error(text, static_cast<int>(st));
  }

  /// Aborts and throws `comm_error` when another rank of the group failed, or `timeout_error` when the
  /// timeout has passed since `start`; otherwise nothing.
  void check_deadline(const std::string& op, std::size_t bytes, std::chrono::steady_clock::time_point start) {
    if (peer_failed()) {
      std::string text = op + " on group \"" + name + "\" at rank " + std::to_string(rank) +
                         " was abandoned: another rank of the group failed; the communicator was aborted";
      abort(text);
      throw comm_error(text);
    }
    if (std::chrono::steady_clock::now() - start > timeout) {
      std::string text =
          detail::timeout_message(op, name, rank, size, bytes, timeout) + "; the communicator was aborted";
      if (group_failed) {
        group_failed->store(true);
      }
      abort(text);
      throw timeout_error(text);
    }
  }

  /// Between polls: yield the core for the first 20 ms of a wait (a collective usually ends well within it,
  /// and a sleep would add the timer's slack, tens of microseconds, to every one), then sleep 50 us.
  static void pause(std::chrono::steady_clock::duration waited) {
    if (waited < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

} // namespace zero::detail
