// src/cuda/kernels_moe.cu: mixture-of-experts routing (softmax or sigmoid, top-k) and the
// weighted combination of the experts' output rows, forward and backward (kernels.hpp
// "mixture of experts"; fsdp/backend/kernels.hpp states the contracts). fp32 math on loaded
// values, results rounded once to the storage type, as the CPU backend computes them.
//
// Deterministic without atomics: every output element is written by one thread, and every
// sum runs in a fixed order that depends on the shapes only:
//  - router: one warp per token row. The softmax's max and fp64 sum of exps are per-lane
//    loops over experts lane, lane + 32, ... followed by the xor-shuffle tree (warp_max,
//    warp_sum); the top-k picks are K warp-wide arg-max reductions; the sums over the K
//    picks (the normalisation, the backward's dot products) run j = 0..K-1 in turn in fp32,
//    as on the CPU.
//  - sigmoid router (DeepSeek-V3's biased, group-limited choice): one warp per row, the
//    row's choice values in shared memory, group scores per lane (two largest, in fp32), the
//    K picks as above; its backward as the softmax router's, j = 0..K-1 in turn in fp32.
//  - combine forward: one thread per output element (8 consecutive ones with 16-byte
//    accesses), summing j = 0..K-1 in turn.
//  - combine backward: one warp per (token, pick) pair; dweights' dot product over C is a
//    per-lane fp32 sum over the lane's columns in ascending order, then the xor tree.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Experts per lane the router keeps in registers: E <= 32 * kMaxCached (256; Qwen3-30B-A3B
// has 128, OLMoE 64, Mixtral 8). Larger E recomputes p from the logits at each pick.
constexpr int kMaxCached = 8;

// ---- routing: softmax and top-k ----

// Softmax statistics of the E logits at x[base, base + E), computed by the warp (every lane
// returns the same): mx, their max, and inv = 1 / (the fp64 sum of the fp32 exp(x - mx)),
// rounded to fp32, as the CPU's moe_softmax.
template <class T>
__device__ __forceinline__ void softmax_stats(Rd<T> x, int64_t base, int64_t E, int lane, float& mx,
                                              float& inv) {
  float m = -INFINITY;
  for (int64_t e = lane; e < E; e += 32) m = fmaxf(m, x[base + e]);
  m = warp_max(m);
  double sum = 0.0;
  for (int64_t e = lane; e < E; e += 32) sum += static_cast<double>(expf(x[base + e] - m));
  sum = warp_sum(sum);
  mx = m;
  inv = static_cast<float>(1.0 / sum);
}

// p = softmax(x)[e] from the statistics above: the one expression forward and backward share,
// so the backward's p is bit for bit the forward's.
__device__ __forceinline__ float prob(float x, float mx, float inv) { return expf(x - mx) * inv; }

// Whether candidate (p, e) ranks before (bp, be) in the pick order: p descending, ties to the
// lower expert index; be < 0 is "none yet".
__device__ __forceinline__ bool ranks_before(float p, int e, float bp, int be) {
  return be < 0 || p > bp || (p == bp && e < be);
}

// idx[r, :], w[r, :] (fp32 [R,K]) = the K largest p of row r of logits ([R,E]) in descending
// order, ties to the lower expert index, with w = p / (the fp32 sum of the K, j ascending)
// when `normalize`, else p. One warp per row. Pick j is the best candidate (ranks_before)
// among the experts that rank after pick j - 1, which is the CPU's "best not yet taken" when
// no p is NaN: each lane takes its best eligible expert, then a 5-step xor-shuffle arg-max
// (an order-independent choice) gives every lane the pick. kPer > 0: each lane holds the p
// of experts lane + 32 i, i < kPer, in registers (E <= 32 kPer); kPer == 0: recomputed.
template <class T, int kPer>
__global__ void __launch_bounds__(kThreads)
    router_forward_kernel(int32_t* idx, float* w, Rd<T> logits, int64_t R, int64_t E, int64_t K,
                          bool normalize) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < R;
       r += stride) {
    const int64_t base = r * E;
    float mx, inv;
    softmax_stats(logits, base, E, lane, mx, inv);
    float cached[kPer > 0 ? kPer : 1];
    if constexpr (kPer > 0) {
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int64_t e = lane + 32 * i;
        cached[i] = e < E ? prob(logits[base + e], mx, inv) : 0.0f;
      }
    }
    float prev_p = 0.0f, sum = 0.0f;
    int prev_e = -1;  // the previous pick; -1 before the first
    for (int64_t j = 0; j < K; ++j) {
      float bp = 0.0f;
      int be = -1;
      auto consider = [&](float p, int e) {
        const bool after = prev_e < 0 || p < prev_p || (p == prev_p && e > prev_e);
        if (after && ranks_before(p, e, bp, be)) {
          bp = p;
          be = e;
        }
      };
      if constexpr (kPer > 0) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int e = lane + 32 * i;
          if (e < E) consider(cached[i], e);
        }
      } else {
        for (int64_t e = lane; e < E; e += 32) {
          consider(prob(logits[base + e], mx, inv), static_cast<int>(e));
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float op = __shfl_xor_sync(kFullMask, bp, o);
        const int oe = __shfl_xor_sync(kFullMask, be, o);
        if (oe >= 0 && ranks_before(op, oe, bp, be)) {
          bp = op;
          be = oe;
        }
      }
      if (lane == (j & 31)) {  // pick j is written, and normalised below, by lane j % 32
        idx[r * K + j] = be;
        w[r * K + j] = bp;
      }
      sum += bp;
      prev_p = bp;
      prev_e = be;
    }
    if (normalize) {
      for (int64_t j = lane; j < K; j += 32) w[r * K + j] = w[r * K + j] / sum;
    }
  }
}

// dlogits[r, :] ([R,E]) from dw[r, :] (fp32 [R,K]), the picks idx[r, :] and p recomputed from
// logits[r, :] as the forward did. One warp per row. Every lane computes the row's scalars,
// j = 0..K-1 in turn in fp32 (as the CPU): S = sum p_j, wd = sum (p_j / S) dw_j, dp_j =
// (dw_j - wd) / S (dw_j without `normalize`), s = sum p_j dp_j. Then each lane writes its
// experts e (lane, lane + 32, ...): p[e] (dp[e] - s), dp[e] that of the last pick naming e,
// 0 if none does. The scalars' reads of logits end (__syncwarp) before any lane writes, and
// a lane reads an expert's logit only before it writes that expert's gradient, so dlogits
// may be logits. Picks outside [0, E) (the CPU backend rejects them) are skipped.
template <class T>
__global__ void __launch_bounds__(kThreads)
    router_backward_kernel(Wr<T> dlogits, const float* dw, Rd<T> logits, const int32_t* idx,
                           int64_t R, int64_t E, int64_t K, bool normalize) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < R;
       r += stride) {
    const int64_t base = r * E;
    const int32_t* ix = idx + r * K;
    const float* d = dw + r * K;
    float mx, inv;
    softmax_stats(logits, base, E, lane, mx, inv);
    // p of pick j (0 for an out-of-range pick)
    auto pick_p = [&](int64_t j) {
      const int32_t e = ix[j];
      return e >= 0 && e < E ? prob(logits[base + e], mx, inv) : 0.0f;
    };
    float S = 0.0f, wd = 0.0f;
    if (normalize) {
      for (int64_t j = 0; j < K; ++j) S += pick_p(j);
      for (int64_t j = 0; j < K; ++j) wd += pick_p(j) / S * d[j];
    }
    auto pick_dp = [&](int64_t j) { return normalize ? (d[j] - wd) / S : d[j]; };
    float s = 0.0f;
    for (int64_t j = 0; j < K; ++j) s += pick_p(j) * pick_dp(j);
    __syncwarp();  // every lane's reads of the picks' logits precede the writes below
    for (int64_t e = lane; e < E; e += 32) {
      float dp = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        if (ix[j] == e) dp = pick_dp(j);
      }
      dlogits.set(base + e, prob(logits[base + e], mx, inv) * (dp - s));
    }
  }
}

// ---- sigmoid routing: a selection bias, group-limited choice (DeepSeek-V3, GLM-4.5) ----

// Warps per block of the sigmoid router's forward, and the largest E it takes: each warp
// keeps its row's E choice values and E / 2 group scores in shared memory (24 KiB a block).
constexpr int kSigmoidWarps = 4;
constexpr int64_t kSigmoidMaxExperts = 1024;

// s = sigmoid(x) in fp32: the one expression the forward, its weights and the backward share.
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// idx[r, :], w[r, :] (fp32 [R,K]) for row r of logits ([R,E], E <= kSigmoidMaxExperts), one
// warp per row: c[e] = sigmoid(logit) + bias[e] in shared memory; with n_group > 1 each lane
// scores its groups (h = lane, lane + 32, ...: the fp32 sum of the group's two largest c),
// then keeps group h iff fewer than topk_group groups rank before it (a larger score, or an
// equal one and a lower index), else sets its experts' c to 0. The K picks are warp arg-maxes
// over c as the softmax router's (ranks_before: c descending, ties to the lower expert; pick
// j among the experts that rank after pick j - 1). w[r, j] = scale s[pick j], or scale
// (s / (S + 1e-20)) with S the fp32 sum of the K picked s (j ascending) when `normalize`.
template <class T>
__global__ void __launch_bounds__(kSigmoidWarps * 32)
    sigmoid_router_forward_kernel(int32_t* idx, float* w, Rd<T> logits, Rd<T> bias, int64_t R,
                                  int64_t E, int64_t K, SigmoidRouting g) {
  __shared__ float choice[kSigmoidWarps][kSigmoidMaxExperts];
  __shared__ float group_score[kSigmoidWarps][kSigmoidMaxExperts / 2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* c = choice[warp];
  float* score = group_score[warp];
  const int n = static_cast<int>(E);
  const int n_group = static_cast<int>(g.n_group), topk_group = static_cast<int>(g.topk_group);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kSigmoidWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kSigmoidWarps + warp; r < R; r += stride) {
    const int64_t base = r * E;
    __syncwarp();  // the previous row's reads of c and score end before they are overwritten
    for (int e = lane; e < n; e += 32) c[e] = sigmoid_f(logits[base + e]) + bias[e];
    __syncwarp();
    if (n_group > 1) {
      const int size = n / n_group;  // >= 2 (the argument checks)
      for (int h = lane; h < n_group; h += 32) {
        float top1 = -INFINITY, top2 = -INFINITY;
        for (int e = h * size; e < (h + 1) * size; ++e) {
          const float v = c[e];
          if (v > top1) {
            top2 = top1;
            top1 = v;
          } else if (v > top2) {
            top2 = v;
          }
        }
        score[h] = top1 + top2;
      }
      __syncwarp();  // every score is written before any is read, and every c read
      for (int h = lane; h < n_group; h += 32) {
        int ahead = 0;  // groups ranking before h
        for (int o = 0; o < n_group; ++o) {
          ahead += score[o] > score[h] || (score[o] == score[h] && o < h);
        }
        if (ahead >= topk_group) {
          for (int e = h * size; e < (h + 1) * size; ++e) c[e] = 0.0f;
        }
      }
      __syncwarp();
    }
    float prev_c = 0.0f, sum = 0.0f;
    int prev_e = -1;  // the previous pick; -1 before the first
    for (int64_t j = 0; j < K; ++j) {
      float bc = 0.0f;
      int be = -1;
      for (int e = lane; e < n; e += 32) {
        const float v = c[e];
        const bool after = prev_e < 0 || v < prev_c || (v == prev_c && e > prev_e);
        if (after && ranks_before(v, e, bc, be)) {
          bc = v;
          be = e;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float oc = __shfl_xor_sync(kFullMask, bc, o);
        const int oe = __shfl_xor_sync(kFullMask, be, o);
        if (oe >= 0 && ranks_before(oc, oe, bc, be)) {
          bc = oc;
          be = oe;
        }
      }
      const float s = be >= 0 ? sigmoid_f(logits[base + be]) : 0.0f;  // (-1: only NaN c)
      if (lane == (j & 31)) {  // pick j is written, and finished below, by lane j % 32
        idx[r * K + j] = be;
        w[r * K + j] = s;
      }
      sum += s;
      prev_c = bc;
      prev_e = be;
    }
    const float denom = sum + 1e-20f;
    for (int64_t j = lane; j < K; j += 32) {
      const float s = w[r * K + j];
      w[r * K + j] = g.normalize ? s / denom * g.scale : s * g.scale;
    }
  }
}

// dlogits[r, :] ([R,E]) from dw[r, :] (fp32 [R,K]), the picks idx[r, :] and s recomputed from
// logits[r, :] as the forward did. One warp per row. Every lane computes the row's scalars,
// j = 0..K-1 in turn in fp32: S = sum s_j + 1e-20, wd = sum (s_j / S) dw_j (= sum w_j dw_j /
// scale), ds_j = scale (dw_j - wd) / S (scale dw_j without `normalize`). Then each lane writes
// its experts e (lane, lane + 32, ...): ds[e] s[e] (1 - s[e]), ds[e] that of the last pick
// naming e, 0 if none does. As the softmax router's backward, dlogits may be logits, and picks
// outside [0, E) are skipped.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sigmoid_router_backward_kernel(Wr<T> dlogits, const float* dw, Rd<T> logits, const int32_t* idx,
                                   int64_t R, int64_t E, int64_t K, bool normalize, float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < R;
       r += stride) {
    const int64_t base = r * E;
    const int32_t* ix = idx + r * K;
    const float* d = dw + r * K;
    // s of pick j (0 for an out-of-range pick)
    auto pick_s = [&](int64_t j) {
      const int32_t e = ix[j];
      return e >= 0 && e < E ? sigmoid_f(logits[base + e]) : 0.0f;
    };
    float S = 0.0f, wd = 0.0f;
    if (normalize) {
      for (int64_t j = 0; j < K; ++j) S += pick_s(j);
      S += 1e-20f;
      for (int64_t j = 0; j < K; ++j) wd += pick_s(j) / S * d[j];
    }
    __syncwarp();  // every lane's reads of the picks' logits precede the writes below
    for (int64_t e = lane; e < E; e += 32) {
      int64_t pick = -1;
      for (int64_t j = 0; j < K; ++j) {
        if (ix[j] == e) pick = j;
      }
      float grad = 0.0f;
      if (pick >= 0) {
        const float ds = normalize ? scale * (d[pick] - wd) / S : scale * d[pick];
        const float s = sigmoid_f(logits[base + e]);
        grad = ds * s * (1.0f - s);
      }
      dlogits.set(base + e, grad);
    }
  }
}

// ---- combination of the experts' rows ----

// out[r, c] = sum over j = 0..K-1 in turn of w[r, j] rows[slot[r K + j], c] in fp32 (w null:
// 1), rounded once. One thread per element (r, c), consecutive threads along c; with `vec`
// (T a storage type, C % 8 == 0, 16-byte aligned out and rows) one thread per 8 consecutive
// elements, 16-byte loads and stores. A slot outside [0, N) (the CPU backend rejects it) adds
// nothing.
template <class T>
__global__ void __launch_bounds__(kThreads)
    combine_forward_kernel(Wr<T> out, Rd<T> rows, const float* w, const int32_t* slot, int64_t R,
                           int64_t K, int64_t C, int64_t N, bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if constexpr (!std::is_same_v<T, Dyn>) {
    if (vec) {
      const int64_t packs = C / 8;
      for (int64_t i = first; i < R * packs; i += stride) {
        const int64_t r = i / packs, c = (i - r * packs) * 8;
        float acc[8] = {};
        for (int64_t j = 0; j < K; ++j) {
          const int32_t sl = slot[r * K + j];
          if (sl < 0 || sl >= N) continue;
          const float a = w ? w[r * K + j] : 1.0f;
          const Pack8<T> x = load8(rows.p + static_cast<int64_t>(sl) * C + c);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[k] = fmaf(a, to_f(x.v[k]), acc[k]);
        }
        Pack8<T> o;
#pragma unroll
        for (int k = 0; k < 8; ++k) o.v[k] = from_f<T>(acc[k]);
        store8(out.p + r * C + c, o);
      }
      return;
    }
  }
  for (int64_t i = first; i < R * C; i += stride) {
    const int64_t r = i / C, c = i - r * C;
    float acc = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t sl = slot[r * K + j];
      if (sl < 0 || sl >= N) continue;
      const float a = w ? w[r * K + j] : 1.0f;
      acc = fmaf(a, rows[static_cast<int64_t>(sl) * C + c], acc);
    }
    out.set(i, acc);
  }
}

// For each pair q = r K + j (R K of them), one warp: drows[slot[q], c] = w[q] dout[r, c]
// (rounded to drows' type) and dw[q] = sum over c of dout[r, c] rows[slot[q], c] (fp32): each
// lane sums its columns in ascending order (with `vec`, 8 consecutive columns per 16-byte
// access, lane + 32 i the packs), then the xor-shuffle tree. A slot outside [0, N) (the CPU
// backend rejects it) writes no row and a zero dw.
template <class T>
__global__ void __launch_bounds__(kThreads)
    combine_backward_kernel(Wr<T> drows, float* dw, Rd<T> dout, Rd<T> rows, const float* w,
                            const int32_t* slot, int64_t R, int64_t K, int64_t C, int64_t N,
                            bool vec) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t q = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); q < R * K;
       q += stride) {
    const int32_t sl = slot[q];
    float dot = 0.0f;
    if (sl >= 0 && sl < N) {
      const int64_t r = q / K, src = r * C, dst = static_cast<int64_t>(sl) * C;
      const float a = w[q];
      bool done = false;
      if constexpr (!std::is_same_v<T, Dyn>) {
        if (vec) {
          for (int64_t c = 8 * lane; c < C; c += 8 * 32) {
            const Pack8<T> d = load8(dout.p + src + c), x = load8(rows.p + dst + c);
            Pack8<T> g;
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              const float dk = to_f(d.v[k]);
              g.v[k] = from_f<T>(a * dk);
              dot = fmaf(dk, to_f(x.v[k]), dot);
            }
            store8(drows.p + dst + c, g);
          }
          done = true;
        }
      }
      if (!done) {
        for (int64_t c = lane; c < C; c += 32) {
          const float dk = dout[src + c];
          drows.set(dst + c, a * dk);
          dot = fmaf(dk, rows[dst + c], dot);
        }
      }
    }
    dot = warp_sum(dot);
    if (lane == 0) dw[q] = dot;
  }
}

// ---- the load-balancing loss ----

// Rows per block of the probability sums: the chunking depends on R alone (deterministic).
constexpr int64_t kProbRowsPerBlock = 64;
constexpr int kProbWarps = 4;
// The largest E the probability sums take (kProbWarps x E doubles of shared memory).
constexpr int64_t kProbMaxExperts = 1024;

// partial[b, e] = sum over block b's rows r (kProbRowsPerBlock of them) of p[r, e] (fp64):
// warp w takes rows w, w + kProbWarps, ... of the block, each lane its experts, into its
// own shared column sums; the block then adds the warps' sums w = 0..kProbWarps-1.
template <class T>
__global__ void __launch_bounds__(kProbWarps * 32)
    prob_partials_kernel(double* partial, Rd<T> logits, int64_t R, int64_t E) {
  extern __shared__ double acc[];  // [kProbWarps][E]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t i = threadIdx.x; i < kProbWarps * E; i += blockDim.x) acc[i] = 0.0;
  __syncthreads();
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kProbRowsPerBlock;
  const int64_t last = min(first + kProbRowsPerBlock, R);
  for (int64_t r = first + warp; r < last; r += kProbWarps) {
    float mx, inv;
    softmax_stats(logits, r * E, E, lane, mx, inv);
    for (int64_t e = lane; e < E; e += 32) acc[warp * E + e] += prob(logits[r * E + e], mx, inv);
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    double sum = 0.0;
    for (int w = 0; w < kProbWarps; ++w) sum += acc[w * E + e];
    partial[static_cast<int64_t>(blockIdx.x) * E + e] = sum;
  }
}

// psum[e] += sum over blocks b = 0..nb-1 in turn of partial[b, e], rounded once to fp32.
__global__ void prob_sums_kernel(float* psum, const double* partial, int64_t nb, int64_t E) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= E) return;
  double sum = 0.0;
  for (int64_t b = 0; b < nb; ++b) sum += partial[b * E + e];
  psum[e] += static_cast<float>(sum);
}

// loss[0] += alpha sum_e counts[e] psum[e], e ascending in fp64 (one thread: E is small).
__global__ void aux_loss_kernel(double* loss, const float* counts, const float* psum, int64_t E,
                                double alpha) {
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(counts[e]) * psum[e];
  loss[0] += alpha * sum;
}

// dlogits[r, e] += p[r, e] (dprobs[e] - s), s = sum_e p[r, e] dprobs[e] (each lane's experts
// in turn, then the xor tree). One warp per row; p recomputed as the router's.
template <class T>
__global__ void __launch_bounds__(kThreads)
    aux_loss_backward_kernel(Wr<T> dlogits, Rd<T> logits, const float* dprobs, int64_t R,
                             int64_t E) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < R;
       r += stride) {
    const int64_t base = r * E;
    float mx, inv;
    softmax_stats(logits, base, E, lane, mx, inv);
    float s = 0.0f;
    for (int64_t e = lane; e < E; e += 32) s += prob(logits[base + e], mx, inv) * dprobs[e];
    s = warp_sum(s);
    __syncwarp();  // (dlogits may not alias logits: the reads above end first anyway)
    for (int64_t e = lane; e < E; e += 32) {
      const float p = prob(logits[base + e], mx, inv);
      dlogits.set(base + e, dlogits.get(base + e) + p * (dprobs[e] - s));
    }
  }
}

// ---- a shared expert's sigmoid gate ----

// out[r, c] += sigmoid(logit[r]) shared[r, c] (fp32, rounded once). One thread per element.
template <class T>
__global__ void __launch_bounds__(kThreads)
    shared_gate_forward_kernel(Wr<T> out, Rd<T> shared, Rd<T> logit, int64_t R, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < R * C;
       i += stride) {
    const float s = 1.0f / (1.0f + expf(-logit[i / C]));
    out.set(i, out.get(i) + s * shared[i]);
  }
}

// dshared[r, :] = s dout[r, :], dlogit[r] = s (1 - s) sum_c dout[r, c] shared[r, c],
// s = sigmoid(logit[r]): one warp per row, each lane's columns in ascending order, then the
// xor tree.
template <class T>
__global__ void __launch_bounds__(kThreads)
    shared_gate_backward_kernel(Wr<T> dshared, Wr<T> dlogit, Rd<T> dout, Rd<T> shared,
                                Rd<T> logit, int64_t R, int64_t C) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5); r < R;
       r += stride) {
    const float s = 1.0f / (1.0f + expf(-logit[r]));
    float dot = 0.0f;
    for (int64_t c = lane; c < C; c += 32) {
      const float d = dout[r * C + c];
      dshared.set(r * C + c, s * d);
      dot = fmaf(d, shared[r * C + c], dot);
    }
    dot = warp_sum(dot);
    if (lane == 0) dlogit.set(r, dot * s * (1.0f - s));
  }
}

// The router's kernel for E experts: experts cached in registers up to 32 kMaxCached.
template <class T>
void launch_router_forward(int32_t* idx, float* w, Rd<T> x, int64_t R, int64_t E, int64_t K,
                           bool normalize, cudaStream_t s) {
  static_assert(kMaxCached == 8, "the cases below");
  const int blocks = blocks_for(R, kWarps);
  if (E <= 32) {
    router_forward_kernel<T, 1><<<blocks, kThreads, 0, s>>>(idx, w, x, R, E, K, normalize);
  } else if (E <= 64) {
    router_forward_kernel<T, 2><<<blocks, kThreads, 0, s>>>(idx, w, x, R, E, K, normalize);
  } else if (E <= 128) {
    router_forward_kernel<T, 4><<<blocks, kThreads, 0, s>>>(idx, w, x, R, E, K, normalize);
  } else if (E <= 256) {
    router_forward_kernel<T, 8><<<blocks, kThreads, 0, s>>>(idx, w, x, R, E, K, normalize);
  } else {
    router_forward_kernel<T, 0><<<blocks, kThreads, 0, s>>>(idx, w, x, R, E, K, normalize);
  }
  FSDP_CHECK_LAUNCH();
}

}  // namespace

void moe_router_forward(int32_t* idx, float* weights, In logits, int64_t R, int64_t E, int64_t K,
                        bool normalize, cudaStream_t s) {
  if (R <= 0 || E <= 0 || K <= 0) return;
  dispatch_float("moe_router_forward", logits.t, [&](auto tag) {
    using V = typename decltype(tag)::type;
    launch_router_forward<V>(idx, weights, rd<V>(logits), R, E, K, normalize, s);
  });
}

void moe_router_backward(Out dlogits, const float* dweights, In logits, const int32_t* idx,
                         int64_t R, int64_t E, int64_t K, bool normalize, cudaStream_t s) {
  if (R <= 0 || E <= 0) return;
  dispatch_uniform("moe_router_backward", {dlogits.t, logits.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    router_backward_kernel<V><<<blocks_for(R, kWarps), kThreads, 0, s>>>(
        wr<V>(dlogits), dweights, rd<V>(logits), idx, R, E, K, normalize);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_sigmoid_router_forward(int32_t* idx, float* weights, In logits, In bias, int64_t R,
                                int64_t E, int64_t K, const SigmoidRouting& g, cudaStream_t s) {
  if (E > kSigmoidMaxExperts) {
    throw Error("cuda backend: moe_sigmoid_router_forward: E = " + std::to_string(E) +
                " (expected at most " + std::to_string(kSigmoidMaxExperts) + ")");
  }
  if (R <= 0 || E <= 0 || K <= 0) return;
  dispatch_uniform("moe_sigmoid_router_forward", {logits.t, bias.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    sigmoid_router_forward_kernel<V><<<blocks_for(R, kSigmoidWarps), kSigmoidWarps * 32, 0, s>>>(
        idx, weights, rd<V>(logits), rd<V>(bias), R, E, K, g);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_sigmoid_router_backward(Out dlogits, const float* dweights, In logits, const int32_t* idx,
                                 int64_t R, int64_t E, int64_t K, const SigmoidRouting& g,
                                 cudaStream_t s) {
  if (R <= 0 || E <= 0) return;
  dispatch_uniform("moe_sigmoid_router_backward", {dlogits.t, logits.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    sigmoid_router_backward_kernel<V><<<blocks_for(R, kWarps), kThreads, 0, s>>>(
        wr<V>(dlogits), dweights, rd<V>(logits), idx, R, E, K, g.normalize, g.scale);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_combine_forward(Out out, In rows, const float* weights, const int32_t* slot, int64_t R,
                         int64_t K, int64_t C, int64_t N, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch_uniform("moe_combine_forward", {out.t, rows.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = C % 8 == 0 && aligned16(out.p) && aligned16(rows.p);
    const int64_t items = vec ? R * (C / 8) : R * C;
    combine_forward_kernel<V><<<blocks_for(items, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(rows), weights, slot, R, K, C, N, vec);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_combine_backward(Out drows, float* dweights, In dout, In rows, const float* weights,
                          const int32_t* slot, int64_t R, int64_t K, int64_t C, int64_t N,
                          cudaStream_t s) {
  if (R <= 0 || K <= 0) return;
  dispatch_uniform("moe_combine_backward", {drows.t, dout.t, rows.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = C % 8 == 0 && aligned16(drows.p) && aligned16(dout.p) && aligned16(rows.p);
    combine_backward_kernel<V><<<blocks_for(R * K, kWarps), kThreads, 0, s>>>(
        wr<V>(drows), dweights, rd<V>(dout), rd<V>(rows), weights, slot, R, K, C, N, vec);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_shared_gate_forward(Out out, In shared, In logit, int64_t R, int64_t C,
                             cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  dispatch_uniform("moe_shared_gate_forward", {out.t, shared.t, logit.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    shared_gate_forward_kernel<V><<<blocks_for(R * C, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(shared), rd<V>(logit), R, C);
    FSDP_CHECK_LAUNCH();
  });
}

void moe_shared_gate_backward(Out dshared, Out dlogit, In dout, In shared, In logit, int64_t R,
                              int64_t C, cudaStream_t s) {
  if (R <= 0) return;
  dispatch_uniform("moe_shared_gate_backward",
                   {dshared.t, dlogit.t, dout.t, shared.t, logit.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    shared_gate_backward_kernel<V><<<blocks_for(R, kWarps), kThreads, 0, s>>>(
        wr<V>(dshared), wr<V>(dlogit), rd<V>(dout), rd<V>(shared), rd<V>(logit), R, C);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t moe_router_prob_sums_scratch_doubles(int64_t R, int64_t E) {
  return R > 0 && E > 0 ? (R + kProbRowsPerBlock - 1) / kProbRowsPerBlock * E : 0;
}

void moe_router_prob_sums(float* psum, In logits, int64_t R, int64_t E, double* scratch,
                          cudaStream_t s) {
  if (R <= 0 || E <= 0) return;
  if (E > kProbMaxExperts) {
    throw Error("cuda backend: moe_router_prob_sums: E = " + std::to_string(E) +
                " (expected at most " + std::to_string(kProbMaxExperts) + ")");
  }
  const int64_t nb = (R + kProbRowsPerBlock - 1) / kProbRowsPerBlock;
  const auto smem = static_cast<std::size_t>(kProbWarps * E) * sizeof(double);
  dispatch_float("moe_router_prob_sums", logits.t, [&](auto tag) {
    using V = typename decltype(tag)::type;
    prob_partials_kernel<V><<<static_cast<unsigned>(nb), kProbWarps * 32, smem, s>>>(
        scratch, rd<V>(logits), R, E);
    FSDP_CHECK_LAUNCH();
  });
  prob_sums_kernel<<<static_cast<unsigned>((E + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      psum, scratch, nb, E);
  FSDP_CHECK_LAUNCH();
}

void moe_aux_loss(double* loss, const float* counts, const float* psum, int64_t E, double alpha,
                  cudaStream_t s) {
  aux_loss_kernel<<<1, 1, 0, s>>>(loss, counts, psum, E, alpha);
  FSDP_CHECK_LAUNCH();
}

void moe_aux_loss_backward(Out dlogits, In logits, const float* dprobs, int64_t R, int64_t E,
                           cudaStream_t s) {
  if (R <= 0 || E <= 0) return;
  dispatch_uniform("moe_aux_loss_backward", {dlogits.t, logits.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    aux_loss_backward_kernel<V><<<blocks_for(R, kWarps), kThreads, 0, s>>>(
        wr<V>(dlogits), rd<V>(logits), dprobs, R, E);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
