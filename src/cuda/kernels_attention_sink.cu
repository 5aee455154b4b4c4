// src/cuda/kernels_attention_sink.cu: gpt-oss's attention sinks (kernels.hpp "attention
// sinks"; fsdp/backend/kernels.hpp's attention_sink_* state the contracts), applied to
// flash_forward's out and lse, and the sinks' gradient. fp32 math on loaded values, results
// rounded once to the storage type, as the CPU backend computes them (expf / log1pf here,
// std::exp / std::log1p there: the last bits may differ).
//
//  - forward: one warp per (b, t, h) row, grid-stride: every lane computes the row's factor
//    and new logsumexp from (lse, sink), scales the row's columns lane, lane + 32, ...; lane
//    0 stores the new lse. Each element has one writer.
//  - backward: one block per head, deterministic without atomics: warp w sums the rows
//    r = w, w + kWarps, ... (r = b*T + t, so b then t ascending) in turn, each row's
//    dout . out a per-lane fp32 sum over its columns in ascending order then the xor tree;
//    the warps' sums meet in shared memory and warp 0 adds them by the xor tree; one thread
//    adds the negated total to dsinks[h]. The order depends on the shapes only.
// out, dout: the kernels' storage type (dout and out mixed: the run-time-typed instantiation);
// sinks, dsinks (H values each): always read and written through their run-time type.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// The row's softmax with the sink logit s joining it: f = exp(L - L') = 1 / (1 + exp(s - L))
// and L' = log(exp(L) + exp(s)), each from the larger logit (no overflow).
__device__ __forceinline__ void sink_factor(float L, float s, float& f, float& L2) {
  if (s > L) {
    const float e = expf(L - s);
    f = e / (1.0f + e);
    L2 = s + log1pf(e);
  } else {
    const float e = expf(s - L);
    f = 1.0f / (1.0f + e);
    L2 = L + log1pf(e);
  }
}

// A warp per row r = (b*T + t)*H + h of out (grid-stride over the B*T*H rows): out row *= f,
// lse = L'; a row whose lse is +inf (no visible key) is left as it is.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sink_fwd_kernel(Wr<T> out, float* lse, Rd<Dyn> sinks, int64_t T_, int64_t H, int64_t D,
                    int64_t rows) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows;
       r += warps) {
    const int64_t h = r % H, bt = r / H, b = bt / T_, t = bt % T_;
    float* l = lse + (b * H + h) * T_ + t;
    const float L = *l;
    if (isinf(L) && L > 0.0f) continue;  // the whole warp skips: L is the same for all lanes
    float f, L2;
    sink_factor(L, sinks[h], f, L2);
    for (int64_t e = lane; e < D; e += 32) out.set(r * D + e, out.get(r * D + e) * f);
    __syncwarp();  // every lane has read L before lane 0 overwrites it
    if (lane == 0) *l = L2;
  }
}

// A block per head h: dsinks[h] += -(sum over rows r = b*T + t of p_s (dout row . out row)),
// p_s = exp(s - L) (rows with L = +inf skipped: p_s = 0). dout and out: storage type T.
template <class T>
__global__ void __launch_bounds__(kThreads)
    sink_bwd_kernel(Wr<Dyn> dsinks, Rd<T> dout, Rd<T> out, const float* lse, Rd<Dyn> sinks,
                    int64_t B, int64_t T_, int64_t H, int64_t D) {
  __shared__ float partial[kWarps];
  const int64_t h = blockIdx.x;
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  const float s = sinks[h];
  float acc = 0.0f;  // this warp's sum (the same on every lane)
  for (int64_t r = w; r < B * T_; r += kWarps) {
    const int64_t b = r / T_, t = r % T_;
    const float L = lse[(b * H + h) * T_ + t];
    if (isinf(L) && L > 0.0f) continue;  // p_s = 0
    const int64_t base = (r * H + h) * D;
    float dot = 0.0f;
    for (int64_t e = lane; e < D; e += 32) dot += dout[base + e] * out[base + e];
    dot = warp_sum(dot);
    acc += expf(s - L) * dot;
  }
  if (lane == 0) partial[w] = acc;
  __syncthreads();
  if (w == 0) {
    float v = lane < kWarps ? partial[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) dsinks.set(h, dsinks.get(h) - v);
  }
}

}  // namespace

void attention_sink_forward(Out out, float* lse, In sinks, int64_t B, int64_t T, int64_t H,
                            int64_t D, cudaStream_t s) {
  const int64_t rows = B * T * H;
  if (rows <= 0) return;
  dispatch_float("attention_sink_forward", out.t, [&](auto tag) {
    using V = typename decltype(tag)::type;
    sink_fwd_kernel<V><<<blocks_for(rows, kWarps), kThreads, 0, s>>>(
        wr<V>(out), lse, rd<Dyn>(sinks), T, H, D, rows);
    FSDP_CHECK_LAUNCH();
  });
}

void attention_sink_backward(Out dsinks, In dout, In out, const float* lse, In sinks, int64_t B,
                             int64_t T, int64_t H, int64_t D, cudaStream_t s) {
  // No row (B T = 0) or no column (D = 0): the sum is 0 and dsinks keeps its values.
  if (H <= 0 || B * T <= 0 || D <= 0) return;
  dispatch_uniform("attention_sink_backward", {dout.t, out.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    sink_bwd_kernel<V><<<static_cast<unsigned>(H), kThreads, 0, s>>>(
        wr<Dyn>(dsinks), rd<V>(dout), rd<V>(out), lse, rd<Dyn>(sinks), B, T, H, D);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
