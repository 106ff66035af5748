#pragma once
/// \file
/// `grad_stats`: what a step learns about its gradients before the optimizer runs — whether any is
/// inf or NaN (fp16's overflow), their global L2 norm, and the clip coefficient.
///
/// It owns the overflow flag, one squared-norm slot per owned range and the norm kernels'
/// workspace, all in backend memory. `check` unscales the reduced gradients in place when there is
/// a factor to unscale by (fp16's loss scale, accumulation), computes each owned range's squared
/// norm, sums the flag (max) and the norms (sum) over ranks with two small all-reduces waited
/// together, and reads the two results back: one host round trip per step.
///
/// In a model-parallel job (`set_model_group`: the ranks holding the other pipeline stages or tensor
/// slices of the same replica) the squared norm and the flag are then summed over that group too (one
/// all-reduce of two doubles), so every rank clips by the norm of the whole model and an overflow on
/// any rank skips the step on all. A parameter replicated across the tensor group (the same values
/// and gradients on every tensor slice, `param_options::tensor_replicated`) counts once: on tensor
/// ranks other than 0 its elements are left out of the norm (`count_only`, with `norm_slots`).

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/gradients/norm_slots.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// What `grad_stats::check` found.
struct grad_check {
  /// A gradient was inf or NaN on some rank (the step is skipped).
  bool overflow = false;
  /// Global L2 norm of the averaged, unscaled gradients; inf on overflow.
  double norm = 0;
  /// Its square as summed (before the square root): `step_together` adds these, so the joint norm is
  /// one rounded square root, as one engine holding everything computes it.
  double squared_norm = 0;
};

/// The overflow flag, norm and clip of one step's gradients; see the file comment.
template <class Backend, class Comm, class A> class grad_stats {
  using counting = counting_allocator<A>;

public:
  /// \param ranges    the rank's owned ranges (flat range, state offset), as the optimizer has them.
  /// \param grad_type dtype of the reduced gradients.
  /// \param partitioned each rank holds only its ranges' gradients (stages 1-3): the flag and the
  ///                  norms are summed over ranks; otherwise every rank has them all.
  /// \param alloc     memory of the flag, the norms and the workspace (memory_tag::buffers).
  grad_stats(std::vector<std::pair<flat_range, std::size_t>> ranges, dtype grad_type, bool partitioned,
             Backend& backend, Comm& comm, counting alloc, typename Backend::stream_type& stream)
      : ranges_(std::move(ranges)), slots_(norm_slots::whole(ranges_)), grad_type_(grad_type),
        partitioned_(partitioned), backend_(backend), comm_(comm), stream_(stream),
        flag_(alloc, 1, memory_tag::buffers),
        norm_(alloc, std::max<std::size_t>(slots_.size(), 1), memory_tag::buffers) {
    require_all_reduce<Comm>();
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      for (const auto& [range, off] : ranges_) {
        workspace_bytes_ = std::max(workspace_bytes_, backend_.template squared_norm_workspace_bytes<G>(range.size()));
      }
    });
    workspace_ = buffer<std::byte, counting>(alloc, std::max<std::size_t>(workspace_bytes_, 1), memory_tag::buffers);
  }

  /// Checks the reduced gradients of every owned range, `reduced(range, state offset)` giving each
  /// one's memory; with `unscale != 1` they are first multiplied by it (and the flag pass runs, as
  /// it rewrites them). Without a factor an inf or NaN makes a squared norm, and so the sum,
  /// non-finite, which is the same overflow test without the flag's collective. Collective when
  /// partitioned on several ranks.
  template <class Reduced> grad_check check(double unscale, Reduced&& reduced) {
    const bool scaled = unscale != 1.0;
    begin_ranges(scaled);
    for (std::size_t k = 0; k < ranges_.size(); ++k) {
      check_range(k, reduced(ranges_[k].first, ranges_[k].second), unscale);
    }
    return finish(scaled);
  }

  /// `check` range by range, as each range's reduced gradients become final (the reducer streaming
  /// them to the host): `begin_ranges`, then `check_range` for every owned range in any order, then
  /// `finish_ranges`. Same kernels, same per-range results, same sum.
  void begin_ranges(bool scaled) {
    if (scaled) {
      backend_.fill(flag_.data(), 1, 0, stream_);
    }
  }
  /// Unscales (when `unscale != 1`) and takes the squared norm of owned range `k`'s gradients at `g`.
  void check_range(std::size_t k, void* g, double unscale) {
    const std::size_t n = ranges_[k].first.size();
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      G* x = static_cast<G*>(g);
      if (unscale != 1.0) {
        backend_.unscale_and_check(x, n, static_cast<float>(unscale), flag_.data(), stream_);
      }
      for (std::size_t j = slots_.first[k]; j < slots_.first[k + 1]; ++j) {
        const auto [at, count] = slots_.piece[j];
        if (count == 0) {
          backend_.fill(norm_.data() + j, 1, 0.0F, stream_);
        } else {
          backend_.squared_norm(x + at, count, norm_.data() + j, workspace_.data(), workspace_bytes_, stream_);
        }
      }
    });
  }
  /// Counts only the elements `slots` names in the norm (see `norm_slots`), from the next check on;
  /// the slots' squared norms come from `alloc` (memory_tag::buffers). \throws usage_error when
  /// `slots` is not laid out over this rank's owned ranges.
  void count_only(norm_slots slots, counting alloc) {
    if (slots.first.size() != ranges_.size() + 1) {
      throw usage_error("grad_stats::count_only: slots for " + std::to_string(slots.first.size() - 1) +
                        " ranges, this rank owns " + std::to_string(ranges_.size()));
    }
    slots_ = std::move(slots);
    norm_ = buffer<float, counting>(std::move(alloc), std::max<std::size_t>(slots_.size(), 1), memory_tag::buffers);
    backend_.fill(norm_.data(), 1, 0.0F, stream_);
  }
  /// The slots of squared norms `combine` takes, in order.
  [[nodiscard]] const norm_slots& slots() const noexcept { return slots_; }
  /// Sums the squared norm and the overflow flag over `group` as well (see the file comment); kept by
  /// reference, with a 2-double buffer from the allocator. Null: the data-parallel group only.
  void set_model_group(Comm* group, counting alloc) {
    model_ = group;
    if (model_ != nullptr && model_->size() > 1) {
      model_sum_ = buffer<double, counting>(std::move(alloc), 2, memory_tag::buffers);
    }
  }

  /// The result of the ranges checked since `begin_ranges`; collective as `check`.
  grad_check finish_ranges(bool scaled) { return finish(scaled); }

  /// The same result from per-slot squared norms and an inf/NaN flag computed elsewhere (the host's
  /// copy of the gradients when the optimizer steps there: `detail::host_gradients::check`), in
  /// the order of `slots()`. \throws usage_error when the count of norms is not the count of slots.
  grad_check combine(std::span<const float> squared_norms, bool nonfinite, bool scaled) {
    if (squared_norms.size() != slots_.size()) {
      throw usage_error("grad_stats::combine: " + std::to_string(squared_norms.size()) + " squared norms for " +
                        std::to_string(slots_.size()) + " slots (one per owned range unless some count only in part)");
    }
    if (scaled) {
      backend_.fill(flag_.data(), 1, nonfinite ? 1 : 0, stream_);
    }
    upload<A::host_accessible>(backend_, stream_, squared_norms.data(), norm_.data(), squared_norms.size());
    return finish(scaled);
  }

private:
  /// Sums the flag and the norms over ranks and reads them back.
  grad_check finish(bool scaled) {
    if (partitioned_ && comm_.size() > 1) {
      using handle_type = decltype(comm_.all_reduce(flag_.data(), flag_.data(), 1, reduce_op::max));
      std::optional<handle_type> hf;
      if (scaled) {
        hf.emplace(comm_.all_reduce(flag_.data(), flag_.data(), 1, reduce_op::max));
      }
      // At least one slot (a rank whose every element is left out sums a zero), as on every rank.
      auto hn = comm_.all_reduce(norm_.data(), norm_.data(), std::max<std::size_t>(slots_.size(), 1), reduce_op::sum);
      if (hf) {
        hf->wait();
      }
      hn.wait();
    }
    const std::int32_t flag = scaled ? backend_.read_scalar(flag_.data(), stream_) : 0;
    host_.resize(slots_.size());
    download<A::host_accessible>(backend_, stream_, norm_.data(), host_.data(), slots_.size());
    double sq = 0;
    for (const float part : host_) {
      sq += static_cast<double>(part);
    }
    bool overflow = flag != 0;
    if (model_ != nullptr && model_->size() > 1) {
      const double mine[2] = {sq, overflow ? 1.0 : 0.0};
      double all[2] = {0, 0};
      upload<A::host_accessible>(backend_, stream_, mine, model_sum_.data(), 2);
      model_->all_reduce(model_sum_.data(), model_sum_.data(), 2, reduce_op::sum).wait();
      download<A::host_accessible>(backend_, stream_, model_sum_.data(), all, 2);
      sq = all[0];
      overflow = all[1] != 0;
    }
    grad_check r;
    r.overflow = overflow || !std::isfinite(sq);
    r.norm = r.overflow ? std::numeric_limits<double>::infinity() : std::sqrt(sq);
    r.squared_norm = sq;
    return r;
  }

  std::vector<std::pair<flat_range, std::size_t>> ranges_;
  norm_slots slots_;
  dtype grad_type_;
  bool partitioned_;
  Backend& backend_;
  Comm& comm_;
  typename Backend::stream_type& stream_;
  buffer<int, counting> flag_;
  buffer<float, counting> norm_;
  buffer<std::byte, counting> workspace_;
  std::size_t workspace_bytes_ = 0;
  std::vector<float> host_;
  Comm* model_ = nullptr;
  buffer<double, counting> model_sum_;
};

} // namespace zero
