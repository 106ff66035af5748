// A framework's own kernels, written from cpu_backend.hpp's "Numerics" section as anyone would write
// them: `a * b + c` and all. CMakeLists.txt compiles this file with -ffp-contract=off, as that section
// asks of a framework whose kernels must give zero's bits (a C++ compiler may fuse `a * b + c` into one
// FMA otherwise, on targets that have FMA). zero's own kernels, in the other files, get no such flag.
#include "framework_kernels.hpp"

#include <cmath>
#include <vector>

namespace framework {

template <class G, class P>
void adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                const zero::adamw_step_args& a) {
  const float step_size = a.lr / a.bias_correction1;
  const float sqrt_bc2 = std::sqrt(a.bias_correction2);
  const float decay = 1.0f - a.lr * a.weight_decay;
  for (std::size_t i = 0; i < n; ++i) {
    float g = zero::to_float(grad[i]) * a.grad_scale;
    if (!a.adam_w_mode) {
      g += a.weight_decay * master[i];
    }
    m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
    v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * g * g;
    if (a.adam_w_mode) {
      master[i] *= decay;
    }
    const float denom = std::sqrt(v[i]) / sqrt_bc2 + a.eps;
    master[i] -= step_size * m[i] / denom;
    if (param != nullptr) {
      param[i] = zero::from_float<P>(master[i]);
    }
  }
}

template <class T> float squared_norm(const T* x, std::size_t n, std::size_t chunk) {
  if (n == 0) {
    return 0.0f;
  }
  std::vector<float> sums;
  for (std::size_t b = 0; b < n; b += chunk) {
    float acc[16] = {};
    for (std::size_t i = 0; i < chunk && b + i < n; ++i) {
      const float f = zero::to_float(x[b + i]);
      acc[i % 16] += f * f;
    }
    for (std::size_t w = 8; w >= 1; w /= 2) {
      for (std::size_t j = 0; j < w; ++j) {
        acc[j] += acc[j + w];
      }
    }
    sums.push_back(acc[0]);
  }
  for (std::size_t w = 1; w < sums.size(); w *= 2) {
    for (std::size_t i = 0; i + w < sums.size(); i += 2 * w) {
      sums[i] += sums[i + w];
    }
  }
  return sums[0];
}

#define FRAMEWORK_ADAMW(G, P)                                                                                          \
  template void adamw_step<G, P>(float*, float*, float*, const G*, P*, std::size_t, const zero::adamw_step_args&);
#define FRAMEWORK_ADAMW_G(G) FRAMEWORK_ADAMW(G, float) FRAMEWORK_ADAMW(G, zero::f16) FRAMEWORK_ADAMW(G, zero::bf16)
FRAMEWORK_ADAMW_G(float)
FRAMEWORK_ADAMW_G(zero::f16)
FRAMEWORK_ADAMW_G(zero::bf16)
template float squared_norm<float>(const float*, std::size_t, std::size_t);
template float squared_norm<zero::f16>(const zero::f16*, std::size_t, std::size_t);
template float squared_norm<zero::bf16>(const zero::bf16*, std::size_t, std::size_t);

} // namespace framework
