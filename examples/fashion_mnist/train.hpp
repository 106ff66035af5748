#pragma once
// The training run of zero-fashion-mnist: its command-line options, what a run reports, and `train`,
// declared here and compiled once per communicator (train_thread.cpp, train_mpi.cpp, each instantiating
// train_impl.hpp), so the two engines build in parallel and main.cpp builds without either.

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <zero/engine/memory_report.hpp>

#include "idx.hpp"

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
/// evaluates on `test_set`, and returns rank 0's view of the run. Saves and loads checkpoints as `opt`
/// says. \throws config_error for a global batch larger than the training set, and whatever the engine throws.
template <class Comm>
outcome train(Comm& comm, const nlohmann::json& cfg_json, const options& opt, const dataset& train_set,
              const dataset& test_set);

} // namespace fmnist
