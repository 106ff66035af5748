// zero-report: what this machine and this build of zero can do, like DeepSpeed's ds_report, and
// a verdict with a concrete fix when something needed is missing. With --config it validates a
// DeepSpeed config and prints it resolved (every default filled in), or the config_error.
//
// With --save-rates FILE it measures the rates zero-estimate --plan ranks settings by (the AdamW step
// on the device and on the host, the copies between them, and with --path the storage's read and
// write bandwidth there) and writes them to FILE as JSON (zero/tools/rates.hpp, `rates_json`).
//
//   zero-report --save-rates rates.json --path /mnt/nvme/zero
//   zero-estimate --plan --rates rates.json --gpu-memory 80GiB --host-memory 1TiB --nvme 3TB --params 7e9
//
// Exit status: 0 when everything needed is there and the config (if any) is valid, 1 otherwise
// (a probe or the rates file that failed included), 2 for a command-line error.

#include "config_options.hpp"
#include "probe_rates.hpp"
#include "zero/config/check.hpp"
#include "zero/config/config.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/engine/schedule_from_config.hpp" // rule_of: the host update's name

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sched.h>
#include <sstream>
#include <string>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>
#include <vector>

#if defined(ZERO_TOOLS_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(ZERO_HAS_NCCL)
#include <nccl.h>
#endif
#if defined(ZERO_HAS_MPI)
#include <mpi.h>
#endif
#if defined(ZERO_HAS_URING)
#include <liburing.h>
#endif

#ifndef ZERO_VERSION
#define ZERO_VERSION "unknown"
#endif
#ifndef ZERO_BUILD_TYPE
#define ZERO_BUILD_TYPE "unknown"
#endif

namespace {

using zero::detail::cat;

/// Things the verdict needs: problems fail the report, warnings do not.
struct verdict {
  std::vector<std::string> problems;
  std::vector<std::string> warnings;
};

void line(std::string_view key, const std::string& value) {
  std::string k(key);
  k.resize(std::max<std::size_t>(k.size(), 26), '.');
  std::cout << "  " << k << " " << value << "\n";
}

void section(std::string_view title) { std::cout << "\n" << title << "\n"; }

std::string read_first(const std::string& file, std::string_view key) {
  std::ifstream f(file);
  std::string l;
  while (std::getline(f, l)) {
    if (l.compare(0, key.size(), key) == 0) {
      auto colon = l.find(':');
      if (colon != std::string::npos) {
        auto v = l.substr(colon + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        return v;
      }
    }
  }
  return {};
}

std::string cuda_version_text(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

// ---- build -----------------------------------------------------------------------------------------

void report_build() {
  section("zero build");
  line("zero version", ZERO_VERSION);
#if defined(__clang__)
  line("compiler", std::string("clang ") + __clang_version__);
#elif defined(__GNUC__)
  line("compiler", std::string("g++ ") + __VERSION__);
#else
  line("compiler", "unknown");
#endif
  const long std_version = __cplusplus;
  const std::string std_name = std_version > 202002L ? "C++23" : std_version == 202002L ? "C++20" : "before C++20";
  line("C++ standard", std_name + " (__cplusplus " + std::to_string(std_version) + ")");
  line("build type", ZERO_BUILD_TYPE);
#if defined(NDEBUG)
  line("assertions", "off (NDEBUG)");
#else
  line("assertions", "on");
#endif
  std::string flags;
#if defined(__AVX512F__)
  flags += " -mavx512f";
#endif
#if defined(__AVX2__)
  flags += " -mavx2";
#endif
#if defined(__FMA__)
  flags += " -mfma";
#endif
#if defined(__F16C__)
  flags += " -mf16c";
#endif
  line("SIMD compiled for", flags.empty() ? "baseline (no AVX2/AVX-512 flags)" : flags.substr(1));
}

// ---- CPU and memory --------------------------------------------------------------------------------

void report_cpu() {
  section("CPU");
  std::string model = read_first("/proc/cpuinfo", "model name");
  if (model.empty()) {
    model = read_first("/proc/cpuinfo", "Model");
  }
  line("model", model.empty() ? "unknown" : model);
  cpu_set_t set;
  CPU_ZERO(&set);
  const int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : -1;
  line("logical CPUs", std::to_string(std::thread::hardware_concurrency()) + " online, " +
                           (usable > 0 ? std::to_string(usable) : std::string("?")) + " usable by this process");
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  std::string simd;
  auto has = [&](bool on, const char* name) {
    if (on) {
      simd += std::string(simd.empty() ? "" : " ") + name;
    }
  };
  has(__builtin_cpu_supports("sse4.2"), "SSE4.2");
  has(__builtin_cpu_supports("avx"), "AVX");
  has(__builtin_cpu_supports("avx2"), "AVX2");
  has(__builtin_cpu_supports("fma"), "FMA");
  has(__builtin_cpu_supports("avx512f"), "AVX-512F");
  has(__builtin_cpu_supports("avx512bw"), "AVX-512BW");
  has(__builtin_cpu_supports("avx512vl"), "AVX-512VL");
  has(__builtin_cpu_supports("avx512bf16"), "AVX-512BF16");
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
  has(__builtin_cpu_supports("avx512fp16"), "AVX-512FP16");
#endif
  const char* level = __builtin_cpu_supports("avx512f") ? "AVX-512" : __builtin_cpu_supports("avx2") ? "AVX2" : "SSE";
  line("SIMD level", std::string(level) + " (" + simd + ")");
#else
  line("SIMD level", "not an x86 CPU; not probed");
#endif
  const std::string mem = read_first("/proc/meminfo", "MemTotal");
  if (mem.empty()) {
    line("memory", "unknown");
  } else {
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f GiB", std::strtod(mem.c_str(), nullptr) / (1024.0 * 1024.0));
    line("memory", cat(gib, " (", mem, ")"));
  }
}

// ---- CUDA ------------------------------------------------------------------------------------------

/// The NVIDIA driver through libcuda.so.1, loaded at run time so that the report works on machines
/// without a driver. Only the driver API's C entry points are used.
struct driver_probe {
  bool loaded = false;
  int version = 0;
  int init_status = -1;
  struct gpu {
    std::string name;
    std::size_t bytes = 0;
    int major = 0, minor = 0;
  };
  std::vector<gpu> gpus;
  std::string error;
};

driver_probe probe_driver() {
  driver_probe d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* e = dlerror();
    d.error = e != nullptr ? e : "libcuda.so.1 not found";
    return d;
  }
  d.loaded = true;
  using init_fn = int (*)(unsigned);
  using version_fn = int (*)(int*);
  using count_fn = int (*)(int*);
  using get_fn = int (*)(int*, int);
  using name_fn = int (*)(char*, int, int);
  using mem_fn = int (*)(std::size_t*, int);
  using attr_fn = int (*)(int*, int, int);
  auto sym = [&](const char* n) { return dlsym(lib, n); };
  auto cu_init = reinterpret_cast<init_fn>(sym("cuInit"));
  auto cu_version = reinterpret_cast<version_fn>(sym("cuDriverGetVersion"));
  auto cu_count = reinterpret_cast<count_fn>(sym("cuDeviceGetCount"));
  auto cu_get = reinterpret_cast<get_fn>(sym("cuDeviceGet"));
  auto cu_name = reinterpret_cast<name_fn>(sym("cuDeviceGetName"));
  auto cu_mem = reinterpret_cast<mem_fn>(sym("cuDeviceTotalMem_v2"));
  auto cu_attr = reinterpret_cast<attr_fn>(sym("cuDeviceGetAttribute"));
  if (cu_init == nullptr || cu_version == nullptr || cu_count == nullptr || cu_get == nullptr || cu_name == nullptr ||
      cu_mem == nullptr || cu_attr == nullptr) {
    d.error = "libcuda.so.1 lacks the driver API entry points";
    return d;
  }
  cu_version(&d.version);
  d.init_status = cu_init(0);
  if (d.init_status != 0) {
    d.error = cat("cuInit failed with CUresult ", std::to_string(d.init_status));
    return d;
  }
  int n = 0;
  cu_count(&n);
  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76.
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (cu_get(&dev, i) != 0) {
      continue;
    }
    driver_probe::gpu g;
    char name[256] = {};
    cu_name(name, sizeof name, dev);
    g.name = name;
    cu_mem(&g.bytes, dev);
    cu_attr(&g.major, 75, dev);
    cu_attr(&g.minor, 76, dev);
    d.gpus.push_back(g);
  }
  // The library stays loaded for the life of the process; unloading a driver is not worth the risk.
  return d;
}

void report_cuda(verdict& v, bool require_gpu) {
  section("CUDA");
  const driver_probe d = probe_driver();
#if defined(ZERO_TOOLS_WITH_CUDA)
  // Without --require cuda or gpu, a host without a usable GPU is a warning: the CPU backend, the
  // config checks and the host's rates work there. With it, a problem.
  auto missing = [&](std::string what) { (require_gpu ? v.problems : v.warnings).push_back(std::move(what)); };
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  line("CUDA runtime (built with)",
       cuda_version_text(runtime) + " (CUDART_VERSION " + std::to_string(CUDART_VERSION) + ")");
  if (!d.loaded) {
    line("NVIDIA driver", cat("not found (", d.error, ")"));
    missing("this build uses CUDA but no NVIDIA driver is loaded: its GPU backend cannot run here (the CPU "
            "backend can); install the NVIDIA driver (check with nvidia-smi) or run on a GPU machine");
    return;
  }
  line("NVIDIA driver", cat("supports CUDA ", cuda_version_text(d.version)));
  if (d.version < runtime) {
    missing(cat("the NVIDIA driver supports CUDA ", cuda_version_text(d.version),
                " but zero was built with CUDA runtime ", cuda_version_text(runtime),
                ": update the driver to one that supports CUDA ", cuda_version_text(runtime),
                " or rebuild zero with an older toolkit"));
  }
  if (!d.error.empty()) {
    line("driver status", d.error);
  }
  line("GPUs", std::to_string(d.gpus.size()));
  for (std::size_t i = 0; i < d.gpus.size(); ++i) {
    const auto& g = d.gpus[i];
    line(cat("  GPU ", std::to_string(i)), g.name + ", " + std::to_string(g.bytes >> 20) + " MiB, compute capability " +
                                               std::to_string(g.major) + "." + std::to_string(g.minor));
  }
  if (d.gpus.empty()) {
    missing("this build uses CUDA but no GPU is visible: its GPU backend cannot run here (the CPU backend can); "
            "check nvidia-smi and CUDA_VISIBLE_DEVICES");
  }
#else
  line("CUDA", "not built with CUDA (this build has no zero::cuda)");
  if (d.loaded && d.init_status == 0) {
    line("NVIDIA driver", cat("present, supports CUDA ", cuda_version_text(d.version), ", ",
                              std::to_string(d.gpus.size()), " GPU(s) visible"));
    if (!d.gpus.empty()) {
      v.warnings.push_back(cat("this machine has ", std::to_string(d.gpus.size()),
                               " GPU(s) but this build of zero has no CUDA backend: reconfigure with "
                               "-DZERO_WITH_CUDA=ON (needs the CUDA toolkit) to use them"));
    }
  } else {
    line("NVIDIA driver", "not found");
  }
  if (require_gpu) {
    v.problems.push_back("a GPU backend was required but this build has no CUDA: install the CUDA toolkit and "
                         "reconfigure with -DZERO_WITH_CUDA=ON");
  }
#endif
}

// ---- NCCL and MPI ----------------------------------------------------------------------------------

void report_comm() {
  section("communication");
#if defined(ZERO_HAS_NCCL)
  int nccl = 0;
  if (ncclGetVersion(&nccl) == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    line("NCCL",
         std::to_string(nccl / 10000) + "." + std::to_string((nccl % 10000) / 100) + "." + std::to_string(nccl % 100));
  } else {
    line("NCCL", "built with NCCL, but ncclGetVersion failed");
  }
#else
  line("NCCL", "not built with NCCL (this build has no zero::nccl)");
#endif
#if defined(ZERO_HAS_MPI)
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  int major = 0, minor = 0;
  // Both may be called before MPI_Init.
  MPI_Get_library_version(lib, &len);
  MPI_Get_version(&major, &minor);
  std::string first(lib, static_cast<std::size_t>(std::max(len, 0)));
  // Some MPIs count the terminating NUL in len, and most print several lines; keep the first line.
  first = first.substr(0, std::min(first.find('\n'), first.find('\0')));
  first.erase(first.find_last_not_of(" \t") + 1);
  line("MPI", first + " (MPI standard " + std::to_string(major) + "." + std::to_string(minor) + ")");
#else
  line("MPI", "not built with MPI (this build has no zero::mpi)");
#endif
}

// ---- storage ---------------------------------------------------------------------------------------

struct io_probe {
  bool o_direct = false;
  std::string o_direct_detail;
  std::string uring_detail;
  bool uring = false;
};

io_probe probe_io(const std::filesystem::path& dir) {
  io_probe r;
  std::string tmpl = (dir / "zero-report-XXXXXX").string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int plain = mkstemp(name.data());
  if (plain < 0) {
    r.o_direct_detail = std::string("cannot create a file there: ") + std::strerror(errno);
    r.uring_detail = "not probed";
    return r;
  }
  close(plain);
  constexpr std::size_t block = 4096;
  void* buf = nullptr;
  if (posix_memalign(&buf, block, block) != 0) {
    unlink(name.data());
    r.o_direct_detail = "cannot allocate an aligned buffer";
    return r;
  }
  std::unique_ptr<void, decltype(&std::free)> hold(buf, &std::free);
  std::memset(buf, 0x5a, block);
  const int fd = open(name.data(), O_RDWR | O_DIRECT);
  if (fd < 0) {
    r.o_direct_detail = std::string("open(O_DIRECT) failed: ") + std::strerror(errno);
  } else if (pwrite(fd, buf, block, 0) != static_cast<ssize_t>(block)) {
    r.o_direct_detail = std::string("aligned write failed: ") + std::strerror(errno);
  } else if (pread(fd, buf, block, 0) != static_cast<ssize_t>(block)) {
    r.o_direct_detail = std::string("aligned read failed: ") + std::strerror(errno);
  } else {
    r.o_direct = true;
    r.o_direct_detail = "yes (4 KiB aligned write and read)";
  }
#if defined(ZERO_HAS_URING)
  if (fd >= 0) {
    io_uring ring;
    const int rc = io_uring_queue_init(8, &ring, 0);
    if (rc < 0) {
      r.uring_detail = std::string("io_uring_queue_init failed: ") + std::strerror(-rc) +
                       (rc == -EPERM || rc == -ENOSYS ? " (disabled by the kernel or a seccomp policy)" : "");
    } else {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(sqe, fd, buf, block, 0);
      io_uring_submit(&ring);
      io_uring_cqe* cqe = nullptr;
      const int wait = io_uring_wait_cqe(&ring, &cqe);
      if (wait < 0) {
        r.uring_detail = std::string("waiting for a read failed: ") + std::strerror(-wait);
      } else if (cqe->res != static_cast<int>(block)) {
        r.uring_detail = std::string("a read returned ") +
                         (cqe->res < 0 ? std::string(std::strerror(-cqe->res)) : std::to_string(cqe->res) + " bytes");
        io_uring_cqe_seen(&ring, cqe);
      } else {
        r.uring = true;
        r.uring_detail = "yes (an O_DIRECT read through io_uring)";
        io_uring_cqe_seen(&ring, cqe);
      }
      io_uring_queue_exit(&ring);
    }
  } else {
    r.uring_detail = "not probed: the file could not be opened with O_DIRECT";
  }
#else
  r.uring_detail = "not built with io_uring (this build has no zero::uring; install liburing-dev and reconfigure)";
#endif
  if (fd >= 0) {
    close(fd);
  }
  unlink(name.data());
  return r;
}

void report_storage(const std::optional<std::filesystem::path>& path, verdict& v, bool require_o_direct,
                    bool require_uring) {
  section("storage (where NVMe offload of the optimizer state keeps its files)");
  if (!path) {
    line("path", "none given (--path DIR probes O_DIRECT and io_uring there; --config probes its nvme_path)");
    if (require_o_direct || require_uring) {
      v.problems.push_back("O_DIRECT/io_uring were required but no --path was given to probe: pass --path DIR");
    }
    return;
  }
  line("path", path->string());
  const io_probe p = probe_io(*path);
  line("O_DIRECT", p.o_direct_detail);
  line("io_uring", p.uring_detail);
  if (require_o_direct && !p.o_direct) {
    v.problems.push_back(path->string() + " does not support O_DIRECT (" + p.o_direct_detail +
                         "): use a directory on a local NVMe file system such as ext4 or xfs (not tmpfs or overlayfs)");
  }
  if (require_uring && !p.uring) {
#if defined(ZERO_HAS_URING)
    v.problems.push_back(
        cat("io_uring is not usable here (", p.uring_detail,
            "): allow io_uring (sysctl kernel.io_uring_disabled=0, or the container's seccomp profile)"));
#else
    v.problems.push_back("io_uring was required but this build has none: install liburing-dev and reconfigure "
                         "(-DZERO_WITH_URING=ON)");
#endif
  }
}

// ---- backends --------------------------------------------------------------------------------------

void report_backends() {
  section("backends in this build");
  std::string compute = "cpu";
  std::string comm = "thread";
#if defined(ZERO_TOOLS_WITH_CUDA)
  compute += ", cuda";
#endif
#if defined(ZERO_HAS_MPI)
  comm += ", mpi";
#endif
#if defined(ZERO_HAS_NCCL)
  comm += ", nccl";
#endif
  std::string storage = "posix";
#if defined(ZERO_HAS_URING)
  storage += ", io_uring";
#endif
  line("compute backends", compute);
  line("communicators", comm);
  line("storage", storage);
  line("ZeRO stages", "0, 1, 2, 3");
  line("offload", "optimizer state to host memory or NVMe at stages 1-3 (offload_optimizer.device \"cpu\" or "
                  "\"nvme\"), or a share of it to host memory (offload_optimizer.ratio, or \"auto\" from measured "
                  "rates), the parameter shard to host memory or NVMe at stage 3 (offload_param.device \"cpu\" "
                  "or \"nvme\")");
}

// ---- config ----------------------------------------------------------------------------------------

void report_nvme_path(const char* block, const std::filesystem::path& dir, verdict& v);

/// What NVMe offload of the optimizer state will do with `c` (docs/offload.md): where the state file
/// goes, what the host keeps, and whether nvme_path is a folder here and takes O_DIRECT (which
/// `zero::uring_storage` needs; the default `posix_storage` does not). A missing folder is a warning
/// (the config may be meant for another machine). What the engine refuses, check_engine_config says.
void report_nvme(const zero::config& c, verdict& v) {
  const auto& o = c.zero_optimization.offload_optimizer;
  const std::filesystem::path dir(o.nvme_path);
  const std::int64_t chunk = c.aio.block_size / 4 * c.aio.queue_depth;
  std::cout << "  offload: the optimizer state will be kept on NVMe and stepped on the host"
               " (zero_optimization.offload_optimizer.device \"nvme\"; docs/offload.md)\n"
            << "    state file per rank: " << (dir / "zero-optimizer-<pid>-<n>-rank<r>.swap").string()
            << ", 2 K psi / N bytes (two slots of fp32 master, m and v; m and v for fp32 training), mode 0600,"
               " removed when the engine is destroyed\n"
            << "    host: the gradient shard, two copies of the parameter shard and " << o.buffer_count
            << " chunk buffers of up to " << chunk
            << " elements per tensor (offload_optimizer.buffer_count; aio.block_size / 4 x aio.queue_depth)\n";
  if (o.host_ratio > 0) {
    // Per parameter of the rank's shard (psi / N), as engine.memory() counts them: the host share h holds its
    // state and staged shards, (K + P + G); the file's share two parameter copies and its gradients, (2 P + G),
    // and two slots of its state on NVMe, 2 K.
    const double h = o.host_ratio;
    const double k = c.param_dtype() == zero::dtype::f32 ? 8.0 : 12.0;
    const auto p = static_cast<double>(zero::size_of(c.param_dtype()));
    const auto g = static_cast<double>(zero::size_of(c.grad_accum_dtype));
    std::cout << "    split: " << h << " of each rank's optimizer state (its last elements) in host memory and "
              << 1 - h
              << " in the state file (zero_optimization.offload_optimizer.host_ratio; docs/offload.md): per "
                 "parameter of the rank's shard, host "
              << h * (k + p + g) + (1 - h) * (2 * p + g) << " bytes (" << h << " x " << k + p + g << " + " << 1 - h
              << " x " << 2 * p + g << "), NVMe " << 2 * k * (1 - h)
              << " bytes; the gradient shard stays on the device at stages 2-3, and the host share is stepped "
                 "after the file's writes\n";
  }
  report_nvme_path("offload_optimizer", dir, v);
}

/// Whether `dir`, the nvme_path of the offload block `block`, is a folder here and takes O_DIRECT; a
/// missing folder is a warning.
void report_nvme_path(const char* block, const std::filesystem::path& dir, verdict& v) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    std::cout << "    nvme_path " << dir.string() << ": not a folder here\n";
    v.warnings.push_back(cat("zero_optimization.", block, ".nvme_path ", dir.string(),
                             " is not a folder on this machine: the engine creates its file there, not the folder; "
                             "create it on the NVMe drive before training"));
    return;
  }
  const io_probe p = probe_io(dir);
  std::cout << "    nvme_path " << dir.string() << ": a folder here; O_DIRECT " << p.o_direct_detail
            << (p.o_direct ? "" : " (zero::posix_storage, the default, works; zero::uring_storage needs O_DIRECT)")
            << "\n"
            << "    io_uring there: " << p.uring_detail << "\n";
}

/// What NVMe offload of the parameters will do with `c` (docs/offload.md): the file, what the host
/// keeps, the folder.
void report_param_nvme(const zero::config& c, verdict& v) {
  const auto& o = c.zero_optimization.offload_param;
  const std::filesystem::path dir(o.nvme_path);
  std::cout << "  offload: the parameter shard will live on NVMe, read into host buffers for each gather and "
               "written behind after each step (zero_optimization.offload_param.device \"nvme\"; docs/offload.md)\n"
            << "    parameter file per rank: " << (dir / "zero-params-<pid>-<n>-rank<r>.swap").string()
            << ", two slots of the shard beyond max_in_cpu, mode 0600, removed when the engine is destroyed\n"
            << "    host: the modules within the first " << o.max_in_cpu << " elements of the shard (max_in_cpu) and "
            << o.buffer_count << " bounce buffers of a module's slice, at most " << o.buffer_size
            << " elements (buffer_count, buffer_size)\n";
  report_nvme_path("offload_param", dir, v);
}

void report_config(const std::string& file, const zero::config_inputs& in, verdict& v) {
  section(cat("config ", file));
  try {
    const zero::config c = zero::config::from_file(file, in);
    // The engine's own rule, for the ranks given (without --world-size, the checks that need them are skipped).
    zero::check_engine_config(c, in.world_size);
    std::cout << "  valid; resolved for world size " << c.world_size << ":\n";
    std::istringstream dump(c.to_json().dump(2));
    for (std::string l; std::getline(dump, l);) {
      std::cout << "  " << l << "\n";
    }
    for (const std::string& n : c.notes) {
      std::cout << "  note: " << n << "\n";
    }
    if (!in.world_size) {
      std::cout << "  note: no --world-size; the group sizes that must divide the ranks (mics_shard_size, "
                   "zero_hpz_partition_size, zero_quantized_gradients_node_size) are not checked\n";
    }
    // Optimizer offload to the CPU or NVMe and parameter offload to the CPU or NVMe run: say where the
    // state will live.
    const auto& z = c.zero_optimization;
    const auto& opt = z.offload_optimizer;
    // The overlap keys act with the whole state on the host, or with a split one beside the next forward.
    const auto report_overlaps = [&](bool split) {
      if (opt.backward_overlap > 0) {
        const bool acts = c.stage() >= 2 && c.gradient_accumulation_steps == 1 && c.param_dtype() != zero::dtype::f32 &&
                          (!split || opt.forward_overlap);
        std::cout << "  offload: " << opt.backward_overlap << " of each rank's "
                  << (split ? "host share" : "optimizer state")
                  << (acts ? " will be updated during backward, held twice in host memory"
                           : " would be updated during backward, but this config has no such updates (they need "
                             "stage 2 or 3, 16-bit parameters and no gradient accumulation)")
                  << " (zero_optimization.offload_optimizer.backward_overlap; docs/offload.md)\n";
      }
      if (opt.forward_overlap) {
        const bool acts = c.stage() >= 2 && z.offload_param.device != zero::offload_device::nvme;
        // The host's update: AdamW, or the config's other rule (docs/optimizers.md).
        const std::string rule = c.optimizer ? zero::rule_name_of(*c.optimizer) : std::string("AdamW");
        std::cout << "  offload: "
                  << (acts ? (split
                                  ? "step() will return while the host still runs " + rule +
                                        " on its share (whose gradients go to the host during backward); the next "
                                        "forward's modules wait on the device only for the ranges they read"
                                  : "step() will return while the host still runs " + rule +
                                        "; the next forward's modules wait on the device only for the ranges they read")
                           : "the step would run beside the next forward, but not in this config (it needs stage 2 "
                             "or 3 and no offload_param nvme)")
                  << " (zero_optimization.offload_optimizer.forward_overlap; docs/offload.md)\n";
      }
      if (opt.delayed_update) {
        std::cout << "  offload: NOT EXACT: after " << opt.delayed_warmup_steps
                  << " exact step(s), each update will use the gradients of the parameters one step old: the host's "
                     "AdamW of a step runs beside the next forward and backward, and the next step() publishes it; "
                     "the host gradient shard is held twice (zero_optimization.offload_optimizer.delayed_update; "
                     "docs/offload.md, \"Exact, delayed, selective\")\n";
      }
      if (z.zenflow.enabled) {
        const auto select = zero::zenflow_select_steps(z.zenflow);
        std::cout << "  offload: NOT EXACT: selective (ZenFlow): after " << z.zenflow.full_warm_up_rounds
                  << " exact step(s), the top " << z.zenflow.topk_ratio
                  << " of each 2-D weight's columns by gradient norm (and every element of the other parameters) "
                     "will be updated on the device every step; the rest accumulate in an fp32 window in host "
                     "memory (4 bytes per parameter over the ranks) and are applied on the host every "
                  << z.zenflow.update_interval.value_or(1) << " step(s)"
                  << (z.zenflow.overlap_step ? ", each host update running beside the next interval's steps and "
                                               "reaching the device at the next host update or choice of columns "
                                               "(one interval late; "
                                               "the host gradient shard held twice)"
                                             : "")
                  << "; the columns are chosen "
                  << (select > 0 ? "again every " + std::to_string(select) + " steps" : std::string("once"))
                  << " (zero_optimization.zenflow; docs/offload.md, \"Exact, delayed, selective\")\n";
      }
    };
    if (opt.device == zero::offload_device::cpu && opt.ratio_auto) {
      std::cout << "  offload: partial; the engine measures host and device AdamW and copy rates at finalize and "
                   "offloads the share of the optimizer state that makes both parts of a step take equally long "
                   "(zero_optimization.offload_optimizer.ratio \"auto\"; docs/offload.md)\n";
      report_overlaps(true);
    } else if (opt.device == zero::offload_device::cpu && opt.ratio == 0) {
      std::cout << "  offload: none; ratio 0 keeps the whole optimizer state on the device, as without offload"
                   " (zero_optimization.offload_optimizer.ratio; docs/offload.md)\n";
    } else if (opt.device == zero::offload_device::cpu && opt.ratio < 1) {
      std::cout << "  offload: partial; " << opt.ratio
                << " of each rank's optimizer state will be in host memory and stepped on the host, the rest on the "
                   "device (zero_optimization.offload_optimizer.ratio; docs/offload.md)\n";
      report_overlaps(true);
    } else if (opt.device == zero::offload_device::cpu) {
      std::cout << "  offload: the optimizer state will be offloaded to host memory and stepped on the host"
                   " (zero_optimization.offload_optimizer.device \"cpu\"; docs/offload.md)\n";
      report_overlaps(false);
    } else if (z.offload_optimizer.device == zero::offload_device::nvme) {
      report_nvme(c, v);
    }
    if (z.offload_param.device == zero::offload_device::cpu) {
      std::cout << "  offload: the parameter shard will live in host memory and be uploaded before each gather"
                   " (zero_optimization.offload_param.device \"cpu\"; docs/offload.md)\n";
    } else if (z.offload_param.device == zero::offload_device::nvme) {
      report_param_nvme(c, v);
    }
  } catch (const zero::config_error& e) {
    std::cout << "  " << e.what() << "\n";
    v.problems.push_back(std::string("the config is refused: ") + e.what());
  }
}

// ---- rates -----------------------------------------------------------------------------------------

void report_rates(const std::string& file, const std::optional<std::filesystem::path>& path,
                  const zero::tools::probe_options& p, verdict& v) {
  section(cat("measured rates (for zero-estimate --plan; ", std::to_string(p.bytes >> 20), " MiB per probe)"));
  try {
    const auto measured = zero::tools::measure_this_machine(p, path);
    const auto& rates = measured.rates;
    std::cout << zero::tools::rates_text(rates, "  ");
    if (!measured.device_missing.empty()) {
      // zero-estimate --plan needs the device's rates too: a file without them would be refused there.
      std::cout << "  not written to " << file << ": the device's rates are missing\n";
      v.problems.push_back(cat("--save-rates: ", measured.device_missing));
      return;
    }
    std::ofstream out(file, std::ios::trunc);
    out << zero::tools::rates_json(rates).dump(2) << "\n";
    out.close();
    if (!out) {
      v.problems.push_back(cat("cannot write the rates to ", file, ": ", std::strerror(errno)));
      return;
    }
    std::cout << "  written to " << file << "\n";
  } catch (const zero::error& e) {
    v.problems.push_back(cat("measuring the rates failed: ", e.what()));
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-report: what this machine and this build of zero can do (like DeepSpeed's ds_report)"};
  std::optional<std::string> config_file;
  std::optional<std::string> path;
  std::vector<std::string> require;
  bool config_only = false;
  zero::tools::config_options options;
  // Not CLI::ExistingFile: zero::config::from_file names a missing file, a folder or a device itself.
  app.add_option("--config", config_file, "validate a DeepSpeed config and print it resolved");
  app.add_option("--path", path, "probe O_DIRECT and io_uring in this directory")->check(CLI::ExistingDirectory);
  app.add_option("--require", require, "features that must be present: cuda, gpu, nccl, mpi, o_direct, io_uring")
      ->delimiter(',')
      ->check(CLI::IsMember({"cuda", "gpu", "nccl", "mpi", "o_direct", "io_uring"}));
  app.add_flag("--config-only", config_only, "with --config, print only the config section and its verdict");
  std::optional<std::string> rates_file;
  std::string probe_size = "256MiB";
  app.add_option("--save-rates", rates_file,
                 "measure the rates zero-estimate --plan ranks by (with --path: the storage's there too) and write "
                 "them to this JSON file");
  app.add_option("--probe-size", probe_size, "bytes each rate probe moves, e.g. 256MiB")->capture_default_str();
  options.add_to(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every command-line mistake exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }

  zero::tools::probe_options probe;
  try {
    probe.bytes = static_cast<std::size_t>(zero::tools::parse_bytes(probe_size));
  } catch (const zero::usage_error& e) {
    std::cerr << "zero-report: --probe-size: " << e.what() << "\n";
    return 2;
  }
  if (probe.bytes < 4096) {
    std::cerr << "zero-report: --probe-size: " << probe.bytes << " bytes is too small to time; expected 4KiB or more\n";
    return 2;
  }
  auto required = [&](std::string_view f) { return std::find(require.begin(), require.end(), f) != require.end(); };
  verdict v;
  zero::config_inputs inputs;
  try {
    inputs = options.inputs();
  } catch (const CLI::Error& e) {
    app.exit(e);
    return 2;
  }

  std::cout << "zero-report";
  if (!config_only || !config_file) {
    report_build();
    report_cpu();
    report_cuda(v, required("cuda") || required("gpu"));
    report_comm();
    report_storage(path ? std::optional<std::filesystem::path>(*path) : std::nullopt, v, required("o_direct"),
                   required("io_uring"));
    report_backends();
#if !defined(ZERO_HAS_NCCL)
    if (required("nccl")) {
      v.problems.push_back("NCCL was required but this build has none: install NCCL (libnccl-dev) and reconfigure "
                           "with -DZERO_WITH_CUDA=ON -DZERO_WITH_NCCL=ON");
    }
#endif
#if !defined(ZERO_HAS_MPI)
    if (required("mpi")) {
      v.problems.push_back("MPI was required but this build has none: install an MPI (libopenmpi-dev) and reconfigure "
                           "with -DZERO_WITH_MPI=ON");
    }
#endif
  }
  if (rates_file) {
    report_rates(*rates_file, path ? std::optional<std::filesystem::path>(*path) : std::nullopt, probe, v);
  }
  std::cout << "\n";
  if (config_file) {
    report_config(*config_file, inputs, v);
  }

  std::cout << "\n";
  for (const std::string& w : v.warnings) {
    std::cout << "warning: " << w << "\n";
  }
  if (v.problems.empty()) {
    std::cout << "verdict: OK" << (config_file ? ", config valid" : "") << "\n";
    return 0;
  }
  std::cout << "verdict: NOT READY (" << v.problems.size() << (v.problems.size() == 1 ? " problem" : " problems")
            << ")\n";
  for (const std::string& p : v.problems) {
    std::cout << "  - " << p << "\n";
  }
  return 1;
}
