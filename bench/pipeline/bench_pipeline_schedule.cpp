// The 1F1B schedule (zero/comm/pipeline_schedule.hpp) run on in-process ranks, one thread per
// pipeline stage: a forward keeps its thread busy for F microseconds and a backward for 2F, and the
// activations and gradients go between stages through thread_communicator's send and recv. The step's
// wall time T gives the measured bubble, 1 - m (F + 2F) / T, beside the formula (p - 1) / (m + p - 1)
// and the schedule's simulated bubble.
//
//   zero_bench_pipeline_schedule --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//
// Each stage needs a core of its own (p up to 8 here): on a machine with fewer cores the stages take
// turns on them and the measured bubble means nothing. ZERO_BENCH_PIPE_FORWARD_US sets F (default
// 5000: a short F counts the threads' start-up and hand-offs as bubble, bench/README.md).

#include "zero/comm/pipeline_schedule.hpp"
#include "zero/comm/thread_communicator.hpp"

#include <benchmark/benchmark.h>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

double forward_us() {
  const char* v = std::getenv("ZERO_BENCH_PIPE_FORWARD_US");
  return v != nullptr ? std::strtod(v, nullptr) : 5000.0;
}

/// Keeps the calling thread busy for `us` microseconds (a stage's compute).
void spin(double us) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < until) {
  }
}

void BM_one_f_one_b(benchmark::State& state) {
  const int p = static_cast<int>(state.range(0));
  const int m = static_cast<int>(state.range(1));
  const double f = forward_us();
  const double b = 2 * f;
  std::vector<float> payload(1024);
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    zero::run_ranks(p, [&](zero::thread_communicator& comm) {
      const int s = comm.rank();
      std::vector<float> in(payload.size());
      std::vector<float> out(payload.size() * static_cast<std::size_t>(2 * m));
      std::vector<zero::thread_communicator::handle> sends;
      for (const zero::pipe_step& e : zero::one_f_one_b(p, s, m)) {
        float* slot = out.data() + payload.size() * static_cast<std::size_t>(2 * e.micro_batch);
        switch (e.op) {
        case zero::pipe_op::recv_activation:
        case zero::pipe_op::recv_gradient:
          comm.recv(in.data(), in.size(), e.peer).wait();
          break;
        case zero::pipe_op::forward:
          spin(f);
          break;
        case zero::pipe_op::backward:
          spin(b);
          break;
        case zero::pipe_op::send_activation:
          sends.push_back(comm.send(slot, payload.size(), e.peer));
          break;
        case zero::pipe_op::send_gradient:
          sends.push_back(comm.send(slot + payload.size(), payload.size(), e.peer));
          break;
        }
      }
      for (auto& h : sends) {
        h.wait();
      }
    });
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  const double step_us = seconds * 1e6 / static_cast<double>(state.iterations());
  // run_ranks starts and joins its threads inside each iteration: their start-up is in T, so small
  // F overstates the bubble.
  std::vector<std::vector<zero::pipe_step>> lists;
  for (int s = 0; s < p; ++s) {
    lists.push_back(zero::one_f_one_b(p, s, m));
  }
  state.counters["formula"] = zero::one_f_one_b_bubble(p, m);
  state.counters["simulated"] = zero::simulate_pipeline(lists, f, b).bubble();
  state.counters["measured"] = 1.0 - m * (f + b) / step_us;
  state.counters["step_us"] = step_us;
  state.SetLabel("p " + std::to_string(p) + ", m " + std::to_string(m) + ", F " + std::to_string(f) + " us");
}

BENCHMARK(BM_one_f_one_b)->ArgsProduct({{2, 4, 8}, {1, 4, 16, 32}})->UseRealTime()->Unit(benchmark::kMillisecond);

} // namespace

BENCHMARK_MAIN();
