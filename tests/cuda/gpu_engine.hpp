#pragma once
/// \file
/// The engine harness of tests/engine on GPUs: one thread per GPU (`run_gpus`), or ranks as threads sharing
/// GPU 0 (`run_device_group`), `cuda_backend`, and engine views read and written through the engine's stream.

#include "../engine/engine_harness.hpp"
#include "gpu_group.hpp"
#include "zero/backend/cuda_backend.hpp"
#include "zero/comm/device_group_communicator.hpp"
#include "zero/comm/nccl_communicator.hpp"

#include <algorithm>
#include <cstddef>
#include <cuda_runtime_api.h>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zero::test {

/// `n` elements of T in device memory (cudaMalloc'd, freed with the object): what a communicator of ranks on GPUs
/// sends from and receives into. Movable, not copyable.
template <class T> class device_vector {
public:
  explicit device_vector(std::size_t n) : n_(n) {
    ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&p_), std::max<std::size_t>(n, 1) * sizeof(T)));
  }
  device_vector(device_vector&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  device_vector& operator=(device_vector&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { ZERO_CHECK_CUDA_NOTHROW(cudaFree(p_)); }

  [[nodiscard]] T* data() const noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }

private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

/// Reads and writes engine views in device memory, and the device buffers a communicator exchanges, ordered with
/// the engine's stream; each call returns once its copy is complete.
struct device_io {
  template <class T, class Engine> std::vector<T> read(Engine& eng, const zero::tensor_view& v) const {
    return download(eng, v.as<T>(), v.numel);
  }
  template <class T, class Engine> void write(Engine& eng, const zero::tensor_view& v, const std::vector<T>& x) const {
    upload(eng, v.as<T>(), x);
  }
  /// A buffer of `n` elements that a communicator sends from and receives into (all_to_all, send/recv).
  template <class T> device_vector<T> comm_buffer(std::size_t n) const { return device_vector<T>(n); }
  /// Copies `x` (at most the buffer's size) into `buf`. \throws std::length_error for more.
  template <class T, class Engine>
  void write_buffer(Engine& eng, device_vector<T>& buf, const std::vector<T>& x) const {
    if (x.size() > buf.size()) {
      throw std::length_error("device_io::write_buffer: " + std::to_string(x.size()) + " elements into a buffer of " +
                              std::to_string(buf.size()));
    }
    upload(eng, buf.data(), x);
  }
  /// The contents of `buf`.
  template <class T, class Engine> std::vector<T> read_buffer(Engine& eng, const device_vector<T>& buf) const {
    return download(eng, buf.data(), buf.size());
  }

private:
  template <class T, class Engine> static std::vector<T> download(Engine& eng, const T* d, std::size_t n) {
    std::vector<T> h(n);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost, eng.stream().get()));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(eng.stream().get()));
    return h;
  }
  template <class T, class Engine> static void upload(Engine& eng, T* d, const std::vector<T>& x) {
    ZERO_CHECK_CUDA(cudaMemcpyAsync(d, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice, eng.stream().get()));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(eng.stream().get()));
  }
};

/// `run_group` for the harness: rank i on GPU i, one thread each.
inline constexpr auto gpu_group = [](int world, auto&& fn) { zero::run_gpus(world, fn); };
/// Each rank's backend: its communicator's GPU.
inline constexpr auto gpu_backend = [](zero::nccl_communicator& comm) { return zero::cuda_backend(comm.device()); };

/// `train_with_engine` of the harness on `s.world` GPUs.
inline zero::testing::run_result train_on_gpus(const zero::testing::run_spec& s) {
  return zero::testing::train_with<zero::cuda_backend>(s, gpu_group, gpu_backend, device_io{});
}

/// `run_group` for the harness: `world` ranks as threads sharing GPU 0 (`device_group_communicator`).
inline constexpr auto one_gpu_group = [](int world, auto&& fn) { zero::run_device_group(world, fn); };
/// Each rank's backend: GPU 0, a stream of its own.
inline constexpr auto one_gpu_backend = [](zero::device_group_communicator&) { return zero::cuda_backend(0); };
/// The harness's rig (`zero::testing::rank_rig`) of ranks sharing GPU 0: `one_gpu_group`, `one_gpu_backend`,
/// `device_io`.
inline constexpr zero::testing::rank_rig one_gpu_rig{one_gpu_group, one_gpu_backend, device_io{}};

/// `train_with_engine` of the harness on `s.world` ranks of one GPU.
inline zero::testing::run_result train_on_one_gpu(const zero::testing::run_spec& s) {
  return zero::testing::train_with<zero::cuda_backend>(s, one_gpu_group, one_gpu_backend, device_io{});
}

/// `train_with_engine` of the harness on the ranks `r` (whose world `s` must have).
inline zero::testing::run_result train_on(const zero::testing::run_spec& s, const gpu_ranks& r) {
  REQUIRE(s.world == r.world);
  return r.one_gpu ? train_on_one_gpu(s) : train_on_gpus(s);
}

} // namespace zero::test
