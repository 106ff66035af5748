#pragma once
/// \file
/// The state an `mpi_communicator` shares with its handles: the MPI communicator, the group's identity and
/// timeout, whether the group is broken, and the operations a timeout abandoned to MPI (see "Timeouts" in
/// zero/comm/mpi_communicator.hpp). Internal to `mpi_communicator`.

#include "zero/comm/communicator.hpp"
#include "zero/comm/mpi_check.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mpi.h>
#include <mutex>
#include <string>
#include <thread>
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

  /// The operation numbers this rank sent its peers when a description exchange timed out
  /// (`arrivals_after_timeout`): their sends may still be in flight, so the values live here.
  std::vector<std::unique_ptr<std::int64_t>> arrival_notes;

  std::atomic<bool> broken{false}; // set with broken_reason; read without the mutex by waits
  std::mutex mutex;                // guards broken_reason, abandoned and arrival_notes
  std::string broken_reason;       // empty while the group is usable
  std::vector<abandoned_op> abandoned;
};

/// After this rank's exchange of the descriptions of operation `number` timed out: tells every other
/// rank of `s` that it reached that operation (one int64 on the description communicator, tag
/// `arrival_tag`) and listens for theirs for a twentieth of the timeout (at least 10 ms). The ranks
/// that time out on the same operation hear each other; a rank that stopped, died or never called
/// says nothing. Never throws.
/// \returns "; ranks not heard from at operation #7 within 15 ms of the timeout: 1, 3" (and ranks
///          heard at another operation, with theirs), or an empty string when every rank was heard at it.
inline std::string arrivals_after_timeout(mpi_comm_state& s, std::uint64_t number) noexcept {
  constexpr int arrival_tag = 0x7a65;
  try {
    if (s.size <= 1) {
      return {};
    }
    auto note = std::make_unique<std::int64_t>(static_cast<std::int64_t>(number));
    for (int p = 0; p < s.size; ++p) {
      MPI_Request request = MPI_REQUEST_NULL;
      if (p != s.rank && mpi_succeeded(MPI_Isend(note.get(), 1, MPI_INT64_T, p, arrival_tag, s.check_comm, &request))) {
        static_cast<void>(mpi_succeeded(MPI_Request_free(&request))); // completes on its own; `note` outlives it
      }
    }
    {
      const std::lock_guard lock(s.mutex);
      s.arrival_notes.push_back(std::move(note));
    }
    const auto listen = std::max(s.timeout / 20, std::chrono::milliseconds(10));
    const auto deadline = std::chrono::steady_clock::now() + listen;
    std::vector<std::int64_t> at(static_cast<std::size_t>(s.size), -1);
    at[static_cast<std::size_t>(s.rank)] = static_cast<std::int64_t>(number);
    int heard = 1;
    while (heard < s.size && std::chrono::steady_clock::now() < deadline) {
      int flag = 0;
      MPI_Status status{};
      if (!mpi_succeeded(MPI_Iprobe(MPI_ANY_SOURCE, arrival_tag, s.check_comm, &flag, &status))) {
        break;
      }
      if (!flag) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      std::int64_t theirs = -1;
      if (!mpi_succeeded(
              MPI_Recv(&theirs, 1, MPI_INT64_T, status.MPI_SOURCE, arrival_tag, s.check_comm, MPI_STATUS_IGNORE))) {
        break;
      }
      auto& slot = at[static_cast<std::size_t>(status.MPI_SOURCE)];
      heard += slot < 0 ? 1 : 0;
      slot = std::max(slot, theirs);
    }
    std::string absent, elsewhere;
    for (int p = 0; p < s.size; ++p) {
      const std::int64_t v = at[static_cast<std::size_t>(p)];
      if (v < 0) {
        absent += (absent.empty() ? "" : ", ") + std::to_string(p);
      } else if (v != static_cast<std::int64_t>(number)) {
        elsewhere += (elsewhere.empty() ? "" : ", ") + std::to_string(p) + " (at operation #" + std::to_string(v) + ")";
      }
    }
    std::string out;
    if (!absent.empty()) {
      out += "; ranks not heard from at operation #" + std::to_string(number) + " within " +
             std::to_string(listen.count()) + " ms of the timeout (stopped, lost, or not there yet): " + absent;
    }
    if (!elsewhere.empty()) {
      out += "; ranks that timed out at another operation: " + elsewhere;
    }
    return out;
  } catch (...) { // NOLINT(bugprone-empty-catch): only the report is lost
    return {};
  }
}

} // namespace zero::detail
