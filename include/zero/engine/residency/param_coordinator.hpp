#pragma once
/// \file
/// `param_coordinator`: stage 3's parameters, partitioned between steps and gathered on demand.
///
/// The flat layout is split into *units*, one segment per module (parameters below stage3_param_persistence_threshold
/// go to persistent units instead). Between steps a rank holds only its slice of every unit (the shard) plus whole
/// copies of the persistent units. `gather(m)` all-gathers module m's unit into a working buffer; `release(m)` gives it
/// back.
///
/// Prefetch follows a trace: the first step records the order in which modules are gathered, and later steps replay
/// it, gathering ahead within stage3_prefetch_bucket_size and stage3_max_live_parameters and keeping released units the
/// trace reuses within stage3_max_reuse_distance. A trace is kept per schedule position (`begin_micro_step`, for 1F1B's
/// orders) and one for evaluation. An evaluation pass may instead gather the whole model once at its start
/// (`begin_eval(true)`), after which its gathers issue no collective, so ranks may run different numbers of evaluation
/// batches. The parts, each in engine/detail/: the traces and which pass is open, `gather_traces` (gather_traces.hpp);
/// what is gathered ahead, read ahead and kept, `prefetch_policy` (prefetch_policy.hpp); how a gather's errors name its
/// module, `naming` (gather_errors.hpp); the modules and the framework's holds on them, `module_table`
/// (module_table.hpp); how one unit is staged and all-gathered, `unit_gather` (unit_gather.hpp).
///
/// Every rank must gather the same modules in the same order, as every rank must issue the same collectives; an error
/// of the communicator during a gather names the module, and the ordering rule where the collectives differed.
///
/// With 16-bit parameters and nothing offloaded no shard is kept (`params_from_master`): a gather casts the rank's
/// slice of the optimizer's fp32 master into the unit, which a kept shard (the master rounded,
/// `stage3_keep_param_shard`) would hold anyway; P psi / n bytes less per rank.
///
/// With a host allocator (`zero_optimization.offload_param.device: cpu`) the shard lives in host memory
/// (`detail::param_shard`): a gather uploads the rank's slice into the unit's device memory at the rank's position on
/// an upload stream, then all-gathers in place, and a prefetch posts both. Persistent units stay whole in device
/// memory. With `offload_param.device: nvme` the shard is in a file of the storage policy: a gather reads the slice
/// first, and the prefetcher reads ahead. A read that fails in training uploads zeros and is reported by the engine at
/// the next `step()`; in an evaluation pass, which has no step after it, the gather of the unit whose read failed
/// throws the io_error naming the file (docs/offload.md).
///
/// With hpZ (`use_secondary`, `zero_hpz_partition_size`) a rank also keeps its node slice of each gathered unit, and
/// gathers the unit over its node group from those slices until the shards change (docs/zeropp.md).

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/gather_stats.hpp"
#include "zero/engine/residency/detail/gather_errors.hpp"
#include "zero/engine/residency/detail/gather_traces.hpp"
#include "zero/engine/residency/detail/module_table.hpp"
#include "zero/engine/residency/detail/param_shard.hpp"
#include "zero/engine/residency/detail/prefetch_policy.hpp"
#include "zero/engine/residency/detail/unit_gather.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/host_allocator.hpp"
#include "zero/storage/posix_storage.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// Stage 3's gathering; see the file comment. `HostAlloc` is the host memory of an offloaded shard,
/// `Storage` the policy of its file.
template <backend Backend, communicator Comm, allocator A, allocator HostAlloc = host_allocator,
          storage Storage = posix_storage>
class param_coordinator {
  using counting = counting_allocator<A>;
  using host_counting = counting_allocator<HostAlloc>;
  using handle_type =
      decltype(std::declval<Comm&>().all_gather(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0));

public:
  using shard_type = detail::param_shard<Backend, A, HostAlloc, Storage>;

  /// \param layout        finalized with `segment_by::module` (kept by reference).
  /// \param module_units  for each module id, the units (segments) gather(module) brings in.
  /// \param persistent    units kept whole on every rank.
  /// \param module_names  for messages.
  /// \param state         memory of the shard and persistent copies (memory_tag::params).
  /// \param work          memory of gathered units: the working set, counted apart.
  /// \param host          host memory of the shard (offload_param cpu; counted apart, `host_memory()`),
  ///                      or none: the shard lives in `state`.
  /// \param file          with `host`: the shard lives in this file instead (offload_param nvme).
  /// \throws config_error for a module above stage3_max_live_parameters, or a shard in host memory
  ///         the backend cannot copy from; io_error for a file that cannot be made; memory_error.
  param_coordinator(const flat_layout& layout, std::vector<std::vector<std::size_t>> module_units,
                    std::vector<std::size_t> persistent, std::vector<std::string> module_names, Backend& backend,
                    Comm& comm, counting state, counting work, coordinator_options opt,
                    typename Backend::stream_type& stream, std::optional<host_counting> host = std::nullopt,
                    std::optional<typename shard_type::on_file> file = std::nullopt)
      : layout_(layout), modules_(std::move(module_units), std::move(module_names)), backend_(backend), comm_(comm),
        work_(std::move(work)), opt_(opt), stream_(stream), esize_(size_of(layout.type())),
        gather_(layout_, backend_, comm_, stream_),
        shard_(backend, stream, state, std::move(host), layout_.shard_size() * size_of(layout.type()), std::move(file),
               opt.params_from_master) {
    require_all_gather<Comm>();
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      comm_.set_compute_stream(stream_.get());
    }
    units_.resize(layout_.segments().size());
    for (std::size_t u : persistent) {
      units_[u].persistent = true;
      units_[u].data =
          buffer<std::byte, counting>(state, layout_.segments()[u].range.size() * esize_, memory_tag::params);
    }
    for (const auto& units : modules_.units()) {
      for (std::size_t u : units) {
        const std::size_t n = layout_.segments()[u].range.size();
        if (!units_[u].persistent && n > opt_.max_live_elements) {
          throw config_error("zero_optimization.stage3_max_live_parameters: " + std::to_string(opt_.max_live_elements) +
                             " elements cannot hold a module of " + std::to_string(n) +
                             " elements; raise it to at least the largest module");
        }
      }
    }
  }

  /// The rank's shard of every unit, indexed like the optimizer state (host memory when offloaded).
  [[nodiscard]] std::byte* shard() noexcept { return shard_.data(); }
  /// The counting allocator of the shard's host memory (offload_param cpu or nvme), or null.
  [[nodiscard]] const host_counting* host_memory() const noexcept { return shard_.host_memory(); }
  /// The shard's file (offload_param nvme), or null; the non-const one waits for uploads out of it.
  [[nodiscard]] auto* file() { return shard_.file(); }
  [[nodiscard]] auto* file() const noexcept { return shard_.file(); }
  /// The parameters the optimizer updates: the shard (the interface `replicated_params` shares), or
  /// null with `params_from_master`, when no shard is kept and `derive_from` (once the optimizer
  /// exists, before the first gather) gives the fp32 master the gathers cast their slices from.
  [[nodiscard]] std::byte* store() noexcept { return shard_.data(); }
  [[nodiscard]] bool params_from_master() const noexcept { return shard_.derived(); }
  void derive_from(float* master) noexcept { shard_.derive_from(master); }
  /// True: the store is the rank's shard, indexed like the optimizer state.
  static constexpr bool sharded_store = true;
  /// Elements of the store.
  [[nodiscard]] std::size_t store_elements() const noexcept { return layout_.shard_size(); }

  /// After the update of unit `u`'s shard slice was enqueued on `s` (a stream other than the
  /// coordinator's): the unit's next gather orders the coordinator's stream after that point first.
  void after_update(std::size_t u, const typename Backend::stream_type& s) {
    auto& unit = units_[u];
    if (!unit.updated) {
      unit.updated.emplace(backend_.make_event());
    }
    backend_.record(*unit.updated, s);
    unit.update_pending = true;
    shard_.updated(u, s);
    forget_secondary();
  }
  /// `f(u)` is called once the coordinator's stream is ordered after the update of unit `u`'s shard
  /// slice (a gather of a shard in model-state memory waits for it there), or once the host knows that
  /// update is done (an offloaded shard's upload waits for it, and the gather's handle was waited), so
  /// whatever that update read may be reused on that stream.
  void on_joined(std::function<void(std::size_t)> f) { on_joined_ = std::move(f); }
  /// The coordinator's stream was ordered after every update (the engine joined the update stream).
  void updates_joined() noexcept {
    for (auto& unit : units_) {
      unit.update_pending = false;
    }
  }
  /// After the shard was rewritten (initialisation, loading, a step): the persistent units again.
  /// \throws io_error when an image of a shard in a file could not be written back (it stays).
  void refresh() {
    forget_secondary();
    const auto e = shard_.flush();
    refresh_persistent();
    if (e) {
      std::rethrow_exception(e);
    }
  }
  /// Nothing is posted beyond a gather's own scope.
  void finish() const noexcept {}

  /// Brings module `m`'s units in (or finds them gathered, prefetched or kept) and counts a use.
  /// When it throws, the module is not gathered (its units are counted back).
  /// \throws usage_error for an unknown module; timeout_error naming the module when other ranks
  /// do not gather it; comm_error naming it when they start another collective; in an evaluation
  /// pass with the shard on NVMe, io_error naming the file when the read of the module's slice failed.
  void gather(int m) {
    const auto mi = modules_.check(m, "gather");
    if (!whole_eval_) { // with everything gathered there is nothing to trace or prefetch
      traces_.note(m, stats_, modules_.names(), log_);
    }
    const auto& units = modules_.units()[mi];
    for (std::size_t k = 0; k < units.size(); ++k) {
      try {
        ensure_live(units[k], m);
      } catch (...) {
        for (std::size_t j = 0; j < k; ++j) {
          --units_[units[j]].refs;
        }
        traces_.gather_failed(); // an evaluation pass's order so far is not a trace to replay
        throw;
      }
      ++units_[units[k]].refs;
    }
    modules_.hold(mi);
    if (!whole_eval_) {
      prefetch();
    }
  }

  /// Gives module `m` back; its units are freed unless the trace reuses them soon.
  /// \throws usage_error when `m` is not gathered (a double release).
  void release(int m) {
    const auto mi = modules_.check(m, "release");
    modules_.drop(mi);
    for (std::size_t u : modules_.units()[mi]) {
      auto& unit = units_[u];
      if (--unit.refs == 0 && !unit.persistent && !keep_for_reuse(u)) {
        free_unit(u);
      }
    }
  }

  /// True while module `m` is gathered by the framework.
  [[nodiscard]] bool gathered(int m) const { return modules_.held(modules_.check(m, "gathered")); }

  /// The whole unit `u`, valid while it is gathered (or persistent).
  /// \throws usage_error naming `what` when the unit is not gathered.
  [[nodiscard]] std::byte* full(std::size_t u, const std::string& what) const {
    const auto& unit = units_[u];
    if (!unit.persistent && (unit.refs == 0 || unit.state != unit_state::live)) {
      throw usage_error(what + " is not gathered: call gather(module) before using its parameters, and keep "
                               "the guard alive while you do");
    }
    // The coordinator owns the working buffers; views into them are writable by design.
    return const_cast<std::byte*>(unit.data.data());
  }

  /// True for units kept whole on every rank.
  [[nodiscard]] bool persistent(std::size_t u) const noexcept { return units_[u].persistent; }

  /// Ends a training micro-step: checks nothing is still gathered, frees what was kept, and records
  /// the trace of its schedule position when this step's order differed (or none was recorded). With
  /// `params_changed` (the optimizer updated the shards) the persistent units are refreshed from the shards.
  void end_step(bool params_changed) {
    modules_.require_released("step() while module \"",
                              "\" is still gathered; release it (end the guard's scope) before the "
                              "optimizer step");
    drop_all();
    traces_.end_micro_step(stats_);
    last_stats_ = std::exchange(stats_, {});
    if (params_changed) {
      forget_secondary();
      refresh_persistent();
    }
  }

  /// The next training gathers belong to micro-step `position` of the accumulation (0 to
  /// gradient_accumulation_steps - 1): they follow, and record, that schedule position's trace (see the
  /// file comment). The engine calls it as each micro-step begins; without it every step is position 0.
  void begin_micro_step(std::size_t position) { traces_.begin_micro_step(position); }

  /// Starts a forward-only pass (evaluation): its order is traced apart from training's, and its
  /// gathers are counted apart (`stats_of_last_eval`). With `whole_model`, every unit is gathered
  /// now, once, and gathers inside the pass issue no collective and record no trace, so ranks may
  /// run different numbers of forwards (the memory of the whole model is held until `end_eval`).
  /// With the shard on NVMe a read that fails in the pass fails the gather that needed it (with
  /// `whole_model`, this call); the pass stays open for `end_eval`, as the engine's scope ends it.
  /// \throws usage_error when a pass is open; io_error naming the file (NVMe); the communicator's
  /// errors naming the module, as `gather`.
  void begin_eval(bool whole_model = false) {
    if (traces_.evaluating()) {
      throw usage_error("an evaluation pass is already open");
    }
    traces_.begin_eval();
    train_stats_ = stats_;
    stats_ = {};
    reads_at_gather(true);
    if (whole_model) {
      try {
        gather_everything();
      } catch (...) {
        reads_at_gather(false);
        traces_.end_eval(stats_, false);
        stats_ = train_stats_;
        throw;
      }
      whole_eval_ = true;
    }
  }
  /// Ends the evaluation pass; nothing stays gathered.
  void end_eval() {
    if (!traces_.evaluating()) {
      throw usage_error("end of an evaluation pass that was not begun");
    }
    modules_.require_released("evaluation ended while module \"", "\" is still gathered");
    // A whole-model pass's order was local to each rank: it is not a trace every rank can replay.
    const bool whole = std::exchange(whole_eval_, false);
    if (whole) {
      release_everything(-1);
    }
    drop_all();
    traces_.end_eval(stats_, !whole);
    last_eval_stats_ = stats_;
    stats_ = train_stats_;
    reads_at_gather(false); // drops a failed read ahead for a unit the pass never gathered
  }

  /// All-gathers the persistent units from the shards (after initialisation and every step).
  void refresh_persistent() {
    if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
      backend_.synchronize(stream_);
    }
    std::vector<handle_type> hs;
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (units_[u].persistent) {
        hs.push_back(start_gather(u, units_[u].data.data()));
        --stats_.all_gathers;
        ++stats_.persistent_refreshes;
      }
    }
    for (auto& h : hs) {
      h.wait();
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      waited(u);
    }
  }

  /// Gathers every unit, whatever the limits (DeepSpeed's GatheredParameters); `release_everything`
  /// undoes it. With `modifier_rank >= 0`, that rank's whole values are broadcast and written back
  /// into every rank's shard, and `on_written` is called so the optimizer can reload its master copy.
  /// With the shard on NVMe a read that fails fails this call (no step may follow to report it), as in
  /// an evaluation pass. When it throws, nothing stays gathered by it.
  /// \throws io_error naming the file (NVMe); the communicator's errors, as `gather`.
  void gather_everything() {
    const bool was = reads_at_gather_;
    reads_at_gather(true);
    struct restore {
      param_coordinator& c;
      bool was;
      ~restore() { c.reads_at_gather(was); }
    } restore_reads{*this, was};
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (!units_[u].persistent) {
        try {
          ensure_live(u, -1);
        } catch (...) {
          for (std::size_t v = 0; v < u; ++v) {
            if (!units_[v].persistent && --units_[v].refs == 0) {
              free_unit(v);
            }
          }
          throw;
        }
        ++units_[u].refs;
      }
    }
  }
  void release_everything(int modifier_rank) {
    if (modifier_rank >= 0) {
      forget_secondary();
      backend_.synchronize(stream_);
      for (std::size_t u = 0; u < units_.size(); ++u) {
        const auto& s = layout_.segments()[u];
        std::byte* whole = units_[u].data.data();
        visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
          P* p = reinterpret_cast<P*>(whole);
          comm_.broadcast(p, p, s.range.size(), modifier_rank).wait();
          const P* mine = p + static_cast<std::size_t>(comm_.rank()) * s.slice;
          shard_.put_unit(mine, s.shard_offset, s.slice);
        });
      }
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      if (!units_[u].persistent && --units_[u].refs == 0) {
        free_unit(u);
      }
    }
  }

  /// This step's counters so far; `stats_of_last_step` keeps the previous step's.
  [[nodiscard]] const gather_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const gather_stats& stats_of_last_step() const noexcept { return last_stats_; }
  [[nodiscard]] const gather_stats& stats_of_last_eval() const noexcept { return last_eval_stats_; }
  /// The training trace of the current schedule position (module ids in gather order): recorded, or
  /// replayed from another position until this one has run; empty before the first step ends.
  [[nodiscard]] const std::vector<int>& trace() const noexcept { return traces_.trace(); }
  /// The current schedule position (`begin_micro_step`), and the positions that have a pass so far.
  [[nodiscard]] std::size_t position() const noexcept { return traces_.position(); }
  [[nodiscard]] std::size_t positions() const noexcept { return traces_.positions(); }
  /// Elements gathered now (live and in flight), and the most there ever were.
  [[nodiscard]] std::size_t live_elements() const noexcept { return live_; }
  [[nodiscard]] std::size_t peak_live_elements() const noexcept { return peak_live_; }
  /// Where log lines go (trace changes).
  void set_log(std::function<void(const std::string&)> log) { log_ = std::move(log); }
  /// hpZ: keeps a secondary partition of every unit over `node` (this rank's node group, kept by
  /// reference), and gathers a unit over it while it is fresh (`detail::unit_gather`). Before the first gather.
  void use_secondary(Comm& node, counting state) { gather_.use_secondary(node, std::move(state)); }
  /// qwZ: gathers the units (not the persistent ones) as block-quantized codes of format `f`.
  void use_quantized(quant_format f) { gather_.use_quantized(f, work_); }
  /// Bytes of the secondary partition (0 without hpZ).
  [[nodiscard]] std::size_t secondary_bytes() const noexcept { return gather_.secondary_bytes(); }

private:
  enum class unit_state : std::uint8_t { idle, in_flight, live };

  struct unit {
    unit_state state = unit_state::idle;
    bool persistent = false;
    bool prefetched = false; // brought in ahead of use and not yet used
    int refs = 0;
    buffer<std::byte, counting> data;
    buffer<std::byte, counting> packed; // a quantized gather's codes and scales (qwZ)
    std::optional<handle_type> pending;
    /// The point the update stream passed this unit's optimizer update, and whether the
    /// coordinator's stream still has to wait for it before the shard slice is read.
    std::optional<typename Backend::event_type> updated;
    bool update_pending = false;
    bool joins_at_wait = false; // the gather in flight follows the update on an upload stream
  };

  /// Failed reads of the shard's file fail the gather that needed them (`on`), or wait for the step.
  void reads_at_gather(bool on) {
    reads_at_gather_ = on;
    shard_.report_reads_at_gather(on);
  }
  handle_type start_gather(std::size_t u, std::byte* whole) {
    ++stats_.all_gathers;
    const auto* update = units_[u].update_pending ? &*units_[u].updated : nullptr;
    units_[u].update_pending = false;
    return gather_.start(u, whole, update, units_[u].persistent, units_[u].packed, stats_, shard_,
                         [this](std::size_t k, bool now) {
                           units_[k].joins_at_wait = !now;
                           if (now && on_joined_) {
                             on_joined_(k);
                           }
                         });
  }
  /// After unit `u`'s gather was waited: an update its upload followed is done (see `on_joined`).
  void waited(std::size_t u) {
    if (std::exchange(units_[u].joins_at_wait, false) && on_joined_) {
      on_joined_(u);
    }
  }

  void make_room(std::size_t n) {
    // Free units kept for reuse (never ones in use) until n more elements fit.
    for (std::size_t u = 0; u < units_.size() && live_ + n > opt_.max_live_elements; ++u) {
      auto& unit = units_[u];
      if (!unit.persistent && unit.refs == 0 && unit.state != unit_state::idle) {
        free_unit(u);
      }
    }
  }

  void ensure_live(std::size_t u, int module) {
    auto& unit = units_[u];
    if (unit.persistent) {
      return;
    }
    if (unit.state == unit_state::idle) {
      const std::size_t n = layout_.segments()[u].range.size();
      make_room(n);
      if (live_ + n > opt_.max_live_elements && module >= 0) {
        throw usage_error("gathering " + modules_.text(module) + " (" + std::to_string(n) + " elements) would hold " +
                          std::to_string(live_ + n) +
                          " elements at once, above zero_optimization.stage3_max_live_parameters = " +
                          std::to_string(opt_.max_live_elements) + "; release modules sooner or raise the limit");
      }
      start_unit(u, modules_.text(module));
      ++stats_.on_demand;
    } else if (unit.prefetched) {
      unit.prefetched = false;
      ++stats_.prefetch_used;
    } else if (unit.refs == 0 && unit.state == unit_state::live) {
      ++stats_.reused;
    }
    if (unit.state == unit_state::in_flight) {
      detail::naming(modules_.text(module), [&] { unit.pending->wait(); });
      unit.pending.reset();
      waited(u);
      unit.state = unit_state::live;
      gather_.land(u, unit.data.data(), unit.packed);
    }
    if (reads_at_gather_) {
      // An evaluation pass or a gather_all has no step() to report a failed read at (training's gathers
      // upload zeros and leave it to the step, where every rank agrees): the unit holds zeros, so the
      // gather fails.
      if (const std::exception_ptr e = shard_.take_read_error(u)) {
        free_unit(u); // its zeros are not reused: a later gather reads the slice again
        detail::rethrow_read_failure(e, modules_.text(module) + (traces_.evaluating() ? " for evaluation" : ""));
      }
    }
  }

  /// Allocates idle unit `u` and starts its gather (of `what`, for the communicator's errors); when the
  /// start throws, the unit is idle again.
  void start_unit(std::size_t u, const std::string& what) {
    auto& unit = units_[u];
    allocate(u);
    unit.state = unit_state::in_flight; // so that free_unit gives the buffer back if the start fails
    try {
      detail::naming(what, [&] { unit.pending.emplace(start_gather(u, unit.data.data())); });
    } catch (...) {
      free_unit(u);
      throw;
    }
  }

  void allocate(std::size_t u) {
    const std::size_t n = layout_.segments()[u].range.size();
    units_[u].data = buffer<std::byte, counting>(work_, n * esize_, memory_tag::params);
    live_ += n;
    peak_live_ = std::max(peak_live_, live_);
  }

  void free_unit(std::size_t u) {
    auto& unit = units_[u];
    if (unit.state == unit_state::idle || unit.persistent) {
      return;
    }
    if (unit.pending) {
      unit.pending->wait();
      unit.pending.reset();
      waited(u);
    }
    if (unit.prefetched) {
      ++stats_.prefetch_wasted;
      unit.prefetched = false;
    }
    unit.data.release();
    unit.packed.release();
    unit.state = unit_state::idle;
    live_ -= layout_.segments()[u].range.size();
  }

  /// Starts the gathers of the units the trace uses next, within the limits; past them, a shard in a file
  /// reads the next slices ahead (`detail::prefetch_policy`).
  void prefetch() {
    const detail::prefetch_policy policy(traces_.current(), modules_.units(), opt_);
    const auto idle = [this](std::size_t u) { return !units_[u].persistent && units_[u].state == unit_state::idle; };
    const std::size_t stopped = policy.start_ahead(live_, held(), idle, [&](std::size_t u, int m) {
      start_unit(u, modules_.text(m) + " (a prefetch: the trace gathers it next)");
      units_[u].prefetched = true;
      ++stats_.prefetched;
    });
    policy.read_ahead(stopped, idle, [this](std::size_t u) { return shard_.read_ahead(u); });
  }
  /// True when the trace uses unit `u` again soon (`detail::prefetch_policy::keep`).
  bool keep_for_reuse(std::size_t u) {
    return detail::prefetch_policy(traces_.current(), modules_.units(), opt_).keep(u, held());
  }
  /// The elements a gather of a unit holds (0 for a persistent one), for the prefetch policy.
  auto held() const {
    return [this](std::size_t u) { return units_[u].persistent ? std::size_t{0} : layout_.segments()[u].range.size(); };
  }

  void forget_secondary() noexcept { gather_.forget(); }

  void drop_all() {
    for (std::size_t u = 0; u < units_.size(); ++u) {
      free_unit(u);
    }
  }

  const flat_layout& layout_;
  detail::module_table modules_; // the modules' units and names, and the framework's holds on them
  Backend& backend_;
  Comm& comm_;
  counting work_;
  coordinator_options opt_;
  typename Backend::stream_type& stream_;
  std::size_t esize_;
  std::vector<unit> units_;
  detail::unit_gather<Backend, Comm, A> gather_; // stages, gathers and lands one unit (hpZ, qwZ)
  // After units_: destroyed first, it waits for uploads into their memory.
  shard_type shard_;
  detail::gather_traces traces_; // the trace per schedule position and evaluation's, and which pass is open
  bool whole_eval_ = false;      // an evaluation pass that gathered the whole model at its start
  bool reads_at_gather_ = false; // a failed read of the shard's file fails its gather (see `reads_at_gather`)
  std::size_t live_ = 0;
  std::size_t peak_live_ = 0;
  gather_stats stats_, last_stats_, train_stats_, last_eval_stats_;
  std::function<void(const std::string&)> log_;
  std::function<void(std::size_t)> on_joined_; // see `on_joined`
};

} // namespace zero
