#pragma once
// A small framework of its own: an MLP (Linear, ReLU, ..., Linear, softmax cross-entropy) with a
// hand-written forward and backward, GEMMs from OpenBLAS, parameters and gradients living in the
// zero engine. It computes in fp32 and converts from and to the engine's dtypes at the edges.

#include <algorithm>
#include <cblas.h>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>
#include <zero/core/dispatch.hpp>
#include <zero/engine/engine.hpp>

namespace fmnist {

/// Uniform in [-1, 1) from a parameter name and an element index: the same value whatever rank
/// computes it, so the model is identical at every world size.
inline float hash_uniform(const std::string& name, std::size_t i) {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : name) {
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  }
  h ^= i + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

template <class Engine> class mlp {
public:
  /// Registers Linear layers of sizes dims[0] -> dims[1] -> ... with the engine, one module each.
  mlp(Engine& eng, std::vector<int> dims) : eng_(eng), dims_(std::move(dims)) {
    for (std::size_t l = 0; l + 1 < dims_.size(); ++l) {
      const std::string n = "fc" + std::to_string(l + 1);
      const int m = eng.add_module(n);
      modules_.push_back(m);
      w_.push_back(eng.add_param(m, n + ".weight", {dims_[l + 1], dims_[l]}));
      // Biases train without weight decay, the usual parameter group.
      b_.push_back(eng.add_param(m, n + ".bias", {dims_[l + 1]}, {.weight_decay = 0.0}));
    }
  }

  std::size_t layers() const { return w_.size(); }

  /// PyTorch's nn.Linear initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  void init() {
    eng_.init_params([&](const zero::param_info& p, std::size_t first, std::span<float> out) {
      const std::size_t layer = std::stoul(p.name.substr(2)) - 1;
      const float bound = 1.0f / std::sqrt(static_cast<float>(dims_[layer]));
      for (std::size_t k = 0; k < out.size(); ++k) {
        out[k] = bound * hash_uniform(p.name, first + k);
      }
    });
  }

  /// Forward for `batch` rows of `x`; returns the summed loss, writes correct predictions to `correct`.
  /// With `train`, also backward: accumulates gradients (scaled by `loss_scale / batch`) into the
  /// engine and marks each ready, last layer first.
  double run(const float* x, const int* labels, int batch, bool train, double loss_scale, int& correct) {
    const std::size_t L = layers();
    acts_.resize(L + 1);
    acts_[0].assign(x, x + static_cast<std::size_t>(batch) * static_cast<std::size_t>(dims_[0]));
    for (std::size_t l = 0; l < L; ++l) {
      // Stage 3 all-gathers the layer here (or finds it prefetched); free at stages 0-2.
      auto on = eng_.gather(modules_[l]);
      const int in = dims_[l];
      const int out = dims_[l + 1];
      const float* w = weights(l);
      const float* b = bias(l);
      auto& y = acts_[l + 1];
      y.resize(static_cast<std::size_t>(batch) * static_cast<std::size_t>(out));
      for (int r = 0; r < batch; ++r) {
        std::copy(b, b + out, y.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(out));
      }
      // y[batch, out] += x[batch, in] * w[out, in]^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, batch, out, in, 1.0f, acts_[l].data(), in, w, in, 1.0f,
                  y.data(), out);
      if (l + 1 < L) {
        for (auto& v : y) {
          v = v > 0 ? v : 0;
        }
      }
    }
    // Softmax cross-entropy over the logits.
    const int classes = dims_.back();
    const auto& logits = acts_[L];
    double loss = 0;
    correct = 0;
    dlogits_.resize(logits.size());
    for (int r = 0; r < batch; ++r) {
      const float* z = logits.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(classes);
      const float zmax = *std::max_element(z, z + classes);
      double sum = 0;
      for (int c = 0; c < classes; ++c) {
        sum += std::exp(static_cast<double>(z[c] - zmax));
      }
      const int y = labels[r];
      loss += std::log(sum) - static_cast<double>(z[y] - zmax);
      correct += static_cast<int>(std::max_element(z, z + classes) - z) == y;
      for (int c = 0; c < classes; ++c) {
        const double p = std::exp(static_cast<double>(z[c] - zmax)) / sum;
        dlogits_[static_cast<std::size_t>(r) * static_cast<std::size_t>(classes) + static_cast<std::size_t>(c)] =
            static_cast<float>((p - (c == y ? 1.0 : 0.0)) * loss_scale / batch);
      }
    }
    if (train) {
      backward(batch);
    }
    return loss;
  }

private:
  void backward(int batch) {
    std::vector<float> dy = dlogits_;
    for (std::size_t l = layers(); l-- > 0;) {
      auto on = eng_.gather(modules_[l]);
      const int in = dims_[l];
      const int out = dims_[l + 1];
      // dW[out, in] += dy[batch, out]^T x[batch, in];  db[out] += sum over rows of dy.
      add_grad(w_[l], static_cast<std::size_t>(out) * static_cast<std::size_t>(in), [&](float* g, float beta) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, batch, 1.0f, dy.data(), out, acts_[l].data(), in,
                    beta, g, in);
      });
      add_grad(b_[l], static_cast<std::size_t>(out), [&](float* g, float beta) {
        for (int o = 0; o < out; ++o) {
          float s = 0;
          for (int r = 0; r < batch; ++r) {
            s += dy[static_cast<std::size_t>(r) * static_cast<std::size_t>(out) + static_cast<std::size_t>(o)];
          }
          g[o] = beta * g[o] + s;
        }
      });
      if (l > 0) {
        // dx[batch, in] = dy[batch, out] * w[out, in], then the ReLU mask of x.
        std::vector<float> dx(static_cast<std::size_t>(batch) * static_cast<std::size_t>(in));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, batch, in, out, 1.0f, dy.data(), out, weights(l), in,
                    0.0f, dx.data(), in);
        for (std::size_t i = 0; i < dx.size(); ++i) {
          dx[i] = acts_[l][i] > 0 ? dx[i] : 0;
        }
        dy.swap(dx);
      }
      eng_.grad_ready(w_[l]);
      eng_.grad_ready(b_[l]);
    }
  }

  /// Runs `compute(g, beta)` so that the gradient ends up added into the engine's buffer: straight
  /// into it when the gradient dtype is fp32 (beta = 1), else through an fp32 scratch.
  template <class F> void add_grad(zero::param_handle h, std::size_t n, F&& compute) {
    auto g = eng_.grad(h);
    if (g.type == zero::dtype::f32) {
      compute(g.template as<float>(), 1.0f);
      return;
    }
    scratch_.assign(n, 0.0f);
    compute(scratch_.data(), 0.0f);
    zero::add_floats(g, scratch_);
  }

  const float* weights(std::size_t l) { return as_float(w_[l], wf_, l); }
  const float* bias(std::size_t l) { return as_float(b_[l], bf_, l); }

  /// The parameter in fp32: the engine's memory itself for fp32, else a converted copy.
  const float* as_float(zero::param_handle h, std::vector<std::vector<float>>& cache, std::size_t l) {
    auto p = eng_.param(h);
    if (p.type == zero::dtype::f32) {
      return p.template as<float>();
    }
    cache.resize(layers());
    auto& c = cache[l];
    c.resize(p.numel);
    zero::copy_to_floats(p, c);
    return c.data();
  }

  Engine& eng_;
  std::vector<int> dims_;
  std::vector<int> modules_;
  std::vector<zero::param_handle> w_, b_;
  std::vector<std::vector<float>> acts_;
  std::vector<float> dlogits_, scratch_;
  std::vector<std::vector<float>> wf_, bf_;
};

} // namespace fmnist
