#pragma once
/// \file
/// `step_together`: one optimizer step over the engines of one rank that hold its model between them
/// (the dense parameters' engine and a mixture-of-experts layer's, docs/parallelism.md). Included by
/// engine.hpp; a friend of `basic_engine`, it runs `check_step` and `finish_step` (engine_protocol.hpp) over
/// each engine's state.

#include "zero/core/error.hpp"
#include "zero/engine/engine_protocol.hpp"
#include "zero/engine/engine_types.hpp"
#include "zero/engine/grad_stats.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <tuple>

namespace zero {

/// Steps the engines of one rank that hold its model between them as one optimizer: the dense
/// parameters' engine over the data group and a mixture-of-experts layer's engine over the
/// expert-data group (docs/parallelism.md). Each finishes its reductions and checks its gradients;
/// then every engine clips by the norm of them all (the square root of the sum of their squared
/// norms, each already summed over its own group and model group) and an fp16 overflow in any skips
/// the step in all. Every rank steps the same engines in the same order. \returns each engine's
/// result, with that joint norm. \throws usage_error, before any engine has done anything, when
/// they differ in accumulation steps, gradient clipping or loss scale.
template <class... Engines> std::array<step_result, sizeof...(Engines)> step_together(Engines&... engines) { // NOLINT
  static_assert(sizeof...(Engines) >= 1, "zero::step_together: give it the engines to step");
  const auto& first = std::get<0>(std::tie(engines...));
  const auto same = [&](const auto& e, std::size_t k) {
    const auto say = [&](const std::string& what, const std::string& mine, const std::string& theirs) {
      throw usage_error("step_together: engine " + std::to_string(k) + " has " + what + " " + mine + ", engine 0 has " +
                        theirs + "; engines stepped together take one setting");
    };
    if (e.cfg().gradient_accumulation_steps != first.cfg().gradient_accumulation_steps) {
      say("gradient_accumulation_steps", std::to_string(e.cfg().gradient_accumulation_steps),
          std::to_string(first.cfg().gradient_accumulation_steps));
    }
    if (e.cfg().gradient_clipping != first.cfg().gradient_clipping) {
      say("gradient_clipping", std::to_string(e.cfg().gradient_clipping),
          std::to_string(first.cfg().gradient_clipping));
    }
    if (e.loss_scale() != first.loss_scale()) {
      say("loss scale", std::to_string(e.loss_scale()), std::to_string(first.loss_scale()));
    }
  };
  std::size_t k = 0;
  (same(engines, k++), ...);
  std::array<grad_check, sizeof...(Engines)> checks;
  std::array<step_result, sizeof...(Engines)> results;
  k = 0;
  ((results[k] = detail::check_step(engines.s_, checks[k]), ++k), ...);
  grad_check joint;
  double squares = 0;
  for (const auto& c : checks) {
    joint.overflow = joint.overflow || c.overflow;
    squares += c.squared_norm;
  }
  joint.norm = joint.overflow ? std::numeric_limits<double>::infinity() : std::sqrt(squares);
  k = 0;
  ((results[k] = detail::finish_step(engines.s_, results[k], joint), ++k), ...);
  return results;
}

} // namespace zero
