#pragma once
// The framework's own kernels for the deep residual MLP (kernels.cu): everything the model needs
// besides the GEMMs, which cuBLAS runs. Host code only (compiles with g++); tensors are row-major
// device memory of `zero::bf16` (bit-compatible with `__nv_bfloat16`), every launcher enqueues on
// `stream` and never synchronizes; a failed launch throws `zero::cuda_error`.
//
// Numerics follow PyTorch's eager bf16 kernels: each element is read into fp32, computed in fp32,
// and rounded to nearest even where PyTorch stores a bf16 tensor.

#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <zero/core/dtype.hpp>

namespace deep_mlp {

using zero::bf16;

/// `out[k] = bf16(scale * uniform(seed, first + k))` for k in [0, n) (hash.hpp's stream).
void fill_uniform(bf16* out, std::size_t n, std::uint64_t seed, std::uint64_t first, float scale, cudaStream_t stream);

/// One block's forward after its GEMM, for `rows` x `hidden` tensors (hidden a multiple of 8):
/// `h = bf16(h + bias)` in place (h comes in as x W^T and leaves as the pre-activation autograd
/// keeps), then `y = bf16(x + bf16(gelu(h)))` with the erf GELU (torch.nn.GELU()).
/// `x`, `h` and `y` must be 16-byte aligned; `bias` has `hidden` elements (any alignment).
void bias_gelu_residual(bf16* h, const bf16* bias, const bf16* x, bf16* y, std::size_t rows, std::size_t hidden,
                        cudaStream_t stream);

/// `dh = bf16(dy * gelu'(h))` over `n` elements (a multiple of 8, 16-byte aligned pointers).
void gelu_backward(const bf16* dy, const bf16* h, bf16* dh, std::size_t n, cudaStream_t stream);

/// Floats of workspace `mse_loss` needs.
[[nodiscard]] std::size_t mse_loss_workspace_floats();

/// `*loss = 0.5 * mean((y - t)^2)` (fp32, summed in a fixed order) and its gradient
/// `dy = bf16((y - t) / n)` over `n` elements (a multiple of 8, 16-byte aligned pointers).
/// `workspace` holds `mse_loss_workspace_floats()` floats.
void mse_loss(const bf16* y, const bf16* t, bf16* dy, std::size_t n, float* workspace, float* loss,
              cudaStream_t stream);

/// Floats of workspace `bias_grad` needs for a `rows` x `hidden` gradient.
[[nodiscard]] std::size_t bias_grad_workspace_floats(std::size_t rows, std::size_t hidden);

/// The bias gradient, a column sum accumulated as autograd does: `db[j] = bf16(db[j] + sum_r dh[r][j])`,
/// the sum in fp32 in a fixed order. `dh` is `rows` x `hidden` (hidden even, 4-byte aligned); `db` has
/// `hidden` elements (any alignment); `workspace` holds `bias_grad_workspace_floats(rows, hidden)` floats.
void bias_grad(const bf16* dh, std::size_t rows, std::size_t hidden, float* workspace, bf16* db, cudaStream_t stream);

} // namespace deep_mlp
