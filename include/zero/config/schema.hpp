#pragma once
/// \file
/// The keys zero reads from a DeepSpeed config, block by block. Together with
/// `unimplemented_features` this is every key the reader accepts: a key in neither is unknown and
/// refused, with "did you mean" when it is a near miss and "belongs in" when it is a key of another
/// block. docs/config.md documents each key listed here; a test checks that it does.

#include <span>
#include <string_view>

namespace zero {

/// The keys of one JSON object in the config.
struct config_block {
  std::string_view path;                  ///< JSON path of the object; "" for the top level
  std::span<const std::string_view> keys; ///< keys zero reads there, aliases included
};

namespace detail::schema {
inline constexpr std::string_view top[] = {"train_batch_size",
                                           "train_micro_batch_size_per_gpu",
                                           "gradient_accumulation_steps",
                                           "gradient_clipping",
                                           "steps_per_print",
                                           "wall_clock_breakdown",
                                           "fp16",
                                           "bf16",
                                           "bfloat16",
                                           "data_types",
                                           "communication_data_type",
                                           "optimizer",
                                           "scheduler",
                                           "zero_optimization",
                                           "aio",
                                           "zero_allow_untested_optimizer",
                                           "zero_force_ds_cpu_optimizer",
                                           "allgather_size",
                                           "comm_timeout"}; // zero-specific, not a DeepSpeed key
inline constexpr std::string_view fp16[] = {"enabled",           "loss_scale", "initial_scale_power",
                                            "loss_scale_window", "hysteresis", "consecutive_hysteresis",
                                            "min_loss_scale"};
inline constexpr std::string_view bf16[] = {"enabled"};
inline constexpr std::string_view data_types[] = {"grad_accum_dtype"};
inline constexpr std::string_view optimizer[] = {"type", "params"};
inline constexpr std::string_view optimizer_params[] = {"lr",          "betas",           "eps",       "weight_decay",
                                                        "adam_w_mode", "bias_correction", "torch_adam"};
inline constexpr std::string_view scheduler[] = {"type", "params"};
inline constexpr std::string_view scheduler_params[] = {"warmup_min_lr",    "warmup_max_lr",        "warmup_num_steps",
                                                        "warmup_type",      "last_batch_iteration", "total_num_steps",
                                                        "warmup_min_ratio", "cos_min_ratio"};
inline constexpr std::string_view zero_optimization[] = {"stage",
                                                         "contiguous_gradients",
                                                         "overlap_comm",
                                                         "reduce_scatter",
                                                         "reduce_bucket_size",
                                                         "allgather_partitions",
                                                         "allgather_bucket_size",
                                                         "offload_optimizer",
                                                         "offload_param",
                                                         "sub_group_size",
                                                         "stage3_max_live_parameters",
                                                         "stage3_max_reuse_distance",
                                                         "stage3_prefetch_bucket_size",
                                                         "stage3_param_persistence_threshold",
                                                         "stage3_gather_16bit_weights_on_model_save",
                                                         "round_robin_gradients",
                                                         "ignore_unused_parameters",
                                                         "elastic_checkpoint",
                                                         "max_live_parameters",
                                                         "max_reuse_distance",
                                                         "prefetch_bucket_size",
                                                         "param_persistence_threshold",
                                                         "gather_16bit_weights_on_model_save",
                                                         "stage3_gather_fp16_weights_on_model_save",
                                                         "cpu_offload",
                                                         "cpu_offload_param",
                                                         "cpu_offload_use_pin_memory"};
inline constexpr std::string_view offload_optimizer[] = {"device", "nvme_path", "pin_memory", "buffer_count", "ratio"};
inline constexpr std::string_view offload_param[] = {"device",       "nvme_path",   "pin_memory",
                                                     "buffer_count", "buffer_size", "max_in_cpu"};
inline constexpr std::string_view aio[] = {"block_size",    "queue_depth",    "thread_count",
                                           "single_submit", "overlap_events", "intra_op_parallelism"};
} // namespace detail::schema

/// Every block zero reads and the keys it reads there. `bfloat16` is DeepSpeed's old name of `bf16`.
inline constexpr config_block config_blocks[] = {
    {"", detail::schema::top},
    {"fp16", detail::schema::fp16},
    {"bf16", detail::schema::bf16},
    {"bfloat16", detail::schema::bf16},
    {"data_types", detail::schema::data_types},
    {"optimizer", detail::schema::optimizer},
    {"optimizer.params", detail::schema::optimizer_params},
    {"scheduler", detail::schema::scheduler},
    {"scheduler.params", detail::schema::scheduler_params},
    {"zero_optimization", detail::schema::zero_optimization},
    {"zero_optimization.offload_optimizer", detail::schema::offload_optimizer},
    {"zero_optimization.offload_param", detail::schema::offload_param},
    {"aio", detail::schema::aio},
};

} // namespace zero
