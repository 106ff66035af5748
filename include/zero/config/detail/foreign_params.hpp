#pragma once
/// \file
/// The parameters of a block whose type decides them (the optimizer's and the schedule's `params`): DeepSpeed
/// passes them to the type's constructor, so a key another type takes is refused here by name, saying what this
/// type takes, which types take the key, and where a key people misplace belongs.

#include "zero/config/detail/reader.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace zero::detail {

/// Fails every key of `params` that `owner` does not take (`allowed`, a range of key names): names what it takes,
/// then `others(key)` (who else takes the key, or ""), then where a key people misplace belongs.
template <class Allowed, class Others>
void refuse_keys_outside(parse_context& ctx, const object_reader& p, const json* params, std::string_view owner,
                         const Allowed& allowed, Others&& others) {
  if (params == nullptr || !params->is_object()) {
    return;
  }
  for (auto it = params->begin(); it != params->end(); ++it) {
    if (std::find(std::begin(allowed), std::end(allowed), it.key()) != std::end(allowed)) {
      continue;
    }
    std::string takes;
    for (const auto& k : allowed) {
      takes += cat(takes.empty() ? "" : ", ", std::string_view(k));
    }
    const std::string_view hint = misplaced_key_hint(it.key());
    ctx.fail(p.path_of(it.key()),
             cat("not a parameter of ", owner, " (it takes ", takes.empty() ? std::string("none") : takes, ")",
                 others(it.key()), (hint.empty() ? "" : cat("; or use ", std::string(hint)))));
  }
}

/// Fails every key of `params` that `type` does not take (`params_of(type)`): DeepSpeed passes them to the
/// optimizer's or schedule's constructor, which has no such argument. Names what `type` takes and which other
/// types of `types` take the key.
template <class T, std::size_t N, class ParamsOf>
void refuse_foreign_params(parse_context& ctx, const object_reader& p, const json* params, T type,
                           const choice<T> (&types)[N], ParamsOf params_of) {
  refuse_keys_outside(ctx, p, params, name_of(type), params_of(type), [&](const std::string& key) {
    std::string takers;
    int taker_count = 0;
    for (const auto& c : types) {
      const auto theirs = params_of(c.value);
      if (std::find(theirs.begin(), theirs.end(), key) != theirs.end()) {
        takers += cat(takers.empty() ? "" : " and ", c.name);
        ++taker_count;
      }
    }
    return takers.empty() ? std::string() : cat("; ", takers, taker_count == 1 ? " takes it" : " take it");
  });
}

} // namespace zero::detail
