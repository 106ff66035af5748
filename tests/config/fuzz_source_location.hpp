#pragma once
// Force-included into the config fuzzer only. Clang 14 with libstdc++ 12 (Debian 12's pair) has no
// std::source_location: libstdc++ defines it only with __builtin_source_location, which arrived in
// clang 15. zero's error.hpp names the type for messages about native calls, which the config
// reader never makes, so a stand-in that names nothing lets the fuzzer build with that clang.
#include <source_location>
#if !defined(__cpp_lib_source_location)
namespace std {
struct source_location {
  static constexpr source_location current() noexcept { return {}; }
  constexpr const char* file_name() const noexcept { return "?"; }
  constexpr const char* function_name() const noexcept { return "?"; }
  constexpr unsigned line() const noexcept { return 0; }
  constexpr unsigned column() const noexcept { return 0; }
};
} // namespace std
#endif
