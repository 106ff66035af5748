#pragma once
/// \file
/// Edit distance and "did you mean" suggestions for config keys and values.

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero::detail {

/// Lower-cases ASCII letters; config keys and enum values are ASCII.
inline std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

/// Optimal-string-alignment distance between `a` and `b`, compared case-insensitively: the number
/// of insertions, deletions, substitutions and swaps of adjacent characters that turn one into the
/// other. "stage3_prefech_bucket_size" is 1 from "stage3_prefetch_bucket_size", "cpuu" 1 from "cpu".
/// \returns the distance; 0 for names that differ only in case.
[[nodiscard]] inline std::size_t edit_distance(std::string_view a_in, std::string_view b_in) {
  const std::string a = ascii_lower(a_in);
  const std::string b = ascii_lower(b_in);
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  // Three rolling rows: the swap rule looks two rows back.
  std::vector<std::size_t> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) {
    prev[j] = j;
  }
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
      }
    }
    prev2.swap(prev);
    prev.swap(cur);
  }
  return prev[m];
}

/// How far a name may be from a candidate and still count as a likely typo of it.
[[nodiscard]] constexpr std::size_t typo_budget(std::size_t length) noexcept {
  if (length <= 3) {
    return 1;
  }
  if (length <= 8) {
    return 2;
  }
  return 3;
}

/// The candidate nearest to `name` when it is near enough to be a typo of it (see `typo_budget`),
/// or an empty view. Ties go to the first candidate in the list.
[[nodiscard]] inline std::string_view closest_match(std::string_view name,
                                                    std::span<const std::string_view> candidates) {
  std::string_view best;
  std::size_t best_distance = typo_budget(name.size()) + 1;
  for (std::string_view c : candidates) {
    const std::size_t d = edit_distance(name, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

} // namespace zero::detail
