#pragma once
/// \file
/// `replicated_params`: the parameters of stages 0-2, whole on every rank, with the interface of
/// stage 3's `param_coordinator` so the engine holds one or the other and steps the same way.
///
/// The whole flat buffer lives on every rank. At stage 0 every rank updates all of it and nothing
/// moves. At stages 1-2 (`sharded`) a rank updates only its slice of each segment, so each segment
/// is all-gathered after its update: `after_update(k)` posts the all-gather of the group that segment
/// k ends, and `gather(m)` (or `full`) waits for exactly the groups module m reads, so the all-gathers
/// run beside the next forward's first modules. Consecutive segments may be grouped into one
/// all-gather of at most `allgather_elements` elements of all ranks together (DeepSpeed's
/// allgather_bucket_size): a group of one segment runs in place, a group of several through one
/// staging buffer (memory_tag::buffers) sized for the largest such group.

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

namespace detail {
/// The handle of an all-gather, or a stand-in for a communicator without one (stage 0 needs none).
struct no_gather_handle {
  void wait() {}
};
template <class Comm> struct gather_handle_of { using type = no_gather_handle; };
template <can_all_gather Comm> struct gather_handle_of<Comm> {
  using type =
      decltype(std::declval<Comm&>().all_gather(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0));
};
} // namespace detail

/// Options of `replicated_params`.
struct replicated_options {
  /// Each rank updates only its slices (stages 1-2), so updated segments are all-gathered.
  bool sharded = false;
  /// The most elements (all ranks together) one step-end all-gather carries; unset: one per segment.
  std::optional<std::size_t> allgather_elements{};
};

/// Stages 0-2's parameters; see the file comment.
template <class Backend, class Comm, class A> class replicated_params {
  using counting = counting_allocator<A>;
  using stream_type = typename Backend::stream_type;
  using gather_handle = typename detail::gather_handle_of<Comm>::type;

public:
  /// \param layout           the finalized layout (kept by reference).
  /// \param module_segments  for each module id, the segments its parameters lie in.
  /// \param module_names     for messages.
  /// \param state            memory of the parameters (memory_tag::params).
  /// \param buffers          memory of the staging buffer of grouped all-gathers (memory_tag::buffers).
  /// \throws config_error when `sharded` and `Comm` has no all_gather (the sentence names it).
  replicated_params(const flat_layout& layout, std::vector<std::vector<std::size_t>> module_segments,
                    std::vector<std::string> module_names, Backend& backend, Comm& comm, counting state,
                    counting buffers, replicated_options opt, stream_type& stream)
      : layout_(layout), module_segments_(std::move(module_segments)), module_names_(std::move(module_names)),
        backend_(backend), comm_(comm), stream_(stream), staging_free_(backend.make_event()),
        params_(std::move(state), layout.total_size() * size_of(layout.type()), memory_tag::params),
        sharded_(opt.sharded && comm.size() > 1) {
    if constexpr (!can_all_gather<Comm>) {
      if (opt.sharded) {
        throw config_error(std::string(detail::needs_all_gather));
      }
    }
    refs_.assign(module_names_.size(), 0);
    visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      backend_.fill(reinterpret_cast<P*>(params_.data()), layout_.total_size(), P{}, stream_);
    });
    if (sharded_) {
      pending_.resize(layout_.segments().size());
      plan_groups(opt.allgather_elements.value_or(0), std::move(buffers));
      behind_update_.assign(groups_.size(), false);
    }
  }

  replicated_params(const replicated_params&) = delete;
  replicated_params& operator=(const replicated_params&) = delete;

  /// Waits for the all-gathers still in flight (their buffers are about to be freed); never throws.
  ~replicated_params() {
    for (auto& h : pending_) {
      if (h) {
        try {
          h->wait();
        } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing; the group is broken anyway
        }
      }
    }
  }

  /// The parameters the optimizer updates: the whole flat buffer, indexed by flat offset.
  [[nodiscard]] std::byte* store() noexcept { return params_.data(); }
  /// False: the store is the whole buffer, not a shard.
  static constexpr bool sharded_store = false;
  /// Elements of the store.
  [[nodiscard]] std::size_t store_elements() const noexcept { return layout_.total_size(); }

  /// Waits for the all-gathers of module `m`'s segments and counts a use.
  void gather(int m) {
    const auto mi = check_module(m, "gather");
    wait_segments(module_segments_[mi]);
    ++refs_[mi];
  }
  /// Gives module `m` back. \throws usage_error on a double release.
  void release(int m) {
    const auto mi = check_module(m, "release");
    if (refs_[mi] == 0) {
      throw usage_error("release(\"" + module_names_[mi] + "\") without a matching gather (a double release?)");
    }
    --refs_[mi];
  }
  /// Segment `s`, whole, once its all-gather is done.
  [[nodiscard]] std::byte* full(std::size_t s, const std::string& /*what*/) const {
    const std::size_t one[] = {s};
    wait_segments(one);
    // The parameters are the framework's to write (initialisation, loading) through any view.
    return const_cast<std::byte*>(params_.data()) + layout_.segments()[s].range.begin * size_of(layout_.type());
  }

  /// After the update of segment `k` was enqueued on `s`: when `k` ends a gather group, that group's
  /// all-gather is posted (the communicator already ordered after `s`).
  void after_update(std::size_t k, const stream_type& s) {
    if (!sharded_) {
      // Nothing to gather (stage 0 or one rank), but the update ran on `s` (the host's step beside
      // the forward): the segment's next reader waits for this point.
      if (updated_.empty()) {
        for (std::size_t j = 0; j < layout_.segments().size(); ++j) {
          updated_.push_back(backend_.make_event());
        }
        update_pending_.assign(layout_.segments().size(), false);
      }
      backend_.record(updated_[k], s);
      update_pending_[k] = true;
      return;
    }
    const std::size_t g = segment_group_[k];
    if (groups_[g].last != k + 1) {
      return; // the group's all-gather follows the update of its last segment
    }
    if constexpr (!stream_ordered<Comm, stream_type>) {
      backend_.synchronize(s); // the group's updates come first
    }
    post(g, s);
    behind_update_[g] = true;
  }
  /// `f(k)` is called once the engine's stream is ordered after the update of segment `k` (waiting for
  /// an all-gather posted behind it), so whatever that update read may be reused on the engine's stream.
  void on_joined(std::function<void(std::size_t)> f) { on_joined_ = std::move(f); }
  /// The engine's stream was ordered after every update: nothing to note (the all-gathers were posted
  /// in update order already).
  void updates_joined() noexcept {}
  /// Ends a micro-step. Nothing to free: the parameters stay whole.
  void end_step(bool /*params_changed*/) {}
  /// A micro-step begins at a position of its accumulation: nothing is traced (stage 3 traces per position).
  void begin_micro_step(std::size_t /*position*/) noexcept {}
  /// After the owned part of the store was rewritten (initialisation, loading): makes every rank's
  /// buffer whole again by posting every group's all-gather (waited for where it is next read).
  void refresh() {
    if (!sharded_) {
      return;
    }
    if constexpr (!stream_ordered<Comm, stream_type>) {
      backend_.synchronize(stream_);
    }
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      post(g, stream_);
    }
  }
  /// Waits for every posted all-gather (and orders the engine's stream after every update).
  void finish() const {
    for (std::size_t k = 0; k < update_pending_.size(); ++k) {
      wait_update(k);
    }
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      wait_group(g);
    }
  }

  /// The parameters are whole already (DeepSpeed's GatheredParameters); waits for the all-gathers.
  void gather_everything() { finish(); }
  /// Ends `gather_everything`: with `modifier_rank >= 0` that rank's values are broadcast to every rank.
  /// \throws usage_error when `Comm` has no broadcast and there are several ranks.
  void release_everything(int modifier_rank) {
    if (modifier_rank < 0 || comm_.size() == 1) {
      return;
    }
    if constexpr (can_broadcast<Comm>) {
      backend_.synchronize(stream_);
      visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
        P* p = reinterpret_cast<P*>(params_.data());
        comm_.broadcast(p, p, layout_.total_size(), modifier_rank).wait();
      });
    } else {
      throw usage_error("gather_all(modifier_rank): writing one rank's values back to every rank needs a "
                        "communicator with broadcast(const T* send, T* recv, size_t count, int root)");
    }
  }
  /// Evaluation needs nothing at stages 0-2: every gather is local.
  void begin_eval(bool /*whole_model*/) {}
  void end_eval() {}

  /// Elements of the staging buffer of grouped all-gathers (0 when every group is one segment).
  [[nodiscard]] std::size_t staging_elements() const noexcept { return staging_elements_; }
  /// The step-end all-gathers per step (one per group), 0 when nothing is gathered.
  [[nodiscard]] std::size_t gather_groups() const noexcept { return groups_.size(); }

private:
  /// Segments [first, last): `elements` of all ranks, `slices` per rank.
  struct group {
    std::size_t first = 0;
    std::size_t last = 0;
    std::size_t elements = 0;
    std::size_t slices = 0;
  };

  std::size_t check_module(int m, const char* what) const {
    if (m < 0 || static_cast<std::size_t>(m) >= module_segments_.size()) {
      throw usage_error(std::string(what) + ": module id " + std::to_string(m) + " was not made by add_module (" +
                        std::to_string(module_segments_.size()) + " modules are registered)");
    }
    return static_cast<std::size_t>(m);
  }

  /// Groups consecutive segments, each group of at most `cap` elements (a segment larger than `cap`
  /// alone; `cap` 0: one segment per group).
  void plan_groups(std::size_t cap, counting buffers) {
    const auto& segs = layout_.segments();
    segment_group_.assign(segs.size(), 0);
    for (std::size_t s = 0; s < segs.size(); ++s) {
      if (groups_.empty() || groups_.back().elements + segs[s].range.size() > cap) {
        groups_.push_back({.first = s, .last = s});
      }
      auto& g = groups_.back();
      g.last = s + 1;
      g.elements += segs[s].range.size();
      g.slices += segs[s].slice;
      segment_group_[s] = groups_.size() - 1;
      if (g.last - g.first > 1) {
        staging_elements_ = std::max(staging_elements_, g.elements);
      }
    }
    if (staging_elements_ > 0) {
      staging_ = buffer<std::byte, counting>(std::move(buffers), staging_elements_ * size_of(layout_.type()),
                                             memory_tag::buffers);
    }
  }

  /// Posts group `g`'s all-gather; its handle is kept at the group's first segment. One segment: in
  /// place. Several: this rank's slices are packed into its block of the staging buffer on `s`, the
  /// all-gather runs in place there, and `wait_group` unpacks the other ranks' blocks. The staging
  /// buffer holds one group at a time, so the group before is waited for (and unpacked) first.
  void post(std::size_t g, const stream_type& s) {
    if constexpr (can_all_gather<Comm>) {
      const auto& grp = groups_[g];
      const auto& segs = layout_.segments();
      const auto rank = static_cast<std::size_t>(comm_.rank());
      auto& slot = pending_[grp.first];
      visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
        P* params = reinterpret_cast<P*>(params_.data());
        if (grp.last - grp.first == 1) {
          const auto& seg = segs[grp.first];
          P* whole = params + seg.range.begin;
          slot.emplace(comm_.all_gather(whole + rank * seg.slice, whole, seg.slice));
          return;
        }
        if (staged_group_) {
          wait_group(*staged_group_);
        }
        backend_.wait(s, staging_free_); // the last unpack, on stream_, has read the staging buffer
        P* staging = reinterpret_cast<P*>(staging_.data());
        P* block = staging + rank * grp.slices;
        for (std::size_t k = grp.first; k < grp.last; ++k) {
          backend_.cast(params + segs[k].range.begin + rank * segs[k].slice, block, segs[k].slice, s);
          block += segs[k].slice;
        }
        if constexpr (!stream_ordered<Comm, stream_type>) {
          backend_.synchronize(s); // the packing comes first
        }
        slot.emplace(comm_.all_gather(staging + rank * grp.slices, staging, grp.slices));
        staged_group_ = g;
      });
    }
  }

  /// Orders the engine's stream after segment `k`'s update when it ran on another stream.
  void wait_update(std::size_t k) const {
    if (k < update_pending_.size() && update_pending_[k]) {
      update_pending_[k] = false;
      backend_.wait(stream_, updated_[k]);
    }
  }

  void wait_segments(std::span<const std::size_t> segs) const {
    for (const std::size_t s : segs) {
      wait_update(s);
      if (s < segment_group_.size()) {
        wait_group(segment_group_[s]);
      }
    }
  }

  /// Waits for group `g`'s all-gather, if posted; a staged one is then unpacked into the parameters on
  /// the engine's stream, after which the staging buffer is free again (`staging_free_`).
  void wait_group(std::size_t g) const {
    const auto& grp = groups_[g];
    auto& slot = pending_[grp.first];
    if (!slot) {
      return;
    }
    auto h = std::move(*slot);
    slot.reset();
    const bool staged = grp.last - grp.first > 1;
    if (staged) {
      staged_group_.reset();
    }
    h.wait();
    if (behind_update_[g]) {
      behind_update_[g] = false;
      if (on_joined_) {
        for (std::size_t k = grp.first; k < grp.last; ++k) {
          on_joined_(k);
        }
      }
    }
    if (!staged) {
      return;
    }
    const auto& segs = layout_.segments();
    visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      // The parameters are this object's; a const one still completes its own gathers into them.
      P* params = reinterpret_cast<P*>(const_cast<std::byte*>(params_.data()));
      const P* staging = reinterpret_cast<const P*>(staging_.data());
      for (int q = 0; q < comm_.size(); ++q) {
        if (q == comm_.rank()) {
          continue; // its own slices were never moved
        }
        const auto uq = static_cast<std::size_t>(q);
        const P* block = staging + uq * grp.slices;
        for (std::size_t k = grp.first; k < grp.last; ++k) {
          backend_.cast(block, params + segs[k].range.begin + uq * segs[k].slice, segs[k].slice, stream_);
          block += segs[k].slice;
        }
      }
    });
    backend_.record(staging_free_, stream_);
  }

  const flat_layout& layout_;
  std::vector<std::vector<std::size_t>> module_segments_;
  std::vector<std::string> module_names_;
  Backend& backend_;
  Comm& comm_;
  stream_type& stream_;
  /// stream_: the last unpack of a staged all-gather has read the staging buffer (see `wait_group`).
  mutable typename Backend::event_type staging_free_;
  buffer<std::byte, counting> params_;
  bool sharded_;
  std::vector<int> refs_;
  std::vector<group> groups_;
  std::vector<std::size_t> segment_group_;
  std::size_t staging_elements_ = 0;
  buffer<std::byte, counting> staging_;
  mutable std::vector<std::optional<gather_handle>> pending_;
  mutable std::optional<std::size_t> staged_group_;
  mutable std::vector<bool> behind_update_; // per group: its pending all-gather was posted behind its updates
  std::function<void(std::size_t)> on_joined_;
  // Unsharded, updated on another stream: each segment's point after its update, and whether the
  // engine's stream still has to wait for it.
  std::vector<typename Backend::event_type> updated_;
  mutable std::vector<bool> update_pending_;
};

} // namespace zero
