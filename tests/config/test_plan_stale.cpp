// zero-estimate --plan --allow-stale: the delayed update's cost worked by hand, the plan proposing it only when
// asked, and the block it writes. tests/config/test_plan.cpp holds the exact settings.

#include "plan_cases.hpp"
#include "support.hpp"
#include "zero/config/check.hpp"
#include "zero/tools/plan.hpp"

#include <doctest/doctest.h>
#include <optional>
#include <string>

using zero::offload_device;
using zero_test::eight_m_on_two;
using zero_test::hand_rates;
using zero_test::has;
namespace zt = zero::tools;

namespace {

/// The row of `plan_settings(o)` at `stage` with the optimizer on `opt`, the parameters on the device.
zt::estimate_row stale_row(const zt::estimate_options& o, int stage, offload_device opt) {
  for (const auto& x : zt::plan_settings(o)) {
    if (x.stage == stage && x.offload_optimizer == opt && x.offload_param == offload_device::none) {
      return x;
    }
  }
  FAIL("no row");
  return {};
}

const zt::plan_candidate* find_row(const zt::plan_result& p, int stage, offload_device opt, offload_device par,
                                   bool delayed) {
  for (const auto& c : p.ranked) {
    if (c.row.stage == stage && c.row.offload_optimizer == opt && c.row.offload_param == par &&
        c.row.offload_ratio >= 1 && (c.row.delayed_warmup >= 0) == delayed) {
      return &c;
    }
  }
  return nullptr;
}

/// Stage 2 with the optimizer on the CPU and ZenFlow (topk_ratio 0.05, update_interval 4) on 2 ranks.
zero::config zenflow_stage2_on_two() {
  return zero::config::from_string(
      R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"},
                                "zenflow": {"topk_ratio": 0.05, "update_interval": 4, "select_strategy": "step",
                                            "select_interval": 0}}})",
      {.world_size = 2});
}

} // namespace

TEST_CASE("the delayed update's step cost, worked by hand: the host's AdamW less forward and backward") {
  auto o = eight_m_on_two();
  o.config_delayed_warmup = 5;
  const auto r = hand_rates();
  const auto delayed = stale_row(o, 2, offload_device::cpu);
  REQUIRE(delayed.delayed_warmup == 5);
  // Host AdamW over 4e6 elements at 5e8 per rank: 8 ms. Without forward and backward given nothing is credited
  // as hidden: the exact row's 8 ms.
  auto c = zt::estimate_step_cost(delayed, o, r);
  CHECK(c.hidden == 0);
  CHECK(c.total == doctest::Approx(8e-3));
  // 5 ms of forward and backward hide 5 of the 8 ms: 3 ms left.
  o.compute_seconds = 5e-3;
  c = zt::estimate_step_cost(delayed, o, r);
  CHECK(c.host_adamw == doctest::Approx(8e-3));
  CHECK(c.hidden == doctest::Approx(5e-3));
  CHECK(c.total == doctest::Approx(3e-3));
  // 10 ms hide all of it; what stays is the parameters' upload, 4e6 x 2 B at 1e10 B/s, which each step
  // publishes before the next forward: 0.8 ms.
  o.compute_seconds = 10e-3;
  c = zt::estimate_step_cost(delayed, o, r);
  CHECK(c.hidden == doctest::Approx(8e-3));
  CHECK(c.total == doctest::Approx(0.8e-3));
  // An exact row is not credited whatever the time.
  auto exact = eight_m_on_two();
  exact.compute_seconds = 10e-3;
  const auto cpu = stale_row(exact, 2, offload_device::cpu);
  CHECK(cpu.delayed_warmup == -1);
  CHECK(zt::estimate_step_cost(cpu, exact, r).total == doctest::Approx(8e-3));
  // The delayed update's memory: the host gradient shard twice, 4e6 gradients more on each of the 2 ranks.
  CHECK(delayed.host_bytes_per_node - cpu.host_bytes_per_node ==
        2 * 4'000'000 * static_cast<std::int64_t>(zero::size_of(delayed.grad_dtype)));
}

TEST_CASE("the plan proposes the delayed update only when asked, and only where the engine runs it") {
  auto o = eight_m_on_two();
  o.compute_seconds = 10e-3;
  const auto r = hand_rates();
  // The device holds 30 MB: stage 2's in-memory state does not fit, the state on the host does.
  const zt::memory_budget budget{.device_bytes = 30'000'000, .host_bytes = std::int64_t{1} << 40, .nvme_bytes = 0};
  const auto exact = zt::make_plan(o, r, budget);
  for (const auto& c : exact.ranked) {
    CHECK(c.row.delayed_warmup == -1);
  }
  REQUIRE(exact.chosen);
  CHECK(exact.ranked[*exact.chosen].row.delayed_warmup == -1);

  const auto stale = zt::make_plan(o, r, budget, 7);
  // Stages 2-3 with the whole state on the CPU and the parameters on the device: nothing else.
  for (const auto& c : stale.ranked) {
    if (c.row.delayed_warmup >= 0) {
      CHECK(c.row.delayed_warmup == 7);
      CHECK(c.row.stage >= 2);
      CHECK(c.row.offload_optimizer == offload_device::cpu);
      CHECK(c.row.offload_ratio >= 1);
      CHECK(c.row.offload_param == offload_device::none);
    }
  }
  REQUIRE(find_row(stale, 2, offload_device::cpu, offload_device::none, true));
  REQUIRE(find_row(stale, 3, offload_device::cpu, offload_device::none, true));
  CHECK_FALSE(find_row(stale, 3, offload_device::cpu, offload_device::cpu, true));
  CHECK_FALSE(find_row(stale, 1, offload_device::cpu, offload_device::none, true));
  REQUIRE(stale.chosen);
  const auto& chosen = stale.ranked[*stale.chosen];
  CHECK(chosen.row.delayed_warmup == 7);
  CHECK(chosen.cost.total < exact.ranked[*exact.chosen].cost.total);
  CHECK(has(zt::plan_table(stale), "delayed_update (warmup_steps 7; NOT EXACT)"));

  // Of equal cost, the exact row first: with no time to hide behind, the delayed rows cost what the exact do.
  o.compute_seconds = 0;
  const auto nothing_hidden = zt::make_plan(o, r, budget, 7);
  REQUIRE(nothing_hidden.chosen);
  CHECK(nothing_hidden.ranked[*nothing_hidden.chosen].row.delayed_warmup == -1);

  CHECK_THROWS_AS(static_cast<void>(zt::make_plan(o, r, budget, -1)), zero::usage_error);
}

TEST_CASE("the delayed row's block: warmup_steps written, backward_overlap turned off; exact rows write null") {
  auto o = eight_m_on_two();
  o.compute_seconds = 10e-3;
  o.config_backward_overlap = 0.5;
  const zt::memory_budget budget{.device_bytes = 30'000'000, .host_bytes = std::int64_t{1} << 40, .nvme_bytes = 0};
  const auto plan = zt::make_plan(o, hand_rates(), budget, 7);
  REQUIRE(plan.chosen);
  const auto block = zt::plan_config_block(plan.ranked[*plan.chosen].row, o, "");
  const auto& off = block["zero_optimization"]["offload_optimizer"];
  CHECK(off["delayed_update"] == nlohmann::json{{"warmup_steps", 7}});
  CHECK(off["backward_overlap"] == 0.0);
  // The block is a config the reader and the engine's checks take on the plan's 2 ranks.
  nlohmann::json ds = {{"train_micro_batch_size_per_gpu", 1},
                       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}}};
  ds.merge_patch(block);
  const auto c = zero::config::from_string(ds.dump(), {.world_size = 2});
  CHECK(c.zero_optimization.offload_optimizer.delayed_update);
  CHECK(c.zero_optimization.offload_optimizer.delayed_warmup_steps == 7);
  CHECK_NOTHROW(zero::check_engine_config(c, 2));
  // An exact row of a config with the block: null, so that the merge removes it.
  auto with_block = o;
  with_block.config_delayed_warmup = 3;
  const auto exact = stale_row(eight_m_on_two(), 2, offload_device::none);
  CHECK(zt::plan_config_block(exact, with_block, "")["zero_optimization"]["offload_optimizer"]["delayed_update"]
            .is_null());
  // The exact CPU row keeps backward_overlap.
  const auto cpu = stale_row(eight_m_on_two(), 2, offload_device::cpu);
  CHECK(zt::plan_config_block(cpu, o, "")["zero_optimization"]["offload_optimizer"]["backward_overlap"] == 0.5);
}

TEST_CASE("a config's ZenFlow: its rows named NOT EXACT and counted with the window; other rows' blocks turn it off") {
  // From a config (estimate_options_from), as zero-estimate --config reads it.
  const auto c = zenflow_stage2_on_two();
  const auto o = zt::estimate_options_from(c, zt::summarize_modules({{4'000'000, 4'000'000}}), 2, 1);
  REQUIRE(o.config_zenflow_topk == 0.05);
  const auto zen = stale_row(o, 2, offload_device::cpu);
  const auto none = stale_row(o, 2, offload_device::none);
  CHECK(zen.zenflow);
  CHECK(stale_row(o, 1, offload_device::cpu).zenflow); // the engine runs ZenFlow at stages 1-3
  CHECK_FALSE(none.zenflow);                           // with the whole state in host memory
  CHECK(zt::setting_name(zen) == "stage 2, offload_optimizer cpu zenflow (NOT EXACT), offload_param none");
  auto exact = o;
  exact.config_zenflow_topk.reset();
  CHECK(zen.host_bytes_per_rank - stale_row(exact, 2, offload_device::cpu).host_bytes_per_rank ==
        4 * 4'000'000); // each rank's fp32 window over its 4e6 elements
  // The block the plan merges: the config's zenflow kept where the row runs it, null (removed) where not.
  CHECK_FALSE(zt::plan_config_block(zen, o, "")["zero_optimization"].contains("zenflow"));
  CHECK(zt::plan_config_block(none, o, "")["zero_optimization"]["zenflow"].is_null());
}

TEST_CASE("ZenFlow's step cost, worked by hand: the chosen elements on the device, the host's step once an interval") {
  auto o = eight_m_on_two();
  o.config_zenflow_topk = 0.05;
  o.config_zenflow_update_interval = 4;
  const auto r = hand_rates();
  const auto zen = stale_row(o, 2, offload_device::cpu);
  REQUIRE(zen.zenflow);
  // 4e6 elements a rank: the device's AdamW over the chosen 0.05 of them, 2e5 at 4e9/s = 0.05 ms; the host's
  // over all, 4e6 at 5e8/s per rank = 8 ms, once in 4 steps = 2 ms; the bf16 gradients down every step, 8e6 B at
  // 2e10 B/s = 0.4 ms, and the parameters up once in 4 steps, 8e6 B / 4 at 1e10 B/s = 0.2 ms.
  const auto c = zt::estimate_step_cost(zen, o, r);
  CHECK(c.device_adamw == doctest::Approx(0.05e-3));
  CHECK(c.host_adamw == doctest::Approx(2e-3));
  CHECK(c.transfer == doctest::Approx(0.6e-3));
  CHECK(c.total == doctest::Approx(2.05e-3));
  // overlap_step: the host's 2 ms beside 1.5 ms of forward and backward leave 0.5 ms, below the copies' 0.6 ms;
  // its rows hold the bf16 gradient shard twice.
  auto overlapped = o;
  overlapped.config_zenflow_overlap = true;
  overlapped.compute_seconds = 1.5e-3;
  const auto zen_overlapped = stale_row(overlapped, 2, offload_device::cpu);
  const auto co = zt::estimate_step_cost(zen_overlapped, overlapped, r);
  CHECK(co.hidden == doctest::Approx(1.5e-3));
  CHECK(co.total == doctest::Approx(0.65e-3));
  CHECK(zen_overlapped.host_bytes_per_rank - zen.host_bytes_per_rank == 4'000'000 * 2);
  // The exact offload of the same rows costs the whole host AdamW every step.
  auto exact = eight_m_on_two();
  CHECK(zt::estimate_step_cost(stale_row(exact, 2, offload_device::cpu), exact, r).total == doctest::Approx(8e-3));
  // From a config: the interval is read with the ratio, and 1 without the block.
  const auto cfg = zenflow_stage2_on_two();
  const auto from = zt::estimate_options_from(cfg, zt::summarize_modules({{4'000'000, 4'000'000}}), 2, 1);
  CHECK(from.config_zenflow_update_interval == 4);
  CHECK(zt::estimate_options{}.config_zenflow_update_interval == 1);
}
