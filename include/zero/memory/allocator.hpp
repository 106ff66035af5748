#pragma once
/// \file
/// The allocator policy: where the bytes of model state live and who counts them.
///
/// An allocator hands out raw, aligned bytes and takes them back. It says whether the host and
/// the device can touch its memory (the properties of libcu++'s memory resources), so an engine
/// can refuse a combination that cannot work at compile time. Allocators are cheap handles:
/// copies share the same underlying resource and counters.

#include "zero/core/error.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <new>
#include <string>
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
/// two), never null, even for 0 bytes; when it has none it throws `memory_error` (or `std::bad_alloc`,
/// or returns null: `counting_allocator` and `buffer` turn those into a `memory_error` naming the
/// request). `deallocate(p, bytes, alignment)` returns memory with the size and alignment it was
/// allocated with and never throws. `host_accessible` and `device_accessible` say who may dereference
/// the memory.
template <class A>
concept allocator = std::copy_constructible<A> && requires(A& a, void* p, std::size_t n, std::size_t align) {
  { a.allocate(n, align) } -> std::same_as<void*>;
  { a.deallocate(p, n, align) }
  noexcept;
  { A::host_accessible } -> std::convertible_to<bool>;
  { A::device_accessible } -> std::convertible_to<bool>;
};

/// An allocator that also takes the tag of what it stores (the counting allocator does). Its tagged
/// `allocate` throws `memory_error` naming the tag when it fails.
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

namespace detail {

/// `message` without its leading "[zero.<id>] ", to quote one error inside another.
[[nodiscard]] inline std::string_view without_error_id(std::string_view message) noexcept {
  if (message.starts_with("[zero.")) {
    if (const auto end = message.find("] "); end != std::string_view::npos) {
      message.remove_prefix(end + 2);
    }
  }
  return message;
}

/// Returns `allocate()`, the memory of one request of `bytes` bytes for `tag`; when that fails in any
/// way an allocator may fail (it throws `memory_error` or `std::bad_alloc`, or returns null), throws
/// instead a `memory_error` "could not allocate <bytes> bytes of <tag> (alignment <alignment>)<context>;
/// <cause>", where `context()` returns what the caller knows (e.g. the live bytes, "; live: ...") and the
/// cause is the allocator's own message, or what it did. The status of an allocator's `memory_error`
/// (e.g. the cudaError_t) is kept. Other exceptions (`usage_error` for a bad alignment) pass unchanged.
/// Nothing was allocated when this throws.
template <class Allocate, class Context>
[[nodiscard]] void* allocate_or_explain(std::size_t bytes, std::size_t alignment, memory_tag tag, Allocate&& allocate,
                                        Context&& context) {
  std::string cause;
  int status = 0;
  try {
    if (void* p = allocate(); p != nullptr) {
      return p;
    }
    cause = "the allocator returned a null pointer";
  } catch (const memory_error& e) {
    cause = without_error_id(e.what());
    status = e.status();
  } catch (const std::bad_alloc& e) {
    cause = std::string("the allocator threw ") + e.what();
  }
  throw memory_error("could not allocate " + std::to_string(bytes) + " bytes of " + std::string(name_of(tag)) +
                         " (alignment " + std::to_string(alignment) + ")" + context() + "; " + cause,
                     status);
}

} // namespace detail

/// Allocates through `a`, passing `tag` when the allocator takes one.
/// \throws memory_error naming the tag and the bytes when `a` fails (throws `memory_error` or
///         `std::bad_alloc`, or returns null); what else `a` throws (`usage_error` for a bad alignment).
template <allocator A>
[[nodiscard]] void* allocate_tagged(A& a, std::size_t bytes, std::size_t alignment, memory_tag tag) {
  if constexpr (tagged_allocator<A>) {
    // A tagged allocator knows more (the counting allocator, the live bytes) and explains itself.
    return a.allocate(bytes, alignment, tag);
  } else {
    return detail::allocate_or_explain(
        bytes, alignment, tag, [&] { return a.allocate(bytes, alignment); }, [] { return std::string(); });
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
