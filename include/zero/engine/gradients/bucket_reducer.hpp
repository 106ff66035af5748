#pragma once
/// \file
/// `bucket_reducer`: gradients, bucket by bucket, from the framework's backward to the rank that
/// owns them.
///
/// The framework asks `grad(p)` for the memory it accumulates a parameter's gradient into (`+=`,
/// as autograd does) and calls `ready(p)` once that gradient is final for the micro-step. A bucket
/// (a segment of the flat layout) whose parameters are all ready is reduced at once, on the
/// communicator's asynchronous path, while backward goes on (with `overlap` off, DeepSpeed's
/// overlap_comm false, `ready` waits for the reduction before it returns):
///
/// - `reduce_mode::all_reduce` (stages 0 and 1): one flat gradient buffer of the whole model; the
///   framework accumulates micro-steps into it and nothing is communicated until the last micro-step
///   of the accumulation, when each bucket is all-reduced (averaged over ranks) in place.
/// - `reduce_mode::reduce_scatter` (stage 2): the rank keeps only the gradients of its shard. The
///   framework writes into a staging buffer the size of one bucket, drawn from a small pool; a full
///   bucket is reduce-scattered in place and the rank's slice is added into its shard. Every
///   micro-step communicates, as in DeepSpeed's stage 2: waiting for the last micro-step would need
///   gradient memory for the whole model, which is what stage 2 exists to avoid. The shard is held
///   only while it is needed, one slice per segment: a segment's slice is allocated (zeroed) when
///   its bucket is first reduced in an accumulation, so the shard grows during backward as the
///   framework frees activations; after the step `retire` hands the slices back, at once when the
///   update ran on the reducer's stream, else each once the owner says the reducer's stream is
///   ordered after that segment's update (`release`, `release_retired`). With `streamed`
///   (an optimizer stepping on the host), the reducer keeps no shard: each bucket's reduced slice
///   goes to the sink given to `stream_to` (which copies it to the host) as the next bucket launches,
///   and the staging buffer is reused once the sink's event says the slice was read; two staging
///   buffers, so that backward fills one while the other's slice is copied. The leading `kept`
///   elements of a segment's slice (a state split between host and device) are also added into a
///   slice of the shard of that size.
///
/// Buckets are launched in one order on every rank — from the last segment to the first, the order
/// backward produces them — so a bucket that completes early waits for those behind it, and a
/// parameter that one rank never used cannot make ranks issue collectives in different orders.

#include "zero/backend/backend.hpp"
#include "zero/backend/quantize.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/gradients/detail/quantized_exchange.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// How a bucket is reduced.
enum class reduce_mode : std::uint8_t { all_reduce, reduce_scatter };

/// Options of a `bucket_reducer`.
struct reducer_options {
  reduce_mode mode = reduce_mode::all_reduce;
  /// Dtype of gradients: what the framework writes, what is communicated and kept.
  dtype grad_type = dtype::f32;
  /// Reduce a bucket while backward goes on (DeepSpeed's overlap_comm); false waits for each bucket
  /// before returning from `ready`.
  bool overlap = true;
  /// `reduce_mode::reduce_scatter` only: no gradient shard; reduced slices go to `stream_to`'s sink.
  bool streamed = false;
  /// Streamed only: per segment, the leading elements of the rank's reduced slice also added into a
  /// shard here after the sink had them, as without streaming (partial offload: the device's part of the
  /// state); one count per segment (0: none), or empty for none.
  std::vector<std::size_t> kept{};
  /// `reduce_mode::reduce_scatter` only, not streamed (ZeRO++'s qgZ): a bucket's chunk for each rank
  /// goes as block-quantized codes of this format by `all_to_all`, and each rank dequantizes the
  /// chunks it receives and sums them in fp32 (docs/zeropp.md). Empty: a plain reduce-scatter.
  std::optional<quant_format> quantized{};
};

/// Reduces gradients bucket by bucket; see the file comment. `Backend` runs the accumulate and fill
/// kernels, `Comm` the collectives, `A` provides the memory (counted: gradients under
/// `memory_tag::grads`, staging buffers under `memory_tag::buffers`).
template <backend Backend, communicator Comm, allocator A> class bucket_reducer {
  using counting = counting_allocator<A>;
  using handle_type = decltype(std::declval<Comm&>().all_reduce(static_cast<const float*>(nullptr),
                                                                static_cast<float*>(nullptr), 0, reduce_op::sum));
  using event_type = typename Backend::event_type;
  static constexpr bool quantizes = can_quantize<Backend> && can_all_to_all<Comm>;

public:
  /// Where a streamed reducer's reduced slices go: `(segment, slice)` with the rank's reduced slice
  /// of the segment in backend memory (the sink may rewrite it), final in the reducer stream's order;
  /// returns the event after which that memory may be written again.
  using sink = std::function<const event_type&(std::size_t segment, std::byte* slice)>;

  /// \param layout  the finalized layout (kept by reference; must outlive the reducer).
  /// \param backend kernels; \param comm the data-parallel group (size must match the layout).
  /// \param state   allocator for the persistent gradients; \param buffers allocator for staging.
  /// \throws usage_error when the communicator's size differs from the layout's world size.
  bucket_reducer(const flat_layout& layout, Backend& backend, Comm& comm, counting state, counting buffers,
                 reducer_options opt, typename Backend::stream_type& stream)
      : layout_(layout), backend_(backend), comm_(comm), buffers_alloc_(std::move(buffers)), opt_(opt), stream_(stream),
        esize_(size_of(opt.grad_type)) {
    require_all_reduce<Comm>();
    if constexpr (!can_reduce_scatter<Comm>) {
      if (opt_.mode == reduce_mode::reduce_scatter) {
        throw config_error(std::string(detail::needs_reduce_scatter));
      }
    }
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      comm_.set_compute_stream(stream_.get());
    }
    if (comm_.size() != layout_.world_size()) {
      throw usage_error("bucket_reducer: the communicator has " + std::to_string(comm_.size()) +
                        " ranks but the layout was finalized for " + std::to_string(layout_.world_size()));
    }
    if (opt_.streamed && opt_.mode != reduce_mode::reduce_scatter) {
      throw usage_error("bucket_reducer: streamed reduced slices need reduce_mode::reduce_scatter (stages 2-3)");
    }
    if (!opt_.kept.empty() && (!opt_.streamed || opt_.kept.size() != layout_.segments().size())) {
      throw usage_error("bucket_reducer: kept slices need streamed slices and one count per segment (" +
                        std::to_string(layout_.segments().size()) + "), got " + std::to_string(opt_.kept.size()));
    }
    for (std::size_t k = 0; k < opt_.kept.size(); ++k) {
      if (opt_.kept[k] > layout_.segments()[k].slice) {
        throw usage_error("bucket_reducer: " + std::to_string(opt_.kept[k]) + " kept elements of segment " +
                          std::to_string(k) + ", whose slice has " + std::to_string(layout_.segments()[k].slice));
      }
    }
    if (opt_.quantized) {
      check_quantized();
    }
    if (opt_.mode == reduce_mode::all_reduce) {
      grads_ = buffer<std::byte, counting>(state, layout_.total_size() * esize_, memory_tag::grads);
      fill_zero(grads_.data(), layout_.total_size());
    }
    state_alloc_.emplace(std::move(state));
    const auto& segs = layout_.segments();
    slices_.resize(segs.size());
    retired_.assign(segs.size(), false);
    seg_ready_.assign(segs.size(), 0);
    seg_launched_.assign(segs.size(), false);
    seg_staging_.assign(segs.size(), -1);
    param_touched_.assign(layout_.param_count(), false);
    param_ready_.assign(layout_.param_count(), false);
    for (const auto& s : segs) {
      max_segment_ = std::max(max_segment_, s.range.size());
    }
    if (opt_.quantized) {
      q_.emplace(backend_, comm_, *opt_.quantized, buffers_alloc_, stream_, max_segment_);
    }
    begin_micro_step(true);
  }

  bucket_reducer(const bucket_reducer&) = delete;
  bucket_reducer& operator=(const bucket_reducer&) = delete;

  /// The sink of a streamed reducer (`reducer_options::streamed`); before the first reduction.
  void stream_to(sink s) { sink_ = std::move(s); }

  /// qgZ in two levels (docs/zeropp.md): each bucket's codes go by all_to_all over `node` (the rank's
  /// H consecutive ranks of the data group), each rank sums its node's partial of the chunks of the N / H
  /// ranks sharing its local index, and those partials, quantized again, go by all_to_all over
  /// `cross` (those N / H ranks, in node order). Both are kept by reference; before the first
  /// reduction. \throws usage_error unless quantized, or when the groups are not the data group's
  /// consecutive nodes and their cross sections (rank = cross rank x node size + node rank).
  void use_nodes(Comm& node, Comm& cross) {
    if (!q_) {
      throw usage_error("bucket_reducer::use_nodes: two-level qgZ needs quantized gradients "
                        "(reducer_options::quantized)");
    }
    q_->use_nodes(node, cross);
  }

  /// HSDP (`mics_shard_size`): this communicator is a shard group, and `replicas` (kept by reference)
  /// the ranks holding the same shard in the other groups. Each bucket's reduction over the shard group
  /// is then all-reduced (averaged) over `replicas` before it is added to the shard (or, with
  /// `reduce_mode::all_reduce`, kept): while backward goes on, as the bucket behind it reduces. Before
  /// the first reduction. \throws usage_error with quantized gradients or streamed slices.
  void use_replicas(Comm& replicas) {
    if (opt_.quantized || opt_.streamed) {
      throw usage_error("bucket_reducer::use_replicas: replica groups need plain, kept reductions (not quantized, "
                        "not streamed)");
    }
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      replicas.set_compute_stream(stream_.get());
    }
    replicas_ = &replicas;
  }

  /// Starts a micro-step; `boundary` is true for the last micro-step of an accumulation (the one
  /// after which the optimizer steps).
  void begin_micro_step(bool boundary) {
    boundary_ = boundary;
    std::fill(seg_ready_.begin(), seg_ready_.end(), 0);
    std::fill(seg_launched_.begin(), seg_launched_.end(), false);
    std::fill(param_touched_.begin(), param_touched_.end(), false);
    std::fill(param_ready_.begin(), param_ready_.end(), false);
    next_launch_ = static_cast<std::ptrdiff_t>(layout_.segments().size()) - 1;
    open_ = true;
  }

  /// Where the framework accumulates the gradient of parameter `id` during this micro-step
  /// (`layout.param(id).numel` elements of the gradient dtype). Valid until `ready(id)`'s bucket
  /// is launched. \throws usage_error after the parameter was marked ready in this micro-step.
  [[nodiscard]] void* grad(std::size_t id) {
    const auto& p = layout_.param(id);
    check_open("grad", p.name);
    if (param_ready_[id]) {
      throw usage_error("grad(\"" + p.name +
                        "\") after grad_ready in the same micro-step; its bucket may be "
                        "reducing already");
    }
    param_touched_[id] = true;
    if (opt_.mode == reduce_mode::all_reduce) {
      return grads_.data() + p.offset * esize_;
    }
    const auto& s = layout_.segments()[p.segment];
    std::byte* st = staging_for(p.segment);
    return st + (p.offset - s.range.begin) * esize_;
  }

  /// Marks parameter `id`'s gradient final for this micro-step; launches every bucket that is now
  /// complete and next in the launch order. \throws usage_error when marked twice.
  void ready(std::size_t id) {
    const auto& p = layout_.param(id);
    check_open("grad_ready", p.name);
    if (param_ready_[id]) {
      throw usage_error("grad_ready(\"" + p.name + "\") called twice in one micro-step");
    }
    if (opt_.mode == reduce_mode::reduce_scatter && !param_touched_[id]) {
      // Never written this micro-step: its bucket still needs a (zeroed) staging buffer.
      (void)grad(id);
    }
    param_ready_[id] = true;
    param_touched_[id] = true;
    ++seg_ready_[p.segment];
    launch_ready();
  }

  /// Ends the micro-step: parameters that received no gradient count as zero when
  /// `ignore_unused`, the remaining buckets are launched in order, and every reduction is waited
  /// for. \throws usage_error naming the parameters without a gradient when not `ignore_unused`.
  void finish(bool ignore_unused) {
    if (!ignore_unused) {
      std::string missing;
      std::size_t count = 0;
      for (std::size_t id = 0; id < param_ready_.size(); ++id) {
        if (!param_ready_[id]) {
          if (++count <= 8) {
            missing += (missing.empty() ? "\"" : ", \"") + layout_.param(id).name + "\"";
          }
        }
      }
      if (count > 0) {
        // The micro-step stays open: the framework may still mark the missing gradients ready.
        throw usage_error(std::to_string(count) + " parameter(s) received no gradient in this micro-step (" + missing +
                          (count > 8 ? ", ..." : "") + " at rank " + std::to_string(comm_.rank()) +
                          "); call grad_ready for every trainable parameter, freeze the ones that do not train, "
                          "or set zero_optimization.ignore_unused_parameters to true to treat them as zero");
      }
    }
    for (std::size_t id = 0; id < param_ready_.size(); ++id) {
      if (!param_ready_[id]) {
        ready(id);
      }
    }
    while (!in_flight_.empty()) {
      complete_oldest();
    }
    open_ = false;
  }

  /// The reduced gradient of flat range `r` (a rank's slice of one segment, or the whole buffer
  /// with `reduce_mode::all_reduce`), whose optimizer state starts at `state_offset`; null when
  /// streamed (the sink has them) and its segment is not kept. With `reduce_mode::reduce_scatter`,
  /// valid from the end of the accumulation's last micro-step (`finish`) until `retire`.
  [[nodiscard]] std::byte* reduced(const flat_range& r, std::size_t state_offset) noexcept {
    if (opt_.mode == reduce_mode::all_reduce) {
      return opt_.streamed ? nullptr : grads_.data() + r.begin * esize_;
    }
    // The segment whose slice holds state_offset: the last one starting at or before it.
    const auto& segs = layout_.segments();
    const auto it = std::upper_bound(segs.begin(), segs.end(), state_offset,
                                     [](std::size_t off, const segment_info& s) { return off < s.shard_offset; });
    const auto k = static_cast<std::size_t>(it - segs.begin()) - 1;
    if (opt_.streamed && kept(k) == 0) {
      return nullptr;
    }
    return slices_[k].data() + (state_offset - segs[k].shard_offset) * esize_;
  }

  /// Zeroes the kept gradients after an optimizer step (applied or skipped), or drops an
  /// accumulation, on the reducer's stream: the whole buffer with `reduce_mode::all_reduce`; the
  /// shard's slices go back to the allocator. Streamed, only the kept segments have slices here.
  void zero() { retire(stream_); }
  /// The same after a step whose last reader of the gradients runs on `s`: with
  /// `reduce_mode::all_reduce` the buffer is zeroed on `s`; the shard's slices go back at once when
  /// `s` is the reducer's stream, else they are kept (retired) until `release` or `release_retired`
  /// says the reducer's stream is ordered after their reader.
  void retire(const typename Backend::stream_type& s) {
    if (grads_.size() != 0) {
      visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) {
        backend_.fill(reinterpret_cast<T*>(grads_.data()), grads_.size() / esize_, T{}, s);
      });
      return;
    }
    if (&s != &stream_) {
      if (!retired_after_) {
        retired_after_.emplace(backend_.make_event());
      }
      backend_.record(*retired_after_, s);
    }
    for (std::size_t k = 0; k < slices_.size(); ++k) {
      if (&s == &stream_) {
        slices_[k].release();
        retired_[k] = false;
      } else if (!slices_[k].empty()) {
        retired_[k] = true;
      }
    }
  }
  /// The reducer's stream is ordered after the update that read segment `k`'s slice: a retired slice
  /// goes back to the allocator (a later user there runs after that update).
  void release(std::size_t k) noexcept {
    if (k < slices_.size() && retired_[k]) {
      slices_[k].release();
      retired_[k] = false;
    }
  }
  /// `release` for every retired slice (the reducer's stream joined the whole update).
  void release_retired() noexcept {
    for (std::size_t k = 0; k < slices_.size(); ++k) {
      release(k);
    }
  }

  /// Dtype of the gradients.
  [[nodiscard]] dtype grad_type() const noexcept { return opt_.grad_type; }
  /// Staging buffers allocated so far (stage 2), each of the largest segment's gradient bytes.
  [[nodiscard]] std::size_t staging_buffers() const noexcept { return pool_.size(); }
  /// Collectives launched since construction (for tests that count communication).
  [[nodiscard]] std::size_t launches() const noexcept { return launches_; }

private:
  /// \throws usage_error when no micro-step is open (`finish` ended it; `begin_micro_step` opens one).
  void check_open(const char* what, const std::string& name) const {
    if (!open_) {
      throw usage_error(std::string(what) + "(\"" + name + "\") between micro-steps: the reducer's micro-step ended " +
                        "with finish(); begin_micro_step() opens the next");
    }
  }

  /// The leading elements of segment `k`'s reduced slices kept in the shard while streamed
  /// (`reducer_options::kept`); 0 for none.
  [[nodiscard]] std::size_t kept(std::size_t k) const noexcept { return k < opt_.kept.size() ? opt_.kept[k] : 0; }

  /// Segment `k`'s slice of the shard (streamed: its kept part), allocated and zeroed at its first
  /// reduction in an accumulation.
  std::byte* slice_of(std::size_t k) {
    if (retired_[k]) {
      // The owner did not say the update that read it was joined: order the reducer's stream after
      // it first, then give it back and take a fresh one.
      backend_.wait(stream_, *retired_after_);
      release(k);
    }
    if (slices_[k].empty()) {
      const std::size_t n = opt_.streamed ? kept(k) : layout_.segments()[k].slice;
      slices_[k] = buffer<std::byte, counting>(*state_alloc_, n * esize_, memory_tag::grads);
      fill_zero(slices_[k].data(), n);
    }
    return slices_[k].data();
  }

  void fill_zero(std::byte* p, std::size_t n) {
    visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) { backend_.fill(reinterpret_cast<T*>(p), n, T{}, stream_); });
  }

  std::byte* staging_for(std::size_t seg) {
    if (seg_launched_[seg]) {
      throw usage_error("a gradient of segment " + std::to_string(seg) +
                        " was asked for after its bucket was "
                        "launched in this micro-step");
    }
    if (seg_staging_[seg] < 0) {
      // Streamed, two buffers: a bucket's slice travels to the host while backward fills the other.
      // A two-level qgZ bucket frees its buffer at its first level's completion, so one completion may
      // free none: complete until one is free.
      while (free_.empty() && !in_flight_.empty() && (!opt_.streamed || pool_.size() >= 2)) {
        complete_oldest();
      }
      if (free_.empty()) {
        pool_.emplace_back(buffers_alloc_, max_segment_ * esize_, memory_tag::buffers);
        reuse_after_.push_back(nullptr);
        free_.push_back(static_cast<int>(pool_.size()) - 1);
      }
      seg_staging_[seg] = free_.back();
      free_.pop_back();
      if (const auto* read = reuse_after_[static_cast<std::size_t>(seg_staging_[seg])]) {
        backend_.wait(stream_, *read); // the sink's copy of the slice this buffer held last
        reuse_after_[static_cast<std::size_t>(seg_staging_[seg])] = nullptr;
      }
      fill_zero(pool_[static_cast<std::size_t>(seg_staging_[seg])].data(), layout_.segments()[seg].range.size());
    }
    return pool_[static_cast<std::size_t>(seg_staging_[seg])].data();
  }

  std::size_t segment_params(std::size_t seg) const {
    const auto& s = layout_.segments()[seg];
    return s.last_param - s.first_param;
  }

  void launch_ready() {
    while (next_launch_ >= 0) {
      const auto seg = static_cast<std::size_t>(next_launch_);
      if (seg_ready_[seg] != segment_params(seg)) {
        return;
      }
      launch(seg);
      --next_launch_;
    }
  }

  void launch(std::size_t seg) {
    seg_launched_[seg] = true;
    const auto& s = layout_.segments()[seg];
    if (opt_.mode == reduce_mode::all_reduce && !boundary_) {
      return; // accumulation continues in place; nothing to communicate before the last micro-step
    }
    // Collectives read what the backend wrote: order them after the stream's work (on the device when
    // the communicator does it itself, on the host otherwise).
    if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
      backend_.synchronize(stream_);
    }
    ++launches_;
    visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) {
      if (opt_.mode == reduce_mode::all_reduce) {
        T* p = reinterpret_cast<T*>(grads_.data()) + s.range.begin;
        in_flight_.push_back({seg, comm_.all_reduce(p, p, s.range.size(), reduce_op::avg)});
      } else if constexpr (can_reduce_scatter<Comm>) { // the constructor refused the mode otherwise
        T* st = reinterpret_cast<T*>(pool_[static_cast<std::size_t>(seg_staging_[seg])].data());
        T* mine = st + static_cast<std::size_t>(comm_.rank()) * s.slice;
        if (opt_.quantized) {
          if constexpr (quantizes) {
            buffer<std::byte, counting> codes;
            auto h = q_->launch(st, s.slice, codes);
            in_flight_.push_back(flight{seg, std::move(h), std::move(codes)});
          }
        } else {
          in_flight_.push_back({seg, comm_.reduce_scatter(st, mine, s.slice, reduce_op::avg)});
        }
      }
    });
    if (!opt_.overlap) {
      while (!in_flight_.empty()) { // one bucket, in one or two levels
        complete_oldest();
      }
    } else if (opt_.streamed) {
      // Hand the bucket before over now (its reduction has had a bucket's backward to finish): its copy
      // to the host then runs while backward fills this bucket's staging buffer's twin.
      while (in_flight_.size() > 1) {
        complete_oldest();
      }
    }
  }

  /// Completes the oldest reduction in flight; with two-level qgZ, a bucket whose node all_to_all is
  /// the oldest advances to the cross group instead (and frees its staging buffer).
  void complete_oldest() {
    in_flight_.front().handle.wait();
    if (auto& first = in_flight_.front(); !first.crossing && replicas_ != nullptr) {
      // HSDP: the shard group's result goes over the replicas; the bucket stays the oldest in flight.
      across_replicas(first);
      return;
    }
    if constexpr (quantizes) {
      if (auto& f = in_flight_.front(); q_ && q_->two_level() && !f.crossing) {
        // The node's partials go across while backward goes on; the bucket stays the oldest in flight.
        f.handle = q_->cross(layout_.segments()[f.segment].slice, f.codes);
        f.crossing = true;
        free_staging(f.segment);
        return;
      }
    }
    auto f = std::move(in_flight_.front());
    in_flight_.pop_front();
    if (opt_.mode == reduce_mode::reduce_scatter) {
      const auto& s = layout_.segments()[f.segment];
      const auto slot = static_cast<std::size_t>(seg_staging_[f.segment]);
      if (opt_.streamed) {
        if (!sink_) {
          throw usage_error("bucket_reducer: a streamed reducer reduced a bucket before stream_to gave it a sink");
        }
        std::byte* mine = pool_[slot].data() + static_cast<std::size_t>(comm_.rank()) * s.slice * esize_;
        reuse_after_[slot] = &sink_(f.segment, mine);
        if (const std::size_t n = kept(f.segment); n > 0) {
          // After the sink, which may have rewritten the slice (unscaled it); on the reducer's stream, so
          // before the staging buffer's reuse.
          visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) {
            backend_.accumulate(reinterpret_cast<const T*>(mine), reinterpret_cast<T*>(slice_of(f.segment)), n,
                                stream_);
          });
        }
      } else {
        visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) {
          if constexpr (quantizes) {
            if (q_) {
              q_->land(s.slice, std::move(f.codes), reinterpret_cast<T*>(slice_of(f.segment)));
              return;
            }
          }
          const T* mine =
              reinterpret_cast<const T*>(pool_[slot].data()) + static_cast<std::size_t>(comm_.rank()) * s.slice;
          backend_.accumulate(mine, reinterpret_cast<T*>(slice_of(f.segment)), s.slice, stream_);
        });
      }
      free_staging(f.segment);
    }
  }

  /// Segment `seg`'s staging buffer goes back to the pool (once; two-level qgZ frees it before landing).
  void free_staging(std::size_t seg) {
    if (seg_staging_[seg] >= 0) {
      free_.push_back(seg_staging_[seg]);
      seg_staging_[seg] = -1;
    }
  }

  struct flight {
    std::size_t segment;
    handle_type handle;
    buffer<std::byte, counting> codes{}; // qgZ: the rank's quantized chunks, then those it received
    bool crossing = false; // the handle is the second level's: two-level qgZ's cross all_to_all, HSDP's all_reduce
  };

  /// HSDP's second level: the rank's slice of `f`'s reduction over the shard group (in the whole
  /// gradient, or in staging) averaged in place over the replicas. Only the slice: the rank's update
  /// reads nothing else (stage 1 keeps the rest of the bucket averaged over the shard group only).
  void across_replicas(flight& f) {
    const auto& s = layout_.segments()[f.segment];
    const std::size_t mine = static_cast<std::size_t>(comm_.rank()) * s.slice;
    visit_float(opt_.grad_type, [&]<class T>(type_tag<T>) {
      T* p = opt_.mode == reduce_mode::all_reduce
                 ? reinterpret_cast<T*>(grads_.data()) + s.range.begin + mine
                 : reinterpret_cast<T*>(pool_[static_cast<std::size_t>(seg_staging_[f.segment])].data()) + mine;
      f.handle = replicas_->all_reduce(p, p, s.slice, reduce_op::avg);
    });
    f.crossing = true;
  }

  /// qgZ needs quantize kernels and all_to_all, and the reduced slices kept here.
  void check_quantized() {
    if constexpr (!can_quantize<Backend> || !can_all_to_all<Comm>) {
      throw config_error("zero_optimization.zero_quantized_gradients needs a backend with quantize kernels "
                         "(zero::can_quantize) and a communicator with all_to_all (zero::can_all_to_all)");
    }
    if (opt_.mode != reduce_mode::reduce_scatter || opt_.streamed) {
      throw usage_error("bucket_reducer: quantized gradients need reduce_mode::reduce_scatter, not streamed");
    }
    opt_.quantized->check("zero_optimization.zero_quantized_gradients");
  }
  const flat_layout& layout_;
  Backend& backend_;
  Comm& comm_;
  counting buffers_alloc_;
  reducer_options opt_;
  typename Backend::stream_type& stream_;
  std::size_t esize_;
  buffer<std::byte, counting> grads_;               // reduce_mode::all_reduce: the whole gradient
  std::optional<counting> state_alloc_;             // the memory of the shard's slices
  std::vector<buffer<std::byte, counting>> slices_; // reduce_scatter: segment k's slice of the shard, or empty
  std::vector<bool> retired_;                       // slices_[k] was read by an update not yet joined
  std::optional<event_type> retired_after_;         // the point on the retiring stream after that update
  std::vector<buffer<std::byte, counting>> pool_;
  std::vector<const event_type*> reuse_after_; // per staging buffer: the sink's copy that reads it
  sink sink_;
  std::vector<int> free_;
  std::deque<flight> in_flight_;
  std::optional<detail::quantized_exchange<Backend, Comm, counting, handle_type>> q_; // qgZ's exchanges
  Comm* replicas_ = nullptr; // HSDP: the ranks of the same shard in the other groups (use_replicas)
  std::vector<std::size_t> seg_ready_;
  std::vector<bool> seg_launched_;
  std::vector<int> seg_staging_;
  std::vector<bool> param_touched_;
  std::vector<bool> param_ready_;
  std::ptrdiff_t next_launch_ = -1;
  std::size_t max_segment_ = 0;
  std::size_t launches_ = 0;
  bool boundary_ = true;
  bool open_ = false;
};

} // namespace zero
