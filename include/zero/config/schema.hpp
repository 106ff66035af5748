#pragma once
/// \file
/// The keys zero reads from a DeepSpeed config: one table per JSON object (block), one row per key
/// name. A row says which member of the block's settings holds the key's value (its type picks how
/// the value is read and written), its bounds, the name it is an alias of, whether it is
/// deprecated, the `config_inputs` value that resolves `"auto"`, the stages it acts at and the values
/// that have no effect. The reader, `config::to_json`, `config_blocks` and the docs test are derived
/// from these rows; code in detail/parse.hpp and detail/hand_keys.hpp reads only the keys whose row
/// says `by_hand`: blocks, `"auto"` resolved by a formula, and values derived from other keys.
/// docs/config.md ("The key tables") says how to add a key.
///
/// Together with `unimplemented_features` this is every key the reader accepts: a key in neither is
/// unknown and refused, with "did you mean" when it is a near miss and "belongs in" when it is a key
/// of another block.
///
/// config.hpp (the settings), this file (their keys) and detail/parse.hpp (the reader and writer)
/// each include the next at their end, so that including any of them includes all three in order.

#include "zero/config/config.hpp" // the settings the rows point into; includes this file at its end
#include "zero/config/detail/key_row.hpp"

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

namespace zero {
namespace detail {

inline constexpr choice<offload_device> offload_devices[] = {
    {"none", offload_device::none}, {"cpu", offload_device::cpu}, {"nvme", offload_device::nvme}};
inline constexpr choice<zenflow_select> zenflow_selects[] = {
    {"auto", zenflow_select::automatic}, {"step", zenflow_select::step}, {"epoch", zenflow_select::epoch}};
inline constexpr choice<optimizer_type> optimizer_types[] = {
    {"Adam", optimizer_type::adam}, {"AdamW", optimizer_type::adamw},     {"Lion", optimizer_type::lion},
    {"SGD", optimizer_type::sgd},   {"Adagrad", optimizer_type::adagrad}, {"Lamb", optimizer_type::lamb}};
inline constexpr choice<scheduler_type> scheduler_types[] = {{"WarmupLR", scheduler_type::warmup_lr},
                                                             {"WarmupDecayLR", scheduler_type::warmup_decay_lr},
                                                             {"WarmupCosineLR", scheduler_type::warmup_cosine_lr},
                                                             {"LRRangeTest", scheduler_type::lr_range_test},
                                                             {"OneCycle", scheduler_type::one_cycle}};
inline constexpr choice<warmup_curve> warmup_curves[] = {{"log", warmup_curve::log}, {"linear", warmup_curve::linear}};
// DeepSpeed's DtypeEnum spellings of the three float types.
inline constexpr choice<dtype> dtype_names[] = {
    {"fp32", dtype::f32},  {"float32", dtype::f32},   {"float", dtype::f32},          {"torch.float32", dtype::f32},
    {"fp16", dtype::f16},  {"float16", dtype::f16},   {"half", dtype::f16},           {"torch.float16", dtype::f16},
    {"bf16", dtype::bf16}, {"bfloat16", dtype::bf16}, {"torch.bfloat16", dtype::bf16}};
inline constexpr choice<dtype> comm_dtype_names[] = {{"fp32", dtype::f32}, {"fp16", dtype::f16}, {"bf16", dtype::bf16}};

// Keys read by hand in the middle of their block (defined in detail/hand_keys.hpp): "auto" resolved
// by Hugging Face's formulas, and values whose default or check derives from other keys.
inline std::optional<json> auto_zero(const parse_context&, std::string_view, const config_inputs&);
inline std::optional<json> auto_hidden_squared(const parse_context&, std::string_view path, const config_inputs&);
inline std::optional<json> auto_prefetch_bucket(const parse_context&, std::string_view path, const config_inputs&);
inline std::optional<json> auto_persistence(const parse_context&, std::string_view path, const config_inputs&);
inline void read_overlap_comm(const key_read<zero_optimization_config>&);
inline void read_allgather_bucket_size(const key_read<zero_optimization_config>&);
inline void read_offload(const key_read<zero_optimization_config>&);
inline void read_offload_ratio(const key_read<offload_optimizer_config>&);
inline json write_offload_ratio(const offload_optimizer_config&);
inline void read_host_ratio(const key_read<offload_optimizer_config>&);
inline void read_gather_16bit_weights(const key_read<zero_optimization_config>&);
inline void read_schedule_param(const key_read<scheduler_config>&);
inline void read_total_num_steps(const key_read<scheduler_config>&);
inline void read_required_schedule_param(const key_read<scheduler_config>&);
inline std::optional<json> auto_unset(const parse_context&, std::string_view, const config_inputs&);
inline json write_pipeline_stages(const pipeline_config&);
inline void read_zenflow(const key_read<zero_optimization_config>&);
inline json write_select_interval(const zenflow_config&);
inline json write_update_interval(const zenflow_config&);

// ---- the top level -------------------------------------------------------------------------------

inline constexpr key_row<config> top_keys[] = {
    // The batch rule derives these three from each other (parse_batch).
    key<&config::train_batch_size>("train_batch_size").by_hand(),
    key<&config::train_micro_batch_size_per_gpu>("train_micro_batch_size_per_gpu").by_hand(),
    key<&config::gradient_accumulation_steps>("gradient_accumulation_steps").by_hand(),
    key<&config::gradient_clipping>("gradient_clipping")
        .at_least(0.0)
        .from_input<&config_inputs::max_grad_norm>(
            "config_inputs::max_grad_norm (--max-grad-norm)",
            "the gradient-norm clip (config_inputs::max_grad_norm, --max-grad-norm)"),
    key<&config::steps_per_print>("steps_per_print").at_least(1).or_null(),
    key<&config::wall_clock_breakdown>("wall_clock_breakdown"),
    hand<config>("fp16"),
    hand<config>("bf16"),
    alias<config>("bfloat16", "bf16"), // DeepSpeed's old name (parse_bf16)
    hand<config>("data_types"),
    // Defaults to grad_accum_dtype, the only value accepted (parse_config).
    key<&config::communication_data_type, comm_dtype_names>("communication_data_type").any_case().or_null().by_hand(),
    hand<config>("optimizer"),
    hand<config>("scheduler"),
    hand<config>("zero_optimization"),
    hand<config>("aio"),
    hand<config>("pipeline"),
    hand<config>("tensor_parallel"),
    hand<config>("checkpoint"),
    hand<config>("activation_checkpointing"),
    checked<config, bool>("zero_allow_untested_optimizer").noted_if("true", "no effect: zero runs its own Adam/AdamW"),
    checked<config, bool>("zero_force_ds_cpu_optimizer")
        .noted_if("false", "no effect: zero's CPU optimizer is its own"),
    // zero_optimization.allgather_bucket_size of the boolean zero_optimization (parse_zero_optimization).
    hand<config>("allgather_size").deprecated(),
    // zero-specific, not a DeepSpeed key: at least a millisecond (the communicators' resolution), at
    // most a year.
    key<&config::comm_timeout>("comm_timeout").range(0.001, 365.0 * 24 * 3600).or_null(),
};

// ---- precision -----------------------------------------------------------------------------------

inline constexpr key_row<fp16_config> fp16_keys[] = {
    key<&fp16_config::enabled>("enabled").by_hand(), // "auto": config_inputs::precision (parse_fp16)
    key<&fp16_config::loss_scale>("loss_scale").at_least(0.0),
    // 2^127 is the largest power of two a float loss scale holds.
    key<&fp16_config::initial_scale_power>("initial_scale_power").range(0, 127),
    key<&fp16_config::loss_scale_window>("loss_scale_window").at_least(1),
    key<&fp16_config::hysteresis>("hysteresis").at_least(1),
    key<&fp16_config::consecutive_hysteresis>("consecutive_hysteresis"),
    key<&fp16_config::min_loss_scale>("min_loss_scale").at_least(0.0),
};

inline constexpr key_row<bf16_config> bf16_keys[] = {
    key<&bf16_config::enabled>("enabled").by_hand(), // "auto": config_inputs::precision (parse_bf16)
};

inline constexpr key_row<config> data_types_keys[] = {
    // fp32 or the parameter dtype; the default derives from both (parse_config).
    key<&config::grad_accum_dtype, dtype_names>("grad_accum_dtype").or_null().by_hand(),
};

// ---- optimizer and scheduler ---------------------------------------------------------------------

inline constexpr key_row<optimizer_config> optimizer_keys[] = {
    key<&optimizer_config::type, optimizer_types>("type").any_case().by_hand(), // required (parse_optimizer)
    hand<optimizer_config>("params"),
};

inline constexpr key_row<optimizer_config> optimizer_params_keys[] = {
    key<&optimizer_config::lr>("lr").at_least(0.0).from_input<&config_inputs::lr>(
        "config_inputs::lr (--lr)", "the learning rate (config_inputs::lr, --lr)"),
    key<&optimizer_config::betas>("betas").range(0.0, 1.0).max_exclusive().from_input<&config_inputs::betas>(
        "config_inputs::betas (--adam-beta1/--adam-beta2)",
        "Adam's betas (config_inputs::betas, --adam-beta1 and --adam-beta2)"),
    key<&optimizer_config::eps>("eps").at_least(0.0).from_input<&config_inputs::eps>(
        "config_inputs::eps (--adam-epsilon)", "Adam's epsilon (config_inputs::eps, --adam-epsilon)"),
    // The default derives from torch_adam and the type (parse_optimizer).
    key<&optimizer_config::weight_decay>("weight_decay")
        .at_least(0.0)
        .from_input<&config_inputs::weight_decay>("config_inputs::weight_decay (--weight-decay)",
                                                  "the weight decay (config_inputs::weight_decay, --weight-decay)"),
    // These three are read first, by parse_optimizer: they decide the type's mode and defaults.
    key<&optimizer_config::adam_w_mode>("adam_w_mode").by_hand(),
    key<&optimizer_config::bias_correction>("bias_correction").by_hand(),
    hand<optimizer_config>("torch_adam"),
    // SGD's and Adagrad's (torch.optim's names and defaults).
    key<&optimizer_config::momentum>("momentum").at_least(0.0),
    key<&optimizer_config::dampening>("dampening").at_least(0.0),
    key<&optimizer_config::nesterov>("nesterov"),
    key<&optimizer_config::lr_decay>("lr_decay").at_least(0.0),
    key<&optimizer_config::initial_accumulator_value>("initial_accumulator_value").at_least(0.0),
    // Lamb's (DeepSpeed's FusedLamb).
    key<&optimizer_config::max_coeff>("max_coeff").at_least(0.0),
    key<&optimizer_config::min_coeff>("min_coeff").at_least(0.0),
    key<&optimizer_config::eps_inside_sqrt>("eps_inside_sqrt"),
    key<&optimizer_config::max_grad_norm>("max_grad_norm").at_least(0.0),
};

// The parameters each optimizer type takes (its constructor's in DeepSpeed or torch.optim).
inline constexpr std::string_view adam_params[] = {"lr",          "betas",           "eps",        "weight_decay",
                                                   "adam_w_mode", "bias_correction", "torch_adam", "amsgrad"};
inline constexpr std::string_view lion_params[] = {"lr", "betas", "weight_decay"};
inline constexpr std::string_view sgd_params[] = {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
inline constexpr std::string_view adagrad_params[] = {"lr", "lr_decay", "weight_decay", "initial_accumulator_value",
                                                      "eps"};
inline constexpr std::string_view lamb_params[] = {
    "lr",        "bias_correction", "betas",           "eps",           "weight_decay",
    "max_coeff", "min_coeff",       "eps_inside_sqrt", "max_grad_norm", "amsgrad"};

inline constexpr key_row<scheduler_config> scheduler_keys[] = {
    key<&scheduler_config::type, scheduler_types>("type").by_hand(), // required (parse_scheduler)
    hand<scheduler_config>("params"),
};

inline constexpr key_row<scheduler_config> scheduler_params_keys[] = {
    // Hugging Face fills "auto" here with 0, whatever its arguments.
    key<&scheduler_config::warmup_min_lr>("warmup_min_lr").at_least(0.0).on_auto(auto_zero),
    // Read only for the schedules that take it; its default derives from the schedule and the
    // optimizer (parse_scheduler).
    key<&scheduler_config::warmup_max_lr>("warmup_max_lr")
        .at_least(0.0)
        .or_null()
        .from_input<&config_inputs::lr>("config_inputs::lr (--lr)", "the learning rate (config_inputs::lr, --lr)")
        .by_hand(read_schedule_param),
    key<&scheduler_config::warmup_num_steps>("warmup_num_steps")
        .at_least(1)
        .from_input<&config_inputs::warmup_steps>(
            "config_inputs::warmup_steps (--warmup-steps)",
            "the number of warm-up steps (config_inputs::warmup_steps, --warmup-steps)"),
    key<&scheduler_config::warmup_type, warmup_curves>("warmup_type"),
    key<&scheduler_config::last_batch_iteration>("last_batch_iteration").at_least(-1),
    // Required by the schedules that take it.
    key<&scheduler_config::total_num_steps>("total_num_steps")
        .at_least(1)
        .from_input<&config_inputs::total_steps>(
            "config_inputs::total_steps (--total-steps)",
            "the number of training steps (config_inputs::total_steps, --total-steps)")
        .by_hand(read_total_num_steps),
    key<&scheduler_config::warmup_min_ratio>("warmup_min_ratio").range(0.0, 1.0),
    key<&scheduler_config::cos_min_ratio>("cos_min_ratio").range(0.0, 1.0),
    key<&scheduler_config::lr_range_test_min_lr>("lr_range_test_min_lr").at_least(0.0),
    key<&scheduler_config::lr_range_test_step_size>("lr_range_test_step_size").at_least(1),
    key<&scheduler_config::lr_range_test_step_rate>("lr_range_test_step_rate").at_least(0.0),
    key<&scheduler_config::lr_range_test_staircase>("lr_range_test_staircase"),
    // Required by OneCycle (DeepSpeed's constructor has no default for them).
    key<&scheduler_config::cycle_min_lr>("cycle_min_lr").at_least(0.0).by_hand(read_required_schedule_param),
    key<&scheduler_config::cycle_max_lr>("cycle_max_lr").at_least(0.0).by_hand(read_required_schedule_param),
    key<&scheduler_config::decay_lr_rate>("decay_lr_rate").at_least(0.0),
    // More than 0: parse_scheduler refuses 0, as DeepSpeed does.
    key<&scheduler_config::cycle_first_step_size>("cycle_first_step_size").at_least(0.0),
    key<&scheduler_config::cycle_second_step_size>("cycle_second_step_size").at_least(0.0).or_null(),
    key<&scheduler_config::cycle_first_stair_count>("cycle_first_stair_count").at_least(0),
    key<&scheduler_config::cycle_second_stair_count>("cycle_second_stair_count").at_least(0).or_null(),
    key<&scheduler_config::decay_step_size>("decay_step_size").at_least(0.0),
    key<&scheduler_config::cycle_momentum>("cycle_momentum"),
    key<&scheduler_config::cycle_min_mom>("cycle_min_mom").range(0.0, 1.0),
    key<&scheduler_config::cycle_max_mom>("cycle_max_mom").range(0.0, 1.0),
    key<&scheduler_config::decay_mom_rate>("decay_mom_rate").at_least(0.0),
};

// The parameters each schedule's constructor takes in DeepSpeed, in its order; a schedule refuses
// the others, and `to_json` writes these.
inline constexpr std::string_view warmup_lr_params[] = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps",
                                                        "warmup_type", "last_batch_iteration"};
inline constexpr std::string_view warmup_decay_lr_params[] = {
    "warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration", "total_num_steps"};
inline constexpr std::string_view warmup_cosine_lr_params[] = {
    "total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio", "warmup_type", "last_batch_iteration"};

inline constexpr std::string_view lr_range_test_params[] = {"lr_range_test_min_lr", "lr_range_test_step_size",
                                                            "lr_range_test_step_rate", "lr_range_test_staircase",
                                                            "last_batch_iteration"};
inline constexpr std::string_view one_cycle_params[] = {"cycle_min_lr",
                                                        "cycle_max_lr",
                                                        "decay_lr_rate",
                                                        "cycle_first_step_size",
                                                        "cycle_second_step_size",
                                                        "cycle_first_stair_count",
                                                        "cycle_second_stair_count",
                                                        "decay_step_size",
                                                        "cycle_momentum",
                                                        "cycle_min_mom",
                                                        "cycle_max_mom",
                                                        "decay_mom_rate",
                                                        "last_batch_iteration"};

/// The parameters schedule `t` takes.
constexpr std::span<const std::string_view> schedule_params(scheduler_type t) {
  switch (t) {
  case scheduler_type::warmup_lr:
    return warmup_lr_params;
  case scheduler_type::warmup_decay_lr:
    return warmup_decay_lr_params;
  case scheduler_type::lr_range_test:
    return lr_range_test_params;
  case scheduler_type::one_cycle:
    return one_cycle_params;
  case scheduler_type::warmup_cosine_lr:
    break;
  }
  return warmup_cosine_lr_params;
}

/// The parameters of optimizer type `t` (none for `custom`: a framework's rule declares its own,
/// `optimizer_config::custom_params`).
constexpr std::span<const std::string_view> optimizer_params(optimizer_type t) {
  switch (t) {
  case optimizer_type::custom:
    return {};
  case optimizer_type::lion:
    return lion_params;
  case optimizer_type::sgd:
    return sgd_params;
  case optimizer_type::adagrad:
    return adagrad_params;
  case optimizer_type::lamb:
    return lamb_params;
  case optimizer_type::adam:
  case optimizer_type::adamw:
    break;
  }
  return adam_params;
}

/// True when schedule `t` takes the parameter `key`.
constexpr bool schedule_takes(scheduler_type t, std::string_view key) {
  for (std::string_view k : schedule_params(t)) {
    if (k == key) {
      return true;
    }
  }
  return false;
}

// ---- zero_optimization ---------------------------------------------------------------------------

// The offloads take the backend's host memory, whatever pin_memory says.
inline constexpr std::string_view offload_pin_memory =
    "no effect: the host memory of the offload (and with nvme its buffers) is the backend's host_allocator_type, "
    "pinned on a GPU (cuda_backend) and pageable on the CPU backend, whatever pin_memory says (docs/offload.md)";

inline constexpr key_row<offload_optimizer_config> offload_optimizer_keys[] = {
    key<&offload_optimizer_config::device, offload_devices>("device").any_case(),
    key<&offload_optimizer_config::nvme_path>("nvme_path").or_null().nvme(),
    key<&offload_optimizer_config::pin_memory>("pin_memory").noted_if("", offload_pin_memory),
    key<&offload_optimizer_config::buffer_count>("buffer_count").at_least(0).nvme(),
    // A number, or "auto" (the engine measures and picks it): read and written by hand.
    key<&offload_optimizer_config::ratio>("ratio")
        .range(0.0, 1.0)
        .by_hand(read_offload_ratio)
        .written_by(write_offload_ratio),
    // zero-specific, not a DeepSpeed key: the share in host memory beside the NVMe file (read_host_ratio).
    key<&offload_optimizer_config::host_ratio>("host_ratio").by_hand(read_host_ratio),
    // zero-specific, not a DeepSpeed key.
    key<&offload_optimizer_config::backward_overlap>("backward_overlap").range(0.0, 1.0),
    key<&offload_optimizer_config::forward_overlap>("forward_overlap"),
    // zero-specific, not a DeepSpeed key: a block, read by read_offload_block into the fields of
    // delayed_update_keys.
    hand<offload_optimizer_config>("delayed_update"),
};

// zero_optimization.offload_optimizer.delayed_update (zero's own block): the one-step delayed update.
inline constexpr key_row<offload_optimizer_config> delayed_update_keys[] = {
    key<&offload_optimizer_config::delayed_warmup_steps>("warmup_steps").at_least(0),
};

inline constexpr key_row<offload_param_config> offload_param_keys[] = {
    key<&offload_param_config::device, offload_devices>("device").any_case(),
    key<&offload_param_config::nvme_path>("nvme_path").or_null().nvme(),
    key<&offload_param_config::pin_memory>("pin_memory").noted_if("", offload_pin_memory),
    key<&offload_param_config::buffer_count>("buffer_count").at_least(0).nvme(),
    key<&offload_param_config::buffer_size>("buffer_size").at_least(0).nvme(),
    key<&offload_param_config::max_in_cpu>("max_in_cpu").at_least(0).nvme(),
};

// zero_optimization.zenflow (DeepSpeed 0.19's ZenFlow, its defaults): read_zenflow checks the rules between them.
inline constexpr key_row<zenflow_config> zenflow_keys[] = {
    key<&zenflow_config::topk_ratio>("topk_ratio").range(0.0, 1.0),
    key<&zenflow_config::select_strategy, zenflow_selects>("select_strategy"),
    key<&zenflow_config::select_interval>("select_interval")
        .at_least(0)
        .on_auto(auto_unset)
        .written_by(write_select_interval),
    key<&zenflow_config::update_interval>("update_interval")
        .at_least(1)
        .on_auto(auto_unset)
        .written_by(write_update_interval),
    key<&zenflow_config::overlap_step>("overlap_step"),
    key<&zenflow_config::offload>("offload"),
    key<&zenflow_config::auto_ratio>("auto_ratio").range(0.0, 1.0),
    key<&zenflow_config::full_warm_up_rounds>("full_warm_up_rounds").at_least(0),
    key<&zenflow_config::pt_reserved_cores_perc>("pt_reserved_cores_perc").range(0.0, 1.0),
    key<&zenflow_config::steps_per_epoch>("steps_per_epoch").at_least(0),
};

// Stage masks: bit s set when the key acts at stage s; a key written for another stage is noted.
inline constexpr key_row<zero_optimization_config> zero_optimization_keys[] = {
    key<&zero_optimization_config::stage>("stage").range(0, 3),
    key<&zero_optimization_config::contiguous_gradients>("contiguous_gradients")
        .at_stages(0b1110)
        .noted_if("false", "false has no effect: gradients always live in one flat buffer (the rank's shard at "
                           "stages 2 and 3), reduced bucket by bucket"),
    key<&zero_optimization_config::overlap_comm>("overlap_comm").by_hand(read_overlap_comm),
    key<&zero_optimization_config::reduce_scatter>("reduce_scatter")
        .at_stages(0b1100)
        .noted_if("false", "false has no effect: stages 2 and 3 always reduce-scatter gradients into each rank's "
                           "shard (an all-reduce would hold gradients for the whole model)"),
    key<&zero_optimization_config::reduce_bucket_size>("reduce_bucket_size").at_least(0).on_auto(auto_hidden_squared),
    key<&zero_optimization_config::allgather_partitions>("allgather_partitions")
        .at_stages(0b0110)
        .noted_if("false", "false has no effect: updated shards are always all-gathered, never broadcast rank by rank"),
    key<&zero_optimization_config::allgather_bucket_size>("allgather_bucket_size")
        .at_least(0)
        .or_null()
        .at_stages(0b0110)
        .by_hand(read_allgather_bucket_size),
    // read_offload reads both offload blocks and their deprecated boolean forms (cpu_offload...).
    hand<zero_optimization_config>("offload_optimizer").by_hand(read_offload),
    hand<zero_optimization_config>("offload_param"),
    // DeepSpeed's ZenFlow: a block, read by read_zenflow into the fields of zenflow_keys.
    hand<zero_optimization_config>("zenflow").by_hand(read_zenflow),
    key<&zero_optimization_config::sub_group_size>("sub_group_size")
        .at_least(0)
        .at_stages(0b1000)
        .noted_if("", "no effect: the optimizer steps the rank's shard one segment at a time (a reduce bucket, "
                      "or a module at stage 3) whatever this says"),
    key<&zero_optimization_config::stage3_max_live_parameters>("stage3_max_live_parameters")
        .at_least(0)
        .at_stages(0b1000),
    key<&zero_optimization_config::stage3_max_reuse_distance>("stage3_max_reuse_distance")
        .at_least(0)
        .at_stages(0b1000),
    key<&zero_optimization_config::stage3_prefetch_bucket_size>("stage3_prefetch_bucket_size")
        .at_least(0)
        .on_auto(auto_prefetch_bucket)
        .at_stages(0b1000),
    key<&zero_optimization_config::stage3_param_persistence_threshold>("stage3_param_persistence_threshold")
        .at_least(0)
        .on_auto(auto_persistence)
        .at_stages(0b1000),
    key<&zero_optimization_config::stage3_keep_param_shard>("stage3_keep_param_shard").at_stages(0b1000),
    key<&zero_optimization_config::zero_hpz_partition_size>("zero_hpz_partition_size").at_least(1).at_stages(0b1000),
    key<&zero_optimization_config::mics_shard_size>("mics_shard_size").at_least(std::int64_t{-1}).at_stages(0b1110),
    key<&zero_optimization_config::zero_quantized_weights>("zero_quantized_weights").at_stages(0b1000),
    key<&zero_optimization_config::zero_quantized_gradients>("zero_quantized_gradients").at_stages(0b1100),
    key<&zero_optimization_config::zero_quantized_gradients_bits>("zero_quantized_gradients_bits")
        .range(std::int64_t{4}, std::int64_t{8})
        .at_stages(0b1100),
    key<&zero_optimization_config::zero_quantized_gradients_node_size>("zero_quantized_gradients_node_size")
        .at_least(1)
        .or_null()
        .at_stages(0b1100),
    key<&zero_optimization_config::zero_quantization_block_size>("zero_quantization_block_size")
        .range(std::int64_t{2}, std::int64_t{1} << 30)
        .at_stages(0b1100),
    key<&zero_optimization_config::stage3_gather_16bit_weights_on_model_save>(
        "stage3_gather_16bit_weights_on_model_save")
        .at_stages(0b1000)
        .by_hand(read_gather_16bit_weights),
    key<&zero_optimization_config::round_robin_gradients>("round_robin_gradients")
        .at_stages(0b0110)
        .noted_if("true", "true has no effect: it spreads gradient copies to the CPU under optimizer offload over "
                          "the ranks; zero's offloaded optimizer copies each rank's own shard, range by range "
                          "(docs/offload.md)"),
    key<&zero_optimization_config::ignore_unused_parameters>("ignore_unused_parameters").at_stages(0b0110),
    // PyTorch-only switches of DeepSpeed's stage 3: zero has no nn.Linear or nn.Module to patch.
    checked<zero_optimization_config, bool>("memory_efficient_linear")
        .noted_if("", "no effect: a switch of DeepSpeed's PyTorch linear layer; the framework computes its own "
                      "layers"),
    checked<zero_optimization_config, bool>("override_module_apply")
        .noted_if("", "no effect: a switch of DeepSpeed's PyTorch nn.Module.apply override; the framework owns "
                      "its modules"),
    key<&zero_optimization_config::elastic_checkpoint>("elastic_checkpoint")
        .noted_if("false", "false has no effect: zero's checkpoints always load at any stage and any rank count "
                           "(docs/checkpoints.md)"),
    // DeepSpeed's field names of the stage3_ keys.
    alias<zero_optimization_config>("max_live_parameters", "stage3_max_live_parameters"),
    alias<zero_optimization_config>("max_reuse_distance", "stage3_max_reuse_distance"),
    alias<zero_optimization_config>("prefetch_bucket_size", "stage3_prefetch_bucket_size"),
    alias<zero_optimization_config>("param_persistence_threshold", "stage3_param_persistence_threshold"),
    alias<zero_optimization_config>("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"),
    alias<zero_optimization_config>("stage3_gather_fp16_weights_on_model_save",
                                    "stage3_gather_16bit_weights_on_model_save")
        .deprecated(),
    // Deprecated booleans that DeepSpeed turns into offload blocks (read_offload).
    hand<zero_optimization_config>("cpu_offload").deprecated(),
    hand<zero_optimization_config>("cpu_offload_param").deprecated(),
    hand<zero_optimization_config>("cpu_offload_use_pin_memory").deprecated(),
};

// ---- aio -----------------------------------------------------------------------------------------

inline constexpr key_row<aio_config> aio_keys[] = {
    key<&aio_config::block_size>("block_size").at_least(1),
    key<&aio_config::queue_depth>("queue_depth").at_least(1),
    key<&aio_config::thread_count>("thread_count").at_least(1),
    key<&aio_config::single_submit>("single_submit"),
    key<&aio_config::overlap_events>("overlap_events"),
    alias<aio_config>("intra_op_parallelism", "thread_count"), // newer DeepSpeed's name
};

// ---- model parallelism ---------------------------------------------------------------------------

// The framework runs its pipeline: these keys of DeepSpeed's pipeline engine are read and noted.
inline constexpr std::string_view framework_pipeline =
    "no effect: the framework places its layers on the stages and sends their activations and "
    "gradients; zero's engine of a stage holds the parameters registered there (docs/parallelism.md)";

inline constexpr key_row<pipeline_config> pipeline_keys[] = {
    // A number of stages, or "auto" (DeepSpeed's default): "auto" leaves it to the framework.
    key<&pipeline_config::stages>("stages").at_least(1).on_auto(auto_unset).written_by(write_pipeline_stages),
    checked<pipeline_config, std::string>("partition").noted_if("", framework_pipeline),
    checked<pipeline_config, bool>("seed_layers").noted_if("", framework_pipeline),
    checked<pipeline_config, bool>("pipe_partitioned").noted_if("", framework_pipeline),
    checked<pipeline_config, bool>("grad_partitioned").noted_if("", framework_pipeline),
};

inline constexpr key_row<tensor_parallel_config> tensor_parallel_keys[] = {
    key<&tensor_parallel_config::autotp_size>("autotp_size").at_least(0),
    checked<tensor_parallel_config, bool>("tp_overlap_comm")
        .noted_if("true", "true has no effect: the framework runs its tensor-parallel all-reduces"),
    checked<tensor_parallel_config, std::string>("dtype").noted_if(
        "", "no effect: the fp16 and bf16 blocks give the parameters' dtype (the framework converts its model)"),
};

// ---- activation checkpointing --------------------------------------------------------------------

inline constexpr key_row<activation_checkpointing_config> activation_checkpointing_keys[] = {
    key<&activation_checkpointing_config::cpu_checkpointing>("cpu_checkpointing")
        .noted_if("true", "true takes effect where the framework keeps its checkpoints in a zero::activation_store "
                          "sized by activation_store_options_from (docs/activations.md): the engine does not "
                          "checkpoint"),
    key<&activation_checkpointing_config::contiguous_memory_optimization>("contiguous_memory_optimization"),
    key<&activation_checkpointing_config::number_checkpoints>("number_checkpoints").at_least(1).or_null(),
    // true is a row of unimplemented_features; false is read.
    checked<activation_checkpointing_config, bool>("partition_activations"),
    checked<activation_checkpointing_config, bool>("synchronize_checkpoint_boundary")
        .noted_if("true", "true has no effect: zero's activation_store orders its copies by events, without "
                          "synchronizing the device"),
    checked<activation_checkpointing_config, bool>("profile").noted_if(
        "true", "true has no effect: zero does not time checkpoints (wall_clock_breakdown times the phases "
                "a framework names)"),
};

// ---- checkpoints ---------------------------------------------------------------------------------

inline void read_tag_validation(const key_read<config>&);

// DeepSpeed's checkpoint block: its default and no-op values are read and noted; the values that ask
// for what zero does not do are rows of unimplemented_features.
inline constexpr key_row<config> checkpoint_keys[] = {
    checked<config, std::string>("tag_validation")
        .by_hand(read_tag_validation)
        .noted_if("", "no effect: zero's save() writes the tag each rank is given and does not compare tags across "
                      "ranks (docs/checkpoints.md)"),
};

/// Calls `f.template operator()<Table>(path)` for every key table, with the JSON path of its block.
template <class F> constexpr void for_each_key_table(F&& f) {
  f.template operator()<top_keys>("");
  f.template operator()<fp16_keys>("fp16");
  f.template operator()<bf16_keys>("bf16");
  f.template operator()<data_types_keys>("data_types");
  f.template operator()<optimizer_keys>("optimizer");
  f.template operator()<optimizer_params_keys>("optimizer.params");
  f.template operator()<scheduler_keys>("scheduler");
  f.template operator()<scheduler_params_keys>("scheduler.params");
  f.template operator()<zero_optimization_keys>("zero_optimization");
  f.template operator()<offload_optimizer_keys>("zero_optimization.offload_optimizer");
  f.template operator()<delayed_update_keys>("zero_optimization.offload_optimizer.delayed_update");
  f.template operator()<offload_param_keys>("zero_optimization.offload_param");
  f.template operator()<zenflow_keys>("zero_optimization.zenflow");
  f.template operator()<aio_keys>("aio");
  f.template operator()<pipeline_keys>("pipeline");
  f.template operator()<tensor_parallel_keys>("tensor_parallel");
  f.template operator()<checkpoint_keys>("checkpoint");
  f.template operator()<activation_checkpointing_keys>("activation_checkpointing");
}

static_assert(
    [] {
      bool ok = true;
      for_each_key_table([&]<const auto & Table>(std::string_view) { ok = ok && well_formed(Table); });
      return ok;
    }(),
    "a key table names a key twice, or has an alias of no key of its table");

} // namespace detail

/// The keys of one JSON object in the config.
struct config_block {
  std::string_view path;                  ///< JSON path of the object; "" for the top level
  std::span<const std::string_view> keys; ///< keys zero reads there, aliases included
};

/// Every block zero reads and the keys it reads there, from the key tables above. `bfloat16` is
/// DeepSpeed's old name of `bf16`.
inline constexpr auto config_blocks = [] {
  std::array<config_block, 19> out{};
  std::size_t i = 0;
  detail::for_each_key_table([&]<const auto & Table>(std::string_view path) {
    out.at(i++) = {path, detail::key_names<Table>};
    if (path == "bf16") {
      out.at(i++) = {"bfloat16", detail::key_names<Table>};
    }
  });
  return i == out.size() ? out : throw "config_blocks: one block per key table, and bfloat16";
}();

} // namespace zero

#include "zero/config/detail/parse.hpp" // the reader and writer these rows drive
