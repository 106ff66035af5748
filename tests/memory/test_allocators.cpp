#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/failing_allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstdint>
#include <doctest/doctest.h>
#include <vector>

using zero::memory_tag;

static_assert(zero::allocator<zero::counting_allocator<zero::host_allocator>>);
static_assert(zero::tagged_allocator<zero::counting_allocator<zero::host_allocator>>);
static_assert(!zero::tagged_allocator<zero::host_allocator>);
static_assert(zero::allocator<zero::failing_allocator<zero::host_allocator>>);
static_assert(!zero::allocator<int>);

// GCC names the sanitizers with __SANITIZE_*__, Clang through __has_feature.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ZERO_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ZERO_TEST_SANITIZED 1
#endif
#endif

TEST_CASE("host_allocator aligns and refuses a bad alignment") {
  zero::host_allocator a;
  for (std::size_t align : {8u, 64u, 256u, 4096u}) {
    void* p = a.allocate(100, align);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % align == 0);
    a.deallocate(p, 100, align);
  }
  CHECK_THROWS_WITH_AS((void)a.allocate(8, 24), doctest::Contains("power of two, got 24"), zero::usage_error);
#if !defined(ZERO_TEST_SANITIZED)
  // The sanitizers abort on a request this size instead of letting operator new throw.
  CHECK_THROWS_WITH_AS((void)a.allocate(std::size_t{1} << 62, 64), doctest::Contains("could not allocate"),
                       zero::memory_error);
#endif
}

TEST_CASE("counting_allocator tracks live and peak bytes per tag") {
  zero::counting_allocator<zero::host_allocator> a;
  {
    zero::buffer<float, decltype(a)> p(a, 1000, memory_tag::params);
    zero::buffer<float, decltype(a)> g(a, 500, memory_tag::grads);
    CHECK(a.live(memory_tag::params) == 4000);
    CHECK(a.live(memory_tag::grads) == 2000);
    CHECK(a.total().live == 6000);
    {
      zero::buffer<std::uint16_t, decltype(a)> tmp(a, 3000, memory_tag::buffers);
      CHECK(a.peak(memory_tag::buffers) == 6000);
    }
    CHECK(a.live(memory_tag::buffers) == 0);
    CHECK(a.peak(memory_tag::buffers) == 6000);
    CHECK(a.total().peak == 12000);
    a.reset_peaks();
    CHECK(a.total().peak == 6000);
    // Moving a buffer moves ownership, not bytes.
    auto moved = std::move(p);
    CHECK(a.live(memory_tag::params) == 4000);
    CHECK(moved.size() == 1000);
  }
  CHECK(a.total().live == 0);
  CHECK(a.counts(memory_tag::params).allocations == 1);
}

TEST_CASE("failing_allocator injects failures and the counting allocator shows nothing leaked") {
  zero::counting_allocator<zero::host_allocator> counter;
  using failing = zero::failing_allocator<decltype(counter)>;
  SUBCASE("by index") {
    failing a({.fail_at = 2}, counter);
    std::vector<zero::buffer<float, failing>> bufs;
    bufs.emplace_back(a, 10);
    bufs.emplace_back(a, 10);
    CHECK_THROWS_WITH_AS(bufs.emplace_back(a, 10), doctest::Contains("injected failure of allocation #2"),
                         zero::memory_error);
    CHECK(a.failures() == 1);
    bufs.emplace_back(a, 10); // not sticky: the next one works
    CHECK(counter.total().live == 3 * 40);
  }
  SUBCASE("by budget, sticky") {
    failing a({.byte_budget = 100, .sticky = true}, counter);
    zero::buffer<float, failing> ok(a, 20);
    using fbuf = zero::buffer<float, failing>;
    CHECK_THROWS_AS(fbuf(a, 10), zero::memory_error);
    CHECK_THROWS_AS(fbuf(a, 1), zero::memory_error);
    CHECK(a.live() == 80);
  }
  CHECK(counter.total().live == 0);
}
