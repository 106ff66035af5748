#pragma once
/// \file
/// The ZeRO paper's formula for model-state bytes per rank (Rajbhandari et al. 2020, section 5),
/// generalised to the dtypes in use, and the report that puts the measured bytes beside it.

#include "zero/core/dtype.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/memory/allocator.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace zero {

/// K of the formula: fp32 master, m and v per parameter (12), or m and v for fp32 training (8); for a rule with
/// `state_tensors` fp32 state tensors other than Adam's two (update_rules.hpp), 4 bytes for each and the master.
[[nodiscard]] inline double optimizer_state_bytes(dtype param, std::size_t state_tensors = 2) noexcept {
  return 4.0 * static_cast<double>(state_tensors + (param == dtype::f32 ? 0 : 1));
}

/// Model-state bytes per rank that ZeRO promises for `psi` parameters over `n` ranks.
///
/// Per parameter: P bytes of parameters (the dtype trained in), G bytes of gradients (the gradient
/// dtype) and K bytes of optimizer state (fp32 master, m and v: 12 when P is 16-bit; 8 for fp32
/// training, where the parameters are their own master copy).
///
/// | stage | bytes per rank |
/// |---|---|
/// | 0 | (P + G + K) psi |
/// | 1 | (P + G) psi + K psi / n |
/// | 2 | P psi + (G + K) psi / n |
/// | 3 | (P + G + K) psi / n |
/// `state_tensors`: the update rule's, beside the master (K above is Adam's, 2).
[[nodiscard]] inline double zero_formula_bytes(int stage, double psi, int n, dtype param, dtype grad,
                                               std::size_t state_tensors = 2) {
  const double p = static_cast<double>(size_of(param));
  const double g = static_cast<double>(size_of(grad));
  const double k = optimizer_state_bytes(param, state_tensors);
  const double nn = static_cast<double>(n);
  switch (stage) {
  case 0:
    return (p + g + k) * psi;
  case 1:
    return (p + g) * psi + k * psi / nn;
  case 2:
    return p * psi + (g + k) * psi / nn;
  default:
    return (p + g + k) * psi / nn;
  }
}

/// Host bytes per rank of ZeRO-Offload's optimizer over `psi` parameters on `n` ranks: the state
/// (K) and the rank's gradient (G) and parameter (P) shards staged in host memory, (K + P + G) psi / n.
[[nodiscard]] inline double offloaded_host_formula_bytes(double psi, int n, dtype param, dtype grad,
                                                         std::size_t state_tensors = 2) {
  return (optimizer_state_bytes(param, state_tensors) + static_cast<double>(size_of(param)) +
          static_cast<double>(size_of(grad))) *
         psi / static_cast<double>(n);
}

/// Host bytes per rank of ZeRO-Offload's parameter offload (stage 3) over `psi` parameters on `n`
/// ranks: the rank's parameter shard, P psi / n.
[[nodiscard]] inline double offloaded_params_host_formula_bytes(double psi, int n, dtype param) {
  return static_cast<double>(size_of(param)) * psi / static_cast<double>(n);
}

/// Bytes per tag measured by the engine's counting allocator, next to the formula.
struct memory_report {
  int stage = 0;
  int world_size = 1;
  /// The dtypes of parameters and gradients.
  dtype param_type = dtype::f32, grad_type = dtype::f32;
  /// Trainable parameters (psi), without padding.
  std::size_t parameters = 0;
  /// Padding elements in the flat buffer (alignment and even splitting over ranks).
  std::size_t padding = 0;
  /// The update rule's fp32 state tensors per element beside the master (Adam/AdamW's two moments; the formula's K).
  std::size_t state_tensors = 2;
  /// Live bytes now, per tag.
  std::size_t params = 0, grads = 0, optimizer = 0, buffers = 0;
  /// Peak bytes since the engine was built (or since `reset_peaks`).
  std::size_t params_peak = 0, grads_peak = 0, optimizer_peak = 0, buffers_peak = 0;
  /// Peak of params + grads + optimizer together: the persistent model state.
  std::size_t model_state_peak = 0;
  /// Peak of the gathered working set (stage 3), reported apart from the model state.
  std::size_t working_set_peak = 0;
  /// The formula's bytes for this stage, world size and dtypes (with the optimizer offloaded: without
  /// the optimizer state, K psi / n, and at stages 2-3 without the gradient shard, G psi / n; with the parameters
  /// offloaded: without their shard, P psi / n; each is in host memory).
  double formula = 0;
  /// Offload: host bytes per tag now, their peak together, and the formula's host bytes. Optimizer
  /// offload (`offload_optimizer.device: cpu`) holds the state and the gradient and parameter shards
  /// staged there, (K + P + G) psi / n; parameter offload (`offload_param.device: cpu`) the rank's
  /// parameter shard, P psi / n, under `host_params` too (with both, the optimizer updates that shard
  /// in place: (K + P + G) psi / n in all). All zero without offload.
  std::size_t host_params = 0, host_grads = 0, host_optimizer = 0, host_peak = 0;
  double host_formula = 0;
  /// The share of the optimizer state offloaded (`offload_optimizer.ratio` as the engine split it): 1
  /// with the whole optimizer offloaded, 0 without; below 1 the device keeps the rest of K psi / n and the
  /// host holds that share of (K + P + G) psi / n.
  double offload_ratio = 0;
  /// NVMe offload with `offload_optimizer.host_ratio` (zero's own key): the share of the offloaded state in
  /// host memory beside the file, as the engine split it (its elements over the rank's state elements); 0
  /// otherwise. The host then holds that share of (K + P + G) psi / n and the rest of (2 P + G) psi / n.
  double host_share = 0;
  /// NVMe offload (`offload_optimizer.device: nvme`): bytes of the state file (two slots of K Ψ / N:
  /// the step writes one while it reads the other). `host_buffers`: host chunk buffers (NVMe) and
  /// host staging of accumulated gradients (stages 2-3, offloaded). With the parameters on NVMe
  /// (`offload_param.device: nvme`) `nvme` adds their file, `nvme_params` (two slots of the part of
  /// P Ψ / N beyond `max_in_cpu`), and `host_buffers` their bounce buffers.
  std::size_t nvme = 0, host_buffers = 0, nvme_params = 0;
  /// hpZ (`zero_hpz_partition_size` H above 1, stage 3): bytes of the secondary partition, counted in
  /// `params`; the formula gains its P psi / H.
  std::size_t secondary = 0;

  /// model_state_peak / formula.
  [[nodiscard]] double ratio() const noexcept {
    return formula > 0 ? static_cast<double>(model_state_peak) / formula : 0;
  }

  /// A small table for logs.
  [[nodiscard]] std::string table() const {
    char buf[1024];
    std::snprintf(buf, sizeof buf,
                  "memory per rank (stage %d, %d ranks, %zu parameters, %zu padding)\n"
                  "  params     %12zu B (peak %zu)\n"
                  "  grads      %12zu B (peak %zu)\n"
                  "  optimizer  %12zu B (peak %zu)\n"
                  "  buffers    %12zu B (peak %zu)\n"
                  "  model state peak %zu B, ZeRO formula %.0f B, ratio %.4f\n"
                  "  gathered working set peak %zu B (stage 3, not model state)\n",
                  stage, world_size, parameters, padding, params, params_peak, grads, grads_peak, optimizer,
                  optimizer_peak, buffers, buffers_peak, model_state_peak, formula, ratio(), working_set_peak);
    std::string out = buf;
    if (host_formula > 0) {
      std::snprintf(buf, sizeof buf,
                    "  offloaded to host: params %zu B, grads %zu B, optimizer %zu B (peak %zu B, formula %.0f B)\n",
                    host_params, host_grads, host_optimizer, host_peak, host_formula);
      out += buf;
    }
    if (secondary > 0) {
      std::snprintf(buf, sizeof buf, "  hpZ secondary partition %zu B (in params and the formula)\n", secondary);
      out += buf;
    }
    if (offload_ratio > 0 && offload_ratio < 1) {
      std::snprintf(buf, sizeof buf,
                    "  partial offload: %.4f of the optimizer state on the host, the rest on the device (%zu B)\n",
                    offload_ratio, optimizer);
      out += buf;
    }
    if (host_share > 0) {
      std::snprintf(buf, sizeof buf,
                    "  host memory and NVMe: %.4f of the optimizer state in host memory (%zu B), the rest in the "
                    "NVMe file\n",
                    host_share, host_optimizer);
      out += buf;
    }
    if (nvme > 0 && nvme_params == 0) {
      std::snprintf(buf, sizeof buf,
                    "  on NVMe: the optimizer state file %zu B (two slots); host chunk buffers %zu B\n", nvme,
                    host_buffers);
      out += buf;
    } else if (nvme > 0) {
      std::snprintf(buf, sizeof buf,
                    "  on NVMe: %zu B, of which the parameter file %zu B (two slots each); host buffers %zu B\n", nvme,
                    nvme_params, host_buffers);
      out += buf;
    }
    return out;
  }
};

/// The report of an engine's counting allocators: `state` (params, grads, optimizer), `buffers`
/// and `work` (stage 3's gathered working set), beside the formula for `layout` (not finalized: no
/// parameters yet) at `stage` over `world` ranks with gradients in `grad`, for an update rule of `state_tensors`
/// fp32 state tensors beside the master.
template <class Counting>
[[nodiscard]] memory_report make_memory_report(int stage, int world, const flat_layout& layout, dtype grad,
                                               const Counting& state, const Counting& buffers, const Counting& work,
                                               std::size_t state_tensors = 2) {
  memory_report m;
  m.stage = stage;
  m.world_size = world;
  m.param_type = layout.type();
  m.grad_type = grad;
  m.parameters = layout.finalized() ? layout.numel() : 0;
  m.padding = layout.finalized() ? layout.padding() : 0;
  m.state_tensors = state_tensors;
  m.params = state.live(memory_tag::params);
  m.grads = state.live(memory_tag::grads);
  m.optimizer = state.live(memory_tag::optimizer);
  m.buffers = buffers.live(memory_tag::buffers);
  m.params_peak = state.peak(memory_tag::params);
  m.grads_peak = state.peak(memory_tag::grads);
  m.optimizer_peak = state.peak(memory_tag::optimizer);
  m.buffers_peak = buffers.peak(memory_tag::buffers);
  m.model_state_peak = state.total().peak;
  m.working_set_peak = work.total().peak;
  m.formula =
      zero_formula_bytes(m.stage, static_cast<double>(m.parameters), m.world_size, layout.type(), grad, state_tensors);
  return m;
}

/// Adds the host bytes of an offloaded optimizer (`host`: its counting allocator) to `m`, and moves
/// the optimizer state, or the share `share` of it (partial offload), from the device formula to the
/// host one; with `grads_share` (stages 2-3 with the state offloaded: the reduced gradients go to the
/// host during backward) that share of the gradient shard too (1 for the whole state, the host's share
/// of a split one streamed beside the next forward). Host staging of accumulated gradients is under
/// `host_buffers`. Call before `add_host_params`: it sets the host fields, which that adds to.
template <class Counting>
void add_host_memory(memory_report& m, const Counting& host, double share = 1.0, double grads_share = 0.0) {
  m.host_params = host.live(memory_tag::params);
  m.host_grads = host.live(memory_tag::grads);
  m.host_optimizer = host.live(memory_tag::optimizer);
  m.host_peak = host.total().peak;
  m.offload_ratio = share;
  m.host_formula = share * offloaded_host_formula_bytes(static_cast<double>(m.parameters), m.world_size, m.param_type,
                                                        m.grad_type, m.state_tensors);
  m.host_buffers = host.live(memory_tag::buffers);
  const double psi_n = static_cast<double>(m.parameters) / m.world_size;
  m.formula -= share * optimizer_state_bytes(m.param_type, m.state_tensors) * psi_n;
  m.formula -= grads_share * static_cast<double>(size_of(m.grad_type)) * psi_n;
}

/// Adds the host and file bytes of an optimizer with its state on NVMe (`host`: its counting
/// allocator, `file_bytes`: the state file) to `m`. The host holds the gradient shard and two copies
/// of the parameter shard, (2 P + G) Ψ / N, and the chunk buffers (under `host_buffers`);
/// `grads_on_host`: the whole gradient shard streams to the host (`add_host_memory`'s share 1).
template <class Counting>
void add_nvme_memory(memory_report& m, const Counting& host, std::size_t file_bytes, bool grads_on_host = false) {
  add_host_memory(m, host, 1.0, grads_on_host ? 1.0 : 0.0);
  const double psi_n = static_cast<double>(m.parameters) / m.world_size;
  m.host_formula =
      (2.0 * static_cast<double>(size_of(m.param_type)) + static_cast<double>(size_of(m.grad_type))) * psi_n;
  m.nvme = file_bytes;
}

/// Adds the bytes of an optimizer with its state split between host memory and an NVMe file
/// (`offload_optimizer.host_ratio`) to `m`: `nvme_host` and `file_bytes` the file part's, as
/// `add_nvme_memory` counts them, and `host` the host part's, as `add_host_memory` does, over `share` of
/// the rank's state elements. The whole state leaves the device formula (`offload_ratio` 1); the host
/// formula holds share x (K + P + G) psi / n and (1 - share) x (2 P + G) psi / n.
template <class Counting>
void add_host_nvme_memory(memory_report& m, const Counting& host, const Counting& nvme_host, std::size_t file_bytes,
                          double share) {
  add_nvme_memory(m, nvme_host, file_bytes);
  m.host_params += host.live(memory_tag::params);
  m.host_grads += host.live(memory_tag::grads);
  m.host_optimizer += host.live(memory_tag::optimizer);
  m.host_buffers += host.live(memory_tag::buffers);
  m.host_peak += host.total().peak;
  m.host_formula = share * offloaded_host_formula_bytes(static_cast<double>(m.parameters), m.world_size, m.param_type,
                                                        m.grad_type, m.state_tensors) +
                   (1.0 - share) * m.host_formula;
  m.host_share = share;
}

/// Adds the host bytes of an offloaded parameter shard (`host`: its counting allocator, stage 3's
/// `offload_param.device: cpu`) to `m`'s `host_params`, `host_peak` and `host_formula`, and moves the
/// shard, P psi / n, from the device formula to the host one. With the optimizer on the host too, its
/// host AdamW updates its share of that shard in place, which the optimizer's host formula already
/// counts: `counted`, the fraction already counted (1 with the whole state offloaded, the ratio with
/// partial offload, 0 without).
template <class Counting> void add_host_params(memory_report& m, const Counting& host, double counted = 0.0) {
  m.host_params += host.live(memory_tag::params);
  m.host_peak += host.total().peak;
  const double shard =
      offloaded_params_host_formula_bytes(static_cast<double>(m.parameters), m.world_size, m.param_type);
  m.host_formula += (1.0 - counted) * shard;
  m.formula -= shard;
}

/// Stage 3 without a kept 16-bit shard (the gathers cast from the fp32 master): the shard, P psi / n,
/// leaves the formula, which becomes (G + K) psi / n.
/// Adds hpZ's secondary partition (`bytes`, in `params` already; `node_size` H) to the formula: P psi / H.
inline void add_secondary(memory_report& m, std::size_t bytes, std::int64_t node_size) {
  if (bytes > 0 && node_size > 1) {
    m.secondary = bytes;
    m.formula +=
        static_cast<double>(m.parameters) * static_cast<double>(size_of(m.param_type)) / static_cast<double>(node_size);
  }
}

inline void drop_param_shard(memory_report& m) {
  m.formula -= offloaded_params_host_formula_bytes(static_cast<double>(m.parameters), m.world_size, m.param_type);
}

/// Adds the host and file bytes of a parameter shard on NVMe (stage 3's `offload_param.device:
/// nvme`; `host`: its counting allocator, `file_bytes`: its file, `resident`: the elements kept in
/// host memory under max_in_cpu) to `m`: the resident part and any ranges kept after a failed write
/// under `host_params`, the bounce buffers under `host_buffers`, the file under `nvme` and
/// `nvme_params`. The shard, P psi / n, leaves the device formula; the host formula gains the
/// resident part's P bytes per element.
template <class Counting>
void add_nvme_params(memory_report& m, const Counting& host, std::size_t file_bytes, std::size_t resident) {
  m.host_params += host.live(memory_tag::params);
  m.host_buffers += host.live(memory_tag::buffers);
  m.host_peak += host.total().peak;
  m.nvme += file_bytes;
  m.nvme_params = file_bytes;
  const double p = static_cast<double>(size_of(m.param_type));
  m.host_formula += p * static_cast<double>(resident);
  m.formula -= offloaded_params_host_formula_bytes(static_cast<double>(m.parameters), m.world_size, m.param_type);
}

} // namespace zero
