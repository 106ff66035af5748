/// \file
/// cuda_backend: it is a zero::backend, and its accumulate and scale kernels give what cpu_backend gives,
/// bit for bit, for every pair of element types.
#include "cuda_test_support.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/cuda_backend.hpp"

#include <doctest/doctest.h>
#include <random>
#include <vector>

namespace {

using zero::test::type_pair;

template <class T> std::vector<T> random_values(std::size_t n, unsigned seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<T> v(n);
  for (auto& x : v) {
    x = zero::from_float<T>(d(gen));
  }
  return v;
}

template <class T>
std::vector<T> to_host(zero::cuda_backend& b, const T* d, std::size_t n, const zero::cuda_stream& s) {
  std::vector<T> h(n);
  b.copy(d, h.data(), n * sizeof(T), s);
  b.synchronize(s);
  return h;
}

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

} // namespace

TEST_SUITE("backend") {
  TEST_CASE("cuda_backend is a zero::backend with copy") {
    static_assert(zero::backend<zero::cuda_backend>);
    static_assert(zero::can_copy<zero::cuda_backend>);
    static_assert(zero::device_allocator_policy<zero::cuda_backend::allocator_type>);
    zero::cuda_backend b(0);
    CHECK(b.name() == "cuda");
    CHECK(b.device() == 0);
  }

  TEST_CASE_TEMPLATE("accumulate matches cpu_backend bit for bit", P, type_pair<float, float>,
                     type_pair<float, zero::bf16>, type_pair<float, zero::f16>, type_pair<zero::bf16, float>,
                     type_pair<zero::bf16, zero::bf16>, type_pair<zero::bf16, zero::f16>, type_pair<zero::f16, float>,
                     type_pair<zero::f16, zero::bf16>, type_pair<zero::f16, zero::f16>) {
    using S = typename P::first;
    using D = typename P::second;
    zero::cuda_backend gpu(0);
    zero::cpu_backend cpu({.threads = 1});
    auto s = gpu.make_stream();
    // Odd sizes and an offset start exercise the scalar head and tail around the vector body.
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{65537}}) {
      for (std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
        CAPTURE(n);
        CAPTURE(offset);
        const auto src = random_values<S>(n + offset, 1, -4, 4);
        auto dst = random_values<D>(n + offset, 2, -4, 4);
        auto alloc = gpu.get_allocator();
        auto* ds = static_cast<S*>(alloc.allocate((n + offset) * sizeof(S)));
        auto* dd = static_cast<D*>(alloc.allocate((n + offset) * sizeof(D)));
        gpu.copy(src.data(), ds, src.size() * sizeof(S), s);
        gpu.copy(dst.data(), dd, dst.size() * sizeof(D), s);
        gpu.accumulate(ds + offset, dd + offset, n, s);
        const auto got = to_host(gpu, dd, n + offset, s);
        cpu.accumulate(src.data() + offset, dst.data() + offset, n, {});
        CHECK(same_bits(got, dst));
        alloc.deallocate(ds, (n + offset) * sizeof(S));
        alloc.deallocate(dd, (n + offset) * sizeof(D));
      }
    }
  }

  TEST_CASE_TEMPLATE("scale matches cpu_backend bit for bit", T, float, zero::f16, zero::bf16) {
    zero::cuda_backend gpu(0);
    zero::cpu_backend cpu({.threads = 1});
    auto s = gpu.make_stream();
    for (std::size_t n : {std::size_t{3}, std::size_t{4099}}) {
      auto x = random_values<T>(n, 3, -8, 8);
      auto alloc = gpu.get_allocator();
      auto* dx = static_cast<T*>(alloc.allocate(n * sizeof(T)));
      gpu.copy(x.data(), dx, n * sizeof(T), s);
      gpu.scale(dx, n, 0.3f, s);
      cpu.scale(x.data(), n, 0.3f, {});
      CHECK(same_bits(to_host(gpu, dx, n, s), x));
      alloc.deallocate(dx, n * sizeof(T));
    }
  }

  TEST_CASE("fill of int flags, read_scalar and events") {
    zero::cuda_backend gpu(0);
    auto s = gpu.make_stream();
    auto s2 = gpu.make_stream();
    auto e = gpu.make_event();
    auto alloc = gpu.get_allocator();
    auto* flag = static_cast<int*>(alloc.allocate(sizeof(int) * 5));
    gpu.fill(flag, 5, 7, s);
    gpu.record(e, s);
    gpu.wait(s2, e); // s2 reads what s wrote
    gpu.fill(flag + 2, 1, -3, s2);
    CHECK(gpu.read_scalar(flag + 1, s2) == 7);
    CHECK(gpu.read_scalar(flag + 2, s2) == -3);
    auto* f = static_cast<float*>(alloc.allocate(sizeof(float)));
    gpu.fill(f, 1, 2.5f, s);
    CHECK(gpu.read_scalar(f, s) == 2.5f);
    CHECK_THROWS_AS((void)gpu.read_scalar(static_cast<const int*>(nullptr), s), zero::usage_error);
    alloc.deallocate(flag, sizeof(int) * 5);
    alloc.deallocate(f, sizeof(float));
  }
} // TEST_SUITE("backend")
