#pragma once
/// \file
/// The probes that measure a machine's `machine_rates` (zero/tools/rates.hpp): the AdamW step of a
/// backend and of the host, the copies between the backend's host memory and its device, and a
/// storage's read and write bandwidth in a folder; and the memory a plan may assume
/// (`available_host_memory`, `free_storage_bytes`). `zero-report --save-rates`, `zero-estimate
/// --plan` without `--rates` and the examples' `--config auto-plan` measure with them.
///
/// AdamW and the copies are the engine's own probes (`measure_adamw_rate`, `measure_copy_rates` in
/// zero/engine/step/update_rates.hpp, which `offload_optimizer.ratio: "auto"` runs too): after a warm-up call,
/// 1, 2, 4, ... calls until a batch takes `min_seconds`, its rate reported. AdamW runs the mixed-precision
/// step the engine runs (fp32 master, m and v; bf16 gradients and parameters); copies move one buffer
/// each way. The storage probe runs once to warm up, then `repeats` times, and reports the best run: it
/// writes a file with the storage policy, flushes it to the drive (fdatasync, counted in the write time), drops it from
/// the page cache (posix_fadvise) and reads it back, so a page cache does not stand in for the drive. The probes
/// allocate what they measure: 16 bytes per AdamW element, twice the copy size, and the file on the drive.

#include "zero/backend/backend.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/engine/step/update_rates.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"
#include "zero/tools/plan.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::tools {

/// How long the probes run: `bytes` sizes each (AdamW over bytes / 16 elements, copies of `bytes`,
/// a file of `bytes`); AdamW and the copies are timed over calls that take `min_seconds` together, the
/// storage `repeats` times after a warm-up.
struct probe_options {
  std::size_t bytes = std::size_t{256} << 20;
  int repeats = 3;
  double min_seconds = 0.05;
};

namespace detail {
/// The best of `repeats` timed runs of `run` (after one untimed), in seconds.
template <class Run> double best_seconds(int repeats, Run&& run) {
  run();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < std::max(repeats, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    run();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // A run too short for the clock still took some time.
  return std::max(best, 1e-9);
}
} // namespace detail

/// Parameters per second of `b`'s AdamW over `elements` elements (fp32 master, m, v; bf16 gradients and
/// parameters), in `b`'s memory: the engine's probe (`measure_adamw_rate`), timed over calls that take at least
/// `min_seconds` together. \throws memory_error when the buffers cannot be allocated.
template <backend B> [[nodiscard]] double probe_adamw(B& b, std::size_t elements, double min_seconds = 0.05) {
  const auto s = b.make_stream();
  return measure_adamw_rate(b, s, b.get_allocator(),
                            update_sample{.param = dtype::bf16,
                                          .grad = dtype::bf16,
                                          .elements = std::max<std::size_t>(elements, 1),
                                          .min_seconds = min_seconds});
}

/// Bytes per second of `b.copy` from the backend's host memory (`offload_allocator_t<B>`: pinned for
/// CUDA) to its device memory and back, `bytes` each way: {host to device, device to host}; the engine's
/// probe (`measure_copy_rates`).
template <backend B>
requires can_copy<B>
[[nodiscard]] std::pair<double, double> probe_copy(B& b, std::size_t bytes, double min_seconds = 0.05) {
  const auto s = b.make_stream();
  return measure_copy_rates(b, s, b.get_allocator(), std::max<std::size_t>(bytes, 1), min_seconds);
}

/// Bytes per second that storage `s` reads and writes a file of `bytes` (rounded up to whole pieces)
/// in `dir`, in pieces of `piece` bytes with up to 8 in flight: {read, write}. The write includes
/// the flush to the drive; the file, `dir/zero-probe-<pid>.tmp` (mode 0600), is removed afterwards,
/// also when a request fails. \throws io_error naming the file for a failed create, request or flush.
template <storage S>
[[nodiscard]] std::pair<double, double> probe_storage(S& s, const std::filesystem::path& dir, std::uint64_t bytes,
                                                      std::size_t piece = std::size_t{1} << 20, int repeats = 1) {
  const std::size_t align = std::max<std::size_t>(s.alignment(), 1);
  const std::size_t chunk = std::max(piece / align, std::size_t{1}) * align;
  const std::uint64_t pieces = std::max<std::uint64_t>((bytes + chunk - 1) / chunk, 1);
  const std::filesystem::path path = dir / cat("zero-probe-", std::to_string(::getpid()), ".tmp");
  struct remover {
    const std::filesystem::path& path;
    ~remover() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  } remove_after{path};
  auto file = s.create(path, pieces * chunk);
  constexpr std::size_t depth = 8;
  std::vector<buffer<std::byte, host_allocator>> ring;
  for (std::size_t i = 0; i < std::min<std::uint64_t>(depth, pieces); ++i) {
    ring.push_back(storage_buffer(s, chunk));
    std::memset(ring.back().data(), 0x5a, chunk);
  }
  std::vector<storage_ticket> tickets(ring.size(), 0);
  // A request that fails throws from its wait while later ones are still in flight into `ring`: they
  // must complete before the buffers go (the storage concept's rule), so unwinding waits for them.
  struct drain_on_throw {
    S& s;
    ~drain_on_throw() {
      if (std::uncaught_exceptions() > 0) {
        try {
          s.wait_all();
        } catch (...) { // NOLINT(bugprone-empty-catch): the first error is already on its way
        }
      }
    }
  } drain{s};
  auto pass = [&](bool write) {
    for (std::uint64_t i = 0; i < pieces; ++i) {
      const std::size_t slot = i % ring.size();
      if (tickets[slot] != 0) {
        s.wait(tickets[slot]);
      }
      const std::span<std::byte> at(ring[slot].data(), chunk);
      tickets[slot] = write ? s.submit_write(file, i * chunk, at) : s.submit_read(file, i * chunk, at);
    }
    s.wait_all();
    std::fill(tickets.begin(), tickets.end(), storage_ticket{0});
  };
  // Flushes the written pages to the drive, then drops the file's pages from the page cache, so the
  // write counts the drive and the read comes from it.
  auto flush = [&](bool drop) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || ::fdatasync(fd) != 0 || (drop && ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) != 0)) {
      const int err = errno;
      if (fd >= 0) {
        ::close(fd);
      }
      throw io_error(cat("probe_storage: flushing ", path.string(), " failed: ", std::strerror(err)), err);
    }
    ::close(fd);
  };
  const double write = detail::best_seconds(repeats, [&] {
    pass(true);
    flush(false);
  });
  flush(true);
  const double read = detail::best_seconds(repeats, [&] {
    pass(false);
    flush(true);
  });
  const auto total = static_cast<double>(pieces * chunk);
  return {total / read, total / write};
}

/// Bytes of host memory available to a new allocation: MemAvailable of /proc/meminfo (what the kernel
/// can give without swapping), else the free pages sysconf reports.
[[nodiscard]] inline std::int64_t available_host_memory() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  std::int64_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      return kib * 1024;
    }
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::int64_t>(pages) * page : 0;
}

/// Bytes free to this user on the file system of `dir`. \throws io_error naming `dir` when it
/// cannot be asked (no such folder).
[[nodiscard]] inline std::int64_t free_storage_bytes(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto space = std::filesystem::space(dir, ec);
  if (ec) {
    throw io_error(cat("cannot read the free space of ", dir.string(), ": ", ec.message()), ec.value());
  }
  return static_cast<std::int64_t>(std::min<std::uintmax_t>(space.available, std::numeric_limits<std::int64_t>::max()));
}

/// The host's side of the rates: the host AdamW on a `cpu_backend` with every hardware thread, and,
/// with `nvme_dir`, a `posix_storage` (DeepSpeed's `aio` defaults) in that folder. The device's
/// rates stay 0 (`has_device_rates` false), its name `device_name`.
[[nodiscard]] inline machine_rates measure_host_rates(std::string device_name, const probe_options& p,
                                                      const std::optional<std::filesystem::path>& nvme_dir) {
  machine_rates r;
  r.device = std::move(device_name);
  const std::size_t elements = std::max<std::size_t>(p.bytes / 16, 1);
  cpu_backend host({.threads = 0});
  r.host_adamw = probe_adamw(host, elements, p.min_seconds);
  r.host_threads = host.threads();
  if (nvme_dir) {
    posix_storage storage;
    std::tie(r.nvme_read, r.nvme_write) = probe_storage(storage, *nvme_dir, p.bytes);
    r.nvme_path = nvme_dir->string();
  }
  return r;
}

/// The rates of this machine: `device`'s AdamW and copies (named `device_name` in the result) and the
/// host's (`measure_host_rates`).
template <backend B>
[[nodiscard]] machine_rates measure_rates(B& device, std::string device_name, const probe_options& p,
                                          const std::optional<std::filesystem::path>& nvme_dir = std::nullopt) {
  machine_rates r = measure_host_rates(std::move(device_name), p, nvme_dir);
  const std::size_t elements = std::max<std::size_t>(p.bytes / 16, 1);
  r.device_adamw = probe_adamw(device, elements, p.min_seconds);
  std::tie(r.host_to_device, r.device_to_host) = probe_copy(device, p.bytes, p.min_seconds);
  return r;
}

} // namespace zero::tools
