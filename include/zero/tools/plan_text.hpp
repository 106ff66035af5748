#pragma once
/// \file
/// A plan in words (plan.hpp's `make_plan`, printed by zero-estimate --plan and the examples' auto-plan): a
/// setting's name, byte counts and times as text, and the table of candidates.

#include "zero/core/detail/text.hpp"
#include "zero/tools/plan.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace zero::tools {

/// `bytes` in the largest binary unit it fills, to two decimals: "13.62 GiB", "1.51 MiB", "0 B"
/// (`zero::detail::show_bytes`).
[[nodiscard]] inline std::string show_bytes(std::int64_t bytes) {
  return zero::detail::show_bytes(static_cast<double>(bytes));
}

namespace detail {
inline std::string plan_ms(double seconds) {
  if (!std::isfinite(seconds)) {
    return "unmeasured";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", seconds * 1e3);
  return buf;
}
} // namespace detail

/// A setting in words: "stage 2, offload_optimizer cpu, offload_param none", or for a partial offload
/// "stage 2, offload_optimizer cpu ratio 0.5751, offload_param none", or for a state split between host
/// memory and NVMe "stage 2, offload_optimizer nvme host_ratio 0.4, offload_param none", and for the
/// delayed update "stage 2, offload_optimizer cpu delayed_update (warmup_steps 40; NOT EXACT), offload_param
/// none".
[[nodiscard]] inline std::string setting_name(const estimate_row& r) {
  const bool partial = r.offload_optimizer == offload_device::cpu && r.offload_ratio < 1;
  const bool split = r.offload_optimizer == offload_device::nvme && r.host_ratio > 0;
  return cat("stage ", std::to_string(r.stage), ", offload_optimizer ", name_of(r.offload_optimizer),
             partial ? cat(" ratio ", zero::detail::show_number(r.offload_ratio)) : std::string(),
             split ? cat(" host_ratio ", zero::detail::show_number(r.host_ratio)) : std::string(),
             r.delayed_warmup >= 0
                 ? cat(" delayed_update (warmup_steps ", std::to_string(r.delayed_warmup), "; NOT EXACT)")
                 : std::string(),
             r.zenflow ? " zenflow (NOT EXACT)" : "", ", offload_param ", name_of(r.offload_param));
}

/// The plan as lines of text: the candidates fastest first with cost, bytes and verdict ("fits", or
/// each budget exceeded and by how much), then "plan: <setting>" or "plan: nothing fits".
[[nodiscard]] inline std::string plan_table(const plan_result& plan) {
  std::string out = "candidates, fastest first (optimizer-side time per step and rank; bytes per GPU, host and "
                    "NVMe per node):\n";
  for (std::size_t i = 0; i < plan.ranked.size(); ++i) {
    const plan_candidate& c = plan.ranked[i];
    std::string verdict = c.fits() ? "fits" : "does not fit:";
    for (const shortfall& s : c.over) {
      verdict += cat(" ", s.memory, " needs ", show_bytes(s.need), ", ", show_bytes(s.need - s.have), " over its ",
                     show_bytes(s.have), ";");
    }
    if (!c.over.empty()) {
      verdict.pop_back();
    }
    out += cat(plan.chosen == i ? "  * " : "    ", setting_name(c.row), ": ", detail::plan_ms(c.cost.total), "; ",
               show_bytes(c.row.gpu_bytes_per_rank), ", ", show_bytes(c.row.host_bytes_per_node), ", ",
               show_bytes(c.row.nvme_bytes_per_node), "; ", verdict, "\n");
  }
  out += plan.chosen ? cat("plan: ", setting_name(plan.ranked[*plan.chosen].row), "\n")
                     : std::string("plan: nothing fits the budgets\n");
  return out;
}

} // namespace zero::tools
