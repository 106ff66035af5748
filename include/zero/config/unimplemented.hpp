#pragma once
/// \file
/// The one table of DeepSpeed config settings that this version of zero knows but does not
/// implement. A config that asks for any of them is refused with a `config_error` that names the
/// key, the value found, the feature it needs and what is accepted instead; a key of the table
/// written with a value that asks for nothing (DeepSpeed's default, a block switched off) is
/// accepted. When a feature lands, delete its rows here and parse the key in `config.hpp`.

#include <cstdint>
#include <string_view>

namespace zero {

/// How a row of `unimplemented_features` decides that a value asks for a missing feature.
enum class unimplemented_when : std::uint8_t {
  differs_from, ///< any value other than `operand` (DeepSpeed's default) needs the feature
  equals,       ///< the value `operand` needs the feature (strings compared case-insensitively)
  one_of,       ///< any value of the JSON array `operand` needs it (strings case-insensitively)
  below,        ///< a number below `operand` needs it
  active,       ///< a block that is switched on: not null, not empty, not `"enabled": false`, not all values off
};

/// A DeepSpeed setting this version refuses, and why.
struct unimplemented_feature {
  std::string_view path;     ///< JSON path of the key, e.g. "zero_optimization.offload_param.device"
  unimplemented_when when;   ///< how the value found there is tested
  std::string_view operand;  ///< JSON text the value is compared with; empty for `active`
  std::string_view feature;  ///< what such a value needs, in words
  std::string_view status;   ///< "planned" or "not planned"
  std::string_view accepted; ///< what to write instead, when the rule alone does not say it well; may be empty
};

/// Every DeepSpeed setting zero knows and refuses. Keys under `bfloat16` (DeepSpeed's old name of
/// `bf16`) are looked up under `bf16`.
inline constexpr unimplemented_feature unimplemented_features[] = {
    // ---- offload targets -------------------------------------------------------------------
    {"zero_optimization.offload_optimizer.device", unimplemented_when::equals, R"("hpu")",
     "offload to Intel Gaudi (HPU) memory", "not planned", R"("cpu" or "none")"},
    {"zero_optimization.offload_param.device", unimplemented_when::equals, R"("hpu")",
     "offload to Intel Gaudi (HPU) memory", "not planned", R"("cpu" or "none")"},
    {"zero_optimization.offload_optimizer.pipeline_read", unimplemented_when::differs_from, "false",
     "the switch for pipelined NVMe reads (zero's NVMe offload always reads ahead while it updates)", "not planned",
     "false, or leave it out"},
    {"zero_optimization.offload_optimizer.pipeline_write", unimplemented_when::differs_from, "false",
     "the switch for pipelined NVMe writes (zero's NVMe offload always writes while it updates)", "not planned",
     "false, or leave it out"},
    {"zero_optimization.offload_optimizer.fast_init", unimplemented_when::differs_from, "false",
     "fast optimizer initialisation on NVMe", "planned", ""},
    {"aio.use_gds", unimplemented_when::differs_from, "false", "GPUDirect Storage", "not planned", ""},
    // ---- ZeRO variants and stage 3 internals ------------------------------------------------
    {"zero_optimization.load_from_fp32_weights", unimplemented_when::differs_from, "true",
     "rebuilding fp32 master weights from 16-bit weights when loading", "planned with checkpoints", ""},
    {"zero_optimization.legacy_stage1", unimplemented_when::differs_from, "false", "DeepSpeed's legacy stage 1",
     "not planned", ""},
    {"zero_optimization.zero_quantized_nontrainable_weights", unimplemented_when::differs_from, "false",
     "ZeRO++ quantized non-trainable weights", "not planned", ""},
    {"zero_optimization.zeropp_loco_param", unimplemented_when::active, "", "ZeRO++ LoCo error feedback", "not planned",
     ""},
    {"zero_optimization.mics_hierarchical_params_gather", unimplemented_when::differs_from, "false",
     "MiCS hierarchical gather", "not planned", ""},
    {"zero_optimization.use_multi_rank_bucket_allreduce", unimplemented_when::differs_from, "true",
     "per-rank reduce of gradient buckets", "not planned", ""},
    {"zero_optimization.stage3_model_persistence_threshold", unimplemented_when::differs_from, "9223372036854775807",
     "a cap on the total size of persistent stage-3 parameters", "planned", ""},
    {"zero_optimization.model_persistence_threshold", unimplemented_when::differs_from, "9223372036854775807",
     "a cap on the total size of persistent stage-3 parameters", "planned", ""},
    {"zero_optimization.stage3_module_granularity_threshold", unimplemented_when::differs_from, "0",
     "fetching fine-grained modules as one unit", "not planned", ""},
    {"zero_optimization.module_granularity_threshold", unimplemented_when::differs_from, "0",
     "fetching fine-grained modules as one unit", "not planned", ""},
    {"zero_optimization.stage3_use_all_reduce_for_fetch_params", unimplemented_when::differs_from, "false",
     "all-reduce instead of all-gather to fetch stage-3 parameters", "not planned", ""},
    {"zero_optimization.use_all_reduce_for_fetch_params", unimplemented_when::differs_from, "false",
     "all-reduce instead of all-gather to fetch stage-3 parameters", "not planned", ""},
    {"zero_optimization.pipeline_loading_checkpoint", unimplemented_when::differs_from, "false",
     "pipeline-parallel checkpoint loading", "not planned", ""},
    {"zero_optimization.log_trace_cache_warnings", unimplemented_when::differs_from, "false",
     "stage-3 trace cache warnings", "not planned", ""},
    // ---- precision ---------------------------------------------------------------------------
    {"fp16.auto_cast", unimplemented_when::differs_from, "false", "casting inputs to fp16 (the framework casts)",
     "not planned", ""},
    {"fp16.fp16_master_weights_and_grads", unimplemented_when::differs_from, "false",
     "fp16 master weights and gradients", "not planned", ""},
    {"bf16.immediate_grad_update", unimplemented_when::differs_from, "false", "immediate bf16 gradient updates",
     "not planned", ""},
    {"bf16.check_grad_overflow", unimplemented_when::differs_from, "false", "overflow checks in bf16 mode",
     "not planned", ""},
    {"bf16.bf16_master_weights_and_grads", unimplemented_when::differs_from, "false",
     "bf16 master weights and gradients", "not planned", ""},
    {"bf16.bf16_optimizer_states", unimplemented_when::differs_from, "false", "bf16 optimizer states", "not planned",
     ""},
    {"data_types.param_dtype", unimplemented_when::differs_from, "null",
     "a parameter dtype other than the one fp16/bf16 selects", "not planned", ""},
    {"data_types.buffer_dtype", unimplemented_when::differs_from, "null", "casting module buffers", "not planned", ""},
    {"amp", unimplemented_when::active, "", "NVIDIA Apex AMP (use fp16 or bf16)", "not planned", ""},
    {"torch_autocast", unimplemented_when::active, "", "torch.autocast mixed precision (use fp16 or bf16)",
     "not planned", ""},
    {"seq_parallel_communication_data_type", unimplemented_when::differs_from, R"("fp32")",
     "sequence-parallel communication", "not planned", ""},
    // ---- optimizer and scheduler ---------------------------------------------------------------
    {"optimizer.type", unimplemented_when::one_of,
     R"(["onebitadam", "zerooneadam", "onebitlamb", "muadam", "muadamw", "musgd", "muon",)"
     R"( "rmsprop", "adadelta", "adamax", "asgd", "lbfgs", "nadam", "radam", "rprop", "sparseadam"])",
     "optimizers other than Adam, AdamW, Lion, SGD, Adagrad and Lamb", "not planned",
     R"("Adam", "AdamW", "Lion", "SGD", "Adagrad" or "Lamb")"},
    {"optimizer.legacy_fusion", unimplemented_when::differs_from, "false", "legacy fused fp16 optimizer", "not planned",
     ""},
    {"optimizer.params.amsgrad", unimplemented_when::differs_from, "false", "AMSGrad", "not planned", ""},
    // ---- gradients and communication ---------------------------------------------------------
    {"prescale_gradients", unimplemented_when::differs_from, "false", "pre-scaling gradients before all-reduce",
     "not planned", ""},
    {"gradient_predivide_factor", unimplemented_when::differs_from, "1", "a gradient pre-divide factor", "not planned",
     ""},
    {"sparse_gradients", unimplemented_when::differs_from, "false", "CSR sparse gradients", "not planned", ""},
    {"disable_allgather", unimplemented_when::differs_from, "false", "disabling the parameter all-gather",
     "not planned", ""},
    {"sequence_parallel_size", unimplemented_when::differs_from, "1", "sequence parallelism", "not planned", ""},
    {"use_data_before_expert_parallelism", unimplemented_when::differs_from, "false", "expert parallelism",
     "not planned", ""},
    {"expert_parallel", unimplemented_when::active, "", "expert parallelism set in the config", "not planned",
     "the block left out: the framework builds the groups and gives each engine its own (zero::topology, "
     "docs/parallelism.md)"},
    // AutoTP's automatic sharding of a model: the framework cuts its own slices (tensor_split).
    {"tensor_parallel.tp", unimplemented_when::active, "",
     "the inference engine's tensor-parallel settings (DeepSpeed's TPConfig)", "not planned",
     "the block left out; the tensor-parallel size goes in tensor_parallel.autotp_size"},
    {"tensor_parallel.tensor_parallel", unimplemented_when::active, "",
     "the inference engine's tensor-parallel settings (DeepSpeed's TPConfig)", "not planned",
     "the block left out; the tensor-parallel size goes in tensor_parallel.autotp_size"},
    {"tensor_parallel.partition_config", unimplemented_when::differs_from, "null",
     "AutoTP's automatic partitioning of a model's layers", "not planned",
     "null, or the key left out: the framework registers its own slices (param_options::tensor_split, "
     "docs/parallelism.md)"},
    {"tensor_parallel.preset_model", unimplemented_when::differs_from, "null",
     "AutoTP's automatic partitioning of a model's layers", "not planned",
     "null, or the key left out: the framework registers its own slices (param_options::tensor_split, "
     "docs/parallelism.md)"},
    {"tensor_parallel.injection_policy_tuple", unimplemented_when::differs_from, "null",
     "AutoTP's automatic partitioning of a model's layers", "not planned", ""},
    {"tensor_parallel.keep_module_on_host", unimplemented_when::differs_from, "false",
     "AutoTP's loading of a model's weights", "not planned", ""},
    {"tensor_parallel.replace_with_kernel_inject", unimplemented_when::differs_from, "false",
     "DeepSpeed's inference kernels", "not planned", ""},
    {"tensor_parallel.kernel_inject", unimplemented_when::differs_from, "false", "DeepSpeed's inference kernels",
     "not planned", ""},
    // The framework runs the pipeline and checkpoints its own activations.
    {"pipeline.activation_checkpoint_interval", unimplemented_when::differs_from, "0",
     "activation checkpointing in the pipeline (the framework checkpoints its own activations)", "not planned", ""},
    // ---- training features outside ZeRO ------------------------------------------------------
    // activation_checkpointing's other keys are read (schema.hpp): cpu_checkpointing keeps the framework's
    // checkpoints in host memory (activation_store).
    {"activation_checkpointing.partition_activations", unimplemented_when::differs_from, "false",
     "splitting activation checkpoints over the model-parallel group", "not planned",
     "false: zero keeps each rank's checkpoints whole (cpu_checkpointing puts them in host memory)"},
    // checkpoint.tag_validation "Warn" (DeepSpeed's default) and "Ignore" are read (schema.hpp).
    {"checkpoint.tag_validation", unimplemented_when::equals, R"("Fail")",
     "failing a save whose tag differs across ranks", "planned with checkpoints",
     R"("Warn" (DeepSpeed's default) or "Ignore", which have no effect here)"},
    {"checkpoint.load_universal", unimplemented_when::differs_from, "false", "DeepSpeed's universal checkpoints",
     "not planned", "false, or leave it out: zero's own checkpoints load at any stage and rank count"},
    {"checkpoint.use_node_local_storage", unimplemented_when::differs_from, "false", "node-local checkpoint storage",
     "planned with checkpoints", ""},
    {"checkpoint.parallel_write", unimplemented_when::active, "", "pipeline-stage parallel checkpoint writes",
     "not planned", ""},
    {"elasticity", unimplemented_when::active, "", "elastic training", "not planned", ""},
    {"sparse_attention", unimplemented_when::active, "", "sparse attention kernels", "not planned", ""},
    {"progressive_layer_drop", unimplemented_when::active, "", "progressive layer drop", "not planned", ""},
    {"curriculum_learning", unimplemented_when::active, "", "curriculum learning", "not planned", ""},
    {"data_efficiency", unimplemented_when::active, "", "data efficiency (sampling and routing)", "not planned", ""},
    {"compression_training", unimplemented_when::active, "", "compression training", "not planned", ""},
    {"quantize_training", unimplemented_when::active, "", "quantized training (MoQ)", "not planned", ""},
    {"weight_quantization", unimplemented_when::active, "", "weight quantization", "not planned", ""},
    {"eigenvalue", unimplemented_when::active, "", "eigenvalue computation", "not planned", ""},
    {"hybrid_engine", unimplemented_when::active, "", "the hybrid (RLHF) engine", "not planned", ""},
    {"compile", unimplemented_when::active, "", "torch.compile integration", "not planned", ""},
    {"dataloader_drop_last", unimplemented_when::differs_from, "false",
     "DeepSpeed's data loader (the framework loads data)", "not planned", ""},
    {"vocabulary_size", unimplemented_when::differs_from, "null", "vocabulary-size alignment checks", "not planned",
     ""},
    {"graph_harvesting", unimplemented_when::differs_from, "false", "graph harvesting", "not planned", ""},
    // ---- monitoring and tooling ----------------------------------------------------------------
    {"flops_profiler", unimplemented_when::active, "", "the FLOPs profiler", "not planned", ""},
    {"comms_logger", unimplemented_when::active, "", "the communication logger", "not planned", ""},
    {"tensorboard", unimplemented_when::active, "", "TensorBoard monitoring", "not planned", ""},
    {"wandb", unimplemented_when::active, "", "Weights & Biases monitoring", "not planned", ""},
    {"csv_monitor", unimplemented_when::active, "", "CSV monitoring", "not planned", ""},
    {"comet", unimplemented_when::active, "", "Comet monitoring", "not planned", ""},
    {"autotuning", unimplemented_when::active, "", "the autotuner", "not planned", ""},
    {"nebula", unimplemented_when::active, "", "Nebula checkpointing", "not planned", ""},
    {"timers", unimplemented_when::active, "", "DeepSpeed's throughput timers", "not planned", ""},
    {"memory_breakdown", unimplemented_when::differs_from, "false", "memory breakdown logging", "not planned", ""},
    {"dump_state", unimplemented_when::differs_from, "false", "dumping engine state", "not planned", ""},
};

} // namespace zero
