// ZeRO-Infinity's optimizer offload (`offload_optimizer.device: nvme`): the state in a file of the
// storage policy, the same bits as in memory, and a write that fails mid-step leaves every rank at
// the previous step, from which training goes on.

#include "nvme_harness.hpp"
#include "same_run.hpp"

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <unistd.h>

namespace fs = std::filesystem;
using zero::dtype;
using namespace zero::testing;

namespace {

std::string nvme_config(const fs::path& dir, int buffer_count = 2) {
  return R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.string() + R"(", "buffer_count": )" +
         std::to_string(buffer_count) + "}";
}

} // namespace

TEST_CASE("offload_optimizer nvme trains to the bits of the in-memory optimizer at stages 1-3") {
  scratch_dir dir("nvme-bits");
  for_each_training_shape({1, 2, 3}, [&](run_spec s) {
    const auto want = train_with_engine(s);
    s.zero_extra = nvme_config(dir.path, 2 + s.world % 2);
    s.top_extra = small_chunks;
    const auto got = train_with_engine(s);
    CHECK(got.params == want.params);
    CHECK(got.norms == want.norms);
    CHECK(got.applied == want.applied);
  });
  // Every engine removed its state file.
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("at stage 3 the optimizer on NVMe and the parameter shard in host memory give the in-memory bits") {
  scratch_dir dir("nvme-params");
  check_stage3_host_params(nvme_config(dir.path));
}

TEST_CASE("an fp16 overflow skips the NVMe-offloaded step on every rank, as in memory") {
  scratch_dir dir("nvme-overflow");
  check_fp16_overflow(nvme_config(dir.path));
}

TEST_CASE("the state file is 0600, two slots of the rank's state; the host keeps shards and chunk buffers") {
  scratch_dir dir("nvme-memory");
  run_spec s{
      .stage = 2, .world = 2, .type = dtype::bf16, .zero_extra = nvme_config(dir.path), .top_extra = small_chunks};
  with_cpu_engines(s, [&](auto& eng, const model_handles&, zero::thread_communicator&) {
    auto* nvme = eng.optimizer().nvme();
    REQUIRE(nvme != nullptr);
    CHECK(nvme->path().parent_path() == dir.path);
    CHECK((fs::status(nvme->path()).permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write));
    const auto m = eng.memory();
    CHECK(m.optimizer == 0);
    CHECK(m.host_optimizer == 0);
    // Two slots of master, m and v, each range rounded up to the posix storage's alignment (1).
    CHECK(m.nvme == 2 * 3 * sizeof(float) * eng.optimizer().state_size());
    CHECK(m.nvme == fs::file_size(nvme->path()));
    // Host: the gradient shard and two parameter copies (bf16), and 2 chunk buffers of 3 x 64 floats.
    CHECK(m.host_grads == 2 * eng.optimizer().state_size());
    CHECK(m.host_params == 2 * 2 * eng.optimizer().state_size());
    CHECK(m.host_buffers == 2 * 3 * 64 * sizeof(float));
    CHECK(m.table().find("on NVMe: the optimizer state file " + std::to_string(m.nvme) + " B") != std::string::npos);
  });
}

TEST_CASE("ENOSPC or EIO at any write of a step: an error naming the file and bytes, every rank at the "
          "previous step, and training goes on") {
  scratch_dir dir("nvme-faults");
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    run_spec s{.stage = stage,
               .world = 2,
               .type = dtype::bf16,
               .steps = 5,
               .zero_extra = nvme_config(dir.path),
               .top_extra = small_chunks};
    run_spec plain = s;
    plain.zero_extra.clear();
    plain.top_extra.clear();
    const auto want = train_with_engine(plain); // steps 0-4 in memory, none failing

    zero::testing::run_result got;
    got.applied_by_rank.resize(2);
    std::size_t failures = 0;
    std::size_t writes_per_step = 0;
    zero::testing::with_failing_engines(
        s, [&](failing_engine& eng, const zero::testing::model_handles& mh, zero::thread_communicator& comm) {
          zero::testing::train_steps(eng, mh, comm, s, 0, 2, got);
          const std::size_t before = eng.storage().writes();
          zero::testing::train_steps(eng, mh, comm, s, 2, 3, got);
          const std::size_t w = eng.storage().writes() - before; // the same in every step
          const std::string file = eng.optimizer().nvme()->path().string();
          // Steps 3 (ENOSPC) and 4 (EIO): write n of rank 0 fails, for every n; then the step succeeds.
          for (auto [err, t] : {std::pair{ENOSPC, 3}, std::pair{EIO, 4}}) {
            zero::testing::fail_each_write(eng, mh, comm, s, t, w, err, {file}, "could not write", failures);
            zero::testing::train_steps(eng, mh, comm, s, t, t + 1, got);
          }
          if (comm.rank() == 0) {
            writes_per_step = w;
          }
          zero::testing::collect_params(eng, mh, comm, got);
        });
    CHECK(writes_per_step >= 3); // master, m and v of at least one chunk
    CHECK(failures == 2 * writes_per_step);
    // The failed attempts changed nothing: the run equals the one that never failed.
    CHECK(got.params == want.params);
  }
}

TEST_CASE("an nvme_path that does not exist, one chunk buffer, or no nvme_path: errors that name the key or path") {
  scratch_dir dir("nvme-bad");
  const auto missing = dir.path / "not-there";
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    const auto make = [&](const std::string& offload) {
      return zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
          "zero_optimization": {"stage": 2, "offload_optimizer": {)" +
                                       offload + "}}}");
    };
    {
      eng_t eng(make(R"("device": "nvme", "nvme_path": ")" + missing.string() + R"(")"), comm, backend);
      static_cast<void>(eng.add_param(eng.add_module("m"), "w", {64}));
      CHECK_THROWS_WITH_AS(eng.finalize(), doctest::Contains(missing.string().c_str()), zero::io_error);
    }
    // One chunk buffer is refused when the engine is built (zero::check_engine_config), before any file.
    CHECK_THROWS_WITH_AS(
        eng_t(make(R"("device": "nvme", "buffer_count": 1, "nvme_path": ")" + dir.path.string() + R"(")"), comm,
              backend),
        doctest::Contains("zero_optimization.offload_optimizer.buffer_count: 1 with device \"nvme\"; NVMe offload "
                          "needs at least 2 chunk buffers"),
        zero::config_error);
    CHECK_THROWS_WITH_AS(make(R"("device": "nvme")"), doctest::Contains("offload_optimizer.nvme_path: missing"),
                         zero::config_error);
  });
  CHECK(fs::is_empty(dir.path)); // nothing half-made stays behind
}
