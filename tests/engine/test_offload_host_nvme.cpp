// The optimizer state in host memory and an NVMe file at once (`offload_optimizer: {"device": "nvme",
// "host_ratio": h}`, zero's own key): the same bits as the whole state in host memory and as the whole
// state on NVMe, the host and file bytes of each share, and a write that fails mid-step leaves every
// rank at the previous step (the host share not stepped anywhere), from which training goes on.

#include "nvme_harness.hpp"
#include "same_run.hpp"

#include <cerrno>
#include <cstddef>
#include <doctest/doctest.h>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;
using zero::dtype;
using namespace zero::testing;

namespace {

std::string split_config(const fs::path& dir, double host_ratio, int buffer_count = 2) {
  return R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.string() + R"(", "buffer_count": )" +
         std::to_string(buffer_count) + R"(, "host_ratio": )" + std::to_string(host_ratio) + "}";
}

} // namespace

TEST_CASE("host_ratio: the state split between host memory and NVMe trains to the bits of all-host and all-NVMe") {
  scratch_dir dir("host-nvme-bits");
  for_each_training_shape({1, 2, 3}, [&](run_spec s) {
    s.top_extra = small_chunks;
    s.zero_extra = R"("offload_optimizer": {"device": "cpu"})";
    const auto host = train_with_engine(s);
    s.zero_extra = R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.path.string() + R"("})";
    const auto nvme = train_with_engine(s);
    for (double h : {0.3, 0.7}) {
      CAPTURE(h);
      s.zero_extra = split_config(dir.path, h, 2 + s.world % 2);
      const auto got = train_with_engine(s);
      check_same_run(got, host);
      check_same_run(got, nvme);
    }
  });
  CHECK(fs::is_empty(dir.path)); // every engine removed its state file
}

TEST_CASE("host_ratio at stage 3 with the parameter shard in host memory, and an fp16 overflow: the in-memory bits") {
  scratch_dir dir("host-nvme-params");
  check_stage3_host_params(split_config(dir.path, 0.5));
  check_fp16_overflow(split_config(dir.path, 0.4));
}

TEST_CASE("host_ratio: the host holds its share of the state, the file the rest; memory() names both") {
  scratch_dir dir("host-nvme-memory");
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    run_spec s{.stage = stage,
               .world = 2,
               .type = dtype::bf16,
               .zero_extra = split_config(dir.path, 0.25),
               .top_extra = small_chunks};
    with_cpu_engines(s, [&](auto& eng, const model_handles&, zero::thread_communicator&) {
      auto* split = eng.optimizer().host_nvme();
      REQUIRE(split != nullptr);
      CHECK(eng.optimizer().nvme() == nullptr);
      CHECK(eng.optimizer().host_part() == &split->host());
      const std::size_t state = eng.optimizer().state_size();
      const std::size_t in_memory = state - split->split();
      CHECK(in_memory == zero::offloaded_state_elements(0.25, state));
      CHECK(split->nvme().state_size() == split->split());
      CHECK(split->host().state_size() == in_memory);
      const auto& info = eng.optimizer_split();
      CHECK(info.state_elements == state);
      CHECK(info.nvme_elements == split->split());
      const auto m = eng.memory();
      CHECK(m.optimizer == 0); // nothing of the state on the device
      CHECK(m.offload_ratio == 1.0);
      CHECK(m.host_share == doctest::Approx(static_cast<double>(in_memory) / static_cast<double>(state)));
      // Host memory: master, m and v of its share; the file: two slots of them for the rest (the posix
      // storage's alignment is 1 element, so no range is rounded up).
      CHECK(m.host_optimizer == 3 * sizeof(float) * in_memory);
      CHECK(m.nvme == 2 * 3 * sizeof(float) * (state - in_memory));
      CHECK(m.nvme == fs::file_size(split->nvme().path()));
      // The gradient shard of both shares (bf16), the host share's staged parameters and the file share's two
      // parameter copies, and the file share's 2 chunk buffers of 3 x 64 floats.
      CHECK(m.host_grads == 2 * state);
      CHECK(m.host_params == 2 * in_memory + 2 * 2 * (state - in_memory));
      CHECK(m.host_buffers == 2 * 3 * 64 * sizeof(float));
      // The host formula: the host share's (K + P + G) and the file share's (2 P + G) bytes per element.
      const double psi_n = static_cast<double>(m.parameters) / 2.0;
      const double h = m.host_share;
      CHECK(m.host_formula == doctest::Approx((h * (12 + 2 + 2) + (1 - h) * (2 * 2 + 2)) * psi_n));
      CHECK(m.table().find("host memory and NVMe: ") != std::string::npos);
      CHECK(m.table().find("on NVMe: the optimizer state file " + std::to_string(m.nvme) + " B") != std::string::npos);
    });
  }
}

TEST_CASE("host_ratio: ENOSPC or EIO at any write of a step: every rank at the previous step, the host share "
          "not stepped on any rank, and training goes on") {
  scratch_dir dir("host-nvme-faults");
  for (int stage : {1, 2, 3}) {
    for (int world : {2, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      run_spec s{.stage = stage,
                 .world = world,
                 .type = dtype::bf16,
                 .steps = 5,
                 .zero_extra = split_config(dir.path, 0.5),
                 .top_extra = small_chunks};
      run_spec plain = s;
      plain.zero_extra.clear();
      plain.top_extra.clear();
      const auto want = train_with_engine(plain); // steps 0-4 in memory, none failing

      run_result got;
      got.applied_by_rank.resize(static_cast<std::size_t>(world));
      std::size_t failures = 0;
      std::size_t writes_per_step = 0;
      with_failing_engines(s, [&](failing_engine& eng, const model_handles& mh, zero::thread_communicator& comm) {
        REQUIRE(eng.optimizer().host_nvme() != nullptr);
        train_steps(eng, mh, comm, s, 0, 2, got);
        const std::size_t before = eng.storage().writes();
        train_steps(eng, mh, comm, s, 2, 3, got);
        const std::size_t w = eng.storage().writes() - before; // the same in every step
        const std::string file = eng.optimizer().host_nvme()->nvme().path().string();
        // Steps 3 (ENOSPC) and 4 (EIO): write n of rank 0 fails, for every n; then the step succeeds.
        for (auto [err, t] : {std::pair{ENOSPC, 3}, std::pair{EIO, 4}}) {
          fail_each_write(eng, mh, comm, s, t, w, err, {file}, "could not write", failures);
          train_steps(eng, mh, comm, s, t, t + 1, got);
        }
        if (comm.rank() == 0) {
          writes_per_step = w;
        }
        collect_params(eng, mh, comm, got);
      });
      CHECK(writes_per_step >= 3); // master, m and v of at least one chunk
      CHECK(failures == 2 * writes_per_step);
      // The failed attempts changed nothing, the host share included: the run equals the one that never failed.
      CHECK(got.params == want.params);
    }
  }
}

TEST_CASE("host_ratio rounding to none or all of a rank's state makes the one-placement plan") {
  scratch_dir dir("host-nvme-ends");
  run_spec s{.stage = 2, .world = 2, .type = dtype::bf16, .top_extra = small_chunks};
  s.zero_extra = split_config(dir.path, 0.0001); // below half a granule of 64 elements: all in the file
  with_cpu_engines(s, [&](auto& eng, const model_handles&, zero::thread_communicator&) {
    CHECK(eng.optimizer().nvme() != nullptr);
    CHECK(eng.optimizer().host_nvme() == nullptr);
    CHECK(eng.memory().host_share == 0.0);
  });
  s.zero_extra = split_config(dir.path, 0.9999); // within half a granule of all: all in host memory
  with_cpu_engines(s, [&](auto& eng, const model_handles&, zero::thread_communicator&) {
    CHECK(eng.optimizer().host() != nullptr);
    CHECK(eng.memory().nvme == 0);
  });
}
