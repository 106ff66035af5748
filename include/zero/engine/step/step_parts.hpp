#pragma once
/// \file
/// `step_parts`: the engine's parts a step plan works with (the config, the kernels, the data group,
/// the gradient pipeline, the residency and the step's progress), handed to the plan once at
/// `finalize` by `connect`. And the two pieces every plan shares: the update of the owned ranges
/// (`run_update`: segment by segment on the update stream, or at once) and the agreement on a step's
/// NVMe writes (`any_rank`, `throw_agreed`). docs/design.md, "Step plans".

#include "zero/backend/transfer.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/gradients/bucket_reducer.hpp"
#include "zero/engine/residency/residency.hpp"
#include "zero/engine/step/update_overlap.hpp"
#include "zero/engine/step/update_rates.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/optim/lr_schedule.hpp"

#include <cstddef>
#include <exception>
#include <functional>
#include <string>

namespace zero {

/// The engine's parts a step plan reads and drives; every pointer is set at `finalize` and outlives
/// the plan. See the file comment.
template <class Backend, class Comm, class Allocator, class Storage> struct step_parts {
  using stream_type = typename Backend::stream_type;
  /// What runs after segment `k`'s update on stream `s`: the residency's all-gather of it.
  using after_update = std::function<void(std::size_t k, const stream_type& s)>;

  const config* cfg = nullptr;
  const flat_layout* layout = nullptr;
  Backend* backend = nullptr;
  Comm* comm = nullptr;
  stream_type* stream = nullptr;
  bucket_reducer<Backend, Comm, Allocator>* reducer = nullptr;
  grad_stats<Backend, Comm, Allocator>* stats = nullptr;
  residency<Backend, Comm, Allocator, Storage>* params = nullptr;
  /// The update stream beside the next forward, or null (stage 0, or stages 1-2 on one rank).
  update_overlap<Backend, Comm>* overlap = nullptr;
  const lr_scheduler* scheduler = nullptr;
  const step_counters* counters = nullptr;
  /// One int in backend memory for `any_rank` (allocated where something is written to NVMe).
  buffer<int, counting_allocator<Allocator>>* agree = nullptr;
  /// LAMB's sums staged in backend memory for `sum_over_ranks` when an optimizer holds them in host memory and
  /// the backend's memory is not (LAMB with offload_optimizer cpu on several ranks of a device; else null).
  buffer<double, counting_allocator<Allocator>>* trust_sums = nullptr;

  /// The reduced gradient of a rank's range (what an optimizer's `grad_of` reads): the reducer's slice.
  [[nodiscard]] auto reduced() const {
    return [r = reducer](const flat_range& range, std::size_t off) { return r->reduced(range, off); };
  }
  /// The schedule's group learning rate of the step in progress, by reference.
  [[nodiscard]] auto group_lr() const {
    return [s = scheduler](double lr) { return s->group_lr(lr); };
  }
  /// The same by value: an update on the host's thread may still run after the step has moved the schedule on.
  [[nodiscard]] std::function<double(double)> group_lr_by_value() const {
    return [sched = *scheduler](double lr) { return sched.group_lr(lr); };
  }
  /// Adds `n` doubles over the data group in place, after the engine's stream's work so far: in backend memory,
  /// or (`host`) in host memory, staged through `trust_sums` where the backend's memory is not the host's.
  /// \throws usage_error when such staging is needed and `trust_sums` holds fewer than `n`.
  void sum_over_ranks(double* sums, std::size_t n, bool host) {
    if (comm->size() == 1) {
      return;
    }
    if (!host || Allocator::host_accessible) {
      comm->all_reduce(sums, sums, n, reduce_op::sum).wait();
      return;
    }
    if (trust_sums == nullptr || trust_sums->size() < n) {
      throw usage_error("step_parts::sum_over_ranks: " + std::to_string(n) +
                        " sums in host memory and no staging buffer in backend memory for them");
    }
    copy_async<false>(*backend, *stream, sums, trust_sums->data(), n);
    comm->all_reduce(trust_sums->data(), trust_sums->data(), n, reduce_op::sum).wait();
    copy_and_wait<false>(*backend, *stream, static_cast<const double*>(trust_sums->data()), sums, n);
  }
  /// True when `mine` is true on any rank (one all-reduce of an int in backend memory), its int written and
  /// read on `on` (the update stream, within a step on it) or on the engine's stream.
  bool any_rank(bool mine, const stream_type* on = nullptr) {
    if (comm->size() == 1) {
      return mine;
    }
    const stream_type& s = on != nullptr ? *on : *stream;
    backend->fill(agree->data(), 1, mine ? 1 : 0, s);
    comm->all_reduce(agree->data(), agree->data(), 1, reduce_op::max).wait();
    return backend->read_scalar(agree->data(), s) != 0;
  }
};

/// AdamW over the rank's owned ranges of `opt` with `args`: segment by segment on the update stream,
/// each handed to `after` behind its update, when the engine has one; else all at once on the
/// engine's stream. A rule with a trust ratio (LAMB) first forms every parameter's ratio on the engine's stream.
template <class Optimizer, class Parts>
void run_update(Optimizer& opt, Parts& p, const adamw_step_args& args, const typename Parts::after_update& after) {
  auto group_lr = p.group_lr();
  if constexpr (requires { opt.needs_trust_ratios(); }) {
    // LAMB: every parameter's ratio before any piece moves, its sums added over the shard group.
    if (opt.needs_trust_ratios()) {
      opt.form_trust_ratios(args, group_lr, p.reduced(),
                            [&p](double* sums, std::size_t n, bool host) { p.sum_over_ranks(sums, n, host); });
    }
  }
  if (p.overlap != nullptr) {
    p.overlap->run(
        p.layout->segments().size(),
        [&](std::size_t k, const typename Parts::stream_type& s) { opt.step_range(k, s, args, group_lr, p.reduced()); },
        after);
  } else {
    opt.step(args, group_lr, p.reduced());
  }
}

/// Throws `mine` (an io_error) with `kept` appended, or on a rank without an error of its own an echo
/// saying another rank `what`.
[[noreturn]] inline void throw_agreed(const std::exception_ptr& mine, const char* what, const char* kept) {
  if (mine) {
    try {
      std::rethrow_exception(mine);
    } catch (const io_error& e) {
      throw io_error(std::string(e.what()).substr(std::string("[zero.io_error] ").size()) + kept, e.status());
    }
  }
  throw as_echo(io_error(std::string("another rank ") + what + kept));
}

/// The end of a step's writes with the optimizer state in memory, which the step has already moved
/// on: the parameter file (stage 3's offload_param nvme, or null) commits what it wrote; where any
/// rank could not write, the parameters that failed stay in host memory (`detail::param_file`) and the
/// agreed io_error is returned, for `step()` to throw once it has ended.
template <class Parts, class File> std::exception_ptr end_param_writes(Parts& p, File* file) {
  if (file == nullptr) {
    return nullptr;
  }
  const std::exception_ptr mine = file->finish_step();
  const bool failed = p.any_rank(mine != nullptr);
  file->commit();
  if (!failed) {
    return nullptr;
  }
  try {
    throw_agreed(mine, "could not write its parameters to NVMe",
                 "; the optimizer step was applied (its state is in memory and has moved on): the parameters "
                 "that could not be written stay in host memory until a later step writes them");
  } catch (const io_error&) {
    return std::current_exception();
  }
}

} // namespace zero
