// zero_optimization.zenflow: DeepSpeed's ZenFlow block read with DeepSpeed's keys, defaults and rules between them,
// written back, and refused by the engine's check (first where DeepSpeed refuses it, then because this version's
// engine does not run it).

#include "support.hpp"
#include "zero/config/check.hpp"
#include "zero/config/config.hpp"

#include <doctest/doctest.h>
#include <limits>
#include <string>
#include <string_view>

using zero::config;
using zero::zenflow_select;
using zero_test::check_refused;
using zero_test::error_of;
using zero_test::has;

namespace {

/// A bf16 AdamW config at `stage` with the optimizer on the CPU and `zenflow` as the block's text.
std::string with_zenflow(std::string_view zenflow, int stage = 2, std::string_view offload = R"("cpu")") {
  return std::string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
    "zero_optimization": {"stage": )") +
         std::to_string(stage) + R"(, "offload_optimizer": {"device": )" + std::string(offload) + R"(}, "zenflow": )" +
         std::string(zenflow) + "}}";
}

/// What check_engine_config says of `c` on one rank: its refusal, or empty when it accepts it.
std::string engine_refusal(const config& c) {
  try {
    zero::check_engine_config(c, 1);
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return {};
}

} // namespace

TEST_CASE("zenflow: DeepSpeed's tutorial block is read with its values and DeepSpeed's defaults for the rest") {
  const config c = config::from_string(with_zenflow(
      R"({"topk_ratio": 0.05, "select_strategy": "auto", "select_interval": "auto", "update_interval": 4,
          "full_warm_up_rounds": 0, "overlap_step": true})"));
  const auto& z = c.zero_optimization.zenflow;
  CHECK(z.enabled);
  CHECK(z.topk_ratio == 0.05);
  CHECK(z.select_strategy == zenflow_select::automatic);
  CHECK_FALSE(z.select_interval.has_value());
  CHECK(z.update_interval == 4);
  CHECK(z.overlap_step);
  CHECK(z.full_warm_up_rounds == 0);
  // DeepSpeed's defaults.
  CHECK_FALSE(z.offload);
  CHECK(z.auto_ratio == 0.99);
  CHECK(z.pt_reserved_cores_perc == 0.5);
  CHECK(z.steps_per_epoch == 0);
  // "auto" selects once an epoch; an epoch's steps unknown: once.
  CHECK(zero::zenflow_select_steps(z) == 0);

  // Without the block, or null: off, and not written back.
  CHECK_FALSE(config::from_string(with_zenflow("null")).zero_optimization.zenflow.enabled);
  CHECK_FALSE(config::from_string(with_zenflow("null")).to_json()["zero_optimization"].contains("zenflow"));
}

TEST_CASE("zenflow: the select interval in steps, DeepSpeed's rule for each strategy") {
  auto steps = [](std::string_view block) {
    return zero::zenflow_select_steps(config::from_string(with_zenflow(block)).zero_optimization.zenflow);
  };
  CHECK(steps(R"({"select_strategy": "step", "select_interval": 10, "update_interval": 3})") == 10);
  CHECK(steps(R"({"select_strategy": "step", "select_interval": 0, "update_interval": 3})") == 0);
  CHECK(steps(R"({"select_strategy": "epoch", "select_interval": 2, "update_interval": 4, "steps_per_epoch": 50})") ==
        100);
  CHECK(steps(R"({"select_strategy": "epoch", "select_interval": 2, "update_interval": 4})") == 0);
  CHECK(steps(R"({"update_interval": 4, "steps_per_epoch": 30})") == 30);
  // An epoch interval whose steps overflow never selects again.
  zero::zenflow_config huge;
  huge.select_strategy = zenflow_select::epoch;
  huge.select_interval = std::int64_t{1} << 40;
  huge.steps_per_epoch = std::int64_t{1} << 40;
  CHECK(zero::zenflow_select_steps(huge) == std::numeric_limits<std::int64_t>::max());
}

TEST_CASE("zenflow: written back by to_json and read again to the same settings") {
  const config c = config::from_string(
      with_zenflow(R"({"topk_ratio": 0.2, "select_strategy": "step", "select_interval": 10, "update_interval": 3,
                       "full_warm_up_rounds": 5, "offload": false, "pt_reserved_cores_perc": 0.25})"));
  const auto j = c.to_json();
  const auto& z = j["zero_optimization"]["zenflow"];
  CHECK(z["topk_ratio"] == 0.2);
  CHECK(z["select_strategy"] == "step");
  CHECK(z["select_interval"] == 10);
  CHECK(z["update_interval"] == 3);
  CHECK(z["full_warm_up_rounds"] == 5);
  const config again = config::from_string(j.dump());
  CHECK(again.zero_optimization.zenflow == c.zero_optimization.zenflow);
  // "auto" is written as "auto".
  const auto tutorial = config::from_string(with_zenflow(R"({"update_interval": 4})")).to_json();
  CHECK(tutorial["zero_optimization"]["zenflow"]["select_interval"] == "auto");
  CHECK(tutorial["zero_optimization"]["zenflow"]["select_strategy"] == "auto");
}

TEST_CASE("zenflow: the reader refuses what DeepSpeed refuses, and the adaptive interval, naming the key") {
  check_refused({
      {with_zenflow(R"({"select_interval": 5, "update_interval": 4})"),
       "zero_optimization.zenflow.select_interval: found 5 with select_strategy \"auto\""},
      {with_zenflow(R"({"select_strategy": "step", "update_interval": 4})"),
       "zero_optimization.zenflow.select_interval: missing; select_strategy \"step\" needs a number: the steps"},
      {with_zenflow(R"({"select_strategy": "epoch", "select_interval": "auto", "update_interval": 4})"),
       "select_interval: found \"auto\"; select_strategy \"epoch\" needs a number: the epochs"},
      {with_zenflow(R"({"topk_ratio": 0.1})"),
       "zero_optimization.zenflow.update_interval: missing, which DeepSpeed reads as \"auto\"; zero has no adaptive "
       "update interval: give the steps between the host's updates, e.g. 4"},
      {with_zenflow(R"({"update_interval": "auto"})"), "update_interval: found \"auto\"; zero has no adaptive"},
      {with_zenflow(R"({"select_strategy": "step", "select_interval": 3, "update_interval": 4})"),
       "select_interval: selects every 3 steps, fewer than update_interval 4"},
      {with_zenflow(R"({"topk_ratio": 1.5, "update_interval": 4})"), "zero_optimization.zenflow.topk_ratio"},
      {with_zenflow(R"({"select_strategy": "random", "update_interval": 4})"), "zenflow.select_strategy"},
      {with_zenflow(R"({"update_interval": 0})"), "zero_optimization.zenflow.update_interval"},
      {with_zenflow(R"({"update_interval": 4, "topk": 0.1})"), "topk"},
      {with_zenflow(R"([4])"), "zero_optimization.zenflow"},
  });
}

TEST_CASE("zenflow: the engine's check refuses it where DeepSpeed does, then where zero's engine does not run it") {
  CHECK(has(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4})", 0, R"("none")"))),
            "zero_optimization.zenflow at stage 0"));
  CHECK(has(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4})", 2, R"("none")"))),
            "zero_optimization.zenflow at stage 2 without offload_optimizer"));
  CHECK(has(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4, "offload": true})"))),
            "zero_optimization.zenflow.offload true without overlap_comm"));
  // Stage 3 without the optimizer offloaded: DeepSpeed does not refuse it; the engine's reason is its own.
  CHECK(has(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4})", 3, R"("none")"))),
            "zero_optimization.zenflow with offload_optimizer.device \"none\": zero's ZenFlow keeps the whole "
            "optimizer state in host memory"));
  // overlap_step runs with the columns chosen once and chosen again (the update pending lands at the choice).
  CHECK(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4, "overlap_step": true})"))).empty());
  CHECK(engine_refusal(
            config::from_string(with_zenflow(
                R"({"update_interval": 4, "overlap_step": true, "select_strategy": "step", "select_interval": 6})")))
            .empty());
  CHECK(has(engine_refusal(
                config::from_string(with_zenflow(R"({"update_interval": 4})", 2, R"("cpu", "forward_overlap": true)"))),
            "zero_optimization.zenflow with offload_optimizer.backward_overlap 0 and forward_overlap true: "
            "ZenFlow's host step runs after backward"));
  // What zero's engine runs: stages 1-3, the whole state on the CPU, with gradient accumulation too.
  const auto accumulating = [](std::string text) { return "{\"gradient_accumulation_steps\": 2, " + text.substr(1); };
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    CHECK(engine_refusal(config::from_string(with_zenflow(R"({"update_interval": 4})", stage))).empty());
    CHECK(engine_refusal(config::from_string(accumulating(with_zenflow(R"({"update_interval": 4})", stage)))).empty());
  }
  // overlap_step's host update would share the threads that add the micro-steps' gradients.
  CHECK(has(engine_refusal(
                config::from_string(accumulating(with_zenflow(R"({"update_interval": 4, "overlap_step": true})")))),
            "zero_optimization.zenflow with overlap_step true and gradient_accumulation_steps 2: the host's update "
            "runs beside the next steps on the threads that would add their micro-steps' gradients; expected "
            "overlap_step false, or gradient_accumulation_steps 1"));
}
