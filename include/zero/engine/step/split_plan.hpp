#pragma once
/// \file
/// `split_plan`: partial offload (`offload_optimizer.ratio` below 1), a share of the optimizer state
/// on the host and the rest on the backend (`partial_adamw`). The reducer keeps the device share's
/// gradients as in memory; with `forward_overlap` at stages 2-3 it streams the host share's slices to
/// the host during backward (`gradient_intake`, `reducer_options::kept`) and the host share steps beside
/// the next forward, while the device share steps at once. docs/offload.md.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/host_plan.hpp"
#include "zero/engine/step/partial_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <utility>
#include <vector>

namespace zero {

/// The step plan of a state split between the backend and the host; the verbs are `step_plan`'s,
/// `detail::plan_interface`'s but for the host share's updates during backward and beside the next forward.
template <class Parts, class Optimizer>
class split_plan : public detail::plan_interface<split_plan<Parts, Optimizer>, Parts, Optimizer> {
  using host_optimizer = std::remove_reference_t<decltype(std::declval<Optimizer&>().host())>;
  using updates = detail::host_updates<Parts, host_optimizer>;
  friend detail::plan_interface<split_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `partial_adamw`'s); `streams`: the host share streams its
  /// gradients (stages 2-3, stepping beside the next forward: `gradients_stream_to_host`).
  template <class... Args>
  explicit split_plan(bool streams, Args&&... args)
      : opt_(std::forward<Args>(args)...), intake_(streams ? &opt_.host().grads() : nullptr, true) {
    if (streams && !opt_.host().can_run_async()) {
      throw usage_error("split_plan: the host share streams its gradients only when it steps beside the next "
                        "forward (offload_options::forward_overlap)");
    }
  }

  [[nodiscard]] bool steps_async() const noexcept { return intake_.streams(); }
  /// Per segment, the leading elements of the reduced slice the device share steps (kept on the device).
  [[nodiscard]] std::vector<std::size_t> kept() const { return opt_.device_elements(); }

  void connect(Parts& p) {
    p_ = &p;
    intake_.connect(
        p, [this](std::size_t k) { return opt_.host_offset(k); },
        [this](std::size_t k) { updates::early(*p_, opt_.host(), k); });
  }
  void begin_micro_step(bool boundary, double unscale) {
    end_early(false, 0.0);
    intake_.begin_micro_step(boundary, unscale);
  }
  void join() {
    if (intake_.streams()) {
      opt_.host().join_async();
    }
  }
  void end_early(bool applied, double norm) { updates::end(*p_, opt_.host(), applied, norm); }
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    if (intake_.streams()) {
      updates::begin_async(*p_, opt_.host(), args);
    }
    run_update(opt_, *p_, args, after);
  }
  void add_memory(memory_report& m, const offload_split& split) const {
    const double share = static_cast<double>(split.host_elements) / static_cast<double>(split.state_elements);
    add_host_memory(m, opt_.host().host_memory(), share, intake_.streams() ? share : 0.0);
  }
  [[nodiscard]] double host_param_share(const memory_report& m) const noexcept { return m.offload_ratio; }

private:
  Optimizer opt_;
  Parts* p_ = nullptr;
  host_gradient_intake<Parts, host_optimizer> intake_;
};

} // namespace zero
