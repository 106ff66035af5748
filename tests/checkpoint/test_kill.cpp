// Atomicity: a process saving a checkpoint is SIGKILLed at every durable step of the save (the
// save's observer raises SIGKILL at step k). After each kill the last complete checkpoint loads and
// equals what was saved, and latest names a complete checkpoint.

#include "ckpt_harness.hpp"

#include <csignal>
#include <doctest/doctest.h>
#include <fstream>
#include <mutex>
#include <sys/wait.h>
#include <unistd.h>

namespace zt = zero::testing;
namespace fs = std::filesystem;
using zero::checkpoint::save_event;

namespace {

struct event_id {
  int rank;
  std::string what;
  std::size_t index;
};

const zt::run_spec spec{.stage = 1, .world = 2, .steps = 4, .batch = 64};
const zt::ckpt_spec cspec{.frozen = true};

/// How the second save replaces an existing tag: one exchange, or moving the old one aside first.
bool exchange = true;

/// Trains 2 steps and saves "a"; trains 2 more and saves `second` (maybe "a" again) with `observer`.
void save_twice(const fs::path& dir, const std::string& second,
                const std::function<void(const save_event&)>& observer) {
  zt::with_engine(spec, cspec, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_and_train(eng, mh, comm, spec, 2);
    eng.save(dir, "a");
    zt::train_range(eng, mh, comm, spec, 2, 4);
    eng.save(dir, second, zero::checkpoint::save_options{observer, exchange});
  });
}

/// Every durable step of the second save, in the order seen.
std::vector<event_id> events_of(const std::string& second) {
  const auto dir = zt::scratch("kill-probe");
  std::mutex mu;
  std::vector<event_id> out;
  save_twice(dir, second, [&](const save_event& e) {
    std::lock_guard lock(mu);
    out.push_back({e.rank, std::string(e.what), e.index});
  });
  return out;
}

/// Runs `save_twice` in a child process killed at step `at`; returns the child's wait status.
int killed_at(const fs::path& dir, const std::string& second, const event_id& at) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      save_twice(dir, second, [&](const save_event& e) {
        if (e.rank == at.rank && e.what == at.what && e.index == at.index) {
          ::raise(SIGKILL);
        }
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

} // namespace

TEST_CASE("a save killed at any durable step leaves the last complete checkpoint loadable and intact") {
  // What each save holds, from a run that was not interrupted.
  const auto ref = zt::scratch("kill-ref");
  save_twice(ref, "b", {});
  const auto first = zt::read_snapshot(ref, "a");
  const auto second = zt::read_snapshot(ref, "b");
  REQUIRE(first.global_steps == 2);
  REQUIRE(second.global_steps == 4);

  std::size_t kills = 0;
  // A new tag; then replacing the existing one, by exchange and by moving the old one aside.
  // Plain names, not structured bindings: CAPTURE is a lambda, which cannot capture a binding before Clang 16.
  for (const auto& run : {std::pair<std::string, bool>{"b", true}, {"a", true}, {"a", false}}) {
    const std::string& tag = run.first;
    const bool swap = run.second;
    exchange = swap;
    const auto events = events_of(tag);
    CHECK(events.size() >= 20);
    for (std::size_t k = 0; k < events.size(); ++k) {
      const auto& at = events[k];
      CAPTURE(tag);
      CAPTURE(swap);
      CAPTURE(at.rank);
      CAPTURE(at.what);
      CAPTURE(at.index);
      const auto dir = zt::scratch("kill");
      const int status = killed_at(dir, tag, at);
      REQUIRE(WIFSIGNALED(status));
      REQUIRE(WTERMSIG(status) == SIGKILL);
      ++kills;
      // latest names a complete checkpoint, which verifies and holds exactly one of the two saves.
      const auto got = zt::read_snapshot(dir);
      CHECK((got == first || got == second));
      const std::string latest = zero::checkpoint::reader(dir).info().tag;
      CHECK((latest == "a" || latest == tag));
      if (got == second) {
        CHECK(latest == tag);
      }
      // The engine loads it (2 ranks, as saved).
      zt::with_engine(spec, cspec, [&](zt::test_engine& eng, const zt::model_handles&, zero::thread_communicator&) {
        eng.load(dir);
        CHECK(eng.global_steps() == got.global_steps);
      });
      // And damage to it is always found, naming the file: a flipped bit, then a cut.
      const auto shard = zero::checkpoint::resolve(dir) / "rank-00001.bin";
      {
        std::fstream io(shard, std::ios::in | std::ios::out | std::ios::binary);
        char c = 0;
        io.seekg(8);
        io.read(&c, 1);
        io.seekp(8);
        io.put(static_cast<char>(c ^ 4));
      }
      CHECK(zt::error_of([&] { zero::checkpoint::reader(dir).verify(); }).find(shard.string() + ": xxh64 ") !=
            std::string::npos);
      fs::resize_file(shard, fs::file_size(shard) - 4);
      CHECK(zt::error_of([&] { zero::checkpoint::reader(dir).verify(); }).find(shard.string() + ": ") !=
            std::string::npos);
    }
  }
  CHECK(kills >= 60);
  MESSAGE("killed " << kills << " saves at distinct durable steps");
}

TEST_CASE("a run with its optimizer state on NVMe, killed with SIGKILL mid-training, resumes from its last "
          "checkpoint and loses nothing") {
  const auto dir = zt::scratch("kill-nvme");
  const auto swap = zt::scratch("kill-nvme-swap");
  zt::run_spec s{.stage = 2, .world = 2, .type = zero::dtype::bf16, .steps = 4, .batch = 64, .param_coupling = 0};
  const auto want = zt::train_plain(s); // in memory, without a break
  s.zero_extra = R"("offload_optimizer": {"device": "nvme", "nvme_path": ")" + swap.string() + R"("})";
  s.top_extra = R"("aio": {"block_size": 256, "queue_depth": 1})";
  const pid_t pid = ::fork();
  if (pid == 0) {
    try {
      zt::with_engine(s, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
        zt::init_and_train(eng, mh, comm, s, 2);
        eng.save(dir, "at-2");
        // Train on until killed: the parent waits for the checkpoint, then for more steps to start.
        for (std::int64_t t = 2;; ++t) {
          zt::train_range(eng, mh, comm, s, 2 + t % 2, 3 + t % 2);
        }
      });
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);
  }
  // Kill it while it trains with its state on NVMe (after the save, during later steps).
  for (int waited = 0; waited < 6000 && !fs::exists(dir / "latest"); ++waited) {
    ::usleep(10'000);
  }
  ::usleep(50'000);
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  // The killed run's state files stay behind (a SIGKILL runs no destructor); a new run makes its own.
  CHECK_FALSE(fs::is_empty(swap));
  zt::run_result resumed;
  resumed.applied_by_rank.resize(2);
  zt::with_engine(s, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    eng.load(dir, "at-2");
    CHECK(eng.global_steps() == 2);
    zero::testing::train_steps(eng, mh, comm, s, 2, 4, resumed);
    zero::testing::collect_params(eng, mh, comm, resumed);
  });
  CHECK(resumed.params == want.params);
}
