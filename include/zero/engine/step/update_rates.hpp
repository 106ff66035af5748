#pragma once
/// \file
/// `update_rates`: how fast AdamW runs on the backend and on the host, and how fast the bytes of a
/// host step travel between them. `measure_update_rates` times them on this machine with the kernels
/// an engine steps with; `balanced_offload_ratio` turns them into the share of a rank's optimizer state
/// to update on the host so that the host and the device finish their parts of a step together
/// (`zero_optimization.offload_optimizer.ratio: "auto"`, docs/offload.md). A planner may call both.

#include "zero/backend/adamw_args.hpp"
#include "zero/backend/backend.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/memory/buffer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace zero {

/// Measured speeds of an optimizer step's two places and of the copies between them.
struct update_rates {
  /// AdamW elements per second on the backend (its `adamw_step`, the state in the engine's memory).
  double device = 0;
  /// AdamW elements per second on the host (`cpu_backend`'s kernel and threads, the state in the
  /// backend's host memory: pinned for `cuda_backend`).
  double host = 0;
  /// Bytes per second of the backend's copies from its memory to host memory, and back; 0 where the
  /// backend has no `copy` (the host reaches its memory and nothing is copied).
  double to_host = 0;
  double to_device = 0;
};

/// How an engine split its optimizer state between the device and host memory, fixed at `finalize`
/// (`basic_engine::optimizer_split()`).
struct offload_split {
  /// The share of the state offloaded: `offload_optimizer.ratio`, or auto's choice; 1 with NVMe, 0
  /// without offload.
  double ratio = 0;
  /// The rank's state elements, and those on the host (`offloaded_state_elements` of the ratio).
  std::size_t state_elements = 0, host_elements = 0;
  /// With NVMe, the rank's state elements whose state is in the file: all of them, or with
  /// `offload_optimizer.host_ratio` those not in host memory. 0 otherwise.
  std::size_t nvme_elements = 0;
  /// The rates `"auto"` chose from (empty for a ratio the config gave), and whether the engine measured
  /// them on this machine at `finalize` (false: the program gave them, `set_offload_rates`).
  std::optional<update_rates> rates;
  bool measured = false;
};

/// What `measure_update_rates` runs: the dtypes of the step and how much of it to time.
struct update_sample {
  dtype param = dtype::f32;       ///< the parameters the step writes
  dtype grad = dtype::f32;        ///< the gradients it reads
  std::size_t elements = 1 << 22; ///< elements per timed call (state of 16 B each, plus P and G)
  unsigned host_threads = 1;      ///< threads of the host AdamW, the calling thread included
  double min_seconds = 0.01;      ///< each rate is timed over calls that take at least this long together
};

namespace detail {

/// Units per second of `call`: runs `call` (which enqueues one on `s`) 1, 2, 4, ... times, waiting for
/// `s` after each batch, until a batch takes at least `min_seconds`, and returns `per_call` units over
/// that batch's time per call. The first call warms up and is not timed.
template <class Backend, class Call>
double rate_of(Backend& b, const typename Backend::stream_type& s, double per_call, double min_seconds, Call&& call) {
  using clock = std::chrono::steady_clock;
  call();
  b.synchronize(s);
  for (std::size_t calls = 1;; calls *= 2) {
    const auto start = clock::now();
    for (std::size_t i = 0; i < calls; ++i) {
      call();
    }
    b.synchronize(s);
    const double seconds = std::chrono::duration<double>(clock::now() - start).count();
    if (seconds >= min_seconds || calls >= (std::size_t{1} << 20)) {
      return per_call * static_cast<double>(calls) / std::max(seconds, 1e-9);
    }
  }
}

} // namespace detail

/// AdamW elements per second of `b` on its stream `st` over `s.elements` elements from `alloc`, in `s.param` /
/// `s.grad` (fp32 master, m and v): the one AdamW probe, which `measure_update_rates` and zero-estimate's and
/// zero-report's rates (`tools::probe_adamw`) run. \throws memory_error when the buffers do not fit.
template <class Backend, class Alloc>
[[nodiscard]] double measure_adamw_rate(Backend& b, const typename Backend::stream_type& st, Alloc alloc,
                                        const update_sample& s) {
  const std::size_t n = s.elements;
  buffer<float, Alloc> master(alloc, n, memory_tag::other);
  buffer<float, Alloc> m(alloc, n, memory_tag::other);
  buffer<float, Alloc> v(alloc, n, memory_tag::other);
  buffer<std::byte, Alloc> grad(alloc, n * size_of(s.grad), memory_tag::other);
  buffer<std::byte, Alloc> param(alloc, n * size_of(s.param), memory_tag::other);
  for (float* p : {master.data(), m.data(), v.data()}) {
    b.fill(p, n, 0.5f, st);
  }
  adamw_step_args args;
  args.set_step(1, true);
  args.lr = 1e-3f;
  return visit_float(s.grad, [&]<class G>(type_tag<G>) {
    G* g = reinterpret_cast<G*>(grad.data());
    b.fill(g, n, G(0.25f), st);
    return visit_float(s.param, [&]<class P>(type_tag<P>) {
      P* p = reinterpret_cast<P*>(param.data());
      return detail::rate_of(b, st, static_cast<double>(n), s.min_seconds, [&] {
        // fp32 training: the parameters are the master copy, and nothing else is written.
        if constexpr (std::is_same_v<P, float>) {
          b.adamw_step(p, m.data(), v.data(), g, static_cast<float*>(nullptr), n, args, st);
        } else {
          b.adamw_step(master.data(), m.data(), v.data(), g, p, n, args, st);
        }
      });
    });
  });
}

/// Bytes per second of `b.copy` between its host memory (`offload_allocator_t<Backend>`: pinned for CUDA) and
/// `alloc`'s, `bytes` each way, on `st`: {host to device, device to host}. The one copy probe, which
/// `measure_update_rates` and `tools::probe_copy` run. \throws memory_error when the buffers do not fit.
template <class Backend, class Alloc>
requires can_copy<Backend>
[[nodiscard]] std::pair<double, double> measure_copy_rates(Backend& b, const typename Backend::stream_type& st,
                                                           Alloc alloc, std::size_t bytes, double min_seconds) {
  using host_alloc = offload_allocator_t<Backend>;
  buffer<std::byte, Alloc> on_device(alloc, bytes, memory_tag::other);
  buffer<std::byte, host_alloc> on_host(host_alloc{}, bytes, memory_tag::other);
  std::memset(on_host.data(), 0x3c, bytes);
  const double to_device = detail::rate_of(b, st, static_cast<double>(bytes), min_seconds,
                                           [&] { b.copy(on_host.data(), on_device.data(), bytes, st); });
  const double to_host = detail::rate_of(b, st, static_cast<double>(bytes), min_seconds,
                                         [&] { b.copy(on_device.data(), on_host.data(), bytes, st); });
  return {to_device, to_host};
}

/// Times AdamW on `b` (state from `alloc`, the engine's memory) and on the host (`cpu_backend`
/// with `sample.host_threads` threads over `offload_allocator_t<Backend>`, where an offloaded step
/// keeps its state), and, where the backend copies (`can_copy`), its copies of `sample.elements`
/// gradients to the host and parameters back. Allocates the sample's buffers for the call; they are
/// counted by nobody. \returns the rates of this machine, now (other work on it slows them).
/// \throws usage_error for an empty sample or a dtype that is not fp32, fp16 or bf16; memory_error
/// when the buffers do not fit.
template <backend Backend, allocator Alloc>
[[nodiscard]] update_rates measure_update_rates(Backend& b, Alloc alloc, const update_sample& sample) {
  if (sample.elements == 0 || sample.host_threads == 0 || !(sample.min_seconds >= 0)) {
    throw usage_error(detail::cat("measure_update_rates: a sample of ", std::to_string(sample.elements),
                                  " elements on ", std::to_string(sample.host_threads),
                                  " host threads; expected at least one of each and min_seconds >= 0"));
  }
  using host_alloc = offload_allocator_t<Backend>;
  update_rates r;
  const auto stream = b.make_stream();
  r.device = measure_adamw_rate(b, stream, alloc, sample);
  auto host = make_host_backend(sample.host_threads, host_alloc{});
  const auto host_stream = host.make_stream();
  r.host = measure_adamw_rate(host, host_stream, host_alloc{}, sample);
  if constexpr (can_copy<Backend>) {
    const std::size_t bytes = sample.elements * std::max(size_of(sample.grad), size_of(sample.param));
    std::tie(r.to_device, r.to_host) = measure_copy_rates(b, stream, alloc, bytes, sample.min_seconds);
  }
  return r;
}

/// The share of a rank's optimizer state to update on the host so that the host's part (its copies
/// counted in series with its update: gradients down at `to_host`, parameters up at `to_device`) takes
/// as long as the device's: ratio = d / (d + h), with d = 1 / device and h = 1 / host + G / to_host +
/// P / to_device seconds per element (a copy rate of 0: no copy).
/// \param param, grad the dtypes of the parameters the host writes and of the gradients it reads.
/// \throws usage_error naming the field for a rate that is not a finite number > 0 (device, host) or
///         >= 0 (to_host, to_device).
[[nodiscard]] inline double balanced_offload_ratio(const update_rates& r, dtype param, dtype grad) {
  const auto check = [](double v, const char* name, bool zero_ok) {
    if (!std::isfinite(v) || v < 0 || (v == 0 && !zero_ok)) {
      throw usage_error(detail::cat("balanced_offload_ratio: update_rates::", name, " is ", std::to_string(v),
                                    zero_ok ? "; expected bytes per second >= 0 (0: nothing is copied)"
                                            : "; expected AdamW elements per second > 0"));
    }
  };
  check(r.device, "device", false);
  check(r.host, "host", false);
  check(r.to_host, "to_host", true);
  check(r.to_device, "to_device", true);
  const double d = 1.0 / r.device;
  double h = 1.0 / r.host;
  h += r.to_host > 0 ? static_cast<double>(size_of(grad)) / r.to_host : 0.0;
  h += r.to_device > 0 ? static_cast<double>(size_of(param)) / r.to_device : 0.0;
  return d / (d + h);
}

} // namespace zero
