// Checkpoints of an engine whose memory the host may not touch (a GPU's): every read and write of the
// optimizer state, the parameters and the frozen buffer goes through the backend's copy. Here the
// "device" is host memory whose allocator says host_accessible = false, so on the CPU the engine and the
// checkpoint code take exactly the path they take with cuda_backend, and the results must be the same
// bits as with cpu_backend.
#include "ckpt_harness.hpp"
#include "zero/checkpoint/safetensors.hpp"
#include "zero/memory/host_allocator.hpp"

#include <doctest/doctest.h>
#include <fstream>
#include <iterator>

namespace zt = zero::testing;

namespace {

/// Host memory the engine must treat as a device's.
struct opaque_allocator {
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) {
    return zero::host_allocator{}.allocate(bytes, alignment);
  }
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = alignof(std::max_align_t)) noexcept {
    zero::host_allocator{}.deallocate(p, bytes, alignment);
  }
  friend bool operator==(const opaque_allocator&, const opaque_allocator&) = default;
};

/// cpu_backend's kernels over that memory; `copy` (memcpy) is the only way in and out, as on a GPU.
struct opaque_backend : zero::cpu_backend {
  using allocator_type = opaque_allocator;
  opaque_backend() : zero::cpu_backend({.threads = 1}) {}
  [[nodiscard]] allocator_type get_allocator() const { return {}; }
};
static_assert(zero::backend<opaque_backend> && zero::can_copy<opaque_backend>);
static_assert(!zero::host_allocator_policy<opaque_allocator>);

std::string file_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// Trains `s` for `k` steps on `SaveBackend`, saves, loads on `LoadBackend` and trains to the end.
template <class SaveBackend, class LoadBackend>
zt::run_result train_across(const zt::run_spec& s, std::int64_t k, const std::filesystem::path& dir,
                            const zt::ckpt_spec& c) {
  zt::run_result first;
  first.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  zt::with_engine<SaveBackend>(s, c, [&](auto& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_all(eng);
    zt::train_steps(eng, mh, comm, s, 0, k, first);
    eng.save(dir, "step-" + std::to_string(k));
  });
  zt::run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  zt::with_engine<LoadBackend>(s, c, [&](auto& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_all(eng, -3.0f);
    eng.load(dir);
    zt::train_steps(eng, mh, comm, s, k, s.steps, out);
    zt::collect_params(eng, mh, comm, out);
  });
  return out;
}

} // namespace

TEST_CASE("device-memory engines save, load and export through the backend's copy, bit for bit") {
  const zt::ckpt_spec c{.scheduler = true, .frozen = true};
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    const zt::run_spec s{.stage = stage, .world = 2, .steps = 4, .batch = 64};
    const auto plain = zt::train_plain(s, c);
    const auto dir = zt::scratch("device-" + std::to_string(stage));
    // device -> host, host -> device, device -> device: every combination resumes exactly.
    CHECK(train_across<opaque_backend, zero::cpu_backend>(s, 2, dir / "a", c).params == plain.params);
    CHECK(train_across<zero::cpu_backend, opaque_backend>(s, 2, dir / "b", c).params == plain.params);
    CHECK(train_across<opaque_backend, opaque_backend>(s, 2, dir / "c", c).params == plain.params);
    // The same file from either engine.
    for (const bool device : {false, true}) {
      auto body = [&](auto& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
        zt::init_all(eng);
        zt::train_range(eng, mh, comm, s, 0, 2);
        eng.export_safetensors(dir / (device ? "device.safetensors" : "host.safetensors"), zero::dtype::bf16);
      };
      if (device) {
        zt::with_engine<opaque_backend>(s, c, body);
      } else {
        zt::with_engine(s, c, body);
      }
    }
    const auto host_file = file_bytes(dir / "host.safetensors");
    CHECK(!host_file.empty());
    CHECK(file_bytes(dir / "device.safetensors") == host_file);
  }
}
