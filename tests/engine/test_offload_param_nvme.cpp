// ZeRO-Infinity's parameter offload (`offload_param.device: nvme`, stage 3): the rank's shard in a
// file of the storage policy, the same bits as in memory with any optimizer offload, and what a
// failed write or read leaves.

#include "nvme_harness.hpp"
#include "same_run.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using zero::dtype;
using namespace zero::testing;

namespace {

/// `offload_param` on NVMe under `dir`, with `buffers` bounce buffers and `max_in_cpu` elements kept in
/// host memory (0: every range in the file), and `optimizer` ("none", "cpu" or "nvme", its state file
/// under `dir` too).
std::string param_nvme(const fs::path& dir, const std::string& optimizer = "none", int buffers = 2,
                       std::int64_t max_in_cpu = 0) {
  std::string out = R"("offload_param": {"device": "nvme", "nvme_path": ")" + dir.string() + R"(", "buffer_count": )" +
                    std::to_string(buffers) + R"(, "max_in_cpu": )" + std::to_string(max_in_cpu) + "}";
  if (optimizer == "cpu") {
    out += R"(, "offload_optimizer": {"device": "cpu"})";
  } else if (optimizer == "nvme") {
    out += R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + dir.string() + R"(", "buffer_count": 2})";
  }
  return out;
}

} // namespace

TEST_CASE("offload_param nvme trains to the in-memory bits with the optimizer in memory, on the host or on NVMe") {
  scratch_dir dir("param-nvme-bits");
  for_each_training_shape({3}, [&](run_spec s) {
    const auto want = train_with_engine(s);
    for (const char* optimizer : {"none", "cpu", "nvme"}) {
      if (s.type == dtype::f32 && std::string(optimizer) == "none") {
        continue; // refused: see the last test case
      }
      // One or two bounce buffers; every range in the file, or the first ones in host memory.
      for (std::int64_t max_in_cpu : {0, 640}) {
        CAPTURE(optimizer);
        CAPTURE(max_in_cpu);
        s.zero_extra = param_nvme(dir.path, optimizer, 1 + s.world % 2, max_in_cpu);
        s.top_extra = small_chunks;
        check_same_run(train_with_engine(s), want);
      }
    }
  });
  CHECK(fs::is_empty(dir.path)); // every engine removed its files
}

TEST_CASE("with parameters on NVMe an fp16 overflow skips the step on every rank, as in memory") {
  scratch_dir dir("param-nvme-overflow");
  run_spec s{.stage = 3, .world = 2, .type = dtype::f16, .steps = 6, .overflow_step = 2};
  const auto want = train_with_engine(s);
  for (const char* optimizer : {"none", "nvme"}) {
    CAPTURE(optimizer);
    s.zero_extra = param_nvme(dir.path, optimizer);
    s.top_extra = small_chunks;
    const auto got = train_with_engine(s);
    CHECK(got.params == want.params);
    CHECK(got.scales == want.scales);
    CHECK_FALSE(got.applied[2]);
  }
}

TEST_CASE("the parameter file is 0600, two slots of the shard beyond max_in_cpu; the host keeps that part and "
          "the bounce buffers") {
  scratch_dir dir("param-nvme-memory");
  for (std::int64_t max_in_cpu : {0, 400}) { // 400: the first module's slice (384 elements) in host memory
    CAPTURE(max_in_cpu);
    // Nothing persistent: the device keeps no parameter between uses.
    run_spec s{.stage = 3,
               .world = 2,
               .type = dtype::bf16,
               .persistence_threshold = 0,
               .zero_extra = param_nvme(dir.path, "none", 3, max_in_cpu)};
    with_cpu_engines(s, [&](auto& eng, const model_handles& mh, zero::thread_communicator& comm) {
      zero::testing::run_result r;
      r.applied_by_rank.resize(2);
      zero::testing::train_steps(eng, mh, comm, s, 0, 1, r);
      const auto* file = eng.coordinator()->file();
      REQUIRE(file != nullptr);
      CHECK(file->path().parent_path() == dir.path);
      CHECK((fs::status(file->path()).permissions() & fs::perms::all) ==
            (fs::perms::owner_read | fs::perms::owner_write));
      // The ranges of the shard: those ending within max_in_cpu stay in host memory, the others are
      // in the file twice (posix storage: alignment 1); the bounce buffers hold the largest of those.
      std::size_t resident = 0, in_file = 0, largest = 0;
      for (const auto& seg : eng.layout().segments()) {
        if (seg.shard_offset + seg.slice <= static_cast<std::size_t>(max_in_cpu)) {
          resident = seg.shard_offset + seg.slice;
        } else {
          in_file += seg.slice;
          largest = std::max(largest, seg.slice);
        }
      }
      CHECK(in_file > 0);
      CHECK((max_in_cpu == 0) == (resident == 0));
      const auto m = eng.memory();
      CHECK(m.params == 0); // nothing of the shard on the device
      CHECK(m.nvme == 2 * 2 * in_file);
      CHECK(m.nvme_params == m.nvme);
      CHECK(m.nvme == fs::file_size(file->path()));
      CHECK(m.host_params == 2 * resident);
      CHECK(m.host_buffers == 3 * 2 * largest);
      CHECK(m.host_formula == doctest::Approx(2.0 * static_cast<double>(resident)));
      const double psi_n = static_cast<double>(m.parameters) / 2;
      CHECK(m.formula == doctest::Approx(14 * psi_n)); // gradients and optimizer state only
      CHECK(m.table().find("of which the parameter file " + std::to_string(m.nvme) + " B") != std::string::npos);
    });
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("ENOSPC or EIO at any write of a step with the optimizer on NVMe: every rank at the previous step, "
          "and training goes on") {
  scratch_dir dir("param-nvme-faults");
  run_spec s{.stage = 3,
             .world = 2,
             .type = dtype::bf16,
             .steps = 5,
             .zero_extra = param_nvme(dir.path, "nvme", 2, 400),
             .top_extra = small_chunks};
  run_spec plain = s;
  plain.zero_extra.clear();
  plain.top_extra.clear();
  const auto want = train_with_engine(plain);

  zero::testing::run_result got;
  got.applied_by_rank.resize(2);
  std::size_t failures = 0;
  std::size_t writes_per_step = 0;
  with_failing_engines(
      s, [&](failing_engine& eng, const zero::testing::model_handles& mh, zero::thread_communicator& comm) {
        zero::testing::train_steps(eng, mh, comm, s, 0, 2, got);
        // A step after `hold` writes the image `hold` read back first, then the state and the new
        // parameters: the same number of writes every time.
        static_cast<void>(hold(eng));
        const std::size_t before = eng.storage().writes();
        zero::testing::train_steps(eng, mh, comm, s, 2, 3, got);
        const std::size_t w = eng.storage().writes() - before;
        const std::string params_file = eng.coordinator()->file()->path().string();
        CHECK(eng.coordinator()->file()->resident_elements() > 0); // a rollback restores those in host memory too
        const std::string state_file = eng.optimizer().nvme()->path().string();
        for (auto [err, t] : {std::pair{ENOSPC, 3}, std::pair{EIO, 4}}) {
          zero::testing::fail_each_write(eng, mh, comm, s, t, w, err, {params_file, state_file},
                                         "could not write its optimizer state or parameters", failures);
          static_cast<void>(hold(eng));
          zero::testing::train_steps(eng, mh, comm, s, t, t + 1, got);
        }
        if (comm.rank() == 0) {
          writes_per_step = w;
        }
        zero::testing::collect_params(eng, mh, comm, got);
      });
  CHECK(writes_per_step >= 6);
  CHECK(failures == 2 * writes_per_step);
  CHECK(got.params == want.params); // the failed attempts changed nothing
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("ENOSPC or EIO at any parameter write with the optimizer in memory: the step stays applied, the "
          "unwritten parameters stay in host memory, and training goes on as without the failure") {
  scratch_dir dir("param-nvme-faults-applied");
  // A parameter one step behind must change the gradients it couples into: fp32, or fp16 with a strong
  // coupling (bf16 would round it away).
  struct variant {
    const char* optimizer;
    dtype type;
    float coupling;
  };
  for (const variant v : {variant{"none", dtype::f16, 0.5f}, variant{"cpu", dtype::f32, 1.0f / 64}}) {
    CAPTURE(v.optimizer);
    run_spec s{.stage = 3,
               .world = 2,
               .type = v.type,
               .steps = 8,
               .param_coupling = v.coupling,
               .zero_extra = param_nvme(dir.path, v.optimizer)};
    run_spec plain = s;
    plain.zero_extra.clear();
    const auto want = train_with_engine(plain);
    zero::testing::run_result got;
    got.applied_by_rank.resize(2);
    std::size_t failures = 0;
    with_failing_engines(
        s, [&](failing_engine& eng, const zero::testing::model_handles& mh, zero::thread_communicator& comm) {
          zero::testing::train_steps(eng, mh, comm, s, 0, 1, got);
          const std::size_t before = eng.storage().writes();
          zero::testing::train_steps(eng, mh, comm, s, 1, 2, got);
          const std::size_t w = eng.storage().writes() - before;
          CHECK(w == eng.layout().segments().size()); // one write per range of the shard
          const std::string file = eng.coordinator()->file()->path().string();
          // Steps 2 to 1 + w: write t - 2 of rank 1 fails, with ENOSPC or EIO; the next step writes it again.
          for (std::int64_t t = 2; t < 2 + static_cast<std::int64_t>(w); ++t) {
            const int err = t % 2 == 0 ? ENOSPC : EIO;
            if (comm.rank() == 1) {
              eng.storage().fail_write(static_cast<std::size_t>(t - 2), err);
            }
            const auto steps = eng.global_steps();
            try {
              zero::testing::train_steps(eng, mh, comm, s, t, t + 1, got);
              FAIL("the step did not fail");
            } catch (const zero::io_error& e) {
              check_agreed_error(e, comm.rank(), 1, {file}, err, "could not write its parameters to NVMe",
                                 "the optimizer step was applied", failures);
            }
            CHECK(eng.global_steps() == steps + 1);
            // The harness records a step's result after step() returns: the failed one's by hand.
            got.applied_by_rank[static_cast<std::size_t>(comm.rank())].push_back(true);
          }
          zero::testing::train_steps(eng, mh, comm, s, 2 + static_cast<std::int64_t>(w), s.steps, got);
          zero::testing::collect_params(eng, mh, comm, got);
        });
    CHECK(failures == 4);
    CHECK(got.params == want.params);
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a read that fails during a gather: every rank drops the accumulation at step(), nobody hangs, and "
          "running it again gives the run without the failure") {
  scratch_dir dir("param-nvme-reads");
  for (int world : {2, 3}) {
    CAPTURE(world);
    run_spec s{.stage = 3,
               .world = world,
               .type = dtype::f32,
               .accumulation = 2,
               .steps = 4,
               .zero_extra = param_nvme(dir.path, "cpu", 2)};
    run_spec plain = s;
    plain.zero_extra.clear();
    const auto want = train_with_engine(plain);
    zero::testing::run_result got;
    got.applied_by_rank.resize(static_cast<std::size_t>(world));
    std::size_t failures = 0;
    std::size_t reads_per_step = 0;
    with_failing_engines(
        s, [&](failing_engine& eng, const zero::testing::model_handles& mh, zero::thread_communicator& comm) {
          zero::testing::train_steps(eng, mh, comm, s, 0, 1, got);
          const std::size_t before = eng.storage().reads();
          zero::testing::train_steps(eng, mh, comm, s, 1, 2, got);
          const std::size_t reads = eng.storage().reads() - before;
          CHECK(reads >= 6); // the gathers of two micro-steps and the persistent units after the step
          if (comm.rank() == world - 1) {
            reads_per_step = reads;
          }
          const std::string file = eng.coordinator()->file()->path().string();
          // Read n of the last rank fails, for every n of a step's reads.
          for (std::size_t n = 0; n < reads; ++n) {
            CAPTURE(n);
            if (comm.rank() == world - 1) {
              eng.storage().fail_read(n, EIO);
            }
            const auto attempt = [&] {
              const std::int64_t t = eng.global_steps();
              try {
                zero::testing::train_steps(eng, mh, comm, s, t, t + 1, got);
                return false;
              } catch (const zero::io_error& e) {
                check_agreed_error(e, comm.rank(), world - 1, {file}, EIO, "could not read its parameters from NVMe",
                                   "were dropped", failures);
                CHECK((comm.rank() != world - 1 || std::string(e.what()).find("] read of ") != std::string::npos));
                CHECK(eng.global_steps() == t);
                return true;
              }
            };
            if (!attempt()) {
              // The read of a persistent unit after the step: the step stands, the next one reports it.
              CHECK(n >= reads - 2);
              CHECK(attempt());
            }
          }
          zero::testing::train_steps(eng, mh, comm, s, eng.global_steps(), s.steps, got);
          zero::testing::collect_params(eng, mh, comm, got);
        });
    CHECK(failures == reads_per_step);
    CHECK(got.params == want.params);
  }
  CHECK(fs::is_empty(dir.path));
}

namespace {

/// The posix storage asking for O_DIRECT's 4096-byte alignment, and checking every request for it
/// as `uring_storage` does (a usage_error), so that a build without io_uring tests the alignment too.
class aligned_storage {
public:
  using file_type = zero::posix_storage::file_type;
  static constexpr std::size_t align = 4096;
  explicit aligned_storage(zero::storage_options o = {}) : inner_(o) {}
  [[nodiscard]] std::string_view name() const { return "aligned posix"; }
  [[nodiscard]] std::size_t alignment() const { return align; }
  [[nodiscard]] file_type create(const fs::path& path, std::uint64_t bytes) {
    CHECK(bytes % align == 0);
    return inner_.create(path, bytes);
  }
  [[nodiscard]] file_type open(const fs::path& path) { return inner_.open(path); }
  [[nodiscard]] zero::storage_ticket submit_read(const file_type& f, std::uint64_t offset, std::span<std::byte> dst) {
    check(offset, dst.data(), dst.size());
    return inner_.submit_read(f, offset, dst);
  }
  [[nodiscard]] zero::storage_ticket submit_write(const file_type& f, std::uint64_t offset,
                                                  std::span<const std::byte> src) {
    check(offset, src.data(), src.size());
    return inner_.submit_write(f, offset, src);
  }
  void wait(zero::storage_ticket t) { inner_.wait(t); }
  void wait_all() { inner_.wait_all(); }
  [[nodiscard]] std::size_t requests() const noexcept { return requests_; }

private:
  void check(std::uint64_t offset, const std::byte* data, std::size_t bytes) {
    ++requests_;
    if (offset % align != 0 || reinterpret_cast<std::uintptr_t>(data) % align != 0 || bytes % align != 0) {
      throw zero::usage_error("aligned_storage: a request of " + std::to_string(bytes) + " bytes at offset " +
                              std::to_string(offset) + " is not aligned to 4096");
    }
  }
  zero::posix_storage inner_;
  std::size_t requests_ = 0;
};
static_assert(zero::storage<aligned_storage>);

} // namespace

TEST_CASE("with a storage that asks for O_DIRECT's 4096-byte alignment every request is aligned and the bits are "
          "those of in memory") {
  scratch_dir dir("param-nvme-aligned");
  for (const char* optimizer : {"none", "nvme"}) {
    CAPTURE(optimizer);
    run_spec s{.stage = 3, .world = 2, .type = dtype::bf16, .accumulation = 2, .clip = 1.0};
    const auto want = train_with_engine(s);
    s.zero_extra = param_nvme(dir.path, optimizer, 2, 400); // the first module in host memory, the rest in the file
    zero::testing::run_result got;
    got.applied_by_rank.resize(2);
    std::vector<std::size_t> requests(2);
    zero::run_ranks(2, [&](zero::thread_communicator& comm) {
      zero::config_inputs in;
      in.world_size = 2;
      zero::cpu_backend backend({.threads = 1});
      zero::basic_engine<zero::cpu_backend, zero::thread_communicator, zero::host_allocator, aligned_storage> eng(
          zero::config::from_string(zero::testing::config_json(s), in), comm, backend);
      const auto mh = zero::testing::register_model(eng);
      eng.finalize();
      zero::testing::init_model(eng);
      zero::testing::train_steps(eng, mh, comm, s, 0, s.steps, got);
      zero::testing::collect_params(eng, mh, comm, got);
      requests[static_cast<std::size_t>(comm.rank())] = eng.storage().requests();
      // Every slice in the file starts at an aligned offset: each takes a whole number of 4096-byte blocks.
      CHECK(eng.coordinator()->file()->file_bytes() % 4096 == 0);
    });
    CHECK(requests[0] > 0);
    CHECK(got.params == want.params);
  }
  CHECK(fs::is_empty(dir.path));
}

TEST_CASE("offload_param nvme: a missing nvme_path, a folder that does not exist, too few or too small buffers") {
  scratch_dir dir("param-nvme-bad");
  const auto missing = dir.path / "not-there";
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;
    bool bf16 = true;
    const auto make = [&](const std::string& offload) {
      return zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
          "bf16": {"enabled": )" + std::string(bf16 ? "true" : "false") +
                                       R"(},
          "zero_optimization": {"stage": 3, "offload_param": {)" +
                                       offload + "}}}");
    };
    const auto finalize_with = [&](const std::string& offload) {
      eng_t eng(make(offload), comm, backend);
      static_cast<void>(eng.add_param(eng.add_module("m"), "w", {64, 64}));
      eng.finalize();
    };
    const std::string at = R"("device": "nvme", "max_in_cpu": 0, "nvme_path": ")";
    CHECK_THROWS_WITH_AS(finalize_with(at + missing.string() + R"(")"),
                         doctest::Contains((missing.string() + "/zero-params-").c_str()), zero::io_error);
    CHECK_THROWS_WITH_AS(finalize_with(at + missing.string() + R"(")"), doctest::Contains("(ENOENT)"), zero::io_error);
    CHECK_THROWS_WITH_AS(finalize_with(at + dir.path.string() + R"(", "buffer_count": 0)"),
                         doctest::Contains("offload_param.buffer_count: 0 with device \"nvme\"; NVMe offload of the "
                                           "parameters reads each module's slice through a buffer; expected 1 or more"),
                         zero::config_error);
    CHECK_THROWS_WITH_AS(finalize_with(at + dir.path.string() + R"(", "buffer_size": 1000)"),
                         doctest::Contains("offload_param.buffer_size: 1000 elements cannot hold a module's slice of "
                                           "4096 elements on rank 0"),
                         zero::config_error);
    CHECK_THROWS_WITH_AS(make(R"("device": "nvme")"), doctest::Contains("offload_param.nvme_path: missing"),
                         zero::config_error);
    // fp32 keeps its master weights in the parameters: on NVMe only with the optimizer state off the device.
    bf16 = false;
    CHECK_THROWS_WITH_AS(eng_t(make(at + dir.path.string() + R"(")"), comm, backend),
                         doctest::Contains("\"nvme\" with fp32 parameters needs offload_optimizer.device \"cpu\" or "
                                           "\"nvme\""),
                         zero::config_error);
  });
  CHECK(fs::is_empty(dir.path)); // nothing half-made stays behind
}

TEST_CASE("offload_param nvme: a parameter file truncated before evaluation fails the evaluation's gather, and "
          "gather_all, with an io_error naming the file, instead of computing with zeros") {
  scratch_dir dir("param-nvme-eval");
  // Nothing persistent and nothing in host memory: every gather reads its slice from the file.
  run_spec s{.stage = 3,
             .world = 2,
             .type = dtype::f32,
             .persistence_threshold = 0,
             .zero_extra = param_nvme(dir.path, "cpu", 2, 0)};
  with_cpu_engines(s, [&](auto& eng, const model_handles& mh, zero::thread_communicator& comm) {
    zero::testing::run_result r;
    r.applied_by_rank.resize(2);
    zero::testing::train_steps(eng, mh, comm, s, 0, 1, r);
    const fs::path file = eng.coordinator()->file()->path();
    CHECK(file.parent_path() == dir.path);
    CHECK(file.filename().string().starts_with("zero-params-"));
    CHECK(file.filename().string().ends_with("-rank" + std::to_string(comm.rank()) + ".swap"));
    // What an evaluation reads from the intact file: every parameter's values.
    const auto evaluate = [&](zero::eval_gather mode) {
      std::vector<float> seen;
      auto ev = eng.evaluation(mode);
      for (std::size_t k = 0; k < mh.params.size(); ++k) {
        auto on = eng.gather(mh.modules[static_cast<std::size_t>(zero::testing::small_model()[k].module)]);
        const auto v = eng.param(mh.params[k]);
        seen.insert(seen.end(), v.template as<float>(), v.template as<float>() + v.numel);
      }
      return seen;
    };
    const auto intact = evaluate(zero::eval_gather::per_module);
    REQUIRE(!intact.empty());
    CHECK(std::any_of(intact.begin(), intact.end(), [](float x) { return x != 0.0f; }));
    const fs::path copy = file.string() + ".intact";
    fs::copy_file(file, copy);
    comm.barrier().wait(); // no rank truncates while another still reads
    fs::resize_file(file, 0);
    const auto check_failure = [&](const zero::io_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.starts_with("[zero.io_error] read of "));
      CHECK(what.find("[zero.io_error]", 1) == std::string::npos); // one id prefix
      CHECK(what.find(file.string()) != std::string::npos);
      CHECK(what.find("could not be read from NVMe") != std::string::npos);
      CHECK(e.status() == ENODATA);
    };
    for (const auto mode : {zero::eval_gather::per_module, zero::eval_gather::whole_model}) {
      CAPTURE(static_cast<int>(mode));
      bool threw = false;
      try {
        static_cast<void>(evaluate(mode));
      } catch (const zero::io_error& e) {
        threw = true;
        check_failure(e);
        CHECK(std::string(e.what()).find("for evaluation") != std::string::npos);
      }
      CHECK(threw);
    }
    bool threw = false;
    try {
      auto all = eng.gather_all();
    } catch (const zero::io_error& e) {
      threw = true;
      check_failure(e);
    }
    CHECK(threw);
    // The file back as it was: the same values again, and training goes on (the failures were
    // reported where they happened, not left for the next step).
    comm.barrier().wait();
    fs::copy_file(copy, file, fs::copy_options::overwrite_existing);
    fs::remove(copy);
    CHECK(evaluate(zero::eval_gather::per_module) == intact);
    CHECK(evaluate(zero::eval_gather::whole_model) == intact);
    zero::testing::train_steps(eng, mh, comm, s, 1, 2, r);
    CHECK(r.applied_by_rank[static_cast<std::size_t>(comm.rank())] == std::vector<bool>{true, true});
  });
  CHECK(fs::is_empty(dir.path));
}
