// libFuzzer target for zero::config: any bytes must either give a config or throw
// zero::config_error; nothing else may escape, crash, leak or trip a sanitizer.
//
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Iinclude tests/config/fuzz_config.cpp
//   ./a.out -dict=tests/config/fuzz_config.dict corpus/ tests/config/data/

#include "zero/config/config.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // The first byte picks which inputs accompany the text, so "auto" resolution and the batch rule
  // are fuzzed too.
  zero::config_inputs in;
  if (size > 0) {
    const unsigned pick = data[0];
    if (pick & 1u) {
      in.world_size = static_cast<std::int64_t>(pick % 9);
    }
    if (pick & 2u) {
      in.hidden_size = 1 + static_cast<std::int64_t>(pick) * 64;
    }
    if (pick & 4u) {
      in.micro_batch_size = 1 + (pick >> 5);
      in.lr = 1e-4;
      in.betas = std::array<double, 2>{0.9, 0.95};
      in.eps = 1e-8;
      in.weight_decay = 0.0;
      in.warmup_steps = 10;
      in.total_steps = 100;
      in.max_grad_norm = 1.0;
    }
    if (pick & 8u) {
      in.precision = (pick & 16u) ? zero::dtype::bf16 : zero::dtype::f16;
    }
    if (pick & 32u) {
      in.gather_16bit_weights_on_model_save = true;
    }
  }
  try {
    const zero::config c = zero::config::from_string(text, in, "fuzz");
    // What a config writes must read back to the same config.
    zero::config_inputs again;
    again.world_size = c.world_size;
    const zero::config back = zero::config::from_json(c.to_json(), again);
    if (back.to_json() != c.to_json()) {
      std::abort();
    }
    static_cast<void>(c.rebatched(c.world_size));
  } catch (const zero::config_error&) {
    // Refusing is fine; any other exception escapes and libFuzzer reports it.
  }
  return 0;
}
