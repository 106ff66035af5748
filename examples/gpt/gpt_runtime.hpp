#pragma once
// Where zero-gpt runs its ranks: `cpu_runtime` (cpu_backend, in-process threads or MPI processes, gpt_model.hpp's
// fp32 math). gpt_cuda_engine.hpp adds `cuda_runtime` (cuda_backend, a GPU per rank over NCCL or ranks sharing one
// GPU, gpt_cuda.hpp's bf16 math). main.cpp's train() is written once over either.

#include "gpt_engine.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/communicator.hpp>
#include <zero/engine/engine.hpp>
#include <zero/tools/probes.hpp>

namespace gpt {

/// Sums a few host doubles (losses, token counts) over the ranks: the communicator's all-reduce on host memory.
/// gpt_cuda_engine.hpp specialises it for the GPU communicators, whose collectives read device memory.
template <class Comm> class host_sums {
public:
  explicit host_sums(Comm& comm) : comm_(comm) {}
  template <class Engine> void operator()(Engine&, double* v, std::size_t n) {
    comm_.all_reduce(v, v, n, zero::reduce_op::sum).wait();
  }

private:
  Comm& comm_;
};

/// The CPU: OpenBLAS GEMMs in fp32 over the engine's host memory. One per rank.
struct cpu_runtime {
  template <class Comm> using engine_type = zero::engine<zero::cpu_backend, Comm>;
  using math = cpu_model;
  /// One thread per rank when several ranks share the machine, else the backend's default.
  template <class Comm> zero::cpu_backend backend(const Comm& comm) const {
    return zero::cpu_backend({.threads = comm.size() > 1 ? 1u : 0u});
  }
  /// Waits for the rank's queued work (none on the CPU: every call returns done).
  template <class Engine> void synchronize(Engine&) const {}
  /// Notes the device memory in use (nothing to note on the CPU: the engine's memory() counts the host's).
  void sample_memory() const {}
  /// Notes the device memory in use before the engine allocates (nothing on the CPU).
  void sample_base() const {}
  /// The most device memory in use at a sample; 0 on the CPU.
  [[nodiscard]] std::size_t device_peak_bytes() const { return 0; }
  /// The device memory in use at sample_base; 0 on the CPU.
  [[nodiscard]] std::size_t device_base_bytes() const { return 0; }
  /// The most bytes the engine's device pool held; 0 on the CPU (the engine's memory() counts the host's).
  template <class Engine> [[nodiscard]] static std::size_t reserved_peak_bytes(Engine&) { return 0; }
  /// The device's peak dense bf16 rate for MFU, in FLOP/s; 0 (unknown) on the CPU.
  [[nodiscard]] double peak_flops() const { return 0; }
  /// The device's name for the report.
  [[nodiscard]] std::string device_name() const { return "cpu"; }

  /// --config auto-plan's default device budget: the host's available memory, which is the CPU backend's device
  /// memory (no GPU is shared on the CPU: the last argument, the ranks per GPU, is 1).
  static std::int64_t plan_device_bytes(const model_config&, int, bool, int) {
    return zero::tools::available_host_memory();
  }
  /// The rates --config auto-plan ranks its candidates by, measured now on this host (and on `nvme`).
  static zero::tools::machine_rates plan_rates(const std::optional<std::filesystem::path>& nvme) {
    zero::cpu_backend device({.threads = 0});
    return zero::tools::measure_rates(device, "cpu", {.bytes = std::size_t{16} << 20, .repeats = 2}, nvme);
  }
};

} // namespace gpt
