#pragma once
/// \file
/// The planner of `zero-estimate --plan` and of the examples' `--config auto-plan`: the fastest
/// stage and offload setting whose memory fits a machine's budgets, by the rates this machine
/// measured (zero/tools/probes.hpp, `zero-report --save-rates`).
///
/// The candidates are the rows of `estimate_memory` that the engine runs (`implemented`), but for
/// parameters on NVMe, whose reads and writes the cost does not count yet. Each row's memory is the estimate's
/// (device bytes per rank, host and NVMe bytes per node); its cost is the time per step that the
/// optimizer state's placement takes on one rank (`estimate_step_cost`):
///
///     no offload        AdamW over the rank's elements n at the device's rate
///     optimizer on CPU  max(host AdamW over n at the host's rate / ranks per node,
///                           gradients down and parameters up over the measured copy rates)
///     optimizer on NVMe the same, and K n bytes read plus K n written at the storage's rates / ranks
///                       per node (K: 12 bytes of fp32 master, m and v; 8 for fp32 training)
///     partial offload   the host's share h = ratio x n: max(AdamW over n on the device, host AdamW over h
///                       + G h bytes down + P h bytes up); with the parameters on the host (stage 3) the
///                       device's part writes its P (n - h) bytes down from the kernel and the gathers
///                       upload 2 P n; on the CPU backend (device "cpu", the same cores) the device's
///                       n - h and the host's part one after the other
///     host and NVMe     the host's share h = host_ratio x n: max(host AdamW over n - h, the copies, K (n - h)
///                       bytes read plus K (n - h) written) + host AdamW over h (it updates in place only
///                       after the file's writes landed)
///
///     delayed update    a row that runs offload_optimizer.delayed_update (the config's block, or the plan's
///                       `stale_warmup`): the whole state on the CPU, its host AdamW beside the next forward
///                       and backward (`o.compute_seconds`, the user's measure): max(host AdamW over n at the
///                       host's rate - that time, P n bytes up, which each step publishes before the next
///                       forward); with no time given, the CPU row's cost (nothing credited as hidden). The
///                       warm-up's exact steps are left out.
///     ZenFlow           a row that runs the config's zero_optimization.zenflow (topk_ratio t, update_interval
///                       U): AdamW over the chosen t n elements on the device every step + max(host AdamW over
///                       n / U, G n bytes down + P n / U bytes up), the mean step of an interval; the window's
///                       add runs beside the next step and is left out, and so are the warm-up's exact steps;
///                       with overlap_step the host's share less the forward and backward it runs beside
///                       (`o.compute_seconds`, as the delayed update's).
///
/// n is Ψ at stage 0 and ceil(Ψ / N) at stages 1-3; with parameters offloaded (stage 3) the gathers
/// of forward and backward upload 2 P n bytes and the optimizer's new parameters stay on the host.
/// Forward and backward are the same for every setting and are left out; so is the communication
/// that differs between stages, which no probe measures: of settings that cost the same, the one
/// listed first by `estimate_memory` (lower stage, then less offloaded) ranks first.
///
/// Partial offload (`offload_optimizer.ratio` below 1, `partial_offload_setting`) is a candidate at
/// stages 1-3 where the stage's state does not fit on the device: the largest device share whose
/// estimate fits the device budget less a margin of 0.5% (the smallest ratio, in steps of 1e-4).
/// Its host part counts its copies in series with its update, as `balanced_offload_ratio` does (an
/// upper bound where they overlap), and the split is not credited with beating the whole step on
/// the device: on an H200 the engine's balanced share ("auto") measured 21.2 ms of optimizer time
/// against 13.0 ms in memory (bench/README.md). So a partial offload never ranks before its stage
/// in memory, and where it costs what another setting does (its host part hidden behind the
/// device's), the other ranks first. Not on the CPU backend (rates of device "cpu"), whose device
/// and host are the same cores and memory. At stage 3 also with the parameters in host memory
/// (`offload_param` cpu): the device then keeps no 16-bit shard and holds more of the state, and its
/// part's kernel writes its new parameters across (costed at the copy rate down). Neither are
/// the overlap keys (`backward_overlap`, `forward_overlap`) candidates: hiding the host's step
/// behind forward and backward would need their time, which no probe measures.
///
/// The state split between host memory and NVMe (`offload_optimizer.host_ratio`, `host_nvme_setting`) is
/// a candidate at stages 1-3 where there is NVMe (a budget for it) and the whole state does not fit in
/// host memory: the largest host share whose estimate fits the host budget less the same margin (in steps
/// of 1e-4), at stage 3 also with the parameters in host memory. It ranks after the whole state in host
/// memory and, where NVMe is slower than the host's AdamW, before the whole state on NVMe.

#include "zero/config/config.hpp"
#include "zero/core/detail/bytes_text.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/schedule_from_config.hpp" // rule_of, rule_state_of: the optimizer's state
#include "zero/tools/estimate.hpp"
#include "zero/tools/plan_settings.hpp"
#include "zero/tools/rates.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero::tools {

/// Parses a byte count: a whole number ("85899345920", "8e10") or a number with a unit, decimal
/// ("80GB", "512MB", "1.5TB", "kB") or binary ("80GiB", "512MiB", "1.5TiB", "KiB"), with or without
/// a space before the unit. Bare "G" or "M" are refused: they are ambiguous.
/// \throws usage_error naming the text and the forms expected.
[[nodiscard]] inline std::int64_t parse_bytes(std::string_view text) {
  struct unit {
    std::string_view name;
    double scale;
  };
  static constexpr unit units[] = {{"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
                                   {"kB", 1e3},     {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
                                   {"TB", 1e12},    {"B", 1.0}};
  std::string s(text);
  double scale = 1;
  for (const unit& u : units) {
    if (s.size() > u.name.size() && s.compare(s.size() - u.name.size(), u.name.size(), u.name) == 0) {
      scale = u.scale;
      s.resize(s.size() - u.name.size());
      break;
    }
  }
  while (!s.empty() && s.back() == ' ') {
    s.pop_back();
  }
  const std::optional<double> parsed = detail::whole_number_text(s);
  const double v = parsed.value_or(-1);
  const double bytes = std::floor(v * scale);
  if (!parsed || !(v >= 0) || !(bytes < 9.2e18) || (scale == 1 && v != std::floor(v))) {
    throw usage_error(cat("\"", zero::detail::printable(text),
                          "\" is not a byte count: expected a whole number of bytes such as 85899345920 or 8e10, "
                          "or a number with a unit: 80GiB, 512MiB, 1.5TiB (powers of 1024) or 80GB, 512MB "
                          "(powers of 1000)"));
  }
  return static_cast<std::int64_t>(bytes);
}

/// The budgets of `--config auto-plan` as a tool's command line gives them (the examples' `--gpu-memory`,
/// `--host-memory` and `--nvme`, each its text when given), and what the rules about them depend on.
struct plan_flags {
  bool planned = false;     ///< --config is auto-plan
  bool config_file = false; ///< --config names a file
  std::optional<std::string> gpu_memory, host_memory, nvme;
  bool nvme_path = false;                   ///< --nvme-path is given
  bool stage = false;                       ///< a stage is given
  std::string_view stage_flags = "--stage"; ///< the tool's flags that give one, for the message
};

/// The first thing wrong with `f`, as the sentence a tool prints after its name, or nothing: a budget without
/// auto-plan, a text that is not a byte count (parse_bytes' message), --nvme without --nvme-path, a stage with
/// auto-plan (which chooses it).
[[nodiscard]] inline std::optional<std::string> plan_flags_refusal(const plan_flags& f) {
  const std::pair<const char*, const std::optional<std::string>*> budgets[] = {
      {"--gpu-memory", &f.gpu_memory}, {"--host-memory", &f.host_memory}, {"--nvme", &f.nvme}};
  for (const auto& [flag, value] : budgets) {
    if (value->has_value() && !f.planned) {
      return cat(flag, " is a budget of --config auto-plan; this run has ",
                 f.config_file ? "a config file" : "no --config");
    }
  }
  for (const auto& [flag, value] : budgets) {
    try {
      if (value->has_value()) {
        static_cast<void>(parse_bytes(**value));
      }
    } catch (const usage_error& e) {
      return std::string(e.what());
    }
  }
  if (f.nvme && !f.nvme_path) {
    return std::string("--nvme needs --nvme-path DIR, the folder the state files would go to (and where the plan "
                       "measures the storage)");
  }
  if (f.planned && f.stage) {
    return cat("--config auto-plan chooses the stage; leave out ", f.stage_flags);
  }
  return std::nullopt;
}

/// The memory a plan may use: device bytes per rank (one GPU; the host's for the CPU backend), host
/// bytes per node, NVMe bytes per node (0: no NVMe).
struct memory_budget {
  std::int64_t device_bytes = 0;
  std::int64_t host_bytes = 0;
  std::int64_t nvme_bytes = 0;
};

/// Seconds per step of one rank that the placement of the optimizer state costs (file comment).
struct step_cost {
  double device_adamw = 0; ///< AdamW on the device
  double host_adamw = 0;   ///< AdamW on the host
  double transfer = 0;     ///< gradients down and parameters up between host and device
  double nvme = 0;         ///< the state read from and written to NVMe
  double hidden = 0;       ///< of host_adamw, what the delayed update or overlap_step runs beside forward and backward
  /// device_adamw + max(host_adamw, transfer, nvme): the host side overlaps; for a partial offload
  /// max(the whole shard's AdamW on the device, host_adamw + transfer), or the sum of the three on the CPU
  /// backend (file comment)
  double total = 0;
};

/// The cost of row `r` for the model of `o` by `rates` (file comment). A resource whose rate is 0
/// (not measured) makes the cost infinite. \throws usage_error when device, host or copy rates are
/// not positive.
[[nodiscard]] inline step_cost estimate_step_cost(const estimate_row& r, const estimate_options& o,
                                                  const machine_rates& rates) {
  if (!(rates.device_adamw > 0) || !(rates.host_adamw > 0) || !(rates.host_to_device > 0) ||
      !(rates.device_to_host > 0)) {
    throw usage_error("estimate_step_cost: the device and host AdamW rates and the copy rates must be positive "
                      "(measure them with zero-report --save-rates)");
  }
  const auto per_second = [](double amount, double rate) {
    return rate > 0 ? amount / rate : std::numeric_limits<double>::infinity();
  };
  const double ranks_per_node = static_cast<double>(o.gpus_per_node);
  const double n =
      r.stage == 0 ? static_cast<double>(o.params) : static_cast<double>((o.params + o.ranks() - 1) / o.ranks());
  const double p = static_cast<double>(size_of(o.param_dtype));
  const double g = static_cast<double>(size_of(r.grad_dtype));
  const double k = o.param_dtype == dtype::f32 ? 8.0 : 12.0; // fp32 master (unless the parameters are), m, v
  step_cost c;
  if (r.offload_optimizer == offload_device::cpu && r.offload_ratio < 1) {
    const double h = std::round(r.offload_ratio * n);
    c.device_adamw = per_second(n - h, rates.device_adamw);
    c.host_adamw = per_second(h, rates.host_adamw / ranks_per_node);
    // With the parameters on the host (stage 3) the device's part writes its n - h new parameters across
    // from the kernel, no faster than the copies down, and the gathers of forward and backward upload
    // all n; otherwise the host's part sends its h parameters up.
    c.transfer =
        r.offload_param != offload_device::none
            ? per_second(h * g + (n - h) * p, rates.device_to_host) + per_second(2 * n * p, rates.host_to_device)
            : per_second(h * g, rates.device_to_host) + per_second(h * p, rates.host_to_device);
    c.total = rates.device == "cpu" ? c.device_adamw + c.host_adamw + c.transfer
                                    : std::max(per_second(n, rates.device_adamw), c.host_adamw + c.transfer);
    return c;
  }
  if (r.offload_optimizer == offload_device::nvme && r.host_ratio > 0) {
    // The file's share overlaps its AdamW, reads and writes and the copies, as a whole NVMe offload does; the
    // host's share updates in place only once the file's writes have landed (host_nvme_adamw), so after it.
    const double h = std::round(r.host_ratio * n);
    const double f = n - h;
    c.host_adamw = per_second(n, rates.host_adamw / ranks_per_node);
    c.transfer = per_second(n * g, rates.device_to_host) +
                 per_second((r.offload_param != offload_device::none ? 2 : 1) * n * p, rates.host_to_device);
    c.nvme = per_second(k * f, rates.nvme_read / ranks_per_node) + per_second(k * f, rates.nvme_write / ranks_per_node);
    c.total = std::max({per_second(f, rates.host_adamw / ranks_per_node), c.transfer, c.nvme}) +
              per_second(h, rates.host_adamw / ranks_per_node);
    return c;
  }
  if (r.offload_optimizer == offload_device::none) {
    c.device_adamw = per_second(n, rates.device_adamw);
  } else {
    c.host_adamw = per_second(n, rates.host_adamw / ranks_per_node);
    const bool params_on_host = r.offload_param != offload_device::none;
    // Gradients go down; new parameters go up, or stay on the host and the gathers of forward and
    // backward upload them.
    c.transfer =
        per_second(n * g, rates.device_to_host) + per_second((params_on_host ? 2 : 1) * n * p, rates.host_to_device);
    if (r.zenflow && o.config_zenflow_topk) {
      const double interval = static_cast<double>(std::max<std::int64_t>(1, o.config_zenflow_update_interval));
      c.device_adamw = per_second(std::round(*o.config_zenflow_topk * n), rates.device_adamw);
      c.host_adamw /= interval;
      c.transfer = per_second(n * g, rates.device_to_host) + per_second(n * p / interval, rates.host_to_device);
      if (o.config_zenflow_overlap) { // the host's update beside the interval's forward and backward
        c.hidden = std::min(c.host_adamw, o.compute_seconds);
      }
      c.total = c.device_adamw + std::max(c.host_adamw - c.hidden, c.transfer);
      return c;
    }
    if (r.delayed_warmup >= 0 && o.compute_seconds > 0) {
      c.hidden = std::min(c.host_adamw, o.compute_seconds);
      c.total = std::max(c.host_adamw - c.hidden, per_second(n * p, rates.host_to_device));
      return c;
    }
    if (r.offload_optimizer == offload_device::nvme) {
      c.nvme =
          per_second(k * n, rates.nvme_read / ranks_per_node) + per_second(k * n, rates.nvme_write / ranks_per_node);
    }
  }
  c.total = c.device_adamw + std::max({c.host_adamw, c.transfer, c.nvme});
  return c;
}

/// The estimate row of config `c`'s own setting, the one `estimate_step_cost` prices for it: its stage,
/// where its optimizer state and (at stage 3) parameters live, its gradient dtype, and the share of the
/// state offloaded (0 without offload, 1 on NVMe, offload_optimizer.ratio on the CPU). The byte
/// columns are left 0: `estimate_memory` counts those.
[[nodiscard]] inline estimate_row config_row(const config& c) {
  estimate_row r;
  r.stage = c.stage();
  r.grad_dtype = c.grad_accum_dtype;
  r.offload_optimizer = c.zero_optimization.offload_optimizer.device;
  r.offload_param = c.stage() == 3 ? c.zero_optimization.offload_param.device : offload_device::none;
  r.offload_ratio = r.offload_optimizer == offload_device::none   ? 0.0
                    : r.offload_optimizer == offload_device::nvme ? 1.0
                                                                  : c.zero_optimization.offload_optimizer.ratio;
  r.host_ratio = r.offload_optimizer == offload_device::nvme ? c.zero_optimization.offload_optimizer.host_ratio : 0.0;
  return r;
}

/// A budget a row exceeds: which memory, what the row needs and what the budget gives (both bytes).
struct shortfall {
  std::string_view memory; ///< "GPU" (per rank), "host" (per node) or "NVMe" (per node)
  std::int64_t need = 0;
  std::int64_t have = 0;
};

/// The budgets row `r` exceeds; empty when it fits.
[[nodiscard]] inline std::vector<shortfall> shortfalls(const estimate_row& r, const memory_budget& b) {
  std::vector<shortfall> out;
  if (r.gpu_bytes_per_rank > b.device_bytes) {
    out.push_back({"GPU", r.gpu_bytes_per_rank, b.device_bytes});
  }
  if (r.host_bytes_per_node > b.host_bytes) {
    out.push_back({"host", r.host_bytes_per_node, b.host_bytes});
  }
  if (r.nvme_bytes_per_node > b.nvme_bytes) {
    out.push_back({"NVMe", r.nvme_bytes_per_node, b.nvme_bytes});
  }
  return out;
}

/// One candidate of a plan: its row, its cost, and the budgets it exceeds.
struct plan_candidate {
  estimate_row row;
  step_cost cost;
  std::vector<shortfall> over;
  [[nodiscard]] bool fits() const noexcept { return over.empty(); }
};

/// A plan: every candidate, fastest first, and the first that fits.
struct plan_result {
  std::vector<plan_candidate> ranked;
  std::optional<std::size_t> chosen; ///< index into `ranked`; empty when nothing fits
};

/// Ranks `plan_settings(o)`, then the partial offloads of stages 1-3 for `budget`
/// (`partial_offload_setting`; none when `rates.device` is "cpu", the CPU backend, or for a rule without
/// `estimate_options::partial_offload`), by
/// `estimate_step_cost` (stable: equal costs keep that order) and chooses the first that fits
/// `budget`. With `stale_warmup` (zero-estimate's --allow-stale: the user accepts parameters one step
/// old) and a config without the delayed block, the rows of `plan_settings` that can run the delayed update
/// join as well, with that many exact steps first, ranked after the exact row of equal cost: the plan
/// proposes a mode that is not exact only when asked. \throws usage_error as `estimate_memory` and
/// `estimate_step_cost` do, and for a negative budget or warm-up.
[[nodiscard]] inline plan_result make_plan(const estimate_options& o, const machine_rates& rates,
                                           const memory_budget& budget,
                                           std::optional<std::int64_t> stale_warmup = std::nullopt) {
  if (budget.device_bytes < 0 || budget.host_bytes < 0 || budget.nvme_bytes < 0) {
    throw usage_error("make_plan: budgets are bytes >= 0");
  }
  if (stale_warmup && *stale_warmup < 0) {
    throw usage_error(cat("make_plan: the delayed update's warm-up is ", std::to_string(*stale_warmup),
                          "; expected a number of steps >= 0"));
  }
  plan_result plan;
  for (const estimate_row& r : plan_settings(o)) {
    plan.ranked.push_back({r, estimate_step_cost(r, o, rates), shortfalls(r, budget)});
  }
  if (stale_warmup && o.config_delayed_warmup < 0) {
    estimate_options delayed = o;
    delayed.config_delayed_warmup = *stale_warmup;
    for (const estimate_row& r : plan_settings(delayed)) {
      if (r.delayed_warmup >= 0) {
        plan.ranked.push_back({r, estimate_step_cost(r, delayed, rates), shortfalls(r, budget)});
      }
    }
  }
  // The settings sized to a budget, `setting(stage, param)`, at stages 1-3 with the parameters on the device and
  // at stage 3 also in host memory.
  const auto add_sized = [&](auto&& setting) {
    for (int stage : {1, 2, 3}) {
      for (const offload_device param : {offload_device::none, offload_device::cpu}) {
        if (param == offload_device::cpu && stage != 3) {
          continue;
        }
        if (const std::optional<estimate_row> r = setting(stage, param)) {
          plan.ranked.push_back({*r, estimate_step_cost(*r, o, rates), shortfalls(*r, budget)});
        }
      }
    }
  };
  // On the CPU backend the device and the host are the same cores and the same memory: a partial offload
  // would only move state between two budgets of one memory, at no gain in speed. With HSDP the engine
  // offloads nothing.
  if (rates.device != "cpu" && o.shard_ranks() == o.ranks() && o.partial_offload) {
    add_sized(
        [&](int stage, offload_device param) { return partial_offload_setting(o, stage, budget.device_bytes, param); });
  }
  // The state split between host memory and NVMe, where there is NVMe to put a share on (without HSDP).
  if (budget.nvme_bytes > 0 && o.shard_ranks() == o.ranks()) {
    add_sized([&](int stage, offload_device param) { return host_nvme_setting(o, stage, budget.host_bytes, param); });
  }
  std::stable_sort(plan.ranked.begin(), plan.ranked.end(),
                   [](const plan_candidate& a, const plan_candidate& b) { return a.cost.total < b.cost.total; });
  for (std::size_t i = 0; i < plan.ranked.size(); ++i) {
    if (plan.ranked[i].fits()) {
      plan.chosen = i;
      break;
    }
  }
  return plan;
}

/// The DeepSpeed config block of row `r` for the model of `o`: `zero_optimization` with the stage,
/// the `offload_optimizer` and `offload_param` blocks (`nvme_path` and `buffer_count` for NVMe; an
/// offloaded optimizer's `ratio`, 1 for a whole offload, so that the merge replaces a config's own),
/// zero's overlap keys where `o`'s config sets them (kept
/// where the row runs them, else turned off), and the sizes the estimate assumed
/// (`reduce_bucket_size`, `allgather_bucket_size` when set, and at stage 3
/// `stage3_prefetch_bucket_size`, `stage3_max_live_parameters` and, with hpZ, the
/// `zero_hpz_partition_size` its bytes counted); the precision block of `o.param_dtype` (`bf16` or
/// `fp16` enabled; neither for fp32). Merge it into a ds_config.json (`nlohmann::json::merge_patch`).
/// \throws usage_error for an NVMe row without `nvme_path`.
[[nodiscard]] inline nlohmann::json plan_config_block(const estimate_row& r, const estimate_options& o,
                                                      const std::string& nvme_path) {
  nlohmann::json z = {{"stage", r.stage}, {"reduce_bucket_size", o.reduce_bucket_size}};
  if (o.allgather_bucket_size && (r.stage == 1 || r.stage == 2)) {
    z["allgather_bucket_size"] = *o.allgather_bucket_size;
  }
  if (r.stage >= 1 && o.shard_ranks() < o.ranks()) {
    z["mics_shard_size"] = o.mics_shard_size;
  }
  if (r.stage == 3) {
    z["stage3_prefetch_bucket_size"] = o.stage3_prefetch_bucket_size;
    z["stage3_max_live_parameters"] = o.stage3_max_live_parameters;
    if (o.hpz_partition_size > 1) {
      z["zero_hpz_partition_size"] = o.hpz_partition_size;
    }
  }
  auto offload = [&](offload_device d) {
    nlohmann::json b = {{"device", name_of(d)}};
    if (d == offload_device::nvme) {
      if (nvme_path.empty()) {
        throw usage_error("plan_config_block: an NVMe setting needs the folder of its files (nvme_path)");
      }
      b["nvme_path"] = nvme_path;
    }
    if (d != offload_device::none) {
      b["pin_memory"] = true;
    }
    return b;
  };
  z["offload_optimizer"] = offload(r.offload_optimizer);
  if (r.offload_optimizer == offload_device::nvme) {
    z["offload_optimizer"]["buffer_count"] = o.offload_optimizer_buffer_count;
  }
  if (r.offload_optimizer != offload_device::none) {
    // Always, so that a ratio of the config the block is merged into does not outlive a whole offload.
    z["offload_optimizer"]["ratio"] = r.offload_optimizer == offload_device::cpu ? std::min(r.offload_ratio, 1.0) : 1.0;
  }
  // zero's host_ratio where the row splits the state or the config sets it (refused off NVMe: turned off).
  if (r.host_ratio > 0 || o.config_host_ratio != 0) {
    z["offload_optimizer"]["host_ratio"] = r.offload_optimizer == offload_device::nvme ? r.host_ratio : 0.0;
  }
  // zero's overlap keys, where the config has them: kept where the row runs them, else off (the engine
  // refuses them without the state on the CPU, and for a split state without forward_overlap or, at
  // stages 2-3, with gradient accumulation: check_engine_config).
  const bool on_cpu = r.offload_optimizer == offload_device::cpu;
  const bool split = on_cpu && r.offload_ratio < 1;
  const bool forward =
      on_cpu && o.config_forward_overlap && (!split || r.stage < 2 || o.gradient_accumulation_steps == 1);
  if (o.config_forward_overlap) {
    z["offload_optimizer"]["forward_overlap"] = forward;
  }
  if (o.config_backward_overlap != 0) {
    // The delayed update refuses it (an update during backward would use the step's own gradients).
    z["offload_optimizer"]["backward_overlap"] =
        on_cpu && (!split || forward) && r.delayed_warmup < 0 ? o.config_backward_overlap : 0.0;
  }
  // zero's delayed update: written where the row runs it (the config's block where the row can run it, or the
  // plan's --allow-stale), turned off (null: the block absent) where the config has it and the row does not.
  if (r.delayed_warmup >= 0) {
    z["offload_optimizer"]["delayed_update"] = {{"warmup_steps", r.delayed_warmup}};
  } else if (o.config_delayed_warmup >= 0) {
    z["offload_optimizer"]["delayed_update"] = nullptr;
  }
  if (o.config_zenflow_topk && !r.zenflow) {
    z["zenflow"] = nullptr; // the config's block, off where the row cannot run it (kept where it can)
  }
  z["offload_param"] = offload(r.offload_param);
  nlohmann::json block = {{"zero_optimization", z}};
  if (o.param_dtype != dtype::f32) {
    block[o.param_dtype == dtype::bf16 ? "bf16" : "fp16"] = {{"enabled", true}};
  }
  return block;
}

/// The model counts a plan needs, from the parameter sizes (elements) of each module, in order: the
/// parameters, the largest module and parameter, each parameter's size (for `params_below`), and the modules
/// themselves (for `padded_sizes_of`).
/// \throws usage_error for a size below 1 or a count that overflows.
[[nodiscard]] inline model_summary summarize_modules(const std::vector<std::vector<std::int64_t>>& modules) {
  model_summary m;
  for (const auto& module : modules) {
    std::int64_t in_module = 0;
    for (const std::int64_t n : module) {
      if (n < 1 || __builtin_add_overflow(in_module, n, &in_module) || __builtin_add_overflow(m.params, n, &m.params)) {
        throw usage_error("summarize_modules: parameter sizes are elements >= 1 whose sum fits in 64 bits");
      }
      m.largest_param = std::max(m.largest_param, n);
      m.param_counts.emplace_back(n, 1);
    }
    m.largest_layer_params = std::max(m.largest_layer_params, in_module);
    m.module_list.push_back({.name = cat("modules[", std::to_string(m.modules), "]"), .repeat = 1, .params = module});
    ++m.modules;
  }
  return m;
}

/// The estimate options of a resolved config `c` for model `m` (`read_model_description`,
/// `summarize_modules`) on `ranks_per_node` x `nodes` ranks: the sizes the config sets (the NVMe chunk
/// buffers from `aio`, offload_param's buffers and `max_in_cpu` among them), the parameters
/// below its `stage3_param_persistence_threshold` as persistent. The gradient dtype is left to each
/// stage's default unless `c`'s differs from its stage's default (a config that sets the default
/// explicitly is estimated with the defaults, fp32 for bf16 at stage 0: on the safe side). The config's
/// `zero_hpz_partition_size` is counted in the stage 3 rows whatever its stage (a plan's block merged into
/// it keeps the key). \throws config_error naming zero_optimization.zero_hpz_partition_size when it does
/// not divide ranks_per_node x nodes.
[[nodiscard]] inline estimate_options estimate_options_from(const config& c, const model_summary& m,
                                                            std::int64_t ranks_per_node, std::int64_t nodes = 1) {
  const std::int64_t hpz = c.zero_optimization.zero_hpz_partition_size;
  if (hpz < 1 || (ranks_per_node * nodes) % hpz != 0) {
    throw config_error(cat("zero_optimization.zero_hpz_partition_size ", std::to_string(hpz), " does not divide the ",
                           std::to_string(ranks_per_node * nodes),
                           " ranks of the data group; expected the ranks of a node, a divisor of the group's size"));
  }
  const std::int64_t mics = c.zero_optimization.mics_shard_size;
  if (mics != -1 && (mics < 1 || (ranks_per_node * nodes) % mics != 0)) {
    throw config_error(cat("zero_optimization.mics_shard_size ", std::to_string(mics), " does not divide the ",
                           std::to_string(ranks_per_node * nodes),
                           " ranks; expected the ranks of a shard group, a divisor of the communicator's size"));
  }
  estimate_options o;
  o.hpz_partition_size = hpz;
  o.mics_shard_size = mics;
  o.params = m.params;
  o.largest_layer_params = m.largest_layer_params;
  o.largest_param_params = m.largest_param;
  o.persistent_params = m.params_below(c.zero_optimization.stage3_param_persistence_threshold);
  o.gpus_per_node = ranks_per_node;
  o.nodes = nodes;
  o.param_dtype = c.param_dtype();
  if (c.optimizer) {
    o.state_tensors = static_cast<std::int64_t>(rule_state_of(*c.optimizer).first);
    o.adam = rule_of(c.optimizer->type) == update_rule::adamw;
    o.partial_offload = rule_of(c.optimizer->type) != update_rule::lamb;
    if (!o.adam) {
      o.rule_name = rule_name_of(*c.optimizer);
    }
  }
  if (c.grad_accum_dtype != default_grad_accum_dtype(o.param_dtype, c.stage())) {
    o.grad_dtype = c.grad_accum_dtype;
  }
  const auto& z = c.zero_optimization;
  o.reduce_bucket_size = z.reduce_bucket_size;
  o.allgather_bucket_size = z.allgather_bucket_size;
  o.stage3_prefetch_bucket_size = z.stage3_prefetch_bucket_size;
  o.stage3_max_live_parameters = z.stage3_max_live_parameters;
  o.stage3_keep_param_shard = z.stage3_keep_param_shard;
  o.sub_group_size = z.sub_group_size;
  o.offload_optimizer_buffer_count = z.offload_optimizer.buffer_count;
  // A split state streams its host share's gradients beside the next forward (the engine refuses the key
  // with a split state and accumulation).
  o.offload_forward_overlap = z.offload_optimizer.forward_overlap && c.gradient_accumulation_steps == 1;
  o.config_backward_overlap = z.offload_optimizer.backward_overlap;
  o.config_forward_overlap = z.offload_optimizer.forward_overlap;
  o.config_delayed_warmup = z.offload_optimizer.delayed_update ? z.offload_optimizer.delayed_warmup_steps : -1;
  o.config_zenflow_topk = z.zenflow.enabled ? std::optional<double>(z.zenflow.topk_ratio) : std::nullopt;
  o.config_zenflow_update_interval = z.zenflow.update_interval.value_or(1);
  o.config_zenflow_overlap = z.zenflow.overlap_step;
  o.host_ratio = z.offload_optimizer.device == offload_device::nvme ? z.offload_optimizer.host_ratio : 0.0;
  o.config_host_ratio = z.offload_optimizer.host_ratio;
  o.gradient_accumulation_steps = c.gradient_accumulation_steps;
  o.nvme_chunk_elements = c.aio.block_size / 4 * c.aio.queue_depth;
  o.offload_param_buffer_count = z.offload_param.buffer_count;
  o.offload_param_buffer_size = z.offload_param.buffer_size;
  o.offload_param_max_in_cpu = z.offload_param.max_in_cpu;
  o.padded = padded_sizes_of(m, o.param_dtype, o.shard_ranks(), o.reduce_bucket_size,
                             c.zero_optimization.stage3_param_persistence_threshold);
  return o;
}

} // namespace zero::tools

#include "zero/tools/plan_text.hpp" // the plan in words: setting_name, plan_table
