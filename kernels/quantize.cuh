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

/// The code of `v` for the factor `inv` (qmax / amax), clamped to [-qmax, qmax]; 0 for a poisoned block.
__device__ __forceinline__ int quant_code(float v, float inv, float qmax, bool finite) {
  return finite ? static_cast<int>(fminf(fmaxf(rintf(__fmul_rn(v, inv)), -qmax), qmax)) : 0;
}

/// The block's amax and whether all of it is finite, from each thread's: warp shuffles, then the warps'
/// through shared memory (a max and an and: exact in any order). Every thread gets both.
__device__ __forceinline__ void block_amax(float& amax, int& finite) {
  __shared__ float warp_max[block_threads / 32];
  __shared__ int warp_finite[block_threads / 32];
  for (int o = 16; o > 0; o /= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffU, amax, o));
    finite &= __shfl_xor_sync(0xffffffffU, finite, o);
  }
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

/// Writes the block's scale (thread 0) and returns the factor of its codes, qmax / amax (0 for a block
/// of zeros or one poisoned by an inf or NaN, whose scale is NaN).
__device__ __forceinline__ float block_scale(float amax, float qmax, bool finite, float* scale) {
  if (threadIdx.x == 0) {
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
    const float inv = block_scale(amax, qmax, ok, scales + b);
    if (bits == 8) {
      for (::cuda::std::size_t i = threadIdx.x; i < len; i += block_threads) {
        const int q = quant_code(element_traits<T>::load(x[first + i]), inv, qmax, ok);
        codes[first + i] = static_cast<::cuda::std::uint8_t>(q);
      }
    } else {
      ::cuda::std::uint8_t* out = codes + first / 2;
      for (::cuda::std::size_t k = threadIdx.x; 2 * k < len; k += block_threads) {
        const int lo = quant_code(element_traits<T>::load(x[first + 2 * k]), inv, qmax, ok);
        const int hi = 2 * k + 1 < len ? quant_code(element_traits<T>::load(x[first + 2 * k + 1]), inv, qmax, ok) : 0;
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

/// Loads 8 elements at `p` (16-byte aligned) as fp32: one 16-byte access for 16-bit types, two for fp32.
template <class T> __device__ __forceinline__ void load8(const T* p, float (&out)[8]) {
  if constexpr (sizeof(T) == 2) {
    load_pack_float<8>(p, out);
  } else {
    float lo[4], hi[4];
    load_pack_float<4>(p, lo);
    load_pack_float<4>(p + 4, hi);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[k] = lo[k];
      out[k + 4] = hi[k];
    }
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

/// The fast `quantize_kernel` for blocks of a multiple of 8 elements, at most 8 * block_threads * K: each
/// thread holds its packs of 8 in registers between the amax and the codes (one read of the values), and
/// writes a pack's codes in one access (8 bytes, or 4 for 4-bit codes). x 16-byte aligned, codes 8-byte.
template <class T, int K>
__global__ void __launch_bounds__(block_threads)
    quantize_packed_kernel(const T* __restrict__ x, ::cuda::std::size_t n, ::cuda::std::size_t block, int bits,
                           ::cuda::std::uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const ::cuda::std::size_t blocks = (n + block - 1) / block;
  const float qmax = bits == 8 ? 127.0F : 7.0F;
  for (::cuda::std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const ::cuda::std::size_t first = b * block;
    const ::cuda::std::size_t len = block < n - first ? block : n - first;
    float v[K][8];
    float amax = 0.0F;
    int finite = 1;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const ::cuda::std::size_t at = (threadIdx.x + static_cast<::cuda::std::size_t>(k) * block_threads) * 8;
      if (at + 8 <= len) {
        load8(x + first + at, v[k]);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[k][j] = at + j < len ? element_traits<T>::load(x[first + at + j]) : 0.0F;
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        finite &= is_finite(v[k][j]) ? 1 : 0;
        amax = fmaxf(amax, fabsf(v[k][j]));
      }
    }
    block_amax(amax, finite);
    const bool ok = finite != 0;
    const float inv = block_scale(amax, qmax, ok, scales + b);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const ::cuda::std::size_t at = (threadIdx.x + static_cast<::cuda::std::size_t>(k) * block_threads) * 8;
      if (at >= len) {
        continue;
      }
      unsigned q[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        q[j] = static_cast<unsigned>(quant_code(v[k][j], inv, qmax, ok));
      }
      const ::cuda::std::size_t e = first + at;
      if (bits == 8) {
        if (at + 8 <= len) {
          const uint2 word{(q[0] & 0xFFU) | ((q[1] & 0xFFU) << 8U) | ((q[2] & 0xFFU) << 16U) | (q[3] << 24U),
                           (q[4] & 0xFFU) | ((q[5] & 0xFFU) << 8U) | ((q[6] & 0xFFU) << 16U) | (q[7] << 24U)};
          *reinterpret_cast<uint2*>(codes + e) = word;
        } else {
          for (::cuda::std::size_t j = 0; at + j < len; ++j) {
            codes[e + j] = static_cast<::cuda::std::uint8_t>(q[j]);
          }
        }
      } else {
        unsigned word = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          word |= (q[j] & 0x0FU) << (4U * static_cast<unsigned>(j)); // beyond len: code 0 of a 0 value
        }
        if (at + 8 <= len) {
          *reinterpret_cast<unsigned*>(codes + e / 2) = word;
        } else {
          for (::cuda::std::size_t j = 0; 2 * j < len - at; ++j) {
            codes[e / 2 + j] = static_cast<::cuda::std::uint8_t>(word >> (8U * j));
          }
        }
      }
    }
  }
}

/// The fast `dequantize_kernel` for blocks of a multiple of 8 elements: a pack of 8 codes (one 8- or
/// 4-byte access) to 8 values (one 16-byte access, two for fp32) per thread; the last n % 8 elements
/// one by one. codes 8-byte aligned, out 16-byte.
template <class T>
__global__ void __launch_bounds__(block_threads)
    dequantize_packed_kernel(const ::cuda::std::uint8_t* __restrict__ codes, const float* __restrict__ scales,
                             ::cuda::std::size_t n, ::cuda::std::size_t block, int bits, T* __restrict__ out) {
  const ::cuda::std::size_t tid = static_cast<::cuda::std::size_t>(blockIdx.x) * block_threads + threadIdx.x;
  const ::cuda::std::size_t stride = static_cast<::cuda::std::size_t>(gridDim.x) * block_threads;
  const ::cuda::std::size_t packs = n / 8;
  for (::cuda::std::size_t p = tid; p < packs; p += stride) {
    const ::cuda::std::size_t i = p * 8;
    const float scale = scales[i / block];
    float v[8];
    if (bits == 8) {
      const uint2 word = *reinterpret_cast<const uint2*>(codes + i);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        v[j] = __fmul_rn(static_cast<float>(static_cast<signed char>(word.x >> (8U * j))), scale);
        v[j + 4] = __fmul_rn(static_cast<float>(static_cast<signed char>(word.y >> (8U * j))), scale);
      }
    } else {
      const unsigned word = *reinterpret_cast<const unsigned*>(codes + i / 2);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const unsigned nibble = (word >> (4U * static_cast<unsigned>(j))) & 0x0FU;
        v[j] = __fmul_rn(static_cast<float>(nibble >= 8 ? static_cast<int>(nibble) - 16 : static_cast<int>(nibble)),
                         scale);
      }
    }
    store8(out + i, v);
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
  constexpr std::size_t per_pass = 8 * static_cast<std::size_t>(block_threads);
  if (packed && f.block <= per_pass) {
    quantize_packed_kernel<T, 1><<<grid, block_threads, 0, stream>>>(x, n, f.block, f.bits, codes, scales);
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
    dequantize_packed_kernel<T><<<grid_blocks(std::max<std::size_t>(n / 8, 1)), block_threads, 0, stream>>>(
        codes, scales, n, f.block, f.bits, out);
  } else {
    dequantize_kernel<T><<<grid_blocks(n), block_threads, 0, stream>>>(codes, scales, n, f.block, f.bits, out);
  }
  check_launch("zero::cuda::kernels::dequantize_kernel");
}

} // namespace zero::cuda::kernels
