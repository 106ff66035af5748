#pragma once
/// \file
/// ZeRO++'s block quantization on the device (zero/backend/quantize.hpp gives the format and the CPU
/// reference these match code for code): `quantize_kernel`, one thread block per quantization block
/// (its amax by a max-reduction, exact in any order, then one division and one product per element
/// with round-half-to-even), and `dequantize_kernel`, elementwise; for blocks of a multiple of 8 and
/// aligned buffers, their `_packed` forms move 8 elements per access and keep a block in registers.
/// `zero::cuda::quantize` and `dequantize` (cuda_kernels.hpp) are these, instantiated for float, __half and
/// __nv_bfloat16.

#include "elementwise.cuh"
#include "zero/backend/quantize.hpp"

namespace zero::cuda::kernels {

/// max(a, b), NaN when either is (fmaxf returns the other operand): one instruction from sm_80 on.
__device__ __forceinline__ float max_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
#endif
}

/// The code of `v` for the factor `inv` (qmax / amax), clamped to [-qmax, qmax]; 0 for a poisoned block. When
/// qmax / amax overflowed (amax below qmax / FLT_MAX), v / amax * qmax instead, as the CPU reference does.
__device__ __forceinline__ int quant_code(float v, float inv, float amax, float qmax, bool finite) {
  const float scaled = inv <= 3.4028234663852886e38F ? __fmul_rn(v, inv) : __fmul_rn(__fdiv_rn(v, amax), qmax);
  return finite ? static_cast<int>(fminf(fmaxf(rintf(scaled), -qmax), qmax)) : 0;
}

/// The warp's amax and whether all of it is finite, from each lane's, by shuffles (a max and an and: exact
/// in any order). Every lane gets both.
__device__ __forceinline__ void warp_amax(float& amax, int& finite) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffU, amax, o));
    finite &= __shfl_xor_sync(0xffffffffU, finite, o);
  }
}

/// The block's amax and whether all of it is finite, from each thread's: warp shuffles, then the warps'
/// through shared memory (a max and an and: exact in any order). Every thread gets both.
__device__ __forceinline__ void block_amax(float& amax, int& finite) {
  __shared__ float warp_max[block_threads / 32];
  __shared__ int warp_finite[block_threads / 32];
  warp_amax(amax, finite);
  if (threadIdx.x % 32 == 0) {
    warp_max[threadIdx.x / 32] = amax;
    warp_finite[threadIdx.x / 32] = finite;
  }
  __syncthreads();
  amax = warp_max[0];
  finite = warp_finite[0];
  for (int w = 1; w < block_threads / 32; ++w) {
    amax = fmaxf(amax, warp_max[w]);
    finite &= warp_finite[w];
  }
  __syncthreads(); // the shared words are read by all before the next block's writes
}

/// Writes the block's scale (from the thread that is `writer`) and returns the factor of its codes, qmax / amax (0 for
/// a block of zeros or one poisoned by an inf or NaN, whose scale is NaN).
__device__ __forceinline__ float block_scale(float amax, float qmax, bool finite, float* scale, bool writer) {
  if (writer) {
    *scale = finite ? __fdiv_rn(amax, qmax) : __int_as_float(0x7fc00000);
  }
  return finite && amax > 0.0F ? __fdiv_rn(qmax, amax) : 0.0F;
}

/// The signed code of element `i`.
__device__ __forceinline__ int code_at(const ::cuda::std::uint8_t* codes, ::cuda::std::size_t i, int bits) {
  if (bits == 8) {
    return static_cast<::cuda::std::int8_t>(codes[i]);
  }
  const unsigned nibble = (i % 2 == 0 ? codes[i / 2] : codes[i / 2] >> 4U) & 0x0FU;
  return nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble);
}

/// Block `blockIdx.x` (and every `gridDim.x`-th after it) of `x`'s n elements: its scale and codes.
template <class T>
__global__ void __launch_bounds__(block_threads)
    quantize_kernel(const T* __restrict__ x, ::cuda::std::size_t n, ::cuda::std::size_t block, int bits,
                    ::cuda::std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const ::cuda::std::size_t blocks = (n + block - 1) / block;
  const float qmax = bits == 8 ? 127.0F : 7.0F;
  for (::cuda::std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const ::cuda::std::size_t first = b * block;
    const ::cuda::std::size_t len = block < n - first ? block : n - first;
    float amax = 0.0F;
    int finite = 1;
    for (::cuda::std::size_t i = threadIdx.x; i < len; i += block_threads) {
      const float v = element_traits<T>::load(x[first + i]);
      finite &= is_finite(v) ? 1 : 0;
      amax = fmaxf(amax, fabsf(v));
    }
    block_amax(amax, finite);
    const bool ok = finite != 0;
    const float inv = block_scale(amax, qmax, ok, scales + b, threadIdx.x == 0);
    if (bits == 8) {
      for (::cuda::std::size_t i = threadIdx.x; i < len; i += block_threads) {
        const int q = quant_code(element_traits<T>::load(x[first + i]), inv, amax, qmax, ok);
        codes[first + i] = static_cast<::cuda::std::uint8_t>(q);
      }
    } else {
      ::cuda::std::uint8_t* out = codes + first / 2;
      for (::cuda::std::size_t k = threadIdx.x; 2 * k < len; k += block_threads) {
        const int lo = quant_code(element_traits<T>::load(x[first + 2 * k]), inv, amax, qmax, ok);
        const int hi =
            2 * k + 1 < len ? quant_code(element_traits<T>::load(x[first + 2 * k + 1]), inv, amax, qmax, ok) : 0;
        out[k] = static_cast<::cuda::std::uint8_t>((static_cast<unsigned>(lo) & 0x0FU) |
                                                   ((static_cast<unsigned>(hi) & 0x0FU) << 4U));
      }
    }
  }
}

/// `out[i] = T(float(code_i) * scale of its block)` over [0, n).
template <class T>
__global__ void __launch_bounds__(block_threads)
    dequantize_kernel(const ::cuda::std::uint8_t* __restrict__ codes, const float* __restrict__ scales,
                      ::cuda::std::size_t n, ::cuda::std::size_t block, int bits, T* __restrict__ out) {
  const ::cuda::std::size_t stride = static_cast<::cuda::std::size_t>(gridDim.x) * block_threads;
  for (::cuda::std::size_t i = static_cast<::cuda::std::size_t>(blockIdx.x) * block_threads + threadIdx.x; i < n;
       i += stride) {
    out[i] = element_traits<T>::store(__fmul_rn(static_cast<float>(code_at(codes, i, bits)), scales[i / block]));
  }
}

/// 8 consecutive elements as they are in memory, in 16-byte words (one for 16-bit types, two for fp32),
/// so a thread holding many packs spends 4 registers on 8 16-bit values, not 8.
template <class T> struct raw8 {
  uint4 w[sizeof(T) / 2];

  /// The 32-bit word `i` of the pack.
  [[nodiscard]] __device__ __forceinline__ unsigned word(int i) const {
    const uint4& v = w[i / 4];
    const int c = i % 4;
    return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
  }

  /// Element `j` as fp32.
  [[nodiscard]] __device__ __forceinline__ float operator[](int j) const {
    if constexpr (sizeof(T) == 2) {
      const auto bits = static_cast<unsigned short>(word(j / 2) >> (16U * static_cast<unsigned>(j % 2)));
      T t;
      ::memcpy(&t, &bits, sizeof(t));
      return element_traits<T>::load(t);
    } else {
      return __uint_as_float(word(j));
    }
  }
};

/// Loads 8 elements at `p` (16-byte aligned) as they are: one 16-byte access for 16-bit types, two for fp32.
template <class T> __device__ __forceinline__ raw8<T> load8_raw(const T* p) {
  raw8<T> out;
#pragma unroll
  for (unsigned k = 0; k < sizeof(T) / 2; ++k) {
    out.w[k] = reinterpret_cast<const uint4*>(p)[k];
  }
  return out;
}

/// The elementwise max of two pairs of 16-bit T (bf16 or fp16) in 32-bit words, NaN where either is: one
/// instruction on sm_80 and later (max.NaN on bf16x2 / f16x2), so the amax of 16-bit packs takes 4 per pack
/// and no widening. Exact: a max of values of T.
template <class T> __device__ __forceinline__ unsigned max2_nan(unsigned a, unsigned b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using pair = ::cuda::std::conditional_t<::cuda::std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
  pair x;
  pair y;
  ::memcpy(&x, &a, sizeof(x));
  ::memcpy(&y, &b, sizeof(y));
  const pair r = __hmax2_nan(x, y);
  unsigned out;
  ::memcpy(&out, &r, sizeof(out));
  return out;
#else
  raw8<T> u{};
  raw8<T> v{};
  u.w[0].x = a;
  v.w[0].x = b;
  const float lo = max_nan(u[0], v[0]), hi = max_nan(u[1], v[1]);
  const T lo_t = element_traits<T>::store(lo), hi_t = element_traits<T>::store(hi); // values of T: exact
  unsigned short lo_b, hi_b;
  ::memcpy(&lo_b, &lo_t, sizeof(lo_b));
  ::memcpy(&hi_b, &hi_t, sizeof(hi_b));
  return static_cast<unsigned>(lo_b) | (static_cast<unsigned>(hi_b) << 16U);
#endif
}

/// Packs `first + k stride` (k < K) of a block at `x` (16-byte aligned) of `len` elements, as they are, and
/// their amax and finiteness (an amax that keeps an inf or NaN, tested once at the end). The whole packs are loaded
/// first, each by one unconditional access (a pack beyond the block reads the block's first one instead, and is then
/// zeroed), so the K loads are all in flight at once; a pack the block's end cuts is then read element by element.
/// Zeros beyond the block leave the amax as it is.
template <class T, int K>
__device__ __forceinline__ void load_block_packs(const T* x, ::cuda::std::size_t first, ::cuda::std::size_t stride,
                                                 ::cuda::std::size_t len, raw8<T> (&raw)[K], float& amax, int& finite) {
  unsigned pair_max = 0U; // 16-bit T: the maxima of the packs' even and odd elements' |x|, as a pair
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const ::cuda::std::size_t at = (first + static_cast<::cuda::std::size_t>(k) * stride) * 8;
    raw[k] = load8_raw(x + (at + 8 <= len ? at : 0));
  }
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const ::cuda::std::size_t at = (first + static_cast<::cuda::std::size_t>(k) * stride) * 8;
    if (at + 8 > len) {
      T tmp[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        tmp[j] = at + j < len ? x[at + j] : element_traits<T>::store(0.0F);
      }
      ::memcpy(raw[k].w, tmp, sizeof(tmp));
    }
    if constexpr (sizeof(T) == 2) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pair_max = max2_nan<T>(pair_max, raw[k].word(i) & 0x7fff7fffU); // |x| of both halves: the sign bits cleared
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        amax = max_nan(amax, fabsf(raw[k][j]));
      }
    }
  }
  if constexpr (sizeof(T) == 2) {
    raw8<T> both{};
    both.w[0].x = pair_max;
    amax = max_nan(amax, max_nan(both[0], both[1]));
  }
  finite &= is_finite(amax) ? 1 : 0;
}

/// Writes the codes (factor `inv`, see quant_code) of the pack `raw` of 8 at element `e` (a multiple of 8)
/// whose first `left` elements are in the block: one access (8 bytes, or 4 for 4-bit codes) when the pack
/// is whole, bytewise at the block's end.
template <class T>
__device__ __forceinline__ void store_pack_codes(const raw8<T>& raw, float inv, float amax, float qmax, bool finite,
                                                 ::cuda::std::uint8_t* codes, ::cuda::std::size_t e,
                                                 ::cuda::std::size_t left, int bits) {
  unsigned q[8];
  if (finite && inv <= 3.4028234663852886e38F) {
    // A finite factor: |x| <= amax, so |x * inv| <= qmax (1 + 2^-24)^2 < qmax + 1/2, whose rint is within
    // [-qmax, qmax]: the clamp cannot act. The rounding is an add, not a conversion (a quarter of the
    // rate): x * inv + 1.5 * 2^23, rounded (the product first, not fused), lies in [2^23, 2^24), where
    // the float's unit is 1, so it is rint(x * inv) to the nearest even, and its word's low 22 bits are
    // that integer in two's complement (1.5 * 2^23's are 0): the low byte or nibble is the code.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = __float_as_uint(__fadd_rn(__fmul_rn(raw[j], inv), 12582912.0F));
    }
  } else { // a poisoned block, or an amax so small that qmax / amax overflowed
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      q[j] = static_cast<unsigned>(quant_code(raw[j], inv, amax, qmax, finite));
    }
  }
  if (bits == 8) {
    if (left >= 8) {
      const uint2 word{__byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410),
                       __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410)};
      *reinterpret_cast<uint2*>(codes + e) = word;
    } else {
      for (::cuda::std::size_t j = 0; j < left; ++j) {
        codes[e + j] = static_cast<::cuda::std::uint8_t>(q[j]);
      }
    }
  } else {
    unsigned word = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      word |= (q[j] & 0x0FU) << (4U * static_cast<unsigned>(j)); // beyond left: code 0 of a 0 value
    }
    if (left >= 8) {
      *reinterpret_cast<unsigned*>(codes + e / 2) = word;
    } else {
      for (::cuda::std::size_t j = 0; 2 * j < left; ++j) {
        codes[e / 2 + j] = static_cast<::cuda::std::uint8_t>(word >> (8U * j));
      }
    }
  }
}

/// Loads 8 elements at `p` (16-byte aligned) as fp32.
template <class T> __device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  const raw8<T> raw = load8_raw(p);
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    out[k] = raw[k];
  }
}

/// Stores 8 fp32 values at `p` (16-byte aligned) rounded to T.
template <class T> __device__ __forceinline__ void store8(T* p, const float (&in)[8]) {
  if constexpr (sizeof(T) == 2) {
    store_pack_float<8>(p, in);
  } else {
    const float lo[4] = {in[0], in[1], in[2], in[3]};
    const float hi[4] = {in[4], in[5], in[6], in[7]};
    store_pack_float<4>(p, lo);
    store_pack_float<4>(p + 4, hi);
  }
}

/// The CTA-per-block `quantize_kernel` for blocks of a multiple of 8 elements, at most 8 * block_threads * K
/// (blocks beyond `quantize_warp_kernel`'s reach): each thread holds its packs of 8 between the amax (two
/// barriers) and the codes (one read of the values). x 16-byte aligned, codes 8-byte.
template <class T, int K>
__global__ void __launch_bounds__(block_threads)
    quantize_packed_kernel(const T* __restrict__ x, ::cuda::std::size_t n, ::cuda::std::size_t block, int bits,
                           ::cuda::std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const ::cuda::std::size_t blocks = (n + block - 1) / block;
  const float qmax = bits == 8 ? 127.0F : 7.0F;
  for (::cuda::std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const ::cuda::std::size_t first = b * block;
    const ::cuda::std::size_t len = block < n - first ? block : n - first;
    raw8<T> raw[K];
    float amax = 0.0F;
    int finite = 1;
    load_block_packs(x + first, threadIdx.x, block_threads, len, raw, amax, finite);
    block_amax(amax, finite);
    const bool ok = finite != 0;
    const float inv = block_scale(amax, qmax, ok, scales + b, threadIdx.x == 0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const ::cuda::std::size_t at = (threadIdx.x + static_cast<::cuda::std::size_t>(k) * block_threads) * 8;
      if (at < len) {
        store_pack_codes(raw[k], inv, amax, qmax, ok, codes, first + at, len - at, bits);
      }
    }
  }
}

/// The fast `quantize_kernel` for blocks of a multiple of 8 elements, at most 256 K (8 per pack, 32 lanes,
/// K packs a lane): warp w of the grid takes block w (and every warps-th after it), and lane l holds the
/// block's packs l, l + 32, ... as they are in registers between the amax and the codes. The amax needs
/// shuffles only, no barrier, so each warp goes from its loads to its stores on its own; each lane has K
/// loads in flight and a warp's accesses of one k are contiguous. x 16-byte aligned, codes 8-byte.
template <class T, int K>
__global__ void __launch_bounds__(block_threads, 2) // 2 blocks an SM: 128 registers a thread at most
    quantize_warp_kernel(const T* __restrict__ x, ::cuda::std::size_t n, ::cuda::std::size_t block, int bits,
                         ::cuda::std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  constexpr unsigned warps_per_cta = block_threads / 32;
  const ::cuda::std::size_t blocks = (n + block - 1) / block;
  const unsigned lane = threadIdx.x % 32;
  const float qmax = bits == 8 ? 127.0F : 7.0F;
  const ::cuda::std::size_t step = static_cast<::cuda::std::size_t>(gridDim.x) * warps_per_cta;
  for (::cuda::std::size_t b = static_cast<::cuda::std::size_t>(blockIdx.x) * warps_per_cta + threadIdx.x / 32;
       b < blocks; b += step) {
    const ::cuda::std::size_t first = b * block;
    const ::cuda::std::size_t len = block < n - first ? block : n - first;
    raw8<T> raw[K];
    float amax = 0.0F;
    int finite = 1;
    load_block_packs(x + first, lane, 32, len, raw, amax, finite);
    warp_amax(amax, finite);
    const bool ok = finite != 0;
    const float inv = block_scale(amax, qmax, ok, scales + b, lane == 0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const ::cuda::std::size_t at = (lane + 32 * static_cast<::cuda::std::size_t>(k)) * 8;
      if (at < len) {
        store_pack_codes(raw[k], inv, amax, qmax, ok, codes, first + at, len - at, bits);
      }
    }
  }
}

/// The 8 values of a pack of 8 codes at element `i` (a multiple of 8; one 8- or 4-byte word, as loaded).
__device__ __forceinline__ void dequantize_pack(uint2 word, int bits, float scale, float (&v)[8]) {
  if (bits == 8) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[j] = __fmul_rn(static_cast<float>(static_cast<signed char>(word.x >> (8U * j))), scale);
      v[j + 4] = __fmul_rn(static_cast<float>(static_cast<signed char>(word.y >> (8U * j))), scale);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const unsigned nibble = (word.x >> (4U * static_cast<unsigned>(j))) & 0x0FU;
      v[j] =
          __fmul_rn(static_cast<float>(nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble)), scale);
    }
  }
}

/// The fast `dequantize_kernel` for blocks of a multiple of 8 elements: packs of 8 codes (one 8- or 4-byte
/// access) to 8 values (one 16-byte access, two for fp32), P packs a thread a pass, a grid's width apart
/// (so a warp's accesses of one pack are contiguous) and all P loaded before any is stored; the last n % 8
/// elements one by one. codes 8-byte aligned, out 16-byte.
template <class T, int P>
__global__ void __launch_bounds__(block_threads)
    dequantize_packed_kernel(const ::cuda::std::uint8_t* __restrict__ codes, const float* __restrict__ scales,
                             ::cuda::std::size_t n, ::cuda::std::size_t block, int bits, T* __restrict__ out) {
  const ::cuda::std::size_t tid = static_cast<::cuda::std::size_t>(blockIdx.x) * block_threads + threadIdx.x;
  const ::cuda::std::size_t stride = static_cast<::cuda::std::size_t>(gridDim.x) * block_threads;
  const ::cuda::std::size_t packs = n / 8;
  for (::cuda::std::size_t p0 = tid; p0 < packs; p0 += stride * P) {
    uint2 word[P];
    float scale[P];
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const ::cuda::std::size_t p = p0 + static_cast<::cuda::std::size_t>(k) * stride;
      if (p < packs) {
        word[k] = bits == 8 ? *reinterpret_cast<const uint2*>(codes + p * 8)
                            : uint2{*reinterpret_cast<const unsigned*>(codes + p * 4), 0U};
        scale[k] = scales[p * 8 / block];
      }
    }
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const ::cuda::std::size_t p = p0 + static_cast<::cuda::std::size_t>(k) * stride;
      if (p < packs) {
        float v[8];
        dequantize_pack(word[k], bits, scale[k], v);
        store8(out + p * 8, v);
      }
    }
  }
  for (::cuda::std::size_t i = packs * 8 + tid; i < n; i += stride) {
    out[i] = element_traits<T>::store(__fmul_rn(static_cast<float>(code_at(codes, i, bits)), scales[i / block]));
  }
}

/// True when `p` is aligned to `bytes`.
inline bool aligned_to(const void* p, std::size_t bytes) noexcept {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

template <class T>
void launch_quantize(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales,
                     cudaStream_t stream) {
  f.check("zero::cuda::quantize");
  require_buffer(x, n, "zero::cuda::quantize", "x");
  require_buffer(codes, n, "zero::cuda::quantize", "codes");
  require_buffer(scales, n, "zero::cuda::quantize", "scales");
  if (n == 0) {
    return;
  }
  const unsigned grid = static_cast<unsigned>(std::min<std::size_t>(f.blocks(n), 0x7fffffff));
  const bool packed = f.block % 8 == 0 && aligned_to(x, 16) && aligned_to(codes, 8);
  // Warp per block up to 16 packs a lane of 16-bit values (64 registers of them) or 8 of fp32.
  constexpr std::size_t per_warp = 8 * 32;
  constexpr std::size_t warp_packs = sizeof(T) == 2 ? 16 : 8;
  const auto warp_grid = static_cast<unsigned>(
      std::min<std::size_t>((f.blocks(n) + block_threads / 32 - 1) / (block_threads / 32), 0x7fffffff));
  constexpr std::size_t per_pass = 8 * static_cast<std::size_t>(block_threads);
  if (packed && f.block <= per_warp) {
    quantize_warp_kernel<T, 1><<<warp_grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && f.block <= 2 * per_warp) {
    quantize_warp_kernel<T, 2><<<warp_grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && f.block <= 4 * per_warp) {
    quantize_warp_kernel<T, 4><<<warp_grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && f.block <= 8 * per_warp) {
    quantize_warp_kernel<T, 8><<<warp_grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && warp_packs == 16 && f.block <= 16 * per_warp) {
    quantize_warp_kernel<T, warp_packs><<<warp_grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && f.block <= 2 * per_pass) {
    quantize_packed_kernel<T, 2><<<grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else if (packed && f.block <= 4 * per_pass) {
    quantize_packed_kernel<T, 4><<<grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  } else {
    quantize_kernel<T><<<grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
  }
  check_launch("zero::cuda::kernels::quantize_kernel");
}

template <class T>
void launch_dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, quant_format f, T* out,
                       cudaStream_t stream) {
  f.check("zero::cuda::dequantize");
  require_buffer(out, n, "zero::cuda::dequantize", "out");
  require_buffer(codes, n, "zero::cuda::dequantize", "codes");
  require_buffer(scales, n, "zero::cuda::dequantize", "scales");
  if (n == 0) {
    return;
  }
  if (f.block % 8 == 0 && aligned_to(codes, 8) && aligned_to(out, 16)) {
    constexpr int packs_per_thread = 4;
    dequantize_packed_kernel<T, packs_per_thread>
        <<<grid_blocks(std::max<std::size_t>((n / 8 + packs_per_thread - 1) / packs_per_thread, 1)), block_threads, 0,
           stream>>>(codes, scales, n, f.block, f.bits, out);
  } else {
    dequantize_kernel<T><<<grid_blocks(n), block_threads, 0, stream>>>(codes, scales, n, f.block, f.bits, out);
  }
  check_launch("zero::cuda::kernels::dequantize_kernel");
}

} // namespace zero::cuda::kernels
