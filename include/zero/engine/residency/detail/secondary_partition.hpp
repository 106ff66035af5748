#pragma once
/// \file
/// `secondary_partition`: ZeRO++'s hierarchical partition (hpZ, `zero_hpz_partition_size`) of stage 3's
/// gathered units. Besides its primary slice (1/N of every unit over the whole data group), a rank
/// keeps its slice of every unit over its node group of H ranks (1/H of the unit: P psi / H bytes,
/// model-state memory). The first gather of a unit after its parameters changed all-gathers over the
/// whole group, as without hpZ, and keeps the rank's node slice of the result; later gathers of the
/// unit (backward's, after forward's) all-gather over the node group from the kept slices, so they
/// cross no node boundary. The kept slices are the gathered values themselves: a gather from them
/// gives the same bits. A step (or anything that rewrites the shards) makes every slice stale.

#include "zero/backend/backend.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/residency/detail/param_shard.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <cstddef>
#include <cstring>
#include <vector>

namespace zero::detail {

template <backend_base Backend, communicator Comm, allocator A> class secondary_partition {
  using counting = counting_allocator<A>;
  using stream_type = typename Backend::stream_type;

public:
  /// \param layout the stage-3 layout over the whole group of `ranks` (kept by reference).
  /// \param node   the rank's node group, of a size dividing `ranks` (kept by reference).
  /// \param state  model-state memory for the kept slices (`memory_tag::params`).
  secondary_partition(const flat_layout& layout, int ranks, Comm& node, Backend& backend, counting state,
                      const stream_type& stream)
      : layout_(layout), node_(node), backend_(backend), esize_(size_of(layout.type())),
        per_node_(static_cast<std::size_t>(ranks / node.size())), fresh_(layout.segments().size(), 0),
        slices_(state, layout.shard_size() * per_node_ * esize_, memory_tag::params) {
    if constexpr (stream_ordered<Comm, stream_type>) {
      node_.set_compute_stream(stream.get());
    }
  }

  /// True when unit `u` can be gathered over the node group (its slice was kept since the last change).
  [[nodiscard]] bool holds(std::size_t u) const noexcept { return fresh_[u] != 0; }
  /// Bytes of the kept slices.
  [[nodiscard]] std::size_t bytes() const noexcept { return slices_.size(); }

  /// Keeps the rank's node slice of unit `u`, gathered whole in `whole` (ordered on `s` after the gather).
  void keep(std::size_t u, const std::byte* whole, const stream_type& s) {
    const span_of at = place(u);
    move(whole + static_cast<std::size_t>(node_.rank()) * at.bytes, slices_.data() + at.offset, at.bytes, s);
    fresh_[u] = 1;
  }
  /// All-gathers unit `u` into `whole` over the node group from the kept slices, after `s`'s work.
  auto gather(std::size_t u, std::byte* whole, const stream_type& s) {
    const span_of at = place(u);
    std::byte* slot = whole + static_cast<std::size_t>(node_.rank()) * at.bytes;
    move(slices_.data() + at.offset, slot, at.bytes, s);
    return visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      P* dst = reinterpret_cast<P*>(whole);
      const std::size_t count = at.bytes / esize_;
      if constexpr (!stream_ordered<Comm, stream_type>) {
        backend_.synchronize(s);
        return node_.all_gather(reinterpret_cast<P*>(slot), dst, count);
      } else {
        return all_gather_after(node_, s, s, reinterpret_cast<P*>(slot), dst, count);
      }
    });
  }
  /// Every kept slice is stale (the shards changed).
  void forget() noexcept { std::fill(fresh_.begin(), fresh_.end(), 0); }

private:
  struct span_of {
    std::size_t offset; // bytes into the kept slices
    std::size_t bytes;  // the node slice of the unit
  };
  [[nodiscard]] span_of place(std::size_t u) const noexcept {
    const auto& seg = layout_.segments()[u];
    return {seg.shard_offset * per_node_ * esize_, seg.slice * per_node_ * esize_};
  }
  void move(const std::byte* src, std::byte* dst, std::size_t bytes, const stream_type& s) {
    if constexpr (can_copy<Backend>) {
      backend_.copy(src, dst, bytes, s);
    } else {
      backend_.synchronize(s);
      std::memcpy(dst, src, bytes);
    }
  }

  const flat_layout& layout_;
  Comm& node_;
  Backend& backend_;
  std::size_t esize_;
  std::size_t per_node_; // primary slices per node slice: ranks / node size
  std::vector<unsigned char> fresh_;
  buffer<std::byte, counting> slices_;
};

} // namespace zero::detail
