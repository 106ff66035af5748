// LR schedules against values worked out by hand from DeepSpeed's formulas
// (deepspeed/runtime/lr_schedules.py). The expected numbers are the doubles Python prints for
// DeepSpeed's expressions (same IEEE double operations and the same C library log/cos), so each is
// checked for exact equality; the arithmetic is in the comments. i is last_batch_iteration and
// W = max(2, warmup_num_steps).
#include "zero/core/error.hpp"
#include "zero/optim/lr_schedule.hpp"

#include <array>
#include <doctest/doctest.h>
#include <limits>
#include <string>

TEST_CASE("WarmupLR, log warmup (DeepSpeed's default)") {
  const zero::warmup_lr s({.warmup_min_lr = 0.0, .warmup_max_lr = 0.001, .warmup_num_steps = 1000});
  CHECK(s.warmup_steps() == 1000);
  CHECK(s.lr_at(-1) == 0.0);                   // before the first scheduler step: warmup_min_lr
  CHECK(s.lr_at(0) == 0.0);                    // 0 + 0.001 * ln(1) / ln(1000) = 0
  CHECK(s.lr_at(9) == 0.0003333333333333334);  // 0.001 * ln(10) / ln(1000) = 0.001 / 3
  CHECK(s.lr_at(99) == 0.0006666666666666668); // 0.001 * ln(100) / ln(1000) = 0.002 / 3
  CHECK(s.lr_at(999) == 0.001);                // 0.001 * ln(1000) / ln(1000)
  CHECK(s.lr_at(1000) == 0.001);               // i >= W: gamma = 1
  CHECK(s.lr_at(5000) == 0.001);
}

TEST_CASE("WarmupLR, linear warmup from a non-zero minimum") {
  const zero::warmup_lr s({.warmup_min_lr = 1e-5,
                           .warmup_max_lr = 1e-3,
                           .warmup_num_steps = 1000,
                           .warmup_type = zero::warmup_type::linear});
  CHECK(s.lr_at(-1) == 1e-5);
  CHECK(s.lr_at(0) == 1e-5);         // 1e-5 + 0.00099 * 0 / 1000
  CHECK(s.lr_at(250) == 0.0002575);  // 1e-5 + 0.00099 * 250 / 1000 = 1e-5 + 2.475e-4
  CHECK(s.lr_at(999) == 0.00099901); // 1e-5 + 0.00099 * 0.999 = 1e-5 + 9.8901e-4
  CHECK(s.lr_at(1000) == 0.001);     // 1e-5 + 0.00099 * 1
}

TEST_CASE("WarmupLR: warmup_num_steps below 2 counts as 2") {
  const zero::warmup_lr s({.warmup_min_lr = 0.0, .warmup_max_lr = 0.001, .warmup_num_steps = 0});
  CHECK(s.warmup_steps() == 2);
  CHECK(s.lr_at(0) == 0.0);   // ln(1) / ln(2) = 0
  CHECK(s.lr_at(1) == 0.001); // ln(2) / ln(2) = 1
  CHECK(s.lr_at(2) == 0.001);
}

TEST_CASE("WarmupDecayLR") {
  const zero::warmup_decay_lr s({{.warmup_min_lr = 0.0,
                                  .warmup_max_lr = 0.001,
                                  .warmup_num_steps = 1000,
                                  .warmup_type = zero::warmup_type::linear},
                                 2000});
  CHECK(s.total_num_steps() == 2000);
  CHECK(s.lr_at(-1) == 0.0);
  CHECK(s.lr_at(500) == 0.0005);  // warmup: 0.001 * 500 / 1000
  CHECK(s.lr_at(1000) == 0.001);  // decay: (2000 - 1000) / max(1, 2000 - 1000) = 1
  CHECK(s.lr_at(1500) == 0.0005); // (2000 - 1500) / 1000 = 0.5
  CHECK(s.lr_at(1999) == 1e-06);  // 1 / 1000 * 0.001
  CHECK(s.lr_at(2000) == 0.0);    // 0 / 1000
  CHECK(s.lr_at(2500) == 0.0);    // max(0, -500 / 1000)

  const zero::warmup_decay_lr log_warmup(
      {{.warmup_min_lr = 0.0, .warmup_max_lr = 0.001, .warmup_num_steps = 1000}, 2000});
  CHECK(log_warmup.lr_at(9) == 0.0003333333333333334); // as WarmupLR: 0.001 * ln(10) / ln(1000)

  // total_num_steps below the warmup (DeepSpeed only warns): right after the warmup gamma is
  // max(0, (500 - 1000) / max(1, 500 - 1000)) = max(0, -500) = 0, so the lr is warmup_min_lr.
  const zero::warmup_decay_lr short_run({{.warmup_min_lr = 1e-4,
                                          .warmup_max_lr = 0.001,
                                          .warmup_num_steps = 1000,
                                          .warmup_type = zero::warmup_type::linear},
                                         500});
  CHECK(short_run.lr_at(1000) == 0.0001);
}

TEST_CASE("WarmupCosineLR") {
  const zero::warmup_cosine_lr s({.base_lr = 0.01,
                                  .total_num_steps = 1100,
                                  .warmup_min_ratio = 0.1,
                                  .warmup_num_steps = 100,
                                  .cos_min_ratio = 0.0001,
                                  .warmup_type = zero::warmup_type::linear});
  CHECK(s.ratio_at(-1) == 0.0); // DeepSpeed's get_lr before the first step returns 0
  CHECK(s.lr_at(-1) == 0.0);
  CHECK(s.ratio_at(0) == 0.1);   // 0.1 + (0 / 100) * (1 - 0.1)
  CHECK(s.lr_at(0) == 0.001);    // 0.01 * 0.1
  CHECK(s.ratio_at(50) == 0.55); // 0.1 + 0.5 * 0.9
  CHECK(s.lr_at(50) == 0.0055000000000000005);
  CHECK(s.ratio_at(99) == 0.991); // 0.1 + 0.99 * 0.9
  // Cosine phase: real_last_step = i - W + 1, real_total_steps = T - W = 1000,
  // ratio = max(0, 1e-4 + (1 - 1e-4) * (1 + cos(pi * real_last_step / 1000)) / 2).
  CHECK(s.ratio_at(100) == 0.9999975328476691); // step 1: (1 + cos(pi / 1000)) / 2 = 0.99999753...
  CHECK(s.lr_at(100) == 0.009999975328476692);
  CHECK(s.ratio_at(599) == 0.50005); // step 500: cos(pi / 2) = 0 -> 1e-4 + 0.9999 * 0.5
  CHECK(s.lr_at(599) == 0.0050005);
  CHECK(s.ratio_at(1099) == 0.0001); // step 1000: cos(pi) = -1 -> cos_min_ratio
  CHECK(s.lr_at(1099) == 1.0000000000000002e-06);
  CHECK(s.ratio_at(1599) == 0.5000499999999999); // past T DeepSpeed's cosine rises again: cos(1.5 pi)

  const zero::warmup_cosine_lr log_warmup({.base_lr = 0.01,
                                           .total_num_steps = 1100,
                                           .warmup_min_ratio = 0.1,
                                           .warmup_num_steps = 100,
                                           .cos_min_ratio = 0.0001});
  CHECK(log_warmup.ratio_at(9) == 0.5499999999999999); // 0.1 + (ln(10) / ln(100)) * 0.9 = 0.1 + 0.5 * 0.9
}

TEST_CASE("WarmupCosineLR refuses a total_num_steps that leaves no cosine phase") {
  CHECK_THROWS_WITH_AS(zero::warmup_cosine_lr({.total_num_steps = 100, .warmup_num_steps = 100}),
                       doctest::Contains("scheduler.params.total_num_steps (100) must be larger than "
                                         "warmup_num_steps (100"),
                       zero::config_error);
  CHECK_THROWS_AS(zero::warmup_cosine_lr({.total_num_steps = 2, .warmup_num_steps = 0}), zero::config_error);
  CHECK_NOTHROW(zero::warmup_cosine_lr({.total_num_steps = 3, .warmup_num_steps = 0}));
}

TEST_CASE("warmup_type parsing and finite values") {
  CHECK(zero::parse_warmup_type("log") == zero::warmup_type::log);
  CHECK(zero::parse_warmup_type("linear") == zero::warmup_type::linear);
  CHECK_THROWS_WITH_AS((void)zero::parse_warmup_type("cosine"),
                       "[zero.config_error] scheduler.params.warmup_type: unknown value \"cosine\"; expected "
                       "\"log\" or \"linear\"",
                       zero::config_error);
  CHECK_THROWS_AS(zero::warmup_lr({.warmup_max_lr = std::numeric_limits<double>::quiet_NaN()}), zero::config_error);
}

TEST_CASE("lr_scheduler counts DeepSpeed's last_batch_iteration") {
  zero::lr_scheduler sched(zero::warmup_lr({.warmup_min_lr = 1e-5,
                                            .warmup_max_lr = 1e-3,
                                            .warmup_num_steps = 1000,
                                            .warmup_type = zero::warmup_type::linear}));
  CHECK(sched.last_batch_iteration() == -1);
  CHECK(sched.lr() == 1e-5);   // the first optimizer step runs with iteration -1's lr
  CHECK(sched.step() == 1e-5); // iteration 0
  for (int i = 0; i < 250; ++i) {
    sched.step();
  }
  CHECK(sched.last_batch_iteration() == 250);
  CHECK(sched.lr() == 0.0002575);
  // WarmupLR overrides every group's lr with its own.
  CHECK(sched.group_lr(0.5) == 0.0002575);
  sched.set_last_batch_iteration(999);
  CHECK(sched.lr() == 0.00099901);

  zero::lr_scheduler cosine(zero::warmup_cosine_lr({.base_lr = 0.01,
                                                    .total_num_steps = 1100,
                                                    .warmup_min_ratio = 0.1,
                                                    .warmup_num_steps = 100,
                                                    .cos_min_ratio = 0.0001,
                                                    .warmup_type = zero::warmup_type::linear}));
  cosine.set_last_batch_iteration(50);
  CHECK(cosine.lr() == 0.0055000000000000005);
  CHECK(cosine.group_lr(0.02) == 0.02 * 0.55); // WarmupCosineLR scales each group's own lr

  zero::lr_scheduler constant(zero::constant_lr(3e-4));
  CHECK(constant.lr() == 3e-4);
  constant.step();
  CHECK(constant.lr() == 3e-4);
  CHECK(constant.group_lr(0.1) == 0.1);
}

// LRRangeTest and OneCycle: the expected values are what DeepSpeed 0.19.8's classes (its sdist's
// deepspeed/runtime/lr_schedules.py, run with a stub optimizer of one parameter group) set the group's lr and betas
// to after construction (i = -1) and after each scheduler step; repr() of the Python doubles.

TEST_CASE("LRRangeTest, continuous and in stairs") {
  const zero::lr_range_test s({.min_lr = 1e-3, .step_size = 3, .step_rate = 2.0});
  CHECK(s.lr_at(-1) == 0.001);
  CHECK(s.lr_at(0) == 0.0016666666666666666); // 1e-3 * (1 + 2 * 1 / 3)
  CHECK(s.lr_at(1) == 0.002333333333333333);
  CHECK(s.lr_at(2) == 0.003);
  CHECK(s.lr_at(4) == 0.004333333333333334);
  CHECK(s.lr_at(6) == 0.005666666666666667);
  const zero::lr_range_test stairs({.min_lr = 1e-3, .step_size = 3, .step_rate = 2.0, .staircase = true});
  const double expected[] = {0.001, 0.001, 0.001, 0.003, 0.003, 0.003, 0.005, 0.005}; // i = -1 .. 6
  for (int i = -1; i <= 6; ++i) {
    CAPTURE(i);
    CHECK(stairs.lr_at(i) == expected[i + 1]);
  }
  CHECK_THROWS_WITH_AS(zero::lr_range_test({.step_size = 0}),
                       doctest::Contains("scheduler.params.lr_range_test_step_size must be a positive integer, got 0"),
                       zero::config_error);
}

TEST_CASE("OneCycle: the lr and beta1 through an uneven cycle, then the decay") {
  const zero::one_cycle s({.cycle_min_lr = 1e-4,
                           .cycle_max_lr = 1e-3,
                           .decay_lr_rate = 0.5,
                           .cycle_first_step_size = 4,
                           .cycle_second_step_size = 6,
                           .decay_step_size = 2,
                           .decay_mom_rate = 0.01});
  // i = -1 .. 13: the cycle is 10 steps (4 up, 6 down), then the decay.
  const double lr[] = {0.0001,
                       0.0003250000000000002,
                       0.0005499999999999999,
                       0.0007750000000000001,
                       0.0009999999999999998,
                       0.0008500000000000001,
                       0.0006999999999999999,
                       0.0005500000000000001,
                       0.0003999999999999999,
                       0.00025000000000000017,
                       0.0001,
                       8e-05,
                       6.666666666666667e-05,
                       5.714285714285715e-05,
                       5e-05};
  const double beta1[] = {0.8,
                          0.875,
                          0.8500000000000001,
                          0.8250000000000001,
                          0.8,
                          0.8166666666666667,
                          0.8333333333333334,
                          0.85,
                          0.8666666666666667,
                          0.8833333333333333,
                          0.9,
                          0.9045,
                          0.909,
                          0.9135,
                          0.918};
  for (int i = -1; i <= 13; ++i) {
    CAPTURE(i);
    CHECK(s.lr_at(i) == lr[i + 1]);
    const auto betas = s.betas_at(i);
    REQUIRE(betas.has_value());
    CHECK((*betas)[0] == beta1[i + 1]);
    CHECK((*betas)[1] == 0.99); // DeepSpeed pairs every beta1 with 0.99
  }
}

TEST_CASE("OneCycle: stairs in each half, no momentum cycle, no decay") {
  const zero::one_cycle s({.cycle_min_lr = 1e-4,
                           .cycle_max_lr = 1e-3,
                           .cycle_first_step_size = 5,
                           .cycle_second_step_size = 4,
                           .cycle_first_stair_count = 2,
                           .cycle_second_stair_count = 3,
                           .cycle_momentum = false});
  const double lr[] = {0.0001, 0.0001, 0.0001, 0.00055, 0.00055, 0.001, 0.0007, 0.00039999999999999996,
                       0.0001, 0.0001, 0.0001, 0.0001,  0.0001}; // i = -1 .. 11
  for (int i = -1; i <= 11; ++i) {
    CAPTURE(i);
    CHECK(s.lr_at(i) == lr[i + 1]);
    CHECK_FALSE(s.betas_at(i).has_value()); // the optimizer's betas stay
  }
}

TEST_CASE("OneCycle: DeepSpeed's defaults (second half = first, no decay), and what it refuses") {
  const zero::one_cycle s({.cycle_min_lr = 2e-4, .cycle_max_lr = 2e-3, .cycle_first_step_size = 3});
  const double lr[] = {0.0002,
                       0.0008000000000000003,
                       0.0013999999999999998,
                       0.002,
                       0.0014000000000000006,
                       0.0007999999999999994,
                       0.0002,
                       0.0002,
                       0.0002}; // i = -1 .. 7
  const double beta1[] = {
      0.8, 0.8666666666666667, 0.8333333333333334, 0.8, 0.8333333333333334, 0.8666666666666667, 0.9, 0.9, 0.9};
  for (int i = -1; i <= 7; ++i) {
    CAPTURE(i);
    CHECK(s.lr_at(i) == lr[i + 1]);
    CHECK((*s.betas_at(i))[0] == beta1[i + 1]);
  }
  CHECK_THROWS_WITH_AS(zero::one_cycle({.cycle_first_step_size = 0}),
                       doctest::Contains("cycle_first_step_size must be positive"), zero::config_error);
  CHECK_THROWS_WITH_AS(zero::one_cycle({.cycle_second_step_size = -1.0}),
                       doctest::Contains("cycle_second_step_size non-negative"), zero::config_error);
  CHECK_THROWS_AS(zero::one_cycle({.cycle_max_lr = std::numeric_limits<double>::infinity()}), zero::config_error);
  CHECK_THROWS_WITH_AS(zero::one_cycle({.cycle_second_stair_count = -2}),
                       doctest::Contains("must not be negative, got 0, -2 and 0.000000"), zero::config_error);
}

TEST_CASE("lr_scheduler: OneCycle sets every group's lr and Adam's betas; the other schedules keep the optimizer's") {
  zero::lr_scheduler sched(zero::one_cycle({.cycle_min_lr = 2e-4, .cycle_max_lr = 2e-3, .cycle_first_step_size = 3}));
  const std::array<double, 2> adam{0.9, 0.999};
  CHECK(sched.betas(adam) == std::array<double, 2>{0.8, 0.99}); // the first step: cycle_min_mom
  CHECK(sched.group_lr(0.5) == 0.0002);
  sched.step();
  CHECK(sched.betas(adam) == std::array<double, 2>{0.8666666666666667, 0.99});
  CHECK(sched.group_lr(0.5) == 0.0008000000000000003);

  zero::lr_scheduler range(zero::lr_range_test({.min_lr = 1e-3, .step_size = 3, .step_rate = 2.0}));
  range.step();
  CHECK(range.group_lr(0.5) == 0.0016666666666666666);
  CHECK(range.betas(adam) == adam);
  zero::lr_scheduler warmup(zero::warmup_lr(zero::warmup_lr_params{}));
  CHECK(warmup.betas(adam) == adam);
}
