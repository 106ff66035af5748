#pragma once
// What the NVMe offload tests share: scratch folders for the files, the runs each placement of the state
// must give the in-memory bits of, engines over a failure-injecting storage, and what a rank holds, to
// compare before and after a failed step.

#include "engine_harness.hpp"
#include "same_run.hpp"
#include "zero/storage/failing_storage.hpp"
#include "zero/storage/posix_storage.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::testing {

inline constexpr auto npos = std::string::npos;

/// aio blocks of 256 B and one piece in flight: the optimizer's NVMe chunks are 64 elements, so every
/// range of the small model spans several chunks and the read-ahead and write-behind ring turns over.
inline constexpr const char* small_chunks = R"("aio": {"block_size": 256, "queue_depth": 1, "thread_count": 2})";

/// A fresh folder `zero-<name>-<pid>` under the temporary folder, removed with the object.
struct scratch_dir {
  std::filesystem::path path;
  explicit scratch_dir(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("zero-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
};

/// Stage 3 with the parameter shard in host memory at world 1-3 x f32, bf16 (accumulation 2, clipping at 1):
/// with the optimizer as `optimizer` says (an `"offload_optimizer"` member of zero_optimization) and small
/// aio chunks, the bits of the in-memory run (`check_same_run`).
inline void check_stage3_host_params(const std::string& optimizer) {
  for (int world : {1, 2, 3}) {
    for (dtype type : {dtype::f32, dtype::bf16}) {
      CAPTURE(world);
      CAPTURE(zero::name_of(type));
      run_spec s{.stage = 3, .world = world, .type = type, .accumulation = 2, .clip = 1.0};
      const auto want = train_with_engine(s);
      s.zero_extra = optimizer + R"(, "offload_param": {"device": "cpu"})";
      s.top_extra = small_chunks;
      check_same_run(train_with_engine(s), want);
    }
  }
}

/// An fp16 overflow at step 2 of 6 (stage 2, world 2) with the optimizer as `optimizer` says and small aio
/// chunks: the bits of the in-memory run, the step skipped on every rank.
inline void check_fp16_overflow(const std::string& optimizer) {
  run_spec s{.stage = 2, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
  const auto want = train_with_engine(s);
  s.zero_extra = optimizer;
  s.top_extra = small_chunks;
  const auto got = train_with_engine(s);
  check_same_run(got, want);
  CHECK_FALSE(got.applied[2]);
}

using failing = failing_storage<posix_storage>;
using failing_engine = basic_engine<cpu_backend, thread_communicator, host_allocator, failing>;

/// What a rank's engine holds: its parameter store and its state, on the host, compared bit for bit.
struct held_state {
  std::vector<std::byte> params;
  std::vector<std::uint32_t> master, m, v;
  bool operator==(const held_state&) const = default;
};

inline held_state hold(failing_engine& eng) {
  held_state h;
  const auto st = eng.stores();
  const std::size_t bytes = st.param_elements * size_of(eng.layout().type());
  h.params.assign(st.params, st.params + bytes);
  auto& opt = eng.optimizer();
  std::vector<float> values(opt.state_size());
  for (auto [t, out] : {std::pair{state_tensor::master, &h.master}, std::pair{state_tensor::exp_avg, &h.m},
                        std::pair{state_tensor::exp_avg_sq, &h.v}}) {
    opt.read_state(t, 0, values);
    out->resize(values.size());
    std::memcpy(out->data(), values.data(), values.size() * sizeof(float));
  }
  return h;
}

/// Runs `body(eng, handles, comm)` on every rank of a group of `s.world` failing-storage engines of
/// `s`, finalized and initialised with `init_model` (`with_cpu_engines`).
template <class Body> void with_failing_engines(const run_spec& s, Body body) {
  with_cpu_engines<failing_engine>(s, std::move(body));
}

/// Checks the io_error of a failure the ranks agreed on: on `failing_rank` it names one of `files`
/// and carries errno `err` (and is counted in `failures`); on the others it is an echo saying
/// "another rank `elsewhere`"; on every rank it says `outcome`.
inline void check_agreed_error(const io_error& e, int rank, int failing_rank, const std::vector<std::string>& files,
                               int err, const std::string& elsewhere, const std::string& outcome,
                               std::size_t& failures) {
  const std::string what = e.what();
  CAPTURE(what);
  if (rank == failing_rank) {
    CHECK(std::any_of(files.begin(), files.end(), [&](const std::string& f) { return what.find(f) != npos; }));
    CHECK(what.find(" bytes at offset ") != npos);
    CHECK(e.status() == err);
    CHECK(what.find(err == ENOSPC ? "(ENOSPC)" : err == EIO ? "(EIO)" : "") != npos);
    ++failures;
  } else {
    CHECK(e.echo());
    CHECK(what.find("another rank " + elsewhere) != npos);
  }
  CHECK(what.find(outcome) != npos);
}

/// Step `t` of `s` with write n of rank 0 failing with `err`, for every n < `writes`: each attempt
/// throws the io_error the ranks agreed on (`check_agreed_error` with `files` and `elsewhere`, "the
/// optimizer step was not applied") and leaves every rank as it was before, bit for bit.
inline void fail_each_write(failing_engine& eng, const model_handles& mh, thread_communicator& comm, const run_spec& s,
                            std::int64_t t, std::size_t writes, int err, const std::vector<std::string>& files,
                            const std::string& elsewhere, std::size_t& failures) {
  for (std::size_t n = 0; n < writes; ++n) {
    CAPTURE(n);
    const held_state before_step = hold(eng);
    if (comm.rank() == 0) {
      eng.storage().fail_write(n, err);
    }
    run_result r;
    r.applied_by_rank.resize(static_cast<std::size_t>(s.world));
    try {
      train_steps(eng, mh, comm, s, t, t + 1, r);
      FAIL("the step did not fail");
    } catch (const io_error& e) {
      check_agreed_error(e, comm.rank(), 0, files, err, elsewhere, "the optimizer step was not applied", failures);
    }
    CAPTURE(comm.rank());
    CHECK(hold(eng) == before_step); // every rank is back at the previous step, bit for bit
  }
}

} // namespace zero::testing
