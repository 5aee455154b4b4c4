// src/cuda/kernels_reduce.cu: reductions with a fixed summation order (see kernels.hpp):
// bias gradients (column sums), squared norms and sums into fp64 device scalars, and the
// clip coefficient.
//
// Deterministic two-pass scheme, no atomics: pass 1 splits the work into chunks whose
// boundaries depend on the shapes only and writes one partial per chunk (threads sum in a
// fixed stride pattern, then a fixed shuffle/tree order); pass 2 adds the partials in index
// order. Results are therefore bitwise repeatable for given shapes.
#include "kernels_common.cuh"

namespace fsdp::cuda::kernels {
namespace {

// ---- column sums: [R, C] -> partials [G, C] (G row chunks) -> out[C] += sum over chunks ----
constexpr int kColTile = 32;    // columns per block (one per lane)
constexpr int kRowThreads = 8;  // rows handled in parallel per block
constexpr int64_t kMaxRowChunks = 1024;

// Rows per chunk: at least 64, and at most kMaxRowChunks chunks; a multiple of kRowThreads.
int64_t rows_per_chunk(int64_t R) {
  int64_t rpc = (R + kMaxRowChunks - 1) / kMaxRowChunks;
  if (rpc < 64) rpc = 64;
  return (rpc + kRowThreads - 1) / kRowThreads * kRowThreads;
}
int64_t row_chunks(int64_t R) {
  const int64_t rpc = rows_per_chunk(R);
  return R > 0 ? (R + rpc - 1) / rpc : 0;
}

// block (32, 8), grid (ceil(C/32), G): partial[g, c] = sum of dout[r, c] over chunk g.
template <class T>
__global__ void __launch_bounds__(kColTile* kRowThreads)
    colsum_partials_kernel(Rd<T> dout, int64_t R, int64_t C, int64_t rpc, float* partial) {
  __shared__ float sh[kRowThreads][kColTile + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t g = blockIdx.y;
  const int64_t r0 = g * rpc, r1 = min(R, r0 + rpc);
  float acc = 0.0f;
  if (c < C) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) acc += dout[r * C + c];
  }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) sum += sh[k][threadIdx.x];
    partial[g * C + c] = sum;
  }
}

// out[c] += sum over g of partial[g, c] (in g order, in double; rounded once).
template <class T>
__global__ void __launch_bounds__(256)
    colsum_finish_kernel(Wr<T> out, const float* partial, int64_t G, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum = 0.0;
  for (int64_t g = 0; g < G; ++g) sum += partial[g * C + c];
  out.set(c, out.get(c) + static_cast<float>(sum));
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

int64_t bias_backward_scratch_floats(int64_t R, int64_t C) { return row_chunks(R) * C; }

void bias_backward(Out dbias, In dout, int64_t R, int64_t C, float* scratch, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const int64_t rpc = rows_per_chunk(R), G = row_chunks(R);
  dispatch_float("bias_backward", dout.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const dim3 grid(static_cast<unsigned>((C + kColTile - 1) / kColTile), static_cast<unsigned>(G));
    colsum_partials_kernel<T>
        <<<grid, dim3(kColTile, kRowThreads), 0, s>>>(rd<T>(dout), R, C, rpc, scratch);
    FSDP_CHECK_LAUNCH();
  });
  dispatch_float("bias_backward", dbias.t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    colsum_finish_kernel<T>
        <<<static_cast<unsigned>((C + 255) / 256), 256, 0, s>>>(wr<T>(dbias), scratch, G, C);
    FSDP_CHECK_LAUNCH();
  });
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
