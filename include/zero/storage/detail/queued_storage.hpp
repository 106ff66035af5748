#pragma once
/// \file
/// `queued_storage<Derived>`: what the posix and uring storages share, everything but how an I/O
/// thread transfers pieces. It owns the options, the request queue (`io_queue`) and the I/O
/// threads, creates and opens files, checks and cuts requests, and waits. `Derived` names itself
/// (`storage_name`), gives the least alignment of its requests (`least_alignment`), says whether its
/// files are opened with O_DIRECT (`direct`), and starts its threads with `start` from its constructor.

#include "zero/storage/detail/files.hpp"
#include "zero/storage/detail/io_queue.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace zero::detail {

/// The request side of a storage whose I/O threads take pieces from an `io_queue` (see the file
/// comment). Every member may be called from any thread at once; each ticket must be waited for by
/// one caller. A moved-from storage may only be destroyed or assigned to.
template <class Derived> class queued_storage {
public:
  using file_type = storage_file;

  /// "posix", "uring".
  [[nodiscard]] std::string_view name() const noexcept { return Derived::storage_name; }
  /// What every buffer address, file offset and length must be a multiple of: the storage's least
  /// (1 for posix, 4096 for uring), raised to the direct-I/O alignment of any file it created or
  /// opened so far.
  [[nodiscard]] std::size_t alignment() const noexcept { return state_->alignment.load(std::memory_order_relaxed); }
  /// The options it was built with.
  [[nodiscard]] const storage_options& options() const noexcept { return state_->options; }

  /// Creates the new file `path` with exactly `bytes` bytes (reserved with fallocate where the file
  /// system can), read-write, mode 0600 whatever the umask, with O_DIRECT for uring. A file or a
  /// symbolic link already at `path` is never opened or truncated (O_EXCL); a create that fails after
  /// the open removes the file it made.
  /// \throws io_error naming the path, the step and errno (EEXIST: something is at `path`, and whether
  ///         it is a symbolic link; EINVAL with O_DIRECT: the file system refuses O_DIRECT, and what to
  ///         use instead); io_error EINVAL for a path holding a NUL.
  [[nodiscard]] file_type create(const std::filesystem::path& path, std::uint64_t bytes) {
    return noted(open_storage_file(name(), path, bytes, Derived::direct));
  }
  /// Opens the existing file `path` for reading and writing; as `create`.
  [[nodiscard]] file_type open(const std::filesystem::path& path) {
    return noted(open_storage_file(name(), path, std::nullopt, Derived::direct));
  }

  /// Starts reading `dst.size()` bytes at `offset` of `file` into `dst`, which the caller keeps
  /// alive and untouched until the request is waited for, and returns its ticket. The request is
  /// cut into pieces of `block_size` bytes (rounded down to a multiple of the alignment).
  /// \throws usage_error naming the value and the alignment when the address of `dst`, `offset` or
  ///         the length is not a multiple of the file's alignment, or when `file` holds no file.
  [[nodiscard]] storage_ticket submit_read(const file_type& file, std::uint64_t offset, std::span<std::byte> dst) {
    return submit(io_op::read, file, offset, dst.data(), dst.size());
  }
  /// Starts writing `src` at `offset` of `file`; as `submit_read`.
  [[nodiscard]] storage_ticket submit_write(const file_type& file, std::uint64_t offset,
                                            std::span<const std::byte> src) {
    // The I/O threads only read from a write's buffer: the const comes off to share io_piece.
    return submit(io_op::write, file, offset, const_cast<std::byte*>(src.data()), src.size());
  }

  /// Blocks until the request of `ticket` completed.
  /// \throws io_error (status() = errno) naming the request, the path and errno when it failed;
  ///         usage_error for a ticket this storage never gave (one already waited for returns at once).
  void wait(storage_ticket ticket) { state_->queue.wait(ticket); }
  /// Blocks until every request completed, then throws the `io_error` of the first (smallest
  /// ticket) failed request, saying how many more failed: no I/O touches a buffer after it throws.
  void wait_all() { state_->queue.wait_all(); }

protected:
  /// \throws usage_error naming the field when `options` is out of range (`storage_options_from`'s limits).
  explicit queued_storage(const storage_options& options)
      : state_((check_storage_options(Derived::storage_name, options), std::make_unique<state>(options))) {}

  /// Starts an I/O thread running `run` (which owns what it captures until the thread ends).
  template <class Run> void start(Run&& run) { state_->threads.emplace_back(std::forward<Run>(run)); }
  /// The queue the I/O threads take pieces from; it lives as long as they do.
  [[nodiscard]] io_queue& queue() noexcept { return state_->queue; }

private:
  struct state {
    explicit state(const storage_options& o) : options(o), alignment(Derived::least_alignment) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    // Drops the pieces no thread has started; then the threads (declared last, destroyed first)
    // finish the ones they hold and join.
    ~state() { queue.stop(); }

    storage_options options;
    io_queue queue{Derived::storage_name};
    std::atomic<std::size_t> alignment;
    std::vector<std::jthread> threads;
  };

  file_type noted(file_type file) {
    std::size_t seen = state_->alignment.load(std::memory_order_relaxed);
    while (seen < file.alignment() && !state_->alignment.compare_exchange_weak(seen, file.alignment())) {
    }
    return file;
  }

  storage_ticket submit(io_op op, const file_type& file, std::uint64_t offset, std::byte* data, std::size_t bytes) {
    const std::size_t align = std::max(file.alignment(), Derived::least_alignment);
    check_request(name(), op, file, offset, data, bytes, align);
    const std::size_t block = std::max(align, state_->options.block_size / align * align);
    return state_->queue.submit(op, file, offset, data, bytes, block);
  }

  std::unique_ptr<state> state_;
};

} // namespace zero::detail
