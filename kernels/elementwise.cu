/// \file
/// zero::cuda::fill, cast, unscale_and_check, accumulate and scale for float, zero::f16 and zero::bf16.

#include "elementwise.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

template <float_element T> void fill(T* data, std::size_t n, T value, cudaStream_t stream) {
  kernels::launch_fill(kernels::to_device(data), n, kernels::to_device_value(value), stream);
}

template <float_element S, float_element D> void cast(const S* src, D* dst, std::size_t n, cudaStream_t stream) {
  kernels::launch_cast(kernels::to_device(src), kernels::to_device(dst), n, stream);
}

template <float_element T>
void unscale_and_check(T* x, std::size_t n, float scale, int* found_nonfinite, cudaStream_t stream) {
  kernels::launch_unscale_and_check(kernels::to_device(x), n, scale, found_nonfinite, stream);
}

void fill(int* data, std::size_t n, int value, cudaStream_t stream) { kernels::launch_fill(data, n, value, stream); }

template <float_element S, float_element D> void accumulate(const S* src, D* dst, std::size_t n, cudaStream_t stream) {
  kernels::launch_accumulate(kernels::to_device(src), kernels::to_device(dst), n, stream);
}

template <float_element T> void scale(T* x, std::size_t n, float factor, cudaStream_t stream) {
  kernels::launch_scale(kernels::to_device(x), n, factor, stream);
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void fill<T>(T*, std::size_t, T, cudaStream_t);                                                             \
  template void unscale_and_check<T>(T*, std::size_t, float, int*, cudaStream_t);                                      \
  template void cast<T, float>(const T*, float*, std::size_t, cudaStream_t);                                           \
  template void cast<T, f16>(const T*, f16*, std::size_t, cudaStream_t);                                               \
  template void cast<T, bf16>(const T*, bf16*, std::size_t, cudaStream_t);                                             \
  template void accumulate<T, float>(const T*, float*, std::size_t, cudaStream_t);                                     \
  template void accumulate<T, f16>(const T*, f16*, std::size_t, cudaStream_t);                                         \
  template void accumulate<T, bf16>(const T*, bf16*, std::size_t, cudaStream_t);                                       \
  template void scale<T>(T*, std::size_t, float, cudaStream_t);

ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)

#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
