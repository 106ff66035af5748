// grad_stats: the overflow flag and global L2 norm of a step's reduced gradients (summed over ranks
// when each holds only its slices), the in-place unscale, and the clip coefficient DeepSpeed applies.

#include "../support/recording_communicator.hpp"
#include "part_kit.hpp"
#include "zero/engine/grad_stats.hpp"
#include "zero/engine/schedule_from_config.hpp"

#include <cmath>
#include <cstddef>
#include <doctest/doctest.h>
#include <limits>
#include <vector>

namespace zero::testing::stats_spec {
namespace {

template <class Comm> using stats_t = grad_stats<cpu_backend, Comm, host_allocator>;

/// x (5 elements) and y (3), one segment each: 6 and 4 elements padded for 2 ranks.
flat_layout two_segments(int world, dtype type) {
  return make_layout({}, {{"x", 5}, {"y", 3}}, {.world = world, .type = type, .segment_elements = 1});
}

/// The reduced gradient at flat element `i` (padding: 0): a multiple of 1/2 in [-2, 2], exact in
/// every dtype, and so are its square and every sum of squares here.
float grad_at(const flat_layout& layout, std::size_t i) {
  for (std::size_t id = 0; id < layout.param_count(); ++id) {
    if (layout.param(id).range().contains(i)) {
      return static_cast<float>(static_cast<int>(i * 3 % 9) - 4) / 2;
    }
  }
  return 0.0f;
}

/// The sum of the squares of `grad_at` over the whole buffer, in double.
double sum_of_squares(const flat_layout& layout) {
  double s = 0;
  for (std::size_t i = 0; i < layout.total_size(); ++i) {
    s += static_cast<double>(grad_at(layout, i)) * grad_at(layout, i);
  }
  return s;
}

/// One rank's statistics over its reduced gradients in `G`: the rank's shard when `partitioned`, the
/// whole buffer otherwise (`scale` times `grad_at`).
template <class Comm, class G> struct rank_stats {
  const flat_layout& layout;
  bool partitioned;
  float scale;
  int rank;
  rank_kit kit;
  std::vector<G> grads;
  stats_t<Comm> stats;
  rank_stats(const flat_layout& l, Comm& comm, bool part, float times = 1)
      : layout(l), partitioned(part), scale(times), rank(comm.rank()), grads(part ? l.shard_size() : l.total_size()),
        stats(ranges(), dtype_v<G>, part, kit.backend, comm, kit.alloc, kit.stream) {
    for (const auto& [range, state] : ranges()) {
      for (std::size_t i = range.begin; i < range.end; ++i) {
        grads[state + (i - range.begin)] = from_float<G>(grad_at(layout, i) * scale);
      }
    }
  }
  /// The ranges the rank holds: its slices, or the whole buffer.
  [[nodiscard]] std::vector<std::pair<flat_range, std::size_t>> ranges() const {
    if (partitioned) {
      return owned_ranges(layout, rank);
    }
    return {{{0, layout.total_size()}, 0}};
  }
  grad_check check(double unscale) {
    return stats.check(unscale, [&](const flat_range&, std::size_t state) { return grads.data() + state; });
  }
  /// Checks that the gradients are `factor` times what the constructor wrote.
  void check_grads(float factor) const {
    for (const auto& [range, state] : ranges()) {
      for (std::size_t i = range.begin; i < range.end; ++i) {
        CHECK(to_float(grads[state + (i - range.begin)]) == grad_at(layout, i) * scale * factor);
      }
    }
  }
};

} // namespace

TEST_CASE_TEMPLATE("grad_stats: the norm of known gradients, summed over ranks when partitioned", G, float, f16, bf16) {
  const auto layout = two_segments(2, dtype_v<G>);
  const double s = sum_of_squares(layout);
  // x: -2, -1/2, 1, -2, -1/2; y: -2, -1/2, 1 (and padding 0).
  CHECK(s == 14.75);
  for (const bool partitioned : {true, false}) {
    CAPTURE(partitioned);
    std::vector<comm_record> records;
    run_recorded_ranks(2, records, [&](recording_communicator& comm) {
      // Unpartitioned, every rank holds (and reports the norm of) its own whole buffer: no sum.
      const float scale = partitioned ? 1.0f : static_cast<float>(comm.rank() + 1);
      rank_stats<recording_communicator, G> rs(layout, comm, partitioned, scale);
      const auto r = rs.check(1.0);
      CHECK_FALSE(r.overflow);
      CHECK(r.norm == std::sqrt(s) * scale);
      rs.check_grads(1.0f); // without a factor the gradients are only read
      // A factor: the gradients are multiplied in place and the norm is theirs.
      const auto half = rs.check(0.5);
      CHECK_FALSE(half.overflow);
      CHECK(half.norm == std::sqrt(s * 0.25) * scale);
      rs.check_grads(0.5f);
    });
    // Partitioned: the squared norms of the two ranges in one sum-all-reduce, and with a factor the
    // overflow flag in a max-all-reduce first. Unpartitioned: nothing.
    for (const auto& rec : records) {
      CHECK(rec.counts("all_reduce") == (partitioned ? std::vector<std::size_t>{2, 1, 2} : std::vector<std::size_t>{}));
    }
  }
}

TEST_CASE_TEMPLATE("grad_stats: an inf or NaN on one rank is an overflow on every rank, with or without a factor", G,
                   float, f16, bf16) {
  const auto layout = two_segments(2, dtype_v<G>);
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    for (const double unscale : {1.0, 0.5}) {
      CAPTURE(bad);
      CAPTURE(unscale);
      run_ranks(2, [&](thread_communicator& comm) {
        rank_stats<thread_communicator, G> rs(layout, comm, true);
        if (comm.rank() == 1) {
          rs.grads[3] = from_float<G>(bad); // y's slice of rank 1 (flat 8)
        }
        const auto r = rs.check(unscale);
        CHECK(r.overflow);
        CHECK(r.norm == std::numeric_limits<double>::infinity());
        // The next check, the bad value gone, is clean again.
        rs.grads[3] = from_float<G>(0.0f);
        CHECK_FALSE(rs.check(unscale).overflow);
      });
    }
  }
}

TEST_CASE("grad_stats: a range longer than one kernel chunk is normed through the workspace") {
  // 40000 elements: three chunks of cpu_backend's 16384, one partial sum each.
  const auto layout = make_layout({}, {{"big", 40000}}, {.world = 1});
  run_ranks(1, [&](thread_communicator& comm) {
    rank_stats<thread_communicator, float> rs(layout, comm, false);
    CHECK(rs.check(1.0).norm == std::sqrt(sum_of_squares(layout)));
    // The flag (4 bytes), one squared norm (4) and the workspace (3 partial sums) are its memory.
    CHECK(rs.kit.alloc.live(memory_tag::buffers) == 4 + 4 + 3 * 4);
  });
}

TEST_CASE("clip_coefficient: max_norm / (norm + 1e-6) when below 1, else 1; max_norm <= 0 does not clip") {
  CHECK(clip_coefficient(3.0, 0.0) == 1.0);
  CHECK(clip_coefficient(3.0, -1.0) == 1.0);
  CHECK(clip_coefficient(0.5, 1.0) == 1.0);
  CHECK(clip_coefficient(0.0, 1.0) == 1.0);
  CHECK(clip_coefficient(4.0, 1.0) == 1.0 / 4.000001);
  CHECK(clip_coefficient(4.0, 2.0) == 2.0 / 4.000001);
  // At the limit DeepSpeed's epsilon clips a little.
  CHECK(clip_coefficient(1.0, 1.0) == 1.0 / 1.000001);
  CHECK(clip_coefficient(1.0, 1.0) < 1.0);
  CHECK(clip_coefficient(std::numeric_limits<double>::infinity(), 1.0) == 0.0);
}

} // namespace zero::testing::stats_spec

namespace zero::testing::stats_spec {

TEST_CASE("norm_slots: each extent less the excluded ranges, cut to the rank's slice, laid out alike on every rank") {
  using ranges_t = std::vector<std::pair<flat_range, std::size_t>>;
  using pieces_t = std::vector<std::pair<std::size_t, std::size_t>>;
  // Unchanged: one slot per range over all of it.
  const auto whole = norm_slots::whole(ranges_t{{{0, 4}, 0}, {{10, 13}, 4}});
  CHECK(whole.first == std::vector<std::size_t>{0, 1, 2});
  CHECK(whole.piece == pieces_t{{0, 4}, {0, 3}});
  // Segment [0, 12) split over 2 ranks: rank 0 owns [0, 6), rank 1 [6, 12); [4, 8) is excluded. Both
  // ranks get the extent's two counted pieces, [0, 4) and [8, 12), each cut to their slice.
  const std::vector<flat_range> extent{{0, 12}};
  const auto r0 = norm_slots::without(ranges_t{{{0, 6}, 0}}, extent, {{4, 8}});
  const auto r1 = norm_slots::without(ranges_t{{{6, 12}, 0}}, extent, {{4, 8}});
  CHECK(r0.size() == r1.size());
  CHECK(r0.piece == pieces_t{{0, 4}, {0, 0}});
  CHECK(r1.piece == pieces_t{{0, 0}, {2, 4}});
  // Exclusions outside every extent change nothing; overlapping and unordered ones merge.
  CHECK(norm_slots::without(ranges_t{{{0, 6}, 0}}, {{0, 6}}, {{20, 30}}).piece == pieces_t{{0, 6}});
  CHECK(norm_slots::without(ranges_t{{{0, 10}, 0}}, {{0, 10}}, {{6, 8}, {1, 3}, {2, 4}}).piece ==
        pieces_t{{0, 1}, {4, 2}, {8, 2}});
  // A range wholly excluded has no slot.
  CHECK(norm_slots::without(ranges_t{{{0, 4}, 0}}, {{0, 4}}, {{0, 4}}).size() == 0);
  CHECK_THROWS_AS((void)norm_slots::without(ranges_t{{{0, 4}, 0}}, {}, {}), usage_error);
  CHECK_THROWS_WITH_AS((void)norm_slots::without(ranges_t{{{0, 8}, 0}}, {{0, 4}}, {}),
                       doctest::Contains("owned range 0 [0, 8) is not inside its extent [0, 4)"), usage_error);
}

TEST_CASE("grad_stats::count_only: the excluded elements leave the norm; combine takes one norm per slot") {
  run_ranks(1, [](thread_communicator& comm) {
    cpu_backend b({.threads = 1});
    auto s = b.make_stream();
    host_counting alloc{};
    std::vector<float> g{3.0f, 4.0f, 12.0f, 0.0f};
    const std::vector<std::pair<flat_range, std::size_t>> ranges{{{0, 4}, 0}};
    stats_t<thread_communicator> st(ranges, dtype::f32, false, b, comm, alloc, s);
    CHECK(st.check(1.0, [&](const flat_range&, std::size_t) { return g.data(); }).norm == 13.0);
    st.count_only(norm_slots::without(ranges, {{0, 4}}, {{2, 3}}), alloc); // 12 leaves the norm
    CHECK(st.slots().size() == 2);
    CHECK(st.check(1.0, [&](const flat_range&, std::size_t) { return g.data(); }).norm == 5.0);
    const std::vector<float> host_norms{9.0f, 16.0f};
    CHECK(st.combine(host_norms, false, false).norm == 5.0);
    CHECK_THROWS_AS((void)st.combine(std::vector<float>{25.0f}, false, false), usage_error);
    CHECK_THROWS_AS(st.count_only(norm_slots::whole({}), alloc), usage_error);
  });
}

} // namespace zero::testing::stats_spec
