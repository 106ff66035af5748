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

/// Measures this machine (see the file comment); `nvme_dir`: where to measure the storage, if anywhere.
/// \throws what the probes throw (memory_error, io_error, cuda_error).
[[nodiscard]] inline machine_rates measure_this_machine(const probe_options& p,
                                                        const std::optional<std::filesystem::path>& nvme_dir) {
#if defined(ZERO_TOOLS_WITH_CUDA)
  cuda_backend device(0);
  cudaDeviceProp prop{};
  ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  return measure_rates(device, prop.name, p, nvme_dir);
#else
  cpu_backend device({.threads = 0});
  return measure_rates(device, "cpu (this build has no CUDA: the device is the host)", p, nvme_dir);
#endif
}

/// The rates as lines of text, each starting with `indent`.
[[nodiscard]] inline std::string rates_text(const machine_rates& r, const std::string& indent) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "%sdevice: %s\n%sAdamW on the device: %.3g params/s\n%sAdamW on the host: %.3g params/s (%g threads)\n"
                "%shost to device: %.3g GB/s, device to host: %.3g GB/s\n",
                indent.c_str(), r.device.c_str(), indent.c_str(), r.device_adamw, indent.c_str(), r.host_adamw,
                r.host_threads, indent.c_str(), r.host_to_device / 1e9, r.device_to_host / 1e9);
  std::string out = buf;
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
