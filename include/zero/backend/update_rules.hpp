#pragma once
/// \file
/// The update rules zero runs besides Adam/AdamW, as element functions every backend instantiates: Lion, SGD
/// with momentum (and Nesterov) and Adagrad, with PyTorch's and DeepSpeed's meanings. It lives in backend, beside
/// adamw_args.hpp, because a rule is the contract of the backends' `rule_step` kernel (docs/optimizers.md).
///
/// A rule is a type with:
///
///     static constexpr std::string_view name;                 // DeepSpeed's optimizer.type ("Lion")
///     static constexpr std::size_t max_state;                 // fp32 state tensors beside the master, at most
///     static constexpr std::array<std::string_view, max_state> state_names;  // PyTorch's state keys
///     struct factors { ... };                                 // the per-call constants, trivially copyable
///     static factors make(const adamw_step_args&);            // formed once on the host, in fp32
///     static std::size_t state_count(const adamw_step_args&); // the tensors this configuration keeps
///     template <class Ops, class F> static void apply(const factors&, F& master, F* state, F grad);
///
/// `apply` updates one element, or one vector of lanes (F is `float`, or the CPU backend's vector of floats):
/// `master` the fp32 parameter, `state` its `state_count` state values (read and written in place), `grad` the
/// gradient (the rule scales it by `grad_scale`, which folds in the loss scale's inverse, the accumulation's mean
/// and the clip). Every product, quotient, sum, square root and sign goes through `Ops` (`mul`, `div`, `add`,
/// `sub`, `sqrt`, `sign`; a factor may be a float beside an F), one correctly rounded fp32 operation each, never
/// fused: the CPU backend's `Ops` hide each product from the optimizer (cpu_backend.hpp, "Numerics"), CUDA's use
/// `__fmul_rn` and its kin, so the one function gives the same bits on both, lane by lane. Conditions are on the
/// factors only, the same for every lane.
///
/// The rules, for element i (g = grad[i] * grad_scale, w = master[i]):
///
///     Lion      w = w * (1 - lr * wd)                  // decoupled decay, the product rounded first
///               c = beta1 * m + (1 - beta1) * g
///               w = w - lr * sign(c)                   // sign(0) = 0
///               m = beta2 * m + (1 - beta2) * g
///     SGD       g = g + wd * w                         // only when wd != 0 (L2, as torch.optim.SGD)
///               b = g at the first step, else momentum * b + (1 - dampening) * g   // when momentum != 0
///               g = nesterov ? g + momentum * b : b    // when momentum != 0
///               w = w - lr * g
///     Adagrad   g = g + wd * w                         // only when wd != 0
///               s = s + g * g
///               w = w - clr * (g / (sqrt(s) + eps))    // clr = lr / (1 + (step - 1) * lr_decay)
///
/// with `a * b + c * d` both products rounded, then their sum; SGD without momentum keeps no state.
///
/// A rule may also scale each parameter tensor's update by a ratio of norms taken over the whole tensor (LAMB's
/// trust ratio). Such a rule says `static constexpr bool trust_ratio = true` and supplies, beside `apply`,
///
///     template <class Ops, class F> static void moments(const factors&, F* state, F grad);   // first pass
///     template <class Ops, class F> static F direction(const factors&, F master, const F* state);
///
/// and its step runs in two passes per tensor (partitioned_adamw.hpp): the backend's `rule_norms` updates the
/// state with `moments` and sums master² and direction² over the tensor's elements (in double, per rank, then over
/// the ranks that hold its pieces), `trust_ratio` forms the tensor's ratio, and `rule_step` runs `apply`, which
/// moves the master by the ratio (`adamw_step_args::trust_ratio`, folded into the factors) times the direction:
///
///     LAMB      m = beta1 * m + (1 - beta1) * g          // pass 1, with Adam's grouping: ((1 - beta2) * g) * g
///               v = beta2 * v + ((1 - beta2) * g) * g
///               u = m / (sqrt(v) + eps) + wd * w       // sqrt(v + eps) with eps_inside_sqrt
///               W += w * w, U += u * u                 // over the tensor, in double
///               r = trust_ratio(W, U)                  // ||w|| / ||u|| in [min_coeff, max_coeff], 1 if either is 0
///               w = w - (step_size * r) * u            // pass 2; step_size = lr * sqrt(bc2) / bc1
///
/// (DeepSpeed's FusedLamb: the bias correction scales the step, not the direction the ratio is taken over.)

#include "zero/backend/adamw_args.hpp"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#if defined(__CUDACC__)
#define ZERO_HOST_DEVICE __host__ __device__
#else
#define ZERO_HOST_DEVICE
#endif

namespace zero {

/// The update rules a partitioned optimizer runs: Adam/AdamW (`adamw_step`, its own kernels) and the rules of
/// this file (`rule_step`; LAMB's first pass `rule_norms`); `custom`, a framework's own rule, whose type the engine
/// is given at run time (`engine::use_rule<Rule>()`, zero/engine/step/custom_rule.hpp).
enum class update_rule : std::uint8_t { adamw, lion, sgd, adagrad, lamb, custom };

/// The most fp32 state tensors a rule keeps beside the master copy (Adam's two moments).
inline constexpr std::size_t max_rule_state = 2;

namespace rules {

/// sign(x) of one float: 1, -1, or x itself for 0, -0 and NaN (PyTorch's `sign`, which keeps NaN); what every
/// `Ops::sign` computes per lane.
ZERO_HOST_DEVICE inline float sign_of(float x) noexcept { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }

/// 1 - a * b, the product rounded on its own (formed on the host once per call; volatile keeps a host compiler
/// allowed to contract from fusing it into the subtraction).
inline float one_minus_product(float a, float b) noexcept {
  const volatile float p = a * b;
  return 1.0f - p;
}

/// Lion (Chen et al. 2023; DeepSpeed's `Lion`, lion-pytorch): the sign of an interpolated momentum.
struct lion {
  static constexpr std::string_view name = "Lion";
  static constexpr std::size_t max_state = 1;
  static constexpr std::array<std::string_view, max_state> state_names{"exp_avg"};
  struct factors {
    float grad_scale, lr, decay, beta1, one_minus_beta1, beta2, one_minus_beta2;
  };
  static factors make(const adamw_step_args& a) noexcept {
    return {a.grad_scale, a.lr,          one_minus_product(a.lr, a.weight_decay), a.beta1, 1.0f - a.beta1,
            a.beta2,      1.0f - a.beta2};
  }
  static std::size_t state_count(const adamw_step_args& /*a*/) noexcept { return 1; }
  template <class Ops, class F> ZERO_HOST_DEVICE static void apply(const factors& f, F& w, F* s, F grad) noexcept {
    const F g = Ops::mul(grad, f.grad_scale);
    w = Ops::mul(w, f.decay);
    const F c = Ops::add(Ops::mul(f.beta1, s[0]), Ops::mul(f.one_minus_beta1, g));
    w = Ops::sub(w, Ops::mul(f.lr, Ops::sign(c)));
    s[0] = Ops::add(Ops::mul(f.beta2, s[0]), Ops::mul(f.one_minus_beta2, g));
  }
};

/// SGD with momentum, dampening and Nesterov (torch.optim.SGD; DeepSpeed's type "SGD"): L2 weight decay.
struct sgd {
  static constexpr std::string_view name = "SGD";
  static constexpr std::size_t max_state = 1;
  static constexpr std::array<std::string_view, max_state> state_names{"momentum_buffer"};
  struct factors {
    float grad_scale, lr, weight_decay, momentum, one_minus_dampening;
    bool nesterov, first;
  };
  static factors make(const adamw_step_args& a) noexcept {
    return {a.grad_scale, a.lr, a.weight_decay, a.momentum, 1.0f - a.dampening, a.nesterov, a.step <= 1};
  }
  static std::size_t state_count(const adamw_step_args& a) noexcept { return a.momentum != 0.0f ? 1 : 0; }
  template <class Ops, class F> ZERO_HOST_DEVICE static void apply(const factors& f, F& w, F* s, F grad) noexcept {
    F g = Ops::mul(grad, f.grad_scale);
    if (f.weight_decay != 0.0f) {
      g = Ops::add(g, Ops::mul(f.weight_decay, w));
    }
    if (f.momentum != 0.0f) {
      s[0] = f.first ? g : Ops::add(Ops::mul(f.momentum, s[0]), Ops::mul(f.one_minus_dampening, g));
      g = f.nesterov ? Ops::add(g, Ops::mul(f.momentum, s[0])) : s[0];
    }
    w = Ops::sub(w, Ops::mul(f.lr, g));
  }
};

/// Adagrad (torch.optim.Adagrad; DeepSpeed's type "Adagrad"): L2 weight decay, the lr decayed per step.
struct adagrad {
  static constexpr std::string_view name = "Adagrad";
  static constexpr std::size_t max_state = 1;
  static constexpr std::array<std::string_view, max_state> state_names{"sum"};
  struct factors {
    float grad_scale, clr, weight_decay, eps;
  };
  static factors make(const adamw_step_args& a) noexcept {
    // clr = lr / (1 + (step - 1) * lr_decay), each operation rounded in fp32.
    const volatile float decayed = static_cast<float>(a.step - 1) * a.lr_decay;
    return {a.grad_scale, a.lr / (1.0f + decayed), a.weight_decay, a.eps};
  }
  static std::size_t state_count(const adamw_step_args& /*a*/) noexcept { return 1; }
  template <class Ops, class F> ZERO_HOST_DEVICE static void apply(const factors& f, F& w, F* s, F grad) noexcept {
    F g = Ops::mul(grad, f.grad_scale);
    if (f.weight_decay != 0.0f) {
      g = Ops::add(g, Ops::mul(f.weight_decay, w));
    }
    s[0] = Ops::add(s[0], Ops::mul(g, g));
    const F denom = Ops::add(Ops::sqrt(s[0]), f.eps);
    w = Ops::sub(w, Ops::mul(f.clr, Ops::div(g, denom)));
  }
};

/// LAMB (You et al. 2020; DeepSpeed's `Lamb`, its FusedLamb): Adam's moments, the step scaled per parameter tensor
/// by the trust ratio ||w|| / ||u|| (see the file comment). `scale` is step_size times the tensor's ratio.
struct lamb {
  static constexpr std::string_view name = "Lamb";
  static constexpr std::size_t max_state = 2;
  static constexpr std::array<std::string_view, max_state> state_names{"exp_avg", "exp_avg_sq"};
  static constexpr bool trust_ratio = true;
  struct factors {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, scale;
    bool eps_inside_sqrt;
  };
  /// step_size = lr * sqrt(bias_correction2) / bias_correction1, then times `a.trust_ratio`: each rounded in fp32.
  static factors make(const adamw_step_args& a) noexcept {
    const volatile float root = std::sqrt(a.bias_correction2);
    const volatile float lifted = a.lr * root;
    const volatile float step_size = lifted / a.bias_correction1;
    return {a.grad_scale,     a.beta1, 1.0f - a.beta1, a.beta2,
            1.0f - a.beta2,   a.eps,   a.weight_decay, step_size * a.trust_ratio,
            a.eps_inside_sqrt};
  }
  static std::size_t state_count(const adamw_step_args& /*a*/) noexcept { return 2; }
  /// Pass 1: the moments from the gradient.
  template <class Ops, class F> ZERO_HOST_DEVICE static void moments(const factors& f, F* s, F grad) noexcept {
    const F g = Ops::mul(grad, f.grad_scale);
    s[0] = Ops::add(Ops::mul(f.beta1, s[0]), Ops::mul(f.one_minus_beta1, g));
    s[1] = Ops::add(Ops::mul(f.beta2, s[1]), Ops::mul(Ops::mul(f.one_minus_beta2, g), g));
  }
  /// The direction the trust ratio is taken over and the step moves along: m / (sqrt(v) + eps) + wd * w.
  template <class Ops, class F> ZERO_HOST_DEVICE static F direction(const factors& f, F w, const F* s) noexcept {
    const F denom = f.eps_inside_sqrt ? Ops::sqrt(Ops::add(s[1], f.eps)) : Ops::add(Ops::sqrt(s[1]), f.eps);
    return Ops::add(Ops::div(s[0], denom), Ops::mul(f.weight_decay, w));
  }
  /// Pass 2: the master moved by the scaled direction (the gradient was taken in pass 1).
  template <class Ops, class F> ZERO_HOST_DEVICE static void apply(const factors& f, F& w, F* s, F /*grad*/) noexcept {
    w = Ops::sub(w, Ops::mul(f.scale, direction<Ops>(f, w, s)));
  }
};

/// The trust ratio of one parameter tensor from the sums of its master's squares `w_sq` and its direction's `u_sq`
/// (DeepSpeed's FusedLamb): ||w|| / ||u|| (each norm rounded to fp32, then the quotient), clamped to [min_coeff,
/// max_coeff]; 1 when either norm is 0. A NaN stays NaN (the step of a non-finite gradient is skipped before this).
[[nodiscard]] inline float trust_ratio(double w_sq, double u_sq, float min_coeff, float max_coeff) noexcept {
  const float w = static_cast<float>(std::sqrt(w_sq));
  const float u = static_cast<float>(std::sqrt(u_sq));
  if (w == 0.0f || u == 0.0f) {
    return 1.0f;
  }
  float r = w / u;
  if (r > max_coeff) {
    r = max_coeff;
  }
  if (r < min_coeff) {
    r = min_coeff;
  }
  return r;
}

/// True when rule `R` scales each tensor's update by a trust ratio (two passes, `rule_norms` first).
template <class R> inline constexpr bool has_trust_ratio = requires { requires R::trust_ratio; };

} // namespace rules

/// DeepSpeed's name of a rule: "AdamW" (Adam's too), "Lion", "SGD", "Adagrad", "Lamb".
[[nodiscard]] constexpr std::string_view name_of(update_rule r) noexcept {
  switch (r) {
  case update_rule::lion:
    return rules::lion::name;
  case update_rule::sgd:
    return rules::sgd::name;
  case update_rule::adagrad:
    return rules::adagrad::name;
  case update_rule::lamb:
    return rules::lamb::name;
  case update_rule::custom:
    return "custom";
  case update_rule::adamw:
    break;
  }
  return "AdamW";
}

/// Calls `f(type_tag)` with the rule type of `r` (`rules::lion`, ...); `r` must be one of this file's rules, not
/// `adamw` (which runs `adamw_step`) nor `custom` (whose type the engine holds erased). Returns what `f` returns.
template <class F> decltype(auto) visit_rule(update_rule r, F&& f) {
  switch (r) {
  case update_rule::lion:
    return std::forward<F>(f)(std::type_identity<rules::lion>{});
  case update_rule::sgd:
    return std::forward<F>(f)(std::type_identity<rules::sgd>{});
  case update_rule::lamb:
    return std::forward<F>(f)(std::type_identity<rules::lamb>{});
  case update_rule::adagrad:
  case update_rule::adamw:
  case update_rule::custom:
    break;
  }
  return std::forward<F>(f)(std::type_identity<rules::adagrad>{});
}

/// The fp32 state tensors rule `r` keeps per element beside the master copy for `a`'s hyper-parameters, and
/// their names (PyTorch's state keys): AdamW and LAMB exp_avg and exp_avg_sq, Lion exp_avg, SGD momentum_buffer
/// (none without momentum), Adagrad sum.
[[nodiscard]] inline std::pair<std::size_t, std::array<std::string_view, max_rule_state>>
rule_state(update_rule r, const adamw_step_args& a) {
  if (r == update_rule::adamw) {
    return {2, {"exp_avg", "exp_avg_sq"}};
  }
  return visit_rule(r, [&]<class R>(std::type_identity<R>) {
    std::array<std::string_view, max_rule_state> names{};
    for (std::size_t i = 0; i < R::max_state; ++i) {
      names[i] = R::state_names[i];
    }
    return std::pair{R::state_count(a), names};
  });
}

} // namespace zero
