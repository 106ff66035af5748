// The fp16 loss scaler against DeepSpeed's DynamicLossScaler semantics, traced by hand.
#include "zero/core/error.hpp"
#include "zero/optim/loss_scaler.hpp"

#include <doctest/doctest.h>
#include <string>
#include <vector>

TEST_CASE("defaults: dynamic, 2^16, hysteresis 2, window 1000") {
  zero::loss_scaler s;
  CHECK(s.dynamic());
  CHECK(s.scale() == 65536.0);
  CHECK(s.state().cur_hysteresis == 2);
  CHECK(s.state().last_overflow_iter == -1);
}

TEST_CASE("an overflow skips the step; hysteresis delays the first halving") {
  zero::loss_scaler s; // hysteresis 2, consecutive_hysteresis false
  auto u = s.update(true);
  CHECK_FALSE(u.applied);
  CHECK(u.scale_before == 65536.0);
  CHECK(u.scale == 65536.0); // budget 2 -> 1, scale kept
  CHECK(u.hysteresis == 1);
  u = s.update(true);
  CHECK_FALSE(u.applied);
  CHECK(u.scale == 32768.0); // budget used up: halve
  CHECK(u.hysteresis == 1);
  // Without consecutive_hysteresis good steps do not refill the budget: the next overflow halves at once.
  CHECK(s.update(false).applied);
  CHECK(s.update(false).scale == 32768.0);
  u = s.update(true);
  CHECK(u.scale == 16384.0);
}

TEST_CASE("consecutive_hysteresis refills the budget after every good step") {
  zero::loss_scaler s({.hysteresis = 2, .consecutive_hysteresis = true});
  CHECK(s.update(true).scale == 65536.0); // 2 -> 1
  CHECK(s.update(false).hysteresis == 2); // refilled
  CHECK(s.update(true).scale == 65536.0); // 2 -> 1 again, no halving
  CHECK(s.update(true).scale == 32768.0); // two in a row: halve
}

TEST_CASE("hysteresis 1 halves on every overflow") {
  zero::loss_scaler s({.initial_scale_power = 10, .hysteresis = 1});
  CHECK(s.update(true).scale == 512.0);
  CHECK(s.update(true).scale == 256.0);
  CHECK(s.update(true).scale == 128.0);
}

TEST_CASE("the scale doubles after loss_scale_window good iterations, counted from the last overflow") {
  zero::loss_scaler s({.initial_scale_power = 4, .loss_scale_window = 4, .hysteresis = 1});
  // Iterations 0..3 are good: at iteration 3, (3 - (-1)) % 4 == 0 -> 16 * 2.
  std::vector<double> scales;
  for (int i = 0; i < 8; ++i) {
    scales.push_back(s.update(false).scale);
  }
  CHECK(scales == std::vector<double>{16, 16, 16, 32, 32, 32, 32, 64});
  // Overflow at iteration 8: 64 -> 32, last_overflow_iter = 8; growth again at iteration 12.
  CHECK(s.update(true).scale == 32.0);
  scales.clear();
  for (int i = 0; i < 4; ++i) {
    scales.push_back(s.update(false).scale); // iterations 9, 10, 11, 12
  }
  CHECK(scales == std::vector<double>{32, 32, 32, 64});
  CHECK(s.state().cur_iter == 13);
}

TEST_CASE("growth refills the hysteresis budget (consecutive_hysteresis false)") {
  zero::loss_scaler s({.initial_scale_power = 8, .loss_scale_window = 2, .hysteresis = 3});
  CHECK(s.update(true).hysteresis == 2);  // iteration 0: 3 -> 2, last_overflow_iter = 0
  CHECK(s.update(false).hysteresis == 2); // iteration 1: (1 - 0) % 2 != 0
  auto u = s.update(false);               // iteration 2: (2 - 0) % 2 == 0: grow and refill
  CHECK(u.scale == 512.0);
  CHECK(u.hysteresis == 3);
}

TEST_CASE("min_loss_scale is a floor, and an overflow stuck at it throws") {
  zero::loss_scaler s({.initial_scale_power = 2, .hysteresis = 1, .min_loss_scale = 3.0});
  CHECK(s.update(true).scale == 3.0); // max(4 / 2, 3)
  const auto before = s.state();
  try {
    s.update(true);
    FAIL("an overflow at the minimum scale must throw");
  } catch (const zero::loss_scale_error& e) {
    const std::string what = e.what();
    CHECK(what.rfind("[zero.loss_scale_error] gradient overflow", 0) == 0);
    CHECK(what.find("fp16.min_loss_scale = 3") != std::string::npos);
    CHECK(what.find("bf16") != std::string::npos);
    CHECK(e.id() == "loss_scale_error");
  }
  CHECK(s.state().cur_scale == before.cur_scale);
  CHECK(s.state().cur_iter == before.cur_iter);
  CHECK_THROWS_AS(s.update(true), zero::error); // a zero::error like every other
}

TEST_CASE("with hysteresis the throw waits until the budget is used up at the minimum") {
  zero::loss_scaler s({.initial_scale_power = 1, .hysteresis = 2});
  CHECK(s.update(true).scale == 2.0); // 2 -> 1 budget
  CHECK(s.update(true).scale == 1.0); // halve to the minimum
  CHECK_THROWS_AS(s.update(true), zero::loss_scale_error);
}

TEST_CASE("a static scale never changes; overflows still skip") {
  zero::loss_scaler s({.loss_scale = 128.0});
  CHECK_FALSE(s.dynamic());
  CHECK(s.scale() == 128.0);
  for (int i = 0; i < 5; ++i) {
    const auto u = s.update(true);
    CHECK_FALSE(u.applied);
    CHECK(u.scale == 128.0);
  }
  CHECK(s.update(false).applied);
  CHECK(s.scale() == 128.0);
  const auto none = zero::loss_scaler::none();
  CHECK(none.scale() == 1.0);
  CHECK_FALSE(none.dynamic());
}

TEST_CASE("state round trip") {
  zero::loss_scaler a({.initial_scale_power = 6, .loss_scale_window = 3, .hysteresis = 2});
  a.update(true);
  a.update(false);
  zero::loss_scaler b({.initial_scale_power = 6, .loss_scale_window = 3, .hysteresis = 2});
  b.load_state(a.state());
  for (bool overflow : {false, true, true, false, false, false}) {
    const auto ua = a.update(overflow);
    const auto ub = b.update(overflow);
    CHECK(ua.scale == ub.scale);
    CHECK(ua.hysteresis == ub.hysteresis);
  }
}

TEST_CASE("bad settings are config errors naming the key") {
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.loss_scale = -1.0}), doctest::Contains("fp16.loss_scale"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.initial_scale_power = 200}), doctest::Contains("fp16.initial_scale_power"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.loss_scale_window = 0}), doctest::Contains("fp16.loss_scale_window"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.hysteresis = 0}), doctest::Contains("fp16.hysteresis"), zero::config_error);
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.min_loss_scale = 0.0}), doctest::Contains("fp16.min_loss_scale"),
                       zero::config_error);
  CHECK_THROWS_WITH_AS(zero::loss_scaler({.initial_scale_power = 0, .min_loss_scale = 2.0}),
                       doctest::Contains("below fp16.min_loss_scale"), zero::config_error);
}
