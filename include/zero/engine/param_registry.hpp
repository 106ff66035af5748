#pragma once
/// \file
/// `param_registry`: what a framework registers before `finalize` — modules, trainable and frozen
/// parameters, parameter groups — and the layouts they become. No memory and no backend: the
/// engine allocates from what the registry lays out.
///
/// Trainable parameters go into one flat layout, frozen ones into another (kept whole on every
/// rank). At stage 3 parameters smaller than stage3_param_persistence_threshold go to a module of
/// their own, "zero.persistent", kept whole on every rank too. Parameter groups are made as
/// parameters ask for them: one per distinct (lr, weight decay).

#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/step/adamw_placement.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// The options the engine finalizes its registry with at `stage` over `world` ranks (the one rule, which
/// zero-estimate lays a described model out by too): every parameter aligned to `buffer_alignment` bytes; at
/// stages 0-2 the segments are reduce buckets of `reduce_bucket_size` elements of `type`, at stage 3 one segment
/// per module, the unit gathered.
[[nodiscard]] inline layout_options registry_layout(int stage, int world, std::int64_t reduce_bucket_size,
                                                    dtype type) noexcept {
  return {.world_size = world,
          .alignment_bytes = buffer_alignment,
          .grouping = stage == 3 ? segment_by::module : segment_by::bucket,
          .segment_bytes = static_cast<std::size_t>(reduce_bucket_size) * size_of(type)};
}

/// The `persistence` of the engine's registry: stage 3's stage3_param_persistence_threshold, none (0) at stages
/// 0-2.
[[nodiscard]] inline std::size_t registry_persistence(int stage, std::int64_t threshold) noexcept {
  return stage == 3 ? static_cast<std::size_t>(threshold) : 0;
}

/// Modules, parameters and groups; see the file comment.
class param_registry {
public:
  /// One registered parameter: which layout (`trainable`), its id there, its group and module.
  struct entry {
    bool trainable = true;
    bool tensor_replicated = false;
    int tensor_split = -1;
    std::size_t id = 0;
    std::size_t group = 0;
    int module = 0;
  };

  /// \param type        the parameters' dtype.
  /// \param default_lr  lr and \param default_wd weight decay of parameters that name none.
  /// \param persistence stage 3: parameters of fewer elements stay whole (0: none do).
  param_registry(dtype type, double default_lr, double default_wd, std::size_t persistence)
      : layout_(type), frozen_(type), default_lr_(default_lr), default_wd_(default_wd), persistence_(persistence) {}

  /// Registers a module; \returns its id. \throws usage_error after finalize.
  int add_module(const std::string& name) {
    const int id = frozen_.add_module(name);
    layout_module_.push_back(layout_.add_module(name));
    names_.push_back(name);
    return id;
  }

  /// Registers a parameter of `module`; \returns its handle.
  /// \throws usage_error for a taken name, an unknown module, or a bad shape (the layout's message).
  param_handle add_param(int module, const std::string& name, const std::vector<std::int64_t>& shape,
                         const param_options& opt) {
    if (layout_.find(name) || frozen_.find(name)) {
      throw usage_error("add_param: parameter \"" + name + "\" is already registered");
    }
    if (module < 0 || static_cast<std::size_t>(module) >= names_.size()) {
      throw usage_error("add_param(\"" + name + "\"): module id " + std::to_string(module) +
                        " was not made by add_module (" + std::to_string(names_.size()) + " modules are registered)");
    }
    if (opt.tensor_split < -1 || opt.tensor_split >= static_cast<int>(shape.size())) {
      throw usage_error("add_param(\"" + name + "\"): tensor_split " + std::to_string(opt.tensor_split) +
                        " is not a dimension of its " + std::to_string(shape.size()) +
                        "-dimensional shape (expected -1 for a whole parameter, or 0 to " +
                        std::to_string(static_cast<int>(shape.size()) - 1) + ")");
    }
    if (opt.tensor_split >= 0 && opt.tensor_replicated) {
      throw usage_error("add_param(\"" + name + "\"): tensor_split " + std::to_string(opt.tensor_split) +
                        " and tensor_replicated together; a slice of a split parameter differs between tensor "
                        "ranks, a replicated one is the same on all: expected one of the two");
    }
    entry e{.trainable = opt.trainable,
            .tensor_replicated = opt.tensor_replicated,
            .tensor_split = opt.tensor_split,
            .module = module};
    if (opt.trainable) {
      int layout_module = layout_module_[static_cast<std::size_t>(module)];
      if (numel_of(shape) < persistence_) {
        if (persistent_module_ < 0) {
          persistent_module_ = layout_.add_module("zero.persistent");
        }
        layout_module = persistent_module_;
      }
      e.id = layout_.add(name, shape, layout_.type(), layout_module);
      e.group = group_index(opt);
    } else {
      e.id = frozen_.add(name, shape, frozen_.type(), module);
    }
    entries_.push_back(e);
    return {entries_.size() - 1};
  }

  /// Lays both layouts out: trainable parameters for `opt.world_size` ranks, frozen ones whole.
  void finalize(const layout_options& opt) {
    layout_.finalize(opt);
    if (frozen_.param_count() > 0) {
      frozen_.finalize({.world_size = 1, .alignment_bytes = opt.alignment_bytes});
    }
  }

  /// The flat extents of the trainable parameters registered `tensor_replicated` (after finalize).
  [[nodiscard]] std::vector<flat_range> tensor_replicated_extents() const {
    std::vector<flat_range> out;
    for (const auto& e : entries_) {
      if (e.trainable && e.tensor_replicated) {
        const auto& p = layout_.param(e.id);
        out.push_back({p.offset, p.offset + p.numel});
      }
    }
    return out;
  }

  /// The entry of handle `h`. \throws usage_error naming `what` for a handle of another engine.
  [[nodiscard]] const entry& at(param_handle h, const char* what) const {
    if (h.index >= entries_.size()) {
      throw usage_error(std::string(what) + ": parameter handle " + std::to_string(h.index) +
                        " was not made by this engine (" + std::to_string(entries_.size()) +
                        " parameters are registered)");
    }
    return entries_[h.index];
  }
  /// The layout entry `e` lives in, and its parameter there.
  [[nodiscard]] const flat_layout& layout_of(const entry& e) const noexcept { return e.trainable ? layout_ : frozen_; }
  [[nodiscard]] const param_info& info(const entry& e) const { return layout_of(e).param(e.id); }

  /// The handle of a parameter by name. \throws usage_error when there is none.
  [[nodiscard]] param_handle find(const std::string& name) const {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      if (info(entries_[i]).name == name) {
        return {i};
      }
    }
    throw usage_error("no parameter named \"" + name + "\" is registered");
  }

  /// \throws usage_error for a module id add_module did not make.
  void check_module(int m) const {
    if (m < 0 || static_cast<std::size_t>(m) >= names_.size()) {
      throw usage_error("module id " + std::to_string(m) + " was not made by add_module (" +
                        std::to_string(names_.size()) + " modules are registered)");
    }
  }

  /// Every parameter, in registration order.
  [[nodiscard]] std::vector<registered_param> registered() const {
    std::vector<registered_param> out;
    for (const auto& e : entries_) {
      out.push_back({&info(e), e.trainable, e.group, names_[static_cast<std::size_t>(e.module)], e.tensor_split});
    }
    return out;
  }

  /// After finalize: the pieces rank `rank` owns at ZeRO stage `stage` — its shard's (stages 1-3,
  /// stored at their shard offset at stage 3, at their flat offset at 1-2), or every parameter whole
  /// (stage 0).
  [[nodiscard]] std::vector<owned_piece> owned_by(int rank, int stage) const {
    std::vector<owned_piece> out;
    if (stage == 0) {
      for (std::size_t id : layout_.flat_order()) {
        const auto& p = layout_.param(id);
        out.push_back({id, 0, p.numel, p.offset, p.offset});
      }
      return out;
    }
    for (const auto& pc : layout_.pieces(rank)) {
      out.push_back(
          {pc.param, pc.param_offset, pc.count, pc.shard_offset, stage == 3 ? pc.shard_offset : pc.flat_offset});
    }
    return out;
  }

  /// The group of every trainable parameter, by id in the trainable layout.
  [[nodiscard]] std::vector<std::size_t> group_of() const {
    std::vector<std::size_t> out(layout_.param_count());
    for (const auto& e : entries_) {
      if (e.trainable) {
        out[e.id] = e.group;
      }
    }
    return out;
  }

  /// Stages 0-2, after finalize: for each module, the segments (reduce buckets) its parameters lie in.
  [[nodiscard]] std::vector<std::vector<std::size_t>> module_segments() const {
    std::vector<std::vector<std::size_t>> out(names_.size());
    for (const auto& e : entries_) {
      if (e.trainable) {
        auto& segs = out[static_cast<std::size_t>(e.module)];
        const std::size_t seg = layout_.param(e.id).segment;
        if (std::find(segs.begin(), segs.end(), seg) == segs.end()) {
          segs.push_back(seg);
        }
      }
    }
    return out;
  }

  /// Stage 3, after finalize (one segment per layout module): for each module the units gathering it
  /// brings in, and the units of persistent parameters.
  [[nodiscard]] std::pair<std::vector<std::vector<std::size_t>>, std::vector<std::size_t>> module_units() const {
    std::vector<std::vector<std::size_t>> units(names_.size());
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
    return {std::move(units), std::move(persistent)};
  }

  [[nodiscard]] const flat_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] const flat_layout& frozen_layout() const noexcept { return frozen_; }
  [[nodiscard]] const std::vector<std::string>& module_names() const noexcept { return names_; }
  [[nodiscard]] const std::vector<param_group>& groups() const noexcept { return groups_; }
  [[nodiscard]] const std::vector<entry>& entries() const noexcept { return entries_; }

private:
  static std::size_t numel_of(const std::vector<std::int64_t>& shape) {
    std::size_t n = 1;
    for (auto d : shape) {
      n *= static_cast<std::size_t>(std::max<std::int64_t>(d, 0));
    }
    return n;
  }

  std::size_t group_index(const param_options& opt) {
    const double lr = opt.lr.value_or(default_lr_);
    const double wd = opt.weight_decay.value_or(default_wd_);
    for (std::size_t i = 0; i < groups_.size(); ++i) {
      if (groups_[i].lr == lr && groups_[i].weight_decay == wd) {
        return i;
      }
    }
    groups_.push_back({lr, wd});
    return groups_.size() - 1;
  }

  flat_layout layout_;
  flat_layout frozen_;
  double default_lr_;
  double default_wd_;
  std::size_t persistence_;
  std::vector<entry> entries_;
  std::vector<param_group> groups_;
  std::vector<int> layout_module_; // per module id: its module in the trainable layout
  std::vector<std::string> names_;
  int persistent_module_ = -1;
};

} // namespace zero
