#pragma once
/// \file
/// `detail::check_host_buffers`: a count of host buffers that a config asks for (`buffer_count`)
/// checked against the host's physical memory before any of them is allocated. Without it,
/// `offload_param.buffer_count: 1e8` allocated bounce buffers until the host ran out.

#include "zero/core/detail/bytes_text.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <unistd.h>

namespace zero::detail {

/// The host's physical memory in bytes (sysconf), or 0 where it cannot be told.
[[nodiscard]] inline std::uint64_t physical_memory_bytes() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) {
    return 0;
  }
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page);
}

/// Throws `config_error` naming `key` when `count` buffers of `each` bytes are more than `limit`
/// bytes (the host's physical memory by default): no run on this host could allocate them.
/// \param key   the config key of the count ("zero_optimization.offload_param.buffer_count").
/// \param limit the bytes allowed; 0 (the host's memory unknown) checks nothing.
inline void check_host_buffers(std::string_view key, std::uint64_t count, std::uint64_t each,
                               std::uint64_t limit = physical_memory_bytes()) {
  if (limit == 0 || each == 0) {
    return;
  }
  const bool overflow = count > std::numeric_limits<std::uint64_t>::max() / each;
  if (!overflow && count * each <= limit) {
    return;
  }
  const double total = static_cast<double>(count) * static_cast<double>(each);
  throw config_error(cat(key, ": ", std::to_string(count), " buffers of ", std::to_string(each), " bytes are ",
                         show_bytes(total), " of host memory, more than this host's ",
                         show_bytes(static_cast<double>(limit)), "; expected at most ", std::to_string(limit / each),
                         " here (DeepSpeed's defaults: 5 for offload_param, 4 for offload_optimizer)"));
}

} // namespace zero::detail
