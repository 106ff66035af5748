#pragma once
// A stand-in for a framework's own model code, so that the README's "Plug zero into your trainer" compiles and
// runs as written (main.cpp): one Linear layer, 784 inputs to 512 outputs, with a squared-error loss against a
// fixed target, on fixed batches. Its forward keeps what its backward needs, as a framework's autograd would.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
#include <zero/engine/engine.hpp>

/// One batch: `rows` inputs of 784 and their targets of 512, row-major.
struct batch {
  static constexpr std::size_t rows = 8, in = 784, out = 512;
  std::vector<float> x, t;
};

/// `count` copies of rank `rank`'s batch, the same on every run: random inputs in [-1, 1), targets a linear
/// function of them.
inline std::vector<batch> make_data(int rank, int count) {
  // One batch per rank, seen `count` times (a tiny model's epochs): the layer can fit it.
  std::vector<batch> data(1);
  std::uint32_t s = 12345u + static_cast<std::uint32_t>(rank) * 7919u;
  auto next = [&s] { // a 32-bit LCG mapped to [-1, 1)
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / 8388608.0f - 1.0f;
  };
  for (auto& b : data) {
    b.x.resize(batch::rows * batch::in);
    b.t.resize(batch::rows * batch::out);
    for (auto& v : b.x) {
      v = next();
    }
    // A target the layer can learn: half of each row's first 512 inputs.
    for (std::size_t r = 0; r < batch::rows; ++r) {
      for (std::size_t o = 0; o < batch::out; ++o) {
        b.t[r * batch::out + o] = 0.5f * b.x[r * batch::in + o];
      }
    }
  }
  data.resize(static_cast<std::size_t>(count), data.front());
  return data;
}

/// The init function zero calls for each rank's part of a parameter: small values by global element index, so
/// the model is the same at every world size.
inline void my_init(const zero::param_info& p, std::size_t first, std::span<float> out) {
  for (std::size_t k = 0; k < out.size(); ++k) {
    const std::size_t i = first + k;
    out[k] = p.name == "fc1.bias"
                 ? 0.0f
                 : 0.01f * static_cast<float>(static_cast<int>((i * 2654435761u) % 201) - 100) / 100.0f;
  }
}

/// What the forward keeps for the backward, per rank (each in-process rank is a thread).
struct forward_state {
  const batch* b = nullptr;
  std::vector<float> y;
  double loss = 0;
};
inline forward_state& kept() {
  thread_local forward_state s;
  return s;
}

/// y = x wᵀ + bias and the mean squared error against the batch's targets (kept for `my_backward_into`).
inline void my_forward(const zero::tensor_view& w, const zero::tensor_view& bias, const batch& b) {
  const float* W = w.as<float>();
  const float* B = bias.as<float>();
  auto& s = kept();
  s.b = &b;
  s.y.assign(batch::rows * batch::out, 0.0f);
  s.loss = 0;
  for (std::size_t r = 0; r < batch::rows; ++r) {
    for (std::size_t o = 0; o < batch::out; ++o) {
      float acc = B[o];
      for (std::size_t i = 0; i < batch::in; ++i) {
        acc += b.x[r * batch::in + i] * W[o * batch::in + i];
      }
      s.y[r * batch::out + o] = acc;
      const double d = acc - b.t[r * batch::out + o];
      s.loss += d * d / static_cast<double>(batch::rows * batch::out);
    }
  }
}

/// The loss's gradients added (+=) into zero's gradient buffers: d w = dyᵀ x, d bias = the column sums of dy.
inline void my_backward_into(const zero::tensor_view& gw, const zero::tensor_view& gb) {
  float* GW = gw.as<float>();
  float* GB = gb.as<float>();
  const auto& s = kept();
  const float scale = 2.0f / static_cast<float>(batch::rows * batch::out);
  for (std::size_t r = 0; r < batch::rows; ++r) {
    for (std::size_t o = 0; o < batch::out; ++o) {
      const float dy = scale * (s.y[r * batch::out + o] - s.b->t[r * batch::out + o]);
      GB[o] += dy;
      for (std::size_t i = 0; i < batch::in; ++i) {
        GW[o * batch::in + i] += dy * s.b->x[r * batch::in + i];
      }
    }
  }
}

/// The last forward's loss.
inline double my_loss() { return kept().loss; }
