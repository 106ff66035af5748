#pragma once
// The ZenFlow step zero's engine is to compute (docs/offload.md, "Selective"), single-process over the small
// model of engine_harness.hpp: the oracle its engine tests will hold it to. It fixes the rules where zero
// departs from DeepSpeed's code: the chosen columns' state moves with them (DeepSpeed zeroes their moments on
// the device), the device's update is clipped by the step's norm (DeepSpeed leaves it unclipped), and the host
// applies the mean of the gradients accumulated since its last update (DeepSpeed divides their sum by
// update_interval even for a window cut short by a selection).

#include "engine_harness.hpp"
#include "zero/optim/zenflow.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace zero::testing {

/// A ZenFlow run's keys: topk_ratio, the schedule (full_warm_up_rounds, update_interval, select interval) and
/// overlap_step.
struct zenflow_spec {
  double topk_ratio = 0.1;
  zenflow_schedule schedule{};
  bool overlap = false;
};

/// What `train_zenflow_reference` returns beside the run: per applied step, which elements were chosen (the
/// mask of each parameter) and whether the host applied its accumulated gradients.
struct zenflow_trace {
  std::vector<std::vector<std::vector<bool>>> chosen;
  std::vector<bool> host_applied;
};

/// ZenFlow over `s` (fp32 parameters; an overflow step applies nothing and counts no step), each applied step
/// m (from 0):
/// - in the warm-up (m < W): AdamW over every element with the step's gradient, clipped by its norm;
/// - at a selection (`zenflow_schedule::selects`): each 2-D weight's top max(1, floor(topk x cols)) columns by
///   the L1 norm of the step's gradient are chosen, every element of any other parameter is;
/// - chosen elements: AdamW with the step's gradient clipped by the step's norm, Adam's step t = m + 1;
/// - every element's gradient is added to the host's sum; at a host step (`zenflow_schedule::updates_host`)
///   the elements not chosen take AdamW with the mean of the sum over the steps since the host's last update,
///   clipped by that mean's norm over all elements, at t = m + 1, and the sum is emptied;
/// - with overlap_step, the gradients of the elements not chosen are taken at their values before the last host
///   step's update: a host step past the warm-up first makes the update of the host step before it visible, then
///   updates (the last one stays unseen until the run's parameters are read, which makes it visible); a selection
///   first makes the one still pending visible, so the columns move with every update landed.
inline run_result train_zenflow_reference(const run_spec& s, const zenflow_spec& z, zenflow_trace* trace = nullptr,
                                          lr_scheduler* sched = nullptr) {
  z.schedule.check();
  reference_state st;
  run_result out;
  const std::size_t n = st.model.size();
  std::vector<std::vector<bool>> chosen(n);
  std::vector<std::vector<float>> sum(n);
  for (std::size_t k = 0; k < n; ++k) {
    sum[k].assign(st.model[k].numel(), 0.0f);
  }
  std::int64_t summed = 0;
  std::int64_t m = 0;
  auto visible = st.master; // the parameters forward and backward see
  for (std::int64_t t = 0; t < s.steps; ++t) {
    std::vector<std::vector<float>> g;
    const double norm = std::sqrt(reference_grads(s, st.model, t, visible, g));
    out.norms.push_back(norm);
    out.applied.push_back(t != s.overflow_step);
    if (t == s.overflow_step) {
      continue;
    }
    const reference_adam adam(s, m + 1, sched);
    const float coef = reference_clip(s, norm);
    const bool warming = z.schedule.warming(m);
    if (!warming && z.schedule.selects(m)) {
      if (z.overlap) {
        visible = st.master; // the host update still pending (over the old choice) lands before the choice moves
      }
      for (std::size_t k = 0; k < n; ++k) {
        const auto& shape = st.model[k].shape;
        chosen[k].assign(st.model[k].numel(), shape.size() != 2);
        if (shape.size() == 2) {
          std::vector<float> sums(static_cast<std::size_t>(shape[1]), 0.0f);
          add_column_abs<float>(g[k], 0, shape[1], sums);
          for (const std::int64_t c : top_columns(sums, zenflow_column_count(z.topk_ratio, shape[1]))) {
            for (std::int64_t r = 0; r < shape[0]; ++r) {
              chosen[k][static_cast<std::size_t>(r * shape[1] + c)] = true;
            }
          }
        }
      }
    }
    for (std::size_t k = 0; k < n; ++k) {
      for (std::size_t i = 0; i < g[k].size(); ++i) {
        if (warming || chosen[k][i]) {
          adam.update(g[k][i] * coef, st.decay_of(s, k), st.master[k][i], st.m[k][i], st.v[k][i]);
        }
        if (!warming) {
          sum[k][i] += g[k][i];
        }
      }
    }
    summed += warming ? 0 : 1;
    const bool host = !warming && z.schedule.updates_host(m);
    if (host && z.overlap) {
      for (std::size_t k = 0; k < n; ++k) { // the update of the host step before reaches the device
        for (std::size_t i = 0; i < sum[k].size(); ++i) {
          if (!chosen[k][i]) {
            visible[k][i] = st.master[k][i];
          }
        }
      }
    }
    if (host) {
      double sq = 0;
      const float inverse = 1.0f / static_cast<float>(summed); // the engine's: a product by the reciprocal
      for (std::size_t k = 0; k < n; ++k) {
        for (float& x : sum[k]) {
          x *= inverse;
          sq += static_cast<double>(x) * x;
        }
      }
      const float host_coef = reference_clip(s, std::sqrt(sq));
      for (std::size_t k = 0; k < n; ++k) {
        for (std::size_t i = 0; i < sum[k].size(); ++i) {
          if (!chosen[k][i]) {
            adam.update(sum[k][i] * host_coef, st.decay_of(s, k), st.master[k][i], st.m[k][i], st.v[k][i]);
          }
          sum[k][i] = 0.0f;
        }
      }
      summed = 0;
    }
    for (std::size_t k = 0; k < n; ++k) { // what the device updated now (all of it without overlap_step)
      for (std::size_t i = 0; i < sum[k].size(); ++i) {
        if (!z.overlap || warming || chosen[k][i]) {
          visible[k][i] = st.master[k][i];
        }
      }
    }
    if (trace != nullptr) {
      trace->chosen.push_back(chosen);
      trace->host_applied.push_back(warming || host);
    }
    ++m;
  }
  out.params = st.master;
  return out;
}

} // namespace zero::testing
