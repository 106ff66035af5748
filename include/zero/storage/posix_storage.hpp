#pragma once
/// \file
/// `posix_storage`: the storage policy over `pread`/`pwrite` through the page cache, on any file
/// system, with no alignment asked of buffers, offsets or lengths.
///
/// Asynchrony: a request is cut into pieces of `block_size` bytes and queued; `thread_count` I/O
/// threads (std::jthread, started with the storage) take the pieces in order, one at a time each,
/// and transfer them with `pread`/`pwrite`, looping over partial transfers and EINTR. So
/// `submit_read`/`submit_write` return before the I/O is done, even with one thread, and requests
/// overlap with the caller's work. `queue_depth`, `single_submit` and `overlap_events` are for
/// io_uring and change nothing here.
///
/// Errors: a piece that fails stops its request (its other pieces are dropped without I/O); `wait`
/// throws `io_error` naming the request, the path and errno. A read that reaches the end of the
/// file is an error (ENODATA, "the file ends at byte ..."), and so is a write that writes nothing
/// (ENOSPC, "made no progress").
///
/// Durability: writes land in the page cache; nothing is fsynced (the files hold state that is
/// rebuilt on restart, not checkpoints). Thread safety: every member may be called from any thread
/// at once; each ticket must be waited for by one caller. Destroying the storage drops the pieces
/// no thread has started and waits for the ones running: wait for requests first to learn how they
/// went. A moved-from storage may only be destroyed or assigned to.

#include "zero/storage/detail/io_queue.hpp"
#include "zero/storage/detail/queued_storage.hpp"
#include "zero/storage/storage.hpp"

#include <cerrno>
#include <cstddef>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace zero {

/// The storage policy over pread/pwrite on I/O threads (see the file comment). Its members are
/// those of `detail::queued_storage`: `name`, `alignment`, `options`, `create`, `open`,
/// `submit_read`, `submit_write`, `wait`, `wait_all`.
class posix_storage : public detail::queued_storage<posix_storage> {
public:
  static constexpr std::string_view storage_name = "posix";
  static constexpr std::size_t least_alignment = 1;
  static constexpr bool direct = false;

  /// Starts `options.thread_count` I/O threads.
  /// \throws usage_error naming the field when `options` is out of range (`storage_options_from`'s
  ///         limits); std::system_error when a thread cannot start.
  explicit posix_storage(storage_options options = {}) : queued_storage(options) {
    for (unsigned t = 0; t < options.thread_count; ++t) {
      start([&queue = queue()] { run(queue); });
    }
  }

private:
  /// An I/O thread: one piece at a time until the queue stops.
  static void run(detail::io_queue& queue) {
    std::vector<detail::io_piece> piece;
    while (queue.take(piece, 1, true) == 1) {
      queue.finish(piece.front(), transfer(piece.front()));
      piece.clear();
    }
  }

  static detail::io_failure transfer(const detail::io_piece& p) {
    // op and file do not change after submit: read without the queue's lock.
    const detail::io_request& r = *p.request;
    std::size_t done = 0;
    while (done < p.bytes) {
      const auto at = static_cast<off_t>(p.offset + done);
      const ssize_t n = r.op == detail::io_op::read ? ::pread(r.file->fd, p.data + done, p.bytes - done, at)
                                                    : ::pwrite(r.file->fd, p.data + done, p.bytes - done, at);
      if (n < 0) {
        if (errno == EINTR) {
          continue;
        }
        return {.err = errno};
      }
      if (n == 0) {
        return {.err = r.op == detail::io_op::read ? ENODATA : ENOSPC, .stalled = true, .at = p.offset + done};
      }
      done += static_cast<std::size_t>(n);
    }
    return {};
  }
};

static_assert(storage<posix_storage>);

} // namespace zero
