#pragma once
/// \file
/// `detail::visit_made`: calls a function with the part an engine made at `finalize()`, held in a
/// variant whose first alternative, `std::monostate`, means "not made yet".

#include "zero/core/error.hpp"

#include <type_traits>
#include <utility>
#include <variant>

namespace zero::detail {

/// Calls `f` with the alternative `v` holds and returns what `f` returns for `Typical` (every
/// alternative gives the same type). \throws usage_error(`unmade`) while `v` holds `std::monostate`.
template <class Typical, class V, class F> decltype(auto) visit_made(V& v, F& f, const char* unmade) {
  using held = std::conditional_t<std::is_const_v<V>, const Typical&, Typical&>;
  using result = decltype(f(std::declval<held>()));
  return std::visit(
      [&](auto& part) -> result {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(part)>, std::monostate>) {
          throw usage_error(unmade);
        } else {
          return f(part);
        }
      },
      v);
}

} // namespace zero::detail
