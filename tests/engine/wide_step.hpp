#pragma once
// One applied step of a model big enough that padding is a small part of it, and the memory each rank reports
// after it (tests/engine/test_offload.cpp, test_offload_delayed.cpp).

#include "zero/zero.hpp"

#include <array>
#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace zero::testing {

/// What one applied step of a model big enough that padding is a small part of it, 3 modules of one
/// 100 x 1000 bf16 weight on 2 ranks, leaves per rank: the memory report, whether the optimizer is
/// offloaded, and the host bytes of stage 3's shard (0 when it is on the device).
struct wide_step {
  std::vector<zero::memory_report> reports = std::vector<zero::memory_report>(2);
  std::array<bool, 2> offloaded{}; // one byte each: the rank threads write their own (a vector<bool> packs them)
  std::vector<std::size_t> shard_host = std::vector<std::size_t>(2);
};

/// `wide_step` with `zero_keys` in zero_optimization (the stage first).
inline wide_step step_a_wide_model(const std::string& zero_keys) {
  wide_step out;
  zero::run_ranks(2, [&](zero::thread_communicator& comm) {
    const auto rank = static_cast<std::size_t>(comm.rank());
    zero::cpu_backend backend({.threads = 1});
    auto cfg = zero::config::from_string(R"({"train_batch_size": 2, "bf16": {"enabled": true},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {)" +
                                         zero_keys + "}}");
    zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
    std::vector<zero::param_handle> ps;
    for (int k = 0; k < 3; ++k) {
      const int m = eng.add_module("m" + std::to_string(k));
      ps.push_back(eng.add_param(m, "w" + std::to_string(k), {100, 1000}));
    }
    eng.finalize();
    out.offloaded[rank] = eng.optimizer().offloaded();
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 0.5f); });
    for (std::size_t k = 0; k < ps.size(); ++k) {
      auto on = eng.gather(static_cast<int>(k));
      CHECK(eng.param(ps[k]).as<zero::bf16>()[7] == zero::bf16(0.5f));
      eng.grad_ready(ps[k]);
    }
    CHECK(eng.step().applied);
    out.reports[rank] = eng.memory();
    if (const auto* c = eng.coordinator(); c != nullptr && c->host_memory() != nullptr) {
      out.shard_host[rank] = c->host_memory()->live(zero::memory_tag::params);
    }
  });
  return out;
}

} // namespace zero::testing
