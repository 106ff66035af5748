#pragma once
/// \file
/// `detail::engine_state<Backend, Comm, Allocator, Storage>`: what an engine holds, as plain members
/// (docs/design.md, "The engine"). `basic_engine` holds one and runs the training protocol over it
/// (`engine_protocol.hpp`); nothing else reads it.
///
/// It holds the policies and the three parts: the parameter residency (`replicated_params` at stages
/// 0-2, stage 3's `param_coordinator`), the gradient pipeline (`bucket_reducer`, `grad_stats`) and the
/// step plan of the optimizer state's placement (`engine/step/step_plan.hpp`, with the update stream of
/// `update_overlap`). The constructor checks the config against the communicator and splits HSDP's
/// groups; `assemble` (the engine's `finalize`) lays the parameters out and makes the parts.

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/detail/node_groups.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/gradients/bucket_reducer.hpp"
#include "zero/engine/gradients/norm_slots.hpp"
#include "zero/engine/offload_storage.hpp"
#include "zero/engine/parallel_config.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/residency/residency.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/step_parts.hpp"
#include "zero/engine/step/step_plan.hpp"
#include "zero/engine/step/update_overlap.hpp"
#include "zero/engine/step/update_rates.hpp"
#include "zero/engine/step_log.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <any>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace zero::detail {

/// An engine's state; see the file comment. `Backend` runs the kernels (`zero::backend`), `Comm` is
/// the data-parallel group (`zero::communicator` with all_reduce; all_gather for stages 1-3 and
/// reduce_scatter for 2-3), `Allocator` (`zero::allocator`) is where model state lives; its memory
/// must be reachable by the backend's kernels. `Storage` (`zero::storage`) holds what is offloaded to NVMe.
template <class Backend, class Comm, class Allocator = typename Backend::allocator_type, class Storage = posix_storage>
struct engine_state {
  static_assert(check_backend<Backend>());
  static_assert(communicator<Comm>, "zero::basic_engine: Comm is not a zero::communicator (rank(), size(), name(), "
                                    "timeout(), set_timeout(ms)); see zero/comm/communicator.hpp");
  static_assert(allocator<Allocator>, "zero::basic_engine: Allocator is not a zero::allocator; see "
                                      "zero/memory/allocator.hpp and docs/allocators.md");
  static_assert(zero::storage<Storage>, "zero::basic_engine: Storage is not a zero::storage; see "
                                        "zero/storage/storage.hpp and docs/storage.md");
  using comm_type = Comm;
  using allocator_type = Allocator;
  using counting = counting_allocator<Allocator>;
  using stream_type = typename Backend::stream_type;

  /// The config rebatched for the communicator's size and checked against it (\throws config_error naming
  /// a setting the engine cannot honour, or a stage the communicator cannot run); with HSDP the
  /// communicator split into shard and replica groups (a collective).
  engine_state(const config& c, Comm& data, Backend& b, Allocator alloc)
      : cfg(c.rebatched(data.size())), comm(shard_group(data)), backend(b), state_alloc(alloc), buffer_alloc(alloc),
        work_alloc(alloc), stream(b.make_stream()),
        reg(cfg.param_dtype(), cfg.optimizer ? cfg.optimizer->lr : 1e-3,
            cfg.optimizer ? cfg.optimizer->weight_decay : 0.0,
            registry_persistence(cfg.stage(), cfg.zero_optimization.stage3_param_persistence_threshold)),
        scaler(scaler_from_config(cfg)), scheduler(scheduler_from_config(cfg)) {
    require_all_reduce<Comm>();
    if (const auto missing = missing_for_stage<Comm>(cfg.stage()); !missing.empty()) {
      throw config_error("zero_optimization.stage: stage " + std::to_string(cfg.stage()) +
                         " cannot run on this communicator: " + std::string(missing));
    }
    check_engine_config(cfg, data.size()); // the whole data group, before any HSDP split
    for (Comm* g : {&comm, replicas}) {
      if (g == nullptr) {
        continue;
      }
      if (cfg.comm_timeout) {
        g->set_timeout(std::chrono::milliseconds(std::llround(*cfg.comm_timeout * 1000.0)));
      }
      // A communicator with its own stream (NCCL's) orders each operation after the work enqueued on
      // the engine's stream so far: a gradient bucket is reduced after the kernels that wrote it.
      if constexpr (stream_ordered<Comm, stream_type>) {
        g->set_compute_stream(stream.get());
      }
    }
  }
  engine_state(const engine_state&) = delete;
  engine_state& operator=(const engine_state&) = delete;

  /// Lays out and allocates everything: parameters, gradients and the rank's optimizer state, the parts
  /// made and the step plan connected to them. \throws usage_error when no trainable parameter was
  /// registered; memory_error when memory runs out (nothing allocated so far leaks); config_error for a
  /// model place the config refuses (`check_model_place`) or an hpZ size.
  void assemble() {
    check_model_place(cfg, model_group ? &model_at : nullptr, model_group ? model_group->size() : 0);
    const auto& z = cfg.zero_optimization;
    const int stage = cfg.stage();
    const std::size_t esize = size_of(cfg.param_dtype());
    // Stages 0-2: segments are reduce buckets. Stage 3: one segment per module, the unit gathered.
    reg.finalize(registry_layout(stage, comm.size(), z.reduce_bucket_size, cfg.param_dtype()));
    const flat_layout& layout = reg.layout();
    if (reg.frozen_layout().param_count() > 0) {
      frozen = buffer<std::byte, counting>(state_alloc, reg.frozen_layout().total_size() * esize, memory_tag::params);
    }
    if (make_offload_storage(nvme, cfg, [&](const std::string& line) { log.write(comm.rank(), line); })) {
      agree = buffer<int, counting>(buffer_alloc, 1, memory_tag::buffers);
    }
    if (!Allocator::host_accessible && cfg.optimizer && cfg.optimizer->type == optimizer_type::lamb &&
        z.offload_optimizer.device != offload_device::none && comm.size() > 1) {
      // LAMB's sums of the host's step, staged in device memory for the all-reduce (step_parts::sum_over_ranks;
      // where the backend's memory is the host's they are all-reduced where they are).
      trust_sums = buffer<double, counting>(buffer_alloc, 2 * layout.param_count(), memory_tag::buffers);
    }
    params.make(cfg, reg, backend, comm, state_alloc, buffer_alloc, work_alloc, stream, log.sink_for(comm.rank()),
                nvme ? &*nvme : nullptr);
    adamw_placement place{.rank = comm.rank(),
                          .partitioned = stage >= 1,
                          .grad_type = cfg.grad_accum_dtype,
                          .params_sharded = params([](auto& r) { return r.sharded_store; }),
                          .params_on_host = stage == 3 && z.offload_param.device == offload_device::cpu};
    if (cfg.optimizer) { // the update rule and its state (check_engine_config refuses a missing optimizer)
      place.rule = rule_of(cfg.optimizer->type);
      place.state_tensors = rule_state_of(*cfg.optimizer).first;
      place.state_init = static_cast<float>(cfg.optimizer->initial_accumulator_value);
      if (place.rule == update_rule::custom && custom_steps.empty()) {
        throw usage_error("finalize: optimizer.type \"" + cfg.optimizer->custom +
                          "\" is a framework's own rule; call use_rule<Rule>() with its type before finalize");
      }
      place.custom_steps = custom_steps;
    }
    if (auto* f = params.param_file()) {
      place.params_in_file = [f](param_use use, std::size_t k) { return f->params_for(use, k); };
    } else {
      place.params = params([](auto& r) { return r.store(); });
      place.params_from_master = place.params == nullptr; // stage 3 without a kept shard
    }
    // The step plan of the config's placement (docs/design.md, "Step plans"); it says what the reducer keeps.
    const unsigned threads =
        offload_threads != 0 ? offload_threads // the host's threads shared among the ranks that may share it
                             : std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(comm.size()));
    split = plan.make(cfg, reg, place, backend, state_alloc, stream, nvme ? &*nvme : nullptr, threads, offload_rates);
    if constexpr (can_all_gather<Comm>) {
      if (float* master = plan.derived_master()) {
        params.coordinator()->derive_from(master);
      }
    }
    auto reducing = reducer_options_from(cfg, plan.streams());
    if (plan.streams()) {
      reducing.kept = plan.kept();
    }
    reducer.emplace(layout, backend, comm, state_alloc, buffer_alloc, std::move(reducing), stream);
    use_quantized_nodes();
    if (replicas != nullptr) {
      reducer->use_replicas(*replicas);
    }
    stats.emplace(plan.ranges(), cfg.grad_accum_dtype, stage >= 1, backend, comm, buffer_alloc, stream);
    stats->set_model_group(model_group, buffer_alloc);
    if (auto replicated = reg.tensor_replicated_extents();
        model_group != nullptr && model_at.tensor != 0 && !replicated.empty()) {
      // Tensor rank 0 counts the replicated parameters; this rank leaves them out of the norm.
      std::vector<flat_range> extent;
      for (std::size_t k = 0; k < plan.ranges().size(); ++k) {
        extent.push_back(stage >= 1 ? layout.segments()[k].range : flat_range{0, layout.total_size()});
      }
      stats->count_only(norm_slots::without(plan.ranges(), extent, std::move(replicated)), buffer_alloc);
    }
    // Every stage: the optimizer steps on the update stream, segment by segment, beside the next
    // forward, which waits per module for the segments it reads (stages 1-2 on several ranks: for their
    // all-gathers; stage 0 and one rank: for their updates). Stepping everything on the engine's stream
    // instead left the GPU's whole update between backward and the next forward (the GPT d48: 28 ms).
    overlap.emplace(backend, comm, stream);
    parts = {.cfg = &cfg,
             .layout = &layout,
             .backend = &backend,
             .comm = &comm,
             .stream = &stream,
             .reducer = &*reducer,
             .stats = &*stats,
             .params = &params,
             .overlap = overlap ? &*overlap : nullptr,
             .scheduler = &scheduler,
             .counters = &counters,
             .agree = &agree,
             .trust_sums = trust_sums.size() > 0 ? &trust_sums : nullptr};
    plan.connect(parts);
    finalized = true;
  }

  config cfg;
  /// HSDP: the shard and replica groups split from the constructor's communicator.
  node_groups<Comm> hsdp;
  /// HSDP: the ranks holding this rank's shard in the other shard groups, or null.
  Comm* replicas = nullptr;
  /// The data-parallel group the model state is sharded over: the constructor's, or its shard group.
  Comm& comm;
  Backend& backend;
  counting state_alloc;
  counting buffer_alloc;
  counting work_alloc;
  stream_type stream;
  param_registry reg;
  buffer<std::byte, counting> frozen;
  /// NVMe's storage. Before the residency and the optimizer, which keep references to it: destroyed after
  /// their last I/O.
  std::optional<Storage> nvme;
  /// The parameters' residency (made at assemble).
  residency<Backend, Comm, Allocator, Storage> params;
  std::optional<bucket_reducer<Backend, Comm, Allocator>> reducer;
  step_plan<Backend, Comm, Allocator, Storage> plan;
  /// What the plan works with, set at assemble.
  step_parts<Backend, Comm, Allocator, Storage> parts;
  std::optional<grad_stats<Backend, Comm, Allocator>> stats;
  std::optional<update_overlap<Backend, Comm>> overlap;
  /// One int in backend memory: the ranks agree on whether an NVMe step's I/O failed anywhere.
  buffer<int, counting> agree;
  /// LAMB's sums per parameter in backend memory, where its host step all-reduces them (step_parts::trust_sums).
  buffer<double, counting> trust_sums;
  loss_scaler scaler;
  lr_scheduler scheduler;
  step_log log;
  step_counters counters;
  /// An error of a scope ended in a destructor, thrown by the next call (see `engine_scope`).
  mutable std::exception_ptr deferred;
  /// An io_error of a step that was applied anyway, thrown when `step()` has ended (the plan's `end_writes`).
  std::exception_ptr applied_error;
  /// Threads of the host's AdamW (`set_offload_threads`; 0: the host's, shared among the ranks).
  unsigned offload_threads = 0;
  /// The rest of the model replica (`set_model_group`), or null.
  Comm* model_group = nullptr;
  /// The communicator's size over the ranks gradients average over (`set_gradient_average`).
  double average = 1.0;
  /// Where this rank sits in its model-parallel job (`set_model_group`).
  model_coords model_at{};
  /// The rates of `set_offload_rates`, and the split made at assemble.
  std::optional<update_rates> offload_rates;
  offload_split split;
  bool finalized = false;
  /// The framework's own rule's steps (`use_rule`), or none.
  std::vector<std::any> custom_steps;
  bool init_master_exact = false;

private:
  /// The group the state is sharded over: `data`, or with HSDP its shard group (`replicas` the
  /// replica group). \throws config_error when the size does not divide `data`'s or `Comm` cannot split.
  Comm& shard_group(Comm& data) {
    if (!cfg.zero_optimization.hsdp(data.size())) {
      return data;
    }
    check_engine_config(cfg, data.size()); // before the split, a collective
    const std::string key =
        "zero_optimization.mics_shard_size " + std::to_string(cfg.zero_optimization.mics_shard_size);
    Comm& shard = hsdp.node(data, cfg.zero_optimization.mics_shard_size, key);
    replicas = &hsdp.cross(data, cfg.zero_optimization.mics_shard_size, key);
    return shard;
  }

  /// qgZ in two levels when its node size (`zero_quantized_gradients_node_size`, else hpZ's at stage
  /// 3) is above 1 and not the whole data group: the reducer reduces over the residency's node groups,
  /// hpZ's own when it has them. \throws config_error when the size does not divide the data group.
  void use_quantized_nodes() {
    const auto& z = cfg.zero_optimization;
    const std::int64_t h = z.quantized_gradients_node_size();
    if (!z.zero_quantized_gradients || cfg.stage() < 2 || h == 1 || h == comm.size()) {
      return;
    }
    const std::string key =
        std::string("zero_optimization.") +
        (z.zero_quantized_gradients_node_size ? "zero_quantized_gradients_node_size " : "zero_hpz_partition_size ") +
        std::to_string(h);
    auto& nodes = params.nodes();
    Comm& node = nodes.node(comm, h, key);
    reducer->use_nodes(node, nodes.cross(comm, h, key));
  }
};

} // namespace zero::detail
