// replicated_params: stages 0-2's parameters, whole on every rank. Sharded (stages 1-2), a rank
// updates only its slices and the step-end all-gathers (grouped up to allgather_elements) make every
// rank whole again; unsharded (stage 0), nothing moves.

#include "../support/recording_communicator.hpp"
#include "part_kit.hpp"
#include "zero/engine/residency/replicated_params.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <optional>
#include <string>
#include <vector>

namespace zero::testing::replicated_spec {
namespace {

template <class Comm> using replicated_t = replicated_params<cpu_backend, Comm, host_allocator>;

/// Five parameters, one segment each, in three modules: segments of 3, 3, 12, 2 and 2 elements
/// before padding (a: segments 0 and 1, b: 2, c: 3 and 4).
flat_layout five_segments(int world) {
  return make_layout({"a", "b", "c"}, {{"a.w", 3, 0}, {"a.b", 3, 0}, {"b.w", 12, 1}, {"c.w", 2, 2}, {"c.b", 2, 2}},
                     {.world = world, .segment_elements = 1});
}
const std::vector<std::vector<std::size_t>> module_segments = {{0, 1}, {2}, {3, 4}};
const std::vector<std::string> module_names = {"a", "b", "c"};

/// The parameters of one rank, over `comm`.
template <class Comm> struct rank_params {
  rank_kit kit;
  replicated_t<Comm> params;
  rank_params(const flat_layout& layout, Comm& comm, replicated_options opt)
      : params(layout, module_segments, module_names, kit.backend, comm, kit.alloc, kit.alloc, opt, kit.stream) {}

  /// Writes the rank's slices into the whole buffer, as its optimizer would.
  void write_mine(const flat_layout& layout, int rank) {
    write_own_slices(layout, rank, as<float>(params.store()), false);
  }
};

/// Gathers every module and checks each of its segments whole through `full`.
template <class Params> void check_every_module(const flat_layout& layout, Params& params) {
  for (int m = 0; m < 3; ++m) {
    params.gather(m);
    for (std::size_t s : module_segments[static_cast<std::size_t>(m)]) {
      check_whole(layout, s, params.full(s, module_names[static_cast<std::size_t>(m)]));
    }
    params.release(m);
  }
}

} // namespace

TEST_CASE("replicated_params: sharded, after_update of each segment brings every rank's slice to every rank") {
  for (const int world : {2, 3}) {
    CAPTURE(world);
    const auto layout = five_segments(world);
    std::vector<comm_record> records;
    run_recorded_ranks(world, records, [&](recording_communicator& comm) {
      rank_params<recording_communicator> rp(layout, comm, {.sharded = true});
      rp.write_mine(layout, comm.rank());
      for (std::size_t k = 0; k < 5; ++k) {
        rp.params.after_update(k, rp.kit.stream);
        CHECK(records[static_cast<std::size_t>(comm.rank())].posted.size() == k + 1);
      }
      check_every_module(layout, rp.params);
      CHECK(rp.params.gather_groups() == 5);
      CHECK(rp.params.staging_elements() == 0);
    });
    // One in-place all-gather per segment, of the rank's slice.
    std::vector<std::size_t> slices;
    for (const auto& s : layout.segments()) {
      slices.push_back(s.slice);
    }
    const std::vector<std::size_t> expected =
        world == 2 ? std::vector<std::size_t>{2, 2, 6, 1, 1} : std::vector<std::size_t>{1, 1, 4, 1, 1};
    CHECK(slices == expected);
    for (const auto& r : records) {
      CHECK(r.counts("all_gather") == expected);
      CHECK(r.posted.size() == 5);
    }
  }
}

TEST_CASE("replicated_params: allgather_elements groups consecutive segments up to the cap") {
  struct row {
    int world;
    std::optional<std::size_t> cap;
    std::vector<std::size_t> posts_after_update; // all-gathers posted so far, after each segment's update
    std::vector<std::size_t> counts;             // elements per rank of each all-gather
    std::size_t staging;                         // elements of the staging buffer
  };
  // Padded segment sizes: 4, 4, 12, 2, 2 (world 2); 3, 3, 12, 3, 3 (world 3).
  const std::vector<row> rows = {
      {2, std::nullopt, {1, 2, 3, 4, 5}, {2, 2, 6, 1, 1}, 0}, // unset: one all-gather per segment
      {2, 7, {1, 2, 3, 3, 4}, {2, 2, 6, 2}, 4},               // 4 + 4 > 7: not merged; 2 + 2 are
      {2, 8, {0, 1, 2, 2, 3}, {4, 6, 2}, 8},                  // 4 + 4 = 8 merged; 12 > 8 alone
      {2, 24, {0, 0, 0, 0, 1}, {12}, 24},                     // everything in one group
      {3, 8, {0, 1, 2, 2, 3}, {2, 4, 2}, 6},
  };
  for (const auto& r : rows) {
    const std::size_t cap = r.cap.value_or(0);
    CAPTURE(r.world);
    CAPTURE(cap);
    const auto layout = five_segments(r.world);
    std::vector<comm_record> records;
    run_recorded_ranks(r.world, records, [&](recording_communicator& comm) {
      const auto& rec = records[static_cast<std::size_t>(comm.rank())];
      rank_params<recording_communicator> rp(layout, comm, {.sharded = true, .allgather_elements = r.cap});
      CHECK(rp.params.gather_groups() == r.counts.size());
      CHECK(rp.params.staging_elements() == r.staging);
      // The staging buffer is the only memory besides the parameters.
      CHECK(rp.kit.alloc.live(memory_tag::buffers) == r.staging * sizeof(float));
      CHECK(rp.kit.alloc.live(memory_tag::params) == layout.total_size() * sizeof(float));
      rp.write_mine(layout, comm.rank());
      for (std::size_t k = 0; k < 5; ++k) {
        rp.params.after_update(k, rp.kit.stream);
        CHECK(rec.posted.size() == r.posts_after_update[k]);
      }
      check_every_module(layout, rp.params);
      CHECK(rec.counts("all_gather") == r.counts);
    });
  }
}

TEST_CASE("replicated_params: refresh posts every group's all-gather and finish waits for them") {
  const auto layout = five_segments(3);
  std::vector<comm_record> records;
  run_recorded_ranks(3, records, [&](recording_communicator& comm) {
    rank_params<recording_communicator> rp(layout, comm, {.sharded = true, .allgather_elements = 8});
    rp.write_mine(layout, comm.rank());
    rp.params.refresh();
    CHECK(records[static_cast<std::size_t>(comm.rank())].counts("all_gather") == std::vector<std::size_t>{2, 4, 2});
    rp.params.finish();
    for (std::size_t s = 0; s < 5; ++s) {
      check_whole(layout, s, rp.params.store() + layout.segments()[s].range.begin * sizeof(float));
    }
  });
}

TEST_CASE("replicated_params: release without a gather, and an unknown module, are refused by name") {
  const auto layout = five_segments(1);
  run_ranks(1, [&](thread_communicator& comm) {
    rank_params<thread_communicator> rp(layout, comm, {});
    CHECK_THROWS_WITH_AS(rp.params.release(1), doctest::Contains("release(\"b\") without a matching gather"),
                         usage_error);
    rp.params.gather(0);
    rp.params.gather(0);
    rp.params.release(0);
    rp.params.release(0);
    CHECK_THROWS_WITH_AS(rp.params.release(0), doctest::Contains("release(\"a\") without a matching gather"),
                         usage_error);
    CHECK_THROWS_WITH_AS(rp.params.gather(3),
                         doctest::Contains("gather: module id 3 was not made by add_module (3 modules are registered)"),
                         usage_error);
    CHECK_THROWS_WITH_AS(rp.params.release(-1), doctest::Contains("release: module id -1"), usage_error);
  });
}

TEST_CASE("replicated_params: release_everything(modifier) gives every rank the modifier's values") {
  const auto layout = five_segments(3);
  std::vector<comm_record> records;
  run_recorded_ranks(3, records, [&](recording_communicator& comm) {
    rank_params<recording_communicator> rp(layout, comm, {.sharded = true});
    float* p = as<float>(rp.params.store());
    for (std::size_t i = 0; i < layout.total_size(); ++i) {
      p[i] = slice_value(comm.rank(), i); // every rank writes everything, differently
    }
    rp.params.gather_everything();
    rp.params.release_everything(-1); // no modifier: each rank keeps its own values
    CHECK(p[5] == slice_value(comm.rank(), 5));
    rp.params.gather_everything();
    rp.params.release_everything(1);
    for (std::size_t i = 0; i < layout.total_size(); ++i) {
      CHECK(p[i] == slice_value(1, i));
    }
    const auto& rec = records[static_cast<std::size_t>(comm.rank())];
    CHECK(rec.counts("broadcast") == std::vector<std::size_t>{layout.total_size()});
    CHECK(rec.posted.size() == 1);
  });
}

TEST_CASE("replicated_params: unsharded (stage 0, or one rank) posts nothing and keeps each rank's values") {
  for (const auto& [w, s] : {std::pair{2, false}, std::pair{1, true}}) {
    const int world = w;
    const bool sharded = s; // a lambda below uses them
    CAPTURE(world);
    const auto layout = five_segments(world);
    std::vector<comm_record> records;
    run_recorded_ranks(world, records, [&](recording_communicator& comm) {
      rank_params<recording_communicator> rp(layout, comm, {.sharded = sharded, .allgather_elements = 8});
      float* p = as<float>(rp.params.store());
      for (std::size_t i = 0; i < layout.total_size(); ++i) {
        p[i] = slice_value(comm.rank(), i);
      }
      for (std::size_t k = 0; k < 5; ++k) {
        rp.params.after_update(k, rp.kit.stream);
      }
      rp.params.refresh();
      rp.params.gather(1);
      const float* b = as<float>(rp.params.full(2, "b.w"));
      rp.params.release(1);
      rp.params.finish();
      CHECK(b[0] == slice_value(comm.rank(), layout.segments()[2].range.begin));
      CHECK(p[layout.total_size() - 1] == slice_value(comm.rank(), layout.total_size() - 1));
      CHECK(rp.params.gather_groups() == 0);
      CHECK(rp.params.staging_elements() == 0);
      CHECK(rp.kit.alloc.live(memory_tag::buffers) == 0);
      CHECK(records[static_cast<std::size_t>(comm.rank())].posted.empty());
    });
  }
}

TEST_CASE("replicated_params: the store is the whole flat buffer, and full(s) points into it") {
  const auto layout = five_segments(2);
  run_ranks(2, [&](thread_communicator& comm) {
    rank_params<thread_communicator> rp(layout, comm, {.sharded = true});
    static_assert(!replicated_t<thread_communicator>::sharded_store);
    CHECK(rp.params.store_elements() == 24);
    CHECK(layout.total_size() == 24);
    for (std::size_t s = 0; s < 5; ++s) {
      CHECK(rp.params.full(s, "x") == rp.params.store() + layout.segments()[s].range.begin * sizeof(float));
    }
    // Zero-filled at construction (padding included).
    const float* p = as<float>(rp.params.store());
    for (std::size_t i = 0; i < 24; ++i) {
      CHECK(p[i] == 0.0f);
    }
    CHECK(rp.kit.alloc.live(memory_tag::params) == 24 * sizeof(float));
  });
}

} // namespace zero::testing::replicated_spec
