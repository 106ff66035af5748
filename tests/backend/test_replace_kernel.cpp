// Replacing one kernel of cpu_backend the supported way (cpu_backend.hpp, "Replacing one kernel";
// docs/backends.md): a framework's backend derives from cpu_backend, brings the library's adamw_step
// overloads back with a using-declaration, and adds its own adamw_step for fp32 gradients and fp32
// parameters. It is a zero::backend, its kernel runs for that case only, and every other kernel and
// case is still the library's. Declaring the one overload without the using-declaration hides the
// library's others (compile_fail/hidden_adamw_step.cpp shows what check_backend then says).
#include "framework_kernels.hpp"
#include "test_values.hpp"
#include "zero/backend/cpu_backend.hpp"

#include <cstddef>
#include <doctest/doctest.h>
#include <vector>

namespace zt = zero::testing;

namespace {

// The framework's backend: its own AdamW for fp32 gradients and fp32 parameters (a loop, counting its
// calls, that hands small calls back to the library), the library's kernels for everything else.
struct framework_backend : zero::cpu_backend {
  using zero::cpu_backend::adamw_step;
  using zero::cpu_backend::cpu_backend;

  void adamw_step(float* master, float* m, float* v, const float* grad, float* param, std::size_t n,
                  const zero::adamw_step_args& args, const stream_type& s) {
    ++calls;
    if (n < 64) {
      // Small calls go back to the library, through a qualified call.
      ++handed_back;
      zero::cpu_backend::adamw_step(master, m, v, grad, param, n, args, s);
      return;
    }
    framework::adamw_step(master, m, v, grad, param, n, args);
  }

  int calls = 0;
  int handed_back = 0;
};

static_assert(zero::backend<framework_backend>);
static_assert(zero::check_backend<framework_backend>());

// The same without the using-declaration: its adamw_step hides the library's, so no bf16 or f16
// gradients, and it is not a backend.
struct hiding_backend : zero::cpu_backend {
  using zero::cpu_backend::cpu_backend;
  void adamw_step(float*, float*, float*, const float*, float*, std::size_t, const zero::adamw_step_args&,
                  const stream_type&) {}
};

static_assert(zero::backend_base<hiding_backend> && zero::can_cast<hiding_backend>);
static_assert(!zero::can_adamw_step<hiding_backend>);
static_assert(!zero::backend<hiding_backend>);

// What an engine does: calls the kernel through the concept, on whatever backend it was given.
template <zero::backend B, class G, class P>
void step(B& b, std::vector<float>& master, std::vector<float>& m, std::vector<float>& v, const std::vector<G>& grad,
          P* param, const zero::adamw_step_args& args) {
  b.adamw_step(master.data(), m.data(), v.data(), grad.data(), param, master.size(), args, b.make_stream());
}

// One AdamW step on `b` and on a plain cpu_backend from the same state; true when the bits agree.
template <class G, class P, class B> bool same_step_as_library(B& b, std::size_t n = 1000) {
  zt::rng r{42};
  std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f);
  std::vector<G> grad(n);
  for (std::size_t i = 0; i < n; ++i) {
    master[i] = r.uniform(-1.0f, 1.0f);
    grad[i] = zero::from_float<G>(r.typical());
  }
  std::vector<float> lmaster = master, lm = m, lv = v;
  std::vector<P> param(n), lparam(n);
  zero::adamw_step_args a;
  a.weight_decay = 0.01f;
  a.set_step(1);
  zero::cpu_backend library({.threads = 1});
  step(b, master, m, v, grad, param.data(), a);
  step(library, lmaster, lm, lv, grad, lparam.data(), a);
  for (std::size_t i = 0; i < n; ++i) {
    if (zt::bits_of(master[i]) != zt::bits_of(lmaster[i]) || zt::bits_of(param[i]) != zt::bits_of(lparam[i])) {
      return false;
    }
  }
  return true;
}

} // namespace

TEST_CASE("a backend that replaces one kernel of cpu_backend: its kernel for its case, the library's for the rest") {
  framework_backend b({.threads = 2});
  CHECK(b.name() == "cpu");
  CHECK(b.threads() == 2);

  // fp32 gradients and parameters: the framework's kernel, once per call (and the same bits, since it
  // follows cpu_backend's Numerics).
  CHECK(same_step_as_library<float, float>(b));
  CHECK(b.calls == 1);
  CHECK(b.handed_back == 0);
  CHECK(same_step_as_library<float, float>(b, 10));
  CHECK(b.calls == 2);
  CHECK(b.handed_back == 1);

  // Every other gradient and parameter type: the library's kernel.
  zt::for_each_type([&]<class G>() {
    zt::for_each_type([&]<class P>() {
      if constexpr (!(std::is_same_v<G, float> && std::is_same_v<P, float>)) {
        CAPTURE(zt::type_name<G>() + " grads, " + zt::type_name<P>() + " params");
        CHECK(same_step_as_library<G, P>(b));
      }
    });
  });
  CHECK(b.calls == 2);

  // The other kernels are the library's.
  const auto s = b.make_stream();
  std::vector<float> x(100, 3.0f);
  std::vector<zero::bf16> h(100);
  b.scale(x.data(), x.size(), 0.5f, s);
  b.cast(x.data(), h.data(), x.size(), s);
  CHECK(static_cast<float>(h[99]) == 1.5f);
  float norm = 0.0f;
  b.squared_norm(h.data(), h.size(), &norm, nullptr, 0, s);
  CHECK(b.read_scalar(&norm, s) == 225.0f);
  CHECK(b.calls == 2);
}
