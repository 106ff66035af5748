#pragma once
// Helpers shared by the config tests.

#include "zero/config/config.hpp"

#include <doctest/doctest.h>
#include <initializer_list>
#include <string>
#include <string_view>

namespace zero_test {

/// Test data directory (set by CMake).
inline std::string data(std::string_view file) { return std::string(ZERO_CONFIG_TEST_DATA) + "/" + std::string(file); }

/// The message of the config_error that reading `text` throws; fails the test if none is thrown.
inline std::string error_of(std::string_view text, const zero::config_inputs& in = {}) {
  try {
    static_cast<void>(zero::config::from_string(text, in));
  } catch (const zero::config_error& e) {
    return e.what();
  }
  FAIL("expected a config_error for: " << text);
  return {};
}

/// True when `haystack` contains `needle`; prints both when it does not.
inline bool has(const std::string& haystack, std::string_view needle) {
  const bool found = haystack.find(needle) != std::string::npos;
  if (!found) {
    MESSAGE("looked for [" << needle << "] in [" << haystack << "]");
  }
  return found;
}

/// A config's text and a fragment of the message of the config_error that reading it throws.
struct refused_config {
  std::string_view text;
  std::string_view message;
};

/// Checks, for each of `cases`, that reading its text throws a config_error whose message has its fragment.
inline void check_refused(std::initializer_list<refused_config> cases) {
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK(has(error_of(c.text), c.message));
  }
}

/// Inputs a Hugging Face run would give: 4 ranks, micro batch 8, AdamW hyper-parameters, bf16.
inline zero::config_inputs hf_inputs() {
  zero::config_inputs in;
  in.world_size = 4;
  in.micro_batch_size = 8;
  in.gradient_accumulation_steps = 2;
  in.max_grad_norm = 1.0;
  in.lr = 3e-5;
  in.betas = std::array<double, 2>{0.9, 0.999};
  in.eps = 1e-8;
  in.weight_decay = 0.01;
  in.warmup_steps = 100;
  in.total_steps = 1000;
  in.precision = zero::dtype::bf16;
  in.hidden_size = 4096;
  return in;
}

} // namespace zero_test
