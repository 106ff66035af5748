// activation_store: checkpoints copied to host memory in forward and brought back in reverse order in backward,
// through a device ring of a set size, on the CPU backend (whose memory is the host's: the bits and the ring's
// bookkeeping; the streams' order is the GPU's to show).

#include "zero/backend/cpu_backend.hpp"
#include "zero/config/config.hpp"
#include "zero/core/error.hpp"
#include "zero/engine/activation_store.hpp"
#include "zero/memory/host_allocator.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <numeric>
#include <string>
#include <vector>

namespace {

using store_t = zero::activation_store<zero::cpu_backend>;

/// Checkpoint k of a pass: `bytes` bytes whose values depend on the pass and k.
std::vector<std::byte> activation(int pass, std::size_t k, std::size_t bytes) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    v[i] = static_cast<std::byte>((i * 31 + k * 7 + static_cast<std::size_t>(pass) * 101) & 0xff);
  }
  return v;
}

std::string thrown(auto&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

} // namespace

TEST_CASE("activation_store: every checkpoint back with its bits, in reverse order, through a ring of three") {
  zero::cpu_backend backend({.threads = 1});
  const auto compute = backend.make_stream();
  // Sizes that are not multiples of the 256-byte alignment; the ring takes the largest three at once.
  const std::vector<std::size_t> sizes{1000, 700, 1300, 256, 999, 1};
  store_t store(backend, compute, {.host_bytes = 8192, .device_bytes = 3 * 1536, .lookahead = 2});
  for (int pass = 0; pass < 3; ++pass) {
    CAPTURE(pass);
    std::vector<std::byte> scratch; // the framework's device memory, reused for every layer as soon as it may be
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      scratch = activation(pass, k, sizes[k]);
      CHECK(store.save(scratch.data(), scratch.size()) == k);
      store.wait_saved(k, compute);
      std::memset(scratch.data(), 0xee, scratch.size()); // overwritten once the copy down is ordered before
    }
    CHECK(store.size() == sizes.size());
    for (std::size_t k = sizes.size(); k-- > 0;) {
      CAPTURE(k);
      const auto* p = static_cast<const std::byte*>(store.fetch(k));
      const auto want = activation(pass, k, sizes[k]);
      CHECK(std::memcmp(p, want.data(), want.size()) == 0);
      store.release(k);
    }
    store.clear();
    CHECK(store.size() == 0);
    CHECK(store.host_used() == 0);
  }
  // The two memories are allocated once, at their sizes, and counted.
  CHECK(store.host_memory().total().peak == 8192);
  CHECK(store.device_memory().total().peak == 3 * 1536);
}

TEST_CASE("activation_store: the host arena refuses a checkpoint past it and keeps what it holds") {
  zero::cpu_backend backend({.threads = 1});
  const auto compute = backend.make_stream();
  store_t store(backend, compute, {.host_bytes = 1024, .device_bytes = 1024});
  const auto a = activation(0, 0, 600);
  CHECK(store.save(a.data(), a.size()) == 0);
  const auto b = activation(0, 1, 400);
  // 600 rounds up to 768: 768 + 400 > 1024.
  CHECK(thrown([&] { (void)store.save(b.data(), b.size()); }) ==
        "[zero.memory_error] activation_store::save: checkpoint 1 of 400 bytes needs 1168 host bytes in this pass, "
        "host_bytes is 1024; expected a larger host_bytes (activation_checkpointing.number_checkpoints)");
  CHECK(store.size() == 1);
  CHECK(std::memcmp(store.fetch(0), a.data(), a.size()) == 0);
  CHECK(thrown([&] { (void)store.save(a.data(), 0); }).find("a checkpoint of 0 bytes") != std::string::npos);
}

TEST_CASE("activation_store: a ring full of checkpoints not released refuses the next, naming them") {
  zero::cpu_backend backend({.threads = 1});
  const auto compute = backend.make_stream();
  store_t store(backend, compute, {.host_bytes = 4096, .device_bytes = 1024, .lookahead = 0});
  std::vector<std::vector<std::byte>> acts;
  for (std::size_t k = 0; k < 3; ++k) {
    acts.push_back(activation(1, k, 512));
    (void)store.save(acts.back().data(), 512);
  }
  const void* two = store.fetch(2);
  const void* one = store.fetch(1);
  CHECK(two != one);
  CHECK(thrown([&] { (void)store.fetch(0); }) ==
        "[zero.memory_error] activation_store::fetch: checkpoint 0 of 512 bytes does not fit in the device ring of "
        "1024 bytes beside checkpoints 2, 1, not released yet; release(id) each checkpoint once the work that reads "
        "it is enqueued, or expected a larger device_bytes");
  store.release(2);
  CHECK(std::memcmp(store.fetch(0), acts[0].data(), 512) == 0); // in the space checkpoint 2 gave back
  CHECK(std::memcmp(one, acts[1].data(), 512) == 0);            // and 1 still where it was
  // Misuse, named.
  CHECK(thrown([&] { (void)store.fetch(2); }).find("checkpoint 2 was released in this pass") != std::string::npos);
  CHECK(thrown([&] { (void)store.fetch(3); }).find("checkpoint 3; this pass has 3") != std::string::npos);
  CHECK(thrown([&] { store.release(2); }).find("checkpoint 2 was released already in this pass") != std::string::npos);
  store.clear();
  CHECK(thrown([&] { store.release(0); }).find("checkpoint 0; this pass has 0") != std::string::npos);
  CHECK(thrown([] {
          zero::cpu_backend b({.threads = 1});
          const auto s = b.make_stream();
          store_t bad(b, s, {.host_bytes = 0, .device_bytes = 16});
        }).find("expected both above 0") != std::string::npos);
}

TEST_CASE("activation_store: the lookahead uploads the next checkpoints while the ring has room") {
  zero::cpu_backend backend({.threads = 1});
  const auto compute = backend.make_stream();
  // Room for four 256-byte checkpoints: fetching 7 brings 6 and 5 along (lookahead 2).
  store_t store(backend, compute, {.host_bytes = 8 * 256, .device_bytes = 4 * 256, .lookahead = 2});
  std::vector<std::vector<std::byte>> acts;
  for (std::size_t k = 0; k < 8; ++k) {
    acts.push_back(activation(2, k, 256));
    (void)store.save(acts.back().data(), 256);
  }
  const auto* base = static_cast<const std::byte*>(store.fetch(7));
  // 6 was uploaded by the fetch of 7, into the next slot: fetching it finds it there.
  CHECK(static_cast<const std::byte*>(store.fetch(6)) == base + 256);
  CHECK(static_cast<const std::byte*>(store.fetch(5)) == base + 512);
  store.release(7);
  store.release(6);
  // 4 came along with 5 (slot 3); 3 wraps to the start, where 7 was.
  CHECK(static_cast<const std::byte*>(store.fetch(4)) == base + 768);
  CHECK(static_cast<const std::byte*>(store.fetch(3)) == base);
  for (std::size_t k : {5, 4, 3}) {
    store.release(k);
  }
  for (std::size_t k = 3; k-- > 0;) {
    CHECK(std::memcmp(store.fetch(k), acts[k].data(), 256) == 0);
    store.release(k);
  }
}

TEST_CASE("activation_store_options_from: the activation_checkpointing block sizes the store") {
  const auto read = [](const std::string& block) {
    return zero::config::from_string(R"({"train_batch_size": 1, "activation_checkpointing": )" + block + "}");
  };
  CHECK_FALSE(zero::activation_store_options_from(read(R"({"cpu_checkpointing": false})"), 1000).has_value());
  // 12 checkpoints of 1000 bytes, each on a 256-byte boundary (1024); a ring of 3, two fetched ahead.
  const auto o =
      zero::activation_store_options_from(read(R"({"cpu_checkpointing": true, "number_checkpoints": 12})"), 1000);
  REQUIRE(o.has_value());
  CHECK(o->host_bytes == 12 * 1024);
  CHECK(o->device_bytes == 3 * 1024);
  CHECK(o->lookahead == 2);
  // null: the framework's count, or a refusal naming the key.
  const auto open = read(R"({"cpu_checkpointing": true, "number_checkpoints": null})");
  CHECK(zero::activation_store_options_from(open, 256, 4, 2)->host_bytes == 4 * 256);
  CHECK(thrown([&] {
          (void)zero::activation_store_options_from(open, 256);
        }).find("activation_checkpointing.number_checkpoints: null with cpu_checkpointing true") != std::string::npos);
}
