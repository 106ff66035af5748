#pragma once
// One rank of a (pipe, tensor, expert, data) job of zero-parallel-3d: its groups, its two engines, the
// 1F1B schedule with the model's forward and backward on its slices, and the checks against the
// reference. main.cpp instantiates `train_parallel` over in-process ranks, train_mpi.cpp over MPI, so
// that the two kinds of engine compile in parallel.

#include "model.hpp"
#include "reference.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/pipeline_schedule.hpp>
#include <zero/comm/topology.hpp>
#include <zero/engine/engine.hpp>

namespace p3d {

/// What one rank of a parallel run found (its own checks), and the job's count of problems.
struct rank_outcome {
  int problems = 0;          ///< summed over every rank of the job
  zero::memory_report dense; ///< this rank's engines' memory
  zero::memory_report moe;
};

/// The model-state bytes of `m` against the ZeRO formula over the elements of its flat buffer (the
/// parameters and the padding that aligns each to 256 bytes and splits the buffer evenly over the
/// group): the ratio, which the run requires within 2% of 1.
inline double padded_ratio(const zero::memory_report& m) {
  const double formula = zero::zero_formula_bytes(m.stage, static_cast<double>(m.parameters + m.padding), m.world_size,
                                                  m.param_type, m.grad_type);
  return static_cast<double>(m.model_state_peak) / formula;
}

/// A rank's groups, engines and slices; see `train_parallel`. Built by every rank of the job together
/// (the communicators are split from the job's in declaration order).
template <class Comm> class parallel_rank {
public:
  using engine = zero::engine<zero::cpu_backend, Comm>;

  parallel_rank(Comm& world, const factorization& f, int stage)
      : f_(f), stage_(stage), rank_(world.rank()),
        topo_({{"pipe", f.pipe}, {"edata", f.edata()}, {"expert", f.expert}, {"tensor", f.tensor}}),
        s_(topo_.coord(rank_, "pipe")), x_(topo_.coord(rank_, "expert")), t_(topo_.coord(rank_, "tensor")),
        d_(topo_.coord(rank_, "edata") * f.expert + x_), n_(batch_tokens / f.data), rows_(hidden / f.tensor),
        per_(experts / f.expert), data_(topo_.split(world, {"edata", "expert"})), edata_(topo_.split(world, {"edata"})),
        expert_axis_(topo_.split(world, {"expert"})), tensor_(topo_.split(world, {"tensor"})),
        pipe_(topo_.split(world, {"pipe"})), dense_model_(topo_.split(world, {"pipe", "tensor"})),
        moe_model_(topo_.split(world, {"pipe", "expert", "tensor"})), backend_({.threads = 1}),
        dense_(make_config(stage, f.data, n_, f.pipe, f.tensor), data_, backend_),
        moe_(make_config(stage, f.edata(), n_, f.pipe, f.tensor), edata_, backend_) {
    // The dense engine clips by the norm summed over the other stages and tensor slices; the experts'
    // engine over those and the other expert ranks, and averages its gradients over every data rank.
    dense_.set_model_group(dense_model_, {.pipe = s_, .tensor = t_, .tensor_size = f.tensor});
    moe_.set_model_group(moe_model_, {.pipe = s_, .tensor = t_, .tensor_size = f.tensor});
    moe_.set_gradient_average(f.data);
    for (engine* eng : {&dense_, &moe_}) {
      // The engines' log lines (stage 3's "module order changed", should a micro-step's gathers leave the
      // trace of its position in the accumulation) from world rank 0 only, instead of from rank 0 of each
      // data and expert-data group.
      eng->set_log([this](const std::string& line) {
        if (rank_ == 0) {
          std::printf("%s\n", line.c_str());
        }
      });
    }
    if (holds_mlp()) {
      mlp_ = dense_.add_module("mlp");
      w1_ = hold(dense_, dense_slices_, mlp_, {w1_spec, t_ * rows_, rows_, 0, width}, {.tensor_split = 0});
      w2_ = hold(dense_, dense_slices_, mlp_, {w2_spec, 0, width, t_ * rows_, rows_}, {.tensor_split = 1});
      b_ = hold(dense_, dense_slices_, mlp_, whole(b_spec), {.tensor_replicated = true});
    }
    for (int l = 0; l < moe_layers; ++l) {
      if (holds_layer(l)) {
        const auto lu = static_cast<std::size_t>(l);
        moe_m_[lu] = moe_.add_module("moe" + std::to_string(l));
        for (int j = x_ * per_; j < (x_ + 1) * per_; ++j) {
          // The tensor ranks of a stage run the same experts on the same tokens: replicated.
          experts_[lu].push_back(
              hold(moe_, moe_slices_, moe_m_[lu], whole(expert_spec(l, j)), {.tensor_replicated = true}));
        }
      }
    }
    if (holds_head()) {
      head_ = dense_.add_module("head");
      c_ = hold(dense_, dense_slices_, head_, whole(c_spec), {.tensor_replicated = true});
    }
    dense_.finalize();
    moe_.finalize();
    init_slices(dense_, slices_of(dense_slices_));
    init_slices(moe_, slices_of(moe_slices_));
  }
  parallel_rank(const parallel_rank&) = delete;
  parallel_rank& operator=(const parallel_rank&) = delete;

  /// Trains `steps` steps of the 1F1B schedule (`micro_batches` per step, one micro-step of both
  /// engines after each backward) and returns each step's gradient norm.
  std::vector<double> train(int steps) {
    using handle = decltype(pipe_.send(static_cast<const float*>(nullptr), 0, 0));
    std::vector<double> norms;
    for (int step = 0; step < steps; ++step) {
      std::vector<micro> mbs(micro_batches);
      std::vector<handle> sends;
      const auto size = static_cast<std::size_t>(n_ * width);
      for (const auto& op : zero::one_f_one_b(f_.pipe, s_, micro_batches)) {
        micro& m = mbs[static_cast<std::size_t>(op.micro_batch)];
        switch (op.op) {
        case zero::pipe_op::recv_activation:
          m.stage_in.resize(size);
          pipe_.recv(m.stage_in.data(), size, op.peer).wait();
          break;
        case zero::pipe_op::forward:
          forward(step, op.micro_batch, m);
          break;
        case zero::pipe_op::send_activation:
          sends.push_back(pipe_.send(m.moe_out[0].data(), size, op.peer));
          break;
        case zero::pipe_op::recv_gradient:
          m.stage_out_grad.resize(size);
          pipe_.recv(m.stage_out_grad.data(), size, op.peer).wait();
          break;
        case zero::pipe_op::backward:
          backward(op.micro_batch, m);
          break;
        case zero::pipe_op::send_gradient:
          sends.push_back(pipe_.send(m.stage_in_grad.data(), size, op.peer));
          break;
        }
        // After the backward has sent its input's gradient on (docs/parallelism.md): the last
        // micro-step's norm is collective over the model groups.
        if ((op.op == zero::pipe_op::backward && s_ == 0) || op.op == zero::pipe_op::send_gradient) {
          const auto r = zero::step_together(dense_, moe_);
          if (r[0].boundary) {
            norms.push_back(r[0].applied ? r[0].grad_norm : -1.0);
          }
        }
      }
      for (auto& h : sends) {
        h.wait();
      }
    }
    return norms;
  }

  /// Compares this rank's slices (every element) and step norms with the reference's and each engine's
  /// model state with the formula; prints each problem to stderr and returns their count.
  int check(const reference& ref, const std::vector<double>& norms, rank_outcome& out) {
    int problems = 0;
    for (std::size_t k = 0; k < ref.norms.size() || k < norms.size(); ++k) {
      const double got = k < norms.size() ? norms[k] : -2.0;
      const double want = k < ref.norms.size() ? ref.norms[k] : -2.0;
      if (got != want) {
        say("step %zu's gradient norm is %.17g, the reference's %.17g (-1: step skipped, -2: no step)", k, got, want);
        ++problems;
      }
    }
    {
      auto all_dense = dense_.gather_all();
      auto all_moe = moe_.gather_all();
      problems += compare(dense_, dense_slices_, ref);
      problems += compare(moe_, moe_slices_, ref);
    }
    out.dense = dense_.memory();
    out.moe = moe_.memory();
    for (const auto* m : {&out.dense, &out.moe}) {
      const double ratio = padded_ratio(*m);
      const bool right_group = m->world_size == (m == &out.dense ? f_.data : f_.edata());
      if (!right_group || ratio < 0.98 || ratio > 1.02) {
        say("the %s engine holds %zu B of model state over %d ranks, %.4f x the ZeRO formula over its %zu "
            "elements (expected within 2%%, over %d ranks)",
            m == &out.dense ? "dense" : "experts'", m->model_state_peak, m->world_size, ratio,
            m->parameters + m->padding, m == &out.dense ? f_.data : f_.edata());
        ++problems;
      }
    }
    return problems;
  }

private:
  /// One micro-batch's activations and gradients on this stage (each [tokens, width] unless noted).
  struct micro {
    std::vector<float> x, hp, y; // the MLP's input, pre-activations [tokens, rows], output
    std::vector<float> stage_in, stage_out_grad, stage_in_grad; // what the pipeline sends and receives
    std::array<std::vector<float>, moe_layers> moe_in, moe_out; // each MoE layer's input and output
    std::array<std::vector<float>, moe_layers> expert_in;       // the tokens its experts received here
    std::vector<float> loss_grad;
  };
  struct held {
    slice where;
    zero::param_handle handle;
  };

  [[nodiscard]] bool holds_mlp() const { return s_ == 0; }
  [[nodiscard]] bool holds_head() const { return s_ == f_.pipe - 1; }
  [[nodiscard]] bool holds_layer(int l) const { return f_.pipe == 1 || s_ == l; }
  /// Token j of data rank `data_rank` in micro-batch `mb`: its number in the step's global batch.
  [[nodiscard]] int token(int mb, int data_rank, int j) const { return mb * batch_tokens + data_rank * n_ + j; }

  static zero::param_handle hold(engine& eng, std::vector<held>& into, int m, const slice& s,
                                 const zero::param_options& opt) {
    into.push_back({s, add(eng, m, s, opt)});
    return into.back().handle;
  }
  static std::vector<slice> slices_of(const std::vector<held>& h) {
    std::vector<slice> out;
    for (const auto& e : h) {
      out.push_back(e.where);
    }
    return out;
  }
  static const float* value(const engine& eng, zero::param_handle h) { return eng.param(h).template as<float>(); }
  static float* grad(engine& eng, zero::param_handle h) { return eng.grad(h).template as<float>(); }

  void forward(int step, int mb, micro& m) {
    const std::vector<float>* a = &m.stage_in;
    if (holds_mlp()) {
      mlp_forward_all(step, mb, m);
      a = &m.y;
    }
    for (int l = 0; l < moe_layers; ++l) {
      if (holds_layer(l)) {
        const auto lu = static_cast<std::size_t>(l);
        m.moe_in[lu] = *a;
        moe_forward(l, mb, m);
        a = &m.moe_out[lu];
      }
    }
    if (holds_head()) {
      auto on = dense_.gather(head_);
      m.loss_grad.resize(a->size());
      for (int j = 0; j < n_; ++j) {
        std::array<float, width> out{}, t{};
        for (int i = 0; i < width; ++i) {
          out[static_cast<std::size_t>(i)] = (*a)[static_cast<std::size_t>(j * width + i)] + value(dense_, c_)[i];
          t[static_cast<std::size_t>(i)] = target(step, token(mb, d_, j), i);
        }
        static_cast<void>(loss_gradient(out.data(), t.data(), n_, &m.loss_grad[static_cast<std::size_t>(j * width)]));
      }
    }
  }

  void backward(int mb, micro& m) {
    std::vector<float> d = m.stage_out_grad;
    if (holds_head()) {
      auto on = dense_.gather(head_);
      for (std::size_t k = 0; k < m.loss_grad.size(); ++k) {
        grad(dense_, c_)[k % width] += m.loss_grad[k];
      }
      dense_.grad_ready(c_);
      d = m.loss_grad;
    }
    for (int l = moe_layers - 1; l >= 0; --l) {
      if (holds_layer(l)) {
        d = moe_backward(l, mb, m, d);
      }
    }
    if (holds_mlp()) {
      mlp_backward_all(m, d);
    } else {
      m.stage_in_grad = std::move(d);
    }
  }

  /// The column- and row-parallel MLP: this rank's hidden units, the partial outputs summed over the
  /// tensor group, then the replicated bias.
  void mlp_forward_all(int step, int mb, micro& m) {
    auto on = dense_.gather(mlp_);
    m.x.resize(static_cast<std::size_t>(n_ * width));
    m.hp.resize(static_cast<std::size_t>(n_ * rows_));
    m.y.resize(static_cast<std::size_t>(n_ * width));
    for (int j = 0; j < n_; ++j) {
      float* x = &m.x[static_cast<std::size_t>(j * width)];
      for (int i = 0; i < width; ++i) {
        x[i] = input(step, token(mb, d_, j), i);
      }
      mlp_forward(value(dense_, w1_), value(dense_, w2_), rows_, x, &m.hp[static_cast<std::size_t>(j * rows_)],
                  &m.y[static_cast<std::size_t>(j * width)]);
    }
    if (f_.tensor > 1) {
      tensor_.all_reduce(m.y.data(), m.y.data(), m.y.size(), zero::reduce_op::sum).wait();
    }
    for (std::size_t k = 0; k < m.y.size(); ++k) {
      m.y[k] += value(dense_, b_)[k % width];
    }
  }

  /// Every tensor rank has the whole output gradient `dy`: each adds its slices' gradients, and the
  /// replicated bias gets the same gradient on all of them.
  void mlp_backward_all(const micro& m, const std::vector<float>& dy) {
    auto on = dense_.gather(mlp_);
    for (int j = 0; j < n_; ++j) {
      const auto at = static_cast<std::size_t>(j * width);
      mlp_backward(value(dense_, w2_), rows_, &m.x[at], &m.hp[static_cast<std::size_t>(j * rows_)], &dy[at],
                   grad(dense_, w1_), grad(dense_, w2_));
      for (int i = 0; i < width; ++i) {
        grad(dense_, b_)[i] += dy[at + static_cast<std::size_t>(i)];
      }
    }
    dense_.grad_ready(w1_);
    dense_.grad_ready(w2_);
    dense_.grad_ready(b_);
  }

  /// The expert rank holding expert `e` of a layer.
  [[nodiscard]] int owner(int e) const { return e / per_; }
  /// Sends each of this rank's tokens' rows of `rows` ([tokens, width]) to the expert rank of its
  /// expert in layer `l` (`all_to_all` over the expert axis, `n_` tokens of room per peer, the rest
  /// zeros) and returns what each expert rank sent here, [expert ranks][n_][width].
  std::vector<float> dispatch(int l, int mb, const std::vector<float>& rows) {
    std::vector<float> send(static_cast<std::size_t>(f_.expert * n_ * width), 0.0F), recv(send.size());
    std::vector<int> used(static_cast<std::size_t>(f_.expert), 0);
    for (int j = 0; j < n_; ++j) {
      const int q = owner(route(l, token(mb, d_, j)));
      const int slot = used[static_cast<std::size_t>(q)]++;
      for (int i = 0; i < width; ++i) {
        send[static_cast<std::size_t>((q * n_ + slot) * width + i)] = rows[static_cast<std::size_t>(j * width + i)];
      }
    }
    expert_axis_.all_to_all(send.data(), recv.data(), static_cast<std::size_t>(n_ * width)).wait();
    return recv;
  }
  /// The inverse of `dispatch`: `back` ([expert ranks][n_][width], a row per received token) goes back
  /// to the ranks that sent the tokens; returns this rank's tokens' rows, [tokens, width].
  std::vector<float> combine(int l, int mb, const std::vector<float>& back) {
    std::vector<float> ret(back.size()), rows(static_cast<std::size_t>(n_ * width));
    expert_axis_.all_to_all(back.data(), ret.data(), static_cast<std::size_t>(n_ * width)).wait();
    std::vector<int> used(static_cast<std::size_t>(f_.expert), 0);
    for (int j = 0; j < n_; ++j) {
      const int q = owner(route(l, token(mb, d_, j)));
      const int slot = used[static_cast<std::size_t>(q)]++;
      for (int i = 0; i < width; ++i) {
        rows[static_cast<std::size_t>(j * width + i)] = ret[static_cast<std::size_t>((q * n_ + slot) * width + i)];
      }
    }
    return rows;
  }
  /// Calls `fn(local expert, offset)` for each token the expert ranks sent here in layer `l`, in order
  /// of the sender and then of the token: the routing rule tells which of a sender's tokens come here.
  template <class Fn> void each_received(int l, int mb, Fn&& fn) const {
    const int edata = d_ / f_.expert;
    for (int q = 0; q < f_.expert; ++q) {
      int slot = 0;
      for (int j = 0; j < n_; ++j) {
        const int e = route(l, token(mb, edata * f_.expert + q, j));
        if (owner(e) == x_) {
          fn(static_cast<std::size_t>(e - x_ * per_), static_cast<std::size_t>((q * n_ + slot++) * width));
        }
      }
    }
  }

  void moe_forward(int l, int mb, micro& m) {
    const auto lu = static_cast<std::size_t>(l);
    auto on = moe_.gather(moe_m_[lu]);
    m.expert_in[lu] = dispatch(l, mb, m.moe_in[lu]);
    std::vector<float> back(m.expert_in[lu].size(), 0.0F);
    each_received(l, mb, [&](std::size_t e, std::size_t at) {
      expert_forward(value(moe_, experts_[lu][e]), &m.expert_in[lu][at], &back[at]);
    });
    m.moe_out[lu] = combine(l, mb, back);
  }

  std::vector<float> moe_backward(int l, int mb, const micro& m, const std::vector<float>& d) {
    const auto lu = static_cast<std::size_t>(l);
    auto on = moe_.gather(moe_m_[lu]);
    const std::vector<float> dout = dispatch(l, mb, d);
    std::vector<float> back(dout.size(), 0.0F);
    each_received(l, mb, [&](std::size_t e, std::size_t at) {
      expert_backward(value(moe_, experts_[lu][e]), &m.expert_in[lu][at], &dout[at], grad(moe_, experts_[lu][e]),
                      &back[at]);
    });
    for (const auto h : experts_[lu]) {
      moe_.grad_ready(h);
    }
    return combine(l, mb, back);
  }

  int compare(const engine& eng, const std::vector<held>& slices, const reference& ref) const {
    int problems = 0;
    for (const auto& h : slices) {
      const auto& want = ref.weights.at(h.where.spec.name);
      const auto view = eng.param(h.handle);
      const float* got = view.template as<float>();
      for (std::size_t e = 0; e < view.numel; ++e) {
        const std::size_t w = h.where.whole_index(e);
        if (got[e] != want[w]) {
          say("parameter \"%s\" element %zu (element %zu of the whole tensor) is %.9g, the reference's %.9g",
              h.where.spec.name.c_str(), e, w, static_cast<double>(got[e]), static_cast<double>(want[w]));
          ++problems;
          break; // the first differing element of each parameter
        }
      }
    }
    return problems;
  }

  template <class... Args> void say(const char* what, Args... args) const {
    char buf[512];
    std::snprintf(buf, sizeof buf, what, args...);
    std::fprintf(stderr, "MISMATCH %s, stage %d: rank %d (pipe %d, tensor %d, expert %d, data %d): %s\n",
                 f_.name().c_str(), stage_, rank_, s_, t_, x_, d_, buf);
  }

  factorization f_;
  int stage_, rank_;
  zero::topology topo_;
  int s_, x_, t_, d_;  // pipe stage, expert rank, tensor rank, data rank
  int n_, rows_, per_; // tokens per micro-batch, hidden units, experts per layer: this rank's
  Comm data_, edata_, expert_axis_, tensor_, pipe_, dense_model_, moe_model_;
  zero::cpu_backend backend_;
  engine dense_, moe_;
  int mlp_ = -1, head_ = -1;
  std::array<int, moe_layers> moe_m_{};
  zero::param_handle w1_, w2_, b_, c_;
  std::array<std::vector<zero::param_handle>, moe_layers> experts_;
  std::vector<held> dense_slices_, moe_slices_;
};

/// One rank of a `f` job over `world` (every rank calls it): trains `steps` steps at ZeRO stage
/// `stage` and compares with `ref`. Problems (a slice element or a step norm that differs from the
/// reference, an engine's memory off the formula) are printed to stderr by the rank that found them,
/// naming the factorization, stage, rank, parameter and element; `problems` counts the whole job's.
template <class Comm>
rank_outcome train_parallel(Comm& world, const factorization& f, int stage, int steps, const reference& ref) {
  rank_outcome out;
  std::int32_t problems = 0;
  {
    parallel_rank<Comm> rank(world, f, stage);
    const auto norms = rank.train(steps);
    problems = rank.check(ref, norms, out);
  }
  world.all_reduce(&problems, &problems, 1, zero::reduce_op::sum).wait();
  out.problems = problems;
  return out;
}

} // namespace p3d
