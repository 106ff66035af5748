#pragma once
/// \file
/// The allocator policy: where the bytes of model state live and who counts them.
///
/// An allocator hands out raw, aligned bytes and takes them back. It says whether the host and
/// the device can touch its memory (the properties of libcu++'s memory resources), so an engine
/// can refuse a combination that cannot work at compile time. Allocators are cheap handles:
/// copies share the same underlying resource and counters.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zero {

/// What a block of model-state memory holds; the counting allocator keeps live and peak bytes per tag.
enum class memory_tag : std::uint8_t { params, grads, optimizer, buffers, other };

/// Number of memory tags, for arrays indexed by tag.
inline constexpr std::size_t memory_tag_count = 5;

/// Name of a tag for reports: "params", "grads", "optimizer", "buffers", "other".
[[nodiscard]] constexpr std::string_view name_of(memory_tag t) noexcept {
  switch (t) {
  case memory_tag::params:
    return "params";
  case memory_tag::grads:
    return "grads";
  case memory_tag::optimizer:
    return "optimizer";
  case memory_tag::buffers:
    return "buffers";
  case memory_tag::other:
    return "other";
  }
  return "?";
}

/// An allocator: `allocate(bytes, alignment)` returns memory aligned to `alignment` (a power of
/// two) or throws `memory_error`; `deallocate(p, bytes, alignment)` returns it and never throws.
/// `host_accessible` and `device_accessible` say who may dereference the memory.
template <class A>
concept allocator = std::copy_constructible<A> && requires(A& a, void* p, std::size_t n, std::size_t align) {
  { a.allocate(n, align) } -> std::same_as<void*>;
  { a.deallocate(p, n, align) }
  noexcept;
  { A::host_accessible } -> std::convertible_to<bool>;
  { A::device_accessible } -> std::convertible_to<bool>;
};

/// An allocator that also takes the tag of what it stores (the counting allocator does).
template <class A>
concept tagged_allocator = allocator<A> && requires(A& a, void* p, std::size_t n, std::size_t align, memory_tag tag) {
  { a.allocate(n, align, tag) } -> std::same_as<void*>;
  { a.deallocate(p, n, align, tag) }
  noexcept;
};

/// Memory the CPU may read and write (host, pinned).
template <class A>
concept host_allocator_policy = allocator<A> && A::host_accessible;

/// Memory a CUDA kernel may read and write (device, pinned/mapped).
template <class A>
concept device_allocator_policy = allocator<A> && A::device_accessible;

/// Allocates through `a`, passing `tag` when the allocator takes one.
template <allocator A>
[[nodiscard]] void* allocate_tagged(A& a, std::size_t bytes, std::size_t alignment, memory_tag tag) {
  if constexpr (tagged_allocator<A>) {
    return a.allocate(bytes, alignment, tag);
  } else {
    (void)tag;
    return a.allocate(bytes, alignment);
  }
}

/// Returns memory obtained from `allocate_tagged` with the same size, alignment and tag.
template <allocator A>
void deallocate_tagged(A& a, void* p, std::size_t bytes, std::size_t alignment, memory_tag tag) noexcept {
  if constexpr (tagged_allocator<A>) {
    a.deallocate(p, bytes, alignment, tag);
  } else {
    (void)tag;
    a.deallocate(p, bytes, alignment);
  }
}

} // namespace zero
