#pragma once
/// \file
/// `zero::cpu_backend`: the kernels of a ZeRO step on the host, vectorised (AVX-512, AVX2 or
/// portable scalar code, chosen at run time) and spread over a small thread pool it owns. The vector
/// kernels are written once (detail/cpu_kernels_simd.hpp) and compiled for each instruction set.
///
/// Work is cut into fixed chunks of `chunk_elements` elements; the pool's threads take chunks as
/// they come. Element-wise kernels do not care who runs a chunk. `squared_norm` computes one fp32
/// partial per chunk in a fixed in-chunk order and adds the partials as a fixed pairwise tree, so
/// its result depends on n only: bit-identical across runs, thread counts and SIMD levels.
///
/// ## Numerics
///
/// Every kernel gives the same bits at every SIMD level (scalar, AVX2, AVX-512), for every thread
/// count, with GCC and with Clang, and whatever the floating-point contraction setting
/// (`-ffp-contract=off|on|fast`) or `-march` of the program that includes it: each level evaluates
/// the formulas below in fp32, every operation rounded to nearest even on its own, in the order
/// written, and never fuses a multiply and an add into an FMA (each product that feeds a sum passes
/// through an empty `asm` the optimizer cannot see through, so there is nothing left to contract).
/// The one exception: a NaN made by arithmetic on two NaNs is a NaN in every level, but its payload
/// may differ. The bits assume IEEE arithmetic: none of `-ffast-math`, `-funsafe-math-optimizations`,
/// `-freciprocal-math`, `-fassociative-math` on the code that includes zero, and the default MXCSR
/// (round to nearest, no flush-to-zero: linking with `-ffast-math` sets flush-to-zero for the whole
/// program).
///
/// `adamw_step`, for element i (zero/backend/adamw_args.hpp, with its products and quotients grouped
/// left to right); the per-call factors are formed once, as written:
///
///     step_size = lr / bias_correction1
///     sqrt_bc2  = sqrt(bias_correction2)
///     decay     = 1 - lr * weight_decay                     // the product rounded, then the difference
///     g         = float(grad[i]) * grad_scale
///     g         = g + weight_decay * master[i]              // Adam (adam_w_mode false) only
///     m[i]      = beta1 * m[i] + (1 - beta1) * g
///     v[i]      = beta2 * v[i] + ((1 - beta2) * g) * g
///     master[i] = master[i] * decay                         // AdamW (adam_w_mode true) only
///     denom     = sqrt(v[i]) / sqrt_bc2 + eps
///     master[i] = master[i] - (step_size * m[i]) / denom
///     param[i]  = P(master[i])                              // when param is not null
///
/// where `a * b + c * d` is both products rounded, then their sum rounded (never `fma`), `sqrt` is
/// IEEE's correctly rounded square root, and `P(x)` rounds to nearest even as zero/core/dtype.hpp
/// (f16: subnormals kept, overflow to inf; bf16: NaN kept quiet). This is also zero::cuda's
/// `adamw_step`, which rounds each operation with `__fmul_rn`, `__fadd_rn`, `__fdiv_rn`, `__fsqrt_rn`.
///
/// The other kernels: `cast` is `D(float(src[i]))` (widening is exact); `unscale_and_check` stores
/// `T(float(x[i]) * factor)` and flags a stored value whose exponent bits are all ones; `accumulate`
/// is `D(float(dst[i]) + float(src[i]))`; `scale` is `T(float(x[i]) * factor)`. `squared_norm` cuts
/// [0, n) into chunks of `chunk_elements`; in a chunk, 16 fp32 accumulators start at +0 and element j
/// of the chunk does `acc[j % 16] = acc[j % 16] + x * x` (the square rounded, then the sum), in
/// increasing j; then `acc[k] = acc[k] + acc[k + w]` for w = 8, 4, 2, 1 and k < w; then the chunks'
/// acc[0] are added as a pairwise tree: for w = 1, 2, 4, ... `sum[c] = sum[c] + sum[c + w]` for c a
/// multiple of 2w with c + w < chunks. The result depends on n alone.
///
/// ### Reproducing these bits in a framework's own kernel
///
/// A plain loop that evaluates the formulas above in fp32, in the same order, gives the same bits,
/// provided its compiler rounds every operation as written, i.e. does not contract `a * b + c` into
/// an FMA. Compile such a kernel with `-ffp-contract=off` (GCC and Clang), or for a target without
/// FMA (x86-64's baseline, `-march=x86-64-v2`). It is needed wherever FMA is enabled (`-mfma`,
/// `-march=haswell` or later, `-march=x86-64-v3`, `-march=native` on such a CPU): GCC then fuses
/// across statements by default in every C++ mode, `-std=c++20` included (its ISO-mode
/// `-ffp-contract=off` applies to C only), and Clang fuses within an expression by default.
/// zero's kernels need none of this, so `zero::zero` passes no floating-point option to its users:
/// the flag concerns the framework's kernel alone. tests/backend/framework_kernels.cpp is such a
/// kernel, checked against every SIMD level in tests/backend/test_cpu_numerics.cpp.
///
/// ## Replacing one kernel
///
/// A framework derives from `basic_cpu_backend`, brings the library's overloads of the kernel back with a
/// using-declaration and adds its own overload with the exact parameter types of its case: docs/backends.md,
/// "Replacing one kernel of `cpu_backend`", and tests/backend/test_replace_kernel.cpp, checked.
///
/// The CPU has no asynchrony to hide: streams and events are empty tags and every kernel has
/// finished when it returns. They keep the shape of `zero::backend` so engines are written once.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/backend.hpp"
#include "zero/backend/detail/cpu_features.hpp"
#include "zero/backend/detail/cpu_kernels_avx2.hpp"
#include "zero/backend/detail/cpu_kernels_avx512.hpp"
#include "zero/backend/detail/cpu_kernels_scalar.hpp"
#include "zero/backend/detail/thread_pool.hpp"
#include "zero/backend/quantize.hpp"
#include "zero/backend/simd_level.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/memory/allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

namespace zero {

/// How a `cpu_backend` runs its kernels.
struct cpu_backend_options {
  /// Threads that run a kernel, the calling thread included; 0 means `std::thread::hardware_concurrency()`.
  unsigned threads = 0;
  /// The instruction set; `automatic` takes the widest one the CPU has.
  simd_level simd = simd_level::automatic;
  /// AdamW writes what it does not read (the parameter copy; the state out of place) past the caches
  /// with non-temporal stores, saving the read of each line before its write: about 7% of an
  /// in-place bf16 step's memory traffic. Turn it off when the caller reads the copy back at once.
  bool streaming_stores = true;
  /// AdamW asks for its inputs (the state it reads and the gradient) this many elements ahead of where
  /// it works, within each chunk (software prefetch into the first-level cache); 0 leaves it to the
  /// hardware's prefetchers. A core working alone on a cold state waits on memory's latency, and
  /// more loads in flight raise its rate (bench/README.md, "CPU AdamW").
  std::size_t prefetch_elements = 256;
};

/// The CPU's stream: an empty tag, since every CPU kernel completes before it returns.
struct cpu_stream {};

/// The CPU's event: an empty tag; recording it and waiting for it are no-ops.
struct cpu_event {};

/// The host backend, over memory from allocator `A` (pageable `host_allocator` by default; a pinned
/// allocator for offload). Owns a thread pool; movable, not copyable. A moved-from backend may only
/// be destroyed or assigned to. Thread-safe: kernels may be called from several threads at once
/// (each call's own buffers); calls big enough to use the pool take turns on it.
///
/// Each kernel checks its arguments (null pointers with n > 0, workspace too small) and throws
/// `usage_error` naming the kernel and the argument; otherwise it throws nothing.
template <host_allocator_policy A = host_allocator> class basic_cpu_backend {
public:
  /// The stream type: see `cpu_stream`.
  using stream_type = cpu_stream;
  /// The event type: see `cpu_event`.
  using event_type = cpu_event;
  /// Allocator of the memory the kernels read and write.
  using allocator_type = A;
  /// Construction options.
  using options = cpu_backend_options;

  /// Elements per unit of work handed to a thread (64 KiB of fp32). Part of `squared_norm`'s
  /// summation order, so fixed.
  static constexpr std::size_t chunk_elements = 16384;

  /// Starts the thread pool and picks the SIMD level.
  /// \param opt   threads (0: hardware concurrency) and SIMD level.
  /// \param alloc the allocator `get_allocator()` returns.
  /// \throws config_error when `opt.simd` names a level this CPU or build cannot run, naming the
  ///         level and what the CPU lacks; std::system_error when a thread cannot start.
  explicit basic_cpu_backend(options opt = {}, A alloc = A{})
      : alloc_(std::move(alloc)), streaming_stores_(opt.streaming_stores), prefetch_elements_(opt.prefetch_elements) {
    if (opt.simd == simd_level::automatic) {
      simd_ = best_simd_level();
    } else if (!simd_supported(opt.simd)) {
      throw config_error("cpu_backend: simd level \"" + std::string(name_of(opt.simd)) +
                         "\" is not available on this CPU or build (" +
                         (opt.simd == simd_level::avx512 ? "needs AVX-512F and AVX-512BW" : "needs AVX2 and F16C") +
                         "); use simd_level::automatic to take the widest level available (" +
                         std::string(name_of(best_simd_level())) + " here)");
    } else {
      simd_ = opt.simd;
    }
    unsigned threads = opt.threads;
    if (threads == 0) {
      threads = std::max(1u, std::thread::hardware_concurrency());
    }
    pool_ = std::make_unique<detail::thread_pool>(threads);
  }

  /// "cpu".
  [[nodiscard]] std::string_view name() const noexcept { return "cpu"; }
  /// The allocator of memory the kernels may touch.
  [[nodiscard]] A get_allocator() const { return alloc_; }
  /// Threads that run a kernel, the caller included.
  [[nodiscard]] unsigned threads() const noexcept { return pool_->size(); }
  /// The SIMD level in use (never `automatic`).
  [[nodiscard]] simd_level simd() const noexcept { return simd_; }
  /// Whether AdamW writes its outputs with non-temporal stores (see `cpu_backend_options`).
  [[nodiscard]] bool streaming_stores() const noexcept { return streaming_stores_; }
  /// How far ahead AdamW prefetches its inputs, in elements (see `cpu_backend_options`).
  [[nodiscard]] std::size_t prefetch_elements() const noexcept { return prefetch_elements_; }

  /// A new stream (an empty tag).
  [[nodiscard]] stream_type make_stream() const noexcept { return {}; }
  /// A new event (an empty tag).
  [[nodiscard]] event_type make_event() const noexcept { return {}; }
  /// Records `e` on `s`: a no-op, everything before it has already completed.
  void record(event_type& /*e*/, const stream_type& /*s*/) const noexcept {}
  /// Makes `s` wait for `e`: a no-op, `e`'s work has already completed.
  void wait(const stream_type& /*s*/, const event_type& /*e*/) const noexcept {}
  /// Blocks until `s` is idle: returns at once.
  void synchronize(const stream_type& /*s*/) const noexcept {}
  /// Blocks until `e` has completed: returns at once.
  void synchronize(const event_type& /*e*/) const noexcept {}
  /// The sync point for scalars that kernels write into backend memory: returns `*p` (the work on
  /// `s` that wrote it has completed). \param p an `int` flag or a `float` result in host memory.
  template <class T> [[nodiscard]] T read_scalar(const T* p, const stream_type& /*s*/) const {
    require(p != nullptr, "read_scalar", "p");
    return *p;
  }

  /// Copies `bytes` from `src` to `dst` (both host memory); see `zero::can_copy`.
  void copy(const void* src, void* dst, std::size_t bytes, const stream_type& /*s*/) const {
    if (bytes > 0) {
      require(src != nullptr, "copy", "src");
      require(dst != nullptr, "copy", "dst");
      std::memcpy(dst, src, bytes);
    }
  }

  /// One Adam/AdamW step over `n` elements, exactly as zero/backend/adamw_args.hpp defines it.
  /// \param master fp32 master weights, updated in place.
  /// \param m,v    fp32 first and second moments, updated in place.
  /// \param grad   gradients in `G` (float, f16, bf16); multiplied by `args.grad_scale` first.
  /// \param param  low-precision copy of the updated master written in `P` (rounded to nearest
  ///               even), or null for none. No buffer may overlap another.
  template <backend_float G, backend_float P>
  void adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
                  const adamw_step_args& args, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(master != nullptr, "adamw_step", "master");
    require(m != nullptr, "adamw_step", "m");
    require(v != nullptr, "adamw_step", "v");
    adamw_chunks("adamw_step", {master, m, v}, {master, m, v}, grad, param, n, args);
  }

  /// One step of update rule `Rule` (zero/backend/update_rules.hpp: `rules::lion`, `rules::sgd`,
  /// `rules::adagrad`, or a framework's own) over `n` elements: `master` fp32, updated in place; `state` its
  /// `Rule::state_count(args)` fp32 state tensors, updated in place (the rest may be null); `grad` in `G`;
  /// `param` the low-precision copy written in `P`, or null. Over the pool's chunks; the built-in rules with the
  /// SIMD level's own loop, a framework's with `detail::cpu::rule_chunk` (four lanes of the vector extension):
  /// the bits of the rule's formula, whatever the level and thread count.
  template <class Rule, backend_float G, backend_float P>
  void rule_step(float* master, const std::array<float*, max_rule_state>& state, const G* grad, P* param, std::size_t n,
                 const adamw_step_args& args, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(master != nullptr, "rule_step", "master");
    require(grad != nullptr, "rule_step", "grad");
    const std::size_t count = Rule::state_count(args);
    for (std::size_t j = 0; j < count; ++j) {
      require(state[j] != nullptr, "rule_step", "a state tensor");
    }
    const auto f = Rule::make(args);
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      // The SIMD level's loop for a built-in rule, then the portable one for what it left (all of a framework's).
      std::size_t done = 0;
      std::array<float*, max_rule_state> at{};
      for (std::size_t j = 0; j < count; ++j) {
        at[j] = state[j] + b;
      }
      dispatch([&](auto isa) noexcept {
        done = decltype(isa)::template rule<Rule>(f, master + b, at.data(), count, grad + b,
                                                  param != nullptr ? param + b : nullptr, len);
      });
      for (std::size_t j = 0; j < count; ++j) {
        at[j] += done;
      }
      detail::cpu::rule_chunk<Rule>(f, master + b + done, at.data(), count, grad + b + done,
                                    param != nullptr ? param + b + done : nullptr, len - done);
    });
  }

  /// Bytes of workspace `rule_norms` needs for `n` elements: 0 up to one chunk, else 16 per chunk.
  [[nodiscard]] std::size_t rule_norms_workspace_bytes(std::size_t n) const noexcept {
    return n <= chunk_elements ? 0 : chunks(n) * 2 * sizeof(double);
  }

  /// The first pass of a rule with a trust ratio (`rules::has_trust_ratio`: LAMB) over the `n` elements of one
  /// tensor's piece: `Rule::moments` on the state tensors from `grad` (times `args.grad_scale`), then `out[0]` =
  /// the sum of master² and `out[1]` of `Rule::direction`², in double, element by element per chunk of
  /// `chunk_elements`, then the chunks in order: the inputs alone decide it, not the threads. `master` is read.
  /// \param workspace at least `rule_norms_workspace_bytes(n)` bytes aligned for double (null when that is 0).
  /// \throws usage_error for a null master, grad, state tensor or out, or a missing or small workspace.
  template <class Rule, backend_float G>
  requires rules::has_trust_ratio<Rule>
  void rule_norms(const float* master, const std::array<float*, max_rule_state>& state, const G* grad, std::size_t n,
                  const adamw_step_args& args, double* out, void* workspace, std::size_t workspace_bytes,
                  const stream_type& /*s*/) {
    require(out != nullptr, "rule_norms", "out");
    out[0] = out[1] = 0.0;
    if (n == 0) {
      return;
    }
    require(master != nullptr && grad != nullptr, "rule_norms", "master or grad");
    for (std::size_t j = 0; j < Rule::state_count(args); ++j) {
      require(state[j] != nullptr, "rule_norms", "a state tensor");
    }
    const std::size_t need = rule_norms_workspace_bytes(n);
    require_workspace("rule_norms", n, need, workspace, workspace_bytes);
    const auto f = Rule::make(args);
    double* partial = need > 0 ? static_cast<double*>(workspace) : out;
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      std::array<float*, max_rule_state> at{};
      for (std::size_t j = 0; j < Rule::max_state; ++j) {
        at[j] = state[j] != nullptr ? state[j] + b : nullptr;
      }
      detail::cpu::rule_norms_chunk<Rule>(f, master + b, at.data(), grad + b, len, partial + 2 * (b / chunk_elements));
    });
    for (std::size_t c = 0; need > 0 && c < chunks(n); ++c) {
      out[0] += partial[2 * c];
      out[1] += partial[2 * c + 1];
    }
  }

  /// The same step out of place: reads the state at `master_in`, `m_in`, `v_in` and writes the new
  /// state to `master`, `m`, `v`, leaving the input as it was (an update that may still be dropped:
  /// `offloaded_adamw`'s updates during backward). Same bits as `adamw_step` on a copy of the input.
  /// No output buffer may overlap an input or another output.
  template <backend_float G, backend_float P>
  void adamw_step_from(const float* master_in, const float* m_in, const float* v_in, float* master, float* m, float* v,
                       const G* grad, P* param, std::size_t n, const adamw_step_args& args, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(master_in != nullptr && master != nullptr, "adamw_step_from", "master");
    require(m_in != nullptr && m != nullptr, "adamw_step_from", "m");
    require(v_in != nullptr && v != nullptr, "adamw_step_from", "v");
    adamw_chunks("adamw_step_from", {master_in, m_in, v_in}, {master, m, v}, grad, param, n, args);
  }

  /// dst[i] = D(src[i]) for i < n, rounding to nearest even (a copy when S == D). No overlap.
  template <backend_float S, backend_float D> void cast(const S* src, D* dst, std::size_t n, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(src != nullptr, "cast", "src");
    require(dst != nullptr, "cast", "dst");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      if constexpr (std::is_same_v<S, D>) {
        std::memcpy(dst + b, src + b, len * sizeof(S));
      } else {
        dispatch([&](auto isa) noexcept { decltype(isa)::cast(src + b, dst + b, len); });
      }
    });
  }

  /// x[i] = T(float(x[i]) * factor) for i < n, and `*found_nonfinite = 1` when any stored x[i] is inf
  /// or NaN; otherwise `*found_nonfinite` keeps its value (zero it with `fill` before a series of calls).
  template <backend_float T>
  void unscale_and_check(T* x, std::size_t n, float factor, int* found_nonfinite, const stream_type& /*s*/) {
    require(found_nonfinite != nullptr, "unscale_and_check", "found_nonfinite");
    if (n == 0) {
      return;
    }
    require(x != nullptr, "unscale_and_check", "x");
    std::atomic<bool> found{false};
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      bool f = false;
      dispatch([&](auto isa) noexcept { f = decltype(isa)::unscale_and_check(x + b, len, factor); });
      if (f) {
        found.store(true, std::memory_order_relaxed);
      }
    });
    if (found.load(std::memory_order_relaxed)) {
      *found_nonfinite = 1;
    }
  }

  /// Bytes of workspace `squared_norm` needs for `n` elements: 0 up to one chunk, else 4 per chunk.
  template <backend_float T> [[nodiscard]] std::size_t squared_norm_workspace_bytes(std::size_t n) const noexcept {
    return n <= chunk_elements ? 0 : chunks(n) * sizeof(float);
  }

  /// `*out` = the sum of float(x[i])^2 for i < n in fp32: per chunk of `chunk_elements`, 16
  /// interleaved partial sums (element i to partial i % 16) added as a fixed tree; then the chunk
  /// sums added as a fixed pairwise tree. The order depends on n alone.
  /// \param workspace       at least `squared_norm_workspace_bytes<T>(n)` bytes of host memory,
  ///                        suitably aligned for float (may be null when that size is 0).
  /// \throws usage_error when the workspace is missing or too small.
  template <backend_float T>
  void squared_norm(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
                    const stream_type& /*s*/) {
    require(out != nullptr, "squared_norm", "out");
    if (n == 0) {
      *out = 0.0f;
      return;
    }
    require(x != nullptr, "squared_norm", "x");
    if (n <= chunk_elements) {
      dispatch([&](auto isa) noexcept { *out = decltype(isa)::squared_norm(x, n); });
      return;
    }
    require_workspace("squared_norm", n, squared_norm_workspace_bytes<T>(n), workspace, workspace_bytes);
    float* partial = static_cast<float*>(workspace);
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      dispatch([&](auto isa) noexcept { partial[b / chunk_elements] = decltype(isa)::squared_norm(x + b, len); });
    });
    const std::size_t count = chunks(n);
    for (std::size_t w = 1; w < count; w *= 2) {
      for (std::size_t i = 0; i + w < count; i += 2 * w) {
        partial[i] = partial[i] + partial[i + w];
      }
    }
    *out = partial[0];
  }

  /// x[i] = value for i < n (T: float, f16, bf16, int).
  template <class T>
  requires backend_float<T> || std::is_same_v<T, int>
  void fill(T* x, std::size_t n, T value, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(x != nullptr, "fill", "x");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept { std::fill_n(x + b, len, value); });
  }

  /// dst[i] = D(float(dst[i]) + float(src[i])) for i < n: gradient accumulation over micro-steps.
  template <backend_float S, backend_float D>
  void accumulate(const S* src, D* dst, std::size_t n, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(src != nullptr, "accumulate", "src");
    require(dst != nullptr, "accumulate", "dst");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      dispatch([&](auto isa) noexcept { decltype(isa)::accumulate(src + b, dst + b, len); });
    });
  }

  /// dst[i] = src[index[i]] for i < n (zero::can_index_copy).
  template <backend_float T>
  void gather(const T* src, const std::uint32_t* index, std::size_t n, T* dst, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(src != nullptr && index != nullptr && dst != nullptr, "gather", "src, index or dst");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      for (std::size_t i = b; i < b + len; ++i) {
        dst[i] = src[index[i]];
      }
    });
  }
  /// dst[index[i]] = src[i] for i < n, the indices distinct (zero::can_index_copy).
  template <backend_float T>
  void scatter(const T* src, const std::uint32_t* index, std::size_t n, T* dst, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(src != nullptr && index != nullptr && dst != nullptr, "scatter", "src, index or dst");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      for (std::size_t i = b; i < b + len; ++i) {
        dst[index[i]] = src[i];
      }
    });
  }

  /// x[i] = T(float(x[i]) * factor) for i < n.
  template <backend_float T> void scale(T* x, std::size_t n, float factor, const stream_type& /*s*/) {
    if (n == 0) {
      return;
    }
    require(x != nullptr, "scale", "x");
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      dispatch([&](auto isa) noexcept { decltype(isa)::scale(x + b, len, factor); });
    });
  }

  /// ZeRO++'s block quantization of `x` (n elements) into `codes` and `scales` (zero/backend/quantize.hpp;
  /// the reference's codes). \throws usage_error for a format other than 8 or 4 bits.
  template <backend_float T>
  void quantize(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales,
                const stream_type& /*s*/) {
    f.check("quantize");
    if (n > 0) {
      require(x != nullptr && codes != nullptr && scales != nullptr, "quantize", "x, codes or scales");
      for_blocks(n, f, [&](std::size_t b) noexcept { quantize_block(x, n, f, b, codes, scales); });
    }
  }
  /// The values of `dequantize`d codes and scales into `out` (n elements).
  template <backend_float T>
  void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, T* out,
                  const stream_type& /*s*/) {
    f.check("dequantize");
    if (n > 0) {
      require(out != nullptr && codes != nullptr && scales != nullptr, "dequantize", "out, codes or scales");
      for_blocks(n, f, [&](std::size_t b) noexcept { dequantize_block(codes, scales, n, f, b, out); });
    }
  }

private:
  /// Runs `fn(block)` for the blocks of `n` elements in format `f`, about a chunk's elements per task.
  template <class F> void for_blocks(std::size_t n, quant_format f, F&& fn) {
    const std::size_t blocks = f.blocks(n);
    const std::size_t per_task = std::max<std::size_t>(1, chunk_elements / f.block);
    pool_->parallel_for((blocks + per_task - 1) / per_task, [&](std::size_t t) noexcept {
      for (std::size_t b = t * per_task; b < std::min(blocks, (t + 1) * per_task); ++b) {
        fn(b);
      }
    });
  }

  /// Calls `fn(kernels{})` with the chunk kernels of the SIMD level in use: `detail::cpu::scalar`'s,
  /// `avx2`'s or `avx512`'s `kernels`, which share one static interface.
  template <class F> void dispatch(F&& fn) const noexcept {
#if ZERO_CPU_X86_SIMD
    if (simd_ == simd_level::avx512) {
      fn(detail::cpu::avx512::kernels{});
      return;
    }
    if (simd_ == simd_level::avx2) {
      fn(detail::cpu::avx2::kernels{});
      return;
    }
#endif
    fn(detail::cpu::scalar::kernels{});
  }

  /// AdamW over [0, n) in chunks on the pool, from `in` to `out`, for the kernel named `who`.
  template <class G, class P>
  void adamw_chunks(const char* who, const detail::cpu::adamw_state_in& in, const detail::cpu::adamw_state_out& out,
                    const G* grad, P* param, std::size_t n, const adamw_step_args& args) {
    require(grad != nullptr, who, "grad");
    const auto c = detail::cpu::adamw_consts::from(args);
    for_chunks(n, [&](std::size_t b, std::size_t len) noexcept {
      P* p = param != nullptr ? param + b : nullptr;
      const detail::cpu::adamw_state_in i{in.master + b, in.m + b, in.v + b};
      const detail::cpu::adamw_state_out o{out.master + b, out.m + b, out.v + b};
      dispatch([&](auto isa) noexcept {
        if (c.adam_w_mode) {
          decltype(isa)::template adamw<true>(i, o, grad + b, p, len, c, streaming_stores_, prefetch_elements_);
        } else {
          decltype(isa)::template adamw<false>(i, o, grad + b, p, len, c, streaming_stores_, prefetch_elements_);
        }
      });
    });
  }

  static constexpr std::size_t chunks(std::size_t n) noexcept { return (n + chunk_elements - 1) / chunk_elements; }

  /// Runs `fn(begin, length)` over the chunks of [0, n): inline when there is one chunk, else on the pool.
  template <class F> void for_chunks(std::size_t n, F&& fn) {
    if (n <= chunk_elements) {
      fn(std::size_t{0}, n);
      return;
    }
    pool_->parallel_for(chunks(n), [&](std::size_t c) noexcept {
      const std::size_t b = c * chunk_elements;
      fn(b, std::min(chunk_elements, n - b));
    });
  }

  // Takes the test rather than the pointer: passing a pointer to an uninitialised result (`float
  // norm; b.squared_norm(..., &norm, ...)`) to a const-pointer parameter trips GCC's -Wmaybe-uninitialized.
  /// \throws usage_error naming `kernel`'s workspace query when `need` bytes are not there.
  static void require_workspace(const char* kernel, std::size_t n, std::size_t need, const void* workspace,
                                std::size_t bytes) {
    if (need > 0 && (workspace == nullptr || bytes < need)) {
      throw usage_error(std::string("cpu_backend::") + kernel + ": the workspace for " + std::to_string(n) +
                        " elements needs " + std::to_string(need) + " bytes (" + kernel + "_workspace_bytes), got " +
                        std::to_string(workspace == nullptr ? 0 : bytes));
    }
  }
  static void require(bool non_null, const char* kernel, const char* arg) {
    if (!non_null) {
      throw usage_error(std::string("cpu_backend::") + kernel + ": " + arg + " is null");
    }
  }

  A alloc_;
  simd_level simd_ = simd_level::scalar;
  bool streaming_stores_ = true;
  std::size_t prefetch_elements_ = options{}.prefetch_elements;
  std::unique_ptr<detail::thread_pool> pool_;
};

/// The host backend over pageable host memory.
using cpu_backend = basic_cpu_backend<>;

static_assert(backend<cpu_backend>, "cpu_backend must satisfy zero::backend");
static_assert(check_backend<cpu_backend>());
static_assert(can_quantize<cpu_backend>);
static_assert(can_index_copy<cpu_backend>);

} // namespace zero
