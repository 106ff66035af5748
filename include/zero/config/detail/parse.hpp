#pragma once
/// \file
/// The definitions of `zero::config`'s reader and writer, driven by the key tables of
/// `zero/config/schema.hpp`, which includes this file at its end. Each block is read by its table
/// (`read_keys`); the code here reads what the tables mark `by_hand`: the blocks themselves, the
/// precision switches, the batch rule, the dtypes and optimizer modes that derive from other keys,
/// and the checks that span keys.

#include "zero/config/detail/batch.hpp"
#include "zero/config/detail/foreign_params.hpp"
#include "zero/config/detail/hand_keys.hpp"
#include "zero/config/detail/json_text.hpp"
#include "zero/config/detail/key_row.hpp"
#include "zero/config/detail/offload_rules.hpp"
#include "zero/config/detail/reader.hpp"
#include "zero/config/schema.hpp" // the tables; includes this file at its end

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {
namespace detail {

/// The object `v` at `path`, opened for reading by the table `Table`: unknown keys, keys of another
/// block and unimplemented features are refused here.
template <const auto& Table> object_reader open_block(parse_context& ctx, const json& v, const std::string& path) {
  return object_reader(ctx, expect_object(ctx, path, v), path, key_names<Table>);
}

/// Every block other than `block` that reads a key named `key`, as JSON paths: the "belongs in"
/// hint for a key written in the wrong block.
inline std::vector<std::string> blocks_with_key(std::string_view block, std::string_view key) {
  std::vector<std::string> out;
  for (const config_block& b : config_blocks) {
    if (b.path != block && b.path != "bfloat16" && std::find(b.keys.begin(), b.keys.end(), key) != b.keys.end()) {
      out.push_back(join_path(b.path, key));
    }
  }
  return out;
}

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
  object_reader r = open_block<fp16_keys>(ctx, *block, "fp16");
  out.enabled = precision_enabled(r, in, dtype::f16);
  read_keys(r, fp16_keys, out, in);
  // Every key but enabled sets up the loss scaler.
  if (!out.enabled && std::any_of(std::begin(fp16_keys), std::end(fp16_keys), [&](const key_row<fp16_config>& row) {
        return row.name != "enabled" && r.has(row.name);
      })) {
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
  object_reader r = open_block<bf16_keys>(ctx, *block, name);
  out.enabled = precision_enabled(r, in, dtype::bf16);
  read_keys(r, bf16_keys, out, in);
  r.finish();
}

// ---- zero_optimization ---------------------------------------------------------------------------

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
  object_reader r = open_block<zero_optimization_keys>(ctx, *block, "zero_optimization");
  read_keys(r, zero_optimization_keys, z, in);
  const int stage = z.stage;

  // Offload needs a stage that shards what is offloaded.
  if (z.offload_optimizer.device != offload_device::none && stage == 0) {
    ctx.fail("zero_optimization.offload_optimizer.device",
             cat("found \"", name_of(z.offload_optimizer.device),
                 "\", but offload_optimizer needs ZeRO stage 1, 2 or 3 and zero_optimization.stage is 0"));
  }
  const auto refuse = [&](const char* key, const std::string& why) {
    if (!why.empty()) {
      ctx.fail(cat("zero_optimization.", key), why);
    }
  };
  refuse("offload_param.device", offload_param_stage_refusal(z.offload_param.device, stage));
  refuse("offload_optimizer.nvme_path",
         nvme_path_refusal(z.offload_optimizer.device, z.offload_optimizer.nvme_path, "the optimizer state"));
  const auto& opt = z.offload_optimizer;
  if (opt.device == offload_device::cpu && stage < 3 && (opt.ratio_auto || opt.ratio < 1)) {
    ctx.note("zero_optimization.offload_optimizer.ratio",
             cat("DeepSpeed applies ratio at stage 3 only (at stage ", std::to_string(stage),
                 " it offloads all the optimizer state); zero splits the state at stages 1 and 2 too"));
  }
  refuse("offload_param.nvme_path",
         nvme_path_refusal(z.offload_param.device, z.offload_param.nvme_path, "the parameter shard"));
  refuse("offload_optimizer.host_ratio", host_ratio_param_refusal(z.offload_optimizer, z.offload_param.device));
  // qgZ's node: consecutive ranks of the data group, so a divisor of its size; one node size with hpZ.
  if (z.zero_quantized_gradients_node_size && stage >= 2) {
    const std::int64_t h = *z.zero_quantized_gradients_node_size;
    const std::string path = "zero_optimization.zero_quantized_gradients_node_size";
    if (!z.zero_quantized_gradients) {
      ctx.note(path, "no effect: zero_quantized_gradients is false");
    } else if (stage == 3 && z.zero_hpz_partition_size > 1 && z.zero_hpz_partition_size != h) {
      ctx.fail(path, cat("found ", std::to_string(h), ", but zero_hpz_partition_size is ",
                         std::to_string(z.zero_hpz_partition_size),
                         "; both name the ranks of a node, expected the same size (or leave this key out)"));
    } else if (in.world_size && *in.world_size >= 1 && *in.world_size % h != 0) {
      ctx.fail(path, cat("found ", std::to_string(h), ", which does not divide the ", std::to_string(*in.world_size),
                         " ranks of the data group; expected the ranks of a node, a divisor of the group's size"));
    }
  }
  // HSDP (MiCS): groups of consecutive ranks, so a divisor of the communicator's size.
  if (z.mics_shard_size != -1 && stage >= 1) {
    const std::int64_t h = z.mics_shard_size;
    const std::string path = "zero_optimization.mics_shard_size";
    if (h == 0) {
      ctx.fail(path, "found 0; expected -1 (no HSDP) or the ranks of a shard group, at least 1");
    } else if (in.world_size && *in.world_size >= 1 && *in.world_size % h != 0) {
      ctx.fail(path, cat("found ", std::to_string(h), ", which does not divide the ", std::to_string(*in.world_size),
                         " ranks; expected the ranks of a shard group, a divisor of the communicator's size"));
    }
  }
  note_stages(r, zero_optimization_keys, stage);
  note_values(r, zero_optimization_keys, stage);
  r.finish();
}

// ---- optimizer and scheduler -----------------------------------------------------------------------

/// The framework's rule of `in.optimizers` that the block's `optimizer.type` names (ignoring case), or null; every
/// entry is checked first. \throws config_error for an entry without a name, with one of DeepSpeed's, with a
/// parameter zero does not read into `adamw_step_args` or with more than two state tensors.
inline const custom_optimizer* custom_type_of(const json& block, const config_inputs& in) {
  const auto same = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
  };
  constexpr std::string_view not_read[] = {"adam_w_mode", "torch_adam", "max_grad_norm"};
  for (const auto& c : in.optimizers) {
    const std::string what = cat("config_inputs::optimizers: \"", c.name, "\"");
    if (c.name.empty()) {
      throw config_error("config_inputs::optimizers: an entry without a name; expected the optimizer.type it answers");
    }
    for (const auto& t : optimizer_types) {
      if (same(t.name, c.name)) {
        throw config_error(cat(what, " is DeepSpeed's ", t.name, "; a framework's rule needs a name of its own"));
      }
    }
    if (c.state.size() > 2) {
      throw config_error(cat(what, " keeps ", std::to_string(c.state.size()),
                             " state tensors; expected at most 2 (zero::max_rule_state)"));
    }
    for (const auto& k : c.params) {
      const bool known = std::any_of(std::begin(optimizer_params_keys), std::end(optimizer_params_keys),
                                     [&](const auto& row) { return row.name == k; });
      if (!known || std::find(std::begin(not_read), std::end(not_read), k) != std::end(not_read)) {
        throw config_error(cat(what, " takes \"", k,
                               "\", which zero does not read into adamw_step_args; expected some of lr, betas, "
                               "eps, weight_decay, bias_correction, momentum, dampening, nesterov, lr_decay, "
                               "initial_accumulator_value, max_coeff, min_coeff, eps_inside_sqrt"));
      }
    }
  }
  const auto t = block.find("type");
  if (t == block.end() || !t->is_string()) {
    return nullptr;
  }
  for (const auto& c : in.optimizers) {
    if (same(c.name, t->get<std::string>())) {
      return &c;
    }
  }
  return nullptr;
}

/// The block of a framework's rule `c`: the keys it declares (a key it does not declare is refused by name), with
/// zero's defaults (bias correction off unless it takes `bias_correction`).
inline optimizer_config parse_custom_optimizer(parse_context& ctx, object_reader& r, const custom_optimizer& c,
                                               const config_inputs& in) {
  optimizer_config o;
  o.type = optimizer_type::custom;
  o.custom = c.name;
  o.custom_params = c.params;
  o.custom_state = c.state;
  o.bias_correction = false;
  static_cast<void>(r.get("type"));
  const json* params = r.get("params");
  r.finish();
  const json empty = json::object();
  object_reader p = open_block<optimizer_params_keys>(ctx, params == nullptr || params->is_null() ? empty : *params,
                                                      "optimizer.params");
  const auto takes = [&](std::string_view k) {
    return std::find(c.params.begin(), c.params.end(), k) != c.params.end();
  };
  refuse_keys_outside(ctx, p, params, c.name, c.params,
                      [](const std::string&) { return std::string("; config_inputs::optimizers gives its keys"); });
  if (takes("bias_correction")) {
    o.bias_correction = true;
    read_named(p, optimizer_params_keys, "bias_correction", o, in);
  }
  read_keys(p, optimizer_params_keys, o, in);
  p.finish();
  return o;
}

inline std::optional<optimizer_config> parse_optimizer(parse_context& ctx, const json* block, const config_inputs& in) {
  if (block == nullptr) {
    return std::nullopt;
  }
  object_reader r = open_block<optimizer_keys>(ctx, *block, "optimizer");
  if (const custom_optimizer* c = custom_type_of(*block, in)) {
    return parse_custom_optimizer(ctx, r, *c, in);
  }
  optimizer_config o;
  if (!r.has("type")) {
    ctx.fail("optimizer.type", "missing; expected \"Adam\", \"AdamW\", \"Lion\", \"SGD\", \"Adagrad\" or \"Lamb\" "
                               "(without a type DeepSpeed ignores the optimizer block)");
  }
  refuse_unknown_type(ctx, *block, "optimizer.type", optimizer_types,
                      "a framework's own rule declared in config_inputs::optimizers (docs/optimizers.md)");
  read_named(r, optimizer_keys, "type", o, in);
  const json* params = r.get("params");
  r.finish();
  const json empty = json::object();
  object_reader p = open_block<optimizer_params_keys>(ctx, params == nullptr || params->is_null() ? empty : *params,
                                                      "optimizer.params");
  refuse_foreign_params(ctx, p, params, o.type, optimizer_types, optimizer_params);
  if (o.type != optimizer_type::adam && o.type != optimizer_type::adamw) {
    // The other rules' defaults (DeepSpeed's Lion and Lamb, torch.optim's SGD and Adagrad); Lamb reads Adam's
    // bias_correction, the others none of Adam's own keys.
    if (o.type == optimizer_type::lion) {
      o.betas = {0.9, 0.99};
    } else if (o.type == optimizer_type::adagrad) {
      o.lr = 1e-2;
      o.eps = 1e-10;
    }
    // Lion and Lamb decouple their decay (Lamb adds it to the direction, not the gradient); SGD and Adagrad add L2.
    o.adam_w_mode = o.type == optimizer_type::lion || o.type == optimizer_type::lamb;
    o.bias_correction = o.type == optimizer_type::lamb;
    if (o.type == optimizer_type::lamb) {
      read_named(p, optimizer_params_keys, "bias_correction", o, in);
    }
    read_keys(p, optimizer_params_keys, o, in);
    if (o.max_grad_norm != 0.0) {
      ctx.fail(p.path_of("max_grad_norm"),
               cat("found ", show(json(o.max_grad_norm)),
                   "; zero clips the global gradient norm before every rule with gradient_clipping, as DeepSpeed "
                   "does beside FusedLamb's own clip: set gradient_clipping to it and max_grad_norm to 0"));
    }
    if (o.min_coeff > o.max_coeff) {
      ctx.fail(p.path_of("min_coeff"), cat("found ", show(json(o.min_coeff)), " above max_coeff ",
                                           show(json(o.max_coeff)), "; expected min_coeff <= max_coeff"));
    }
    if (o.nesterov && (o.momentum <= 0.0 || o.dampening != 0.0)) {
      ctx.fail(p.path_of("nesterov"),
               cat("true with momentum ", show(json(o.momentum)), " and dampening ", show(json(o.dampening)),
                   "; Nesterov momentum needs momentum above 0 and dampening 0 (torch.optim.SGD "
                   "refuses it)"));
    }
    p.finish();
    return o;
  }

  bool torch_adam = false;
  if (const json* v = p.get("torch_adam")) {
    torch_adam = as_bool(ctx, p.path_of("torch_adam"), *v);
    if (torch_adam) {
      ctx.note(p.path_of("torch_adam"), "zero runs its own Adam/AdamW; only PyTorch's defaults are taken from "
                                        "torch_adam (weight_decay 0.01 for AdamW)");
    }
  }
  if (read_named(p, optimizer_params_keys, "adam_w_mode", o, in) && o.type == optimizer_type::adamw && !o.adam_w_mode) {
    ctx.fail(p.path_of("adam_w_mode"), "found false, but optimizer.type \"AdamW\" always decouples weight decay; "
                                       "for Adam with L2 weight decay write \"type\": \"Adam\" with adam_w_mode false");
  }
  // DeepSpeed: type AdamW, or type Adam unless adam_w_mode is false, runs AdamW.
  o.adam_w_mode = o.type == optimizer_type::adamw || o.adam_w_mode;
  if (read_named(p, optimizer_params_keys, "bias_correction", o, in) && torch_adam) {
    ctx.fail(p.path_of("bias_correction"), cat("found ", show(json(o.bias_correction)),
                                               " with torch_adam true; torch.optim.Adam and "
                                               "AdamW take no bias_correction (DeepSpeed would fail), remove one"));
  }
  o.weight_decay = torch_adam && o.adam_w_mode ? 0.01 : 0.0;
  read_keys(p, optimizer_params_keys, o, in);
  p.finish();
  return o;
}

inline std::optional<scheduler_config> parse_scheduler(parse_context& ctx, const json* block, const config_inputs& in,
                                                       const std::optional<optimizer_config>& optimizer) {
  if (block == nullptr) {
    return std::nullopt;
  }
  object_reader r = open_block<scheduler_keys>(ctx, *block, "scheduler");
  scheduler_config s;
  if (!r.has("type")) {
    ctx.fail("scheduler.type", "missing; expected \"WarmupLR\", \"WarmupDecayLR\", \"WarmupCosineLR\", "
                               "\"LRRangeTest\" or \"OneCycle\"");
  }
  read_named(r, scheduler_keys, "type", s, in);
  const json* params = r.get("params");
  r.finish();
  if (params != nullptr && params->is_null()) {
    params = nullptr;
  }
  const json empty = json::object();
  object_reader p = open_block<scheduler_params_keys>(ctx, params == nullptr ? empty : *params, "scheduler.params");
  // Each schedule takes only the parameters of its constructor in DeepSpeed.
  refuse_foreign_params(ctx, p, params, s.type, scheduler_types, schedule_params);
  read_keys(p, scheduler_params_keys, s, in);
  if (s.type == scheduler_type::one_cycle) {
    if (s.cycle_first_step_size == 0) {
      ctx.fail(p.path_of("cycle_first_step_size"),
               "found 0; expected a positive number of steps (DeepSpeed refuses 0)");
    }
    if (s.cycle_momentum) {
      ctx.note(p.path_of("cycle_momentum"),
               cat("true: Adam's beta1 cycles between ", show(json(s.cycle_max_mom)), " and ",
                   show(json(s.cycle_min_mom)),
                   " and beta2 is 0.99, in place of optimizer.params.betas, as DeepSpeed's OneCycle sets them"));
    }
  }
  if (!s.warmup_max_lr && schedule_takes(s.type, "warmup_max_lr")) {
    if (s.type == scheduler_type::warmup_decay_lr) {
      s.warmup_max_lr = 0.001;
    } else if (optimizer) {
      s.warmup_max_lr = optimizer->lr;
    }
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

inline void parse_aio(parse_context& ctx, const json* block, const config_inputs& in, aio_config& a, bool nvme) {
  if (block == nullptr || block->is_null()) {
    return;
  }
  object_reader r = open_block<aio_keys>(ctx, *block, "aio");
  read_keys(r, aio_keys, a, in);
  if (!nvme) {
    ctx.note("aio", "no effect without NVMe offload (offload_optimizer.device or offload_param.device \"nvme\")");
  }
  // NVMe offload moves the optimizer state in chunks of block_size / 4 fp32 elements (times
  // queue_depth): a block of fewer than 4 bytes made 1-element chunks, 400 times slower.
  if (a.block_size < static_cast<std::int64_t>(sizeof(float))) {
    ctx.fail("aio.block_size", cat("found ", std::to_string(a.block_size),
                                   "; expected at least 4 bytes (one fp32 element of the optimizer's NVMe chunks; "
                                   "DeepSpeed's default is 1048576)"));
  }
  if (nvme && a.block_size < 4096) {
    ctx.note("aio.block_size", cat(std::to_string(a.block_size),
                                   " bytes per request is legal but slow: a drive reaches its bandwidth with requests "
                                   "of 128 KiB and more, and O_DIRECT (the uring storage) rounds up to 4096 bytes "
                                   "(DeepSpeed's default is 1048576)"));
  }
  r.finish();
}

// ---- model parallelism ---------------------------------------------------------------------------

/// A block of keys read by their rows alone, each noted where its row says so: `pipeline` and
/// `tensor_parallel`.
template <const auto& Table, class S>
void parse_plain_block(parse_context& ctx, const json* block, const std::string& name, const config_inputs& in,
                       S& out) {
  if (block == nullptr || block->is_null()) {
    return;
  }
  object_reader r = open_block<Table>(ctx, *block, name);
  read_keys(r, Table, out, in);
  note_values(r, Table, 0);
  r.finish();
}

// ---- the whole config ----------------------------------------------------------------------------------

inline config parse_config(const json& root, const config_inputs& in, std::string_view source) {
  parse_context ctx;
  ctx.source = std::string(source);
  ctx.elsewhere = &blocks_with_key;
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
  object_reader top(ctx, root, "", key_names<top_keys>);
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
    object_reader r = open_block<data_types_keys>(ctx, *dt, "data_types");
    if (read_named(r, data_types_keys, "grad_accum_dtype", c, in) && c.grad_accum_dtype != dtype::f32 &&
        c.grad_accum_dtype != param) {
      ctx.fail(r.path_of("grad_accum_dtype"),
               cat("found ", show(*r.get("grad_accum_dtype")), ", but parameters are ", name_of(param),
                   "; gradients accumulate in fp32 or in the parameter dtype (", name_of(param), ")"));
    }
    r.finish();
  }
  // zero reduces gradients in their accumulation dtype: that is the only value the key may name.
  c.communication_data_type = c.grad_accum_dtype;
  if (read_named(top, top_keys, "communication_data_type", c, in) && c.communication_data_type != c.grad_accum_dtype) {
    ctx.fail("communication_data_type", communication_dtype_refusal(c.communication_data_type, c.grad_accum_dtype));
  }

  c.optimizer = parse_optimizer(ctx, top.get("optimizer"), in);
  c.scheduler = parse_scheduler(ctx, top.get("scheduler"), in, c.optimizer);
  read_keys(top, top_keys, c, in);
  parse_aio(ctx, top.get("aio"), in, c.aio,
            c.zero_optimization.offload_optimizer.device == offload_device::nvme ||
                c.zero_optimization.offload_param.device == offload_device::nvme);
  parse_plain_block<pipeline_keys>(ctx, top.get("pipeline"), "pipeline", in, c.pipeline);
  parse_plain_block<tensor_parallel_keys>(ctx, top.get("tensor_parallel"), "tensor_parallel", in, c.tensor_parallel);
  parse_plain_block<checkpoint_keys>(ctx, top.get("checkpoint"), "checkpoint", in, c);
  parse_plain_block<activation_checkpointing_keys>(ctx, top.get("activation_checkpointing"), "activation_checkpointing",
                                                   in, c.activation_checkpointing);
  note_values(top, top_keys, 0);

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

} // namespace zero

#include "zero/config/detail/config_members.hpp" // config's readers and writer, over the parse above
