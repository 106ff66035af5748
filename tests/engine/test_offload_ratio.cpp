// Partial optimizer offload (`offload_optimizer.ratio` below 1 with device cpu) and its automatic
// choice: how each rank's state is split between the device and host memory, what the memory report
// says of it, state reads across the split, and "auto" from given and measured update rates. That the
// split trains to the bits of the in-memory optimizer is in test_offload.cpp.

#include "engine_harness.hpp"
#include "zero/engine/step/update_rates.hpp"

#include <cmath>
#include <doctest/doctest.h>
#include <functional>

using zero::dtype;

namespace {

using ratio_engine = zero::engine<zero::cpu_backend, zero::thread_communicator>;

/// On `world` ranks: an engine with 3 modules of one 100 x 1000 bf16 weight, reduce buckets of
/// 100 000 elements and `zero_keys` in zero_optimization (the stage first); `before(eng)` runs before
/// finalize, `after(eng, comm)` after one applied step.
void with_wide_engine(int world, const std::string& zero_keys, const std::function<void(ratio_engine&)>& before,
                      const std::function<void(ratio_engine&, zero::thread_communicator&)>& after) {
  zero::run_ranks(world, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    zero::config_inputs inputs;
    inputs.world_size = world;
    const auto cfg = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"reduce_bucket_size": 100000, )" +
                                                   zero_keys + "}}",
                                               inputs);
    ratio_engine eng(cfg, comm, backend);
    eng.set_offload_threads(1);
    std::vector<zero::param_handle> ps;
    for (int k = 0; k < 3; ++k) {
      const int m = eng.add_module("m" + std::to_string(k));
      ps.push_back(eng.add_param(m, "w" + std::to_string(k), {100, 1000}));
    }
    before(eng);
    eng.finalize();
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 0.5f); });
    for (std::size_t k = ps.size(); k-- > 0;) {
      auto on = eng.gather(static_cast<int>(k));
      eng.grad_ready(ps[k]);
    }
    CHECK(eng.step().applied);
    after(eng, comm);
  });
}

std::string cpu_ratio(int stage, const std::string& ratio) {
  return R"("stage": )" + std::to_string(stage) + R"(, "offload_optimizer": {"device": "cpu", "ratio": )" + ratio + "}";
}

} // namespace

TEST_CASE("partial offload keeps 1 - ratio of the optimizer state on the device and ratio of it in host memory") {
  for (int stage : {1, 2, 3}) {
    for (double ratio : {0.3, 0.7}) {
      CAPTURE(stage);
      CAPTURE(ratio);
      with_wide_engine(
          2, cpu_ratio(stage, std::to_string(ratio)), [](ratio_engine&) {},
          [&](ratio_engine& eng, zero::thread_communicator&) {
            const std::size_t state = eng.optimizer().state_size();
            const auto& split = eng.optimizer_split();
            const std::size_t host = split.host_elements;
            CHECK(eng.optimizer().partial() != nullptr);
            CHECK(split.ratio == ratio);
            CHECK(split.state_elements == state);
            CHECK(host == zero::offloaded_state_elements(ratio, state));
            CHECK(std::abs(static_cast<double>(host) - ratio * static_cast<double>(state)) <=
                  zero::partial_offload_granule / 2.0);
            CHECK_FALSE(split.rates.has_value());
            const auto r = eng.memory();
            // bf16: fp32 master, m, v (12 B) per element on its side; the host part stages its bf16
            // gradients and parameters (2 + 2 B) too.
            CHECK(r.optimizer == 12 * (state - host));
            CHECK(r.optimizer_peak == 12 * (state - host));
            CHECK(r.host_optimizer == 12 * host);
            CHECK(r.host_grads == 2 * host);
            CHECK(r.host_params == 2 * host);
            CHECK(r.offload_ratio == static_cast<double>(host) / static_cast<double>(state));
            CHECK(static_cast<double>(r.host_peak) == doctest::Approx(r.host_formula).epsilon(0.02));
            CHECK(static_cast<double>(r.model_state_peak) == doctest::Approx(r.formula).epsilon(0.02));
            CHECK(r.table().find("partial offload") != std::string::npos);
          });
    }
  }
}

TEST_CASE("with forward_overlap the host part's gradients stream to the host during backward: the device keeps "
          "the gradients of the device part only") {
  // Two ranks: three segments of 100 000 elements, 50 000 a rank each; half of the state puts the
  // split inside the second segment, so the device part reads the first one and part of the second.
  for (int stage : {2, 3}) {
    for (bool overlap : {false, true}) {
      CAPTURE(stage);
      CAPTURE(overlap);
      const std::string keys = R"("stage": )" + std::to_string(stage) +
                               R"(, "offload_optimizer": {"device": "cpu", "ratio": 0.5, "forward_overlap": )" +
                               (overlap ? "true" : "false") + "}";
      with_wide_engine(
          2, keys, [](ratio_engine&) {},
          [&](ratio_engine& eng, zero::thread_communicator&) {
            const std::size_t host = eng.optimizer_split().host_elements;
            const auto& segs = eng.layout().segments();
            REQUIRE(segs.size() == 3);
            // The split in the second segment.
            REQUIRE(host > segs[2].slice);
            REQUIRE(host < segs[1].slice + segs[2].slice);
            const auto r = eng.memory();
            CHECK(r.host_grads == 2 * host);
            // bf16 gradients: without the overlap every segment's slice is kept on the device for the
            // step; with it the device part's elements: segment 0's slice and the start of segment 1's.
            const std::size_t split = eng.optimizer().partial()->split();
            CHECK(split > segs[0].slice);
            const std::size_t kept = overlap ? split : segs[0].slice + segs[1].slice + segs[2].slice;
            CHECK(r.grads_peak == 2 * kept);
            CHECK(eng.optimizer().host_part()->async_steps() == (overlap ? 1U : 0U));
          });
    }
  }
}

TEST_CASE("ratio 0 keeps the whole optimizer on the device and ratio 1 in host memory, as DeepSpeed") {
  with_wide_engine(
      1, cpu_ratio(2, "0"), [](ratio_engine&) {},
      [](ratio_engine& eng, zero::thread_communicator&) {
        CHECK(eng.optimizer().device() != nullptr);
        CHECK(eng.optimizer_split().ratio == 0.0);
        CHECK(eng.optimizer_split().host_elements == 0);
        const auto r = eng.memory();
        CHECK(r.host_peak == 0);
        CHECK(r.offload_ratio == 0.0);
        CHECK(r.optimizer == 12 * eng.optimizer().state_size());
      });
  with_wide_engine(
      1, cpu_ratio(2, "1"), [](ratio_engine&) {},
      [](ratio_engine& eng, zero::thread_communicator&) {
        CHECK(eng.optimizer().host() != nullptr);
        CHECK(eng.optimizer_split().host_elements == eng.optimizer().state_size());
        CHECK(eng.memory().optimizer == 0);
        CHECK(eng.memory().offload_ratio == 1.0);
      });
}

TEST_CASE("the split falls inside an owned range; state reads and writes reach both sides of it") {
  // One rank at stage 2: three ranges of 100 000 elements; half of them puts the split inside the second.
  with_wide_engine(
      1, cpu_ratio(2, "0.5"), [](ratio_engine&) {},
      [](ratio_engine& eng, zero::thread_communicator&) {
        auto& opt = eng.optimizer();
        const auto* both = opt.partial();
        REQUIRE(both != nullptr);
        const std::size_t split = both->split();
        REQUIRE(opt.ranges().size() == 3);
        const auto& [range, offset] = opt.ranges()[1];
        CHECK(offset < split);
        CHECK(split < offset + range.size());
        CHECK(both->device().state_size() == split);
        CHECK(both->host().state_size() == opt.state_size() - split);
        // The range is stepped by both sides: its first part on the device, the rest on the host.
        CHECK(both->device().ranges()[1].first.size() + both->host().ranges()[1].first.size() == range.size());
        CHECK(both->device().ranges()[2].first.empty());
        CHECK(both->host().ranges()[0].first.empty());
        CHECK(opt.runs().back().state_offset + opt.runs().back().flat.size() == opt.state_size());
        const std::vector<float> values{1, 2, 3, 4, 5, 6};
        opt.write_state(zero::state_tensor::exp_avg, split - 3, values);
        std::vector<float> back(6);
        opt.read_state(zero::state_tensor::exp_avg, split - 3, back);
        CHECK(back == values);
        std::vector<float> device_side(3), host_side(3);
        opt.partial()->device().read_state(zero::state_tensor::exp_avg, split - 3, device_side);
        opt.partial()->host().read_state(zero::state_tensor::exp_avg, 0, host_side);
        CHECK(device_side == std::vector<float>{1, 2, 3});
        CHECK(host_side == std::vector<float>{4, 5, 6});
        CHECK_THROWS_WITH_AS(opt.read_state(zero::state_tensor::master, opt.state_size() - 2, back),
                             doctest::Contains("partial_adamw::read_state: state elements"), zero::usage_error);
      });
}

TEST_CASE("balanced_offload_ratio: the host's part, copies included, takes as long as the device's") {
  // Seconds per element: device d = 1 / device, host h = 1 / host + G / to_host + P / to_device.
  CHECK(zero::balanced_offload_ratio({.device = 1e9, .host = 1e9}, dtype::bf16, dtype::bf16) == doctest::Approx(0.5));
  CHECK(zero::balanced_offload_ratio({.device = 3e9, .host = 1e9}, dtype::bf16, dtype::bf16) == doctest::Approx(0.25));
  CHECK(zero::balanced_offload_ratio({.device = 1e9, .host = 3e9}, dtype::bf16, dtype::bf16) == doctest::Approx(0.75));
  // bf16 gradients down and parameters up at 4 B/ns: 1 ns more per element on the host.
  CHECK(zero::balanced_offload_ratio({.device = 1e9, .host = 1e9, .to_host = 4e9, .to_device = 4e9}, dtype::bf16,
                                     dtype::bf16) == doctest::Approx(1.0 / 3.0));
  // fp32 moves twice the bytes.
  CHECK(zero::balanced_offload_ratio({.device = 1e9, .host = 1e9, .to_host = 4e9, .to_device = 4e9}, dtype::f32,
                                     dtype::f32) == doctest::Approx(0.25));
  CHECK_THROWS_WITH_AS(
      static_cast<void>(zero::balanced_offload_ratio({.device = 0, .host = 1}, dtype::f32, dtype::f32)),
      "[zero.usage_error] balanced_offload_ratio: update_rates::device is 0.000000; expected AdamW "
      "elements per second > 0",
      zero::usage_error);
  CHECK_THROWS_WITH_AS(
      static_cast<void>(zero::balanced_offload_ratio({.device = 1, .host = NAN}, dtype::f32, dtype::f32)),
      doctest::Contains("update_rates::host is nan"), zero::usage_error);
  CHECK_THROWS_WITH_AS(
      static_cast<void>(zero::balanced_offload_ratio({.device = 1, .host = 1, .to_host = -1}, dtype::f32, dtype::f32)),
      doctest::Contains("update_rates::to_host is -1.000000; expected bytes per second >= 0"), zero::usage_error);
}

TEST_CASE("ratio \"auto\" picks the split from the update rates the program gives") {
  struct given {
    zero::update_rates rates;
    double ratio;
  };
  // bf16 parameters and gradients: 2 B each way per element.
  for (const given g : {given{{.device = 3e9, .host = 1e9}, 0.25}, given{{.device = 1e9, .host = 3e9}, 0.75},
                        given{{.device = 1e9, .host = 1e9, .to_host = 4e9, .to_device = 4e9}, 1.0 / 3.0}}) {
    CAPTURE(g.ratio);
    with_wide_engine(
        2, cpu_ratio(3, R"("auto")"), [&](ratio_engine& eng) { eng.set_offload_rates(g.rates); },
        [&](ratio_engine& eng, zero::thread_communicator&) {
          const auto& split = eng.optimizer_split();
          CHECK(split.ratio == doctest::Approx(g.ratio));
          CHECK_FALSE(split.measured);
          REQUIRE(split.rates.has_value());
          CHECK(split.rates->device == g.rates.device);
          CHECK(split.host_elements == zero::offloaded_state_elements(split.ratio, split.state_elements));
          CHECK(eng.optimizer().partial() != nullptr);
          CHECK(eng.memory().offload_ratio ==
                static_cast<double>(split.host_elements) / static_cast<double>(split.state_elements));
        });
  }
}

TEST_CASE("ratio \"auto\" without given rates measures them on this machine at finalize") {
  with_wide_engine(
      1, cpu_ratio(2, R"("auto")"), [](ratio_engine&) {},
      [](ratio_engine& eng, zero::thread_communicator&) {
        const auto& split = eng.optimizer_split();
        CHECK(split.measured);
        REQUIRE(split.rates.has_value());
        const auto& r = *split.rates;
        CHECK(r.device > 0);
        CHECK(r.host > 0);
        CHECK(r.to_host > 0); // cpu_backend copies (memcpy), and the host part pays for it
        CHECK(r.to_device > 0);
        CHECK(split.ratio == zero::balanced_offload_ratio(r, dtype::bf16, dtype::bf16));
        CHECK(split.ratio > 0);
        CHECK(split.ratio < 1);
      });
}

TEST_CASE("measure_update_rates times AdamW and the copies; a bad sample is refused") {
  zero::cpu_backend backend({.threads = 1});
  const auto r = zero::measure_update_rates(
      backend, zero::host_allocator{},
      {.param = dtype::f16, .grad = dtype::f32, .elements = 4096, .host_threads = 1, .min_seconds = 0.001});
  CHECK(std::isfinite(r.device));
  CHECK(r.device > 0);
  CHECK(r.host > 0);
  CHECK(r.to_host > 0);
  CHECK(r.to_device > 0);
  CHECK_THROWS_WITH_AS(static_cast<void>(zero::measure_update_rates(backend, zero::host_allocator{},
                                                                    {.elements = 0, .host_threads = 1})),
                       doctest::Contains("measure_update_rates: a sample of 0 elements on 1 host threads"),
                       zero::usage_error);
}

TEST_CASE("the engine refuses bad update rates, rates after finalize, and ratios the reader would refuse") {
  zero::run_ranks(1, [](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    auto cfg = zero::config::from_string(R"({"train_batch_size": 1, "optimizer": {"type": "AdamW", "params": {}},
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": "auto"}}})");
    ratio_engine eng(cfg, comm, backend);
    CHECK_THROWS_WITH_AS(eng.set_offload_rates({.device = 1e9, .host = -2}),
                         doctest::Contains("update_rates::host is -2.000000"), zero::usage_error);
    eng.add_param(eng.add_module("m"), "w", {8});
    eng.set_offload_rates({.device = 1e9, .host = 1e9});
    eng.finalize();
    CHECK_THROWS_WITH_AS(eng.set_offload_rates({.device = 1e9, .host = 1e9}),
                         doctest::Contains("set_offload_rates after finalize()"), zero::usage_error);
    // What the reader refuses, in a config built in code.
    cfg.zero_optimization.offload_optimizer.ratio_auto = false;
    cfg.zero_optimization.offload_optimizer.ratio = 1.5;
    CHECK_THROWS_WITH_AS(ratio_engine(cfg, comm, backend),
                         doctest::Contains("zero_optimization.offload_optimizer.ratio: 1.5; expected a number "
                                           ">= 0 and <= 1"),
                         zero::config_error);
    cfg.zero_optimization.offload_optimizer.ratio = 0.5;
    cfg.zero_optimization.offload_optimizer.device = zero::offload_device::nvme;
    cfg.zero_optimization.offload_optimizer.nvme_path = "/tmp";
    CHECK_THROWS_WITH_AS(ratio_engine(cfg, comm, backend),
                         doctest::Contains("ratio: found 0.5 with device \"nvme\"; a ratio below 1 keeps part of the "
                                           "optimizer state on the device and the rest in host memory, which needs "
                                           "device \"cpu\""),
                         zero::config_error);
    // A partial offload writes the parameters through the shard in memory: not with the shard in a file.
    cfg.zero_optimization.offload_optimizer.device = zero::offload_device::cpu;
    cfg.zero_optimization.stage = 3;
    cfg.zero_optimization.offload_param.device = zero::offload_device::nvme;
    cfg.zero_optimization.offload_param.nvme_path = "/tmp";
    CHECK_THROWS_WITH_AS(ratio_engine(cfg, comm, backend),
                         doctest::Contains("ratio: 0.5 with offload_param \"nvme\"; a partial offload needs the "
                                           "parameter shard in memory"),
                         zero::config_error);
  });
}

TEST_CASE("ratio \"auto\" trains to the bits of the in-memory optimizer, whatever it measured") {
  zero::testing::run_spec s{.stage = 2, .world = 2, .type = dtype::bf16, .accumulation = 2, .clip = 1.0};
  const auto want = zero::testing::train_with_engine(s);
  s.zero_extra = R"("offload_optimizer": {"device": "cpu", "ratio": "auto"})";
  const auto got = zero::testing::train_with_engine(s);
  CHECK(got.params == want.params);
  CHECK(got.norms == want.norms);
}
