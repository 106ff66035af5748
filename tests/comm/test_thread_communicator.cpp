#include "../support/verifiable.hpp"
#include "zero/comm/thread_communicator.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <doctest/doctest.h>
#include <string>
#include <thread>
#include <vector>

using zero::reduce_op;
using zero::run_ranks;
using zero::thread_communicator;
using zero::testing::verifiable;

namespace {
const std::size_t counts[] = {1, 7, 1000, 1023};

template <class T> bool same_bits(T a, T b) {
  if constexpr (zero::is_half_v<T>) {
    return a.bits == b.bits;
  } else {
    return a == b;
  }
}

template <class T> T reduce_reference(int n, std::size_t i, reduce_op op) {
  // Plain reference: every input is exact, so any order gives the same value.
  double acc = op == reduce_op::max ? -1e30 : 0.0;
  for (int r = 0; r < n; ++r) {
    const double v = zero::to_float(verifiable<T>(r, i));
    acc = op == reduce_op::max ? std::max(acc, v) : acc + v;
  }
  if (op == reduce_op::avg) {
    acc /= n;
  }
  return zero::from_float<T>(static_cast<float>(acc));
}

/// Runs `fn` at every world size 1..8 and counts mismatches reported by the ranks.
template <class Fn> void for_world_sizes(Fn fn) {
  for (int n = 1; n <= 8; ++n) {
    std::atomic<std::size_t> bad{0};
    run_ranks(n, [&](thread_communicator& c) { bad += fn(c); });
    CAPTURE(n);
    CHECK(bad.load() == 0);
  }
}
} // namespace

TEST_CASE_TEMPLATE("collectives equal a plain reference element by element", T, float, zero::f16, zero::bf16) {
  SUBCASE("all_reduce sum/avg/max, out of place and in place") {
    for (reduce_op op : {reduce_op::sum, reduce_op::max, reduce_op::avg}) {
      for_world_sizes([&](thread_communicator& c) {
        std::size_t bad = 0;
        const int n = c.size();
        // avg of exact inputs divided by a non-power-of-two is not exact: compare for n = 1, 2, 4, 8 only.
        if (op == reduce_op::avg && (n & (n - 1)) != 0) {
          return bad;
        }
        for (std::size_t count : counts) {
          std::vector<T> send(count), recv(count), inplace(count);
          for (std::size_t i = 0; i < count; ++i) {
            send[i] = inplace[i] = verifiable<T>(c.rank(), i);
          }
          c.all_reduce(send.data(), recv.data(), count, op).wait();
          c.all_reduce(inplace.data(), inplace.data(), count, op).wait();
          for (std::size_t i = 0; i < count; ++i) {
            const T want = reduce_reference<T>(n, i, op);
            bad += !same_bits(recv[i], want) + !same_bits(inplace[i], want);
          }
        }
        return bad;
      });
    }
  }
  SUBCASE("reduce_scatter, out of place and in place") {
    for_world_sizes([&](thread_communicator& c) {
      std::size_t bad = 0;
      const auto n = static_cast<std::size_t>(c.size());
      for (std::size_t count : counts) {
        std::vector<T> send(n * count), recv(count), inplace(n * count);
        for (std::size_t i = 0; i < n * count; ++i) {
          send[i] = inplace[i] = verifiable<T>(c.rank(), i);
        }
        c.reduce_scatter(send.data(), recv.data(), count, reduce_op::sum).wait();
        T* mine = inplace.data() + static_cast<std::size_t>(c.rank()) * count;
        c.reduce_scatter(inplace.data(), mine, count, reduce_op::sum).wait();
        for (std::size_t j = 0; j < count; ++j) {
          const T want = reduce_reference<T>(c.size(), static_cast<std::size_t>(c.rank()) * count + j, reduce_op::sum);
          bad += !same_bits(recv[j], want) + !same_bits(mine[j], want);
        }
      }
      return bad;
    });
  }
  SUBCASE("all_gather, broadcast and all_to_all") {
    for_world_sizes([&](thread_communicator& c) {
      std::size_t bad = 0;
      const auto n = static_cast<std::size_t>(c.size());
      const auto me = static_cast<std::size_t>(c.rank());
      for (std::size_t count : counts) {
        std::vector<T> send(count), gathered(n * count), inplace(n * count);
        for (std::size_t i = 0; i < count; ++i) {
          send[i] = inplace[me * count + i] = verifiable<T>(c.rank(), i);
        }
        c.all_gather(send.data(), gathered.data(), count).wait();
        c.all_gather(inplace.data() + me * count, inplace.data(), count).wait();
        for (std::size_t q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < count; ++i) {
            const T want = verifiable<T>(static_cast<int>(q), i);
            bad += !same_bits(gathered[q * count + i], want) + !same_bits(inplace[q * count + i], want);
          }
        }
        const int root = static_cast<int>(n - 1);
        std::vector<T> b(count);
        c.broadcast(send.data(), b.data(), count, root).wait();
        for (std::size_t i = 0; i < count; ++i) {
          bad += !same_bits(b[i], verifiable<T>(root, i));
        }
        std::vector<T> a2a_send(n * count), a2a_recv(n * count);
        for (std::size_t i = 0; i < n * count; ++i) {
          a2a_send[i] = verifiable<T>(c.rank(), i, 7);
        }
        c.all_to_all(a2a_send.data(), a2a_recv.data(), count).wait();
        for (std::size_t q = 0; q < n; ++q) {
          for (std::size_t j = 0; j < count; ++j) {
            bad += !same_bits(a2a_recv[q * count + j], verifiable<T>(static_cast<int>(q), me * count + j, 7));
          }
        }
      }
      return bad;
    });
  }
}

TEST_CASE("integer max all_reduce (the overflow flag) and send/recv around a ring") {
  for_world_sizes([](thread_communicator& c) {
    std::size_t bad = 0;
    std::int32_t flag = c.rank() == c.size() - 1 ? 1 : 0;
    c.all_reduce(&flag, &flag, 1, reduce_op::max).wait();
    bad += flag != 1;
    const int next = (c.rank() + 1) % c.size();
    const int prev = (c.rank() + c.size() - 1) % c.size();
    std::vector<float> out(33, static_cast<float>(c.rank())), in(33, -1.0f);
    auto s = c.send(out.data(), out.size(), next);
    auto r = c.recv(in.data(), in.size(), prev);
    r.wait();
    s.wait();
    for (float v : in) {
      bad += v != static_cast<float>(prev);
    }
    c.barrier().wait();
    return bad;
  });
}

TEST_CASE("asynchronous operations overlap and complete in any wait order") {
  run_ranks(4, [](thread_communicator& c) {
    std::vector<float> a(5000, 1.0f), b(5000, 2.0f);
    auto ha = c.all_reduce(a.data(), a.data(), a.size(), reduce_op::sum);
    auto hb = c.all_reduce(b.data(), b.data(), b.size(), reduce_op::sum);
    // Rank 0 waits in the opposite order: no rank may depend on another's wait to progress.
    if (c.rank() == 0) {
      hb.wait();
      ha.wait();
    } else {
      ha.wait();
      hb.wait();
    }
    CHECK(a[4999] == 4.0f);
    CHECK(b[0] == 8.0f);
  });
}

TEST_CASE("large collectives are split into chunks that every waiting rank helps with") {
  // 3 * 100003 elements is several chunks of work for reduce_scatter and all_gather.
  run_ranks(3, [](thread_communicator& c) {
    const std::size_t count = 100003;
    std::vector<float> x(3 * count), y(3 * count);
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = verifiable<float>(c.rank(), i);
    }
    std::vector<float> mine(count);
    c.reduce_scatter(x.data(), mine.data(), count, reduce_op::sum).wait();
    c.all_gather(mine.data(), y.data(), count).wait();
    c.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      bad += x[i] != y[i] || x[i] != reduce_reference<float>(3, i, reduce_op::sum);
    }
    CHECK(bad == 0);
  });
}

TEST_CASE("results are bit-identical from run to run with inexact inputs") {
  std::vector<std::vector<float>> results;
  for (int run = 0; run < 3; ++run) {
    std::vector<float> out(10007);
    run_ranks(5, [&](thread_communicator& c) {
      std::vector<float> x(out.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = 1.0f / static_cast<float>(i + 3 + static_cast<std::size_t>(c.rank()) * 7);
      }
      c.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
      if (c.rank() == 2) {
        out = x;
      }
    });
    results.push_back(out);
  }
  CHECK(results[0] == results[1]);
  CHECK(results[1] == results[2]);
}

TEST_CASE("split makes sub-groups ordered by key") {
  run_ranks(6, [](thread_communicator& c) {
    // Colors by parity; keys reverse the order inside each group.
    auto sub = c.split(c.rank() % 2, -c.rank());
    CHECK(sub.size() == 3);
    CHECK(sub.rank() == 2 - c.rank() / 2);
    CHECK(sub.name() == "world/" + std::to_string(c.rank() % 2));
    std::int32_t v = c.rank();
    sub.all_reduce(&v, &v, 1, reduce_op::sum).wait();
    CHECK(v == (c.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3 + 5));
    // Sub-groups of sub-groups.
    auto solo = sub.split(sub.rank(), 0);
    CHECK(solo.size() == 1);
  });
}

TEST_CASE("a rank that never joins makes the others time out, naming op, group, rank and bytes") {
  using namespace std::chrono_literals;
  std::atomic<int> timeouts{0};
  const auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(run_ranks(3,
                            [&](thread_communicator& c) {
                              if (c.rank() == 2) {
                                return; // never joins
                              }
                              std::vector<float> x(256, 1.0f);
                              try {
                                c.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
                              } catch (const zero::timeout_error& e) {
                                const std::string what = e.what();
                                CHECK(what.find("[zero.timeout_error]") == 0);
                                CHECK(what.find("all_reduce(count=256, fp32, sum)") != std::string::npos);
                                CHECK(what.find("group \"world\"") != std::string::npos);
                                CHECK(what.find("at rank " + std::to_string(c.rank())) != std::string::npos);
                                CHECK(what.find("1024 bytes") != std::string::npos);
                                CHECK(what.find("never joined: 2") != std::string::npos);
                                ++timeouts;
                                throw;
                              }
                            },
                            {.timeout = 300ms}),
                  zero::timeout_error);
  CHECK(timeouts == 2);
  CHECK(std::chrono::steady_clock::now() - start < 5s);
}

TEST_CASE("mismatched operations and bad arguments give errors, not hangs") {
  using namespace std::chrono_literals;
  SUBCASE("different collectives at the same position") {
    CHECK_THROWS_WITH_AS(run_ranks(2,
                                   [](thread_communicator& c) {
                                     std::vector<float> x(8);
                                     if (c.rank() == 0) {
                                       c.all_reduce(x.data(), x.data(), 8, reduce_op::sum).wait();
                                     } else {
                                       std::this_thread::sleep_for(50ms);
                                       c.all_gather(x.data(), x.data(), 4).wait();
                                     }
                                   },
                                   {.timeout = 10s}),
                         doctest::Contains("does not match across ranks"), zero::comm_error);
  }
  SUBCASE("a rank that throws releases the others at once") {
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(run_ranks(4,
                                   [](thread_communicator& c) {
                                     if (c.rank() == 1) {
                                       throw std::runtime_error("forward failed on rank 1");
                                     }
                                     c.barrier().wait();
                                   },
                                   {.timeout = 60s}),
                         "forward failed on rank 1", std::runtime_error);
    CHECK(std::chrono::steady_clock::now() - start < 10s);
  }
  SUBCASE("peers and split colors are checked") {
    run_ranks(2, [](thread_communicator& c) {
      float x = 0;
      CHECK_THROWS_WITH_AS((void)c.send(&x, 1, 5), doctest::Contains("send peer 5 is outside group"),
                           zero::usage_error);
      CHECK_THROWS_AS((void)c.split(-1, 0), zero::usage_error);
      std::vector<float> buf(4);
      CHECK_THROWS_WITH_AS((void)c.all_to_all(buf.data(), buf.data(), 2), doctest::Contains("no in-place form"),
                           zero::usage_error);
    });
  }
  SUBCASE("send and recv of different sizes") {
    run_ranks(2, [](thread_communicator& c) {
      std::vector<float> x(4);
      if (c.rank() == 0) {
        CHECK_THROWS_WITH_AS(c.send(x.data(), 4, 1).wait(), doctest::Contains("matched a recv of 8 bytes"),
                             zero::usage_error);
      } else {
        CHECK_THROWS_AS(c.recv(x.data(), 2, 0).wait(), zero::usage_error);
      }
    });
  }
}

TEST_CASE("run_ranks rethrows the cause, not another rank's echo, and names its rank") {
  using namespace std::chrono_literals;
  SUBCASE("echoes that arrive first") {
    // Ranks 0, 1 and 3 report that rank 2 failed before rank 2's own exception arrives (as a
    // checkpoint phase does after its all-reduce of failures).
    CHECK_THROWS_WITH_AS(run_ranks(4,
                                   [](thread_communicator& c) {
                                     if (c.rank() != 2) {
                                       throw zero::as_echo(zero::checkpoint_error(
                                           "save failed on rank 2 (its exception names the cause)"));
                                     }
                                     std::this_thread::sleep_for(100ms);
                                     throw zero::io_error("ck/rank-00002.bin: Read-only file system", 30);
                                   }),
                         "[zero.io_error] rank 2: ck/rank-00002.bin: Read-only file system", zero::io_error);
  }
  SUBCASE("ranks released by the broken group") {
    // Rank 2 fails after the others are waiting in a barrier; they get comm_error echoes.
    try {
      run_ranks(4, [](thread_communicator& c) {
        if (c.rank() == 2) {
          std::this_thread::sleep_for(50ms);
          throw zero::io_error("disk full", 28);
        }
        c.barrier().wait();
      });
      FAIL("run_ranks returned without an exception");
    } catch (const zero::io_error& e) {
      CHECK(std::string(e.what()) == "[zero.io_error] rank 2: disk full");
      CHECK(e.status() == 28);
    }
  }
  SUBCASE("only echoes: the first one, with its rank") {
    CHECK_THROWS_WITH_AS(run_ranks(2,
                                   [](thread_communicator& c) {
                                     if (c.rank() == 1) {
                                       std::this_thread::sleep_for(50ms);
                                     }
                                     throw zero::as_echo(
                                         zero::comm_error("echo from rank " + std::to_string(c.rank())));
                                   }),
                         "[zero.comm_error] rank 0: echo from rank 0", zero::comm_error);
  }
}

TEST_CASE("run_ranks returns a rank's timeout in time while another rank is stuck outside the group") {
  using namespace std::chrono_literals;
  // Rank 2 never reaches the all-reduce and never returns until released: before run_ranks stopped
  // joining a stuck thread, the others' timeout_error never reached the caller (the watchdog below
  // releases it after 20 s, so such a run fails on the time instead of hanging).
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread watchdog([release] {
    for (int i = 0; i < 2000 && !*release; ++i) {
      std::this_thread::sleep_for(10ms);
    }
    *release = true;
  });
  const auto timeout = 1000ms;
  const auto start = std::chrono::steady_clock::now();
  std::string what;
  try {
    run_ranks(3,
              [release, finished](thread_communicator& c) {
                if (c.rank() == 2) {
                  while (!*release) {
                    std::this_thread::sleep_for(1ms);
                  }
                  *finished = true;
                  return;
                }
                std::vector<float> x(16, 1.0f);
                c.all_reduce(x.data(), x.data(), x.size(), reduce_op::sum).wait();
              },
              {.timeout = timeout});
  } catch (const zero::timeout_error& e) {
    what = e.what();
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  const bool released_before = *release;
  *release = true;
  watchdog.join();
  CHECK_FALSE(released_before);
  CHECK(elapsed < 1.5 * timeout); // timeout + a twentieth, with room for a loaded host
  CHECK(what.find("[zero.timeout_error] rank ") == 0);
  CHECK(what.find("never joined: 2") != std::string::npos);
  CHECK(what.find("rank 2 had not returned 50 ms after rank ") != std::string::npos);
  CHECK(what.find("its thread is left running") != std::string::npos);
  // The detached thread ends once released; run_ranks' state and the lambda live until it does.
  for (int i = 0; i < 500 && !*finished; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  CHECK(*finished);
}

TEST_CASE("draining many handles of a stopped peer waits one timeout in all") {
  // Rank 1 never joins; rank 0 drops eight posted all-gathers, as an engine's destructor does.
  // The first wait times out and breaks the group, so the others fail at once.
  using namespace std::chrono_literals;
  const auto timeout = 500ms;
  std::chrono::steady_clock::duration drained{};
  run_ranks(2,
            [&](thread_communicator& c) {
              if (c.rank() == 1) {
                std::this_thread::sleep_for(2 * timeout);
                return;
              }
              std::vector<float> buf(2 * 64 * 8);
              std::vector<thread_communicator::handle> pending;
              for (std::size_t k = 0; k < 8; ++k) {
                float* whole = buf.data() + k * 128;
                pending.push_back(c.all_gather(whole, whole, 64));
                std::this_thread::sleep_for(20ms); // later handles are posted later: their own timeouts end later
              }
              const auto start = std::chrono::steady_clock::now();
              CHECK_THROWS_WITH_AS(pending.front().wait(), doctest::Contains("all_gather(count=64, fp32)"),
                                   zero::timeout_error);
              pending.clear();
              drained = std::chrono::steady_clock::now() - start;
            },
            {.timeout = timeout});
  // One timeout in all (less the posting); a timeout per handle would take eight. The margin is for
  // a loaded host, where the waiting thread is scheduled late.
  CHECK(drained < timeout * 2);
}
