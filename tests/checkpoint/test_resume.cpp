// Save, load, train on: the same as training without a break, at every stage and world size, and
// after resharding to another world size or stage.

#include "../engine/signum_rule.hpp"
#include "ckpt_harness.hpp"
#include "zero/checkpoint/safetensors.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <filesystem>
#include <mutex>
#include <vector>

namespace zt = zero::testing;
using zero::dtype;

namespace {

double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t k = 0; k < a.size(); ++k) {
    REQUIRE(a[k].size() == b[k].size());
    for (std::size_t i = 0; i < a[k].size(); ++i) {
      const double d = std::abs(double(a[k][i]) - double(b[k][i]));
      worst = std::max(worst, d / std::max(1e-3, std::abs(double(b[k][i]))));
    }
  }
  return worst;
}

} // namespace

TEST_CASE("save at step k, load, train to m == training to m without a break (fp32, bit-identical)") {
  // param_coupling makes each gradient read the parameters, so a wrong load shows at once; the
  // scheduler and a frozen parameter make their state part of what must survive.
  const zt::ckpt_spec c{.scheduler = true, .frozen = true};
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 4}) {
      CAPTURE(stage);
      CAPTURE(world);
      zt::run_spec s{.stage = stage, .world = world, .steps = 4, .batch = 64};
      const auto want = zt::train_plain(s, c);
      const auto dir = zt::scratch("resume-" + std::to_string(stage) + "-" + std::to_string(world));
      const auto got = zt::train_with_break(s, 2, s, dir, c);
      CHECK(got.params == want.params);
      REQUIRE(got.norms.size() == 2);
      CHECK(got.norms[0] == want.norms[2]);
      CHECK(got.norms[1] == want.norms[3]);
    }
  }
}

TEST_CASE("accumulation, bf16 and fp16 with its loss scaler resume bit-identically at the same world size") {
  const zt::ckpt_spec c{.scheduler = true};
  SUBCASE("fp32, 2 micro-steps per step, stage 2") {
    zt::run_spec s{.stage = 2, .world = 2, .accumulation = 2, .steps = 4, .batch = 64};
    const auto dir = zt::scratch("resume-accum");
    CHECK(zt::train_with_break(s, 2, s, dir, c).params == zt::train_plain(s, c).params);
  }
  SUBCASE("bf16, stage 3") {
    zt::run_spec s{.stage = 3, .world = 2, .type = dtype::bf16, .steps = 4, .batch = 64};
    const auto dir = zt::scratch("resume-bf16");
    CHECK(zt::train_with_break(s, 2, s, dir, c).params == zt::train_plain(s, c).params);
  }
  SUBCASE("fp16 with an overflow before the save: the scaler's halved scale and hysteresis come back") {
    zt::run_spec s{.stage = 1, .world = 2, .type = dtype::f16, .steps = 5, .batch = 64, .overflow_step = 1};
    const auto want = zt::train_plain(s, c);
    const auto dir = zt::scratch("resume-fp16");
    const auto got = zt::train_with_break(s, 3, s, dir, c);
    CHECK(got.params == want.params);
    REQUIRE(got.scales.size() == 2);
    CHECK(got.scales[0] == want.scales[3]);
    CHECK(got.scales[0] == 128.0);                   // 2^8 halved once by the overflow
    CHECK(zt::read_snapshot(dir).global_steps == 2); // three boundaries, one skipped
  }
}

TEST_CASE("saved at N=4, loaded at N=1, 2, 3, 8 and at other stages: training continues as without a break") {
  // Batch 64 splits into power-of-two micro-batches, so gradients reduce exactly at N = 1, 2, 4, 8
  // and the continuation is bit-identical (as the engine's own cross-world test shows). N = 3 needs
  // a batch of 96: the mean over 3 ranks of 32-sample means rounds differently from 4 ranks of 24,
  // by an ulp or so per step, so it is held to 1e-6 relative instead.
  for (int saved_stage : {0, 2, 3}) {
    zt::run_spec a{.stage = saved_stage, .world = 4, .steps = 4, .batch = 64, .param_coupling = 0};
    const auto want = zt::train_plain(a);
    for (int world : {1, 2, 8}) {
      for (int stage : {0, 1, 2, 3}) {
        CAPTURE(saved_stage);
        CAPTURE(world);
        CAPTURE(stage);
        zt::run_spec b = a;
        b.world = world;
        b.stage = stage;
        const auto dir = zt::scratch("reshard");
        CHECK(zt::train_with_break(a, 2, b, dir).params == want.params);
      }
    }
  }
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    zt::run_spec a{.stage = 2, .world = 4, .steps = 4, .batch = 96, .param_coupling = 0};
    zt::run_spec b = a;
    b.world = 3;
    b.stage = stage;
    const auto dir = zt::scratch("reshard-3");
    CHECK(max_rel_diff(zt::train_with_break(a, 2, b, dir).params, zt::train_plain(a).params) <= 1e-6);
  }
}

TEST_CASE("stage 3 without a 16-bit shard saves and loads as with one, and as stage 2") {
  // bf16 at stage 3 keeps no shard by default (the gathers cast the master); stage3_keep_param_shard
  // keeps one. A checkpoint of either loads into the other, and into stage 2, bit for bit.
  const zt::ckpt_spec c{.scheduler = true};
  zt::run_spec derived{.stage = 3, .world = 2, .type = dtype::bf16, .steps = 4, .batch = 64};
  zt::run_spec kept = derived;
  kept.zero_extra = R"("stage3_keep_param_shard": true)";
  zt::run_spec stage2 = derived;
  stage2.stage = 2;
  const auto want = zt::train_plain(derived, c);
  CHECK(zt::train_plain(kept, c).params == want.params);
  for (const auto& p :
       {std::pair{derived, kept}, std::pair{kept, derived}, std::pair{derived, stage2}, std::pair{stage2, derived}}) {
    CAPTURE(p.first.zero_extra);
    CAPTURE(p.second.zero_extra);
    CAPTURE(p.second.stage);
    const auto dir = zt::scratch("resume-derived");
    CHECK(zt::train_with_break(p.first, 2, p.second, dir, c).params == want.params);
  }
}

TEST_CASE("saving the same tag again replaces it; latest follows the last save") {
  const auto dir = zt::scratch("same-tag");
  zt::run_spec s{.stage = 2, .world = 2, .steps = 3, .batch = 64};
  zt::with_engine(s, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_and_train(eng, mh, comm, s, 1);
    eng.save(dir, "ckpt");
    zt::train_range(eng, mh, comm, s, 1, 3);
    eng.save(dir, "ckpt");
  });
  CHECK(zt::read_snapshot(dir, "ckpt").global_steps == 3);
  CHECK(zt::read_snapshot(dir).global_steps == 3);
  // Nothing left over: the temporary and the replaced directories are gone.
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"ckpt", "latest"});
}

TEST_CASE("an offloaded optimizer saves and loads as an in-memory one, across stage, world size and offload") {
  // Checkpoints read and write the state through optimizer().read_state / write_state: host memory,
  // both sides of a partial offload's split or of a host and NVMe split, or the NVMe state file (aio blocks of 256 B
  // make chunks of 64 elements, so they span several).
  const auto swap = zt::scratch("offload-swap");
  const std::string cpu = R"("offload_optimizer": {"device": "cpu"})";
  const std::string nvme = R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + swap.string() + R"("})";
  // Partial offload: half of each rank's state on the device, half in host memory (the split inside a range).
  const std::string half = R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})";
  // The state split between host memory and NVMe (host_ratio): 0.4 of each rank's state in host memory, the rest
  // in the file (the split inside a range).
  const std::string split =
      R"("offload_optimizer": {"device": "nvme", "host_ratio": 0.4, "nvme_path": ")" + swap.string() + R"("})";
  struct pair {
    int stage_a, world_a, stage_b, world_b;
    const std::string* offload_a;
    const std::string* offload_b;
  };
  const std::string none;
  for (dtype type : {dtype::f32, dtype::bf16}) {
    for (pair p : {pair{2, 2, 2, 2, &cpu, &cpu},    pair{2, 2, 3, 4, &cpu, &none},    pair{3, 4, 1, 1, &none, &cpu},
                   pair{1, 2, 3, 2, &cpu, &cpu},    pair{3, 2, 0, 1, &cpu, &none},    pair{2, 2, 2, 2, &nvme, &nvme},
                   pair{2, 2, 3, 4, &nvme, &cpu},   pair{3, 4, 1, 1, &none, &nvme},   pair{1, 2, 3, 2, &cpu, &nvme},
                   pair{2, 2, 3, 4, &nvme, &none},  pair{1, 2, 3, 2, &nvme, &cpu},    pair{3, 2, 2, 1, &cpu, &nvme},
                   pair{2, 2, 2, 2, &half, &cpu},   pair{3, 2, 3, 2, &half, &none},   pair{2, 2, 3, 4, &half, &half},
                   pair{3, 4, 1, 1, &none, &half},  pair{1, 2, 2, 1, &half, &nvme},   pair{2, 2, 3, 1, &nvme, &half},
                   pair{2, 2, 2, 2, &split, &cpu},  pair{2, 2, 2, 2, &split, &nvme},  pair{3, 2, 3, 2, &cpu, &split},
                   pair{1, 2, 1, 2, &nvme, &split}, pair{2, 2, 3, 4, &split, &split}, pair{3, 4, 1, 1, &none, &split},
                   pair{2, 2, 1, 1, &split, &none}, pair{3, 2, 2, 2, &half, &split}}) {
      CAPTURE(zero::name_of(type));
      CAPTURE(p.stage_a);
      CAPTURE(p.world_a);
      CAPTURE(p.stage_b);
      CAPTURE(p.world_b);
      CAPTURE(*p.offload_a);
      CAPTURE(*p.offload_b);
      zt::run_spec a{
          .stage = p.stage_a, .world = p.world_a, .type = type, .steps = 4, .batch = 64, .param_coupling = 0};
      const auto want = zt::train_plain(a); // in memory, without a break
      a.zero_extra = *p.offload_a;
      a.top_extra = R"("aio": {"block_size": 256, "queue_depth": 1})"; // several chunks per range on NVMe
      zt::run_spec b = a;
      b.stage = p.stage_b;
      b.world = p.world_b;
      b.zero_extra = *p.offload_b;
      const auto dir = zt::scratch("offload-reshard");
      CHECK(zt::train_with_break(a, 2, b, dir).params == want.params);
      CHECK(std::filesystem::is_empty(swap)); // each engine removed its state file
    }
  }
}

TEST_CASE("an optimizer that updates during backward, or beside the next forward, saves and loads the state from "
          "whichever home each range is in") {
  // After an odd number of steps with every update kept, each range of the second home lives there.
  // Saving right after a step beside the forward joins the host's thread first.
  const std::string overlap = R"("offload_optimizer": {"device": "cpu", "backward_overlap": 1})";
  const std::string both = R"("offload_optimizer": {"device": "cpu", "backward_overlap": 1, "forward_overlap": true})";
  const std::string forward = R"("offload_optimizer": {"device": "cpu", "forward_overlap": true})";
  const std::string half = R"("offload_optimizer": {"device": "cpu", "backward_overlap": 0.5})";
  const std::string none;
  struct pair {
    int stage_a, world_a, stage_b, world_b;
    const std::string* offload_a;
    const std::string* offload_b;
  };
  for (pair p :
       {pair{2, 2, 2, 2, &overlap, &overlap}, pair{3, 2, 2, 1, &half, &none}, pair{2, 2, 3, 4, &none, &half},
        pair{3, 4, 3, 2, &overlap, &half}, pair{2, 2, 3, 4, &both, &forward}, pair{3, 4, 2, 2, &forward, &both}}) {
    CAPTURE(p.stage_a);
    CAPTURE(p.stage_b);
    CAPTURE(*p.offload_a);
    CAPTURE(*p.offload_b);
    zt::run_spec a{
        .stage = p.stage_a, .world = p.world_a, .type = dtype::bf16, .steps = 5, .batch = 64, .param_coupling = 0};
    const auto want = zt::train_plain(a);
    a.zero_extra = *p.offload_a;
    zt::run_spec b = a;
    b.stage = p.stage_b;
    b.world = p.world_b;
    b.zero_extra = *p.offload_b;
    CHECK(zt::train_with_break(a, 3, b, zt::scratch("overlap-reshard")).params == want.params);
  }
}

TEST_CASE("offloaded parameters save and load as in memory, across world size, stage and offload") {
  // The shard in host memory is read and written through the backend's copies as any store; on NVMe
  // through an image of it in host memory (every module in the file: max_in_cpu 0).
  const auto swap = zt::scratch("param-offload-swap");
  const std::string params = R"("offload_param": {"device": "cpu"})";
  const std::string both = R"("offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"})";
  const std::string optimizer = R"("offload_optimizer": {"device": "cpu"})";
  const std::string on_nvme = R"("offload_param": {"device": "nvme", "max_in_cpu": 0, "nvme_path": ")" + swap.string() +
                              R"("}, "offload_optimizer": {"device": "cpu"})";
  const std::string all_nvme = R"("offload_param": {"device": "nvme", "max_in_cpu": 0, "nvme_path": ")" +
                               swap.string() + R"("}, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                               swap.string() + R"("})";
  struct pair {
    int stage_a, world_a, stage_b, world_b;
    std::string extra_a, extra_b;
  };
  for (dtype type : {dtype::f32, dtype::bf16}) {
    for (const pair& p :
         {pair{3, 2, 3, 2, params, params}, pair{3, 2, 3, 3, params, ""}, pair{3, 4, 3, 1, "", params},
          pair{3, 2, 2, 2, both, ""}, pair{1, 2, 3, 2, optimizer, both}, pair{3, 3, 3, 2, params, both},
          pair{3, 2, 1, 1, both, optimizer}, pair{3, 2, 0, 1, both, ""}, pair{3, 2, 3, 2, on_nvme, on_nvme},
          pair{3, 2, 3, 3, all_nvme, ""}, pair{3, 4, 3, 1, "", on_nvme}, pair{3, 2, 3, 2, params, all_nvme},
          pair{3, 3, 3, 2, on_nvme, params}, pair{1, 2, 3, 2, optimizer, all_nvme},
          pair{3, 2, 2, 1, on_nvme, optimizer}}) {
      CAPTURE(zero::name_of(type));
      CAPTURE(p.stage_a);
      CAPTURE(p.world_a);
      CAPTURE(p.stage_b);
      CAPTURE(p.world_b);
      CAPTURE(p.extra_a);
      CAPTURE(p.extra_b);
      // The gradients read the parameters (param_coupling), so a shard loaded wrong shows; they then
      // depend on the world size too, so the oracle is the same break in memory.
      zt::run_spec a{.stage = p.stage_a, .world = p.world_a, .type = type, .steps = 4, .batch = 96};
      zt::run_spec b = a;
      b.stage = p.stage_b;
      b.world = p.world_b;
      const auto want = zt::train_with_break(a, 2, b, zt::scratch("param-offload-reshard-in-memory"));
      a.zero_extra = p.extra_a;
      b.zero_extra = p.extra_b;
      const auto got = zt::train_with_break(a, 2, b, zt::scratch("param-offload-reshard"));
      CHECK(got.params == want.params);
      CHECK(got.norms == want.norms);
      CHECK(std::filesystem::is_empty(swap)); // each engine removed its files
    }
  }
}

TEST_CASE(
    "HSDP: the first shard group writes the checkpoint; it loads into HSDP, a plain engine or another shard size") {
  const zt::ckpt_spec c{.scheduler = true, .frozen = true};
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    zt::run_spec hsdp{.stage = stage, .world = 8, .steps = 4, .batch = 64, .zero_extra = R"("mics_shard_size": 4)"};
    const auto want = zt::train_plain(hsdp, c);
    const auto dir = zt::scratch("hsdp-" + std::to_string(stage));
    CHECK(zt::train_with_break(hsdp, 2, hsdp, dir, c).params == want.params);
    // Written once, by one shard group: a shard file per rank of a group of 4, every checksum right.
    zero::checkpoint::reader r(dir);
    r.verify();
    CHECK(r.info().world_size == 4);
    std::size_t shards = 0;
    for (const auto& f : r.info().files) {
      shards += f.kind == "shard" ? 1 : 0;
    }
    CHECK(shards == 4);
    // Into an engine over 4 or 8 plain ranks, or shard groups of 2 (the reduction order differs).
    for (const auto& to : {std::pair{4, std::string()}, std::pair{8, std::string()},
                           std::pair{8, std::string(R"("mics_shard_size": 2)")}}) {
      CAPTURE(to.first);
      CAPTURE(to.second);
      zt::run_spec b = hsdp;
      b.world = to.first;
      b.zero_extra = to.second;
      const auto again = zt::scratch("hsdp-" + std::to_string(stage) + "-to-" + std::to_string(to.first) +
                                     (to.second.empty() ? "" : "-2"));
      CHECK(max_rel_diff(zt::train_with_break(hsdp, 2, b, again, c).params, want.params) <= 1e-6);
    }
    // Only the first group's ranks (world ranks 0-3) write shards and publish; the consolidated export
    // is the first group's too, and holds the checkpoint's masters.
    std::mutex mu;
    std::vector<int> writers, publishers;
    zt::with_engine(hsdp, c, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
      zt::init_and_train(eng, mh, comm, hsdp, 2);
      const int world_rank = comm.rank();
      eng.save(dir / "observed", "t",
               zero::checkpoint::save_options{.observer = [&](const zero::checkpoint::save_event& e) {
                 const std::lock_guard lock(mu);
                 if (e.what == "shard_created") {
                   writers.push_back(world_rank);
                 } else if (e.what == "renamed") {
                   publishers.push_back(world_rank);
                 }
               }});
      eng.export_safetensors(dir / "fp32.safetensors", dtype::f32);
    });
    std::sort(writers.begin(), writers.end());
    CHECK(writers == std::vector<int>{0, 1, 2, 3});
    CHECK(publishers == std::vector<int>{0});
    const auto saved = zt::read_snapshot(dir);
    for (const auto& tensor : zt::read_safetensors(dir / "fp32.safetensors")) {
      const std::string& name = tensor.first; // not a structured binding: CAPTURE is a lambda (Clang 14)
      CAPTURE(name);
      CHECK(tensor.second == saved.tensors.at(name + "/0"));
    }
  }
}

TEST_CASE("ZenFlow: a checkpoint mid-interval resumes the uninterrupted run, at any world size; a load of an exact "
          "checkpoint starts ZenFlow again") {
  // topk 0.2, update_interval 3, a choice every 4 steps after a warm-up of 1: host steps 0, 3, 6 and 7, choices at
  // 1, 4 and 8. Saved after 1 step (nothing chosen yet), 3 (a window of 2 steps) and 5 (chosen at 4, a window of 1).
  const std::string zenflow = R"("offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.2, )"
                              R"("select_strategy": "step", "select_interval": 4, "update_interval": 3, )";
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    zt::run_spec zen{.stage = stage, .world = 2, .steps = 9, .zero_extra = zenflow + R"("full_warm_up_rounds": 1})"};
    const auto want = zt::train_plain(zen);
    zt::run_spec exact = zen;
    exact.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
    CHECK(max_rel_diff(zt::train_plain(exact).params, want.params) > 1e-4); // not the exact run
    for (std::int64_t k : {1, 3, 5}) {
      CAPTURE(k);
      const auto dir = zt::scratch("zenflow-" + std::to_string(stage) + "-" + std::to_string(k));
      CHECK(zt::train_with_break(zen, k, zen, dir).params == want.params);
      const zero::checkpoint::reader r(dir);
      REQUIRE(r.info().zenflow.has_value());
      CHECK(r.info().zenflow->window_steps == (k == 3 ? 2 : k == 5 ? 1 : 0));
      CHECK(r.info().zenflow->selected == (k > 1));
      // At 3 ranks (the sums' order differs, by up to 1.3e-6 here over 9 steps), and into an exact engine, which
      // drops the window (not applied).
      zt::run_spec three = zen;
      three.world = 3;
      CHECK(max_rel_diff(zt::train_with_break(zen, k, three, zt::scratch("zenflow-3-" + std::to_string(k))).params,
                         want.params) <= 1e-5);
      zt::with_engine(exact, {}, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
        eng.load(dir);
        CHECK(eng.global_steps() == k);
      });
    }
    // A run of exact offload saved at step 3, then loaded by a ZenFlow engine without a warm-up: the load voids
    // ZenFlow's window and choice, so it chooses at its first step. That is the run whose warm-up is 3 steps (a
    // multiple of update_interval: the same host steps after it), to the bit.
    zt::run_spec from3 = zen;
    from3.zero_extra = zenflow + R"("full_warm_up_rounds": 0})";
    zt::run_spec warm3 = zen;
    warm3.zero_extra = zenflow + R"("full_warm_up_rounds": 3})";
    CHECK(zt::train_with_break(exact, 3, from3, zt::scratch("zenflow-from-exact-" + std::to_string(stage))).params ==
          zt::train_plain(warm3).params);
  }
}

TEST_CASE("ZenFlow with overlap_step: a save publishes the host update still pending, as any reader does, and the "
          "resumed run is the uninterrupted run that read its parameters there") {
  // topk 0.2, update_interval 3, chosen once after a warm-up of 1: the host updates of steps 3 and 6 run beside
  // the steps after them. Saved after 2 steps (none pending) and 5 (step 3's pending).
  const std::string zenflow = R"("offload_optimizer": {"device": "cpu"}, "zenflow": {"topk_ratio": 0.2, )"
                              R"("select_strategy": "step", "select_interval": 0, "update_interval": 3, )"
                              R"("full_warm_up_rounds": 1, "overlap_step": true})";
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    const zt::run_spec zen{.stage = stage, .world = 2, .steps = 9, .zero_extra = zenflow};
    const auto plain = zt::train_plain(zen);
    for (std::int64_t k : {2, 5}) {
      CAPTURE(k);
      zt::run_result read_at_k;
      read_at_k.applied_by_rank.resize(2);
      zt::with_engine(zen, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
        zt::init_all(eng);
        zt::train_steps(eng, mh, comm, zen, 0, k, read_at_k);
        zt::run_result seen;
        zt::collect_params(eng, mh, comm, seen); // a reader: publishes what is pending
        zt::train_steps(eng, mh, comm, zen, k, zen.steps, read_at_k);
        zt::collect_params(eng, mh, comm, read_at_k);
      });
      CHECK(zt::train_with_break(zen, k, zen,
                                 zt::scratch("zenflow-overlap-" + std::to_string(stage) + "-" + std::to_string(k)))
                .params == read_at_k.params);
      // Reading with nothing pending changes nothing; reading with step 3's update pending publishes it early.
      CHECK((read_at_k.params == plain.params) == (k == 2));
    }
  }
}

namespace {

/// `a` (an update rule's block, saved at world 4 and stage 2 after 3 of its steps) resumed at world 1 and stage 0
/// and at world 2 and stage 3: the uninterrupted run's bits.
void check_reshard(const zt::run_spec& a) {
  const auto want = zt::train_plain(a);
  for (int world : {1, 2}) {
    zt::run_spec b = a;
    b.world = world;
    b.stage = world == 1 ? 0 : 3;
    CAPTURE(world);
    CHECK(zt::train_with_break(a, 3, b, zt::scratch("rule-reshard")).params == want.params);
  }
}

/// Loads checkpoint `tag` of `dir` into a fresh engine of `loader` (initialised, untrained) and returns the
/// checkpoint_error's text; checks that the refused load changed nothing.
std::string refused_load(const zt::run_spec& loader, const std::filesystem::path& dir, const std::string& tag) {
  std::string what;
  zt::with_engine(loader, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_all(eng);
    zt::run_result before;
    zt::collect_params(eng, mh, comm, before);
    try {
      eng.load(dir, tag);
    } catch (const zero::checkpoint_error& e) {
      if (comm.rank() == 0) {
        what = e.what();
      }
    }
    zt::run_result after; // nothing changed
    zt::collect_params(eng, mh, comm, after);
    CHECK(after.params == before.params);
    CHECK(eng.global_steps() == 0);
  });
  return what;
}

} // namespace

TEST_CASE("Lion, SGD and Adagrad resume bit-identically and reshard; a load under another rule is refused") {
  // Each rule's state (Lion's exp_avg, SGD's momentum_buffer or none, Adagrad's sum) is all a resume needs:
  // saved at world 4, stage 2, loaded at world 2, stage 3 and at world 1, stage 0, and between host memory and the
  // device.
  const std::vector<std::pair<std::string, std::string>> rules = {
      {"Lion", R"({"type": "Lion", "params": {"lr": 0.01, "weight_decay": 0.1}})"},
      {"SGD", R"({"type": "SGD", "params": {"lr": 0.01, "momentum": 0.9, "nesterov": true}})"},
      {"SGD without momentum", R"({"type": "SGD", "params": {"lr": 0.01}})"},
      {"Adagrad", R"({"type": "Adagrad", "params": {"lr": 0.01, "lr_decay": 0.1, "initial_accumulator_value": 0.5}})"}};
  for (const auto& rule : rules) {
    const std::string name = rule.first;
    CAPTURE(name);
    zt::run_spec a{.stage = 2, .world = 4, .steps = 5, .batch = 64, .param_coupling = 0, .optimizer = rule.second};
    check_reshard(a);
    const auto want = zt::train_plain(a);
    // Offloaded to host memory when saved, on the device when loaded (and the other way): the same bits.
    zt::run_spec offloaded = a;
    offloaded.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
    zt::run_spec in_memory = a;
    in_memory.world = 2;
    CHECK(zt::train_with_break(offloaded, 3, in_memory, zt::scratch("rule-offloaded")).params == want.params);
    CHECK(zt::train_with_break(in_memory, 3, offloaded, zt::scratch("rule-offloaded-2")).params ==
          zt::train_plain(in_memory).params);
    // The same world and stage with gradients that read the parameters: bit for bit.
    zt::run_spec c{.stage = 1, .world = 2, .steps = 4, .batch = 64, .optimizer = rule.second};
    const auto dir = zt::scratch("rule-resume");
    CHECK(zt::train_with_break(c, 2, c, dir).params == zt::train_plain(c).params);
    // The shard holds the master and the rule's tensors only.
    const auto snap = zt::read_snapshot(dir);
    CHECK(snap.tensors.contains("fc1.weight/1") == (name != "SGD without momentum"));
    CHECK(!snap.tensors.contains("fc1.weight/2"));
  }
  // Saved by Lion, loaded by AdamW (or by SGD with momentum, whose state differs): refused, naming both.
  zt::run_spec lion{
      .stage = 2, .world = 2, .steps = 2, .batch = 64, .optimizer = R"({"type": "Lion", "params": {"lr": 0.01}})"};
  const auto dir = zt::scratch("rule-mismatch");
  zt::with_engine(lion, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_and_train(eng, mh, comm, lion, 2);
    eng.save(dir, "lion");
  });
  for (const std::string& other : {std::string(R"({"type": "AdamW", "params": {}})"),
                                   std::string(R"({"type": "SGD", "params": {"momentum": 0.5}})")}) {
    zt::run_spec b = lion;
    b.optimizer = other;
    const std::string what = refused_load(b, dir, "lion");
    CHECK(what.find("holds the state of Lion (exp_avg); this engine runs ") != std::string::npos);
    CHECK(what.find(other.find("AdamW") != std::string::npos ? "AdamW (exp_avg, exp_avg_sq)"
                                                             : "SGD (momentum_buffer)") != std::string::npos);
  }
}

TEST_CASE("Lamb resumes bit-identically and reshards; AdamW's state, with the same tensors, is refused under Lamb") {
  // Lamb keeps AdamW's two tensors and sums each parameter over the ranks at every step (docs/optimizers.md), so a
  // resume at another world size and stage takes every tensor's ratio whole again: the uninterrupted run's bits.
  const std::string lamb = R"({"type": "Lamb", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  check_reshard({.stage = 2, .world = 4, .steps = 5, .batch = 64, .param_coupling = 0, .optimizer = lamb});
  zt::run_spec c{.stage = 1, .world = 2, .steps = 4, .batch = 64, .optimizer = lamb};
  CHECK(zt::train_with_break(c, 2, c, zt::scratch("lamb-resume")).params == zt::train_plain(c).params);
  // Saved by AdamW (a manifest without an optimizer block), loaded by Lamb, and the other way: refused, nothing
  // changed, though both keep exp_avg and exp_avg_sq.
  for (const bool adamw_first : {true, false}) {
    CAPTURE(adamw_first);
    zt::run_spec saver{.stage = 2,
                       .world = 2,
                       .steps = 2,
                       .batch = 64,
                       .optimizer = adamw_first ? R"({"type": "AdamW", "params": {}})" : lamb};
    zt::run_spec loader = saver;
    loader.optimizer = adamw_first ? lamb : R"({"type": "AdamW", "params": {}})";
    const auto dir = zt::scratch("lamb-mismatch");
    zt::with_engine(saver, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
      zt::init_and_train(eng, mh, comm, saver, 2);
      eng.save(dir, "tag");
    });
    CHECK(refused_load(loader, dir, "tag")
              .find(adamw_first ? "holds the state of AdamW (exp_avg, exp_avg_sq); this engine runs Lamb"
                                : "holds the state of Lamb (exp_avg, exp_avg_sq); this engine runs AdamW") !=
          std::string::npos);
  }
}

TEST_CASE("a framework's own rule (Signum) resumes and reshards from host memory; AdamW refuses its state") {
  // Saved at world 4, stage 3 with the optimizer in host memory, after 3 of 6 steps; resumed at world 2, stage 3
  // offloaded too, and at world 1, stage 0 in memory: the uninterrupted run's bits.
  zt::run_spec a = zt::with_signum({.stage = 3,
                                    .world = 4,
                                    .steps = 6,
                                    .batch = 64,
                                    .param_coupling = 0,
                                    .zero_extra = R"("offload_optimizer": {"device": "cpu"})"});
  const auto want = zt::train_plain(a);
  for (int world : {1, 2}) {
    zt::run_spec b = a;
    b.world = world;
    b.stage = world == 1 ? 0 : 3;
    if (world == 1) {
      b.zero_extra.clear();
    }
    CAPTURE(world);
    CHECK(zt::train_with_break(a, 3, b, zt::scratch("signum-reshard")).params == want.params);
  }
  // Under AdamW its checkpoint is refused before anything changes, naming the rule and its tensor.
  const auto dir = zt::scratch("signum-mismatch");
  zt::with_engine(a, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_and_train(eng, mh, comm, a, 2);
    eng.save(dir, "tag");
  });
  zt::run_spec adamw = a;
  adamw.optimizer.clear();
  adamw.optimizers.clear();
  adamw.use_rule.clear();
  CHECK(refused_load(adamw, dir, "tag").find("holds the state of Signum (momentum_buffer); this engine runs AdamW") !=
        std::string::npos);
}
