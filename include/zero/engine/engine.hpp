#pragma once
/// \file
/// `basic_engine<Backend, Communicator, Allocator>`: the front door. A framework registers its
/// parameters, finalizes, writes gradients into the views the engine gives it, and calls `step()`;
/// the engine shards optimizer state (stage 1), gradients (stage 2) and parameters (stage 3), following the config
/// exactly as DeepSpeed reads it.
///
/// One micro-step, from the framework's side:
///
///     for each micro-batch:
///       for each module, first to last:
///         auto on = eng.gather(module);                 // stage 3 all-gathers it (or finds it prefetched)
///         forward with eng.param(p)                     // scale the loss by eng.loss_scale() for fp16
///       for each module, last to first:
///         auto on = eng.gather(module);
///         accumulate each gradient into eng.grad(p)     // +=, as autograd does
///         eng.grad_ready(p)                             // a full bucket starts reducing now
///       auto r = eng.step();                            // steps the optimizer on the last micro-step
///
/// The same code runs at every stage; the stage is a config value. At stages 1-2 parameters are always
/// whole, but the all-gathers of the updated parameters that end a step are only posted there: `gather`
/// (and `param`) wait for the module's buckets, so those all-gathers run beside the next forward. Take
/// parameter pointers after `gather(m)` (or from `param(p)`) in each step, not from before `step()`.
///
/// The engine is a front door over its state (`engine_state.hpp`, plain members) and three parts
/// (docs/design.md): the parameter residency
/// (`replicated_params` at stages 0-2, stage 3's `param_coordinator`, chosen at `finalize`), the
/// gradient pipeline (`bucket_reducer`, `grad_stats`) and the step plan of the optimizer state's
/// placement (`engine/step/`: on the device, on the host, split between them, or on NVMe; chosen at
/// `finalize`). `step()` is one protocol for every placement: finish the reductions, the plan's check,
/// the loss scaler, the plan's update and the end of its writes (`engine_protocol.hpp`). `static_engine` fixes
/// the stage at compile time; `step_together` (step_together.hpp) steps engines that share a model.

#include "zero/core/error.hpp"
#include "zero/engine/engine_protocol.hpp"
#include "zero/engine/engine_state.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/step/custom_rule.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/engine/tensor_view.hpp"

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace zero {

/// The ZeRO engine over the policies `Backend` (kernels), `Comm` (the data-parallel group), `Allocator` (model
/// state; docs/allocators.md) and `Storage` (what is offloaded to NVMe); see the file comment.
template <class Backend, class Comm, class Allocator = typename Backend::allocator_type, class Storage = posix_storage>
class basic_engine {
public:
  using backend_type = Backend;
  using communicator_type = Comm;
  using allocator_type = Allocator;
  using counting_allocator_type = counting_allocator<Allocator>;
  using stream_type = typename Backend::stream_type;
  using storage_type = Storage;

  /// A resolved config (its batch rule applied again for the communicator's size), the data-parallel group
  /// (with HSDP, `mics_shard_size` below its size, split into shard and replica groups: a collective), the
  /// kernels (both kept by reference) and where model state lives. \throws config_error for settings this
  /// engine cannot honour, and for a stage the communicator cannot run (naming the missing operation).
  basic_engine(const config& cfg, Comm& comm, Backend& backend, Allocator alloc) : s_(cfg, comm, backend, alloc) {}
  /// The same, with the backend's allocator.
  basic_engine(const config& cfg, Comm& comm,
               Backend& backend) requires std::same_as<Allocator, typename Backend::allocator_type>
      : s_(cfg, comm, backend, backend.get_allocator()) {}

  /// Registers a module (the unit stage 3 gathers) and returns its id.
  int add_module(const std::string& name) { return detail::check_open(s_, "add_module"), s_.reg.add_module(name); }
  /// Registers a parameter of `module` with shape `shape` in the config's dtype.
  /// \throws usage_error for a bad name, shape or module, or after finalize.
  param_handle add_param(int module, const std::string& name, const std::vector<std::int64_t>& shape,
                         const param_options& opt = {}) {
    detail::check_open(s_, "add_param(\"" + name + "\")");
    return s_.reg.add_param(module, name, shape, opt);
  }
  /// Gives the engine the type of the framework's own update rule the config names (docs/optimizers.md, "A
  /// framework's own rule"): `Rule` has update_rules.hpp's members and `params`, and the config was read with
  /// `custom_optimizer::of<Rule>()` in `config_inputs::optimizers`. It runs wherever a built-in rule runs: on the
  /// engine's backend (whose `rule_step<Rule>` must be callable: on a GPU, a kernel instantiated from
  /// kernels/rules.cuh in a .cu of the framework's) and on the host with `offload_optimizer` cpu. Call it before
  /// `finalize`. \throws usage_error after finalize, or when the config's optimizer is not `Rule`.
  template <class Rule> void use_rule() {
    detail::check_open(s_, "use_rule");
    const auto& o = s_.cfg.optimizer;
    if (!o || o->type != optimizer_type::custom || o->custom != Rule::name) {
      throw usage_error("use_rule<" + std::string(Rule::name) + ">: the config's optimizer.type is " +
                        (o ? "\"" + optimizer_name(*o) + "\"" : std::string("missing")) +
                        "; expected the rule's name, read with custom_optimizer::of<Rule>() in "
                        "config_inputs::optimizers");
    }
    s_.custom_steps = {make_custom_rule_step<Backend, Rule>(),
                       make_custom_rule_step<host_backend_t<offload_allocator_t<Backend>>, Rule>()};
  }
  /// Lays out and allocates everything: parameters, gradients and the rank's optimizer state. \throws usage_error
  /// when no trainable parameter was registered; memory_error when memory runs out (nothing allocated so far
  /// leaks); config_error for a model place the config refuses (`check_model_place`) or an hpZ size.
  void finalize() {
    detail::check_open(s_, "finalize");
    s_.assemble();
    detail::begin_micro_step(s_);
  }
  /// Initialises parameters: `fn` fills the elements this rank owns in fp32; the engine rounds them
  /// to the parameter dtype, keeps the fp32 values as the master copy, and all-gathers the rest.
  /// Frozen parameters are filled whole.
  void init_params(const init_fn& fn) {
    detail::check_final(s_, "init_params");
    detail::init_params(s_, fn);
  }
  /// With `true`, `init_params` keeps the fp32 values the init function gave as the master copy
  /// (DeepSpeed keeps the rounded 16-bit values, which is the default here too).
  void keep_exact_master(bool exact) noexcept { s_.init_master_exact = exact; }

  // ---- settings before finalize ----
  /// Threads of the host AdamW under `offload_optimizer.device: cpu` (0, the default: the host's
  /// hardware concurrency divided by the ranks of this communicator, at least 1).
  void set_offload_threads(unsigned threads) {
    detail::check_open(s_, "set_offload_threads");
    s_.offload_threads = threads;
  }
  /// The update rates `offload_optimizer.ratio: "auto"` picks its ratio from at `finalize` instead of
  /// measuring them then (`measure_update_rates`); unused with any other ratio.
  /// \throws usage_error naming a rate that is not a finite number > 0 (device, host) or >= 0 (copies).
  void set_offload_rates(const update_rates& rates) {
    detail::check_open(s_, "set_offload_rates");
    static_cast<void>(balanced_offload_ratio(rates, s_.cfg.param_dtype(), s_.cfg.grad_accum_dtype));
    s_.offload_rates = rates;
  }
  /// In a model-parallel job, the ranks that hold the rest of this rank's model replica (its other
  /// pipeline stages or tensor slices; `topology::split(world, {"pipe", "tensor"})`), this
  /// communicator being the replica's data-parallel group, and where this rank sits (`at`): the
  /// clipping norm is the whole model's, summed over `group` too, and an fp16 overflow on any rank of
  /// it skips the step on every rank. A parameter counts on every rank of `group` that registers it,
  /// but one registered `tensor_replicated` only on tensor rank 0. Checkpoints go to
  /// `dir/pipe-PP-tensor-TT` and record `at` (docs/parallelism.md). Kept by reference.
  /// \throws usage_error for coordinates outside their axes.
  void set_model_group(Comm& group, model_coords at = {}) {
    detail::check_open(s_, "set_model_group");
    if (at.pipe < 0 || at.tensor_size < 1 || at.tensor < 0 || at.tensor >= at.tensor_size) {
      throw usage_error("set_model_group: pipe " + std::to_string(at.pipe) + ", tensor " + std::to_string(at.tensor) +
                        " of " + std::to_string(at.tensor_size) + "; expected pipe >= 0 and 0 <= tensor < tensor_size");
    }
    s_.model_group = &group;
    s_.model_at = at;
  }
  /// Averages the gradients over `ranks` ranks instead of this communicator's: an MoE layer's engine
  /// over the expert-data group averages over the whole data group, as its experts' gradients sum the
  /// tokens of `ranks / size()` data ranks (docs/parallelism.md).
  /// \throws usage_error unless `ranks` is a multiple of the communicator's size.
  void set_gradient_average(int ranks) {
    detail::check_open(s_, "set_gradient_average");
    const int data = s_.comm.size() * (s_.replicas != nullptr ? s_.replicas->size() : 1); // HSDP: both levels
    if (ranks < data || ranks % data != 0) {
      throw usage_error("set_gradient_average: " + std::to_string(ranks) +
                        " ranks; expected a multiple of this engine's " + std::to_string(data) +
                        " ranks (the data group's size)");
    }
    s_.average = static_cast<double>(data) / ranks;
  }
  /// Where log lines go (wall_clock_breakdown, stage 3's trace changes); default: stdout on rank 0.
  void set_log(std::function<void(const std::string&)> sink) { s_.log.set_sink(std::move(sink)); }

  // ---- a micro-step ----
  /// The parameter as the framework computes with it: whole, in the config's dtype. Ask again after
  /// every `step()` (or `gather` its module): at every stage the update runs on a stream of its own,
  /// and this is where the engine's stream is ordered after the update of the parameter's segment.
  [[nodiscard]] tensor_view param(param_handle h) const {
    detail::check_final(s_, "param");
    return detail::param_view(s_, h);
  }
  /// Where the framework accumulates (`+=`) the parameter's gradient in this micro-step, in the
  /// gradient dtype (`data_types.grad_accum_dtype`). Ask again in every micro-step: the memory may
  /// change (stage 2's staging buffers), and this is where the engine's stream is ordered after the
  /// last step's update, which zeroes the gradients on a stream of its own. \throws usage_error for
  /// a frozen parameter.
  [[nodiscard]] tensor_view grad(param_handle h) {
    const auto id = trainable(h, "grad").id;
    const auto& p = s_.reg.layout().param(id);
    detail::join_update(s_);
    return {s_.reducer->grad(id), s_.cfg.grad_accum_dtype, p.shape, p.numel};
  }
  /// Marks the parameter's gradient final for this micro-step; a complete bucket starts reducing.
  void grad_ready(param_handle h) {
    const auto id = trainable(h, "grad_ready").id;
    detail::join_update(s_);
    s_.reducer->ready(id);
  }

  /// The scope of `gather`, `gather_all` and `evaluation` (see `engine_scope`).
  using scope = engine_scope<basic_engine>;
  using gathered_module = scope;
  using gathered_all = scope;
  using evaluation_scope = scope;

  /// Gathers module `m`'s parameters (stage 3: all-gathered, or already prefetched; stages 1-2: waits
  /// for its step-end all-gathers) until the returned scope ends. Call before the module's forward and
  /// again before its backward. \throws usage_error for an unknown module; timeout_error naming the
  /// module when the other ranks do not gather it.
  [[nodiscard]] scope gather(int m) {
    detail::check_final(s_, "gather");
    s_.reg.check_module(m);
    s_.params([&](auto& r) {
      if constexpr (std::remove_cvref_t<decltype(r)>::sharded_store) {
        auto t = s_.log.time("gather"); // stage 3's all-gathers, or the wait for a prefetched one
        r.gather(m);
      } else {
        r.gather(m);
      }
    });
    return scope(this, scope_module, m);
  }
  /// Gives module `m` back (what the scope of `gather` does). \throws usage_error on a double release.
  void release(int m) {
    s_.reg.check_module(m);
    s_.params([&](auto& r) { r.release(m); });
  }
  /// A scope in which every parameter is whole (DeepSpeed's GatheredParameters). With
  /// `modifier_rank >= 0`, the values that rank holds when the scope ends are written back to every
  /// rank's shard and to the fp32 master copy; otherwise changes are discarded.
  [[nodiscard]] scope gather_all(int modifier_rank = -1) {
    detail::check_final(s_, "gather_all");
    detail::finish_for_reader(s_);
    if (modifier_rank >= s_.comm.size()) {
      throw usage_error("gather_all: modifier rank " + std::to_string(modifier_rank) + " is outside the group of " +
                        std::to_string(s_.comm.size()));
    }
    s_.params([](auto& r) { r.gather_everything(); });
    return scope(this, scope_all, modifier_rank);
  }
  /// A forward-only pass (evaluation) between training steps: stage 3 traces and prefetches it apart
  /// from training. At stage 3 every gather is a collective: with `eval_gather::per_module` (memory
  /// bounded as in training) every rank must run the same forwards in the scope; with
  /// `eval_gather::whole_model` the scope gathers the whole model once when it opens and ranks may run
  /// any number of batches. Stages 0-2 need neither: their gathers are local.
  /// \throws usage_error when a scope is already open; timeout_error when a rank does not open it.
  [[nodiscard]] scope evaluation(eval_gather mode = eval_gather::per_module) {
    detail::check_final(s_, "evaluation");
    detail::finish_for_reader(s_);
    s_.params([&](auto& r) { r.begin_eval(mode == eval_gather::whole_model); });
    return scope(this, scope_eval, 0);
  }

  /// Ends a micro-step. On the last micro-step of an accumulation: waits for the reductions, checks
  /// the gradients (`grad_stats`: unscale, inf/NaN, global norm), clips, runs AdamW on the rank's part,
  /// updates the loss scale, and lets the residency make the parameters whole again.
  /// \throws usage_error for parameters without a gradient (unless ignore_unused_parameters);
  /// loss_scale_error when fp16 overflows at the minimum loss scale.
  step_result step() {
    grad_check g;
    step_result r = detail::check_step(s_, g);
    return detail::finish_step(s_, r, g);
  }
  /// Steps engines that hold one rank's model between them as one optimizer (step_together.hpp).
  template <class... Engines>
  friend std::array<step_result, sizeof...(Engines)> step_together(Engines&... engines); // NOLINT

  // ---- what the engine is and holds ----
  /// The stream the engine's kernels run on. A framework computing on a device runs its forward and
  /// backward on it (or orders its own stream against it with events).
  [[nodiscard]] const stream_type& stream() const noexcept { return s_.stream; }
  /// The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise).
  [[nodiscard]] double loss_scale() const noexcept { return s_.scaler.scale(); }
  /// True when the current micro-step is the last of its accumulation.
  [[nodiscard]] bool is_boundary() const noexcept { return detail::is_boundary(s_); }
  /// Measures a phase for wall_clock_breakdown: `{ auto t = eng.time("forward"); ... }`.
  [[nodiscard]] auto time(std::string name) { return s_.log.time(std::move(name)); }
  /// The phases timed so far.
  [[nodiscard]] const step_timings& timings() const noexcept { return s_.log.timings(); }
  /// Bytes per tag from the counting allocator, beside the ZeRO formula.
  [[nodiscard]] memory_report memory() const { return detail::memory_of(s_); }
  /// The resolved config in force.
  [[nodiscard]] const config& cfg() const noexcept { return s_.cfg; }
  /// The flat layout of trainable parameters, and of frozen ones.
  [[nodiscard]] const flat_layout& layout() const noexcept { return s_.reg.layout(); }
  [[nodiscard]] const flat_layout& frozen_layout() const noexcept { return s_.reg.frozen_layout(); }
  /// The handle of a parameter by name. \throws usage_error when there is none.
  [[nodiscard]] param_handle find(const std::string& name) const { return s_.reg.find(name); }
  /// Optimizer steps applied so far.
  [[nodiscard]] std::int64_t global_steps() const noexcept { return s_.counters.applied_steps; }
  /// Collectives the gradient reducer launched (tests count communication with it).
  [[nodiscard]] std::size_t reduce_launches() const noexcept { return s_.reducer ? s_.reducer->launches() : 0; }
  /// The scaler and scheduler, for checkpoints and logs.
  [[nodiscard]] const loss_scaler& scaler() const noexcept { return s_.scaler; }
  [[nodiscard]] const lr_scheduler& scheduler() const noexcept { return s_.scheduler; }
  /// How the optimizer state is split between the device and host memory (the ratio in force, the
  /// elements on each side and, for "auto", the rates it chose from). After finalize.
  [[nodiscard]] const offload_split& optimizer_split() const {
    detail::check_final(s_, "optimizer_split");
    return s_.split;
  }
  /// Stage 3's gathering counters (null at stages 0-2).
  [[nodiscard]] const engine_coordinator<Backend, Comm, Allocator, Storage>*
  coordinator() const noexcept requires can_all_gather<Comm> {
    return s_.params.coordinator();
  }
  /// The storage of NVMe offload (made at `finalize` when `offload_optimizer.device` or, at stage 3,
  /// `offload_param.device` is nvme). \throws usage_error without NVMe offload.
  [[nodiscard]] Storage& storage() {
    if (!s_.nvme) {
      throw usage_error("storage(): this engine offloads nothing to NVMe (neither offload_optimizer.device nor "
                        "offload_param.device is \"nvme\", or finalize() was not called)");
    }
    return *s_.nvme;
  }
  [[nodiscard]] Comm& communicator() noexcept { return s_.comm; }
  [[nodiscard]] Backend& backend() noexcept { return s_.backend; }
  /// The allocator of the engine's buffers (memory_tag::buffers), for staging in backend memory.
  [[nodiscard]] counting_allocator_type buffer_allocator() const { return s_.buffer_alloc; }
  /// HSDP (`mics_shard_size`): the ranks holding this rank's shard in the other shard groups, one per
  /// group, in group order; null without HSDP. `communicator()` is then this rank's shard group.
  [[nodiscard]] Comm* replica_group() const noexcept { return s_.replicas; }
  /// The rest of this rank's model replica (`set_model_group`), or null.
  [[nodiscard]] Comm* model_group() const noexcept { return s_.model_group; }
  /// Where this rank sits in its model-parallel job, or null without `set_model_group`.
  [[nodiscard]] const model_coords* model_place() const noexcept {
    return s_.model_group != nullptr ? &s_.model_at : nullptr;
  }

  // ---- the state view (what checkpoints read and restore; docs/design.md) ----
  [[nodiscard]] bool finalized() const noexcept { return s_.finalized; }
  /// Every registered parameter, in registration order.
  [[nodiscard]] std::vector<registered_param> registered() const { return s_.reg.registered(); }
  /// The pieces rank `rank` owns: its shard's (stages 1-3), or every parameter whole (stage 0).
  [[nodiscard]] std::vector<owned_piece> owned_by(int rank) const { return s_.reg.owned_by(rank, s_.cfg.stage()); }
  [[nodiscard]] step_counters counters() const noexcept { return s_.counters; }
  /// This rank's optimizer (master weights, m, v over the owned ranges), on the backend or offloaded: the
  /// step plan of its placement, whose state view checkpoints read and write.
  [[nodiscard]] step_plan<Backend, Comm, Allocator, Storage>& optimizer() {
    detail::check_final(s_, "optimizer");
    detail::finish_for_reader(s_); // the state is read or written on the engine's stream, after the last update
    return s_.plan;
  }
  /// Where parameter values live, after every kernel and all-gather so far (a host wait).
  [[nodiscard]] param_stores stores() {
    detail::check_final(s_, "stores");
    return detail::stores(s_);
  }
  /// After the owned part of the parameter store (and the optimizer state) was rewritten from a
  /// checkpoint: takes its progress, makes the parameters whole again and reopens the micro-step.
  void restore(const step_counters& c, const std::optional<loss_scaler_state>& scaler,
               std::int64_t lr_last_batch_iteration) {
    detail::check_final(s_, "restore");
    detail::restore(s_, c, scaler, lr_last_batch_iteration);
  }

  // ---- checkpoints: defined in zero/checkpoint/ (include zero/checkpoint/checkpoint.hpp, and
  // zero/checkpoint/safetensors.hpp for the safetensors pair; link zero::checkpoint) ----
  /// Saves checkpoint `tag` into `dir` atomically, every rank its own shard; collective. Call between
  /// optimizer steps. `options`: an optional `checkpoint::save_options` (an observer of each step).
  /// \throws usage_error for a bad tag or a call inside an accumulation; io_error naming the file.
  template <class... Options>
  void save(const std::filesystem::path& dir, const std::string& tag, const Options&... options) {
    checkpoint_save(*this, dir, tag, options...);
  }
  /// Loads checkpoint `tag` of `dir` ("latest": what `dir/latest` names), saved at any world size
  /// and stage; collective. \throws checkpoint_error naming the file and what was expected; the
  /// engine is unchanged then.
  void load(const std::filesystem::path& dir, const std::string& tag = "latest") { checkpoint_load(*this, dir, tag); }
  /// Writes the consolidated parameters (fp32 master values, or rounded to `type`) to one safetensors
  /// file under the registered names, streamed through rank 0; collective.
  void export_safetensors(const std::filesystem::path& path, dtype type = dtype::f32) {
    checkpoint_export_safetensors(*this, path, type);
  }
  /// DeepSpeed's save_16bit_model: the whole model in the parameters' own dtype, as the safetensors file
  /// `dir / filename`, written by rank 0; collective. At stage 3 only with
  /// stage3_gather_16bit_weights_on_model_save. \returns true when the file was written.
  [[nodiscard]] bool save_16bit_model(const std::filesystem::path& dir,
                                      const std::string& filename = "model.safetensors") {
    return checkpoint_save_16bit_model(*this, dir, filename);
  }
  /// Initialises every parameter from a safetensors file with the registered names and shapes
  /// (through `init_params`). \throws checkpoint_error naming a missing or misshapen tensor.
  void init_from_safetensors(const std::filesystem::path& path) { checkpoint_init_from_safetensors(*this, path); }

private:
  friend scope;
  static constexpr int scope_module = 0, scope_all = 1, scope_eval = 2;
  detail::engine_state<Backend, Comm, Allocator, Storage> s_;

  void end_scope(int kind, int arg) {
    if (kind == scope_module) {
      release(arg);
    } else if (kind == scope_eval) {
      s_.params([](auto& r) { r.end_eval(); });
    } else {
      s_.params([&](auto& r) { r.release_everything(arg); });
      if (arg >= 0) {
        s_.plan.load_master();
      }
    }
  }
  /// A scope ended in a destructor failed: its error is thrown by the next call.
  void defer(std::exception_ptr e) noexcept { s_.deferred = std::move(e); }

  const param_registry::entry& trainable(param_handle h, const char* what) const {
    detail::check_final(s_, what);
    const auto& e = s_.reg.at(h, what);
    if (!e.trainable) {
      throw usage_error(std::string(what) + "(\"" + s_.reg.info(e).name +
                        "\"): the parameter is frozen and has no gradient");
    }
    return e;
  }
};

/// The engine with the backend's allocator and POSIX storage: `zero::engine<zero::cpu_backend,
/// zero::thread_communicator>`.
template <class Backend, class Comm> using engine = basic_engine<Backend, Comm>;

} // namespace zero

#include "zero/engine/step_together.hpp" // IWYU pragma: export
