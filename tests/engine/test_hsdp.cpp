// HSDP (`mics_shard_size`, DeepSpeed's MiCS, FSDP2's hybrid sharding) on 8 in-process ranks as 2
// shard groups of 4: stages 1-3 give the parameters of the plain 8-rank run, bit for bit where every
// average is exact, and of the single-process oracle otherwise; each rank's memory is the formula at
// the shard group's size; the replica groups carry one all-reduce of the rank's gradient shard a step
// and nothing else, and the gathers stay inside the shard group (the formula of a group of 4 within 2% on
// layers of 6144 parameters); bad sizes and combinations are
// refused naming the key.

#include "engine_harness.hpp"
#include "zero/comm/counting_communicator.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace {

using zero::testing::max_rel_diff;
using zero::testing::run_spec;
using zero::testing::train_reference;
using zero::testing::train_with_engine;
using counted = zero::counting_communicator<zero::thread_communicator>;

const std::string hsdp_key = R"("mics_shard_size": 4)";

/// What rank 0 saw in the last step of an HSDP run over counted communicators.
struct hsdp_traffic {
  std::map<zero::comm_ledger::key, zero::comm_traffic> ledger; // the last step's, every group
  std::size_t shard_elements = 0;   // the rank's gradient shard (stages 1-3: its slices of the segments)
  std::size_t total_elements = 0;   // the layout's, padding included
  std::size_t segments = 0;         // the layout's (the reduce buckets)
  zero::memory_report memory;       // rank 0's
  int shard_size = 0, replicas = 0; // the groups' sizes
  int replica_rank = -1;
};

/// The traffic of `op` on `group` in `h`'s last step (every operation with `op` empty).
zero::comm_traffic traffic(const hsdp_traffic& h, const std::string& group, const std::string& op = "") {
  zero::comm_traffic t;
  for (const auto& [k, v] : h.ledger) {
    if (k.first == group && (op.empty() || k.second == op)) {
      t += v;
    }
  }
  return t;
}

hsdp_traffic train_counted(const run_spec& s) {
  hsdp_traffic out;
  std::mutex mu;
  zero::testing::with_engine_group<zero::cpu_backend>(
      s,
      [](int world, auto&& fn) {
        zero::run_ranks(world, [&](zero::thread_communicator& raw) {
          counted c(raw);
          fn(c);
        });
      },
      [](counted&) { return zero::cpu_backend({.threads = 1}); },
      [&](auto& eng, const zero::testing::model_handles& mh, counted& world) {
        zero::testing::init_model(eng);
        zero::testing::run_result r;
        r.applied_by_rank.resize(static_cast<std::size_t>(s.world));
        zero::testing::train_steps(eng, mh, world, s, 0, s.steps - 1, r);
        world.ledger().reset();
        zero::testing::train_steps(eng, mh, world, s, s.steps - 1, s.steps, r);
        if (world.rank() == 0) {
          const std::lock_guard lock(mu);
          out.ledger = world.ledger().entries();
          out.total_elements = eng.layout().total_size();
          out.segments = eng.layout().segments().size();
          for (const auto& seg : eng.layout().segments()) {
            out.shard_elements += seg.slice;
          }
          out.memory = eng.memory();
          out.shard_size = eng.communicator().size();
          out.replicas = eng.replica_group() != nullptr ? eng.replica_group()->size() : 0;
          out.replica_rank = eng.replica_group() != nullptr ? eng.replica_group()->rank() : -1;
        }
      });
  return out;
}

} // namespace

TEST_CASE("HSDP: stages 1-3 over shard groups of 4 give the plain 8-rank run's parameters, bit for bit when exact") {
  // Batch 64 on 8 ranks and no coupling to the parameters: every mean and average is exact, so an
  // average over the shard group then over the replicas equals the one over all 8 ranks.
  for (int stage : {1, 2, 3}) {
    for (int accumulation : {1, 2}) {
      run_spec s{.stage = stage, .world = 8, .accumulation = accumulation, .batch = 64, .param_coupling = 0};
      const auto plain = train_with_engine(s);
      s.zero_extra = hsdp_key;
      const auto hsdp = train_with_engine(s);
      CAPTURE(stage);
      CAPTURE(accumulation);
      CHECK(hsdp.params == plain.params);
      REQUIRE(hsdp.norms.size() == plain.norms.size());
      for (std::size_t t = 0; t < plain.norms.size(); ++t) {
        CHECK(hsdp.norms[t] == doctest::Approx(plain.norms[t]).epsilon(1e-6)); // partial norms summed in another order
      }
    }
  }
}

TEST_CASE("HSDP: with clipping, bf16 and gradients that read the parameters, the single-process oracle's parameters") {
  for (int stage : {1, 2, 3}) {
    for (zero::dtype type : {zero::dtype::f32, zero::dtype::bf16}) {
      run_spec s{.stage = stage, .world = 8, .type = type, .clip = 1.0, .zero_extra = hsdp_key};
      CAPTURE(stage);
      CAPTURE(zero::name_of(type));
      const auto got = train_with_engine(s);
      const auto want = train_reference(s);
      // The tolerances of the plain engine's equivalence test.
      CHECK(max_rel_diff(got.params, want.params) <= (type == zero::dtype::f32 ? 1e-6 : 1.0 / 256 + 0.1 * 5 * s.lr));
      for (std::size_t t = 0; t < want.norms.size(); ++t) {
        CHECK(got.norms[t] == doctest::Approx(want.norms[t]).epsilon(type == zero::dtype::f32 ? 1e-6 : 1e-2));
      }
    }
  }
}

TEST_CASE("HSDP: the replicas carry one all-reduce of the gradient shard a step; the formula at the shard size") {
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    run_spec s{.stage = stage, .world = 8, .steps = 2, .batch = 64, .zero_extra = hsdp_key};
    const auto h = train_counted(s);
    CHECK(h.shard_size == 4);
    CHECK(h.replicas == 2);
    CHECK(h.replica_rank == 0);
    // The world group is "world"; the shard groups "world/0" and "world/1", rank 0's replica group
    // (the ranks of local index 0 in each shard group) "world/2".
    CHECK(traffic(h, "world").calls == 0);
    const std::size_t e = sizeof(float); // fp32 gradients
    // Every stage all-reduces only the rank's slices (its shard) over the replicas; stage 1, which keeps
    // the whole gradient, leaves the rest of each bucket averaged over the shard group alone.
    const std::size_t reduced = h.shard_elements;
    const auto replicas = traffic(h, "world/2");
    CHECK(traffic(h, "world/2", "all_reduce").sent == reduced * e);
    CHECK(replicas == traffic(h, "world/2", "all_reduce")); // nothing else crosses the shard groups
    CHECK(replicas.calls == h.segments);                    // one per bucket
    CHECK(traffic(h, "world/0", "all_gather").calls > 0);   // the shard group gathers

    // Memory: what an engine over 4 ranks holds, against the ZeRO formula of a 4-rank group (this small
    // model's padding to the buffers' alignment keeps both above the formula alike).
    run_spec four = s;
    four.world = 4;
    four.zero_extra.clear();
    const auto plain4 = train_counted(four);
    CHECK(h.memory.world_size == 4);
    CHECK(h.memory.formula == doctest::Approx(plain4.memory.formula));
    CHECK(h.memory.model_state_peak == plain4.memory.model_state_peak);
    CHECK(h.memory.ratio() == doctest::Approx(plain4.memory.ratio()));
  }
}

TEST_CASE("HSDP: a size that does not divide the ranks, or with offload, qgZ or hpZ, is refused naming the key") {
  zero::config_inputs in;
  in.world_size = 8;
  const auto cfg = [&](const std::string& zero_keys, int stage = 2) {
    return R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": )" +
           std::to_string(stage) + ", " + zero_keys + "}}";
  };
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::config::from_string(cfg(R"("mics_shard_size": 3)"), in)),
                       doctest::Contains("zero_optimization.mics_shard_size: found 3, which does not divide the 8"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::config::from_string(cfg(R"("mics_shard_size": 0)"), in)),
                       doctest::Contains("zero_optimization.mics_shard_size: found 0"), zero::config_error);
  // Without the world size the reader cannot tell; the engine refuses when it splits.
  zero::run_ranks(8, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto c = zero::config::from_string(cfg(R"("mics_shard_size": 3)"));
    CHECK_THROWS_WITH_AS(
        (zero::engine<zero::cpu_backend, zero::thread_communicator>(c, comm, backend)),
        doctest::Contains("zero_optimization.mics_shard_size 3 does not divide the 8 data-parallel ranks; expected the "
                          "ranks of a shard group, a divisor of 8"),
        zero::config_error);
  });
  for (const auto& refused :
       {std::tuple{std::string(R"("mics_shard_size": 4, "offload_optimizer": {"device": "cpu"})"), 2, "with offload"},
        std::tuple{std::string(R"("mics_shard_size": 4, "zero_quantized_gradients": true)"), 2,
                   "with zero_quantized_gradients"},
        std::tuple{std::string(R"("mics_shard_size": 4, "zero_hpz_partition_size": 2)"), 3,
                   "with zero_hpz_partition_size"}}) {
    const std::string& keys = std::get<0>(refused);
    CAPTURE(keys);
    const std::string named = std::string("zero_optimization.mics_shard_size 4 ") + std::get<2>(refused);
    zero::run_ranks(8, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      const auto c = zero::config::from_string(cfg(keys, std::get<1>(refused)), in);
      CHECK_THROWS_WITH_AS((zero::engine<zero::cpu_backend, zero::thread_communicator>(c, comm, backend)),
                           doctest::Contains(named.c_str()), zero::config_error);
    });
  }
}

TEST_CASE("HSDP: on layers of 6144 parameters each rank's model state is the formula of its shard group, within 2%") {
  // The harness's model is small enough that its padding to the buffers' alignment keeps an engine above
  // the formula; 4 layers of 64 x 96 bf16 parameters show the formula itself.
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    zero::memory_report rank0;
    std::mutex mu;
    zero::run_ranks(8, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      zero::config_inputs in;
      in.world_size = 8;
      const auto cfg = zero::config::from_string(
          R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
              "zero_optimization": {"stage": )" +
              std::to_string(stage) + R"(, "mics_shard_size": 4, "stage3_param_persistence_threshold": 0,
              "reduce_bucket_size": 6144}})",
          in);
      zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
      std::vector<int> modules;
      std::vector<zero::param_handle> params;
      for (int l = 0; l < 4; ++l) {
        modules.push_back(eng.add_module("layer" + std::to_string(l)));
        params.push_back(eng.add_param(modules.back(), "layer" + std::to_string(l) + ".w", {64, 96}));
      }
      eng.finalize();
      eng.init_params([](const zero::param_info&, std::size_t first, std::span<float> v) {
        for (std::size_t i = 0; i < v.size(); ++i) {
          v[i] = static_cast<float>((first + i) % 17) / 32.0F - 0.25F;
        }
      });
      for (int step = 0; step < 2; ++step) {
        for (int l = 3; l >= 0; --l) {
          const auto li = static_cast<std::size_t>(l);
          auto on = eng.gather(modules[li]);
          auto* g = eng.grad(params[li]).as<zero::bf16>();
          for (std::size_t i = 0; i < 64 * 96; ++i) {
            g[i] = zero::bf16(
                static_cast<float>(static_cast<int>((i + li + static_cast<std::size_t>(comm.rank())) % 9) - 4) / 64.0F);
          }
          eng.grad_ready(params[li]);
        }
        static_cast<void>(eng.step());
      }
      if (comm.rank() == 0) {
        const std::lock_guard lock(mu);
        rank0 = eng.memory();
      }
    });
    CHECK(rank0.world_size == 4);
    CHECK(rank0.ratio() == doctest::Approx(1.0).epsilon(0.02));
  }
}
