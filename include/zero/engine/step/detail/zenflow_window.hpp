#pragma once
/// \file
/// `detail::zenflow_window`: ZenFlow's window (`zenflow_adamw`, docs/offload.md "Selective"), the fp32 sum in host
/// memory of the gradients of the steps since the host's last update, one value per state element, with the host
/// kernels that fill it. A step's gradients are added range by range on a thread of the window's own (`post`),
/// beside the next step's forward and backward; the next step waits for range k's add (`wait`) only before its
/// slice of range k is copied over the host shard that add reads. The window's first step is cast into it, so
/// emptying it costs nothing; `values` fills an empty window with zeros for a reader.

#include "zero/core/dispatch.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/flat_layout.hpp"
#include "zero/engine/step/detail/job_thread.hpp"
#include "zero/engine/step/offload_options.hpp"
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace zero::detail {

/// ZenFlow's window over the owned ranges `ranges` (each its flat range and its offset in the state); see the file
/// comment. `HostAlloc` is the host's allocator, counted by `memory` under `memory_tag::grads`.
template <class HostAlloc> class zenflow_window {
  using counting = counting_allocator<HostAlloc>;

public:
  zenflow_window(const counting& memory, HostAlloc host, unsigned threads,
                 const std::vector<std::pair<flat_range, std::size_t>>& ranges, std::size_t elements, dtype grad_type)
      : ranges_(ranges), grad_type_(grad_type), kernels_(make_host_backend(threads, std::move(host))),
        sum_(memory, std::max<std::size_t>(elements, 1), memory_tag::grads),
        added_(std::make_unique<std::atomic<bool>[]>(ranges.size())), pending_(ranges.size(), nullptr) {
    for (std::size_t k = 0; k < ranges.size(); ++k) {
      added_[k].store(true);
    }
    kernels_.fill(sum_.data(), sum_.size(), 0.0F, stream_); // its pages touched once, here
  }

  /// The sum of `steps` steps, its adds finished; zeros when `steps` is 0 (its memory is then filled first).
  [[nodiscard]] std::span<float> values(std::int64_t steps, std::size_t elements) {
    join();
    if (steps == 0) {
      kernels_.fill(sum_.data(), sum_.size(), 0.0F, stream_);
    }
    return {sum_.data(), elements};
  }

  /// Range `k`'s gradients are in the host shard at `g`: added into the window at `post_all`.
  void hold(std::size_t k, std::byte* g) { pending_[k] = g; }
  /// Posts the adds of the ranges held, the last ranges first (as backward hands them over again); `first`: the
  /// window's first step, cast into it instead.
  void post_all(bool first) {
    for (std::size_t k = ranges_.size(); k-- > 0;) {
      if (std::byte* g = std::exchange(pending_[k], nullptr)) {
        added_[k].store(false);
        adds_.post([this, k, g, first] { add(k, g, first); });
      }
    }
  }
  /// Waits for range `k`'s add.
  void wait(std::size_t k) const { added_[k].wait(false); }
  /// Waits for every add. \throws the first error an add threw.
  void join() { adds_.drain(); }

  /// Writes the mean of the window's `steps` steps and range `k`'s gradients at `g` (the host shard) into `g`;
  /// the window is empty after it (the next step casts into it). After `join`.
  void mean_into(std::size_t k, std::byte* g, std::int64_t steps) {
    const float inverse = 1.0F / static_cast<float>(steps + 1);
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      G* shard = reinterpret_cast<G*>(g);
      float* w = sum_.data() + ranges_[k].second;
      const std::size_t n = ranges_[k].first.size();
      kernels_.accumulate(shard, w, n, stream_);
      kernels_.scale(w, n, inverse, stream_);
      kernels_.cast(w, shard, n, stream_);
    });
  }

private:
  /// Range `k`'s gradients at `g` into the window: cast when it is the window's first step, else added. On the
  /// window's thread; marks the range done even when a kernel throws (`join` rethrows).
  void add(std::size_t k, std::byte* g, bool first) {
    struct done_mark {
      std::atomic<bool>& flag;
      ~done_mark() {
        flag.store(true);
        flag.notify_all();
      }
    } mark{added_[k]};
    visit_float(grad_type_, [&]<class G>(type_tag<G>) {
      const G* src = reinterpret_cast<const G*>(g);
      float* dst = sum_.data() + ranges_[k].second;
      if (first) {
        kernels_.cast(src, dst, ranges_[k].first.size(), stream_);
      } else {
        kernels_.accumulate(src, dst, ranges_[k].first.size(), stream_);
      }
    });
  }

  const std::vector<std::pair<flat_range, std::size_t>>& ranges_;
  dtype grad_type_;
  host_backend_t<HostAlloc> kernels_;
  typename host_backend_t<HostAlloc>::stream_type stream_;
  buffer<float, counting> sum_;
  // Per range whether its add is done, and the host shard a held range's add reads. The thread is declared last,
  // so that it is joined before the buffers its jobs use go.
  std::unique_ptr<std::atomic<bool>[]> added_;
  std::vector<std::byte*> pending_;
  job_thread adds_;
};

} // namespace zero::detail
