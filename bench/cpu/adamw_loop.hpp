#pragma once
// What zero's host AdamW benchmarks share (bench/cpu and bench/cuda): host arrays from an allocator,
// and the timed loop of one `cpu_backend::adamw_step` per iteration over freshly filled state.

#include "zero/backend/cpu_backend.hpp"
#include "zero/memory/allocator.hpp"

#include <algorithm>
#include <benchmark/benchmark.h>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace zero::bench {

// `count` elements of T from allocator A (64-byte aligned), released at scope end.
template <class T, class A = zero::host_allocator> struct host_array {
  A alloc;
  T* p = nullptr;
  std::size_t n = 0;
  explicit host_array(std::size_t count, A a = A{})
      : alloc(std::move(a)), p(static_cast<T*>(alloc.allocate(count * sizeof(T), 64))), n(count) {}
  host_array(const host_array&) = delete;
  host_array& operator=(const host_array&) = delete;
  ~host_array() { alloc.deallocate(p, n * sizeof(T), 64); }
};

// Fills n parameters of AdamW state (fp32 master, m, v; G gradients; P parameter copy) from `alloc`,
// touching every page before the clock starts, then runs one step per iteration of `state`.
template <class G, class P, class A = zero::host_allocator>
void run_adamw_steps(benchmark::State& state, zero::cpu_backend& b, std::size_t n, const A& alloc = A{}) {
  host_array<float, A> master(n, alloc), m(n, alloc), v(n, alloc);
  host_array<G, A> grad(n, alloc);
  host_array<P, A> param(n, alloc);
  std::fill_n(master.p, n, 0.5f);
  std::fill_n(m.p, n, 0.0f);
  std::fill_n(v.p, n, 0.0f);
  std::fill_n(grad.p, n, zero::from_float<G>(0.001f));
  std::fill_n(param.p, n, zero::from_float<P>(0.0f));
  zero::adamw_step_args args;
  args.weight_decay = 0.01f;
  const auto s = b.make_stream();
  std::int64_t step = 0;
  for (auto _ : state) {
    args.set_step(++step);
    b.adamw_step(master.p, m.p, v.p, grad.p, param.p, n, args, s);
    benchmark::ClobberMemory();
  }
}

} // namespace zero::bench
