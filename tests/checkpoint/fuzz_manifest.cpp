// libFuzzer target for the checkpoint manifest reader: any bytes must either give a manifest that
// writes and reads back to itself, or throw zero::checkpoint_error; nothing else may escape, crash,
// leak, trip a sanitizer or allocate beyond libFuzzer's limit (sizes read from the text are capped).
//
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Iinclude tests/checkpoint/fuzz_manifest.cpp
//   ./a.out -dict=tests/checkpoint/fuzz_manifest.dict corpus/ tests/checkpoint/fuzz_seeds/

#include "zero/checkpoint/manifest.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = zero::checkpoint::manifest::parse(text, "fuzz");
    const auto j = m.to_json();
    const auto back = zero::checkpoint::manifest::parse(j.dump(), "fuzz");
    if (back.to_json() != j) {
      std::abort();
    }
  } catch (const zero::checkpoint_error&) {
    // Refusing is fine; any other exception escapes and libFuzzer reports it.
  }
  return 0;
}
