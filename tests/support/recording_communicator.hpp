#pragma once
// A communicator for tests that watch how the engine communicates: it forwards every operation to a
// thread_communicator and records, per rank, each operation posted (kind and element count) and how
// many of each kind are posted and not yet waited for.

#include "zero/comm/thread_communicator.hpp"

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::testing {

/// One rank's record (each rank's communicator has its own; only that rank's thread writes it).
struct comm_record {
  struct op {
    std::string kind;
    std::size_t count = 0;
  };
  /// Every operation in the order it was posted.
  std::vector<op> posted;
  /// Per kind: posted and not yet waited for, now and at most.
  std::map<std::string, int> in_flight;
  std::map<std::string, int> max_in_flight;

  /// The posted operations of one kind.
  [[nodiscard]] std::vector<std::size_t> counts(std::string_view kind) const {
    std::vector<std::size_t> out;
    for (const auto& o : posted) {
      if (o.kind == kind) {
        out.push_back(o.count);
      }
    }
    return out;
  }
};

/// Forwards to `thread_communicator` and keeps a `comm_record`; see the file comment.
class recording_communicator {
public:
  class handle {
  public:
    handle(thread_communicator::handle h, comm_record* rec, std::string kind)
        : h_(std::move(h)), rec_(rec), kind_(std::move(kind)) {}
    handle(handle&& o) noexcept
        : h_(std::move(o.h_)), rec_(std::exchange(o.rec_, nullptr)), kind_(std::move(o.kind_)) {}
    handle& operator=(handle&& o) noexcept {
      if (this != &o) {
        settle();
        h_ = std::move(o.h_);
        rec_ = std::exchange(o.rec_, nullptr);
        kind_ = std::move(o.kind_);
      }
      return *this;
    }
    handle(const handle&) = delete;
    handle& operator=(const handle&) = delete;
    ~handle() { settle(); }

    void wait() {
      settle();
      h_.wait();
    }

  private:
    // The operation counts as waited for once its owner waits or drops it.
    void settle() noexcept {
      if (rec_ != nullptr) {
        --rec_->in_flight[kind_];
        rec_ = nullptr;
      }
    }
    thread_communicator::handle h_;
    comm_record* rec_;
    std::string kind_;
  };

  recording_communicator(thread_communicator& inner, comm_record& rec) : inner_(&inner), rec_(&rec) {}

  [[nodiscard]] int rank() const noexcept { return inner_->rank(); }
  [[nodiscard]] int size() const noexcept { return inner_->size(); }
  [[nodiscard]] std::string_view name() const noexcept { return inner_->name(); }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return inner_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) noexcept { inner_->set_timeout(t); }

  template <element_type T> [[nodiscard]] handle all_reduce(const T* send, T* recv, std::size_t count, reduce_op op) {
    return track("all_reduce", count, inner_->all_reduce(send, recv, count, op));
  }
  template <element_type T>
  [[nodiscard]] handle reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op) {
    return track("reduce_scatter", count, inner_->reduce_scatter(send, recv, count, op));
  }
  template <element_type T> [[nodiscard]] handle all_gather(const T* send, T* recv, std::size_t count) {
    return track("all_gather", count, inner_->all_gather(send, recv, count));
  }
  template <element_type T> [[nodiscard]] handle broadcast(const T* send, T* recv, std::size_t count, int root) {
    return track("broadcast", count, inner_->broadcast(send, recv, count, root));
  }
  template <element_type T> [[nodiscard]] handle send(const T* buf, std::size_t count, int peer) {
    return track("send", count, inner_->send(buf, count, peer));
  }
  template <element_type T> [[nodiscard]] handle recv(T* buf, std::size_t count, int peer) {
    return track("recv", count, inner_->recv(buf, count, peer));
  }

private:
  handle track(std::string kind, std::size_t count, thread_communicator::handle h) {
    rec_->posted.push_back({kind, count});
    const int now = ++rec_->in_flight[kind];
    auto& peak = rec_->max_in_flight[kind];
    peak = std::max(peak, now);
    return {std::move(h), rec_, std::move(kind)};
  }

  thread_communicator* inner_;
  comm_record* rec_;
};

static_assert(can_all_reduce<recording_communicator> && can_reduce_scatter<recording_communicator> &&
              can_all_gather<recording_communicator> && can_broadcast<recording_communicator> &&
              can_send_recv<recording_communicator>);

/// Runs `fn(comm)` on `world` in-process ranks, each with a recording communicator writing
/// `records[rank]` (sized here).
template <class Fn> void run_recorded_ranks(int world, std::vector<comm_record>& records, Fn&& fn) {
  records.assign(static_cast<std::size_t>(world), {});
  run_ranks(world, [&](thread_communicator& c) {
    recording_communicator rc(c, records[static_cast<std::size_t>(c.rank())]);
    fn(rc);
  });
}

} // namespace zero::testing
