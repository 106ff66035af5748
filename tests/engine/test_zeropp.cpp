// ZeRO++ at stage 3 on 8 in-process ranks as 2 "nodes" of 4, every communicator counted
// (`counting_communicator`). hpZ (`zero_hpz_partition_size`): backward's all-gathers run over the node
// group from the secondary partition, none over the whole group; the weights are those of the same
// run without hpZ, bit for bit; each rank's model state is the formula plus the secondary partition,
// P psi / 4. qwZ (`zero_quantized_weights`): the gathers over the whole group carry int8 codes and
// block scales, half the bytes, and forward sees exactly the reference's dequantized weights.

#include "zero/backend/quantize.hpp"
#include "zero/comm/counting_communicator.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/zero.hpp"

#include <cmath>
#include <cstddef>
#include <doctest/doctest.h>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

namespace {

using hpz_comm = zero::counting_communicator<zero::thread_communicator>;
using hpz_engine = zero::engine<zero::cpu_backend, hpz_comm>;

constexpr int hpz_layers = 4;
constexpr std::int64_t hpz_rows = 64, hpz_cols = 96; // 6144 elements a layer
constexpr int hpz_steps = 3;

zero::config hpz_config(int ranks, const std::string& zero_keys, int stage = 3) {
  zero::config_inputs in;
  in.world_size = ranks;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0,
      "bf16": {"enabled": true},
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
      "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0,
          "stage3_prefetch_bucket_size": 6144, "stage3_max_reuse_distance": 0)" +
                                       zero_keys + "}}",
                                   in);
}

struct hpz_run {
  std::vector<std::vector<float>> weights;              // rank 0's layers after training
  zero::comm_traffic world, node;                       // the last step's all-gathers on rank 0, by group
  zero::gather_stats stats;                             // the last step's, rank 0
  zero::memory_report memory;                           // rank 0
  std::vector<float> forward0, backward0;               // layer 0 as the first step's forward and backward saw it
  zero::comm_traffic reduce_scatter, all_to_all;        // the last step's gradient reductions, rank 0
  zero::comm_traffic node_all_to_all, cross_all_to_all; // two-level qgZ's, on rank 0's node and cross groups
  std::vector<double> norms;                            // every step's gradient norm
  std::vector<bool> applied;                            // every step's
};

/// A layer's bf16 values as floats.
std::vector<float> hpz_floats(const zero::bf16* w) {
  std::vector<float> v(static_cast<std::size_t>(hpz_rows * hpz_cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(w[i]);
  }
  return v;
}

/// Layer 0's values as `init_params` below sets them (multiples of 1/32: exact in bf16).
std::vector<float> hpz_initial_layer0() {
  std::vector<float> v(static_cast<std::size_t>(hpz_rows * hpz_cols));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>((i + std::string("layer0.w").size() * 5) % 29) / 32.0F - 0.4375F;
  }
  return v;
}

/// Trains `hpz_layers` linear layers on 8 ranks: forward gathers them in order, backward in reverse
/// and adds a gradient that depends on the rank, the step and the layer. One layer is prefetched and
/// none is kept from forward for backward but the last (reuse distance 0), so of a step's 7 gathers
/// 4 are forward's and 3 backward's.
hpz_run hpz_train(const std::string& zero_keys, int stage = 3, int inf_step = -1) {
  hpz_run out;
  std::mutex mu;
  zero::run_ranks(8, [&](zero::thread_communicator& raw) {
    hpz_comm world(raw);
    zero::cpu_backend backend({.threads = 1});
    hpz_engine eng(hpz_config(8, zero_keys, stage), world, backend);
    std::vector<int> modules;
    std::vector<zero::param_handle> params;
    for (int l = 0; l < hpz_layers; ++l) {
      modules.push_back(eng.add_module("layer" + std::to_string(l)));
      params.push_back(eng.add_param(modules.back(), "layer" + std::to_string(l) + ".w", {hpz_rows, hpz_cols}));
    }
    eng.finalize();
    eng.init_params([](const zero::param_info& p, std::size_t first, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        v[i] = static_cast<float>((first + i + p.name.size() * 5) % 29) / 32.0F - 0.4375F;
      }
    });
    for (int step = 0; step < hpz_steps; ++step) {
      world.ledger().reset();
      std::vector<float> sums(static_cast<std::size_t>(hpz_layers));
      for (int l = 0; l < hpz_layers; ++l) {
        auto on = eng.gather(modules[static_cast<std::size_t>(l)]);
        const auto* w = eng.param(params[static_cast<std::size_t>(l)]).as<zero::bf16>();
        sums[static_cast<std::size_t>(l)] = static_cast<float>(w[static_cast<std::size_t>(step * 7 + l)]);
        if (step == 0 && l == 0 && world.rank() == 0) {
          out.forward0 = hpz_floats(w);
        }
      }
      for (int l = hpz_layers - 1; l >= 0; --l) {
        const auto li = static_cast<std::size_t>(l);
        auto on = eng.gather(modules[li]);
        // The gradient reads every element backward gathered, as a linear layer's input gradient would.
        const auto* w = eng.param(params[li]).as<zero::bf16>();
        auto* g = eng.grad(params[li]).as<zero::bf16>();
        if (step == 0 && l == 0 && world.rank() == 0) {
          out.backward0 = hpz_floats(w);
        }
        for (std::size_t i = 0; i < static_cast<std::size_t>(hpz_rows * hpz_cols); ++i) {
          const int k = static_cast<int>((i * 3 + li * 5 + static_cast<std::size_t>(step + world.rank())) % 15) - 7;
          g[i] = zero::bf16(static_cast<float>(k) / 64.0F + sums[li] / 256.0F + static_cast<float>(w[i]) / 8.0F);
        }
        if (step == inf_step && world.rank() == 3 && l == 1) {
          g[5] = zero::bf16(std::numeric_limits<float>::infinity());
        }
        eng.grad_ready(params[li]);
      }
      // The world group is "world"; the node groups, split from it, "world/0" and "world/1"; the cross
      // groups (the ranks of one local index, one per node) "world/2" to "world/5".
      const auto world_gathers = world.ledger().of("world", "all_gather");
      const std::string node_group = "world/" + std::to_string(world.rank() / 4);
      const std::string cross_group = "world/" + std::to_string(2 + world.rank() % 4);
      const auto node_traffic = world.ledger().of(node_group, "all_gather");
      const zero::gather_stats stats = eng.coordinator() != nullptr ? eng.coordinator()->stats() : zero::gather_stats{};
      const auto reduce_scatters = world.ledger().of("world", "reduce_scatter");
      const auto all_to_alls = world.ledger().of("world", "all_to_all");
      const zero::step_result r = eng.step();
      // Two-level qgZ's groups carry nothing else; the last bucket's second level may run in step().
      const auto node_all_to_alls = world.ledger().of(node_group, "all_to_all");
      const auto cross_all_to_alls = world.ledger().of(cross_group, "all_to_all");
      CHECK(r.applied == (step != inf_step));
      if (world.rank() == 0) {
        const std::lock_guard lock(mu);
        out.norms.push_back(r.grad_norm);
        out.applied.push_back(r.applied);
        if (step == hpz_steps - 1) {
          out.world = world_gathers;
          out.node = node_traffic;
          out.stats = stats;
          out.reduce_scatter = reduce_scatters;
          out.all_to_all = all_to_alls;
          out.node_all_to_all = node_all_to_alls;
          out.cross_all_to_all = cross_all_to_alls;
        }
      }
    }
    auto all = eng.gather_all();
    if (world.rank() == 0) {
      const std::lock_guard lock(mu);
      out.memory = eng.memory();
      for (const auto& p : params) {
        out.weights.push_back(hpz_floats(eng.param(p).as<zero::bf16>()));
      }
    }
  });
  return out;
}

} // namespace

TEST_CASE("hpZ: backward gathers inside the node from the secondary partition; the same weights; formula + P psi / H") {
  const hpz_run flat = hpz_train("");
  const hpz_run hpz = hpz_train(R"(, "zero_hpz_partition_size": 4)");

  // The same training, bit for bit: a gather from the secondary partition gives the gathered values.
  REQUIRE(hpz.weights.size() == flat.weights.size());
  for (std::size_t l = 0; l < hpz.weights.size(); ++l) {
    CAPTURE(l);
    CHECK(hpz.weights[l] == flat.weights[l]);
  }

  // Without hpZ every gather crosses the nodes: 4 forward, 3 backward, each rank sending 1/8 of a
  // layer. With it, forward's 4 do the same, and backward's 3 run on the node group, each rank
  // sending 1/4 of the layer: no byte of backward's gathers crosses a node.
  const std::size_t layer_bytes = static_cast<std::size_t>(hpz_rows * hpz_cols) * 2;
  CHECK(flat.world == zero::comm_traffic{.calls = 7, .sent = 7 * layer_bytes / 8, .received = 7 * layer_bytes});
  CHECK(flat.node == zero::comm_traffic{});
  CHECK(flat.stats.node_gathers == 0);
  CHECK(hpz.world == zero::comm_traffic{.calls = 4, .sent = 4 * layer_bytes / 8, .received = 4 * layer_bytes});
  CHECK(hpz.node == zero::comm_traffic{.calls = 3, .sent = 3 * layer_bytes / 4, .received = 3 * layer_bytes});
  CHECK(hpz.stats.node_gathers == 3);

  // Memory: the secondary partition is each rank's quarter of the bf16 model, counted in the model
  // state, and the formula gains P psi / H.
  const std::size_t psi = static_cast<std::size_t>(hpz_layers * hpz_rows * hpz_cols);
  CHECK(hpz.memory.secondary == psi * 2 / 4);
  CHECK(flat.memory.secondary == 0);
  CHECK(hpz.memory.formula == doctest::Approx(flat.memory.formula + static_cast<double>(psi) * 2 / 4));
  CHECK(hpz.memory.ratio() == doctest::Approx(1.0).epsilon(0.02));
  CHECK(hpz.memory.model_state_peak - flat.memory.model_state_peak == psi * 2 / 4);
}

TEST_CASE("hpZ: a size that does not divide the data group is refused when the engine is built; below stage 3 it "
          "is noted") {
  zero::run_ranks(2, [](zero::thread_communicator& raw) {
    hpz_comm world(raw);
    zero::cpu_backend backend({.threads = 1});
    CHECK_THROWS_WITH_AS(hpz_engine(hpz_config(2, R"(, "zero_hpz_partition_size": 3)"), world, backend),
                         doctest::Contains("zero_optimization.zero_hpz_partition_size 3 does not divide the 2 "
                                           "data-parallel ranks; expected the ranks of a node, a divisor of 2"),
                         zero::config_error);
  });
  const zero::config two = hpz_config(8, R"(, "zero_hpz_partition_size": 4)", 2);
  bool noted = false;
  for (const auto& n : two.notes) {
    noted = noted || n.find("zero_optimization.zero_hpz_partition_size: no effect at stage 2") != std::string::npos;
  }
  CHECK(noted);
}

TEST_CASE("qwZ: the gathers over the data group carry int8 codes, half a bf16 gather; forward sees the quantized "
          "weights; with hpZ, backward's node gathers give forward's values") {
  const hpz_run flat = hpz_train("");
  const hpz_run qwz = hpz_train(R"(, "zero_quantized_weights": true, "zero_quantization_block_size": 256)");
  const hpz_run both = hpz_train(
      R"(, "zero_quantized_weights": true, "zero_quantization_block_size": 256, "zero_hpz_partition_size": 4)");

  // A rank's piece of a layer: 768 codes, then 3 fp32 scales padded to 16 bytes: 784 bytes against
  // 1536 of bf16, 0.51 of the bytes.
  const std::size_t layer_bytes = static_cast<std::size_t>(hpz_rows * hpz_cols) * 2;
  const std::size_t piece = 768 + 16;
  CHECK(flat.world.sent == 7 * layer_bytes / 8);
  CHECK(qwz.world == zero::comm_traffic{.calls = 7, .sent = 7 * piece, .received = 7 * 8 * piece});
  CHECK(static_cast<double>(qwz.world.sent) / static_cast<double>(flat.world.sent) <= 0.52);
  CHECK(qwz.stats.quantized_gathers == 7);
  CHECK(flat.stats.quantized_gathers == 0);

  // Forward saw each rank's slice of the bf16 weights quantized in blocks of 256 and dequantized: the
  // CPU reference's values, element for element.
  const std::vector<float> initial = hpz_initial_layer0();
  std::vector<zero::bf16> exact(initial.size()), expected(initial.size());
  for (std::size_t i = 0; i < initial.size(); ++i) {
    exact[i] = zero::bf16(initial[i]);
  }
  const zero::quant_format f{.bits = 8, .block = 256};
  const std::size_t slice = initial.size() / 8;
  std::vector<std::uint8_t> codes(slice);
  std::vector<float> scales(f.blocks(slice));
  for (std::size_t r = 0; r < 8; ++r) {
    for (std::size_t b = 0; b < f.blocks(slice); ++b) {
      zero::quantize_block(exact.data() + r * slice, slice, f, b, codes.data(), scales.data());
      zero::dequantize_block(codes.data(), scales.data(), slice, f, b, expected.data() + r * slice);
    }
  }
  REQUIRE(qwz.forward0.size() == initial.size());
  std::size_t wrong = 0, changed = 0;
  for (std::size_t i = 0; i < initial.size(); ++i) {
    wrong += qwz.forward0[i] != static_cast<float>(expected[i]) ? 1 : 0;
    changed += qwz.forward0[i] != initial[i] ? 1 : 0;
  }
  CHECK(wrong == 0);
  CHECK(changed > 0);                   // the quantization is lossy here
  CHECK(flat.forward0 == initial);      // without qwZ the gather is exact
  CHECK(qwz.backward0 == qwz.forward0); // backward regathers the same codes
  CHECK(qwz.weights != flat.weights);

  // With hpZ too: forward's 4 gathers quantized over the data group, backward's 3 exact over the node
  // group from the slices kept of forward's (dequantized) values.
  CHECK(both.world == zero::comm_traffic{.calls = 4, .sent = 4 * piece, .received = 4 * 8 * piece});
  CHECK(both.node == zero::comm_traffic{.calls = 3, .sent = 3 * layer_bytes / 4, .received = 3 * layer_bytes});
  CHECK(both.stats.quantized_gathers == 4);
  CHECK(both.backward0 == both.forward0);
  CHECK(both.forward0 == qwz.forward0);
  CHECK(both.weights == qwz.weights);
}

TEST_CASE("qgZ: gradients reduced as int4 or int8 codes by all_to_all, a quarter or half of the bytes; norms "
          "near the exact reduction's; an inf anywhere still skips the step") {
  for (const int stage : {2, 3}) {
    CAPTURE(stage);
    // One bucket per layer at stage 2 too.
    const hpz_run flat = hpz_train(R"(, "reduce_bucket_size": 6144)", stage);
    const std::string block = R"(, "zero_quantization_block_size": 256, "reduce_bucket_size": 6144)";
    const hpz_run int4 = hpz_train(R"(, "zero_quantized_gradients": true)" + block, stage);
    const hpz_run int8 =
        hpz_train(R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_bits": 8)" + block, stage);

    // Per layer, a rank's bucket is 8 chunks of 768 bf16 gradients (12288 bytes); as int4 each chunk is
    // 384 bytes of codes and 3 scales padded to 16: 400 bytes, 0.26 of the bytes; as int8 784, 0.51.
    const std::size_t layer_bytes = static_cast<std::size_t>(hpz_rows * hpz_cols) * 2;
    CHECK(flat.reduce_scatter ==
          zero::comm_traffic{.calls = 4, .sent = 4 * layer_bytes, .received = 4 * layer_bytes / 8});
    CHECK(flat.all_to_all == zero::comm_traffic{});
    CHECK(int4.reduce_scatter == zero::comm_traffic{});
    CHECK(int4.all_to_all == zero::comm_traffic{.calls = 4, .sent = 4 * 8 * 400, .received = 4 * 8 * 400});
    CHECK(int8.all_to_all == zero::comm_traffic{.calls = 4, .sent = 4 * 8 * 784, .received = 4 * 8 * 784});
    CHECK(static_cast<double>(int4.all_to_all.sent) / static_cast<double>(flat.reduce_scatter.sent) <= 0.27);
    CHECK(static_cast<double>(int8.all_to_all.sent) / static_cast<double>(flat.reduce_scatter.sent) <= 0.52);

    // The reduced gradients are close to the exact ones: each step's norm (taken after the reduction).
    REQUIRE(int4.norms.size() == flat.norms.size());
    for (std::size_t k = 0; k < flat.norms.size(); ++k) {
      CAPTURE(k);
      CHECK(int8.norms[k] == doctest::Approx(flat.norms[k]).epsilon(0.01));
      CHECK(int4.norms[k] == doctest::Approx(flat.norms[k]).epsilon(0.05));
      CHECK(int4.norms[k] != flat.norms[k]); // and not the same: the codes are lossy
    }

    // An inf in one rank's gradients poisons its block's scale: the sum is NaN and every rank skips.
    const hpz_run inf = hpz_train(R"(, "zero_quantized_gradients": true)" + block, stage, 1);
    CHECK(inf.applied == std::vector<bool>{true, false, true});
  }
}

/// The share of `run`'s weights more than 1/512 away from `exact`'s (a step moves a weight by lr = 1/100).
double moved_apart(const hpz_run& run, const hpz_run& exact) {
  std::size_t far = 0, all = 0;
  for (std::size_t l = 0; l < exact.weights.size(); ++l) {
    for (std::size_t i = 0; i < exact.weights[l].size(); ++i) {
      far += std::abs(run.weights[l][i] - exact.weights[l][i]) > 1.0F / 512 ? 1 : 0;
      ++all;
    }
  }
  return static_cast<double>(far) / static_cast<double>(all);
}

TEST_CASE("qgZ in two levels: int4 codes send a quarter of a bf16 reduce-scatter's partials across nodes, int8 "
          "half, a quarter of one level's; each rank ends with its own shard; an inf still skips the step") {
  for (const int stage : {2, 3}) {
    CAPTURE(stage);
    const std::string block = R"(, "zero_quantization_block_size": 256, "reduce_bucket_size": 6144)";
    const std::string qgz = R"(, "zero_quantized_gradients": true)" + block;
    const std::string nodes = R"(, "zero_quantized_gradients_node_size": 4)";
    const hpz_run flat = hpz_train(R"(, "reduce_bucket_size": 6144)", stage);
    const hpz_run one4 = hpz_train(qgz, stage);
    const hpz_run two4 = hpz_train(qgz + nodes, stage);
    const hpz_run two8 = hpz_train(qgz + nodes + R"(, "zero_quantized_gradients_bits": 8)", stage);

    // One bucket a layer: 8 chunks of s = 768 gradients, one per rank; P = 2 nodes of H = 4 ranks. A
    // chunk as codes is 400 bytes (int4: 384 + 3 scales padded to 16) or 784 (int8); as bf16 1536.
    constexpr std::size_t buckets = 4, n = 8, h = 4, p = 2, s = 768, bf16_chunk = 2 * s;
    constexpr std::size_t piece4 = 400, piece8 = 784;
    // What crosses the nodes, per rank and bucket:
    // - the exact reduce-scatter, as the ledger counts it (each chunk sent to its owner): the chunks of
    //   the H ranks of the other node, (P - 1) H bf16 chunks = 6144 bytes; a hierarchical bf16
    //   reduce-scatter (inside the node first) still sends the node's partial of each chunk across
    //   once: (P - 1) bf16 chunks per rank = 1536 bytes, the least a 16-bit reduce-scatter sends;
    // - one-level qgZ: its all_to_all over the world sends the H chunks of the other node's ranks;
    // - two-level qgZ: the cross group's all_to_all sends P pieces, P - 1 of them to another node.
    const std::size_t exact_direct = (p - 1) * h * bf16_chunk, exact_hierarchical = (p - 1) * bf16_chunk;
    CHECK(flat.reduce_scatter.sent == buckets * n * bf16_chunk);
    CHECK(one4.all_to_all ==
          zero::comm_traffic{.calls = buckets, .sent = buckets * n * piece4, .received = buckets * n * piece4});
    const std::size_t one4_across = one4.all_to_all.sent / buckets / n * (n - h);
    CHECK(one4_across == (p - 1) * h * piece4); // 1600

    // Two levels: the node group carries all the codes (8 pieces: P for each of the H node ranks), the
    // cross group one piece per node, and nothing runs on the whole group.
    for (const auto* two : {&two4, &two8}) {
      const std::size_t piece = two == &two4 ? piece4 : piece8;
      CHECK(two->reduce_scatter == zero::comm_traffic{});
      CHECK(two->all_to_all == zero::comm_traffic{});
      CHECK(two->node_all_to_all ==
            zero::comm_traffic{.calls = buckets, .sent = buckets * h * p * piece, .received = buckets * h * p * piece});
      CHECK(two->cross_all_to_all ==
            zero::comm_traffic{.calls = buckets, .sent = buckets * p * piece, .received = buckets * p * piece});
    }
    const std::size_t two4_across = two4.cross_all_to_all.sent / buckets / p * (p - 1); // 400
    const std::size_t two8_across = two8.cross_all_to_all.sent / buckets / p * (p - 1); // 784
    const auto ratio = [](std::size_t a, std::size_t b) { return static_cast<double>(a) / static_cast<double>(b); };
    MESSAGE("across nodes per rank and bucket: bf16 reduce-scatter ", exact_direct, " (direct) or ", exact_hierarchical,
            " (hierarchical); qgZ int4 one level ", one4_across, ", two levels ", two4_across, " (",
            ratio(two4_across, exact_hierarchical), "); int8 two levels ", two8_across, " (",
            ratio(two8_across, exact_hierarchical), ")");
    CHECK(ratio(two4_across, exact_hierarchical) == doctest::Approx(0.26).epsilon(0.01)); // 400 / 1536
    CHECK(ratio(two8_across, exact_hierarchical) == doctest::Approx(0.51).epsilon(0.01)); // 784 / 1536
    CHECK(ratio(two4_across, exact_direct) < 0.07);
    CHECK(two4_across * h == one4_across); // one level sends every chunk of the other node across

    // Each rank ends with its own shard: the norms are the exact reduction's within one level's
    // tolerances, and the weights after 3 steps stay by the exact run's (a rank holding another rank's
    // chunk, or its chunk summed from the wrong pieces, moves most of them the other way).
    REQUIRE(two4.norms.size() == flat.norms.size());
    for (std::size_t k = 0; k < flat.norms.size(); ++k) {
      CAPTURE(k);
      CHECK(two8.norms[k] == doctest::Approx(flat.norms[k]).epsilon(0.01));
      CHECK(two4.norms[k] == doctest::Approx(flat.norms[k]).epsilon(0.05));
      CHECK(two4.norms[k] != flat.norms[k]);
    }
    const hpz_run one8 = hpz_train(qgz + R"(, "zero_quantized_gradients_bits": 8)", stage);
    MESSAGE("weights apart from the exact run's: int4 one level ", moved_apart(one4, flat), ", two levels ",
            moved_apart(two4, flat), "; int8 one level ", moved_apart(one8, flat), ", two levels ",
            moved_apart(two8, flat));
    CHECK(moved_apart(two8, flat) < 0.02);
    CHECK(moved_apart(two4, flat) < 2 * moved_apart(one4, flat) + 0.01);

    // An inf on rank 3 poisons its node's partial and then every node's sum: every rank skips.
    const hpz_run inf = hpz_train(qgz + nodes, stage, 1);
    CHECK(inf.applied == std::vector<bool>{true, false, true});
  }

  // At stage 3 the node size defaults to hpZ's, whose node groups the reducer shares; a node of the
  // whole group is one level.
  const std::string block =
      R"(, "zero_quantized_gradients": true, "zero_quantization_block_size": 256, "reduce_bucket_size": 6144)";
  const hpz_run with_hpz = hpz_train(block + R"(, "zero_hpz_partition_size": 4)");
  CHECK(with_hpz.node_all_to_all.calls == 4);
  CHECK(with_hpz.cross_all_to_all.calls == 4);
  CHECK(with_hpz.all_to_all == zero::comm_traffic{});
  const hpz_run whole = hpz_train(block + R"(, "zero_quantized_gradients_node_size": 8)", 2);
  CHECK(whole.all_to_all.calls == 4);
  CHECK(whole.node_all_to_all == zero::comm_traffic{});
}

TEST_CASE("qgZ's node size must divide the data group and match hpZ's, naming the key") {
  CHECK_THROWS_WITH_AS(
      hpz_config(8, R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 3)", 2),
      doctest::Contains("zero_optimization.zero_quantized_gradients_node_size: found 3, which does not divide the 8 "
                        "ranks of the data group; expected the ranks of a node"),
      zero::config_error);
  CHECK_THROWS_WITH_AS(hpz_config(8,
                                  R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 2,
                                     "zero_hpz_partition_size": 4)"),
                       doctest::Contains("zero_optimization.zero_quantized_gradients_node_size: found 2, but "
                                         "zero_hpz_partition_size is 4"),
                       zero::config_error);
  const zero::config unused = hpz_config(8, R"(, "zero_quantized_gradients_node_size": 4)", 2);
  bool noted = false;
  for (const auto& note : unused.notes) {
    noted = noted || note.find("zero_quantized_gradients_node_size: no effect") != std::string::npos;
  }
  CHECK(noted);
  // The engine checks its own data group too (a config read for another world size).
  zero::run_ranks(2, [](zero::thread_communicator& raw) {
    hpz_comm world(raw);
    zero::cpu_backend backend({.threads = 1});
    CHECK_THROWS_WITH_AS(
        hpz_engine(hpz_config(4, R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 4)", 2),
                   world, backend),
        doctest::Contains("zero_optimization.zero_quantized_gradients_node_size 4 does not divide the 2 data-parallel "
                          "ranks; expected the ranks of a node, a divisor of 2"),
        zero::config_error);
  });
}

TEST_CASE("qgZ is refused with the optimizer offloaded and with codes of other than 4 or 8 bits, naming the key") {
  zero::run_ranks(1, [](zero::thread_communicator& raw) {
    hpz_comm world(raw);
    zero::cpu_backend backend({.threads = 1});
    CHECK_THROWS_WITH_AS(
        hpz_engine(hpz_config(1, R"(, "zero_quantized_gradients": true, "offload_optimizer": {"device": "cpu"})", 2),
                   world, backend),
        doctest::Contains("zero_optimization.zero_quantized_gradients with offload_optimizer.device \"cpu\""),
        zero::config_error);
    CHECK_THROWS_WITH_AS(
        hpz_engine(hpz_config(1, R"(, "zero_quantized_gradients": true, "zero_quantized_gradients_bits": 6)", 3), world,
                   backend),
        doctest::Contains("zero_optimization.zero_quantized_gradients_bits: 6; expected 4 or 8"), zero::config_error);
  });
}
