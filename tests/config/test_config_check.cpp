// check_engine_config, the one rule of which configs the engine runs (zero-report and zero-estimate
// call it too), and what the reader accepts of DeepSpeed's defaults and no-op values: every refusal
// names the key, the value and what is accepted.

#include "support.hpp"
#include "zero/config/check.hpp"
#include "zero/config/config.hpp"

#include <doctest/doctest.h>
#include <optional>
#include <string>
#include <string_view>

using zero::config;
using zero_test::error_of;
using zero_test::has;

namespace {

/// The message check_engine_config throws for `text` read for `ranks` ranks; empty when it accepts.
std::string engine_refusal(std::string_view text, std::optional<std::int64_t> ranks) {
  // Read for one rank: the reader's own checks of the world size (mics_shard_size, qgZ's node size) stay out.
  const config c = config::from_string(text);
  try {
    zero::check_engine_config(c, ranks);
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return {};
}

/// The message check_engine_config throws for a config made in code; empty when it accepts.
std::string engine_error(const config& c) {
  try {
    zero::check_engine_config(c, 1);
  } catch (const zero::config_error& e) {
    return e.what();
  }
  return {};
}

bool check_noted(const config& c, std::string_view needle) {
  for (const std::string& n : c.notes) {
    if (n.find(needle) != std::string::npos) {
      return true;
    }
  }
  MESSAGE("no note with [" << needle << "]");
  return false;
}

constexpr std::string_view adamw = R"("optimizer": {"type": "AdamW", "params": {"lr": 1e-3}})";

std::string with_adamw(std::string_view rest) { return "{" + std::string(adamw) + ", " + std::string(rest) + "}"; }

} // namespace

TEST_CASE("check_engine_config refuses what the engine does not run, naming the key and what is accepted") {
  SUBCASE("HSDP with optimizer offload") {
    const auto e = engine_refusal(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization":
        {"stage": 2, "mics_shard_size": 4, "offload_optimizer": {"device": "cpu"}})"),
                                  8);
    CHECK(has(e, "zero_optimization.mics_shard_size 4 with offload"));
    CHECK(has(e, "expected offload_optimizer and offload_param device \"none\", or mics_shard_size -1"));
  }
  SUBCASE("HSDP with qgZ") {
    const auto e = engine_refusal(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization":
        {"stage": 2, "mics_shard_size": 4, "zero_quantized_gradients": true})"),
                                  8);
    CHECK(has(e, "zero_optimization.mics_shard_size 4 with zero_quantized_gradients"));
  }
  SUBCASE("an hpZ partition larger than the ranks, and one that does not divide them") {
    const std::string hpz16 = with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization":
        {"stage": 3, "zero_hpz_partition_size": 16})");
    CHECK(has(engine_refusal(hpz16, 8), "zero_optimization.zero_hpz_partition_size 16 does not divide the 8 "
                                        "data-parallel ranks; expected the ranks of a node, a divisor of 8"));
    CHECK(engine_refusal(hpz16, 16).empty());
    CHECK(engine_refusal(hpz16, std::nullopt).empty()); // no ranks: not known yet
    const std::string hpz3 = with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization":
        {"stage": 3, "zero_hpz_partition_size": 3})");
    CHECK(has(engine_refusal(hpz3, 8), "zero_hpz_partition_size 3 does not divide the 8"));
  }
  SUBCASE("qgZ's node size") {
    const std::string q = with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization":
        {"stage": 2, "zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 3})");
    CHECK(has(engine_refusal(q, 8), "zero_optimization.zero_quantized_gradients_node_size 3 does not divide the 8"));
    CHECK(engine_refusal(q, 6).empty());
  }
  SUBCASE("no optimizer block") {
    const auto e = engine_refusal(R"({"train_micro_batch_size_per_gpu": 1})", 1);
    CHECK(has(e, "optimizer: missing; the engine runs the Adam or AdamW that the config's optimizer block describes"));
    CHECK(has(e, R"(expected e.g. "optimizer": {"type": "AdamW")"));
  }
  SUBCASE("NVMe offload with too few buffers (what zero-report said the engine refuses)") {
    CHECK(has(engine_refusal(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 1}})"),
                             1),
              "zero_optimization.offload_optimizer.buffer_count: 1 with device \"nvme\"; NVMe offload needs at least "
              "2 chunk buffers"));
    CHECK(has(engine_refusal(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/tmp", "buffer_count": 0}})"),
                             1),
              "zero_optimization.offload_param.buffer_count: 0 with device \"nvme\""));
  }
  SUBCASE("a communication dtype set in code") {
    config c = config::from_string(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 2})"));
    CHECK_NOTHROW(zero::check_engine_config(c, 1));
    c.communication_data_type = zero::dtype::f16;
    try {
      zero::check_engine_config(c, 1);
      FAIL("expected a config_error");
    } catch (const zero::config_error& e) {
      CHECK(has(e.what(), "communication_data_type: found \"fp16\", but zero reduces gradients only in their "
                          "accumulation dtype, bf16 here"));
    }
  }
}

TEST_CASE("the offload rules the reader and check_engine_config share: one sentence for a file and for code") {
  // Each config read from a file is refused by the reader; the same setting made in code on an accepted
  // config is refused by check_engine_config with the same sentence (zero/config/detail/offload_rules.hpp).
  struct rule {
    const char* file;         // the zero_optimization block the reader refuses
    void (*in_code)(config&); // the same setting made on {"stage": 3} in code
    const char* message;
  };
  const rule rules[] = {
      {R"({"stage": 2, "offload_param": {"device": "cpu"}})",
       [](config& c) {
         c.zero_optimization.stage = 2;
         c.zero_optimization.offload_param.device = zero::offload_device::cpu;
       },
       "zero_optimization.offload_param.device: found \"cpu\", but offload_param needs ZeRO stage 3 and "
       "zero_optimization.stage is 2"},
      {R"({"stage": 3, "offload_param": {"device": "nvme"}})",
       [](config& c) { c.zero_optimization.offload_param.device = zero::offload_device::nvme; },
       "zero_optimization.offload_param.nvme_path: missing; device \"nvme\" keeps the parameter shard in a file "
       "under this folder"},
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme"}})",
       [](config& c) { c.zero_optimization.offload_optimizer.device = zero::offload_device::nvme; },
       "zero_optimization.offload_optimizer.nvme_path: missing; device \"nvme\" keeps the optimizer state in a "
       "file under this folder"},
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0.25}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::nvme;
         o.nvme_path = "/tmp";
         o.ratio = 0.25;
       },
       "zero_optimization.offload_optimizer.ratio: found 0.25 with device \"nvme\"; a ratio below 1 keeps part of "
       "the optimizer state on the device"},
      // host_ratio (zero's own key): a share in [0, 1) of the state in host memory beside the NVMe file.
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "host_ratio": 1.5}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::nvme;
         o.nvme_path = "/tmp";
         o.host_ratio = 1.5;
       },
       "zero_optimization.offload_optimizer.host_ratio: found 1.5; expected a share >= 0 and below 1 of the "
       "optimizer state kept in host memory beside the NVMe file"},
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "host_ratio": 1}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::nvme;
         o.nvme_path = "/tmp";
         o.host_ratio = 1;
       },
       "beside the NVMe file (the whole state in host memory is device \"cpu\")"},
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "host_ratio": -0.25}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::nvme;
         o.nvme_path = "/tmp";
         o.host_ratio = -0.25;
       },
       "zero_optimization.offload_optimizer.host_ratio: found -0.25; expected a share >= 0 and below 1"},
      {R"({"stage": 3, "offload_optimizer": {"device": "cpu", "host_ratio": 0.5}})",
       [](config& c) {
         c.zero_optimization.offload_optimizer.device = zero::offload_device::cpu;
         c.zero_optimization.offload_optimizer.host_ratio = 0.5;
       },
       "zero_optimization.offload_optimizer.host_ratio: found 0.5 with device \"cpu\"; host_ratio keeps that share "
       "of the state in host memory and the rest in the NVMe file of device \"nvme\""},
      {R"({"stage": 3, "offload_optimizer": {"host_ratio": 0.5}})",
       [](config& c) { c.zero_optimization.offload_optimizer.host_ratio = 0.5; },
       "zero_optimization.offload_optimizer.host_ratio: found 0.5 with device \"none\""},
      {R"({"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5, "host_ratio": 0.25}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::cpu;
         o.ratio = 0.5;
         o.host_ratio = 0.25;
       },
       "zero_optimization.offload_optimizer.host_ratio: found 0.25 with ratio 0.5; host_ratio splits the state "
       "between host memory and the NVMe file and ratio between the device and host memory, one split at a time"},
      {R"({"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "host_ratio": 0.5},
           "offload_param": {"device": "nvme", "nvme_path": "/tmp"}})",
       [](config& c) {
         auto& o = c.zero_optimization.offload_optimizer;
         o.device = zero::offload_device::nvme;
         o.nvme_path = "/tmp";
         o.host_ratio = 0.5;
         c.zero_optimization.offload_param.device = zero::offload_device::nvme;
         c.zero_optimization.offload_param.nvme_path = "/tmp";
       },
       "zero_optimization.offload_optimizer.host_ratio: found 0.5 with offload_param \"nvme\"; a state split "
       "between host memory and NVMe needs the parameter shard in memory"},
  };
  for (const rule& r : rules) {
    CAPTURE(r.file);
    CHECK(has(error_of(with_adamw(std::string(R"("train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "zero_optimization": )") + r.file)),
              r.message));
    config c = config::from_string(with_adamw(R"("train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "zero_optimization": {"stage": 3})"));
    CHECK_NOTHROW(zero::check_engine_config(c, 1));
    r.in_code(c);
    CHECK(has(engine_error(c), r.message));
  }
}

TEST_CASE("communication_data_type: only the dtype gradients are reduced in, which is the accumulation dtype") {
  // Absent: the accumulation dtype, not the parameter dtype (bf16 at stage 0 accumulates and reduces in fp32).
  CHECK(config::from_string(R"({"train_batch_size": 1, "bf16": {"enabled": true}})").communication_data_type ==
        zero::dtype::f32);
  CHECK(config::from_string(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "communication_data_type": "FP32"})")
            .communication_data_type == zero::dtype::f32);
  CHECK(config::from_string(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
                                "communication_data_type": "bf16"})")
            .communication_data_type == zero::dtype::bf16);
  // bf16 gradients reduced in fp16 or fp32: refused, not ignored.
  for (const char* dt : {"fp16", "fp32"}) {
    const auto e = error_of(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
                                "communication_data_type": ")" +
                            std::string(dt) + "\"}");
    CHECK(has(e, "communication_data_type: found \"" + std::string(dt) +
                     "\", but zero reduces gradients only in their accumulation dtype, bf16 here"));
    CHECK(has(e, "expected \"bf16\", null, or the key left out"));
  }
  // bf16 at stage 0 with fp32 accumulation: bf16 was accepted and had no effect (the same bits as without it).
  CHECK(has(error_of(R"({"train_batch_size": 1, "bf16": {"enabled": true}, "communication_data_type": "bf16"})"),
            "communication_data_type: found \"bf16\", but zero reduces gradients only in their accumulation dtype, "
            "fp32 here"));
  CHECK(has(error_of(R"({"train_batch_size": 1, "fp16": {"enabled": true}, "communication_data_type": "fp32"})"),
            "expected \"fp16\""));
}

TEST_CASE("DeepSpeed's defaults and no-op values are accepted with a note; values zero does not implement are not") {
  SUBCASE("checkpoint.tag_validation") {
    for (const char* v : {"Warn", "WARN", "Ignore"}) {
      const config c = config::from_string(R"({"train_batch_size": 1, "checkpoint": {"tag_validation": ")" +
                                           std::string(v) + "\"}}");
      CHECK(check_noted(c, "checkpoint.tag_validation: no effect"));
    }
    CHECK(has(error_of(R"({"train_batch_size": 1, "checkpoint": {"tag_validation": "Fail"}})"),
              "checkpoint.tag_validation: found \"Fail\"; this needs failing a save whose tag differs across ranks"));
    CHECK(has(error_of(R"({"train_batch_size": 1, "checkpoint": {"tag_validation": "Wran"}})"),
              R"(checkpoint.tag_validation: found "Wran"; expected "Warn" (DeepSpeed's default) or "Ignore")"));
    CHECK(has(error_of(R"({"train_batch_size": 1, "checkpoint": {"load_universal": true}})"),
              "checkpoint.load_universal: found true; this needs DeepSpeed's universal checkpoints"));
    CHECK(config::from_string(R"({"train_batch_size": 1, "checkpoint": {"use_node_local_storage": false,
                                  "load_universal": false, "parallel_write": {"pipeline_stage": false}}})")
              .train_batch_size == 1);
  }
  SUBCASE("memory_efficient_linear and override_module_apply, PyTorch-only switches") {
    for (const char* v : {"false", "true"}) {
      const config c = config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
          "memory_efficient_linear": )" + std::string(v) +
                                           R"(, "override_module_apply": )" + v + "}}");
      CHECK(check_noted(c, "zero_optimization.memory_efficient_linear: no effect"));
      CHECK(check_noted(c, "zero_optimization.override_module_apply: no effect"));
    }
  }
  SUBCASE("offload pin_memory") {
    const config c = config::from_string(R"({"train_batch_size": 1, "zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu",
        "pin_memory": false}}})");
    CHECK(check_noted(c, "zero_optimization.offload_optimizer.pin_memory: no effect"));
    CHECK(check_noted(c, "zero_optimization.offload_param.pin_memory: no effect"));
  }
}

TEST_CASE("offload_optimizer.delayed_update (zero's own block): read, written back, its key checked, refused where "
          "the engine cannot delay") {
  const std::string head = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, )"
                           R"("zero_optimization": {"stage": 2, "offload_optimizer": )";
  const config c = config::from_string(head + R"({"device": "cpu", "delayed_update": {"warmup_steps": 40}}}})");
  CHECK(c.zero_optimization.offload_optimizer.delayed_update);
  CHECK(c.zero_optimization.offload_optimizer.delayed_warmup_steps == 40);
  CHECK(c.to_json()["zero_optimization"]["offload_optimizer"]["delayed_update"]["warmup_steps"] == 40);
  zero::config_inputs in;
  in.world_size = c.world_size;
  CHECK(config::from_json(c.to_json(), in).to_json() == c.to_json());
  CHECK_NOTHROW(zero::check_engine_config(c, 1));
  // Absent: exact, and not written.
  const config exact = config::from_string(head + R"({"device": "cpu"}}})");
  CHECK_FALSE(exact.zero_optimization.offload_optimizer.delayed_update);
  CHECK_FALSE(exact.to_json()["zero_optimization"]["offload_optimizer"].contains("delayed_update"));
  // The block's own key, by its path.
  CHECK(has(error_of(head + R"({"device": "cpu", "delayed_update": {"warmup": 4}}}})"),
            "zero_optimization.offload_optimizer.delayed_update.warmup"));
  CHECK(has(error_of(head + R"({"device": "cpu", "delayed_update": {"warmup_steps": -1}}}})"),
            "zero_optimization.offload_optimizer.delayed_update.warmup_steps"));
  CHECK(has(error_of(head + R"({"device": "cpu", "delayed_update": true}}})"),
            "zero_optimization.offload_optimizer.delayed_update"));
  // Made in code where it cannot act: check_engine_config names the block and the setting.
  config bad = c;
  bad.zero_optimization.offload_optimizer.ratio = 0.5;
  try {
    zero::check_engine_config(bad, 1);
    FAIL("ratio 0.5 was accepted");
  } catch (const zero::config_error& e) {
    CHECK(has(e.what(), "zero_optimization.offload_optimizer.delayed_update with ratio 0.5"));
  }
  bad = c;
  bad.zero_optimization.offload_optimizer.delayed_warmup_steps = -3;
  try {
    zero::check_engine_config(bad, 1);
    FAIL("warmup_steps -3 was accepted");
  } catch (const zero::config_error& e) {
    CHECK(has(e.what(), "delayed_update.warmup_steps -3: expected a count of steps >= 0"));
  }
}
