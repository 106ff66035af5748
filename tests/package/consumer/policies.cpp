// A framework's own policies against the installed zero: a communicator that can only all-reduce
// (stage 0 trains; stage 2 is refused with the sentence naming all_gather), an arena allocator for
// model state, and a backend that replaces one kernel of cpu_backend (fp32 AdamW) and keeps the rest.
// Prints "policies ok" when every check holds; tests/package/run.cmake builds it with GCC and Clang.

#include "arena.hpp" // examples/arena_allocator: an allocator policy of a framework's own

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <zero/zero.hpp>

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

/// The framework's data-parallel group: in-process ranks that can all-reduce, nothing else.
class sum_only {
public:
  explicit sum_only(zero::thread_communicator& c) : c_(&c) {}
  [[nodiscard]] int rank() const { return c_->rank(); }
  [[nodiscard]] int size() const { return c_->size(); }
  [[nodiscard]] std::string_view name() const { return "sum_only"; }
  [[nodiscard]] std::chrono::milliseconds timeout() const { return c_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) { c_->set_timeout(t); }
  template <class T> [[nodiscard]] auto all_reduce(const T* send, T* recv, std::size_t n, zero::reduce_op op) {
    return c_->all_reduce(send, recv, n, op);
  }

private:
  zero::thread_communicator* c_;
};

/// Model state from one block, front to back: the arena of examples/arena_allocator.
using arena = example::arena;
static_assert(zero::allocator<arena>);

/// cpu_backend with the framework's own fp32 AdamW (counted); every other kernel and case is zero's.
std::atomic<int> own_adamw_calls{0};
struct my_backend : zero::basic_cpu_backend<arena> {
  using zero::basic_cpu_backend<arena>::basic_cpu_backend;
  using zero::basic_cpu_backend<arena>::adamw_step;
  void adamw_step(float* master, float* m, float* v, const float* grad, float* param, std::size_t n,
                  const zero::adamw_step_args& args, const stream_type& s) {
    ++own_adamw_calls;
    zero::basic_cpu_backend<arena>::adamw_step(master, m, v, grad, param, n, args, s);
  }
};
static_assert(zero::check_backend<my_backend>());

using engine = zero::basic_engine<my_backend, sum_only, arena>;

zero::config make_config(int stage) {
  zero::config_inputs in;
  in.world_size = 2;
  return zero::config::from_string(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
                                       "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + "}}",
                                   in);
}

} // namespace

int main() {
  float final_value[2] = {0, 0};
  zero::run_ranks(2, [&](zero::thread_communicator& tc) {
    sum_only comm(tc);
    arena memory(std::size_t{1} << 22);
    my_backend backend({.threads = 1}, memory);
    try {
      engine refused(make_config(2), comm, backend, memory);
      check(false, "stage 2 on an all-reduce-only communicator was accepted");
    } catch (const zero::config_error& e) {
      check(std::string(e.what()).find("zero: this needs a communicator with all_gather") != std::string::npos,
            std::string("stage 2 refused without the sentence: ") + e.what());
    }
    engine eng(make_config(0), comm, backend, memory);
    const int m = eng.add_module("layer");
    const auto w = eng.add_param(m, "layer.weight", {64, 3});
    eng.finalize();
    eng.init_params(
        [](const zero::param_info&, std::size_t, std::span<float> out) { std::fill(out.begin(), out.end(), 1.0f); });
    for (int step = 0; step < 3; ++step) {
      auto on = eng.gather(m);
      auto g = eng.grad(w);
      float* gp = g.as<float>();
      for (std::size_t i = 0; i < g.numel; ++i) {
        gp[i] += static_cast<float>(comm.rank() + 1); // the average over ranks is 1.5
      }
      eng.grad_ready(w);
      on.close();
      check(eng.step().applied, "a stage 0 step was not applied");
    }
    check(eng.memory().params > 0, "the counting allocator saw no parameters");
    final_value[comm.rank()] = eng.param(w).as<float>()[0];
  });
  check(own_adamw_calls.load() == 6, "the replaced fp32 adamw_step ran " + std::to_string(own_adamw_calls.load()) +
                                         " times, expected 3 steps on 2 ranks");
  check(final_value[0] == final_value[1], "the ranks' parameters differ after stage 0 steps");
  check(final_value[0] < 1.0f && std::isfinite(final_value[0]), "AdamW did not move the parameter down");
  if (failures == 0) {
    std::printf("policies ok\n");
  }
  return failures == 0 ? 0 : 1;
}
