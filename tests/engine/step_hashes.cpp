// The engine's bits, pinned: a sweep of engine configurations (stage, dtype, world size, where the optimizer
// state and stage 3's parameters live, accumulation, clipping, an fp16 overflow, the host's overlaps, HSDP and
// ZeRO++) trains the small model of engine_harness.hpp for 6 steps on the cpu_backend and thread_communicator,
// and each configuration prints one line `<name> <hash>`: FNV-1a 64 over every step's gradient norm, loss scale
// and applied flag, every rank's whole parameters at the end, and the whole model's optimizer state (master, m,
// v) assembled from the ranks' owned pieces, so the hash does not depend on which rank owns what. A config the
// engine refuses (config_error) prints `<name> refused`.
// tests/engine/step_hashes.txt is the table at a known-good commit; ctest's engine.step_hashes runs `--check`
// against it, so a change that moves one bit of one configuration names that configuration. One golden file
// serves every build: the bits were the same with GCC 12 (-O1, -O3, -O3 -march=native, which contracts into FMAs)
// and Clang 14 (-O0 with ASan, -O1), and at every SIMD level (--simd).
//
//   zero_step_hashes                      the table, on stdout
//   zero_step_hashes --check FILE         compares with FILE; exits 1 naming each configuration that differs
//   zero_step_hashes --write FILE         writes the table to FILE (regenerating the golden, deliberately)
//   --scratch DIR                         the folder of the NVMe files (default: a fresh one under /tmp)
//   --simd scalar|avx2|avx512             the cpu_backend's SIMD level (default: the widest available); the
//                                         bits are the same at every level (cpu_backend.hpp, "Numerics")

#include "engine_harness.hpp"

#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace fs = std::filesystem;
using zero::dtype;
using zero::testing::run_result;
using zero::testing::run_spec;

namespace {

/// One configuration of the sweep: its name in the table and what it trains.
struct sweep_case {
  std::string name;
  run_spec spec;
};

/// FNV-1a 64 over the bytes of what it is fed.
struct fnv1a {
  std::uint64_t h = 0xCBF29CE484222325ULL;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h = (h ^ b[i]) * 0x100000001B3ULL;
    }
  }
  template <class T> void values(const std::vector<T>& v) { bytes(v.data(), v.size() * sizeof(T)); }
};

/// What one rank holds once training ends: its whole parameters (in their dtype) and its optimizer state.
struct rank_record {
  std::vector<std::byte> params;
  std::vector<zero::owned_piece> pieces;
  std::vector<float> master, m, v;
};

/// Trains `s` on `s.world` ranks and hashes what it produced. \throws config_error when the engine refuses
/// the config.
std::uint64_t run_case(const run_spec& s, zero::simd_level simd) {
  run_result out;
  out.applied_by_rank.resize(static_cast<std::size_t>(s.world));
  std::vector<rank_record> held(static_cast<std::size_t>(s.world));
  std::vector<std::size_t> numel;
  zero::testing::with_engine_group<zero::cpu_backend>(
      s, [](int world, auto&& fn) { zero::run_ranks(world, fn); },
      [&](zero::thread_communicator&) { return zero::cpu_backend({.threads = 1, .simd = simd}); },
      [&](auto& eng, const zero::testing::model_handles& mh, zero::thread_communicator& comm) {
        zero::testing::init_model(eng);
        zero::testing::train_steps(eng, mh, comm, s, 0, s.steps, out);
        auto& mine = held[static_cast<std::size_t>(comm.rank())];
        {
          auto all = eng.gather_all();
          for (const auto& h : mh.params) {
            const auto v = eng.param(h);
            const auto* p = static_cast<const std::byte*>(v.data);
            mine.params.insert(mine.params.end(), p, p + v.bytes());
            if (comm.rank() == 0) {
              numel.push_back(v.numel);
            }
          }
        }
        // The state as a checkpoint reads it: the whole of the rank's state, then its owned pieces.
        auto& opt = eng.optimizer();
        for (auto* t : {&mine.master, &mine.m, &mine.v}) {
          t->resize(opt.state_size());
        }
        opt.read_state(zero::state_tensor::master, 0, mine.master);
        opt.read_state(zero::state_tensor::exp_avg, 0, mine.m);
        opt.read_state(zero::state_tensor::exp_avg_sq, 0, mine.v);
        mine.pieces = eng.owned_by(eng.communicator().rank()); // HSDP: the rank in its shard group
      });

  fnv1a hash;
  hash.values(out.norms);
  hash.values(out.scales);
  for (const auto& applied : out.applied_by_rank) {
    for (const bool a : applied) {
      hash.bytes(&a, 1);
    }
  }
  for (const auto& r : held) {
    hash.values(r.params);
  }
  // The whole model's state, parameter by parameter: the same hash whichever rank owns a piece. Where ranks
  // hold the same piece (stage 0, HSDP's replicas) they must agree bit for bit.
  for (auto member : {&rank_record::master, &rank_record::m, &rank_record::v}) {
    std::vector<std::vector<std::uint32_t>> whole(numel.size());
    std::vector<std::vector<bool>> seen(numel.size());
    for (std::size_t k = 0; k < numel.size(); ++k) {
      whole[k].assign(numel[k], 0);
      seen[k].assign(numel[k], false);
    }
    for (std::size_t r = 0; r < held.size(); ++r) {
      const auto& state = held[r].*member;
      for (const auto& pc : held[r].pieces) {
        for (std::size_t i = 0; i < pc.count; ++i) {
          std::uint32_t bits = 0;
          std::memcpy(&bits, &state[pc.state + i], sizeof bits);
          const std::size_t at = pc.param_offset + i;
          if (seen[pc.id][at] && whole[pc.id][at] != bits) {
            throw std::runtime_error("rank " + std::to_string(r) +
                                     " holds other optimizer state than a rank before it, "
                                     "at element " +
                                     std::to_string(at) + " of parameter " + std::to_string(pc.id));
          }
          whole[pc.id][at] = bits;
          seen[pc.id][at] = true;
        }
      }
    }
    for (const auto& w : whole) {
      hash.values(w);
    }
  }
  return hash.h;
}

constexpr const char* small_aio = R"("aio": {"block_size": 256, "queue_depth": 1, "thread_count": 2})";

/// The sweep, its NVMe files under `scratch`.
std::vector<sweep_case> sweep(const fs::path& scratch) {
  const std::string nvme_path = R"("nvme_path": ")" + scratch.string() + R"(")";
  struct placement {
    const char* name;
    std::string keys;
  };
  const std::vector<placement> optimizer_places = {
      {"device", ""},
      {"cpu", R"("offload_optimizer": {"device": "cpu"})"},
      {"cpu_half", R"("offload_optimizer": {"device": "cpu", "ratio": 0.5})"},
      {"nvme", R"("offload_optimizer": {"device": "nvme", )" + nvme_path + R"(, "buffer_count": 2})"},
  };
  std::vector<sweep_case> out;
  // `keys` go into zero_optimization, `top` (a scheduler) beside it.
  const auto add = [&](const std::string& suffix, run_spec s, const std::string& keys, const std::string& top = "") {
    s.steps = 6;
    s.zero_extra = keys;
    s.top_extra = top;
    if (keys.find("nvme") != std::string::npos) {
      // 64-element chunks: the read-ahead and write-behind ring turns over.
      s.top_extra += (top.empty() ? "" : ", ") + std::string(small_aio);
    }
    out.push_back({"s" + std::to_string(s.stage) + "." + std::string(zero::name_of(s.type)) + ".w" +
                       std::to_string(s.world) + "." + suffix,
                   s});
  };
  const auto stages = {0, 1, 2, 3};
  const auto types = {dtype::f32, dtype::bf16, dtype::f16};
  const auto worlds = {1, 2, 3};
  // Every stage, dtype, world size and optimizer placement: plain, then with accumulation and a clip that
  // acts; fp16 with an overflow at step 2 (its step skipped on every rank, the loss scale halved).
  for (int stage : stages) {
    for (dtype type : types) {
      for (int world : worlds) {
        for (const auto& p : optimizer_places) {
          add(p.name, {.stage = stage, .world = world, .type = type}, p.keys);
          add(std::string(p.name) + ".accum2.clip1",
              {.stage = stage, .world = world, .type = type, .accumulation = 2, .clip = 1.0}, p.keys);
          if (type == dtype::f16) {
            add(std::string(p.name) + ".overflow2", {.stage = stage, .world = world, .type = type, .overflow_step = 2},
                p.keys);
          }
        }
      }
    }
  }
  // The host's overlaps: the step beside the next forward (whole state or half), updates during backward.
  const std::vector<placement> overlaps = {
      {"forward_overlap", R"("offload_optimizer": {"device": "cpu", "forward_overlap": true})"},
      {"forward_overlap_half", R"("offload_optimizer": {"device": "cpu", "ratio": 0.5, "forward_overlap": true})"},
      {"backward_overlap", R"("offload_optimizer": {"device": "cpu", "backward_overlap": 1})"},
      {"backward_overlap_half", R"("offload_optimizer": {"device": "cpu", "backward_overlap": 0.5})"},
      {"both_overlaps", R"("offload_optimizer": {"device": "cpu", "forward_overlap": true, "backward_overlap": 1})"},
  };
  for (int stage : stages) {
    for (dtype type : types) {
      for (const auto& p : overlaps) {
        add(std::string(p.name) + ".clip1", {.stage = stage, .world = 2, .type = type, .clip = 1.0}, p.keys);
      }
      add("both_overlaps.accum2", {.stage = stage, .world = 3, .type = type, .accumulation = 2}, overlaps.back().keys);
    }
    add("both_overlaps.overflow2", {.stage = stage, .world = 2, .type = dtype::f16, .overflow_step = 2},
        overlaps.back().keys);
  }
  // A learning rate that changes every step: the host's step beside the next forward must keep its step's rate.
  const std::vector<placement> schedules = {
      {"cosine_lr",
       R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 6, "warmup_num_steps": 3}})"},
      {"decay_lr",
       R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 6, "warmup_num_steps": 2}})"},
  };
  for (int stage : stages) {
    for (const auto& sc : schedules) {
      for (const auto& p : optimizer_places) {
        add(std::string(p.name) + "." + sc.name, {.stage = stage, .world = 2, .type = dtype::bf16}, p.keys, sc.keys);
      }
      add(std::string("both_overlaps.") + sc.name, {.stage = stage, .world = 2, .type = dtype::bf16},
          overlaps.back().keys, sc.keys);
      add(std::string("forward_overlap_half.") + sc.name, {.stage = stage, .world = 2, .type = dtype::bf16},
          overlaps[1].keys, sc.keys);
    }
  }
  // Stage 3's parameter shard in host memory or in a file, with the optimizer state on the device, the host
  // or NVMe.
  const std::vector<placement> param_places = {
      {"param_cpu", R"("offload_param": {"device": "cpu"})"},
      {"param_nvme",
       R"("offload_param": {"device": "nvme", )" + nvme_path + R"(, "buffer_count": 2, "max_in_cpu": 0})"},
  };
  for (dtype type : types) {
    for (int world : worlds) {
      for (const auto& pp : param_places) {
        for (const auto& p : optimizer_places) {
          const std::string keys = p.keys.empty() ? pp.keys : pp.keys + ", " + p.keys;
          const std::string name = std::string(pp.name) + "." + p.name;
          add(name, {.stage = 3, .world = world, .type = type}, keys);
          add(name + ".accum2.clip1", {.stage = 3, .world = world, .type = type, .accumulation = 2, .clip = 1.0}, keys);
        }
      }
    }
  }
  // Four ranks in groups of two: HSDP's shard groups, and ZeRO++'s node groups (qgZ's two-level gradient
  // reduction, hpZ's secondary partition) and quantized gathers (qwZ).
  const std::vector<placement> groups = {
      {"hsdp2", R"("mics_shard_size": 2)"},
      {"qgz_node2", R"("zero_quantized_gradients": true, "zero_quantized_gradients_node_size": 2)"},
      {"qgz8", R"("zero_quantized_gradients": true, "zero_quantized_gradients_bits": 8)"},
      {"hpz2", R"("zero_hpz_partition_size": 2)"},
      {"qwz", R"("zero_quantized_weights": true)"},
  };
  for (int stage : {1, 2, 3}) {
    for (dtype type : types) {
      for (const auto& p : groups) {
        add(std::string(p.name) + ".clip1", {.stage = stage, .world = 4, .type = type, .clip = 1.0}, p.keys);
      }
    }
  }
  return out;
}

/// The table: one line a configuration.
std::vector<std::pair<std::string, std::string>> run_sweep(const fs::path& scratch, zero::simd_level simd) {
  std::vector<std::pair<std::string, std::string>> table;
  for (const auto& c : sweep(scratch)) {
    std::string result;
    try {
      std::ostringstream hex;
      hex << std::hex;
      hex.width(16);
      hex.fill('0');
      hex << run_case(c.spec, simd);
      result = hex.str();
    } catch (const zero::config_error&) {
      result = "refused";
    } catch (const std::exception& e) {
      throw std::runtime_error(c.name + ": " + e.what());
    }
    table.emplace_back(c.name, result);
  }
  return table;
}

/// Reads a table written by `--write`: `<name> <hash>` lines; `#` starts a comment line.
std::vector<std::pair<std::string, std::string>> read_table(const fs::path& file) {
  std::ifstream in(file);
  if (!in) {
    throw std::runtime_error("cannot read " + file.string());
  }
  std::vector<std::pair<std::string, std::string>> table;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') {
      continue;
    }
    std::istringstream words(line);
    std::string name, hash;
    words >> name >> hash;
    table.emplace_back(name, hash);
  }
  return table;
}

/// Compares `now` with the golden `file`, printing each configuration whose line changed, appeared or went, and
/// how to regenerate the file (`self`: this program's path).
/// \returns true when they are the same.
bool check(const std::vector<std::pair<std::string, std::string>>& now, const fs::path& file, const std::string& self) {
  const auto golden = read_table(file);
  const std::map<std::string, std::string> want(golden.begin(), golden.end());
  const std::map<std::string, std::string> got(now.begin(), now.end());
  int problems = 0;
  for (const auto& [name, hash] : now) {
    const auto w = want.find(name);
    if (w == want.end()) {
      std::cout << name << ": not in the golden file (now " << hash << ")\n";
      ++problems;
    } else if (w->second != hash) {
      std::cout << name << ": changed, golden " << w->second << ", now " << hash << "\n";
      ++problems;
    }
  }
  for (const auto& [name, hash] : golden) {
    if (!got.contains(name)) {
      std::cout << name << ": in the golden file (" << hash << ") but no longer run\n";
      ++problems;
    }
  }
  if (problems == 0) {
    std::cout << now.size() << " configurations, every line as in " << file.string() << "\n";
    return true;
  }
  std::cout << problems << " of " << now.size() << " configurations differ from " << file.string()
            << ".\nThe engine's bits moved. If that is deliberate (a change of numerics, a new configuration), "
               "regenerate the golden file and commit it with the change that moved the bits:\n  "
            << self << " --write " << file.string() << "\n";
  return false;
}

zero::simd_level simd_from(const std::string& name) {
  for (auto s : {zero::simd_level::scalar, zero::simd_level::avx2, zero::simd_level::avx512}) {
    if (name == zero::name_of(s)) {
      return s;
    }
  }
  throw std::runtime_error("--simd " + name + ": expected scalar, avx2 or avx512");
}

} // namespace

int main(int argc, char** argv) {
  try {
    std::string check_file, write_file;
    fs::path scratch = fs::temp_directory_path() / ("zero-step-hashes-" + std::to_string(::getpid()));
    auto simd = zero::simd_level::automatic;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (i + 1 == argc) {
        throw std::runtime_error("unknown option or missing value: " + arg);
      }
      const std::string value = argv[++i];
      if (arg == "--check") {
        check_file = value;
      } else if (arg == "--write") {
        write_file = value;
      } else if (arg == "--scratch") {
        scratch = value;
      } else if (arg == "--simd") {
        simd = simd_from(value);
      } else {
        throw std::runtime_error("unknown option " + arg + " (expected --check, --write, --scratch or --simd)");
      }
    }
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    const auto table = run_sweep(scratch, simd);
    fs::remove_all(scratch);
    std::ostringstream text;
    for (const auto& [name, hash] : table) {
      text << name << " " << hash << "\n";
    }
    if (!write_file.empty()) {
      std::ofstream out(write_file);
      out << "# The engine's bits (tests/engine/step_hashes.cpp), one line a configuration, checked by ctest's\n"
             "# engine.step_hashes. Regenerate only when a change moves them on purpose, from the source root:\n"
             "#   build/release/tests/engine/zero_step_hashes --write tests/engine/step_hashes.txt\n"
          << text.str();
      if (!out.flush()) {
        throw std::runtime_error("cannot write " + write_file);
      }
    }
    if (!check_file.empty()) {
      return check(table, check_file, argv[0]) ? 0 : 1;
    }
    if (write_file.empty()) {
      std::cout << text.str();
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "zero_step_hashes: " << e.what() << "\n";
    return 2;
  }
}
