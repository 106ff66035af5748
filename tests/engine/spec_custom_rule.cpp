// A framework's own update rule through the engine (docs/optimizers.md, "A framework's own rule"): Signum (signSGD
// with momentum) defined here, outside zero, named by the config through config_inputs::optimizers and given to
// the engine with use_rule<Rule>(). Against a reference written out here: the same bits at stages 0-3 on 1, 2 and 4
// ranks; offloaded to host memory at stage 3, the in-memory run's bits; its state counted; and what the config and
// the engine refuse. tests/checkpoint/test_resume.cpp saves, resumes and reshards it.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "signum_rule.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"

#include <array>
#include <cstddef>
#include <doctest/doctest.h>
#include <string>
#include <string_view>
#include <vector>

namespace custom_rule_spec {

namespace zt = zero::testing;
using zero::testing::signum;
using zero::testing::signum_block;
using zero::testing::with_signum;

/// The single-process Signum of `s`, each operation rounded as written.
zt::run_result train_signum_reference(const zt::run_spec& s) {
  return zt::train_reference_with(
      s, zt::reference_state{}, [&](zt::reference_state& at, std::int64_t /*applied*/, const auto& g, float coef) {
        for (std::size_t k = 0; k < at.model.size(); ++k) {
          const float decay = 1.0f - 0.01f * at.decay_of(s, k);
          for (std::size_t i = 0; i < at.master[k].size(); ++i) {
            const float gi = g[k][i] * coef;
            at.m[k][i] = 0.9f * at.m[k][i] + (1.0f - 0.9f) * gi;
            const float b = at.m[k][i];
            at.master[k][i] = at.master[k][i] * decay - 0.01f * (b > 0 ? 1.0f : (b < 0 ? -1.0f : b));
          }
        }
      });
}

zero::config parse(const std::string& optimizer, const std::vector<zero::custom_optimizer>& rules,
                   const std::string& zero_block = R"({"stage": 2})") {
  zero::config_inputs in{.world_size = 1};
  in.optimizers = rules;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": )" + optimizer +
                                       R"(, "zero_optimization": )" + zero_block + "}",
                                   in);
}

std::string config_refusal(const std::string& optimizer, const std::vector<zero::custom_optimizer>& rules,
                           const std::string& zero_block = R"({"stage": 2})") {
  try {
    zero::check_engine_config(parse(optimizer, rules, zero_block));
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return "";
}

} // namespace custom_rule_spec

TEST_CASE("a framework's own rule through the engine: the reference's bits at stages 0-3 on 1, 2 and 4 ranks") {
  using namespace custom_rule_spec;
  const zt::run_spec base = with_signum({.steps = 6, .batch = 64, .param_coupling = 0});
  const auto want = train_signum_reference(base);
  zt::check_reference_bits_at_every_stage(base, want);
  // Not AdamW's run: the rule moved these parameters.
  CHECK(zt::max_rel_diff(zt::train_reference(base).params, want.params) > 1e-3);
  // Clipping on 3 ranks, and stage 3 offloaded to host memory (the host's cpu_backend runs the rule too): the
  // reference within 1e-6, and the offloaded run the in-memory one's bits.
  zt::run_spec s = with_signum({.stage = 3, .world = 3, .clip = 1.0, .steps = 5});
  const auto in_memory = zt::train_with_engine(s);
  CHECK(zt::max_rel_diff(in_memory.params, train_signum_reference(s).params) <= 1e-6);
  s.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
  CHECK(zt::train_with_engine(s).params == in_memory.params);
  s.zero_extra = R"("offload_optimizer": {"device": "cpu", "ratio": 0.5}, "offload_param": {"device": "cpu"})";
  CHECK(zt::train_with_engine(s).params == in_memory.params);
}

TEST_CASE("a framework's own rule keeps its own state: 8 bytes an element of the shard") {
  using namespace custom_rule_spec;
  // Its one tensor beside the master: 8 bytes an element of the shard where AdamW keeps 12.
  const zt::run_spec one = with_signum({.stage = 1, .world = 1, .type = zero::dtype::bf16, .steps = 1});
  zt::with_cpu_engines(one, [&](auto& eng, const zt::model_handles&, zero::thread_communicator&) {
    const auto m = eng.memory();
    CHECK(m.optimizer == 8 * eng.layout().total_size());
  });
}

TEST_CASE("a framework's own rule: what the config and the engine refuse, by name") {
  using namespace custom_rule_spec;
  const std::vector<zero::custom_optimizer> rules = {zero::custom_optimizer::of<signum>()};
  // Read ignoring case, written back under its own name with its own keys, and read again the same.
  const auto cfg = parse(signum_block, rules);
  REQUIRE(cfg.optimizer);
  CHECK(cfg.optimizer->type == zero::optimizer_type::custom);
  CHECK(zero::optimizer_name(*cfg.optimizer) == "Signum");
  CHECK(cfg.optimizer->momentum == 0.9);
  const auto json = cfg.to_json();
  CHECK(json["optimizer"]["type"] == "Signum");
  CHECK(json["optimizer"]["params"].size() == 3);
  CHECK(parse(json["optimizer"].dump(), rules).optimizer == cfg.optimizer);
  // Without the registration the name is unknown; a key the rule does not take is refused, naming what it takes.
  CHECK_THROWS_WITH_AS(static_cast<void>(parse(signum_block, {})),
                       doctest::Contains("optimizer.type: found \"signum\""), zero::config_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(parse(R"({"type": "Signum", "params": {"eps": 1e-8}})", rules)),
                       doctest::Contains("optimizer.params.eps: not a parameter of Signum (it takes lr, momentum, "
                                         "weight_decay"),
                       zero::config_error);
  // A registration with DeepSpeed's name, a key zero does not read, or three tensors.
  CHECK_THROWS_WITH_AS(static_cast<void>(parse(signum_block, {{.name = "lion", .params = {}, .state = {}}})),
                       doctest::Contains("config_inputs::optimizers: \"lion\" is DeepSpeed's Lion"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(parse(signum_block, {{.name = "Signum", .params = {"rho"}, .state = {}}})),
                       doctest::Contains("takes \"rho\", which zero does not read"), zero::config_error);
  CHECK_THROWS_WITH_AS(
      static_cast<void>(parse(signum_block, {{.name = "Signum", .params = {}, .state = {"a", "b", "c"}}})),
      doctest::Contains("keeps 3 state tensors; expected at most 2"), zero::config_error);
  // What is AdamW's alone is refused with it, by its name; host memory runs it.
  CHECK(config_refusal(signum_block, rules,
                       R"({"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"}})")
            .find(R"(zero_optimization.offload_optimizer.device "nvme" with optimizer.type "Signum")") !=
        std::string::npos);
  CHECK(config_refusal(signum_block, rules, R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})").empty());
  // The engine: finalize without the rule's type, or use_rule with another rule, is a usage error naming it.
  zt::run_spec s = with_signum({.steps = 1});
  s.use_rule.clear();
  CHECK_THROWS_WITH_AS(zt::train_with_engine(s),
                       doctest::Contains("optimizer.type \"Signum\" is a framework's own "
                                         "rule; call use_rule<Rule>() with its type"),
                       zero::usage_error);
  s.optimizer.clear(); // AdamW
  s.use_rule = {std::function<void(zero::engine<zero::cpu_backend, zero::thread_communicator>&)>(
      [](zero::engine<zero::cpu_backend, zero::thread_communicator>& eng) { eng.use_rule<signum>(); })};
  CHECK_THROWS_WITH_AS(zt::train_with_engine(s),
                       doctest::Contains("use_rule<Signum>: the config's optimizer.type is \"AdamW\""),
                       zero::usage_error);
}
