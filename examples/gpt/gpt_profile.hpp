#pragma once
/// @file gpt_profile.hpp
/// `op_timer`: where a stream's time goes, operation by operation. Timing events are recorded on the stream
/// between operations (`mark`); each interval between two marks is the time of the operation the first one named,
/// including any wait of the stream inside it. Read back by `collect`, which waits for the last event. For
/// `zero-gpt-cuda --profile` (what bounds a GPT step, docs/gpt.md); the marks cost a few microseconds of host
/// time each and nothing on the device.

#include <cstddef>
#include <cuda_runtime_api.h>
#include <string>
#include <utility>
#include <vector>
#include <zero/core/cuda_check.hpp>

namespace gpt {

class op_timer {
public:
  op_timer() = default;
  op_timer(const op_timer&) = delete;
  op_timer& operator=(const op_timer&) = delete;
  ~op_timer() {
    for (cudaEvent_t e : events_) {
      ZERO_CHECK_CUDA_NOTHROW(cudaEventDestroy(e));
    }
  }

  /// Starts operation `name` (a string that outlives the timer, e.g. a literal) on `stream`: what the stream
  /// runs from here to the next mark counts as it. Collects first when many marks are pending.
  void mark(const char* name, cudaStream_t stream) {
    if (used_ == max_pending) {
      collect();
    }
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      ZERO_CHECK_CUDA(cudaEventCreate(&e));
      events_.push_back(e);
      names_.push_back(nullptr);
    }
    ZERO_CHECK_CUDA(cudaEventRecord(events_[used_], stream));
    names_[used_] = name;
    ++used_;
  }

  /// Waits for the last mark, adds each interval to its operation's total, and keeps the last mark as the start
  /// of the next interval.
  void collect() {
    if (used_ < 2) {
      return;
    }
    ZERO_CHECK_CUDA(cudaEventSynchronize(events_[used_ - 1]));
    for (std::size_t i = 0; i + 1 < used_; ++i) {
      float ms = 0.0f;
      ZERO_CHECK_CUDA(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
      add(names_[i], static_cast<double>(ms));
    }
    std::swap(events_[0], events_[used_ - 1]);
    names_[0] = names_[used_ - 1];
    used_ = 1;
  }

  /// Milliseconds per operation since the last `reset`, in the order each was first seen.
  [[nodiscard]] const std::vector<std::pair<std::string, double>>& totals() { return collect(), totals_; }

  /// Forgets the totals (the pending marks stay: their intervals count from here on).
  void reset() {
    collect();
    totals_.clear();
  }

private:
  static constexpr std::size_t max_pending = 4096;

  void add(const char* name, double ms) {
    for (auto& [n, total] : totals_) {
      if (n == name) {
        total += ms;
        return;
      }
    }
    totals_.emplace_back(name, ms);
  }

  std::vector<cudaEvent_t> events_;
  std::vector<const char*> names_;
  std::size_t used_ = 0;
  std::vector<std::pair<std::string, double>> totals_;
};

} // namespace gpt
