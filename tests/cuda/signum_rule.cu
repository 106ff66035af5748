/// \file
/// zero::cuda::rule_step for a rule zero does not know: examples/custom_rule's Signum, instantiated here as a
/// framework instantiates its own (zero/kernels/rules.cuh), for the kernel test (test_rule_kernels.cpp) and the
/// engine's GPU case (test_engine_cuda.cpp).

#include "../../examples/custom_rule/signum.hpp"

#include <zero/kernels/rules.cuh>

ZERO_CUDA_RULE_STEP(signum)
