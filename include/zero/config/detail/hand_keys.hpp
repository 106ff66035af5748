#pragma once
/// \file
/// The keys read by hand in the middle of their block, named by their rows in `zero/config/schema.hpp`:
/// `"auto"` resolved by Hugging Face's formulas, and values whose default, check or meaning derives
/// from other keys. Each first reads its value by its row (`read_typed`) where it can.

#include "zero/config/detail/offload_rules.hpp"
#include "zero/config/schema.hpp" // the rows that name these functions, and the settings they fill

#include <string>
#include <string_view>
#include <type_traits>

namespace zero::detail {

// ---- "auto" ----------------------------------------------------------------------------------------

inline std::optional<json> auto_zero(const parse_context&, std::string_view, const config_inputs&) { return json(0.0); }

/// The hidden size an "auto" bucket size needs; `formula` says how it is used.
inline std::int64_t hidden_size_for(const parse_context& ctx, std::string_view path, const config_inputs& in,
                                    std::string_view formula) {
  if (!in.hidden_size) {
    ctx.fail(path, cat("found \"auto\"; resolving it (", formula,
                       ") needs the model's hidden size (config_inputs::hidden_size, --hidden-size)"));
  }
  return *in.hidden_size;
}

/// h * h, which must fit in int64: h <= 3037000499.
inline std::int64_t hidden_squared(const parse_context& ctx, std::string_view path, std::int64_t h) {
  if (h < 1 || h > 3'037'000'499) {
    ctx.fail(path, cat("the hidden size given (", std::to_string(h), ") must be from 1 to 3037000499"));
  }
  return h * h;
}

// Hugging Face's formulas for "auto" bucket sizes.
inline std::optional<json> auto_hidden_squared(const parse_context& ctx, std::string_view path,
                                               const config_inputs& in) {
  return json(hidden_squared(ctx, path, hidden_size_for(ctx, path, in, "hidden_size^2")));
}

inline std::optional<json> auto_prefetch_bucket(const parse_context& ctx, std::string_view path,
                                                const config_inputs& in) {
  // floor(0.9 * x) == x - ceil(x / 10) for integer x >= 0, without going through a float.
  const std::int64_t x = hidden_squared(ctx, path, hidden_size_for(ctx, path, in, "0.9 * hidden_size^2"));
  return json(x - (x + 9) / 10);
}

inline std::optional<json> auto_persistence(const parse_context& ctx, std::string_view path, const config_inputs& in) {
  const std::int64_t h = hidden_size_for(ctx, path, in, "10 * hidden_size");
  if (h < 1 || h > i64_max / 10) {
    ctx.fail(path, cat("the hidden size given (", std::to_string(h), ") is out of range"));
  }
  return json(10 * h);
}

// ---- zero_optimization -----------------------------------------------------------------------------

inline void read_overlap_comm(const key_read<zero_optimization_config>& k) {
  k.out.overlap_comm = k.out.stage == 3; // DeepSpeed's default, set by its validator
  static_cast<void>(read_typed(k));
}

inline void read_allgather_bucket_size(const key_read<zero_optimization_config>& k) {
  const int stage = k.out.stage;
  // DeepSpeed's stage 1/2 aligns all-gather buffers to 4 bytes of 16-bit elements.
  if (read_typed(k) && (stage == 1 || stage == 2) && *k.out.allgather_bucket_size % 2 != 0) {
    k.r.ctx().fail(k.r.path_of(k.row.name), cat("found ", show(*k.r.get(k.row.name)),
                                                "; expected a multiple of 2 at stage 1 and 2 (DeepSpeed aligns "
                                                "all-gather buffers to 4 bytes)"));
  }
}

/// `offload_optimizer.ratio`: a number in [0, 1] (its row), or "auto"; refused below 1 with device
/// nvme (DeepSpeed fails there too), noted without offload.
inline void read_offload_ratio(const key_read<offload_optimizer_config>& k) {
  const json* v = k.r.get(k.row.name);
  if (v == nullptr) {
    return;
  }
  offload_optimizer_config& o = k.out;
  o.ratio_auto = is_auto(*v);
  if (!o.ratio_auto) {
    static_cast<void>(read_typed(k));
  }
  const std::string path = k.r.path_of(k.row.name);
  if (const std::string why = nvme_ratio_refusal(o); !why.empty()) {
    k.r.ctx().fail(path, why);
  }
  if (o.device == offload_device::none) {
    k.r.ctx().note(path, "no effect: device is none; ratio splits the optimizer state between the device and host "
                         "memory with device \"cpu\"");
  }
}

/// `offload_optimizer.host_ratio` (zero's own key): a share in [0, 1), above 0 only with device nvme and a
/// ratio of 1 (`host_ratio_refusal`, which `check_engine_config` applies too).
inline void read_host_ratio(const key_read<offload_optimizer_config>& k) {
  if (!read_typed(k)) {
    return;
  }
  if (const std::string why = host_ratio_refusal(k.out); !why.empty()) {
    k.r.ctx().fail(k.r.path_of(k.row.name), why);
  }
}

inline json write_offload_ratio(const offload_optimizer_config& o) {
  return o.ratio_auto ? json("auto") : json(o.ratio);
}

/// One offload block, either of them: its keys by their rows, and a note for each NVMe-only key
/// written with another device.
template <const auto& Table, class S>
void read_offload_block(parse_context& ctx, const json& v, std::string_view name, S& out, const config_inputs& in) {
  const std::string path = join_path("zero_optimization", name);
  if (v.is_null()) {
    return;
  }
  object_reader r(ctx, expect_object(ctx, path, v), path, key_names<Table>);
  read_keys(r, Table, out, in);
  note_values(r, Table, 0);
  if constexpr (std::is_same_v<S, offload_optimizer_config>) {
    if (const json* d = r.get("delayed_update"); d != nullptr && !d->is_null()) {
      const std::string at = r.path_of("delayed_update");
      object_reader dr(ctx, expect_object(ctx, at, *d), at, key_names<delayed_update_keys>);
      read_keys(dr, delayed_update_keys, out, in);
      dr.finish();
      out.delayed_update = true;
    }
  }
  for (const key_row<S>& row : Table) {
    if (row.nvme_only && out.device != offload_device::nvme && r.has(row.name)) {
      ctx.note(r.path_of(row.name), cat("no effect: device is ", name_of(out.device), ", not nvme"));
    }
  }
  r.finish();
}

/// Both offload blocks, then DeepSpeed's deprecated booleans that stand for them.
inline void read_offload(const key_read<zero_optimization_config>& k) {
  object_reader& r = k.r;
  parse_context& ctx = r.ctx();
  zero_optimization_config& z = k.out;
  const json* optimizer = r.get("offload_optimizer");
  const json* param = r.get("offload_param");
  if (optimizer != nullptr) {
    read_offload_block<offload_optimizer_keys>(ctx, *optimizer, "offload_optimizer", z.offload_optimizer, k.in);
  }
  if (param != nullptr) {
    read_offload_block<offload_param_keys>(ctx, *param, "offload_param", z.offload_param, k.in);
  }
  const json* pin_key = r.get("cpu_offload_use_pin_memory");
  const bool pin = pin_key != nullptr && as_bool(ctx, r.path_of("cpu_offload_use_pin_memory"), *pin_key);
  bool pin_used = false;
  // `key: true` turns on the offload `block` (which must then be absent) with device cpu.
  const auto legacy = [&](std::string_view key, std::string_view block, const json* given, offload_device& device,
                          bool& pin_memory) {
    const json* v = r.get(key);
    if (v == nullptr) {
      return;
    }
    const bool on = as_bool(ctx, r.path_of(key), *v);
    if (on && given != nullptr && !given->is_null()) {
      ctx.fail(r.path_of(key), cat("found true together with zero_optimization.", block, "; ", key,
                                   " is the deprecated form of it, give only ", block));
    }
    if (on) {
      device = offload_device::cpu;
      pin_memory = pin;
      pin_used = true;
    }
    ctx.note(r.path_of(key),
             on ? cat("deprecated; read as ", block, ".device = \"cpu\"") : "deprecated; false has no effect");
  };
  legacy("cpu_offload", "offload_optimizer", optimizer, z.offload_optimizer.device, z.offload_optimizer.pin_memory);
  legacy("cpu_offload_param", "offload_param", param, z.offload_param.device, z.offload_param.pin_memory);
  if (pin_key != nullptr) {
    ctx.note(r.path_of("cpu_offload_use_pin_memory"),
             pin_used ? "deprecated; read as pin_memory of the offload that cpu_offload/cpu_offload_param turned on"
                      : "deprecated; no effect without cpu_offload or cpu_offload_param set to true");
  }
}

/// Three names for one setting: DeepSpeed's alias, its field name, and the deprecated fp16 name; and
/// "auto", which Accelerate writes, resolved by an input that is a bool.
inline void read_gather_16bit_weights(const key_read<zero_optimization_config>& k) {
  object_reader& r = k.r;
  parse_context& ctx = r.ctx();
  const std::optional<bool>& input = k.in.gather_16bit_weights_on_model_save;
  bool& out = k.out.stage3_gather_16bit_weights_on_model_save;
  const std::string_view old_name = "stage3_gather_fp16_weights_on_model_save";
  const json* old = r.get(old_name);
  std::string used;
  const json* v = aliased(r, k.row.name, "gather_16bit_weights_on_model_save", false, &used);
  if (old != nullptr) {
    if (v != nullptr && !same_value(*v, *old)) {
      ctx.fail(r.path_of(old_name), cat("found ", show(*old), ", but ", used, " is ", show(*v),
                                        "; the first is the deprecated name of the second, give one"));
    }
    ctx.note(r.path_of(old_name), cat("deprecated; read as ", k.row.name));
    if (v == nullptr) {
      v = old;
      used = r.path_of(old_name);
    }
  }
  if (v != nullptr && is_auto(*v)) {
    if (!input) {
      ctx.fail(used, "found \"auto\"; resolving it needs whether to save a gathered 16-bit model "
                     "(config_inputs::gather_16bit_weights_on_model_save, --gather-16bit-weights true|false)");
    }
    out = *input;
  } else if (v != nullptr) {
    out = as_bool(ctx, used, *v);
    if (input && *input != out) {
      ctx.fail(used, cat("found ", show(*v), ", but config_inputs::gather_16bit_weights_on_model_save is ",
                         (*input ? "true" : "false"), "; make them agree"));
    }
  } else if (input) {
    out = *input;
  }
}

// ---- scheduler ---------------------------------------------------------------------------------------

/// A parameter read only for the schedules that take it (its input would fill it in for the others).
inline void read_schedule_param(const key_read<scheduler_config>& k) {
  if (schedule_takes(k.out.type, k.row.name)) {
    static_cast<void>(read_typed(k));
  }
}

/// A parameter a schedule takes and has no default for (OneCycle's cycle_min_lr and cycle_max_lr).
inline void read_required_schedule_param(const key_read<scheduler_config>& k) {
  if (schedule_takes(k.out.type, k.row.name) && !read_typed(k)) {
    k.r.ctx().fail(k.r.path_of(k.row.name),
                   cat("missing; ", name_of(k.out.type), " needs it (DeepSpeed's constructor has no default)"));
  }
}

inline void read_total_num_steps(const key_read<scheduler_config>& k) {
  if (schedule_takes(k.out.type, k.row.name) && !read_typed(k)) {
    k.r.ctx().fail(k.r.path_of(k.row.name), cat("missing; ", name_of(k.out.type),
                                                " needs the number of training steps (write it, or give "
                                                "config_inputs::total_steps, --total-steps)"));
  }
}

/// `"auto"` that leaves the key unset (its member's empty optional), for the framework to decide.
inline std::optional<json> auto_unset(const parse_context&, std::string_view, const config_inputs&) {
  return std::nullopt;
}

// ---- zero_optimization.zenflow ----------------------------------------------------------------------------

inline json write_select_interval(const zenflow_config& z) {
  return z.select_interval ? json(*z.select_interval) : json("auto");
}
inline json write_update_interval(const zenflow_config& z) {
  return z.update_interval ? json(*z.update_interval) : json("auto");
}

/// `zenflow`: its keys by their rows, then DeepSpeed's rules between them (its ZenFlowConfig and
/// configure_zenflow): "auto" select_strategy with an interval of its own, "step" or "epoch" without one,
/// and a select interval shorter than the update interval are refused as DeepSpeed refuses them. The
/// adaptive update interval ("auto", DeepSpeed's default) is not built: refused, naming the number to give.
inline void read_zenflow(const key_read<zero_optimization_config>& k) {
  const json* v = k.r.get(k.row.name);
  if (v == nullptr || v->is_null()) {
    return;
  }
  parse_context& ctx = k.r.ctx();
  const std::string at = k.r.path_of(k.row.name);
  object_reader r(ctx, expect_object(ctx, at, *v), at, key_names<zenflow_keys>);
  zenflow_config& z = k.out.zenflow;
  read_keys(r, zenflow_keys, z, k.in);
  const auto given = [&](std::string_view key) { return r.get(key) != nullptr && !is_auto(*r.get(key)); };
  if (z.select_strategy == zenflow_select::automatic && given("select_interval")) {
    ctx.fail(r.path_of("select_interval"),
             cat("found ", show(*r.get("select_interval")),
                 " with select_strategy \"auto\", which selects once an epoch; give select_strategy \"step\" or "
                 "\"epoch\" for an interval of your own, or leave select_interval out (DeepSpeed refuses it too)"));
  }
  if (z.select_strategy != zenflow_select::automatic && !z.select_interval) {
    ctx.fail(r.path_of("select_interval"),
             cat(r.get("select_interval") != nullptr ? "found \"auto\"" : "missing", "; select_strategy \"",
                 name_of(z.select_strategy), "\" needs a number: the ",
                 z.select_strategy == zenflow_select::step ? "steps" : "epochs",
                 " between selections (0: select once)"));
  }
  if (!z.update_interval) {
    ctx.fail(r.path_of("update_interval"),
             cat(r.get("update_interval") != nullptr ? "found \"auto\"" : "missing, which DeepSpeed reads as \"auto\"",
                 "; zero has no adaptive update interval: give the steps between the host's updates, e.g. 4 (the "
                 "interval of DeepSpeed's ZenFlow tutorial)"));
  }
  const std::int64_t select = zenflow_select_steps(z);
  if (select != 0 && select < *z.update_interval) {
    ctx.fail(r.path_of("select_interval"),
             cat("selects every ", std::to_string(select), " steps, fewer than update_interval ",
                 std::to_string(*z.update_interval),
                 "; expected a select interval >= the update interval (as "
                 "DeepSpeed requires)"));
  }
  r.finish();
  z.enabled = true;
}

// ---- checkpoint ----------------------------------------------------------------------------------------

/// `checkpoint.tag_validation`: "Warn" (DeepSpeed's default) or "Ignore", in any case as DeepSpeed
/// upper-cases it; "Fail" is refused by its row of `unimplemented_features` before this runs.
inline void read_tag_validation(const key_read<config>& k) {
  const json* v = k.r.get(k.row.name);
  if (v == nullptr) {
    return;
  }
  const std::string path = k.r.path_of(k.row.name);
  const std::string mode = ascii_lower(as_string(k.r.ctx(), path, *v));
  if (mode != "warn" && mode != "ignore") {
    k.r.ctx().fail(path, cat("found ", show(*v), R"(; expected "Warn" (DeepSpeed's default) or "Ignore")"));
  }
}

inline json write_pipeline_stages(const pipeline_config& p) { return p.stages ? json(*p.stages) : json("auto"); }

} // namespace zero::detail
