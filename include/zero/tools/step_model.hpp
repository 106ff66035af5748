#pragma once
/// \file
/// A step-time model for N GPUs (docs/parallelism.md, "A step at N GPUs, predicted"): what one rank's
/// collectives move in a step for a ZeRO setting (stage 1-3, hpZ, qwZ, qgZ, HSDP), as the engine's
/// `counting_communicator` counts them (tests/config/test_step_model.cpp holds the two side by side on
/// 8 in-process ranks as 2 nodes of 4), their time over a cluster's links, and the step:
///
///     step = forward + backward (one GPU, no communication, the per-GPU batch)
///          + AdamW over the rank's shard at the device's rate
///          + the collectives' time - what of it is hidden behind forward and backward
///
/// A collective of buffer S bytes (the ledger's count: sent for reduce-scatter and all-to-all, received
/// for all-gather, the count for all-reduce) over a group of n ranks, calls times:
///
///     reduce-scatter, all-gather  calls (call latency + (n - 1) hop latency) + S (n - 1) / n / bw
///     all-reduce                  calls (call latency + 2 (n - 1) hop latency) + 2 S (n - 1) / n / bw
///     all-to-all                  calls (call latency + (n - 1) hop latency) + the part for the rank's own
///                                 node / intra bw + the part for other nodes / (inter / GPUs per node)
///
/// bw is NCCL's bus bandwidth of the slowest level the ring crosses: inside a node `intra`; a group that
/// spans nodes with L of its ranks on each gets min(intra, inter L / GPUs per node): a ring's bytes leave a
/// node once per group ((n - 1) / n of the buffer, NCCL's channels spreading them over the node's links), and
/// GPUs per node / L such groups run at once (the data group: all of the node's network; one rank per node,
/// as qgZ's and HSDP's cross groups: a GPU's share). The hop latency is the level's.
///
/// Hidden communication: `overlap` (0 to 1) of it, at most forward + backward. The default is 0: on 2 x
/// H200 over NVLink, zero's forward and backward grew by about the collectives' time (NCCL's kernels take
/// SMs from the GEMMs: bench/README.md, "Deep MLP, zero against FSDP2"), and the model with overlap 0
/// predicted those steps within 0.5% (docs/parallelism.md). Across nodes, where the network rather than
/// the SMs bounds a collective, more may hide; the model has no measurement of it.

#include "zero/core/error.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zero::tools {

/// One level of links: NCCL's bus bandwidth on it (bytes per second, nccl-tests' convention) and the
/// latency each ring hop over it adds to a call.
struct link_level {
  double bus_bytes_per_s = 0;
  double hop_latency_s = 0;
};

/// The machines a step is predicted on: `nodes` of `gpus_per_node` GPUs.
struct cluster_shape {
  int nodes = 1;
  int gpus_per_node = 8;
  /// Inside a node, NVLink through NVSwitch: about 360 GB/s, NCCL's reduce-scatter and all-gather bus
  /// bandwidth on 8 x H100 (all-reduce reaches more); 1 us a hop.
  link_level intra{360e9, 1e-6};
  /// Between nodes: a node's network bandwidth in all (400 Gb/s here), which its GPUs share; 2 us a hop.
  link_level inter{400e9 / 8, 2e-6};
  /// Each call's fixed cost: launch and the streams' events. About 10 us: a 1 MiB reduce-scatter on
  /// 2 x H200 took 15.6 us, 2.3 of them its bytes (bench/README.md, "Collectives on 2 x H200").
  double call_latency_s = 10e-6;

  [[nodiscard]] int world() const noexcept { return nodes * gpus_per_node; }
};

/// The ZeRO setting whose communication is predicted (zero's keys, docs/zeropp.md).
struct comm_setting {
  /// 1-3 (stage 1 moves what stage 2 does: a reduce-scatter of the gradients, an all-gather of the new
  /// parameters).
  int stage = 3;
  /// Stage 3: `zero_hpz_partition_size` = GPUs per node: backward's gathers inside the node.
  bool hpz = false;
  /// Stage 3: `zero_quantized_weights`: the gathers over the data group carry int8 codes and block scales.
  bool qwz = false;
  /// `zero_quantized_gradients` with this many bits (4 or 8), 0 without: all-to-alls instead of the
  /// reduce-scatter, in two levels (node, then across nodes) where there is more than one node.
  int qgz_bits = 0;
  /// Stage 3 inside each node (the shard group), the nodes replicas of each other: an all-reduce of the
  /// reduced shard across nodes.
  bool hsdp = false;

  /// "stage 3 + hpZ + qwZ + qgZ int4" and the like.
  [[nodiscard]] std::string name() const {
    std::string s = "stage " + std::to_string(stage);
    if (hsdp) {
      s += " HSDP";
    }
    if (hpz) {
      s += " + hpZ";
    }
    if (qwz) {
      s += " + qwZ";
    }
    if (qgz_bits != 0) {
      s += " + qgZ int" + std::to_string(qgz_bits);
    }
    return s;
  }
};

/// Where a collective runs: the whole data group, one node's ranks, or one rank per node (the cross group
/// of hierarchical qgZ and HSDP).
enum class comm_group { data, node, cross };
/// The part of the step a collective belongs to.
enum class comm_phase { forward, backward, step };

/// One kind of collective of a step, as one rank sees it.
struct step_collective {
  std::string op;     ///< "reduce_scatter", "all_gather", "all_reduce" or "all_to_all"
  comm_group group;   ///< where it runs
  comm_phase phase;   ///< when
  double bytes = 0;   ///< the rank's buffer bytes over the step (the counting communicator's figure)
  double calls = 0;   ///< how many calls carry them
  double seconds = 0; ///< `collective_seconds` on the cluster (set by `step_collectives`)
};

/// The model and its one-GPU times.
struct step_inputs {
  std::int64_t params = 0;                    ///< Ψ
  std::int64_t modules = 1;                   ///< stage 3's gather units (calls per pass)
  std::int64_t kept_for_backward = 0;         ///< parameters backward does not gather again (the last module's, say)
  std::int64_t bucket_elements = 500'000'000; ///< reduce_bucket_size: calls of the reduce-scatter
  double param_bytes = 2;                     ///< bytes of a 16-bit parameter
  double grad_bytes = 2;                      ///< bytes of a reduced gradient
  std::int64_t quant_block = 4096;            ///< qwZ's and qgZ's block: one fp32 scale each
  double forward_s = 0;                       ///< forward on one GPU, no communication
  double backward_s = 0;                      ///< backward likewise
  double device_adamw = 0;                    ///< parameters per second of the device's AdamW (0: left out)
};

/// The predicted step and its parts, in seconds.
struct step_prediction {
  comm_setting setting;
  double compute = 0;       ///< forward + backward
  double optimizer = 0;     ///< AdamW over the shard
  double communication = 0; ///< every collective's time
  double hidden = 0;        ///< of it, behind forward and backward
  double step = 0;          ///< compute + optimizer + communication - hidden
  /// Bytes that leave each node in a step: a ring's (n - 1) / n of its buffer once per group (GPUs per node / L
  /// groups of L ranks a node), an all-to-all's pieces for other nodes from every GPU.
  double node_egress_bytes = 0;
  std::vector<step_collective> collectives;
};

namespace detail {
/// `v` in %g's form, for messages.
inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}
inline void require_model(bool ok, const std::string& what) {
  if (!ok) {
    throw usage_error("step model: " + what);
  }
}
} // namespace detail

/// Ranks in `g` and how many of them share a node, on `c`.
[[nodiscard]] inline int group_size(comm_group g, const cluster_shape& c, bool hsdp) {
  switch (g) {
  case comm_group::data:
    return hsdp ? c.gpus_per_node : c.world();
  case comm_group::node:
    return c.gpus_per_node;
  default:
    return c.nodes;
  }
}
[[nodiscard]] inline int ranks_per_node_in(comm_group g, const cluster_shape& c) {
  return g == comm_group::cross ? 1 : c.gpus_per_node;
}

/// Seconds of `x` on `c` (the file comment's formulas); `hsdp` makes the data group a node.
/// \throws usage_error for a cluster without positive sizes, bandwidths or non-negative latencies.
[[nodiscard]] inline double collective_seconds(const step_collective& x, const cluster_shape& c, bool hsdp = false) {
  detail::require_model(c.nodes >= 1 && c.gpus_per_node >= 1, "nodes and GPUs per node must be at least 1, found " +
                                                                  std::to_string(c.nodes) + " and " +
                                                                  std::to_string(c.gpus_per_node));
  detail::require_model(c.intra.bus_bytes_per_s > 0 && c.inter.bus_bytes_per_s > 0,
                        "the intra- and inter-node bandwidths must be positive, found " +
                            detail::num(c.intra.bus_bytes_per_s) + " and " + detail::num(c.inter.bus_bytes_per_s) +
                            " bytes/s");
  detail::require_model(c.intra.hop_latency_s >= 0 && c.inter.hop_latency_s >= 0 && c.call_latency_s >= 0,
                        "latencies must not be negative, found hops of " + detail::num(c.intra.hop_latency_s) +
                            " and " + detail::num(c.inter.hop_latency_s) + " s and calls of " +
                            detail::num(c.call_latency_s) + " s");
  const int n = group_size(x.group, c, hsdp);
  if (n <= 1 || x.bytes <= 0) {
    return 0;
  }
  const int local = std::min(n, ranks_per_node_in(x.group, c));
  const bool spans = n > local;
  // A ring's bytes cross each node boundary once: (n - 1) / n of the buffer leaves a node per group, and the
  // node's GPUs / local groups of the kind run at once, sharing its network.
  const double ring_network = c.inter.bus_bytes_per_s * local / c.gpus_per_node;
  const double bw = spans ? std::min(c.intra.bus_bytes_per_s, ring_network) : c.intra.bus_bytes_per_s;
  // An all-to-all sends each rank's pieces for other nodes straight there: every GPU of the node at once.
  const double network = c.inter.bus_bytes_per_s / c.gpus_per_node;
  const double hop = spans ? c.inter.hop_latency_s : c.intra.hop_latency_s;
  const double share = static_cast<double>(n - 1) / n;
  if (x.op == "all_to_all") {
    const double own_node = x.bytes * static_cast<double>(local - 1) / n;
    const double other_nodes = x.bytes * static_cast<double>(n - local) / n;
    return x.calls * (c.call_latency_s + (n - 1) * hop) + own_node / c.intra.bus_bytes_per_s + other_nodes / network;
  }
  if (x.op == "all_reduce") {
    return x.calls * (c.call_latency_s + 2.0 * (n - 1) * hop) + 2.0 * x.bytes * share / bw;
  }
  detail::require_model(x.op == "reduce_scatter" || x.op == "all_gather",
                        "unknown collective \"" + x.op +
                            "\"; expected reduce_scatter, all_gather, all_reduce or all_to_all");
  return x.calls * (c.call_latency_s + (n - 1) * hop) + x.bytes * share / bw;
}

/// The collectives one rank runs in a step of `s` for the model of `in` on `c` (bytes as the counting
/// communicator counts them; see the file comment), each with its seconds.
/// \throws usage_error for a setting the engine does not run (hpZ, qwZ or HSDP below stage 3, qgZ bits
///         other than 0, 4 and 8) or a model without parameters.
[[nodiscard]] inline std::vector<step_collective> step_collectives(const comm_setting& s, const step_inputs& in,
                                                                   const cluster_shape& c) {
  detail::require_model(s.stage >= 1 && s.stage <= 3, "stage " + std::to_string(s.stage) + "; expected 1, 2 or 3");
  detail::require_model(s.stage == 3 || (!s.hpz && !s.qwz && !s.hsdp), "hpZ, qwZ and HSDP are stage 3's");
  detail::require_model(!(s.hsdp && (s.hpz || s.qgz_bits != 0)), "HSDP with hpZ or qgZ is not a setting zero runs");
  detail::require_model(s.qgz_bits == 0 || s.qgz_bits == 4 || s.qgz_bits == 8,
                        "qgZ bits " + std::to_string(s.qgz_bits) + "; expected 0, 4 or 8");
  detail::require_model(in.params > 0 && in.modules >= 1 && in.bucket_elements >= 1 && in.kept_for_backward >= 0 &&
                            in.kept_for_backward < in.params,
                        "the model needs params > 0, modules >= 1, bucket_elements >= 1 and 0 <= kept_for_backward "
                        "< params, found " +
                            std::to_string(in.params) + ", " + std::to_string(in.modules) + ", " +
                            std::to_string(in.bucket_elements) + " and " + std::to_string(in.kept_for_backward));
  const auto psi = static_cast<double>(in.params);
  const double buckets = std::ceil(psi / static_cast<double>(in.bucket_elements));
  const double modules = static_cast<double>(in.modules);
  // int8 codes and one fp32 scale per block.
  const double quantized_weights = psi * (1.0 + 4.0 / static_cast<double>(in.quant_block));
  std::vector<step_collective> out;
  auto add = [&](const char* op, comm_group g, comm_phase ph, double bytes, double calls) {
    out.push_back({op, g, ph, bytes, calls, 0});
  };
  if (s.stage <= 2) {
    if (s.qgz_bits == 0) {
      add("reduce_scatter", comm_group::data, comm_phase::backward, in.grad_bytes * psi, buckets);
    }
    add("all_gather", comm_group::data, comm_phase::step, in.param_bytes * psi, buckets);
  } else {
    const double forward = s.qwz ? quantized_weights : in.param_bytes * psi;
    add("all_gather", comm_group::data, comm_phase::forward, forward, modules);
    const double again = psi - static_cast<double>(in.kept_for_backward);
    if (s.hpz) {
      add("all_gather", comm_group::node, comm_phase::backward, in.param_bytes * again, modules - 1);
    } else {
      add("all_gather", comm_group::data, comm_phase::backward,
          s.qwz ? quantized_weights * again / psi : in.param_bytes * again, modules - 1);
    }
    if (s.qgz_bits == 0) {
      add("reduce_scatter", comm_group::data, comm_phase::backward, in.grad_bytes * psi, buckets);
      if (s.hsdp && c.nodes > 1) {
        add("all_reduce", comm_group::cross, comm_phase::backward, in.grad_bytes * psi / c.gpus_per_node, buckets);
      }
    }
  }
  if (s.qgz_bits != 0) {
    const double codes = psi * (s.qgz_bits / 8.0 + 4.0 / static_cast<double>(in.quant_block));
    if (c.nodes > 1 && c.gpus_per_node > 1) {
      add("all_to_all", comm_group::node, comm_phase::backward, codes, buckets);
      add("all_to_all", comm_group::cross, comm_phase::backward, codes / c.gpus_per_node, buckets);
    } else {
      add("all_to_all", comm_group::data, comm_phase::backward, codes, buckets);
    }
  }
  for (auto& x : out) {
    x.seconds = collective_seconds(x, c, s.hsdp);
  }
  return out;
}

/// The step of `s` for the model of `in` on `c` with `overlap` of the communication hidden (file comment).
/// \throws usage_error as `step_collectives`, or for overlap outside [0, 1] or negative times.
[[nodiscard]] inline step_prediction predict_step(const comm_setting& s, const step_inputs& in, const cluster_shape& c,
                                                  double overlap = 0) {
  detail::require_model(overlap >= 0 && overlap <= 1,
                        "overlap " + detail::num(overlap) + "; expected a share in [0, 1]");
  detail::require_model(in.forward_s >= 0 && in.backward_s >= 0 && in.device_adamw >= 0,
                        "forward, backward and the AdamW rate must not be negative");
  step_prediction p;
  p.setting = s;
  p.collectives = step_collectives(s, in, c);
  p.compute = in.forward_s + in.backward_s;
  const int shards = s.hsdp ? c.gpus_per_node : c.world();
  p.optimizer = in.device_adamw > 0 ? std::ceil(static_cast<double>(in.params) / shards) / in.device_adamw : 0;
  for (const auto& x : p.collectives) {
    p.communication += x.seconds;
    const int n = group_size(x.group, c, s.hsdp);
    const int local = std::min(n, ranks_per_node_in(x.group, c));
    if (n > local) {
      const double groups = static_cast<double>(c.gpus_per_node) / local;
      p.node_egress_bytes +=
          x.op == "all_to_all" ? c.gpus_per_node * x.bytes * static_cast<double>(n - local) / n
                               : (x.op == "all_reduce" ? 2.0 : 1.0) * groups * x.bytes * static_cast<double>(n - 1) / n;
    }
  }
  p.hidden = std::min(overlap * p.communication, p.compute);
  p.step = p.compute + p.optimizer + p.communication - p.hidden;
  return p;
}

/// The settings `zero-estimate --plan` predicts at a cluster's size: stages 2 and 3, stage 3 with hpZ,
/// qwZ, qgZ (int4) and all three (ZeRO++), and HSDP where there is more than one node.
[[nodiscard]] inline std::vector<comm_setting> predicted_settings(const cluster_shape& c) {
  std::vector<comm_setting> out{{.stage = 2}, {.stage = 3}};
  if (c.nodes > 1) {
    out.push_back({.stage = 3, .hpz = true});
    out.push_back({.stage = 3, .qwz = true});
    out.push_back({.stage = 3, .qgz_bits = 4});
    out.push_back({.stage = 3, .hpz = true, .qwz = true, .qgz_bits = 4});
    out.push_back({.stage = 3, .hsdp = true});
  }
  return out;
}

/// The `zero_optimization` keys of `s` on `c`: the stage, and hpZ's partition (a node), qwZ, qgZ (its bits and,
/// across nodes, its node size) or HSDP's shard group (`mics_shard_size`, a node).
[[nodiscard]] inline nlohmann::json comm_setting_keys(const comm_setting& s, const cluster_shape& c) {
  nlohmann::json z = {{"stage", s.stage}};
  if (s.hpz) {
    z["zero_hpz_partition_size"] = c.gpus_per_node;
  }
  if (s.qwz) {
    z["zero_quantized_weights"] = true;
  }
  if (s.qgz_bits != 0) {
    z["zero_quantized_gradients"] = true;
    z["zero_quantized_gradients_bits"] = s.qgz_bits;
    if (c.nodes > 1 && c.gpus_per_node > 1) {
      z["zero_quantized_gradients_node_size"] = c.gpus_per_node;
    }
  }
  if (s.hsdp) {
    z["mics_shard_size"] = c.gpus_per_node;
  }
  return z;
}

} // namespace zero::tools
