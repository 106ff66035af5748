// cpu_backend's kernels against plain scalar references, for float, f16 and bf16, sizes 0, 1, 7,
// 1000 and 1000003 (several chunks and a ragged tail), at misaligned addresses, for every SIMD level
// this CPU has (forced through cpu_backend::options::simd; ZERO_TEST_SIMD=avx2 runs one level only)
// and several thread counts. The references of the single-operation kernels are written here; those
// of adamw_step and squared_norm are a framework's loops (framework_kernels.cpp, the one file compiled
// with -ffp-contract=off, as cpu_backend.hpp's "Numerics" asks of a framework).
//
// Tolerance: none. Every kernel must match its reference bit for bit, because the references are
// the formulas of cpu_backend.hpp's "Numerics" (zero/backend/adamw_args.hpp, zero/core/dtype.hpp)
// evaluated in the same fp32 operations in the same order, and the backend promises exactly that for
// every SIMD level. The one relaxation: a NaN produced by arithmetic compares equal to any NaN (x86
// picks the payload of the first NaN operand, and operand order is the compiler's).
#include "alloc_counter.hpp"
#include "framework_kernels.hpp"
#include "test_values.hpp"
#include "zero/backend/cpu_backend.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <doctest/doctest.h>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

using zero::bf16;
using zero::f16;
using zero::testing::bits_of;
using zero::testing::for_each_type;
using zero::testing::rng;
using zero::testing::simd_levels;
using zero::testing::type_name;

namespace {

// 1000003 spans 62 chunks and a ragged tail. ThreadSanitizer makes every memory access ~10x slower,
// so under it the largest size is 100003 (7 chunks and a tail: the same code paths).
#if defined(__SANITIZE_THREAD__)
constexpr std::size_t large_size = 100003;
#else
constexpr std::size_t large_size = 1000003;
#endif
constexpr std::size_t test_sizes[] = {0, 1, 7, 1000, large_size};

std::string level_names() {
  std::string s;
  for (auto l : simd_levels()) {
    s += std::string(zero::name_of(l)) + " ";
  }
  return s;
}

template <class T> bool is_nan(T x) {
  if constexpr (std::is_same_v<T, int>) {
    return false;
  } else {
    return std::isnan(zero::to_float(x));
  }
}

// Equal bits, or both NaN (for values made by arithmetic).
template <class T> bool same_value(T a, T b) { return bits_of(a) == bits_of(b) || (is_nan(a) && is_nan(b)); }

// First index where two arrays differ (by same_value or exact bits), or n.
template <class T> std::size_t first_mismatch(const T* a, const T* b, std::size_t n, bool exact_bits) {
  for (std::size_t i = 0; i < n; ++i) {
    if (exact_bits ? bits_of(a[i]) != bits_of(b[i]) : !same_value(a[i], b[i])) {
      return i;
    }
  }
  return n;
}

template <class T> std::string show(T x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g (0x%x)", static_cast<double>(zero::to_float(x)), bits_of(x));
  return buf;
}

// Values that stress rounding and the special cases of the f16/bf16 conversions.
const std::vector<float>& special_floats() {
  static const std::vector<float> v = [] {
    std::vector<float> s = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::signaling_NaN(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            65504.0f,
                            65519.996f,
                            65520.0f,
                            -65520.0f,
                            0x1p-24f,
                            0x1p-25f,
                            0x3p-26f,
                            0x1p-14f,
                            0x1.ffcp-15f,
                            1.0f + 0x1p-11f,
                            1.0f + 0x3p-11f,
                            1.0f + 0x1p-8f,
                            1.0f + 0x3p-8f,
                            0x1.fefffep127f};
    for (std::uint32_t b : {0x7fc12345u, 0xffa00001u, 0x7f800001u, 0x7f7f8000u, 0x7f7fffffu, 0x477ff000u, 0x477fefffu,
                            0x33000000u, 0x33000001u, 0x387fe000u, 0x387ff000u}) {
      s.push_back(std::bit_cast<float>(b));
    }
    return s;
  }();
  return v;
}

// An input element i of type T: random bit patterns, special values and typical values.
template <class T> T input_value(rng& r, std::size_t i) {
  const auto& sp = special_floats();
  switch (i % 6) {
  case 0:
    if constexpr (std::is_same_v<T, float>) {
      return std::bit_cast<float>(r.u32());
    } else {
      return T::from_bits(static_cast<std::uint16_t>(r.u32()));
    }
  case 1:
    return zero::from_float<T>(sp[(i / 6) % sp.size()]);
  default:
    return zero::from_float<T>(r.typical());
  }
}

// Finite typical values only (for arithmetic kernels that should stay finite).
template <class T> T finite_value(rng& r) { return zero::from_float<T>(r.typical()); }

// A vector with room for one element in front, so data() + 1 is misaligned for SIMD loads.
template <class T> struct misaligned {
  std::vector<T> storage;
  explicit misaligned(std::size_t n) : storage(n + 1) {}
  T* data() { return storage.data() + 1; }
  T& operator[](std::size_t i) { return storage[i + 1]; }
};

// ---- references: the definitions, element by element ---------------------------------------

template <class S, class D> D ref_cast(S x) {
  if constexpr (std::is_same_v<S, D>) {
    return x;
  } else {
    return zero::from_float<D>(zero::to_float(x));
  }
}

template <class T> bool stored_nonfinite(T x) { return !std::isfinite(zero::to_float(x)); }

// The type pairs also run at the largest size (which exercises chunking and threads; the SIMD
// loops and tails are covered by every pair at the smaller sizes): the diagonal and one pair that
// widens, one that narrows and one between the half types.
template <class S, class D> constexpr bool large_pair() {
  return std::is_same_v<S, D> || (std::is_same_v<S, float> && std::is_same_v<D, bf16>) ||
         (std::is_same_v<S, f16> && std::is_same_v<D, float>) || (std::is_same_v<S, bf16> && std::is_same_v<D, f16>);
}

} // namespace

TEST_CASE("cpu_backend options: threads and SIMD level") {
  MESSAGE("SIMD levels available here: " << level_names());
  zero::cpu_backend automatic;
  CHECK(automatic.threads() == std::max(1u, std::thread::hardware_concurrency()));
  CHECK(automatic.simd() == zero::best_simd_level());
  CHECK(automatic.simd() != zero::simd_level::automatic);
  zero::cpu_backend three({.threads = 3, .simd = zero::simd_level::scalar});
  CHECK(three.threads() == 3);
  CHECK(three.simd() == zero::simd_level::scalar);
  for (auto level : {zero::simd_level::avx2, zero::simd_level::avx512}) {
    if (!zero::simd_supported(level)) {
      const std::string what = std::string(zero::name_of(level)) + "\" is not available";
      CHECK_THROWS_WITH_AS(zero::cpu_backend({.threads = 1, .simd = level}), doctest::Contains(what.c_str()),
                           zero::config_error);
    } else {
      CHECK(zero::cpu_backend({.threads = 1, .simd = level}).simd() == level);
    }
  }
}

TEST_CASE("cast: every type pair, size and SIMD level, bit for bit") {
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    const auto s = b.make_stream();
    for_each_type([&]<class S>() {
      for_each_type([&]<class D>() {
        for (std::size_t n : test_sizes) {
          if (n >= large_size && !large_pair<S, D>()) {
            continue;
          }
          CAPTURE(zero::name_of(level));
          CAPTURE(type_name<S>() + " -> " + type_name<D>());
          CAPTURE(n);
          rng r{n * 31 + 7};
          misaligned<S> src(n);
          misaligned<D> dst(n);
          std::vector<D> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            src[i] = input_value<S>(r, i);
            want[i] = ref_cast<S, D>(src[i]);
          }
          b.cast(src.data(), dst.data(), n, s);
          const std::size_t bad = first_mismatch(dst.data(), want.data(), n, true);
          if (bad != n) {
            FAIL_CHECK("element " << bad << ": input " << show(src[bad]) << " gave " << show(dst[bad]) << ", expected "
                                  << show(want[bad]));
          }
        }
      });
    });
  }
}

namespace {
/// Casts all 65536 bit patterns of `T` (f16 or bf16, named `name`) to float with `b`; the first whose bits differ
/// from dtype.hpp's conversion fails the check.
template <class T> void check_every_pattern_cast(zero::cpu_backend& b, const char* name) {
  std::vector<T> in(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    in[i] = T::from_bits(static_cast<std::uint16_t>(i));
  }
  std::vector<float> out(65536);
  b.cast(in.data(), out.data(), in.size(), b.make_stream());
  for (std::uint32_t i = 0; i < 65536; ++i) {
    if (bits_of(out[i]) != bits_of(static_cast<float>(in[i]))) {
      FAIL_CHECK(name << " " << show(in[i]) << " -> " << show(out[i]) << ", dtype.hpp gives "
                      << show(static_cast<float>(in[i])));
      break;
    }
  }
}
} // namespace

TEST_CASE("cast f16/bf16 -> float: all 65536 bit patterns match dtype.hpp") {
  for (auto level : simd_levels()) {
    CAPTURE(zero::name_of(level));
    zero::cpu_backend b({.threads = 2, .simd = level});
    check_every_pattern_cast<f16>(b, "f16");
    check_every_pattern_cast<bf16>(b, "bf16");
  }
}

namespace {
// Float bit patterns that exercise every branch of the f16/bf16 rounding: a stride over all 2^32
// patterns, windows around each boundary (zero, subnormal, normal, overflow, inf, NaN) of both
// signs, and exact ties for both formats.
std::vector<float> rounding_sweep() {
  std::vector<std::uint32_t> bits;
  for (std::uint64_t p = 0; p < (1ull << 32); p += 4093) {
    bits.push_back(static_cast<std::uint32_t>(p));
  }
  for (std::uint32_t edge : {0x00000000u, 0x00800000u, 0x33000000u, 0x33800000u, 0x387fe000u, 0x38800000u, 0x477fe000u,
                             0x477ff000u, 0x7f7f8000u, 0x7f800000u, 0x7fc00000u}) {
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      for (std::uint32_t d = 0; d < 4096; ++d) {
        bits.push_back(sign | ((edge - 2048u + d) & 0x7fffffffu));
      }
    }
  }
  rng r{99};
  for (int k = 0; k < 8192; ++k) {
    bits.push_back((r.u32() & ~0x1fffu) | 0x1000u); // f16 tie in the normal range of many exponents
    bits.push_back((r.u32() & ~0xffffu) | 0x8000u); // bf16 tie
  }
  std::vector<float> f(bits.size());
  std::memcpy(f.data(), bits.data(), bits.size() * 4);
  return f;
}

template <class D> void check_float_to_half(zero::cpu_backend& b, const std::vector<float>& in) {
  std::vector<D> out(in.size());
  b.cast(in.data(), out.data(), in.size(), b.make_stream());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const D want = zero::from_float<D>(in[i]);
    if (out[i].bits != want.bits) {
      FAIL_CHECK(type_name<D>() << ": float " << show(in[i]) << " -> " << show(out[i]) << ", dtype.hpp gives "
                                << show(want));
      return;
    }
  }
}
} // namespace

TEST_CASE("cast float -> f16/bf16 rounds exactly as dtype.hpp (boundaries, ties, a stride over all floats)") {
  const auto in = rounding_sweep();
  for (auto level : simd_levels()) {
    CAPTURE(zero::name_of(level));
    zero::cpu_backend b({.threads = 2, .simd = level});
    check_float_to_half<f16>(b, in);
    check_float_to_half<bf16>(b, in);
  }
}

TEST_CASE("cast float -> f16/bf16 over all 2^32 floats (slow; run with --no-skip)" * doctest::skip()) {
  constexpr std::size_t block = 1u << 22;
  std::vector<float> in(block);
  for (auto level : simd_levels()) {
    CAPTURE(zero::name_of(level));
    zero::cpu_backend b({.simd = level});
    for (std::uint64_t start = 0; start < (1ull << 32); start += block) {
      for (std::size_t i = 0; i < block; ++i) {
        in[i] = std::bit_cast<float>(static_cast<std::uint32_t>(start + i));
      }
      check_float_to_half<f16>(b, in);
      check_float_to_half<bf16>(b, in);
    }
  }
}

namespace {
// Inputs of the AdamW tests, made once per size and shared by every type pair and SIMD level.
struct adamw_inputs {
  std::vector<float> master, m, v;
  std::vector<std::vector<float>> grads; // one per step, before conversion to G
};

const adamw_inputs& inputs_for(std::size_t n) {
  static std::map<std::size_t, adamw_inputs> cache;
  auto [it, fresh] = cache.try_emplace(n);
  if (fresh) {
    rng r{n * 17 + 1};
    adamw_inputs& in = it->second;
    for (std::size_t i = 0; i < n; ++i) {
      in.master.push_back(r.uniform(-1.0f, 1.0f));
      in.m.push_back(r.uniform(-0.01f, 0.01f));
      in.v.push_back(r.uniform(0.0f, 1e-4f));
    }
    for (int step = 0; step < 4; ++step) {
      auto& g = in.grads.emplace_back(n);
      for (std::size_t i = 0; i < n; ++i) {
        g[i] = r.typical() * 1024.0f;
      }
      if (n > 100 && step == 1) {
        // An inf and a NaN gradient: every path must propagate them the same way.
        g[n / 3] = std::numeric_limits<float>::infinity();
        g[n / 2] = std::numeric_limits<float>::quiet_NaN();
      }
    }
  }
  return it->second;
}

template <class G, class P>
void check_adamw(zero::cpu_backend& b, std::size_t n, bool adam_w_mode, bool write_param, int steps) {
  CAPTURE(zero::name_of(b.simd()));
  CAPTURE(type_name<G>() + " grads, " + (write_param ? type_name<P>() : std::string("no")) + " params");
  CAPTURE(n);
  CAPTURE(adam_w_mode);
  const adamw_inputs& in = inputs_for(n);
  misaligned<float> master(n), m(n), v(n);
  misaligned<G> grad(n);
  misaligned<P> param(n);
  std::vector<float> rmaster = in.master, rm = in.m, rv = in.v;
  std::vector<P> rparam(n);
  std::copy(in.master.begin(), in.master.end(), master.data());
  std::copy(in.m.begin(), in.m.end(), m.data());
  std::copy(in.v.begin(), in.v.end(), v.data());
  zero::adamw_step_args a;
  a.lr = 1e-3f;
  a.weight_decay = 0.01f;
  a.adam_w_mode = adam_w_mode;
  a.grad_scale = 1.0f / 1024.0f;
  const auto s = b.make_stream();
  for (int step = 1; step <= steps; ++step) {
    a.set_step(step);
    const auto& g = in.grads[static_cast<std::size_t>(step - 1)];
    for (std::size_t i = 0; i < n; ++i) {
      grad[i] = zero::from_float<G>(g[i]);
    }
    b.adamw_step(master.data(), m.data(), v.data(), grad.data(), write_param ? param.data() : static_cast<P*>(nullptr),
                 n, a, s);
    framework::adamw_step(rmaster.data(), rm.data(), rv.data(), grad.data(),
                          write_param ? rparam.data() : static_cast<P*>(nullptr), n, a);
    for (auto [got, want, what] :
         {std::tuple{master.data(), rmaster.data(), std::string("master")},
          std::tuple{m.data(), rm.data(), std::string("m")}, std::tuple{v.data(), rv.data(), std::string("v")}}) {
      const std::size_t bad = first_mismatch(got, want, n, false);
      if (bad != n) {
        FAIL_CHECK("step " << step << ", " << what << "[" << bad << "] = " << show(got[bad]) << ", reference "
                           << show(want[bad]));
        return;
      }
    }
    if (write_param) {
      const std::size_t bad = first_mismatch(param.data(), rparam.data(), n, false);
      if (bad != n) {
        FAIL_CHECK("step " << step << ", param[" << bad << "] = " << show(param[bad]) << ", reference "
                           << show(rparam[bad]));
        return;
      }
    }
  }
}
} // namespace

TEST_CASE("adamw_step: every grad x param type, size and SIMD level, several steps, bit for bit") {
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    for (std::size_t n : test_sizes) {
      const int steps = n >= large_size ? 2 : 4;
      for_each_type([&]<class G>() {
        for_each_type([&]<class P>() {
          if (n < large_size || large_pair<G, P>()) {
            check_adamw<G, P>(b, n, true, true, steps);
          }
        });
        if (n < large_size || std::is_same_v<G, bf16>) {
          check_adamw<G, float>(b, n, true, false, steps);
        }
      });
    }
  }
}

TEST_CASE("adamw_step: Adam (L2) mode, bit for bit") {
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    for (std::size_t n : test_sizes) {
      const int steps = n >= large_size ? 2 : 4;
      check_adamw<bf16, bf16>(b, n, false, true, steps);
      if (n < large_size) {
        check_adamw<f16, f16>(b, n, false, true, steps);
        check_adamw<float, float>(b, n, false, false, steps);
      }
    }
  }
}

namespace {
/// fp32 master, m, v and bf16 gradients of n elements in a fixed pattern of ordinary values.
struct patterned_state {
  std::vector<float> master, m, v;
  std::vector<bf16> grad;
  explicit patterned_state(std::size_t n) : master(n), m(n), v(n), grad(n) {
    for (std::size_t i = 0; i < n; ++i) {
      master[i] = 0.5f - static_cast<float>(i % 97) / 97.0f;
      m[i] = static_cast<float>(i % 13) * 1e-3f;
      v[i] = static_cast<float>(i % 7) * 1e-5f;
      grad[i] = zero::from_float<bf16>(static_cast<float>(i % 31) / 31.0f - 0.5f);
    }
  }
};
} // namespace

TEST_CASE("adamw_step_from: the bits of adamw_step on a copy, the input unchanged, at every SIMD level, size and "
          "alignment of the output") {
  // Offsets of the output's master, m and v in floats: alike (the non-temporal path, after a peel to
  // the alignment) and apart (plain stores).
  struct offsets {
    std::size_t master, m, v;
  };
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    const auto s = b.make_stream();
    for (std::size_t n : {std::size_t{1}, std::size_t{15}, std::size_t{100}, std::size_t{40'000}}) {
      for (offsets o : {offsets{0, 0, 0}, offsets{3, 3, 3}, offsets{1, 2, 3}}) {
        CAPTURE(n);
        CAPTURE(o.master);
        CAPTURE(o.m);
        patterned_state st(n);
        auto &master = st.master, &m = st.m, &v = st.v;
        const auto& grad = st.grad;
        const auto before = std::tuple{master, m, v};
        std::vector<float> out_master(n + 16), out_m(n + 16), out_v(n + 16);
        std::vector<bf16> param(n), want_param(n);
        zero::adamw_step_args a;
        a.lr = 1e-3f;
        a.weight_decay = 0.01f;
        a.set_step(3);
        b.adamw_step_from(master.data(), m.data(), v.data(), out_master.data() + o.master, out_m.data() + o.m,
                          out_v.data() + o.v, grad.data(), param.data(), n, a, s);
        CHECK((std::tuple{master, m, v} == before));
        b.adamw_step(master.data(), m.data(), v.data(), grad.data(), want_param.data(), n, a, s);
        CHECK(std::equal(master.begin(), master.end(), out_master.begin() + static_cast<std::ptrdiff_t>(o.master)));
        CHECK(std::equal(m.begin(), m.end(), out_m.begin() + static_cast<std::ptrdiff_t>(o.m)));
        CHECK(std::equal(v.begin(), v.end(), out_v.begin() + static_cast<std::ptrdiff_t>(o.v)));
        CHECK(first_mismatch(param.data(), want_param.data(), n, false) == n);
      }
    }
  }
}

TEST_CASE("adamw_step and adamw_step_from: streaming stores change no bit, at every alignment of the parameter "
          "copy and of the state out of place") {
  // The parameter copy streams after a peel to a register's width (16 offsets cover every phase),
  // alone in place, and out of place only where its peel is the state's.
  for (auto level : simd_levels()) {
    zero::cpu_backend plain({.threads = 2, .simd = level, .streaming_stores = false});
    zero::cpu_backend streaming({.threads = 2, .simd = level});
    REQUIRE(streaming.streaming_stores());
    REQUIRE_FALSE(plain.streaming_stores());
    const auto s = plain.make_stream();
    for (std::size_t n : {std::size_t{7}, std::size_t{100}, std::size_t{40'000}}) {
      for (std::size_t po = 0; po < 16; ++po) {
        for (std::size_t so : {std::size_t{0}, std::size_t{5}}) {
          CAPTURE(zero::name_of(level));
          CAPTURE(n);
          CAPTURE(po);
          CAPTURE(so);
          const patterned_state st(n);
          const auto &master = st.master, &m = st.m, &v = st.v;
          const auto& grad = st.grad;
          zero::adamw_step_args a;
          a.lr = 1e-3f;
          a.weight_decay = 0.01f;
          a.set_step(2);
          // In place, each backend on its own copy.
          auto run_in_place = [&](zero::cpu_backend& b, std::vector<bf16>& param) {
            std::vector<float> ma = master, mm = m, mv = v;
            b.adamw_step(ma.data(), mm.data(), mv.data(), grad.data(), param.data() + po, n, a, s);
            return std::tuple{ma, mm, mv};
          };
          std::vector<bf16> p_plain(n + 16), p_stream(n + 16);
          CHECK(run_in_place(plain, p_plain) == run_in_place(streaming, p_stream));
          CHECK(first_mismatch(p_plain.data() + po, p_stream.data() + po, n, false) == n);
          // Out of place, the state at offset `so` (streamed when alike).
          auto run_from = [&](zero::cpu_backend& b, std::vector<bf16>& param) {
            std::vector<float> om(n + 16), omm(n + 16), omv(n + 16);
            b.adamw_step_from(master.data(), m.data(), v.data(), om.data() + so, omm.data() + so, omv.data() + so,
                              grad.data(), param.data() + po, n, a, s);
            return std::tuple{om, omm, omv};
          };
          CHECK(run_from(plain, p_plain) == run_from(streaming, p_stream));
          CHECK(first_mismatch(p_plain.data() + po, p_stream.data() + po, n, false) == n);
        }
      }
    }
  }
}

TEST_CASE("adamw_step: known values, and Adam differs from AdamW only through weight decay") {
  zero::cpu_backend b({.threads = 1});
  const auto s = b.make_stream();
  zero::adamw_step_args a;
  a.lr = 1e-3f;
  a.set_step(1);
  // Step 1 from zero moments: m = 0.1 g, v = 0.001 g^2, so m_hat / sqrt(v_hat) = g / |g| and the
  // update is lr * g / (|g| + eps): master 1 -> 1 - 1e-3 * 0.5 / (0.5 + 1e-8) ~= 0.999.
  float master = 1.0f, m = 0.0f, v = 0.0f;
  const float g = 0.5f;
  b.adamw_step(&master, &m, &v, &g, static_cast<float*>(nullptr), 1, a, s);
  CHECK(m == doctest::Approx(0.05f).epsilon(1e-7));
  CHECK(v == doctest::Approx(0.00025f).epsilon(1e-6));
  CHECK(master == doctest::Approx(0.999f).epsilon(1e-6));

  // Weight decay 0.1: AdamW shrinks the master by (1 - lr * wd) before the update; Adam adds
  // wd * master to the gradient (g = 0.5 + 0.1 = 0.6), which at step 1 still moves by ~lr.
  a.weight_decay = 0.1f;
  float pw = 1.0f, mw = 0.0f, vw = 0.0f;
  float pa = 1.0f, ma = 0.0f, va = 0.0f;
  a.adam_w_mode = true;
  b.adamw_step(&pw, &mw, &vw, &g, static_cast<float*>(nullptr), 1, a, s);
  a.adam_w_mode = false;
  b.adamw_step(&pa, &ma, &va, &g, static_cast<float*>(nullptr), 1, a, s);
  CHECK(pw == doctest::Approx(1.0f * (1.0f - 1e-4f) - 1e-3f).epsilon(1e-6));
  CHECK(mw == doctest::Approx(0.05f).epsilon(1e-7));
  CHECK(ma == doctest::Approx(0.06f).epsilon(1e-7));
  CHECK(pa == doctest::Approx(0.999f).epsilon(1e-6));
  CHECK(pa != pw);

  // Without weight decay the two modes are the same computation.
  a.weight_decay = 0.0f;
  float p1 = 0.25f, m1 = 0.01f, v1 = 0.001f, p2 = 0.25f, m2 = 0.01f, v2 = 0.001f;
  a.adam_w_mode = true;
  b.adamw_step(&p1, &m1, &v1, &g, static_cast<float*>(nullptr), 1, a, s);
  a.adam_w_mode = false;
  b.adamw_step(&p2, &m2, &v2, &g, static_cast<float*>(nullptr), 1, a, s);
  CHECK(bits_of(p1) == bits_of(p2));
}

TEST_CASE("unscale_and_check: scaling, inf and NaN detection, flag accumulation") {
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    const auto s = b.make_stream();
    for_each_type([&]<class T>() {
      for (std::size_t n : test_sizes) {
        CAPTURE(zero::name_of(level));
        CAPTURE(type_name<T>());
        CAPTURE(n);
        rng r{n + 3};
        misaligned<T> x(n);
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          x[i] = finite_value<T>(r);
          want[i] = zero::from_float<T>(zero::to_float(x[i]) * 0.125f);
        }
        int flag = 0;
        b.unscale_and_check(x.data(), n, 0.125f, &flag, s);
        CHECK(b.read_scalar(&flag, s) == 0);
        CHECK(first_mismatch(x.data(), want.data(), n, true) == n);
        if (n == 0) {
          continue;
        }
        // One bad element at the front, in the middle or at the very end (the scalar tail).
        for (std::size_t where : {std::size_t{0}, n / 2, n - 1}) {
          for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()}) {
            const T saved = x[where];
            x[where] = zero::from_float<T>(bad);
            flag = 0;
            b.unscale_and_check(x.data(), n, 1.0f, &flag, s);
            CHECK_MESSAGE(b.read_scalar(&flag, s) == 1, "bad value " << bad << " at " << where);
            x[where] = saved;
          }
        }
        // A flag already set stays set through a clean call.
        for (std::size_t i = 0; i < n; ++i) {
          x[i] = finite_value<T>(r);
        }
        flag = 1;
        b.unscale_and_check(x.data(), n, 1.0f, &flag, s);
        CHECK(flag == 1);
      }
    });
    // Scaling up past the type's range makes an inf: reported too.
    f16 big[9];
    std::fill(std::begin(big), std::end(big), f16(40000.0f));
    int flag = 0;
    b.unscale_and_check(big, 9, 2.0f, &flag, s);
    CHECK(flag == 1);
    CHECK(big[0].bits == 0x7c00u);
    CHECK(big[8].bits == 0x7c00u);
  }
}

TEST_CASE("squared_norm: documented order, bit for bit, for every SIMD level and thread count") {
  for (auto level : simd_levels()) {
    for (unsigned threads : {1u, 2u, 3u}) {
      zero::cpu_backend b({.threads = threads, .simd = level});
      const auto s = b.make_stream();
      for_each_type([&]<class T>() {
        for (std::size_t n : test_sizes) {
          CAPTURE(zero::name_of(level));
          CAPTURE(threads);
          CAPTURE(type_name<T>());
          CAPTURE(n);
          rng r{n + 11};
          misaligned<T> x(n);
          double exact = 0.0;
          for (std::size_t i = 0; i < n; ++i) {
            x[i] = finite_value<T>(r);
            const double d = zero::to_float(x[i]);
            exact += d * d;
          }
          std::vector<float> ws(b.squared_norm_workspace_bytes<T>(n) / sizeof(float));
          float out = -1.0f;
          b.squared_norm(x.data(), n, &out, ws.data(), ws.size() * sizeof(float), s);
          const float want = framework::squared_norm(x.data(), n, zero::cpu_backend::chunk_elements);
          CHECK(bits_of(b.read_scalar(&out, s)) == bits_of(want));
          // Any order would be close to the exact sum; this one is within a few ulps of fp32 sums.
          CHECK(static_cast<double>(out) == doctest::Approx(exact).epsilon(1e-5));
        }
      });
    }
  }
}

TEST_CASE("squared_norm: inf and NaN propagate; a too-small workspace is refused") {
  zero::cpu_backend b({.threads = 2});
  const auto s = b.make_stream();
  const std::size_t n = 3 * zero::cpu_backend::chunk_elements + 5;
  std::vector<bf16> x(n, bf16(1.0f));
  std::vector<float> ws(b.squared_norm_workspace_bytes<bf16>(n) / sizeof(float));
  CHECK(ws.size() == 4);
  float out = 0.0f;
  b.squared_norm(x.data(), n, &out, ws.data(), ws.size() * sizeof(float), s);
  CHECK(out == static_cast<float>(n));
  x[n - 1] = bf16(std::numeric_limits<float>::infinity());
  b.squared_norm(x.data(), n, &out, ws.data(), ws.size() * sizeof(float), s);
  CHECK(std::isinf(out));
  x[1] = bf16(std::numeric_limits<float>::quiet_NaN());
  b.squared_norm(x.data(), n, &out, ws.data(), ws.size() * sizeof(float), s);
  CHECK(std::isnan(out));
  CHECK_THROWS_WITH_AS(b.squared_norm(x.data(), n, &out, ws.data(), 8, s), doctest::Contains("needs 16 bytes"),
                       zero::usage_error);
  CHECK_THROWS_AS(b.squared_norm(x.data(), n, &out, nullptr, 0, s), zero::usage_error);
  // Up to one chunk no workspace is needed.
  CHECK(b.squared_norm_workspace_bytes<float>(zero::cpu_backend::chunk_elements) == 0);
  b.squared_norm(x.data() + 2, 100, &out, nullptr, 0, s);
  CHECK(out == 100.0f);
}

TEST_CASE("fill, accumulate and scale: every type, size and SIMD level") {
  for (auto level : simd_levels()) {
    zero::cpu_backend b({.threads = 2, .simd = level});
    const auto s = b.make_stream();
    for (std::size_t n : test_sizes) {
      CAPTURE(zero::name_of(level));
      CAPTURE(n);
      for_each_type([&]<class T>() {
        CAPTURE(type_name<T>());
        misaligned<T> x(n);
        const T value = zero::from_float<T>(-1.5f);
        b.fill(x.data(), n, value, s);
        CHECK(std::all_of(x.data(), x.data() + n, [&](T e) { return bits_of(e) == bits_of(value); }));

        rng r{n * 5 + 1};
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          x[i] = input_value<T>(r, i);
          want[i] = zero::from_float<T>(zero::to_float(x[i]) * 0.3f);
        }
        b.scale(x.data(), n, 0.3f, s);
        CHECK(first_mismatch(x.data(), want.data(), n, false) == n);

        for_each_type([&]<class D>() {
          if (n >= large_size && !large_pair<T, D>()) {
            return;
          }
          CAPTURE(type_name<D>());
          misaligned<D> dst(n);
          std::vector<D> sum(n);
          for (std::size_t i = 0; i < n; ++i) {
            dst[i] = input_value<D>(r, i + 1);
            sum[i] = zero::from_float<D>(zero::to_float(dst[i]) + zero::to_float(x[i]));
          }
          b.accumulate(x.data(), dst.data(), n, s);
          CHECK(first_mismatch(dst.data(), sum.data(), n, false) == n);
        });
      });
    }
    misaligned<int> flags(1000);
    b.fill(flags.data(), 1000, 7, s);
    CHECK(std::all_of(flags.data(), flags.data() + 1000, [](int e) { return e == 7; }));
  }
}

TEST_CASE("gradient accumulation over micro-steps in bf16 and into an fp32 accumulator") {
  zero::cpu_backend b({.threads = 2});
  const auto s = b.make_stream();
  const std::size_t n = 40000;
  // Exactly representable inputs (small integers times 2^-4): the fp32 sum is exact, and the bf16
  // running sum is exact while it stays within 8 significant bits.
  std::vector<bf16> micro(n), acc_bf16(n);
  std::vector<float> acc_f32(n);
  b.fill(acc_bf16.data(), n, bf16(0.0f), s);
  b.fill(acc_f32.data(), n, 0.0f, s);
  for (int k = 0; k < 4; ++k) {
    for (std::size_t i = 0; i < n; ++i) {
      micro[i] = bf16(static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(k)) % 9) - 4) * 0.0625f);
    }
    b.accumulate(micro.data(), acc_bf16.data(), n, s);
    b.accumulate(micro.data(), acc_f32.data(), n, s);
  }
  b.scale(acc_f32.data(), n, 0.25f, s); // average over the 4 micro-steps
  for (std::size_t i = 0; i < n; i += 997) {
    float sum = 0.0f;
    for (int k = 0; k < 4; ++k) {
      sum += static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(k)) % 9) - 4) * 0.0625f;
    }
    CHECK(static_cast<float>(acc_bf16[i]) == sum);
    CHECK(acc_f32[i] == sum * 0.25f);
  }
}

TEST_CASE("null buffers with n > 0 are refused, n == 0 is a no-op") {
  zero::cpu_backend b({.threads = 1});
  const auto s = b.make_stream();
  zero::adamw_step_args a;
  float x = 0.0f;
  CHECK_THROWS_WITH_AS(b.adamw_step(&x, &x, static_cast<float*>(nullptr), &x, static_cast<bf16*>(nullptr), 1, a, s),
                       "[zero.usage_error] cpu_backend::adamw_step: v is null", zero::usage_error);
  float y = 0.0f;
  CHECK_THROWS_WITH_AS(b.adamw_step_from(&x, &x, &x, &y, &y, &y, static_cast<const float*>(nullptr),
                                         static_cast<bf16*>(nullptr), 1, a, s),
                       "[zero.usage_error] cpu_backend::adamw_step_from: grad is null", zero::usage_error);
  CHECK_THROWS_AS(b.cast(static_cast<const float*>(nullptr), &x, 1, s), zero::usage_error);
  CHECK_THROWS_AS(b.scale(static_cast<f16*>(nullptr), 1, 1.0f, s), zero::usage_error);
  CHECK_THROWS_AS(b.unscale_and_check(&x, 1, 1.0f, nullptr, s), zero::usage_error);
  b.adamw_step(static_cast<float*>(nullptr), nullptr, nullptr, static_cast<const bf16*>(nullptr),
               static_cast<bf16*>(nullptr), 0, a, s);
  b.cast(static_cast<const float*>(nullptr), static_cast<bf16*>(nullptr), 0, s);
  b.accumulate(static_cast<const float*>(nullptr), static_cast<float*>(nullptr), 0, s);
  b.fill(static_cast<int*>(nullptr), 0, 0, s);
}

TEST_CASE("kernels allocate nothing after construction") {
  zero::cpu_backend b({.threads = 2});
  const auto s = b.make_stream();
  const std::size_t n = 300000;
  std::vector<float> master(n, 0.5f), m(n, 0.0f), v(n, 0.0f), f32(n, 1.0f);
  std::vector<bf16> grad(n, bf16(0.25f)), param(n);
  std::vector<float> ws(b.squared_norm_workspace_bytes<bf16>(n) / sizeof(float));
  zero::adamw_step_args a;
  a.set_step(1);
  int flag = 0;
  float norm = 0.0f;
  const std::size_t before = zero::testing::allocations();
  for (int i = 0; i < 3; ++i) {
    b.fill(&flag, 1, 0, s);
    b.unscale_and_check(grad.data(), n, 1.0f, &flag, s);
    b.squared_norm(grad.data(), n, &norm, ws.data(), ws.size() * sizeof(float), s);
    b.adamw_step(master.data(), m.data(), v.data(), grad.data(), param.data(), n, a, s);
    b.cast(master.data(), param.data(), n, s);
    b.accumulate(grad.data(), f32.data(), n, s);
    b.scale(f32.data(), n, 0.5f, s);
  }
  const std::size_t after = zero::testing::allocations();
  CHECK(after == before);
  CHECK(flag == 0);
}

TEST_CASE("one backend used from two threads at once gives each caller its own exact result") {
  zero::cpu_backend b({.threads = 2});
  const std::size_t n = 100000;
  auto run = [&](std::uint64_t seed, bool& ok) {
    rng r{seed};
    std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f), rmaster, rm(n, 0.0f), rv(n, 0.0f);
    std::vector<bf16> grad(n), param(n), rparam(n);
    for (std::size_t i = 0; i < n; ++i) {
      master[i] = r.uniform(-1.0f, 1.0f);
      grad[i] = bf16(r.typical());
    }
    rmaster = master;
    zero::adamw_step_args a;
    for (int step = 1; step <= 3; ++step) {
      a.set_step(step);
      b.adamw_step(master.data(), m.data(), v.data(), grad.data(), param.data(), n, a, b.make_stream());
      framework::adamw_step(rmaster.data(), rm.data(), rv.data(), grad.data(), rparam.data(), n, a);
    }
    ok = first_mismatch(master.data(), rmaster.data(), n, true) == n &&
         first_mismatch(param.data(), rparam.data(), n, true) == n;
  };
  bool ok1 = false, ok2 = false;
  std::thread t1(run, 1, std::ref(ok1));
  std::thread t2(run, 2, std::ref(ok2));
  t1.join();
  t2.join();
  CHECK(ok1);
  CHECK(ok2);
}

TEST_CASE("basic_cpu_backend over another host allocator, and move") {
  zero::basic_cpu_backend<zero::host_allocator> b({.threads = 2, .simd = zero::simd_level::scalar});
  zero::basic_cpu_backend<zero::host_allocator> moved = std::move(b);
  CHECK(moved.threads() == 2);
  std::vector<float> x(50000, 2.0f);
  moved.scale(x.data(), x.size(), 0.5f, moved.make_stream());
  CHECK(x.front() == 1.0f);
  CHECK(x.back() == 1.0f);
}
