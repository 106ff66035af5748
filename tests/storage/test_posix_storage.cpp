// zero::posix_storage: the storage spec (storage_spec.hpp) with one, several and odd-sized pieces,
// requests of any alignment, and a storage destroyed with requests queued.

#include "storage_spec.hpp"
#include "zero/storage/posix_storage.hpp"

#include <doctest/doctest.h>

using namespace zero_test;

TEST_SUITE("storage.posix") {
  TEST_CASE("posix_storage round trip, several files, a second descriptor") {
    zero::posix_storage s;
    CHECK(s.name() == "posix");
    CHECK(s.alignment() == 1);
    CHECK(s.options() == zero::storage_options{});
    spec_round_trip(s);
  }

  TEST_CASE("posix_storage cuts requests into blocks, on one and on several threads") {
    for (const unsigned threads : {1u, 3u}) {
      CAPTURE(threads);
      const zero::storage_options o{.block_size = 64 * 1024, .queue_depth = 4, .thread_count = threads};
      zero::posix_storage s(o);
      spec_multi_block(s, o);
      spec_many_in_flight(s);
    }
  }

  TEST_CASE("posix_storage takes any address, offset and length, and a block of any size") {
    auto dir = storage_dir("posix_odd");
    zero::posix_storage s({.block_size = 1000, .queue_depth = 1, .thread_count = 2});
    auto f = s.create(dir / "odd.bin", 100003);
    const auto x = random_bytes(12345, 7);
    std::vector<std::byte> src(x.size() + 1);
    std::copy(x.begin(), x.end(), src.begin() + 1); // an odd address
    s.wait(s.submit_write(f, 777, std::span<const std::byte>(src).subspan(1)));
    std::vector<std::byte> dst(x.size() + 3);
    s.wait(s.submit_read(f, 777, std::span<std::byte>(dst).subspan(3)));
    CHECK(std::equal(x.begin(), x.end(), dst.begin() + 3));
    CHECK(std::filesystem::file_size(dir / "odd.bin") == 100003);
  }

  TEST_CASE("posix_storage creates files 0600 whatever the umask, and follows no symbolic link") {
    zero::posix_storage s;
    spec_create_mode(s);
    spec_symlink_refused(s);
    spec_nul_path_refused(s);
    spec_failed_create_leaves_nothing(s);
  }

  TEST_CASE("posix_storage errors name the path, the request and errno") {
    zero::posix_storage s;
    spec_open_and_read_errors(s);
    const zero::storage_options o{.block_size = 96 * 1024};
    zero::posix_storage limited(o);
    spec_file_size_limit(limited, o);
  }

  TEST_CASE("posix_storage tickets, and a file dropped with its request in flight") {
    zero::posix_storage s({.block_size = 4096});
    spec_tickets(s);
    zero::storage_file none;
    std::vector<std::byte> b(16);
    CHECK_THROWS_WITH_AS((void)s.submit_read(none, 0, b), doctest::Contains("holds no file"), zero::usage_error);
  }

  TEST_CASE("posix_storage destroyed with requests queued drops them and joins its thread") {
    auto dir = storage_dir("posix_drop");
    std::vector<std::byte> b(1 << 20);
    {
      zero::posix_storage s({.block_size = 4096});
      auto f = s.create(dir / "drop.bin", b.size());
      for (int i = 0; i < 8; ++i) {
        (void)s.submit_write(f, 0, std::span<const std::byte>(b));
      }
    }
    CHECK(std::filesystem::file_size(dir / "drop.bin") == b.size());
  }
}
