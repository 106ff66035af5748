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

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cuda_runtime_api.h>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <sys/mman.h>
#include <unordered_map>

namespace zero {

/// Pinned host memory from `cudaHostAlloc`, returned with `cudaFreeHost`. The CPU reads and writes it
/// directly; copies between it and a device run asynchronously at full PCIe/NVLink-C2C speed
/// (`cudaMemcpyAsync`, ordered by the stream given there); and, being mapped into the unified address space
/// (`cudaHostAllocMapped`), CUDA kernels may dereference the same pointer. The host must not touch a
/// buffer while work enqueued on a stream still reads or writes it.
///
/// Pinning is slow (page locking) and `cudaFreeHost` synchronizes: use `caching_pinned_allocator` in a loop.
///
/// With `options::huge_pages` (Linux), a block of at least `huge_page_bytes` is anonymous memory aligned to
/// 2 MiB, advised `MADV_HUGEPAGE`, then pinned with `cudaHostRegister` (portable and mapped, as the
/// default flags): the host's streaming kernels (the offloaded AdamW) then miss the TLB 512 times less
/// often. It needs transparent huge pages set to `madvise` or `always` (else the pages stay 4 KiB, still
/// pinned), and a device on which registered memory has the host's address
/// (`cudaDevAttrCanUseHostPointerForRegisteredMem`); where that is not so, and for smaller blocks, the
/// allocator uses `cudaHostAlloc` as without the option.
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

  /// Blocks of at least this many bytes go on huge pages with `options::huge_pages`.
  static constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

  struct options {
    /// Large blocks on transparent huge pages, pinned with `cudaHostRegister` (see the class comment).
    bool huge_pages = false;
  };

  /// An allocator passing `flags` (a combination of `cudaHostAlloc*` flags) to `cudaHostAlloc`.
  explicit pinned_allocator(unsigned flags = default_flags) : flags_(flags) {}

  /// The same, with `o`'s choices.
  pinned_allocator(unsigned flags, options o)
      : flags_(flags), huge_(o.huge_pages && huge_pages_usable() ? std::make_shared<huge_blocks>() : nullptr) {}

  /// The `cudaHostAlloc` flags this allocator passes.
  [[nodiscard]] unsigned flags() const noexcept { return flags_; }

  /// Whether large blocks go on huge pages: asked for, and possible on this machine and device.
  [[nodiscard]] bool huge_pages() const noexcept { return huge_ != nullptr; }

private:
  friend class detail::cuda_block_allocator<pinned_allocator>;
  static constexpr const char* name = "pinned_allocator";

  // The mappings of huge-page blocks, by the address handed out: what munmap needs back.
  struct huge_blocks {
    struct mapping {
      void* base;
      std::size_t length;
    };
    std::mutex mutex;
    std::unordered_map<void*, mapping> blocks;
  };

  static bool huge_pages_usable() noexcept {
#ifdef MADV_HUGEPAGE
    int device = 0;
    int same_address = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return same_address != 0;
#else
    return false;
#endif
  }

  // The memory_error of a failed allocation: `what` of `bytes`, the flags, the current device, `cause`.
  [[noreturn]] void fail(const char* what, std::size_t bytes, const std::string& cause, int status = 0) const {
    int device = -1;
    if (cudaGetDevice(&device) != cudaSuccess) {
      (void)cudaGetLastError();
    }
    char flags[16];
    std::snprintf(flags, sizeof(flags), "0x%x", flags_);
    throw memory_error(std::string("pinned_allocator: ") + what + " of " + detail::describe_bytes(bytes) + " (flags " +
                           flags + ") with device " + std::to_string(device) + " current failed: " + cause,
                       status);
  }

  static std::string cuda_cause(cudaError_t status) {
    return std::string(cudaGetErrorString(status)) + " (" + cudaGetErrorName(status) + ")";
  }

  // Anonymous memory on 2 MiB boundaries, advised huge and registered with CUDA.
  void* huge_allocate(std::size_t bytes) const {
#ifdef MADV_HUGEPAGE
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * huge_page_bytes) {
      fail("a huge-page block", bytes, "the size rounded to whole pages overflows the address space");
    }
    const std::size_t length = (bytes + huge_page_bytes - 1) / huge_page_bytes * huge_page_bytes + huge_page_bytes;
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      fail("a huge-page block", bytes, std::string("mmap: ") + std::strerror(errno));
    }
    const auto addr = reinterpret_cast<std::uintptr_t>(base);
    auto* p = reinterpret_cast<void*>((addr + huge_page_bytes - 1) & ~(huge_page_bytes - 1));
    const std::size_t used = length - huge_page_bytes;
    // Advice: without it the pages stay small, and still pinned. Registering faults the pages in,
    // as huge ones where the advice holds.
    (void)madvise(p, used, MADV_HUGEPAGE);
    unsigned reg = cudaHostRegisterDefault;
    reg |= (flags_ & cudaHostAllocPortable) != 0 ? cudaHostRegisterPortable : 0u;
    reg |= (flags_ & cudaHostAllocMapped) != 0 ? cudaHostRegisterMapped : 0u;
    if (const cudaError_t status = cudaHostRegister(p, used, reg); status != cudaSuccess) {
      (void)cudaGetLastError();
      munmap(base, length);
      fail("a huge-page block", bytes, "cudaHostRegister: " + cuda_cause(status), static_cast<int>(status));
    }
    try {
      const std::lock_guard lock(huge_->mutex);
      huge_->blocks.emplace(p, huge_blocks::mapping{base, length});
    } catch (...) {
      (void)cudaHostUnregister(p);
      munmap(base, length);
      throw;
    }
    return p;
#else
    (void)bytes;
    return nullptr;
#endif
  }

  // Returns a huge-page block; false when `p` is not one.
  bool huge_free(void* p) const noexcept {
    if (!huge_) {
      return false;
    }
    huge_blocks::mapping m{};
    {
      const std::lock_guard lock(huge_->mutex);
      const auto it = huge_->blocks.find(p);
      if (it == huge_->blocks.end()) {
        return false;
      }
      m = it->second;
      huge_->blocks.erase(it);
    }
    ZERO_CHECK_CUDA_NOTHROW(cudaHostUnregister(p));
    munmap(m.base, m.length);
    return true;
  }

  void* raw_allocate(std::size_t bytes) const {
    if (huge_ && bytes >= huge_page_bytes) {
      return huge_allocate(bytes);
    }
    void* p = nullptr;
    const cudaError_t status = cudaHostAlloc(&p, bytes, flags_);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      fail("cudaHostAlloc", bytes, cuda_cause(status), static_cast<int>(status));
    }
    return p;
  }

  void raw_free(void* p) const noexcept {
    if (!huge_free(p)) {
      ZERO_CHECK_CUDA_NOTHROW(cudaFreeHost(p));
    }
  }

  unsigned flags_;
  std::shared_ptr<huge_blocks> huge_;
};

static_assert(allocator<pinned_allocator>);
static_assert(host_allocator_policy<pinned_allocator> && device_allocator_policy<pinned_allocator>);

/// `pinned_allocator` whose default constructor asks for huge pages: the host memory of `cuda_backend`'s
/// offloaded state, which the host AdamW streams through (see `pinned_allocator::options`).
class huge_pinned_allocator : public pinned_allocator {
public:
  huge_pinned_allocator() : pinned_allocator(default_flags, options{.huge_pages = true}) {}
};

static_assert(allocator<huge_pinned_allocator>);
static_assert(host_allocator_policy<huge_pinned_allocator> && device_allocator_policy<huge_pinned_allocator>);

/// Pinned host memory through a caching pool: staging and offload buffers reused step after step.
using caching_pinned_allocator = caching_pool<pinned_allocator>;

static_assert(allocator<caching_pinned_allocator>);
static_assert(host_allocator_policy<caching_pinned_allocator> && device_allocator_policy<caching_pinned_allocator>);

} // namespace zero
