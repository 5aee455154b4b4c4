// src/cuda/kernels_loss.cu: softmax cross-entropy over V classes, fused with its gradient
// (see kernels.hpp).
//
// One block per row. Pass 1 reads the row's V classes (row stride ld >= V; columns [V, ld)
// are vocabulary padding) once with an online (max, sum of exp) per thread, combined across
// the block in a fixed order: logsumexp without a second logits-sized buffer. The row loss
// (fp64) goes to row_loss[r]; with the gradient, pass 2 overwrites the row with
// (softmax - onehot) * grad_scale (zeros for a kIgnoreTarget row, which adds no loss) and the
// padding columns with 0. Then one block adds the row losses in a fixed
// order into the fp64 device scalar. All math in fp32 except the loss (fp64), as on the CPU.
// With a soft-cap (Gemma 2's final_logit_softcapping) both passes read
// softcap * tanh(logit / softcap) for each logit (recomputed in pass 2, which also multiplies
// the gradient by the cap's derivative 1 - tanh^2).
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 512;

// The logit the softmax reads: softcap * tanh(x / softcap) (inv = 1 / softcap), or x when
// softcap == 0; *dcap = its derivative (1 - tanh^2, or 1).
__device__ __forceinline__ float capped(float x, float softcap, float inv, float* dcap) {
  if (softcap == 0.0f) {
    *dcap = 1.0f;
    return x;
  }
  const float th = tanhf(x * inv);
  *dcap = 1.0f - th * th;
  return softcap * th;
}

// (m, s) <- (m, s) + (m2, s2): sums of exp(x - m) rescaled to the larger max.
__device__ __forceinline__ void combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = (m == -INFINITY ? 0.0f : s * expf(m - mn)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - mn));
  m = mn;
}

// Every thread's (m, s) combined over the block, in a fixed order (warps by shuffles, then
// warp 0..n-1 through shared memory): every thread returns the row's (max, sum of exp).
// sh_m, sh_s: the block's [kThreads / 32] shared slots, free again when this returns.
__device__ __forceinline__ void block_combine(float& m, float& s, float* sh_m, float* sh_s) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, o);
    const float s2 = __shfl_xor_sync(kFullMask, s, o);
    combine(m, s, m2, s2);
  }
  __syncthreads();  // sh_m / sh_s of the previous row have been read
  if (lane == 0) {
    sh_m[w] = m;
    sh_s[w] = s;
  }
  __syncthreads();
  m = sh_m[0];
  s = sh_s[0];
  for (int k = 1; k < kThreads / 32; ++k) combine(m, s, sh_m[k], sh_s[k]);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_kernel(Wr<T> logits, const int32_t* targets, int64_t R, int64_t V, int64_t ld,
                         float grad_scale, float softcap, bool backward, double* row_loss) {
  __shared__ float sh_m[kThreads / 32], sh_s[kThreads / 32];
  const float inv = softcap == 0.0f ? 0.0f : 1.0f / softcap;
  float dc;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    const int64_t base = r * ld;
    const int32_t t = targets[r];
    const bool ok = t >= 0 && t < V;
    // Read before the block synchronises: pass 2 overwrites the row.
    const float xt = ok ? capped(logits.get(base + t), softcap, inv, &dc) : 0.0f;
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      const float x = capped(logits.get(base + j), softcap, inv, &dc);
      if (x > m) {
        s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
        m = x;
      } else if (x != -INFINITY) {
        s += expf(x - m);
      }
    }
    block_combine(m, s, sh_m, sh_s);
    if (threadIdx.x == 0) {
      row_loss[r] =
          ok ? static_cast<double>(m) + log(static_cast<double>(s)) - static_cast<double>(xt) : 0.0;
    }
    if (backward && ok) {
      const float f = static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(s));
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
        float g = expf(capped(logits.get(base + j), softcap, inv, &dc) - m) * f;
        if (j == t) g -= grad_scale;
        logits.set(base + j, g * dc);
      }
    } else if (backward) {  // kIgnoreTarget (or a reported bad target): a zero gradient row
      for (int64_t j = threadIdx.x; j < V; j += blockDim.x) logits.set(base + j, 0.0f);
    }
    if (backward) {  // padding columns: no class, zero gradient
      for (int64_t j = V + threadIdx.x; j < ld; j += blockDim.x) logits.set(base + j, 0.0f);
    }
  }
}

// cross_entropy_kernel with 16-byte accesses (8 classes per load and store), for rows that
// are 16-byte aligned (ld % 8 == 0 and an aligned base): the H100 profile of GPT-2 124M had the
// scalar kernel at 2.1 ms for 8192 x 50304 bf16 logits, 2-byte loads leaving most of each
// memory transaction unused. Same passes and block-wide combination order; within a thread,
// each 8-class chunk's max is taken first, so the rescaling exp runs once per chunk.
template <class T>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_vec_kernel(T* logits, const int32_t* targets, int64_t R, int64_t V, int64_t ld,
                             float grad_scale, float softcap, bool backward, double* row_loss) {
  __shared__ float sh_m[kThreads / 32], sh_s[kThreads / 32];
  const int64_t chunks_v = (V + 7) / 8, chunks_ld = ld / 8;
  const float inv = softcap == 0.0f ? 0.0f : 1.0f / softcap;
  float dc;
  for (int64_t r = blockIdx.x; r < R; r += gridDim.x) {
    T* row = logits + r * ld;
    const int32_t t = targets[r];
    const bool ok = t >= 0 && t < V;
    // Read before pass 2 overwrites the row.
    const float xt = ok ? capped(to_f(row[t]), softcap, inv, &dc) : 0.0f;
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = threadIdx.x; c < chunks_v; c += blockDim.x) {
      const Pack8<T> pk = load8(row + 8 * c);
      float x[8], cm = -INFINITY;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        x[k] = 8 * c + k < V ? capped(to_f(pk.v[k]), softcap, inv, &dc) : -INFINITY;
        cm = fmaxf(cm, x[k]);
      }
      if (cm == -INFINITY) continue;
      if (cm > m) {
        s = m == -INFINITY ? 0.0f : s * expf(m - cm);
        m = cm;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) s += x[k] == -INFINITY ? 0.0f : expf(x[k] - m);
    }
    block_combine(m, s, sh_m, sh_s);
    if (threadIdx.x == 0) {
      row_loss[r] =
          ok ? static_cast<double>(m) + log(static_cast<double>(s)) - static_cast<double>(xt) : 0.0;
    }
    if (!backward) continue;
    const float f =
        ok ? static_cast<float>(static_cast<double>(grad_scale) / static_cast<double>(s)) : 0.0f;
    for (int64_t c = threadIdx.x; c < chunks_ld; c += blockDim.x) {
      Pack8<T> pk = load8(row + 8 * c);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int64_t j = 8 * c + k;
        float g = 0.0f;  // padding columns, and every column of a kIgnoreTarget row
        if (ok && j < V) {
          g = expf(capped(to_f(pk.v[k]), softcap, inv, &dc) - m) * f;
          if (j == t) g -= grad_scale;
          g *= dc;
        }
        pk.v[k] = from_f<T>(g);
      }
      store8(row + 8 * c, pk);
    }
  }
}

}  // namespace

void cross_entropy(Out logits, const int32_t* targets, int64_t R, int64_t V, int64_t ld,
                   float grad_scale, float softcap, bool backward, double* row_loss, double* loss,
                   cudaStream_t s) {
  if (R <= 0) return;
  if (V <= 0) return;
  dispatch_float("cross_entropy", logits.t, [&](auto tag) {
    using TT = typename decltype(tag)::type;
    if (ld % 8 == 0 && aligned16(logits.p)) {
      cross_entropy_vec_kernel<TT><<<blocks_for(R, 1), kThreads, 0, s>>>(
          static_cast<TT*>(logits.p), targets, R, V, ld, grad_scale, softcap, backward, row_loss);
      FSDP_CHECK_LAUNCH();
      return;
    }
    cross_entropy_kernel<TT><<<blocks_for(R, 1), kThreads, 0, s>>>(
        wr<TT>(logits), targets, R, V, ld, grad_scale, softcap, backward, row_loss);
    FSDP_CHECK_LAUNCH();
  });
  sum_into(loss, row_loss, R, s);
}

}  // namespace fsdp::cuda::kernels
