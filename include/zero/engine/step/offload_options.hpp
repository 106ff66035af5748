#pragma once
/// \file
/// How `offloaded_adamw` runs on the host (`offload_options`), the host memory a backend's offloaded
/// state lives in (`offload_allocator_t`) and the kernels that step it there (`host_backend_t`): what the
/// engine's parts that hold host state (the optimizers, stage 3's host shard, the rates probe) share.

#include "zero/backend/cpu_backend.hpp"
#include "zero/config/config.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstdint>
#include <utility>

namespace zero {

namespace detail {
template <class B> struct offload_allocator_of { using type = host_allocator; };
template <class B>
requires requires { typename B::host_allocator_type; }
struct offload_allocator_of<B> {
  using type = typename B::host_allocator_type;
};
} // namespace detail

/// The host memory a backend's offloaded state lives in: `B::host_allocator_type` where the backend
/// names one (cuda_backend: pinned), else pageable `host_allocator`.
template <class B> using offload_allocator_t = typename detail::offload_allocator_of<B>::type;

/// The kernels that step offloaded state on the host, over its memory `HostAlloc`: `basic_cpu_backend` (SIMD
/// kernels, a thread pool). The one place the engine names a concrete backend; the host optimizers
/// (`offloaded_adamw`, `nvme_adamw`) and the rates probe make theirs with `make_host_backend`.
template <class HostAlloc> using host_backend_t = basic_cpu_backend<HostAlloc>;

/// The host's kernels with `threads` threads (0: the host's hardware concurrency) over `alloc`'s memory.
template <class HostAlloc>
[[nodiscard]] host_backend_t<HostAlloc> make_host_backend(unsigned threads, HostAlloc alloc) {
  return host_backend_t<HostAlloc>(cpu_backend_options{.threads = threads}, std::move(alloc));
}

/// Whether the reduced gradients go to the host during backward (docs/offload.md): at stages 2-3, with the
/// optimizer state on NVMe, wholly in host memory (`whole_state`), or split with the device when its host share
/// steps beside the next forward (`forward_overlap`); otherwise the reducer keeps them on the device. The one rule
/// the engine's step plans (`step_plan::make`) and zero-estimate follow.
[[nodiscard]] constexpr bool gradients_stream_to_host(int stage, offload_device device, bool whole_state,
                                                      bool forward_overlap) noexcept {
  return stage >= 2 &&
         (device == offload_device::nvme || (device == offload_device::cpu && (whole_state || forward_overlap)));
}

/// Whether the delayed update (`offload_optimizer.delayed_update`) runs where a config asks for it: the whole state on
/// the CPU (`whole_state`) at stages 2-3, the parameters on the device, no gradient accumulation; elsewhere
/// `check_engine_config` refuses it. The one rule the plan's config block and zero-estimate (the host gradient
/// shard held twice) follow.
[[nodiscard]] constexpr bool delayed_update_runs(int stage, offload_device device, bool whole_state,
                                                 offload_device params, std::int64_t accumulation) noexcept {
  return stage >= 2 && device == offload_device::cpu && whole_state && params == offload_device::none &&
         accumulation == 1;
}

/// Whether ZenFlow (`zero_optimization.zenflow`) runs where a config asks for it: the whole state on the CPU
/// (`whole_state`) at stages 1-3, the parameters on the device, and with `overlap_step` no gradient accumulation
/// (its host update would share the threads that add the micro-steps); elsewhere `check_engine_config` refuses it.
/// The rule the plan's config block and zero-estimate (the host's window) follow.
[[nodiscard]] constexpr bool zenflow_runs(int stage, offload_device device, bool whole_state, offload_device params,
                                          std::int64_t accumulation, bool overlap_step) noexcept {
  return stage >= 1 && device == offload_device::cpu && whole_state && params == offload_device::none &&
         (!overlap_step || accumulation == 1);
}

/// How an `offloaded_adamw` runs on the host.
struct offload_options {
  /// Threads of the host AdamW, the calling thread included (0: the host's hardware concurrency).
  unsigned threads = 0;
  /// The share of the state, in [0, 1], that may be updated during backward (offloaded_adamw.hpp's
  /// file comment), held twice in host memory (`memory_tag::buffers`). Used with 16-bit parameters in
  /// host memory or on the device, not in a file; 0: none.
  double backward_overlap = 0.0;
  /// The step runs on a thread of the host beside the caller (`offloaded_adamw::begin_async`).
  bool forward_overlap = false;
  /// The one-step delayed update (`offloaded_adamw::begin_delayed`): the host gradient shard held twice, so
  /// the next backward streams into one while the host's update reads the other.
  bool delayed_update = false;
};

} // namespace zero
