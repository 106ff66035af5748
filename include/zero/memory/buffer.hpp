#pragma once
/// \file
/// `buffer<T, A>`: an owning, typed, tagged array of memory from an allocator policy. Moves, never
/// copies; returns its memory to the allocator it came from with the tag it was counted under.

#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"

#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>

namespace zero {

/// Default alignment of model-state buffers: 256 bytes, what NCCL and vector loads like.
inline constexpr std::size_t buffer_alignment = 256;

/// `count` elements of `T` in memory of allocator `A`, counted under a memory tag. The elements
/// are not initialised (T must be trivially copyable: model state is raw numbers).
template <class T, allocator A> class buffer {
  static_assert(std::is_trivially_copyable_v<T>, "zero::buffer holds raw numbers: T must be trivially copyable");

public:
  buffer() = default;
  /// Allocates `count` elements from `alloc` under `tag`.
  /// \throws memory_error naming the tag and the bytes when the allocator fails (see `allocate_tagged`) or
  ///         `count` elements do not fit in `std::size_t` bytes; what else the allocator throws.
  buffer(A alloc, std::size_t count, memory_tag tag = memory_tag::other, std::size_t alignment = buffer_alignment)
      : alloc_(std::move(alloc)), count_(count), tag_(tag), alignment_(alignment) {
    if (count_ > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      throw memory_error("buffer: " + std::to_string(count_) + " elements of " + std::to_string(sizeof(T)) +
                         " bytes for " + std::string(name_of(tag_)) + " overflow the address space");
    }
    data_ = static_cast<T*>(allocate_tagged(*alloc_, count_ * sizeof(T), alignment_, tag_));
  }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  buffer(buffer&& o) noexcept
      : alloc_(std::move(o.alloc_)), data_(std::exchange(o.data_, nullptr)), count_(std::exchange(o.count_, 0)),
        tag_(o.tag_), alignment_(o.alignment_) {}
  buffer& operator=(buffer&& o) noexcept {
    if (this != &o) {
      release();
      alloc_ = std::move(o.alloc_);
      data_ = std::exchange(o.data_, nullptr);
      count_ = std::exchange(o.count_, 0);
      tag_ = o.tag_;
      alignment_ = o.alignment_;
    }
    return *this;
  }
  ~buffer() { release(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return count_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return count_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return count_ == 0; }
  [[nodiscard]] memory_tag tag() const noexcept { return tag_; }
  /// A span over the elements; only meaningful to dereference when `A::host_accessible`.
  [[nodiscard]] std::span<T> span() noexcept { return {data_, count_}; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {data_, count_}; }
  [[nodiscard]] T& operator[](std::size_t i) noexcept requires A::host_accessible { return data_[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept requires A::host_accessible { return data_[i]; }

  /// Returns the memory now; the buffer becomes empty.
  void release() noexcept {
    if (data_ != nullptr) {
      deallocate_tagged(*alloc_, data_, count_ * sizeof(T), alignment_, tag_);
      data_ = nullptr;
      count_ = 0;
    }
  }

private:
  std::optional<A> alloc_; // empty in a default-constructed buffer, so A need not be default-constructible
  T* data_ = nullptr;
  std::size_t count_ = 0;
  memory_tag tag_ = memory_tag::other;
  std::size_t alignment_ = buffer_alignment;
};

} // namespace zero
