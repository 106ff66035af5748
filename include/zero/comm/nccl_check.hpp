#pragma once
/// \file
/// Checking NCCL calls: `ZERO_CHECK_NCCL(expr)` throws `zero::nccl_error` when `expr` returns neither
/// `ncclSuccess` nor `ncclInProgress` (a call on a non-blocking communicator that is still running, whose
/// outcome `ncclCommGetAsyncError` reports later). The message names the call, where it was made, NCCL's
/// description of the result and the last error text NCCL recorded.
///
/// Host code; compiles with a plain C++20 compiler given NCCL's and CUDA's include directories (link
/// `zero::nccl`).

#include "zero/core/error.hpp"
#include "zero/core/source_location.hpp"

#include <nccl.h>
#include <string>

namespace zero::detail {

/// NCCL's description of `r`, with the last error text NCCL recorded when there is one.
/// \param r    the result of an NCCL call.
/// \param comm the communicator of the call, or null (NCCL keeps the last error per process).
/// \returns "<ncclGetErrorString> (ncclResult_t <r>)[: <ncclGetLastError>]".
[[nodiscard]] inline std::string nccl_text(ncclResult_t r, ncclComm_t comm = nullptr) {
  std::string text = std::string(ncclGetErrorString(r)) + " (ncclResult_t " + std::to_string(static_cast<int>(r)) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') {
    text += ": ";
    text += last;
  }
  return text;
}

/// Returns `r` when it is `ncclSuccess` or `ncclInProgress`, otherwise throws.
/// \param r    the result of the call.
/// \param expr the call as written, for the message.
/// \param loc  where the call was made.
/// \param comm the communicator of the call, or null (see `nccl_text`).
/// \throws nccl_error whose `what()` is "<expr> failed at <file:line>: <nccl_text>" and whose `status()` is `r`.
inline ncclResult_t check_nccl(ncclResult_t r, const char* expr, const detail::source_location& loc,
                               ncclComm_t comm = nullptr) {
  if (r != ncclSuccess && r != ncclInProgress) [[unlikely]] {
    throw nccl_error(std::string(expr) + " failed at " + where(loc) + ": " + nccl_text(r, comm), static_cast<int>(r));
  }
  return r;
}

} // namespace zero::detail

/// Evaluates the NCCL call `expr`; when it returns neither `ncclSuccess` nor `ncclInProgress`, throws
/// `zero::nccl_error` whose `what()` is "[zero.nccl_error] <expr> failed at <file:line>: <ncclGetErrorString>
/// (ncclResult_t <n>): <ncclGetLastError>" and whose `status()` is the `ncclResult_t`. Evaluates to the
/// (successful or in-progress) `ncclResult_t`.
#define ZERO_CHECK_NCCL(expr) ::zero::detail::check_nccl((expr), #expr, ::zero::detail::source_location::current())
