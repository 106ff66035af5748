#pragma once
/// \file
/// The state an `mpi_communicator` shares with its handles: the MPI communicator, the group's identity and
/// timeout, whether the group is broken, and the operations a timeout abandoned to MPI (see "Timeouts" in
/// zero/comm/mpi_communicator.hpp). Internal to `mpi_communicator`.

#include "zero/comm/communicator.hpp"
#include "zero/comm/mpi_check.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mpi.h>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

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

} // namespace zero::detail
