#pragma once
/// \file
/// `counting_communicator<Comm>`: a decorator (as `counting_allocator` is for memory) that forwards
/// every operation to `Comm` and records, per group and per operation, the calls and the bytes this
/// rank's buffers gave to and took from them, in a `comm_ledger` shared by the communicators split
/// from it. Tests and benches read it to show where bytes flow (ZeRO++'s hierarchical and quantized
/// collectives, docs/zeropp.md).
///
/// The bytes of a call are its buffers' sizes as `communicator.hpp`'s table gives them, counted by
/// the rank that makes the call, once the wrapped communicator has started it (a call it refuses is
/// not counted):
///
/// | operation | sent | received |
/// |---|---|---|
/// | all_reduce | count | count |
/// | reduce_scatter | size x count | count |
/// | all_gather | count | size x count |
/// | broadcast | count (root), 0 (others) | 0 (root), count (others) |
/// | all_to_all | size x count | size x count |
/// | send / recv | count / 0 | 0 / count |
/// | barrier, split | 0 | 0 |
///
/// Each group is named by a label: the wrapped communicator's `name()`, or one the caller sets
/// (`set_label("node")`); a split is labelled "<label>/<color>" unless relabelled. The decorator has
/// exactly the operations `Comm` has (the capability concepts see through it).

#include "zero/comm/communicator.hpp"

#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

namespace zero {

/// Calls and bytes of one operation on one group (see the file comment for what counts).
struct comm_traffic {
  std::size_t calls = 0;
  std::size_t sent = 0;
  std::size_t received = 0;
  comm_traffic& operator+=(const comm_traffic& o) noexcept {
    calls += o.calls;
    sent += o.sent;
    received += o.received;
    return *this;
  }
  friend bool operator==(const comm_traffic&, const comm_traffic&) = default;
};

/// The record of a rank's communicators: traffic by (group label, operation). Thread-safe.
class comm_ledger {
public:
  using key = std::pair<std::string, std::string>; // (group label, operation name)

  void add(std::string_view group, std::string_view op, std::size_t sent, std::size_t received) {
    const std::lock_guard lock(mu_);
    comm_traffic& t = entries_[key(group, op)];
    t += comm_traffic{.calls = 1, .sent = sent, .received = received};
  }
  /// The traffic of `op` on `group`; zeros when there was none.
  [[nodiscard]] comm_traffic of(std::string_view group, std::string_view op) const {
    const std::lock_guard lock(mu_);
    const auto it = entries_.find(key(group, op));
    return it == entries_.end() ? comm_traffic{} : it->second;
  }
  /// Every operation on `group`, summed.
  [[nodiscard]] comm_traffic group(std::string_view group) const {
    return sum([&](const key& k) { return k.first == group; });
  }
  /// `op` on every group, summed.
  [[nodiscard]] comm_traffic op(std::string_view op) const {
    return sum([&](const key& k) { return k.second == op; });
  }
  /// Everything, summed.
  [[nodiscard]] comm_traffic total() const {
    return sum([](const key&) { return true; });
  }
  /// A copy of every entry, for reports.
  [[nodiscard]] std::map<key, comm_traffic> entries() const {
    const std::lock_guard lock(mu_);
    return entries_;
  }
  /// Forgets everything counted so far (e.g. after a warm-up step).
  void reset() {
    const std::lock_guard lock(mu_);
    entries_.clear();
  }

private:
  template <class Pred> comm_traffic sum(Pred&& pred) const {
    const std::lock_guard lock(mu_);
    comm_traffic t;
    for (const auto& [k, v] : entries_) {
      if (pred(k)) {
        t += v;
      }
    }
    return t;
  }

  mutable std::mutex mu_;
  std::map<key, comm_traffic> entries_;
};

/// `Comm` with every operation counted in a `comm_ledger`; see the file comment.
template <communicator Comm> class counting_communicator {
public:
  /// Wraps `inner`, counting into `ledger` (a new one when null) under `inner.name()`.
  explicit counting_communicator(Comm inner, std::shared_ptr<comm_ledger> ledger = nullptr)
      : inner_(std::move(inner)), ledger_(ledger ? std::move(ledger) : std::make_shared<comm_ledger>()),
        label_(inner_.name()) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }
  /// The group's label, under which its traffic is counted.
  [[nodiscard]] std::string_view name() const noexcept { return label_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const { return inner_.timeout(); }
  void set_timeout(std::chrono::milliseconds t) { inner_.set_timeout(t); }
  template <class S> void set_compute_stream(S s) requires requires(Comm& c, S x) { c.set_compute_stream(x); }
  { inner_.set_compute_stream(s); }

  /// Counts this group's traffic under `label` from now on.
  void set_label(std::string label) { label_ = std::move(label); }
  /// The ledger this communicator (and those split from it) count into.
  [[nodiscard]] comm_ledger& ledger() const noexcept { return *ledger_; }
  [[nodiscard]] const std::shared_ptr<comm_ledger>& shared_ledger() const noexcept { return ledger_; }
  /// The wrapped communicator.
  [[nodiscard]] Comm& inner() noexcept { return inner_; }

  template <class T, class C = Comm>
  [[nodiscard]] auto all_reduce(const T* send, T* recv, std::size_t count, reduce_op op)
      -> decltype(std::declval<C&>().all_reduce(send, recv, count, op)) {
    auto h = inner_.all_reduce(send, recv, count, op);
    count_op("all_reduce", bytes<T>(count), bytes<T>(count));
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto reduce_scatter(const T* send, T* recv, std::size_t count, reduce_op op)
      -> decltype(std::declval<C&>().reduce_scatter(send, recv, count, op)) {
    auto h = inner_.reduce_scatter(send, recv, count, op);
    count_op("reduce_scatter", bytes<T>(count) * group_size(), bytes<T>(count));
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto all_gather(const T* send, T* recv, std::size_t count)
      -> decltype(std::declval<C&>().all_gather(send, recv, count)) {
    auto h = inner_.all_gather(send, recv, count);
    count_op("all_gather", bytes<T>(count), bytes<T>(count) * group_size());
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto broadcast(const T* send, T* recv, std::size_t count, int root)
      -> decltype(std::declval<C&>().broadcast(send, recv, count, root)) {
    const bool is_root = root == inner_.rank();
    auto h = inner_.broadcast(send, recv, count, root);
    count_op("broadcast", is_root ? bytes<T>(count) : 0, is_root ? 0 : bytes<T>(count));
    return h;
  }
  template <class C = Comm> [[nodiscard]] auto barrier() -> decltype(std::declval<C&>().barrier()) {
    auto h = inner_.barrier();
    count_op("barrier", 0, 0);
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto all_to_all(const T* send, T* recv, std::size_t count)
      -> decltype(std::declval<C&>().all_to_all(send, recv, count)) {
    auto h = inner_.all_to_all(send, recv, count);
    count_op("all_to_all", bytes<T>(count) * group_size(), bytes<T>(count) * group_size());
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto send(const T* buf, std::size_t count, int peer)
      -> decltype(std::declval<C&>().send(buf, count, peer)) {
    auto h = inner_.send(buf, count, peer);
    count_op("send", bytes<T>(count), 0);
    return h;
  }
  template <class T, class C = Comm>
  [[nodiscard]] auto recv(T* buf, std::size_t count, int peer) -> decltype(std::declval<C&>().recv(buf, count, peer)) {
    auto h = inner_.recv(buf, count, peer);
    count_op("recv", 0, bytes<T>(count));
    return h;
  }
  /// The split of the wrapped communicator, counting into the same ledger as "<label>/<color>".
  template <class C = Comm>
  [[nodiscard]] auto split(int color, int key) -> counting_communicator<decltype(std::declval<C&>().split(color, key))>
  requires std::same_as<decltype(std::declval<C&>().split(color, key)), Comm> {
    counting_communicator out(inner_.split(color, key), ledger_);
    count_op("split", 0, 0);
    out.label_ = label_ + "/" + std::to_string(color);
    return out;
  }

private:
  template <class T> static constexpr std::size_t bytes(std::size_t count) noexcept { return count * sizeof(T); }
  [[nodiscard]] std::size_t group_size() const { return static_cast<std::size_t>(inner_.size()); }
  void count_op(std::string_view op, std::size_t sent, std::size_t received) {
    ledger_->add(label_, op, sent, received);
  }

  Comm inner_;
  std::shared_ptr<comm_ledger> ledger_;
  std::string label_;
};

} // namespace zero
