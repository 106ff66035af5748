// Checkpoints of a model-parallel job: each (pipe, tensor) coordinate's engine saves its own
// checkpoint under the job's root, recording its coordinates and each slice's split dimension.
// Saved at (pipe 2, tensor 2, data 2) at stage 2, the checkpoint loads at (pipe 2, tensor 2, data 1),
// at (pipe 2, tensor 1, data 4) and into one engine holding the whole model, at other stages, and
// training goes on exactly as one engine that never stopped; the offline export joins the tensor
// slices into the tensors that engine exports.

#include "ckpt_harness.hpp"
#include "zero/checkpoint/model_reader.hpp"
#include "zero/checkpoint/safetensors.hpp"
#include "zero/comm/topology.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <doctest/doctest.h>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zt = zero::testing;
namespace fs = std::filesystem;

namespace {

/// One parameter of the model, whole: split along dimension `split` over the tensor group, or
/// replicated across it (-1).
struct mp_param {
  std::string name;
  std::vector<std::int64_t> whole;
  int split;
};

/// Pipeline stage `p`'s parameters: a column-parallel weight (rows split), a row-parallel one
/// (columns split) and a replicated layer norm.
std::vector<mp_param> mp_stage(int p) {
  const std::string s = "s" + std::to_string(p) + ".";
  return {{s + "col.w", {8, 6}, 0}, {s + "row.w", {6, 8}, 1}, {s + "ln.w", {6}, -1}};
}

std::size_t mp_numel(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (const auto d : shape) {
    n *= static_cast<std::size_t>(d);
  }
  return n;
}

/// The whole tensor's element of element `local` of slice `t` of `slices`.
std::size_t mp_whole_index(const mp_param& p, int slices, int t, std::size_t local) {
  if (p.split < 0 || slices == 1) {
    return local;
  }
  std::size_t inner = 1; // elements of one index along the split dimension, and below it
  for (std::size_t d = static_cast<std::size_t>(p.split) + 1; d < p.whole.size(); ++d) {
    inner *= static_cast<std::size_t>(p.whole[d]);
  }
  const std::size_t run = static_cast<std::size_t>(p.whole[static_cast<std::size_t>(p.split)]) / slices * inner;
  return local / run * run * static_cast<std::size_t>(slices) + static_cast<std::size_t>(t) * run + local % run;
}

/// Dyadic gradients, so every norm is exact: data rank `d`'s at step `step`; from step 2 on the same
/// on every data rank, so that runs of any data size continue alike.
float mp_grad(int step, int d, const std::string& name, std::size_t w) {
  const int rank = step >= 2 ? 0 : d;
  const auto k = static_cast<int>((w * 7 + static_cast<std::size_t>(step) * 3 + name.size() * 5) % 17) - 8;
  return static_cast<float>(k + rank) / 64.0F;
}

zero::config mp_config(int data, int stage) {
  zero::config_inputs in;
  in.world_size = data;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 0.05,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
      "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})",
                                   in);
}

using whole_values = std::map<std::string, std::vector<float>>;

/// What one rank of a run does between registering and the end: train steps [from, to), save, load.
struct mp_plan {
  int stage = 2;
  int from = 0, to = 0;
  std::optional<fs::path> load_from{}, save_to{}, export_to{};
  /// A whole model's safetensors file to initialise from (init_from_safetensors), before any load.
  std::optional<fs::path> init_from{};
  /// When set, a load that fails is caught and its message kept here (each rank's), and the run goes on.
  std::vector<std::string>* load_errors = nullptr;
};

/// Runs (pipe, tensor, data) ranks, each engine over its data group; `model_group`: with
/// set_model_group (else one engine per rank with every stage it holds whole, pipe = tensor = 1).
/// \returns the whole tensors after the plan, assembled from data rank 0 of every coordinate.
whole_values mp_run(int pipe, int tensor, int data, const mp_plan& plan, bool model_group = true) {
  const zero::topology topo({{"pipe", pipe}, {"tensor", tensor}, {"data", data}});
  whole_values out;
  std::mutex mu;
  zero::run_ranks(pipe * tensor * data, [&](zero::thread_communicator& world) {
    auto dgroup = topo.split(world, {"data"});
    auto model = topo.split(world, {"pipe", "tensor"});
    const int p = topo.coord(world.rank(), "pipe");
    const int t = topo.coord(world.rank(), "tensor");
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(mp_config(data, plan.stage), dgroup, backend);
    if (model_group) {
      eng.set_model_group(model, {.pipe = p, .tensor = t, .tensor_size = tensor});
    }
    std::vector<mp_param> params;
    for (int s = 0; s < 2; ++s) {
      if (!model_group || s == p) {
        for (const auto& mp : mp_stage(s)) {
          params.push_back(mp);
        }
      }
    }
    const int m = eng.add_module("m");
    std::vector<zero::param_handle> handles;
    for (const auto& mp : params) {
      auto shape = mp.whole;
      if (mp.split >= 0) {
        shape[static_cast<std::size_t>(mp.split)] /= tensor;
      }
      handles.push_back(eng.add_param(m, mp.name, shape,
                                      {.weight_decay = mp.split < 0 ? 0.0 : 0.1,
                                       .tensor_replicated = mp.split < 0 && tensor > 1,
                                       .tensor_split = mp.split}));
    }
    eng.finalize();
    const auto find = [&](const std::string& name) -> const mp_param& {
      for (const auto& mp : params) {
        if (mp.name == name) {
          return mp;
        }
      }
      throw std::logic_error(name);
    };
    eng.init_params([&](const zero::param_info& info, std::size_t first, std::span<float> v) {
      for (std::size_t i = 0; i < v.size(); ++i) {
        const std::size_t w = mp_whole_index(find(info.name), tensor, t, first + i);
        v[i] = static_cast<float>((w + info.name.size()) % 13) / 16.0F - 0.25F;
      }
    });
    if (plan.init_from) {
      eng.init_from_safetensors(*plan.init_from);
    }
    if (plan.load_from) {
      try {
        eng.load(*plan.load_from, "ckpt");
      } catch (const zero::checkpoint_error& e) {
        if (plan.load_errors == nullptr) {
          throw;
        }
        const std::lock_guard lock(mu);
        plan.load_errors->push_back(e.what());
      }
    }
    for (int step = plan.from; step < plan.to; ++step) {
      {
        auto on = eng.gather(m);
        for (std::size_t j = 0; j < params.size(); ++j) {
          float* g = eng.grad(handles[j]).as<float>();
          for (std::size_t i = 0; i < eng.grad(handles[j]).numel; ++i) {
            g[i] += mp_grad(step, dgroup.rank(), params[j].name, mp_whole_index(params[j], tensor, t, i));
          }
          eng.grad_ready(handles[j]);
        }
      }
      CHECK(eng.step().applied);
    }
    if (plan.save_to) {
      eng.save(*plan.save_to, "ckpt");
    }
    if (plan.export_to) {
      eng.export_safetensors(*plan.export_to);
    }
    auto all = eng.gather_all();
    if (dgroup.rank() == 0) {
      const std::lock_guard lock(mu);
      for (std::size_t j = 0; j < params.size(); ++j) {
        auto& whole = out[params[j].name];
        whole.resize(mp_numel(params[j].whole));
        const float* v = eng.param(handles[j]).as<float>();
        for (std::size_t i = 0; i < eng.param(handles[j]).numel; ++i) {
          whole[mp_whole_index(params[j], tensor, t, i)] = v[i];
        }
      }
    }
  });
  return out;
}

} // namespace

TEST_CASE("a model-parallel checkpoint saved at (pipe 2, tensor 2, data 2) loads at other factorizations and "
          "stages, and exports the tensors of one engine holding the whole model") {
  const fs::path root = zt::scratch("mp-root");
  const fs::path out = zt::scratch("mp-out");
  // One engine holding the whole model on 2 data ranks: 2 steps, export, a third step.
  const whole_values want2 = mp_run(1, 1, 2, {.to = 2, .export_to = out / "whole.safetensors"}, false);
  const whole_values want3 = mp_run(1, 1, 2, {.to = 3}, false);
  REQUIRE(want3.size() == 6);
  REQUIRE(want3 != want2);

  // The job: 2 steps, then its checkpoint.
  CHECK(mp_run(2, 2, 2, {.to = 2, .save_to = root}) == want2);
  for (int p = 0; p < 2; ++p) {
    for (int t = 0; t < 2; ++t) {
      const zero::checkpoint::reader r(root / zero::checkpoint::model_dir_name(p, t), "ckpt");
      REQUIRE(r.info().model.has_value());
      CHECK(r.info().model->pipe == p);
      CHECK(r.info().model->tensor == t);
      CHECK(r.info().model->tensor_size == 2);
      CHECK(r.info().params[0].tensor_split == 0);
      CHECK(r.info().params[0].shape == std::vector<std::int64_t>{4, 6});
      CHECK(r.info().params[1].tensor_split == 1);
      CHECK(r.info().params[2].tensor_split == -1);
    }
  }

  SUBCASE("the offline export joins the slices into the whole model's tensors") {
    zero::checkpoint::model_reader mr(root, "latest");
    CHECK(mr.info().params.size() == 6);
    CHECK(mr.info().params[0].shape == std::vector<std::int64_t>{8, 6});
    zero::checkpoint::export_safetensors(mr, out / "joined.safetensors");
    CHECK(zt::read_safetensors(out / "joined.safetensors") == zt::read_safetensors(out / "whole.safetensors"));
    CHECK(zt::read_safetensors(out / "joined.safetensors") == want2);
  }
  SUBCASE("a job at (pipe 2, tensor 2, data 1) initialised from the whole model's file cuts its slices from it") {
    CHECK(mp_run(2, 2, 1, {.init_from = out / "whole.safetensors"}) == want2);
  }
  SUBCASE("(pipe 2, tensor 2, data 1) at stage 3") {
    CHECK(mp_run(2, 2, 1, {.stage = 3, .from = 2, .to = 3, .load_from = root}) == want3);
  }
  SUBCASE("(pipe 2, tensor 1, data 4) at stage 1: each stage's tensors whole") {
    CHECK(mp_run(2, 1, 4, {.stage = 1, .from = 2, .to = 3, .load_from = root}) == want3);
  }
  SUBCASE("one engine at stage 0 holding every stage, each tensor whole") {
    CHECK(mp_run(1, 1, 1, {.stage = 0, .from = 2, .to = 3, .load_from = root}, false) == want3);
  }
  SUBCASE("saved again at (pipe 2, tensor 1, data 4), it loads at tensor 2 again") {
    const fs::path again = zt::scratch("mp-again");
    CHECK(mp_run(2, 1, 4, {.from = 2, .to = 2, .load_from = root, .save_to = again}) == want2);
    CHECK(mp_run(2, 2, 2, {.stage = 3, .from = 2, .to = 3, .load_from = again}) == want3);
  }
}

TEST_CASE("a model-parallel checkpoint with a slice missing or misplaced is refused, naming it; the engines keep "
          "what they had") {
  const fs::path root = zt::scratch("mp-bad");
  const whole_values saved = mp_run(2, 2, 1, {.to = 1, .save_to = root});
  const whole_values fresh = mp_run(2, 2, 1, {});
  REQUIRE(saved != fresh);
  const auto refused = [&](const std::string& what) {
    std::vector<std::string> errors;
    // The failed load leaves every engine with its initial values (the run's end gathers them).
    CHECK(mp_run(2, 2, 1, {.from = 1, .to = 1, .load_from = root, .load_errors = &errors}) == fresh);
    CHECK(errors.size() == 4); // every rank fails, those that could read their slices too
    bool named = false;
    for (const auto& e : errors) {
      named = named || e.find(what) != std::string::npos;
    }
    const std::string first = errors.empty() ? std::string() : errors.front();
    CHECK_MESSAGE(named, first);
  };
  const auto slice = [&](int p, int t) { return root / zero::checkpoint::model_dir_name(p, t); };
  SUBCASE("a slice's folder missing") {
    fs::rename(slice(1, 1), root / "elsewhere");
    refused((slice(1, 1)).string() + ": no such checkpoint directory");
  }
  SUBCASE("two slices' folders swapped") {
    fs::rename(slice(0, 0), root / "x");
    fs::rename(slice(0, 1), slice(0, 0));
    fs::rename(root / "x", slice(0, 1));
    refused("records pipe 0, tensor 1; expected pipe 0, tensor 0 (its folder's name)");
  }
}

TEST_CASE("an engine of a model-parallel job refuses to export a part as the whole model") {
  const zero::topology topo({{"tensor", 2}, {"data", 1}});
  zero::run_ranks(2, [&](zero::thread_communicator& world) {
    auto dgroup = topo.split(world, {"data"});
    zero::cpu_backend backend({.threads = 1});
    zt::test_engine eng(mp_config(1, 2), dgroup, backend);
    eng.set_model_group(world, {.tensor = world.rank(), .tensor_size = 2});
    eng.add_param(eng.add_module("m"), "w", {4, 6}, {.tensor_split = 0});
    eng.finalize();
    CHECK_THROWS_WITH_AS(eng.export_safetensors(zt::scratch("mp-refuse-" + std::to_string(world.rank())) / "f"),
                         doctest::Contains("export_safetensors: this engine holds pipe 0, tensor slice"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(static_cast<void>(eng.save_16bit_model(zt::scratch("mp-16-" + std::to_string(world.rank())))),
                         doctest::Contains("save a checkpoint and export the whole model from it"), zero::usage_error);
  });
}

TEST_CASE("zero-ckpt fixture: a model-parallel job's checkpoint" * doctest::skip()) {
  const char* where = std::getenv("ZERO_CKPT_FIXTURE_DIR");
  REQUIRE_MESSAGE(where != nullptr, "ZERO_CKPT_FIXTURE_DIR must name the folder to write the fixture to");
  const fs::path dir = fs::path(where) / "model";
  fs::remove_all(dir);
  static_cast<void>(mp_run(2, 2, 1, {.to = 1, .save_to = dir}));
  MESSAGE("wrote " << dir.string());
}
