#pragma once
/// \file
/// The parameters of a block whose type decides them (the optimizer's and the schedule's `params`): DeepSpeed
/// passes them to the type's constructor, so a key another type takes is refused here by name, saying what this
/// type takes, which types take the key, and where a key people misplace belongs.

#include "zero/config/detail/reader.hpp"

#include <cstddef>
#include <string>
#include <string_view>

namespace zero::detail {

/// Fails every key of `params` that `type` does not take (`params_of(type)`): DeepSpeed passes them to the
/// optimizer's or schedule's constructor, which has no such argument. Names what `type` takes and which other
/// types of `types` take the key.
template <class T, std::size_t N, class ParamsOf>
void refuse_foreign_params(parse_context& ctx, const object_reader& p, const json* params, T type,
                           const choice<T> (&types)[N], ParamsOf params_of) {
  if (params == nullptr || !params->is_object()) {
    return;
  }
  const auto takes = [&](T t, std::string_view key) {
    for (std::string_view k : params_of(t)) {
      if (k == key) {
        return true;
      }
    }
    return false;
  };
  for (auto it = params->begin(); it != params->end(); ++it) {
    if (takes(type, it.key())) {
      continue;
    }
    std::string allowed;
    for (auto k : params_of(type)) {
      allowed += cat(allowed.empty() ? "" : ", ", k);
    }
    std::string takers;
    int taker_count = 0;
    for (const auto& c : types) {
      if (takes(c.value, it.key())) {
        takers += cat(takers.empty() ? "" : " and ", c.name);
        ++taker_count;
      }
    }
    const std::string_view hint = misplaced_key_hint(it.key());
    ctx.fail(p.path_of(it.key()),
             cat("not a parameter of ", name_of(type), " (it takes ", allowed, ")",
                 (takers.empty() ? "" : cat("; ", takers, taker_count == 1 ? " takes it" : " take it")),
                 (hint.empty() ? "" : cat("; or use ", std::string(hint)))));
  }
}

} // namespace zero::detail
