#pragma once
/// \file
/// `detail::job_thread`: one thread that runs posted jobs in order, for host work beside the caller
/// (`offloaded_adamw`'s updates during backward, and its step beside the next forward). `drain` waits for every job
/// posted so far and rethrows the first exception one threw; the jobs after a throwing one still run. The thread starts
/// with the first job; the destructor drops jobs not yet started and joins the thread.

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace zero::detail {

/// A thread running posted jobs in order; see the file comment.
class job_thread {
public:
  job_thread() = default;
  job_thread(const job_thread&) = delete;
  job_thread& operator=(const job_thread&) = delete;
  /// Drops the jobs not yet started, waits for the running one and joins the thread.
  ~job_thread() {
    {
      const std::lock_guard lock(mu_);
      stop_ = true;
      jobs_.clear();
    }
    ready_.notify_all();
    if (thread_.joinable()) {
      thread_.join();
    }
  }

  /// Runs `job` on the thread after the jobs posted before it.
  void post(std::function<void()> job) {
    {
      const std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
      if (!thread_.joinable()) {
        thread_ = std::thread([this] { run(); });
      }
    }
    ready_.notify_one();
  }

  /// Drops the jobs not yet started (the running one, if any, goes on). \returns how many were dropped.
  std::size_t cancel_pending() {
    const std::lock_guard lock(mu_);
    const std::size_t n = jobs_.size();
    jobs_.clear();
    if (!busy_) {
      idle_.notify_all();
    }
    return n;
  }

  /// Waits until every job posted so far has run. \throws the first exception a job threw since the
  /// last `drain`.
  void drain() {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [this] { return jobs_.empty() && !busy_; });
    if (error_) {
      std::rethrow_exception(std::exchange(error_, nullptr));
    }
  }

private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      ready_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
      if (stop_) {
        return;
      }
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr e;
      try {
        job();
      } catch (...) {
        e = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (e && !error_) {
        error_ = e;
      }
      if (jobs_.empty()) {
        idle_.notify_all();
      }
    }
  }

  std::mutex mu_;
  std::condition_variable ready_;
  std::condition_variable idle_;
  std::deque<std::function<void()>> jobs_;
  std::exception_ptr error_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

} // namespace zero::detail
