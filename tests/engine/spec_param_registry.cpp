// param_registry: modules, trainable and frozen parameters and parameter groups, and the layouts and
// ownership tables they become at finalize.

#include "part_kit.hpp"
#include "zero/engine/param_registry.hpp"

#include <array>
#include <cstddef>
#include <doctest/doctest.h>
#include <string>
#include <vector>

namespace zero::testing::registry_spec {
namespace {

/// Defaults of the registry's groups: lr 1e-2, weight decay 0.1.
param_registry make_registry(std::size_t persistence) { return param_registry(dtype::f32, 1e-2, 0.1, persistence); }

/// Owned pieces as rows {id, param_offset, count, state, store}, to compare with a table.
std::vector<std::array<std::size_t, 5>> rows(const std::vector<owned_piece>& pieces) {
  std::vector<std::array<std::size_t, 5>> out;
  for (const auto& p : pieces) {
    out.push_back({p.id, p.param_offset, p.count, p.state, p.store});
  }
  return out;
}

/// Stage 3's registry of the specs below: fc1 {w 6, b 2}, fc2 {w 5, g 4, b 3}, frozen emb 7, with a
/// persistence threshold of 4 elements (fc1.b and fc2.b stay whole; fc2.g, at the threshold, does not).
struct stage3_model {
  param_registry reg = make_registry(4);
  std::vector<param_handle> h;
  stage3_model() {
    const int fc1 = reg.add_module("fc1");
    const int fc2 = reg.add_module("fc2");
    h.push_back(reg.add_param(fc1, "fc1.w", {2, 3}, {}));
    h.push_back(reg.add_param(fc1, "fc1.b", {2}, {.weight_decay = 0.0}));
    h.push_back(reg.add_param(fc2, "fc2.w", {5}, {.lr = 2e-2}));
    h.push_back(reg.add_param(fc2, "fc2.g", {4}, {.weight_decay = 0.0}));
    h.push_back(reg.add_param(fc2, "fc2.b", {3}, {.lr = 1e-2, .weight_decay = 0.1})); // the defaults, named
    h.push_back(reg.add_param(fc1, "emb", {7}, {.trainable = false}));
  }
};

} // namespace

TEST_CASE("param_registry: one group per distinct (lr, weight decay); small parameters persist at stage 3") {
  stage3_model m;
  const auto& reg = m.reg;
  REQUIRE(reg.groups().size() == 3);
  CHECK(reg.groups()[0].lr == 1e-2);
  CHECK(reg.groups()[0].weight_decay == 0.1);
  CHECK(reg.groups()[1].lr == 1e-2);
  CHECK(reg.groups()[1].weight_decay == 0.0);
  CHECK(reg.groups()[2].lr == 2e-2);
  CHECK(reg.groups()[2].weight_decay == 0.1);
  CHECK(reg.group_of() == std::vector<std::size_t>{0, 1, 2, 1, 0});
  // Below the threshold a parameter goes to "zero.persistent" in the trainable layout; at it, it stays.
  CHECK(reg.layout().modules() == std::vector<std::string>{"fc1", "fc2", "zero.persistent"});
  std::vector<int> layout_module;
  for (std::size_t id = 0; id < reg.layout().param_count(); ++id) {
    layout_module.push_back(reg.layout().param(id).module);
  }
  CHECK(layout_module == std::vector<int>{0, 2, 1, 1, 2});
  // The frozen parameter is in a layout of its own; the handles count every parameter.
  CHECK(reg.layout().param_count() == 5);
  CHECK(reg.frozen_layout().param_count() == 1);
  CHECK(m.h[5].index == 5);
  const auto& frozen = reg.at(m.h[5], "param");
  CHECK_FALSE(frozen.trainable);
  CHECK(reg.info(frozen).name == "emb");
  CHECK(&reg.layout_of(frozen) == &reg.frozen_layout());
  // The view checkpoints read: registration order, the user's module names.
  const auto all = reg.registered();
  REQUIRE(all.size() == 6);
  CHECK(all[1].info->name == "fc1.b");
  CHECK(all[1].module == "fc1");
  CHECK(all[1].group == 1);
  CHECK(all[1].trainable);
  CHECK(all[5].module == "fc1");
  CHECK_FALSE(all[5].trainable);
  CHECK(reg.find("fc2.g") == m.h[3]);
  CHECK(reg.find("emb") == m.h[5]);
  // Without a threshold (stages 0-2) nothing persists.
  auto flat = make_registry(0);
  flat.add_param(flat.add_module("a"), "a.b", {1}, {});
  CHECK(flat.layout().modules() == std::vector<std::string>{"a"});
}

TEST_CASE("param_registry: a taken name, an unknown module or handle, and a missing name are refused") {
  stage3_model m;
  auto& reg = m.reg;
  CHECK_THROWS_WITH_AS(reg.add_param(0, "fc1.w", {1}, {}),
                       doctest::Contains("add_param: parameter \"fc1.w\" is already registered"), usage_error);
  CHECK_THROWS_WITH_AS(reg.add_param(1, "emb", {1}, {}),
                       doctest::Contains("add_param: parameter \"emb\" is already registered"), usage_error);
  CHECK_THROWS_WITH_AS(
      reg.add_param(2, "x", {1}, {}),
      doctest::Contains("add_param(\"x\"): module id 2 was not made by add_module (2 modules are registered)"),
      usage_error);
  CHECK_THROWS_WITH_AS(reg.add_param(-1, "x", {1}, {}), doctest::Contains("module id -1 was not made by add_module"),
                       usage_error);
  CHECK_THROWS_WITH_AS(reg.add_param(0, "x", {0}, {}),
                       doctest::Contains("has dimension 0 = 0; every dimension must be positive"), usage_error);
  CHECK_THROWS_WITH_AS(reg.add_module("fc2"), doctest::Contains("module \"fc2\" is already registered"), usage_error);
  CHECK_THROWS_WITH_AS(reg.check_module(5),
                       doctest::Contains("module id 5 was not made by add_module (2 modules are registered)"),
                       usage_error);
  CHECK_NOTHROW(reg.check_module(1));
  CHECK_THROWS_WITH_AS((void)reg.at({99}, "param"),
                       doctest::Contains("param: parameter handle 99 was not made by this engine (6 parameters are "
                                         "registered)"),
                       usage_error);
  CHECK_THROWS_WITH_AS((void)reg.find("nope"), doctest::Contains("no parameter named \"nope\" is registered"),
                       usage_error);
}

TEST_CASE("param_registry: owned_by stores at the flat offset at stages 1-2, at the shard offset at 3, whole at 0") {
  auto reg = make_registry(0);
  const int fc1 = reg.add_module("fc1");
  const int fc2 = reg.add_module("fc2");
  reg.add_param(fc1, "fc1.w", {6}, {});
  reg.add_param(fc1, "fc1.b", {3}, {});
  reg.add_param(fc2, "fc2.w", {5}, {});
  // Segments of at most 8 elements: [fc1.w] (6, slices of 3) and [fc1.b fc2.w] at 6..14 (slices of 4);
  // shard offsets 0 and 3.
  reg.finalize({.world_size = 2, .alignment_bytes = 4, .segment_bytes = 8 * 4});
  using table = std::vector<std::array<std::size_t, 5>>;
  // {id, param_offset, count, state, store}
  for (const int rank : {0, 1}) {
    CHECK(rows(reg.owned_by(rank, 0)) == table{{0, 0, 6, 0, 0}, {1, 0, 3, 6, 6}, {2, 0, 5, 9, 9}});
  }
  CHECK(rows(reg.owned_by(0, 1)) == table{{0, 0, 3, 0, 0}, {1, 0, 3, 3, 6}, {2, 0, 1, 6, 9}});
  CHECK(rows(reg.owned_by(1, 1)) == table{{0, 3, 3, 0, 3}, {2, 1, 4, 3, 10}});
  CHECK(rows(reg.owned_by(0, 2)) == rows(reg.owned_by(0, 1)));
  CHECK(rows(reg.owned_by(0, 3)) == table{{0, 0, 3, 0, 0}, {1, 0, 3, 3, 3}, {2, 0, 1, 6, 6}});
  CHECK(rows(reg.owned_by(1, 3)) == table{{0, 3, 3, 0, 0}, {2, 1, 4, 3, 3}});
  // The segments each module's parameters lie in: fc1 spans both.
  CHECK(reg.module_segments() == std::vector<std::vector<std::size_t>>{{0, 1}, {1}});
}

TEST_CASE("param_registry: module_units gives each module its unit and the persistent units apart") {
  stage3_model m;
  auto& reg = m.reg;
  reg.add_module("empty");
  reg.finalize({.world_size = 2, .alignment_bytes = 4, .grouping = segment_by::module});
  // Units in the order modules first appear: fc1 (fc1.w), zero.persistent (fc1.b, fc2.b), fc2 (fc2.w, fc2.g).
  const auto [units, persistent] = reg.module_units();
  CHECK(units == std::vector<std::vector<std::size_t>>{{0}, {2}, {}});
  CHECK(persistent == std::vector<std::size_t>{1});
  CHECK(reg.layout().segments()[1].module == 2);
  CHECK(reg.layout().segments()[2].range.size() == 10); // 5 + 4, padded to 2 ranks
  CHECK(reg.frozen_layout().world_size() == 1);         // frozen parameters stay whole
  CHECK(reg.module_names() == std::vector<std::string>{"fc1", "fc2", "empty"});
}

} // namespace zero::testing::registry_spec
