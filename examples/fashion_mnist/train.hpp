#pragma once
// zero-fashion-mnist's training run: its command-line options, what a run reports, and `train`, which
// builds the engine over a communicator, trains, evaluates and reports. main.cpp instantiates it over
// in-process ranks; train_mpi.cpp over MPI, so that the two engines compile in parallel.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>
#if ZERO_HAS_CHECKPOINT
#include <zero/checkpoint/checkpoint.hpp>
#endif

#include "idx.hpp"
#include "mlp.hpp"

namespace fmnist {

struct options {
  int ranks = 4;
  std::optional<int> stage;
  std::string stages;
  std::optional<long> steps;
  int epochs = 3;
  std::string config_file;
  std::string data = "/usr/share/datasets/fashion-mnist";
  int hidden = 256;
  bool json = false;
  std::string save;
  long save_every = 0;
  std::string load;
  std::optional<double> timeout; // seconds; overrides the config's comm_timeout
  unsigned offload_threads = 0;  // host AdamW threads under offload_optimizer cpu or nvme; 0: the engine's default
  std::optional<std::string> nvme_path; // overrides offload_optimizer.nvme_path
  // --config auto-plan's budgets; empty: what this machine has
  std::optional<std::string> gpu_memory, host_memory, nvme_budget;
};

struct outcome {
  int stage = 0;
  int ranks = 1;
  double test_accuracy = 0;
  double final_loss = 0;
  long steps = 0;
  double seconds = 0;
  zero::memory_report memory;
};

/// Trains the MLP on `train_set` with the engine `cfg_json` describes over `comm` (every rank calls it),
/// evaluates on `test_set` and returns the run's outcome; saves and loads checkpoints as `opt` says.
/// \throws config_error for a global batch larger than the training set, and what the engine throws.
template <class Comm>
outcome train(Comm& comm, const nlohmann::json& cfg_json, const options& opt, const dataset& train_set,
              const dataset& test_set) {
  zero::config_inputs inputs;
  inputs.world_size = comm.size();
  const auto cfg =
      zero::config::from_json(cfg_json, inputs, opt.config_file.empty() ? "built-in config" : opt.config_file);
  // Every rank's micro-batch is a slice of one global batch drawn from the training set, so a global
  // batch larger than the set has no step to take.
  if (static_cast<std::size_t>(cfg.train_batch_size) > train_set.count) {
    throw zero::config_error("train_batch_size: " + std::to_string(cfg.train_batch_size) + " is larger than the " +
                             std::to_string(train_set.count) + " training samples; expected at most " +
                             std::to_string(train_set.count) + " (micro batch x accumulation x ranks)");
  }
  zero::cpu_backend backend({.threads = comm.size() > 1 ? 1u : 0u});
  zero::engine<zero::cpu_backend, Comm> eng(cfg, comm, backend);
  eng.set_offload_threads(opt.offload_threads);
  if (opt.timeout) {
    // After the engine, which sets the config's comm_timeout: the command line wins.
    comm.set_timeout(std::chrono::milliseconds(std::llround(*opt.timeout * 1000.0)));
  }
  mlp model(eng, {static_cast<int>(train_set.pixels), opt.hidden, opt.hidden / 2, 10});
  eng.finalize();
  model.init();
  long first_step = 0;
#if ZERO_HAS_CHECKPOINT
  if (!opt.load.empty()) {
    // Resume: the checkpoint may come from another stage or number of ranks; the data position is
    // the number of optimizer boundaries it had passed.
    first_step = static_cast<long>(zero::checkpoint::reader(opt.load).info().boundaries);
    eng.load(opt.load);
    if (comm.rank() == 0 && !opt.json) {
      std::printf("resumed from %s at step %ld\n", opt.load.c_str(), first_step);
    }
  }
  auto save = [&](long steps_done) {
    if (!opt.save.empty()) {
      eng.save(opt.save, "step-" + std::to_string(steps_done));
      if (comm.rank() == 0 && !opt.json) {
        std::printf("saved %s/step-%ld\n", opt.save.c_str(), steps_done);
      }
    }
  };
#else
  auto save = [](long) {};
#endif

  const auto micro = static_cast<std::size_t>(cfg.train_micro_batch_size_per_gpu);
  const auto gas = static_cast<std::size_t>(cfg.gradient_accumulation_steps);
  const auto global = static_cast<std::size_t>(cfg.train_batch_size);
  const auto world = static_cast<std::size_t>(comm.size());
  const auto rank = static_cast<std::size_t>(comm.rank());
  const std::size_t per_epoch = train_set.count / global;
  const long total = opt.steps ? *opt.steps : static_cast<long>(per_epoch) * opt.epochs;
  const long print_every = cfg.steps_per_print.value_or(100);

  std::vector<std::size_t> perm(train_set.count);
  std::vector<float> xb(micro * train_set.pixels);
  std::vector<int> yb(micro);
  double window_loss = 0;
  std::size_t window_samples = 0;
  double last_loss = 0;
  const auto start = std::chrono::steady_clock::now();
  auto window_start = start;
  for (long step = first_step; step < total; ++step) {
    const std::size_t in_epoch = static_cast<std::size_t>(step) % per_epoch;
    if (in_epoch == 0 || step == first_step) {
      // The same shuffle on every rank: each takes its own slice of every global batch.
      std::iota(perm.begin(), perm.end(), std::size_t{0});
      std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(step) / per_epoch);
      std::shuffle(perm.begin(), perm.end(), rng);
    }
    zero::step_result r;
    for (std::size_t k = 0; k < gas; ++k) {
      const std::size_t first = in_epoch * global + (k * world + rank) * micro;
      for (std::size_t j = 0; j < micro; ++j) {
        const std::size_t s = perm[first + j];
        std::copy_n(train_set.images.data() + s * train_set.pixels, train_set.pixels, xb.data() + j * train_set.pixels);
        yb[j] = train_set.labels[s];
      }
      int correct = 0;
      {
        auto t = eng.time("forward+backward");
        window_loss += model.run(xb.data(), yb.data(), static_cast<int>(micro), true, eng.loss_scale(), correct);
      }
      window_samples += micro;
      r = eng.step();
    }
    if ((step + 1) % print_every == 0 || step + 1 == total) {
      double sums[2] = {window_loss, static_cast<double>(window_samples)};
      comm.all_reduce(sums, sums, 2, zero::reduce_op::sum).wait();
      last_loss = sums[0] / sums[1];
      const auto now = std::chrono::steady_clock::now();
      const double secs = std::chrono::duration<double>(now - window_start).count();
      if (rank == 0 && !opt.json) {
        std::printf("stage %d step %5ld  loss %.4f  lr %.3e  grad norm %.3f  %.0f samples/s\n", cfg.stage(), step + 1,
                    last_loss, r.lr, r.grad_norm, sums[1] / secs);
        std::fflush(stdout);
      }
      window_loss = 0;
      window_samples = 0;
      window_start = now;
    }
    if (opt.save_every > 0 && (step + 1) % opt.save_every == 0 && step + 1 < total) {
      save(step + 1);
    }
  }
  if (total > first_step) {
    save(total);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // Evaluation: rank r takes the r-th of `world` contiguous slices of the test set (their sizes differ
  // by at most one) and splits it into the same number of batches as every other rank: at stage 3
  // every forward gathers, a collective, so every rank must run as many forwards. Every test image
  // is counted once; the counts are summed over ranks.
  std::int64_t counts[2] = {0, 0};
  const std::size_t eval_batch = 500;
  const std::size_t slice_begin = rank * test_set.count / world;
  const std::size_t slice_end = (rank + 1) * test_set.count / world;
  const std::size_t batches = ((test_set.count + world - 1) / world + eval_batch - 1) / eval_batch;
  auto evaluation = eng.evaluation(); // forward only: stage 3 keeps its training trace intact
  std::vector<float> xe;
  std::vector<int> ye;
  for (std::size_t i = 0; i < batches; ++i) {
    const std::size_t b = slice_begin + i * (slice_end - slice_begin) / batches;
    const std::size_t n = slice_begin + (i + 1) * (slice_end - slice_begin) / batches - b;
    xe.assign(test_set.images.data() + b * test_set.pixels, test_set.images.data() + (b + n) * test_set.pixels);
    ye.assign(test_set.labels.data() + b, test_set.labels.data() + b + n);
    int correct = 0;
    model.run(xe.data(), ye.data(), static_cast<int>(n), false, 1.0, correct);
    counts[0] += correct;
    counts[1] += static_cast<std::int64_t>(n);
  }
  comm.all_reduce(counts, counts, 2, zero::reduce_op::sum).wait();

  outcome o;
  o.stage = cfg.stage();
  o.ranks = comm.size();
  o.test_accuracy = static_cast<double>(counts[0]) / static_cast<double>(counts[1]);
  o.final_loss = last_loss;
  o.steps = total;
  o.seconds = seconds;
  o.memory = eng.memory();
  return o;
}

} // namespace fmnist
