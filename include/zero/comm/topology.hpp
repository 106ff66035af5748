#pragma once
/// \file
/// `topology`: a job's ranks laid out on named axes — pipeline stages, data-parallel replicas, expert
/// groups, tensor-parallel slices — and the group of each axis, as DeepSpeed's `ProcessTopology` /
/// `PipeModelDataParallelTopology` and FSDP2's DeviceMesh lay them out.
///
/// The axes are listed outermost first; the last one varies fastest between consecutive ranks. With
/// axes (pipe 2, data 2, tensor 2), rank 5 is (pipe 1, data 0, tensor 1) and ranks 4 and 5 form one
/// tensor group: tensor-parallel peers are neighbours, which puts them on one node (DeepSpeed's
/// `get_rank(pipe=, data=, model=)` numbers ranks the same way for the same axes).
///
/// The group of a set of axes is the ranks that share the coordinates on every other axis: with the
/// axes above, `group_of(r, {"data"})` is r's data-parallel group (the ranks ZeRO shards over), and
/// for a mixture-of-experts layout (pipe, expert_data, expert, tensor) `{"expert_data", "expert"}` is
/// the dense parameters' data group and `{"expert_data"}` the experts' own. `split(comm, axes)` makes
/// that group's communicator from the whole job's (`can_split`: `split(color, key)`), every rank
/// calling it together.

#include "zero/comm/communicator.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero {

/// One axis of a `topology`: its name and how many coordinates it has.
struct topology_axis {
  std::string name;
  int size = 1;
};

/// Ranks on named axes; see the file comment.
class topology {
public:
  /// \throws usage_error for an empty axis list, an empty or repeated name, or a size below 1.
  explicit topology(std::vector<topology_axis> axes) : axes_(std::move(axes)) {
    if (axes_.empty()) {
      throw usage_error("topology: no axes; name at least one, e.g. {\"data\", world size}");
    }
    for (std::size_t i = 0; i < axes_.size(); ++i) {
      const auto& a = axes_[i];
      if (a.name.empty()) {
        throw usage_error("topology: axis " + std::to_string(i) + " has no name");
      }
      if (a.size < 1) {
        throw usage_error("topology: axis \"" + a.name + "\" has size " + std::to_string(a.size) +
                          "; expected 1 or more");
      }
      for (std::size_t j = 0; j < i; ++j) {
        if (axes_[j].name == a.name) {
          throw usage_error("topology: axis \"" + a.name + "\" is named twice");
        }
      }
      if (size_ > max_ranks / a.size) {
        throw usage_error("topology: the axes' sizes multiply to more than " + std::to_string(max_ranks) + " ranks");
      }
      size_ *= a.size;
    }
  }

  /// The axes, outermost first.
  [[nodiscard]] const std::vector<topology_axis>& axes() const noexcept { return axes_; }
  /// Ranks in the layout: the product of the axes' sizes.
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The size of axis `name`. \throws usage_error naming it and the axes when there is none.
  [[nodiscard]] int axis_size(const std::string& name) const { return axes_[index_of(name)].size; }

  /// Rank `rank`'s coordinate on each axis, in the axes' order. \throws usage_error for a rank outside.
  [[nodiscard]] std::vector<int> coords(int rank) const {
    check_rank(rank, "coords");
    std::vector<int> c(axes_.size());
    for (std::size_t i = axes_.size(); i-- > 0;) {
      c[i] = rank % axes_[i].size;
      rank /= axes_[i].size;
    }
    return c;
  }
  /// Rank `rank`'s coordinate on axis `name`.
  [[nodiscard]] int coord(int rank, const std::string& name) const { return coords(rank)[index_of(name)]; }
  /// The rank at `coords` (one per axis, in the axes' order). \throws usage_error for a wrong count or a
  /// coordinate outside its axis.
  [[nodiscard]] int rank_of(std::span<const int> coords) const {
    if (coords.size() != axes_.size()) {
      throw usage_error("topology: " + std::to_string(coords.size()) + " coordinates for " +
                        std::to_string(axes_.size()) + " axes (" + names() + ")");
    }
    int rank = 0;
    for (std::size_t i = 0; i < axes_.size(); ++i) {
      if (coords[i] < 0 || coords[i] >= axes_[i].size) {
        throw usage_error("topology: coordinate " + std::to_string(coords[i]) + " on axis \"" + axes_[i].name +
                          "\", which has " + std::to_string(axes_[i].size));
      }
      rank = rank * axes_[i].size + coords[i];
    }
    return rank;
  }
  [[nodiscard]] int rank_of(std::initializer_list<int> coords) const {
    return rank_of(std::span<const int>(coords.begin(), coords.size()));
  }

  /// The ranks of `rank`'s group over `axes` (those sharing its coordinates on every other axis), in
  /// order of their coordinates on `axes` (row-major, as `rank_of`), so a rank's place in the list is
  /// its rank in the group's communicator. \throws usage_error for an unknown or repeated axis.
  [[nodiscard]] std::vector<int> group_of(int rank, std::span<const std::string> axes) const {
    const int color = place(rank, axes, "group_of").color;
    std::vector<int> out;
    for (int r = 0; r < size_; ++r) {
      if (place(r, axes, "group_of").color == color) {
        out.push_back(r);
      }
    }
    return out;
  }
  [[nodiscard]] std::vector<int> group_of(int rank, std::initializer_list<std::string> axes) const {
    return group_of(rank, std::span<const std::string>(axes.begin(), axes.size()));
  }
  /// The ranks in each group over `axes`: the product of their sizes.
  [[nodiscard]] int group_size(std::span<const std::string> axes) const {
    int n = 1;
    for (const std::size_t i : indices(axes, "group_size")) {
      n *= axes_[i].size;
    }
    return n;
  }
  [[nodiscard]] int group_size(std::initializer_list<std::string> axes) const {
    return group_size(std::span<const std::string>(axes.begin(), axes.size()));
  }

  /// What `split` passes to `Comm::split` for `rank`: the color (the group's index among the groups
  /// over `axes`, from its coordinates on the other axes) and the key (the rank's place in the group).
  struct split_args {
    int color;
    int key;
  };
  [[nodiscard]] split_args split_for(int rank, std::span<const std::string> axes) const {
    const auto p = place(rank, axes, "split");
    return {p.color, p.key};
  }

  /// The communicator of this rank's group over `axes`, split from `comm` (the whole job, whose size
  /// must be this topology's); collective over `comm`. \throws usage_error when the sizes differ or an
  /// axis is unknown (before any rank has split, as every rank checks the same values).
  template <can_split Comm> [[nodiscard]] Comm split(Comm& comm, std::span<const std::string> axes) const {
    if (comm.size() != size_) {
      throw usage_error("topology: laid out for " + std::to_string(size_) + " ranks (" + names() +
                        "), but communicator \"" + std::string(comm.name()) + "\" has " + std::to_string(comm.size()));
    }
    const auto [color, key] = split_for(comm.rank(), axes);
    return comm.split(color, key);
  }
  template <can_split Comm> [[nodiscard]] Comm split(Comm& comm, std::initializer_list<std::string> axes) const {
    return split(comm, std::span<const std::string>(axes.begin(), axes.size()));
  }

  /// "pipe 2 x data 2 x tensor 2", for messages and logs.
  [[nodiscard]] std::string names() const {
    std::string s;
    for (const auto& a : axes_) {
      s += (s.empty() ? "" : " x ") + a.name + " " + std::to_string(a.size);
    }
    return s;
  }

private:
  static constexpr int max_ranks = 1 << 30;

  struct placed {
    int color; // the group's index: the other axes' coordinates, row-major
    int key;   // the place in the group: the coordinates on `axes`, row-major
  };

  [[nodiscard]] std::size_t index_of(const std::string& name) const {
    for (std::size_t i = 0; i < axes_.size(); ++i) {
      if (axes_[i].name == name) {
        return i;
      }
    }
    throw usage_error("topology: no axis \"" + name + "\"; the axes are " + names());
  }
  [[nodiscard]] std::vector<std::size_t> indices(std::span<const std::string> axes, const char* what) const {
    std::vector<std::size_t> out;
    for (const auto& name : axes) {
      const std::size_t i = index_of(name);
      if (std::find(out.begin(), out.end(), i) != out.end()) {
        throw usage_error(std::string("topology::") + what + ": axis \"" + name + "\" is named twice");
      }
      out.push_back(i);
    }
    return out;
  }
  void check_rank(int rank, const char* what) const {
    if (rank < 0 || rank >= size_) {
      throw usage_error(std::string("topology::") + what + ": rank " + std::to_string(rank) + " is outside the " +
                        std::to_string(size_) + " ranks of " + names());
    }
  }
  [[nodiscard]] placed place(int rank, std::span<const std::string> axes, const char* what) const {
    check_rank(rank, what);
    std::vector<bool> grouped(axes_.size(), false);
    for (const std::size_t i : indices(axes, what)) {
      grouped[i] = true;
    }
    const auto c = coords(rank);
    placed p{0, 0};
    for (std::size_t i = 0; i < axes_.size(); ++i) {
      if (grouped[i]) {
        p.key = p.key * axes_[i].size + c[i];
      } else {
        p.color = p.color * axes_[i].size + c[i];
      }
    }
    return p;
  }

  std::vector<topology_axis> axes_;
  int size_ = 1;
};

} // namespace zero
