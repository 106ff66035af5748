// zero-gpt: a GPT-2 trainer whose framework side is written here (gpt_model.hpp's math on the CPU, fp32 over
// OpenBLAS), with its parameters, gradients and optimizer in zero's engine, on in-process ranks. The same
// DeepSpeed config drives every ZeRO stage (docs/gpt.md). Under mpirun each process is a rank.
//
//   zero-gpt --text /usr/share/games/fortunes/literature --ranks 4 --stage 3 --steps 200
//   zero-gpt --train train.bin --val val.bin --preset d12 --config ds_config.json   (llm.c's token shards)
//   zero-gpt-cuda --device cuda --ranks 2 --stage 3 ...            a GPU per rank, one thread each, over NCCL
//   zero-gpt-cuda --device cuda --ranks 2 --one-gpu --stage 3 ...  2 ranks as threads sharing GPU 0
//                                                                  (device_group_communicator)
//
// It prints the loss every --print-every steps, the validation loss every --eval-every steps and at the end,
// --sample N generated tokens (bytes with --text), a checksum of the final parameters (equal bits at every
// stage for fp32), and with --json one JSON line per run.

#include "gpt_data.hpp"
#include "gpt_describe.hpp"
#include "gpt_engine.hpp"
#include "gpt_runtime.hpp"
#if ZERO_GPT_CUDA
#include "gpt_cuda_engine.hpp"
#endif

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cblas.h>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/backend/transfer.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>
#include <zero/tools/nvme_folders.hpp>
#include <zero/tools/plan.hpp>
#if ZERO_HAS_MPI
#include <zero/comm/mpi_communicator.hpp>
#endif
#if ZERO_HAS_CHECKPOINT
#include <filesystem>
#include <zero/checkpoint/checkpoint.hpp>
#include <zero/checkpoint/safetensors.hpp>
#endif

namespace {

struct options {
  std::string text, train, val, preset, config_file;
  std::optional<std::string> gpu_memory, host_memory, nvme_budget; // --config auto-plan's budgets
  gpt::model_config model;
  int ranks = 1;
  std::optional<int> stage;
  int batch = 4;
  long steps = 100;
  long print_every = 10;
  long eval_every = 0;
  int sample = 0;
  std::uint64_t seed = 1337;
  double lr = 1e-3;
  double clip = 1.0;
  bool json = false;
  std::optional<double> timeout;
  std::string export_dir, init_dir, save_dir, load_dir, nvme_path, logits_file;
  std::string describe_file, config_out; // --describe, --write-config
  bool eval_only = false;
  bool checkpoint_activations = false;
  bool offload_activations = false; // the built-in config's activation_checkpointing.cpu_checkpointing
  bool profile = false;
  bool gemm_epilogues = false;
  std::string device = "cpu";
  bool one_gpu = false; // --one-gpu: the --ranks share GPU 0 (device_group_communicator)
};

/// The built-in config: fp32 (bf16 with --device cuda), AdamW as GPT-2 trains (betas 0.9, 0.95; weight decay 0.1 on
/// matrices), clipping at 1, a cosine schedule over the run.
nlohmann::json default_config(const options& o) {
  nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", o.batch},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", o.clip},
      {"optimizer",
       {{"type", "AdamW"}, {"params", {{"lr", o.lr}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
      {"scheduler",
       {{"type", "WarmupCosineLR"},
        {"params",
         {{"total_num_steps", std::max<long>(o.steps, std::max<long>(2, o.steps / 10) + 1)}, // --steps 0: no step runs
          {"warmup_num_steps", std::max<long>(2, o.steps / 10)}}}}},
      {"zero_optimization", {{"stage", 0}, {"stage3_param_persistence_threshold", 0}}},
  };
  if (o.device == "cuda") {
    j["bf16"] = {{"enabled", true}}; // the GPU's math is bf16 (gpt_cuda.hpp)
  }
  if (o.offload_activations) {
    j["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  }
  return j;
}

struct outcome {
  int stage = 0;
  int ranks = 1;
  long steps = 0;
  double train_loss = 0, val_loss = 0, seconds = 0, tokens_per_s = 0;
  std::uint64_t checksum = 0;
  std::string sample;
  std::vector<double> losses;     ///< each optimizer step's mean token loss over the global batch
  std::vector<double> grad_norms; ///< each optimizer step's global gradient norm (before clipping)
  double flops_per_token = 0;     ///< the model's training FLOPs per token (gpt::flops_per_token)
  std::size_t device_peak_bytes = 0, activation_bytes = 0;
  std::size_t device_base_bytes = 0;          ///< the GPU's use before the engine allocated (the CUDA context)
  std::size_t device_reserved_peak_bytes = 0; ///< the most the engine's device pool held from CUDA
  std::size_t checkpoint_host_bytes = 0;      ///< host memory of the activation checkpoints (cpu_checkpointing)
  bool checkpoint_activations = false;
  std::vector<std::pair<std::string, double>> profile; ///< ms per step of each operation (--profile)
  double peak_flops = 0;                               ///< the device's peak rate (0: unknown, no MFU)
  std::string device;
  zero::memory_report memory;
};

template <class Engine, class Model, class Sums>
double evaluate(Engine& eng, Model& model, const gpt::token_data& val, int batch, int rank, int ranks, Sums& sum) {
  // Every window of seq + 1 tokens at 0, seq, 2 seq, ... (gpt_data.hpp's eval_windows), split over the ranks;
  // at stage 3 every forward gathers, so every rank runs as many forwards (a rank out of windows repeats its
  // last batch without counting it).
  const int T = model.config().seq;
  const auto windows = gpt::eval_windows(val.tokens.size(), T);
  const std::size_t per_rank = (windows.size() + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks);
  const std::size_t first = std::min(windows.size(), per_rank * static_cast<std::size_t>(rank));
  const std::size_t end = std::min(windows.size(), first + per_rank);
  const std::size_t forwards = (per_rank + static_cast<std::size_t>(batch) - 1) / static_cast<std::size_t>(batch);
  std::vector<std::int32_t> in(static_cast<std::size_t>(batch * T)), tg(in.size());
  double sums[2] = {0, 0};
  auto scope = eng.evaluation();
  for (std::size_t f = 0; f < forwards; ++f) {
    const std::size_t b0 = first + f * static_cast<std::size_t>(batch);
    const std::size_t n = b0 < end ? std::min<std::size_t>(static_cast<std::size_t>(batch), end - b0) : 0;
    const std::size_t rows = std::max<std::size_t>(n, 1);
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t w = n > 0 ? windows[b0 + r].first : 0;
      for (int t = 0; t < T; ++t) {
        in[r * static_cast<std::size_t>(T) + static_cast<std::size_t>(t)] = val.tokens[w + static_cast<std::size_t>(t)];
        tg[r * static_cast<std::size_t>(T) + static_cast<std::size_t>(t)] =
            val.tokens[w + static_cast<std::size_t>(t) + 1];
      }
    }
    const double loss = model.run(in.data(), tg.data(), static_cast<int>(rows), T, false, 1.0f);
    if (n > 0) {
      sums[0] += loss;
      sums[1] += static_cast<double>(n) * T;
    }
  }
  sum(eng, sums, 2);
  return sums[1] > 0 ? sums[0] / sums[1] : 0.0;
}

/// `count` tokens generated greedily-with-temperature from the first token of `prompt`, on every rank in step
/// (each forward gathers at stage 3), with one seed so every rank draws the same tokens.
template <class Engine, class Model>
std::string sample_text(Engine& eng, Model& model, const gpt::token_data& prompt, int count, std::uint64_t seed) {
  const int T = model.config().seq;
  const int V = model.config().vocab;
  std::vector<std::int32_t> ctx{prompt.tokens.empty() ? 0 : static_cast<std::int32_t>(prompt.tokens[0])};
  std::vector<std::int32_t> in(static_cast<std::size_t>(T)), tg(static_cast<std::size_t>(T), 0);
  std::mt19937_64 rng(seed);
  std::string out;
  auto scope = eng.evaluation();
  for (int i = 0; i < count; ++i) {
    const int n = std::min<int>(static_cast<int>(ctx.size()), T);
    std::copy(ctx.end() - n, ctx.end(), in.begin());
    static_cast<void>(model.run(in.data(), tg.data(), 1, n, false, 1.0f));
    const auto logits = model.logits().subspan(static_cast<std::size_t>((n - 1) * V), static_cast<std::size_t>(V));
    const float top = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(static_cast<std::size_t>(V));
    for (int v = 0; v < V; ++v) {
      p[static_cast<std::size_t>(v)] = std::exp((logits[static_cast<std::size_t>(v)] - top) / 0.8);
    }
    std::discrete_distribution<int> pick(p.begin(), p.end());
    const int next = pick(rng);
    ctx.push_back(next);
    if (V > 256) {
      out += "<" + std::to_string(next) + ">";
    } else if ((next >= 32 && next < 127) || next == '\n') {
      out += static_cast<char>(next);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", next); // a byte that is not printable ASCII, shown as \xNN
      out += hex;
    }
  }
  return out;
}

/// The value of --config that plans the run instead of reading a file.
constexpr const char* auto_plan = "auto-plan";

/// --config auto-plan: the fastest stage and offload setting for this GPT on --ranks ranks that fits the budgets
/// (--gpu-memory, --host-memory, --nvme; by default the runtime's: the host's available memory on the CPU, GPU 0's
/// free memory less the model's activations on a GPU, and the free space of --nvme-path), by the rates measured
/// now (zero/tools/probes.hpp). With --one-gpu each rank plans for its share of GPU 0: 1/ranks of its free memory
/// (less the rank's own activations), of its AdamW rate and of its copy rates, as the planner shares the host's
/// rate among a node's ranks. Prints the plan (to stderr with --json) and merges its config block into `cfg`.
/// \throws zero::usage_error when nothing fits, or for a bad byte count.
template <class Runtime> void plan_run(const options& o, nlohmann::json& cfg) {
  namespace zt = zero::tools;
  const auto c = zero::config::from_json(cfg, {.world_size = o.ranks}, "built-in config");
  // The modules zero_gpt registers (gpt_engine.hpp): embed, h.<l>, ln_f, each its tensors' sizes.
  std::vector<std::vector<std::int64_t>> modules;
  int block = -2;
  for (const auto& p : gpt::parameters(o.model)) {
    if (p.block != block) {
      modules.emplace_back();
      block = p.block;
    }
    modules.back().push_back(p.numel());
  }
  const auto model = zt::summarize_modules(modules);
  const auto est = zt::estimate_options_from(c, model, o.ranks);
  std::optional<std::filesystem::path> nvme;
  if (!o.nvme_path.empty()) {
    std::filesystem::create_directories(o.nvme_path); // the storage is measured there
    nvme = o.nvme_path;
  }
  const int ranks_per_gpu = o.one_gpu ? o.ranks : 1;
  zt::memory_budget budget;
  budget.device_bytes = o.gpu_memory
                            ? zt::parse_bytes(*o.gpu_memory)
                            : Runtime::plan_device_bytes(o.model, static_cast<int>(c.train_micro_batch_size_per_gpu),
                                                         o.checkpoint_activations, ranks_per_gpu);
  budget.host_bytes = o.host_memory ? zt::parse_bytes(*o.host_memory) : zt::available_host_memory();
  budget.nvme_bytes = o.nvme_budget ? zt::parse_bytes(*o.nvme_budget) : nvme ? zt::free_storage_bytes(*nvme) : 0;
  auto rates = Runtime::plan_rates(nvme);
  // The ranks of one GPU step their shards on it at once and copy over its one link: each gets its share.
  rates.device_adamw /= ranks_per_gpu;
  rates.host_to_device /= ranks_per_gpu;
  rates.device_to_host /= ranks_per_gpu;
  const auto plan = zt::make_plan(est, rates, budget);
  std::FILE* out = o.json ? stderr : stdout;
  std::fprintf(out,
               "auto-plan for %lld parameters on %d rank(s)%s; budgets: %s per rank, %s of host memory, %s of NVMe\n%s",
               static_cast<long long>(model.params), o.ranks, o.one_gpu ? " sharing GPU 0" : "",
               zt::show_bytes(budget.device_bytes).c_str(), zt::show_bytes(budget.host_bytes).c_str(),
               zt::show_bytes(budget.nvme_bytes).c_str(), zt::plan_table(plan).c_str());
  if (!plan.chosen) {
    throw zero::usage_error("--config auto-plan: no setting fits the budgets (--gpu-memory, --host-memory, --nvme)");
  }
  const auto block_json = zt::plan_config_block(plan.ranked[*plan.chosen].row, est, o.nvme_path);
  std::fprintf(out, "config block:\n%s\n", block_json.dump(2).c_str());
  std::fflush(out);
  cfg.merge_patch(block_json);
}

/// Writes the logits of the first evaluation window (validation tokens 0..seq-1) to `file` from rank 0: seq x vocab
/// little-endian fp32, row-major, what bench/gpt/hf_check.py compares with transformers' logits. Every rank runs the
/// forward (stage 3 gathers on all).
template <class Engine, class Model>
void write_first_logits(Engine& eng, Model& model, const gpt::token_data& val, const std::string& file, int rank) {
  const int T = model.config().seq;
  std::vector<std::int32_t> in(static_cast<std::size_t>(T)), tg(in.size());
  for (std::size_t t = 0; t < in.size(); ++t) {
    in[t] = val.tokens[t];
    tg[t] = val.tokens[t + 1];
  }
  auto scope = eng.evaluation();
  static_cast<void>(model.run(in.data(), tg.data(), 1, T, false, 1.0f));
  if (rank != 0) {
    return;
  }
  const auto logits = model.logits();
  std::ofstream f(file, std::ios::binary);
  f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size_bytes()));
  if (!f.flush()) {
    throw std::runtime_error(file + ": could not write " + std::to_string(logits.size_bytes()) + " bytes of logits");
  }
}

/// Trains and evaluates on `comm`'s ranks (in-process threads, processes under mpirun, or GPUs with Runtime
/// gpt::cuda_runtime); every rank calls it.
template <class Runtime, class Comm>
outcome train(Comm& comm, const nlohmann::json& cfg_json, const options& o, const gpt::token_data& train_set,
              const gpt::token_data& val_set) {
  zero::config_inputs inputs;
  inputs.world_size = comm.size();
  const auto cfg = zero::config::from_json(cfg_json, inputs, o.config_file.empty() ? "built-in config" : o.config_file);
  Runtime rt;
  auto backend = rt.backend(comm);
  rt.sample_base();
  typename Runtime::template engine_type<Comm> eng(cfg, comm, backend);
  gpt::host_sums<Comm> sum(comm);
  if (o.timeout) {
    comm.set_timeout(std::chrono::milliseconds(std::llround(*o.timeout * 1000.0)));
  }
  const int B = static_cast<int>(cfg.train_micro_batch_size_per_gpu);
  const int T = o.model.seq;
  gpt::zero_gpt<decltype(eng), typename Runtime::math> model(eng, o.model, B,
                                                             gpt::math_options{.checkpoint = o.checkpoint_activations,
                                                                               .profile = o.profile,
                                                                               .gemm_epilogues = o.gemm_epilogues});
  eng.finalize();
  long first_step = 0;
#if ZERO_HAS_CHECKPOINT
  if (!o.init_dir.empty()) {
    eng.init_from_safetensors(std::filesystem::path(o.init_dir) / "model.safetensors");
  } else {
    model.init(o.seed);
  }
  if (!o.load_dir.empty()) {
    // At any stage and rank count; the batches go on from the step it saved.
    first_step = static_cast<long>(zero::checkpoint::reader(o.load_dir).info().boundaries);
    eng.load(o.load_dir);
  }
#else
  model.init(o.seed);
#endif

  const int gas = static_cast<int>(cfg.gradient_accumulation_steps);
  const double tokens_per_step = static_cast<double>(cfg.train_batch_size) * T;
  // Micro-step k of rank r draws sequences of the global batch as "rank" k * ranks + r of ranks * gas: the same
  // global batch whatever the rank count and accumulation.
  std::vector<gpt::batch_sampler> samplers;
  for (int k = 0; k < gas && !o.eval_only; ++k) {
    samplers.emplace_back(train_set, B, T, k * comm.size() + comm.rank(), comm.size() * gas, o.seed);
  }
  std::vector<std::int32_t> in(static_cast<std::size_t>(B * T)), tg(in.size());
  outcome out;
  out.stage = cfg.stage();
  out.ranks = comm.size();
  double window[2] = {0, 0};
  const auto start = std::chrono::steady_clock::now();
  auto steady_start = start; // the end of the first step: tokens/s leaves out its one-time costs
  const long steps = o.eval_only ? first_step : o.steps;
  for (long step = first_step; step < steps; ++step) {
    zero::step_result r;
    double step_sums[2] = {0, 0};
    for (int k = 0; k < gas; ++k) {
      auto& micro = samplers[static_cast<std::size_t>(k)];
      micro.seek(static_cast<std::uint64_t>(step));
      micro.next(in.data(), tg.data());
      // The gradient of this micro-batch's mean token loss (times the loss scale): the engine averages over the
      // ranks and divides by the accumulation steps, as DeepSpeed does, so the step sees the global batch's mean.
      const float scale = static_cast<float>(eng.loss_scale() / (static_cast<double>(B) * T));
      step_sums[0] += model.run(in.data(), tg.data(), B, T, true, scale);
      step_sums[1] += static_cast<double>(B) * T;
      model.mark("engine: step");
      r = eng.step();
    }
    // The step's loss over the whole global batch (the reference in bench/gpt compares it step by step).
    sum(eng, step_sums, 2);
    out.losses.push_back(step_sums[0] / step_sums[1]);
    out.grad_norms.push_back(r.grad_norm);
    rt.sample_memory();
    if (step == first_step) {
      steady_start = std::chrono::steady_clock::now(); // the loss's sum waited for the step's work
      model.profile_reset();                           // the profile leaves out the first step too
    }
    window[0] += step_sums[0];
    window[1] += step_sums[1];
    const bool last = step + 1 == steps;
    if ((step + 1) % o.print_every == 0 || last) {
      out.train_loss = window[0] / window[1];
      if (comm.rank() == 0 && !o.json) {
        std::printf("stage %d step %5ld  train loss %.4f  lr %.3e  grad norm %.3f\n", cfg.stage(), step + 1,
                    out.train_loss, r.lr, r.grad_norm);
        std::fflush(stdout);
      }
      window[0] = window[1] = 0;
    }
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && !last) {
      const double v = evaluate(eng, model, val_set, B, comm.rank(), comm.size(), sum);
      if (comm.rank() == 0 && !o.json) {
        std::printf("stage %d step %5ld  val loss %.4f\n", cfg.stage(), step + 1, v);
      }
    }
  }
  rt.synchronize(eng);
  const auto end = std::chrono::steady_clock::now();
  out.steps = steps;
  out.seconds = std::chrono::duration<double>(end - start).count();
  // Tokens per second over the steps after the first (over the one step when only one ran).
  const long timed = steps - first_step > 1 ? steps - first_step - 1 : steps - first_step;
  const double timed_s =
      std::chrono::duration<double>(end - (timed < steps - first_step ? steady_start : start)).count();
  out.tokens_per_s = timed > 0 ? tokens_per_step * static_cast<double>(timed) / timed_s : 0.0;
  out.profile = model.profile();
  for (auto& [name, ms] : out.profile) {
    ms /= static_cast<double>(std::max<long>(timed, 1));
  }
  out.flops_per_token = gpt::flops_per_token(o.model);
  out.device_peak_bytes = rt.device_peak_bytes();
  out.device_base_bytes = rt.device_base_bytes();
  out.device_reserved_peak_bytes = Runtime::reserved_peak_bytes(eng);
  out.peak_flops = rt.peak_flops();
  out.device = rt.device_name();
  out.activation_bytes = model.activation_bytes();
  out.checkpoint_host_bytes = model.checkpoint_host_bytes();
  out.checkpoint_activations = o.checkpoint_activations;
  out.val_loss = evaluate(eng, model, val_set, B, comm.rank(), comm.size(), sum);
  if (o.sample > 0) {
    out.sample = sample_text(eng, model, val_set, o.sample, o.seed);
  }
  if (!o.logits_file.empty()) {
    write_first_logits(eng, model, val_set, o.logits_file, comm.rank());
  }
  // The final parameters' checksum, module by module in registration order (each gathered at stage 3).
  std::uint64_t h = gpt::detail::fnv1a_basis;
  {
    // Read through the backend's copy: on a GPU the parameters are device memory.
    auto scope = eng.evaluation(zero::eval_gather::whole_model);
    std::vector<std::byte> bytes;
    for (std::size_t k = 0; k < model.specs().size(); ++k) {
      const auto p = eng.param(model.handle(k));
      bytes.resize(p.numel * zero::size_of(p.type));
      zero::copy_and_wait<decltype(eng)::allocator_type::host_accessible>(
          eng.backend(), eng.stream(), static_cast<const std::byte*>(p.data), bytes.data(), bytes.size());
      h = gpt::detail::fnv1a(bytes.data(), bytes.size(), h);
    }
  }
  out.checksum = h;
  out.memory = eng.memory();
#if ZERO_HAS_CHECKPOINT
  if (!o.save_dir.empty() && !o.eval_only) {
    eng.save(o.save_dir, "step-" + std::to_string(steps));
  }
  if (!o.export_dir.empty()) {
    // Hugging Face's GPT2LMHeadModel.from_pretrained(DIR) reads these: the registered names are its names, the
    // Conv1D weights its [in, out] layout, and lm_head is tied to wte (no tensor of its own).
    const std::filesystem::path dir(o.export_dir);
    if (comm.rank() == 0) {
      std::filesystem::create_directories(dir);
    }
    comm.barrier().wait();
    eng.export_safetensors(dir / "model.safetensors", zero::dtype::f32);
    if (comm.rank() == 0) {
      const auto& m = o.model;
      const nlohmann::json hf{{"architectures", {"GPT2LMHeadModel"}},
                              {"model_type", "gpt2"},
                              {"vocab_size", m.vocab},
                              {"n_positions", m.seq},
                              {"n_ctx", m.seq},
                              {"n_embd", m.d_model},
                              {"n_layer", m.layers},
                              {"n_head", m.heads},
                              {"n_inner", nullptr},
                              {"activation_function", "gelu_new"},
                              {"layer_norm_epsilon", 1e-5},
                              {"resid_pdrop", 0.0},
                              {"embd_pdrop", 0.0},
                              {"attn_pdrop", 0.0},
                              {"tie_word_embeddings", true},
                              // GPT-2's <|endoftext|> where the vocabulary has it (not with --text's bytes).
                              {"bos_token_id", m.vocab > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
                              {"eos_token_id", m.vocab > 50256 ? nlohmann::json(50256) : nlohmann::json(nullptr)},
                              {"torch_dtype", "float32"}};
      std::ofstream(dir / "config.json") << hf.dump(2) << "\n";
    }
  }
#endif
  return out;
}

// --profile's table: each operation's milliseconds per step and share of their sum, the longest first.
void print_profile(std::vector<std::pair<std::string, double>> profile) {
  if (profile.empty()) {
    return;
  }
  std::sort(profile.begin(), profile.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  double total = 0;
  for (const auto& p : profile) {
    total += p.second;
  }
  std::printf("profile (ms per step, on the model's stream; %.2f ms in all):\n", total);
  for (const auto& [name, ms] : profile) {
    std::printf("  %-34s %9.3f  %5.1f%%\n", name.c_str(), ms, 100.0 * ms / total);
  }
}

void report(const outcome& r, const options& o, double entropy) {
  if (o.eval_only) {
    // The last line is the JSON object other tools read: the mean next-token loss over every window.
    std::printf("%s\n",
                nlohmann::json{{"val_loss", r.val_loss}, {"stage", r.stage}, {"ranks", r.ranks}}.dump().c_str());
    std::fflush(stdout);
    return;
  }
  if (o.json) {
    nlohmann::json j{{"stage", r.stage},
                     {"ranks", r.ranks},
                     // --one-gpu: the ranks share one GPU, so device_peak_bytes is that GPU's, every rank's bytes
                     // together, and mfu divides by one GPU's peak; the engine's bytes are per rank as always.
                     {"ranks_on_one_gpu", o.one_gpu},
                     {"steps", r.steps},
                     {"train_loss", r.train_loss},
                     {"val_loss", r.val_loss},
                     {"unigram_entropy", entropy},
                     {"tokens_per_s", r.tokens_per_s},
                     {"seconds", r.seconds},
                     {"params_checksum", r.checksum},
                     {"model_state_peak_bytes", r.memory.model_state_peak},
                     {"formula_bytes", r.memory.formula},
                     {"working_set_peak_bytes", r.memory.working_set_peak},
                     {"peak_bytes",
                      {{"params", r.memory.params_peak},
                       {"grads", r.memory.grads_peak},
                       {"optimizer", r.memory.optimizer_peak},
                       {"buffers", r.memory.buffers_peak},
                       {"host", r.memory.host_peak}}},
                     {"losses", r.losses},
                     {"grad_norms", r.grad_norms},
                     {"device", r.device},
                     {"flops_per_token", r.flops_per_token},
                     {"model_tflops_per_s", r.tokens_per_s * r.flops_per_token / 1e12},
                     {"activation_bytes", r.activation_bytes},
                     {"checkpoint_activations", r.checkpoint_activations},
                     {"host_formula_bytes", r.memory.host_formula},
                     {"host_share", r.memory.host_share},
                     {"nvme_bytes", r.memory.nvme},
                     {"host_buffers_bytes", r.memory.host_buffers},
                     {"checkpoint_host_bytes", r.checkpoint_host_bytes}};
    if (r.device_peak_bytes > 0) {
      j["device_peak_bytes"] = r.device_peak_bytes; // cudaMemGetInfo's use of rank 0's GPU at its highest step end
      j["device_base_bytes"] = r.device_base_bytes; // its use before the engine allocated
      j["device_reserved_peak_bytes"] = r.device_reserved_peak_bytes; // the engine pool's most held from CUDA
    }
    if (r.peak_flops > 0) {
      // tokens_per_s counts the global batch: the peak of every GPU the ranks ran on (one with --one-gpu).
      const int gpus = o.one_gpu ? 1 : r.ranks;
      j["mfu"] = r.tokens_per_s * r.flops_per_token / (r.peak_flops * gpus);
    }
    if (!r.sample.empty()) {
      j["sample"] = r.sample;
    }
    if (!r.profile.empty()) {
      auto& p = j["profile_ms_per_step"] = nlohmann::json::object();
      for (const auto& [name, ms] : r.profile) {
        p[name] = ms;
      }
    }
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("stage %d, %d ranks%s: val loss %.4f (byte unigram entropy %.4f) after %ld steps in %.1f s, %.0f "
                "tokens/s\nparams checksum %016llx\n%s",
                r.stage, r.ranks, o.one_gpu ? " on one GPU" : "", r.val_loss, entropy, r.steps, r.seconds,
                r.tokens_per_s, static_cast<unsigned long long>(r.checksum), r.memory.table().c_str());
    if (!r.sample.empty()) {
      std::printf("sample: %s\n", r.sample.c_str());
    }
    print_profile(r.profile);
  }
  std::fflush(stdout);
}

} // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"zero-gpt: GPT-2 trained with zero's engine on in-process ranks (docs/gpt.md)"};
  app.add_option("--text", o.text, "a plain text file, one token per byte (vocab 256), split 90/10 into train/val");
  app.add_option("--train", o.train, "llm.c token shard for training (.bin: 256 int32 header, uint16 tokens)");
  app.add_option("--val", o.val, "llm.c token shard for validation");
  app.add_option("--preset", o.preset, "d12, d24, d36 or d48 (GPT-2 124M ... 1.56B, as llm.c's -e dN)");
  app.add_option("--layers", o.model.layers, "transformer blocks");
  app.add_option("--heads", o.model.heads, "attention heads");
  app.add_option("--d-model", o.model.d_model, "model width");
  app.add_option("--seq", o.model.seq, "context length");
  app.add_option("--vocab", o.model.vocab, "vocabulary size (256 with --text)");
  app.add_option("--ranks", o.ranks,
                 "in-process ranks (with --device cuda: GPUs, one thread each; with --one-gpu, threads sharing GPU 0)")
      ->check(CLI::Range(1, 64));
  app.add_flag("--one-gpu", o.one_gpu,
               "with --device cuda: the --ranks ranks (at most 16) as threads sharing GPU 0, each with streams of its "
               "own (device_group_communicator) instead of a GPU each over NCCL");
#if ZERO_GPT_CUDA
  app.add_option("--device", o.device,
                 "where the model runs: cuda (bf16, cuBLAS, NCCL or --one-gpu) or cpu (fp32, OpenBLAS)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  o.device = "cuda";
#endif
  app.add_option("--stage", o.stage, "ZeRO stage, overriding the config's")->check(CLI::Range(0, 3));
  app.add_option("--config", o.config_file,
                 "a DeepSpeed config (default: built in, fp32, AdamW, WarmupCosineLR), or auto-plan: the built-in "
                 "config at the fastest stage and offload that fit this machine");
  app.add_option("--gpu-memory", o.gpu_memory,
                 "with --config auto-plan: bytes per rank, e.g. 2MiB (default: the host's available "
                 "memory on the CPU, GPU 0's free memory less the model's activations on a GPU; with --one-gpu, "
                 "1/ranks of GPU 0's free memory less each rank's activations)");
  app.add_option("--host-memory", o.host_memory,
                 "with --config auto-plan: bytes of host memory (default: the host's available memory)");
  app.add_option("--nvme", o.nvme_budget,
                 "with --config auto-plan: bytes on NVMe under --nvme-path (default: its free "
                 "space; none without --nvme-path)");
  app.add_option("--batch", o.batch, "sequences per rank and micro-step (built-in config)")->check(CLI::Range(1, 4096));
  app.add_option("--steps", o.steps, "optimizer steps (0: none; with --export, the initial model)")
      ->check(CLI::Range(0L, 100000000L));
  app.add_option("--lr", o.lr, "AdamW's learning rate (built-in config)")->check(CLI::PositiveNumber);
  app.add_option("--clip", o.clip, "gradient clipping's global norm, 0 for none (built-in config)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--print-every", o.print_every, "steps between loss lines")->check(CLI::Range(1L, 100000000L));
  app.add_option("--eval-every", o.eval_every, "steps between validation losses (0: at the end only)");
  app.add_option("--sample", o.sample, "tokens to generate at the end")->check(CLI::Range(0, 100000));
  app.add_option("--seed", o.seed, "seed of the initialisation, the batches and the sample");
  app.add_option("--timeout", o.timeout, "seconds a collective may wait (the config's comm_timeout otherwise)");
  app.add_flag("--json", o.json, "one JSON line per run");
  app.add_flag("--offload-activations", o.offload_activations,
               "with --checkpoint-activations: the checkpoints in host memory (the built-in config's "
               "activation_checkpointing.cpu_checkpointing; in a --config file, set the key there)");
  auto* epilogues = app.add_flag("--gemm-epilogues,!--no-gemm-epilogues", o.gemm_epilogues,
                                 "the projections' biases, residual adds and GELU in cuBLASLt's GEMM epilogues "
                                 "(--device cuda; the default there)");
  app.add_flag("--profile", o.profile,
               "time every operation on the model's stream and print milliseconds per step (--device cuda)");
  app.add_flag("--checkpoint-activations", o.checkpoint_activations,
               "keep each block's input only and recompute the block in backward (--device cuda); with the config's "
               "activation_checkpointing.cpu_checkpointing the inputs live in host memory");
  app.add_option("--export", o.export_dir, "write model.safetensors and config.json for Hugging Face's GPT-2 here");
  app.add_option("--init", o.init_dir,
                 "start from DIR/model.safetensors (an --export, or a Hugging Face GPT-2 folder "
                 "with safetensors); the model's sizes from DIR/config.json");
  app.add_flag("--eval-only", o.eval_only,
               "no training: print {\"val_loss\": ...} over every window of --seq + 1 "
               "tokens of the validation data at 0, seq, 2 seq, ...");
  app.add_option("--nvme-path", o.nvme_path,
                 "folder of the swap files of NVMe offload, overriding the config's "
                 "nvme_path (created if missing)");
  app.add_option("--logits", o.logits_file,
                 "write the logits of the first validation window (seq x vocab fp32) to this file at the end");
  app.add_option("--save", o.save_dir, "save a checkpoint here at the end (tag step-N)");
  app.add_option("--load", o.load_dir, "resume from the latest checkpoint here, at any stage and rank count");
  app.add_option("--describe", o.describe_file,
                 "write the model's description (zero-estimate --model FILE) and exit: no data, no training");
  app.add_option(
      "--write-config", o.config_out,
      "write the run's DeepSpeed config (built in or --config's, with --stage, --nvme-path) here, then train");
  CLI11_PARSE(app, argc, argv);
  if (epilogues->count() == 0) {
    o.gemm_epilogues = o.device == "cuda";
  }
  if (o.one_gpu && o.device != "cuda") {
#if ZERO_GPT_CUDA
    const char* build = "";
#else
    const char* build = " (zero-gpt-cuda; this build has no GPU path)";
#endif
    std::fprintf(stderr, "zero-gpt: --one-gpu runs the --ranks as threads sharing GPU 0; expected --device cuda%s\n",
                 build);
    return 2;
  }
#if ZERO_GPT_CUDA
  if (o.one_gpu && o.ranks > static_cast<int>(zero::cuda::max_reduce_ranks)) {
    std::fprintf(stderr, "zero-gpt: --one-gpu --ranks %d: at most %zu ranks share one GPU; expected --ranks 1 to %zu\n",
                 o.ranks, zero::cuda::max_reduce_ranks, zero::cuda::max_reduce_ranks);
    return 2;
  }
#endif
  const bool planned = o.config_file == auto_plan;
  if (o.offload_activations && (!o.checkpoint_activations || (!o.config_file.empty() && !planned))) {
    std::fprintf(stderr, "zero-gpt: --offload-activations %s\n",
                 !o.checkpoint_activations
                     ? "keeps the checkpoints of --checkpoint-activations in host memory; expected both"
                     : "sets the built-in config's activation_checkpointing.cpu_checkpointing; with --config FILE, "
                       "expected the key in the file");
    return 2;
  }
  if (const auto refusal = zero::tools::plan_flags_refusal({.planned = planned,
                                                            .config_file = !o.config_file.empty() && !planned,
                                                            .gpu_memory = o.gpu_memory,
                                                            .host_memory = o.host_memory,
                                                            .nvme = o.nvme_budget,
                                                            .nvme_path = !o.nvme_path.empty(),
                                                            .stage = o.stage.has_value()})) {
    std::fprintf(stderr, "zero-gpt: %s\n", refusal->c_str());
    return 2;
  }
  // Under mpirun each process is a rank; --ranks is the launcher's count.
  const char* launcher = std::getenv("OMPI_COMM_WORLD_SIZE");
  launcher = launcher != nullptr ? launcher : std::getenv("PMI_SIZE");
  const bool under_mpi = launcher != nullptr;
#if ZERO_HAS_MPI
  if (under_mpi) {
    MPI_Init(&argc, &argv);
    o.ranks = std::atoi(launcher);
    openblas_set_num_threads(1);
  }
#else
  if (under_mpi) {
    std::fprintf(stderr, "zero-gpt: started under mpirun but built without MPI (zero::mpi)\n");
    return 2;
  }
#endif
  try {
    if (o.describe_file.empty() && o.text.empty() == (o.val.empty() || (o.train.empty() && !o.eval_only))) {
      throw std::invalid_argument("give --text FILE, or --train FILE and --val FILE (--val alone with --eval-only)");
    }
    if (under_mpi && o.device == "cuda") {
      throw std::invalid_argument("--device cuda under mpirun: GPU ranks run as threads of one process here "
                                  "(--ranks N); expected --device cpu under mpirun");
    }
#if !ZERO_HAS_CHECKPOINT
    if (!o.export_dir.empty() || !o.init_dir.empty() || !o.save_dir.empty() || !o.load_dir.empty()) {
      throw std::invalid_argument("--export, --init, --save and --load need zero::checkpoint (libxxhash-dev); this "
                                  "build has none");
    }
#endif
    if (!o.preset.empty()) {
      // The preset gives the sizes; --seq may change its context (wpe grows or shrinks with it).
      for (const char* size : {"--layers", "--heads", "--d-model", "--vocab"}) {
        if (app.count(size) > 0) {
          throw std::invalid_argument(std::string(size) + " with --preset " + o.preset +
                                      ": the preset sets it; expected --preset or the sizes, not both (--seq may "
                                      "change the preset's context)");
        }
      }
      const int seq = o.model.seq;
      o.model = gpt::model_config::preset(o.preset);
      if (app.count("--seq") > 0) {
        o.model.seq = seq;
      }
    }
    if (!o.init_dir.empty()) {
      // The sizes of the model in DIR: Hugging Face's names for them.
      const auto hf = zero::config::read_json_file(std::filesystem::path(o.init_dir) / "config.json");
      const auto size = [&](const char* key) {
        if (!hf.contains(key) || !hf[key].is_number_integer()) {
          throw std::invalid_argument(o.init_dir + "/config.json: " + key + " is missing or not an integer");
        }
        return hf[key].get<int>();
      };
      o.model.vocab = size("vocab_size");
      o.model.seq = size("n_positions");
      o.model.d_model = size("n_embd");
      o.model.layers = size("n_layer");
      o.model.heads = size("n_head");
    }
    if (!o.text.empty() && o.init_dir.empty()) {
      o.model.vocab = 256;
    }
    o.model.validate();
    if (!o.describe_file.empty()) {
      gpt::write_json_file(o.describe_file, gpt::describe(o.model));
#if ZERO_HAS_MPI
      if (under_mpi) {
        MPI_Finalize();
      }
#endif
      return 0;
    }
    gpt::token_data train_set, val_set;
    if (!o.text.empty()) {
      std::tie(train_set, val_set) = gpt::split_train_val(gpt::load_text_bytes(o.text));
    } else {
      val_set = gpt::load_llmc_shard(o.val, o.model.vocab);
      train_set = o.train.empty() ? val_set : gpt::load_llmc_shard(o.train, o.model.vocab);
    }
    if (gpt::eval_windows(val_set.tokens.size(), o.model.seq).empty()) {
      throw gpt::data_error(val_set.source + ": " + std::to_string(val_set.tokens.size()) +
                            " tokens hold no window of --seq + 1 = " + std::to_string(o.model.seq + 1) +
                            "; expected more validation tokens or a shorter --seq");
    }
    nlohmann::json cfg =
        o.config_file.empty() || planned ? default_config(o) : zero::config::read_json_file(o.config_file);
    if (planned) {
      if (under_mpi) {
        // Each process would measure its own rates, and processes that chose differently would hang.
        throw std::invalid_argument("--config auto-plan runs in-process ranks (--ranks), not under mpirun");
      }
#if ZERO_GPT_CUDA
      if (o.device == "cuda") {
        plan_run<gpt::cuda_runtime>(o, cfg);
      } else {
        plan_run<gpt::cpu_runtime>(o, cfg);
      }
#else
      plan_run<gpt::cpu_runtime>(o, cfg);
#endif
    }
    if (o.stage) {
      cfg["zero_optimization"]["stage"] = *o.stage;
    }
    if (!o.nvme_path.empty()) {
      zero::tools::override_nvme_paths(cfg, o.nvme_path);
    }
    // Refuse a bad config and data too small for one global batch before any thread starts.
    const auto first =
        zero::config::from_json(cfg, {.world_size = o.ranks}, o.config_file.empty() ? "built-in" : o.config_file);
    for (const auto& [key, dir] : zero::nvme_folders(first)) {
      zero::tools::make_nvme_folder(key, dir); // the engine creates its files in it, not the folder
    }
    if (!o.config_out.empty()) {
      gpt::write_json_file(o.config_out, cfg);
    }
    if (!o.eval_only) {
      gpt::batch_sampler check(train_set, static_cast<int>(first.train_micro_batch_size_per_gpu), o.model.seq, 0,
                               o.ranks * static_cast<int>(first.gradient_accumulation_steps), o.seed);
    }
    const double entropy = gpt::byte_unigram_entropy_nats(val_set);
    if (o.ranks > 1 && !under_mpi) {
      openblas_set_num_threads(1);
    }
    outcome result;
    if (under_mpi) {
#if ZERO_HAS_MPI
      int rank = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      {
        zero::mpi_communicator comm(MPI_COMM_WORLD);
        result = train<gpt::cpu_runtime>(comm, cfg, o, train_set, val_set);
      }
      MPI_Finalize();
      if (rank != 0) {
        return 0;
      }
#endif
    } else if (o.device == "cuda") {
#if ZERO_GPT_CUDA
      // One thread per GPU over NCCL (zero::run_gpus): --ranks GPUs of this machine; with --one-gpu, --ranks
      // threads sharing one GPU (zero::run_device_group).
      int visible = 0;
      if (cudaGetDeviceCount(&visible) != cudaSuccess || visible < (o.one_gpu ? 1 : o.ranks)) {
        static_cast<void>(cudaGetLastError());
        throw std::invalid_argument("--device cuda --ranks " + std::to_string(o.ranks) +
                                    (o.one_gpu ? " --one-gpu" : "") + ": " + std::to_string(visible) +
                                    " GPU(s) visible; expected " +
                                    (o.one_gpu ? "at least one" : "at least as many as ranks"));
      }
      auto rank = [&](auto& comm) {
        auto r = train<gpt::cuda_runtime>(comm, cfg, o, train_set, val_set);
        if (comm.rank() == 0) {
          result = r;
        }
      };
      if (o.one_gpu) {
        zero::run_device_group(
            o.ranks, [&](zero::device_group_communicator& comm) { rank(comm); }, gpt::cuda_runtime::shared_device);
      } else {
        zero::run_gpus(o.ranks, [&](zero::nccl_communicator& comm) { rank(comm); });
      }
#endif
    } else {
      zero::run_ranks(o.ranks, [&](zero::thread_communicator& comm) {
        auto r = train<gpt::cpu_runtime>(comm, cfg, o, train_set, val_set);
        if (comm.rank() == 0) {
          result = r;
        }
      });
    }
    report(result, o, entropy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-gpt: %s\n", e.what());
#if ZERO_HAS_MPI
    if (under_mpi) {
      MPI_Abort(MPI_COMM_WORLD, 1); // the other processes may wait in a collective for this one
    }
#endif
    return 1;
  }
  return 0;
}
