#pragma once
/// \file
/// `detail::delayed_updates`: the one-step delayed update of `offloaded_adamw` (`offload_options::delayed_update`,
/// docs/offload.md "Exact, delayed, selective"), written once as a base of it (as `plan_interface` is of the
/// plans), with the state it keeps. A step's update is handed to the host's thread and not published
/// (`begin_delayed`): the host gradients it reads are set aside (`host_gradients::flip`), so the next forward
/// and backward run on the parameters before it while the host updates. The next step publishes it
/// (`begin_publish`: `step_range` then only uploads each range and records an event that the next delayed
/// update waits for before it rewrites the range's staged parameters, `end_publish`), or a reader does
/// (`publish`).
///
/// `Optimizer` befriends this class and has `inner_` (the host AdamW), `grads_` (`host_gradients`),
/// `worker_` (the host's thread), `backend_`, `join_async`, `update_range(k, base, group_lr, grads)` and
/// `post_upload(k, s)`.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// The delayed update of `Optimizer` over `Backend`; see the file comment.
template <class Optimizer, class Backend> class delayed_updates {
  using stream_type = typename Backend::stream_type;

public:
  /// True when made for the delayed update (`offload_options::delayed_update`).
  [[nodiscard]] bool can_delay() const noexcept { return !uploaded_.empty(); }
  /// True from `begin_delayed` until the update it began is published: the device's parameters are the
  /// ones before it.
  [[nodiscard]] bool delayed_pending() const noexcept { return pending_; }
  /// Updates delayed so far.
  [[nodiscard]] std::size_t delayed_steps() const noexcept { return steps_; }

  /// Begins the delayed update of a step: the host gradients are set aside and every range is updated on
  /// the host's thread, in order, with `base` and `group_lr` (the schedule of this step, by value), each
  /// after the upload of its parameters that `begin_publish` posted has ended. Nothing is posted to the
  /// device: `begin_publish` or `publish` does that, at the next step or for a reader.
  /// \throws usage_error without the delayed update, or with an update still unpublished.
  void begin_delayed(const adamw_step_args& base, std::function<double(double)> group_lr) {
    if (!can_delay()) {
      throw usage_error("offloaded_adamw::begin_delayed: made without the delayed update");
    }
    if (pending_ || publishing_) {
      throw usage_error("offloaded_adamw::begin_delayed: the update before it is not published yet");
    }
    auto& o = self();
    o.join_async();
    o.grads_.flip();
    pending_ = true;
    ++steps_;
    o.worker_.post([&o, this, base, group_lr = std::move(group_lr), wait = posted_] {
      for (std::size_t k = 0; k < o.inner_.ranges().size(); ++k) {
        if (wait[k] != 0) {
          o.backend_.synchronize(std::as_const(uploaded_[k])); // the staged parameters have left
        }
        o.update_range(k, base, group_lr, o.grads_.spare_at(o.inner_.ranges()[k].second));
      }
    });
    std::fill(posted_.begin(), posted_.end(), std::uint8_t{0});
  }
  /// Waits for the host's delayed update (its parameters are still to publish). \throws what it threw.
  void join_delayed() {
    if (pending_) {
      self().worker_.drain();
    }
  }
  /// Begins publishing the delayed update, once the host has ended it: until `end_publish`, `step_range(k)`
  /// posts range k's upload and nothing else (nothing when no update is pending).
  void begin_publish() {
    join_delayed();
    publishing_ = true;
  }
  void end_publish() {
    publishing_ = false;
    pending_ = false;
  }
  /// Publishes the delayed update on `s` (a reader's). \returns true when one was pending.
  bool publish(const stream_type& s) {
    if (!pending_) {
      return false;
    }
    begin_publish();
    for (std::size_t k = 0; k < posted_.size(); ++k) {
      publish_range(k, s);
    }
    end_publish();
    return true;
  }

protected:
  /// Makes the events of `ranges` owned ranges and holds the host gradients twice.
  void hold_delayed(std::size_t ranges) {
    self().grads_.hold_twice();
    for (std::size_t k = 0; k < ranges; ++k) {
      uploaded_.push_back(self().backend_.make_event());
    }
    posted_.assign(ranges, 0);
  }
  /// True between `begin_publish` and `end_publish`: `step_range` publishes.
  [[nodiscard]] bool publishing() const noexcept { return publishing_; }
  /// Posts range `k`'s upload of the update being published on `s`, and records the event the next delayed
  /// update waits for before it rewrites the range's staged parameters.
  void publish_range(std::size_t k, const stream_type& s) {
    if (k >= posted_.size()) {
      throw usage_error("offloaded_adamw::step_range: range " + std::to_string(k) + " does not exist; this rank owns " +
                        std::to_string(posted_.size()));
    }
    if (pending_) {
      self().post_upload(k, s);
      self().backend_.record(uploaded_[k], s);
      posted_[k] = 1;
    }
  }
  /// The state is rewritten (a load, `init_params`): an update still unpublished is waited for and dropped,
  /// its parameters never published.
  void drop_delayed() {
    join_delayed();
    pending_ = false;
  }

private:
  [[nodiscard]] Optimizer& self() noexcept { return static_cast<Optimizer&>(*this); }

  std::vector<typename Backend::event_type> uploaded_; // per range: after its upload of the update published
  std::vector<std::uint8_t> posted_;                   // per range: the next delayed update waits for that upload
  bool pending_ = false;                               // an update began and is not published
  bool publishing_ = false;
  std::size_t steps_ = 0;
};

} // namespace zero::detail
