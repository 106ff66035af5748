#pragma once
/// \file
/// The portable scalar kernels of `zero::cpu_backend`, one chunk at a time, and the element
/// functions the SIMD kernels (cpu_kernels_simd.hpp, instantiated by cpu_kernels_avx2.hpp and
/// cpu_kernels_avx512.hpp) finish their tails with.
///
/// Every variant evaluates the formulas of cpu_backend.hpp's "Numerics" section: fp32 operations,
/// each rounded on its own, in the order written there, never a fused multiply-add. The compiler
/// may not keep that by itself: GCC fuses `a * b + c` into an FMA whenever the target has one
/// (`-mfma`, `-march=haswell` and later, and always inside an AVX-512 function) in every C++ mode,
/// `-std=c++20` included, across statements and across intrinsics; Clang does within one
/// expression by default and everywhere under `-ffp-contract=fast`. So every product that feeds an
/// addition or subtraction goes through `product` (or its vector twin), which the compiler cannot
/// see through: the bits do not depend on `-ffp-contract`, `-march` or the compiler.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/dtype.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zero::detail::cpu {

/// Returns `x` unchanged, through an empty `asm` the optimizer cannot look into: a product passed
/// through it is rounded to fp32 and never fused with the addition that uses it. Costs no instruction.
inline float no_fuse(float x) noexcept {
#if defined(__GNUC__) && defined(__x86_64__)
  __asm__("" : "+x"(x));
#elif defined(__GNUC__) && defined(__aarch64__)
  __asm__("" : "+w"(x));
#else
  // Elsewhere a volatile round trip: slower, but no compiler fuses through it.
  volatile float v = x;
  x = v;
#endif
  return x;
}

/// a * b rounded to fp32 on its own (never fused with the addition that uses it).
inline float product(float a, float b) noexcept { return no_fuse(a * b); }

/// The per-call factors of one AdamW step, computed once in fp32 from `adamw_step_args`:
/// step_size = lr / bias_correction1, sqrt_bc2 = sqrt(bias_correction2),
/// decay = 1 - (lr * weight_decay) (the product rounded first), one_minus_beta = 1 - beta.
struct adamw_consts {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float grad_scale;
  float step_size;
  float sqrt_bc2;
  float decay;
  bool adam_w_mode;

  static adamw_consts from(const adamw_step_args& a) noexcept {
    adamw_consts c{};
    c.beta1 = a.beta1;
    c.beta2 = a.beta2;
    c.one_minus_beta1 = 1.0f - a.beta1;
    c.one_minus_beta2 = 1.0f - a.beta2;
    c.eps = a.eps;
    c.weight_decay = a.weight_decay;
    c.grad_scale = a.grad_scale;
    c.step_size = a.lr / a.bias_correction1;
    c.sqrt_bc2 = std::sqrt(a.bias_correction2);
    c.decay = 1.0f - product(a.lr, a.weight_decay);
    c.adam_w_mode = a.adam_w_mode;
    return c;
  }
};

/// Reads one element as float (exact for every supported type).
template <class T> inline float load1(const T* p) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    return *p;
  } else {
    return static_cast<float>(*p);
  }
}

/// Stores one float as `T`, rounding to nearest even for the half types.
template <class T> inline void store1(T* p, float x) noexcept { *p = from_float<T>(x); }

/// The fp32 operations of an update rule on the host (update_rules.hpp): each rounded on its own, a product
/// never fused with the sum that uses it.
struct host_ops {
  static float mul(float a, float b) noexcept { return product(a, b); }
  static float div(float a, float b) noexcept { return a / b; }
  static float add(float a, float b) noexcept { return a + b; }
  static float sub(float a, float b) noexcept { return a - b; }
  static float sqrt(float a) noexcept { return std::sqrt(a); }
  static float sign(float a) noexcept { return rules::sign_of(a); }
};

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
/// The lanes `host_vec_ops` computes at once: 16 bytes, the vector every x86-64 and AArch64 target has (GCC's and
/// Clang's vector extension, so the same code for both and for every -march).
inline constexpr std::size_t rule_lanes = 4;
using rule_vec = float __attribute__((vector_size(16)));
using rule_mask = std::int32_t __attribute__((vector_size(16)));

/// `host_ops` lane by lane over `rule_vec`, a float factor broadcast to every lane: the same operations in the
/// same order, so the same bits as one element at a time.
struct host_vec_ops {
  static rule_vec vec(rule_vec a) noexcept { return a; }
  static rule_vec vec(float a) noexcept { return rule_vec{a, a, a, a}; }
  template <class A, class B> static rule_vec mul(A a, B b) noexcept {
    rule_vec p = vec(a) * vec(b);
#if defined(__x86_64__)
    __asm__("" : "+x"(p)); // hidden from the optimizer: never fused into an FMA with the sum that uses it
#else
    __asm__("" : "+w"(p));
#endif
    return p;
  }
  template <class A, class B> static rule_vec div(A a, B b) noexcept { return vec(a) / vec(b); }
  template <class A, class B> static rule_vec add(A a, B b) noexcept { return vec(a) + vec(b); }
  template <class A, class B> static rule_vec sub(A a, B b) noexcept { return vec(a) - vec(b); }
  static rule_vec sqrt(rule_vec a) noexcept {
#if defined(__x86_64__)
    return __builtin_ia32_sqrtps(a); // SSE's sqrtps: IEEE's correctly rounded square root, lane by lane
#else
    for (std::size_t i = 0; i < rule_lanes; ++i) {
      a[i] = std::sqrt(a[i]);
    }
    return a;
#endif
  }
  /// `rules::sign_of` per lane: 1 where a > 0, -1 where a < 0, a itself elsewhere (0, -0, NaN): where a is
  /// either, its sign bit on 1.0's bits.
  static rule_vec sign(rule_vec a) noexcept {
    const rule_vec zero{};
    const rule_mask nonzero = (a > zero) | (a < zero);
    const rule_mask bits = reinterpret_cast<rule_mask>(a);
    const rule_mask unit = (bits & static_cast<std::int32_t>(0x80000000u)) | 0x3f800000; // +-1.0f
    return reinterpret_cast<rule_vec>((nonzero & unit) | (~nonzero & bits));
  }
};

using rule_u32 = std::uint32_t __attribute__((vector_size(16)));
using rule_u16 = std::uint16_t __attribute__((vector_size(8)));

/// `rule_lanes` elements of `p` as floats (exact): fp32 copied, bf16 widened in the vector unit, f16 one by one.
template <class T> inline rule_vec load_lanes(const T* p) noexcept {
  rule_vec out;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(&out, p, sizeof out);
  } else if constexpr (std::is_same_v<T, bf16>) {
    rule_u16 h;
    std::memcpy(&h, p, sizeof h);
    const rule_u32 w = __builtin_convertvector(h, rule_u32) << 16;
    std::memcpy(&out, &w, sizeof out);
  } else {
    for (std::size_t k = 0; k < rule_lanes; ++k) {
      out[k] = load1(p + k);
    }
  }
  return out;
}

/// Stores `v`'s lanes into `p` as `store1` would, lane by lane: fp32 copied, bf16 rounded to nearest even in the
/// vector unit (a NaN kept quiet, bf16::from_float's rule), f16 one by one.
template <class T> inline void store_lanes(T* p, rule_vec v) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(p, &v, sizeof v);
  } else if constexpr (std::is_same_v<T, bf16>) {
    rule_u32 x;
    std::memcpy(&x, &v, sizeof x);
    const rule_u32 nan = (x & 0x7fffffffu) > 0x7f800000u; // all ones where NaN
    const rule_u32 rounded = (x + (0x7fffu + ((x >> 16) & 1u))) >> 16;
    const rule_u32 quiet = (x >> 16) | 0x0040u;
    const rule_u32 bits16 = (nan & quiet) | (~nan & rounded); // each below 2^16
#if defined(__x86_64__)
    // SSE2's signed pack, moved to the signed range and back: one instruction for the four lanes' low halves.
    using i32x4 = std::int32_t __attribute__((vector_size(16)));
    const auto centred = reinterpret_cast<i32x4>(bits16 - 0x8000u);
    const auto packed = reinterpret_cast<rule_u32>(__builtin_ia32_packssdw128(centred, centred)) ^ 0x80008000u;
    rule_u16 h;
    std::memcpy(&h, &packed, sizeof h);
#else
    const rule_u16 h = __builtin_convertvector(bits16, rule_u16);
#endif
    std::memcpy(static_cast<void*>(p), &h, sizeof h); // bf16 is trivially copyable
  } else {
    for (std::size_t k = 0; k < rule_lanes; ++k) {
      store1(p + k, v[k]);
    }
  }
}
#else
inline constexpr std::size_t rule_lanes = 0;
#endif

/// One rule's step over [0, n) of a chunk: `state[j]` are its `count` state tensors. `rule_lanes` elements at a
/// time with `host_vec_ops`, the last few in one vector padded with zeros (without the vector extension, one by
/// one with `host_ops`): the same bits as `host_ops` element by element.
template <class Rule, class G, class P>
inline void rule_chunk(const typename Rule::factors& factors, float* master, float* const* state, std::size_t count,
                       const G* grad, P* param, std::size_t n) noexcept {
  const typename Rule::factors f = factors; // a copy no store below can alias: its broadcasts leave the loop
  constexpr std::size_t slots = Rule::max_state > 0 ? Rule::max_state : 1;
  count = count < slots ? count : slots; // Rule::state_count never exceeds max_state; this says so to the compiler
  float* st[slots]{};                    // the state pointers, held where no store can change them
  for (std::size_t j = 0; j < count; ++j) {
    st[j] = state[j];
  }
  std::size_t i = 0;
  // The state loops run over the rule's slots, a constant, so each tensor's value stays in a register.
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
  for (; i + rule_lanes <= n; i += rule_lanes) {
    rule_vec w = load_lanes(master + i);
    rule_vec s[slots]{};
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        s[j] = load_lanes(st[j] + i);
      }
    }
    Rule::template apply<host_vec_ops>(f, w, s, load_lanes(grad + i));
    store_lanes(master + i, w);
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        store_lanes(st[j] + i, s[j]);
      }
    }
    if (param != nullptr) {
      store_lanes(param + i, w);
    }
  }
  // The last n - i < rule_lanes elements through one vector, its other lanes zero and dropped.
  const std::size_t rest = n - i;
  if (rest == 0) {
    return;
  }
  rule_vec w{};
  rule_vec g{};
  rule_vec s[slots]{};
  for (std::size_t k = 0; k < rest && k < rule_lanes; ++k) {
    w[k] = master[i + k];
    g[k] = load1(grad + i + k);
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        s[j][k] = st[j][i + k];
      }
    }
  }
  Rule::template apply<host_vec_ops>(f, w, s, g);
  for (std::size_t k = 0; k < rest && k < rule_lanes; ++k) {
    master[i + k] = w[k];
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        st[j][i + k] = s[j][k];
      }
    }
    if (param != nullptr) {
      store1(param + i + k, w[k]);
    }
  }
#else
  for (; i < n; ++i) {
    float s[slots]{};
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        s[j] = st[j][i];
      }
    }
    float w = master[i];
    Rule::template apply<host_ops>(f, w, s, load1(grad + i));
    master[i] = w;
    for (std::size_t j = 0; j < slots; ++j) {
      if (j < count) {
        st[j][i] = s[j];
      }
    }
    if (param != nullptr) {
      store1(param + i, w);
    }
  }
#endif
}

/// The first pass of a rule with a trust ratio (update_rules.hpp: LAMB) over [0, n) of a chunk: `Rule::moments` on
/// every element's state, then the sums of master² and of `Rule::direction`² in double, element by element in
/// order (each square exact in double), into `sums[0]` and `sums[1]`.
template <class Rule, class G>
inline void rule_norms_chunk(const typename Rule::factors& f, const float* master, float* const* state, const G* grad,
                             std::size_t n, double* sums) noexcept {
  constexpr std::size_t slots = Rule::max_state > 0 ? Rule::max_state : 1;
  double w_sq = 0.0;
  double u_sq = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    float s[slots]{};
    for (std::size_t j = 0; j < Rule::max_state; ++j) {
      s[j] = state[j][i];
    }
    Rule::template moments<host_ops>(f, s, load1(grad + i));
    for (std::size_t j = 0; j < Rule::max_state; ++j) {
      state[j][i] = s[j];
    }
    const double w = master[i];
    const double u = Rule::template direction<host_ops>(f, master[i], s);
    w_sq += w * w;
    u_sq += u * u;
  }
  sums[0] = w_sq;
  sums[1] = u_sq;
}

/// True when the stored element is inf or NaN (its exponent bits are all ones).
template <class T> inline bool nonfinite1(const T* p) noexcept {
  if constexpr (std::is_same_v<T, float>) {
    std::uint32_t b;
    std::memcpy(&b, p, 4);
    return (b & 0x7f800000u) == 0x7f800000u;
  } else if constexpr (std::is_same_v<T, f16>) {
    return (p->bits & 0x7c00u) == 0x7c00u;
  } else {
    return (p->bits & 0x7f80u) == 0x7f80u;
  }
}

/// One element of the AdamW/Adam step, in the order of cpu_backend.hpp's "Numerics"; every SIMD
/// lane does exactly this.
template <bool AdamW> inline void adamw1(float& p, float& m, float& v, float grad, const adamw_consts& c) noexcept {
  float g = product(grad, c.grad_scale);
  if constexpr (!AdamW) {
    g = g + product(c.weight_decay, p);
  }
  m = product(c.beta1, m) + product(c.one_minus_beta1, g);
  v = product(c.beta2, v) + product(c.one_minus_beta2 * g, g);
  if constexpr (AdamW) {
    p = product(p, c.decay);
  }
  const float denom = std::sqrt(v) / c.sqrt_bc2 + c.eps;
  p = p - c.step_size * m / denom;
}

/// The state an AdamW chunk reads (fp32 master, m, v)...
struct adamw_state_in {
  const float* master;
  const float* m;
  const float* v;
};
/// ...and where it writes the new state: the same pointers to update in place, or buffers that
/// overlap none of the input's (the previous state is then kept).
struct adamw_state_out {
  float* master;
  float* m;
  float* v;
};

/// Elements [i, n) of one AdamW chunk; `param` may be null.
template <bool AdamW, class G, class P>
inline void adamw_tail(const adamw_state_in& in, const adamw_state_out& out, const G* grad, P* param, std::size_t i,
                       std::size_t n, const adamw_consts& c) noexcept {
  for (; i < n; ++i) {
    float p = in.master[i];
    float m = in.m[i];
    float v = in.v[i];
    adamw1<AdamW>(p, m, v, load1(grad + i), c);
    out.m[i] = m;
    out.v[i] = v;
    out.master[i] = p;
    if (param != nullptr) {
      store1(param + i, p);
    }
  }
}

/// Number of interleaved partial sums of `squared_norm` within a chunk: element i of a chunk goes
/// to accumulator i % 16, and the 16 accumulators are then added as a fixed tree
/// (j += j + 8, then j += j + 4, j += j + 2, j += j + 1). Scalar, AVX2 and AVX-512 all follow it.
inline constexpr std::size_t norm_lanes = 16;

/// Adds x[i]^2 (the square rounded first) for i in [i, n) into the interleaved accumulators, lane i % 16.
template <class T> inline void squared_norm_tail(const T* x, std::size_t i, std::size_t n, float* acc) noexcept {
  for (; i < n; ++i) {
    const float f = load1(x + i);
    acc[i % norm_lanes] = acc[i % norm_lanes] + product(f, f);
  }
}

/// The fixed tree over the 16 accumulators.
inline float reduce_lanes(float* acc) noexcept {
  for (std::size_t w = norm_lanes / 2; w >= 1; w /= 2) {
    for (std::size_t j = 0; j < w; ++j) {
      acc[j] = acc[j] + acc[j + w];
    }
  }
  return acc[0];
}

/// Elements [i, n) of a cast chunk: dst[i] = D(src[i]).
template <class S, class D> inline void cast_tail(const S* src, D* dst, std::size_t i, std::size_t n) noexcept {
  for (; i < n; ++i) {
    store1(dst + i, load1(src + i));
  }
}

/// Elements [i, n) of an unscale_and_check chunk: x[i] = T(x[i] * factor); true when a stored value
/// is inf or NaN.
template <class T> inline bool unscale_and_check_tail(T* x, std::size_t i, std::size_t n, float factor) noexcept {
  bool found = false;
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
    found = found || nonfinite1(x + i);
  }
  return found;
}

/// Elements [i, n) of an accumulate chunk: dst[i] = D(float(dst[i]) + float(src[i])).
template <class S, class D> inline void accumulate_tail(const S* src, D* dst, std::size_t i, std::size_t n) noexcept {
  for (; i < n; ++i) {
    store1(dst + i, load1(dst + i) + load1(src + i));
  }
}

/// Elements [i, n) of a scale chunk: x[i] = T(float(x[i]) * factor).
template <class T> inline void scale_tail(T* x, std::size_t i, std::size_t n, float factor) noexcept {
  for (; i < n; ++i) {
    store1(x + i, load1(x + i) * factor);
  }
}

namespace scalar {

/// The portable chunk kernels, under the names `cpu_backend` dispatches to (the same as
/// `avx2::kernels` and `avx512::kernels`).
struct kernels {
  /// The rules' vector loops of the SIMD levels have no scalar twin here: `rule_chunk` does every element.
  template <class Rule, class G, class P>
  static std::size_t rule(const typename Rule::factors& /*f*/, float* /*master*/, float* const* /*st*/,
                          std::size_t /*count*/, const G* /*grad*/, P* /*param*/, std::size_t /*n*/) noexcept {
    return 0;
  }
  /// One AdamW chunk of n elements (see adamw1), from `in` to `out`; `param` may be null. `stream`
  /// (non-temporal stores) and `prefetch` mean nothing to the portable loop.
  template <bool AdamW, class G, class P>
  static void adamw(const adamw_state_in& in, const adamw_state_out& out, const G* grad, P* param, std::size_t n,
                    const adamw_consts& c, bool stream = true, std::size_t prefetch = 0) noexcept {
    (void)stream;
    (void)prefetch;
    adamw_tail<AdamW>(in, out, grad, param, 0, n, c);
  }

  /// dst[i] = D(src[i]) for one chunk.
  template <class S, class D> static void cast(const S* src, D* dst, std::size_t n) noexcept {
    cast_tail(src, dst, 0, n);
  }

  /// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
  template <class T> static bool unscale_and_check(T* x, std::size_t n, float factor) noexcept {
    return unscale_and_check_tail(x, 0, n, factor);
  }

  /// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes).
  template <class T> static float squared_norm(const T* x, std::size_t n) noexcept {
    float acc[norm_lanes] = {};
    squared_norm_tail(x, 0, n, acc);
    return reduce_lanes(acc);
  }

  /// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
  template <class S, class D> static void accumulate(const S* src, D* dst, std::size_t n) noexcept {
    accumulate_tail(src, dst, 0, n);
  }

  /// x[i] = T(float(x[i]) * factor) for one chunk.
  template <class T> static void scale(T* x, std::size_t n, float factor) noexcept { scale_tail(x, 0, n, factor); }
};

} // namespace scalar

} // namespace zero::detail::cpu
