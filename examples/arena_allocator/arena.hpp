#pragma once
// arena: an allocator policy of one's own (docs/allocators.md). It hands out memory from one block,
// front to back, and throws zero::memory_error when the block is full. zero wraps it in a
// counting_allocator, which turns that error into one naming the tag, the bytes asked and the
// bytes live.

#include <algorithm>
#include <cstddef>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <zero/core/error.hpp>
#include <zero/memory/allocator.hpp>

namespace example {

/// Bump-pointer memory from one block of `capacity` bytes. Nothing is reused until every block handed
/// out has come back; then the arena starts again from the front. A cheap handle: copies share the
/// block, so the engine, its buffers and the backend all draw on one arena. Thread-safe.
class arena {
public:
  // The two properties of zero's allocator policy: the CPU may touch this memory, a GPU may not.
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  /// An arena of `capacity` bytes, taken from the C++ runtime now (aligned to a page).
  explicit arena(std::size_t capacity) : state_(std::make_shared<state>(capacity)) {}

  /// `bytes` bytes aligned to `alignment` (a power of two), from the front of what is left.
  /// \throws zero::memory_error when they do not fit.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
    const std::lock_guard lock(state_->mutex);
    void* p = state_->block.get() + state_->used;
    std::size_t left = state_->capacity - state_->used;
    if (std::align(alignment, bytes, p, left) == nullptr) {
      throw zero::memory_error("arena: " + std::to_string(bytes) + " bytes do not fit in the " +
                               std::to_string(state_->capacity - state_->used) + " bytes left of " +
                               std::to_string(state_->capacity));
    }
    state_->used = state_->capacity - left + bytes;
    state_->high_water = std::max(state_->high_water, state_->used);
    ++state_->blocks_out;
    return p;
  }

  /// Takes a block back; the arena rewinds when the last one is back. Never throws.
  void deallocate(void* /*p*/, std::size_t /*bytes*/, std::size_t /*alignment*/) noexcept {
    const std::lock_guard lock(state_->mutex);
    if (--state_->blocks_out == 0) {
      state_->used = 0;
    }
  }

  /// Bytes of the block.
  [[nodiscard]] std::size_t capacity() const noexcept { return state_->capacity; }
  /// The most bytes of the block ever in use at once (alignment gaps included).
  [[nodiscard]] std::size_t high_water() const {
    const std::lock_guard lock(state_->mutex);
    return state_->high_water;
  }

private:
  struct state {
    static constexpr std::align_val_t page{4096};
    struct release {
      void operator()(std::byte* p) const noexcept { ::operator delete[](p, page); }
    };
    explicit state(std::size_t bytes)
        : capacity(bytes), block(static_cast<std::byte*>(::operator new[](bytes, page))) {}
    std::size_t capacity;
    std::unique_ptr<std::byte[], release> block;
    std::mutex mutex;
    std::size_t used = 0;
    std::size_t high_water = 0;
    std::size_t blocks_out = 0;
  };
  std::shared_ptr<state> state_;
};

static_assert(zero::host_allocator_policy<arena>);

} // namespace example
