#pragma once
/// \file
/// `zero::detail::source_location`: where a native call was made, for error messages. It is
/// `std::source_location` where the standard library provides it, and otherwise a stand-in built
/// on the compiler's `__builtin_FILE()`, `__builtin_LINE()` and `__builtin_FUNCTION()`: Clang 14
/// with libstdc++ 12 (Debian 12's pair) has no `std::source_location`, because libstdc++ defines it
/// only with `__builtin_source_location`, which arrived in Clang 15.

#include <version>
#if __has_include(<source_location>)
#include <source_location>
#endif

namespace zero::detail {

#if defined(__cpp_lib_source_location) && __cpp_lib_source_location >= 201907L
/// The standard library's source location.
using source_location = std::source_location;
#else
// GCC has no __builtin_COLUMN; Clang has had it as long as the others.
#if defined(__has_builtin) && __has_builtin(__builtin_COLUMN)
#define ZERO_DETAIL_BUILTIN_COLUMN __builtin_COLUMN()
#else
#define ZERO_DETAIL_BUILTIN_COLUMN 0
#endif
/// A stand-in for `std::source_location` with the same members, for standard libraries without it.
/// `current()` is evaluated where it is called, as the standard one is, because the builtins sit in
/// its default arguments.
class source_location {
public:
  /// The location of the call to `current()`.
  /// \param file, function, line, column filled in by the compiler; never pass them.
  [[nodiscard]] static constexpr source_location current(const char* file = __builtin_FILE(),
                                                         const char* function = __builtin_FUNCTION(),
                                                         unsigned line = __builtin_LINE(),
                                                         unsigned column = ZERO_DETAIL_BUILTIN_COLUMN) noexcept {
    source_location loc;
    loc.file_ = file;
    loc.function_ = function;
    loc.line_ = line;
    loc.column_ = column;
    return loc;
  }

  /// An unknown location: empty names, line and column 0.
  constexpr source_location() noexcept = default;

  /// The source file's name as the compiler saw it.
  [[nodiscard]] constexpr const char* file_name() const noexcept { return file_; }
  /// The enclosing function's name, "" outside a function.
  [[nodiscard]] constexpr const char* function_name() const noexcept { return function_; }
  /// The line, from 1; 0 when unknown.
  [[nodiscard]] constexpr unsigned line() const noexcept { return line_; }
  /// The column, from 1; 0 when unknown or when the compiler cannot tell.
  [[nodiscard]] constexpr unsigned column() const noexcept { return column_; }

private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
  unsigned column_ = 0;
};
#undef ZERO_DETAIL_BUILTIN_COLUMN
#endif

} // namespace zero::detail
