#pragma once
/// \file
/// `cuda_backend`: the `zero::backend` of one CUDA device. Kernels are the launchers of `zero::cuda`
/// (zero/backend/cuda_kernels.hpp, link `zero::cuda`); streams are non-blocking CUDA streams, events are
/// CUDA events without timing; memory comes from a `caching_pool<device_allocator>`, so a loop that
/// allocates the same sizes every step (stage 3's gathered modules) reaches `cudaMalloc` only in its first
/// step.
///
/// Every kernel is stream-ordered and returns at once; nothing here synchronizes the device. The two
/// blocking calls are `synchronize` (one stream or one event) and `read_scalar`, which copies one value
/// through a pinned host word and waits for that stream only.
///
/// Host code; compiles with a plain C++20 compiler given CUDA's include directory.

#include "zero/backend/backend.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/quantize.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/memory/device_allocator.hpp"
#include "zero/memory/pinned_allocator.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <string>
#include <string_view>
#include <utility>

namespace zero {

namespace detail {
/// The driver's `cuStreamWaitValue32`, found once through `cudaGetDriverEntryPointByVersion` (CUDA 12's
/// signature). \throws cuda_error when the driver has none.
inline PFN_cuStreamWaitValue32_v11070 driver_wait_value32() {
  static const PFN_cuStreamWaitValue32_v11070 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    ZERO_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr) {
      throw cuda_error("cuStreamWaitValue32: the CUDA driver has no such entry point (it needs a driver of CUDA 12 "
                       "or later)",
                       static_cast<int>(found));
    }
    return reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(p);
  }();
  return fn;
}
} // namespace detail

/// An owned CUDA stream (non-blocking: it does not wait for the legacy default stream). Move-only.
class cuda_stream {
public:
  /// Creates a stream on the current device. \throws cuda_error when CUDA fails.
  cuda_stream() { ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  cuda_stream(cuda_stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  cuda_stream& operator=(cuda_stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() {
    if (s_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaStreamDestroy(s_));
    }
  }
  /// The native handle, for the framework's own kernels and libraries (cuBLAS, NCCL).
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

private:
  cudaStream_t s_ = nullptr;
};

/// An owned CUDA event without timing (the cheapest kind, for ordering). Move-only.
class cuda_event {
public:
  /// Creates an event on the current device. \throws cuda_error when CUDA fails.
  cuda_event() { ZERO_CHECK_CUDA(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  cuda_event(cuda_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  cuda_event& operator=(cuda_event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() {
    if (e_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e_));
    }
  }
  /// The native handle.
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

private:
  cudaEvent_t e_ = nullptr;
};

/// The backend of one CUDA device; see the file comment. One instance per device (per rank thread);
/// its calls are not meant to be shared between threads. Move-only.
class cuda_backend {
public:
  /// Streams: `cuda_stream`.
  using stream_type = cuda_stream;
  /// Events: `cuda_event`.
  using event_type = cuda_event;
  /// Device memory through a caching pool.
  using allocator_type = caching_pool<device_allocator>;
  /// Host memory for state offloaded from the device (ZeRO-Offload): pinned, so copies overlap, and
  /// on huge pages where the host allows, so the host AdamW streams through it faster.
  using host_allocator_type = huge_pinned_allocator;

  /// The backend of `device`, which becomes the calling thread's current device (the streams and
  /// events it makes belong to it).
  /// \throws cuda_error when the device does not exist or CUDA fails.
  explicit cuda_backend(int device) : device_(device), alloc_(device_allocator(select(device))) {
    ZERO_CHECK_CUDA(cudaMallocHost(&host_word_, sizeof(double)));
  }
  /// The backend of the calling thread's current device.
  cuda_backend() : cuda_backend(current_device()) {}

  cuda_backend(cuda_backend&& o) noexcept
      : device_(o.device_), alloc_(std::move(o.alloc_)), host_word_(std::exchange(o.host_word_, nullptr)) {}
  cuda_backend& operator=(cuda_backend&&) = delete;
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;
  ~cuda_backend() {
    if (host_word_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaFreeHost(host_word_));
    }
  }

  /// "cuda".
  [[nodiscard]] std::string_view name() const noexcept { return "cuda"; }
  /// The device.
  [[nodiscard]] int device() const noexcept { return device_; }
  /// The pool the engine allocates model state and buffers from (copies share it).
  [[nodiscard]] allocator_type get_allocator() const { return alloc_; }

  /// A new stream on the device. \throws cuda_error.
  [[nodiscard]] stream_type make_stream() const { return {}; }
  /// A new event on the device. \throws cuda_error.
  [[nodiscard]] event_type make_event() const { return {}; }
  /// Marks the point `s` has reached. \throws cuda_error.
  void record(event_type& e, const stream_type& s) const { ZERO_CHECK_CUDA(cudaEventRecord(e.get(), s.get())); }
  /// Makes `s` wait for `e` on the device; the host does not block. \throws cuda_error.
  void wait(const stream_type& s, const event_type& e) const {
    ZERO_CHECK_CUDA(cudaStreamWaitEvent(s.get(), e.get(), 0));
  }
  /// Blocks the host until the work on `s` is done. \throws cuda_error (a fault of a kernel on `s`).
  void synchronize(const stream_type& s) const { ZERO_CHECK_CUDA(cudaStreamSynchronize(s.get())); }
  /// Blocks the host until `e`'s point is reached. \throws cuda_error.
  void synchronize(const event_type& e) const { ZERO_CHECK_CUDA(cudaEventSynchronize(e.get())); }

  /// Makes `s` wait, without blocking the host, until the word at `word` (pinned host memory from
  /// `host_allocator_type`) reaches `value` cyclically (`zero::can_wait_value`): the driver's
  /// `cuStreamWaitValue32` with `CU_STREAM_WAIT_VALUE_GEQ`, found through the runtime, so nothing
  /// links against the driver library. \throws cuda_error when `word` is not mapped for the device, or
  /// the driver refuses the wait (its `CUresult` in the message).
  void wait_value(const stream_type& s, const std::uint32_t* word, std::uint32_t value) const {
    void* mapped = nullptr;
    ZERO_CHECK_CUDA(cudaHostGetDevicePointer(&mapped, const_cast<std::uint32_t*>(word), 0));
    const CUresult r =
        detail::driver_wait_value32()(s.get(), reinterpret_cast<CUdeviceptr>(mapped), value, CU_STREAM_WAIT_VALUE_GEQ);
    if (r != CUDA_SUCCESS) {
      throw cuda_error("cuStreamWaitValue32 failed with CUresult " + std::to_string(static_cast<int>(r)) +
                           " (stream memory operations; the offloaded step's uploads wait on a host word with it)",
                       static_cast<int>(r));
    }
  }

  /// Waits for `s` and returns `*p` (an `int` flag or a `float` result in device memory), copied
  /// through a pinned word. \throws usage_error for a null `p`; cuda_error.
  template <class T> [[nodiscard]] T read_scalar(const T* p, const stream_type& s) {
    static_assert(sizeof(T) <= sizeof(double));
    if (p == nullptr) {
      throw usage_error("cuda_backend::read_scalar: p is null");
    }
    ZERO_CHECK_CUDA(cudaMemcpyAsync(host_word_, p, sizeof(T), cudaMemcpyDeviceToHost, s.get()));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(s.get()));
    T v;
    std::memcpy(&v, host_word_, sizeof(T));
    return v;
  }

  /// Copies `bytes` between host and device memory, either way, in `s` order (`cudaMemcpyDefault`).
  /// Pageable host memory makes the copy synchronous for the host; pinned memory keeps it asynchronous.
  /// \throws cuda_error.
  void copy(const void* src, void* dst, std::size_t bytes, const stream_type& s) const {
    if (bytes > 0) {
      ZERO_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s.get()));
    }
  }

  /// See zero::cuda::adamw_step.
  template <backend_float G, backend_float P>
  void adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                  const adamw_step_args& args, const stream_type& s) const {
    cuda::adamw_step(master, m, v, grad, param, n, args, s.get());
  }
  /// See zero::cuda::rule_step.
  template <class Rule, backend_float G, backend_float P>
  void rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param, std::size_t n,
                 const adamw_step_args& args, const stream_type& s) const {
    cuda::rule_step<Rule>(master, state, grad, param, n, args, s.get());
  }
  /// See zero::cuda::rule_norms_workspace_bytes.
  [[nodiscard]] std::size_t rule_norms_workspace_bytes(std::size_t n) const {
    return cuda::rule_norms_workspace_bytes(n);
  }
  /// See zero::cuda::rule_norms.
  template <class Rule, backend_float G>
  requires rules::has_trust_ratio<Rule>
  void rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad, std::size_t n,
                  const adamw_step_args& args, double* out, void* workspace, std::size_t workspace_bytes,
                  const stream_type& s) const {
    cuda::rule_norms<Rule>(master, state, grad, n, args, out, workspace, workspace_bytes, s.get());
  }
  /// See zero::cuda::cast.
  template <backend_float S, backend_float D>
  void cast(const S* src, D* dst, std::size_t n, const stream_type& s) const {
    cuda::cast(src, dst, n, s.get());
  }
  /// See zero::cuda::unscale_and_check.
  template <backend_float T>
  void unscale_and_check(T* x, std::size_t n, float factor, int* flag, const stream_type& s) const {
    cuda::unscale_and_check(x, n, factor, flag, s.get());
  }
  /// See zero::cuda::squared_norm_workspace_bytes.
  template <backend_float T> [[nodiscard]] std::size_t squared_norm_workspace_bytes(std::size_t n) const {
    return cuda::squared_norm_workspace_bytes<T>(n);
  }
  /// See zero::cuda::squared_norm.
  template <backend_float T>
  void squared_norm(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
                    const stream_type& s) const {
    cuda::squared_norm(x, n, out, workspace, workspace_bytes, s.get());
  }
  /// See zero::cuda::fill (float, f16, bf16 and int flags).
  template <class T>
  requires backend_float<T> || std::same_as<T, int>
  void fill(T* x, std::size_t n, T value, const stream_type& s) const { cuda::fill(x, n, value, s.get()); }
  /// See zero::cuda::gather.
  template <backend_float T>
  void gather(const T* src, const std::uint32_t* index, std::size_t n, T* dst, const stream_type& s) const {
    cuda::gather(src, index, n, dst, s.get());
  }
  /// See zero::cuda::scatter.
  template <backend_float T>
  void scatter(const T* src, const std::uint32_t* index, std::size_t n, T* dst, const stream_type& s) const {
    cuda::scatter(src, index, n, dst, s.get());
  }
  /// See zero::cuda::accumulate.
  template <backend_float S, backend_float D>
  void accumulate(const S* src, D* dst, std::size_t n, const stream_type& s) const {
    cuda::accumulate(src, dst, n, s.get());
  }
  /// See zero::cuda::scale.
  template <backend_float T> void scale(T* x, std::size_t n, float factor, const stream_type& s) const {
    cuda::scale(x, n, factor, s.get());
  }
  /// See zero::cuda::quantize.
  template <backend_float T>
  void quantize(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales,
                const stream_type& s) const {
    cuda::quantize(x, n, f, codes, scales, s.get());
  }
  /// See zero::cuda::dequantize.
  template <backend_float T>
  void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, T* out,
                  const stream_type& s) const {
    cuda::dequantize(codes, scales, n, f, out, s.get());
  }

private:
  static int current_device() {
    int d = 0;
    ZERO_CHECK_CUDA(cudaGetDevice(&d));
    return d;
  }
  static int select(int device) {
    ZERO_CHECK_CUDA(cudaSetDevice(device));
    return device;
  }

  int device_;
  allocator_type alloc_;
  void* host_word_ = nullptr;
};

static_assert(backend<cuda_backend>);
static_assert(can_copy<cuda_backend>);
static_assert(can_quantize<cuda_backend>);
static_assert(can_index_copy<cuda_backend>);

} // namespace zero
