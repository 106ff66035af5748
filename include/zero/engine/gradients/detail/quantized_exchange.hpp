#pragma once
/// \file
/// `quantized_exchange`: ZeRO++'s qgZ for `bucket_reducer` (docs/zeropp.md) — a bucket's gradient
/// reduce-scattered as block-quantized codes by `all_to_all`, in one level over the data group or in
/// two, over the node group and then the cross group (`node_groups`).
///
/// A bucket's codes live in one buffer drawn from a pool of landed buckets' buffers: the N chunks the
/// rank sends, the N it receives, and with two levels the P node partials it sends across and the P
/// it receives (N ranks, nodes of H, P = N / H nodes). Each chunk (a piece) is its codes then its
/// fp32 scales, each padded to 16 bytes. Reused without waiting: a later bucket's quantize runs on the
/// reducer's stream after the kernels that read the buffer, and its all_to_all starts after that
/// stream's work (the communicator orders itself after it, or the caller synchronizes first).

#include "zero/backend/quantize.hpp"
#include "zero/comm/communicator.hpp"
#include "zero/core/error.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// The exchanges of one reducer; `Handle` is its communicator's handle type. Every member that sends
/// needs `can_quantize<Backend>` and `can_all_to_all<Comm>` (the reducer calls them only then).
template <class Backend, class Comm, class Counting, class Handle> class quantized_exchange {
public:
  using codes_type = buffer<std::byte, Counting>;

  /// \param comm the data group; \param max_segment the largest segment's elements (a bucket's).
  quantized_exchange(Backend& backend, Comm& comm, quant_format f, Counting buffers,
                     typename Backend::stream_type& stream, std::size_t max_segment)
      : backend_(backend), comm_(comm), f_(f), alloc_(std::move(buffers)), stream_(stream),
        max_slice_(max_segment / static_cast<std::size_t>(comm.size())) {}

  /// Two levels over `node` (the rank's H consecutive ranks of the data group) and `cross` (the N / H
  /// ranks of its local index, in node order); both kept by reference. \throws usage_error when they
  /// are not the data group's nodes and their cross sections (rank = cross rank x H + node rank).
  void use_nodes(Comm& node, Comm& cross) {
    const int h = node.size(), p = cross.size();
    if (h * p != comm_.size() || comm_.rank() != cross.rank() * h + node.rank()) {
      throw usage_error("bucket_reducer::use_nodes: expected a node group of H consecutive ranks with a cross group "
                        "of the N / H ranks of the same local index (N = " +
                        std::to_string(comm_.size()) + ", got H = " + std::to_string(h) + " and " + std::to_string(p) +
                        " nodes at rank " + std::to_string(comm_.rank()) + ")");
    }
    if constexpr (stream_ordered<Comm, typename Backend::stream_type>) {
      node.set_compute_stream(stream_.get());
      cross.set_compute_stream(stream_.get());
    }
    node_ = &node;
    cross_ = &cross;
  }
  /// True with a node and a cross group (`use_nodes`).
  [[nodiscard]] bool two_level() const noexcept { return node_ != nullptr; }

  /// Quantizes `staging`'s chunk of `slice` elements for each rank into `codes` (from the pool) and
  /// sends them with one all_to_all: over the data group, or over the node group with the chunks in
  /// the order `chunk_at` gives.
  template <class T> Handle launch(const T* staging, std::size_t slice, codes_type& codes) {
    const auto n = static_cast<std::size_t>(comm_.size());
    const std::size_t piece = piece_bytes(slice);
    if (spare_.empty()) { // room for the largest bucket's chunks, sent and received, at each level
      const std::size_t pieces = 2 * n + (cross_ != nullptr ? 2 * static_cast<std::size_t>(cross_->size()) : 0);
      codes = codes_type(alloc_, pieces * piece_bytes(max_slice_), memory_tag::buffers);
    } else {
      codes = std::move(spare_.back());
      spare_.pop_back();
    }
    auto* out = reinterpret_cast<std::uint8_t*>(codes.data());
    for (std::size_t j = 0; j < n; ++j) {
      quantize(staging + chunk_at(j) * slice, slice, out + j * piece);
    }
    sync_for_host_comm();
    return node_ != nullptr ? node_->all_to_all(out, out + n * piece, static_cast<std::size_t>(cross_->size()) * piece)
                            : comm_.all_to_all(out, out + n * piece, piece);
  }

  /// The second level, once the node all_to_all of `codes` completed: the node's partial of each chunk
  /// this rank gathers (one per node: the node ranks' dequantized pieces summed in fp32 in node-rank
  /// order) quantized again and sent by all_to_all over the cross group.
  Handle cross(std::size_t slice, codes_type& codes) {
    const auto n = static_cast<std::size_t>(comm_.size()), h = static_cast<std::size_t>(node_->size()),
               p = static_cast<std::size_t>(cross_->size());
    const std::size_t piece = piece_bytes(slice);
    float* partial = fp32_scratch(p + 1); // a partial per node, then one dequantized piece
    float* tmp = partial + p * slice;
    auto* at = reinterpret_cast<std::uint8_t*>(codes.data());
    for (std::size_t m = 0; m < p; ++m) {
      for (std::size_t q = 0; q < h; ++q) {
        dequantize(at + (n + q * p + m) * piece, slice, q == 0 ? partial + m * slice : tmp);
        if (q > 0) {
          backend_.accumulate(tmp, partial + m * slice, slice, stream_);
        }
      }
    }
    std::uint8_t* out = at + 2 * n * piece;
    for (std::size_t m = 0; m < p; ++m) {
      quantize(partial + m * slice, slice, out + m * piece);
    }
    sync_for_host_comm();
    return cross_->all_to_all(out, out + p * piece, piece);
  }

  /// The received chunks of the last level (one level: from every rank; two: every node's partial)
  /// dequantized, summed in fp32 in rank (node) order, averaged over the data group and added to
  /// `dst`; `codes` goes back to the pool.
  template <class T> void land(std::size_t slice, codes_type codes, T* dst) {
    float* acc = fp32_scratch(2);
    float* tmp = acc + slice;
    const auto n = static_cast<std::size_t>(comm_.size());
    const std::size_t piece = piece_bytes(slice);
    const std::size_t from = cross_ != nullptr ? static_cast<std::size_t>(cross_->size()) : n;
    const auto* in =
        reinterpret_cast<const std::uint8_t*>(codes.data()) + (cross_ != nullptr ? 2 * n + from : n) * piece;
    for (std::size_t q = 0; q < from; ++q) {
      dequantize(in + q * piece, slice, q == 0 ? acc : tmp);
      if (q > 0) {
        backend_.accumulate(tmp, acc, slice, stream_);
      }
    }
    backend_.scale(acc, slice, 1.0F / static_cast<float>(n), stream_);
    backend_.accumulate(acc, dst, slice, stream_);
    spare_.push_back(std::move(codes));
  }

private:
  static constexpr std::size_t pad16(std::size_t bytes) noexcept { return (bytes + 15) / 16 * 16; }
  /// Bytes of one piece of `n` elements: codes (padded) then scales (padded).
  [[nodiscard]] std::size_t piece_bytes(std::size_t n) const noexcept {
    return pad16(f_.code_bytes(n)) + pad16(f_.blocks(n) * sizeof(float));
  }
  template <class T> void quantize(const T* x, std::size_t n, std::uint8_t* at) {
    backend_.quantize(x, n, f_, at, reinterpret_cast<float*>(at + pad16(f_.code_bytes(n))), stream_);
  }
  void dequantize(const std::uint8_t* at, std::size_t n, float* out) {
    backend_.dequantize(at, reinterpret_cast<const float*>(at + pad16(f_.code_bytes(n))), n, f_, out, stream_);
  }
  /// Collectives read what the backend wrote: a communicator that does not order itself after the
  /// stream needs the host to wait for it.
  void sync_for_host_comm() {
    if constexpr (!stream_ordered<Comm, typename Backend::stream_type>) {
      backend_.synchronize(stream_);
    }
  }
  /// The chunk (the rank of the data group whose shard it is) that goes at position `j` of the first
  /// all_to_all's send buffer. One level: chunk j, to rank j. Two levels, nodes of H ranks and P nodes:
  /// node rank q's part of the buffer (positions q P .. q P + P - 1) holds the chunks of the ranks of
  /// local index q, node by node: position q P + m holds chunk m H + q. Node rank q then sums, for each
  /// node m, its node's partial of chunk m H + q, and its cross group (the ranks m H + q) exchanges them
  /// so that each rank ends with the whole sum of its own chunk: its shard in the engine's partition.
  [[nodiscard]] std::size_t chunk_at(std::size_t j) const noexcept {
    if (node_ == nullptr) {
      return j;
    }
    const auto h = static_cast<std::size_t>(node_->size()), p = static_cast<std::size_t>(cross_->size());
    return (j % p) * h + j / p;
  }
  /// fp32 scratch of `slices` of the largest bucket's slices (stream-ordered reuse).
  float* fp32_scratch(std::size_t slices) {
    const std::size_t bytes = slices * max_slice_ * sizeof(float);
    if (acc_.size() < bytes) {
      acc_ = codes_type(alloc_, bytes, memory_tag::buffers);
    }
    return reinterpret_cast<float*>(acc_.data());
  }

  Backend& backend_;
  Comm& comm_;
  quant_format f_;
  Counting alloc_;
  typename Backend::stream_type& stream_;
  std::size_t max_slice_;
  Comm* node_ = nullptr;          // two levels: the node group
  Comm* cross_ = nullptr;         // and the cross group
  codes_type acc_;                // fp32 sums and one dequantized piece
  std::vector<codes_type> spare_; // code buffers of landed buckets, for the next
};

} // namespace zero::detail
