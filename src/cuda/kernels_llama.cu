// src/cuda/kernels_llama.cu: Llama's elementwise pieces (kernels.hpp "Llama pieces"): the
// rotary position embedding in Hugging Face's rotate-half layout and SwiGLU, forward and
// backward. fp32 math on loaded values, results rounded once to the storage type, as the CPU
// backend computes them (exp differs by an ulp or two: expf here, a Cephes polynomial there).
//
// Every thread reads all the inputs of the elements it owns before it writes them, which is
// what makes the documented aliasing safe (rope: out = x; SwiGLU: out = gate or up, dgate =
// gate or dout, dup = up): no element is read by one thread and written by another.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;

template <class T>
constexpr bool kDyn = std::is_same_v<T, Dyn>;

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
// One thread per rotated pair (row r = (b*T + t)*H + h, i < D/2): reads x[i], x[i + D/2] of
// the row, writes out[i], out[i + D/2]. sign = -1 for the transpose (backward).
template <class T>
__global__ void __launch_bounds__(kThreads)
    rope_kernel(Wr<T> out, Rd<T> x, const float* cos, const float* sin, int64_t T_, int64_t H,
                int64_t D, int64_t pairs, float sign) {
  const int64_t half = D / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    const int64_t i = p % half, r = p / half, t = (r / H) % T_;
    const float c = cos[t * half + i], sn = sign * sin[t * half + i];
    const int64_t lo = r * D + i, hi = lo + half;
    const float a = x[lo], b = x[hi];
    out.set(lo, a * c - b * sn);
    out.set(hi, b * c + a * sn);
  }
}

// ---- SwiGLU ----
// out[i] = silu(gate[i]) up[i]; 8 elements per 16-byte pack when `vec`.
template <class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_fwd_kernel(Wr<T> out, Rd<T> gate, Rd<T> up, int64_t n, bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (!kDyn<T>) {
    if (vec) {
      const int64_t packs = n / 8;
      for (int64_t v = first; v < packs; v += stride) {
        const Pack8<T> pg = load8(gate.p + 8 * v), pu = load8(up.p + 8 * v);
        Pack8<T> po;
#pragma unroll
        for (int k = 0; k < 8; ++k) po.v[k] = from_f<T>(swiglu(to_f(pg.v[k]), to_f(pu.v[k])));
        store8(out.p + 8 * v, po);
      }
      done = packs * 8;
    }
  }
  for (int64_t i = done + first; i < n; i += stride) out.set(i, swiglu(gate[i], up[i]));
}

// dgate[i] = dout up silu'(gate), dup[i] = dout silu(gate); packs of 8 when `vec`.
template <class T>
__global__ void __launch_bounds__(kThreads)
    swiglu_bwd_kernel(Wr<T> dgate, Wr<T> dup, Rd<T> dout, Rd<T> gate, Rd<T> up, int64_t n,
                      bool vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (!kDyn<T>) {
    if (vec) {
      const int64_t packs = n / 8;
      for (int64_t v = first; v < packs; v += stride) {
        const Pack8<T> pd = load8(dout.p + 8 * v), pg = load8(gate.p + 8 * v),
                       pu = load8(up.p + 8 * v);
        Pack8<T> og, ou;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float dg, du;
          swiglu_grad(to_f(pg.v[k]), to_f(pu.v[k]), to_f(pd.v[k]), dg, du);
          og.v[k] = from_f<T>(dg);
          ou.v[k] = from_f<T>(du);
        }
        store8(dgate.p + 8 * v, og);
        store8(dup.p + 8 * v, ou);
      }
      done = packs * 8;
    }
  }
  for (int64_t i = done + first; i < n; i += stride) {
    float dg, du;
    swiglu_grad(gate[i], up[i], dout[i], dg, du);
    dgate.set(i, dg);
    dup.set(i, du);
  }
}

}  // namespace

void rope(Out out, In x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
          int64_t D, bool transpose, cudaStream_t s) {
  const int64_t pairs = B * T * H * (D / 2);
  if (pairs <= 0) return;
  dispatch_uniform(transpose ? "rope_backward" : "rope_forward", {out.t, x.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    rope_kernel<V><<<blocks_for(pairs, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(x), cos, sin, T, H, D, pairs, transpose ? -1.0f : 1.0f);
    FSDP_CHECK_LAUNCH();
  });
}

void swiglu_forward(Out out, In gate, In up, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform("swiglu_forward", {out.t, gate.t, up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = aligned16(out.p) && aligned16(gate.p) && aligned16(up.p);
    swiglu_fwd_kernel<V><<<blocks_for(vec ? (n + 7) / 8 : n, kThreads), kThreads, 0, s>>>(
        wr<V>(out), rd<V>(gate), rd<V>(up), n, vec);
    FSDP_CHECK_LAUNCH();
  });
}

void swiglu_backward(Out dgate, Out dup, In dout, In gate, In up, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform("swiglu_backward", {dgate.t, dup.t, dout.t, gate.t, up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = aligned16(dgate.p) && aligned16(dup.p) && aligned16(dout.p) &&
                     aligned16(gate.p) && aligned16(up.p);
    swiglu_bwd_kernel<V><<<blocks_for(vec ? (n + 7) / 8 : n, kThreads), kThreads, 0, s>>>(
        wr<V>(dgate), wr<V>(dup), rd<V>(dout), rd<V>(gate), rd<V>(up), n, vec);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
