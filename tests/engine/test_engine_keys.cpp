// DeepSpeed keys that change how the engine communicates or saves, and give the same bits:
// overlap_comm, allgather_bucket_size, and stage3_gather_16bit_weights_on_model_save.

#include "../support/recording_communicator.hpp"
#include "engine_harness.hpp"

#include <algorithm>
#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace {

using zero::testing::comm_record;
using zero::testing::model_handles;
using zero::testing::run_spec;

/// What rank 0 saw in the second of two training steps of the small model (the first records stage 3's
/// trace): after each `grad_ready`, the reductions still in flight; after each forward `gather`, the
/// all-gathers in flight; and stage 3's gathering counters of that step.
struct observed {
  std::vector<int> reductions_after_ready;
  std::vector<int> gathers_after_gather;
  zero::gather_stats stats;
};

observed observe_second_step(const run_spec& s) {
  std::vector<comm_record> records;
  observed out;
  zero::testing::with_engine_group<zero::cpu_backend>(
      s, [&](int world, auto&& fn) { zero::testing::run_recorded_ranks(world, records, fn); },
      [](auto&) { return zero::cpu_backend({.threads = 1}); },
      [&](auto& eng, const model_handles& mh, auto& comm) {
        zero::testing::init_model(eng);
        const auto model = zero::testing::small_model();
        const auto& rec = records[static_cast<std::size_t>(comm.rank())];
        const bool watch = comm.rank() == 0;
        auto in_flight = [&](const char* kind) {
          const auto it = rec.in_flight.find(kind);
          return it == rec.in_flight.end() ? 0 : it->second;
        };
        for (int step = 0; step < 2; ++step) {
          for (const int m : mh.modules) {
            auto on = eng.gather(m);
            if (watch && step == 1) {
              out.gathers_after_gather.push_back(in_flight("all_gather"));
            }
          }
          for (std::size_t k = model.size(); k-- > 0;) {
            auto on = eng.gather(mh.modules[static_cast<std::size_t>(model[k].module)]);
            auto g = eng.grad(mh.params[k]);
            float* gp = g.template as<float>();
            for (std::size_t i = 0; i < g.numel; ++i) {
              gp[i] += static_cast<float>((i + k) % 5) / 64.0f;
            }
            eng.grad_ready(mh.params[k]);
            if (watch && step == 1) {
              out.reductions_after_ready.push_back(in_flight("reduce_scatter") + in_flight("all_reduce"));
            }
          }
          CHECK(eng.step().applied);
        }
        if (watch && eng.coordinator() != nullptr) {
          out.stats = eng.coordinator()->stats_of_last_step();
        }
      });
  return out;
}

/// Three steps of the small model on 4 ranks.
run_spec four_ranks(int stage, zero::dtype type) {
  run_spec s;
  s.stage = stage;
  s.world = 4;
  s.type = type;
  s.steps = 3;
  return s;
}

int max_of(const std::vector<int>& v) {
  int m = 0;
  for (const int x : v) {
    m = std::max(m, x);
  }
  return m;
}

} // namespace

TEST_CASE("overlap_comm false: every bucket is reduced before grad_ready returns, and stage 3 does not prefetch") {
  for (const int stage : {2, 3}) {
    CAPTURE(stage);
    run_spec s;
    s.stage = stage;
    s.world = 4;
    s.batch = 8;
    s.zero_extra = R"("overlap_comm": false)";
    const auto off = observe_second_step(s);
    REQUIRE(off.reductions_after_ready.size() == zero::testing::small_model().size());
    CHECK(max_of(off.reductions_after_ready) == 0);
    s.zero_extra = R"("overlap_comm": true)";
    const auto on = observe_second_step(s);
    // The control: with overlap a bucket is still reducing when grad_ready returns.
    CHECK(max_of(on.reductions_after_ready) >= 1);
    if (stage == 3) {
      CHECK(off.stats.prefetched == 0);
      CHECK(off.stats.on_demand > 0);
      CHECK(max_of(off.gathers_after_gather) == 0);
      CHECK(on.stats.prefetched > 0);
      CHECK(max_of(on.gathers_after_gather) >= 1);
    }
  }
}

TEST_CASE("overlap_comm false trains to the same bits as overlap_comm true at stages 1, 2, 3") {
  for (const int stage : {1, 2, 3}) {
    for (const auto type : {zero::dtype::bf16, zero::dtype::f32}) {
      CAPTURE(stage);
      CAPTURE(type);
      auto s = four_ranks(stage, type);
      s.accumulation = 2;
      s.zero_extra = R"("overlap_comm": true)";
      const auto a = zero::testing::train_with_engine(s);
      s.zero_extra = R"("overlap_comm": false)";
      const auto b = zero::testing::train_with_engine(s);
      CHECK(a.params == b.params);
      CHECK(a.norms == b.norms);
    }
  }
}

namespace {

/// The per-rank element counts of the step-end all-gathers `layout` gets with allgather_bucket_size
/// `cap`: consecutive segments grouped while their elements of all ranks fit.
std::vector<std::size_t> expected_gathers(const zero::flat_layout& layout, std::size_t cap) {
  std::vector<std::size_t> out;
  std::size_t elements = 0;
  for (std::size_t s = 0; s < layout.segments().size(); ++s) {
    const auto& seg = layout.segments()[s];
    if (s == 0 || elements + seg.range.size() > cap) {
      out.push_back(0);
      elements = 0;
    }
    out.back() += seg.slice;
    elements += seg.range.size();
  }
  return out;
}

} // namespace

TEST_CASE("allgather_bucket_size groups the stage 1-2 parameter all-gathers, with the same bits") {
  for (const int stage : {1, 2}) {
    for (const auto type : {zero::dtype::bf16, zero::dtype::f32}) {
      CAPTURE(stage);
      CAPTURE(type);
      auto s = four_ranks(stage, type);
      // On 4 ranks the segments hold 512, 256, 256 and 512 elements in fp32 (768 + 768), five of 512
      // in bf16 (1024 + 1024 + 512).
      s.allgather_bucket = type == zero::dtype::f32 ? 768 : 1024;
      std::vector<comm_record> records;
      std::vector<std::size_t> segments, expected;
      zero::testing::run_result grouped;
      grouped.applied_by_rank.resize(4);
      zero::testing::with_engine_group<zero::cpu_backend>(
          s, [&](int world, auto&& fn) { zero::testing::run_recorded_ranks(world, records, fn); },
          [](auto&) { return zero::cpu_backend({.threads = 1}); },
          [&](auto& eng, const model_handles& mh, auto& comm) {
            zero::testing::init_model(eng); // all-gathers once
            zero::testing::train_steps(eng, mh, comm, s, 0, 1, grouped);
            if (comm.rank() == 0) {
              for (const auto& seg : eng.layout().segments()) {
                segments.push_back(seg.slice);
              }
              expected = expected_gathers(eng.layout(), static_cast<std::size_t>(s.allgather_bucket));
            }
            zero::testing::train_steps(eng, mh, comm, s, 1, s.steps, grouped);
            zero::testing::collect_params(eng, mh, comm, grouped);
          });
      // Two groups of several segments (the second reuses the staging buffer of the first) at least.
      CHECK(segments.size() - expected.size() >= 2);
      CHECK(std::count_if(expected.begin(), expected.end(), [&](std::size_t n) { return n > segments[0]; }) >= 2);
      // init_params, then the end of each of the 3 steps: one all-gather per group, none per segment.
      std::vector<std::size_t> want;
      for (int k = 0; k < 1 + s.steps; ++k) {
        want.insert(want.end(), expected.begin(), expected.end());
      }
      for (const auto& rec : records) {
        CHECK(rec.counts("all_gather") == want);
      }
      // The same training with every segment gathered alone, in place (0), gives the same bits.
      s.allgather_bucket = 0;
      const auto alone = zero::testing::train_with_engine(s);
      CHECK(grouped.params == alone.params);
      CHECK(grouped.norms == alone.norms);
    }
  }
}
