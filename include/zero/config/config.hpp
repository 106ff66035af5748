#pragma once
/// \file
/// `zero::config`: a DeepSpeed `ds_config.json` read into typed, fully resolved values.
///
/// The reader accepts the configs users already run with DeepSpeed or the Hugging Face Trainer:
/// DeepSpeed's key names and defaults (where DeepSpeed's documentation and code differ, its code),
/// the deprecated aliases DeepSpeed still accepts, integers written as `5e8` or `1e14`, `//` and
/// `/* */` comments, and `"auto"` wherever Hugging Face writes it, resolved from `config_inputs`
/// (model hidden size, world size, command-line values) or refused with a message that says what
/// must be given. It is strict: an unknown key, a key in the wrong block, a value of the wrong type
/// or out of range, a duplicate key, a contradiction, or a setting that needs a feature this
/// version does not implement (the table in `unimplemented.hpp`) throws `zero::config_error`
/// naming the JSON path, what was found and what is allowed, with "did you mean" for near misses.
/// Settings that are accepted but have no effect in the chosen setup (a stage-3 key at stage 2, a
/// deprecated alias) are listed in `config::notes`, never dropped silently.
///
/// Every member holds the value in force: defaults filled in, aliases folded, `"auto"` resolved.
/// `to_json()` writes them back under DeepSpeed's names; reading that back gives the same config.
///
/// Needs nlohmann-json (`nlohmann_json::nlohmann_json`); the rest of zero does not.

#include "zero/config/detail/json_text.hpp" // max_config_bytes, max_config_depth: the bounds of a config's text
#include "zero/config/optimizer_config.hpp" // the optimizer and scheduler blocks
#include "zero/config/zenflow_config.hpp"   // zero_optimization.zenflow
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero {

/// Where ZeRO keeps offloaded state. DeepSpeed's `"none"`, `"cpu"`, `"nvme"`.
enum class offload_device : std::uint8_t { none, cpu, nvme };

/// DeepSpeed's name of an offload device: "none", "cpu", "nvme".
[[nodiscard]] constexpr std::string_view name_of(offload_device d) noexcept {
  switch (d) {
  case offload_device::none:
    return "none";
  case offload_device::cpu:
    return "cpu";
  case offload_device::nvme:
    return "nvme";
  }
  return "?";
}

/// The gradient accumulation dtype DeepSpeed's engine uses when `data_types.grad_accum_dtype` is
/// absent: fp32 for bf16 at stage 0, the parameter dtype otherwise.
[[nodiscard]] constexpr dtype default_grad_accum_dtype(dtype param, int stage) noexcept {
  return param == dtype::bf16 && stage == 0 ? dtype::f32 : param;
}

namespace detail {
/// Why `communication_data_type` `comm` is refused when gradients accumulate in `grad`: zero reduces
/// gradients in their accumulation dtype and in no other (DeepSpeed's meaning of the key, the dtype
/// gradients are reduced in, is implemented only for that value). The message follows the key's name.
inline std::string communication_dtype_refusal(dtype comm, dtype grad) {
  const std::string g(name_of(grad));
  return "found \"" + std::string(name_of(comm)) + "\", but zero reduces gradients only in their accumulation dtype, " +
         g + " here (data_types.grad_accum_dtype, or its default: fp32 for bf16 at stage 0, else the parameter " +
         "dtype); expected \"" + g + "\", null, or the key left out";
}
} // namespace detail

/// The `fp16` block: fp16 mixed precision and its dynamic loss scaler.
struct fp16_config {
  /// `fp16.enabled`: parameters and gradients in fp16 with fp32 master weights. Default false.
  bool enabled = false;
  /// `fp16.loss_scale`: a static loss scale, or 0 (default) for dynamic loss scaling.
  double loss_scale = 0.0;
  /// `fp16.initial_scale_power`: the dynamic scaler starts at 2^initial_scale_power. Default 16.
  std::int64_t initial_scale_power = 16;
  /// `fp16.loss_scale_window`: overflow-free steps before the dynamic scale doubles. Default 1000.
  std::int64_t loss_scale_window = 1000;
  /// `fp16.hysteresis`: overflows tolerated before the scale is halved. Default 2.
  std::int64_t hysteresis = 2;
  /// `fp16.consecutive_hysteresis`: refill the hysteresis after every overflow-free step. Default false.
  bool consecutive_hysteresis = false;
  /// `fp16.min_loss_scale`: the dynamic scale never drops below this. Default 1.
  double min_loss_scale = 1.0;

  /// True when the loss scale adapts (loss_scale == 0).
  [[nodiscard]] bool dynamic() const noexcept { return loss_scale == 0.0; }
  /// The first loss scale: 2^initial_scale_power when dynamic, else loss_scale.
  [[nodiscard]] double initial_scale() const noexcept {
    return dynamic() ? std::ldexp(1.0, static_cast<int>(initial_scale_power)) : loss_scale;
  }
  friend bool operator==(const fp16_config&, const fp16_config&) = default;
};

/// The `bf16` block (DeepSpeed also reads it as `bfloat16`).
struct bf16_config {
  /// `bf16.enabled`: parameters and gradients in bf16 with fp32 master weights. Default false.
  bool enabled = false;
  friend bool operator==(const bf16_config&, const bf16_config&) = default;
};

/// `zero_optimization.offload_optimizer`: where the fp32 master weights, Adam moments and the
/// gradient shard live, and where the optimizer step runs (CPU for any device but none).
struct offload_optimizer_config {
  /// `device`: none (default), cpu: the engine keeps the state in host memory and steps it on the host;
  /// nvme: the state in a file per rank under `nvme_path`, streamed through host buffers and stepped on
  /// the host (docs/offload.md).
  offload_device device = offload_device::none;
  /// `nvme_path`: directory of the state files for NVMe offload; required with device nvme. Default empty.
  std::string nvme_path;
  /// `pin_memory`: page-locked host memory for faster transfers. Default false. Read; the engine
  /// takes the backend's host memory (`host_allocator_type`: pinned for CUDA) either way.
  bool pin_memory = false;
  /// `buffer_count`: chunk buffers in host memory for NVMe transfers; the engine needs at least 2. Default 4.
  std::int64_t buffer_count = 4;
  /// `ratio`: with device cpu, the share of the rank's optimizer state elements kept in host memory and
  /// stepped on the host; the rest stays on the device and is stepped there (DeepSpeed's partial
  /// offload, docs/offload.md). Default 1 (everything offloaded); 0 keeps everything on the device, as
  /// without offload. Below 1 is refused with device nvme (whose state splits with host memory through
  /// `host_ratio`).
  double ratio = 1.0;
  /// `ratio: "auto"`: the engine picks the ratio at `finalize` so that the host's and the device's parts
  /// of a step take equally long, from update rates it measures then (or that the program gave it,
  /// `set_offload_rates`); `ratio` is then not used. Default false.
  bool ratio_auto = false;
  /// `host_ratio` (zero-specific, not a DeepSpeed key): with device nvme, the share of the rank's optimizer
  /// state elements, in [0, 1), kept in host memory (its last elements) and stepped there as with device
  /// cpu; the rest stays in the NVMe file (docs/offload.md, "Host memory and NVMe together"). Default 0 (the
  /// whole state in the file). Refused with device cpu or none, with a ratio below 1 and with offload_param
  /// nvme.
  double host_ratio = 0.0;
  /// `backward_overlap` (zero-specific, not a DeepSpeed key): with device cpu and the whole state
  /// offloaded, the share of the rank's optimizer state, in [0, 1], that the host may update during
  /// backward, before the step knows the gradient norm; that share is held twice in host memory so an
  /// update the step must not keep (an overflow, a clip) is dropped. Acts at stages 2-3 with 16-bit
  /// parameters and no gradient accumulation (docs/offload.md). Default 0.
  double backward_overlap = 0.0;
  /// `forward_overlap` (zero-specific, not a DeepSpeed key): with device cpu and the whole state
  /// offloaded, `step()` returns while the host still runs AdamW, and the next forward's modules wait,
  /// on the device, only for the ranges they read (docs/offload.md). Acts at stages 2-3 with a backend
  /// that can wait for a host word on a stream (`zero::can_wait_value`: CUDA); elsewhere the host waits
  /// at the step, as without it. Default false.
  bool forward_overlap = false;
  /// `delayed_update` (zero-specific, not a DeepSpeed key; a block, `{"warmup_steps": N}`): the ZeRO-Offload
  /// paper's one-step delayed parameter update. The first N applied steps are exact; after them the host's
  /// AdamW of step t runs while the device computes step t+1 on the parameters before it, and its parameters
  /// reach the device at step t+1's `step()`: each update uses gradients one step old (docs/offload.md,
  /// "Exact, delayed"). Not exact. Acts with device cpu holding the whole state at stages 2-3, with the
  /// parameters on the device and no gradient accumulation (refused otherwise). `delayed_update` is true
  /// when the block is given; `delayed_warmup_steps` is its `warmup_steps`, default 0.
  bool delayed_update = false;
  std::int64_t delayed_warmup_steps = 0;
  friend bool operator==(const offload_optimizer_config&, const offload_optimizer_config&) = default;
};

/// `zero_optimization.offload_param` (stage 3): where parameter shards live between uses.
struct offload_param_config {
  /// `device`: none (default), cpu: the engine keeps the rank's 16-bit parameter shard in host memory
  /// and uploads a module's slice before its all-gather (docs/offload.md); nvme is refused here, by
  /// the reader.
  offload_device device = offload_device::none;
  /// `nvme_path`: directory for NVMe offload. Default empty.
  std::string nvme_path;
  /// `pin_memory`: page-locked host memory. Default false. Read; the engine takes the backend's host
  /// memory (`host_allocator_type`: pinned for CUDA) either way.
  bool pin_memory = false;
  /// `buffer_count`: buffers for NVMe transfers. Default 5.
  std::int64_t buffer_count = 5;
  /// `buffer_size`: elements per NVMe transfer buffer. Default 1e8.
  std::int64_t buffer_size = 100'000'000;
  /// `max_in_cpu`: parameter elements kept in CPU memory under NVMe offload. Default 1e9.
  std::int64_t max_in_cpu = 1'000'000'000;
  friend bool operator==(const offload_param_config&, const offload_param_config&) = default;
};

/// The `zero_optimization` block. Sizes are in elements, as in DeepSpeed.
struct zero_optimization_config {
  /// `stage`: 0 (plain data parallel, default), 1 (optimizer state sharded), 2 (+ gradients), 3 (+ parameters).
  int stage = 0;
  /// `contiguous_gradients`: copy gradients into one contiguous buffer as they are produced. Default true.
  bool contiguous_gradients = true;
  /// `overlap_comm`: overlap gradient reduction with the backward pass. DeepSpeed's default: true at
  /// stage 3, false otherwise.
  bool overlap_comm = false;
  /// `reduce_scatter`: reduce gradients with reduce-scatter rather than all-reduce. Default true.
  bool reduce_scatter = true;
  /// `reduce_bucket_size`: elements reduced at a time. Default 5e8.
  std::int64_t reduce_bucket_size = 500'000'000;
  /// `allgather_partitions`: all-gather updated shards (true, default) or broadcast them one by one.
  bool allgather_partitions = true;
  /// `allgather_bucket_size` (stages 1 and 2): when set, the step-end parameter all-gathers join
  /// consecutive reduce buckets into one all-gather of at most this many elements, through a staging
  /// buffer of up to that size. Unset (zero's default): every bucket is all-gathered alone, in place,
  /// with no buffer; DeepSpeed's default, 5e8, would make that buffer as large as a small model's
  /// parameters, so zero does not assume it.
  std::optional<std::int64_t> allgather_bucket_size;
  /// `offload_optimizer` (stages 1-3). Also set by the deprecated `cpu_offload: true`.
  offload_optimizer_config offload_optimizer;
  /// `offload_param` (stage 3). Also set by the deprecated `cpu_offload_param: true`.
  offload_param_config offload_param;
  /// `zenflow`: DeepSpeed's ZenFlow (zenflow_config); read, refused by this version's engine.
  zenflow_config zenflow;
  /// `sub_group_size`: elements the optimizer step processes at a time (stage 3). Default 1e9.
  std::int64_t sub_group_size = 1'000'000'000;
  /// `stage3_max_live_parameters`: gathered parameter elements a rank may hold at once. Default 1e9.
  std::int64_t stage3_max_live_parameters = 1'000'000'000;
  /// `stage3_max_reuse_distance`: keep a gathered parameter if it is reused within this many elements. Default 1e9.
  std::int64_t stage3_max_reuse_distance = 1'000'000'000;
  /// `stage3_prefetch_bucket_size`: elements prefetched ahead of use. Default 5e7.
  std::int64_t stage3_prefetch_bucket_size = 50'000'000;
  /// `stage3_param_persistence_threshold`: parameters smaller than this stay whole. Default 1e5.
  std::int64_t stage3_param_persistence_threshold = 100'000;
  /// `stage3_keep_param_shard` (zero-specific, not a DeepSpeed key): keep the rank's 16-bit parameter
  /// shard between steps, as DeepSpeed does. By default (false) stage 3 with 16-bit parameters and the
  /// optimizer on the device keeps none: each gather casts the rank's slice from the fp32 master copy,
  /// which saves P psi / n bytes per rank (docs/gpu.md). Default false.
  bool stage3_keep_param_shard = false;
  /// `zero_hpz_partition_size`: ZeRO++'s hierarchical partitioning (hpZ) at stage 3: the ranks of a
  /// node group (consecutive ranks of the data group) that each keep a secondary 1/H partition of the
  /// 16-bit parameters, so that backward's all-gathers stay inside the node (docs/zeropp.md). Must
  /// divide the data group's size. Default 1 (none).
  std::int64_t zero_hpz_partition_size = 1;
  /// `mics_shard_size`: DeepSpeed's MiCS, FSDP2's HSDP: stages 1-3 shard the model state over groups of
  /// this many consecutive ranks of the communicator and replicate it across the groups; gradients
  /// are reduce-scattered inside the group and the reduced shards all-reduced across the groups
  /// (docs/zeropp.md, "HSDP"). Must divide the communicator's size; -1 (the default) or the whole
  /// communicator: one group.
  std::int64_t mics_shard_size = -1;
  /// True when `mics_shard_size` cuts a communicator of `ranks` into more than one group.
  [[nodiscard]] bool hsdp(int ranks) const noexcept {
    return stage >= 1 && mics_shard_size > 0 && mics_shard_size < ranks;
  }
  /// `zero_quantized_weights`: ZeRO++'s qwZ at stage 3: the all-gathers over the data group carry int8
  /// codes with an fp32 scale per block (about half of a 16-bit gather) and are dequantized on arrival;
  /// persistent parameters and hpZ's node gathers stay exact (docs/zeropp.md). Default false.
  bool zero_quantized_weights = false;
  /// `zero_quantized_gradients`: ZeRO++'s qgZ at stages 2-3: a bucket's chunks go as block-quantized
  /// codes by all-to-all and each rank sums the dequantized chunks in fp32; in two levels (inside the
  /// node, then across nodes on the node's partial sums) when the node size
  /// (`zero_quantized_gradients_node_size`) is above 1 and below the data group's, else in one over the
  /// data group (docs/zeropp.md). Not with offload_optimizer. Default false.
  bool zero_quantized_gradients = false;
  /// `zero_quantized_gradients_bits` (zero-specific, not a DeepSpeed key): 4 (DeepSpeed's qgZ) or 8 bits
  /// per gradient code. Default 4.
  std::int64_t zero_quantized_gradients_bits = 4;
  /// `zero_quantized_gradients_node_size` (zero-specific, not a DeepSpeed key; DeepSpeed takes the
  /// node's local size): the ranks of a node for qgZ's two levels, consecutive ranks of the data group;
  /// must divide its size, and equal `zero_hpz_partition_size` when both are set at stage 3. Empty (the
  /// default): `zero_hpz_partition_size` at stage 3, else 1. 1 or the whole group: one level.
  std::optional<std::int64_t> zero_quantized_gradients_node_size;
  /// The node size qgZ's two levels run over at this stage (see `zero_quantized_gradients_node_size`).
  [[nodiscard]] std::int64_t quantized_gradients_node_size() const noexcept {
    if (zero_quantized_gradients_node_size) {
      return *zero_quantized_gradients_node_size;
    }
    return stage == 3 ? zero_hpz_partition_size : 1;
  }
  /// `zero_quantization_block_size` (zero-specific, not a DeepSpeed key): elements per fp32 scale of
  /// ZeRO++'s quantized all-gathers and gradient chunks (DeepSpeed picks groups of a few thousand
  /// itself). Default 4096.
  std::int64_t zero_quantization_block_size = 4096;
  /// `stage3_gather_16bit_weights_on_model_save` (alias `stage3_gather_fp16_weights_on_model_save`):
  /// gather the whole 16-bit model when saving it. Default false.
  bool stage3_gather_16bit_weights_on_model_save = false;
  /// `round_robin_gradients`: spread gradient copies to CPU over ranks (stages 1-2). Default false.
  bool round_robin_gradients = false;
  /// `ignore_unused_parameters`: tolerate parameters that receive no gradient. Default true.
  bool ignore_unused_parameters = true;
  /// `elastic_checkpoint`: DeepSpeed's switch for loading a stage 1-2 checkpoint at another rank
  /// count. zero's checkpoints always reshard (any stage, any rank count; docs/checkpoints.md), so
  /// true is what zero does anyway and false is noted as having no effect. Default false.
  bool elastic_checkpoint = false;
  friend bool operator==(const zero_optimization_config&, const zero_optimization_config&) = default;
};

/// The top-level `aio` block: asynchronous I/O settings for NVMe offload.
struct aio_config {
  /// `block_size`: bytes per I/O request. Default 1048576.
  std::int64_t block_size = 1'048'576;
  /// `queue_depth`: I/O requests in flight. Default 8.
  std::int64_t queue_depth = 8;
  /// `thread_count` (newer DeepSpeed: `intra_op_parallelism`): I/O threads per request. Default 1.
  std::int64_t thread_count = 1;
  /// `single_submit`: submit requests one at a time. Default false.
  bool single_submit = false;
  /// `overlap_events`: overlap submission and completion. Default true.
  bool overlap_events = true;
  friend bool operator==(const aio_config&, const aio_config&) = default;
};

/// `pipeline`: DeepSpeed's pipeline engine. zero reads the number of stages, which the engine checks
/// against its place in the job (`set_model_group`) and `topology_from_config` lays the ranks out
/// by; the framework places its layers on the stages and runs the schedule
/// (`zero/comm/pipeline_schedule.hpp`), so the block's other keys are noted as having no effect here
/// (docs/parallelism.md).
struct pipeline_config {
  /// `stages`: the job's pipeline stages; empty for `"auto"`, DeepSpeed's default (the framework's
  /// model decides, and the engine takes its place as `set_model_group` gives it).
  std::optional<std::int64_t> stages{};
  friend bool operator==(const pipeline_config&, const pipeline_config&) = default;
};

/// `tensor_parallel`: DeepSpeed's AutoTP training block. zero reads the tensor-parallel size, which
/// the engine checks against `set_model_group`'s `model_coords::tensor_size`; the framework cuts its
/// own slices and registers them (`param_options::tensor_split`), so AutoTP's automatic sharding
/// keys are refused (docs/parallelism.md).
struct tensor_parallel_config {
  /// `autotp_size`: the ranks a tensor-parallel parameter is split over; 0 (DeepSpeed's default): no
  /// tensor parallelism.
  std::int64_t autotp_size = 0;
  friend bool operator==(const tensor_parallel_config&, const tensor_parallel_config&) = default;
};

/// `activation_checkpointing`: where the activations a framework checkpoints live between forward and backward.
/// zero does not checkpoint (the framework decides what to keep and recomputes the rest); with
/// `cpu_checkpointing` it keeps what the framework saves in host memory (`zero::activation_store`,
/// `activation_store_options_from`; docs/activations.md). `partition_activations` (splitting checkpoints over the
/// model-parallel group) is refused by name; `synchronize_checkpoint_boundary` and `profile` are noted.
struct activation_checkpointing_config {
  /// `cpu_checkpointing`: checkpoints in host memory, fetched back ahead of backward. Default false.
  bool cpu_checkpointing = false;
  /// `contiguous_memory_optimization`: the checkpoints in one contiguous buffer (the store's host arena always
  /// is one). Default false.
  bool contiguous_memory_optimization = false;
  /// `number_checkpoints`: checkpoints per forward, which size the host arena; empty (DeepSpeed's null): the
  /// framework gives the count.
  std::optional<std::int64_t> number_checkpoints;
  friend bool operator==(const activation_checkpointing_config&, const activation_checkpointing_config&) = default;
};

/// The three batch keys as the config and the inputs give them, before DeepSpeed's rule
/// train = micro x accumulation x world fills in the missing ones. Empty means not given (absent,
/// or `"auto"` with no input to resolve it).
struct batch_spec {
  std::optional<std::int64_t> train_batch_size{};               ///< `train_batch_size`
  std::optional<std::int64_t> train_micro_batch_size_per_gpu{}; ///< `train_micro_batch_size_per_gpu`
  std::optional<std::int64_t> gradient_accumulation_steps{};    ///< `gradient_accumulation_steps`
  /// Which of micro batch / accumulation came from `"auto"` left unresolved, for the error message.
  bool micro_was_auto = false;
  bool accumulation_was_auto = false;
  friend bool operator==(const batch_spec&, const batch_spec&) = default;
};

/// The batch sizes in force.
struct batch_sizes {
  std::int64_t train_batch_size = 0;               ///< samples per optimizer step over all ranks
  std::int64_t train_micro_batch_size_per_gpu = 0; ///< samples per forward/backward on one rank
  std::int64_t gradient_accumulation_steps = 0;    ///< micro batches per optimizer step
};

/// Applies DeepSpeed's batch rule: train = micro x accumulation x world_size. With all three given
/// they must agree; with two, the third is derived and must come out whole; with only train or only
/// micro, accumulation is 1 (as in DeepSpeed).
/// \param given      the batch keys from the config and inputs.
/// \param world_size data-parallel ranks (>= 1).
/// \returns the three sizes, each >= 1.
/// \throws config_error naming the keys when they contradict, do not divide, or too few are given.
[[nodiscard]] batch_sizes resolve_batch(const batch_spec& given, std::int64_t world_size);

/// Values from outside the config file that resolve `"auto"` (Hugging Face's placeholder) and the
/// batch rule. When an input is given and the config has a concrete value for the same key, they
/// must agree (as Hugging Face's Trainer checks); when the key is absent or `"auto"`, the input is
/// used. An `"auto"` with no input to resolve it is refused with a message naming the input.
/// Every member starts empty, so designated initializers may name any subset:
/// `config::from_file(path, {.world_size = comm.size()})`.
struct config_inputs {
  /// Data-parallel ranks for the batch rule. When empty, 1 is assumed and a note says so.
  std::optional<std::int64_t> world_size{};
  /// The model's hidden size: `"auto"` reduce_bucket_size = h*h, stage3_prefetch_bucket_size =
  /// floor(0.9*h*h), stage3_param_persistence_threshold = 10*h (Hugging Face's formulas).
  std::optional<std::int64_t> hidden_size{};
  /// `train_micro_batch_size_per_gpu` (Hugging Face: per_device_train_batch_size).
  std::optional<std::int64_t> micro_batch_size{};
  /// `gradient_accumulation_steps`.
  std::optional<std::int64_t> gradient_accumulation_steps{};
  /// `gradient_clipping` (Hugging Face: max_grad_norm).
  std::optional<double> max_grad_norm{};
  /// `optimizer.params.lr`, and the scheduler's `warmup_max_lr` (Hugging Face: learning_rate).
  std::optional<double> lr{};
  /// `optimizer.params.betas` (Hugging Face: adam_beta1, adam_beta2).
  std::optional<std::array<double, 2>> betas{};
  /// `optimizer.params.eps` (Hugging Face: adam_epsilon).
  std::optional<double> eps{};
  /// `optimizer.params.weight_decay`.
  std::optional<double> weight_decay{};
  /// The scheduler's `warmup_num_steps` (Hugging Face: warmup_steps).
  std::optional<std::int64_t> warmup_steps{};
  /// The scheduler's `total_num_steps` (Hugging Face: the number of training steps).
  std::optional<std::int64_t> total_steps{};
  /// The training precision: fp16 sets `fp16.enabled`, bf16 sets `bf16.enabled`, fp32 neither.
  std::optional<dtype> precision{};
  /// `zero_optimization.stage3_gather_16bit_weights_on_model_save` (Accelerate writes "auto" there).
  std::optional<bool> gather_16bit_weights_on_model_save{};
  /// Update rules of the framework's own that `optimizer.type` may name besides DeepSpeed's
  /// (`custom_optimizer::of<Rule>()`; docs/optimizers.md). A config written with such a rule reads back with them.
  std::vector<custom_optimizer> optimizers{};
};

/// A DeepSpeed config, read, validated and resolved. Build one with `from_file`, `from_string` or
/// `from_json`; the members then hold the values in force.
struct config {
  /// `train_batch_size`, resolved by the batch rule.
  std::int64_t train_batch_size = 1;
  /// `train_micro_batch_size_per_gpu`, resolved by the batch rule.
  std::int64_t train_micro_batch_size_per_gpu = 1;
  /// `gradient_accumulation_steps`, resolved by the batch rule.
  std::int64_t gradient_accumulation_steps = 1;
  /// The data-parallel world size the batch rule was resolved for (1 when none was given).
  std::int64_t world_size = 1;
  /// The batch keys as given, so the rule can be applied again for another world size (`rebatched`).
  batch_spec batch_given;
  /// `gradient_clipping`: global gradient-norm clip; 0 (default) disables clipping.
  double gradient_clipping = 0.0;
  /// `steps_per_print`: log every this many steps; empty (DeepSpeed's code default, None) never.
  std::optional<std::int64_t> steps_per_print;
  /// `wall_clock_breakdown`: time forward, backward and step. Default false.
  bool wall_clock_breakdown = false;
  /// `comm_timeout` (zero-specific, not a DeepSpeed key): seconds a wait on the communicator may
  /// block before it throws `timeout_error`; the engine sets it on its communicator. Empty (the
  /// default): the communicator keeps its own (`default_comm_timeout`, 300 s, unless set).
  std::optional<double> comm_timeout;
  /// `fp16`.
  fp16_config fp16;
  /// `bf16` (or DeepSpeed's old name `bfloat16`).
  bf16_config bf16;
  /// `data_types.grad_accum_dtype`, resolved as DeepSpeed does when absent: fp32 for bf16 at stage 0,
  /// the parameter dtype otherwise.
  dtype grad_accum_dtype = dtype::f32;
  /// `communication_data_type`: the dtype gradients are reduced in, which in zero is always
  /// `grad_accum_dtype`; the reader refuses any other value (and `check_engine_config` a config built
  /// in code with one). Absent or null: `grad_accum_dtype`.
  dtype communication_data_type = dtype::f32;
  /// `optimizer`; empty when the config has none. The reader accepts that (DeepSpeed then takes the
  /// framework's optimizer), but zero's engine has no API for an optimizer from outside the config:
  /// `check_engine_config` refuses a config without one.
  std::optional<optimizer_config> optimizer;
  /// `scheduler`; empty when the config has none.
  std::optional<scheduler_config> scheduler;
  /// `zero_optimization`.
  zero_optimization_config zero_optimization;
  /// `aio`.
  aio_config aio;
  /// `pipeline`.
  pipeline_config pipeline;
  /// `tensor_parallel`.
  tensor_parallel_config tensor_parallel;
  /// `activation_checkpointing`.
  activation_checkpointing_config activation_checkpointing;
  /// Settings accepted but without effect here, and aliases read under their new name, one line
  /// each, e.g. "zero_optimization.stage3_max_live_parameters: no effect at stage 2". Tools print them.
  std::vector<std::string> notes;

  /// The dtype of parameters and gradients: fp16 when fp16.enabled, bf16 when bf16.enabled, else fp32.
  [[nodiscard]] dtype param_dtype() const noexcept {
    return fp16.enabled ? dtype::f16 : (bf16.enabled ? dtype::bf16 : dtype::f32);
  }
  /// The ZeRO stage, 0-3.
  [[nodiscard]] int stage() const noexcept { return zero_optimization.stage; }

  /// Reads and resolves a config file (JSON; `//` and `/* */` comments allowed).
  /// \param path   the file: a regular file or a pipe (such as `<(...)`), of at most `max_config_bytes`.
  /// \param inputs values that resolve `"auto"` and the batch rule.
  /// \returns the resolved config.
  /// \throws config_error when the file is missing, is a folder or a device, is larger than
  ///         `max_config_bytes`, nests deeper than `max_config_depth`, is not valid JSON, or any
  ///         setting is refused; the message names the file.
  [[nodiscard]] static config from_file(const std::filesystem::path& path, const config_inputs& inputs = {});

  /// The JSON object of a config file, read as `from_file` reads it (bounded size and depth, comments
  /// allowed, duplicate keys refused) but not resolved: for a program that edits the config before
  /// `from_json` (e.g. sets the stage from its command line).
  /// \throws config_error as `from_file` does for the file and its JSON.
  [[nodiscard]] static nlohmann::json read_json_file(const std::filesystem::path& path);

  /// Reads and resolves a config held in a string.
  /// \param text   the JSON text.
  /// \param inputs values that resolve `"auto"` and the batch rule.
  /// \param source how messages name the text, e.g. a file name; empty for none.
  /// \throws config_error as `from_file`.
  [[nodiscard]] static config from_string(std::string_view text, const config_inputs& inputs = {},
                                          std::string_view source = {});

  /// Resolves an already parsed JSON object.
  /// \param j      the config object; nesting deeper than `max_config_depth` is refused.
  /// \param inputs values that resolve `"auto"` and the batch rule.
  /// \param source how messages name the config; empty for none.
  /// \throws config_error naming the JSON path of the first refused setting.
  [[nodiscard]] static config from_json(const nlohmann::json& j, const config_inputs& inputs = {},
                                        std::string_view source = {});

  /// The resolved config under DeepSpeed's key names, every default filled in. `from_json` of the
  /// result gives back this config (notes aside) for the same world size.
  [[nodiscard]] nlohmann::json to_json() const;

  /// This config with the batch rule applied again for another data-parallel world size, e.g. once
  /// the communicator is known.
  /// \throws config_error when the batch keys as given do not fit `world_size`.
  [[nodiscard]] config rebatched(std::int64_t world_size) const;
};

} // namespace zero

#include "zero/config/schema.hpp" // the keys of these settings, then (at its end) the reader and writer
