#pragma once
/// \file
/// `safetensors::writer`: one safetensors file (see zero/io/safetensors.hpp), streamed in any chunking
/// and published only when every byte is there.

#include "zero/core/detail/os_path.hpp"
#include "zero/core/dtype.hpp"
#include "zero/core/error.hpp"
#include "zero/io/safetensors_format.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::safetensors {

/// Writes one safetensors file. The header goes out in the constructor; `write` then takes the data
/// section in declaration order and any chunking; `close` checks that every byte came, syncs the
/// file and renames `<path>.tmp` to `path`. Until `close` succeeds nothing exists at `path` (an
/// existing file there stays as it was); a writer destroyed without `close` removes `<path>.tmp`.
/// Not thread-safe: one thread writes.
class writer {
public:
  /// Opens `<path>.tmp` and writes the header.
  /// \param path     where the finished file goes.
  /// \param tensors  the tensors, in the order their bytes will be written.
  /// \param metadata free-form string pairs stored under "__metadata__" (left out when empty).
  /// \throws usage_error for an empty, duplicate, reserved or non-UTF-8 name, a negative extent,
  ///         more than `max_rank` dimensions,
  ///         a size that overflows 64 bits, or non-UTF-8 metadata.
  /// \throws io_error when `<path>.tmp` cannot be created or written (status() is errno).
  writer(std::filesystem::path path, std::vector<tensor_decl> tensors, std::map<std::string, std::string> metadata = {})
      : path_(std::move(path)), tmp_(path_) {
    tmp_ += ".tmp";
    // The header is written entry by entry, in declaration order, each tensor's fields in the order
    // the reference writer uses (one ordered_json object of thousands of entries would cost
    // quadratic time in key look-ups).
    const auto dump = [&](const nlohmann::ordered_json& v) {
      try {
        return v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
      } catch (const nlohmann::json::exception& e) {
        throw usage_error(detail::at(path_) + "a tensor name or metadata string is not valid UTF-8 (" + e.what() + ")");
      }
    };
    std::string text = "{";
    if (!metadata.empty()) {
      text += "\"__metadata__\":" + dump(metadata);
    }
    std::set<std::string> names;
    infos_.reserve(tensors.size());
    for (tensor_decl& d : tensors) {
      const std::string what = detail::at(path_) + "tensor '" + d.name + "': ";
      if (d.name.empty() || d.name == "__metadata__") {
        throw usage_error(detail::at(path_) + "tensor name \"" + d.name +
                          "\" is reserved; expected a non-empty name other than __metadata__");
      }
      if (!names.insert(d.name).second) {
        throw usage_error(what + "declared twice; expected unique tensor names");
      }
      if (d.shape.size() > max_rank) {
        throw usage_error(what + "has " + std::to_string(d.shape.size()) + " dimensions; expected at most " +
                          std::to_string(max_rank));
      }
      const std::optional<std::uint64_t> bytes = detail::byte_size(d.type, d.shape);
      if (!bytes) {
        throw usage_error(what + "shape " + detail::shape_text(d.shape) +
                          " has a negative extent or a byte size over 2^64; expected extents >= 0");
      }
      if (*bytes > std::numeric_limits<std::uint64_t>::max() - data_size_) {
        throw usage_error(what + "the data section would exceed 2^64 bytes");
      }
      text += (text.size() > 1 ? "," : "") + dump(d.name) + ":" +
              dump({{"dtype", std::string(detail::format_name(d.type))},
                    {"shape", d.shape},
                    {"data_offsets", {data_size_, data_size_ + *bytes}}});
      infos_.push_back(tensor_info{std::move(d.name), d.type, std::move(d.shape), data_size_, data_size_ + *bytes});
      data_size_ += *bytes;
    }
    text += "}";
    // Spaces pad the header so that the data section starts at a multiple of 8 bytes.
    text.append((8 - text.size() % 8) % 8, ' ');
    std::array<std::byte, 8> length{};
    for (std::size_t i = 0; i < 8; ++i) {
      length[i] = static_cast<std::byte>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xffu);
    }

    ::zero::detail::check_os_path<io_error>("safetensors file", tmp_.native());
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int err = errno;
      throw io_error(detail::at(tmp_) + "cannot create: " + std::strerror(err), err);
    }
    int err = detail::write_all(fd_, length.data(), length.size());
    if (err == 0) {
      err = detail::write_all(fd_, reinterpret_cast<const std::byte*>(text.data()), text.size());
    }
    if (err != 0) {
      discard();
      throw io_error(detail::at(tmp_) + "cannot write the header: " + std::strerror(err), err);
    }
  }

  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;
  /// Takes over `other`'s file; `other` is left closed and owns nothing.
  writer(writer&& other) noexcept
      : path_(std::move(other.path_)), tmp_(std::move(other.tmp_)), infos_(std::move(other.infos_)),
        data_size_(other.data_size_), written_(other.written_), fd_(std::exchange(other.fd_, -1)) {}
  writer& operator=(writer&&) = delete;

  /// Removes `<path>.tmp` unless `close` succeeded; never throws.
  ~writer() { discard(); }

  /// Appends the next bytes of the data section (the tensors' bytes in declaration order, each
  /// row-major and little-endian), in chunks of any size including 0.
  /// \throws usage_error after `close`, or when `bytes` goes past the end of the last tensor.
  /// \throws io_error when the write fails (status() is errno).
  void write(std::span<const std::byte> bytes) {
    if (fd_ < 0) {
      throw usage_error(detail::at(path_) + "write after close");
    }
    if (bytes.size() > data_size_ - written_) {
      throw usage_error(detail::at(path_) + "write of " + std::to_string(bytes.size()) + " bytes after " +
                        std::to_string(written_) + " goes past the end of the data section; expected at most " +
                        std::to_string(data_size_ - written_) + " more bytes");
    }
    if (const int err = detail::write_all(fd_, bytes.data(), bytes.size()); err != 0) {
      throw io_error(detail::at(tmp_) + "write failed: " + std::strerror(err), err);
    }
    written_ += bytes.size();
  }

  /// Checks that every byte was written, syncs the file and renames it to `path`.
  /// \throws io_error naming the first tensor short of bytes, or when sync or rename fails; the
  ///         file at `path` is then untouched and `<path>.tmp` is removed by the destructor.
  /// \throws usage_error when called twice.
  void close() {
    if (fd_ < 0) {
      throw usage_error(detail::at(path_) + "close called twice");
    }
    if (written_ != data_size_) {
      const auto short_one =
          std::find_if(infos_.begin(), infos_.end(), [&](const tensor_info& t) { return t.end > written_; });
      // short_one exists: written_ < data_size_ == the last tensor's end.
      throw io_error(detail::at(path_) + "incomplete: tensor '" + short_one->name + "' has " +
                     std::to_string(written_ - std::min(written_, short_one->begin)) + " of " +
                     std::to_string(short_one->size()) + " bytes; expected " + std::to_string(data_size_) +
                     " data bytes in all, got " + std::to_string(written_));
    }
    if (::fsync(fd_) != 0) {
      const int err = errno;
      throw io_error(detail::at(tmp_) + "fsync failed: " + std::strerror(err), err);
    }
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      throw io_error(detail::at(tmp_) + "close failed: " + std::strerror(err), err);
    }
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      throw io_error(detail::at(path_) + "cannot rename " + tmp_.string() + " to it: " + std::strerror(err), err);
    }
    // The rename is durable only once the directory entry is synced too.
    const std::filesystem::path dir = path_.has_parent_path() ? path_.parent_path() : std::filesystem::path(".");
    if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
      const int rc = ::fsync(dfd);
      const int err = errno;
      ::close(dfd);
      if (rc != 0 && err != EINVAL) {
        throw io_error(detail::at(dir) + "fsync of the directory failed: " + std::strerror(err), err);
      }
    }
  }

  /// The tensors with the byte ranges they get in the data section.
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return infos_; }
  /// Bytes the data section holds when complete.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return data_size_; }
  /// Bytes of the data section written so far.
  [[nodiscard]] std::uint64_t bytes_written() const noexcept { return written_; }

private:
  void discard() noexcept {
    if (fd_ >= 0) {
      ::close(std::exchange(fd_, -1));
      ::unlink(tmp_.c_str());
    }
  }

  std::filesystem::path path_;
  std::filesystem::path tmp_;
  std::vector<tensor_info> infos_;
  std::uint64_t data_size_ = 0;
  std::uint64_t written_ = 0;
  int fd_ = -1;
};

} // namespace zero::safetensors
