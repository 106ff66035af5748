#pragma once
/// \file
/// Sharded checkpoints of a `basic_engine`: `eng.save(dir, tag)` and `eng.load(dir, tag)`, and the
/// offline `checkpoint::reader` the `zero-ckpt` tool uses. Include this header (and link
/// `zero::checkpoint`, which brings libxxhash) wherever an engine's `save` or `load` is called.
///
/// A checkpoint is a directory `dir/tag` holding `manifest.json` (see manifest.hpp), one shard file
/// per rank that owns optimizer state (`rank-00000.bin`, ...: fp32 master, m and v of the elements
/// the rank owns; at stage 0 rank 0 writes everything) and `frozen.bin` (frozen parameters, written
/// by rank 0), and `manifest.xxh64`, the commit marker: the xxh64 of the manifest's bytes.
/// `dir/latest` holds the tag of the last complete checkpoint and the tag's xxh64. With the
/// manifest's xxh64 of every data file, every byte of a checkpoint is under a checksum.
///
/// Saving is atomic: everything is written into `dir/.tmp-<tag>`, every file fsync'd, the
/// directory fsync'd, then moved to `dir/tag` (an existing `dir/tag` is swapped out in one
/// renameat2(RENAME_EXCHANGE), or, where the file system cannot, first moved aside to
/// `dir/.old-<tag>`, which a load of `tag` falls back to), and only then is `latest` replaced by
/// write-tmp, fsync, rename, fsync of `dir`. A crash at any point leaves the previous checkpoint
/// loadable and `latest` naming a complete one; a save that fails removes its temporary folder.
///
/// Loading reads the manifest's piece tables: each rank reads (pread) exactly the element ranges it
/// owns in the loading run, whatever world size and stage saved them, verifies the size and xxh64
/// of every file it reads (opened without following links: a checkpoint holds none), and stages
/// everything before anything in the engine changes; the ranks
/// agree (one all-reduce) before any of them commits, so a failed load leaves every rank's engine
/// as it was.
///
/// With HSDP (`mics_shard_size`) the checkpoint is the first shard group's: its ranks write, the
/// other groups (which hold the same state) only agree, and every group loads from it, so it loads
/// into any shard size or a plain engine like any other (docs/zeropp.md, "HSDP").

#include "zero/checkpoint/access.hpp"
#include "zero/checkpoint/detail/zenflow_state.hpp"
#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/checkpoint/model_reader.hpp"
#include "zero/checkpoint/reader.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/engine/engine.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace zero {

namespace checkpoint {
namespace detail {

/// The manifest's "optimizer" entry of an engine running `cfg`: its rule and the state tensors it keeps.
inline optimizer_entry optimizer_of(const config& cfg) {
  optimizer_entry e;
  if (cfg.optimizer) {
    e.type = rule_name_of(*cfg.optimizer);
    const auto [count, names] = rule_state_of(*cfg.optimizer);
    e.state.assign(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(count));
  }
  return e;
}

/// "Lion (exp_avg)", "SGD (no state)": a rule and its state tensors, for messages.
inline std::string rule_text(const optimizer_entry& e) {
  std::string names;
  for (const auto& n : e.state) {
    names += cat(names.empty() ? "" : ", ", n);
  }
  return cat(e.type, " (", names.empty() ? "no state" : names, ")");
}

} // namespace detail

/// Saves `eng` as checkpoint `tag` of `root` (of `root/pipe-PP-tensor-TT` for an engine in a
/// model-parallel job: `model_dir`); collective over the engine's communicator. Call it between
/// optimizer steps (at an accumulation boundary).
/// \throws usage_error for a bad tag, an engine not finalized, a call inside an accumulation, or a model-parallel
/// engine running ZenFlow; io_error naming the file when writing fails (the
/// previous checkpoint and `latest` are untouched).
template <class Engine>
void save(Engine& eng, const std::filesystem::path& root, const std::string& tag, const save_options& opt = {}) {
  using access = checkpoint_access<Engine>;
  using detail::cat;
  namespace fs = std::filesystem;
  detail::check_tag(tag);
  if (!access::finalized(eng)) {
    throw usage_error("save before finalize(); register and finalize the parameters first");
  }
  const fs::path dir = model_dir(eng, root);
  auto& comm = access::comm(eng);
  const int rank = comm.rank();
  const int world = comm.size();
  // With HSDP the first shard group writes; the others hold the same state and only agree.
  const bool writes = access::writes(eng);
  const config& cfg = eng.cfg();
  if (eng.counters().micro_step % cfg.gradient_accumulation_steps != 0) {
    throw usage_error(cat(
        "save(\"", tag, "\") inside a gradient accumulation (micro-step ", std::to_string(eng.counters().micro_step),
        " of ", std::to_string(cfg.gradient_accumulation_steps), "); save after the step() that ends an accumulation"));
  }
  auto* zen = eng.optimizer().zenflow();
  if (zen != nullptr && eng.model_place() != nullptr) {
    throw usage_error(cat("save(\"", tag,
                          "\") of a model-parallel engine running ZenFlow (zero_optimization.zenflow): its window "
                          "and chosen columns are saved for data-parallel engines only; nothing was written"));
  }
  auto event = [&](std::string_view what, std::size_t index = 0) {
    if (opt.observer) {
      opt.observer(save_event{rank, what, index});
    }
  };
  const flat_layout& layout = eng.layout();
  const flat_layout& frozen = access::frozen_layout(eng);
  const auto registered = access::params(eng);

  // The manifest, the same on every rank but for the files' sizes and hashes.
  manifest m;
  m.tag = tag;
  m.world_size = world;
  m.stage = cfg.stage();
  m.param_dtype = layout.type();
  m.grad_dtype = cfg.grad_accum_dtype;
  m.config_xxh64 = detail::xxh64_of(cfg.to_json().dump());
  m.global_steps = eng.counters().applied_steps;
  m.micro_steps = eng.counters().micro_step;
  m.boundaries = eng.counters().boundaries;
  m.scaler_dynamic = eng.scaler().dynamic();
  m.scaler = eng.scaler().state();
  m.lr_last_batch_iteration = eng.scheduler().last_batch_iteration();
  m.modules = frozen.modules();
  if (const auto* at = eng.model_place()) {
    m.model = model_entry{at->pipe, at->tensor, at->tensor_size};
  }
  for (const auto& g : eng.optimizer().groups()) {
    m.groups.emplace_back(g.lr, g.weight_decay);
  }
  m.optimizer = detail::optimizer_of(cfg);
  const std::size_t state_tensors = m.optimizer.state.size();
  std::vector<std::size_t> index_of_layout_id(layout.param_count());
  std::vector<std::size_t> index_of_frozen_id(frozen.param_count());
  for (const auto& r : registered) {
    (r.trainable ? index_of_layout_id
                 : index_of_frozen_id)[r.trainable ? *layout.find(r.info->name) : *frozen.find(r.info->name)] =
        m.params.size();
    m.params.push_back(
        {r.info->name, r.info->shape, r.info->type, r.module, r.trainable, r.group, r.info->numel, r.tensor_split});
  }
  std::vector<std::vector<typename access::owned>> owned(static_cast<std::size_t>(world));
  for (int q = 0; q < world; ++q) {
    if (m.stage == 0 && q > 0) {
      break; // every rank holds everything; rank 0 writes it
    }
    owned[static_cast<std::size_t>(q)] = access::owned_by(eng, q);
    if (owned[static_cast<std::size_t>(q)].empty()) {
      continue;
    }
    file_entry fe{detail::shard_name(q), "shard", q, 0, 0, {}};
    std::uint64_t at = 0;
    for (const auto& o : owned[static_cast<std::size_t>(q)]) {
      fe.pieces.push_back({index_of_layout_id[o.id], o.param_offset, o.count, at});
      at += o.count * m.shard_element_bytes();
    }
    fe.size = at;
    m.files.push_back(std::move(fe));
  }
  const std::size_t shard_files = m.files.size();
  if (zen != nullptr) {
    detail::add_zenflow(m, *zen, layout, index_of_layout_id, shard_files); // files [shard_files, 2 shard_files)
  }
  if (frozen.param_count() > 0) {
    file_entry fe{"frozen.bin", "frozen", 0, 0, 0, {}};
    std::uint64_t at = 0;
    for (std::size_t id : frozen.flat_order()) {
      const auto& p = frozen.param(id);
      fe.pieces.push_back({index_of_frozen_id[id], 0, p.numel, at});
      at += p.numel * size_of(p.type);
    }
    fe.size = at;
    m.files.push_back(std::move(fe));
  }

  const fs::path tmp = dir / (".tmp-" + tag);
  const fs::path final_dir = dir / tag;
  // A save that fails removes what it wrote (a full disk must not stay full); it runs after an
  // agreement, when no rank writes any more. What is in tmp then is this save's partial output, or
  // after an exchange the replaced old checkpoint of this tag; nothing published is touched.
  struct cleanup {
    const fs::path& tmp;
    fs::path latest_tmp;
    bool armed;
    ~cleanup() {
      if (armed) {
        std::error_code ec;
        fs::remove_all(tmp, ec);
        fs::remove(latest_tmp, ec);
      }
    }
  } on_failure{tmp, dir / ".latest.tmp", rank == 0 && writes};
  std::exception_ptr err;
  try {
    if (rank == 0 && writes) {
      if (!fs::is_directory(dir) && fs::create_directories(dir) && dir != root) {
        detail::sync_dir(root); // the coordinates' folder is durable in the job's
      }
      fs::remove_all(tmp); // what a crashed save of this tag left
      fs::create_directory(tmp);
      detail::sync_dir(dir);
      event("tmp_dir_created");
    }
  } catch (const fs::filesystem_error& e) {
    err = std::make_exception_ptr(io_error(cat(tmp.string(), ": ", e.what())));
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("save(\"", tag, "\"): creating ", tmp.string()));

  // Each rank writes its shard: master and the rule's state (AdamW's m, v) per piece; and with ZenFlow its window's
  // file.
  std::vector<std::int64_t> sums(4 * static_cast<std::size_t>(world), 0);
  try {
    const auto& mine = owned[static_cast<std::size_t>(rank)];
    if (!mine.empty() && writes) {
      (void)eng.stores(); // after every kernel and all-gather so far
      auto& optim = eng.optimizer();
      // Host copies of the rank's state, wherever it lives (the backend, host memory).
      const std::size_t n_state = optim.state_size();
      // The master, then the rule's state tensors (Adam's m and v), each as a whole.
      std::vector<std::vector<float>> t(1 + state_tensors, std::vector<float>(n_state));
      optim.read_state(state_tensor::master, 0, t[0]);
      for (std::size_t j = 0; j < state_tensors; ++j) {
        optim.read_state(state_tensor_at(j), 0, t[1 + j]);
      }
      detail::hashing_writer w(tmp / detail::shard_name(rank));
      event("shard_created");
      std::size_t k = 0;
      for (const auto& o : mine) {
        for (const auto& tensor : t) {
          w.write(tensor.data() + o.state, o.count * sizeof(float));
        }
        event("shard_piece", k++);
      }
      w.finish();
      event("shard_synced");
      sums[2 * static_cast<std::size_t>(rank)] = static_cast<std::int64_t>(w.size());
      sums[2 * static_cast<std::size_t>(rank) + 1] = std::bit_cast<std::int64_t>(w.digest());
      if (zen != nullptr) {
        detail::hashing_writer z(tmp / detail::zenflow_file_name(rank));
        for (const auto& o : mine) {
          z.write(zen->window().data() + o.state, o.count * sizeof(float));
        }
        z.finish();
        sums[2 * static_cast<std::size_t>(world + rank)] = static_cast<std::int64_t>(z.size());
        sums[2 * static_cast<std::size_t>(world + rank) + 1] = std::bit_cast<std::int64_t>(z.digest());
      }
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("save(\"", tag, "\"): writing the shards"));
  if (world > 1) {
    // Each rank fills its own pair; the others are zero, so the sum is exact.
    access::all_reduce(eng, sums.data(), sums.size(), reduce_op::sum);
  }

  try {
    if (rank == 0 && writes) {
      for (std::size_t f = 0; f < (zen != nullptr ? 2 : 1) * shard_files; ++f) {
        auto& fe = m.files[f];
        const auto q = static_cast<std::size_t>(fe.rank) + (f < shard_files ? 0 : static_cast<std::size_t>(world));
        if (static_cast<std::uint64_t>(sums[2 * q]) != fe.size) {
          throw io_error(cat((tmp / fe.name).string(), ": rank ", std::to_string(q), " wrote ",
                             std::to_string(sums[2 * q]), " bytes, expected ", std::to_string(fe.size)));
        }
        fe.xxh64 = std::bit_cast<std::uint64_t>(sums[2 * q + 1]);
      }
      if (frozen.param_count() > 0) {
        auto& fe = m.files.back();
        detail::hashing_writer w(tmp / fe.name);
        const auto st = eng.stores();
        const auto frozen_host = access::read(eng, static_cast<const std::byte*>(st.frozen), st.frozen_bytes);
        const std::byte* base = frozen_host.data();
        for (std::size_t id : frozen.flat_order()) {
          const auto& p = frozen.param(id);
          w.write(base + p.offset * size_of(p.type), p.numel * size_of(p.type));
        }
        w.finish();
        fe.xxh64 = w.digest();
        event("frozen_synced");
      }
      // The manifest, then its marker: the xxh64 of the manifest's bytes, so that a load detects any
      // change of them (a flipped byte_offset would otherwise read the wrong bytes as data).
      const auto [manifest_size, manifest_xxh64] = detail::write_file(tmp / manifest_name, m.to_json().dump(1));
      static_cast<void>(manifest_size);
      event("manifest_synced");
      detail::write_file(tmp / checksum_name, hex64(manifest_xxh64) + "\n");
      event("checksum_synced");
      detail::sync_dir(tmp);
      event("tmp_dir_synced");
      // Publish: the new directory takes the tag's name; an old one with that name is kept until then.
      std::error_code ec;
      if (fs::exists(final_dir, ec)) {
        if (opt.exchange && detail::exchange_paths(tmp, final_dir)) {
          event("exchanged");
          detail::sync_dir(dir);
          event("dir_synced");
          fs::remove_all(tmp); // now the old checkpoint
        } else {
          const fs::path old = dir / (".old-" + tag);
          fs::remove_all(old);
          detail::rename_path(final_dir, old);
          event("old_moved_aside");
          detail::rename_path(tmp, final_dir);
          event("renamed");
          detail::sync_dir(dir);
          event("dir_synced");
          fs::remove_all(old);
        }
      } else {
        detail::rename_path(tmp, final_dir);
        event("renamed");
        detail::sync_dir(dir);
        event("dir_synced");
      }
      // What a save of this tag that crashed between its two renames left aside is not needed now.
      fs::remove_all(dir / (".old-" + tag));
      event("old_removed");
      const fs::path& latest_tmp = on_failure.latest_tmp;
      detail::write_file(latest_tmp, detail::latest_text(tag));
      event("latest_tmp_synced");
      detail::rename_path(latest_tmp, dir / "latest");
      event("latest_renamed");
      detail::sync_dir(dir);
      event("latest_dir_synced");
    }
  } catch (const fs::filesystem_error& e) {
    err = std::make_exception_ptr(io_error(cat(dir.string(), ": ", e.what())));
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("save(\"", tag, "\"): publishing"));
  on_failure.armed = false;
  event("done");
}

/// Loads checkpoint `tag` of `root` ("latest": the one `latest` names) into `eng`, which may run at
/// another world size or stage than the saving run; collective over the engine's communicator.
/// Parameters are matched by name, and must have the same (whole) shapes and be trainable or frozen
/// alike. Optimizer state, step counts, the loss scaler and the LR scheduler are restored.
/// Model-parallel checkpoints (`model_reader`): an engine with `set_model_group` reads its stage of
/// the job's root, its tensor slices cut from the saved ones whatever tensor size saved them; an
/// engine without reads every stage, each tensor whole.
/// \throws usage_error for an unsafe tag (the check save makes); checkpoint_error naming the file
/// and what was expected (missing directory, tag or latest; a checksum that does not match; a
/// file that is a symbolic link; unknown format version; a parameter missing, extra or of another
/// shape; slices that do not belong together; a truncated or corrupt file); the engine is unchanged
/// on every rank then.
template <class Engine> void load(Engine& eng, const std::filesystem::path& root, const std::string& tag = "latest") {
  using access = checkpoint_access<Engine>;
  using detail::cat;
  if (!access::finalized(eng)) {
    throw usage_error("load before finalize(); register and finalize the parameters first");
  }
  auto& comm = access::comm(eng);
  const config& cfg = eng.cfg();
  if (eng.counters().micro_step % cfg.gradient_accumulation_steps != 0) {
    throw usage_error(cat("load(\"", tag, "\") inside a gradient accumulation (micro-step ",
                          std::to_string(eng.counters().micro_step), "); load between optimizer steps"));
  }
  const flat_layout& layout = eng.layout();
  const flat_layout& frozen = access::frozen_layout(eng);
  const auto mine = access::owned_by(eng, comm.rank());
  const model_coords* at = eng.model_place();

  // Staging: everything this rank will hold, read and verified before anything changes.
  std::optional<model_reader> rd;
  std::size_t total = 0;
  for (const auto& o : mine) {
    total += o.count;
  }
  // The rule's state tensors, in a shard piece's order: AdamW's exp_avg and exp_avg_sq, or fewer.
  const optimizer_entry rule = detail::optimizer_of(cfg);
  constexpr tensor_kind slot_kind[] = {tensor_kind::exp_avg, tensor_kind::exp_avg_sq};
  std::vector<float> master(total);
  std::vector<std::vector<float>> state(rule.state.size(), std::vector<float>(total));
  std::vector<float> window; // ZenFlow's, when the engine runs it and the checkpoint holds one
  auto* zen = eng.optimizer().zenflow();
  std::vector<std::vector<float>> frozen_values(frozen.param_count());
  std::exception_ptr err;
  try {
    rd.emplace(root, tag, at != nullptr ? at->pipe : -1);
    const manifest& m = rd->info();
    const std::string source = (rd->parts().front()->path() / manifest_name).string();
    if (m.optimizer != rule) {
      throw checkpoint_error(cat(source, ": holds the state of ", detail::rule_text(m.optimizer), "; this engine runs ",
                                 detail::rule_text(rule),
                                 " (optimizer.type and its state must be those that saved it)"));
    }
    // Per layout id: the saved parameter, and the cut of it this engine holds.
    std::vector<std::size_t> saved_index_of_layout(layout.param_count());
    std::vector<std::size_t> saved_index_of_frozen(frozen.param_count());
    std::vector<detail::held_slice> held_of_layout(layout.param_count()), held_of_frozen(frozen.param_count());
    std::vector<bool> matched(m.params.size(), false);
    for (const auto& r : access::params(eng)) {
      const auto& p = *r.info;
      auto held = detail::held_slice_of(eng, r);
      const std::ptrdiff_t i = m.find(p.name);
      if (i < 0) {
        throw checkpoint_error(
            cat(source, ": has no parameter \"", p.name, "\"; the model registered it with shape ", held.text));
      }
      const auto& s = m.params[static_cast<std::size_t>(i)];
      if (s.shape != held.cut.whole) {
        throw checkpoint_error(cat(source, ": parameter \"", p.name, "\" has shape ", detail::shape_text(s.shape),
                                   "; the model registered ", held.text));
      }
      if (s.trainable != r.trainable) {
        throw checkpoint_error(cat(source, ": parameter \"", p.name, "\" was saved ",
                                   s.trainable ? "trainable" : "frozen", "; the model registered it ",
                                   r.trainable ? "trainable" : "frozen"));
      }
      matched[static_cast<std::size_t>(i)] = true;
      const std::size_t id = r.trainable ? *layout.find(p.name) : *frozen.find(p.name);
      (r.trainable ? saved_index_of_layout : saved_index_of_frozen)[id] = static_cast<std::size_t>(i);
      (r.trainable ? held_of_layout : held_of_frozen)[id] = std::move(held);
    }
    // An engine of one stage reading a checkpoint of the whole model leaves the other stages' parameters.
    for (std::size_t i = 0; i < m.params.size() && (at == nullptr || rd->one_stage()); ++i) {
      if (!matched[i]) {
        throw checkpoint_error(cat(source, ": has parameter \"", m.params[i].name, "\" (shape ",
                                   detail::shape_text(m.params[i].shape), ") which the model did not register"));
      }
    }
    std::size_t next = 0;
    for (const auto& o : mine) {
      const std::size_t s = saved_index_of_layout[o.id];
      const auto& h = held_of_layout[o.id];
      rd->read_slice(s, tensor_kind::master, h.cut, h.index, o.param_offset, {master.data() + next, o.count});
      for (std::size_t j = 0; j < state.size(); ++j) {
        rd->read_slice(s, slot_kind[j], h.cut, h.index, o.param_offset, {state[j].data() + next, o.count});
      }
      if (zen != nullptr && m.zenflow) {
        window.resize(total);
        rd->read_slice(s, tensor_kind::zenflow_window, h.cut, h.index, o.param_offset, {window.data() + next, o.count});
      }
      next += o.count;
    }
    for (std::size_t id = 0; id < frozen.param_count(); ++id) {
      frozen_values[id].resize(frozen.param(id).numel);
      const auto& h = held_of_frozen[id];
      rd->read_slice(saved_index_of_frozen[id], tensor_kind::master, h.cut, h.index, 0, frozen_values[id]);
    }
  } catch (...) {
    err = std::current_exception();
  }
  detail::agree(eng, err, cat("load of checkpoint \"", tag, "\" from ", root.string()));

  // Commit: nothing below reads a file.
  const manifest& m = rd->info();
  const auto st = eng.stores();
  auto& optim = eng.optimizer();
  std::byte* store = st.params;
  std::size_t next = 0;
  // Every write goes through the engine (the backend's copy when the state lives on a device).
  visit_float(layout.type(), [&]<class P>(type_tag<P>) {
    P* ps = reinterpret_cast<P*>(store);
    std::vector<P> rounded;
    for (const auto& o : mine) {
      for (std::size_t j = 0; j < state.size(); ++j) {
        optim.write_state(state_tensor_at(j), o.state, {state[j].data() + next, o.count});
      }
      // The master (for fp32 training the optimizer's own copy of the parameters, when offloaded).
      optim.write_state(state_tensor::master, o.state, {master.data() + next, o.count});
      if (ps != nullptr) { // null: stage 3 keeps no 16-bit shard, the gathers cast the master
        rounded.resize(o.count);
        for (std::size_t i = 0; i < o.count; ++i) {
          rounded[i] = from_float<P>(master[next + i]);
        }
        access::write(eng, rounded.data(), ps + o.store, o.count);
      }
      next += o.count;
    }
  });
  for (std::size_t id = 0; id < frozen.param_count(); ++id) {
    const auto& p = frozen.param(id);
    visit_float(p.type, [&]<class P>(type_tag<P>) {
      std::vector<P> values(p.numel);
      for (std::size_t i = 0; i < p.numel; ++i) {
        values[i] = from_float<P>(frozen_values[id][i]);
      }
      access::write(eng, values.data(), reinterpret_cast<P*>(st.frozen) + p.offset, p.numel);
    });
  }
  if (zen != nullptr && m.zenflow) { // after write_state, which restarts ZenFlow's window and choice
    zen->restore(m.zenflow->window_steps, detail::zenflow_columns(m, layout), m.zenflow->selected);
    std::size_t at = 0;
    for (const auto& o : mine) {
      std::copy_n(window.data() + at, o.count, zen->window().data() + o.state);
      at += o.count;
    }
  }
  // Keep accumulation boundaries aligned under this run's gradient_accumulation_steps.
  eng.restore({.applied_steps = m.global_steps,
               .micro_step = m.boundaries * cfg.gradient_accumulation_steps,
               .boundaries = m.boundaries},
              m.scaler_dynamic ? std::optional<loss_scaler_state>(m.scaler) : std::nullopt, m.lr_last_batch_iteration);
}

} // namespace checkpoint

/// What `basic_engine::save` calls (found by argument-dependent lookup once this header is included).
template <class Engine, class... Options>
void checkpoint_save(Engine& eng, const std::filesystem::path& dir, const std::string& tag, const Options&... opt) {
  checkpoint::save(eng, dir, tag, opt...);
}
/// What `basic_engine::load` calls.
template <class Engine> void checkpoint_load(Engine& eng, const std::filesystem::path& dir, const std::string& tag) {
  checkpoint::load(eng, dir, tag);
}

} // namespace zero
