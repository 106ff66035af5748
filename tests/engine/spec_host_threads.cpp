// The host-side parts of the offloaded optimizer's overlaps, each on its own: `detail::job_thread` (the
// thread that runs the updates during backward and the step beside the forward), `detail::range_flags`
// (the words a stream or a thread waits for) and `detail::second_home` (where an update during backward
// writes).

#include "zero/engine/step/detail/job_thread.hpp"
#include "zero/engine/step/detail/range_flags.hpp"
#include "zero/engine/step/detail/second_home.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <doctest/doctest.h>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace {

using counting = zero::counting_allocator<zero::host_allocator>;

} // namespace

TEST_CASE("job_thread runs jobs in order, drain rethrows the first error, cancel_pending drops what has not started") {
  zero::detail::job_thread t;
  std::vector<int> ran;
  std::atomic<bool> started{false};
  std::atomic<bool> release{false};
  t.post([&] {
    started = true;
    while (!release.load()) {
      std::this_thread::yield();
    }
    ran.push_back(0);
  });
  t.post([&] { ran.push_back(1); });
  t.post([&] { throw std::runtime_error("job 2"); });
  t.post([&] { ran.push_back(3); });
  // Job 0 holds the thread until released: the three behind it have not started, and are dropped.
  while (!started.load()) {
    std::this_thread::yield();
  }
  CHECK(t.cancel_pending() == 3);
  release = true;
  t.drain();
  CHECK(ran == std::vector<int>{0});

  t.post([&] { ran.push_back(4); });
  t.post([&] { throw std::runtime_error("job 5"); });
  t.post([&] { throw std::runtime_error("job 6"); });
  t.post([&] { ran.push_back(7); });
  CHECK_THROWS_WITH_AS(t.drain(), "job 5", std::runtime_error); // the first error; the jobs after it ran
  CHECK(ran == std::vector<int>{0, 4, 7});
  t.drain(); // reported once
  CHECK(t.cancel_pending() == 0);
}

TEST_CASE("range_flags: a thread waiting for a word returns once another sets it, compared cyclically") {
  counting alloc{zero::host_allocator{}};
  zero::detail::range_flags<counting> flags(alloc, 3);
  CHECK(flags.size() == 3);
  CHECK(alloc.live(zero::memory_tag::buffers) == 3 * sizeof(std::uint32_t));
  flags.wait_here(1, 0); // every word starts at 0: step 0 is reached
  std::vector<int> order;
  std::atomic<int> step{0};
  std::thread waiter([&] {
    flags.wait_here(2, 5);
    order.push_back(step.load());
  });
  step = 1;
  flags.set(2, 4); // not yet 5: the waiter goes on waiting
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  step = 2;
  flags.set(2, 5);
  waiter.join();
  CHECK(order == std::vector<int>{2});
  // Step numbers wrap: 1 comes after 0xffffffff.
  flags.set(0, 1);
  flags.wait_here(0, 0xffffffffU);
}

TEST_CASE("second_home: pieces of the state in either home, and settling back to the first") {
  counting alloc{zero::host_allocator{}};
  // Three ranges of 4, 4 and 8 state elements.
  const std::vector<std::pair<zero::flat_range, std::size_t>> ranges = {{{0, 4}, 0}, {{4, 8}, 4}, {{8, 16}, 8}};
  using pieces = std::vector<std::pair<bool, std::pair<std::size_t, std::size_t>>>; // (second, (lo, n))
  auto pieces_of = [&](zero::detail::second_home<counting>& h, std::size_t first, std::size_t n) {
    pieces out;
    h.for_each_piece(ranges, 16, zero::state_tensor::exp_avg, first, n,
                     [&](float* second, std::size_t lo, std::size_t count) {
                       out.push_back({second != nullptr, {lo, count}});
                     });
    return out;
  };

  zero::detail::second_home<counting> none;
  CHECK(none.elements() == 0);
  CHECK(pieces_of(none, 2, 12) == pieces{{false, {2, 12}}}); // no second home: one piece in the first
  CHECK_THROWS_AS(pieces_of(none, 10, 7), zero::usage_error);

  // A share of 0.75 gives the last two ranges (12 elements) a second home.
  zero::detail::second_home<counting> h(ranges, 16, 0.75, alloc);
  CHECK(h.first() == 1);
  CHECK(h.elements() == 12);
  CHECK(alloc.live(zero::memory_tag::buffers) == 12 * 3 * sizeof(float));
  CHECK(pieces_of(h, 0, 16) == pieces{{false, {0, 16}}}); // every range in its first home
  h.flip(2);
  CHECK(h.side(2) == 1);
  CHECK(pieces_of(h, 2, 12) == pieces{{false, {2, 6}}, {true, {8, 6}}});
  h.at(8).m[1] = 42.0F;
  std::vector<float> master(16), m(16), v(16);
  h.settle(ranges, [&](std::size_t k) {
    const std::size_t off = ranges[k].second;
    return zero::detail::state_home{master.data() + off, m.data() + off, v.data() + off};
  });
  CHECK(h.side(2) == 0);
  CHECK(m[9] == 42.0F);
  CHECK(pieces_of(h, 0, 16) == pieces{{false, {0, 16}}});
}
