// param_coordinator: stage 3's parameters, a shard per rank between uses, each module's unit gathered
// whole on demand (or ahead of use, from the trace of the step before), persistent units whole always.

#include "../support/recording_communicator.hpp"
#include "part_kit.hpp"
#include "zero/engine/residency/param_coordinator.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace zero::testing::coordinator_spec {
namespace {

template <class Comm> using coordinator_t = param_coordinator<cpu_backend, Comm, host_allocator>;

/// Three modules and a persistent unit, one segment (unit) each: m0 (5 + 1 elements), m1 (10), m2 (7)
/// and "persist" (3). Padded for 2 ranks: 6, 10, 8 and 4 elements.
flat_layout four_units(int world) {
  return make_layout({"m0", "m1", "m2", "persist"},
                     {{"m0.w", 5, 0}, {"m0.b", 1, 0}, {"m1.w", 10, 1}, {"m2.w", 7, 2}, {"bias", 3, 3}},
                     {.world = world, .grouping = segment_by::module});
}

/// One rank's coordinator over `comm`; gathered units are counted in `work`, the shard in `kit.alloc`.
template <class Comm> struct rank_coordinator {
  const flat_layout& layout;
  int rank;
  rank_kit kit;
  host_counting work{};
  coordinator_t<Comm> c;
  rank_coordinator(const flat_layout& l, Comm& comm, coordinator_options opt = {})
      : layout(l), rank(comm.rank()),
        c(l, {{0}, {1}, {2}}, {3}, {"m0", "m1", "m2"}, kit.backend, comm, kit.alloc, work, opt, kit.stream) {}

  /// Writes the rank's slice of every unit (or of unit `only`) into its shard, as its optimizer would.
  void write_shard(float shift = 0, std::optional<std::size_t> only = std::nullopt) {
    write_own_slices(layout, rank, as<float>(c.shard()), true, shift, only);
  }
  /// Initialises the shard and makes the persistent unit whole.
  void init() {
    write_shard();
    c.refresh();
  }
  /// Gathers module `m`, checks that its unit holds every rank's slice (plus `shift`), releases it.
  void use(int m, float shift = 0) {
    c.gather(m);
    check_whole(layout, static_cast<std::size_t>(m), c.full(static_cast<std::size_t>(m), "unit"), shift);
    c.release(m);
  }
  /// One training micro-step that uses `order`'s modules one after the other.
  void step(const std::vector<int>& order, bool params_changed = false) {
    for (const int m : order) {
      use(m);
    }
    c.end_step(params_changed);
  }
};

} // namespace

TEST_CASE("param_coordinator: gather gives the whole unit with every rank's shard; release frees it") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const auto layout = four_units(world);
    std::vector<comm_record> records;
    run_recorded_ranks(world, records, [&](recording_communicator& comm) {
      rank_coordinator<recording_communicator> rc(layout, comm);
      static_assert(coordinator_t<recording_communicator>::sharded_store);
      CHECK(rc.c.store() == rc.c.shard());
      CHECK(rc.c.store_elements() == layout.shard_size());
      // The shard and the persistent unit's whole copy are the state; nothing is gathered yet.
      CHECK(rc.kit.alloc.live(memory_tag::params) ==
            (layout.shard_size() + layout.segments()[3].range.size()) * sizeof(float));
      CHECK(rc.work.live(memory_tag::params) == 0);
      rc.init();
      CHECK(rc.c.persistent(3));
      check_whole(layout, 3, rc.c.full(3, "bias")); // persistent: whole without a gather
      for (int m = 0; m < 3; ++m) {
        const auto u = static_cast<std::size_t>(m);
        CHECK_FALSE(rc.c.persistent(u));
        rc.c.gather(m);
        CHECK(rc.c.gathered(m));
        check_whole(layout, u, rc.c.full(u, "unit"));
        CHECK(rc.c.live_elements() == layout.segments()[u].range.size());
        CHECK(rc.work.live(memory_tag::params) == layout.segments()[u].range.size() * sizeof(float));
        rc.c.release(m);
        CHECK_FALSE(rc.c.gathered(m));
        CHECK(rc.c.live_elements() == 0);
        CHECK(rc.work.live(memory_tag::params) == 0);
      }
      rc.c.end_step(false);
      // One all-gather of the rank's slice per unit: the persistent one at refresh, then m0, m1, m2.
      std::vector<std::size_t> slices;
      for (const std::size_t u : {3, 0, 1, 2}) {
        slices.push_back(layout.segments()[u].slice);
      }
      CHECK(records[static_cast<std::size_t>(comm.rank())].counts("all_gather") == slices);
    });
  }
}

TEST_CASE("param_coordinator: a shard updated before the next gather is what that gather brings in") {
  const auto layout = four_units(2);
  run_ranks(2, [&](thread_communicator& comm) {
    rank_coordinator<thread_communicator> rc(layout, comm);
    rc.init();
    rc.step({0, 1, 2});
    // The optimizer rewrites the slices of m1 and of the persistent unit on its own stream.
    const cpu_stream update{};
    rc.write_shard(0.5f, 1);
    rc.c.after_update(1, update);
    rc.write_shard(0.5f, 3);
    rc.c.after_update(3, update);
    rc.use(0); // prefetches m1 and m2 from the trace: after the update
    rc.use(1, 0.5f);
    rc.use(2);
    check_whole(layout, 3, rc.c.full(3, "bias")); // not refreshed yet: the old values
    rc.c.end_step(true);                          // the parameters changed: refresh the persistent units
    check_whole(layout, 3, rc.c.full(3, "bias"), 0.5f);
    CHECK(rc.c.stats().persistent_refreshes == 1); // counted in the step it prepares
  });
}

TEST_CASE("param_coordinator: misuse is refused, naming the parameter or module") {
  const auto layout = four_units(2);
  run_ranks(2, [&](thread_communicator& comm) {
    rank_coordinator<thread_communicator> rc(layout, comm);
    rc.init();
    CHECK_THROWS_WITH_AS((void)rc.c.full(1, "parameter \"m1.w\""),
                         doctest::Contains("parameter \"m1.w\" is not gathered: call gather(module)"), usage_error);
    CHECK_THROWS_WITH_AS(rc.c.release(2), doctest::Contains("release(\"m2\") without a matching gather"), usage_error);
    CHECK_THROWS_WITH_AS(rc.c.gather(3), doctest::Contains("gather: module id 3 was not registered (3 modules)"),
                         usage_error);
    rc.c.gather(0);
    CHECK_THROWS_WITH_AS(rc.c.end_step(false), doctest::Contains("step() while module \"m0\" is still gathered"),
                         usage_error);
    rc.c.release(0);
    CHECK_THROWS_WITH_AS((void)rc.c.full(0, "m0.w"), doctest::Contains("m0.w is not gathered"), usage_error);
    rc.c.end_step(false);
  });
}

TEST_CASE("param_coordinator: the second identical step prefetches from the first step's trace") {
  const auto layout = four_units(2);
  run_ranks(2, [&](thread_communicator& comm) {
    rank_coordinator<thread_communicator> rc(layout, comm);
    std::vector<std::string> log;
    rc.c.set_log([&](const std::string& line) { log.push_back(line); });
    rc.init();
    CHECK(rc.c.trace().empty());

    rc.step({0, 1, 2});
    CHECK(rc.c.trace() == std::vector<int>{0, 1, 2});
    auto s = rc.c.stats_of_last_step();
    CHECK(s.all_gathers == 3);
    CHECK(s.on_demand == 3);
    CHECK(s.prefetched == 0);
    CHECK(s.persistent_refreshes == 1); // the refresh before the first gather

    // gather(m0) waits for m0 and starts m1 and m2 ahead of use.
    rc.c.gather(0);
    CHECK(rc.c.stats().prefetched == 2);
    CHECK(rc.c.live_elements() == 6 + 10 + 8);
    check_whole(layout, 0, rc.c.full(0, "m0"));
    rc.c.release(0);
    rc.use(1);
    rc.use(2);
    rc.c.end_step(false);
    s = rc.c.stats_of_last_step();
    CHECK(s.all_gathers == 3);
    CHECK(s.on_demand == 1);
    CHECK(s.prefetched == 2);
    CHECK(s.prefetch_used == 2);
    CHECK(s.prefetch_wasted == 0);
    CHECK(s.trace_changes == 0);
    CHECK(s.persistent_refreshes == 0);
    CHECK(rc.c.peak_live_elements() == 24);
    CHECK(log.empty());

    // Another order: prefetching stops where it leaves the trace, and the trace is recorded again.
    rc.step({0, 2, 1});
    s = rc.c.stats_of_last_step();
    CHECK(s.trace_changes == 1);
    CHECK(s.prefetched == 2);
    CHECK(s.prefetch_used == 2);
    CHECK(rc.c.trace() == std::vector<int>{0, 2, 1});
    REQUIRE(log.size() == 1);
    CHECK(log[0].find("module order changed at gather #1 (training, micro-step 0 of the accumulation): expected "
                      "\"m1\", got \"m2\"") != std::string::npos);

    // A step that ends early: what was prefetched for it is freed unused.
    rc.step({0});
    s = rc.c.stats_of_last_step();
    CHECK(s.prefetched == 2);
    CHECK(s.prefetch_wasted == 2);
    CHECK(s.trace_changes == 1);
    CHECK(rc.c.trace() == std::vector<int>{0});
  });
}

TEST_CASE("param_coordinator: prefetch and max-live limits bound what is gathered ahead") {
  struct row {
    coordinator_options opt;
    std::size_t on_demand;
    std::size_t prefetched;
    std::size_t peak_live;
  };
  // Units of 6, 10 and 8 elements (2 ranks); the second step, in the first step's order.
  const std::vector<row> rows = {
      {{}, 1, 2, 24},
      {{.prefetch_elements = 9}, 2, 1, 18},  // m1 (10) is too big to fetch ahead; m2 (8) is not
      {{.prefetch_elements = 10}, 1, 2, 18}, // m1 just fits ahead of m0; m2 ahead of m1
      {{.max_live_elements = 16}, 2, 1, 16}, // m0 + m1 fill the limit; m2 waits for m0's release
      {{.prefetch_elements = 0}, 3, 0, 10},  // overlap_comm off
  };
  const auto layout = four_units(2);
  for (const auto& r : rows) {
    CAPTURE(r.on_demand);
    CAPTURE(r.peak_live);
    run_ranks(2, [&](thread_communicator& comm) {
      rank_coordinator<thread_communicator> rc(layout, comm, r.opt);
      rc.init();
      rc.step({0, 1, 2});
      rc.step({0, 1, 2});
      const auto& s = rc.c.stats_of_last_step();
      CHECK(s.on_demand == r.on_demand);
      CHECK(s.prefetched == r.prefetched);
      CHECK(s.prefetch_used == r.prefetched);
      CHECK(s.all_gathers == 3);
      CHECK(rc.c.peak_live_elements() == r.peak_live);
    });
  }
}

TEST_CASE("param_coordinator: a released unit the trace uses again within max_reuse_distance stays gathered") {
  struct row {
    std::size_t reuse_distance;
    std::size_t all_gathers, prefetched, reused;
  };
  // The order m0, m1, m0: between the two uses of m0 lie m1's 10 elements.
  const std::vector<row> rows = {
      {10, 2, 1, 1}, // m0 is kept over m1 and found gathered
      {9, 3, 2, 0},  // m0 is freed, then fetched again ahead of its second use
  };
  const auto layout = four_units(2);
  for (const auto& r : rows) {
    CAPTURE(r.reuse_distance);
    run_ranks(2, [&](thread_communicator& comm) {
      rank_coordinator<thread_communicator> rc(layout, comm, {.max_reuse_distance = r.reuse_distance});
      rc.init();
      rc.step({0, 1, 0});
      rc.step({0, 1, 0});
      const auto& s = rc.c.stats_of_last_step();
      CHECK(s.all_gathers == r.all_gathers);
      CHECK(s.on_demand == 1);
      CHECK(s.prefetched == r.prefetched);
      CHECK(s.reused == r.reused);
    });
  }
}

TEST_CASE("param_coordinator: stage3_max_live_parameters below a module, or below what is held, is refused") {
  const auto layout = four_units(2);
  run_ranks(2, [&](thread_communicator& comm) {
    CHECK_THROWS_WITH_AS(rank_coordinator<thread_communicator>(layout, comm, {.max_live_elements = 9}),
                         doctest::Contains("zero_optimization.stage3_max_live_parameters: 9 elements cannot hold a "
                                           "module of 10 elements"),
                         config_error);
    // 12 holds the largest module (10), but not m0 (6) and m1 together.
    rank_coordinator<thread_communicator> rc(layout, comm, {.max_live_elements = 12});
    rc.init();
    rc.c.gather(0);
    CHECK_THROWS_WITH_AS(rc.c.gather(1),
                         doctest::Contains("gathering module \"m1\" (10 elements) would hold 16 elements at once, "
                                           "above zero_optimization.stage3_max_live_parameters = 12"),
                         usage_error);
    rc.c.release(0);
    rc.use(1);
    rc.c.end_step(false);
  });
}

TEST_CASE("param_coordinator: release_everything(modifier) writes the modifier's whole values into every shard") {
  const auto layout = four_units(3);
  run_ranks(3, [&](thread_communicator& comm) {
    rank_coordinator<thread_communicator> rc(layout, comm);
    rc.init();
    rc.c.gather_everything();
    for (std::size_t u = 0; u < 4; ++u) {
      float* whole = as<float>(rc.c.full(u, "unit"));
      const auto& seg = layout.segments()[u];
      for (std::size_t i = seg.range.begin; i < seg.range.end; ++i) {
        whole[i - seg.range.begin] = slice_value(comm.rank(), i); // each rank writes everything, differently
      }
    }
    rc.c.release_everything(2);
    CHECK(rc.c.live_elements() == 0);
    // The rank's shard holds rank 2's values at the rank's own slices.
    const float* shard = as<float>(rc.c.shard());
    for (const auto& seg : layout.segments()) {
      const auto mine = seg.slice_of(comm.rank());
      for (std::size_t i = mine.begin; i < mine.end; ++i) {
        CHECK(shard[seg.shard_offset + (i - mine.begin)] == slice_value(2, i));
      }
    }
  });
}

} // namespace zero::testing::coordinator_spec
