// libFuzzer target for zero::safetensors::reader: any bytes must either open as a file whose
// tensors tile the data section and read back in full, or throw zero::checkpoint_error; nothing
// else may escape, crash, leak or trip a sanitizer.
//
//   clang++ -std=c++20 -fsanitize=fuzzer,address,undefined -Iinclude tests/io/fuzz_safetensors.cpp
//   ./a.out -dict=tests/io/fuzz_safetensors.dict corpus/ tests/io/fuzz_seeds/

#include "zero/io/safetensors.hpp"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

namespace {

/// A memory-backed file holding the input, named through /proc so the reader opens it by path.
class memory_file {
public:
  memory_file() : fd_(::memfd_create("zero_safetensors_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::abort();
    }
  }
  ~memory_file() { ::close(fd_); }
  std::string fill(const std::uint8_t* data, std::size_t size) {
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, data, size, 0) != static_cast<ssize_t>(size)) {
      std::abort();
    }
    return "/proc/self/fd/" + std::to_string(fd_);
  }

private:
  int fd_;
};

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static memory_file file;
  const std::string path = file.fill(data, size);
  try {
    const zero::safetensors::reader r(path);
    std::uint64_t expected = 0;
    std::vector<std::byte> buffer;
    for (const zero::safetensors::tensor_info& t : r.tensors()) {
      // The header was validated: ranges tile the data section, sizes match shape x dtype, names
      // are unique, and every byte is readable.
      if (t.begin != expected || t.end < t.begin || r.find(t.name) != &t ||
          t.size() != zero::safetensors::detail::byte_size(t.type, t.shape).value_or(~std::uint64_t{0})) {
        std::abort();
      }
      expected = t.end;
      buffer.resize(static_cast<std::size_t>(t.size()));
      r.read(t, 0, buffer);
    }
    if (expected != r.data_size() || 8 + r.data_size() > size) {
      std::abort();
    }
  } catch (const zero::checkpoint_error&) {
    // Refusing is fine; any other exception escapes and libFuzzer reports it.
  }
  return 0;
}
