/// \file
/// device_allocator, pinned_allocator and caching_pool: alignment, accessibility, the memory_error a user
/// gets for an impossible request, cache reuse and its counters, sharing between copies, release on
/// destruction, and thread safety; plus ZERO_CHECK_CUDA and its non-throwing twin.

#include "cuda_test_support.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/memory/device_allocator.hpp"
#include "zero/memory/pinned_allocator.hpp"

#include <atomic>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr std::size_t absurd_bytes = std::size_t{1} << 50; // 1 PiB

bool aligned(const void* p, std::size_t alignment) { return reinterpret_cast<std::uintptr_t>(p) % alignment == 0; }

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// An upstream that counts the blocks it has handed out and not yet taken back.
struct counting_upstream {
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  zero::device_allocator inner;
  std::shared_ptr<std::atomic<long>> live = std::make_shared<std::atomic<long>>(0);

  void* allocate(std::size_t bytes, std::size_t alignment) {
    void* p = inner.allocate(bytes, alignment);
    ++*live;
    return p;
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
    inner.deallocate(p, bytes, alignment);
    --*live;
  }
};
static_assert(zero::allocator<counting_upstream>);

using pool_t = zero::caching_pool<zero::device_allocator>;

// Size classes, checked at compile time.
static_assert(pool_t::size_class(0) == 512);
static_assert(pool_t::size_class(1) == 512);
static_assert(pool_t::size_class(512) == 512);
static_assert(pool_t::size_class(513) == 1024);
static_assert(pool_t::size_class((1u << 20) - 1) == (1u << 20));
static_assert(pool_t::size_class(1u << 20) == (1u << 20));
static_assert(pool_t::size_class((1u << 20) + 1) == (1u << 20) + (1u << 15));
static_assert(pool_t::size_class(std::size_t{3} << 30) == std::size_t{3} << 30);
// Past 64 MiB the granule stops at 2 MiB: the largest request is reserved within 2 MiB of its bytes (a 1/32 granule
// reserved 20.40 GB for the 19.89 GB of one AdamW tensor of a 10.68 G-parameter model's device share).
static_assert(pool_t::size_class((std::size_t{64} << 20) + 1) == (std::size_t{66} << 20));
static_assert(pool_t::size_class((std::size_t{64} << 20) - 1) == (std::size_t{64} << 20));
static_assert(pool_t::size_class(402'759'680) == 402'653'184 + (std::size_t{2} << 20));
static_assert(pool_t::size_class(19'885'251'624) - 19'885'251'624 < (std::size_t{2} << 20));
static_assert(pool_t::size_class(19'885'251'624) % (std::size_t{2} << 20) == 0);

} // namespace

TEST_SUITE("allocators") {

  TEST_CASE("device_allocator gives aligned, distinct, usable device memory") {
    zero::device_allocator alloc;
    int current = -1;
    ZERO_CHECK_CUDA(cudaGetDevice(&current));
    CHECK(alloc.device() == current);

    for (const std::size_t alignment :
         {std::size_t{1}, std::size_t{64}, std::size_t{256}, std::size_t{4096}, std::size_t{1} << 16}) {
      CAPTURE(alignment);
      void* p = alloc.allocate(1000, alignment);
      REQUIRE(p != nullptr);
      CHECK(aligned(p, alignment));
      ZERO_CHECK_CUDA(cudaMemset(p, 0x5a, 1000));
      unsigned char last = 0;
      ZERO_CHECK_CUDA(cudaMemcpy(&last, static_cast<unsigned char*>(p) + 999, 1, cudaMemcpyDeviceToHost));
      CHECK(last == 0x5a);
      cudaPointerAttributes attr{};
      ZERO_CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
      CHECK(attr.type == cudaMemoryTypeDevice);
      CHECK(attr.device == current);
      alloc.deallocate(p, 1000, alignment);
    }
    SUBCASE("zero bytes still gives distinct pointers") {
      void* a = alloc.allocate(0);
      void* b = alloc.allocate(0);
      CHECK(a != nullptr);
      CHECK(a != b);
      alloc.deallocate(a, 0);
      alloc.deallocate(b, 0);
      alloc.deallocate(nullptr, 0);
    }
    SUBCASE("copies share state; separate allocators do not") {
      zero::device_allocator copy = alloc;
      CHECK(copy == alloc);
      CHECK_FALSE(zero::device_allocator{} == alloc);
      void* p = alloc.allocate(100, 4096); // over-aligned: freed through the copy's shared bookkeeping
      copy.deallocate(p, 100, 4096);
      CHECK(cudaGetLastError() == cudaSuccess);
    }
    SUBCASE("an explicit device") {
      zero::device_allocator on(current);
      void* p = on.allocate(64);
      on.deallocate(p, 64);
    }
    SUBCASE("a non-power-of-two alignment is a usage error") {
      CHECK_THROWS_AS((void)alloc.allocate(64, 3), zero::usage_error);
    }
  }

  TEST_CASE("an impossible device allocation throws memory_error naming bytes, device and CUDA error") {
    zero::device_allocator alloc;
    try {
      (void)alloc.allocate(absurd_bytes);
      FAIL("allocating 1 PiB succeeded");
    } catch (const zero::memory_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(contains(what, "[zero.memory_error]"));
      CHECK(contains(what, std::to_string(absurd_bytes) + " bytes"));
      CHECK(contains(what, "device " + std::to_string(alloc.device())));
      CHECK(contains(what, "cudaErrorMemoryAllocation"));
      CHECK(e.status() == static_cast<int>(cudaErrorMemoryAllocation));
    }
    // The failure left no error behind for the next launch check to trip over.
    CHECK(cudaGetLastError() == cudaSuccess);
    void* p = alloc.allocate(256);
    alloc.deallocate(p, 256);
  }

  TEST_CASE("pinned_allocator gives host memory that kernels can write") {
    zero::pinned_allocator alloc;
    CHECK(alloc.flags() == zero::pinned_allocator::default_flags);
    const std::size_t n = 1000;
    for (const std::size_t alignment : {std::size_t{16}, std::size_t{256}, std::size_t{4096}, std::size_t{1} << 16}) {
      CAPTURE(alignment);
      auto* p = static_cast<float*>(alloc.allocate(n * sizeof(float), alignment));
      REQUIRE(p != nullptr);
      CHECK(aligned(p, alignment));
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = static_cast<float>(i);
      }
      cudaPointerAttributes attr{};
      ZERO_CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
      CHECK(attr.type == cudaMemoryTypeHost);
      // A kernel writes through the same pointer (mapped, unified addressing); the host reads the result.
      zero::test::test_stream stream;
      zero::cuda::fill(p + 1, n - 2, 7.5f, stream.get());
      stream.sync();
      CHECK(p[0] == 0.0f);
      CHECK(p[1] == 7.5f);
      CHECK(p[n - 2] == 7.5f);
      CHECK(p[n - 1] == static_cast<float>(n - 1));
      alloc.deallocate(p, n * sizeof(float), alignment);
    }
    SUBCASE("an impossible request throws memory_error naming the bytes and the CUDA error") {
      try {
        (void)alloc.allocate(absurd_bytes);
        FAIL("pinning 1 PiB succeeded");
      } catch (const zero::memory_error& e) {
        const std::string what = e.what();
        CAPTURE(what);
        CHECK(contains(what, "pinned_allocator"));
        CHECK(contains(what, std::to_string(absurd_bytes) + " bytes"));
        CHECK(contains(what, "cudaError"));
      }
      CHECK(cudaGetLastError() == cudaSuccess);
    }
  }

  TEST_CASE("pinned_allocator on huge pages: large blocks on 2 MiB pages, pinned, reachable by kernels and copies") {
    zero::huge_pinned_allocator alloc;
    // Where the device cannot use registered memory at the host's address, the option falls back.
    int same_address = 0;
    ZERO_CHECK_CUDA(cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem, 0));
    CHECK(alloc.huge_pages() == (same_address != 0));
    CHECK_FALSE(zero::pinned_allocator{}.huge_pages());
    const std::size_t n = (std::size_t{8} << 20) / sizeof(float) + 3; // 8 MiB and a ragged end
    for (const std::size_t alignment : {std::size_t{256}, std::size_t{1} << 16}) {
      CAPTURE(alignment);
      auto* p = static_cast<float*>(alloc.allocate(n * sizeof(float), alignment));
      REQUIRE(p != nullptr);
      CHECK(aligned(p, alignment));
      if (alloc.huge_pages()) {
        CHECK(aligned(p, zero::pinned_allocator::huge_page_bytes));
      }
      cudaPointerAttributes attr{};
      ZERO_CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
      CHECK(attr.type == cudaMemoryTypeHost);
      for (std::size_t i = 0; i < n; ++i) {
        p[i] = static_cast<float>(i % 1000);
      }
      // A kernel writes through the pointer; an asynchronous copy takes it to the device and back.
      zero::test::test_stream stream;
      zero::cuda::fill(p + 1, n - 2, 7.5f, stream.get());
      void* dv = nullptr;
      ZERO_CHECK_CUDA(cudaMalloc(&dv, n * sizeof(float)));
      auto* d = static_cast<float*>(dv);
      ZERO_CHECK_CUDA(cudaMemcpyAsync(d, p, n * sizeof(float), cudaMemcpyHostToDevice, stream.get()));
      zero::cuda::fill(d, 1, -1.0f, stream.get());
      ZERO_CHECK_CUDA(cudaMemcpyAsync(p, d, n * sizeof(float), cudaMemcpyDeviceToHost, stream.get()));
      stream.sync();
      ZERO_CHECK_CUDA(cudaFree(d));
      CHECK(p[0] == -1.0f);
      CHECK(p[1] == 7.5f);
      CHECK(p[n - 2] == 7.5f);
      CHECK(p[n - 1] == static_cast<float>((n - 1) % 1000));
      alloc.deallocate(p, n * sizeof(float), alignment);
    }
    // Small blocks take cudaHostAlloc, as without the option; both kinds free through the same call.
    void* small = alloc.allocate(4096);
    CHECK(aligned(small, 256));
    alloc.deallocate(small, 4096);
    SUBCASE("an impossible request throws memory_error naming the bytes and the failed call") {
      try {
        (void)alloc.allocate(absurd_bytes);
        FAIL("1 PiB on huge pages succeeded");
      } catch (const zero::memory_error& e) {
        const std::string what = e.what();
        CAPTURE(what);
        CHECK(contains(what, "pinned_allocator"));
        CHECK(contains(what, std::to_string(absurd_bytes) + " bytes"));
        CHECK((contains(what, "mmap") || contains(what, "cudaError")));
      }
      CHECK(cudaGetLastError() == cudaSuccess);
    }
  }

  TEST_CASE("caching_pool reuses freed blocks by size class and counts what it does") {
    zero::caching_device_allocator pool;
    CHECK(pool.cuda_allocations() == 0);

    void* a = pool.allocate(1000);
    CHECK(aligned(a, 256));
    CHECK(pool.cuda_allocations() == 1);
    CHECK(pool.bytes_in_use() == 1024);
    pool.deallocate(a, 1000);
    CHECK(pool.bytes_cached() == 1024);
    CHECK(pool.bytes_in_use() == 0);

    void* b = pool.allocate(1024); // same class as 1000
    CHECK(b == a);
    CHECK(pool.cache_hits() == 1);
    CHECK(pool.cuda_allocations() == 1);
    CHECK(pool.bytes_cached() == 0);

    void* c = pool.allocate(1024, 4096); // same class, other alignment: a block of its own
    CHECK(c != b);
    CHECK(aligned(c, 4096));
    CHECK(pool.cuda_allocations() == 2);

    void* d = pool.allocate(5000); // another class
    CHECK(pool.cuda_allocations() == 3);
    pool.deallocate(b, 1024);
    pool.deallocate(c, 1024, 4096);
    pool.deallocate(d, 5000);
    CHECK(pool.bytes_cached() == 1024 + 1024 + 5120);

    SUBCASE("copies share the cache and the counters") {
      zero::caching_device_allocator copy = pool;
      CHECK(copy == pool);
      void* e = copy.allocate(900);
      CHECK(e == a);
      CHECK(pool.cache_hits() == 2);
      pool.deallocate(e, 900);
      CHECK(copy.bytes_cached() == pool.bytes_cached());
    }
    SUBCASE("release_cached gives everything back; the next request goes to CUDA") {
      CHECK(pool.release_cached() == 1024 + 1024 + 5120);
      CHECK(pool.bytes_cached() == 0);
      void* e = pool.allocate(1000);
      CHECK(pool.cuda_allocations() == 4);
      pool.deallocate(e, 1000);
    }
    SUBCASE("an impossible request releases the cache, retries, then throws memory_error") {
      CHECK(pool.bytes_cached() > 0);
      CHECK_THROWS_AS((void)pool.allocate(absurd_bytes), zero::memory_error);
      CHECK(pool.bytes_cached() == 0);
      CHECK(cudaGetLastError() == cudaSuccess);
    }
    SUBCASE("a pointer the pool did not give is ignored (and reported on stderr)") {
      int local = 0;
      pool.deallocate(&local, sizeof(local));
      CHECK(pool.bytes_cached() == 1024 + 1024 + 5120);
    }
  }

  TEST_CASE("caching_pool keeps the peaks of bytes in use and held, as PyTorch's max_memory_allocated and _reserved") {
    zero::caching_device_allocator pool;
    void* a = pool.allocate(1000); // 1024 in use
    void* b = pool.allocate(5000); // 1024 + 5120
    CHECK(pool.peak_bytes_in_use() == 6144);
    pool.deallocate(a, 1000);
    void* c = pool.allocate(900); // the cached 1024 again: held bytes do not grow
    CHECK(c == a);
    pool.deallocate(b, 5000);
    pool.deallocate(c, 900);
    CHECK(pool.bytes_in_use() == 0);
    CHECK(pool.peak_bytes_in_use() == 6144);
    CHECK(pool.peak_bytes_reserved() == 6144);

    pool.reset_peaks(); // nothing in use, 6144 held
    CHECK(pool.peak_bytes_in_use() == 0);
    CHECK(pool.peak_bytes_reserved() == 6144);
    void* d = pool.allocate(1000); // from the cache
    void* e = pool.allocate(2000); // a new class: 2048 more held
    CHECK(pool.peak_bytes_in_use() == 1024 + 2048);
    CHECK(pool.peak_bytes_reserved() == 6144 + 2048);
    pool.deallocate(d, 1000);
    pool.deallocate(e, 2000);
    CHECK(pool.release_cached() == 6144 + 2048);
    CHECK(pool.peak_bytes_reserved() == 6144 + 2048); // a peak, not what is held now
  }

  TEST_CASE("after a warm-up step, a training step allocates nothing from CUDA") {
    zero::caching_device_allocator pool;
    const std::size_t sizes[] = {3u << 20, 1024, 77, 40u << 20, 1024, 123457};
    const auto step = [&] {
      std::vector<void*> blocks;
      for (const std::size_t s : sizes) {
        blocks.push_back(pool.allocate(s));
        ZERO_CHECK_CUDA(cudaMemset(blocks.back(), 0, s));
      }
      for (std::size_t i = blocks.size(); i-- > 0;) { // free in another order than allocated
        pool.deallocate(blocks[(i + 2) % blocks.size()], sizes[(i + 2) % blocks.size()]);
      }
    };
    step();
    const std::size_t warm = pool.cuda_allocations();
    CHECK(warm == std::size(sizes));
    for (int i = 0; i < 5; ++i) {
      step();
    }
    CHECK(pool.cuda_allocations() == warm);
    CHECK(pool.cache_hits() == 5 * std::size(sizes));
    CHECK(pool.bytes_in_use() == 0);
  }

  TEST_CASE("the last copy of a pool gives its cached blocks back") {
    counting_upstream upstream;
    {
      zero::caching_pool<counting_upstream> pool(upstream);
      auto copy = pool;
      void* a = pool.allocate(4096);
      void* b = copy.allocate(1u << 21);
      CHECK(*upstream.live == 2);
      pool.deallocate(a, 4096);
      copy.deallocate(b, 1u << 21);
      CHECK(*upstream.live == 2); // cached, not returned
    }
    CHECK(*upstream.live == 0);
  }

  TEST_CASE("caching_pool is thread-safe") {
    zero::caching_device_allocator pool;
    constexpr int threads = 8;
    constexpr int rounds = 2000;
    const std::size_t sizes[] = {512, 4096, 1u << 20, 3000};
    std::vector<std::thread> workers;
    std::atomic<int> wrong{0};
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (int r = 0; r < rounds; ++r) {
          const std::size_t s = sizes[static_cast<std::size_t>(r + t) % std::size(sizes)];
          void* p = pool.allocate(s);
          wrong += !aligned(p, 256);
          pool.deallocate(p, s);
        }
      });
    }
    for (auto& w : workers) {
      w.join();
    }
    CHECK(wrong == 0);
    CHECK(pool.bytes_in_use() == 0);
    CHECK(pool.cuda_allocations() + pool.cache_hits() == static_cast<std::size_t>(threads) * rounds);
    CHECK(pool.cuda_allocations() <= static_cast<std::size_t>(threads) * std::size(sizes));
  }

  TEST_CASE("caching_pinned_allocator caches pinned blocks the host can use") {
    zero::caching_pinned_allocator pool;
    auto* p = static_cast<int*>(pool.allocate(4000));
    p[999] = 42;
    pool.deallocate(p, 4000);
    auto* q = static_cast<int*>(pool.allocate(4000));
    CHECK(q == p);
    CHECK(q[999] == 42); // the same block, contents untouched by the pool
    CHECK(pool.cuda_allocations() == 1);
    CHECK(pool.cache_hits() == 1);
    pool.deallocate(q, 4000);
  }

} // TEST_SUITE("allocators")

TEST_SUITE("check") {

  TEST_CASE("ZERO_CHECK_CUDA throws cuda_error naming the call, the place and the CUDA error") {
    const int line = __LINE__ + 2;
    try {
      ZERO_CHECK_CUDA(cudaSetDevice(1 << 20));
      FAIL("cudaSetDevice(1 << 20) succeeded");
    } catch (const zero::cuda_error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(contains(what,
                     "[zero.cuda_error] cudaSetDevice(1 << 20) failed at test_allocators.cpp:" + std::to_string(line)));
      CHECK(contains(what, "cudaErrorInvalidDevice"));
      CHECK(e.status() == static_cast<int>(cudaErrorInvalidDevice));
    }
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(ZERO_CHECK_CUDA(cudaGetLastError()) == cudaSuccess);
  }

  TEST_CASE("ZERO_CHECK_CUDA_NOTHROW reports and returns the status") {
    const auto call = []() noexcept { return ZERO_CHECK_CUDA_NOTHROW(cudaSetDevice(1 << 20)); };
    CHECK(call() == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaSuccess);
  }

} // TEST_SUITE("check")
