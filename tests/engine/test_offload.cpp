// ZeRO-Offload of the optimizer (`offload_optimizer.device: cpu`): the same bits as the in-memory
// optimizer, its state in host memory and the device holding none of it.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "wide_step.hpp"

#include <array>
#include <doctest/doctest.h>

using zero::dtype;
using zero::testing::check_same_run;
using zero::testing::for_each_training_shape;
using zero::testing::run_spec;
using zero::testing::step_a_wide_model;
using zero::testing::train_with_engine;

namespace {

constexpr const char* offload_cpu = R"("offload_optimizer": {"device": "cpu"})";
// Partial offload: that share of each rank's optimizer state on the host, the rest on the device.
constexpr const char* offload_03 = R"("offload_optimizer": {"device": "cpu", "ratio": 0.3})";
constexpr const char* offload_07 = R"("offload_optimizer": {"device": "cpu", "ratio": 0.7})";

} // namespace

TEST_CASE("offload_optimizer cpu, whole or partial (ratio 0.3, 0.7), trains to the bits of the in-memory optimizer "
          "at stages 1-3") {
  for_each_training_shape({1, 2, 3}, [](run_spec s) {
    const auto want = train_with_engine(s);
    for (const char* extra : {offload_cpu, offload_03, offload_07}) {
      CAPTURE(extra);
      s.zero_extra = extra;
      check_same_run(train_with_engine(s), want);
    }
  });
}

TEST_CASE("an fp16 overflow skips the offloaded step on every rank, as in memory") {
  for (int stage : {1, 2, 3}) {
    for (const char* extra : {offload_cpu, offload_03}) {
      CAPTURE(stage);
      CAPTURE(extra);
      run_spec s{.stage = stage, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
      const auto want = train_with_engine(s);
      s.zero_extra = extra;
      const auto got = train_with_engine(s);
      check_same_run(got, want);
      CHECK_FALSE(got.applied[2]);
    }
  }
}

TEST_CASE("offloaded state lives in host memory: none on the device, nor at stages 2-3 a gradient shard; the host "
          "at the formula") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const auto run = step_a_wide_model(R"("stage": )" + std::to_string(stage) + ", " + offload_cpu);
    CHECK(run.offloaded == std::array<bool, 2>{true, true});
    for (const auto& r : run.reports) {
      CHECK(r.optimizer == 0);
      CHECK(r.optimizer_peak == 0);
      // Stage 1 accumulates the whole model's bf16 gradients on the device; stages 2-3 stream each
      // bucket's reduced slice to the host during backward and keep none.
      CHECK(r.grads_peak == (stage == 1 ? 2 * (r.parameters + r.padding) : 0));
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

TEST_CASE("parameter offload to the cpu is accepted at stage 3; the engine refuses it elsewhere, naming the key") {
  // Before parameter offload ran, the engine refused offload_param.device "cpu" here.
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    auto cfg = zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    CHECK_NOTHROW(eng_t(cfg, comm, backend));
    // What the reader refuses, in a config built in code: the engine refuses it too.
    cfg.zero_optimization.offload_param.device = zero::offload_device::nvme;
    CHECK_THROWS_WITH_AS(eng_t(cfg, comm, backend),
                         doctest::Contains("zero_optimization.offload_param.nvme_path: missing; device \"nvme\""),
                         zero::config_error);
    cfg.zero_optimization.offload_param.device = zero::offload_device::cpu;
    cfg.zero_optimization.stage = 2;
    CHECK_THROWS_WITH_AS(eng_t(cfg, comm, backend),
                         doctest::Contains("offload_param.device: found \"cpu\", but offload_param needs ZeRO stage 3 "
                                           "and zero_optimization.stage is 2"),
                         zero::config_error);
  });
}

// ---- parameter offload (offload_param.device: cpu, stage 3) ----

namespace {

constexpr const char* offload_params = R"("offload_param": {"device": "cpu"})";
constexpr const char* offload_both = R"("offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"})";
constexpr const char* offload_both_partial =
    R"("offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu", "ratio": 0.5})";

} // namespace

TEST_CASE("offload_param cpu trains to the bits of the in-memory engine, with and without offload_optimizer") {
  struct shape {
    int accumulation;
    double clip;
    std::int64_t persistence; // 40: the biases stay whole on the device; 0: nothing does
  };
  for (int world : {1, 2, 3}) {
    for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
      for (shape sh : {shape{1, 0.0, 40}, shape{2, 1.0, 40}, shape{2, 1.0, 0}}) {
        CAPTURE(world);
        CAPTURE(zero::name_of(type));
        CAPTURE(sh.accumulation);
        CAPTURE(sh.persistence);
        run_spec s{.stage = 3,
                   .world = world,
                   .type = type,
                   .accumulation = sh.accumulation,
                   .clip = sh.clip,
                   .persistence_threshold = sh.persistence};
        const auto want = train_with_engine(s);
        for (const char* extra : {offload_params, offload_both, offload_both_partial}) {
          CAPTURE(extra);
          s.zero_extra = extra;
          check_same_run(train_with_engine(s), want);
        }
      }
    }
  }
}

TEST_CASE("with offloaded parameters an fp16 overflow skips the step on every rank, as in memory") {
  run_spec s{.stage = 3, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
  const auto want = train_with_engine(s);
  for (const char* extra : {offload_params, offload_both}) {
    CAPTURE(extra);
    s.zero_extra = extra;
    const auto got = train_with_engine(s);
    check_same_run(got, want);
    CHECK_FALSE(got.applied[2]);
  }
}

TEST_CASE("offloaded parameters: no shard on the device, the host at the formula") {
  // 3 x 100 000 bf16 parameters on 2 ranks, nothing persistent: the device holds no parameter between
  // uses; gathered units are the working set, counted apart.
  for (const bool with_optimizer : {false, true}) {
    CAPTURE(with_optimizer);
    const auto run = step_a_wide_model(R"("stage": 3, "stage3_param_persistence_threshold": 0, )" +
                                       std::string(with_optimizer ? offload_both : offload_params));
    CHECK(run.offloaded == std::array<bool, 2>{with_optimizer, with_optimizer});
    for (std::size_t rank = 0; rank < run.reports.size(); ++rank) {
      const auto& r = run.reports[rank];
      const std::size_t shard = (r.parameters + r.padding) / 2;
      CHECK(r.params == 0);
      CHECK(r.params_peak == 0);
      CHECK(r.working_set_peak > 0);
      // The bf16 shard (2 B) in host memory; with the optimizer too, its state (12 B) and its gradient
      // shard (2 B): the host AdamW updates the shard in place, with no staging copy of it.
      CHECK(run.shard_host[rank] == 2 * shard);
      CHECK(r.host_params == 2 * shard);
      CHECK(r.host_grads == (with_optimizer ? 2 : 0) * shard);
      CHECK(r.host_optimizer == (with_optimizer ? 12 : 0) * shard);
      const double psi_n = static_cast<double>(r.parameters) / 2;
      CHECK(r.host_formula == doctest::Approx((with_optimizer ? 16 : 2) * psi_n));
      // With the optimizer offloaded the device keeps no model state at all: gradients stream to the host.
      CHECK(r.grads_peak == (with_optimizer ? 0 : 2 * shard));
      CHECK(r.formula == doctest::Approx((with_optimizer ? 0 : 14) * psi_n));
      CHECK(static_cast<double>(r.host_peak) == doctest::Approx(r.host_formula).epsilon(0.02));
      CHECK(static_cast<double>(r.model_state_peak) == doctest::Approx(r.formula).epsilon(0.02));
      CHECK(r.table().find("offloaded to host") != std::string::npos);
    }
  }
}

namespace {

/// What a run with scopes saw: the whole parameters each evaluation pass read on rank 0, and the
/// result of training on after a gather_all(last rank) in which the last rank changed one value.
struct scoped_run {
  zero::testing::run_result trained;
  std::vector<std::vector<float>> seen;
};

scoped_run train_with_scopes(const run_spec& s) {
  namespace zt = zero::testing;
  scoped_run out;
  out.trained.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  zt::with_cpu_engines(s, [&](auto& eng, const zt::model_handles& mh, auto& comm) {
    const auto model = zt::small_model();
    zt::train_steps(eng, mh, comm, s, 0, 2, out.trained);
    for (const auto mode : {zero::eval_gather::per_module, zero::eval_gather::whole_model}) {
      auto ev = eng.evaluation(mode);
      std::vector<float> seen;
      for (std::size_t m = 0; m < mh.modules.size(); ++m) {
        auto on = eng.gather(mh.modules[m]);
        for (std::size_t k = 0; k < model.size(); ++k) {
          if (static_cast<std::size_t>(model[k].module) == m) {
            const auto v = eng.param(mh.params[k]);
            zero::visit_float(v.type, [&]<class P>(zero::type_tag<P>) {
              for (std::size_t i = 0; i < v.numel; ++i) {
                seen.push_back(zero::to_float(v.template as<P>()[i]));
              }
            });
          }
        }
      }
      if (comm.rank() == 0) {
        out.seen.push_back(std::move(seen));
      }
    }
    {
      auto all = eng.gather_all(/*modifier_rank=*/s.world - 1);
      const auto v = eng.param(mh.params[2]); // fc2.weight
      zero::visit_float(v.type, [&]<class P>(zero::type_tag<P>) {
        v.template as<P>()[3] = zero::from_float<P>(comm.rank() == s.world - 1 ? 0.75f : -2.0f);
      });
    }
    zt::train_steps(eng, mh, comm, s, 2, s.steps, out.trained);
    zt::collect_params(eng, mh, comm, out.trained);
  });
  return out;
}

} // namespace

TEST_CASE("offloaded parameters: evaluation scopes and gather_all with a modifier rank as in memory") {
  for (int world : {1, 2, 3}) {
    for (dtype type : {dtype::f32, dtype::bf16}) {
      CAPTURE(world);
      CAPTURE(zero::name_of(type));
      run_spec s{.stage = 3, .world = world, .type = type, .steps = 4};
      const auto want = train_with_scopes(s);
      REQUIRE(want.seen.size() == 2);
      CHECK(want.seen[0] == want.seen[1]);
      for (const char* extra : {offload_params, offload_both, offload_both_partial}) {
        CAPTURE(extra);
        s.zero_extra = extra;
        const auto got = train_with_scopes(s);
        CHECK(got.seen == want.seen);
        check_same_run(got.trained, want.trained);
      }
    }
  }
}

TEST_CASE("offload_param cpu: the reader notes the NVMe-only keys and nothing about a refusal") {
  const auto cfg = zero::config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
      "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 4, "buffer_size": 1000,
                        "max_in_cpu": 5000}}})");
  CHECK(cfg.zero_optimization.offload_param.device == zero::offload_device::cpu);
  std::string notes;
  for (const auto& n : cfg.notes) {
    notes += n + "\n";
  }
  CAPTURE(notes);
  for (const char* key : {"buffer_count", "buffer_size", "max_in_cpu"}) {
    CHECK(notes.find(std::string("zero_optimization.offload_param.") + key + ": no effect: device is cpu, not nvme") !=
          std::string::npos);
  }
  CHECK(notes.find("refuses") == std::string::npos);
  CHECK(notes.find("offload_param.device") == std::string::npos);
}
