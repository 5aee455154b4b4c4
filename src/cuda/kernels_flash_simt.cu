// src/cuda/kernels_flash_simt.cu: the SIMT FlashAttention-2 kernels (Dao 2023, Algorithms 1
// and 2): fp32 math on CUDA cores, any storage type (fp32, bf16, fp16), any head dim, any
// alignment; the path for whatever the tensor-core kernels (kernels_flash_mma.cu) do not take.
// One warp per query (or key) row, lanes over keys (or queries) for the dot products and over
// the head dim for the accumulations, tiles of 32 rows in shared memory. Masking, scores and
// grouped-query heads as kernels_flash.cuh defines them; launches as kernels_flash.cu counts
// them (forward 1; backward dK/dV per key tile looping over the group's query heads and their
// query tiles, then dQ per query tile, looping over the batch in order when dbias is wanted,
// summing dS by relative position into the block's partial row: kernels_flash.cuh).
#include "kernels_flash.cuh"

namespace fsdp::cuda::kernels::flash {
namespace {

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
// kDoc: whether p has a document mask (kernels_flash.cuh, visible).
template <class T, bool kDoc>
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
  // From the key tile holding the first row's document start (kernels_flash.cuh, doc_begin).
  const int64_t jbegin = kDoc ? doc_begin(p, b, i0) / kSimtTile * kSimtTile : 0;
  for (int64_t j0 = jbegin; j0 < jend; j0 += kSimtTile) {
    const int64_t cols = imin(kSimtTile, p.Tk - j0);
    __syncthreads();
    load_rows_f32(sK, ldt, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, D, kSimtTile, cols);
    load_rows_f32(sV, ldt, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, D, kSimtTile, cols);
    __syncthreads();
    const int64_t j = j0 + lane;
    float s = -INFINITY;
    if (visible<kDoc>(p, b, i, j)) {
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
// kDoc as flash_fwd_simt's.
template <class T, bool kDoc>
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
  __syncthreads();  // the zeros are read below even when no query tile is visible (Tq == 0)
  const float* kw = sK + w * D;
  const float* vw = sV + w * D;
  float* dkw = sdK + w * D;
  float* dvw = sdV + w * D;
  float* pw = sP + w * kSimtTile;
  float* dsw = sdS + w * kSimtTile;
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    const int64_t bh = b * p.H + h;
    // Causal: queries i < j0 see none of these keys; document masking: nor do the queries from
    // the first tile whose first row starts past the last key (rows are nondecreasing).
    for (int64_t i0 = p.causal ? j0 / kSimtTile * kSimtTile : 0; i0 < p.Tq; i0 += kSimtTile) {
      if (kDoc && doc_begin(p, b, i0) > j0 + cols - 1) break;  // uniform over the block
      const int64_t rows = imin(kSimtTile, p.Tq - i0);
      __syncthreads();
      load_rows_f32(sQ, ldt, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, D, kSimtTile, rows);
      load_rows_f32(sdO, ldt, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, D, kSimtTile, rows);
      __syncthreads();
      const int64_t i = i0 + lane;
      float pr = 0.0f, ds = 0.0f;
      if (visible<kDoc>(p, b, i, j)) {
        float dot = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; ++e) {
          dot += sQ[lane * ldt + e] * kw[e];
          dp += sdO[lane * ldt + e] * vw[e];
        }
        pr = expf(score(p, h, i, j, dot) - lse[bh * p.Tq + i]);
        ds = pr * (dp - di[bh * p.Tq + i]) * score_dcap(p, dot);
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
// over b in order; a warp per query, lanes are the keys of a 32-key tile. With dbias the
// block's partial row (DbiasPartials: one chunk, rows = 8, key tiles of 32; `partials` at
// the block's row, `stride` floats) gets, per key tile, the 39 diagonals of the [8 x 32] dS
// tile (threads 0..38, warps ascending), b ascending. kDoc as flash_fwd_simt's.
template <class T, bool kDoc>
__global__ void __launch_bounds__(kSimtThreads)
    flash_bwd_dq_simt(Dev p, const T* q, const T* k, const T* v, const T* dout,
                      const float* lse, const float* di, T* dq, float* partials,
                      int64_t stride, int64_t nqt) {
  const bool dbias = partials != nullptr;
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
  float* part = dbias ? partials + (h * nqt + tile) * stride : nullptr;
  if (dbias) {
    for (int64_t idx = threadIdx.x; idx < stride; idx += blockDim.x) part[idx] = 0.0f;
  }
  for (int64_t b = b_begin; b < b_end; ++b) {
    const int64_t bh = b * p.H + h;
    __syncthreads();  // (first b: also orders the partial row's zeros)
    load_rows_f32(sQ, D, q + (b * p.Tq + i0) * p.ldq + h * D, p.ldq, D, kRowsPerBlock, rows);
    load_rows_f32(sdO, D, dout + (b * p.Tq + i0) * p.ldo + h * D, p.ldo, D, kRowsPerBlock, rows);
    for (int64_t idx = threadIdx.x; idx < kRowsPerBlock * D; idx += blockDim.x) sdQ[idx] = 0.0f;
    __syncthreads();  // the zeros are read below even when no key tile is (Tk == 0)
    const float lse_i = i < p.Tq ? lse[bh * p.Tq + i] : INFINITY;
    const float di_i = i < p.Tq ? di[bh * p.Tq + i] : 0.0f;
    // From the key tile holding the first row's document start, as forward.
    const int64_t jbegin = kDoc ? doc_begin(p, b, i0) / kSimtTile * kSimtTile : 0;
    for (int64_t j0 = jbegin; j0 < jend; j0 += kSimtTile) {
      const int64_t cols = imin(kSimtTile, p.Tk - j0);
      __syncthreads();
      load_rows_f32(sK, ldt, k + (b * p.Tk + j0) * p.ldk + hk * D, p.ldk, D, kSimtTile, cols);
      load_rows_f32(sV, ldt, v + (b * p.Tk + j0) * p.ldv + hk * D, p.ldv, D, kSimtTile, cols);
      __syncthreads();
      const int64_t j = j0 + lane;
      float ds = 0.0f;
      if (visible<kDoc>(p, b, i, j)) {
        float dot = 0.0f, dp = 0.0f;
        for (int64_t e = 0; e < D; ++e) {
          dot += qw[e] * sK[lane * ldt + e];
          dp += dow[e] * sV[lane * ldt + e];
        }
        ds = expf(score(p, h, i, j, dot) - lse_i) * (dp - di_i) * score_dcap(p, dot);
      }
      dsw[lane] = ds;
      __syncwarp();
      if (dbias) {  // uniform over the block
        __syncthreads();  // every warp's dS row is in sdS
        const int dg = static_cast<int>(threadIdx.x);  // diagonal lane - warp + 7
        if (dg < kSimtTile + kRowsPerBlock - 1) {
          float sum = 0.0f;
          for (int r = 0; r < kRowsPerBlock; ++r) {
            const int c = dg + r - (kRowsPerBlock - 1);
            if (c >= 0 && c < kSimtTile) sum += sdS[r * kSimtTile + c];
          }
          part[j0 + dg] += sum;  // the next tile's writer of this entry waits at its barrier
        }
      }
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

}  // namespace

DbiasPartials simt_dbias_partials(const FlashProblem& p) {
  const int64_t nqt = (p.Tq + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t nkt = (p.Tk + kSimtTile - 1) / kSimtTile;
  return {1, nqt, kRowsPerBlock, nkt * kSimtTile + kRowsPerBlock};
}

void simt_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                  float* lse, cudaStream_t s) {
  const Dev d = to_dev(p);
  dispatch_float("attention forward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t nqt = (p.Tq + kRowsPerBlock - 1) / kRowsPerBlock;
    const std::size_t smem = simt_fwd_smem(p.D);
    const auto kernel = p.doc_start ? flash_fwd_simt<T, true> : flash_fwd_simt<T, false>;
    set_smem(kernel, smem, "attention forward");
    kernel<<<grid_for(p.B * p.H * nqt, "attention forward"), kSimtThreads, smem, s>>>(
        d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
        static_cast<T*>(out), lse, nqt);
    FSDP_CHECK_LAUNCH();
  });
}

void simt_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                   const void* dout, const float* lse, const float* di, void* dq, void* dk,
                   void* dv, float* dbias, float* partials, cudaStream_t s) {
  const Dev d = to_dev(p);
  const int64_t hkv = p.H / p.group;  // the dK/dV kernel's blocks are (b, kv head, key tile)
  dispatch_float("attention backward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.Tk > 0) {
      const int64_t nkt = (p.Tk + kRowsPerBlock - 1) / kRowsPerBlock;
      const std::size_t smem = simt_dkdv_smem(p.D);
      const auto kernel =
          p.doc_start ? flash_bwd_dkdv_simt<T, true> : flash_bwd_dkdv_simt<T, false>;
      set_smem(kernel, smem, "attention backward");
      kernel<<<grid_for(p.B * hkv * nkt, "attention backward"), kSimtThreads, smem, s>>>(
          d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<const T*>(dout), lse, di, static_cast<T*>(dk), static_cast<T*>(dv), nkt);
      FSDP_CHECK_LAUNCH();
    }
    if (p.Tq > 0) {
      const int64_t nqt = (p.Tq + kRowsPerBlock - 1) / kRowsPerBlock;
      const std::size_t smem = simt_dq_smem(p.D);
      const auto kernel = p.doc_start ? flash_bwd_dq_simt<T, true> : flash_bwd_dq_simt<T, false>;
      set_smem(kernel, smem, "attention backward");
      const int64_t blocks = (dbias ? p.H : p.B * p.H) * nqt;
      kernel<<<grid_for(blocks, "attention backward"), kSimtThreads, smem, s>>>(
          d, static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
          static_cast<const T*>(dout), lse, di, static_cast<T*>(dq), dbias ? partials : nullptr,
          simt_dbias_partials(p).stride, nqt);
      FSDP_CHECK_LAUNCH();
    }
  });
}

}  // namespace fsdp::cuda::kernels::flash
