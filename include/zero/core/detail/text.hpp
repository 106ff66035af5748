#pragma once
/// \file
/// `detail::cat`, the one helper every layer builds its messages with (config, checkpoint, the tools).

#include <string>
#include <string_view>

namespace zero::detail {

/// Concatenates text by appending each piece in turn: anything a `std::string_view` can be made
/// from (string literals, `std::string`, `std::string_view`).
/// \returns the pieces joined, in a string reserved once for their total length.
/// Messages are built with it rather than with `"literal" + std::string(...)`, which makes GCC 12
/// warn falsely under -O2 (-Wrestrict, GCC bug 105651) in the code of whoever includes these
/// headers.
template <class... Parts> [[nodiscard]] std::string cat(const Parts&... parts) {
  std::string out;
  out.reserve((std::string_view(parts).size() + ... + 0));
  (out.append(std::string_view(parts)), ...);
  return out;
}

} // namespace zero::detail
