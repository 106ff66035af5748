#pragma once
/// \file
/// `gradient_intake`: how a plan's optimizer gets its reduced gradients. Kept: the reducer holds the
/// rank's reduced slices in backend memory, the step checks them there and the optimizer reads them
/// (`reduced`); a stage 2-3 slice goes back to the allocator once the engine's stream is ordered after
/// the update that read it. Streamed (stages 2-3 with the state, or a split state's host share, on the
/// host): the intake is the reducer's sink, each bucket's reduced slice of this rank going to the host
/// gradient shard (`detail::host_gradients`) during backward. Without accumulation each slice is final
/// as it lands, so it is checked on the device as it is handed over (`grad_stats::check_range`) and may
/// start its update during backward; with accumulation the host copy is checked at the step. A split
/// state streams its host share and keeps its device share (`reducer_options::kept`). docs/offload.md.

#include "zero/core/dtype.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"

#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>

namespace zero {

/// A plan's gradient intake; see the file comment. `Grads` is the host optimizer's
/// `detail::host_gradients`, or void for a plan that only keeps.
template <class Parts, class Grads = void> class gradient_intake {
  static constexpr bool can_stream = !std::is_void_v<Grads>;

public:
  using stream_type = typename Parts::stream_type;
  /// Where in segment `k`'s reduced slice the host shard's part starts, in elements (a split state's
  /// device share of the range the split falls in); none: at 0.
  using offset_fn = std::function<std::size_t(std::size_t k)>;
  /// The update during backward of owned range `k`, whose gradients are final and on their way.
  using early_fn = std::function<void(std::size_t k)>;
  /// Owned range `k`'s slice in backend memory, before its copy to the host is posted; `final`: no later
  /// micro-step adds to it (no accumulation), so it is checked and unscaled (ZenFlow gathers its chosen
  /// elements there; with accumulation it only waits until it may overwrite the host's copy).
  using slice_fn = std::function<void(std::size_t k, const std::byte* slice, bool final)>;

  /// Kept gradients only.
  gradient_intake() = default;
  /// Streams to `grads` from now on, or keeps with null (`keeps`: the device keeps the leading share of
  /// each streamed slice too).
  gradient_intake(Grads* grads, bool keeps) requires can_stream : grads_(grads), keeps_(keeps) {
    if (grads != nullptr) {
      grads->stream();
    }
  }

  [[nodiscard]] bool streams() const noexcept { return grads_ != nullptr; }

  /// Connects to `p`'s reducer: as its sink when streaming (`offset`, `early`, `slice` as above); kept
  /// slices go back to the allocator as the updates that read them are joined.
  void connect(Parts& p, offset_fn offset = {}, early_fn early = {}, slice_fn slice = {}) {
    p_ = &p;
    if constexpr (can_stream) {
      if (streams()) {
        offset_ = std::move(offset);
        early_ = std::move(early);
        slice_ = std::move(slice);
        in_take_ = p.cfg->gradient_accumulation_steps == 1;
        p.reducer->stream_to([this](std::size_t segment, std::byte * slice) -> const auto& {
          return take(segment, slice);
        });
      }
    }
    if (!streams() || keeps_) {
      (*p.params)([r = p.reducer](auto& res) { res.on_joined([r](std::size_t k) { r->release(k); }); });
    }
  }
  /// A micro-step begins; `boundary`: it is the accumulation's last, whose gradients are multiplied by
  /// `unscale` before the check.
  void begin_micro_step(bool boundary, double unscale) {
    boundary_ = boundary;
    unscale_ = unscale;
    if (streams() && in_take_ && boundary) {
      p_->stats->begin_ranges(unscale != 1.0);
    }
  }
  /// The micro-step's reductions have finished: the host copy adds its last slices.
  void landed() {
    if constexpr (can_stream) {
      if (streams()) {
        grads_->finish();
      }
    }
  }
  /// The step's check of the reduced gradients: on the device, or (streamed) as they landed, or of the
  /// host's copy.
  grad_check check(double unscale) {
    if constexpr (can_stream) {
      if (streams() && in_take_) {
        return p_->stats->finish_ranges(unscale != 1.0);
      }
      if (streams()) {
        const auto host = grads_->check(unscale, p_->stats->slots());
        return p_->stats->combine(host.squared_norms, host.nonfinite, unscale != 1.0);
      }
    }
    return p_->stats->check(unscale, p_->reduced());
  }
  /// The accumulation ended: the host copy starts again from zero, and the kept gradients are zeroed
  /// (behind the update on `s` when given, else on the engine's stream).
  void zero(const stream_type* s) {
    if constexpr (can_stream) {
      if (streams()) {
        grads_->reset();
      }
    }
    if (!streams() || keeps_) {
      if (s != nullptr) {
        p_->reducer->retire(*s);
      } else {
        p_->reducer->zero();
      }
    }
  }

private:
  decltype(auto) take(std::size_t segment, std::byte* slice) requires can_stream {
    const bool final = in_take_ && boundary_;
    if (final) {
      p_->stats->check_range(segment, slice, unscale_); // the slice is final on the device: check it there
    }
    const std::size_t skip = offset_ ? offset_(segment) * size_of(p_->cfg->grad_accum_dtype) : 0;
    if (slice_) {
      slice_(segment, slice + skip, final);
    }
    decltype(auto) copied = grads_->take(segment, slice + skip, *p_->stream);
    if (final && early_) {
      early_(segment);
    }
    return copied;
  }

  Parts* p_ = nullptr;
  Grads* grads_ = nullptr;
  bool keeps_ = false;
  offset_fn offset_;
  early_fn early_;
  slice_fn slice_;
  bool in_take_ = false;
  bool boundary_ = true;
  double unscale_ = 1.0;
};

/// The intake of a plan that may stream to the host gradient shard of `HostOptimizer` (its `grads()`).
template <class Parts, class HostOptimizer>
using host_gradient_intake =
    gradient_intake<Parts, std::remove_reference_t<decltype(std::declval<HostOptimizer&>().grads())>>;

} // namespace zero
