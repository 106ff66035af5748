// zero-custom-rule: a framework's own update rule through zero (docs/optimizers.md, "A framework's own rule").
// Signum (signSGD with momentum) is defined in signum.hpp, outside zero: the config names it (custom_rule.json,
// "type": "Signum"), config_inputs::optimizers tells the reader its keys and state, and use_rule<signum>() gives
// the engine its type. Two in-process ranks train quickstart's Linear layer (../quickstart/my_framework.hpp) at ZeRO
// stage 3 with the optimizer state in host memory, 40 steps; then again, saving a checkpoint after 20 steps, and a
// fresh pair of engines resumes from it for the last 20. The resumed run must end with the uninterrupted run's
// parameters, bit for bit, and the loss must fall (ctest example.custom_rule).

#include "../quickstart/my_framework.hpp"
#include "signum.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/checkpoint/checkpoint.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/engine/engine.hpp>

namespace {

using engine_type = zero::engine<zero::cpu_backend, zero::thread_communicator>;

struct run {
  std::vector<float> params; // fc1.weight then fc1.bias, whole, after the last step
  std::vector<double> losses;
};

/// Trains steps [from, to) on 2 ranks: from a checkpoint in `load` when given, saving one in `save` at the end when
/// given.
run train(int from, int to, const char* load, const char* save) {
  run out;
  zero::run_ranks(2, [&](zero::thread_communicator& comm) {
    zero::config_inputs in{.world_size = comm.size()};
    in.optimizers = {zero::custom_optimizer::of<signum>()}; // the config may name it
    const auto cfg = zero::config::from_file("custom_rule.json", in);
    zero::cpu_backend backend({.threads = 1});
    engine_type eng(cfg, comm, backend);
    const int fc1 = eng.add_module("fc1");
    const auto w1 = eng.add_param(fc1, "fc1.weight", {512, 784});
    const auto b1 = eng.add_param(fc1, "fc1.bias", {512}, {.weight_decay = 0.0});
    eng.use_rule<signum>(); // the engine runs it: on this backend and, offloaded, on the host's
    eng.finalize();
    eng.init_params(my_init);
    if (load != nullptr) {
      eng.load(load);
    }
    const auto data = make_data(comm.rank(), to);
    for (int step = from; step < to; ++step) {
      {
        auto gathered = eng.gather(fc1); // stage 3: the module's parameters whole while it computes
        my_forward(eng.param(w1), eng.param(b1), data[static_cast<std::size_t>(step)]);
        my_backward_into(eng.grad(w1), eng.grad(b1));
        eng.grad_ready(w1);
        eng.grad_ready(b1);
      }
      static_cast<void>(eng.step());
      if (comm.rank() == 0) {
        out.losses.push_back(my_loss());
      }
    }
    if (save != nullptr) {
      eng.save(save, "step-" + std::to_string(to));
    }
    auto gathered = eng.gather(fc1);
    if (comm.rank() == 0) {
      for (const auto h : {w1, b1}) {
        const auto v = eng.param(h);
        out.params.insert(out.params.end(), v.as<float>(), v.as<float>() + v.numel);
      }
    }
  });
  return out;
}

} // namespace

int main() {
  try {
    std::filesystem::remove_all("ckpt");
    const run whole = train(0, 40, nullptr, nullptr);
    static_cast<void>(train(0, 20, nullptr, "ckpt"));
    const run resumed = train(20, 40, "ckpt", nullptr);
    const bool same = whole.params.size() == resumed.params.size() &&
                      std::memcmp(whole.params.data(), resumed.params.data(), whole.params.size() * sizeof(float)) == 0;
    std::printf("Signum at stage 3, optimizer in host memory, 2 ranks: loss %.5f at step 1, %.5f at step 40\n",
                whole.losses.front(), whole.losses.back());
    std::printf("resumed at step 20 from ckpt: %s\n",
                same ? "the same bits as the uninterrupted run" : "DIFFERENT from the uninterrupted run");
    return same && whole.losses.back() < 0.5 * whole.losses.front() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-custom-rule: %s\n", e.what());
    return 1;
  }
}
