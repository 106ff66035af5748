#pragma once
/// \file
/// The training of the 1F1B test (tests/engine/test_pipeline_engine.cpp on the CPU,
/// tests/cuda/test_groups_one_gpu.cpp on ranks sharing one GPU), over any `rank_rig`: 2 stages x 2 data ranks run
/// the 1F1B schedule (`one_f_one_b`), sending activations and their gradients between stages with send/recv in
/// buffers from the rig's io (device memory on GPUs), and accumulate the micro-batches' gradients in each stage's
/// engine (gradient_accumulation_steps = micro-batches, one step() per micro-batch's backward). The reference is
/// one engine per data rank holding both stages and running the micro-batches one after another. The framework's
/// side (each stage's linear layer, forward and backward) computes on the host in the same order on every rig.

#include "engine_harness.hpp"
#include "zero/comm/pipeline_schedule.hpp"
#include "zero/comm/topology.hpp"
#include "zero/zero.hpp"

#include <cstddef>
#include <cstdint>
#include <doctest/doctest.h>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace zero_test {

inline constexpr std::size_t pp_width = 8; // each stage: a pp_width x pp_width linear layer
inline constexpr int pp_micro = 4;
inline constexpr int pp_steps = 3;

inline zero::config pp_config(int stage) {
  zero::config_inputs in;
  in.world_size = 2;
  return zero::config::from_string(R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": )" +
                                       std::to_string(pp_micro) + R"(, "gradient_clipping": 0.05,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
      "zero_optimization": {"stage": )" +
                                       std::to_string(stage) + R"(, "stage3_param_persistence_threshold": 0}})",
                                   in);
}

/// The input of micro-batch `mb` of data rank `d` at step `step`.
inline std::vector<float> pp_input(int step, int d, int mb) {
  std::vector<float> x(pp_width);
  for (std::size_t i = 0; i < pp_width; ++i) {
    x[i] =
        static_cast<float>(static_cast<int>((i * 5 + static_cast<std::size_t>(step * 3 + d * 7 + mb)) % 9) - 4) / 8.0F;
  }
  return x;
}

/// y = W x.
inline std::vector<float> pp_forward(const float* w, const std::vector<float>& x) {
  std::vector<float> y(pp_width, 0.0F);
  for (std::size_t r = 0; r < pp_width; ++r) {
    for (std::size_t c = 0; c < pp_width; ++c) {
      y[r] += w[r * pp_width + c] * x[c];
    }
  }
  return y;
}

/// Adds dy x^T to the weight's gradient and returns dx = W^T dy.
inline std::vector<float> pp_backward(const float* w, float* gw, const std::vector<float>& x,
                                      const std::vector<float>& dy) {
  std::vector<float> dx(pp_width, 0.0F);
  for (std::size_t r = 0; r < pp_width; ++r) {
    for (std::size_t c = 0; c < pp_width; ++c) {
      gw[r * pp_width + c] += dy[r] * x[c];
      dx[c] += w[r * pp_width + c] * dy[r];
    }
  }
  return dx;
}

/// The loss 0.5 |y|^2 / micro-batches, summed over the accumulation: its gradient.
inline std::vector<float> pp_loss_grad(const std::vector<float>& y) {
  std::vector<float> dy(y);
  for (float& v : dy) {
    v /= static_cast<float>(pp_micro);
  }
  return dy;
}

/// Registers stage `s`'s weight ("w0" or "w1") in its own module.
template <class Engine> zero::param_handle pp_register(Engine& eng, int s, int& module) {
  module = eng.add_module("stage" + std::to_string(s));
  return eng.add_param(module, "w" + std::to_string(s),
                       {static_cast<std::int64_t>(pp_width), static_cast<std::int64_t>(pp_width)});
}
template <class Engine> void pp_init(Engine& eng) {
  eng.init_params([](const zero::param_info& p, std::size_t first, std::span<float> v) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      v[i] = static_cast<float>(static_cast<int>((first + i) * 3 + p.name.size() + (p.name == "w1" ? 5 : 0)) % 11 - 5) /
             16.0F;
    }
  });
}

/// Stage `w`'s forward on the host: its parameter read through `io`.
template <class Engine, class Io>
std::vector<float> pp_stage_forward(Engine& eng, zero::param_handle w, const std::vector<float>& x, const Io& io) {
  const auto held = io.template read<float>(eng, eng.param(w));
  return pp_forward(held.data(), x);
}

/// Stage `w`'s backward on the host: adds dy x^T to its gradient through `io` and returns dx.
template <class Engine, class Io>
std::vector<float> pp_stage_backward(Engine& eng, zero::param_handle w, const std::vector<float>& x,
                                     const std::vector<float>& dy, const Io& io) {
  const auto held = io.template read<float>(eng, eng.param(w));
  const auto view = eng.grad(w);
  auto g = io.template read<float>(eng, view);
  auto dx = pp_backward(held.data(), g.data(), x, dy);
  io.write(eng, view, g);
  return dx;
}

using pp_weights = std::map<std::string, std::vector<float>>;

/// One engine per data rank holding both stages: the micro-batches one after another.
template <class Rig> pp_weights pp_reference(const Rig& rig, int stage) {
  pp_weights out;
  rig.run_group(2, [&](auto& comm) {
    auto backend = rig.make_backend(comm);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(comm)>> eng(pp_config(stage), comm, backend);
    int m0 = 0, m1 = 0;
    auto w0 = pp_register(eng, 0, m0);
    auto w1 = pp_register(eng, 1, m1);
    eng.finalize();
    pp_init(eng);
    for (int step = 0; step < pp_steps; ++step) {
      for (int mb = 0; mb < pp_micro; ++mb) {
        const auto x = pp_input(step, comm.rank(), mb);
        std::vector<float> h, y;
        {
          auto on = eng.gather(m0);
          h = pp_stage_forward(eng, w0, x, rig.io);
        }
        {
          auto on = eng.gather(m1);
          y = pp_stage_forward(eng, w1, h, rig.io);
        }
        std::vector<float> dh;
        {
          auto on = eng.gather(m1);
          dh = pp_stage_backward(eng, w1, h, pp_loss_grad(y), rig.io);
          eng.grad_ready(w1);
        }
        {
          auto on = eng.gather(m0);
          static_cast<void>(pp_stage_backward(eng, w0, x, dh, rig.io));
          eng.grad_ready(w0);
        }
        CHECK(eng.step().applied == (mb == pp_micro - 1));
      }
    }
    auto all = eng.gather_all();
    if (comm.rank() == 0) {
      out["w0"] = rig.io.template read<float>(eng, eng.param(w0));
      out["w1"] = rig.io.template read<float>(eng, eng.param(w1));
    }
  });
  return out;
}

/// 4 ranks as (pipe 2, data 2): stage s's engine holds w<s> over its data group, the stages
/// exchange activations and gradients by the 1F1B schedule.
template <class Rig> pp_weights pp_pipelined(const Rig& rig, int stage) {
  const zero::topology topo({{"pipe", 2}, {"data", 2}});
  pp_weights out;
  std::mutex mu;
  rig.run_group(4, [&](auto& world) {
    auto data = topo.split(world, {"data"});
    auto pipe = topo.split(world, {"pipe"});
    const int s = topo.coord(world.rank(), "pipe");
    auto backend = rig.make_backend(world);
    zero::engine<decltype(backend), std::remove_cvref_t<decltype(world)>> eng(pp_config(stage), data, backend);
    eng.set_model_group(pipe, {.pipe = s});
    int module = 0;
    auto w = pp_register(eng, s, module);
    eng.finalize();
    pp_init(eng);
    using handle = decltype(pipe.send(static_cast<const float*>(nullptr), 0, 0));
    // What the stage sends, per micro-batch (each unchanged until its send completes, at the end of the step),
    // and where it receives.
    using buffer = decltype(rig.io.template comm_buffer<float>(pp_width));
    std::vector<buffer> out_sent, in_grad_sent;
    for (int mb = 0; mb < pp_micro; ++mb) {
      out_sent.push_back(rig.io.template comm_buffer<float>(pp_width));
      in_grad_sent.push_back(rig.io.template comm_buffer<float>(pp_width));
    }
    auto inbox = rig.io.template comm_buffer<float>(pp_width);
    for (int step = 0; step < pp_steps; ++step) {
      // Per micro-batch: the stage's input and output, and the gradients of its output and input.
      std::vector<std::vector<float>> in(pp_micro), outp(pp_micro), dout(pp_micro), din(pp_micro);
      std::vector<handle> sends;
      const auto receive = [&](std::vector<float>& into, int peer) {
        pipe.recv(inbox.data(), pp_width, peer).wait();
        into = rig.io.read_buffer(eng, inbox);
      };
      const auto send = [&](buffer& from, const std::vector<float>& values, int peer) {
        rig.io.write_buffer(eng, from, values);
        sends.push_back(pipe.send(from.data(), pp_width, peer));
      };
      int micro_step = 0;
      for (const auto& op : zero::one_f_one_b(2, s, pp_micro)) {
        const auto mb = static_cast<std::size_t>(op.micro_batch);
        switch (op.op) {
        case zero::pipe_op::recv_activation:
          receive(in[mb], op.peer);
          break;
        case zero::pipe_op::forward: {
          if (s == 0) {
            in[mb] = pp_input(step, data.rank(), op.micro_batch);
          }
          auto on = eng.gather(module);
          outp[mb] = pp_stage_forward(eng, w, in[mb], rig.io);
          break;
        }
        case zero::pipe_op::send_activation:
          send(out_sent[mb], outp[mb], op.peer);
          break;
        case zero::pipe_op::recv_gradient:
          receive(dout[mb], op.peer);
          break;
        case zero::pipe_op::backward: {
          if (s == 1) {
            dout[mb] = pp_loss_grad(outp[mb]);
          }
          {
            auto on = eng.gather(module);
            din[mb] = pp_stage_backward(eng, w, in[mb], dout[mb], rig.io);
            eng.grad_ready(w);
          }
          break;
        }
        case zero::pipe_op::send_gradient:
          send(in_grad_sent[mb], din[mb], op.peer);
          break;
        }
        // A micro-step ends after its backward has sent the input's gradient on: the last one's
        // step() is collective over the model group (the clipping norm), so every stage must have
        // sent what the stage before it waits for.
        if ((op.op == zero::pipe_op::backward && s == 0) || op.op == zero::pipe_op::send_gradient) {
          CHECK(eng.step().applied == (++micro_step == pp_micro));
        }
      }
      for (auto& h : sends) {
        h.wait();
      }
    }
    auto all = eng.gather_all();
    if (data.rank() == 0) {
      auto values = rig.io.template read<float>(eng, eng.param(w));
      const std::lock_guard lock(mu);
      out["w" + std::to_string(s)] = std::move(values);
    }
  });
  return out;
}

} // namespace zero_test
