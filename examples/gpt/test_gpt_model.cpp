// The GPT example's CPU model math (gpt_model.hpp): the parameter list against Hugging Face GPT-2's names
// and counts, every gradient against central finite differences, the tied embedding, determinism, token
// checks and the initialisation's statistics.
#include "gpt_model.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using gpt_test::tensors;
using gpt_test::thrown_message;
using gpt_test::zeros_like;

// The tiny model of the gradient checks: vocab 11, seq 5, 2 layers of 2 heads over 8 channels, batch 2.
gpt::model_config tiny_config() {
  return gpt::model_config{.vocab = 11, .seq = 5, .layers = 2, .heads = 2, .d_model = 8};
}
constexpr int tiny_b = 2;
constexpr int tiny_t = 5;
const std::vector<std::int32_t> tiny_tokens = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
const std::vector<std::int32_t> tiny_targets = {1, 4, 1, 5, 9, 2, 6, 5, 3, 10};

std::size_t index_of(const gpt::model_config& cfg, std::string_view name) {
  const auto specs = gpt::parameters(cfg);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].name == name) {
      return i;
    }
  }
  throw std::invalid_argument(std::string(name));
}

// Parameters far from GPT-2's init (std 0.02 would make most gradients vanish under the finite
// differences' rounding): matrices and embeddings N(0, 0.5), biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.1).
tensors rough_params(const gpt::model_config& cfg) {
  return gpt_test::spread_params(cfg, 1000, 0.5, [](float x) { return x; });
}

// A whole forward, the head reading head_wte (wte itself when tied): returns grad_scale * the loss sum.
double forward(gpt::cpu_model& m, const tensors& w, const float* head_wte, float grad_scale, bool train, int B = tiny_b,
               int T = tiny_t) {
  const int layers = m.config().layers;
  m.embed_forward(w[0].data(), w[1].data(), tiny_tokens.data(), B, T);
  for (int l = 0; l < layers; ++l) {
    m.block_forward(l, gpt_test::block_of(w, l));
  }
  const std::size_t lnf = w.size() - 2;
  m.final_forward(w[lnf].data(), w[lnf + 1].data());
  return m.head_forward_loss(head_wte, tiny_targets.data(), grad_scale, train) * grad_scale;
}

// The whole backward after a train forward; the head's wte gradient goes to d_head_wte (g[0] when tied).
void backward(gpt::cpu_model& m, const tensors& w, const float* head_wte, tensors& g, float* d_head_wte) {
  const int layers = m.config().layers;
  const std::size_t lnf = w.size() - 2;
  m.head_backward(head_wte, d_head_wte);
  m.final_backward(w[lnf].data(), g[lnf].data(), g[lnf + 1].data());
  for (int l = layers - 1; l >= 0; --l) {
    m.block_backward(l, gpt_test::block_of(w, l), gpt_test::grads_of(g, l));
  }
  m.embed_backward(tiny_tokens.data(), g[0].data(), g[1].data());
}

// One train step with the tied head into g (added).
double step(gpt::cpu_model& m, const tensors& w, tensors& g, float grad_scale) {
  const double loss = forward(m, w, w[0].data(), grad_scale, true);
  backward(m, w, w[0].data(), g, g[0].data());
  return loss;
}

} // namespace

TEST_CASE("model_config: validate names the flag, presets are GPT-2's sizes") {
  CHECK_NOTHROW(gpt::model_config{}.validate());
  auto message = [](gpt::model_config cfg) { return thrown_message([&] { cfg.validate(); }); };
  CHECK(message({.vocab = 0}).starts_with("--vocab:"));
  CHECK(message({.seq = -1}).starts_with("--seq:"));
  CHECK(message({.layers = 0}).starts_with("--layers:"));
  CHECK(message({.heads = 0}).starts_with("--heads:"));
  CHECK(message({.d_model = 0}).starts_with("--d-model:"));
  CHECK(message({.heads = 3, .d_model = 8}) == "--d-model: 8 does not divide by --heads 3");
  const gpt::model_config indivisible{.heads = 3, .d_model = 8};
  CHECK_THROWS_AS(indivisible.validate(), std::invalid_argument);

  const std::array<std::array<int, 3>, 4> sizes{{{12, 12, 768}, {24, 16, 1024}, {36, 20, 1280}, {48, 25, 1600}}};
  const std::array<const char*, 4> names{"d12", "d24", "d36", "d48"};
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto cfg = gpt::model_config::preset(names[i]);
    CHECK(cfg.vocab == 50257);
    CHECK(cfg.seq == 1024);
    CHECK(cfg.layers == sizes[i][0]);
    CHECK(cfg.heads == sizes[i][1]);
    CHECK(cfg.d_model == sizes[i][2]);
    CHECK_NOTHROW(cfg.validate());
  }
  CHECK_THROWS_AS(gpt::model_config::preset("d6"), std::invalid_argument);
}

TEST_CASE("parameters: Hugging Face GPT-2's names, shapes and counts") {
  const auto cfg = gpt::model_config::preset("d12");
  const auto specs = gpt::parameters(cfg);
  REQUIRE(specs.size() == 2 + 12 * 12 + 2);
  CHECK(specs[0].name == "transformer.wte.weight");
  CHECK(specs[0].shape == std::vector<std::int64_t>{50257, 768});
  CHECK(specs[0].block == -1);
  CHECK(specs[0].decay);
  CHECK(specs[1].name == "transformer.wpe.weight");
  CHECK(specs[1].shape == std::vector<std::int64_t>{1024, 768});
  CHECK(specs[1].block == -1);
  const std::array<const char*, 12> block_names{
      "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
      "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  const std::array<std::vector<std::int64_t>, 12> block_shapes{
      {{768}, {768}, {768, 2304}, {2304}, {768, 768}, {768}, {768}, {768}, {768, 3072}, {3072}, {3072, 768}, {768}}};
  for (int l = 0; l < 12; ++l) {
    for (std::size_t i = 0; i < 12; ++i) {
      const auto& s = specs[2 + static_cast<std::size_t>(l) * 12 + i];
      CHECK(s.name == "transformer.h." + std::to_string(l) + "." + block_names[i]);
      CHECK(s.shape == block_shapes[i]);
      CHECK(s.block == l);
      // llm.c's rule: decay the 2-D tensors (the matmul weights), not the biases or LayerNorm weights.
      CHECK(s.decay == (s.shape.size() == 2));
    }
  }
  CHECK(specs[specs.size() - 2].name == "transformer.ln_f.weight");
  CHECK(specs.back().name == "transformer.ln_f.bias");
  CHECK(specs.back().block == 12);
  CHECK_FALSE(specs.back().decay);

  // By hand, C = 768: wte 50257 * 768 = 38,597,376; wpe 1024 * 768 = 786,432; per block
  // ln_1 2C = 1,536 + c_attn C*3C + 3C = 1,771,776 + attn.c_proj C*C + C = 590,592 + ln_2 1,536
  // + c_fc C*4C + 4C = 2,362,368 + mlp.c_proj 4C*C + C = 2,360,064 = 7,087,872, times 12 = 85,054,464;
  // ln_f 1,536. Total 124,439,808 (llm.c's 124,475,904 pads the vocabulary to 50304: 36,096 more).
  std::int64_t total = 0;
  for (const auto& s : specs) {
    total += s.numel();
  }
  CHECK(total == 124'439'808);
  CHECK(total + (50304 - 50257) * 768 == 124'475'904);

  // The same formula for every preset: V*C + T*C + L*(12C^2 + 13C) + 2C (d48: 1,557,611,200).
  for (const char* name : {"d12", "d24", "d36", "d48"}) {
    const auto p = gpt::model_config::preset(name);
    const std::int64_t c = p.d_model;
    std::int64_t sum = 0;
    for (const auto& s : gpt::parameters(p)) {
      sum += s.numel();
    }
    CHECK(sum == std::int64_t{p.vocab} * c + std::int64_t{p.seq} * c + p.layers * (12 * c * c + 13 * c) + 2 * c);
  }
  CHECK(std::int64_t{50257} * 1600 + 1024 * 1600 + 48 * (12 * 1600 * 1600 + 13 * 1600) + 2 * 1600 == 1'557'611'200);
}

TEST_CASE("init_gpt2: GPT-2's statistics, the same values for any slice") {
  const auto cfg = gpt::model_config::preset("d12");
  const auto specs = gpt::parameters(cfg);
  auto stats = [&](std::string_view name) {
    const auto& s = specs[index_of(cfg, name)];
    std::vector<float> v(static_cast<std::size_t>(s.numel()));
    gpt::init_gpt2(cfg, s, v, 42);
    double sum = 0.0, sq = 0.0;
    for (float x : v) {
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    const double mean = sum / static_cast<double>(v.size());
    return std::array<double, 2>{mean, std::sqrt(sq / static_cast<double>(v.size()) - mean * mean)};
  };
  // 2,359,296 draws: the mean's standard error is 0.02 / 1536 = 1.3e-5; the std's relative error 0.05%.
  const auto fc = stats("transformer.h.3.mlp.c_fc.weight");
  CHECK(std::abs(fc[0]) < 1e-4);
  CHECK(fc[1] == doctest::Approx(0.02).epsilon(0.005));
  const auto proj = stats("transformer.h.3.mlp.c_proj.weight");
  CHECK(std::abs(proj[0]) < 1e-4);
  CHECK(proj[1] == doctest::Approx(0.02 / std::sqrt(24.0)).epsilon(0.005));
  const auto attn_proj = stats("transformer.h.0.attn.c_proj.weight");
  CHECK(attn_proj[1] == doctest::Approx(0.02 / std::sqrt(24.0)).epsilon(0.01));
  const auto wpe = stats("transformer.wpe.weight");
  CHECK(wpe[1] == doctest::Approx(0.02).epsilon(0.01));
  CHECK(stats("transformer.h.0.ln_1.weight") == std::array<double, 2>{1.0, 0.0});
  CHECK(stats("transformer.ln_f.bias") == std::array<double, 2>{0.0, 0.0});
  CHECK(stats("transformer.h.5.attn.c_attn.bias") == std::array<double, 2>{0.0, 0.0});

  // A slice filled alone equals the same slice of the whole tensor, bit for bit.
  const auto& qkv = specs[index_of(cfg, "transformer.h.1.attn.c_attn.weight")];
  std::vector<float> whole(static_cast<std::size_t>(qkv.numel()));
  gpt::init_gpt2(cfg, qkv, whole, 7);
  std::vector<float> slice(1000);
  gpt::init_gpt2(cfg, qkv, slice, 7, 12345);
  CHECK(std::memcmp(slice.data(), whole.data() + 12345, slice.size() * sizeof(float)) == 0);
  // The whole tensor's fill runs on the host's threads (1,769,472 elements, above init_elements_per_thread): the
  // same bits as filling it 4096 elements at a time, each such slice on one thread.
  static_assert(768 * 2304 > 4 * gpt::init_elements_per_thread);
  std::vector<float> serial(whole.size());
  for (std::size_t at = 0; at < serial.size(); at += 4096) {
    const std::size_t len = std::min<std::size_t>(4096, serial.size() - at);
    gpt::init_gpt2(cfg, qkv, std::span<float>(serial).subspan(at, len), 7, static_cast<std::int64_t>(at));
  }
  CHECK(std::memcmp(serial.data(), whole.data(), whole.size() * sizeof(float)) == 0);
  // Another seed or another tensor of the same shape draws other values.
  std::vector<float> other(1000);
  gpt::init_gpt2(cfg, qkv, other, 8, 12345);
  CHECK(std::memcmp(slice.data(), other.data(), slice.size() * sizeof(float)) != 0);
  gpt::init_gpt2(cfg, specs[index_of(cfg, "transformer.h.2.attn.c_attn.weight")], other, 7, 12345);
  CHECK(std::memcmp(slice.data(), other.data(), slice.size() * sizeof(float)) != 0);
  // A slice past the end is refused.
  CHECK_THROWS_AS(gpt::init_gpt2(cfg, qkv, slice, 7, qkv.numel() - 999), std::out_of_range);
}

TEST_CASE("cpu_model: the loss at GPT-2's init is about log(vocab) per token") {
  const auto cfg = tiny_config();
  tensors w = zeros_like(cfg);
  const auto specs = gpt::parameters(cfg);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    gpt::init_gpt2(cfg, specs[i], w[i], 1);
  }
  gpt::cpu_model m(cfg, tiny_b);
  const double mean = forward(m, w, w[0].data(), 1.0f / (tiny_b * tiny_t), false);
  CHECK(mean == doctest::Approx(std::log(11.0)).epsilon(0.01));
  CHECK(m.logits().size() == static_cast<std::size_t>(tiny_b * tiny_t * 11));
  CHECK(m.activation_bytes() > 0);
}

TEST_CASE("cpu_model: every gradient matches central finite differences") {
  // Tolerance: with eps = 1e-3 the forward's fp32 rounding (~1e-7 on a loss of ~3) moves a difference
  // quotient by ~1e-4, so an element passes when |analytic - numeric| <= 1e-2 * max(|analytic|, |numeric|)
  // + 2e-4. Checked per tensor: the element of largest analytic gradient and three more at fixed places.
  const auto cfg = tiny_config();
  const float grad_scale = 1.0f / (tiny_b * tiny_t);
  tensors w = rough_params(cfg);
  tensors g = zeros_like(cfg);
  gpt::cpu_model m(cfg, tiny_b);
  step(m, w, g, grad_scale);

  const auto specs = gpt::parameters(cfg);
  const double eps = 1e-3;
  double worst = 0.0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const std::size_t n = w[i].size();
    std::size_t largest = 0;
    for (std::size_t j = 0; j < n; ++j) {
      if (std::abs(g[i][j]) > std::abs(g[i][largest])) {
        largest = j;
      }
    }
    for (std::size_t j : {largest, n / 3, n / 2 + 1, n - 1}) {
      j = std::min(j, n - 1);
      const float saved = w[i][j];
      w[i][j] = static_cast<float>(saved + eps);
      const float up = w[i][j];
      const double loss_up = forward(m, w, w[0].data(), grad_scale, false);
      w[i][j] = static_cast<float>(saved - eps);
      const float down = w[i][j];
      const double loss_down = forward(m, w, w[0].data(), grad_scale, false);
      w[i][j] = saved;
      // Divide by the step the fp32 parameter really took.
      const double numeric = (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
      const double analytic = g[i][j];
      const double err = std::abs(analytic - numeric);
      const double allowed = 1e-2 * std::max(std::abs(analytic), std::abs(numeric)) + 2e-4;
      worst = std::max(worst, err / allowed);
      INFO(specs[i].name, "[", j, "]: analytic ", analytic, ", numeric ", numeric);
      CHECK(err <= allowed);
    }
    // Every tensor takes part: its largest gradient is not zero.
    INFO(specs[i].name);
    CHECK(std::abs(g[i][largest]) > 1e-3);
  }
  MESSAGE("worst error / allowed: ", worst);
}

TEST_CASE("cpu_model: the tied wte's gradient is the sum of the head's and the embedding's") {
  const auto cfg = tiny_config();
  const float grad_scale = 0.1f;
  tensors w = rough_params(cfg);

  tensors tied = zeros_like(cfg);
  gpt::cpu_model m(cfg, tiny_b);
  step(m, w, tied, grad_scale);

  // Untied: the head reads a copy of wte and writes its gradient to a buffer of its own.
  const std::vector<float> head_wte = w[0];
  std::vector<float> d_head(head_wte.size(), 0.0f);
  tensors untied = zeros_like(cfg);
  forward(m, w, head_wte.data(), grad_scale, true);
  backward(m, w, head_wte.data(), untied, d_head.data());

  double head_norm = 0.0, embed_norm = 0.0;
  for (std::size_t j = 0; j < d_head.size(); ++j) {
    const double sum = static_cast<double>(d_head[j]) + untied[0][j];
    CHECK(tied[0][j] == doctest::Approx(sum).epsilon(1e-5).scale(1e-6));
    head_norm += std::abs(d_head[j]);
    embed_norm += std::abs(untied[0][j]);
  }
  // Both uses contribute.
  CHECK(head_norm > 1e-3);
  CHECK(embed_norm > 1e-3);
  // Token 0 is never an input: its row's gradient is the head's alone.
  for (std::size_t c = 0; c < 8; ++c) {
    CHECK(untied[0][c] == 0.0f);
    CHECK(tied[0][c] == d_head[c]);
  }
  // The other tensors are the same either way.
  for (std::size_t i = 1; i < tied.size(); ++i) {
    CHECK(std::memcmp(tied[i].data(), untied[i].data(), tied[i].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("cpu_model: gradients accumulate into the caller's buffers") {
  const auto cfg = tiny_config();
  tensors w = rough_params(cfg);
  tensors fresh = zeros_like(cfg);
  gpt::cpu_model m(cfg, tiny_b);
  step(m, w, fresh, 0.1f);
  tensors primed = zeros_like(cfg);
  for (auto& t : primed) {
    std::fill(t.begin(), t.end(), 1.0f);
  }
  step(m, w, primed, 0.1f);
  for (std::size_t i = 0; i < fresh.size(); ++i) {
    for (std::size_t j = 0; j < fresh[i].size(); ++j) {
      CHECK(primed[i][j] == doctest::Approx(1.0 + fresh[i][j]).epsilon(1e-5));
    }
  }
}

TEST_CASE("cpu_model: the same inputs give the same bits") {
  const auto cfg = tiny_config();
  tensors w = rough_params(cfg);
  tensors g1 = zeros_like(cfg), g2 = zeros_like(cfg);
  gpt::cpu_model a(cfg, tiny_b);
  gpt::cpu_model b(cfg, 4); // a larger model running a pass of fewer sequences
  const double l1 = step(a, w, g1, 0.1f);
  const double l2 = step(b, w, g2, 0.1f);
  CHECK(std::memcmp(&l1, &l2, sizeof l1) == 0);
  for (std::size_t i = 0; i < g1.size(); ++i) {
    CHECK(std::memcmp(g1[i].data(), g2[i].data(), g1[i].size() * sizeof(float)) == 0);
  }
  // And again on the same model.
  tensors g3 = zeros_like(cfg);
  const double l3 = step(a, w, g3, 0.1f);
  CHECK(std::memcmp(&l1, &l3, sizeof l1) == 0);
  for (std::size_t i = 0; i < g1.size(); ++i) {
    CHECK(std::memcmp(g1[i].data(), g3[i].data(), g1[i].size() * sizeof(float)) == 0);
  }
  // Attention is causal: the first 3 positions' logits do not depend on the tokens after them.
  gpt::cpu_model c(cfg, 1);
  forward(c, w, w[0].data(), 1.0f, false, 1, 3);
  const std::vector<float> prefix(c.logits().begin(), c.logits().end());
  forward(c, w, w[0].data(), 1.0f, false, 1, 5);
  REQUIRE(prefix.size() == 3 * 11);
  for (std::size_t j = 0; j < prefix.size(); ++j) {
    CHECK(c.logits()[j] == doctest::Approx(prefix[j]).epsilon(1e-5).scale(1e-5));
  }
}

TEST_CASE("cpu_model: a token outside the vocabulary never indexes the embedding") {
  const auto cfg = tiny_config();
  tensors w = rough_params(cfg);
  gpt::cpu_model m(cfg, tiny_b);
  std::vector<std::int32_t> bad = tiny_tokens;
  bad[8] = 11; // position (1, 3)
  const std::string high = thrown_message([&] { m.embed_forward(w[0].data(), w[1].data(), bad.data(), 2, 5); });
  CHECK(high == "embed_forward: token at position (1, 3) is 11, outside the vocabulary [0, 11)");
  CHECK_THROWS_AS(m.embed_forward(w[0].data(), w[1].data(), bad.data(), 2, 5), std::out_of_range);
  bad[8] = 3;
  bad[0] = -1;
  const std::string low = thrown_message([&] { m.embed_forward(w[0].data(), w[1].data(), bad.data(), 2, 5); });
  CHECK(low == "embed_forward: token at position (0, 0) is -1, outside the vocabulary [0, 11)");
  // Targets are checked the same way.
  m.embed_forward(w[0].data(), w[1].data(), tiny_tokens.data(), 2, 5);
  for (int l = 0; l < 2; ++l) {
    m.block_forward(l, gpt_test::block_of(w, l));
  }
  m.final_forward(w[w.size() - 2].data(), w.back().data());
  CHECK_THROWS_AS(m.head_forward_loss(w[0].data(), bad.data(), 1.0f, true), std::out_of_range);
  // Shapes beyond the model's are refused too, and a backward without a train forward.
  CHECK_THROWS_AS(m.embed_forward(w[0].data(), w[1].data(), tiny_tokens.data(), 3, 5), std::invalid_argument);
  CHECK_THROWS_AS(m.embed_forward(w[0].data(), w[1].data(), tiny_tokens.data(), 2, 6), std::invalid_argument);
  std::vector<float> d(w[0].size());
  CHECK_THROWS_AS(m.head_backward(w[0].data(), d.data()), std::logic_error);
  CHECK_THROWS_AS(m.block_forward(2, gpt_test::block_of(w, 1)), std::out_of_range);
  CHECK_THROWS_AS(gpt::cpu_model(cfg, 0), std::invalid_argument);
}
