#pragma once
/// \file
/// The definitions of `zero::config`'s reader and writer. Included at the end of config.hpp.

#include "zero/config/config.hpp" // the declarations defined here; config.hpp includes this file at its end
#include "zero/config/detail/json_text.hpp"
#include "zero/config/detail/reader.hpp"
#include "zero/config/schema.hpp"

#include <array>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace zero {
namespace detail {

inline constexpr std::int64_t i64_max = std::numeric_limits<std::int64_t>::max();
inline constexpr double f64_max = std::numeric_limits<double>::max();

/// A value read from the config, or taken from an input when the config has none or "auto".
struct taken {
  std::optional<json> value; ///< empty: absent, or "auto" left unresolved
  std::string path;          ///< where to point errors: the key, plus "(from <input>)" for inputs
  bool was_auto = false;     ///< the config wrote "auto"
};

/// Reads `key`, merged with an outside value as Hugging Face's Trainer does: a concrete config
/// value must agree with the input when both are given; "auto" or an absent key takes the input.
/// \param input      the outside value, if any.
/// \param input_name how messages name it, e.g. "config_inputs::lr (--lr)".
/// \param auto_needs when not empty, an unresolved "auto" is refused with "resolving it needs <this>".
inline taken take(object_reader& r, std::string_view key, const std::optional<json>& input, std::string_view input_name,
                  std::string_view auto_needs) {
  taken t;
  t.path = r.path_of(key);
  const json* v = r.get(key);
  if (v != nullptr && !is_auto(*v)) {
    if (input && !same_value(*v, *input)) {
      r.ctx().fail(t.path, cat("found ", show(*v), ", but ", std::string(input_name), " is ", show(*input),
                               "; make them agree, or write \"auto\" to take ", show(*input)));
    }
    t.value = *v;
    return t;
  }
  t.was_auto = v != nullptr;
  if (input) {
    t.value = *input;
    t.path += cat(" (from ", std::string(input_name), ")");
    return t;
  }
  if (t.was_auto && !auto_needs.empty()) {
    r.ctx().fail(t.path, cat("found \"auto\"; resolving it needs ", std::string(auto_needs)));
  }
  return t;
}

template <class T> std::optional<json> to_input(const std::optional<T>& v) {
  if (!v) {
    return std::nullopt;
  }
  if constexpr (std::is_same_v<T, std::array<double, 2>>) {
    return json::array({(*v)[0], (*v)[1]});
  } else {
    return json(*v);
  }
}

/// Reads a key that has no input and no "auto": nullptr when absent.
inline const json* plain(object_reader& r, std::string_view key) { return r.get(key); }

/// Reads a key under its name or an alias DeepSpeed also accepts; both given must agree.
/// \param deprecated true when the alias is deprecated in DeepSpeed (the note says so).
inline const json* aliased(object_reader& r, std::string_view name, std::string_view alias, bool deprecated,
                           std::string* used_path = nullptr) {
  const json* a = r.get(name);
  const json* b = r.get(alias);
  if (a != nullptr && b != nullptr && !same_value(*a, *b)) {
    r.ctx().fail(r.path_of(alias),
                 cat("found ", show(*b), ", but ", r.path_of(name), " is ", show(*a), "; they are the same setting",
                     (deprecated ? " (the first is the deprecated name)" : ""), ", give one"));
  }
  if (b != nullptr) {
    r.ctx().note(r.path_of(alias), std::string(deprecated ? "deprecated; " : "") + "read as " + r.path_of(name));
  }
  if (used_path != nullptr) {
    *used_path = a != nullptr ? r.path_of(name) : r.path_of(alias);
  }
  return a != nullptr ? a : b;
}

inline constexpr choice<offload_device> offload_devices[] = {
    {"none", offload_device::none}, {"cpu", offload_device::cpu}, {"nvme", offload_device::nvme}};
inline constexpr choice<optimizer_type> optimizer_types[] = {{"Adam", optimizer_type::adam},
                                                             {"AdamW", optimizer_type::adamw}};
inline constexpr choice<scheduler_type> scheduler_types[] = {{"WarmupLR", scheduler_type::warmup_lr},
                                                             {"WarmupDecayLR", scheduler_type::warmup_decay_lr},
                                                             {"WarmupCosineLR", scheduler_type::warmup_cosine_lr}};
inline constexpr choice<warmup_curve> warmup_curves[] = {{"log", warmup_curve::log}, {"linear", warmup_curve::linear}};
// DeepSpeed's DtypeEnum spellings of the three float types.
inline constexpr choice<dtype> dtype_names[] = {
    {"fp32", dtype::f32},  {"float32", dtype::f32},   {"float", dtype::f32},          {"torch.float32", dtype::f32},
    {"fp16", dtype::f16},  {"float16", dtype::f16},   {"half", dtype::f16},           {"torch.float16", dtype::f16},
    {"bf16", dtype::bf16}, {"bfloat16", dtype::bf16}, {"torch.bfloat16", dtype::bf16}};
inline constexpr choice<dtype> comm_dtype_names[] = {{"fp32", dtype::f32}, {"fp16", dtype::f16}, {"bf16", dtype::bf16}};

// ---- precision -----------------------------------------------------------------------------------

/// `enabled` of fp16 or bf16, resolved against `config_inputs::precision`.
inline bool precision_enabled(object_reader& r, const config_inputs& in, dtype which) {
  const std::string path = r.path_of("enabled");
  const json* v = r.get("enabled");
  const bool wants = in.precision && *in.precision == which;
  if (v != nullptr && !is_auto(*v)) {
    const bool on = as_bool(r.ctx(), path, *v);
    if (in.precision && on != wants) {
      r.ctx().fail(path, cat("found ", show(*v), ", but the training precision given (config_inputs::precision, ",
                             "--precision) is ", std::string(name_of(*in.precision)),
                             "; make them agree, or write \"auto\""));
    }
    return on;
  }
  if (in.precision) {
    return wants;
  }
  if (v != nullptr) {
    r.ctx().fail(path, "found \"auto\"; resolving it needs the training precision (config_inputs::precision, "
                       "--precision fp32|fp16|bf16)");
  }
  return false;
}

inline void parse_fp16(parse_context& ctx, const json* block, const config_inputs& in, fp16_config& out) {
  if (block == nullptr) {
    out.enabled = in.precision && *in.precision == dtype::f16;
    return;
  }
  object_reader r(ctx, expect_object(ctx, "fp16", *block), "fp16", schema::fp16);
  out.enabled = precision_enabled(r, in, dtype::f16);
  bool scaler_keys = false;
  if (const json* v = plain(r, "loss_scale")) {
    out.loss_scale = as_number(ctx, r.path_of("loss_scale"), *v, 0.0, f64_max);
    scaler_keys = true;
  }
  // 2^127 is the largest power of two a float loss scale holds.
  if (const json* v = plain(r, "initial_scale_power")) {
    out.initial_scale_power = as_int(ctx, r.path_of("initial_scale_power"), *v, 0, 127);
    scaler_keys = true;
  }
  if (const json* v = plain(r, "loss_scale_window")) {
    out.loss_scale_window = as_int(ctx, r.path_of("loss_scale_window"), *v, 1, i64_max);
    scaler_keys = true;
  }
  if (const json* v = plain(r, "hysteresis")) {
    out.hysteresis = as_int(ctx, r.path_of("hysteresis"), *v, 1, i64_max);
    scaler_keys = true;
  }
  if (const json* v = plain(r, "consecutive_hysteresis")) {
    out.consecutive_hysteresis = as_bool(ctx, r.path_of("consecutive_hysteresis"), *v);
    scaler_keys = true;
  }
  if (const json* v = plain(r, "min_loss_scale")) {
    out.min_loss_scale = as_number(ctx, r.path_of("min_loss_scale"), *v, 0.0, f64_max);
    scaler_keys = true;
  }
  if (scaler_keys && !out.enabled) {
    ctx.note("fp16", "loss-scale settings have no effect: fp16 is not enabled");
  }
  r.finish();
}

inline void parse_bf16(parse_context& ctx, object_reader& top, const config_inputs& in, bf16_config& out) {
  const json* now = top.get("bf16");
  const json* old = top.get("bfloat16");
  if (now != nullptr && old != nullptr) {
    ctx.fail("bfloat16", "found both bf16 and bfloat16 (DeepSpeed's old name of bf16); give only bf16");
  }
  const json* block = now != nullptr ? now : old;
  if (block == nullptr) {
    out.enabled = in.precision && *in.precision == dtype::bf16;
    return;
  }
  const std::string name = now != nullptr ? "bf16" : "bfloat16";
  if (old != nullptr) {
    ctx.note("bfloat16", "DeepSpeed's old name; read as bf16");
  }
  object_reader r(ctx, expect_object(ctx, name, *block), name, schema::bf16);
  out.enabled = precision_enabled(r, in, dtype::bf16);
  r.finish();
}

// ---- zero_optimization ---------------------------------------------------------------------------

inline void parse_offload_optimizer(parse_context& ctx, const json& v, offload_optimizer_config& out) {
  const std::string path = "zero_optimization.offload_optimizer";
  if (v.is_null()) {
    return;
  }
  object_reader r(ctx, expect_object(ctx, path, v), path, schema::offload_optimizer);
  if (const json* d = plain(r, "device")) {
    out.device = as_choice<offload_device>(ctx, r.path_of("device"), *d, offload_devices, true);
  }
  if (const json* p = plain(r, "nvme_path")) {
    out.nvme_path = p->is_null() ? std::string() : as_string(ctx, r.path_of("nvme_path"), *p);
  }
  if (const json* p = plain(r, "pin_memory")) {
    out.pin_memory = as_bool(ctx, r.path_of("pin_memory"), *p);
  }
  if (const json* p = plain(r, "buffer_count")) {
    out.buffer_count = as_int(ctx, r.path_of("buffer_count"), *p, 0, i64_max);
  }
  if (const json* p = plain(r, "ratio")) {
    out.ratio = as_number(ctx, r.path_of("ratio"), *p, 0.0, 1.0);
  }
  if (out.device != offload_device::nvme) {
    for (std::string_view k : {"nvme_path", "buffer_count"}) {
      if (r.has(k)) {
        ctx.note(r.path_of(k), cat("no effect: device is ", std::string(name_of(out.device)), ", not nvme"));
      }
    }
  }
  r.finish();
}

inline void parse_offload_param(parse_context& ctx, const json& v, offload_param_config& out) {
  const std::string path = "zero_optimization.offload_param";
  if (v.is_null()) {
    return;
  }
  object_reader r(ctx, expect_object(ctx, path, v), path, schema::offload_param);
  if (const json* d = plain(r, "device")) {
    out.device = as_choice<offload_device>(ctx, r.path_of("device"), *d, offload_devices, true);
  }
  if (const json* p = plain(r, "nvme_path")) {
    out.nvme_path = p->is_null() ? std::string() : as_string(ctx, r.path_of("nvme_path"), *p);
  }
  if (const json* p = plain(r, "pin_memory")) {
    out.pin_memory = as_bool(ctx, r.path_of("pin_memory"), *p);
  }
  if (const json* p = plain(r, "buffer_count")) {
    out.buffer_count = as_int(ctx, r.path_of("buffer_count"), *p, 0, i64_max);
  }
  if (const json* p = plain(r, "buffer_size")) {
    out.buffer_size = as_int(ctx, r.path_of("buffer_size"), *p, 0, i64_max);
  }
  if (const json* p = plain(r, "max_in_cpu")) {
    out.max_in_cpu = as_int(ctx, r.path_of("max_in_cpu"), *p, 0, i64_max);
  }
  if (out.device != offload_device::nvme) {
    for (std::string_view k : {"nvme_path", "buffer_count", "buffer_size", "max_in_cpu"}) {
      if (r.has(k)) {
        ctx.note(r.path_of(k), cat("no effect: device is ", std::string(name_of(out.device)), ", not nvme"));
      }
    }
  }
  r.finish();
}

/// Stages at which a zero_optimization key has an effect; a key written for another stage gets a note.
struct stage_scope {
  std::string_view key;
  unsigned stages; ///< bit s set: effective at stage s
};
inline constexpr stage_scope stage_scopes[] = {
    {"contiguous_gradients", 0b1110},
    {"reduce_scatter", 0b1100},
    {"allgather_partitions", 0b0110},
    {"allgather_bucket_size", 0b0110},
    {"round_robin_gradients", 0b0110},
    {"ignore_unused_parameters", 0b0110},
    {"sub_group_size", 0b1000},
    {"stage3_max_live_parameters", 0b1000},
    {"max_live_parameters", 0b1000},
    {"stage3_max_reuse_distance", 0b1000},
    {"max_reuse_distance", 0b1000},
    {"stage3_prefetch_bucket_size", 0b1000},
    {"prefetch_bucket_size", 0b1000},
    {"stage3_param_persistence_threshold", 0b1000},
    {"param_persistence_threshold", 0b1000},
    {"stage3_gather_16bit_weights_on_model_save", 0b1000},
    {"gather_16bit_weights_on_model_save", 0b1000},
    {"stage3_gather_fp16_weights_on_model_save", 0b1000},
};

/// A zero_optimization value that zero accepts at a stage where DeepSpeed would act on it, but that
/// changes nothing here, with what zero does instead. An empty `value` matches any value.
struct value_without_effect {
  std::string_view key;
  std::string_view value; ///< JSON text of the value, or empty for any
  std::string_view instead;
};
inline constexpr value_without_effect values_without_effect[] = {
    {"reduce_scatter", "false",
     "stages 2 and 3 always reduce-scatter gradients into each rank's shard (an all-reduce would hold "
     "gradients for the whole model)"},
    {"contiguous_gradients", "false",
     "gradients always live in one flat buffer (the rank's shard at stages 2 and 3), reduced bucket by bucket"},
    {"allgather_partitions", "false", "updated shards are always all-gathered, never broadcast rank by rank"},
    {"round_robin_gradients", "true",
     "it spreads gradient copies to the CPU under optimizer offload, which this version's engine does not run"},
    {"sub_group_size", "",
     "the optimizer steps the rank's shard one segment at a time (a reduce bucket, or a module at stage 3) "
     "whatever this says"},
    {"elastic_checkpoint", "false",
     "zero's checkpoints always load at any stage and any rank count (docs/checkpoints.md)"},
};

/// The hidden-size formulas Hugging Face uses for "auto" bucket sizes.
inline std::int64_t hidden_squared(const parse_context& ctx, std::string_view path, std::int64_t h) {
  // h*h must fit in int64: h <= 3037000499.
  if (h < 1 || h > 3'037'000'499) {
    ctx.fail(path, cat("the hidden size given (", std::to_string(h), ") must be from 1 to 3037000499"));
  }
  return h * h;
}

inline void parse_zero_optimization(parse_context& ctx, object_reader& top, const config_inputs& in,
                                    zero_optimization_config& z) {
  const json* block = top.get("zero_optimization");
  const json* legacy_allgather = top.get("allgather_size");
  if (block != nullptr && block->is_boolean()) {
    // DeepSpeed's first format: "zero_optimization": true means stage 1, with "allgather_size".
    z.stage = block->get<bool>() ? 1 : 0;
    ctx.note("zero_optimization", std::string("deprecated boolean form; read as stage ") + (z.stage ? "1" : "0"));
    if (legacy_allgather != nullptr) {
      if (z.stage == 1) {
        z.allgather_bucket_size = as_int(ctx, "allgather_size", *legacy_allgather, 0, i64_max);
        ctx.note("allgather_size", "deprecated; read as zero_optimization.allgather_bucket_size");
      } else {
        ctx.note("allgather_size", "no effect: zero_optimization is false");
      }
    }
    return;
  }
  if (legacy_allgather != nullptr) {
    ctx.fail("allgather_size", cat("found ", show(*legacy_allgather),
                                   "; allgather_size is read only with the deprecated \"zero_optimization\": true, "
                                   "use zero_optimization.allgather_bucket_size"));
  }
  if (block == nullptr || block->is_null()) {
    return;
  }
  const std::string zp = "zero_optimization";
  object_reader r(ctx, expect_object(ctx, zp, *block), zp, schema::zero_optimization);

  if (const json* v = plain(r, "stage")) {
    z.stage = static_cast<int>(as_int(ctx, r.path_of("stage"), *v, 0, 3));
  }
  const int stage = z.stage;

  if (const json* v = plain(r, "contiguous_gradients")) {
    z.contiguous_gradients = as_bool(ctx, r.path_of("contiguous_gradients"), *v);
  }
  z.overlap_comm = stage == 3; // DeepSpeed's dynamic default
  if (const json* v = plain(r, "overlap_comm")) {
    z.overlap_comm = as_bool(ctx, r.path_of("overlap_comm"), *v);
  }
  if (const json* v = plain(r, "reduce_scatter")) {
    z.reduce_scatter = as_bool(ctx, r.path_of("reduce_scatter"), *v);
  }
  const std::string hidden_needed = "the model's hidden size (config_inputs::hidden_size, --hidden-size)";
  {
    const json* v = plain(r, "reduce_bucket_size");
    if (v != nullptr && is_auto(*v)) {
      if (!in.hidden_size) {
        ctx.fail(r.path_of("reduce_bucket_size"),
                 cat("found \"auto\"; resolving it (hidden_size^2) needs ", hidden_needed));
      }
      z.reduce_bucket_size = hidden_squared(ctx, r.path_of("reduce_bucket_size"), *in.hidden_size);
    } else if (v != nullptr) {
      z.reduce_bucket_size = as_int(ctx, r.path_of("reduce_bucket_size"), *v, 0, i64_max);
    }
  }
  if (const json* v = plain(r, "allgather_partitions")) {
    z.allgather_partitions = as_bool(ctx, r.path_of("allgather_partitions"), *v);
  }
  if (const json* v = plain(r, "allgather_bucket_size"); v != nullptr && !v->is_null()) { // null: unset
    z.allgather_bucket_size = as_int(ctx, r.path_of("allgather_bucket_size"), *v, 0, i64_max);
    // DeepSpeed's stage 1/2 aligns all-gather buffers to 4 bytes of 16-bit elements.
    if ((stage == 1 || stage == 2) && *z.allgather_bucket_size % 2 != 0) {
      ctx.fail(r.path_of("allgather_bucket_size"),
               cat("found ", show(*v),
                   "; expected a multiple of 2 at stage 1 and 2 (DeepSpeed aligns all-gather "
                   "buffers to 4 bytes)"));
    }
  }

  const json* oo = plain(r, "offload_optimizer");
  const json* op = plain(r, "offload_param");
  if (oo != nullptr) {
    parse_offload_optimizer(ctx, *oo, z.offload_optimizer);
  }
  if (op != nullptr) {
    parse_offload_param(ctx, *op, z.offload_param);
  }
  // Deprecated booleans that DeepSpeed turns into offload blocks.
  const json* cpu_offload = plain(r, "cpu_offload");
  const json* cpu_offload_param = plain(r, "cpu_offload_param");
  const json* cpu_offload_pin = plain(r, "cpu_offload_use_pin_memory");
  const bool pin =
      cpu_offload_pin != nullptr && as_bool(ctx, r.path_of("cpu_offload_use_pin_memory"), *cpu_offload_pin);
  bool pin_used = false;
  if (cpu_offload != nullptr) {
    const bool on = as_bool(ctx, r.path_of("cpu_offload"), *cpu_offload);
    if (on && oo != nullptr && !oo->is_null()) {
      ctx.fail(r.path_of("cpu_offload"), "found true together with zero_optimization.offload_optimizer; "
                                         "cpu_offload is the deprecated form of it, give only offload_optimizer");
    }
    if (on) {
      z.offload_optimizer.device = offload_device::cpu;
      z.offload_optimizer.pin_memory = pin;
      pin_used = true;
    }
    ctx.note(r.path_of("cpu_offload"),
             on ? "deprecated; read as offload_optimizer.device = \"cpu\"" : "deprecated; false has no effect");
  }
  if (cpu_offload_param != nullptr) {
    const bool on = as_bool(ctx, r.path_of("cpu_offload_param"), *cpu_offload_param);
    if (on && op != nullptr && !op->is_null()) {
      ctx.fail(r.path_of("cpu_offload_param"),
               "found true together with zero_optimization.offload_param; "
               "cpu_offload_param is the deprecated form of it, give only offload_param");
    }
    if (on) {
      z.offload_param.device = offload_device::cpu;
      z.offload_param.pin_memory = pin;
      pin_used = true;
    }
    ctx.note(r.path_of("cpu_offload_param"),
             on ? "deprecated; read as offload_param.device = \"cpu\"" : "deprecated; false has no effect");
  }
  if (cpu_offload_pin != nullptr) {
    ctx.note(r.path_of("cpu_offload_use_pin_memory"),
             pin_used ? "deprecated; read as pin_memory of the offload that cpu_offload/cpu_offload_param turned on"
                      : "deprecated; no effect without cpu_offload or cpu_offload_param set to true");
  }

  if (const json* v = plain(r, "sub_group_size")) {
    z.sub_group_size = as_int(ctx, r.path_of("sub_group_size"), *v, 0, i64_max);
  }
  std::string used;
  if (const json* v = aliased(r, "stage3_max_live_parameters", "max_live_parameters", false, &used)) {
    z.stage3_max_live_parameters = as_int(ctx, used, *v, 0, i64_max);
  }
  if (const json* v = aliased(r, "stage3_max_reuse_distance", "max_reuse_distance", false, &used)) {
    z.stage3_max_reuse_distance = as_int(ctx, used, *v, 0, i64_max);
  }
  if (const json* v = aliased(r, "stage3_prefetch_bucket_size", "prefetch_bucket_size", false, &used)) {
    if (is_auto(*v)) {
      if (!in.hidden_size) {
        ctx.fail(used, cat("found \"auto\"; resolving it (0.9 * hidden_size^2) needs ", hidden_needed));
      }
      // floor(0.9 * x) == x - ceil(x / 10) for integer x >= 0, without going through a float.
      const std::int64_t x = hidden_squared(ctx, used, *in.hidden_size);
      z.stage3_prefetch_bucket_size = x - (x + 9) / 10;
    } else {
      z.stage3_prefetch_bucket_size = as_int(ctx, used, *v, 0, i64_max);
    }
  }
  if (const json* v = aliased(r, "stage3_param_persistence_threshold", "param_persistence_threshold", false, &used)) {
    if (is_auto(*v)) {
      if (!in.hidden_size) {
        ctx.fail(used, cat("found \"auto\"; resolving it (10 * hidden_size) needs ", hidden_needed));
      }
      if (*in.hidden_size < 1 || *in.hidden_size > i64_max / 10) {
        ctx.fail(used, cat("the hidden size given (", std::to_string(*in.hidden_size), ") is out of range"));
      }
      z.stage3_param_persistence_threshold = 10 * *in.hidden_size;
    } else {
      z.stage3_param_persistence_threshold = as_int(ctx, used, *v, 0, i64_max);
    }
  }
  {
    // Three names for one setting: DeepSpeed's alias, its field name, and the deprecated fp16 name.
    const json* fp16_name = r.get("stage3_gather_fp16_weights_on_model_save");
    const json* v =
        aliased(r, "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save", false, &used);
    if (fp16_name != nullptr) {
      if (v != nullptr && !same_value(*v, *fp16_name)) {
        ctx.fail(r.path_of("stage3_gather_fp16_weights_on_model_save"),
                 cat("found ", show(*fp16_name), ", but ", used, " is ", show(*v),
                     "; the first is the deprecated name of the second, give one"));
      }
      ctx.note(r.path_of("stage3_gather_fp16_weights_on_model_save"),
               "deprecated; read as stage3_gather_16bit_weights_on_model_save");
      if (v == nullptr) {
        v = fp16_name;
        used = r.path_of("stage3_gather_fp16_weights_on_model_save");
      }
    }
    if (v != nullptr && is_auto(*v)) {
      if (!in.gather_16bit_weights_on_model_save) {
        ctx.fail(used, "found \"auto\"; resolving it needs whether to save a gathered 16-bit model "
                       "(config_inputs::gather_16bit_weights_on_model_save, --gather-16bit-weights true|false)");
      }
      z.stage3_gather_16bit_weights_on_model_save = *in.gather_16bit_weights_on_model_save;
    } else if (v != nullptr) {
      z.stage3_gather_16bit_weights_on_model_save = as_bool(ctx, used, *v);
      if (in.gather_16bit_weights_on_model_save &&
          *in.gather_16bit_weights_on_model_save != z.stage3_gather_16bit_weights_on_model_save) {
        ctx.fail(used, cat("found ", show(*v), ", but config_inputs::gather_16bit_weights_on_model_save is ",
                           (*in.gather_16bit_weights_on_model_save ? "true" : "false"), "; make them agree"));
      }
    } else if (in.gather_16bit_weights_on_model_save) {
      z.stage3_gather_16bit_weights_on_model_save = *in.gather_16bit_weights_on_model_save;
    }
  }
  if (const json* v = plain(r, "round_robin_gradients")) {
    z.round_robin_gradients = as_bool(ctx, r.path_of("round_robin_gradients"), *v);
  }
  if (const json* v = plain(r, "ignore_unused_parameters")) {
    z.ignore_unused_parameters = as_bool(ctx, r.path_of("ignore_unused_parameters"), *v);
  }
  if (const json* v = plain(r, "elastic_checkpoint")) {
    z.elastic_checkpoint = as_bool(ctx, r.path_of("elastic_checkpoint"), *v);
  }

  // Offload needs a stage that shards what is offloaded.
  if (z.offload_optimizer.device != offload_device::none && stage == 0) {
    ctx.fail(zp + ".offload_optimizer.device",
             cat("found \"", std::string(name_of(z.offload_optimizer.device)),
                 "\", but offload_optimizer needs ZeRO stage 1, 2 or 3 and zero_optimization.stage is 0"));
  }
  if (z.offload_param.device != offload_device::none && stage != 3) {
    ctx.fail(zp + ".offload_param.device",
             cat("found \"", std::string(name_of(z.offload_param.device)),
                 "\", but offload_param needs ZeRO stage 3 and zero_optimization.stage is ", std::to_string(stage)));
  }
  // CPU offload is read and validated so that configs written for it can be checked, but the engine
  // does not run it yet and refuses it when built; the note says so before a run gets that far.
  for (const auto& [key, device] :
       {std::pair<std::string_view, offload_device>{"offload_optimizer.device", z.offload_optimizer.device},
        std::pair<std::string_view, offload_device>{"offload_param.device", z.offload_param.device}}) {
    if (device == offload_device::cpu) {
      ctx.note(r.path_of(key), "\"cpu\" is read, but this version's engine refuses offload (planned); "
                               "set \"none\" to train with it");
    }
  }
  for (const stage_scope& s : stage_scopes) {
    if (r.has(s.key) && (s.stages & (1u << stage)) == 0) {
      std::string at;
      for (int k = 0; k < 4; ++k) {
        if (s.stages & (1u << k)) {
          at += (at.empty() ? "" : ", ") + std::to_string(k);
        }
      }
      ctx.note(r.path_of(s.key), cat("no effect at stage ", std::to_string(stage), " (used at stage ", at, ")"));
    }
  }
  for (const value_without_effect& n : values_without_effect) {
    const auto scope = std::find_if(std::begin(stage_scopes), std::end(stage_scopes),
                                    [&](const stage_scope& s) { return s.key == n.key; });
    const bool in_scope = scope == std::end(stage_scopes) || (scope->stages & (1u << stage)) != 0;
    if (in_scope && r.has(n.key) && (n.value.empty() || block->at(std::string(n.key)) == json::parse(n.value))) {
      ctx.note(r.path_of(n.key),
               cat(n.value.empty() ? std::string("no effect") : cat(std::string(n.value), " has no effect"), ": ",
                   std::string(n.instead)));
    }
  }
  r.finish();
}

// ---- optimizer and scheduler -----------------------------------------------------------------------

inline std::optional<optimizer_config> parse_optimizer(parse_context& ctx, const json* block, const config_inputs& in) {
  if (block == nullptr) {
    return std::nullopt;
  }
  object_reader r(ctx, expect_object(ctx, "optimizer", *block), "optimizer", schema::optimizer);
  optimizer_config o;
  const json* type = plain(r, "type");
  if (type == nullptr) {
    ctx.fail("optimizer.type", "missing; expected \"Adam\" or \"AdamW\" (without a type DeepSpeed ignores the "
                               "optimizer block)");
  }
  o.type = as_choice<optimizer_type>(ctx, "optimizer.type", *type, optimizer_types, true);
  const json* params = plain(r, "params");
  r.finish();
  const json empty = json::object();
  const std::string pp = "optimizer.params";
  object_reader p(ctx, params == nullptr || params->is_null() ? empty : expect_object(ctx, pp, *params), pp,
                  schema::optimizer_params);

  bool torch_adam = false;
  if (const json* v = plain(p, "torch_adam")) {
    torch_adam = as_bool(ctx, p.path_of("torch_adam"), *v);
    if (torch_adam) {
      ctx.note(p.path_of("torch_adam"), "zero runs its own Adam/AdamW; only PyTorch's defaults are taken from "
                                        "torch_adam (weight_decay 0.01 for AdamW)");
    }
  }
  bool adam_w_mode = true;
  if (const json* v = plain(p, "adam_w_mode")) {
    adam_w_mode = as_bool(ctx, p.path_of("adam_w_mode"), *v);
    if (o.type == optimizer_type::adamw && !adam_w_mode) {
      ctx.fail(p.path_of("adam_w_mode"),
               "found false, but optimizer.type \"AdamW\" always decouples weight decay; "
               "for Adam with L2 weight decay write \"type\": \"Adam\" with adam_w_mode false");
    }
  }
  // DeepSpeed: type AdamW, or type Adam unless adam_w_mode is false, runs AdamW.
  o.adam_w_mode = o.type == optimizer_type::adamw || adam_w_mode;
  if (const json* v = plain(p, "bias_correction")) {
    o.bias_correction = as_bool(ctx, p.path_of("bias_correction"), *v);
    if (torch_adam) {
      ctx.fail(p.path_of("bias_correction"), cat("found ", show(*v),
                                                 " with torch_adam true; torch.optim.Adam and "
                                                 "AdamW take no bias_correction (DeepSpeed would fail), remove one"));
    }
  }
  if (auto t =
          take(p, "lr", to_input(in.lr), "config_inputs::lr (--lr)", "the learning rate (config_inputs::lr, --lr)");
      t.value) {
    o.lr = as_number(ctx, t.path, *t.value, 0.0, f64_max);
  }
  if (auto t = take(p, "betas", to_input(in.betas), "config_inputs::betas (--adam-beta1/--adam-beta2)",
                    "Adam's betas (config_inputs::betas, --adam-beta1 and --adam-beta2)");
      t.value) {
    const json& b = *t.value;
    if (!b.is_array() || b.size() != 2) {
      ctx.fail(t.path, cat("found ", show(b), "; expected [beta1, beta2], two numbers >= 0 and < 1"));
    }
    o.betas[0] = as_number(ctx, t.path + "[0]", b[0], 0.0, 1.0, false, true);
    o.betas[1] = as_number(ctx, t.path + "[1]", b[1], 0.0, 1.0, false, true);
  }
  if (auto t = take(p, "eps", to_input(in.eps), "config_inputs::eps (--adam-epsilon)",
                    "Adam's epsilon (config_inputs::eps, --adam-epsilon)");
      t.value) {
    o.eps = as_number(ctx, t.path, *t.value, 0.0, f64_max);
  }
  o.weight_decay = torch_adam && o.adam_w_mode ? 0.01 : 0.0;
  if (auto t = take(p, "weight_decay", to_input(in.weight_decay), "config_inputs::weight_decay (--weight-decay)",
                    "the weight decay (config_inputs::weight_decay, --weight-decay)");
      t.value) {
    o.weight_decay = as_number(ctx, t.path, *t.value, 0.0, f64_max);
  }
  p.finish();
  return o;
}

inline std::optional<scheduler_config> parse_scheduler(parse_context& ctx, const json* block, const config_inputs& in,
                                                       const std::optional<optimizer_config>& optimizer) {
  if (block == nullptr) {
    return std::nullopt;
  }
  object_reader r(ctx, expect_object(ctx, "scheduler", *block), "scheduler", schema::scheduler);
  scheduler_config s;
  const json* type = plain(r, "type");
  if (type == nullptr) {
    ctx.fail("scheduler.type", "missing; expected \"WarmupLR\", \"WarmupDecayLR\" or \"WarmupCosineLR\"");
  }
  s.type = as_choice<scheduler_type>(ctx, "scheduler.type", *type, scheduler_types, false);
  const json* params = plain(r, "params");
  r.finish();
  const json empty = json::object();
  const std::string pp = "scheduler.params";
  if (params != nullptr && params->is_null()) {
    params = nullptr;
  }
  object_reader p(ctx, params == nullptr ? empty : expect_object(ctx, pp, *params), pp, schema::scheduler_params);

  // The parameters each schedule's constructor takes in DeepSpeed.
  static constexpr std::string_view warmup_lr_keys[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                        "warmup_type", "last_batch_iteration"};
  static constexpr std::string_view warmup_decay_keys[] = {"warmup_min_lr", "warmup_max_lr",        "warmup_num_steps",
                                                           "warmup_type",   "last_batch_iteration", "total_num_steps"};
  static constexpr std::string_view warmup_cosine_keys[] = {"total_num_steps",  "warmup_min_ratio",
                                                            "warmup_num_steps", "cos_min_ratio",
                                                            "warmup_type",      "last_batch_iteration"};
  const auto keys_of = [](scheduler_type t) -> std::span<const std::string_view> {
    switch (t) {
    case scheduler_type::warmup_lr:
      return warmup_lr_keys;
    case scheduler_type::warmup_decay_lr:
      return warmup_decay_keys;
    case scheduler_type::warmup_cosine_lr:
      break;
    }
    return warmup_cosine_keys;
  };
  const std::span<const std::string_view> keys = keys_of(s.type);
  if (params != nullptr) {
    for (auto it = params->begin(); it != params->end(); ++it) {
      if (std::find(keys.begin(), keys.end(), it.key()) == keys.end()) {
        std::string allowed;
        for (auto k : keys) {
          allowed += (allowed.empty() ? "" : ", ") + std::string(k);
        }
        std::string takers;
        for (const auto& c : scheduler_types) {
          const std::span<const std::string_view> other = keys_of(c.value);
          if (std::find(other.begin(), other.end(), it.key()) != other.end()) {
            takers += (takers.empty() ? "" : " and ") + std::string(c.name);
          }
        }
        ctx.fail(p.path_of(it.key()), cat("not a parameter of ", std::string(name_of(s.type)), " (it takes ", allowed,
                                          ")", (takers.empty() ? "" : "; " + takers + " take it")));
      }
    }
  }
  const auto has = [&](std::string_view k) { return std::find(keys.begin(), keys.end(), k) != keys.end(); };

  if (has("warmup_min_lr")) {
    // Hugging Face fills "auto" here with 0, whatever its arguments.
    const json* v = plain(p, "warmup_min_lr");
    if (v != nullptr && !is_auto(*v)) {
      s.warmup_min_lr = as_number(ctx, p.path_of("warmup_min_lr"), *v, 0.0, f64_max);
    }
  }
  if (has("warmup_max_lr")) {
    const bool null_given =
        params != nullptr && params->contains("warmup_max_lr") && params->at("warmup_max_lr").is_null();
    if (null_given) {
      // null is DeepSpeed's own default (None): treated as absent.
      static_cast<void>(p.get("warmup_max_lr"));
      if (in.lr) {
        s.warmup_max_lr =
            as_number(ctx, p.path_of("warmup_max_lr") + " (from config_inputs::lr (--lr))", json(*in.lr), 0.0, f64_max);
      }
    } else if (auto t = take(p, "warmup_max_lr", to_input(in.lr), "config_inputs::lr (--lr)",
                             "the learning rate (config_inputs::lr, --lr)");
               t.value) {
      s.warmup_max_lr = as_number(ctx, t.path, *t.value, 0.0, f64_max);
    }
    if (!s.warmup_max_lr) {
      if (s.type == scheduler_type::warmup_decay_lr) {
        s.warmup_max_lr = 0.001;
      } else if (optimizer) {
        s.warmup_max_lr = optimizer->lr;
      }
    }
  }
  if (auto t = take(p, "warmup_num_steps", to_input(in.warmup_steps), "config_inputs::warmup_steps (--warmup-steps)",
                    "the number of warm-up steps (config_inputs::warmup_steps, --warmup-steps)");
      t.value) {
    s.warmup_num_steps = as_int(ctx, t.path, *t.value, 1, i64_max);
  }
  if (const json* v = plain(p, "warmup_type")) {
    s.warmup_type = as_choice<warmup_curve>(ctx, p.path_of("warmup_type"), *v, warmup_curves, false);
  }
  if (const json* v = plain(p, "last_batch_iteration")) {
    s.last_batch_iteration = as_int(ctx, p.path_of("last_batch_iteration"), *v, -1, i64_max);
  }
  if (has("total_num_steps")) {
    auto t = take(p, "total_num_steps", to_input(in.total_steps), "config_inputs::total_steps (--total-steps)",
                  "the number of training steps (config_inputs::total_steps, --total-steps)");
    if (!t.value) {
      ctx.fail(p.path_of("total_num_steps"), cat("missing; ", std::string(name_of(s.type)),
                                                 " needs the number of training steps (write it, or give "
                                                 "config_inputs::total_steps, --total-steps)"));
    }
    s.total_num_steps = as_int(ctx, t.path, *t.value, 1, i64_max);
  }
  if (const json* v = plain(p, "warmup_min_ratio")) {
    s.warmup_min_ratio = as_number(ctx, p.path_of("warmup_min_ratio"), *v, 0.0, 1.0);
  }
  if (const json* v = plain(p, "cos_min_ratio")) {
    s.cos_min_ratio = as_number(ctx, p.path_of("cos_min_ratio"), *v, 0.0, 1.0);
  }
  p.finish();
  return s;
}

// ---- batch -------------------------------------------------------------------------------------------

inline batch_spec parse_batch(object_reader& top, const config_inputs& in) {
  batch_spec b;
  parse_context& ctx = top.ctx();
  {
    const json* v = top.get("train_batch_size");
    // "auto" here is what the rule derives (Hugging Face: world x micro x accumulation).
    if (v != nullptr && !is_auto(*v)) {
      b.train_batch_size = as_int(ctx, "train_batch_size", *v, 1, i64_max);
    }
  }
  if (auto t = take(top, "train_micro_batch_size_per_gpu", to_input(in.micro_batch_size),
                    "config_inputs::micro_batch_size (--micro-batch-size)", "");
      t.value) {
    b.train_micro_batch_size_per_gpu = as_int(ctx, t.path, *t.value, 1, i64_max);
  } else {
    b.micro_was_auto = t.was_auto;
  }
  if (auto t = take(top, "gradient_accumulation_steps", to_input(in.gradient_accumulation_steps),
                    "config_inputs::gradient_accumulation_steps (--gradient-accumulation-steps)", "");
      t.value) {
    b.gradient_accumulation_steps = as_int(ctx, t.path, *t.value, 1, i64_max);
  } else {
    b.accumulation_was_auto = t.was_auto;
  }
  return b;
}

// ---- aio -------------------------------------------------------------------------------------------------

inline void parse_aio(parse_context& ctx, const json* block, aio_config& a) {
  if (block == nullptr || block->is_null()) {
    return;
  }
  object_reader r(ctx, expect_object(ctx, "aio", *block), "aio", schema::aio);
  if (const json* v = plain(r, "block_size")) {
    a.block_size = as_int(ctx, r.path_of("block_size"), *v, 1, i64_max);
  }
  if (const json* v = plain(r, "queue_depth")) {
    a.queue_depth = as_int(ctx, r.path_of("queue_depth"), *v, 1, i64_max);
  }
  std::string used;
  if (const json* v = aliased(r, "thread_count", "intra_op_parallelism", false, &used)) {
    a.thread_count = as_int(ctx, used, *v, 1, i64_max);
  }
  if (const json* v = plain(r, "single_submit")) {
    a.single_submit = as_bool(ctx, r.path_of("single_submit"), *v);
  }
  if (const json* v = plain(r, "overlap_events")) {
    a.overlap_events = as_bool(ctx, r.path_of("overlap_events"), *v);
  }
  ctx.note("aio", "no effect without NVMe offload, which this version does not implement yet");
  r.finish();
}

// ---- the whole config ----------------------------------------------------------------------------------

inline config parse_config(const json& root, const config_inputs& in, std::string_view source) {
  parse_context ctx;
  ctx.source = std::string(source);
  if (!root.is_object()) {
    ctx.fail("", cat("found ", show(root), " (", std::string(kind_of(root)), "); a DeepSpeed config is a JSON object"));
  }
  // First every block's keys: unknown keys, keys of another block and unimplemented features are
  // reported before any value is typed or resolved, whatever block they are in.
  for (const config_block& b : config_blocks) {
    const json* node = &root;
    std::string_view rest = b.path;
    while (node != nullptr && !rest.empty()) {
      const auto dot = rest.find('.');
      const std::string key(rest.substr(0, dot));
      const auto it = node->find(key);
      node = it != node->end() && it->is_object() ? &*it : nullptr;
      rest = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
    }
    if (node != nullptr && node->is_object()) {
      object_reader check(ctx, *node, std::string(b.path), b.keys);
    }
  }
  object_reader top(ctx, root, "", schema::top);
  config c;

  parse_fp16(ctx, top.get("fp16"), in, c.fp16);
  parse_bf16(ctx, top, in, c.bf16);
  if (c.fp16.enabled && c.bf16.enabled) {
    ctx.fail("bf16.enabled", "found true, but fp16.enabled is true too; DeepSpeed allows one of them");
  }
  parse_zero_optimization(ctx, top, in, c.zero_optimization);

  // Data types, resolved as DeepSpeed's engine does when absent.
  const dtype param = c.param_dtype();
  c.grad_accum_dtype = default_grad_accum_dtype(param, c.zero_optimization.stage);
  if (const json* dt = top.get("data_types"); dt != nullptr && !dt->is_null()) {
    object_reader r(ctx, expect_object(ctx, "data_types", *dt), "data_types", schema::data_types);
    if (const json* v = plain(r, "grad_accum_dtype"); v != nullptr && !v->is_null()) {
      const dtype g = as_choice<dtype>(ctx, r.path_of("grad_accum_dtype"), *v, dtype_names, false);
      if (g != dtype::f32 && g != param) {
        ctx.fail(r.path_of("grad_accum_dtype"),
                 cat("found ", show(*v), ", but parameters are ", std::string(name_of(param)),
                     "; gradients accumulate in fp32 or in ", "the parameter dtype (", std::string(name_of(param)),
                     ")"));
      }
      c.grad_accum_dtype = g;
    }
    r.finish();
  }
  c.communication_data_type = param;
  if (const json* v = top.get("communication_data_type"); v != nullptr && !v->is_null()) {
    c.communication_data_type = as_choice<dtype>(ctx, "communication_data_type", *v, comm_dtype_names, true);
  }

  c.optimizer = parse_optimizer(ctx, top.get("optimizer"), in);
  c.scheduler = parse_scheduler(ctx, top.get("scheduler"), in, c.optimizer);

  if (auto t =
          take(top, "gradient_clipping", to_input(in.max_grad_norm), "config_inputs::max_grad_norm (--max-grad-norm)",
               "the gradient-norm clip (config_inputs::max_grad_norm, --max-grad-norm)");
      t.value) {
    c.gradient_clipping = as_number(ctx, t.path, *t.value, 0.0, f64_max);
  }
  if (const json* v = top.get("steps_per_print"); v != nullptr && !v->is_null()) {
    c.steps_per_print = as_int(ctx, "steps_per_print", *v, 1, i64_max);
  }
  if (const json* v = top.get("wall_clock_breakdown")) {
    c.wall_clock_breakdown = as_bool(ctx, "wall_clock_breakdown", *v);
  }
  if (const json* v = top.get("comm_timeout"); v != nullptr && !v->is_null()) {
    // At least a millisecond, the communicators' resolution; at most a year.
    c.comm_timeout = as_number(ctx, "comm_timeout", *v, 0.001, 365.0 * 24 * 3600);
  }

  parse_aio(ctx, top.get("aio"), c.aio);

  // Permission flags for optimizers DeepSpeed has not tested; zero runs only its own Adam/AdamW.
  if (const json* v = top.get("zero_allow_untested_optimizer")) {
    if (as_bool(ctx, "zero_allow_untested_optimizer", *v)) {
      ctx.note("zero_allow_untested_optimizer", "no effect: zero runs its own Adam/AdamW");
    }
  }
  if (const json* v = top.get("zero_force_ds_cpu_optimizer")) {
    if (!as_bool(ctx, "zero_force_ds_cpu_optimizer", *v)) {
      ctx.note("zero_force_ds_cpu_optimizer", "no effect: zero's CPU optimizer is its own");
    }
  }

  // The batch rule comes last: it needs the world size and is the least specific error.
  c.batch_given = parse_batch(top, in);
  if (in.world_size) {
    c.world_size = *in.world_size;
    if (c.world_size < 1) {
      ctx.fail("train_batch_size", cat("the world size given (", std::to_string(c.world_size), ") must be >= 1"));
    }
  } else {
    c.world_size = 1;
    ctx.note("train_batch_size", "no world size given; batch sizes resolved for 1 data-parallel rank");
  }
  try {
    const batch_sizes b = resolve_batch(c.batch_given, c.world_size);
    c.train_batch_size = b.train_batch_size;
    c.train_micro_batch_size_per_gpu = b.train_micro_batch_size_per_gpu;
    c.gradient_accumulation_steps = b.gradient_accumulation_steps;
  } catch (const config_error& e) {
    // Add the source to the rule's message.
    std::string what = e.what();
    constexpr std::string_view prefix = "[zero.config_error] ";
    if (what.compare(0, prefix.size(), prefix) == 0) {
      what.erase(0, prefix.size());
    }
    what += in_source(ctx.source);
    throw config_error(printable(what));
  }

  top.finish();
  c.notes = std::move(ctx.notes);
  return c;
}

} // namespace detail

inline batch_sizes resolve_batch(const batch_spec& given, std::int64_t world) {
  const auto fail = [](const std::string& what) -> void {
    throw config_error(detail::cat("train_batch_size: ", what));
  };
  if (world < 1) {
    fail(detail::cat("the world size must be >= 1, found ", std::to_string(world)));
  }
  auto mul = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) {
      fail(
          detail::cat("the batch sizes overflow a 64-bit integer (", std::to_string(a), " x ", std::to_string(b), ")"));
    }
    return r;
  };
  const auto& t = given.train_batch_size;
  const auto& m = given.train_micro_batch_size_per_gpu;
  const auto& g = given.gradient_accumulation_steps;
  const std::string w = std::to_string(world);
  batch_sizes out;
  if (t && m && g) {
    const std::int64_t product = mul(mul(*m, *g), world);
    if (*t != product) {
      fail(std::to_string(*t) + " != train_micro_batch_size_per_gpu " + std::to_string(*m) +
           " x gradient_accumulation_steps " + std::to_string(*g) + " x world size " + w + " = " +
           std::to_string(product) + "; give values that agree, or leave one out (or \"auto\") to derive it");
    }
    out = {*t, *m, *g};
  } else if (t && m) {
    const std::int64_t per_step = mul(*m, world);
    if (*t % per_step != 0) {
      fail(std::to_string(*t) + " is not a multiple of train_micro_batch_size_per_gpu " + std::to_string(*m) +
           " x world size " + w + " = " + std::to_string(per_step) +
           ", so gradient_accumulation_steps cannot be derived");
    }
    out = {*t, *m, *t / per_step};
  } else if (t && g) {
    const std::int64_t per_micro = mul(*g, world);
    if (*t % per_micro != 0) {
      fail(std::to_string(*t) + " is not a multiple of gradient_accumulation_steps " + std::to_string(*g) +
           " x world size " + w + " = " + std::to_string(per_micro) +
           ", so train_micro_batch_size_per_gpu cannot be derived");
    }
    out = {*t, *t / per_micro, *g};
  } else if (m && g) {
    out = {mul(mul(*m, *g), world), *m, *g};
  } else if (t) {
    // DeepSpeed: accumulation 1, micro = train / world.
    if (*t % world != 0) {
      fail(std::to_string(*t) + " is not a multiple of the world size " + w +
           ", so train_micro_batch_size_per_gpu cannot be derived (with gradient_accumulation_steps 1)");
    }
    out = {*t, *t / world, 1};
  } else if (m) {
    out = {mul(*m, world), *m, 1};
  } else {
    std::string what = "missing; give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one)";
    if (given.micro_was_auto) {
      what = "cannot be derived: train_micro_batch_size_per_gpu is \"auto\" and no micro batch size was given; "
             "give it (config_inputs::micro_batch_size, --micro-batch-size) or write train_batch_size";
    }
    if (g) {
      what += "; gradient_accumulation_steps alone is not enough";
    }
    fail(what);
  }
  return out;
}

inline config config::from_json(const nlohmann::json& j, const config_inputs& inputs, std::string_view source) {
  detail::check_depth(j, source);
  return detail::parse_config(j, inputs, source);
}

inline config config::from_string(std::string_view text, const config_inputs& inputs, std::string_view source) {
  // parse_text has bounded the depth already.
  return detail::parse_config(detail::parse_text(text, source), inputs, source);
}

inline nlohmann::json config::read_json_file(const std::filesystem::path& path) {
  return detail::parse_text(detail::read_config_text(path), path.string());
}

inline config config::from_file(const std::filesystem::path& path, const config_inputs& inputs) {
  return from_string(detail::read_config_text(path), inputs, path.string());
}

inline config config::rebatched(std::int64_t world) const {
  config c = *this;
  const batch_sizes b = resolve_batch(batch_given, world);
  c.world_size = world;
  c.train_batch_size = b.train_batch_size;
  c.train_micro_batch_size_per_gpu = b.train_micro_batch_size_per_gpu;
  c.gradient_accumulation_steps = b.gradient_accumulation_steps;
  return c;
}

inline nlohmann::json config::to_json() const {
  using nlohmann::json;
  json j = json::object();
  j["train_batch_size"] = train_batch_size;
  j["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = gradient_accumulation_steps;
  j["gradient_clipping"] = gradient_clipping;
  j["steps_per_print"] = steps_per_print ? json(*steps_per_print) : json(nullptr);
  j["wall_clock_breakdown"] = wall_clock_breakdown;
  j["comm_timeout"] = comm_timeout ? json(*comm_timeout) : json(nullptr);
  j["fp16"] = {{"enabled", fp16.enabled},
               {"loss_scale", fp16.loss_scale},
               {"initial_scale_power", fp16.initial_scale_power},
               {"loss_scale_window", fp16.loss_scale_window},
               {"hysteresis", fp16.hysteresis},
               {"consecutive_hysteresis", fp16.consecutive_hysteresis},
               {"min_loss_scale", fp16.min_loss_scale}};
  j["bf16"] = {{"enabled", bf16.enabled}};
  j["data_types"] = {{"grad_accum_dtype", name_of(grad_accum_dtype)}};
  j["communication_data_type"] = name_of(communication_data_type);
  if (optimizer) {
    j["optimizer"] = {{"type", name_of(optimizer->type)},
                      {"params",
                       {{"lr", optimizer->lr},
                        {"betas", {optimizer->betas[0], optimizer->betas[1]}},
                        {"eps", optimizer->eps},
                        {"weight_decay", optimizer->weight_decay},
                        {"adam_w_mode", optimizer->adam_w_mode},
                        {"bias_correction", optimizer->bias_correction}}}};
  }
  if (scheduler) {
    const scheduler_config& s = *scheduler;
    json p = json::object();
    if (s.type != scheduler_type::warmup_cosine_lr) {
      p["warmup_min_lr"] = s.warmup_min_lr;
      p["warmup_max_lr"] = s.warmup_max_lr ? json(*s.warmup_max_lr) : json(nullptr);
    } else {
      p["warmup_min_ratio"] = s.warmup_min_ratio;
      p["cos_min_ratio"] = s.cos_min_ratio;
    }
    if (s.type != scheduler_type::warmup_lr) {
      p["total_num_steps"] = s.total_num_steps;
    }
    p["warmup_num_steps"] = s.warmup_num_steps;
    p["warmup_type"] = name_of(s.warmup_type);
    p["last_batch_iteration"] = s.last_batch_iteration;
    j["scheduler"] = {{"type", name_of(s.type)}, {"params", p}};
  }
  const zero_optimization_config& z = zero_optimization;
  j["zero_optimization"] = {{"stage", z.stage},
                            {"contiguous_gradients", z.contiguous_gradients},
                            {"overlap_comm", z.overlap_comm},
                            {"reduce_scatter", z.reduce_scatter},
                            {"reduce_bucket_size", z.reduce_bucket_size},
                            {"allgather_partitions", z.allgather_partitions},
                            {"offload_optimizer",
                             {{"device", name_of(z.offload_optimizer.device)},
                              {"nvme_path", z.offload_optimizer.nvme_path},
                              {"pin_memory", z.offload_optimizer.pin_memory},
                              {"buffer_count", z.offload_optimizer.buffer_count},
                              {"ratio", z.offload_optimizer.ratio}}},
                            {"offload_param",
                             {{"device", name_of(z.offload_param.device)},
                              {"nvme_path", z.offload_param.nvme_path},
                              {"pin_memory", z.offload_param.pin_memory},
                              {"buffer_count", z.offload_param.buffer_count},
                              {"buffer_size", z.offload_param.buffer_size},
                              {"max_in_cpu", z.offload_param.max_in_cpu}}},
                            {"sub_group_size", z.sub_group_size},
                            {"stage3_max_live_parameters", z.stage3_max_live_parameters},
                            {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
                            {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
                            {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
                            {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
                            {"round_robin_gradients", z.round_robin_gradients},
                            {"ignore_unused_parameters", z.ignore_unused_parameters},
                            {"elastic_checkpoint", z.elastic_checkpoint}};
  // null: unset, zero's in-place gathers (see config.hpp)
  j["zero_optimization"]["allgather_bucket_size"] =
      z.allgather_bucket_size ? nlohmann::json(*z.allgather_bucket_size) : nlohmann::json(nullptr);
  j["aio"] = {{"block_size", aio.block_size},
              {"queue_depth", aio.queue_depth},
              {"thread_count", aio.thread_count},
              {"single_submit", aio.single_submit},
              {"overlap_events", aio.overlap_events}};
  return j;
}

} // namespace zero
