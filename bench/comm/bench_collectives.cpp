/// \file
/// zero's NCCL collectives beside raw NCCL calls at the same sizes, in the same run, on every visible GPU
/// (one benchmark thread per GPU, each one rank).
///
/// A benchmark iteration issues `buckets` collectives of `bytes` each back to back and then waits for them:
///   raw   ncclReduceScatter / ncclAllGather / ncclAllReduce on a plain (blocking) NCCL communicator of
///         the same GPUs and a stream of its own, then cudaStreamSynchronize (what nccl-tests times);
///   zero  nccl_communicator::reduce_scatter / all_gather / all_reduce ordered after a compute stream by an
///         event (as the engine issues a gradient bucket or a stage-3 gather), then handle.wait() on each.
/// Counters (averaged over the threads): busbw_GBps, nccl-tests' bus bandwidth (algbw * (n-1)/n for
/// reduce-scatter and all-gather, algbw * 2(n-1)/n for all-reduce, algbw = bytes / time), and algbw_GBps.
/// Run with --benchmark_repetitions=N --benchmark_report_aggregates_only=true and compare the medians
/// (bench/comm/compare_collectives.py does).

#include "zero/comm/nccl_communicator.hpp"
#include "zero/core/cuda_check.hpp"

#include <benchmark/benchmark.h>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime_api.h>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

enum class op { reduce_scatter, all_gather, all_reduce };
enum class path { raw, zero };

constexpr std::size_t max_bytes = std::size_t{1} << 30; // per buffer
constexpr int buckets = 4;

struct rank_state {
  std::unique_ptr<zero::nccl_communicator> comm;
  ncclComm_t raw = nullptr; // a plain blocking NCCL communicator over the same GPUs, for the raw path
  cudaStream_t raw_stream = nullptr;
  cudaStream_t compute = nullptr;
  std::byte* buf = nullptr; // buckets * max_bytes / buckets: one region per bucket
};

std::vector<rank_state> ranks; // one per GPU, filled in main()

double bus_factor(op o, int n) {
  const double k = static_cast<double>(n - 1) / n;
  return o == op::all_reduce ? 2 * k : k;
}

void run(benchmark::State& state, op o, path p) {
  auto& r = ranks[static_cast<std::size_t>(state.thread_index())];
  const int n = r.comm->size();
  ZERO_CHECK_CUDA(cudaSetDevice(r.comm->device()));
  const std::size_t bytes = static_cast<std::size_t>(state.range(0)); // whole buffer of one collective
  const std::size_t elems = bytes / sizeof(zero::bf16);
  const std::size_t per = elems / static_cast<std::size_t>(n);
  auto* base = reinterpret_cast<zero::bf16*>(r.buf);
  std::vector<zero::nccl_communicator::handle> hs;
  hs.reserve(buckets);
  for (auto _ : state) {
    for (int b = 0; b < buckets; ++b) {
      zero::bf16* x = base + static_cast<std::size_t>(b) * (max_bytes / buckets / sizeof(zero::bf16));
      zero::bf16* mine = x + static_cast<std::size_t>(r.comm->rank()) * per;
      if (p == path::raw) {
        ncclResult_t st = ncclSuccess;
        if (o == op::reduce_scatter) {
          st = ncclReduceScatter(x, mine, per, ncclBfloat16, ncclAvg, r.raw, r.raw_stream);
        } else if (o == op::all_gather) {
          st = ncclAllGather(mine, x, per, ncclBfloat16, r.raw, r.raw_stream);
        } else {
          st = ncclAllReduce(x, x, elems, ncclBfloat16, ncclAvg, r.raw, r.raw_stream);
        }
        if (st != ncclSuccess) {
          state.SkipWithError("NCCL failed");
          return;
        }
      } else if (o == op::reduce_scatter) {
        hs.push_back(r.comm->reduce_scatter(x, mine, per, zero::reduce_op::avg));
      } else if (o == op::all_gather) {
        hs.push_back(r.comm->all_gather(mine, x, per));
      } else {
        hs.push_back(r.comm->all_reduce(x, x, elems, zero::reduce_op::avg));
      }
    }
    if (p == path::raw) {
      ZERO_CHECK_CUDA(cudaStreamSynchronize(r.raw_stream));
    } else {
      for (auto& h : hs) {
        h.wait();
      }
      hs.clear();
    }
  }
  const double moved = static_cast<double>(bytes) * buckets * static_cast<double>(state.iterations());
  state.counters["algbw_GBps"] =
      benchmark::Counter(moved / 1e9, benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.counters["busbw_GBps"] =
      benchmark::Counter(moved * bus_factor(o, n) / 1e9, benchmark::Counter::kIsRate | benchmark::Counter::kAvgThreads);
  state.counters["bytes"] = static_cast<double>(bytes);
}

void register_all(int gpus) {
  const char* op_names[] = {"reduce_scatter", "all_gather", "all_reduce"};
  for (op o : {op::reduce_scatter, op::all_gather, op::all_reduce}) {
    for (path p : {path::raw, path::zero}) {
      const std::string name = std::string(op_names[static_cast<int>(o)]) + "/" + (p == path::raw ? "raw" : "zero");
      auto* b = benchmark::RegisterBenchmark(name.c_str(), [o, p](benchmark::State& s) { run(s, o, p); });
      // 1 MiB to 256 MiB per collective (the engine's default bucket is 5e8 elements; 25-100 MB buckets
      // are DeepSpeed's usual range).
      for (std::int64_t bytes = std::int64_t{1} << 20; bytes <= (std::int64_t{1} << 28); bytes *= 4) {
        b->Arg(bytes);
      }
      b->Threads(gpus)->UseRealTime();
    }
  }
}

} // namespace

int main(int argc, char** argv) {
  int gpus = 0;
  ZERO_CHECK_CUDA(cudaGetDeviceCount(&gpus));
  if (gpus < 1) {
    std::fprintf(stderr, "zero_bench_collectives: no GPU\n");
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  ranks.resize(static_cast<std::size_t>(gpus));
  const ncclUniqueId id = zero::nccl_communicator::make_unique_id();
  const ncclUniqueId raw_id = zero::nccl_communicator::make_unique_id();
  std::vector<std::thread> start;
  for (int g = 0; g < gpus; ++g) {
    start.emplace_back([&, g] {
      auto& r = ranks[static_cast<std::size_t>(g)];
      r.comm = std::make_unique<zero::nccl_communicator>(g, gpus, id, g);
      if (ncclCommInitRank(&r.raw, gpus, raw_id, g) != ncclSuccess) {
        std::fprintf(stderr, "ncclCommInitRank failed on GPU %d\n", g);
        std::abort();
      }
      ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&r.raw_stream, cudaStreamNonBlocking));
      ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
      r.comm->set_compute_stream(r.compute);
      ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&r.buf), max_bytes));
      ZERO_CHECK_CUDA(cudaMemset(r.buf, 0, max_bytes));
    });
  }
  for (auto& t : start) {
    t.join();
  }
  benchmark::AddCustomContext("gpus", std::to_string(gpus));
  register_all(gpus);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (auto& r : ranks) {
    cudaSetDevice(r.comm->device());
    cudaFree(r.buf);
    cudaStreamDestroy(r.compute);
    cudaStreamDestroy(r.raw_stream);
    ncclCommDestroy(r.raw);
    r.comm.reset();
  }
  return 0;
}
