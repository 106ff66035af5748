// The README's `config::from_file(path, {.world_size = comm.size()})`: designated initializers that
// name some members of config_inputs (and of batch_spec) and leave the others out. This file is
// compiled with -Wmissing-field-initializers -Werror (CMakeLists.txt): GCC warns about every member
// left out that has no default member initializer.

#include "zero/config/config.hpp"

#include <doctest/doctest.h>

TEST_CASE("config_inputs and batch_spec take designated initializers for any subset of their members") {
  const zero::config c = zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 2})", {.world_size = 4});
  CHECK(c.world_size == 4);
  CHECK(c.train_batch_size == 8);

  const zero::config_inputs hf{.world_size = 2, .micro_batch_size = 8, .lr = 3e-5, .precision = zero::dtype::bf16};
  CHECK_FALSE(hf.hidden_size.has_value());
  CHECK_FALSE(hf.gather_16bit_weights_on_model_save.has_value());
  const zero::config h =
      zero::config::from_string(R"({"optimizer": {"type": "AdamW"}, "bf16": {"enabled": "auto"}})", hf);
  CHECK(h.train_batch_size == 16);
  CHECK(h.optimizer->lr == 3e-5);
  CHECK(h.bf16.enabled);

  const zero::batch_sizes b = zero::resolve_batch({.train_batch_size = 64, .gradient_accumulation_steps = 2}, 4);
  CHECK(b.train_micro_batch_size_per_gpu == 8);
}
