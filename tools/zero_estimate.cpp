// zero-estimate: memory for model states at every ZeRO stage and offload choice, per GPU and per
// node, like DeepSpeed's estimate_zero2/zero3_model_states_mem_needs_all_cold (whose tables it also
// prints, with DeepSpeed's own formulas).
//
//   zero-estimate --params 7e9 --gpus-per-node 8 --nodes 2
//   zero-estimate --model gpt2.json --dtype fp16 --json
//   zero-estimate --config ds_config.json --model gpt2.json --gpus-per-node 8
//
// With --config it takes the dtypes and sizes from a DeepSpeed config (its aio chunk buffers and
// offload_param's buffers and max_in_cpu too), checks it as the engine does (zero::check_engine_config)
// and names the config's own row.
//
// With --plan it prints the fastest setting that fits the memory given, and its DeepSpeed config block
// (zero/tools/plan.hpp): the candidates are the rows below that this version runs, and at stages 1-3
// the partial optimizer offload with the largest device share that fits --gpu-memory (its ratio in the
// config block), their memory the estimate's, their speed the time the optimizer state's placement costs
// per step by this machine's rates, measured now by zero-report's probes (zero/tools/probes.hpp) or read
// from zero-report --save-rates' file.
//
//   zero-estimate --plan --gpu-memory 80GiB --host-memory 1TiB --params 7e9 --gpus-per-node 8
//   zero-estimate --plan --gpu-memory 24GiB --host-memory 256GiB --nvme 3TB --nvme-path /mnt/nvme/zero
//                 --rates rates.json --model gpt2.json
//
// The plan proposes a setting that is not exact only when asked: with --allow-stale (and the step's
// --forward-ms and --backward-ms, which the delayed update hides the host's AdamW behind) the rows that
// can run offload_optimizer.delayed_update join the candidates.
//
// Exit status: 0 on success, 1 for an unreadable model description or rates file, a config the engine
// refuses, and when no setting fits the budgets (--plan), 2 for a command-line error.

#include "config_options.hpp"
#include "probe_rates.hpp"
#include "zero/config/check.hpp"
#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/tools/estimate.hpp"
#include "zero/tools/estimate_json.hpp"
#include "zero/tools/plan.hpp"
#include "zero/tools/step_model.hpp"

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace {

using zero::detail::cat;

std::string gib(std::int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%9.2f GiB", static_cast<double>(bytes) / 1073741824.0);
  return buf;
}

std::string pad(std::string s, std::size_t n) {
  s.resize(std::max(n, s.size()), ' ');
  return s;
}

/// The values of --plan's options, as given.
struct plan_args {
  bool plan = false;
  std::optional<std::string> gpu_memory, host_memory, nvme, rates_file, nvme_path;
  std::string probe_size = "256MiB";
  // The step at --nodes x --gpus-per-node GPUs (zero/tools/step_model.hpp): with --inter-node-gbps.
  std::optional<double> inter_node_gbps;
  double intra_node_gbs = 360, forward_ms = 0, backward_ms = 0, overlap = 0;
  // --allow-stale: the delayed update joins the candidates, its first stale_warmup_steps exact.
  bool allow_stale = false;
  std::int64_t stale_warmup_steps = 40;
  bool stale_warmup_given = false; // --stale-warmup-steps is on the command line
};

/// --inter-node-gbps: the predicted step of each communication setting at --nodes x --gpus-per-node GPUs beside
/// its GPU memory (the estimate's row, hpZ's secondary partition included), and the fastest that fits
/// --gpu-memory: its config block (the estimate's row at its stage without offload, with its ZeRO++ or HSDP
/// keys), or null when none fits.
nlohmann::json print_step_model(const plan_args& a, const zero::tools::memory_budget& budget,
                                const zero::tools::machine_rates& rates, const zero::tools::estimate_options& o) {
  namespace zt = zero::tools;
  zt::cluster_shape c;
  c.nodes = static_cast<int>(o.nodes);
  c.gpus_per_node = static_cast<int>(o.gpus_per_node);
  c.intra.bus_bytes_per_s = a.intra_node_gbs * 1e9;
  c.inter.bus_bytes_per_s = *a.inter_node_gbps * 1e9 / 8;
  zt::step_inputs in;
  in.params = o.params;
  in.modules = o.largest_layer_params > 0 ? (o.params + o.largest_layer_params - 1) / o.largest_layer_params : 1;
  in.bucket_elements = o.reduce_bucket_size;
  in.param_bytes = static_cast<double>(zero::size_of(o.param_dtype));
  in.grad_bytes = static_cast<double>(zero::size_of(o.grad_dtype.value_or(o.param_dtype)));
  in.forward_s = a.forward_ms * 1e-3;
  in.backward_s = a.backward_ms * 1e-3;
  in.device_adamw = rates.device_adamw;
  // The estimate's row without offload at `stage` (estimate_memory has one for every stage).
  auto in_memory_row = [](const zt::estimate_options& m, int stage) {
    for (const auto& r : zt::estimate_memory(m)) {
      if (r.stage == stage && r.offload_optimizer == zero::offload_device::none &&
          r.offload_param == zero::offload_device::none) {
        return r;
      }
    }
    throw std::logic_error(cat("zero-estimate: no row without offload at stage ", std::to_string(stage)));
  };
  // GPU bytes of the setting's row (with hpZ's secondary partition, or over HSDP's shard group, a node).
  auto gpu_bytes = [&](const zt::comm_setting& s) {
    zt::estimate_options m = o;
    if (s.hpz) {
      m.hpz_partition_size = o.gpus_per_node;
    }
    if (s.hsdp) {
      m.nodes = 1;
    }
    return in_memory_row(m, s.stage).gpu_bytes_per_rank;
  };
  std::cout << "\npredicted step at " << c.nodes << " x " << c.gpus_per_node << " GPUs (zero/tools/step_model.hpp; "
            << *a.inter_node_gbps << " Gb/s between nodes, " << a.intra_node_gbs << " GB/s inside; forward "
            << a.forward_ms << " ms and backward " << a.backward_ms << " ms on one GPU"
            << (a.forward_ms + a.backward_ms > 0 ? "" : ", not given: communication and optimizer only") << "; "
            << a.overlap << " of the communication hidden):\n";
  std::optional<zt::comm_setting> chosen;
  double best = 0;
  for (const auto& s : zt::predicted_settings(c)) {
    const auto p = zt::predict_step(s, in, c, a.overlap);
    const std::int64_t bytes = gpu_bytes(s);
    const bool fits = bytes <= budget.device_bytes;
    if (fits && (!chosen || p.step < best)) {
      chosen = s;
      best = p.step;
    }
    char line[256];
    std::snprintf(line, sizeof line,
                  "  %-34s %9.1f ms (compute %.1f, AdamW %.1f, collectives %.1f); %.2f GB leave each node; %s%s\n",
                  s.name().c_str(), p.step * 1e3, p.compute * 1e3, p.optimizer * 1e3, p.communication * 1e3,
                  p.node_egress_bytes / 1e9, gib(bytes).c_str(), fits ? "" : " per GPU, does not fit");
    std::cout << line;
  }
  std::cout << (chosen ? "fastest that fits: " + chosen->name() : "none fits --gpu-memory without offload")
            << " (predictions, not measurements)\n";
  if (!chosen) {
    return nullptr;
  }
  auto block = zt::plan_config_block(in_memory_row(o, chosen->stage), o, "");
  block["zero_optimization"].merge_patch(zt::comm_setting_keys(*chosen, c));
  return block;
}

/// --plan's budgets and probe size from its options, checked before anything is printed or measured.
/// \throws usage_error naming the option and what it expects.
/// `config_delays`: the config has offload_optimizer.delayed_update, whose row the forward and backward times
/// also price.
std::pair<zero::tools::memory_budget, zero::tools::probe_options> plan_inputs(const plan_args& a, bool config_delays) {
  if (!a.gpu_memory || !a.host_memory) {
    throw zero::usage_error("--plan needs --gpu-memory BYTES and --host-memory BYTES: the memory zero may use on "
                            "each GPU and on each node's host");
  }
  if (a.nvme && !a.rates_file && !a.nvme_path) {
    throw zero::usage_error("--nvme needs the storage's rates: give --nvme-path DIR to measure them there, or "
                            "--rates FILE from zero-report --save-rates FILE --path DIR");
  }
  if (a.forward_ms + a.backward_ms > 0 && !a.inter_node_gbps && !a.allow_stale && !config_delays) {
    throw zero::usage_error("--forward-ms and --backward-ms price the step model (--inter-node-gbps) and the "
                            "delayed update (--allow-stale, or a config with offload_optimizer.delayed_update); "
                            "this run has neither");
  }
  if (a.stale_warmup_given && config_delays) {
    throw zero::usage_error("--stale-warmup-steps with a config that has offload_optimizer.delayed_update: its "
                            "warmup_steps is the warm-up the plan keeps; give one of them");
  }
  if (a.allow_stale && !(a.forward_ms + a.backward_ms > 0)) {
    throw zero::usage_error("--allow-stale needs --forward-ms and --backward-ms, one step's forward and backward "
                            "on one GPU as measured: the delayed update hides the host's AdamW behind them, and "
                            "the plan cannot rank it without their time");
  }
  zero::tools::memory_budget budget;
  budget.device_bytes = zero::tools::parse_bytes(*a.gpu_memory);
  budget.host_bytes = zero::tools::parse_bytes(*a.host_memory);
  budget.nvme_bytes = a.nvme ? zero::tools::parse_bytes(*a.nvme) : 0;
  zero::tools::probe_options probe;
  probe.bytes = static_cast<std::size_t>(zero::tools::parse_bytes(a.probe_size));
  if (probe.bytes < 4096) {
    throw zero::usage_error(cat("--probe-size: ", a.probe_size, " is too small to time; expected 4KiB or more"));
  }
  return {budget, probe};
}

/// --plan: the rates (read or measured), the ranked candidates and the config block. Returns the exit
/// status.
int run_plan(const plan_args& a, const zero::tools::memory_budget& budget, const zero::tools::probe_options& probe,
             const zero::tools::estimate_options& o, bool json_out) {
  zero::tools::machine_rates rates;
  std::string source;
  try {
    if (a.rates_file) {
      rates = zero::tools::read_rates_file(*a.rates_file);
      source = cat("read from ", *a.rates_file);
    } else {
      const auto measured = zero::tools::measure_this_machine(probe, a.nvme_path);
      if (!measured.device_missing.empty()) {
        std::cerr << "zero-estimate: --plan: " << measured.device_missing << "; the host's rates, measured:\n"
                  << zero::tools::rates_text(measured.rates, "  ")
                  << "give --rates FILE from zero-report --save-rates run where the GPU is\n";
        return 1;
      }
      rates = measured.rates;
      source = "measured now by zero-report's probes";
    }
  } catch (const zero::error& e) {
    std::cerr << "zero-estimate: " << e.what() << "\n";
    return 1;
  }
  if (budget.nvme_bytes > 0 && rates.nvme_path.empty()) {
    std::cerr << "zero-estimate: --nvme needs the storage's rates, and " << *a.rates_file
              << " has none: write it with zero-report --save-rates FILE --path DIR\n";
    return 1;
  }
  const std::string nvme_path = a.nvme_path.value_or(rates.nvme_path);
  const auto plan = zero::tools::make_plan(
      o, rates, budget, a.allow_stale ? std::optional<std::int64_t>(a.stale_warmup_steps) : std::nullopt);
  std::cout << "\nbudgets: " << zero::tools::show_bytes(budget.device_bytes) << " per GPU, "
            << zero::tools::show_bytes(budget.host_bytes) << " of host memory per node, "
            << zero::tools::show_bytes(budget.nvme_bytes) << " of NVMe per node" << (a.nvme ? "" : " (no --nvme)")
            << "\nrates (" << source << "):\n"
            << zero::tools::rates_text(rates, "  ") << "\n"
            << zero::tools::plan_table(plan);
  nlohmann::json step_block = a.inter_node_gbps ? print_step_model(a, budget, rates, o) : nlohmann::json();
  nlohmann::json block;
  if (!step_block.is_null()) {
    // The step model's choice among the settings without offload that fit.
    block = step_block;
    std::cout << "\nDeepSpeed config block of the fastest predicted setting (merge into ds_config.json):\n"
              << block.dump(2) << "\n";
  } else if (plan.chosen) {
    block = zero::tools::plan_config_block(plan.ranked[*plan.chosen].row, o, nvme_path);
    std::cout << "\nDeepSpeed config block (merge into ds_config.json):\n" << block.dump(2) << "\n";
  } else {
    std::cout << "no setting this version runs fits: give more memory, more GPUs (--gpus-per-node, --nodes)"
              << (a.nvme ? "" : ", or NVMe (--nvme BYTES --nvme-path DIR)") << "\n";
  }
  if (json_out) {
    auto j = zero::tools::estimate_json(o, zero::tools::estimate_memory(o));
    j["plan"] = {{"config", block}, {"rates", zero::tools::rates_json(rates)}};
    std::cout << j.dump() << "\n";
  }
  return plan.chosen || !step_block.is_null() ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-estimate: memory needed for params, gradients and optimizer state at each ZeRO stage"};
  std::string params_text, largest_text;
  std::optional<std::string> model_file;
  std::int64_t gpus_per_node = 1, nodes = 1;
  std::string dtype_text = "bf16";
  std::optional<std::string> grad_dtype_text;
  std::string reduce_bucket = "5e8", prefetch_bucket = "5e7", max_live = "1e9", sub_group = "1e9";
  std::optional<std::string> allgather_bucket;
  double buffer_factor = 1.5;
  double offload_ratio = 1.0;
  double host_ratio = 0.0;
  bool forward_overlap = false;
  std::int64_t hpz_partition_size = 1;
  std::int64_t mics_shard_size = -1;
  bool json_out = false;
  std::optional<std::string> config_file;
  zero::tools::config_options config_inputs;

  auto* params_opt = app.add_option("--params", params_text, "parameter count, e.g. 7e9, 6.7B, 125M");
  auto* model_opt = app.add_option("--model", model_file, "model description JSON (modules and parameter shapes)")
                        ->check(CLI::ExistingFile);
  params_opt->excludes(model_opt);
  // Not CLI::ExistingFile: zero::config::from_file names a missing file, a folder or a device itself.
  auto* config_opt =
      app.add_option("--config", config_file,
                     "a DeepSpeed config: the dtypes and sizes below come from it (aio and offload_param "
                     "buffers too), it is checked as the engine checks it, and its row is named");
  config_inputs.add_to(app);
  app.add_option("--largest-layer-params", largest_text,
                 "parameters of the largest module (stage 3 working set); with --params, default 0")
      ->excludes(model_opt);
  app.add_option("--gpus-per-node", gpus_per_node, "GPUs per node")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--nodes", nodes, "nodes")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", dtype_text, "parameter dtype")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--grad-dtype", grad_dtype_text,
                 "gradient accumulation dtype (default: the config's, fp32 for bf16 at stage 0, else the parameter "
                 "dtype)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}));
  app.add_option("--reduce-bucket-size", reduce_bucket, "zero_optimization.reduce_bucket_size (elements)")
      ->capture_default_str();
  app.add_option("--allgather-bucket-size", allgather_bucket,
                 "zero_optimization.allgather_bucket_size (elements; default unset: in-place all-gathers, no buffer)");
  app.add_option("--prefetch-bucket-size", prefetch_bucket, "zero_optimization.stage3_prefetch_bucket_size")
      ->capture_default_str();
  app.add_option("--max-live-parameters", max_live, "zero_optimization.stage3_max_live_parameters")
      ->capture_default_str();
  app.add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size (NVMe rows)")->capture_default_str();
  auto* ratio_opt =
      app.add_option("--offload-ratio", offload_ratio,
                     "zero_optimization.offload_optimizer.ratio of the offload_optimizer=cpu rows: the share of the "
                     "optimizer state in host memory, the rest on the GPU")
          ->capture_default_str()
          ->check(zero::tools::number_in(0.0, 1.0));
  auto* host_ratio_opt =
      app.add_option("--host-ratio", host_ratio,
                     "zero_optimization.offload_optimizer.host_ratio of the offload_optimizer=nvme rows (zero's own "
                     "key): the share of the optimizer state in host memory, below 1, the rest on NVMe")
          ->capture_default_str()
          ->check(zero::tools::number_in(0.0, 1.0));
  auto* overlap_opt = app.add_flag(
      "--forward-overlap", forward_overlap,
      "zero_optimization.offload_optimizer.forward_overlap with --offload-ratio below 1: at stages 2-3 the "
      "host's share streams its gradients to the host during backward, so the GPU keeps only the rest of "
      "the gradient shard");
  app.add_option("--hpz-partition-size", hpz_partition_size,
                 "zero_optimization.zero_hpz_partition_size: with H > 1 the stage 3 rows count hpZ's secondary "
                 "partition of the 16-bit parameters on each GPU (P params / H bytes); H must divide the ranks")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  app.add_option("--mics-shard-size", mics_shard_size,
                 "zero_optimization.mics_shard_size (HSDP): stages 1-3 shard over groups of H ranks and replicate "
                 "across them, so each GPU holds an H-rank group's share; the offload rows are not run with it; H must "
                 "divide the ranks (-1: none)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{-1}, std::int64_t{1} << 40));
  app.add_option("--additional-buffer-factor", buffer_factor, "DeepSpeed's additional_buffer_factor (its tables only)")
      ->capture_default_str()
      ->check(zero::tools::number_in(0.0, 100.0));
  app.add_flag("--json", json_out,
               "end with one line of JSON: {\"params\", \"gpus\", \"rows\": [...]} (with --plan also \"plan\": "
               "{\"config\", \"rates\"})");
  std::string persistence = "1e5";
  app.add_option("--persistence-threshold", persistence,
                 "zero_optimization.stage3_param_persistence_threshold: with --model, parameters below it stay whole "
                 "at stage 3")
      ->capture_default_str()
      ->needs(model_opt);
  plan_args plan;
  auto* plan_opt = app.add_flag("--plan", plan.plan,
                                "print the fastest stage and offload setting that fits --gpu-memory, --host-memory and "
                                "--nvme, by this machine's measured rates, as a DeepSpeed config block");
  // The plan chooses its own ratios (the partial offloads that fit --gpu-memory).
  ratio_opt->excludes(plan_opt);
  host_ratio_opt->excludes(plan_opt);
  overlap_opt->excludes(plan_opt);
  auto* plans = app.add_option_group("Plan", "with --plan");
  plans->add_option("--gpu-memory", plan.gpu_memory, "bytes zero may use on each GPU, e.g. 80GiB")->needs(plan_opt);
  plans->add_option("--host-memory", plan.host_memory, "bytes zero may use on each node's host, e.g. 1TiB")
      ->needs(plan_opt);
  plans->add_option("--nvme", plan.nvme, "bytes zero may use on each node's NVMe, e.g. 3TB (default: none)")
      ->needs(plan_opt);
  plans->add_option("--rates", plan.rates_file, "rates from zero-report --save-rates (default: measure them now)")
      ->needs(plan_opt);
  plans
      ->add_option("--nvme-path", plan.nvme_path,
                   "folder on the NVMe drive: its rates are measured there, and the config block names it")
      ->needs(plan_opt)
      ->check(CLI::ExistingDirectory);
  plans->add_option("--probe-size", plan.probe_size, "bytes each rate probe moves when measuring now")
      ->capture_default_str()
      ->needs(plan_opt);
  auto* inter_opt = plans
                        ->add_option("--inter-node-gbps", plan.inter_node_gbps,
                                     "a node's network bandwidth in Gb/s: print each communication setting's predicted "
                                     "step at --nodes x --gpus-per-node GPUs (zero/tools/step_model.hpp)")
                        ->needs(plan_opt)
                        ->check(CLI::PositiveNumber);
  plans->add_option("--intra-node-gbs", plan.intra_node_gbs, "NCCL's bus bandwidth inside a node, GB/s")
      ->capture_default_str()
      ->needs(inter_opt)
      ->check(CLI::PositiveNumber);
  plans
      ->add_option("--forward-ms", plan.forward_ms,
                   "one GPU's forward without communication, per step: the step model's, and what the delayed update "
                   "hides the host's AdamW behind")
      ->needs(plan_opt)
      ->check(CLI::NonNegativeNumber);
  plans
      ->add_option("--backward-ms", plan.backward_ms,
                   "one GPU's backward without communication, per step (as --forward-ms)")
      ->needs(plan_opt)
      ->check(CLI::NonNegativeNumber);
  auto* stale_opt = plans
                        ->add_flag("--allow-stale", plan.allow_stale,
                                   "let the plan propose offload_optimizer.delayed_update (parameters one step old: "
                                   "NOT EXACT) where it is faster; needs --forward-ms and --backward-ms")
                        ->needs(plan_opt);
  auto* stale_warmup_opt = plans
                               ->add_option("--stale-warmup-steps", plan.stale_warmup_steps,
                                            "the exact steps before the delayed update, written as its warmup_steps")
                               ->capture_default_str()
                               ->needs(stale_opt)
                               ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  plans->add_option("--overlap", plan.overlap, "share of the communication hidden behind forward and backward")
      ->capture_default_str()
      ->needs(inter_opt)
      ->check(CLI::Range(0.0, 1.0));
  // A config sets these itself.
  for (const char* name :
       {"--dtype", "--grad-dtype", "--reduce-bucket-size", "--allgather-bucket-size", "--prefetch-bucket-size",
        "--max-live-parameters", "--sub-group-size", "--offload-ratio", "--host-ratio", "--forward-overlap",
        "--hpz-partition-size", "--mics-shard-size", "--persistence-threshold"}) {
    app.get_option(name)->excludes(config_opt);
  }
  try {
    app.parse(argc, argv);
    plan.stale_warmup_given = stale_warmup_opt->count() > 0;
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every command-line mistake exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }

  zero::tools::estimate_options o;
  std::optional<zero::config> cfg;
  zero::tools::memory_budget budget;
  zero::tools::probe_options probe;
  std::string model_name;
  std::string largest_name;
  std::optional<zero::tools::model_summary> described; // --model's
  try {
    if (config_file) {
      zero::config_inputs in = config_inputs.inputs();
      const std::int64_t ranks = gpus_per_node * nodes;
      if (in.world_size && *in.world_size != ranks) {
        throw zero::usage_error(cat("--world-size ", std::to_string(*in.world_size), " is not the ",
                                    std::to_string(ranks), " ranks of --nodes x --gpus-per-node; give one of them"));
      }
      in.world_size = ranks;
      cfg = zero::config::from_file(*config_file, in);
      // The engine's own rule: what it refuses, this refuses.
      zero::check_engine_config(*cfg, ranks);
    }
    if (model_file) {
      const auto& m = described.emplace(zero::tools::read_model_description_file(*model_file));
      o.params = m.params;
      o.largest_layer_params = m.largest_layer_params;
      model_name = m.name;
      largest_name = m.largest_layer;
      o.largest_param_params = m.largest_param;
      o.persistent_params = m.params_below(zero::tools::parse_count(persistence));
    } else if (!params_text.empty()) {
      o.params = zero::tools::parse_count(params_text);
      o.largest_layer_params = largest_text.empty() ? 0 : zero::tools::parse_count(largest_text);
      if (o.largest_layer_params > o.params) {
        throw zero::usage_error(
            cat("--largest-layer-params (", largest_text, ") exceeds --params (", params_text, ")"));
      }
    } else {
      std::cerr << "zero-estimate: give --params N or --model FILE\nRun with --help for more information.\n";
      return 2;
    }
    if (o.params > zero::tools::max_params) {
      throw zero::usage_error(
          cat("the model has ", std::to_string(o.params), " parameters; the estimates take up to 1e15"));
    }
    if (cfg) {
      zero::tools::model_summary m;
      m.params = o.params;
      m.largest_layer_params = o.largest_layer_params;
      m.largest_param = o.largest_param_params;
      if (described) {
        m = *described;
      }
      o = zero::tools::estimate_options_from(*cfg, m, gpus_per_node, nodes);
      // The config's partial offload is its cpu rows' ratio.
      const auto& opt = cfg->zero_optimization.offload_optimizer;
      o.offload_ratio = opt.device == zero::offload_device::cpu && !opt.ratio_auto ? opt.ratio : 1.0;
      if (plan.plan) {
        std::tie(budget, probe) = plan_inputs(plan, opt.delayed_update);
      }
    }
    if (!cfg) {
      o.gpus_per_node = gpus_per_node;
      o.nodes = nodes;
      o.param_dtype = zero::parse_dtype(dtype_text);
      if (grad_dtype_text) {
        o.grad_dtype = zero::parse_dtype(*grad_dtype_text);
      }
      o.reduce_bucket_size = zero::tools::parse_count(reduce_bucket);
      if (allgather_bucket) {
        o.allgather_bucket_size = zero::tools::parse_count(*allgather_bucket);
      }
      o.stage3_prefetch_bucket_size = zero::tools::parse_count(prefetch_bucket);
      o.stage3_max_live_parameters = zero::tools::parse_count(max_live);
      o.sub_group_size = zero::tools::parse_count(sub_group);
      o.offload_ratio = offload_ratio;
      if (!(host_ratio < 1)) {
        throw zero::usage_error("--host-ratio 1: the whole optimizer state in host memory is the "
                                "offload_optimizer=cpu rows; expected a share below 1");
      }
      o.host_ratio = host_ratio;
      o.offload_forward_overlap = forward_overlap;
      if (o.ranks() % hpz_partition_size != 0) {
        throw zero::usage_error(cat("--hpz-partition-size (zero_optimization.zero_hpz_partition_size) ",
                                    std::to_string(hpz_partition_size), " does not divide the ",
                                    std::to_string(o.ranks()),
                                    " ranks (--nodes x --gpus-per-node); expected the ranks of a node group, a divisor "
                                    "of the ranks"));
      }
      o.hpz_partition_size = hpz_partition_size;
      if (mics_shard_size == 0 || (mics_shard_size > 0 && o.ranks() % mics_shard_size != 0)) {
        throw zero::usage_error(
            cat("--mics-shard-size (zero_optimization.mics_shard_size) ", std::to_string(mics_shard_size),
                " does not divide the ", std::to_string(o.ranks()),
                " ranks (--nodes x --gpus-per-node); expected the ranks of a shard group, a divisor "
                "of the ranks, or -1"));
      }
      if (mics_shard_size > 1 && hpz_partition_size > 1) {
        throw zero::usage_error("--mics-shard-size with --hpz-partition-size: the engine runs one of HSDP and hpZ");
      }
      o.mics_shard_size = mics_shard_size;
      if (described) {
        o.padded = zero::tools::padded_sizes_of(*described, o.param_dtype, o.shard_ranks(), o.reduce_bucket_size,
                                                zero::tools::parse_count(persistence));
      }
      if (plan.plan) {
        std::tie(budget, probe) = plan_inputs(plan, false);
      }
    }
  } catch (const zero::config_error& e) {
    std::cerr << "zero-estimate: " << e.what() << "\n";
    return 1;
  } catch (const zero::usage_error& e) {
    std::cerr << "zero-estimate: " << e.what() << "\n";
    return 2;
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  }

  const auto rows = zero::tools::estimate_memory(o);
  std::cout << "zero-estimate: " << (model_name.empty() ? "" : model_name + ", ") << o.params << " params ("
            << o.params / 1'000'000 << "M), largest layer " << o.largest_layer_params << " params"
            << (largest_name.empty() ? "" : cat(" (", largest_name, ")")) << "\n";
  if (cfg) {
    std::cout << "config: " << *config_file << ", valid for the engine on " << o.ranks()
              << " ranks; its dtypes, bucket sizes, aio chunk buffers and offload_param buffers are the estimate's\n";
  }
  std::cout << "hardware: " << o.nodes << (o.nodes > 1 ? " nodes" : " node") << " x " << o.gpus_per_node
            << (o.gpus_per_node > 1 ? " GPUs" : " GPU") << " = " << o.ranks() << " data-parallel ranks\n";
  if (o.hpz_partition_size > 1) {
    std::cout << "hpZ: zero_hpz_partition_size " << o.hpz_partition_size
              << ", the stage 3 rows count a secondary partition of the parameters on each GPU\n";
  }
  if (o.shard_ranks() < o.ranks()) {
    std::cout << "HSDP: mics_shard_size " << o.mics_shard_size << ", stages 1-3 sharded over groups of "
              << o.shard_ranks() << " GPUs and replicated " << o.ranks() / o.shard_ranks()
              << " times; the offload rows are not run with it\n";
  }
  const std::string grads =
      o.grad_dtype ? std::string(zero::name_of(*o.grad_dtype))
                   : std::string(zero::name_of(zero::default_grad_accum_dtype(o.param_dtype, 0))) + " at stage 0, " +
                         std::string(zero::name_of(zero::default_grad_accum_dtype(o.param_dtype, 1))) +
                         " at stages 1-3 (the config's default)";
  std::cout << "dtypes: parameters " << zero::name_of(o.param_dtype) << ", gradients " << grads << ", optimizer "
            << o.rule_name << " (fp32 master" << (o.param_dtype == zero::dtype::f32 ? " = parameters" : "") << ", "
            << (o.adam ? std::string("fp32 moments")
                       : std::to_string(o.state_tensors) + " fp32 state tensor" + (o.state_tensors == 1 ? "" : "s"))
            << (o.adam ? "" : "; its nvme rows are not run") << ")\n";
  if (o.padded) {
    std::cout << "layout: the engine's, with " << o.padded->bucket_total - o.params << " elements of padding at stages "
              << "0-2 and " << o.padded->module_shard * o.shard_ranks() - o.params << " at stage 3 (each parameter "
              << "aligned to 256 bytes, each segment to " << o.shard_ranks() << " x 256 bytes)\n";
  } else if (model_file) {
    std::cout << "note: more than " << zero::tools::max_laid_out_tensors
              << " tensors; the rows count no padding of the engine's layout\n";
  }
  if (!model_file && largest_text.empty()) {
    std::cout << "note: largest layer unknown; stage 3 counts only the prefetch bucket as its working set "
                 "(pass --model FILE or --largest-layer-params N)\n";
  }
  if (plan.plan) {
    o.compute_seconds = (plan.forward_ms + plan.backward_ms) * 1e-3;
    return run_plan(plan, budget, probe, o, json_out);
  }
  std::cout << "\nzero's accounting (model states + gradient buckets + stage-3 working set; every row without a note "
               "runs in this version):\n";
  if (o.offload_ratio < 1) {
    std::cout << "offload_optimizer=cpu rows: offload_optimizer.ratio " << o.offload_ratio
              << ", that share of the optimizer state in host memory and the rest on the GPU"
              << (o.offload_forward_overlap
                      ? "; with forward_overlap the host share's gradients go to the host during backward at stages 2-3"
                      : "")
              << "\n";
  }
  if (o.host_ratio > 0) {
    std::cout << "offload_optimizer=nvme rows: offload_optimizer.host_ratio " << o.host_ratio
              << ", that share of the optimizer state in host memory and the rest on NVMe; the GPU keeps the "
                 "gradient shard at stages 2-3\n";
  }
  std::cout << " stage | offload_optimizer | offload_param |   per GPU     | host per node | NVMe per node\n";
  for (const auto& r : rows) {
    std::cout << "   " << r.stage << "   | " << pad(std::string(zero::name_of(r.offload_optimizer)), 17) << " | "
              << pad(std::string(zero::name_of(r.offload_param)), 13) << " | " << gib(r.gpu_bytes_per_rank) << " | "
              << gib(r.host_bytes_per_node) << " | " << gib(r.nvme_bytes_per_node)
              << (r.implemented ? ""
                  : o.adam      ? "  (not run with HSDP)"
                                : "  (not run with " + o.rule_name + ": its NVMe step is AdamW's)")
              << (r.delayed_warmup >= 0 ? "  (delayed update: the gradient shard twice; NOT EXACT)" : "")
              << (!r.zenflow                 ? ""
                  : o.config_zenflow_overlap ? "  (ZenFlow with overlap_step: the host's window and the gradient shard "
                                               "twice, the GPU's compact state; NOT EXACT)"
                                             : "  (ZenFlow: the host's window, the GPU's compact state; NOT EXACT)")
              << (cfg && r.stage == cfg->stage() &&
                          r.offload_optimizer == cfg->zero_optimization.offload_optimizer.device &&
                          r.offload_param == cfg->zero_optimization.offload_param.device
                      ? "  <- the config"
                      : "")
              << "\n";
  }
  std::cout << "\nDeepSpeed's estimate_zero2_model_states_mem_needs_all_cold (stages 1 and 2; its formulas, "
               "16-bit training):\n"
            << zero::tools::deepspeed_zero2_table(o.params, o.gpus_per_node, o.nodes, buffer_factor);
  std::cout << "\nDeepSpeed's estimate_zero3_model_states_mem_needs_all_cold (stage 3):\n"
            << zero::tools::deepspeed_zero3_table(o.params, o.largest_layer_params, o.gpus_per_node, o.nodes,
                                                  buffer_factor);
  if (json_out) {
    std::cout << zero::tools::estimate_json(o, rows).dump() << "\n";
  }
  return 0;
}
