// ZeRO over the data-parallel group of a pipeline-parallel job (`set_model_group`): each pipeline
// stage's engine holds its own mg_layers and shards them over its data group, and the gradient norm
// that clipping uses, and fp16's overflow, are the whole model's. Trained on 4 in-process ranks as
// (pipe 2, data 2), the weights equal those of one engine holding every layer on the 2 data ranks.
// The training is model_group_harness.hpp's, over the CPU's rig (tests/cuda/test_groups_one_gpu.cpp runs it
// on ranks sharing one GPU).

#include "model_group_harness.hpp"
#include "parallel_settings.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace {

using mg_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;
using zero_test::mg_config;

} // namespace

TEST_CASE("pipeline stages with set_model_group clip by the whole model's norm: the weights of one engine") {
  const auto& cpu = zero::testing::cpu_rig;
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto want = zero_test::mg_whole_model(cpu, stage, 0.05); // a clip the norm exceeds every step
    REQUIRE(want.size() == 2);
    CHECK(zero_test::mg_pipelined(cpu, stage, 0.05, true) == want);
    // Without the model group each stage clips by its own mg_layers' norm: other weights.
    CHECK(zero_test::mg_pipelined(cpu, stage, 0.05, false) != want);
    // Unclipped, the groups do not matter.
    CHECK(zero_test::mg_pipelined(cpu, stage, 0, true) == zero_test::mg_whole_model(cpu, stage, 0));
  }
}

TEST_CASE("an inf in one pipeline stage's gradients skips the step on every stage with set_model_group") {
  const auto& cpu = zero::testing::cpu_rig;
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  for (bool with_model_group : {true, false}) {
    CAPTURE(with_model_group);
    auto applied = zero_test::mg_inf_applied(cpu, with_model_group);
    for (int r = 0; r < 4; ++r) {
      CAPTURE(r);
      const bool stage1 = topo.coord(r, "pipe") == 1;
      // Step 1 is skipped where the inf is, and with the model group on every stage.
      CHECK(applied[r] == std::vector<bool>{true, !(with_model_group || stage1), true});
    }
  }
}

TEST_CASE("set_model_group after finalize is refused") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(1, 1, 0), comm, backend);
    eng.add_param(eng.add_module("m"), "w", {8});
    eng.finalize();
    CHECK_THROWS_WITH_AS(eng.set_model_group(comm), doctest::Contains("set_model_group after finalize()"),
                         zero::usage_error);
  });
}

TEST_CASE("tensor parallelism: a replicated parameter counts once in the clipping norm; the weights and norms of "
          "one engine holding the whole model") {
  const auto& cpu = zero::testing::cpu_rig;
  zero_test::for_each_parallel_setting([&](const zero_test::parallel_setting& set) {
    const zero_test::tp_result want = zero_test::tp_whole(cpu, set);
    REQUIRE(want.norms.size() == 3);
    zero_test::check_tp_sliced(cpu, set, want);
  });
}

TEST_CASE("set_model_group refuses coordinates outside their axes; add_param a tensor_split outside the shape") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(mg_config(1, 1, 0), comm, backend);
    const auto refused = [&](zero::model_coords at, const std::string& what) {
      CHECK_THROWS_WITH_AS(eng.set_model_group(comm, at), doctest::Contains(what.c_str()), zero::usage_error);
    };
    refused({.tensor = -1, .tensor_size = 2},
            "pipe 0, tensor -1 of 2; expected pipe >= 0 and 0 <= tensor < tensor_size");
    refused({.tensor = 2, .tensor_size = 2}, "tensor 2 of 2");
    refused({.pipe = -1}, "pipe -1, tensor 0 of 1");
    refused({.tensor_size = 0}, "tensor 0 of 0");
    CHECK(eng.model_place() == nullptr);
    eng.set_model_group(comm, {.pipe = 1, .tensor = 1, .tensor_size = 2});
    REQUIRE(eng.model_place() != nullptr);
    CHECK(eng.model_place()->pipe == 1);
    const int m = eng.add_module("m");
    CHECK_THROWS_WITH_AS(eng.add_param(m, "w", {4, 6}, {.tensor_split = 2}),
                         doctest::Contains("add_param(\"w\"): tensor_split 2 is not a dimension of its 2-dimensional "
                                           "shape (expected -1 for a whole parameter, or 0 to 1)"),
                         zero::usage_error);
    CHECK_THROWS_AS(eng.add_param(m, "w", {4, 6}, {.tensor_split = -2}), zero::usage_error);
    CHECK_THROWS_WITH_AS(eng.add_param(m, "w", {4, 6}, {.tensor_replicated = true, .tensor_split = 0}),
                         doctest::Contains("tensor_split 0 and tensor_replicated together"), zero::usage_error);
    eng.add_param(m, "w", {4, 6}, {.tensor_split = 1});
  });
}

TEST_CASE("the config's pipeline.stages and tensor_parallel.autotp_size: the job's layout, and each engine's place "
          "checked at finalize") {
  const auto sized = [](int data_ranks, const std::string& parallel) {
    zero::config_inputs in;
    in.world_size = data_ranks;
    return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, )" + parallel +
                                         R"(, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                                          "zero_optimization": {"stage": 2}})",
                                     in);
  };
  const zero::config cfg = sized(1, R"("pipeline": {"stages": 2}, "tensor_parallel": {"autotp_size": 2})");

  // DeepSpeed's layout: (pipe, data, tensor), tensor peers neighbours.
  const zero::topology eight = zero::topology_from_config(cfg, 8);
  CHECK(eight.axis_size("pipe") == 2);
  CHECK(eight.axis_size("data") == 2);
  CHECK(eight.axis_size("tensor") == 2);
  CHECK(eight.coords(5) == std::vector<int>{1, 0, 1});
  CHECK(zero::topology_from_config(sized(8, R"("pipeline": {"stages": "auto"})"), 8).axis_size("data") == 8);
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::topology_from_config(cfg, 6)),
                       doctest::Contains("pipeline.stages 2 x tensor_parallel.autotp_size 2 does not divide the 6 "
                                         "ranks of the job"),
                       zero::config_error);

  // On 4 ranks (pipe 2, data 1, tensor 2), each engine over its data group, placed by the topology.
  zero::run_ranks(4, [&](zero::thread_communicator& world) {
    const zero::topology topo = zero::topology_from_config(cfg, world.size());
    auto data = topo.split(world, {"data"});
    auto model = topo.split(world, {"pipe", "tensor"});
    zero::cpu_backend backend({.threads = 1});
    mg_engine eng(cfg, data, backend);
    eng.set_model_group(
        model,
        {.pipe = topo.coord(world.rank(), "pipe"), .tensor = topo.coord(world.rank(), "tensor"), .tensor_size = 2});
    eng.add_param(eng.add_module("m"), "w", {8}, {.tensor_split = 0});
    eng.finalize();
    CHECK(eng.finalized());
  });

  // A place that disagrees with the config is refused at finalize, naming the key.
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    const auto refused = [&](const zero::config& c, const zero::model_coords* at, const std::string& what) {
      mg_engine eng(c, comm, backend);
      if (at != nullptr) {
        eng.set_model_group(comm, *at);
      }
      eng.add_param(eng.add_module("m"), "w", {8});
      CHECK_THROWS_WITH_AS(eng.finalize(), doctest::Contains(what.c_str()), zero::config_error);
    };
    const zero::config tensor_only = sized(1, R"("tensor_parallel": {"autotp_size": 2})");
    const zero::config pipe_only = sized(1, R"("pipeline": {"stages": 2})");
    refused(tensor_only, nullptr,
            "tensor_parallel.autotp_size is 2, but this engine has no model group; expected "
            "set_model_group(group, {.tensor = t, .tensor_size = autotp_size})");
    refused(pipe_only, nullptr, "pipeline.stages is 2, but this engine has no model group");
    const zero::model_coords one_slice{.tensor = 0, .tensor_size = 1};
    refused(tensor_only, &one_slice,
            "tensor_parallel.autotp_size is 2, but set_model_group gave pipe 0, tensor 0 of 1; expected the same "
            "tensor size in model_coords::tensor_size");
    const zero::model_coords third_stage{.pipe = 2};
    refused(pipe_only, &third_stage, "pipeline.stages is 2, but set_model_group gave pipe 2");
    const zero::model_coords first_stage{.pipe = 0};
    refused(pipe_only, &first_stage,
            "expected a model group of a multiple of stages x tensor size = 2 ranks (it has 1)");
    // Sizes of 1, or "auto", ask for no model group.
    mg_engine plain(sized(1, R"("pipeline": {"stages": 1}, "tensor_parallel": {"autotp_size": 1})"), comm, backend);
    plain.add_param(plain.add_module("m"), "w", {8});
    plain.finalize();
    CHECK(plain.finalized());
  });
}
