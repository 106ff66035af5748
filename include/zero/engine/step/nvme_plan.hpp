#pragma once
/// \file
/// `nvme_plan`: ZeRO-Infinity's step, the optimizer state in a file of the storage policy, streamed
/// through host buffers (`nvme_adamw`). Gradients come to the host as with `host_plan` (streamed
/// during backward at stages 2-3). A step's writes (the state, and stage 3's parameter file when the
/// parameters are on NVMe too) count only where every rank wrote everything: otherwise every rank
/// gives the device its previous parameters again and the step is not applied (`end_writes`).
/// docs/offload.md, docs/storage.md.

#include "zero/engine/memory_report.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/nvme_adamw.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <exception>
#include <utility>

namespace zero {

/// The end of a step whose optimizer state was written to NVMe (`opt`: an `nvme_adamw`), once the ranks
/// agreed: where no rank's writes failed (`failed` false) the written slots become current (the state's,
/// and `file`'s: stage 3's parameters on NVMe, or null). Otherwise every rank waits for the step's
/// all-gathers (`finish_gathers`), gives the device its previous parameters again, makes them whole, and
/// throws io_error (this rank's own, `mine`, or one that names the cause elsewhere). \returns null.
template <class Parts, class Optimizer, class File, class Finish>
std::exception_ptr settle_state_writes(Parts& p, Optimizer& opt, File* file, const std::exception_ptr& mine,
                                       bool failed, Finish& finish_gathers) {
  if (!failed) {
    opt.commit();
    if (file != nullptr) {
      file->commit();
    }
    return nullptr;
  }
  finish_gathers(); // every all-gather of the failed step has landed and the update stream joined
  opt.rollback(*p.stream);
  if (file != nullptr) {
    file->rollback();
  }
  (*p.params)([](auto& r) { r.refresh(); });
  throw_agreed(mine,
               file != nullptr ? "could not write its optimizer state or parameters to NVMe"
                               : "could not write its optimizer state to NVMe",
               "; the optimizer step was not applied: parameters, optimizer state and its file are the previous "
               "step's on every rank");
}

/// The step plan of state on NVMe; the verbs are `step_plan`'s (see there), `detail::plan_interface`'s but
/// for the end of the step's writes.
template <class Parts, class Optimizer>
class nvme_plan : public detail::plan_interface<nvme_plan<Parts, Optimizer>, Parts, Optimizer> {
  friend detail::plan_interface<nvme_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `nvme_adamw`'s); `streams`: stages 2-3.
  template <class... Args>
  explicit nvme_plan(bool streams, Args&&... args)
      : opt_(std::forward<Args>(args)...), intake_(streams ? &opt_.grads() : nullptr, false) {}

  /// Waits for the step's writes (the state's, and `file`'s: stage 3's parameters on NVMe, or null), agrees
  /// with the other ranks and settles the step (`settle_state_writes`). \returns null.
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& finish_gathers) {
    std::exception_ptr mine = opt_.finish_step();
    if (file != nullptr) {
      if (auto e = file->finish_step(); e && !mine) {
        mine = e;
      }
    }
    return settle_state_writes(*p_, opt_, file, mine, p_->any_rank(mine != nullptr), finish_gathers);
  }
  void add_memory(memory_report& m, const offload_split& /*split*/) const {
    add_nvme_memory(m, opt_.host_memory(), opt_.nvme_bytes(), intake_.streams());
  }
  [[nodiscard]] double host_param_share(const memory_report& /*m*/) const noexcept { return 0.0; }

private:
  Optimizer opt_;
  Parts* p_ = nullptr;
  host_gradient_intake<Parts, Optimizer> intake_;
};

} // namespace zero
