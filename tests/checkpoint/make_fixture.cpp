// Writes checkpoints for zero-ckpt's command-line tests: DIR/good (the small model with a frozen
// parameter, 2 ranks, stage 2, saved as "step-2"), and copies of it with rank 1's shard bit-flipped
// (DIR/flipped) and truncated (DIR/truncated).
//
//   zero_ckpt_fixture DIR

// The harness uses doctest assertions; this program has no test runner.
#define DOCTEST_CONFIG_DISABLE
#include "ckpt_harness.hpp"

#include <cstdio>
#include <fstream>

int main(int argc, char** argv) {
  namespace zt = zero::testing;
  namespace fs = std::filesystem;
  if (argc != 2) {
    std::fprintf(stderr, "usage: zero_ckpt_fixture DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  fs::remove_all(dir);
  const zt::run_spec s{.stage = 2, .world = 2, .steps = 2, .batch = 64};
  zt::with_engine(s, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    zt::init_and_train(eng, mh, comm, s, 2);
                    eng.save(dir / "good", "step-2");
                  });
  for (const char* name : {"flipped", "truncated"}) {
    fs::copy(dir / "good", dir / name, fs::copy_options::recursive);
  }
  const auto flipped = dir / "flipped" / "step-2" / "rank-00001.bin";
  {
    std::fstream io(flipped, std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(100);
    char c = 0;
    io.read(&c, 1);
    io.seekp(100);
    io.put(static_cast<char>(c ^ 1));
  }
  const auto truncated = dir / "truncated" / "step-2" / "rank-00001.bin";
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  std::printf("wrote %s/{good,flipped,truncated}\n", dir.c_str());
  return 0;
}
