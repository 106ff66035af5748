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

/// Folds the amax of K packs (as loaded) into `amax`, NaN when any value is (tested once by the caller).
template <class T, int K> __device__ __forceinline__ void packs_amax(const raw8<T> (&raw)[K], float& amax) {
  if constexpr (sizeof(T) == 2) {
    unsigned pair_max = 0U; // the maxima of the packs' even and odd elements' |x|, as a pair
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        pair_max = max2_nan<T>(pair_max, raw[k].word(i) & 0x7fff7fffU); // |x| of both halves: the sign bits cleared
      }
    }
    raw8<T> both{};
    both.w[0].x = pair_max;
    amax = max_nan(amax, max_nan(both[0], both[1]));
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        amax = max_nan(amax, fabsf(raw[k][j]));
      }
    }
  }
}

/// Packs `first + k stride` (k < K) of a block at `x` (16-byte aligned) of `len` elements, as they are. The whole
/// packs are loaded first, each by one unconditional access (a pack beyond the block reads the block's first one
/// instead, and is then zeroed), so the K loads are all in flight at once; a pack the block's end cuts is then read
/// element by element. Zeros beyond the block leave the amax as it is.
template <class T, int K>
__device__ __forceinline__ void load_block_packs(const T* x, ::cuda::std::size_t first, ::cuda::std::size_t stride,
                                                 ::cuda::std::size_t len, raw8<T> (&raw)[K]) {
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
  }
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

/// Waits for the W warps of group `g` of the thread block (W = 8: the whole block), so the warps' amaxes in shared
/// memory are all written: a named barrier (1 + g) of 32 W threads.
template <int W> __device__ __forceinline__ void group_sync(unsigned g) {
  if constexpr (W == block_threads / 32) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" : : "r"(1U + g), "r"(32U * W) : "memory");
  }
}

/// The fast `quantize_kernel` for blocks of a multiple of 8 elements, at most 8 * 32 * W * K: a group of W warps
/// takes a block (group g of the grid block b = g, then every groups-th), and its thread t holds the block's packs
/// t, t + 32 W, ... as they are in registers between the amax and the codes, so the values are read once. The amax
/// takes shuffles, then (W > 1) the group's warps' through shared memory past one named barrier: the words are
/// double-buffered by the block's parity, so a warp's next write cannot land before the group has read them. A whole
/// block (the common case: every block but the last, when 32 W K packs are exactly the block) loads and stores
/// with one access a pack and no bounds; a shorter one goes through load_block_packs. Few warps a block keep
/// more of each lane's loads in flight; more warps a block put more blocks of a small tensor on the SMs at once
/// (`launch_quantize` picks W). x 16-byte aligned, codes 8-byte.
template <class T, int W, int K>
__global__ void __launch_bounds__(block_threads, K * sizeof(T) >= 32   ? 2
                                                 : K * sizeof(T) >= 16 ? 3
                                                                       : 4)
    quantize_group_kernel(const T* __restrict__ x, ::cuda::std::size_t n, ::cuda::std::size_t block, int bits,
                          ::cuda::std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  static_assert(W >= 1 && block_threads % (32 * W) == 0);
  constexpr unsigned group_threads = 32 * W;
  constexpr unsigned groups = block_threads / group_threads;
  constexpr ::cuda::std::size_t span = 8 * static_cast<::cuda::std::size_t>(group_threads) * K;
  __shared__ float warp_max[2][block_threads / 32];
  __shared__ int warp_finite[2][block_threads / 32];
  const ::cuda::std::size_t blocks = (n + block - 1) / block;
  const unsigned g = threadIdx.x / group_threads;
  const unsigned t = threadIdx.x % group_threads;
  const float qmax = bits == 8 ? 127.0F : 7.0F;
  const ::cuda::std::size_t step = static_cast<::cuda::std::size_t>(gridDim.x) * groups;
  unsigned parity = 0;
  for (::cuda::std::size_t b = static_cast<::cuda::std::size_t>(blockIdx.x) * groups + g; b < blocks;
       b += step, parity ^= 1U) {
    const ::cuda::std::size_t first = b * block;
    const ::cuda::std::size_t len = block < n - first ? block : n - first;
    const bool whole = len == span;
    raw8<T> raw[K];
    if (whole) {
      const T* at = x + first + 8 * static_cast<::cuda::std::size_t>(t);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        raw[k] = load8_raw(at + static_cast<::cuda::std::size_t>(k) * 8 * group_threads);
      }
    } else {
      load_block_packs(x + first, t, group_threads, len, raw);
    }
    float amax = 0.0F;
    packs_amax(raw, amax);
    int finite = is_finite(amax) ? 1 : 0;
    warp_amax(amax, finite);
    if constexpr (W > 1) {
      if (threadIdx.x % 32 == 0) {
        warp_max[parity][threadIdx.x / 32] = amax;
        warp_finite[parity][threadIdx.x / 32] = finite;
      }
      group_sync<W>(g);
#pragma unroll
      for (unsigned w = 0; w < W; ++w) {
        amax = fmaxf(amax, warp_max[parity][g * W + w]);
        finite &= warp_finite[parity][g * W + w];
      }
    }
    const bool ok = finite != 0;
    const float inv = block_scale(amax, qmax, ok, scales + b, t == 0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const ::cuda::std::size_t at = (t + static_cast<::cuda::std::size_t>(k) * group_threads) * 8;
      if (whole) {
        store_pack_codes(raw[k], inv, amax, qmax, ok, codes, first + at, 8, bits);
      } else if (at < len) {
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

/// Launches `quantize_group_kernel<T, W, K>` with the fewest packs a thread, K (a power of 2 from `K`), that holds a
/// block in W warps, at most 128 bytes of values a thread below 8 warps (32 registers of them; more cost 1 warp
/// spills, see quantize_group_warps) and 256 bytes at 8; false when none does.
template <class T, int W, int K = 1>
bool launch_quantize_group(const T* x, std::size_t n, quant_format f, std::uint8_t* codes, float* scales,
                           cudaStream_t stream) {
  if constexpr (K * 8 * sizeof(T) > (W == block_threads / 32 ? 256 : 128)) {
    return false;
  } else {
    if (f.block > 8 * 32 * static_cast<std::size_t>(W) * K) {
      return launch_quantize_group<T, W, 2 * K>(x, n, f, codes, scales, stream);
    }
    constexpr unsigned groups = block_threads / (32 * W);
    const auto grid = static_cast<unsigned>(std::min<std::size_t>((f.blocks(n) + groups - 1) / groups, 0x7fffffff));
    quantize_group_kernel<T, W, K><<<grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
    return true;
  }
}

/// The warps a block for `quantize_group_kernel` on `blocks` blocks of `block_bytes` bytes of values: as many as
/// give each thread 128 bytes of its block (8 packs of 16-bit values, all a lane's loads in flight at once), between 1
/// and 8; twice as many, down to 64 bytes a thread, while there are fewer than 8192 blocks, so a small tensor's few
/// blocks still fill the SMs. One H200, bf16 values (bench/README.md): blocks of 4096 at 256 M values, as ratios to a
/// copy of the same traffic (int8 / int4), 1 warp 0.62 / 0.52 (16 packs a lane: 128 registers and spills), 2 warps
/// 0.92 / 0.84, 4 warps 0.88 / 0.77, 8 warps 0.64 / 0.55; at 16 M values 2 warps 0.63 / 0.55, 4 warps 0.64 / 0.56;
/// at 64 M values this choice is the fastest of 1-8 warps (within 1%) for blocks of 256 to 8192. fp32 takes the same
/// bytes a thread, unmeasured.
inline int quantize_group_warps(std::size_t block_bytes, std::size_t blocks) noexcept {
  constexpr std::size_t lanes = 32;
  std::size_t w = std::clamp<std::size_t>(block_bytes / (lanes * 128), 1, 8);
  if (blocks < 8192) {
    w = std::clamp<std::size_t>(std::min(2 * w, block_bytes / (lanes * 64)), w, 8);
  }
  return static_cast<int>(w);
}

/// Quantizes `x` (`zero::cuda::quantize`): `quantize_group_kernel` for blocks of a multiple of 8 elements on aligned
/// buffers, with `quantize_group_warps` warps a block (or more, where a block needs them), else the elementwise
/// `quantize_kernel`.
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
  const bool packed = f.block % 8 == 0 && aligned_to(x, 16) && aligned_to(codes, 8);
  const int w = quantize_group_warps(f.block * sizeof(T), f.blocks(n));
  const bool launched = packed && ((w <= 1 && launch_quantize_group<T, 1>(x, n, f, codes, scales, stream)) ||
                                   (w <= 2 && launch_quantize_group<T, 2>(x, n, f, codes, scales, stream)) ||
                                   (w <= 4 && launch_quantize_group<T, 4>(x, n, f, codes, scales, stream)) ||
                                   launch_quantize_group<T, 8>(x, n, f, codes, scales, stream));
  if (!launched) {
    const unsigned grid = static_cast<unsigned>(std::min<std::size_t>(f.blocks(n), 0x7fffffff));
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
