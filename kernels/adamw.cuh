#pragma once
/// \file
/// The fused Adam/AdamW step over a flat shard: one pass over memory (read grad, master, m, v; write
/// master, m, v and optionally the low-precision parameters), four elements per thread (128-bit accesses of
/// the fp32 streams), a grid-stride loop over a grid that covers the shard. On an H200, 0.97-0.98 of device
/// copy bandwidth for 64M-256M parameters, 0.90 from 4M (bench/cuda/bench_adamw.cpp).
/// `zero::cuda::adamw_step` (cuda_kernels.hpp) is this, instantiated for G, P in {float, __half,
/// __nv_bfloat16}. The math is `zero/backend/adamw_args.hpp`'s, operation for operation.

#include "numeric.cuh"
#include "zero/backend/adamw_args.hpp"

#include <cmath>

namespace zero::cuda::kernels {

/// The per-step constants of `adamw_step_args`, formed once on the host in fp32 exactly as the formula
/// writes them, so every thread (and a CPU evaluating the formula) uses the same rounded factors.
struct adamw_factors {
  float grad_scale;      ///< multiplies every gradient
  float beta1;           ///< first-moment decay
  float one_minus_beta1; ///< 1 - beta1
  float beta2;           ///< second-moment decay
  float one_minus_beta2; ///< 1 - beta2
  float eps;             ///< added to the bias-corrected sqrt(v)
  float weight_decay;    ///< L2 factor (Adam mode)
  float decay;           ///< 1 - lr * weight_decay (AdamW mode)
  float sqrt_bc2;        ///< sqrt(bias_correction2)
  float step_size;       ///< lr / bias_correction1
  bool adam_w_mode;      ///< decoupled weight decay when true, L2 added to the gradient when false
};

/// The factors of one step.
[[nodiscard]] inline adamw_factors make_adamw_factors(const zero::adamw_step_args& a) noexcept {
  adamw_factors f{};
  f.grad_scale = a.grad_scale;
  f.beta1 = a.beta1;
  f.one_minus_beta1 = 1.0f - a.beta1;
  f.beta2 = a.beta2;
  f.one_minus_beta2 = 1.0f - a.beta2;
  f.eps = a.eps;
  f.weight_decay = a.weight_decay;
  // volatile keeps a host compiler allowed to contract (-ffp-contract=fast with FMA) from fusing this
  // multiply into the subtraction, which would round once instead of twice as the formula does.
  const volatile float lr_times_decay = a.lr * a.weight_decay;
  f.decay = 1.0f - lr_times_decay;
  f.sqrt_bc2 = std::sqrt(a.bias_correction2);
  f.step_size = a.lr / a.bias_correction1;
  f.adam_w_mode = a.adam_w_mode;
  return f;
}

/// One element of the step, in adamw_args.hpp's order, each operation correctly rounded (the `_rn`
/// intrinsics are never contracted into FMAs and ignore fast-math flags).
__device__ __forceinline__ void adamw_update(float& master, float& m, float& v, float grad, const adamw_factors& f) {
  float g = __fmul_rn(grad, f.grad_scale);
  if (!f.adam_w_mode) {
    g = __fadd_rn(g, __fmul_rn(f.weight_decay, master));
  }
  m = __fadd_rn(__fmul_rn(f.beta1, m), __fmul_rn(f.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(f.beta2, v), __fmul_rn(__fmul_rn(f.one_minus_beta2, g), g));
  if (f.adam_w_mode) {
    master = __fmul_rn(master, f.decay);
  }
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), f.sqrt_bc2), f.eps);
  master = __fsub_rn(master, __fdiv_rn(__fmul_rn(f.step_size, m), denom));
}

/// The step over [0, n); `param` may be null.
template <class G, class P>
__global__ void __launch_bounds__(block_threads)
    adamw_kernel(float* __restrict__ master, float* __restrict__ m, float* __restrict__ v, const G* __restrict__ grad,
                 P* __restrict__ param, ::cuda::std::size_t n, int head, adamw_factors f) {
  constexpr int N = pack_elems<float, G, P>;
  for_each_element<N>(
      n, head,
      [&](::cuda::std::size_t i) {
        float w = master[i];
        float mi = m[i];
        float vi = v[i];
        adamw_update(w, mi, vi, element_traits<G>::load(grad[i]), f);
        master[i] = w;
        m[i] = mi;
        v[i] = vi;
        if (param != nullptr) {
          param[i] = element_traits<P>::store(w);
        }
      },
      [&](::cuda::std::size_t i) {
        // Four elements: 128-bit accesses of master, m and v, 64-bit of 16-bit grad and param, all loads
        // issued before the arithmetic.
        float w[N];
        float mi[N];
        float vi[N];
        float g[N];
        load_pack_float<N>(grad + i, g);
        load_pack_float<N>(master + i, w);
        load_pack_float<N>(m + i, mi);
        load_pack_float<N>(v + i, vi);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          adamw_update(w[k], mi[k], vi[k], g[k], f);
        }
        store_pack_float<N>(master + i, w);
        store_pack_float<N>(m + i, mi);
        store_pack_float<N>(v + i, vi);
        if (param != nullptr) {
          store_pack_float<N>(param + i, w);
        }
      });
}

/// Enqueues `adamw_kernel` on `stream` (see zero::cuda::adamw_step).
/// \throws usage_error for a null required buffer with `n > 0`; cuda_error if the launch fails.
template <class G, class P>
void launch_adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                       const zero::adamw_step_args& args, cudaStream_t stream) {
  constexpr const char* function = "zero::cuda::adamw_step";
  require_buffer(master, n, function, "master");
  require_buffer(m, n, function, "m");
  require_buffer(v, n, function, "v");
  require_buffer(grad, n, function, "grad");
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<float, G, P>;
  const int head = common_pack_offset<N>(n, static_cast<const float*>(master), static_cast<const float*>(m),
                                         static_cast<const float*>(v), grad, static_cast<const P*>(param));
  const unsigned grid = grid_blocks(work_items(n, head, N));
  adamw_kernel<G, P><<<grid, block_threads, 0, stream>>>(master, m, v, grad, param, n, head, make_adamw_factors(args));
  check_launch("zero::cuda::kernels::adamw_kernel");
}

} // namespace zero::cuda::kernels
