/// \file
/// zero::cuda::rule_step for `rules::lion`, `rules::sgd`, `rules::adagrad` and `rules::lamb`
/// (zero/backend/update_rules.hpp), with gradients and parameter copies in float, zero::f16 and zero::bf16; and
/// LAMB's first pass, zero::cuda::rule_norms, with gradients in each: rules.cuh's templates, instantiated with the
/// macros a framework's own rule uses.

#include "rules.cuh"
#include "zero/backend/cuda_kernels.hpp"

namespace zero::cuda {

std::size_t rule_norms_workspace_bytes(std::size_t n) { return kernels::rule_norms_workspace(n); }

} // namespace zero::cuda

ZERO_CUDA_RULE_STEP(zero::rules::lion)
ZERO_CUDA_RULE_STEP(zero::rules::sgd)
ZERO_CUDA_RULE_STEP(zero::rules::adagrad)
ZERO_CUDA_RULE_STEP(zero::rules::lamb)
ZERO_CUDA_RULE_NORMS(zero::rules::lamb)
