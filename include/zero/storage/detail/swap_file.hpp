#pragma once
/// \file
/// `detail::swap_file`: a file that zero creates to hold a rank's state on NVMe (the optimizer's
/// `zero-optimizer-<pid>-<n>-rank<r>.swap`, stage 3's `zero-params-<pid>-<n>-rank<r>.swap`), and the
/// one owner of its life:
/// - created new (the storage's `create` is O_EXCL): a user's file, or a hard link to one, at the
///   name is never truncated or removed; the error names it;
/// - held under a shared `flock` while it lives, so another process can tell it is in use;
/// - removed when its owner goes, also when the owner's constructor throws after creating it (a
///   member, so its destructor runs), and by `create` itself when a step after the open fails.
///
/// A process killed with SIGKILL leaves its files behind. `remove_stale_swap_files` removes, from a
/// folder, the swap files of processes that no longer run: those whose pid (in the name) is not a
/// live process of this host and that no process holds a lock on. The engine calls it for each
/// `nvme_path` before it creates its own files, and logs what it removed.

#include "zero/core/detail/text.hpp"
#include "zero/storage/storage.hpp"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <fcntl.h>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <sys/file.h>
#include <system_error>
#include <unistd.h>
#include <utility>
#include <vector>

namespace zero::detail {

/// The kinds of swap file, the word in their names.
inline constexpr std::string_view swap_kinds[] = {"optimizer", "params"};

/// "zero-<kind>-<pid>-<serial>-rank<rank>.swap".
[[nodiscard]] inline std::string swap_file_name(std::string_view kind, long pid, std::size_t serial, int rank) {
  return cat("zero-", kind, "-", std::to_string(pid), "-", std::to_string(serial), "-rank", std::to_string(rank),
             ".swap");
}

/// The pid in a swap file's name, or nothing when `name` is not exactly a swap file's name.
[[nodiscard]] inline std::optional<long> swap_file_pid(std::string_view name) {
  const auto digits = [](std::string_view& s) -> std::optional<long> {
    std::size_t n = 0;
    long v = 0;
    while (n < s.size() && n < 12 && s[n] >= '0' && s[n] <= '9') {
      v = v * 10 + (s[n] - '0');
      ++n;
    }
    if (n == 0) {
      return std::nullopt;
    }
    s.remove_prefix(n);
    return v;
  };
  const auto eat = [](std::string_view& s, std::string_view word) {
    if (s.substr(0, word.size()) != word) {
      return false;
    }
    s.remove_prefix(word.size());
    return true;
  };
  for (const auto kind : swap_kinds) {
    std::string_view s = name;
    if (!eat(s, "zero-") || !eat(s, kind) || !eat(s, "-")) {
      continue;
    }
    const auto pid = digits(s);
    if (!pid || !eat(s, "-") || !digits(s) || !eat(s, "-rank") || !digits(s) || s != ".swap") {
      return std::nullopt;
    }
    return pid;
  }
  return std::nullopt;
}

/// The serial number the next `swap_file` of this process takes (one counter for every kind, so
/// two engines of a process never share a name); `fetch_add` takes one.
[[nodiscard]] inline std::atomic<std::size_t>& swap_serial() noexcept {
  static std::atomic<std::size_t> serial{0};
  return serial;
}

/// True when `pid` is a process of this host that is still running (or one we may not signal).
[[nodiscard]] inline bool process_alive(long pid) {
  if (pid <= 0 || static_cast<long>(static_cast<pid_t>(pid)) != pid) {
    return false;
  }
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

/// Removes from `dir` the swap files (by name) whose process no longer runs and that no process
/// holds a lock on; a file it cannot open or lock is left alone. Never throws.
/// \returns the names of the files removed.
[[nodiscard]] inline std::vector<std::string> remove_stale_swap_files(const std::filesystem::path& dir) noexcept {
  std::vector<std::string> removed;
  try {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const auto pid = swap_file_pid(name);
      if (!pid || process_alive(*pid) || !it->is_regular_file(ec)) {
        continue;
      }
      const int fd = ::open(it->path().c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
      if (fd < 0) {
        continue;
      }
      // A lock we get means no live process (of any host sharing the folder) holds the file.
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0 && ::unlink(it->path().c_str()) == 0) {
        removed.push_back(name);
      }
      ::close(fd);
    }
  } catch (...) { // NOLINT(bugprone-empty-catch): a sweep that cannot finish removes less
  }
  return removed;
}

/// Removes the stale swap files of `dir` (`remove_stale_swap_files`). Never throws.
/// \returns the engine's log line naming them ("[zero] removed 2 swap files under DIR left by processes
///          that no longer run: a, b"), or an empty string when there were none.
[[nodiscard]] inline std::string sweep_swap_folder(const std::filesystem::path& dir) noexcept {
  try {
    const auto gone = remove_stale_swap_files(dir);
    if (gone.empty()) {
      return {};
    }
    std::string line = cat("[zero] removed ", std::to_string(gone.size()), " swap file", gone.size() == 1 ? "" : "s",
                           " under ", dir.string(), " left by processes that no longer run: ");
    for (std::size_t i = 0; i < gone.size(); ++i) {
      line += cat(i == 0 ? "" : ", ", gone[i]);
    }
    return line;
  } catch (...) { // NOLINT(bugprone-empty-catch): only the line is lost
    return {};
  }
}

/// A swap file of `Storage`; see the file comment. Empty when default-constructed or moved from.
template <storage Storage> class swap_file {
public:
  using file_type = typename Storage::file_type;

  swap_file() = default;
  /// Creates `dir/zero-<kind>-<pid>-<n>-rank<rank>.swap` of `bytes` bytes with `storage` (new, 0600,
  /// not following a symbolic link) and locks it shared.
  /// \throws io_error from the storage, naming the file (EEXIST when a file is at the name).
  swap_file(Storage& storage, const std::filesystem::path& dir, std::string_view kind, int rank, std::uint64_t bytes)
      : path_(dir / swap_file_name(kind, static_cast<long>(::getpid()), swap_serial().fetch_add(1), rank)),
        file_(storage.create(path_, bytes)) {
    if constexpr (requires(const file_type& f) { f.fd(); }) {
      // Shared: the lock says "in use" to a later run's sweep; it is dropped with the descriptor.
      static_cast<void>(::flock(file_.fd(), LOCK_SH | LOCK_NB));
    }
  }
  swap_file(const swap_file&) = delete;
  swap_file& operator=(const swap_file&) = delete;
  swap_file(swap_file&& o) noexcept : path_(std::exchange(o.path_, {})), file_(std::move(o.file_)) {}
  swap_file& operator=(swap_file&& o) noexcept {
    if (this != &o) {
      remove();
      path_ = std::exchange(o.path_, {});
      file_ = std::move(o.file_);
    }
    return *this;
  }
  /// Removes the file. Requests still in flight keep the descriptor open until they complete.
  ~swap_file() { remove(); }

  /// The file's path; empty when there is none.
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }
  /// The open file, for the storage's requests.
  [[nodiscard]] const file_type& file() const noexcept { return file_; }
  /// True when it holds a file.
  [[nodiscard]] bool is_open() const noexcept { return !path_.empty(); }

private:
  void remove() noexcept {
    if (!path_.empty()) {
      std::error_code ec;
      std::filesystem::remove(path_, ec);
      path_.clear();
    }
  }

  std::filesystem::path path_;
  file_type file_{};
};

} // namespace zero::detail
