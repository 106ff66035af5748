#pragma once
// Checkpoint tests' harness: the engine tests' small model and training loop (engine_harness.hpp),
// run in pieces with a save and a load between them, plus scratch directories and snapshots of a
// saved checkpoint read back offline.

#include "../engine/engine_harness.hpp"
#include "zero/checkpoint/checkpoint.hpp"
#include "zero/io/safetensors_reader.hpp"

#include <cstring>
#include <doctest/doctest.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <unistd.h>
#include <vector>

namespace zero::testing {

namespace fs = std::filesystem;
using test_engine = engine<cpu_backend, thread_communicator>;

/// This process's folder of scratch directories, removed when the process exits normally.
inline const fs::path& scratch_root() {
  struct root {
    fs::path path = fs::temp_directory_path() / ("zero-ckpt-tests-" + std::to_string(::getpid()));
    ~root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const root r;
  return r.path;
}

/// An empty directory for one test, under the system's temporary directory.
inline fs::path scratch(const std::string& name) {
  const fs::path p = scratch_root() / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

/// Every tensor of a safetensors file as fp32.
inline std::map<std::string, std::vector<float>> read_safetensors(const fs::path& f) {
  safetensors::reader r(f);
  std::map<std::string, std::vector<float>> out;
  for (const auto& t : r.tensors()) {
    const std::size_t es = size_of(t.type);
    std::vector<std::byte> raw(t.end - t.begin);
    r.read(t, 0, raw);
    auto& v = out[t.name];
    visit_float(t.type, [&]<class T>(type_tag<T>) {
      for (std::size_t i = 0; i < raw.size() / es; ++i) {
        T x;
        std::memcpy(&x, raw.data() + i * es, es);
        v.push_back(to_float(x));
      }
    });
  }
  return out;
}

/// Options of the checkpoint tests' runs beside `run_spec`.
struct ckpt_spec {
  /// A WarmupLR schedule, so that the scheduler's state matters.
  bool scheduler = false;
  /// A frozen parameter "frozen.table" {7, 3} after the model.
  bool frozen = false;
};

inline config make_config(const run_spec& s, const ckpt_spec& c) {
  auto j = nlohmann::json::parse(config_json(s));
  if (c.scheduler) {
    j["scheduler"] = {{"type", "WarmupLR"},
                      {"params", {{"warmup_min_lr", 0.0}, {"warmup_max_lr", s.lr}, {"warmup_num_steps", 4}}}};
  }
  return config::from_json(j, inputs_of(s));
}

/// Runs `body(eng, handles, comm)` on `s.world` ranks with a finalized engine of the small model.
/// `Backend` is default-constructible (cpu_backend with one thread by default).
template <class Backend = cpu_backend, class Body>
void with_engine(const run_spec& s, const ckpt_spec& c, Body&& body) {
  run_ranks(s.world, [&](thread_communicator& comm) {
    const auto cfg = make_config(s, c);
    Backend backend = [] {
      if constexpr (std::is_same_v<Backend, cpu_backend>) {
        return cpu_backend({.threads = 1});
      } else {
        return Backend{};
      }
    }();
    engine<Backend, thread_communicator> eng(cfg, comm, backend);
    auto mh = register_model(eng);
    if (c.frozen) {
      static_cast<void>(eng.add_param(mh.modules[0], "frozen.table", {7, 3}, {.trainable = false}));
    }
    install_rule(s, eng);
    eng.finalize();
    body(eng, mh, comm);
  });
}

/// `init_value` for the model, and another pattern for the frozen parameter (scale: 1 or a
/// different model, to show that a load overwrites everything).
template <class Engine> void init_all(Engine& eng, float scale = 1.0f) {
  eng.init_params([&](const param_info& p, std::size_t first, std::span<float> dst) {
    const auto k = eng.layout().find(p.name);
    for (std::size_t j = 0; j < dst.size(); ++j) {
      dst[j] = scale * (k ? init_value(*k, first + j) : static_cast<float>((first + j) % 5) - 2.0f);
    }
  });
}

/// Trains steps [from, to) of `s`, keeping no record.
template <class Engine>
void train_range(Engine& eng, const model_handles& mh, thread_communicator& comm, const run_spec& s, std::int64_t from,
                 std::int64_t to) {
  run_result r;
  r.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  train_steps(eng, mh, comm, s, from, to, r);
}

/// Initialises the model and trains steps [0, k) of `s`.
inline void init_and_train(test_engine& eng, const model_handles& mh, thread_communicator& comm, const run_spec& s,
                           std::int64_t k) {
  init_all(eng);
  train_range(eng, mh, comm, s, 0, k);
}

/// Trains `s` uninterrupted.
inline run_result train_plain(const run_spec& s, const ckpt_spec& c = {}) {
  run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  with_engine(s, c, [&](test_engine& eng, const model_handles& mh, thread_communicator& comm) {
    init_all(eng);
    train_steps(eng, mh, comm, s, 0, s.steps, out);
    collect_params(eng, mh, comm, out);
  });
  return out;
}

/// Trains `a` for `k` steps and saves into `dir` as "step-k"; then a fresh engine of `b` (another
/// world size or stage, initialised differently) loads "latest" and trains steps [k, b.steps).
inline run_result train_with_break(const run_spec& a, std::int64_t k, const run_spec& b, const fs::path& dir,
                                   const ckpt_spec& c = {}) {
  run_result first;
  first.applied_by_rank.resize(static_cast<std::size_t>(a.world));
  std::int64_t saved_steps = -1;
  with_engine(a, c, [&](test_engine& eng, const model_handles& mh, thread_communicator& comm) {
    init_all(eng);
    train_steps(eng, mh, comm, a, 0, k, first);
    eng.save(dir, "step-" + std::to_string(k));
    if (comm.rank() == 0) { // one rank writes it: the ranks are threads
      saved_steps = eng.global_steps();
    }
  });
  run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(b.world));
  with_engine(b, c, [&](test_engine& eng, const model_handles& mh, thread_communicator& comm) {
    init_all(eng, -3.0f);
    eng.load(dir);
    CHECK(eng.global_steps() == saved_steps);
    train_steps(eng, mh, comm, b, k, b.steps, out);
    collect_params(eng, mh, comm, out);
  });
  return out;
}

/// What a checkpoint holds, read offline: master, m and v of every parameter, and the counters.
struct snapshot {
  std::map<std::string, std::vector<float>> tensors;
  std::int64_t global_steps = 0;
  std::int64_t scheduler_iteration = 0;
  double scale = 0;
  friend bool operator==(const snapshot&, const snapshot&) = default;
};

inline snapshot read_snapshot(const fs::path& dir, const std::string& tag = "latest") {
  checkpoint::reader r(dir, tag);
  r.verify();
  snapshot s;
  s.global_steps = r.info().global_steps;
  s.scheduler_iteration = r.info().lr_last_batch_iteration;
  s.scale = r.info().scaler.cur_scale;
  for (std::size_t i = 0; i < r.info().params.size(); ++i) {
    const auto& p = r.info().params[i];
    for (auto kind :
         {checkpoint::tensor_kind::master, checkpoint::tensor_kind::exp_avg, checkpoint::tensor_kind::exp_avg_sq}) {
      // A frozen parameter has its values only; the rule's state tensors are those the manifest names.
      if (kind != checkpoint::tensor_kind::master &&
          (!p.trainable || static_cast<std::size_t>(kind) > r.info().optimizer.state.size())) {
        continue;
      }
      std::vector<float> v(p.numel);
      r.read(i, kind, 0, v);
      s.tensors[p.name + "/" + std::to_string(static_cast<int>(kind))] = std::move(v);
    }
  }
  return s;
}

/// The bytes of file `f`.
inline std::string read_text(const fs::path& f) {
  std::ifstream in(f, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

/// Replaces the manifest of the checkpoint in `tag_dir` with `text` and records its xxh64 in the
/// marker beside it, as a save does, so that an edit reaches the checks behind the checksum.
inline void write_manifest(const fs::path& tag_dir, const std::string& text) {
  std::ofstream(tag_dir / std::string(checkpoint::manifest_name), std::ios::binary | std::ios::trunc) << text;
  std::ofstream(tag_dir / std::string(checkpoint::checksum_name), std::ios::binary | std::ios::trunc)
      << checkpoint::hex64(checkpoint::detail::xxh64_of(text)) << "\n";
}

/// The message of the exception `f` throws, or "" when it throws none.
template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

} // namespace zero::testing
