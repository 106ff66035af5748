// zero-estimate --plan's arithmetic: byte counts, the rates file, the cost model, the ranking and the
// choice against budgets, and the config block it prints. tests/config/test_plan_engine.cpp holds
// plans against what engines measure.

#include "plan_cases.hpp"
#include "support.hpp"
#include "zero/tools/plan.hpp"

#include <doctest/doctest.h>
#include <string>

using zero::offload_device;
using zero_test::eight_m_on_two;
using zero_test::hand_rates;
using zero_test::has;
namespace zt = zero::tools;

namespace {

/// Rates of an imagined GPU machine: 8 H200-like devices and a 32-core host.
zt::machine_rates gpu_rates() {
  zt::machine_rates r;
  r.device = "test GPU";
  r.device_adamw = 50e9;
  r.host_adamw = 4e9;
  r.host_threads = 32;
  r.host_to_device = 50e9;
  r.device_to_host = 50e9;
  r.nvme_path = "/mnt/nvme";
  r.nvme_read = 6e9;
  r.nvme_write = 4e9;
  return r;
}

/// 7e9 bf16 parameters on 1 node x 8 GPUs, largest layer 131072000 (the tools' CTest model).
zt::estimate_options seven_b() {
  zt::estimate_options o;
  o.params = 7'000'000'000;
  o.largest_layer_params = 131'072'000;
  o.gpus_per_node = 8;
  return o;
}

std::string text_of(const zt::plan_result& p) { return zt::plan_table(p); }

/// A bf16 stage 3 config on `world` ranks with one more zero_optimization key, `key` (e.g.
/// `"mics_shard_size": 4`), and the model the hpZ and HSDP cases plan for: modules of 600000 + 600 and
/// 6000 + 60 parameters.
struct stage3_case {
  zero::config config;
  zt::model_summary model;
  stage3_case(const std::string& key, int world)
      : config(zero::config::from_string(
            R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, )" +
                key + "}}",
            {.world_size = world})),
        model(zt::summarize_modules({{600'000, 600}, {6'000, 60}})) {}
};

std::string usage_message(std::string_view bytes) {
  try {
    static_cast<void>(zt::parse_bytes(bytes));
  } catch (const zero::usage_error& e) {
    return e.what();
  }
  FAIL("expected a usage_error for \"" << bytes << "\"");
  return {};
}

std::string rates_message(const nlohmann::json& j) {
  try {
    static_cast<void>(zt::rates_from_json(j, "rates.json"));
  } catch (const zero::config_error& e) {
    return e.what();
  }
  FAIL("expected a config_error for " << j.dump());
  return {};
}

constexpr std::int64_t gib = std::int64_t{1} << 30;

} // namespace

TEST_CASE("parse_bytes takes whole bytes, decimal and binary units, and names the forms it expects otherwise") {
  CHECK(zt::parse_bytes("85899345920") == 85'899'345'920);
  CHECK(zt::parse_bytes("8e10") == 80'000'000'000);
  CHECK(zt::parse_bytes("80GiB") == 80 * gib);
  CHECK(zt::parse_bytes("80 GB") == 80'000'000'000);
  CHECK(zt::parse_bytes("1.5TiB") == 1536 * gib);
  CHECK(zt::parse_bytes("512MiB") == 512 << 20);
  CHECK(zt::parse_bytes("4kB") == 4000);
  CHECK(zt::parse_bytes("0") == 0);
  CHECK(zt::parse_bytes("100B") == 100);
  for (const char* bad : {"12G", "80gib", "abc", "-1", "1.5", "", "GiB", "1e30", "nan", "12GiB!"}) {
    CAPTURE(bad);
    const std::string m = usage_message(bad);
    CHECK(has(m, std::string("\"") + bad +
                     "\" is not a byte count: expected a whole number of bytes such as "
                     "85899345920 or 8e10, or a number with a unit: 80GiB"));
  }
}

TEST_CASE("show_bytes writes the largest binary unit a count fills") {
  CHECK(zt::show_bytes(0) == "0 B");
  CHECK(zt::show_bytes(1023) == "1023 B");
  CHECK(zt::show_bytes(1536) == "1.50 KiB");
  CHECK(zt::show_bytes(1'500'000) == "1.43 MiB");
  CHECK(zt::show_bytes(20 * gib) == "20.00 GiB");
  CHECK(zt::show_bytes(1024 * gib) == "1.00 TiB");
  CHECK(zt::show_bytes(-5 * gib) == "-5.00 GiB");
}

TEST_CASE("the rates file reads back what rates_json writes, and names a missing, unknown or bad key") {
  const auto r = gpu_rates();
  const auto back = zt::rates_from_json(zt::rates_json(r));
  CHECK(back.device == "test GPU");
  CHECK(back.device_adamw == 50e9);
  CHECK(back.host_adamw == 4e9);
  CHECK(back.host_threads == 32);
  CHECK(back.host_to_device == 50e9);
  CHECK(back.device_to_host == 50e9);
  CHECK(back.nvme_path == "/mnt/nvme");
  CHECK(back.nvme_read == 6e9);
  CHECK(back.nvme_write == 4e9);

  auto j = zt::rates_json(r);
  j.erase("host_adamw_params_per_s");
  CHECK(has(rates_message(j), "host_adamw_params_per_s: missing; zero-report --save-rates writes every rate"));
  j = zt::rates_json(r);
  j["host_adamw_param_per_s"] = 1;
  CHECK(has(rates_message(j), "host_adamw_param_per_s: unknown key (did you mean \"host_adamw_params_per_s\"?)"));
  j = zt::rates_json(r);
  j["device_adamw_params_per_s"] = 0;
  CHECK(has(rates_message(j), "device_adamw_params_per_s: found 0"));
  j = zt::rates_json(r);
  j["nvme_path"] = "";
  CHECK(has(rates_message(j), "nvme_read_bytes_per_s: found 6000000000.0 with an empty nvme_path; a storage rate needs "
                              "the folder it was measured in"));
  CHECK(has(rates_message(nlohmann::json::array()), "expected the JSON object zero-report --save-rates writes"));
  CHECK(has(rates_message(j), "rates.json"));
}

TEST_CASE("the step cost of each placement, worked by hand") {
  const auto o = eight_m_on_two();
  auto r = hand_rates();
  r.host_threads = 2;
  r.nvme_read = 2e9; // 1e9 per rank
  r.nvme_write = 1e9;
  r.nvme_path = "/tmp";
  auto row = [&](int stage, offload_device opt, offload_device par) {
    for (const auto& x : zt::plan_settings(o)) {
      if (x.stage == stage && x.offload_optimizer == opt && x.offload_param == par) {
        return x;
      }
    }
    FAIL("no row");
    return zt::estimate_row{};
  };
  // Stage 0 updates all 8e6 on the device: 2 ms; stage 2 its 4e6: 1 ms.
  CHECK(zt::estimate_step_cost(row(0, offload_device::none, offload_device::none), o, r).total ==
        doctest::Approx(2e-3));
  CHECK(zt::estimate_step_cost(row(2, offload_device::none, offload_device::none), o, r).total ==
        doctest::Approx(1e-3));
  // Optimizer on the CPU: host AdamW 4e6 / 5e8 = 8 ms; bf16 gradients down 8e6 B / 2e10 = 0.4 ms, parameters
  // up 8e6 B / 1e10 = 0.8 ms. The host side overlaps: 8 ms.
  const auto cpu = zt::estimate_step_cost(row(2, offload_device::cpu, offload_device::none), o, r);
  CHECK(cpu.host_adamw == doctest::Approx(8e-3));
  CHECK(cpu.transfer == doctest::Approx(1.2e-3));
  CHECK(cpu.total == doctest::Approx(8e-3));
  // NVMe: K n = 48e6 bytes read at 1e9 per rank (48 ms) and written at 5e8 (96 ms): 144 ms.
  const auto nvme = zt::estimate_step_cost(row(2, offload_device::nvme, offload_device::none), o, r);
  CHECK(nvme.nvme == doctest::Approx(0.144));
  CHECK(nvme.total == doctest::Approx(0.144));
  // Parameters offloaded too (stage 3): the gathers of forward and backward upload 2 x 8e6 B: 1.6 ms + 0.4 ms.
  CHECK(zt::estimate_step_cost(row(3, offload_device::cpu, offload_device::cpu), o, r).transfer ==
        doctest::Approx(2e-3));
  // Without NVMe rates an NVMe row costs infinitely much (it is ranked last).
  r.nvme_read = r.nvme_write = 0;
  CHECK(zt::estimate_step_cost(row(2, offload_device::nvme, offload_device::none), o, r).total ==
        std::numeric_limits<double>::infinity());
  // A partial offload at stage 2, ratio 0.25: the host's 1e6 elements take 2 ms of AdamW, 2e6 B down (0.1 ms)
  // and 2e6 B up (0.2 ms) in series, 2.3 ms, beside the device's 3e6 (0.75 ms); never less than the whole
  // shard on the device (1 ms), which ratio 0.1 (0.8 + 0.12 ms on the host) costs.
  auto partial = [&](double ratio, offload_device par = offload_device::none) {
    auto at = o;
    at.offload_ratio = ratio;
    for (const auto& x : zt::estimate_memory(at)) {
      if (x.stage == (par == offload_device::none ? 2 : 3) && x.offload_optimizer == offload_device::cpu &&
          x.offload_param == par) {
        return x;
      }
    }
    FAIL("no row");
    return zt::estimate_row{};
  };
  const auto quarter = zt::estimate_step_cost(partial(0.25), o, r);
  CHECK(quarter.device_adamw == doctest::Approx(0.75e-3));
  CHECK(quarter.host_adamw == doctest::Approx(2e-3));
  CHECK(quarter.transfer == doctest::Approx(0.3e-3));
  CHECK(quarter.total == doctest::Approx(2.3e-3));
  CHECK(zt::estimate_step_cost(partial(0.1), o, r).total == doctest::Approx(1e-3));
  // On the CPU backend the two parts share the cores: 0.9 ms + 0.92 ms.
  auto on_cpu = r;
  on_cpu.device = "cpu";
  CHECK(zt::estimate_step_cost(partial(0.1), o, on_cpu).total == doctest::Approx(1.82e-3));
  // With the parameters on the host (stage 3) the device's part writes its 3e6 parameters across from the
  // kernel: 2e6 B of the host's gradients and 6e6 B of parameters down (0.4 ms), and the gathers of forward
  // and backward upload all 4e6 parameters twice, 16e6 B (1.6 ms): 2 ms of copies in series with the
  // host's 2 ms of AdamW.
  const auto both = zt::estimate_step_cost(partial(0.25, offload_device::cpu), o, r);
  CHECK(both.device_adamw == doctest::Approx(0.75e-3));
  CHECK(both.host_adamw == doctest::Approx(2e-3));
  CHECK(both.transfer == doctest::Approx(2e-3));
  CHECK(both.total == doctest::Approx(4e-3));
  r.device_adamw = 0;
  CHECK_THROWS_AS(static_cast<void>(zt::estimate_step_cost(row(1, offload_device::none, offload_device::none), o, r)),
                  zero::usage_error);
}

TEST_CASE("config_row is a config's own setting, which the step cost prices as the planner's row") {
  // zero-deep-mlp-cuda prices its config's row for the host side's bound. A row with the whole state on
  // the CPU but its offload_ratio left at the row's default of 0 cost 0 ms on the host (what the example
  // printed before config_row): the ratio comes from the config.
  const auto o = eight_m_on_two();
  const auto r = hand_rates();
  const auto row = [](const char* zero_optimization, const char* dtype = "bf16") {
    return zt::config_row(zero::config::from_string(std::string(R"({"train_micro_batch_size_per_gpu": 1, ")") + dtype +
                                                        R"(": {"enabled": true}, "zero_optimization": )" +
                                                        zero_optimization + "}",
                                                    {.world_size = 2}));
  };
  const auto whole = row(R"({"stage": 2, "offload_optimizer": {"device": "cpu"}})");
  CHECK(whole.stage == 2);
  CHECK(whole.offload_optimizer == offload_device::cpu);
  CHECK(whole.offload_param == offload_device::none);
  CHECK(whole.grad_dtype == zero::dtype::bf16);
  CHECK(whole.offload_ratio == 1.0);
  // The same 4e6 elements a rank, 8 ms of host AdamW and 1.2 ms of copies, as the planner's own cpu row.
  const auto cost = zt::estimate_step_cost(whole, o, r);
  CHECK(cost.host_adamw == doctest::Approx(8e-3));
  CHECK(cost.transfer == doctest::Approx(1.2e-3));
  // A partial offload: the host's 0.25 of the shard, as in the hand-worked partial row.
  const auto quarter = row(R"({"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.25}})");
  CHECK(quarter.offload_ratio == 0.25);
  CHECK(zt::estimate_step_cost(quarter, o, r).host_adamw == doctest::Approx(2e-3));
  // Stage 3 carries where the parameters live; stages 1-2 never offload them. NVMe offloads the whole state.
  const auto both = row(R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"},
                            "offload_param": {"device": "cpu"}})");
  CHECK(both.offload_param == offload_device::cpu);
  CHECK(both.offload_ratio == 1.0);
  CHECK(zt::estimate_step_cost(both, o, r).transfer == doctest::Approx(2e-3));
  const auto none = row(R"({"stage": 1})", "fp16");
  CHECK(none.offload_optimizer == offload_device::none);
  CHECK(none.offload_ratio == 0.0);
  CHECK(none.grad_dtype == zero::dtype::f16);
  CHECK(zt::estimate_step_cost(none, o, r).device_adamw == doctest::Approx(1e-3));
}

TEST_CASE("the partial offload of a stage: the largest device share of the state that fits the device budget") {
  const auto o = seven_b();
  // Stage 3 keeps 2 x 875e6 (16-bit shard) + 2 x 875e6 (gradient shard) + 2 x 131072000 (staging) + 2 x 181072000
  // (working set) = 4124288000 bytes and 12 x 875e6 = 10.5e9 of state; in 8 GiB less 0.5% (8546984919) the
  // device keeps at most 4422696919 of state, 0.42121 of it: ratio 0.5788 (0.5787 is 953081 bytes over).
  const std::int64_t budget = 8 * gib;
  const auto r = zt::partial_offload_setting(o, 3, budget);
  REQUIRE(r);
  CHECK(r->stage == 3);
  CHECK(r->offload_optimizer == offload_device::cpu);
  CHECK(r->offload_param == offload_device::none);
  CHECK(r->offload_ratio == doctest::Approx(0.5788));
  const std::int64_t target = 8'546'984'919;
  CHECK(r->gpu_bytes_per_rank == std::int64_t{4'124'288'000} + 10'500'000'000 - 12 * std::int64_t{506'450'000});
  CHECK(r->gpu_bytes_per_rank <= target);
  auto under = o;
  under.offload_ratio = 0.5787;
  for (const auto& x : zt::estimate_memory(under)) {
    if (x.stage == 3 && x.offload_optimizer == offload_device::cpu && x.offload_param == offload_device::none) {
      CHECK(x.gpu_bytes_per_rank - target == 953'081);
    }
  }
  // None where the stage fits in memory (13.62 GiB at stage 3), nor where even 0.9999 does not (stage 2 keeps
  // its 14e9 bytes of parameters), nor below stage 1.
  CHECK_FALSE(zt::partial_offload_setting(o, 3, 14 * gib));
  CHECK_FALSE(zt::partial_offload_setting(o, 2, budget));
  CHECK_THROWS_AS(static_cast<void>(zt::partial_offload_setting(o, 0, budget)), zero::usage_error);
  // With the parameters on the host (stage 3) the device keeps no 16-bit shard (1.75e9 bytes less): ratio 0.4122.
  const auto on_host = zt::partial_offload_setting(o, 3, budget, offload_device::cpu);
  REQUIRE(on_host);
  CHECK(on_host->offload_param == offload_device::cpu);
  CHECK(on_host->offload_ratio == doctest::Approx(0.4122));
  CHECK(on_host->gpu_bytes_per_rank <= target);
  CHECK_FALSE(zt::partial_offload_setting(o, 3, 14 * gib, offload_device::cpu));
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::partial_offload_setting(o, 2, budget, offload_device::cpu)),
                       doctest::Contains("offload_param cpu at stage 2"), zero::usage_error);
}

TEST_CASE("the state split between host memory and NVMe: the largest host share that fits the host budget") {
  const auto o = seven_b();
  // Per node at stage 2 (8 ranks of 875e6 elements): the whole state in host memory takes 16 x 7e9 = 112e9 bytes.
  const auto row_of = [&](const std::vector<zt::estimate_row>& rows, offload_device opt) {
    for (const auto& x : rows) {
      if (x.stage == 2 && x.offload_optimizer == opt && x.offload_param == offload_device::none) {
        return x;
      }
    }
    FAIL("no row");
    return zt::estimate_row{};
  };
  const std::int64_t budget = 80 * gib;
  const auto r = zt::host_nvme_setting(o, 2, budget);
  REQUIRE(r);
  CHECK(r->offload_optimizer == offload_device::nvme);
  CHECK(r->host_ratio > 0);
  CHECK(r->host_ratio < 1);
  const auto target = static_cast<std::int64_t>(std::floor(static_cast<double>(budget) * (1 - 0.005)));
  CHECK(r->host_bytes_per_node <= target);
  // One step of 1e-4 more does not fit; and the split holds less on NVMe than the whole state there.
  auto more = o;
  more.host_ratio = r->host_ratio + 1e-4;
  CHECK(row_of(zt::estimate_memory(more), offload_device::nvme).host_bytes_per_node > target);
  CHECK(r->nvme_bytes_per_node < row_of(zt::estimate_memory(o), offload_device::nvme).nvme_bytes_per_node);
  // None where the whole state fits in host memory, nor where not even the whole state on NVMe fits its host part
  // (the gradient shard, two parameter copies, the chunk buffers: 6 x 7e9 bytes and more).
  CHECK(row_of(zt::estimate_memory(o), offload_device::cpu).host_bytes_per_node <= 120 * gib);
  CHECK_FALSE(zt::host_nvme_setting(o, 2, 120 * gib));
  CHECK_FALSE(zt::host_nvme_setting(o, 2, 30 * gib));
  CHECK_THROWS_AS(static_cast<void>(zt::host_nvme_setting(o, 0, budget)), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zt::host_nvme_setting(o, 2, budget, offload_device::cpu)), zero::usage_error);
  // The cost: the file's share overlapped as on NVMe, then the host share's AdamW.
  const zero::tools::machine_rates rates{.device_adamw = 5e10,
                                         .host_adamw = 4e9,
                                         .host_to_device = 5e10,
                                         .device_to_host = 5e10,
                                         .nvme_read = 6e9,
                                         .nvme_write = 4e9,
                                         .device = "test",
                                         .nvme_path = "/local_nvme"};
  const auto whole = row_of(zt::estimate_memory(o), offload_device::nvme);
  const auto split_cost = zt::estimate_step_cost(*r, o, rates);
  CHECK(split_cost.total < zt::estimate_step_cost(whole, o, rates).total);
  CHECK(split_cost.total > zt::estimate_step_cost(row_of(zt::estimate_memory(o), offload_device::cpu), o, rates).total);
  // The block names the key; merged into a config the reader takes it.
  const auto block = zt::plan_config_block(*r, o, "/local_nvme");
  CHECK(block["zero_optimization"]["offload_optimizer"]["host_ratio"] == r->host_ratio);
  CHECK(block["zero_optimization"]["offload_optimizer"]["device"] == "nvme");
}

TEST_CASE("the plan for 7e9 parameters on 8 GPUs: the fastest setting that fits, and why faster ones do not") {
  const auto o = seven_b();
  const auto r = gpu_rates();
  SUBCASE("the candidates are the rows the engine runs, sharded and in memory first") {
    const auto plan = zt::make_plan(o, r, {.device_bytes = 1024 * gib, .host_bytes = 4096 * gib});
    for (const auto& c : plan.ranked) {
      CHECK(c.row.implemented);
    }
    CHECK(plan.ranked.size() == zt::plan_settings(o).size());
    REQUIRE(plan.chosen == 0u);
    // Stages 1-3 update 1/8 of the parameters each, at the same cost; stage 0 all of them.
    CHECK(plan.ranked[0].row.stage == 1);
    CHECK(plan.ranked[1].row.stage == 2);
    CHECK(plan.ranked[2].row.stage == 3);
    CHECK(plan.ranked[3].row.stage == 0);
    CHECK(plan.ranked[3].row.offload_optimizer == offload_device::none);
    // Then the CPU offloads; NVMe needs a budget (none given), so it does not fit.
    CHECK(plan.ranked[4].row.offload_optimizer == offload_device::cpu);
    CHECK(plan.ranked.back().row.offload_optimizer == offload_device::nvme);
    CHECK(has(text_of(plan), "plan: stage 1, offload_optimizer none, offload_param none"));
  }
  SUBCASE("20 GiB per GPU: stage 3 in memory (13.62 GiB), stages 1 and 2 are over") {
    const auto plan = zt::make_plan(o, r, {.device_bytes = 20 * gib, .host_bytes = 4096 * gib});
    REQUIRE(plan.chosen == 2u);
    CHECK(plan.ranked[2].row.stage == 3);
    CHECK(plan.ranked[2].row.offload_optimizer == offload_device::none);
    const std::string t = text_of(plan);
    // Stage 2: 7e9 x 2 + 875e6 x (2 + 12) + one bucket of 5e8 x 2 = 27.25e9 bytes.
    CHECK(has(t, "stage 2, offload_optimizer none, offload_param none: 17.500 ms; 25.38 GiB, 0 B, 0 B; does "
                 "not fit: GPU needs 25.38 GiB, 5.38 GiB over its 20.00 GiB"));
    CHECK(has(t, "  * stage 3, offload_optimizer none, offload_param none: 17.500 ms;"));
    CHECK(has(t, "plan: stage 3, offload_optimizer none, offload_param none"));
  }
  SUBCASE("8 GiB per GPU: part of the optimizer on the CPU at stage 3 with the parameters there, before all of it") {
    const auto plan = zt::make_plan(o, r, {.device_bytes = 8 * gib, .host_bytes = 4096 * gib});
    REQUIRE(plan.chosen);
    const auto& c = plan.ranked[*plan.chosen];
    CHECK(c.row.stage == 3);
    CHECK(c.row.offload_optimizer == offload_device::cpu);
    CHECK(c.row.offload_param == offload_device::cpu);
    for (std::size_t i = 0; i < *plan.chosen; ++i) {
      CHECK_FALSE(plan.ranked[i].fits());
    }
    // With the parameters on the host the device keeps no 16-bit shard, so more of the state fits there:
    // ratio 0.4122, the host's 360.675e6 elements at 5e8 per rank (721.35 ms), in series with 1.75e9 bytes
    // down (the host's gradients and the device part's parameters, 35 ms) and the gathers' 3.5e9 up (70 ms).
    // With the parameters on the device, ratio 0.5788: 506.45e6 elements (1012.9 ms) and their 2 x 1012.9e6
    // bytes of copies (40.516 ms). The whole state on the host: 1750 ms.
    CHECK(c.row.offload_ratio == doctest::Approx(0.4122));
    const std::string t = text_of(plan);
    CHECK(has(t, "  * stage 3, offload_optimizer cpu ratio 0.4122, offload_param cpu: 826.350 ms;"));
    CHECK(has(t, "    stage 3, offload_optimizer cpu ratio 0.5788, offload_param none: 1053.416 ms;"));
    CHECK(has(t, "    stage 3, offload_optimizer cpu, offload_param none: 1750.000 ms;"));
    CHECK(has(t, "plan: stage 3, offload_optimizer cpu ratio 0.4122, offload_param cpu"));
    const auto block = zt::plan_config_block(c.row, o, "");
    CHECK(block.at("zero_optimization").at("offload_optimizer").at("ratio") == 0.4122);
    CHECK(block.at("zero_optimization").at("offload_param").at("device") == "cpu");
    auto full = nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}})");
    full.merge_patch(block);
    CHECK(zero::config::from_json(full, {.world_size = 8}).zero_optimization.offload_optimizer.ratio == 0.4122);
    // With the CPU backend's rates (device and host the same cores) no partial offload is listed.
    auto on_cpu = r;
    on_cpu.device = "cpu";
    const auto cpu_plan = zt::make_plan(o, on_cpu, {.device_bytes = 8 * gib, .host_bytes = 4096 * gib});
    CHECK(cpu_plan.ranked.size() == zt::plan_settings(o).size());
    REQUIRE(cpu_plan.chosen);
    CHECK(zt::setting_name(cpu_plan.ranked[*cpu_plan.chosen].row) ==
          "stage 3, offload_optimizer cpu, offload_param none");
  }
  SUBCASE("2 GiB per GPU and 90 GiB of host: the parameters go to the host, the optimizer state to NVMe") {
    const auto plan = zt::make_plan(o, r, {.device_bytes = 2 * gib, .host_bytes = 90 * gib, .nvme_bytes = 1024 * gib});
    REQUIRE(plan.chosen);
    const auto& c = plan.ranked[*plan.chosen];
    CHECK(c.row.stage == 3);
    CHECK(c.row.offload_optimizer == offload_device::nvme);
    CHECK(c.row.offload_param == offload_device::cpu);
    // Both offloaded to the CPU needs 104.31 GiB of host memory per node; the optimizer alone on NVMe
    // leaves 2.46 GiB per GPU.
    CHECK(has(text_of(plan), "stage 3, offload_optimizer cpu, offload_param cpu: "));
    CHECK(has(text_of(plan), "host needs 104.31 GiB, 14.31 GiB over its 90.00 GiB"));
    CHECK(has(text_of(plan), "GPU needs 2.46 GiB, 466.30 MiB over its 2.00 GiB"));
  }
  SUBCASE("512 MiB per GPU: nothing fits (both offloaded to the CPU keep 845 MiB there)") {
    const auto plan =
        zt::make_plan(o, r, {.device_bytes = gib / 2, .host_bytes = 4096 * gib, .nvme_bytes = 4096 * gib});
    CHECK_FALSE(plan.chosen);
    CHECK(has(text_of(plan), "plan: nothing fits the budgets"));
  }
  CHECK_THROWS_AS(static_cast<void>(zt::make_plan(o, r, {.device_bytes = -1})), zero::usage_error);
}

TEST_CASE("the plan's config block is a DeepSpeed config the reader takes, with the chosen setting") {
  auto o = seven_b();
  o.allgather_bucket_size = 200'000'000;
  for (const auto& row : zt::plan_settings(o)) {
    CAPTURE(zt::setting_name(row));
    const auto block = zt::plan_config_block(row, o, "/mnt/nvme");
    const auto& z = block.at("zero_optimization");
    CHECK(z.at("stage") == row.stage);
    CHECK(z.at("offload_optimizer").at("device") == std::string(zero::name_of(row.offload_optimizer)));
    CHECK(z.at("offload_param").at("device") == std::string(zero::name_of(row.offload_param)));
    CHECK(z.at("reduce_bucket_size") == 500'000'000);
    CHECK(block.at("bf16").at("enabled") == true);
    auto full = nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}})");
    full.merge_patch(block);
    const auto c = zero::config::from_json(full, {.world_size = 8});
    CHECK(c.stage() == row.stage);
    CHECK(c.zero_optimization.offload_optimizer.device == row.offload_optimizer);
    CHECK(c.zero_optimization.offload_param.device == row.offload_param);
    CHECK(c.param_dtype() == zero::dtype::bf16);
    if (row.stage == 1 || row.stage == 2) {
      CHECK(c.zero_optimization.allgather_bucket_size == 200'000'000);
    }
    if (row.offload_optimizer == offload_device::nvme) {
      CHECK(c.zero_optimization.offload_optimizer.nvme_path == "/mnt/nvme");
      CHECK(c.zero_optimization.offload_optimizer.buffer_count == 4);
      CHECK_THROWS_AS(static_cast<void>(zt::plan_config_block(row, o, "")), zero::usage_error);
    }
  }
}

TEST_CASE("estimate_options_from takes the sizes of a config") {
  const auto c = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "fp16": {"enabled": true},
      "aio": {"block_size": 4096, "queue_depth": 2}, "data_types": {"grad_accum_dtype": "fp32"},
      "zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 3000,
                            "stage3_prefetch_bucket_size": 700, "stage3_max_live_parameters": 9000,
                            "offload_optimizer": {"device": "cpu", "buffer_count": 6}}})",
                                           {.world_size = 2});
  // Two modules: 15000 + 300 + 200 and 4000 + 80500 elements; below the default threshold (1e5) all of them.
  const auto m = zt::summarize_modules({{15'000, 300, 200}, {4'000, 80'500}});
  CHECK(m.params == 100'000);
  CHECK(m.largest_layer_params == 84'500);
  CHECK(m.largest_param == 80'500);
  CHECK(m.modules == 2);
  CHECK(m.params_below(1000) == 500);
  CHECK_THROWS_AS(static_cast<void>(zt::summarize_modules({{10, 0}})), zero::usage_error);
  const auto o = zt::estimate_options_from(c, m, 2, 3);
  CHECK(o.params == 100'000);
  CHECK(o.largest_layer_params == 84'500);
  CHECK(o.largest_param_params == 80'500);
  CHECK(o.persistent_params == 100'000);
  CHECK(o.ranks() == 6);
  CHECK(o.param_dtype == zero::dtype::f16);
  CHECK(o.grad_dtype == zero::dtype::f32); // set by the config, unlike fp16's default
  CHECK(o.reduce_bucket_size == 1000);
  CHECK(o.allgather_bucket_size == 3000);
  CHECK(o.stage3_prefetch_bucket_size == 700);
  CHECK(o.stage3_max_live_parameters == 9000);
  CHECK(o.offload_optimizer_buffer_count == 6);
  CHECK(o.nvme_chunk_elements == 2048);
  // Without data_types the stage's default applies at each stage (fp32 for bf16 at stage 0 only).
  const auto d = zero::config::from_string(
      R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2}})");
  CHECK_FALSE(zt::estimate_options_from(d, zt::summarize_modules({{100}}), 1).grad_dtype);
  CHECK(zt::estimate_options_from(d, zt::summarize_modules({{100}}), 1).hpz_partition_size == 1);
}

TEST_CASE("a config's zero_hpz_partition_size is counted in the plan's stage 3 rows and carried by its block") {
  const stage3_case hpz(R"("zero_hpz_partition_size": 3)", 6);
  const auto o = zt::estimate_options_from(hpz.config, hpz.model, 3, 2);
  CHECK(o.hpz_partition_size == 3);
  auto flat = o;
  flat.hpz_partition_size = 1;
  const auto with = zt::plan_settings(o);
  const auto without = zt::plan_settings(flat);
  REQUIRE(with.size() == without.size());
  for (std::size_t i = 0; i < with.size(); ++i) {
    CAPTURE(zt::setting_name(with[i]));
    // Stage 3 keeps the rank's slice of each unit's node part: its shard x 6 / 3 x 2 bytes. The shard is the
    // engine's layout (bf16: 128-element alignment, segments of 6 x 128): the 600000 weight's segment of 600576,
    // and the persistent 600, 6000 and 60 in one of 6912, over 6 ranks 101248 (606660 / 6 = 101110 unpadded).
    CHECK(with[i].gpu_bytes_per_rank - without[i].gpu_bytes_per_rank == (with[i].stage == 3 ? 101'248 * 2 * 2 : 0));
    CHECK(with[i].host_bytes_per_node == without[i].host_bytes_per_node);
    const auto block = zt::plan_config_block(with[i], o, "/mnt/nvme");
    CHECK(block.at("zero_optimization").contains("zero_hpz_partition_size") == (with[i].stage == 3));
  }
  // A size that does not divide the ranks: the key, the ranks and what was expected.
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::estimate_options_from(hpz.config, hpz.model, 2, 2)),
                       doctest::Contains("zero_optimization.zero_hpz_partition_size 3 does not divide the 4 ranks of "
                                         "the data group; expected the ranks of a node"),
                       zero::config_error);
}

TEST_CASE("a config's mics_shard_size (HSDP): each rank holds a shard group's share; offload settings are not run") {
  const stage3_case hsdp(R"("mics_shard_size": 4)", 8);
  const auto o = zt::estimate_options_from(hsdp.config, hsdp.model, 4, 2);
  CHECK(o.mics_shard_size == 4);
  CHECK(o.shard_ranks() == 4);
  // The rows of 4 ranks without HSDP, but the offload rows, which the engine refuses with it.
  auto four = o;
  four.mics_shard_size = -1;
  four.nodes = 1;
  const auto with = zt::estimate_memory(o);
  const auto without = zt::estimate_memory(four);
  REQUIRE(with.size() == without.size());
  for (std::size_t i = 0; i < with.size(); ++i) {
    CAPTURE(with[i].stage);
    CAPTURE(zero::name_of(with[i].offload_optimizer));
    CAPTURE(zero::name_of(with[i].offload_param));
    CHECK(with[i].gpu_bytes_per_rank == without[i].gpu_bytes_per_rank);
    const bool offloaded =
        with[i].offload_optimizer != offload_device::none || with[i].offload_param != offload_device::none;
    CHECK(with[i].implemented == (with[i].stage == 0 || !offloaded));
  }
  // The plan chooses among the rows the engine runs, and its block carries the key at stages 1-3.
  for (const auto& s : zt::plan_settings(o)) {
    CAPTURE(zt::setting_name(s));
    CHECK(s.offload_optimizer == offload_device::none);
    CHECK(zt::plan_config_block(s, o, "").at("zero_optimization").contains("mics_shard_size") == (s.stage >= 1));
  }
  // Nor does a partial offload join the plan, whatever the budget.
  const zt::machine_rates gpu{.device_adamw = 1e10,
                              .host_adamw = 1e9,
                              .host_threads = 8,
                              .host_to_device = 2e10,
                              .device_to_host = 2e10,
                              .nvme_read = 1e9,
                              .nvme_write = 1e9,
                              .device = "NVIDIA H200",
                              .nvme_path = ""};
  const auto plan = zt::make_plan(o, gpu, {.device_bytes = 1, .host_bytes = std::int64_t{1} << 40});
  CHECK_FALSE(plan.ranked.empty());
  for (const auto& cand : plan.ranked) {
    CHECK(cand.row.offload_optimizer == offload_device::none);
  }
  // A size that does not divide the ranks: the key, the ranks and what was expected.
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::estimate_options_from(hsdp.config, hsdp.model, 3, 2)),
                       doctest::Contains("zero_optimization.mics_shard_size 4 does not divide the 6 ranks; expected "
                                         "the ranks of a shard group"),
                       zero::config_error);
  auto bad = o;
  bad.mics_shard_size = 3;
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::estimate_memory(bad)),
                       doctest::Contains("zero_optimization.mics_shard_size is 3; expected -1 (no HSDP) or a divisor "
                                         "of the 8 ranks"),
                       zero::usage_error);
}
