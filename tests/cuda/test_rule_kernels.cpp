/// \file
/// zero::cuda::rule_step against zero::cpu_backend::rule_step, bit for bit: Lion with weight decay; SGD with
/// momentum and dampening, with and without Nesterov, and without momentum (no state); Adagrad with lr decay and
/// weight decay; Lamb's two passes (rule_norms, then rule_step with the ratio). For G x P in (float, float), (bf16,
/// bf16), (f16, f16), (float, bf16), over three steps, at an odd length and a tiny one, aligned, off by one element and
/// with the gradient misaligned against the rest, with and without a parameter copy, with guard zones around every
/// output. The same for a framework's own rule (examples/custom_rule's Signum), which zero::cuda knows nothing of:
/// tests/cuda/signum_rule.cu instantiates it with ZERO_CUDA_RULE_STEP. Also the usage errors, and cuda_backend's verb.

#include "../../examples/custom_rule/signum.hpp"
#include "cuda_test_support.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/cuda_backend.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/update_rules.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <memory>
#include <type_traits>
#include <vector>

namespace {

using zero::bf16;
using zero::f16;
using zero::test::bits_of;
using zero::test::device_buffer;
using zero::test::test_stream;

using zero::test::type_pair;

// Where the buffers start relative to 16-byte alignment, and whether a parameter copy is written.
struct layout {
  std::size_t state_offset; // master, the state tensors and param
  std::size_t grad_offset;
  bool with_param;
};
// Aligned; all off by one element (vector body, scalar head); grad misaligned against the rest (scalar path only);
// no param.
constexpr layout layouts[] = {{0, 0, true}, {1, 1, true}, {0, 1, true}, {1, 1, false}};

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A rule's initial state: Adagrad's sum is a sum of squares (never negative, whose square root would be a NaN of
// another payload on each side); the others any value.
template <class Rule> std::vector<float> initial_state(std::size_t n, std::uint64_t seed) {
  auto s = zero::test::random_values<float>(n, seed, 0.1f);
  if constexpr (std::is_same_v<Rule, zero::rules::adagrad>) {
    std::transform(s.begin(), s.end(), s.begin(), [](float x) { return x * x; });
  }
  return s;
}

// Three steps of `Rule` with `base`'s hyper-parameters on the GPU and on the CPU from the same random inputs, for
// every layout and for n in {3, 10007}; after each step master, the state in use and param must carry the same
// bits, and nothing outside them may have been written.
template <class Rule, class G, class P>
void check_rule_like_cpu(zero::cpu_backend& cpu, const test_stream& stream, const char* what,
                         const zero::adamw_step_args& base) {
  CAPTURE(what);
  constexpr int steps = 3;
  const zero::cpu_stream cpu_stream = cpu.make_stream();
  for (const std::size_t n : {std::size_t{3}, std::size_t{10007}}) {
    for (const layout& l : layouts) {
      CAPTURE(n);
      CAPTURE(l.state_offset);
      CAPTURE(l.grad_offset);
      CAPTURE(l.with_param);
      zero::adamw_step_args args = base;
      const std::size_t count = Rule::state_count(args);

      std::vector<float> master = zero::test::random_values<float>(n, 7 + n);
      std::vector<std::vector<float>> state;
      std::vector<std::unique_ptr<device_buffer<float>>> d_state;
      std::array<float*, zero::max_rule_state> host_ptrs{};
      std::array<float*, zero::max_rule_state> device_ptrs{}; // the tensors not in use stay null
      for (std::size_t j = 0; j < count; ++j) {
        state.push_back(initial_state<Rule>(n, 31 * n + j));
        d_state.push_back(std::make_unique<device_buffer<float>>(n, l.state_offset));
        d_state.back()->upload(state.back());
      }
      for (std::size_t j = 0; j < count; ++j) {
        host_ptrs[j] = state[j].data();
        device_ptrs[j] = d_state[j]->get();
      }
      std::vector<P> param(n);
      device_buffer<float> d_master(n, l.state_offset);
      device_buffer<G> d_grad(n, l.grad_offset);
      device_buffer<P> d_param(n, l.state_offset);
      d_master.upload(master);

      for (int step = 1; step <= steps; ++step) {
        CAPTURE(step);
        args.set_step(step);
        args.grad_scale = 1.0f / static_cast<float>(1 << step); // an unscale factor that changes per step
        const std::vector<G> grad =
            zero::test::random_values<G>(n, 100 * n + static_cast<unsigned>(step), static_cast<float>(1 << step));
        d_grad.upload(grad);
        zero::cuda::rule_step<Rule>(d_master.get(), device_ptrs, d_grad.get(),
                                    l.with_param ? d_param.get() : static_cast<P*>(nullptr), n, args, stream.get());
        cpu.rule_step<Rule>(master.data(), host_ptrs, grad.data(), l.with_param ? param.data() : nullptr, n, args,
                            cpu_stream);
        stream.sync();
        REQUIRE(same_bits(d_master.download(), master));
        for (std::size_t j = 0; j < count; ++j) {
          CAPTURE(j);
          REQUIRE(same_bits(d_state[j]->download(), state[j]));
        }
        if (l.with_param) {
          REQUIRE(same_bits(d_param.download(), param));
        }
      }
      CHECK(d_master.guards_intact());
      for (const auto& d : d_state) {
        CHECK(d->guards_intact());
      }
      CHECK(d_param.guards_intact()); // also: untouched entirely without a parameter copy
      if (!l.with_param) {
        const auto dp = d_param.download();
        CHECK(std::all_of(dp.begin(), dp.end(),
                          [](P x) { return bits_of(x) == bits_of(zero::test::from_bits<P>(0xA5A5A5A5u)); }));
      }
    }
  }
}

} // namespace

TEST_SUITE("kernels") {

  TEST_CASE_TEMPLATE("rule_step gives cpu_backend's bits for Lion, SGD, Adagrad and a framework's rule", T,
                     type_pair<float, float>, type_pair<bf16, bf16>, type_pair<f16, f16>, type_pair<float, bf16>) {
    using G = typename T::first;
    using P = typename T::second;
    test_stream stream;
    zero::cpu_backend cpu({.threads = 2});

    SUBCASE("Lion with weight decay") {
      zero::adamw_step_args a;
      a.lr = 1e-2f;
      a.beta1 = 0.9f;
      a.beta2 = 0.99f;
      a.weight_decay = 0.1f;
      check_rule_like_cpu<zero::rules::lion, G, P>(cpu, stream, "lion", a);
    }
    SUBCASE("SGD with momentum and dampening, with and without Nesterov, and without momentum") {
      zero::adamw_step_args a;
      a.lr = 1e-2f;
      a.weight_decay = 0.01f;
      a.momentum = 0.9f;
      a.dampening = 0.1f;
      a.nesterov = true;
      check_rule_like_cpu<zero::rules::sgd, G, P>(cpu, stream, "sgd, nesterov", a);
      a.nesterov = false;
      check_rule_like_cpu<zero::rules::sgd, G, P>(cpu, stream, "sgd, momentum", a);
      a.momentum = 0.0f;
      a.dampening = 0.0f;
      REQUIRE(zero::rules::sgd::state_count(a) == 0);
      check_rule_like_cpu<zero::rules::sgd, G, P>(cpu, stream, "sgd, no momentum", a);
    }
    SUBCASE("Adagrad with lr decay and weight decay") {
      zero::adamw_step_args a;
      a.lr = 1e-2f;
      a.lr_decay = 0.01f;
      a.weight_decay = 0.01f;
      a.eps = 1e-10f;
      check_rule_like_cpu<zero::rules::adagrad, G, P>(cpu, stream, "adagrad", a);
    }
    SUBCASE("a framework's rule: Signum, instantiated outside zero::cuda by ZERO_CUDA_RULE_STEP") {
      zero::adamw_step_args a;
      a.lr = 1e-2f;
      a.momentum = 0.9f;
      a.weight_decay = 0.1f;
      check_rule_like_cpu<signum, G, P>(cpu, stream, "signum", a);
    }
  }

  TEST_CASE("rule_step: a null buffer in use with n > 0 is a usage error, one not in use is not") {
    test_stream stream;
    device_buffer<float> master(8);
    device_buffer<float> s(8);
    device_buffer<bf16> grad(8);
    const std::array<float*, zero::max_rule_state> none{};
    const std::array<float*, zero::max_rule_state> one{s.get(), nullptr};
    auto* no_param = static_cast<bf16*>(nullptr);
    zero::adamw_step_args args;

    CHECK_THROWS_WITH_AS(
        zero::cuda::rule_step<zero::rules::lion>(master.get(), none, grad.get(), no_param, 8, args, stream.get()),
        doctest::Contains("state[0] is null"), zero::usage_error);
    CHECK_THROWS_AS(
        zero::cuda::rule_step<zero::rules::adagrad>(master.get(), none, grad.get(), no_param, 8, args, stream.get()),
        zero::usage_error);
    CHECK_THROWS_AS(zero::cuda::rule_step<zero::rules::lion>(static_cast<float*>(nullptr), one, grad.get(), no_param, 8,
                                                             args, stream.get()),
                    zero::usage_error);
    CHECK_THROWS_AS(zero::cuda::rule_step<zero::rules::lion>(master.get(), one, static_cast<const bf16*>(nullptr),
                                                             no_param, 8, args, stream.get()),
                    zero::usage_error);
    args.momentum = 0.9f;
    CHECK_THROWS_AS(
        zero::cuda::rule_step<zero::rules::sgd>(master.get(), none, grad.get(), no_param, 8, args, stream.get()),
        zero::usage_error);

    // SGD without momentum keeps no state; n == 0 enqueues nothing and needs no buffer.
    args.momentum = 0.0f;
    CHECK_NOTHROW(
        zero::cuda::rule_step<zero::rules::sgd>(master.get(), none, grad.get(), no_param, 8, args, stream.get()));
    CHECK_NOTHROW(zero::cuda::rule_step<zero::rules::lion>(
        static_cast<float*>(nullptr), none, static_cast<const bf16*>(nullptr), no_param, 0, args, stream.get()));
    stream.sync();
    CHECK(master.guards_intact());
  }

  TEST_CASE("cuda_backend::rule_step is zero::cuda::rule_step") {
    zero::cuda_backend gpu(0);
    zero::cpu_backend cpu({.threads = 1});
    const auto s = gpu.make_stream();
    constexpr std::size_t n = 1001;
    zero::adamw_step_args args;
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    args.set_step(1);
    std::vector<float> master = zero::test::random_values<float>(n, 1);
    std::vector<float> m = zero::test::random_values<float>(n, 2, 0.1f);
    const std::vector<bf16> grad = zero::test::random_values<bf16>(n, 3);
    std::vector<bf16> param(n);
    device_buffer<float> d_master(n);
    device_buffer<float> d_m(n);
    device_buffer<bf16> d_grad(n);
    device_buffer<bf16> d_param(n);
    d_master.upload(master);
    d_m.upload(m);
    d_grad.upload(grad);
    gpu.rule_step<zero::rules::lion>(d_master.get(), {d_m.get(), nullptr}, static_cast<const bf16*>(d_grad.get()),
                                     d_param.get(), n, args, s);
    cpu.rule_step<zero::rules::lion>(master.data(), {m.data(), nullptr}, grad.data(), param.data(), n, args,
                                     cpu.make_stream());
    gpu.synchronize(s);
    CHECK(same_bits(d_master.download(), master));
    CHECK(same_bits(d_m.download(), m));
    CHECK(same_bits(d_param.download(), param));
  }

  TEST_CASE_TEMPLATE("Lamb's two passes: rule_norms gives cpu_backend's state and sums, rule_step its bits", G, float,
                     bf16, f16) {
    // The moments carry the same bits; the sums of squares (double, another order) agree within 1e-12 relative and
    // give the same fp32 ratio; then the second pass, with that ratio, the same master and copy. Three steps, at
    // one block, several and past the first pass's 1024 blocks.
    test_stream stream;
    zero::cuda_backend gpu(0);
    const auto s = gpu.make_stream();
    zero::cpu_backend cpu({.threads = 2});
    const zero::cpu_stream cpu_stream = cpu.make_stream();
    using zero::rules::lamb;
    for (const std::size_t n : {std::size_t{3}, std::size_t{10007}, std::size_t{9'000'001}}) {
      CAPTURE(n);
      zero::adamw_step_args a;
      a.lr = 1e-2f;
      a.weight_decay = 0.1f;
      a.eps = 1e-6f;
      std::vector<float> master = zero::test::random_values<float>(n, 7 + n);
      std::vector<float> m = zero::test::random_values<float>(n, 8 + n, 0.1f);
      std::vector<float> v(n);
      for (std::size_t i = 0; i < n; ++i) {
        v[i] = m[i] * m[i];
      }
      std::vector<bf16> param(n);
      device_buffer<float> d_master(n), d_m(n), d_v(n);
      device_buffer<G> d_grad(n);
      device_buffer<bf16> d_param(n);
      device_buffer<double> d_out(2);
      device_buffer<std::byte> d_ws(std::max<std::size_t>(gpu.rule_norms_workspace_bytes(n), 8));
      std::vector<std::byte> ws(cpu.rule_norms_workspace_bytes(n) + 8);
      d_master.upload(master);
      d_m.upload(m);
      d_v.upload(v);
      for (int step = 1; step <= 3; ++step) {
        CAPTURE(step);
        a.set_step(step);
        a.grad_scale = 1.0f / static_cast<float>(1 << step);
        const std::vector<G> grad = zero::test::random_values<G>(n, 100 * n + static_cast<unsigned>(step));
        d_grad.upload(grad);
        gpu.rule_norms<lamb>(d_master.get(), {d_m.get(), d_v.get()}, static_cast<const G*>(d_grad.get()), n, a,
                             d_out.get(), d_ws.get(), d_ws.size(), s);
        double sums[2] = {0, 0};
        cpu.rule_norms<lamb>(master.data(), {m.data(), v.data()}, grad.data(), n, a, sums, ws.data(), ws.size(),
                             cpu_stream);
        gpu.synchronize(s);
        REQUIRE(same_bits(d_m.download(), m));
        REQUIRE(same_bits(d_v.download(), v));
        const auto got = d_out.download();
        CHECK(got[0] == doctest::Approx(sums[0]).epsilon(1e-12));
        CHECK(got[1] == doctest::Approx(sums[1]).epsilon(1e-12));
        const float ratio = zero::rules::trust_ratio(sums[0], sums[1], 0.01f, 10.0f);
        CHECK(zero::rules::trust_ratio(got[0], got[1], 0.01f, 10.0f) == ratio);
        a.trust_ratio = ratio;
        gpu.rule_step<lamb>(d_master.get(), {d_m.get(), d_v.get()}, static_cast<const G*>(d_grad.get()), d_param.get(),
                            n, a, s);
        cpu.rule_step<lamb>(master.data(), {m.data(), v.data()}, grad.data(), param.data(), n, a, cpu_stream);
        gpu.synchronize(s);
        REQUIRE(same_bits(d_master.download(), master));
        REQUIRE(same_bits(d_param.download(), param));
        REQUIRE(same_bits(d_v.download(), v)); // the second pass only reads the state
      }
      CHECK(d_master.guards_intact());
      CHECK(d_m.guards_intact());
      CHECK(d_v.guards_intact());
      CHECK(d_out.guards_intact());
    }
    // A workspace too small is refused before anything is enqueued.
    device_buffer<float> x(100000);
    device_buffer<G> g(100000);
    device_buffer<double> out(2);
    CHECK_THROWS_WITH_AS(zero::cuda::rule_norms<lamb>(x.get(), {x.get(), x.get()}, static_cast<const G*>(g.get()),
                                                      100000, zero::adamw_step_args{}, out.get(), out.get(), 16,
                                                      stream.get()),
                         doctest::Contains("rule_norms_workspace_bytes"), zero::usage_error);
  }

} // TEST_SUITE("kernels")
