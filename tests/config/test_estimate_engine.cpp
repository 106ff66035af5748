// zero-estimate's rows against real engines on the CPU backend: the device bytes it prints are what the
// engine's counting allocator holds as model state, and with the optimizer (and at stage 3 the
// parameters) offloaded to the CPU the host bytes are what its host counting allocators hold
// (docs/offload.md).

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"
#include "zero/tools/estimate.hpp"
#include "zero/tools/plan.hpp"

#include <cmath>
#include <cstdint>
#include <doctest/doctest.h>
#include <filesystem>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

namespace {

constexpr std::int64_t model_params = 2'004'000;
constexpr std::int64_t largest_layer = 250'500;

/// One step of 8 layers of 500 x 500 + 500 (psi = 2,004,000) on `world` ranks; rank 0's memory report.
/// `precision` is e.g. `"bf16": {"enabled": true},` (empty: fp32); `offload`: the offload_optimizer block's
/// keys (empty: none); `offload_param`: the offload_param block's keys (stage 3; empty: none); `zero_keys`: more
/// zero_optimization keys, each after a comma.
zero::memory_report measure(int stage, int world, const std::string& precision, const std::string& offload = "",
                            const std::string& offload_param = "", const std::string& zero_keys = "",
                            const std::string& optimizer = R"({"type": "AdamW", "params": {"lr": 1e-3}})") {
  std::vector<zero::memory_report> reports(static_cast<std::size_t>(world));
  zero::run_ranks(world, [&](zero::thread_communicator& comm) {
    zero::config_inputs inputs;
    inputs.world_size = world;
    const auto cfg = zero::config::from_string(
        R"({"train_micro_batch_size_per_gpu": 1, "aio": {"block_size": 4096, "queue_depth": 1}, )" + precision +
            R"( "optimizer": )" + optimizer + R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
            (offload.empty() ? "" : R"(, "offload_optimizer": {)" + offload + "}") +
            (offload_param.empty() ? "" : R"(, "offload_param": {)" + offload_param + "}") + zero_keys +
            R"(, "reduce_bucket_size": 300000, "stage3_param_persistence_threshold": 100}})",
        inputs);
    zero::cpu_backend backend({.threads = 1});
    zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
    eng.set_offload_threads(1);
    std::vector<int> modules;
    for (int l = 0; l < 8; ++l) {
      modules.push_back(eng.add_module("layer" + std::to_string(l)));
      eng.add_param(modules.back(), "layer" + std::to_string(l) + ".weight", {500, 500});
      eng.add_param(modules.back(), "layer" + std::to_string(l) + ".bias", {500});
    }
    eng.finalize();
    CHECK(eng.optimizer().offloaded() == !offload.empty());
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> out) { std::fill(out.begin(), out.end(), 0.5f); });
    for (int l = 8; l-- > 0;) {
      auto on = eng.gather(modules[static_cast<std::size_t>(l)]);
      eng.grad_ready(zero::param_handle{static_cast<std::size_t>(2 * l + 1)});
      eng.grad_ready(zero::param_handle{static_cast<std::size_t>(2 * l)});
    }
    CHECK(eng.step().applied);
    reports[static_cast<std::size_t>(comm.rank())] = eng.memory();
  });
  return reports[0];
}

/// The estimate's row for that model at `stage` on `world` ranks, optimizer offload `opt`, parameter
/// offload `par` (on NVMe: `max_in_cpu` elements in host memory, `param_buffers` bounce buffers); gradients in the
/// config's default dtype (fp32 for bf16 at stage 0); `hpz`: zero_hpz_partition_size; `host_ratio`: the share of
/// the nvme rows' state in host memory; `delayed_warmup`: the config's delayed_update block (-1: none).
zero::tools::estimate_row estimate(int stage, int world, zero::dtype param, zero::offload_device opt,
                                   zero::offload_device par = zero::offload_device::none, double ratio = 1.0,
                                   std::int64_t max_in_cpu = 1'000'000'000, std::int64_t param_buffers = 5,
                                   std::int64_t hpz = 1, bool forward_overlap = false, double host_ratio = 0,
                                   std::int64_t delayed_warmup = -1) {
  zero::tools::estimate_options o;
  o.config_delayed_warmup = delayed_warmup;
  o.host_ratio = host_ratio;
  o.offload_forward_overlap = forward_overlap;
  o.hpz_partition_size = hpz;
  o.offload_ratio = ratio;
  o.offload_param_max_in_cpu = max_in_cpu;
  o.offload_param_buffer_count = param_buffers;
  o.params = model_params;
  o.largest_layer_params = largest_layer;
  o.gpus_per_node = world;
  o.param_dtype = param;
  o.nvme_chunk_elements = 4096 / 4; // the engines' aio block of 4 KiB, one in flight
  for (const auto& r : zero::tools::estimate_memory(o)) {
    if (r.stage == stage && r.offload_optimizer == opt && r.offload_param == par) {
      return r;
    }
  }
  FAIL("no row for stage " << stage);
  return {};
}

/// |a - b| / b; 0 when both are 0 (the device holds no model state with everything offloaded).
double relative(std::int64_t a, std::size_t b) {
  if (a == 0 && b == 0) {
    return 0;
  }
  return std::abs(static_cast<double>(a) - static_cast<double>(b)) / static_cast<double>(b);
}

/// The row's device bytes (model state) and host bytes per rank within 2% of what the engine held (`m`), each
/// captured beside the engine's.
void check_device_and_host(const zero::tools::estimate_row& row, const zero::memory_report& m) {
  CAPTURE(row.gpu_model_state_bytes);
  CAPTURE(m.model_state_peak);
  CAPTURE(row.host_bytes_per_rank);
  CAPTURE(m.host_peak);
  CHECK(relative(row.gpu_model_state_bytes, m.model_state_peak) <= 0.02);
  CHECK(relative(row.host_bytes_per_rank, m.host_peak) <= 0.02);
}

} // namespace

TEST_CASE("zero-estimate's model-state bytes are within 2% of what the counting allocator measures") {
  // bf16, every stage, N = 1, 2, 4, 8.
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {1, 2, 4, 8}) {
      CAPTURE(stage);
      CAPTURE(world);
      const auto m = measure(stage, world, R"("bf16": {"enabled": true},)");
      const auto row = estimate(stage, world, zero::dtype::bf16, zero::offload_device::none);
      CAPTURE(row.gpu_model_state_bytes);
      CAPTURE(m.model_state_peak);
      CHECK(relative(row.gpu_model_state_bytes, m.model_state_peak) <= 0.02);
      CHECK(row.host_bytes_per_rank == 0);
      CHECK(m.host_peak == 0);
    }
  }
}

TEST_CASE("zero-estimate's offload_optimizer=cpu rows are within 2% of what the engine holds on device and host") {
  struct precision {
    const char* json;
    zero::dtype type;
  };
  // bf16 (K = 12: fp32 master, m, v) on 1, 2 and 4 ranks; fp32 training (K = 8: the parameters are their
  // own master) on 2.
  for (const precision pr :
       {precision{R"("bf16": {"enabled": true},)", zero::dtype::bf16}, precision{"", zero::dtype::f32}}) {
    for (int stage : {1, 2, 3}) {
      for (int world : {1, 2, 4}) {
        if (pr.type == zero::dtype::f32 && world != 2) {
          continue;
        }
        CAPTURE(zero::name_of(pr.type));
        CAPTURE(stage);
        CAPTURE(world);
        const auto m = measure(stage, world, pr.json, R"("device": "cpu")");
        const auto row = estimate(stage, world, pr.type, zero::offload_device::cpu);
        CHECK(row.implemented);
        CHECK(m.optimizer_peak == 0);
        REQUIRE(m.host_peak > 0);
        check_device_and_host(row, m);
        CHECK(row.host_bytes_per_node == world * row.host_bytes_per_rank);
      }
    }
  }
}

TEST_CASE("zero-estimate's offload_optimizer=cpu rows with the delayed update count the host gradient shard twice, "
          "within 2% of the engine") {
  // Stages 2-3, the whole state on the host: the engine holds a second gradient shard for the update beside the
  // next backward (hold_twice), which the estimate adds to the rows that run it.
  for (int stage : {2, 3}) {
    for (int world : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(world);
      const auto m = measure(stage, world, R"("bf16": {"enabled": true},)",
                             R"("device": "cpu", "delayed_update": {"warmup_steps": 0})");
      const auto row = estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu, zero::offload_device::none,
                                1.0, 1'000'000'000, 5, 1, false, 0, 0);
      check_device_and_host(row, m);
      const auto exact = estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu);
      const std::int64_t shard = model_params / world;
      CHECK(row.host_bytes_per_rank - exact.host_bytes_per_rank >= shard * 2); // bf16 gradients, once more
    }
  }
}

TEST_CASE("zero-estimate's offload_optimizer=cpu rows with ZenFlow count its window and compact state, within 2% of "
          "the engine") {
  // Stages 1-3, the whole state on the host: the engine adds an fp32 window per state element in host memory and,
  // on the device, the chosen columns' compact state (a tenth of each weight's 500 columns, every bias element);
  // with overlap_step the host gradient shard twice.
  for (int stage : {1, 2, 3}) {
    for (int world : {1, 2}) {
      for (bool overlap : {false, true}) {
        CAPTURE(stage);
        CAPTURE(world);
        CAPTURE(overlap);
        const auto m = measure(stage, world, R"("bf16": {"enabled": true},)", R"("device": "cpu")", "",
                               R"(, "zenflow": {"topk_ratio": 0.1, "update_interval": 2, "select_strategy": "step", )"
                               R"("select_interval": 0, "overlap_step": )" +
                                   std::string(overlap ? "true" : "false") + "}");
        zero::tools::estimate_options o;
        o.config_zenflow_topk = 0.1;
        o.config_zenflow_overlap = overlap;
        o.params = model_params;
        o.largest_layer_params = largest_layer;
        o.gpus_per_node = world;
        o.param_dtype = zero::dtype::bf16;
        zero::tools::estimate_row row;
        for (const auto& r : zero::tools::estimate_memory(o)) {
          if (r.stage == stage && r.offload_optimizer == zero::offload_device::cpu &&
              r.offload_param == zero::offload_device::none) {
            row = r;
          }
        }
        CHECK(row.zenflow);
        check_device_and_host(row, m);
        const auto exact = estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu);
        const std::int64_t shard = model_params / world;
        CHECK(row.host_bytes_per_rank - exact.host_bytes_per_rank == shard * (overlap ? 4 + 2 : 4)); // window, grads
        CHECK(row.gpu_model_state_bytes - exact.gpu_model_state_bytes == shard / 10 * (4 + 12 + 2 + 2));
        CHECK(m.host_formula == doctest::Approx(static_cast<double>(row.host_bytes_per_rank)).epsilon(0.02));
        // The report's device formula counts the compact state the engine chose (its model state's bytes).
        CHECK(m.formula == doctest::Approx(static_cast<double>(m.model_state_peak)).epsilon(0.02));
      }
    }
  }
  // With gradient accumulation the engine runs ZenFlow, window and all, unless overlap_step is on (it refuses that).
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    zero::tools::estimate_options o;
    o.config_zenflow_topk = 0.1;
    o.config_zenflow_overlap = overlap;
    o.gradient_accumulation_steps = 2;
    o.params = model_params;
    o.largest_layer_params = largest_layer;
    o.param_dtype = zero::dtype::bf16;
    int rows = 0;
    for (const auto& r : zero::tools::estimate_memory(o)) {
      if (r.stage >= 1 && r.offload_optimizer == zero::offload_device::cpu &&
          r.offload_param == zero::offload_device::none) {
        CHECK(r.zenflow == !overlap);
        ++rows;
      }
    }
    CHECK(rows == 3);
  }
}

TEST_CASE("zero-estimate's offload_optimizer=nvme rows are within 2% of the engine's device, host and file bytes") {
  const auto dir = std::filesystem::temp_directory_path() / ("zero-estimate-nvme-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (int stage : {1, 2, 3}) {
    for (int world : {1, 2, 4}) {
      CAPTURE(stage);
      CAPTURE(world);
      const auto m = measure(stage, world, R"("bf16": {"enabled": true},)",
                             R"("device": "nvme", "nvme_path": ")" + dir.string() + R"(")");
      const auto row = estimate(stage, world, zero::dtype::bf16, zero::offload_device::nvme);
      CAPTURE(row.nvme_bytes_per_node);
      CAPTURE(m.nvme);
      CHECK(row.implemented);
      CHECK(m.optimizer_peak == 0);
      check_device_and_host(row, m);
      CHECK(relative(row.nvme_bytes_per_node / world, m.nvme) <= 0.02);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("zero-estimate's offload_optimizer=nvme rows with host_ratio are within 2% of the engine's device, host "
          "and file bytes") {
  const auto dir = std::filesystem::temp_directory_path() / ("zero-estimate-host-nvme-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct placement {
    int stage;
    zero::offload_device param;
  };
  for (const placement at : {placement{1, zero::offload_device::none}, placement{2, zero::offload_device::none},
                             placement{3, zero::offload_device::none}, placement{3, zero::offload_device::cpu}}) {
    for (int world : {1, 2, 4}) {
      for (double h : {0.3, 0.6}) {
        CAPTURE(at.stage);
        CAPTURE(zero::name_of(at.param));
        CAPTURE(world);
        CAPTURE(h);
        const auto m =
            measure(at.stage, world, R"("bf16": {"enabled": true},)",
                    R"("device": "nvme", "nvme_path": ")" + dir.string() + R"(", "host_ratio": )" + std::to_string(h),
                    at.param == zero::offload_device::cpu ? R"("device": "cpu")" : "");
        const auto row = estimate(at.stage, world, zero::dtype::bf16, zero::offload_device::nvme, at.param, 1.0,
                                  1'000'000'000, 5, 1, false, h);
        CAPTURE(row.nvme_bytes_per_node);
        CAPTURE(m.nvme);
        CAPTURE(m.host_optimizer);
        CHECK(m.optimizer_peak == 0);
        CHECK(m.host_share == doctest::Approx(h).epsilon(0.01));
        CHECK(row.host_ratio == doctest::Approx(h).epsilon(0.01));
        // The host share's state is in host memory, the rest's on NVMe (two slots).
        CHECK(relative(static_cast<std::int64_t>(h * 12 * static_cast<double>(model_params) / world),
                       m.host_optimizer) <= 0.02);
        check_device_and_host(row, m);
        CHECK(relative(row.nvme_bytes_per_node / world, m.nvme) <= 0.02);
        // Less on NVMe and more in host memory than the whole state on NVMe.
        const auto whole = estimate(at.stage, world, zero::dtype::bf16, zero::offload_device::nvme, at.param);
        CHECK(row.nvme_bytes_per_node < whole.nvme_bytes_per_node);
        CHECK(row.host_bytes_per_node > whole.host_bytes_per_node);
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("zero-estimate's stage 3 offload_param=cpu row is within 2% of what the engine holds on device and host") {
  // Optimizer and parameters offloaded: the device keeps the gradient shard, the host the state, the
  // staged gradient and parameter shards and the parameter shard the gathers upload from.
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    const auto m = measure(3, world, R"("bf16": {"enabled": true},)", R"("device": "cpu")", R"("device": "cpu")");
    const auto row = estimate(3, world, zero::dtype::bf16, zero::offload_device::cpu, zero::offload_device::cpu);
    CHECK(row.implemented);
    CHECK(m.params_peak == 0);
    check_device_and_host(row, m);
  }
}

TEST_CASE("zero-estimate's offload_optimizer=cpu rows with a ratio below 1 are within 2% of the engine's split") {
  // Partial offload: the device keeps (1 - ratio) of the optimizer state, the host ratio of it and of the
  // staged gradient and parameter shards; with parameter offload the host also holds the whole shard.
  for (double ratio : {0.25, 0.6}) {
    for (int stage : {1, 2, 3}) {
      for (int world : {1, 2, 4}) {
        CAPTURE(ratio);
        CAPTURE(stage);
        CAPTURE(world);
        const std::string keys = R"("device": "cpu", "ratio": )" + std::to_string(ratio);
        const auto m = measure(stage, world, R"("bf16": {"enabled": true},)", keys);
        const auto row =
            estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu, zero::offload_device::none, ratio);
        CHECK(m.optimizer_peak > 0);
        check_device_and_host(row, m);
      }
    }
    for (int stage : {2, 3}) {
      for (int world : {1, 2, 4}) {
        // Beside the next forward: the host share's gradients stream to the host, the device keeps the
        // part of each slice its share reads.
        CAPTURE(ratio);
        CAPTURE(stage);
        CAPTURE(world);
        const std::string keys = R"("device": "cpu", "forward_overlap": true, "ratio": )" + std::to_string(ratio);
        const auto m = measure(stage, world, R"("bf16": {"enabled": true},)", keys);
        const auto row = estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu,
                                  zero::offload_device::none, ratio, 1'000'000'000, 5, 1, true);
        const auto kept =
            estimate(stage, world, zero::dtype::bf16, zero::offload_device::cpu, zero::offload_device::none, ratio);
        CHECK(row.gpu_model_state_bytes < kept.gpu_model_state_bytes);
        check_device_and_host(row, m);
      }
    }
    CAPTURE(ratio);
    const auto m = measure(3, 2, R"("bf16": {"enabled": true},)",
                           R"("device": "cpu", "ratio": )" + std::to_string(ratio), R"("device": "cpu")");
    const auto row = estimate(3, 2, zero::dtype::bf16, zero::offload_device::cpu, zero::offload_device::cpu, ratio);
    check_device_and_host(row, m);
  }
}

TEST_CASE("zero-estimate's stage 3 offload_param=nvme rows are within 2% of the engine's device, host and file bytes") {
  // The shard in a file (max_in_cpu 0) or all of it in host memory (the default, 1e9), two bounce
  // buffers of a layer's slice; the optimizer in host memory or on NVMe. Host bytes are those held
  // after the step: init_params held an image of the whole shard for a while (docs/offload.md).
  const auto dir = std::filesystem::temp_directory_path() / ("zero-estimate-param-nvme-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const auto opt : {zero::offload_device::cpu, zero::offload_device::nvme}) {
    for (const std::int64_t max_in_cpu : {std::int64_t{0}, std::int64_t{1'000'000'000}}) {
      for (int world : {1, 2, 4}) {
        CAPTURE(zero::name_of(opt));
        CAPTURE(max_in_cpu);
        CAPTURE(world);
        const std::string folder = R"(, "nvme_path": ")" + dir.string() + R"(")";
        const auto m =
            measure(3, world, R"("bf16": {"enabled": true},)",
                    R"("device": ")" + std::string(zero::name_of(opt)) + R"(")" + folder,
                    R"("device": "nvme", "buffer_count": 2, "max_in_cpu": )" + std::to_string(max_in_cpu) + folder);
        const auto row = estimate(3, world, zero::dtype::bf16, opt, zero::offload_device::nvme, 1.0, max_in_cpu, 2);
        const std::size_t host = m.host_params + m.host_grads + m.host_optimizer + m.host_buffers;
        CAPTURE(row.host_bytes_per_rank);
        CAPTURE(host);
        CAPTURE(row.nvme_bytes_per_node);
        CAPTURE(m.nvme);
        CHECK(row.implemented);
        CHECK(m.params_peak == 0);
        CHECK(relative(row.gpu_model_state_bytes, m.model_state_peak) <= 0.02);
        CHECK(relative(row.host_bytes_per_rank, host) <= 0.02);
        if (max_in_cpu == 0 || opt == zero::offload_device::nvme) {
          CHECK(relative(row.nvme_bytes_per_node / world, m.nvme) <= 0.02);
        } else {
          CHECK(row.nvme_bytes_per_node == 0); // the whole shard in host memory: no file, no buffers
          CHECK(m.nvme == 0);
          CHECK(m.host_buffers == 0);
        }
      }
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("zero-estimate's stage 3 rows with hpZ count the secondary partition within 2% of the engine") {
  // zero_hpz_partition_size H: each rank keeps P psi / H more bytes of model state on the device (the
  // secondary partition, memory_report::secondary), with or without the optimizer and parameters
  // offloaded; the rows of the other stages do not change.
  struct setting {
    int world;
    std::int64_t hpz;
    zero::offload_device opt, par;
  };
  const auto none = zero::offload_device::none;
  const auto cpu = zero::offload_device::cpu;
  for (const setting s : {setting{2, 2, none, none}, setting{4, 2, none, none}, setting{4, 4, none, none},
                          setting{8, 4, none, none}, setting{4, 2, cpu, none}, setting{4, 2, cpu, cpu}}) {
    CAPTURE(s.world);
    CAPTURE(s.hpz);
    CAPTURE(zero::name_of(s.opt));
    CAPTURE(zero::name_of(s.par));
    const std::string device = R"("device": "cpu")";
    const auto m = measure(3, s.world, R"("bf16": {"enabled": true},)", s.opt == cpu ? device : "",
                           s.par == cpu ? device : "", R"(, "zero_hpz_partition_size": )" + std::to_string(s.hpz));
    const auto row = estimate(3, s.world, zero::dtype::bf16, s.opt, s.par, 1.0, 1'000'000'000, 5, s.hpz);
    const auto flat = estimate(3, s.world, zero::dtype::bf16, s.opt, s.par);
    const std::int64_t secondary = row.gpu_model_state_bytes - flat.gpu_model_state_bytes;
    CAPTURE(secondary);
    CAPTURE(m.secondary);
    CAPTURE(row.gpu_model_state_bytes);
    CAPTURE(m.model_state_peak);
    REQUIRE(m.secondary > 0);
    CHECK(relative(secondary, m.secondary) <= 0.02);
    CHECK(relative(secondary, static_cast<std::size_t>(2 * model_params / s.hpz)) <= 0.02); // P psi / H
    CHECK(relative(row.gpu_model_state_bytes, m.model_state_peak) <= 0.02);
    CHECK(row.host_bytes_per_rank == flat.host_bytes_per_rank);
    CHECK(relative(row.host_bytes_per_rank, m.host_peak) <= 0.02);
    // Below stage 3 the key has no effect.
    CHECK(estimate(2, s.world, zero::dtype::bf16, s.opt, none, 1.0, 1'000'000'000, 5, s.hpz).gpu_bytes_per_rank ==
          estimate(2, s.world, zero::dtype::bf16, s.opt).gpu_bytes_per_rank);
  }
  // A size that does not divide the ranks is an error naming the key and what it expects, as the engine's.
  zero::tools::estimate_options o;
  o.params = model_params;
  o.gpus_per_node = 4;
  o.hpz_partition_size = 3;
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::tools::estimate_memory(o)),
                       doctest::Contains("zero_hpz_partition_size is 3; expected a divisor of the 4 ranks"),
                       zero::usage_error);
  o.hpz_partition_size = 0;
  CHECK_THROWS_AS(static_cast<void>(zero::tools::estimate_memory(o)), zero::usage_error);
}

TEST_CASE("zero-estimate counts the engine's layout of a described model of small tensors, to the byte") {
  // Three modules of tensors that are no multiple of 256 bytes (a GPT-like block of width 24): the engine aligns
  // each tensor to 256 bytes and pads each segment to ranks x 256 bytes, and at stage 3 puts the tensors below the
  // persistence threshold (100) in a segment of their own; here that is several percent of the model. The
  // estimate lays the description out with the engine's registry, so its rows are the engine's bytes.
  const std::vector<std::vector<std::int64_t>> modules = {
      {100 * 24, 16 * 24}, {24, 24, 24 * 72, 72, 24 * 24, 24, 24, 24, 24 * 96, 96, 96 * 24, 24}, {24, 24}};
  const auto model = zero::tools::summarize_modules(modules);
  constexpr int world = 4;
  for (const std::string_view precision : {R"("bf16": {"enabled": true},)", ""}) {
    for (int stage : {0, 1, 2, 3}) {
      for (const zero::offload_device opt : {zero::offload_device::none, zero::offload_device::cpu}) {
        if (stage == 0 && opt != zero::offload_device::none) {
          continue;
        }
        CAPTURE(precision);
        CAPTURE(stage);
        CAPTURE(zero::name_of(opt));
        const std::string json =
            R"({"train_micro_batch_size_per_gpu": 1, )" + std::string(precision) +
            R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": )" +
            std::to_string(stage) +
            (opt == zero::offload_device::cpu ? R"(, "offload_optimizer": {"device": "cpu"})" : "") +
            R"(, "stage3_param_persistence_threshold": 100}})";
        zero::memory_report m;
        zero::run_ranks(world, [&](zero::thread_communicator& comm) {
          zero::cpu_backend backend({.threads = 1});
          zero::engine<zero::cpu_backend, zero::thread_communicator> eng(
              zero::config::from_string(json, {.world_size = world}), comm, backend);
          eng.set_offload_threads(1);
          std::vector<int> ids;
          std::vector<std::vector<zero::param_handle>> handles;
          for (std::size_t i = 0; i < modules.size(); ++i) {
            ids.push_back(eng.add_module("m" + std::to_string(i)));
            handles.emplace_back();
            for (std::size_t k = 0; k < modules[i].size(); ++k) {
              handles.back().push_back(
                  eng.add_param(ids.back(), "m" + std::to_string(i) + "." + std::to_string(k), {modules[i][k]}));
            }
          }
          eng.finalize();
          eng.init_params([](const zero::param_info&, std::size_t, std::span<float> out) {
            std::fill(out.begin(), out.end(), 0.5f);
          });
          for (std::size_t i = modules.size(); i-- > 0;) {
            auto on = eng.gather(ids[i]);
            for (const auto h : handles[i]) {
              eng.grad_ready(h);
            }
          }
          CHECK(eng.step().applied);
          if (comm.rank() == 0) {
            m = eng.memory();
          }
        });
        auto o =
            zero::tools::estimate_options_from(zero::config::from_string(json, {.world_size = world}), model, world);
        auto row_of = [&](const zero::tools::estimate_options& opts) {
          for (const auto& r : zero::tools::estimate_memory(opts)) {
            if (r.stage == stage && r.offload_optimizer == opt && r.offload_param == zero::offload_device::none) {
              return r;
            }
          }
          FAIL("no row");
          return zero::tools::estimate_row{};
        };
        REQUIRE(o.padded);
        const auto row = row_of(o);
        CAPTURE(m.padding);
        CHECK(row.gpu_model_state_bytes == static_cast<std::int64_t>(m.model_state_peak));
        CHECK(row.host_bytes_per_rank == static_cast<std::int64_t>(m.host_peak));
        // Without the layout (a parameter count alone: Ψ and ceil(Ψ / N)) the row misses by more than 2%.
        o.padded.reset();
        CHECK(relative(row_of(o).gpu_model_state_bytes, m.model_state_peak) > 0.02);
      }
    }
  }
}

TEST_CASE("zero-estimate counts the update rule's state: Lion, SGD and Adagrad rows within 2% of the engine") {
  // The rows come from the config (estimate_options_from), as zero-estimate --config makes them: Lion, Adagrad and
  // SGD with momentum keep one fp32 tensor beside the master, SGD without none; their nvme rows are not run, their
  // cpu rows count the host's state alike.
  zero::tools::model_summary model;
  model.params = model_params;
  model.largest_layer_params = largest_layer;
  model.largest_param = 250'000;
  model.param_counts = {{250'000, 8}, {500, 8}};
  const std::vector<std::pair<std::string, std::int64_t>> rules = {
      {R"({"type": "Lion", "params": {}})", 1},
      {R"({"type": "Adagrad", "params": {}})", 1},
      {R"({"type": "SGD", "params": {"momentum": 0.9}})", 1},
      {R"({"type": "SGD", "params": {}})", 0}};
  for (const auto& rule : rules) {
    const std::string& block = rule.first;
    const auto cfg =
        zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": )" +
                                      block + R"(, "zero_optimization": {"stage": 2}})",
                                  {.world_size = 2});
    const auto o = zero::tools::estimate_options_from(cfg, model, 2);
    CHECK(o.state_tensors == rule.second);
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(block);
      CAPTURE(stage);
      const auto in_memory = measure(stage, 2, R"("bf16": {"enabled": true},)", "", "", "", block);
      const auto offloaded =
          stage == 0 ? in_memory
                     : measure(stage, 2, R"("bf16": {"enabled": true},)", R"("device": "cpu")", "", "", block);
      for (const auto& r : zero::tools::estimate_memory(o)) {
        if (r.stage != stage || r.offload_param != zero::offload_device::none) {
          continue;
        }
        CHECK(r.implemented == (r.offload_optimizer != zero::offload_device::nvme));
        if (r.offload_optimizer != zero::offload_device::nvme) {
          const auto& m = r.offload_optimizer == zero::offload_device::cpu ? offloaded : in_memory;
          CAPTURE(zero::name_of(r.offload_optimizer));
          check_device_and_host(r, m);
          // AdamW's count would be off by 4 bytes per element of the shard: more than 2% where the state is.
          auto adam = o;
          adam.state_tensors = 2;
          for (const auto& a : zero::tools::estimate_memory(adam)) {
            if (a.stage == stage && a.offload_optimizer == r.offload_optimizer && a.offload_param == r.offload_param) {
              CHECK((r.offload_optimizer == zero::offload_device::none
                         ? relative(a.gpu_model_state_bytes, m.model_state_peak)
                         : relative(a.host_bytes_per_rank, m.host_peak)) > 0.02);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("zero-estimate counts Lamb as AdamW's state, on the device and in host memory, within 2% of the engine; "
          "its nvme rows are not run") {
  zero::tools::model_summary model;
  model.params = model_params;
  model.largest_layer_params = largest_layer;
  model.largest_param = 250'000;
  model.param_counts = {{250'000, 8}, {500, 8}};
  const std::string block = R"({"type": "Lamb", "params": {}})";
  const auto cfg =
      zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true}, "optimizer": )" +
                                    block + R"(, "zero_optimization": {"stage": 2}})",
                                {.world_size = 2});
  const auto o = zero::tools::estimate_options_from(cfg, model, 2);
  CHECK(o.state_tensors == 2);
  CHECK(!o.partial_offload); // its host step waits for every gradient: no split with the device
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const auto in_memory = measure(stage, 2, R"("bf16": {"enabled": true},)", "", "", "", block);
    const auto offloaded =
        stage == 0 ? in_memory
                   : measure(stage, 2, R"("bf16": {"enabled": true},)", R"("device": "cpu")", "", "", block);
    int rows = 0;
    for (const auto& r : zero::tools::estimate_memory(o)) {
      if (r.stage != stage || r.offload_param != zero::offload_device::none) {
        continue;
      }
      CAPTURE(zero::name_of(r.offload_optimizer));
      CHECK(r.implemented == (r.offload_optimizer != zero::offload_device::nvme));
      if (r.offload_optimizer != zero::offload_device::nvme) {
        check_device_and_host(r, r.offload_optimizer == zero::offload_device::cpu ? offloaded : in_memory);
        ++rows;
      }
    }
    CHECK(rows == (stage == 0 ? 1 : 2));
  }
}
