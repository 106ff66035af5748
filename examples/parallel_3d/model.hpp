#pragma once
// zero-parallel-3d's model and data: a framework's own forward and backward in plain loops, the same
// functions for the whole tensors of the single-rank reference and for the slices of a parallel rank.
//
// The model, for token k (8 tokens per micro-batch, `width` 2 features each):
//
//     h   = relu(W1 x)          W1 [hidden, width]   column-parallel: tensor rank t holds rows t * hidden / T ...
//     y   = W2 h + b            W2 [width, hidden]   row-parallel: rank t holds those columns; the partial
//                                                    sums are added over the tensor group; b is replicated
//     z   = A_{route(0, k)} y   MoE layer 0: 4 experts [width, width], over the expert axis
//     u   = B_{route(1, k)} z   MoE layer 1: 4 experts
//     out = u + c               c: an output bias, replicated
//     loss = mean over tokens of |out - target|_1
//
// With two pipeline stages, stage 0 holds the MLP and MoE layer 0, stage 1 MoE layer 1, the bias and
// the loss: each stage holds dense parameters and experts, so each steps a dense engine and an experts'
// engine together (docs/parallelism.md, "Example: every factorization of 8 ranks").
//
// Every number is a multiple of 1/2 in [-1, 1], and the optimizer moves a weight by exactly 0 or +-lr
// (Adam with both betas 0: m / sqrt(v) is the sign of the clipped gradient plus the L2 decay,
// reference.hpp), so weights stay on the grid of lr and every sum of the forward, the backward, the
// gradient reductions and the squared norms is exact in fp32: the result does not depend on how the
// sums are split over ranks.

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

namespace p3d {

constexpr int width = 2;         // features per token
constexpr int hidden = 8;        // the MLP's hidden size: the tensor size divides it
constexpr int experts = 4;       // experts per MoE layer
constexpr int moe_layers = 2;    // layer 0 on pipeline stage 0, layer 1 on the last stage
constexpr int batch_tokens = 8;  // tokens per micro-batch over all data ranks: the data size divides it
constexpr int micro_batches = 4; // per optimizer step (gradient_accumulation_steps)
constexpr int max_pipe = 2;      // stages: the model has one place to cut

/// One way to lay out the ranks: pipe x tensor x data = ranks, the expert axis inside the data axis
/// (data / expert expert-data ranks hold the same experts).
struct factorization {
  int pipe = 1;
  int tensor = 1;
  int expert = 1;
  int data = 1;
  [[nodiscard]] int edata() const { return data / expert; }
  [[nodiscard]] int ranks() const { return pipe * tensor * data; }
  [[nodiscard]] std::string name() const {
    return "pipe " + std::to_string(pipe) + " x tensor " + std::to_string(tensor) + " x expert " +
           std::to_string(expert) + " x data " + std::to_string(data);
  }
  friend bool operator==(const factorization&, const factorization&) = default;
};

/// Every factorization of `ranks` that the model allows: 1 or 2 stages, a tensor size dividing the
/// hidden size, a data size dividing the micro-batch's tokens, and an expert size dividing both the
/// data size and the experts. Ordered by pipe, tensor, expert.
inline std::vector<factorization> factorizations(int ranks) {
  std::vector<factorization> out;
  for (int pipe = 1; pipe <= max_pipe; ++pipe) {
    for (int tensor = 1; tensor <= hidden; tensor *= 2) {
      if (hidden % tensor != 0 || ranks % (pipe * tensor) != 0) {
        continue;
      }
      const int data = ranks / (pipe * tensor);
      if (batch_tokens % data != 0) {
        continue;
      }
      for (int expert = 1; expert <= experts; ++expert) {
        if (data % expert == 0 && experts % expert == 0) {
          out.push_back({.pipe = pipe, .tensor = tensor, .expert = expert, .data = data});
        }
      }
    }
  }
  return out;
}

/// A small multiple of 1/2 in [-1, 1] from (a, b): the data's and the initial weights' values.
inline float halves(int a, int b) { return static_cast<float>(((a + b) % 5 + 5) % 5 - 2) / 2.0F; }

/// Feature i of token k's input and target at optimizer step `step`.
inline float input(int step, int k, int i) { return halves(k * 3 + i * 5, step * 7); }
inline float target(int step, int k, int i) { return halves(k * 5 + i * 3, step); }

/// The expert of MoE layer `layer` that token k goes to: a fixed rule (balancing is the framework's).
inline int route(int layer, int k) { return (k + layer) % experts; }

/// The initial value of element `i` (row-major, of the whole tensor) of the parameter seeded `seed`.
inline float initial(int seed, std::size_t i) { return halves(static_cast<int>(i % 5) * 7, seed * 5 + 2); }

/// The parameters: name, whole shape, seed of the initial values.
struct param_spec {
  std::string name;
  int rows = 0;
  int cols = 0;
  int seed = 0;
};
inline const param_spec w1_spec{"mlp.w1", hidden, width, 1};
inline const param_spec w2_spec{"mlp.w2", width, hidden, 2};
inline const param_spec b_spec{"mlp.b", width, 1, 3};
inline const param_spec c_spec{"head.c", width, 1, 4};
inline param_spec expert_spec(int layer, int j) {
  return {"moe" + std::to_string(layer) + ".expert" + std::to_string(j), width, width, 5 + j + 4 * layer};
}

// ---- the kernels: one token at a time, fp32, each sum in index order ----

/// The MLP's forward for one token over `rows` hidden units (all of them, or a tensor rank's): the
/// pre-activations `hp` [rows] and the partial output `y` [width] = W2[:, rows] relu(hp). `w2` is
/// [width, rows] (the slice's own layout).
inline void mlp_forward(const float* w1, const float* w2, int rows, const float* x, float* hp, float* y) {
  for (int r = 0; r < rows; ++r) {
    float s = 0;
    for (int i = 0; i < width; ++i) {
      s += w1[r * width + i] * x[i];
    }
    hp[r] = s;
  }
  for (int o = 0; o < width; ++o) {
    float s = 0;
    for (int r = 0; r < rows; ++r) {
      s += w2[o * rows + r] * std::max(hp[r], 0.0F);
    }
    y[o] = s;
  }
}

/// The MLP's backward for one token: adds dy relu(hp)^T to `g2` and (W2^T dy, masked by relu) x^T to `g1`.
inline void mlp_backward(const float* w2, int rows, const float* x, const float* hp, const float* dy, float* g1,
                         float* g2) {
  for (int r = 0; r < rows; ++r) {
    float dh = 0;
    for (int o = 0; o < width; ++o) {
      g2[o * rows + r] += dy[o] * std::max(hp[r], 0.0F);
      dh += w2[o * rows + r] * dy[o];
    }
    if (hp[r] > 0) {
      for (int i = 0; i < width; ++i) {
        g1[r * width + i] += dh * x[i];
      }
    }
  }
}

/// An expert: out = W in, W [width, width].
inline void expert_forward(const float* w, const float* in, float* out) {
  for (int o = 0; o < width; ++o) {
    float s = 0;
    for (int i = 0; i < width; ++i) {
      s += w[o * width + i] * in[i];
    }
    out[o] = s;
  }
}

/// An expert's backward: adds dout in^T to `g` and writes din = W^T dout.
inline void expert_backward(const float* w, const float* in, const float* dout, float* g, float* din) {
  for (int i = 0; i < width; ++i) {
    din[i] = 0;
  }
  for (int o = 0; o < width; ++o) {
    for (int i = 0; i < width; ++i) {
      g[o * width + i] += dout[o] * in[i];
      din[i] += w[o * width + i] * dout[o];
    }
  }
}

/// The L1 loss of one token over `tokens` tokens: writes d loss / d out (sign / tokens) and returns
/// the token's share of the loss.
inline float loss_gradient(const float* out, const float* t, int tokens, float* dout) {
  float loss = 0;
  for (int i = 0; i < width; ++i) {
    const float diff = out[i] - t[i];
    dout[i] = static_cast<float>((diff > 0) - (diff < 0)) / static_cast<float>(tokens);
    loss += (diff < 0 ? -diff : diff) / static_cast<float>(tokens);
  }
  return loss;
}

} // namespace p3d
