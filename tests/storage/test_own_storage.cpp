// A framework's own storage, as docs/storage.md shows it ("Bring your own storage"): synchronous
// pread/pwrite inside submit, the outcome kept for wait. It satisfies zero::storage, passes the round
// trip of the spec, and failing_storage wraps it like any other.

#include "storage_spec.hpp"
#include "zero/storage/failing_storage.hpp"
#include "zero/storage/storage.hpp"

#include <cerrno>
#include <cstring>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <map>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace {

/// Every request runs inside submit_read/submit_write; wait reports how it went.
class sync_storage {
public:
  using file_type = zero::storage_file; // a descriptor and its path, closed with the last owner

  std::string_view name() const { return "sync"; }
  std::size_t alignment() const { return 1; }

  file_type create(const std::filesystem::path& path, std::uint64_t bytes) {
    file_type f = open_with(path, O_CREAT | O_EXCL); // new: never truncates a file it did not create
    if (::fchmod(f.fd(), 0600) != 0 || ::ftruncate(f.fd(), static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      throw zero::io_error("creating " + path.string() + " failed: " + std::strerror(err), err);
    }
    return f;
  }
  file_type open(const std::filesystem::path& path) { return open_with(path, 0); }

  zero::storage_ticket submit_read(const file_type& f, std::uint64_t offset, std::span<std::byte> dst) {
    const ssize_t n = ::pread(f.fd(), dst.data(), dst.size(), static_cast<off_t>(offset));
    return done(n == static_cast<ssize_t>(dst.size()), "read of ", f, offset, dst.size());
  }
  zero::storage_ticket submit_write(const file_type& f, std::uint64_t offset, std::span<const std::byte> src) {
    const ssize_t n = ::pwrite(f.fd(), src.data(), src.size(), static_cast<off_t>(offset));
    return done(n == static_cast<ssize_t>(src.size()), "write of ", f, offset, src.size());
  }

  void wait(zero::storage_ticket t) {
    const auto it = failed_.find(t);
    if (it != failed_.end()) {
      const auto [message, err] = it->second;
      failed_.erase(it);
      throw zero::io_error(message, err);
    }
  }
  void wait_all() {
    while (!failed_.empty()) {
      wait(failed_.begin()->first); // the first failure throws; a real storage would finish the rest first
    }
  }

private:
  static file_type open_with(const std::filesystem::path& path, int flags) {
    const int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | flags, 0600);
    if (fd < 0) {
      const int err = errno;
      throw zero::io_error("opening " + path.string() + " failed: " + std::strerror(err), err);
    }
    return file_type(fd, path, 1);
  }
  // A short transfer counts as a failure here (ENOSPC or the end of the file); a real storage loops.
  zero::storage_ticket done(bool ok, const char* what, const file_type& f, std::uint64_t offset, std::size_t bytes) {
    const zero::storage_ticket t = next_++;
    if (!ok) {
      const int err = errno != 0 ? errno : EIO;
      failed_[t] = {what + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " of " +
                        f.path().string() + " failed: " + std::strerror(err),
                    err};
    }
    return t;
  }
  std::map<zero::storage_ticket, std::pair<std::string, int>> failed_;
  zero::storage_ticket next_ = 1;
};

static_assert(zero::storage<sync_storage>);
static_assert(zero::storage<zero::failing_storage<sync_storage>>);

} // namespace

TEST_SUITE("storage.own") {
  TEST_CASE("a framework's own synchronous storage passes the round trip, and failing_storage wraps it") {
    sync_storage s;
    zero_test::spec_round_trip(s);
    zero::failing_storage<sync_storage> failing;
    auto dir = zero_test::storage_dir("own");
    auto f = failing.create(dir / "f.bin", 64);
    std::vector<std::byte> b(64);
    failing.fail_write(0, ENOSPC);
    CHECK_THROWS_WITH_AS(failing.wait(failing.submit_write(f, 0, std::span<const std::byte>(b))),
                         doctest::Contains("No space left on device (ENOSPC) (injected by failing_storage)"),
                         zero::io_error);
  }
}
