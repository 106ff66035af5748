// What a stage asks of the policies: a communicator that can only all-reduce runs stage 0 (the same
// bits as the full in-process communicator) and is refused stages 1-3 with the sentence naming the
// missing operation; `static_engine` fixes the stage at compile time and refuses a config of
// another stage; a scope whose end fails in a destructor reports it at the engine's next call.

#include "../support/all_reduce_only.hpp"
#include "engine_harness.hpp"
#include "zero/engine/static_engine.hpp"

#include <doctest/doctest.h>
#include <string>

namespace {

using zero::testing::all_reduce_only;
using arc_engine = zero::engine<zero::cpu_backend, all_reduce_only>;

auto all_reduce_only_group() {
  return [](int world, auto&& fn) {
    zero::run_ranks(world, [&](zero::thread_communicator& c) {
      all_reduce_only comm(c);
      fn(comm);
    });
  };
}

zero::config stage_config(int stage, int world) {
  zero::testing::run_spec s;
  s.stage = stage;
  s.world = world;
  zero::config_inputs inputs;
  inputs.world_size = world;
  return zero::config::from_string(zero::testing::config_json(s), inputs);
}

} // namespace

TEST_CASE("an all-reduce-only communicator trains stage 0 to the same bits as the full communicator") {
  for (auto type : {zero::dtype::f32, zero::dtype::bf16}) {
    zero::testing::run_spec s;
    s.stage = 0;
    s.world = 2;
    s.type = type;
    s.accumulation = 2;
    s.clip = 1.0;
    const auto full = zero::testing::train_with_engine(s);
    const auto mine = zero::testing::train_with<zero::cpu_backend>(
        s, all_reduce_only_group(), [](all_reduce_only&) { return zero::cpu_backend({.threads = 1}); },
        zero::testing::host_io{});
    CHECK(mine.params == full.params);
    CHECK(mine.norms == full.norms);
    CHECK(zero::testing::max_rel_diff(mine.params, zero::testing::train_reference(s).params) < 1e-2);
  }
}

TEST_CASE("stages 1-3 on an all-reduce-only communicator are refused at construction, naming all_gather") {
  for (int stage = 1; stage <= 3; ++stage) {
    CAPTURE(stage);
    zero::run_ranks(1, [&](zero::thread_communicator& c) {
      all_reduce_only comm(c);
      zero::cpu_backend backend({.threads = 1});
      const std::string named = "stage " + std::to_string(stage) + " cannot run on this communicator";
      CHECK_THROWS_WITH_AS(arc_engine(stage_config(stage, 1), comm, backend), doctest::Contains(named.c_str()),
                           zero::config_error);
      CHECK_THROWS_WITH_AS(arc_engine(stage_config(stage, 1), comm, backend),
                           doctest::Contains("zero: this needs a communicator with all_gather"), zero::config_error);
    });
  }
}

TEST_CASE("static_engine runs its own stage and refuses a config of another") {
  zero::run_ranks(2, [&](zero::thread_communicator& c) {
    all_reduce_only comm(c);
    zero::cpu_backend backend({.threads = 1});
    zero::static_engine<0, zero::cpu_backend, all_reduce_only> eng(stage_config(0, 2), comm, backend);
    const auto mh = zero::testing::register_model(eng);
    eng.finalize();
    zero::testing::init_model(eng);
    CHECK(eng.cfg().stage() == 0);
    CHECK_THROWS_WITH_AS(
        (zero::static_engine<0, zero::cpu_backend, all_reduce_only>(stage_config(2, 2), comm, backend)),
        doctest::Contains("this static_engine runs stage 0, the config asks for stage 2"), zero::config_error);
    (void)mh;
  });
  zero::run_ranks(2, [&](zero::thread_communicator& comm) {
    zero::cpu_backend backend({.threads = 1});
    zero::static_engine<3, zero::cpu_backend, zero::thread_communicator> eng(stage_config(3, 2), comm, backend);
    const auto mh = zero::testing::register_model(eng);
    eng.finalize();
    CHECK(eng.coordinator() != nullptr);
    (void)mh;
  });
}

TEST_CASE("writing one rank's values back needs broadcast: refused at the scope's end, or at the next call") {
  zero::run_ranks(2, [&](zero::thread_communicator& c) {
    all_reduce_only comm(c);
    zero::cpu_backend backend({.threads = 1});
    arc_engine eng(stage_config(0, 2), comm, backend);
    const auto mh = zero::testing::register_model(eng);
    eng.finalize();
    zero::testing::init_model(eng);
    {
      auto whole = eng.gather_all(0);
      CHECK_THROWS_WITH_AS(whole.close(), doctest::Contains("needs a communicator with broadcast"), zero::usage_error);
    }
    { auto whole = eng.gather_all(0); } // the destructor cannot throw: the error waits for the next call
    CHECK_THROWS_WITH_AS((void)eng.step(), doctest::Contains("needs a communicator with broadcast"), zero::usage_error);
    { auto whole = eng.gather_all(); } // without a modifier nothing is written back: no broadcast
    for (std::size_t k = mh.params.size(); k-- > 0;) {
      eng.grad_ready(mh.params[k]);
    }
    CHECK(eng.step().applied);
  });
}
