// update_overlap: the optimizer step on an update stream of its own. With cpu_backend every kernel
// has finished when it returns, so the spec checks the call order and join's once-only answer there,
// and the stream and event protocol itself through a backend and a communicator that log each call.

#include "part_kit.hpp"
#include "zero/engine/step/update_overlap.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zero::testing::overlap_spec {
namespace {

/// The stream operations update_overlap uses, logged as "record e1 on s0", "s1 waits e1", "sync s1".
struct logging_backend {
  using stream_type = named_stream;
  using event_type = named_event;
  std::vector<std::string>* log;
  int streams = 0;
  int events = 0;
  named_stream make_stream() { return {++streams}; }
  named_event make_event() { return {++events}; }
  void record(named_event& e, const named_stream& s) const {
    log->push_back("record e" + std::to_string(e.id) + " on s" + std::to_string(s.id));
  }
  void wait(const named_stream& s, const named_event& e) const {
    log->push_back("s" + std::to_string(s.id) + " waits e" + std::to_string(e.id));
  }
  void synchronize(const named_stream& s) const { log->push_back("sync s" + std::to_string(s.id)); }
};
/// A communicator that orders its collectives after a compute stream (as nccl_communicator does).
struct logging_comm {
  std::vector<std::string>* log;
  void set_compute_stream(int s) const { log->push_back("comm after s" + std::to_string(s)); }
};
static_assert(stream_ordered<logging_comm, named_stream>);

/// A step or after callback that logs "<what> k on s<id>".
auto logs(std::vector<std::string>& log, std::string what) {
  return [&log, what](std::size_t k, const named_stream& s) {
    log.push_back(what + " " + std::to_string(k) + " on s" + std::to_string(s.id));
  };
}

/// The logging parts an update_overlap runs over, the engine's stream s0, and their log.
struct logged_parts {
  std::vector<std::string> log;
  logging_backend backend{&log};
  logging_comm comm{&log};
  named_stream main{0};
  /// The log so far, which starts again empty.
  std::vector<std::string> take() { return std::exchange(log, {}); }
};
using logged_overlap = update_overlap<logging_backend, logging_comm>;

} // namespace

TEST_CASE("update_overlap: run calls step then after per segment, in order, on the update stream") {
  run_ranks(1, [&](thread_communicator& comm) {
    rank_kit kit;
    update_overlap<cpu_backend, thread_communicator> u(kit.backend, comm, kit.stream);
    std::vector<std::string> calls;
    const cpu_stream* update = &u.stream();
    CHECK(update != &kit.stream);
    u.run(
        3,
        [&](std::size_t k, const cpu_stream& s) {
          CHECK(&s == update);
          calls.push_back("step " + std::to_string(k));
        },
        [&](std::size_t k, const cpu_stream& s) {
          CHECK(&s == update);
          calls.push_back("after " + std::to_string(k));
        });
    CHECK(calls == std::vector<std::string>{"step 0", "after 0", "step 1", "after 1", "step 2", "after 2"});
    // Nothing to join before close(); then once.
    CHECK_FALSE(u.join());
    u.close();
    CHECK(u.join());
    CHECK_FALSE(u.join());
    // Zero segments: nothing is called, and close/join work the same.
    u.run(
        0, [&](std::size_t, const cpu_stream&) { calls.push_back("step"); },
        [&](std::size_t, const cpu_stream&) { calls.push_back("after"); });
    CHECK(calls.size() == 6);
    u.close();
    u.close();
    CHECK(u.join());
    CHECK_FALSE(u.join());
  });
}

TEST_CASE("update_overlap: the update stream waits for the engine's stream, and join orders it back once") {
  logged_parts p;
  {
    logged_overlap u(p.backend, p.comm, p.main);
    CHECK(u.stream().id == 1); // e1: ready (main's work so far), e2: done (the update stream's)
    u.run(2, logs(p.log, "step"), logs(p.log, "after"));
    CHECK(p.take() == std::vector<std::string>{"record e1 on s0", "s1 waits e1", "comm after s1", "step 0 on s1",
                                               "after 0 on s1", "step 1 on s1", "after 1 on s1", "comm after s0"});
    u.close();
    CHECK(p.take() == std::vector<std::string>{"record e2 on s1"});
    CHECK(u.join());
    CHECK_FALSE(u.join());
    CHECK(p.take() == std::vector<std::string>{"s0 waits e2"});
  }
  CHECK(p.log.empty()); // joined: the destructor has nothing to wait for
}

TEST_CASE("update_overlap: a throwing step still gives the communicator back to the engine's stream") {
  logged_parts p;
  {
    logged_overlap u(p.backend, p.comm, p.main);
    auto failing = [](std::size_t k, const named_stream&) {
      if (k == 1) {
        throw std::runtime_error("step 1 failed");
      }
    };
    CHECK_THROWS_AS(u.run(2, failing, logs(p.log, "after")), std::runtime_error);
    CHECK(p.take() == std::vector<std::string>{"record e1 on s0", "s1 waits e1", "comm after s1", "after 0 on s1",
                                               "comm after s0"});
    CHECK_FALSE(u.join()); // never closed
    // Closed and not joined: the destructor waits for the update stream on the host.
    u.close();
  }
  CHECK(p.log == std::vector<std::string>{"record e2 on s1", "sync s1"});
}

} // namespace zero::testing::overlap_spec
