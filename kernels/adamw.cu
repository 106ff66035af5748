/// \file
/// zero::cuda::adamw_step for gradients and parameter copies in float, zero::f16 and zero::bf16.

#include "adamw.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

template <float_element G, float_element P>
void adamw_step(float* master, float* m, float* v, const G* grad, P* param_out, std::size_t n,
                const adamw_step_args& args, cudaStream_t stream) {
  kernels::launch_adamw_step(master, m, v, kernels::to_device(grad), kernels::to_device(param_out), n, args, stream);
}

#define ZERO_INSTANTIATE_ONE(G)                                                                                        \
  template void adamw_step<G, float>(float*, float*, float*, const G*, float*, std::size_t, const adamw_step_args&,    \
                                     cudaStream_t);                                                                    \
  template void adamw_step<G, f16>(float*, float*, float*, const G*, f16*, std::size_t, const adamw_step_args&,        \
                                   cudaStream_t);                                                                      \
  template void adamw_step<G, bf16>(float*, float*, float*, const G*, bf16*, std::size_t, const adamw_step_args&,      \
                                    cudaStream_t);

ZERO_INSTANTIATE_ONE(float)
ZERO_INSTANTIATE_ONE(f16)
ZERO_INSTANTIATE_ONE(bf16)

#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
