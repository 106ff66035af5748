// LAMB (zero/backend/update_rules.hpp: `rules::lamb`), the rule whose step is scaled per parameter tensor by a ratio
// of norms over the whole tensor: its element functions and trust ratio worked out by hand; cpu_backend's first
// pass (`rule_norms`) against a loop written here; then the engine against a single-process LAMB written out in this
// file, operation by operation (compiled with -ffp-contract=off): the same bits at stages 0-3 on 1, 2 and 4 ranks,
// each parameter's ratio on 3 ranks equal to the unsplit one, clipping, bf16, accumulation and fp16's skipped step;
// offloaded to host memory, the in-memory run's bits; and what the config refuses.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <doctest/doctest.h>
#include <span>
#include <string>
#include <vector>

namespace lamb_spec {

namespace zt = zero::testing;
using zero::dtype;

/// The hyper-parameters the engine tests configure, and their optimizer block.
struct lamb_case {
  std::string block;
  float lr = 0.01f, beta1 = 0.9f, beta2 = 0.99f, eps = 1e-6f, weight_decay = 0.1f, min_coeff = 0.01f, max_coeff = 10.0f;
  bool bias_correction = true, eps_inside_sqrt = false;
};

lamb_case plain() {
  return {.block = R"({"type": "Lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6,
                      "weight_decay": 0.1}})"};
}
/// The ratio clamped from above on every tensor (||w|| / ||u|| is above 0.05 here), eps inside the root, no bias
/// correction.
lamb_case clamped() {
  return {.block = R"({"type": "lamb", "params": {"lr": 0.01, "betas": [0.9, 0.99], "eps": 1e-6, "weight_decay": 0.1,
                      "max_coeff": 0.05, "min_coeff": 0.01, "bias_correction": false, "eps_inside_sqrt": true}})",
          .max_coeff = 0.05f,
          .bias_correction = false,
          .eps_inside_sqrt = true};
}

/// The direction of one element: m / (sqrt(v) + eps) + wd * w, each operation rounded as written.
float direction(const lamb_case& c, float m, float v, float wd, float w) {
  const float denom = c.eps_inside_sqrt ? std::sqrt(v + c.eps) : std::sqrt(v) + c.eps;
  return m / denom + wd * w;
}

/// The single-process LAMB of `s`: the global-batch gradient, clipped; per tensor the moments, the two sums of
/// squares in double in element order, the ratio, then each element moved.
zt::run_result train_lamb_reference(const zt::run_spec& s, const lamb_case& c) {
  return zt::train_reference_with(
      s, zt::reference_state{}, [&](zt::reference_state& at, std::int64_t applied, const auto& g, float coef) {
        // The engine's bias corrections (adamw_step_args::set_step): the float betas' powers in double.
        const auto power = [&](float beta) { return static_cast<float>(std::pow(double(beta), double(applied))); };
        const float bc1 = c.bias_correction ? 1.0f - power(c.beta1) : 1.0f;
        const float bc2 = c.bias_correction ? 1.0f - power(c.beta2) : 1.0f;
        const float step_size = c.lr * std::sqrt(bc2) / bc1;
        for (std::size_t k = 0; k < at.model.size(); ++k) {
          const float wd = at.decay_of(s, k);
          double w_sq = 0;
          double u_sq = 0;
          for (std::size_t i = 0; i < at.master[k].size(); ++i) {
            const float gi = g[k][i] * coef;
            at.m[k][i] = c.beta1 * at.m[k][i] + (1.0f - c.beta1) * gi;
            at.v[k][i] = c.beta2 * at.v[k][i] + (1.0f - c.beta2) * gi * gi;
            const double w = at.master[k][i];
            const double u = direction(c, at.m[k][i], at.v[k][i], wd, at.master[k][i]);
            w_sq += w * w;
            u_sq += u * u;
          }
          const float ratio = zero::rules::trust_ratio(w_sq, u_sq, c.min_coeff, c.max_coeff);
          const float scale = step_size * ratio;
          for (std::size_t i = 0; i < at.master[k].size(); ++i) {
            at.master[k][i] = at.master[k][i] - scale * direction(c, at.m[k][i], at.v[k][i], wd, at.master[k][i]);
          }
        }
      });
}

zt::run_spec with_lamb(zt::run_spec s, const lamb_case& c) {
  s.optimizer = c.block;
  s.weight_decay = c.weight_decay;
  return s;
}

std::string config_refusal(const std::string& optimizer, const std::string& zero_block = R"({"stage": 2})") {
  try {
    const auto cfg = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": )" + optimizer +
                                                   R"(, "zero_optimization": )" + zero_block + "}",
                                               zero::config_inputs{.world_size = 1});
    zero::check_engine_config(cfg);
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return "";
}

} // namespace lamb_spec

TEST_CASE("LAMB's element functions and trust ratio give the values worked out by hand") {
  using ops = zero::detail::cpu::host_ops;
  using zero::rules::lamb;
  zero::adamw_step_args a;
  a.lr = 0.5f;
  a.beta1 = 0.5f;
  a.beta2 = 0.75f;
  a.eps = 0.0f;
  a.weight_decay = 0.25f;
  a.set_step(1, true); // bc1 = 0.5, bc2 = 0.25: step_size = 0.5 * 0.5 / 0.5 = 0.5
  a.trust_ratio = 0.5f;
  const auto f = lamb::make(a);
  CHECK(f.scale == 0.25f);
  // m = 0.5 * 1 + 0.5 * 2 = 1.5; v = 0.75 * 4 + 0.25 * 2 * 2 = 4; u = 1.5 / 2 + 0.25 * 2 = 1.25.
  float s[2] = {1.0f, 4.0f};
  lamb::moments<ops>(f, s, 2.0f);
  CHECK(s[0] == 1.5f);
  CHECK(s[1] == 4.0f);
  CHECK(lamb::direction<ops>(f, 2.0f, s) == 1.25f);
  // w = 2 - 0.25 * 1.25 = 1.6875; the state is only read.
  float w = 2.0f;
  lamb::apply<ops>(f, w, s, 123.0f);
  CHECK(w == 1.6875f);
  CHECK(s[0] == 1.5f);
  // eps inside the root: sqrt(4 + 5) = 3, u = 1.5 / 3 + 0.5 = 1.
  a.eps = 5.0f;
  a.eps_inside_sqrt = true;
  CHECK(lamb::direction<ops>(lamb::make(a), 2.0f, s) == 1.0f);
  // The ratio: ||w|| / ||u|| = 3 / 4; clamped to [0.8, 10] and [0.01, 0.5]; 1 when a norm is 0.
  CHECK(zero::rules::trust_ratio(9.0, 16.0, 0.01f, 10.0f) == 0.75f);
  CHECK(zero::rules::trust_ratio(9.0, 16.0, 0.8f, 10.0f) == 0.8f);
  CHECK(zero::rules::trust_ratio(9.0, 16.0, 0.01f, 0.5f) == 0.5f);
  CHECK(zero::rules::trust_ratio(0.0, 16.0, 0.01f, 0.5f) == 1.0f);
  CHECK(zero::rules::trust_ratio(9.0, 0.0, 0.01f, 0.5f) == 1.0f);
  CHECK(lamb::state_count(a) == 2);
  CHECK(zero::rules::has_trust_ratio<lamb>);
  CHECK(!zero::rules::has_trust_ratio<zero::rules::lion>);
}

TEST_CASE("cpu_backend's rule_norms: the moments and both sums of one piece, the same at every thread count") {
  using zero::rules::lamb;
  zero::adamw_step_args a;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  a.set_step(3, true);
  // One chunk, several chunks and a ragged last one.
  for (const std::size_t n : {std::size_t{5}, std::size_t{3 * 16384 + 77}}) {
    CAPTURE(n);
    std::vector<float> master(n), m0(n), v0(n);
    std::vector<zero::bf16> grad(n);
    for (std::size_t i = 0; i < n; ++i) {
      master[i] = std::sin(static_cast<float>(i)) * 0.5f;
      m0[i] = std::cos(static_cast<float>(i)) * 0.1f;
      v0[i] = std::fabs(std::sin(static_cast<float>(2 * i))) * 0.01f;
      grad[i] = zero::from_float<zero::bf16>(std::cos(static_cast<float>(3 * i)));
    }
    // Written out: the element functions one by one, the sums in double per chunk, then the chunks in order.
    auto want_m = m0;
    auto want_v = v0;
    double want_w = 0;
    double want_u = 0;
    const auto f = lamb::make(a);
    for (std::size_t c = 0; c * 16384 < n; ++c) {
      double cw = 0;
      double cu = 0;
      for (std::size_t i = c * 16384; i < std::min(n, (c + 1) * 16384); ++i) {
        float s[2] = {want_m[i], want_v[i]};
        lamb::moments<zero::detail::cpu::host_ops>(f, s, zero::to_float(grad[i]));
        want_m[i] = s[0];
        want_v[i] = s[1];
        const double w = master[i];
        const double u = lamb::direction<zero::detail::cpu::host_ops>(f, master[i], s);
        cw += w * w;
        cu += u * u;
      }
      want_w += cw;
      want_u += cu;
    }
    for (const unsigned threads : {1u, 4u}) {
      CAPTURE(threads);
      zero::cpu_backend b({.threads = threads});
      auto m = m0;
      auto v = v0;
      std::vector<std::byte> ws(b.rule_norms_workspace_bytes(n) + 8);
      double out[2] = {-1, -1};
      b.rule_norms<lamb>(master.data(), {m.data(), v.data()}, grad.data(), n, a, out, ws.data(), ws.size(),
                         b.make_stream());
      CHECK(m == want_m);
      CHECK(v == want_v);
      CHECK(out[0] == want_w);
      CHECK(out[1] == want_u);
      if (n > 16384) {
        CHECK_THROWS_WITH_AS(b.rule_norms<lamb>(master.data(), {m.data(), v.data()}, grad.data(), n, a, out, nullptr, 0,
                                                b.make_stream()),
                             doctest::Contains("rule_norms_workspace_bytes"), zero::usage_error);
      }
    }
  }
}

TEST_CASE("LAMB through the engine: the reference's bits at stages 0-3 on 1, 2 and 4 ranks (fp32)") {
  using namespace lamb_spec;
  // Batch 64 splits into power-of-two micro-batches, so every rank count reduces the gradients exactly; the ratio is
  // formed from per-rank double sums, whose float quotient is the unsplit one's.
  for (const auto& c : {plain(), clamped()}) {
    const zt::run_spec base = with_lamb({.steps = 6, .batch = 64, .param_coupling = 0}, c);
    const auto want = train_lamb_reference(base, c);
    CAPTURE(c.block);
    zt::check_reference_bits_at_every_stage(base, want);
    // The ratio decided these bits: without it (every ratio 1) the run is another.
    lamb_case unscaled = c;
    unscaled.min_coeff = unscaled.max_coeff = 1.0f;
    CHECK(zt::max_rel_diff(train_lamb_reference(base, unscaled).params, want.params) > 1e-3);
  }
}

TEST_CASE("LAMB's trust ratio of a parameter split across 3 ranks equals the unsplit one's") {
  using namespace lamb_spec;
  // One step at stage 2 on 3 ranks: the first layer's weight (407 elements) and the embedding (300) are cut across
  // the shards. Each rank's ratio of every parameter against the ratio of the whole tensor formed here, in one
  // process, element by element in order, from the moments the ranks hold after the step (gathered from their
  // pieces) and the initial weights (what the first step's ratio is taken over).
  const lamb_case c = plain();
  const zt::run_spec s = with_lamb({.stage = 2, .world = 3, .steps = 1, .batch = 48, .param_coupling = 0}, c);
  const auto model = zero::testing::small_model();
  std::vector<std::vector<float>> m(model.size()), v(model.size()), ratios(3);
  for (std::size_t k = 0; k < model.size(); ++k) {
    m[k].assign(model[k].numel(), NAN);
    v[k].assign(model[k].numel(), NAN);
  }
  std::vector<std::vector<std::size_t>> held(3); // the parameters each rank holds a piece of
  zt::with_cpu_engines(s, [&](auto& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::run_result unused;
    unused.applied_by_rank.resize(3);
    zt::train_steps(eng, mh, comm, s, 0, 1, unused, zt::host_io{});
    auto* opt = eng.optimizer().device();
    REQUIRE(opt != nullptr);
    const auto r = static_cast<std::size_t>(comm.rank());
    for (std::size_t id = 0; id < mh.params.size(); ++id) {
      ratios[r].push_back(opt->trust_ratio(id));
    }
    for (const auto& piece : eng.owned_by(comm.rank())) {
      opt->read_state(zero::state_tensor::exp_avg, piece.state,
                      std::span<float>(m[piece.id].data() + piece.param_offset, piece.count));
      opt->read_state(zero::state_tensor::exp_avg_sq, piece.state,
                      std::span<float>(v[piece.id].data() + piece.param_offset, piece.count));
      held[r].push_back(piece.id);
    }
  });
  std::size_t cut = 0; // the parameters with pieces on more than one rank
  for (std::size_t k = 0; k < model.size(); ++k) {
    CAPTURE(k);
    cut += std::count(held[0].begin(), held[0].end(), k) + std::count(held[1].begin(), held[1].end(), k) +
               std::count(held[2].begin(), held[2].end(), k) >
           1;
    const float wd = model[k].decay ? c.weight_decay : 0.0f;
    double w_sq = 0;
    double u_sq = 0;
    for (std::size_t i = 0; i < model[k].numel(); ++i) {
      REQUIRE(!std::isnan(m[k][i])); // every element came from some rank
      const double w = zero::testing::init_value(k, i);
      const double u = direction(c, m[k][i], v[k][i], wd, zero::testing::init_value(k, i));
      w_sq += w * w;
      u_sq += u * u;
    }
    const float whole = zero::rules::trust_ratio(w_sq, u_sq, c.min_coeff, c.max_coeff);
    CHECK(whole != 1.0f); // a ratio of norms, not the default
    for (std::size_t r = 0; r < 3; ++r) {
      CAPTURE(r);
      CHECK(ratios[r][k] == whole);
    }
  }
  CHECK(cut >= 2);
}

TEST_CASE("LAMB with clipping on 3 ranks, bf16, accumulation, fp16's skipped step and parameters on the host") {
  using namespace lamb_spec;
  const lamb_case c = plain();
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    // The mean over 3 ranks rounds: 1e-6 relative, as the other rules'.
    const zt::run_spec w3 = with_lamb({.stage = stage, .world = 3, .clip = 1.0, .steps = 5}, c);
    CHECK(zt::max_rel_diff(zt::train_with_engine(w3).params, train_lamb_reference(w3, c).params) <= 1e-6);
    const zt::run_spec b = with_lamb({.stage = stage, .world = 2, .type = dtype::bf16, .steps = 5}, c);
    CHECK(zt::max_rel_diff(zt::train_with_engine(b).params, train_lamb_reference(b, c).params) <= 1.0 / 256 + 5 * 0.01);
  }
  // fp16's skipped step moves no moment and keeps the step count.
  zt::check_accumulation_overflow_host_params(with_lamb({}, c), 5 * 0.01,
                                              [&](const zt::run_spec& s) { return train_lamb_reference(s, c); });
}

TEST_CASE("LAMB offloaded to host memory gives the in-memory run's bits at stages 1-3 on 1, 2 and 3 ranks") {
  using namespace lamb_spec;
  // offload_optimizer cpu: the host's cpu_backend runs both passes over the shard in host memory once every
  // gradient is there (offloaded_adamw::form_trust_ratios), the sums added over the ranks from host memory; stages
  // 2-3 stream the gradients during backward, stage 1 fetches them at the step. Clipping and accumulation, and
  // stage 3 with the parameters on the host too.
  const lamb_case c = plain();
  for (int world : {1, 2, 3}) {
    for (int stage : {1, 2, 3}) {
      CAPTURE(world);
      CAPTURE(stage);
      zt::run_spec s = with_lamb({.stage = stage, .world = world, .accumulation = 2, .clip = 1.0, .steps = 5}, c);
      const auto in_memory = zt::train_with_engine(s);
      CHECK(zt::max_rel_diff(in_memory.params, train_lamb_reference(s, c).params) <= 1e-6);
      s.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
      const auto offloaded = zt::train_with_engine(s);
      CHECK(offloaded.params == in_memory.params);
      CHECK(offloaded.applied == in_memory.applied);
      if (stage == 3) {
        s.zero_extra = R"("offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
        CHECK(zt::train_with_engine(s).params == in_memory.params);
      }
    }
  }
}

TEST_CASE("the config reads DeepSpeed's Lamb block and refuses what this version does not run, by name") {
  using namespace lamb_spec;
  const auto cfg = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Lamb"}})",
                                             zero::config_inputs{.world_size = 1});
  REQUIRE(cfg.optimizer);
  CHECK(cfg.optimizer->type == zero::optimizer_type::lamb);
  CHECK(cfg.optimizer->lr == 1e-3); // DeepSpeed's FusedLamb defaults
  CHECK(cfg.optimizer->betas == std::array<double, 2>{0.9, 0.999});
  CHECK(cfg.optimizer->eps == 1e-8);
  CHECK(cfg.optimizer->bias_correction);
  CHECK(cfg.optimizer->max_coeff == 10.0);
  CHECK(cfg.optimizer->min_coeff == 0.01);
  CHECK(!cfg.optimizer->eps_inside_sqrt);
  // Written back with its own parameters only, and read again the same.
  const auto json = cfg.to_json();
  CHECK(json["optimizer"]["type"] == "Lamb");
  CHECK(json["optimizer"]["params"].contains("max_coeff"));
  CHECK(!json["optimizer"]["params"].contains("momentum"));
  CHECK(zero::config::from_string(json.dump(), zero::config_inputs{.world_size = 1}).optimizer == cfg.optimizer);
  // Refusals, each naming the key and what is expected.
  auto e = config_refusal(R"({"type": "Lamb", "params": {"max_grad_norm": 1.0}})");
  CHECK(e.find("optimizer.params.max_grad_norm") != std::string::npos);
  CHECK(e.find("gradient_clipping") != std::string::npos);
  e = config_refusal(R"({"type": "Lamb", "params": {"min_coeff": 2, "max_coeff": 1}})");
  CHECK(e.find("optimizer.params.min_coeff") != std::string::npos);
  CHECK(e.find("min_coeff <= max_coeff") != std::string::npos);
  e = config_refusal(R"({"type": "Lamb", "params": {"momentum": 0.9}})");
  CHECK(e.find("not a parameter of Lamb") != std::string::npos);
  // In host memory whole; not split with the device, nor stepped beside the next forward.
  CHECK(config_refusal(R"({"type": "Lamb"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})").empty());
  e = config_refusal(R"({"type": "Lamb"})", R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}})");
  CHECK(e.find(R"(zero_optimization.offload_optimizer.ratio 0.5 with optimizer.type "Lamb")") != std::string::npos);
  CHECK(e.find("offload_optimizer.ratio 1") != std::string::npos);
  e = config_refusal(R"({"type": "Lamb"})",
                     R"({"stage": 2, "offload_optimizer": {"device": "cpu", "forward_overlap": true}})");
  CHECK(e.find(R"(zero_optimization.offload_optimizer.forward_overlap true with optimizer.type "Lamb")") !=
        std::string::npos);
  e = config_refusal(R"({"type": "Lamb"})",
                     R"({"stage": 2, "offload_optimizer": {"device": "cpu", "backward_overlap": 0.5}})");
  CHECK(e.find(R"(zero_optimization.offload_optimizer.backward_overlap with optimizer.type "Lamb")") !=
        std::string::npos);
  e = config_refusal(R"({"type": "Lamb"})",
                     R"({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})");
  CHECK(e.find(R"(offload_optimizer.device "nvme" with optimizer.type "Lamb")") != std::string::npos);
  CHECK(config_refusal(R"({"type": "Lamb"})", R"({"stage": 3, "offload_param": {"device": "cpu"}})").empty());
}
