#pragma once
/// \file
/// `offloaded_adamw`: ZeRO-Offload's optimizer step. A rank's fp32 master weights, Adam moments and
/// a copy of its gradient shard live in host memory (pinned where the backend has a device:
/// `Backend::host_allocator_type`; pageable `host_allocator` otherwise), and the host runs AdamW on
/// them with `cpu_backend`'s kernels and thread pool. Per owned range (a segment's slice):
///
///     device -> host   the range's reduced gradients   (stage 1: every range's copy posted at the first
///                                                       range; stages 2-3: streamed during backward)
///     host             AdamW over the range            (after that range's copy landed)
///     host -> device   the range's new parameters      (posted; the residency's all-gather follows it)
///
/// so the gradients of later ranges travel while earlier ranges update, and each range's upload and
/// all-gather run while the host updates the next. With the parameters offloaded too (stage 3's
/// shard in host memory: `adamw_placement::params_on_host`) the host AdamW writes the shard in place
/// and nothing is copied back. The kernels, their arguments and their element order are those of
/// `partitioned_adamw` on the `cpu_backend`: on a CPU-only build an offloaded run gives the same bits
/// as an in-memory one (the gradient norm, clipping and fp16's overflow check run before any range is
/// updated, as in memory). On a GPU the host's AdamW rounds each operation as the device kernel does
/// (docs/offload.md).
///
/// **Updates during backward** (`offload_options::backward_overlap`, stages 2-3 without accumulation): the last
/// ranges have a second home; a thread of the host updates each out of place as soon as its gradients landed, and
/// the step keeps those updates or drops them (an overflow, a clip below 1) and runs as without them: the same
/// bits (docs/offload.md, "Updates during backward"). **The step beside the next forward**
/// (`offload_options::forward_overlap`): `detail::async_updates`, a base of this class. **LAMB**: `form_trust_ratios`
/// runs its first pass on the host once every gradient landed.
///
/// **The delayed update** (`offload_options::delayed_update`): `detail::delayed_updates`, a base of this class.

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/detail/async_updates.hpp"
#include "zero/engine/step/detail/delayed_updates.hpp"
#include "zero/engine/step/detail/host_gradients.hpp"
#include "zero/engine/step/detail/job_thread.hpp"
#include "zero/engine/step/detail/second_home.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// AdamW over a rank's part of the flat buffer, in host memory; see the file comment. The interface
/// is `partitioned_adamw`'s (`ranges`, `runs`, `state_size`, `groups`, `has_master`, `load_master`,
/// `step`, `step_range`, `read_state`, `write_state`).
template <backend Backend, allocator DeviceAlloc, allocator HostAlloc = offload_allocator_t<Backend>>
class offloaded_adamw : public detail::delayed_updates<offloaded_adamw<Backend, DeviceAlloc, HostAlloc>, Backend>,
                        public detail::async_updates<offloaded_adamw<Backend, DeviceAlloc, HostAlloc>, Backend,
                                                     counting_allocator<HostAlloc>> {
  friend detail::delayed_updates<offloaded_adamw, Backend>;
  friend detail::async_updates<offloaded_adamw, Backend, counting_allocator<HostAlloc>>;
  using host_backend = host_backend_t<HostAlloc>;
  using host_counting = counting_allocator<HostAlloc>;
  using stream_type = typename Backend::stream_type;
  static constexpr bool device_host_accessible = DeviceAlloc::host_accessible;

public:
  /// \param layout, group_of, groups as `partitioned_adamw`'s.
  /// \param place  the rank, what it owns, the gradient dtype and the device parameters it rewrites.
  /// \param backend the device's kernels; its `copy` moves gradients and parameters.
  /// \param host   host memory for the state and the two staging shards, counted by tag (optimizer,
  ///               grads, params) in `host_memory()`.
  /// \param stream the engine's stream (kept by reference).
  offloaded_adamw(const flat_layout& layout, adamw_placement place, std::vector<std::size_t> group_of,
                  std::vector<param_group> groups, Backend& backend, HostAlloc host, stream_type& stream,
                  offload_options opt = {})
      : backend_(backend), stream_(stream), counted_(host), host_(make_host_backend(opt.threads, host)),
        device_params_(place.params), device_sharded_(place.params_sharded), params_on_host_(place.params_on_host),
        in_file_(place.params_in_file), param_type_(layout.type()), param_size_(size_of(param_type_)),
        host_params_(params_on_host_ ? buffer<std::byte, host_counting>()
                                     : buffer<std::byte, host_counting>(
                                           counted_, state_elements(layout, place) * param_size_, memory_tag::params)),
        inner_(layout,
               adamw_placement{.rank = place.rank,
                               .rule = place.rule,
                               .state_tensors = place.state_tensors,
                               .state_init = place.state_init,
                               .custom_steps = place.custom_steps,
                               .partitioned = place.partitioned,
                               .grad_type = place.grad_type,
                               .params = params_on_host_ ? place.params : host_params_.data(),
                               .params_sharded = params_on_host_ ? place.params_sharded : true,
                               .state_begin = place.state_begin,
                               .state_end = place.state_end},
               std::move(group_of), std::move(groups), host_, counted_, host_stream_),
        grads_(backend, host_, inner_.ranges(), counted_, inner_.state_size(), place.grad_type) {
    if (place.params == nullptr && !in_file_) {
      throw usage_error("offloaded_adamw: no parameters to update (adamw_placement::params is null)");
    }
    if (params_on_host_ && !place.params_sharded) {
      throw usage_error("offloaded_adamw: parameters in host memory must be the rank's shard (params_sharded)");
    }
    if (!(opt.backward_overlap >= 0.0 && opt.backward_overlap <= 1.0)) {
      throw usage_error("offloaded_adamw: backward_overlap " + std::to_string(opt.backward_overlap) +
                        " is not a share in [0, 1]");
    }
    if (opt.backward_overlap > 0.0 && inner_.has_master() && !in_file_) {
      second_ =
          detail::second_home<host_counting>(inner_.ranges(), inner_.state_size(), opt.backward_overlap, counted_);
      if (second_.elements() > 0) {
        kept_.assign(inner_.ranges().size(), 0);
      }
    }
    if (opt.forward_overlap && !in_file_) {
      this->hold_async(counted_, inner_.ranges().size());
    }
    if (opt.delayed_update) {
      if (params_on_host_ || in_file_ || second_.elements() > 0) {
        throw usage_error("offloaded_adamw: the delayed update needs the parameters on the device and no updates "
                          "during backward");
      }
      this->hold_delayed(inner_.ranges().size());
    }
  }

  offloaded_adamw(const offloaded_adamw&) = delete;
  offloaded_adamw& operator=(const offloaded_adamw&) = delete;
  /// Waits for copies still in flight into or out of the host shards; never throws.
  ~offloaded_adamw() {
    try {
      this->join_async();
      backend_.synchronize(stream_);
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept {
    return inner_.ranges();
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return inner_.runs(); }
  [[nodiscard]] std::size_t state_size() const noexcept { return inner_.state_size(); }
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return inner_.groups(); }
  [[nodiscard]] bool has_master() const noexcept { return inner_.has_master(); }
  /// The host bytes of the state and the staging shards, by tag.
  [[nodiscard]] const host_counting& host_memory() const noexcept { return counted_; }
  /// Threads of the host AdamW.
  [[nodiscard]] unsigned threads() const noexcept { return host_.threads(); }
  /// The host gradient shard (streamed by the engine at stages 2-3).
  [[nodiscard]] auto& grads() noexcept { return grads_; }

  /// The state elements that may be updated during backward (0 without `backward_overlap`).
  [[nodiscard]] std::size_t overlap_elements() const noexcept { return second_.elements(); }

  /// Begins the updates during backward of a step that will run with `args` and `group_lr` (a clip
  /// coefficient of 1: `args.grad_scale` as the step's when nothing is clipped); `update_early` then
  /// queues them. Nothing to do without a second home.
  void begin_early(const adamw_step_args& args, std::function<double(double)> group_lr) {
    if (second_.elements() == 0) {
      return;
    }
    end_early(false);
    worker_.drain(); // an update whose publishing a step beside the forward took over has ended
    {
      const std::lock_guard lock(done_mu_);
      done_.clear();
      failed_ = false;
    }
    queued_ = 0;
    posted_.clear();
    early_args_ = args;
    early_lr_ = std::move(group_lr);
    early_ = true;
  }
  /// True between `begin_early` and `end_early`.
  [[nodiscard]] bool early() const noexcept { return early_; }
  /// Queues the update of range `k` during backward, once its gradients have landed (after `take`);
  /// nothing for a range without a second home or outside `begin_early`.
  void update_early(std::size_t k) {
    if (!early_ || second_.elements() == 0 || k < second_.first() || k >= inner_.ranges().size()) {
      return;
    }
    ++queued_;
    posted_.push_back(k);
    // The homes are taken now: end_early may move the range to its other home while this runs.
    const home from = home_of(k, second_.side(k));
    const home to = home_of(k, static_cast<std::uint8_t>(second_.side(k) ^ 1U));
    worker_.post([this, k, from, to, args = early_args_, lr = early_lr_] {
      try {
        grads_.wait_landed(k);
        const std::size_t off = inner_.ranges()[k].second;
        inner_.step_window({.range = k,
                            .first = off,
                            .count = inner_.ranges()[k].first.size(),
                            .master = to.master,
                            .m = to.m,
                            .v = to.v,
                            .grads = grads_.at(off),
                            .params = early_params(k),
                            .master_in = from.master,
                            .m_in = from.m,
                            .v_in = from.v},
                           host_stream_, args, lr);
      } catch (...) {
        const std::lock_guard lock(done_mu_);
        failed_ = true;
        done_cv_.notify_all();
        throw;
      }
      const std::lock_guard lock(done_mu_);
      done_.push_back(k);
      done_cv_.notify_all();
    });
  }
  /// Ends the updates during backward. With `keep`, each updated range moves to its other home as its
  /// update lands, and its new parameters go on their way at once (uploaded on the engine's stream;
  /// already in stage 3's host shard) while the host still updates later ranges; its next
  /// `step_range` has nothing left to do. Otherwise the updates are dropped (waited for) and the
  /// state is the previous step's (stage 3's host shard put back unless `rewritten`: the step applies,
  /// clipped, and updates every range anyway). With `forward_overlap` the updates not yet started are not made
  /// (`early_counts::cancelled`): the step beside the next forward makes them in the order the
  /// forward reads the ranges, where the queue would have made them in backward's.
  /// \throws what an update threw (a range's bounds: a bug, not the data); ranges already moved on
  /// stay so.
  void end_early(bool keep, bool rewritten = false) {
    if (!early_) {
      return;
    }
    early_ = false;
    // Only early updates are queued now: a step beside the forward was joined before backward.
    const std::size_t cancelled = this->can_run_async() ? worker_.cancel_pending() : 0;
    early_counts_.cancelled += cancelled;
    const std::size_t started = queued_ - cancelled;
    if (keep && this->can_run_async() && defer_running(started)) {
      return;
    }
    std::size_t handled = 0;
    while (keep && handled < started) {
      std::size_t k = 0;
      {
        std::unique_lock lock(done_mu_);
        done_cv_.wait(lock, [&] { return done_.size() > handled || failed_; });
        if (done_.size() <= handled) {
          break; // an update threw: drain() rethrows it
        }
        k = done_[handled];
      }
      ++handled;
      second_.flip(k);
      kept_[k] = 1;
      ++early_counts_.kept;
      post_upload(k, stream_); // the staged parameters; nothing for stage 3's host shard, written in place
    }
    struct reset {
      offloaded_adamw* o;
      ~reset() {
        const std::lock_guard lock(o->done_mu_);
        o->done_.clear();
        o->failed_ = false;
        o->queued_ = 0;
      }
    } at_end{this};
    std::exception_ptr failed;
    try {
      worker_.drain(); // the dropped updates end (or one rethrows) before their parameters are put back
    } catch (...) {
      failed = std::current_exception();
    }
    if (params_on_host_ && !rewritten) {
      for (std::size_t i = handled; i < started; ++i) { // posted_[handled, started): started, not kept
        restore_params(posted_[i]);
      }
    }
    if (failed) {
      std::rethrow_exception(failed);
    }
    early_counts_.dropped += done_.size() - handled;
  }
  /// Range updates made during backward so far: kept by their step, or dropped; and those not made
  /// because the step beside the forward took them over.
  struct early_counts {
    std::size_t kept = 0;
    std::size_t dropped = 0;
    std::size_t cancelled = 0;
  };
  [[nodiscard]] early_counts early_updates() const noexcept { return early_counts_; }

  /// Copies the owned part of the device parameters to the host and fills the master copy from it.
  void load_master() {
    this->drop_delayed();
    this->join_async();
    end_early(false);
    second_.settle(inner_.ranges(), [this](std::size_t k) { return home_of(k, 0); });
    for (const auto& [range, state_offset] : inner_.ranges()) {
      if (params_on_host_) {
        break; // the host AdamW reads the shard itself
      }
      copy_and_wait<device_host_accessible>(backend_, stream_, device_params(range, state_offset),
                                            host_params(state_offset), range.size() * param_size_);
    }
    inner_.load_master();
  }

  /// Host copies of the state (see `partitioned_adamw::read_state`; host memory, so a plain copy).
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    this->join_delayed();
    this->join_async();
    end_early(false);
    second_.for_each_piece(inner_.ranges(), inner_.state_size(), t, state_offset, out.size(),
                           [&](float* second, std::size_t lo, std::size_t n) {
                             if (second != nullptr) {
                               std::memcpy(out.data() + (lo - state_offset), second, n * sizeof(float));
                             } else {
                               inner_.read_state(t, lo, out.subspan(lo - state_offset, n));
                             }
                           });
  }
  /// Writes host values into the state. The device parameters are the caller's to write (a
  /// checkpoint writes both).
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    this->drop_delayed();
    this->join_async();
    end_early(false);
    second_.for_each_piece(inner_.ranges(), inner_.state_size(), t, state_offset, in.size(),
                           [&](float* second, std::size_t lo, std::size_t n) {
                             if (second != nullptr) {
                               std::memcpy(second, in.data() + (lo - state_offset), n * sizeof(float));
                             } else {
                               inner_.write_state(t, lo, in.subspan(lo - state_offset, n));
                             }
                           });
  }

  /// True when the rule scales each parameter's step by a trust ratio (LAMB): `form_trust_ratios` first.
  [[nodiscard]] bool needs_trust_ratios() const noexcept { return inner_.needs_trust_ratios(); }
  /// LAMB's first pass on the host, its sums in host memory, once every range's gradients landed (fetched: posted
  /// here, and found posted by the step's `wait`s).
  template <class GradOf, class GroupLr, class SumOverRanks>
  void form_trust_ratios(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of, SumOverRanks&& sum) {
    if (grads_.streamed()) {
      grads_.finish();
    } else {
      grads_.fetch_all(stream_, grad_of);
    }
    for (std::size_t k = 0; k < inner_.ranges().size(); ++k) {
      grads_.wait_landed(k);
    }
    inner_.form_trust_ratios(
        base, group_lr, [this](const flat_range& /*range*/, std::size_t off) { return grads_.at(off); }, sum);
  }

  /// One optimizer step over every owned range, with its copies on the engine's stream.
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    this->join_async();
    for (std::size_t k = 0; k < inner_.ranges().size(); ++k) {
      step_range(k, stream_, base, group_lr, grad_of);
    }
  }

  /// The step of owned range `k`, its copies on `s`. Range 0 posts the gradient copies of every range
  /// (the engine steps ranges in order); any other range posts its own when range 0 did not. After
  /// `begin_async`: `s` waits for the host's update of the range (on the device where the backend can,
  /// else here), then the upload is posted; `base`, `group_lr` and `grad_of` are not used.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    if (this->publishing()) {
      this->publish_range(k, s);
      return;
    }
    if (this->step_async(k, s)) {
      return;
    }
    grads_.wait(k, s, grad_of, "offloaded_adamw");
    if (k < kept_.size() && kept_[k] != 0) {
      if (kept_[k] >= 2) { // its publishing was left to a step beside the forward, which did not come
        worker_.drain();
        post_upload(k, s); // on `s`, which the residency's action on the range follows
      }
      kept_[k] = 0; // updated during backward, its parameters already published (end_early)
      return;
    }
    update_range(k, base, group_lr);
    post_upload(k, s);
  }

private:
  /// Runs AdamW over range `k` on the host, from and into the home its state is in.
  template <class GroupLr>
  void update_range(std::size_t k, const adamw_step_args& base, GroupLr& group_lr, const std::byte* grads = nullptr) {
    const auto& [range, state_offset] = inner_.ranges()[k];
    const home h = home_of(k, second_.side(k));
    inner_.step_window({.range = k,
                        .first = state_offset,
                        .count = range.size(),
                        .master = h.master,
                        .m = h.m,
                        .v = h.v,
                        .grads = grads != nullptr ? grads : grads_.at(state_offset),
                        .params = params_on_host_ ? place_params(state_offset) : host_params(state_offset)},
                       host_stream_, base, group_lr);
  }
  /// Posts range `k`'s new parameters to the device (or the file) on `s`; nothing when the host AdamW
  /// wrote stage 3's host shard in place.
  void post_upload(std::size_t k, const stream_type& s) {
    const auto& [range, state_offset] = inner_.ranges()[k];
    if (!params_on_host_) {
      copy_async<device_host_accessible>(backend_, s, host_params(state_offset),
                                         in_file_ ? in_file_(param_use::update, k) : device_params(range, state_offset),
                                         range.size() * param_size_);
    }
  }

  /// With a step beside the forward to follow (`keep`): keeps every update during backward that has
  /// started without waiting for the one still running (the thread runs them in order, so at most
  /// one), and leaves their publishing to that step: the one still running is marked done by the
  /// thread after it ends (`kept_` 2), those done are uploads the step posts ahead of its waits on
  /// the update stream (`kept_` 3), not on the engine's stream in front of the next forward, or with
  /// stage 3's shard on the host need nothing more (`kept_` 1: written in place).
  /// \returns false when an update threw (the caller's path rethrows it).
  bool defer_running(std::size_t started) {
    std::vector<std::size_t> done;
    {
      const std::lock_guard lock(done_mu_);
      if (failed_) {
        return false;
      }
      done = done_;
    }
    for (const std::size_t k : done) {
      second_.flip(k);
      kept_[k] = params_on_host_ ? 1 : 3;
    }
    for (std::size_t i = done.size(); i < started; ++i) {
      const std::size_t k = posted_[i];
      second_.flip(k); // its update reads and writes the homes taken when it was posted
      kept_[k] = 2;
    }
    early_counts_.kept += started;
    return true;
  }

  using home = detail::state_home;

  static std::size_t state_elements(const flat_layout& layout, const adamw_placement& place) {
    return owned_ranges(layout, place).second;
  }
  std::byte* host_params(std::size_t state_offset) { return host_params_.data() + state_offset * param_size_; }
  /// The parameters the optimizer writes in place (stage 3's host shard), at state index `state_offset`.
  std::byte* place_params(std::size_t state_offset) const { return device_params_ + state_offset * param_size_; }

  /// Range `k`'s state in its first home (`side` 0: the inner optimizer's buffers) or its second.
  home home_of(std::size_t k, std::uint8_t side) {
    const std::size_t off = inner_.ranges()[k].second;
    if (side == 0) {
      // A rule other than AdamW may keep one state tensor or none (adamw_placement::state_tensors).
      const auto at = [off](float* t) { return t != nullptr ? t + off : nullptr; };
      return {at(inner_.has_master() ? inner_.master() : nullptr), at(inner_.exp_avg()), at(inner_.exp_avg_sq())};
    }
    return second_.at(off);
  }
  /// Where an update during backward writes range `k`'s parameters: staging for the device, or stage
  /// 3's host shard itself.
  std::byte* early_params(std::size_t k) {
    const std::size_t off = inner_.ranges()[k].second;
    return params_on_host_ ? place_params(off) : host_params(off);
  }
  /// Puts back range `k`'s parameters in stage 3's host shard after its update during backward was
  /// dropped: the master of the home it is still in, rounded as the kernel rounds (the shard's values
  /// before the update; docs/offload.md, "Parameters in place").
  void restore_params(std::size_t k) {
    const float* master = home_of(k, second_.side(k)).master;
    std::byte* shard = place_params(inner_.ranges()[k].second);
    const std::size_t n = inner_.ranges()[k].first.size();
    visit_float(param_type_,
                [&]<class P>(type_tag<P>) { host_.cast(master, reinterpret_cast<P*>(shard), n, host_stream_); });
  }
  std::byte* device_params(const flat_range& range, std::size_t state_offset) {
    const auto base = in_file_ ? in_file_(param_use::whole, 0) : device_params_;
    return base + (device_sharded_ ? state_offset : range.begin) * param_size_;
  }

  Backend& backend_;
  stream_type& stream_;
  host_counting counted_;
  host_backend host_;
  typename host_backend::stream_type host_stream_;
  std::byte* device_params_;
  bool device_sharded_;
  bool params_on_host_; // the parameters are the host shard itself: updated in place, nothing copied
  std::function<std::byte*(param_use, std::size_t)> in_file_; // parameters in a file (offload_param nvme)
  dtype param_type_;
  std::size_t param_size_;
  buffer<std::byte, host_counting> host_params_;
  partitioned_adamw<host_backend, HostAlloc> inner_;
  detail::host_gradients<Backend, device_host_accessible, host_counting, host_backend> grads_;
  // Updates during backward: the second home, and per range whether its update during backward was
  // kept and published (1: uploaded, or written in stage 3's host shard), or kept with its publishing
  // left to the step beside the forward: after its thread ran it (2) or as an upload ahead of its waits (3).
  detail::second_home<host_counting> second_;
  std::vector<std::uint8_t> kept_;
  std::size_t queued_ = 0;          // updates posted since begin_early
  std::vector<std::size_t> posted_; // their ranges, in the order posted
  std::mutex done_mu_;              // guards done_ and failed_, written by the worker
  std::condition_variable done_cv_;
  std::vector<std::size_t> done_; // ranges whose update landed, in that order
  bool failed_ = false;
  bool early_ = false;
  early_counts early_counts_;
  adamw_step_args early_args_{};
  std::function<double(double)> early_lr_;
  /// Last: stopped and joined before anything its jobs use is destroyed.
  detail::job_thread worker_;
};

} // namespace zero
