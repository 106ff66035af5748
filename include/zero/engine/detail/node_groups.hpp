#pragma once
/// \file
/// `node_groups`: the groups ZeRO++ cuts the data group into, made once and shared by hpZ
/// (`zero_hpz_partition_size`) and qgZ's two levels (`zero_quantized_gradients_node_size`).
///
/// A node is a run of H consecutive ranks of the data group of N: rank r is local rank r % H of node
/// r / H. The node group is the node's H ranks in rank order; the cross group of local index l holds
/// the N / H ranks of local rank l, one per node, in node order. Both are split from the data group's
/// communicator (`can_split`), the node groups with colors 0 .. N/H - 1 and the cross groups with
/// colors N/H .. N/H + H - 1, so that no two groups share a name ("<group>/<color>"). A split is a
/// collective: every rank asks for the same groups in the same order (the engine does, from the config).

#include "zero/comm/communicator.hpp"
#include "zero/core/error.hpp"

#include <cstdint>
#include <optional>
#include <string>

namespace zero::detail {

template <communicator Comm> class node_groups {
public:
  /// The rank's node group of `size` consecutive ranks of `comm` (the data group), split at the first
  /// call. \param key the config key asking for it (with its value, named in errors).
  /// \throws config_error when `size` does not divide `comm`'s size, when another key asked for nodes
  /// of another size, or when `Comm` cannot split.
  Comm& node(Comm& comm, std::int64_t size, const std::string& key) {
    check(comm, size, key);
    if constexpr (can_split<Comm>) {
      if (!node_) {
        node_.emplace(comm.split(comm.rank() / static_cast<int>(size), comm.rank()));
      }
    }
    return *node_;
  }

  /// The rank's cross group: the ranks of `comm` with its local index in nodes of `size`, in node
  /// order, split at the first call. \throws as `node`.
  Comm& cross(Comm& comm, std::int64_t size, const std::string& key) {
    check(comm, size, key);
    if constexpr (can_split<Comm>) {
      if (!cross_) {
        const int h = static_cast<int>(size);
        cross_.emplace(comm.split(comm.size() / h + comm.rank() % h, comm.rank()));
      }
    }
    return *cross_;
  }

private:
  void check(const Comm& comm, std::int64_t size, const std::string& key) {
    if constexpr (can_split<Comm>) {
      if (size < 1 || size > comm.size() || comm.size() % size != 0) {
        throw config_error(key + " does not divide the " + std::to_string(comm.size()) +
                           " ranks of the data group; expected the ranks of a node, a divisor of the group's size");
      }
      if (size_ != 0 && size_ != size) {
        throw config_error(key + " asks for nodes of " + std::to_string(size) + " ranks, but " + key_ +
                           " made them of " + std::to_string(size_) + "; expected one node size for ZeRO++'s groups");
      }
      size_ = size;
      key_ = key;
    } else {
      throw config_error(key + " needs a communicator that can split(color, key) (zero::can_split) to make the node "
                               "groups; use one that can, or set it to 1");
    }
  }

  std::int64_t size_ = 0; // the node size of the groups made, 0 before the first
  std::string key_;       // the key that first asked for them
  std::optional<Comm> node_;
  std::optional<Comm> cross_;
};

} // namespace zero::detail
