#pragma once
/// \file
/// `engine_state<Backend, Comm, Allocator>`: what an engine holds and the read-only view of it — the
/// base of `basic_engine`, which adds the training protocol (docs/design.md).
///
/// It holds the policies and the three parts: the parameter residency (`replicated_params` at
/// stages 0-2, stage 3's `param_coordinator`, made at `finalize`), the gradient pipeline
/// (`bucket_reducer`, `grad_stats`) and the step plan of the optimizer state's placement
/// (`engine/step/step_plan.hpp`, made at `finalize`, with the update stream of `update_overlap`). Its
/// public part is the state view checkpoints read and restore through (`registered`, `owned_by`,
/// `stores`, `counters`, `restore`, `init_params`) besides the accessors a framework uses (`cfg`,
/// `layout`, `memory`, ...).

#include "zero/backend/backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/bucket_reducer.hpp"
#include "zero/engine/detail/node_groups.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/memory_report.hpp"
#include "zero/engine/offload_storage.hpp"
#include "zero/engine/parallel_config.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/residency.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/step_plan.hpp"
#include "zero/engine/step_log.hpp"
#include "zero/engine/update_overlap.hpp"
#include "zero/engine/update_rates.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zero {

/// An engine's state and its view; see the file comment. `Backend` runs the kernels
/// (`zero::backend`), `Comm` is the data-parallel group (`zero::communicator` with all_reduce;
/// all_gather for stages 1-3 and reduce_scatter for 2-3), `Allocator` (`zero::allocator`, default the
/// backend's) is where model state lives; its memory must be reachable by the backend's kernels.
/// `Storage` (`zero::storage`, default `posix_storage`) holds optimizer state offloaded to NVMe.
template <class Backend, class Comm, class Allocator = typename Backend::allocator_type, class Storage = posix_storage>
class engine_state {
  static_assert(check_backend<Backend>());
  static_assert(communicator<Comm>, "zero::basic_engine: Comm is not a zero::communicator (rank(), size(), name(), "
                                    "timeout(), set_timeout(ms)); see zero/comm/communicator.hpp");
  static_assert(allocator<Allocator>, "zero::basic_engine: Allocator is not a zero::allocator; see "
                                      "zero/memory/allocator.hpp and docs/allocators.md");
  static_assert(storage<Storage>, "zero::basic_engine: Storage is not a zero::storage; see "
                                  "zero/storage/storage.hpp and docs/storage.md");

public:
  using backend_type = Backend;
  using communicator_type = Comm;
  using allocator_type = Allocator;
  using counting_allocator_type = counting_allocator<Allocator>;
  using stream_type = typename Backend::stream_type;
  using storage_type = Storage;

  /// \param cfg     a resolved config; the batch rule is applied again for the communicator's size.
  /// \param comm    the data-parallel group (kept by reference). With HSDP (`mics_shard_size` below its
  ///                size) the engine splits it into shard groups and replica groups (a collective).
  /// \param backend the kernels (kept by reference).
  /// \param alloc   where model state lives (default: the backend's allocator).
  /// \throws config_error for settings this engine cannot honour, and for a stage the communicator
  /// cannot run (the sentence names the missing operation).
  engine_state(const config& cfg, Comm& comm, Backend& backend, Allocator alloc)
      : cfg_(cfg.rebatched(comm.size())), comm_(shard_group(comm)), backend_(backend), state_alloc_(alloc),
        buffer_alloc_(alloc), work_alloc_(alloc), stream_(backend.make_stream()),
        reg_(cfg_.param_dtype(), cfg_.optimizer ? cfg_.optimizer->lr : 1e-3,
             cfg_.optimizer ? cfg_.optimizer->weight_decay : 0.0,
             registry_persistence(cfg_.stage(), cfg_.zero_optimization.stage3_param_persistence_threshold)),
        scaler_(scaler_from_config(cfg_)), scheduler_(scheduler_from_config(cfg_)) {
    require_all_reduce<Comm>();
    if (const auto missing = missing_for_stage<Comm>(cfg_.stage()); !missing.empty()) {
      throw config_error("zero_optimization.stage: stage " + std::to_string(cfg_.stage()) +
                         " cannot run on this "
                         "communicator: " +
                         std::string(missing));
    }
    check_engine_config(cfg_, comm.size()); // the whole data group, before any HSDP split
    for (Comm* c : {&comm_, replicas_}) {
      if (c == nullptr) {
        continue;
      }
      if (cfg_.comm_timeout) {
        c->set_timeout(std::chrono::milliseconds(std::llround(*cfg_.comm_timeout * 1000.0)));
      }
      // A communicator with its own stream (NCCL's) orders each operation after the work enqueued on
      // the engine's stream so far: a gradient bucket is reduced after the kernels that wrote it.
      if constexpr (stream_ordered<Comm, stream_type>) {
        c->set_compute_stream(stream_.get());
      }
    }
  }
  /// The same, with the backend's allocator.
  engine_state(const config& cfg, Comm& comm,
               Backend& backend) requires std::same_as<Allocator, typename Backend::allocator_type>
      : engine_state(cfg, comm, backend, backend.get_allocator()) {}
  engine_state(const engine_state&) = delete;
  engine_state& operator=(const engine_state&) = delete;
  /// Waits for the work still in flight on the engine's buffers (the parts' destructors); never throws.
  ~engine_state() = default;

  /// Registers a module (the unit stage 3 gathers) and returns its id.
  int add_module(const std::string& name) { return check_open("add_module"), reg_.add_module(name); }
  /// Registers a parameter of `module` with shape `shape` in the config's dtype.
  /// \throws usage_error for a bad name, shape or module, or after finalize.
  param_handle add_param(int module, const std::string& name, const std::vector<std::int64_t>& shape,
                         const param_options& opt = {}) {
    check_open("add_param(\"" + name + "\")");
    return reg_.add_param(module, name, shape, opt);
  }

  /// Lays out and allocates everything: parameters, gradients and the rank's optimizer state. \throws usage_error
  /// when no trainable parameter was registered; memory_error when memory runs out (nothing allocated so far
  /// leaks); config_error for a model place the config refuses (`check_model_place`) or an hpZ size.
  void finalize() {
    check_open("finalize");
    detail::check_model_place(cfg_, model_group_ ? &model_at_ : nullptr, model_group_ ? model_group_->size() : 0);
    const auto& z = cfg_.zero_optimization;
    const int stage = cfg_.stage();
    const std::size_t esize = size_of(cfg_.param_dtype());
    // Stages 0-2: segments are reduce buckets. Stage 3: one segment per module, the unit gathered.
    reg_.finalize(registry_layout(stage, comm_.size(), z.reduce_bucket_size, cfg_.param_dtype()));
    const flat_layout& layout = reg_.layout();
    if (reg_.frozen_layout().param_count() > 0) {
      frozen_ =
          buffer<std::byte, counting>(state_alloc_, reg_.frozen_layout().total_size() * esize, memory_tag::params);
    }
    if (detail::make_offload_storage(storage_, cfg_,
                                     [&](const std::string& line) { log_.write(comm_.rank(), line); })) {
      agree_ = buffer<int, counting>(buffer_alloc_, 1, memory_tag::buffers);
    }
    residency_.make(cfg_, reg_, backend_, comm_, state_alloc_, buffer_alloc_, work_alloc_, stream_,
                    log_.sink_for(comm_.rank()), storage_ ? &*storage_ : nullptr);
    adamw_placement place{.rank = comm_.rank(),
                          .partitioned = stage >= 1,
                          .grad_type = cfg_.grad_accum_dtype,
                          .params_sharded = residency_([](auto& r) { return r.sharded_store; }),
                          .params_on_host = stage == 3 && z.offload_param.device == offload_device::cpu};
    if (auto* f = residency_.param_file()) {
      place.params_in_file = [f](param_use use, std::size_t k) { return f->params_for(use, k); };
    } else {
      place.params = residency_([](auto& r) { return r.store(); });
      place.params_from_master = place.params == nullptr; // stage 3 without a kept shard
    }
    // The step plan of the config's placement (docs/design.md, "Step plans"); it says what the reducer keeps.
    split_ = plan_.make(cfg_, reg_, place, backend_, state_alloc_, stream_, storage_ ? &*storage_ : nullptr,
                        offload_threads_ != 0 ? offload_threads_ : default_offload_threads(), offload_rates_);
    if constexpr (can_all_gather<Comm>) {
      if (float* master = plan_.derived_master()) {
        residency_.coordinator()->derive_from(master);
      }
    }
    auto reducing = reducer_options_from(cfg_, plan_.streams());
    if (plan_.streams()) {
      reducing.kept = plan_.kept();
    }
    reducer_.emplace(layout, backend_, comm_, state_alloc_, buffer_alloc_, std::move(reducing), stream_);
    use_quantized_nodes();
    if (replicas_ != nullptr) {
      reducer_->use_replicas(*replicas_);
    }
    stats_.emplace(plan_.ranges(), cfg_.grad_accum_dtype, stage >= 1, backend_, comm_, buffer_alloc_, stream_);
    stats_->set_model_group(model_group_, buffer_alloc_);
    if (auto replicated = reg_.tensor_replicated_extents();
        model_group_ != nullptr && model_at_.tensor != 0 && !replicated.empty()) {
      // Tensor rank 0 counts the replicated parameters; this rank leaves them out of the norm.
      std::vector<flat_range> extent;
      for (std::size_t k = 0; k < plan_.ranges().size(); ++k) {
        extent.push_back(stage >= 1 ? layout.segments()[k].range : flat_range{0, layout.total_size()});
      }
      stats_->count_only(norm_slots::without(plan_.ranges(), extent, std::move(replicated)), buffer_alloc_);
    }
    // Stages 1-2 on several ranks, stage 3, and a host step beside the next forward: the optimizer
    // steps on the update stream, beside the next forward.
    if (stage == 3 || (stage >= 1 && comm_.size() > 1) || plan_.steps_async()) {
      overlap_.emplace(backend_, comm_, stream_);
    }
    parts_ = {.cfg = &cfg_,
              .layout = &layout,
              .backend = &backend_,
              .comm = &comm_,
              .stream = &stream_,
              .reducer = &*reducer_,
              .stats = &*stats_,
              .params = &residency_,
              .overlap = overlap_ ? &*overlap_ : nullptr,
              .scheduler = &scheduler_,
              .counters = &counters_,
              .agree = &agree_};
    plan_.connect(parts_);
    finalized_ = true;
    begin_micro_step();
  }

  /// Initialises parameters: `fn` fills the elements this rank owns in fp32; the engine rounds them
  /// to the parameter dtype, keeps the fp32 values as the master copy, and all-gathers the rest.
  /// Frozen parameters are filled whole on every rank.
  void init_params(const init_fn& fn) {
    check_final("init_params");
    finish_for_reader(); // nothing of an earlier step may still write the parameters or the state
    const std::size_t esize = size_of(cfg_.param_dtype());
    std::byte* store = residency_([](auto& r) { return r.store(); });
    if (store == nullptr) {
      init_master(fn); // stage 3 keeps no 16-bit shard: the master is the parameters' only home
    } else {
      for (const auto& pc : owned_by(comm_.rank())) {
        fill(fn, reg_.layout().param(pc.id), pc.param_offset, pc.count, cfg_.param_dtype(), store + pc.store * esize);
      }
    }
    const auto& frozen = reg_.frozen_layout();
    for (std::size_t id = 0; id < frozen.param_count(); ++id) {
      const auto& p = frozen.param(id);
      fill(fn, p, 0, p.numel, p.type, frozen_.data() + p.offset * esize);
    }
    // The master copy takes the values the framework gave, rounded as the parameters are (or exact).
    plan_.load_master();
    if (plan_.has_master() && init_master_exact_ && store != nullptr) {
      std::vector<float> exact;
      for (const auto& pc : owned_by(comm_.rank())) {
        exact.resize(pc.count);
        fn(reg_.layout().param(pc.id), pc.param_offset, exact);
        plan_.write_state(state_tensor::master, pc.state, exact);
      }
    }
    residency_([](auto& r) { r.refresh(); });
  }
  /// With `true`, `init_params` keeps the fp32 values the init function gave as the master copy
  /// (DeepSpeed keeps the rounded 16-bit values, which is the default here too).
  void keep_exact_master(bool exact) noexcept { init_master_exact_ = exact; }

  /// Stage 3's gathering counters (null at stages 0-2).
  [[nodiscard]] const engine_coordinator<Backend, Comm, Allocator, Storage>*
  coordinator() const noexcept requires can_all_gather<Comm> {
    return residency_.coordinator();
  }

  /// The stream the engine's kernels run on. A framework computing on a device runs its forward and
  /// backward on it (or orders its own stream against it with events).
  [[nodiscard]] const stream_type& stream() const noexcept { return stream_; }
  /// The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise).
  [[nodiscard]] double loss_scale() const noexcept { return scaler_.scale(); }
  /// True when the current micro-step is the last of its accumulation.
  [[nodiscard]] bool is_boundary() const noexcept {
    return (counters_.micro_step + 1) % cfg_.gradient_accumulation_steps == 0;
  }

  /// Measures a phase for wall_clock_breakdown: `{ auto t = eng.time("forward"); ... }`.
  [[nodiscard]] auto time(std::string name) { return log_.time(std::move(name)); }
  /// The phases timed so far.
  [[nodiscard]] const step_timings& timings() const noexcept { return log_.timings(); }
  /// Where log lines go (wall_clock_breakdown, stage 3's trace changes); default: stdout on rank 0.
  void set_log(std::function<void(const std::string&)> sink) { log_.set_sink(std::move(sink)); }
  /// Bytes per tag from the counting allocator, beside the ZeRO formula.
  [[nodiscard]] memory_report memory() const {
    auto m = make_memory_report(cfg_.stage(), comm_.size(), reg_.layout(), cfg_.grad_accum_dtype, state_alloc_,
                                buffer_alloc_, work_alloc_);
    plan_.add_memory(m, split_);
    if constexpr (can_all_gather<Comm>) {
      const auto* c = residency_.coordinator();
      add_secondary(m, c != nullptr ? c->secondary_bytes() : 0, cfg_.zero_optimization.zero_hpz_partition_size);
      if (c != nullptr && c->params_from_master()) {
        drop_param_shard(m);
      } else if (c != nullptr && c->file() != nullptr) {
        add_nvme_params(m, c->file()->host_memory(), c->file()->file_bytes(), c->file()->resident_elements());
      } else if (c != nullptr && c->host_memory() != nullptr) {
        add_host_params(m, *c->host_memory(), plan_.host_param_share(m));
      }
    }
    return m;
  }

  /// The resolved config in force.
  [[nodiscard]] const config& cfg() const noexcept { return cfg_; }
  /// The flat layout of trainable parameters, and of frozen ones.
  [[nodiscard]] const flat_layout& layout() const noexcept { return reg_.layout(); }
  [[nodiscard]] const flat_layout& frozen_layout() const noexcept { return reg_.frozen_layout(); }
  /// Optimizer steps applied so far.
  [[nodiscard]] std::int64_t global_steps() const noexcept { return counters_.applied_steps; }
  /// Collectives the gradient reducer launched (tests count communication with it).
  [[nodiscard]] std::size_t reduce_launches() const noexcept { return reducer_ ? reducer_->launches() : 0; }
  /// The storage of NVMe offload (made at `finalize` when `offload_optimizer.device` or, at stage 3,
  /// `offload_param.device` is nvme). \throws usage_error without NVMe offload.
  [[nodiscard]] Storage& storage() {
    if (!storage_) {
      throw usage_error("storage(): this engine offloads nothing to NVMe (neither offload_optimizer.device nor "
                        "offload_param.device is \"nvme\", or finalize() was not called)");
    }
    return *storage_;
  }
  /// Threads of the host AdamW under `offload_optimizer.device: cpu` (0, the default: the host's
  /// hardware concurrency divided by the ranks of this communicator, at least 1). Before finalize.
  void set_offload_threads(unsigned threads) {
    check_open("set_offload_threads");
    offload_threads_ = threads;
  }
  /// In a model-parallel job, the ranks that hold the rest of this rank's model replica (its other
  /// pipeline stages or tensor slices; `topology::split(world, {"pipe", "tensor"})`), this
  /// communicator being the replica's data-parallel group, and where this rank sits (`at`): the
  /// clipping norm is the whole model's, summed over `group` too, and an fp16 overflow on any rank of
  /// it skips the step on every rank. A parameter counts on every rank of `group` that registers it,
  /// but one registered `tensor_replicated` only on tensor rank 0. Checkpoints go to
  /// `dir/pipe-PP-tensor-TT` and record `at` (docs/parallelism.md). Kept by reference; before finalize.
  /// \throws usage_error for coordinates outside their axes.
  void set_model_group(Comm& group, model_coords at = {}) {
    check_open("set_model_group");
    if (at.pipe < 0 || at.tensor_size < 1 || at.tensor < 0 || at.tensor >= at.tensor_size) {
      throw usage_error("set_model_group: pipe " + std::to_string(at.pipe) + ", tensor " + std::to_string(at.tensor) +
                        " of " + std::to_string(at.tensor_size) + "; expected pipe >= 0 and 0 <= tensor < tensor_size");
    }
    model_group_ = &group;
    model_at_ = at;
  }
  /// The update rates `offload_optimizer.ratio: "auto"` picks its ratio from at `finalize` instead of
  /// measuring them then (`measure_update_rates`); unused with any other ratio. Before finalize.
  /// \throws usage_error naming a rate that is not a finite number > 0 (device, host) or >= 0 (copies).
  void set_offload_rates(const update_rates& rates) {
    check_open("set_offload_rates");
    static_cast<void>(balanced_offload_ratio(rates, cfg_.param_dtype(), cfg_.grad_accum_dtype));
    offload_rates_ = rates;
  }
  /// How the optimizer state is split between the device and host memory (the ratio in force, the
  /// elements on each side and, for "auto", the rates it chose from). After finalize.
  [[nodiscard]] const offload_split& optimizer_split() const {
    check_final("optimizer_split");
    return split_;
  }
  /// The scaler and scheduler, for checkpoints and logs.
  [[nodiscard]] const loss_scaler& scaler() const noexcept { return scaler_; }
  [[nodiscard]] const lr_scheduler& scheduler() const noexcept { return scheduler_; }
  /// The handle of a parameter by name. \throws usage_error when there is none.
  [[nodiscard]] param_handle find(const std::string& name) const { return reg_.find(name); }

  // ---- the state view (what checkpoints read and restore; docs/design.md) ----
  [[nodiscard]] bool finalized() const noexcept { return finalized_; }
  /// Every registered parameter, in registration order.
  [[nodiscard]] std::vector<registered_param> registered() const { return reg_.registered(); }
  /// The pieces rank `rank` owns: its shard's (stages 1-3), or every parameter whole (stage 0).
  [[nodiscard]] std::vector<owned_piece> owned_by(int rank) const { return reg_.owned_by(rank, cfg_.stage()); }
  [[nodiscard]] step_counters counters() const noexcept { return counters_; }
  /// After the owned part of the parameter store (and the optimizer state) was rewritten from a
  /// checkpoint: takes its progress, makes the parameters whole again and reopens the micro-step.
  void restore(const step_counters& c, const std::optional<loss_scaler_state>& scaler,
               std::int64_t lr_last_batch_iteration) {
    check_final("restore");
    counters_ = c;
    if (scaler && scaler_.dynamic()) {
      scaler_.load_state(*scaler);
    }
    scheduler_.set_last_batch_iteration(lr_last_batch_iteration);
    residency_([](auto& r) { r.refresh(); });
    begin_micro_step();
  }
  [[nodiscard]] Comm& communicator() noexcept { return comm_; }
  [[nodiscard]] Backend& backend() noexcept { return backend_; }
  /// The allocator of the engine's buffers (memory_tag::buffers), for staging in backend memory.
  [[nodiscard]] counting_allocator_type buffer_allocator() const { return buffer_alloc_; }

protected:
  using counting = counting_allocator<Allocator>;

  /// The group the state is sharded over: `comm`, or with HSDP its shard group (`replicas_` the
  /// replica group). \throws config_error when the size does not divide `comm`'s or `Comm` cannot split.
  Comm& shard_group(Comm& comm) {
    if (!cfg_.zero_optimization.hsdp(comm.size())) {
      return comm;
    }
    check_engine_config(cfg_, comm.size()); // before the split, a collective
    const std::string key =
        "zero_optimization.mics_shard_size " + std::to_string(cfg_.zero_optimization.mics_shard_size);
    Comm& shard = hsdp_.node(comm, cfg_.zero_optimization.mics_shard_size, key);
    replicas_ = &hsdp_.cross(comm, cfg_.zero_optimization.mics_shard_size, key);
    return shard;
  }

  /// qgZ in two levels when its node size (`zero_quantized_gradients_node_size`, else hpZ's at stage
  /// 3) is above 1 and not the whole data group: the reducer reduces over the residency's node groups,
  /// hpZ's own when it has them. \throws config_error when the size does not divide the data group.
  void use_quantized_nodes() {
    const auto& z = cfg_.zero_optimization;
    const std::int64_t h = z.quantized_gradients_node_size();
    if (!z.zero_quantized_gradients || cfg_.stage() < 2 || h == 1 || h == comm_.size()) {
      return;
    }
    const std::string key =
        std::string("zero_optimization.") +
        (z.zero_quantized_gradients_node_size ? "zero_quantized_gradients_node_size " : "zero_hpz_partition_size ") +
        std::to_string(h);
    auto& nodes = residency_.nodes();
    Comm& node = nodes.node(comm_, h, key);
    reducer_->use_nodes(node, nodes.cross(comm_, h, key));
  }

  /// `init_params` without a parameter store: the master takes `fn`'s values of the owned pieces,
  /// rounded through the parameter dtype (as `load_master` would from the store) unless kept exact.
  void init_master(const init_fn& fn) {
    constexpr std::size_t chunk = std::size_t{1} << 20;
    std::vector<float> values;
    for (const auto& pc : owned_by(comm_.rank())) {
      for (std::size_t done = 0; done < pc.count; done += chunk) {
        values.resize(std::min(chunk, pc.count - done));
        fn(reg_.layout().param(pc.id), pc.param_offset + done, values);
        if (!init_master_exact_) {
          visit_float(cfg_.param_dtype(), [&]<class P>(type_tag<P>) {
            for (float& x : values) {
              x = to_float(from_float<P>(x));
            }
          });
        }
        plan_.write_state(state_tensor::master, pc.state + done, values);
      }
    }
  }

  /// Fills `count` elements of `p` from element `first` on with `fn`'s values, as `type`, into `dst`.
  void fill(const init_fn& fn, const param_info& p, std::size_t first, std::size_t count, dtype type, std::byte* dst) {
    visit_float(type, [&]<class P>(type_tag<P>) {
      fill_from_host<Allocator::host_accessible>(
          backend_, stream_, buffer_alloc_, count, reinterpret_cast<P*>(dst),
          [&](std::size_t done, std::span<float> out) { fn(p, first + done, out); });
    });
  }

  /// The host's threads shared among the ranks of this communicator (they may share the host).
  [[nodiscard]] unsigned default_offload_threads() const {
    return std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(comm_.size()));
  }

  void check_open(const std::string& what) const {
    if (finalized_) {
      throw usage_error(what + " after finalize(); register every module and parameter first");
    }
  }
  void check_final(const std::string& what) const {
    if (deferred_) {
      std::rethrow_exception(std::exchange(deferred_, nullptr)); // a scope's end failed in a destructor
    }
    if (!finalized_) {
      throw usage_error(what + " before finalize(); call finalize() after registering parameters");
    }
  }

  void begin_micro_step() {
    plan_.begin_micro_step(is_boundary(), unscale()); // first: a step that ended early keeps none of its updates
    reducer_->begin_micro_step(is_boundary());
    // Stage 3 keeps a gather trace per micro-step of the accumulation (a pipeline's 1F1B orders differ by position).
    residency_([&](auto& r) {
      r.begin_micro_step(static_cast<std::size_t>(counters_.micro_step % cfg_.gradient_accumulation_steps));
    });
  }

  /// What the reduced gradients are multiplied by before their check and the update: the inverse of
  /// the loss scale and of the accumulation, and the averaging group's correction.
  [[nodiscard]] double unscale() const noexcept {
    return average_ / (scaler_.scale() * static_cast<double>(cfg_.gradient_accumulation_steps));
  }
  /// `finish_gathers` for what reads or writes the parameters or the state outside a step: between
  /// backward and the step the host's updates during backward end first, dropped (stage 3's host
  /// shard, which they write in place, put back), and the step then runs as without them.
  void finish_for_reader() {
    plan_.end_early(false, 0.0);
    finish_gathers();
  }
  /// Waits for every posted all-gather, and orders the engine's stream after the last update.
  void finish_gathers() {
    residency_([](auto& r) { r.finish(); });
    join_update();
  }
  /// Waits for a host step running beside the forward (`forward_overlap`), and makes the engine's
  /// stream wait for the update stream's last step (without blocking the host), once.
  void join_update() {
    plan_.join();
    if (overlap_ && overlap_->join()) {
      residency_([](auto& r) { r.updates_joined(); });
      reducer_->release_retired();
    }
  }

  config cfg_;
  /// HSDP: the shard and replica groups split from the constructor's communicator.
  detail::node_groups<Comm> hsdp_;
  /// HSDP: the ranks holding this rank's shard in the other shard groups, or null.
  Comm* replicas_ = nullptr;
  /// The data-parallel group the model state is sharded over: the constructor's, or its shard group.
  Comm& comm_;
  Backend& backend_;
  counting state_alloc_;
  counting buffer_alloc_;
  counting work_alloc_;
  stream_type stream_;
  param_registry reg_;
  buffer<std::byte, counting> frozen_;
  /// Before the residency and the optimizer, which keep references to it: destroyed after their last I/O.
  std::optional<Storage> storage_;
  residency<Backend, Comm, Allocator, Storage> residency_;
  std::optional<bucket_reducer<Backend, Comm, Allocator>> reducer_;
  step_plan<Backend, Comm, Allocator, Storage> plan_;
  /// What the plan works with, set at finalize.
  step_parts<Backend, Comm, Allocator, Storage> parts_;
  std::optional<grad_stats<Backend, Comm, Allocator>> stats_;
  std::optional<update_overlap<Backend, Comm>> overlap_;
  /// One int in backend memory: the ranks agree on whether an NVMe step's I/O failed anywhere.
  buffer<int, counting> agree_;
  loss_scaler scaler_;
  lr_scheduler scheduler_;
  step_log log_;
  step_counters counters_;
  /// An error of a scope ended in a destructor, thrown by the next call (see `engine_scope`).
  mutable std::exception_ptr deferred_;
  unsigned offload_threads_ = 0;
  /// The rest of the model replica (`set_model_group`), or null.
  Comm* model_group_ = nullptr;
  /// The communicator's size over the ranks gradients average over (`set_gradient_average`).
  double average_ = 1.0;
  /// Where this rank sits in its model-parallel job (`set_model_group`).
  model_coords model_at_{};
  /// The rates of `set_offload_rates`, and the split made at finalize.
  std::optional<update_rates> offload_rates_;
  offload_split split_;
  bool finalized_ = false;
  bool init_master_exact_ = false;
};

} // namespace zero
