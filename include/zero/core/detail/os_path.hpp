#pragma once
/// \file
/// `detail::check_os_path`: the one check every path string passes before the operating system sees
/// it. A path is handed to open(2), mkdir(2) and unlink(2) as a C string, which ends at its first NUL
/// byte: `"/tmp/x/victim\0/y"` would open, truncate and remove `/tmp/x/victim`. So a path holding a
/// NUL, whose bytes would not round-trip through the C string, is refused before anything is touched.

#include "zero/core/detail/printable.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>

namespace zero::detail {

/// The byte offset of the first NUL in `text`, or `npos` when there is none.
[[nodiscard]] inline std::size_t first_nul(std::string_view text) noexcept { return text.find('\0'); }

/// Throws `E` unless `path` (a `std::string`, or a `std::filesystem::path`'s `native()`) reaches the operating system
/// unchanged: no NUL byte, not empty. \param what names the path in the message: a config key
/// ("zero_optimization.offload_param.nvme_path"),
///             a flag ("--save") or an argument ("engine::save: dir").
/// \throws E (status EINVAL): "<what>: found "<path, NUL as \x00>" with a NUL character at byte <n>; expected a path
/// without
///         NUL (the operating system would use "<prefix>" instead)", or that the path is empty.
template <class E = usage_error> void check_os_path(std::string_view what, std::string_view path) {
  if (const std::size_t at = first_nul(path); at != std::string_view::npos) {
    throw E(cat(what, ": found \"", printable(path), "\" with a NUL character at byte ", std::to_string(at),
                "; expected a path without NUL (the operating system would use \"", printable(path.substr(0, at)),
                "\" instead)"),
            EINVAL);
  }
  if (path.empty()) {
    throw E(cat(what, ": found an empty path; expected a file or folder name"), EINVAL);
  }
}

} // namespace zero::detail
