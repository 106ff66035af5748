#pragma once
// zero-parallel-3d's reference: the config every engine reads, the parameters' slices and their
// initial values, and the whole model trained by one engine on one rank.

#include "model.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>

namespace p3d {

/// The config every engine reads, with its own world size (its group's), micro-batch (its tokens) and
/// the job's pipeline and tensor sizes (which `finalize` checks each engine's place against). Adam with
/// L2 weight decay and betas 0: the step is lr * sign(clip * g + wd * w), so the weights stay on the
/// grid of lr, and the clip (the whole model's norm) decides the sign where the clipped gradient and
/// the decay compete.
inline zero::config make_config(int stage, int ranks, int tokens_per_rank, int pipe = 1, int tensor = 1) {
  const nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", tokens_per_rank},
      {"gradient_accumulation_steps", micro_batches},
      {"gradient_clipping", 0.25},
      {"pipeline", {{"stages", pipe}}},
      {"tensor_parallel", {{"autotp_size", tensor}}},
      {"optimizer",
       {{"type", "Adam"},
        {"params",
         {{"lr", 0.5}, {"betas", {0.0, 0.0}}, {"eps", 1e-30}, {"weight_decay", 1.0 / 64}, {"adam_w_mode", false}}}}},
      {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}};
  zero::config_inputs in;
  in.world_size = ranks;
  return zero::config::from_json(j, in, "zero-parallel-3d's config");
}

/// What the reference trained: every parameter whole, and per step its gradient norm and loss.
struct reference {
  std::map<std::string, std::vector<float>> weights;
  std::vector<double> norms;
  std::vector<double> losses;
};

/// A rank's part of a parameter: rows [row0, row0 + rows) and columns [col0, col0 + cols) of the whole.
struct slice {
  param_spec spec;
  int row0 = 0;
  int rows = 0;
  int col0 = 0;
  int cols = 0;
  /// The whole tensor's element of the slice's element `e` (both row-major).
  [[nodiscard]] std::size_t whole_index(std::size_t e) const {
    const auto c = static_cast<std::size_t>(cols);
    return (static_cast<std::size_t>(row0) + e / c) * static_cast<std::size_t>(spec.cols) +
           static_cast<std::size_t>(col0) + e % c;
  }
};
inline slice whole(const param_spec& s) { return {s, 0, s.rows, 0, s.cols}; }

/// Registers `s` in module `m` of `eng` with the slice's shape.
template <class Engine>
zero::param_handle add(Engine& eng, int m, const slice& s, const zero::param_options& opt = {}) {
  return eng.add_param(m, s.spec.name, {s.rows, s.cols}, opt);
}

/// Initialises every parameter of `eng` from `slices` (by name): each element the value of its place
/// in the whole tensor, so that every factorization starts from the reference's weights.
template <class Engine> void init_slices(Engine& eng, const std::vector<slice>& slices) {
  eng.init_params([&slices](const zero::param_info& p, std::size_t first, std::span<float> v) {
    for (const auto& s : slices) {
      if (s.spec.name == p.name) {
        for (std::size_t i = 0; i < v.size(); ++i) {
          v[i] = initial(s.spec.seed, s.whole_index(first + i));
        }
      }
    }
  });
}

/// Trains the whole model for `steps` steps in one engine over `self` (a one-rank communicator): the
/// 8 tokens of each micro-batch in order, the micro-batches in turn.
template <class Comm> reference train_reference(Comm& self, int stage, int steps) {
  using engine = zero::engine<zero::cpu_backend, Comm>;
  zero::cpu_backend backend({.threads = 1});
  engine eng(make_config(stage, 1, batch_tokens), self, backend);
  std::vector<slice> slices = {whole(w1_spec), whole(w2_spec), whole(b_spec), whole(c_spec)};
  const int mlp = eng.add_module("mlp");
  const auto w1 = add(eng, mlp, slices[0]);
  const auto w2 = add(eng, mlp, slices[1]);
  const auto b = add(eng, mlp, slices[2]);
  std::array<int, moe_layers> moe{};
  std::array<std::vector<zero::param_handle>, moe_layers> ex;
  for (int l = 0; l < moe_layers; ++l) {
    moe[static_cast<std::size_t>(l)] = eng.add_module("moe" + std::to_string(l));
    for (int j = 0; j < experts; ++j) {
      slices.push_back(whole(expert_spec(l, j)));
      ex[static_cast<std::size_t>(l)].push_back(add(eng, moe[static_cast<std::size_t>(l)], slices.back()));
    }
  }
  const int head = eng.add_module("head");
  const auto c = add(eng, head, slices[3]);
  eng.finalize();
  init_slices(eng, slices);

  const auto f = [](zero::param_handle h, const engine& e) { return e.param(h).template as<float>(); };
  const auto g = [](zero::param_handle h, engine& e) { return e.grad(h).template as<float>(); };
  reference ref;
  constexpr int n = batch_tokens;
  for (int step = 0; step < steps; ++step) {
    double loss = 0;
    for (int mb = 0; mb < micro_batches; ++mb) {
      std::vector<float> x(n * width), hp(n * hidden), y(n * width), out(n * width), dout(n * width);
      std::array<std::vector<float>, moe_layers + 1> a; // the MoE layers' inputs, then the last one's output
      a.fill(std::vector<float>(n * width));
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < width; ++i) {
          x[j * width + i] = input(step, mb * n + j, i);
        }
      }
      {
        auto on = eng.gather(mlp);
        for (int j = 0; j < n; ++j) {
          mlp_forward(f(w1, eng), f(w2, eng), hidden, &x[j * width], &hp[j * hidden], &a[0][j * width]);
          for (int i = 0; i < width; ++i) {
            a[0][j * width + i] += f(b, eng)[i];
          }
        }
      }
      for (int l = 0; l < moe_layers; ++l) {
        const auto lu = static_cast<std::size_t>(l);
        auto on = eng.gather(moe[lu]);
        for (int j = 0; j < n; ++j) {
          const auto e = static_cast<std::size_t>(route(l, mb * n + j));
          expert_forward(f(ex[lu][e], eng), &a[lu][j * width], &a[lu + 1][j * width]);
        }
      }
      {
        auto on = eng.gather(head);
        for (int j = 0; j < n; ++j) {
          std::array<float, width> t{};
          for (int i = 0; i < width; ++i) {
            out[j * width + i] = a[moe_layers][j * width + i] + f(c, eng)[i];
            t[static_cast<std::size_t>(i)] = target(step, mb * n + j, i);
          }
          loss += loss_gradient(&out[j * width], t.data(), n, &dout[j * width]) / micro_batches;
        }
        for (int j = 0; j < n; ++j) {
          for (int i = 0; i < width; ++i) {
            g(c, eng)[i] += dout[j * width + i];
          }
        }
        eng.grad_ready(c);
      }
      std::vector<float> d = dout, din(n * width);
      for (int l = moe_layers - 1; l >= 0; --l) {
        const auto lu = static_cast<std::size_t>(l);
        auto on = eng.gather(moe[lu]);
        for (int j = 0; j < n; ++j) {
          const auto e = static_cast<std::size_t>(route(l, mb * n + j));
          expert_backward(f(ex[lu][e], eng), &a[lu][j * width], &d[j * width], g(ex[lu][e], eng), &din[j * width]);
        }
        for (const auto h : ex[lu]) {
          eng.grad_ready(h);
        }
        d.swap(din);
      }
      {
        auto on = eng.gather(mlp);
        for (int j = 0; j < n; ++j) {
          mlp_backward(f(w2, eng), hidden, &x[j * width], &hp[j * hidden], &d[j * width], g(w1, eng), g(w2, eng));
          for (int i = 0; i < width; ++i) {
            g(b, eng)[i] += d[j * width + i];
          }
        }
        eng.grad_ready(w1);
        eng.grad_ready(w2);
        eng.grad_ready(b);
      }
      const auto r = eng.step();
      if (r.boundary) {
        ref.norms.push_back(r.grad_norm);
      }
    }
    ref.losses.push_back(loss);
  }
  auto all = eng.gather_all();
  for (const auto& [name, h] : std::vector<std::pair<std::string, zero::param_handle>>{
           {w1_spec.name, w1}, {w2_spec.name, w2}, {b_spec.name, b}, {c_spec.name, c}}) {
    const auto view = eng.param(h);
    ref.weights[name].assign(view.template as<float>(), view.template as<float>() + view.numel);
  }
  for (int l = 0; l < moe_layers; ++l) {
    for (int j = 0; j < experts; ++j) {
      const auto view = eng.param(ex[static_cast<std::size_t>(l)][static_cast<std::size_t>(j)]);
      ref.weights[expert_spec(l, j).name].assign(view.template as<float>(), view.template as<float>() + view.numel);
    }
  }
  return ref;
}

} // namespace p3d
