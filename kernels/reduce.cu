/// \file
/// zero::cuda::squared_norm and its workspace query for float, zero::f16 and zero::bf16.

#include "reduce.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

template <float_element T> std::size_t squared_norm_workspace_bytes(std::size_t n) {
  return kernels::squared_norm_workspace(n);
}

template <float_element T>
void squared_norm(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
                  cudaStream_t stream) {
  kernels::launch_squared_norm(kernels::to_device(x), n, out, workspace, workspace_bytes, stream);
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template std::size_t squared_norm_workspace_bytes<T>(std::size_t);                                                   \
  template void squared_norm<T>(const T*, std::size_t, float*, void*, std::size_t, cudaStream_t);

ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)

#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
