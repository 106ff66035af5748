/// \file
/// The SIMD kernels of `zero::cpu_backend`, written once for every vector width and compiled once per
/// instruction set. cpu_kernels_avx2.hpp and cpu_kernels_avx512.hpp each define, in their namespace,
/// `struct vec` (the register type `reg`, its `lanes`, and its loads, stores, `set1`, `zero` and
/// `sqrt`, all compiled for that set) and the macros `ZERO_CPU_SIMD_NS` (the namespace) and
/// `ZERO_CPU_SIMD_TARGET` (the set's `target` attribute), then include this file, which defines the
/// kernels in `zero::detail::cpu::ZERO_CPU_SIMD_NS` with that attribute. Without the macros it
/// defines nothing.
///
/// Why not a template over `vec`: a kernel must itself carry its instruction set's `target`
/// attribute, or the intrinsics would not inline into it (GCC refuses to, Clang rejects the vector
/// arguments), and an attribute cannot depend on a template parameter.
///
/// Each kernel computes exactly what its scalar twin in cpu_kernels_scalar.hpp computes, lane by
/// lane (see cpu_backend.hpp, "Numerics"); arithmetic on `vec::reg` uses the vector operators GCC
/// and Clang define, and every product that meets an addition goes through `product`, never fused.

// No include guard: this file is included once per instruction set.

#if defined(ZERO_CPU_SIMD_NS) && defined(ZERO_CPU_SIMD_TARGET)

#include "zero/backend/detail/cpu_kernels_scalar.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace zero::detail::cpu::ZERO_CPU_SIMD_NS {

/// a * b rounded to fp32 on its own: the empty asm hides the product from the optimizer, which would
/// otherwise fuse it with the addition that uses it into an FMA (see cpu_kernels_scalar.hpp).
ZERO_CPU_SIMD_TARGET inline vec::reg product(vec::reg a, vec::reg b) noexcept {
  vec::reg p = a * b;
  __asm__("" : "+v"(p)); // "v": any vector register of the instruction set
  return p;
}

/// `rules::sign_of` per lane: where a is neither 0, -0 nor NaN, its sign bit on 1.0's bits; a itself elsewhere.
ZERO_CPU_SIMD_TARGET inline vec::reg sign(vec::reg a) noexcept {
  const vec::reg zero = vec::zero();
  const auto nonzero = (a > zero) | (a < zero);
  using mask = std::remove_const_t<decltype(nonzero)>;
  const auto bits = reinterpret_cast<mask>(a);
  const mask unit = (bits & static_cast<std::int32_t>(0x80000000u)) | 0x3f800000; // +-1.0f
  return reinterpret_cast<vec::reg>((nonzero & unit) | (~nonzero & bits));
}

/// The chunk kernels of this instruction set, under the names `cpu_backend` dispatches to (the same
/// as `scalar::kernels`).
struct kernels {
  /// One AdamW chunk of n elements, `vec::lanes` at a time (see adamw1): the state read from `in`,
  /// the new state written to `out` (the same pointers for an update in place); `param` may be null.
  /// With `stream`, what is only written goes past the caches (non-temporal stores: the line is not
  /// read first, saving that read's memory traffic): the parameter copy, and out of place the new
  /// state, each where its address can be aligned to a whole register by the chunk's first elements.
  /// With `prefetch` > 0 each register's turn asks for the inputs `prefetch` elements further on
  /// (`cpu_backend_options::prefetch_elements`), inside the chunk.
  template <bool AdamW, class G, class P>
  ZERO_CPU_SIMD_TARGET static void adamw(const adamw_state_in& in, const adamw_state_out& out, const G* grad, P* param,
                                         std::size_t n, const adamw_consts& c, bool stream = true,
                                         std::size_t prefetch = 0) noexcept {
    // Elements before `p` is aligned to `align` bytes, or `lanes` (never) when its address cannot be.
    const auto peel_for = [](const void* p, std::size_t align, std::size_t element) {
      const auto mis = reinterpret_cast<std::uintptr_t>(p) % align;
      return mis % element != 0 ? vec::lanes : (align - mis) % align / element;
    };
    std::size_t peel = vec::lanes;
    bool state = false;
    if (stream && in.master != out.master) {
      peel = peel_for(out.master, vec::stream_alignment, sizeof(float));
      state = peel < vec::lanes && peel_for(out.m, vec::stream_alignment, sizeof(float)) == peel &&
              peel_for(out.v, vec::stream_alignment, sizeof(float)) == peel;
    }
    bool par = false;
    if (stream && param != nullptr) {
      const std::size_t p = peel_for(param, vec::lanes * sizeof(P), sizeof(P));
      par = p < vec::lanes && (!state || p == peel);
      peel = state ? peel : p;
    }
    if (!state && !par) {
      const std::size_t i = adamw_lanes<AdamW, false, false>(in, out, grad, param, 0, n, c, prefetch);
      adamw_tail<AdamW>(in, out, grad, param, i, n, c);
      return;
    }
    peel = std::min(n, peel);
    adamw_tail<AdamW>(in, out, grad, param, 0, peel, c);
    std::size_t i = 0;
    if (state && par) {
      i = adamw_lanes<AdamW, true, true>(in, out, grad, param, peel, n, c, prefetch);
    } else if (state) {
      i = adamw_lanes<AdamW, true, false>(in, out, grad, param, peel, n, c, prefetch);
    } else {
      i = adamw_lanes<AdamW, false, true>(in, out, grad, param, peel, n, c, prefetch);
    }
    adamw_tail<AdamW>(in, out, grad, param, i, n, c);
    vec::fence();
  }

  /// The lanes of `adamw` from element `i` on while a whole register fits; \returns where it stopped.
  /// `Stream`: the state's stores are non-temporal (`out` aligned to `vec::stream_alignment` at `i`);
  /// `StreamParam`: the parameter copy's are (`param` non-null and aligned to a register's width at `i`).
  /// `prefetch`: how far ahead to ask for the inputs (0: not at all); only addresses below n.
  template <bool AdamW, bool Stream, bool StreamParam, class G, class P>
  ZERO_CPU_SIMD_TARGET static std::size_t adamw_lanes(const adamw_state_in& in, const adamw_state_out& out,
                                                      const G* grad, P* param, std::size_t i, std::size_t n,
                                                      const adamw_consts& c, std::size_t prefetch) noexcept {
    using reg = vec::reg;
    const reg beta1 = vec::set1(c.beta1);
    const reg beta2 = vec::set1(c.beta2);
    const reg omb1 = vec::set1(c.one_minus_beta1);
    const reg omb2 = vec::set1(c.one_minus_beta2);
    const reg eps = vec::set1(c.eps);
    const reg wd = vec::set1(c.weight_decay);
    const reg gscale = vec::set1(c.grad_scale);
    const reg step = vec::set1(c.step_size);
    const reg sqrt_bc2 = vec::set1(c.sqrt_bc2);
    const reg decay = vec::set1(c.decay);
    // Elements below `ahead_end` may prefetch `prefetch` elements on and stay inside the chunk.
    const std::size_t ahead_end = prefetch != 0 && prefetch < n ? n - prefetch : 0;
    for (; i + vec::lanes <= n; i += vec::lanes) {
      if (i < ahead_end) {
        // One core's loads of a cold state stream wait on memory's latency: asking for each input a
        // few lines ahead keeps more misses in flight than the hardware's prefetchers do alone.
        __builtin_prefetch(in.master + i + prefetch, 0, 3);
        __builtin_prefetch(in.m + i + prefetch, 0, 3);
        __builtin_prefetch(in.v + i + prefetch, 0, 3);
        __builtin_prefetch(grad + i + prefetch, 0, 3);
      }
      reg p = vec::load(in.master + i);
      reg g = product(vec::load(grad + i), gscale);
      if constexpr (!AdamW) {
        g = g + product(wd, p);
      }
      const reg mi = product(beta1, vec::load(in.m + i)) + product(omb1, g);
      const reg vi = product(beta2, vec::load(in.v + i)) + product(omb2 * g, g);
      if constexpr (AdamW) {
        p = product(p, decay);
      }
      const reg denom = vec::sqrt(vi) / sqrt_bc2 + eps;
      p = p - step * mi / denom;
      if constexpr (Stream) {
        vec::stream(out.m + i, mi);
        vec::stream(out.v + i, vi);
        vec::stream(out.master + i, p);
      } else {
        vec::store(out.m + i, mi);
        vec::store(out.v + i, vi);
        vec::store(out.master + i, p);
      }
      if constexpr (StreamParam) {
        vec::stream(param + i, p);
      } else if (param != nullptr) {
        vec::store(param + i, p);
      }
    }
    return i;
  }

  /// dst[i] = D(src[i]) for one chunk.
  template <class S, class D> ZERO_CPU_SIMD_TARGET static void cast(const S* src, D* dst, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + vec::lanes <= n; i += vec::lanes) {
      vec::store(dst + i, vec::load(src + i));
    }
    cast_tail(src, dst, i, n);
  }

  /// x[i] = T(x[i] * factor) for one chunk; true when a stored value is inf or NaN.
  template <class T> ZERO_CPU_SIMD_TARGET static bool unscale_and_check(T* x, std::size_t n, float factor) noexcept {
    const vec::reg f = vec::set1(factor);
    unsigned found = 0;
    std::size_t i = 0;
    for (; i + vec::lanes <= n; i += vec::lanes) {
      found |= vec::store_check(x + i, vec::load(x + i) * f);
    }
    const bool in_tail = unscale_and_check_tail(x, i, n, factor);
    return found != 0 || in_tail;
  }

  /// The sum of x[i]^2 over one chunk, in the interleaved 16-lane order (see norm_lanes): register r
  /// holds accumulators r * lanes ... (r + 1) * lanes - 1.
  template <class T> ZERO_CPU_SIMD_TARGET static float squared_norm(const T* x, std::size_t n) noexcept {
    constexpr std::size_t regs = norm_lanes / vec::lanes;
    vec::reg acc[regs];
    for (auto& a : acc) {
      a = vec::zero();
    }
    std::size_t i = 0;
    for (; i + norm_lanes <= n; i += norm_lanes) {
      for (std::size_t r = 0; r < regs; ++r) {
        const vec::reg a = vec::load(x + i + r * vec::lanes);
        acc[r] = acc[r] + product(a, a);
      }
    }
    alignas(64) float sums[norm_lanes];
    for (std::size_t r = 0; r < regs; ++r) {
      vec::store(sums + r * vec::lanes, acc[r]);
    }
    squared_norm_tail(x, i, n, sums);
    return reduce_lanes(sums);
  }

  /// dst[i] = D(float(dst[i]) + float(src[i])) for one chunk.
  template <class S, class D>
  ZERO_CPU_SIMD_TARGET static void accumulate(const S* src, D* dst, std::size_t n) noexcept {
    std::size_t i = 0;
    for (; i + vec::lanes <= n; i += vec::lanes) {
      vec::store(dst + i, vec::load(dst + i) + vec::load(src + i));
    }
    accumulate_tail(src, dst, i, n);
  }

  /// x[i] = T(float(x[i]) * factor) for one chunk.
  template <class T> ZERO_CPU_SIMD_TARGET static void scale(T* x, std::size_t n, float factor) noexcept {
    const vec::reg f = vec::set1(factor);
    std::size_t i = 0;
    for (; i + vec::lanes <= n; i += vec::lanes) {
      vec::store(x + i, vec::load(x + i) * f);
    }
    scale_tail(x, i, n, factor);
  }

  /// The built-in rules' step (update_rules.hpp: Lion, SGD, Adagrad) over a chunk, `vec::lanes` at a time, each
  /// operation as the rule's `apply` orders it (products through `product`); \returns the elements done, a
  /// multiple of `vec::lanes` (0 for a rule of the framework's own), which the caller's portable loop
  /// (`rule_chunk`) finishes. `st` are the rule's `count` state tensors.
  template <class Rule, class G, class P>
  ZERO_CPU_SIMD_TARGET static std::size_t rule(const typename Rule::factors& f, float* master, float* const* st,
                                               std::size_t count, const G* grad, P* param, std::size_t n) noexcept {
    using reg = vec::reg;
    std::size_t i = 0;
    if constexpr (std::is_same_v<Rule, rules::lion>) {
      const reg gs = vec::set1(f.grad_scale), lr = vec::set1(f.lr), decay = vec::set1(f.decay);
      const reg b1 = vec::set1(f.beta1), omb1 = vec::set1(f.one_minus_beta1);
      const reg b2 = vec::set1(f.beta2), omb2 = vec::set1(f.one_minus_beta2);
      float* m = st[0];
      for (; i + vec::lanes <= n; i += vec::lanes) {
        const reg g = product(vec::load(grad + i), gs);
        reg w = product(vec::load(master + i), decay);
        const reg mi = vec::load(m + i);
        const reg c = product(b1, mi) + product(omb1, g);
        w = w - product(lr, sign(c));
        vec::store(m + i, product(b2, mi) + product(omb2, g));
        vec::store(master + i, w);
        if (param != nullptr) {
          vec::store(param + i, w);
        }
      }
    } else if constexpr (std::is_same_v<Rule, rules::sgd>) {
      const reg gs = vec::set1(f.grad_scale), lr = vec::set1(f.lr), wd = vec::set1(f.weight_decay);
      const reg mom = vec::set1(f.momentum), omd = vec::set1(f.one_minus_dampening);
      float* b = count > 0 ? st[0] : nullptr;
      for (; i + vec::lanes <= n; i += vec::lanes) {
        reg w = vec::load(master + i);
        reg g = product(vec::load(grad + i), gs);
        if (f.weight_decay != 0.0f) {
          g = g + product(wd, w);
        }
        if (f.momentum != 0.0f) {
          const reg bi = f.first ? g : product(mom, vec::load(b + i)) + product(omd, g);
          vec::store(b + i, bi);
          g = f.nesterov ? g + product(mom, bi) : bi;
        }
        w = w - product(lr, g);
        vec::store(master + i, w);
        if (param != nullptr) {
          vec::store(param + i, w);
        }
      }
    } else if constexpr (std::is_same_v<Rule, rules::adagrad>) {
      const reg gs = vec::set1(f.grad_scale), clr = vec::set1(f.clr), wd = vec::set1(f.weight_decay);
      const reg eps = vec::set1(f.eps);
      float* sum = st[0];
      for (; i + vec::lanes <= n; i += vec::lanes) {
        reg w = vec::load(master + i);
        reg g = product(vec::load(grad + i), gs);
        if (f.weight_decay != 0.0f) {
          g = g + product(wd, w);
        }
        const reg si = vec::load(sum + i) + product(g, g);
        vec::store(sum + i, si);
        w = w - product(clr, g / (vec::sqrt(si) + eps));
        vec::store(master + i, w);
        if (param != nullptr) {
          vec::store(param + i, w);
        }
      }
    }
    return i;
  }
};

} // namespace zero::detail::cpu::ZERO_CPU_SIMD_NS

#endif // ZERO_CPU_SIMD_NS && ZERO_CPU_SIMD_TARGET
