// The storage policies against the drive they write to.
//
// BM_storage/<policy>/<op>/bytes:N moves N bytes between host memory and one file of N bytes in one
// request, which the storage cuts into block_size pieces (uring_storage: io_uring with O_DIRECT,
// queue_depth pieces in flight; posix_storage: pread/pwrite on thread_count threads through the
// page cache). In the same run it measures the ceiling: a plain loop of O_DIRECT pread/pwrite of
// block_size bytes, one at a time on one thread, over the same file and buffer (best of 3). It
// reports:
//   bytes_per_second  the storage's bytes moved per second (one iteration: submit, then wait)
//   raw_bytes/s       the O_DIRECT loop's bytes per second
//   raw_ratio         bytes_per_second divided by raw_bytes/s
// The file is written in full before anything is read, so reads come from the drive and not from
// unwritten extents (which read as zeros without I/O). posix_storage goes through the page cache:
// its writes are timed up to an fdatasync, and before each of its reads the file's pages are
// dropped (posix_fadvise DONTNEED, untimed), so both measure the drive too.
//
// Environment:
//   ZERO_BENCH_STORAGE_DIR          where the file goes (default: the current directory); a file
//                                   system with O_DIRECT (not tmpfs before Linux 6.6), the NVMe
//                                   drive to measure
//   ZERO_BENCH_STORAGE_BYTES        comma-separated sizes (default 67108864,1073741824: 64 MiB, 1 GiB)
//   ZERO_BENCH_STORAGE_BLOCK        block_size (default 1048576, DeepSpeed's)
//   ZERO_BENCH_STORAGE_QUEUE_DEPTH  queue_depth (default 8, DeepSpeed's)
//   ZERO_BENCH_STORAGE_THREADS      thread_count (default 1, DeepSpeed's)
// A policy that cannot run here (no io_uring, no O_DIRECT) is reported as skipped with the reason.
// Keep --benchmark_format=json for machine-readable output.
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"
#if defined(ZERO_HAS_URING)
#include "zero/storage/uring_storage.hpp"
#endif

#include <algorithm>
#include <benchmark/benchmark.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace {

enum class op { read, write };

std::size_t env_size(const char* name, std::size_t fallback) {
  if (const char* s = std::getenv(name)) {
    return std::max<std::size_t>(1, std::strtoull(s, nullptr, 10));
  }
  return fallback;
}

std::filesystem::path bench_dir() {
  const char* s = std::getenv("ZERO_BENCH_STORAGE_DIR");
  return s != nullptr && *s != '\0' ? std::filesystem::path(s) : std::filesystem::current_path();
}

std::vector<std::size_t> bench_sizes() {
  std::vector<std::size_t> sizes;
  if (const char* s = std::getenv("ZERO_BENCH_STORAGE_BYTES")) {
    std::stringstream list(s);
    for (std::string item; std::getline(list, item, ',');) {
      sizes.push_back(std::max<std::size_t>(1, std::strtoull(item.c_str(), nullptr, 10)));
    }
  }
  if (sizes.empty()) {
    sizes = {std::size_t{64} << 20, std::size_t{1} << 30};
  }
  return sizes;
}

zero::storage_options bench_options() {
  return {.block_size = env_size("ZERO_BENCH_STORAGE_BLOCK", std::size_t{1} << 20),
          .queue_depth = static_cast<unsigned>(env_size("ZERO_BENCH_STORAGE_QUEUE_DEPTH", 8)),
          .thread_count = static_cast<unsigned>(env_size("ZERO_BENCH_STORAGE_THREADS", 1))};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Seconds of one pass of O_DIRECT pread/pwrite of `block` bytes at a time over `n` bytes of `path`.
/// \throws std::runtime_error saying which call failed.
double raw_direct_seconds(const std::filesystem::path& path, op o, std::byte* data, std::size_t n, std::size_t block) {
  const int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    throw std::runtime_error("raw loop: open(O_DIRECT) of " + path.string() + " failed: " + std::strerror(errno));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t len = std::min(block, n - at);
    const ssize_t r = o == op::read ? ::pread(fd, data + at, len, static_cast<off_t>(at))
                                    : ::pwrite(fd, data + at, len, static_cast<off_t>(at));
    if (r != static_cast<ssize_t>(len)) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error("raw loop: " + std::string(o == op::read ? "pread" : "pwrite") + " returned " +
                               std::to_string(r) + (r < 0 ? std::string(": ") + std::strerror(err) : ""));
    }
  }
  const double s = seconds_since(t0);
  ::close(fd);
  return s;
}

template <class S> void bench_storage(benchmark::State& state, op o, std::size_t n) {
  const zero::storage_options options = bench_options();
  std::optional<S> storage;
  try {
    storage.emplace(options);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
    return;
  }
  S& s = *storage;
  const std::filesystem::path path = bench_dir() / ("zero_bench_storage_" + std::string(s.name()) + ".bin");
  try {
    auto file = s.create(path, n);
    // 4096-aligned whatever the storage asks, for the O_DIRECT loop; written once so no page
    // faults are timed.
    zero::buffer<std::byte, zero::host_allocator> data(zero::host_allocator{}, n, zero::memory_tag::other,
                                                       std::max<std::size_t>(4096, s.alignment()));
    for (std::size_t i = 0; i < n; ++i) {
      data[i] = static_cast<std::byte>(i * 131 % 251);
    }
    const std::span<std::byte> dst(data.data(), n);
    const std::span<const std::byte> src(data.data(), n);
    s.wait(s.submit_write(file, 0, src)); // the whole file written before anything reads it
    if (::fdatasync(file.fd()) != 0) {
      throw std::runtime_error("fdatasync failed: " + std::string(std::strerror(errno)));
    }
    double raw = 1e30;
    for (int rep = 0; rep < 3; ++rep) {
      raw = std::min(raw, raw_direct_seconds(path, o, data.data(), n, options.block_size));
    }
    constexpr bool cached = !S::direct; // through the page cache: drop it before reads, sync writes
    double total = 0;
    for (auto _ : state) {
      if (cached && o == op::read) {
        ::posix_fadvise(file.fd(), 0, static_cast<off_t>(n), POSIX_FADV_DONTNEED);
      }
      const auto t0 = std::chrono::steady_clock::now();
      s.wait(o == op::read ? s.submit_read(file, 0, dst) : s.submit_write(file, 0, src));
      if (cached && o == op::write && ::fdatasync(file.fd()) != 0) {
        throw std::runtime_error("fdatasync failed: " + std::string(std::strerror(errno)));
      }
      const double t = seconds_since(t0);
      total += t;
      state.SetIterationTime(t);
    }
    const auto bytes = static_cast<double>(n) * static_cast<double>(state.iterations());
    state.SetBytesProcessed(static_cast<std::int64_t>(bytes));
    state.counters["raw_bytes/s"] =
        benchmark::Counter(static_cast<double>(n) / raw, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
    state.counters["raw_ratio"] = total > 0 ? bytes / total / (static_cast<double>(n) / raw) : 0.0;
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
  std::error_code ec;
  std::filesystem::remove(path, ec);
}

template <class S> void register_policy(std::string_view name, std::size_t n) {
  for (const op o : {op::write, op::read}) {
    const std::string label =
        "BM_storage/" + std::string(name) + (o == op::read ? "/read" : "/write") + "/bytes:" + std::to_string(n);
    benchmark::RegisterBenchmark(label.c_str(), [o, n](benchmark::State& state) { bench_storage<S>(state, o, n); })
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
}

} // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    return 1;
  }
  for (const std::size_t n : bench_sizes()) {
#if defined(ZERO_HAS_URING)
    register_policy<zero::uring_storage>("uring", n);
#endif
    register_policy<zero::posix_storage>("posix", n);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
