// zero-fashion-mnist: a data-parallel MLP trained on Fashion-MNIST with zero's ZeRO stages.
//
//   zero-fashion-mnist --ranks 4 --stage 2            in-process ranks (thread_communicator)
//   mpirun -np 4 zero-fashion-mnist --stage 2         one process per rank (mpi_communicator)
//   zero-fashion-mnist --ranks 4 --stages all         every stage, then a table
//   zero-fashion-mnist --stage 2 --steps 500 --save ckpt --save-every 100
//   zero-fashion-mnist --stage 3 --ranks 2 --steps 900 --load ckpt    resume (any stage, any ranks)
//   mpirun -np 2 zero-fashion-mnist --timeout 30      report a stopped rank after 30 s (default 300)
//   zero-fashion-mnist --ranks 2 --config offload_cpu.json    ZeRO-Offload: optimizer state in host memory
//   zero-fashion-mnist --ranks 8 --config stage3_zeropp.json  stage 3 with ZeRO++ (qwZ, qgZ, hpZ)
//   zero-fashion-mnist --ranks 2 --config lion.json        Lion (or sgd.json, adagrad.json; docs/optimizers.md)
//   zero-fashion-mnist --ranks 2 --config offload_nvme.json --nvme-path /mnt/nvme/zero
//                                                       ZeRO-Infinity: optimizer state in a file per rank
//   zero-fashion-mnist --ranks 2 --config auto-plan     the fastest setting that fits this machine
//   zero-fashion-mnist --ranks 2 --config auto-plan --gpu-memory 1.5MB --host-memory 64MiB
//                                                       ... that fits these budgets (zero-estimate --plan)
//
// The framework (mlp.hpp) keeps its own forward and backward; zero owns parameters, gradients and
// optimizer state, reduces gradients bucket by bucket and steps AdamW on each rank's shard.

#include <CLI/CLI.hpp>
#include <cblas.h>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>
#include <zero/tools/nvme_folders.hpp>
#include <zero/tools/plan.hpp>
#include <zero/tools/probes.hpp>
#if ZERO_HAS_MPI
#include <zero/comm/mpi_communicator.hpp>
#endif
#if ZERO_HAS_CHECKPOINT
#include <zero/checkpoint/checkpoint.hpp>
#endif

#include "idx.hpp"
#include "train.hpp"

#if ZERO_HAS_MPI
// The MPI engine compiles in train_mpi.cpp.
extern template fmnist::outcome fmnist::train<zero::mpi_communicator>(zero::mpi_communicator&, const nlohmann::json&,
                                                                      const fmnist::options&, const fmnist::dataset&,
                                                                      const fmnist::dataset&);
#endif

extern "C" void openblas_set_num_threads(int);

namespace {

using fmnist::options;
using fmnist::outcome;
using fmnist::train;

// The config used without --config: what a DeepSpeed user would write for this model.
constexpr const char* default_config = R"({
  "train_micro_batch_size_per_gpu": 64,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 100,
  "gradient_clipping": 1.0,
  "bf16": {"enabled": true},
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3, "warmup_num_steps": 50,
                                                "warmup_type": "linear"}},
  "zero_optimization": {"stage": 2, "reduce_bucket_size": 50000, "allgather_bucket_size": 50000,
                        "overlap_comm": true, "contiguous_gradients": true,
                        "stage3_param_persistence_threshold": 1000, "stage3_prefetch_bucket_size": 100000,
                        "stage3_max_live_parameters": 300000, "stage3_max_reuse_distance": 0}
})";

/// The value of --config that plans the run instead of reading a file.
constexpr const char* auto_plan = "auto-plan";
/// Fashion-MNIST's images are 28 x 28: the model's input width, which the plan needs before the data loads.
constexpr int fmnist_pixels = 28 * 28;

void report(const outcome& o, bool json) {
  const auto& m = o.memory;
  if (json) {
    nlohmann::json j{{"stage", o.stage},
                     {"ranks", o.ranks},
                     {"steps", o.steps},
                     {"seconds", o.seconds},
                     {"final_loss", o.final_loss},
                     {"test_accuracy", o.test_accuracy},
                     {"parameters", m.parameters},
                     {"model_state_bytes_per_rank", m.model_state_peak},
                     {"formula_bytes_per_rank", m.formula},
                     {"ratio_to_formula", m.ratio()},
                     {"params_bytes", m.params_peak},
                     {"grads_bytes", m.grads_peak},
                     {"optimizer_bytes", m.optimizer_peak},
                     {"buffer_bytes_peak", m.buffers_peak},
                     {"working_set_peak_bytes", m.working_set_peak},
                     {"offloaded", m.host_formula > 0},
                     {"host_params_bytes", m.host_params},
                     {"host_grads_bytes", m.host_grads},
                     {"host_optimizer_bytes", m.host_optimizer},
                     {"host_peak_bytes", m.host_peak},
                     {"host_formula_bytes", m.host_formula},
                     {"host_buffers_bytes", m.host_buffers},
                     {"nvme_bytes", m.nvme}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("stage %d: test accuracy %.2f%% after %ld steps in %.1f s\n%s", o.stage, 100 * o.test_accuracy, o.steps,
                o.seconds, m.table().c_str());
  }
  std::fflush(stdout);
}

/// --config auto-plan: the fastest stage and offload setting for this model on `world` ranks that fits
/// the budgets (--gpu-memory, --host-memory, --nvme; by default the host's available memory for both,
/// the CPU backend's device memory being the host's, and the free space of --nvme-path), by the rates
/// measured now (zero/tools/probes.hpp). Prints the plan (to stderr with --json) and merges its config
/// block into `base`. \throws usage_error when nothing fits, or for a bad byte count.
void plan_run(const options& opt, int world, nlohmann::json& base) {
  namespace zt = zero::tools;
  const zero::config cfg = zero::config::from_json(base, {.world_size = world}, "built-in config");
  // The model mlp.hpp registers: a module per Linear layer, its weight and its bias.
  const std::vector<std::int64_t> dims = {fmnist_pixels, opt.hidden, opt.hidden / 2, 10};
  std::vector<std::vector<std::int64_t>> modules;
  for (std::size_t l = 0; l + 1 < dims.size(); ++l) {
    modules.push_back({dims[l] * dims[l + 1], dims[l + 1]});
  }
  const auto model = zt::summarize_modules(modules);
  const auto o = zt::estimate_options_from(cfg, model, world);
  if (opt.nvme_path) {
    // Created if missing, as for a config with offload_optimizer nvme: the storage is measured there.
    std::filesystem::create_directories(*opt.nvme_path);
  }
  zt::memory_budget budget;
  budget.device_bytes = opt.gpu_memory ? zt::parse_bytes(*opt.gpu_memory) : zt::available_host_memory();
  budget.host_bytes = opt.host_memory ? zt::parse_bytes(*opt.host_memory) : zt::available_host_memory();
  budget.nvme_bytes = opt.nvme_budget ? zt::parse_bytes(*opt.nvme_budget)
                      : opt.nvme_path ? zt::free_storage_bytes(*opt.nvme_path)
                                      : 0;
  zero::cpu_backend device({.threads = 0});
  const auto rates =
      zt::measure_rates(device, "cpu", {.bytes = std::size_t{16} << 20, .repeats = 2},
                        opt.nvme_path ? std::optional<std::filesystem::path>(*opt.nvme_path) : std::nullopt);
  const auto plan = zt::make_plan(o, rates, budget);
  std::FILE* out = opt.json ? stderr : stdout;
  std::fprintf(out,
               "auto-plan for %lld parameters on %d rank(s); budgets: %s per rank, %s of host memory, %s of NVMe\n%s",
               static_cast<long long>(model.params), world, zt::show_bytes(budget.device_bytes).c_str(),
               zt::show_bytes(budget.host_bytes).c_str(), zt::show_bytes(budget.nvme_bytes).c_str(),
               zt::plan_table(plan).c_str());
  if (!plan.chosen) {
    throw zero::usage_error("--config auto-plan: no setting fits the budgets (--gpu-memory, --host-memory, --nvme)");
  }
  const auto block = zt::plan_config_block(plan.ranked[*plan.chosen].row, o, opt.nvme_path.value_or(""));
  std::fprintf(out, "config block:\n%s\n", block.dump(2).c_str());
  std::fflush(out);
  base.merge_patch(block);
}

/// A whole number >= 1 (CLI::PositiveNumber prints its range as doubles: "0.000000 to 1.797693e+308").
const CLI::Validator at_least_one(
    [](std::string& s) -> std::string {
      long v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (ec != std::errc{} || end != s.data() + s.size() || v < 1) {
        return "expected a whole number >= 1";
      }
      return {};
    },
    "INT>=1");

std::vector<int> parse_stages(const options& opt) {
  if (opt.stages.empty()) {
    return {};
  }
  if (opt.stages == "all") {
    return {0, 1, 2, 3};
  }
  std::vector<int> out;
  std::stringstream ss(opt.stages);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.size() != 1 || item[0] < '0' || item[0] > '3') {
      throw CLI::ValidationError("--stages",
                                 "expected \"all\" or a comma-separated list of 0..3, got \"" + opt.stages + "\"");
    }
    out.push_back(item[0] - '0');
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-fashion-mnist: data-parallel MLP on Fashion-MNIST with ZeRO stages 0-3"};
  options opt;
  app.add_option("--ranks", opt.ranks, "in-process ranks (ignored under mpirun)")->check(CLI::Range(1, 64));
  app.add_option("--stage", opt.stage, "ZeRO stage, overriding the config's zero_optimization.stage")
      ->check(CLI::Range(0, 3));
  app.add_option("--stages", opt.stages, "run several stages and print a table: \"all\" or e.g. 0,2");
  app.add_option("--steps", opt.steps, "optimizer steps (default: --epochs worth)")->check(at_least_one);
  app.add_option("--epochs", opt.epochs, "epochs over the training set")->check(CLI::Range(1, 100));
  // zero::config names what is wrong with a file.
  app.add_option("--config", opt.config_file,
                 "DeepSpeed-style JSON config, or auto-plan: the fastest setting that fits this machine");
  app.add_option("--gpu-memory", opt.gpu_memory,
                 "with --config auto-plan: bytes per rank, e.g. 2MiB (default: the host's available "
                 "memory, which is the CPU backend's device memory)");
  app.add_option("--host-memory", opt.host_memory,
                 "with --config auto-plan: bytes of host memory (default: the host's available memory)");
  app.add_option("--nvme", opt.nvme_budget,
                 "with --config auto-plan: bytes on NVMe under --nvme-path (default: its free "
                 "space; none without --nvme-path)");
  app.add_option("--data", opt.data, "folder with the Fashion-MNIST IDX files");
  app.add_option("--hidden", opt.hidden, "width of the first hidden layer")->check(CLI::Range(8, 4096));
  app.add_flag("--json", opt.json, "print one JSON object per run as the last line(s)");
  auto* save_opt = app.add_option("--save", opt.save, "save checkpoints into this directory (at the end)");
  app.add_option("--save-every", opt.save_every, "also save every N steps")->check(at_least_one)->needs(save_opt);
  auto* load_opt = app.add_option("--load", opt.load, "resume from the latest checkpoint in this directory");
  app.add_option("--offload-threads", opt.offload_threads,
                 "host threads of the AdamW step under offload_optimizer cpu or nvme (default: the host's threads "
                 "divided by the ranks)")
      ->check(CLI::Range(1u, 1024u));
  auto* nvme_opt = app.add_option("--nvme-path", opt.nvme_path,
                                  "folder of the swap files under offload_optimizer or offload_param nvme, overriding "
                                  "both blocks' nvme_path (created if missing)");
  app.add_option("--timeout", opt.timeout,
                 "seconds a rank waits for the others before it reports them (default: the config's "
                 "comm_timeout, else 300)");
  CLI11_PARSE(app, argc, argv);
  // Checked here rather than with CLI::Range, which lets NaN through (every comparison with it is
  // false) and prints its bounds as "0.001000 to 31536000.000000".
  if (opt.timeout && !(*opt.timeout >= 0.001 && *opt.timeout <= 31536000.0)) {
    std::fprintf(stderr, "zero-fashion-mnist: --timeout: expected seconds from 0.001 to 31536000, found %g\n",
                 *opt.timeout);
    return 2;
  }
  for (const CLI::Option* o : {save_opt, load_opt, nvme_opt}) {
    if (o->count() > 0 && o->as<std::string>().empty()) {
      std::fprintf(stderr, "zero-fashion-mnist: %s: expected a directory, found an empty string\n",
                   o->get_name().c_str());
      return 2;
    }
  }
  const bool planned = opt.config_file == auto_plan;
  if (const auto refusal = zero::tools::plan_flags_refusal({.planned = planned,
                                                            .config_file = !opt.config_file.empty() && !planned,
                                                            .gpu_memory = opt.gpu_memory,
                                                            .host_memory = opt.host_memory,
                                                            .nvme = opt.nvme_budget,
                                                            .nvme_path = opt.nvme_path.has_value(),
                                                            .stage = opt.stage || !opt.stages.empty(),
                                                            .stage_flags = "--stage and --stages"})) {
    std::fprintf(stderr, "zero-fashion-mnist: %s\n", refusal->c_str());
    return 2;
  }
#if !ZERO_HAS_CHECKPOINT
  if (!opt.save.empty() || !opt.load.empty()) {
    std::fprintf(stderr, "zero-fashion-mnist: --save and --load need zero::checkpoint (libxxhash-dev); this build "
                         "has none\n");
    return 2;
  }
#endif
  if ((!opt.save.empty() || !opt.load.empty()) && !opt.stages.empty()) {
    std::fprintf(stderr, "zero-fashion-mnist: --save and --load train one stage; use --stage, not --stages\n");
    return 2;
  }

  try {
    // Through zero's reader: bounded size and depth, duplicate keys refused. The stage is set per run
    // below, so the JSON is kept; reading it once here refuses a bad config before the data loads.
    const std::string source = opt.config_file.empty() ? "built-in config" : opt.config_file;
    nlohmann::json base = opt.config_file.empty() || planned ? nlohmann::json::parse(default_config)
                                                             : zero::config::read_json_file(opt.config_file);
    if (opt.nvme_path) {
      zero::tools::override_nvme_paths(base, *opt.nvme_path);
    }
    // The batch rule needs the rank count: the launcher's under mpirun, else --ranks.
    const char* launcher_size = std::getenv("OMPI_COMM_WORLD_SIZE");
    launcher_size = launcher_size != nullptr ? launcher_size : std::getenv("PMI_SIZE");
    if (planned) {
      if (launcher_size != nullptr) {
        // Each process would measure its own rates, and processes that chose differently would hang.
        std::fprintf(stderr, "zero-fashion-mnist: --config auto-plan runs in-process ranks (--ranks), not under "
                             "mpirun\n");
        return 2;
      }
      plan_run(opt, opt.ranks, base);
    }
    const zero::config first = zero::config::from_json(
        base, {.world_size = launcher_size != nullptr ? std::atol(launcher_size) : opt.ranks}, source);
    const int config_stage = first.stage();
    for (const auto& note : first.notes) {
      std::fprintf(stderr, "zero-fashion-mnist: note: %s\n", note.c_str());
    }
    const auto nvme_dirs = zero::tools::nvme_folders(first);
    if (opt.nvme_path && nvme_dirs.empty() && !planned) {
      std::fprintf(stderr,
                   "zero-fashion-mnist: --nvme-path: the config offloads nothing to NVMe "
                   "(zero_optimization.offload_optimizer.device is \"%s\", offload_param.device \"%s\"); use a "
                   "config with \"nvme\", such as examples/fashion_mnist/offload_nvme.json\n",
                   std::string(zero::name_of(first.zero_optimization.offload_optimizer.device)).c_str(),
                   std::string(zero::name_of(first.zero_optimization.offload_param.device)).c_str());
      return 2;
    }
    for (const auto& [key, dir] : nvme_dirs) {
      zero::tools::make_nvme_folder(key, dir); // the engine creates its files in it, not the folder
    }
    auto stages = parse_stages(opt);
    if (stages.empty()) {
      stages.push_back(opt.stage.value_or(config_stage));
    }
    const auto train_set = fmnist::load(opt.data, "train");
    const auto test_set = fmnist::load(opt.data, "t10k");

    std::vector<outcome> results;
    bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
#if ZERO_HAS_MPI
    if (under_mpi) {
      MPI_Init(&argc, &argv);
      openblas_set_num_threads(1);
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      {
        zero::mpi_communicator comm(MPI_COMM_WORLD);
        for (int stage : stages) {
          auto j = base;
          j["zero_optimization"]["stage"] = stage;
          auto o = train(comm, j, opt, train_set, test_set);
          if (rank == 0) {
            report(o, opt.json);
            results.push_back(o);
          }
        }
      }
      MPI_Finalize();
      if (rank != 0) {
        return 0;
      }
    }
#else
    if (under_mpi) {
      std::fprintf(stderr, "zero-fashion-mnist: started under mpirun but built without MPI; running in-process\n");
      under_mpi = false;
    }
#endif
    if (!under_mpi) {
      if (opt.ranks > 1) {
        openblas_set_num_threads(1);
      }
      for (int stage : stages) {
        auto j = base;
        j["zero_optimization"]["stage"] = stage;
        outcome o;
        zero::run_ranks(opt.ranks, [&](zero::thread_communicator& comm) {
          auto r = train(comm, j, opt, train_set, test_set);
          if (comm.rank() == 0) {
            o = r;
          }
        });
        report(o, opt.json);
        results.push_back(o);
      }
    }
    if (results.size() > 1 && !opt.json) {
      std::printf("\n%-6s %-6s %18s %18s %8s %15s %15s %10s %9s\n", "stage", "ranks", "model state/rank",
                  "ZeRO formula", "ratio", "working set", "host (offload)", "accuracy", "time");
      for (const auto& o : results) {
        std::printf("%-6d %-6d %16zu B %16.0f B %8.4f %13zu B %13zu B %9.2f%% %8.1fs\n", o.stage, o.ranks,
                    o.memory.model_state_peak, o.memory.formula, o.memory.ratio(), o.memory.working_set_peak,
                    o.memory.host_peak, 100 * o.test_accuracy, o.seconds);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-fashion-mnist: %s\n", e.what());
    return 1;
  }
  return 0;
}
