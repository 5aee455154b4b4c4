// src/cuda/kernels_llama.cu: Llama's elementwise pieces (kernels.hpp "Llama pieces"): the
// rotary position embedding in Hugging Face's rotate-half layout, SwiGLU and gpt-oss's
// clamped SwiGLU (interleaved gate/up pairs), forward and backward. fp32 math on loaded
// values, results rounded once to the storage type, as the CPU backend computes them (exp
// differs by an ulp or two: expf here, a Cephes polynomial or std::exp there).
//
// Every thread reads all the inputs of the elements it owns before it writes them, which is
// what makes the documented aliasing safe (rope: out = x; SwiGLU: out = gate or up, dgate =
// gate or dout, dup = up; clamped SwiGLU: dgate_up = gate_up, a pair a thread): no element is
// read by one thread and written by another.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// out[i] = silu(g) u
__device__ __forceinline__ float swiglu(float g, float u) { return g * sigmoid(g) * u; }
// dg = d u silu'(g), silu'(g) = s (1 + g (1 - s)); du = d silu(g)
__device__ __forceinline__ void swiglu_grad(float g, float u, float d, float& dg, float& du) {
  const float s = sigmoid(g);
  dg = d * u * (s * (1.0f + g * (1.0f - s)));
  du = d * (g * s);
}

// ---- rotary embedding ----
// One thread per column pair of a row (row r = (b*T + t)*H + h, row_pairs pairs): pair
// i < R/2 reads x[i], x[i + R/2] of the row and writes out[i], out[i + R/2] rotated; pair
// i >= R/2 copies the two unrotated columns R + 2 (i - R/2) and the next (partial rotary).
// row_pairs is R/2 when out is x (nothing to copy) and (D + 1)/2 otherwise. sign = -1 for the
// transpose (backward).
template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(Wr<T> out, Rd<T> x, const float* cos, const float* sin, int64_t T_, int64_t H,
                int64_t D, int64_t R, int64_t row_pairs, int64_t pairs, float sign) {
  const int64_t half = R / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    const int64_t i = p % row_pairs, r = p / row_pairs;
    if (i >= half) {  // pass-through columns (none when R = D)
      const int64_t j = r * D + R + 2 * (i - half);
      const float a = x[j];
      out.set(j, a);
      if (R + 2 * (i - half) + 1 < D) {
        const float b = x[j + 1];
        out.set(j + 1, b);
      }
      continue;
    }
    const int64_t t = (r / H) % T_;
    const float c = cos[t * half + i], sn = sign * sin[t * half + i];
    const int64_t lo = r * D + i, hi = lo + half;
    const float a = x[lo], b = x[hi];
    out.set(lo, a * c - b * sn);
    out.set(hi, b * c + a * sn);
  }
}

// ---- SwiGLU, for glu_fwd/bwd_kernel (kernels_common.cuh) ----
struct SwigluOp {
  template <class T>
  __device__ float fwd(float g, float u) const {
    return swiglu(g, u);
  }
  template <class T>
  __device__ void bwd(float g, float u, float d, float& dg, float& du) const {
    swiglu_grad(g, u, d, dg, du);
  }
};

// ---- clamped SwiGLU (gpt-oss) on interleaved pairs ----
// g = min(gate, limit), u = clamp(up, -limit, limit), NaN kept (as std::min / std::clamp).
__device__ __forceinline__ float clamp_hi(float x, float limit) { return x > limit ? limit : x; }
__device__ __forceinline__ float clamp_both(float x, float limit) {
  return x < -limit ? -limit : (x > limit ? limit : x);
}

// One thread per pair i (grid-stride): out[i] = (u + 1) (g sigmoid(alpha g)).
template <class T>
__global__ void __launch_bounds__(kThreads)
    clamped_swiglu_fwd_kernel(Wr<T> out, Rd<T> gate_up, int64_t n, float alpha, float limit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float g = clamp_hi(gate_up[2 * i], limit), u = clamp_both(gate_up[2 * i + 1], limit);
    const float s = sigmoid(alpha * g);
    out.set(i, (u + 1.0f) * (g * s));
  }
}

// One thread per pair i (grid-stride): reads gate_up[2i], gate_up[2i + 1] and dout[i], then
// writes dgate_up[2i], dgate_up[2i + 1] (so dgate_up may be gate_up). A clamped input passes
// no gradient; one on a bound does (torch.clamp's rule).
template <class T>
__global__ void __launch_bounds__(kThreads)
    clamped_swiglu_bwd_kernel(Wr<T> dgate_up, Rd<T> dout, Rd<T> gate_up, int64_t n, float alpha,
                              float limit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float gate = gate_up[2 * i], up = gate_up[2 * i + 1], d = dout[i];
    const float g = clamp_hi(gate, limit), u = clamp_both(up, limit);
    const float s = sigmoid(alpha * g);
    const float dg = gate <= limit ? d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
    const float du = up >= -limit && up <= limit ? d * (g * s) : 0.0f;
    dgate_up.set(2 * i, dg);
    dgate_up.set(2 * i + 1, du);
  }
}

}  // namespace

void rope(Out out, In x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
          int64_t D, int64_t R, bool transpose, cudaStream_t s) {
  // In place the unrotated columns are already there: only the R/2 rotated pairs of a row.
  // Otherwise (D + 1) / 2 pairs, the last of an odd D holding one column.
  const int64_t row_pairs = out.p == x.p ? R / 2 : (D + 1) / 2;
  const int64_t pairs = B * T * H * row_pairs;
  if (pairs <= 0) return;
  dispatch_uniform(transpose ? "rope_backward" : "rope_forward", {out.t, x.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    rope_kernel<V><<<blocks_for(pairs, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(x), cos, sin, T, H, D, R, row_pairs, pairs, transpose ? -1.0f : 1.0f);
    FSDP_CHECK_LAUNCH();
  });
}

void swiglu_forward(Out out, In gate, In up, int64_t n, cudaStream_t s) {
  glu_forward("swiglu_forward", out, gate, up, n, SwigluOp{}, s);
}

void swiglu_backward(Out dgate, Out dup, In dout, In gate, In up, int64_t n, cudaStream_t s) {
  glu_backward("swiglu_backward", dgate, dup, dout, gate, up, n, SwigluOp{}, s);
}

void clamped_swiglu_forward(Out out, In gate_up, int64_t n, float alpha, float limit,
                            cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform("clamped_swiglu_forward", {out.t, gate_up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    clamped_swiglu_fwd_kernel<V><<<blocks_for(n, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(gate_up), n, alpha, limit);
    FSDP_CHECK_LAUNCH();
  });
}

void clamped_swiglu_backward(Out dgate_up, In dout, In gate_up, int64_t n, float alpha,
                             float limit, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform("clamped_swiglu_backward", {dgate_up.t, dout.t, gate_up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    clamped_swiglu_bwd_kernel<V><<<blocks_for(n, kThreads), kThreads, 0, s>>>(
        wr<V>(dgate_up), rd<V>(dout), rd<V>(gate_up), n, alpha, limit);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
