#pragma once
/// \file
/// The type and parameters of a block whose type decides them (the optimizer's and the schedule's `params`):
/// DeepSpeed passes them to the type's constructor, so a key another type takes is refused here by name, saying what
/// this type takes, which types take the key, and where a key people misplace belongs; and a type that is none of
/// the block's is refused naming what else it could be.

#include "zero/config/detail/reader.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zero::detail {

/// Fails a `type` string of `block` that names none of `types` (in any case): names them, then `alternative` (what
/// else the type may name), then "did you mean" for a near miss. A type that is not a string, or "auto", is left to
/// the type's reader.
template <class E, std::size_t N>
void refuse_unknown_type(const parse_context& ctx, const json& block, std::string_view path,
                         const choice<E> (&types)[N], std::string_view alternative) {
  const auto t = block.find("type");
  if (t == block.end() || !t->is_string() || is_auto(*t)) {
    return;
  }
  const std::string& s = t->get_ref<const std::string&>();
  std::string allowed;
  std::vector<std::string_view> names;
  for (const auto& c : types) {
    if (ascii_lower(s) == ascii_lower(c.name)) {
      return;
    }
    allowed += cat(allowed.empty() ? "\"" : ", \"", c.name, "\"");
    names.push_back(c.name);
  }
  std::string msg = cat("found ", show(*t), "; expected one of ", allowed, ", or ", alternative);
  if (auto near = closest_match(s, names); !near.empty()) {
    msg += cat("; did you mean \"", std::string(near), "\"?");
  }
  ctx.fail(path, msg);
}

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
