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

/// The rank that owns flat element `i` of `layout` (the slice it lies in).
inline int owner_of(const flat_layout& layout, std::size_t i) { return layout.owner(i).first; }

} // namespace zero::testing
