#pragma once
/// \file
/// Helpers of the CUDA tests: a device buffer with poisoned guard zones around the elements under test (so
/// a kernel that writes outside its range, or skips an element, is caught), bit access to element types,
/// and a stream per test.

#include "zero/core/cuda_check.hpp"
#include "zero/core/dtype.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cuda_runtime_api.h>
#include <random>
#include <type_traits>
#include <vector>

namespace zero::test {

/// Two element types for a TEST_CASE_TEMPLATE over pairs (a source and a destination, a gradient and a parameter).
template <class A, class B> struct type_pair {
  using first = A;
  using second = B;
};

/// The raw bits of an element (uint32_t for float, uint16_t for f16 / bf16).
template <class T> [[nodiscard]] auto bits_of(T v) noexcept {
  if constexpr (sizeof(T) == 4) {
    std::uint32_t b;
    std::memcpy(&b, &v, 4);
    return b;
  } else {
    std::uint16_t b;
    std::memcpy(&b, &v, 2);
    return b;
  }
}

/// An element of T made from raw bits.
template <class T> [[nodiscard]] T from_bits(std::uint32_t b) noexcept {
  T v;
  if constexpr (sizeof(T) == 4) {
    std::memcpy(static_cast<void*>(&v), &b, 4);
  } else {
    const auto h = static_cast<std::uint16_t>(b);
    std::memcpy(static_cast<void*>(&v), &h, 2);
  }
  return v;
}

/// Whether an element is NaN.
template <class T> [[nodiscard]] bool is_nan(T v) noexcept { return std::isnan(to_float(v)); }

/// Device memory for `n` elements of T at element offset `offset` from a 256-byte aligned allocation (so
/// offset 1 misaligns the pointer by one element), with `guard` poisoned elements after them. Every byte is
/// set to `poison` at construction.
template <class T> class device_buffer {
public:
  static constexpr std::size_t guard = 16;
  static constexpr int poison = 0xA5;

  explicit device_buffer(std::size_t n, std::size_t offset = 0) : n_(n), offset_(offset) {
    ZERO_CHECK_CUDA(cudaMalloc(&raw_, total() * sizeof(T)));
    ZERO_CHECK_CUDA(cudaMemset(raw_, poison, total() * sizeof(T)));
    // cudaMemset is asynchronous: finish it before any stream can touch the buffer.
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  }
  ~device_buffer() { ZERO_CHECK_CUDA_NOTHROW(cudaFree(raw_)); }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;

  /// The first element under test.
  [[nodiscard]] T* get() const noexcept { return static_cast<T*>(raw_) + offset_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

  void upload(const std::vector<T>& host) {
    ZERO_CHECK_CUDA(cudaMemcpy(get(), host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
    // From pageable memory cudaMemcpy may return before the last DMA lands; a kernel on a non-blocking
    // stream would then read stale bytes (seen: the last elements of a 1M-element cast).
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  }
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(n_);
    ZERO_CHECK_CUDA(cudaMemcpy(host.data(), get(), n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Whether the elements before and after the range still hold the poison.
  [[nodiscard]] bool guards_intact() const {
    std::vector<unsigned char> all(total() * sizeof(T));
    ZERO_CHECK_CUDA(cudaMemcpy(all.data(), raw_, all.size(), cudaMemcpyDeviceToHost));
    const std::size_t begin = offset_ * sizeof(T);
    const std::size_t end = (offset_ + n_) * sizeof(T);
    for (std::size_t i = 0; i < all.size(); ++i) {
      if ((i < begin || i >= end) && all[i] != poison) {
        return false;
      }
    }
    return true;
  }

private:
  [[nodiscard]] std::size_t total() const noexcept { return offset_ + n_ + guard; }

  std::size_t n_;
  std::size_t offset_;
  void* raw_ = nullptr;
};

/// A stream created for one test and destroyed after it. Non-blocking, as a framework's streams usually are,
/// so the tests order their own host-side copies explicitly (device_buffer synchronizes).
class test_stream {
public:
  test_stream() { ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~test_stream() { ZERO_CHECK_CUDA_NOTHROW(cudaStreamDestroy(stream_)); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  void sync() const { ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_)); }

private:
  cudaStream_t stream_ = nullptr;
};

/// `n` values of T drawn from a normal distribution of standard deviation `sigma`, rounded to T.
template <class T> [[nodiscard]] std::vector<T> random_values(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<T> out(n);
  for (auto& x : out) {
    x = from_float<T>(dist(rng));
  }
  return out;
}

/// Sizes that hit the scalar-only, head, body and tail paths and more than one block.
inline constexpr std::size_t test_sizes[] = {1, 3, 8, 17, 1000003};

} // namespace zero::test
