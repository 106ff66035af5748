#pragma once
/// \file
/// Where a config puts files on NVMe, and the engine's storage for them: `nvme_folders` (one rule for
/// the engine, the examples and the tools) and `detail::make_offload_storage`, which makes the
/// storage policy from the `aio` block once the stale swap files of those folders are gone
/// (`detail::swap_file`, docs/offload.md "Files").

#include "zero/config/config.hpp"
#include "zero/storage/detail/swap_file.hpp"
#include "zero/storage/storage.hpp"

#include <concepts>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// The folders `cfg` puts NVMe files in, each with its key: `offload_optimizer.nvme_path` with device
/// nvme, and `offload_param.nvme_path` with device nvme at stage 3 (the only stage that offloads
/// parameters).
[[nodiscard]] inline std::vector<std::pair<std::string, std::filesystem::path>> nvme_folders(const config& cfg) {
  std::vector<std::pair<std::string, std::filesystem::path>> out;
  const auto& z = cfg.zero_optimization;
  if (z.offload_optimizer.device == offload_device::nvme) {
    out.emplace_back("zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path);
  }
  if (cfg.stage() == 3 && z.offload_param.device == offload_device::nvme) {
    out.emplace_back("zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path);
  }
  return out;
}

namespace detail {

/// Makes `out` (from `cfg.aio` where `S` takes storage options) when `cfg` puts files on NVMe, after
/// removing the swap files that processes no longer running left in those folders; each removal's
/// line goes to `log`. \returns true when the storage was made.
template <storage S>
bool make_offload_storage(std::optional<S>& out, const config& cfg,
                          const std::function<void(const std::string&)>& log) {
  const auto folders = nvme_folders(cfg);
  if (folders.empty()) {
    return false;
  }
  for (const auto& [key, dir] : folders) {
    if (const std::string said = sweep_swap_folder(dir); !said.empty() && log) {
      log(said);
    }
  }
  if constexpr (std::constructible_from<S, storage_options>) {
    out.emplace(storage_options_from(cfg.aio));
  } else {
    out.emplace();
  }
  return true;
}

} // namespace detail
} // namespace zero
