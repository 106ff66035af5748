#pragma once
/// \file
/// `detail::module_table`: the modules stage 3's coordinator (`param_coordinator`) was given, each with its
/// units and name, and how many gathers of each the framework holds; the usage errors that name them.

#include "zero/core/error.hpp"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace zero::detail {

/// The registered modules of stage 3 and the framework's holds on them.
class module_table {
public:
  /// \param units  for each module id, the units (segments) a gather of it brings in.
  /// \param names  for each module id, its name (for messages).
  module_table(std::vector<std::vector<std::size_t>> units, std::vector<std::string> names)
      : units_(std::move(units)), names_(std::move(names)), holds_(units_.size(), 0) {}

  /// Module `m`'s index. \throws usage_error naming `what` (the call) for an id that was not registered.
  [[nodiscard]] std::size_t check(int m, const char* what) const {
    if (m < 0 || static_cast<std::size_t>(m) >= units_.size()) {
      throw usage_error(std::string(what) + ": module id " + std::to_string(m) + " was not registered (" +
                        std::to_string(units_.size()) + " modules)");
    }
    return static_cast<std::size_t>(m);
  }

  /// For each module id, its units.
  [[nodiscard]] const std::vector<std::vector<std::size_t>>& units() const noexcept { return units_; }
  /// For each module id, its name.
  [[nodiscard]] const std::vector<std::string>& names() const noexcept { return names_; }
  /// `module "name"` for module `m`, or `all parameters` for -1 (a gather of the whole model).
  [[nodiscard]] std::string text(int m) const {
    return m >= 0 ? "module \"" + names_[static_cast<std::size_t>(m)] + "\"" : "all parameters";
  }

  /// Counts a gather of module index `mi` the framework holds.
  void hold(std::size_t mi) noexcept { ++holds_[mi]; }
  /// Counts one back. \throws usage_error when none is held (a double release).
  void drop(std::size_t mi) {
    if (holds_[mi] == 0) {
      throw usage_error("release(\"" + names_[mi] + "\") without a matching gather (a double release?)");
    }
    --holds_[mi];
  }
  /// True while the framework holds module index `mi` gathered.
  [[nodiscard]] bool held(std::size_t mi) const noexcept { return holds_[mi] > 0; }
  /// \throws usage_error `before + name + after` for the first module still held.
  void require_released(const char* before, const char* after) const {
    for (std::size_t mi = 0; mi < holds_.size(); ++mi) {
      if (holds_[mi] != 0) {
        throw usage_error(before + names_[mi] + after);
      }
    }
  }

private:
  std::vector<std::vector<std::size_t>> units_;
  std::vector<std::string> names_;
  std::vector<int> holds_;
};

} // namespace zero::detail
