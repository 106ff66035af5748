// The step-time model's arithmetic (zero/tools/step_model.hpp): one collective's seconds by hand, what a
// setting moves per rank, the 2 x H200 deep-MLP steps of bench/README.md it was checked on, and its refusals.
// tests/config/test_step_model_engine.cpp holds its bytes against the engine's counting communicator.

#include "zero/tools/step_model.hpp"

#include <cmath>
#include <doctest/doctest.h>
#include <string>

namespace zt = zero::tools;

namespace {

/// 2 x H200 as bench/README.md measured them: one node of 2, NVLink at 240 GB/s (the mean of the reduce-scatter's
/// and the all-gather's bus bandwidth at 256 MiB, 227 and 252).
zt::cluster_shape h200_pair() {
  zt::cluster_shape c;
  c.nodes = 1;
  c.gpus_per_node = 2;
  c.intra = {240e9, 1e-6};
  return c;
}

/// The deep MLP of bench/README.md: 24 blocks of 8192 x 8192 + 8192, 8192 rows per GPU; one H200 without
/// communication spent 41.2-42.4 ms in forward and 81.1-81.9 ms in backward (the middle of each); the fused AdamW
/// moves 148.8 G parameters a second at 256 M.
zt::step_inputs deep_mlp() {
  zt::step_inputs in;
  in.params = 24LL * (8192LL * 8192 + 8192);
  in.modules = 24;
  in.forward_s = 41.8e-3;
  in.backward_s = 81.5e-3;
  in.device_adamw = 148.8e9;
  return in;
}

} // namespace

TEST_CASE("step model: one collective's seconds by hand") {
  zt::cluster_shape c;
  c.nodes = 2;
  c.gpus_per_node = 4;
  c.intra = {200e9, 1e-6};
  c.inter = {100e9, 4e-6}; // a node's 100 GB/s: 25 GB/s per GPU
  c.call_latency_s = 10e-6;
  const double gib = 1024.0 * 1024 * 1024;
  // A reduce-scatter of 1 GiB inside a node: 3 hops, 3/4 of the buffer at 200 GB/s.
  zt::step_collective rs{"reduce_scatter", zt::comm_group::node, zt::comm_phase::backward, gib, 2, 0};
  CHECK(zt::collective_seconds(rs, c) == doctest::Approx(2 * (10e-6 + 3 * 1e-6) + gib * 0.75 / 200e9));
  // Over the data group of 8 on 2 nodes: 7 network hops, 7/8 of it leaving the node once over its 100 GB/s.
  rs.group = zt::comm_group::data;
  CHECK(zt::collective_seconds(rs, c) == doctest::Approx(2 * (10e-6 + 7 * 4e-6) + gib * 0.875 / 100e9));
  // An all-reduce across the 2 nodes (one rank each): twice the half at 25 GB/s, 2 hops a call.
  zt::step_collective ar{"all_reduce", zt::comm_group::cross, zt::comm_phase::backward, gib, 1, 0};
  CHECK(zt::collective_seconds(ar, c) == doctest::Approx(10e-6 + 2 * 4e-6 + 2 * gib * 0.5 / 25e9));
  // An all-to-all over the data group: 3/8 stays in the node (200 GB/s), 4/8 crosses (25 GB/s).
  zt::step_collective a2a{"all_to_all", zt::comm_group::data, zt::comm_phase::backward, gib, 1, 0};
  CHECK(zt::collective_seconds(a2a, c) == doctest::Approx(10e-6 + 7 * 4e-6 + gib * 3 / 8 / 200e9 + gib * 4 / 8 / 25e9));
  // A group of one moves nothing.
  c.nodes = 1;
  c.gpus_per_node = 1;
  CHECK(zt::collective_seconds(rs, c) == 0.0);
}

TEST_CASE("step model: what each setting moves per rank") {
  zt::cluster_shape c;
  c.nodes = 4;
  c.gpus_per_node = 8;
  zt::step_inputs in;
  in.params = 1'000'000'000;
  in.modules = 10;
  in.kept_for_backward = 100'000'000;
  in.bucket_elements = 250'000'000;
  auto bytes = [&](const zt::comm_setting& s, const std::string& op, zt::comm_group g, zt::comm_phase ph) {
    double b = 0;
    for (const auto& x : zt::step_collectives(s, in, c)) {
      if (x.op == op && x.group == g && x.phase == ph) {
        b += x.bytes;
      }
    }
    return b;
  };
  using g = zt::comm_group;
  using ph = zt::comm_phase;
  // Stage 2: the bf16 gradients reduce-scattered in 4 buckets, the new parameters all-gathered.
  const zt::comm_setting s2{.stage = 2};
  CHECK(bytes(s2, "reduce_scatter", g::data, ph::backward) == 2e9);
  CHECK(bytes(s2, "all_gather", g::data, ph::step) == 2e9);
  CHECK(zt::step_collectives(s2, in, c)[0].calls == 4);
  // Stage 3: forward gathers all, backward all but the kept module.
  const zt::comm_setting s3{.stage = 3};
  CHECK(bytes(s3, "all_gather", g::data, ph::forward) == 2e9);
  CHECK(bytes(s3, "all_gather", g::data, ph::backward) == 1.8e9);
  // hpZ: backward's gathers over the node group.
  const zt::comm_setting hpz{.stage = 3, .hpz = true};
  CHECK(bytes(hpz, "all_gather", g::node, ph::backward) == 1.8e9);
  CHECK(bytes(hpz, "all_gather", g::data, ph::backward) == 0);
  // qwZ: int8 codes and a 4-byte scale per 4096.
  const zt::comm_setting qwz{.stage = 3, .qwz = true};
  CHECK(bytes(qwz, "all_gather", g::data, ph::forward) == doctest::Approx(1e9 * (1 + 4.0 / 4096)));
  // qgZ int4 in two levels: the node's all-to-all carries the codes, the cross group's 1/8 of them.
  const zt::comm_setting qgz{.stage = 3, .qgz_bits = 4};
  const double codes = 1e9 * (0.5 + 4.0 / 4096);
  CHECK(bytes(qgz, "all_to_all", g::node, ph::backward) == doctest::Approx(codes));
  CHECK(bytes(qgz, "all_to_all", g::cross, ph::backward) == doctest::Approx(codes / 8));
  CHECK(bytes(qgz, "reduce_scatter", g::data, ph::backward) == 0);
  // HSDP: the node's reduce-scatter, then the shard's all-reduce across the 4 nodes.
  const zt::comm_setting hsdp{.stage = 3, .hsdp = true};
  CHECK(bytes(hsdp, "all_reduce", g::cross, ph::backward) == 2e9 / 8);
  // Bytes that leave each node: the data group's rings (3 of them) 31/32 of their buffers once; ZeRO++ sends
  // forward's int8 gathers that way, and the cross group's qgZ pieces from each of the 8 GPUs, 3/4 of them away.
  const auto plain = zt::predict_step(s3, in, c);
  const auto zpp = zt::predict_step({.stage = 3, .hpz = true, .qwz = true, .qgz_bits = 4}, in, c);
  CHECK(plain.node_egress_bytes == doctest::Approx((2e9 + 1.8e9 + 2e9) * 31 / 32));
  CHECK(zpp.node_egress_bytes == doctest::Approx(1e9 * (1 + 4.0 / 4096) * 31 / 32 + 8 * codes / 8 * 3 / 4));
}

TEST_CASE("step model: the 2 x H200 deep-MLP steps of bench/README.md within 1%") {
  // Measured: stage 2 142.9 ms, stage 3 148.5 ms (compare.sh, 2026-11-30). Nothing hidden (overlap 0).
  const auto c = h200_pair();
  const auto s2 = zt::predict_step({.stage = 2}, deep_mlp(), c);
  const auto s3 = zt::predict_step({.stage = 3}, deep_mlp(), c);
  CHECK(s2.step == doctest::Approx(142.9e-3).epsilon(0.01));
  CHECK(s3.step == doctest::Approx(148.5e-3).epsilon(0.01));
  // The parts: AdamW over half of 1.61 G at 148.8 G/s; each all-gather or reduce-scatter of 3.22 GB moves half
  // of it at 240 GB/s.
  CHECK(s3.optimizer == doctest::Approx(805'404'672.0 / 148.8e9));
  CHECK(s3.communication == doctest::Approx(3 * 3'221'618'688.0 * 0.5 / 240e9).epsilon(0.002));
  // All of it hidden would be 20 ms faster than measured: the overlap the measurements show is nil.
  CHECK(zt::predict_step({.stage = 3}, deep_mlp(), c, 1.0).step < 0.88 * 148.5e-3);
}

TEST_CASE("step model: refusals name what was wrong") {
  zt::step_inputs in = deep_mlp();
  const zt::cluster_shape c;
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 2, .hpz = true}, in, c)),
                       doctest::Contains("hpZ, qwZ and HSDP are stage 3's"), zero::usage_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 3, .qgz_bits = 2}, in, c)),
                       doctest::Contains("qgZ bits 2; expected 0, 4 or 8"), zero::usage_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 4}, in, c)),
                       doctest::Contains("stage 4; expected 1, 2 or 3"), zero::usage_error);
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 3}, in, c, 1.5)), doctest::Contains("overlap 1.5"),
                       zero::usage_error);
  zt::cluster_shape bad = c;
  bad.inter.bus_bytes_per_s = 0;
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 3}, in, bad)),
                       doctest::Contains("bandwidths must be positive, found 3.6e+11 and 0 bytes/s"),
                       zero::usage_error);
  in.params = 0;
  CHECK_THROWS_WITH_AS(static_cast<void>(zt::predict_step({.stage = 3}, in, c)),
                       doctest::Contains("found 0, 24, 500000000 and 0"), zero::usage_error);
}
