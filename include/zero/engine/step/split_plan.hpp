#pragma once
/// \file
/// `split_plan`: partial offload (`offload_optimizer.ratio` below 1), a share of the optimizer state
/// on the host and the rest on the backend (`partial_adamw`). The reducer keeps the device share's
/// gradients as in memory; with `forward_overlap` at stages 2-3 it streams the host share's slices to
/// the host during backward (`gradient_intake`, `reducer_options::kept`) and the host share steps beside
/// the next forward, while the device share steps at once. docs/offload.md.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/host_plan.hpp"
#include "zero/engine/step/partial_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <exception>
#include <utility>
#include <vector>

namespace zero {

/// The step plan of a state split between the backend and the host; the verbs are `step_plan`'s.
template <class Parts, class Optimizer> class split_plan {
  using host_optimizer = std::remove_reference_t<decltype(std::declval<Optimizer&>().host())>;
  using updates = detail::host_updates<Parts, host_optimizer>;

public:
  using optimizer_type = Optimizer;
  using stream_type = typename Parts::stream_type;

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

  [[nodiscard]] optimizer_type& optimizer() noexcept { return opt_; }
  [[nodiscard]] const optimizer_type& optimizer() const noexcept { return opt_; }
  [[nodiscard]] bool streams() const noexcept { return intake_.streams(); }
  [[nodiscard]] bool steps_async() const noexcept { return streams(); }
  /// Per segment, the leading elements of the reduced slice the device share steps (kept on the device).
  [[nodiscard]] std::vector<std::size_t> kept() const { return opt_.device_elements(); }
  [[nodiscard]] static constexpr float* derived_master() noexcept { return nullptr; }

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
    if (streams()) {
      opt_.host().join_async();
    }
  }
  void landed() { intake_.landed(); }
  grad_check check(double unscale) { return intake_.check(unscale); }
  void end_early(bool applied, double norm) { updates::end(*p_, opt_.host(), applied, norm); }
  void apply(const adamw_step_args& args, const typename Parts::after_update& after) {
    if (streams()) {
      updates::begin_async(*p_, opt_.host(), args);
    }
    run_update(opt_, *p_, args, after);
  }
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& /*finish_gathers*/) {
    return end_param_writes(*p_, file);
  }
  /// The host share's streamed copy and the device share's kept gradients.
  void zero_gradients(const stream_type* s) { intake_.zero(s); }
  void add_memory(memory_report& m, const offload_split& split) const {
    const double share = static_cast<double>(split.host_elements) / static_cast<double>(split.state_elements);
    add_host_memory(m, opt_.host().host_memory(), share, streams() ? share : 0.0);
  }
  [[nodiscard]] double host_param_share(const memory_report& m) const noexcept { return m.offload_ratio; }

private:
  Optimizer opt_;
  Parts* p_ = nullptr;
  gradient_intake<Parts, std::remove_reference_t<decltype(std::declval<host_optimizer&>().grads())>> intake_;
};

} // namespace zero
