// The ZenFlow oracle (zenflow_reference.hpp) against the exact one where ZenFlow must be exact (every column
// chosen, the host updating every step, a warm-up as long as the run), and its choice and timing worked by hand
// where it is not.

#include "engine_harness.hpp"
#include "zenflow_reference.hpp"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <vector>

using zero::zenflow_schedule;
using zero::testing::run_spec;
using zero::testing::train_reference;
using zero::testing::train_zenflow_reference;
using zero::testing::zenflow_spec;
using zero::testing::zenflow_trace;

TEST_CASE("ZenFlow's oracle is the exact one with every column chosen, the host every step, or a whole warm-up") {
  for (const double clip : {0.0, 1.0}) {
    CAPTURE(clip);
    const run_spec s{.clip = clip, .steps = 9, .param_coupling = 0.25f};
    const auto exact = train_reference(s);
    const zenflow_spec cases[] = {
        {.topk_ratio = 1.0, .schedule = {.warmup = 0, .update_interval = 4, .select_interval = 4}},
        {.topk_ratio = 1.0, .schedule = {.warmup = 2, .update_interval = 3, .select_interval = 0}},
        {.topk_ratio = 0.1, .schedule = {.warmup = 0, .update_interval = 1, .select_interval = 3}},
        {.topk_ratio = 0.3, .schedule = {.warmup = 1, .update_interval = 1, .select_interval = 0}},
        {.topk_ratio = 0.1, .schedule = {.warmup = 9, .update_interval = 4, .select_interval = 0}},
    };
    for (const auto& z : cases) {
      CAPTURE(z.topk_ratio);
      CAPTURE(z.schedule.warmup);
      CAPTURE(z.schedule.update_interval);
      CHECK(train_zenflow_reference(s, z).params == exact.params);
    }
    // Not exact: a tenth of the columns on the device, the rest every 4 steps.
    const auto zen = train_zenflow_reference(
        s, {.topk_ratio = 0.1, .schedule = {.warmup = 1, .update_interval = 4, .select_interval = 0}});
    CHECK(zero::testing::max_rel_diff(zen.params, exact.params) > 1e-3);
  }
}

TEST_CASE("ZenFlow's oracle: the chosen columns by gradient norm, updated every step; the rest only at host steps") {
  const run_spec s{.steps = 8, .param_coupling = 0.25f};
  const zenflow_spec z{.topk_ratio = 0.2, .schedule = {.warmup = 1, .update_interval = 3, .select_interval = 0}};
  zenflow_trace trace;
  static_cast<void>(train_zenflow_reference(s, z, &trace));
  // Host steps: the warm-up's step 0, then (m + 1 - 1) a multiple of 3: steps 3 and 6.
  CHECK(trace.host_applied == std::vector<bool>{true, false, false, true, false, false, true, false});
  // fc1.weight is [37, 11]: max(1, floor(0.2 x 11)) = 2 columns, chosen at step 1 from that step's gradient
  // (the column sums of |g| over the 37 rows, computed here apart from the oracle), the same in every row.
  const auto model = zero::testing::small_model();
  zero::testing::reference_state st;
  std::vector<std::vector<float>> g0, g1;
  static_cast<void>(zero::testing::reference_grads(s, model, 0, st.master, g0));
  // The parameters after step 0 (the warm-up's exact step) are the exact oracle's after one step.
  const auto after0 = train_reference(run_spec{.steps = 1, .param_coupling = 0.25f});
  static_cast<void>(zero::testing::reference_grads(s, model, 1, after0.params, g1));
  std::vector<double> col(11, 0.0);
  for (std::size_t r = 0; r < 37; ++r) {
    for (std::size_t c = 0; c < 11; ++c) {
      col[c] += std::fabs(g1[0][r * 11 + c]);
    }
  }
  std::vector<int> top;
  for (int pick = 0; pick < 2; ++pick) {
    int best = -1;
    for (int c = 0; c < 11; ++c) {
      const bool taken = std::find(top.begin(), top.end(), c) != top.end();
      if (!taken && (best < 0 || col[static_cast<std::size_t>(c)] > col[static_cast<std::size_t>(best)])) {
        best = c;
      }
    }
    top.push_back(best);
  }
  const auto& fc1 = trace.chosen[1][0];
  for (std::size_t r = 0; r < 37; ++r) {
    for (int c = 0; c < 11; ++c) {
      const bool want = std::find(top.begin(), top.end(), c) != top.end();
      CHECK(fc1[r * 11 + static_cast<std::size_t>(c)] == want);
    }
  }
  // Biases and the 1-D embedding: every element chosen. The warm-up chose nothing.
  for (std::size_t k : {1u, 3u, 4u}) {
    CHECK(std::all_of(trace.chosen[1][k].begin(), trace.chosen[1][k].end(), [](bool b) { return b; }));
  }
  CHECK(trace.chosen[0][0].empty());
  // Selected once: the same columns at every later step.
  for (std::size_t m = 2; m < 8; ++m) {
    CHECK(trace.chosen[m] == trace.chosen[1]);
  }
  // An element not chosen keeps its value between host steps: after step 3 (a host step) it equals itself after
  // step 4 and step 5, and changes at step 6.
  const auto at = [&](std::int64_t steps) {
    auto t = s;
    t.steps = steps;
    return train_zenflow_reference(t, z).params;
  };
  const std::size_t unchosen = top[0] == 0 || top[1] == 0 ? (top[0] == 1 || top[1] == 1 ? 2 : 1) : 0;
  const auto p4 = at(4), p5 = at(5), p6 = at(6), p7 = at(7);
  CHECK(p5[0][unchosen] == p4[0][unchosen]);
  CHECK(p6[0][unchosen] == p4[0][unchosen]);
  CHECK(p7[0][unchosen] != p6[0][unchosen]);
  // A chosen element changes every step.
  const auto chosen_at = static_cast<std::size_t>(top[0]);
  CHECK(p5[0][chosen_at] != p4[0][chosen_at]);
  CHECK(p6[0][chosen_at] != p5[0][chosen_at]);
}
