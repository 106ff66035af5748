// ZeRO-Offload of the optimizer (`offload_optimizer.device: cpu`): the same bits as the in-memory
// optimizer, its state in host memory and the device holding none of it.

#include "engine_harness.hpp"

#include <doctest/doctest.h>

using zero::dtype;
using zero::testing::run_spec;
using zero::testing::train_with_engine;

namespace {

constexpr const char* offload_cpu = R"("offload_optimizer": {"device": "cpu"})";

void check_same_run(const zero::testing::run_result& got, const zero::testing::run_result& want) {
  CHECK(got.params == want.params);
  CHECK(got.norms == want.norms);
  CHECK(got.applied == want.applied);
  CHECK(got.scales == want.scales);
}

} // namespace

TEST_CASE("offload_optimizer cpu trains to the bits of the in-memory optimizer at stages 1-3") {
  struct shape {
    int accumulation;
    double clip;
  };
  for (int stage : {1, 2, 3}) {
    for (int world : {1, 2, 3}) {
      for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
        for (shape sh : {shape{1, 0.0}, shape{2, 1.0}}) {
          CAPTURE(stage);
          CAPTURE(world);
          CAPTURE(zero::name_of(type));
          CAPTURE(sh.accumulation);
          CAPTURE(sh.clip);
          run_spec s{.stage = stage, .world = world, .type = type, .accumulation = sh.accumulation, .clip = sh.clip};
          const auto want = train_with_engine(s);
          s.zero_extra = offload_cpu;
          check_same_run(train_with_engine(s), want);
        }
      }
    }
  }
}

TEST_CASE("an fp16 overflow skips the offloaded step on every rank, as in memory") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    run_spec s{.stage = stage, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
    const auto want = train_with_engine(s);
    s.zero_extra = offload_cpu;
    const auto got = train_with_engine(s);
    check_same_run(got, want);
    CHECK_FALSE(got.applied[2]);
  }
}

TEST_CASE("offloaded state lives in host memory: none on the device, the host at the formula") {
  // A model big enough that padding is a small part of it: 3 x 100 000 bf16 parameters on 2 ranks.
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    std::vector<zero::memory_report> reports(2);
    zero::run_ranks(2, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      auto cfg = zero::config::from_string(R"({"train_batch_size": 2, "bf16": {"enabled": true},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
          "zero_optimization": {"stage": )" +
                                           std::to_string(stage) + R"(, "offload_optimizer": {"device": "cpu"}}})");
      zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
      std::vector<zero::param_handle> ps;
      for (int k = 0; k < 3; ++k) {
        const int m = eng.add_module("m" + std::to_string(k));
        ps.push_back(eng.add_param(m, "w" + std::to_string(k), {100, 1000}));
      }
      eng.finalize();
      CHECK(eng.optimizer().offloaded());
      eng.init_params(
          [](const zero::param_info&, std::size_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.5f); });
      for (std::size_t k = 0; k < ps.size(); ++k) {
        auto on = eng.gather(static_cast<int>(k));
        eng.grad_ready(ps[k]);
      }
      CHECK(eng.step().applied);
      reports[static_cast<std::size_t>(comm.rank())] = eng.memory();
    });
    for (const auto& r : reports) {
      CHECK(r.optimizer == 0);
      CHECK(r.optimizer_peak == 0);
      // Host: fp32 master, m, v (12 B) and the bf16 gradient and parameter shards (2 + 2 B).
      CHECK(r.host_optimizer == 12 * (r.parameters + r.padding) / 2);
      CHECK(r.host_grads == 2 * (r.parameters + r.padding) / 2);
      CHECK(r.host_params == 2 * (r.parameters + r.padding) / 2);
      CHECK(static_cast<double>(r.host_peak) == doctest::Approx(r.host_formula).epsilon(0.02));
      CHECK(static_cast<double>(r.model_state_peak) == doctest::Approx(r.formula).epsilon(0.02));
      CHECK(r.table().find("offloaded to host") != std::string::npos);
    }
  }
}

TEST_CASE("parameter offload is refused by the engine, naming the key; optimizer offload is accepted") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    auto cfg = zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    CHECK_THROWS_WITH_AS(eng_t(cfg, comm, backend), doctest::Contains("zero_optimization.offload_param.device"),
                         zero::config_error);
  });
}
