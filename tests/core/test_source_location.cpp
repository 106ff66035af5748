#include "zero/core/error.hpp"
#include "zero/core/source_location.hpp"

#include <doctest/doctest.h>
#include <string>
#include <string_view>

namespace {
// A checker like ZERO_CHECK_CUDA's: the location defaults to its caller's.
zero::detail::source_location caller_of(zero::detail::source_location loc = zero::detail::source_location::current()) {
  return loc;
}
} // namespace

TEST_CASE("source_location names the caller's file, line and function, with either standard library") {
  const unsigned line = __LINE__ + 1;
  const auto loc = zero::detail::source_location::current();
  CHECK(loc.line() == line);
  CHECK(std::string_view(loc.file_name()).ends_with("test_source_location.cpp"));
  CHECK(std::string_view(loc.function_name()).find("DOCTEST_ANON_FUNC") != std::string_view::npos);
  CHECK(zero::detail::where(loc) == "test_source_location.cpp:" + std::to_string(line));

  SUBCASE("a default argument is evaluated where the call is made") {
    const unsigned call_line = __LINE__ + 1;
    const auto from_caller = caller_of();
    CHECK(from_caller.line() == call_line);
  }
  SUBCASE("a default-constructed location is empty") {
    const zero::detail::source_location none;
    CHECK(none.line() == 0);
    CHECK(std::string_view(none.file_name()).empty());
  }
}
