#pragma once
// Reading the IDX files of (Fashion-)MNIST, gzip-compressed as Debian's dataset-fashion-mnist ships
// them, through zlib. Every failure names the file and what was expected.

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>
#include <zero/core/error.hpp>
#include <zlib.h>

namespace fmnist {

/// An IDX file: dimensions and the raw unsigned bytes.
struct idx_data {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> bytes;
  [[nodiscard]] std::size_t items() const { return dims.empty() ? 0 : dims[0]; }
  [[nodiscard]] std::size_t item_size() const {
    std::size_t n = 1;
    for (std::size_t d = 1; d < dims.size(); ++d) {
      n *= dims[d];
    }
    return n;
  }
};

/// Reads a gzip'd (or plain) IDX file of unsigned bytes with `expected_dims` dimensions.
/// \throws zero::io_error naming the file when it is missing, unreadable, not IDX, of another
/// element type or rank, or shorter than its header says.
inline idx_data read_idx(const std::filesystem::path& path, std::size_t expected_dims) {
  const std::string name = path.string();
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) {
    throw zero::io_error(name + ": no such file; Fashion-MNIST comes from Debian's dataset-fashion-mnist "
                                "package (apt-get install dataset-fashion-mnist) or --data DIR");
  }
  if (!fs::is_regular_file(st)) {
    // Named as what it is: a folder is no missing file, and opening a FIFO would block.
    const char* kind = fs::is_directory(st)        ? "a directory"
                       : fs::is_fifo(st)           ? "a FIFO"
                       : fs::is_character_file(st) ? "a character device"
                       : fs::is_block_file(st)     ? "a block device"
                       : fs::is_socket(st)         ? "a socket"
                                                   : "not a regular file";
    throw zero::io_error(name + ": " + kind + "; expected a gzip'd IDX file (a regular file)");
  }
  gzFile f = gzopen(name.c_str(), "rb");
  if (f == nullptr) {
    throw zero::io_error(name + ": cannot open: " + std::strerror(errno), errno);
  }
  struct closer {
    gzFile f;
    ~closer() { gzclose(f); }
  } guard{f};
  auto read_exact = [&](void* dst, std::size_t n, const char* what) {
    std::size_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - done, 1u << 30));
      const int got = gzread(f, static_cast<char*>(dst) + done, chunk);
      if (got < 0) {
        int errnum = 0;
        throw zero::io_error(name + ": gzip error while reading the " + what + ": " + gzerror(f, &errnum));
      }
      if (got == 0) {
        throw zero::io_error(name + ": file ends after " + std::to_string(done) + " of " + std::to_string(n) +
                             " bytes of the " + what + "; the file is truncated");
      }
      done += static_cast<std::size_t>(got);
    }
  };
  unsigned char magic[4];
  read_exact(magic, 4, "header");
  if (magic[0] != 0 || magic[1] != 0) {
    throw zero::io_error(name + ": not an IDX file (the first two bytes must be zero)");
  }
  if (magic[2] != 0x08) {
    throw zero::io_error(name + ": IDX element type 0x" + std::to_string(magic[2]) + " is not unsigned byte (0x08)");
  }
  if (magic[3] != expected_dims) {
    throw zero::io_error(name + ": IDX file has " + std::to_string(magic[3]) + " dimensions, expected " +
                         std::to_string(expected_dims));
  }
  idx_data out;
  std::size_t total = 1;
  for (std::size_t d = 0; d < expected_dims; ++d) {
    unsigned char be[4];
    read_exact(be, 4, "header");
    const std::uint32_t v = (std::uint32_t{be[0]} << 24) | (std::uint32_t{be[1]} << 16) | (std::uint32_t{be[2]} << 8) |
                            std::uint32_t{be[3]};
    if (v == 0 || v > (1u << 24)) {
      throw zero::io_error(name + ": IDX dimension " + std::to_string(d) + " is " + std::to_string(v) +
                           ", outside 1..16777216");
    }
    out.dims.push_back(v);
    total *= v;
  }
  if (total > (std::size_t{1} << 31)) {
    throw zero::io_error(name + ": IDX header promises " + std::to_string(total) + " bytes, more than 2 GiB");
  }
  out.bytes.resize(total);
  read_exact(out.bytes.data(), total, "data");
  return out;
}

/// A split of the data set: images scaled to [0, 1] and labels 0..9.
struct dataset {
  std::size_t count = 0;
  std::size_t pixels = 0;
  std::vector<float> images;
  std::vector<int> labels;
};

/// Loads `<dir>/<prefix>-images-idx3-ubyte.gz` and the labels beside it ("train" or "t10k").
/// \throws zero::io_error when a file is bad or image and label counts differ.
inline dataset load(const std::filesystem::path& dir, const std::string& prefix) {
  const auto images = read_idx(dir / (prefix + "-images-idx3-ubyte.gz"), 3);
  const auto labels = read_idx(dir / (prefix + "-labels-idx1-ubyte.gz"), 1);
  if (images.items() != labels.items()) {
    throw zero::io_error((dir / prefix).string() + ": " + std::to_string(images.items()) + " images but " +
                         std::to_string(labels.items()) + " labels");
  }
  dataset d;
  d.count = images.items();
  d.pixels = images.item_size();
  d.images.resize(images.bytes.size());
  for (std::size_t i = 0; i < images.bytes.size(); ++i) {
    d.images[i] = static_cast<float>(images.bytes[i]) / 255.0f;
  }
  d.labels.resize(d.count);
  for (std::size_t i = 0; i < d.count; ++i) {
    if (labels.bytes[i] > 9) {
      throw zero::io_error((dir / (prefix + "-labels-idx1-ubyte.gz")).string() + ": label " +
                           std::to_string(labels.bytes[i]) + " at item " + std::to_string(i) + " is outside 0..9");
    }
    d.labels[i] = labels.bytes[i];
  }
  return d;
}

} // namespace fmnist
