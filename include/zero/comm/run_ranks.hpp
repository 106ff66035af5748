#pragma once
/// \file
/// `zero::run_ranks(n, fn)`: runs a group of `thread_communicator` ranks on threads of this process
/// and gives back the cause when one fails, even while another rank is stuck.
/// Included by `zero/comm/thread_communicator.hpp`.

#include "zero/comm/thread_communicator.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace zero {

/// Runs `fn(comm)` on `n` threads, one per rank of a new group, and joins them. When a rank
/// throws, the group is broken so that no other rank waits for it until its timeout, and the
/// cause is rethrown here: the first exception to arrive that is not an echo of another rank's
/// failure (`zero::error::echo()`: a broken group, a phase another rank failed), or the first
/// echo when every exception is one. A rethrown `zero::error` names its rank ("[zero.io_error]
/// rank 2: ..."); other exceptions are rethrown unchanged.
///
/// A rank that is stuck outside the group (in a read that never returns, a loop of the caller's)
/// does not hold the error back: once one rank has failed, the others get a twentieth of the
/// timeout to return (a rank waiting in the group returns at once: the group is broken); a thread still running then is
/// detached, and the error is rethrown with the ranks left running named ("rank 3 had not returned 50 ms after rank 0
/// failed; its thread is left running"). Such a thread still refers to what `fn` refers to: end the process, or keep
/// those objects alive, after an error that names ranks left running. run_ranks' own state lives as long as the last of
/// its threads.
template <class Fn> void run_ranks(int n, Fn&& fn, const thread_group_options& options = {}) {
  // A temporary is kept with the state; an lvalue is called where it is, as the caller's.
  using fn_type = std::conditional_t<std::is_lvalue_reference_v<Fn>, Fn, std::decay_t<Fn>>;
  struct shared_state {
    explicit shared_state(Fn&& f) : fn(std::forward<Fn>(f)) {}
    fn_type fn;
    std::mutex mutex;
    std::condition_variable done_cv;
    std::exception_ptr cause;
    bool cause_is_echo = false;
    int first_failed = -1;
    int running = 0;
    std::vector<bool> done;
  };
  auto state = std::make_shared<shared_state>(std::forward<Fn>(fn));
  auto group = thread_communicator::make_group(n, options.name);
  state->running = n;
  state->done.assign(static_cast<std::size_t>(n), false);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([state, group, r, timeout = options.timeout] {
      try {
        thread_communicator comm(group, r, timeout);
        state->fn(comm);
      } catch (...) {
        bool echo = false;
        try {
          throw;
        } catch (error& e) {
          // Only this thread holds the exception object until it is stored below.
          echo = e.echo();
          e.name_rank(r);
        } catch (...) { // NOLINT(bugprone-empty-catch): other exceptions are kept as thrown
        }
        {
          std::lock_guard lock(state->mutex);
          if (!state->cause || (state->cause_is_echo && !echo)) {
            state->cause = std::current_exception();
            state->cause_is_echo = echo;
          }
          if (state->first_failed < 0) {
            state->first_failed = r;
          }
        }
        std::lock_guard lock(group->mutex);
        group->break_locked("rank " + std::to_string(r) + " exited with an exception", false);
      }
      std::lock_guard lock(state->mutex);
      state->done[static_cast<std::size_t>(r)] = true;
      --state->running;
      state->done_cv.notify_all();
    });
  }
  // A rank that waits in the group returns at once; the rest is the time a rank may take to unwind.
  const auto grace = std::max<std::chrono::milliseconds>(options.timeout / 20, std::chrono::milliseconds(1));
  std::unique_lock lock(state->mutex);
  state->done_cv.wait(lock, [&] { return state->running == 0 || state->first_failed >= 0; });
  static_cast<void>(state->done_cv.wait_for(lock, grace, [&] { return state->running == 0; }));
  std::vector<int> stuck;
  for (int r = 0; r < n; ++r) {
    if (!state->done[static_cast<std::size_t>(r)]) {
      stuck.push_back(r);
    }
  }
  std::exception_ptr cause = state->cause;
  const int first_failed = state->first_failed;
  lock.unlock();
  for (int r = 0; r < n; ++r) {
    auto& t = threads[static_cast<std::size_t>(r)];
    if (std::find(stuck.begin(), stuck.end(), r) != stuck.end()) {
      t.detach();
    } else {
      t.join();
    }
  }
  if (stuck.empty()) {
    if (cause) {
      std::rethrow_exception(cause);
    }
    return;
  }
  std::string ranks;
  for (const int r : stuck) {
    ranks += (ranks.empty() ? "rank " : ", rank ") + std::to_string(r);
  }
  const std::string note = ranks + " had not returned " + std::to_string(grace.count()) + " ms after rank " +
                           std::to_string(first_failed) + " failed; " +
                           (stuck.size() == 1 ? "its thread is" : "their threads are") + " left running";
  try {
    std::rethrow_exception(cause);
  } catch (error& e) {
    e.append_note(note); // keeps the exception's type (timeout_error, io_error, ...)
    throw;
  }
}

} // namespace zero
