#pragma once
// Helpers shared by the safetensors tests: a self-removing temporary directory and raw file writes
// for hand-made (hostile) files.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>

namespace zero_test {

/// A fresh directory under `base` (the system temp directory unless given), removed with everything in it.
class temp_dir {
public:
  explicit temp_dir(std::string_view tag, const std::filesystem::path& base = std::filesystem::temp_directory_path()) {
    static int counter = 0;
    path_ = base / ("zero_" + std::string(tag) + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] std::filesystem::path operator/(std::string_view name) const { return path_ / name; }
  [[nodiscard]] const std::filesystem::path& path() const { return path_; }

private:
  std::filesystem::path path_;
};

/// Writes `bytes` to `path` as they are.
inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The 8-byte little-endian encoding of `n`.
inline std::string le64(std::uint64_t n) {
  std::string s(8, '\0');
  for (std::size_t i = 0; i < 8; ++i) {
    s[i] = static_cast<char>((n >> (8 * i)) & 0xffu);
  }
  return s;
}

/// A safetensors file made by hand: the length of `header`, `header`, then `data_bytes` zero bytes.
inline void write_safetensors(const std::filesystem::path& path, std::string_view header, std::size_t data_bytes) {
  write_bytes(path, le64(header.size()) + std::string(header) + std::string(data_bytes, '\0'));
}

} // namespace zero_test
