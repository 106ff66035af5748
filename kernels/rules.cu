/// \file
/// zero::cuda::rule_step for `rules::lion`, `rules::sgd`, `rules::adagrad` and `rules::lamb`
/// (zero/backend/update_rules.hpp), with gradients and parameter copies in float, zero::f16 and zero::bf16; and
/// LAMB's first pass, zero::cuda::rule_norms, with gradients in each.

#include "rules.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

template <class Rule, float_element G, float_element P>
void rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param_out,
               std::size_t n, const adamw_step_args& args, cudaStream_t stream) {
  kernels::launch_rule_step<Rule>(master, state, kernels::to_device(grad), kernels::to_device(param_out), n, args,
                                  stream);
}

std::size_t rule_norms_workspace_bytes(std::size_t n) { return kernels::rule_norms_workspace(n); }

template <class Rule, float_element G>
void rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad, std::size_t n,
                const adamw_step_args& args, double* out, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream) {
  kernels::launch_rule_norms<Rule>(master, state, kernels::to_device(grad), n, args, out, workspace, workspace_bytes,
                                   stream);
}

template void rule_norms<rules::lamb, float>(const float*, const std::array<float*, max_rule_state>&, const float*,
                                             std::size_t, const adamw_step_args&, double*, void*, std::size_t,
                                             cudaStream_t);
template void rule_norms<rules::lamb, f16>(const float*, const std::array<float*, max_rule_state>&, const f16*,
                                           std::size_t, const adamw_step_args&, double*, void*, std::size_t,
                                           cudaStream_t);
template void rule_norms<rules::lamb, bf16>(const float*, const std::array<float*, max_rule_state>&, const bf16*,
                                            std::size_t, const adamw_step_args&, double*, void*, std::size_t,
                                            cudaStream_t);

#define ZERO_INSTANTIATE_ONE(RULE, G)                                                                                  \
  template void rule_step<RULE, G, float>(float*, const std::array<float*, max_rule_state>&, const G*, float*,         \
                                          std::size_t, const adamw_step_args&, cudaStream_t);                          \
  template void rule_step<RULE, G, f16>(float*, const std::array<float*, max_rule_state>&, const G*, f16*,             \
                                        std::size_t, const adamw_step_args&, cudaStream_t);                            \
  template void rule_step<RULE, G, bf16>(float*, const std::array<float*, max_rule_state>&, const G*, bf16*,           \
                                         std::size_t, const adamw_step_args&, cudaStream_t);
#define ZERO_INSTANTIATE_RULE(RULE)                                                                                    \
  ZERO_INSTANTIATE_ONE(RULE, float)                                                                                    \
  ZERO_INSTANTIATE_ONE(RULE, f16)                                                                                      \
  ZERO_INSTANTIATE_ONE(RULE, bf16)

ZERO_INSTANTIATE_RULE(rules::lion)
ZERO_INSTANTIATE_RULE(rules::sgd)
ZERO_INSTANTIATE_RULE(rules::adagrad)
ZERO_INSTANTIATE_RULE(rules::lamb)

#undef ZERO_INSTANTIATE_RULE
#undef ZERO_INSTANTIATE_ONE

} // namespace zero::cuda
