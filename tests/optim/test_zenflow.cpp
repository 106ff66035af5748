// ZenFlow's schedule and column choice (zero/optim/zenflow.hpp), with values worked by hand.

#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/optim/zenflow.hpp"

#include <cmath>
#include <cstdint>
#include <doctest/doctest.h>
#include <limits>
#include <vector>

using zero::zenflow_schedule;

namespace {

/// The steps in [0, n) for which `pred` holds.
template <class Pred> std::vector<std::int64_t> steps_where(std::int64_t n, Pred pred) {
  std::vector<std::int64_t> out;
  for (std::int64_t m = 0; m < n; ++m) {
    if (pred(m)) {
      out.push_back(m);
    }
  }
  return out;
}

using steps = std::vector<std::int64_t>;

} // namespace

TEST_CASE("zenflow_schedule: DeepSpeed's select and update steps, worked by hand") {
  // W 2, U 3, select once: the warm-up's two steps update on the host; the columns are chosen at step 2; the
  // host applies at steps 4, 7, 10 ((m + 1 - 2) a multiple of 3).
  const zenflow_schedule once{.warmup = 2, .update_interval = 3, .select_interval = 0};
  CHECK(steps_where(12, [&](auto m) { return once.warming(m); }) == steps{0, 1});
  CHECK(steps_where(12, [&](auto m) { return once.selects(m); }) == steps{2});
  CHECK(steps_where(12, [&](auto m) { return once.updates_host(m); }) == steps{0, 1, 4, 7, 10});
  // W 0, U 4, S 10: chosen at 0, 10 and 20; the host applies every 4th step (3, 7, 11, ...) and at the step
  // before each selection (9, 19), the interval counted from step 0 throughout.
  const zenflow_schedule every{.warmup = 0, .update_interval = 4, .select_interval = 10};
  CHECK(steps_where(21, [&](auto m) { return every.selects(m); }) == steps{0, 10, 20});
  CHECK(steps_where(21, [&](auto m) { return every.updates_host(m); }) == steps{3, 7, 9, 11, 15, 19});
  // U 1: every step is the host's; with W 3 and S 5, the selections are 3 (the warm-up's end), 5 and 10.
  const zenflow_schedule each{.warmup = 3, .update_interval = 1, .select_interval = 5};
  CHECK(steps_where(8, [&](auto m) { return each.updates_host(m); }) == steps{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(steps_where(12, [&](auto m) { return each.selects(m); }) == steps{3, 5, 10});
  // A selection inside the warm-up is not one (step 0 with W 3 is not a multiple of S after W).
  CHECK_FALSE(each.selects(0));

  CHECK_NOTHROW(every.check());
  CHECK_THROWS_AS((zenflow_schedule{.warmup = 0, .update_interval = 0}.check()), zero::usage_error);
  CHECK_THROWS_AS((zenflow_schedule{.warmup = -1}.check()), zero::usage_error);
  CHECK_THROWS_AS((zenflow_schedule{.select_interval = -2}.check()), zero::usage_error);
}

TEST_CASE("add_column_abs: a [3, 4] weight split across two ranks inside a row sums to the whole columns") {
  // g[i] = i - 6, row-major [3, 4]: column c holds |c - 6|, |c - 2|, |c + 2|: sums 10, 9, 8, 9.
  std::vector<float> g(12);
  for (int i = 0; i < 12; ++i) {
    g[static_cast<std::size_t>(i)] = static_cast<float>(i - 6);
  }
  std::vector<float> rank0(4, 0.0f), rank1(4, 0.0f), whole(4, 0.0f);
  // Rank 0 holds elements [0, 5): a row and one element of the next; rank 1 the other 7.
  zero::add_column_abs<float>(std::span<const float>(g).subspan(0, 5), 0, 4, rank0);
  zero::add_column_abs<float>(std::span<const float>(g).subspan(5), 5, 4, rank1);
  CHECK(rank0 == std::vector<float>{8, 5, 4, 3});
  CHECK(rank1 == std::vector<float>{2, 4, 4, 6});
  zero::add_column_abs<float>(g, 0, 4, whole);
  CHECK(whole == std::vector<float>{10, 9, 8, 9});
  for (std::size_t c = 0; c < 4; ++c) {
    CHECK(rank0[c] + rank1[c] == whole[c]); // what the ranks' all-reduce of their sums gives
  }
  // bf16 gradients read as their float values.
  const std::vector<zero::bf16> h = {zero::bf16(-1.5f), zero::bf16(2.0f), zero::bf16(0.25f), zero::bf16(-3.0f)};
  std::vector<float> two(2, 0.0f);
  zero::add_column_abs<zero::bf16>(h, 0, 2, two);
  CHECK(two == std::vector<float>{1.75f, 5.0f});

  std::vector<float> wrong(3, 0.0f);
  CHECK_THROWS_AS(zero::add_column_abs<float>(g, 0, 4, wrong), zero::usage_error);
  CHECK_THROWS_AS(zero::add_column_abs<float>(g, -1, 4, whole), zero::usage_error);
}

TEST_CASE("zenflow_column_count and top_columns: the k largest, ascending, ties to the lower index") {
  CHECK(zero::zenflow_column_count(0.05, 768) == 38);
  CHECK(zero::zenflow_column_count(0.1, 4) == 1); // floor(0.4), at least one
  CHECK(zero::zenflow_column_count(0.0, 4) == 1);
  CHECK(zero::zenflow_column_count(1.0, 4) == 4);
  CHECK_THROWS_AS(static_cast<void>(zero::zenflow_column_count(1.5, 4)), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zero::zenflow_column_count(0.1, 0)), zero::usage_error);

  const std::vector<float> sums = {10, 9, 8, 9};
  CHECK(zero::top_columns(sums, 2) == steps{0, 1}); // 9 and 9: column 1 before column 3
  CHECK(zero::top_columns(sums, 3) == steps{0, 1, 3});
  CHECK(zero::top_columns(sums, 4) == steps{0, 1, 2, 3});
  CHECK(zero::top_columns(sums, 0).empty());
  const std::vector<float> overflowed = {1, std::numeric_limits<float>::quiet_NaN(), 5};
  CHECK(zero::top_columns(overflowed, 1) == steps{1});
  CHECK_THROWS_AS(static_cast<void>(zero::top_columns(sums, 5)), zero::usage_error);
}

TEST_CASE("column_elements: the offsets of the chosen columns in a rank's part, in element order") {
  const steps chosen = {0, 1};
  // The [3, 4] weight above: rank 0's [0, 5) holds columns 0, 1 at 0, 1 and 4; rank 1's [5, 12) at 5, 8, 9.
  CHECK(zero::column_elements(chosen, 4, 0, 5) == steps{0, 1, 4});
  CHECK(zero::column_elements(chosen, 4, 5, 7) == steps{0, 3, 4});
  CHECK(zero::column_elements(chosen, 4, 0, 12) == steps{0, 1, 4, 5, 8, 9});
  // A part inside one row, and one past the chosen columns of its row.
  CHECK(zero::column_elements(steps{2}, 4, 1, 2) == steps{1});
  CHECK(zero::column_elements(steps{0}, 4, 1, 2).empty());
  CHECK(zero::column_elements(steps{}, 4, 0, 12).empty());
  // Every column: every element.
  CHECK(zero::column_elements(steps{0, 1, 2, 3}, 4, 3, 4) == steps{0, 1, 2, 3});
  CHECK_THROWS_AS(static_cast<void>(zero::column_elements(steps{1, 0}, 4, 0, 4)), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(zero::column_elements(steps{4}, 4, 0, 4)), zero::usage_error);
}
