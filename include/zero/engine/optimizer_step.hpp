#pragma once
/// \file
/// `optimizer_step`: where an engine's optimizer state lives and where AdamW runs — on the backend
/// (`partitioned_adamw`); with `zero_optimization.offload_optimizer.device: cpu` in host memory on
/// the host (`offloaded_adamw`, ZeRO-Offload), or with a `ratio` below 1 that share on the host and
/// the rest on the backend (`partial_adamw`); with `nvme` in a file of the storage policy, streamed
/// through host buffers (`nvme_adamw`, ZeRO-Infinity). One interface (`ranges`, `runs`, `state_size`,
/// `groups`, `has_master`, `load_master`, `step`, `step_range`, `read_state`, `write_state`,
/// `finish_step`, `commit`, `rollback`); the engine and checkpoints use it without asking which one
/// it holds.

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/detail/visit_made.hpp"
#include "zero/engine/nvme_adamw.hpp"
#include "zero/engine/offloaded_adamw.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/partial_adamw.hpp"
#include "zero/engine/partitioned_adamw.hpp"
#include "zero/engine/update_rates.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <cstddef>
#include <exception>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace zero {

/// The engine's optimizer, on the backend or offloaded to the host; see the file comment.
template <class Backend, class Allocator, class Storage> class optimizer_step {
public:
  using on_device = partitioned_adamw<Backend, Allocator>;
  using on_host = offloaded_adamw<Backend, Allocator>;
  using on_nvme = nvme_adamw<Backend, Allocator, Storage>;
  using on_both = partial_adamw<Backend, Allocator>;
  using host_allocator_type = offload_allocator_t<Backend>;

  /// Makes the optimizer on the backend; arguments as `partitioned_adamw`'s.
  template <class... Args> void make_on_device(Args&&... args) {
    v_.template emplace<on_device>(std::forward<Args>(args)...);
  }
  /// Makes the optimizer in host memory; arguments as `offloaded_adamw`'s.
  template <class... Args> void make_on_host(Args&&... args) {
    v_.template emplace<on_host>(std::forward<Args>(args)...);
  }

  /// Makes the optimizer with part of its state in host memory; arguments as `partial_adamw`'s.
  template <class... Args> void make_partial(Args&&... args) {
    v_.template emplace<on_both>(std::forward<Args>(args)...);
  }

  /// Makes the optimizer with its state in a file of the storage; arguments as `nvme_adamw`'s.
  template <class... Args> void make_on_nvme(Args&&... args) {
    v_.template emplace<on_nvme>(std::forward<Args>(args)...);
  }

  /// Makes the optimizer `cfg.zero_optimization.offload_optimizer` asks for (docs/offload.md) over
  /// `reg`'s finalized layout: with `nvme`, in a file of `storage` (which must be given) cut by the
  /// config's `aio` block; with `cpu`, in host memory, split with the backend by the config's ratio
  /// (`"auto"`: balanced from `rates`, or from rates measured here when none are given); else on the
  /// backend, in `device` memory. `threads` run the host AdamW. Returns how the state was split.
  offload_split make(const config& cfg, const param_registry& reg, const adamw_placement& place, Backend& backend,
                     counting_allocator<Allocator> device, typename Backend::stream_type& stream, Storage* storage,
                     unsigned threads, const std::optional<update_rates>& rates) {
    const auto& o = cfg.zero_optimization.offload_optimizer;
    const flat_layout& layout = reg.layout();
    offload_split split;
    if (o.device == offload_device::nvme) {
      if (storage == nullptr) {
        throw usage_error("optimizer_step::make: offload_optimizer.device nvme needs a storage");
      }
      const auto io = storage_options_from(cfg.aio);
      make_on_nvme(layout, place, reg.group_of(), reg.groups(), backend, host_allocator_type{}, stream, *storage,
                   place.rank,
                   nvme_options{.dir = o.nvme_path,
                                .chunk_elements = io.block_size / sizeof(float) * io.queue_depth,
                                .buffer_count = static_cast<std::size_t>(o.buffer_count),
                                .threads = threads});
      split.ratio = 1.0;
    } else if (o.device == offload_device::cpu) {
      const std::size_t state = owned_ranges(layout, place).second;
      split.ratio = o.ratio;
      if (o.ratio_auto) {
        split.measured = !rates;
        split.rates = rates ? *rates
                            : measure_update_rates(backend, device.inner(),
                                                   {.param = cfg.param_dtype(),
                                                    .grad = cfg.grad_accum_dtype,
                                                    .elements = std::clamp<std::size_t>(state, 1 << 16, 1 << 22),
                                                    .host_threads = threads});
        split.ratio = balanced_offload_ratio(*split.rates, cfg.param_dtype(), cfg.grad_accum_dtype);
      }
      const std::size_t host = offloaded_state_elements(split.ratio, state);
      split.host_elements = host;
      auto opt = offload_options{.threads = threads};
      // Updates during backward need the gradients streamed (stages 2-3) and final at their hand-over.
      // A state split with the device streams only beside the next forward, which needs the host part's
      // gradients checked as they land (no accumulation: the reader refuses the keys with one).
      const bool streams = cfg.stage() >= 2 && (host == state || o.forward_overlap);
      if (streams && cfg.gradient_accumulation_steps == 1) {
        opt.backward_overlap = o.backward_overlap;
      }
      // The step beside the next forward needs the gradients on the host when it begins (streamed).
      opt.forward_overlap = o.forward_overlap && cfg.stage() >= 2;
      if (host == state) {
        make_on_host(layout, place, reg.group_of(), reg.groups(), backend, host_allocator_type{}, stream, opt);
      } else if (host == 0) {
        make_on_device(layout, place, reg.group_of(), reg.groups(), backend, device, stream);
      } else {
        make_partial(layout, place, reg.group_of(), reg.groups(), backend, device, host_allocator_type{}, stream, host,
                     opt);
      }
    } else {
      make_on_device(layout, place, reg.group_of(), reg.groups(), backend, device, stream);
    }
    split.state_elements = state_size();
    if (o.device == offload_device::nvme) {
      split.host_elements = split.state_elements;
    }
    return split;
  }

  /// True when AdamW runs on the host (the state in host memory or in a file), or part of it does.
  [[nodiscard]] bool offloaded() const noexcept { return !std::holds_alternative<on_device>(v_); }
  /// The optimizer with its state in a file, or null.
  [[nodiscard]] on_nvme* nvme() noexcept { return std::get_if<on_nvme>(&v_); }
  [[nodiscard]] const on_nvme* nvme() const noexcept { return std::get_if<on_nvme>(&v_); }
  /// The optimizer on the backend, or null when offloaded.
  [[nodiscard]] on_device* device() noexcept { return std::get_if<on_device>(&v_); }
  /// The offloaded optimizer, or null.
  [[nodiscard]] on_host* host() noexcept { return std::get_if<on_host>(&v_); }
  [[nodiscard]] const on_host* host() const noexcept { return std::get_if<on_host>(&v_); }
  /// The optimizer split between the backend and the host (`offload_optimizer.ratio` below 1), or null.
  [[nodiscard]] on_both* partial() noexcept { return std::get_if<on_both>(&v_); }
  [[nodiscard]] const on_both* partial() const noexcept { return std::get_if<on_both>(&v_); }

  /// What steps on the host from host memory: the whole offloaded optimizer, or the host part of a
  /// split one; null on the device or with the state in a file.
  [[nodiscard]] on_host* host_part() noexcept {
    auto* both = partial();
    return both != nullptr ? &both->host() : host();
  }

  /// The host gradient shard the engine streams into at stages 2-3 (`detail::host_gradients`): an
  /// optimizer stepping on the host's, or a split one's when its host part steps beside the next forward
  /// (`forward_overlap`); null otherwise.
  [[nodiscard]] auto* host_grads() noexcept {
    using grads_type = std::remove_reference_t<decltype(std::declval<on_host&>().grads())>;
    static_assert(std::is_same_v<grads_type, std::remove_reference_t<decltype(std::declval<on_nvme&>().grads())>>);
    if (auto* h = host()) {
      return &h->grads();
    }
    if (auto* both = partial(); both != nullptr && both->host().can_run_async()) {
      return &both->host().grads();
    }
    auto* n = nvme();
    return n != nullptr ? &n->grads() : static_cast<grads_type*>(nullptr);
  }
  /// Where in owned range `k`'s reduced slice the host gradient shard's part of it starts, in elements:
  /// 0, or for a split state the device part's share of the range the split falls in.
  [[nodiscard]] std::size_t host_grads_offset(std::size_t k) const noexcept {
    const auto* both = partial();
    return both != nullptr ? both->host_offset(k) : 0;
  }
  /// Per segment, the leading elements of the rank's reduced slice the device's optimizer reads when the
  /// gradients are streamed to the host: none for a whole offload, the device part's for a split state.
  [[nodiscard]] std::vector<std::size_t> device_elements() const {
    const auto* both = partial();
    return both != nullptr ? both->device_elements() : std::vector<std::size_t>{};
  }

  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const {
    return visit([](auto& o) -> const auto& { return o.ranges(); });
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const {
    return visit([](auto& o) -> const auto& { return o.runs(); });
  }
  [[nodiscard]] std::size_t state_size() const {
    return visit([](auto& o) { return o.state_size(); });
  }
  [[nodiscard]] std::vector<param_group>& groups() {
    return visit([](auto& o) -> auto& { return o.groups(); });
  }
  [[nodiscard]] bool has_master() const {
    return visit([](auto& o) { return o.has_master(); });
  }
  void load_master() {
    visit([](auto& o) { o.load_master(); });
  }
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    visit([&](auto& o) { o.read_state(t, state_offset, out); });
  }
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    visit([&](auto& o) { o.write_state(t, state_offset, in); });
  }
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    visit([&](auto& o) { o.step(base, group_lr, grad_of); });
  }
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const typename Backend::stream_type& s, const adamw_step_args& base,
                  GroupLr&& group_lr, GradOf&& grad_of) {
    visit([&](auto& o) { o.step_range(k, s, base, group_lr, grad_of); });
  }

  /// After the ranges of a step: waits for its writes (state in a file). \returns the step's I/O
  /// error, or null (always null for state in memory).
  [[nodiscard]] std::exception_ptr finish_step() {
    auto* n = nvme();
    return n != nullptr ? n->finish_step() : nullptr;
  }
  /// Makes the step's writes current (state in a file; nothing to do in memory).
  void commit() {
    if (auto* n = nvme()) {
      n->commit();
    }
  }
  /// Gives the device the previous step's parameters again after a step some rank could not write
  /// (state in a file), with its uploads on `s`.
  void rollback(const typename Backend::stream_type& s) {
    if (auto* n = nvme()) {
      n->rollback(s);
    }
  }

private:
  template <class F> decltype(auto) visit(F&& f) { return dispatch(v_, f); }
  template <class F> decltype(auto) visit(F&& f) const { return dispatch(v_, f); }
  template <class V, class F> static decltype(auto) dispatch(V& v, F& f) {
    return detail::visit_made<on_device>(v, f, "the engine has no optimizer before finalize()");
  }

  std::variant<std::monostate, on_device, on_host, on_nvme, on_both> v_;
};

} // namespace zero
