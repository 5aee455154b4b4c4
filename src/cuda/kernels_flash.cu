// src/cuda/kernels_flash.cu: fused attention, FlashAttention-2 (Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", Algorithms 1 and 2), for
// GPT-2's causal attention and T5's biased, masked attention alike (see kernels.hpp).
//
// No T x T matrix exists: forward keeps the output and the row logsumexp, backward recomputes
// the probabilities tile by tile. Two implementations of the same three kernels:
//  - tensor cores (nvcuda::wmma 16x16x16, bf16/fp16 in, fp32 accumulate; sm80+) for head
//    dims 64 and 128 with 16-bit storage: blocks of 4 warps, 64 queries x 64 keys per tile,
//    each warp owning 16 rows. Tiles of Q, K, V, dO are staged in shared memory; S and dP
//    go through shared memory in fp32 for the row-wise softmax (wmma fragments are opaque),
//    P and dS are rounded to the storage type for the second products (as flash-attention
//    does). Forward keeps O in shared memory (fp32) so that it can be rescaled by row.
//  - a plain tiled SIMT kernel (fp32 math, any head dim, any storage type) for fp32 and
//    other head dims: one warp per query (or key) row, lanes over keys (or queries) for the
//    dot products and over the head dim for the accumulations, tiles of 32 in shared memory.
// Kernels and launches per call (each a single launch, whatever B and H are):
//  - forward: 1 (flash_fwd).
//  - backward: 3: D_i = rowsum(dO * O) (flash_bwd_dot), dK and dV per key tile looping
//    over query tiles (flash_bwd_dkdv, accumulators in registers / shared memory), and dQ
//    per query tile looping over key tiles (flash_bwd_dq, a separate pass that recomputes
//    P and dS: no atomics, deterministic). With a bias gradient the dQ kernel's block owns
//    (head, query tile) and loops over the batch in order, adding dS into dbias (fp32) for
//    b = 0, 1, ...: every dbias element has one writer and a fixed order.
// Masking: key j is invisible to query i when j >= Tk, i >= Tq, key_mask[b, j] == 0, or
// causal and j > i; its score is -inf and its probability exactly 0. A row with no visible
// key gets out 0 and lse +inf (flash-attention's softmax.h), so exp(s - lse) = 0 in backward.
#include <mma.h>

#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

using namespace nvcuda;

// The problem as the kernels see it.
struct Dev {
  int64_t B, Tq, Tk, H, D;
  int64_t ldq, ldk, ldv, ldo;
  float scale;
  bool causal;
  const float* bias;        // [H,Tq,Tk] or null
  const int32_t* key_mask;  // [B,Tk] or null
  int64_t group;            // query heads per key/value head: head h reads k, v of h / group
};

Dev to_dev(const FlashProblem& p) {
  return {p.B,      p.Tq,   p.Tk,       p.H,    p.D,   p.ldq, p.ldk, p.ldv, p.ldo, p.scale,
          p.causal, p.bias, p.key_mask, p.group};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ bool visible(const Dev& p, int64_t b, int64_t i, int64_t j) {
  return i < p.Tq && j < p.Tk && !(p.causal && j > i) &&
         !(p.key_mask && p.key_mask[b * p.Tk + j] == 0);
}
// The score of a visible (i, j) from the raw dot product q_i . k_j.
__device__ __forceinline__ float score(const Dev& p, int64_t h, int64_t i, int64_t j, float dot) {
  return dot * p.scale + (p.bias ? p.bias[(h * p.Tq + i) * p.Tk + j] : 0.0f);
}
// Keys [0, end) that queries [i0, i0 + rows) may see.
__device__ __forceinline__ int64_t key_end(const Dev& p, int64_t i0, int64_t rows) {
  return p.causal ? imin(p.Tk, i0 + rows) : p.Tk;
}

// ---------------------------------------------------------------------------------------
// tensor-core kernels (T = __nv_bfloat16 or __half, D = 64 or 128)

constexpr int kTile = 64;  // queries per block tile = keys per key tile
constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;  // each warp owns 16 rows of a tile
static_assert(kTcWarps * 16 == kTile, "a warp per 16 rows");

// Shared-memory row strides, padded against bank conflicts while keeping every wmma
// fragment pointer 32-byte aligned (16-row offsets and 16-column offsets stay multiples
// of 32 bytes; strides multiples of 16 bytes).
template <int D>
struct TcLayout {
  static constexpr int ldh = D + 8;       // 16-bit [rows][D] tiles (Q, K, V, dO)
  static constexpr int lds = kTile + 4;   // fp32 [rows][64] (S, dP)
  static constexpr int ldp = kTile + 8;   // 16-bit [rows][64] (P, dS)
  static constexpr int ldo = D + 4;       // fp32 [rows][D] (O, staged results)
  static constexpr int half_tile = kTile * ldh;  // elements of one 16-bit [64][D] tile
  static constexpr int f32_tile = kTile * lds;   // floats of one fp32 [64][64] tile
  static constexpr int p_tile = kTile * ldp;     // elements of one 16-bit [64][64] tile
};

template <class T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <class T>
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst[r][c] (row stride ld_dst) = src row r (row stride ld_src), c < D, for r < valid; 0 for
// valid <= r < kTile. 16-byte accesses when `vec` (16-byte aligned rows), else elementwise.
template <class T, int D>
__device__ void load_tile(T* dst, int ld_dst, const T* src, int64_t ld_src, int64_t valid,
                          bool vec) {
  if (vec) {
    constexpr int per = 16 / sizeof(T), chunks = D / per;
    for (int idx = threadIdx.x; idx < kTile * chunks; idx += blockDim.x) {
      const int r = idx / chunks, c = (idx % chunks) * per;
      int4 val = make_int4(0, 0, 0, 0);
      if (r < valid) val = *reinterpret_cast<const int4*>(src + r * ld_src + c);
      *reinterpret_cast<int4*>(dst + r * ld_dst + c) = val;
    }
  } else {
    for (int idx = threadIdx.x; idx < kTile * D; idx += blockDim.x) {
      const int r = idx / D, c = idx % D;
      dst[r * ld_dst + c] = r < valid ? src[r * ld_src + c] : from_f<T>(0.0f);
    }
  }
}

// Warp w's 16 x 64 product tile into fp32 shared memory: out = A_w @ B^T, A_w = rows
// [16w, 16w+16) of a [64][D] 16-bit tile, B = a [64][D] 16-bit tile (so B^T is col-major).
template <class T, int D>
__device__ __forceinline__ void warp_abt(float* out, const T* a, const T* b, int w) {
  using L = TcLayout<D>;
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      FragA<T> fa;
      FragBCol<T> fb;
      wmma::load_matrix_sync(fa, a + 16 * w * L::ldh + 16 * kk, L::ldh);
      wmma::load_matrix_sync(fb, b + 16 * n * L::ldh + 16 * kk, L::ldh);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + 16 * w * L::lds + 16 * n, acc, L::lds, wmma::mem_row_major);
  }
}

// acc[n] += P_w @ V[:, 16n : 16n+16] for the warp's 16 rows: P_w = rows [16w, 16w+16) of a
// [64][64] 16-bit tile (row stride ldp), V a [64][D] 16-bit tile (row-major).
template <class T, int D>
__device__ __forceinline__ void warp_pv(FragC (&acc)[D / 16], const T* pt, const T* v, int w) {
  using L = TcLayout<D>;
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    FragA<T> fa;
    wmma::load_matrix_sync(fa, pt + 16 * w * L::ldp + 16 * kk, L::ldp);
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      FragBRow<T> fb;
      wmma::load_matrix_sync(fb, v + 16 * kk * L::ldh + 16 * n, L::ldh);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes the warp's 16 rows of acc * mul (rows [16w, 16w+16) of a tile starting at global
// row r0; rows >= valid skipped) to dst (row stride ld), staging through fp32 shared memory
// `stage` ([64][ldo]).
template <class T, int D>
__device__ void warp_store_rows(T* dst, int64_t ld, int64_t valid, FragC (&acc)[D / 16],
                                float mul, float* stage, int w, int lane) {
  using L = TcLayout<D>;
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
#pragma unroll
    for (int t = 0; t < acc[n].num_elements; ++t) acc[n].x[t] *= mul;
    wmma::store_matrix_sync(stage + 16 * w * L::ldo + 16 * n, acc[n], L::ldo, wmma::mem_row_major);
  }
  __syncwarp();
  for (int idx = lane; idx < 16 * D; idx += 32) {
    const int r = 16 * w + idx / D, e = idx % D;
    if (r < valid) dst[r * ld + e] = from_f<T>(stage[r * L::ldo + e]);
  }
}

// Forward. Block = (b, h, query tile); heaviest causal tiles first.
template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_fwd_tc(Dev p, const T* q, const T* k, const T* v, T* out, float* lse, int64_t nqt,
                 bool vec) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + L::half_tile;
  T* sV = sK + L::half_tile;
  float* sS = reinterpret_cast<float*>(sV + L::half_tile);
  T* sP = reinterpret_cast<T*>(sS + L::f32_tile);
  float* sO = reinterpret_cast<float*>(sP + L::p_tile);
  float* sM = sO + kTile * L::ldo;
  float* sL = sM + kTile;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / nqt, b = bh / p.H, h = bh % p.H;
  const int64_t hk = h / p.group;  // key/value head
  const int64_t i0 = tile * kTile, rows = imin(kTile, p.Tq - i0);
  load_tile<T, D>(sQ, L::ldh, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows, vec);
  for (int idx = threadIdx.x; idx < kTile * L::ldo; idx += blockDim.x) sO[idx] = 0.0f;
  for (int r = threadIdx.x; r < kTile; r += blockDim.x) {
    sM[r] = -INFINITY;
    sL[r] = 0.0f;
  }
  __syncthreads();  // also when no key tile follows
  const int64_t jend = key_end(p, i0, rows);
  // Lane pair (2r', 2r'+1) owns row r = 16w + lane/2: half the keys / head dims each.
  const int r = 16 * w + lane / 2, half = lane & 1;
  const int64_t i = i0 + r;
  for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
    const int64_t cols = imin(kTile, p.Tk - j0);
    __syncthreads();  // the previous tile's K, V are no longer read
    load_tile<T, D>(sK, L::ldh, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, cols, vec);
    load_tile<T, D>(sV, L::ldh, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, cols, vec);
    __syncthreads();
    warp_abt<T, D>(sS, sQ, sK, w);  // S_w = Q_w K^T (raw dot products)
    __syncwarp();
    float* srow = sS + r * L::lds;
    float mx = -INFINITY;
    for (int c = half * 32; c < half * 32 + 32; ++c) {
      const int64_t j = j0 + c;
      const float s = visible(p, b, i, j) ? score(p, h, i, j, srow[c]) : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, 1));
    const float m_old = sM[r], m_new = fmaxf(m_old, mx);
    float alpha = 1.0f, sum = 0.0f;
    T* prow = sP + r * L::ldp;
    if (m_new == -INFINITY) {  // no visible key yet: P = 0, O stays 0
      for (int c = half * 32; c < half * 32 + 32; ++c) prow[c] = from_f<T>(0.0f);
    } else {
      alpha = __expf(m_old - m_new);  // 0 when m_old = -inf
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const float s = srow[c];
        const float e = s == -INFINITY ? 0.0f : __expf(s - m_new);
        prow[c] = from_f<T>(e);
        sum += e;
      }
    }
    sum += __shfl_xor_sync(kFullMask, sum, 1);
    if (alpha != 1.0f) {
      float* orow = sO + r * L::ldo;
      for (int e = half * (D / 2); e < half * (D / 2) + D / 2; ++e) orow[e] *= alpha;
    }
    __syncwarp();  // both lanes of the pair have read sM[r], sL[r]; P and O are in place
    if (half == 0) {
      sM[r] = m_new;
      sL[r] = sL[r] * alpha + sum;
    }
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::load_matrix_sync(acc[n], sO + 16 * w * L::ldo + 16 * n, L::ldo, wmma::mem_row_major);
    }
    warp_pv<T, D>(acc, sP, sV, w);  // O_w += P_w V
#pragma unroll
    for (int n = 0; n < D / 16; ++n) {
      wmma::store_matrix_sync(sO + 16 * w * L::ldo + 16 * n, acc[n], L::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }
  __syncwarp();
  // out = O / l (0 for a row without keys), lse = m + log l (+inf).
  T* ob = out + (b * p.Tq + i0) * p.ldo + h * D;
  for (int idx = lane; idx < 16 * D; idx += 32) {
    const int rr = 16 * w + idx / D, e = idx % D;
    if (rr >= rows) continue;
    const float m = sM[rr];
    ob[rr * p.ldo + e] = from_f<T>(m == -INFINITY ? 0.0f : sO[rr * L::ldo + e] / sL[rr]);
  }
  if (lane < 16) {
    const int rr = 16 * w + lane;
    if (rr < rows) {
      const float m = sM[rr];
      lse[bh * p.Tq + i0 + rr] = m == -INFINITY ? INFINITY : m + logf(sL[rr]);
    }
  }
}

template <int D>
constexpr std::size_t tc_fwd_smem(std::size_t t_size) {
  using L = TcLayout<D>;
  return (3 * L::half_tile + L::p_tile) * t_size +
         (L::f32_tile + kTile * L::ldo + 2 * kTile) * sizeof(float);
}

// Backward, dK and dV. Block = (b, key/value head g, key tile); warp w owns keys
// [16w, 16w+16) of the tile and keeps their dK, dV in registers over the query heads of the
// group (ascending) and their query tiles. Works on transposed tiles: S^T = K Q^T,
// dP^T = V dO^T, then dV += P^T dO, dK += dS^T Q.
template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_bwd_dkdv_tc(Dev p, const T* q, const T* k, const T* v, const T* dout,
                      const float* lse, const float* di, T* dk, T* dv, int64_t nkt, bool vec) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + L::half_tile;
  T* sQ = sV + L::half_tile;
  T* sdO = sQ + L::half_tile;  // sQ and sdO (contiguous) are the fp32 staging area at the end
  float* sS = reinterpret_cast<float*>(sdO + L::half_tile);  // S^T [keys][queries]
  float* sdP = sS + L::f32_tile;
  T* sP = reinterpret_cast<T*>(sdP + L::f32_tile);
  T* sdS = sP + L::p_tile;
  float* sLse = reinterpret_cast<float*>(sdS + L::p_tile);
  float* sDi = sLse + kTile;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) % nkt;
  const int64_t hkv = p.H / p.group;
  const int64_t bg = static_cast<int64_t>(blockIdx.x) / nkt, b = bg / hkv, hk = bg % hkv;
  const int64_t j0 = tile * kTile, cols = imin(kTile, p.Tk - j0);
  load_tile<T, D>(sK, L::ldh, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, cols, vec);
  load_tile<T, D>(sV, L::ldh, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, cols, vec);
  FragC acc_dk[D / 16], acc_dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(acc_dk[n], 0.0f);
    wmma::fill_fragment(acc_dv[n], 0.0f);
  }
  const int rr = 16 * w + lane / 2, half = lane & 1;  // the lane pair's key row
  const int64_t j = j0 + rr;
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const int64_t bh = b * p.H + h;
    // Causal: queries i < j0 see none of these keys.
    for (int64_t i0 = p.causal ? j0 : 0; i0 < p.Tq; i0 += kTile) {
      const int64_t rows = imin(kTile, p.Tq - i0);
      __syncthreads();  // the previous query tile is no longer read
      load_tile<T, D>(sQ, L::ldh, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows, vec);
      load_tile<T, D>(sdO, L::ldh, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, rows, vec);
      for (int c = threadIdx.x; c < kTile; c += blockDim.x) {
        sLse[c] = c < rows ? lse[bh * p.Tq + i0 + c] : INFINITY;
        sDi[c] = c < rows ? di[bh * p.Tq + i0 + c] : 0.0f;
      }
      __syncthreads();
      warp_abt<T, D>(sS, sK, sQ, w);    // S^T_w = K_w Q^T
      warp_abt<T, D>(sdP, sV, sdO, w);  // dP^T_w = V_w dO^T
      __syncwarp();
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int64_t i = i0 + c;
        float pr = 0.0f, ds = 0.0f;
        if (visible(p, b, i, j)) {
          pr = __expf(score(p, h, i, j, sS[rr * L::lds + c]) - sLse[c]);
          ds = pr * (sdP[rr * L::lds + c] - sDi[c]);
        }
        sP[rr * L::ldp + c] = from_f<T>(pr);
        sdS[rr * L::ldp + c] = from_f<T>(ds);
      }
      __syncwarp();
      warp_pv<T, D>(acc_dv, sP, sdO, w);  // dV_w += P^T_w dO
      warp_pv<T, D>(acc_dk, sdS, sQ, w);  // dK_w += dS^T_w Q (scaled at the end)
    }
  }  // query heads of the group
  __syncthreads();  // every warp is done with sQ, sdO: they become the fp32 staging area
  float* stage = reinterpret_cast<float*>(sQ);
  warp_store_rows<T, D>(dk + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, cols, acc_dk, p.scale,
                        stage, w, lane);
  __syncwarp();
  warp_store_rows<T, D>(dv + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, cols, acc_dv, 1.0f, stage,
                        w, lane);
}

template <int D>
constexpr std::size_t tc_dkdv_smem(std::size_t t_size) {
  using L = TcLayout<D>;
  return (4 * L::half_tile + 2 * L::p_tile) * t_size + (2 * L::f32_tile + 2 * kTile) * sizeof(float);
}

// Backward, dQ (and dbias). Block = (b, h, query tile), or with dbias (h, query tile) looping
// over b = 0..B-1 in order; warp w owns queries [16w, 16w+16) and keeps their dQ in
// registers over the key tiles.
template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_bwd_dq_tc(Dev p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                    const float* di, T* dq, float* dbias, int64_t nqt, bool vec) {
  using L = TcLayout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + L::half_tile;
  T* sK = sdO + L::half_tile;
  T* sV = sK + L::half_tile;
  float* sS = reinterpret_cast<float*>(sV + L::half_tile);  // sS and sdP: the fp32 staging area
  float* sdP = sS + L::f32_tile;
  T* sdS = reinterpret_cast<T*>(sdP + L::f32_tile);
  float* sLse = reinterpret_cast<float*>(sdS + L::p_tile);
  float* sDi = sLse + kTile;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t g = static_cast<int64_t>(blockIdx.x) / nqt;
  const int64_t h = dbias ? g : g % p.H;
  const int64_t b_begin = dbias ? 0 : g / p.H, b_end = dbias ? p.B : b_begin + 1;
  const int64_t i0 = tile * kTile, rows = imin(kTile, p.Tq - i0);
  const int64_t jend = key_end(p, i0, rows);
  const int r = 16 * w + lane / 2, half = lane & 1;  // the lane pair's query row
  const int64_t i = i0 + r;
  const int64_t hk = h / p.group;  // key/value head
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t bh = b * p.H + h;
    __syncthreads();  // the previous batch row's tiles and staging are no longer read
    load_tile<T, D>(sQ, L::ldh, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows, vec);
    load_tile<T, D>(sdO, L::ldh, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, rows, vec);
    for (int c = threadIdx.x; c < kTile; c += blockDim.x) {
      sLse[c] = c < rows ? lse[bh * p.Tq + i0 + c] : INFINITY;
      sDi[c] = c < rows ? di[bh * p.Tq + i0 + c] : 0.0f;
    }
    FragC acc[D / 16];
#pragma unroll
    for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(acc[n], 0.0f);
    for (int64_t j0 = 0; j0 < jend; j0 += kTile) {
      const int64_t cols = imin(kTile, p.Tk - j0);
      __syncthreads();  // the previous K, V are no longer read (and sQ, sdO, sLse, sDi are in)
      load_tile<T, D>(sK, L::ldh, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, cols, vec);
      load_tile<T, D>(sV, L::ldh, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, cols, vec);
      __syncthreads();
      warp_abt<T, D>(sS, sQ, sK, w);    // S_w = Q_w K^T
      warp_abt<T, D>(sdP, sdO, sV, w);  // dP_w = dO_w V^T
      __syncwarp();
      const float lse_r = sLse[r], di_r = sDi[r];
      for (int c = half * 32; c < half * 32 + 32; ++c) {
        const int64_t j = j0 + c;
        float ds = 0.0f;
        if (visible(p, b, i, j)) {
          const float pr = __expf(score(p, h, i, j, sS[r * L::lds + c]) - lse_r);
          ds = pr * (sdP[r * L::lds + c] - di_r);
          if (dbias) dbias[(h * p.Tq + i) * p.Tk + j] += ds;
        }
        sdS[r * L::ldp + c] = from_f<T>(ds);
      }
      __syncwarp();
      warp_pv<T, D>(acc, sdS, sK, w);  // dQ_w += dS_w K (scaled at the end)
    }
    __syncthreads();  // every warp is done with sS, sdP: they become the fp32 staging area
    warp_store_rows<T, D>(dq + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows, acc, p.scale, sS, w,
                          lane);
  }
}

template <int D>
constexpr std::size_t tc_dq_smem(std::size_t t_size) {
  using L = TcLayout<D>;
  return (4 * L::half_tile + L::p_tile) * t_size + (2 * L::f32_tile + 2 * kTile) * sizeof(float);
}

// The fp32 staging areas reused above must hold [64][D + 4] floats.
static_assert(2 * TcLayout<64>::half_tile * 2 >= kTile * TcLayout<64>::ldo * 4, "dkdv staging");
static_assert(2 * TcLayout<128>::half_tile * 2 >= kTile * TcLayout<128>::ldo * 4, "dkdv staging");
static_assert(2 * TcLayout<64>::f32_tile >= kTile * TcLayout<64>::ldo, "dq staging");
static_assert(2 * TcLayout<128>::f32_tile >= kTile * TcLayout<128>::ldo, "dq staging");

// ---------------------------------------------------------------------------------------
// SIMT kernels: fp32 math on CUDA cores, any storage type, any head dim

constexpr int kRowsPerBlock = 8;  // warps per block, one row (query or key) each
constexpr int kSimtThreads = 32 * kRowsPerBlock;
constexpr int kSimtTile = 32;     // keys (or queries) per shared-memory tile, one per lane

// dst[r][e] (row stride ld_dst floats) = src row r (row stride ld_src), e < D, for r < valid;
// 0 for valid <= r < rows.
template <class T>
__device__ void load_rows_f32(float* dst, int64_t ld_dst, const T* src, int64_t ld_src,
                              int64_t D, int64_t rows, int64_t valid) {
  for (int64_t idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int64_t r = idx / D, e = idx % D;
    dst[r * ld_dst + e] = r < valid ? to_f(src[r * ld_src + e]) : 0.0f;
  }
}

// Forward. Block = (b, h, 8 queries), a warp per query; lanes are the keys of a 32-key tile.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_fwd_simt(Dev p, const T* q, const T* k, const T* v, T* out, float* lse, int64_t nqt) {
  extern __shared__ float fsm[];
  const int64_t D = p.D, ldt = D + 1;  // +1: lanes read rows of sK without bank conflicts
  float* sK = fsm;                     // [32][D+1]
  float* sV = sK + kSimtTile * ldt;    // [32][D+1]
  float* sQ = sV + kSimtTile * ldt;    // [8][D]
  float* sO = sQ + kRowsPerBlock * D;  // [8][D]
  float* sP = sO + kRowsPerBlock * D;  // [8][32]
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / nqt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = tile * kRowsPerBlock, rows = imin(kRowsPerBlock, p.Tq - i0);
  const int64_t i = i0 + w, hk = h / p.group;
  load_rows_f32(sQ, D, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, D, kRowsPerBlock, rows);
  for (int64_t idx = threadIdx.x; idx < kRowsPerBlock * D; idx += blockDim.x) sO[idx] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const float* qw = sQ + w * D;
  float* ow = sO + w * D;
  float* pw = sP + w * kSimtTile;
  const int64_t jend = key_end(p, i0, rows);
  for (int64_t j0 = 0; j0 < jend; j0 += kSimtTile) {
    const int64_t cols = imin(kSimtTile, p.Tk - j0);
    __syncthreads();
    load_rows_f32(sK, ldt, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, D, kSimtTile, cols);
    load_rows_f32(sV, ldt, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, D, kSimtTile, cols);
    __syncthreads();
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (visible(p, b, i, j)) {
      float dot = 0.0f;
      for (int64_t e = 0; e < D; ++e) dot += qw[e] * sK[lane * ldt + e];
      s = score(p, h, i, j, dot);
    }
    const float m_new = fmaxf(m, warp_max(s));
    float alpha = 1.0f, pr = 0.0f;
    if (m_new != -INFINITY) {
      alpha = expf(m - m_new);
      pr = s == -INFINITY ? 0.0f : expf(s - m_new);
    }
    l = l * alpha + warp_sum(pr);
    m = m_new;
    pw[lane] = pr;
    __syncwarp();
    for (int64_t e = lane; e < D; e += 32) {
      float o = ow[e] * alpha;
      for (int c = 0; c < kSimtTile; ++c) o += pw[c] * sV[c * ldt + e];
      ow[e] = o;
    }
    __syncwarp();
  }
  if (i >= p.Tq) return;  // no __syncthreads below
  T* orow = out + (b * p.Tq + i) * p.ldo + h * D;
  for (int64_t e = lane; e < D; e += 32) orow[e] = from_f<T>(m == -INFINITY ? 0.0f : ow[e] / l);
  if (lane == 0) lse[bh * p.Tq + i] = m == -INFINITY ? INFINITY : m + logf(l);
}

std::size_t simt_fwd_smem(int64_t D) {
  return static_cast<std::size_t>(2 * kSimtTile * (D + 1) + 2 * kRowsPerBlock * D +
                                  kRowsPerBlock * kSimtTile) *
         sizeof(float);
}

// Backward, dK and dV. Block = (b, key/value head g, 8 keys), a warp per key; lanes are the
// queries of a 32-query tile; the group's query heads in ascending order, then their tiles.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dkdv_simt(Dev p, const T* q, const T* k, const T* v, const T* dout,
                        const float* lse, const float* di, T* dk, T* dv, int64_t nkt) {
  extern __shared__ float fsm[];
  const int64_t D = p.D, ldt = D + 1;
  float* sQ = fsm;                        // [32][D+1]
  float* sdO = sQ + kSimtTile * ldt;      // [32][D+1]
  float* sK = sdO + kSimtTile * ldt;      // [8][D]
  float* sV = sK + kRowsPerBlock * D;     // [8][D]
  float* sdK = sV + kRowsPerBlock * D;    // [8][D]
  float* sdV = sdK + kRowsPerBlock * D;   // [8][D]
  float* sP = sdV + kRowsPerBlock * D;    // [8][32]
  float* sdS = sP + kRowsPerBlock * kSimtTile;  // [8][32]
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) % nkt;
  const int64_t hkv = p.H / p.group;
  const int64_t bg = static_cast<int64_t>(blockIdx.x) / nkt, b = bg / hkv, hk = bg % hkv;
  const int64_t j0 = tile * kRowsPerBlock, cols = imin(kRowsPerBlock, p.Tk - j0);
  const int64_t j = j0 + w;
  load_rows_f32(sK, D, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, D, kRowsPerBlock, cols);
  load_rows_f32(sV, D, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, D, kRowsPerBlock, cols);
  for (int64_t idx = threadIdx.x; idx < kRowsPerBlock * D; idx += blockDim.x) {
    sdK[idx] = 0.0f;
    sdV[idx] = 0.0f;
  }
  const float* kw = sK + w * D;
  const float* vw = sV + w * D;
  float* dkw = sdK + w * D;
  float* dvw = sdV + w * D;
  float* pw = sP + w * kSimtTile;
  float* dsw = sdS + w * kSimtTile;
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const int64_t bh = b * p.H + h;
    // Causal: queries i < j0 see none of these keys.
    for (int64_t i0 = p.causal ? j0 / kSimtTile * kSimtTile : 0; i0 < p.Tq; i0 += kSimtTile) {
      const int64_t rows = imin(kSimtTile, p.Tq - i0);
      __syncthreads();
      load_rows_f32(sQ, ldt, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, D, kSimtTile, rows);
      load_rows_f32(sdO, ldt, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, D, kSimtTile, rows);
      __syncthreads();
      const int64_t i = i0 + lane;
      float pr = 0.0f, ds = 0.0f;
      if (visible(p, b, i, j)) {
        float dot = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; ++e) {
          dot += sQ[lane * ldt + e] * kw[e];
          dp += sdO[lane * ldt + e] * vw[e];
        }
        pr = expf(score(p, h, i, j, dot) - lse[bh * p.Tq + i]);
        ds = pr * (dp - di[bh * p.Tq + i]);
      }
      pw[lane] = pr;
      dsw[lane] = ds;
      __syncwarp();
      for (int64_t e = lane; e < D; e += 32) {
        float gv = dvw[e], gk = dkw[e];
        for (int c = 0; c < kSimtTile; ++c) {
          gv += pw[c] * sdO[c * ldt + e];
          gk += dsw[c] * sQ[c * ldt + e];
        }
        dvw[e] = gv;
        dkw[e] = gk;
      }
      __syncwarp();
    }
  }  // query heads of the group
  if (j >= p.Tk) return;
  T* gk = dk + (b * p.Tk + j) * p.ldk + hk * D;
  T* gv = dv + (b * p.Tk + j) * p.ldv + hk * D;
  for (int64_t e = lane; e < D; e += 32) {
    gk[e] = from_f<T>(dkw[e] * p.scale);
    gv[e] = from_f<T>(dvw[e]);
  }
}

std::size_t simt_dkdv_smem(int64_t D) {
  return static_cast<std::size_t>(2 * kSimtTile * (D + 1) + 4 * kRowsPerBlock * D +
                                  2 * kRowsPerBlock * kSimtTile) *
         sizeof(float);
}

// Backward, dQ (and dbias). Block = (b, h, 8 queries), or with dbias (h, 8 queries) looping
// over b in order; a warp per query, lanes are the keys of a 32-key tile.
template <class T>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dq_simt(Dev p, const T* q, const T* k, const T* v, const T* dout,
                      const float* lse, const float* di, T* dq, float* dbias, int64_t nqt) {
  extern __shared__ float fsm[];
  const int64_t D = p.D, ldt = D + 1;
  float* sK = fsm;                        // [32][D+1]
  float* sV = sK + kSimtTile * ldt;       // [32][D+1]
  float* sQ = sV + kSimtTile * ldt;       // [8][D]
  float* sdO = sQ + kRowsPerBlock * D;    // [8][D]
  float* sdQ = sdO + kRowsPerBlock * D;   // [8][D]
  float* sdS = sdQ + kRowsPerBlock * D;   // [8][32]
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t g = static_cast<int64_t>(blockIdx.x) / nqt;
  const int64_t h = dbias ? g : g % p.H;
  const int64_t b_begin = dbias ? 0 : g / p.H, b_end = dbias ? p.B : b_begin + 1;
  const int64_t i0 = tile * kRowsPerBlock, rows = imin(kRowsPerBlock, p.Tq - i0);
  const int64_t i = i0 + w, jend = key_end(p, i0, rows);
  const float* qw = sQ + w * D;
  const float* dow = sdO + w * D;
  float* dqw = sdQ + w * D;
  float* dsw = sdS + w * kSimtTile;
  const int64_t hk = h / p.group;  // key/value head
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t bh = b * p.H + h;
    __syncthreads();
    load_rows_f32(sQ, D, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, D, kRowsPerBlock, rows);
    load_rows_f32(sdO, D, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, D, kRowsPerBlock, rows);
    for (int64_t idx = threadIdx.x; idx < kRowsPerBlock * D; idx += blockDim.x) sdQ[idx] = 0.0f;
    const float lse_i = i < p.Tq ? lse[bh * p.Tq + i] : INFINITY;
    const float di_i = i < p.Tq ? di[bh * p.Tq + i] : 0.0f;
    for (int64_t j0 = 0; j0 < jend; j0 += kSimtTile) {
      const int64_t cols = imin(kSimtTile, p.Tk - j0);
      __syncthreads();
      load_rows_f32(sK, ldt, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, D, kSimtTile, cols);
      load_rows_f32(sV, ldt, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, D, kSimtTile, cols);
      __syncthreads();
      const int64_t j = j0 + lane;
      float ds = 0.0f;
      if (visible(p, b, i, j)) {
        float dot = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; ++e) {
          dot += qw[e] * sK[lane * ldt + e];
          dp += dow[e] * sV[lane * ldt + e];
        }
        ds = expf(score(p, h, i, j, dot) - lse_i) * (dp - di_i);
        if (dbias) dbias[(h * p.Tq + i) * p.Tk + j] += ds;
      }
      dsw[lane] = ds;
      __syncwarp();
      for (int64_t e = lane; e < D; e += 32) {
        float g2 = dqw[e];
        for (int c = 0; c < kSimtTile; ++c) g2 += dsw[c] * sK[c * ldt + e];
        dqw[e] = g2;
      }
      __syncwarp();
    }
    if (i < p.Tq) {
      T* gq = dq + (b * p.Tq + i) * p.ldq + h * D;
      for (int64_t e = lane; e < D; e += 32) gq[e] = from_f<T>(dqw[e] * p.scale);
    }
  }
}

std::size_t simt_dq_smem(int64_t D) {
  return static_cast<std::size_t>(2 * kSimtTile * (D + 1) + 3 * kRowsPerBlock * D +
                                  kRowsPerBlock * kSimtTile) *
         sizeof(float);
}

// di[(b*H + h)*Tq + i] = sum_e dout * out over head h's D columns of row (b, i); a warp a row.
template <class T>
__global__ void __launch_bounds__(256)
    flash_bwd_dot(Dev p, const T* dout, const T* out, float* di) {
  const int64_t rows = p.B * p.H * p.Tq;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps) {
    const int64_t i = r % p.Tq, bh = r / p.Tq, b = bh / p.H, h = bh % p.H;
    const T* d = dout + (b * p.Tq + i) * p.ldo + h * p.D;
    const T* o = out + (b * p.Tq + i) * p.ldo + h * p.D;
    float acc = 0.0f;
    for (int64_t e = lane; e < p.D; e += 32) acc += to_f(d[e]) * to_f(o[e]);
    acc = warp_sum(acc);
    if (lane == 0) di[r] = acc;
  }
}

// ---------------------------------------------------------------------------------------
// register-level tensor-core kernels (mma.sync), the default 16-bit path

#include "kernels_flash_mma.cuh"

// ---------------------------------------------------------------------------------------
// launch helpers

// Sets the dynamic shared memory of `kernel` to `bytes` (opting in above 48 KiB); throws
// when the device allows less.
template <class K>
void set_smem(K kernel, std::size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  int device = 0, max_smem = 0;
  FSDP_CHECK_CUDA(cudaGetDevice(&device));
  FSDP_CHECK_CUDA(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(max_smem)) {
    throw Error(std::string("cuda backend: ") + what + ": the head dim needs " +
                std::to_string(bytes) + " bytes of shared memory per block (the device allows " +
                std::to_string(max_smem) + ")");
  }
  FSDP_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

unsigned grid_for(int64_t blocks, const char* what) {
  if (blocks > 0x7fffffff) {
    throw Error(std::string("cuda backend: ") + what + ": " + std::to_string(blocks) +
                " blocks exceed the launch grid");
  }
  return static_cast<unsigned>(blocks);
}

// group >= 1 dividing H (the backend's argument checks guarantee it; a bad group would read
// outside k, v).
void check_group(const FlashProblem& p, const char* what) {
  if (p.group < 1 || p.H % p.group != 0) {
    throw Error(std::string("cuda backend: ") + what + ": " + std::to_string(p.H) +
                " query heads in groups of " + std::to_string(p.group));
  }
}

// The tensor-core path: 16-bit storage and head dim 64 or 128.
bool use_tensor_cores(const FlashProblem& p) {
  return (p.t == ST::bf16 || p.t == ST::f16) && (p.D == 64 || p.D == 128);
}
// 16-byte tile loads: every row start 16-byte aligned.
bool rows_aligned(const FlashProblem& p, std::initializer_list<const void*> ptrs) {
  for (const void* x : ptrs) {
    if (!aligned16(x)) return false;
  }
  const int64_t per = 16 / static_cast<int64_t>(st_size(p.t));
  return p.ldq % per == 0 && p.ldk % per == 0 && p.ldv % per == 0 && p.ldo % per == 0 &&
         p.D % per == 0;
}

// f(Tag<T>, Int<D>) for the tensor-core instantiations.
template <int V>
struct Int {
  static constexpr int value = V;
};
template <class F>
void dispatch_tc(const FlashProblem& p, F&& f) {
  auto by_d = [&](auto tag) {
    if (p.D == 64) {
      f(tag, Int<64>{});
    } else {
      f(tag, Int<128>{});
    }
  };
  if (p.t == ST::bf16) {
    by_d(Tag<__nv_bfloat16>{});
  } else {
    by_d(Tag<__half>{});
  }
}

}  // namespace

void flash_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                   float* lse, cudaStream_t s) {
  if (p.B <= 0 || p.H <= 0 || p.Tq <= 0) return;
  check_group(p, "attention forward");
  const Dev d = to_dev(p);
  if (use_tensor_cores(p)) {
    const bool vec = rows_aligned(p, {q, k, v, out});
    if (vec && fsdp::cuda::attention_kernel() == AttentionKernel::mma) {
      dispatch_tc(p, [&](auto tag, auto dim) {
        using T = typename decltype(tag)::type;
        constexpr int D = decltype(dim)::value;
        const int64_t nqt = (p.Tq + mma_path::kRows - 1) / mma_path::kRows;
        const std::size_t smem = mma_path::fwd_smem<D>(sizeof(T));
        set_smem(mma_path::flash_fwd<T, D>, smem, "attention forward");
        mma_path::flash_fwd<T, D>
            <<<grid_for(p.B * p.H * nqt, "attention forward"), mma_path::kThreads, smem, s>>>(
                d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                static_cast<T*>(out), lse, nqt);
        FSDP_CHECK_LAUNCH();
      });
      return;
    }
    dispatch_tc(p, [&](auto tag, auto dim) {
      using T = typename decltype(tag)::type;
      constexpr int D = decltype(dim)::value;
      const int64_t nqt = (p.Tq + kTile - 1) / kTile;
      const std::size_t smem = tc_fwd_smem<D>(sizeof(T));
      set_smem(flash_fwd_tc<T, D>, smem, "attention forward");
      flash_fwd_tc<T, D><<<grid_for(p.B * p.H * nqt, "attention forward"), kTcThreads, smem, s>>>(
          d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<T*>(out), lse, nqt, vec);
      FSDP_CHECK_LAUNCH();
    });
    return;
  }
  dispatch_float("attention forward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t nqt = (p.Tq + kRowsPerBlock - 1) / kRowsPerBlock;
    const std::size_t smem = simt_fwd_smem(p.D);
    set_smem(flash_fwd_simt<T>, smem, "attention forward");
    flash_fwd_simt<T><<<grid_for(p.B * p.H * nqt, "attention forward"), kSimtThreads, smem, s>>>(
        d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), lse, nqt);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t flash_backward_scratch_floats(const FlashProblem& p) { return p.B * p.H * p.Tq; }

void flash_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                    const void* out, const float* lse, const void* dout, void* dq, void* dk,
                    void* dv, float* dbias, float* scratch, cudaStream_t s) {
  if (p.B <= 0 || p.H <= 0 || p.D <= 0) return;  // nothing to write; dS = 0 adds nothing
  check_group(p, "attention backward");
  const Dev d = to_dev(p);
  const int64_t hkv = p.H / p.group;  // the dK/dV kernels' blocks are (b, kv head, key tile)
  float* di = scratch;
  dispatch_float("attention backward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.Tq > 0) {
      flash_bwd_dot<T><<<blocks_for(p.B * p.H * p.Tq, 8), 256, 0, s>>>(
          d, static_cast<const T*>(dout), static_cast<const T*>(out), di);
      FSDP_CHECK_LAUNCH();
    }
  });
  if (use_tensor_cores(p)) {
    const bool vec = rows_aligned(p, {q, k, v, out, dout, dq, dk, dv});
    if (vec && fsdp::cuda::attention_kernel() == AttentionKernel::mma) {
      dispatch_tc(p, [&](auto tag, auto dim) {
        using T = typename decltype(tag)::type;
        constexpr int D = decltype(dim)::value;
        const auto* qt = static_cast<const T*>(q);
        const auto* kt = static_cast<const T*>(k);
        const auto* vt = static_cast<const T*>(v);
        const auto* dot = static_cast<const T*>(dout);
        if (p.Tk > 0) {
          const int64_t nkt = (p.Tk + mma_path::kRows - 1) / mma_path::kRows;
          const std::size_t smem = mma_path::dkdv_smem<D>(sizeof(T));
          set_smem(mma_path::flash_bwd_dkdv<T, D>, smem, "attention backward");
          mma_path::flash_bwd_dkdv<T, D>
              <<<grid_for(p.B * hkv * nkt, "attention backward"), mma_path::kThreads, smem, s>>>(
                  d, qt, kt, vt, dot, lse, di, static_cast<T*>(dk), static_cast<T*>(dv), nkt);
          FSDP_CHECK_LAUNCH();
        }
        if (p.Tq > 0) {
          const int64_t nqt = (p.Tq + mma_path::kRows - 1) / mma_path::kRows;
          const std::size_t smem = mma_path::dq_smem<D>(sizeof(T));
          set_smem(mma_path::flash_bwd_dq<T, D>, smem, "attention backward");
          const int64_t blocks = (dbias ? p.H : p.B * p.H) * nqt;
          mma_path::flash_bwd_dq<T, D>
              <<<grid_for(blocks, "attention backward"), mma_path::kThreads, smem, s>>>(
                  d, qt, kt, vt, dot, lse, di, static_cast<T*>(dq), dbias, nqt);
          FSDP_CHECK_LAUNCH();
        }
      });
      return;
    }
    dispatch_tc(p, [&](auto tag, auto dim) {
      using T = typename decltype(tag)::type;
      constexpr int D = decltype(dim)::value;
      if (p.Tk > 0) {
        const int64_t nkt = (p.Tk + kTile - 1) / kTile;
        const std::size_t smem = tc_dkdv_smem<D>(sizeof(T));
        set_smem(flash_bwd_dkdv_tc<T, D>, smem, "attention backward");
        flash_bwd_dkdv_tc<T, D>
            <<<grid_for(p.B * hkv * nkt, "attention backward"), kTcThreads, smem, s>>>(
                d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                static_cast<const T*>(dout), lse, di, static_cast<T*>(dk), static_cast<T*>(dv),
                nkt, vec);
        FSDP_CHECK_LAUNCH();
      }
      if (p.Tq > 0) {
        const int64_t nqt = (p.Tq + kTile - 1) / kTile;
        const std::size_t smem = tc_dq_smem<D>(sizeof(T));
        set_smem(flash_bwd_dq_tc<T, D>, smem, "attention backward");
        const int64_t blocks = (dbias ? p.H : p.B * p.H) * nqt;
        flash_bwd_dq_tc<T, D><<<grid_for(blocks, "attention backward"), kTcThreads, smem, s>>>(
            d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
            static_cast<const T*>(dout), lse, di, static_cast<T*>(dq), dbias, nqt, vec);
        FSDP_CHECK_LAUNCH();
      }
    });
    return;
  }
  dispatch_float("attention backward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.Tk > 0) {
      const int64_t nkt = (p.Tk + kRowsPerBlock - 1) / kRowsPerBlock;
      const std::size_t smem = simt_dkdv_smem(p.D);
      set_smem(flash_bwd_dkdv_simt<T>, smem, "attention backward");
      flash_bwd_dkdv_simt<T>
          <<<grid_for(p.B * hkv * nkt, "attention backward"), kSimtThreads, smem, s>>>(
              d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
              static_cast<const T*>(dout), lse, di, static_cast<T*>(dk), static_cast<T*>(dv), nkt);
      FSDP_CHECK_LAUNCH();
    }
    if (p.Tq > 0) {
      const int64_t nqt = (p.Tq + kRowsPerBlock - 1) / kRowsPerBlock;
      const std::size_t smem = simt_dq_smem(p.D);
      set_smem(flash_bwd_dq_simt<T>, smem, "attention backward");
      const int64_t blocks = (dbias ? p.H : p.B * p.H) * nqt;
      flash_bwd_dq_simt<T><<<grid_for(blocks, "attention backward"), kSimtThreads, smem, s>>>(
          d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<const T*>(dout), lse, di, static_cast<T*>(dq), dbias, nqt);
      FSDP_CHECK_LAUNCH();
    }
  });
}

}  // namespace fsdp::cuda::kernels

namespace fsdp::cuda {
namespace {
AttentionKernel initial_attention_kernel() {
  const char* env = std::getenv("FSDP_ATTENTION_KERNEL");
  if (env == nullptr || *env == '\0' || std::string(env) == "mma") return AttentionKernel::mma;
  if (std::string(env) == "wmma") return AttentionKernel::wmma;
  throw Error(std::string("FSDP_ATTENTION_KERNEL=") + env + ": expected mma or wmma");
}
std::atomic<AttentionKernel>& attention_kernel_setting() {
  static std::atomic<AttentionKernel> setting{initial_attention_kernel()};
  return setting;
}
}  // namespace

AttentionKernel attention_kernel() { return attention_kernel_setting().load(); }
void set_attention_kernel(AttentionKernel k) { attention_kernel_setting().store(k); }
}  // namespace fsdp::cuda
