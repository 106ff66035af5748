// bucket_reducer: gradients from the framework's backward to the rank that owns them, bucket (segment)
// by bucket, launched last segment first on every rank.

#include "../support/recording_communicator.hpp"
#include "part_kit.hpp"
#include "zero/engine/gradients/bucket_reducer.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <initializer_list>
#include <string>
#include <vector>

namespace zero::testing::reducer_spec {
namespace {

template <class Comm> using reducer_t = bucket_reducer<cpu_backend, Comm, host_allocator>;

/// Three parameters of 5, 3 and 1 elements, one segment each: 6, 4 and 2 elements padded for 2 ranks.
flat_layout three_buckets(int world) {
  return make_layout({}, {{"g0", 5}, {"g1", 3}, {"g2", 1}}, {.world = world, .segment_elements = 1});
}

/// What rank `rank` adds to element `j` of parameter `id`'s gradient at micro-step `t`: multiples of
/// 1/4, so the average over 2 or 4 ranks is exact.
float grad_value(int rank, std::size_t id, std::size_t j, int t) {
  return 0.25f * static_cast<float>((rank + 1) * static_cast<int>(j + 1 + 4 * id)) + 0.5f * static_cast<float>(t);
}

/// The reduced gradient of flat element `i`: the average over ranks of what micro-steps `steps` added
/// (0 for padding), computed in double.
double expected_at(const flat_layout& layout, std::size_t i, int world, std::initializer_list<int> steps) {
  for (std::size_t id = 0; id < layout.param_count(); ++id) {
    const auto& p = layout.param(id);
    if (p.range().contains(i)) {
      double sum = 0;
      for (int r = 0; r < world; ++r) {
        for (const int t : steps) {
          sum += grad_value(r, id, i - p.offset, t);
        }
      }
      return sum / world;
    }
  }
  return 0;
}

/// One rank's reducer over `comm`.
template <class Comm> struct rank_reducer {
  const flat_layout& layout;
  int rank;
  rank_kit kit;
  reducer_t<Comm> r;
  rank_reducer(const flat_layout& l, Comm& comm, reducer_options opt)
      : layout(l), rank(comm.rank()), r(l, kit.backend, comm, kit.alloc, kit.alloc, opt, kit.stream) {}

  /// Accumulates micro-step `t`'s gradient of parameter `id` (`+=`, as autograd does).
  void write(std::size_t id, int t) {
    float* g = static_cast<float*>(r.grad(id));
    for (std::size_t j = 0; j < layout.param(id).numel; ++j) {
      g[j] += grad_value(rank, id, j, t);
    }
  }
  /// Writes and marks ready the parameters in `order`, one after the other.
  void backward(std::initializer_list<std::size_t> order, int t) {
    for (const std::size_t id : order) {
      write(id, t);
      r.ready(id);
    }
  }
  /// Checks the reduced gradients this rank holds (the whole buffer, or its slices) against
  /// `expected_at` of micro-steps `steps`.
  void check_reduced(reduce_mode mode, std::initializer_list<int> steps) {
    const int world = layout.world_size();
    if (mode == reduce_mode::all_reduce) {
      const float* g = as<float>(r.reduced({0, layout.total_size()}, 0));
      for (std::size_t i = 0; i < layout.total_size(); ++i) {
        CHECK(g[i] == expected_at(layout, i, world, steps));
      }
      return;
    }
    for (const auto& [mine, state] : owned_ranges(layout, rank)) {
      const float* g = as<float>(r.reduced(mine, state));
      for (std::size_t i = mine.begin; i < mine.end; ++i) {
        CHECK(g[i - mine.begin] == expected_at(layout, i, world, steps));
      }
    }
  }
};

constexpr reduce_mode both_modes[] = {reduce_mode::all_reduce, reduce_mode::reduce_scatter};

} // namespace

TEST_CASE("bucket_reducer: all_reduce mode averages the whole gradient; reduce_scatter the rank's own slices") {
  for (const auto mode : both_modes) {
    for (const int world : {2, 4}) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(world);
      const auto layout = three_buckets(world);
      run_ranks(world, [&](thread_communicator& comm) {
        rank_reducer<thread_communicator> rr(layout, comm, {.mode = mode});
        // Stages 0-1 keep the whole gradient for good; stage 2 only the rank's shard, from its first
        // reduction until the step is over.
        const bool whole = mode == reduce_mode::all_reduce;
        CHECK(rr.kit.alloc.live(memory_tag::grads) == (whole ? layout.total_size() * sizeof(float) : 0));
        rr.backward({2, 1, 0}, 0);
        rr.r.finish(false);
        rr.check_reduced(mode, {0});
        CHECK(rr.kit.alloc.live(memory_tag::grads) ==
              (whole ? layout.total_size() : layout.shard_size()) * sizeof(float));
        CHECK(rr.r.launches() == 3);
        CHECK(rr.r.staging_buffers() == (whole ? 0 : 1));
        rr.r.zero();
        CHECK(rr.kit.alloc.live(memory_tag::grads) == (whole ? layout.total_size() * sizeof(float) : 0));
      });
    }
  }
}

TEST_CASE("bucket_reducer: buckets launch last segment first, whatever order gradients are ready in") {
  const auto layout = three_buckets(2);
  struct row {
    std::vector<std::size_t> ready;
    std::vector<std::size_t> launched; // launches after each ready
  };
  const std::vector<row> rows = {
      {{0, 1, 2}, {0, 0, 3}}, // nothing launches before segment 2, then everything
      {{1, 2, 0}, {0, 2, 3}},
      {{2, 1, 0}, {1, 2, 3}},
  };
  for (const auto mode : both_modes) {
    for (const auto& row : rows) {
      CAPTURE(static_cast<int>(mode));
      CAPTURE(row.launched[0]);
      std::vector<comm_record> records;
      run_recorded_ranks(2, records, [&](recording_communicator& comm) {
        rank_reducer<recording_communicator> rr(layout, comm, {.mode = mode});
        std::vector<std::size_t> launched;
        for (const std::size_t id : row.ready) {
          rr.write(id, 0);
          rr.r.ready(id);
          launched.push_back(rr.r.launches());
        }
        CHECK(launched == row.launched);
        rr.r.finish(false);
        rr.check_reduced(mode, {0});
      });
      // Segments 2, 1, 0: all-reduces of 2, 4 and 6 elements, or reduce-scatters of slices of 1, 2, 3.
      for (const auto& rec : records) {
        if (mode == reduce_mode::all_reduce) {
          CHECK(rec.counts("all_reduce") == std::vector<std::size_t>{2, 4, 6});
        } else {
          CHECK(rec.counts("reduce_scatter") == std::vector<std::size_t>{1, 2, 3});
        }
        CHECK(rec.posted.size() == 3);
      }
    }
  }
}

TEST_CASE("bucket_reducer: micro-steps accumulate; all_reduce mode communicates only at the boundary") {
  const auto layout = three_buckets(2);
  for (const auto mode : both_modes) {
    CAPTURE(static_cast<int>(mode));
    std::vector<comm_record> records;
    run_recorded_ranks(2, records, [&](recording_communicator& comm) {
      const auto& rec = records[static_cast<std::size_t>(comm.rank())];
      rank_reducer<recording_communicator> rr(layout, comm, {.mode = mode});
      rr.r.begin_micro_step(false);
      rr.backward({2, 1, 0}, 0);
      rr.r.finish(false);
      // Stage 2 reduces every micro-step (it keeps no whole gradient); stages 0-1 wait for the boundary.
      CHECK(rec.posted.size() == (mode == reduce_mode::all_reduce ? 0 : 3));
      rr.r.begin_micro_step(true);
      rr.backward({2, 1, 0}, 1);
      rr.r.finish(false);
      CHECK(rec.posted.size() == (mode == reduce_mode::all_reduce ? 3 : 6));
      rr.check_reduced(mode, {0, 1});
    });
  }
}

TEST_CASE("bucket_reducer: the gradient shard grows slice by slice during backward and goes back after the update "
          "that read it") {
  const auto layout = three_buckets(2);
  run_ranks(2, [&](thread_communicator& comm) {
    // Without overlap each bucket's reduction completes as it launches, so what is held is exact.
    rank_reducer<thread_communicator> rr(layout, comm, {.mode = reduce_mode::reduce_scatter, .overlap = false});
    const auto& segs = layout.segments();
    auto slice_bytes = [&](std::size_t k) { return segs[k].slice * sizeof(float); };
    auto update = rr.kit.backend.make_stream(); // where an optimizer step reads the slices
    for (int t : {0, 1}) {
      CAPTURE(t);
      rr.r.begin_micro_step(true);
      rr.backward({2}, t); // segment 2 is reduced first: only its slice is held
      CHECK(rr.kit.alloc.live(memory_tag::grads) == slice_bytes(2));
      rr.backward({1, 0}, t);
      rr.r.finish(false);
      // Each step's gradients alone: a slice from the step before was never added in.
      rr.check_reduced(reduce_mode::reduce_scatter, {t});
      CHECK(rr.kit.alloc.live(memory_tag::grads) == layout.shard_size() * sizeof(float));
      // The update runs on a stream of its own: the slices stay until it is joined.
      rr.r.retire(update);
      CHECK(rr.kit.alloc.live(memory_tag::grads) == layout.shard_size() * sizeof(float));
      if (t == 0) {
        rr.r.release(1); // the engine's stream waited for segment 1's update (its all-gather)
        CHECK(rr.kit.alloc.live(memory_tag::grads) == slice_bytes(0) + slice_bytes(2));
        rr.r.release(1);        // once only
        rr.r.release_retired(); // the whole update joined
        CHECK(rr.kit.alloc.live(memory_tag::grads) == 0);
      }
      // t == 1: nothing said the update was joined; the next reduction waits for it and starts afresh.
    }
    rr.r.begin_micro_step(true);
    rr.backward({2, 1, 0}, 2);
    rr.r.finish(false);
    rr.check_reduced(reduce_mode::reduce_scatter, {2});
    rr.r.zero(); // on the reducer's own stream: back at once
    CHECK(rr.kit.alloc.live(memory_tag::grads) == 0);
  });
}

TEST_CASE("bucket_reducer: finish(false) names a missing gradient and its rank, and the micro-step stays open") {
  const auto layout = three_buckets(2);
  for (const auto mode : both_modes) {
    CAPTURE(static_cast<int>(mode));
    run_ranks(2, [&](thread_communicator& comm) {
      rank_reducer<thread_communicator> rr(layout, comm, {.mode = mode});
      rr.backward({2, 0}, 0);
      const std::string missing =
          "1 parameter(s) received no gradient in this micro-step (\"g1\" at rank " + std::to_string(comm.rank()) + ")";
      CHECK_THROWS_WITH_AS(rr.r.finish(false), doctest::Contains(missing.c_str()), usage_error);
      rr.backward({1}, 0);
      rr.r.finish(false);
      rr.check_reduced(mode, {0});
      // finish(true) counts a missing gradient as zero.
      rr.r.zero();
      rr.r.begin_micro_step(true);
      rr.backward({2, 0}, 0);
      rr.r.finish(true);
      if (mode == reduce_mode::all_reduce) {
        const float* g = as<float>(rr.r.reduced({0, layout.total_size()}, 0));
        CHECK(g[layout.param(1).offset] == 0.0f);
        CHECK(g[layout.param(0).offset] == expected_at(layout, layout.param(0).offset, 2, {0}));
      } else {
        // g1 (flat 6..9) lies in segment 1: rank 0 holds g1[0..2), rank 1 g1[2] and padding.
        const float* g = as<float>(rr.r.reduced(layout.segments()[1].slice_of(comm.rank()), 3));
        CHECK(g[0] == 0.0f);
        CHECK(g[1] == 0.0f);
      }
    });
  }
}

TEST_CASE("bucket_reducer: misuse of grad and grad_ready is refused, naming the parameter") {
  const auto layout = three_buckets(1);
  run_ranks(1, [&](thread_communicator& comm) {
    rank_reducer<thread_communicator> rr(layout, comm, {.mode = reduce_mode::reduce_scatter});
    rr.backward({2}, 0);
    CHECK_THROWS_WITH_AS((void)rr.r.grad(2), doctest::Contains("grad(\"g2\") after grad_ready in the same micro-step"),
                         usage_error);
    CHECK_THROWS_WITH_AS(rr.r.ready(2), doctest::Contains("grad_ready(\"g2\") called twice in one micro-step"),
                         usage_error);
    rr.backward({1, 0}, 0);
    rr.r.finish(false);
    CHECK_THROWS_WITH_AS((void)rr.r.grad(0), doctest::Contains("grad(\"g0\") between micro-steps"), usage_error);
    CHECK_THROWS_WITH_AS(rr.r.ready(1), doctest::Contains("grad_ready(\"g1\") between micro-steps"), usage_error);
    rr.r.begin_micro_step(true);
    rr.backward({2, 1, 0}, 0);
    rr.r.finish(false);
  });
  // A layout for another world size.
  const auto two = three_buckets(2);
  run_ranks(1, [&](thread_communicator& comm) {
    rank_kit kit;
    CHECK_THROWS_WITH_AS(reducer_t<thread_communicator>(two, kit.backend, comm, kit.alloc, kit.alloc, {}, kit.stream),
                         doctest::Contains("the communicator has 1 ranks but the layout was finalized for 2"),
                         usage_error);
  });
}

TEST_CASE("bucket_reducer: staging_buffers counts the reduce-scatter pool, which backward order keeps at one") {
  const auto layout = three_buckets(2);
  for (const bool overlap : {true, false}) {
    CAPTURE(overlap);
    run_ranks(2, [&](thread_communicator& comm) {
      rank_reducer<thread_communicator> rr(layout, comm, {.mode = reduce_mode::reduce_scatter, .overlap = overlap});
      CHECK(rr.r.staging_buffers() == 0);
      // Backward order, each gradient ready before the next is asked for: a bucket in flight is
      // completed to free its buffer for the next.
      rr.backward({2, 1, 0}, 0);
      rr.r.finish(false);
      CHECK(rr.r.staging_buffers() == 1);
      // Every gradient asked for before any is ready: one buffer per segment, each of the largest
      // segment's bytes (6 elements).
      rr.r.begin_micro_step(true);
      for (const std::size_t id : {0, 1, 2}) {
        rr.write(id, 1);
      }
      for (const std::size_t id : {0, 1, 2}) {
        rr.r.ready(id);
      }
      rr.r.finish(false);
      CHECK(rr.r.staging_buffers() == 3);
      CHECK(rr.kit.alloc.live(memory_tag::buffers) == 3 * 6 * sizeof(float));
      rr.check_reduced(reduce_mode::reduce_scatter, {0, 1});
    });
  }
}

} // namespace zero::testing::reducer_spec

namespace zero::testing::reducer_spec {

TEST_CASE("bucket_reducer: streamed, each reduced slice goes to the sink once, last segment first, with no "
          "gradient shard and two staging buffers") {
  const auto layout = three_buckets(2);
  for (const bool overlap : {true, false}) {
    CAPTURE(overlap);
    run_ranks(2, [&](thread_communicator& comm) {
      rank_reducer<thread_communicator> rr(layout, comm,
                                           {.mode = reduce_mode::reduce_scatter, .overlap = overlap, .streamed = true});
      CHECK(rr.kit.alloc.live(memory_tag::grads) == 0);
      const auto owned = owned_ranges(layout, rr.rank);
      std::vector<std::size_t> order;
      std::vector<std::vector<float>> got(owned.size());
      cpu_event landed;
      rr.r.stream_to([&](std::size_t segment, std::byte* slice) -> const cpu_event& {
        order.push_back(segment);
        const float* g = as<float>(slice);
        got[segment].assign(g, g + owned[segment].first.size());
        return landed;
      });
      for (int t : {0, 1}) {
        order.clear();
        rr.r.begin_micro_step(t == 1);
        rr.backward({2, 1, 0}, t);
        rr.r.finish(false);
        CHECK(order == std::vector<std::size_t>{2, 1, 0});
        // Each micro-step's slice alone: the sink accumulates, the reducer does not.
        for (std::size_t k = 0; k < owned.size(); ++k) {
          const auto& mine = owned[k].first;
          for (std::size_t i = mine.begin; i < mine.end; ++i) {
            CHECK(got[k][i - mine.begin] == expected_at(layout, i, 2, {t}));
          }
        }
      }
      CHECK(rr.r.reduced(owned[0].first, owned[0].second) == nullptr);
      CHECK(rr.r.staging_buffers() == (overlap ? 2 : 1));
      CHECK(rr.kit.alloc.live(memory_tag::grads) == 0);
    });
  }
}

TEST_CASE("bucket_reducer: a streamed reducer needs reduce_scatter and a sink") {
  const auto layout = three_buckets(2);
  run_ranks(2, [&](thread_communicator& comm) {
    rank_kit kit;
    CHECK_THROWS_WITH_AS(reducer_t<thread_communicator>(layout, kit.backend, comm, kit.alloc, kit.alloc,
                                                        {.mode = reduce_mode::all_reduce, .streamed = true},
                                                        kit.stream),
                         doctest::Contains("need reduce_mode::reduce_scatter"), usage_error);
    rank_reducer<thread_communicator> rr(layout, comm,
                                         {.mode = reduce_mode::reduce_scatter, .overlap = false, .streamed = true});
    rr.write(2, 0);
    CHECK_THROWS_WITH_AS(rr.r.ready(2), doctest::Contains("before stream_to gave it a sink"), usage_error);
  });
}

} // namespace zero::testing::reducer_spec
