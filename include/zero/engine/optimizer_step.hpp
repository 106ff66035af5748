#pragma once
/// \file
/// `optimizer_step`: where an engine's optimizer state lives and where AdamW runs — on the backend
/// (`partitioned_adamw`); with `zero_optimization.offload_optimizer.device: cpu` in host memory on
/// the host (`offloaded_adamw`, ZeRO-Offload); with `nvme` in a file of the storage policy, streamed
/// through host buffers (`nvme_adamw`, ZeRO-Infinity). One interface (`ranges`, `runs`, `state_size`,
/// `groups`, `has_master`, `load_master`, `step`, `step_range`, `read_state`, `write_state`,
/// `finish_step`, `commit`, `rollback`); the engine and checkpoints use it without asking which one
/// it holds.

#include "zero/core/error.hpp"
#include "zero/engine/detail/visit_made.hpp"
#include "zero/engine/nvme_adamw.hpp"
#include "zero/engine/offloaded_adamw.hpp"
#include "zero/engine/partitioned_adamw.hpp"

#include <cstddef>
#include <exception>
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
  using host_allocator_type = offload_allocator_t<Backend>;

  /// Makes the optimizer on the backend; arguments as `partitioned_adamw`'s.
  template <class... Args> void make_on_device(Args&&... args) {
    v_.template emplace<on_device>(std::forward<Args>(args)...);
  }
  /// Makes the optimizer in host memory; arguments as `offloaded_adamw`'s.
  template <class... Args> void make_on_host(Args&&... args) {
    v_.template emplace<on_host>(std::forward<Args>(args)...);
  }

  /// Makes the optimizer with its state in a file of the storage; arguments as `nvme_adamw`'s.
  template <class... Args> void make_on_nvme(Args&&... args) {
    v_.template emplace<on_nvme>(std::forward<Args>(args)...);
  }

  /// True when AdamW runs on the host (the state in host memory or in a file).
  [[nodiscard]] bool offloaded() const noexcept { return !std::holds_alternative<on_device>(v_); }
  /// The optimizer with its state in a file, or null.
  [[nodiscard]] on_nvme* nvme() noexcept { return std::get_if<on_nvme>(&v_); }
  [[nodiscard]] const on_nvme* nvme() const noexcept { return std::get_if<on_nvme>(&v_); }
  /// The optimizer on the backend, or null when offloaded.
  [[nodiscard]] on_device* device() noexcept { return std::get_if<on_device>(&v_); }
  /// The offloaded optimizer, or null.
  [[nodiscard]] on_host* host() noexcept { return std::get_if<on_host>(&v_); }
  [[nodiscard]] const on_host* host() const noexcept { return std::get_if<on_host>(&v_); }

  /// The host gradient shard of an optimizer stepping on the host (`detail::host_gradients`), or
  /// null on the device.
  [[nodiscard]] auto* host_grads() noexcept {
    using grads_type = std::remove_reference_t<decltype(std::declval<on_host&>().grads())>;
    static_assert(std::is_same_v<grads_type, std::remove_reference_t<decltype(std::declval<on_nvme&>().grads())>>);
    if (auto* h = host()) {
      return &h->grads();
    }
    auto* n = nvme();
    return n != nullptr ? &n->grads() : static_cast<grads_type*>(nullptr);
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

  std::variant<std::monostate, on_device, on_host, on_nvme> v_;
};

} // namespace zero
