// The engine's contract beyond the arithmetic: unused and frozen parameters, parameter groups,
// wall-clock logging, and refusals of settings or calls it cannot honour.

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"

#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace {
using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;

zero::config make_config(int world, const std::string& extra_zero, const std::string& top = "") {
  zero::config_inputs in;
  in.world_size = world;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, )" + top +
                                       R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.5}},
                                          "zero_optimization": {)" +
                                       extra_zero + "}}",
                                   in);
}
} // namespace

TEST_CASE("a parameter without a gradient is named in an error unless ignore_unused_parameters") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto cfg = make_config(2, "\"stage\": " + std::to_string(stage) + ", \"ignore_unused_parameters\": false");
    CHECK_THROWS_WITH_AS(zero::run_ranks(2,
                                         [&](zero::thread_communicator& comm) {
                                           zero::cpu_backend backend({.threads = 1});
                                           eng_t eng(cfg, comm, backend);
                                           const int m = eng.add_module("m");
                                           auto used = eng.add_param(m, "used", {8});
                                           eng.add_param(m, "never.used", {8});
                                           eng.finalize();
                                           auto on = eng.gather(m);
                                           eng.grad_ready(used);
                                           (void)eng.step();
                                         }),
                         doctest::Contains("\"never.used\""), zero::usage_error);
  }
}

TEST_CASE("frozen parameters get no gradient and no optimizer state; groups keep their own weight decay") {
  zero::run_ranks(2, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    eng_t eng(make_config(2, "\"stage\": 1"), comm, backend);
    const int m = eng.add_module("m");
    auto w = eng.add_param(m, "w", {64});
    auto frozen = eng.add_param(m, "embedding.frozen", {1000}, {.trainable = false});
    auto nodecay = eng.add_param(m, "norm.weight", {64}, {.weight_decay = 0.0});
    eng.finalize();
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 1.0f); });
    // Optimizer state covers the 128 trainable elements (padded), never the 1000 frozen ones.
    CHECK(eng.memory().optimizer < 1000 * 12 / 2);
    CHECK(eng.param(frozen).numel == 1000);
    CHECK(static_cast<float>(eng.param(frozen).as<zero::bf16>()[999]) == 1.0f);
    CHECK_THROWS_WITH_AS((void)eng.grad(frozen),
                         doctest::Contains("grad(\"embedding.frozen\"): the parameter is frozen"), zero::usage_error);
    CHECK_THROWS_AS(eng.grad_ready(frozen), zero::usage_error);
    // Zero gradients: only weight decay moves the parameters, and only those of the decaying group.
    eng.grad_ready(nodecay);
    eng.grad_ready(w);
    CHECK(eng.step().applied);
    CHECK(static_cast<float>(eng.param(w).as<zero::bf16>()[0]) < 1.0f);
    CHECK(static_cast<float>(eng.param(nodecay).as<zero::bf16>()[0]) == 1.0f);
    CHECK(static_cast<float>(eng.param(frozen).as<zero::bf16>()[0]) == 1.0f);
    // Stepping one segment (what the engine's update stream does): a segment that does not exist is
    // refused, naming it and how many there are.
    auto& opt = *eng.optimizer().device();
    const std::size_t owned = 1000;
    const std::string named = "segment 1000 does not exist; the layout has";
    std::byte never_read[4]{};
    CHECK_THROWS_WITH_AS(opt.step_range(
                             owned, eng.stream(), zero::adamw_step_args{}, [](double lr) { return lr; },
                             [&](const zero::flat_range&, std::size_t) { return never_read; }),
                         doctest::Contains(named.c_str()), zero::usage_error);
  });
}

TEST_CASE("wall_clock_breakdown logs per-phase times every steps_per_print steps") {
  std::vector<std::string> lines;
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    eng_t eng(make_config(1, "\"stage\": 2", R"("wall_clock_breakdown": true, "steps_per_print": 2,)"), comm, backend);
    eng.set_log([&](const std::string& l) { lines.push_back(l); });
    const int m = eng.add_module("m");
    auto w = eng.add_param(m, "w", {64});
    eng.finalize();
    for (int step = 0; step < 4; ++step) {
      { auto t = eng.time("forward"); }
      eng.grad_ready(w);
      (void)eng.step();
    }
  });
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].find("step 2") != std::string::npos);
  CHECK(lines[0].find("forward") != std::string::npos);
  CHECK(lines[0].find("reduce") != std::string::npos);
  CHECK(lines[0].find("step ") != std::string::npos);
}

TEST_CASE("the engine refuses what it cannot honour, by name") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    zero::config_inputs in;
    in.world_size = 1;
    const auto no_optimizer = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1})", in);
    CHECK_THROWS_WITH_AS(eng_t(no_optimizer, comm, backend),
                         doctest::Contains("optimizer: missing; the engine runs the Adam or AdamW that the config's "
                                           "optimizer block describes and takes no optimizer from the framework"),
                         zero::config_error);
    eng_t eng(make_config(1, "\"stage\": 2"), comm, backend);
    CHECK_THROWS_WITH_AS(eng.finalize(), doctest::Contains("no parameters were registered"), zero::usage_error);
  });
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    eng_t eng(make_config(1, "\"stage\": 2"), comm, backend);
    const int m = eng.add_module("m");
    auto w = eng.add_param(m, "w", {4, 4});
    CHECK_THROWS_WITH_AS((void)eng.param(w), doctest::Contains("before finalize()"), zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.add_param(m, "w", {4}), doctest::Contains("\"w\" is already registered"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.add_param(7, "x", {4}), doctest::Contains("module id 7"), zero::usage_error);
    eng.finalize();
    CHECK_THROWS_WITH_AS(eng.add_param(m, "late", {4}), doctest::Contains("after finalize()"), zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.release(m), doctest::Contains("without a matching gather"), zero::usage_error);
    eng.grad_ready(w);
    CHECK_THROWS_WITH_AS(eng.grad_ready(w), doctest::Contains("called twice"), zero::usage_error);
  });
}

TEST_CASE("copy_to_floats and add_floats convert a 16-bit view to fp32 and add fp32 into it, each sum rounded once") {
  std::vector<zero::bf16> store = {zero::from_float<zero::bf16>(1.0f), zero::from_float<zero::bf16>(-2.5f),
                                   zero::from_float<zero::bf16>(256.0f)};
  const std::vector<std::int64_t> shape = {3};
  const zero::tensor_view v{store.data(), zero::dtype::bf16, shape, store.size()};
  std::vector<float> f(3);
  zero::copy_to_floats(v, f);
  CHECK(f == std::vector<float>{1.0f, -2.5f, 256.0f});
  // 256 + 1 rounds to 256 in bf16 (8 bits of mantissa); 1 + 0.5 is exact.
  zero::add_floats(v, std::vector<float>{0.5f, 0.25f, 1.0f});
  CHECK(zero::to_float(store[0]) == 1.5f);
  CHECK(zero::to_float(store[1]) == -2.25f);
  CHECK(zero::to_float(store[2]) == 256.0f);
  std::vector<float> small(2);
  CHECK_THROWS_WITH_AS(zero::copy_to_floats(v, small), doctest::Contains("2 floats for a tensor of 3"),
                       zero::usage_error);
  CHECK_THROWS_AS(zero::add_floats(v, small), zero::usage_error);
}
