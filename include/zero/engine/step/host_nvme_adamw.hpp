#pragma once
/// \file
/// `host_nvme_adamw`: a rank's optimizer state in host memory and an NVMe file at once
/// (`offload_optimizer: {"device": "nvme", "host_ratio": h}`, zero's own key; docs/offload.md, "Host
/// memory and NVMe together"). The rank's state elements (its owned ranges, in state order) are split at
/// one element, as `partial_adamw` splits them (`detail::state_split`, `offloaded_state_elements`): the
/// first part keeps its state in a file and is stepped as `nvme_adamw` steps it, the rest, the share h,
/// keeps its state in host memory and is stepped as `offloaded_adamw` steps it. The host takes the last
/// elements, as in a partial offload. Both step on the host with `cpu_backend`'s AdamW, the kernel, the
/// arguments and the element order of the in-memory step, so the split changes no bit.
///
/// A step never leaves a state it cannot undo: the file's part writes a second slot, but the host's part
/// updates its master, m and v in place. So the host part waits for the file: per owned range k, in order,
/// on stream `s`,
///
///     file     range k's part: gradients down, chunks read, AdamW, chunks written to the other slot,
///              parameters up (nvme_adamw::step_range; an I/O error is kept, not thrown)
///     agree    at the first range with a host part: wait for every write of the file's part, and ask
///              every rank whether its I/O failed (`agree`, one all-reduce; every rank reaches it at the
///              same range, as their ranges have the same sizes)
///     host     range k's part, only when no rank failed: gradients down, AdamW in place, parameters up
///
/// When a rank failed, no rank's host part steps (its state is the previous step's) and the engine rolls
/// the file's part back (`nvme().rollback`, `host_nvme_plan::end_writes`): the step is not applied
/// anywhere. The price is order: the host's part of the step starts after the file's writes, where
/// `nvme_adamw` alone overlaps its AdamW with them. State indices are the rank's (0 to `state_size()`):
/// `read_state` and `write_state` reach either part, so a checkpoint does not depend on the split.

#include "zero/backend/backend.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/detail/state_split.hpp"
#include "zero/engine/step/nvme_adamw.hpp"
#include "zero/engine/step/offloaded_adamw.hpp"
#include "zero/storage/storage.hpp"

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// AdamW over a rank's part of the flat buffer, its first state elements in a file and the rest in host
/// memory; see the file comment. The interface is `nvme_adamw`'s, with `agreed` in place of
/// `finish_step`; the state view and `step` are `detail::state_split_view`'s, the file part the first and
/// the host part the second: state [0, split()) is in the file, [split(), state_size()) in memory.
template <backend Backend, allocator DeviceAlloc, storage Storage, allocator HostAlloc = offload_allocator_t<Backend>>
class host_nvme_adamw : public detail::state_split_view<host_nvme_adamw<Backend, DeviceAlloc, Storage, HostAlloc>> {
  using stream_type = typename Backend::stream_type;
  using view = detail::state_split_view<host_nvme_adamw>;
  friend view;

public:
  using view::host;
  using on_nvme = nvme_adamw<Backend, DeviceAlloc, Storage, HostAlloc>;
  using on_host = offloaded_adamw<Backend, DeviceAlloc, HostAlloc>;
  /// Whether any rank's I/O failed, given this rank's (`mine`), with its work on stream `s`: the step
  /// plan's one all-reduce (`step_parts::any_rank`).
  using agree_fn = std::function<bool(bool mine, const stream_type& s)>;

  /// \param layout, place, group_of, groups as `nvme_adamw`'s (the placement keeps everything).
  /// \param host    host memory of both parts: the host part's state and staging, the file part's
  ///                gradient and parameter copies and chunk buffers.
  /// \param stream  the engine's stream (kept by reference).
  /// \param storage, rank, nvme the file part's, as `nvme_adamw`'s; `nvme.threads` run both parts' AdamW.
  /// \param host_elements the rank's state elements kept in host memory (its last ones).
  /// \throws usage_error unless 0 < host_elements < the rank's state elements (otherwise one optimizer
  ///         alone does it); what `nvme_adamw`'s constructor throws.
  host_nvme_adamw(const flat_layout& layout, const adamw_placement& place, const std::vector<std::size_t>& group_of,
                  const std::vector<param_group>& groups, Backend& backend, HostAlloc host, stream_type& stream,
                  Storage& storage, int rank, const nvme_options& nvme, std::size_t host_elements)
      : stream_(stream),
        parts_(
            "host_nvme_adamw",
            "in host memory; expected more than 0 and fewer than all (use nvme_adamw or offloaded_adamw for none or "
            "all)",
            layout, place, host_elements,
            [&](const adamw_placement& mine) {
              return on_nvme(layout, mine, group_of, groups, backend, host, stream, storage, rank, nvme);
            },
            [&](const adamw_placement& mine) {
              return on_host(layout, mine, group_of, groups, backend, host, stream,
                             offload_options{.threads = nvme.threads});
            }) {}

  host_nvme_adamw(const host_nvme_adamw&) = delete;
  host_nvme_adamw& operator=(const host_nvme_adamw&) = delete;
  ~host_nvme_adamw() = default;

  /// The ranks' agreement on the file part's I/O; the step plan sets it before the first step.
  void set_agree(agree_fn agree) { agree_ = std::move(agree); }

  /// The first part (its state indices start at 0); the second is `host()`.
  [[nodiscard]] on_nvme& nvme() noexcept { return parts_.first(); }
  [[nodiscard]] const on_nvme& nvme() const noexcept { return parts_.first(); }

  /// The step of owned range `k` on `s` (see the file comment); ranges are stepped in order. An I/O error
  /// does not throw here: `agreed` reports it after the step.
  /// \throws usage_error for a range that does not exist, or without `set_agree`.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    const std::size_t n = parts_.ranges().size();
    parts_.check_range(k);
    if (!agree_) {
      throw usage_error("host_nvme_adamw::step_range: no agreement of the ranks (set_agree)");
    }
    if (k == 0 || !stepping_) { // a new step
      nvme().groups() = host().groups();
      stepping_ = true;
      agreed_ = false;
      failed_anywhere_ = false;
      mine_ = nullptr;
    }
    nvme().step_range(k, s, base, group_lr, grad_of);
    if (!agreed_ && !host().ranges()[k].first.empty()) {
      // The host part updates in place: only once every rank's file part has written its new slot.
      mine_ = nvme().finish_step();
      failed_anywhere_ = agree_(mine_ != nullptr, s);
      agreed_ = true;
    }
    if (!failed_anywhere_) {
      host().step_range(k, s, base, group_lr,
                        [&](const flat_range& r, std::size_t off) { return grad_of(r, off + parts_.split()); });
    }
    stepping_ = k + 1 != n;
  }

  /// What the step's agreement found (after every range was stepped): this rank's I/O error or null,
  /// and whether any rank's I/O failed (then no host part stepped; the file part must roll back).
  /// \returns {null, false} when no step ran since the last call.
  [[nodiscard]] std::pair<std::exception_ptr, bool> agreed() {
    if (!agreed_) {
      return {nvme().finish_step(), false};
    }
    agreed_ = false;
    return {std::exchange(mine_, nullptr), std::exchange(failed_anywhere_, false)};
  }

private:
  stream_type& stream_;
  detail::state_split<on_nvme, on_host> parts_;
  agree_fn agree_;
  bool stepping_ = false;
  bool agreed_ = false;
  bool failed_anywhere_ = false;
  std::exception_ptr mine_;
};

} // namespace zero
