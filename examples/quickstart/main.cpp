// zero-quickstart: the README's "Plug zero into your trainer", compiled and run. The block from the first
// #include <zero/...> line to the end of train() is the README's, word for word (ctest example.quickstart.docs
// checks it); my_framework.hpp stands in for the framework's own model code. Two in-process ranks train one
// Linear layer at ZeRO stage 2 (ds_config.json), print the memory table and save a checkpoint in ./ckpt.

#include "my_framework.hpp"

#include <cstdio>
#include <vector>
#include <zero/checkpoint/checkpoint.hpp>

// The README shows the block below as written.
// clang-format off
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/engine/engine.hpp>

void train(zero::thread_communicator& comm, const std::vector<batch>& data) {
  auto cfg = zero::config::from_file("ds_config.json", {.world_size = comm.size()});  // DeepSpeed's format
  zero::cpu_backend backend;
  zero::engine<zero::cpu_backend, zero::thread_communicator> eng(cfg, comm, backend);

  int fc1 = eng.add_module("fc1");
  auto w1 = eng.add_param(fc1, "fc1.weight", {512, 784});                  // dtype from the config
  auto b1 = eng.add_param(fc1, "fc1.bias", {512}, {.weight_decay = 0.0});  // its own parameter group
  eng.finalize();
  eng.init_params(my_init);     // fills only what this rank owns, by global element index

  for (const auto& b : data) {
    my_forward(eng.param(w1), eng.param(b1), b);      // loss scaled by eng.loss_scale() for fp16
    my_backward_into(eng.grad(w1), eng.grad(b1));     // accumulate (+=), as autograd does
    eng.grad_ready(w1); eng.grad_ready(b1);           // a full bucket starts reducing now
    const auto r = eng.step();  // r.boundary, r.applied, r.grad_norm, r.loss_scale, r.lr
    if (comm.rank() == 0) std::printf("loss %.5f  grad norm %.4f\n", my_loss(), r.grad_norm);
  }
  if (comm.rank() == 0) std::puts(eng.memory().table().c_str());  // bytes per tag beside the ZeRO formula
  eng.save("ckpt", "step-1000");  // eng.load("ckpt") resumes, at any stage and rank count
}
// clang-format on

int main() {
  try {
    zero::run_ranks(2, [](zero::thread_communicator& comm) { train(comm, make_data(comm.rank(), 40)); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero-quickstart: %s\n", e.what());
    return 1;
  }
  return 0;
}
