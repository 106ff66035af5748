/// \file
/// zero::cuda's kernels against plain host references written here: fill, every cast (ties, inf/NaN,
/// subnormals, all 65536 16-bit patterns), unscale_and_check, squared_norm (against a double reference,
/// and bit-identical across runs) and adamw_step for every G x P over several steps (against the fp32
/// formula of adamw_args.hpp), at odd sizes and misaligned pointers, with guard zones around every output.

#include "cuda_test_support.hpp"
#include "zero/backend/cpu_backend.hpp"
#include "zero/backend/cuda_kernels.hpp"
#include "zero/backend/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <doctest/doctest.h>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using zero::bf16;
using zero::f16;
using zero::test::bits_of;
using zero::test::device_buffer;
using zero::test::test_sizes;
using zero::test::test_stream;

using zero::test::type_pair;

// Host reference of one conversion: widen exactly, then round to nearest even (dtype.hpp).
template <class S, class D> D host_cast(S x) { return zero::from_float<D>(zero::to_float(x)); }

// Equal bits, or both NaN when the types differ (CUDA writes its canonical NaN, dtype.hpp keeps payloads).
template <class S, class D> bool same_conversion(D device, D expected) {
  if constexpr (!std::is_same_v<S, D>) {
    if (zero::test::is_nan(expected)) {
      return zero::test::is_nan(device);
    }
  }
  return bits_of(device) == bits_of(expected);
}

template <class T> std::vector<T> cast_inputs() {
  std::vector<T> in;
  if constexpr (sizeof(T) == 2) {
    for (std::uint32_t b = 0; b < 65536; ++b) { // every 16-bit pattern
      in.push_back(zero::test::from_bits<T>(b));
    }
  } else {
    const float specials[] = {0.0f,
                              -0.0f,
                              1.0f,
                              -1.0f,
                              std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(),
                              -std::numeric_limits<float>::quiet_NaN(),
                              65504.0f,
                              65519.99f,
                              65520.0f,
                              -65520.0f,
                              1e6f, // f16 max, last below overflow, overflow
                              1.0f + 0x1p-11f,
                              1.0f + 3 * 0x1p-11f, // f16 ties: to 1, and up to 1 + 2^-9
                              1.0f + 0x1p-8f,
                              1.0f + 3 * 0x1p-8f,
                              -(1.0f + 0x1p-8f), // bf16 ties: to 1, up, negative
                              0x1p-24f,
                              0x1p-25f,
                              3 * 0x1p-25f,
                              0x1p-14f,
                              0x1.ff8p-15f, // f16 subnormals and their ties
                              std::numeric_limits<float>::denorm_min(),
                              std::numeric_limits<float>::min(),
                              -2.5e-40f,
                              1e-40f,
                              std::numeric_limits<float>::max(),
                              -std::numeric_limits<float>::max(),
                              3.3895e38f};
    in.assign(std::begin(specials), std::end(specials));
    std::mt19937 rng(12345);
    for (int i = 0; i < (1 << 20); ++i) { // random bit patterns: every exponent, NaN payloads, subnormals
      in.push_back(zero::test::from_bits<float>(rng()));
    }
  }
  return in;
}

template <class T> double squared_norm_reference(const std::vector<T>& x) {
  double sum = 0.0;
  for (const T& e : x) {
    const double d = zero::to_float(e);
    sum += d * d;
  }
  return sum;
}

// The per-element formula of zero/backend/adamw_args.hpp, literally, in fp32 (this file is compiled with
// -ffp-contract=off, so each operation rounds once as written).
void adamw_reference(float& master, float& m, float& v, float grad, const zero::adamw_step_args& a) {
  float g = grad * a.grad_scale;
  if (!a.adam_w_mode) {
    g += a.weight_decay * master;
  }
  m = a.beta1 * m + (1.0f - a.beta1) * g;
  v = a.beta2 * v + (1.0f - a.beta2) * g * g;
  if (a.adam_w_mode) {
    master *= 1.0f - a.lr * a.weight_decay;
  }
  const float denom = std::sqrt(v) / std::sqrt(a.bias_correction2) + a.eps;
  master -= (a.lr / a.bias_correction1) * m / denom;
}

// |d - r| <= tol * |r| (exactly equal also passes, so zeros compare).
bool close(float d, float r, float tol) { return d == r || std::fabs(d - r) <= tol * std::fabs(r); }

} // namespace

TEST_SUITE("kernels") {

  TEST_CASE_TEMPLATE("fill writes the value to every element and nothing else", T, float, f16, bf16) {
    test_stream stream;
    const T value = zero::from_float<T>(-3.25f);
    for (const std::size_t n : test_sizes) {
      for (const std::size_t offset : {0u, 1u}) {
        CAPTURE(n);
        CAPTURE(offset);
        device_buffer<T> buf(n, offset);
        zero::cuda::fill(buf.get(), n, value, stream.get());
        stream.sync();
        const auto host = buf.download();
        CHECK(std::all_of(host.begin(), host.end(), [&](T x) { return bits_of(x) == bits_of(value); }));
        CHECK(buf.guards_intact());
      }
    }
    SUBCASE("n == 0 touches nothing, even through a null pointer") {
      device_buffer<T> buf(0, 1);
      zero::cuda::fill(buf.get(), 0, value, stream.get());
      zero::cuda::fill(static_cast<T*>(nullptr), 0, value, stream.get());
      stream.sync();
      CHECK(buf.guards_intact());
    }
    SUBCASE("a null pointer with n > 0 is a usage error") {
      CHECK_THROWS_AS(zero::cuda::fill(static_cast<T*>(nullptr), 5, value, stream.get()), zero::usage_error);
    }
  }

  TEST_CASE_TEMPLATE("gather and scatter move the indexed elements' bits and nothing else", T, float, f16, bf16) {
    // ZenFlow's copies of the chosen elements (zero::can_index_copy): against cpu_backend's loops.
    test_stream stream;
    for (const std::size_t n : test_sizes) {
      CAPTURE(n);
      const std::size_t big = 2 * n + 3;
      const auto src = zero::test::random_values<T>(big, n + 7);
      std::vector<std::uint32_t> index(n);
      for (std::size_t i = 0; i < n; ++i) {
        index[i] = static_cast<std::uint32_t>((i * 7919 + 5) % big); // distinct: 7919 is prime to 2n + 3
      }
      device_buffer<T> d_src(big);
      device_buffer<std::uint32_t> d_index(n);
      device_buffer<T> d_got(n, 1);
      d_src.upload(src);
      d_index.upload(index);
      zero::cuda::gather(d_src.get(), d_index.get(), n, d_got.get(), stream.get());
      stream.sync();
      const auto got = d_got.download();
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < n; ++i) {
        wrong += bits_of(got[i]) == bits_of(src[index[i]]) ? 0 : 1;
      }
      CHECK(wrong == 0);
      CHECK(d_got.guards_intact());
      device_buffer<T> d_back(big, 1);
      std::vector<T> back(big, zero::from_float<T>(-1.0f));
      d_back.upload(back);
      zero::cuda::scatter(d_got.get(), d_index.get(), n, d_back.get(), stream.get());
      stream.sync();
      const auto after = d_back.download();
      zero::cpu_backend cpu({.threads = 1});
      cpu.scatter(got.data(), index.data(), n, back.data(), zero::cpu_backend::stream_type{});
      for (std::size_t j = 0; j < big; ++j) {
        wrong += bits_of(after[j]) == bits_of(back[j]) ? 0 : 1;
      }
      CHECK(wrong == 0);
      CHECK(d_back.guards_intact());
    }
    CHECK_THROWS_AS(zero::cuda::gather(static_cast<const T*>(nullptr), static_cast<const std::uint32_t*>(nullptr), 3,
                                       static_cast<T*>(nullptr), stream.get()),
                    zero::usage_error);
  }

  TEST_CASE_TEMPLATE("cast rounds to nearest even and keeps inf, NaN and subnormals", P, type_pair<float, float>,
                     type_pair<float, f16>, type_pair<float, bf16>, type_pair<f16, float>, type_pair<f16, f16>,
                     type_pair<f16, bf16>, type_pair<bf16, float>, type_pair<bf16, f16>, type_pair<bf16, bf16>) {
    using S = typename P::first;
    using D = typename P::second;
    test_stream stream;
    const std::vector<S> input = cast_inputs<S>();
    std::vector<D> expected(input.size());
    if constexpr (std::is_same_v<S, D>) {
      expected = input; // a bit copy, NaN payloads included
    } else {
      std::transform(input.begin(), input.end(), expected.begin(), host_cast<S, D>);
    }

    // (src offset, dst offset): both aligned; both off by one element (vector body, scalar head); off by one
    // relative to each other (scalar path throughout).
    for (const auto& offsets : {std::pair{0u, 0u}, std::pair{1u, 1u}, std::pair{0u, 1u}}) {
      const unsigned src_offset = offsets.first; // named, not bound: Clang 14 captures no structured binding
      const unsigned dst_offset = offsets.second;
      CAPTURE(src_offset);
      CAPTURE(dst_offset);
      device_buffer<S> src(input.size(), src_offset);
      device_buffer<D> dst(input.size(), dst_offset);
      src.upload(input);
      zero::cuda::cast(src.get(), dst.get(), input.size(), stream.get());
      stream.sync();
      const auto out = dst.download();
      std::size_t wrong = 0;
      std::size_t first_wrong = 0;
      for (std::size_t i = 0; i < out.size(); ++i) {
        if (!same_conversion<S, D>(out[i], expected[i])) {
          first_wrong = wrong++ == 0 ? i : first_wrong;
        }
      }
      CAPTURE(first_wrong);
      CHECK(wrong == 0);
      CHECK(dst.guards_intact());
      CHECK(src.guards_intact());
    }
    SUBCASE("odd sizes") {
      for (const std::size_t n : {1u, 3u, 9u}) {
        CAPTURE(n);
        const std::vector<S> part(input.begin() + 5, input.begin() + 5 + static_cast<std::ptrdiff_t>(n));
        device_buffer<S> src(n, 1);
        device_buffer<D> dst(n, 1);
        src.upload(part);
        zero::cuda::cast(src.get(), dst.get(), n, stream.get());
        stream.sync();
        const auto out = dst.download();
        for (std::size_t i = 0; i < n; ++i) {
          CHECK(same_conversion<S, D>(out[i], expected[5 + i]));
        }
        CHECK(dst.guards_intact());
      }
    }
  }

  TEST_CASE("cast ties and overflow land where IEEE says") {
    // Spelled out, independent of dtype.hpp: the host conversions are themselves under test elsewhere.
    test_stream stream;
    const std::vector<float> in = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65520.0f,          0x1p-25f,
                                   3 * 0x1p-25f,    1.0f + 0x1p-8f,      1.0f + 3 * 0x1p-8f};
    device_buffer<float> src(in.size());
    device_buffer<f16> half(in.size());
    device_buffer<bf16> brain(in.size());
    src.upload(in);
    zero::cuda::cast(src.get(), half.get(), in.size(), stream.get());
    zero::cuda::cast(src.get(), brain.get(), in.size(), stream.get());
    stream.sync();
    const auto h = half.download();
    const auto b = brain.download();
    CHECK(h[0].bits == 0x3c00); // 1 + 2^-11 ties to even: 1
    CHECK(h[1].bits == 0x3c02); // 1 + 3 * 2^-11 ties to even: 1 + 2^-9
    CHECK(h[2].bits == 0x7c00); // 65520 overflows to inf
    CHECK(h[3].bits == 0x0000); // 2^-25, half the smallest subnormal, ties to 0
    CHECK(h[4].bits == 0x0002); // 3 * 2^-25 ties to 2 * 2^-24
    CHECK(b[5].bits == 0x3f80); // 1 + 2^-8 ties to even: 1
    CHECK(b[6].bits == 0x3f82); // 1 + 3 * 2^-8 ties to even: 1 + 2^-6
  }

  TEST_CASE_TEMPLATE("unscale_and_check scales in place and flags only non-finite values", T, float, f16, bf16) {
    test_stream stream;
    device_buffer<int> flag(1);

    const auto run = [&](std::vector<T> data, float scale, std::size_t offset, int flag_before) {
      device_buffer<T> x(data.size(), offset);
      x.upload(data);
      ZERO_CHECK_CUDA(cudaMemcpy(flag.get(), &flag_before, sizeof(int), cudaMemcpyHostToDevice));
      zero::cuda::unscale_and_check(x.get(), data.size(), scale, flag.get(), stream.get());
      stream.sync();
      int found = -1;
      ZERO_CHECK_CUDA(cudaMemcpy(&found, flag.get(), sizeof(int), cudaMemcpyDeviceToHost));
      CHECK(x.guards_intact());
      return std::pair{x.download(), found};
    };

    SUBCASE("finite values: exact products, flag stays 0") {
      for (const std::size_t n : test_sizes) {
        for (const std::size_t offset : {0u, 1u}) {
          for (const float scale : {1.0f / 1024.0f, 0.3f}) {
            CAPTURE(n);
            CAPTURE(offset);
            CAPTURE(scale);
            const auto data = zero::test::random_values<T>(n, n + offset, 100.0f);
            const auto [out, found] = run(data, scale, offset, 0);
            CHECK(found == 0);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < n; ++i) {
              const T expected = zero::from_float<T>(zero::to_float(data[i]) * scale);
              wrong += bits_of(out[i]) != bits_of(expected);
            }
            CHECK(wrong == 0);
          }
        }
      }
    }
    SUBCASE("inf or NaN anywhere (head, body, tail) sets the flag") {
      const std::size_t n = 1000003;
      for (const std::size_t where : {std::size_t{0}, n / 2, n - 1}) {
        for (const float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                std::numeric_limits<float>::quiet_NaN()}) {
          CAPTURE(where);
          CAPTURE(bad);
          auto data = zero::test::random_values<T>(n, 7);
          data[where] = zero::from_float<T>(bad);
          CHECK(run(data, 0.5f, 1, 0).second == 1);
          CHECK(run(data, 0.5f, 0, 0).second == 1);
        }
      }
    }
    SUBCASE("a product that overflows T sets the flag") {
      const float big = std::is_same_v<T, f16> ? 60000.0f : 3e38f;
      auto data = zero::test::random_values<T>(1000, 3);
      data[517] = zero::from_float<T>(big);
      const auto [out, found] = run(data, 4.0f, 0, 0);
      CHECK(found == 1);
      CHECK(std::isinf(zero::to_float(out[517])));
    }
    SUBCASE("the flag is never cleared, and n == 0 does nothing") {
      CHECK(run(zero::test::random_values<T>(100, 5), 0.5f, 0, 1).second == 1);
      CHECK(run({}, 0.5f, 0, 0).second == 0);
    }
  }

  TEST_CASE_TEMPLATE("squared_norm matches a double reference and is bit-identical across runs", T, float, f16, bf16) {
    test_stream stream;
    device_buffer<float> out(2);
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{4097}, std::size_t{1000003},
                                std::size_t{20000001}}) {
      for (const std::size_t offset : {0u, 1u}) {
        CAPTURE(n);
        CAPTURE(offset);
        const auto data = zero::test::random_values<T>(n, 1000 + n + offset, 0.5f);
        device_buffer<T> x(n, offset);
        x.upload(data);
        const std::size_t ws_bytes = zero::cuda::squared_norm_workspace_bytes<T>(n);
        CHECK(ws_bytes <= 4096);
        device_buffer<unsigned char> ws(ws_bytes);
        zero::cuda::squared_norm(x.get(), n, out.get(), ws.get(), ws_bytes, stream.get());
        zero::cuda::squared_norm(x.get(), n, out.get() + 1, ws.get(), ws_bytes, stream.get());
        stream.sync();
        const auto result = out.download();
        const double reference = squared_norm_reference(data);
        CHECK(bits_of(result[0]) == bits_of(result[1]));
        if (n == 0) {
          CHECK(result[0] == 0.0f);
        } else {
          CHECK(std::fabs(result[0] - reference) <= 1e-5 * reference);
        }
        CHECK(ws.guards_intact());
        CHECK(x.guards_intact());
      }
    }
    SUBCASE("a workspace too small is a usage error") {
      const std::size_t n = 1000003;
      device_buffer<T> x(n);
      device_buffer<unsigned char> ws(4);
      CHECK(zero::cuda::squared_norm_workspace_bytes<T>(n) > 4);
      CHECK_THROWS_AS(zero::cuda::squared_norm(x.get(), n, out.get(), ws.get(), 4, stream.get()), zero::usage_error);
    }
  }

  TEST_CASE_TEMPLATE("adamw_step matches the fp32 formula of adamw_args.hpp over several steps", P,
                     type_pair<float, float>, type_pair<float, f16>, type_pair<float, bf16>, type_pair<f16, float>,
                     type_pair<f16, f16>, type_pair<f16, bf16>, type_pair<bf16, float>, type_pair<bf16, f16>,
                     type_pair<bf16, bf16>) {
    using G = typename P::first;
    using Out = typename P::second;
    test_stream stream;
    constexpr int steps = 4;
    constexpr float tolerance = 1e-6f; // the documented bound; in fact the kernel is expected to be bit-exact

    struct layout {
      std::size_t state_offset; // master, m, v and param_out
      std::size_t grad_offset;
      bool with_param;
    };
    // Aligned; all off by one element (vector body, scalar head); grad misaligned relative to the rest
    // (scalar path); no param_out.
    const layout layouts[] = {{0, 0, true}, {1, 1, true}, {0, 1, true}, {1, 1, false}};

    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000003}}) {
      for (const layout& l : layouts) {
        for (const bool adam_w_mode : {true, false}) {
          CAPTURE(n);
          CAPTURE(l.state_offset);
          CAPTURE(l.grad_offset);
          CAPTURE(l.with_param);
          CAPTURE(adam_w_mode);
          zero::adamw_step_args args;
          args.lr = 1e-2f;
          args.weight_decay = 0.01f;
          args.adam_w_mode = adam_w_mode;

          std::vector<float> master = zero::test::random_values<float>(n, 11 + n);
          std::vector<float> m(n, 0.0f);
          std::vector<float> v(n, 0.0f);
          device_buffer<float> d_master(n, l.state_offset);
          device_buffer<float> d_m(n, l.state_offset);
          device_buffer<float> d_v(n, l.state_offset);
          device_buffer<G> d_grad(n, l.grad_offset);
          device_buffer<Out> d_param(n, l.state_offset);
          d_master.upload(master);
          d_m.upload(m);
          d_v.upload(v);

          for (int step = 1; step <= steps; ++step) {
            CAPTURE(step);
            args.set_step(step);
            args.grad_scale = 1.0f / static_cast<float>(1 << step); // an unscale factor that changes per step
            const std::vector<G> grad =
                zero::test::random_values<G>(n, 100 * n + static_cast<unsigned>(step), static_cast<float>(1 << step));
            d_grad.upload(grad);
            zero::cuda::adamw_step(d_master.get(), d_m.get(), d_v.get(), d_grad.get(),
                                   l.with_param ? d_param.get() : static_cast<Out*>(nullptr), n, args, stream.get());
            for (std::size_t i = 0; i < n; ++i) {
              adamw_reference(master[i], m[i], v[i], zero::to_float(grad[i]), args);
            }
            stream.sync();
            const auto dm = d_master.download();
            const auto dmm = d_m.download();
            const auto dv = d_v.download();
            std::size_t outside = 0;
            std::size_t not_bitwise = 0;
            for (std::size_t i = 0; i < n; ++i) {
              outside += !close(dm[i], master[i], tolerance) || !close(dmm[i], m[i], tolerance) ||
                         !close(dv[i], v[i], tolerance);
              not_bitwise += bits_of(dm[i]) != bits_of(master[i]) || bits_of(dmm[i]) != bits_of(m[i]) ||
                             bits_of(dv[i]) != bits_of(v[i]);
            }
            CHECK(outside == 0);
            CHECK(not_bitwise == 0);
            if (l.with_param) {
              const auto dp = d_param.download();
              std::size_t wrong = 0;
              for (std::size_t i = 0; i < n; ++i) {
                wrong += bits_of(dp[i]) != bits_of(zero::from_float<Out>(dm[i]));
              }
              CHECK(wrong == 0);
            }
            // Go on from the device's state, so a mismatch is reported in the step it happens, not compounded.
            master = dm;
            m = dmm;
            v = dv;
          }
          CHECK(d_master.guards_intact());
          CHECK(d_m.guards_intact());
          CHECK(d_v.guards_intact());
          CHECK(d_param.guards_intact()); // also: untouched entirely when param_out is null
          if (!l.with_param) {
            const auto dp = d_param.download();
            CHECK(std::all_of(dp.begin(), dp.end(),
                              [](Out x) { return bits_of(x) == bits_of(zero::test::from_bits<Out>(0xA5A5A5A5u)); }));
          }
        }
      }
    }
    SUBCASE("a null required buffer is a usage error") {
      device_buffer<float> s(8);
      device_buffer<G> g(8);
      CHECK_THROWS_AS(zero::cuda::adamw_step(s.get(), static_cast<float*>(nullptr), s.get(), g.get(),
                                             static_cast<Out*>(nullptr), 8, zero::adamw_step_args{}, stream.get()),
                      zero::usage_error);
    }
  }

  TEST_CASE("adamw_step with Adam (L2) and without bias correction follows the same formula") {
    test_stream stream;
    const std::size_t n = 4099;
    zero::adamw_step_args args;
    args.adam_w_mode = false;
    args.weight_decay = 0.1f;
    args.lr = 3e-4f;
    args.set_step(1, /*bias_correction=*/false);
    CHECK(args.bias_correction1 == 1.0f);
    std::vector<float> master = zero::test::random_values<float>(n, 1);
    std::vector<float> m = zero::test::random_values<float>(n, 2, 0.1f);
    std::vector<float> v(n);
    std::transform(m.begin(), m.end(), v.begin(), [](float x) { return x * x; });
    const auto grad = zero::test::random_values<bf16>(n, 3);
    device_buffer<float> dm(n);
    device_buffer<float> dmm(n);
    device_buffer<float> dv(n);
    device_buffer<bf16> dg(n);
    dm.upload(master);
    dmm.upload(m);
    dv.upload(v);
    dg.upload(grad);
    zero::cuda::adamw_step(dm.get(), dmm.get(), dv.get(), dg.get(), static_cast<bf16*>(nullptr), n, args, stream.get());
    stream.sync();
    for (std::size_t i = 0; i < n; ++i) {
      adamw_reference(master[i], m[i], v[i], zero::to_float(grad[i]), args);
    }
    const auto out = dm.download();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += !close(out[i], master[i], 1e-6f);
    }
    CHECK(wrong == 0);
  }

  /// Quantizes and dequantizes n values in format f on the GPU and checks codes, scales and values against the CPU
  /// reference bit for bit (a NaN scale or value matches any NaN), with an inf, a NaN, a block of zeros and one whose
  /// qmax / amax overflows among them when there are more than 5000.
  template <class T> void check_quantize_like_cpu(test_stream & stream, zero::quant_format f, std::size_t n) {
    CAPTURE(f.bits);
    CAPTURE(f.block);
    CAPTURE(n);
    auto data = zero::test::random_values<T>(n, n * 7 + f.block, 3.0f);
    if (n > 5000) { // a block poisoned by an inf, another by a NaN, a block of zeros
      data[n / 3] = zero::from_float<T>(std::numeric_limits<float>::infinity());
      data[n / 2] = zero::from_float<T>(std::numeric_limits<float>::quiet_NaN());
      std::fill(data.begin() + static_cast<std::ptrdiff_t>(f.block * 10),
                data.begin() + static_cast<std::ptrdiff_t>(f.block * 11), zero::from_float<T>(0.0f));
      // A block whose qmax / amax overflows (amax 1e-38; fp16 holds none of it, a block of zeros there).
      for (std::size_t i = f.block * 12; i < f.block * 13 && i < n; ++i) {
        data[i] =
            zero::from_float<T>(i % 5 == 0 ? 0.0f : static_cast<float>(static_cast<int>(i % 7) - 3) * 1e-38f / 3.0f);
      }
    }
    std::vector<std::uint8_t> ref_codes(f.code_bytes(n));
    std::vector<float> ref_scales(f.blocks(n));
    std::vector<T> ref_back(n);
    for (std::size_t b = 0; b < f.blocks(n); ++b) {
      zero::quantize_block(data.data(), n, f, b, ref_codes.data(), ref_scales.data());
      zero::dequantize_block(ref_codes.data(), ref_scales.data(), n, f, b, ref_back.data());
    }
    device_buffer<T> x(n);
    x.upload(data);
    device_buffer<std::uint8_t> codes(f.code_bytes(n));
    device_buffer<float> scales(f.blocks(n));
    device_buffer<T> back(n);
    zero::cuda::quantize(x.get(), n, f, codes.get(), scales.get(), stream.get());
    zero::cuda::dequantize(codes.get(), scales.get(), n, f, back.get(), stream.get());
    stream.sync();
    CHECK(codes.download() == ref_codes);
    const auto got_scales = scales.download();
    std::size_t wrong = 0;
    for (std::size_t b = 0; b < got_scales.size(); ++b) {
      wrong +=
          std::isnan(ref_scales[b]) ? !std::isnan(got_scales[b]) : bits_of(got_scales[b]) != bits_of(ref_scales[b]);
    }
    CHECK(wrong == 0);
    const auto got = back.download();
    wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      wrong += zero::test::is_nan(ref_back[i]) ? !zero::test::is_nan(got[i]) : bits_of(got[i]) != bits_of(ref_back[i]);
    }
    CHECK(wrong == 0);
    CHECK(codes.guards_intact());
    CHECK(scales.guards_intact());
    CHECK(back.guards_intact());
  }

  // Blocks of 4096, 2048, 8192 and 64 take the packed kernel (8 elements an access) in groups of 1 to 8 warps with 1
  // to 4 packs a thread at these sizes (fewer than 8192 blocks); blocks of 3 and 6 the element-wise ones.
  TEST_CASE_TEMPLATE("quantize and dequantize give the CPU reference's codes, scales and values, bit for bit", T, float,
                     f16, bf16) {
    test_stream stream;
    for (const zero::quant_format f :
         {zero::quant_format{.bits = 8, .block = 4096}, zero::quant_format{.bits = 4, .block = 2048},
          zero::quant_format{.bits = 8, .block = 3}, zero::quant_format{.bits = 4, .block = 6},
          zero::quant_format{.bits = 8, .block = 8192}, zero::quant_format{.bits = 4, .block = 64}}) {
      for (const std::size_t n : test_sizes) {
        check_quantize_like_cpu<T>(stream, f, n);
      }
    }
  }

  // 8192 blocks and more take fewer warps a block with more packs a thread (2 warps of 8 packs for 16-bit values in
  // blocks of 4096): 8193 blocks, the last one short.
  TEST_CASE_TEMPLATE("quantize over 8192 blocks and more gives the CPU reference's codes and scales", T, float, bf16) {
    test_stream stream;
    for (const int bits : {8, 4}) {
      check_quantize_like_cpu<T>(stream, zero::quant_format{.bits = bits, .block = 4096},
                                 std::size_t{8192} * 4096 + 1000);
    }
  }

  TEST_CASE_TEMPLATE("reduce_ranks combines the inputs in rank order into every output, at any alignment", T, float,
                     bf16, double, std::int32_t, std::uint8_t) {
    using A = std::conditional_t<zero::is_half_v<T>, float, T>; // what the kernel accumulates in
    auto value = [](std::mt19937& rng) {
      if constexpr (std::is_floating_point_v<T> || zero::is_half_v<T>) {
        return zero::from_float<T>(std::normal_distribution<float>(0.0f, 4.0f)(rng));
      } else {
        return static_cast<T>(std::uniform_int_distribution<int>(0, 120)(rng)); // uint8 sums wrap, as T's do
      }
    };
    auto widen = [](T x) -> A {
      if constexpr (zero::is_half_v<T>) {
        return zero::to_float(x);
      } else {
        return x;
      }
    };
    auto narrow = [](A x) -> T {
      if constexpr (zero::is_half_v<T>) {
        return zero::from_float<T>(x);
      } else {
        return x;
      }
    };
    std::vector<zero::cuda::rank_reduce> ops{zero::cuda::rank_reduce::sum, zero::cuda::rank_reduce::max};
    if constexpr (std::is_floating_point_v<T> || zero::is_half_v<T>) {
      ops.push_back(zero::cuda::rank_reduce::avg);
    }
    test_stream stream;
    std::mt19937 rng(7);
    // Offsets of each buffer from the allocation: all aligned (packs from 0), all one element in (packs after a
    // head), and mixed (one element per access).
    const std::vector<std::vector<std::size_t>> offset_sets{{0}, {1}, {0, 1, 2}};
    for (const std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{17}, std::size_t{262147}}) {
      std::vector<std::vector<T>> host(zero::cuda::max_reduce_ranks, std::vector<T>(n));
      for (auto& h : host) {
        std::generate(h.begin(), h.end(), [&] { return value(rng); });
      }
      for (const int ins : {1, 3, 16}) {
        for (const int outs : {1, 4}) {
          for (const auto& offsets : offset_sets) {
            for (const auto op : ops) {
              CAPTURE(n);
              CAPTURE(ins);
              CAPTURE(outs);
              CAPTURE(offsets.size());
              CAPTURE(static_cast<int>(op));
              std::vector<std::unique_ptr<device_buffer<T>>> in_bufs, out_bufs;
              std::vector<const T*> in_ptrs;
              std::vector<T*> out_ptrs;
              for (int r = 0; r < ins; ++r) {
                in_bufs.push_back(
                    std::make_unique<device_buffer<T>>(n, offsets[static_cast<std::size_t>(r) % offsets.size()]));
                in_bufs.back()->upload(host[static_cast<std::size_t>(r)]);
                in_ptrs.push_back(in_bufs.back()->get());
              }
              for (int o = 0; o < outs; ++o) {
                out_bufs.push_back(
                    std::make_unique<device_buffer<T>>(n, offsets[static_cast<std::size_t>(o + 1) % offsets.size()]));
                out_ptrs.push_back(out_bufs.back()->get());
              }
              out_ptrs.back() = in_bufs.back()->get(); // the last output is the last input: in place
              zero::cuda::reduce_ranks(std::span<T* const>(out_ptrs), std::span<const T* const>(in_ptrs), n, op,
                                       stream.get());
              stream.sync();
              std::vector<T> expected(n);
              for (std::size_t i = 0; i < n; ++i) {
                A acc = widen(host[0][i]);
                for (std::size_t r = 1; r < static_cast<std::size_t>(ins); ++r) {
                  const A v = widen(host[r][i]);
                  acc = op == zero::cuda::rank_reduce::max ? std::max(acc, v) : static_cast<A>(acc + v);
                }
                if (op == zero::cuda::rank_reduce::avg) {
                  acc = static_cast<A>(acc / static_cast<A>(ins));
                }
                expected[i] = narrow(acc);
              }
              for (int o = 0; o < outs; ++o) {
                CAPTURE(o);
                const auto got =
                    o + 1 < outs ? out_bufs[static_cast<std::size_t>(o)]->download() : in_bufs.back()->download();
                CHECK(std::memcmp(got.data(), expected.data(), n * sizeof(T)) == 0);
                CHECK(out_bufs[static_cast<std::size_t>(o)]->guards_intact());
              }
            }
          }
        }
      }
    }
    SUBCASE("no input, no output or more than max_reduce_ranks is a usage error naming the counts") {
      device_buffer<T> a(4);
      const T* in[1] = {a.get()};
      T* out[1] = {a.get()};
      std::vector<const T*> many(zero::cuda::max_reduce_ranks + 1, a.get());
      CHECK_THROWS_WITH_AS(zero::cuda::reduce_ranks(std::span<T* const>(out), std::span<const T* const>(many), 4,
                                                    zero::cuda::rank_reduce::sum, stream.get()),
                           doctest::Contains("17 inputs and 1 outputs; expected 1 to 16"), zero::usage_error);
      CHECK_THROWS_AS(zero::cuda::reduce_ranks(std::span<T* const>(), std::span<const T* const>(in), 4,
                                               zero::cuda::rank_reduce::sum, stream.get()),
                      zero::usage_error);
    }
  }

} // TEST_SUITE("kernels")
