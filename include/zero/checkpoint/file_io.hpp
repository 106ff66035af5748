#pragma once
/// \file
/// Durable file I/O for checkpoints (POSIX): files written through one descriptor with a running
/// xxh64, fsync of files and directories, atomic renames, and bounded positional reads that call a
/// short file what it is. Needs libxxhash (`zero::checkpoint`).

#include "zero/core/detail/os_path.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>
#include <vector>
#include <xxhash.h>

namespace zero::checkpoint::detail {

using zero::detail::cat;

/// An io_error for a failed system call on `path`, with errno's text and value.
inline io_error sys_error(std::string_view what, const std::filesystem::path& path, int err = errno) {
  return io_error(cat(path.string(), ": ", what, " failed: ", std::strerror(err)), err);
}

/// An open file descriptor, closed on destruction.
class file {
public:
  file() = default;
  /// Opens `path` with `flags` (and `mode` when creating). \throws io_error naming the path.
  file(const std::filesystem::path& path, int flags, mode_t mode = 0644) : path_(path) {
    ::zero::detail::check_os_path<io_error>("checkpoint file", path.native());
    do {
      fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) {
      throw sys_error(flags & O_CREAT ? "creating the file" : "opening the file", path);
    }
  }
  file(file&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), written_(std::exchange(o.written_, 0)) {}
  file& operator=(file&& o) noexcept {
    if (this != &o) {
      close_quietly();
      fd_ = std::exchange(o.fd_, -1);
      path_ = std::move(o.path_);
      written_ = std::exchange(o.written_, 0);
    }
    return *this;
  }
  file(const file&) = delete;
  file& operator=(const file&) = delete;
  ~file() { close_quietly(); }

  [[nodiscard]] int fd() const noexcept { return fd_; }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Writes every byte. \throws io_error naming the file, errno, the bytes of the file written
  /// before the failure and the write that failed ("write failed: No space left on device; 100 bytes of
  /// the file were written, a write of 144 bytes at byte 0 stopped at byte 100").
  void write_all(const void* data, std::size_t n) {
    const auto* p = static_cast<const char*>(data);
    const std::uint64_t start = written_;
    const std::size_t total = n;
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0) {
        if (errno == EINTR) {
          continue;
        }
        const int err = errno;
        throw io_error(cat(path_.string(), ": write failed: ", std::strerror(err), "; ", std::to_string(written_),
                           " bytes of the file were written, a write of ", std::to_string(total), " bytes at byte ",
                           std::to_string(start), " stopped at byte ", std::to_string(written_)),
                       err);
      }
      p += w;
      n -= static_cast<std::size_t>(w);
      written_ += static_cast<std::uint64_t>(w);
    }
  }
  /// Reads up to `n` bytes at `offset`; returns how many were there (fewer only at end of file).
  std::size_t pread_some(void* data, std::size_t n, std::uint64_t offset) const {
    auto* p = static_cast<char*>(data);
    std::size_t got = 0;
    while (got < n) {
      const ssize_t r = ::pread(fd_, p + got, n - got, static_cast<off_t>(offset + got));
      if (r < 0) {
        if (errno == EINTR) {
          continue;
        }
        throw sys_error("read", path_);
      }
      if (r == 0) {
        break;
      }
      got += static_cast<std::size_t>(r);
    }
    return got;
  }
  /// Size of the file in bytes.
  [[nodiscard]] std::uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      throw sys_error("fstat", path_);
    }
    return static_cast<std::uint64_t>(st.st_size);
  }
  /// fsync. \throws io_error naming the file.
  void sync() {
    if (::fsync(fd_) != 0) {
      throw sys_error("fsync", path_);
    }
  }
  /// Closes, reporting an error close finds (a delayed write error). \throws io_error.
  void close() {
    if (fd_ >= 0) {
      const int rc = ::close(std::exchange(fd_, -1));
      if (rc != 0 && errno != EINTR) {
        throw sys_error("close", path_);
      }
    }
  }

private:
  void close_quietly() noexcept {
    if (fd_ >= 0) {
      ::close(std::exchange(fd_, -1));
    }
  }
  int fd_ = -1;
  std::filesystem::path path_;
  std::uint64_t written_ = 0; // bytes written through write_all
};

/// A running xxh64 (seed 0).
class hasher {
public:
  hasher() : s_(XXH64_createState()) {
    if (s_ == nullptr) {
      throw memory_error("xxh64: no memory for the hash state");
    }
    XXH64_reset(s_, 0);
  }
  hasher(const hasher&) = delete;
  hasher& operator=(const hasher&) = delete;
  ~hasher() { XXH64_freeState(s_); }
  void update(const void* data, std::size_t n) { XXH64_update(s_, data, n); }
  [[nodiscard]] std::uint64_t digest() const { return XXH64_digest(s_); }

private:
  XXH64_state_t* s_;
};

/// A new file written front to back with its size and xxh64 kept as it goes.
class hashing_writer {
public:
  /// Creates (truncating) `path`.
  explicit hashing_writer(const std::filesystem::path& path) : f_(path, O_WRONLY | O_CREAT | O_TRUNC) {}
  /// Appends bytes.
  void write(const void* data, std::size_t n) {
    f_.write_all(data, n);
    h_.update(data, n);
    size_ += n;
  }
  /// fsync and close.
  void finish() {
    f_.sync();
    f_.close();
  }
  [[nodiscard]] std::uint64_t size() const noexcept { return size_; }
  [[nodiscard]] std::uint64_t digest() const { return h_.digest(); }

private:
  file f_;
  hasher h_;
  std::uint64_t size_ = 0;
};

/// fsync of a directory, so that the names created, renamed or removed in it are durable.
inline void sync_dir(const std::filesystem::path& dir) {
  file d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
}

/// Writes `content` to `path` durably: write, fsync, close.
inline std::pair<std::uint64_t, std::uint64_t> write_file(const std::filesystem::path& path, std::string_view content) {
  hashing_writer w(path);
  w.write(content.data(), content.size());
  w.finish();
  return {w.size(), w.digest()};
}

/// rename(2). \throws io_error naming both paths.
inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw io_error(cat(from.string(), ": renaming to ", to.string(), " failed: ", std::strerror(err)), err);
  }
}

/// Swaps two existing paths atomically (renameat2 RENAME_EXCHANGE). Returns false where the file
/// system cannot (EINVAL, ENOSYS, ENOTSUP); throws io_error for any other failure.
inline bool exchange_paths(const std::filesystem::path& a, const std::filesystem::path& b) {
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) {
    return true;
  }
  const int err = errno;
  if (err == EINVAL || err == ENOSYS || err == ENOTSUP) {
    return false;
  }
  throw io_error(cat(a.string(), ": exchanging with ", b.string(), " failed: ", std::strerror(err)), err);
#else
  static_cast<void>(a);
  static_cast<void>(b);
  return false;
#endif
}

/// What kind of file `mode` (from stat) is, for messages: "a directory", "a FIFO", ...
inline std::string_view file_kind(mode_t mode) {
  static constexpr std::pair<mode_t, std::string_view> kinds[] = {
      {S_IFREG, "a regular file"},     {S_IFDIR, "a directory"},    {S_IFLNK, "a symbolic link"}, {S_IFIFO, "a FIFO"},
      {S_IFCHR, "a character device"}, {S_IFBLK, "a block device"}, {S_IFSOCK, "a socket"}};
  for (const auto& [type, name] : kinds) {
    if ((mode & S_IFMT) == type) {
      return name;
    }
  }
  return "not a regular file";
}

/// Opens a file of a checkpoint for reading: a regular file reached without following a symbolic
/// link at its last component (a checkpoint never holds links, and a link could lead outside it),
/// and without blocking on a FIFO. \param what what the file should hold, for messages.
/// \throws checkpoint_error naming the path when it is missing, a link or not a regular file;
/// io_error when opening fails otherwise.
inline file open_regular(const std::filesystem::path& path, std::string_view what) {
  std::optional<file> f;
  try {
    f.emplace(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK);
  } catch (const io_error& e) {
    if (e.status() == ENOENT) {
      throw checkpoint_error(cat(path.string(), ": no such file; expected ", what));
    }
    if (e.status() == ELOOP) {
      throw checkpoint_error(cat(path.string(), ": a symbolic link; expected ", what,
                                 " as a regular file inside the checkpoint (links are not followed)"));
    }
    throw;
  }
  struct stat st {};
  if (::fstat(f->fd(), &st) != 0) {
    throw sys_error("fstat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    throw checkpoint_error(cat(path.string(), ": ", file_kind(st.st_mode), "; expected ", what, " as a regular file"));
  }
  return std::move(*f);
}

/// Reads a whole small file (at most `max_bytes`) through `open_regular`. \throws checkpoint_error
/// when it is missing, not a regular file or larger; io_error when reading fails.
inline std::string read_small_file(const std::filesystem::path& path, std::size_t max_bytes, std::string_view what) {
  file f = open_regular(path, what);
  const std::uint64_t n = f.size();
  if (n > max_bytes) {
    throw checkpoint_error(cat(path.string(), ": ", std::to_string(n), " bytes, expected at most ",
                               std::to_string(max_bytes), " for ", what));
  }
  std::string s(static_cast<std::size_t>(n), '\0');
  const std::size_t got = f.pread_some(s.data(), s.size(), 0);
  s.resize(got);
  return s;
}

/// Size and xxh64 of the whole of an open file, read in 1 MiB blocks.
inline std::pair<std::uint64_t, std::uint64_t> hash_file(const file& f) {
  hasher h;
  std::vector<char> buf(std::size_t{1} << 20);
  std::uint64_t off = 0;
  for (;;) {
    const std::size_t got = f.pread_some(buf.data(), buf.size(), off);
    if (got == 0) {
      break;
    }
    h.update(buf.data(), got);
    off += got;
  }
  return {off, h.digest()};
}

} // namespace zero::checkpoint::detail
