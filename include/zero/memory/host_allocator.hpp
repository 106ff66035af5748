#pragma once
/// \file
/// `host_allocator`: aligned pageable host memory from the C++ runtime.

#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"

#include <cstddef>
#include <new>
#include <string>

namespace zero {

/// Plain host memory through aligned `operator new`. Stateless; copies are interchangeable.
class host_allocator {
public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  /// Returns `bytes` bytes aligned to `alignment` (a power of two); a zero-byte request returns a
  /// unique non-null pointer. \throws memory_error naming the bytes when the runtime has none.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    check_alignment(alignment);
    try {
      return ::operator new (bytes == 0 ? 1 : bytes, std::align_val_t{alignment});
    } catch (const std::bad_alloc&) {
      throw memory_error("host_allocator: could not allocate " + std::to_string(bytes) + " bytes aligned to " +
                         std::to_string(alignment));
    }
  }

  /// Returns memory from `allocate` with the same alignment. Never throws.
  void deallocate(void* p, std::size_t /*bytes*/, std::size_t alignment = alignof(std::max_align_t)) noexcept {
    ::operator delete (p, std::align_val_t{alignment});
  }

  friend bool operator==(const host_allocator&, const host_allocator&) noexcept { return true; }

private:
  static void check_alignment(std::size_t alignment) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
      throw usage_error("allocator alignment must be a power of two, got " + std::to_string(alignment));
    }
  }
};

static_assert(allocator<host_allocator>);
static_assert(host_allocator_policy<host_allocator>);

} // namespace zero
