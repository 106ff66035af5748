#pragma once
/// \file
/// GPU memory for model state: `device_allocator` (cudaMalloc / cudaFree on one device) and `caching_pool`,
/// an adaptor over any allocator that keeps freed blocks by size class and hands them out again, so that
/// after the first training step a step allocates nothing from CUDA. `caching_device_allocator` is the two
/// together. Host code only; compiles with a plain C++20 compiler given CUDA's include directory (link
/// CUDA::cudart, as zero::cuda does).
///
/// Memory from these allocators is owned by the caller until it is given back with `deallocate`, to the
/// allocator that gave it or a copy of it (copies share their state).

#include "zero/core/cuda_check.hpp"
#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <limits>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

namespace zero {

namespace detail {

/// "<n> bytes (<x> GiB)" for messages.
[[nodiscard]] inline std::string describe_bytes(std::size_t bytes) {
  char gib[32];
  std::snprintf(gib, sizeof(gib), "%.2f", static_cast<double>(bytes) / double(std::size_t{1} << 30));
  return std::to_string(bytes) + " bytes (" + gib + " GiB)";
}

/// Throws `usage_error` unless `alignment` is a non-zero power of two.
inline void require_power_of_two_alignment(std::size_t alignment, const char* who) {
  if (!std::has_single_bit(alignment)) {
    throw usage_error(std::string(who) + ": alignment " + std::to_string(alignment) + " is not a power of two");
  }
}

/// Makes `device` the current CUDA device for the scope's lifetime and then restores the previous one;
/// does nothing when `device` is already current.
class cuda_device_scope {
public:
  /// \throws cuda_error if the device cannot be queried or set.
  explicit cuda_device_scope(int device) {
    ZERO_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) {
      ZERO_CHECK_CUDA(cudaSetDevice(device));
      switched_ = true;
    }
  }
  /// The non-throwing form for `deallocate`: a failure is reported on stderr and the device left as is.
  cuda_device_scope(int device, std::nothrow_t) noexcept {
    if (ZERO_CHECK_CUDA_NOTHROW(cudaGetDevice(&previous_)) == cudaSuccess && previous_ != device) {
      switched_ = ZERO_CHECK_CUDA_NOTHROW(cudaSetDevice(device)) == cudaSuccess;
    }
  }
  ~cuda_device_scope() {
    if (switched_) {
      ZERO_CHECK_CUDA_NOTHROW(cudaSetDevice(previous_));
    }
  }
  cuda_device_scope(const cuda_device_scope&) = delete;
  cuda_device_scope& operator=(const cuda_device_scope&) = delete;

private:
  int previous_ = 0;
  bool switched_ = false;
};

/// Blocks that were over-allocated to reach an alignment the CUDA call does not give by itself: the
/// aligned pointer handed out, mapped to the pointer CUDA returned. Thread-safe.
class over_aligned_blocks {
public:
  /// Records that `aligned` came from `base`.
  void insert(void* aligned, void* base) {
    const std::lock_guard lock(mutex_);
    bases_.emplace(aligned, base);
  }
  /// The base of `p` when `p` was over-aligned (and forgets it), else `p` itself.
  [[nodiscard]] void* take_base(void* p) noexcept {
    const std::lock_guard lock(mutex_);
    const auto it = bases_.find(p);
    if (it == bases_.end()) {
      return p;
    }
    void* base = it->second;
    bases_.erase(it);
    return base;
  }

private:
  std::mutex mutex_;
  std::unordered_map<void*, void*> bases_;
};

/// What `device_allocator` and `pinned_allocator` share: a CUDA call hands out blocks aligned to
/// `native_alignment`; a larger alignment costs one over-allocated block, whose base is recorded in
/// bookkeeping that copies share, so any copy may free another's memory. `Derived` provides `name` (for
/// messages), `raw_allocate(bytes)` (a block of `bytes` > 0, or throws `memory_error`) and
/// `raw_free(p) noexcept`.
template <class Derived> class cuda_block_allocator {
public:
  /// The alignment assumed of the CUDA call (cudaMalloc gives at least 256 bytes; cudaHostAlloc, a page); a
  /// larger request, or a result found less aligned, costs one over-allocation.
  static constexpr std::size_t native_alignment = 256;

  /// Allocates `bytes` (a 1-byte block for 0, so each call gives a distinct pointer) aligned to `alignment`.
  /// Synchronous; the memory is uninitialized.
  /// \throws usage_error if `alignment` is not a power of two; memory_error when the bytes with the alignment
  ///         overflow the address space, or when the CUDA call fails (see the derived class).
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = native_alignment) {
    require_power_of_two_alignment(alignment, Derived::name);
    const auto& self = static_cast<const Derived&>(*this);
    if (alignment <= native_alignment) {
      void* p = self.raw_allocate(bytes == 0 ? 1 : bytes);
      if (reinterpret_cast<std::uintptr_t>(p) % alignment == 0) {
        return p;
      }
      self.raw_free(p);
    }
    if (bytes > std::numeric_limits<std::size_t>::max() - alignment) {
      throw memory_error(std::string(Derived::name) + ": " + describe_bytes(bytes) + " with alignment " +
                         std::to_string(alignment) + " overflows the address space");
    }
    void* base = self.raw_allocate(bytes + alignment - 1);
    const auto addr = reinterpret_cast<std::uintptr_t>(base);
    void* aligned = reinterpret_cast<void*>((addr + alignment - 1) & ~(static_cast<std::uintptr_t>(alignment) - 1));
    try {
      blocks_->insert(aligned, base);
    } catch (...) {
      self.raw_free(base);
      throw;
    }
    return aligned;
  }

  /// Returns `p` (from `allocate` of this allocator or a copy; null is ignored) with the CUDA call, which
  /// waits for the work in flight. Never throws: a CUDA failure is reported on stderr.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = native_alignment) noexcept {
    (void)bytes;
    (void)alignment;
    if (p != nullptr) {
      static_cast<const Derived&>(*this).raw_free(blocks_->take_base(p));
    }
  }

  /// True when `a` and `b` are copies of one allocator, so either may free the other's memory.
  friend bool operator==(const Derived& a, const Derived& b) noexcept {
    return static_cast<const cuda_block_allocator&>(a).blocks_ == static_cast<const cuda_block_allocator&>(b).blocks_;
  }

protected:
  cuda_block_allocator() : blocks_(std::make_shared<over_aligned_blocks>()) {}

private:
  std::shared_ptr<over_aligned_blocks> blocks_;
};

} // namespace detail

/// Device memory of one GPU from `cudaMalloc`, returned with `cudaFree`. The kernels of that device (and of
/// peers with peer access) may use it; the host may not dereference it. `cudaFree` waits for the device to
/// finish the work in flight, so memory is never freed under a running kernel, at the price of a device-wide
/// synchronization per free: use `caching_device_allocator` in a training loop.
///
/// `allocate(bytes, alignment = 256)` gives `bytes` (a 1-byte block for 0, so each call gives a distinct
/// pointer) of device memory on `device()`, aligned to `alignment`; synchronous, uninitialized. It throws
/// usage_error if `alignment` is not a power of two; memory_error naming the bytes, the device and the CUDA
/// error (with the device's free and total memory) when cudaMalloc fails; cuda_error if the device cannot be
/// made current. `deallocate(p, bytes, alignment)` returns `p` with `cudaFree` and never throws.
///
/// A cheap handle: copies share state and may free each other's memory (`==` says whether two are copies).
/// Thread-safe.
class device_allocator : public detail::cuda_block_allocator<device_allocator> {
public:
  /// The CPU cannot dereference device memory.
  static constexpr bool host_accessible = false;
  /// CUDA kernels can.
  static constexpr bool device_accessible = true;

  /// An allocator for the device that is current now.
  /// \throws cuda_error if there is no CUDA device or the query fails.
  device_allocator() : device_(current_device()) {}

  /// An allocator for CUDA device `device` (made current around each call, then restored).
  explicit device_allocator(int device) : device_(device) {}

  /// The CUDA device this allocator allocates on.
  [[nodiscard]] int device() const noexcept { return device_; }

private:
  friend class detail::cuda_block_allocator<device_allocator>;
  static constexpr const char* name = "device_allocator";

  static int current_device() {
    int device = 0;
    ZERO_CHECK_CUDA(cudaGetDevice(&device));
    return device;
  }

  void* raw_allocate(std::size_t bytes) const {
    const detail::cuda_device_scope scope(device_);
    void* p = nullptr;
    const cudaError_t status = cudaMalloc(&p, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0;
      std::size_t total_bytes = 0;
      std::string state = "device memory state unknown";
      if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        state = detail::describe_bytes(free_bytes) + " free of " + detail::describe_bytes(total_bytes);
      }
      (void)cudaGetLastError();
      throw memory_error("device_allocator: cudaMalloc of " + detail::describe_bytes(bytes) + " on device " +
                             std::to_string(device_) + " failed: " + cudaGetErrorString(status) + " (" +
                             cudaGetErrorName(status) + "); " + state,
                         static_cast<int>(status));
    }
    return p;
  }

  void raw_free(void* p) const noexcept {
    const detail::cuda_device_scope scope(device_, std::nothrow);
    ZERO_CHECK_CUDA_NOTHROW(cudaFree(p));
  }

  int device_;
};

static_assert(allocator<device_allocator>);
static_assert(device_allocator_policy<device_allocator> && !host_allocator_policy<device_allocator>);

/// A caching adaptor over any allocator: a freed block is kept in a free list of its size class and
/// alignment and handed out again to the next request of that class, so a loop that allocates the same
/// sizes every step (a training step) reaches the upstream allocator (CUDA) only in its first iteration.
///
/// Size classes: requests up to 512 bytes share the 512-byte class; below 1 MiB sizes round up to a multiple
/// of 512 bytes; from 1 MiB up, to a multiple of 1/32 of the request's power of two, but never of more than
/// 2 MiB (cudaMalloc's own page), so at most 3.1% (or 511 bytes) more than asked is reserved, and at most
/// 2 MiB for a request past 64 MiB. A flat buffer of model state (tens of GiB at once) is thus reserved at
/// its formula's bytes, where a 1/32 granule would add up to 3.1% of it (1.5 GB over the three AdamW tensors
/// of a 10.68 G-parameter model's device share: the memory the planner's budget did not have). A block is
/// reused only for the same class and alignment: no splitting, no best-fit, so what a step reserves is what
/// it asked for, rounded as above.
///
/// When the upstream allocation fails with `memory_error`, the pool gives every cached block back and
/// tries once more before rethrowing. `release_cached` gives them back on request; the last copy's
/// destruction does too. Blocks still in use then are not freed (their owner may still use them).
///
/// Stream ordering: the pool knows no streams. Give a block back only when no work still in flight uses
/// it, or when every later user runs on the same stream as the last one (stream order then protects it),
/// as with PyTorch's caching allocator on one stream. `deallocate` never synchronizes.
///
/// A cheap handle: copies share the cache and the counters. Thread-safe; the upstream is called outside
/// the pool's lock. After warm-up, `allocate` and `deallocate` allocate nothing, not even host memory.
template <allocator Upstream> class caching_pool {
public:
  /// Host-accessible exactly when the upstream memory is.
  static constexpr bool host_accessible = Upstream::host_accessible;
  /// Device-accessible exactly when the upstream memory is.
  static constexpr bool device_accessible = Upstream::device_accessible;
  /// Alignment used when none is given.
  static constexpr std::size_t default_alignment = 256;

  /// A pool over a default-constructed upstream (for the device allocators: the current device).
  caching_pool() requires std::default_initializable<Upstream> : caching_pool(Upstream{}) {}

  /// A pool over `upstream`.
  explicit caching_pool(Upstream upstream) : state_(std::make_shared<state>(std::move(upstream))) {}

  /// The size class of a request of `bytes`: the bytes the pool reserves for it (see the class comment).
  [[nodiscard]] static constexpr std::size_t size_class(std::size_t bytes) noexcept {
    constexpr std::size_t small_granule = 512;
    constexpr std::size_t large_from = std::size_t{1} << 20;
    constexpr std::size_t largest_granule = std::size_t{2} << 20;
    if (bytes <= small_granule) {
      return small_granule;
    }
    const std::size_t granule =
        bytes < large_from ? small_granule : std::min(std::bit_floor(bytes) / 32, largest_granule);
    if (bytes > std::numeric_limits<std::size_t>::max() - granule) {
      return bytes; // absurd request: let the upstream refuse it
    }
    return (bytes + granule - 1) / granule * granule;
  }

  /// A block of at least `bytes`, aligned to `alignment`: a cached block of the same size class and
  /// alignment when there is one (a cache hit), else a new one from the upstream. Uninitialized.
  /// \throws usage_error if `alignment` is not a power of two; memory_error (after giving every cached block
  ///         back and retrying once) when the upstream cannot allocate; whatever else the upstream throws.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = default_alignment) {
    detail::require_power_of_two_alignment(alignment, "caching_pool");
    const key k{size_class(bytes), alignment};
    {
      const std::lock_guard lock(state_->mutex);
      if (const auto it = state_->free.find(k); it != state_->free.end() && !it->second.empty()) {
        auto& list = it->second;
        const auto node = list.begin();
        state_->in_use.splice(state_->in_use.end(), list, node);
        ++state_->cache_hits;
        state_->bytes_cached -= k.first;
        state_->add_in_use(k.first);
        return node->ptr;
      }
    }
    void* p = allocate_upstream(k);
    try {
      const std::lock_guard lock(state_->mutex);
      // The free list of this class exists from now on, so deallocate never has to create it.
      state_->free.try_emplace(k);
      state_->in_use.push_back(block{p, k.first, k.second});
      try {
        state_->index.emplace(p, std::prev(state_->in_use.end()));
      } catch (...) {
        state_->in_use.pop_back();
        throw;
      }
      ++state_->cuda_allocations;
      state_->add_in_use(k.first);
    } catch (...) {
      state_->upstream.deallocate(p, k.first, k.second);
      throw;
    }
    return p;
  }

  /// Puts `p` (from `allocate` of this pool or a copy; null is ignored) in the free list of its class for
  /// reuse; nothing is returned to the upstream. See the class comment for when this is safe with streams.
  /// Never throws; a pointer this pool did not hand out is reported on stderr and ignored.
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = default_alignment) noexcept {
    (void)bytes;
    (void)alignment;
    if (p == nullptr) {
      return;
    }
    const std::lock_guard lock(state_->mutex);
    const auto it = state_->index.find(p);
    if (it == state_->index.end()) {
      std::fprintf(stderr,
                   "[zero.memory_error] caching_pool::deallocate: %p was not allocated by this pool (ignored)\n", p);
      return;
    }
    const auto node = it->second;
    auto& list = state_->free.find(key{node->bytes, node->alignment})->second;
    // Most recently freed first: its cache lines and TLB entries are the warmest.
    list.splice(list.begin(), state_->in_use, node);
    state_->bytes_in_use -= node->bytes;
    state_->bytes_cached += node->bytes;
  }

  /// Gives every cached (free) block back to the upstream; blocks in use stay. Returns the bytes given back.
  std::size_t release_cached() noexcept { return state_->release_cached(); }

  /// Blocks the pool has obtained from the upstream (CUDA) so far; stays constant once a loop is warm.
  [[nodiscard]] std::size_t cuda_allocations() const {
    const std::lock_guard lock(state_->mutex);
    return state_->cuda_allocations;
  }
  /// Requests served from the cache.
  [[nodiscard]] std::size_t cache_hits() const {
    const std::lock_guard lock(state_->mutex);
    return state_->cache_hits;
  }
  /// Bytes (by size class) held in free lists, ready for reuse.
  [[nodiscard]] std::size_t bytes_cached() const {
    const std::lock_guard lock(state_->mutex);
    return state_->bytes_cached;
  }
  /// Bytes (by size class) handed out and not yet given back.
  [[nodiscard]] std::size_t bytes_in_use() const {
    const std::lock_guard lock(state_->mutex);
    return state_->bytes_in_use;
  }
  /// The most bytes ever in use at once (PyTorch's max_memory_allocated, counted by size class): with
  /// every user of the device drawing from one pool, the true peak of their memory together.
  [[nodiscard]] std::size_t peak_bytes_in_use() const {
    const std::lock_guard lock(state_->mutex);
    return state_->peak_in_use;
  }
  /// The most bytes ever held from the upstream at once, in use or cached (PyTorch's
  /// max_memory_reserved).
  [[nodiscard]] std::size_t peak_bytes_reserved() const {
    const std::lock_guard lock(state_->mutex);
    return state_->peak_reserved;
  }
  /// Sets both peaks back to the bytes in use and held now (to measure one phase).
  void reset_peaks() {
    const std::lock_guard lock(state_->mutex);
    state_->peak_in_use = state_->bytes_in_use;
    state_->peak_reserved = state_->bytes_in_use + state_->bytes_cached;
  }

  /// The upstream allocator.
  [[nodiscard]] const Upstream& upstream() const noexcept { return state_->upstream; }

  /// True when `a` and `b` are copies of one pool (share the cache).
  friend bool operator==(const caching_pool& a, const caching_pool& b) noexcept { return a.state_ == b.state_; }

private:
  using key = std::pair<std::size_t, std::size_t>; // size class, alignment
  struct block {
    void* ptr;
    std::size_t bytes; // the size class
    std::size_t alignment;
  };
  using block_list = std::list<block>;

  struct state {
    explicit state(Upstream u) : upstream(std::move(u)) {}
    ~state() { release_cached(); }
    state(const state&) = delete;
    state& operator=(const state&) = delete;

    std::size_t release_cached() noexcept {
      block_list victims;
      std::size_t released = 0;
      {
        const std::lock_guard lock(mutex);
        for (auto& [k, list] : free) {
          for (const block& b : list) {
            index.erase(b.ptr);
            released += b.bytes;
          }
          victims.splice(victims.end(), list);
        }
        bytes_cached = 0;
      }
      for (const block& b : victims) {
        upstream.deallocate(b.ptr, b.bytes, b.alignment);
      }
      return released;
    }

    Upstream upstream;
    mutable std::mutex mutex;
    std::map<key, block_list> free;                                 // cached blocks by class
    block_list in_use;                                              // blocks handed out
    std::unordered_map<void*, typename block_list::iterator> index; // every block held, cached or in use
    std::size_t cuda_allocations = 0;
    std::size_t cache_hits = 0;
    std::size_t bytes_cached = 0;
    std::size_t bytes_in_use = 0;
    std::size_t peak_in_use = 0;
    std::size_t peak_reserved = 0;

    /// `bytes` more in use (under the lock); a block from the upstream was not cached before.
    void add_in_use(std::size_t bytes) noexcept {
      bytes_in_use += bytes;
      peak_in_use = std::max(peak_in_use, bytes_in_use);
      peak_reserved = std::max(peak_reserved, bytes_in_use + bytes_cached);
    }
  };

  void* allocate_upstream(const key& k) {
    try {
      return state_->upstream.allocate(k.first, k.second);
    } catch (const memory_error&) {
      if (state_->release_cached() == 0) {
        throw;
      }
    }
    return state_->upstream.allocate(k.first, k.second);
  }

  std::shared_ptr<state> state_;
};

/// Device memory through a caching pool: the allocator a training loop on a GPU wants.
using caching_device_allocator = caching_pool<device_allocator>;

static_assert(allocator<caching_device_allocator>);
static_assert(device_allocator_policy<caching_device_allocator> && !host_allocator_policy<caching_device_allocator>);

} // namespace zero
