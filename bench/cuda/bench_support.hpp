#pragma once
/// \file
/// What the CUDA benchmarks share: a device buffer for the length of one benchmark, and CUDA events to
/// time a stream's work.

#include "zero/core/cuda_check.hpp"
#include "zero/memory/device_allocator.hpp"

#include <cstddef>
#include <cuda_runtime_api.h>

namespace zero::bench {

/// A device buffer for the length of one benchmark.
class buffer {
public:
  buffer(zero::device_allocator& alloc, std::size_t bytes) : alloc_(alloc), bytes_(bytes), p_(alloc.allocate(bytes)) {}
  ~buffer() { alloc_.deallocate(p_, bytes_); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  template <class T> [[nodiscard]] T* as() const noexcept { return static_cast<T*>(p_); }

private:
  zero::device_allocator& alloc_;
  std::size_t bytes_;
  void* p_;
};

/// A CUDA event.
class event {
public:
  event() { ZERO_CHECK_CUDA(cudaEventCreate(&e_)); }
  ~event() { ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e_)); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

private:
  cudaEvent_t e_ = nullptr;
};

/// Seconds between two recorded events.
inline double seconds_between(const event& a, const event& b) {
  float ms = 0.0f;
  ZERO_CHECK_CUDA(cudaEventElapsedTime(&ms, a.get(), b.get()));
  return static_cast<double>(ms) * 1e-3;
}

} // namespace zero::bench
