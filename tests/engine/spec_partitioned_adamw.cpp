// partitioned_adamw: AdamW over what a rank owns — its slice of every segment (stages 1-3) or the whole
// buffer (stage 0) — split into runs by parameter group, checked against AdamW written out by hand.

#include "part_kit.hpp"
#include "zero/engine/step/partitioned_adamw.hpp"

#include <cmath>
#include <cstddef>
#include <cstring>
#include <doctest/doctest.h>
#include <vector>

namespace zero::testing::adamw_spec {
namespace {

using adamw_t = partitioned_adamw<cpu_backend, host_allocator>;

/// w (6 elements, group 0), b (3, group 1), e (5, group 0); segments of at most 10 elements: [w b]
/// and [e], padded for 2 ranks to 10 (slices of 5) and 6 (slices of 3).
flat_layout three_params(dtype type) {
  return make_layout({}, {{"w", 6}, {"b", 3}, {"e", 5}}, {.world = 2, .type = type, .segment_elements = 10});
}
const std::vector<std::size_t> group_of = {0, 1, 0};
const std::vector<param_group> groups = {{.lr = 1e-2, .weight_decay = 0.1}, {.lr = 2e-2, .weight_decay = 0.0}};
/// The schedule of the test: half of each group's own lr.
double half(double lr) { return lr * 0.5; }

/// Flat elements holding parameters: w [0, 6), b [6, 9), e [10, 15); 9 and 15 are padding.
bool holds_param(std::size_t i) { return i < 9 || (i >= 10 && i < 15); }
/// The group of flat element `i`: b's, with the padding after it, is group 1.
std::size_t group_at(std::size_t i) { return i >= 6 && i < 10 ? 1 : 0; }
/// Initial value of flat element `i` and its gradient at step `t` (padding: 0), exact in bf16.
float init_at(std::size_t i) {
  return holds_param(i) ? static_cast<float>(static_cast<int>(i * 7 % 13) - 6) / 8 : 0.0f;
}
float grad_at(std::size_t i, int t) {
  return holds_param(i) ? static_cast<float>(static_cast<int>((i * 5 + static_cast<std::size_t>(t) * 3) % 9) - 4) / 4
                        : 0.0f;
}

/// AdamW as zero/optim/adamw_args.hpp writes it, one element, in fp32.
void hand_adamw(float& p, float& m, float& v, float grad, const adamw_step_args& a, float lr, float wd) {
  const float g = grad * a.grad_scale;
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  p = p * (1.0f - lr * wd);
  const float denom = std::sqrt(v) / std::sqrt(a.bias_correction2) + a.eps;
  p = p - (lr / a.bias_correction1) * m / denom;
}

/// The arguments of step `t` (1-based) without lr and weight decay (the groups give them).
adamw_step_args args_of_step(int t) {
  adamw_step_args a;
  a.grad_scale = 0.5f;
  a.set_step(t);
  return a;
}

/// One rank's optimizer over a layout of `P` parameters, its store (whole, or the rank's shard) and
/// whole gradients in `P`, with the hand-written AdamW beside it over the whole flat buffer.
template <class P> struct adamw_case {
  flat_layout layout = three_params(dtype_v<P>);
  adamw_placement place;
  std::vector<P> store;
  std::vector<P> grads;
  rank_kit kit;
  std::optional<adamw_t> opt;
  // The hand-written side, by flat index.
  std::vector<float> master, m, v;

  adamw_case(int rank, bool partitioned, bool sharded)
      : place{.rank = rank, .partitioned = partitioned, .grad_type = dtype_v<P>, .params_sharded = sharded},
        store(sharded ? layout.shard_size() : layout.total_size()), grads(layout.total_size()),
        master(layout.total_size()), m(layout.total_size()), v(layout.total_size()) {
    for (std::size_t i = 0; i < layout.total_size(); ++i) {
      master[i] = init_at(i);
      if (owns(i) || !sharded) {
        store[store_index(i)] = from_float<P>(master[i]);
      }
    }
    place.params = reinterpret_cast<std::byte*>(store.data());
    opt.emplace(layout, place, group_of, groups, kit.backend, kit.alloc, kit.stream);
    opt->load_master();
  }

  [[nodiscard]] bool owns(std::size_t i) const { return !place.partitioned || layout.owner(i).first == place.rank; }
  /// Where flat element `i` (owned) lives in the optimizer state and in a sharded store.
  [[nodiscard]] std::size_t state_index(std::size_t i) const { return place.partitioned ? layout.owner(i).second : i; }
  [[nodiscard]] std::size_t store_index(std::size_t i) const { return place.params_sharded ? state_index(i) : i; }

  /// Sets step `t`'s gradients and steps both sides: the optimizer with `step` or `step_range`.
  void step(int t, bool by_range) {
    for (std::size_t i = 0; i < grads.size(); ++i) {
      grads[i] = from_float<P>(grad_at(i, t));
    }
    const auto a = args_of_step(t);
    auto grad_of = [&](const flat_range& r, std::size_t) {
      return reinterpret_cast<const std::byte*>(grads.data() + r.begin);
    };
    if (by_range) { // segment by segment, as the engine's update stream steps it
      for (std::size_t k = 0; k < layout.segments().size(); ++k) {
        opt->step_range(k, kit.stream, a, half, grad_of);
      }
    } else {
      opt->step(a, half, grad_of);
    }
    for (std::size_t i = 0; i < master.size(); ++i) {
      if (owns(i)) {
        const auto& g = groups[group_at(i)];
        hand_adamw(master[i], m[i], v[i], to_float(grads[i]), a, static_cast<float>(half(g.lr)),
                   static_cast<float>(g.weight_decay));
      }
    }
  }

  /// The optimizer's store, master, m and v against the hand-written AdamW, element by element.
  void check() {
    for (std::size_t i = 0; i < layout.total_size(); ++i) {
      CAPTURE(i);
      if (!owns(i)) {
        if (!place.params_sharded) {
          CHECK(to_float(store[i]) == init_at(i)); // another rank's: untouched
        }
        continue;
      }
      const std::size_t s = state_index(i);
      CHECK(to_float(store[store_index(i)]) == to_float(from_float<P>(master[i])));
      CHECK(opt->exp_avg()[s] == m[i]);
      CHECK(opt->exp_avg_sq()[s] == v[i]);
      if constexpr (!std::is_same_v<P, float>) {
        CHECK(opt->master()[s] == master[i]);
      }
    }
  }
};

/// Every placement of one rank of two: stage 0 (everything), stages 1-2 (slices, whole store),
/// stage 3 (slices, sharded store).
struct placement_row {
  int rank;
  bool partitioned;
  bool sharded;
};
constexpr placement_row placements[] = {{0, false, false}, {1, false, false}, {0, true, false},
                                        {1, true, false},  {0, true, true},   {1, true, true}};

} // namespace

TEST_CASE("partitioned_adamw: parameter groups split the owned ranges into runs; padding joins its neighbour") {
  const auto layout = three_params(dtype::f32);
  rank_kit kit;
  std::vector<float> store(layout.total_size());
  struct run_row {
    flat_range flat;
    std::size_t state, group;
  };
  auto runs_of = [&](int rank, bool partitioned) {
    adamw_t opt(layout,
                {.rank = rank, .partitioned = partitioned, .params = reinterpret_cast<std::byte*>(store.data())},
                group_of, groups, kit.backend, kit.alloc, kit.stream);
    std::vector<run_row> out;
    for (const auto& r : opt.runs()) {
      out.push_back({r.flat, r.state_offset, r.group});
    }
    CHECK(opt.state_size() == (partitioned ? 8 : 16));
    return out;
  };
  auto check_runs = [](const std::vector<run_row>& got, const std::vector<run_row>& expected) {
    REQUIRE(got.size() == expected.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      CAPTURE(k);
      CHECK(got[k].flat == expected[k].flat);
      CHECK(got[k].state == expected[k].state);
      CHECK(got[k].group == expected[k].group);
    }
  };
  // Flat: w [0, 6), b [6, 9), padding 9, e [10, 15), padding 15. Rank 0 owns [0, 5) and [10, 13),
  // rank 1 owns [5, 10) and [13, 16).
  check_runs(runs_of(0, true), {{{0, 5}, 0, 0}, {{10, 13}, 5, 0}});
  check_runs(runs_of(1, true), {{{5, 6}, 0, 0}, {{6, 10}, 1, 1}, {{13, 16}, 5, 0}});
  check_runs(runs_of(0, false), {{{0, 6}, 0, 0}, {{6, 10}, 6, 1}, {{10, 16}, 10, 0}});
}

TEST_CASE_TEMPLATE("partitioned_adamw: two steps equal AdamW written out by hand, for every placement", P, float,
                   bf16) {
  for (const auto& row : placements) {
    CAPTURE(row.rank);
    CAPTURE(row.partitioned);
    CAPTURE(row.sharded);
    adamw_case<P> c(row.rank, row.partitioned, row.sharded);
    // fp32 parameters are their own master copy; low-precision ones keep an fp32 master.
    const std::size_t state = row.partitioned ? 8 : 16;
    CHECK(c.kit.alloc.live(memory_tag::optimizer) == (std::is_same_v<P, float> ? 2 : 3) * state * sizeof(float));
    CHECK((c.opt->master() == nullptr) == std::is_same_v<P, float>);
    c.check(); // after load_master: master = params, m = v = 0
    c.step(1, false);
    c.check();
    c.step(2, false);
    c.check();
  }
}

TEST_CASE_TEMPLATE("partitioned_adamw: step_range over every segment is step(), bit for bit", P, float, bf16) {
  for (const auto& row : placements) {
    CAPTURE(row.rank);
    CAPTURE(row.partitioned);
    CAPTURE(row.sharded);
    adamw_case<P> whole(row.rank, row.partitioned, row.sharded);
    adamw_case<P> by_range(row.rank, row.partitioned, row.sharded);
    for (const int t : {1, 2}) {
      whole.step(t, false);
      by_range.step(t, true);
    }
    const std::size_t n = whole.opt->state_size() * sizeof(float);
    CHECK(std::memcmp(whole.store.data(), by_range.store.data(), whole.store.size() * sizeof(P)) == 0);
    CHECK(std::memcmp(whole.opt->exp_avg(), by_range.opt->exp_avg(), n) == 0);
    CHECK(std::memcmp(whole.opt->exp_avg_sq(), by_range.opt->exp_avg_sq(), n) == 0);
    if constexpr (!std::is_same_v<P, float>) {
      CHECK(std::memcmp(whole.opt->master(), by_range.opt->master(), n) == 0);
    }
    by_range.check();
    const std::size_t ranges = row.partitioned ? 2 : 1;
    CHECK(whole.opt->ranges().size() == ranges);
    const std::size_t segments = whole.layout.segments().size();
    const std::string msg = "step_range: segment " + std::to_string(segments) + " does not exist; the layout has " +
                            std::to_string(segments) + " segments";
    CHECK_THROWS_WITH_AS(whole.opt->step_range(segments, whole.kit.stream, args_of_step(3), half,
                                               [&](const flat_range&, std::size_t) { return whole.place.params; }),
                         doctest::Contains(msg.c_str()), usage_error);
  }
}

TEST_CASE("partitioned_adamw: load_master reads the owned part of the store, whole or sharded") {
  for (const auto& row : placements) {
    CAPTURE(row.rank);
    CAPTURE(row.partitioned);
    CAPTURE(row.sharded);
    adamw_case<bf16> c(row.rank, row.partitioned, row.sharded);
    // Rewrite the store (a checkpoint load) and read it again.
    for (std::size_t i = 0; i < c.layout.total_size(); ++i) {
      if (c.owns(i)) {
        c.store[c.store_index(i)] = from_float<bf16>(static_cast<float>(i) + 0.5f);
      }
    }
    c.opt->load_master();
    for (std::size_t i = 0; i < c.layout.total_size(); ++i) {
      if (c.owns(i)) {
        CHECK(c.opt->master()[c.state_index(i)] == static_cast<float>(i) + 0.5f);
      }
    }
  }
  // fp32: the parameters are the master copy; there is nothing to load.
  adamw_case<float> f(0, true, false);
  CHECK(f.opt->master() == nullptr);
  f.opt->load_master();
  f.check();
}

TEST_CASE("partitioned_adamw: construction refuses a null store and a group_of of the wrong size") {
  const auto layout = three_params(dtype::f32);
  rank_kit kit;
  std::vector<float> store(layout.total_size());
  CHECK_THROWS_WITH_AS(adamw_t(layout, {}, group_of, groups, kit.backend, kit.alloc, kit.stream),
                       doctest::Contains("no parameters to update (adamw_placement::params is null)"), usage_error);
  CHECK_THROWS_WITH_AS(adamw_t(layout, {.params = reinterpret_cast<std::byte*>(store.data())}, {0, 1}, groups,
                               kit.backend, kit.alloc, kit.stream),
                       doctest::Contains("2 group indices for 3 parameters"), usage_error);
}

} // namespace zero::testing::adamw_spec
