// The GPT example's GPU model (gpt_cuda.hpp) against its CPU model (gpt_model.hpp): the same bf16-representable
// parameters and tokens through both, then the loss, the logits and every gradient compared within bf16's
// tolerance; the tied embedding's two uses; token checks that throw before anything runs; determinism;
// accumulation over micro-batches; causality. Needs a GPU: where none is visible only the host-side test cases
// (suite "host") run, and the program exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpt_cuda.hpp"
#include "gpt_model.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>
#include <zero/backend/cuda_backend.hpp>
#include <zero/core/cuda_check.hpp>
#include <zero/core/dtype.hpp>
#include <zero/engine/activation_store.hpp>
#include <zero/memory/buffer.hpp>
#include <zero/memory/device_allocator.hpp>

namespace {

using gpt_test::tensors;
using gpt_test::thrown_message;
using gpt_test::zeros_like;
using zero::bf16;
template <class T> using device_buffer = zero::buffer<T, zero::device_allocator>;

// A tiny model whose vocabulary is odd (253: the logits' rows are padded to 256) and whose heads are 32 wide.
gpt::model_config test_config() {
  return gpt::model_config{.vocab = 253, .seq = 32, .layers = 2, .heads = 2, .d_model = 64};
}
constexpr int test_b = 3;
constexpr int test_t = 32;

// ---- Tolerances ------------------------------------------------------------------------------------------------
// The GPU stores every activation in bf16: 8 significant bits, so each stored value carries a relative rounding
// error of at most 2^-9 (about 2e-3), RMS 2^-9 / sqrt(3) (about 1.1e-3), unbiased (round to nearest even). The CPU
// reference computes in fp32 (rounding 2^-24: exact by comparison) from the same bf16-representable parameters,
// so the difference is the bf16 roundings alone, propagated.
//
// Loss: a token's loss moves by the error of its target's logit less the softmax-weighted mean error of all
// logits; each logit carries ~3 roundings upstream of it (ln_f's output, the residual stream, the logit itself),
// about 0.3% of its RMS (0.8 with these parameters), so ~2.5e-3 nats a token, of either sign. Over the 96 tokens
// of a batch that sums to ~2.5e-2 nats on a total of ~530 (5e-5 relative); 2e-3 relative leaves a margin of 40.
constexpr double loss_rtol = 2e-3;
// Logits: ~0.3% RMS per logit as above; the relative L2 error of the whole [B, T, V] tensor must stay below 1e-2.
constexpr double logits_rtol = 1e-2;
// Gradients: each gradient tensor is reached through ~10-20 stored bf16 tensors (two blocks' activations, then
// dlogits, d ln_f, the residual stream's gradient, dfch, dqkv, dscores, ...), whose independent roundings add in
// quadrature: sqrt(20) * 1.1e-3 = 5e-3 relative, and LayerNorm's backward (which subtracts means) amplifies that
// by a small factor. The relative L2 error of each tensor must stay below 2e-2; an indexing or transposition bug
// gives O(1).
constexpr double grad_rtol = 2e-2;

// ---- Inputs ----------------------------------------------------------------------------------------------------

// Parameters where every gradient is well above bf16's noise, rounded to bf16 so that both models read the same
// values: matrices and embeddings N(0, 0.1) (with C = 64: q·k / sqrt(hs) and the logits have RMS ~0.8, a softmax
// neither flat nor saturated), biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.1).
tensors test_params(const gpt::model_config& cfg) {
  return gpt_test::spread_params(cfg, 2000, 0.1, [](float x) { return static_cast<float>(bf16(x)); });
}

// B * T ids in [0, vocab) from a key: about 80 distinct ids among 96, so some repeat and most rows of wte are
// never an input.
std::vector<std::int32_t> ids(std::uint64_t key, int vocab, int count = test_b * test_t) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<std::int32_t>(gpt::detail::splitmix64(key * 1000003 + i) % static_cast<std::uint64_t>(vocab));
  }
  return out;
}

// ---- The CPU reference -----------------------------------------------------------------------------------------

// One pass on the CPU (a train pass also runs the backward into g): returns the summed token loss.
double cpu_pass(gpt::cpu_model& m, const tensors& w, tensors* g, const std::vector<std::int32_t>& tokens,
                const std::vector<std::int32_t>& targets, float grad_scale, int B = test_b, int T = test_t) {
  const int layers = m.config().layers;
  const std::size_t lnf = w.size() - 2;
  m.embed_forward(w[0].data(), w[1].data(), tokens.data(), B, T);
  for (int l = 0; l < layers; ++l) {
    m.block_forward(l, gpt_test::block_of(w, l));
  }
  m.final_forward(w[lnf].data(), w[lnf + 1].data());
  const double loss = m.head_forward_loss(w[0].data(), targets.data(), grad_scale, g != nullptr);
  if (g != nullptr) {
    m.head_backward(w[0].data(), (*g)[0].data());
    m.final_backward(w[lnf].data(), (*g)[lnf].data(), (*g)[lnf + 1].data());
    for (int l = layers - 1; l >= 0; --l) {
      m.block_backward(l, gpt_test::block_of(w, l), gpt_test::grads_of(*g, l));
    }
    m.embed_backward(tokens.data(), (*g)[0].data(), (*g)[1].data());
  }
  return loss;
}

// ---- The GPU side ----------------------------------------------------------------------------------------------

// A non-blocking stream of the test's own (so nothing is ordered by the legacy default stream by accident).
class test_stream {
public:
  test_stream() { ZERO_CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~test_stream() { ZERO_CHECK_CUDA_NOTHROW(cudaStreamDestroy(s_)); }
  test_stream(const test_stream&) = delete;
  test_stream& operator=(const test_stream&) = delete;
  [[nodiscard]] cudaStream_t get() const { return s_; }

private:
  cudaStream_t s_ = nullptr;
};

// The parameters on the device in bf16 (the host values are bf16-representable: the conversion is exact).
std::vector<device_buffer<bf16>> upload(const tensors& w) {
  std::vector<device_buffer<bf16>> out;
  for (const auto& t : w) {
    std::vector<bf16> h(t.size());
    std::transform(t.begin(), t.end(), h.begin(), [](float v) { return bf16(v); });
    out.emplace_back(zero::device_allocator{}, t.size());
    ZERO_CHECK_CUDA(cudaMemcpy(out.back().data(), h.data(), h.size() * sizeof(bf16), cudaMemcpyHostToDevice));
  }
  // From pageable memory cudaMemcpy may return before its DMA lands: finish it before any stream reads.
  ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  return out;
}

// fp32 gradient buffers on the device, each element set to `value`.
std::vector<device_buffer<float>> grads_on_device(const gpt::model_config& cfg, float value = 0.0f) {
  std::vector<device_buffer<float>> out;
  for (const auto& s : gpt::parameters(cfg)) {
    const auto n = static_cast<std::size_t>(s.numel());
    out.emplace_back(zero::device_allocator{}, n);
    const std::vector<float> h(n, value);
    ZERO_CHECK_CUDA(cudaMemcpy(out.back().data(), h.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  }
  ZERO_CHECK_CUDA(cudaDeviceSynchronize());
  return out;
}

std::vector<float> download(const device_buffer<float>& d) {
  std::vector<float> h(d.size());
  ZERO_CHECK_CUDA(cudaMemcpy(h.data(), d.data(), d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return h;
}

tensors download(const std::vector<device_buffer<float>>& g, cudaStream_t stream) {
  ZERO_CHECK_CUDA(cudaStreamSynchronize(stream));
  tensors out;
  for (const auto& d : g) {
    out.push_back(download(d));
  }
  return out;
}

gpt::cuda_block_params gpu_block(const std::vector<device_buffer<bf16>>& w, int l) {
  std::array<const bf16*, gpt::block_tensor_count> p{};
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = w[2 + static_cast<std::size_t>(l) * p.size() + i].data();
  }
  return gpt::cuda_block_params::from(p);
}

gpt::cuda_block_grads gpu_grads(std::vector<device_buffer<float>>& g, int l) {
  std::array<gpt::grad_ref, gpt::block_tensor_count> p{};
  for (std::size_t i = 0; i < p.size(); ++i) {
    p[i] = g[2 + static_cast<std::size_t>(l) * p.size() + i].data();
  }
  return gpt::cuda_block_grads::from(p);
}

void gpu_forward(gpt::cuda_model& m, const std::vector<device_buffer<bf16>>& w, const std::vector<std::int32_t>& tokens,
                 int B = test_b, int T = test_t) {
  m.embed_forward(w[0].data(), w[1].data(), tokens.data(), B, T);
  for (int l = 0; l < m.config().layers; ++l) {
    m.block_forward(l, gpu_block(w, l));
  }
  m.final_forward(w[w.size() - 2].data(), w.back().data());
}

// The backward after a train head_forward_loss; the head's wte gradient goes to d_head_wte (g[0] when tied).
void gpu_backward(gpt::cuda_model& m, const std::vector<device_buffer<bf16>>& w, std::vector<device_buffer<float>>& g,
                  const std::vector<std::int32_t>& tokens, float* d_head_wte) {
  const std::size_t lnf = w.size() - 2;
  m.head_backward(w[0].data(), d_head_wte);
  m.final_backward(w[lnf].data(), g[lnf].data(), g[lnf + 1].data());
  for (int l = m.config().layers - 1; l >= 0; --l) {
    m.block_backward(l, gpu_block(w, l), gpu_grads(g, l));
  }
  m.embed_backward(tokens.data(), g[0].data(), g[1].data());
}

// One train step into g (tied head): returns the summed token loss.
double gpu_step(gpt::cuda_model& m, const std::vector<device_buffer<bf16>>& w, std::vector<device_buffer<float>>& g,
                const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets, float grad_scale,
                int B = test_b, int T = test_t) {
  gpu_forward(m, w, tokens, B, T);
  const double loss = m.head_forward_loss(w[0].data(), targets.data(), grad_scale, true);
  gpu_backward(m, w, g, tokens, g[0].data());
  return loss;
}

// What most test cases start from: the tiny model's parameters (on the host and, in bf16, on the device), a
// stream and a GPU model for test_b sequences. Members are destroyed in reverse: the model before its stream.
struct gpu_setup {
  const gpt::model_config cfg = test_config();
  const tensors w = test_params(cfg);
  test_stream stream;
  gpt::cuda_model gpu{cfg, test_b, stream.get()};
  const std::vector<device_buffer<bf16>> dw = upload(w);
};

// ||a - b|| / ||b||, in double.
double relative_l2(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  double diff = 0.0, ref = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    ref += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff / ref);
}

double l2(std::span<const float> a) {
  double s = 0.0;
  for (float v : a) {
    s += static_cast<double>(v) * static_cast<double>(v);
  }
  return std::sqrt(s);
}

// The GPU model of `cfg` over `path` against the CPU model on B sequences of T tokens: the train loss and every
// gradient within the tolerances above.
void check_against_cpu(const gpt::model_config& cfg, int B, int T, gpt::attention_path path,
                       bool gemm_epilogues = false) {
  const tensors w = test_params(cfg);
  const auto tokens = ids(21, cfg.vocab, B * T);
  const auto targets = ids(22, cfg.vocab, B * T);
  const float grad_scale = 1.0f / static_cast<float>(B * T);
  gpt::cpu_model cpu(cfg, B);
  tensors cpu_g = zeros_like(cfg);
  const double cpu_loss = cpu_pass(cpu, w, &cpu_g, tokens, targets, grad_scale, B, T);

  test_stream stream;
  gpt::cuda_model gpu(cfg, B, stream.get(),
                      gpt::cuda_model_options{.attention = path, .gemm_epilogues = gemm_epilogues});
  REQUIRE(gpu.attention() == path);
  const auto dw = upload(w);
  auto dg = grads_on_device(cfg);
  const double gpu_loss = gpu_step(gpu, dw, dg, tokens, targets, grad_scale, B, T);
  const tensors gpu_g = download(dg, stream.get());
  CHECK(std::abs(gpu_loss - cpu_loss) <= loss_rtol * std::abs(cpu_loss));
  const auto specs = gpt::parameters(cfg);
  double worst = 0.0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const double err = relative_l2(gpu_g[i], cpu_g[i]);
    worst = std::max(worst, err);
    INFO(specs[i].name, ": relative L2 error ", err);
    CHECK(err <= grad_rtol);
  }
  const std::string kind = std::string(path == gpt::attention_path::fused ? "fused" : "materialized") +
                           (gemm_epilogues ? ", cuBLASLt epilogues" : "");
  MESSAGE("head size ", cfg.d_model / cfg.heads, ", T ", T, ", ", kind, ": loss ", gpu_loss, " (cpu ", cpu_loss,
          "), worst gradient error ", worst);
}

} // namespace

TEST_SUITE("host") {
  TEST_CASE("build_embedding_plan: the rows sorted by token, ascending within each") {
    // Tokens of 2 sequences of 4; vocabulary 6, ids 1 and 4 unused.
    const std::vector<std::int32_t> tokens = {3, 0, 3, 5, 2, 3, 0, 5};
    std::vector<std::int32_t> counts(6);
    std::vector<std::int32_t> plan(gpt::kernels::embedding_plan_ints(tokens.size()), -7);
    const std::size_t distinct = gpt::kernels::build_embedding_plan(tokens, counts, plan);
    REQUIRE(distinct == 4);
    const std::vector<std::int32_t> expected = {
        0, 2, 3, 5,             // the ids that occur, ascending
        0, 2, 3, 6, 8,          // where each one's rows start, then the end
        1, 6, 4, 0, 2, 5, 3, 7, // the rows: token 0 at 1, 6; token 2 at 4; token 3 at 0, 2, 5; token 5 at 3, 7
    };
    CHECK(std::vector<std::int32_t>(plan.begin(), plan.begin() + static_cast<std::ptrdiff_t>(expected.size())) ==
          expected);
    CHECK(plan.size() >= expected.size());
    // One token everywhere: one bucket holding every row in order.
    const std::vector<std::int32_t> same(5, 4);
    CHECK(gpt::kernels::build_embedding_plan(same, counts, plan) == 1);
    CHECK(std::vector<std::int32_t>(plan.begin(), plan.begin() + 8) ==
          std::vector<std::int32_t>{4, 0, 5, 0, 1, 2, 3, 4});
  }
}

TEST_SUITE("gpu") {
  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: loss, logits and every gradient match cpu_model within bf16's tolerance") {
    const auto tokens = ids(1, cfg.vocab);
    const auto targets = ids(2, cfg.vocab);
    const float grad_scale = 1.0f / (test_b * test_t);
    const auto specs = gpt::parameters(cfg);

    gpt::cpu_model cpu(cfg, test_b);
    const double cpu_eval = cpu_pass(cpu, w, nullptr, tokens, targets, grad_scale);
    const std::vector<float> cpu_logits(cpu.logits().begin(), cpu.logits().end());
    tensors cpu_g = zeros_like(cfg);
    const double cpu_train = cpu_pass(cpu, w, &cpu_g, tokens, targets, grad_scale);

    CHECK(gpu.config().vocab == cfg.vocab);
    CHECK(gpu.batch() == test_b);
    CHECK(gpu.activation_bytes() > gpt::cuda_model::cublas_workspace_bytes);
    gpu_forward(gpu, dw, tokens);
    const double gpu_eval = gpu.head_forward_loss(dw[0].data(), targets.data(), grad_scale, false);
    const auto gpu_logits = gpu.logits();
    REQUIRE(gpu_logits.size() == static_cast<std::size_t>(test_b * test_t * cfg.vocab));
    auto dg = grads_on_device(cfg);
    const double gpu_train = gpu_step(gpu, dw, dg, tokens, targets, grad_scale);
    const tensors gpu_g = download(dg, stream.get());

    MESSAGE("loss: cpu ", cpu_eval, ", gpu ", gpu_eval, " (per token ", cpu_eval / (test_b * test_t), ")");
    CHECK(std::abs(gpu_eval - cpu_eval) <= loss_rtol * std::abs(cpu_eval));
    CHECK(std::abs(gpu_train - cpu_train) <= loss_rtol * std::abs(cpu_train));
    // The loss is about log(V) per token with these parameters: the test compares a real softmax.
    CHECK(cpu_eval / (test_b * test_t) == doctest::Approx(std::log(253.0)).epsilon(0.2));
    const double logits_err = relative_l2(gpu_logits, cpu_logits);
    MESSAGE("logits: relative L2 error ", logits_err);
    CHECK(logits_err <= logits_rtol);

    double worst = 0.0;
    for (std::size_t i = 0; i < specs.size(); ++i) {
      const double err = relative_l2(gpu_g[i], cpu_g[i]);
      worst = std::max(worst, err);
      INFO(specs[i].name, ": relative L2 error ", err, ", |cpu| ", l2(cpu_g[i]), ", |gpu| ", l2(gpu_g[i]));
      CHECK(err <= grad_rtol);
      // Every tensor takes part.
      CHECK(l2(cpu_g[i]) > 1e-4);
    }
    MESSAGE("gradients: worst relative L2 error ", worst, " (bound ", grad_rtol, ")");
  }

  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: the tied wte's gradient is the sum of the head's and the embedding's") {
    const auto tokens = ids(3, cfg.vocab);
    const auto targets = ids(4, cfg.vocab);
    const float grad_scale = 0.05f;

    auto tied = grads_on_device(cfg);
    gpu_step(gpu, dw, tied, tokens, targets, grad_scale);
    const std::vector<float> d_tied = download(tied, stream.get())[0];

    // Untied: the head's gradient in a buffer of its own, the embedding's in g[0].
    auto untied = grads_on_device(cfg);
    device_buffer<float> head(zero::device_allocator{}, w[0].size());
    ZERO_CHECK_CUDA(cudaMemset(head.data(), 0, head.bytes()));
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
    gpu_forward(gpu, dw, tokens);
    gpu.head_forward_loss(dw[0].data(), targets.data(), grad_scale, true);
    gpu_backward(gpu, dw, untied, tokens, head.data());
    const std::vector<float> d_embed = download(untied, stream.get())[0];
    const std::vector<float> d_head = download(head);

    std::vector<bool> is_input(static_cast<std::size_t>(cfg.vocab), false);
    for (auto t : tokens) {
      is_input[static_cast<std::size_t>(t)] = true;
    }
    const auto c = static_cast<std::size_t>(cfg.d_model);
    for (std::size_t j = 0; j < d_tied.size(); ++j) {
      // Tied: the head's GEMM wrote its product into zeros, the embedding added its row sum: d_head + d_embed.
      CHECK(d_tied[j] == doctest::Approx(static_cast<double>(d_head[j]) + d_embed[j]).epsilon(1e-6).scale(1e-9));
      if (!is_input[j / c]) {
        // A token that is never an input: the embedding leaves its row alone.
        CHECK(d_embed[j] == 0.0f);
        CHECK(d_tied[j] == d_head[j]);
      }
    }
    // Both uses contribute.
    CHECK(l2(d_head) > 1e-3);
    CHECK(l2(d_embed) > 1e-3);

    // And the sum is the CPU's tied gradient.
    gpt::cpu_model cpu(cfg, test_b);
    tensors cpu_g = zeros_like(cfg);
    cpu_pass(cpu, w, &cpu_g, tokens, targets, grad_scale);
    CHECK(relative_l2(d_tied, cpu_g[0]) <= grad_rtol);
  }

  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: a token outside the vocabulary throws before anything runs") {
    const auto tokens = ids(5, cfg.vocab);
    const auto targets = ids(6, cfg.vocab);
    const std::size_t lnf = w.size() - 2;

    // Before any pass, every later module refuses.
    CHECK_THROWS_AS(gpu.final_forward(dw[lnf].data(), dw[lnf + 1].data()), std::logic_error);
    CHECK_THROWS_AS(static_cast<void>(gpu.logits()), std::logic_error);

    gpu_forward(gpu, dw, tokens);
    const double before = gpu.head_forward_loss(dw[0].data(), targets.data(), 1.0f, false);

    std::vector<std::int32_t> bad = tokens;
    bad[35] = cfg.vocab; // position (1, 3)
    const std::string high = thrown_message([&] { gpu.embed_forward(dw[0].data(), dw[1].data(), bad.data(), 3, 32); });
    CHECK(high == "embed_forward: token at position (1, 3) is 253, outside the vocabulary [0, 253)");
    CHECK_THROWS_AS(gpu.embed_forward(dw[0].data(), dw[1].data(), bad.data(), 3, 32), std::out_of_range);
    bad[35] = tokens[35];
    bad[0] = -1;
    const std::string low = thrown_message([&] { gpu.embed_forward(dw[0].data(), dw[1].data(), bad.data(), 3, 32); });
    CHECK(low == "embed_forward: token at position (0, 0) is -1, outside the vocabulary [0, 253)");
    // Targets are checked the same way.
    const std::string target = thrown_message([&] { gpu.head_forward_loss(dw[0].data(), bad.data(), 1.0f, false); });
    CHECK(target == "head_forward_loss: target at position (0, 0) is -1, outside the vocabulary [0, 253)");

    // Nothing ran: the pass before the refusals is still the model's, and gives the same loss bits again.
    gpu.final_forward(dw[lnf].data(), dw[lnf + 1].data());
    const double after = gpu.head_forward_loss(dw[0].data(), targets.data(), 1.0f, false);
    CHECK(std::memcmp(&before, &after, sizeof before) == 0);

    // Shapes beyond the model's are refused too, and a backward without a train forward.
    CHECK_THROWS_AS(gpu.embed_forward(dw[0].data(), dw[1].data(), tokens.data(), 4, 32), std::invalid_argument);
    CHECK_THROWS_AS(gpu.embed_forward(dw[0].data(), dw[1].data(), tokens.data(), 3, 33), std::invalid_argument);
    CHECK_THROWS_AS(gpu.embed_forward(dw[0].data(), dw[1].data(), tokens.data(), 0, 32), std::invalid_argument);
    auto dg = grads_on_device(cfg);
    CHECK_THROWS_AS(gpu.head_backward(dw[0].data(), dg[0].data()), std::logic_error);
    CHECK_THROWS_AS(gpu.final_backward(dw[lnf].data(), dg[lnf].data(), dg[lnf + 1].data()), std::logic_error);
    CHECK_THROWS_AS(gpu.block_backward(0, gpu_block(dw, 0), gpu_grads(dg, 0)), std::logic_error);
    CHECK_THROWS_AS(gpu.embed_backward(tokens.data(), dg[0].data(), dg[1].data()), std::logic_error);
    CHECK_THROWS_AS(gpu.block_forward(2, gpu_block(dw, 1)), std::out_of_range);
    CHECK_THROWS_AS(gpu.block_forward(-1, gpu_block(dw, 0)), std::out_of_range);
    // After a train pass the logits are gone (overwritten by their gradient).
    gpu_step(gpu, dw, dg, tokens, targets, 1.0f);
    CHECK_THROWS_AS(static_cast<void>(gpu.logits()), std::logic_error);
    // The backward's tokens are checked as the forward's.
    CHECK_THROWS_AS(gpu.embed_backward(bad.data(), dg[0].data(), dg[1].data()), std::out_of_range);

    CHECK_THROWS_AS(gpt::cuda_model(cfg, 0, stream.get()), std::invalid_argument);
    CHECK_THROWS_AS(gpt::cuda_model(gpt::model_config{.heads = 3}, 1, stream.get()), std::invalid_argument);
    const std::array<const bf16*, 11> eleven{};
    CHECK_THROWS_AS(gpt::cuda_block_params::from(eleven), std::invalid_argument);
  }

  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: the same inputs give the same bits") {
    const auto tokens = ids(7, cfg.vocab);
    const auto targets = ids(8, cfg.vocab);
    auto g1 = grads_on_device(cfg);
    auto g2 = grads_on_device(cfg);
    const double l1 = gpu_step(gpu, dw, g1, tokens, targets, 0.1f);
    const double l2_loss = gpu_step(gpu, dw, g2, tokens, targets, 0.1f);
    CHECK(std::memcmp(&l1, &l2_loss, sizeof l1) == 0);
    const tensors a = download(g1, stream.get());
    const tensors b = download(g2, stream.get());
    const auto specs = gpt::parameters(cfg);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(specs[i].name);
      CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0);
    }
  }

  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: micro-batches accumulate into the caller's buffers") {
    // Two micro-batches, the second shorter and narrower than the model (B = 2 of 3, T = 20 of 32): their
    // gradients into one set of buffers equal the sum of each into buffers of its own.
    const auto tokens_a = ids(9, cfg.vocab);
    const auto targets_a = ids(10, cfg.vocab);
    const auto tokens_b = ids(11, cfg.vocab, 2 * 20);
    const auto targets_b = ids(12, cfg.vocab, 2 * 20);

    auto ga = grads_on_device(cfg);
    gpu_step(gpu, dw, ga, tokens_a, targets_a, 0.1f);
    auto gb = grads_on_device(cfg);
    const double loss_b = gpu_step(gpu, dw, gb, tokens_b, targets_b, 0.1f, 2, 20);
    auto gab = grads_on_device(cfg);
    gpu_step(gpu, dw, gab, tokens_a, targets_a, 0.1f);
    const double loss_b_again = gpu_step(gpu, dw, gab, tokens_b, targets_b, 0.1f, 2, 20);
    CHECK(loss_b == loss_b_again);

    const tensors a = download(ga, stream.get());
    const tensors b = download(gb, stream.get());
    const tensors ab = download(gab, stream.get());
    const auto specs = gpt::parameters(cfg);
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(specs[i].name);
      CHECK(l2(b[i]) > 0.0);
      // An fp32 rounding or two of the addends apart at most, whatever order cuBLAS's beta = 1 adds in. wte sums
      // two parts per micro-batch (the head's GEMM, then the embedding's rows), which may nearly cancel: a
      // rounding of a part is then larger than one of the element, so the bound also allows a few roundings at
      // the tensor's largest addend (2^-22 of it); a misplaced or missing contribution is of the addends' size.
      double peak = 0.0;
      for (std::size_t j = 0; j < a[i].size(); ++j) {
        peak = std::max(peak, std::abs(static_cast<double>(a[i][j])) + std::abs(static_cast<double>(b[i][j])));
      }
      std::size_t off = 0;
      for (std::size_t j = 0; j < a[i].size(); ++j) {
        const double sum = static_cast<double>(a[i][j]) + b[i][j];
        if (std::abs(ab[i][j] - sum) > 1e-6 * (std::abs(a[i][j]) + std::abs(b[i][j])) + 0x1p-22 * peak) {
          ++off;
        }
      }
      CHECK(off == 0);
    }

    // And the second micro-batch alone against the CPU, at its own shape.
    gpt::cpu_model cpu(cfg, test_b);
    tensors cpu_g = zeros_like(cfg);
    const double cpu_loss = cpu_pass(cpu, w, &cpu_g, tokens_b, targets_b, 0.1f, 2, 20);
    CHECK(std::abs(loss_b - cpu_loss) <= loss_rtol * std::abs(cpu_loss));
    for (std::size_t i = 0; i < a.size(); ++i) {
      INFO(specs[i].name);
      CHECK(relative_l2(b[i], cpu_g[i]) <= grad_rtol);
    }
  }

  TEST_CASE_FIXTURE(gpu_setup,
                    "cuda_model: gradients added into bf16 are the fp32 ones added into bf16, one rounding") {
    // What zero_gpt does with an engine's bf16 gradients (math_traits<cuda_model>::adds_bf16): ln_f's and the
    // blocks' gradients go into the bf16 buffers themselves, on top of what they hold (an earlier micro-step's
    // sum), instead of into an fp32 scratch added into them afterwards (add_into). The same pass into fp32
    // buffers gives each gradient G; the bf16 ones must then hold bf16(start + G): exactly for the column sums
    // (LayerNorm's and the biases', the same fp32 sums rounded once). The weights' GEMMs write a bf16 C with beta
    // = 1, where cuBLAS may round the product to bf16 before adding C (measured on an H100: 1-5% of the elements
    // were more than one bf16 step from bf16(start + G), where start and G nearly cancel): within one step of the
    // result plus one bf16 step of G itself, the two roundings PyTorch's bf16 .grad accumulation also makes. A
    // missing or misplaced contribution is of G's own size.
    const auto tokens = ids(31, cfg.vocab);
    const auto targets = ids(32, cfg.vocab);
    auto g32 = grads_on_device(cfg);
    gpu_step(gpu, dw, g32, tokens, targets, 0.1f);
    const tensors g = download(g32, stream.get());

    tensors start = zeros_like(cfg); // bf16-representable values of about the gradients' size
    for (std::size_t i = 0; i < start.size(); ++i) {
      for (std::size_t j = 0; j < start[i].size(); ++j) {
        start[i][j] = static_cast<float>(bf16(0.01f * std::sin(static_cast<float>(7 * i + j))));
      }
    }
    auto g16 = upload(start);
    auto embedding = grads_on_device(cfg); // wte's and wpe's stay fp32
    gpu_forward(gpu, dw, tokens);
    (void)gpu.head_forward_loss(dw[0].data(), targets.data(), 0.1f, true);
    gpu.head_backward(dw[0].data(), embedding[0].data());
    const std::size_t lnf = dw.size() - 2;
    gpu.final_backward(dw[lnf].data(), g16[lnf].data(), g16[lnf + 1].data());
    for (int l = cfg.layers - 1; l >= 0; --l) {
      std::array<gpt::grad_ref, gpt::block_tensor_count> p{};
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = g16[2 + static_cast<std::size_t>(l) * p.size() + i].data();
      }
      gpu.block_backward(l, gpu_block(dw, l), gpt::cuda_block_grads::from(p));
    }
    gpu.embed_backward(tokens.data(), embedding[0].data(), embedding[1].data());
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream.get()));

    const auto specs = gpt::parameters(cfg);
    for (std::size_t i = 2; i < specs.size(); ++i) {
      INFO(specs[i].name);
      std::vector<bf16> got(g16[i].size());
      ZERO_CHECK_CUDA(cudaMemcpy(got.data(), g16[i].data(), got.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
      const bool gemm = specs[i].shape.size() == 2; // a weight matrix: cuBLAS's; else a column sum's
      std::size_t exact = 0, one_step = 0, product_rounded = 0, off = 0;
      double worst = 0; // the largest distance beyond one step of the result, in units of |G|
      for (std::size_t j = 0; j < got.size(); ++j) {
        const float want = static_cast<float>(bf16(start[i][j] + g[i][j]));
        const float have = static_cast<float>(got[j]);
        // One bf16 step at the larger of the two: 2^-7 of its power of two.
        const float step = std::ldexp(1.0f, std::ilogb(std::max(std::abs(want), std::abs(have))) - 7);
        const float beyond = std::abs(have - want) - step;
        if (have == want) {
          ++exact;
        } else if (gemm && beyond <= 0) {
          ++one_step;
        } else if (gemm && beyond <= 0x1p-7f * std::abs(g[i][j])) {
          ++product_rounded;
          worst = std::max(worst, static_cast<double>(beyond) / std::abs(g[i][j]));
        } else {
          ++off;
        }
      }
      MESSAGE(specs[i].name << ": " << exact << " exact, " << one_step << " within a step, " << product_rounded
                            << " within a step and a rounding of G (at most " << worst << " |G| beyond a step), " << off
                            << " off");
      CHECK(off == 0);
      if (!gemm) {
        CHECK(exact == got.size());
      }
    }
  }

  TEST_CASE("add_into: fp32 into bf16 rounds to nearest even, into fp32 adds") {
    // dst + src where the exact sum lies between two bf16 values: 1 + 2^-8 is halfway between 1 and 1 + 2^-7
    // (ties to even: 1), 1 + 3 * 2^-8 halfway between 1 + 2^-7 and 1 + 2^-6 (ties to even: 1 + 2^-6).
    const std::vector<float> dst = {1.0f, 1.0f, 1.0f, -2.5f, 0.0f, 3.0f};
    const std::vector<float> src = {0x1p-8f, 3 * 0x1p-8f, 0x1p-9f, 0.75f, -1e-3f, 1e30f};
    std::vector<bf16> dst16(dst.size());
    std::transform(dst.begin(), dst.end(), dst16.begin(), [](float v) { return bf16(v); });
    device_buffer<bf16> d16(zero::device_allocator{}, dst.size());
    device_buffer<float> d32(zero::device_allocator{}, dst.size());
    device_buffer<float> s(zero::device_allocator{}, src.size());
    ZERO_CHECK_CUDA(cudaMemcpy(d16.data(), dst16.data(), d16.bytes(), cudaMemcpyHostToDevice));
    ZERO_CHECK_CUDA(cudaMemcpy(d32.data(), dst.data(), d32.bytes(), cudaMemcpyHostToDevice));
    ZERO_CHECK_CUDA(cudaMemcpy(s.data(), src.data(), s.bytes(), cudaMemcpyHostToDevice));
    ZERO_CHECK_CUDA(cudaDeviceSynchronize());
    test_stream stream;
    gpt::add_into(d16.data(), zero::dtype::bf16, s.data(), src.size(), stream.get());
    gpt::add_into(d32.data(), zero::dtype::f32, s.data(), src.size(), stream.get());
    CHECK_THROWS_AS(gpt::add_into(d16.data(), zero::dtype::f16, s.data(), src.size(), stream.get()), zero::usage_error);
    ZERO_CHECK_CUDA(cudaStreamSynchronize(stream.get()));
    std::vector<bf16> got16(dst.size());
    ZERO_CHECK_CUDA(cudaMemcpy(got16.data(), d16.data(), d16.bytes(), cudaMemcpyDeviceToHost));
    const std::vector<float> got32 = download(d32);
    for (std::size_t i = 0; i < dst.size(); ++i) {
      INFO("element ", i);
      CHECK(got16[i] == bf16(dst[i] + src[i])); // the fp32 sum, rounded once to nearest even (exact sums here)
      CHECK(got32[i] == dst[i] + src[i]);
    }
    CHECK(static_cast<float>(got16[0]) == 1.0f);
    CHECK(static_cast<float>(got16[1]) == 1.0f + 0x1p-6f);
  }

  TEST_CASE("cuda_model: the fused attention matches cpu_model at every head size it takes, past a tile's end") {
    // T = 100: a full 64-row tile and a partial one (zero-filled and masked past T); head sizes 16 to 128.
    for (const auto& [heads, d_model] : {std::pair{4, 64}, std::pair{2, 64}, std::pair{2, 128}, std::pair{1, 128}}) {
      const gpt::model_config cfg{.vocab = 253, .seq = 100, .layers = 2, .heads = heads, .d_model = d_model};
      CAPTURE(heads);
      CAPTURE(d_model);
      check_against_cpu(cfg, 2, 100, gpt::attention_path::fused);
    }
    // A shorter pass than the model's sequence, within one tile; and the materialized path still matches.
    const gpt::model_config cfg{.vocab = 253, .seq = 100, .layers = 2, .heads = 2, .d_model = 128};
    check_against_cpu(cfg, 3, 37, gpt::attention_path::fused);
    check_against_cpu(cfg, 2, 100, gpt::attention_path::materialized);
    // Head sizes the fused kernels do not take go the materialized way by default, and are refused when the
    // fused path is asked for by name.
    test_stream stream;
    const gpt::model_config odd{.vocab = 253, .seq = 16, .layers = 1, .heads = 3, .d_model = 72};
    CHECK(gpt::default_attention(odd) == gpt::attention_path::materialized);
    CHECK(gpt::default_attention(cfg) == gpt::attention_path::fused);
    CHECK(thrown_message([&] {
            gpt::cuda_model(odd, 1, stream.get(), gpt::cuda_model_options{.attention = gpt::attention_path::fused});
          }).find("16, 32, 64 or 128 elements, found 24") != std::string::npos);
    check_against_cpu(odd, 2, 16, gpt::attention_path::materialized);
  }

  TEST_CASE("cuda_model: widths that are not a multiple of 8 take the one-element kernels and match cpu_model") {
    // C = 60 and 3C = 180 are not whole 16-byte packs: LayerNorm and the c_attn and c_proj bias gradients run
    // their W = 1 kernels (c_fc's 4C = 240 its W = 8 one); head size 20 goes the materialized way.
    const gpt::model_config cfg{.vocab = 253, .seq = 16, .layers = 2, .heads = 3, .d_model = 60};
    check_against_cpu(cfg, 2, 16, gpt::attention_path::materialized);
  }

  TEST_CASE("cuda_model: activation checkpointing gives the same bits, its checkpoints on the device or the host") {
    // Six blocks, so that two output slots and a ring of two hold less than six block inputs.
    const gpt::model_config cfg{.vocab = 253, .seq = 32, .layers = 6, .heads = 2, .d_model = 64};
    const tensors w = test_params(cfg);
    const auto dw = upload(w);
    const std::size_t input_bytes = std::size_t{test_b} * test_t * 64 * sizeof(bf16);
    const std::size_t each = zero::activation_footprint(input_bytes);
    zero::cuda_stream compute;
    const auto run = [&](gpt::cuda_model& m, std::vector<device_buffer<float>>& g) {
      // A full pass, an evaluation pass (its checkpoints never read back), then a shorter, narrower pass.
      double loss = gpu_step(m, dw, g, ids(31, cfg.vocab), ids(32, cfg.vocab), 0.1f);
      gpu_forward(m, dw, ids(33, cfg.vocab));
      loss += m.head_forward_loss(dw[0].data(), ids(34, cfg.vocab).data(), 0.1f, false);
      loss += gpu_step(m, dw, g, ids(35, cfg.vocab, 2 * 20), ids(36, cfg.vocab, 2 * 20), 0.1f, 2, 20);
      return loss;
    };
    gpt::cuda_model plain(cfg, test_b, compute.get());
    auto g_plain = grads_on_device(cfg);
    const double loss_plain = run(plain, g_plain);
    const tensors expect = download(g_plain, compute.get());

    // Checkpoints in a host arena of `host` inputs, fetched through a ring of `ring`, `ahead` of them ahead.
    const auto through_host = [&](std::size_t host, std::size_t ring, std::size_t ahead) {
      return gpt::cuda_model_options{.checkpoint = true,
                                     .offload = zero::activation_store_options{.host_bytes = host * each,
                                                                               .device_bytes = ring * each,
                                                                               .lookahead = ahead},
                                     .compute = &compute};
    };
    gpt::cuda_model kept(cfg, test_b, compute.get(), gpt::cuda_model_options{.checkpoint = true});
    // A ring of 2 (one fetched ahead), and of 1 (each fetched when asked for).
    gpt::cuda_model host2(cfg, test_b, compute.get(), through_host(6, 2, 1));
    gpt::cuda_model host1(cfg, test_b, compute.get(), through_host(6, 1, 0));
    CHECK(kept.checkpointing());
    CHECK_FALSE(kept.offloading());
    CHECK(host2.offloading());
    CHECK(host2.checkpoint_host_bytes() == 6 * each);
    CHECK(kept.checkpoint_host_bytes() == 0);
    // Checkpointing keeps one block's activations instead of six; the host's store keeps two block inputs and
    // the ring on the device instead of six inputs.
    MESSAGE("activation bytes: all ", plain.activation_bytes(), ", checkpointed ", kept.activation_bytes(),
            ", through the host ", host2.activation_bytes());
    CHECK(kept.activation_bytes() < plain.activation_bytes());
    CHECK(host2.activation_bytes() + 2 * input_bytes <= kept.activation_bytes());
    for (auto* m : {&kept, &host2, &host1}) {
      auto g = grads_on_device(cfg);
      const double loss = run(*m, g);
      CHECK(std::memcmp(&loss, &loss_plain, sizeof loss) == 0);
      const tensors got = download(g, compute.get());
      const auto specs = gpt::parameters(cfg);
      for (std::size_t i = 0; i < got.size(); ++i) {
        INFO(specs[i].name, m->offloading() ? " through the host" : " on the device");
        CHECK(std::memcmp(got[i].data(), expect[i].data(), got[i].size() * sizeof(float)) == 0);
      }
    }

    // A block's checkpoint is read back once per pass: a second backward of it is refused by the store.
    auto g = grads_on_device(cfg);
    gpu_step(host2, dw, g, ids(31, cfg.vocab), ids(32, cfg.vocab), 0.1f);
    CHECK(thrown_message([&] {
            host2.block_backward(0, gpu_block(dw, 0), gpu_grads(g, 0));
          }).find("checkpoint 0 was released in this pass") != std::string::npos);
    // Offload without checkpointing, or without the stream's zero::cuda_stream, is refused.
    const zero::activation_store_options some{.host_bytes = 6 * each, .device_bytes = each, .lookahead = 0};
    CHECK(thrown_message([&] {
            gpt::cuda_model(cfg, test_b, compute.get(), gpt::cuda_model_options{.offload = some, .compute = &compute});
          }).find("with checkpoint is false") != std::string::npos);
    CHECK(thrown_message([&] {
            gpt::cuda_model(cfg, test_b, compute.get(), gpt::cuda_model_options{.checkpoint = true, .offload = some});
          }).find("with compute is null") != std::string::npos);
    // A host arena too small for one forward's inputs: the forward names the bytes it needs.
    gpt::cuda_model small(cfg, test_b, compute.get(), through_host(3, 1, 0));
    CHECK(thrown_message([&] { gpu_forward(small, dw, ids(31, cfg.vocab)); }).find("expected a larger host_bytes") !=
          std::string::npos);
  }

  TEST_CASE("cuda_model: cuBLASLt's epilogues match cpu_model, and give the same bits twice") {
    // Biases, residual adds and GELU in the GEMMs: within the tolerances of the path without them.
    const gpt::model_config wide{.vocab = 253, .seq = 100, .layers = 2, .heads = 2, .d_model = 128};
    check_against_cpu(wide, 2, 100, gpt::attention_path::fused, true);
    check_against_cpu(test_config(), test_b, test_t, gpt::attention_path::fused, true);
    check_against_cpu(wide, 2, 100, gpt::attention_path::materialized, true);
    const gpt::model_config cfg = test_config();
    const auto dw = upload(test_params(cfg));
    test_stream stream;
    gpt::cuda_model m(cfg, test_b, stream.get(), gpt::cuda_model_options{.checkpoint = true, .gemm_epilogues = true});
    auto g1 = grads_on_device(cfg);
    auto g2 = grads_on_device(cfg);
    const double l1 = gpu_step(m, dw, g1, ids(51, cfg.vocab), ids(52, cfg.vocab), 0.1f);
    const double l2 = gpu_step(m, dw, g2, ids(51, cfg.vocab), ids(52, cfg.vocab), 0.1f);
    CHECK(std::memcmp(&l1, &l2, sizeof l1) == 0);
    const tensors a = download(g1, stream.get());
    const tensors b = download(g2, stream.get());
    for (std::size_t i = 0; i < a.size(); ++i) {
      CHECK(std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) == 0);
    }
  }

  TEST_CASE("cuda_model: the profile times every operation of a step, the recomputation apart") {
    const gpt::model_config cfg = test_config();
    const auto dw = upload(test_params(cfg));
    test_stream stream;
    gpt::cuda_model m(cfg, test_b, stream.get(), gpt::cuda_model_options{.checkpoint = true, .profile = true});
    auto g = grads_on_device(cfg);
    gpu_step(m, dw, g, ids(41, cfg.vocab), ids(42, cfg.vocab), 0.1f);
    const auto first = m.profile();
    m.profile_reset();
    CHECK(m.profile().empty());
    gpu_step(m, dw, g, ids(41, cfg.vocab), ids(42, cfg.vocab), 0.1f);
    const auto p = m.profile();
    const auto ms = [&](const std::string& name) {
      for (const auto& [n, t] : p) {
        if (n == name) {
          return t;
        }
      }
      return -1.0;
    };
    for (const char* name : {"embedding",
                             "layernorm",
                             "c_attn gemm",
                             "attention",
                             "attn.c_proj gemm",
                             "c_fc gemm",
                             "gelu",
                             "mlp.c_proj gemm",
                             "lm head gemm",
                             "cross-entropy",
                             "lm head dgrad",
                             "lm head wgrad",
                             "mlp.c_proj dgrad",
                             "c_fc wgrad",
                             "attention backward",
                             "gelu backward",
                             "layernorm backward",
                             "bias backward",
                             "embedding backward",
                             "attention (recompute)",
                             "c_fc gemm (recompute)",
                             "outside the model"}) {
      INFO(name);
      CHECK(ms(name) >= 0.0);
    }
    // Two blocks: the last one's activations are still there, so only the first is recomputed, up to its GELU.
    CHECK(ms("mlp.c_proj gemm (recompute)") < 0.0);
    CHECK(ms("attention") > 0.0);
    CHECK(p.size() == first.size());
    // Without the option nothing is timed.
    gpt::cuda_model quiet(cfg, test_b, stream.get());
    CHECK(quiet.profile().empty());
  }

  TEST_CASE_FIXTURE(gpu_setup, "cuda_model: attention is causal") {
    // Changing the tokens after position 2 leaves the logits of positions 0..2 with the same bits: each row's
    // products read only its own row, and the masked probabilities are exact zeros.
    const auto tokens = ids(13, cfg.vocab);
    const auto targets = ids(14, cfg.vocab);
    auto changed = tokens;
    for (int b = 0; b < test_b; ++b) {
      for (int t = 3; t < test_t; ++t) {
        auto& id = changed[static_cast<std::size_t>(b * test_t + t)];
        id = (id + 1) % cfg.vocab;
      }
    }
    gpu_forward(gpu, dw, tokens);
    gpu.head_forward_loss(dw[0].data(), targets.data(), 1.0f, false);
    const std::vector<float> first(gpu.logits().begin(), gpu.logits().end());
    gpu_forward(gpu, dw, changed);
    gpu.head_forward_loss(dw[0].data(), targets.data(), 1.0f, false);
    const std::vector<float> second(gpu.logits().begin(), gpu.logits().end());
    const auto v = static_cast<std::size_t>(cfg.vocab);
    bool later_differ = false;
    for (std::size_t b = 0; b < test_b; ++b) {
      for (std::size_t t = 0; t < test_t; ++t) {
        const std::size_t row = (b * test_t + t) * v;
        const bool same = std::memcmp(first.data() + row, second.data() + row, v * sizeof(float)) == 0;
        if (t < 3) {
          INFO("position (", b, ", ", t, ")");
          CHECK(same);
        } else {
          later_differ = later_differ || !same;
        }
      }
    }
    CHECK(later_differ);
  }
}

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  const bool gpu = status == cudaSuccess && devices > 0;
  doctest::Context context(argc, argv);
  if (!gpu) {
    (void)cudaGetLastError();
    // The host-side cases still run; the GPU's are skipped, and so is the whole test for ctest.
    context.addFilter("test-suite", "host");
    const int rc = context.run();
    if (rc != 0 || context.shouldExit()) {
      return rc;
    }
    std::printf("example.gpt.cuda: no CUDA device (%s): the GPU test cases were skipped\n",
                status == cudaSuccess ? "none visible" : cudaGetErrorString(status));
    return 77;
  }
  return context.run();
}
