#pragma once
/// \file
/// `detail::range_flags`: one 32-bit word per owned range, in the backend's host memory, that a host
/// thread sets to a step's number once it has finished that range (`offloaded_adamw`'s step beside
/// the next forward). `wait` makes a stream wait for a word on the device where the backend can
/// (`zero::can_wait_value`: CUDA's stream memory operations), so the caller posts everything at once
/// and returns; otherwise the calling thread waits for the word (the CPU backend, whose streams are
/// the calling thread anyway).
///
/// Words compare cyclically (`std::int32_t(word - value) >= 0`, as the device does), so a step number
/// may wrap. A set is a release store: whatever the setting thread wrote before it (the range's new
/// state and parameters) is visible to a thread, or a device copy, that saw the word.

#include "zero/backend/backend.hpp"
#include "zero/memory/buffer.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace zero::detail {

/// The words; see the file comment. `Alloc` is the backend's host allocator (pinned and mapped for
/// CUDA, so the device can read the words).
template <class Alloc> class range_flags {
public:
  range_flags() = default;
  /// `n` words, all 0 (no step has set one). \param alloc counted under `memory_tag::buffers`.
  range_flags(Alloc alloc, std::size_t n) : words_(std::move(alloc), n, memory_tag::buffers) {
    for (std::size_t k = 0; k < n; ++k) {
      words_.data()[k] = 0;
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return words_.size(); }

  /// Sets word `k` to `value` (a release store) and wakes the threads waiting for it.
  void set(std::size_t k, std::uint32_t value) noexcept {
    std::atomic_ref<std::uint32_t> w(words_.data()[k]);
    w.store(value, std::memory_order_release);
    w.notify_all();
  }

  /// Makes `s` wait until word `k` reaches `value`: on the device where `Backend` can, else here.
  template <class Backend>
  void wait(const Backend& b, const typename Backend::stream_type& s, std::size_t k, std::uint32_t value) {
    if constexpr (can_wait_value<Backend>) {
      b.wait_value(s, words_.data() + k, value);
    } else {
      wait_here(k, value);
    }
  }

  /// Blocks the calling thread until word `k` reaches `value`.
  void wait_here(std::size_t k, std::uint32_t value) {
    std::atomic_ref<std::uint32_t> w(words_.data()[k]);
    for (;;) {
      const std::uint32_t now = w.load(std::memory_order_acquire);
      if (static_cast<std::int32_t>(now - value) >= 0) {
        return;
      }
      w.wait(now, std::memory_order_acquire);
    }
  }

private:
  buffer<std::uint32_t, Alloc> words_;
};

} // namespace zero::detail
