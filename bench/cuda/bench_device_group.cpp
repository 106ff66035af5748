/// \file
/// device_group_communicator's collectives (ranks as threads sharing one GPU) against a device copy of the same
/// traffic, in the same run. Run on a GPU machine:
///   zero_bench_device_group --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
///
/// One benchmark thread per rank (2 or 4 ranks of GPU 0). An iteration runs one bf16 collective over buffers of
/// `bytes` per rank (all_reduce: the whole buffer; reduce_scatter: the send buffer, each rank keeping 1/n; all_gather:
/// the receive buffer, each rank sending 1/n) and waits for it. Its traffic is counted as the least any
/// implementation on one device must move, bytes read plus bytes written over all ranks:
///   all_reduce      read n B (every input), write n B (every output)
///   reduce_scatter  read n B,               write B
///   all_gather      read B (every piece),   write n B
/// and compared with a device-to-device copy moving as much (a copy of X bytes reads X and writes X), timed by rank
/// 0 just before. Counters: GBps = (read + written) / 2 / time, as a copy's bytes/s is counted, and vs_copy = that
/// over the copy's. zero's implementation moves exactly the least (each element read once from every rank that holds
/// it and written once to every rank that needs it), so vs_copy says how close its kernels come to a copy's speed.

#include "bench_support.hpp"
#include "zero/comm/device_group_communicator.hpp"
#include "zero/core/dtype.hpp"

#include <algorithm>
#include <atomic>
#include <benchmark/benchmark.h>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cuda_runtime_api.h>
#include <map>
#include <memory>
#include <vector>

namespace {

enum class op { all_reduce, reduce_scatter, all_gather };

constexpr std::size_t max_bytes = std::size_t{256} << 20; // per rank and buffer

struct rank_state {
  zero::device_group_communicator comm;
  zero::bench::buffer send;
  zero::bench::buffer recv;
};

zero::device_allocator& allocator() {
  static zero::device_allocator alloc(0);
  return alloc;
}

std::map<int, std::vector<std::unique_ptr<rank_state>>>& groups() {
  static std::map<int, std::vector<std::unique_ptr<rank_state>>> g;
  return g;
}

/// The least bytes read plus written, over all ranks, of one `o` over `bytes` per rank at `n` ranks.
double least_traffic(op o, std::size_t bytes, int n) {
  const double b = static_cast<double>(bytes);
  switch (o) {
  case op::all_reduce:
    return 2.0 * n * b;
  case op::reduce_scatter:
  case op::all_gather:
    return (n + 1.0) * b;
  }
  return 0;
}

/// Seconds a device-to-device copy of `bytes` takes (median of 5, after one untimed), on its own stream.
double copy_seconds(std::size_t bytes) {
  zero::bench::buffer a(allocator(), bytes), b(allocator(), bytes);
  cudaStream_t s = nullptr;
  ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  zero::bench::event start, stop;
  std::vector<double> t;
  for (int k = 0; k < 6; ++k) {
    ZERO_CHECK_CUDA(cudaEventRecord(start.get(), s));
    ZERO_CHECK_CUDA(cudaMemcpyAsync(b.as<std::byte>(), a.as<std::byte>(), bytes, cudaMemcpyDeviceToDevice, s));
    ZERO_CHECK_CUDA(cudaEventRecord(stop.get(), s));
    ZERO_CHECK_CUDA(cudaEventSynchronize(stop.get()));
    if (k > 0) {
      t.push_back(zero::bench::seconds_between(start, stop));
    }
  }
  ZERO_CHECK_CUDA(cudaStreamDestroy(s));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::atomic<double> copy_gbps{0}; // rank 0's copy of this benchmark's traffic, read by every rank after the loop

void run(benchmark::State& state, op o) {
  const int n = state.threads();
  auto& r = *groups().at(n)[static_cast<std::size_t>(state.thread_index())];
  ZERO_CHECK_CUDA(cudaSetDevice(0));
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t elems = bytes / sizeof(zero::bf16);
  const std::size_t per = elems / static_cast<std::size_t>(n);
  const double moved = least_traffic(o, bytes, n) / 2; // as a copy's bytes are counted
  if (state.thread_index() == 0) {
    copy_gbps = moved / copy_seconds(static_cast<std::size_t>(moved)) / 1e9;
  }
  auto* send = r.send.as<zero::bf16>();
  auto* recv = r.recv.as<zero::bf16>();
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    switch (o) {
    case op::all_reduce:
      r.comm.all_reduce(send, recv, elems, zero::reduce_op::avg).wait();
      break;
    case op::reduce_scatter:
      r.comm.reduce_scatter(send, recv, per, zero::reduce_op::avg).wait();
      break;
    case op::all_gather:
      r.comm.all_gather(send, recv, per).wait();
      break;
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gbps = moved * static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["GBps"] = benchmark::Counter(gbps, benchmark::Counter::kAvgThreads);
  state.counters["copy_GBps"] = benchmark::Counter(copy_gbps.load(), benchmark::Counter::kAvgThreads);
  state.counters["vs_copy"] = benchmark::Counter(gbps / copy_gbps.load(), benchmark::Counter::kAvgThreads);
}

void sizes(benchmark::internal::Benchmark* b) {
  for (const std::int64_t mib : {1, 16, 256}) {
    b->Arg(mib << 20);
  }
  b->Threads(2)->Threads(4)->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(run, all_reduce, op::all_reduce)->Apply(sizes);
BENCHMARK_CAPTURE(run, reduce_scatter, op::reduce_scatter)->Apply(sizes);
BENCHMARK_CAPTURE(run, all_gather, op::all_gather)->Apply(sizes);

} // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "zero_bench_device_group: no CUDA device\n");
    return 1;
  }
  for (const int n : {2, 4}) {
    auto group = zero::make_device_group(n);
    for (int k = 0; k < n; ++k) {
      groups()[n].push_back(std::unique_ptr<rank_state>(new rank_state{zero::device_group_communicator(group, k),
                                                                       zero::bench::buffer(allocator(), max_bytes),
                                                                       zero::bench::buffer(allocator(), max_bytes)}));
    }
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  groups().clear();
  return 0;
}
