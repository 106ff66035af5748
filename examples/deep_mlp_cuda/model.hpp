#pragma once
// A small GPU framework of its own: a deep residual MLP whose block l computes
//
//     h = x W_l^T + b_l        (cuBLAS bf16 GEMM, fp32 accumulation; then the bias kernel)
//     y = x + gelu(h)          (erf GELU, as torch.nn.GELU())
//
// followed by the loss 0.5 * mean((y_L - target)^2) against a fixed random target. Parameters and
// gradients live in the zero engine (bf16); activations are the framework's own. Exactly what
// PyTorch's autograd keeps for this model is kept for backward: each block's input x and
// pre-activation h (bf16), the last output and the target. All work runs on the engine's stream.
//
// All of the framework's device memory comes from the engine's caching pool (the backend's
// allocator, one pool for framework and engine, as PyTorch's caching allocator serves both autograd
// and FSDP2): each block's activations are allocated by forward and given back by backward once
// that block's gradients are computed, as autograd frees saved tensors, so the pool's peak of bytes
// in use is the peak of everything on the device together. Giving a block back while kernels that
// read it are still queued is safe: every later user of the pool runs on the engine's stream, or on
// a stream the engine orders after it.

#include "hash.hpp"
#include "kernels.hpp"
#include "reference.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cublas_api.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>
#include <zero/core/cuda_check.hpp>
#include <zero/core/dtype.hpp>
#include <zero/core/error.hpp>
#include <zero/core/source_location.hpp>
#include <zero/engine/engine.hpp>
#include <zero/memory/buffer.hpp>
#include <zero/memory/device_allocator.hpp>

namespace deep_mlp {

/// Throws `zero::cuda_error` naming the call when a cuBLAS call fails.
inline void check_cublas(cublasStatus_t status, const char* expr, const zero::detail::source_location& loc) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw zero::cuda_error(std::string(expr) + " failed at " + zero::detail::where(loc) + ": " +
                               cublasGetStatusString(status),
                           static_cast<int>(status));
  }
}
#define DEEP_MLP_CHECK_CUBLAS(expr) ::deep_mlp::check_cublas((expr), #expr, ::zero::detail::source_location::current())

/// The engine's device memory: the backend's caching pool (copies share it).
using pool_type = zero::caching_device_allocator;
/// Framework memory from the pool.
template <class T> using device_buffer = zero::buffer<T, pool_type>;

/// The model's size.
struct shape {
  int hidden = 8192;
  int blocks = 24;
  /// Rows (samples) per GPU and step.
  int rows = 8192;
};

/// What `--check` inspects during a step: the rank's last output after forward, and each block's
/// gradients after backward wrote them (before grad_ready hands them to the engine).
struct probes {
  std::function<void(std::span<const float> y)> output;
  std::function<void(int block, std::span<const float> dw, std::span<const float> db)> grads;
};

/// Copies `n` bf16 from the device (ordered after the work on `stream`) into floats on the host.
inline std::vector<float> to_host(const bf16* p, std::size_t n, cudaStream_t stream) {
  std::vector<bf16> tmp(n);
  ZERO_CHECK_CUDA(cudaMemcpyAsync(tmp.data(), p, n * sizeof(bf16), cudaMemcpyDeviceToHost, stream));
  ZERO_CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<float>(tmp[i]);
  }
  return out;
}

template <class Engine> class model {
public:
  /// Registers one module per block ("block<l>", the unit stage 3 gathers) with its weight
  /// (hidden x hidden) and bias (hidden; no weight decay, the usual parameter group).
  /// `pool`: the engine's device allocator (a copy of the backend's `get_allocator()`).
  model(Engine& eng, shape s, int rank, pool_type pool) : eng_(eng), s_(s), rank_(rank), pool_(std::move(pool)) {
    const std::int64_t h = s.hidden;
    for (int l = 0; l < s.blocks; ++l) {
      const std::string n = "block" + std::to_string(l);
      const int m = eng.add_module(n);
      modules_.push_back(m);
      w_.push_back(eng.add_param(m, n + ".weight", {h, h}));
      b_.push_back(eng.add_param(m, n + ".bias", {h}, {.weight_decay = 0.0}));
    }
  }

  model(const model&) = delete;
  model& operator=(const model&) = delete;
  ~model() {
    if (cublas_ != nullptr) {
      cublasDestroy(cublas_);
    }
    if (host_loss_ != nullptr) {
      ZERO_CHECK_CUDA_NOTHROW(cudaFreeHost(host_loss_));
    }
  }

  /// Trainable parameters: blocks * (hidden^2 + hidden).
  [[nodiscard]] std::size_t parameters() const noexcept {
    const auto h = static_cast<std::size_t>(s_.hidden);
    return static_cast<std::size_t>(s_.blocks) * (h * h + h);
  }

  /// After `eng.finalize()`: fills the parameters (each rank its own part) with nn.Linear's
  /// initialisation from hash.hpp's streams, allocates the input, target and gradient buffers, the
  /// cuBLAS handle and its workspace, and generates this rank's rows of input and target on the
  /// device. The activations are allocated by each forward.
  void setup() {
    if (eng_.cfg().param_dtype() != zero::dtype::bf16 || eng_.cfg().grad_accum_dtype != zero::dtype::bf16) {
      throw zero::config_error("deep_mlp_cuda computes in bf16: the config needs \"bf16\": {\"enabled\": true} and "
                               "\"data_types\": {\"grad_accum_dtype\": \"bf16\"}");
    }
    const int hidden = s_.hidden;
    eng_.init_params([&](const zero::param_info& p, std::size_t first, std::span<float> out) {
      // "block<l>.weight" / "block<l>.bias"
      const auto dot = p.name.find('.');
      const int block = std::stoi(p.name.substr(5, dot - 5));
      const bool weight = p.name.compare(dot + 1, std::string::npos, "weight") == 0;
      for (std::size_t k = 0; k < out.size(); ++k) {
        out[k] = init_value(weight, block, first + k, hidden);
      }
    });

    stream_ = eng_.stream().get();
    const std::size_t n = elements();
    const auto L = static_cast<std::size_t>(s_.blocks);
    xs_.resize(L + 1);
    hs_.resize(L);
    xs_[0] = device_buffer<bf16>(pool_, n);
    target_ = device_buffer<bf16>(pool_, n);
    dy_ = device_buffer<bf16>(pool_, n);
    dh_ = device_buffer<bf16>(pool_, n);
    loss_workspace_ = device_buffer<float>(pool_, mse_loss_workspace_floats());
    bias_workspace_ = device_buffer<float>(pool_, bias_grad_workspace_floats(rows(), hid()));
    loss_ = device_buffer<float>(pool_, 1);
    cublas_workspace_ = device_buffer<std::byte>(pool_, cublas_workspace_bytes);
    void* pinned = nullptr;
    ZERO_CHECK_CUDA(cudaMallocHost(&pinned, sizeof(float)));
    host_loss_ = static_cast<float*>(pinned);
    framework_bytes_ = framework_bytes_of(s_);

    DEEP_MLP_CHECK_CUBLAS(cublasCreate(&cublas_));
    DEEP_MLP_CHECK_CUBLAS(cublasSetStream(cublas_, stream_));
    DEEP_MLP_CHECK_CUBLAS(cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_bytes));
    DEEP_MLP_CHECK_CUBLAS(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));

    // Global row r of the data set is the same on every world size: rank k holds rows [k*rows, (k+1)*rows).
    const std::uint64_t first = static_cast<std::uint64_t>(rank_) * n;
    fill_uniform(x(0), n, input_seed, first, 1.0f, stream_);
    fill_uniform(target_.data(), n, target_seed, first, 1.0f, stream_);
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream_));
  }

  /// Forward through every block and the loss (which also writes d loss / d y into the gradient
  /// buffer), allocating each block's activations; the loss is read with `last_loss()` once the
  /// stream has reached this point.
  void forward(const probes& probe = {}) {
    const std::size_t n = elements();
    const int H = s_.hidden;
    const int R = s_.rows;
    for (int l = 0; l < s_.blocks; ++l) {
      auto on = eng_.gather(modules_[static_cast<std::size_t>(l)]); // stage 3 all-gathers the block here
      hs_[static_cast<std::size_t>(l)] = device_buffer<bf16>(pool_, n);
      xs_[static_cast<std::size_t>(l) + 1] = device_buffer<bf16>(pool_, n);
      const bf16* w = eng_.param(w_[static_cast<std::size_t>(l)]).template as<bf16>();
      const bf16* b = eng_.param(b_[static_cast<std::size_t>(l)]).template as<bf16>();
      // h[R, H] = x[R, H] W^T, W[H_out, H_in] row-major. cuBLAS is column-major, where row-major h is
      // h^T (H_out x R, ld H) = W (op T on W's memory, which column-major reads as W^T) * x^T (x's
      // memory as it is, H_in x R, ld H).
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, H, R, H, w, H, x(l), H, 0.0f, h(l), H);
      bias_gelu_residual(h(l), b, x(l), x(l + 1), rows(), hid(), stream_);
    }
    mse_loss(x(s_.blocks), target_.data(), dy_.data(), n, loss_workspace_.data(), loss_.data(), stream_);
    ZERO_CHECK_CUDA(cudaMemcpyAsync(host_loss_, loss_.data(), sizeof(float), cudaMemcpyDeviceToHost, stream_));
    if (probe.output) {
      const auto y = to_host(x(s_.blocks), n, stream_);
      probe.output(y);
    }
  }

  /// Backward, last block first: accumulates (+=) every gradient into the engine's buffers and marks
  /// each ready as soon as it is written, so its bucket reduces while the earlier blocks compute.
  /// Each activation goes back to the pool after its last reader: the output after the loss (which
  /// forward already differentiated), a block's pre-activation after its backward, a block's
  /// output after the next block's backward.
  void backward(const probes& probe = {}) {
    const std::size_t n = elements();
    const int H = s_.hidden;
    const int R = s_.rows;
    for (int l = s_.blocks - 1; l >= 0; --l) {
      const auto li = static_cast<std::size_t>(l);
      xs_[li + 1].release();               // read last by block l+1's backward (the output: by the loss)
      auto on = eng_.gather(modules_[li]); // again for backward; gradients are written inside the scope
      const bf16* w = eng_.param(w_[li]).template as<bf16>();
      bf16* dw = eng_.grad(w_[li]).template as<bf16>();
      bf16* db = eng_.grad(b_[li]).template as<bf16>();
      gelu_backward(dy_.data(), h(l), dh_.data(), n, stream_); // dh = dy * gelu'(h)
      hs_[li].release();
      bias_grad(dh_.data(), rows(), hid(), bias_workspace_.data(), db, stream_);
      // dW[H_out, H_in] += dh^T x. Column-major: dW's memory is dW^T (H_in x H_out, ld H) = x^T (x's
      // memory, H_in x R, ld H) * dh (op T on dh's memory, which column-major reads as dh^T, H_out x R).
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, H, H, R, x(l), H, dh_.data(), H, 1.0f, dw, H);
      if (probe.grads) {
        const auto gw = to_host(dw, hid() * hid(), stream_);
        const auto gb = to_host(db, hid(), stream_);
        probe.grads(l, gw, gb);
      }
      eng_.grad_ready(b_[li]);
      eng_.grad_ready(w_[li]);
      if (l > 0) {
        // dx[R, H_in] = dy (the residual branch) + dh[R, H_out] W, in place over dy (beta = 1).
        // Column-major: dx^T (H_in x R, ld H) = W^T (W's memory as it is) * dh^T (dh's memory as it is).
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, H, R, H, w, H, dh_.data(), H, 1.0f, dy_.data(), H);
      }
    }
  }

  /// The loss of the last forward; valid once the engine's stream has passed that forward.
  [[nodiscard]] float last_loss() const noexcept { return *host_loss_; }

  /// Device bytes the framework holds at most (at the end of forward): saved activations, input,
  /// target, gradient buffers, workspaces.
  [[nodiscard]] std::size_t framework_bytes() const noexcept { return framework_bytes_; }
  /// The bytes `framework_bytes()` will report for shape `s`, known before a model is built (what
  /// --config auto-plan leaves out of the device budget).
  [[nodiscard]] static std::size_t framework_bytes_of(const shape& s) {
    const auto rows = static_cast<std::size_t>(s.rows);
    const auto hidden = static_cast<std::size_t>(s.hidden);
    const auto blocks = static_cast<std::size_t>(s.blocks);
    const std::size_t n = rows * hidden;
    // The blocks' inputs, pre-activations and output; target, dy and dh.
    return ((2 * blocks + 1) * n + 3 * n) * sizeof(bf16) +
           (mse_loss_workspace_floats() + bias_grad_workspace_floats(rows, hidden) + 1) * sizeof(float) +
           cublas_workspace_bytes;
  }
  /// Of those, the activations autograd would keep: every block's input and pre-activation, the output.
  [[nodiscard]] std::size_t activation_bytes() const noexcept {
    return (2 * static_cast<std::size_t>(s_.blocks) + 1) * elements() * sizeof(bf16);
  }

  /// cuBLAS workspace: 32 MiB, what PyTorch gives cuBLAS on Hopper (CUBLAS_WORKSPACE_CONFIG=:4096:8).
  static constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20;

private:
  [[nodiscard]] std::size_t rows() const noexcept { return static_cast<std::size_t>(s_.rows); }
  [[nodiscard]] std::size_t hid() const noexcept { return static_cast<std::size_t>(s_.hidden); }
  [[nodiscard]] std::size_t elements() const noexcept { return rows() * hid(); }
  bf16* x(int l) noexcept { return xs_[static_cast<std::size_t>(l)].data(); }
  bf16* h(int l) noexcept { return hs_[static_cast<std::size_t>(l)].data(); }

  /// C = op(A) op(B) + beta C, column-major as cuBLAS defines it, bf16 in and out, fp32 accumulation.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16* a, int lda, const bf16* b,
            int ldb, float beta, bf16* c, int ldc) {
    const float alpha = 1.0f;
    DEEP_MLP_CHECK_CUBLAS(cublasGemmEx(cublas_, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb,
                                       &beta, c, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }

  Engine& eng_;
  shape s_;
  int rank_;
  pool_type pool_;
  std::vector<int> modules_;
  std::vector<zero::param_handle> w_, b_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::vector<device_buffer<bf16>> xs_, hs_; // each block's input (xs_[0]: the data) and pre-activation
  device_buffer<bf16> target_, dy_, dh_;
  device_buffer<float> loss_workspace_, bias_workspace_, loss_;
  device_buffer<std::byte> cublas_workspace_;
  float* host_loss_ = nullptr;
  std::size_t framework_bytes_ = 0;
};

} // namespace deep_mlp
