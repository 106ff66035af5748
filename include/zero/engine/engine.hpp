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

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/bucket_reducer.hpp"
#include "zero/engine/memory_report.hpp"
#include "zero/engine/param_coordinator.hpp"
#include "zero/engine/partitioned_adamw.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/tensor_view.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/optim/loss_scaler.hpp"
#include "zero/optim/lr_schedule.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// Handle of a registered parameter.
struct param_handle {
  std::size_t index = std::numeric_limits<std::size_t>::max();
  friend bool operator==(const param_handle&, const param_handle&) = default;
};

/// Per-parameter options at registration.
struct param_options {
  /// The parameter group's own lr; default: the optimizer's lr.
  std::optional<double> lr{};
  /// The group's weight decay; default: the optimizer's (0 is the usual choice for biases and norms).
  std::optional<double> weight_decay{};
  /// False freezes the parameter: it is kept whole on every rank, gets no gradient and no
  /// optimizer state.
  bool trainable = true;
};

/// What one call of `step()` did.
struct step_result {
  /// True when this micro-step ended an accumulation and the optimizer ran (or skipped).
  bool boundary = false;
  /// True when the optimizer updated the parameters; false for a skipped step (fp16 overflow) and
  /// for micro-steps inside an accumulation.
  bool applied = false;
  /// True when the step was skipped because a gradient was inf or NaN on some rank.
  bool overflow = false;
  /// Global L2 norm of the averaged, unscaled gradients (before clipping); inf on overflow.
  double grad_norm = 0;
  /// The loss scale the step's gradients were computed with, and the one for the next step.
  double loss_scale = 1;
  double next_loss_scale = 1;
  /// The lr the optimizer used (of the default group).
  double lr = 0;
  /// Optimizer steps applied so far (DeepSpeed's global_steps counts boundaries; this counts updates).
  std::int64_t step = 0;
};

/// Wall-clock seconds per phase, summed since the last `reset`.
struct step_timings {
  std::map<std::string, double> seconds;
  std::map<std::string, std::int64_t> calls;
};

/// Fills a rank's part of one parameter at initialisation: `out[k]` is element
/// `first + k` (row-major) of parameter `p`. Called only for elements the rank owns (stages 1-3)
/// or for whole parameters (stage 0), so the model is identical whatever the world size.
using init_fn = std::function<void(const param_info& p, std::size_t first, std::span<float> out)>;

/// How `basic_engine::evaluation` gathers stage 3's parameters inside the scope.
enum class eval_gather : std::uint8_t {
  /// Module by module, as in training: every rank must run the same evaluation forwards.
  per_module,
  /// The whole model once, when the scope opens: ranks may run different numbers of forwards.
  whole_model
};

/// The ZeRO engine; see the file comment. `Backend` runs the kernels and provides the allocator
/// policy `Allocator` (its memory must be reachable by the backend's kernels); `Comm` is the
/// data-parallel group.
template <backend Backend, communicator Comm, allocator Allocator = typename Backend::allocator_type>
class basic_engine {
  static_assert(check_backend<Backend>());
  using counting = counting_allocator<Allocator>;

public:
  /// The policies.
  using backend_type = Backend;
  using communicator_type = Comm;
  using allocator_type = Allocator;

  /// \param cfg     a resolved config; the batch rule is applied again for the communicator's size.
  /// \param comm    the data-parallel group (kept by reference).
  /// \param backend the kernels (kept by reference).
  /// \param alloc   where model state lives (default: the backend's allocator).
  /// \throws config_error for settings this engine cannot honour (the message names the key).
  basic_engine(const config& cfg, Comm& comm, Backend& backend, Allocator alloc)
      : cfg_(cfg.rebatched(comm.size())), comm_(comm), backend_(backend), state_alloc_(alloc), buffer_alloc_(alloc),
        work_alloc_(alloc), stream_(backend.make_stream()), update_stream_(backend.make_stream()),
        update_ready_(backend.make_event()), update_done_(backend.make_event()), staging_free_(backend.make_event()),
        layout_(cfg_.param_dtype()), frozen_layout_(cfg_.param_dtype()), scaler_(make_scaler(cfg_)),
        scheduler_(make_scheduler(cfg_)) {
    require_all_reduce<Comm>();
    if (cfg_.comm_timeout) {
      comm_.set_timeout(std::chrono::milliseconds(std::llround(*cfg_.comm_timeout * 1000.0)));
    }
    // A communicator with its own stream (NCCL's) orders each operation after the work enqueued on
    // the engine's stream so far: a gradient bucket is reduced after the kernels that wrote it.
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      comm_.set_compute_stream(stream_.get());
    }
    const int stage = cfg_.stage();
    if (stage >= 1) {
      require_all_gather<Comm>();
    }
    if (stage >= 2) {
      require_reduce_scatter<Comm>();
    }
    if (cfg_.zero_optimization.offload_optimizer.device != offload_device::none ||
        cfg_.zero_optimization.offload_param.device != offload_device::none) {
      throw config_error("zero_optimization.offload_optimizer / offload_param: offload is read from the config "
                         "but this engine does not run it yet; set \"device\": \"none\"");
    }
    if (!cfg_.optimizer) {
      throw config_error("optimizer: the engine trains with Adam or AdamW from the config; add e.g. "
                         "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}");
    }
    if (cfg_.communication_data_type != cfg_.grad_accum_dtype && cfg_.communication_data_type != cfg_.param_dtype()) {
      throw config_error("communication_data_type: " + std::string(name_of(cfg_.communication_data_type)) +
                         " is neither the gradient dtype (" + std::string(name_of(cfg_.grad_accum_dtype)) +
                         ") nor the parameter dtype; gradients are communicated in the gradient dtype");
    }
  }

  /// The same, with the backend's allocator.
  basic_engine(const config& cfg, Comm& comm,
               Backend& backend) requires std::same_as<Allocator, typename Backend::allocator_type>
      : basic_engine(cfg, comm, backend, backend.get_allocator()) {}

  basic_engine(const basic_engine&) = delete;
  basic_engine& operator=(const basic_engine&) = delete;

  /// Waits for the all-gathers still in flight (their buffers are about to be freed); never throws.
  ~basic_engine() {
    for (auto& h : pending_gathers_) {
      if (h) {
        try {
          h->wait();
        } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing; the group is broken anyway
        }
      }
    }
    if (update_pending_) {
      try {
        backend_.synchronize(update_stream_); // its kernels still use the engine's buffers
      } catch (...) {                         // NOLINT(bugprone-empty-catch): as above
      }
    }
  }

  /// Registers a module (the unit stage 3 gathers) and returns its id.
  int add_module(const std::string& name) {
    check_open("add_module");
    const int id = frozen_layout_.add_module(name);
    layout_module_.push_back(layout_.add_module(name));
    module_names_.push_back(name);
    return id;
  }

  /// Registers a parameter of `module` with shape `shape` in the config's dtype.
  /// \throws usage_error for a bad name, shape or module, or after finalize.
  param_handle add_param(int module, const std::string& name, const std::vector<std::int64_t>& shape,
                         const param_options& opt = {}) {
    check_open("add_param(\"" + name + "\")");
    if (layout_.find(name) || frozen_layout_.find(name)) {
      throw usage_error("add_param: parameter \"" + name + "\" is already registered");
    }
    if (module < 0 || static_cast<std::size_t>(module) >= layout_module_.size()) {
      throw usage_error("add_param(\"" + name + "\"): module id " + std::to_string(module) +
                        " was not made by "
                        "add_module (" +
                        std::to_string(layout_module_.size()) + " modules are registered)");
    }
    entry e;
    e.trainable = opt.trainable;
    e.module = module;
    if (opt.trainable) {
      int layout_module = layout_module_[static_cast<std::size_t>(module)];
      if (cfg_.stage() == 3 &&
          numel_of(shape) < static_cast<std::size_t>(cfg_.zero_optimization.stage3_param_persistence_threshold)) {
        // Small parameters stay whole on every rank (stage3_param_persistence_threshold).
        if (persistent_module_ < 0) {
          persistent_module_ = layout_.add_module("zero.persistent");
        }
        layout_module = persistent_module_;
      }
      e.id = layout_.add(name, shape, layout_.type(), layout_module);
      e.group = group_index(opt);
    } else {
      e.id = frozen_layout_.add(name, shape, frozen_layout_.type(), module);
    }
    entries_.push_back(e);
    return {entries_.size() - 1};
  }

  /// Lays out and allocates everything: parameters, gradients and the rank's optimizer state.
  /// \throws usage_error when no trainable parameter was registered; memory_error when memory runs out
  /// (nothing allocated so far leaks).
  void finalize() {
    check_open("finalize");
    const auto& z = cfg_.zero_optimization;
    const int stage = cfg_.stage();
    const std::size_t esize = size_of(layout_.type());
    const std::size_t bucket_bytes = static_cast<std::size_t>(z.reduce_bucket_size) * esize;
    // Stages 0-2: segments are reduce buckets. Stage 3: one segment per module, the unit gathered.
    layout_.finalize({.world_size = comm_.size(),
                      .alignment_bytes = buffer_alignment,
                      .grouping = stage == 3 ? segment_by::module : segment_by::bucket,
                      .segment_bytes = bucket_bytes});
    if (frozen_layout_.param_count() > 0) {
      frozen_layout_.finalize({.world_size = 1, .alignment_bytes = buffer_alignment});
      frozen_ = buffer<std::byte, counting>(state_alloc_, frozen_layout_.total_size() * esize, memory_tag::params);
    }
    if (stage == 3) {
      std::vector<std::vector<std::size_t>> units(layout_module_.size());
      std::vector<std::size_t> persistent;
      for (std::size_t u = 0; u < layout_.segments().size(); ++u) {
        const int m = layout_.segments()[u].module;
        if (m == persistent_module_) {
          persistent.push_back(u);
          continue;
        }
        for (std::size_t user = 0; user < layout_module_.size(); ++user) {
          if (layout_module_[user] == m) {
            units[user].push_back(u);
          }
        }
      }
      // overlap_comm false (a debugging aid): nothing is fetched ahead; each gather waits for its own
      // all-gather.
      const std::size_t prefetch = z.overlap_comm ? static_cast<std::size_t>(z.stage3_prefetch_bucket_size) : 0;
      coord_.emplace(layout_, std::move(units), std::move(persistent), module_names_, backend_, comm_, state_alloc_,
                     work_alloc_,
                     coordinator_options{.prefetch_elements = prefetch,
                                         .max_live_elements = static_cast<std::size_t>(z.stage3_max_live_parameters),
                                         .max_reuse_distance = static_cast<std::size_t>(z.stage3_max_reuse_distance)},
                     stream_);
      if (log_) {
        coord_->set_log(log_);
      } else if (comm_.rank() == 0) {
        coord_->set_log([](const std::string& line) { std::printf("%s\n", line.c_str()); });
      }
      // The update of a segment runs on the update stream (see update_and_gather); its first gather
      // after a step orders the engine's stream after it.
      segment_updated_.clear();
      for (std::size_t k = 0; k < layout_.segments().size(); ++k) {
        segment_updated_.push_back(backend_.make_event());
      }
      segment_pending_.assign(layout_.segments().size(), false);
      coord_->set_before_shard_read([this](std::size_t u) {
        if (u < segment_pending_.size() && segment_pending_[u]) {
          backend_.wait(stream_, segment_updated_[u]);
          segment_pending_[u] = false;
        }
      });
    } else {
      params_ = buffer<std::byte, counting>(state_alloc_, layout_.total_size() * esize, memory_tag::params);
      zero_params();
    }
    std::vector<std::size_t> group_of(layout_.param_count());
    for (const auto& e : entries_) {
      if (e.trainable) {
        group_of[e.id] = e.group;
      }
    }
    reducer_.emplace(layout_, backend_, comm_, state_alloc_, buffer_alloc_,
                     reducer_options{.mode = stage >= 2 ? reduce_mode::reduce_scatter : reduce_mode::all_reduce,
                                     .grad_type = cfg_.grad_accum_dtype,
                                     .overlap = z.overlap_comm},
                     stream_);
    optimizer_.emplace(layout_, comm_.rank(), stage >= 1, std::move(group_of), groups_, backend_, state_alloc_,
                       stream_);
    flag_ = buffer<int, counting>(buffer_alloc_, 1, memory_tag::buffers);
    // One squared norm per owned range (the same count on every rank: one per segment, or one), summed
    // over ranks by one all-reduce in backend memory, with no host round trip before it.
    norm_ = buffer<float, counting>(buffer_alloc_, std::max<std::size_t>(optimizer_->ranges().size(), 1),
                                    memory_tag::buffers);
    norm_workspace_bytes_ = 0;
    for (const auto& [range, off] : optimizer_->ranges()) {
      visit_float(cfg_.grad_accum_dtype, [&]<class G>(type_tag<G>) {
        norm_workspace_bytes_ =
            std::max(norm_workspace_bytes_, backend_.template squared_norm_workspace_bytes<G>(range.size()));
      });
    }
    norm_workspace_ = buffer<std::byte, counting>(buffer_alloc_, std::max<std::size_t>(norm_workspace_bytes_, 1),
                                                  memory_tag::buffers);
    plain_refs_.assign(module_names_.size(), 0);
    if (stage == 1 || stage == 2) {
      module_segments_.assign(module_names_.size(), {});
      for (const auto& e : entries_) {
        if (e.trainable) {
          auto& segs = module_segments_[static_cast<std::size_t>(e.module)];
          const std::size_t seg = layout_.param(e.id).segment;
          if (std::find(segs.begin(), segs.end(), seg) == segs.end()) {
            segs.push_back(seg);
          }
        }
      }
      pending_gathers_.resize(layout_.segments().size());
      plan_gather_groups(static_cast<std::size_t>(z.allgather_bucket_size.value_or(0)));
    }
    finalized_ = true;
    begin_micro_step();
  }

  /// Initialises parameters: `fn` fills the elements this rank owns in fp32; the engine rounds them
  /// to the parameter dtype, keeps the fp32 values as the master copy, and all-gathers the rest.
  /// Frozen parameters are filled whole on every rank.
  void init_params(const init_fn& fn) {
    check_final("init_params");
    finish_gathers(); // nothing of an earlier step may still write the parameters or the state
    const int stage = cfg_.stage();
    auto fill_piece = [&](const param_info& p, std::size_t first, std::size_t count, std::byte* dst) {
      visit_float(layout_.type(),
                  [&]<class P>(type_tag<P>) { fill_from_host(fn, p, first, count, reinterpret_cast<P*>(dst)); });
    };
    const std::size_t esize = size_of(layout_.type());
    if (stage == 0) {
      for (std::size_t id = 0; id < layout_.param_count(); ++id) {
        const auto& p = layout_.param(id);
        fill_piece(p, 0, p.numel, params_.data() + p.offset * esize);
      }
    } else {
      // Stage 3 writes straight into the shard; stages 1-2 into the whole buffer, then gather.
      const bool sharded = stage == 3;
      std::byte* base = sharded ? coord_->shard() : params_.data();
      for (const auto& piece : layout_.pieces(comm_.rank())) {
        fill_piece(layout_.param(piece.param), piece.param_offset, piece.count,
                   base + (sharded ? piece.shard_offset : piece.flat_offset) * esize);
      }
    }
    for (std::size_t id = 0; id < frozen_layout_.param_count(); ++id) {
      const auto& p = frozen_layout_.param(id);
      fill_piece(p, 0, p.numel, frozen_.data() + p.offset * esize);
    }
    // The master copy takes the values the framework gave, rounded as the parameters are.
    optimizer_->load_master(param_store(), stage == 3);
    if (init_master_exact_) {
      load_master_exact(fn);
    }
    if (stage == 3) {
      coord_->refresh_persistent();
    } else {
      gather_params();
    }
  }

  /// With `true`, `init_params` keeps the fp32 values the init function gave as the master copy
  /// (DeepSpeed keeps the rounded 16-bit values, which is the default here too).
  void keep_exact_master(bool exact) noexcept { init_master_exact_ = exact; }

  /// The parameter as the framework computes with it: whole, in the config's dtype.
  [[nodiscard]] tensor_view param(param_handle h) const {
    const auto& e = entry_of(h, "param");
    const auto& l = e.trainable ? layout_ : frozen_layout_;
    const auto& p = l.param(e.id);
    if (e.trainable && coord_) {
      const auto& seg = layout_.segments()[p.segment];
      std::byte* whole = coord_->full(p.segment, "parameter \"" + p.name + "\" of module \"" +
                                                     module_names_[static_cast<std::size_t>(e.module)] + "\"");
      return {whole + (p.offset - seg.range.begin) * size_of(l.type()), l.type(), p.shape, p.numel};
    }
    if (e.trainable) {
      const std::size_t seg[] = {p.segment};
      wait_gathers(seg);
    }
    // The engine owns the memory; a const engine still hands out writable views, as frameworks
    // write parameters (initialisation, loading) through them.
    const std::byte* base = e.trainable ? params_.data() : frozen_.data();
    return {const_cast<std::byte*>(base) + p.offset * size_of(l.type()), l.type(), p.shape, p.numel};
  }

  /// Where the framework accumulates (`+=`) the parameter's gradient in this micro-step, in the
  /// gradient dtype (`data_types.grad_accum_dtype`). Ask again in every micro-step: the memory may
  /// change (stage 2's staging buffers), and this is where the engine's stream is ordered after the
  /// last step's update, which zeroes the gradients on a stream of its own (stages 1-2 on several
  /// ranks, stage 3). \throws usage_error for a frozen parameter.
  [[nodiscard]] tensor_view grad(param_handle h) {
    const auto& e = entry_of(h, "grad");
    if (!e.trainable) {
      throw usage_error("grad(\"" + frozen_layout_.param(e.id).name +
                        "\"): the parameter is frozen and has no "
                        "gradient");
    }
    const auto& p = layout_.param(e.id);
    join_update(); // the last step still reads (stage 1) and zeroes the gradients on the update stream
    return {reducer_->grad(e.id), cfg_.grad_accum_dtype, p.shape, p.numel};
  }

  /// Marks the parameter's gradient final for this micro-step; a complete bucket starts reducing.
  void grad_ready(param_handle h) {
    const auto& e = entry_of(h, "grad_ready");
    if (!e.trainable) {
      throw usage_error("grad_ready(\"" + frozen_layout_.param(e.id).name + "\"): the parameter is frozen");
    }
    join_update();
    reducer_->ready(e.id);
  }

  /// Keeps a module gathered while alive (RAII for `gather`/`release`).
  class gathered_module {
  public:
    gathered_module(basic_engine* e, int m) : e_(e), m_(m) {}
    gathered_module(gathered_module&& o) noexcept : e_(std::exchange(o.e_, nullptr)), m_(o.m_) {}
    gathered_module(const gathered_module&) = delete;
    gathered_module& operator=(const gathered_module&) = delete;
    gathered_module& operator=(gathered_module&&) = delete;
    ~gathered_module() {
      if (e_ != nullptr) {
        e_->release(m_);
      }
    }

  private:
    basic_engine* e_;
    int m_;
  };

  /// Gathers module `m`'s parameters (stage 3: all-gathered, or already prefetched) until the
  /// returned guard goes out of scope. Free at stages 0-2. Call before the module's forward and
  /// again before its backward.
  /// \throws usage_error for an unknown module; timeout_error naming the module when the other
  /// ranks do not gather it.
  [[nodiscard]] gathered_module gather(int m) {
    check_final("gather");
    check_module(m);
    if (coord_) {
      auto t = time("gather");
      coord_->gather(m);
    } else {
      // Stages 1-2: the all-gathers of the last step's updated parameters run behind the optimizer;
      // the module's buckets are waited for here, so the gathers overlap the modules before it.
      if (static_cast<std::size_t>(m) < module_segments_.size()) {
        wait_gathers(module_segments_[static_cast<std::size_t>(m)]);
      }
      ++plain_refs_[static_cast<std::size_t>(m)];
    }
    return gathered_module(this, m);
  }

  /// Gives module `m` back (what the guard of `gather` does). \throws usage_error on a double release.
  void release(int m) {
    check_module(m);
    if (coord_) {
      coord_->release(m);
      return;
    }
    auto& refs = plain_refs_[static_cast<std::size_t>(m)];
    if (refs == 0) {
      throw usage_error("release(\"" + module_names_[static_cast<std::size_t>(m)] +
                        "\") without a matching gather (a double release?)");
    }
    --refs;
  }

  /// A scope in which every parameter is whole (DeepSpeed's GatheredParameters). With
  /// `modifier_rank >= 0`, the values that rank holds when the scope ends are written back to every
  /// rank's shard and to the fp32 master copy; otherwise changes are discarded.
  class gathered_all {
  public:
    gathered_all(basic_engine* e, int modifier) : e_(e), modifier_(modifier) {}
    gathered_all(gathered_all&& o) noexcept : e_(std::exchange(o.e_, nullptr)), modifier_(o.modifier_) {}
    gathered_all(const gathered_all&) = delete;
    gathered_all& operator=(const gathered_all&) = delete;
    gathered_all& operator=(gathered_all&&) = delete;
    ~gathered_all() noexcept(false) {
      if (e_ != nullptr) {
        e_->end_gather_all(modifier_);
      }
    }

  private:
    basic_engine* e_;
    int modifier_;
  };
  [[nodiscard]] gathered_all gather_all(int modifier_rank = -1) {
    check_final("gather_all");
    finish_gathers();
    if (modifier_rank >= comm_.size()) {
      throw usage_error("gather_all: modifier rank " + std::to_string(modifier_rank) + " is outside the group of " +
                        std::to_string(comm_.size()));
    }
    if (coord_) {
      coord_->gather_everything();
    }
    return gathered_all(this, modifier_rank);
  }

  /// A forward-only pass (evaluation) between training steps: stage 3 traces and prefetches it apart
  /// from training, so the next training step still prefetches everything it needs.
  ///
  /// At stage 3 every gather is a collective. With `eval_gather::per_module` (the default, memory
  /// bounded as in training) every rank must therefore run the same forwards inside the scope: the
  /// same number of batches, gathering the same modules in the same order; a rank with fewer test
  /// batches must still run (empty or masked) forwards, or the others fail with a mismatch or a
  /// timeout. With `eval_gather::whole_model` the scope gathers every parameter once when it opens
  /// (one collective pass, whole model in memory until it closes), and gathers inside it are free, so
  /// ranks may run any number of batches. Stages 0-2 need neither: their gathers are local.
  class evaluation_scope {
  public:
    explicit evaluation_scope(basic_engine* e) : e_(e) {}
    evaluation_scope(evaluation_scope&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    evaluation_scope(const evaluation_scope&) = delete;
    evaluation_scope& operator=(const evaluation_scope&) = delete;
    evaluation_scope& operator=(evaluation_scope&&) = delete;
    ~evaluation_scope() noexcept(false) {
      if (e_ != nullptr && e_->coord_) {
        e_->coord_->end_eval();
      }
    }

  private:
    basic_engine* e_;
  };
  /// Opens an evaluation scope (see `evaluation_scope`); collective at stage 3.
  /// \param mode how stage 3 gathers inside the scope.
  /// \throws usage_error when a scope is already open; timeout_error when a rank does not open it
  /// (with `whole_model`).
  [[nodiscard]] evaluation_scope evaluation(eval_gather mode = eval_gather::per_module) {
    check_final("evaluation");
    finish_gathers();
    if (coord_) {
      coord_->begin_eval(mode == eval_gather::whole_model);
    }
    return evaluation_scope(this);
  }

  /// Stage 3's gathering counters (null at stages 0-2).
  [[nodiscard]] const param_coordinator<Backend, Comm, Allocator>* coordinator() const noexcept {
    return coord_ ? &*coord_ : nullptr;
  }

  /// The stream the engine's kernels run on. A framework computing on a device runs its forward and
  /// backward on this stream too (or orders its own stream against it with events), so the engine's
  /// reads of gradients and writes of parameters are ordered with its kernels without a device-wide sync.
  [[nodiscard]] const typename Backend::stream_type& stream() const noexcept { return stream_; }

  /// The factor to multiply the loss by before backward (fp16's loss scale; 1 otherwise).
  [[nodiscard]] double loss_scale() const noexcept { return scaler_.scale(); }
  /// True when the current micro-step is the last of its accumulation.
  [[nodiscard]] bool is_boundary() const noexcept { return (micro_step_ + 1) % cfg_.gradient_accumulation_steps == 0; }

  /// Ends a micro-step. On the last micro-step of an accumulation: waits for the reductions,
  /// unscales and checks for inf/NaN when there is a factor to unscale by (fp16's loss scale,
  /// accumulation; one all-reduce of a flag), computes the global gradient norm (one all-reduce of
  /// partial sums; a non-finite norm is an overflow too), clips, runs AdamW on the rank's part,
  /// updates the loss scale, and all-gathers the updated parameters (stages 1, 2).
  /// \throws usage_error for parameters without a gradient (unless ignore_unused_parameters);
  /// loss_scale_error when fp16 overflows at the minimum loss scale.
  step_result step() {
    check_final("step");
    finish_gathers(); // the optimizer rewrites the parameters the last step's all-gathers wrote
    step_result r;
    r.boundary = is_boundary();
    r.loss_scale = scaler_.scale();
    r.step = applied_steps_;
    {
      auto t = time("reduce");
      reducer_->finish(cfg_.zero_optimization.ignore_unused_parameters);
    }
    ++micro_step_;
    if (!r.boundary) {
      if (coord_) {
        coord_->end_step(false);
      }
      r.next_loss_scale = scaler_.scale();
      begin_micro_step();
      return r;
    }
    const bool partitioned = cfg_.stage() >= 1;
    const double unscale = 1.0 / (scaler_.scale() * static_cast<double>(cfg_.gradient_accumulation_steps));
    bool overflow = false;
    double norm = 0;
    {
      auto t = time("step");
      // With nothing to unscale (no loss scale, no accumulation: bf16 and fp32 training) the gradients
      // are only read: an inf or NaN in any of them makes its range's squared norm, and so the all-reduced
      // sum, non-finite, which is the overflow test below. The flag pass and its collective are for
      // scaled gradients, which the pass also rewrites.
      const bool scaled = unscale != 1.0;
      if (scaled) {
        backend_.fill(flag_.data(), 1, 0, stream_);
      }
      const std::size_t ranges = optimizer_->ranges().size();
      visit_float(cfg_.grad_accum_dtype, [&]<class G>(type_tag<G>) {
        std::size_t i = 0;
        for (const auto& [range, off] : optimizer_->ranges()) {
          G* g = reinterpret_cast<G*>(reducer_->reduced(range, off));
          if (scaled) {
            backend_.unscale_and_check(g, range.size(), static_cast<float>(unscale), flag_.data(), stream_);
          }
          backend_.squared_norm(g, range.size(), norm_.data() + i, norm_workspace_.data(), norm_workspace_bytes_,
                                stream_);
          ++i;
        }
      });
      if (partitioned && comm_.size() > 1) {
        // The overflow flag (max) and the per-range squared norms (sum) ride two small collectives on
        // backend memory, issued back to back and waited together.
        using handle_type = decltype(comm_.all_reduce(flag_.data(), flag_.data(), 1, reduce_op::max));
        std::optional<handle_type> hf;
        if (scaled) {
          hf.emplace(comm_.all_reduce(flag_.data(), flag_.data(), 1, reduce_op::max));
        }
        auto hn = comm_.all_reduce(norm_.data(), norm_.data(), ranges, reduce_op::sum);
        if (hf) {
          hf->wait();
        }
        hn.wait();
      }
      const std::int32_t local_flag = scaled ? backend_.read_scalar(flag_.data(), stream_) : 0;
      norms_host_.resize(ranges);
      download(norm_.data(), norms_host_.data(), ranges);
      double sq = 0;
      for (const float part : norms_host_) {
        sq += static_cast<double>(part);
      }
      overflow = local_flag != 0 || !std::isfinite(sq);
      norm = overflow ? std::numeric_limits<double>::infinity() : std::sqrt(sq);
    }
    const auto upd = scaler_.update(overflow);
    r.overflow = overflow;
    r.grad_norm = norm;
    r.next_loss_scale = upd.scale;
    r.lr = scheduler_.group_lr(default_lr());
    if (upd.applied) {
      auto t = time("step");
      adamw_step_args args;
      const auto& o = *cfg_.optimizer;
      args.beta1 = static_cast<float>(o.betas[0]);
      args.beta2 = static_cast<float>(o.betas[1]);
      args.eps = static_cast<float>(o.eps);
      args.adam_w_mode = o.adam_w_mode;
      args.set_step(applied_steps_ + 1, o.bias_correction);
      const double clip = cfg_.gradient_clipping;
      // DeepSpeed's clip: scale by max_norm / (norm + 1e-6) when that is below 1.
      const double coef = clip > 0 ? clip / (norm + 1e-6) : 1.0;
      args.grad_scale = static_cast<float>(coef < 1.0 ? coef : 1.0);
      auto group_lr = [&](double lr) { return scheduler_.group_lr(lr); };
      auto reduced = [&](const flat_range& range, std::size_t off) { return reducer_->reduced(range, off); };
      if (overlap_update()) {
        update_and_gather(args, group_lr, reduced);
      } else {
        optimizer_->step(args, group_lr, cfg_.grad_accum_dtype, reduced, param_store(), cfg_.stage() == 3);
      }
      scheduler_.step();
      ++applied_steps_;
      r.applied = true;
      r.step = applied_steps_;
    }
    if (upd.applied && partitioned && !coord_ && !overlap_update()) {
      auto t = time("gather");
      gather_params();
    }
    if (coord_) {
      coord_->end_step(upd.applied);
    }
    if (upd.applied && overlap_update()) {
      // The gradients are zeroed behind the update that reads them; stream_ is ordered after both at
      // the next use of gradients (grad, grad_ready, step) or of the state (finish_gathers).
      reducer_->zero(update_stream_);
      backend_.record(update_done_, update_stream_);
      update_pending_ = true;
    } else {
      reducer_->zero();
    }
    ++boundaries_;
    maybe_print_timings();
    begin_micro_step();
    return r;
  }

  /// Measures a phase for wall_clock_breakdown: `{ auto t = eng.time("forward"); ... }`.
  [[nodiscard]] auto time(std::string name) {
    struct timer {
      basic_engine* e;
      std::string name;
      std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
      timer(basic_engine* eng, std::string n) : e(eng), name(std::move(n)) {}
      timer(const timer&) = delete;
      timer& operator=(const timer&) = delete;
      ~timer() {
        const std::chrono::duration<double> d = std::chrono::steady_clock::now() - start;
        e->timings_.seconds[name] += d.count();
        e->timings_.calls[name] += 1;
      }
    };
    return timer(this, std::move(name));
  }
  /// The phases timed so far.
  [[nodiscard]] const step_timings& timings() const noexcept { return timings_; }
  /// Where log lines go (wall_clock_breakdown); default: stdout on rank 0.
  void set_log(std::function<void(const std::string&)> sink) { log_ = std::move(sink); }

  /// Bytes per tag from the counting allocator, beside the ZeRO formula.
  [[nodiscard]] memory_report memory() const {
    memory_report m;
    m.stage = cfg_.stage();
    m.world_size = comm_.size();
    m.parameters = layout_.finalized() ? layout_.numel() : 0;
    m.padding = layout_.finalized() ? layout_.padding() : 0;
    m.params = state_alloc_.live(memory_tag::params);
    m.grads = state_alloc_.live(memory_tag::grads);
    m.optimizer = state_alloc_.live(memory_tag::optimizer);
    m.buffers = buffer_alloc_.live(memory_tag::buffers);
    m.params_peak = state_alloc_.peak(memory_tag::params);
    m.grads_peak = state_alloc_.peak(memory_tag::grads);
    m.optimizer_peak = state_alloc_.peak(memory_tag::optimizer);
    m.buffers_peak = buffer_alloc_.peak(memory_tag::buffers);
    m.model_state_peak = state_alloc_.total().peak;
    m.working_set_peak = work_alloc_.total().peak;
    m.formula = zero_formula_bytes(m.stage, static_cast<double>(m.parameters), m.world_size, layout_.type(),
                                   cfg_.grad_accum_dtype);
    return m;
  }

  /// The resolved config in force.
  [[nodiscard]] const config& cfg() const noexcept { return cfg_; }
  /// The flat layout of trainable parameters.
  [[nodiscard]] const flat_layout& layout() const noexcept { return layout_; }
  /// Optimizer steps applied so far.
  [[nodiscard]] std::int64_t global_steps() const noexcept { return applied_steps_; }
  /// Collectives the gradient reducer launched (tests count communication with it).
  [[nodiscard]] std::size_t reduce_launches() const noexcept { return reducer_ ? reducer_->launches() : 0; }
  /// This rank's optimizer (master weights, m, v over the owned ranges).
  [[nodiscard]] partitioned_adamw<Backend, Allocator>& optimizer() {
    check_final("optimizer");
    finish_gathers(); // the state is read or written on the engine's stream, after the last update
    return *optimizer_;
  }
  /// The scaler and scheduler, for checkpoints and logs.
  [[nodiscard]] const loss_scaler& scaler() const noexcept { return scaler_; }
  [[nodiscard]] const lr_scheduler& scheduler() const noexcept { return scheduler_; }
  /// The handle of a parameter by name. \throws usage_error when there is none.
  [[nodiscard]] param_handle find(const std::string& name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const auto& e = entries_[i];
      if ((e.trainable ? layout_ : frozen_layout_).param(e.id).name == name) {
        return {i};
      }
    }
    throw usage_error("no parameter named \"" + name + "\" is registered");
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
  /// stage3_gather_16bit_weights_on_model_save (every module is gathered for it); otherwise nothing is
  /// written. \returns true when the file was written. \throws io_error when it cannot be.
  [[nodiscard]] bool save_16bit_model(const std::filesystem::path& dir,
                                      const std::string& filename = "model.safetensors") {
    return checkpoint_save_16bit_model(*this, dir, filename);
  }
  /// Initialises every parameter from a safetensors file with the registered names and shapes
  /// (through `init_params`). \throws checkpoint_error naming a missing or misshapen tensor.
  void init_from_safetensors(const std::filesystem::path& path) { checkpoint_init_from_safetensors(*this, path); }

private:
  template <class> friend struct checkpoint_access;
  struct entry {
    bool trainable = true;
    std::size_t id = 0;
    std::size_t group = 0;
    int module = 0;
  };

  static std::size_t numel_of(const std::vector<std::int64_t>& shape) {
    std::size_t n = 1;
    for (auto d : shape) {
      n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
    }
    return n;
  }

  void check_module(int m) const {
    if (m < 0 || static_cast<std::size_t>(m) >= module_names_.size()) {
      throw usage_error("module id " + std::to_string(m) + " was not made by add_module (" +
                        std::to_string(module_names_.size()) + " modules are registered)");
    }
  }

  /// Where the low-precision parameters the optimizer updates live: the shard (stage 3) or the
  /// whole flat buffer.
  std::byte* param_store() { return coord_ ? coord_->shard() : params_.data(); }

  void end_gather_all(int modifier) {
    if (coord_) {
      coord_->release_everything(modifier);
      if (modifier >= 0) {
        optimizer_->load_master(coord_->shard(), true);
      }
      return;
    }
    if (modifier >= 0 && comm_.size() > 1) {
      backend_.synchronize(stream_);
      visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
        P* p = reinterpret_cast<P*>(params_.data());
        comm_.broadcast(p, p, layout_.total_size(), modifier).wait();
      });
    }
    if (modifier >= 0) {
      optimizer_->load_master(params_.data());
    }
  }

  static loss_scaler make_scaler(const config& c) {
    if (!c.fp16.enabled) {
      return loss_scaler::none();
    }
    return loss_scaler(loss_scaler_options{.loss_scale = c.fp16.loss_scale,
                                           .initial_scale_power = static_cast<int>(c.fp16.initial_scale_power),
                                           .loss_scale_window = c.fp16.loss_scale_window,
                                           .hysteresis = static_cast<int>(c.fp16.hysteresis),
                                           .consecutive_hysteresis = c.fp16.consecutive_hysteresis,
                                           .min_loss_scale = c.fp16.min_loss_scale});
  }

  static lr_scheduler make_scheduler(const config& c) { return scheduler_from_config(c); }

  double default_lr() const { return cfg_.optimizer ? cfg_.optimizer->lr : 1e-3; }

  std::size_t group_index(const param_options& opt) {
    const double lr = opt.lr.value_or(default_lr());
    const double wd = opt.weight_decay.value_or(cfg_.optimizer ? cfg_.optimizer->weight_decay : 0.0);
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (groups_[i].lr == lr && groups_[i].weight_decay == wd) {
        return i;
      }
    }
    groups_.push_back({lr, wd});
    return groups_.size() - 1;
  }

  const entry& entry_of(param_handle h, const char* what) const {
    check_final(what);
    if (h.index >= entries_.size()) {
      throw usage_error(std::string(what) + ": parameter handle " + std::to_string(h.index) +
                        " was not made by "
                        "this engine (" +
                        std::to_string(entries_.size()) + " parameters are registered)");
    }
    return entries_[h.index];
  }

  void check_open(const std::string& what) const {
    if (finalized_) {
      throw usage_error(what + " after finalize(); register every module and parameter first");
    }
  }
  void check_final(const std::string& what) const {
    if (!finalized_) {
      throw usage_error(what + " before finalize(); call finalize() after registering parameters");
    }
  }

  void begin_micro_step() { reducer_->begin_micro_step(is_boundary()); }

  void zero_params() {
    visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      backend_.fill(reinterpret_cast<P*>(params_.data()), layout_.total_size(), P{}, stream_);
    });
  }

  /// Elements of host scratch `fill_from_host` stages at a time (4 MiB of fp32).
  static constexpr std::size_t host_chunk_elements = std::size_t{1} << 20;

  /// Fills `count` elements of parameter `p` from element `first` on with `fn`'s fp32 values, rounded
  /// to `P`, into `dst` in backend memory: through a host chunk and, for memory the host cannot touch,
  /// the backend's `copy` into an fp32 staging chunk in backend memory. Not a hot path (initialisation).
  template <class P>
  void fill_from_host(const init_fn& fn, const param_info& p, std::size_t first, std::size_t count, P* dst) {
    const std::size_t chunk = std::min(count, host_chunk_elements);
    std::vector<float> host(chunk);
    if constexpr (Allocator::host_accessible) {
      for (std::size_t done = 0; done < count; done += chunk) {
        const std::size_t n = std::min(chunk, count - done);
        fn(p, first + done, std::span<float>(host.data(), n));
        backend_.cast(host.data(), dst + done, n, stream_);
        backend_.synchronize(stream_); // the host chunk is refilled next
      }
    } else {
      static_assert(can_copy<Backend>, "zero::basic_engine: the allocator's memory is not host accessible, so the "
                                       "backend needs copy(const void* src, void* dst, size_t bytes, stream) to "
                                       "move values between host and backend memory (see zero::can_copy)");
      buffer<float, counting> staging(buffer_alloc_, chunk, memory_tag::buffers);
      for (std::size_t done = 0; done < count; done += chunk) {
        const std::size_t n = std::min(chunk, count - done);
        fn(p, first + done, std::span<float>(host.data(), n));
        backend_.copy(host.data(), staging.data(), n * sizeof(float), stream_);
        backend_.cast(staging.data(), dst + done, n, stream_);
        backend_.synchronize(stream_); // host and staging chunks are refilled next
      }
    }
  }

  /// Copies `n` elements from host memory to backend memory and waits for the copy.
  template <class T> void upload(const T* host, T* dst, std::size_t n) {
    if constexpr (can_copy<Backend>) {
      backend_.copy(host, dst, n * sizeof(T), stream_);
      backend_.synchronize(stream_);
    } else {
      static_assert(Allocator::host_accessible, "zero::basic_engine: the allocator's memory is not host accessible "
                                                "and the backend has no copy (see zero::can_copy)");
      backend_.synchronize(stream_);
      std::copy(host, host + n, dst);
    }
  }

  /// Copies `n` elements from backend memory to host memory and waits for them.
  template <class T> void download(const T* src, T* host, std::size_t n) {
    if constexpr (can_copy<Backend>) {
      backend_.copy(src, host, n * sizeof(T), stream_);
      backend_.synchronize(stream_);
    } else {
      static_assert(Allocator::host_accessible, "zero::basic_engine: the allocator's memory is not host accessible "
                                                "and the backend has no copy (see zero::can_copy)");
      backend_.synchronize(stream_);
      std::copy(src, src + n, host);
    }
  }

  void load_master_exact(const init_fn& fn) {
    float* master = optimizer_->master();
    if (master == nullptr) {
      return;
    }
    const int stage = cfg_.stage();
    for (std::size_t id = 0; id < layout_.param_count(); ++id) {
      const auto& p = layout_.param(id);
      if (stage == 0) {
        fill_from_host(fn, p, 0, p.numel, master + p.offset);
      } else if (auto piece = layout_.intersection(id, comm_.rank())) {
        fill_from_host(fn, p, piece->param_offset, piece->count, master + piece->shard_offset);
      }
    }
  }

  /// All-gathers every segment's owned slice into every rank's flat parameter buffer, in place.
  void gather_params() {
    if (cfg_.stage() == 0 || comm_.size() == 1) {
      return;
    }
    if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
      backend_.synchronize(stream_); // the optimizer's writes come first
    }
    // Every group's all-gather is posted now and waited for where its parameters are next used
    // (gather, param), so the gathers run beside the next forward's first modules.
    for (std::size_t g = 0; g < gather_groups_.size(); ++g) {
      post_gather(g, stream_);
    }
  }

  /// Groups consecutive segments into the step-end all-gathers of stages 1-2, each of at most `cap`
  /// elements of all ranks together (allgather_bucket_size, counted as DeepSpeed counts it); a segment
  /// larger than `cap` is all-gathered alone. A group of one segment runs in place; a group of several
  /// goes through one staging buffer (memory_tag::buffers) sized for the largest such group.
  void plan_gather_groups(std::size_t cap) {
    const auto& segs = layout_.segments();
    gather_groups_.clear();
    segment_group_.assign(segs.size(), 0);
    std::size_t staging = 0;
    for (std::size_t s = 0; s < segs.size(); ++s) {
      if (gather_groups_.empty() || gather_groups_.back().elements + segs[s].range.size() > cap) {
        gather_groups_.push_back({.first = s, .last = s});
      }
      auto& g = gather_groups_.back();
      g.last = s + 1;
      g.elements += segs[s].range.size();
      g.slices += segs[s].slice;
      segment_group_[s] = gather_groups_.size() - 1;
      if (g.last - g.first > 1) {
        staging = std::max(staging, g.elements);
      }
    }
    if (staging > 0 && comm_.size() > 1) {
      gather_staging_ =
          buffer<std::byte, counting>(buffer_alloc_, staging * size_of(layout_.type()), memory_tag::buffers);
    }
  }

  /// Posts the all-gather of group `g`'s owned slices (stages 1-2), waited in `wait_gathers`; its handle
  /// is kept at the group's first segment. One segment: in place. Several: this rank's slices are packed
  /// into its block of the staging buffer on `s` (the stream the communicator is ordered after), the
  /// all-gather runs in place there, and `wait_group` unpacks the other ranks' blocks. The staging
  /// buffer holds one group at a time, so the group before is waited for (and unpacked) first.
  void post_gather(std::size_t g, const typename Backend::stream_type& s) {
    const auto& grp = gather_groups_[g];
    const auto& segs = layout_.segments();
    const auto rank = static_cast<std::size_t>(comm_.rank());
    auto& slot = pending_gathers_[grp.first];
    visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      P* params = reinterpret_cast<P*>(params_.data());
      if (grp.last - grp.first == 1) {
        const auto& seg = segs[grp.first];
        P* whole = params + seg.range.begin;
        slot.emplace(comm_.all_gather(whole + rank * seg.slice, whole, seg.slice));
        return;
      }
      if (staged_group_) {
        wait_group(*staged_group_);
      }
      backend_.wait(s, staging_free_); // the last unpack, on stream_, has read the staging buffer
      P* staging = reinterpret_cast<P*>(gather_staging_.data());
      P* block = staging + rank * grp.slices;
      for (std::size_t k = grp.first; k < grp.last; ++k) {
        backend_.cast(params + segs[k].range.begin + rank * segs[k].slice, block, segs[k].slice, s);
        block += segs[k].slice;
      }
      if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
        backend_.synchronize(s); // the packing comes first
      }
      slot.emplace(comm_.all_gather(staging + rank * grp.slices, staging, grp.slices));
      staged_group_ = g;
    });
  }

  /// Waits for the posted all-gathers of the groups holding segments `segs` (stages 1-2).
  void wait_gathers(std::span<const std::size_t> segs) const {
    for (const std::size_t s : segs) {
      if (s < segment_group_.size()) {
        wait_group(segment_group_[s]);
      }
    }
  }

  /// Waits for group `g`'s all-gather, if posted; a staged one is then unpacked into the parameters on
  /// the engine's stream, after which the staging buffer is free again (`staging_free_`).
  void wait_group(std::size_t g) const {
    const auto& grp = gather_groups_[g];
    auto& slot = pending_gathers_[grp.first];
    if (!slot) {
      return;
    }
    auto h = std::move(*slot);
    slot.reset();
    const bool staged = grp.last - grp.first > 1;
    if (staged) {
      staged_group_.reset();
    }
    h.wait();
    if (!staged) {
      return;
    }
    const auto& segs = layout_.segments();
    visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      // The engine owns the parameters; a const engine still completes its own gathers into them.
      P* params = reinterpret_cast<P*>(const_cast<std::byte*>(params_.data()));
      const P* staging = reinterpret_cast<const P*>(gather_staging_.data());
      for (int q = 0; q < comm_.size(); ++q) {
        if (q == comm_.rank()) {
          continue; // its own slices were never moved
        }
        const auto uq = static_cast<std::size_t>(q);
        const P* block = staging + uq * grp.slices;
        for (std::size_t k = grp.first; k < grp.last; ++k) {
          backend_.cast(block, params + segs[k].range.begin + uq * segs[k].slice, segs[k].slice, stream_);
          block += segs[k].slice;
        }
      }
    });
    backend_.record(staging_free_, stream_);
  }

  /// Waits for every posted all-gather, and orders the engine's stream after the last update.
  void finish_gathers() const {
    for (std::size_t s = 0; s < pending_gathers_.size(); ++s) {
      const std::size_t one[] = {s};
      wait_gathers(one);
    }
    join_update();
  }

  /// Stages 1-2 on several ranks, and stage 3: the optimizer steps on its own stream beside the next
  /// forward (see `update_and_gather`).
  [[nodiscard]] bool overlap_update() const noexcept {
    return cfg_.stage() == 3 || ((cfg_.stage() == 1 || cfg_.stage() == 2) && comm_.size() > 1);
  }

  /// Makes `stream_` wait for the update stream's last step (without blocking the host), once.
  void join_update() const {
    if (update_pending_) {
      backend_.wait(stream_, update_done_);
      update_pending_ = false;
      std::fill(segment_pending_.begin(), segment_pending_.end(), false); // all passed with the whole step
    }
  }

  /// AdamW over each segment's owned slice on the update stream, in the order the next forward uses
  /// the segments. Stages 1-2 (several ranks): each gather group's all-gather is posted right behind
  /// the update of its last segment (the communicator ordered after the update stream meanwhile), and
  /// the next forward, on `stream_`, waits per module in `gather`/`param` for exactly the groups it
  /// reads. Stage 3: an
  /// event per segment, which the engine's stream waits for before the coordinator reads that
  /// segment's shard to gather it. Either way the update of later segments runs beside the forward
  /// of earlier ones. Same kernels, same arguments, same per-element order as stepping everything at
  /// once: the result is the same bits.
  template <class GroupLr, class Reduced>
  void update_and_gather(const adamw_step_args& args, GroupLr& group_lr, Reduced& reduced) {
    backend_.record(update_ready_, stream_);
    backend_.wait(update_stream_, update_ready_);
    struct restore_order {
      basic_engine* e;
      ~restore_order() {
        if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
          e->comm_.set_compute_stream(e->stream_.get());
        }
      }
    } restore{this};
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      comm_.set_compute_stream(update_stream_.get());
    }
    for (std::size_t k = 0; k < layout_.segments().size(); ++k) {
      optimizer_->step_range(k, update_stream_, args, group_lr, cfg_.grad_accum_dtype, reduced, param_store(),
                             coord_.has_value());
      if (coord_) {
        // Stage 3: the segment's next gather reads its shard slice on stream_ after this point.
        backend_.record(segment_updated_[k], update_stream_);
        segment_pending_[k] = true;
        continue;
      }
      const std::size_t g = segment_group_[k];
      if (gather_groups_[g].last != k + 1) {
        continue; // the group's all-gather follows the update of its last segment
      }
      if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
        backend_.synchronize(update_stream_); // the group's updates come first
      }
      post_gather(g, update_stream_);
    }
  }

  void maybe_print_timings() {
    if (!cfg_.wall_clock_breakdown || !cfg_.steps_per_print || *cfg_.steps_per_print <= 0 ||
        boundaries_ % *cfg_.steps_per_print != 0) {
      return;
    }
    std::string line =
        "[zero] rank " + std::to_string(comm_.rank()) + " step " + std::to_string(applied_steps_) + " time (ms):";
    for (const auto& [name, s] : timings_.seconds) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " %s %.2f", name.c_str(), 1e3 * s / static_cast<double>(timings_.calls[name]));
      line += buf;
    }
    timings_ = {};
    if (log_) {
      log_(line);
    } else if (comm_.rank() == 0) {
      std::printf("%s\n", line.c_str());
    }
  }

  config cfg_;
  Comm& comm_;
  Backend& backend_;
  counting state_alloc_;
  counting buffer_alloc_;
  counting work_alloc_;
  typename Backend::stream_type stream_;
  /// Stages 1-2 on several ranks, and stage 3: the optimizer step runs here, segment by segment,
  /// while the framework's next forward runs on `stream_` (see `update_and_gather`).
  typename Backend::stream_type update_stream_;
  typename Backend::event_type update_ready_; // stream_: the gradients are final
  typename Backend::event_type update_done_;  // update_stream_: the step and the gradient zeroing are done
  /// stream_: the last unpack of a staged all-gather has read the staging buffer (see `wait_group`).
  mutable typename Backend::event_type staging_free_;
  /// The update stream has work `stream_` has not been ordered after yet (see `join_update`).
  mutable bool update_pending_ = false;
  /// Stage 3: per segment, the point the update stream passed its update, and whether the engine's
  /// stream still has to wait for it before the segment's shard is read.
  std::vector<typename Backend::event_type> segment_updated_;
  mutable std::vector<bool> segment_pending_;
  flat_layout layout_;
  flat_layout frozen_layout_;
  std::vector<entry> entries_;
  std::vector<param_group> groups_;
  buffer<std::byte, counting> params_;
  buffer<std::byte, counting> frozen_;
  std::optional<bucket_reducer<Backend, Comm, Allocator>> reducer_;
  std::optional<partitioned_adamw<Backend, Allocator>> optimizer_;
  std::optional<param_coordinator<Backend, Comm, Allocator>> coord_;
  std::vector<int> layout_module_;
  std::vector<std::string> module_names_;
  std::vector<int> plain_refs_;
  using gather_handle =
      decltype(std::declval<Comm&>().all_gather(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0));
  /// Stages 1-2: the segments of each module, and the all-gather still in flight per segment.
  std::vector<std::vector<std::size_t>> module_segments_;
  mutable std::vector<std::optional<gather_handle>> pending_gathers_;
  /// Stages 1-2: the step-end all-gathers, segments [first, last) each (see `plan_gather_groups`):
  /// `elements` of all ranks, `slices` per rank; the group of each segment; the staging buffer of
  /// groups of several segments, and the group that holds it now.
  struct gather_group {
    std::size_t first = 0;
    std::size_t last = 0;
    std::size_t elements = 0;
    std::size_t slices = 0;
  };
  std::vector<gather_group> gather_groups_;
  std::vector<std::size_t> segment_group_;
  buffer<std::byte, counting> gather_staging_;
  mutable std::optional<std::size_t> staged_group_;
  int persistent_module_ = -1;
  buffer<int, counting> flag_;
  buffer<float, counting> norm_;
  std::vector<float> norms_host_;
  buffer<std::byte, counting> norm_workspace_;
  std::size_t norm_workspace_bytes_ = 0;
  loss_scaler scaler_;
  lr_scheduler scheduler_;
  step_timings timings_;
  std::function<void(const std::string&)> log_;
  std::int64_t micro_step_ = 0;
  std::int64_t applied_steps_ = 0;
  std::int64_t boundaries_ = 0;
  bool finalized_ = false;
  bool init_master_exact_ = false;
};

/// The engine with the backend's allocator: `zero::engine<zero::cpu_backend, zero::thread_communicator>`.
template <class Backend, class Comm> using engine = basic_engine<Backend, Comm>;

} // namespace zero
