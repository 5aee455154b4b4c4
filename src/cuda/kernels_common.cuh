// src/cuda/kernels_common.cuh: device-side helpers shared by the kernels_*.cu files:
// fp32 <-> storage conversions, typed and run-time-typed accessors, 16-byte packs,
// deterministic warp/block reductions, and the host-side dispatch from ST to a template
// argument.
//
// Storage types: float, __nv_bfloat16, __half, and `Dyn` (a marker: the type is read at run
// time from the argument, for calls that mix storage types). Kernels are templates on one
// storage type T; the launcher instantiates T = float / bf16 / fp16 when every float
// argument has that type, and T = Dyn otherwise (see dispatch_uniform).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "fsdp/core/error.hpp"
#include "fsdp/cuda/check.hpp"
#include "kernels.hpp"

namespace fsdp::cuda::kernels {

constexpr unsigned kFullMask = 0xffffffffu;
// Grid-stride kernels launch at most this many blocks (enough to fill an H100 many times).
constexpr int64_t kMaxBlocks = 8192;

// Enqueue check after every launch.
#define FSDP_CHECK_LAUNCH() FSDP_CHECK_CUDA(cudaGetLastError())

inline int blocks_for(int64_t work, int64_t per_block) {
  int64_t b = (work + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > kMaxBlocks) b = kMaxBlocks;
  return static_cast<int>(b);
}


// Rows per block of a deterministic two-pass reduction over rows (column sums, LayerNorm's
// gamma/beta gradients): ceil(R / max_blocks), at least min_rows, rounded up to a multiple of
// `multiple`. Depends on the shapes only, so the partial sums, and the result, do too.
inline int64_t fixed_rows_per_block(int64_t R, int64_t max_blocks, int64_t min_rows,
                                    int64_t multiple = 1) {
  int64_t rpb = (R + max_blocks - 1) / max_blocks;
  if (rpb < min_rows) rpb = min_rows;
  return (rpb + multiple - 1) / multiple * multiple;
}
// Blocks of fixed_rows_per_block rows covering R rows (0 for R = 0).
inline int64_t row_blocks(int64_t R, int64_t rpb) { return R > 0 ? (R + rpb - 1) / rpb : 0; }

// ---------------------------------------------------------------------------------------
// conversions

struct Dyn {};  // run-time storage type

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half_rn(v);
}

// Loads element i of a run-time-typed array as fp32 / stores fp32 rounded to nearest even.
__device__ __forceinline__ float dyn_load(const void* p, ST t, int64_t i) {
  switch (t) {
    case ST::bf16:
      return to_f(static_cast<const __nv_bfloat16*>(p)[i]);
    case ST::f16:
      return to_f(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void dyn_store(void* p, ST t, int64_t i, float v) {
  switch (t) {
    case ST::bf16:
      static_cast<__nv_bfloat16*>(p)[i] = from_f<__nv_bfloat16>(v);
      break;
    case ST::f16:
      static_cast<__half*>(p)[i] = from_f<__half>(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

// ---------------------------------------------------------------------------------------
// accessors: Rd<T>[i] loads element i as fp32; Wr<T>.get(i) / .set(i, v) read and store.

template <class T>
struct Rd {
  const T* p;
  __device__ __forceinline__ float operator[](int64_t i) const { return to_f(p[i]); }
};
template <>
struct Rd<Dyn> {
  const void* p;
  ST t;
  __device__ __forceinline__ float operator[](int64_t i) const { return dyn_load(p, t, i); }
};
template <class T>
struct Wr {
  T* p;
  __device__ __forceinline__ float get(int64_t i) const { return to_f(p[i]); }
  __device__ __forceinline__ void set(int64_t i, float v) const { p[i] = from_f<T>(v); }
};
template <>
struct Wr<Dyn> {
  void* p;
  ST t;
  __device__ __forceinline__ float get(int64_t i) const { return dyn_load(p, t, i); }
  __device__ __forceinline__ void set(int64_t i, float v) const { dyn_store(p, t, i, v); }
};

// Host: the accessor of an argument for instantiation T (T = Dyn keeps the run-time type).
template <class T>
inline Rd<T> rd(In a) {
  return {static_cast<const T*>(a.p)};
}
template <>
inline Rd<Dyn> rd<Dyn>(In a) {
  return {a.p, a.t};
}
template <class T>
inline Wr<T> wr(Out a) {
  return {static_cast<T*>(a.p)};
}
template <>
inline Wr<Dyn> wr<Dyn>(Out a) {
  return {a.p, a.t};
}

// ---------------------------------------------------------------------------------------
// 16-byte packs: 8 elements of T loaded / stored with 16-byte vector accesses (1, 2 or 4 of
// them). The pointer must be 16-byte aligned.

template <class T>
struct alignas(16) Pack8 {
  T v[8];
};
template <class T>
__device__ __forceinline__ Pack8<T> load8(const T* p) {
  Pack8<T> r;
  const int4* src = reinterpret_cast<const int4*>(p);
  int4* dst = reinterpret_cast<int4*>(&r);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Pack8<T>) / 16); ++k) dst[k] = src[k];
  return r;
}
template <class T>
__device__ __forceinline__ void store8(T* p, const Pack8<T>& r) {
  int4* dst = reinterpret_cast<int4*>(p);
  const int4* src = reinterpret_cast<const int4*>(&r);
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Pack8<T>) / 16); ++k) dst[k] = src[k];
}

// ---------------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2 "gelu_new"), as the CPU backend computes it.

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3) (one exp,
// no cancellation).
__device__ __forceinline__ float gelu(float x) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  return x / (1.0f + expf(-2.0f * u));
}
// dout * d/dx [x s] = dout (s + x 2 s (1 - s) du/dx), s = sigmoid(2u), du/dx = c (1 + 3 a x^2).
__device__ __forceinline__ float gelu_grad(float x, float dout) {
  const float u = kGeluC * (x + kGeluA * x * x * x);
  const float s = 1.0f / (1.0f + expf(-2.0f * u));
  const float du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return dout * (s + 2.0f * x * s * (1.0f - s) * du);
}

// ---------------------------------------------------------------------------------------
// reductions: fixed shuffle / tree order, so results are deterministic.

template <class V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block, returned to every thread. Every thread of the block must call it
// (blockDim.x a multiple of 32, at most 1024).
template <class V>
__device__ V block_sum(V v) {
  __shared__ V sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // sh may still be read by a previous call
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : V(0);
    v = warp_sum(v);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}
__device__ inline float block_max(float v) {
  __shared__ float sh[32];
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

// ---------------------------------------------------------------------------------------
// host dispatch

template <class T>
struct Tag {
  using type = T;
};

[[noreturn]] inline void bad_type(const char* what, ST t) {
  throw Error(std::string("cuda backend: ") + what + ": storage type " + st_name(t) +
              " not supported here (expected fp32, bf16 or fp16)");
}

// f(Tag<float | __nv_bfloat16 | __half>) for a float storage type.
template <class F>
void dispatch_float(const char* what, ST t, F&& f) {
  switch (t) {
    case ST::f32:
      f(Tag<float>{});
      return;
    case ST::bf16:
      f(Tag<__nv_bfloat16>{});
      return;
    case ST::f16:
      f(Tag<__half>{});
      return;
    default:
      bad_type(what, t);
  }
}

// f(Tag<T>) with T the common storage type of `types`, or Tag<Dyn> if they differ.
template <class F>
void dispatch_uniform(const char* what, std::initializer_list<ST> types, F&& f) {
  const ST first = *types.begin();
  bool same = true;
  for (ST t : types) {
    if (t == ST::f64) bad_type(what, t);
    same = same && t == first;
  }
  if (same) {
    dispatch_float(what, first, f);
  } else {
    f(Tag<Dyn>{});
  }
}

// ---------------------------------------------------------------------------------------
// gated linear units (SwiGLU, GeGLU; kernels_llama.cu, kernels_elementwise.cu)

// v rounded to the storage type (T, or t at run time for Dyn), as a store then a load would.
template <class T>
__device__ __forceinline__ float round_as(float v, ST t) {
  if constexpr (std::is_same_v<T, Dyn>) {
    switch (t) {
      case ST::bf16:
        return to_f(from_f<__nv_bfloat16>(v));
      case ST::f16:
        return to_f(from_f<__half>(v));
      default:
        return v;
    }
  } else {
    return to_f(from_f<T>(v));
  }
}

// out[i] = op.fwd<T>(gate[i], up[i]); dgate[i], dup[i] = op.bwd<T>(gate[i], up[i], dout[i]).
// Grid-stride over n elements, 8 per 16-byte pack when `vec` (T a storage type, not Dyn).
// Every thread reads all the inputs of an element before it writes its outputs, which is what
// makes the aliasing of kernels.hpp safe (out = gate or up; dgate = gate or dout).
constexpr int kGluThreads = 256;

template <class T, class Op>
__global__ void __launch_bounds__(kGluThreads)
    glu_fwd_kernel(Wr<T> out, Rd<T> gate, Rd<T> up, int64_t n, bool vec, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (!std::is_same_v<T, Dyn>) {
    if (vec) {
      const int64_t packs = n / 8;
      for (int64_t v = first; v < packs; v += stride) {
        const Pack8<T> pg = load8(gate.p + 8 * v), pu = load8(up.p + 8 * v);
        Pack8<T> po;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          po.v[k] = from_f<T>(op.template fwd<T>(to_f(pg.v[k]), to_f(pu.v[k])));
        }
        store8(out.p + 8 * v, po);
      }
      done = packs * 8;
    }
  }
  for (int64_t i = done + first; i < n; i += stride) out.set(i, op.template fwd<T>(gate[i], up[i]));
}

template <class T, class Op>
__global__ void __launch_bounds__(kGluThreads)
    glu_bwd_kernel(Wr<T> dgate, Wr<T> dup, Rd<T> dout, Rd<T> gate, Rd<T> up, int64_t n, bool vec,
                   Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (!std::is_same_v<T, Dyn>) {
    if (vec) {
      const int64_t packs = n / 8;
      for (int64_t v = first; v < packs; v += stride) {
        const Pack8<T> pd = load8(dout.p + 8 * v), pg = load8(gate.p + 8 * v),
                       pu = load8(up.p + 8 * v);
        Pack8<T> og, ou;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          float dg, du;
          op.template bwd<T>(to_f(pg.v[k]), to_f(pu.v[k]), to_f(pd.v[k]), dg, du);
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
    op.template bwd<T>(gate[i], up[i], dout[i], dg, du);
    dgate.set(i, dg);
    dup.set(i, du);
  }
}

// Host: the two launches, T = the common storage type of the arguments (Dyn if mixed).
template <class Op>
void glu_forward(const char* what, Out out, In gate, In up, int64_t n, Op op, cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform(what, {out.t, gate.t, up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = aligned16(out.p) && aligned16(gate.p) && aligned16(up.p);
    glu_fwd_kernel<V><<<blocks_for(vec ? (n + 7) / 8 : n, kGluThreads), kGluThreads, 0, s>>>(
        wr<V>(out), rd<V>(gate), rd<V>(up), n, vec, op);
    FSDP_CHECK_LAUNCH();
  });
}

template <class Op>
void glu_backward(const char* what, Out dgate, Out dup, In dout, In gate, In up, int64_t n, Op op,
                  cudaStream_t s) {
  if (n <= 0) return;
  dispatch_uniform(what, {dgate.t, dup.t, dout.t, gate.t, up.t}, [&](auto tag) {
    using V = typename decltype(tag)::type;
    const bool vec = aligned16(dgate.p) && aligned16(dup.p) && aligned16(dout.p) &&
                     aligned16(gate.p) && aligned16(up.p);
    glu_bwd_kernel<V><<<blocks_for(vec ? (n + 7) / 8 : n, kGluThreads), kGluThreads, 0, s>>>(
        wr<V>(dgate), wr<V>(dup), rd<V>(dout), rd<V>(gate), rd<V>(up), n, vec, op);
    FSDP_CHECK_LAUNCH();
  });
}

}  // namespace fsdp::cuda::kernels
