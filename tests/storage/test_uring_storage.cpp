// zero::uring_storage: the storage spec (storage_spec.hpp) through io_uring and O_DIRECT with each
// submission mode, the alignment it asks for, and a file system that refuses O_DIRECT. Where the
// kernel or the container has no io_uring, each case says so and passes.

#include "storage_spec.hpp"
#include "zero/storage/uring_storage.hpp"

#include <cstdint>
#include <doctest/doctest.h>
#include <optional>
#include <sys/vfs.h>

using namespace zero_test;

namespace {

/// A uring_storage with `o`, or nothing (and a message) where io_uring is not available.
std::optional<zero::uring_storage> uring(const zero::storage_options& o = {}) {
  try {
    return std::optional<zero::uring_storage>(std::in_place, o);
  } catch (const zero::io_error& e) {
    if (e.status() == ENOSYS || e.status() == EPERM) {
      MESSAGE("skipped: io_uring is not available here: " << e.what());
      return std::nullopt;
    }
    throw;
  }
}

} // namespace

TEST_SUITE("storage.uring") {
  TEST_CASE("uring_storage round trip, several files, a second descriptor") {
    auto s = uring();
    if (!s) {
      return;
    }
    CHECK(s->name() == "uring");
    CHECK(s->alignment() >= 4096);
    spec_round_trip(*s);
    CHECK(s->alignment() % 4096 == 0);
  }

  TEST_CASE("uring_storage cuts requests into blocks with each way of submitting") {
    for (const bool single : {false, true}) {
      for (const bool overlap : {true, false}) {
        for (const unsigned threads : {1u, 2u}) {
          CAPTURE(single);
          CAPTURE(overlap);
          CAPTURE(threads);
          const zero::storage_options o{.block_size = 64 * 1024,
                                        .queue_depth = 4,
                                        .thread_count = threads,
                                        .single_submit = single,
                                        .overlap_events = overlap};
          auto s = uring(o);
          if (!s) {
            return;
          }
          spec_multi_block(*s, o);
          spec_many_in_flight(*s);
        }
      }
    }
  }

  TEST_CASE("uring_storage rounds a block that is not a multiple of the alignment down to one") {
    const zero::storage_options o{.block_size = 10000, .queue_depth = 2};
    auto s = uring(o);
    if (!s) {
      return;
    }
    spec_multi_block(*s, o);
  }

  TEST_CASE("uring_storage creates files 0600 whatever the umask, and follows no symbolic link") {
    auto s = uring();
    if (!s) {
      return;
    }
    spec_create_mode(*s);
    spec_symlink_refused(*s);
    spec_nul_path_refused(*s);
    spec_failed_create_leaves_nothing(*s);
  }

  TEST_CASE("uring_storage errors name the path, the request and errno") {
    auto s = uring();
    if (!s) {
      return;
    }
    spec_open_and_read_errors(*s);
    const zero::storage_options o{.block_size = 96 * 1024};
    auto limited = uring(o);
    spec_file_size_limit(*limited, o);
  }

  TEST_CASE("uring_storage tickets, and a file dropped with its request in flight") {
    auto s = uring({.block_size = 4096});
    if (!s) {
      return;
    }
    spec_tickets(*s);
  }

  TEST_CASE("uring_storage refuses a misaligned buffer, offset or length, naming the value and the alignment") {
    auto s = uring();
    if (!s) {
      return;
    }
    auto dir = storage_dir("uring_align");
    auto f = s->create(dir / "aligned.bin", 1 << 20);
    const std::size_t a = s->alignment();
    auto b = zero::storage_buffer(*s, 4 * a);
    const std::span<std::byte> whole(b.data(), 4 * a);
    const std::string path = (dir / "aligned.bin").string();
    CHECK_THROWS_WITH_AS((void)s->submit_read(f, 0, whole.subspan(1, 2 * a)),
                         doctest::Contains("the buffer address 0x"), zero::usage_error);
    CHECK_THROWS_WITH_AS(
        (void)s->submit_write(f, 100, whole.first(a)),
        doctest::Contains(("uring storage: the offset 100 of the write of " + std::to_string(a) +
                           " bytes at offset 100 to " + path + " is not a multiple of " + std::to_string(a))
                              .c_str()),
        zero::usage_error);
    CHECK_THROWS_WITH_AS((void)s->submit_read(f, 0, whole.first(1000)),
                         doctest::Contains("the length 1000 of the read of 1000 bytes"), zero::usage_error);
    // A buffer from storage_buffer is aligned and rounded up to the alignment.
    auto odd = zero::storage_buffer(*s, 5000);
    CHECK(odd.size() % a == 0);
    CHECK(odd.size() >= 5000);
    CHECK(reinterpret_cast<std::uintptr_t>(odd.data()) % a == 0);
  }

  TEST_CASE("uring_storage on tmpfs: O_DIRECT refused is an io_error naming the path and EINVAL") {
    auto s = uring();
    if (!s) {
      return;
    }
    struct statfs st {};
    if (::statfs("/dev/shm", &st) != 0 || static_cast<unsigned long>(st.f_type) != TMPFS_MAGIC) {
      MESSAGE("skipped: no tmpfs at /dev/shm");
      return;
    }
    temp_dir dir("uring_tmpfs", "/dev/shm");
    try {
      auto f = s->create(dir / "direct.bin", 4096);
      // Linux 6.6 and later give tmpfs O_DIRECT: then it works like any other file system.
      MESSAGE("skipped: this kernel's tmpfs accepts O_DIRECT (Linux 6.6 and later), so the refusal cannot be shown");
      CHECK(read_now(*s, f, 0, 4096) == std::vector<std::byte>(4096));
    } catch (const zero::io_error& e) {
      CHECK(e.status() == EINVAL);
      CHECK(has(e.what(), "creating " + (dir / "direct.bin").string()));
      CHECK(has(e.what(), "Invalid argument (EINVAL)"));
      CHECK(has(e.what(), "use a file system that supports O_DIRECT"));
    }
  }
}
