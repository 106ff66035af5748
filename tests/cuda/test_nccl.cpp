/// \file
/// nccl_communicator on 1 and 2 GPUs: every operation verified element by element (inputs reduce exactly),
/// ordering after the compute stream, timeouts and failures.
#include "gpu_group.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/comm/nccl_communicator.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <doctest/doctest.h>
#include <random>
#include <string>
#include <thread>
#include <vector>

using zero::test::gpu_worlds;
using zero::test::to_device;
using zero::test::to_host;

namespace {
/// Element i of rank r's input: small integers, exact in bf16 and in every sum here.
float value(int r, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(r) * 3) % 13) - 6);
}

/// A listening TCP socket on `port` (all interfaces) that is not zero's rendezvous: with `answer`, a
/// thread accepts every connection and writes bytes that are no rendezvous answer; without, nobody
/// accepts (connections wait in the backlog, unanswered).
class foreign_listener {
public:
  foreign_listener(int port, bool answer) : fd_(zero::detail::listen_on(port, 8)), bound_(fd_.get() >= 0) {
    if (bound_ && answer) {
      thread_ = std::thread([this] {
        while (!stop_) {
          pollfd pfd{fd_.get(), POLLIN, 0};
          if (::poll(&pfd, 1, 50) <= 0) {
            continue;
          }
          zero::detail::socket_fd peer(::accept(fd_.get(), nullptr, nullptr));
          const char junk[64] = "HTTP/1.1 400 Bad Request\r\n\r\n";
          (void)::send(peer.get(), junk, sizeof(junk), MSG_NOSIGNAL);
        }
      });
    }
  }
  foreign_listener(const foreign_listener&) = delete;
  foreign_listener& operator=(const foreign_listener&) = delete;
  ~foreign_listener() {
    stop_ = true;
    if (thread_.joinable()) {
      thread_.join();
    }
  }
  [[nodiscard]] bool bound() const noexcept { return bound_; }

private:
  zero::detail::socket_fd fd_;
  bool bound_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

/// Runs the rendezvous of from_env for ranks 0..size-1 on threads over `ports`; returns each rank's id
/// (rank 0's is a fixed pattern) or rethrows the first failure.
std::vector<ncclUniqueId> rendezvous(int size, const std::vector<int>& ports, int base,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  std::vector<ncclUniqueId> ids(static_cast<std::size_t>(size));
  std::memset(ids.data(), 0, ids.size() * sizeof(ncclUniqueId));
  for (std::size_t b = 0; b < sizeof(ncclUniqueId); ++b) {
    ids[0].internal[b] = static_cast<char>(b * 37 + 11);
  }
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r) {
    ranks.emplace_back([&, r] {
      try {
        zero::detail::exchange_unique_id(ids[static_cast<std::size_t>(r)], r, size, "127.0.0.1", ports, base, timeout);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : ranks) {
    t.join();
  }
  for (const auto& e : errors) {
    if (e) {
      std::rethrow_exception(e);
    }
  }
  return ids;
}

/// True when 2 GPUs are visible; otherwise says that the test case is not run here.
bool two_gpus() {
  int n = 0;
  ZERO_CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n < 2) {
    MESSAGE("needs 2 GPUs; not run on this machine");
  }
  return n >= 2;
}

int random_base_port() {
  std::random_device rd;
  return 20000 + static_cast<int>(rd() % 20000);
}
} // namespace

TEST_SUITE("nccl") {
  TEST_CASE_TEMPLATE("all_reduce, reduce_scatter, all_gather and broadcast give exact results", T, float, zero::bf16) {
    for (int world : gpu_worlds()) {
      CAPTURE(world);
      zero::run_gpus(world, [&](zero::nccl_communicator& comm) {
        const int r = comm.rank();
        const std::size_t n = 1000 * static_cast<std::size_t>(world) + 24; // a multiple of world for reduce_scatter
        const std::size_t per = n / static_cast<std::size_t>(world);
        std::vector<T> in(n);
        for (std::size_t i = 0; i < n; ++i) {
          in[i] = zero::from_float<T>(value(r, i));
        }
        auto expect_sum = [&](std::size_t i) {
          float s = 0;
          for (int q = 0; q < world; ++q) {
            s += value(q, i);
          }
          return s;
        };
        // all_reduce sum, in place.
        T* d = to_device(in);
        comm.all_reduce(d, d, n, zero::reduce_op::sum).wait();
        auto got = to_host(d, n);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(zero::to_float(got[i]) == expect_sum(i));
        }
        // all_reduce max into another buffer.
        T* out = to_device(in);
        T* src = to_device(in);
        comm.all_reduce(src, out, n, zero::reduce_op::max).wait();
        got = to_host(out, n);
        for (std::size_t i = 0; i < n; ++i) {
          float m = value(0, i);
          for (int q = 1; q < world; ++q) {
            m = std::max(m, value(q, i));
          }
          REQUIRE(zero::to_float(got[i]) == m);
        }
        // reduce_scatter sum, in place: rank r's slice.
        cudaMemcpy(src, in.data(), n * sizeof(T), cudaMemcpyHostToDevice);
        comm.reduce_scatter(src, src + static_cast<std::size_t>(r) * per, per, zero::reduce_op::sum).wait();
        got = to_host(src + static_cast<std::size_t>(r) * per, per);
        for (std::size_t i = 0; i < per; ++i) {
          REQUIRE(zero::to_float(got[i]) == expect_sum(static_cast<std::size_t>(r) * per + i));
        }
        // all_gather in place: every slice comes from its rank.
        cudaMemcpy(src, in.data(), n * sizeof(T), cudaMemcpyHostToDevice);
        comm.all_gather(src + static_cast<std::size_t>(r) * per, src, per).wait();
        got = to_host(src, n);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(zero::to_float(got[i]) == value(static_cast<int>(i / per), i));
        }
        // broadcast from the last rank.
        cudaMemcpy(src, in.data(), n * sizeof(T), cudaMemcpyHostToDevice);
        comm.broadcast(src, src, n, world - 1).wait();
        got = to_host(src, n);
        for (std::size_t i = 0; i < n; ++i) {
          REQUIRE(zero::to_float(got[i]) == value(world - 1, i));
        }
        cudaFree(d);
        cudaFree(out);
        cudaFree(src);
      });
    }
  }

  TEST_CASE("avg, int32 max, barrier, send/recv, all_to_all and split") {
    for (int world : gpu_worlds()) {
      CAPTURE(world);
      zero::run_gpus(world, [&](zero::nccl_communicator& comm) {
        const int r = comm.rank();
        std::vector<float> a(64, static_cast<float>(2 * (r + 1)));
        float* da = to_device(a);
        comm.all_reduce(da, da, a.size(), zero::reduce_op::avg).wait();
        CHECK(to_host(da, 1)[0] == static_cast<float>(world + 1)); // mean of 2, 4, ... = world + 1
        std::vector<std::int32_t> flag{r == world - 1 ? 5 : 0};
        auto* df = to_device(flag);
        comm.all_reduce(df, df, 1, zero::reduce_op::max).wait();
        CHECK(to_host(df, 1)[0] == 5);
        comm.barrier().wait();
        // all_to_all: block p of rank r's output is block r of rank p's input.
        const std::size_t per = 5;
        std::vector<float> send(per * static_cast<std::size_t>(world));
        for (std::size_t i = 0; i < send.size(); ++i) {
          send[i] = static_cast<float>(r * 1000 + static_cast<int>(i));
        }
        float* ds = to_device(send);
        float* dr = to_device(send);
        comm.all_to_all(ds, dr, per).wait();
        const auto got = to_host(dr, send.size());
        for (int p = 0; p < world; ++p) {
          for (std::size_t j = 0; j < per; ++j) {
            CHECK(got[static_cast<std::size_t>(p) * per + j] ==
                  static_cast<float>(p * 1000 + static_cast<int>(static_cast<std::size_t>(r) * per + j)));
          }
        }
        if (world == 2) {
          // Ring send/recv: rank 0 sends, rank 1 receives.
          if (r == 0) {
            comm.send(ds, per, 1).wait();
          } else {
            comm.recv(dr, per, 0).wait();
            const auto recv = to_host(dr, per);
            for (std::size_t j = 0; j < per; ++j) {
              CHECK(recv[j] == static_cast<float>(j));
            }
          }
        }
        // split into one group per rank: each child has size 1 and rank 0.
        auto child = comm.split(r, 0);
        CHECK(child.size() == 1);
        CHECK(child.rank() == 0);
        child.all_reduce(da, da, 1, zero::reduce_op::sum).wait();
        CHECK_THROWS_AS((void)comm.split(-1, 0), zero::usage_error);
        CHECK_THROWS_AS((void)comm.broadcast(da, da, 1, world), zero::usage_error);
        cudaFree(da);
        cudaFree(df);
        cudaFree(ds);
        cudaFree(dr);
      });
    }
  }

  TEST_CASE("an operation waits for the work enqueued on the compute stream before it") {
    for (int world : gpu_worlds()) {
      zero::run_gpus(world, [&](zero::nccl_communicator& comm) {
        cudaStream_t compute = nullptr;
        ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
        comm.set_compute_stream(compute);
        const std::size_t n = std::size_t{1} << 24; // 64 MiB: the fill is still running when the call returns
        float* d = nullptr;
        ZERO_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&d), n * sizeof(float)));
        for (int round = 0; round < 3; ++round) {
          zero::cuda::fill(d, n, static_cast<float>(round + 1), compute);
          comm.all_reduce(d, d, n, zero::reduce_op::sum).wait(); // no host sync of `compute` in between
          const auto first = to_host(d, 1);
          const auto last = to_host(d + n - 1, 1);
          CHECK(first[0] == static_cast<float>((round + 1) * world));
          CHECK(last[0] == static_cast<float>((round + 1) * world));
        }
        cudaFree(d);
        cudaStreamDestroy(compute);
      });
    }
  }

  TEST_CASE("a rank that never joins: the waiting rank times out naming the operation, then refuses more") {
    if (!two_gpus()) {
      return;
    }
    std::string what;
    bool refused = false;
    zero::nccl_options opt;
    opt.timeout = std::chrono::milliseconds(3000);
    CHECK_THROWS_AS(zero::run_gpus(
                        2,
                        [&](zero::nccl_communicator& comm) {
                          std::vector<float> h(16, 1.0f);
                          float* d = to_device(h);
                          if (comm.rank() == 0) {
                            try {
                              comm.all_reduce(d, d, h.size(), zero::reduce_op::sum).wait();
                            } catch (const zero::timeout_error& e) {
                              what = e.what();
                              try {
                                (void)comm.all_reduce(d, d, h.size(), zero::reduce_op::sum);
                              } catch (const zero::comm_error&) {
                                refused = comm.aborted();
                              }
                              throw;
                            }
                          }
                          // rank 1 skips the collective.
                          cudaFree(d);
                        },
                        opt),
                    zero::timeout_error);
    CHECK(what.find("all_reduce") != std::string::npos);
    CHECK(what.find("rank 0") != std::string::npos);
    CHECK(what.find("64 bytes") != std::string::npos);
    CHECK(refused);
  }

  TEST_CASE("check_matching: ranks that start different collectives get a named error, and nothing starts") {
    if (!two_gpus()) {
      return;
    }
    zero::nccl_options opt;
    opt.timeout = std::chrono::milliseconds(20000);
    opt.check_matching = true;
    std::vector<std::string> what(2);
    std::vector<float> after(2, 0.0f);
    zero::run_gpus(
        2,
        [&](zero::nccl_communicator& comm) {
          const auto r = static_cast<std::size_t>(comm.rank());
          std::vector<float> h(2000, 1.0f);
          float* d = to_device(h);
          // Rank 0 gathers 1000 elements per rank, rank 1 only 500: without the check NCCL hangs or
          // writes past what rank 1 expects.
          try {
            (void)comm.all_gather(d, d, r == 0 ? 1000 : 500);
          } catch (const zero::comm_error& e) {
            what[r] = e.what();
          }
          // The group is still usable: the matched all-reduce that follows is exact.
          comm.all_reduce(d, d, 1, zero::reduce_op::sum).wait();
          ZERO_CHECK_CUDA(cudaMemcpy(&after[r], d, sizeof(float), cudaMemcpyDeviceToHost));
          cudaFree(d);
        },
        opt);
    for (const auto& w : what) {
      CHECK(w.find("operation #0 does not match across ranks: rank 0 called all_gather(count=1000, fp32); "
                   "rank 1 called all_gather(count=500, fp32)") != std::string::npos);
    }
    CHECK(after[0] == 2.0f);
    CHECK(after[1] == 2.0f);
  }

  TEST_CASE("the rendezvous of from_env skips taken ports and listeners that are not zero's") {
    // MASTER_PORT + 1 answers with junk and + 2 accepts nothing: rank 0 listens on + 3, and the others
    // find it there after greeting the two foreign listeners.
    const int base = random_base_port();
    const foreign_listener junk(base + 1, true);
    const foreign_listener silent(base + 2, false);
    REQUIRE(junk.bound());
    REQUIRE(silent.bound());
    std::vector<int> ports;
    for (int k = 1; k <= zero::detail::rendezvous_port_span; ++k) {
      ports.push_back(base + k);
    }
    const auto ids = rendezvous(3, ports, base);
    for (const auto& id : ids) {
      CHECK(std::memcmp(&id, &ids[0], sizeof(id)) == 0);
    }
    CHECK(ids[0].internal[5] == static_cast<char>(5 * 37 + 11));

    // ZERO_RENDEZVOUS_PORT alone, and taken: rank 0's error names the port and the way out.
    try {
      (void)rendezvous(2, {base + 1}, base + 1, std::chrono::seconds(2)); // rank 1 gives up after 2 s
      FAIL("a rendezvous on a taken port did not throw");
    } catch (const zero::comm_error& e) {
      const std::string what = e.what();
      CHECK(what.find(std::to_string(base + 1)) != std::string::npos);
      CHECK(what.find("ZERO_RENDEZVOUS_PORT") != std::string::npos);
    } catch (const zero::timeout_error&) {
      FAIL("rank 0 should refuse at once, not time out");
    }
  }

  TEST_CASE("from_env names a missing variable") {
    ::unsetenv("WORLD_SIZE");
    try {
      (void)zero::nccl_communicator::from_env();
      FAIL("from_env without WORLD_SIZE did not throw");
    } catch (const zero::config_error& e) {
      CHECK(std::string(e.what()).find("WORLD_SIZE") != std::string::npos);
    }
    ::setenv("WORLD_SIZE", "two", 1);
    ::setenv("RANK", "0", 1);
    ::setenv("LOCAL_RANK", "0", 1);
    try {
      (void)zero::nccl_communicator::from_env();
      FAIL("from_env with WORLD_SIZE=two did not throw");
    } catch (const zero::config_error& e) {
      CHECK(std::string(e.what()).find("WORLD_SIZE=\"two\"") != std::string::npos);
    }
    ::unsetenv("WORLD_SIZE");
    ::unsetenv("RANK");
    ::unsetenv("LOCAL_RANK");
  }
} // TEST_SUITE("nccl")
