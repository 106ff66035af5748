// Fused causal self-attention for the GPT example (see gpt_kernels.hpp, attention_forward): the scores never
// reach memory. FlashAttention-2's schedule on the tensor cores' bf16 mma.sync (m16n8k16, fp32 accumulators),
// 64 queries by 64 keys per tile, each of a block's 4 warps owning 16 rows:
// - forward: per query tile, the key tiles 0..diagonal through shared memory; a running row maximum and sum
//   (online softmax); the probabilities rounded to bf16 as the A operand of P·V straight from the S
//   accumulators' registers; O / sum at the end, and the row's log-sum-exp (base 2) for the backward;
// - backward: dK and dV per key tile over the query tiles at or after it, and dQ per query tile over the key
//   tiles up to it, each recomputing P from the saved log-sum-exp. Every output element is summed by one warp
//   in a fixed tile order (no atomics: FlashAttention-2's dQ atomics would make the bits vary by run).
// Head sizes 16, 32, 64 and 128; any T (the tiles past T are zero-filled and masked).

#include "gpt_kernels.hpp"

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string>
#include <zero/core/cuda_check.hpp>
#include <zero/core/error.hpp>

namespace gpt::kernels {

namespace {

constexpr int tile = 64;      // queries and keys per tile
constexpr int tile_warps = 4; // 16 rows each
constexpr int tile_threads = 32 * tile_warps;
constexpr float log2e = 1.4426950408889634f;

const __nv_bfloat16* dev(const bf16* p) { return reinterpret_cast<const __nv_bfloat16*>(p); }
__nv_bfloat16* dev(bf16* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// The problem: B sequences of T tokens, NH heads of HD = C / NH; q|k|v in qkv rows of 3C (q at column h·HD,
// k at C + h·HD, v at 2C + h·HD), an output or its gradient in rows of C (column h·HD).
struct shape {
  int T;
  int NH;
  int C;
  float scale_log2; // log2(e) / sqrt(HD): scores to base-2 exponents
  float scale;      // 1 / sqrt(HD)
};

// A shared-memory tile of 64 rows of HD bf16, each row padded by 16 bytes: 32-bit fragment loads and ldmatrix
// rows then fall on distinct banks.
template <int HD> constexpr int row_stride = HD + 8;
template <int HD> constexpr int tile_elems = tile* row_stride<HD>;

__device__ __forceinline__ std::uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

__device__ __forceinline__ std::uint32_t load32(const __nv_bfloat16* p) {
  return *reinterpret_cast<const std::uint32_t*>(p);
}

// d += a · b, a 16x16 bf16 (row), b 16x8 bf16 (col), d 16x8 fp32. Lane l holds, with g = l / 4, t = l % 4:
// a: {A[g][2t..2t+1], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..]}; b: {B[2t..2t+1][g], B[2t+8..2t+9][g]};
// d: {D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1]}.
__device__ __forceinline__ void mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The A fragment of rows [r0, r0 + 16), columns [k0, k0 + 16) of a row-major shared tile.
template <int HD>
__device__ __forceinline__ void load_a(std::uint32_t (&a)[4], const __nv_bfloat16* s, int r0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const __nv_bfloat16* p = s + (r0 + g) * row_stride<HD> + k0 + 2 * t;
  a[0] = load32(p);
  a[1] = load32(p + 8 * row_stride<HD>);
  a[2] = load32(p + 8);
  a[3] = load32(p + 8 * row_stride<HD> + 8);
}

// The B fragment whose element (k, n) is s[n0 + n][k0 + k]: the transpose of a row-major tile (K for q·kᵀ).
template <int HD>
__device__ __forceinline__ void load_b_t(std::uint32_t& b0, std::uint32_t& b1, const __nv_bfloat16* s, int n0, int k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const __nv_bfloat16* p = s + (n0 + g) * row_stride<HD> + k0 + 2 * t;
  b0 = load32(p);
  b1 = load32(p + 8);
}

// The B fragment whose element (k, n) is s[k0 + k][n0 + n]: rows of a row-major tile as k (V for p·v), by
// ldmatrix's transposing load; lanes 0-15 name the 16 rows.
template <int HD>
__device__ __forceinline__ void load_b(std::uint32_t& b0, std::uint32_t& b1, const __nv_bfloat16* s, int k0, int n0) {
  const int lane = threadIdx.x % 32;
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(s + (k0 + lane % 16) * row_stride<HD> + n0));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(addr));
}

// The A fragment of a 16x16 block held as two adjacent 16x8 accumulators (columns 2kk·8 and (2kk+1)·8): a
// product's result as the next product's left operand, rounded to bf16.
__device__ __forceinline__ void to_a(std::uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// acc (the warp's 16 x HD) += lhs · rhs: lhs the warp's 16 x 64 accumulators of an earlier product (rounded to
// bf16), rhs a shared 64 x HD tile.
template <int HD>
__device__ __forceinline__ void mma_tile(float (&acc)[HD / 8][4], const float (&lhs)[tile / 8][4],
                                         const __nv_bfloat16* rhs) {
  for (int kk = 0; kk < tile / 16; ++kk) {
    std::uint32_t a[4];
    to_a(a, lhs[2 * kk], lhs[2 * kk + 1]);
    for (int n = 0; n < HD / 8; ++n) {
      std::uint32_t b0, b1;
      load_b<HD>(b0, b1, rhs, kk * 16, n * 8);
      mma(acc[n], a, b0, b1);
    }
  }
}

// Copies rows [row0, row0 + 64) of one head's HD columns from `src` (rows of `ld` elements, the head's first
// column at `col`) into a shared tile; rows at or past T become zeros. 16-byte vectors.
template <int HD>
__device__ __forceinline__ void load_tile(__nv_bfloat16* s, const __nv_bfloat16* src, std::size_t ld, int col, int row0,
                                          int T) {
  constexpr int vecs = HD / 8;
  for (int i = static_cast<int>(threadIdx.x); i < tile * vecs; i += tile_threads) {
    const int r = i / vecs, v = i % vecs;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (row0 + r < T) {
      x = *reinterpret_cast<const uint4*>(src + static_cast<std::size_t>(row0 + r) * ld + col + 8 * v);
    }
    *reinterpret_cast<uint4*>(s + r * row_stride<HD> + 8 * v) = x;
  }
}

// Writes a warp's 16 x HD accumulators (times `factor`, rounded to bf16) to rows [r0, r0 + 16) of `dst` (rows
// of `ld`, the head's first column at `col`), rows at or past T left out.
template <int HD>
__device__ __forceinline__ void store_rows(__nv_bfloat16* dst, std::size_t ld, int col, int r0, int T,
                                           const float (&acc)[HD / 8][4], float factor0, float factor1) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + g + 8 * half;
    if (r >= T) {
      continue;
    }
    const float f = half == 0 ? factor0 : factor1;
    __nv_bfloat16* row = dst + static_cast<std::size_t>(r) * ld + col + 2 * t;
    for (int n = 0; n < HD / 8; ++n) {
      *reinterpret_cast<std::uint32_t*>(row + 8 * n) = pack(acc[n][2 * half] * f, acc[n][2 * half + 1] * f);
    }
  }
}

// Sum (or max) over the 4 lanes that hold one row of an accumulator: the same bits in all 4.
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Where a thread of a tile kernel works: its block's sequence b and head h (blockIdx.y = b · NH + h), its warp,
// its lane's fragment row g and column pair t, and the sequence's q|k|v rows (of ld = 3C elements).
struct place {
  int bh, b, h, warp, g, t;
  std::size_t ld;
  const __nv_bfloat16* base;
  __device__ place(const shape& s, const __nv_bfloat16* qkv)
      : bh(static_cast<int>(blockIdx.y)), b(bh / s.NH), h(bh % s.NH), warp(static_cast<int>(threadIdx.x / 32)),
        g(static_cast<int>(threadIdx.x % 32) / 4), t(static_cast<int>(threadIdx.x % 4)),
        ld(3 * static_cast<std::size_t>(s.C)), base(qkv + static_cast<std::size_t>(b) * s.T * ld) {}
};

// grid (query tiles, B·NH), the last query tile first (it has the most key tiles). Shared: Q, K, V tiles.
template <int HD>
__global__ void __launch_bounds__(tile_threads)
    flash_forward_kernel(__nv_bfloat16* __restrict__ out, float* __restrict__ lse2,
                         const __nv_bfloat16* __restrict__ qkv, shape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* ks = qs + tile_elems<HD>;
  __nv_bfloat16* vs = ks + tile_elems<HD>;
  const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const place at(s, qkv);
  const int bh = at.bh, b = at.b, h = at.h, warp = at.warp, g = at.g, t = at.t;
  const std::size_t ld = at.ld;
  const __nv_bfloat16* base = at.base;
  const int q0 = qt * tile + warp * 16; // the warp's first query

  load_tile<HD>(qs, base, ld, h * HD, qt * tile, s.T);
  __syncthreads();
  std::uint32_t qa[HD / 16][4];
  for (int kk = 0; kk < HD / 16; ++kk) {
    load_a<HD>(qa[kk], qs, warp * 16, kk * 16);
  }
  float o[HD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}; // rows g and g + 8: the running maximum (base-2 exponent)
  float l[2] = {0.0f, 0.0f};           // this lane's share of the running sum

  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads(); // every warp is done with the last K and V tiles
    load_tile<HD>(ks, base, ld, s.C + h * HD, kt * tile, s.T);
    load_tile<HD>(vs, base, ld, 2 * s.C + h * HD, kt * tile, s.T);
    __syncthreads();
    float sc[tile / 8][4] = {};
    for (int kk = 0; kk < HD / 16; ++kk) {
      for (int j = 0; j < tile / 8; ++j) {
        std::uint32_t b0, b1;
        load_b_t<HD>(b0, b1, ks, j * 8, kk * 16);
        mma(sc[j], qa[kk], b0, b1);
      }
    }
    float mx[2] = {m[0], m[1]};
    for (int j = 0; j < tile / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int row = q0 + g + 8 * (e / 2), col = kt * tile + j * 8 + 2 * t + e % 2;
        sc[j][e] = (col > row || col >= s.T) ? -INFINITY : sc[j][e] * s.scale_log2;
        mx[e / 2] = fmaxf(mx[e / 2], sc[j][e]);
      }
    }
    float alpha[2];
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]); // key 0 is in every row's reach: finite from the first tile on
      alpha[r] = exp2f(m[r] - mx[r]);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
    for (int j = 0; j < tile / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        sc[j][e] = exp2f(sc[j][e] - m[e / 2]);
        l[e / 2] += sc[j][e];
      }
    }
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    mma_tile<HD>(o, sc, vs); // O += P · V
  }
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
  }
  __nv_bfloat16* ob = out + static_cast<std::size_t>(b) * s.T * s.C;
  store_rows<HD>(ob, static_cast<std::size_t>(s.C), h * HD, q0, s.T, o, 1.0f / l[0], 1.0f / l[1]);
  if (t == 0) {
    for (int r = 0; r < 2; ++r) {
      const int row = q0 + g + 8 * r;
      if (row < s.T) {
        lse2[static_cast<std::size_t>(bh) * s.T + row] = m[r] + log2f(l[r]);
      }
    }
  }
}

// D[b, h, t] = sum over the head's columns of dout · out (fp32), the softmax backward's row term. One warp per
// (row, head).
__global__ void attention_dot_kernel(float* __restrict__ dsum, const __nv_bfloat16* __restrict__ dout,
                                     const __nv_bfloat16* __restrict__ out, std::size_t rows, int T, int NH, int HD) {
  const std::size_t w = blockIdx.x * static_cast<std::size_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (w >= rows * static_cast<std::size_t>(NH)) {
    return;
  }
  const int lane = static_cast<int>(threadIdx.x % 32);
  const std::size_t row = w / static_cast<std::size_t>(NH);
  const int h = static_cast<int>(w % static_cast<std::size_t>(NH));
  const std::size_t at = row * static_cast<std::size_t>(NH) * HD + static_cast<std::size_t>(h) * HD;
  float v = 0.0f;
  for (int i = lane; i < HD; i += 32) {
    v += __bfloat162float(dout[at + i]) * __bfloat162float(out[at + i]);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  if (lane == 0) {
    const std::size_t b = row / static_cast<std::size_t>(T), t = row % static_cast<std::size_t>(T);
    dsum[(b * NH + h) * T + t] = v;
  }
}

// The backward kernels' operands: dqkv (written), dout, the forward's qkv, the rows' log-sum-exp and D.
struct backward_args {
  __nv_bfloat16* dqkv;
  const __nv_bfloat16* dout;
  const __nv_bfloat16* qkv;
  const float* lse2;
  const float* dsum;
};

// The backward kernels' shared tiles, in this order: Q, dO, K, V.
template <int HD> struct backward_tiles {
  __nv_bfloat16 *q, *dout, *k, *v;
  __device__ explicit backward_tiles(unsigned char* smem)
      : q(reinterpret_cast<__nv_bfloat16*>(smem)), dout(q + tile_elems<HD>), k(dout + tile_elems<HD>),
        v(k + tile_elems<HD>) {}
};

// dK and dV of one key tile: grid (key tiles, B·NH); the query tiles from the key tile's own to the last, in
// order. Shared: K, V (kept), Q and dO (per query tile), and the query tile's log-sum-exp and D.
template <int HD> __global__ void __launch_bounds__(tile_threads) flash_backward_kv_kernel(backward_args a, shape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  const backward_tiles<HD> tiles(smem);
  __nv_bfloat16 *qs = tiles.q, *dos = tiles.dout, *ks = tiles.k, *vs = tiles.v;
  auto* ls = reinterpret_cast<float*>(vs + tile_elems<HD>);
  float* ds = ls + tile;
  __nv_bfloat16* __restrict__ dqkv = a.dqkv;
  const __nv_bfloat16* __restrict__ dout = a.dout, * __restrict__ qkv = a.qkv;
  const float* __restrict__ lse2 = a.lse2, * __restrict__ dsum = a.dsum;
  const int kt = static_cast<int>(blockIdx.x);
  const place at(s, qkv);
  const int bh = at.bh, b = at.b, h = at.h, warp = at.warp, g = at.g, t = at.t;
  const std::size_t ld = at.ld;
  const __nv_bfloat16* base = at.base;
  const __nv_bfloat16* dob = dout + static_cast<std::size_t>(b) * s.T * s.C;
  const int k0 = kt * tile + warp * 16; // the warp's first key
  const int n_tiles = (s.T + tile - 1) / tile;

  load_tile<HD>(ks, base, ld, s.C + h * HD, kt * tile, s.T);
  load_tile<HD>(vs, base, ld, 2 * s.C + h * HD, kt * tile, s.T);
  float dk[HD / 8][4] = {};
  float dv[HD / 8][4] = {};
  for (int qt = kt; qt < n_tiles; ++qt) {
    __syncthreads();
    load_tile<HD>(qs, base, ld, h * HD, qt * tile, s.T);
    load_tile<HD>(dos, dob, static_cast<std::size_t>(s.C), h * HD, qt * tile, s.T);
    for (int i = static_cast<int>(threadIdx.x); i < tile; i += tile_threads) {
      const int q = qt * tile + i;
      const bool in = q < s.T;
      ls[i] = in ? lse2[static_cast<std::size_t>(bh) * s.T + q] : INFINITY; // exp2(x - inf) = 0
      ds[i] = in ? dsum[static_cast<std::size_t>(bh) * s.T + q] : 0.0f;
    }
    __syncthreads();
    // Sᵀ (the warp's 16 keys by 64 queries) = K · Qᵀ, then Pᵀ from each query's log-sum-exp.
    float p[tile / 8][4] = {};
    float dp[tile / 8][4] = {};
    for (int kk = 0; kk < HD / 16; ++kk) {
      std::uint32_t ka[4], va[4];
      load_a<HD>(ka, ks, warp * 16, kk * 16);
      load_a<HD>(va, vs, warp * 16, kk * 16);
      for (int j = 0; j < tile / 8; ++j) {
        std::uint32_t b0, b1;
        load_b_t<HD>(b0, b1, qs, j * 8, kk * 16);
        mma(p[j], ka, b0, b1);
        load_b_t<HD>(b0, b1, dos, j * 8, kk * 16);
        mma(dp[j], va, b0, b1); // dPᵀ = V · dOᵀ
      }
    }
    for (int j = 0; j < tile / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + g + 8 * (e / 2), qi = j * 8 + 2 * t + e % 2, q = qt * tile + qi;
        const float pv = q < key ? 0.0f : exp2f(p[j][e] * s.scale_log2 - ls[qi]);
        p[j][e] = pv;
        dp[j][e] = pv * (dp[j][e] - ds[qi]); // dSᵀ
      }
    }
    mma_tile<HD>(dv, p, dos); // dV += Pᵀ · dO
    mma_tile<HD>(dk, dp, qs); // dK += dSᵀ · Q
  }
  __nv_bfloat16* db = dqkv + static_cast<std::size_t>(b) * s.T * ld;
  store_rows<HD>(db, ld, s.C + h * HD, k0, s.T, dk, s.scale, s.scale);
  store_rows<HD>(db, ld, 2 * s.C + h * HD, k0, s.T, dv, 1.0f, 1.0f);
}

// dQ of one query tile: grid (query tiles, B·NH), the last first; the key tiles up to the diagonal, in order.
// Shared: Q and dO (kept), K and V (per key tile).
template <int HD> __global__ void __launch_bounds__(tile_threads) flash_backward_q_kernel(backward_args a, shape s) {
  extern __shared__ __align__(16) unsigned char smem[];
  const backward_tiles<HD> tiles(smem);
  __nv_bfloat16 *qs = tiles.q, *dos = tiles.dout, *ks = tiles.k, *vs = tiles.v;
  __nv_bfloat16* __restrict__ dqkv = a.dqkv;
  const __nv_bfloat16* __restrict__ dout = a.dout, * __restrict__ qkv = a.qkv;
  const float* __restrict__ lse2 = a.lse2, * __restrict__ dsum = a.dsum;
  const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const place at(s, qkv);
  const int bh = at.bh, b = at.b, h = at.h, warp = at.warp, g = at.g, t = at.t;
  const std::size_t ld = at.ld;
  const __nv_bfloat16* base = at.base;
  const int q0 = qt * tile + warp * 16;

  load_tile<HD>(qs, base, ld, h * HD, qt * tile, s.T);
  load_tile<HD>(dos, dout + static_cast<std::size_t>(b) * s.T * s.C, static_cast<std::size_t>(s.C), h * HD, qt * tile,
                s.T);
  float lrow[2], drow[2];
  for (int r = 0; r < 2; ++r) {
    const int row = q0 + g + 8 * r;
    lrow[r] = row < s.T ? lse2[static_cast<std::size_t>(bh) * s.T + row] : INFINITY;
    drow[r] = row < s.T ? dsum[static_cast<std::size_t>(bh) * s.T + row] : 0.0f;
  }
  __syncthreads();
  std::uint32_t qa[HD / 16][4], doa[HD / 16][4];
  for (int kk = 0; kk < HD / 16; ++kk) {
    load_a<HD>(qa[kk], qs, warp * 16, kk * 16);
    load_a<HD>(doa[kk], dos, warp * 16, kk * 16);
  }
  float dq[HD / 8][4] = {};
  for (int kt = 0; kt <= qt; ++kt) {
    __syncthreads();
    load_tile<HD>(ks, base, ld, s.C + h * HD, kt * tile, s.T);
    load_tile<HD>(vs, base, ld, 2 * s.C + h * HD, kt * tile, s.T);
    __syncthreads();
    float p[tile / 8][4] = {};
    float dp[tile / 8][4] = {};
    for (int kk = 0; kk < HD / 16; ++kk) {
      for (int j = 0; j < tile / 8; ++j) {
        std::uint32_t b0, b1;
        load_b_t<HD>(b0, b1, ks, j * 8, kk * 16);
        mma(p[j], qa[kk], b0, b1); // S = Q · Kᵀ
        load_b_t<HD>(b0, b1, vs, j * 8, kk * 16);
        mma(dp[j], doa[kk], b0, b1); // dP = dO · Vᵀ
      }
    }
    for (int j = 0; j < tile / 8; ++j) {
      for (int e = 0; e < 4; ++e) {
        const int r = e / 2, row = q0 + g + 8 * r, col = kt * tile + j * 8 + 2 * t + e % 2;
        const float pv = (col > row || col >= s.T) ? 0.0f : exp2f(p[j][e] * s.scale_log2 - lrow[r]);
        dp[j][e] = pv * (dp[j][e] - drow[r]); // dS
      }
    }
    mma_tile<HD>(dq, dp, ks); // dQ += dS · K
  }
  store_rows<HD>(dqkv + static_cast<std::size_t>(b) * s.T * ld, ld, h * HD, q0, s.T, dq, s.scale, s.scale);
}

template <int HD> constexpr std::size_t forward_smem = 3 * tile_elems<HD> * sizeof(__nv_bfloat16);
template <int HD>
constexpr std::size_t backward_kv_smem = 4 * tile_elems<HD> * sizeof(__nv_bfloat16) + 2 * tile * sizeof(float);
template <int HD> constexpr std::size_t backward_q_smem = 4 * tile_elems<HD> * sizeof(__nv_bfloat16);

// Lets a kernel take `bytes` of dynamic shared memory past the default 48 KiB (HD 128). Set at every launch: the
// attribute is the current device's, and a process may drive several.
template <class Kernel> void allow_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024) {
    ZERO_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  }
}

shape make_shape(int T, int NH, int C) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(C / NH));
  return shape{T, NH, C, scale * log2e, scale};
}

void check(int B, int T, int NH, int C, const char* what) {
  if (B < 1 || T < 1 || NH < 1 || C % NH != 0 || !fused_attention_supports(C / NH) ||
      static_cast<long long>(B) * NH > 65535) {
    throw zero::usage_error(std::string("gpt kernels: ") + what + ": B " + std::to_string(B) + ", T " +
                            std::to_string(T) + ", heads " + std::to_string(NH) + ", C " + std::to_string(C) +
                            "; expected B, T >= 1, B * heads <= 65535 and a head size C / heads of 16, 32, 64 or 128");
  }
}

template <int HD> void forward(bf16* out, float* lse2, const bf16* qkv, int B, int T, int NH, int C, cudaStream_t st) {
  allow_smem(flash_forward_kernel<HD>, forward_smem<HD>);
  const dim3 grid(static_cast<unsigned>((T + tile - 1) / tile), static_cast<unsigned>(B * NH));
  flash_forward_kernel<HD>
      <<<grid, tile_threads, forward_smem<HD>, st>>>(dev(out), lse2, dev(qkv), make_shape(T, NH, C));
  ZERO_CHECK_CUDA(cudaGetLastError());
}

template <int HD>
void backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const float* lse2, const float* dsum, int B, int T, int NH,
              int C, cudaStream_t st) {
  allow_smem(flash_backward_kv_kernel<HD>, backward_kv_smem<HD>);
  allow_smem(flash_backward_q_kernel<HD>, backward_q_smem<HD>);
  const shape s = make_shape(T, NH, C);
  const dim3 grid(static_cast<unsigned>((T + tile - 1) / tile), static_cast<unsigned>(B * NH));
  const backward_args a{dev(dqkv), dev(dout), dev(qkv), lse2, dsum};
  flash_backward_kv_kernel<HD><<<grid, tile_threads, backward_kv_smem<HD>, st>>>(a, s);
  ZERO_CHECK_CUDA(cudaGetLastError());
  flash_backward_q_kernel<HD><<<grid, tile_threads, backward_q_smem<HD>, st>>>(a, s);
  ZERO_CHECK_CUDA(cudaGetLastError());
}

} // namespace

bool fused_attention_supports(int head_size) {
  return head_size == 16 || head_size == 32 || head_size == 64 || head_size == 128;
}

void fused_attention_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int C, cudaStream_t stream) {
  check(B, T, NH, C, "fused_attention_forward");
  switch (C / NH) {
  case 16:
    return forward<16>(out, lse, qkv, B, T, NH, C, stream);
  case 32:
    return forward<32>(out, lse, qkv, B, T, NH, C, stream);
  case 64:
    return forward<64>(out, lse, qkv, B, T, NH, C, stream);
  default:
    return forward<128>(out, lse, qkv, B, T, NH, C, stream);
  }
}

void fused_attention_backward(bf16* dqkv, float* dsum, const bf16* dout, const bf16* out, const bf16* qkv,
                              const float* lse, int B, int T, int NH, int C, cudaStream_t stream) {
  check(B, T, NH, C, "fused_attention_backward");
  const int HD = C / NH;
  const std::size_t warps = static_cast<std::size_t>(B) * T * NH;
  constexpr int dot_threads = 256;
  attention_dot_kernel<<<static_cast<unsigned>((warps * 32 + dot_threads - 1) / dot_threads), dot_threads, 0, stream>>>(
      dsum, dev(dout), dev(out), static_cast<std::size_t>(B) * T, T, NH, HD);
  ZERO_CHECK_CUDA(cudaGetLastError());
  switch (HD) {
  case 16:
    return backward<16>(dqkv, dout, qkv, lse, dsum, B, T, NH, C, stream);
  case 32:
    return backward<32>(dqkv, dout, qkv, lse, dsum, B, T, NH, C, stream);
  case 64:
    return backward<64>(dqkv, dout, qkv, lse, dsum, B, T, NH, C, stream);
  default:
    return backward<128>(dqkv, dout, qkv, lse, dsum, B, T, NH, C, stream);
  }
}

} // namespace gpt::kernels
