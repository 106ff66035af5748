#pragma once
/// \file
/// `detail::show_bytes`: a byte count as people read it in messages and tables ("13.62 GiB", "0 B"), the one
/// formatting every layer uses (the tools' tables, the memory layer's refusals).

#include <cmath>
#include <cstddef>
#include <cstdio>
#include <iterator>
#include <string>

namespace zero::detail {

/// `bytes` in the largest binary unit it fills, to two decimals: "13.62 GiB", "1.51 MiB", "1023 B". A double, so
/// that a product past 2^64 (a count times a size that overflows) can still be shown.
[[nodiscard]] inline std::string show_bytes(double bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = bytes;
  std::size_t u = 0;
  while (u + 1 < std::size(units) && std::abs(v) >= 1024.0) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  }
  return buf;
}

} // namespace zero::detail
