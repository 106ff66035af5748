/// \file
/// Spec of `zero::mpi_communicator`, run under `mpirun -np 2` and `-np 4`. Every collective is
/// checked element by element against a reference computed locally from the same inputs. Inputs
/// are small integers times powers of two (nccl-tests' "verifiable" idea), so every partial sum is
/// exact in fp32, fp16 and bf16 and the results must be bit-identical whatever MPI's order.

#define DOCTEST_CONFIG_IMPLEMENT
#include "zero/comm/mpi_communicator.hpp"
#include "zero/comm/topology.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <doctest/doctest.h>
#include <mpi.h>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using zero::bf16;
using zero::f16;
using zero::mpi_communicator;
using zero::reduce_op;

/// The world communicator every test starts from; a generous timeout turns a bug into a failure
/// instead of a hang.
mpi_communicator world() {
  mpi_communicator w(MPI_COMM_WORLD);
  w.set_timeout(20s);
  return w;
}

constexpr std::size_t counts[] = {1, 7, 1000, 1023};
constexpr reduce_op ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::max};

/// Input element `i` of `rank`: an integer in [-5, 5] ([0, 10] for unsigned) times 2^(i%3 - 1)
/// for floating types. `salt` varies the pattern between tests.
template <class T> T value(int rank, std::size_t i, int salt = 0) {
  const int k = static_cast<int>((static_cast<std::size_t>(rank) * 7 + i * 13 + static_cast<std::size_t>(salt)) % 11);
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(std::is_unsigned_v<T> ? k : k - 5);
  } else {
    return zero::from_float<T>(std::ldexp(static_cast<float>(k - 5), static_cast<int>(i % 3) - 1));
  }
}

/// What `op` over all ranks' `value(r, i, salt)` must give, computed exactly (double holds every
/// partial sum) and rounded once, as avg's division is.
template <class T> T reduced(reduce_op op, int size, std::size_t i, int salt) {
  double sum = 0;
  double max = 0;
  for (int r = 0; r < size; ++r) {
    const double v = static_cast<double>(zero::to_float(value<T>(r, i, salt)));
    sum += v;
    max = r == 0 || v > max ? v : max;
  }
  switch (op) {
  case reduce_op::sum:
    return zero::from_float<T>(static_cast<float>(sum));
  case reduce_op::max:
    return zero::from_float<T>(static_cast<float>(max));
  case reduce_op::avg:
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<T>(sum) / static_cast<T>(size));
    } else {
      return zero::from_float<T>(static_cast<float>(sum) / static_cast<float>(size));
    }
  }
  return T{};
}

template <class T> bool same_bits(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

template <class T> std::string show(const T& v) {
  if constexpr (zero::is_half_v<T>) {
    char bits[8];
    std::snprintf(bits, sizeof bits, "%04x", static_cast<unsigned>(v.bits));
    return std::to_string(zero::to_float(v)) + " (bits 0x" + bits + ")";
  } else {
    return std::to_string(v);
  }
}

/// Compares `got[0, n)` with `expected(i)` bit by bit; reports the count of mismatches and the
/// first one, so a failure names the element instead of flooding the log.
template <class T, class F> void check_all(const T* got, std::size_t n, F expected, const std::string& what) {
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < n; ++i) {
    const T want = expected(i);
    if (!same_bits(got[i], want)) {
      if (bad == 0) {
        first = "element " + std::to_string(i) + ": got " + show(got[i]) + ", expected " + show(want);
      }
      ++bad;
    }
  }
  INFO(what);
  INFO(first);
  CHECK(bad == 0);
}

std::string label(std::string_view op, reduce_op r, std::size_t count, bool in_place) {
  return std::string(op) + " " + std::string(zero::name_of(r)) + " count " + std::to_string(count) +
         (in_place ? " in place" : "");
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

#define ZERO_RANK_INFO() INFO("world rank " << world_rank())

} // namespace

TEST_CASE("mpi_communicator wraps a communicator without owning it") {
  ZERO_RANK_INFO();
  int rank = 0;
  int size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  mpi_communicator w(MPI_COMM_WORLD);
  CHECK(w.rank() == rank);
  CHECK(w.size() == size);
  CHECK(w.name() == "world");
  CHECK(w.native() == MPI_COMM_WORLD);
  CHECK(w.timeout() == zero::default_comm_timeout);
  CHECK_FALSE(w.broken());
  w.set_timeout(1234ms);
  CHECK(w.timeout() == 1234ms);
  CHECK_THROWS_AS(w.set_timeout(0ms), zero::usage_error);

  MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
  CHECK(handler == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);

  static_assert(!std::is_copy_constructible_v<mpi_communicator>);
  static_assert(!std::is_copy_assignable_v<mpi_communicator>);
  static_assert(std::is_nothrow_move_constructible_v<mpi_communicator>);
  static_assert(std::is_nothrow_destructible_v<mpi_communicator::handle>);
  static_assert(zero::full_communicator<mpi_communicator>);

  mpi_communicator moved = std::move(w);
  CHECK(moved.rank() == rank);
  CHECK_THROWS_AS(static_cast<void>(w.rank()), zero::usage_error); // NOLINT(bugprone-use-after-move)

  mpi_communicator named(MPI_COMM_WORLD, "data_parallel");
  CHECK(named.name() == "data_parallel");
  CHECK_THROWS_AS(mpi_communicator(MPI_COMM_NULL), zero::usage_error);
}

TEST_CASE("ZERO_CHECK_MPI turns an MPI error into mpi_error naming the call and the place") {
  ZERO_RANK_INFO();
  auto w = world();
  int x = 0;
  try {
    ZERO_CHECK_MPI(MPI_Send(&x, 1, MPI_INT, w.size() + 5, 0, w.native()));
    FAIL("no exception");
  } catch (const zero::mpi_error& e) {
    const std::string what = e.what();
    CHECK(what.rfind("[zero.mpi_error] ", 0) == 0);
    CHECK(what.find("MPI_Send") != std::string::npos);
    CHECK(what.find("test_mpi_communicator.cpp:") != std::string::npos);
    CHECK(what.find("world rank " + std::to_string(w.rank())) != std::string::npos);
    int cls = 0;
    MPI_Error_class(e.status(), &cls);
    CHECK(cls == MPI_ERR_RANK);
  }
}

TEST_CASE_TEMPLATE("all_reduce: sum, avg and max, out of place and in place", T, float, f16, bf16, double, std::int32_t,
                   std::int64_t, std::uint8_t) {
  ZERO_RANK_INFO();
  auto w = world();
  for (const reduce_op op : ops) {
    for (const std::size_t n : counts) {
      for (const bool in_place : {false, true}) {
        const int salt = static_cast<int>(n) + static_cast<int>(op);
        std::vector<T> send(n);
        for (std::size_t i = 0; i < n; ++i) {
          send[i] = value<T>(w.rank(), i, salt);
        }
        std::vector<T> recv(n, T{});
        T* out = in_place ? send.data() : recv.data();
        w.all_reduce(send.data(), out, n, op).wait();
        check_all(
            out, n, [&](std::size_t i) { return reduced<T>(op, w.size(), i, salt); },
            label("all_reduce", op, n, in_place));
        if (!in_place) {
          check_all(
              send.data(), n, [&](std::size_t i) { return value<T>(w.rank(), i, salt); }, "send untouched");
        }
      }
    }
  }
}

TEST_CASE_TEMPLATE("reduce_scatter: sum, avg and max, out of place and in place", T, float, f16, bf16, std::int32_t) {
  ZERO_RANK_INFO();
  auto w = world();
  const auto size = static_cast<std::size_t>(w.size());
  const auto me = static_cast<std::size_t>(w.rank());
  for (const reduce_op op : ops) {
    for (const std::size_t n : counts) {
      for (const bool in_place : {false, true}) {
        const int salt = 3 * static_cast<int>(n) + static_cast<int>(op);
        std::vector<T> send(size * n);
        for (std::size_t i = 0; i < size * n; ++i) {
          send[i] = value<T>(w.rank(), i, salt);
        }
        std::vector<T> recv(n, T{});
        T* out = in_place ? send.data() + me * n : recv.data();
        w.reduce_scatter(send.data(), out, n, op).wait();
        check_all(
            out, n, [&](std::size_t i) { return reduced<T>(op, w.size(), me * n + i, salt); },
            label("reduce_scatter", op, n, in_place));
        // In place, the other ranks' blocks of the buffer are left as they were.
        check_all(
            send.data(), me * n, [&](std::size_t i) { return value<T>(w.rank(), i, salt); },
            "blocks before mine untouched");
        check_all(
            send.data() + (me + 1) * n, (size - me - 1) * n,
            [&](std::size_t i) { return value<T>(w.rank(), (me + 1) * n + i, salt); }, "blocks after mine untouched");
      }
    }
  }
}

TEST_CASE_TEMPLATE("all_gather: out of place and in place", T, float, f16, bf16, std::int64_t) {
  ZERO_RANK_INFO();
  auto w = world();
  const auto size = static_cast<std::size_t>(w.size());
  const auto me = static_cast<std::size_t>(w.rank());
  for (const std::size_t n : counts) {
    for (const bool in_place : {false, true}) {
      const int salt = static_cast<int>(n);
      std::vector<T> recv(size * n, T{});
      std::vector<T> send(n);
      for (std::size_t i = 0; i < n; ++i) {
        send[i] = value<T>(w.rank(), i, salt);
      }
      const T* in = send.data();
      if (in_place) {
        std::copy(send.begin(), send.end(), recv.begin() + static_cast<std::ptrdiff_t>(me * n));
        in = recv.data() + me * n;
      }
      w.all_gather(in, recv.data(), n).wait();
      check_all(
          recv.data(), size * n, [&](std::size_t i) { return value<T>(static_cast<int>(i / n), i % n, salt); },
          label("all_gather", reduce_op::sum, n, in_place));
    }
  }
}

TEST_CASE_TEMPLATE("broadcast from every root, out of place and in place", T, float, f16, bf16, std::uint8_t) {
  ZERO_RANK_INFO();
  auto w = world();
  for (int root = 0; root < w.size(); ++root) {
    for (const std::size_t n : counts) {
      for (const bool in_place : {false, true}) {
        const int salt = static_cast<int>(n) + root;
        std::vector<T> send(n);
        for (std::size_t i = 0; i < n; ++i) {
          send[i] = value<T>(w.rank(), i, salt);
        }
        std::vector<T> recv(n, T{});
        T* out = in_place ? send.data() : recv.data();
        // Non-root ranks may pass a null send buffer: it is ignored there.
        const T* in = w.rank() == root || in_place ? send.data() : nullptr;
        w.broadcast(in, out, n, root).wait();
        check_all(
            out, n, [&](std::size_t i) { return value<T>(root, i, salt); },
            "broadcast root " + std::to_string(root) + " count " + std::to_string(n) + (in_place ? " in place" : ""));
      }
    }
  }
}

TEST_CASE_TEMPLATE("all_to_all exchanges blocks", T, float, f16, bf16, std::int32_t) {
  ZERO_RANK_INFO();
  auto w = world();
  const auto size = static_cast<std::size_t>(w.size());
  const auto me = static_cast<std::size_t>(w.rank());
  for (const std::size_t n : counts) {
    const int salt = static_cast<int>(n);
    std::vector<T> send(size * n);
    for (std::size_t i = 0; i < size * n; ++i) {
      send[i] = value<T>(w.rank(), i, salt);
    }
    std::vector<T> recv(size * n, T{});
    w.all_to_all(send.data(), recv.data(), n).wait();
    // Block p of my recv is block `me` of rank p's send.
    check_all(
        recv.data(), size * n, [&](std::size_t i) { return value<T>(static_cast<int>(i / n), me * n + i % n, salt); },
        "all_to_all count " + std::to_string(n));
  }
  std::vector<T> buffer(size);
  CHECK_THROWS_AS(static_cast<void>(w.all_to_all(buffer.data(), buffer.data(), 1)), zero::usage_error);
}

TEST_CASE_TEMPLATE("send and recv around a ring", T, float, f16, bf16, std::int32_t) {
  ZERO_RANK_INFO();
  auto w = world();
  const int next = (w.rank() + 1) % w.size();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  for (const std::size_t n : counts) {
    const int salt = static_cast<int>(n);
    std::vector<T> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = value<T>(w.rank(), i, salt);
    }
    std::vector<T> in(n, T{});
    auto r = w.recv(in.data(), n, prev);
    auto s = w.send(out.data(), n, next);
    s.wait();
    r.wait();
    check_all(
        in.data(), n, [&](std::size_t i) { return value<T>(prev, i, salt); }, "ring count " + std::to_string(n));
  }
}

TEST_CASE("send to self, and messages between two ranks keep their order") {
  ZERO_RANK_INFO();
  auto w = world();
  float mine = 3.5f;
  float back = 0;
  auto r = w.recv(&back, 1, w.rank());
  w.send(&mine, 1, w.rank()).wait();
  r.wait();
  CHECK(back == 3.5f);

  const int next = (w.rank() + 1) % w.size();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  std::int32_t a = 10 * w.rank() + 1;
  std::int32_t b = 10 * w.rank() + 2;
  std::int32_t got_a = 0;
  std::int32_t got_b = 0;
  auto ra = w.recv(&got_a, 1, prev);
  auto rb = w.recv(&got_b, 1, prev);
  auto sa = w.send(&a, 1, next);
  auto sb = w.send(&b, 1, next);
  rb.wait(); // waiting out of order is fine
  ra.wait();
  sb.wait();
  sa.wait();
  CHECK(got_a == 10 * prev + 1);
  CHECK(got_b == 10 * prev + 2);
}

TEST_CASE("recv of a different count than was sent is reported") {
  ZERO_RANK_INFO();
  auto w = world();
  const int next = (w.rank() + 1) % w.size();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  std::vector<float> out(4, 1.0f);
  std::vector<float> in(8, 0.0f);
  auto r = w.recv(in.data(), 8, prev);
  auto s = w.send(out.data(), 4, next);
  s.wait();
  try {
    r.wait();
    FAIL("no exception");
  } catch (const zero::usage_error& e) {
    const std::string what = e.what();
    CHECK(what.find("asked for 8") != std::string::npos);
    CHECK(what.find("got 4") != std::string::npos);
  }

  // More than asked for is MPI's truncation error, raised as mpi_error by wait().
  std::vector<float> big(8, 2.0f);
  std::vector<float> small(4, 0.0f);
  auto r2 = w.recv(small.data(), 4, prev);
  auto s2 = w.send(big.data(), 8, next);
  s2.wait();
  try {
    r2.wait();
    FAIL("no exception");
  } catch (const zero::mpi_error& e) {
    int cls = 0;
    MPI_Error_class(e.status(), &cls);
    CHECK(cls == MPI_ERR_TRUNCATE);
    CHECK(std::string(e.what()).find("MPI_Test") != std::string::npos);
  }
  w.barrier().wait();
}

TEST_CASE("barrier waits for the slowest rank") {
  ZERO_RANK_INFO();
  auto w = world();
  w.barrier().wait();
  const auto start = std::chrono::steady_clock::now();
  if (w.rank() == 0) {
    std::this_thread::sleep_for(200ms);
  }
  w.barrier().wait();
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 150ms);
}

TEST_CASE("several operations in flight at once, waited in any order") {
  ZERO_RANK_INFO();
  auto w = world();
  const std::size_t n = 1023;
  std::vector<float> a(n);
  std::vector<f16> b(n);
  std::vector<bf16> c(w.size() * n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = value<float>(w.rank(), i, 1);
    b[i] = value<f16>(w.rank(), i, 2);
  }
  for (std::size_t i = 0; i < c.size(); ++i) {
    c[i] = value<bf16>(w.rank(), i, 3);
  }
  std::vector<bf16> c_out(n);
  auto ha = w.all_reduce(a.data(), a.data(), n, reduce_op::sum);
  auto hb = w.all_reduce(b.data(), b.data(), n, reduce_op::max);
  auto hc = w.reduce_scatter(c.data(), c_out.data(), n, reduce_op::avg);
  auto hd = w.barrier();
  mpi_communicator::handle moved = std::move(hb);
  hb.wait(); // moved-from: complete, returns at once
  hd.wait();
  hc.wait();
  moved.wait();
  ha.wait();
  ha.wait(); // waiting twice is harmless
  check_all(
      a.data(), n, [&](std::size_t i) { return reduced<float>(reduce_op::sum, w.size(), i, 1); }, "a");
  check_all(
      b.data(), n, [&](std::size_t i) { return reduced<f16>(reduce_op::max, w.size(), i, 2); }, "b");
  const auto me = static_cast<std::size_t>(w.rank());
  check_all(
      c_out.data(), n, [&](std::size_t i) { return reduced<bf16>(reduce_op::avg, w.size(), me * n + i, 3); }, "c");
}

TEST_CASE("a handle dropped without wait completes the operation") {
  ZERO_RANK_INFO();
  auto w = world();
  const std::size_t n = 1000;
  std::vector<bf16> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = value<bf16>(w.rank(), i, 9);
  }
  { auto dropped = w.all_reduce(x.data(), x.data(), n, reduce_op::avg); }
  check_all(
      x.data(), n, [&](std::size_t i) { return reduced<bf16>(reduce_op::avg, w.size(), i, 9); }, "dropped");
}

TEST_CASE("split into even and odd ranks") {
  ZERO_RANK_INFO();
  auto w = world();
  const int color = w.rank() % 2;
  mpi_communicator sub = w.split(color, w.rank());
  CHECK(sub.size() == (w.size() + 1 - color) / 2);
  CHECK(sub.rank() == w.rank() / 2);
  CHECK(sub.name() == "world/" + std::to_string(color));
  CHECK(sub.timeout() == w.timeout());
  CHECK(sub.native() != w.native());

  // A collective on the sub-group only sees its members: sum of their world ranks.
  std::int32_t me = w.rank();
  std::int32_t total = 0;
  sub.all_reduce(&me, &total, 1, reduce_op::sum).wait();
  std::int32_t expected = 0;
  for (int r = color; r < w.size(); r += 2) {
    expected += r;
  }
  CHECK(total == expected);

  // Gather bf16 values of the members, in sub-group order.
  const std::size_t n = 7;
  std::vector<bf16> mine(n);
  for (std::size_t i = 0; i < n; ++i) {
    mine[i] = value<bf16>(w.rank(), i, 5);
  }
  std::vector<bf16> all(static_cast<std::size_t>(sub.size()) * n);
  sub.all_gather(mine.data(), all.data(), n).wait();
  check_all(
      all.data(), all.size(), [&](std::size_t i) { return value<bf16>(static_cast<int>(i / n) * 2 + color, i % n, 5); },
      "all_gather on sub-group");

  // Key orders the new ranks: reversed keys give reversed ranks. The moved communicator keeps working.
  mpi_communicator reversed = w.split(color, -w.rank());
  mpi_communicator moved = std::move(reversed);
  CHECK(moved.rank() == moved.size() - 1 - w.rank() / 2);
  moved.barrier().wait();

  // A sub-group can be split again.
  mpi_communicator single = sub.split(sub.rank(), 0);
  CHECK(single.size() == 1);
  CHECK(single.rank() == 0);
  float one = 2.0f;
  single.all_reduce(&one, &one, 1, reduce_op::avg).wait();
  CHECK(one == 2.0f);
}

TEST_CASE("a topology splits the world into the groups of its axes") {
  ZERO_RANK_INFO();
  auto w = world();
  // (pipe, data) over the world: pipe 2 where the world is even, else 1.
  const int pipe = w.size() % 2 == 0 ? 2 : 1;
  const zero::topology t({{"pipe", pipe}, {"data", w.size() / pipe}});
  for (const char* axis : {"pipe", "data"}) {
    CAPTURE(axis);
    mpi_communicator g = t.split(w, {axis});
    const auto members = t.group_of(w.rank(), {axis});
    CHECK(g.size() == static_cast<int>(members.size()));
    CHECK(members[static_cast<std::size_t>(g.rank())] == w.rank());
    std::int32_t me = w.rank();
    std::int32_t total = 0;
    g.all_reduce(&me, &total, 1, reduce_op::sum).wait();
    std::int32_t expected = 0;
    for (const int m : members) {
      expected += m;
    }
    CHECK(total == expected);
  }
}

TEST_CASE("split with a negative color fails alike on every rank") {
  ZERO_RANK_INFO();
  auto w = world();
  const int color = w.rank() == w.size() - 1 ? -1 : 0;
  try {
    static_cast<void>(w.split(color, 0));
    FAIL("no exception");
  } catch (const zero::usage_error& e) {
    const std::string what = e.what();
    CHECK(what.find("rank " + std::to_string(w.size() - 1) + " passed -1") != std::string::npos);
  }
  CHECK_FALSE(w.broken());
  w.barrier().wait();
}

TEST_CASE("invalid arguments throw usage_error before anything starts") {
  ZERO_RANK_INFO();
  auto w = world();
  std::vector<float> buf(static_cast<std::size_t>(w.size()) * 4);
  CHECK_THROWS_AS(static_cast<void>(w.send(buf.data(), 1, w.size())), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(w.recv(buf.data(), 1, -1)), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(w.broadcast(buf.data(), buf.data(), 1, w.size())), zero::usage_error);
  CHECK_THROWS_AS(static_cast<void>(w.all_reduce<float>(nullptr, buf.data(), 1, reduce_op::sum)), zero::usage_error);
  const std::size_t too_many = static_cast<std::size_t>(INT_MAX) + 1;
  CHECK_THROWS_WITH_AS(static_cast<void>(w.all_reduce(buf.data(), buf.data(), too_many, reduce_op::sum)),
                       doctest::Contains("int count limit"), zero::usage_error);
  // Partial overlaps that are neither the in-place form nor disjoint.
  if (w.size() > 1) {
    CHECK_THROWS_AS(static_cast<void>(w.reduce_scatter(buf.data(), buf.data() + 1, 2, reduce_op::sum)),
                    zero::usage_error);
    CHECK_THROWS_AS(static_cast<void>(w.all_gather(buf.data() + 1, buf.data(), 2)), zero::usage_error);
  }
  // Zero elements are fine everywhere, with null buffers too.
  w.all_reduce<float>(nullptr, nullptr, 0, reduce_op::sum).wait();
  w.all_gather<f16>(nullptr, nullptr, 0).wait();
  CHECK_FALSE(w.broken());
}

TEST_CASE("a collective that a rank joins too late times out, names itself and breaks the group") {
  ZERO_RANK_INFO();
  auto w = world();
  // Ranks 0 and 1 form the group under test; the others form a group that stays idle.
  mpi_communicator pair = w.split(w.rank() < 2 ? 0 : 1, w.rank());
  pair.set_timeout(300ms);
  std::vector<float> x(1023);
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = value<float>(w.rank(), i, 4);
  }

  if (w.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    auto h = pair.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum);
    try {
      h.wait();
      FAIL("no timeout");
    } catch (const zero::timeout_error& e) {
      const std::string what = e.what();
      CHECK(what.rfind("[zero.timeout_error] ", 0) == 0);
      CHECK(what.find("all_reduce") != std::string::npos);
      CHECK(what.find("\"world/0\"") != std::string::npos);
      CHECK(what.find("at rank 0") != std::string::npos);
      CHECK(what.find("300 ms") != std::string::npos);
      CHECK(what.find(std::to_string(x.size() * sizeof(float)) + " bytes") != std::string::npos);
    }
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(waited >= 300ms);
    CHECK(waited < 5s);
    CHECK(pair.broken());
    CHECK_THROWS_WITH_AS(static_cast<void>(pair.barrier()), doctest::Contains("broken"), zero::comm_error);
    CHECK_THROWS_AS(static_cast<void>(pair.split(0, 0)), zero::comm_error);
    CHECK(pair.drain_abandoned() == 1);

    // Now let rank 1 join, so the abandoned all_reduce completes and MPI can finalize cleanly.
    // x stays alive: MPI still reads it until the abandoned request completes.
    int go = 1;
    w.send(&go, 1, 1).wait();
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (pair.drain_abandoned() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(pair.drain_abandoned() == 0);
    CHECK(pair.broken()); // draining does not repair the group
  } else if (w.rank() == 1) {
    int go = 0;
    w.recv(&go, 1, 0).wait(); // with the world's timeout, so a lost rank 0 fails instead of hanging
    pair.set_timeout(20s);
    pair.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
    check_all(
        x.data(), x.size(), [&](std::size_t i) { return reduced<float>(reduce_op::sum, 2, i, 4); }, "late");
    CHECK_FALSE(pair.broken());
  }
  w.barrier().wait();
}

TEST_CASE("a timeout names the ranks that never reached the collective, as the in-process communicator does") {
  ZERO_RANK_INFO();
  auto w = world();
  // Every rank but 1 all-reduces; rank 1 waits for rank 0's word, as a stopped peer would. Before the
  // ranks that time out told each other where they were, the message named no rank (the engine's
  // errors at stages 0 and 2 under mpirun said only "a rank that never joined ... is the usual cause").
  mpi_communicator g = w.split(0, w.rank());
  g.set_timeout(300ms);
  std::vector<float> x(64, 1.0f);
  if (w.rank() != 1) {
    std::string what;
    try {
      g.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
      FAIL("no timeout");
    } catch (const zero::timeout_error& e) {
      what = e.what();
    }
    CHECK(what.rfind("[zero.timeout_error] all_reduce", 0) == 0);
    const std::string lead = "(stopped, lost, or not there yet): ";
    const auto at = what.find(lead);
    REQUIRE(at != std::string::npos);
    CHECK(what.find("ranks not heard from at operation #") != std::string::npos);
    // The list names rank 1 (on a loaded host a slow rank may be named too), never this rank.
    std::string list = what.substr(at + lead.size());
    list = list.substr(0, list.find(';'));
    std::vector<std::string> named;
    for (std::size_t b = 0; b <= list.size();) {
      const std::size_t e = std::min(list.find(", ", b), list.size());
      named.push_back(list.substr(b, e - b));
      b = e + 2;
    }
    CHECK(std::find(named.begin(), named.end(), "1") != named.end());
    CHECK(std::find(named.begin(), named.end(), std::to_string(w.rank())) == named.end());
    if (w.rank() == 0) {
      int go = 1;
      w.send(&go, 1, 1).wait();
    }
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (g.drain_abandoned() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(g.drain_abandoned() == 0);
  } else {
    int go = 0;
    w.recv(&go, 1, 0).wait();
    g.set_timeout(20s);
    g.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
  }
  w.barrier().wait();
}

TEST_CASE("ranks that pass different sizes to a collective get a named error, not a crash") {
  ZERO_RANK_INFO();
  auto w = world();
  mpi_communicator g = w.split(0, w.rank()); // a group of its own: the mismatch breaks it
  // Rank 0 gathers 1000 elements, the others 500: MPI alone would write past rank 0's buffer.
  const std::size_t count = w.rank() == 0 ? 1000 : 500;
  std::vector<float> send(count, 1.0f);
  std::vector<float> recv(count * static_cast<std::size_t>(w.size()));
  try {
    g.all_gather(send.data(), recv.data(), count).wait();
    FAIL("no error");
  } catch (const zero::comm_error& e) {
    const std::string what = e.what();
    CHECK(what.find("operation #0 does not match across ranks") != std::string::npos);
    CHECK(what.find("rank 0 called all_gather(count=1000, fp32)") != std::string::npos);
    CHECK(what.find(w.size() == 2 ? "rank 1 called all_gather(count=500, fp32)"
                                  : "ranks 1, 2, 3 called all_gather(count=500, fp32)") != std::string::npos);
    CHECK(what.find("\"world/0\"") != std::string::npos);
  }
  CHECK(g.broken());
  // Another operation at the same position is named too; the world group is untouched.
  mpi_communicator h = w.split(0, w.rank());
  std::vector<float> x(8);
  if (w.rank() == 1) {
    CHECK_THROWS_WITH_AS(h.broadcast(x.data(), x.data(), 8, 0).wait(),
                         doctest::Contains("rank 1 called broadcast(count=8, fp32, root=0)"), zero::comm_error);
  } else {
    CHECK_THROWS_WITH_AS(h.all_reduce(x.data(), x.data(), 8, reduce_op::sum).wait(),
                         doctest::Contains("called all_reduce(count=8, fp32, sum)"), zero::comm_error);
  }
  w.barrier().wait();
}

TEST_CASE("draining many handles of a stopped peer waits one timeout in all, not one per handle") {
  ZERO_RANK_INFO();
  auto w = world();
  mpi_communicator pair = w.split(w.rank() < 2 ? 0 : 1, w.rank());
  const auto timeout = 1500ms;
  constexpr std::size_t handles = 6;
  std::vector<std::int32_t> got(handles * 4, -1);
  if (w.rank() == 0) {
    pair.set_timeout(timeout);
    // Rank 1 is stopped (it makes no MPI call): six receives from it pend, as an engine's gathers do
    // when its destructor drains them.
    std::vector<mpi_communicator::handle> pending;
    for (std::size_t k = 0; k < handles; ++k) {
      pending.push_back(pair.recv(got.data() + 4 * k, 4, 1));
    }
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(pending.front().wait(), doctest::Contains("recv on group \"world/0\""), zero::timeout_error);
    pending.clear(); // the destructors wait without throwing
    const auto drained = std::chrono::steady_clock::now() - start;
    // One timeout in all; a timeout per handle would take six. The margin is for a loaded host,
    // where the waiting thread is scheduled late (1.96 s seen with 4 ranks on 2 busy cores).
    CHECK(drained >= timeout);
    CHECK(drained < timeout * 2);
    CHECK(pair.drain_abandoned() == handles);
    int go = 1;
    w.send(&go, 1, 1).wait(); // wake rank 1, so the abandoned receives complete before MPI_Finalize
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (pair.drain_abandoned() != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);
    }
    CHECK(pair.drain_abandoned() == 0);
  } else if (w.rank() == 1) {
    int go = 0;
    w.recv(&go, 1, 0).wait();
    const std::int32_t data[4] = {1, 2, 3, 4};
    for (std::size_t k = 0; k < handles; ++k) {
      pair.send(data, 4, 0).wait();
    }
  }
  w.barrier().wait();
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  doctest::Context context(argc, argv);
  // mpirun gives every rank a pty, so doctest would colour the logs ctest keeps; the ranks
  // other than 0 print their failures only.
  context.setOption("no-colors", true);
  if (rank != 0) {
    context.setOption("minimal", true);
  }
  int result = context.run();
  if (context.shouldExit()) {
    MPI_Finalize();
    return result;
  }

  // A failure on any rank fails every rank, so mpirun's exit status cannot miss it.
  int failed = result != 0 ? 1 : 0;
  int failed_ranks = 0;
  MPI_Allreduce(&failed, &failed_ranks, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (failed != 0) {
    std::fprintf(stderr, "test_mpi_communicator: rank %d failed\n", rank);
  }
  if (rank == 0 && failed_ranks != 0) {
    std::fprintf(stderr, "test_mpi_communicator: %d of the ranks failed\n", failed_ranks);
  }
  MPI_Finalize();
  return failed_ranks != 0 ? 1 : 0;
}
