#pragma once
/// \file
/// The engine harness of tests/engine on GPUs: one thread per GPU (`run_gpus`), or ranks as threads sharing
/// GPU 0 (`run_device_group`), `cuda_backend`, and engine views read and written through the engine's stream.

#include "../engine/engine_harness.hpp"
#include "gpu_group.hpp"
#include "zero/backend/cuda_backend.hpp"
#include "zero/comm/device_group_communicator.hpp"
#include "zero/comm/nccl_communicator.hpp"

#include <cuda_runtime_api.h>
#include <vector>

namespace zero::test {

/// Reads and writes engine views in device memory, ordered with the engine's stream.
struct device_io {
  template <class T, class Engine> std::vector<T> read(Engine& eng, const zero::tensor_view& v) const {
    std::vector<T> h(v.numel);
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(h.data(), v.as<T>(), v.numel * sizeof(T), cudaMemcpyDeviceToHost, eng.stream().get()));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(eng.stream().get()));
    return h;
  }
  template <class T, class Engine> void write(Engine& eng, const zero::tensor_view& v, const std::vector<T>& x) const {
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(v.as<T>(), x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice, eng.stream().get()));
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
