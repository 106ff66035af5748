#pragma once
// zero-gpt on GPUs: gpt_cuda.hpp's bf16 math over a cuda_backend engine whose parameters and gradients live in
// device memory, one GPU per rank over NCCL, or ranks as threads sharing one GPU (device_group_communicator,
// --one-gpu). `math_traits<cuda_model>` tells gpt_engine.hpp's zero_gpt how to drive it; `cuda_runtime` is main.cpp's
// train() on a GPU; `host_sums` of either communicator sums the host's loss counters through device memory, which
// their collectives read.

#include "gpt_cuda.hpp"
#include "gpt_engine.hpp"
#include "gpt_kernels.hpp"
#include "gpt_runtime.hpp"

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <filesystem>
#include <optional>
#include <string>
#include <zero/backend/cuda_backend.hpp>
#include <zero/comm/device_group_communicator.hpp>
#include <zero/comm/nccl_communicator.hpp>
#include <zero/core/cuda_check.hpp>
#include <zero/engine/engine.hpp>
#include <zero/tools/probes.hpp>
#if ZERO_HAS_URING
#include <zero/storage/uring_storage.hpp>
#endif

namespace gpt {

template <> struct math_traits<cuda_model> {
  using param_type = zero::bf16;
  using block_params_type = cuda_block_params;
  using block_grads_type = cuda_block_grads;
  /// Where the math adds a gradient: fp32 or bf16 device memory.
  using grad_type = grad_ref;
  /// The math adds the blocks' and ln_f's gradients into an engine's bf16 buffer itself (cuBLAS's C in bf16, the
  /// column sums' second pass rounding once), so only the embedding's two go through the fp32 scratch.
  static constexpr bool adds_bf16 = true;
  /// The GPU's math reads bf16 parameters in place: another dtype is refused when the model is made.
  static constexpr bool converts_params = false;
  /// The model on the engine's stream; with `checkpoint` it keeps each block's input only, in host memory when
  /// the config's activation_checkpointing.cpu_checkpointing says so (a store sized by its block: one checkpoint
  /// of batch x seq x C bf16 per block unless number_checkpoints says otherwise).
  /// @throws std::invalid_argument with cpu_checkpointing but without `o.checkpoint`.
  template <class Engine> static cuda_model make(Engine& eng, const model_config& cfg, int batch, math_options o) {
    const std::size_t input_bytes = static_cast<std::size_t>(batch) * static_cast<std::size_t>(cfg.seq) *
                                    static_cast<std::size_t>(cfg.d_model) * sizeof(zero::bf16);
    auto offload = zero::activation_store_options_from(eng.cfg(), input_bytes, static_cast<std::size_t>(cfg.layers));
    if (offload && !o.checkpoint) {
      throw std::invalid_argument("activation_checkpointing.cpu_checkpointing: keeps the checkpoints of activation "
                                  "checkpointing in host memory; expected --checkpoint-activations with it");
    }
    return cuda_model(cfg, batch, eng.stream().get(),
                      cuda_model_options{.checkpoint = o.checkpoint,
                                         .offload = offload,
                                         .compute = &eng.stream(),
                                         .profile = o.profile,
                                         .gemm_epilogues = o.gemm_epilogues});
  }
  /// Device memory of `floats` fp32 values.
  class scratch {
  public:
    explicit scratch(std::size_t floats) { ZERO_CHECK_CUDA(cudaMalloc(&p_, std::max<std::size_t>(floats, 1) * 4)); }
    scratch(scratch&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
    scratch(const scratch&) = delete;
    scratch& operator=(const scratch&) = delete;
    scratch& operator=(scratch&&) = delete;
    ~scratch() {
      if (p_ != nullptr) {
        ZERO_CHECK_CUDA_NOTHROW(cudaFree(p_));
      }
    }
    [[nodiscard]] float* data() noexcept { return p_; }

  private:
    float* p_ = nullptr;
  };
  template <class Engine> static void zero(Engine& eng, float* p, std::size_t n) {
    ZERO_CHECK_CUDA(cudaMemsetAsync(p, 0, n * sizeof(float), eng.stream().get()));
  }
  template <class Engine> static void add(Engine& eng, const zero::tensor_view& dst, const float* src, std::size_t n) {
    add_into(dst.data, dst.type, src, n, eng.stream().get());
  }
};

/// The communicators whose collectives read and write device memory only: NCCL's (a GPU per rank) and the ranks
/// sharing one GPU (`device_group_communicator`).
template <class Comm>
concept device_communicator =
    std::same_as<Comm, zero::nccl_communicator> || std::same_as<Comm, zero::device_group_communicator>;

/// A device communicator reads device memory: the host's values go through a small device buffer on the engine's
/// stream.
template <device_communicator Comm> class host_sums<Comm> {
public:
  explicit host_sums(Comm& comm) : comm_(comm) { ZERO_CHECK_CUDA(cudaMalloc(&d_, capacity * sizeof(double))); }
  host_sums(const host_sums&) = delete;
  host_sums& operator=(const host_sums&) = delete;
  ~host_sums() { ZERO_CHECK_CUDA_NOTHROW(cudaFree(d_)); }

  template <class Engine> void operator()(Engine& eng, double* v, std::size_t n) {
    if (n > capacity) {
      throw std::invalid_argument("host_sums: " + std::to_string(n) + " values; at most " + std::to_string(capacity));
    }
    const cudaStream_t s = eng.stream().get();
    ZERO_CHECK_CUDA(cudaMemcpyAsync(d_, v, n * sizeof(double), cudaMemcpyHostToDevice, s));
    ZERO_CHECK_CUDA(cudaStreamSynchronize(s)); // the communicator's stream reads d_ next
    comm_.all_reduce(d_, d_, n, zero::reduce_op::sum).wait();
    ZERO_CHECK_CUDA(cudaMemcpy(v, d_, n * sizeof(double), cudaMemcpyDeviceToHost));
  }

private:
  static constexpr std::size_t capacity = 8;
  Comm& comm_;
  double* d_ = nullptr;
};

/// A GPU per rank: cuBLAS and gpt_kernels.cu in bf16 over the engine's device memory, NCCL between GPUs; or with
/// --one-gpu every rank on `shared_device`, device copies and kernels between the ranks' streams.
struct cuda_runtime {
  /// The GPU the ranks of --one-gpu share.
  static constexpr int shared_device = 0;

#if ZERO_HAS_URING
  using storage_type = zero::uring_storage;
#else
  using storage_type = zero::posix_storage;
#endif
  template <class Comm>
  using engine_type = zero::basic_engine<zero::cuda_backend, Comm, zero::cuda_backend::allocator_type, storage_type>;
  using math = cuda_model;

  /// The rank's backend on its communicator's GPU (with --one-gpu, the one every rank shares).
  template <device_communicator Comm> [[nodiscard]] zero::cuda_backend backend(const Comm& comm) const {
    return zero::cuda_backend(comm.device());
  }
  /// Waits until the GPU has done the rank's queued work (the engine's streams and the communicator's: the whole
  /// device, so with --one-gpu the other ranks' work so far too).
  template <class Engine> void synchronize(Engine&) const { ZERO_CHECK_CUDA(cudaDeviceSynchronize()); }
  /// Notes the device memory in use now (cudaMemGetInfo: every allocation on the GPU, the framework's too, and with
  /// --one-gpu every rank's).
  void sample_memory() { peak_ = std::max(peak_, used_now()); }
  /// Notes the device memory in use before the engine and the model allocate (the CUDA context, the modules loaded
  /// so far, and with --one-gpu the other ranks' memory of the moment).
  void sample_base() { base_ = used_now(); }
  /// The most device memory in use at a sample.
  [[nodiscard]] std::size_t device_peak_bytes() const { return peak_; }
  /// The device memory in use at sample_base.
  [[nodiscard]] std::size_t device_base_bytes() const { return base_; }
  /// The most bytes the engine's caching pool held from CUDA at once (in use or cached): with device_peak_bytes,
  /// device_base_bytes and the model's activation_bytes, what the GPU held beyond every count.
  template <class Engine> [[nodiscard]] static std::size_t reserved_peak_bytes(Engine& eng) {
    return eng.backend().get_allocator().peak_bytes_reserved();
  }
  /// Dense bf16 peak by the GPU's name, the rate llm.c's MFU divides by: H100 and H200 SXM 989.4 TFLOP/s, H100
  /// PCIe 756; 0 (no MFU reported) for another GPU.
  [[nodiscard]] double peak_flops() const {
    const std::string name = device_name();
    if (name.find("H100") == std::string::npos && name.find("H200") == std::string::npos) {
      return 0.0;
    }
    return name.find("PCIe") != std::string::npos ? 756e12 : 989.4e12;
  }
  [[nodiscard]] std::string device_name() const {
    int dev = 0;
    ZERO_CHECK_CUDA(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, dev));
    return prop.name;
  }

  /// --config auto-plan's default device budget of one rank: GPU 0's free memory (its 1/`ranks_per_gpu` share with
  /// --one-gpu) less what the model's activations and workspaces take (measured by making the model once; with
  /// `checkpoint`, a checkpointing one whose block inputs stay on the device, the most it keeps) and less
  /// zero_gpt's fp32 gradient scratch (the embedding's gradients, `gradient_scratch_layout` with embedding_only),
  /// which the bf16 gradients of stages 1-3 use (at stage 0, whose gradients are fp32, the budget is that much too
  /// small), and less what the budget's own bytes take beyond their count: 2% of them for the device pool's
  /// slack (its size classes and the freed blocks it keeps) and 512 MiB for cuBLAS's and the kernels' workspaces.
  /// The 52-block, 4096-wide run planned without the scratch (then wte's and the largest block's, 1.52 GiB)
  /// and stopped short on the GPU; planned with it but without the reserve it stopped again, 0.31 GiB free: at
  /// 69.16 GiB in use the pool held 70.04 (1.3% more), and 0.28 GiB beyond the scratch was the libraries'
  /// (bench/README.md, "The eleventh session").
  static std::int64_t plan_device_bytes(const model_config& cfg, int batch, bool checkpoint, int ranks_per_gpu) {
    ZERO_CHECK_CUDA(cudaSetDevice(0));
    std::size_t activations = 0;
    {
      cudaStream_t s = nullptr;
      ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      try {
        const cuda_model m(cfg, batch, s, cuda_model_options{.checkpoint = checkpoint});
        activations = m.activation_bytes();
      } catch (...) {
        ZERO_CHECK_CUDA_NOTHROW(cudaStreamDestroy(s));
        throw;
      }
      ZERO_CHECK_CUDA(cudaStreamDestroy(s));
    }
    const std::size_t taken = activations + gradient_scratch_layout(parameters(cfg), true).floats * sizeof(float);
    std::size_t free = 0, total = 0;
    ZERO_CHECK_CUDA(cudaMemGetInfo(&free, &total));
    // Every rank on the GPU holds activations and a scratch of its own beside its share.
    const std::size_t share = free / static_cast<std::size_t>(ranks_per_gpu);
    const std::size_t reserve = share / 50 + (std::size_t{512} << 20);
    return static_cast<std::int64_t>(share > taken + reserve ? share - taken - reserve : 0);
  }
  /// The rates --config auto-plan ranks its candidates by, measured now on GPU 0, the host (and `nvme`).
  static zero::tools::machine_rates plan_rates(const std::optional<std::filesystem::path>& nvme) {
    zero::cuda_backend device(0);
    cudaDeviceProp prop{};
    ZERO_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    return zero::tools::measure_rates(device, prop.name, {}, nvme);
  }

private:
  static std::size_t used_now() {
    std::size_t free = 0, total = 0;
    ZERO_CHECK_CUDA(cudaMemGetInfo(&free, &total));
    return total - free;
  }
  std::size_t peak_ = 0, base_ = 0;
};

} // namespace gpt
