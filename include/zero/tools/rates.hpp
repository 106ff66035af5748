#pragma once
/// \file
/// A machine's measured rates, which the planner (zero/tools/plan.hpp) ranks settings by: what the
/// probes measure (zero/tools/probes.hpp) and the JSON file `zero-report --save-rates` writes and
/// `zero-estimate --rates` reads.

#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <filesystem>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace zero::tools {

/// What this machine measured (zero/tools/probes.hpp). Rates are per second; 0 means not measured.
struct machine_rates {
  double device_adamw = 0;   ///< parameters per second of the backend's AdamW kernel on one device
  double host_adamw = 0;     ///< parameters per second of the host AdamW (cpu_backend), all `host_threads`
  double host_threads = 0;   ///< threads the host AdamW ran on
  double host_to_device = 0; ///< bytes per second from the backend's host memory (pinned on a GPU) to a device
  double device_to_host = 0; ///< bytes per second back
  double nvme_read = 0;      ///< bytes per second read from a file under `nvme_path`
  double nvme_write = 0;     ///< bytes per second written there, flushed to the drive
  std::string device;        ///< what the device was: "cpu", or the GPU's name
  std::string nvme_path;     ///< the folder the storage rates were measured in (empty: not measured)
};

/// The rates as JSON, the file `zero-report --save-rates` writes and `zero-estimate --rates` reads:
/// {"device", "device_adamw_params_per_s", "host_adamw_params_per_s", "host_adamw_threads",
/// "host_to_device_bytes_per_s", "device_to_host_bytes_per_s", "nvme_path", "nvme_read_bytes_per_s",
/// "nvme_write_bytes_per_s"}.
[[nodiscard]] inline nlohmann::json rates_json(const machine_rates& r) {
  return {{"device", r.device},
          {"device_adamw_params_per_s", r.device_adamw},
          {"host_adamw_params_per_s", r.host_adamw},
          {"host_adamw_threads", r.host_threads},
          {"host_to_device_bytes_per_s", r.host_to_device},
          {"device_to_host_bytes_per_s", r.device_to_host},
          {"nvme_path", r.nvme_path},
          {"nvme_read_bytes_per_s", r.nvme_read},
          {"nvme_write_bytes_per_s", r.nvme_write}};
}

/// Reads `rates_json`'s object back. Every key is required; rates are numbers >= 0, the device, host
/// and copy rates > 0; the NVMe rates are 0 exactly when `nvme_path` is empty.
/// \throws config_error naming the key, what was found and what was expected.
[[nodiscard]] inline machine_rates rates_from_json(const nlohmann::json& j, std::string_view source = {}) {
  zero::detail::parse_context ctx;
  ctx.source = std::string(source);
  static constexpr std::string_view keys[] = {"device",
                                              "device_adamw_params_per_s",
                                              "host_adamw_params_per_s",
                                              "host_adamw_threads",
                                              "host_to_device_bytes_per_s",
                                              "device_to_host_bytes_per_s",
                                              "nvme_path",
                                              "nvme_read_bytes_per_s",
                                              "nvme_write_bytes_per_s"};
  if (!j.is_object()) {
    ctx.fail("", cat("found ", zero::detail::show(j), "; expected the JSON object zero-report --save-rates writes"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find(std::begin(keys), std::end(keys), it.key()) == std::end(keys)) {
      const auto near = zero::detail::closest_match(it.key(), keys);
      ctx.fail(it.key(), cat("unknown key", near.empty() ? "" : cat(" (did you mean \"", std::string(near), "\"?)"),
                             "; zero-report --save-rates writes device, device_adamw_params_per_s, "
                             "host_adamw_params_per_s, host_adamw_threads, host_to_device_bytes_per_s, "
                             "device_to_host_bytes_per_s, nvme_path, nvme_read_bytes_per_s, nvme_write_bytes_per_s"));
    }
  }
  auto at = [&](std::string_view key) -> const nlohmann::json& {
    const auto it = j.find(std::string(key));
    if (it == j.end()) {
      ctx.fail(key, "missing; zero-report --save-rates writes every rate");
    }
    return *it;
  };
  constexpr double most = 1e18;
  auto positive = [&](std::string_view key) { return zero::detail::as_number(ctx, key, at(key), 0, most, true); };
  machine_rates r;
  r.device = zero::detail::as_string(ctx, "device", at("device"));
  r.device_adamw = positive("device_adamw_params_per_s");
  r.host_adamw = positive("host_adamw_params_per_s");
  r.host_threads = zero::detail::as_number(ctx, "host_adamw_threads", at("host_adamw_threads"), 1, 1e6);
  r.host_to_device = positive("host_to_device_bytes_per_s");
  r.device_to_host = positive("device_to_host_bytes_per_s");
  r.nvme_path = zero::detail::as_string(ctx, "nvme_path", at("nvme_path"));
  const bool nvme = !r.nvme_path.empty();
  auto storage_rate = [&](std::string_view key) {
    if (nvme) {
      return positive(key);
    }
    const double v = zero::detail::as_number(ctx, key, at(key), 0, most);
    if (v != 0) {
      ctx.fail(key, cat("found ", zero::detail::show(at(key)),
                        " with an empty nvme_path; a storage rate needs the folder it was measured in"));
    }
    return v;
  };
  r.nvme_read = storage_rate("nvme_read_bytes_per_s");
  r.nvme_write = storage_rate("nvme_write_bytes_per_s");
  return r;
}

/// Reads a rates file (see `rates_from_json`), bounded as a config file is.
/// \throws config_error when it cannot be read, is not JSON or is not a rates object.
[[nodiscard]] inline machine_rates read_rates_file(const std::filesystem::path& path) {
  return rates_from_json(zero::detail::parse_text(zero::detail::read_config_text(path, "rates file"), path.string()),
                         path.string());
}

} // namespace zero::tools
