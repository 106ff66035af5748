// zero-parallel-3d: ZeRO inside 3D parallelism and mixture of experts. A small model (a tensor-parallel
// MLP, two MoE layers of 4 experts, model.hpp) trained on 8 ranks at every factorization of them into
// (pipe, tensor, expert, data) and every ZeRO stage; each rank's final slices and every step's
// gradient norm must equal those of one engine on one rank holding the whole model, bit for bit
// (docs/parallelism.md, "Example: every factorization of 8 ranks"), and each engine's model state must
// be at the ZeRO formula.
//
//   zero-parallel-3d                                   8 in-process ranks, every factorization and stage
//   zero-parallel-3d --stages 0,3 --factorization 2,2,2,2 --steps 2
//   mpirun -np 8 zero-parallel-3d                      one process per rank (mpi_communicator)
//
// Exit status: 0 when every run equals the reference, 1 when one differs (each difference is printed
// to stderr, naming the factorization, stage, rank, parameter and element), 2 for bad arguments.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>
#include <zero/comm/thread_communicator.hpp>
#if ZERO_HAS_MPI
#include <zero/comm/mpi_communicator.hpp>
#endif

#include "model.hpp"
#include "parallel_rank.hpp"
#include "reference.hpp"

#if ZERO_HAS_MPI
// The MPI engines compile in train_mpi.cpp.
extern template p3d::reference p3d::train_reference<zero::mpi_communicator>(zero::mpi_communicator&, int, int);
extern template p3d::rank_outcome p3d::train_parallel<zero::mpi_communicator>(zero::mpi_communicator&,
                                                                              const p3d::factorization&, int, int,
                                                                              const p3d::reference&);
#endif

namespace {

using p3d::factorization;

struct options {
  int ranks = 8;
  std::string stages = "all";
  std::string factorization;
  int steps = 3;
};

/// "all" or a comma-separated list of 0..3.
std::vector<int> parse_stages(const std::string& text) {
  if (text == "all") {
    return {0, 1, 2, 3};
  }
  std::vector<int> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.size() != 1 || item[0] < '0' || item[0] > '3') {
      throw CLI::ValidationError("--stages",
                                 "expected \"all\" or a comma-separated list of 0..3, got \"" + text + "\"");
    }
    out.push_back(item[0] - '0');
  }
  if (out.empty()) {
    throw CLI::ValidationError("--stages", "expected \"all\" or a comma-separated list of 0..3, got nothing");
  }
  return out;
}

std::string list(const std::vector<factorization>& all) {
  std::string s;
  for (const auto& f : all) {
    s += (s.empty() ? "(" : " (") + std::to_string(f.pipe) + "," + std::to_string(f.tensor) + "," +
         std::to_string(f.expert) + "," + std::to_string(f.data) + ")";
  }
  return s;
}

/// The factorizations of `ranks` to run: all of them, or the one --factorization names.
/// \throws CLI::ValidationError for one that is not among them.
std::vector<factorization> pick(int ranks, const std::string& wanted) {
  const auto all = p3d::factorizations(ranks);
  if (wanted.empty()) {
    return all;
  }
  std::vector<int> v;
  std::stringstream ss(wanted);
  std::string item;
  while (std::getline(ss, item, ',')) {
    v.push_back(std::atoi(item.c_str()));
  }
  for (const auto& f : all) {
    if (v == std::vector<int>{f.pipe, f.tensor, f.expert, f.data}) {
      return {f};
    }
  }
  throw CLI::ValidationError("--factorization", "\"" + wanted + "\" is not a factorization of " +
                                                    std::to_string(ranks) + " ranks this model allows; they are " +
                                                    list(all));
}

void print_runs(const std::vector<factorization>& runs, int ranks) {
  std::printf("%zu factorization%s of %d ranks (pipe,tensor,expert,data): %s\n", runs.size(),
              runs.size() == 1 ? "" : "s", ranks, list(runs).c_str());
  std::fflush(stdout);
}

void print_reference(int stage, const p3d::reference& ref) {
  std::printf("stage %d reference (one engine, one rank, the whole model): loss", stage);
  for (const double l : ref.losses) {
    std::printf(" %.4f", l);
  }
  std::printf(", gradient norm");
  for (const double n : ref.norms) {
    std::printf(" %.6f", n);
  }
  std::printf("\n");
  std::fflush(stdout);
}

/// One line per run (from rank 0's outcome; `problems` is the job's).
void print_run(const factorization& f, int stage, const p3d::rank_outcome& o) {
  const auto mem = [](const zero::memory_report& m) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%zu B over %d rank%s (%.3f x formula)", m.model_state_peak, m.world_size,
                  m.world_size == 1 ? "" : "s", p3d::padded_ratio(m));
    return std::string(buf);
  };
  std::string result = "bit-identical";
  if (o.problems > 0) {
    result = "DIFFERS (" + std::to_string(o.problems) + " problems)";
  }
  std::printf("stage %d  %-40s %s; rank 0's model state: dense %s, experts %s\n", stage, f.name().c_str(),
              result.c_str(), mem(o.dense).c_str(), mem(o.moe).c_str());
  std::fflush(stdout);
}

/// How the runs went: those that differed from the reference, of all.
struct tally {
  int failed = 0;
  std::size_t runs = 0;
};

/// Runs every (factorization, stage): `reference_of(stage)` trains the reference, and `job(f, stage,
/// ref)` one run, returning this rank's outcome (rank 0's where `printing`).
template <class Reference, class Job>
tally run_all(const std::vector<factorization>& runs, const std::vector<int>& stages, bool printing,
              Reference&& reference_of, Job&& job) {
  tally t;
  for (const int stage : stages) {
    const p3d::reference ref = reference_of(stage);
    if (printing) {
      print_reference(stage, ref);
    }
    for (const auto& f : runs) {
      const p3d::rank_outcome o = job(f, stage, ref);
      if (printing) {
        print_run(f, stage, o);
      }
      t.failed += o.problems == 0 ? 0 : 1;
      ++t.runs;
    }
  }
  return t;
}

/// The last line; \returns the exit status.
int report(const tally& t) {
  if (t.failed > 0) {
    std::printf("%d of %zu runs differ from the reference (see MISMATCH above)\n", t.failed, t.runs);
    return 1;
  }
  std::printf("all %zu runs bit-identical to the reference (weights, step norms) with model state at the ZeRO "
              "formula\n",
              t.runs);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero-parallel-3d: ZeRO in every (pipe, tensor, expert, data) factorization of 8 ranks, each "
               "checked bit for bit against one engine holding the whole model"};
  options opt;
  app.add_option("--ranks", opt.ranks, "in-process ranks (ignored under mpirun)")->check(CLI::Range(1, 16));
  app.add_option("--stages", opt.stages, "ZeRO stages: \"all\" or e.g. 0,2");
  app.add_option("--factorization", opt.factorization, "one factorization P,T,E,D (default: all of them)");
  app.add_option("--steps", opt.steps, "optimizer steps per run")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
#if !ZERO_HAS_MPI
  if (under_mpi) {
    std::fprintf(stderr, "zero-parallel-3d: started under mpirun but built without MPI; running in-process\n");
    under_mpi = false;
  }
#endif
  const char* launcher_size = std::getenv("OMPI_COMM_WORLD_SIZE");
  launcher_size = launcher_size != nullptr ? launcher_size : std::getenv("PMI_SIZE");
  const int ranks = under_mpi ? std::atoi(launcher_size) : opt.ranks;
  std::vector<int> stages;
  std::vector<factorization> runs;
  try {
    stages = parse_stages(opt.stages);
    runs = pick(ranks, opt.factorization);
    if (runs.empty()) {
      throw CLI::ValidationError("--ranks", std::to_string(ranks) + " ranks have no factorization this model allows");
    }
  } catch (const CLI::Error& e) {
    std::fprintf(stderr, "zero-parallel-3d: %s\n", e.what());
    return 2;
  }

  try {
#if ZERO_HAS_MPI
    if (under_mpi) {
      MPI_Init(&argc, &argv);
      tally t;
      int rank = 0;
      try {
        zero::mpi_communicator world(MPI_COMM_WORLD);
        zero::mpi_communicator self(MPI_COMM_SELF, "self"); // the reference's, on every rank
        rank = world.rank();
        if (rank == 0) {
          print_runs(runs, ranks);
        }
        t = run_all(
            runs, stages, rank == 0, [&](int stage) { return p3d::train_reference(self, stage, opt.steps); },
            [&](const factorization& f, int stage, const p3d::reference& ref) {
              return p3d::train_parallel(world, f, stage, opt.steps, ref);
            });
      } catch (const std::exception& e) {
        // The other ranks would wait for this one until their timeout.
        std::fprintf(stderr, "zero-parallel-3d: rank %d: %s\n", rank, e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      const int status = rank == 0 ? report(t) : (t.failed == 0 ? 0 : 1);
      MPI_Finalize();
      return status;
    }
#endif
    print_runs(runs, ranks);
    const tally t = run_all(
        runs, stages, true,
        [&](int stage) {
          p3d::reference ref;
          zero::run_ranks(1,
                          [&](zero::thread_communicator& self) { ref = p3d::train_reference(self, stage, opt.steps); });
          return ref;
        },
        [&](const factorization& f, int stage, const p3d::reference& ref) {
          p3d::rank_outcome first;
          zero::run_ranks(ranks, [&](zero::thread_communicator& world) {
            auto o = p3d::train_parallel(world, f, stage, opt.steps, ref);
            if (world.rank() == 0) {
              first = o;
            }
          });
          return first;
        });
    return report(t);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-parallel-3d: %s\n", e.what());
    return 1;
  }
}
