/// \file
/// ZeRO++'s block quantization kernels (`zero::cuda::quantize` and `dequantize`, bf16 values, blocks of
/// 4096) against device copy bandwidth, measured in the same run: each iteration times the kernel and
/// then a `cudaMemcpyAsync` device-to-device copy of the same traffic with CUDA events on one stream.
/// Traffic: quantize reads the values (2 bytes each) and writes the codes (1 byte, or half a byte for
/// 4-bit codes) and one fp32 scale per block; dequantize the other way round. Counters:
///   GB/s       kernel traffic per second / 1e9
///   copy_GB/s  copy traffic (read + written) per second / 1e9
///   ratio      GB/s / copy_GB/s (issue 17's target: >= 0.8)
/// Works with --benchmark_format=json and --benchmark_out.

#include "bench_support.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/quantize.hpp"

#include <benchmark/benchmark.h>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <exception>

namespace {

using zero::bench::buffer;
using zero::bench::event;
using zero::bench::seconds_between;

template <bool Quantize> void run(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const zero::quant_format f{.bits = static_cast<int>(state.range(1)), .block = 4096};
  const std::size_t traffic = n * sizeof(zero::bf16) + f.code_bytes(n) + f.blocks(n) * sizeof(float);
  const std::size_t copy_bytes = (traffic / 2 + 15) / 16 * 16; // read and written: the same traffic

  zero::device_allocator alloc;
  cudaStream_t stream = nullptr;
  ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    const buffer values(alloc, n * sizeof(zero::bf16));
    const buffer codes(alloc, f.code_bytes(n));
    const buffer scales(alloc, f.blocks(n) * sizeof(float));
    const buffer copy_src(alloc, copy_bytes);
    const buffer copy_dst(alloc, copy_bytes);
    ZERO_CHECK_CUDA(cudaMemsetAsync(values.as<void>(), 0x3c, n * sizeof(zero::bf16), stream)); // 0x3c3c: ~0.011
    ZERO_CHECK_CUDA(cudaMemsetAsync(copy_src.as<void>(), 0x3c, copy_bytes, stream));
    zero::cuda::quantize(values.as<const zero::bf16>(), n, f, codes.as<std::uint8_t>(), scales.as<float>(), stream);
    const auto kernel = [&] {
      if constexpr (Quantize) {
        zero::cuda::quantize(values.as<const zero::bf16>(), n, f, codes.as<std::uint8_t>(), scales.as<float>(), stream);
      } else {
        zero::cuda::dequantize(codes.as<const std::uint8_t>(), scales.as<const float>(), n, f, values.as<zero::bf16>(),
                               stream);
      }
    };
    const auto copy = [&] {
      ZERO_CHECK_CUDA(
          cudaMemcpyAsync(copy_dst.as<void>(), copy_src.as<void>(), copy_bytes, cudaMemcpyDeviceToDevice, stream));
    };
    for (int i = 0; i < 3; ++i) { // warm-up: module load, clocks
      kernel();
      copy();
    }
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream));
    const event start;
    const event ran;
    const event copied;
    double kernel_seconds = 0.0;
    double copy_seconds = 0.0;
    for (auto _ : state) {
      ZERO_CHECK_CUDA(cudaEventRecord(start.get(), stream));
      kernel();
      ZERO_CHECK_CUDA(cudaEventRecord(ran.get(), stream));
      copy();
      ZERO_CHECK_CUDA(cudaEventRecord(copied.get(), stream));
      ZERO_CHECK_CUDA(cudaEventSynchronize(copied.get()));
      const double s = seconds_between(start, ran);
      kernel_seconds += s;
      copy_seconds += seconds_between(ran, copied);
      state.SetIterationTime(s);
    }
    const auto iterations = static_cast<double>(state.iterations());
    const double gbs = static_cast<double>(traffic) * iterations / kernel_seconds * 1e-9;
    const double copy_gbs = 2.0 * static_cast<double>(copy_bytes) * iterations / copy_seconds * 1e-9;
    state.counters["GB/s"] = gbs;
    state.counters["copy_GB/s"] = copy_gbs;
    state.counters["ratio"] = gbs / copy_gbs;
  }
  ZERO_CHECK_CUDA(cudaStreamDestroy(stream));
}

template <bool Quantize> void bm_quantize(benchmark::State& state) {
  try {
    run<Quantize>(state);
  } catch (const std::exception& e) {
    state.SkipWithError(e.what());
  }
}

// 1M .. 256M values, x4; 8- and 4-bit codes.
BENCHMARK_TEMPLATE(bm_quantize, true)
    ->Name("quantize/bf16")
    ->ArgsProduct({benchmark::CreateRange(1 << 20, 1 << 28, 4), {8, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(bm_quantize, false)
    ->Name("dequantize/bf16")
    ->ArgsProduct({benchmark::CreateRange(1 << 20, 1 << 28, 4), {8, 4}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

} // namespace

BENCHMARK_MAIN();
