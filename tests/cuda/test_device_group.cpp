/// \file
/// `device_group_communicator` (ranks as threads sharing one GPU) against `thread_communicator` on the same
/// inputs: all_reduce (sum, avg, max; in place and not), reduce_scatter, all_gather, broadcast, all_to_all and
/// an all_reduce over the halves of a split at 2, 3 and 4 ranks in fp32 and bf16, bit for bit; send and recv
/// around a ring; its ordering after a compute stream; and its refusals: calls that differ between ranks, a recv
/// that does not match its send, a rank that never arrives, avg of an integer type.

#include "cuda_test_support.hpp"
#include "zero/comm/device_group_communicator.hpp"
#include "zero/comm/run_ranks.hpp"
#include "zero/comm/thread_communicator.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using zero::bf16;
using zero::device_group_communicator;
using zero::reduce_op;
using zero::test::device_buffer;
using zero::test::random_values;

/// `zero::run_device_group` with a test's timeout.
template <class Fn>
void run_device_ranks(int n, Fn&& fn, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  zero::run_device_group(n, fn, 0, timeout);
}

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

/// Every collective at `n` ranks over `count` elements per rank (per block for the scatter and gather), on
/// the device and on CPU threads, from the same inputs: the results must have the same bits.
template <class T> void check_against_threads(int n, std::size_t count) {
  const auto un = static_cast<std::size_t>(n);
  std::vector<std::vector<T>> inputs;
  for (std::size_t r = 0; r < un; ++r) {
    inputs.push_back(random_values<T>(un * count, 100 + r));
  }
  // What each rank gets, per operation: [op][rank].
  constexpr int ops = 9;
  auto collect = [&](auto& comm, auto&& buffer_of, auto&& read) {
    const auto r = static_cast<std::size_t>(comm.rank());
    std::vector<std::vector<T>> out(ops);
    int k = 0;
    for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
      auto in = buffer_of(inputs[r]);
      auto res = buffer_of(std::vector<T>(un * count));
      comm.all_reduce(in.get(), res.get(), un * count, op).wait();
      out[static_cast<std::size_t>(k++)] = read(res);
    }
    { // in place
      auto in = buffer_of(inputs[r]);
      comm.all_reduce(in.get(), in.get(), un * count, reduce_op::sum).wait();
      out[static_cast<std::size_t>(k++)] = read(in);
    }
    { // reduce_scatter in place: recv is the rank's own block of send
      auto in = buffer_of(inputs[r]);
      comm.reduce_scatter(in.get(), in.get() + r * count, count, reduce_op::avg).wait();
      auto all = read(in);
      out[static_cast<std::size_t>(k++)] = std::vector<T>(all.begin() + static_cast<std::ptrdiff_t>(r * count),
                                                          all.begin() + static_cast<std::ptrdiff_t>((r + 1) * count));
    }
    { // all_gather in place: send is the rank's own block of recv
      auto buf = buffer_of(inputs[r]);
      comm.all_gather(buf.get() + r * count, buf.get(), count).wait();
      out[static_cast<std::size_t>(k++)] = read(buf);
    }
    { // broadcast from the last rank
      auto in = buffer_of(inputs[r]);
      auto res = buffer_of(std::vector<T>(un * count));
      comm.broadcast(in.get(), res.get(), un * count, n - 1).wait();
      out[static_cast<std::size_t>(k++)] = read(res);
    }
    { // all_to_all: block p of every send to rank p
      auto in = buffer_of(inputs[r]);
      auto res = buffer_of(std::vector<T>(un * count));
      comm.all_to_all(in.get(), res.get(), count).wait();
      out[static_cast<std::size_t>(k++)] = read(res);
    }
    { // split into the even and the odd ranks, the keys reversing the order; a sum over each half
      auto half = comm.split(static_cast<int>(r % 2), -static_cast<int>(r));
      auto in = buffer_of(inputs[r]);
      auto res = buffer_of(std::vector<T>(un * count));
      half.all_reduce(in.get(), res.get(), un * count, reduce_op::sum).wait();
      auto got = read(res);
      got.push_back(zero::from_float<T>(static_cast<float>(half.rank() * 100 + half.size()))); // its place
      out[static_cast<std::size_t>(k++)] = got;
    }
    return out;
  };

  std::vector<std::vector<std::vector<T>>> cpu(un), gpu(un);
  struct host_vec {
    std::vector<T> v;
    T* get() { return v.data(); }
  };
  zero::run_ranks(n, [&](zero::thread_communicator& comm) {
    cpu[static_cast<std::size_t>(comm.rank())] = collect(
        comm, [](const std::vector<T>& v) { return host_vec{v}; }, [](host_vec& h) { return h.v; });
  });
  struct device_vec {
    std::unique_ptr<device_buffer<T>> d;
    T* get() { return d->get(); }
  };
  run_device_ranks(n, [&](device_group_communicator& comm) {
    gpu[static_cast<std::size_t>(comm.rank())] = collect(
        comm,
        [](const std::vector<T>& v) {
          device_vec d{std::make_unique<device_buffer<T>>(v.size())};
          d.d->upload(v);
          return d;
        },
        [](device_vec& d) { return d.d->download(); });
  });
  for (std::size_t r = 0; r < un; ++r) {
    for (std::size_t k = 0; k < ops; ++k) {
      CAPTURE(r);
      CAPTURE(k);
      CHECK(same_bits(gpu[r][k], cpu[r][k]));
    }
  }
}

} // namespace

TEST_SUITE("device_group") {
  TEST_CASE("device_group_communicator: every collective has thread_communicator's bits, at 2, 3 and 4 ranks") {
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      check_against_threads<float>(n, 1001);
      check_against_threads<bf16>(n, 4099);
    }
  }

  TEST_CASE("device_group_communicator: an operation starts after the compute stream's work so far") {
    // Each rank writes its input with a kernel on a compute stream and starts the all_reduce without waiting
    // for it: the sum must still see every rank's writes.
    constexpr std::size_t n = 1 << 22;
    run_device_ranks(3, [&](device_group_communicator& comm) {
      zero::test::test_stream compute;
      comm.set_compute_stream(compute.get());
      device_buffer<float> x(n);
      zero::cuda::fill(x.get(), n, static_cast<float>(comm.rank() + 1), compute.get());
      comm.all_reduce(x.get(), x.get(), n, reduce_op::sum).wait();
      const auto got = x.download();
      std::size_t off = 0;
      for (float v : got) {
        off += v != 6.0f ? 1 : 0;
      }
      CHECK(off == 0);
    });
  }

  TEST_CASE("device_group_communicator: send and recv around a ring, every rank sending first, in order") {
    // Each rank sends two buffers to the next rank and only then receives two from the one before: a send
    // does not wait for its receiver on the host, so this does not deadlock, and sends to a peer arrive in order.
    constexpr int n = 3;
    constexpr std::size_t count = 100003;
    run_device_ranks(n, [&](device_group_communicator& comm) {
      const int r = comm.rank(), next = (r + 1) % n, prev = (r + n - 1) % n;
      device_buffer<float> a(count), b(count), got_a(count), got_b(count);
      a.upload(std::vector<float>(count, static_cast<float>(10 * r + 1)));
      b.upload(std::vector<float>(count, static_cast<float>(10 * r + 2)));
      auto sa = comm.send(a.get(), count, next);
      auto sb = comm.send(b.get(), count, next);
      comm.recv(got_a.get(), count, prev).wait();
      comm.recv(got_b.get(), count, prev).wait();
      sa.wait();
      sb.wait();
      CHECK(got_a.download() == std::vector<float>(count, static_cast<float>(10 * prev + 1)));
      CHECK(got_b.download() == std::vector<float>(count, static_cast<float>(10 * prev + 2)));
    });
  }

  TEST_CASE("device_group_communicator: a recv that does not match its send throws comm_error naming both") {
    std::string message;
    try {
      run_device_ranks(2, [&](device_group_communicator& comm) {
        device_buffer<float> x(16);
        if (comm.rank() == 0) {
          comm.send(x.get(), 16, 1).wait();
        } else {
          comm.recv(x.get(), 8, 0).wait();
        }
      });
    } catch (const zero::comm_error& e) {
      message = e.what();
    }
    CHECK(message.find("recv(count=8, fp32) from rank 0") != std::string::npos);
    CHECK(message.find("send(count=16, fp32) to rank 1") != std::string::npos);
  }

  TEST_CASE("device_group_communicator: calls that differ between ranks throw comm_error naming each") {
    std::string message;
    try {
      run_device_ranks(2, [&](device_group_communicator& comm) {
        device_buffer<float> x(16);
        comm.all_reduce(x.get(), x.get(), comm.rank() == 0 ? 16 : 8, reduce_op::sum).wait();
      });
    } catch (const zero::comm_error& e) {
      message = e.what();
    }
    CHECK(message.find("does not match") != std::string::npos);
    CHECK(message.find("count=16") != std::string::npos);
    CHECK(message.find("count=8") != std::string::npos);
  }

  TEST_CASE("device_group_communicator: a rank that never arrives is a timeout naming it") {
    std::string message;
    try {
      run_device_ranks(
          3,
          [&](device_group_communicator& comm) {
            if (comm.rank() == 2) {
              return; // never joins
            }
            comm.barrier().wait();
          },
          std::chrono::milliseconds(300));
    } catch (const zero::timeout_error& e) {
      message = e.what();
    } catch (const zero::comm_error& e) {
      message = e.what();
    }
    CHECK(message.find("ranks 2 did not arrive") != std::string::npos);
  }

  TEST_CASE("device_group_communicator: avg of an integer type is refused before anything starts") {
    run_device_ranks(1, [&](device_group_communicator& comm) {
      device_buffer<std::int32_t> x(4);
      CHECK_THROWS_WITH_AS(static_cast<void>(comm.all_reduce(x.get(), x.get(), 4, reduce_op::avg)),
                           doctest::Contains("avg needs a floating element type"), zero::usage_error);
    });
  }
}
