#pragma once
/// \file
/// Moving values between host memory and a backend's memory: `upload`, `download` and
/// `fill_from_host`. Through the backend's `copy` where it has one (a GPU's memory), by plain host
/// copies otherwise, which then needs memory the host can touch (`HostAccessible`, the allocator's
/// `host_accessible`). Each waits for its copies: these are for initialisation, checkpoints and the
/// one small read of a step's norms, not for hot paths.

#include "zero/backend/backend.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace zero {

/// Enqueues a copy of `n` elements from `src` to `dst`, one in host memory and the other in backend
/// memory (either way), on `s`: asynchronous through the backend's `copy` where it has one (the host
/// must not touch either side until `s` is synchronised), else done on the host after `s`'s work.
template <bool HostAccessible, class Backend, class T>
void copy_async(Backend& b, const typename Backend::stream_type& s, const T* src, T* dst, std::size_t n) {
  if constexpr (can_copy<Backend>) {
    b.copy(src, dst, n * sizeof(T), s);
  } else {
    static_assert(HostAccessible, "zero: the allocator's memory is not host accessible and the backend has no "
                                  "copy(const void* src, void* dst, size_t bytes, stream) (see zero::can_copy)");
    b.synchronize(s); // kernels still reading or writing either side come first
    std::copy(src, src + n, dst);
  }
}

/// Copies `n` elements from `src` to `dst`, one in host memory and the other in backend memory
/// (either way), in `s` order, and waits for the copy.
template <bool HostAccessible, class Backend, class T>
void copy_and_wait(Backend& b, const typename Backend::stream_type& s, const T* src, T* dst, std::size_t n) {
  copy_async<HostAccessible>(b, s, src, dst, n);
  if constexpr (can_copy<Backend>) {
    b.synchronize(s);
  }
}

/// Copies `n` elements from host memory to backend memory `dst`, in `s` order, and waits.
template <bool HostAccessible, class Backend, class T>
void upload(Backend& b, const typename Backend::stream_type& s, const T* host, T* dst, std::size_t n) {
  copy_and_wait<HostAccessible>(b, s, host, dst, n);
}

/// Copies `n` elements of backend memory `src` to host memory, after the work enqueued on `s`.
template <bool HostAccessible, class Backend, class T>
void download(Backend& b, const typename Backend::stream_type& s, const T* src, T* host, std::size_t n) {
  copy_and_wait<HostAccessible>(b, s, src, host, n);
}

/// Elements of host scratch `fill_from_host` stages at a time (4 MiB of fp32).
inline constexpr std::size_t host_chunk_elements = std::size_t{1} << 20;

/// Fills `count` elements of backend memory `dst` with fp32 values from `fn(done, span)` (called with
/// the offset of each chunk and the chunk to fill), rounded to `P` by the backend's `cast`: through a
/// host chunk, and where the host cannot touch `dst` through an fp32 staging chunk drawn from
/// `staging_alloc` (a `zero::allocator` of backend memory).
template <bool HostAccessible, class Backend, class P, class Alloc, class Fn>
void fill_from_host(Backend& b, const typename Backend::stream_type& s, Alloc staging_alloc, std::size_t count, P* dst,
                    Fn&& fn) {
  const std::size_t chunk = std::min(count, host_chunk_elements);
  std::vector<float> host(chunk);
  if constexpr (HostAccessible) {
    for (std::size_t done = 0; done < count; done += chunk) {
      const std::size_t n = std::min(chunk, count - done);
      fn(done, std::span<float>(host.data(), n));
      b.cast(host.data(), dst + done, n, s);
      b.synchronize(s); // the host chunk is refilled next
    }
  } else {
    static_assert(can_copy<Backend>, "zero: the allocator's memory is not host accessible, so the backend needs "
                                     "copy(const void* src, void* dst, size_t bytes, stream) to move values "
                                     "between host and backend memory (see zero::can_copy)");
    buffer<float, Alloc> staging(staging_alloc, chunk, memory_tag::buffers);
    for (std::size_t done = 0; done < count; done += chunk) {
      const std::size_t n = std::min(chunk, count - done);
      fn(done, std::span<float>(host.data(), n));
      b.copy(host.data(), staging.data(), n * sizeof(float), s);
      b.cast(staging.data(), dst + done, n, s);
      b.synchronize(s); // host and staging chunks are refilled next
    }
  }
}

} // namespace zero
