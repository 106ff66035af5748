// zero-memory-table: model-state bytes per rank against the number of ranks, for every stage,
// measured by the counting allocator on in-process ranks — the shape of the ZeRO paper's Table 1.
//
//   zero-memory-table [--layers 16] [--width 256] [--max-ranks 64] [--csv memory_table.csv]
//
// Prints a table and writes a CSV (stage, ranks, parameters, measured bytes, formula bytes, ratio,
// params, grads and optimizer bytes); bench/engine/plot_memory_table.py draws it.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>
#include <zero/zero.hpp>

int main(int argc, char** argv) {
  CLI::App app{"zero-memory-table: ZeRO model-state bytes per rank against the number of ranks"};
  int layers = 16;
  int width = 256;
  int max_ranks = 64;
  std::string csv = "memory_table.csv";
  app.add_option("--layers", layers, "layers of width x width + width")->check(CLI::Range(1, 256));
  app.add_option("--width", width, "layer width")->check(CLI::Range(8, 8192));
  app.add_option("--max-ranks", max_ranks, "largest number of ranks (powers of two up to it)")
      ->check(CLI::Range(1, 256));
  app.add_option("--csv", csv, "where the CSV goes");
  CLI11_PARSE(app, argc, argv);

  std::ofstream out(csv);
  if (!out) {
    std::fprintf(stderr, "zero-memory-table: cannot write %s\n", csv.c_str());
    return 1;
  }
  out << "stage,ranks,parameters,model_state_bytes_per_rank,formula_bytes_per_rank,ratio,params_bytes,grads_bytes,"
         "optimizer_bytes\n";
  std::printf("%-6s %-6s %14s %14s %8s %12s %12s %12s\n", "stage", "ranks", "bytes/rank", "formula", "ratio", "params",
              "grads", "optimizer");
  for (int stage = 0; stage <= 3; ++stage) {
    for (int n = 1; n <= max_ranks; n *= 2) {
      zero::memory_report report;
      zero::run_ranks(n, [&](zero::thread_communicator& comm) {
        zero::config_inputs inputs;
        inputs.world_size = n;
        // bf16 parameters and gradients, fp32 master and moments: the ZeRO paper's K = 12.
        const auto cfg = zero::config::from_string(
            R"({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
                "data_types": {"grad_accum_dtype": "bf16"},
                "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
                "zero_optimization": {"stage": )" +
                std::to_string(stage) + R"(, "reduce_bucket_size": 1000000, "stage3_param_persistence_threshold": 0}})",
            inputs);
        zero::cpu_backend backend({.threads = 1});
        zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
        std::vector<int> modules;
        for (int l = 0; l < layers; ++l) {
          modules.push_back(eng.add_module("layer" + std::to_string(l)));
          eng.add_param(modules.back(), "layer" + std::to_string(l) + ".weight", {width, width});
          eng.add_param(modules.back(), "layer" + std::to_string(l) + ".bias", {width});
        }
        eng.finalize();
        eng.init_params(
            [](const zero::param_info&, std::size_t, std::span<float> v) { std::fill(v.begin(), v.end(), 0.01f); });
        for (int l = layers; l-- > 0;) {
          auto on = eng.gather(modules[static_cast<std::size_t>(l)]);
          eng.grad_ready(zero::param_handle{static_cast<std::size_t>(2 * l + 1)});
          eng.grad_ready(zero::param_handle{static_cast<std::size_t>(2 * l)});
        }
        (void)eng.step();
        if (comm.rank() == 0) {
          report = eng.memory();
        }
      });
      std::printf("%-6d %-6d %14zu %14.0f %8.4f %12zu %12zu %12zu\n", stage, n, report.model_state_peak, report.formula,
                  report.ratio(), report.params_peak, report.grads_peak, report.optimizer_peak);
      out << stage << ',' << n << ',' << report.parameters << ',' << report.model_state_peak << ','
          << static_cast<long long>(report.formula) << ',' << report.ratio() << ',' << report.params_peak << ','
          << report.grads_peak << ',' << report.optimizer_peak << '\n';
    }
  }
  std::printf("wrote %s\n", csv.c_str());
  return 0;
}
