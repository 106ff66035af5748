#pragma once
/// \file
/// The exception hierarchy of zero. Every error the library throws derives from `zero::error`;
/// `what()` starts with an id such as `[zero.config_error]` and then names the key, file, rank or
/// operation involved, so a log line alone says what was wrong and what was expected.

#include "zero/core/source_location.hpp"

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace zero {

/// Base of every exception zero throws.
class error : public std::runtime_error {
public:
  /// \param id      short identifier, e.g. "config_error"; `what()` starts with "[zero.<id>] ".
  /// \param message what went wrong and what was expected.
  /// \param status  the native status code (CUDA, NCCL, MPI, errno), 0 when there is none.
  error(std::string_view id, const std::string& message, int status = 0)
      : std::runtime_error("[zero." + std::string(id) + "] " + message), id_(id), status_(status) {}

  /// The id without the "zero." prefix, e.g. "timeout_error".
  [[nodiscard]] const std::string& id() const noexcept { return id_; }
  /// The native status code carried by the error, 0 when there is none.
  [[nodiscard]] int status() const noexcept { return status_; }

  /// True when this error only reports that another rank failed first (a broken group, a phase
  /// another rank did not complete): the other rank's exception names the cause.
  [[nodiscard]] bool echo() const noexcept { return echo_; }
  /// Marks this error as an echo of another rank's failure (see `echo()`).
  void mark_echo() noexcept { echo_ = true; }

  /// Names the rank the error happened on: what() becomes "[zero.<id>] rank <rank>: ...". Used by
  /// `run_ranks` on the exception it rethrows.
  /// \throws std::bad_alloc only.
  void name_rank(int rank) {
    // The message stays in std::runtime_error, whose copies share it and cannot throw, so copying
    // the exception (as std::exception_ptr and rethrow do) cannot throw either.
    const std::string tag = "[zero." + id_ + "] ";
    std::string text = what();
    text.insert(tag.size(), "rank " + std::to_string(rank) + ": ");
    static_cast<std::runtime_error&>(*this) = std::runtime_error(text);
  }

  /// Appends " (<note>)" to the message, keeping the exception's type: `run_ranks` says which ranks
  /// it left running. \throws std::bad_alloc only.
  void append_note(std::string_view note) {
    std::string text = what();
    text.append(" (").append(note).append(")");
    static_cast<std::runtime_error&>(*this) = std::runtime_error(text);
  }

private:
  std::string id_;
  int status_;
  bool echo_ = false;
};

/// Returns `e` marked as an echo of another rank's failure: `throw as_echo(comm_error(...))`.
template <class E> [[nodiscard]] E as_echo(E e) {
  e.mark_echo();
  return e;
}

#define ZERO_DEFINE_ERROR(name)                                                                                        \
  class name : public ::zero::error {                                                                                  \
  public:                                                                                                              \
    explicit name(const std::string& message, int status = 0) : ::zero::error(#name, message, status) {}               \
  }

/// A configuration value that is unknown, of the wrong type, out of range or not supported.
ZERO_DEFINE_ERROR(config_error);
/// A CUDA runtime call failed; status() is the cudaError_t.
ZERO_DEFINE_ERROR(cuda_error);
/// An NCCL call failed; status() is the ncclResult_t.
ZERO_DEFINE_ERROR(nccl_error);
/// An MPI call failed; status() is the MPI error code.
ZERO_DEFINE_ERROR(mpi_error);
/// A file or device could not be read or written; status() is errno where there is one.
ZERO_DEFINE_ERROR(io_error);
/// A collective or point-to-point operation did not complete within the communicator's timeout.
ZERO_DEFINE_ERROR(timeout_error);
/// A checkpoint is missing, truncated, corrupt or does not fit the model.
ZERO_DEFINE_ERROR(checkpoint_error);
/// An allocator could not provide the bytes asked for.
ZERO_DEFINE_ERROR(memory_error);
/// The library was used against its contract: a wrong shape, a call in the wrong state, a bad rank.
ZERO_DEFINE_ERROR(usage_error);
/// A communicator group is unusable because an earlier operation on it failed or timed out.
ZERO_DEFINE_ERROR(comm_error);

#undef ZERO_DEFINE_ERROR

namespace detail {
/// "file:line" of a source location, for messages about where a native call failed.
inline std::string where(const source_location& loc) {
  std::string_view file = loc.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  return std::string(file) + ":" + std::to_string(loc.line());
}
} // namespace detail

} // namespace zero
