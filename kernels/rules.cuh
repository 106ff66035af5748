#pragma once
/// \file
/// The update rules besides AdamW (zero/backend/update_rules.hpp: Lion, SGD, Adagrad, LAMB) as one kernel template over
/// a flat shard: one pass over memory (read grad, master and the rule's state tensors; write master, the state and
/// optionally the low-precision parameters), packs of four elements per thread (128-bit accesses of the fp32
/// streams), the grid covering the shard as `adamw_kernel`'s does. On an H100 with bf16 grad and param, 0.95-0.97 of
/// device copy bandwidth at 16M parameters, 0.98-1.0 from 64M to 256M, 0.89-0.93 at 4M (bench/cuda/bench_adamw.cpp).
/// Each element runs the rule's own `apply` with `device_ops`, whose `_rn` intrinsics round every operation on its
/// own as the CPU backend's `host_ops` does, so `zero::cuda::rule_step` and `cpu_backend::rule_step` give the same
/// bits. `zero::cuda::rule_step` (cuda_kernels.hpp) is this, instantiated for `rules::lion`, `rules::sgd`,
/// `rules::adagrad` and `rules::lamb` with G, P in {float, __half, __nv_bfloat16}. LAMB's first pass (its moments
/// and its tensor's two sums of squares, `rule_norms_kernel`) is `reduce.cuh`'s two-pass deterministic reduction,
/// in double.
///
/// A rule defined outside zero runs on the GPU, in the engine too (`engine::use_rule<Rule>()` with `cuda_backend`),
/// from a `.cu` of the user's own: give it update_rules.hpp's members (`apply` marked `ZERO_HOST_DEVICE`, so the
/// CPU backend's `rule_step` runs it too), include this file and instantiate `zero::cuda::rule_step` for it, at
/// namespace scope, compiled with nvcc in C++20 mode and without `--use_fast_math`:
///
///     #include <zero/kernels/rules.cuh>
///
///     struct my_rule { ... };  // name, max_state, state_names, factors, make, state_count, apply
///
///     ZERO_CUDA_RULE_STEP(my_rule)  // zero::cuda::rule_step<my_rule, G, P>, G and P in float, f16, bf16
///
/// A host translation unit then calls `zero::cuda::rule_step<my_rule>` (or `cuda_backend::rule_step`) as it calls
/// a built-in rule's, declared in zero/backend/cuda_kernels.hpp. `kernels::launch_rule_step` is the launcher
/// under it, for element types of the user's own.

#include "numeric.cuh"
#include "reduce.cuh"
#include "zero/backend/adamw_args.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/update_rules.hpp"

#include <array>
#include <cstddef>
#include <string>
#include <utility>

namespace zero::cuda::kernels {

/// An update rule's fp32 operations on the device (update_rules.hpp's `Ops`): each correctly rounded on its own;
/// the `_rn` intrinsics are never contracted into FMAs and ignore fast-math flags.
struct device_ops {
  /// a * b.
  __device__ __forceinline__ static float mul(float a, float b) { return __fmul_rn(a, b); }
  /// a / b.
  __device__ __forceinline__ static float div(float a, float b) { return __fdiv_rn(a, b); }
  /// a + b.
  __device__ __forceinline__ static float add(float a, float b) { return __fadd_rn(a, b); }
  /// a - b.
  __device__ __forceinline__ static float sub(float a, float b) { return __fsub_rn(a, b); }
  /// The square root of a.
  __device__ __forceinline__ static float sqrt(float a) { return __fsqrt_rn(a); }
  /// 1, -1, or a itself for 0, -0 and NaN (`rules::sign_of`).
  __device__ __forceinline__ static float sign(float a) { return zero::rules::sign_of(a); }
};

/// A rule's state tensors, passed to the kernel by value: the first `count` are in use, the rest null.
struct rule_state_buffers {
  float* tensor[max_rule_state]; ///< fp32, `n` elements each, read and written in place
};

/// The step of rule `Rule` over [0, n): `state` holds its `count` state tensors (count in [0, Rule::max_state]);
/// `param` may be null.
template <class Rule, class G, class P>
__global__ void __launch_bounds__(block_threads)
    rule_kernel(float* __restrict__ master, rule_state_buffers state, int count, const G* __restrict__ grad,
                P* __restrict__ param, ::cuda::std::size_t n, int head, typename Rule::factors f) {
  constexpr int N = pack_elems<float, G, P>;
  // One slot at least, so a rule without state still has an array to hand to `apply`.
  constexpr int slots = Rule::max_state > 0 ? static_cast<int>(Rule::max_state) : 1;
  for_each_element<N>(
      n, head,
      [&](::cuda::std::size_t i) {
        float w = master[i];
        float s[slots] = {};
#pragma unroll
        for (int j = 0; j < slots; ++j) {
          if (j < count) {
            s[j] = state.tensor[j][i];
          }
        }
        Rule::template apply<device_ops>(f, w, s, element_traits<G>::load(grad[i]));
        master[i] = w;
#pragma unroll
        for (int j = 0; j < slots; ++j) {
          if (j < count) {
            state.tensor[j][i] = s[j];
          }
        }
        if (param != nullptr) {
          param[i] = element_traits<P>::store(w);
        }
      },
      [&](::cuda::std::size_t i) {
        // Four elements: 128-bit accesses of master and the state, 64-bit of 16-bit grad and param, all loads
        // issued before the arithmetic. `count` is the same for every thread, so its branches do not diverge.
        float w[N];
        float g[N];
        float s[slots][N] = {};
        load_pack_float<N>(grad + i, g);
        load_pack_float<N>(master + i, w);
#pragma unroll
        for (int j = 0; j < slots; ++j) {
          if (j < count) {
            load_pack_float<N>(state.tensor[j] + i, s[j]);
          }
        }
#pragma unroll
        for (int k = 0; k < N; ++k) {
          float sk[slots];
#pragma unroll
          for (int j = 0; j < slots; ++j) {
            sk[j] = s[j][k];
          }
          Rule::template apply<device_ops>(f, w[k], sk, g[k]);
#pragma unroll
          for (int j = 0; j < slots; ++j) {
            s[j][k] = sk[j];
          }
        }
        store_pack_float<N>(master + i, w);
#pragma unroll
        for (int j = 0; j < slots; ++j) {
          if (j < count) {
            store_pack_float<N>(state.tensor[j] + i, s[j]);
          }
        }
        if (param != nullptr) {
          store_pack_float<N>(param + i, w);
        }
      });
}

/// The first index at which master, grad, param and the state tensors are all aligned for packs of `N`, or -1 (see
/// `common_pack_offset`); the tensors not in use are null, which every alignment accepts.
template <int N, class G, class P, std::size_t... J>
[[nodiscard]] int rule_pack_offset(std::size_t n, const float* master, const G* grad, const P* param,
                                   const rule_state_buffers& state, std::index_sequence<J...> /*tensors*/) noexcept {
  return common_pack_offset<N>(n, master, grad, param, static_cast<const float*>(state.tensor[J])...);
}

/// Enqueues `rule_kernel<Rule, G, P>` on `stream` (see zero::cuda::rule_step): `G` and `P` are CUDA element types
/// (float, __half, __nv_bfloat16, or any with an `element_traits` specialization; `to_device` turns zero's `f16`
/// and `bf16` pointers into them). The factors are `Rule::make(args)`, formed here on the host; only the first
/// `Rule::state_count(args)` entries of `state` are read (the others may be anything, null included).
/// \throws usage_error for a null master, grad or state tensor in use with `n > 0`, or a rule whose
///         `state_count` exceeds its `max_state`; cuda_error if the launch fails.
template <class Rule, class G, class P>
void launch_rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param,
                      std::size_t n, const zero::adamw_step_args& args, cudaStream_t stream) {
  static_assert(Rule::max_state <= max_rule_state,
                "zero::cuda::rule_step: a rule keeps at most zero::max_rule_state state tensors beside the master");
  constexpr const char* function = "zero::cuda::rule_step";
  const std::size_t count = Rule::state_count(args);
  if (count > Rule::max_state) {
    throw zero::usage_error(std::string(function) + ": " + std::string(Rule::name) + "::state_count gives " +
                            std::to_string(count) + " state tensors, more than its max_state " +
                            std::to_string(Rule::max_state));
  }
  require_buffer(master, n, function, "master");
  require_buffer(grad, n, function, "grad");
  rule_state_buffers buffers{};
  for (std::size_t j = 0; j < count; ++j) {
    require_buffer(state[j], n, function, ("state[" + std::to_string(j) + "]").c_str());
    buffers.tensor[j] = state[j];
  }
  if (n == 0) {
    return;
  }
  constexpr int N = pack_elems<float, G, P>;
  const int head = rule_pack_offset<N>(n, master, grad, param, buffers, std::make_index_sequence<max_rule_state>{});
  const unsigned grid = grid_blocks(work_items(n, head, N));
  rule_kernel<Rule, G, P><<<grid, block_threads, 0, stream>>>(master, buffers, static_cast<int>(count), grad, param, n,
                                                              head, Rule::make(args));
  check_launch("zero::cuda::kernels::rule_kernel");
}

/// Bytes of workspace `launch_rule_norms` needs for `n` elements: two doubles per first-pass block, the blocks
/// `squared_norm_blocks(n)` (a function of n alone).
[[nodiscard]] inline std::size_t rule_norms_workspace(std::size_t n) noexcept {
  return squared_norm_blocks(n) * 2 * sizeof(double);
}

/// The sums of `a` and `b` over the block in a fixed order (warp shuffles, then the first warp over the warp
/// sums), in double; valid in thread 0. Call at most once per kernel: it uses static shared memory.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  constexpr int warps = block_threads / 32;
  __shared__ double sums[2][warps];
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    a = __dadd_rn(a, __shfl_xor_sync(0xffffffffu, a, offset));
    b = __dadd_rn(b, __shfl_xor_sync(0xffffffffu, b, offset));
  }
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  if (lane == 0) {
    sums[0][warp] = a;
    sums[1][warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    a = lane < warps ? sums[0][lane] : 0.0;
    b = lane < warps ? sums[1][lane] : 0.0;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
      a = __dadd_rn(a, __shfl_xor_sync(0xffffffffu, a, offset));
      b = __dadd_rn(b, __shfl_xor_sync(0xffffffffu, b, offset));
    }
  }
}

/// LAMB's first pass over [0, n) (update_rules.hpp, `rules::has_trust_ratio`): `Rule::moments` on each element's
/// state, and this block's sums of master² and `Rule::direction`² in double into `partials[2 * blockIdx.x]`
/// and the next double. Grid-stride, so the elements a thread takes depend on n and the grid alone.
template <class Rule, class G>
__global__ void __launch_bounds__(block_threads)
    rule_norms_kernel(const float* __restrict__ master, rule_state_buffers state, const G* __restrict__ grad,
                      ::cuda::std::size_t n, typename Rule::factors f, double* __restrict__ partials) {
  constexpr int slots = Rule::max_state > 0 ? static_cast<int>(Rule::max_state) : 1;
  double w_sq = 0.0;
  double u_sq = 0.0;
  const ::cuda::std::size_t stride = static_cast<::cuda::std::size_t>(gridDim.x) * block_threads;
  for (::cuda::std::size_t i = static_cast<::cuda::std::size_t>(blockIdx.x) * block_threads + threadIdx.x; i < n;
       i += stride) {
    float s[slots] = {};
#pragma unroll
    for (int j = 0; j < static_cast<int>(Rule::max_state); ++j) {
      s[j] = state.tensor[j][i];
    }
    Rule::template moments<device_ops>(f, s, element_traits<G>::load(grad[i]));
#pragma unroll
    for (int j = 0; j < static_cast<int>(Rule::max_state); ++j) {
      state.tensor[j][i] = s[j];
    }
    const float w = master[i];
    const double wd = w;
    const double ud = Rule::template direction<device_ops>(f, w, s);
    w_sq = __dadd_rn(w_sq, __dmul_rn(wd, wd));
    u_sq = __dadd_rn(u_sq, __dmul_rn(ud, ud));
  }
  block_sum2(w_sq, u_sq);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = w_sq;
    partials[2 * blockIdx.x + 1] = u_sq;
  }
}

/// Second pass, one block: `out[0]`, `out[1]` = the sums of `count` blocks' partial pairs, in a fixed order.
template <class Rule>
__global__ void __launch_bounds__(block_threads)
    rule_norms_final_kernel(const double* __restrict__ partials, unsigned count, double* __restrict__ out) {
  double a = 0.0;
  double b = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += block_threads) {
    a = __dadd_rn(a, partials[2 * i]);
    b = __dadd_rn(b, partials[2 * i + 1]);
  }
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    out[0] = a;
    out[1] = b;
  }
}

/// Enqueues LAMB's first pass on `stream` (see zero::cuda::rule_norms): the moments, then `out[0]` the sum of
/// master² and `out[1]` of the direction² over the n elements, deterministic for a given n.
/// \throws usage_error for a null buffer in use, a small or misaligned workspace; cuda_error if a launch fails.
template <class Rule, class G>
void launch_rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad,
                       std::size_t n, const zero::adamw_step_args& args, double* out, void* workspace,
                       std::size_t workspace_bytes, cudaStream_t stream) {
  static_assert(zero::rules::has_trust_ratio<Rule>, "zero::cuda::rule_norms: the rule has no trust ratio");
  constexpr const char* function = "zero::cuda::rule_norms";
  require_buffer(out, 2, function, "out");
  require_buffer(master, n, function, "master");
  require_buffer(grad, n, function, "grad");
  rule_state_buffers buffers{};
  for (std::size_t j = 0; j < Rule::max_state; ++j) {
    require_buffer(state[j], n, function, ("state[" + std::to_string(j) + "]").c_str());
    buffers.tensor[j] = state[j];
  }
  const std::size_t blocks = squared_norm_blocks(n);
  const std::size_t needed = rule_norms_workspace(n);
  if (workspace_bytes < needed) {
    throw zero::usage_error(std::string(function) + ": workspace of " + std::to_string(workspace_bytes) +
                            " bytes is too small; n = " + std::to_string(n) + " needs " + std::to_string(needed) +
                            " (rule_norms_workspace_bytes)");
  }
  require_buffer(workspace, needed, function, "workspace");
  if (reinterpret_cast<std::uintptr_t>(workspace) % alignof(double) != 0) {
    throw zero::usage_error(std::string(function) + ": workspace must be 8-byte aligned");
  }
  auto* partials = static_cast<double*>(workspace);
  if (blocks > 0) {
    rule_norms_kernel<Rule, G><<<static_cast<unsigned>(blocks), block_threads, 0, stream>>>(master, buffers, grad, n,
                                                                                            Rule::make(args), partials);
    check_launch("zero::cuda::kernels::rule_norms_kernel");
  }
  rule_norms_final_kernel<Rule><<<1, block_threads, 0, stream>>>(partials, static_cast<unsigned>(blocks), out);
  check_launch("zero::cuda::kernels::rule_norms_final_kernel");
}

} // namespace zero::cuda::kernels

namespace zero::cuda {

// zero::cuda::rule_step and zero::cuda::rule_norms (declared in cuda_kernels.hpp): the kernels above for zero's
// element types. rules.cu instantiates them for the built-in rules; ZERO_CUDA_RULE_STEP for a user's.

template <class Rule, float_element G, float_element P>
void rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param_out,
               std::size_t n, const adamw_step_args& args, cudaStream_t stream) {
  kernels::launch_rule_step<Rule>(master, state, kernels::to_device(grad), kernels::to_device(param_out), n, args,
                                  stream);
}

template <class Rule, float_element G>
void rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad, std::size_t n,
                const adamw_step_args& args, double* out, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream) {
  kernels::launch_rule_norms<Rule>(master, state, kernels::to_device(grad), n, args, out, workspace, workspace_bytes,
                                   stream);
}

} // namespace zero::cuda

/// \cond ZERO_INTERNAL
#define ZERO_CUDA_RULE_STEP_ONE_(RULE, G)                                                                              \
  template void zero::cuda::rule_step<RULE, G, float>(float*, const std::array<float*, zero::max_rule_state>&,         \
                                                      const G*, float*, std::size_t, const zero::adamw_step_args&,     \
                                                      cudaStream_t);                                                   \
  template void zero::cuda::rule_step<RULE, G, zero::f16>(float*, const std::array<float*, zero::max_rule_state>&,     \
                                                          const G*, zero::f16*, std::size_t,                           \
                                                          const zero::adamw_step_args&, cudaStream_t);                 \
  template void zero::cuda::rule_step<RULE, G, zero::bf16>(float*, const std::array<float*, zero::max_rule_state>&,    \
                                                           const G*, zero::bf16*, std::size_t,                         \
                                                           const zero::adamw_step_args&, cudaStream_t);
/// \endcond

/// Instantiates `zero::cuda::rule_step<RULE, G, P>` for G and P each float, zero::f16 and zero::bf16: what
/// `cuda_backend::rule_step<RULE>` and the engine's `use_rule<RULE>()` link against. Use it once per rule, in one
/// `.cu` of the program, at namespace scope.
#define ZERO_CUDA_RULE_STEP(RULE)                                                                                      \
  ZERO_CUDA_RULE_STEP_ONE_(RULE, float)                                                                                \
  ZERO_CUDA_RULE_STEP_ONE_(RULE, zero::f16)                                                                            \
  ZERO_CUDA_RULE_STEP_ONE_(RULE, zero::bf16)

/// Instantiates `zero::cuda::rule_norms<RULE, G>` for G float, zero::f16 and zero::bf16: the first pass of a rule
/// with a trust ratio (`zero::rules::has_trust_ratio`).
#define ZERO_CUDA_RULE_NORMS(RULE)                                                                                     \
  template void zero::cuda::rule_norms<RULE, float>(const float*, const std::array<float*, zero::max_rule_state>&,     \
                                                    const float*, std::size_t, const zero::adamw_step_args&, double*,  \
                                                    void*, std::size_t, cudaStream_t);                                 \
  template void zero::cuda::rule_norms<RULE, zero::f16>(const float*, const std::array<float*, zero::max_rule_state>&, \
                                                        const zero::f16*, std::size_t, const zero::adamw_step_args&,   \
                                                        double*, void*, std::size_t, cudaStream_t);                    \
  template void zero::cuda::rule_norms<RULE, zero::bf16>(                                                              \
      const float*, const std::array<float*, zero::max_rule_state>&, const zero::bf16*, std::size_t,                   \
      const zero::adamw_step_args&, double*, void*, std::size_t, cudaStream_t);
