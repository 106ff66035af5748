#pragma once
/// \file
/// The backend policy: which kernels run the math of a ZeRO step, on which streams, in which memory.
///
/// A backend is a base concept (`backend_base`: stream and event types, the allocator of the memory
/// its kernels can touch, and the synchronisation points) plus one capability concept per kernel, as
/// the communicator concepts are split per collective. `zero::backend<B>` is all of them together.
/// `zero::cpu_backend` (zero/backend/cpu_backend.hpp) is the reference implementation; a CUDA
/// backend, or a framework's own, fits the same shape.
///
/// ## The asynchronous shape
///
/// Every kernel is a member function that takes its stream last and is *stream-ordered*: it is
/// enqueued on the stream and may still be running when the call returns (a CUDA backend), or it
/// has finished when the call returns (the CPU backend, whose streams are trivially in order).
/// Buffers are raw typed pointers into memory from `B::allocator_type` (or memory the backend can
/// otherwise touch); the caller owns them and must not touch them on the host until the stream
/// that uses them has been synchronised.
///
/// Kernels that produce a scalar (`unscale_and_check`'s overflow flag, `squared_norm`'s result)
/// never return it on the host: they write it into an `int*` / `float*` in backend memory, so
/// that on a GPU the value can feed a collective (all-reduce of the flag, of the partial norms)
/// without a round trip. The host reads such a value through the one explicit sync point,
/// `b.read_scalar(p, stream)`, which waits for the stream and returns `*p`.
///
/// Kernels that need scratch memory follow CUB's temp-storage idiom: ask for the workspace size,
/// allocate it once (outside the hot path), then pass it with every call. Nothing in a backend's
/// hot path allocates.
///
/// ## Element types
///
/// The kernels are templates over the element types `float`, `zero::f16` and `zero::bf16`;
/// half types are read into fp32, computed in fp32, and rounded to nearest even when stored
/// (zero/core/dtype.hpp gives the scalar definition every backend must match).
///
/// ## Kernels (each member function of `B`, `s` being a `const B::stream_type&`)
///
// Each table row stays one line, however long: clang-format would reflow it into the next row.
// clang-format off
/// | kernel | effect |
/// |---|---|
/// | `adamw_step(master, m, v, grad, param, n, args, s)` | Adam/AdamW step (backend/adamw_args.hpp); param may be null |
/// | `cast(src, dst, n, s)` | dst[i] = D(src[i]), round to nearest even |
/// | `unscale_and_check(x, n, factor, flag, s)` | x[i] = T(x[i] * factor); *flag = 1 if a stored x[i] is inf or NaN |
/// | `squared_norm_workspace_bytes<T>(n)` | bytes of workspace `squared_norm` needs for n elements |
/// | `squared_norm(x, n, out, workspace, workspace_bytes, s)` | *out = sum of x[i]^2 in fp32, in an order fixed by n |
/// | `fill(x, n, value, s)` | x[i] = value |
/// | `accumulate(src, dst, n, s)` | dst[i] = D(float(dst[i]) + float(src[i])) |
/// | `scale(x, n, factor, s)` | x[i] = T(float(x[i]) * factor) |
// clang-format on
///
/// `unscale_and_check` leaves *flag as it was when no stored x[i] is inf or NaN. zero/backend/cpu_backend.hpp
/// ("Numerics") gives the exact fp32 operation order of each kernel, which `cpu_backend` keeps at every SIMD level.

#include "zero/backend/adamw_args.hpp"
#include "zero/core/dtype.hpp"
#include "zero/memory/allocator.hpp"

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

namespace zero {

/// The floating element types a backend kernel must take: `float`, `f16`, `bf16`.
template <class T>
concept backend_float = std::is_same_v<T, float> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

/// Base backend concept: streams, events, the memory its kernels touch, and the sync points.
///
/// - `B::stream_type`, `B::event_type`: movable handles; `make_stream()` / `make_event()` create them.
/// - `B::allocator_type`: a `zero::allocator` for memory the kernels can read and write;
///   `get_allocator()` returns the instance.
/// - `record(event, stream)` marks the point the stream has reached; `wait(stream, event)` makes the
///   stream wait for that point without blocking the host; `synchronize(stream)` and
///   `synchronize(event)` block the host until the stream or the recorded point is done.
/// - `read_scalar(p, stream)` blocks the host until `stream` is done and returns `*p` (for `int`
///   flags and `float` norms in backend memory).
/// - `name()`: "cpu", "cuda", ... for reports.
template <class B>
concept backend_base = requires {
  typename B::stream_type;
  typename B::event_type;
  typename B::allocator_type;
}
&&std::movable<typename B::stream_type>&& std::movable<typename B::event_type>&&
    allocator<typename B::allocator_type>&& requires(B& b, const B& cb, const typename B::stream_type& s,
                                                     typename B::event_type& e, const int* flag, const float* value) {
  { cb.name() } -> std::convertible_to<std::string_view>;
  { cb.get_allocator() } -> std::same_as<typename B::allocator_type>;
  { b.make_stream() } -> std::same_as<typename B::stream_type>;
  { b.make_event() } -> std::same_as<typename B::event_type>;
  { b.record(e, s) } -> std::same_as<void>;
  { b.wait(s, std::as_const(e)) } -> std::same_as<void>;
  { b.synchronize(s) } -> std::same_as<void>;
  { b.synchronize(std::as_const(e)) } -> std::same_as<void>;
  { b.read_scalar(flag, s) } -> std::same_as<int>;
  { b.read_scalar(value, s) } -> std::same_as<float>;
};

namespace detail {

template <class B, class G, class P>
concept adamw_step_for = requires(B& b, float* f, const G* g, P* p, std::size_t n, const adamw_step_args& a,
                                  const typename B::stream_type& s) {
  { b.adamw_step(f, f, f, g, p, n, a, s) } -> std::same_as<void>;
};

template <class B, class G>
concept adamw_step_for_grad = adamw_step_for<B, G, float> && adamw_step_for<B, G, f16> && adamw_step_for<B, G, bf16>;

template <class B, class S, class D>
concept cast_for = requires(B& b, const S* src, D* dst, std::size_t n, const typename B::stream_type& s) {
  { b.cast(src, dst, n, s) } -> std::same_as<void>;
};

template <class B, class S>
concept cast_from = cast_for<B, S, float> && cast_for<B, S, f16> && cast_for<B, S, bf16>;

template <class B, class T>
concept unscale_and_check_for = requires(B& b, T* x, std::size_t n, float factor, int* flag,
                                         const typename B::stream_type& s) {
  { b.unscale_and_check(x, n, factor, flag, s) } -> std::same_as<void>;
};

template <class B, class T>
concept squared_norm_for = requires(B& b, const B& cb, const T* x, std::size_t n, float* out, void* ws,
                                    const typename B::stream_type& s) {
  { cb.template squared_norm_workspace_bytes<T>(n) } -> std::same_as<std::size_t>;
  { b.squared_norm(x, n, out, ws, n, s) } -> std::same_as<void>;
};

template <class B, class T>
concept fill_for = requires(B& b, T* x, std::size_t n, T value, const typename B::stream_type& s) {
  { b.fill(x, n, value, s) } -> std::same_as<void>;
};

template <class B, class S, class D>
concept accumulate_for = requires(B& b, const S* src, D* dst, std::size_t n, const typename B::stream_type& s) {
  { b.accumulate(src, dst, n, s) } -> std::same_as<void>;
};

template <class B, class S>
concept accumulate_from = accumulate_for<B, S, float> && accumulate_for<B, S, f16> && accumulate_for<B, S, bf16>;

template <class B, class T>
concept scale_for = requires(B& b, T* x, std::size_t n, float factor, const typename B::stream_type& s) {
  { b.scale(x, n, factor, s) } -> std::same_as<void>;
};

template <class> inline constexpr bool dependent_false = false;

} // namespace detail

/// `adamw_step<G, P>(float* master, float* m, float* v, const G* grad, P* param, std::size_t n,
/// const adamw_step_args& args, const stream_type& s)` for every G and P among float, f16, bf16:
/// one Adam/AdamW step exactly as zero/backend/adamw_args.hpp defines it; `param` may be null, and
/// then no low-precision copy is written. master, m and v are updated in place.
template <class B>
concept can_adamw_step = backend_base<B> && detail::adamw_step_for_grad<B, float> &&
    detail::adamw_step_for_grad<B, f16> && detail::adamw_step_for_grad<B, bf16>;

/// `cast<S, D>(const S* src, D* dst, std::size_t n, const stream_type& s)` for every S and D among
/// float, f16, bf16: dst[i] = D(src[i]) rounded to nearest even (a copy when S == D).
template <class B>
concept can_cast =
    backend_base<B> && detail::cast_from<B, float> && detail::cast_from<B, f16> && detail::cast_from<B, bf16>;

/// `unscale_and_check<T>(T* x, std::size_t n, float factor, int* found_nonfinite, const stream_type& s)`:
/// x[i] = T(float(x[i]) * factor), and `*found_nonfinite = 1` when any stored value is inf or NaN;
/// otherwise `*found_nonfinite` is left as it was, so one flag (zeroed with `fill`) collects many
/// buffers. The flag lives in backend memory; read it with `read_scalar`.
template <class B>
concept can_unscale_and_check = backend_base<B> && detail::unscale_and_check_for<B, float> &&
    detail::unscale_and_check_for<B, f16> && detail::unscale_and_check_for<B, bf16>;

/// `squared_norm_workspace_bytes<T>(std::size_t n) const -> std::size_t` and
/// `squared_norm<T>(const T* x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes,
/// const stream_type& s)`: `*out` = sum of float(x[i])^2 accumulated in fp32 in an order that
/// depends on n only (never on threads or timing), so the result is bit-identical from run to run.
template <class B>
concept can_squared_norm = backend_base<B> && detail::squared_norm_for<B, float> && detail::squared_norm_for<B, f16> &&
    detail::squared_norm_for<B, bf16>;

/// `fill<T>(T* x, std::size_t n, T value, const stream_type& s)` for float, f16, bf16 and int (flags).
template <class B>
concept can_fill = backend_base<B> && detail::fill_for<B, float> && detail::fill_for<B, f16> &&
    detail::fill_for<B, bf16> && detail::fill_for<B, int>;

/// `accumulate<S, D>(const S* src, D* dst, std::size_t n, const stream_type& s)` for every S and D
/// among float, f16, bf16: dst[i] = D(float(dst[i]) + float(src[i])), gradient accumulation over
/// micro-steps (in the gradient dtype, or into an fp32 accumulator).
template <class B>
concept can_accumulate = backend_base<B> && detail::accumulate_from<B, float> && detail::accumulate_from<B, f16> &&
    detail::accumulate_from<B, bf16>;

/// `scale<T>(T* x, std::size_t n, float factor, const stream_type& s)`: x[i] = T(float(x[i]) * factor).
template <class B>
concept can_scale =
    backend_base<B> && detail::scale_for<B, float> && detail::scale_for<B, f16> && detail::scale_for<B, bf16>;

/// Optional: `copy(const void* src, void* dst, std::size_t bytes, const stream_type& s)` moves bytes
/// between host memory and backend memory, either way, in `s` order. A backend whose memory the host
/// cannot touch (a GPU's) provides it; the engine uses it to initialise parameters from host values and
/// to read or write state for checkpoints. A backend without it must allocate host-accessible memory.
template <class B>
concept can_copy = backend_base<B> &&
    requires(const B& b, const void* src, void* dst, std::size_t n, const typename B::stream_type& s) {
  { b.copy(src, dst, n, s) } -> std::same_as<void>;
};

/// Optional: `wait_value(s, word, value)` makes `s` wait, without blocking the host, until the 32-bit
/// word at `word` in the backend's host memory (`host_allocator_type`) reaches `value`, compared
/// cyclically (`std::int32_t(*word - value) >= 0`), where a host thread stores it later. Where a
/// backend has it, the host AdamW of an offloaded step runs beside the next forward: the uploads of
/// each range wait on the device for the word the host sets when that range is done
/// (`offload_optimizer.forward_overlap`, docs/offload.md). Without it the caller waits on the host.
template <class B>
concept can_wait_value = backend_base<B> &&
    requires(const B& b, const typename B::stream_type& s, const std::uint32_t* word, std::uint32_t value) {
  { b.wait_value(s, word, value) } -> std::same_as<void>;
};

namespace detail {
template <class B, class T>
concept index_copy_for = requires(B& b, const T* src, const std::uint32_t* index, std::size_t n, T* dst,
                                  const typename B::stream_type& s) {
  { b.gather(src, index, n, dst, s) } -> std::same_as<void>;
  { b.scatter(src, index, n, dst, s) } -> std::same_as<void>;
};
} // namespace detail

/// Optional: `gather<T>(const T* src, const std::uint32_t* index, std::size_t n, T* dst, const stream_type& s)`,
/// dst[i] = src[index[i]], and `scatter<T>(...)` with the same arguments, dst[index[i]] = src[i], for i < n and T
/// among float, f16, bf16 (the indices in backend memory; a scatter's indices distinct). ZenFlow's step
/// (`offload_optimizer` with `zero_optimization.zenflow`, docs/offload.md "Selective") uses them to take the chosen
/// columns' gradients out of a reduced slice and to write their parameters back; a backend without them runs
/// every other step.
template <class B>
concept can_index_copy = backend_base<B> && detail::index_copy_for<B, float> && detail::index_copy_for<B, f16> &&
    detail::index_copy_for<B, bf16>;

/// A complete backend: the base concept and every kernel ZeRO's stages 0-3 use.
template <class B>
concept backend = backend_base<B> && can_adamw_step<B> && can_cast<B> && can_unscale_and_check<B> &&
    can_squared_norm<B> && can_fill<B> && can_accumulate<B> && can_scale<B>;

/// Checks `B` against every part of `zero::backend` and stops compilation with one sentence per
/// missing part. Use it where a backend enters a class template, so a user sees what to add rather
/// than a page of unsatisfied constraints:
///
///     template <class Backend, class Comm> class engine { static_assert(zero::check_backend<Backend>()); };
///
/// \returns true when `B` is a backend (compilation stops otherwise).
template <class B> consteval bool check_backend() {
  if constexpr (!backend_base<B>) {
    static_assert(detail::dependent_false<B>,
                  "zero::backend: this type is not a backend; it needs the member types stream_type, event_type "
                  "and allocator_type (a zero::allocator), and name(), get_allocator(), make_stream(), "
                  "make_event(), record(event, stream), wait(stream, event), synchronize(stream), "
                  "synchronize(event) and read_scalar(const int*/const float*, stream); see "
                  "zero/backend/backend.hpp");
    return false;
  } else {
    static_assert(can_adamw_step<B>,
                  "zero::backend: this type has no usable adamw_step; a backend needs "
                  "void adamw_step(float* master, float* m, float* v, const G* grad, P* param, std::size_t n, "
                  "const zero::adamw_step_args& args, const stream_type& s) for G and P in float, f16, bf16");
    static_assert(can_cast<B>, "zero::backend: this type has no usable cast; a backend needs "
                               "void cast(const S* src, D* dst, std::size_t n, const stream_type& s) for S and D in "
                               "float, f16, bf16");
    static_assert(can_unscale_and_check<B>,
                  "zero::backend: this type has no usable unscale_and_check; a backend needs "
                  "void unscale_and_check(T* x, std::size_t n, float factor, int* found_nonfinite, "
                  "const stream_type& s) for T in float, f16, bf16");
    static_assert(can_squared_norm<B>,
                  "zero::backend: this type has no usable squared_norm; a backend needs "
                  "std::size_t squared_norm_workspace_bytes<T>(std::size_t n) const and void squared_norm(const T* "
                  "x, std::size_t n, float* out, void* workspace, std::size_t workspace_bytes, const stream_type& "
                  "s) for T in float, f16, bf16");
    static_assert(can_fill<B>, "zero::backend: this type has no usable fill; a backend needs "
                               "void fill(T* x, std::size_t n, T value, const stream_type& s) for T in float, f16, "
                               "bf16, int");
    static_assert(can_accumulate<B>,
                  "zero::backend: this type has no usable accumulate; a backend needs "
                  "void accumulate(const S* src, D* dst, std::size_t n, const stream_type& s) for S and D in "
                  "float, f16, bf16");
    static_assert(can_scale<B>, "zero::backend: this type has no usable scale; a backend needs "
                                "void scale(T* x, std::size_t n, float factor, const stream_type& s) for T in "
                                "float, f16, bf16");
    return backend<B>;
  }
}

} // namespace zero
