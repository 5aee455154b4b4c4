// src/cuda/kernels_flash.cu: fused attention, FlashAttention-2 (Dao 2023, "FlashAttention-2:
// Faster Attention with Better Parallelism and Work Partitioning", Algorithms 1 and 2), for
// GPT-2's causal attention, T5's biased, masked attention and Llama's grouped-query attention
// alike (see kernels.hpp): the entry points, which check the problem and choose the kernels,
// and backward's D_i pass. The kernels are translation units of their own, sharing
// kernels_flash.cuh (the problem as the kernels see it, the masking rules, launch helpers):
//  - kernels_flash_mma.cu: tensor cores through mma.sync.m16n8k16 (bf16/fp16 in, fp32
//    accumulate; sm80+), S, P, O, dQ, dK, dV in registers, cp.async double buffering: for
//    16-bit storage, head dim 64 or 128 and 16-byte-aligned rows (mma_fits);
//  - kernels_flash_simt.cu: a plain tiled SIMT path (fp32 math on CUDA cores) for everything
//    else: fp32 storage, other head dims, rows that are not 16-byte aligned.
// (A first tensor-core path on nvcuda::wmma, S/P/O staged in shared memory, was superseded by
// the mma kernels, 1.48x the GPT-2 124M training throughput on an H100, and removed.)
//
// No T x T matrix exists: forward keeps the output and the row logsumexp, backward recomputes
// the probabilities tile by tile. Kernels and launches per call (each a single launch,
// whatever B and H are):
//  - forward: 1 (flash_fwd / flash_fwd_simt).
//  - backward: 3: D_i = rowsum(dO * O) (flash_bwd_dot, here), dK and dV per key tile looping
//    over the group's query heads and their query tiles (flash_bwd_dkdv, accumulators in
//    registers / shared memory), and dQ per query tile looping over key tiles (flash_bwd_dq,
//    a separate pass that recomputes P and dS: no atomics, deterministic). With a bias
//    gradient each dQ block also sums its dS tile by relative position into a partial row
//    of its own (kernels_flash.cuh, DbiasPartials), and a fourth launch (dbias_reduce) adds
//    the rows into dbias [H, Tq+Tk-1]: every sum has one writer and a fixed order. Before,
//    dbias was [H,Tq,Tk] and the dQ kernel's block owned (head, query tile) and looped over
//    the batch to keep one writer per element: at T5's shapes 64 blocks (encoder) and 16
//    (decoder) on a 132-SM GPU, each adding dS element by element into global memory.
#include <string>

#include "kernels_flash.cuh"

namespace fsdp::cuda::kernels {
namespace {

using flash::Dev;

// di[(b*H + h)*Tq + i] = sum_e dout * out over head h's D columns of row (b, i); a warp a row.
template <class T>
__global__ void __launch_bounds__(256)
    flash_bwd_dot(Dev p, const T* dout, const T* out, float* di) {
  const int64_t rows = p.B * p.H * p.Tq;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps) {
    const int64_t i = r % p.Tq, bh = r / p.Tq, b = bh / p.H, h = bh % p.H;
    const T* d = dout + (b * p.Tq + i) * p.ldo + h * p.D;
    const T* o = out + (b * p.Tq + i) * p.ldo + h * p.D;
    float acc = 0.0f;
    for (int64_t e = lane; e < p.D; e += 32) acc += to_f(d[e]) * to_f(o[e]);
    acc = warp_sum(acc);
    if (lane == 0) di[r] = acc;
  }
}

// dbias[h, o] += sum over chunks c, then query tiles, ascending, of the partial rows' entry
// for relative position o (kernels_flash.cuh, DbiasPartials); a thread per (h, o).
__global__ void __launch_bounds__(256)
    dbias_reduce(float* dbias, const float* partials, flash::DbiasPartials L, int64_t H,
                 int64_t Tq, int64_t P) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < H * P;
       e += stride) {
    const int64_t h = e / P, o = e % P;
    float acc = 0.0f;
    for (int64_t c = 0; c < L.chunks; ++c) {
      const float* rows = partials + (c * H + h) * L.nqt * L.stride;
      for (int64_t tile = 0; tile < L.nqt; ++tile) {
        const int64_t lo = o - Tq + tile * L.rows + L.rows;
        if (lo >= 0 && lo < L.stride) acc += rows[tile * L.stride + lo];
      }
    }
    dbias[e] += acc;
  }
}

// group >= 1 dividing H (the backend's argument checks guarantee it; a bad group would read
// outside k, v), and no soft-cap beside a bias (the kernels' dS would be the capped one).
void check_group(const FlashProblem& p, const char* what) {
  if (p.group < 1 || p.H % p.group != 0) {
    throw Error(std::string("cuda backend: ") + what + ": " + std::to_string(p.H) +
                " query heads in groups of " + std::to_string(p.group));
  }
  if (p.softcap > 0.0f && p.bias) {
    throw Error(std::string("cuda backend: ") + what + ": a soft-cap with a bias");
  }
}

}  // namespace

void flash_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                   float* lse, cudaStream_t s) {
  if (p.B <= 0 || p.H <= 0 || p.Tq <= 0) return;
  check_group(p, "attention forward");
  if (flash::mma_fits(p, {q, k, v, out})) {
    flash::mma_forward(p, q, k, v, out, lse, s);
  } else {
    flash::simt_forward(p, q, k, v, out, lse, s);
  }
}

int64_t flash_backward_scratch_floats(const FlashProblem& p, bool dbias) {
  const int64_t di = p.B * p.H * p.Tq;
  if (!dbias || p.B <= 0 || p.H <= 0 || p.Tq <= 0 || p.Tk <= 0) return di;
  const int64_t mma = flash::mma_dbias_partials(p).floats(p.H);
  const int64_t simt = flash::simt_dbias_partials(p).floats(p.H);
  return di + (mma > simt ? mma : simt);
}

void flash_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                    const void* out, const float* lse, const void* dout, void* dq, void* dk,
                    void* dv, float* dbias, float* scratch, cudaStream_t s) {
  if (p.B <= 0 || p.H <= 0 || p.D <= 0) return;  // nothing to write; dS = 0 adds nothing
  check_group(p, "attention backward");
  const Dev d = flash::to_dev(p);
  float* di = scratch;
  float* partials = scratch + p.B * p.H * p.Tq;  // flash_backward_scratch_floats(p, true)
  // With Tq or Tk = 0 there is no relative position: dbias [H, 0] gets nothing.
  if (p.Tq <= 0 || p.Tk <= 0) dbias = nullptr;
  dispatch_float("attention backward", p.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.Tq > 0) {
      flash_bwd_dot<T><<<blocks_for(p.B * p.H * p.Tq, 8), 256, 0, s>>>(
          d, static_cast<const T*>(dout), static_cast<const T*>(out), di);
      FSDP_CHECK_LAUNCH();
    }
  });
  flash::DbiasPartials layout{};
  if (flash::mma_fits(p, {q, k, v, out, dout, dq, dk, dv})) {
    flash::mma_backward(p, q, k, v, dout, lse, di, dq, dk, dv, dbias, partials, s);
    layout = flash::mma_dbias_partials(p);
  } else {
    flash::simt_backward(p, q, k, v, dout, lse, di, dq, dk, dv, dbias, partials, s);
    layout = flash::simt_dbias_partials(p);
  }
  if (dbias) {
    const int64_t P = p.Tq + p.Tk - 1;
    dbias_reduce<<<blocks_for(p.H * P, 256), 256, 0, s>>>(dbias, partials, layout, p.H, p.Tq, P);
    FSDP_CHECK_LAUNCH();
  }
}

}  // namespace fsdp::cuda::kernels
