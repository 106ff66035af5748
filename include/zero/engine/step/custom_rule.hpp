#pragma once
/// \file
/// A framework's own update rule in the engine (docs/optimizers.md, "A framework's own rule"). The config names the
/// rule (`optimizer.type`, registered in `config_inputs::optimizers`); `engine::use_rule<Rule>()` gives the engine
/// its type, which this header erases into one step function per backend the rule runs on (the engine's own, and
/// the host's `cpu_backend` for `offload_optimizer` cpu), held in `adamw_placement::custom_steps` as `std::any`s.
/// `partitioned_adamw` takes the one of its backend and runs it where it runs a built-in rule's `rule_step`.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/dtype.hpp"

#include <any>
#include <array>
#include <cstddef>
#include <functional>
#include <vector>

namespace zero {

/// One backend's step of a framework's rule over `n` elements: `rule_step<Rule>` with the gradients and the
/// low-precision parameters (or null) given by their dtype.
template <class Backend> struct custom_rule_step {
  std::function<void(Backend& backend, float* master, const std::array<float*, max_rule_state>& state,
                     const std::byte* grad, dtype grad_type, std::byte* param, dtype param_type, std::size_t n,
                     const adamw_step_args& args, const typename Backend::stream_type& s)>
      run;
};

/// `Backend`'s step of `Rule` (a type with update_rules.hpp's members), erased: what `use_rule<Rule>()` keeps.
template <class Backend, class Rule> [[nodiscard]] std::any make_custom_rule_step() {
  return custom_rule_step<Backend>{[](Backend& b, float* master, const std::array<float*, max_rule_state>& state,
                                      const std::byte* grad, dtype grad_type, std::byte* param, dtype param_type,
                                      std::size_t n, const adamw_step_args& args,
                                      const typename Backend::stream_type& s) {
    visit_float(grad_type, [&]<class G>(type_tag<G>) {
      visit_float(param_type, [&]<class P>(type_tag<P>) {
        b.template rule_step<Rule>(master, state, reinterpret_cast<const G*>(grad), reinterpret_cast<P*>(param), n,
                                   args, s);
      });
    });
  }};
}

/// The step of `Backend` among `steps` (from `make_custom_rule_step`), or null when none is for it.
template <class Backend>
[[nodiscard]] const custom_rule_step<Backend>* find_custom_rule_step(const std::vector<std::any>& steps) {
  for (const std::any& s : steps) {
    if (const auto* step = std::any_cast<custom_rule_step<Backend>>(&s)) {
      return step;
    }
  }
  return nullptr;
}

} // namespace zero
