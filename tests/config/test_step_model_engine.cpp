// The step model's bytes (zero/tools/step_model.hpp) against what the engine's collectives move: 8 in-process
// ranks as 2 "nodes" of 4, bf16, 4 linear layers of 6144 elements each, every communicator counted
// (`counting_communicator`), one step after a warm-up; for stage 2, stage 3, and stage 3 with hpZ, qwZ, qgZ in
// two levels (int4) and HSDP, the bytes rank 0's ledger holds per group and collective equal the model's
// (exactly for 16-bit traffic; within 1% where scales are padded to 16 bytes per piece).

#include "zero/comm/counting_communicator.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/tools/step_model.hpp"
#include "zero/zero.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace step_model_engine {

namespace zt = zero::tools;
using counted = zero::counting_communicator<zero::thread_communicator>;

constexpr int ranks = 8, node = 4, layers = 4;
constexpr std::int64_t rows = 64, cols = 96; // 6144 elements a layer: a bucket and a gather unit each

/// Rank 0's ledger over its last step, as (group label, operation) -> bytes: sent for reduce-scatter and
/// all-to-all, received for all-gather, the count for all-reduce (the model's measure of a buffer).
std::map<std::pair<std::string, std::string>, double> step_bytes(const std::string& zero_keys, int stage) {
  std::map<std::pair<std::string, std::string>, double> out;
  std::mutex mu;
  zero::run_ranks(ranks, [&](zero::thread_communicator& raw) {
    counted world(raw);
    zero::cpu_backend backend({.threads = 1});
    zero::config_inputs in;
    in.world_size = ranks;
    const auto cfg = zero::config::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
            "zero_optimization": {"stage": )" +
            std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0, "reduce_bucket_size": 6144,
            "stage3_prefetch_bucket_size": 6144, "stage3_max_reuse_distance": 0, "zero_quantization_block_size": 256)" +
            zero_keys + "}}",
        in);
    zero::engine<zero::cpu_backend, counted> eng(cfg, world, backend);
    std::vector<int> modules;
    std::vector<zero::param_handle> params;
    for (int l = 0; l < layers; ++l) {
      modules.push_back(eng.add_module("layer" + std::to_string(l)));
      params.push_back(eng.add_param(modules.back(), "layer" + std::to_string(l) + ".w", {rows, cols}));
    }
    eng.finalize();
    eng.init_params([](const zero::param_info&, std::size_t first, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>((first + i) % 29) / 32.0F - 0.4375F;
      }
    });
    for (int step = 0; step < 2; ++step) {
      world.ledger().reset();
      for (int l = 0; l < layers; ++l) {
        auto on = eng.gather(modules[static_cast<std::size_t>(l)]);
      }
      for (int l = layers - 1; l >= 0; --l) {
        const auto li = static_cast<std::size_t>(l);
        auto on = eng.gather(modules[li]);
        auto* g = eng.grad(params[li]).as<zero::bf16>();
        for (std::size_t i = 0; i < static_cast<std::size_t>(rows * cols); ++i) {
          g[i] = zero::bf16(
              static_cast<float>(static_cast<int>((i + li + static_cast<std::size_t>(world.rank())) % 9) - 4) / 64.0F);
        }
        eng.grad_ready(params[li]);
      }
      static_cast<void>(eng.step());
    }
    if (world.rank() == 0) {
      const std::lock_guard lock(mu);
      for (const auto& [key, t] : world.ledger().entries()) {
        out[key] = static_cast<double>(key.second == "all_gather" ? t.received : t.sent);
      }
    }
  });
  return out;
}

/// The model's bytes for `s` on 2 nodes of 4, by rank 0's group labels: the data group "world" (with HSDP the
/// node, "world/0", which the engine splits off as its shard group), the node group "world/0", the cross group
/// "world/2" (the ranks of local index 0).
std::map<std::pair<std::string, std::string>, double> model_bytes(const zt::comm_setting& s) {
  zt::cluster_shape c;
  c.nodes = ranks / node;
  c.gpus_per_node = node;
  zt::step_inputs in;
  in.params = layers * rows * cols;
  in.modules = layers;
  in.kept_for_backward = rows * cols; // the last layer, kept from forward (reuse distance 0)
  in.bucket_elements = rows * cols;
  in.quant_block = 256;
  std::map<std::pair<std::string, std::string>, double> out;
  for (const auto& x : zt::step_collectives(s, in, c)) {
    const std::string group = x.group == zt::comm_group::cross            ? "world/2"
                              : x.group == zt::comm_group::node || s.hsdp ? "world/0"
                                                                          : "world";
    out[{group, x.op}] += x.bytes;
  }
  return out;
}

void check_same(const std::map<std::pair<std::string, std::string>, double>& engine,
                const std::map<std::pair<std::string, std::string>, double>& model, double tolerance) {
  for (const auto& entry : model) {
    const auto& key = entry.first;
    const double bytes = entry.second;
    INFO(key.first, " ", key.second);
    REQUIRE(engine.count(key) == 1);
    if (tolerance == 0) {
      CHECK(engine.at(key) == bytes);
    } else {
      CHECK(engine.at(key) == doctest::Approx(bytes).epsilon(tolerance));
    }
  }
  // What the model leaves out is the step's scalars: the gradient norm's and the overflow flag's all-reduces, a
  // few doubles.
  for (const auto& entry : engine) {
    const auto& key = entry.first;
    const double bytes = entry.second;
    INFO(key.first, " ", key.second, " ", bytes);
    CHECK((model.count(key) == 1 || (key.second == "all_reduce" && bytes <= 64)));
  }
}

} // namespace step_model_engine

namespace sme = step_model_engine;

TEST_CASE("step model: stage 2 and stage 3 move what the engine's collectives move") {
  sme::check_same(sme::step_bytes("", 2), sme::model_bytes({.stage = 2}), 0);
  sme::check_same(sme::step_bytes("", 3), sme::model_bytes({.stage = 3}), 0);
}

TEST_CASE("step model: hpZ, qwZ, two-level qgZ and HSDP move what the engine's collectives move") {
  sme::check_same(sme::step_bytes(R"(, "zero_hpz_partition_size": 4)", 3), sme::model_bytes({.stage = 3, .hpz = true}),
                  0);
  sme::check_same(sme::step_bytes(R"(, "zero_quantized_weights": true)", 3),
                  sme::model_bytes({.stage = 3, .qwz = true}), 0.01);
  sme::check_same(sme::step_bytes(R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 4)", 3),
                  sme::model_bytes({.stage = 3, .qgz_bits = 4}), 0.01);
  sme::check_same(sme::step_bytes(R"(, "mics_shard_size": 4)", 3), sme::model_bytes({.stage = 3, .hsdp = true}), 0);
}
