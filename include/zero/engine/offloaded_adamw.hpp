#pragma once
/// \file
/// `offloaded_adamw`: ZeRO-Offload's optimizer step. A rank's fp32 master weights, Adam moments and
/// a copy of its gradient shard live in host memory (pinned where the backend has a device:
/// `Backend::host_allocator_type`; pageable `host_allocator` otherwise), and the host runs AdamW on
/// them with `cpu_backend`'s kernels and thread pool. Per owned range (a segment's slice):
///
///     device -> host   the range's reduced gradients   (stage 1: every range's copy posted at the first
///                                                       range; stages 2-3: streamed during backward)
///     host             AdamW over the range            (after that range's copy landed)
///     host -> device   the range's new parameters      (posted; the residency's all-gather follows it)
///
/// so the gradients of later ranges travel while earlier ranges update, and each range's upload and
/// all-gather run while the host updates the next. With the parameters offloaded too (stage 3's
/// shard in host memory: `adamw_placement::params_on_host`) the host AdamW writes the shard in place
/// and nothing is copied back. The kernels, their arguments and their element order are those of
/// `partitioned_adamw` on the `cpu_backend`: on a CPU-only build an offloaded run gives the same bits
/// as an in-memory one (the gradient norm, clipping and fp16's overflow check run before any range is
/// updated, as in memory). On a GPU the host's AdamW rounds each operation as the device kernel does
/// (docs/offload.md).

#include "zero/backend/backend.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/transfer.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/detail/host_gradients.hpp"
#include "zero/engine/partitioned_adamw.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

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

/// How an `offloaded_adamw` runs on the host.
struct offload_options {
  /// Threads of the host AdamW, the calling thread included (0: the host's hardware concurrency).
  unsigned threads = 0;
};

/// AdamW over a rank's part of the flat buffer, in host memory; see the file comment. The interface
/// is `partitioned_adamw`'s (`ranges`, `runs`, `state_size`, `groups`, `has_master`, `load_master`,
/// `step`, `step_range`, `read_state`, `write_state`).
template <backend Backend, allocator DeviceAlloc, allocator HostAlloc = offload_allocator_t<Backend>>
class offloaded_adamw {
  using host_backend = basic_cpu_backend<HostAlloc>;
  using host_counting = counting_allocator<HostAlloc>;
  using stream_type = typename Backend::stream_type;
  static constexpr bool device_host_accessible = DeviceAlloc::host_accessible;

public:
  /// \param layout, group_of, groups as `partitioned_adamw`'s.
  /// \param place  the rank, what it owns, the gradient dtype and the device parameters it rewrites.
  /// \param backend the device's kernels; its `copy` moves gradients and parameters.
  /// \param host   host memory for the state and the two staging shards, counted by tag (optimizer,
  ///               grads, params) in `host_memory()`.
  /// \param stream the engine's stream (kept by reference).
  offloaded_adamw(const flat_layout& layout, adamw_placement place, std::vector<std::size_t> group_of,
                  std::vector<param_group> groups, Backend& backend, HostAlloc host, stream_type& stream,
                  offload_options opt = {})
      : backend_(backend), stream_(stream), counted_(host), host_(cpu_backend_options{.threads = opt.threads}, host),
        device_params_(place.params), device_sharded_(place.params_sharded), params_on_host_(place.params_on_host),
        in_file_(place.params_in_file), param_size_(size_of(layout.type())),
        host_params_(params_on_host_ ? buffer<std::byte, host_counting>()
                                     : buffer<std::byte, host_counting>(
                                           counted_, state_elements(layout, place) * param_size_, memory_tag::params)),
        inner_(layout,
               adamw_placement{.rank = place.rank,
                               .partitioned = place.partitioned,
                               .grad_type = place.grad_type,
                               .params = params_on_host_ ? place.params : host_params_.data(),
                               .params_sharded = params_on_host_ ? place.params_sharded : true,
                               .state_begin = place.state_begin,
                               .state_end = place.state_end},
               std::move(group_of), std::move(groups), host_, counted_, host_stream_),
        grads_(backend, host_, inner_.ranges(), counted_, inner_.state_size(), place.grad_type) {
    if (place.params == nullptr && !in_file_) {
      throw usage_error("offloaded_adamw: no parameters to update (adamw_placement::params is null)");
    }
    if (params_on_host_ && !place.params_sharded) {
      throw usage_error("offloaded_adamw: parameters in host memory must be the rank's shard (params_sharded)");
    }
  }

  offloaded_adamw(const offloaded_adamw&) = delete;
  offloaded_adamw& operator=(const offloaded_adamw&) = delete;
  /// Waits for copies still in flight into or out of the host shards; never throws.
  ~offloaded_adamw() {
    try {
      backend_.synchronize(stream_);
    } catch (...) { // NOLINT(bugprone-empty-catch): a destructor reports nothing
    }
  }

  [[nodiscard]] const std::vector<std::pair<flat_range, std::size_t>>& ranges() const noexcept {
    return inner_.ranges();
  }
  [[nodiscard]] const std::vector<owned_run>& runs() const noexcept { return inner_.runs(); }
  [[nodiscard]] std::size_t state_size() const noexcept { return inner_.state_size(); }
  [[nodiscard]] std::vector<param_group>& groups() noexcept { return inner_.groups(); }
  [[nodiscard]] bool has_master() const noexcept { return inner_.has_master(); }
  /// The host bytes of the state and the staging shards, by tag.
  [[nodiscard]] const host_counting& host_memory() const noexcept { return counted_; }
  /// Threads of the host AdamW.
  [[nodiscard]] unsigned threads() const noexcept { return host_.threads(); }
  /// The host gradient shard (streamed by the engine at stages 2-3).
  [[nodiscard]] auto& grads() noexcept { return grads_; }

  /// Copies the owned part of the device parameters to the host and fills the master copy from it.
  void load_master() {
    for (const auto& [range, state_offset] : inner_.ranges()) {
      if (params_on_host_) {
        break; // the host AdamW reads the shard itself
      }
      copy_and_wait<device_host_accessible>(backend_, stream_, device_params(range, state_offset),
                                            host_params(state_offset), range.size() * param_size_);
    }
    inner_.load_master();
  }

  /// Host copies of the state (see `partitioned_adamw::read_state`; host memory, so a plain copy).
  void read_state(state_tensor t, std::size_t state_offset, std::span<float> out) {
    inner_.read_state(t, state_offset, out);
  }
  /// Writes host values into the state. The device parameters are the caller's to write (a
  /// checkpoint writes both).
  void write_state(state_tensor t, std::size_t state_offset, std::span<const float> in) {
    inner_.write_state(t, state_offset, in);
  }

  /// One optimizer step over every owned range, with its copies on the engine's stream.
  template <class GradOf, class GroupLr> void step(const adamw_step_args& base, GroupLr&& group_lr, GradOf&& grad_of) {
    for (std::size_t k = 0; k < inner_.ranges().size(); ++k) {
      step_range(k, stream_, base, group_lr, grad_of);
    }
  }

  /// The step of owned range `k`, its copies on `s`. Range 0 posts the gradient copies of every range
  /// (the engine steps ranges in order); any other range posts its own when range 0 did not.
  template <class GradOf, class GroupLr>
  void step_range(std::size_t k, const stream_type& s, const adamw_step_args& base, GroupLr&& group_lr,
                  GradOf&& grad_of) {
    grads_.wait(k, s, grad_of, "offloaded_adamw");
    const auto& [range, state_offset] = inner_.ranges()[k];
    inner_.step_range(k, host_stream_, base, group_lr,
                      [&](const flat_range&, std::size_t off) { return grads_.at(off); });
    if (!params_on_host_) {
      copy_async<device_host_accessible>(backend_, s, host_params(state_offset),
                                         in_file_ ? in_file_(param_use::update, k) : device_params(range, state_offset),
                                         range.size() * param_size_);
    }
  }

private:
  static std::size_t state_elements(const flat_layout& layout, const adamw_placement& place) {
    return owned_ranges(layout, place).second;
  }
  std::byte* host_params(std::size_t state_offset) { return host_params_.data() + state_offset * param_size_; }
  std::byte* device_params(const flat_range& range, std::size_t state_offset) {
    const auto base = in_file_ ? in_file_(param_use::whole, 0) : device_params_;
    return base + (device_sharded_ ? state_offset : range.begin) * param_size_;
  }

  Backend& backend_;
  stream_type& stream_;
  host_counting counted_;
  host_backend host_;
  typename host_backend::stream_type host_stream_;
  std::byte* device_params_;
  bool device_sharded_;
  bool params_on_host_; // the parameters are the host shard itself: updated in place, nothing copied
  std::function<std::byte*(param_use, std::size_t)> in_file_; // parameters in a file (offload_param nvme)
  std::size_t param_size_;
  buffer<std::byte, host_counting> host_params_;
  partitioned_adamw<host_backend, HostAlloc> inner_;
  detail::host_gradients<Backend, device_host_accessible, host_counting, host_backend> grads_;
};

} // namespace zero
