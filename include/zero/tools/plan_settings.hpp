#pragma once
/// \file
/// The settings `make_plan` (zero/tools/plan.hpp) ranks: the rows of `estimate_memory` the engine runs
/// (`plan_settings`), and the two whose share of the optimizer state depends on a budget: a partial
/// offload sized to the device budget (`partial_offload_setting`) and a state split between host memory
/// and NVMe sized to the host budget (`host_nvme_setting`). See plan.hpp's file comment.

#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/tools/estimate.hpp"

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero::tools {

/// The settings a plan chooses from whatever its budgets: the rows of `estimate_memory(o)` the engine
/// runs, in its order, with the whole optimizer state on the host in the CPU rows (`o.offload_ratio` is
/// not used: `partial_offload_setting` gives the partial offloads, which depend on the device budget).
/// A row the engine learns to run (its `implemented`) joins it.
[[nodiscard]] inline std::vector<estimate_row> plan_settings(const estimate_options& o) {
  estimate_options whole = o;
  whole.offload_ratio = 1.0;
  whole.host_ratio = 0.0; // `host_nvme_setting` gives the splits with host memory, which depend on the host budget
  std::vector<estimate_row> rows = estimate_memory(whole);
  // Parameters on NVMe run, but the cost has no term for their reads and writes yet, nor the peak for
  // the image of the shard that init_params holds (docs/offload.md): not candidates.
  std::erase_if(rows, [](const estimate_row& r) { return !r.implemented || r.offload_param == offload_device::nvme; });
  return rows;
}

/// The share of the device budget a partial offload leaves free. A fixed setting's bytes fall where they
/// fall, but a partial offload's ratio is chosen to fill the budget, so what the estimate does not count
/// (the flat buffer's alignment padding, the rounding of the split to 64 elements, the engine's few small
/// buffers: 0.05% for the fashion-mnist model) would land on the wrong side of it.
inline constexpr double partial_offload_margin = 0.005;

namespace detail {
/// The row of `estimate_memory(at)` at `stage` with the optimizer on `opt` and the parameters on `param`.
/// \throws usage_error naming `who` when it has none, and as `estimate_memory` does.
[[nodiscard]] inline estimate_row setting_row(const estimate_options& at, int stage, offload_device opt,
                                              offload_device param, const char* who) {
  for (const estimate_row& r : estimate_memory(at)) {
    if (r.stage == stage && r.offload_optimizer == opt && r.offload_param == param) {
      return r;
    }
  }
  throw usage_error(cat(who, ": estimate_memory has no row for the stage"));
}
/// What a setting sized to fill a budget of `bytes` may take: `bytes` less `partial_offload_margin` of it.
[[nodiscard]] inline std::int64_t budget_less_margin(std::int64_t bytes) {
  return static_cast<std::int64_t>(std::floor(static_cast<double>(bytes) * (1 - partial_offload_margin)));
}
} // namespace detail

/// The partial optimizer offload a plan offers at `stage` (1-3) for `device_bytes` per rank: the row of
/// `estimate_memory` with the optimizer on the CPU and the parameters where `param` says (the device, or
/// at stage 3 the host), at the smallest ratio, in steps of 1e-4, whose device bytes fit in
/// `device_bytes` less `partial_offload_margin` of it (the largest device share of the state). Empty
/// when the stage's row without offload fits (it keeps the whole state there and is as fast), and when not even ratio
/// 0.9999 fits (then only the whole offload, which also streams the gradient shard to the host, can). \throws
/// usage_error for a stage outside 1-3, `param` other than none or (at stage 3) cpu, and as `estimate_memory` does.
[[nodiscard]] inline std::optional<estimate_row> partial_offload_setting(const estimate_options& o, int stage,
                                                                         std::int64_t device_bytes,
                                                                         offload_device param = offload_device::none) {
  if (stage < 1 || stage > 3) {
    throw usage_error(
        cat("partial_offload_setting: stage ", std::to_string(stage), "; a partial offload runs at stages 1-3"));
  }
  if (param != offload_device::none && (param != offload_device::cpu || stage != 3)) {
    throw usage_error(cat("partial_offload_setting: offload_param ", name_of(param), " at stage ",
                          std::to_string(stage),
                          "; a partial offload keeps the parameters on the device, or at "
                          "stage 3 in host memory (cpu)"));
  }
  constexpr std::int64_t steps = 10'000;
  auto row_at = [&](std::int64_t k, offload_device opt, offload_device par) {
    estimate_options at = o;
    at.offload_ratio = static_cast<double>(k) / static_cast<double>(steps);
    return detail::setting_row(at, stage, opt, par, "partial_offload_setting");
  };
  const std::int64_t target = detail::budget_less_margin(device_bytes);
  const auto fits = [&](std::int64_t k) { return row_at(k, offload_device::cpu, param).gpu_bytes_per_rank <= target; };
  if (row_at(0, offload_device::none, offload_device::none).gpu_bytes_per_rank <= device_bytes || !fits(steps - 1)) {
    return std::nullopt;
  }
  // The device bytes fall as the ratio grows: the smallest ratio that fits, between `over` and `fit`.
  std::int64_t over = 0;
  std::int64_t fit = steps - 1;
  while (fit - over > 1) {
    const std::int64_t mid = over + (fit - over) / 2;
    (fits(mid) ? fit : over) = mid;
  }
  return row_at(fit, offload_device::cpu, param);
}

/// The state split between host memory and NVMe a plan offers at `stage` (1-3) for `host_bytes` per node
/// (`offload_optimizer.host_ratio`, zero's own key): the row of `estimate_memory` with the optimizer on
/// NVMe and the parameters where `param` says (the device, or at stage 3 the host), at the largest host
/// ratio below 1, in steps of 1e-4, whose host bytes fit in `host_bytes` less `partial_offload_margin` of
/// it: the most of the state in host memory, the least read and written on NVMe. Empty when the stage's
/// row with the whole state in host memory fits (as fast or faster, and nothing on NVMe), and when not even
/// the smallest step fits (then the whole state on NVMe, a candidate of its own, is all that may).
/// \throws usage_error for a stage outside 1-3, `param` other than none or (at stage 3) cpu, and as
/// `estimate_memory` does.
[[nodiscard]] inline std::optional<estimate_row> host_nvme_setting(const estimate_options& o, int stage,
                                                                   std::int64_t host_bytes,
                                                                   offload_device param = offload_device::none) {
  if (stage < 1 || stage > 3 || (param != offload_device::none && (param != offload_device::cpu || stage != 3))) {
    throw usage_error(cat("host_nvme_setting: stage ", std::to_string(stage), " with offload_param ", name_of(param),
                          "; a state split between host memory and NVMe runs at stages 1-3, with the parameters on "
                          "the device or, at stage 3, in host memory (cpu)"));
  }
  constexpr std::int64_t steps = 10'000;
  auto row_at = [&](std::int64_t k, offload_device opt) {
    estimate_options at = o;
    at.offload_ratio = 1.0;
    at.host_ratio = static_cast<double>(k) / static_cast<double>(steps);
    return detail::setting_row(at, stage, opt, param, "host_nvme_setting");
  };
  const std::int64_t target = detail::budget_less_margin(host_bytes);
  const auto fits = [&](std::int64_t k) { return row_at(k, offload_device::nvme).host_bytes_per_node <= target; };
  if (row_at(0, offload_device::cpu).host_bytes_per_node <= host_bytes || !fits(1)) {
    return std::nullopt;
  }
  // The host bytes grow with the ratio: the largest that fits, between `fit` and `over`.
  std::int64_t fit = 1;
  std::int64_t over = steps;
  while (over - fit > 1) {
    const std::int64_t mid = fit + (over - fit) / 2;
    (fits(mid) ? fit : over) = mid;
  }
  return row_at(fit, offload_device::nvme);
}

} // namespace zero::tools
