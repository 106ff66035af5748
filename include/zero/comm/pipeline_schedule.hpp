#pragma once
/// \file
/// The 1F1B pipeline schedule (PipeDream-Flush, as DeepSpeed's `TrainSchedule` and Megatron's
/// non-interleaved schedule run it): which micro-batch each pipeline stage runs forward or backward
/// when, and the sends and receives of activations and their gradients between neighbouring stages.
///
/// Stage s of p, with m micro-batches:
///
///     warm-up    min(p - s - 1, m) forwards
///     steady     the remaining forwards, each followed by the backward of the oldest micro-batch
///     cool-down  the backwards left
///
/// so stage s holds the activations of at most min(p - s, m) micro-batches at once, where running
/// every forward first (GPipe) holds m. A stage after the first receives each micro-batch's input
/// from the stage before it ahead of its forward; a stage before the last sends its output after the
/// forward, receives the output's gradient ahead of the backward, and a stage after the first sends
/// the input's gradient after it. With sends that do not wait for their receive (every communicator's
/// `send` returns a handle), running each stage's list in order cannot deadlock
/// (`simulate_pipeline` checks it).
///
/// With a forward taking f and a backward b on every stage, a step takes (m + p - 1)(f + b): each
/// stage idles (p - 1)(f + b) of it, the bubble, a share (p - 1) / (m + p - 1) of the step.
/// `simulate_pipeline` computes it from the lists, so a schedule is checked against the formula.

#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zero {

/// What a stage does in one entry of its schedule.
enum class pipe_op : std::uint8_t {
  recv_activation, ///< receive the micro-batch's input from stage - 1
  forward,
  send_activation, ///< send the micro-batch's output to stage + 1
  recv_gradient,   ///< receive the gradient of the micro-batch's output from stage + 1
  backward,
  send_gradient, ///< send the gradient of the micro-batch's input to stage - 1
};

/// One entry: the operation, its micro-batch, and the stage it sends to or receives from (-1 for
/// forward and backward).
struct pipe_step {
  pipe_op op;
  int micro_batch;
  int peer;
  friend bool operator==(const pipe_step&, const pipe_step&) = default;
};

/// The 1F1B schedule of stage `stage` of `stages` for `micro_batches` micro-batches (file comment).
/// \throws usage_error for fewer than 1 stage or micro-batch, or a stage outside [0, stages).
[[nodiscard]] inline std::vector<pipe_step> one_f_one_b(int stages, int stage, int micro_batches) {
  if (stages < 1 || micro_batches < 1 || stage < 0 || stage >= stages) {
    throw usage_error("one_f_one_b: stage " + std::to_string(stage) + " of " + std::to_string(stages) + " with " +
                      std::to_string(micro_batches) +
                      " micro-batches; expected 1 or more stages and micro-batches "
                      "and a stage in [0, stages)");
  }
  const bool first = stage == 0;
  const bool last = stage == stages - 1;
  std::vector<pipe_step> out;
  auto fwd = [&](int mb) {
    if (!first) {
      out.push_back({pipe_op::recv_activation, mb, stage - 1});
    }
    out.push_back({pipe_op::forward, mb, -1});
    if (!last) {
      out.push_back({pipe_op::send_activation, mb, stage + 1});
    }
  };
  auto bwd = [&](int mb) {
    if (!last) {
      out.push_back({pipe_op::recv_gradient, mb, stage + 1});
    }
    out.push_back({pipe_op::backward, mb, -1});
    if (!first) {
      out.push_back({pipe_op::send_gradient, mb, stage - 1});
    }
  };
  const int warmup = std::min(stages - stage - 1, micro_batches);
  for (int mb = 0; mb < warmup; ++mb) {
    fwd(mb);
  }
  for (int mb = warmup; mb < micro_batches; ++mb) {
    fwd(mb);
    bwd(mb - warmup);
  }
  for (int mb = micro_batches - warmup; mb < micro_batches; ++mb) {
    bwd(mb);
  }
  return out;
}

/// What `simulate_pipeline` found: the step's length, and per stage its busy time and the most
/// micro-batches whose activations it held at once.
struct pipeline_timing {
  double makespan = 0;
  std::vector<double> busy;
  std::vector<int> most_in_flight;
  /// The share of the step the stages idle, averaged over stages.
  [[nodiscard]] double bubble() const {
    double idle = 0;
    for (const double b : busy) {
      idle += makespan - b;
    }
    return busy.empty() || makespan <= 0 ? 0 : idle / (makespan * static_cast<double>(busy.size()));
  }
};

/// Runs the stages' schedules (`schedules[s]` for stage s) against each other with forwards taking
/// `forward` and backwards `backward` time units, sends taking none and never waiting, and each
/// receive waiting for its send. \throws usage_error naming the stage and entry where the schedules
/// deadlock or disagree (a receive without its send, an entry for a stage that does not exist, a
/// backward before its forward).
[[nodiscard]] inline pipeline_timing simulate_pipeline(const std::vector<std::vector<pipe_step>>& schedules,
                                                       double forward, double backward) {
  const std::size_t p = schedules.size();
  pipeline_timing t;
  t.busy.assign(p, 0);
  t.most_in_flight.assign(p, 0);
  std::vector<std::size_t> next(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<int> in_flight(p, 0);
  // sent[s][kind][mb]: when stage s sent micro-batch mb's activation (kind 0) or gradient (kind 1).
  std::vector<std::vector<std::vector<double>>> sent(p, std::vector<std::vector<double>>(2));
  auto when_sent = [&](std::size_t from, int kind, int mb) -> const double* {
    const auto& v = sent[from][static_cast<std::size_t>(kind)];
    return static_cast<std::size_t>(mb) < v.size() && v[static_cast<std::size_t>(mb)] >= 0
               ? &v[static_cast<std::size_t>(mb)]
               : nullptr;
  };
  auto where = [&](std::size_t s) { return "stage " + std::to_string(s) + ", entry " + std::to_string(next[s]); };
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t s = 0; s < p; ++s) {
      while (next[s] < schedules[s].size()) {
        const pipe_step& e = schedules[s][next[s]];
        const bool is_send = e.op == pipe_op::send_activation || e.op == pipe_op::send_gradient;
        const bool is_recv = e.op == pipe_op::recv_activation || e.op == pipe_op::recv_gradient;
        if ((is_send || is_recv) && (e.peer < 0 || static_cast<std::size_t>(e.peer) >= p)) {
          throw usage_error("simulate_pipeline: " + where(s) + " names stage " + std::to_string(e.peer) + " of " +
                            std::to_string(p));
        }
        if (e.micro_batch < 0) {
          throw usage_error("simulate_pipeline: " + where(s) + " has micro-batch " + std::to_string(e.micro_batch));
        }
        const int kind = e.op == pipe_op::send_activation || e.op == pipe_op::recv_activation ? 0 : 1;
        if (is_recv) {
          const double* at = when_sent(static_cast<std::size_t>(e.peer), kind, e.micro_batch);
          if (at == nullptr) {
            break; // waits for the send
          }
          clock[s] = std::max(clock[s], *at);
        } else if (is_send) {
          auto& v = sent[s][static_cast<std::size_t>(kind)];
          if (v.size() <= static_cast<std::size_t>(e.micro_batch)) {
            v.resize(static_cast<std::size_t>(e.micro_batch) + 1, -1);
          }
          v[static_cast<std::size_t>(e.micro_batch)] = clock[s];
        } else {
          const double d = e.op == pipe_op::forward ? forward : backward;
          clock[s] += d;
          t.busy[s] += d;
          in_flight[s] += e.op == pipe_op::forward ? 1 : -1;
          if (in_flight[s] < 0) {
            throw usage_error("simulate_pipeline: " + where(s) + " runs a backward with no forward before it");
          }
          t.most_in_flight[s] = std::max(t.most_in_flight[s], in_flight[s]);
        }
        ++next[s];
        progress = true;
      }
    }
  }
  std::string stuck;
  for (std::size_t s = 0; s < p; ++s) {
    if (next[s] < schedules[s].size()) {
      const pipe_step& e = schedules[s][next[s]];
      stuck += (stuck.empty() ? "" : "; ") + where(s) + " waits forever for micro-batch " +
               std::to_string(e.micro_batch) + " from stage " + std::to_string(e.peer);
    }
    t.makespan = std::max(t.makespan, clock[s]);
  }
  if (!stuck.empty()) {
    throw usage_error("simulate_pipeline: " + stuck +
                      " (a receive without its send: the schedules deadlock or disagree)");
  }
  return t;
}

/// The 1F1B bubble's share of a step: (p - 1) / (m + p - 1).
[[nodiscard]] inline double one_f_one_b_bubble(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

} // namespace zero
