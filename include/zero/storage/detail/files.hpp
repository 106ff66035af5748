#pragma once
/// \file
/// What the posix and uring storages share about files: creating and opening them (mode 0600, no
/// symbolic link followed, O_DIRECT for uring), the checks on a request, and the words of their
/// errors ("write of 1048576 bytes at offset 4194304 to <path> failed: No space left on device
/// (ENOSPC)").

#include "zero/core/detail/os_path.hpp"
#include "zero/core/detail/text.hpp"
#include "zero/core/error.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>

namespace zero::detail {

/// The two kinds of request.
enum class io_op : std::uint8_t { read, write };

/// The symbolic name of an errno value, "ENOSPC"; "errno <n>" where the C library has no name.
[[nodiscard]] inline std::string errno_name(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  if (const char* name = ::strerrorname_np(err); name != nullptr) {
    return name;
  }
#endif
  return cat("errno ", std::to_string(err));
}

/// "No space left on device (ENOSPC)".
[[nodiscard]] inline std::string errno_text(int err) { return cat(std::strerror(err), " (", errno_name(err), ")"); }

/// How a request failed: its errno, and for a read or write that returned 0 bytes, where.
struct io_failure {
  int err = 0;
  /// A transfer made no progress: a read at the end of the file (err ENODATA), a write that wrote
  /// nothing (err ENOSPC).
  bool stalled = false;
  /// The file offset where it stalled.
  std::uint64_t at = 0;
};

/// "write of <bytes> bytes at offset <offset> to <path>" (or "read of ... from <path>").
[[nodiscard]] inline std::string describe_request(io_op op, const std::filesystem::path& path, std::uint64_t offset,
                                                  std::size_t bytes) {
  const bool read = op == io_op::read;
  return cat(read ? "read of " : "write of ", std::to_string(bytes), " bytes at offset ", std::to_string(offset),
             read ? " from " : " to ", path.string());
}

/// The `io_error` of a failed request: "<describe_request> failed: <strerror> (<ENAME>)<note>", status errno.
[[nodiscard]] inline io_error request_error(io_op op, const std::filesystem::path& path, std::uint64_t offset,
                                            std::size_t bytes, const io_failure& f, std::string_view note = {}) {
  std::string what = cat(describe_request(op, path, offset, bytes), " failed: ");
  if (f.stalled && op == io_op::read) {
    what += cat("the file ends at byte ", std::to_string(f.at), " (", errno_name(f.err), ")");
  } else {
    what += errno_text(f.err);
    if (f.stalled) {
      what += cat("; the write made no progress at byte ", std::to_string(f.at));
    }
  }
  return io_error(cat(what, note), f.err);
}

/// `e` with " (and <more> more requests failed)" after its message, for `wait_all`.
[[nodiscard]] inline io_error with_more_failures(const io_error& e, std::size_t more) {
  if (more == 0) {
    return e;
  }
  return io_error(cat(without_error_id(e.what()), " (and ", std::to_string(more),
                      more == 1 ? " more request" : " more requests", " failed)"),
                  e.status());
}

/// Throws `usage_error` unless `file` is open, the request ends within what a file can hold, and
/// the buffer's address, the offset and the length are multiples of `alignment` (the message names
/// the value, the request and the alignment).
inline void check_request(std::string_view storage_name, io_op op, const storage_file& file, std::uint64_t offset,
                          const std::byte* data, std::size_t bytes, std::size_t alignment) {
  if (!file.is_open()) {
    throw usage_error(cat(storage_name, " storage: a ", op == io_op::read ? "read" : "write",
                          " on a storage_file that holds no file (default-constructed or moved from)"));
  }
  const auto request = [&] { return describe_request(op, file.path(), offset, bytes); };
  constexpr auto most = static_cast<std::uint64_t>(std::numeric_limits<off_t>::max());
  if (offset > most || bytes > most - offset) {
    throw usage_error(cat(storage_name, " storage: the ", request(), " ends past the largest file offset"));
  }
  const auto misaligned = [&](std::string_view what, std::string_view value) {
    throw usage_error(cat(storage_name, " storage: the ", what, " ", value, " of the ", request(),
                          " is not a multiple of ", std::to_string(alignment),
                          " (the alignment every buffer address, offset and length must have",
                          alignment > 1 ? ": O_DIRECT)" : ")"));
  };
  if (const auto address = reinterpret_cast<std::uintptr_t>(data); address % alignment != 0) {
    char hex[2 + 2 * sizeof(address)] = {'0', 'x'};
    const auto end = std::to_chars(hex + 2, std::end(hex), address, 16).ptr;
    misaligned("buffer address", std::string_view(hex, static_cast<std::size_t>(end - hex)));
  }
  if (offset % alignment != 0) {
    misaligned("offset", std::to_string(offset));
  }
  if (bytes % alignment != 0) {
    misaligned("length", std::to_string(bytes));
  }
}

/// The direct-I/O alignment of `fd`: the most of 4096 and what statx reports for its file system.
[[nodiscard]] inline std::size_t direct_alignment(int fd) {
  std::size_t align = 4096;
#if defined(STATX_DIOALIGN)
  struct statx st {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &st) == 0 && (st.stx_mask & STATX_DIOALIGN) != 0) {
    align = std::max<std::size_t>({align, st.stx_dio_offset_align, st.stx_dio_mem_align});
  }
#else
  (void)fd;
#endif
  return align;
}

/// The `io_error` of an open(2) of a storage file that failed with `err`: "<doing> failed: <strerror>
/// (<ENAME>)", and for ELOOP that the path is a symbolic link, for EEXIST that the storage creates
/// only new files (and whether what is there is a symbolic link, `is_link`), for EINVAL with O_DIRECT
/// (`direct`) that the file system refuses O_DIRECT and what to use instead.
[[nodiscard]] inline io_error open_error(std::string_view storage_name, std::string_view doing, int err, bool direct,
                                         bool is_link = false) {
  std::string hint;
  if (err == ELOOP || (err == EEXIST && is_link)) {
    hint = cat("; it is a symbolic link, which the ", storage_name, " storage does not follow");
  } else if (err == EEXIST) {
    hint = cat("; the ", storage_name,
               " storage creates only new files and never truncates one it did not create: remove it, or use "
               "another folder");
  } else if (err == EINVAL && direct) {
    hint = cat("; its file system refuses O_DIRECT, which the ", storage_name,
               " storage needs: use a file system that supports O_DIRECT (ext4 or xfs on the NVMe drive), or the "
               "posix storage");
  }
  return io_error(cat(doing, " failed: ", errno_text(err), hint), err);
}

/// Opens (no `bytes`) or creates (`bytes`: a new file of exactly that many bytes, space reserved with
/// fallocate where the file system can) the file of a storage: read-write, mode 0600 whatever the
/// umask, not following a symbolic link at `path`, with O_DIRECT when `direct` (its alignment then
/// from `direct_alignment`, else 1). A create never opens a file that exists (O_EXCL), so a user's
/// file at the name is never truncated; when a step after the open fails (fallocate on a full drive),
/// the new file is removed again.
/// \throws io_error naming the path, the step that failed and errno (with a hint for a symbolic link,
///         a file that exists and a file system that refuses O_DIRECT), or saying it is not a regular
///         file.
[[nodiscard]] inline storage_file open_storage_file(std::string_view storage_name, const std::filesystem::path& path,
                                                    std::optional<std::uint64_t> bytes, bool direct) {
  check_os_path<io_error>(cat(storage_name, " storage file"), path.native());
  const bool create = bytes.has_value();
  const std::string doing = create ? cat("creating ", path.string(), " (", std::to_string(*bytes), " bytes)")
                                   : cat("opening ", path.string());
  if (create && *bytes > static_cast<std::uint64_t>(std::numeric_limits<off_t>::max())) {
    throw io_error(cat(doing, " failed: more bytes than a file can hold"), EFBIG);
  }
  const int flags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | (direct ? O_DIRECT : 0) | (create ? O_CREAT | O_EXCL : 0);
  int fd = -1;
  do {
    fd = ::open(path.c_str(), flags, 0600);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    const bool is_link = err == EEXIST && ::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode);
    throw open_error(storage_name, doing, err, direct, is_link);
  }
  // O_EXCL made the file ours: a create that fails from here on removes it again.
  struct remove_unless_done {
    const std::filesystem::path* path;
    bool done = false;
    ~remove_unless_done() {
      if (path != nullptr && !done) {
        ::unlink(path->c_str());
      }
    }
  } created{create ? &path : nullptr};
  storage_file file(fd, path, direct ? direct_alignment(fd) : 1); // owns fd: closed on every throw below
  const auto fail = [&](std::string_view step) {
    const int err = errno;
    throw io_error(cat(doing, " failed: ", step, ": ", errno_text(err)), err);
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    fail("fstat");
  }
  if (!S_ISREG(st.st_mode)) {
    throw io_error(cat(doing, " failed: it is not a regular file"));
  }
  if (create) {
    if (::fchmod(fd, 0600) != 0) { // O_CREAT's mode is narrowed by the umask
      fail("fchmod 0600");
    }
    if (*bytes > 0) {
      // fallocate reserves the blocks now, so a full drive is an error here rather than at a write
      // in the middle of training; where the file system cannot (EOPNOTSUPP), a sparse file.
      int rc = 0;
      do {
        rc = ::fallocate(fd, 0, 0, static_cast<off_t>(*bytes));
      } while (rc != 0 && errno == EINTR);
      if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
        rc = ::ftruncate(fd, static_cast<off_t>(*bytes));
        if (rc != 0) {
          fail("ftruncate");
        }
      } else if (rc != 0) {
        fail("fallocate");
      }
    }
  }
  created.done = true;
  return file;
}

} // namespace zero::detail
