/// \file
/// zero::cuda::quantize and dequantize for float, zero::f16 and zero::bf16.

#include "quantize.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

template <float_element T>
void quantize(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales, cudaStream_t stream) {
  kernels::launch_quantize(kernels::to_device(x), n, f, codes, scales, stream);
}

template <float_element T>
void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, T* out,
                cudaStream_t stream) {
  kernels::launch_dequantize(codes, scales, n, f, kernels::to_device(out), stream);
}

#define ZERO_INSTANTIATE_ONE(T)                                                                                        \
  template void quantize<T>(const T*, std::size_t, quant_format, std::uint8_t*, float*, cudaStream_t);                 \
  template void dequantize<T>(const std::uint8_t*, const float*, std::size_t, quant_format, T*, cudaStream_t);

ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)

#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
