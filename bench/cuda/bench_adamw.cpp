/// \file
/// The fused AdamW step, and the other update rules' step (Lion, SGD, Adagrad), against their ceiling, device
/// copy bandwidth, measured in the same run.
///
/// Each iteration times, with CUDA events on one stream, one `zero::cuda::adamw_step` (or `rule_step`) over n
/// parameters and then one `cudaMemcpyAsync` device-to-device copy moving the same traffic: bytes_per_param / 2
/// per parameter read and as many written (14 + 14 for AdamW with bf16 grad and param: 12 bytes of fp32 master,
/// m, v read and written, 2 of grad read, 2 of param written; a rule moves 8 bytes of master and 8 per state
/// tensor, read and written, beside grad and param: 10 + 10 for Lion, SGD with momentum or Adagrad in bf16,
/// 6 + 6 for SGD without momentum). The iteration time is the step's time (UseManualTime); the counters are
///   Gparam/s   parameters updated per second / 1e9
///   GB/s       the step's traffic (bytes_per_param * n) per second / 1e9
///   copy_GB/s  copy traffic (read + written) per second / 1e9
///   ratio      GB/s / copy_GB/s, the fraction of copy bandwidth the step reaches (target >= 0.9)
/// Works with --benchmark_format=json and --benchmark_out.

#include "bench_support.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/update_rules.hpp"
#include "zero/core/cuda_check.hpp"
#include "zero/memory/device_allocator.hpp"

#include <array>
#include <benchmark/benchmark.h>
#include <cstddef>
#include <cuda_runtime_api.h>
#include <exception>
#include <string>

namespace {

using zero::bench::buffer;
using zero::bench::event;
using zero::bench::seconds_between;

// Times `step` (one kernel over n parameters moving bytes_per_param each) against a device copy of the same
// traffic on `stream`, iteration by iteration, and sets the counters of the file comment.
template <class Step>
void measure(benchmark::State& state, zero::device_allocator& alloc, cudaStream_t stream, std::size_t n,
             std::size_t bytes_per_param, const Step& step) {
  // The copy reads and writes half of the step's traffic each, rounded up to whole 16-byte words.
  const std::size_t copy_bytes = (n * bytes_per_param / 2 + 15) / 16 * 16;
  const buffer copy_src(alloc, copy_bytes);
  const buffer copy_dst(alloc, copy_bytes);
  ZERO_CHECK_CUDA(cudaMemsetAsync(copy_src.as<void>(), 0x3c, copy_bytes, stream));
  const auto copy = [&] {
    ZERO_CHECK_CUDA(
        cudaMemcpyAsync(copy_dst.as<void>(), copy_src.as<void>(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
  };
  for (int i = 0; i < 3; ++i) { // warm-up: module load, clocks
    step();
    copy();
  }
  ZERO_CHECK_CUDA(cudaStreamSynchronize(stream));

  const event start;
  const event stepped;
  const event copied;
  double step_seconds = 0.0;
  double copy_seconds = 0.0;
  for (auto _ : state) {
    ZERO_CHECK_CUDA(cudaEventRecord(start.get(), stream));
    step();
    ZERO_CHECK_CUDA(cudaEventRecord(stepped.get(), stream));
    copy();
    ZERO_CHECK_CUDA(cudaEventRecord(copied.get(), stream));
    ZERO_CHECK_CUDA(cudaEventSynchronize(copied.get()));
    const double s = seconds_between(start, stepped);
    step_seconds += s;
    copy_seconds += seconds_between(stepped, copied);
    state.SetIterationTime(s);
  }
  const auto iterations = static_cast<double>(state.iterations());
  const double step_gbs = static_cast<double>(n * bytes_per_param) * iterations / step_seconds * 1e-9;
  const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) * iterations / copy_seconds * 1e-9;
  state.counters["Gparam/s"] = static_cast<double>(n) * iterations / step_seconds * 1e-9;
  state.counters["GB/s"] = step_gbs;
  state.counters["copy_GB/s"] = copy_gbs;
  state.counters["ratio"] = step_gbs / copy_gbs;
  state.counters["bytes_per_param"] = static_cast<double>(bytes_per_param);
}

template <class G, class P, bool WithParam> void run(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  constexpr std::size_t bytes_per_param = 3 * 2 * sizeof(float) + sizeof(G) + (WithParam ? sizeof(P) : 0);

  zero::device_allocator alloc;
  cudaStream_t stream = nullptr;
  ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const buffer master(alloc, n * sizeof(float));
    const buffer m(alloc, n * sizeof(float));
    const buffer v(alloc, n * sizeof(float));
    const buffer grad(alloc, n * sizeof(G));
    const buffer param(alloc, n * sizeof(P));
    // Real values, not zeros: a step over zeros can run faster than over data.
    zero::cuda::fill(master.as<float>(), n, 0.5f, stream);
    zero::cuda::fill(m.as<float>(), n, 0.01f, stream);
    zero::cuda::fill(v.as<float>(), n, 1e-4f, stream);
    zero::cuda::fill(grad.as<G>(), n, zero::from_float<G>(0.25f), stream);

    zero::adamw_step_args args;
    args.weight_decay = 0.01f;
    args.set_step(10);
    P* param_out = WithParam ? param.as<P>() : nullptr;
    measure(state, alloc, stream, n, bytes_per_param, [&] {
      zero::cuda::adamw_step(master.as<float>(), m.as<float>(), v.as<float>(), grad.as<const G>(), param_out, n, args,
                             stream);
    });
  }
  ZERO_CHECK_CUDA(cudaStreamDestroy(stream));
}

template <class G, class P, bool WithParam> void bm_adamw(benchmark::State& state) {
  try {
    run<G, P, WithParam>(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// The hyper-parameters of a rule's benchmark: SGD's momentum 0.9, or none (no state tensor then).
zero::adamw_step_args rule_args(bool momentum) {
  zero::adamw_step_args args;
  args.weight_decay = 0.01f;
  args.momentum = momentum ? 0.9f : 0.0f;
  args.lr_decay = 0.01f;
  args.set_step(10);
  return args;
}

template <class Rule, class G, class P, bool Momentum> void run_rule(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const zero::adamw_step_args args = rule_args(Momentum);
  const std::size_t count = Rule::state_count(args);
  // master and each state tensor read and written, grad read, param written.
  const std::size_t bytes_per_param = (1 + count) * 2 * sizeof(float) + sizeof(G) + sizeof(P);

  zero::device_allocator alloc;
  cudaStream_t stream = nullptr;
  ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const buffer master(alloc, n * sizeof(float));
    const buffer s0(alloc, n * sizeof(float));
    const buffer grad(alloc, n * sizeof(G));
    const buffer param(alloc, n * sizeof(P));
    zero::cuda::fill(master.as<float>(), n, 0.5f, stream);
    zero::cuda::fill(s0.as<float>(), n, 0.01f, stream);
    zero::cuda::fill(grad.as<G>(), n, zero::from_float<G>(0.25f), stream);
    std::array<float*, zero::max_rule_state> tensors{};
    if (count > 0) {
      tensors[0] = s0.as<float>();
    }
    measure(state, alloc, stream, n, bytes_per_param, [&] {
      zero::cuda::rule_step<Rule>(master.as<float>(), tensors, grad.as<const G>(), param.as<P>(), n, args, stream);
    });
  }
  ZERO_CHECK_CUDA(cudaStreamDestroy(stream));
}

template <class Rule, class G, class P, bool Momentum> void bm_rule(benchmark::State& state) {
  try {
    run_rule<Rule, G, P, Momentum>(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// 1M .. 256M parameters, x4. The headline is bf16 grad + bf16 param: 28 bytes per parameter.
#define ZERO_ADAMW_BENCH(G, P, WITH_PARAM, NAME)                                                                       \
  BENCHMARK_TEMPLATE(bm_adamw, G, P, WITH_PARAM)                                                                       \
      ->Name(NAME)                                                                                                     \
      ->RangeMultiplier(4)                                                                                             \
      ->Range(1 << 20, 1 << 28)                                                                                        \
      ->UseManualTime()                                                                                                \
      ->Unit(benchmark::kMicrosecond)

ZERO_ADAMW_BENCH(zero::bf16, zero::bf16, true, "adamw/grad:bf16/param:bf16");
ZERO_ADAMW_BENCH(zero::f16, zero::f16, true, "adamw/grad:fp16/param:fp16");
ZERO_ADAMW_BENCH(float, float, true, "adamw/grad:fp32/param:fp32");
ZERO_ADAMW_BENCH(zero::bf16, zero::bf16, false, "adamw/grad:bf16/param:none");

// The other rules over the same sizes, with bf16 grad and param: 20 bytes per parameter with one state tensor, 12
// for SGD without momentum.
#define ZERO_RULE_BENCH(RULE, MOMENTUM, NAME)                                                                          \
  BENCHMARK_TEMPLATE(bm_rule, RULE, zero::bf16, zero::bf16, MOMENTUM)                                                  \
      ->Name(NAME)                                                                                                     \
      ->RangeMultiplier(4)                                                                                             \
      ->Range(1 << 20, 1 << 28)                                                                                        \
      ->UseManualTime()                                                                                                \
      ->Unit(benchmark::kMicrosecond)

ZERO_RULE_BENCH(zero::rules::lion, true, "lion/grad:bf16/param:bf16");
ZERO_RULE_BENCH(zero::rules::sgd, true, "sgd_momentum/grad:bf16/param:bf16");
ZERO_RULE_BENCH(zero::rules::sgd, false, "sgd/grad:bf16/param:bf16");
ZERO_RULE_BENCH(zero::rules::adagrad, true, "adagrad/grad:bf16/param:bf16");

} // namespace

BENCHMARK_MAIN();
