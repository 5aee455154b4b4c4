// src/cuda/kernels_flash.cuh: what the FlashAttention-2 translation units share:
//  - kernels_flash.cu: the entry points of kernels.hpp (flash_forward, flash_backward), which
//    check the problem, choose a path and run backward's D_i pass;
//  - kernels_flash_mma.cu: the tensor-core path (mma.sync.m16n8k16), for 16-bit storage,
//    head dim 64 or 128 and 16-byte-aligned rows (mma_fits);
//  - kernels_flash_simt.cu: the SIMT path (fp32 math, any storage type, head dim, alignment).
// Here: the problem as the kernels see it (Dev), the masking and score rules every kernel of
// both paths applies (so the two agree to rounding), the launch helpers, and the two paths'
// launchers.
//
// Masking: key j is invisible to query i when j >= Tk, i >= Tq, key_mask[b, j] == 0, or
// causal and j > i, or j <= i - window (a sliding window, window > 0), or j < doc_start[b, i]
// (document masking); its score is -inf and its probability exactly 0 (the kernels still
// visit the key tiles left of a window: they cost time, not correctness). With doc_start
// (rows nondecreasing, so a query tile's first row has its smallest start) forward and dQ
// start at the key tile holding the query tile's first start (doc_begin), and dK/dV stop at
// the first query tile whose first start lies past the key tile's last key; the per-element
// mask covers the tiles they still visit. The kernels are instantiated with and without a
// document mask (kDoc), so that without one their code is what it was before it. A row with
// no visible key gets out 0 and lse +inf (flash-attention's softmax.h), so exp(s - lse) = 0
// in backward.
// Grouped-query attention: query head h reads the keys and values of head h / group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "kernels_common.cuh"

namespace fsdp::cuda::kernels::flash {

// The problem as the kernels see it (a FlashProblem without its storage type, which the
// kernels have as their template argument).
struct Dev {
  int64_t B, Tq, Tk, H, D;
  int64_t ldq, ldk, ldv, ldo;
  float scale;
  bool causal;
  const float* bias;        // [H, Tq+Tk-1] by relative position j - i + Tq - 1, or null
  const int32_t* key_mask;  // [B,Tk] or null
  int64_t group;            // query heads per key/value head: head h reads k, v of h / group
  int64_t window;           // > 0: key j also masked for query i when j <= i - window
  float softcap;            // > 0: scores soft-capped (score, score_dcap)
  const int32_t* doc_start;  // [B,Tq] or null: key j also masked for query i when j < start
};

inline Dev to_dev(const FlashProblem& p) {
  return {p.B,   p.Tq,    p.Tk,     p.H,    p.D,        p.ldq,   p.ldk,    p.ldv,
          p.ldo, p.scale, p.causal, p.bias, p.key_mask, p.group, p.window, p.softcap,
          p.doc_start};
}

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// kDoc (here and below): p.doc_start is not null. The kernels have it as a template argument,
// so that without a document mask its tests compile away (the code of a kernel without one).
template <bool kDoc>
__device__ __forceinline__ bool visible(const Dev& p, int64_t b, int64_t i, int64_t j) {
  return i < p.Tq && j < p.Tk && !(p.causal && j > i) && !(p.window > 0 && j <= i - p.window) &&
         !(p.key_mask && p.key_mask[b * p.Tk + j] == 0) &&
         !(kDoc && j < p.doc_start[b * p.Tq + i]);
}
// With document masking (kDoc), the first key a query tile starting at row i0 (< Tq) may see:
// its first row's start (the tile's smallest: rows are nondecreasing). The kernels call it as
// `kDoc ? doc_begin(...) : 0`, a constant without a mask.
__device__ __forceinline__ int64_t doc_begin(const Dev& p, int64_t b, int64_t i0) {
  return p.doc_start[b * p.Tq + i0];
}
// The score of a visible (i, j) from the raw dot product q_i . k_j.
// The bias is stored by relative position (kernels.hpp, relative_positions): a row of
// Tq + Tk - 1 floats per head, small enough to stay in L1 across a tile.
// With a soft-cap: softcap * tanh(dot * scale / softcap) + bias.
__device__ __forceinline__ float score(const Dev& p, int64_t h, int64_t i, int64_t j, float dot) {
  float x = dot * p.scale;
  if (p.softcap > 0.0f) x = p.softcap * tanhf(x * (1.0f / p.softcap));  // as the CPU's
  return x + (p.bias ? p.bias[h * (p.Tq + p.Tk - 1) + (j - i + p.Tq - 1)] : 0.0f);
}
// The derivative of the soft-cap at `dot` (1 - tanh^2; 1 without a cap): backward's dS factor
// for dQ and dK (the bias gradient, when there is one, is dS itself).
__device__ __forceinline__ float score_dcap(const Dev& p, float dot) {
  if (p.softcap <= 0.0f) return 1.0f;
  const float th = tanhf(dot * p.scale * (1.0f / p.softcap));
  return 1.0f - th * th;
}
// Keys [0, end) that queries [i0, i0 + rows) may see.
__device__ __forceinline__ int64_t key_end(const Dev& p, int64_t i0, int64_t rows) {
  return p.causal ? imin(p.Tk, i0 + rows) : p.Tk;
}

// ---------------------------------------------------------------------------------------
// launch helpers

// Sets the dynamic shared memory of `kernel` to `bytes` (opting in above 48 KiB); throws
// when the device allows less.
template <class K>
void set_smem(K kernel, std::size_t bytes, const char* what) {
  if (bytes <= 48 * 1024) return;
  int device = 0, max_smem = 0;
  FSDP_CHECK_CUDA(cudaGetDevice(&device));
  FSDP_CHECK_CUDA(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (bytes > static_cast<std::size_t>(max_smem)) {
    throw Error(std::string("cuda backend: ") + what + ": the head dim needs " +
                std::to_string(bytes) + " bytes of shared memory per block (the device allows " +
                std::to_string(max_smem) + ")");
  }
  FSDP_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(bytes)));
}

inline unsigned grid_for(int64_t blocks, const char* what) {
  if (blocks > 0x7fffffff) {
    throw Error(std::string("cuda backend: ") + what + ": " + std::to_string(blocks) +
                " blocks exceed the launch grid");
  }
  return static_cast<unsigned>(blocks);
}

// ---------------------------------------------------------------------------------------
// The bias gradient's partial rows. With dbias the dQ kernels' block (batch chunk c, head h,
// query tile) also sums its dS by relative position into a partial row of its own: the
// diagonal d of its [rows x key tile] dS tile (d = col - row + rows - 1, rows ascending) adds
// into partial[j0 + d] for the tile starting at key j0, key tiles ascending, separated by
// barriers; so entry lo of the row holds relative position o = lo + Tq - i0 - rows for the
// block's first query i0. The block zeroes its row first. flash_backward then adds the rows
// into dbias, c and tile ascending (dbias_reduce in kernels_flash.cu). Every sum has one
// writer and an order fixed by the shapes: deterministic, no atomics.
struct DbiasPartials {
  int64_t chunks;  // batch chunks: block c covers batch rows [c*B/chunks ...) (mma: B, simt: 1)
  int64_t nqt;     // query tiles
  int64_t rows;    // queries per tile
  int64_t stride;  // floats per partial row (key tiles x key tile width + rows)
  int64_t floats(int64_t H) const { return chunks * H * nqt * stride; }
};

// ---------------------------------------------------------------------------------------
// the two paths. Each launcher writes what flash_forward / flash_backward (kernels.hpp)
// document, for a problem the entry point has checked (B, H > 0; group >= 1 divides H).
// Backward's di is D_i = rowsum(dO * O) [B,H,Tq], computed by the entry point.

// kernels_flash_mma.cu: whether the tensor-core kernels take this problem: 16-bit storage,
// head dim 64 or 128, and every row of `arrays` (and every stride) 16-byte aligned.
bool mma_fits(const FlashProblem& p, std::initializer_list<const void*> arrays);
// The partial rows each path's dQ kernel writes when dbias is wanted (see DbiasPartials).
DbiasPartials mma_dbias_partials(const FlashProblem& p);
DbiasPartials simt_dbias_partials(const FlashProblem& p);
void mma_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                 float* lse, cudaStream_t s);
// partials: mma_dbias_partials(p).floats(p.H) floats when dbias is not null (else unused);
// they are written, dbias is left to the caller.
void mma_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                  const void* dout, const float* lse, const float* di, void* dq, void* dk,
                  void* dv, float* dbias, float* partials, cudaStream_t s);

// kernels_flash_simt.cu: any problem of fp32, bf16 or fp16 storage.
void simt_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                  float* lse, cudaStream_t s);
void simt_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                   const void* dout, const float* lse, const float* di, void* dq, void* dk,
                   void* dv, float* dbias, float* partials, cudaStream_t s);

}  // namespace fsdp::cuda::kernels::flash
