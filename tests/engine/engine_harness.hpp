#pragma once
// A small "framework" for engine tests: a fixed model, synthetic per-sample gradients, and a plain
// single-process AdamW to compare against (the oracle of docs/design.md).

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

#include <algorithm>
#include <any>
#include <cmath>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace zero::testing {

struct model_param {
  std::string name;
  std::vector<std::int64_t> shape;
  int module;
  bool decay; // biases get no weight decay (their own parameter group)
  std::size_t numel() const {
    std::size_t n = 1;
    for (auto d : shape) {
      n *= static_cast<std::size_t>(d);
    }
    return n;
  }
};

inline std::vector<model_param> small_model() {
  return {{"fc1.weight", {37, 11}, 0, true},
          {"fc1.bias", {37}, 0, false},
          {"fc2.weight", {5, 37}, 1, true},
          {"fc2.bias", {5}, 1, false},
          {"emb", {300}, 2, true}};
}

/// Initial value of element i of parameter k: exact in bf16 and fp16.
inline float init_value(std::size_t k, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 13 + k * 7) % 17) - 8) / 16.0f;
}

/// Gradient of sample s at step t for element i of parameter k: a base far from zero plus a small
/// per-sample part, all multiples of 2^-6 (exact in every dtype).
inline float sample_grad(std::size_t k, std::size_t i, std::int64_t t, std::size_t s) {
  const int base = static_cast<int>((i * 5 + k * 3 + static_cast<std::size_t>(t) * 7) % 8) - 4;
  const float b = base >= 0 ? static_cast<float>(base + 1) : static_cast<float>(base);
  const int small = static_cast<int>((i * 31 + s * 17 + static_cast<std::size_t>(t) * 11 + k) % 5) - 2;
  return b / 4.0f + static_cast<float>(small) / 64.0f;
}

struct run_spec {
  int stage = 0;
  int world = 1;
  dtype type = dtype::f32;
  int accumulation = 1;
  double clip = 0;
  int steps = 5;
  int batch = 96; // global samples per optimizer step
  double lr = 1e-2;
  double weight_decay = 0.1;
  std::int64_t bucket = 200;          // elements per reduce bucket: several buckets per model
  std::int64_t allgather_bucket = -1; // elements per stage 1-2 all-gather; -1: twice `bucket`
  std::int64_t overflow_step = -1;    // inject inf on rank 0 at this optimizer step
  std::int64_t read_before_step = -1; // gather_all between this step's backward and its step()
  /// Weight of the parameter in its own gradient: the gradient reads the gathered parameters, so
  /// stage 3 must hand the framework the current values.
  float param_coupling = 1.0f / 64;
  std::int64_t persistence_threshold = 40; // stage 3: the biases (37 and 5 elements) stay whole
  /// `train_reference` only: the one-step delayed update after this many applied steps (-1: exact). The
  /// engine's `offload_optimizer.delayed_update` block goes in `zero_extra`.
  std::int64_t delayed_warmup = -1;
  /// More keys of zero_optimization, e.g. `"overlap_comm": false` (empty: none).
  std::string zero_extra{};
  /// More top-level keys, e.g. `"aio": {"block_size": 4096}` (empty: none).
  std::string top_extra{};
  /// The optimizer block, e.g. `{"type": "Lion", "params": {"lr": 0.01}}` (empty: AdamW at lr and weight_decay).
  std::string optimizer{};
  /// A framework's own rule the block may name (config_inputs::optimizers), and what gives each engine type of the
  /// harness its type (a `std::function<void(Engine&)>` per engine type): `with_custom_rule<Rule>` sets both,
  /// `install_rule` runs the engine's before finalize.
  std::vector<custom_optimizer> optimizers{};
  std::vector<std::any> use_rule{};
};

/// `s` with the framework's rule `Rule` registered for the config and given to every engine the harness builds of
/// the CPU's type (engine<cpu_backend, thread_communicator>) or of one of `Engines` (GPU engines: their backend
/// must have `Rule`'s step, zero/kernels/rules.cuh).
template <class Rule, class... Engines> run_spec with_custom_rule(run_spec s) {
  s.optimizers = {custom_optimizer::of<Rule>()};
  const auto install = []<class Engine>(type_tag<Engine>) {
    return std::any(std::function<void(Engine&)>([](Engine& eng) { eng.template use_rule<Rule>(); }));
  };
  s.use_rule = {install(type_tag<engine<cpu_backend, thread_communicator>>{}), install(type_tag<Engines>{})...};
  return s;
}

/// Gives `eng` the rule of `with_custom_rule`, if `s` has one. \throws std::logic_error when `s` has a rule for
/// other engine types only.
template <class Engine> void install_rule(const run_spec& s, Engine& eng) {
  for (const std::any& a : s.use_rule) {
    if (const auto* f = std::any_cast<std::function<void(Engine&)>>(&a)) {
      (*f)(eng);
      return;
    }
  }
  if (!s.use_rule.empty()) {
    throw std::logic_error("install_rule: the run's framework rule was given for other engine types; name this "
                           "engine's type in with_custom_rule<Rule, Engines...>");
  }
}

/// The config inputs of `s`: its world size and its framework's rules.
inline config_inputs inputs_of(const run_spec& s) {
  config_inputs in;
  in.world_size = s.world;
  in.optimizers = s.optimizers;
  return in;
}

inline std::string config_json(const run_spec& s) {
  std::string precision;
  if (s.type == dtype::bf16) {
    precision = R"("bf16": {"enabled": true},)";
  } else if (s.type == dtype::f16) {
    precision = R"("fp16": {"enabled": true, "initial_scale_power": 8, "hysteresis": 1},)";
  }
  return "{" + (s.top_extra.empty() ? "" : s.top_extra + ", ") + precision + R"("train_batch_size": )" +
         std::to_string(s.batch) + R"(, "gradient_accumulation_steps": )" + std::to_string(s.accumulation) +
         R"(, "gradient_clipping": )" + std::to_string(s.clip) + R"(, "optimizer": )" +
         (s.optimizer.empty() ? R"({"type": "AdamW", "params": {"lr": )" + std::to_string(s.lr) +
                                    R"(, "weight_decay": )" + std::to_string(s.weight_decay) + "}}"
                              : s.optimizer) +
         R"(, "zero_optimization": {"stage": )" + std::to_string(s.stage) + R"(, "reduce_bucket_size": )" +
         std::to_string(s.bucket) + R"(, "allgather_bucket_size": )" +
         std::to_string(s.allgather_bucket < 0 ? s.bucket * 2 : s.allgather_bucket) +
         R"(, "stage3_param_persistence_threshold": )" + std::to_string(s.persistence_threshold) +
         (s.zero_extra.empty() ? "" : ", " + s.zero_extra) + "}}";
}

/// What a run produced: the whole parameters in fp32 and the reported norms.
struct run_result {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> params_before_step; // what gather_all read at `read_before_step`
  std::vector<double> norms;
  std::vector<bool> applied;
  std::vector<double> scales;
  /// Per rank: which optimizer steps were applied (every rank must agree).
  std::vector<std::vector<bool>> applied_by_rank;
};

/// Largest |a - b| / max(|b|, 1) over all parameters.
inline double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (std::size_t k = 0; k < b.size(); ++k) {
    if (a[k].size() != b[k].size()) {
      return INFINITY;
    }
    for (std::size_t i = 0; i < b[k].size(); ++i) {
      const double d = std::fabs(double(a[k][i]) - double(b[k][i])) / std::max(1.0, std::fabs(double(b[k][i])));
      worst = std::max(worst, d);
    }
  }
  return worst;
}

/// How the harness reads and writes engine views whose memory the host can touch, and the buffers a
/// communicator of such ranks exchanges (host vectors).
struct host_io {
  template <class T, class Engine> std::vector<T> read(Engine& /*eng*/, const tensor_view& v) const {
    const T* p = v.as<T>();
    return std::vector<T>(p, p + v.numel);
  }
  template <class T, class Engine> void write(Engine& /*eng*/, const tensor_view& v, const std::vector<T>& x) const {
    std::copy(x.begin(), x.end(), v.as<T>());
  }
  /// A buffer of `n` elements that a communicator sends from and receives into (all_to_all, send/recv).
  template <class T> std::vector<T> comm_buffer(std::size_t n) const { return std::vector<T>(n); }
  /// Copies `x` (at most the buffer's size) into `buf`. \throws std::length_error for more.
  template <class T, class Engine>
  void write_buffer(Engine& /*eng*/, std::vector<T>& buf, const std::vector<T>& x) const {
    if (x.size() > buf.size()) {
      throw std::length_error("host_io::write_buffer: " + std::to_string(x.size()) + " elements into a buffer of " +
                              std::to_string(buf.size()));
    }
    std::copy(x.begin(), x.end(), buf.begin());
  }
  /// The contents of `buf`.
  template <class T, class Engine> std::vector<T> read_buffer(Engine& /*eng*/, const std::vector<T>& buf) const {
    return buf;
  }
};

/// Where a test's ranks run and how its host code reaches their engines' memory: `run_group(world, fn)` calls
/// `fn(comm)` on each of `world` ranks; `make_backend(comm)` makes a rank's backend (every engine of the rank
/// shares it); `io` reads and writes engine views and the buffers the communicators exchange (`host_io`, or
/// tests/cuda's `device_io`). The model-parallel and MoE harnesses (model_group_harness.hpp, moe_harness.hpp,
/// pipeline_harness.hpp) train over any rig.
template <class RunGroup, class MakeBackend, class Io> struct rank_rig {
  RunGroup run_group;
  MakeBackend make_backend;
  Io io;
};
// Clang 14 deduces no aggregate's template arguments without a guide (C++20's P1816).
template <class RunGroup, class MakeBackend, class Io>
rank_rig(RunGroup, MakeBackend, Io) -> rank_rig<RunGroup, MakeBackend, Io>;

/// The CPU engine's rig: in-process ranks (thread_communicator), a one-thread cpu_backend each, host_io.
inline constexpr rank_rig cpu_rig{[](int world, auto&& fn) { run_ranks(world, fn); },
                                  [](thread_communicator&) { return cpu_backend({.threads = 1}); }, host_io{}};

/// The small model registered with an engine: its modules and parameter handles.
struct model_handles {
  std::vector<int> modules;
  std::vector<param_handle> params;
};

/// Registers the small model with `eng` (not finalized).
template <class Engine> model_handles register_model(Engine& eng) {
  model_handles out;
  out.modules = {eng.add_module("fc1"), eng.add_module("fc2"), eng.add_module("emb")};
  for (const auto& p : small_model()) {
    param_options o;
    if (!p.decay) {
      o.weight_decay = 0.0;
    }
    out.params.push_back(eng.add_param(out.modules[static_cast<std::size_t>(p.module)], p.name, p.shape, o));
  }
  return out;
}

/// Fills the small model with `init_value`.
template <class Engine> void init_model(Engine& eng) {
  eng.init_params([&](const param_info& p, std::size_t first, std::span<float> dst) {
    const std::size_t k = *eng.layout().find(p.name); // registered in model order
    for (std::size_t j = 0; j < dst.size(); ++j) {
      dst[j] = init_value(k, first + j);
    }
  });
}

/// The whole parameters in fp32, into `out.params` on rank 0.
template <class Engine, class Comm, class Io = host_io>
void collect_params(Engine& eng, const model_handles& mh, Comm& comm, run_result& out, const Io& io = {}) {
  auto all = eng.gather_all();
  if (comm.rank() == 0) {
    out.params.assign(mh.params.size(), {});
    for (std::size_t k = 0; k < mh.params.size(); ++k) {
      auto v = eng.param(mh.params[k]);
      visit_float(v.type, [&]<class P>(type_tag<P>) {
        for (const P x : io.template read<P>(eng, v)) {
          out.params[k].push_back(to_float(x));
        }
      });
    }
  }
}

/// Trains optimizer steps `[t_begin, t_end)` of `s`, recording norms, scales and applied flags (size
/// `out.applied_by_rank` to the world first: every rank's thread writes its own entry); `io`
/// moves view contents to and from the host (the framework side of this harness computes on the host).
template <class Engine, class Comm, class Io = host_io>
void train_steps(Engine& eng, const model_handles& mh, Comm& comm, const run_spec& s, std::int64_t t_begin,
                 std::int64_t t_end, run_result& out, const Io& io = {}) {
  const auto model = small_model();
  const auto& modules = mh.modules;
  const auto& h = mh.params;
  const int mb = s.batch / (s.world * s.accumulation);
  for (std::int64_t t = t_begin; t < t_end; ++t) {
    for (int micro = 0; micro < s.accumulation; ++micro) {
      const float scale = static_cast<float>(eng.loss_scale());
      // Forward: every module in order (stage 3 gathers it, then prefetches from the trace).
      for (int m : modules) {
        auto on = eng.gather(m);
      }
      // Backward, last parameter first; accumulate (+=) this micro-batch's mean gradient.
      for (std::size_t k = model.size(); k-- > 0;) {
        auto on = eng.gather(modules[static_cast<std::size_t>(model[k].module)]);
        auto pv = eng.param(h[k]);
        std::vector<float> pf(pv.numel);
        visit_float(pv.type, [&]<class P>(type_tag<P>) {
          const auto held = io.template read<P>(eng, pv);
          for (std::size_t i = 0; i < pv.numel; ++i) {
            pf[i] = to_float(held[i]);
          }
        });
        auto g = eng.grad(h[k]);
        visit_float(g.type, [&]<class G>(type_tag<G>) {
          auto gv = io.template read<G>(eng, g);
          G* gp = gv.data();
          for (std::size_t i = 0; i < g.numel; ++i) {
            float local = 0;
            for (int j = 0; j < mb; ++j) {
              const auto sample = static_cast<std::size_t>((micro * s.world + comm.rank()) * mb + j);
              local += sample_grad(k, i, t, sample);
            }
            local = (local / static_cast<float>(mb) + s.param_coupling * pf[i]) * scale;
            if (t == s.overflow_step && comm.rank() == 0 && k == 1 && i == 3) {
              local = INFINITY;
            }
            gp[i] = from_float<G>(to_float(gp[i]) + local);
          }
          io.write(eng, g, gv);
        });
        eng.grad_ready(h[k]);
      }
      if (t == s.read_before_step && micro + 1 == s.accumulation) {
        run_result read;
        collect_params(eng, mh, comm, read, io);
        if (comm.rank() == 0) { // the ranks share `out`; rank 0 read the parameters
          out.params_before_step = std::move(read.params);
        }
      }
      auto r = eng.step();
      if (r.boundary) {
        out.applied_by_rank[static_cast<std::size_t>(comm.rank())].push_back(r.applied);
      }
      if (r.boundary && comm.rank() == 0) {
        out.norms.push_back(r.grad_norm);
        out.applied.push_back(r.applied);
        out.scales.push_back(r.loss_scale);
      }
    }
  }
}

/// Builds, on every rank of `run_group(world, fn)`, an engine over `Backend` (`make_backend(comm)`)
/// with the small model of `s` registered and finalized (parameters not yet initialised), and calls
/// `body(eng, handles, comm)`.
template <class Backend, class RunGroup, class MakeBackend, class Body>
void with_engine_group(const run_spec& s, RunGroup run_group, MakeBackend make_backend, Body body) {
  run_group(s.world, [&](auto& comm) {
    using comm_type = std::remove_cvref_t<decltype(comm)>;
    auto cfg = config::from_string(config_json(s), inputs_of(s));
    Backend backend = make_backend(comm);
    engine<Backend, comm_type> eng(cfg, comm, backend);
    const auto mh = register_model(eng);
    install_rule(s, eng);
    eng.finalize();
    body(eng, mh, comm);
  });
}

/// Builds, on each of `s.world` in-process ranks (thread_communicator), an `Engine` over a one-thread
/// cpu_backend with the small model of `s` registered, finalized and initialised with `init_model`, and
/// calls `body(eng, handles, comm)`.
template <class Engine = engine<cpu_backend, thread_communicator>, class Body>
void with_cpu_engines(const run_spec& s, Body body) {
  run_ranks(s.world, [&](thread_communicator& comm) {
    const auto cfg = config::from_string(config_json(s), inputs_of(s));
    cpu_backend backend({.threads = 1});
    Engine eng(cfg, comm, backend);
    const auto mh = register_model(eng);
    install_rule(s, eng);
    eng.finalize();
    init_model(eng);
    body(eng, mh, comm);
  });
}

/// Trains the small model with an engine over `Backend` and the communicators `run_group(world, fn)`
/// hands to `fn`; `make_backend(comm)` makes each rank's backend, `io` moves view contents to and from
/// the host.
template <class Backend, class RunGroup, class MakeBackend, class Io>
run_result train_with(const run_spec& s, RunGroup run_group, MakeBackend make_backend, Io io) {
  run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  with_engine_group<Backend>(s, run_group, make_backend, [&](auto& eng, const model_handles& mh, auto& comm) {
    init_model(eng);
    train_steps(eng, mh, comm, s, 0, s.steps, out, io);
    collect_params(eng, mh, comm, out, io);
  });
  return out;
}

/// Trains the small model with the engine on `s.world` in-process ranks (cpu_backend, thread_communicator).
inline run_result train_with_engine(const run_spec& s) {
  return train_with<cpu_backend>(
      s, [](int world, auto&& fn) { run_ranks(world, fn); },
      [](thread_communicator&) { return cpu_backend({.threads = 1}); }, host_io{});
}

/// The reference's Adam arguments of one applied step (`applied`: its count, from 1): s.lr and (0.9, 0.999),
/// or with `sched` its lr and betas (stepped after).
struct reference_adam {
  float b1 = 0.9f, b2 = 0.999f, lr = 0, bc1 = 0, bc2 = 0;
  reference_adam(const run_spec& s, std::int64_t applied, lr_scheduler* sched) : lr(static_cast<float>(s.lr)) {
    // The bias corrections from the betas in double, as the engine's: 0.9 and 0.999, or the schedule's as floats.
    double beta1 = 0.9, beta2 = 0.999;
    if (sched != nullptr) {
      const auto betas = sched->betas({0.9, 0.999});
      b1 = static_cast<float>(betas[0]);
      b2 = static_cast<float>(betas[1]);
      beta1 = double(b1);
      beta2 = double(b2);
      lr = static_cast<float>(sched->group_lr(s.lr));
      sched->step();
    }
    bc1 = 1.0f - static_cast<float>(std::pow(beta1, double(applied)));
    bc2 = 1.0f - static_cast<float>(std::pow(beta2, double(applied)));
  }
  /// AdamW on one element: gradient `g` (already clipped), weight decay `wd`.
  void update(float g, float wd, float& master, float& m, float& v) const {
    const float eps = 1e-8f;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    master *= 1 - lr * wd;
    const float denom = std::sqrt(v) / std::sqrt(bc2) + eps;
    master -= (lr / bc1) * m / denom;
  }
};

/// The clip coefficient of a gradient of global norm `norm` (1 without clipping or below the bound).
inline float reference_clip(const run_spec& s, double norm) {
  return s.clip > 0 && s.clip / (norm + 1e-6) < 1 ? static_cast<float>(s.clip / (norm + 1e-6)) : 1.0f;
}

/// The global-batch gradient of step t at parameters `seen` (as the framework sees them, in the training
/// dtype) into `g`; returns its squared norm.
inline double reference_grads(const run_spec& s, const std::vector<model_param>& model, std::int64_t t,
                              const std::vector<std::vector<float>>& seen, std::vector<std::vector<float>>& g) {
  double sq = 0;
  g.assign(model.size(), {});
  for (std::size_t k = 0; k < model.size(); ++k) {
    for (std::size_t i = 0; i < model[k].numel(); ++i) {
      double sum = 0;
      for (int j = 0; j < s.batch; ++j) {
        sum += sample_grad(k, i, t, static_cast<std::size_t>(j));
      }
      const float as_seen =
          visit_float(s.type, [&]<class P>(type_tag<P>) { return to_float(from_float<P>(seen[k][i])); });
      g[k].push_back(static_cast<float>(sum / s.batch) + s.param_coupling * as_seen);
      sq += static_cast<double>(g[k].back()) * g[k].back();
    }
  }
  return sq;
}

/// The small model's initial values (`init_value`), and zeroed moments of the same sizes.
struct reference_state {
  std::vector<model_param> model = small_model();
  std::vector<std::vector<float>> master, m, v;
  reference_state() : master(model.size()), m(model.size()), v(model.size()) {
    for (std::size_t k = 0; k < model.size(); ++k) {
      for (std::size_t i = 0; i < model[k].numel(); ++i) {
        master[k].push_back(init_value(k, i));
      }
      m[k].assign(model[k].numel(), 0.0f);
      v[k].assign(model[k].numel(), 0.0f);
    }
  }
  [[nodiscard]] float decay_of(const run_spec& s, std::size_t k) const {
    return model[k].decay ? static_cast<float>(s.weight_decay) : 0.0f;
  }
};

/// A single-process reference of `s` for a rule written out in a test: each step's global-batch gradient
/// (`reference_grads`) and its norm; an overflow step skipped (nothing moves, the step count stays); else
/// `update(st, applied, g, coef)` with the steps applied so far (from 1) and the clip's coefficient. `st` is the
/// state it starts from; its master is the result.
template <class Update> run_result train_reference_with(const run_spec& s, reference_state st, Update&& update) {
  run_result out;
  std::int64_t applied = 0;
  for (std::int64_t t = 0; t < s.steps; ++t) {
    std::vector<std::vector<float>> g;
    const double norm = std::sqrt(reference_grads(s, st.model, t, st.master, g));
    out.norms.push_back(norm);
    out.applied.push_back(t != s.overflow_step);
    if (t == s.overflow_step) {
      continue;
    }
    ++applied;
    update(st, applied, g, reference_clip(s, norm));
  }
  out.params = st.master;
  return out;
}

/// Plain single-process AdamW on the global-batch gradient: the oracle.
/// `sched`: the lr and Adam's betas of each applied step come from it (stepped after each), as the engine's do;
/// null: s.lr and (0.9, 0.999).
inline run_result train_reference(const run_spec& s, lr_scheduler* sched = nullptr) {
  reference_state st;
  run_result out;
  std::int64_t applied = 0;
  // What the framework computes with: the master after every update, or with the delayed update the
  // master as the last step published it (each delayed step publishes the update before it, then updates).
  auto seen_master = st.master;
  bool unpublished = false;
  for (std::int64_t t = 0; t < s.steps; ++t) {
    std::vector<std::vector<float>> g;
    const double norm = std::sqrt(reference_grads(s, st.model, t, seen_master, g));
    out.norms.push_back(norm);
    if (t == s.overflow_step) {
      out.applied.push_back(false);
      continue;
    }
    out.applied.push_back(true);
    const bool delayed = s.delayed_warmup >= 0 && applied >= s.delayed_warmup;
    if (delayed && unpublished) {
      seen_master = st.master;
    }
    ++applied;
    const float coef = reference_clip(s, norm);
    const reference_adam adam(s, applied, sched);
    for (std::size_t k = 0; k < st.model.size(); ++k) {
      for (std::size_t i = 0; i < st.master[k].size(); ++i) {
        adam.update(g[k][i] * coef, st.decay_of(s, k), st.master[k][i], st.m[k][i], st.v[k][i]);
      }
    }
    unpublished = delayed;
    if (!delayed) {
      seen_master = st.master;
    }
  }
  out.params = st.master;
  return out;
}

} // namespace zero::testing
