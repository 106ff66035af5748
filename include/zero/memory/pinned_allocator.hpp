#pragma once
/// \file
/// Page-locked ("pinned") host memory for offloaded model state and staging buffers: `pinned_allocator`
/// (cudaHostAlloc / cudaFreeHost) and `caching_pinned_allocator`, the same through a `caching_pool` (see
/// device_allocator.hpp). Host code only; compiles with a plain C++20 compiler given CUDA's include
/// directory (link CUDA::cudart, as zero::cuda does).

#include "zero/core/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"
#include "zero/memory/device_allocator.hpp"

#include <cstddef>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <memory>
#include <string>

namespace zero {

/// Pinned host memory from `cudaHostAlloc`, returned with `cudaFreeHost`. The CPU reads and writes it
/// directly; copies between it and a device run asynchronously at full PCIe/NVLink-C2C speed
/// (`cudaMemcpyAsync`, ordered by the stream given there); and, being mapped into the unified address space
/// (`cudaHostAllocMapped`), CUDA kernels may dereference the same pointer. The host must not touch a
/// buffer while work enqueued on a stream still reads or writes it.
///
/// Pinning is slow (page locking) and `cudaFreeHost` synchronizes: use `caching_pinned_allocator` in a loop.
///
/// `allocate(bytes, alignment = 256)` gives `bytes` (a 1-byte block for 0) of pinned host memory aligned to
/// `alignment`; synchronous, uninitialized. It throws usage_error if `alignment` is not a power of two;
/// memory_error naming the bytes, the flags, the current device and the CUDA error when cudaHostAlloc fails.
/// `deallocate(p, bytes, alignment)` returns `p` with `cudaFreeHost` and never throws.
///
/// A cheap handle: copies share state and may free each other's memory (`==` says whether two are copies).
/// Thread-safe.
class pinned_allocator : public detail::cuda_block_allocator<pinned_allocator> {
public:
  /// The CPU may dereference pinned memory.
  static constexpr bool host_accessible = true;
  /// CUDA kernels may too (mapped, unified addressing).
  static constexpr bool device_accessible = true;
  /// Flags used when none are given: usable from every CUDA context (portable) and mapped for kernels.
  static constexpr unsigned default_flags = cudaHostAllocPortable | cudaHostAllocMapped;

  /// An allocator passing `flags` (a combination of `cudaHostAlloc*` flags) to `cudaHostAlloc`.
  explicit pinned_allocator(unsigned flags = default_flags) : flags_(flags) {}

  /// The `cudaHostAlloc` flags this allocator passes.
  [[nodiscard]] unsigned flags() const noexcept { return flags_; }

private:
  friend class detail::cuda_block_allocator<pinned_allocator>;
  static constexpr const char* name = "pinned_allocator";

  void* raw_allocate(std::size_t bytes) const {
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, flags_);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      int device = -1;
      if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
      }
      char flags[16];
      std::snprintf(flags, sizeof(flags), "0x%x", flags_);
      throw memory_error("pinned_allocator: cudaHostAlloc of " + detail::describe_bytes(bytes) + " (flags " + flags +
                             ") with device " + std::to_string(device) +
                             " current failed: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ")",
                         static_cast<int>(status));
    }
    return p;
  }

  static void raw_free(void* p) noexcept { ZERO_CHECK_CUDA_NOTHROW(cudaFreeHost(p)); }

  unsigned flags_;
};

static_assert(allocator<pinned_allocator>);
static_assert(host_allocator_policy<pinned_allocator> && device_allocator_policy<pinned_allocator>);

/// Pinned host memory through a caching pool: staging and offload buffers reused step after step.
using caching_pinned_allocator = caching_pool<pinned_allocator>;

static_assert(allocator<caching_pinned_allocator>);
static_assert(host_allocator_policy<caching_pinned_allocator> && device_allocator_policy<caching_pinned_allocator>);

} // namespace zero
