// zero-arena-allocator: zero's engine with an allocator of one's own (docs/allocators.md).
//
// Trains a tiny linear model, y = x . w + b, on 2 in-process ranks at ZeRO stage 2, with every byte of
// model state, every buffer and the backend's memory taken from a bump-pointer arena (arena.hpp):
// `zero::basic_engine<zero::basic_cpu_backend<arena>, zero::thread_communicator, arena>`. Then it trains
// again with arenas too small and prints the memory_error that comes back, which names the tag and
// the bytes asked. Exits 0 when both went as expected.
//
//   zero-arena-allocator

#include "arena.hpp"

#include <cstdio>
#include <span>
#include <string>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>

namespace {

using example::arena;
using backend_type = zero::basic_cpu_backend<arena>;
using engine_type = zero::basic_engine<backend_type, zero::thread_communicator, arena>;

constexpr int ranks = 2;
constexpr int features = 127;
constexpr int samples_per_rank = 8;
constexpr int steps = 5;

/// Stage 2 over the 2 ranks, 8 samples each, in fp32.
constexpr const char* config_json = R"({
  "train_batch_size": 16,
  "optimizer": {"type": "AdamW", "params": {"lr": 0.003, "weight_decay": 0.0}},
  "zero_optimization": {"stage": 2}
})";

/// Feature `i` of sample `s`, and the target the model should learn: small exact numbers.
float feature(int s, int i) { return static_cast<float>((s * 131 + i * 71) % 17 - 8) / 8.0f; }
float target(int s) {
  float y = 0.5f;
  for (int i = 0; i < features; ++i) {
    y += feature(s, i) * static_cast<float>((i * 5) % 7 - 3) / 8.0f;
  }
  return y;
}

/// Trains `steps` steps with an arena of `capacity` bytes per rank; returns rank 0's loss per step and
/// the most bytes its arena ever held.
/// \throws zero::memory_error (from the engine) when the arena is too small.
std::vector<double> train(std::size_t capacity, std::size_t& high_water) {
  std::vector<double> losses;
  zero::run_ranks(ranks, [&](zero::thread_communicator& comm) {
    zero::config_inputs inputs;
    inputs.world_size = ranks;
    const auto cfg = zero::config::from_string(config_json, inputs);
    arena memory(capacity);                       // one block per rank, shared by every copy
    backend_type backend({.threads = 1}, memory); // its kernels work on memory from this arena
    engine_type eng(cfg, comm, backend, memory);  // model state, buffers, working set: all counted
    const int layer = eng.add_module("linear");
    const auto weight = eng.add_param(layer, "linear.weight", {features});
    const auto bias = eng.add_param(layer, "linear.bias", {1});
    eng.finalize(); // allocates everything: throws zero::memory_error naming the tag when the arena is full
    eng.init_params([](const zero::param_info&, std::size_t, std::span<float> out) {
      for (float& x : out) {
        x = 0.0f;
      }
    });

    for (int step = 0; step < steps; ++step) {
      auto on = eng.gather(layer); // free at stage 2; the same code runs at stage 3
      const float* w = eng.param(weight).as<float>();
      const float b = *eng.param(bias).as<float>();
      float* gw = eng.grad(weight).as<float>();
      float* gb = eng.grad(bias).as<float>();
      double loss = 0;
      for (int j = 0; j < samples_per_rank; ++j) {
        const int s = comm.rank() * samples_per_rank + j; // the same samples every step
        float y = b;
        for (int i = 0; i < features; ++i) {
          y += w[i] * feature(s, i);
        }
        const float err = y - target(s);
        loss += double(err) * err / samples_per_rank;
        // The gradient of this rank's mean squared error; the engine averages it over the ranks.
        for (int i = 0; i < features; ++i) {
          gw[i] += 2.0f * err * feature(s, i) / samples_per_rank;
        }
        *gb += 2.0f * err / samples_per_rank;
      }
      eng.grad_ready(bias);
      eng.grad_ready(weight);
      (void)eng.step();
      if (comm.rank() == 0) {
        losses.push_back(loss);
      }
    }
    if (comm.rank() == 0) {
      std::printf("%s", eng.memory().table().c_str());
      high_water = memory.high_water();
    }
  });
  return losses;
}

} // namespace

int main() {
  std::size_t needed = 0;
  try {
    const auto losses = train(std::size_t{1} << 20, needed);
    for (std::size_t t = 0; t < losses.size(); ++t) {
      std::printf("step %zu: loss %.4f (rank 0's samples)\n", t + 1, losses[t]);
    }
    std::printf("the arena of rank 0 held at most %zu of %zu bytes\n", needed, std::size_t{1} << 20);
    if (!(losses.back() < losses.front())) {
      std::fprintf(stderr, "the loss did not fall\n");
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "training failed: %s\n", e.what());
    return 1;
  }

  // An arena a quarter of that size: finalize() runs out of memory.
  const std::size_t small = needed / 4;
  try {
    std::size_t unused = 0;
    (void)train(small, unused);
    std::fprintf(stderr, "an arena of %zu bytes was expected to run out\n", small);
    return 1;
  } catch (const zero::memory_error& e) {
    std::printf("with an arena of %zu bytes: %s\n", small, e.what());
  }
  return 0;
}
