#pragma once
/// \file
/// `unit_gather`: how stage 3's coordinator brings one unit in. The rank's slice is staged in place in
/// the unit's buffer from the shard (`param_shard::stage_unit`: copied, uploaded, cast from the master
/// or read from a file), then all-gathered over the data group:
///
/// - plainly, in place;
/// - with qwZ (`use_quantized`, `zero_quantized_weights`): the slice is block-quantized to int8 codes
///   and fp32 scales (zero/backend/quantize.hpp) into the rank's piece of a packed buffer, the pieces
///   are all-gathered as bytes (about half of a 16-bit gather), and `land` dequantizes every piece
///   into the unit once the gather completed. Persistent units are gathered plainly;
/// - with hpZ (`use_secondary`, `zero_hpz_partition_size`), while the unit's node slice is fresh:
///   over the node group from the secondary partition (`secondary_partition`), and `land` keeps that
///   slice after each gather over the data group.
///
/// A piece of the packed buffer is the slice's codes, padded to 16 bytes, then its scales; pieces are
/// padded to 16 bytes, so every piece's codes and scales are aligned for the packed kernels.

#include "zero/backend/backend.hpp"
#include "zero/backend/quantize.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/gather_stats.hpp"
#include "zero/engine/residency/detail/param_shard.hpp"
#include "zero/engine/residency/detail/secondary_partition.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

namespace zero::detail {

template <backend_base Backend, communicator Comm, allocator A> class unit_gather {
  using counting = counting_allocator<A>;
  using stream_type = typename Backend::stream_type;
  using event_type = typename Backend::event_type;

public:
  using handle_type =
      decltype(std::declval<Comm&>().all_gather(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0));
  using packed_buffer = buffer<std::byte, counting>;

  /// All kept by reference.
  unit_gather(const flat_layout& layout, Backend& backend, Comm& comm, stream_type& stream)
      : layout_(layout), backend_(backend), comm_(comm), stream_(stream) {}

  /// hpZ over `node` (kept by reference), the kept slices in `state`.
  void use_secondary(Comm& node, counting state) {
    secondary_.emplace(layout_, comm_.size(), node, backend_, std::move(state), stream_);
  }
  /// qwZ: gathers non-persistent units as codes of format `f`, the packed buffers from `work`.
  /// \throws config_error when the backend has no quantization kernels.
  void use_quantized(quant_format f, counting work) {
    if constexpr (can_quantize<Backend>) {
      f.check("zero_optimization.zero_quantized_weights");
      quantized_.emplace(f);
      work_.emplace(std::move(work));
    } else {
      throw config_error("zero_optimization.zero_quantized_weights: this backend has no quantize/dequantize kernels "
                         "(zero::can_quantize); set it to false");
    }
  }
  [[nodiscard]] std::size_t secondary_bytes() const noexcept { return secondary_ ? secondary_->bytes() : 0; }
  /// The shards changed: every kept node slice is stale.
  void forget() noexcept {
    if (secondary_) {
      secondary_->forget();
    }
  }

  /// Starts gathering unit `u` into `whole` (see the file comment): stages the rank's slice from `shard`
  /// after `update` (the unit's optimizer update, or null), calls `joined(u, true)` when that wait ran on
  /// the coordinator's stream and `joined(u, false)` when it ran on an upload stream the gather follows
  /// (the update is done once the gather's handle is waited), and counts the gather in `stats`. A quantized gather
  /// leaves its packed buffer in `packed` for `land`.
  template <class Shard, class Joined>
  handle_type start(std::size_t u, std::byte* whole, const event_type* update, bool persistent, packed_buffer& packed,
                    gather_stats& stats, Shard& shard, Joined&& joined) {
    const auto& s = layout_.segments()[u];
    if (secondary_ && secondary_->holds(u)) {
      ++stats.node_gathers;
      return secondary_->gather(u, whole, stream_);
    }
    return visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
      P* dst = reinterpret_cast<P*>(whole);
      // The shard slice is copied into place first (uploaded, when offloaded), so the all-gather runs
      // in place, in device memory; the unit's optimizer update comes before the copy.
      P* slot = dst + static_cast<std::size_t>(comm_.rank()) * s.slice;
      const auto& on = shard.stage_unit(u, s.shard_offset, slot, s.slice, update);
      if (update != nullptr) {
        joined(u, &on == &stream_); // the copy waited for the update, on this stream
      }
      if (!quantized_ || persistent) {
        return all_gather_on(on, slot, dst, s.slice);
      }
      ++stats.quantized_gathers;
      const std::size_t piece = piece_bytes(s.slice);
      packed = packed_buffer(*work_, piece * static_cast<std::size_t>(comm_.size()), memory_tag::params);
      auto* all = reinterpret_cast<std::uint8_t*>(packed.data());
      std::uint8_t* mine = all + static_cast<std::size_t>(comm_.rank()) * piece;
      quantize_into(slot, s.slice, mine, on);
      return all_gather_on(on, mine, all, piece);
    });
  }

  /// Finishes unit `u` in `whole` once its all-gather completed: dequantizes a packed gather (its buffer
  /// is kept until the unit is freed, as the unit's own) and keeps the rank's node slice for hpZ.
  void land(std::size_t u, std::byte* whole, const packed_buffer& packed) {
    if (packed.size() > 0) {
      const auto& s = layout_.segments()[u];
      const std::size_t piece = piece_bytes(s.slice);
      const auto* all = reinterpret_cast<const std::uint8_t*>(packed.data());
      visit_float(layout_.type(), [&]<class P>(type_tag<P>) {
        for (std::size_t r = 0; r < static_cast<std::size_t>(comm_.size()); ++r) {
          dequantize_from(all + r * piece, s.slice, reinterpret_cast<P*>(whole) + r * s.slice);
        }
      });
    }
    if (secondary_ && !secondary_->holds(u)) {
      secondary_->keep(u, whole, stream_);
    }
  }

private:
  static constexpr std::size_t pad16(std::size_t bytes) noexcept { return (bytes + 15) / 16 * 16; }
  /// Bytes of a rank's packed piece of a slice of `n` elements: its codes (padded), then its scales.
  [[nodiscard]] std::size_t piece_bytes(std::size_t n) const noexcept {
    return pad16(quantized_->code_bytes(n)) + pad16(quantized_->blocks(n) * sizeof(float));
  }
  template <class P> void quantize_into(const P* slot, std::size_t n, std::uint8_t* piece, const stream_type& on) {
    if constexpr (can_quantize<Backend>) {
      auto* scales = reinterpret_cast<float*>(piece + pad16(quantized_->code_bytes(n)));
      backend_.quantize(slot, n, *quantized_, piece, scales, on);
    }
  }
  template <class P> void dequantize_from(const std::uint8_t* piece, std::size_t n, P* out) {
    if constexpr (can_quantize<Backend>) {
      const auto* scales = reinterpret_cast<const float*>(piece + pad16(quantized_->code_bytes(n)));
      backend_.dequantize(piece, scales, n, *quantized_, out, stream_);
    }
  }
  template <class T> handle_type all_gather_on(const stream_type& on, T* send, T* recv, std::size_t n) {
    if constexpr (!stream_ordered<Comm, stream_type>) {
      backend_.synchronize(on);
      return comm_.all_gather(send, recv, n);
    } else {
      return all_gather_after(comm_, on, stream_, send, recv, n);
    }
  }

  const flat_layout& layout_;
  Backend& backend_;
  Comm& comm_;
  stream_type& stream_;
  std::optional<secondary_partition<Backend, Comm, A>> secondary_;
  std::optional<quant_format> quantized_;
  std::optional<counting> work_;
};

} // namespace zero::detail
