// The 1F1B pipeline schedule: its lists, their bubble against (p - 1) / (m + p - 1) and their
// activation memory, run against each other by the simulator and on in-process ranks.

#include "zero/comm/pipeline_schedule.hpp"
#include "zero/comm/thread_communicator.hpp"

#include <algorithm>
#include <cmath>
#include <doctest/doctest.h>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

using zero::one_f_one_b;
using zero::pipe_op;
using zero::pipe_step;

namespace {

std::vector<std::vector<pipe_step>> all_stages(int p, int m) {
  std::vector<std::vector<pipe_step>> out;
  for (int s = 0; s < p; ++s) {
    out.push_back(one_f_one_b(p, s, m));
  }
  return out;
}

} // namespace

TEST_CASE("1F1B on two stages and three micro-batches, entry by entry") {
  const std::vector<pipe_step> first = {
      {pipe_op::forward, 0, -1},      {pipe_op::send_activation, 0, 1}, // warm-up: one forward
      {pipe_op::forward, 1, -1},      {pipe_op::send_activation, 1, 1}, // steady: forward 1, backward 0
      {pipe_op::recv_gradient, 0, 1}, {pipe_op::backward, 0, -1},       //
      {pipe_op::forward, 2, -1},      {pipe_op::send_activation, 2, 1}, // forward 2, backward 1
      {pipe_op::recv_gradient, 1, 1}, {pipe_op::backward, 1, -1},       //
      {pipe_op::recv_gradient, 2, 1}, {pipe_op::backward, 2, -1}};      // cool-down
  const std::vector<pipe_step> last = {
      {pipe_op::recv_activation, 0, 0}, {pipe_op::forward, 0, -1},        {pipe_op::backward, 0, -1},
      {pipe_op::send_gradient, 0, 0},   {pipe_op::recv_activation, 1, 0}, {pipe_op::forward, 1, -1},
      {pipe_op::backward, 1, -1},       {pipe_op::send_gradient, 1, 0},   {pipe_op::recv_activation, 2, 0},
      {pipe_op::forward, 2, -1},        {pipe_op::backward, 2, -1},       {pipe_op::send_gradient, 2, 0}};
  CHECK(one_f_one_b(2, 0, 3) == first);
  CHECK(one_f_one_b(2, 1, 3) == last);
}

TEST_CASE("1F1B's bubble is (p - 1) / (m + p - 1) and a stage holds at most min(p - s, m) micro-batches") {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      const auto schedules = all_stages(p, m);
      for (const auto& list : schedules) {
        // Every micro-batch forward once, then backward once.
        std::map<int, int> forwards;
        std::map<int, int> backwards;
        for (const pipe_step& e : list) {
          if (e.op == pipe_op::forward) {
            ++forwards[e.micro_batch];
          } else if (e.op == pipe_op::backward) {
            CHECK(forwards[e.micro_batch] == 1);
            ++backwards[e.micro_batch];
          }
        }
        CHECK(forwards.size() == static_cast<std::size_t>(m));
        CHECK(backwards.size() == static_cast<std::size_t>(m));
      }
      for (auto [f, b] : {std::pair{1.0, 2.0}, std::pair{1.0, 1.0}, std::pair{3.0, 5.0}}) {
        const auto t = zero::simulate_pipeline(schedules, f, b);
        CHECK(t.makespan == doctest::Approx((m + p - 1) * (f + b)));
        CHECK(t.bubble() == doctest::Approx(zero::one_f_one_b_bubble(p, m)));
        for (int s = 0; s < p; ++s) {
          CHECK(t.busy[static_cast<std::size_t>(s)] == doctest::Approx(m * (f + b)));
          CHECK(t.most_in_flight[static_cast<std::size_t>(s)] == std::min(p - s, m));
        }
      }
    }
  }
}

TEST_CASE("the simulator names a schedule that deadlocks or is malformed, and one_f_one_b its bad arguments") {
  // Stage 0 waits for micro-batch 0's gradient before its forward; stage 1 waits for its activation.
  std::vector<std::vector<pipe_step>> stuck = all_stages(2, 1);
  REQUIRE(stuck[0][2] == pipe_step{pipe_op::recv_gradient, 0, 1});
  std::rotate(stuck[0].begin(), stuck[0].begin() + 2, stuck[0].begin() + 3);
  CHECK_THROWS_WITH_AS((void)zero::simulate_pipeline(stuck, 1, 2),
                       doctest::Contains("stage 0, entry 0 waits forever for micro-batch 0 from stage 1"),
                       zero::usage_error);
  std::vector<std::vector<pipe_step>> never = all_stages(2, 2);
  never[1][0].micro_batch = 5; // a micro-batch stage 0 never sends
  CHECK_THROWS_WITH_AS((void)zero::simulate_pipeline(never, 1, 2),
                       doctest::Contains("waits forever for micro-batch 5 from stage 0"), zero::usage_error);
  std::vector<std::vector<pipe_step>> orphan = {{{pipe_op::backward, 0, -1}}};
  CHECK_THROWS_WITH_AS((void)zero::simulate_pipeline(orphan, 1, 2), doctest::Contains("no forward before it"),
                       zero::usage_error);
  std::vector<std::vector<pipe_step>> nowhere = {{{pipe_op::send_activation, 0, 3}}};
  CHECK_THROWS_WITH_AS((void)zero::simulate_pipeline(nowhere, 1, 2), doctest::Contains("names stage 3 of 1"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS((void)one_f_one_b(2, 2, 4), doctest::Contains("stage 2 of 2 with 4 micro-batches"),
                       zero::usage_error);
  CHECK_THROWS_AS((void)one_f_one_b(0, 0, 4), zero::usage_error);
  CHECK_THROWS_AS((void)one_f_one_b(2, 0, 0), zero::usage_error);
}

TEST_CASE("1F1B runs on in-process ranks: each stage's list, in order, with sends that do not wait") {
  // A chain of p stages, stage s multiplies by (s + 2): forward sends x * prod, backward sends the
  // gradient back (the same factors). The last stage's loss gradient is 1 per micro-batch.
  for (int p : {2, 4}) {
    for (int m : {1, 3, 8}) {
      CAPTURE(p);
      CAPTURE(m);
      std::mutex mu;
      std::vector<std::pair<int, double>> input_grads; // stage 0: (micro-batch, gradient of its input)
      std::vector<std::pair<int, double>> outputs;     // last stage: (micro-batch, output)
      zero::run_ranks(p, [&](zero::thread_communicator& comm) {
        const int s = comm.rank();
        const auto factor = static_cast<double>(s + 2);
        std::map<int, double> act;
        std::map<int, double> grad;
        std::vector<zero::thread_communicator::handle> sends;
        std::vector<double> outbox(static_cast<std::size_t>(2 * m));
        for (const pipe_step& e : one_f_one_b(p, s, m)) {
          const auto mb = static_cast<std::size_t>(e.micro_batch);
          switch (e.op) {
          case pipe_op::recv_activation:
            comm.recv(&act[e.micro_batch], 1, e.peer).wait();
            break;
          case pipe_op::forward:
            if (s == 0) {
              act[e.micro_batch] = 1.0 + e.micro_batch;
            }
            act[e.micro_batch] *= factor;
            if (s == p - 1) {
              const std::lock_guard lock(mu);
              outputs.emplace_back(e.micro_batch, act[e.micro_batch]);
            }
            break;
          case pipe_op::send_activation:
            outbox[2 * mb] = act[e.micro_batch];
            sends.push_back(comm.send(&outbox[2 * mb], 1, e.peer));
            break;
          case pipe_op::recv_gradient:
            comm.recv(&grad[e.micro_batch], 1, e.peer).wait();
            break;
          case pipe_op::backward:
            if (s == p - 1) {
              grad[e.micro_batch] = 1.0;
            }
            grad[e.micro_batch] *= factor;
            if (s == 0) {
              const std::lock_guard lock(mu);
              input_grads.emplace_back(e.micro_batch, grad[e.micro_batch]);
            }
            break;
          case pipe_op::send_gradient:
            outbox[2 * mb + 1] = grad[e.micro_batch];
            sends.push_back(comm.send(&outbox[2 * mb + 1], 1, e.peer));
            break;
          }
        }
        for (auto& h : sends) {
          h.wait();
        }
      });
      double prod = 1;
      for (int s = 0; s < p; ++s) {
        prod *= s + 2;
      }
      REQUIRE(outputs.size() == static_cast<std::size_t>(m));
      REQUIRE(input_grads.size() == static_cast<std::size_t>(m));
      for (int i = 0; i < m; ++i) {
        CHECK(outputs[static_cast<std::size_t>(i)] == std::pair<int, double>{i, (1.0 + i) * prod});
        CHECK(input_grads[static_cast<std::size_t>(i)] == std::pair<int, double>{i, prod});
      }
    }
  }
}
