// src/cuda/kernels_layernorm.cu: LayerNorm and RMSNorm (T5LayerNorm) forward and backward
// (see kernels.hpp). RMSNorm is the LayerNorm code without mean and bias (kRms).
//
// Launches per call and bytes moved (s = bytes per element of the storage type; R rows of C):
//   layernorm_forward   1 launch   reads x (R C s) + weight, bias; writes out (R C s), mean
//                                  and rstd (8 R)
//   rmsnorm_forward     1 launch   reads x (R C s) + weight; writes out (R C s), rstd (4 R)
//   layernorm_backward  2 launches reads dout, x, dx (3 R C s) + weight once per block, mean
//                                  and rstd (8 R); writes dx (R C s) and fp32 partials
//                                  [2, G, C] that the second launch reads and adds into
//                                  dweight, dbias (G <= about 1024 blocks, G C << R C)
//   rmsnorm_backward    2 launches the same with rstd only and partials [1, G, C]
// so a backward moves 4 R C s bytes (bf16 GPT-2 124M, R = 8192, C = 768: 50 MB) and a
// forward 2 R C s. The residual add fused into the forward (kernels.hpp):
//   add_layernorm_forward / add_rmsnorm_forward
//                       1 launch   reads h, residual (2 R C s) + proj_bias, weight, bias;
//                                  writes h, out (2 R C s), the statistics: 4 R C s; the
//                                  unfused add_bias + add + norm: 3 launches, 7 R C s (2
//                                  launches, 5 R C s without proj_bias). Mixed storage
//                                  types, C > 8192, or a residual / proj_bias less aligned
//                                  than the norm's arguments: add_bias_residual's launch
//                                  (3 R C s), then the norm's (2 launches, 5 R C s).
// (add_bias_residual alone: kernels_elementwise.cu.)
//
// Row kernels (every float argument of one storage type, 0 < C <= 8192): a row group of
// kTPR = 32, 64, 128 or 256 threads (the smallest that holds the row in at most three
// 8-element packs per thread; 256 threads take four for 6144 < C <= 8192) owns one row at a
// time; a block of 256 threads runs 256 / kTPR groups side by side. Each thread keeps its elements in registers: 16-byte
// loads and stores (Pack8) when C % 8 == 0 and the pointers are 16-byte aligned, element by
// element otherwise. Element e = 8 j + k of thread t is column 8 (t + kTPR j) + k with
// packs, t + kTPR e without.
//  - Forward: one read of the row; mean and variance summed in fp64 (from the registers,
//    two reductions over the group) as the CPU backend does; mean/rstd stored in fp32. The
//    fused residual adds (kAdd) read h's and residual's rows instead, add and round in the
//    registers, store h, and go on from those registers: the unfused calls' values and, with
//    the same column layout, the same sums in the same order.
//  - Backward: block g owns the fixed rows [g rpb, (g + 1) rpb) (rpb from R and C only), its
//    groups take rows g rpb + group, + groups, ... Per row: x, dout, dx and (once per block)
//    weight in registers, the two row sums of dx over the group, dx += ... stored; each
//    thread adds dout xhat and dout for its columns into fp32 registers. At the end the
//    groups' column sums are added in group order (shared memory) and written to the
//    block's row of the [Q, G, C] partials; column_partials_finish (kernels_reduce.cu) adds
//    the G rows in order (fp64) into dweight/dbias, rounding once. Every sum has a fixed
//    order, so results are bitwise repeatable. dx is read and written by the thread that
//    read dout and x for the same columns, so dx may alias dout or x.
// Otherwise (mixed storage types, or C > 8192) the generic kernels below run: one warp per
// row, elements read through the run-time-typed accessors; backward in three launches
// (column partials over row chunks, dx, finish).
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// row kernels

constexpr int kThreads = 256;  // threads per block of the row kernels
constexpr int kMaxPacks = 4;   // 8-element packs per thread
constexpr int64_t kMaxRowC = 8LL * kMaxPacks * kThreads;  // 8192: widest row in registers
constexpr int64_t kMaxPartials = 1024;  // backward: at most about this many blocks (G)

// Threads per row and packs per thread for a row of C (0 < C <= kMaxRowC): the smallest
// group of 32, 64 or 128 threads that holds C in 3 packs each, else the whole block.
struct RowShape {
  int tpr = 0;    // threads per row group; 0: no row kernel for this C
  int packs = 0;  // 8-element packs per thread
};
RowShape row_shape(int64_t C) {
  if (C <= 0 || C > kMaxRowC) return {};
  for (int tpr = 32; tpr < kThreads; tpr *= 2) {
    if (C <= 8LL * 3 * tpr) return {tpr, static_cast<int>((C + 8LL * tpr - 1) / (8LL * tpr))};
  }
  return {kThreads, static_cast<int>((C + 8LL * kThreads - 1) / (8LL * kThreads))};
}

template <int TPR, int J>
struct Shape {
  static constexpr int kTPR = TPR;
  static constexpr int kJ = J;
};
// f(Shape<tpr, packs>{}) for the shapes row_shape returns (and only those).
template <class F>
void with_shape(RowShape s, F&& f) {
  switch (s.tpr) {
    case 32:
      if (s.packs == 1) return f(Shape<32, 1>{});
      if (s.packs == 2) return f(Shape<32, 2>{});
      return f(Shape<32, 3>{});
    case 64:
      if (s.packs == 2) return f(Shape<64, 2>{});
      return f(Shape<64, 3>{});
    case 128:
      if (s.packs == 2) return f(Shape<128, 2>{});
      return f(Shape<128, 3>{});
    default:
      if (s.packs == 2) return f(Shape<kThreads, 2>{});
      if (s.packs == 3) return f(Shape<kThreads, 3>{});
      return f(Shape<kThreads, 4>{});
  }
}

// Backward rows per block: at least 16 and 4 per group, and at most about kMaxPartials
// blocks; a function of R and C only.
int64_t rows_per_block(int64_t R, RowShape s) {
  const int64_t groups = kThreads / s.tpr;
  return fixed_rows_per_block(R, kMaxPartials, 4 * groups < 16 ? 16 : 4 * groups);
}

// Column of element (j, k) of thread t (see the file comment).
template <int kTPR>
__device__ __forceinline__ int64_t col_of(int t, int j, int k, bool vec) {
  return vec ? 8 * (static_cast<int64_t>(t) + static_cast<int64_t>(kTPR) * j) + k
             : static_cast<int64_t>(t) + static_cast<int64_t>(kTPR) * (8 * j + k);
}

// This thread's elements of the row p[0, C) (zeros past C).
template <int kTPR, int kJ, class T>
__device__ __forceinline__ void load_row(Pack8<T> (&v)[kJ], const T* p, int t, int64_t C,
                                         bool vec) {
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    if (vec) {
      const int64_t c0 = col_of<kTPR>(t, j, 0, true);
      if (c0 < C) {
        v[j] = load8(p + c0);
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[j].v[k] = from_f<T>(0.0f);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t c = col_of<kTPR>(t, j, k, false);
        v[j].v[k] = c < C ? p[c] : from_f<T>(0.0f);
      }
    }
  }
}

// Stores this thread's elements of the row p[0, C).
template <int kTPR, int kJ, class T>
__device__ __forceinline__ void store_row(T* p, const Pack8<T> (&v)[kJ], int t, int64_t C,
                                          bool vec) {
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
    if (vec) {
      const int64_t c0 = col_of<kTPR>(t, j, 0, true);
      if (c0 < C) store8(p + c0, v[j]);
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t c = col_of<kTPR>(t, j, k, false);
        if (c < C) p[c] = v[j].v[k];
      }
    }
  }
}

// Sum of v over the row group of kTPR threads, returned to each of them (the same bits in
// every thread). With kTPR > 32 it synchronises the block: every thread of the block must
// call it, the same number of times.
template <int kTPR, class V>
__device__ __forceinline__ V row_sum(V v) {
  v = warp_sum(v);
  if constexpr (kTPR > 32) {
    constexpr int kWarps = kTPR / 32;  // warps per group; groups are whole warps
    __shared__ V sh[kThreads / 32];
    const int w = static_cast<int>(threadIdx.x >> 5);
    const int first = w - w % kWarps;
    __syncthreads();  // the previous call's reads of sh are done
    if ((threadIdx.x & 31) == 0) sh[w] = v;
    __syncthreads();
    v = sh[first];
#pragma unroll
    for (int k = 1; k < kWarps; ++k) v += sh[first + k];
  }
  return v;
}

// LayerNorm (kRms false): out = (x - mean) rstd weight + bias, mean and variance in fp64.
// RMSNorm (kRms true): out = weight (x rstd), rstd = 1/sqrt(mean(x^2) + eps) (bias unused).
// x, out: [R, C]; weight, bias: [C]; mean, rstd: [R] fp32. Grid: ceil(R / groups) blocks.
// kAdd (add_layernorm_forward / add_rmsnorm_forward): x is h, and the row is first made
// h = round(round(h + proj_bias) + residual) (no proj_bias: round(h + residual)), stored back
// to h, and normalised from those rounded values: add_bias, add and the norm in one pass.
template <class T, bool kRms, int kTPR, int kJ, bool kAdd = false>
__global__ void __launch_bounds__(kThreads)
    norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, const T* weight,
                        const T* bias, int64_t R, int64_t C, float eps, bool vec,
                        T* h = nullptr, const T* residual = nullptr,
                        const T* proj_bias = nullptr) {
  constexpr int kGroups = kThreads / kTPR;
  const int t = static_cast<int>(threadIdx.x) % kTPR;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kGroups + threadIdx.x / kTPR;
  const bool active = r < R;  // inactive groups still join the block's reductions
  Pack8<T> xr[kJ];
  if (active) load_row<kTPR>(xr, x + r * C, t, C, vec);
  if constexpr (kAdd) {
    if (active) {
      Pack8<T> rr[kJ];
      load_row<kTPR>(rr, residual + r * C, t, C, vec);
      if (proj_bias) {
        Pack8<T> pb[kJ];
        load_row<kTPR>(pb, proj_bias, t, C, vec);
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
#pragma unroll
          for (int k = 0; k < 8; ++k) xr[j].v[k] = from_f<T>(to_f(xr[j].v[k]) + to_f(pb[j].v[k]));
        }
      }
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int k = 0; k < 8; ++k) xr[j].v[k] = from_f<T>(to_f(xr[j].v[k]) + to_f(rr[j].v[k]));
      }
      store_row<kTPR>(h + r * C, xr, t, C, vec);  // past C: zeros + zeros, not stored
    }
  }
  double mu = 0.0;
  if constexpr (!kRms) {
    double s = 0.0;
    if (active) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (col_of<kTPR>(t, j, k, vec) < C) s += to_f(xr[j].v[k]);
        }
      }
    }
    mu = row_sum<kTPR>(s) / static_cast<double>(C);
  }
  double ss = 0.0;
  if (active) {
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if (col_of<kTPR>(t, j, k, vec) < C) {
          const double d = static_cast<double>(to_f(xr[j].v[k])) - mu;
          ss += d * d;
        }
      }
    }
  }
  ss = row_sum<kTPR>(ss);
  if (!active) return;  // after the last block-wide synchronisation
  const double var = ss / static_cast<double>(C);
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  Pack8<T> wr[kJ], br[kJ];
  load_row<kTPR>(wr, weight, t, C, vec);
  if constexpr (!kRms) load_row<kTPR>(br, bias, t, C, vec);
#pragma unroll
  for (int j = 0; j < kJ; ++j) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float xv = to_f(xr[j].v[k]), wv = to_f(wr[j].v[k]);
      if constexpr (kRms) {
        xr[j].v[k] = from_f<T>(wv * (xv * rs));
      } else {
        xr[j].v[k] = from_f<T>((xv - m) * rs * wv + to_f(br[j].v[k]));
      }
    }
  }
  store_row<kTPR>(out + r * C, xr, t, C, vec);
  if (t == 0) {
    if constexpr (!kRms) mean[r] = m;
    rstd[r] = rs;
  }
}

// LayerNorm: dx[r] += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),
// xhat = (x - mean) rstd, dxhat = dout weight; partial[0, g, c] = sum over block g's rows of
// dout xhat, partial[1, g, c] = sum of dout.
// RMSNorm: dx[r] += rstd (dxhat - xhat mean(dxhat xhat)), xhat = x rstd;
// partial[0, g, c] = sum of dout xhat.
// Grid: G = ceil(R / rpb) blocks; block g owns rows [g rpb, min(R, (g + 1) rpb)).
template <class T, bool kRms, int kTPR, int kJ>
__global__ void __launch_bounds__(kThreads)
    norm_backward_kernel(T* dx, const T* dout, const T* x, const T* weight, const float* mean,
                         const float* rstd, int64_t R, int64_t C, int64_t rpb, bool vec,
                         float* partial) {
  constexpr int kGroups = kThreads / kTPR;
  constexpr int kE = 8 * kJ;  // elements per thread
  const int t = static_cast<int>(threadIdx.x) % kTPR;
  const int grp = static_cast<int>(threadIdx.x) / kTPR;
  const int64_t g = blockIdx.x, G = gridDim.x;
  const int64_t r0 = g * rpb, r1 = min(R, r0 + rpb);
  Pack8<T> wr[kJ];
  load_row<kTPR>(wr, weight, t, C, vec);
  float acc_w[kE], acc_b[kE];  // this thread's columns: sum of dout xhat, of dout
#pragma unroll
  for (int e = 0; e < kE; ++e) acc_w[e] = acc_b[e] = 0.0f;

  // The same trip count for every group of the block (row_sum may synchronise it).
  for (int64_t rb = r0; rb < r1; rb += kGroups) {
    const int64_t r = rb + grp;
    const bool active = r < r1;
    Pack8<T> xr[kJ], dr[kJ], gr[kJ];
    float m = 0.0f, rs = 0.0f, s1 = 0.0f, s2 = 0.0f;
    if (active) {
      const int64_t base = r * C;
      load_row<kTPR>(xr, x + base, t, C, vec);
      load_row<kTPR>(dr, dout + base, t, C, vec);
      load_row<kTPR>(gr, dx + base, t, C, vec);
      rs = rstd[r];
      if constexpr (!kRms) m = mean[r];
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          if (col_of<kTPR>(t, j, k, vec) < C) {
            const float xv = to_f(xr[j].v[k]);
            const float xhat = kRms ? xv * rs : (xv - m) * rs;
            const float d = to_f(dr[j].v[k]);
            const float dxhat = d * to_f(wr[j].v[k]);
            s1 += dxhat;
            s2 += dxhat * xhat;
            acc_w[8 * j + k] += d * xhat;
            if constexpr (!kRms) acc_b[8 * j + k] += d;
          }
        }
      }
    }
    if constexpr (!kRms) s1 = row_sum<kTPR>(s1);
    s2 = row_sum<kTPR>(s2);
    if (active) {
      const float m1 = s1 / static_cast<float>(C), m2 = s2 / static_cast<float>(C);
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float xv = to_f(xr[j].v[k]);
          const float xhat = kRms ? xv * rs : (xv - m) * rs;
          const float dxhat = to_f(dr[j].v[k]) * to_f(wr[j].v[k]);
          const float v = kRms ? rs * (dxhat - xhat * m2) : rs * (dxhat - m1 - xhat * m2);
          gr[j].v[k] = from_f<T>(to_f(gr[j].v[k]) + v);
        }
      }
      store_row<kTPR>(dx + r * C, gr, t, C, vec);
    }
  }

  // The block's column sums: groups added in group order, one row of the partials.
  constexpr int kQ = kRms ? 1 : 2;
  if constexpr (kGroups == 1) {
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t c = col_of<kTPR>(t, j, k, vec);
        if (c < C) {
          partial[g * C + c] = acc_w[8 * j + k];
          if constexpr (!kRms) partial[(G + g) * C + c] = acc_b[8 * j + k];
        }
      }
    }
  } else {
    __shared__ float sh[kQ][kTPR * kE];  // every column c < C <= kTPR * kE
    for (int q = 0; q < kGroups; ++q) {
      if (grp == q) {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int64_t c = col_of<kTPR>(t, j, k, vec);
            if (c < C) {
              sh[0][c] = q == 0 ? acc_w[8 * j + k] : sh[0][c] + acc_w[8 * j + k];
              if constexpr (!kRms) {
                sh[kQ - 1][c] = q == 0 ? acc_b[8 * j + k] : sh[kQ - 1][c] + acc_b[8 * j + k];
              }
            }
          }
        }
      }
      __syncthreads();
    }
    for (int64_t c = threadIdx.x; c < C; c += kThreads) {
      partial[g * C + c] = sh[0][c];
      if constexpr (!kRms) partial[(G + g) * C + c] = sh[kQ - 1][c];
    }
  }
}

// ---------------------------------------------------------------------------------------
// generic kernels (mixed storage types, C > kMaxRowC): one warp per row, run-time types

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;
constexpr int64_t kMaxRowChunks = 1024;

int64_t rows_per_chunk(int64_t R) { return fixed_rows_per_block(R, kMaxRowChunks, 64, kRowThreads); }
int64_t row_chunks(int64_t R) {
  return row_blocks(R, rows_per_chunk(R));
}

// x: [R,C]; weight, bias: [C]; out: [R,C]; mean, rstd: [R] fp32. Two passes over the row
// (in L1) for mean and variance in fp64.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    ln_forward_kernel(Wr<T> out, float* mean, float* rstd, Rd<T> x, Rd<T> weight, Rd<T> bias,
                      int64_t R, int64_t C, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;  // the whole warp: no block-level synchronisation below
  const int64_t base = r * C;
  double s = 0.0;
  for (int64_t c = lane; c < C; c += 32) s += x[base + c];
  const double mu = warp_sum(s) / static_cast<double>(C);
  double ss = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const double d = x[base + c] - mu;
    ss += d * d;
  }
  const double var = warp_sum(ss) / static_cast<double>(C);
  const float m = static_cast<float>(mu);
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  for (int64_t c = lane; c < C; c += 32) {
    out.set(base + c, (x[base + c] - m) * rs * weight[c] + bias[c]);
  }
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
}

// dx[r] += rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dout * weight.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    ln_backward_dx_kernel(Wr<T> dx, Rd<T> dout, Rd<T> x, Rd<T> weight, const float* mean,
                          const float* rstd, int64_t R, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  const float m = mean[r], rs = rstd[r];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[base + c] - m) * rs;
    const float dxhat = dout[base + c] * weight[c];
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  const float m1 = warp_sum(s1) / static_cast<float>(C);
  const float m2 = warp_sum(s2) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = (x[base + c] - m) * rs;
    const float dxhat = dout[base + c] * weight[c];
    dx.set(base + c, dx.get(base + c) + rs * (dxhat - m1 - xhat * m2));
  }
}

// block (32, 8), grid (ceil(C/32), G): partial[0, g, c] = sum over chunk g of dout * xhat,
// partial[1, g, c] = sum of dout.
template <class T>
__global__ void __launch_bounds__(kColTile* kRowThreads)
    ln_backward_partials_kernel(Rd<T> dout, Rd<T> x, const float* mean, const float* rstd,
                                int64_t R, int64_t C, int64_t rpc, float* partial) {
  __shared__ float shw[kRowThreads][kColTile + 1];
  __shared__ float shb[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t g = blockIdx.y, G = gridDim.y;
  const int64_t r0 = g * rpc, r1 = min(R, r0 + rpc);
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      const float d = dout[r * C + c];
      aw += d * ((x[r * C + c] - mean[r]) * rstd[r]);
      ab += d;
    }
  }
  shw[threadIdx.y][threadIdx.x] = aw;
  shb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.0f, sb = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) {
      sw += shw[k][threadIdx.x];
      sb += shb[k][threadIdx.x];
    }
    partial[g * C + c] = sw;
    partial[(G + g) * C + c] = sb;
  }
}

// rstd[r] = 1/sqrt(mean(x^2) + eps) (sum in fp64); out = weight * (x * rstd).
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    rms_forward_kernel(Wr<T> out, float* rstd, Rd<T> x, Rd<T> weight, int64_t R, int64_t C,
                       float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  double ss = 0.0;
  for (int64_t c = lane; c < C; c += 32) {
    const double v = x[base + c];
    ss += v * v;
  }
  const double var = C > 0 ? warp_sum(ss) / static_cast<double>(C) : 0.0;
  const float rs = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
  for (int64_t c = lane; c < C; c += 32) out.set(base + c, weight[c] * (x[base + c] * rs));
  if (lane == 0) rstd[r] = rs;
}

// dx[r] += rstd (dxhat - xhat mean(dxhat xhat)), xhat = x rstd, dxhat = dout * weight.
template <class T>
__global__ void __launch_bounds__(32 * kRowsPerBlock)
    rms_backward_dx_kernel(Wr<T> dx, Rd<T> dout, Rd<T> x, Rd<T> weight, const float* rstd,
                           int64_t R, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (r >= R) return;
  const int64_t base = r * C;
  const float rs = rstd[r];
  float s = 0.0f;
  for (int64_t c = lane; c < C; c += 32) s += (dout[base + c] * weight[c]) * (x[base + c] * rs);
  const float m = warp_sum(s) / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float xhat = x[base + c] * rs;
    dx.set(base + c, dx.get(base + c) + rs * (dout[base + c] * weight[c] - xhat * m));
  }
}

// block (32, 8), grid (ceil(C/32), G): partial[g, c] = sum over chunk g of dout * x * rstd.
template <class T>
__global__ void __launch_bounds__(kColTile* kRowThreads)
    rms_backward_partials_kernel(Rd<T> dout, Rd<T> x, const float* rstd, int64_t R, int64_t C,
                                 int64_t rpc, float* partial) {
  __shared__ float shw[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rpc, r1 = min(R, r0 + rpc);
  float aw = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      aw += dout[r * C + c] * (x[r * C + c] * rstd[r]);
    }
  }
  shw[threadIdx.y][threadIdx.x] = aw;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) sw += shw[k][threadIdx.x];
    partial[g * C + c] = sw;
  }
}

// ---------------------------------------------------------------------------------------
// host side

bool same_type(std::initializer_list<ST> types) {
  for (ST t : types) {
    if (t != *types.begin()) return false;
  }
  return *types.begin() != ST::f64;
}

// The row kernels' launch: T is the common storage type of the row arguments. kAdd: x is h,
// and residual (and proj_bias, when not null) are added into it first (norm_forward_kernel).
// Whether the norm forward's row kernel takes 16-byte packs (its column layout, hence the
// order of its row sums).
template <bool kRms>
bool forward_vec(Out out, In x, In weight, In bias, int64_t C) {
  return C % 8 == 0 && aligned16(out.p) && aligned16(x.p) && aligned16(weight.p) &&
         (kRms || aligned16(bias.p));
}
// Whether the fused residual's extra rows allow packs too.
bool add_vec(In residual, In proj_bias) {
  return aligned16(residual.p) && (!proj_bias.p || aligned16(proj_bias.p));
}

template <bool kRms, bool kAdd = false>
void launch_forward(Out out, float* mean, float* rstd, In x, In weight, In bias, int64_t R,
                    int64_t C, float eps, RowShape shape, cudaStream_t s, In residual = {},
                    In proj_bias = {}) {
  const bool vec =
      forward_vec<kRms>(out, x, weight, bias, C) && (!kAdd || add_vec(residual, proj_bias));
  const char* what = kAdd ? (kRms ? "add_rmsnorm_forward" : "add_layernorm_forward")
                          : (kRms ? "rmsnorm_forward" : "layernorm_forward");
  dispatch_float(what, x.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_shape(shape, [&](auto sh) {
      using S = decltype(sh);
      constexpr int kGroups = kThreads / S::kTPR;
      const auto blocks = static_cast<unsigned>((R + kGroups - 1) / kGroups);
      norm_forward_kernel<T, kRms, S::kTPR, S::kJ, kAdd><<<blocks, kThreads, 0, s>>>(
          static_cast<T*>(out.p), mean, rstd, static_cast<const T*>(x.p),
          static_cast<const T*>(weight.p), static_cast<const T*>(bias.p), R, C, eps, vec,
          kAdd ? static_cast<T*>(const_cast<void*>(x.p)) : nullptr,
          static_cast<const T*>(residual.p), static_cast<const T*>(proj_bias.p));
      FSDP_CHECK_LAUNCH();
    });
  });
}

template <bool kRms>
void launch_backward(Out dx, In dout, In x, In weight, const float* mean, const float* rstd,
                     int64_t R, int64_t C, RowShape shape, float* partial, int64_t* G,
                     cudaStream_t s) {
  const int64_t rpb = rows_per_block(R, shape);
  *G = (R + rpb - 1) / rpb;
  const bool vec = C % 8 == 0 && aligned16(dx.p) && aligned16(dout.p) && aligned16(x.p) &&
                   aligned16(weight.p);
  dispatch_float(kRms ? "rmsnorm_backward" : "layernorm_backward", x.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    with_shape(shape, [&](auto sh) {
      using S = decltype(sh);
      norm_backward_kernel<T, kRms, S::kTPR, S::kJ><<<static_cast<unsigned>(*G), kThreads, 0, s>>>(
          static_cast<T*>(dx.p), static_cast<const T*>(dout.p), static_cast<const T*>(x.p),
          static_cast<const T*>(weight.p), mean, rstd, R, C, rpb, vec, partial);
      FSDP_CHECK_LAUNCH();
    });
  });
}

// Partials rows for either path (the scratch must hold Q * C * max of both).
int64_t partial_rows(int64_t R, int64_t C) {
  const RowShape shape = row_shape(C);
  int64_t g = row_chunks(R);
  if (shape.tpr > 0 && R > 0) {
    const int64_t rpb = rows_per_block(R, shape);
    const int64_t fast = (R + rpb - 1) / rpb;
    if (fast > g) g = fast;
  }
  return g;
}

}  // namespace

void rmsnorm_forward(Out out, float* rstd, In x, In weight, int64_t R, int64_t C, float eps,
                     cudaStream_t s) {
  if (R <= 0) return;
  const RowShape shape = row_shape(C);
  if (shape.tpr > 0 && same_type({out.t, x.t, weight.t})) {
    launch_forward<true>(out, nullptr, rstd, x, weight, weight, R, C, eps, shape, s);
    return;
  }
  dispatch_uniform("rmsnorm_forward", {out.t, x.t, weight.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    rms_forward_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(wr<T>(out), rstd, rd<T>(x),
                                                                rd<T>(weight), R, C, eps);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t rmsnorm_backward_scratch_floats(int64_t R, int64_t C) { return partial_rows(R, C) * C; }

void rmsnorm_backward(Out dx, Out dweight, In dout, In x, In weight, const float* rstd, int64_t R,
                      int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const RowShape shape = row_shape(C);
  int64_t G = 0;
  if (shape.tpr > 0 && same_type({dx.t, dout.t, x.t, weight.t})) {
    launch_backward<true>(dx, dout, x, weight, nullptr, rstd, R, C, shape, scratch, &G, s);
  } else {
    const int64_t rpc = rows_per_chunk(R);
    G = row_chunks(R);
    dispatch_uniform("rmsnorm_backward", {dout.t, x.t}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile),
                      static_cast<unsigned>(G));
      rms_backward_partials_kernel<T><<<grid, dim3(kColTile, kRowThreads), 0, s>>>(
          rd<T>(dout), rd<T>(x), rstd, R, C, rpc, scratch);
      FSDP_CHECK_LAUNCH();
    });
    dispatch_uniform("rmsnorm_backward", {dx.t, dout.t, x.t, weight.t}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
      rms_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
          wr<T>(dx), rd<T>(dout), rd<T>(x), rd<T>(weight), rstd, R, C);
      FSDP_CHECK_LAUNCH();
    });
  }
  column_partials_finish("rmsnorm_backward", dweight, dweight, scratch, 1, G, C, s);
}

void layernorm_forward(Out out, float* mean, float* rstd, In x, In weight, In bias, int64_t R,
                       int64_t C, float eps, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const RowShape shape = row_shape(C);
  if (shape.tpr > 0 && same_type({out.t, x.t, weight.t, bias.t})) {
    launch_forward<false>(out, mean, rstd, x, weight, bias, R, C, eps, shape, s);
    return;
  }
  dispatch_uniform("layernorm_forward", {out.t, x.t, weight.t, bias.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
    ln_forward_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
        wr<T>(out), mean, rstd, rd<T>(x), rd<T>(weight), rd<T>(bias), R, C, eps);
    FSDP_CHECK_LAUNCH();
  });
}

// The fused residual adds: one launch of the row kernel when it gives the unfused calls' bits
// - every row argument of one storage type, C within the row kernels, and residual and
// proj_bias 16-byte aligned whenever the norm's own arguments are (the norm's column layout,
// hence the order of its row sums, must not change) - otherwise add_bias_residual's launch,
// then the norm's (the unfused calls themselves).
namespace {
bool fused_add_fits(RowShape shape, std::initializer_list<ST> types, In h, In proj_bias,
                    In residual, bool norm_vec) {
  return shape.tpr > 0 && same_type(types) && (!proj_bias.p || proj_bias.t == h.t) &&
         (!norm_vec || add_vec(residual, proj_bias));
}
}  // namespace

void add_layernorm_forward(Out h, Out out, float* mean, float* rstd, In residual, In proj_bias,
                           In weight, In bias, int64_t R, int64_t C, float eps, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;  // as layernorm_forward
  const RowShape shape = row_shape(C);
  const In hin{h.p, h.t};
  if (fused_add_fits(shape, {h.t, out.t, residual.t, weight.t, bias.t}, hin, proj_bias,
                     residual, forward_vec<false>(out, hin, weight, bias, C))) {
    launch_forward<false, true>(out, mean, rstd, hin, weight, bias, R, C, eps, shape, s, residual,
                                proj_bias);
    return;
  }
  add_bias_residual(h, proj_bias, residual, R, C, s);
  layernorm_forward(out, mean, rstd, hin, weight, bias, R, C, eps, s);
}

void add_rmsnorm_forward(Out h, Out out, float* rstd, In residual, In proj_bias, In weight,
                         int64_t R, int64_t C, float eps, cudaStream_t s) {
  if (R <= 0) return;  // as rmsnorm_forward (C = 0 still writes rstd: the fallback below)
  const RowShape shape = row_shape(C);
  const In hin{h.p, h.t};
  if (fused_add_fits(shape, {h.t, out.t, residual.t, weight.t}, hin, proj_bias, residual,
                     forward_vec<true>(out, hin, weight, weight, C))) {
    launch_forward<true, true>(out, nullptr, rstd, hin, weight, weight, R, C, eps, shape, s,
                               residual, proj_bias);
    return;
  }
  add_bias_residual(h, proj_bias, residual, R, C, s);
  rmsnorm_forward(out, rstd, hin, weight, R, C, eps, s);
}

int64_t layernorm_backward_scratch_floats(int64_t R, int64_t C) {
  return 2 * partial_rows(R, C) * C;
}

void layernorm_backward(Out dx, Out dweight, Out dbias, In dout, In x, In weight, const float* mean,
                        const float* rstd, int64_t R, int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const RowShape shape = row_shape(C);
  int64_t G = 0;
  if (shape.tpr > 0 && same_type({dx.t, dout.t, x.t, weight.t})) {
    launch_backward<false>(dx, dout, x, weight, mean, rstd, R, C, shape, scratch, &G, s);
  } else {
    // Partials before dx: even a dx that aliased dout is read before it is overwritten.
    const int64_t rpc = rows_per_chunk(R);
    G = row_chunks(R);
    dispatch_uniform("layernorm_backward", {dout.t, x.t}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile),
                      static_cast<unsigned>(G));
      ln_backward_partials_kernel<T><<<grid, dim3(kColTile, kRowThreads), 0, s>>>(
          rd<T>(dout), rd<T>(x), mean, rstd, R, C, rpc, scratch);
      FSDP_CHECK_LAUNCH();
    });
    dispatch_uniform("layernorm_backward", {dx.t, dout.t, x.t, weight.t}, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const auto blocks = static_cast<unsigned>((R + kRowsPerBlock - 1) / kRowsPerBlock);
      ln_backward_dx_kernel<T><<<blocks, 32 * kRowsPerBlock, 0, s>>>(
          wr<T>(dx), rd<T>(dout), rd<T>(x), rd<T>(weight), mean, rstd, R, C);
      FSDP_CHECK_LAUNCH();
    });
  }
  column_partials_finish("layernorm_backward", dweight, dbias, scratch, 2, G, C, s);
}

}  // namespace fsdp::cuda::kernels
