#pragma once
/// \file
/// `detail::async_updates`: the step beside the next forward of `offloaded_adamw` (`offload_options::forward_overlap`,
/// docs/offload.md "The step beside the next forward"), written once as a base of it (as `delayed_updates` is),
/// with the state it keeps. `begin_async` hands the ranges to the host's thread, which updates them in order and
/// sets each range's word (`range_flags`) as it ends; `step_range` then only posts, per range, a wait for the word
/// and the upload (`step_async`). `join_async` waits for the host; whatever reads or writes the state joins first.
///
/// `Optimizer` befriends this class and has `inner_` (the host AdamW), `kept_` (the updates kept from backward),
/// `grads_` (`host_gradients`), `worker_` (the host's thread), `backend_`, `update_range(k, base, group_lr)` and
/// `post_upload(k, s)`.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/step/detail/range_flags.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// The step beside the next forward of `Optimizer` over `Backend`, its words in memory of `HostAlloc`; see the file
/// comment.
template <class Optimizer, class Backend, class HostAlloc> class async_updates {
  using stream_type = typename Backend::stream_type;

public:
  /// True when the step can run beside the next forward (`forward_overlap`, state in memory).
  [[nodiscard]] bool can_run_async() const noexcept { return flags_.size() > 0; }
  /// Steps run beside the next forward so far.
  [[nodiscard]] std::size_t async_steps() const noexcept { return async_steps_; }

  /// Begins a step on the thread of the host (see the file comment): every range not already updated
  /// during backward is updated there, in order, with `base` and `group_lr` (which must not change
  /// under it: give it the schedule of this step by value). The gradients must be final on the host
  /// (after `grads().finish()`). The caller then calls `step_range(k, s, ...)` for every range in
  /// order, which posts the waits and uploads. \throws usage_error without `forward_overlap`.
  void begin_async(const adamw_step_args& base, std::function<double(double)> group_lr) {
    if (!can_run_async()) {
      throw usage_error("offloaded_adamw::begin_async: made without forward_overlap (or with parameters in a file)");
    }
    join_async();
    ++epoch_;
    // In the forward's order: the thread updates every range not updated during backward, and marks
    // done those kept from backward whose update may still run (kept_ 2: in order after it); the
    // uploads of those that need nothing more (kept_ 3) are posted ahead of every wait (async_posts_ 2,
    // see step_range).
    std::vector<std::pair<std::size_t, bool>> todo; // (range, kept from backward)
    for (std::size_t k = 0; k < self().inner_.ranges().size(); ++k) {
      auto& kept_of = self().kept_;
      const std::uint8_t kept = k < kept_of.size() ? kept_of[k] : 0;
      if (kept == 0 || kept == 2) {
        todo.emplace_back(k, kept == 2);
      }
      if (kept != 0) {
        kept_of[k] = 0; // updated during backward (end_early)
      }
      async_posts_[k] = kept == 1 ? 0 : kept == 3 ? 2 : 1; // kept 1: its parameters are already on their way
    }
    async_ahead_ = true;
    async_ = true;
    ++async_steps_;
    self().worker_.post([this, todo = std::move(todo), base, group_lr = std::move(group_lr), epoch = epoch_] {
      std::size_t i = 0;
      try {
        for (; i < todo.size(); ++i) {
          const auto [k, kept] = todo[i];
          if (!kept) { // a kept range's update has ended (this thread ran it before); step_range uploads it
            self().grads_.wait_landed(k);
            self().update_range(k, base, group_lr);
          }
          flags_.set(k, epoch);
        }
      } catch (...) {
        for (; i < todo.size(); ++i) {
          flags_.set(todo[i].first, epoch); // nothing may wait for a range forever; join_async reports the error
        }
        throw;
      }
    });
  }
  /// Waits until the host has finished the step begun by `begin_async`. \throws what an update threw
  /// (a range's bounds: a bug, not the data).
  void join_async() {
    if (!async_) {
      return;
    }
    async_ = false;
    self().worker_.drain();
  }

protected:
  /// Makes the words of `ranges` ranges (forward_overlap; without this call `can_run_async` is false).
  void hold_async(HostAlloc alloc, std::size_t ranges) {
    flags_ = range_flags<HostAlloc>(std::move(alloc), ranges);
    async_posts_.assign(ranges, 0);
  }
  /// `step_range(k, s)` after `begin_async`: `s` waits for the host's update of range `k` (on the device where the
  /// backend can, else here), then the upload is posted; the uploads of ranges kept from backward are posted
  /// ahead, at the first range. \returns false outside such a step (nothing done). \throws usage_error for a range
  /// that does not exist.
  bool step_async(std::size_t k, const stream_type& s) {
    if (!async_) {
      return false;
    }
    if (k >= async_posts_.size()) {
      throw usage_error("offloaded_adamw::step_range: range " + std::to_string(k) + " does not exist; this rank owns " +
                        std::to_string(async_posts_.size()));
    }
    if (std::exchange(async_ahead_, false)) {
      // Kept from backward and done: uploaded first, while the host updates the first ranges.
      for (std::size_t j = 0; j < async_posts_.size(); ++j) {
        if (async_posts_[j] == 2) {
          async_posts_[j] = 0;
          self().post_upload(j, s);
        }
      }
    }
    if (async_posts_[k] == 1) {
      async_posts_[k] = 0;
      flags_.wait(self().backend_, s, k, epoch_);
      self().post_upload(k, s);
    }
    return true;
  }

private:
  Optimizer& self() noexcept { return static_cast<Optimizer&>(*this); }

  // A word per range, the step's number, which ranges' uploads step_range still posts, and whether a step runs on
  // the host.
  range_flags<HostAlloc> flags_;
  std::uint32_t epoch_ = 0;
  std::vector<std::uint8_t> async_posts_; // 1: wait and upload, 2: upload ahead of the waits
  bool async_ = false;
  bool async_ahead_ = false; // the uploads ahead of the waits are still to post
  std::size_t async_steps_ = 0;
};

} // namespace zero::detail
