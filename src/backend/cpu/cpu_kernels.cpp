// src/backend/cpu/cpu_kernels.cpp: the CPU backend's fp32 kernels (see cpu_kernels.hpp).
//
// fp32, row-major, synchronous. This is the numerical reference the CUDA backend is tested
// against, and it is also what CPU training runs on, so it is written to be fast:
//  - GEMMs go to OpenBLAS (cblas_sgemm). OpenBLAS is kept single-threaded and large GEMMs
//    are split over the output rows (or columns) across OpenMP threads: one thread pool for
//    the whole backend, no contention between OpenBLAS' pthreads and OpenMP's, and it
//    measured ~25% faster than OpenBLAS' own threading on the GPT-2 shapes (4096x128x384..).
//  - Attention (GPT-2's causal attention and T5's mha alike) is FlashAttention-2 on 64 x 256
//    tiles with single-threaded sgemm calls per tile: the causal upper triangle's tiles are
//    skipped, masked scores are -inf and their probabilities exactly 0, and no T x T matrix
//    is stored (backward recomputes the probabilities from the saved row logsumexp).
//  - exp is a vectorisable polynomial (Cephes expf, ~1 ulp), so softmax, cross-entropy and
//    GELU loops vectorise without -ffast-math.
//  - Reductions whose result is a parameter gradient do not depend on the thread count:
//    bias and LayerNorm/RMSNorm weight gradients sum fixed blocks of rows in parallel and
//    add the block sums in order; embedding tables are split over columns and run over rows
//    in order. Loss sums and squared norms are accumulated in double.
//  - The conversions between fp32 and the 16-bit storage dtypes (and fp64) at the end are
//    elementwise, so they too are independent of the thread count.
#include "cpu_kernels.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>
#include <tuple>
#include <vector>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/backend/optimizer_math.hpp"
#include "fsdp/core/error.hpp"

// The 8-lane helpers below pass 32-byte vectors by value between inline functions; the ABI
// note GCC prints for that in non-AVX builds does not concern us.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace fsdp::cpu {
namespace {

// GEMMs with fewer flops than this run on one thread.
constexpr double kParallelMinGemmFlops = 4.0e6;
// Row blocks of the column-sum reductions (reduce_row_blocks): at least kRowBlock rows, at
// most kMaxRowBlocks blocks (bounding the partial sums to kMaxRowBlocks x width doubles); a
// function of the row count alone, so results do not depend on the thread count.
constexpr int64_t kRowBlock = 64;
constexpr int64_t kMaxRowBlocks = 32;

// 8-wide float vectors (GCC vector extensions: AVX2 in Release builds, two SSE registers
// otherwise). Used where the auto-vectoriser gives up (loops around exp: GCC will not
// if-convert the clamp without -ffast-math).
using f8 = float __attribute__((vector_size(32)));
using i8 = int32_t __attribute__((vector_size(32)));
using f4 = float __attribute__((vector_size(16)));
using d4 = double __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }
// First n (< 8) lanes from p, the rest `fill`.
inline f8 load_partial(const float* p, int64_t n, float fill) {
  f8 v = f8{} + fill;
  std::memcpy(&v, p, static_cast<std::size_t>(n) * sizeof(float));
  return v;
}
inline void store_partial(float* p, f8 v, int64_t n) {
  std::memcpy(p, &v, static_cast<std::size_t>(n) * sizeof(float));
}
inline d4 widen_sum(f8 v) {  // lanes 0..3 + lanes 4..7, in double
  const f4 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3);
  const f4 hi = __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return __builtin_convertvector(lo, d4) + __builtin_convertvector(hi, d4);
}
inline float hsum(f8 v) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}
inline double hsum(d4 v) { return (v[0] + v[1]) + (v[2] + v[3]); }

// exp(x), 8 lanes, no libm call: Cephes expf (~1 ulp). Range reduction x = n ln2 + r with
// |r| <= ln2/2, a degree-6 polynomial for e^r, and 2^n built from its exponent bits. Inputs
// are clamped to [ln(FLT_MIN), 88.376] so no denormal or inf is produced (exp of a very
// negative number returns ~1.2e-38 instead of 0); NaN propagates.
inline f8 vexp(f8 x) {
  const f8 hi = f8{} + 88.3762626647949f;
  const f8 lo = f8{} - 87.3365447504f;
  x = x > hi ? hi : x;
  x = x < lo ? lo : x;
  const f8 magic = f8{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const f8 t = x * 1.44269504088896341f + magic;
  const f8 n = t - magic;
  f8 r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  f8 p = f8{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const i8 ni = std::bit_cast<i8>(t) - 0x4B400000;  // 0x4B400000: bits of magic
  const i8 scale_bits = (ni + 127) << 23;
  return p * std::bit_cast<f8>(scale_bits);
}

// x[j] = exp(x[j] - shift) for j < n; returns the sum of the new x[j] (accumulated in
// double, 4 lanes, so the result does not depend on how rows are split among threads).
inline double exp_shift_inplace(float* x, int64_t n, float shift) {
  d4 acc{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f8 e = vexp(load8(x + j) - shift);
    store8(x + j, e);
    acc += widen_sum(e);
  }
  double s = hsum(acc);
  if (j < n) {
    const f8 e = vexp(load_partial(x + j, n - j, 0.0f) - shift);
    store_partial(x + j, e, n - j);
    for (int64_t l = 0; l < n - j; ++l) s += e[l];
  }
  return s;
}
// Sum of exp(x[j] - shift) for j < n, in double; x unchanged.
inline double exp_shift_sum(const float* x, int64_t n, float shift) {
  d4 acc{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) acc += widen_sum(vexp(load8(x + j) - shift));
  double s = hsum(acc);
  if (j < n) {
    const f8 e = vexp(load_partial(x + j, n - j, 0.0f) - shift);
    for (int64_t l = 0; l < n - j; ++l) s += e[l];
  }
  return s;
}
// max of x[0, n), -inf for n == 0; NaNs are skipped (as std::max(mx, x) would). 8 lanes: GCC
// does not vectorise the scalar loop.
inline float row_max(const float* x, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  f8 m = f8{} + ninf;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f8 v = load8(x + j);
    m = v > m ? v : m;
  }
  if (j < n) {
    const f8 v = load_partial(x + j, n - j, ninf);
    m = v > m ? v : m;
  }
  float mx = ninf;
  for (int l = 0; l < 8; ++l) mx = m[l] > mx ? m[l] : mx;
  return mx;
}

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

int to_blas_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw Error("cpu backend: gemm " + std::string(what) + " = " + std::to_string(v) +
                " out of range for OpenBLAS (expected 0 <= " + what + " <= INT_MAX)");
  }
  return static_cast<int>(v);
}

// Row-major sgemm on the calling thread; no-op shapes are handled by the caller.
inline void sgemm1(bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                   int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M,
              N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// [begin, end) of part `i` of `n` parts of [0, total), boundaries rounded to `grain`.
inline void split_range(int64_t total, int i, int n, int64_t grain, int64_t& begin,
                        int64_t& end) {
  const int64_t chunks = (total + grain - 1) / grain;
  begin = std::min(total, chunks * i / n * grain);
  end = std::min(total, chunks * (i + 1) / n * grain);
}

}  // namespace

CpuKernels::CpuKernels(int num_threads) : n_(num_threads) {
  if (num_threads < 1) {
    throw Error("cpu backend: num_threads = " + std::to_string(num_threads) +
                " (expected >= 1)");
  }
  // OpenBLAS runs inside our OpenMP regions (see the top of this file).
  openblas_set_num_threads(1);
}

template <typename Body>
void CpuKernels::for_column_chunks(int64_t C, int64_t R, const Body& body) const {
  const int nt = (C >= 32 && R * C >= kParallelMinElems) ? n_ : 1;
  if (nt == 1) {
    body(int64_t{0}, C);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    int64_t c0 = 0, c1 = 0;
    split_range(C, omp_get_thread_num(), omp_get_num_threads(), 16, c0, c1);
    if (c0 < c1) body(c0, c1);
  }
}

template <typename Body, typename Finish>
void CpuKernels::reduce_row_blocks(int64_t R, int64_t W, const Body& body,
                                   const Finish& finish) const {
  const int64_t rows = std::max(kRowBlock, (R + kMaxRowBlocks - 1) / kMaxRowBlocks);
  const int64_t blocks = (R + rows - 1) / rows;
  // Reused between calls: a fresh buffer of this size would be mmap'ed and page-faulted in
  // by glibc every call.
  std::vector<double>& partial = row_block_partials_;
  const auto need = static_cast<std::size_t>(std::max<int64_t>(blocks, 1) * W);
  if (partial.size() < need) partial.resize(need);
  double* p = partial.data();
#pragma omp parallel for num_threads(threads_for(R * W, kParallelMinElems)) schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    double* acc = p + b * W;
    std::fill(acc, acc + W, 0.0);
    body(b * rows, std::min(R, (b + 1) * rows), acc);
  }
  // Block 0's row holds the total: blocks added in order, column by column.
  double* total = p;
#pragma omp parallel for num_threads(threads_for(blocks * W, kParallelMinElems)) schedule(static)
  for (int64_t w = 0; w < W; ++w) {
    double s = total[w];
    for (int64_t b = 1; b < blocks; ++b) s += p[b * W + w];
    total[w] = s;
  }
  finish(static_cast<const double*>(total));
}

// ---------------------------------------------------------------------------------------
// dense algebra

void CpuKernels::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const float* A, const float* B, float beta, float* C) const {
  const int m = to_blas_int(M, "M"), n = to_blas_int(N, "N"), k = to_blas_int(K, "K");
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta * C (BLAS semantics: beta == 0 overwrites, even NaN)
    if (beta == 0.0f) {
      std::fill(C, C + M * N, 0.0f);
    } else {
      scale(C, beta, M * N);
    }
    return;
  }
  const int lda = std::max(1, trans_a ? m : k);
  const int ldb = std::max(1, trans_b ? k : n);
  const double flops = 2.0 * static_cast<double>(M) * N * K;
  if (n_ == 1 || flops < kParallelMinGemmFlops || std::max(M, N) < 32) {
    sgemm1(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, n);
    return;
  }
  const bool split_rows = M >= N;
#pragma omp parallel num_threads(n_)
  {
    int64_t b = 0, e = 0;
    if (split_rows) {
      split_range(M, omp_get_thread_num(), omp_get_num_threads(), 16, b, e);
      if (b < e) {
        const float* Ap = trans_a ? A + b : A + b * K;
        sgemm1(trans_a, trans_b, static_cast<int>(e - b), n, k, alpha, Ap, lda, B, ldb, beta,
               C + b * N, n);
      }
    } else {
      split_range(N, omp_get_thread_num(), omp_get_num_threads(), 16, b, e);
      if (b < e) {
        const float* Bp = trans_b ? B + b * K : B + b;
        sgemm1(trans_a, trans_b, m, static_cast<int>(e - b), k, alpha, A, lda, Bp, ldb, beta,
               C + b, n);
      }
    }
  }
}

void CpuKernels::add_bias(float* out, const float* bias, int64_t R, int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] += bias[c];
  }
}

void CpuKernels::bias_backward(float* dbias, const float* dout, int64_t R, int64_t C) const {
  reduce_row_blocks(
      R, C,
      [=](int64_t r0, int64_t r1, double* a) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* d = dout + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) a[c] += d[c];
        }
      },
      [&](const double* total) {
        for (int64_t c = 0; c < C; ++c) dbias[c] += static_cast<float>(total[c]);
      });
}

void CpuKernels::add(float* out, const float* a, const float* b, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void CpuKernels::add_bias_residual(float* h, const float* bias, const float* residual, int64_t R,
                                   int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* o = h + r * C;
    const float* x = residual + r * C;
    if (bias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = (o[c] + bias[c]) + x[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += x[c];
    }
  }
}

void CpuKernels::axpy(float* y, float alpha, const float* x, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void CpuKernels::scale(float* x, float alpha, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

double CpuKernels::squared_norm(const float* x, int64_t n) const {
  // Fixed-size chunks summed in order: the result does not depend on the thread count.
  constexpr int64_t kChunk = 8192;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<std::size_t>(chunks), 0.0);
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const float* p = x + ch * kChunk;
    const int64_t len = std::min(kChunk, n - ch * kChunk);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; ++i) s += static_cast<double>(p[i]) * p[i];
    partial[static_cast<std::size_t>(ch)] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

// ---------------------------------------------------------------------------------------
// embedding

void CpuKernels::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t B, int64_t T, int64_t C) const {
  for (int64_t i = 0; i < B * T; ++i) {
    if (tokens[i] < 0) {
      throw Error("cpu backend: embedding_forward: token " + std::to_string(tokens[i]) +
                  " at position " + std::to_string(i) + " (expected >= 0)");
    }
  }
#pragma omp parallel for num_threads(threads_for(B * T * C, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < B * T; ++i) {
    const float* e = wte + static_cast<int64_t>(tokens[i]) * C;
    const float* p = wpe + (i % T) * C;
    float* o = out + i * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void CpuKernels::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int64_t B, int64_t T, int64_t C) const {
  // Column chunks per thread, rows in order: repeated tokens accumulate without races and
  // the result does not depend on the thread count.
  for_column_chunks(C, B * T, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t i = 0; i < B * T; ++i) {
      const float* d = dout + i * C + c0;
      float* ge = dwte + static_cast<int64_t>(tokens[i]) * C + c0;
      float* gp = dwpe + (i % T) * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        ge[c] += d[c];
        gp[c] += d[c];
      }
    }
  });
}

// ---------------------------------------------------------------------------------------
// LayerNorm

void CpuKernels::layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                   const float* weight, const float* bias, int64_t R,
                                   int64_t C, float eps) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xr[c];
    const double mu = s / static_cast<double>(C);
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) {
      const double d = xr[c] - mu;
      ss += d * d;
    }
    const double var = ss / static_cast<double>(C);
    const float m = static_cast<float>(mu);
    const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    float* o = out + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * rs * weight[c] + bias[c];
    mean[r] = m;
    rstd[r] = rs;
  }
}

void CpuKernels::layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                                    const float* x, const float* weight, const float* mean,
                                    const float* rstd, int64_t R, int64_t C) const {
  // dx += rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * weight.
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    const float* dr = dout + r * C;
    const float m = mean[r], rs = rstd[r];
    float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - m) * rs;
      const float dxhat = dr[c] * weight[c];
      s1 += dxhat;
      s2 += dxhat * xhat;
    }
    const float m1 = s1 / static_cast<float>(C);
    const float m2 = s2 / static_cast<float>(C);
    float* g = dx + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float xhat = (xr[c] - m) * rs;
      const float dxhat = dr[c] * weight[c];
      g[c] += rs * (dxhat - m1 - xhat * m2);
    }
  }
  // dweight += sum_r dout * xhat, dbias += sum_r dout: row blocks, summed in block order.
  reduce_row_blocks(
      R, 2 * C,
      [=](int64_t r0, int64_t r1, double* acc) {
        double* aw = acc;
        double* ab = acc + C;
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = x + r * C;
          const float* dr = dout + r * C;
          const float m = mean[r], rs = rstd[r];
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            aw[c] += dr[c] * ((xr[c] - m) * rs);
            ab[c] += dr[c];
          }
        }
      },
      [&](const double* total) {
        for (int64_t c = 0; c < C; ++c) {
          dweight[c] += static_cast<float>(total[c]);
          dbias[c] += static_cast<float>(total[C + c]);
        }
      });
}

// ---------------------------------------------------------------------------------------
// GELU (tanh approximation). 0.5 (1 + tanh(u)) = sigmoid(2u), so gelu(x) = x * sigmoid(2u)
// with u = sqrt(2/pi) (x + 0.044715 x^3): one exp per element, no cancellation.

namespace {
// GELU and its derivative on 8 lanes.
inline f8 gelu8(f8 x) {
  const f8 u = kGeluC * (x + kGeluA * x * x * x);
  return x / (1.0f + vexp(-2.0f * u));
}
// d/dx [x s] = s + x * 2 s (1 - s) du/dx, s = sigmoid(2u), du/dx = c (1 + 3a x^2).
inline f8 gelu_grad8(f8 x, f8 dout) {
  const f8 u = kGeluC * (x + kGeluA * x * x * x);
  const f8 s = 1.0f / (1.0f + vexp(-2.0f * u));
  const f8 du = kGeluC * (1.0f + 3.0f * kGeluA * x * x);
  return dout * (s + 2.0f * x * s * (1.0f - s) * du);
}
}  // namespace

void CpuKernels::gelu_forward(float* out, const float* x, int64_t n) const {
  const int64_t nv = n / 8;
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) store8(out + 8 * v, gelu8(load8(x + 8 * v)));
  if (const int64_t rem = n - 8 * nv; rem > 0) {
    store_partial(out + 8 * nv, gelu8(load_partial(x + 8 * nv, rem, 0.0f)), rem);
  }
}

void CpuKernels::gelu_backward(float* dx, const float* x, const float* dout, int64_t n) const {
  const int64_t nv = n / 8;
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    store8(dx + 8 * v, gelu_grad8(load8(x + 8 * v), load8(dout + 8 * v)));
  }
  if (const int64_t rem = n - 8 * nv; rem > 0) {
    store_partial(dx + 8 * nv,
                  gelu_grad8(load_partial(x + 8 * nv, rem, 0.0f),
                             load_partial(dout + 8 * nv, rem, 0.0f)),
                  rem);
  }
}

namespace {
// x rounded to the precision of storage type t (to nearest even, as every 16-bit store).
inline f8 round8(f8 x, DType t) {
  if (t == DType::bf16) {
    for (int k = 0; k < 8; ++k) x[k] = bf16_to_f32(f32_to_bf16(x[k]));
  } else if (t == DType::f16) {
    for (int k = 0; k < 8; ++k) x[k] = f16_to_f32(f32_to_f16(x[k]));
  }
  return x;
}
}  // namespace

void CpuKernels::geglu_forward(float* out, const float* gate, const float* up, int64_t n,
                               DType gate_t) const {
  const int64_t nv = (n + 7) / 8;
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t m = std::min<int64_t>(8, n - 8 * v);
    const f8 g = load_partial(gate + 8 * v, m, 0.0f), u = load_partial(up + 8 * v, m, 0.0f);
    store_partial(out + 8 * v, round8(gelu8(g), gate_t) * u, m);
  }
}

void CpuKernels::geglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                const float* up, int64_t n, DType gate_t, DType dgate_t) const {
  const int64_t nv = (n + 7) / 8;
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) {
    const int64_t m = std::min<int64_t>(8, n - 8 * v);
    const f8 d = load_partial(dout + 8 * v, m, 0.0f), g = load_partial(gate + 8 * v, m, 0.0f);
    const f8 u = load_partial(up + 8 * v, m, 0.0f);
    store_partial(dup + 8 * v, d * round8(gelu8(g), gate_t), m);
    store_partial(dgate + 8 * v, gelu_grad8(g, round8(d * u, dgate_t)), m);
  }
}

// GELU of one row: out[0, n) = gelu(x[0, n)) (8 lanes at a time, as gelu_forward).
namespace {
inline void gelu_row(float* out, const float* x, int64_t n) {
  const int64_t nv = n / 8;
  for (int64_t v = 0; v < nv; ++v) store8(out + 8 * v, gelu8(load8(x + 8 * v)));
  if (const int64_t rem = n - 8 * nv; rem > 0) {
    store_partial(out + 8 * nv, gelu8(load_partial(x + 8 * nv, rem, 0.0f)), rem);
  }
}
// dx[0, n) = dout * gelu'(x) of one row (as gelu_backward; dx may alias dout).
inline void gelu_grad_row(float* dx, const float* x, const float* dout, int64_t n) {
  const int64_t nv = n / 8;
  for (int64_t v = 0; v < nv; ++v) {
    store8(dx + 8 * v, gelu_grad8(load8(x + 8 * v), load8(dout + 8 * v)));
  }
  if (const int64_t rem = n - 8 * nv; rem > 0) {
    store_partial(dx + 8 * nv,
                  gelu_grad8(load_partial(x + 8 * nv, rem, 0.0f),
                             load_partial(dout + 8 * nv, rem, 0.0f)),
                  rem);
  }
}
}  // namespace

void CpuKernels::bias_gelu_forward(float* out, float* fc, const float* bias, int64_t R,
                                   int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* f = fc + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) f[c] += bias[c];
    gelu_row(out + r * C, f, C);
  }
}

void CpuKernels::gelu_bias_backward(float* dfc, float* dbias, const float* fc, const float* dout,
                                    int64_t R, int64_t C) const {
  // Row blocks as bias_backward: each row's dfc is written, then added to its block's sums.
  reduce_row_blocks(
      R, C,
      [=](int64_t r0, int64_t r1, double* a) {
        for (int64_t r = r0; r < r1; ++r) {
          float* d = dfc + r * C;
          gelu_grad_row(d, fc + r * C, dout + r * C, C);
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) a[c] += d[c];
        }
      },
      [&](const double* total) {
        for (int64_t c = 0; c < C; ++c) dbias[c] += static_cast<float>(total[c]);
      });
}

// ---------------------------------------------------------------------------------------
// T5 pieces

void CpuKernels::embedding_lookup_forward(float* out, const int32_t* tokens, const float* table,
                                          int64_t N, int64_t C) const {
#pragma omp parallel for num_threads(threads_for(N * C, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < N; ++i) {
    const float* e = table + static_cast<int64_t>(tokens[i]) * C;
    std::memcpy(out + i * C, e, static_cast<std::size_t>(C) * sizeof(float));
  }
}

void CpuKernels::embedding_lookup_backward(float* dtable, const float* dout,
                                           const int32_t* tokens, int64_t N, int64_t C) const {
  // As embedding_backward: column chunks per thread, rows in order.
  for_column_chunks(C, N, [&](int64_t c0, int64_t c1) {
    const int64_t w = c1 - c0;
    for (int64_t i = 0; i < N; ++i) {
      const float* d = dout + i * C + c0;
      float* g = dtable + static_cast<int64_t>(tokens[i]) * C + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) g[c] += d[c];
    }
  });
}

// RMSNorm (HF T5LayerNorm): var = mean(x^2) (summed in double), rstd = 1/sqrt(var + eps),
// out = weight * (x * rstd).
void CpuKernels::rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight,
                                 int64_t R, int64_t C, float eps) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(xr[c]) * xr[c];
    const double var = C > 0 ? ss / static_cast<double>(C) : 0.0;
    const float rs = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps)));
    float* o = out + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = weight[c] * (xr[c] * rs);
    rstd[r] = rs;
  }
}

void CpuKernels::rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                                  const float* weight, const float* rstd, int64_t R,
                                  int64_t C) const {
  // xhat = x * rstd, dxhat = dout * weight: dx += rstd * (dxhat - xhat * mean(dxhat * xhat)).
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * C;
    const float* dr = dout + r * C;
    const float rs = rstd[r];
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += (dr[c] * weight[c]) * (xr[c] * rs);
    const float m = s / static_cast<float>(C);
    float* g = dx + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) g[c] += rs * (dr[c] * weight[c] - (xr[c] * rs) * m);
  }
  // dweight += sum_r dout * xhat: row blocks, summed in block order.
  reduce_row_blocks(
      R, C,
      [=](int64_t r0, int64_t r1, double* a) {
        for (int64_t r = r0; r < r1; ++r) {
          const float* xr = x + r * C;
          const float* dr = dout + r * C;
          const float rs = rstd[r];
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) a[c] += dr[c] * (xr[c] * rs);
        }
      },
      [&](const double* total) {
        for (int64_t c = 0; c < C; ++c) dweight[c] += static_cast<float>(total[c]);
      });
}

void CpuKernels::relu_forward(float* out, const float* x, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void CpuKernels::relu_backward(float* dx, const float* x, const float* dout, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dout[i] : 0.0f;
}

void CpuKernels::mul(float* out, const float* a, const float* b, int64_t n) const {
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

// ---------------------------------------------------------------------------------------
// Llama pieces: rotary embedding (rotate-half layout) and SwiGLU

namespace {
// y[i] = x[i] c - x[i+half] s; y[i+half] = x[i+half] c + x[i] s for one row of `half` pairs
// (sn = -sin gives the transpose). Reads every input of a pair before writing it: y may be x.
inline void rope_row(float* y, const float* x, const float* c, const float* s, float sign,
                     int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half], ci = c[i], si = sign * s[i];
    y[i] = a * ci - b * si;
    y[i + half] = b * ci + a * si;
  }
}
// sigmoid(g), 8 lanes (vexp's clamp keeps 1 + exp(-g) finite).
inline f8 sigmoid8(f8 g) { return 1.0f / (1.0f + vexp(-g)); }
}  // namespace

void CpuKernels::rope(float* out, const float* x, const float* cos, const float* sin, int64_t B,
                      int64_t T, int64_t H, int64_t D, int64_t R, bool transpose) const {
  const int64_t half = R / 2, rows = B * T;
  const float sign = transpose ? -1.0f : 1.0f;
#pragma omp parallel for num_threads(threads_for(rows * H * D, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t off = (r * H + h) * D;
      rope_row(out + off, x + off, c, s, sign, half);
      if (out != x) std::copy(x + off + R, x + off + D, out + off + R);  // not rotated
    }
  }
}

void CpuKernels::swiglu_forward(float* out, const float* gate, const float* up, int64_t n) const {
  const int64_t nv = n / 8;
  auto f = [](f8 g, f8 u) { return g * sigmoid8(g) * u; };
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) store8(out + 8 * v, f(load8(gate + 8 * v), load8(up + 8 * v)));
  if (const int64_t rem = n - 8 * nv; rem > 0) {
    store_partial(out + 8 * nv,
                  f(load_partial(gate + 8 * nv, rem, 0.0f), load_partial(up + 8 * nv, rem, 0.0f)),
                  rem);
  }
}

void CpuKernels::sigmoid_gate_forward(float* out, const float* x, const float* gate,
                                      int64_t n) const {
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float s = 1.0f / (1.0f + std::exp(-gate[i]));
    out[i] = x[i] * s;
  }
}

void CpuKernels::sigmoid_gate_backward(float* dx, float* dgate, const float* dout, const float* x,
                                       const float* gate, int64_t n) const {
  // Each element's inputs are read before its outputs are written: dx may be dout, dgate gate.
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float d = dout[i], xv = x[i];
    const float s = 1.0f / (1.0f + std::exp(-gate[i]));
    dx[i] = d * s;
    dgate[i] = d * xv * (s * (1.0f - s));
  }
}

void CpuKernels::clamped_swiglu_forward(float* out, const float* gate_up, int64_t n,
                                        float alpha, float limit) const {
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate_up[2 * i], limit);
    const float u = std::clamp(gate_up[2 * i + 1], -limit, limit);
    const float s = 1.0f / (1.0f + std::exp(-alpha * g));
    out[i] = (u + 1.0f) * (g * s);
  }
}

void CpuKernels::clamped_swiglu_backward(float* dgate_up, const float* dout, const float* gate_up,
                                         int64_t n, float alpha, float limit) const {
  // Each pair is read before it is written: dgate_up may be gate_up.
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float gate = gate_up[2 * i], up = gate_up[2 * i + 1], d = dout[i];
    const float g = std::min(gate, limit);
    const float u = std::clamp(up, -limit, limit);
    const float s = 1.0f / (1.0f + std::exp(-alpha * g));
    dgate_up[2 * i] = gate <= limit ? d * (u + 1.0f) * (s + alpha * g * s * (1.0f - s)) : 0.0f;
    dgate_up[2 * i + 1] = up >= -limit && up <= limit ? d * (g * s) : 0.0f;
  }
}

void CpuKernels::attention_sink_forward(float* out, float* lse, const float* sinks, int64_t B,
                                        int64_t T, int64_t H, int64_t D) const {
  // Row (b, t, h): f = 1 / (1 + exp(s - L)) and L' = log(exp(L) + exp(s)), each computed
  // from the larger of the two logits so that neither exponential overflows.
#pragma omp parallel for num_threads(threads_for(B * T * H * D, kParallelMinElems)) \
    schedule(static)
  for (int64_t r = 0; r < B * T * H; ++r) {
    const int64_t h = r % H, bt = r / H, b = bt / T, t = bt % T;
    float& L = lse[(b * H + h) * T + t];
    if (std::isinf(L) && L > 0.0f) continue;  // no visible key: left as it is
    const float s = sinks[h];
    float f = 0.0f;
    if (s > L) {
      const float e = std::exp(L - s);
      f = e / (1.0f + e);
      L = s + std::log1p(e);
    } else {
      const float e = std::exp(s - L);
      f = 1.0f / (1.0f + e);
      L = L + std::log1p(e);
    }
    float* o = out + bt * H * D + h * D;
    for (int64_t e = 0; e < D; ++e) o[e] *= f;
  }
}

void CpuKernels::attention_sink_backward(float* dsinks, const float* dout, const float* out,
                                         const float* lse, const float* sinks, int64_t B,
                                         int64_t T, int64_t H, int64_t D) const {
  // A head a thread; each sums over b, then t ascending.
#pragma omp parallel for num_threads(threads_for(B * T * H * D, kParallelMinElems)) \
    schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    float acc = 0.0f;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < T; ++t) {
        const float L = lse[(b * H + h) * T + t];
        if (std::isinf(L) && L > 0.0f) continue;  // p_s = 0
        const float* o = out + (b * T + t) * H * D + h * D;
        const float* d = dout + (b * T + t) * H * D + h * D;
        float dot = 0.0f;
        for (int64_t e = 0; e < D; ++e) dot += d[e] * o[e];
        acc += std::exp(sinks[h] - L) * dot;
      }
    }
    dsinks[h] -= acc;
  }
}

// ---- linear attention (Gated DeltaNet) ----

namespace {

float sigmoid1(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus (beta 1, threshold 20): x above 20 is x.
float softplus_torch(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

constexpr int64_t kDeltaChunk = 64;  // tokens between the backward's state checkpoints
constexpr float kL2NormEps = 1e-6f;  // HF l2norm's eps (use_qk_l2norm_in_kernel)

// y[n] = x / sqrt(sum x^2 + eps) * scale; returns the 1 / sqrt(...) factor.
float l2normalize(float* y, const float* x, int64_t n, float scale) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss + kL2NormEps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * scale;
  return r;
}

// The gates of value head h at one token: g = -exp(A_log) softplus(a + dt_bias), the decay
// exp(g) and beta = sigmoid(b).
struct DeltaGates {
  float g, decay, beta;
};
DeltaGates delta_gates(float a, float b, float A_log, float dt_bias) {
  DeltaGates r;
  r.g = -std::exp(A_log) * softplus_torch(a + dt_bias);
  r.decay = std::exp(r.g);
  r.beta = sigmoid1(b);
  return r;
}

// One step of the recurrence on S [Dk,Dv] (row i = key dimension): S = decay S; u = S^T k;
// d = beta (v - u); S += k d^T. Writes u and d [Dv]. `reset` (the token starts a document):
// S is zero before the step.
void delta_step(float* S, const float* k, const float* v, float decay, float beta, float* u,
                float* d, int64_t Dk, int64_t Dv, bool reset) {
  if (reset) std::fill(S, S + Dk * Dv, 0.0f);
  for (int64_t j = 0; j < Dv; ++j) u[j] = 0.0f;
  for (int64_t i = 0; i < Dk; ++i) {
    float* row = S + i * Dv;
    for (int64_t j = 0; j < Dv; ++j) {
      row[j] *= decay;
      u[j] += row[j] * k[i];
    }
  }
  for (int64_t j = 0; j < Dv; ++j) d[j] = beta * (v[j] - u[j]);
  for (int64_t i = 0; i < Dk; ++i) {
    float* row = S + i * Dv;
    for (int64_t j = 0; j < Dv; ++j) row[j] += k[i] * d[j];
  }
}

// The first tap of the causal conv's output t that reads inside its document: x[t - K + 1 + j]
// for j >= it (the row's start, or doc_start[bt]).
int64_t first_tap(int64_t t, int64_t K, const int32_t* doc_start, int64_t bt) {
  const int64_t lo = doc_start != nullptr ? doc_start[bt] : 0;
  return std::max<int64_t>(0, lo - t + K - 1);
}

// The conv's pre-activation at row-major token bt, channel c: its taps j >= j0 (first_tap).
float conv_pre(const float* x, const float* weight, int64_t bt, int64_t c, int64_t C, int64_t K,
               int64_t j0) {
  float acc = 0.0f;
  for (int64_t j = j0; j < K; ++j) acc += weight[c * K + j] * x[(bt - (K - 1 - j)) * C + c];
  return acc;
}

// Whether token t (row-major index bt) starts a document after the row's first token.
bool starts_document(const int32_t* doc_start, int64_t bt, int64_t t) {
  return doc_start != nullptr && t > 0 && doc_start[bt] == t;
}

}  // namespace

void CpuKernels::causal_conv1d_forward(float* out, const float* x, const float* weight, int64_t B,
                                       int64_t T, int64_t C, int64_t K,
                                       const int32_t* doc_start) const {
#pragma omp parallel for num_threads(threads_for(B * T * C * K, kParallelMinElems)) \
    schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T, j0 = first_tap(t, K, doc_start, bt);
    for (int64_t c = 0; c < C; ++c) {
      const float acc = conv_pre(x, weight, bt, c, C, K, j0);
      out[bt * C + c] = acc * sigmoid1(acc);
    }
  }
}

void CpuKernels::causal_conv1d_backward(float* dx, float* dweight, const float* dout,
                                        const float* x, const float* weight, int64_t B, int64_t T,
                                        int64_t C, int64_t K, const int32_t* doc_start) const {
  // dpre = dout silu'(pre), the pre-activation recomputed; then dx[t] = sum_j w[j]
  // dpre[t + K - 1 - j] and dweight[c,j] = sum over b, t of dpre[t] x[t - K + 1 + j].
  std::vector<float> dpre(static_cast<std::size_t>(B * T * C));
  const int nt = threads_for(B * T * C * K, kParallelMinElems);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T, j0 = first_tap(t, K, doc_start, bt);
    for (int64_t c = 0; c < C; ++c) {
      const float acc = conv_pre(x, weight, bt, c, C, K, j0);
      const float s = sigmoid1(acc);
      dpre[bt * C + c] = dout[bt * C + c] * s * (1.0f + acc * (1.0f - s));
    }
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const int64_t t = bt % T;
    for (int64_t c = 0; c < C; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t to = t + K - 1 - j;  // the output that reads x[t] through weight[c,j]
        if (to < T && j >= first_tap(to, K, doc_start, bt + K - 1 - j)) {
          acc += weight[c * K + j] * dpre[(bt + K - 1 - j) * C + c];
        }
      }
      dx[bt * C + c] = acc;
    }
  }
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t c = 0; c < C; ++c) {
    for (int64_t j = 0; j < K; ++j) {
      float acc = 0.0f;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t t = std::max<int64_t>(0, K - 1 - j); t < T; ++t) {
          if (j < first_tap(t, K, doc_start, b * T + t)) continue;
          acc += dpre[(b * T + t) * C + c] * x[(b * T + t - (K - 1 - j)) * C + c];
        }
      }
      dweight[c * K + j] += acc;
    }
  }
}

void CpuKernels::gated_delta_rule_forward(float* out, const float* qkv, const float* a,
                                          const float* b, const float* A_log,
                                          const float* dt_bias, int64_t B, int64_t T, int64_t Hk,
                                          int64_t Hv, int64_t Dk, int64_t Dv,
                                          const int32_t* doc_start) const {
  const int64_t W = 2 * Hk * Dk + Hv * Dv, group = Hv / Hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
#pragma omp parallel for num_threads(threads_for(B * Hv * T * Dk * Dv, kParallelMinElems)) \
    schedule(dynamic, 1)
  for (int64_t bh = 0; bh < B * Hv; ++bh) {
    const int64_t bi = bh / Hv, h = bh % Hv, kh = h / group;
    std::vector<float> S(static_cast<std::size_t>(Dk * Dv), 0.0f), q(Dk), k(Dk), u(Dv), d(Dv);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t bt = bi * T + t;
      const float* row = qkv + bt * W;
      l2normalize(q.data(), row + kh * Dk, Dk, scale);
      l2normalize(k.data(), row + Hk * Dk + kh * Dk, Dk, 1.0f);
      const DeltaGates gt = delta_gates(a[bt * Hv + h], b[bt * Hv + h], A_log[h], dt_bias[h]);
      delta_step(S.data(), k.data(), row + 2 * Hk * Dk + h * Dv, gt.decay, gt.beta, u.data(),
                 d.data(), Dk, Dv, starts_document(doc_start, bt, t));
      float* o = out + bt * Hv * Dv + h * Dv;
      for (int64_t j = 0; j < Dv; ++j) o[j] = 0.0f;
      for (int64_t i = 0; i < Dk; ++i) {
        const float* Srow = S.data() + i * Dv;
        for (int64_t j = 0; j < Dv; ++j) o[j] += Srow[j] * q[i];
      }
    }
  }
}

void CpuKernels::gated_delta_rule_backward(float* dqkv, float* da, float* db, float* dA_log,
                                           float* ddt_bias, const float* dout, const float* qkv,
                                           const float* a, const float* b, const float* A_log,
                                           const float* dt_bias, int64_t B, int64_t T,
                                           int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                           const int32_t* doc_start) const {
  const int64_t W = 2 * Hk * Dk + Hv * Dv, group = Hv / Hk, SD = Dk * Dv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dk));
  const int64_t chunks = (T + kDeltaChunk - 1) / kDeltaChunk;
  // The (b, h) sums of dA_log and ddt_bias, added in b order after the loop.
  std::vector<float> part_A(static_cast<std::size_t>(B * Hv)), part_dt(part_A.size());
  // A task is one batch row's q/k head and its group of value heads: their q/k gradients
  // are summed in the task, so no two tasks write the same element.
#pragma omp parallel for num_threads(threads_for(B * Hv * T * Dk * Dv, kParallelMinElems)) \
    schedule(dynamic, 1)
  for (int64_t bk = 0; bk < B * Hk; ++bk) {
    const int64_t bi = bk / Hk, kh = bk % Hk;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    std::vector<float> qn(n(T * Dk)), kn(n(T * Dk)), rq(n(T)), rk(n(T));
    std::vector<float> dqn(n(T * Dk), 0.0f), dkn(n(T * Dk), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      const float* row = qkv + (bi * T + t) * W;
      rq[t] = l2normalize(&qn[t * Dk], row + kh * Dk, Dk, scale);
      rk[t] = l2normalize(&kn[t * Dk], row + Hk * Dk + kh * Dk, Dk, 1.0f);
    }
    std::vector<float> ck(n(chunks * SD)), St(n(kDeltaChunk * SD)), dS(n(SD)), zero(n(SD), 0.0f);
    const auto reset = [&](int64_t t) { return starts_document(doc_start, bi * T + t, t); };
    std::vector<float> u(n(Dv)), d(n(Dv)), dd(n(Dv));
    std::vector<DeltaGates> gates(n(T));
    for (int64_t h = kh * group; h < (kh + 1) * group; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t bt = bi * T + t;
        gates[t] = delta_gates(a[bt * Hv + h], b[bt * Hv + h], A_log[h], dt_bias[h]);
      }
      const auto v_at = [&](int64_t t) { return qkv + (bi * T + t) * W + 2 * Hk * Dk + h * Dv; };
      // Forward sweep: the state before each chunk.
      std::fill(ck.begin(), ck.begin() + SD, 0.0f);
      {
        std::vector<float> S(n(SD), 0.0f);
        for (int64_t t = 0; t < (chunks - 1) * kDeltaChunk; ++t) {
          delta_step(S.data(), &kn[t * Dk], v_at(t), gates[t].decay, gates[t].beta, u.data(),
                     d.data(), Dk, Dv, reset(t));
          if ((t + 1) % kDeltaChunk == 0) {
            std::copy(S.begin(), S.end(), ck.begin() + ((t + 1) / kDeltaChunk) * SD);
          }
        }
      }
      std::fill(dS.begin(), dS.end(), 0.0f);
      float acc_A = 0.0f, acc_dt = 0.0f;
      const float expA = std::exp(A_log[h]);
      for (int64_t c = chunks - 1; c >= 0; --c) {
        const int64_t t0 = c * kDeltaChunk, len = std::min(T, t0 + kDeltaChunk) - t0;
        // The chunk's states after each of its steps, from its checkpoint.
        for (int64_t i = 0; i < len; ++i) {
          float* S = &St[i * SD];
          std::copy_n(i == 0 ? &ck[c * SD] : &St[(i - 1) * SD], SD, S);
          delta_step(S, &kn[(t0 + i) * Dk], v_at(t0 + i), gates[t0 + i].decay,
                     gates[t0 + i].beta, u.data(), d.data(), Dk, Dv, reset(t0 + i));
        }
        for (int64_t i = len - 1; i >= 0; --i) {
          const int64_t t = t0 + i, bt = bi * T + t;
          const float* Scur = &St[i * SD];
          // The state the step starts from: zero at a document's first token.
          const float* Sprev = reset(t) ? zero.data() : i == 0 ? &ck[c * SD] : &St[(i - 1) * SD];
          const float* q = &qn[t * Dk];
          const float* k = &kn[t * Dk];
          const float* v = v_at(t);
          const float* go = dout + bt * Hv * Dv + h * Dv;
          const float decay = gates[t].decay, beta = gates[t].beta;
          // out = S_t^T q: dS += q go^T, dq += S_t go.
          for (int64_t r = 0; r < Dk; ++r) {
            float* dSrow = &dS[r * Dv];
            const float* Srow = Scur + r * Dv;
            float acc = 0.0f;
            for (int64_t j = 0; j < Dv; ++j) {
              dSrow[j] += q[r] * go[j];
              acc += Srow[j] * go[j];
            }
            dqn[t * Dk + r] += acc;
          }
          // u = (decay S_prev)^T k, d = beta (v - u).
          for (int64_t j = 0; j < Dv; ++j) u[j] = 0.0f;
          for (int64_t r = 0; r < Dk; ++r) {
            const float* Srow = Sprev + r * Dv;
            for (int64_t j = 0; j < Dv; ++j) u[j] += decay * Srow[j] * k[r];
          }
          for (int64_t j = 0; j < Dv; ++j) d[j] = beta * (v[j] - u[j]);
          // S_t = S' + k d^T: dd = dS^T k, dk += dS d.
          for (int64_t j = 0; j < Dv; ++j) dd[j] = 0.0f;
          for (int64_t r = 0; r < Dk; ++r) {
            const float* dSrow = &dS[r * Dv];
            float acc = 0.0f;
            for (int64_t j = 0; j < Dv; ++j) {
              dd[j] += dSrow[j] * k[r];
              acc += dSrow[j] * d[j];
            }
            dkn[t * Dk + r] += acc;
          }
          // d = beta (v - u): dbeta, dv, du = -beta dd.
          float dbeta = 0.0f;
          float* gv = dqkv + bt * W + 2 * Hk * Dk + h * Dv;
          for (int64_t j = 0; j < Dv; ++j) {
            dbeta += dd[j] * (v[j] - u[j]);
            gv[j] = beta * dd[j];
            dd[j] *= -beta;  // now du
          }
          // u = S'^T k: dS' = dS + k du^T, dk += S' du; S' = decay S_prev: ddecay = <dS',
          // S_prev>, then dS_prev = decay dS'.
          float ddecay = 0.0f;
          for (int64_t r = 0; r < Dk; ++r) {
            float* dSrow = &dS[r * Dv];
            const float* Srow = Sprev + r * Dv;
            float acc = 0.0f;
            for (int64_t j = 0; j < Dv; ++j) {
              dSrow[j] += k[r] * dd[j];
              acc += Srow[j] * dd[j];
              ddecay += dSrow[j] * Srow[j];
              dSrow[j] *= decay;
            }
            dkn[t * Dk + r] += decay * acc;
          }
          if (reset(t)) std::fill(dS.begin(), dS.end(), 0.0f);  // nothing flows to the last document
          // g = -exp(A_log) softplus(x), x = a + dt_bias; decay = exp(g).
          const float dg = ddecay * decay;
          const float x = a[bt * Hv + h] + dt_bias[h];
          const float dx = dg * -expA * (x > 20.0f ? 1.0f : sigmoid1(x));
          da[bt * Hv + h] = dx;
          acc_dt += dx;
          acc_A += dg * gates[t].g;
          db[bt * Hv + h] = dbeta * beta * (1.0f - beta);
        }
      }
      part_A[bi * Hv + h] = acc_A;
      part_dt[bi * Hv + h] = acc_dt;
    }
    // Through the l2norms (q~ = l2norm(q) scale): dx = r (dy - y (y . dy)), y = l2norm(x).
    for (int64_t t = 0; t < T; ++t) {
      float* row = dqkv + (bi * T + t) * W;
      for (const auto& [yn, dy, r, ys, dst] :
           {std::tuple{&qn[t * Dk], &dqn[t * Dk], rq[t], scale, row + kh * Dk},
            std::tuple{&kn[t * Dk], &dkn[t * Dk], rk[t], 1.0f, row + Hk * Dk + kh * Dk}}) {
        // y = yn / ys and dL/dy = dy ys.
        float dot = 0.0f;
        for (int64_t i = 0; i < Dk; ++i) dot += yn[i] * dy[i];  // = (y . dL/dy)
        for (int64_t i = 0; i < Dk; ++i) dst[i] = r * (dy[i] * ys - yn[i] / ys * dot);
      }
    }
  }
  for (int64_t h = 0; h < Hv; ++h) {
    for (int64_t bi = 0; bi < B; ++bi) {
      dA_log[h] += part_A[bi * Hv + h];
      ddt_bias[h] += part_dt[bi * Hv + h];
    }
  }
}

void CpuKernels::strided_copy(float* dst, const int64_t d[4], const float* src,
                              const int64_t s[4], int64_t R, int64_t G, int64_t W,
                              bool accumulate) const {
  const bool reduce = d[2] == 0;  // one output per (r, c): the groups summed, g ascending
#pragma omp parallel for schedule(static) num_threads(threads_for(R * G * W, kParallelMinElems))
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < W; ++c) {
      if (reduce) {
        float sum = 0.f;
        for (int64_t g = 0; g < G; ++g) sum += src[r * s[0] + s[1] + g * s[2] + c * s[3]];
        float& out = dst[r * d[0] + d[1] + c * d[3]];
        out = accumulate ? out + sum : sum;
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const float v = src[r * s[0] + s[1] + g * s[2] + c * s[3]];
        float& out = dst[r * d[0] + d[1] + g * d[2] + c * d[3]];
        out = accumulate ? out + v : v;
      }
    }
  }
}

// ---- mixture of experts ----

namespace {
// p = softmax(logits[0, E)) in fp32 (max subtracted, the sum in fp64), into p.
void moe_softmax(float* p, const float* logits, int64_t E) {
  float mx = logits[0];
  for (int64_t e = 1; e < E; ++e) mx = std::max(mx, logits[e]);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = std::exp(logits[e] - mx);
    sum += p[e];
  }
  const auto inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}
// The K largest of p[0, E) in descending order, ties to the lower index (strictly greater
// wins), into idx; their values into w (divided by their fp32 sum when normalize).
void moe_top_k(int32_t* idx, float* w, const float* p, int64_t E, int64_t K, bool normalize) {
  float sum = 0.f;
  for (int64_t j = 0; j < K; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    idx[j] = static_cast<int32_t>(best);
    w[j] = p[best];
    sum += w[j];
  }
  if (normalize) {
    for (int64_t j = 0; j < K; ++j) w[j] /= sum;
  }
}
}  // namespace

void CpuKernels::moe_router_forward(int32_t* idx, float* w, const float* logits, int64_t R,
                                    int64_t E, int64_t K, bool normalize) const {
#pragma omp parallel num_threads(threads_for(R * E, kParallelMinElems / 8))
  {
    std::vector<float> p(static_cast<std::size_t>(E));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      moe_softmax(p.data(), logits + r * E, E);
      moe_top_k(idx + r * K, w + r * K, p.data(), E, K, normalize);
    }
  }
}

void CpuKernels::moe_router_backward(float* dlogits, const float* dw, const float* logits,
                                     const int32_t* idx, int64_t R, int64_t E, int64_t K,
                                     bool normalize) const {
#pragma omp parallel num_threads(threads_for(R * E, kParallelMinElems / 8))
  {
    std::vector<float> p(static_cast<std::size_t>(E)), dp(static_cast<std::size_t>(E));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      moe_softmax(p.data(), logits + r * E, E);
      const int32_t* ix = idx + r * K;
      const float* d = dw + r * K;
      std::fill(dp.begin(), dp.end(), 0.f);
      if (normalize) {  // w_j = p_j / S: dp_j = (dw_j - sum_i w_i dw_i) / S
        float S = 0.f;
        for (int64_t j = 0; j < K; ++j) S += p[static_cast<std::size_t>(ix[j])];
        float wd = 0.f;
        for (int64_t j = 0; j < K; ++j) wd += p[static_cast<std::size_t>(ix[j])] / S * d[j];
        for (int64_t j = 0; j < K; ++j) dp[static_cast<std::size_t>(ix[j])] = (d[j] - wd) / S;
      } else {
        for (int64_t j = 0; j < K; ++j) dp[static_cast<std::size_t>(ix[j])] = d[j];
      }
      float s = 0.f;  // sum_e p_e dp_e (dp is 0 off the K selected)
      for (int64_t j = 0; j < K; ++j) {
        const auto e = static_cast<std::size_t>(ix[j]);
        s += p[e] * dp[e];
      }
      float* g = dlogits + r * E;
      for (int64_t e = 0; e < E; ++e) {
        g[e] = p[static_cast<std::size_t>(e)] * (dp[static_cast<std::size_t>(e)] - s);
      }
    }
  }
}

namespace {
float moe_sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
}  // namespace

void CpuKernels::moe_sigmoid_router_forward(int32_t* idx, float* w, const float* logits,
                                            const float* bias, int64_t R, int64_t E, int64_t K,
                                            int64_t n_group, int64_t topk_group, bool normalize,
                                            float scale) const {
  const int64_t per = E / n_group;
#pragma omp parallel num_threads(threads_for(R * E, kParallelMinElems / 8))
  {
    std::vector<float> s(static_cast<std::size_t>(E)), c(s.size()),
        group(static_cast<std::size_t>(n_group));
    std::vector<char> kept(group.size());
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t e = 0; e < E; ++e) {
        s[static_cast<std::size_t>(e)] = moe_sigmoid(logits[r * E + e]);
        c[static_cast<std::size_t>(e)] = s[static_cast<std::size_t>(e)] + bias[e];
      }
      if (n_group > 1) {  // each group's two largest choices summed; the best topk_group kept
        for (int64_t g = 0; g < n_group; ++g) {
          float a = -INFINITY, b = -INFINITY;
          for (int64_t e = g * per; e < (g + 1) * per; ++e) {
            const float v = c[static_cast<std::size_t>(e)];
            if (v > a) {
              b = a;
              a = v;
            } else if (v > b) {
              b = v;
            }
          }
          group[static_cast<std::size_t>(g)] = a + b;
        }
        std::fill(kept.begin(), kept.end(), 0);
        for (int64_t j = 0; j < topk_group; ++j) {
          int64_t best = -1;
          for (int64_t g = 0; g < n_group; ++g) {
            if (!kept[static_cast<std::size_t>(g)] &&
                (best < 0 || group[static_cast<std::size_t>(g)] >
                                 group[static_cast<std::size_t>(best)])) {
              best = g;
            }
          }
          kept[static_cast<std::size_t>(best)] = 1;
        }
        for (int64_t e = 0; e < E; ++e) {
          if (!kept[static_cast<std::size_t>(e / per)]) c[static_cast<std::size_t>(e)] = 0.f;
        }
      }
      int32_t* ix = idx + r * K;
      float* wr = w + r * K;
      moe_top_k(ix, wr, c.data(), E, K, false);  // the K largest choices, ties to the lower
      float sum = 0.f;  // the chosen experts' sigmoids (not their choices) weight them
      for (int64_t j = 0; j < K; ++j) {
        wr[j] = s[static_cast<std::size_t>(ix[j])];
        sum += wr[j];
      }
      const float denom = sum + 1e-20f;
      for (int64_t j = 0; j < K; ++j) wr[j] = (normalize ? wr[j] / denom : wr[j]) * scale;
    }
  }
}

void CpuKernels::moe_sigmoid_router_backward(float* dlogits, const float* dw, const float* logits,
                                             const int32_t* idx, int64_t R, int64_t E, int64_t K,
                                             bool normalize, float scale) const {
#pragma omp parallel for schedule(static) num_threads(threads_for(R * E, kParallelMinElems / 8))
  for (int64_t r = 0; r < R; ++r) {
    const int32_t* ix = idx + r * K;
    const float* d = dw + r * K;
    float* g = dlogits + r * E;
    std::fill(g, g + E, 0.f);
    float S = 0.f, sd = 0.f;  // S = sum_j s_j + 1e-20; sd = sum_j s_j d_j / S
    for (int64_t j = 0; j < K; ++j) S += moe_sigmoid(logits[r * E + ix[j]]);
    S += 1e-20f;
    for (int64_t j = 0; j < K; ++j) sd += moe_sigmoid(logits[r * E + ix[j]]) / S * d[j];
    for (int64_t j = 0; j < K; ++j) {
      const float s = moe_sigmoid(logits[r * E + ix[j]]);
      // w_j = scale s_j / S: d s_j = scale (d_j - sum_i s_i d_i / S) / S
      const float ds = normalize ? scale * (d[j] - sd) / S : scale * d[j];
      g[ix[j]] = ds * s * (1.f - s);
    }
  }
}

void CpuKernels::moe_router_prob_sums(float* psum, const float* logits, int64_t R,
                                      int64_t E) const {
  std::vector<float> p(static_cast<std::size_t>(E));
  std::vector<double> sum(static_cast<std::size_t>(E), 0.0);
  for (int64_t r = 0; r < R; ++r) {  // rows in order: independent of the thread count
    moe_softmax(p.data(), logits + r * E, E);
    for (std::size_t e = 0; e < p.size(); ++e) sum[e] += p[e];
  }
  for (int64_t e = 0; e < E; ++e) psum[e] += static_cast<float>(sum[static_cast<std::size_t>(e)]);
}

void CpuKernels::moe_aux_loss_backward(float* dlogits, const float* logits, const float* dprobs,
                                       int64_t R, int64_t E) const {
#pragma omp parallel num_threads(threads_for(R * E, kParallelMinElems / 8))
  {
    std::vector<float> p(static_cast<std::size_t>(E));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      moe_softmax(p.data(), logits + r * E, E);
      float s = 0.f;
      for (int64_t e = 0; e < E; ++e) s += p[static_cast<std::size_t>(e)] * dprobs[e];
      float* g = dlogits + r * E;
      for (int64_t e = 0; e < E; ++e) g[e] += p[static_cast<std::size_t>(e)] * (dprobs[e] - s);
    }
  }
}

void CpuKernels::moe_shared_gate_forward(float* out, const float* shared, const float* logit,
                                         int64_t R, int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float s = 1.f / (1.f + std::exp(-logit[r]));
    float* o = out + r * C;
    const float* x = shared + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] += s * x[c];
  }
}

void CpuKernels::moe_shared_gate_backward(float* dshared, float* dlogit, const float* dout,
                                          const float* shared, const float* logit, int64_t R,
                                          int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float s = 1.f / (1.f + std::exp(-logit[r]));
    const float* d = dout + r * C;
    const float* x = shared + r * C;
    float* g = dshared + r * C;
    double dot = 0.0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < C; ++c) {
      g[c] = s * d[c];
      dot += static_cast<double>(d[c]) * x[c];
    }
    dlogit[r] = static_cast<float>(dot) * s * (1.f - s);
  }
}

void CpuKernels::moe_combine_forward(float* out, const float* rows, const float* w,
                                     const int32_t* slot, int64_t R, int64_t K,
                                     int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * K * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* o = out + r * C;
    for (int64_t j = 0; j < K; ++j) {
      const float a = w ? w[r * K + j] : 1.f;
      const float* x = rows + static_cast<int64_t>(slot[r * K + j]) * C;
      if (j == 0) {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = a * x[c];
      } else {
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] += a * x[c];
      }
    }
  }
}

void CpuKernels::moe_combine_backward(float* drows, float* dw, const float* dout,
                                      const float* rows, const float* w, const int32_t* slot,
                                      int64_t R, int64_t K, int64_t C) const {
#pragma omp parallel for num_threads(threads_for(R * K * C, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* d = dout + r * C;
    for (int64_t j = 0; j < K; ++j) {
      const int64_t row = static_cast<int64_t>(slot[r * K + j]) * C;
      const float a = w[r * K + j];
      const float* x = rows + row;
      float* g = drows + row;
      double dot = 0.0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < C; ++c) {
        g[c] = a * d[c];
        dot += static_cast<double>(d[c]) * x[c];
      }
      dw[r * K + j] = static_cast<float>(dot);
    }
  }
}

void CpuKernels::swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                                 const float* up, int64_t n) const {
  // Each 8-lane group's gate, up and dout are loaded before its dgate, dup are stored, so
  // dgate may be gate or dout and dup may be up.
  auto step = [&](int64_t i, int64_t m) {
    const bool full = m == 8;
    const f8 g = full ? load8(gate + i) : load_partial(gate + i, m, 0.0f);
    const f8 u = full ? load8(up + i) : load_partial(up + i, m, 0.0f);
    const f8 d = full ? load8(dout + i) : load_partial(dout + i, m, 0.0f);
    const f8 s = sigmoid8(g);
    const f8 silu = g * s;
    const f8 dg = d * u * (s * (1.0f + g * (1.0f - s)));
    const f8 du = d * silu;
    if (full) {
      store8(dgate + i, dg);
      store8(dup + i, du);
    } else {
      store_partial(dgate + i, dg, m);
      store_partial(dup + i, du, m);
    }
  };
  const int64_t nv = n / 8;
#pragma omp parallel for num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t v = 0; v < nv; ++v) step(8 * v, 8);
  if (const int64_t rem = n - 8 * nv; rem > 0) step(8 * nv, rem);
}

void CpuKernels::position_bias_forward(float* bias, const float* table, const int32_t* buckets,
                                       int64_t H, int64_t Tq, int64_t Tk) const {
  // bias [H,P]: bias[h,o] = table[buckets[o], h], P = relative_positions(Tq, Tk).
  const int64_t n = relative_positions(Tq, Tk);
#pragma omp parallel for num_threads(threads_for(H * n, kParallelMinElems)) schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    float* o = bias + h * n;
    for (int64_t r = 0; r < n; ++r) o[r] = table[static_cast<int64_t>(buckets[r]) * H + h];
  }
}

void CpuKernels::position_bias_backward(float* dtable, const float* dbias, const int32_t* buckets,
                                        int64_t NB, int64_t H, int64_t Tq, int64_t Tk) const {
  // Per head (one thread each): every bucket's sum over the relative positions o ascending,
  // in double, added to dtable once. Independent of the thread count.
  const int64_t n = relative_positions(Tq, Tk);
#pragma omp parallel for num_threads(threads_for(H * n, kParallelMinElems)) schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> acc(static_cast<std::size_t>(NB), 0.0);
    const float* d = dbias + h * n;
    for (int64_t r = 0; r < n; ++r) acc[static_cast<std::size_t>(buckets[r])] += d[r];
    for (int64_t b = 0; b < NB; ++b) dtable[b * H + h] += static_cast<float>(acc[b]);
  }
}

// ---------------------------------------------------------------------------------------
// attention: FlashAttention-2 (Dao 2023, Algorithms 1 and 2), blocked so that no Tq x Tk
// matrix exists (see fsdp/backend/kernels.hpp).
//
// Forward, per (b, h, tile of kAttnQTile queries), one OpenMP iteration each: for each tile
// of kAttnKTile keys (causal: only keys j < the query tile's end), S = scale Q_i K_j^T + bias with
// masked scores -inf; m' = max(m, rowmax S), P = exp(S - m') (masked: exactly 0),
// l = l exp(m - m') + rowsum P, O = O exp(m - m') + P V_j. Then O /= l, lse = m + log l.
// Backward, per (b, h): for each query tile, D_i = rowsum(dO_i * O_i), and for each key tile
// P = exp(S - lse) recomputed, dP = dO_i V_j^T, dS = P (dP - D_i), dV_j += P^T dO_i,
// dK_j += scale dS^T Q_i, dQ_i += scale dS K_j (dQ_i in a tile buffer, written once), and,
// when dbias is wanted, dS summed along its diagonals into a partial row of (b, h) (bias
// and dbias are [H, Tq + Tk - 1] by relative position j - i + Tq - 1). A thread owns a whole
// (b, key/value head) (dK, dV accumulate over query tiles and over the group's query heads,
// ascending); after the parallel region dbias[h] += the partial rows of h summed over b
// ascending. So results do not depend on the thread count. Grouped-query attention
// (Hkv < H) reads key/value head h / (H/Hkv). GEMMs on tiles are single-threaded OpenBLAS
// calls.

namespace {

// Tile sizes. 256 keys rather than 64: fewer, larger sgemm calls (OpenBLAS packs and sets up
// per call), for 2 x 64 KiB of score tiles per thread. Measured with tools/bench_attention at
// 2 threads, 64 x 256 was faster than 64 x 64 at every shape (forward 4-17%, backward 1-16%;
// docs/benchmarks.md, issue 20).
constexpr int64_t kAttnQTile = 64;   // queries per tile
constexpr int64_t kAttnKTile = 256;  // keys per tile (row stride of the score tiles)

// C[M,N] (row stride ldc) = alpha op(A) op(B) + beta C on the calling thread; K == 0 gives
// beta C (0 when beta == 0).
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) {
      float* c = C + m * ldc;
      for (int64_t n = 0; n < N; ++n) c[n] = beta == 0.0f ? 0.0f : beta * c[n];
    }
    return;
  }
  sgemm1(ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
         static_cast<int>(lda), B, static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

// Key/value heads of p (Hkv, 0 meaning H).
inline int64_t kv_heads(const AttentionProblem& p) { return p.Hkv == 0 ? p.H : p.Hkv; }

// Returns the group size H / Hkv (query heads per key/value head; 1 when H == 0).
int64_t check_attention_problem(const AttentionProblem& p) {
  const int64_t hkv = kv_heads(p);
  const bool bad = p.B < 0 || p.Tq < 0 || p.Tk < 0 || p.H < 0 || p.D < 0 || p.Tq > INT_MAX ||
                   p.Tk > INT_MAX || p.ldq > INT_MAX || p.ldk > INT_MAX || p.ldv > INT_MAX ||
                   p.ldo > INT_MAX || p.H * p.D > std::min(p.ldq, p.ldo) ||
                   (p.H > 0 && (hkv <= 0 || p.H % hkv != 0)) ||
                   hkv * p.D > std::min(p.ldk, p.ldv) || p.H * p.D > INT_MAX ||
                   (p.softcap > 0.0f && p.bias);  // (dbias would need dS before the cap)
  if (bad) {
    throw Error("cpu backend: attention: bad shape B=" + std::to_string(p.B) +
                " Tq=" + std::to_string(p.Tq) + " Tk=" + std::to_string(p.Tk) +
                " H=" + std::to_string(p.H) + " Hkv=" + std::to_string(hkv) +
                " D=" + std::to_string(p.D));
  }
  return p.H > 0 ? p.H / hkv : 1;
}

// Keys [key_begin, key_end) that query tile [i0, i0 + rows) of row b may see: causal, up to
// the tile's last query; with a sliding window or a document mask, from its first query's
// first key on (document starts are nondecreasing along a row).
inline int64_t key_end(const AttentionProblem& p, int64_t i0, int64_t rows) {
  return p.causal ? std::min(p.Tk, i0 + rows) : p.Tk;
}
inline int64_t key_begin(const AttentionProblem& p, int64_t b, int64_t i0) {
  int64_t j = p.window > 0 ? std::max<int64_t>(0, i0 - p.window + 1) : 0;
  if (p.doc_start) j = std::max<int64_t>(j, p.doc_start[b * p.Tq + i0]);
  return j;
}

// s[r, c] (row stride kAttnKTile) = the score of query i0 + r against key j0 + c of head h of
// batch b: scale q.k (soft-capped: softcap tanh(scale q.k / softcap)) + bias, or -inf where
// the key is masked. qh, kh: the head's first rows. With a soft-cap and `dcap` (same layout),
// dcap[r, c] = the cap's derivative 1 - tanh^2 (backward's dS factor).
void score_tile(const AttentionProblem& p, const float* qh, const float* kh, int64_t b, int64_t h,
                int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* s,
                float* dcap = nullptr) {
  tile_gemm(false, true, rows, cols, p.D, p.scale, qh + i0 * p.ldq, p.ldq, kh + j0 * p.ldk,
            p.ldk, 0.0f, s, kAttnKTile);
  const float ninf = -std::numeric_limits<float>::infinity();
  const int32_t* km = p.key_mask ? p.key_mask + b * p.Tk + j0 : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * kAttnKTile;
    const int64_t i = i0 + r;
    if (p.softcap > 0.0f) {
      const float inv = 1.0f / p.softcap;
      float* drow = dcap ? dcap + r * kAttnKTile : nullptr;
      for (int64_t c = 0; c < cols; ++c) {
        const float th = std::tanh(row[c] * inv);
        row[c] = p.softcap * th;
        if (drow) drow[c] = 1.0f - th * th;
      }
    }
    if (p.bias) {  // [H,P] by relative position: keys j0.. of query i are contiguous
      const float* br = p.bias + h * relative_positions(p.Tq, p.Tk) + (j0 - i + p.Tq - 1);
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) row[c] += br[c];
    }
    if (km) {
      for (int64_t c = 0; c < cols; ++c) {
        if (km[c] == 0) row[c] = ninf;
      }
    }
    if (p.causal) {
      for (int64_t c = std::max<int64_t>(0, i + 1 - j0); c < cols; ++c) row[c] = ninf;
    }
    if (p.window > 0) {  // keys j <= i - window: the columns before i - window + 1 - j0
      const int64_t end = std::min<int64_t>(cols, i - p.window + 1 - j0);
      for (int64_t c = 0; c < end; ++c) row[c] = ninf;
    }
    if (p.doc_start) {  // keys of earlier documents: the columns before doc_start - j0
      const int64_t end = std::min<int64_t>(cols, p.doc_start[b * p.Tq + i] - j0);
      for (int64_t c = 0; c < end; ++c) row[c] = ninf;
    }
  }
}

// x[0, n) = 0 with vector stores (a memset call per short row costs more than the stores).
inline void zero_row(float* x, int64_t n) {
  int64_t e = 0;
  for (; e + 8 <= n; e += 8) store8(x + e, f8{});
  for (; e < n; ++e) x[e] = 0.0f;
}

// Columns [0, n) of a score tile row that the causal mask leaves (query i, keys from j0).
inline int64_t visible_cols(const AttentionProblem& p, int64_t i, int64_t j0, int64_t cols) {
  return p.causal ? std::clamp<int64_t>(i + 1 - j0, 0, cols) : cols;
}

// x[j] = exp(x[j] - shift) for j < n, exactly 0 where x[j] == -inf; returns the sum of the
// new values (fp32, 8 lanes then a fixed tree).
inline float exp_masked_inplace(float* x, int64_t n, float shift) {
  const f8 ninf = f8{} - std::numeric_limits<float>::infinity();
  f8 acc{};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const f8 v = load8(x + j);
    const f8 e = v == ninf ? f8{} : vexp(v - shift);
    store8(x + j, e);
    acc += e;
  }
  if (j < n) {
    const f8 v = load_partial(x + j, n - j, -std::numeric_limits<float>::infinity());
    const f8 e = v == ninf ? f8{} : vexp(v - shift);
    store_partial(x + j, e, n - j);
    acc += e;
  }
  return hsum(acc);
}

}  // namespace

void CpuKernels::attention_forward(const AttentionProblem& p, const float* q, const float* k,
                                   const float* v, float* out, float* lse) const {
  const int64_t group = check_attention_problem(p);
  const int64_t D = p.D, nqt = (p.Tq + kAttnQTile - 1) / kAttnQTile, tiles = p.B * p.H * nqt;
  const float ninf = -std::numeric_limits<float>::infinity();
  const int nt = threads_for(p.B * p.H * p.Tq * std::max<int64_t>(p.Tk, 1), 4096);
#pragma omp parallel num_threads(nt)
  {
    // Per thread: scores [QT, KT], the output accumulator [QT, D], row max m and sum l.
    std::vector<float> ws(static_cast<std::size_t>(kAttnQTile * (kAttnKTile + D + 2)));
    float* s = ws.data();
    float* o = s + kAttnQTile * kAttnKTile;
    float* m = o + kAttnQTile * D;
    float* l = m + kAttnQTile;
    // Dynamic: causal tiles late in a head have more keys (a static round robin can hand one
    // thread every heavy tile); the results do not depend on the schedule.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t bh = t / nqt, b = bh / p.H, h = bh % p.H;
      const int64_t i0 = (t % nqt) * kAttnQTile, rows = std::min(kAttnQTile, p.Tq - i0);
      const float* qh = q + b * p.Tq * p.ldq + h * D;
      const float* kh = k + b * p.Tk * p.ldk + (h / group) * D;
      const float* vh = v + b * p.Tk * p.ldv + (h / group) * D;
      std::fill(o, o + rows * D, 0.0f);
      std::fill(m, m + rows, ninf);
      std::fill(l, l + rows, 0.0f);
      const int64_t jend = key_end(p, i0, rows);
      for (int64_t j0 = key_begin(p, b, i0); j0 < jend; j0 += kAttnKTile) {
        const int64_t cols = std::min(kAttnKTile, jend - j0);
        score_tile(p, qh, kh, b, h, i0, rows, j0, cols, s);
        for (int64_t r = 0; r < rows; ++r) {
          float* row = s + r * kAttnKTile;
          const int64_t n = visible_cols(p, i0 + r, j0, cols);  // row[n, cols) is -inf
          const float mn = std::max(m[r], row_max(row, n));
          std::fill(row + n, row + cols, 0.0f);
          if (mn == ninf) {  // every key so far masked: P = 0
            std::fill(row, row + n, 0.0f);
            continue;
          }
          const float alpha = m[r] == ninf ? 0.0f : std::exp(m[r] - mn);
          l[r] = l[r] * alpha + exp_masked_inplace(row, n, mn);
          if (alpha != 1.0f && m[r] != ninf) {  // (O is still 0 while m = -inf)
            float* orow = o + r * D;
#pragma omp simd
            for (int64_t e = 0; e < D; ++e) orow[e] *= alpha;
          }
          m[r] = mn;
        }
        // O[rows, D] += P[rows, cols] @ V[j0 : j0 + cols]
        tile_gemm(false, false, rows, D, cols, 1.0f, s, kAttnKTile, vh + j0 * p.ldv, p.ldv, 1.0f,
                  o, D);
      }
      float* lrow = lse + bh * p.Tq + i0;
      for (int64_t r = 0; r < rows; ++r) {
        float* dst = out + (b * p.Tq + i0 + r) * p.ldo + h * D;
        if (m[r] == ninf) {  // no unmasked key: output 0, lse +inf
          std::fill(dst, dst + D, 0.0f);
          lrow[r] = std::numeric_limits<float>::infinity();
          continue;
        }
        const float inv = 1.0f / l[r];
        const float* orow = o + r * D;
#pragma omp simd
        for (int64_t e = 0; e < D; ++e) dst[e] = orow[e] * inv;
        lrow[r] = m[r] + std::log(l[r]);
      }
    }
  }
}

void CpuKernels::attention_backward(const AttentionProblem& p, const float* q, const float* k,
                                    const float* v, const float* out, const float* lse,
                                    const float* dout, float* dq, float* dk, float* dv,
                                    float* dbias) const {
  const int64_t group = check_attention_problem(p);
  const int64_t D = p.D, hkv = kv_heads(p);
  if (p.H == 0) {  // no query head reads the key/value heads: zero gradients
    for (int64_t bj = 0; bj < p.B * p.Tk; ++bj) {
      zero_row(dk + bj * p.ldk, hkv * D);
      zero_row(dv + bj * p.ldv, hkv * D);
    }
    return;
  }
  // dbias: fp32 partial rows [B,H,P] (P = relative_positions(Tq, Tk)), one per (b, h),
  // written by that head alone, then summed over b into dbias below.
  const int64_t P = relative_positions(p.Tq, p.Tk);
  std::vector<float> partial(dbias ? static_cast<std::size_t>(p.B * p.H * P) : 0);
  // One (b, h): dk, dv of its key/value head g = h / group zeroed by the group's first head
  // and accumulated over query tiles (and the group's heads, called in ascending order by the
  // same thread), dq written per query tile; with dbias, partial row (b, h) zeroed, then
  // dS added along its diagonals (tiles in order, rows ascending).
  // ws: P [QT, KT], dP / dS [QT, KT], the dQ tile [QT, D], D_i [QT], and with a soft-cap its
  // derivative [QT, KT].
  const bool capped = p.softcap > 0.0f;
  auto head = [&](int64_t b, int64_t h, float* ws) {
    const int64_t g = h / group;
    float* s = ws;
    float* ds = s + kAttnQTile * kAttnKTile;
    float* dqt = ds + kAttnQTile * kAttnKTile;
    float* di = dqt + kAttnQTile * D;
    float* dcap = capped ? di + kAttnQTile : nullptr;
    const float* qh = q + b * p.Tq * p.ldq + h * D;
    const float* kh = k + b * p.Tk * p.ldk + g * D;
    const float* vh = v + b * p.Tk * p.ldv + g * D;
    const float* oh = out + b * p.Tq * p.ldo + h * D;
    const float* doh = dout + b * p.Tq * p.ldo + h * D;
    float* dqh = dq + b * p.Tq * p.ldq + h * D;
    float* dkh = dk + b * p.Tk * p.ldk + g * D;
    float* dvh = dv + b * p.Tk * p.ldv + g * D;
    const float* lh = lse + (b * p.H + h) * p.Tq;
    float* prow = dbias ? partial.data() + (b * p.H + h) * P : nullptr;
    if (prow) std::fill(prow, prow + P, 0.0f);
    if (h % group == 0) {
      for (int64_t j = 0; j < p.Tk; ++j) {
        zero_row(dkh + j * p.ldk, D);
        zero_row(dvh + j * p.ldv, D);
      }
    }
    for (int64_t i0 = 0; i0 < p.Tq; i0 += kAttnQTile) {
      const int64_t rows = std::min(kAttnQTile, p.Tq - i0);
      for (int64_t r = 0; r < rows; ++r) {
        const float* o_r = oh + (i0 + r) * p.ldo;
        const float* d_r = doh + (i0 + r) * p.ldo;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t e = 0; e < D; ++e) acc += d_r[e] * o_r[e];
        di[r] = acc;
      }
      std::fill(dqt, dqt + rows * D, 0.0f);
      const int64_t jend = key_end(p, i0, rows);
      for (int64_t j0 = key_begin(p, b, i0); j0 < jend; j0 += kAttnKTile) {
        const int64_t cols = std::min(kAttnKTile, jend - j0);
        score_tile(p, qh, kh, b, h, i0, rows, j0, cols, s, dcap);
        for (int64_t r = 0; r < rows; ++r) {  // P (0 where masked)
          float* row = s + r * kAttnKTile;
          const int64_t n = visible_cols(p, i0 + r, j0, cols);
          exp_masked_inplace(row, n, lh[i0 + r]);
          std::fill(row + n, row + cols, 0.0f);
        }
        // dP[rows, cols] = dO_i @ V_j^T, then dS = P (dP - D_i) in place
        tile_gemm(false, true, rows, cols, D, 1.0f, doh + i0 * p.ldo, p.ldo, vh + j0 * p.ldv,
                  p.ldv, 0.0f, ds, kAttnKTile);
        for (int64_t r = 0; r < rows; ++r) {
          float* dsr = ds + r * kAttnKTile;
          const float* pr = s + r * kAttnKTile;
          const float d = di[r];
#pragma omp simd
          for (int64_t c = 0; c < cols; ++c) dsr[c] = pr[c] * (dsr[c] - d);
          if (capped) {  // through the cap: d (scale q.k) = dS (1 - tanh^2)
            const float* cr = dcap + r * kAttnKTile;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) dsr[c] *= cr[c];
          }
        }
        // dV_j += P^T dO_i; dK_j += scale dS^T Q_i; dQ_i += scale dS K_j
        tile_gemm(true, false, cols, D, rows, 1.0f, s, kAttnKTile, doh + i0 * p.ldo, p.ldo, 1.0f,
                  dvh + j0 * p.ldv, p.ldv);
        tile_gemm(true, false, cols, D, rows, p.scale, ds, kAttnKTile, qh + i0 * p.ldq, p.ldq,
                  1.0f, dkh + j0 * p.ldk, p.ldk);
        tile_gemm(false, false, rows, D, cols, p.scale, ds, kAttnKTile, kh + j0 * p.ldk, p.ldk,
                  1.0f, dqt, D);
        if (prow) {  // dS[r, c] of (i, j) adds into prow[j - i + Tq - 1]: contiguous in c
          for (int64_t r = 0; r < rows; ++r) {
            float* g = prow + (j0 - (i0 + r) + p.Tq - 1);
            const float* dsr = ds + r * kAttnKTile;
#pragma omp simd
            for (int64_t c = 0; c < cols; ++c) g[c] += dsr[c];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::copy(dqt + r * D, dqt + (r + 1) * D, dqh + (i0 + r) * p.ldq);
      }
    }
  };
  const std::size_t ws_floats =
      static_cast<std::size_t>(kAttnQTile * ((capped ? 3 : 2) * kAttnKTile + D + 1));
  const int nt = threads_for(p.B * p.H * p.Tq * std::max<int64_t>(p.Tk, 1), 4096);
  // A thread per (b, key/value head), its group's query heads in ascending order.
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> ws(ws_floats);
#pragma omp for schedule(static)
    for (int64_t bg = 0; bg < p.B * hkv; ++bg) {
      const int64_t b = bg / hkv, g = bg % hkv;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) head(b, h, ws.data());
    }
  }
  if (!dbias || p.B == 0) return;
  // dbias[h,o] += the partial rows (b, h) summed over b ascending in fp32 (one (h, o) each).
  const int64_t HP = p.H * P;
#pragma omp parallel for num_threads(threads_for(p.B * HP, kParallelMinElems)) schedule(static)
  for (int64_t ho = 0; ho < HP; ++ho) {
    float acc = 0.0f;
    for (int64_t b = 0; b < p.B; ++b) acc += partial[static_cast<std::size_t>(b * HP + ho)];
    dbias[ho] += acc;
  }
}

// ---------------------------------------------------------------------------------------
// cross-entropy

namespace {
void check_targets(const int32_t* targets, int64_t R, int64_t V) {
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] == kIgnoreTarget) continue;
    if (targets[r] < 0 || targets[r] >= V) {
      throw Error("cpu backend: cross_entropy: target " + std::to_string(targets[r]) +
                  " at row " + std::to_string(r) + " (expected 0 <= target < " +
                  std::to_string(V) + ", or " + std::to_string(kIgnoreTarget) + " to skip the row)");
    }
  }
}
double sum_in_order(const std::vector<double>& v) {
  double s = 0.0;
  for (double x : v) s += x;
  return s;
}
// c[j] = softcap * tanh(x[j] / softcap) for j < n (Gemma 2's final_logit_softcapping).
void softcap_row(const float* x, float* c, int64_t n, float softcap) {
  const float inv = 1.0f / softcap;
  for (int64_t j = 0; j < n; ++j) c[j] = softcap * std::tanh(x[j] * inv);
}
}  // namespace

double CpuKernels::cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t R,
                                                  int64_t V, int64_t ld, float grad_scale,
                                                  float softcap) const {
  check_targets(targets, R, V);
  std::vector<double> row_loss(static_cast<std::size_t>(R));
#pragma omp parallel num_threads(threads_for(R * ld, kParallelMinElems))
  {
    // With a soft-cap: the capped row c, kept for its derivative 1 - (c / softcap)^2.
    std::vector<float> capped(softcap > 0.0f ? static_cast<std::size_t>(V) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      float* x = logits + r * ld;
      std::fill(x + V, x + ld, 0.0f);     // padding columns: no class, zero gradient
      if (targets[r] == kIgnoreTarget) {  // no loss, zero gradient row
        row_loss[static_cast<std::size_t>(r)] = 0.0;
        std::fill(x, x + V, 0.0f);
        continue;
      }
      const int64_t t = targets[r];
      if (softcap > 0.0f) {
        softcap_row(x, capped.data(), V, softcap);
        std::copy(capped.begin(), capped.end(), x);
      }
      const float xt = x[t];
      const float mx = row_max(x, V);
      const double sum = exp_shift_inplace(x, V, mx);
      row_loss[static_cast<std::size_t>(r)] =
          static_cast<double>(mx) + std::log(sum) - static_cast<double>(xt);
      const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) x[j] *= f;
      x[t] -= grad_scale;
      if (softcap > 0.0f) {  // d logit = d capped * (1 - tanh^2)
        const float inv = 1.0f / softcap;
        for (int64_t j = 0; j < V; ++j) {
          const float th = capped[static_cast<std::size_t>(j)] * inv;
          x[j] *= 1.0f - th * th;
        }
      }
    }
  }
  return sum_in_order(row_loss);
}

double CpuKernels::cross_entropy_forward(const float* logits, const int32_t* targets, int64_t R,
                                         int64_t V, int64_t ld, float softcap) const {
  check_targets(targets, R, V);
  std::vector<double> row_loss(static_cast<std::size_t>(R));
#pragma omp parallel num_threads(threads_for(R * V, kParallelMinElems))
  {
    std::vector<float> capped(softcap > 0.0f ? static_cast<std::size_t>(V) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const float* x = logits + r * ld;
      if (targets[r] == kIgnoreTarget) {
        row_loss[static_cast<std::size_t>(r)] = 0.0;
        continue;
      }
      if (softcap > 0.0f) {
        softcap_row(x, capped.data(), V, softcap);
        x = capped.data();
      }
      const float mx = row_max(x, V);
      const double sum = exp_shift_sum(x, V, mx);
      row_loss[static_cast<std::size_t>(r)] =
          static_cast<double>(mx) + std::log(sum) - static_cast<double>(x[targets[r]]);
    }
  }
  return sum_in_order(row_loss);
}

// ---------------------------------------------------------------------------------------
// optimizers: the element order of operations follows torch.optim (single-tensor path).

namespace {
// The optimizer passes are bound by memory bandwidth (AdamW: 16 bytes read and 12 written
// per element, plus 2 for a param_dtype copy, for ~10 flops), so they are one pass per shard
// on all threads (DeepSpeed's cpu_adam_impl.cpp is the model): each thread takes a static
// share starting at a multiple of kOptimGrain elements (whole 64-byte lines of the fp32 and
// 16-bit arrays: no line is written by two threads), then its weight-decay pieces; the
// update loop is vectorised (AVX2 in Release builds; cpu_kernels.cpp is built with
// -fno-math-errno so its sqrt needs no libm fallback and does not block that); the pieces
// run in tiles of kOptimTile elements (8 KiB of fp32: L1), the update over a tile and then
// the tile's param_dtype copy, if any, from the param it just stored, so the update loop
// keeps its form and nothing is read from memory twice. Every element is computed alone, so
// the results do not depend on the thread count or on the tiling.
constexpr int64_t kOptimGrain = 64;
constexpr int64_t kOptimTile = 2048;

// body(lo, hi, rate) over the weight-decay pieces of [0, n), in one parallel region of `nt`
// threads: each thread takes its static share of the elements, then its pieces.
template <class Body>
void decay_pieces_parallel(int64_t n, int nt, const WeightDecay& wd, Body&& body) {
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t grains = (n + kOptimGrain - 1) / kOptimGrain;
    const int64_t lo = std::min(n, grains * t / T * kOptimGrain);
    const int64_t hi = std::min(n, grains * (t + 1) / T * kOptimGrain);
    wd.for_each_piece(lo, hi, body);
  }
}

// fsdp::f32_to_f16 (fsdp/core/dtype.hpp) without branches, so loops of it vectorise: the same
// bits for every one of the 2^32 inputs (checked exhaustively when it was written; tests/
// test_device_runtime.cpp checks a sweep). Subnormal results are rounded to nearest even in
// integers: m = (mantissa + half - 1 + lowest kept bit) >> shift.
inline uint16_t f32_to_f16_simd(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  uint32_t r = a - 0x38000000u;  // normal: exponent rebiased 127 -> 15, mantissa rounded
  r += 0xfffu + ((r >> 13) & 1u);
  const uint32_t normal = r >> 13;
  // below 2^-14: m * 2^-24 with m = (1.mantissa * 2^23) / 2^(126 - e) rounded; a shift of 25
  // or more gives 0, as 31 does (and keeps the shift defined)
  const uint32_t e = a >> 23;
  // (e >= 126: the normal branch below; 31 keeps 1u << (s - 1) defined)
  const uint32_t s = e < 126u && 126u - e < 31u ? 126u - e : 31u;
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const uint32_t sub = (mant + (1u << (s - 1u)) - 1u + ((mant >> s) & 1u)) >> s;
  const uint32_t nan = a > 0x7f800000u ? 0x7e00u | ((a >> 13) & 0x3ffu) : 0x7c00u;
  const uint32_t res = a >= 0x7f800000u ? nan
                       : a >= 0x477ff000u ? 0x7c00u  // >= 65520 -> inf
                       : a < 0x38800000u  ? sub
                                          : normal;
  return static_cast<uint16_t>(sign | res);
}

// copy[i] = src[i] rounded to `to` (bf16 or fp16) for i in [lo, hi): from_f32's conversions.
void write_copy(void* copy, DType to, const float* src, int64_t lo, int64_t hi) {
  auto* d = static_cast<uint16_t*>(copy);
  if (to == DType::bf16) {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) d[i] = f32_to_bf16(src[i]);
  } else {
#pragma omp simd
    for (int64_t i = lo; i < hi; ++i) d[i] = f32_to_f16_simd(src[i]);
  }
}

// tile(a, b) over [lo, hi) in tiles of kOptimTile elements.
template <class Tile>
void for_tiles(int64_t lo, int64_t hi, const Tile& tile) {
  for (int64_t a = lo; a < hi; a += kOptimTile) tile(a, std::min(hi, a + kOptimTile));
}

void check_copy_dtype(const char* kernel, const void* copy, DType to) {
  if (copy != nullptr && to != DType::bf16 && to != DType::f16) {
    throw Error(std::string("cpu backend: ") + kernel + ": compute_copy is " +
                std::string(to_string(to)) + " (expected bf16 or fp16)");
  }
}
}  // namespace

void CpuKernels::adamw_update(float* param, const float* grad, float* exp_avg,
                              float* exp_avg_sq, int64_t n, float lr, float beta1, float beta2,
                              float eps, const WeightDecay& weight_decay, int64_t step,
                              void* copy, DType copy_dtype, float grad_scale) const {
  if (step < 1) {
    throw Error("cpu backend: adamw_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  check_copy_dtype("adamw_update", copy, copy_dtype);
  // fsdp/backend/optimizer_math.hpp: the scalars and the element update, shared with the CUDA
  // kernel so that the two agree bit for bit. Only `decay` depends on the rate: exactly 1
  // where the rate is 0.
  const AdamWCoefficients c = adamw_coefficients(lr, beta1, beta2, eps, weight_decay.rate, step);
  decay_pieces_parallel(n, threads_for(n, kParallelMinElems), weight_decay,
                        [&](int64_t lo, int64_t hi, float rate) {
    const float decay = rate == 0.f ? 1.f : c.decay, s = grad_scale;
    for_tiles(lo, hi, [&](int64_t a, int64_t b) {
#pragma omp simd
      for (int64_t i = a; i < b; ++i) {
        adamw_element(param[i], grad[i] * s, exp_avg[i], exp_avg_sq[i], decay, c);
      }
      if (copy != nullptr) write_copy(copy, copy_dtype, param, a, b);
    });
  });
}

void CpuKernels::sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n,
                            float lr, float momentum, const WeightDecay& weight_decay,
                            int64_t step, void* copy, DType copy_dtype, float grad_scale) const {
  if (step < 1) {
    throw Error("cpu backend: sgd_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  check_copy_dtype("sgd_update", copy, copy_dtype);
  const int nt = threads_for(n, kParallelMinElems);
  const bool first = step == 1;
  decay_pieces_parallel(n, nt, weight_decay, [&](int64_t lo, int64_t hi, float wd) {
    for_tiles(lo, hi, [&](int64_t a, int64_t b) {
      // fsdp/backend/optimizer_math.hpp, shared with the CUDA kernel. torch keeps no buffer
      // without momentum: momentum_buf is then not touched (may be null). The scalars are
      // copied first: read through the lambda's captures, GCC does not vectorise the momentum
      // loop.
      const float r = lr, mu = momentum, w = wd, s = grad_scale;
      const bool f = first;
      if (mu == 0.0f) {
        float unused = 0.0f;
#pragma omp simd
        for (int64_t i = a; i < b; ++i) {
          sgd_element(param[i], grad[i] * s, unused, r, mu, w, f, false);
        }
      } else {
#pragma omp simd
        for (int64_t i = a; i < b; ++i) {
          sgd_element(param[i], grad[i] * s, momentum_buf[i], r, mu, w, f, true);
        }
      }
      if (copy != nullptr) write_copy(copy, copy_dtype, param, a, b);
    });
  });
}

// ---------------------------------------------------------------------------------------
// loss scaling

bool CpuKernels::unscale_and_check(float* x, float inv_scale, int64_t n) const {
  // Non-finite test on the exponent bits (all ones: inf or NaN), so the loop vectorises.
  int bad = 0;
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static) \
    reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    bad |= (std::bit_cast<uint32_t>(x[i]) & 0x7f800000u) == 0x7f800000u;
    x[i] *= inv_scale;
  }
  return bad != 0;
}

// ---------------------------------------------------------------------------------------
// conversions

namespace {
[[noreturn]] void bad_conversion(DType from, DType to) {
  throw Error("cpu backend: cannot convert " + std::string(to_string(from)) + " to " +
              std::string(to_string(to)) + " (expected fp32, fp64, bf16 or fp16)");
}
// d rounded to fp32 "to odd": truncated toward zero, lowest bit set if inexact. Rounding that
// to nearest even in a format with at least 2 fewer significant bits (bf16, fp16; also in
// their subnormal ranges) gives d correctly rounded, with no double-rounding error
// (Boldo & Melquiond 2008). Overflow gives FLT_MAX | 1, which rounds on to infinity.
inline float f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || std::isnan(d)) return f;
  if (std::abs(static_cast<double>(f)) > std::abs(d)) f = std::nextafter(f, 0.0f);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) | 1u);
}
// dst[i] = conv(src[i]) over [0, n), on nt threads. `conv` is a lambda (its own type, so it
// is inlined and the loop vectorises; a function pointer would be called per element).
template <typename D, typename S, typename F>
void convert_loop(D* dst, const S* src, int64_t n, int nt, F conv) {
#pragma omp parallel for simd num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = conv(src[i]);
}
}  // namespace

void CpuKernels::to_f32(float* dst, const void* src, DType from, int64_t n) const {
  const int nt = threads_for(n, kParallelMinElems);
  switch (from) {
    case DType::f32:
      if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::bf16:
      convert_loop(dst, static_cast<const uint16_t*>(src), n, nt,
                   [](uint16_t h) { return bf16_to_f32(h); });
      return;
    case DType::f16:
      convert_loop(dst, static_cast<const uint16_t*>(src), n, nt,
                   [](uint16_t h) { return f16_to_f32(h); });
      return;
    default:
      bad_conversion(from, DType::f32);
  }
}

void CpuKernels::from_f32(void* dst, DType to, const float* src, int64_t n) const {
  const int nt = threads_for(n, kParallelMinElems);
  switch (to) {
    case DType::f32:
      if (n > 0 && dst != src) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
      return;
    case DType::bf16:
      convert_loop(static_cast<uint16_t*>(dst), src, n, nt, [](float f) { return f32_to_bf16(f); });
      return;
    case DType::f16:
      convert_loop(static_cast<uint16_t*>(dst), src, n, nt,
                   [](float f) { return f32_to_f16_simd(f); });
      return;
    default:
      bad_conversion(DType::f32, to);
  }
}

void CpuKernels::cast(void* dst, DType to, const void* src, DType from, int64_t n) const {
  const bool ok_from =
      from == DType::f32 || from == DType::f64 || from == DType::bf16 || from == DType::f16;
  const bool ok_to = to == DType::f32 || to == DType::f64 || to == DType::bf16 || to == DType::f16;
  if (!ok_from || !ok_to) bad_conversion(from, to);
  if (n <= 0) return;
  if (from == to) {
    if (dst != src) std::memmove(dst, src, static_cast<std::size_t>(n) * dtype_size(to));
    return;
  }
  if (from == DType::f32 && to != DType::f64) {
    return from_f32(dst, to, static_cast<const float*>(src), n);
  }
  if (to == DType::f32 && from != DType::f64) return to_f32(static_cast<float*>(dst), src, from, n);
  const int nt = threads_for(n, kParallelMinElems);
  const auto* s16 = static_cast<const uint16_t*>(src);
  const auto* s64 = static_cast<const double*>(src);
  auto* d16 = static_cast<uint16_t*>(dst);
  auto* d64 = static_cast<double*>(dst);
  switch (to) {
    case DType::f32:  // from fp64
      convert_loop(static_cast<float*>(dst), s64, n, nt,
                   [](double d) { return static_cast<float>(d); });
      return;
    case DType::f64:
      if (from == DType::f32) {
        convert_loop(d64, static_cast<const float*>(src), n, nt,
                     [](float f) { return static_cast<double>(f); });
      } else if (from == DType::bf16) {
        convert_loop(d64, s16, n, nt,
                     [](uint16_t h) { return static_cast<double>(bf16_to_f32(h)); });
      } else {
        convert_loop(d64, s16, n, nt,
                     [](uint16_t h) { return static_cast<double>(f16_to_f32(h)); });
      }
      return;
    case DType::bf16:  // from fp16 (exact in fp32, one rounding) or fp64 (rounded to odd)
      if (from == DType::f16) {
        convert_loop(d16, s16, n, nt, [](uint16_t h) { return f32_to_bf16(f16_to_f32(h)); });
      } else {
        convert_loop(d16, s64, n, nt, [](double d) { return f32_to_bf16(f64_to_f32_odd(d)); });
      }
      return;
    case DType::f16:
      if (from == DType::bf16) {
        convert_loop(d16, s16, n, nt, [](uint16_t h) { return f32_to_f16(bf16_to_f32(h)); });
      } else {
        convert_loop(d16, s64, n, nt, [](double d) { return f32_to_f16(f64_to_f32_odd(d)); });
      }
      return;
    default:
      bad_conversion(from, to);
  }
}

}  // namespace fsdp::cpu
