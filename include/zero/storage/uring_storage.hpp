#pragma once
/// \file
/// `uring_storage`: the storage policy over io_uring (liburing) with `O_DIRECT`, what DeepSpeed's
/// aio does for NVMe offload: no page cache, no copy, the drive's bandwidth. Needs `zero::uring`.
///
/// Alignment: O_DIRECT asks every buffer address, file offset and length to be a multiple of the
/// file system's direct-I/O alignment; `alignment()` is the most of 4096 and what `statx` reports
/// for the files this storage created or opened so far (ask it after creating the files, before
/// allocating buffers; `storage_buffer` allocates them). A misaligned request throws `usage_error`.
/// A file system that refuses O_DIRECT (tmpfs before Linux 6.6) makes `create`/`open` throw
/// `io_error` (EINVAL) naming the path and saying so.
///
/// Asynchrony: a request is cut into pieces of `block_size` bytes (rounded down to a multiple of the
/// alignment) and queued. `thread_count` I/O threads each own a ring of `queue_depth` entries and
/// keep up to `queue_depth` pieces in flight in it. `single_submit` calls `io_uring_submit` after
/// each piece instead of once per batch; `overlap_events` takes new pieces as soon as earlier ones
/// complete, instead of submitting a batch and draining all of it before taking the next. A short
/// completion is submitted again for the rest; a completion with `res < 0` fails its request with
/// errno `-res`; a read at the end of the file fails with ENODATA, a write that writes nothing with
/// ENOSPC. A piece that fails stops its request: its other pieces are dropped without I/O.
///
/// Thread safety: every member may be called from any thread at once (the engine uses one storage
/// from one thread); each ticket must be waited for by one caller. Destroying the storage drops the
/// pieces no ring has started and waits for those in flight. If a ring itself fails (an
/// `io_uring_submit` or wait error other than EINTR, EAGAIN or EBUSY, which no kernel zero met
/// gives), the pieces in it are failed with that errno without waiting for them, so the kernel may
/// still touch their buffers: drop those buffers with the storage. A moved-from storage may only be
/// destroyed or assigned to.

#if !defined(ZERO_HAS_URING)
#error "zero/storage/uring_storage.hpp needs liburing: link the CMake target zero::uring, which defines ZERO_HAS_URING"
#endif

#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/storage/detail/files.hpp"
#include "zero/storage/detail/io_queue.hpp"
#include "zero/storage/detail/queued_storage.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <liburing.h>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero {

/// The storage policy over io_uring and O_DIRECT (see the file comment). Its members are those of
/// `detail::queued_storage`: `name`, `alignment`, `options`, `create`, `open`, `submit_read`,
/// `submit_write`, `wait`, `wait_all`.
class uring_storage : public detail::queued_storage<uring_storage> {
public:
  static constexpr std::string_view storage_name = "uring";
  static constexpr std::size_t least_alignment = 4096;
  static constexpr bool direct = true;

  /// Sets up `options.thread_count` rings of `options.queue_depth` entries and their I/O threads.
  /// \throws usage_error naming the field when `options` is out of range (`storage_options_from`'s
  ///         limits); io_error (status() = errno) when `io_uring_queue_init` fails, ENOSYS or EPERM
  ///         where the kernel or a container's seccomp policy has no io_uring (use `posix_storage`
  ///         there); std::system_error when a thread cannot start.
  explicit uring_storage(storage_options options = {}) : queued_storage(options) {
    std::vector<std::unique_ptr<ring>> rings;
    for (unsigned t = 0; t < options.thread_count; ++t) {
      rings.push_back(std::make_unique<ring>(options.queue_depth));
    }
    for (auto& r : rings) {
      // The thread owns its ring: it is torn down when the thread ends, after its last completion.
      start([&queue = queue(), r = std::move(r), &o = this->options()] { run(queue, r->uring, o); });
    }
  }

private:
  /// A ring of `depth` entries, set up and torn down.
  struct ring {
    explicit ring(unsigned depth) {
      if (const int rc = io_uring_queue_init(depth, &uring, 0); rc < 0) {
        const bool absent = rc == -ENOSYS || rc == -EPERM;
        throw io_error(detail::cat("uring storage: io_uring_queue_init(", std::to_string(depth),
                                   ") failed: ", detail::errno_text(-rc),
                                   absent
                                       ? "; this kernel has no io_uring or a seccomp policy (a container's) blocks it: "
                                         "use the posix storage"
                                   : rc == -ENOMEM ? "; the locked-memory limit (ulimit -l) may be too low for the ring"
                                                   : ""),
                       -rc);
      }
    }
    ring(const ring&) = delete;
    ring& operator=(const ring&) = delete;
    ~ring() { io_uring_queue_exit(&uring); }
    io_uring uring{};
  };

  /// An I/O thread with its ring: keeps up to queue_depth pieces in flight until the queue stops.
  static void run(detail::io_queue& queue, io_uring& uring, const storage_options& o) {
    struct slot {
      detail::io_piece piece{};
      std::size_t done = 0; // bytes of the piece transferred so far (short completions)
    };
    const unsigned depth = o.queue_depth;
    std::vector<slot> slots(depth);
    std::vector<unsigned> free_slots(depth);
    std::iota(free_slots.rbegin(), free_slots.rend(), 0u);
    std::vector<detail::io_piece> batch;
    unsigned in_flight = 0;
    int broken = 0; // errno of a failed ring: every later piece fails with it

    const auto finish = [&](unsigned i, const detail::io_failure& failure) {
      queue.finish(slots[i].piece, failure);
      free_slots.push_back(i);
      --in_flight;
    };
    const auto prepare = [&](unsigned i) {
      const slot& s = slots[i];
      io_uring_sqe* sqe = io_uring_get_sqe(&uring);
      if (sqe == nullptr) {
        // Not expected: each prepared entry is a busy slot, and the ring has an entry per slot.
        finish(i, {.err = EBUSY});
        return;
      }
      const detail::io_request& r = *s.piece.request;
      const auto rest = static_cast<unsigned>(s.piece.bytes - s.done);
      if (r.op == detail::io_op::read) {
        io_uring_prep_read(sqe, r.file->fd, s.piece.data + s.done, rest, s.piece.offset + s.done);
      } else {
        io_uring_prep_write(sqe, r.file->fd, s.piece.data + s.done, rest, s.piece.offset + s.done);
      }
      sqe->user_data = i;
      if (o.single_submit) {
        submit_ready(uring, broken);
      }
    };
    const auto complete = [&](const io_uring_cqe& cqe) {
      const auto i = static_cast<unsigned>(cqe.user_data);
      slot& s = slots[i];
      const detail::io_request& r = *s.piece.request;
      const bool read = r.op == detail::io_op::read;
      if (cqe.res == -EINTR || cqe.res == -EAGAIN) {
        prepare(i);
      } else if (cqe.res < 0) {
        finish(i, {.err = -cqe.res});
      } else if (cqe.res == 0) {
        finish(i, {.err = read ? ENODATA : ENOSPC, .stalled = true, .at = s.piece.offset + s.done});
      } else if ((s.done += static_cast<std::size_t>(cqe.res)) == s.piece.bytes) {
        finish(i, {});
      } else if (read && (s.piece.offset + s.done) % r.file->alignment != 0) {
        // An O_DIRECT read is short only at the end of the file; the rest cannot be asked for aligned.
        finish(i, {.err = ENODATA, .stalled = true, .at = s.piece.offset + s.done});
      } else {
        prepare(i); // the rest of a short transfer
      }
    };

    while (true) {
      if (o.overlap_events ? in_flight < depth : in_flight == 0) {
        batch.clear();
        queue.take(batch, depth - in_flight, in_flight == 0);
        if (batch.empty() && in_flight == 0) {
          return; // stopped
        }
        for (const detail::io_piece& piece : batch) {
          if (broken != 0) {
            queue.finish(piece, {.err = broken});
            continue;
          }
          const unsigned i = free_slots.back();
          free_slots.pop_back();
          slots[i] = slot{piece, 0};
          ++in_flight;
          prepare(i);
        }
      }
      if (in_flight == 0) {
        continue;
      }
      // Submits what is prepared and not yet submitted, and waits for one completion.
      const int rc = broken != 0 ? -broken : io_uring_submit_and_wait(&uring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY && rc != -ETIME) {
        broken = -rc;
        for (unsigned i = 0; i < depth; ++i) {
          if (std::find(free_slots.begin(), free_slots.end(), i) == free_slots.end()) {
            finish(i, {.err = broken});
          }
        }
        continue;
      }
      io_uring_cqe* cqe = nullptr;
      while (io_uring_peek_cqe(&uring, &cqe) == 0 && cqe != nullptr) {
        const io_uring_cqe seen = *cqe;
        io_uring_cqe_seen(&uring, cqe);
        complete(seen);
      }
    }
  }

  /// io_uring_submit, again after EINTR; EAGAIN and EBUSY leave the entries for the next submit.
  static void submit_ready(io_uring& uring, int& broken) {
    int rc = 0;
    do {
      rc = io_uring_submit(&uring);
    } while (rc == -EINTR);
    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && broken == 0) {
      broken = -rc;
    }
  }
};

static_assert(storage<uring_storage>);

} // namespace zero
