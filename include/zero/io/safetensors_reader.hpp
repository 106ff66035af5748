#pragma once
/// \file
/// `safetensors::reader`: one safetensors file (see zero/io/safetensors.hpp) whose whole header, possibly
/// hostile, is validated up front; then bounds-checked `pread`s of byte ranges, from any thread.

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
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::safetensors {

/// Reads one safetensors file. The constructor validates the whole header against the file, so
/// every `tensor_info` it hands out lies inside the data section; `read` is then a bounds-checked
/// `pread`, safe to call from several threads at once.
class reader {
public:
  /// Opens `path` and validates its header: length at most `max_header_bytes` and within the file,
  /// a JSON object without duplicate keys, supported dtypes, shapes of at most `max_rank`
  /// dimensions whose byte size matches
  /// data_offsets, ranges that tile the data section from 0 to the end of the file without gap or
  /// overlap, and string-to-string metadata.
  /// \throws checkpoint_error naming the file, the tensor and what was expected.
  /// \throws io_error when the file cannot be opened or read (status() is errno).
  explicit reader(std::filesystem::path path) : path_(std::move(path)) {
    // O_NONBLOCK so that a FIFO at `path` is refused below instead of blocking the open; it does not
    // change reads of a regular file.
    ::zero::detail::check_os_path<io_error>("safetensors file", path_.native());
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      const int err = errno;
      throw io_error(detail::at(path_) + "cannot open: " + std::strerror(err), err);
    }
    try {
      parse();
    } catch (...) {
      ::close(std::exchange(fd_, -1));
      throw;
    }
  }

  reader(const reader&) = delete;
  reader& operator=(const reader&) = delete;
  /// Takes over `other`'s file; `other` is left without one.
  reader(reader&& other) noexcept
      : path_(std::move(other.path_)), tensors_(std::move(other.tensors_)), by_name_(std::move(other.by_name_)),
        metadata_(std::move(other.metadata_)), data_begin_(other.data_begin_), data_size_(other.data_size_),
        fd_(std::exchange(other.fd_, -1)) {}
  reader& operator=(reader&&) = delete;

  /// Closes the file.
  ~reader() {
    if (fd_ >= 0) {
      ::close(fd_);
    }
  }

  /// The tensors in data-section order (by `begin`).
  [[nodiscard]] const std::vector<tensor_info>& tensors() const noexcept { return tensors_; }

  /// The tensor called `name`, or nullptr; the pointer lives as long as the reader.
  [[nodiscard]] const tensor_info* find(std::string_view name) const {
    const auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &tensors_[it->second];
  }

  /// Reads `out.size()` bytes of tensor `t`, starting `byte_offset` bytes into it.
  /// \param t           a tensor of this reader (from `tensors()` or `find`).
  /// \param byte_offset where in the tensor to start.
  /// \param out         caller-owned destination.
  /// \throws usage_error when the range is not inside `t` or `t` is not inside this file.
  /// \throws io_error when the read fails or the file was truncated since it was opened.
  void read(const tensor_info& t, std::uint64_t byte_offset, std::span<std::byte> out) const {
    if (fd_ < 0) {
      throw usage_error(detail::at(path_) + "read from a moved-from reader");
    }
    if (t.begin > t.end || t.end > data_size_) {
      throw usage_error(detail::at(path_) + "tensor '" + t.name + "' bytes [" + std::to_string(t.begin) + ", " +
                        std::to_string(t.end) + ") are not inside this file's data section of " +
                        std::to_string(data_size_) + " bytes");
    }
    if (byte_offset > t.size() || out.size() > t.size() - byte_offset) {
      throw usage_error(detail::at(path_) + "tensor '" + t.name + "': read of " + std::to_string(out.size()) +
                        " bytes at offset " + std::to_string(byte_offset) + " goes past its " +
                        std::to_string(t.size()) + " bytes");
    }
    const int err = detail::pread_all(fd_, out.data(), out.size(), data_begin_ + t.begin + byte_offset);
    if (err == -1) {
      throw io_error(detail::at(path_) + "tensor '" + t.name + "': the file ended early; was it truncated?");
    }
    if (err != 0) {
      throw io_error(detail::at(path_) + "tensor '" + t.name + "': read failed: " + std::strerror(err), err);
    }
  }

  /// The "__metadata__" pairs, empty when the file has none.
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  /// The file this reader reads.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// Bytes of the data section.
  [[nodiscard]] std::uint64_t data_size() const noexcept { return data_size_; }

private:
  [[noreturn]] void fail(const std::string& message) const { throw checkpoint_error(detail::at(path_) + message); }

  void parse() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      throw io_error(detail::at(path_) + "cannot stat: " + std::strerror(err), err);
    }
    if (!S_ISREG(st.st_mode)) {
      fail("not a regular file; expected a safetensors file");
    }
    const auto file_size = static_cast<std::uint64_t>(st.st_size);
    if (file_size < 8) {
      fail("the file is " + std::to_string(file_size) + " bytes; expected at least the 8-byte header length");
    }
    std::array<std::byte, 8> length{};
    read_at(length.data(), length.size(), 0);
    std::uint64_t n = 0;
    for (std::size_t i = 0; i < 8; ++i) {
      n |= static_cast<std::uint64_t>(length[i]) << (8 * i);
    }
    // Both bounds come before any allocation: a hostile length cannot make the reader allocate
    // more than the file holds, nor more than 100 MB.
    if (n > max_header_bytes) {
      fail("header length " + std::to_string(n) + " exceeds the limit of " + std::to_string(max_header_bytes) +
           " bytes");
    }
    if (n > file_size - 8) {
      fail("header length " + std::to_string(n) + " exceeds the " + std::to_string(file_size - 8) +
           " bytes after the length field");
    }
    std::string text(static_cast<std::size_t>(n), '\0');
    read_at(reinterpret_cast<std::byte*>(text.data()), text.size(), 8);
    data_begin_ = 8 + n;
    data_size_ = file_size - data_begin_;
    if (text.empty() || text.front() != '{') {
      fail("the header does not start with '{'; expected a JSON object");
    }

    // A callback sees the header as it is parsed, so that nlohmann never holds more than one entry:
    // - each top-level entry (a tensor or __metadata__) is checked and turned into a tensor_info
    //   as soon as it is complete, then discarded from the tree being built;
    // - nlohmann keeps the last of duplicate keys silently, so each open object's keys are kept;
    // - a header nests three deep at most (the top object, a tensor or __metadata__, an array) and
    //   its arrays are shapes or offsets, so deeper nesting and arrays longer than max_rank are
    //   refused as they appear.
    struct open_container {
      bool is_object = false;
      std::size_t elements = 0;
      std::set<std::string> keys;
    };
    std::vector<open_container> open;
    std::string entry; // the top-level key whose value is being parsed
    const auto element = [&] {
      if (!open.empty() && !open.back().is_object && ++open.back().elements > max_rank) {
        fail("the header has an array of more than " + std::to_string(max_rank) +
             " elements; expected shapes of at most " + std::to_string(max_rank) + " dimensions");
      }
    };
    const auto finish_entry = [&](const nlohmann::json& value) {
      if (entry == "__metadata__") {
        parse_metadata(value);
      } else {
        tensors_.push_back(parse_tensor(entry, value));
      }
    };
    const auto watch = [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      using ev = nlohmann::json::parse_event_t;
      switch (event) {
      case ev::object_start:
      case ev::array_start:
        element();
        if (open.size() == 3) {
          fail("the header nests deeper than a safetensors header; expected tensor entries holding only a "
               "dtype string and shape and data_offsets arrays of integers");
        }
        open.push_back(open_container{event == ev::object_start, 0, {}});
        return true;
      case ev::object_end:
      case ev::array_end:
        open.pop_back();
        if (open.size() == 1) {
          finish_entry(parsed);
          return false; // checked and recorded: keep it out of the tree
        }
        return true;
      case ev::key:
        if (!open.back().keys.insert(parsed.get<std::string>()).second) {
          fail("the header has the key '" + parsed.get<std::string>() +
               "' twice; expected unique tensor names and fields");
        }
        if (open.size() == 1) {
          entry = parsed.get<std::string>();
        }
        return true;
      case ev::value:
        element();
        if (open.size() == 1) {
          finish_entry(parsed);
          return false;
        }
        return true;
      }
      return true;
    };
    try {
      // What is left is an empty object: every entry was recorded and discarded.
      const nlohmann::json rest = nlohmann::json::parse(text, watch);
    } catch (const nlohmann::json::exception& e) {
      fail(std::string("the header is not valid JSON (") + e.what() + "); expected a UTF-8 JSON object");
    }

    // The ranges must tile [0, data_size_) exactly: sorted by (begin, end), each starts where the
    // previous one ended. Empty tensors sort before a non-empty one at the same offset.
    std::sort(tensors_.begin(), tensors_.end(), [](const tensor_info& a, const tensor_info& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    std::uint64_t expected = 0;
    const tensor_info* previous = nullptr;
    for (const tensor_info& t : tensors_) {
      if (t.begin != expected) {
        if (t.begin < expected) {
          fail("tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
               "] overlap tensor '" + previous->name + "' ending at " + std::to_string(expected) +
               "; expected ranges without overlap");
        }
        fail("tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] leave a gap after " + (previous ? "tensor '" + previous->name + "'" : std::string("the header")) +
             "; expected it to begin at " + std::to_string(expected));
      }
      if (t.end > data_size_) {
        fail("tensor '" + t.name + "' data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
             "] go past the end of the file; the data section holds " + std::to_string(data_size_) + " bytes");
      }
      expected = t.end;
      previous = &t;
    }
    if (expected != data_size_) {
      fail(std::to_string(data_size_ - expected) + " bytes of trailing data after " +
           (previous ? "the last tensor '" + previous->name + "'" : std::string("the header")) + "; expected " +
           std::to_string(expected) + " data bytes");
    }
    for (std::size_t i = 0; i < tensors_.size(); ++i) {
      by_name_.emplace(tensors_[i].name, i);
    }
  }

  void parse_metadata(const nlohmann::json& value) {
    if (!value.is_object()) {
      fail("__metadata__ is " + detail::kind(value) + "; expected an object of strings");
    }
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        fail("__metadata__ key '" + key + "' is " + detail::kind(v) + "; expected a string");
      }
      metadata_.emplace(key, v.get<std::string>());
    }
  }

  tensor_info parse_tensor(const std::string& name, const nlohmann::json& value) const {
    const std::string what = "tensor '" + name + "' ";
    if (!value.is_object()) {
      fail(what + "is " + detail::kind(value) + "; expected an object with dtype, shape and data_offsets");
    }
    for (const auto& [key, v] : value.items()) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        fail(what + "has the unknown field '" + key + "'; expected only dtype, shape and data_offsets");
      }
    }
    for (const char* key : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(key)) {
        fail(what + "has no " + key);
      }
    }
    tensor_info t;
    t.name = name;
    const nlohmann::json& dtype = value["dtype"];
    if (!dtype.is_string()) {
      fail(what + "dtype is " + detail::kind(dtype) + "; expected one of " + std::string(detail::supported_dtypes));
    }
    const std::optional<zero::dtype> type = detail::parse_format_name(dtype.get<std::string>());
    if (!type) {
      fail(what + "has dtype \"" + dtype.get<std::string>() + "\", which zero does not support; expected one of " +
           std::string(detail::supported_dtypes));
    }
    t.type = *type;

    const nlohmann::json& shape = value["shape"];
    if (!shape.is_array()) {
      fail(what + "shape is " + detail::kind(shape) + "; expected an array of non-negative integers");
    }
    t.shape.reserve(shape.size());
    for (const nlohmann::json& d : shape) {
      if (!d.is_number_integer() ||
          (d.is_number_unsigned()
               ? d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
               : d.get<std::int64_t>() < 0)) {
        fail(what + "shape has the element " + d.dump() + "; expected non-negative integers below 2^63");
      }
      t.shape.push_back(d.get<std::int64_t>());
    }
    const std::optional<std::uint64_t> bytes = detail::byte_size(t.type, t.shape);
    if (!bytes) {
      fail(what + "shape " + detail::shape_text(t.shape) + " of " + std::string(detail::format_name(t.type)) +
           " overflows 64 bits; expected a byte size that fits the file");
    }

    const nlohmann::json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      fail(what + "data_offsets is " + offsets.dump() + "; expected [begin, end] with non-negative integers");
    }
    t.begin = offsets[0].get<std::uint64_t>();
    t.end = offsets[1].get<std::uint64_t>();
    if (t.begin > t.end) {
      fail(what + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
           "] end before they begin; expected begin <= end");
    }
    if (t.end - t.begin != *bytes) {
      fail(what + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
           std::to_string(t.end - t.begin) + " bytes; expected " + std::to_string(*bytes) + " for shape " +
           detail::shape_text(t.shape) + " of " + std::string(detail::format_name(t.type)));
    }
    return t;
  }

  void read_at(std::byte* p, std::size_t n, std::uint64_t offset) const {
    const int err = detail::pread_all(fd_, p, n, offset);
    if (err == -1) {
      fail("the file ended early while reading the header");
    }
    if (err != 0) {
      throw io_error(detail::at(path_) + "read failed: " + std::strerror(err), err);
    }
  }

  std::filesystem::path path_;
  std::vector<tensor_info> tensors_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
  std::map<std::string, std::string> metadata_;
  std::uint64_t data_begin_ = 0;
  std::uint64_t data_size_ = 0;
  int fd_ = -1;
};

} // namespace zero::safetensors
