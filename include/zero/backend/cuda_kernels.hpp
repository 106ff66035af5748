#pragma once
/// \file
/// Host launchers of the CUDA kernels ZeRO needs: fill, cast, accumulate, scale, unscale-and-check, squared
/// norm, the fused AdamW step over a flat shard, the other update rules' step (Lion, SGD, Adagrad), and ZeRO++'s
/// block quantization. Compiles with a plain C++20 compiler; the kernels are compiled once into `zero::cuda` for
/// `float`, `zero::f16` and `zero::bf16` (bit-compatible with `__half` and `__nv_bfloat16`). A `.cu` of the user's
/// own that needs another element type or update rule includes the kernel templates from `<zero/kernels/*.cuh>`
/// instead.
///
/// Conventions shared by every launcher, in the manner of `nccl.h`:
/// - Pointers are device-accessible memory (device or mapped pinned memory) owned by the caller. The
///   launcher only enqueues work on `stream`: each buffer is read or written in `stream` order, so the
///   caller must not touch it from another stream until that work is complete (an event recorded on
///   `stream` after the call orders it).
/// - Launchers never allocate and never synchronize, so they may be captured into a CUDA graph.
///   Reductions take a caller-provided workspace sized by a `*_workspace_bytes(n)` query (CUB's idiom).
/// - Each thread moves packs of consecutive elements, 16 bytes of the kernel's widest element type (128-bit
///   accesses; 64-bit ones for 16-bit streams beside fp32 ones), and a warp's accesses are contiguous. Any
///   alignment of the element pointers works: when all of a kernel's pointers reach pack alignment at the
///   same element index (always, for 16-byte aligned buffers), the body runs with vector accesses and the
///   first and last few elements with scalar ones; otherwise the whole range runs scalar.
/// - `n == 0` enqueues nothing (except `squared_norm`, which writes 0).
/// - Errors: a null pointer with `n > 0` or a too small workspace throws `zero::usage_error` before
///   anything is enqueued; a failed launch throws `zero::cuda_error` (the status of `cudaGetLastError`).
/// - Numerics: every conversion to f16/bf16 rounds to nearest even; arithmetic is fp32 with each
///   operation correctly rounded (the kernels use `__fmul_rn`-style intrinsics, so no FMA contraction and
///   no fast-math), which is what a plain fp32 C++ implementation of the same expression computes.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/quantize.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/dtype.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <span>

namespace zero::cuda {

/// The most buffers `reduce_ranks` reduces: the ranks of a `device_group_communicator` group.
inline constexpr std::size_t max_reduce_ranks = 16;

/// What `reduce_ranks` computes per element.
enum class rank_reduce : std::uint8_t { sum, avg, max };

/// `out[o][i] = in[0][i] op in[1][i] op ...` in rank order for every output o (avg: the sum divided by the number
/// of inputs, once, at the end), for i in [0, n): the 16-bit types accumulate in fp32 and round once to nearest
/// even, the others in their own type. One input and several outputs is a copy to all of them. An output may be
/// one of the inputs (each element is read from every input before it is written). 16 bytes per access where
/// every buffer has the same offset from 16-byte alignment, one element per access otherwise. Instantiated for
/// float, f16, bf16, double, int32, int64 and uint8; avg of an integer type divides as the type does.
/// \throws usage_error for no input or output, or more than `max_reduce_ranks` of either, or a null buffer
///         with n > 0; cuda_error if the launch fails.
template <class T>
void reduce_ranks(std::span<T* const> out, std::span<const T* const> in, std::size_t n, rank_reduce op,
                  cudaStream_t stream);

/// `reduce_ranks` into the one buffer `out`.
template <class T>
void reduce_ranks(T* out, std::span<const T* const> in, std::size_t n, rank_reduce op, cudaStream_t stream) {
  T* const outs[1] = {out};
  reduce_ranks(std::span<T* const>(outs), in, n, op, stream);
}

/// The element types `zero::cuda` is compiled for: `float`, `zero::f16` and `zero::bf16`.
template <class T>
concept float_element = std::same_as<T, float> || std::same_as<T, f16> || std::same_as<T, bf16>;

/// Sets `data[i] = value` for every i in [0, n).
/// \param data   device-accessible buffer of `n` elements, written in `stream` order.
/// \param n      number of elements.
/// \param value  the value to store (bits copied as they are, NaN payloads included).
/// \param stream the stream that orders the write.
/// \throws usage_error if `data` is null and `n > 0`; cuda_error if the launch fails.
template <float_element T> void fill(T* data, std::size_t n, T value, cudaStream_t stream);

/// `dst[i] = src[index[i]]` for every i in [0, n), in `stream` order (all three in device memory).
/// \throws usage_error if a pointer is null and `n > 0`; cuda_error if the launch fails.
template <float_element T>
void gather(const T* src, const std::uint32_t* index, std::size_t n, T* dst, cudaStream_t stream);
/// `dst[index[i]] = src[i]` for every i in [0, n), the indices distinct, in `stream` order.
/// \throws usage_error if a pointer is null and `n > 0`; cuda_error if the launch fails.
template <float_element T>
void scatter(const T* src, const std::uint32_t* index, std::size_t n, T* dst, cudaStream_t stream);

/// Sets `data[i] = value` for every i in [0, n): the `int` flags of `unscale_and_check`.
/// \throws usage_error if `data` is null and `n > 0`; cuda_error if the launch fails.
void fill(int* data, std::size_t n, int value, cudaStream_t stream);

/// Converts `n` elements: `dst[i] = D(src[i])`, rounding to nearest even when D is narrower. Inf and NaN
/// stay inf and NaN (a NaN becomes the canonical quiet NaN of D), f16 overflow gives inf, subnormals are
/// kept (no flush to zero). When S and D are the same type the bits are copied unchanged.
/// \param src    device-accessible input of `n` elements, read in `stream` order.
/// \param dst    device-accessible output of `n` elements, written in `stream` order; must not overlap `src`.
/// \param n      number of elements.
/// \param stream the stream that orders the read and the write.
/// \throws usage_error if a pointer is null and `n > 0`; cuda_error if the launch fails.
template <float_element S, float_element D> void cast(const S* src, D* dst, std::size_t n, cudaStream_t stream);

/// Accumulates `n` elements: `dst[i] = D(float(dst[i]) + float(src[i]))`, the fp32 sum rounded to nearest
/// even (gradient accumulation over micro-steps, in the gradient dtype or into an fp32 accumulator).
/// \param src    device-accessible input of `n` elements, read in `stream` order.
/// \param dst    device-accessible accumulator of `n` elements, read and written in `stream` order; must not
///               overlap `src`.
/// \param n      number of elements.
/// \param stream the stream that orders every access.
/// \throws usage_error if a pointer is null and `n > 0`; cuda_error if the launch fails.
template <float_element S, float_element D> void accumulate(const S* src, D* dst, std::size_t n, cudaStream_t stream);

/// Scales in place: `x[i] = T(float(x[i]) * factor)`, rounded to nearest even.
/// \param x      device-accessible buffer of `n` elements, read and written in `stream` order.
/// \param n      number of elements.
/// \param factor the factor.
/// \param stream the stream that orders every access.
/// \throws usage_error if `x` is null and `n > 0`; cuda_error if the launch fails.
template <float_element T> void scale(T* x, std::size_t n, float factor, cudaStream_t stream);

/// Multiplies in place, `x[i] = T(float(x[i]) * scale)`, and sets `*found_nonfinite = 1` when any element
/// is inf or NaN before or after the scaling (after rounding to T, so an f16 overflow is caught). The flag
/// is only ever set, never cleared: zero it before the first call of a step (e.g. `cudaMemsetAsync` on
/// the same stream) and read it after the work on `stream` is complete. Elements are scaled even when
/// some are non-finite (the step is skipped then anyway).
/// \param x               device-accessible buffer of `n` elements, read and written in `stream` order.
/// \param n               number of elements.
/// \param scale           the factor, typically 1 / loss_scale.
/// \param found_nonfinite one device-accessible `int`, written (set to 1) in `stream` order.
/// \param stream          the stream that orders every access.
/// \throws usage_error if a pointer is null and `n > 0`; cuda_error if the launch fails.
template <float_element T>
void unscale_and_check(T* x, std::size_t n, float scale, int* found_nonfinite, cudaStream_t stream);

/// Bytes of workspace `squared_norm` needs for `n` elements of T (0 for `n == 0`, at most 4 KiB).
/// Host-only arithmetic; touches no device.
template <float_element T> [[nodiscard]] std::size_t squared_norm_workspace_bytes(std::size_t n);

/// Writes `*out = sum over i of float(x[i])^2`, accumulated in fp32. Deterministic: every element goes to a
/// fixed thread of a fixed number of blocks (a function of `n` alone), the block sums land in the workspace
/// and one block adds them in a fixed order, no atomics; so repeated calls on the same data give
/// bit-identical results, on any GPU. The order is fixed by `n` alone for a 16-byte aligned `x`; a
/// misaligned `x` takes another order, as fixed, that depends on `x`'s address modulo 16.
/// \param x               device-accessible input of `n` elements, read in `stream` order.
/// \param n               number of elements.
/// \param out             one device-accessible float, written in `stream` order.
/// \param workspace       device-accessible scratch of at least `squared_norm_workspace_bytes<T>(n)` bytes,
///                        4-byte aligned, used in `stream` order (free for other use once that work is done);
///                        may be null when that size is 0.
/// \param workspace_bytes size of `workspace`.
/// \param stream          the stream that orders every access.
/// \throws usage_error if a pointer is null when it is needed or the workspace is too small or misaligned;
///         cuda_error if a launch fails.
template <float_element T>
void squared_norm(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
                  cudaStream_t stream);

/// One fused Adam/AdamW step over a flat shard of `n` parameters, in one pass over memory: reads grad,
/// master, m and v, writes master, m, v and (when `param_out` is not null) the low-precision copy of the
/// parameters. Computes exactly the per-element math of `zero/backend/adamw_args.hpp` in the same operation
/// order, each operation correctly rounded in fp32 (with `lr / bias_correction1`, `1 - beta1`, `1 - beta2`,
/// `1 - lr * weight_decay` and `sqrt(bias_correction2)` formed once on the host in fp32), so it matches a
/// plain fp32 CPU evaluation of that formula without FMA contraction bit for bit, and any fp32 evaluation
/// in that order within 1e-6 relative; `param_out[i]` is `master[i]` rounded to nearest even.
/// \param master    device-accessible fp32 master weights of `n` elements, read and written in `stream` order.
/// \param m         device-accessible fp32 first moments, read and written in `stream` order.
/// \param v         device-accessible fp32 second moments, read and written in `stream` order.
/// \param grad      device-accessible gradients of `n` elements (not yet unscaled: `args.grad_scale` is
///                  applied), read in `stream` order.
/// \param param_out device-accessible output of `n` elements written in `stream` order, or null to skip it.
/// \param n         number of elements.
/// \param args      hyper-parameters and per-step factors (copied at the call; the launcher keeps nothing).
/// \param stream    the stream that orders every access.
/// The five buffers must not overlap.
/// \throws usage_error if a buffer other than `param_out` is null and `n > 0`; cuda_error if the launch fails.
template <float_element G, float_element P>
void adamw_step(float* master, float* m, float* v, const G* grad, P* param_out, std::size_t n,
                const adamw_step_args& args, cudaStream_t stream);

/// One step of update rule `Rule` (zero/backend/update_rules.hpp) over a flat shard of `n` parameters, in one
/// pass over memory: reads grad, master and the rule's state tensors, writes master, the state and (when
/// `param_out` is not null) the low-precision copy of the parameters. Each element runs `Rule::apply` with every
/// operation correctly rounded in fp32 (`__fmul_rn` and its kin) on the factors `Rule::make(args)` forms on the
/// host, so it gives `cpu_backend::rule_step`'s bits; `param_out[i]` is `master[i]` rounded to nearest even.
/// Compiled into `zero::cuda` for `rules::lion`, `rules::sgd`, `rules::adagrad` and `rules::lamb` (its second
/// pass, after `rule_norms`); a framework's own rule is instantiated by `ZERO_CUDA_RULE_STEP(Rule)` of
/// `<zero/kernels/rules.cuh>` in a `.cu` of its own.
/// \param master    device-accessible fp32 master weights of `n` elements, read and written in `stream` order.
/// \param state     the rule's fp32 state tensors of `n` elements each: the first `Rule::state_count(args)` are
///                  device-accessible, read and written in `stream` order (Lion's exp_avg, SGD's
///                  momentum_buffer, none for SGD without momentum, Adagrad's sum); the others are not touched
///                  and may be null.
/// \param grad      device-accessible gradients of `n` elements (not yet unscaled: `args.grad_scale` is
///                  applied), read in `stream` order.
/// \param param_out device-accessible output of `n` elements written in `stream` order, or null to skip it.
/// \param n         number of elements; 0 enqueues nothing.
/// \param args      hyper-parameters and the step (copied at the call; the launcher keeps nothing).
/// \param stream    the stream that orders every access.
/// The buffers must not overlap.
/// \throws usage_error, before anything is enqueued, if master, grad or a state tensor in use is null and
///         `n > 0`; cuda_error if the launch fails.
template <class Rule, float_element G, float_element P>
void rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param_out,
               std::size_t n, const adamw_step_args& args, cudaStream_t stream);

/// Bytes of device workspace `rule_norms` needs for `n` elements (a function of n alone).
[[nodiscard]] std::size_t rule_norms_workspace_bytes(std::size_t n);

/// The first pass of a rule with a trust ratio (`rules::has_trust_ratio`: LAMB) over the `n` elements of one
/// parameter tensor's piece: `Rule::moments` updates the rule's state tensors from `grad` (times
/// `args.grad_scale`), then `out[0]` = the sum of master², `out[1]` = the sum of `Rule::direction`², in double,
/// in a fixed order for a given n (a fixed grid, no atomics; `reduce.cuh`'s two passes). Each element's fp32
/// operations are `cpu_backend::rule_norms`'s, so the state gets its bits; the sums match it within double
/// rounding. `master` is only read. Compiled into `zero::cuda` for `rules::lamb`; `ZERO_CUDA_RULE_NORMS(Rule)`
/// of `<zero/kernels/rules.cuh>` instantiates it for a framework's rule.
/// \param out       two doubles of device-accessible memory, written in `stream` order.
/// \param workspace at least `rule_norms_workspace_bytes(n)` bytes of device memory, 8-byte aligned.
/// \throws usage_error for a null buffer in use or a small or misaligned workspace; cuda_error if a launch fails.
template <class Rule, float_element G>
void rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad, std::size_t n,
                const adamw_step_args& args, double* out, void* workspace, std::size_t workspace_bytes,
                cudaStream_t stream);

/// ZeRO++'s block quantization of `x` (n elements) into `codes` (`f.code_bytes(n)` bytes) and `scales`
/// (`f.blocks(n)` floats): the codes of `zero::quantize_block` (zero/backend/quantize.hpp), bit for bit.
/// One thread block per quantization block. \throws usage_error for a bad format or a null buffer with
/// n > 0; cuda_error if the launch fails.
template <float_element T>
void quantize(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales, cudaStream_t stream);

/// `out[i] = T(float(code_i) * scale)`: `zero::dequantize_block`'s values, bit for bit.
template <float_element T>
void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, T* out,
                cudaStream_t stream);

} // namespace zero::cuda
