#pragma once
/// \file
/// `io_queue`: the requests of a posix or uring storage and the queue of their pieces, between the
/// threads that submit and wait and the I/O threads that do the work. A request is cut into pieces
/// of at most a block; an I/O thread takes pieces, transfers them and reports each one done; a
/// request is complete when its last piece is. Every member may be called from any thread.

#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/storage/detail/files.hpp"
#include "zero/storage/storage.hpp"

#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero::detail {

/// One request: what the caller asked for, and how it went.
struct io_request {
  io_op op;
  std::shared_ptr<const open_file> file; // keeps the descriptor open until the last piece is done
  std::uint64_t offset;
  std::size_t bytes;
  std::size_t pieces_left;
  io_failure failure; // the first piece's failure; err 0 while none failed
};

/// One piece of a request: at most a block, transferred by one I/O thread.
struct io_piece {
  io_request* request; // stays valid: std::map nodes do not move, and a request outlives its pieces
  std::byte* data;
  std::uint64_t offset;
  std::size_t bytes;
};

/// The requests of one storage and their pending pieces (see the file comment).
class io_queue {
public:
  explicit io_queue(std::string_view storage_name) : storage_name_(storage_name) {}
  io_queue(const io_queue&) = delete;
  io_queue& operator=(const io_queue&) = delete;

  /// Starts a request of `bytes` bytes at `offset` of `file`, cut into pieces of at most `block`
  /// bytes (> 0), and returns its ticket. A request of 0 bytes is complete at once.
  storage_ticket submit(io_op op, const storage_file& file, std::uint64_t offset, std::byte* data, std::size_t bytes,
                        std::size_t block) {
    const std::size_t pieces = (bytes + block - 1) / block;
    std::lock_guard lock(mutex_);
    const storage_ticket ticket = next_++;
    pieces_left_ += pieces;
    io_request& r =
        requests_.try_emplace(ticket, io_request{op, file.handle(), offset, bytes, pieces, {}}).first->second;
    for (std::size_t done = 0; done < bytes; done += block) {
      pending_.push_back(io_piece{&r, data + done, offset + done, std::min(block, bytes - done)});
    }
    if (pieces > 0) {
      work_.notify_all();
    }
    return ticket;
  }

  /// Blocks until the request of `ticket` is complete and forgets it.
  /// \throws io_error when it failed (see `request_error`); usage_error for a ticket this storage
  ///         never gave. A ticket already waited for (by `wait` or `wait_all`) returns at once.
  void wait(storage_ticket ticket) {
    std::unique_lock lock(mutex_);
    if (ticket == 0 || ticket >= next_) {
      throw usage_error(cat(storage_name_, " storage: wait for ticket ", std::to_string(ticket),
                            ", which this storage never gave (its tickets so far are 1 to ", std::to_string(next_ - 1),
                            ")"));
    }
    // Found again after each wake-up: a wait_all on another thread may have forgotten it meanwhile.
    auto it = requests_.find(ticket);
    done_.wait(lock, [&] {
      it = requests_.find(ticket);
      return it == requests_.end() || it->second.pieces_left == 0;
    });
    if (it == requests_.end()) {
      return;
    }
    const io_request r = std::move(it->second);
    requests_.erase(it);
    lock.unlock();
    if (r.failure.err != 0) {
      throw request_error(r.op, r.file->path, r.offset, r.bytes, r.failure);
    }
  }

  /// Blocks until every request is complete and forgets them all.
  /// \throws io_error of the failed request with the smallest ticket, saying how many more failed.
  void wait_all() {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return pieces_left_ == 0; });
    std::optional<io_error> first;
    std::size_t more = 0;
    for (const auto& [ticket, r] : requests_) {
      if (r.failure.err != 0) {
        if (first) {
          ++more;
        } else {
          first.emplace(request_error(r.op, r.file->path, r.offset, r.bytes, r.failure));
        }
      }
    }
    auto finished = std::move(requests_); // the descriptors close outside the lock
    requests_.clear();
    lock.unlock();
    if (first) {
      throw with_more_failures(*first, more);
    }
  }

  /// For an I/O thread: appends up to `most` pending pieces to `out` and returns how many. With
  /// `block`, waits until there is one, and returns 0 only once the queue is stopped. Pieces of a
  /// request that already failed are completed here without I/O.
  std::size_t take(std::vector<io_piece>& out, std::size_t most, bool block) {
    std::unique_lock lock(mutex_);
    std::size_t taken = 0;
    while (taken < most) {
      if (pending_.empty()) {
        if (!block || taken > 0 || stopped_) {
          break;
        }
        work_.wait(lock, [&] { return stopped_ || !pending_.empty(); });
        continue;
      }
      const io_piece piece = pending_.front();
      pending_.pop_front();
      if (piece.request->failure.err != 0) {
        finish_locked(*piece.request, {});
        continue;
      }
      out.push_back(piece);
      ++taken;
    }
    return taken;
  }

  /// For an I/O thread: `piece` is done, successfully when `failure.err` is 0.
  void finish(const io_piece& piece, const io_failure& failure) {
    std::lock_guard lock(mutex_);
    finish_locked(*piece.request, failure);
  }

  /// Completes every pending piece as cancelled (ECANCELED, no I/O) and makes `take` return 0 once
  /// the queue is empty, so the I/O threads end after the pieces they hold.
  void stop() noexcept {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    for (const io_piece& piece : pending_) {
      finish_locked(*piece.request, io_failure{.err = ECANCELED});
    }
    pending_.clear();
    work_.notify_all();
  }

private:
  void finish_locked(io_request& r, const io_failure& failure) {
    if (failure.err != 0 && r.failure.err == 0) {
      r.failure = failure;
    }
    --pieces_left_;
    if (--r.pieces_left == 0) {
      done_.notify_all();
    }
  }

  std::string_view storage_name_;
  std::mutex mutex_;
  std::condition_variable work_; // pieces pending, or stopped
  std::condition_variable done_; // a request completed
  std::deque<io_piece> pending_;
  std::map<storage_ticket, io_request> requests_; // ordered: wait_all reports the smallest ticket's error
  storage_ticket next_ = 1;
  std::size_t pieces_left_ = 0; // of every request
  bool stopped_ = false;
};

} // namespace zero::detail
