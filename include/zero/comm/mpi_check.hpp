#pragma once
/// \file
/// Checking MPI calls: `ZERO_CHECK_MPI(expr)` throws `zero::mpi_error` naming the call, where it was
/// made, the world rank and MPI's error string when `expr` does not return `MPI_SUCCESS`;
/// `detail::mpi_succeeded` is its non-throwing twin for destructors. The communicator a call runs on must
/// have `MPI_ERRORS_RETURN` (as `mpi_communicator` sets), or MPI aborts before the check sees the error.

#include "zero/core/error.hpp"
#include "zero/core/source_location.hpp"

#include <cstddef>
#include <mpi.h>
#include <string>

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

/// Throws `mpi_error` when `code` is not `MPI_SUCCESS`; otherwise nothing.
/// \param code the result of the MPI call.
/// \param call the call as written, for the message.
/// \param loc  where the call was made.
/// \throws mpi_error whose what() names the call, where it was made, the world rank (when MPI is
///         running) and MPI's error string, and whose status() is `code`.
inline void check_mpi(int code, const char* call, const detail::source_location& loc) {
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
