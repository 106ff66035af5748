#pragma once
/// \file
/// The rates of this machine with this build's backend, for `zero-report --save-rates` and
/// `zero-estimate --plan`: with CUDA (ZERO_TOOLS_WITH_CUDA) the device is GPU 0 through
/// `cuda_backend`, its host memory pinned; without, the device is the host through `cpu_backend`.
/// Tools only; not installed.

#include "zero/core/detail/text.hpp"
#include "zero/tools/plan.hpp"
#include "zero/tools/probes.hpp"

#if defined(ZERO_TOOLS_WITH_CUDA)
#include "zero/backend/cuda_backend.hpp"

#include <cuda_runtime_api.h>
#endif

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>

namespace zero::tools {

/// What `measure_this_machine` measured, and why the device's rates are missing when they are.
struct this_machine_rates {
  machine_rates rates;
  /// Empty when the device was measured; else why not (a CUDA build on a host whose GPU cannot be
  /// used), and `rates` holds the host's side only.
  std::string device_missing;
};

/// Measures this machine (see the file comment); `nvme_dir`: where to measure the storage, if anywhere.
/// A CUDA build whose GPU 0 cannot be used (no driver, no GPU) measures the host's side and says why
/// the device's rates are missing.
/// \throws what the probes throw (memory_error, io_error; cuda_error once the GPU was opened).
[[nodiscard]] inline this_machine_rates measure_this_machine(const probe_options& p,
                                                             const std::optional<std::filesystem::path>& nvme_dir) {
#if defined(ZERO_TOOLS_WITH_CUDA)
  std::optional<cuda_backend> device;
  cudaDeviceProp prop{};
  try {
    device.emplace(0);
    ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  } catch (const cuda_error& e) {
    return {measure_host_rates("none (GPU 0 cannot be used)", p, nvme_dir),
            cat("this build uses CUDA but GPU 0 cannot be used (", e.what(),
                "), so the device's AdamW and copy rates were not measured; measure on the GPU machine (check "
                "nvidia-smi there), or use a build without CUDA, whose device is the host")};
  }
  return {measure_rates(*device, prop.name, p, nvme_dir), {}};
#else
  cpu_backend device({.threads = 0});
  return {measure_rates(device, "cpu (this build has no CUDA: the device is the host)", p, nvme_dir), {}};
#endif
}

/// The rates as lines of text, each starting with `indent`.
[[nodiscard]] inline std::string rates_text(const machine_rates& r, const std::string& indent) {
  char buf[512];
  std::string out;
  if (r.device_adamw > 0) {
    std::snprintf(buf, sizeof buf, "%sdevice: %s\n%sAdamW on the device: %.3g params/s\n", indent.c_str(),
                  r.device.c_str(), indent.c_str(), r.device_adamw);
  } else {
    std::snprintf(buf, sizeof buf, "%sdevice: %s\n%sAdamW on the device: not measured\n", indent.c_str(),
                  r.device.c_str(), indent.c_str());
  }
  out += buf;
  std::snprintf(buf, sizeof buf, "%sAdamW on the host: %.3g params/s (%g threads)\n", indent.c_str(), r.host_adamw,
                r.host_threads);
  out += buf;
  if (r.host_to_device > 0) {
    std::snprintf(buf, sizeof buf, "%shost to device: %.3g GB/s, device to host: %.3g GB/s\n", indent.c_str(),
                  r.host_to_device / 1e9, r.device_to_host / 1e9);
    out += buf;
  } else {
    out += cat(indent, "host to device, device to host: not measured\n");
  }
  if (r.nvme_path.empty()) {
    out += cat(indent, "NVMe: not measured (no folder given)\n");
  } else {
    std::snprintf(buf, sizeof buf, "%sNVMe in %s: read %.3g GB/s, write %.3g GB/s (flushed)\n", indent.c_str(),
                  r.nvme_path.c_str(), r.nvme_read / 1e9, r.nvme_write / 1e9);
    out += buf;
  }
  return out;
}

} // namespace zero::tools
