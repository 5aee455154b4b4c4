// src/cuda/kernels_reduce.cu: reductions with a fixed summation order (see kernels.hpp):
// bias gradients (column sums, optionally fused with the GELU backward), squared norms and
// sums into fp64 device scalars, the clip coefficient, and the finish of every column-sum
// reduction (column_partials_finish, also LayerNorm's and RMSNorm's weight gradients).
//
// Deterministic two-pass scheme, no atomics: pass 1 splits the work into chunks whose
// boundaries depend on the shapes only and writes one partial per chunk (threads sum in a
// fixed stride pattern, then a fixed shuffle/tree order); pass 2 adds the partials in index
// order. Results are therefore bitwise repeatable for given shapes.
//
// Launches per call and bytes moved (s = bytes per element; G <= about 1024 row blocks):
//   bias_backward        2 launches  reads dout (R C s); partials [G, C] fp32 written and
//                                    read once; dbias read and written
//   gelu_bias_backward   2 launches  reads x, dout (2 R C s), writes dx (R C s); partials
//                                    as bias_backward (the unfused gelu_backward +
//                                    bias_backward read dx again: 4 R C s)
//   squared_norm         2 launches  reads x (n s)
//   column_partials_finish 1 launch  reads Q G C floats
// Column sums use 16-byte loads when C % 8 == 0 and the pointers are 16-byte aligned.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

// ---- column sums: [R, C] -> partials [G, C] (fixed row blocks) -> out[C] += sum ----
constexpr int kColThreads = 128;  // threads per block: one 8-column pack (or one column) each
constexpr int kRowUnroll = 4;     // rows loaded before any of them is used
constexpr int64_t kMaxColPartials = 1024;
constexpr int kColTile = 32;     // finish: columns per block (one per lane)
constexpr int kFinishRows = 8;   // finish: partial rows summed in parallel per column

// Rows per block: at least 32, and at most about kMaxColPartials blocks (R only).
int64_t colsum_rows_per_block(int64_t R) { return fixed_rows_per_block(R, kMaxColPartials, 32); }
int64_t colsum_blocks(int64_t R) {
  return row_blocks(R, colsum_rows_per_block(R));
}

// grid (ceil(units / kColThreads), G), units = C / 8 packs (vec) or C columns; block g owns
// rows [g rpb, min(R, (g + 1) rpb)). Thread u owns columns [8u, 8u + 8) (vec) or u and adds
// its rows in order (fp32): partial[g, c] = sum of v[r, c], with v = dout, or with kGelu
// v = dx = dout * gelu'(x) rounded to T and stored (the value summed is the stored one, as
// gelu_backward then bias_backward would). kRowUnroll rows are loaded before any is stored,
// each element by the thread that stores it, so dx may alias dout.
template <class T, bool kGelu>
__global__ void __launch_bounds__(kColThreads)
    colsum_kernel(T* dx, const T* dout, const T* x, int64_t R, int64_t C, int64_t rpb, bool vec,
                  float* partial) {
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rpb, r1 = min(R, r0 + rpb);
  if (u >= (vec ? C / 8 : C)) return;  // no block-level synchronisation in this kernel
  if (vec) {
    const int64_t c0 = 8 * u;
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = 0.0f;
    for (int64_t rb = r0; rb < r1; rb += kRowUnroll) {
      Pack8<T> d[kRowUnroll], xv[kRowUnroll];
#pragma unroll
      for (int i = 0; i < kRowUnroll; ++i) {
        if (rb + i < r1) {
          d[i] = load8(dout + (rb + i) * C + c0);
          if constexpr (kGelu) xv[i] = load8(x + (rb + i) * C + c0);
        }
      }
#pragma unroll
      for (int i = 0; i < kRowUnroll; ++i) {
        if (rb + i < r1) {
          if constexpr (kGelu) {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
              d[i].v[k] = from_f<T>(gelu_grad(to_f(xv[i].v[k]), to_f(d[i].v[k])));
            }
            store8(dx + (rb + i) * C + c0, d[i]);
          }
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[k] += to_f(d[i].v[k]);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) partial[g * C + c0 + k] = acc[k];
  } else {
    const int64_t c = u;
    float acc = 0.0f;
    for (int64_t rb = r0; rb < r1; rb += kRowUnroll) {
      T d[kRowUnroll], xv[kRowUnroll];
#pragma unroll
      for (int i = 0; i < kRowUnroll; ++i) {
        if (rb + i < r1) {
          d[i] = dout[(rb + i) * C + c];
          if constexpr (kGelu) xv[i] = x[(rb + i) * C + c];
        }
      }
#pragma unroll
      for (int i = 0; i < kRowUnroll; ++i) {
        if (rb + i < r1) {
          if constexpr (kGelu) {
            d[i] = from_f<T>(gelu_grad(to_f(xv[i]), to_f(d[i])));
            dx[(rb + i) * C + c] = d[i];
          }
          acc += to_f(d[i]);
        }
      }
    }
    partial[g * C + c] = acc;
  }
}

// block (32, 8), grid (ceil(C / 32), Q): out_q[c] += sum over g of part[q, g, c], q = 0
// into out0, q = 1 into out1. Thread (x, y) sums g = y, y + 8, ... in order (fp64), then
// the 8 sums are added in order; rounded once.
template <class T>
__global__ void __launch_bounds__(kColTile* kFinishRows)
    finish_kernel(Wr<T> out0, Wr<T> out1, const float* part, int64_t G, int64_t C) {
  __shared__ double sh[kFinishRows][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const float* p = part + static_cast<int64_t>(blockIdx.y) * G * C;
  double sum = 0.0;
  if (c < C) {
    for (int64_t g = threadIdx.y; g < G; g += kFinishRows) sum += p[g * C + c];
  }
  sh[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double total = 0.0;
#pragma unroll
    for (int k = 0; k < kFinishRows; ++k) total += sh[k][threadIdx.x];
    const Wr<T>& out = blockIdx.y == 0 ? out0 : out1;
    out.set(c, out.get(c) + static_cast<float>(total));
  }
}

// Column sums of dout (kGelu false) or of dx = dout * gelu'(x) (kGelu), [G, C] partials in
// scratch, then dbias += their sum. T: the storage type of dx, dout and x.
template <bool kGelu>
void colsum(const char* what, Out dx, In dout, In x, Out dbias, int64_t R, int64_t C,
            float* scratch, cudaStream_t s) {
  const int64_t rpb = colsum_rows_per_block(R), G = colsum_blocks(R);
  const bool vec = C % 8 == 0 && aligned16(dout.p) && (!kGelu || (aligned16(dx.p) && aligned16(x.p)));
  dispatch_float(what, dout.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t units = vec ? C / 8 : C;
    const dim3 grid(static_cast<unsigned>((units + kColThreads - 1) / kColThreads),
                    static_cast<unsigned>(G));
    colsum_kernel<T, kGelu><<<grid, kColThreads, 0, s>>>(
        static_cast<T*>(dx.p), static_cast<const T*>(dout.p), static_cast<const T*>(x.p), R, C,
        rpb, vec, scratch);
    FSDP_CHECK_LAUNCH();
  });
  column_partials_finish(what, dbias, dbias, scratch, 1, G, C, s);
}

// ---- squared norm: x[n] -> partials[G] (fixed chunks) -> acc += sum ----
constexpr int kNormThreads = 256;
constexpr int64_t kNormMaxChunks = 1024;
int64_t norm_chunks(int64_t n) {
  int64_t g = (n + 32767) / 32768;
  if (g < 1) g = 1;
  return g > kNormMaxChunks ? kNormMaxChunks : g;
}

template <class T>
__global__ void __launch_bounds__(kNormThreads)
    sqnorm_partials_kernel(Rd<T> x, int64_t n, int64_t chunk, double* partial) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t i1 = min(n, i0 + chunk);
  double acc = 0.0;
  for (int64_t i = i0 + threadIdx.x; i < i1; i += kNormThreads) {
    const double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// *acc += sum of values[0..n): one block; thread t sums t, t + 256, ...; then the block tree.
__global__ void __launch_bounds__(256)
    sum_into_kernel(double* acc, const double* values, int64_t n) {
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += values[i];
  s = block_sum(s);
  if (threadIdx.x == 0) *acc += s;
}

__global__ void clip_coefficient_kernel(double* norm, float* coef, const double* parts, int64_t n,
                                        double max_norm) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += parts[i];
  const double value = sqrt(total);
  *norm = value;
  *coef = (max_norm > 0 && value > max_norm) ? static_cast<float>(max_norm / (value + 1e-6)) : 1.0f;
}

}  // namespace

void column_partials_finish(const char* what, Out out0, Out out1, const float* partial,
                            int Q, int64_t G, int64_t C, cudaStream_t s) {
  if (G <= 0 || C <= 0) return;
  dispatch_uniform(what, {out0.t, out1.t}, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(Q));
    finish_kernel<T>
        <<<grid, dim3(kColTile, kFinishRows), 0, s>>>(wr<T>(out0), wr<T>(out1), partial, G, C);
    FSDP_CHECK_LAUNCH();
  });
}

int64_t bias_backward_scratch_floats(int64_t R, int64_t C) { return colsum_blocks(R) * C; }

void bias_backward(Out dbias, In dout, int64_t R, int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  colsum<false>("bias_backward", Out{nullptr, dout.t}, dout, dout, dbias, R, C, scratch, s);
}

void gelu_bias_backward(Out dx, Out dbias, In x, In dout, int64_t R, int64_t C, float* scratch,
                        cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  if (dx.t == dout.t && x.t == dout.t) {
    colsum<true>("gelu_bias_backward", dx, dout, x, dbias, R, C, scratch, s);
    return;
  }
  // Mixed storage types: the two kernels it fuses.
  gelu_backward(dx, x, dout, R * C, s);
  bias_backward(dbias, In{dx.p, dx.t}, R, C, scratch, s);
}

int64_t squared_norm_scratch_doubles(int64_t n) { return n > 0 ? norm_chunks(n) : 0; }

void squared_norm(double* acc, In x, int64_t n, double* scratch, cudaStream_t s) {
  if (n <= 0) return;
  const int64_t G = norm_chunks(n);
  const int64_t chunk = (n + G - 1) / G;
  dispatch_float("squared_norm", x.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    sqnorm_partials_kernel<T>
        <<<static_cast<unsigned>(G), kNormThreads, 0, s>>>(rd<T>(x), n, chunk, scratch);
    FSDP_CHECK_LAUNCH();
  });
  sum_into(acc, scratch, G, s);
}

void sum_into(double* acc, const double* values, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  sum_into_kernel<<<1, 256, 0, s>>>(acc, values, n);
  FSDP_CHECK_LAUNCH();
}

void clip_coefficient(double* norm, float* coef, const double* parts, int64_t n, double max_norm,
                      cudaStream_t s) {
  clip_coefficient_kernel<<<1, 1, 0, s>>>(norm, coef, parts, n, max_norm);
  FSDP_CHECK_LAUNCH();
}

}  // namespace fsdp::cuda::kernels
