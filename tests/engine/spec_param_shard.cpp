// detail::param_shard: stage 3's shard in model-state memory or, with offload_param cpu, in host
// memory of its own, and how a slice reaches a gathered unit and comes back. With cpu_backend every
// copy has finished when it returns, so the spec checks the stream and event protocol of the upload
// through a backend that logs each call (what a GPU run relies on), and where the bytes are counted.

#include "part_kit.hpp"
#include "zero/engine/residency/detail/param_shard.hpp"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <doctest/doctest.h>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zero::testing::shard_spec {
namespace {

/// The calls param_shard makes, logged as "record e1 on s0", "s1 waits e1", "sync s1", "cast 3 on s0",
/// "copy 12 B on s1"; the copies are done at once. With `Copy` false it has no `copy`.
template <bool Copy> struct logging_backend {
  using stream_type = named_stream;
  using event_type = named_event;
  using allocator_type = host_allocator;
  std::vector<std::string>* log;
  int streams = 0;
  int events = 0;
  [[nodiscard]] std::string_view name() const noexcept { return "logging"; }
  [[nodiscard]] host_allocator get_allocator() const { return {}; }
  named_stream make_stream() { return {++streams}; }
  named_event make_event() { return {++events}; }
  void record(named_event& e, const named_stream& s) {
    log->push_back("record e" + std::to_string(e.id) + " on s" + std::to_string(s.id));
  }
  void wait(const named_stream& s, const named_event& e) {
    log->push_back("s" + std::to_string(s.id) + " waits e" + std::to_string(e.id));
  }
  void synchronize(const named_stream& s) { log->push_back("sync s" + std::to_string(s.id)); }
  void synchronize(const named_event& /*e*/) {}
  template <class T> T read_scalar(const T* p, const named_stream& /*s*/) { return *p; }
  template <class T> void fill(T* x, std::size_t n, T value, const named_stream& s) {
    log->push_back("fill " + std::to_string(n) + " on s" + std::to_string(s.id));
    std::fill(x, x + n, value);
  }
  template <class S, class D> void cast(const S* src, D* dst, std::size_t n, const named_stream& s) {
    log->push_back("cast " + std::to_string(n) + " on s" + std::to_string(s.id));
    std::transform(src, src + n, dst, [](S x) { return from_float<D>(to_float(x)); });
  }
  void copy(const void* src, void* dst, std::size_t bytes, const named_stream& s) const requires Copy {
    log->push_back("copy " + std::to_string(bytes) + " B on s" + std::to_string(s.id));
    std::memcpy(dst, src, bytes);
  }
};
static_assert(can_copy<logging_backend<true>>);
static_assert(!can_copy<logging_backend<false>>);

/// Host memory that claims the host cannot touch it (as a GPU's), for the refusal.
struct device_only_allocator : host_allocator {
  static constexpr bool host_accessible = false;
  static constexpr bool device_accessible = true;
};

template <bool Copy, class A = host_allocator>
using shard_t = detail::param_shard<logging_backend<Copy>, A, host_allocator>;

/// A logging backend, the engine's stream s0, the log and the two counted memories.
struct logged_kit {
  std::vector<std::string> log;
  logging_backend<true> backend{&log};
  named_stream main{0};
  host_counting state{};
  host_counting host{};
  /// The log so far, which starts again empty.
  std::vector<std::string> take() { return std::exchange(log, {}); }
};

} // namespace

TEST_CASE("param_shard: in model-state memory a slice reaches its unit by a cast on the engine's stream") {
  logged_kit k;
  {
    shard_t<true> shard(k.backend, k.main, k.state, std::nullopt, 6 * sizeof(float));
    CHECK_FALSE(shard.offloaded());
    CHECK(shard.host_memory() == nullptr);
    CHECK(k.state.live(memory_tag::params) == 6 * sizeof(float));
    CHECK(k.host.total().peak == 0);
    // Zeroed when made, padding included (qwZ quantizes whole blocks of it): 24 bytes as 12 bf16 zeros.
    CHECK(k.take() == std::vector<std::string>{"fill 12 on s0"});
    auto* mine = as<float>(shard.data());
    CHECK(std::all_of(mine, mine + 6, [](float x) { return x == 0.0f; }));
    std::fill(mine, mine + 6, 1.5f);
    std::vector<float> unit(3, 0.0f);
    const named_event update{9};
    const auto& on = shard.stage(mine + 3, unit.data(), 3, &update);
    CHECK(&on == &k.main);
    CHECK(unit == std::vector<float>(3, 1.5f));
    CHECK(k.take() == std::vector<std::string>{"s0 waits e9", "cast 3 on s0"});
    (void)shard.stage(mine, unit.data(), 3, nullptr);
    unit = {2.0f, 3.0f, 4.0f};
    shard.put_unit(unit.data(), 0, 3);
    CHECK(mine[2] == 4.0f);
    CHECK(k.take() == std::vector<std::string>{"cast 3 on s0", "cast 3 on s0"});
  }
  CHECK(k.log.empty()); // no upload stream to wait for
  CHECK(k.state.live(memory_tag::params) == 0);
}

TEST_CASE("param_shard derived from the master: nothing allocated; a slice is cast from the master on the engine's "
          "stream after its update, and a write-back casts into the master") {
  logged_kit k;
  {
    shard_t<true> shard(k.backend, k.main, k.state, std::nullopt, 6 * sizeof(float), std::nullopt, true);
    CHECK(shard.derived());
    CHECK(shard.data() == nullptr);
    CHECK(k.state.total().peak == 0);
    std::vector<bf16> unit(3, bf16(0.0f));
    // Before the master is given, a gather is a named error, not a read of null.
    CHECK_THROWS_WITH_AS(shard.stage_unit(0, 0, unit.data(), 3, nullptr),
                         doctest::Contains("derived from the optimizer's master copy"), usage_error);
    std::vector<float> master{0.5f, 1.0f, 1.5f, 2.0f, 2.5f, 3.0f};
    shard.derive_from(master.data());
    const named_event update{9};
    const auto& on = shard.stage_unit(1, 3, unit.data(), 3, &update);
    CHECK(&on == &k.main);
    CHECK(to_float(unit[0]) == 2.0f);
    CHECK(to_float(unit[2]) == 3.0f);
    CHECK(k.take() == std::vector<std::string>{"s0 waits e9", "cast 3 on s0"});
    unit = {bf16(-1.0f), bf16(-2.0f), bf16(-4.0f)};
    shard.put_unit(unit.data(), 0, 3);
    CHECK(master == std::vector<float>{-1.0f, -2.0f, -4.0f, 2.0f, 2.5f, 3.0f});
    CHECK(k.take() == std::vector<std::string>{"cast 3 on s0"});
  }
  CHECK(k.log.empty());
  CHECK(k.state.total().peak == 0);
  // Host memory and a derived shard exclude each other.
  CHECK_THROWS_AS(shard_t<true>(k.backend, k.main, k.state, k.host, 8, std::nullopt, true), usage_error);
}

TEST_CASE("param_shard offloaded: host memory of its own; uploads wait for the engine's stream and the update on "
          "a stream of their own") {
  logged_kit k;
  {
    shard_t<true> shard(k.backend, k.main, k.state, k.host, 6 * sizeof(float));
    CHECK(shard.offloaded());
    REQUIRE(shard.host_memory() != nullptr);
    CHECK(shard.host_memory()->live(memory_tag::params) == 6 * sizeof(float));
    CHECK(k.host.live(memory_tag::params) == 6 * sizeof(float)); // copies share the counters
    CHECK(k.state.total().peak == 0);                            // nothing in model-state memory
    CHECK(k.take().empty());                                     // s1 (uploads) and e1 (calls) made, not used
    auto* mine = as<float>(shard.data());
    std::fill(mine, mine + 6, 1.5f);
    std::vector<float> unit(3, 0.0f);
    // The upload follows the engine's stream at the call (e1) and the slice's optimizer update (e9),
    // on s1; the engine's stream waits for nothing.
    const named_event update{9};
    const auto& on = shard.stage(mine + 3, unit.data(), 3, &update);
    CHECK(on.id == 1);
    CHECK(unit == std::vector<float>(3, 1.5f));
    CHECK(k.take() == std::vector<std::string>{"record e1 on s0", "s1 waits e1", "s1 waits e9", "copy 12 B on s1"});
    CHECK(shard.stage(mine, unit.data(), 3, nullptr).id == 1);
    CHECK(k.take() == std::vector<std::string>{"record e1 on s0", "s1 waits e1", "copy 12 B on s1"});
    // Back into the shard (gather_all's modifier): a copy on the engine's stream.
    unit = {2.0f, 3.0f, 4.0f};
    shard.put_unit(unit.data(), 0, 3);
    CHECK(mine[2] == 4.0f);
    CHECK(k.take() == std::vector<std::string>{"copy 12 B on s0"});
  }
  // Destroyed: the uploads out of the shard (and into the units) are waited for first.
  CHECK(k.take() == std::vector<std::string>{"sync s1"});
  CHECK(k.host.live(memory_tag::params) == 0);
}

TEST_CASE("param_shard: a shard offloaded where nothing can copy it is refused, naming the key") {
  std::vector<std::string> log;
  logging_backend<false> backend{&log};
  named_stream main{0};
  counting_allocator<device_only_allocator> state{};
  using refused_t = shard_t<false, device_only_allocator>;
  static_assert(!refused_t::can_offload);
  static_assert(shard_t<true, device_only_allocator>::can_offload);
  static_assert(shard_t<false>::can_offload); // the host can touch model-state memory
  CHECK_THROWS_WITH_AS(refused_t(backend, main, state, host_counting{}, 16),
                       doctest::Contains("zero_optimization.offload_param.device: \"cpu\" needs a backend with copy"),
                       config_error);
  CHECK(state.total().peak == 0);
  CHECK_NOTHROW(refused_t(backend, main, state, std::nullopt, 16));
}

} // namespace zero::testing::shard_spec
