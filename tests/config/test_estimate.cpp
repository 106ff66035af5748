// zero-estimate's arithmetic: DeepSpeed's formulas reproduced to the byte, zero's own accounting
// against the model-state table of docs/design.md, and model descriptions.

#include "support.hpp"
#include "zero/tools/estimate.hpp"
#include "zero/tools/estimate_json.hpp"

#include <doctest/doctest.h>
#include <string>

using zero::offload_device;
using zero_test::has;
namespace zt = zero::tools;

TEST_CASE("DeepSpeed's estimate_zero2_model_states_mem_needs, 7e9 params on 1 node x 8 GPUs") {
  const std::int64_t P = 7'000'000'000;
  // offload_optimizer=cpu: gpu = 2P = 14e9; cpu = P * max(4 * 8 GPUs, 16) * 1.5 = 7e9 * 32 * 1.5 = 336e9.
  auto off = zt::deepspeed_zero2_estimate(P, 8, 1, true);
  CHECK(off.gpu_bytes == 14'000'000'000);
  CHECK(off.cpu_bytes == 336'000'000'000);
  // none: gpu = 2P + int(18P / 8) = 14e9 + 15.75e9 = 29.75e9; cpu = P * 4 * 8 * 1.5 = 336e9.
  auto none = zt::deepspeed_zero2_estimate(P, 8, 1, false);
  CHECK(none.gpu_bytes == 29'750'000'000);
  CHECK(none.cpu_bytes == 336'000'000'000);
}

TEST_CASE("DeepSpeed's estimate_zero3_model_states_mem_needs, 7e9 params, largest layer 131072000, 1 x 8 GPUs") {
  const std::int64_t P = 7'000'000'000;
  const std::int64_t L = 131'072'000; // a 32000 x 4096 embedding
  struct expect {
    bool offload, offload_params, zero_init;
    std::int64_t cpu, gpu;
  };
  // largest_layer_memory = 4L = 524288000; nodes = 1 so gpus_factor = 1.0.
  const expect cases[] = {
      // gpu = 4L; cpu = P * 18 * 1.0 * 1.5 = 189e9
      {true, true, true, 189'000'000'000, 524'288'000},
      // cpu = P * max(4 * 8, 18 * 1.0) * 1.5 = P * 32 * 1.5 = 336e9
      {true, true, false, 336'000'000'000, 524'288'000},
      // gpu = 4L + int(2P / 8) = 524288000 + 1750000000 = 2274288000; cpu = P * 16 * 1.5 = 168e9
      {true, false, true, 168'000'000'000, 2'274'288'000},
      // cpu = P * max(32, 16) * 1.5 = 336e9
      {true, false, false, 336'000'000'000, 2'274'288'000},
      // gpu = 4L + int(18P / 8) = 524288000 + 15750000000 = 16274288000; cpu = L * 4 * 8 * 1.5 = 6291456000
      {false, false, true, 6'291'456'000, 16'274'288'000},
      // cpu = P * 4 * 8 * 1.5 = 336e9
      {false, false, false, 336'000'000'000, 16'274'288'000},
  };
  for (const auto& c : cases) {
    CAPTURE(c.offload);
    CAPTURE(c.offload_params);
    CAPTURE(c.zero_init);
    const auto e = zt::deepspeed_zero3_estimate(P, L, 8, 1, c.offload, c.offload_params, c.zero_init);
    CHECK(e.cpu_bytes == c.cpu);
    CHECK(e.gpu_bytes == c.gpu);
  }
}

TEST_CASE("DeepSpeed's formulas with a fractional node factor, 3 nodes x 3 GPUs") {
  const std::int64_t P = 1'234'567'891;
  const std::int64_t L = 12'345'679;
  // zero2 cpu offload: cpu = P * max(4 * 9, 16) * 1.5 = 44444444076 * 1.5 = 66666666114; gpu = 2P = 2469135782.
  CHECK(zt::deepspeed_zero2_estimate(P, 3, 3, true).cpu_bytes == 66'666'666'114);
  // zero2 none: gpu = 2P + int(18P / 9) = 2469135782 + 2469135782 = 4938271564; cpu = P * 4 * 3 * 1.5 = 22222222038.
  CHECK(zt::deepspeed_zero2_estimate(P, 3, 3, false).gpu_bytes == 4'938'271'564);
  CHECK(zt::deepspeed_zero2_estimate(P, 3, 3, false).cpu_bytes == 22'222'222'038);
  // zero3 offload all, zero_init: cpu = P * 18 * (1/3) * 1.5 = 22222222038 * 0.333.. * 1.5 -> int 11111111019.
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, true, true, true).cpu_bytes == 11'111'111'019);
  // without zero_init: max(4 * 3, 18 / 3 = 6.0) = 12 -> P * 12 * 1.5 = 22222222038.
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, true, true, false).cpu_bytes == 22'222'222'038);
  // offload optimizer only: gpu = 4L + int(2P / 9) = 49382716 + 274348420 = 323731136; cpu = P * 16 / 3 * 1.5 ->
  // 9876543128.
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, true, false, true).gpu_bytes == 323'731'136);
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, true, false, true).cpu_bytes == 9'876'543'128);
  // no offload: gpu = 4L + int(18P / 9) = 49382716 + 2469135782 = 2518518498; cpu = L * 4 * 3 * 1.5 = 222222222.
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, false, false, true).gpu_bytes == 2'518'518'498);
  CHECK(zt::deepspeed_zero3_estimate(P, L, 3, 3, false, false, true).cpu_bytes == 222'222'222);
}

TEST_CASE("the tables read as DeepSpeed prints them") {
  const std::string z2 = zt::deepspeed_zero2_table(7'000'000'000, 8, 1);
  CHECK(z2 == "Estimated memory needed for params, optim states and gradients for a:\n"
              "HW: Setup with 1 node, 8 GPUs per node.\n"
              "SW: Model with 7000M total params.\n"
              "  per CPU  |  per GPU |   Options\n"
              "  312.92GB |  13.04GB | offload_optimizer=cpu \n"
              "  312.92GB |  27.71GB | offload_optimizer=none\n");
  const std::string z3 = zt::deepspeed_zero3_table(7'000'000'000, 131'072'000, 8, 1);
  CHECK(has(z3, "SW: Model with 7000M total params, 131M largest layer params.\n"));
  CHECK(has(z3, "  176.02GB |   0.49GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1\n"));
  CHECK(has(z3, "  312.92GB |   0.49GB | offload_param=cpu , offload_optimizer=cpu , zero_init=0\n"));
  CHECK(has(z3, "  156.46GB |   2.12GB | offload_param=none, offload_optimizer=cpu , zero_init=1\n"));
  CHECK(has(z3, "    5.86GB |  15.16GB | offload_param=none, offload_optimizer=none, zero_init=1\n"));
  CHECK(has(zt::deepspeed_zero2_table(1'000'000, 1, 2), "HW: Setup with 2 nodes, 1 GPU per node.\n"));
}

TEST_CASE("zero's accounting matches the model-state table of docs/design.md") {
  zt::estimate_options o;
  o.params = 7'000'000'000;
  o.gpus_per_node = 8;
  o.nodes = 1;
  o.reduce_bucket_size = 200'000'000;
  o.stage3_prefetch_bucket_size = 50'000'000;
  o.largest_layer_params = 131'072'000;
  const auto rows = zt::estimate_memory(o);
  REQUIRE(rows.size() == 14);
  auto find = [&](int stage, offload_device opt, offload_device par) {
    for (const auto& r : rows) {
      if (r.stage == stage && r.offload_optimizer == opt && r.offload_param == par) {
        return r;
      }
    }
    FAIL("no row");
    return zt::estimate_row{};
  };
  const auto none = offload_device::none;
  const auto cpu = offload_device::cpu;
  // bf16: 2-byte params and grads, K = 12 bytes (fp32 master + m + v); Ψ = 7e9, N = 8, Ψ/N = 875e6.
  // stage 0: (2 + 4 + 12) Ψ = 126e9: bf16 gradients accumulate in fp32 at stage 0, as the config
  // defaults data_types.grad_accum_dtype (DeepSpeed's engine); stages 1-3 keep them in bf16.
  CHECK(find(0, none, none).grad_dtype == zero::dtype::f32);
  CHECK(find(1, none, none).grad_dtype == zero::dtype::bf16);
  CHECK(find(0, none, none).gpu_model_state_bytes == 126'000'000'000);
  CHECK(find(0, none, none).gpu_buffer_bytes == 0);
  // stage 1: (2 + 2) Ψ + 12 Ψ / N = 28e9 + 10.5e9
  CHECK(find(1, none, none).gpu_model_state_bytes == 38'500'000'000);
  // stage 2: 2 Ψ + (2 + 12) Ψ / N = 14e9 + 12.25e9; plus one bf16 bucket of 2e8 elements = 4e8 bytes
  CHECK(find(2, none, none).gpu_model_state_bytes == 26'250'000'000);
  CHECK(find(2, none, none).gpu_buffer_bytes == 400'000'000);
  // With the optimizer offloaded, two staging buffers: one fills while the other's slice goes to the host.
  CHECK(find(2, cpu, none).gpu_buffer_bytes == 2 * 400'000'000);
  CHECK(find(2, none, none).gpu_bytes_per_rank == 26'650'000'000);
  // stage 3: (2 + 12) Ψ / N = 12.25e9: without offload no 16-bit shard is kept (the gathers cast the
  // fp32 master; 16 Ψ / N = 14e9 with stage3_keep_param_shard, below); buffers: it reduces one module at
  // a time, so the staging buffer is the largest module's bf16 gradient, L * 2 = 262144000 (not the
  // reduce bucket), plus the working set (L + prefetch) * 2 = 181072000 * 2 = 362144000
  CHECK(find(3, none, none).gpu_model_state_bytes == 12'250'000'000);
  {
    auto keep = o;
    keep.stage3_keep_param_shard = true;
    for (const auto& r : zt::estimate_memory(keep)) {
      if (r.stage == 3 && r.offload_optimizer == none && r.offload_param == none) {
        CHECK(r.gpu_model_state_bytes == 14'000'000'000);
      }
    }
  }
  CHECK(find(3, none, none).gpu_buffer_bytes == 262'144'000 + 362'144'000);
  // stage 1 + CPU optimizer: the GPU keeps (2 + 2) Ψ = 28e9; each rank's host holds the state and its
  // bf16 gradient and parameter shards, (12 + 2 + 2) Ψ / N = 14e9, x 8 per node (docs/offload.md)
  CHECK(find(1, cpu, none).gpu_model_state_bytes == 28'000'000'000);
  CHECK(find(1, cpu, none).host_bytes_per_node == 112'000'000'000);
  // stage 2 + CPU optimizer: the GPU keeps the parameters, 2 Ψ = 14e9; reduced gradients go to the
  // host during backward
  CHECK(find(2, cpu, none).gpu_model_state_bytes == 14'000'000'000);
  CHECK(find(2, cpu, none).host_bytes_per_node == 112'000'000'000);
  // stage 3 + CPU optimizer: the parameter shard, 2 Ψ / N = 1.75e9, on the GPU
  CHECK(find(3, cpu, none).gpu_model_state_bytes == 1'750'000'000);
  CHECK(find(3, cpu, none).host_bytes_per_node == 112'000'000'000);
  // stage 3 + CPU optimizer and parameters: the GPU keeps no model state; the host holds the parameter
  // shard the gathers upload from and the host AdamW updates in place, (2 + 2 + 12) Ψ / N
  CHECK(find(3, cpu, cpu).gpu_model_state_bytes == 0);
  CHECK(find(3, cpu, cpu).host_bytes_per_node == 8 * 875'000'000LL * 16);
  // The engine runs the optimizer offloaded to the CPU or NVMe at stages 1-3, and the parameters to the
  // CPU or NVMe at stage 3 (tests/config/test_estimate_engine.cpp checks those rows against it).
  CHECK(find(2, none, none).implemented);
  CHECK(find(3, none, none).implemented);
  CHECK(find(1, cpu, none).implemented);
  CHECK(find(2, cpu, none).implemented);
  CHECK(find(3, cpu, none).implemented);
  CHECK(find(3, cpu, cpu).implemented);
  CHECK(find(2, offload_device::nvme, none).implemented);
  CHECK(find(3, offload_device::nvme, none).implemented);
  CHECK(find(3, offload_device::nvme, offload_device::nvme).implemented);
  CHECK(find(3, cpu, offload_device::nvme).implemented);
  // Two slots of the state: a step reads one and writes the other.
  CHECK(find(3, offload_device::nvme, none).nvme_bytes_per_node == 2 * 8 * 875'000'000LL * 12);
  // stage 3 + CPU optimizer and parameters on NVMe: with the default max_in_cpu (1e9 >= Ψ / N) the shard
  // stays in host memory beside the optimizer's (12 + 2 + 2) Ψ / N, and no file or buffer is needed; with
  // max_in_cpu 0 the NVMe holds two slots of it, 2 x 2 Ψ / N per rank, and the host 5 bounce buffers of
  // a layer's slice, L / N = 16384000 elements, instead
  CHECK(find(3, cpu, offload_device::nvme).nvme_bytes_per_node == 0);
  CHECK(find(3, cpu, offload_device::nvme).host_bytes_per_node == 8 * 18 * 875'000'000LL);
  {
    zt::estimate_options all_on_nvme = o;
    all_on_nvme.offload_param_max_in_cpu = 0;
    for (const auto& r : zt::estimate_memory(all_on_nvme)) {
      if (r.stage == 3 && r.offload_optimizer == cpu && r.offload_param == offload_device::nvme) {
        CHECK(r.nvme_bytes_per_node == 8 * 2 * 2 * 875'000'000LL);
        CHECK(r.host_bytes_per_node == 8 * (16 * 875'000'000LL + 5 * 16'384'000LL * 2));
        CHECK(r.gpu_model_state_bytes == 0); // the gradients stream to the host, the shard is on NVMe
      }
    }
  }

  SUBCASE("fp32 parameters are their own master copy") {
    o.param_dtype = zero::dtype::f32;
    o.grad_dtype = zero::dtype::f32;
    const auto r = zt::estimate_memory(o);
    // stage 0: (4 + 4 + 8) Ψ
    CHECK(r[0].gpu_model_state_bytes == 16 * 7'000'000'000LL);
  }
  SUBCASE("shards round up") {
    o.params = 10;
    o.gpus_per_node = 3;
    o.largest_layer_params = 0;
    const auto r = zt::estimate_memory(o);
    // stage 3: S = ceil(10 / 3) = 4, 14 bytes each (no 16-bit shard kept: 2 of gradients, 12 of state)
    CHECK(r[7].stage == 3);
    CHECK(r[7].gpu_model_state_bytes == 56);
  }
  SUBCASE("bad options") {
    o.nodes = 0;
    CHECK_THROWS_AS(static_cast<void>(zt::estimate_memory(o)), zero::usage_error);
  }
  SUBCASE("the --json object") {
    const auto j = zt::estimate_json(o, rows);
    CHECK(j["params"] == 7'000'000'000);
    CHECK(j["gpus"] == 8);
    CHECK(j["rows"].size() == 14);
    CHECK(j["rows"][0]["stage"] == 0);
    CHECK(j["rows"][0]["offload_optimizer"] == "none");
    CHECK(j["rows"][0]["gpu_bytes_per_rank"] == 126'000'000'000);
    CHECK(j["rows"][0]["grad_dtype"] == "fp32");
    CHECK(j["grad_dtype"] == "default");
    CHECK(j["rows"][0].contains("host_bytes_per_node"));
  }
}

TEST_CASE("model descriptions: GPT-2 small has 124439808 parameters, the largest module is wte") {
  const auto m = zt::read_model_description_file(zero_test::data("model_gpt2_small.json"));
  // wte 50257*768 = 38597376; wpe 1024*768 = 786432; 12 blocks of 7087872; ln_f 1536.
  CHECK(m.params == 124'439'808);
  CHECK(m.largest_layer_params == 38'597'376);
  CHECK(m.largest_layer == "wte");
  CHECK(m.modules == 15);
  CHECK(m.name == "gpt2-small");
}

TEST_CASE("model descriptions: every mistake names its JSON path") {
  auto error_of = [](std::string_view text) -> std::string {
    try {
      static_cast<void>(zt::read_model_description(nlohmann::json::parse(text)));
    } catch (const zero::config_error& e) {
      return e.what();
    }
    FAIL("expected a config_error");
    return {};
  };
  CHECK(has(error_of(R"({"modules": [{"name": "a", "params": [{"name": "w", "shape": [4, 0]}]}]})"),
            "modules[0].params[0].shape[1]: found 0; expected an integer >= 1"));
  CHECK(has(error_of(R"({"modules": [{"name": "a", "parms": []}]})"),
            "modules[0].parms: unknown key (did you mean \"params\"?)"));
  CHECK(has(error_of(R"({"modulez": []})"), "modulez: unknown key (did you mean \"modules\"?)"));
  CHECK(has(error_of(R"({"modules": []})"), "modules: found []; expected a non-empty array of modules"));
  CHECK(has(error_of(R"({"modules": [{"params": [{"shape": "4x4"}]}]})"),
            "modules[0].params[0].shape: found \"4x4\"; expected an array"));
  CHECK(has(error_of(R"({"modules": [{"repeat": 0, "params": []}]})"),
            "modules[0].repeat: found 0; expected an integer from 1 to 1000000"));
  CHECK(has(error_of(R"({"modules": [{"params": [{"shape": [4611686018427387903, 4]}]}]})"), "overflows"));
}

TEST_CASE("parameter counts as people write them") {
  CHECK(zt::parse_count("7e9") == 7'000'000'000);
  CHECK(zt::parse_count("7000000000") == 7'000'000'000);
  CHECK(zt::parse_count("6.7B") == 6'700'000'000);
  CHECK(zt::parse_count("125M") == 125'000'000);
  CHECK(zt::parse_count("350k") == 350'000);
  CHECK(zt::parse_count("1.5T") == 1'500'000'000'000);
  CHECK_THROWS_AS(static_cast<void>(zt::parse_count("7x")), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zt::parse_count("0")), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zt::parse_count("2.5")), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zt::parse_count("")), zero::usage_error);
}

TEST_CASE("a parameter larger than a bucket, and persistent parameters, size the gradient staging buffers") {
  zt::estimate_options o;
  o.params = 1'000'000'000;
  o.largest_layer_params = 100'000'000;
  o.gpus_per_node = 4;
  o.reduce_bucket_size = 50'000'000;
  auto find = [](const zt::estimate_options& opts, int stage, offload_device opt) {
    for (const auto& r : zt::estimate_memory(opts)) {
      if (r.stage == stage && r.offload_optimizer == opt && r.offload_param == offload_device::none) {
        return r;
      }
    }
    FAIL("no row");
    return zt::estimate_row{};
  };
  // Unknown: stage 2 stages one bucket of bf16 gradients, stage 3 one module's and its working set
  // (min(1e9, 1e9 max live, 1e8 + 5e7 prefetch) x 2 bytes).
  CHECK(find(o, 2, offload_device::none).gpu_buffer_bytes == 100'000'000);
  CHECK(find(o, 3, offload_device::none).gpu_buffer_bytes == 200'000'000 + 300'000'000);
  // An 80e6-element parameter is a segment of its own at stage 2: the staging buffer holds it, and so
  // do NVMe's chunk buffers (its slice, 20e6 elements, is larger than a chunk of 2^21).
  const std::int64_t chunk_buffers = 4 * (std::int64_t{1} << 21) * 12;
  const std::int64_t nvme_host_before = find(o, 2, offload_device::nvme).host_bytes_per_rank;
  o.largest_param_params = 80'000'000;
  CHECK(find(o, 2, offload_device::none).gpu_buffer_bytes == 160'000'000);
  CHECK(find(o, 2, offload_device::nvme).host_bytes_per_rank == nvme_host_before);
  o.nvme_chunk_elements = 1'000'000'000;
  CHECK(find(o, 2, offload_device::nvme).host_bytes_per_rank == nvme_host_before - chunk_buffers + 4 * 20'000'000 * 12);
  // Persistent parameters stage in a second buffer of a module's size at stage 3.
  o.persistent_params = 1000;
  CHECK(find(o, 3, offload_device::none).gpu_buffer_bytes == 2 * 200'000'000 + 300'000'000);
  o.persistent_params = o.params + 1;
  CHECK_THROWS_AS(static_cast<void>(zt::estimate_memory(o)), zero::usage_error);
}
