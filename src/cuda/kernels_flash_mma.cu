// src/cuda/kernels_flash_mma.cu: the register-level FlashAttention-2 kernels (Dao 2023,
// Algorithms 1 and 2), the tensor-core path for 16-bit storage (bf16/fp16 in, fp32
// accumulate; sm80+), head dim 64 or 128, and 16-byte-aligned rows (mma_fits); Dev, the
// masking and the launch helpers come from kernels_flash.cuh.
//
// Why mma.sync and not nvcuda::wmma: wmma fragments are opaque, so the first tensor-core
// kernels (wmma, removed since) kept S, dP and O in shared memory, and every 64 x 64 tile was
// stored, re-read row by row by lane pairs and reloaded; on the H100 the GPT-2 124M step spent
// 18.8 ms of 42 in them (29 TFLOP/s forward), against 6.2 ms here (docs/benchmarks.md). These
// use mma.sync.m16n8k16 directly, whose fragment layouts are documented (PTX ISA, "Matrix
// Fragments for mma.m16n8k16"), as flash-attention does:
//  - S = Q K^T and dP = dO V^T accumulate in registers; the softmax (row max and sum over
//    the 4 lanes that share a row: shuffles) and the masking work on those registers;
//  - the accumulator layout of two adjacent n8 tiles is the A-operand layout of one k16
//    step, so P (and dS) feed the second product from registers, rounded to the storage type;
//  - O (forward), dQ, dK and dV stay in registers for the whole block;
//  - K/V (forward, dQ) and Q/dO (dK/dV) tiles are double-buffered in shared memory with
//    cp.async: the next tile loads while this one is computed;
//  - B operands that must be transposed (V in P V, K in dS K, dO and Q in dK/dV) come through
//    ldmatrix.trans; the others are 32-bit shared loads of adjacent element pairs.
// Shared rows are padded to D + 8 elements: conflict-free for both access patterns.
// Blocks: 4 warps, 64 rows (queries, or keys for dK/dV) per block, 16 per warp; key (query)
// tiles of 64. Masking, bias, the empty-row convention and the dbias order are those of
// kernels_flash.cuh, as in the SIMT kernels, so the two paths agree to rounding.
#include "kernels_flash.cuh"

namespace fsdp::cuda::kernels::flash {
namespace {

constexpr int kRows = 64;      // rows of a block tile = columns of a streamed tile
constexpr int kThreads = 128;  // 4 warps x 16 rows

template <int D>
struct Lay {
  static constexpr int ld = D + 8;          // elements per shared row
  static constexpr int tile = kRows * ld;  // elements per [64][D] tile
};

// ---- PTX wrappers --------------------------------------------------------------------------

template <class T>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one 32-bit pair of T: `lo` in the low half (the lower column index).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <class T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; zero-filled when !valid (nothing read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }

// Four 8x8 16-bit matrices, transposed: lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// ---- fragments (g = lane / 4, t = lane % 4) --------------------------------------------------

// A operand, rows [r0, r0+16) x k [k0, k0+16) of a row-major shared tile.
template <class T, int D>
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const T* s, int r0, int k0, int g, int t) {
  constexpr int ld = Lay<D>::ld;
  const T* p = s + (r0 + g) * ld + k0 + 2 * t;
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * ld);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * ld + 8);
}

// B operand (k16 x n8) whose transpose is stored row-major: B[k][n] = s[n0 + n][k0 + k]
// (K in Q K^T, V in dO V^T, Q in K Q^T, dO in V dO^T).
template <class T, int D>
__device__ __forceinline__ void frag_bt(uint32_t& b0, uint32_t& b1, const T* s, int n0, int k0,
                                        int g, int t) {
  const T* p = s + (n0 + g) * Lay<D>::ld + k0 + 2 * t;
  b0 = ld32(p);
  b1 = ld32(p + 8);
}

// B operands for k [k0, k0+16) x n [n0, n0+16) of a row-major [k][n] shared tile (V in P V,
// K in dS K, dO and Q in dK/dV): b[0], b[1] for the n8 tile n0, b[2], b[3] for n0 + 8.
template <class T, int D>
__device__ __forceinline__ void frag_b_trans(uint32_t (&b)[4], const T* s, int k0, int n0,
                                             int lane) {
  const int m = lane >> 3;
  ldsm_x4_trans(b, s + (k0 + (m & 1) * 8 + (lane & 7)) * Lay<D>::ld + n0 + (m >> 1) * 8);
}

// The A operand for k16 step kk from an accumulator tile acc[n8 tiles][4] (rows of the warp,
// columns 16kk .. 16kk+15), rounded to T.
template <class T>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&acc)[8][4], int kk) {
  a[0] = pack2<T>(acc[2 * kk][0], acc[2 * kk][1]);
  a[1] = pack2<T>(acc[2 * kk][2], acc[2 * kk][3]);
  a[2] = pack2<T>(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
  a[3] = pack2<T>(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
}

// Rows [0, valid) of a [64][D] tile from global (row stride ld_src, 16-byte aligned rows) into
// shared, asynchronously; rows >= valid zero-filled.
template <class T, int D>
__device__ __forceinline__ void cp_tile(T* dst, const T* src, int64_t ld_src, int64_t valid) {
  constexpr int per = 16 / sizeof(T), chunks = D / per;
  for (int idx = threadIdx.x; idx < kRows * chunks; idx += kThreads) {
    const int r = idx / chunks, c = (idx % chunks) * per;
    const bool ok = r < valid;
    cp_async16(dst + r * Lay<D>::ld + c, ok ? src + r * ld_src + c : src, ok);
  }
}

// Adds the 16 x 64 products a_rows(sA) . rows(sB)^T over D into acc (zeroed first): the warp's
// 16 rows of sA (row-major [64][D]) against the 64 rows of sB.
template <class T, int D>
__device__ __forceinline__ void warp_abt(float (&acc)[8][4], const T* sA, const T* sB, int w,
                                         int g, int t) {
#pragma unroll
  for (int n = 0; n < 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    frag_a<T, D>(a, sA, 16 * w, 16 * kk, g, t);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      uint32_t b0, b1;
      frag_bt<T, D>(b0, b1, sB, 8 * n, 16 * kk, g, t);
      mma16816<T>(acc[n], a, b0, b1);
    }
  }
}

// acc[D/8][4] += A(16 x 64, from registers) . sB (row-major [64][D]).
template <class T, int D>
__device__ __forceinline__ void warp_a_b(float (&acc)[D / 8][4], const float (&a_acc)[8][4],
                                         const T* sB, int lane) {
#pragma unroll
  for (int kk = 0; kk < kRows / 16; ++kk) {
    uint32_t a[4];
    acc_to_a<T>(a, a_acc, kk);
#pragma unroll
    for (int n2 = 0; n2 < D / 16; ++n2) {
      uint32_t b[4];
      frag_b_trans<T, D>(b, sB, 16 * kk, 16 * n2, lane);
      mma16816<T>(acc[2 * n2], a, b[0], b[1]);
      mma16816<T>(acc[2 * n2 + 1], a, b[2], b[3]);
    }
  }
}

// Writes rows r (this thread's: row_a for acc[.][0..1], row_b for acc[.][2..3]) of acc * mul
// to dst (row stride ld, 16-byte aligned rows), rows >= valid skipped.
template <class T, int D>
__device__ __forceinline__ void store_rows(T* dst, int64_t ld, int64_t row_a, int64_t valid,
                                           const float (&acc)[D / 8][4], float mul, int t) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = row_a + 8 * half;
    if (r >= valid) continue;
    T* row = dst + r * ld + 2 * t;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      *reinterpret_cast<uint32_t*>(row + 8 * n) =
          pack2<T>(acc[n][2 * half] * mul, acc[n][2 * half + 1] * mul);
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFullMask, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFullMask, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFullMask, x, 1);
  return x + __shfl_xor_sync(kFullMask, x, 2);
}

// Whether no element of the (query tile i0, key tile j0) pair of batch row b is masked: every
// key and query in range, no padding mask, causal only strictly below the diagonal, a sliding
// window covering the whole tile (its first key within the window of its last query), and
// every document start at or left of the first key (rows are nondecreasing: the last row's
// start is the largest).
template <bool kDoc>
__device__ __forceinline__ bool tile_unmasked(const Dev& p, int64_t b, int64_t i0, int64_t j0) {
  return !p.key_mask && j0 + kRows <= p.Tk && i0 + kRows <= p.Tq &&
         !(p.causal && j0 + kRows - 1 > i0) &&
         !(p.window > 0 && j0 <= i0 + kRows - 1 - p.window) &&
         !(kDoc && p.doc_start[b * p.Tq + imin(i0 + kRows, p.Tq) - 1] > j0);
}

// Document masking (the kernels call these under kDoc). The first key tile, of ntiles, that
// query tile i0 of batch row b visits: the one holding its first row's start (doc_begin); the
// tiles left of it are masked for every row.
__device__ __forceinline__ int64_t doc_first_key_tile(const Dev& p, int64_t b, int64_t i0,
                                                      int64_t ntiles) {
  return imin(doc_begin(p, b, i0) / kRows, ntiles);
}
// Of the nit query tiles first, first + 64, ... of batch row b, those before the first whose
// first row starts its document past last_key (rows are nondecreasing: that tile's rows and
// all later ones see none of the keys up to last_key), by binary search over the tiles' first
// rows.
__device__ __forceinline__ int64_t doc_query_tiles(const Dev& p, int64_t b, int64_t first,
                                                   int64_t nit, int64_t last_key) {
  const int32_t* start = p.doc_start + b * p.Tq;
  int64_t lo = 0, hi = nit;  // the first tile past last_key is in [lo, hi] (hi: none)
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (start[first + mid * kRows] <= last_key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// ---- forward ---------------------------------------------------------------------------------

// Block = (b, h, query tile), heaviest causal tiles first. Shared: Q, then K and V twice.
// kDoc: whether p has a document mask (kernels_flash.cuh, visible).
template <class T, int D, bool kDoc>
__global__ void __launch_bounds__(kThreads)
    flash_fwd(Dev p, const T* q, const T* k, const T* v, T* out, float* lse, int64_t nqt) {
  using L = Lay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + L::tile;      // [2][64][ld]
  T* sV = sK + 2 * L::tile;  // [2][64][ld]
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / nqt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = tile * kRows, rows = imin(kRows, p.Tq - i0);
  const int64_t ntiles = (key_end(p, i0, rows) + kRows - 1) / kRows;
  // Key tiles [jt0, ntiles) (a constant 0 without a document mask: the code is as before it).
  const int64_t jt0 = kDoc ? doc_first_key_tile(p, b, i0, ntiles) : 0;
  const int64_t hk = h / p.group;  // key/value head
  const T* kb = k + b * p.Tk * p.ldk + hk * D;
  const T* vb = v + b * p.Tk * p.ldv + hk * D;
  cp_tile<T, D>(sQ, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows);
  if (ntiles > jt0) {
    const int64_t jb = jt0 * kRows;
    cp_tile<T, D>(sK, kb + jb * p.ldk, p.ldk, imin(kRows, p.Tk - jb));
    cp_tile<T, D>(sV, vb + jb * p.ldv, p.ldv, imin(kRows, p.Tk - jb));
  }
  cp_commit();
  cp_wait_all();
  __syncthreads();

  const int64_t ia = i0 + 16 * w + g;  // this thread's rows: ia (acc[.][0..1]), ia + 8 ([2..3])
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int64_t jt = jt0; jt < ntiles; ++jt) {
    const int buf = static_cast<int>((jt - jt0) & 1);
    const T* cK = sK + buf * L::tile;
    const T* cV = sV + buf * L::tile;
    const int64_t j0 = jt * kRows;
    if (jt + 1 < ntiles) {  // the next K, V while this tile computes
      const int64_t jn = j0 + kRows;
      cp_tile<T, D>(sK + (buf ^ 1) * L::tile, kb + jn * p.ldk, p.ldk, imin(kRows, p.Tk - jn));
      cp_tile<T, D>(sV + (buf ^ 1) * L::tile, vb + jn * p.ldv, p.ldv, imin(kRows, p.Tk - jn));
    }
    cp_commit();
    float s[8][4];
    warp_abt<T, D>(s, sQ, cK, w, g, t);  // raw q . k
    const bool all_visible = tile_unmasked<kDoc>(p, b, i0, j0);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = ia + 8 * (e >> 1), j = j0 + 8 * n + 2 * t + (e & 1);
        const float x =
            all_visible || visible<kDoc>(p, b, i, j) ? score(p, h, i, j, s[n][e]) : -INFINITY;
        s[n][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    }
    float alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m_new = fmaxf(m[r], quad_max(mx[r]));
      alpha[r] = m[r] == -INFINITY ? 0.0f : __expf(m[r] - m_new);  // O and l are 0 then
      m[r] = m_new;
    }
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = s[n][e];
        const float pe = x == -INFINITY ? 0.0f : __expf(x - m[e >> 1]);
        s[n][e] = pe;
        rs[e >> 1] += pe;
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + rs[r];  // this lane's columns only
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    warp_a_b<T, D>(o, s, cV, lane);  // O += P V
    cp_wait_all();
    __syncthreads();  // the next tile is in; every warp is done with this one's buffer
  }
  // out = O / l (0 for a row without keys), lse = m + log l (+inf).
  float inv[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] = quad_sum(l[r]);
    inv[r] = m[r] == -INFINITY ? 0.0f : 1.0f / l[r];
  }
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= inv[0];
    o[n][1] *= inv[0];
    o[n][2] *= inv[1];
    o[n][3] *= inv[1];
  }
  store_rows<T, D>(out + b * p.Tq * p.ldo + h * D, p.ldo, ia, p.Tq, o, 1.0f, t);
  if (t == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t i = ia + 8 * r;
      if (i < p.Tq) lse[bh * p.Tq + i] = m[r] == -INFINITY ? INFINITY : m[r] + logf(l[r]);
    }
  }
}

template <int D>
constexpr std::size_t fwd_smem(std::size_t t_size) {
  return 5 * Lay<D>::tile * t_size;
}

// ---- backward: dQ (and dbias) ---------------------------------------------------------------

// Block = (b, h, query tile). Shared: Q, dO, then K and V twice; with the bias gradient
// (kDbias) also the fp32 dS tile [64][kLdS], whose 127 diagonals threads 0..126 sum (rows
// ascending) into the block's partial row (kernels_flash.cuh, DbiasPartials: chunk = b,
// rows = 64, key tiles of 64). kDoc as flash_fwd's.
constexpr int kLdS = kRows + 1;  // fp32 dS tile row: diagonal reads conflict-free

template <class T, int D, bool kDbias, bool kDoc>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dq(Dev p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                 const float* di, T* dq, float* partials, int64_t nqt, int64_t stride) {
  using L = Lay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + L::tile;
  T* sK = sdO + L::tile;     // [2][64][ld]
  T* sV = sK + 2 * L::tile;  // [2][64][ld]
  float* sS = reinterpret_cast<float*>(sV + 2 * L::tile);  // kDbias: [64][kLdS]
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = nqt - 1 - static_cast<int64_t>(blockIdx.x) % nqt;
  const int64_t bh = static_cast<int64_t>(blockIdx.x) / nqt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = tile * kRows, rows = imin(kRows, p.Tq - i0);
  const int64_t ntiles = (key_end(p, i0, rows) + kRows - 1) / kRows;
  const int64_t jt0 = kDoc ? doc_first_key_tile(p, b, i0, ntiles) : 0;  // as forward's
  const int64_t ia = i0 + 16 * w + g;
  const int64_t hk = h / p.group;  // key/value head
  float* part = kDbias ? partials + (bh * nqt + tile) * stride : nullptr;
  if constexpr (kDbias) {
    for (int64_t idx = threadIdx.x; idx < stride; idx += kThreads) part[idx] = 0.0f;
  }
  const T* kb = k + b * p.Tk * p.ldk + hk * D;
  const T* vb = v + b * p.Tk * p.ldv + hk * D;
  cp_tile<T, D>(sQ, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, rows);
  cp_tile<T, D>(sdO, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, rows);
  if (ntiles > jt0) {
    const int64_t jb = jt0 * kRows;
    cp_tile<T, D>(sK, kb + jb * p.ldk, p.ldk, imin(kRows, p.Tk - jb));
    cp_tile<T, D>(sV, vb + jb * p.ldv, p.ldv, imin(kRows, p.Tk - jb));
  }
  cp_commit();
  float lse_r[2], di_r[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t i = ia + 8 * r;
    lse_r[r] = i < p.Tq ? lse[bh * p.Tq + i] : INFINITY;
    di_r[r] = i < p.Tq ? di[bh * p.Tq + i] : 0.0f;
  }
  cp_wait_all();
  __syncthreads();  // also orders the partial row's zeros before the first diagonal sums
  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  for (int64_t jt = jt0; jt < ntiles; ++jt) {
    const int buf = static_cast<int>((jt - jt0) & 1);
    const T* cK = sK + buf * L::tile;
    const T* cV = sV + buf * L::tile;
    const int64_t j0 = jt * kRows;
    if (jt + 1 < ntiles) {
      const int64_t jn = j0 + kRows;
      cp_tile<T, D>(sK + (buf ^ 1) * L::tile, kb + jn * p.ldk, p.ldk, imin(kRows, p.Tk - jn));
      cp_tile<T, D>(sV + (buf ^ 1) * L::tile, vb + jn * p.ldv, p.ldv, imin(kRows, p.Tk - jn));
    }
    cp_commit();
    float s[8][4], dp[8][4];
    warp_abt<T, D>(s, sQ, cK, w, g, t);    // S = Q K^T (raw)
    warp_abt<T, D>(dp, sdO, cV, w, g, t);  // dP = dO V^T
    const bool all_visible = tile_unmasked<kDoc>(p, b, i0, j0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int64_t i = ia + 8 * r, j = j0 + 8 * n + 2 * t + (e & 1);
        float ds = 0.0f;
        if (all_visible || visible<kDoc>(p, b, i, j)) {
          const float pr = __expf(score(p, h, i, j, s[n][e]) - lse_r[r]);
          ds = pr * (dp[n][e] - di_r[r]);
        }
        s[n][e] = ds * score_dcap(p, s[n][e]);  // through the soft-cap (dbias: ds itself)
        if constexpr (kDbias) sS[(16 * w + g + 8 * r) * kLdS + 8 * n + 2 * t + (e & 1)] = ds;
      }
    }
    warp_a_b<T, D>(acc, s, cK, lane);  // dQ += dS K (scaled at the end)
    if constexpr (kDbias) {
      __syncthreads();  // the whole dS tile is in sS
      const int d = threadIdx.x;  // diagonal col - row + 63, rows ascending
      if (d < 2 * kRows - 1) {
        const int r_lo = d < kRows ? kRows - 1 - d : 0;
        const int r_hi = d < kRows ? kRows : 2 * kRows - 1 - d;
        float sum = 0.0f;
        for (int r = r_lo; r < r_hi; ++r) sum += sS[r * kLdS + r + d - (kRows - 1)];
        part[j0 + d] += sum;  // the next tile's writer of this entry waits at the barrier below
      }
    }
    cp_wait_all();
    __syncthreads();
  }
  store_rows<T, D>(dq + b * p.Tq * p.ldq + h * D, p.ldq, ia, p.Tq, acc, p.scale, t);
}

template <int D>
constexpr std::size_t dq_smem(std::size_t t_size, bool dbias) {
  return 6 * Lay<D>::tile * t_size + (dbias ? kRows * kLdS * sizeof(float) : 0);
}

// ---- backward: dK and dV ---------------------------------------------------------------------

// Block = (b, key/value head g, key tile), most query tiles first; warp w owns keys
// [16w, 16w+16) and keeps their dK, dV in registers over the steps (query head h of the
// group, ascending; query tile), step s = (h - g*group) * nit + tile, the next step's tiles
// loading during this one. On transposed tiles: S^T = K Q^T, dP^T = V dO^T, then
// dV += P^T dO, dK += dS^T Q. Shared: K, V, then Q and dO twice, then lse and D_i of the
// query tile twice. kDoc as flash_fwd's.
template <class T, int D, bool kDoc>
__global__ void __launch_bounds__(kThreads)
    flash_bwd_dkdv(Dev p, const T* q, const T* k, const T* v, const T* dout, const float* lse,
                   const float* di, T* dk, T* dv, int64_t nkt) {
  using L = Lay<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + L::tile;
  T* sQ = sV + L::tile;       // [2][64][ld]
  T* sdO = sQ + 2 * L::tile;  // [2][64][ld]
  float* sLse = reinterpret_cast<float*>(sdO + 2 * L::tile);  // [2][64]
  float* sDi = sLse + 2 * kRows;                               // [2][64]
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) % nkt;
  const int64_t hkv = p.H / p.group;
  const int64_t bg = static_cast<int64_t>(blockIdx.x) / nkt, b = bg / hkv, hk = bg % hkv;
  const int64_t j0 = tile * kRows, cols = imin(kRows, p.Tk - j0);
  const int64_t first = p.causal ? j0 : 0;  // causal: queries i < j0 see none of these keys
  const int64_t all = first < p.Tq ? (p.Tq - first + kRows - 1) / kRows : 0;
  // Document masking: nor do the query tiles from the first whose rows start past the keys.
  const int64_t nit = kDoc ? doc_query_tiles(p, b, first, all, j0 + cols - 1) : all;
  const int64_t steps = p.group * nit;
  // Step st: query head h0 + st / nit, query tile i0 = first + (st % nit) * 64.
  const int64_t h0 = hk * p.group;
  auto step_head = [&](int64_t st) { return h0 + st / nit; };
  auto step_i0 = [&](int64_t st) { return first + (st % nit) * kRows; };
  // Loads step st's Q, dO tiles (asynchronously) and its lse, D_i (plain loads) into `buf`.
  auto load_step = [&](int buf, int64_t st) {
    const int64_t h = step_head(st), i0 = step_i0(st), bh = b * p.H + h;
    cp_tile<T, D>(sQ + buf * L::tile, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq,
                  imin(kRows, p.Tq - i0));
    cp_tile<T, D>(sdO + buf * L::tile, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo,
                  imin(kRows, p.Tq - i0));
    for (int c = threadIdx.x; c < kRows; c += kThreads) {
      const bool ok = i0 + c < p.Tq;
      sLse[buf * kRows + c] = ok ? lse[bh * p.Tq + i0 + c] : INFINITY;
      sDi[buf * kRows + c] = ok ? di[bh * p.Tq + i0 + c] : 0.0f;
    }
  };
  cp_tile<T, D>(sK, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, cols);
  cp_tile<T, D>(sV, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, cols);
  if (steps > 0) load_step(0, 0);
  cp_commit();
  cp_wait_all();
  __syncthreads();
  const int64_t ja = j0 + 16 * w + g;  // this thread's keys: ja, ja + 8
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dk_acc[n][0] = dk_acc[n][1] = dk_acc[n][2] = dk_acc[n][3] = 0.0f;
    dv_acc[n][0] = dv_acc[n][1] = dv_acc[n][2] = dv_acc[n][3] = 0.0f;
  }
  for (int64_t st = 0; st < steps; ++st) {
    const int buf = static_cast<int>(st & 1);
    const T* cQ = sQ + buf * L::tile;
    const T* cdO = sdO + buf * L::tile;
    const float* cLse = sLse + buf * kRows;
    const float* cDi = sDi + buf * kRows;
    const int64_t h = step_head(st), i0 = step_i0(st);
    if (st + 1 < steps) load_step(buf ^ 1, st + 1);  // the next step's tiles while this computes
    cp_commit();
    float s[8][4], dp[8][4];
    warp_abt<T, D>(s, sK, cQ, w, g, t);    // S^T = K Q^T (raw)
    warp_abt<T, D>(dp, sV, cdO, w, g, t);  // dP^T = V dO^T
    const bool all_visible = tile_unmasked<kDoc>(p, b, i0, j0);
#pragma unroll
    for (int n = 0; n < 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = 8 * n + 2 * t + (e & 1);
        const int64_t j = ja + 8 * (e >> 1), i = i0 + c;
        float pr = 0.0f, ds = 0.0f;
        if (all_visible || visible<kDoc>(p, b, i, j)) {
          pr = __expf(score(p, h, i, j, s[n][e]) - cLse[c]);
          ds = pr * (dp[n][e] - cDi[c]) * score_dcap(p, s[n][e]);
        }
        s[n][e] = pr;
        dp[n][e] = ds;
      }
    }
    warp_a_b<T, D>(dv_acc, s, cdO, lane);  // dV += P^T dO
    warp_a_b<T, D>(dk_acc, dp, cQ, lane);  // dK += dS^T Q (scaled at the end)
    cp_wait_all();
    __syncthreads();
  }
  store_rows<T, D>(dk + b * p.Tk * p.ldk + hk * D, p.ldk, ja, p.Tk, dk_acc, p.scale, t);
  store_rows<T, D>(dv + b * p.Tk * p.ldv + hk * D, p.ldv, ja, p.Tk, dv_acc, 1.0f, t);
}

template <int D>
constexpr std::size_t dkdv_smem(std::size_t t_size) {
  return 6 * Lay<D>::tile * t_size + 4 * kRows * sizeof(float);
}

// f(Tag<T>, Int<D>) for the instantiations: T = __nv_bfloat16 or __half, D = 64 or 128.
template <int V>
struct Int {
  static constexpr int value = V;
};
template <class F>
void dispatch_mma(const FlashProblem& p, F&& f) {
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

bool mma_fits(const FlashProblem& p, std::initializer_list<const void*> arrays) {
  if (!((p.t == ST::bf16 || p.t == ST::f16) && (p.D == 64 || p.D == 128))) return false;
  // 16-byte tile loads (cp.async) and 32-bit pair stores: every row start 16-byte aligned.
  for (const void* x : arrays) {
    if (!aligned16(x)) return false;
  }
  const int64_t per = 16 / static_cast<int64_t>(st_size(p.t));
  return p.ldq % per == 0 && p.ldk % per == 0 && p.ldv % per == 0 && p.ldo % per == 0 &&
         p.D % per == 0;
}

DbiasPartials mma_dbias_partials(const FlashProblem& p) {
  const int64_t nqt = (p.Tq + kRows - 1) / kRows, nkt = (p.Tk + kRows - 1) / kRows;
  return {p.B, nqt, kRows, nkt * kRows + kRows};
}

void mma_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                 float* lse, cudaStream_t s) {
  const Dev d = to_dev(p);
  dispatch_mma(p, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    const int64_t nqt = (p.Tq + kRows - 1) / kRows;
    const std::size_t smem = fwd_smem<D>(sizeof(T));
    const auto kernel = p.doc_start ? flash_fwd<T, D, true> : flash_fwd<T, D, false>;
    set_smem(kernel, smem, "attention forward");
    kernel<<<grid_for(p.B * p.H * nqt, "attention forward"), kThreads, smem, s>>>(
        d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), lse, nqt);
    FSDP_CHECK_LAUNCH();
  });
}

void mma_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                  const void* dout, const float* lse, const float* di, void* dq, void* dk,
                  void* dv, float* dbias, float* partials, cudaStream_t s) {
  const Dev d = to_dev(p);
  const int64_t hkv = p.H / p.group;  // the dK/dV kernel's blocks are (b, kv head, key tile)
  const bool doc = p.doc_start != nullptr;
  dispatch_mma(p, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    const auto* qt = static_cast<const T*>(q);
    const auto* kt = static_cast<const T*>(k);
    const auto* vt = static_cast<const T*>(v);
    const auto* dot = static_cast<const T*>(dout);
    if (p.Tk > 0) {
      const int64_t nkt = (p.Tk + kRows - 1) / kRows;
      const std::size_t smem = dkdv_smem<D>(sizeof(T));
      const auto kernel = doc ? flash_bwd_dkdv<T, D, true> : flash_bwd_dkdv<T, D, false>;
      set_smem(kernel, smem, "attention backward");
      kernel<<<grid_for(p.B * hkv * nkt, "attention backward"), kThreads, smem, s>>>(
          d, qt, kt, vt, dot, lse, di, static_cast<T*>(dk), static_cast<T*>(dv), nkt);
      FSDP_CHECK_LAUNCH();
    }
    if (p.Tq > 0) {
      const int64_t nqt = (p.Tq + kRows - 1) / kRows;
      const unsigned grid = grid_for(p.B * p.H * nqt, "attention backward");
      if (dbias) {
        const std::size_t smem = dq_smem<D>(sizeof(T), true);
        const auto kernel = doc ? flash_bwd_dq<T, D, true, true> : flash_bwd_dq<T, D, true, false>;
        set_smem(kernel, smem, "attention backward");
        kernel<<<grid, kThreads, smem, s>>>(d, qt, kt, vt, dot, lse, di, static_cast<T*>(dq),
                                            partials, nqt, mma_dbias_partials(p).stride);
      } else {
        const std::size_t smem = dq_smem<D>(sizeof(T), false);
        const auto kernel =
            doc ? flash_bwd_dq<T, D, false, true> : flash_bwd_dq<T, D, false, false>;
        set_smem(kernel, smem, "attention backward");
        kernel<<<grid, kThreads, smem, s>>>(d, qt, kt, vt, dot, lse, di, static_cast<T*>(dq),
                                            nullptr, nqt, 0);
      }
      FSDP_CHECK_LAUNCH();
    }
  });
}

}  // namespace fsdp::cuda::kernels::flash
