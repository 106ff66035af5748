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
/// The engine is a front door over three parts (docs/design.md): the parameter residency
/// (`replicated_params` at stages 0-2, stage 3's `param_coordinator`, chosen at `finalize`), the
/// gradient pipeline (`bucket_reducer`, `grad_stats`) and the step plan of the optimizer state's
/// placement (`engine/step/`: on the device, on the host, split between them, or on NVMe; chosen at
/// `finalize`). `step()` is one protocol for every placement: finish the reductions, the plan's check,
/// the loss scaler, the plan's update and the end of its writes. `static_engine` fixes the stage at
/// compile time; `step_together` (step_together.hpp) steps engines that share a model.

#include "zero/core/error.hpp"
#include "zero/engine/engine_state.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/tensor_view.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string>
#include <type_traits>

namespace zero {

/// The ZeRO engine; see the file comment and `engine_state` (its policies and state view).
/// docs/allocators.md shows an engine over an arena allocator.
template <class Backend, class Comm, class Allocator = typename Backend::allocator_type, class Storage = posix_storage>
class basic_engine : public engine_state<Backend, Comm, Allocator, Storage> {
  using base = engine_state<Backend, Comm, Allocator, Storage>;
  using base::average_, base::replicas_, base::backend_, base::buffer_alloc_, base::cfg_, base::comm_, base::counters_,
      base::deferred_, base::frozen_, base::log_, base::model_at_, base::model_group_, base::overlap_, base::parts_,
      base::plan_, base::reducer_, base::reg_, base::residency_, base::scaler_, base::scheduler_, base::stream_;
  using base::begin_micro_step, base::check_final, base::check_open, base::finish_for_reader, base::finish_gathers,
      base::join_update;
  using typename base::stream_type;

public:
  /// See `engine_state`'s constructors: a config, the communicator, the backend, and optionally the
  /// allocator of model state. \throws config_error for settings the engine cannot honour.
  using base::base;
  using base::is_boundary, base::owned_by;

  /// Averages the gradients over `ranks` ranks instead of this communicator's: an MoE layer's engine
  /// over the expert-data group averages over the whole data group, as its experts' gradients sum the
  /// tokens of `ranks / size()` data ranks (docs/parallelism.md). Before finalize.
  /// \throws usage_error unless `ranks` is a multiple of the communicator's size.
  void set_gradient_average(int ranks) {
    check_open("set_gradient_average");
    const int data = comm_.size() * (replicas_ != nullptr ? replicas_->size() : 1); // HSDP: both levels
    if (ranks < data || ranks % data != 0) {
      throw usage_error("set_gradient_average: " + std::to_string(ranks) +
                        " ranks; expected a multiple of this engine's " + std::to_string(data) +
                        " ranks (the data group's size)");
    }
    average_ = static_cast<double>(data) / ranks;
  }

  /// HSDP (`mics_shard_size`): the ranks holding this rank's shard in the other shard groups, one per
  /// group, in group order; null without HSDP. `communicator()` is then this rank's shard group.
  [[nodiscard]] Comm* replica_group() const noexcept { return replicas_; }
  /// The rest of this rank's model replica (`set_model_group`), or null.
  [[nodiscard]] Comm* model_group() const noexcept { return model_group_; }
  /// Where this rank sits in its model-parallel job, or null without `set_model_group`.
  [[nodiscard]] const model_coords* model_place() const noexcept {
    return model_group_ != nullptr ? &model_at_ : nullptr;
  }

  /// The parameter as the framework computes with it: whole, in the config's dtype.
  [[nodiscard]] tensor_view param(param_handle h) const {
    check_final("param");
    const auto& e = reg_.at(h, "param");
    const auto& p = reg_.info(e);
    const std::size_t esize = size_of(p.type);
    if (!e.trainable) {
      // A const engine still hands out writable views: frameworks write parameters through them.
      return {const_cast<std::byte*>(frozen_.data()) + p.offset * esize, p.type, p.shape, p.numel};
    }
    const auto& seg = reg_.layout().segments()[p.segment];
    std::byte* whole = residency_([&](const auto& r) {
      return r.full(p.segment, r.sharded_store ? "parameter \"" + p.name + "\" of module \"" +
                                                     reg_.module_names()[static_cast<std::size_t>(e.module)] + "\""
                                               : std::string());
    });
    return {whole + (p.offset - seg.range.begin) * esize, p.type, p.shape, p.numel};
  }

  /// Where the framework accumulates (`+=`) the parameter's gradient in this micro-step, in the
  /// gradient dtype (`data_types.grad_accum_dtype`). Ask again in every micro-step: the memory may
  /// change (stage 2's staging buffers), and this is where the engine's stream is ordered after the
  /// last step's update, which zeroes the gradients on a stream of its own. \throws usage_error for
  /// a frozen parameter.
  [[nodiscard]] tensor_view grad(param_handle h) {
    const auto id = trainable(h, "grad").id;
    const auto& p = reg_.layout().param(id);
    join_update();
    return {reducer_->grad(id), cfg_.grad_accum_dtype, p.shape, p.numel};
  }
  /// Marks the parameter's gradient final for this micro-step; a complete bucket starts reducing.
  void grad_ready(param_handle h) {
    const auto id = trainable(h, "grad_ready").id;
    join_update();
    reducer_->ready(id);
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
    check_final("gather");
    reg_.check_module(m);
    residency_([&](auto& r) {
      if constexpr (std::remove_cvref_t<decltype(r)>::sharded_store) {
        auto t = this->log_.time("gather"); // stage 3's all-gathers, or the wait for a prefetched one
        r.gather(m);
      } else {
        r.gather(m);
      }
    });
    return scope(this, scope_module, m);
  }
  /// Gives module `m` back (what the scope of `gather` does). \throws usage_error on a double release.
  void release(int m) {
    reg_.check_module(m);
    residency_([&](auto& r) { r.release(m); });
  }

  /// A scope in which every parameter is whole (DeepSpeed's GatheredParameters). With
  /// `modifier_rank >= 0`, the values that rank holds when the scope ends are written back to every
  /// rank's shard and to the fp32 master copy; otherwise changes are discarded.
  [[nodiscard]] scope gather_all(int modifier_rank = -1) {
    check_final("gather_all");
    finish_for_reader();
    if (modifier_rank >= comm_.size()) {
      throw usage_error("gather_all: modifier rank " + std::to_string(modifier_rank) + " is outside the group of " +
                        std::to_string(comm_.size()));
    }
    residency_([](auto& r) { r.gather_everything(); });
    return scope(this, scope_all, modifier_rank);
  }

  /// This rank's optimizer (master weights, m, v over the owned ranges), on the backend or offloaded: the
  /// step plan of its placement, whose state view checkpoints read and write.
  [[nodiscard]] step_plan<Backend, Comm, Allocator, Storage>& optimizer() {
    check_final("optimizer");
    finish_for_reader(); // the state is read or written on the engine's stream, after the last update
    return plan_;
  }
  /// Where parameter values live, after every kernel and all-gather so far (a host wait).
  [[nodiscard]] param_stores stores() {
    check_final("stores");
    finish_for_reader();
    backend_.synchronize(stream_);
    const auto& f = reg_.frozen_layout();
    return {residency_([](auto& r) { return r.store(); }), residency_([](auto& r) { return r.store_elements(); }),
            frozen_.data(), f.param_count() > 0 ? f.total_size() * size_of(f.type()) : 0};
  }
  /// A forward-only pass (evaluation) between training steps: stage 3 traces and prefetches it apart
  /// from training. At stage 3 every gather is a collective: with `eval_gather::per_module` (memory
  /// bounded as in training) every rank must run the same forwards in the scope; with
  /// `eval_gather::whole_model` the scope gathers the whole model once when it opens and ranks may run
  /// any number of batches. Stages 0-2 need neither: their gathers are local.
  /// \throws usage_error when a scope is already open; timeout_error when a rank does not open it.
  [[nodiscard]] scope evaluation(eval_gather mode = eval_gather::per_module) {
    check_final("evaluation");
    finish_for_reader();
    residency_([&](auto& r) { r.begin_eval(mode == eval_gather::whole_model); });
    return scope(this, scope_eval, 0);
  }

  /// Ends a micro-step. On the last micro-step of an accumulation: waits for the reductions, checks
  /// the gradients (`grad_stats`: unscale, inf/NaN, global norm), clips, runs AdamW on the rank's part,
  /// updates the loss scale, and lets the residency make the parameters whole again.
  /// \throws usage_error for parameters without a gradient (unless ignore_unused_parameters);
  /// loss_scale_error when fp16 overflows at the minimum loss scale.
  step_result step() {
    grad_check g;
    step_result r = check_step(g);
    return finish_step(r, g);
  }

  /// Steps engines that hold one rank's model between them as one optimizer (defined below).
  template <class... Engines>
  friend std::array<step_result, sizeof...(Engines)> step_together(Engines&... engines); // NOLINT

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
  /// An io_error of a step that was applied anyway, thrown when `step()` has ended (the plan's `end_writes`).
  std::exception_ptr applied_error_;
  static constexpr int scope_module = 0, scope_all = 1, scope_eval = 2;

  void end_scope(int kind, int arg) {
    if (kind == scope_module) {
      release(arg);
    } else if (kind == scope_eval) {
      residency_([](auto& r) { r.end_eval(); });
    } else {
      residency_([&](auto& r) { r.release_everything(arg); });
      if (arg >= 0) {
        plan_.load_master();
      }
    }
  }

  const param_registry::entry& trainable(param_handle h, const char* what) const {
    check_final(what);
    const auto& e = reg_.at(h, what);
    if (!e.trainable) {
      throw usage_error(std::string(what) + "(\"" + reg_.info(e).name +
                        "\"): the parameter is frozen and has no gradient");
    }
    return e;
  }
  /// `step()` up to the gradients' check: the reductions finished and, on the last micro-step of an
  /// accumulation, `g` their check (this engine's parameters only). \returns the step's result so far.
  step_result check_step(grad_check& g) {
    check_final("step");
    finish_gathers(); // the optimizer rewrites the parameters the last step's all-gathers wrote
    step_result r{.boundary = is_boundary(), .loss_scale = scaler_.scale(), .step = counters_.applied_steps};
    {
      auto t = log_.time("reduce");
      reducer_->finish(cfg_.zero_optimization.ignore_unused_parameters);
      plan_.landed();
    }
    check_reads();
    ++counters_.micro_step;
    if (r.boundary) {
      auto t = log_.time("step");
      g = plan_.check(this->unscale());
    }
    return r;
  }
  /// The rest of `step()`: the loss scale, the clip of norm `g.norm`, AdamW and the parameters made
  /// whole again, `g` being this engine's check (`step`) or that of the engines stepped together.
  step_result finish_step(step_result r, const grad_check& g) {
    bool applied = false;
    if (r.boundary) {
      const loss_scaler_state scaler_before = scaler_.state();
      applied = scaler_.update(g.overflow).applied;
      plan_.end_early(applied, g.norm);
      r.overflow = g.overflow;
      r.grad_norm = g.norm;
      r.lr = scheduler_.group_lr(cfg_.optimizer->lr);
      if (applied) {
        auto t = log_.time("step");
        try {
          apply(g.norm);
        } catch (const io_error&) {
          // NVMe: some rank could not write its state; every rank is back at the previous step.
          scaler_.load_state(scaler_before);
          residency_([](auto& p) { p.end_step(false); });
          end_accumulation(false);
          begin_micro_step();
          throw;
        }
        r.applied = true;
        r.step = counters_.applied_steps;
      }
    }
    residency_([&](auto& p) { p.end_step(applied); });
    if (r.boundary) {
      end_accumulation(applied);
    }
    r.next_loss_scale = scaler_.scale();
    begin_micro_step();
    if (applied_error_) {
      std::rethrow_exception(std::exchange(applied_error_, nullptr));
    }
    return r;
  }

  /// AdamW over the rank's part with the clip of gradient norm `norm` (the plan's `apply`: segment by
  /// segment on the update stream, each handed to the residency behind its update, or all at once on the
  /// engine's stream), then the agreement on its NVMe writes (the plan's `end_writes`).
  void apply(double norm) {
    const auto args = adamw_args_from_config(*cfg_.optimizer, counters_.applied_steps + 1,
                                             clip_coefficient(norm, cfg_.gradient_clipping));
    plan_.apply(args, [&](std::size_t k, const stream_type& s) { residency_([&](auto& r) { r.after_update(k, s); }); });
    if (auto e = plan_.end_writes(residency_.param_file(), [&] { finish_gathers(); })) {
      applied_error_ = e;
    }
    scheduler_.step();
    ++counters_.applied_steps;
  }

  /// Parameters on NVMe: when a gather's read failed on any rank since the last `step()` (the rank
  /// uploaded zeros instead and went on, so every rank made the same collectives), every rank drops
  /// this accumulation: its gradients are zeroed and the next micro-step starts it again. A read of
  /// the persistent parameters after a step is reported at the next `step()`, which drops that one.
  void check_reads() {
    auto* file = residency_.param_file();
    if (file == nullptr) {
      return;
    }
    const std::exception_ptr mine = file->take_read_error();
    if (!parts_.any_rank(mine != nullptr)) {
      return;
    }
    counters_.micro_step -= counters_.micro_step % cfg_.gradient_accumulation_steps;
    residency_([](auto& p) {
      p.end_step(false);
      p.refresh(); // the persistent parameters are read again (a failed read may have been theirs)
    });
    plan_.zero_gradients(nullptr); // the device's, or the host's copy when they stream there
    begin_micro_step();
    throw_agreed(mine, "could not read its parameters from NVMe",
                 "; the micro-batches of this accumulation were dropped (their gradients are zeroed): run them "
                 "again");
  }

  /// Ends an accumulation: zeroes the gradients (behind the update, on its stream, when it overlaps).
  void end_accumulation(bool applied) {
    if (applied && overlap_) {
      plan_.zero_gradients(&overlap_->stream());
      overlap_->close();
    } else {
      plan_.zero_gradients(nullptr);
    }
    ++counters_.boundaries;
    if (cfg_.wall_clock_breakdown && cfg_.steps_per_print) {
      log_.print_if_due(*cfg_.steps_per_print, counters_.boundaries, comm_.rank(), counters_.applied_steps);
    }
  }
};

/// The engine with the backend's allocator and POSIX storage: `zero::engine<zero::cpu_backend,
/// zero::thread_communicator>`.
template <class Backend, class Comm> using engine = basic_engine<Backend, Comm>;

} // namespace zero

#include "zero/engine/step_together.hpp" // IWYU pragma: export
