#pragma once
// What the specs of the engine's parts share: a flat layout registered and finalized by hand, one
// rank's kernels, stream and counted memory, and typed access to the parts' byte buffers.
//
// Layouts here align parameters to one element, so segment and slice sizes are small numbers a spec
// can state by hand: a segment of n elements is padded to the next multiple of the world size.

#include "zero/backend/cpu_backend.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zero::testing {

/// The counted host memory every part draws from.
using host_counting = counting_allocator<host_allocator>;

/// One parameter of a hand-made layout: its name, element count and module (an index into the
/// layout's module names; -1: none).
struct part_param {
  std::string name;
  std::int64_t numel = 1;
  int module = -1;
};

/// How a hand-made layout is laid out.
struct part_layout_options {
  int world = 1;
  dtype type = dtype::f32;
  segment_by grouping = segment_by::bucket;
  /// With `segment_by::bucket`: the most elements of parameters per segment (0: one segment;
  /// 1: one segment per parameter).
  std::size_t segment_elements = 0;
};

/// A layout of `params` over `modules`, finalized with one-element alignment.
inline flat_layout make_layout(const std::vector<std::string>& modules, const std::vector<part_param>& params,
                               const part_layout_options& opt) {
  flat_layout layout(opt.type);
  for (const auto& m : modules) {
    layout.add_module(m);
  }
  for (const auto& p : params) {
    layout.add(p.name, {p.numel}, opt.type, p.module);
  }
  const std::size_t esize = size_of(opt.type);
  layout.finalize({.world_size = opt.world,
                   .alignment_bytes = esize,
                   .grouping = opt.grouping,
                   .segment_bytes = opt.segment_elements * esize});
  return layout;
}

/// One rank's kernels (one thread), its stream and its counted memory.
struct rank_kit {
  cpu_backend backend{cpu_backend_options{.threads = 1}};
  cpu_stream stream{};
  host_counting alloc{};
};

/// A stream and an event that are only names, for backends that log what a part asks of them.
struct named_stream {
  int id = 0;
  [[nodiscard]] int get() const noexcept { return id; }
};
struct named_event {
  int id = 0;
};

/// `p` (a part's byte buffer) as elements of `T`.
template <class T> T* as(std::byte* p) noexcept { return reinterpret_cast<T*>(p); }
template <class T> const T* as(const std::byte* p) noexcept { return reinterpret_cast<const T*>(p); }

/// Rank `rank`'s owned ranges of `layout` (its slice of every segment, with the slice's offset in the
/// rank's shard), as the optimizer and the gradient statistics take them.
inline std::vector<std::pair<flat_range, std::size_t>> owned_ranges(const flat_layout& layout, int rank) {
  std::vector<std::pair<flat_range, std::size_t>> out;
  for (const auto& s : layout.segments()) {
    out.emplace_back(s.slice_of(rank), s.shard_offset);
  }
  return out;
}

/// What rank `rank` writes at flat element `i` of its slices (exact in f32, different for every rank
/// and element), plus `shift` (a later update).
inline float slice_value(int rank, std::size_t i, float shift = 0) {
  return static_cast<float>(1000 * (rank + 1) + static_cast<int>(i)) + shift;
}

/// Writes `slice_value(rank, i, shift)` at every flat element `i` of rank `rank`'s slices (what its
/// optimizer updates): into `store` at `i` when it is the whole flat buffer, at the slice's shard
/// offset when it is the rank's shard; `only` limits it to one segment.
inline void write_own_slices(const flat_layout& layout, int rank, float* store, bool shard, float shift = 0,
                             std::optional<std::size_t> only = std::nullopt) {
  const auto& segs = layout.segments();
  for (std::size_t s = 0; s < segs.size(); ++s) {
    if (only && *only != s) {
      continue;
    }
    const auto mine = segs[s].slice_of(rank);
    for (std::size_t i = mine.begin; i < mine.end; ++i) {
      store[shard ? segs[s].shard_offset + (i - mine.begin) : i] = slice_value(rank, i, shift);
    }
  }
}

/// Checks that segment `s`, whole at `whole`, holds every rank's slice as `write_own_slices` wrote it.
inline void check_whole(const flat_layout& layout, std::size_t s, const std::byte* whole, float shift = 0) {
  const auto& seg = layout.segments()[s];
  const float* p = as<float>(whole);
  for (std::size_t i = seg.range.begin; i < seg.range.end; ++i) {
    const int owner = static_cast<int>((i - seg.range.begin) / seg.slice);
    CHECK(p[i - seg.range.begin] == slice_value(owner, i, shift));
  }
}

} // namespace zero::testing
