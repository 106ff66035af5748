/// \file
/// The host AdamW of ZeRO-Offload over the three kinds of host memory its state can live in:
///
///   memory:0  pageable (`zero::host_allocator`), first touched by this thread
///   memory:1  pinned by `cudaHostAlloc` (`zero::pinned_allocator`), what the offloaded optimizer holds
///   memory:2  pinned on transparent huge pages (`zero::pinned_allocator` with `huge_pages`: anonymous
///             memory advised MADV_HUGEPAGE, touched, then `cudaHostRegister`ed)
///
/// BM_host_adamw/memory:K/threads:T/stream:S/prefetch:F runs `cpu_backend::adamw_step` (bf16 gradients
/// and parameters, 28 bytes per parameter) over N parameters with T threads, the parameter copy written
/// with non-temporal stores (S = 1, `cpu_backend_options::streaming_stores`) or plain ones (S = 0), the
/// inputs prefetched as the backend does by default (F = -1, `cpu_backend_options::prefetch_elements`) or
/// not at all (F = 0, run with S = 1 only), and reports params/s and bytes/s. N defaults to
/// 2^27 (3.5 GiB of state, far above any last-level cache); ZERO_BENCH_PARAMS overrides it. The label
/// names the memory, and what /sys says of transparent huge pages on this machine.
/// Works with --benchmark_format=json and --benchmark_out.

#include "../cpu/adamw_loop.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/memory/allocator.hpp"
#include "zero/memory/pinned_allocator.hpp"

#include <algorithm>
#include <benchmark/benchmark.h>
#include <cstdint>
#include <cstdlib>
#include <fstream>
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

std::string transparent_huge_pages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(f, line);
  return line.empty() ? "unknown" : line;
}

template <class A> double adamw(benchmark::State& state, A alloc) {
  zero::cpu_backend_options opt{.threads = static_cast<unsigned>(state.range(1)),
                                .streaming_stores = state.range(2) != 0};
  if (state.range(3) >= 0) {
    opt.prefetch_elements = static_cast<std::size_t>(state.range(3));
  }
  zero::cpu_backend b(opt);
  const std::size_t n = bench_params();
  zero::bench::run_adamw_steps<zero::bf16, zero::bf16>(state, b, n, alloc);
  return static_cast<double>(n);
}

void BM_host_adamw(benchmark::State& state) {
  const auto memory = state.range(0);
  double n = 0;
  const char* name = "";
  if (memory == 0) {
    n = adamw(state, zero::host_allocator{});
    name = "pageable";
  } else if (memory == 1) {
    n = adamw(state, zero::pinned_allocator{});
    name = "pinned";
  } else {
    n = adamw(state, zero::pinned_allocator{zero::pinned_allocator::default_flags, {.huge_pages = true}});
    name = "pinned, huge pages";
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["params/s"] = benchmark::Counter(iters * n, benchmark::Counter::kIsRate);
  state.counters["bytes/s"] = benchmark::Counter(iters * n * 28, benchmark::Counter::kIsRate);
  state.SetLabel(std::string(name) + "; THP " + transparent_huge_pages());
}

void memory_and_thread_args(benchmark::internal::Benchmark* bm) {
  const auto hw = static_cast<std::int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  bm->ArgNames({"memory", "threads", "stream", "prefetch"});
  // 1, 8 and every hardware thread, each once (a host of 8 or fewer has fewer counts).
  std::vector<std::int64_t> counts{1, std::min<std::int64_t>(8, hw), hw};
  counts.erase(std::unique(counts.begin(), counts.end()), counts.end());
  for (std::int64_t memory = 0; memory < 3; ++memory) {
    for (std::int64_t t : counts) {
      for (std::int64_t stream = 0; stream < 2; ++stream) {
        bm->Args({memory, t, stream, -1});
      }
      bm->Args({memory, t, 1, 0});
    }
  }
  bm->UseRealTime()->Unit(benchmark::kMillisecond);
}

} // namespace

BENCHMARK(BM_host_adamw)->Apply(memory_and_thread_args);

BENCHMARK_MAIN();
