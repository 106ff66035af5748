/// \file
/// Checkpoints of engines on GPUs (cuda_backend + nccl_communicator), where the host cannot touch the
/// engine's memory and every byte goes through the backend's copy: saved at step k and loaded into a
/// fresh GPU engine, training goes on bit for bit as without the break; the same files load into the CPU
/// engine (cpu_backend + thread_communicator) and training goes on there as the CPU engine trains. Ranks sharing
/// one GPU (device_group_communicator) save at one world size and load at another.
#include "gpu_engine.hpp"
#include "zero/checkpoint/checkpoint.hpp"

#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace zt = zero::testing;
namespace fs = std::filesystem;

namespace {

/// Trains `s` to step `k` on `Backend` (ranks from `group`, backends from `make`, views through `io`)
/// and saves the engine in `dir` under the tag "step-<k>".
template <class Backend, class Group, class Make, class Io>
void save_at(const zt::run_spec& s, std::int64_t k, const fs::path& dir, Group group, Make make, Io io) {
  zt::run_result first;
  first.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  zt::with_engine_group<Backend>(s, group, make, [&](auto& eng, const zt::model_handles& mh, auto& comm) {
    zt::init_model(eng);
    zt::train_steps(eng, mh, comm, s, 0, k, first, io);
    eng.save(dir, "step-" + std::to_string(k));
  });
}

/// A fresh engine on `Backend` loads the latest checkpoint in `dir` (saved after step `k`) and trains to
/// the end of `s`; returns the parameters it ends with.
template <class Backend, class Group, class Make, class Io>
zt::run_result resume_from(const zt::run_spec& s, std::int64_t k, const fs::path& dir, Group group, Make make, Io io) {
  zt::run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  zt::with_engine_group<Backend>(s, group, make, [&](auto& eng, const zt::model_handles& mh, auto& comm) {
    zt::init_model(eng);
    eng.load(dir);
    CHECK(eng.global_steps() == k);
    zt::train_steps(eng, mh, comm, s, k, s.steps, out, io);
    zt::collect_params(eng, mh, comm, out, io);
  });
  return out;
}

} // namespace

TEST_SUITE("checkpoint") {
  TEST_CASE("GPU engines save and load through cuda_backend's copy: resumed on GPUs bit for bit, and on the CPU "
            "engine as it trains") {
    const fs::path root = fs::temp_directory_path() / ("zero-gpu-ckpt-" + std::to_string(::getpid()));
    const auto cpu_group = [](int world, auto&& fn) { zero::run_ranks(world, fn); };
    const auto cpu_backend = [](zero::thread_communicator&) { return zero::cpu_backend({.threads = 1}); };
    for (int world : zero::test::gpu_worlds()) {
      for (int stage : {0, 1, 2, 3}) {
        CAPTURE(world);
        CAPTURE(stage);
        const zt::run_spec s{.stage = stage, .world = world, .steps = 5};
        const fs::path dir = root / ("w" + std::to_string(world) + "-s" + std::to_string(stage));
        const std::int64_t k = 2;
        save_at<zero::cuda_backend>(s, k, dir, zero::test::gpu_group, zero::test::gpu_backend, zero::test::device_io{});
        // On GPUs: the same bits as five steps without a break.
        const auto whole = zero::test::train_on_gpus(s);
        const auto resumed = resume_from<zero::cuda_backend>(s, k, dir, zero::test::gpu_group, zero::test::gpu_backend,
                                                             zero::test::device_io{});
        CHECK(resumed.params == whole.params);
        // The same files on the CPU engine: within 1e-6 of the CPU engine's own five steps (fp32; the first
        // two steps ran on GPUs, whose averages and norms round in another order).
        const auto on_cpu = resume_from<zero::cpu_backend>(s, k, dir, cpu_group, cpu_backend, zt::host_io{});
        const auto cpu_whole = zt::train_with_engine(s);
        CHECK(zt::max_rel_diff(on_cpu.params, cpu_whole.params) <= 1e-6);
        CHECK(zt::max_rel_diff(on_cpu.params, whole.params) <= 1e-6);
      }
    }
    std::error_code ec;
    fs::remove_all(root, ec);
  }

  TEST_CASE("saved at 4 ranks sharing one GPU and loaded at 2 (and at 2 into 4), across stage and offload: the bits "
            "of the run without a break") {
    // The CPU's resharding checkpoints (tests/checkpoint/test_resume.cpp) on device buffers: no parameter in its
    // own gradient and 64 samples a step, so every average is exact and a run's bits do not depend on its world
    // size or stage; each rank's state goes through cuda_backend's copies, and a load hands each rank of the new
    // world its slices of the old world's files.
    const fs::path root = fs::temp_directory_path() / ("zero-one-gpu-ckpt-" + std::to_string(::getpid()));
    const std::string cpu = R"("offload_optimizer": {"device": "cpu"})";
    struct pair {
      int stage_a, world_a, stage_b, world_b;
      std::string offload_a, offload_b;
    };
    int n = 0;
    for (zero::dtype type : {zero::dtype::f32, zero::dtype::bf16}) {
      for (const pair& p : {pair{3, 4, 3, 2, "", ""}, pair{2, 4, 3, 2, "", ""}, pair{3, 4, 1, 2, "", cpu},
                            pair{1, 4, 2, 2, cpu, cpu}, pair{3, 2, 3, 4, cpu, ""}, pair{2, 2, 1, 4, "", ""}}) {
        CAPTURE(zero::name_of(type));
        CAPTURE(p.stage_a);
        CAPTURE(p.world_a);
        CAPTURE(p.stage_b);
        CAPTURE(p.world_b);
        CAPTURE(p.offload_a);
        CAPTURE(p.offload_b);
        zt::run_spec a{
            .stage = p.stage_a, .world = p.world_a, .type = type, .steps = 4, .batch = 64, .param_coupling = 0};
        const auto want = zero::test::train_on_one_gpu(a); // in memory, without a break
        a.zero_extra = p.offload_a;
        zt::run_spec b = a;
        b.stage = p.stage_b;
        b.world = p.world_b;
        b.zero_extra = p.offload_b;
        const fs::path dir = root / std::to_string(n++);
        const std::int64_t k = 2;
        save_at<zero::cuda_backend>(a, k, dir, zero::test::one_gpu_group, zero::test::one_gpu_backend,
                                    zero::test::device_io{});
        const auto resumed = resume_from<zero::cuda_backend>(b, k, dir, zero::test::one_gpu_group,
                                                             zero::test::one_gpu_backend, zero::test::device_io{});
        CHECK(resumed.params == want.params);
        // And the CPU engine's run of the same steps: fp32 within 1e-6 (the GPU's AdamW rounds as the CPU's).
        if (type == zero::dtype::f32) {
          CHECK(zt::max_rel_diff(resumed.params, zt::train_with_engine(a).params) <= 1e-6);
        }
      }
    }
    std::error_code ec;
    fs::remove_all(root, ec);
  }
}
