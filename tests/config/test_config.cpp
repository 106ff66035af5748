// zero::config accepts the configs people run with DeepSpeed and Hugging Face, fills in DeepSpeed's
// defaults, folds DeepSpeed's aliases, resolves "auto" from the inputs, and writes itself back.

#include "support.hpp"
#include "zero/config/config.hpp"
#include "zero/config/schema.hpp"
#include "zero/config/unimplemented.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <fstream>
#include <sstream>
#include <string>

using zero::config;
using zero::dtype;
using zero::offload_device;
using zero_test::data;
using zero_test::has;

namespace {

bool has_note(const config& c, std::string_view needle) {
  for (const auto& n : c.notes) {
    if (n.find(needle) != std::string::npos) {
      return true;
    }
  }
  std::string all;
  for (const auto& n : c.notes) {
    all += "\n  " + n;
  }
  MESSAGE("no note with [" << needle << "]; notes:" << all);
  return false;
}

/// Reading back what to_json wrote gives the same config.
void check_round_trip(const config& c) {
  zero::config_inputs in;
  in.world_size = c.world_size;
  const config back = config::from_json(c.to_json(), in);
  CHECK(back.to_json() == c.to_json());
}

} // namespace

TEST_CASE("DeepSpeed's defaults, from its code, fill in everything a config leaves out") {
  const config c = config::from_string(R"({"train_micro_batch_size_per_gpu": 1})");
  CHECK(c.train_batch_size == 1);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.gradient_clipping == 0.0);
  CHECK_FALSE(c.steps_per_print.has_value()); // DeepSpeed's code: None (its docs say 10)
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.fp16.dynamic());
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.initial_scale() == 65536.0);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK_FALSE(c.fp16.consecutive_hysteresis);
  CHECK(c.fp16.min_loss_scale == 1.0);
  CHECK_FALSE(c.bf16.enabled);
  CHECK(c.param_dtype() == dtype::f32);
  CHECK(c.grad_accum_dtype == dtype::f32);
  CHECK(c.communication_data_type == dtype::f32);
  CHECK_FALSE(c.optimizer.has_value());
  CHECK_FALSE(c.scheduler.has_value());
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 0);
  CHECK(c.stage() == 0);
  CHECK(z.contiguous_gradients);
  CHECK_FALSE(z.overlap_comm); // DeepSpeed: true only at stage 3
  CHECK(z.reduce_scatter);
  CHECK(z.reduce_bucket_size == 500'000'000);
  CHECK(z.allgather_partitions);
  CHECK_FALSE(z.allgather_bucket_size); // unset: each bucket gathered alone, in place (config.hpp)
  CHECK(z.offload_optimizer.device == offload_device::none);
  CHECK_FALSE(z.offload_optimizer.pin_memory);
  CHECK(z.offload_optimizer.buffer_count == 4);
  CHECK(z.offload_optimizer.ratio == 1.0);
  CHECK(z.offload_param.device == offload_device::none);
  CHECK(z.offload_param.buffer_count == 5);
  CHECK(z.offload_param.buffer_size == 100'000'000);
  CHECK(z.offload_param.max_in_cpu == 1'000'000'000);
  CHECK(z.sub_group_size == 1'000'000'000); // DeepSpeed's code: 1e9 (its format string says 1e12)
  CHECK(z.stage3_max_live_parameters == 1'000'000'000);
  CHECK(z.stage3_max_reuse_distance == 1'000'000'000);
  CHECK(z.stage3_prefetch_bucket_size == 50'000'000);
  CHECK(z.stage3_param_persistence_threshold == 100'000);
  CHECK_FALSE(z.stage3_gather_16bit_weights_on_model_save);
  CHECK_FALSE(z.round_robin_gradients);
  CHECK(z.ignore_unused_parameters);
  CHECK_FALSE(z.elastic_checkpoint);
  CHECK(c.aio.block_size == 1'048'576);
  CHECK(c.aio.queue_depth == 8);
  CHECK(c.aio.thread_count == 1);
  CHECK_FALSE(c.aio.single_submit);
  CHECK(c.aio.overlap_events);
  CHECK(has_note(c, "no world size given"));
  check_round_trip(c);
}

TEST_CASE("overlap_comm defaults to true at stage 3, as DeepSpeed's validator sets it") {
  CHECK(config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})")
            .zero_optimization.overlap_comm);
  CHECK_FALSE(config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})")
                  .zero_optimization.overlap_comm);
  CHECK_FALSE(
      config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "overlap_comm": false}})")
          .zero_optimization.overlap_comm);
}

TEST_CASE("Hugging Face's tests/deepspeed/ds_config_zero2.json, every \"auto\" resolved from the Trainer's values") {
  const config c = config::from_file(data("hf_ds_config_zero2.json"), zero_test::hf_inputs());
  CHECK(c.world_size == 4);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.gradient_accumulation_steps == 2);
  CHECK(c.train_batch_size == 64); // 8 x 2 x 4
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.steps_per_print == 2000);
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.bf16.enabled);
  CHECK(c.param_dtype() == dtype::bf16);
  CHECK(c.grad_accum_dtype == dtype::bf16);
  CHECK(c.communication_data_type == dtype::bf16);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == zero::optimizer_type::adamw);
  CHECK(c.optimizer->lr == 3e-5);
  CHECK(c.optimizer->betas[0] == 0.9);
  CHECK(c.optimizer->betas[1] == 0.999);
  CHECK(c.optimizer->eps == 1e-8);
  CHECK(c.optimizer->weight_decay == 0.01);
  CHECK(c.optimizer->adam_w_mode);
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->type == zero::scheduler_type::warmup_lr);
  CHECK(c.scheduler->warmup_min_lr == 0.0); // Hugging Face fills "auto" with 0
  CHECK(c.scheduler->warmup_max_lr == 3e-5);
  CHECK(c.scheduler->warmup_num_steps == 100);
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 2);
  CHECK(z.offload_optimizer.device == offload_device::cpu);
  CHECK(z.offload_optimizer.pin_memory);
  CHECK(z.allgather_bucket_size == 200'000'000);
  CHECK(z.reduce_bucket_size == 200'000'000);
  CHECK(z.overlap_comm);
  CHECK(has_note(c, "fp16: loss-scale settings have no effect"));
  check_round_trip(c);
}

TEST_CASE("Hugging Face's tests/deepspeed/ds_config_zero3.json: 1e14, zeros, and the deprecated fp16 name") {
  zero::config_inputs in;
  in.world_size = 2;
  in.micro_batch_size = 4;
  const config c = config::from_file(data("hf_ds_config_zero3.json"), in);
  CHECK(c.train_batch_size == 8);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.fp16.enabled);
  CHECK(c.param_dtype() == dtype::f16);
  CHECK(c.communication_data_type == dtype::f16);
  const auto& z = c.zero_optimization;
  CHECK(z.stage == 3);
  CHECK(z.sub_group_size == 100'000'000'000'000); // 1e14
  CHECK(z.reduce_bucket_size == 0);
  CHECK(z.stage3_prefetch_bucket_size == 0);
  CHECK(z.stage3_param_persistence_threshold == 0);
  CHECK(z.stage3_max_live_parameters == 1'000'000'000);
  CHECK(z.stage3_gather_16bit_weights_on_model_save);
  CHECK(z.offload_param.device == offload_device::cpu);
  CHECK(z.offload_param.pin_memory);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->betas[0] == 0.8);
  CHECK(c.optimizer->weight_decay == 3e-7);
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->warmup_max_lr == 3e-5);
  CHECK(c.scheduler->warmup_num_steps == 500);
  CHECK(has_note(c, "stage3_gather_fp16_weights_on_model_save: deprecated; read as "
                    "stage3_gather_16bit_weights_on_model_save"));
  check_round_trip(c);
}

TEST_CASE("Hugging Face's documented ZeRO-3 config: hidden-size \"auto\" uses the Trainer's formulas") {
  const config c = config::from_file(data("hf_docs_zero3_auto.json"), zero_test::hf_inputs());
  const auto& z = c.zero_optimization;
  CHECK(z.reduce_bucket_size == 16'777'216);             // 4096 * 4096
  CHECK(z.stage3_prefetch_bucket_size == 15'099'494);    // floor(0.9 * 16777216 = 15099494.4)
  CHECK(z.stage3_param_persistence_threshold == 40'960); // 10 * 4096
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->type == zero::scheduler_type::warmup_decay_lr);
  CHECK(c.scheduler->total_num_steps == 1000);
  CHECK(c.scheduler->warmup_num_steps == 100);
  CHECK(c.scheduler->warmup_max_lr == 3e-5);
  CHECK(z.offload_optimizer.device == offload_device::cpu);
  CHECK(z.offload_param.device == offload_device::cpu);
  check_round_trip(c);
}

TEST_CASE("Hugging Face's documented ZeRO-Infinity config: the optimizer state and the parameters on NVMe") {
  const config c = config::from_file(data("hf_docs_zero3_nvme.json"), zero_test::hf_inputs());
  const auto& z = c.zero_optimization;
  CHECK(z.offload_optimizer.device == zero::offload_device::nvme);
  CHECK(z.offload_param.device == zero::offload_device::nvme);
  CHECK(z.offload_param.nvme_path == "/local_nvme");
  CHECK(z.offload_param.buffer_count == 5);
  CHECK(z.offload_param.buffer_size == 100'000'000);
  CHECK(z.offload_param.max_in_cpu == 1'000'000'000);
  CHECK(c.aio.block_size == 262144);
}

TEST_CASE("DeepSpeed's documented first example: the boolean zero_optimization and Adam's AdamW default") {
  const config c = config::from_file(data("ds_docs_basic.json"));
  CHECK(c.world_size == 1);
  CHECK(c.train_batch_size == 8);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.stage() == 1);
  CHECK(c.fp16.enabled);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == zero::optimizer_type::adam);
  CHECK(c.optimizer->lr == 0.00015);
  CHECK(c.optimizer->adam_w_mode); // DeepSpeed runs AdamW for "Adam" unless adam_w_mode is false
  CHECK(c.optimizer->weight_decay == 0.0);
  CHECK(has_note(c, "zero_optimization: deprecated boolean form; read as stage 1"));
  zero::config_inputs two;
  two.world_size = 2;
  CHECK(config::from_file(data("ds_docs_basic.json"), two).train_micro_batch_size_per_gpu == 4);
  check_round_trip(c);
}

TEST_CASE("DeepSpeed's ZeRO-Offload and ZeRO-3 tutorial configs") {
  zero::config_inputs in;
  in.world_size = 2;
  SUBCASE("ZeRO-Offload: stage 2, optimizer on the CPU") {
    const config c = config::from_file(data("ds_tutorial_zero_offload.json"), in);
    CHECK(c.train_batch_size == 10);
    CHECK(c.train_micro_batch_size_per_gpu == 5); // 10 / (1 x 2)
    CHECK(c.stage() == 2);
    CHECK(c.zero_optimization.offload_optimizer.device == offload_device::cpu);
    CHECK_FALSE(c.zero_optimization.offload_optimizer.pin_memory);
    CHECK(c.wall_clock_breakdown);
    CHECK(c.steps_per_print == 1);
    CHECK(c.gradient_clipping == 1.0);
    CHECK(c.optimizer->type == zero::optimizer_type::adam);
    CHECK(c.optimizer->adam_w_mode);
    check_round_trip(c);
  }
  SUBCASE("ZeRO-3 with CPU offload of parameters and optimizer") {
    const config c = config::from_file(data("ds_tutorial_zero3.json"), in);
    CHECK(c.train_batch_size == 64); // 4 x 8 x 2
    CHECK(c.zero_optimization.stage3_prefetch_bucket_size == 10'000'000);
    CHECK(c.zero_optimization.stage3_param_persistence_threshold == 100'000);
    CHECK(c.zero_optimization.reduce_bucket_size == 10'000'000);
    CHECK(c.zero_optimization.overlap_comm); // stage 3 default
    CHECK(c.zero_optimization.offload_param.device == offload_device::cpu);
    CHECK(c.scheduler->warmup_max_lr == 0.001);
    CHECK(has_note(c, "aio: no effect without NVMe offload"));
    check_round_trip(c);
  }
}

TEST_CASE("LLaMA-Factory's ds_z0_config.json: stage-1/2 keys at stage 0 are accepted and noted") {
  zero::config_inputs in = zero_test::hf_inputs();
  const config c = config::from_file(data("llama_factory_ds_z0.json"), in);
  CHECK(c.stage() == 0);
  CHECK(c.zero_optimization.overlap_comm);
  CHECK(c.zero_optimization.round_robin_gradients);
  CHECK(c.grad_accum_dtype == dtype::f32); // DeepSpeed: bf16 without ZeRO accumulates in fp32
  CHECK(has_note(c, "zero_optimization.round_robin_gradients: no effect at stage 0 (used at stage 1, 2)"));
  CHECK(has_note(c, "zero_optimization.allgather_bucket_size: no effect at stage 0"));
  CHECK(has_note(c, "zero_optimization.reduce_scatter: no effect at stage 0 (used at stage 2, 3)"));
  CHECK(has_note(c, "zero_allow_untested_optimizer: no effect"));
  check_round_trip(c);
}

TEST_CASE("axolotl's zero3_bf16.json: zeros, initial_scale_power 32 and auto_cast false") {
  zero::config_inputs in = zero_test::hf_inputs();
  const config c = config::from_file(data("axolotl_zero3_bf16.json"), in);
  CHECK(c.bf16.enabled);
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.fp16.initial_scale_power == 32);
  CHECK(c.zero_optimization.sub_group_size == 0);
  CHECK(c.zero_optimization.stage3_max_live_parameters == 0);
  CHECK(c.zero_optimization.stage3_max_reuse_distance == 0);
  CHECK(c.zero_optimization.reduce_bucket_size == 4096 * 4096);
  check_round_trip(c);
}

TEST_CASE("MedicalGPT's zero3 config: \"auto\" for gather_16bit is resolved from the inputs") {
  zero::config_inputs in = zero_test::hf_inputs();
  in.precision = dtype::f16;
  in.gather_16bit_weights_on_model_save = true;
  const config c = config::from_file(data("medicalgpt_zero3.json"), in);
  CHECK(c.zero_optimization.stage3_gather_16bit_weights_on_model_save);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->lr == 3e-5);
  CHECK(c.optimizer->betas[1] == 0.999); // absent in the file: the input
  check_round_trip(c);
}

TEST_CASE("a hand-written DeepSpeed config: comments, old names, case-insensitive names, switched-off blocks") {
  zero::config_inputs in;
  in.world_size = 4;
  const config c = config::from_file(data("ds_zero2_offload_commented.json"), in);
  CHECK(c.train_batch_size == 64);
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 4); // 64 / (4 x 4)
  CHECK(c.bf16.enabled);
  CHECK(c.grad_accum_dtype == dtype::f32);
  CHECK(c.communication_data_type == dtype::f32);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == zero::optimizer_type::adamw);
  CHECK(c.optimizer->betas[1] == 0.95);
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->type == zero::scheduler_type::warmup_cosine_lr);
  CHECK(c.scheduler->total_num_steps == 10000);
  CHECK(c.scheduler->warmup_min_ratio == 0.01);
  CHECK(c.scheduler->cos_min_ratio == 0.1);
  CHECK(c.scheduler->warmup_type == zero::warmup_curve::linear);
  CHECK(c.zero_optimization.offload_optimizer.device == offload_device::cpu);
  CHECK(c.zero_optimization.offload_optimizer.pin_memory); // from cpu_offload_use_pin_memory
  CHECK(has_note(c, "bfloat16: DeepSpeed's old name; read as bf16"));
  CHECK(has_note(c, "zero_optimization.cpu_offload: deprecated; read as offload_optimizer.device = \"cpu\""));
  check_round_trip(c);
}

TEST_CASE("DeepSpeed's documented OneCycle and LRRangeTest schedules (its one-cycle and lrrt tutorials)") {
  const config one =
      config::from_string(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
      "scheduler": {"type": "OneCycle", "params": {"cycle_first_step_size": 1000, "cycle_first_stair_count": 500,
        "cycle_second_step_size": 1000, "cycle_second_stair_count": 500, "decay_step_size": 1000,
        "cycle_min_lr": 0.0001, "cycle_max_lr": 0.0010, "decay_lr_rate": 0.001, "cycle_min_mom": 0.85,
        "cycle_max_mom": 0.99, "decay_mom_rate": 0.0}}})");
  REQUIRE(one.scheduler);
  const auto& s = *one.scheduler;
  CHECK(s.type == zero::scheduler_type::one_cycle);
  CHECK(s.cycle_first_step_size == 1000);
  CHECK(s.cycle_second_step_size == 1000);
  CHECK(s.cycle_first_stair_count == 500);
  CHECK(s.cycle_second_stair_count == 500);
  CHECK(s.decay_step_size == 1000);
  CHECK(s.cycle_min_lr == 0.0001);
  CHECK(s.cycle_max_lr == 0.001);
  CHECK(s.decay_lr_rate == 0.001);
  CHECK(s.cycle_min_mom == 0.85);
  CHECK(s.cycle_max_mom == 0.99);
  CHECK(s.cycle_momentum); // DeepSpeed's default
  CHECK(has_note(one, "scheduler.params.cycle_momentum: true: Adam's beta1 cycles between 0.99 and 0.85 and beta2 "
                      "is 0.99, in place of optimizer.params.betas"));
  check_round_trip(one);

  const config defaults = config::from_string(
      R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1,
          "cycle_second_step_size": null, "cycle_momentum": false}}})");
  CHECK(defaults.scheduler->cycle_first_step_size == 2000);
  CHECK_FALSE(defaults.scheduler->cycle_second_step_size); // null: the first half's
  CHECK_FALSE(defaults.scheduler->cycle_second_stair_count);
  CHECK(defaults.scheduler->cycle_min_mom == 0.8);
  check_round_trip(defaults);

  const config range = config::from_string(R"({"train_batch_size": 8, "scheduler": {"type": "LRRangeTest", "params": {
      "lr_range_test_min_lr": 0.0001, "lr_range_test_step_size": 200, "lr_range_test_step_rate": 5,
      "lr_range_test_staircase": false}}})");
  REQUIRE(range.scheduler);
  CHECK(range.scheduler->type == zero::scheduler_type::lr_range_test);
  CHECK(range.scheduler->lr_range_test_min_lr == 0.0001);
  CHECK(range.scheduler->lr_range_test_step_size == 200);
  CHECK(range.scheduler->lr_range_test_step_rate == 5);
  CHECK_FALSE(range.scheduler->lr_range_test_staircase);
  check_round_trip(range);
}

TEST_CASE("integers written as 5e8, 1e14 or 2.0 are integers") {
  const config c = config::from_string(R"({"train_batch_size": 1.6e1, "gradient_accumulation_steps": 2.0,
      "zero_optimization": {"stage": 3.0, "reduce_bucket_size": 5e8, "sub_group_size": 1e14,
                            "stage3_max_live_parameters": 9.007199254740992e15}})");
  CHECK(c.train_batch_size == 16);
  CHECK(c.gradient_accumulation_steps == 2);
  CHECK(c.train_micro_batch_size_per_gpu == 8);
  CHECK(c.stage() == 3);
  CHECK(c.zero_optimization.reduce_bucket_size == 500'000'000);
  CHECK(c.zero_optimization.sub_group_size == 100'000'000'000'000);
  CHECK(c.zero_optimization.stage3_max_live_parameters == 9'007'199'254'740'992);
}

TEST_CASE("the batch rule: train = micro x accumulation x world, any one derived from the other two") {
  using zero::batch_spec;
  using zero::resolve_batch;
  auto spec = [](std::optional<std::int64_t> t, std::optional<std::int64_t> m, std::optional<std::int64_t> g) {
    batch_spec b;
    b.train_batch_size = t;
    b.train_micro_batch_size_per_gpu = m;
    b.gradient_accumulation_steps = g;
    return b;
  };
  SUBCASE("all three agree") {
    const auto b = resolve_batch(spec(64, 4, 2), 8);
    CHECK(b.train_batch_size == 64);
  }
  SUBCASE("accumulation derived") { CHECK(resolve_batch(spec(64, 4, {}), 4).gradient_accumulation_steps == 4); }
  SUBCASE("micro derived") { CHECK(resolve_batch(spec(64, {}, 2), 4).train_micro_batch_size_per_gpu == 8); }
  SUBCASE("train derived") { CHECK(resolve_batch(spec({}, 3, 5), 7).train_batch_size == 105); }
  SUBCASE("only train: accumulation 1, as DeepSpeed") {
    const auto b = resolve_batch(spec(32, {}, {}), 4);
    CHECK(b.train_micro_batch_size_per_gpu == 8);
    CHECK(b.gradient_accumulation_steps == 1);
  }
  SUBCASE("only micro: accumulation 1, as DeepSpeed") {
    const auto b = resolve_batch(spec({}, 3, {}), 4);
    CHECK(b.train_batch_size == 12);
    CHECK(b.gradient_accumulation_steps == 1);
  }
  SUBCASE("a config's batch keys re-resolved for another world size") {
    const config c = config::from_string(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})");
    CHECK(c.gradient_accumulation_steps == 16);
    const config c8 = c.rebatched(8);
    CHECK(c8.world_size == 8);
    CHECK(c8.gradient_accumulation_steps == 2);
    CHECK_THROWS_AS(static_cast<void>(c.rebatched(3)), zero::config_error);
  }
}

TEST_CASE("gradient accumulation dtype and communication dtype resolve as DeepSpeed's engine does") {
  auto read = [](std::string_view text) { return config::from_string(text); };
  CHECK(read(R"({"train_batch_size": 1, "bf16": {"enabled": true}})").grad_accum_dtype == dtype::f32);
  CHECK(read(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}})")
            .grad_accum_dtype == dtype::bf16);
  CHECK(read(R"({"train_batch_size": 1, "fp16": {"enabled": true}})").grad_accum_dtype == dtype::f16);
  CHECK(read(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
                 "data_types": {"grad_accum_dtype": "fp32"}})")
            .grad_accum_dtype == dtype::f32);
  CHECK(
      read(
          R"({"train_batch_size": 1, "bf16": {"enabled": true}, "data_types": {"grad_accum_dtype": "torch.bfloat16"}})")
          .grad_accum_dtype == dtype::bf16);
  CHECK(read(R"({"train_batch_size": 1, "fp16": {"enabled": true}})").communication_data_type == dtype::f16);
  CHECK(read(R"({"train_batch_size": 1, "fp16": {"enabled": true}, "communication_data_type": "fp16"})")
            .communication_data_type == dtype::f16);
  CHECK(read(R"({"train_batch_size": 1, "data_types": null, "communication_data_type": null})").grad_accum_dtype ==
        dtype::f32);
}

TEST_CASE("Adam and AdamW: DeepSpeed's adam_w_mode rule and PyTorch's defaults with torch_adam") {
  auto opt = [](std::string_view o) {
    return *config::from_string(std::string(R"({"train_batch_size": 1, "optimizer": )") + std::string(o) + "}")
                .optimizer;
  };
  CHECK(opt(R"({"type": "Adam"})").adam_w_mode);
  CHECK_FALSE(opt(R"({"type": "Adam", "params": {"adam_w_mode": false}})").adam_w_mode);
  CHECK(opt(R"({"type": "ADAMW"})").type == zero::optimizer_type::adamw);
  CHECK(opt(R"({"type": "AdamW", "params": {"torch_adam": true}})").weight_decay == 0.01);
  CHECK(opt(R"({"type": "Adam", "params": {"torch_adam": true, "adam_w_mode": false}})").weight_decay == 0.0);
  CHECK(opt(R"({"type": "AdamW"})").weight_decay == 0.0);
  CHECK_FALSE(opt(R"({"type": "AdamW", "params": {"bias_correction": false}})").bias_correction);
  const auto o = opt(R"({"type": "AdamW"})");
  CHECK(o.lr == 1e-3);
  CHECK(o.eps == 1e-8);
  CHECK(o.betas == std::array<double, 2>{0.9, 0.999});
}

TEST_CASE("scheduler defaults follow DeepSpeed's constructors") {
  auto sched = [](std::string_view s, std::string_view opt = "") {
    std::string text = R"({"train_batch_size": 1, "scheduler": )" + std::string(s);
    if (!opt.empty()) {
      text += R"(, "optimizer": )" + std::string(opt);
    }
    return *config::from_string(text + "}").scheduler;
  };
  const auto lr = sched(R"({"type": "WarmupLR"})");
  CHECK(lr.warmup_min_lr == 0.0);
  CHECK_FALSE(lr.warmup_max_lr.has_value()); // the framework optimizer's lr, as DeepSpeed
  CHECK(lr.warmup_num_steps == 1000);
  CHECK(lr.warmup_type == zero::warmup_curve::log);
  CHECK(lr.last_batch_iteration == -1);
  CHECK(sched(R"({"type": "WarmupLR"})", R"({"type": "AdamW", "params": {"lr": 0.02}})").warmup_max_lr == 0.02);
  CHECK(sched(R"({"type": "WarmupDecayLR", "params": {"total_num_steps": 10}})").warmup_max_lr == 0.001);
  const auto cosine = sched(R"({"type": "WarmupCosineLR", "params": {"total_num_steps": 10}})");
  CHECK(cosine.warmup_min_ratio == 0.0);
  CHECK(cosine.cos_min_ratio == 1e-4);
  CHECK(cosine.warmup_num_steps == 1000);
  CHECK(
      sched(R"({"type": "WarmupLR", "params": {"warmup_max_lr": null}})", R"({"type": "Adam", "params": {"lr": 0.5}})")
          .warmup_max_lr == 0.5);
}

TEST_CASE("deprecated aliases DeepSpeed still accepts") {
  SUBCASE("cpu_offload_param and cpu_offload_use_pin_memory") {
    const config c = config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
        "cpu_offload": true, "cpu_offload_param": true, "cpu_offload_use_pin_memory": true}})");
    CHECK(c.zero_optimization.offload_optimizer.device == offload_device::cpu);
    CHECK(c.zero_optimization.offload_param.device == offload_device::cpu);
    CHECK(c.zero_optimization.offload_param.pin_memory);
    CHECK(has_note(c, "cpu_offload_param: deprecated"));
  }
  SUBCASE("cpu_offload false") {
    const config c = config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"cpu_offload": false}})");
    CHECK(c.zero_optimization.offload_optimizer.device == offload_device::none);
    CHECK(has_note(c, "deprecated; false has no effect"));
  }
  SUBCASE("DeepSpeed's field names of the stage3_ keys") {
    const config c = config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
        "max_live_parameters": 7, "max_reuse_distance": 8, "prefetch_bucket_size": 9,
        "param_persistence_threshold": 10, "gather_16bit_weights_on_model_save": true}})");
    const auto& z = c.zero_optimization;
    CHECK(z.stage3_max_live_parameters == 7);
    CHECK(z.stage3_max_reuse_distance == 8);
    CHECK(z.stage3_prefetch_bucket_size == 9);
    CHECK(z.stage3_param_persistence_threshold == 10);
    CHECK(z.stage3_gather_16bit_weights_on_model_save);
    CHECK(has_note(c, "zero_optimization.prefetch_bucket_size: read as zero_optimization.stage3_prefetch_bucket_size"));
  }
  SUBCASE("both names, same value") {
    CHECK(config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
        "stage3_max_live_parameters": 7, "max_live_parameters": 7}})")
              .zero_optimization.stage3_max_live_parameters == 7);
  }
  SUBCASE("allgather_size with the boolean zero_optimization") {
    const config c =
        config::from_string(R"({"train_batch_size": 1, "zero_optimization": true, "allgather_size": 2e8})");
    CHECK(c.zero_optimization.allgather_bucket_size == 200'000'000);
  }
  SUBCASE("aio's newer intra_op_parallelism") {
    const config c = config::from_string(R"({"train_batch_size": 1, "aio": {"intra_op_parallelism": 4}})");
    CHECK(c.aio.thread_count == 4);
    CHECK(has_note(c, "aio: no effect without NVMe offload"));
  }
}

TEST_CASE("DeepSpeed keys zero does not implement are accepted when they ask for nothing") {
  const config c = config::from_string(R"({"train_batch_size": 2,
      "amp": {"enabled": "auto", "opt_level": "auto"},
      "fp16": {"enabled": true, "auto_cast": false, "fp16_master_weights_and_grads": false},
      "wandb": {"enabled": false, "project": "x"},
      "comms_logger": {"enabled": false},
      "checkpoint": {"use_node_local_storage": false},
      "prescale_gradients": false, "gradient_predivide_factor": 1.0, "sparse_gradients": false,
      "dump_state": false, "memory_breakdown": false, "vocabulary_size": null,
      "data_types": {"param_dtype": null},
      "optimizer": {"type": "AdamW", "legacy_fusion": false, "params": {"amsgrad": false}},
      "zero_optimization": {"stage": 3, "load_from_fp32_weights": true, "zero_hpz_partition_size": 1,
                            "mics_shard_size": -1, "zero_quantized_weights": false, "memory_efficient_linear": true,
                            "stage3_model_persistence_threshold": 9223372036854775807,
                            "offload_optimizer": {"device": "cpu", "ratio": 1.0, "fast_init": false}},
      "aio": {"use_gds": false}})");
  CHECK(c.fp16.enabled);
  CHECK(c.stage() == 3);
}

TEST_CASE("outside values: an absent key takes the input, a concrete value equal to it is fine") {
  zero::config_inputs in;
  in.max_grad_norm = 0.5;
  in.lr = 0.25;
  in.micro_batch_size = 2;
  in.world_size = 3;
  const config c = config::from_string(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.25}},
                                          "scheduler": {"type": "WarmupLR"}})",
                                       in);
  CHECK(c.gradient_clipping == 0.5);
  CHECK(c.optimizer->lr == 0.25);
  CHECK(c.scheduler->warmup_max_lr == 0.25);
  CHECK(c.train_batch_size == 6);
  in.precision = dtype::f16;
  CHECK(config::from_string("{}", in).fp16.enabled);
  in.precision = dtype::f32;
  CHECK(config::from_string("{}", in).param_dtype() == dtype::f32);
}

TEST_CASE("to_json writes every key under DeepSpeed's names") {
  const config c = config::from_file(data("hf_docs_zero3_auto.json"), zero_test::hf_inputs());
  const auto j = c.to_json();
  for (std::string_view key :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "steps_per_print", "wall_clock_breakdown", "fp16", "bf16", "data_types", "communication_data_type", "optimizer",
        "scheduler", "zero_optimization", "aio"}) {
    CHECK_MESSAGE(j.contains(std::string(key)), key);
  }
  // Every key with a member, from the key tables.
  const auto all_written = [](const auto& table, const nlohmann::json& block, std::string_view path) {
    for (const auto& row : table) {
      if (row.write != nullptr) {
        CHECK_MESSAGE(block.contains(std::string(row.name)), path << "." << row.name);
      }
    }
  };
  zero::detail::for_each_key_table([&]<const auto & Table>(std::string_view path) {
    std::string pointer = "/" + std::string(path);
    std::replace(pointer.begin(), pointer.end(), '.', '/');
    if (path == "scheduler.params") { // only the parameters of the schedule in force
      for (std::string_view key : zero::detail::schedule_params(c.scheduler->type)) {
        CHECK_MESSAGE(j["scheduler"]["params"].contains(std::string(key)), key);
      }
    } else if (path == "optimizer.params") { // only the parameters of the optimizer type in force
      const auto theirs = zero::detail::optimizer_params(c.optimizer->type);
      for (const auto& row : Table) {
        const bool its_own = std::find(theirs.begin(), theirs.end(), row.name) != theirs.end();
        CHECK_MESSAGE(j["optimizer"]["params"].contains(std::string(row.name)) == (its_own && row.write != nullptr),
                      row.name);
      }
    } else if (path == "zero_optimization.offload_optimizer.delayed_update") {
      // Written only when given (its presence turns the delayed update on): test_config_check.cpp.
      CHECK_FALSE(j["zero_optimization"]["offload_optimizer"].contains("delayed_update"));
    } else if (path == "zero_optimization.zenflow") {
      // Written only when given (its presence turns ZenFlow on): test_config_zenflow.cpp.
      CHECK_FALSE(j["zero_optimization"].contains("zenflow"));
    } else if (const nlohmann::json::json_pointer at(pointer); !path.empty() && !j.contains(at)) {
      // A block to_json leaves out (checkpoint: its keys are checked and kept nowhere) has no key to write.
      for (const auto& row : Table) {
        const bool writes = row.write != nullptr;
        CHECK_MESSAGE(!writes, path << "." << row.name << " is not written");
      }
    } else {
      all_written(Table, path.empty() ? j : j[at], path);
    }
  });
  CHECK(j["zero_optimization"]["offload_param"]["device"] == "cpu");
  CHECK(j["data_types"]["grad_accum_dtype"] == "bf16");
}

TEST_CASE("the check every key table passes to compile: names once, aliases of a key, what the typed read folds") {
  namespace d = zero::detail;
  using aio = zero::aio_config;
  using opt = zero::optimizer_config;
  static constexpr d::key_row<aio> good[] = {d::key<&aio::thread_count>("thread_count").at_least(1),
                                             d::alias<aio>("intra_op_parallelism", "thread_count")};
  static constexpr d::key_row<aio> twice[] = {d::key<&aio::queue_depth>("queue_depth"),
                                              d::key<&aio::block_size>("queue_depth")};
  static constexpr d::key_row<aio> dangling[] = {d::key<&aio::queue_depth>("queue_depth"),
                                                 d::alias<aio>("depth", "queue_dept")};
  static constexpr d::key_row<aio> alias_of_alias[] = {
      d::key<&aio::queue_depth>("queue_depth"), d::alias<aio>("depth", "queue_depth"), d::alias<aio>("qd", "depth")};
  // The typed read folds one alias, and an input is merged under the key's own name only: a key
  // with more goes by hand.
  static constexpr d::key_row<aio> two_aliases[] = {d::key<&aio::queue_depth>("queue_depth"),
                                                    d::alias<aio>("depth", "queue_depth"),
                                                    d::alias<aio>("qd", "queue_depth")};
  static constexpr d::key_row<opt> alias_and_input[] = {
      d::key<&opt::lr>("lr").from_input<&zero::config_inputs::lr>("config_inputs::lr", "the learning rate"),
      d::alias<opt>("learning_rate", "lr")};
  static_assert(d::well_formed(good));
  static_assert(!d::well_formed(twice));
  static_assert(!d::well_formed(dangling));
  static_assert(!d::well_formed(alias_of_alias));
  static_assert(!d::well_formed(two_aliases));
  static_assert(!d::well_formed(alias_and_input));
  static_assert(d::key_names<good>[1] == "intra_op_parallelism");
  CHECK(zero::config_blocks.size() == 19); // every table, and bf16's once more as bfloat16
}

TEST_CASE("docs/config.md documents every key zero reads and every key it refuses") {
  std::ifstream f(ZERO_CONFIG_DOCS);
  REQUIRE_MESSAGE(f.good(), "cannot open " ZERO_CONFIG_DOCS);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  for (const zero::config_block& b : zero::config_blocks) {
    for (std::string_view k : b.keys) {
      std::string path = "`";
      path += zero::detail::join_path(b.path, k);
      path += '`';
      CHECK_MESSAGE(doc.find(path) != std::string::npos, "docs/config.md lacks " << path);
    }
  }
  for (const zero::unimplemented_feature& f2 : zero::unimplemented_features) {
    std::string path = "`";
    path += f2.path;
    path += '`';
    CHECK_MESSAGE(doc.find(path) != std::string::npos, "docs/config.md lacks " << path);
  }
  // Each alias row's line says what it is an alias of, each deprecated name's line says so.
  const auto line_of = [&](std::string_view block, std::string_view key) {
    const std::string start = "| `" + zero::detail::join_path(block, key) + "` |";
    const auto at = doc.find(start);
    return at == std::string::npos ? std::string() : doc.substr(at, doc.find('\n', at) - at);
  };
  const auto documented = [&](const auto& table, std::string_view block) {
    for (const auto& row : table) {
      const std::string line = line_of(block, row.name);
      CAPTURE(line);
      if (!row.alias_of.empty()) {
        // The key it is an alias of, by its path or by its name in the same block.
        const std::string path = "alias of `" + zero::detail::join_path(block, row.alias_of) + "`";
        const std::string name = "alias of `" + std::string(row.alias_of) + "`";
        CHECK((line.find(path) != std::string::npos || line.find(name) != std::string::npos));
      }
      if (row.is_deprecated) {
        CHECK(line.find("deprecated") != std::string::npos);
      }
    }
  };
  zero::detail::for_each_key_table([&]<const auto & Table>(std::string_view path) { documented(Table, path); });
}

namespace {
/// The note about `key` in `c.notes`, or empty.
std::string note_of(const config& c, std::string_view key) {
  for (const std::string& n : c.notes) {
    if (n.rfind(std::string("zero_optimization.") + std::string(key) + ":", 0) == 0) {
      return n;
    }
  }
  return {};
}
} // namespace

TEST_CASE("elastic_checkpoint is accepted at every stage: zero's checkpoints always reshard") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const config on = config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                                          std::to_string(stage) + R"(, "elastic_checkpoint": true}})");
    CHECK(on.zero_optimization.elastic_checkpoint);
    CHECK(note_of(on, "elastic_checkpoint").empty()); // true is what zero does
    CHECK(on.to_json()["zero_optimization"]["elastic_checkpoint"] == true);
    const config off = config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                                           std::to_string(stage) + R"(, "elastic_checkpoint": false}})");
    CHECK(has(note_of(off, "elastic_checkpoint"),
              "false has no effect: zero's checkpoints always load at any stage and any rank count"));
  }
}

TEST_CASE("keys accepted without effect get a note saying what zero does instead") {
  const auto read = [](int stage, const std::string& key, const std::string& value) {
    return config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" + std::to_string(stage) +
                               ", \"" + key + "\": " + value + "}}");
  };
  CHECK(has(note_of(read(2, "reduce_scatter", "false"), "reduce_scatter"),
            "false has no effect: stages 2 and 3 always reduce-scatter gradients"));
  CHECK(has(note_of(read(3, "reduce_scatter", "false"), "reduce_scatter"), "false has no effect"));
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    CHECK(has(note_of(read(stage, "contiguous_gradients", "false"), "contiguous_gradients"),
              "false has no effect: gradients always live in one flat buffer"));
  }
  CHECK(has(note_of(read(1, "allgather_partitions", "false"), "allgather_partitions"),
            "false has no effect: updated shards are always all-gathered"));
  CHECK(has(note_of(read(2, "round_robin_gradients", "true"), "round_robin_gradients"),
            "true has no effect: it spreads gradient copies to the CPU under optimizer offload over the ranks; "
            "zero's offloaded optimizer copies each rank's own shard"));
  CHECK(has(note_of(read(3, "sub_group_size", "1e9"), "sub_group_size"),
            "no effect: the optimizer steps the rank's shard one segment at a time"));
  // DeepSpeed's defaults act as zero does: no note.
  CHECK(note_of(read(2, "reduce_scatter", "true"), "reduce_scatter").empty());
  CHECK(note_of(read(2, "contiguous_gradients", "true"), "contiguous_gradients").empty());
  CHECK(note_of(read(2, "allgather_partitions", "true"), "allgather_partitions").empty());
  CHECK(note_of(read(2, "round_robin_gradients", "false"), "round_robin_gradients").empty());
  // At a stage where DeepSpeed ignores the key too, the stage note stands alone.
  CHECK(
      has(note_of(read(0, "reduce_scatter", "false"), "reduce_scatter"), "no effect at stage 0 (used at stage 2, 3)"));
}

TEST_CASE("offload_optimizer.ratio: a share in [0, 1] or \"auto\", written back as read; noted where it differs") {
  const auto read = [](int stage, const std::string& device, const std::string& ratio) {
    return config::from_string(R"({"train_batch_size": 8, "zero_optimization": {"stage": )" + std::to_string(stage) +
                               R"(, "offload_optimizer": {"device": ")" + device + R"(", "ratio": )" + ratio + "}}}");
  };
  const config partial = read(3, "cpu", "0.3");
  CHECK(partial.zero_optimization.offload_optimizer.ratio == 0.3);
  CHECK_FALSE(partial.zero_optimization.offload_optimizer.ratio_auto);
  CHECK(partial.to_json()["zero_optimization"]["offload_optimizer"]["ratio"] == 0.3);
  CHECK(read(3, "cpu", "0").zero_optimization.offload_optimizer.ratio == 0.0);
  const config chosen = read(3, "cpu", R"("auto")");
  CHECK(chosen.zero_optimization.offload_optimizer.ratio_auto);
  const auto j = chosen.to_json();
  CHECK(j["zero_optimization"]["offload_optimizer"]["ratio"] == "auto");
  // to_json reads back to the same settings.
  CHECK(config::from_string(j.dump()).zero_optimization.offload_optimizer ==
        chosen.zero_optimization.offload_optimizer);
  CHECK(note_of(chosen, "offload_optimizer.ratio").empty()); // stage 3: as DeepSpeed
  // DeepSpeed reads ratio at stage 3 only; zero splits at stages 1 and 2 as well, and says so.
  CHECK(has(note_of(read(2, "cpu", "0.5"), "offload_optimizer.ratio"),
            "DeepSpeed applies ratio at stage 3 only (at stage 2 it offloads all the optimizer state); zero splits "
            "the state at stages 1 and 2 too"));
  CHECK(note_of(read(2, "cpu", "1"), "offload_optimizer.ratio").empty());
  CHECK(has(note_of(read(2, "none", "0.5"), "offload_optimizer.ratio"), "no effect: device is none"));
  CHECK_THROWS_WITH_AS(read(3, "cpu", R"("half")"),
                       doctest::Contains("zero_optimization.offload_optimizer.ratio: found \"half\""),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(read(3, "cpu", "-0.1"),
                       doctest::Contains("zero_optimization.offload_optimizer.ratio: found -0.1; expected a number >= "
                                         "0 and <= 1"),
                       zero::config_error);
}

TEST_CASE("pipeline and tensor_parallel: the sizes are read, the framework's keys noted, AutoTP's sharding refused") {
  zero::config_inputs in;
  in.world_size = 2; // the data axis: 8 ranks as 2 stages x 2 data x 2 tensor slices
  // DeepSpeed's pipeline block with every key of its defaults, and AutoTP's training block.
  const config c = config::from_string(R"({"train_batch_size": 16, "gradient_accumulation_steps": 4,
      "pipeline": {"stages": 2, "partition": "parameters", "seed_layers": false, "activation_checkpoint_interval": 0,
                   "pipe_partitioned": true, "grad_partitioned": true},
      "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": true}})",
                                       in);
  CHECK(c.pipeline.stages == 2);
  CHECK(c.tensor_parallel.autotp_size == 2);
  CHECK(c.train_micro_batch_size_per_gpu == 2);
  for (std::string_view key :
       {"pipeline.partition", "pipeline.seed_layers", "pipeline.pipe_partitioned", "pipeline.grad_partitioned"}) {
    CHECK(has_note(c, std::string(key) + ": no effect: the framework places its layers on the stages"));
  }
  CHECK(has_note(c, "tensor_parallel.tp_overlap_comm: true has no effect: the framework runs its tensor-parallel"));
  check_round_trip(c);
  CHECK(c.to_json()["pipeline"] == nlohmann::json{{"stages", 2}});
  CHECK(c.to_json()["tensor_parallel"] == nlohmann::json{{"autotp_size", 2}});

  // "auto" (DeepSpeed's default) leaves the stages to the framework, and is written back as "auto".
  const config framework = config::from_string(R"({"train_batch_size": 2, "pipeline": {"stages": "auto"}})");
  CHECK_FALSE(framework.pipeline.stages.has_value());
  CHECK(framework.to_json()["pipeline"]["stages"] == "auto");
  check_round_trip(framework);
  // Absent blocks: no pipeline, no tensor parallelism.
  const config plain = config::from_string(R"({"train_batch_size": 2})");
  CHECK_FALSE(plain.pipeline.stages.has_value());
  CHECK(plain.tensor_parallel.autotp_size == 0);
  CHECK(plain.notes.size() == 1); // only the missing world size

  using zero_test::error_of;
  CHECK(has(error_of(R"({"pipeline": {"stages": 0}})"), "pipeline.stages: found 0; expected an integer >= 1"));
  CHECK(has(error_of(R"({"tensor_parallel": {"autotp_size": -1}})"),
            "tensor_parallel.autotp_size: found -1; expected an integer >= 0"));
  CHECK(has(error_of(R"({"pipeline": {"stages": "two"}})"), "pipeline.stages: found \"two\""));
  CHECK(has(error_of(R"({"tensor_parallel": {"autotp_sise": 2}})"),
            "tensor_parallel.autotp_sise: unknown key (did you mean \"autotp_size\"?)"));
  CHECK(has(error_of(R"({"autotp_size": 2})"), "it belongs in tensor_parallel.autotp_size"));
  CHECK(has(error_of(R"({"pipeline": {"activation_checkpoint_interval": 1}})"),
            "pipeline.activation_checkpoint_interval: found 1; this needs activation checkpointing in the pipeline"));
  CHECK(has(error_of(R"({"tensor_parallel": {"autotp_size": 2, "preset_model": "llama"}})"),
            "tensor_parallel.preset_model: found \"llama\"; this needs AutoTP's automatic partitioning of a model's "
            "layers"));
  CHECK(has(error_of(R"({"tensor_parallel": {"tp": {"tp_size": 2}}})"),
            "the tensor-parallel size goes in tensor_parallel.autotp_size"));
}

TEST_CASE("activation_checkpointing: cpu_checkpointing and number_checkpoints read and written back; "
          "partition_activations refused, the no-op keys noted") {
  const auto c = config::from_string(R"({"train_batch_size": 1, "activation_checkpointing": {
      "partition_activations": false, "cpu_checkpointing": true, "contiguous_memory_optimization": true,
      "number_checkpoints": 24, "synchronize_checkpoint_boundary": true, "profile": false}})");
  const auto& a = c.activation_checkpointing;
  CHECK(a.cpu_checkpointing);
  CHECK(a.contiguous_memory_optimization);
  REQUIRE(a.number_checkpoints.has_value());
  CHECK(*a.number_checkpoints == 24);
  CHECK(has_note(c, "activation_checkpointing.synchronize_checkpoint_boundary: true has no effect"));
  CHECK(has_note(c, "activation_checkpointing.cpu_checkpointing: true takes effect where the framework keeps its "
                    "checkpoints in a zero::activation_store"));
  CHECK(config::from_json(c.to_json()).activation_checkpointing == a);
  // DeepSpeed's defaults (the commented example's block) read as off.
  CHECK(config::from_string(R"({"train_batch_size": 1, "activation_checkpointing": {"partition_activations": false,
      "cpu_checkpointing": false, "number_checkpoints": null}})")
            .activation_checkpointing == zero::activation_checkpointing_config{});
  CHECK(zero_test::has(zero_test::error_of(R"({"activation_checkpointing": {"partition_activations": true}})"),
                       "activation_checkpointing.partition_activations: found true; this needs splitting activation "
                       "checkpoints over the model-parallel group"));
  CHECK(zero_test::has(zero_test::error_of(R"({"activation_checkpointing": {"number_checkpoints": 0}})"),
                       "activation_checkpointing.number_checkpoints"));
}
