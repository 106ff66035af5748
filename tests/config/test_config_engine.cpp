// The engine, zero-report and zero-estimate agree on which configs run: every config of tests/config/data
// is given to all three on 8 ranks, and each either accepts it or refuses it with the same
// config_error. And zero-estimate --config's estimate of the fashion-mnist example's own NVMe config
// against the engine's host bytes for it.

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/config/config.hpp"
#include "zero/engine/engine.hpp"
#include "zero/tools/estimate.hpp"
#include "zero/tools/model_description.hpp"
#include "zero/tools/plan.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <doctest/doctest.h>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

namespace {

namespace fs = std::filesystem;

const fs::path config_data = ZERO_CONFIG_TEST_DATA;

/// The inputs every config is read with, on the command line and as `config_inputs`: 8 ranks and
/// a Hugging Face run's hyper-parameters, so that "auto" resolves.
const std::vector<std::string> agreement_args = {
    "--world-size",   "8",    "--hidden-size",  "64",  "--micro-batch-size", "2",    "--max-grad-norm", "1",
    "--lr",           "1e-4", "--adam-beta1",   "0.9", "--adam-beta2",       "0.99", "--adam-epsilon",  "1e-8",
    "--weight-decay", "0",    "--warmup-steps", "10",  "--total-steps",      "100",  "--precision",     "bf16"};

zero::config_inputs agreement_inputs() {
  zero::config_inputs in;
  in.world_size = 8;
  in.hidden_size = 64;
  in.micro_batch_size = 2;
  in.max_grad_norm = 1.0;
  in.lr = 1e-4;
  in.betas = std::array<double, 2>{0.9, 0.99};
  in.eps = 1e-8;
  in.weight_decay = 0.0;
  in.warmup_steps = 10;
  in.total_steps = 100;
  in.precision = zero::dtype::bf16;
  return in;
}

/// A tool's exit status and output (stdout and stderr).
struct tool_run {
  int status = -1;
  std::string output;
};

tool_run run_tool(const std::string& exe, const std::vector<std::string>& args) {
  std::string cmd = "'" + exe + "'";
  for (const std::string& a : args) {
    cmd += " '" + a + "'";
  }
  cmd += " 2>&1";
  tool_run r;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), &pclose);
  REQUIRE_MESSAGE(pipe != nullptr, "cannot run " << cmd);
  std::array<char, 4096> buf{};
  while (std::size_t n = std::fread(buf.data(), 1, buf.size(), pipe.get())) {
    r.output.append(buf.data(), n);
  }
  const int raw = pclose(pipe.release());
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

/// The engine's verdict on `file` over 8 thread ranks: empty when every rank's engine is built, else
/// the first config_error (from the reader or from the engine).
std::string engine_verdict(const fs::path& file) {
  zero::config cfg;
  try {
    cfg = zero::config::from_file(file, agreement_inputs());
  } catch (const zero::config_error& e) {
    return e.what();
  }
  std::vector<std::string> errors(8);
  zero::run_ranks(8, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    try {
      zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
    } catch (const zero::config_error& e) {
      errors[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  // Every rank decides alike (the rule needs no collective): the same verdict on each.
  for (const std::string& e : errors) {
    CHECK(e == errors[0]);
  }
  return errors[0];
}

/// The config_error's text after its id, as the tools print it.
std::string message_of(const std::string& what) {
  const auto at = what.find("] ");
  return at == std::string::npos ? what : what.substr(at + 2);
}

} // namespace

TEST_CASE("the engine, zero-report --config and zero-estimate --config agree on every config") {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(config_data)) {
    const std::string name = entry.path().filename().string();
    // Model descriptions and rates files are not configs.
    if (entry.path().extension() == ".json" && name.rfind("model_", 0) != 0 &&
        name.find("rates") == std::string::npos) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 20); // tests/config/data's configs, the five refused by the engine among them
  int accepted = 0;
  int refused = 0;
  for (const fs::path& file : files) {
    CAPTURE(file.filename().string());
    const std::string engine = engine_verdict(file);
    std::vector<std::string> report_args = {"--config-only", "--config", file.string()};
    report_args.insert(report_args.end(), agreement_args.begin(), agreement_args.end());
    const tool_run report = run_tool(ZERO_REPORT_EXE, report_args);
    std::vector<std::string> estimate_args = {"--config", file.string(), "--params", "1e6", "--gpus-per-node", "8"};
    // zero-estimate takes the ranks from --gpus-per-node; the rest of the inputs as zero-report does.
    estimate_args.insert(estimate_args.end(), agreement_args.begin() + 2, agreement_args.end());
    const tool_run estimate = run_tool(ZERO_ESTIMATE_EXE, estimate_args);
    CAPTURE(engine);
    CAPTURE(report.output);
    CAPTURE(estimate.output);
    if (engine.empty()) {
      ++accepted;
      CHECK(report.status == 0);
      CHECK(report.output.find("verdict: OK, config valid") != std::string::npos);
      CHECK(estimate.status == 0);
      CHECK(estimate.output.find("<- the config") != std::string::npos);
    } else {
      ++refused;
      CHECK(report.status == 1);
      CHECK(report.output.find("the config is refused: [zero.config_error] " + message_of(engine)) !=
            std::string::npos);
      CHECK(estimate.status == 1);
      CHECK(estimate.output.find("zero-estimate: [zero.config_error] " + message_of(engine)) != std::string::npos);
    }
  }
  // Both verdicts occur: the table is not all one way.
  CHECK(accepted >= 3);
  CHECK(refused >= 8);
}

TEST_CASE("zero-estimate --config: the fashion-mnist example's offload_nvme.json within 2% of the engine's host "
          "bytes") {
  // Its aio block (16384 bytes x queue depth 4 = 16384 elements per chunk buffer and tensor) sets the
  // host's chunk buffers; without the config the estimate took DeepSpeed's aio defaults (2^21 elements).
  const fs::path dir = fs::temp_directory_path() / ("zero-config-engine-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto j = zero::config::read_json_file(fs::path(ZERO_EXAMPLES_DIR) / "fashion_mnist" / "offload_nvme.json");
  j["zero_optimization"]["offload_optimizer"]["nvme_path"] = dir.string();
  constexpr int world = 2;
  const auto cfg = zero::config::from_json(j, {.world_size = world});
  const auto model = zero::tools::read_model_description_file(config_data / "model_fashion_mnist.json");
  const auto o = zero::tools::estimate_options_from(cfg, model, world);
  const auto rows = zero::tools::estimate_memory(o);
  const auto row = std::find_if(rows.begin(), rows.end(), [](const zero::tools::estimate_row& r) {
    return r.stage == 2 && r.offload_optimizer == zero::offload_device::nvme;
  });
  REQUIRE(row != rows.end());
  std::vector<std::int64_t> host(world);
  zero::run_ranks(world, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<std::int64_t>>>{
             {"fc1", {256, 784}}, {"fc2", {128, 256}}, {"fc3", {10, 128}}}) {
      const int m = eng.add_module(name);
      eng.add_param(m, name + ".weight", shape);
      eng.add_param(m, name + ".bias", {shape[0]});
    }
    eng.finalize();
    host[static_cast<std::size_t>(comm.rank())] = static_cast<std::int64_t>(eng.memory().host_peak);
  });
  fs::remove_all(dir);
  const std::int64_t measured = host[0] + host[1];
  CAPTURE(row->host_bytes_per_node);
  CAPTURE(measured);
  CHECK(std::abs(static_cast<double>(row->host_bytes_per_node - measured)) <= 0.02 * static_cast<double>(measured));
}
