#pragma once
/// \file
/// DeepSpeed's batch rule, `zero::resolve_batch` (declared in config.hpp): train = micro x
/// accumulation x world size, any one derived from the other two.

#include "zero/config/config.hpp" // batch_spec, batch_sizes and the declaration defined here

#include <cstdint>
#include <string>
#include <string_view>

namespace zero {

inline batch_sizes resolve_batch(const batch_spec& given, std::int64_t world) {
  const auto fail = [](const std::string& what) -> void {
    throw config_error(detail::cat("train_batch_size: ", what));
  };
  if (world < 1) {
    fail(detail::cat("the world size must be >= 1, found ", std::to_string(world)));
  }
  auto mul = [&](std::int64_t a, std::int64_t b) {
    std::int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) {
      fail(
          detail::cat("the batch sizes overflow a 64-bit integer (", std::to_string(a), " x ", std::to_string(b), ")"));
    }
    return r;
  };
  const auto& t = given.train_batch_size;
  const auto& m = given.train_micro_batch_size_per_gpu;
  const auto& g = given.gradient_accumulation_steps;
  const std::string w = std::to_string(world);
  // train / (given x world size), which must come out whole: the one key of the three not given.
  const auto derive = [&](std::string_view given_key, std::int64_t given_value, std::string_view derived_key) {
    const std::int64_t per = mul(given_value, world);
    if (*t % per != 0) {
      fail(detail::cat(std::to_string(*t), " is not a multiple of ", given_key, " ", std::to_string(given_value),
                       " x world size ", w, " = ", std::to_string(per), ", so ", derived_key, " cannot be derived"));
    }
    return *t / per;
  };
  batch_sizes out;
  if (t && m && g) {
    const std::int64_t product = mul(mul(*m, *g), world);
    if (*t != product) {
      fail(std::to_string(*t) + " != train_micro_batch_size_per_gpu " + std::to_string(*m) +
           " x gradient_accumulation_steps " + std::to_string(*g) + " x world size " + w + " = " +
           std::to_string(product) + "; give values that agree, or leave one out (or \"auto\") to derive it");
    }
    out = {*t, *m, *g};
  } else if (t && m) {
    out = {*t, *m, derive("train_micro_batch_size_per_gpu", *m, "gradient_accumulation_steps")};
  } else if (t && g) {
    out = {*t, derive("gradient_accumulation_steps", *g, "train_micro_batch_size_per_gpu"), *g};
  } else if (m && g) {
    out = {mul(mul(*m, *g), world), *m, *g};
  } else if (t) {
    // DeepSpeed: accumulation 1, micro = train / world.
    if (*t % world != 0) {
      fail(std::to_string(*t) + " is not a multiple of the world size " + w +
           ", so train_micro_batch_size_per_gpu cannot be derived (with gradient_accumulation_steps 1)");
    }
    out = {*t, *t / world, 1};
  } else if (m) {
    out = {mul(*m, world), *m, 1};
  } else {
    std::string what = "missing; give train_batch_size or train_micro_batch_size_per_gpu (DeepSpeed needs one)";
    if (given.micro_was_auto) {
      what = "cannot be derived: train_micro_batch_size_per_gpu is \"auto\" and no micro batch size was given; "
             "give it (config_inputs::micro_batch_size, --micro-batch-size) or write train_batch_size";
    }
    if (g) {
      what += "; gradient_accumulation_steps alone is not enough";
    }
    fail(what);
  }
  return out;
}

} // namespace zero
