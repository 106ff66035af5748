// cpu_backend's numerics contract (cpu_backend.hpp, "Numerics"): a framework's own plain loops
// (framework_kernels.cpp, compiled as that section says) give the same bits as every SIMD level of
// cpu_backend, element for element, over several steps, for every grad x param type, both Adam modes,
// with and without weight decay and bias correction.
//
// This file, which instantiates cpu_backend's kernels, gets no floating-point flag: the kernels must
// hold their bits whatever the compiler and its -ffp-contract. CMakeLists.txt builds it twice, with
// the project's flags (in zero_backend_tests) and with FMA enabled and -ffp-contract=fast
// (zero_backend_numerics_fma_tests, x86-64), the setting under which a compiler fuses the most.
#include "framework_kernels.hpp"
#include "test_values.hpp"
#include "zero/backend/cpu_backend.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <doctest/doctest.h>
#include <string>
#include <type_traits>
#include <vector>

namespace zt = zero::testing;

namespace {

// True when this build can run here: the FMA build needs a CPU with FMA and AVX2.
bool runnable() {
#if defined(ZERO_TEST_FMA_BUILD)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("fma") || !__builtin_cpu_supports("avx2")) {
    MESSAGE("this CPU has no FMA/AVX2: the FMA build of the numerics tests has nothing to run");
    return false;
  }
#endif
  return true;
}

// "" when the arrays hold the same bits, else how many elements differ, by how much, and where first.
template <class T> std::string compare(const char* what, const T* got, const T* want, std::size_t n) {
  std::size_t count = 0;
  std::size_t first = n;
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (zt::bits_of(got[i]) != zt::bits_of(want[i])) {
      first = count++ == 0 ? i : first;
      worst = std::max(worst, std::fabs(double(zero::to_float(got[i])) - double(zero::to_float(want[i]))));
    }
  }
  if (count == 0) {
    return "";
  }
  char buf[256];
  std::snprintf(buf, sizeof buf, "%zu of %zu %s values differ (max |diff| %.3g); first [%zu]: %.9g, framework %.9g",
                count, n, what, worst, first, double(zero::to_float(got[first])), double(zero::to_float(want[first])));
  return buf;
}

struct adamw_case {
  bool adam_w_mode;
  float weight_decay;
  bool bias_correction;
};

// Runs `steps` steps of cpu_backend and of the framework's loop from the same state and compares
// master, m, v and the parameter copy after every step.
template <class G, class P>
void check_against_framework(zero::cpu_backend& b, std::size_t n, const adamw_case& c, bool write_param, int steps) {
  const std::string what = std::string(zero::name_of(b.simd())) + ", " + zt::type_name<G>() + " grads, " +
                           (write_param ? zt::type_name<P>() : std::string("no")) + " params, n " + std::to_string(n) +
                           (c.adam_w_mode ? ", AdamW" : ", Adam (L2)") + ", weight decay " +
                           std::to_string(c.weight_decay) + (c.bias_correction ? ", bias correction" : "");
  CAPTURE(what);
  zt::rng r{n * 7 + 3};
  std::vector<float> master(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    master[i] = r.uniform(-1.0f, 1.0f);
    m[i] = r.uniform(-0.01f, 0.01f);
    v[i] = r.uniform(0.0f, 1e-4f);
  }
  std::vector<float> fmaster = master, fm = m, fv = v;
  std::vector<G> grad(n);
  std::vector<P> param(n), fparam(n);
  zero::adamw_step_args a;
  a.lr = 1e-3f;
  a.weight_decay = c.weight_decay;
  a.adam_w_mode = c.adam_w_mode;
  a.grad_scale = 0.37f; // not a power of two: the unscale rounds
  const auto s = b.make_stream();
  for (int step = 1; step <= steps; ++step) {
    CAPTURE(step);
    a.set_step(step, c.bias_correction);
    for (auto& g : grad) {
      g = zero::from_float<G>(r.typical());
    }
    P* out = write_param ? param.data() : nullptr;
    P* fout = write_param ? fparam.data() : nullptr;
    b.adamw_step(master.data(), m.data(), v.data(), grad.data(), out, n, a, s);
    framework::adamw_step(fmaster.data(), fm.data(), fv.data(), grad.data(), fout, n, a);
    std::string diff = compare("master", master.data(), fmaster.data(), n);
    diff = diff.empty() ? compare("m", m.data(), fm.data(), n) : diff;
    diff = diff.empty() ? compare("v", v.data(), fv.data(), n) : diff;
    diff = diff.empty() && write_param ? compare("param", param.data(), fparam.data(), n) : diff;
    CHECK_MESSAGE(diff.empty(), diff);
    if (!diff.empty()) {
      return;
    }
  }
}

// 4099: the vector bodies and a ragged tail in one chunk; 2 chunks + 4099: the pool's threads too.
constexpr std::size_t one_chunk = 4099;
constexpr std::size_t several_chunks = 2 * zero::cpu_backend::chunk_elements + 4099;

} // namespace

TEST_CASE("adamw_step gives a framework's bits at every SIMD level: every grad x param type, both modes, "
          "weight decay and bias correction on and off, four steps") {
  if (!runnable()) {
    return;
  }
  for (auto level : zt::simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    for (const adamw_case c :
         {adamw_case{true, 0.01f, true}, adamw_case{true, 0.0f, true}, adamw_case{true, 0.01f, false},
          adamw_case{false, 0.01f, true}, adamw_case{false, 0.0f, false}}) {
      zt::for_each_type([&]<class G>() {
        zt::for_each_type([&]<class P>() { check_against_framework<G, P>(b, one_chunk, c, true, 4); });
        check_against_framework<G, float>(b, one_chunk, c, false, 4);
      });
      check_against_framework<zero::bf16, zero::bf16>(b, several_chunks, c, true, 2);
      check_against_framework<float, float>(b, several_chunks, c, true, 2);
    }
  }
}

TEST_CASE("squared_norm gives a framework's bits at every SIMD level and thread count") {
  if (!runnable()) {
    return;
  }
  for (auto level : zt::simd_levels()) {
    for (unsigned threads : {1u, 2u}) {
      zero::cpu_backend b({.threads = threads, .simd = level});
      zt::for_each_type([&]<class T>() {
        for (std::size_t n : {std::size_t{1}, std::size_t{31}, one_chunk, several_chunks}) {
          const std::string what = std::string(zero::name_of(level)) + ", " + std::to_string(threads) + " threads, " +
                                   zt::type_name<T>() + ", n " + std::to_string(n);
          CAPTURE(what);
          zt::rng r{n + 5};
          std::vector<T> x(n);
          for (auto& e : x) {
            e = zero::from_float<T>(r.typical());
          }
          std::vector<float> ws(b.squared_norm_workspace_bytes<T>(n) / sizeof(float));
          float out = 0.0f;
          b.squared_norm(x.data(), n, &out, ws.data(), ws.size() * sizeof(float), b.make_stream());
          const float want = framework::squared_norm(x.data(), n, zero::cpu_backend::chunk_elements);
          CHECK_MESSAGE(zt::bits_of(out) == zt::bits_of(want), "cpu_backend " << out << ", framework " << want);
        }
      });
    }
  }
}
