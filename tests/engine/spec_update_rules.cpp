// The update rules besides AdamW (zero/backend/update_rules.hpp: Lion, SGD with momentum and Nesterov, Adagrad),
// through the engine that runs them from the DeepSpeed config's optimizer block: first a few elements worked out
// by hand, then each rule against a single-process reference written out here, operation by operation (this file
// compiles with -ffp-contract=off, tests/engine/CMakeLists.txt), at every stage and world size: the same bits where
// the gradients reduce exactly (fp32, batch 64, worlds 1, 2, 4), within 1e-6 at world 3 with clipping, and within
// a 16-bit rounding in bf16. Then the state each keeps (memory), and what the config refuses.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <doctest/doctest.h>
#include <string>
#include <type_traits>
#include <vector>

namespace zt = zero::testing;
using zero::dtype;

namespace {

/// A rule as the tests configure it: its optimizer block and its hyper-parameters for the reference.
struct rule_case {
  std::string name;  // for CAPTURE
  std::string block; // the config's optimizer block
  std::string type;  // "Lion", "SGD", "Adagrad"
  float lr = 0.01f, weight_decay = 0.1f, beta1 = 0.9f, beta2 = 0.99f, momentum = 0.0f, dampening = 0.0f;
  bool nesterov = false;
  float lr_decay = 0.0f, eps = 1e-10f, initial = 0.0f;
};

std::vector<rule_case> rule_cases() {
  return {
      {.name = "Lion",
       .block = R"({"type": "Lion", "params": {"lr": 0.01, "betas": [0.9, 0.99], "weight_decay": 0.1}})",
       .type = "Lion"},
      {.name = "SGD with momentum and dampening",
       .block = R"({"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9, "dampening": 0.25, "weight_decay": 0.1}})",
       .type = "SGD",
       .momentum = 0.9f,
       .dampening = 0.25f},
      {.name = "SGD, Nesterov",
       .block = R"({"type": "sgd", "params": {"lr": 0.01, "momentum": 0.8, "nesterov": true, "weight_decay": 0.1}})",
       .type = "SGD",
       .momentum = 0.8f,
       .nesterov = true},
      {.name = "SGD without momentum",
       .block = R"({"type": "SGD", "params": {"lr": 0.01, "weight_decay": 0.1}})",
       .type = "SGD"},
      {.name = "Adagrad",
       .block = R"({"type": "Adagrad", "params": {"lr": 0.01, "lr_decay": 0.05, "weight_decay": 0.1,
                    "initial_accumulator_value": 0.125, "eps": 1e-10}})",
       .type = "Adagrad",
       .lr_decay = 0.05f,
       .initial = 0.125f},
  };
}

/// One element of rule `r` at applied step `step` (from 1): gradient `g` already clipped, weight decay `wd`,
/// `w` the fp32 parameter and `s` its state, each operation rounded on its own as written.
void reference_update(const rule_case& r, std::int64_t step, float g, float wd, float& w, float& s) {
  if (r.type == "Lion") {
    const float lr_wd = r.lr * wd;
    w = w * (1.0f - lr_wd);
    const float c = r.beta1 * s + (1.0f - r.beta1) * g;
    const float sign = c > 0 ? 1.0f : (c < 0 ? -1.0f : c);
    w = w - r.lr * sign;
    s = r.beta2 * s + (1.0f - r.beta2) * g;
  } else if (r.type == "SGD") {
    if (wd != 0) {
      g = g + wd * w;
    }
    if (r.momentum != 0) {
      s = step == 1 ? g : r.momentum * s + (1.0f - r.dampening) * g;
      g = r.nesterov ? g + r.momentum * s : s;
    }
    w = w - r.lr * g;
  } else { // Adagrad
    const float decayed = static_cast<float>(step - 1) * r.lr_decay;
    const float clr = r.lr / (1.0f + decayed);
    if (wd != 0) {
      g = g + wd * w;
    }
    s = s + g * g;
    const float denom = std::sqrt(s) + r.eps;
    w = w - clr * (g / denom);
  }
}

/// The single-process run of `s` with rule `r`: the global-batch gradient, clipped, each element updated.
zt::run_result train_rule_reference(const zt::run_spec& s, const rule_case& r) {
  zt::reference_state st;
  for (auto& m : st.m) {
    std::fill(m.begin(), m.end(), r.initial);
  }
  return zt::train_reference_with(s, st, [&](zt::reference_state& at, std::int64_t applied, const auto& g, float coef) {
    for (std::size_t k = 0; k < at.model.size(); ++k) {
      for (std::size_t i = 0; i < at.master[k].size(); ++i) {
        reference_update(r, applied, g[k][i] * coef, at.decay_of(s, k), at.master[k][i], at.m[k][i]);
      }
    }
  });
}

zt::run_spec with_rule(zt::run_spec s, const rule_case& r) {
  s.optimizer = r.block;
  s.weight_decay = r.weight_decay; // the reference's decay for the decaying parameters (biases have none)
  return s;
}

/// One rank's engine of one bf16 parameter of `n` elements at stage 1 with optimizer block `block` (and
/// `offload`, the zero_optimization keys after the stage); returns its memory.
zero::memory_report memory_with(const std::string& block, std::size_t n, const std::string& offload = "") {
  zero::memory_report out;
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto cfg =
        zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": )" +
                                      block + R"(, "zero_optimization": {"stage": 1)" + offload + "}}",
                                  zero::config_inputs{.world_size = 1});
    zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
    static_cast<void>(eng.add_param(eng.add_module("m"), "w", {static_cast<std::int64_t>(n)}));
    eng.finalize();
    out = eng.memory();
  });
  return out;
}

std::string refusal(const std::string& json) {
  try {
    const auto cfg = zero::config::from_string(json, zero::config_inputs{.world_size = 1});
    zero::check_engine_config(cfg);
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return "";
}

} // namespace

TEST_CASE("each rule's element function gives the values worked out by hand") {
  using ops = zero::detail::cpu::host_ops;
  zero::adamw_step_args a;
  a.lr = 0.125f;
  a.weight_decay = 0.5f;
  a.beta1 = 0.75f;
  a.beta2 = 0.5f;
  SUBCASE("Lion: decay, then the sign of the interpolation, then the momentum") {
    // w = 1 * (1 - 0.0625) = 0.9375; c = 0.75 * 0.5 + 0.25 * -2 = -0.125 < 0, so w = 0.9375 + 0.125 = 1.0625;
    // m = 0.5 * 0.5 + 0.5 * -2 = -0.75.
    float w = 1.0f, m = 0.5f;
    zero::rules::lion::apply<ops>(zero::rules::lion::make(a), w, &m, -2.0f);
    CHECK(w == 1.0625f);
    CHECK(m == -0.75f);
    float z = 1.0f, m0 = 0.0f; // c = 0: sign 0, only the decay moves it
    zero::rules::lion::apply<ops>(zero::rules::lion::make(a), z, &m0, 0.0f);
    CHECK(z == 0.9375f);
  }
  SUBCASE("SGD: L2 decay, momentum from the gradient at step 1, then damped; Nesterov's look-ahead") {
    a.momentum = 0.5f;
    a.dampening = 0.5f;
    a.set_step(1, false);
    // g = 2 + 0.5 * 1 = 2.5; b = 2.5 (step 1); w = 1 - 0.125 * 2.5 = 0.6875.
    float w = 1.0f, b = 123.0f;
    zero::rules::sgd::apply<ops>(zero::rules::sgd::make(a), w, &b, 2.0f);
    CHECK(b == 2.5f);
    CHECK(w == 0.6875f);
    // Step 2: g = 2 + 0.5 * 0.6875 = 2.34375; b = 0.5 * 2.5 + 0.5 * 2.34375 = 2.421875; w = 0.6875 - 0.302734375.
    a.set_step(2, false);
    zero::rules::sgd::apply<ops>(zero::rules::sgd::make(a), w, &b, 2.0f);
    CHECK(b == 2.421875f);
    CHECK(w == 0.384765625f);
    // Nesterov (dampening 0) at step 2 from b = 1: g = 2.5, b = 0.5 + 2.5 = 3, g = 2.5 + 1.5 = 4, w = 1 - 0.5.
    a.dampening = 0.0f;
    a.nesterov = true;
    float wn = 1.0f, bn = 1.0f;
    zero::rules::sgd::apply<ops>(zero::rules::sgd::make(a), wn, &bn, 2.0f);
    CHECK(bn == 3.0f);
    CHECK(wn == 0.5f);
    CHECK(zero::rules::sgd::state_count(a) == 1);
    a.momentum = 0.0f;
    CHECK(zero::rules::sgd::state_count(a) == 0);
  }
  SUBCASE("Adagrad: the sum of squares, the lr decayed by the step") {
    a.lr_decay = 1.0f;
    a.weight_decay = 0.0f;
    a.set_step(2, false);
    // clr = 0.125 / (1 + 1) = 0.0625; with g = 3: s = 1 + 9 = 10, w = 1 - 0.0625 * 3 / (sqrt(10) + eps).
    float w = 1.0f, s = 1.0f;
    zero::rules::adagrad::apply<ops>(zero::rules::adagrad::make(a), w, &s, 3.0f);
    CHECK(s == 10.0f);
    CHECK(w == doctest::Approx(1.0 - 0.0625 * 3.0 / std::sqrt(10.0)).epsilon(1e-7));
  }
}

namespace {

/// `cpu_backend::rule_step<Rule>` over `n` elements against `Rule::apply<host_ops>` one element at a time, from the
/// same inputs: every lane of the vector loop must give the element function's bits (master, state and the copy).
template <class Rule, class G, class P> void check_lanes(const zero::adamw_step_args& a, std::size_t n) {
  std::vector<float> master(n), s0(n), want_master, want_s0;
  std::vector<G> grad(n);
  std::vector<P> param(n), want_param(n);
  // Values of every kind: ordinary, ties of bf16's rounding, subnormal, zero of both signs, inf, NaN.
  const float special[] = {0.0f,      -0.0f, 1.0f + 0x1p-8f, 3.0f + 0x1p-7f, 0x1p-140f, -0x1p-130f, 1e30f,
                           -INFINITY, NAN,   65504.0f,       0.333333f,      -2.5f};
  for (std::size_t i = 0; i < n; ++i) {
    master[i] = i % 7 == 0 ? special[i % 12] : std::sin(static_cast<float>(i)) * 3.0f;
    s0[i] = i % 5 == 0 ? special[(i / 5) % 12] : std::cos(static_cast<float>(i)) * 0.5f;
    if constexpr (std::is_same_v<Rule, zero::rules::adagrad>) {
      s0[i] = std::fabs(s0[i]); // a sum of squares
    }
    grad[i] = zero::from_float<G>(i % 11 == 0 ? special[(i / 11) % 12] : std::sin(static_cast<float>(3 * i)));
  }
  want_master = master;
  want_s0 = s0;
  const auto f = Rule::make(a);
  const std::size_t count = Rule::state_count(a);
  for (std::size_t i = 0; i < n; ++i) {
    float w = want_master[i];
    float st[1] = {want_s0[i]};
    Rule::template apply<zero::detail::cpu::host_ops>(f, w, st, zero::to_float(grad[i]));
    want_master[i] = w;
    if (count == 1) {
      want_s0[i] = st[0];
    }
    want_param[i] = zero::from_float<P>(w);
  }
  // Every SIMD level this CPU has: the built-in rules' own loops at AVX2 and AVX-512, the portable one at scalar.
  for (const auto level : {zero::simd_level::scalar, zero::simd_level::avx2, zero::simd_level::avx512}) {
    if (!zero::simd_supported(level)) {
      continue;
    }
    CAPTURE(zero::name_of(level));
    auto m = master;
    auto st = s0;
    std::vector<P> out(n);
    zero::cpu_backend b({.threads = 2, .simd = level});
    b.rule_step<Rule>(m.data(), {st.data(), nullptr}, grad.data(), out.data(), n, a, b.make_stream());
    CHECK(std::memcmp(m.data(), want_master.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(st.data(), want_s0.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(out.data(), want_param.data(), n * sizeof(P)) == 0);
  }
}

template <class Rule> void check_lanes_all(const zero::adamw_step_args& a) {
  for (std::size_t n : {std::size_t{1027}, std::size_t{3}}) {
    check_lanes<Rule, float, float>(a, n);
    check_lanes<Rule, zero::bf16, zero::bf16>(a, n);
    check_lanes<Rule, zero::f16, zero::f16>(a, n);
    check_lanes<Rule, float, zero::bf16>(a, n);
  }
}

} // namespace

TEST_CASE("cpu_backend's rule_step gives each element function's bits in every lane at every SIMD level, special "
          "values included") {
  zero::adamw_step_args a;
  a.lr = 0.01f;
  a.weight_decay = 0.1f;
  a.beta1 = 0.9f;
  a.beta2 = 0.99f;
  a.grad_scale = 0.5f;
  a.eps = 1e-10f;
  a.lr_decay = 0.01f;
  a.set_step(3, false);
  check_lanes_all<zero::rules::lion>(a);
  check_lanes_all<zero::rules::adagrad>(a);
  a.momentum = 0.9f;
  a.dampening = 0.1f;
  check_lanes_all<zero::rules::sgd>(a);
  a.nesterov = true;
  a.dampening = 0.0f;
  check_lanes_all<zero::rules::sgd>(a);
  a.momentum = 0.0f;
  check_lanes_all<zero::rules::sgd>(a);
}

TEST_CASE("each rule through the engine: the reference's bits at stages 0-3 on 1, 2 and 4 ranks (fp32)") {
  // Batch 64 splits into power-of-two micro-batches, so every rank count reduces the gradients exactly and the
  // update alone decides the bits. Eight steps: SGD's momentum and Adagrad's decayed lr go past their first step.
  for (const auto& r : rule_cases()) {
    const zt::run_spec base = with_rule({.steps = 8, .batch = 64, .param_coupling = 0}, r);
    const auto want = train_rule_reference(base, r);
    CAPTURE(r.name);
    zt::check_reference_bits_at_every_stage(base, want);
    // The reference is not AdamW's: the rule decided these bits.
    CHECK(zt::max_rel_diff(zt::train_reference(base).params, want.params) > 1e-3);
  }
}

TEST_CASE("each rule through the engine: world 3 with clipping within 1e-6, bf16 within its rounding") {
  for (const auto& r : rule_cases()) {
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(r.name);
      CAPTURE(stage);
      // The gradients read the parameters and the mean over 3 ranks rounds: 1e-6 relative, as AdamW's test.
      const zt::run_spec s = with_rule({.stage = stage, .world = 3, .clip = 1.0, .steps = 6}, r);
      CHECK(zt::max_rel_diff(zt::train_with_engine(s).params, train_rule_reference(s, r).params) <= 1e-6);
      // bf16: the parameters the gradients read are rounded to 8 bits; the reference reads them so too.
      const zt::run_spec b = with_rule({.stage = stage, .world = 2, .type = dtype::bf16, .steps = 5}, r);
      CHECK(zt::max_rel_diff(zt::train_with_engine(b).params, train_rule_reference(b, r).params) <=
            1.0 / 256 + 0.1 * 5 * 0.01);
    }
  }
}

TEST_CASE("each rule with accumulation, fp16's skipped overflow and stage 3's parameters in host memory") {
  // fp16's skipped step: SGD's momentum still starts at the first applied step, Adagrad's lr decays by applied steps.
  for (const auto& r : rule_cases()) {
    CAPTURE(r.name);
    zt::check_accumulation_overflow_host_params(with_rule({}, r), 0.1 * 5 * 0.01,
                                                [&](const zt::run_spec& s) { return train_rule_reference(s, r); });
  }
}

TEST_CASE("each rule keeps its own state: 4 bytes per element for the master and each state tensor") {
  constexpr std::size_t n = 4096;
  const auto bytes = [&](const std::string& block) { return memory_with(block, n).optimizer; };
  const std::size_t adamw = bytes(R"({"type": "AdamW", "params": {}})");
  CHECK(adamw >= 12 * n); // master, m, v
  CHECK(adamw < 12 * n + 4096);
  const std::size_t one = bytes(R"({"type": "Lion", "params": {}})");
  CHECK(one == adamw - 4 * n);
  CHECK(bytes(R"({"type": "Adagrad", "params": {}})") == one);
  CHECK(bytes(R"({"type": "SGD", "params": {"momentum": 0.9}})") == one);
  CHECK(bytes(R"({"type": "SGD", "params": {}})") == adamw - 8 * n); // the master alone
  // Offloaded, the same bytes live in host memory and none on the device.
  const auto host = memory_with(R"({"type": "Lion", "params": {}})", n, R"(, "offload_optimizer": {"device": "cpu"})");
  CHECK(host.optimizer == 0);
  CHECK(host.host_optimizer == one);
  CHECK(host.host_formula ==
        doctest::Approx(
            12.0 * n)); // master, exp_avg, and the staged parameter and gradient
                        // The report's formula counts the rule's K: (2 + 2 + 4 k) per element at stage 1 on one rank.
  CHECK(memory_with(R"({"type": "Lion", "params": {}})", n).formula == doctest::Approx(12.0 * n));
  CHECK(memory_with(R"({"type": "SGD", "params": {}})", n).formula == doctest::Approx(8.0 * n));
  CHECK(memory_with(R"({"type": "AdamW", "params": {}})", n).formula == doctest::Approx(16.0 * n));
}

TEST_CASE("the config refuses a rule's foreign parameters, Nesterov without momentum, and offload by name") {
  const auto with = [](const std::string& optimizer, const std::string& zero_block = R"({"stage": 2})") {
    return R"({"train_micro_batch_size_per_gpu": 1, "optimizer": )" + optimizer + R"(, "zero_optimization": )" +
           zero_block + "}";
  };
  const auto fails = [&](const std::string& json) {
    try {
      static_cast<void>(zero::config::from_string(json, zero::config_inputs{.world_size = 1}));
    } catch (const zero::config_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto e = fails(with(R"({"type": "SGD", "params": {"betas": [0.9, 0.99]}})"));
  CHECK(e.find("optimizer.params.betas") != std::string::npos);
  CHECK(e.find("not a parameter of SGD") != std::string::npos);
  CHECK(e.find("Adam and AdamW and Lion and Lamb take it") != std::string::npos);
  e = fails(with(R"({"type": "AdamW", "params": {"momentum": 0.9}})"));
  CHECK(e.find("optimizer.params.momentum") != std::string::npos);
  CHECK(e.find("SGD takes it") != std::string::npos);
  e = fails(with(R"({"type": "Lion", "params": {"eps": 1e-8}})"));
  CHECK(e.find("not a parameter of Lion (it takes lr, betas, weight_decay)") != std::string::npos);
  e = fails(with(R"({"type": "SGD", "params": {"nesterov": true, "momentum": 0.9, "dampening": 0.1}})"));
  CHECK(e.find("optimizer.params.nesterov") != std::string::npos);
  CHECK(e.find("dampening 0") != std::string::npos);
  e = fails(with(R"({"type": "OneBitAdam", "params": {}})"));
  CHECK(e.find("optimizer.type") != std::string::npos);
  CHECK(e.find(R"("Adam", "AdamW", "Lion", "SGD", "Adagrad" or "Lamb")") != std::string::npos);
  // Defaults: DeepSpeed's Lion betas, torch.optim.Adagrad's lr and eps.
  const auto lion = zero::config::from_string(with(R"({"type": "lion"})"), zero::config_inputs{.world_size = 1});
  CHECK(lion.optimizer->betas == std::array<double, 2>{0.9, 0.99});
  const auto ada = zero::config::from_string(with(R"({"type": "Adagrad"})"), zero::config_inputs{.world_size = 1});
  CHECK(ada.optimizer->lr == 0.01);
  CHECK(ada.optimizer->eps == 1e-10);
  // The NVMe step, the updates out of place and the delayed and selective steps are AdamW's: refused with another
  // rule, naming both keys; host memory, whole or split, and parameters on the host run.
  e = refusal(
      with(R"({"type": "Lion"})", R"({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})"));
  CHECK(e.find("zero_optimization.offload_optimizer.device \"nvme\" with optimizer.type \"Lion\"") !=
        std::string::npos);
  e = refusal(
      with(R"({"type": "SGD"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu", "backward_overlap": 0.5}})"));
  CHECK(e.find("zero_optimization.offload_optimizer.backward_overlap with optimizer.type \"SGD\"") !=
        std::string::npos);
  e = refusal(with(R"({"type": "Adagrad"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu",
                   "delayed_update": {"warmup_steps": 1}}})"));
  CHECK(e.find("zero_optimization.offload_optimizer.delayed_update with optimizer.type \"Adagrad\"") !=
        std::string::npos);
  e = refusal(with(R"({"type": "Lion"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu"},
                   "zenflow": {"topk_ratio": 0.1, "update_interval": 2}})"));
  CHECK(e.find("zero_optimization.zenflow with optimizer.type \"Lion\"") != std::string::npos);
  e = refusal(with(R"({"type": "Lion"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": "auto"}})"));
  CHECK(e.find("zero_optimization.offload_optimizer.ratio \"auto\" with optimizer.type \"Lion\"") != std::string::npos);
  CHECK(refusal(with(R"({"type": "Lion"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})")).empty());
  CHECK(refusal(with(R"({"type": "Lion"})", R"({"stage": 3, "offload_param": {"device": "cpu"}})")).empty());
}

TEST_CASE("each rule offloaded to host memory, whole, split or beside the next forward: the in-memory run's bits") {
  // The host step is partitioned_adamw's over cpu_backend, as on the device here: the same bits, and a split
  // (ratio 0.5) steps half the state on each side.
  for (const auto& r : rule_cases()) {
    for (int stage : {1, 2, 3}) {
      const zt::run_spec base = with_rule({.stage = stage, .world = 2, .clip = 1.0, .steps = 5}, r);
      const auto in_memory = zt::train_with_engine(base);
      for (const char* offload :
           {R"("offload_optimizer": {"device": "cpu"})", R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})",
            R"("offload_optimizer": {"device": "cpu", "forward_overlap": true})"}) {
        CAPTURE(r.name);
        CAPTURE(stage);
        CAPTURE(offload);
        zt::run_spec s = base;
        s.zero_extra = offload;
        CHECK(zt::train_with_engine(s).params == in_memory.params);
      }
    }
  }
}
