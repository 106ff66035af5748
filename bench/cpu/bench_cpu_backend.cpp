// cpu_backend kernels against the memory system they run on.
//
// BM_adamw_step<G, P>/threads:T/simd:S/prefetch:F runs one AdamW step over N parameters (fp32 master, m
// and v, gradients in G, parameter copy in P: 28 bytes per parameter for bf16/bf16 — read master, m, v
// and the gradient, write master, m, v and the parameter). In the same run it measures a memcpy of
// the same bytes (14 N bytes read, 14 N written) through the backend's own pool with T threads, and
// reports:
//   params/s        parameters updated per second
//   bytes/s         bytes moved per second (28 per parameter for bf16/bf16)
//   copy_bytes/s    the copy's bytes moved per second (best of 5; the faster of a pooled and a
//                   single-threaded memcpy)
//   copy_ratio      bytes/s divided by copy_bytes/s: 1.0 means AdamW runs at copy speed
// simd:0 is the portable scalar loop, simd:3 the widest SIMD level this CPU has, or the level that
// ZERO_BENCH_SIMD names (avx2, avx512), to compare the vector kernels on one CPU. prefetch:-1 runs the
// backend's default `prefetch_elements`, prefetch:0 none (the widest level only).
//
// N defaults to 2^27 (128 Mi parameters: 3.5 GiB of AdamW state and gradients, ten times the 300 MiB
// last-level cache of the GPU machine's Xeon, so the numbers are DRAM numbers); ZERO_BENCH_PARAMS
// overrides it. A working set the cache holds in part makes AdamW look faster than it runs on a
// model's state: at 2^25 (896 MiB) that Xeon gave 6.00 Gparam/s at 16 threads, at 2^27 4.1-4.3.
// Keep --benchmark_format=json for machine-readable output.
#include "adamw_loop.hpp"
#include "zero/backend/cpu_backend.hpp"

#include <algorithm>
#include <benchmark/benchmark.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::size_t bench_params() {
  if (const char* s = std::getenv("ZERO_BENCH_PARAMS")) {
    return std::max<std::size_t>(1, std::strtoull(s, nullptr, 10));
  }
  return std::size_t{1} << 27;
}

zero::simd_level level_arg(std::int64_t a) {
  if (a == 0) {
    return zero::simd_level::scalar;
  }
  if (const char* s = std::getenv("ZERO_BENCH_SIMD")) {
    for (auto l : {zero::simd_level::avx2, zero::simd_level::avx512}) {
      if (zero::name_of(l) == s) {
        return l;
      }
    }
  }
  return zero::simd_level::automatic;
}

using zero::bench::host_array;

// Best-of-5 seconds of copying `bytes` bytes: the faster of a memcpy through the backend's pool
// (cast<float, float> is a chunked, multi-threaded memcpy) and one std::memcpy of the whole buffer
// on this thread (glibc's large-copy path, with non-temporal stores). The ratio is taken against
// the faster, so it is never flattered by a weak baseline.
double copy_seconds(zero::cpu_backend& b, std::size_t bytes) {
  const std::size_t floats = bytes / sizeof(float);
  host_array<float> src(floats), dst(floats);
  std::fill_n(src.p, floats, 1.0f);
  std::fill_n(dst.p, floats, 0.0f);
  const auto s = b.make_stream();
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    for (bool pool : {true, false}) {
      const auto t0 = std::chrono::steady_clock::now();
      if (pool) {
        b.cast(src.p, dst.p, floats, s);
      } else {
        std::memcpy(dst.p, src.p, floats * sizeof(float));
      }
      const auto t1 = std::chrono::steady_clock::now();
      benchmark::DoNotOptimize(dst.p);
      best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    }
  }
  return best;
}

template <class G, class P> void BM_adamw_step(benchmark::State& state) {
  const auto threads = static_cast<unsigned>(state.range(0));
  zero::cpu_backend_options opt{.threads = threads, .simd = level_arg(state.range(1))};
  if (state.range(2) >= 0) {
    opt.prefetch_elements = static_cast<std::size_t>(state.range(2));
  }
  zero::cpu_backend b(opt);
  const std::size_t n = bench_params();
  zero::bench::run_adamw_steps<G, P>(state, b, n);
  const double bytes_per_param = 6 * sizeof(float) + sizeof(G) + sizeof(P);
  const double copy = copy_seconds(b, static_cast<std::size_t>(bytes_per_param / 2 * static_cast<double>(n)));
  const double copy_rate = bytes_per_param * static_cast<double>(n) / copy;
  const double iters = static_cast<double>(state.iterations());
  state.counters["params/s"] = benchmark::Counter(iters * static_cast<double>(n), benchmark::Counter::kIsRate);
  state.counters["bytes/s"] = benchmark::Counter(iters * static_cast<double>(n) * bytes_per_param,
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.counters["copy_bytes/s"] =
      benchmark::Counter(copy_rate, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  // The ratio needs the measured time per step, which Google Benchmark only knows at the end: it is
  // reported as copy time over step time, both for the same bytes.
  state.counters["copy_ratio"] = benchmark::Counter(copy * iters, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(zero::name_of(b.simd())) + ", " + std::to_string(b.threads()) + " threads, " +
                 std::to_string(n) + " params");
}

// BM_rule_step<Rule>/threads:T: one step of an update rule besides AdamW (zero/backend/update_rules.hpp) over N
// parameters, bf16 gradients and parameters, fp32 master and the rule's state tensors (Lion, Adagrad and SGD with
// momentum: one, 20 bytes a parameter; AdamW's run above moves 28), with the same counters as AdamW's. The rule's
// loop runs `rule_lanes` elements at a time with the vector extension of GCC and Clang, whatever `simd`.
template <class Rule> void BM_rule_step(benchmark::State& state) {
  zero::cpu_backend b({.threads = static_cast<unsigned>(state.range(0))});
  const std::size_t n = bench_params();
  host_array<float> master(n), s0(n);
  host_array<zero::bf16> grad(n), param(n);
  std::fill_n(master.p, n, 0.5f);
  std::fill_n(s0.p, n, 0.25f);
  std::fill_n(grad.p, n, zero::from_float<zero::bf16>(0.125f));
  zero::adamw_step_args a;
  a.momentum = 0.9f;
  a.set_step(2);
  const auto st = b.make_stream();
  for (auto _ : state) {
    b.rule_step<Rule>(master.p, {s0.p, nullptr}, grad.p, param.p, n, a, st);
    benchmark::ClobberMemory();
  }
  const double bytes_per_param = 4 * sizeof(float) + 2 * sizeof(zero::bf16);
  const double copy = copy_seconds(b, static_cast<std::size_t>(bytes_per_param / 2 * static_cast<double>(n)));
  const double iters = static_cast<double>(state.iterations());
  state.counters["params/s"] = benchmark::Counter(iters * static_cast<double>(n), benchmark::Counter::kIsRate);
  state.counters["bytes/s"] = benchmark::Counter(iters * static_cast<double>(n) * bytes_per_param,
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.counters["copy_ratio"] = benchmark::Counter(copy * iters, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(Rule::name) + ", " + std::to_string(b.threads()) + " threads, " + std::to_string(n) +
                 " params");
}

// BM_lamb_step/threads:T: LAMB's whole step over N parameters as one tensor (bf16 gradients and parameters, fp32
// master, exp_avg and exp_avg_sq): its first pass (`rule_norms`: the moments and the two sums of squares in double,
// a scalar loop) and its second (`rule_step` with the ratio: master and the 16-bit copy), the ratio formed between.
void BM_lamb_step(benchmark::State& state) {
  zero::cpu_backend b({.threads = static_cast<unsigned>(state.range(0))});
  const std::size_t n = bench_params();
  host_array<float> master(n), m(n), v(n);
  host_array<zero::bf16> grad(n), param(n);
  std::fill_n(master.p, n, 0.5f);
  std::fill_n(m.p, n, 0.25f);
  std::fill_n(v.p, n, 0.0625f);
  std::fill_n(grad.p, n, zero::from_float<zero::bf16>(0.125f));
  std::vector<std::byte> ws(b.rule_norms_workspace_bytes(n) + 8);
  zero::adamw_step_args a;
  a.set_step(2);
  const auto st = b.make_stream();
  for (auto _ : state) {
    double sums[2] = {0, 0};
    b.rule_norms<zero::rules::lamb>(master.p, {m.p, v.p}, grad.p, n, a, sums, ws.data(), ws.size(), st);
    a.trust_ratio = zero::rules::trust_ratio(sums[0], sums[1], a.min_coeff, a.max_coeff);
    b.rule_step<zero::rules::lamb>(master.p, {m.p, v.p}, grad.p, param.p, n, a, st);
    benchmark::ClobberMemory();
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["params/s"] = benchmark::Counter(iters * static_cast<double>(n), benchmark::Counter::kIsRate);
  state.SetLabel("Lamb, " + std::to_string(b.threads()) + " threads, " + std::to_string(n) + " params");
}

// Threads 1, 2, 4, ... up to the hardware's.
void rule_args(benchmark::internal::Benchmark* bm) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  bm->ArgNames({"threads"});
  for (std::int64_t t = 1; t <= hw; t = t == hw ? hw + 1 : std::min(hw, 2 * t)) {
    bm->Args({t});
  }
  bm->UseRealTime()->Unit(benchmark::kMillisecond);
}

template <class T> void BM_squared_norm(benchmark::State& state) {
  zero::cpu_backend b({.threads = static_cast<unsigned>(state.range(0)), .simd = level_arg(state.range(1))});
  const std::size_t n = bench_params();
  host_array<T> x(n);
  std::fill_n(x.p, n, zero::from_float<T>(0.5f));
  std::vector<float> ws(b.squared_norm_workspace_bytes<T>(n) / sizeof(float) + 1);
  const auto s = b.make_stream();
  float out = 0.0f;
  for (auto _ : state) {
    b.squared_norm(x.p, n, &out, ws.data(), ws.size() * sizeof(float), s);
    benchmark::DoNotOptimize(out);
  }
  state.counters["bytes/s"] =
      benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n) * sizeof(T),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(zero::name_of(b.simd())) + ", " + std::to_string(b.threads()) + " threads");
}

void BM_cast_f32_to_bf16(benchmark::State& state) {
  zero::cpu_backend b({.threads = static_cast<unsigned>(state.range(0)), .simd = level_arg(state.range(1))});
  const std::size_t n = bench_params();
  host_array<float> src(n);
  host_array<zero::bf16> dst(n);
  std::fill_n(src.p, n, 0.3f);
  std::fill_n(dst.p, n, zero::bf16(0.0f));
  const auto s = b.make_stream();
  for (auto _ : state) {
    b.cast(src.p, dst.p, n, s);
    benchmark::ClobberMemory();
  }
  state.counters["bytes/s"] = benchmark::Counter(static_cast<double>(state.iterations()) * static_cast<double>(n) * 6,
                                                 benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.SetLabel(std::string(zero::name_of(b.simd())) + ", " + std::to_string(b.threads()) + " threads");
}

// Threads 1..hardware concurrency (every count up to 8, then powers of two and the total), each
// with the scalar loop (simd:0) and the widest SIMD level (simd:3).
void thread_and_simd_args(benchmark::internal::Benchmark* bm) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  bm->ArgNames({"threads", "simd"});
  for (std::int64_t t = 1; t <= hw; t = t < 8 ? t + 1 : std::min(hw, 2 * t)) {
    bm->Args({t, 0});
    bm->Args({t, 3});
    if (t == hw) {
      break;
    }
  }
  bm->UseRealTime()->Unit(benchmark::kMillisecond);
}

// AdamW's: the same, and the widest level again without prefetching its inputs (prefetch:0; the
// others run the backend's default, `cpu_backend_options::prefetch_elements`, named prefetch:-1).
void adamw_args(benchmark::internal::Benchmark* bm) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  bm->ArgNames({"threads", "simd", "prefetch"});
  for (std::int64_t t = 1; t <= hw; t = t < 8 ? t + 1 : std::min(hw, 2 * t)) {
    bm->Args({t, 0, -1});
    bm->Args({t, 3, -1});
    bm->Args({t, 3, 0});
    if (t == hw) {
      break;
    }
  }
  bm->UseRealTime()->Unit(benchmark::kMillisecond);
}

} // namespace

BENCHMARK(BM_adamw_step<zero::bf16, zero::bf16>)->Apply(adamw_args);
BENCHMARK(BM_adamw_step<zero::f16, zero::f16>)->Apply(adamw_args);
BENCHMARK(BM_adamw_step<float, float>)->Apply(adamw_args);
BENCHMARK(BM_rule_step<zero::rules::lion>)->Apply(rule_args);
BENCHMARK(BM_rule_step<zero::rules::sgd>)->Apply(rule_args);
BENCHMARK(BM_rule_step<zero::rules::adagrad>)->Apply(rule_args);
BENCHMARK(BM_lamb_step)->Apply(rule_args);
BENCHMARK(BM_squared_norm<zero::bf16>)->Apply(thread_and_simd_args);
BENCHMARK(BM_cast_f32_to_bf16)->Apply(thread_and_simd_args);

BENCHMARK_MAIN();
