// The storage concept and its shared parts: storage_options from DeepSpeed's aio block, the words
// of its errors; failing_storage over posix_storage (and over uring_storage where there is one).

#include "storage_spec.hpp"
#include "zero/storage/failing_storage.hpp"
#include "zero/storage/posix_storage.hpp"
#include "zero/storage/storage.hpp"

#include <cerrno>
#include <doctest/doctest.h>
#include <string>

#if defined(ZERO_HAS_URING)
#include "zero/storage/uring_storage.hpp"
#endif

using namespace zero_test;

namespace {

/// A storage that is not one: its submit_write returns no ticket.
struct not_a_storage {
  using file_type = zero::storage_file;
  std::string_view name() const { return "not"; }
  std::size_t alignment() const { return 1; }
  file_type create(const std::filesystem::path&, std::uint64_t);
  file_type open(const std::filesystem::path&);
  zero::storage_ticket submit_read(const file_type&, std::uint64_t, std::span<std::byte>);
  void submit_write(const file_type&, std::uint64_t, std::span<const std::byte>);
  void wait(zero::storage_ticket);
  void wait_all();
};

} // namespace

TEST_SUITE("storage.options") {
  TEST_CASE("the storage concept") {
    static_assert(zero::storage<zero::posix_storage>);
    static_assert(zero::storage<zero::failing_storage<zero::posix_storage>>);
    static_assert(!zero::storage<not_a_storage>);
    static_assert(!zero::storage<int>);
    static_assert(std::movable<zero::posix_storage>);
    static_assert(!std::copyable<zero::storage_file>);
  }

  TEST_CASE("storage_options_from takes DeepSpeed's aio block as it is") {
    CHECK(zero::storage_options_from(zero::aio_config{}) == zero::storage_options{});
    const zero::aio_config aio{
        .block_size = 262144, .queue_depth = 32, .thread_count = 4, .single_submit = true, .overlap_events = false};
    const zero::storage_options o = zero::storage_options_from(aio);
    CHECK(o.block_size == 262144);
    CHECK(o.queue_depth == 32);
    CHECK(o.thread_count == 4);
    CHECK(o.single_submit);
    CHECK_FALSE(o.overlap_events);
  }

  TEST_CASE("storage_options_from names the key and what it expects") {
    struct bad {
      zero::aio_config aio;
      const char* message;
    };
    const bad cases[] = {
        {{.block_size = 0}, "aio.block_size: expected an integer from 1 to 1073741824, got 0"},
        {{.block_size = (std::int64_t{1} << 30) + 1}, "aio.block_size: expected an integer from 1 to 1073741824"},
        {{.queue_depth = 0}, "aio.queue_depth: expected an integer from 1 to 32768, got 0"},
        {{.queue_depth = 40000}, "aio.queue_depth: expected an integer from 1 to 32768, got 40000"},
        {{.thread_count = -2}, "aio.thread_count: expected an integer from 1 to 1024, got -2"},
    };
    for (const bad& c : cases) {
      CHECK_THROWS_WITH_AS((void)zero::storage_options_from(c.aio), doctest::Contains(c.message), zero::config_error);
    }
    CHECK_THROWS_WITH_AS(zero::posix_storage({.block_size = 0}),
                         doctest::Contains("posix storage: storage_options::block_size must be from 1 to 1073741824"),
                         zero::usage_error);
    CHECK_THROWS_WITH_AS(zero::posix_storage({.thread_count = 0}),
                         doctest::Contains("storage_options::thread_count must be from 1 to 1024, got 0"),
                         zero::usage_error);
  }

  TEST_CASE("the words of a storage error") {
    using zero::detail::io_op;
    const zero::io_error e =
        zero::detail::request_error(io_op::write, "/mnt/nvme/zero/rank0.optimizer", 4194304, 1048576, {.err = ENOSPC});
    CHECK(std::string(e.what()) == "[zero.io_error] write of 1048576 bytes at offset 4194304 to "
                                   "/mnt/nvme/zero/rank0.optimizer failed: No space left on device (ENOSPC)");
    CHECK(e.status() == ENOSPC);
    const zero::io_error stalled =
        zero::detail::request_error(io_op::write, "/f", 0, 8192, {.err = ENOSPC, .stalled = true, .at = 4096});
    CHECK(has(stalled.what(), "No space left on device (ENOSPC); the write made no progress at byte 4096"));
    const zero::io_error eio = zero::detail::request_error(io_op::read, "/f", 512, 64, {.err = EIO});
    CHECK(std::string(eio.what()) ==
          "[zero.io_error] read of 64 bytes at offset 512 from /f failed: Input/output error (EIO)");
    CHECK(has(zero::detail::with_more_failures(eio, 2).what(), "(EIO) (and 2 more requests failed)"));
    // A file system that refuses O_DIRECT (tmpfs before Linux 6.6), as the uring storage words it.
    const zero::io_error direct = zero::detail::open_error("uring", "creating /dev/shm/x (4096 bytes)", EINVAL, true);
    CHECK(std::string(direct.what()) ==
          "[zero.io_error] creating /dev/shm/x (4096 bytes) failed: Invalid argument (EINVAL); its file system "
          "refuses O_DIRECT, which the uring storage needs: use a file system that supports O_DIRECT (ext4 or xfs on "
          "the NVMe drive), or the posix storage");
    CHECK(direct.status() == EINVAL);
    CHECK(zero::detail::errno_name(ENOSPC) == "ENOSPC");
  }
}

namespace {

/// failing_storage over `S`: planned write and read failures by count across files, with the words
/// of a real failure, nothing written; wait_all reports the first and completes everything.
template <class S> void spec_failing(zero::failing_storage<S>& s) {
  auto dir = storage_dir("failing");
  const std::size_t a = s.alignment();
  const std::size_t n = 16 * a;
  auto f = s.create(dir / "f.bin", 4 * n);
  auto g = s.create(dir / "g.bin", 4 * n);
  const auto x = random_bytes(4 * n, 8);
  auto src = staged(s, x);
  const auto part = [&](std::size_t i) { return std::span<const std::byte>(src.data() + i * n, n); };

  s.fail_write(1, ENOSPC); // the second write from now, whichever file
  s.wait(s.submit_write(f, 0, part(0)));
  const auto [full, status] = io_error_of([&] { s.wait(s.submit_write(g, n, part(1))); });
  CHECK(status == ENOSPC);
  CHECK(full == "[zero.io_error] write of " + std::to_string(n) + " bytes at offset " + std::to_string(n) + " to " +
                    (dir / "g.bin").string() +
                    " failed: No space left on device (ENOSPC) (injected by failing_storage)");
  s.wait(s.submit_write(g, 2 * n, part(2)));
  CHECK(s.writes() == 3);
  CHECK(read_now(s, g, n, n) == std::vector<std::byte>(n)); // the failed write wrote nothing
  CHECK(read_now(s, g, 2 * n, n) == std::vector<std::byte>(x.begin() + 2 * n, x.begin() + 3 * n));

  s.fail_read(0, EIO);
  const auto [bad_read, read_status] = io_error_of([&] { (void)read_now(s, f, 0, n); });
  CHECK(read_status == EIO);
  CHECK(has(bad_read, "read of " + std::to_string(n) + " bytes at offset 0 from " + (dir / "f.bin").string() +
                          " failed: Input/output error (EIO)"));
  CHECK(read_now(s, f, 0, n) == std::vector<std::byte>(x.begin(), x.begin() + n));
  CHECK(s.reads() == 4);

  // Two failures among requests in flight: wait_all completes all, then reports the first.
  s.fail_write(1, EIO);
  s.fail_write(3, ENOSPC);
  for (std::size_t i = 0; i < 4; ++i) {
    (void)s.submit_write(f, i * n, part(i));
  }
  const auto [first, first_status] = io_error_of([&] { s.wait_all(); });
  CHECK(first_status == EIO);
  CHECK(has(first, "write of " + std::to_string(n) + " bytes at offset " + std::to_string(n) + " to " +
                       (dir / "f.bin").string() + " failed: Input/output error (EIO) (injected by failing_storage)"));
  CHECK(has(first, "(and 1 more request failed)"));
  s.wait_all(); // nothing left
  CHECK(read_now(s, f, 2 * n, n) == std::vector<std::byte>(x.begin() + 2 * n, x.begin() + 3 * n));
  CHECK_THROWS_AS(s.wait(12345), zero::usage_error);
}

} // namespace

TEST_SUITE("storage.failing") {
  TEST_CASE("failing_storage over posix_storage") {
    zero::failing_storage<zero::posix_storage> s(zero::storage_options{.block_size = 4096});
    CHECK(s.name() == "posix");
    spec_failing(s);
    spec_round_trip(s);
  }

#if defined(ZERO_HAS_URING)
  TEST_CASE("failing_storage over uring_storage") {
    try {
      zero::failing_storage<zero::uring_storage> s;
      spec_failing(s);
      std::vector<std::byte> b(100);
      s.fail_write(0, EIO);
      auto dir = storage_dir("failing_align");
      auto f = s.create(dir / "x", 4096);
      CHECK_THROWS_WITH_AS((void)s.submit_write(f, 0, std::span<const std::byte>(b)),
                           doctest::Contains("is not a multiple of 4096, the uring storage's alignment"),
                           zero::usage_error);
    } catch (const zero::io_error& e) {
      if (e.status() != ENOSYS && e.status() != EPERM) {
        throw;
      }
      MESSAGE("skipped: io_uring is not available here: " << e.what());
    }
  }
#endif
}
