// `topology`: ranks on named axes, the group of each set of axes, and the communicators `split` makes
// from a job's (8 in-process ranks, every factorization).

#include "zero/comm/thread_communicator.hpp"
#include "zero/comm/topology.hpp"

#include <doctest/doctest.h>
#include <mutex>
#include <string>
#include <vector>

using zero::topology;

TEST_CASE("topology numbers ranks row-major, the last axis fastest, as DeepSpeed's ProcessTopology") {
  const topology t({{"pipe", 2}, {"data", 2}, {"tensor", 2}});
  CHECK(t.size() == 8);
  CHECK(t.names() == "pipe 2 x data 2 x tensor 2");
  CHECK(t.coords(5) == std::vector<int>{1, 0, 1});
  CHECK(t.coord(6, "data") == 1);
  CHECK(t.rank_of({1, 0, 1}) == 5);
  // DeepSpeed's PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2): get_rank(pipe=0, data=1,
  // model=0) is 2.
  CHECK(t.rank_of({0, 1, 0}) == 2);
  for (int r = 0; r < t.size(); ++r) {
    const auto c = t.coords(r);
    CHECK(t.rank_of(c) == r);
  }
  CHECK(t.group_of(5, {"tensor"}) == std::vector<int>{4, 5});
  CHECK(t.group_of(5, {"data"}) == std::vector<int>{5, 7});
  CHECK(t.group_of(5, {"pipe"}) == std::vector<int>{1, 5});
  CHECK(t.group_of(5, {"data", "tensor"}) == std::vector<int>{4, 5, 6, 7});
  CHECK(t.group_of(5, {"tensor", "data"}) == std::vector<int>{4, 5, 6, 7}); // the axes' order, not the list's
  CHECK(t.group_size({"pipe", "data"}) == 4);
  CHECK(t.group_of(3, {}) == std::vector<int>{3});
}

TEST_CASE("topology names what is wrong: an axis, a coordinate, a rank, a size") {
  CHECK_THROWS_WITH_AS(topology({}), doctest::Contains("no axes"), zero::usage_error);
  CHECK_THROWS_WITH_AS(topology({{"data", 0}}), doctest::Contains("axis \"data\" has size 0"), zero::usage_error);
  CHECK_THROWS_WITH_AS(topology({{"data", 2}, {"data", 2}}), doctest::Contains("\"data\" is named twice"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS(topology({{"", 2}}), doctest::Contains("axis 0 has no name"), zero::usage_error);
  CHECK_THROWS_WITH_AS(topology({{"a", 1 << 16}, {"b", 1 << 16}}), doctest::Contains("multiply to more than"),
                       zero::usage_error);
  const topology t({{"pipe", 2}, {"data", 4}});
  CHECK_THROWS_WITH_AS((void)t.axis_size("tensor"),
                       doctest::Contains("no axis \"tensor\"; the axes are pipe 2 x data 4"), zero::usage_error);
  CHECK_THROWS_WITH_AS((void)t.rank_of({1, 4}), doctest::Contains("coordinate 4 on axis \"data\", which has 4"),
                       zero::usage_error);
  CHECK_THROWS_WITH_AS((void)t.rank_of({1}), doctest::Contains("1 coordinates for 2 axes"), zero::usage_error);
  CHECK_THROWS_WITH_AS((void)t.coords(8), doctest::Contains("rank 8 is outside the 8 ranks"), zero::usage_error);
  CHECK_THROWS_WITH_AS((void)t.group_of(0, {"data", "data"}), doctest::Contains("\"data\" is named twice"),
                       zero::usage_error);
  zero::run_ranks(4, [&](zero::thread_communicator& comm) {
    CHECK_THROWS_WITH_AS((void)t.split(comm, {"data"}),
                         doctest::Contains("laid out for 8 ranks (pipe 2 x data 4), but communicator"),
                         zero::usage_error);
  });
}

TEST_CASE("split gives each rank its group's communicator, at every factorization of 8 ranks") {
  // Every ordered factorization of 8 into three axes.
  std::vector<std::vector<int>> shapes;
  for (int a : {1, 2, 4, 8}) {
    for (int b : {1, 2, 4, 8}) {
      if (8 % (a * b) == 0) {
        shapes.push_back({a, b, 8 / (a * b)});
      }
    }
  }
  CHECK(shapes.size() == 10);
  for (const auto& shape : shapes) {
    const topology t({{"pipe", shape[0]}, {"data", shape[1]}, {"tensor", shape[2]}});
    CAPTURE(t.names());
    const std::vector<std::vector<std::string>> groupings = {{"pipe"}, {"data"}, {"tensor"}, {"data", "tensor"}};
    std::mutex mu;
    std::vector<std::string> failures;
    zero::run_ranks(8, [&](zero::thread_communicator& comm) {
      for (const auto& axes : groupings) {
        auto group = t.split(comm, axes);
        const auto members = t.group_of(comm.rank(), axes);
        // The sum of the members' world ranks over the group's communicator, and this rank's place.
        int sum = comm.rank();
        group.all_reduce(&sum, &sum, 1, zero::reduce_op::sum).wait();
        int want = 0;
        for (int m : members) {
          want += m;
        }
        const bool ok = group.size() == static_cast<int>(members.size()) &&
                        members[static_cast<std::size_t>(group.rank())] == comm.rank() && sum == want &&
                        group.size() == t.group_size(axes);
        if (!ok) {
          const std::lock_guard lock(mu);
          failures.push_back("rank " + std::to_string(comm.rank()) + " over " + axes[0]);
        }
      }
    });
    CHECK(failures.empty());
  }
}
