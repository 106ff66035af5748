// zero-deep-mlp-cuda: a deep residual MLP trained on GPUs with zero's ZeRO stages, its own cuBLAS
// GEMMs and kernels, parameters, gradients and optimizer state in the zero engine.
//
//   zero-deep-mlp-cuda --gpus 2 --stage 3              one thread per GPU (nccl_communicator, run_gpus)
//   torchrun --standalone --nproc_per_node=2 --no-python ./zero-deep-mlp-cuda --env --stage 3
//                                                      one process per GPU (nccl_communicator::from_env)
//   zero-deep-mlp-cuda --ranks 4 --stage 3             four ranks as threads sharing GPU 0
//                                                      (device_group_communicator, run_device_group)
//   zero-deep-mlp-cuda --check --gpus 2                small model, every stage, checked against the CPU
//   zero-deep-mlp-cuda --check --ranks 4               the same with four ranks on one GPU
//   zero-deep-mlp-cuda --gpus 2 --config offload_cpu.json --offload-threads 8
//                                                      ZeRO-Offload: optimizer state in pinned host memory
//   zero-deep-mlp-cuda --gpus 2 --config offload_nvme.json --nvme-path /mnt/nvme/zero
//                                                      ZeRO-Infinity: optimizer state in a file per GPU
//                                                      (io_uring and O_DIRECT in a build with zero::uring)
//   zero-deep-mlp-cuda --gpus 2 --config auto-plan --hidden 16384
//                                                      the fastest setting that fits these GPUs and host
//   zero-deep-mlp-cuda --ranks 2 --config auto-plan    the same for two ranks sharing GPU 0 (each plans for
//                                                      half of its memory, device rates and copy rates)
//
// Block l: y = x + gelu(x W_l^T + b_l), W_l hidden x hidden; loss 0.5 * mean((y_L - target)^2) against
// a fixed random target. The same model in PyTorch FSDP2 is bench/fsdp2/fsdp2_mlp.py.

#include "model.hpp"
#include "reference.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime_api.h>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>
#include <zero/backend/cuda_backend.hpp>
#include <zero/backend/cuda_kernels.hpp>
#include <zero/comm/device_group_communicator.hpp>
#include <zero/comm/nccl_communicator.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>
#include <zero/tools/nvme_folders.hpp>
#include <zero/tools/plan.hpp>
#include <zero/tools/probes.hpp>
#if ZERO_HAS_URING
#include <zero/storage/uring_storage.hpp>
#endif

namespace {

// The storage of offload_optimizer nvme: io_uring with O_DIRECT where the build has it (nvme_path must then
// be on a file system that takes O_DIRECT, such as ext4 or xfs), else pread/pwrite through the page cache.
#if ZERO_HAS_URING
using storage_type = zero::uring_storage;
#else
using storage_type = zero::posix_storage;
#endif
/// The engine over `Comm`: nccl_communicator (a GPU per rank) or device_group_communicator (ranks sharing one GPU).
template <class Comm>
using engine_type = zero::basic_engine<zero::cuda_backend, Comm, zero::cuda_backend::allocator_type, storage_type>;

/// Whether the ranks of `Comm` are threads sharing one GPU (--ranks) rather than one GPU each.
template <class Comm> inline constexpr bool ranks_share_gpu = std::is_same_v<Comm, zero::device_group_communicator>;

/// The GPU the ranks of --ranks share.
constexpr int shared_gpu = 0;

constexpr const char* program = "zero-deep-mlp-cuda";
/// What ctest takes as "skipped" (SKIP_RETURN_CODE): fewer GPUs than asked for.
constexpr int exit_skipped = 77;

struct options {
  std::optional<int> gpus;
  bool env = false;
  std::optional<int> ranks; // --ranks: threads sharing GPU 0
  std::optional<int> stage;
  std::optional<int> hidden, blocks, rows, steps, warmup;
  std::optional<double> lr;
  std::string config_file;
  unsigned offload_threads = 0; // host AdamW threads under offload_optimizer cpu or nvme; 0: the engine's default
  std::optional<std::string> nvme_path; // overrides offload_optimizer.nvme_path
  bool json = false;
  bool check = false;
  // --config auto-plan's budgets (empty: what the machine has), and the config block it chose
  std::optional<std::int64_t> gpu_memory, host_memory, nvme_budget;
  std::optional<nlohmann::json> plan_block;
};

/// The value of --config that plans the run instead of reading a file.
constexpr const char* auto_plan = "auto-plan";

/// The sizes and hyper-parameters in force after the defaults of the mode are applied.
struct run_params {
  deep_mlp::shape shape;
  int steps = 10;
  int warmup = 3;
  double lr = 1e-4;
};

const char* usage_text = R"(usage: zero-deep-mlp-cuda [flags]
  --gpus N       GPUs, one thread each over NCCL (default: every visible GPU)
  --env          one process per GPU under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT)
  --ranks N      N ranks (1 to 16) as threads sharing GPU 0, each with streams of its own
                 (device_group_communicator); excludes --gpus and --env. The report says "ranks on
                 one GPU": its device memory delta is the GPU's, all ranks together, its TFLOP/s the
                 GPU's (every rank's rows); the pool peaks are rank 0's
  --stage S      ZeRO stage 0-3 (default: the config's with --config, else 2; --check with neither
                 checks all four)
  --hidden H     width, a multiple of 8 (default 8192; --check: 256)
  --blocks L     residual blocks (default 24; --check: 4)
  --rows R       rows per rank (a GPU, or with --ranks a thread) and step (default 8192; --check: 64)
  --steps N      timed steps (default 10; --check: 5)
  --warmup N     untimed steps first (default 3; --check: 0)
  --lr X         AdamW learning rate (default 1e-4; --check: 1e-3)
  --config FILE  DeepSpeed-style JSON config instead of the built-in one (--stage still overrides;
                 "auto" takes --rows for the micro batch and --hidden for the bucket sizes)
  --config auto-plan
                 the built-in config at the fastest stage and offload setting that fits, by rates
                 measured now on GPU 0 and the host (zero-estimate --plan; docs/offload.md)
  --gpu-memory BYTES, --host-memory BYTES, --nvme BYTES
                 auto-plan's budgets per GPU, of host memory and on NVMe under --nvme-path, e.g.
                 24GiB (default: GPU 0's free memory less this model's activations and workspaces,
                 the host's available memory, the free space of --nvme-path or none). With --ranks N
                 each rank plans for 1/N of the GPU: --gpu-memory / N (default: GPU 0's free memory
                 / N less the rank's own activations and workspaces), and 1/N of the AdamW and
                 host-device copy rates measured on it
  --offload-threads N
                 host threads of the AdamW step under offload_optimizer cpu or nvme (default: the
                 host's threads divided by the ranks)
  --nvme-path DIR
                 folder of the optimizer state files under offload_optimizer nvme, overriding the
                 config's nvme_path (created if missing; io_uring builds need O_DIRECT there)
  --json         print one JSON object per run as the last line(s)
  --check        run a small model and compare the first step with a CPU fp32 reference
)";

[[noreturn]] void bad_flag(const std::string& message) { throw std::invalid_argument(message); }

long parse_int(const std::string& flag, const std::string& text, long lo, long hi) {
  std::size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || v < lo || v > hi) {
    bad_flag(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got \"" + text +
             "\"");
  }
  return v;
}

double parse_double(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || !(v > 0)) {
    bad_flag(flag + " expects a positive number, got \"" + text + "\"");
  }
  return v;
}

/// Hand-written flag parsing ("--flag value" or "--flag=value"): the GPU machines have no CLI11.
/// Returns false for --help. \throws std::invalid_argument naming the bad flag or value.
bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    std::optional<std::string> inline_value;
    if (const auto eq = flag.find('='); flag.rfind("--", 0) == 0 && eq != std::string::npos) {
      inline_value = flag.substr(eq + 1);
      flag.resize(eq);
    }
    auto value = [&]() -> std::string {
      if (inline_value) {
        return *inline_value;
      }
      if (i + 1 >= argc) {
        bad_flag(flag + " needs a value");
      }
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) {
        bad_flag(flag + " takes no value");
      }
    };
    if (flag == "--help" || flag == "-h") {
      return false;
    } else if (flag == "--gpus") {
      o.gpus = static_cast<int>(parse_int(flag, value(), 1, 1024));
    } else if (flag == "--env") {
      no_value();
      o.env = true;
    } else if (flag == "--ranks") {
      // At most what one device group reduces in a kernel (zero::cuda::reduce_ranks).
      o.ranks = static_cast<int>(parse_int(flag, value(), 1, static_cast<long>(zero::cuda::max_reduce_ranks)));
    } else if (flag == "--stage") {
      o.stage = static_cast<int>(parse_int(flag, value(), 0, 3));
    } else if (flag == "--hidden") {
      o.hidden = static_cast<int>(parse_int(flag, value(), 8, 65536));
      if (*o.hidden % 8 != 0) {
        bad_flag("--hidden must be a multiple of 8 (16-byte rows for the kernels), got " + std::to_string(*o.hidden));
      }
    } else if (flag == "--blocks") {
      o.blocks = static_cast<int>(parse_int(flag, value(), 1, 4096));
    } else if (flag == "--rows") {
      o.rows = static_cast<int>(parse_int(flag, value(), 1, 1 << 24));
    } else if (flag == "--steps") {
      o.steps = static_cast<int>(parse_int(flag, value(), 1, 1000000));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value(), 0, 1000000));
    } else if (flag == "--lr") {
      o.lr = parse_double(flag, value());
    } else if (flag == "--config") {
      o.config_file = value();
    } else if (flag == "--offload-threads") {
      o.offload_threads = static_cast<unsigned>(parse_int(flag, value(), 1, 1024));
    } else if (flag == "--nvme-path") {
      o.nvme_path = value();
      if (o.nvme_path->empty()) {
        bad_flag("--nvme-path expects a folder, got an empty string");
      }
    } else if (flag == "--gpu-memory" || flag == "--host-memory" || flag == "--nvme") {
      std::int64_t bytes = 0;
      try {
        bytes = zero::tools::parse_bytes(value());
      } catch (const zero::usage_error& e) {
        bad_flag(flag + ": " + e.what());
      }
      (flag == "--gpu-memory" ? o.gpu_memory : flag == "--host-memory" ? o.host_memory : o.nvme_budget) = bytes;
    } else if (flag == "--json") {
      no_value();
      o.json = true;
    } else if (flag == "--check") {
      no_value();
      o.check = true;
    } else {
      bad_flag("unknown flag \"" + std::string(argv[i]) + "\"");
    }
  }
  if (o.ranks && (o.gpus || o.env)) {
    bad_flag(o.gpus ? "--ranks and --gpus exclude each other (--ranks N: N threads sharing GPU 0; --gpus N: a "
                      "thread per GPU over NCCL)"
                    : "--ranks and --env exclude each other (--ranks N: N threads of this process sharing GPU 0; "
                      "--env: a process per GPU under torchrun)");
  }
  if (o.nvme_path && o.config_file.empty()) {
    bad_flag("--nvme-path needs --config with offload_optimizer nvme (such as offload_nvme.json); the built-in "
             "config offloads nothing");
  }
  const bool planned = o.config_file == auto_plan;
  if (!planned && (o.gpu_memory || o.host_memory || o.nvme_budget)) {
    bad_flag("--gpu-memory, --host-memory and --nvme are budgets of --config auto-plan");
  }
  if (planned && (o.env || o.stage)) {
    bad_flag(o.env ? "--config auto-plan runs one process (--gpus or --ranks): under torchrun each process would "
                     "measure, and processes that chose differently would hang"
                   : "--config auto-plan chooses the stage; leave out --stage");
  }
  if (o.nvme_budget && !o.nvme_path) {
    bad_flag("--nvme needs --nvme-path DIR, the folder the state files would go to");
  }
  if (o.env && o.gpus) {
    bad_flag("--gpus and --env exclude each other (under torchrun, --nproc_per_node sets the GPUs)");
  }
  return true;
}

run_params resolve(const options& o) {
  run_params p;
  p.shape.hidden = o.hidden.value_or(o.check ? 256 : 8192);
  p.shape.blocks = o.blocks.value_or(o.check ? 4 : 24);
  p.shape.rows = o.rows.value_or(o.check ? 64 : 8192);
  p.steps = o.steps.value_or(o.check ? 5 : 10);
  p.warmup = o.warmup.value_or(o.check ? 0 : 3);
  p.lr = o.lr.value_or(o.check ? 1e-3 : 1e-4);
  return p;
}

/// The config used without --config. Buckets hold one block (W and b), so stage 2 reduce-scatters and
/// stage 3 gathers per block as FSDP2 with one fully_shard per block does; stage 3 prefetches one
/// block ahead, keeps only the last block gathered across the turn from forward to backward (reuse
/// distance: one block), holds at most 4 blocks, and shards biases too (persistence threshold =
/// hidden, and a bias has hidden elements, not fewer).
nlohmann::json default_config(const run_params& p, int stage) {
  const std::int64_t h = p.shape.hidden;
  const std::int64_t block = h * h + h;
  return {
      {"train_micro_batch_size_per_gpu", p.shape.rows},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 0.0},
      {"bf16", {{"enabled", true}}},
      {"data_types", {{"grad_accum_dtype", "bf16"}}},
      {"optimizer",
       {{"type", "AdamW"}, {"params", {{"lr", p.lr}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"weight_decay", 0.01}}}}},
      {"zero_optimization",
       {{"stage", stage},
        {"overlap_comm", true},
        {"contiguous_gradients", true},
        {"reduce_bucket_size", block},
        {"allgather_bucket_size", block},
        {"stage3_prefetch_bucket_size", block + block / 8},
        {"stage3_max_live_parameters", 4 * block},
        {"stage3_max_reuse_distance", block},
        {"stage3_param_persistence_threshold", h}}}};
}

/// --config auto-plan: the fastest stage and offload setting for this model on `ranks` ranks that fits
/// the budgets, by the rates measured now on GPU 0, the host and --nvme-path (zero/tools/probes.hpp).
/// `ranks_per_gpu` ranks share each GPU (1, or with --ranks all of them): each rank plans for that share of
/// the GPU's memory, of its AdamW rate and of its copy rates, as the host's rate is shared among a node's
/// ranks by the planner. Prints the plan (to stderr with --json) and keeps its config block in `opt.plan_block`.
/// \throws usage_error when nothing fits; what the probes throw.
void plan_run(options& opt, const run_params& p, int ranks, int ranks_per_gpu) {
  namespace zt = zero::tools;
  const auto cfg = zero::config::from_json(
      default_config(p, 2), {.world_size = ranks, .hidden_size = p.shape.hidden, .micro_batch_size = p.shape.rows},
      "built-in config");
  const auto h = static_cast<std::int64_t>(p.shape.hidden);
  const auto model = zt::summarize_modules(
      std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(p.shape.blocks), {h * h, h}));
  const auto o = zt::estimate_options_from(cfg, model, ranks);
  if (opt.nvme_path) {
    // Created if missing, as for a config with offload_optimizer nvme: the storage is measured there.
    std::filesystem::create_directories(*opt.nvme_path);
  }
  zero::cuda_backend device(0);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  ZERO_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  // Every rank on the GPU holds activations and workspaces of its own beside its share.
  const std::size_t share = free_bytes / static_cast<std::size_t>(ranks_per_gpu);
  const std::size_t framework = deep_mlp::model<engine_type<zero::nccl_communicator>>::framework_bytes_of(p.shape);
  zt::memory_budget budget;
  budget.device_bytes = opt.gpu_memory ? *opt.gpu_memory / ranks_per_gpu
                                       : static_cast<std::int64_t>(share > framework ? share - framework : 0);
  budget.host_bytes = opt.host_memory.value_or(zt::available_host_memory());
  budget.nvme_bytes = opt.nvme_budget.value_or(opt.nvme_path ? zt::free_storage_bytes(*opt.nvme_path) : 0);
  cudaDeviceProp prop{};
  ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  auto rates = zt::measure_rates(device, prop.name, {},
                                 opt.nvme_path ? std::optional<std::filesystem::path>(*opt.nvme_path) : std::nullopt);
  // The ranks of one GPU step their shards on it at once and copy over its one link: each gets its share.
  rates.device_adamw /= ranks_per_gpu;
  rates.host_to_device /= ranks_per_gpu;
  rates.device_to_host /= ranks_per_gpu;
  const auto plan = zt::make_plan(o, rates, budget);
  std::FILE* out = opt.json ? stderr : stdout;
  std::string where = std::to_string(ranks) + " GPU(s)";
  std::string per = opt.gpu_memory ? " per GPU" : " per GPU (free memory less the model's activations and workspaces)";
  if (ranks_per_gpu > 1) {
    where = std::to_string(ranks) + " ranks sharing GPU 0";
    per = " per rank (" + std::string(opt.gpu_memory ? "--gpu-memory" : "GPU 0's free memory") + " / " +
          std::to_string(ranks_per_gpu) + (opt.gpu_memory ? "" : " less the rank's activations and workspaces") + ")";
  }
  std::fprintf(out, "auto-plan for %lld parameters on %s; budgets: %s%s, %s of host memory, %s of NVMe\n%s",
               static_cast<long long>(model.params), where.c_str(), zt::show_bytes(budget.device_bytes).c_str(),
               per.c_str(), zt::show_bytes(budget.host_bytes).c_str(), zt::show_bytes(budget.nvme_bytes).c_str(),
               zt::plan_table(plan).c_str());
  if (!plan.chosen) {
    throw zero::usage_error("--config auto-plan: no setting fits the budgets (--gpu-memory, --host-memory, --nvme)");
  }
  opt.plan_block = zt::plan_config_block(plan.ranked[*plan.chosen].row, o, opt.nvme_path.value_or(""));
  std::fprintf(out, "config block:\n%s\n", opt.plan_block->dump(2).c_str());
  std::fflush(out);
}

/// Device memory in use on the current device, from cudaMemGetInfo, relative to a baseline taken
/// after CUDA and NCCL started: what this run reserved (engine pools, cuBLAS, activations), the
/// counterpart of PyTorch's max_memory_reserved plus cuBLAS' own handle memory. The device's count: with
/// ranks sharing it, what all of them reserved.
class device_memory_probe {
public:
  device_memory_probe() : baseline_(used()) {}
  void sample() {
    const std::size_t now = used();
    peak_ = std::max(peak_, now > baseline_ ? now - baseline_ : 0);
  }
  [[nodiscard]] std::size_t peak() const noexcept { return peak_; }

  /// The high-water mark of reserved memory of the device's default cudaMallocAsync pool (0 when
  /// nothing used it).
  static std::size_t default_pool_high() {
    int device = 0;
    ZERO_CHECK_CUDA(cudaGetDevice(&device));
    cudaMemPool_t pool{};
    if (cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    std::uint64_t high = 0;
    if (cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &high) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return static_cast<std::size_t>(high);
  }

private:
  static std::size_t used() {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    ZERO_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
    return total_bytes - free_bytes;
  }
  std::size_t baseline_;
  std::size_t peak_ = 0;
};

/// What a run measured (rank 0's view; losses are rank 0's rows).
struct outcome {
  int stage = 0;
  int gpus = 1;  ///< the GPUs the ranks ran on: one per rank, or 1 with --ranks
  int ranks = 1; ///< the ranks (data-parallel world size)
  bool ranks_on_one_gpu = false;
  run_params p;
  std::size_t params = 0;
  double step_ms = 0;
  double step_mean_ms = 0; // a mode whose steps differ (ZenFlow's host step every update_interval) is its mean
  double step_wall_ms = 0;
  /// Medians of where the period goes, on the engine's stream: from a step's start to the end of
  /// forward (loss included), on to the end of backward, and on to the next step's start (the
  /// optimizer step, with whatever of the gradient reduction backward left running).
  double forward_ms = 0;
  double backward_ms = 0;
  double optimizer_ms = 0;
  double tflops_per_gpu = 0;
  double loss_first = 0;
  double loss_last = 0;
  zero::memory_report memory;
  std::size_t framework_bytes = 0;
  std::size_t activation_bytes = 0;
  std::size_t device_peak_delta = 0;
  std::size_t default_pool_high = 0;
  /// The engine's caching pool, which the framework draws from too: its peaks of bytes in use and held.
  std::size_t pool_peak_in_use = 0;
  std::size_t pool_peak_reserved = 0;
  std::string storage; // the storage policy's name under offload_optimizer nvme
  /// With the optimizer offloaded to the host (offload_optimizer cpu, the whole state or the host's
  /// share of a partial offload): the host side's lower bound of a step, probed after training
  /// (`host_bound`), and what it is made of.
  struct bound {
    double host_adamw_per_s = 0; ///< the host AdamW's rate on the offloaded state's memory kind
    double to_device_bytes_per_s = 0, to_host_bytes_per_s = 0;
    double host_adamw_ms = 0, transfer_ms = 0, ms = 0;
  };
  std::optional<bound> host_bound;
  bool check_ok = true;
};

/// The host side's lower bound of an offloaded step (the planner's cost of the config's row,
/// zero/tools/plan.hpp `config_row`): the host AdamW over the rank's shard (its `ratio` share with a
/// partial offload) at the rate probed now, with this rank's share of the host's
/// threads, on 2^27 elements of the memory the offloaded state lives in (more than any last-level
/// cache), or the copies of its gradients down and parameters up at the probed pinned rates (with a
/// partial offload and the parameters on the host, also the device share's new parameters down),
/// whichever is longer. Forward and backward on the GPU are not in it: this run does not measure them apart.
outcome::bound host_side_bound(const zero::config& cfg, zero::cuda_backend& device, int ranks, std::size_t params,
                               double ratio, unsigned threads) {
  zero::basic_cpu_backend<zero::cuda_backend::host_allocator_type> host(
      {.threads =
           threads != 0 ? threads : std::max(1u, std::thread::hardware_concurrency() / static_cast<unsigned>(ranks))});
  outcome::bound b;
  b.host_adamw_per_s = zero::tools::probe_adamw(host, std::size_t{1} << 27);
  std::tie(b.to_device_bytes_per_s, b.to_host_bytes_per_s) = zero::tools::probe_copy(device, std::size_t{256} << 20);
  zero::tools::estimate_options eo;
  eo.params = static_cast<std::int64_t>(params);
  eo.gpus_per_node = ranks;
  eo.param_dtype = cfg.param_dtype();
  zero::tools::estimate_row row = zero::tools::config_row(cfg);
  row.offload_ratio = ratio; // the engine's share, resolved where the config leaves it to the engine
  zero::tools::machine_rates rates;
  rates.device_adamw = 1;                        // unused: the bound is the host side's
  rates.host_adamw = b.host_adamw_per_s * ranks; // the planner shares the host's rate among the ranks
  rates.host_to_device = b.to_device_bytes_per_s;
  rates.device_to_host = b.to_host_bytes_per_s;
  const auto c = zero::tools::estimate_step_cost(row, eo, rates);
  b.host_adamw_ms = c.host_adamw * 1e3;
  b.transfer_ms = c.transfer * 1e3;
  b.ms = std::max(b.host_adamw_ms, b.transfer_ms);
  return b;
}

double median(std::vector<double> v) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

/// Serialises the lines the ranks print (stdout is shared by the threads).
std::mutex print_mutex;

/// --check: the first step against the CPU reference, on every rank for its own rows.
class step_checker {
public:
  step_checker(const run_params& p, int rank, int world, int stage)
      : rank_(rank), stage_(stage),
        mine_(deep_mlp::reference_run(p.shape.hidden, p.shape.blocks,
                                      static_cast<std::size_t>(rank) * static_cast<std::size_t>(p.shape.rows),
                                      static_cast<std::size_t>(p.shape.rows))),
        global_norm_(deep_mlp::reference_run(p.shape.hidden, p.shape.blocks, 0,
                                             static_cast<std::size_t>(world) * static_cast<std::size_t>(p.shape.rows))
                         .grad_norm) {}

  deep_mlp::probes probes() {
    return {.output =
                [this](std::span<const float> y) {
                  expect("output y", deep_mlp::relative_error({y.begin(), y.end()}, mine_.y), 1e-2);
                },
            .grads =
                [this](int l, std::span<const float> dw, std::span<const float> db) {
                  const auto li = static_cast<std::size_t>(l);
                  expect("block" + std::to_string(l) + ".weight grad",
                         deep_mlp::relative_error({dw.begin(), dw.end()}, mine_.dw[li]), 2e-2);
                  expect("block" + std::to_string(l) + ".bias grad",
                         deep_mlp::relative_error({db.begin(), db.end()}, mine_.db[li]), 2e-2);
                }};
  }

  void loss(double gpu) { expect("loss", std::abs(gpu - mine_.loss) / mine_.loss, 5e-3, gpu, mine_.loss); }
  void grad_norm(double gpu) {
    expect("global grad norm (engine, averaged over ranks)", std::abs(gpu - global_norm_) / global_norm_, 2e-2, gpu,
           global_norm_);
  }
  void losses(double first, double last) {
    const bool ok = last < first;
    report(ok, "loss goes down: first " + std::to_string(first) + ", last " + std::to_string(last));
  }
  [[nodiscard]] bool ok() const noexcept { return ok_; }

private:
  void expect(const std::string& what, double rel, double tol, double gpu = NAN, double ref = NAN) {
    char buf[256];
    if (std::isnan(gpu)) {
      std::snprintf(buf, sizeof buf, "%s: relative error %.3e (tolerance %.0e)", what.c_str(), rel, tol);
    } else {
      std::snprintf(buf, sizeof buf, "%s: gpu %.6g, cpu %.6g, relative error %.3e (tolerance %.0e)", what.c_str(), gpu,
                    ref, rel, tol);
    }
    report(rel <= tol, buf); // a NaN fails
  }
  void report(bool ok, const std::string& line) {
    ok_ = ok_ && ok;
    const std::lock_guard lock(print_mutex);
    std::printf("check stage %d rank %d: %s %s\n", stage_, rank_, ok ? "ok  " : "FAIL", line.c_str());
    std::fflush(stdout);
  }

  int rank_;
  int stage_;
  deep_mlp::reference_result mine_;
  double global_norm_;
  bool ok_ = true;
};

/// One run on `comm.device()`, the rank's GPU: the built-in config at `stage`, or the --config file at `stage` when
/// given (else at its own).
template <class Comm> outcome train(Comm& comm, const options& opt, const run_params& p, std::optional<int> stage) {
  const int device = comm.device();
  ZERO_CHECK_CUDA(cudaSetDevice(device));
  ZERO_CHECK_CUDA(cudaFree(nullptr)); // the context exists before the baseline is taken
  ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  device_memory_probe device_memory;
  if constexpr (ranks_share_gpu<Comm>) {
    // Every rank's baseline before any rank allocates: the delta is then what all of them reserved.
    comm.barrier().wait();
  }

  nlohmann::json j;
  if (opt.plan_block) {
    j = default_config(p, 2);
    j.merge_patch(*opt.plan_block);
  } else if (opt.config_file.empty()) {
    j = default_config(p, stage.value_or(2));
  } else {
    // Through zero's reader: bounded size and depth, comments allowed, duplicate keys refused.
    j = zero::config::read_json_file(opt.config_file);
    if (stage) {
      j["zero_optimization"]["stage"] = *stage;
    }
    // Before the config is read, so that a config without nvme_path (which the reader refuses with device
    // nvme) takes it from the command line.
    if (opt.nvme_path) {
      zero::tools::override_nvme_paths(j, *opt.nvme_path);
    }
  }
  zero::config_inputs inputs;
  inputs.world_size = comm.size();
  inputs.hidden_size = p.shape.hidden;
  inputs.micro_batch_size = p.shape.rows; // the rows each GPU runs per step are its micro batch
  const auto cfg = zero::config::from_json(j, inputs, opt.config_file.empty() ? "built-in config" : opt.config_file);
  const auto& offload = cfg.zero_optimization.offload_optimizer;
  const auto nvme_dirs = zero::tools::nvme_folders(cfg);
  if (opt.nvme_path && nvme_dirs.empty() && !opt.plan_block) {
    throw zero::usage_error("--nvme-path: " + opt.config_file +
                            " offloads nothing to NVMe (zero_optimization.offload_optimizer.device is \"" +
                            std::string(zero::name_of(offload.device)) + "\", offload_param.device \"" +
                            std::string(zero::name_of(cfg.zero_optimization.offload_param.device)) + "\")");
  }
  for (const auto& [key, dir] : nvme_dirs) {
    zero::tools::make_nvme_folder(key, dir); // the engine creates its files in it, not the folder
  }

  const int rank = comm.rank();
  zero::cuda_backend backend(device);
  engine_type<Comm> eng(cfg, comm, backend);
  eng.set_offload_threads(opt.offload_threads);
  eng.set_log([rank](const std::string& line) {
    if (rank == 0) {
      std::fprintf(stderr, "%s\n", line.c_str());
    }
  });
  deep_mlp::model<engine_type<Comm>> model(eng, p.shape, rank, backend.get_allocator()); // the engine's pool
  eng.finalize();
  model.setup();

  std::optional<step_checker> checker;
  if (opt.check) {
    checker.emplace(p, rank, comm.size(), cfg.stage());
  }

  const cudaStream_t stream = eng.stream().get();
  // Step time is the steady-state period: an event at the start of every step on the engine's stream,
  // and the time between consecutive starts. Inside the timed window nothing synchronizes the device, so
  // work the engine leaves running at a step's end (stage 1-2 parameter all-gathers, NCCL streams) overlaps
  // the next step exactly as in training; one extra step closes the last period. Warm-up steps, the
  // --check probe step and the last step synchronize to read the loss.
  const int total = p.warmup + p.steps + 1;
  std::vector<cudaEvent_t> marks(static_cast<std::size_t>(total), nullptr);
  std::vector<cudaEvent_t> forward_done(static_cast<std::size_t>(total), nullptr);
  std::vector<cudaEvent_t> backward_done(static_cast<std::size_t>(total), nullptr);
  std::vector<std::chrono::steady_clock::time_point> host_marks(static_cast<std::size_t>(total));
  for (auto* events : {&marks, &forward_done, &backward_done}) {
    for (auto& e : *events) {
      ZERO_CHECK_CUDA(cudaEventCreate(&e));
    }
  }
  std::vector<double> event_ms;
  std::vector<double> wall_ms;
  std::vector<double> forward_ms, backward_ms, optimizer_ms;
  outcome o;
  o.stage = cfg.stage();
  o.ranks = comm.size();
  o.ranks_on_one_gpu = ranks_share_gpu<Comm>;
  o.gpus = o.ranks_on_one_gpu ? 1 : comm.size();
  o.p = p;
  o.params = model.parameters();
  auto destroy_marks = [&] {
    for (auto* events : {&marks, &forward_done, &backward_done}) {
      for (auto& e : *events) {
        ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e));
      }
    }
  };
  try {
    for (int step = 0; step < total; ++step) {
      const bool probe = checker && step == 0;
      const auto probes = probe ? checker->probes() : deep_mlp::probes{};
      host_marks[static_cast<std::size_t>(step)] = std::chrono::steady_clock::now();
      ZERO_CHECK_CUDA(cudaEventRecord(marks[static_cast<std::size_t>(step)], stream));
      model.forward(probes);
      ZERO_CHECK_CUDA(cudaEventRecord(forward_done[static_cast<std::size_t>(step)], stream));
      model.backward(probes);
      ZERO_CHECK_CUDA(cudaEventRecord(backward_done[static_cast<std::size_t>(step)], stream));
      const auto r = eng.step();
      const bool timed = step >= p.warmup && step < total - 1;
      if (timed && step > p.warmup) {
        // The period of the previous step is complete once this step has started on the device.
        continue;
      }
      ZERO_CHECK_CUDA(cudaDeviceSynchronize());
      const double loss = model.last_loss();
      device_memory.sample();
      if (step == 0) {
        o.loss_first = loss;
      }
      o.loss_last = loss;
      if (probe) {
        checker->loss(loss);
        checker->grad_norm(r.grad_norm);
      }
      if (rank == 0 && !opt.json) {
        const std::lock_guard lock(print_mutex);
        std::printf("stage %d step %3d%s loss %.6f  grad norm %.4e\n", o.stage, step + 1,
                    step < p.warmup ? " (warm-up)" : "          ", loss, r.grad_norm);
        std::fflush(stdout);
      }
    }
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
    auto elapsed = [](cudaEvent_t from, cudaEvent_t to) {
      float ms = 0;
      ZERO_CHECK_CUDA(cudaEventElapsedTime(&ms, from, to));
      return static_cast<double>(ms);
    };
    for (int step = p.warmup; step < total - 1; ++step) {
      const auto k = static_cast<std::size_t>(step);
      event_ms.push_back(elapsed(marks[k], marks[k + 1]));
      forward_ms.push_back(elapsed(marks[k], forward_done[k]));
      backward_ms.push_back(elapsed(forward_done[k], backward_done[k]));
      optimizer_ms.push_back(elapsed(backward_done[k], marks[k + 1]));
      wall_ms.push_back(std::chrono::duration<double, std::milli>(host_marks[static_cast<std::size_t>(step) + 1] -
                                                                  host_marks[static_cast<std::size_t>(step)])
                            .count());
    }
  } catch (...) {
    destroy_marks();
    throw;
  }
  destroy_marks();

  if (checker) {
    checker->losses(o.loss_first, o.loss_last);
    o.check_ok = checker->ok();
  }
  o.step_ms = median(event_ms);
  o.step_mean_ms = event_ms.empty()
                       ? 0.0
                       : std::accumulate(event_ms.begin(), event_ms.end(), 0.0) / static_cast<double>(event_ms.size());
  o.step_wall_ms = median(wall_ms);
  o.forward_ms = median(forward_ms);
  o.backward_ms = median(backward_ms);
  o.optimizer_ms = median(optimizer_ms);
  // Model FLOPs: 6 * params * rows per step (forward GEMM 2, backward dx and dW GEMMs 4 per weight
  // element and row); block 0's dx GEMM, which nobody needs, is counted although neither this program
  // nor autograd runs it. Elementwise kernels, the optimizer and communication are not counted. Ranks
  // sharing a GPU step together on it, so its rate counts every rank's rows.
  const double rows_per_gpu = static_cast<double>(p.shape.rows) * (o.ranks / o.gpus);
  o.tflops_per_gpu = o.step_ms > 0 ? 6.0 * static_cast<double>(o.params) * rows_per_gpu / (o.step_ms * 1e-3) / 1e12 : 0;
  o.memory = eng.memory();
  o.framework_bytes = model.framework_bytes();
  o.activation_bytes = model.activation_bytes();
  o.device_peak_delta = device_memory.peak();
  o.default_pool_high = device_memory_probe::default_pool_high();
  o.pool_peak_in_use = backend.get_allocator().peak_bytes_in_use();
  o.pool_peak_reserved = backend.get_allocator().peak_bytes_reserved();
  if (checker) {
    // Engine and framework draw from one pool: at the end of a forward it held the parameters, the
    // optimizer state and every activation together (the gradient shard of stages 2-3 is not held
    // then), and it never held more than each part's peak summed (plus the size classes' rounding, at
    // most 1/32).
    const auto& m = o.memory;
    const std::size_t together = m.params + m.optimizer + o.activation_bytes;
    const std::size_t sum_of_peaks = m.model_state_peak + m.buffers_peak + m.working_set_peak + o.framework_bytes;
    if (o.pool_peak_in_use < together || o.pool_peak_in_use > sum_of_peaks + sum_of_peaks / 32) {
      const std::lock_guard lock(print_mutex);
      std::fprintf(stderr,
                   "check: rank %d's pool peaked at %zu bytes in use; expected at least the parameters, the "
                   "optimizer state and the activations (%zu) and at most the sum of the peaks plus 1/32 (%zu)\n",
                   rank, o.pool_peak_in_use, together, sum_of_peaks + sum_of_peaks / 32);
      o.check_ok = false;
    }
  }
  if (offload.device == zero::offload_device::nvme ||
      cfg.zero_optimization.offload_param.device == zero::offload_device::nvme) {
    o.storage = std::string(eng.storage().name());
  }
  if (offload.device == zero::offload_device::cpu) {
    o.host_bound =
        host_side_bound(cfg, backend, comm.size(), o.params, eng.optimizer_split().ratio, opt.offload_threads);
  }
  return o;
}

void report(const outcome& o, bool json) {
  const auto& m = o.memory;
  // Peak allocated: the most bytes in use at once in the pool that engine and framework share (by
  // size class). Beside it, the sum of the peaks of each counter (each peaks at its own time, so an
  // upper bound): the engine's model state, buffers and gathered working set, plus the most the
  // framework holds.
  const std::size_t allocated = o.pool_peak_in_use;
  const std::size_t sum_of_peaks = m.model_state_peak + m.buffers_peak + m.working_set_peak + o.framework_bytes;
  if (json) {
    nlohmann::json j{{"impl", "zero"},
                     {"stage", o.stage},
                     {"gpus", o.gpus},
                     {"ranks", o.ranks},
                     // With ranks on one GPU: rows, the pool and engine peaks are per rank (rank 0's), the
                     // cudaMemGetInfo delta and the default pool's mark the GPU's (every rank's), and
                     // tflops_per_gpu counts every rank's rows.
                     {"ranks_on_one_gpu", o.ranks_on_one_gpu},
                     {"hidden", o.p.shape.hidden},
                     {"blocks", o.p.shape.blocks},
                     {"rows", o.p.shape.rows},
                     {"params", o.params},
                     {"steps", o.p.steps},
                     {"warmup", o.p.warmup},
                     {"lr", o.p.lr},
                     {"step_ms", o.step_ms},
                     {"step_mean_ms", o.step_mean_ms},
                     {"step_wall_ms", o.step_wall_ms},
                     {"forward_ms", o.forward_ms},
                     {"backward_ms", o.backward_ms},
                     {"optimizer_ms", o.optimizer_ms},
                     {"tflops_per_gpu", o.tflops_per_gpu},
                     {"flops_counted", "6*params*rows per step per GPU (rows of every rank on it): fwd + bwd (dx, "
                                       "dW) GEMMs; block 0's unused dx GEMM included; elementwise, optimizer, "
                                       "communication excluded"},
                     {"peak_allocated_bytes", allocated},
                     {"peak_reserved_bytes", o.pool_peak_reserved},
                     {"sum_of_peaks_bytes", sum_of_peaks},
                     {"device_used_delta_bytes", o.device_peak_delta},
                     {"model_state_peak_bytes", m.model_state_peak},
                     {"zero_formula_bytes", m.formula},
                     {"params_peak_bytes", m.params_peak},
                     {"grads_peak_bytes", m.grads_peak},
                     {"optimizer_peak_bytes", m.optimizer_peak},
                     {"buffers_peak_bytes", m.buffers_peak},
                     {"working_set_peak_bytes", m.working_set_peak},
                     {"offloaded", m.host_formula > 0},
                     {"host_params_bytes", m.host_params},
                     {"host_grads_bytes", m.host_grads},
                     {"host_optimizer_bytes", m.host_optimizer},
                     {"host_peak_bytes", m.host_peak},
                     {"host_formula_bytes", m.host_formula},
                     {"host_buffers_bytes", m.host_buffers},
                     {"nvme_bytes", m.nvme},
                     {"storage", o.storage},
                     {"framework_bytes", o.framework_bytes},
                     {"activation_bytes", o.activation_bytes},
                     {"default_mempool_reserved_high_bytes", o.default_pool_high},
                     {"loss_first", o.loss_first},
                     {"loss_last", o.loss_last}};
    if (o.host_bound) {
      j["host_bound"] = {{"host_adamw_params_per_s", o.host_bound->host_adamw_per_s},
                         {"to_device_bytes_per_s", o.host_bound->to_device_bytes_per_s},
                         {"to_host_bytes_per_s", o.host_bound->to_host_bytes_per_s},
                         {"host_adamw_ms", o.host_bound->host_adamw_ms},
                         {"transfer_ms", o.host_bound->transfer_ms},
                         {"bound_ms", o.host_bound->ms},
                         {"step_over_bound", o.host_bound->ms > 0 ? o.step_ms / o.host_bound->ms : 0.0}};
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    const double gib = double(std::size_t{1} << 30);
    // With ranks on one GPU the pool and the engine's counters are rank 0's, the cudaMemGetInfo delta the GPU's.
    const bool shared = o.ranks_on_one_gpu;
    const std::string where =
        shared ? std::to_string(o.ranks) + " ranks on one GPU" : std::to_string(o.gpus) + " GPU(s)";
    const std::string flops =
        shared ? "6 * params * rows * " + std::to_string(o.ranks) + " ranks" : "6 * params * rows";
    std::printf("stage %d, %s, hidden %d, %d blocks, %d rows/%s, %zu parameters\n"
                "  step %.2f ms median over %d steps (mean %.2f ms, wall %.2f ms), %.1f TFLOP/s per GPU (%s)\n"
                "  of it forward %.2f ms, backward %.2f ms, optimizer step to the next start %.2f ms (medians)\n"
                "  loss %.6f -> %.6f\n"
                "  peak allocated %.2f GiB (%s; the peaks of engine model state %.2f + buffers %.2f + gathered "
                "%.2f + framework %.2f = %.2f, activations %.2f of it)\n"
                "  peak reserved %.2f GiB (the pool's; cudaMemGetInfo delta %.2f GiB%s)\n"
                "  host (offloaded): peak %.2f GiB, formula %.2f GiB\n%s",
                o.stage, where.c_str(), o.p.shape.hidden, o.p.shape.blocks, o.p.shape.rows, shared ? "rank" : "GPU",
                o.params, o.step_ms, o.p.steps, o.step_mean_ms, o.step_wall_ms, o.tflops_per_gpu, flops.c_str(),
                o.forward_ms, o.backward_ms, o.optimizer_ms, o.loss_first, o.loss_last,
                static_cast<double>(allocated) / gib, shared ? "rank 0's pool" : "one pool",
                static_cast<double>(m.model_state_peak) / gib, static_cast<double>(m.buffers_peak) / gib,
                static_cast<double>(m.working_set_peak) / gib, static_cast<double>(o.framework_bytes) / gib,
                static_cast<double>(sum_of_peaks) / gib, static_cast<double>(o.activation_bytes) / gib,
                static_cast<double>(o.pool_peak_reserved) / gib, static_cast<double>(o.device_peak_delta) / gib,
                shared ? ", the GPU's: every rank's" : "", static_cast<double>(m.host_peak) / gib, m.host_formula / gib,
                m.table().c_str());
    if (const auto& b = o.host_bound) {
      std::printf("  host side's lower bound %.2f ms: max(host AdamW %.2f ms at %.2f Gparam/s probed now, copies %.2f "
                  "ms at %.1f / %.1f GB/s down / up); step / bound %.3f (forward + backward on the GPU not in it)\n",
                  b->ms, b->host_adamw_ms, b->host_adamw_per_s / 1e9, b->transfer_ms, b->to_host_bytes_per_s / 1e9,
                  b->to_device_bytes_per_s / 1e9, b->ms > 0 ? o.step_ms / b->ms : 0.0);
    }
    if (m.nvme > 0) {
      std::printf("  on NVMe (%s storage): optimizer state file %.2f GiB, parameter file %.2f GiB per rank (two "
                  "slots each); host buffers %.2f GiB (in the host peak)\n",
                  o.storage.c_str(), static_cast<double>(m.nvme - m.nvme_params) / gib,
                  static_cast<double>(m.nvme_params) / gib, static_cast<double>(m.host_buffers) / gib);
    }
  }
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  options opt; // auto-plan writes its block into it
  try {
    if (!parse(argc, argv, opt)) {
      std::printf("%s", usage_text);
      return 0;
    }
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "%s: %s\n%s", program, e.what(), usage_text);
    return 2;
  }
  const run_params p = resolve(opt);
  // An empty entry runs the --config file at its own stage.
  std::vector<std::optional<int>> stages;
  if (opt.stage) {
    stages.push_back(*opt.stage);
  } else if (!opt.config_file.empty()) {
    stages.push_back(std::nullopt);
  } else if (opt.check) {
    stages = {0, 1, 2, 3};
  } else {
    stages.push_back(2);
  }

  try {
    bool ok = true;
    if (opt.env) {
      auto comm = zero::nccl_communicator::from_env();
      for (const std::optional<int> stage : stages) {
        const auto o = train(comm, opt, p, stage);
        ok = ok && o.check_ok;
        if (comm.rank() == 0) {
          report(o, opt.json);
        }
      }
    } else {
      int visible = 0;
      if (cudaGetDeviceCount(&visible) != cudaSuccess) {
        (void)cudaGetLastError();
        visible = 0;
      }
      // --ranks: every rank on GPU 0; else a GPU per rank.
      const int needed = opt.ranks ? 1 : opt.gpus.value_or(visible);
      if (visible == 0 || needed > visible) {
        std::fprintf(stderr, "%s: skipped: %d GPU(s) asked for, %d visible\n", program, std::max(needed, 1), visible);
        return exit_skipped;
      }
      const int world = opt.ranks.value_or(needed);
      if (opt.config_file == auto_plan) {
        plan_run(opt, p, world, opt.ranks ? world : 1);
      }
      for (const std::optional<int> stage : stages) {
        outcome result;
        std::atomic<bool> all_ok{true};
        auto rank = [&](auto& comm) {
          auto o = train(comm, opt, p, stage);
          if (!o.check_ok) {
            all_ok = false;
          }
          if (comm.rank() == 0) {
            result = o;
          }
        };
        if (opt.ranks) {
          zero::run_device_group(
              world, [&](zero::device_group_communicator& comm) { rank(comm); }, shared_gpu);
        } else {
          zero::run_gpus(world, [&](zero::nccl_communicator& comm) { rank(comm); });
        }
        ok = ok && all_ok;
        report(result, opt.json);
      }
    }
    if (opt.check) {
      std::printf("%s\n", ok ? "check passed" : "check FAILED");
    }
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}
