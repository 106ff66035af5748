// The step plans (include/zero/engine/step/), one spec each, through the engine that chooses them: which plan a
// placement makes, what it tells the reducer (streams, kept), whether the host steps beside the next forward, what
// it adds to the memory report, and one AdamW step worked out by hand. The model is one fp32 tensor of 1024
// elements on one rank at stage 2 (one segment, the whole shard), initialised to 1 with every gradient 0.5; AdamW
// with lr 0.1, betas (0.9, 0.999), eps 1e-8 and no weight decay moves every element by
//     lr * m^ / (sqrt(v^) + eps) = 0.1 * 0.5 / (0.5 + 1e-8),   m^ = g = 0.5,   v^ = g^2 = 0.25,
// so each ends at 0.9 (to fp32's rounding), whichever plan stepped it.

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

#include <algorithm>
#include <cstddef>
#include <doctest/doctest.h>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace {

using plan_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;
constexpr std::size_t n = 1024;

/// One rank, `offload` inside zero_optimization (after the stage); `check(eng)` after one applied step whose every
/// parameter must have moved from 1 to 0.9.
void with_one_step(const std::string& offload, const std::function<void(plan_engine&)>& check) {
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto cfg = zero::config::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.1,
            "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}}, "zero_optimization": {"stage": 2)" +
            offload + "}}",
        zero::config_inputs{.world_size = 1});
    plan_engine eng(cfg, comm, backend);
    eng.set_offload_threads(1);
    const auto w = eng.add_param(eng.add_module("m"), "w", {static_cast<std::int64_t>(n)});
    eng.finalize();
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
    {
      auto on = eng.gather(0);
      auto g = eng.grad(w);
      std::fill_n(g.as<float>(), n, 0.5f);
      eng.grad_ready(w);
    }
    const auto r = eng.step();
    CHECK(r.applied);
    CHECK(r.grad_norm == doctest::Approx(0.5 * 32.0)); // sqrt(1024 x 0.25)
    {
      auto on = eng.gather(0);
      const float* p = eng.param(w).as<float>();
      CHECK(std::all_of(p, p + n, [](float x) { return x == doctest::Approx(0.9).epsilon(1e-6); }));
    }
    check(eng);
  });
}

} // namespace

TEST_CASE("device_plan: the state in backend memory, the gradients kept by the reducer, nothing on the host") {
  with_one_step("", [](plan_engine& eng) {
    auto& plan = eng.optimizer();
    CHECK(plan.device() != nullptr);
    CHECK_FALSE(plan.offloaded());
    CHECK_FALSE(plan.streams());
    CHECK(plan.kept().empty());
    CHECK_FALSE(plan.steps_async());
    const auto m = eng.memory();
    CHECK(m.optimizer_peak == 2 * n * sizeof(float)); // m and v; fp32 parameters are their own master
    CHECK(m.host_optimizer == 0);
    CHECK(m.host_grads == 0);
  });
}

TEST_CASE("host_plan: the state in host memory, each reduced slice streamed to the host during backward") {
  with_one_step(R"(, "offload_optimizer": {"device": "cpu"})", [](plan_engine& eng) {
    auto& plan = eng.optimizer();
    CHECK(plan.host() != nullptr);
    CHECK(plan.host_part() == plan.host());
    CHECK(plan.streams()); // stage 2: the reducer is the plan's sink
    CHECK(plan.kept().empty());
    CHECK_FALSE(plan.steps_async());
    const auto m = eng.memory();
    CHECK(m.optimizer_peak == 0);
    CHECK(m.host_optimizer == 2 * n * sizeof(float)); // m and v on the host
    CHECK(m.host_grads == n * sizeof(float));         // the host's copy of the gradient shard
  });
  // Beside the next forward: the host's AdamW runs on its thread after step() returns.
  with_one_step(R"(, "offload_optimizer": {"device": "cpu", "forward_overlap": true})", [](plan_engine& eng) {
    CHECK(eng.optimizer().steps_async());
    CHECK(eng.optimizer().host()->async_steps() == 1);
  });
}

TEST_CASE("split_plan: half the state on the device, half on the host; the host half streams beside the forward") {
  with_one_step(R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5})", [](plan_engine& eng) {
    auto& plan = eng.optimizer();
    REQUIRE(plan.partial() != nullptr);
    CHECK(plan.partial()->split() == n / 2);
    CHECK(plan.host_part() == &plan.partial()->host());
    CHECK_FALSE(plan.streams()); // without forward_overlap both halves read the reducer's slice at the step
    CHECK_FALSE(plan.steps_async());
    const auto m = eng.memory();
    CHECK(m.optimizer_peak == 2 * (n / 2) * sizeof(float));
    CHECK(m.host_optimizer == 2 * (n / 2) * sizeof(float));
    CHECK(m.host_grads == (n / 2) * sizeof(float)); // the host half's gradients, copied over as the step begins
  });
  with_one_step(R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5, "forward_overlap": true})",
                [](plan_engine& eng) {
                  auto& plan = eng.optimizer();
                  CHECK(plan.streams());
                  CHECK(plan.kept() == std::vector<std::size_t>{n / 2}); // the device half of the one segment
                  CHECK(plan.steps_async());
                  CHECK(eng.memory().host_grads == (n / 2) * sizeof(float));
                });
}

TEST_CASE("nvme_plan: the state in a file, streamed through host buffers; the step's writes agreed on") {
  const auto dir = std::filesystem::temp_directory_path() / "zero_spec_step_plans";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  with_one_step(R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.string() + R"("})",
                [](plan_engine& eng) {
                  auto& plan = eng.optimizer();
                  REQUIRE(plan.nvme() != nullptr);
                  CHECK(plan.host_part() == nullptr);
                  CHECK(plan.streams());
                  CHECK_FALSE(plan.steps_async());
                  const auto m = eng.memory();
                  CHECK(m.optimizer_peak == 0);
                  CHECK(m.host_grads == n * sizeof(float));
                  CHECK(std::filesystem::exists(plan.nvme()->path()));
                });
  std::filesystem::remove_all(dir);
}

TEST_CASE("step_plan: before finalize there is no plan, and the engine says so") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto cfg = zero::config::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
            "zero_optimization": {"stage": 2}})",
        zero::config_inputs{.world_size = 1});
    plan_engine eng(cfg, comm, backend);
    CHECK_THROWS_WITH_AS((void)eng.optimizer(), doctest::Contains("optimizer before finalize()"), zero::usage_error);
  });
}
