#pragma once
/// \file
/// `step_plan`: one plan per placement of the optimizer state, chosen once at `finalize` from the
/// config's `offload_optimizer` (CUB-style dispatch: the choice is a type held in a variant, and every
/// call after it runs that type's code). Each plan owns its optimizer and its gradient intake (it is
/// the reducer's sink where gradients stream to the host), its checks and its failure protocol:
///
/// | plan          | optimizer           | state           | gradients                                   |
/// |---------------|---------------------|-----------------|---------------------------------------------|
/// | `device_plan` | `partitioned_adamw` | backend memory  | kept by the reducer                         |
/// | `host_plan`   | `offloaded_adamw`   | host memory     | streamed to the host at stages 2-3          |
/// | `split_plan`  | `partial_adamw`     | a share on each | the device share's kept, the host's streamed |
/// | `nvme_plan`   | `nvme_adamw`        | a file          | streamed to the host at stages 2-3          |
/// | `host_nvme_plan` | `host_nvme_adamw` | a share in host memory, the rest in a file | kept by the reducer |
/// | `zenflow_plan` | `zenflow_adamw` | host memory, the chosen on the backend | streamed at stages 2-3 |
///
/// The engine drives whichever it holds through one set of verbs, and never asks which:
///
///     connect(parts)              at finalize: the reducer's sink, the slices' release
///     begin_micro_step(b, u)      a micro-step begins (b: the accumulation's last; u: the unscale)
///     join()                      what reads or writes the state waits for a step beside the forward
///     landed()                    the micro-step's reductions finished
///     check(unscale) -> grad_check   the step's gradients: inf/NaN and the global norm
///     end_early(applied, norm)    the updates made during backward: kept or dropped
///     apply(args, after)          AdamW over the owned ranges (`after`: the residency's all-gather)
///     end_writes(file, finish)    the step's NVMe writes agreed on: io_error where they failed
///     zero_gradients(stream)      the accumulation ended
///     add_memory(report, split)   the host and NVMe memory it holds
///
/// Its state view (`ranges`, `runs`, `state_size`, `groups`, `has_master`, `load_master`,
/// `read_state`, `write_state`) is what checkpoints read and write. docs/design.md, "Step plans".

#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/detail/visit_made.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/step/device_plan.hpp"
#include "zero/engine/step/host_nvme_plan.hpp"
#include "zero/engine/step/host_plan.hpp"
#include "zero/engine/step/nvme_plan.hpp"
#include "zero/engine/step/split_plan.hpp"
#include "zero/engine/step/step_parts.hpp"
#include "zero/engine/step/update_rates.hpp"
#include "zero/engine/step/zenflow_plan.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <utility>
#include <variant>
#include <vector>

namespace zero {

/// The engine's step plan; see the file comment.
template <class Backend, class Comm, class Allocator, class Storage> class step_plan {
public:
  using parts_type = step_parts<Backend, Comm, Allocator, Storage>;
  using host_allocator_type = offload_allocator_t<Backend>;
  using on_device = partitioned_adamw<Backend, Allocator>;
  using on_host = offloaded_adamw<Backend, Allocator>;
  using on_nvme = nvme_adamw<Backend, Allocator, Storage>;
  using on_both = partial_adamw<Backend, Allocator>;
  using on_host_nvme = host_nvme_adamw<Backend, Allocator, Storage>;
  using on_zenflow = zenflow_adamw<Backend, Allocator>;

  /// Makes the plan `cfg.zero_optimization.offload_optimizer` asks for (docs/offload.md) over `reg`'s
  /// finalized layout: with `nvme`, the state in a file of `storage` (which must be given) cut by the
  /// config's `aio` block, or with `host_ratio` above 0 that share of it in host memory and the rest in the
  /// file; with `cpu`, in host memory, split with the backend by the config's ratio
  /// (`"auto"`: balanced from `rates`, or from rates measured here when none are given); else on the
  /// backend, in `device` memory. `threads` run the host AdamW. \returns how the state was split.
  offload_split make(const config& cfg, const param_registry& reg, const adamw_placement& place, Backend& backend,
                     counting_allocator<Allocator> device, typename Backend::stream_type& stream, Storage* storage,
                     unsigned threads, const std::optional<update_rates>& rates) {
    const auto& o = cfg.zero_optimization.offload_optimizer;
    const flat_layout& layout = reg.layout();
    offload_split split;
    if (o.device == offload_device::nvme) {
      if (storage == nullptr) {
        throw usage_error("step_plan::make: offload_optimizer.device nvme needs a storage");
      }
      const auto io = storage_options_from(cfg.aio);
      const nvme_options opt{.dir = o.nvme_path,
                             .chunk_elements = io.block_size / sizeof(float) * io.queue_depth,
                             .buffer_count = static_cast<std::size_t>(o.buffer_count),
                             .threads = threads};
      const std::size_t state = owned_ranges(layout, place).second;
      const std::size_t in_memory = offloaded_state_elements(o.host_ratio, state);
      const bool streams = gradients_stream_to_host(cfg.stage(), o.device, true, o.forward_overlap);
      if (in_memory == 0) {
        v_.template emplace<nvme_plan<parts_type, on_nvme>>(streams, layout, place, reg.group_of(), reg.groups(),
                                                            backend, host_allocator_type{}, stream, *storage,
                                                            place.rank, opt);
      } else if (in_memory == state) {
        v_.template emplace<host_plan<parts_type, on_host>>(streams, layout, place, reg.group_of(), reg.groups(),
                                                            backend, host_allocator_type{}, stream,
                                                            offload_options{.threads = threads});
      } else {
        v_.template emplace<host_nvme_plan<parts_type, on_host_nvme>>(layout, place, reg.group_of(), reg.groups(),
                                                                      backend, host_allocator_type{}, stream, *storage,
                                                                      place.rank, opt, in_memory);
      }
      split.ratio = 1.0;
      split.nvme_elements = state - in_memory;
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
      // Updates during backward need the gradients streamed and final at their hand-over. A state split with
      // the device streams only beside the next forward, which needs the host part's gradients checked as they
      // land (no accumulation: the reader refuses the keys with one).
      const bool streams = gradients_stream_to_host(cfg.stage(), o.device, host == state, o.forward_overlap);
      if (streams && cfg.gradient_accumulation_steps == 1) {
        opt.backward_overlap = o.backward_overlap;
      }
      // The step beside the next forward needs the gradients on the host when it begins (streamed).
      opt.forward_overlap = o.forward_overlap && streams;
      // The delayed update, checked by check_engine_config: the whole state on the host, its gradients streamed.
      opt.delayed_update = o.delayed_update && streams && host == state;
      if (cfg.zero_optimization.zenflow.enabled) {
        // ZenFlow, checked by check_engine_config: the whole state on the host, its gradients streamed at stages 2-3.
        const auto& z = cfg.zero_optimization.zenflow;
        const zenflow_options zo{.topk_ratio = z.topk_ratio,
                                 .schedule = {.warmup = z.full_warm_up_rounds,
                                              .update_interval = z.update_interval.value_or(1),
                                              .select_interval = zenflow_select_steps(z)},
                                 .overlap = z.overlap_step};
        v_.template emplace<zenflow_plan<parts_type, on_zenflow>>(streams, layout, place, reg.group_of(), reg.groups(),
                                                                  backend, device, host_allocator_type{}, stream, opt,
                                                                  zo);
      } else if (host == state) {
        v_.template emplace<host_plan<parts_type, on_host>>(streams, layout, place, reg.group_of(), reg.groups(),
                                                            backend, host_allocator_type{}, stream, opt);
      } else if (host == 0) {
        make_on_device(reg, place, backend, device, stream);
      } else {
        v_.template emplace<split_plan<parts_type, on_both>>(streams, layout, place, reg.group_of(), reg.groups(),
                                                             backend, device, host_allocator_type{}, stream, host, opt);
      }
    } else {
      make_on_device(reg, place, backend, device, stream);
    }
    split.state_elements = state_size();
    if (o.device == offload_device::nvme) {
      split.host_elements = split.state_elements;
    }
    return split;
  }

  // ---- the verbs (see the file comment) ----
  /// Connects the plan to the engine's parts (kept by reference) once they are made.
  void connect(parts_type& parts) {
    visit([&](auto& p) { p.connect(parts); });
  }
  /// True when the reducer hands this plan its reduced slices during backward (`reducer_options::streamed`).
  [[nodiscard]] bool streams() const {
    return visit([](const auto& p) { return p.streams(); });
  }
  /// Per segment, the leading elements of a streamed slice the reducer keeps on the device too (empty: none).
  [[nodiscard]] std::vector<std::size_t> kept() const {
    return visit([](const auto& p) { return p.kept(); });
  }
  /// True when the host steps beside the next forward (which needs the update stream).
  [[nodiscard]] bool steps_async() const {
    return visit([](const auto& p) { return p.steps_async(); });
  }
  /// The device master stage 3 casts its gathers from when it keeps no 16-bit shard, or null.
  [[nodiscard]] float* derived_master() {
    return visit([](auto& p) { return p.derived_master(); });
  }
  void begin_micro_step(bool boundary, double unscale) {
    visit([&](auto& p) { p.begin_micro_step(boundary, unscale); });
  }
  void join() {
    visit([](auto& p) { p.join(); });
  }
  void landed() {
    visit([](auto& p) { p.landed(); });
  }
  [[nodiscard]] grad_check check(double unscale) {
    return visit([&](auto& p) { return p.check(unscale); });
  }
  void end_early(bool applied, double norm) {
    visit([&](auto& p) { p.end_early(applied, norm); });
  }
  /// Publishes an update the delayed update left unpublished, for a reader. \returns true when there was one.
  bool settle() {
    return visit([](auto& p) { return p.settle(); });
  }
  void apply(const adamw_step_args& args, const typename parts_type::after_update& after) {
    visit([&](auto& p) { p.apply(args, after); });
  }
  /// \returns an io_error of a step that was applied anyway (for `step()` to throw once it has ended), or
  /// null. \throws io_error when the step was not applied.
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& finish_gathers) {
    return visit([&](auto& p) { return p.end_writes(file, finish_gathers); });
  }
  void zero_gradients(const typename Backend::stream_type* s) {
    visit([&](auto& p) { p.zero_gradients(s); });
  }
  void add_memory(memory_report& m, const offload_split& split) const {
    visit([&](const auto& p) { p.add_memory(m, split); });
  }
  /// The share of stage 3's host parameter shard counted as offloaded (`add_host_params`).
  [[nodiscard]] double host_param_share(const memory_report& m) const {
    return visit([&](const auto& p) { return p.host_param_share(m); });
  }

  // ---- the state view (checkpoints) ----
  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const {
    return state([](auto& o) -> const auto& { return o.ranges(); });
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const {
    return state([](auto& o) -> const auto& { return o.runs(); });
  }
  [[nodiscard]] std::size_t state_size() const {
    return state([](auto& o) { return o.state_size(); });
  }
  [[nodiscard]] std::vector<param_group>& groups() {
    return state([](auto& o) -> auto& { return o.groups(); });
  }
  [[nodiscard]] bool has_master() const {
    return state([](auto& o) { return o.has_master(); });
  }
  void load_master() {
    state([](auto& o) { o.load_master(); });
  }
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    state([&](auto& o) { o.read_state(t, state_offset, out); });
  }
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    state([&](auto& o) { o.write_state(t, state_offset, in); });
  }

  // ---- for tests and tools: the optimizer a placement made (the engine never asks) ----
  /// True when AdamW runs on the host (the state in host memory or in a file), or part of it does.
  [[nodiscard]] bool offloaded() const noexcept { return made<on_device>() == nullptr; }
  [[nodiscard]] on_device* device() noexcept { return made<on_device>(); }
  [[nodiscard]] on_host* host() noexcept { return made<on_host>(); }
  [[nodiscard]] const on_host* host() const noexcept { return made<on_host>(); }
  [[nodiscard]] on_both* partial() noexcept { return made<on_both>(); }
  [[nodiscard]] const on_both* partial() const noexcept { return made<on_both>(); }
  [[nodiscard]] on_nvme* nvme() noexcept { return made<on_nvme>(); }
  [[nodiscard]] const on_nvme* nvme() const noexcept { return made<on_nvme>(); }
  [[nodiscard]] on_host_nvme* host_nvme() noexcept { return made<on_host_nvme>(); }
  [[nodiscard]] const on_host_nvme* host_nvme() const noexcept { return made<on_host_nvme>(); }
  [[nodiscard]] on_zenflow* zenflow() noexcept { return made<on_zenflow>(); }
  /// What steps on the host from host memory: the whole offloaded optimizer, or a split one's host part.
  [[nodiscard]] on_host* host_part() noexcept {
    if (auto* both = partial()) {
      return &both->host();
    }
    auto* split = host_nvme();
    return split != nullptr ? &split->host() : host();
  }

private:
  using device_type = device_plan<parts_type, on_device>;

  void make_on_device(const param_registry& reg, const adamw_placement& place, Backend& backend,
                      counting_allocator<Allocator> device, typename Backend::stream_type& stream) {
    v_.template emplace<device_type>(place.params_from_master, reg.layout(), place, reg.group_of(), reg.groups(),
                                     backend, device, stream);
  }

  /// The optimizer of type `O` when the plan holds it, else null.
  template <class O> [[nodiscard]] O* made() const noexcept {
    O* out = nullptr;
    std::visit(
        [&](auto& p) {
          if constexpr (!std::is_same_v<std::remove_cvref_t<decltype(p)>, std::monostate>) {
            if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(p)>::optimizer_type, O>) {
              out = const_cast<O*>(&p.optimizer());
            }
          }
        },
        v_);
    return out;
  }
  template <class F> decltype(auto) visit(F&& f) { return detail::visit_made<device_type>(v_, f, unmade); }
  template <class F> decltype(auto) visit(F&& f) const { return detail::visit_made<device_type>(v_, f, unmade); }
  /// Calls `f` with the plan's optimizer.
  template <class F> decltype(auto) state(F&& f) {
    return visit([&](auto& p) -> decltype(auto) { return f(p.optimizer()); });
  }
  template <class F> decltype(auto) state(F&& f) const {
    return visit([&](const auto& p) -> decltype(auto) { return f(p.optimizer()); });
  }

  static constexpr const char* unmade = "the engine has no optimizer before finalize()";
  std::variant<std::monostate, device_type, host_plan<parts_type, on_host>, nvme_plan<parts_type, on_nvme>,
               split_plan<parts_type, on_both>, host_nvme_plan<parts_type, on_host_nvme>,
               zenflow_plan<parts_type, on_zenflow>>
      v_;
};

} // namespace zero
