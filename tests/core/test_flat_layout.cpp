#include "zero/core/flat_layout.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <doctest/doctest.h>
#include <random>
#include <vector>

using zero::dtype;
using zero::flat_layout;
using zero::layout_options;
using zero::segment_by;

namespace {
/// Checks every invariant of a finalized layout against a brute-force owner map.
void check_invariants(const flat_layout& l) {
  const int n = l.world_size();
  const std::size_t total = l.total_size();
  REQUIRE(total % static_cast<std::size_t>(n) == 0);
  REQUIRE(l.shard_size() * static_cast<std::size_t>(n) == total);
  std::vector<int> owner(total, -1);
  std::vector<int> in_shard(total, 0);
  std::size_t bad = 0; // per-element checks are counted, then asserted once
  // Shards tile the buffer: every element is in exactly one rank's slices.
  for (int r = 0; r < n; ++r) {
    std::size_t shard_pos = 0;
    for (const auto& range : l.shard_ranges(r)) {
      for (std::size_t i = range.begin; i < range.end; ++i) {
        ++in_shard[i];
        owner[i] = r;
        const auto [o, local] = l.owner(i);
        bad += o != r || local != shard_pos + (i - range.begin);
      }
      shard_pos += range.size();
    }
    REQUIRE(shard_pos == l.shard_size());
  }
  REQUIRE(std::all_of(in_shard.begin(), in_shard.end(), [](int c) { return c == 1; }));
  // Segments are contiguous, padded to world * alignment, with a tail below world * alignment.
  const std::size_t unit = l.alignment() * static_cast<std::size_t>(n);
  std::size_t pos = 0;
  for (const auto& s : l.segments()) {
    REQUIRE(s.range.begin == pos);
    REQUIRE(s.range.size() % unit == 0);
    REQUIRE(s.range.size() - s.used < unit);
    pos = s.range.end;
  }
  REQUIRE(pos == total);
  // Parameters: aligned, inside their segment, disjoint; pieces cover each parameter exactly once.
  std::vector<int> covered(total, 0);
  for (std::size_t id = 0; id < l.param_count(); ++id) {
    const auto& p = l.param(id);
    REQUIRE(p.offset % l.alignment() == 0);
    const auto& s = l.segments()[p.segment];
    REQUIRE(p.offset >= s.range.begin);
    REQUIRE(p.offset + p.numel <= s.range.begin + s.used);
    std::size_t seen = 0;
    for (int r = 0; r < n; ++r) {
      if (auto piece = l.intersection(id, r)) {
        REQUIRE(piece->flat_offset == p.offset + piece->param_offset);
        for (std::size_t k = 0; k < piece->count; ++k) {
          bad += owner[piece->flat_offset + k] != r;
          bad += l.owner(piece->flat_offset + k).second != piece->shard_offset + k;
          ++covered[piece->flat_offset + k];
        }
        seen += piece->count;
      }
    }
    REQUIRE(seen == p.numel);
  }
  REQUIRE(std::all_of(covered.begin(), covered.end(), [](int c) { return c <= 1; }));
  REQUIRE(bad == 0);
}
} // namespace

TEST_CASE("flat_layout: a single segment is docs/design.md's contiguous shard") {
  flat_layout l(dtype::f32);
  l.add("a", {3, 5}, dtype::f32);
  l.add("b", {7}, dtype::f32);
  l.finalize({.world_size = 4, .alignment_bytes = 16});
  // a: 15 elements at 0; b aligned to 4 -> 16..23; total padded to 4*4=16 -> 32.
  CHECK(l.param(0).offset == 0);
  CHECK(l.param(1).offset == 16);
  CHECK(l.total_size() == 32);
  CHECK(l.shard_size() == 8);
  CHECK(l.segments().size() == 1);
  CHECK(l.shard_ranges(2) == std::vector<zero::flat_range>{{16, 24}});
  // b straddles ranks 2 (16..23) only; a straddles ranks 0 and 1.
  auto piece = l.intersection(0, 1);
  REQUIRE(piece);
  CHECK(piece->param_offset == 8);
  CHECK(piece->count == 7);
  CHECK_FALSE(l.intersection(1, 3));
  CHECK(l.padding() == 32 - 22);
  check_invariants(l);
}

TEST_CASE("flat_layout: buckets of at most B bytes and module segments") {
  flat_layout l(dtype::bf16);
  const int m0 = l.add_module("m0");
  const int m1 = l.add_module("m1");
  l.add("w0", {64, 64}, dtype::bf16, m0);
  l.add("w1", {64, 64}, dtype::bf16, m1);
  l.add("b0", {64}, dtype::bf16, m0);
  l.add("b1", {64}, dtype::bf16, m1);
  SUBCASE("by bucket") {
    l.finalize({.world_size = 2, .alignment_bytes = 256, .grouping = segment_by::bucket, .segment_bytes = 8192 + 128});
    // 4096 bf16 = 8192 bytes per weight: w0 alone, w1 + ... exceeds, so w0 | w1 | b0 b1.
    REQUIRE(l.segments().size() == 3);
    for (const auto& s : l.segments()) {
      std::size_t bytes = 0;
      for (std::size_t k = s.first_param; k < s.last_param; ++k) {
        bytes += l.param(l.flat_order()[k]).numel * 2;
      }
      CHECK(bytes <= 8192 + 128);
    }
    check_invariants(l);
    // Segments of 8192, 8192 and 512 bytes: at most 10000 bytes gives {w0} {w1, b0 b1}.
    const auto plan = l.bucket_plan(10000);
    REQUIRE(plan.size() == 2);
    CHECK(plan[0] == std::pair<std::size_t, std::size_t>{0, 1});
    CHECK(plan[1] == std::pair<std::size_t, std::size_t>{1, 3});
  }
  SUBCASE("by module") {
    l.finalize({.world_size = 3, .alignment_bytes = 64, .grouping = segment_by::module});
    REQUIRE(l.segments().size() == 2);
    CHECK(l.segments()[0].module == m0);
    CHECK(l.param(*l.find("b0")).segment == 0);
    CHECK(l.param(*l.find("w1")).segment == 1);
    check_invariants(l);
  }
}

TEST_CASE("flat_layout: property test over random shapes and world sizes 1..64") {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 120; ++trial) {
    const dtype type = std::array<dtype, 3>{dtype::f32, dtype::bf16, dtype::f16}[static_cast<std::size_t>(trial % 3)];
    flat_layout l(type);
    const int modules = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < modules; ++m) {
      l.add_module("m" + std::to_string(m));
    }
    const int params = 1 + static_cast<int>(rng() % 12);
    for (int p = 0; p < params; ++p) {
      std::vector<std::int64_t> shape;
      const int dims = 1 + static_cast<int>(rng() % 3);
      for (int d = 0; d < dims; ++d) {
        shape.push_back(1 + static_cast<std::int64_t>(rng() % 40));
      }
      l.add("p" + std::to_string(p), shape, type, static_cast<int>(rng() % static_cast<unsigned>(modules)));
    }
    const int world = 1 + static_cast<int>(rng() % 64);
    const std::size_t align = std::size_t{4} << (rng() % 6);
    const auto grouping = (rng() % 2) != 0 ? segment_by::module : segment_by::bucket;
    const std::size_t seg_bytes = (rng() % 3) == 0 ? 0 : 64 + rng() % 4096;
    CAPTURE(trial);
    CAPTURE(world);
    CAPTURE(align);
    l.finalize({.world_size = world, .alignment_bytes = align, .grouping = grouping, .segment_bytes = seg_bytes});
    check_invariants(l);
  }
}

TEST_CASE("flat_layout: bad input is refused by name") {
  flat_layout l(dtype::bf16);
  l.add("w", {4, 4}, dtype::bf16);
  CHECK_THROWS_WITH_AS(l.add("w", {4}, dtype::bf16), doctest::Contains("\"w\" is already registered"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS(l.add("x", {4, 0}, dtype::bf16), doctest::Contains("dimension 1 = 0"), zero::usage_error);
  CHECK_THROWS_WITH_AS(l.add("y", {4}, dtype::f32), doctest::Contains("dtype fp32 but this layout holds bf16"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS(l.add("z", {4}, dtype::bf16, 3), doctest::Contains("module id 3"), zero::usage_error);
  CHECK_THROWS_WITH_AS((void)l.total_size(), doctest::Contains("not finalized"), zero::usage_error);
  CHECK_THROWS_WITH_AS(l.finalize({.world_size = 0}), doctest::Contains("world_size must be at least 1"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS(l.finalize({.world_size = 2, .alignment_bytes = 24}), doctest::Contains("power of two"),
                       zero::usage_error);
  l.finalize({.world_size = 2});
  CHECK_THROWS_WITH_AS(l.add("late", {1}, dtype::bf16), doctest::Contains("after finalize"), zero::usage_error);
  CHECK_THROWS_WITH_AS((void)l.shard_ranges(2), doctest::Contains("rank 2 is outside"), zero::usage_error);
}
