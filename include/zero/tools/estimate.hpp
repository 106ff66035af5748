#pragma once
/// \file
/// Memory estimates for model states, as `zero-estimate` prints them:
///
/// - DeepSpeed's own formulas, reproduced exactly: `estimate_zero2_model_states_mem_needs` (in
///   deepspeed/runtime/zero/stage_1_and_2.py) and `estimate_zero3_model_states_mem_needs` (in
///   deepspeed/runtime/zero/stage3.py), with the tables their `*_all_cold` functions print;
/// - zero's own accounting of the bytes each rank and each node holds for every stage and offload
///   choice, from the ZeRO paper's model-state table in docs/design.md plus the communication buffers the
///   config asks for.
///
/// A model is a parameter count, or a description file listing modules and their parameter shapes
/// (the largest module is stage 3's working set). Needs nlohmann-json.

#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/param_registry.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/tools/deepspeed_estimate.hpp"
#include "zero/tools/model_description.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace zero::tools {

using zero::detail::cat;

/// The largest model the estimates accept: 1e15 parameters keeps every byte count inside int64.
inline constexpr std::int64_t max_params = 1'000'000'000'000'000;

// ---- zero's accounting ---------------------------------------------------------------------------

/// A described model's elements as the engine lays them out (its `param_registry`, finalized by
/// `registry_layout`): every parameter starts on a `buffer_alignment` (256-byte) boundary and every segment is
/// padded to a multiple of ranks x 256 bytes, so a rank holds a little more than ceil(Ψ / N) elements. The
/// padding is below 256 bytes per parameter and ranks x 256 bytes per segment: negligible for a large model,
/// a few percent for one of many small tensors, more with 16-bit parameters (128 elements per 256 bytes).
struct padded_sizes {
  std::int64_t bucket_total = 0; ///< stages 0-2: elements of the flat buffer (segments: reduce buckets)
  std::int64_t bucket_shard = 0; ///< stages 0-2: elements of one rank's shard
  /// stage 3: elements of one rank's shard (a segment per module, and one for the parameters below
  /// stage3_param_persistence_threshold)
  std::int64_t module_shard = 0;
  /// stage 3: elements of the persistent parameters' segment, which every rank also keeps whole
  std::int64_t persistent_total = 0;
};

/// The most parameter tensors (repeats counted) `padded_sizes_of` lays out; a larger description is counted
/// without padding.
inline constexpr std::int64_t max_laid_out_tensors = std::int64_t{1} << 18;

/// `m` laid out by the engine's registry in `type` over `shard_ranks` ranks, with reduce buckets of
/// `reduce_bucket_size` elements at stages 0-2 and, at stage 3, the parameters below `persistence_threshold`
/// elements in a segment of their own, as the engine does. \returns nothing when `m` lists no modules (a
/// parameter count alone) or more than `max_laid_out_tensors` tensors.
[[nodiscard]] inline std::optional<padded_sizes> padded_sizes_of(const model_summary& m, dtype type,
                                                                 std::int64_t shard_ranks,
                                                                 std::int64_t reduce_bucket_size,
                                                                 std::int64_t persistence_threshold) {
  std::int64_t tensors = 0;
  for (const auto& mod : m.module_list) {
    tensors += mod.repeat * static_cast<std::int64_t>(mod.params.size());
  }
  if (m.module_list.empty() || tensors > max_laid_out_tensors || shard_ranks < 1 ||
      shard_ranks > std::numeric_limits<int>::max()) {
    return std::nullopt;
  }
  struct laid_out {
    std::int64_t total, shard, persistent;
  };
  // Each repeat a module of its own, as a framework registers layer after layer; names by position, since a
  // description's module names need not be unique.
  auto lay_out = [&](int stage) {
    param_registry reg(type, 1e-3, 0.0, registry_persistence(stage, persistence_threshold));
    for (std::size_t i = 0; i < m.module_list.size(); ++i) {
      const auto& mod = m.module_list[i];
      for (std::int64_t r = 0; r < mod.repeat; ++r) {
        const std::string name = cat("m", std::to_string(i), ".", std::to_string(r));
        const int id = reg.add_module(name);
        for (std::size_t k = 0; k < mod.params.size(); ++k) {
          static_cast<void>(reg.add_param(id, cat(name, ".", std::to_string(k)), {mod.params[k]}, {}));
        }
      }
    }
    reg.finalize(registry_layout(stage, static_cast<int>(shard_ranks), reduce_bucket_size, type));
    laid_out out{.total = static_cast<std::int64_t>(reg.layout().total_size()),
                 .shard = static_cast<std::int64_t>(reg.layout().shard_size()),
                 .persistent = 0};
    for (const std::size_t u : reg.module_units().second) {
      out.persistent += static_cast<std::int64_t>(reg.layout().segments()[u].range.size());
    }
    return out;
  };
  const laid_out buckets = lay_out(2); // stages 0-2 share the bucket layout (and keep nothing whole)
  const laid_out modules = lay_out(3);
  return padded_sizes{.bucket_total = buckets.total,
                      .bucket_shard = buckets.shard,
                      .module_shard = modules.shard,
                      .persistent_total = modules.persistent};
}

/// What zero-estimate accounts for. Sizes in elements unless named bytes.
struct estimate_options {
  std::int64_t params = 0; ///< parameters in the model (Ψ)
  /// parameters of the largest module stage 3 gathers (its working set and its reduce buffer);
  /// parameters below stage3_param_persistence_threshold stay whole and are not part of it
  std::int64_t largest_layer_params = 0;
  /// elements of the largest single parameter; at stages 1-2 a parameter larger than
  /// reduce_bucket_size is a segment of its own, so stage 2's gradient staging buffer and NVMe's largest
  /// owned range grow to it. 0: unknown, taken as no larger than a bucket.
  std::int64_t largest_param_params = 0;
  /// elements of the parameters below stage3_param_persistence_threshold (stage 3 keeps them whole).
  /// Their gradients stage in a buffer of their own, held until the last of them is ready, beside the
  /// one the modules' gradients cycle through. 0: none, or unknown.
  std::int64_t persistent_params = 0;
  std::int64_t gpus_per_node = 1;  ///< ranks per node
  std::int64_t nodes = 1;          ///< nodes
  dtype param_dtype = dtype::bf16; ///< dtype of parameters (fp32, fp16, bf16)
  /// The update rule's fp32 state tensors per parameter beside the master (`rule_state`: 2 for Adam/AdamW, 1 for
  /// Lion, Adagrad and SGD with momentum, 0 for SGD without), and whether it is Adam/AdamW (the only rule the
  /// NVMe optimizer runs: another rule's nvme rows are marked as not run).
  std::int64_t state_tensors = 2;
  bool adam = true;
  /// Whether the rule's state may be split between the device and host memory (offload_optimizer.ratio below 1,
  /// which the plan proposes): every rule but Lamb, whose host step waits for every gradient of the step.
  bool partial_offload = true;
  /// The rule's name for the estimate's header ("Adam/AdamW", "Lion", "SGD", "Adagrad", "Lamb").
  std::string rule_name = "Adam/AdamW";
  /// dtype gradients accumulate in; empty: the config's default at each stage
  /// (`default_grad_accum_dtype`: fp32 for bf16 at stage 0, the parameter dtype otherwise)
  std::optional<dtype> grad_dtype;
  std::int64_t reduce_bucket_size = 500'000'000; ///< zero_optimization.reduce_bucket_size
  /// zero_optimization.allgather_bucket_size; empty: unset, every bucket all-gathered in place
  std::optional<std::int64_t> allgather_bucket_size;
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;   ///< zero_optimization.stage3_prefetch_bucket_size
  std::int64_t stage3_max_live_parameters = 1'000'000'000; ///< zero_optimization.stage3_max_live_parameters
  /// zero_optimization.stage3_keep_param_shard: stage 3 without offload keeps its 16-bit shard (else,
  /// for 16-bit parameters, its gathers cast the fp32 master and no shard is kept)
  bool stage3_keep_param_shard = false;
  std::int64_t sub_group_size = 1'000'000'000;     ///< optimizer tile for NVMe offload
  std::int64_t offload_optimizer_buffer_count = 4; ///< offload_optimizer.buffer_count
  /// offload_optimizer.ratio of the cpu rows: the share of the state (and of the shards staged for it)
  /// in host memory; the device keeps the rest of the state (partial offload)
  double offload_ratio = 1.0;
  /// offload_optimizer.forward_overlap of the cpu rows with offload_ratio below 1 (stages 2-3): the host's
  /// share streams its reduced gradients to the host during backward, so the GPU keeps only the device
  /// share's part of the gradient shard and two staging buffers.
  bool offload_forward_overlap = false;
  /// offload_optimizer.host_ratio of the nvme rows (zero's own key): the share of the state in host memory,
  /// stepped there as in the cpu rows, the rest on NVMe; the GPU then keeps the gradient shard at stages 2-3
  /// (the engine keeps the reduced gradients on the device for a split state). 0: the whole state on NVMe.
  double host_ratio = 0;
  /// The config's offload_optimizer.host_ratio, as written (`estimate_options_from`): `plan_config_block`
  /// writes the key where it is set, so that a merged block replaces it.
  double config_host_ratio = 0;
  /// The config's offload_optimizer.backward_overlap and forward_overlap (zero's own keys) and its
  /// gradient_accumulation_steps, as written (`estimate_options_from`); not counted in any row.
  /// `plan_config_block` keeps the keys where its row runs them and turns them off where the engine
  /// refuses them.
  double config_backward_overlap = 0;
  bool config_forward_overlap = false;
  /// The config's offload_optimizer.delayed_update.warmup_steps (zero's own block), or -1 without the block: the rows
  /// that run it (`delayed_update_runs`) hold the host gradient shard twice. `plan_config_block` keeps the block
  /// where its row runs it and turns it off elsewhere.
  std::int64_t config_delayed_warmup = -1;
  /// The config's zero_optimization.zenflow.topk_ratio, or empty without the block: the rows that run it
  /// (`zenflow_runs`) add the host's fp32 window, 4 bytes per state element, and on the
  /// GPU the compact state of the chosen columns, topk_ratio of the shard (an estimate: the engine chooses every
  /// element of a parameter that is not a 2-D weight too) at 4 bytes of index, 12 of state and p + g of
  /// parameter and gradient each.
  std::optional<double> config_zenflow_topk;
  /// The config's zero_optimization.zenflow.update_interval (1 without the block): `estimate_step_cost` prices a
  /// ZenFlow row's host AdamW and parameter upload once per that many steps.
  std::int64_t config_zenflow_update_interval = 1;
  /// The config's zero_optimization.zenflow.overlap_step: its rows hold the host gradient shard twice, and
  /// `estimate_step_cost` credits its host update with running beside the interval's forward and backward.
  bool config_zenflow_overlap = false;
  /// Seconds of one step's forward and backward on one rank, as the user measured them (zero-estimate's
  /// --forward-ms and --backward-ms); 0: not given. `estimate_step_cost` credits a row that runs the delayed
  /// update with hiding the host's AdamW behind them, and with nothing where they are not given.
  double compute_seconds = 0;
  std::int64_t gradient_accumulation_steps = 1;
  /// State elements per NVMe chunk buffer and tensor: aio.block_size / 4 x aio.queue_depth (the defaults
  /// 1 MiB and 8), at most the largest owned range.
  std::int64_t nvme_chunk_elements = (std::int64_t{1} << 20) / 4 * 8;
  std::int64_t offload_param_buffer_count = 5;           ///< offload_param.buffer_count
  std::int64_t offload_param_buffer_size = 100'000'000;  ///< offload_param.buffer_size
  std::int64_t offload_param_max_in_cpu = 1'000'000'000; ///< offload_param.max_in_cpu
  /// zero_optimization.zero_hpz_partition_size H (ZeRO++'s hpZ, docs/zeropp.md): at stage 3 each rank
  /// keeps a secondary partition of the 16-bit parameters over its node group of H ranks, about P Ψ / H
  /// bytes of device model state; 1: none. Must divide the ranks.
  std::int64_t hpz_partition_size = 1;
  /// zero_optimization.mics_shard_size H (HSDP, docs/zeropp.md): stages 1-3 shard over groups of H ranks
  /// and replicate across them, so each rank holds what an H-rank group holds; the engine runs it without
  /// offload only. -1 (or the ranks): one group. Must divide the ranks.
  std::int64_t mics_shard_size = -1;
  /// The described model as the engine lays it out (`padded_sizes_of`, for the shard ranks, param_dtype,
  /// reduce_bucket_size and persistence threshold above); empty (a parameter count alone): Ψ elements in all and
  /// ceil(Ψ / N) per rank, no padding.
  std::optional<padded_sizes> padded;

  /// The ranks the model state is sharded over at stages 1-3: the shard group's with HSDP, else all.
  [[nodiscard]] std::int64_t shard_ranks() const noexcept {
    return mics_shard_size > 0 && mics_shard_size < ranks() ? mics_shard_size : ranks();
  }
  /// Data-parallel ranks: nodes x gpus_per_node.
  [[nodiscard]] std::int64_t ranks() const noexcept { return nodes * gpus_per_node; }
};

/// Bytes of one stage/offload choice.
struct estimate_row {
  int stage = 0;                                           ///< 0..3
  offload_device offload_optimizer = offload_device::none; ///< where optimizer state lives
  offload_device offload_param = offload_device::none;     ///< where parameter shards live (stage 3)
  dtype grad_dtype = dtype::f32;                           ///< the gradient dtype this row counts
  std::int64_t gpu_model_state_bytes = 0; ///< params, grads and optimizer state on one GPU (the docs/design.md table)
  std::int64_t gpu_buffer_bytes = 0;      ///< gradient buckets and the stage-3 gathered working set
  std::int64_t gpu_bytes_per_rank = 0;    ///< the two above
  std::int64_t host_bytes_per_rank = 0;   ///< offloaded state and staging buffers of one rank
  std::int64_t host_bytes_per_node = 0;   ///< host_bytes_per_rank x gpus_per_node
  std::int64_t nvme_bytes_per_node = 0;   ///< state on NVMe, per node
  /// true where this version's engine runs the row: every row does (no offload, the optimizer
  /// offloaded to the CPU or NVMe at stages 1-3, the parameters to the CPU or NVMe at stage 3)
  bool implemented = true;
  /// the share of the optimizer state offloaded: 0 without offload, 1 on NVMe, the options'
  /// offload_ratio for the CPU rows (partial offload below 1)
  double offload_ratio = 0;
  /// the share of the optimizer state in host memory beside the NVMe file (the options' host_ratio, as
  /// split: its elements over the shard's), in the NVMe rows; 0 elsewhere
  double host_ratio = 0;
  /// the delayed update's warmup_steps where the row runs it (the options' `config_delayed_warmup` in the
  /// rows `delayed_update_runs` allows), counting the host gradient shard twice; -1 where the row is exact
  std::int64_t delayed_warmup = -1;
  /// True where the row runs the config's ZenFlow (its window and compact state counted); false elsewhere
  bool zenflow = false;
};

/// zero's accounting for every stage and offload choice: stage 0; stages 1 and 2 with optimizer
/// offload none/cpu/nvme; stage 3 with optimizer offload none/cpu/nvme and parameter offload
/// none/cpu/nvme (parameters offloaded only when the optimizer is, as DeepSpeed's estimator).
///
/// Per rank, with Ψ params, N ranks, shard S = ceil(Ψ/N), p/g the bytes of a parameter/gradient,
/// m = 4 bytes of fp32 master weight (0 when parameters are fp32) and 8 bytes of Adam moments:
/// (with `padded`, a described model's, Ψ at stages 0-2 is its padded flat buffer and S its padded shard
/// at each stage, as the engine allocates them; stage 3 also keeps the persistent parameters, those below
/// stage3_param_persistence_threshold, whole on every rank: `persistent_total`, or unpadded `persistent_params`)
///
///     stage 0: Ψ(p + g + m + 8)             stage 1: Ψ(p + g) + S(m + 8)
///     stage 2: Ψp + S(g + m + 8)            stage 3: S(p + g + m + 8)
///
/// Optimizer offload to the CPU (what the engine runs, docs/offload.md) moves S(m + 8) off the GPU;
/// the host holds S(m + 8 + p + g): the state and the rank's gradient and parameter shards staged for
/// the copies (`offloaded_host_formula_bytes`). With offload_ratio r < 1 only H = rS of the shard is
/// offloaded: the host holds H(m + 8 + p + g) and the GPU keeps (S - H)(m + 8) of state, and everything
/// else of its stage (the gradients are reduced there, and the host part's copied at the step; with
/// offload_forward_overlap at stages 2-3 the host part's stream to the host, as below, and the GPU keeps
/// (S - H)g of gradients). With
/// the whole state offloaded, stage 1 keeps its gradients on the GPU (they accumulate there), while at
/// stages 2-3 each bucket's reduced slice goes to the host during backward through two staging
/// buffers, so the GPU holds no gradient shard (Sg less). NVMe rows keep the state (S(m + 8)) on NVMe
/// instead; with host_ratio h the NVMe rows keep H = hS of it in host memory (H(m + 8), the host share's
/// staged parameters Hp, and the file share's 2(S - H)p and (S - H)(m + 8) in two slots on NVMe), and the
/// GPU keeps the gradient shard Sg at stages 2-3 (the engine keeps a split state's reduced gradients on the
/// device). Parameter offload to the CPU (stage 3, what the engine runs) also takes the parameter
/// shard, Sp, off the GPU into host memory, where the host AdamW updates it in place (no staged copy),
/// so the host holds S(m + 8 + p + g); with NVMe the shard is on NVMe in two slots, 2p(S - R), where
/// R = min(max_in_cpu, S) elements stay in host memory, beside buffer_count bounce buffers of a
/// layer's slice (at most buffer_size elements) when R < S, and the optimizer keeps its staged copy.
/// With hpZ (hpz_partition_size H > 1) every stage 3 row keeps, beside its model state, the secondary
/// partition on the GPU: the rank's slice of each unit's node part, (N / H) S p, about P Ψ / H bytes
/// (`memory_report::secondary`, in the engine's `memory_tag::params`), whatever is offloaded.
/// Buffers (what the engine's counting allocator reports under `memory_tag::buffers`, and the
/// stage-3 working set):
/// - stage 2 reduces bucket by bucket through one staging buffer of the largest segment's gradient,
///   max(min(reduce_bucket_size, Ψ), largest_param_params) elements: the next bucket reuses it after
///   the previous reduce-scatter, so overlap_comm does not add a second one (bucket_reducer.hpp).
/// - stage 3 reduces one module at a time (its segments are modules, param_coordinator.hpp), so its
///   staging buffer is the largest module's gradient, largest_layer_params elements (0 when
///   unknown), not reduce_bucket_size, and a second one when there are persistent parameters
///   (persistent_params > 0), whose segment stays staged until the last of them is ready; and it
///   holds the gathered working set, min(Ψ, max_live, largest layer + prefetch bucket) parameters.
/// - stages 0-1 reduce in place in the flat gradient buffer: no staging.
/// - stages 1-2 with allgather_bucket_size set (and several ranks) join consecutive buckets' parameter
///   all-gathers through one staging buffer of at most min(allgather_bucket_size, Ψ) parameter
///   elements (engine.hpp, `plan_gather_groups`); unset, the all-gathers run in place.
/// The engine's few other buffers (an overflow flag, the norm partials) are a few hundred bytes. Optimizer NVMe rows
/// keep offload_optimizer_buffer_count chunks of nvme_chunk_elements (at most one owned range) per state tensor in
/// host memory; parameter NVMe rows buffer_count x min(buffer_size, a layer's slice) elements. \throws usage_error when
/// params, ranks or dtypes are out of range, and naming zero_optimization.zero_hpz_partition_size when it is below
/// 1 or does not divide the ranks.
[[nodiscard]] inline std::vector<estimate_row> estimate_memory(const estimate_options& o) {
  // The byte counts below stay far inside int64 for up to 1e15 parameters and 2^20 GPUs per node.
  if (o.params < 1 || o.params > max_params || o.gpus_per_node < 1 || o.gpus_per_node > (1 << 20) || o.nodes < 1 ||
      o.nodes > (1 << 20) || o.largest_layer_params < 0 || o.largest_layer_params > o.params ||
      o.largest_param_params < 0 || o.largest_param_params > o.params || o.persistent_params < 0 ||
      o.persistent_params > o.params || !(o.offload_ratio >= 0 && o.offload_ratio <= 1) ||
      !(o.host_ratio >= 0 && o.host_ratio < 1)) {
    throw usage_error("estimate_memory: needs 1 <= params <= 1e15, 1 <= gpus_per_node, nodes <= 2^20, "
                      "0 <= largest_layer_params, largest_param_params, persistent_params <= params, "
                      "0 <= offload_ratio <= 1 and 0 <= host_ratio < 1");
  }
  if (o.hpz_partition_size < 1 || o.ranks() % o.hpz_partition_size != 0) {
    throw usage_error(cat("estimate_memory: zero_optimization.zero_hpz_partition_size is ",
                          std::to_string(o.hpz_partition_size), "; expected a divisor of the ",
                          std::to_string(o.ranks()),
                          " ranks (the ranks of a node group), or 1 for no secondary partition"));
  }
  if (o.mics_shard_size != -1 && (o.mics_shard_size < 1 || o.ranks() % o.mics_shard_size != 0)) {
    throw usage_error(cat("estimate_memory: zero_optimization.mics_shard_size is ", std::to_string(o.mics_shard_size),
                          "; expected -1 (no HSDP) or a divisor of the ", std::to_string(o.ranks()),
                          " ranks (the ranks of a shard group)"));
  }
  if (o.padded &&
      (o.padded->bucket_total < o.params || o.padded->bucket_shard * o.shard_ranks() != o.padded->bucket_total ||
       o.padded->module_shard * o.shard_ranks() < o.params)) {
    throw usage_error("estimate_memory: padded sizes that do not hold the parameters over the shard ranks; expected "
                      "padded_sizes_of's for this model and ranks");
  }
  const bool hsdp = o.shard_ranks() < o.ranks();
  if (hsdp && o.hpz_partition_size > 1) {
    throw usage_error("estimate_memory: zero_optimization.mics_shard_size with zero_hpz_partition_size; the engine "
                      "runs one of HSDP and hpZ");
  }
  for (dtype t : {o.param_dtype, o.grad_dtype.value_or(o.param_dtype)}) {
    if (t != dtype::f32 && t != dtype::f16 && t != dtype::bf16) {
      throw usage_error(cat("estimate_memory: dtypes must be fp32, fp16 or bf16, not ", std::string(name_of(t))));
    }
  }
  const std::int64_t psi = o.params;
  const std::int64_t n = o.shard_ranks();
  // The flat buffer of stages 0-2 and a rank's shard at each stage: the engine's padded layout when the model
  // is described, else Ψ and ceil(Ψ / N).
  const std::int64_t even_shard = (psi + n - 1) / n;
  const std::int64_t flat = o.padded ? o.padded->bucket_total : psi;
  const std::int64_t bucket_shard = o.padded ? o.padded->bucket_shard : even_shard;
  const std::int64_t module_shard = o.padded ? o.padded->module_shard : even_shard;
  // Stage 3 keeps the persistent parameters whole on every rank too (the coordinator's persistent units).
  const std::int64_t persistent_whole = o.padded ? o.padded->persistent_total : o.persistent_params;
  const auto p = static_cast<std::int64_t>(size_of(o.param_dtype));

  const std::int64_t master = o.param_dtype == dtype::f32 ? 0 : 4;
  // The rule's fp32 state tensors beside the master: Adam's m and v, one for Lion, Adagrad and SGD with momentum.
  const std::int64_t moments = 4 * o.state_tensors;
  const std::int64_t working =
      std::min({psi, o.stage3_max_live_parameters, o.largest_layer_params + o.stage3_prefetch_bucket_size}) * p;
  // The largest segment of stages 1-2: a bucket, or a parameter larger than one.
  const std::int64_t largest_bucket = std::max(std::min(psi, o.reduce_bucket_size), o.largest_param_params);
  const std::int64_t stage3_staging_buffers = o.persistent_params > 0 ? 2 : 1;
  // hpZ (stage 3): the rank keeps its slice of each unit's node part, N / H of its primary shards.
  const std::int64_t secondary = o.hpz_partition_size > 1 ? module_shard * (n / o.hpz_partition_size) * p : 0;

  std::vector<estimate_row> rows;
  auto add = [&](int stage, offload_device opt, offload_device par) {
    estimate_row r;
    r.stage = stage;
    const std::int64_t shard = stage == 3 ? module_shard : bucket_shard;
    r.grad_dtype = o.grad_dtype.value_or(default_grad_accum_dtype(o.param_dtype, stage));
    const auto g = static_cast<std::int64_t>(size_of(r.grad_dtype));
    r.offload_optimizer = opt;
    r.offload_param = par;
    // The engine runs every row, but HSDP's with offload.
    r.implemented = !(hsdp && stage >= 1 && (opt != offload_device::none || par != offload_device::none)) &&
                    (o.adam || opt != offload_device::nvme); // the NVMe step is Adam/AdamW's alone
    r.offload_ratio = opt == offload_device::none ? 0.0 : opt == offload_device::nvme ? 1.0 : o.offload_ratio;
    std::int64_t host = 0;
    std::int64_t nvme = 0;
    // With the optimizer on the CPU, the elements of the shard it offloads (all but for a ratio < 1).
    const std::int64_t offloaded =
        opt == offload_device::cpu ? std::llround(o.offload_ratio * static_cast<double>(shard)) : shard;
    // NVMe with host_ratio: the elements whose state is in host memory (the rest in the file).
    const std::int64_t in_memory =
        opt == offload_device::nvme ? std::llround(o.host_ratio * static_cast<double>(shard)) : 0;
    r.host_ratio = shard > 0 ? static_cast<double>(in_memory) / static_cast<double>(shard) : 0.0;
    const std::int64_t optimizer_state = (offloaded - in_memory) * (master + moments);
    if (opt != offload_device::none) {
      // The rank's gradient shard and parameter shard (their offloaded part), staged in host memory for
      // the copies; with the parameters on the CPU the host AdamW updates their shard in place instead.
      host += offloaded * g;
      if (o.config_delayed_warmup >= 0 &&
          delayed_update_runs(stage, opt, o.offload_ratio >= 1.0, par, o.gradient_accumulation_steps)) {
        host += offloaded * g; // the delayed update: the gradient shard held twice
        r.delayed_warmup = o.config_delayed_warmup;
      }
      if (o.config_zenflow_topk && zenflow_runs(stage, opt, o.offload_ratio >= 1.0, par, o.gradient_accumulation_steps,
                                                o.config_zenflow_overlap)) {
        host += offloaded * 4; // ZenFlow's window: an fp32 sum per state element
        if (o.config_zenflow_overlap) {
          host += offloaded * g; // overlap_step: the gradient shard held twice, one half for the host's update
        }
        r.zenflow = true;
      }
      if (opt == offload_device::cpu) {
        if (par != offload_device::cpu) {
          host += offloaded * p;
        }
        host += optimizer_state;
      } else {
        // NVMe: two copies of the parameters of the file's share (a failed step falls back to the first),
        // the chunk buffers (at most one owned range: a bucket's or, at stage 3, a layer's slice), and two
        // slots of its state; with host_ratio the host share's state and its staged parameters (with the
        // parameters on the CPU it updates their shard in place).
        host += 2 * (shard - in_memory) * p + in_memory * (master + moments);
        if (par != offload_device::cpu) {
          host += in_memory * p;
        }
        const std::int64_t segment = stage == 3 ? o.largest_layer_params : largest_bucket;
        const std::int64_t range = (segment + n - 1) / n;
        host += o.offload_optimizer_buffer_count * std::min(o.nvme_chunk_elements, range) * (master + moments);
        nvme += 2 * optimizer_state;
      }
    }
    if (par == offload_device::nvme) {
      // The first max_in_cpu elements of the shard in host memory; the rest, if any, in two slots on
      // NVMe, through buffer_count bounce buffers of a layer's slice (at most buffer_size elements).
      const std::int64_t resident = std::min(o.offload_param_max_in_cpu, shard);
      const std::int64_t slice = o.largest_layer_params > 0 ? (o.largest_layer_params + n - 1) / n : shard;
      host += resident * p;
      if (resident < shard) {
        host += o.offload_param_buffer_count * std::min(o.offload_param_buffer_size, slice) * p;
        nvme += 2 * (shard - resident) * p;
      }
    }
    if (par == offload_device::cpu) {
      // The coordinator's shard, which the gathers upload from (and, with the optimizer on the CPU, the
      // one the host AdamW updates in place).
      host += shard * p;
    }
    const std::int64_t on_gpu_state = (opt == offload_device::none ? shard : shard - offloaded) * (master + moments);
    // The whole state offloaded (not a ratio < 1) at stages 2-3: reduced gradients go to the host during
    // backward, through two staging buffers at least (one fills while the other's slice is copied); a
    // ratio below 1 beside the next forward streams the host share's, and the GPU keeps the rest.
    // A state split between host memory and NVMe keeps them on the device.
    const bool streamed =
        gradients_stream_to_host(stage, opt, o.offload_ratio >= 1.0, o.offload_forward_overlap) && in_memory == 0;
    const bool split_streamed = streamed && opt == offload_device::cpu && o.offload_ratio < 1.0;
    const std::int64_t on_gpu_grads = split_streamed ? (shard - offloaded) * g : streamed ? 0 : shard * g;
    auto streamed_staging = [&](std::int64_t buffers) {
      return streamed ? std::max<std::int64_t>(buffers, 2) : buffers;
    };
    switch (stage) {
    case 0:
      r.gpu_model_state_bytes = flat * (p + g + master + moments);
      break;
    case 1:
      r.gpu_model_state_bytes = flat * (p + g) + on_gpu_state;
      break;
    case 2:
      r.gpu_model_state_bytes = flat * p + on_gpu_grads + on_gpu_state;
      r.gpu_buffer_bytes = streamed_staging(1) * largest_bucket * g;
      break;
    default:
      // No 16-bit shard without offload (16-bit training): the gathers cast the fp32 master.
      r.gpu_model_state_bytes =
          (par == offload_device::none && (opt != offload_device::none || p == 4 || o.stage3_keep_param_shard)
               ? shard * p
               : 0) +
          on_gpu_grads + on_gpu_state + secondary + persistent_whole * p;
      r.gpu_buffer_bytes = streamed_staging(stage3_staging_buffers) * o.largest_layer_params * g + working;
      break;
    }
    if (r.zenflow) { // the chosen columns' compact state: index, master, m, v, parameter and gradient
      r.gpu_model_state_bytes +=
          std::llround(*o.config_zenflow_topk * static_cast<double>(shard)) * (4 + 12 + (p == 4 ? 0 : p) + g);
    }
    if ((stage == 1 || stage == 2) && o.allgather_bucket_size && n > 1) {
      r.gpu_buffer_bytes += std::min(*o.allgather_bucket_size, psi) * p;
    }
    r.gpu_bytes_per_rank = r.gpu_model_state_bytes + r.gpu_buffer_bytes;
    r.host_bytes_per_rank = host;
    r.host_bytes_per_node = host * o.gpus_per_node;
    r.nvme_bytes_per_node = nvme * o.gpus_per_node;
    rows.push_back(r);
  };
  add(0, offload_device::none, offload_device::none);
  for (int stage : {1, 2}) {
    for (offload_device opt : {offload_device::none, offload_device::cpu, offload_device::nvme}) {
      add(stage, opt, offload_device::none);
    }
  }
  for (offload_device opt : {offload_device::none, offload_device::cpu, offload_device::nvme}) {
    for (offload_device par : {offload_device::none, offload_device::cpu, offload_device::nvme}) {
      if (opt == offload_device::none && par != offload_device::none) {
        continue;
      }
      add(3, opt, par);
    }
  }
  return rows;
}

} // namespace zero::tools
