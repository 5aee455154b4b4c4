// src/cuda/kernels_optim.cu: AdamW and SGD updates over fp32 flat shards, one launch per
// shard with its weight-decay ranges (see kernels.hpp). The per-element operations are the
// CPU backend's own functions (fsdp/backend/optimizer_math.hpp, explicit FMAs: bit for bit
// the same); the step-dependent scalars are computed on the host, as there. Grid-stride
// loops, float4 accesses when every pointer is 16-byte aligned. An optional bf16 / fp16 copy
// of the updated param is written in the same pass (from_f: the rounding of cast), and an
// optional device scalar multiplies each gradient element as it is read (g * 1 is exact).
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

constexpr int kThreads = 256;

// The element updates are fsdp/backend/optimizer_math.hpp's, shared with the CPU backend.
struct AdamW {
  AdamWCoefficients c;
  // p, m, v updated in place from g; decayed: whether the weight decay applies to p.
  __device__ __forceinline__ void operator()(float& p, float g, float& m, float& v,
                                             bool decayed) const {
    adamw_element(p, g, m, v, decayed ? c.decay : 1.0f, c);
  }
};

struct Sgd {
  float lr, momentum, weight_decay;
  bool first, use_buf;
  __device__ __forceinline__ void operator()(float& p, float g, float& buf, float&,
                                             bool decayed) const {
    sgd_element(p, g, buf, lr, momentum, decayed ? weight_decay : 0.0f, first, use_buf);
  }
};

// Whether element i takes weight decay: the last range starting at or before i contains it.
__device__ __forceinline__ bool decayed(const DecayRanges& r, int64_t i) {
  if (r.count < 0) return true;
  int lo = 0, hi = r.count;  // ranges [0, lo) begin <= i; [hi, count) begin > i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (r.begin[mid] <= i) lo = mid + 1; else hi = mid;
  }
  return lo > 0 && i < r.end[lo - 1];
}

// op(p[i], g[i], s1[i], s2[i], decayed(i)) for i < n; s1 / s2 may be null when op does not
// use them (then they are not dereferenced: `has1` / `has2`). `ranges` is a __grid_constant__
// parameter: read in place from the constant bank, not copied to each thread's local memory.
// C: the copy's element type (__nv_bfloat16 or __half; void: no copy), copy[i] = p[i] updated.
// gs: null or the device fp32 [1] the gradient is multiplied by.
template <class C>
__device__ __forceinline__ void store_copy(C* copy, int64_t i, float p) {
  if constexpr (!std::is_void_v<C>) copy[i] = from_f<C>(p);
}

template <class Op, class C>
__global__ void __launch_bounds__(kThreads)
    update_kernel(float* p, const float* g, float* s1, float* s2, int64_t n, bool vec, bool has1,
                  bool has2, Op op, const __grid_constant__ DecayRanges ranges, C* copy,
                  const float* gs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const float s = gs == nullptr ? 1.0f : *gs;
  int64_t done = 0;
  float z1 = 0.0f, z2 = 0.0f;
  if (vec) {
    const int64_t quads = n / 4;
    for (int64_t q = first; q < quads; q += stride) {
      float4 pv = reinterpret_cast<float4*>(p)[q];
      const float4 gv = reinterpret_cast<const float4*>(g)[q];
      float4 av = has1 ? reinterpret_cast<float4*>(s1)[q] : make_float4(0, 0, 0, 0);
      float4 bv = has2 ? reinterpret_cast<float4*>(s2)[q] : make_float4(0, 0, 0, 0);
      const int64_t i = 4 * q;
      op(pv.x, gv.x * s, av.x, bv.x, decayed(ranges, i));
      op(pv.y, gv.y * s, av.y, bv.y, decayed(ranges, i + 1));
      op(pv.z, gv.z * s, av.z, bv.z, decayed(ranges, i + 2));
      op(pv.w, gv.w * s, av.w, bv.w, decayed(ranges, i + 3));
      reinterpret_cast<float4*>(p)[q] = pv;
      if (has1) reinterpret_cast<float4*>(s1)[q] = av;
      if (has2) reinterpret_cast<float4*>(s2)[q] = bv;
      store_copy(copy, i, pv.x);
      store_copy(copy, i + 1, pv.y);
      store_copy(copy, i + 2, pv.z);
      store_copy(copy, i + 3, pv.w);
    }
    done = quads * 4;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    float& a = has1 ? s1[i] : z1;
    float& b = has2 ? s2[i] : z2;
    op(p[i], g[i] * s, a, b, decayed(ranges, i));
    store_copy(copy, i, p[i]);
  }
}

// update_kernel with the copy's element type chosen from copy.t (none when copy.p is null).
template <class Op>
void launch_update(float* p, const float* g, float* s1, float* s2, int64_t n, bool vec,
                   bool has1, bool has2, const Op& op, const DecayRanges& ranges, Out copy,
                   const float* gs, cudaStream_t s) {
  const int blocks = blocks_for(vec ? (n + 3) / 4 : n, kThreads);
  if (copy.p == nullptr) {
    update_kernel<Op, void><<<blocks, kThreads, 0, s>>>(p, g, s1, s2, n, vec, has1, has2, op,
                                                        ranges, nullptr, gs);
  } else if (copy.t == ST::bf16) {
    update_kernel<Op, __nv_bfloat16><<<blocks, kThreads, 0, s>>>(
        p, g, s1, s2, n, vec, has1, has2, op, ranges, static_cast<__nv_bfloat16*>(copy.p), gs);
  } else if (copy.t == ST::f16) {
    update_kernel<Op, __half><<<blocks, kThreads, 0, s>>>(p, g, s1, s2, n, vec, has1, has2, op,
                                                          ranges, static_cast<__half*>(copy.p),
                                                          gs);
  } else {
    throw Error(std::string("cuda backend: optimizer update: compute_copy is ") +
                st_name(copy.t) + " (expected bf16 or fp16)");
  }
  FSDP_CHECK_LAUNCH();
}

}  // namespace

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWCoefficients& a, const DecayRanges& decay, Out copy,
                  const float* grad_scale, cudaStream_t s) {
  if (n <= 0) return;
  const bool vec =
      aligned16(param) && aligned16(grad) && aligned16(exp_avg) && aligned16(exp_avg_sq);
  launch_update(param, grad, exp_avg, exp_avg_sq, n, vec, true, true, AdamW{a}, decay, copy,
                grad_scale, s);
}

void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, const DecayRanges& decay, bool first_step,
                Out copy, const float* grad_scale, cudaStream_t s) {
  if (n <= 0) return;
  // torch keeps no buffer without momentum: momentum_buf is then not touched (may be null).
  const bool use_buf = momentum != 0.0f;
  const bool vec = aligned16(param) && aligned16(grad) && (!use_buf || aligned16(momentum_buf));
  launch_update(param, grad, use_buf ? momentum_buf : nullptr, nullptr, n, vec, use_buf, false,
                Sgd{lr, momentum, weight_decay, first_step, use_buf}, decay, copy, grad_scale, s);
}

}  // namespace fsdp::cuda::kernels
