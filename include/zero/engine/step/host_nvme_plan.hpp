#pragma once
/// \file
/// `host_nvme_plan`: the optimizer state in host memory and an NVMe file at once (`offload_optimizer:
/// {"device": "nvme", "host_ratio": h}`, `host_nvme_adamw`), both parts stepped on the host. The reducer
/// keeps the rank's reduced gradients on the device, as for a partial offload without forward_overlap,
/// and each part copies its share to the host at the step. The ranks agree on the file part's writes
/// within the step, before the host part updates in place (`host_nvme_adamw`'s file comment); a failure
/// anywhere leaves the step unapplied on every rank, as with the whole state on NVMe
/// (`settle_state_writes`). docs/offload.md, "Host memory and NVMe together".

#include "zero/core/error.hpp"
#include "zero/engine/memory_report.hpp"
#include "zero/engine/step/detail/plan_interface.hpp"
#include "zero/engine/step/gradient_intake.hpp"
#include "zero/engine/step/host_nvme_adamw.hpp"
#include "zero/engine/step/nvme_plan.hpp"
#include "zero/engine/step/step_parts.hpp"

#include <exception>
#include <utility>

namespace zero {

/// The step plan of a state split between host memory and NVMe; the verbs are `step_plan`'s (see there),
/// `detail::plan_interface`'s but for the ranks' agreement on the file part's writes.
template <class Parts, class Optimizer>
class host_nvme_plan : public detail::plan_interface<host_nvme_plan<Parts, Optimizer>, Parts, Optimizer> {
  using stream_type = typename Parts::stream_type;
  friend detail::plan_interface<host_nvme_plan, Parts, Optimizer>;

public:
  /// Makes the optimizer from `args` (as `host_nvme_adamw`'s).
  template <class... Args> explicit host_nvme_plan(Args&&... args) : opt_(std::forward<Args>(args)...) {}

  /// Connects as `plan_interface` does, and gives the optimizer the ranks' agreement.
  void connect(Parts& p) {
    p_ = &p;
    intake_.connect(p);
    opt_.set_agree([this](bool mine, const stream_type& s) { return p_->any_rank(mine, &s); });
  }
  /// Settles the step as the ranks agreed within it: the file part's new slot becomes current, or every
  /// rank rolls it back and throws io_error (the host part did not step). \returns null.
  /// \throws usage_error for a parameter file (`check_engine_config` refuses offload_param nvme here).
  template <class File, class Finish> std::exception_ptr end_writes(File* file, Finish&& finish_gathers) {
    if (file != nullptr) {
      throw usage_error("host_nvme_plan: parameters on NVMe with the optimizer state split between host memory and "
                        "NVMe (offload_optimizer.host_ratio) are refused by check_engine_config");
    }
    const auto [mine, failed] = opt_.agreed();
    return settle_state_writes(*p_, opt_.nvme(), file, mine, failed, finish_gathers);
  }
  void add_memory(memory_report& m, const offload_split& split) const {
    add_host_nvme_memory(m, opt_.host().host_memory(), opt_.nvme().host_memory(), opt_.nvme().nvme_bytes(),
                         host_share(split));
  }
  /// The host part writes its share of stage 3's host parameter shard in place, which its host formula
  /// counts (`add_host_params`).
  [[nodiscard]] double host_param_share(const memory_report& m) const noexcept { return m.host_share; }

private:
  static double host_share(const offload_split& split) {
    return static_cast<double>(split.state_elements - split.nvme_elements) / static_cast<double>(split.state_elements);
  }

  Optimizer opt_;
  Parts* p_ = nullptr;
  gradient_intake<Parts> intake_;
};

} // namespace zero
