#include "../../examples/arena_allocator/arena.hpp" // the allocator of docs/allocators.md
#include "zero/memory/buffer.hpp"
#include "zero/memory/counting_allocator.hpp"
#include "zero/memory/failing_allocator.hpp"
#include "zero/memory/host_allocator.hpp"

#include <concepts>
#include <cstdint>
#include <doctest/doctest.h>
#include <limits>
#include <new>
#include <string>
#include <vector>

using zero::memory_tag;

namespace {

/// How `limited_allocator` fails once its budget is spent.
enum class failure_mode { bad_alloc, null, memory_error };

/// Host memory up to a byte budget, then a failure of the chosen kind. It has no default
/// constructor: the decorators must take it from their caller.
class limited_allocator {
public:
  static constexpr bool host_accessible = true;
  static constexpr bool device_accessible = false;

  limited_allocator(std::size_t budget, failure_mode mode) : budget_(budget), mode_(mode) {}

  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) {
    if (bytes > budget_ - *live_) {
      switch (mode_) {
      case failure_mode::bad_alloc:
        throw std::bad_alloc();
      case failure_mode::null:
        return nullptr;
      case failure_mode::memory_error:
        throw zero::memory_error("limited_allocator: " + std::to_string(bytes) + " bytes are over the budget", 7);
      }
    }
    void* p = zero::host_allocator{}.allocate(bytes, alignment);
    *live_ += bytes;
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    zero::host_allocator{}.deallocate(p, bytes, alignment);
    *live_ -= bytes;
  }
  [[nodiscard]] std::size_t live() const noexcept { return *live_; }

private:
  std::size_t budget_;
  failure_mode mode_;
  std::shared_ptr<std::size_t> live_ = std::make_shared<std::size_t>(0);
};
static_assert(zero::allocator<limited_allocator>);
static_assert(!std::default_initializable<limited_allocator>);

} // namespace

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

TEST_CASE("decorators take an inner allocator that has no default constructor") {
  using counting = zero::counting_allocator<limited_allocator>;
  using failing = zero::failing_allocator<limited_allocator>;
  // A default exists exactly when the inner allocator has one.
  CHECK(std::default_initializable<zero::counting_allocator<zero::host_allocator>>);
  CHECK(!std::default_initializable<counting>);
  CHECK(std::constructible_from<zero::failing_allocator<zero::host_allocator>, zero::failure_plan>);
  CHECK(!std::constructible_from<failing, zero::failure_plan>);

  const limited_allocator inner(1000, failure_mode::memory_error);
  counting c(inner);
  failing f({.fail_at = 1}, inner);
  zero::counting_allocator<failing> both(f);
  using both_buffer = zero::buffer<float, decltype(both)>;
  zero::buffer<float, counting> a(c, 10, memory_tag::params);
  both_buffer b(both, 10, memory_tag::grads);
  CHECK(inner.live() == 80);
  CHECK_THROWS_AS(both_buffer(both, 1, memory_tag::grads), zero::memory_error);
  CHECK(both.live(memory_tag::grads) == 40);

  // An inner allocator that fails by returning null: the failing allocator does not count the bytes.
  zero::failing_allocator<limited_allocator> over_null({}, limited_allocator(10, failure_mode::null));
  zero::counting_allocator<decltype(over_null)> counted(over_null);
  using null_buffer = zero::buffer<float, decltype(counted)>;
  CHECK_THROWS_WITH_AS(null_buffer(counted, 100, memory_tag::params),
                       doctest::Contains("; the allocator returned a null pointer"), zero::memory_error);
  CHECK(over_null.live() == 0);
  CHECK(counted.total().live == 0);
}

TEST_CASE("an allocation failure of any kind becomes a memory_error naming the tag, the bytes and the live bytes") {
  for (const auto mode : {failure_mode::bad_alloc, failure_mode::null, failure_mode::memory_error}) {
    CAPTURE(static_cast<int>(mode));
    const limited_allocator inner(1000, mode);
    zero::counting_allocator<limited_allocator> a(inner);
    {
      zero::buffer<float, decltype(a)> p(a, 100, memory_tag::params);
      zero::buffer<float, decltype(a)> g(a, 50, memory_tag::grads);
      try {
        zero::buffer<float, decltype(a)> m(a, 200, memory_tag::optimizer);
        FAIL("no memory_error");
      } catch (const zero::memory_error& e) {
        const std::string what = e.what();
        CAPTURE(what);
        CHECK(what.starts_with("[zero.memory_error] could not allocate 800 bytes of optimizer (alignment 256); "
                               "live: params 400, grads 200, 600 bytes in all; "));
        switch (mode) {
        case failure_mode::bad_alloc:
          CHECK(what.ends_with("; the allocator threw std::bad_alloc"));
          break;
        case failure_mode::null:
          CHECK(what.ends_with("; the allocator returned a null pointer"));
          break;
        case failure_mode::memory_error:
          // The allocator's own message follows, without a second id; its status is kept.
          CHECK(what.ends_with("600 bytes in all; limited_allocator: 800 bytes are over the budget"));
          CHECK(e.status() == 7);
          break;
        }
      }
      // The failed request is not counted.
      CHECK(a.live(memory_tag::optimizer) == 0);
      CHECK(a.counts(memory_tag::optimizer).allocations == 0);
      CHECK(a.total().live == 600);
      CHECK(inner.live() == 600);
    }
    CHECK(a.total().live == 0);
    CHECK(inner.live() == 0);
  }
}

TEST_CASE("a buffer over a plain allocator names the tag and bytes of a failed allocation") {
  using buf = zero::buffer<double, limited_allocator>;
  CHECK_THROWS_WITH_AS(buf(limited_allocator(100, failure_mode::bad_alloc), 20, memory_tag::buffers),
                       "[zero.memory_error] could not allocate 160 bytes of buffers (alignment 256); the allocator "
                       "threw std::bad_alloc",
                       zero::memory_error);
}

TEST_CASE("a buffer whose byte count overflows throws memory_error before allocating") {
  const limited_allocator inner(1000, failure_mode::memory_error);
  zero::counting_allocator<limited_allocator> a(inner);
  const std::size_t count = std::numeric_limits<std::size_t>::max() / 2;
  static_assert(sizeof(std::size_t) == 8, "the message below spells 2^63 - 1");
  using buf = zero::buffer<float, decltype(a)>;
  CHECK_THROWS_WITH_AS(buf(a, count, memory_tag::params),
                       doctest::Contains("9223372036854775807 elements of 4 bytes for params overflow"),
                       zero::memory_error);
  CHECK(a.total().allocations == 0);
}

TEST_CASE("the example's arena, too small, gives a memory_error naming the tag, the bytes and the live bytes") {
  static_assert(zero::allocator<example::arena> && !std::default_initializable<example::arena>);
  zero::counting_allocator<example::arena> a(example::arena(1024));
  {
    zero::buffer<float, decltype(a)> p(a, 100, memory_tag::params); // bytes 0-400 of the block
    zero::buffer<float, decltype(a)> g(a, 50, memory_tag::grads);   // bytes 512-712: aligned to 256
    using buf = zero::buffer<float, decltype(a)>;
    CHECK_THROWS_WITH_AS(buf(a, 200, memory_tag::optimizer),
                         "[zero.memory_error] could not allocate 800 bytes of optimizer (alignment 256); live: params "
                         "400, grads 200, 600 bytes in all; arena: 800 bytes do not fit in the 312 bytes left of 1024",
                         zero::memory_error);
    CHECK(a.inner().high_water() == 712);
  }
  CHECK(a.total().live == 0);
  // Everything came back: the arena starts again from the front.
  zero::buffer<float, decltype(a)> whole(a, 256, memory_tag::optimizer);
  CHECK(a.live(memory_tag::optimizer) == 1024);
}
