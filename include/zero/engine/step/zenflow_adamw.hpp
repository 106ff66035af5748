#pragma once
/// \file
/// `zenflow_adamw`: DeepSpeed's ZenFlow step (`zero_optimization.zenflow`, docs/offload.md "Selective") over
/// ZeRO-Offload's, the whole optimizer state in host memory (`offloaded_adamw`). After `full_warm_up_rounds`
/// exact steps, the top `topk_ratio` columns of each 2-D weight by the L1 norm of their gradient are chosen
/// (`zenflow_schedule::selects`, zero/optim/zenflow.hpp); every element of any other parameter is chosen too.
/// The chosen elements' master, m and v move to a compact fp32 copy in backend memory, and every step:
///
///     device   the chosen gradients gathered from each reduced slice as it is handed to the host (`take`),
///              AdamW over the compact copy with the step's arguments (clipped by the step's norm), and
///              the new parameters scattered into the device's (`can_index_copy`)
///     host     the whole gradient shard added into the window, an fp32 sum in host memory (cast into it when
///              the window is empty), on a thread of its own beside the next step's forward and backward:
///              range k's add is waited for only before the next step's slice of range k is copied over it
///
/// At a host step (`zenflow_schedule::updates_host`) the host applies the window's mean instead, clipped by that
/// mean's norm, with AdamW over the whole shard, and uploads it; the device's update and scatter follow, so the
/// chosen elements keep their own (the host's update of them is thrown away: the compact copy is written back
/// over it before anything reads the host's state, `flush`). A step that chooses again writes the compact copy
/// back, sums the columns of the step's gradients in the host shard (all-reduced over the ranks, so each rank
/// chooses the same) and loads the new choice's state. The gradients of the chosen elements are never applied
/// twice: the host's step runs over them but `flush` discards it.
///
/// zero departs from DeepSpeed's code on purpose (tests/engine/zenflow_reference.hpp is the oracle): the chosen
/// columns' state moves with them, the device's update is clipped, and the host applies the mean of the steps
/// since its last update. Stages 1-3 (stage 1's gradients stay on the device until the step: `fetch`), the
/// parameters on the device, `overlap_step` without accumulation: `check_engine_config` refuses the rest.

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/detail/zenflow_window.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/optim/zenflow.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// ZenFlow's keys as the step uses them. `overlap` (`overlap_step`): the host's update of an interval runs on its
/// thread beside the next interval's steps and reaches the device at the next host step (one interval late).
struct zenflow_options {
  double topk_ratio = 0.1;
  zenflow_schedule schedule{};
  bool overlap = false;
};

/// ZenFlow's optimizer over a rank's part of the flat buffer; see the file comment. The state view is
/// `partitioned_adamw`'s (`ranges`, `runs`, `state_size`, `groups`, `has_master`, `load_master`, `read_state`,
/// `write_state`), with the compact copy written back first; the window is `window`/`window_steps`, the choice
/// `columns`.
template <backend Backend, allocator DeviceAlloc> class zenflow_adamw {
  using host_type = offloaded_adamw<Backend, DeviceAlloc>;
  using host_alloc = offload_allocator_t<Backend>;
  using host_counting = counting_allocator<host_alloc>;
  using device_counting = counting_allocator<DeviceAlloc>;
  using stream_type = typename Backend::stream_type;
  static constexpr bool device_host_accessible = DeviceAlloc::host_accessible;

public:
  /// A column sum's all-reduce over the ranks, on backend memory (`n` floats at `sums`), waited for.
  using reduce_fn = std::function<void(float* sums, std::size_t n)>;

  /// \param layout, place, group_of, groups, backend, host, stream, opt as `offloaded_adamw`'s (`place.params`
  ///               the device parameters the compact update scatters into).
  /// \param device backend memory for the compact copy and its indices (counted under `memory_tag::optimizer`).
  /// \throws usage_error for parameters not on the device, a backend without gather and scatter, or a bad ratio.
  zenflow_adamw(const flat_layout& layout, adamw_placement place, std::vector<std::size_t> group_of,
                std::vector<param_group> groups, Backend& backend, device_counting device, host_alloc host,
                stream_type& stream, offload_options opt, zenflow_options z)
      : layout_(layout), place_(place), backend_(backend), device_(std::move(device)), stream_(stream), z_(z),
        host_(layout, place, std::move(group_of), std::move(groups), backend, host, stream, with_delay(opt, z.overlap)),
        window_(host_.host_memory(), host, opt.threads, host_.ranges(), host_.state_size(), place.grad_type),
        sums_at_(layout.param_count(), npos) {
    if constexpr (!can_index_copy<Backend>) {
      throw usage_error("zenflow_adamw: the backend has no gather and scatter (zero::can_index_copy), which ZenFlow's "
                        "device update needs");
    }
    if (place.params == nullptr || place.params_on_host || place.params_in_file) {
      throw usage_error("zenflow_adamw: ZenFlow scatters its updates into the device's parameters; expected them on "
                        "the device (no offload_param)");
    }
    z.schedule.check();
    static_cast<void>(zenflow_column_count(z.topk_ratio, 1)); // the ratio's check
    std::size_t sums = 0;
    for (std::size_t id = 0; id < layout.param_count(); ++id) {
      if (layout.param(id).shape.size() == 2) {
        sums_at_[id] = sums;
        sums += static_cast<std::size_t>(layout.param(id).shape[1]);
      }
    }
    sums_size_ = sums;
    columns_.resize(layout.param_count());
  }

  // ---- the state view ----
  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept {
    return host_.ranges();
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return host_.runs(); }
  [[nodiscard]] std::size_t state_size() const noexcept { return host_.state_size(); }
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return host_.groups(); }
  [[nodiscard]] bool has_master() const noexcept { return host_.has_master(); }
  /// The host's bytes: `offloaded_adamw`'s and the window (`memory_tag::grads`).
  [[nodiscard]] const host_counting& host_memory() const noexcept { return host_.host_memory(); }
  [[nodiscard]] auto& grads() noexcept { return host_.grads(); }
  [[nodiscard]] unsigned threads() const noexcept { return host_.threads(); }
  /// The state starts again from the device's parameters (`init_params`): as after `write_state`.
  void load_master() {
    host_.load_master();
    restart_ = true;
  }
  /// The state with the compact copy written back (`flush`).
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    flush();
    host_.read_state(t, state_offset, out);
  }
  /// Writes the host's state (a checkpoint's load): the next step begins ZenFlow again from it, with an empty
  /// window, and chooses its columns (at once, past the warm-up).
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    flush();
    host_.write_state(t, state_offset, in);
    restart_ = true;
  }

  // ---- ZenFlow's own state, what a checkpoint saves beside AdamW's ----
  /// The window: the sum of the gradients of the steps since the host's last update (fp32, one per state element),
  /// its adds finished; zeros when it sums no step (its memory is then filled first).
  [[nodiscard]] std::span<float> window() { return window_.values(window_steps_, host_.state_size()); }
  /// The steps the window sums.
  [[nodiscard]] std::int64_t window_steps() const noexcept { return window_steps_; }
  /// The chosen columns of parameter `id` (ascending; empty before the first choice and for a parameter that
  /// is not a 2-D weight).
  [[nodiscard]] const std::vector<std::int64_t>& columns(std::size_t id) const { return columns_.at(id); }
  /// True once columns were chosen.
  [[nodiscard]] bool selected() const noexcept { return selected_; }
  /// The chosen elements of this rank's shard, whose compact state (index, master, m, v, gradient and, for 16-bit
  /// parameters, parameter) lives in backend memory; 0 before the first choice.
  [[nodiscard]] std::size_t chosen_elements() const noexcept { return index_host_.size(); }
  /// Restores a checkpoint's window count and choice, after its AdamW state was written (`write_state`); its
  /// window's values go into `window()` next. The compact copy is loaded from the host's state as the next step
  /// begins. A choice of another size than this run's `topk_ratio` makes (a checkpoint of another ratio) is not
  /// kept: the next step past the warm-up chooses again. \throws usage_error for columns of another count of
  /// parameters, for a parameter that is not a 2-D weight, or out of order or range (the state is unchanged).
  void restore(std::int64_t window_steps, std::vector<std::vector<std::int64_t>> columns, bool selected) {
    if (window_steps < 0 || columns.size() != columns_.size()) {
      throw usage_error("zenflow_adamw::restore: " + std::to_string(window_steps) + " window steps and columns of " +
                        std::to_string(columns.size()) + " parameters; expected >= 0 and " +
                        std::to_string(columns_.size()));
    }
    bool fits = true;
    for (std::size_t id = 0; id < columns.size(); ++id) {
      const auto& p = layout_.param(id);
      if (sums_at_[id] == npos) {
        if (!columns[id].empty()) {
          throw usage_error("zenflow_adamw::restore: columns of \"" + p.name + "\", which is not a 2-D weight");
        }
        continue;
      }
      static_cast<void>(column_elements(columns[id], p.shape[1], 0, 0)); // their order and bounds
      fits = fits && columns[id].size() == static_cast<std::size_t>(zenflow_column_count(z_.topk_ratio, p.shape[1]));
    }
    window_.join();
    window_steps_ = window_steps;
    columns_ = std::move(columns);
    selected_ = selected && fits;
    restart_ = false;
    if (selected_) {
      build();
      reload_ = true;
    }
  }

  // ---- the step ----
  /// Connects the column sums' all-reduce (the plan's data group).
  void connect(reduce_fn reduce) { reduce_ = std::move(reduce); }
  /// A step begins that will be the `m`-th applied (from 0): what it does follows ZenFlow's schedule. Called as
  /// the micro-step begins, at each slice taken and as the step applies: a load between them (a checkpoint's,
  /// `init_params`) changes m, the window and the choice.
  void begin_step(std::int64_t m) {
    if (std::exchange(restart_, false)) {
      window_.join(); // the window is void: the next window step casts into it
      window_steps_ = 0;
      selected_ = false;
    }
    if (std::exchange(reload_, false) && selected_) {
      reload();
    }
    warming_ = z_.schedule.warming(m);
    selects_ = !warming_ && (z_.schedule.selects(m) || !selected_);
    host_step_ = warming_ || z_.schedule.updates_host(m);
    gather_at_take_ = !warming_ && selected_ && !selects_;
  }
  [[nodiscard]] bool warming() const noexcept { return warming_; }
  [[nodiscard]] bool selects() const noexcept { return selects_; }
  /// True when this step ends with the host applying a window of more than its own gradients: the plan writes
  /// its mean into the host shard (`mean_into_shard`) and clips the host's update by that mean's norm.
  [[nodiscard]] bool averages() const noexcept { return !warming_ && host_step_ && window_steps_ > 0; }
  /// True when this step's host update runs beside the next steps (`overlap_step`, past the warm-up): the plan
  /// publishes the one before it (`begin_publish`, the step, `end_publish`) and then hands this one to the host's
  /// thread (`begin_delayed`).
  [[nodiscard]] bool overlaps() const noexcept { return z_.overlap && !warming_ && host_step_; }
  /// True when made for `overlap_step`.
  [[nodiscard]] bool overlap() const noexcept { return z_.overlap; }
  void begin_publish() { host_.begin_publish(); }
  void end_publish() { host_.end_publish(); }
  /// Hands this step's host update to the host's thread, with the host's arguments of `set_host_args` (or `base`)
  /// and the schedule's group learning rate by value.
  void begin_delayed(const adamw_step_args& base, std::function<double(double)> group_lr) {
    host_.begin_delayed(host_args_.value_or(base), std::move(group_lr));
  }
  /// Publishes a host update still unpublished on `s` for a reader, then scatters the chosen elements' own
  /// parameters over the stale ones it uploaded. \returns true when one was pending.
  bool publish(const stream_type& s) {
    if (!host_.publish(s)) {
      return false;
    }
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      scatter_compact(k, s);
    }
    return true;
  }

  /// Range `k`'s reduced slice at `slice` (in backend memory) of the `m`-th step, before it goes to the host. When
  /// it is `final` (no accumulation) the chosen elements' gradients are gathered from it on the engine's stream;
  /// with accumulation they come from the host shard's sums at the step (`take_from_shard`).
  void take(std::size_t k, const std::byte* slice, bool final, std::int64_t m) {
    window_.wait(k); // the last step's add still reads range k's host shard, which this slice's copy overwrites
    begin_step(m);
    if (!final || !gather_at_take_ || count(k) == 0) {
      return;
    }
    if constexpr (can_index_copy<Backend>) {
      visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
        backend_.gather(reinterpret_cast<const G*>(slice), index_.data() + begin_[k], count(k),
                        reinterpret_cast<G*>(grad_.data()) + begin_[k], stream_);
      });
    }
  }
  /// Stage 1 (the reduced gradients kept on the device, checked and unscaled there): gathers the chosen elements'
  /// gradients from each range's (`grad_of(range, state offset)`) and posts every range's copy to the host shard,
  /// which the choice and the window read before the host's step would fetch it.
  template <class GradOf> void fetch(GradOf&& grad_of, std::int64_t m) {
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      const auto& [range, off] = ranges()[k];
      take(k, static_cast<const std::byte*>(grad_of(range, off)), true, m);
    }
    grads().fetch_all(stream_, grad_of);
  }
  /// The chosen elements' gradients of this step from the host shard (checked, unscaled), uploaded: after a choice
  /// (whose slices left the device before it) and with gradient accumulation. Nothing in the warm-up.
  void take_from_shard() {
    if (warming_ || !selected_) {
      return;
    }
    visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
      std::vector<G> g(index_host_.size());
      for (std::size_t k = 0; k < ranges().size(); ++k) {
        const G* shard = reinterpret_cast<const G*>(landed(k));
        for (std::size_t j = begin_[k]; j < begin_[k + 1]; ++j) {
          g[j] = shard[index_host_[j]];
        }
      }
      upload<device_host_accessible>(backend_, stream_, g.data(), reinterpret_cast<G*>(grad_.data()), g.size());
    });
  }

  /// Chooses the columns from this step's gradients (in the host shard; see the file comment).
  void select() {
    window_.join();
    flush();
    std::vector<float> sums(sums_size_, 0.0F);
    visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
      for_each_part([&](std::size_t k, std::size_t id, std::size_t lo, std::size_t hi) {
        const auto& p = layout_.param(id);
        if (sums_at_[id] == npos) {
          return;
        }
        const auto cols = p.shape[1];
        const G* g = reinterpret_cast<const G*>(landed(k)) + (lo - ranges()[k].first.begin);
        add_column_abs<G>(std::span<const G>(g, hi - lo), static_cast<std::int64_t>(lo - p.offset), cols,
                          std::span<float>(sums.data() + sums_at_[id], static_cast<std::size_t>(cols)));
      });
    });
    if (reduce_ && sums_size_ > 0) {
      buffer<float, device_counting> d(device_, sums_size_, memory_tag::buffers);
      upload<device_host_accessible>(backend_, stream_, sums.data(), d.data(), sums_size_);
      reduce_(d.data(), sums_size_);
      download<device_host_accessible>(backend_, stream_, d.data(), sums.data(), sums_size_);
    }
    for (std::size_t id = 0; id < columns_.size(); ++id) {
      if (sums_at_[id] != npos) {
        const auto cols = layout_.param(id).shape[1];
        columns_[id] = top_columns(std::span<const float>(sums.data() + sums_at_[id], static_cast<std::size_t>(cols)),
                                   zenflow_column_count(z_.topk_ratio, cols));
      }
    }
    selected_ = true;
    build();
    reload();
    take_from_shard();
  }

  /// Writes the window's mean, with this step's gradients, into the host shard, and empties the window.
  void mean_into_shard() {
    window_.join();
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      window_.mean_into(k, landed(k), window_steps_);
    }
  }

  /// The host's arguments of this step when they are not the step's (a window's mean, clipped by its norm).
  void set_host_args(const adamw_step_args& args) { host_args_ = args; }

  /// One step over every owned range (the engine's stream).
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      step_range(k, stream_, base, group_lr, grad_of);
    }
  }
  /// The step of owned range `k` on `s`: in the warm-up, the host's alone; else the host's update (a host step)
  /// or the window's sum, then the compact update and its scatter.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    if (warming_) {
      host_.step_range(k, s, base, group_lr, grad_of);
      return;
    }
    if (host_step_) {
      host_.step_range(k, s, host_args_.value_or(base), group_lr, grad_of);
    } else {
      window_.hold(k, landed(k)); // added into the window at end_step, on the window's thread
    }
    update_compact(k, s, base, group_lr);
  }
  /// The step has ended: the window counts it (its adds start on the window's thread, the last ranges first, as
  /// backward hands them over again), or was emptied by the host's update.
  void end_step() {
    if (!warming_ && !host_step_) {
      window_.post_all(window_steps_ == 0);
    }
    if (!warming_) {
      window_steps_ = host_step_ ? 0 : window_steps_ + 1;
    }
    host_args_.reset();
  }

  /// Writes the compact copy back into the host's state (nothing when the host's is newer).
  void flush() {
    if (!selected_ || restart_ || index_host_.empty()) {
      return;
    }
    std::vector<float> compact(index_host_.size());
    std::vector<float> range;
    for (const state_tensor t : {state_tensor::master, state_tensor::exp_avg, state_tensor::exp_avg_sq}) {
      download<device_host_accessible>(backend_, stream_, tensor(t), compact.data(), compact.size());
      for (std::size_t k = 0; k < ranges().size(); ++k) {
        if (count(k) != 0) {
          range.resize(ranges()[k].first.size());
          host_.read_state(t, ranges()[k].second, range);
          for (std::size_t j = begin_[k]; j < begin_[k + 1]; ++j) {
            range[index_host_[j]] = compact[j];
          }
          host_.write_state(t, ranges()[k].second, range);
        }
      }
    }
  }

private:
  static constexpr std::size_t npos = std::numeric_limits<std::size_t>::max();

  /// The compact piece of one group in one range: [begin, begin + count) of the compact copy.
  struct piece {
    std::size_t begin = 0;
    std::size_t count = 0;
    std::size_t group = 0;
  };

  [[nodiscard]] std::size_t count(std::size_t k) const noexcept {
    return begin_.empty() ? 0 : begin_[k + 1] - begin_[k];
  }
  /// Range `k`'s gradients in the host shard, landed.
  std::byte* landed(std::size_t k) {
    grads().finish();
    grads().wait_landed(k);
    return grads().at(ranges()[k].second);
  }
  [[nodiscard]] float* tensor(state_tensor t) {
    return t == state_tensor::master ? master_.data() : t == state_tensor::exp_avg ? m_.data() : v_.data();
  }
  /// Calls `f(k, id, lo, hi)` for each parameter `id` meeting owned range `k`, over flat [lo, hi).
  template <class F> void for_each_part(F&& f) {
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      const flat_range r = ranges()[k].first;
      for (const std::size_t id : layout_.flat_order()) {
        const auto& p = layout_.param(id);
        const std::size_t lo = std::max(r.begin, p.offset);
        const std::size_t hi = std::min(r.end, p.offset + p.numel);
        if (lo < hi) {
          f(k, id, lo, hi);
        }
      }
    }
  }

  /// The chosen elements of each range (offsets in the range, ascending), their pieces by group, and the
  /// compact copy's memory.
  void build() {
    index_host_.clear();
    begin_.assign(ranges().size() + 1, 0);
    std::size_t k_at = 0;
    for_each_part([&](std::size_t k, std::size_t id, std::size_t lo, std::size_t hi) {
      for (; k_at <= k; ++k_at) {
        begin_[k_at] = index_host_.size();
      }
      const auto& p = layout_.param(id);
      const std::size_t at = lo - ranges()[k].first.begin;
      if (at + (hi - lo) > std::numeric_limits<std::uint32_t>::max()) {
        throw usage_error("zenflow_adamw: owned range " + std::to_string(k) + " has " +
                          std::to_string(ranges()[k].first.size()) + " elements; ZenFlow's indices are 32-bit");
      }
      if (sums_at_[id] != npos) {
        for (const std::int64_t e : column_elements(columns_[id], p.shape[1], static_cast<std::int64_t>(lo - p.offset),
                                                    static_cast<std::int64_t>(hi - lo))) {
          index_host_.push_back(static_cast<std::uint32_t>(at + static_cast<std::size_t>(e)));
        }
      } else {
        for (std::size_t j = 0; j < hi - lo; ++j) {
          index_host_.push_back(static_cast<std::uint32_t>(at + j));
        }
      }
    });
    for (; k_at <= ranges().size(); ++k_at) {
      begin_[k_at] = index_host_.size();
    }
    // Pieces: the chosen elements of each range cut where the owned runs change group.
    pieces_.assign(ranges().size(), {});
    for (std::size_t k = 0; k < ranges().size(); ++k) {
      const flat_range r = ranges()[k].first;
      for (const owned_run& run : runs()) {
        if (run.flat.end <= r.begin || run.flat.begin >= r.end) {
          continue;
        }
        const auto lo = static_cast<std::uint32_t>(run.flat.begin - r.begin);
        const auto hi = static_cast<std::uint32_t>(run.flat.end - r.begin);
        const std::uint32_t* end = index_host_.data() + begin_[k + 1];
        const std::uint32_t* first = std::lower_bound(std::as_const(index_host_).data() + begin_[k], end, lo);
        const std::uint32_t* last = std::lower_bound(first, end, hi);
        if (first != last) {
          pieces_[k].push_back(piece{.begin = static_cast<std::size_t>(first - index_host_.data()),
                                     .count = static_cast<std::size_t>(last - first),
                                     .group = run.group});
        }
      }
    }
    const std::size_t n = std::max<std::size_t>(index_host_.size(), 1);
    if (index_.size() != n) {
      index_ = buffer<std::uint32_t, device_counting>(device_, n, memory_tag::optimizer);
      master_ = buffer<float, device_counting>(device_, n, memory_tag::optimizer);
      m_ = buffer<float, device_counting>(device_, n, memory_tag::optimizer);
      v_ = buffer<float, device_counting>(device_, n, memory_tag::optimizer);
      grad_ = buffer<std::byte, device_counting>(device_, n * size_of(place_.grad_type), memory_tag::grads);
      params_ = layout_.type() == dtype::f32
                    ? buffer<std::byte, device_counting>()
                    : buffer<std::byte, device_counting>(device_, n * size_of(layout_.type()), memory_tag::params);
    }
    upload<device_host_accessible>(backend_, stream_, index_host_.data(), index_.data(), index_host_.size());
  }

  /// Loads the compact copy from the host's state.
  void reload() {
    std::vector<float> compact(index_host_.size());
    std::vector<float> range;
    for (const state_tensor t : {state_tensor::master, state_tensor::exp_avg, state_tensor::exp_avg_sq}) {
      for (std::size_t k = 0; k < ranges().size(); ++k) {
        if (count(k) != 0) {
          range.resize(ranges()[k].first.size());
          host_.read_state(t, ranges()[k].second, range);
          for (std::size_t j = begin_[k]; j < begin_[k + 1]; ++j) {
            compact[j] = range[index_host_[j]];
          }
        }
      }
      upload<device_host_accessible>(backend_, stream_, compact.data(), tensor(t), compact.size());
    }
  }

  /// AdamW over range `k`'s compact pieces on `s`, each with its group's lr and weight decay, and the new
  /// parameters scattered into the device's.
  template <class GroupLr>
  void update_compact(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr& group_lr) {
    if (count(k) == 0) {
      return;
    }
    if constexpr (can_index_copy<Backend>) {
      visit_float(place_.grad_type, [&]<class G>(type_tag<G>) {
        visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
          const G* g = reinterpret_cast<const G*>(grad_.data());
          P* p = std::is_same_v<P, float> ? nullptr : reinterpret_cast<P*>(params_.data());
          for (const piece& c : pieces_[k]) {
            adamw_step_args a = base;
            a.lr = static_cast<float>(group_lr(groups()[c.group].lr));
            a.weight_decay = static_cast<float>(groups()[c.group].weight_decay);
            backend_.adamw_step(master_.data() + c.begin, m_.data() + c.begin, v_.data() + c.begin, g + c.begin,
                                p == nullptr ? nullptr : p + c.begin, c.count, a, s);
          }
        });
      });
    }
    scatter_compact(k, s);
  }
  /// Scatters range `k`'s chosen elements' parameters (the compact copy's) into the device's on `s`.
  void scatter_compact(std::size_t k, const stream_type& s) {
    if (count(k) == 0) {
      return;
    }
    if constexpr (can_index_copy<Backend>) {
      visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
        const P* src = std::is_same_v<P, float> ? reinterpret_cast<const P*>(master_.data())
                                                : reinterpret_cast<const P*>(params_.data());
        const std::size_t at = place_.params_sharded ? ranges()[k].second : ranges()[k].first.begin;
        backend_.scatter(src + begin_[k], index_.data() + begin_[k], count(k), reinterpret_cast<P*>(place_.params) + at,
                         s);
      });
    }
  }
  /// `opt` with the delayed update exactly when `overlap_step` asks for it: the host's updates on its thread, its
  /// gradients held twice (ZenFlow uses it for nothing else).
  [[nodiscard]] static offload_options with_delay(offload_options opt, bool overlap) {
    opt.delayed_update = overlap;
    return opt;
  }

  const flat_layout& layout_;
  adamw_placement place_;
  Backend& backend_;
  device_counting device_;
  stream_type& stream_;
  zenflow_options z_;
  host_type host_;
  detail::zenflow_window<host_alloc> window_;
  std::int64_t window_steps_ = 0;
  // The choice: per parameter its columns (2-D weights) and where its column sums start (npos: not 2-D).
  std::vector<std::vector<std::int64_t>> columns_;
  std::vector<std::size_t> sums_at_;
  std::size_t sums_size_ = 0;
  bool selected_ = false;
  bool restart_ = false; // the host's state was written (a load): the compact copy and the window are void
  bool reload_ = false;  // a checkpoint's choice was restored: the compact copy is loaded at the next step
  // The compact copy: per range its chosen elements [begin_[k], begin_[k + 1]) and their pieces by group.
  std::vector<std::uint32_t> index_host_;
  std::vector<std::size_t> begin_;
  std::vector<std::vector<piece>> pieces_;
  buffer<std::uint32_t, device_counting> index_;
  buffer<float, device_counting> master_;
  buffer<float, device_counting> m_;
  buffer<float, device_counting> v_;
  buffer<std::byte, device_counting> grad_;
  buffer<std::byte, device_counting> params_;
  reduce_fn reduce_;
  std::optional<adamw_step_args> host_args_;
  bool warming_ = true;
  bool selects_ = false;
  bool host_step_ = true;
  bool gather_at_take_ = false;
};

} // namespace zero
