// `counting_communicator`: every operation forwarded, and counted per group and per operation in one
// ledger per rank, splits included (8 in-process ranks as 2 "nodes" of 4).

#include "zero/comm/counting_communicator.hpp"
#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"

#include <cstdint>
#include <doctest/doctest.h>
#include <numeric>
#include <vector>

using counted = zero::counting_communicator<zero::thread_communicator>;

static_assert(zero::full_communicator<counted>, "the decorator has every operation of thread_communicator");

namespace {
/// A communicator with all_reduce only: the decorator has no more than it.
struct reduce_only {
  int rank() const { return 0; }
  int size() const { return 1; }
  std::string_view name() const { return "solo"; }
  std::chrono::milliseconds timeout() const { return zero::default_comm_timeout; }
  void set_timeout(std::chrono::milliseconds) {}
  struct done {
    void wait() {}
  };
  template <class T> done all_reduce(const T*, T*, std::size_t, zero::reduce_op) { return {}; }
};
} // namespace
static_assert(zero::can_all_reduce<zero::counting_communicator<reduce_only>>);
static_assert(!zero::can_all_gather<zero::counting_communicator<reduce_only>>);
static_assert(!zero::can_split<zero::counting_communicator<reduce_only>>);

TEST_CASE("counting_communicator forwards every operation and counts its buffers' bytes per group") {
  constexpr std::size_t n = 6;
  zero::run_ranks(8, [&](zero::thread_communicator& raw) {
    counted world(raw);
    const zero::topology topo({{"node", 2}, {"local", 4}});
    counted node = topo.split(world, {"local"}); // the 4 ranks of this rank's node
    counted cross = topo.split(world, {"node"}); // the same local rank on each node
    node.set_label("node");
    cross.set_label("cross");
    CHECK(&node.ledger() == &world.ledger());
    const int r = world.rank();

    // The results are the wrapped communicator's.
    std::vector<float> one(n, static_cast<float>(r + 1));
    std::vector<float> sum(n);
    world.all_reduce(one.data(), sum.data(), n, zero::reduce_op::sum).wait();
    CHECK(sum[0] == 36.0F); // 1 + ... + 8
    std::vector<std::int32_t> mine(n, r), gathered(4 * n);
    node.all_gather(mine.data(), gathered.data(), n).wait();
    CHECK(gathered[n * 3] == topo.rank_of({topo.coord(r, "node"), 3}));
    std::vector<float> parts(2 * n, 1.0F), reduced(n);
    cross.reduce_scatter(parts.data(), reduced.data(), n, zero::reduce_op::sum).wait();
    CHECK(reduced[0] == 2.0F);
    std::vector<double> root(n, 7.0), got(n);
    node.broadcast(root.data(), got.data(), n, 1).wait();
    CHECK(got[n - 1] == 7.0);
    std::vector<zero::bf16> out(4 * n, zero::bf16(static_cast<float>(r))), in(4 * n);
    node.all_to_all(out.data(), in.data(), n).wait();
    CHECK(static_cast<float>(in[n * 2]) == topo.rank_of({topo.coord(r, "node"), 2}));
    // A ring over the node group: send to the next rank, receive from the previous.
    const int local = node.rank();
    std::vector<float> next(n), prev(n, -1.0F);
    auto s = node.send(one.data(), n, (local + 1) % 4);
    auto v = node.recv(prev.data(), n, (local + 3) % 4);
    s.wait();
    v.wait();
    CHECK(prev[0] == static_cast<float>(topo.rank_of({topo.coord(r, "node"), (local + 3) % 4}) + 1));
    world.barrier().wait();

    // The ledger: per (group, operation), the bytes of this rank's buffers.
    const zero::comm_ledger& l = world.ledger();
    CHECK(l.of("world", "all_reduce") == zero::comm_traffic{.calls = 1, .sent = 4 * n, .received = 4 * n});
    CHECK(l.of("node", "all_gather") == zero::comm_traffic{.calls = 1, .sent = 4 * n, .received = 4 * 4 * n});
    CHECK(l.of("cross", "reduce_scatter") == zero::comm_traffic{.calls = 1, .sent = 2 * 4 * n, .received = 4 * n});
    CHECK(l.of("node", "broadcast") ==
          zero::comm_traffic{.calls = 1, .sent = local == 1 ? 8 * n : 0, .received = local == 1 ? 0 : 8 * n});
    CHECK(l.of("node", "all_to_all") == zero::comm_traffic{.calls = 1, .sent = 4 * 2 * n, .received = 4 * 2 * n});
    CHECK(l.of("node", "send") == zero::comm_traffic{.calls = 1, .sent = 4 * n, .received = 0});
    CHECK(l.of("node", "recv") == zero::comm_traffic{.calls = 1, .sent = 0, .received = 4 * n});
    CHECK(l.of("world", "barrier").calls == 1);
    CHECK(l.of("world", "split").calls == 2);
    CHECK(l.of("cross", "all_gather") == zero::comm_traffic{});
    CHECK(l.group("cross") == zero::comm_traffic{.calls = 1, .sent = 2 * 4 * n, .received = 4 * n});
    CHECK(l.op("all_gather").received == 4 * 4 * n);
    const std::size_t node_sent = (4 * n) + (local == 1 ? 8 * n : 0) + (8 * n) + (4 * n);
    CHECK(l.group("node").sent == node_sent);
    CHECK(l.total().calls == 10);
    CHECK(l.entries().size() == 9);
    world.ledger().reset();
    CHECK(l.total() == zero::comm_traffic{});
    // An unlabelled split is "<label>/<color>".
    counted pair = world.split(r / 2, r);
    CHECK(pair.name() == "world/" + std::to_string(r / 2));
    CHECK(pair.size() == 2);
  });
}

TEST_CASE("counting_communicator counts only the calls the wrapped communicator started") {
  zero::run_ranks(1, [](zero::thread_communicator& raw) {
    counted world(raw);
    std::vector<float> buf(4, 1.0F);
    // all_to_all has no in-place form: thread_communicator refuses overlapping buffers.
    CHECK_THROWS_AS(static_cast<void>(world.all_to_all(buf.data(), buf.data(), 4)), zero::usage_error);
    CHECK(world.ledger().of("world", "all_to_all") == zero::comm_traffic{});
    CHECK_THROWS_AS(static_cast<void>(world.split(-1, 0)), zero::usage_error);
    CHECK(world.ledger().of("world", "split").calls == 0);
  });
}
