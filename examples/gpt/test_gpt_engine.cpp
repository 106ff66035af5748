// zero-gpt's framework side (gpt_engine.hpp) on the engine at stage 3: the tied wte is gathered exactly for its
// uses (its module, "embed", once for the embedding, once for the head's forward and backward, once for the
// embedding's backward), and with reuse the later uses come from the unit kept gathered.

#include "gpt_data.hpp"
#include "gpt_engine.hpp"

#include <doctest/doctest.h>
#include <string>
#include <vector>
#include <zero/backend/cpu_backend.hpp>
#include <zero/comm/thread_communicator.hpp>
#include <zero/config/config.hpp>
#include <zero/engine/engine.hpp>

namespace {

using engine_t = zero::engine<zero::cpu_backend, zero::thread_communicator>;

/// Gather counters of the last of `steps` training steps of a tiny GPT at stage 3 on 2 ranks.
zero::gather_stats stage3_gathers(const std::string& reuse, int layers, int steps) {
  zero::gather_stats last;
  const gpt::model_config cfg{.vocab = 16, .seq = 8, .layers = layers, .heads = 2, .d_model = 8};
  zero::run_ranks(2, [&](zero::thread_communicator& comm) {
    const std::string json = R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
      "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                            "stage3_max_reuse_distance": )" +
                             reuse + "}}";
    zero::cpu_backend backend({.threads = 1});
    engine_t eng(zero::config::from_string(json, {.world_size = 2}), comm, backend);
    gpt::zero_gpt model(eng, cfg, 2);
    eng.finalize();
    model.init(7);
    std::vector<std::int32_t> in(16), tg(16);
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < in.size(); ++i) {
        in[i] = static_cast<std::int32_t>(
            (i * 5 + static_cast<std::size_t>(s) + static_cast<std::size_t>(comm.rank())) % 16);
        tg[i] = static_cast<std::int32_t>((in[i] + 1) % 16);
      }
      static_cast<void>(model.run(in.data(), tg.data(), 2, 8, true, 1.0f / 32));
      static_cast<void>(eng.step());
    }
    if (comm.rank() == 0) {
      last = eng.coordinator()->stats_of_last_step();
    }
  });
  return last;
}

} // namespace

TEST_CASE("stage 3 gathers the tied wte exactly for its uses: its module three times a step, 2 L + 5 gathers in all") {
  for (int layers : {1, 3}) {
    CAPTURE(layers);
    // Forward: embed, the blocks, ln_f, embed again for the head (its backward in the same scope); backward: ln_f,
    // the blocks, embed. Without reuse every gather is an all-gather: 2 L + 5, of them 3 of embed.
    const auto plain = stage3_gathers("0", layers, 3);
    CHECK(plain.all_gathers == static_cast<std::size_t>(2 * layers + 5));
    CHECK(plain.reused == 0);
    CHECK(plain.trace_changes == 0);
    // With reuse the unit kept gathered serves the next use: as many gathers in all, fewer all-gathers.
    const auto kept = stage3_gathers("1000000000", layers, 3);
    CHECK(kept.all_gathers + kept.reused == static_cast<std::size_t>(2 * layers + 5));
    CHECK(kept.reused >= 2); // ln_f's and embed's head use follow their forward use
    CHECK(kept.prefetch_wasted == 0);
  }
}

TEST_CASE("gradient_scratch_layout: wte's region, then one module's tensors at a time (or wte's and wpe's only)") {
  // What --config auto-plan takes off the GPU's budget besides the activations (gpt_cuda_engine.hpp).
  const auto cfg = gpt::model_config::preset("d12");
  const auto specs = gpt::parameters(cfg);
  const auto l = gpt::gradient_scratch_layout(specs);
  const std::size_t wte = 50257u * 768, block = 12u * 768 * 768 + 13u * 768;
  CHECK(l.floats == wte + block); // the blocks are the largest modules
  CHECK(l.at[0] == 0);
  CHECK(l.at[1] == wte); // wpe, the embedding module's second tensor
  // Block 0 starts the region again, its tensors one after another; block 1 starts over; ln_f's bias follows
  // its weight.
  CHECK(l.at[2] == wte);
  CHECK(l.at[3] == wte + static_cast<std::size_t>(specs[2].numel()));
  CHECK(l.at[2 + 12] == wte);
  CHECK(l.at.back() == wte + 768);
  // A math that adds the other gradients into bf16 itself (the GPU's): wte's region, then wpe's, and no other.
  const auto e = gpt::gradient_scratch_layout(specs, true);
  const std::size_t wpe = 1024u * 768;
  CHECK(e.floats == wte + wpe);
  CHECK(e.at[0] == 0);
  CHECK(e.at[1] == wte);
  CHECK(e.at[2] == gpt::scratch_layout::none);
  CHECK(e.at.back() == gpt::scratch_layout::none);
}
