#pragma once
/// \file
/// The small thread pool `zero::cpu_backend` owns: N - 1 workers plus the calling thread run the
/// indices of one `parallel_for` at a time. Indices are claimed one by one from a shared ticket,
/// so which thread runs which index varies; kernels that reduce therefore write one partial per
/// index and combine the partials in index order afterwards, which makes their results independent
/// of the thread count. Submitting a job allocates nothing.
///
/// A job is finished when all of its indices are: the caller never waits for a worker that has not
/// started (one the OS has not scheduled yet on a busy machine simply finds the job gone when it
/// wakes), only for indices a worker has claimed and is running.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace zero::detail {

/// A fixed set of worker threads that run `parallel_for` jobs together with the caller.
/// Thread-safe: jobs submitted from several threads run one after the other.
class thread_pool {
public:
  /// Starts `threads - 1` workers (the caller is the last thread); `threads` of 0 counts as 1.
  explicit thread_pool(unsigned threads) {
    const unsigned workers = threads > 1 ? threads - 1 : 0;
    workers_.reserve(workers);
    try {
      for (unsigned i = 0; i < workers; ++i) {
        workers_.emplace_back([this] { worker_loop(); });
      }
    } catch (...) {
      stop_workers();
      throw;
    }
  }
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;
  ~thread_pool() { stop_workers(); }

  /// Threads that run a job, the caller included.
  [[nodiscard]] unsigned size() const noexcept { return static_cast<unsigned>(workers_.size()) + 1; }

  /// Calls `fn(i)` exactly once for every i in [0, count), spread over the pool and the calling
  /// thread, and returns when all calls have returned. `fn` must not throw; count < 2^32.
  template <class F> void parallel_for(std::size_t count, F&& fn) {
    static_assert(std::is_nothrow_invocable_v<F&, std::size_t>, "thread_pool::parallel_for: fn must be noexcept");
    if (count == 0) {
      return;
    }
    if (workers_.empty() || count == 1) {
      for (std::size_t i = 0; i < count; ++i) {
        fn(i);
      }
      return;
    }
    std::lock_guard submit(submit_);
    job j{};
    {
      std::lock_guard lock(mutex_);
      j.ctx = static_cast<void*>(&fn);
      j.call = [](void* ctx, std::size_t i) noexcept { (*static_cast<std::remove_reference_t<F>*>(ctx))(i); };
      j.count = static_cast<std::uint32_t>(count);
      j.generation = ++generation_;
      job_ = j;
      done_.store(0, std::memory_order_relaxed);
      // A new generation in the high half invalidates every ticket of the previous job.
      ticket_.store(static_cast<std::uint64_t>(j.generation) << 32, std::memory_order_release);
    }
    work_.notify_all();
    run(j);
    if (done_.load(std::memory_order_acquire) != j.count) {
      std::unique_lock lock(mutex_);
      finished_.wait(lock, [&] { return done_.load(std::memory_order_acquire) == j.count; });
    }
  }

private:
  struct job {
    void* ctx;
    void (*call)(void*, std::size_t) noexcept;
    std::uint32_t count;
    std::uint32_t generation;
  };

  // Claims and runs indices of job `j` until there are none left or another job has replaced it.
  void run(const job& j) noexcept {
    std::uint64_t t = ticket_.load(std::memory_order_acquire);
    for (;;) {
      const auto generation = static_cast<std::uint32_t>(t >> 32);
      const auto index = static_cast<std::uint32_t>(t);
      if (generation != j.generation || index >= j.count) {
        return;
      }
      if (!ticket_.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        continue;
      }
      j.call(j.ctx, index);
      if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == j.count) {
        // The last index: wake the caller if it sleeps. Taking the mutex orders this after its check.
        std::lock_guard lock(mutex_);
        finished_.notify_all();
      }
      t = ticket_.load(std::memory_order_acquire);
    }
  }

  void worker_loop() noexcept {
    std::uint32_t seen = 0;
    for (;;) {
      job j{};
      {
        std::unique_lock lock(mutex_);
        work_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) {
          return;
        }
        seen = generation_;
        j = job_;
      }
      // `j` is a copy taken under the mutex: valid for as long as its indices can be claimed.
      run(j);
    }
  }

  void stop_workers() noexcept {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    for (auto& t : workers_) {
      if (t.joinable()) {
        t.join();
      }
    }
    workers_.clear();
  }

  std::vector<std::thread> workers_;
  std::mutex submit_;
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable finished_;
  job job_{};
  std::uint32_t generation_ = 0;
  bool stop_ = false;
  std::atomic<std::uint64_t> ticket_{0};
  std::atomic<std::uint32_t> done_{0};
};

} // namespace zero::detail
