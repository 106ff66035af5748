#pragma once
// The CPU reference of `--check`: the same model, inputs and initial parameters, computed on the host
// in fp32 (GEMM sums in fp64), rounding to bf16 exactly where the GPU stores a bf16 tensor. It differs
// from the GPU only in the GEMMs' summation order and the last bits of erf/exp, so the two agree to
// far better than 1%, while a transposed GEMM operand or a wrong leading dimension is off by O(1).

#include "hash.hpp"

#include <cmath>
#include <cstddef>
#include <vector>
#include <zero/core/dtype.hpp>

namespace deep_mlp {

/// The reference's results for a range of rows.
struct reference_result {
  /// The last block's output, rows x hidden (bf16 values as float).
  std::vector<float> y;
  /// 0.5 * mean((y - target)^2) over the rows.
  double loss = 0;
  /// Per block: d loss / d W (hidden x hidden, row-major) and d loss / d b, as the GPU stores them (bf16).
  std::vector<std::vector<float>> dw, db;
  /// The L2 norm of all gradients.
  double grad_norm = 0;
};

/// Rounds to bf16 (nearest even) and back, as a bf16 store and load do.
inline float round_bf16(float v) { return static_cast<float>(zero::bf16(v)); }

/// The initial value of element `i` (row-major) of block `block`'s weight or bias, before rounding
/// to the parameter dtype: nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
inline float init_value(bool weight, int block, std::size_t i, int hidden) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(hidden));
  return bound * uniform(weight ? weight_seed(block) : bias_seed(block), i);
}

/// Forward and backward of the model on global rows [first_row, first_row + rows), the loss being the
/// mean over those rows.
inline reference_result reference_run(int hidden, int blocks, std::size_t first_row, std::size_t rows) {
  const std::size_t H = static_cast<std::size_t>(hidden);
  const std::size_t n = rows * H;
  auto gelu = [](float x) { return x * 0.5f * (1.0f + std::erf(x * 0.70710678118654752f)); };
  auto gelu_grad = [](float x) {
    constexpr float beta = 1.12837916709551257f * 0.70710678118654752f * 0.5f;
    const float cdf = 0.5f * (1.0f + std::erf(x * 0.70710678118654752f));
    const float pdf = std::exp(-0.5f * x * x) * beta;
    return cdf + x * pdf;
  };

  std::vector<std::vector<float>> w(static_cast<std::size_t>(blocks)), b(static_cast<std::size_t>(blocks));
  for (int l = 0; l < blocks; ++l) {
    auto& wl = w[static_cast<std::size_t>(l)];
    auto& bl = b[static_cast<std::size_t>(l)];
    wl.resize(H * H);
    bl.resize(H);
    for (std::size_t i = 0; i < H * H; ++i) {
      wl[i] = round_bf16(init_value(true, l, i, hidden));
    }
    for (std::size_t i = 0; i < H; ++i) {
      bl[i] = round_bf16(init_value(false, l, i, hidden));
    }
  }

  // xs[l] is block l's input, xs[blocks] the output; hs[l] block l's pre-activation.
  std::vector<std::vector<float>> xs(static_cast<std::size_t>(blocks) + 1), hs(static_cast<std::size_t>(blocks));
  xs[0].resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    xs[0][i] = round_bf16(uniform(input_seed, first_row * H + i));
  }
  for (int l = 0; l < blocks; ++l) {
    const auto& x = xs[static_cast<std::size_t>(l)];
    const auto& wl = w[static_cast<std::size_t>(l)];
    const auto& bl = b[static_cast<std::size_t>(l)];
    auto& h = hs[static_cast<std::size_t>(l)];
    auto& y = xs[static_cast<std::size_t>(l) + 1];
    h.resize(n);
    y.resize(n);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t o = 0; o < H; ++o) {
        double s = 0;
        for (std::size_t k = 0; k < H; ++k) {
          s += static_cast<double>(x[r * H + k]) * static_cast<double>(wl[o * H + k]);
        }
        // The GEMM stores x W^T in bf16; the bias kernel adds b and stores again.
        const float hv = round_bf16(round_bf16(static_cast<float>(s)) + bl[o]);
        h[r * H + o] = hv;
        y[r * H + o] = round_bf16(x[r * H + o] + round_bf16(gelu(hv)));
      }
    }
  }

  reference_result out;
  out.y = xs[static_cast<std::size_t>(blocks)];
  const float inv_n = static_cast<float>(1.0 / static_cast<double>(n));
  std::vector<float> dy(n);
  double sq = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = out.y[i] - round_bf16(uniform(target_seed, first_row * H + i));
    sq += static_cast<double>(d) * static_cast<double>(d);
    dy[i] = round_bf16(d * inv_n);
  }
  out.loss = 0.5 * sq / static_cast<double>(n);

  out.dw.resize(static_cast<std::size_t>(blocks));
  out.db.resize(static_cast<std::size_t>(blocks));
  std::vector<float> dh(n);
  double norm_sq = 0;
  for (int l = blocks - 1; l >= 0; --l) {
    const auto& x = xs[static_cast<std::size_t>(l)];
    const auto& h = hs[static_cast<std::size_t>(l)];
    const auto& wl = w[static_cast<std::size_t>(l)];
    for (std::size_t i = 0; i < n; ++i) {
      dh[i] = round_bf16(dy[i] * gelu_grad(h[i]));
    }
    auto& dw = out.dw[static_cast<std::size_t>(l)];
    auto& db = out.db[static_cast<std::size_t>(l)];
    dw.assign(H * H, 0.0f);
    db.assign(H, 0.0f);
    for (std::size_t o = 0; o < H; ++o) {
      double sb = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        sb += static_cast<double>(dh[r * H + o]);
      }
      db[o] = round_bf16(static_cast<float>(sb));
      norm_sq += static_cast<double>(db[o]) * static_cast<double>(db[o]);
      for (std::size_t k = 0; k < H; ++k) {
        double s = 0;
        for (std::size_t r = 0; r < rows; ++r) {
          s += static_cast<double>(dh[r * H + o]) * static_cast<double>(x[r * H + k]);
        }
        dw[o * H + k] = round_bf16(static_cast<float>(s));
        norm_sq += static_cast<double>(dw[o * H + k]) * static_cast<double>(dw[o * H + k]);
      }
    }
    if (l > 0) {
      // dx = dy (the residual) + dh W, one GEMM with beta = 1 on the GPU, stored in bf16.
      std::vector<float> dx(n);
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t k = 0; k < H; ++k) {
          double s = static_cast<double>(dy[r * H + k]);
          for (std::size_t o = 0; o < H; ++o) {
            s += static_cast<double>(dh[r * H + o]) * static_cast<double>(wl[o * H + k]);
          }
          dx[r * H + k] = round_bf16(static_cast<float>(s));
        }
      }
      dy.swap(dx);
    }
  }
  out.grad_norm = std::sqrt(norm_sq);
  return out;
}

/// ||a - b|| / ||b|| (0 when both are zero).
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0;
  double den = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  if (a.size() != b.size()) {
    return INFINITY;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

} // namespace deep_mlp
