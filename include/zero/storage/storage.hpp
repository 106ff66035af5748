#pragma once
/// \file
/// The storage policy: where ZeRO-Infinity's offloaded state lives on disk (NVMe), and how it gets
/// there. A fourth policy beside the communicator, the allocator and the backend; see
/// docs/storage.md.
///
/// A storage creates and opens files and moves bytes between them and host memory asynchronously:
/// `submit_read` and `submit_write` return a `storage_ticket` at once, `wait(ticket)` completes one
/// request (or throws `io_error` naming the file, the operation, the offset, the bytes and errno),
/// `wait_all()` completes every request in flight. Buffers stay owned by the caller, who must not
/// touch (or free) them until the request's `wait` or a `wait_all` returned or threw. `alignment()`
/// is what every buffer address, file offset and length must be a multiple of (4096 for O_DIRECT).
///
/// The policies: `posix_storage` (pread/pwrite on worker threads, any alignment),
/// `uring_storage` (io_uring with O_DIRECT, `zero::uring`), and `failing_storage<S>`, which
/// injects errors for tests. A framework brings its own by satisfying `zero::storage`.
///
/// This header also reads DeepSpeed's `aio` block into `storage_options` (`storage_options_from`),
/// so it includes `zero/config/config.hpp` and with it nlohmann-json, which `zero::zero` brings.

#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/host_allocator.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unistd.h>
#include <utility>

namespace zero {

/// The id of one asynchronous request of a storage: returned by `submit_read`/`submit_write`, given
/// to `wait`. Tickets of one storage count up from 1; 0 is never a ticket.
using storage_ticket = std::uint64_t;

/// How a storage cuts and queues its requests: DeepSpeed's `aio` block (see `storage_options_from`).
struct storage_options {
  /// Bytes per piece: a request larger than this is cut into pieces of this size, each one I/O
  /// (the uring storage rounds it down to a multiple of the file's alignment, at least one).
  std::size_t block_size = std::size_t{1} << 20;
  /// Pieces in flight per I/O thread (the uring storage's ring depth; the posix storage has one
  /// piece in flight per thread and ignores it).
  unsigned queue_depth = 8;
  /// I/O threads: each posix thread runs one pread/pwrite at a time; each uring thread owns a ring.
  unsigned thread_count = 1;
  /// uring: `io_uring_submit` after each piece instead of once per batch of pieces.
  bool single_submit = false;
  /// uring: reap completions and submit more while earlier pieces are in flight, instead of
  /// submitting a batch and draining all of it before the next.
  bool overlap_events = true;
  friend bool operator==(const storage_options&, const storage_options&) = default;
};

/// The largest `block_size`, `queue_depth` and `thread_count` a storage accepts.
inline constexpr std::int64_t max_storage_block_size = std::int64_t{1} << 30;
inline constexpr std::int64_t max_storage_queue_depth = 32768; // io_uring's most entries per ring
inline constexpr std::int64_t max_storage_thread_count = 1024;

namespace detail {

/// Throws `E` naming `key` when `value` is outside [1, most].
template <class E> void check_storage_count(std::string_view key, std::int64_t value, std::int64_t most) {
  if (value < 1 || value > most) {
    throw E(cat(key, ": expected an integer from 1 to ", std::to_string(most), ", got ", std::to_string(value)));
  }
}

} // namespace detail

/// The `storage_options` of DeepSpeed's `aio` block: `block_size`, `queue_depth`, `thread_count`
/// (`intra_op_parallelism`), `single_submit`, `overlap_events`, as they are.
/// \throws config_error naming the key (`aio.block_size`, `aio.queue_depth`, `aio.thread_count`) and
///         what it expects when a value is below 1 or above `max_storage_block_size` (1 GiB),
///         `max_storage_queue_depth` (32768) or `max_storage_thread_count` (1024).
[[nodiscard]] inline storage_options storage_options_from(const aio_config& aio) {
  detail::check_storage_count<config_error>("aio.block_size", aio.block_size, max_storage_block_size);
  detail::check_storage_count<config_error>("aio.queue_depth", aio.queue_depth, max_storage_queue_depth);
  detail::check_storage_count<config_error>("aio.thread_count", aio.thread_count, max_storage_thread_count);
  return storage_options{.block_size = static_cast<std::size_t>(aio.block_size),
                         .queue_depth = static_cast<unsigned>(aio.queue_depth),
                         .thread_count = static_cast<unsigned>(aio.thread_count),
                         .single_submit = aio.single_submit,
                         .overlap_events = aio.overlap_events};
}

namespace detail {

/// Throws `usage_error` naming the field when `o` is outside what `storage_options_from` allows.
inline void check_storage_options(std::string_view storage_name, const storage_options& o) {
  const auto check = [&](std::string_view field, std::uint64_t value, std::int64_t most) {
    if (value < 1 || value > static_cast<std::uint64_t>(most)) {
      throw usage_error(cat(storage_name, " storage: storage_options::", field, " must be from 1 to ",
                            std::to_string(most), ", got ", std::to_string(value)));
    }
  };
  check("block_size", o.block_size, max_storage_block_size);
  check("queue_depth", o.queue_depth, max_storage_queue_depth);
  check("thread_count", o.thread_count, max_storage_thread_count);
}

/// An open file descriptor and what messages and checks need of it; closed when the last owner (the
/// `storage_file`, or a request still in flight) lets go.
struct open_file {
  open_file(int fd_, std::filesystem::path path_, std::size_t alignment_) noexcept
      : fd(fd_), path(std::move(path_)), alignment(alignment_) {}
  open_file(const open_file&) = delete;
  open_file& operator=(const open_file&) = delete;
  ~open_file() {
    if (fd >= 0) {
      ::close(fd); // nothing was written through a cache that close could report (see docs/storage.md)
    }
  }
  int fd;
  std::filesystem::path path;
  /// What buffer addresses, offsets and lengths of requests on it must be multiples of.
  std::size_t alignment;
};

} // namespace detail

/// A file of the posix and uring storages (their `file_type`): owns an open descriptor, moves, never
/// copies. Its requests share the descriptor, so destroying the file while requests on it are in
/// flight is safe: the descriptor closes when the last of them completes.
class storage_file {
public:
  /// No file.
  storage_file() = default;
  /// Takes `fd`, opened on `path`, whose requests must be aligned to `alignment`.
  storage_file(int fd, std::filesystem::path path, std::size_t alignment)
      : file_(std::make_shared<const detail::open_file>(fd, std::move(path), alignment)) {}
  storage_file(storage_file&&) noexcept = default;
  storage_file& operator=(storage_file&&) noexcept = default;
  storage_file(const storage_file&) = delete;
  storage_file& operator=(const storage_file&) = delete;
  ~storage_file() = default;

  /// True when this holds a file.
  [[nodiscard]] bool is_open() const noexcept { return file_ != nullptr; }
  /// The path it was created or opened with, for messages; empty when `!is_open()`.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return file_ ? file_->path : empty_path(); }
  /// The descriptor, -1 when `!is_open()`.
  [[nodiscard]] int fd() const noexcept { return file_ ? file_->fd : -1; }
  /// What buffer addresses, offsets and lengths of its requests must be multiples of.
  [[nodiscard]] std::size_t alignment() const noexcept { return file_ ? file_->alignment : 1; }
  /// The shared descriptor, for a storage policy: a request holds it until it completes.
  [[nodiscard]] const std::shared_ptr<const detail::open_file>& handle() const noexcept { return file_; }

private:
  static const std::filesystem::path& empty_path() noexcept {
    static const std::filesystem::path empty;
    return empty;
  }
  std::shared_ptr<const detail::open_file> file_;
};

/// A storage policy (see the file comment and docs/storage.md):
/// - `S::file_type`: a movable file that owns its descriptor and closes it when destroyed (when its
///   last request completes, for `storage_file`); `f.path()` names it in messages.
/// - `s.name()`: "posix", "uring", ...; `s.alignment()`: what every buffer address, file offset
///   and length must be a multiple of (1: anything goes).
/// - `s.create(path, bytes)`: a new file of exactly `bytes` bytes, mode 0600; an existing file (or a
///   symbolic link) at `path` is an error, never truncated; `s.open(path)`: an existing one, the last
///   component of `path` not followed if it is a symbolic link.
/// - `s.submit_read(f, offset, dst)`, `s.submit_write(f, offset, src)`: start a request, return its
///   ticket; the request may still be running when they return.
/// - `s.wait(ticket)`: completes one request, throws `io_error` (status() = errno) if it failed;
///   `s.wait_all()`: completes every request in flight, then throws the first error.
template <class S>
concept storage = std::movable<typename S::file_type> &&
    requires(S& s, const S& cs, const typename S::file_type& f, const std::filesystem::path& path, std::uint64_t bytes,
             std::uint64_t offset, std::span<std::byte> dst, std::span<const std::byte> src, storage_ticket t) {
  { f.path() } -> std::convertible_to<const std::filesystem::path&>;
  { cs.name() } -> std::convertible_to<std::string_view>;
  { cs.alignment() } -> std::convertible_to<std::size_t>;
  { s.create(path, bytes) } -> std::same_as<typename S::file_type>;
  { s.open(path) } -> std::same_as<typename S::file_type>;
  { s.submit_read(f, offset, dst) } -> std::same_as<storage_ticket>;
  { s.submit_write(f, offset, src) } -> std::same_as<storage_ticket>;
  s.wait(t);
  s.wait_all();
};

/// Host memory for requests of `s`: `bytes` rounded up to a multiple of `s.alignment()`, its address
/// aligned to `s.alignment()` (at least `buffer_alignment`), from `alloc`, counted under `tag`.
/// \throws memory_error when the allocator fails or the rounded size overflows.
template <storage S, host_allocator_policy A = host_allocator>
[[nodiscard]] buffer<std::byte, A> storage_buffer(const S& s, std::size_t bytes, A alloc = A{},
                                                  memory_tag tag = memory_tag::other) {
  const std::size_t align = s.alignment();
  if (bytes > std::numeric_limits<std::size_t>::max() - align) {
    throw memory_error(detail::cat("storage_buffer: ", std::to_string(bytes), " bytes rounded up to ",
                                   std::to_string(align), " overflow the address space"));
  }
  const std::size_t rounded = (bytes + align - 1) / align * align;
  return buffer<std::byte, A>(std::move(alloc), rounded, tag, align > buffer_alignment ? align : buffer_alignment);
}

} // namespace zero
