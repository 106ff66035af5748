#pragma once
/// \file
/// Helpers of the multi-GPU tests: the world sizes this machine can run (1 and 2 GPUs, and ranks sharing one GPU),
/// and host <-> device copies of small vectors.

#include "zero/core/cuda_check.hpp"

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <ostream>
#include <vector>

namespace zero::test {

/// World sizes to test: 1 and 2, as far as the machine has GPUs (a missing size is reported, not hidden).
inline std::vector<int> gpu_worlds() {
  int n = 0;
  ZERO_CHECK_CUDA(cudaGetDeviceCount(&n));
  std::vector<int> w;
  for (int k : {1, 2}) {
    if (k <= n) {
      w.push_back(k);
    } else {
      MESSAGE("only " << n << " GPU(s) visible: the " << k << "-GPU case is not run on this machine");
    }
  }
  return w;
}

/// Where a test's ranks run: one GPU each, a thread per GPU over NCCL (`run_gpus`), or all of them threads
/// sharing GPU 0 (`run_device_group`).
struct gpu_ranks {
  int world = 1;
  bool one_gpu = false;
  friend std::ostream& operator<<(std::ostream& os, const gpu_ranks& r) {
    return os << r.world << (r.one_gpu ? " ranks sharing one GPU" : " GPU(s), a rank each");
  }
};

/// The rank sets the engine's GPU tests run: `gpu_worlds()` (a rank per GPU), then 2 and 4 ranks sharing GPU 0,
/// where every multi-rank path runs on a machine with one GPU.
inline std::vector<gpu_ranks> gpu_rank_sets() {
  std::vector<gpu_ranks> sets;
  for (int w : gpu_worlds()) {
    sets.push_back({.world = w});
  }
  sets.push_back({.world = 2, .one_gpu = true});
  sets.push_back({.world = 4, .one_gpu = true});
  return sets;
}

/// A device copy of `h` (cudaMalloc'd; free with cudaFree).
template <class T> T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), h.size() * sizeof(T) + 1));
  ZERO_CHECK_CUDA(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

/// A host copy of `n` elements at `d` (synchronous).
template <class T> std::vector<T> to_host(const T* d, std::size_t n) {
  std::vector<T> h(n);
  ZERO_CHECK_CUDA(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

} // namespace zero::test
