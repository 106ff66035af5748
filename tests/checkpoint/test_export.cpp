// Consolidated safetensors: exported from a running engine (streamed through rank 0) and offline
// from a checkpoint directory, equal to the saved fp32 masters; imported back through init_params.

#include "ckpt_harness.hpp"
#include "zero/checkpoint/safetensors.hpp"

#include <doctest/doctest.h>
#include <sys/stat.h>

namespace zt = zero::testing;
namespace fs = std::filesystem;
using zero::dtype;

TEST_CASE("export_safetensors streams the fp32 masters under the registered names, at every stage") {
  for (int stage : {0, 1, 3}) {
    CAPTURE(stage);
    const auto dir = zt::scratch("export-" + std::to_string(stage));
    zt::run_spec s{.stage = stage, .world = 4, .type = dtype::bf16, .steps = 2, .batch = 64};
    zt::with_engine(s, {.frozen = true},
                    [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                      zt::init_and_train(eng, mh, comm, s, 2);
                      eng.save(dir, "t");
                      eng.export_safetensors(dir / "fp32.safetensors", dtype::f32);
                      eng.export_safetensors(dir / "bf16.safetensors", dtype::bf16);
                    });
    const auto saved = zt::read_snapshot(dir);
    const auto fp32 = zt::read_safetensors(dir / "fp32.safetensors");
    const auto bf16 = zt::read_safetensors(dir / "bf16.safetensors");
    REQUIRE(fp32.size() == 6);
    for (const auto& tensor : fp32) {
      const std::string& name = tensor.first; // not a structured binding: CAPTURE is a lambda (Clang 14)
      const auto& v = tensor.second;
      CAPTURE(name);
      CHECK(v == saved.tensors.at(name + "/0"));
      std::vector<float> rounded;
      for (float x : v) {
        rounded.push_back(zero::to_float(zero::from_float<zero::bf16>(x)));
      }
      CHECK(bf16.at(name) == rounded);
    }
    // Offline, from the checkpoint: the same tensors (written outside the checkpoint's folder).
    zero::checkpoint::reader rd(dir);
    const auto offline = dir.parent_path() / ("export-" + std::to_string(stage) + "-offline.safetensors");
    zero::checkpoint::export_safetensors(rd, offline, dtype::f32);
    CHECK(zt::read_safetensors(offline) == fp32);
  }
}

TEST_CASE("init_from_safetensors fills every parameter, at another world size and stage; bad files are refused") {
  const auto dir = zt::scratch("import");
  zt::run_spec s{.stage = 2, .world = 2, .steps = 2, .batch = 64};
  zt::with_engine(s, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    zt::init_and_train(eng, mh, comm, s, 2);
                    eng.export_safetensors(dir / "w.safetensors", dtype::f32);
                  });
  const auto want = zt::read_safetensors(dir / "w.safetensors");
  zt::run_spec b{.stage = 3, .world = 4, .steps = 1, .batch = 64};
  zt::with_engine(b, {.frozen = true},
                  [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                    eng.init_from_safetensors(dir / "w.safetensors");
                    zt::run_result got;
                    zt::collect_params(eng, mh, comm, got);
                    if (comm.rank() == 0) {
                      for (std::size_t k = 0; k < mh.params.size(); ++k) {
                        CHECK(got.params[k] == want.at(zt::small_model()[k].name));
                      }
                    }
                  });
  // A model with a parameter the file lacks.
  std::string msg;
  zero::run_ranks(1, [&](zero::thread_communicator& comm) {
    const auto cfg = zt::make_config({.world = 1, .batch = 64}, {});
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(cfg, comm, backend);
    static_cast<void>(eng.add_param(eng.add_module("m"), "head", {3, 3}));
    eng.finalize();
    msg = zt::error_of([&] { eng.init_from_safetensors(dir / "w.safetensors"); });
  });
  CHECK(msg.find((dir / "w.safetensors").string() +
                 ": has no tensor \"head\"; the model registered it with shape [3, 3]") != std::string::npos);
}

TEST_CASE("save_16bit_model writes the parameters as the framework sees them, in their dtype; at stage 3 only with "
          "stage3_gather_16bit_weights_on_model_save") {
  for (const int stage : {0, 1, 2, 3}) {
    for (const bool gather_key : {false, true}) {
      CAPTURE(stage);
      CAPTURE(gather_key);
      const auto dir = zt::scratch("save16-" + std::to_string(stage) + (gather_key ? "-key" : ""));
      zt::run_spec s{.stage = stage, .world = 4, .type = dtype::bf16, .steps = 2, .batch = 64};
      if (gather_key) {
        s.zero_extra = R"("stage3_gather_16bit_weights_on_model_save": true)";
      }
      bool wrote = false;
      std::map<std::string, std::vector<float>> held; // rank 0's whole parameters, gathered
      zt::with_engine(s, {.frozen = true},
                      [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
                        zt::init_and_train(eng, mh, comm, s, 2);
                        const bool w = eng.save_16bit_model(dir / "out", "model.safetensors");
                        auto all = eng.gather_all();
                        if (comm.rank() == 0) {
                          wrote = w;
                          std::vector<std::string> names{"frozen.table"};
                          for (const auto& p : zt::small_model()) {
                            names.push_back(p.name);
                          }
                          for (const auto& name : names) {
                            const auto v = eng.param(eng.find(name));
                            REQUIRE(v.type == dtype::bf16);
                            for (std::size_t i = 0; i < v.numel; ++i) {
                              held[name].push_back(zero::to_float(v.as<zero::bf16>()[i]));
                            }
                          }
                        }
                      });
      const auto file = dir / "out" / "model.safetensors";
      if (stage == 3 && !gather_key) {
        CHECK_FALSE(wrote);
        CHECK_FALSE(fs::exists(file));
        continue;
      }
      CHECK(wrote);
      zero::safetensors::reader r(file);
      for (const auto& t : r.tensors()) {
        CHECK(t.type == dtype::bf16);
      }
      CHECK(zt::read_safetensors(file) == held);
    }
  }
}

TEST_CASE("save_16bit_model refuses a target that is not a regular file, as export does") {
  const auto dir = zt::scratch("save16-fifo");
  fs::create_directories(dir);
  REQUIRE(::mkfifo((dir / "model.safetensors").c_str(), 0644) == 0);
  zt::run_spec s{.stage = 2, .world = 2, .type = dtype::bf16, .steps = 1, .batch = 64};
  std::string msg;
  zt::with_engine(s, {}, [&](zt::test_engine& eng, const zt::model_handles& mh, zero::thread_communicator& comm) {
    zt::init_and_train(eng, mh, comm, s, 1);
    const auto m = zt::error_of([&] { static_cast<void>(eng.save_16bit_model(dir, "model.safetensors")); });
    if (comm.rank() == 0) {
      msg = m;
    }
  });
  CHECK(msg.find("model.safetensors: a FIFO; expected a regular file or a new name") != std::string::npos);
  CHECK(fs::is_fifo(dir / "model.safetensors"));
}
