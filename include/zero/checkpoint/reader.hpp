#pragma once
/// \file
/// Reading a checkpoint without an engine: `checkpoint::resolve` (which directory a tag names,
/// through `latest`), `checkpoint::reader` (the manifest and bounded, verified reads of any range of
/// any saved tensor, as `zero-ckpt` and `load` use them), and the save options and checks that
/// `save` and `load` share. checkpoint.hpp describes the format.

#include "zero/checkpoint/file_io.hpp"
#include "zero/checkpoint/manifest.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/dispatch.hpp"
#include "zero/core/error.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>
#include <xxhash.h>

namespace zero {

namespace checkpoint {

/// A durable step of a save, given to the observer: which rank, what was just made durable (or
/// done), and a running index for steps that repeat ("shard_piece" per piece written).
struct save_event {
  int rank = 0;
  std::string_view what;
  std::size_t index = 0;
};

/// Options of `save`. The observer is called on the rank that took the step, from that rank's
/// thread; with in-process ranks it must be thread-safe. Tests use it to kill a save at each step.
struct save_options {
  std::function<void(const save_event&)> observer;
  /// Replace an existing tag with one renameat2(RENAME_EXCHANGE) where the file system has it; false
  /// takes the fallback (move the old one aside, then rename), which tests use to cover it.
  bool exchange = true;
};

/// Which of a parameter's saved tensors to read.
enum class tensor_kind : std::uint8_t {
  master,     ///< fp32 master weights (for a frozen parameter: its values)
  exp_avg,    ///< Adam's first moment; another rule's first state tensor (manifest::optimizer)
  exp_avg_sq, ///< Adam's second moment; another rule's second state tensor
  /// ZenFlow's window (the files of kind "zenflow"; a checkpoint with the manifest's "zenflow" block only)
  zenflow_window,
};

namespace detail {

/// xxh64 of a string.
inline std::uint64_t xxh64_of(std::string_view s) { return XXH64(s.data(), s.size(), 0); }

/// A tag is a plain file name that is not "latest" and does not start with '.': no separator, no
/// "..", nothing absolute, so that `dir / tag` stays inside `dir`.
inline bool valid_tag(std::string_view tag) { return plain_file_name(tag) && tag != "latest" && tag.front() != '.'; }

/// The one check of a tag that save and load share. \throws usage_error naming the tag.
inline void check_tag(const std::string& tag) {
  if (!valid_tag(tag)) {
    throw usage_error(cat("checkpoint tag \"", tag.substr(0, 80),
                          "\": expected a plain name of letters, digits, '-', '_' and '.', not starting with '.' "
                          "and other than \"latest\""));
  }
}

/// The tags found in `dir`, for messages.
inline std::string tags_in(const std::filesystem::path& dir) {
  std::vector<std::string> tags;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator(dir, ec)) {
    const std::string n = d.path().filename().string();
    if (n.front() != '.' && d.is_directory(ec)) {
      tags.push_back(n);
    }
  }
  std::sort(tags.begin(), tags.end());
  if (tags.empty()) {
    return "none";
  }
  std::string s;
  for (const auto& t : tags) {
    s += (s.empty() ? "" : ", ") + t;
  }
  return s;
}

/// Trims whitespace at both ends.
inline std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) {
    return {};
  }
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

/// "[2, 3]".
inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

/// The rank-file name of rank `r`.
inline std::string shard_name(int r) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", r);
  return buf;
}

/// What `dir/latest` holds: the tag, one space, the xxh64 (seed 0) of the tag as 16 lowercase hex
/// digits, and a newline. The checksum makes any change of the file's bytes detectable, including
/// one that turns the tag into another tag that exists.
inline std::string latest_text(const std::string& tag) { return cat(tag, " ", hex64(xxh64_of(tag)), "\n"); }

/// The tag `latest_text` wrote. \param path `dir/latest`, for messages.
/// \throws checkpoint_error naming the file and what was expected for any other text.
inline std::string parse_latest(const std::string& text, const std::filesystem::path& path) {
  const std::string expected = "expected \"<tag> <xxh64 of the tag, 16 hex digits>\\n\"";
  const auto space = text.find(' ');
  if (text.empty() || text.back() != '\n' || space == std::string::npos) {
    throw checkpoint_error(cat(path.string(), ": holds \"", trim(text).substr(0, 80),
                               "\", without the tag's xxh64 (latest from an older zero, or damaged); ", expected,
                               "; pass the tag to load it"));
  }
  const std::string tag = text.substr(0, space);
  const std::string sum = text.substr(space + 1, text.size() - space - 2);
  if (!valid_tag(tag)) {
    throw checkpoint_error(
        cat(path.string(), ": holds tag \"", tag.substr(0, 80), "\"; ", expected, " with a plain tag"));
  }
  const auto v = parse_hex64(sum);
  if (!v) {
    throw checkpoint_error(cat(path.string(), ": checksum \"", sum.substr(0, 40), "\"; ", expected));
  }
  if (*v != xxh64_of(tag)) {
    throw checkpoint_error(cat(path.string(), ": holds tag \"", tag, "\" with xxh64 ", sum, ", expected ",
                               hex64(xxh64_of(tag)), " (the file is corrupt)"));
  }
  return tag;
}

/// Refuses a tag directory reached through a symbolic link (a save never makes one, and it could
/// lead outside `dir`). \throws checkpoint_error naming it.
inline void check_not_link(const std::filesystem::path& p) {
  std::error_code ec;
  if (std::filesystem::is_symlink(p, ec)) {
    throw checkpoint_error(cat(p.string(), ": a symbolic link; expected a checkpoint directory inside ",
                               p.parent_path().string(), " (links are not followed)"));
  }
}

} // namespace detail

/// The directory of checkpoint `tag` in `dir` ("latest" reads `dir/latest`).
/// \throws usage_error for a tag save would refuse (`check_tag`: "..", absolute, a separator);
/// checkpoint_error naming what is missing or wrong: the directory, `latest` (or its checksum), the
/// tag (with the tags that are there), or a tag folder that is a symbolic link.
inline std::filesystem::path resolve(const std::filesystem::path& dir, const std::string& tag = "latest") {
  using detail::cat;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    throw checkpoint_error(cat(dir.string(), ": no such checkpoint directory"));
  }
  std::string t = tag;
  if (tag == "latest") {
    t = detail::parse_latest(
        detail::read_small_file(dir / "latest", 4096, "the tag of the last complete checkpoint (or pass a tag)"),
        dir / "latest");
  } else {
    detail::check_tag(tag);
  }
  const auto p = dir / t;
  detail::check_not_link(p);
  if (std::filesystem::is_directory(p, ec)) {
    return p;
  }
  // A save that replaced this tag and crashed between its two renames left the old one aside.
  if (const auto old = dir / (".old-" + t); std::filesystem::is_regular_file(old / manifest_name, ec)) {
    detail::check_not_link(old);
    return old;
  }
  if (tag == "latest") {
    throw checkpoint_error(cat((dir / "latest").string(), " names tag \"", t, "\" but ", p.string(),
                               " does not exist; tags here: ", detail::tags_in(dir)));
  }
  throw checkpoint_error(cat(p.string(), ": no such checkpoint; tags here: ", detail::tags_in(dir)));
}

/// A checkpoint read offline (or by `load`): its manifest, and bounded reads of any range of any
/// saved tensor. Files are opened on first use and, with `verify_on_open`, their size and xxh64
/// are checked against the manifest before anything is read from them.
class reader {
public:
  /// Opens checkpoint `tag` of `dir`, checks the manifest's bytes against `manifest.xxh64` and
  /// parses the manifest.
  /// \throws usage_error for an unsafe tag; checkpoint_error for a missing directory, tag or latest,
  /// a damaged latest, a missing or mismatched marker, or a bad manifest.
  explicit reader(const std::filesystem::path& dir, const std::string& tag = "latest", bool verify_on_open = true)
      : path_(resolve(dir, tag)), verify_(verify_on_open) {
    using detail::cat;
    const auto mpath = path_ / manifest_name;
    const auto cpath = path_ / checksum_name;
    // The marker first: a checkpoint without one is incomplete or from an older zero.
    const std::string marker =
        detail::read_small_file(cpath, 64, cat("the xxh64 of ", manifest_name, " (16 hex digits and a newline)"));
    const auto expected =
        marker.size() == 17 && marker.back() == '\n' ? parse_hex64(marker.substr(0, 16)) : std::nullopt;
    if (!expected) {
      throw checkpoint_error(cat(cpath.string(), ": holds \"", detail::trim(marker).substr(0, 40),
                                 "\"; expected the xxh64 of ", manifest_name,
                                 " as 16 lowercase hex digits and a newline (the file is corrupt)"));
    }
    const std::string text = detail::read_small_file(mpath, max_manifest_bytes, "a zero checkpoint manifest");
    if (const std::uint64_t h = detail::xxh64_of(text); h != *expected) {
      throw checkpoint_error(cat(mpath.string(), ": xxh64 ", hex64(h), ", expected ", hex64(*expected), " as ",
                                 cpath.string(), " records (the manifest or its marker is corrupt)"));
    }
    m_ = manifest::parse(text, mpath.string());
    by_param_.resize(m_.params.size());
    for (std::size_t f = 0; f < m_.files.size(); ++f) {
      for (std::size_t k = 0; k < m_.files[f].pieces.size(); ++k) {
        by_param_[m_.files[f].pieces[k].param].emplace_back(f, k);
      }
    }
    open_.resize(m_.files.size());
  }

  /// The checkpoint's directory (`dir/tag`).
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The manifest.
  [[nodiscard]] const manifest& info() const noexcept { return m_; }

  /// Checks the size and xxh64 of file `f` of the manifest (the manifest itself was checked against
  /// its marker when the reader was made).
  /// \throws checkpoint_error naming the file, what was expected and what was found.
  void verify_file(std::size_t f) const { verify_open(f, open_file(f)); }
  /// Checks every file. \throws checkpoint_error naming the first bad one.
  void verify() const {
    for (std::size_t f = 0; f < m_.files.size(); ++f) {
      verify_file(f);
    }
  }

  /// Reads elements `[offset, offset + out.size())` of tensor `kind` of parameter `param` (an index
  /// into `info().params`) as fp32. A frozen parameter has only `tensor_kind::master`, its values.
  /// \throws usage_error for a range outside the parameter; checkpoint_error for a bad file.
  void read(std::size_t param, tensor_kind kind, std::uint64_t offset, std::span<float> out) {
    using detail::cat;
    const auto& p = m_.params.at(param);
    if (offset > p.numel || out.size() > p.numel - offset) {
      throw usage_error(cat("checkpoint read of \"", p.name, "\": elements [", std::to_string(offset), ", +",
                            std::to_string(out.size()), ") outside its ", std::to_string(p.numel)));
    }
    if (!p.trainable && kind != tensor_kind::master) {
      throw usage_error(cat("checkpoint read of \"", p.name, "\": a frozen parameter has no optimizer state"));
    }
    if ((kind == tensor_kind::exp_avg || kind == tensor_kind::exp_avg_sq) &&
        static_cast<std::size_t>(kind) > m_.optimizer.state.size()) {
      throw usage_error(cat("checkpoint read of \"", p.name, "\": ", m_.optimizer.type, " keeps ",
                            std::to_string(m_.optimizer.state.size()), " state tensors; ",
                            kind == tensor_kind::exp_avg ? "the first" : "the second", " is not one of them"));
    }
    const bool window = kind == tensor_kind::zenflow_window;
    if (window && !m_.zenflow) {
      throw usage_error(cat("checkpoint read of \"", p.name, "\": the checkpoint holds no ZenFlow window"));
    }
    const std::uint64_t end = offset + out.size();
    for (const auto& [f, k] : by_param_[param]) {
      if ((m_.files[f].kind == "zenflow") != window) {
        continue; // the window's files hold nothing else, and nothing else is in them
      }
      const auto& pc = m_.files[f].pieces[k];
      const std::uint64_t lo = std::max(offset, pc.offset);
      const std::uint64_t hi = std::min(end, pc.offset + pc.count);
      if (lo >= hi) {
        continue;
      }
      const std::size_t n = static_cast<std::size_t>(hi - lo);
      float* dst = out.data() + (lo - offset);
      if (p.trainable) {
        const std::uint64_t tensor = window ? 0 : static_cast<std::uint64_t>(kind);
        const std::uint64_t at = pc.byte_offset + (tensor * pc.count + (lo - pc.offset)) * 4;
        read_bytes(f, dst, n * 4, at);
      } else {
        const std::size_t es = size_of(p.type);
        scratch_.resize(n * es);
        read_bytes(f, scratch_.data(), n * es, pc.byte_offset + (lo - pc.offset) * es);
        visit_float(p.type, [&]<class T>(type_tag<T>) {
          for (std::size_t i = 0; i < n; ++i) {
            T v;
            std::memcpy(&v, scratch_.data() + i * es, es);
            dst[i] = to_float(v);
          }
        });
      }
    }
  }

private:
  /// Opens file `f` of the manifest: a regular file inside the tag's directory, not a link.
  [[nodiscard]] detail::file open_file(std::size_t f) const {
    using detail::cat;
    const auto& fe = m_.files.at(f);
    const auto p = path_ / fe.name;
    std::error_code ec;
    if (std::filesystem::symlink_status(p, ec).type() == std::filesystem::file_type::not_found) {
      throw checkpoint_error(
          cat(p.string(), ": missing; the manifest lists it with ", std::to_string(fe.size), " bytes"));
    }
    return detail::open_regular(p, cat("a checkpoint file of ", std::to_string(fe.size), " bytes"));
  }
  /// Checks the size and xxh64 of the open file `fd` against entry `f` of the manifest.
  void verify_open(std::size_t f, const detail::file& fd) const {
    using detail::cat;
    const auto& fe = m_.files.at(f);
    const auto& p = fd.path();
    const auto [size, hash] = detail::hash_file(fd);
    if (size != fe.size) {
      throw checkpoint_error(cat(p.string(), ": ", std::to_string(size), " bytes, expected ", std::to_string(fe.size),
                                 size < fe.size ? " (truncated)" : ""));
    }
    if (hash != fe.xxh64) {
      throw checkpoint_error(
          cat(p.string(), ": xxh64 ", hex64(hash), ", expected ", hex64(fe.xxh64), " (the file is corrupt)"));
    }
  }
  /// Reads `n` bytes at `at` of file `f`, opening it on first use (and verifying the open file when
  /// the reader verifies: what is checked is what is read).
  void read_bytes(std::size_t f, void* dst, std::size_t n, std::uint64_t at) {
    using detail::cat;
    if (!open_[f]) {
      auto fd = std::make_unique<detail::file>(open_file(f));
      if (verify_) {
        verify_open(f, *fd);
      }
      open_[f] = std::move(fd);
    }
    const std::size_t got = open_[f]->pread_some(dst, n, at);
    if (got != n) {
      throw checkpoint_error(cat(open_[f]->path().string(), ": ", std::to_string(n), " bytes expected at offset ",
                                 std::to_string(at), ", found ", std::to_string(got), " (truncated)"));
    }
  }

  std::filesystem::path path_;
  bool verify_;
  manifest m_;
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> by_param_;
  std::vector<std::unique_ptr<detail::file>> open_;
  std::vector<std::byte> scratch_;
};

} // namespace checkpoint
} // namespace zero
