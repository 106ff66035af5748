// The swap files of NVMe offload (include/zero/storage/detail/swap_file.hpp, docs/offload.md "Files"):
// a path with a NUL is refused before the operating system sees it, a user's file at the name is never
// truncated, nothing is left behind when the engine fails half-way, and the files of processes that no
// longer run are removed by the next engine that uses the folder.

#include "nvme_harness.hpp"
#include "part_kit.hpp"
#include "zero/engine/step/nvme_adamw.hpp"
#include "zero/memory/failing_allocator.hpp"
#include "zero/storage/detail/swap_file.hpp"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using zero::testing::scratch_dir;

namespace {

using eng_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;

void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read_text(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    out.insert(e.path().filename().string());
  }
  return out;
}

/// A stage-3 config with both the optimizer state and the parameters on NVMe under `dir`.
std::string both_on_nvme(const std::string& dir) {
  return R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}}, "bf16": {"enabled": true},
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
      "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
         dir + R"("}, "offload_param": {"device": "nvme", "nvme_path": ")" + dir + R"(", "max_in_cpu": 0}}})";
}

/// The pid of a process that has ended.
long dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) {
    ::_exit(0);
  }
  REQUIRE(child > 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return child;
}

} // namespace

TEST_CASE("an nvme_path holding a NUL is refused by name, and the file its C string names is untouched") {
  scratch_dir dir("swap-nul");
  write_text(dir.path / "victim", "precious");
  // The audit's reproduction: "/tmp/x/victim\u0000/y" opened, truncated and removed /tmp/x/victim.
  for (const char* block : {"offload_param", "offload_optimizer"}) {
    CAPTURE(block);
    const std::string json = R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
      "zero_optimization": {"stage": 3, ")" +
                             std::string(block) + R"(": {"device": "nvme", "nvme_path": ")" +
                             (dir.path / "victim").string() + R"(\u0000/y"}}})";
    try {
      static_cast<void>(zero::config::from_string(json));
      FAIL("a NUL in nvme_path was accepted");
    } catch (const zero::config_error& e) {
      const std::string what = e.what();
      CHECK(what.find("zero_optimization." + std::string(block) + ".nvme_path") != std::string::npos);
      CHECK(what.find("with a NUL character (\\u0000) at byte " +
                      std::to_string((dir.path / "victim").string().size())) != std::string::npos);
    }
  }
  CHECK(read_text(dir.path / "victim") == "precious");
}

TEST_CASE("a user's file at the next swap file's name is never truncated; the engine that meets it leaves nothing") {
  scratch_dir dir("swap-exists");
  // A user's 31-byte file, and a hard link to it at the name the optimizer's file will take: the
  // parameter file (serial k) is created first, then the optimizer's (serial k + 1) meets the link.
  write_text(dir.path / "notes.txt", "thirty-one bytes of user notes\n");
  ::chmod((dir.path / "notes.txt").c_str(), 0644);
  const std::size_t k = zero::detail::swap_serial().load();
  const auto taken = dir.path / zero::detail::swap_file_name("optimizer", ::getpid(), k + 1, 0);
  fs::create_hard_link(dir.path / "notes.txt", taken);
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    eng_t eng(zero::config::from_string(both_on_nvme(dir.path.string())), comm, backend);
    const auto m = eng.add_module("m");
    static_cast<void>(eng.add_param(m, "w", {256}));
    try {
      eng.finalize();
      FAIL("finalize created a file over the user's");
    } catch (const zero::io_error& e) {
      const std::string what = e.what();
      CHECK(e.status() == EEXIST);
      CHECK(what.find("creating " + taken.string()) != std::string::npos);
      CHECK(what.find("creates only new files and never truncates one it did not create") != std::string::npos);
    }
  });
  CHECK(read_text(dir.path / "notes.txt") == "thirty-one bytes of user notes\n");
  struct stat st {};
  REQUIRE(::stat((dir.path / "notes.txt").c_str(), &st) == 0);
  CHECK((st.st_mode & 07777) == 0644);
  CHECK(st.st_nlink == 2);
  // The parameter file made before the failure is gone too.
  CHECK(names_in(dir.path) == std::set<std::string>{"notes.txt", taken.filename().string()});
}

TEST_CASE("an nvme_adamw that fails at any allocation after creating its file removes the file") {
  scratch_dir dir("swap-alloc");
  using failing_host = zero::failing_allocator<zero::host_allocator>;
  using adamw = zero::nvme_adamw<zero::cpu_backend, zero::host_allocator, zero::posix_storage, failing_host>;
  const auto layout = zero::testing::make_layout({}, {{"w", 1000}, {"b", 24}}, {});
  std::vector<float> params(layout.total_size(), 0.5f);
  zero::cpu_backend backend({.threads = 1});
  zero::cpu_backend::stream_type stream;
  zero::posix_storage storage;
  bool built = false;
  std::size_t failures = 0;
  // Fail the n-th host allocation, for every n until a construction needs no more. Among them are the
  // chunk buffers, allocated after the file: the destructor that used to remove the file never runs
  // for a constructor that throws, so the file stayed behind at its full size.
  for (std::size_t n = 0; n < 64 && !built; ++n) {
    CAPTURE(n);
    failing_host host(zero::failure_plan{.fail_at = n});
    try {
      adamw opt(layout,
                zero::adamw_placement{.rank = 0,
                                      .partitioned = false,
                                      .grad_type = zero::dtype::f32,
                                      .params = reinterpret_cast<std::byte*>(params.data())},
                std::vector<std::size_t>(layout.param_count(), 0), {zero::param_group{}}, backend, host, stream,
                storage, 0, zero::nvme_options{.dir = dir.path, .chunk_elements = 64, .buffer_count = 2});
      built = true;
      CHECK(names_in(dir.path).size() == 1); // its own file, while it lives
    } catch (const zero::memory_error&) {
      ++failures;
    }
    CHECK((built || names_in(dir.path).empty()));
  }
  CHECK(built);
  CHECK(failures >= 2); // the host shards before the file, the chunk buffers after it
  CHECK(names_in(dir.path).empty());
}

TEST_CASE("the next engine on an nvme_path removes the swap files of processes that no longer run, and says so") {
  scratch_dir dir("swap-stale");
  const long gone = dead_pid();
  const auto stale_opt = zero::detail::swap_file_name("optimizer", gone, 0, 0);
  const auto stale_par = zero::detail::swap_file_name("params", gone, 3, 1);
  const auto locked = zero::detail::swap_file_name("optimizer", gone, 7, 2);             // a live lock holds it
  const auto live = zero::detail::swap_file_name("optimizer", ::getpid(), 1'000'000, 0); // this process runs
  const std::string others[] = {"zero-optimizer-x-0-rank0.swap", "zero-params-" + std::to_string(gone) + ".swap",
                                "notes.swap"};
  for (const auto& n : {stale_opt, stale_par, locked, live}) {
    write_text(dir.path / n, "state");
  }
  for (const auto& n : others) {
    write_text(dir.path / n, "user");
  }
  const int fd = ::open((dir.path / locked).c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_SH) == 0);
  std::vector<std::string> lines;
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    eng_t eng(zero::config::from_string(both_on_nvme(dir.path.string())), comm, backend);
    eng.set_log([&](const std::string& line) { lines.push_back(line); });
    static_cast<void>(eng.add_param(eng.add_module("m"), "w", {256}));
    eng.finalize();
    const auto names = names_in(dir.path);
    CHECK_FALSE(names.count(stale_opt));
    CHECK_FALSE(names.count(stale_par));
    CHECK(names.count(locked));
    CHECK(names.count(live));
    for (const auto& n : others) {
      CHECK(names.count(n));
    }
  });
  ::close(fd);
  std::size_t said = 0;
  for (const auto& l : lines) {
    if (l.find("[zero] removed ") == 0) {
      CHECK(l.find(" under " + dir.path.string() + " left by processes that no longer run: ") != std::string::npos);
      CHECK(l.find(stale_opt) != std::string::npos);
      CHECK(l.find(stale_par) != std::string::npos);
      ++said;
    }
  }
  CHECK(said >= 1);
  // The engine's own files went with it.
  const auto after = names_in(dir.path);
  CHECK(after.size() == 2 + std::size(others));
}

TEST_CASE("buffer counts no host can hold and aio blocks under 4 bytes are refused by key before anything is made") {
  scratch_dir dir("swap-counts");
  const std::string d = dir.path.string();
  // The audit's values: these used to allocate bounce or chunk buffers until the host ran out.
  // Plain names, not a structured binding: clang 14 cannot capture one in a lambda.
  for (const auto& row :
       {std::pair{std::string("offload_param"), std::string("1e8")}, {std::string("offload_optimizer"), "1e9"}}) {
    const std::string block = row.first;
    const std::string count = row.second;
    CAPTURE(block);
    const auto part = [&](const std::string& name) {
      return R"(")" + name + R"(": {"device": "nvme", "nvme_path": ")" + d + R"(")" +
             (name == "offload_param" ? R"(, "max_in_cpu": 0)" : "") +
             (name == block ? R"(, "buffer_count": )" + count : std::string()) + "}";
    };
    const std::string json = R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, )" +
                             part("offload_optimizer") + ", " + part("offload_param") + "}}";
    zero::run_ranks(1, [&](zero::thread_communicator& comm) {
      zero::cpu_backend backend({.threads = 1});
      eng_t eng(zero::config::from_string(json), comm, backend);
      static_cast<void>(eng.add_param(eng.add_module("m"), "w", {4096}));
      try {
        eng.finalize();
        FAIL("finalize accepted buffer_count " << count);
      } catch (const zero::config_error& e) {
        const std::string what = e.what();
        CHECK(what.find("zero_optimization." + block +
                        ".buffer_count: " + std::to_string(static_cast<long long>(std::stod(count))) +
                        " buffers of ") != std::string::npos);
        CHECK(what.find("of host memory, more than this host's ") != std::string::npos);
      }
    });
    CHECK(names_in(dir.path).empty());
  }
  const auto with_block = [&](int bytes) {
    return zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
      "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                                     d + R"("}}, "aio": {"block_size": )" + std::to_string(bytes) + "}}");
  };
  for (int bytes : {1, 3}) {
    const std::string want = "aio.block_size: found " + std::to_string(bytes) + "; expected at least 4 bytes";
    CHECK_THROWS_WITH_AS(with_block(bytes), doctest::Contains(want.c_str()), zero::config_error);
  }
  const auto small = with_block(256);
  bool noted = false;
  for (const auto& n : small.notes) {
    noted = noted || n.find("aio.block_size: 256 bytes per request is legal but slow") != std::string::npos;
  }
  CHECK(noted);
}
