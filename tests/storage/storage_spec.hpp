#pragma once
// The storage spec every policy passes (posix_storage, uring_storage, failing_storage over them):
// each check a function template over the storage, called from one TEST_CASE per policy.

#include "../io/support.hpp"
#include "../support/file_size_limit.hpp"
#include "zero/storage/storage.hpp"

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <tuple>
#include <utility>
#include <vector>

#ifndef TMPFS_MAGIC
#define TMPFS_MAGIC 0x01021994
#endif

namespace zero_test {

namespace fs = std::filesystem;

/// A fresh directory for storage files: under the system temp directory unless that is tmpfs (which
/// may refuse O_DIRECT), else under the build directory.
inline temp_dir storage_dir(std::string_view tag) {
  const fs::path tmp = fs::temp_directory_path();
  struct statfs st {};
  const bool tmpfs = ::statfs(tmp.c_str(), &st) == 0 && static_cast<unsigned long>(st.f_type) == TMPFS_MAGIC;
  return temp_dir(tag, tmpfs ? fs::path(ZERO_STORAGE_TEST_BUILD_DIR) : tmp);
}

/// `n` random bytes from `seed`.
inline std::vector<std::byte> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) {
    b = static_cast<std::byte>(gen() & 0xffu);
  }
  return v;
}

inline bool has(const std::string& text, std::string_view part) {
  const bool found = text.find(part) != std::string::npos;
  if (!found) {
    MESSAGE("\"" << part << "\" not in: " << text);
  }
  return found;
}

/// what() and status() of the io_error `f()` throws; fails the test when it throws nothing or another exception.
template <class F> std::pair<std::string, int> io_error_of(F&& f) {
  try {
    f();
  } catch (const zero::io_error& e) {
    return {e.what(), e.status()};
  } catch (const std::exception& e) {
    FAIL("expected an io_error, got: " << e.what());
  }
  FAIL("expected an io_error");
  return {};
}

/// A storage buffer holding `data` (its size a multiple of the alignment).
template <class S> zero::buffer<std::byte, zero::host_allocator> staged(const S& s, std::span<const std::byte> data) {
  auto b = zero::storage_buffer(s, data.size());
  std::copy(data.begin(), data.end(), b.data());
  return b;
}

/// Writes `data` at `offset` of `f` and waits.
template <class S, class F> void write_now(S& s, const F& f, std::uint64_t offset, std::span<const std::byte> data) {
  auto b = staged(s, data);
  s.wait(s.submit_write(f, offset, std::span<const std::byte>(b.data(), data.size())));
}

/// Reads `n` bytes at `offset` of `f` and waits.
template <class S, class F> std::vector<std::byte> read_now(S& s, const F& f, std::uint64_t offset, std::size_t n) {
  auto b = zero::storage_buffer(s, n);
  s.wait(s.submit_read(f, offset, std::span<std::byte>(b.data(), n)));
  return {b.data(), b.data() + n};
}

/// Random bytes written and read back equal, in one request and across two files; the file has the
/// size asked for.
template <class S> void spec_round_trip(S& s) {
  auto dir = storage_dir("round_trip");
  const std::size_t a = s.alignment();
  const std::size_t n = 8 * a;
  auto f = s.create(dir / "a.bin", 3 * n);
  auto g = s.create(dir / "b.bin", n);
  CHECK(fs::file_size(dir / "a.bin") == 3 * n);
  CHECK(f.path() == dir / "a.bin");
  const auto x = random_bytes(n, 1), y = random_bytes(n, 2);
  write_now(s, f, n, x);
  write_now(s, g, 0, y);
  CHECK(read_now(s, f, n, n) == x);
  CHECK(read_now(s, g, 0, n) == y);
  CHECK(read_now(s, f, 0, n) == std::vector<std::byte>(n)); // created zero-filled
  // Through a second descriptor: the bytes are in the file, not only in the storage.
  auto h = s.open(dir / "a.bin");
  CHECK(read_now(s, h, n, n) == x);
  // A request of no bytes completes.
  s.wait(s.submit_write(f, 0, std::span<const std::byte>{}));
}

/// Requests larger than a block and than queue_depth blocks (`s` built with small blocks), at an
/// offset that is not a multiple of the block.
template <class S> void spec_multi_block(S& s, const zero::storage_options& o) {
  auto dir = storage_dir("multi_block");
  const std::size_t a = s.alignment();
  const auto aligned = [&](std::size_t bytes) { return (bytes + a - 1) / a * a; };
  const std::size_t n = aligned(o.queue_depth * o.block_size * 3) + 5 * a; // rounds of the queue, a partial block
  const std::uint64_t offset = 7 * a;
  auto f = s.create(dir / "big.bin", offset + n);
  const auto x = random_bytes(n, 3);
  write_now(s, f, offset, x);
  CHECK(read_now(s, f, offset, n) == x);
  const std::size_t inside = aligned(o.block_size + 1); // a read across the first piece's end
  CHECK(read_now(s, f, offset + inside - a, 2 * a) ==
        std::vector<std::byte>(x.begin() + static_cast<std::ptrdiff_t>(inside - a),
                               x.begin() + static_cast<std::ptrdiff_t>(inside + a)));
}

/// Many writes in flight at once, then wait_all; many reads waited for one by one in reverse order.
template <class S> void spec_many_in_flight(S& s) {
  auto dir = storage_dir("in_flight");
  const std::size_t a = s.alignment();
  constexpr std::size_t count = 64;
  const std::size_t n = 4 * a;
  auto f = s.create(dir / "many.bin", count / 2 * n);
  auto g = s.create(dir / "other.bin", count / 2 * n);
  const auto x = random_bytes(count * n, 4);
  auto src = staged(s, x);
  // The first half of the requests to f, the second to g, each file written front to back: written
  // ranges alternating with unwritten ones in a fallocated file make its unlink slow on ext4 with
  // the discard option (half a second here), which is not what this tests.
  const auto file = [&](std::size_t i) -> const auto& { return i < count / 2 ? f : g; };
  const auto at = [&](std::size_t i) { return (i % (count / 2)) * n; };
  for (std::size_t i = 0; i < count; ++i) {
    (void)s.submit_write(file(i), at(i), std::span<const std::byte>(src.data() + i * n, n));
  }
  s.wait_all();
  auto dst = zero::storage_buffer(s, count * n);
  std::vector<zero::storage_ticket> tickets;
  for (std::size_t i = 0; i < count; ++i) {
    tickets.push_back(s.submit_read(file(i), at(i), std::span<std::byte>(dst.data() + i * n, n)));
  }
  for (auto t = tickets.rbegin(); t != tickets.rend(); ++t) {
    s.wait(*t);
  }
  CHECK(std::equal(x.begin(), x.end(), dst.data()));
}

/// A created file has mode 0600 under umask 0. An existing file at the name, or a hard link to one,
/// is never opened: io_error EEXIST naming it and saying the storage creates only new files; the
/// file keeps its bytes and mode.
template <class S> void spec_create_mode(S& s) {
  auto dir = storage_dir("mode");
  const mode_t old = ::umask(0);
  struct restore {
    mode_t mask;
    ~restore() { ::umask(mask); }
  } guard{old};
  const auto mode = [](const fs::path& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  { auto f = s.create(dir / "new.bin", 4 * s.alignment()); }
  CHECK(mode(dir / "new.bin") == 0600);
  write_bytes(dir / "old.bin", "a user's 31 bytes, not a swap f");
  fs::permissions(dir / "old.bin", static_cast<fs::perms>(0644));
  fs::create_hard_link(dir / "old.bin", dir / "hard.bin");
  for (const char* name : {"old.bin", "hard.bin"}) {
    const auto [message, status] = io_error_of([&] { (void)s.create(dir / name, s.alignment()); });
    CHECK(status == EEXIST);
    CHECK(has(message, "creating " + (dir / name).string()));
    CHECK(has(message, "(EEXIST)"));
    CHECK(has(message, "creates only new files and never truncates one it did not create"));
  }
  CHECK(mode(dir / "old.bin") == 0644);
  CHECK(fs::file_size(dir / "old.bin") == 31);
}

/// A symbolic link is not followed: create refuses it (EEXIST, saying it is a symbolic link), open
/// too (ELOOP); the target is untouched.
template <class S> void spec_symlink_refused(S& s) {
  auto dir = storage_dir("symlink");
  write_bytes(dir / "target", "precious");
  fs::create_symlink(dir / "target", dir / "link");
  fs::create_symlink(dir / "nowhere", dir / "dangling");
  for (const char* name : {"link", "dangling"}) {
    const auto [created, status] = io_error_of([&] { (void)s.create(dir / name, s.alignment()); });
    CHECK(status == EEXIST);
    CHECK(has(created, "creating " + (dir / name).string()));
    CHECK(has(created, "symbolic link"));
  }
  CHECK_FALSE(fs::exists(dir / "nowhere"));
  const auto [opened, open_status] = io_error_of([&] { (void)s.open(dir / "link"); });
  CHECK(open_status == ELOOP);
  CHECK(has(opened, "opening " + (dir / "link").string()));
  CHECK(fs::file_size(dir / "target") == 8);
}

/// A path holding a NUL never reaches the operating system: io_error EINVAL naming the byte, and the
/// file its C string would name is neither created nor truncated.
template <class S> void spec_nul_path_refused(S& s) {
  auto dir = storage_dir("nul");
  write_bytes(dir / "victim", "precious");
  const std::string path = (dir / "victim").string() + std::string(1, '\0') + "/y";
  const auto [message, status] = io_error_of([&] { (void)s.create(fs::path(path), s.alignment()); });
  CHECK(status == EINVAL);
  CHECK(has(message, "with a NUL character at byte " + std::to_string((dir / "victim").string().size())));
  CHECK(has(message, "the operating system would use \"" + (dir / "victim").string() + "\" instead"));
  CHECK(fs::file_size(dir / "victim") == 8);
  CHECK_THROWS_WITH_AS((void)s.open(fs::path(path)), doctest::Contains("NUL character"), zero::io_error);
}

/// A create that fails after its open (fallocate past the file size limit: EFBIG) removes the file it
/// made, so a failed start leaves no 0-byte file behind.
template <class S> void spec_failed_create_leaves_nothing(S& s) {
  auto dir = storage_dir("failed_create");
  const std::size_t limit = 128 * 1024;
  std::string message;
  int status = 0;
  {
    file_size_limit lower(limit);
    std::tie(message, status) = io_error_of([&] { (void)s.create(dir / "big.bin", 4 * limit); });
  }
  CHECK(status == EFBIG);
  CHECK(has(message, "creating " + (dir / "big.bin").string()));
  CHECK_FALSE(fs::exists(dir / "big.bin"));
}

/// Opening a missing file names it and ENOENT; reading past the end names the request and where the
/// file ends (ENODATA).
template <class S> void spec_open_and_read_errors(S& s) {
  auto dir = storage_dir("errors");
  const auto [missing, status] = io_error_of([&] { (void)s.open(dir / "missing.bin"); });
  CHECK(status == ENOENT);
  CHECK(has(missing, "[zero.io_error] opening " + (dir / "missing.bin").string() +
                         " failed: No such file or directory (ENOENT)"));
  const std::size_t a = s.alignment();
  auto f = s.create(dir / "short.bin", 2 * a);
  const auto [eof, eof_status] = io_error_of([&] { (void)read_now(s, f, 0, 4 * a); });
  CHECK(eof_status == ENODATA);
  CHECK(has(eof, "read of " + std::to_string(4 * a) + " bytes at offset 0 from " + (dir / "short.bin").string() +
                     " failed: the file ends at byte " + std::to_string(2 * a) + " (ENODATA)"));
}

/// Tickets: a ticket never given is a usage_error; one already waited for returns at once; a file
/// dropped while its request is in flight stays open until the request is done.
template <class S> void spec_tickets(S& s) {
  auto dir = storage_dir("tickets");
  CHECK_THROWS_AS(s.wait(0), zero::usage_error);
  CHECK_THROWS_WITH_AS(s.wait(1000000), doctest::Contains("never gave"), zero::usage_error);
  const std::size_t a = s.alignment();
  const auto x = random_bytes(64 * a, 5);
  auto src = staged(s, x);
  zero::storage_ticket t = 0;
  {
    auto f = s.create(dir / "dropped.bin", x.size());
    t = s.submit_write(f, 0, std::span<const std::byte>(src.data(), x.size()));
  }
  s.wait(t);
  s.wait(t); // waited already: returns
  auto g = s.open(dir / "dropped.bin");
  CHECK(read_now(s, g, 0, x.size()) == x);
}

/// A real failure: a write that crosses the file size limit (128 KiB) is short, then refused
/// (EFBIG); the error names the whole request; the bytes below the limit were written. `s` is built
/// with 96 KiB blocks, so the limit falls inside the second piece.
template <class S> void spec_file_size_limit(S& s, const zero::storage_options& o) {
  auto dir = storage_dir("fsize");
  const std::size_t limit = 128 * 1024;
  const std::size_t n = 3 * o.block_size;
  REQUIRE(o.block_size < limit);
  REQUIRE(2 * o.block_size > limit);
  auto f = s.create(dir / "limited.bin", 0);
  const auto x = random_bytes(n, 6);
  auto src = staged(s, x);
  std::string message;
  int status = 0;
  {
    file_size_limit lower(limit);
    std::tie(message, status) =
        io_error_of([&] { s.wait(s.submit_write(f, 0, std::span<const std::byte>(src.data(), n))); });
  }
  CHECK(status == EFBIG);
  CHECK(has(message, "write of " + std::to_string(n) + " bytes at offset 0 to " + (dir / "limited.bin").string() +
                         " failed: File too large (EFBIG)"));
  CHECK(fs::file_size(dir / "limited.bin") == limit);
  CHECK(read_now(s, f, 0, limit) == std::vector<std::byte>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(limit)));
}

} // namespace zero_test
