#pragma once
// Signum, the framework's own update rule of examples/custom_rule (and of the tests that run a framework's rule:
// tests/engine/signum_rule.hpp). Nothing here is zero's but the members zero/backend/update_rules.hpp asks of a rule.

#include <array>
#include <cstddef>
#include <string_view>
#include <zero/backend/adamw_args.hpp>
#include <zero/backend/update_rules.hpp>

/// Signum (Bernstein et al. 2018): b = momentum b + (1 - momentum) g; w = w (1 - lr wd) - lr sign(b). The members
/// zero/backend/update_rules.hpp asks of a rule, and `params`, the optimizer.params keys it takes.
struct signum {
  static constexpr std::string_view name = "Signum";
  static constexpr std::size_t max_state = 1;
  static constexpr std::array<std::string_view, max_state> state_names{"momentum_buffer"};
  static constexpr std::array<std::string_view, 3> params{"lr", "momentum", "weight_decay"};
  struct factors {
    float grad_scale, lr, decay, momentum, one_minus_momentum;
  };
  static factors make(const zero::adamw_step_args& a) noexcept {
    return {a.grad_scale, a.lr, zero::rules::one_minus_product(a.lr, a.weight_decay), a.momentum, 1.0f - a.momentum};
  }
  static std::size_t state_count(const zero::adamw_step_args& /*a*/) noexcept { return 1; }
  /// One element, or one vector of lanes: every operation through Ops, so each backend gives the same bits;
  /// ZERO_HOST_DEVICE, so that a `.cu` can instantiate it for the GPU too (ZERO_CUDA_RULE_STEP,
  /// zero/kernels/rules.cuh).
  template <class Ops, class F> ZERO_HOST_DEVICE static void apply(const factors& f, F& w, F* s, F grad) noexcept {
    const F g = Ops::mul(grad, f.grad_scale);
    s[0] = Ops::add(Ops::mul(f.momentum, s[0]), Ops::mul(f.one_minus_momentum, g));
    w = Ops::sub(Ops::mul(w, f.decay), Ops::mul(f.lr, Ops::sign(s[0])));
  }
};
