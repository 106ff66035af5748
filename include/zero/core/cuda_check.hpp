#pragma once
/// \file
/// Checking CUDA runtime calls: `ZERO_CHECK_CUDA(expr)` throws `zero::cuda_error` when `expr` does not
/// return `cudaSuccess`; `ZERO_CHECK_CUDA_NOTHROW(expr)` is its twin for destructors and other `noexcept`
/// code, which reports the failure on stderr and returns the status instead of throwing.
///
/// Both clear the runtime's "last error" after a failed call (as PyTorch's C10_CUDA_CHECK does), so a
/// later `ZERO_CHECK_CUDA(cudaGetLastError())` after a kernel launch does not blame the launch for an
/// earlier, already reported failure. Sticky errors (a kernel that faulted) cannot be cleared and are
/// reported again by every later call, as CUDA defines.
///
/// Host code only; compiles with a plain C++20 compiler given CUDA's include directory (link CUDA::cudart).
/// It lives in core, the bottom layer (docs/design.md), because the device and pinned allocators of
/// memory check their calls with it as the CUDA backend and the kernels do; it is the one core header
/// that needs more than the standard library, and only code that uses CUDA includes it.

#include "zero/core/error.hpp"

#include <cstdio>
#include <cuda_runtime_api.h>
#include <string>

namespace zero::detail {

/// The text of a failed CUDA call: "<expr> failed at <file:line>: <description> (<cudaErrorName>)".
[[nodiscard]] inline std::string cuda_failure_message(cudaError_t status, const char* expr,
                                                      const source_location& loc) {
  return std::string(expr) + " failed at " + where(loc) + ": " + cudaGetErrorString(status) + " (" +
         cudaGetErrorName(status) + ")";
}

/// Throws `cuda_error` for a failed call; its `status()` is the `cudaError_t`.
[[noreturn]] inline void throw_cuda_error(cudaError_t status, const char* expr, const source_location& loc) {
  (void)cudaGetLastError(); // clear the non-sticky error this call left behind
  throw cuda_error(cuda_failure_message(status, expr, loc), static_cast<int>(status));
}

/// Returns `status` when it is `cudaSuccess`, otherwise throws `cuda_error` naming `expr` and `loc`.
/// \throws cuda_error carrying the `cudaError_t`.
inline cudaError_t check_cuda(cudaError_t status, const char* expr, const source_location& loc) {
  if (status != cudaSuccess) [[unlikely]] {
    throw_cuda_error(status, expr, loc);
  }
  return status;
}

/// Reports a failed call on stderr ("[zero.cuda_error] ... (not thrown: noexcept context)") and returns
/// `status`; never throws. For destructors and `deallocate`, which must not throw.
inline cudaError_t check_cuda_nothrow(cudaError_t status, const char* expr, const source_location& loc) noexcept {
  if (status != cudaSuccess) [[unlikely]] {
    (void)cudaGetLastError();
    // fprintf, not iostreams: usable during static destruction and allocates nothing.
    std::fprintf(stderr, "[zero.cuda_error] %s failed at %s:%u: %s (%s) (not thrown: noexcept context)\n", expr,
                 loc.file_name(), static_cast<unsigned>(loc.line()), cudaGetErrorString(status),
                 cudaGetErrorName(status));
  }
  return status;
}

} // namespace zero::detail

/// Evaluates the CUDA runtime call `expr`; when it does not return `cudaSuccess`, throws `zero::cuda_error`
/// whose `what()` is "[zero.cuda_error] <expr> failed at <file:line>: <cudaGetErrorString> (<cudaErrorName>)"
/// and whose `status()` is the `cudaError_t`. Evaluates to the (successful) `cudaError_t`.
#define ZERO_CHECK_CUDA(expr) ::zero::detail::check_cuda((expr), #expr, ::zero::detail::source_location::current())

/// The non-throwing twin of `ZERO_CHECK_CUDA` for destructors and other `noexcept` code: on failure it
/// prints the same message to stderr, clears the non-sticky error, and evaluates to the `cudaError_t`.
#define ZERO_CHECK_CUDA_NOTHROW(expr)                                                                                  \
  ::zero::detail::check_cuda_nothrow((expr), #expr, ::zero::detail::source_location::current())
