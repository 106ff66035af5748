#pragma once
// Kernels as a framework writes them to check zero::cpu_backend: plain scalar loops that follow the
// formulas of cpu_backend.hpp's "Numerics" section, in a translation unit of their own
// (framework_kernels.cpp), compiled as that section tells a framework to compile them.
#include "zero/backend/adamw_args.hpp"
#include "zero/core/dtype.hpp"

#include <cstddef>

namespace framework {

/// One Adam/AdamW step over n elements (zero/backend/adamw_args.hpp); `param` may be null.
/// Instantiated for G and P in float, f16, bf16.
template <class G, class P>
void adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                const zero::adamw_step_args& a);

/// The sum of float(x[i])^2 in cpu_backend's documented order for chunks of `chunk` elements.
/// Instantiated for T in float, f16, bf16.
template <class T> float squared_norm(const T* x, std::size_t n, std::size_t chunk);

} // namespace framework
