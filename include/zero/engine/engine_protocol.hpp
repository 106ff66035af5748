#pragma once
/// \file
/// The training protocol over an engine's state (`engine_state.hpp`), as functions of it: what
/// `basic_engine`'s calls and `step_together` run (docs/design.md, "The engine").
///
/// A micro-step begins (`begin_micro_step`: the step plan, the reducer and stage 3's trace position);
/// what reads or writes the parameters outside a step first joins the update (`finish_for_reader`);
/// `step()` is `check_step` (the reductions finished, NVMe reads agreed, the plan's check of the
/// gradients) and `finish_step` (the loss scaler, the plan's update and the end of its writes, the
/// residency's end of step, the gradients zeroed), with no question about where the state lives.

#include "zero/backend/transfer.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/memory_report.hpp"
#include "zero/engine/schedule_from_config.hpp"
#include "zero/engine/step/adamw_placement.hpp"
#include "zero/engine/step/step_parts.hpp"
#include "zero/engine/tensor_view.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

template <class S> void check_open(const S& s, const std::string& what) {
  if (s.finalized) {
    throw usage_error(what + " after finalize(); register every module and parameter first");
  }
}
template <class S> void check_final(const S& s, const std::string& what) {
  if (s.deferred) {
    std::rethrow_exception(std::exchange(s.deferred, nullptr)); // a scope's end failed in a destructor
  }
  if (!s.finalized) {
    throw usage_error(what + " before finalize(); call finalize() after registering parameters");
  }
}

/// True when the current micro-step is the last of its accumulation.
template <class S> bool is_boundary(const S& s) noexcept {
  return (s.counters.micro_step + 1) % s.cfg.gradient_accumulation_steps == 0;
}
/// What the reduced gradients are multiplied by before their check and the update: the inverse of the
/// loss scale and of the accumulation, and the averaging group's correction.
template <class S> double unscale(const S& s) noexcept {
  return s.average / (s.scaler.scale() * static_cast<double>(s.cfg.gradient_accumulation_steps));
}

template <class S> void begin_micro_step(S& s) {
  s.plan.begin_micro_step(is_boundary(s), unscale(s)); // first: a step that ended early keeps none of its updates
  s.reducer->begin_micro_step(is_boundary(s));
  // Stage 3 keeps a gather trace per micro-step of the accumulation (a pipeline's 1F1B orders differ by position).
  s.params([&](auto& r) {
    r.begin_micro_step(static_cast<std::size_t>(s.counters.micro_step % s.cfg.gradient_accumulation_steps));
  });
}

/// Waits for a host step running beside the forward (`forward_overlap`), and makes the engine's stream
/// wait for the update stream's last step (without blocking the host), once.
template <class S> void join_update(S& s) {
  s.plan.join();
  if (s.overlap && s.overlap->join()) {
    s.params([](auto& r) { r.updates_joined(); });
    s.reducer->release_retired();
  }
}
/// Waits for every posted all-gather, and orders the engine's stream after the last update.
template <class S> void finish_gathers(S& s) {
  s.params([](auto& r) { r.finish(); });
  join_update(s);
}
/// `finish_gathers` for what reads or writes the parameters or the state outside a step: between backward
/// and the step the host's updates during backward end first, dropped (stage 3's host shard, which they
/// write in place, put back), and the step then runs as without them; an update the delayed update left
/// unpublished is published (with several ranks at stages 2-3 its all-gathers make the reader a
/// collective call).
template <class S> void finish_for_reader(S& s) {
  s.plan.end_early(false, 0.0);
  finish_gathers(s);
  // The delayed update's parameters published, so the reader sees the state's: after the last step's
  // all-gathers have ended, which another rank may still be moving into this rank's parameters.
  if (s.plan.settle()) {
    s.params([](auto& r) { r.refresh(); });
    finish_gathers(s);
  }
}

/// Ends an accumulation: zeroes the gradients (behind the update, on its stream, when it overlaps).
template <class S> void end_accumulation(S& s, bool applied) {
  if (applied && s.overlap) {
    s.plan.zero_gradients(&s.overlap->stream());
    s.overlap->close();
  } else {
    s.plan.zero_gradients(nullptr);
  }
  ++s.counters.boundaries;
  if (s.cfg.wall_clock_breakdown && s.cfg.steps_per_print) {
    s.log.print_if_due(*s.cfg.steps_per_print, s.counters.boundaries, s.comm.rank(), s.counters.applied_steps);
  }
}

/// Parameters on NVMe: when a gather's read failed on any rank since the last `step()` (the rank uploaded
/// zeros instead and went on, so every rank made the same collectives), every rank drops this accumulation:
/// its gradients are zeroed and the next micro-step starts it again. A read of the persistent parameters
/// after a step is reported at the next `step()`, which drops that one.
template <class S> void check_reads(S& s) {
  auto* file = s.params.param_file();
  if (file == nullptr) {
    return;
  }
  const std::exception_ptr mine = file->take_read_error();
  if (!s.parts.any_rank(mine != nullptr)) {
    return;
  }
  s.counters.micro_step -= s.counters.micro_step % s.cfg.gradient_accumulation_steps;
  s.params([](auto& p) {
    p.end_step(false);
    p.refresh(); // the persistent parameters are read again (a failed read may have been theirs)
  });
  s.plan.zero_gradients(nullptr); // the device's, or the host's copy when they stream there
  begin_micro_step(s);
  throw_agreed(mine, "could not read its parameters from NVMe",
               "; the micro-batches of this accumulation were dropped (their gradients are zeroed): run "
               "them again");
}

/// `step()` up to the gradients' check: the reductions finished and, on the last micro-step of an
/// accumulation, `g` their check (this engine's parameters only). \returns the step's result so far.
template <class S> step_result check_step(S& s, grad_check& g) {
  check_final(s, "step");
  finish_gathers(s); // the optimizer rewrites the parameters the last step's all-gathers wrote
  step_result r{.boundary = is_boundary(s), .loss_scale = s.scaler.scale(), .step = s.counters.applied_steps};
  {
    auto t = s.log.time("reduce");
    s.reducer->finish(s.cfg.zero_optimization.ignore_unused_parameters);
    s.plan.landed();
  }
  check_reads(s);
  ++s.counters.micro_step;
  if (r.boundary) {
    auto t = s.log.time("step");
    g = s.plan.check(unscale(s));
  }
  return r;
}

/// AdamW over the rank's part with the clip of gradient norm `norm` (the plan's `apply`: segment by segment
/// on the update stream, each handed to the residency behind its update, or all at once on the engine's
/// stream), then the agreement on its NVMe writes (the plan's `end_writes`).
template <class S> void apply(S& s, double norm) {
  const auto args = adamw_args_from_config(*s.cfg.optimizer, s.counters.applied_steps + 1,
                                           clip_coefficient(norm, s.cfg.gradient_clipping), s.scheduler);
  s.plan.apply(args, [&](std::size_t k, const auto& on) { s.params([&](auto& r) { r.after_update(k, on); }); });
  if (auto e = s.plan.end_writes(s.params.param_file(), [&] { finish_gathers(s); })) {
    s.applied_error = e;
  }
  s.scheduler.step();
  ++s.counters.applied_steps;
}

/// The rest of `step()`: the loss scale, the clip of norm `g.norm`, AdamW and the parameters made whole
/// again, `g` being this engine's check (`check_step`) or that of the engines stepped together.
template <class S> step_result finish_step(S& s, step_result r, const grad_check& g) {
  bool applied = false;
  if (r.boundary) {
    const loss_scaler_state scaler_before = s.scaler.state();
    applied = s.scaler.update(g.overflow).applied;
    s.plan.end_early(applied, g.norm);
    r.overflow = g.overflow;
    r.grad_norm = g.norm;
    r.lr = s.scheduler.group_lr(s.cfg.optimizer->lr);
    if (applied) {
      auto t = s.log.time("step");
      try {
        apply(s, g.norm);
      } catch (const io_error&) {
        // NVMe: some rank could not write its state; every rank is back at the previous step.
        s.scaler.load_state(scaler_before);
        s.params([](auto& p) { p.end_step(false); });
        end_accumulation(s, false);
        begin_micro_step(s);
        throw;
      }
      r.applied = true;
      r.step = s.counters.applied_steps;
    }
  }
  s.params([&](auto& p) { p.end_step(applied); });
  if (r.boundary) {
    end_accumulation(s, applied);
  }
  r.next_loss_scale = s.scaler.scale();
  begin_micro_step(s);
  if (s.applied_error) {
    std::rethrow_exception(std::exchange(s.applied_error, nullptr));
  }
  return r;
}

/// The engine's `param`: the parameter as the framework computes with it, whole, in its dtype.
template <class S> tensor_view param_view(const S& s, param_handle h) {
  const auto& e = s.reg.at(h, "param");
  const auto& p = s.reg.info(e);
  const std::size_t esize = size_of(p.type);
  if (!e.trainable) {
    // A const engine still hands out writable views: frameworks write parameters through them.
    return {const_cast<std::byte*>(s.frozen.data()) + p.offset * esize, p.type, p.shape, p.numel};
  }
  const auto& seg = s.reg.layout().segments()[p.segment];
  std::byte* whole = s.params([&](const auto& r) {
    return r.full(p.segment, r.sharded_store ? "parameter \"" + p.name + "\" of module \"" +
                                                   s.reg.module_names()[static_cast<std::size_t>(e.module)] + "\""
                                             : std::string());
  });
  return {whole + (p.offset - seg.range.begin) * esize, p.type, p.shape, p.numel};
}

/// The engine's `stores`: where parameter values live, after every kernel and all-gather so far (a host wait).
template <class S> param_stores stores(S& s) {
  finish_for_reader(s);
  s.backend.synchronize(s.stream);
  const auto& f = s.reg.frozen_layout();
  return {s.params([](auto& r) { return r.store(); }), s.params([](auto& r) { return r.store_elements(); }),
          s.frozen.data(), f.param_count() > 0 ? f.total_size() * size_of(f.type()) : 0};
}

/// The engine's `restore`: a checkpoint's progress taken, the parameters made whole again from the rewritten
/// store, and the micro-step reopened.
template <class S>
void restore(S& s, const step_counters& c, const std::optional<loss_scaler_state>& scaler,
             std::int64_t lr_last_batch_iteration) {
  s.counters = c;
  if (scaler && s.scaler.dynamic()) {
    s.scaler.load_state(*scaler);
  }
  s.scheduler.set_last_batch_iteration(lr_last_batch_iteration);
  s.params([](auto& r) { r.refresh(); });
  begin_micro_step(s);
}

/// Fills `count` elements of `p` from element `first` on with `fn`'s values, as `type`, into `dst`.
template <class S>
void fill_param(S& s, const init_fn& fn, const param_info& p, std::size_t first, std::size_t count, dtype type,
                std::byte* dst) {
  visit_float(type, [&]<class P>(type_tag<P>) {
    fill_from_host<S::allocator_type::host_accessible>(
        s.backend, s.stream, s.buffer_alloc, count, reinterpret_cast<P*>(dst),
        [&](std::size_t done, std::span<float> out) { fn(p, first + done, out); });
  });
}

/// The engine's `init_params`: `fn` fills the elements this rank owns in fp32, rounded to the parameter
/// dtype (the master keeps those values, or `fn`'s exactly with `init_master_exact`); frozen parameters
/// are filled whole. Stage 3 without a parameter shard fills the master, its only home.
template <class S> void init_params(S& s, const init_fn& fn) {
  finish_for_reader(s); // nothing of an earlier step may still write the parameters or the state
  const std::size_t esize = size_of(s.cfg.param_dtype());
  std::byte* store = s.params([](auto& r) { return r.store(); });
  const auto owned = s.reg.owned_by(s.comm.rank(), s.cfg.stage());
  std::vector<float> values;
  for (const auto& pc : owned) {
    if (store != nullptr) {
      fill_param(s, fn, s.reg.layout().param(pc.id), pc.param_offset, pc.count, s.cfg.param_dtype(),
                 store + pc.store * esize);
      continue;
    }
    constexpr std::size_t chunk = std::size_t{1} << 20;
    for (std::size_t done = 0; done < pc.count; done += chunk) {
      values.resize(std::min(chunk, pc.count - done));
      fn(s.reg.layout().param(pc.id), pc.param_offset + done, values);
      if (!s.init_master_exact) { // rounded through the parameter dtype, as load_master would from a store
        visit_float(s.cfg.param_dtype(), [&]<class P>(type_tag<P>) {
          for (float& x : values) {
            x = to_float(from_float<P>(x));
          }
        });
      }
      s.plan.write_state(state_tensor::master, pc.state + done, values);
    }
  }
  const auto& frozen = s.reg.frozen_layout();
  for (std::size_t id = 0; id < frozen.param_count(); ++id) {
    const auto& p = frozen.param(id);
    fill_param(s, fn, p, 0, p.numel, p.type, s.frozen.data() + p.offset * esize);
  }
  // The master copy takes the values the framework gave, rounded as the parameters are (or exact).
  s.plan.load_master();
  if (s.plan.has_master() && s.init_master_exact && store != nullptr) {
    for (const auto& pc : owned) {
      values.resize(pc.count);
      fn(s.reg.layout().param(pc.id), pc.param_offset, values);
      s.plan.write_state(state_tensor::master, pc.state, values);
    }
  }
  s.params([](auto& r) { r.refresh(); });
}

/// Bytes per tag from the counting allocator, beside the ZeRO formula, with what the plan and stage 3's
/// residency keep apart (the host's, NVMe's, hpZ's secondary partition).
template <class S> memory_report memory_of(const S& s) {
  auto m =
      make_memory_report(s.cfg.stage(), s.comm.size(), s.reg.layout(), s.cfg.grad_accum_dtype, s.state_alloc,
                         s.buffer_alloc, s.work_alloc, s.cfg.optimizer ? rule_state_of(*s.cfg.optimizer).first : 2);
  s.plan.add_memory(m, s.split);
  if constexpr (can_all_gather<typename S::comm_type>) {
    const auto* c = s.params.coordinator();
    add_secondary(m, c != nullptr ? c->secondary_bytes() : 0, s.cfg.zero_optimization.zero_hpz_partition_size);
    if (c != nullptr && c->params_from_master()) {
      drop_param_shard(m);
    } else if (c != nullptr && c->file() != nullptr) {
      add_nvme_params(m, c->file()->host_memory(), c->file()->file_bytes(), c->file()->resident_elements());
    } else if (c != nullptr && c->host_memory() != nullptr) {
      add_host_params(m, *c->host_memory(), s.plan.host_param_share(m));
    }
  }
  return m;
}

} // namespace zero::detail
