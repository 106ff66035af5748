#pragma once
/// \file
/// The manifest's optional "optimizer" block (manifest.hpp's file comment): which update rule's state the shard
/// files hold and the names of its tensors, and its parser, which holds them to the rules zero runs
/// (zero/backend/update_rules.hpp).

#include "zero/backend/update_rules.hpp"
#include "zero/checkpoint/detail/manifest_fields.hpp"
#include "zero/config/detail/reader.hpp" // detail::show
#include "zero/core/detail/printable.hpp"
#include "zero/core/detail/text.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zero::checkpoint {

/// The update rule whose state the shard files hold (the manifest's optional "optimizer" block): its name
/// (`name_of(update_rule)`) and its state tensors' names, in the order of a piece. Absent: AdamW's.
struct optimizer_entry {
  std::string type = "AdamW";
  std::vector<std::string> state{"exp_avg", "exp_avg_sq"};
  friend bool operator==(const optimizer_entry&, const optimizer_entry&) = default;
};

namespace detail {

/// The manifest's "optimizer" block (`top`'s): a rule zero runs and the names of its state tensors, which must
/// be that rule's (update_rules.hpp), in its order.
inline optimizer_entry parse_optimizer(const fields& top) {
  const fields o(top.at("optimizer"), top.source(), "optimizer");
  optimizer_entry e;
  e.type = o.str("type");
  e.state.clear();
  const nlohmann::json& state = o.array("state");
  for (const nlohmann::json& v : state) {
    if (!v.is_string() || e.state.size() >= max_rule_state) {
      o.fail("state", cat("found ", zero::detail::show(state), ", expected at most ", std::to_string(max_rule_state),
                          " tensor names"));
    }
    e.state.push_back(v.get<std::string>());
  }
  // The names each rule may keep: its tensors in order (SGD without momentum none, its first with).
  for (update_rule r :
       {update_rule::adamw, update_rule::lion, update_rule::sgd, update_rule::adagrad, update_rule::lamb}) {
    if (name_of(r) != e.type) {
      continue;
    }
    adamw_step_args most;
    most.momentum = 1.0f;
    const auto [count, names] = rule_state(r, most);
    bool fits = e.state.size() == count || (r == update_rule::sgd && e.state.empty());
    for (std::size_t i = 0; fits && i < e.state.size(); ++i) {
      fits = e.state[i] == names[i];
    }
    if (!fits) {
      std::string want;
      for (std::size_t i = 0; i < count; ++i) {
        want += cat(i == 0 ? "" : ", ", "\"", std::string(names[i]), "\"");
      }
      o.fail("state", cat("found ", zero::detail::show(state), ", expected ", e.type, "'s [", want, "]",
                          r == update_rule::sgd ? " or [] (no momentum)" : ""));
    }
    return e;
  }
  // A framework's own rule (custom_optimizer): any name, which the engine that loads compares with its own.
  const bool plain = std::all_of(e.type.begin(), e.type.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (e.type.empty() || e.type.size() > 64 || !plain) {
    o.fail("type",
           cat("found \"", zero::detail::printable(e.type.substr(0, 40)),
               "\", expected \"AdamW\", \"Lion\", \"SGD\", \"Adagrad\", \"Lamb\" or a framework's rule's name (1 "
               "to 64 printable characters)"));
  }
  return e;
}

} // namespace detail
} // namespace zero::checkpoint
