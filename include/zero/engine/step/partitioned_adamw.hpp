#pragma once
/// \file
/// `partitioned_adamw`: Adam/AdamW over the part of the flat buffer a rank owns.
///
/// With `partitioned` (stages 1-3) a rank owns its slice of every segment, and keeps fp32 master
/// weights, m and v for those slices only, contiguous in the order of its shard. Without (stage 0)
/// it owns the whole buffer. For fp32 training the parameters are their own master copy and only m
/// and v are kept. Parameter groups (their own lr and weight decay) split the owned ranges into
/// runs; padding joins the run beside it (its gradient, master, m and v are zero and stay zero).
///
/// LAMB (a rule with a trust ratio, update_rules.hpp) steps in two passes: `form_trust_ratios` runs its first
/// pass over each parameter's piece in the rank's shard (the moments and two sums of squares), sums each
/// parameter's pair over the ranks that hold its pieces (the engine's shard group: one all-reduce of two doubles
/// per parameter), and forms every parameter's ratio; `step` and `step_range` then move each piece by its
/// parameter's ratio. A parameter split over 3 ranks thus gets the ratio of the whole tensor (DeepSpeed's
/// FusedLamb takes it per tensor, which ZeRO's flat shards would otherwise cut).

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/adamw_placement.hpp"
#include "zero/engine/step/custom_rule.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// AdamW over a rank's part of the flat buffer; see the file comment.
template <backend Backend, allocator A> class partitioned_adamw {
  using counting = counting_allocator<A>;

public:
  /// \param layout       finalized layout (kept by reference).
  /// \param place        the rank, what it owns, the gradient dtype and the parameters it updates.
  /// \param group_of     group index of every parameter of the layout, by parameter id.
  /// \param groups       the groups' hyper-parameters.
  /// \param alloc        memory for master, m and v (counted under `memory_tag::optimizer`).
  /// \throws usage_error when `group_of` does not cover the layout or `place.params` is null.
  partitioned_adamw(const flat_layout& layout, adamw_placement place, std::vector<std::size_t> group_of,
                    std::vector<param_group> groups, Backend& backend, counting alloc,
                    typename Backend::stream_type& stream)
      : layout_(layout), backend_(backend), stream_(stream), groups_(std::move(groups)), param_type_(layout.type()),
        place_(place) {
    if (place.params == nullptr && !place.params_in_file && !place.params_from_master) {
      throw usage_error("partitioned_adamw: no parameters to update (adamw_placement::params is null)");
    }
    if (place.params_from_master && (param_type_ == dtype::f32 || place.state_elsewhere)) {
      throw usage_error("partitioned_adamw: parameters derived from the master need 16-bit training and the master "
                        "here");
    }
    if (place.params_in_file && param_type_ == dtype::f32 && !place.state_elsewhere) {
      // The step would read fp32 parameters, its master weights, back from the file.
      throw usage_error("partitioned_adamw: fp32 parameters in a file need the optimizer state elsewhere too "
                        "(offload_optimizer)");
    }
    if (group_of.size() != layout.param_count()) {
      throw usage_error("partitioned_adamw: " + std::to_string(group_of.size()) + " group indices for " +
                        std::to_string(layout.param_count()) + " parameters");
    }
    std::tie(ranges_, state_size_) = owned_ranges(layout, place);
    for (const auto& [range, state_offset] : ranges_) {
      range_runs_.push_back(runs_.size());
      split_runs(range, state_offset, group_of);
    }
    range_runs_.push_back(runs_.size());
    if (place.rule == update_rule::custom) {
      const auto* step = find_custom_rule_step<Backend>(place.custom_steps);
      if (step == nullptr) {
        throw usage_error("partitioned_adamw: the config names a framework's own rule, but no step of it was given "
                          "for this backend; call use_rule<Rule>() on the engine before finalize");
      }
      custom_ = *step; // looked up once, not at every run's step
    }
    if (place.rule == update_rule::lamb) {
      if (place.state_elsewhere || place.state_begin != 0 ||
          place.state_end != std::numeric_limits<std::size_t>::max()) {
        throw usage_error("partitioned_adamw: Lamb's trust ratio needs every piece of the rank's state here; found "
                          "the state split or elsewhere (offload_optimizer)");
      }
      make_pieces(alloc, group_of);
    }
    if (place.rule != update_rule::adamw && (place.state_elsewhere || place.state_tensors > max_rule_state)) {
      throw usage_error("partitioned_adamw: " + std::string(name_of(place.rule)) + " keeps " +
                        std::to_string(place.state_tensors) + " state tensors " +
                        (place.state_elsewhere ? "elsewhere" : "") + "; expected them here, at most " +
                        std::to_string(max_rule_state));
    }
    if (place.state_elsewhere) {
      return;
    }
    // The rule's state tensors (Adam's m and v; Lion, SGD with momentum and Adagrad keep one, SGD without none).
    for (buffer<float, counting>* t : {&m_, &v_}) {
      if (t == &m_ ? place.state_tensors >= 1 : place.state_tensors >= 2) {
        *t = buffer<float, counting>(alloc, state_size_, memory_tag::optimizer);
        backend_.fill(t->data(), state_size_, place.state_init, stream_);
      }
    }
    if (param_type_ != dtype::f32) {
      master_ = buffer<float, counting>(alloc, state_size_, memory_tag::optimizer);
      backend_.fill(master_.data(), state_size_, 0.0f, stream_);
    }
  }

  /// The owned ranges: (flat range, state offset), one per segment or one for everything.
  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept { return ranges_; }
  /// The owned runs, split by parameter group.
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return runs_; }
  /// Elements of optimizer state per buffer (master, m, v).
  [[nodiscard]] std::size_t state_size() const noexcept { return state_size_; }
  /// The fp32 master copy of the owned elements (null for fp32 training, where `params` is it).
  [[nodiscard]] float* master() noexcept { return master_.data(); }
  [[nodiscard]] float* exp_avg() noexcept { return m_.data(); }
  [[nodiscard]] float* exp_avg_sq() noexcept { return v_.data(); }
  /// The rule this optimizer runs, and the state tensors it keeps beside the master (exp_avg first).
  [[nodiscard]] update_rule rule() const noexcept { return place_.rule; }
  [[nodiscard]] std::size_t state_tensors() const noexcept { return place_.state_tensors; }
  /// Group hyper-parameters, changeable between steps.
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return groups_; }
  /// True when an fp32 master copy is kept apart from the parameters (16-bit training).
  [[nodiscard]] bool has_master() const noexcept { return param_type_ != dtype::f32; }

  /// Copies `out.size()` elements of `t` from state index `state_offset` on into host memory, after
  /// the work enqueued so far (the master of fp32 training is read from the parameters).
  /// \throws usage_error for a range outside the state.
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    for_each_piece(t, state_offset, out.size(), [&](float* p, std::size_t done, std::size_t n) {
      download<A::host_accessible>(backend_, stream_, p, out.data() + done, n);
    });
  }
  /// Writes host values into `t` from state index `state_offset` on (for fp32 training, `master`
  /// writes the parameters). \throws usage_error for a range outside the state.
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    for_each_piece(t, state_offset, in.size(), [&](float* p, std::size_t done, std::size_t n) {
      upload<A::host_accessible>(backend_, stream_, in.data() + done, p, n);
    });
  }

  /// Fills the master copy from the owned part of the low-precision parameters.
  void load_master() {
    if (param_type_ == dtype::f32 || place_.params_from_master) {
      return;
    }
    visit_float(param_type_, [&]<class P>(type_tag<P>) {
      const P* base = reinterpret_cast<const P*>(params_base());
      for (const auto& [range, state_offset] : ranges_) {
        const P* src = base + (place_.params_sharded ? state_offset : range.begin);
        backend_.cast(src, master_.data() + state_offset, range.size(), stream_);
      }
    });
  }

  /// True when the rule scales each parameter's step by a trust ratio: `form_trust_ratios` comes before
  /// each step's `step` or `step_range` calls.
  [[nodiscard]] bool needs_trust_ratios() const noexcept { return place_.rule == update_rule::lamb; }

  /// LAMB's first pass over every owned piece (its moments, its sums of master² and direction²), the sums of
  /// each parameter over the ranks holding its pieces, and each parameter's ratio (see the file comment), for
  /// the step `base.step`. Arguments as `step`'s; `sum_over_ranks(double* sums, n, host)` adds `n` doubles over
  /// those ranks in place (the engine's shard group; nothing at stage 0, where a rank holds every piece), after the
  /// work enqueued on this optimizer's stream: in this optimizer's memory, host memory when `host` (an optimizer
  /// of the host's, `offloaded_adamw`'s).
  template <class GradOf, class GroupLr, class SumOverRanks>
  void form_trust_ratios(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of,
                         SumOverRanks&& sum_over_ranks) {
    const std::size_t n = 2 * layout_.param_count();
    std::fill(norms_host_.begin(), norms_host_.end(), 0.0);
    upload<A::host_accessible>(backend_, stream_, norms_host_.data(), norms_.data(), n);
    visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
      for (const piece& pc : pieces_) {
        const auto& [range, off] = ranges_[pc.range];
        const std::size_t d = pc.state_offset - off;
        adamw_step_args a = base;
        a.lr = static_cast<float>(group_lr(groups_[group_of_[pc.param]].lr));
        a.weight_decay = static_cast<float>(groups_[group_of_[pc.param]].weight_decay);
        const G* g = reinterpret_cast<const G*>(static_cast<const std::byte*>(grad_of(range, off))) + d;
        const float* w = has_master() ? master_.data() + pc.state_offset
                                      : reinterpret_cast<const float*>(place_.params) +
                                            (place_.params_sharded ? pc.state_offset : range.begin + d);
        backend_.template rule_norms<rules::lamb>(w, {m_.data() + pc.state_offset, v_.data() + pc.state_offset}, g,
                                                  pc.count, a, norms_.data() + 2 * pc.param, workspace_.data(),
                                                  workspace_.size(), stream_);
      }
    });
    if (place_.partitioned) {
      sum_over_ranks(norms_.data(), n, A::host_accessible);
    }
    download<A::host_accessible>(backend_, stream_, norms_.data(), norms_host_.data(), n);
    for (std::size_t p = 0; p < ratio_.size(); ++p) {
      ratio_[p] = rules::trust_ratio(norms_host_[2 * p], norms_host_[2 * p + 1], base.min_coeff, base.max_coeff);
    }
    ratios_step_ = base.step;
  }
  /// The trust ratio of parameter `id` formed by the last `form_trust_ratios` (1 before any).
  [[nodiscard]] float trust_ratio(std::size_t id) const { return ratio_.at(id); }

  /// One optimizer step over every owned run.
  /// \param base      betas, eps, mode, bias corrections and grad_scale; lr and weight decay come from
  ///                  the groups through `group_lr`.
  /// \param group_lr  maps a group's own lr to the lr of this step (the schedule).
  /// \param grad_of   returns the reduced gradient of an owned range given (flat range, state offset),
  ///                  in the placement's gradient dtype.
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    step_runs(0, ranges_.size(), stream_, base, group_lr, grad_of);
  }

  /// The same step over segment `k`'s owned elements only, enqueued on `s`: partitioned, owned range `k`
  /// (`ranges()[k]`, the rank's slice of segment k); otherwise segment k's part of the one range of every
  /// element (stage 0). The engine steps segment by segment on a stream of its own, beside the next forward,
  /// and all-gathers each segment (stages 1-2) as soon as its update is enqueued.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const typename Backend::stream_type& s, const adamw_step_args& base,
                  GroupLr&& group_lr, GradOf&& grad_of) {
    const std::size_t segments = layout_.segments().size();
    if (k >= segments) { // partitioned, there is one owned range per segment
      throw usage_error("partitioned_adamw::step_range: segment " + std::to_string(k) +
                        " does not exist; the layout has " + std::to_string(segments) + " segments");
    }
    if (place_.partitioned) {
      step_runs(k, k + 1, s, base, group_lr, grad_of);
    } else {
      step_part(0, layout_.segments()[k].range, s, base, group_lr, grad_of);
    }
  }

  /// The elements [first, first + count) of owned range `range` (state indices), and where their
  /// state, gradients (in the gradient dtype) and parameters (in the parameter dtype) are, each
  /// pointer at element `first`; `master` is null for fp32 training (`params` is the master).
  struct window {
    std::size_t range = 0;
    std::size_t first = 0;
    std::size_t count = 0;
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    const std::byte* grads = nullptr;
    std::byte* params = nullptr;
    /// Where the step reads the state from when it is not `master`, `m`, `v` (an update out of place,
    /// which keeps the previous state: needs the backend's `adamw_step_from`, 16-bit training); all
    /// three or none.
    const float* master_in = nullptr;
    const float* m_in = nullptr;
    const float* v_in = nullptr;
  };

  /// AdamW over the runs of `w` on `s`, with state wherever `w` says (the step of a window of state
  /// streamed through host buffers; `step` and `step_range` are windows over this optimizer's own
  /// buffers). \throws usage_error for a window outside its range.
  template <class GroupLr>
  void step_window(const window& w, const typename Backend::stream_type& s, const adamw_step_args& base,
                   GroupLr&& group_lr) {
    if (w.range >= ranges_.size() || w.first < ranges_[w.range].second ||
        w.first + w.count > ranges_[w.range].second + ranges_[w.range].first.size()) {
      throw usage_error("partitioned_adamw::step_window: elements [" + std::to_string(w.first) + ", " +
                        std::to_string(w.first + w.count) + ") are not in owned range " + std::to_string(w.range));
    }
    const bool out_of_place = w.master_in != nullptr;
    if (out_of_place && (w.m_in == nullptr || w.v_in == nullptr || !has_master())) {
      throw usage_error("partitioned_adamw::step_window: an update out of place needs master_in, m_in and v_in, and "
                        "16-bit parameters (fp32 training updates its parameters in place)");
    }
    visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
      visit_float(param_type_, [&]<class P>(type_tag<P>) {
        for (std::size_t r = range_runs_[w.range]; r < range_runs_[w.range + 1]; ++r) {
          const auto& run = runs_[r];
          const std::size_t lo = std::max(run.state_offset, w.first);
          const std::size_t hi = std::min(run.state_offset + run.flat.size(), w.first + w.count);
          if (lo >= hi) {
            continue;
          }
          adamw_step_args a = base;
          a.lr = static_cast<float>(group_lr(groups_[run.group].lr));
          a.weight_decay = static_cast<float>(groups_[run.group].weight_decay);
          const std::size_t d = lo - w.first;
          const G* g = reinterpret_cast<const G*>(w.grads) + d;
          P* p = w.params != nullptr ? reinterpret_cast<P*>(w.params) + d : nullptr;
          if (needs_trust_ratios()) {
            step_pieces(w, lo, hi, g, p, a, s);
          } else if (place_.rule != update_rule::adamw) {
            step_rule(std::is_same_v<P, float> ? reinterpret_cast<float*>(p) : w.master + d, w, d, g,
                      std::is_same_v<P, float> ? nullptr : p, hi - lo, a, s);
          } else if constexpr (std::is_same_v<P, float>) {
            // fp32 training: the parameters are the master copy.
            backend_.adamw_step(p, w.m + d, w.v + d, g, static_cast<float*>(nullptr), hi - lo, a, s);
          } else if (out_of_place) {
            if constexpr (requires {
                            backend_.adamw_step_from(w.master_in, w.m_in, w.v_in, w.master, w.m, w.v, g, p, hi - lo, a,
                                                     s);
                          }) {
              backend_.adamw_step_from(w.master_in + d, w.m_in + d, w.v_in + d, w.master + d, w.m + d, w.v + d, g, p,
                                       hi - lo, a, s);
            } else {
              throw usage_error("partitioned_adamw::step_window: this backend has no adamw_step_from (an update out "
                                "of place)");
            }
          } else {
            backend_.adamw_step(w.master + d, w.m + d, w.v + d, g, p, hi - lo, a, s);
          }
        }
      });
    });
  }

private:
  /// A parameter's piece in an owned range (LAMB): its state indices [state_offset, state_offset + count).
  struct piece {
    std::size_t range = 0;
    std::size_t state_offset = 0;
    std::size_t count = 0;
    std::size_t param = 0;
  };

  /// The pieces of every parameter in the owned ranges, in order, and LAMB's sums, ratios and workspace.
  void make_pieces(counting alloc, const std::vector<std::size_t>& group_of) {
    group_of_ = group_of;
    std::size_t workspace = 0;
    for (std::size_t k = 0; k < ranges_.size(); ++k) {
      const auto& [range, off] = ranges_[k];
      range_pieces_.push_back(pieces_.size());
      for (std::size_t id : layout_.flat_order()) {
        const auto& p = layout_.param(id);
        const std::size_t b = std::max(range.begin, p.offset);
        const std::size_t e = std::min(range.end, p.offset + p.numel);
        if (b < e) {
          pieces_.push_back({k, off + (b - range.begin), e - b, id});
          workspace = std::max(workspace, backend_.rule_norms_workspace_bytes(e - b));
        }
      }
    }
    range_pieces_.push_back(pieces_.size());
    const std::size_t n = 2 * layout_.param_count();
    norms_ = buffer<double, counting>(alloc, std::max<std::size_t>(n, 1), memory_tag::buffers);
    norms_host_.assign(n, 0.0);
    ratio_.assign(layout_.param_count(), 1.0f);
    workspace_ = buffer<std::byte, counting>(alloc, std::max<std::size_t>(workspace, 1), memory_tag::buffers);
  }

  /// LAMB's second pass over the state elements [lo, hi) of window `w` (one group's run): each parameter's piece
  /// moved by its ratio; `g` and `p` point at element lo. Padding between the pieces stays as it is (zero).
  template <class G, class P>
  void step_pieces(const window& w, std::size_t lo, std::size_t hi, const G* g, P* p, const adamw_step_args& a,
                   const typename Backend::stream_type& s) {
    if (ratios_step_ != a.step) {
      throw usage_error("partitioned_adamw: Lamb's step " + std::to_string(a.step) +
                        " has no trust ratios; form_trust_ratios comes first in each step");
    }
    for (std::size_t j = range_pieces_[w.range]; j < range_pieces_[w.range + 1]; ++j) {
      const piece& pc = pieces_[j];
      const std::size_t b = std::max(lo, pc.state_offset);
      const std::size_t e = std::min(hi, pc.state_offset + pc.count);
      if (b >= e) {
        continue;
      }
      adamw_step_args at = a;
      at.trust_ratio = ratio_[pc.param];
      const std::size_t d = b - w.first; // from the window's first element
      const std::size_t from_lo = b - lo;
      step_rule(std::is_same_v<P, float> ? reinterpret_cast<float*>(p + from_lo) : w.master + d, w, d, g + from_lo,
                std::is_same_v<P, float> || p == nullptr ? nullptr : p + from_lo, e - b, at, s);
    }
  }

  /// `place_.rule`'s step over n elements of window `w` from its element d: `master` the fp32 parameter,
  /// `param` the low-precision copy or null. \throws usage_error for a backend without `rule_step`.
  template <class G, class P>
  void step_rule(float* master, const window& w, std::size_t d, const G* g, P* param, std::size_t n,
                 const adamw_step_args& a, const typename Backend::stream_type& s) {
    if (w.master_in != nullptr) {
      throw usage_error("partitioned_adamw::step_window: an update out of place runs Adam/AdamW only, not " +
                        std::string(name_of(place_.rule)));
    }
    const std::array<float*, max_rule_state> state{w.m != nullptr ? w.m + d : nullptr,
                                                   w.v != nullptr ? w.v + d : nullptr};
    if (place_.rule == update_rule::custom) {
      custom_.run(backend_, master, state, reinterpret_cast<const std::byte*>(g), place_.grad_type,
                  reinterpret_cast<std::byte*>(param), dtype_v<P>, n, a, s);
      return;
    }
    visit_rule(place_.rule, [&]<class R>(std::type_identity<R>) {
      if constexpr (requires { backend_.template rule_step<R>(master, state, g, param, n, a, s); }) {
        backend_.template rule_step<R>(master, state, g, param, n, a, s);
      } else {
        throw usage_error("partitioned_adamw: this backend has no rule_step, which optimizer.type " +
                          std::string(R::name) + " needs (zero/backend/update_rules.hpp)");
      }
    });
  }

  /// The parameters' first byte: `params`, or an image of a shard that lives in a file.
  std::byte* params_base() {
    return place_.params_in_file ? place_.params_in_file(param_use::whole, 0) : place_.params;
  }

  /// Calls `f(pointer, done, count)` for the pieces of `n` elements of `t` from state index
  /// `state_offset` on: one piece, but for the master of unsharded fp32 parameters (one per owned range).
  template <class F> void for_each_piece(state_tensor t, std::size_t state_offset, std::size_t n, F&& f) {
    if (state_offset + n > state_size_ || state_offset + n < n) {
      throw usage_error("partitioned_adamw: state elements [" + std::to_string(state_offset) + ", " +
                        std::to_string(state_offset + n) + ") are outside this rank's " + std::to_string(state_size_));
    }
    if (n == 0) {
      return;
    }
    if (place_.state_elsewhere) {
      throw usage_error("partitioned_adamw: the state lives elsewhere (adamw_placement::state_elsewhere)");
    }
    if (t != state_tensor::master && state_slot(t) >= place_.state_tensors) {
      throw usage_error("partitioned_adamw: " + std::string(name_of(place_.rule)) + " keeps " +
                        std::to_string(place_.state_tensors) + " state tensors beside the master; " +
                        (t == state_tensor::exp_avg ? "exp_avg" : "exp_avg_sq") + " is not one of them");
    }
    if (t != state_tensor::master || has_master() || place_.params_sharded) {
      float* base = t == state_tensor::exp_avg      ? m_.data()
                    : t == state_tensor::exp_avg_sq ? v_.data()
                    : has_master()                  ? master_.data()
                                                    : reinterpret_cast<float*>(place_.params);
      f(base + state_offset, 0, n);
      return;
    }
    // fp32 training over the whole flat buffer: the owned ranges' elements, by flat index.
    float* params = reinterpret_cast<float*>(place_.params);
    for (const auto& [range, offset] : ranges_) {
      const std::size_t lo = std::max(state_offset, offset);
      const std::size_t hi = std::min(state_offset + n, offset + range.size());
      if (lo < hi) {
        f(params + range.begin + (lo - offset), lo - state_offset, hi - lo);
      }
    }
  }

  /// AdamW over the runs of owned ranges [first, last), on `s`.
  template <class GradOf, class GroupLr>
  void step_runs(std::size_t first, std::size_t last, const typename Backend::stream_type& s,
                 const adamw_step_args& base, GroupLr& group_lr, GradOf& grad_of) {
    for (std::size_t k = first; k < last; ++k) {
      step_part(k, ranges_[k].first, s, base, group_lr, grad_of);
    }
  }

  /// AdamW over the elements of owned range `k` inside flat range `part` (none when they do not meet), on `s`.
  template <class GradOf, class GroupLr>
  void step_part(std::size_t k, const flat_range& part, const typename Backend::stream_type& s,
                 const adamw_step_args& base, GroupLr& group_lr, GradOf& grad_of) {
    const auto& [range, off] = ranges_[k];
    const std::size_t lo = std::max(range.begin, part.begin);
    const std::size_t hi = std::min(range.end, part.end);
    if (lo >= hi) {
      return;
    }
    const std::size_t d = lo - range.begin; // the part's first element in the range
    const std::size_t psize = size_of(param_type_);
    step_window({.range = k,
                 .first = off + d,
                 .count = hi - lo,
                 .master = has_master() ? master_.data() + off + d : nullptr,
                 .m = m_.data() != nullptr ? m_.data() + off + d : nullptr,
                 .v = v_.data() != nullptr ? v_.data() + off + d : nullptr,
                 .grads = static_cast<const std::byte*>(grad_of(range, off)) + d * size_of(place_.grad_type),
                 .params = place_.params_in_file ? place_.params_in_file(param_use::update, k) + d * psize
                           : place_.params_from_master
                               ? nullptr
                               : place_.params + ((place_.params_sharded ? off : range.begin) + d) * psize},
                s, base, group_lr);
  }

  void split_runs(const flat_range& range, std::size_t state_offset, const std::vector<std::size_t>& group_of) {
    // Parameter pieces inside the range, in flat order, each with its group.
    std::vector<std::pair<std::size_t, std::size_t>> starts; // (flat start, group)
    for (std::size_t id : layout_.flat_order()) {
      const auto& p = layout_.param(id);
      const std::size_t b = std::max(range.begin, p.offset);
      const std::size_t e = std::min(range.end, p.offset + p.numel);
      if (b < e) {
        starts.emplace_back(b, group_of[id]);
      }
    }
    std::size_t group = starts.empty() ? 0 : starts.front().second;
    std::size_t cursor = range.begin;
    for (const auto& [start, g] : starts) {
      if (g != group) {
        if (start > cursor) {
          runs_.push_back({{cursor, start}, state_offset + (cursor - range.begin), group});
        }
        cursor = start;
        group = g;
      }
    }
    if (range.end > cursor) {
      runs_.push_back({{cursor, range.end}, state_offset + (cursor - range.begin), group});
    }
  }

  const flat_layout& layout_;
  Backend& backend_;
  typename Backend::stream_type& stream_;
  std::vector<param_group> groups_;
  dtype param_type_;
  adamw_placement place_;
  std::vector<std::pair<flat_range, std::size_t>> ranges_;
  std::vector<owned_run> runs_;
  /// Runs of owned range k: [range_runs_[k], range_runs_[k + 1]) (runs are split range by range, in order).
  std::vector<std::size_t> range_runs_;
  std::size_t state_size_ = 0;
  buffer<float, counting> master_;
  buffer<float, counting> m_;
  buffer<float, counting> v_;
  // LAMB: the parameters' pieces (those of owned range k are [range_pieces_[k], range_pieces_[k + 1])), each
  // parameter's group, its two sums (backend memory and a host copy), its ratio, and the step they were formed for.
  std::vector<piece> pieces_;
  std::vector<std::size_t> range_pieces_;
  std::vector<std::size_t> group_of_;
  buffer<double, counting> norms_;
  std::vector<double> norms_host_;
  std::vector<float> ratio_;
  buffer<std::byte, counting> workspace_;
  std::int64_t ratios_step_ = -1;
  // A framework's rule: its step on this backend (`adamw_placement::custom_steps`).
  custom_rule_step<Backend> custom_;
};

} // namespace zero
