// src/backend/cpu/cpu_kernels.cpp: the CPU backend's fp32 kernels (see cpu_kernels.hpp).
//
// fp32, row-major, synchronous. This is the numerical reference the CUDA backend is tested
// against, and it is also what CPU training runs on, so it is written to be fast:
//  - GEMMs go to OpenBLAS (cblas_sgemm). OpenBLAS is kept single-threaded and large GEMMs
//    are split over the output rows (or columns) across OpenMP threads: one thread pool for
//    the whole backend, no contention between OpenBLAS' pthreads and OpenMP's, and it
//    measured ~25% faster than OpenBLAS' own threading on the GPT-2 shapes (4096x128x384..).
//  - Attention runs one (batch, head) pair per OpenMP iteration with single-threaded sgemm
//    calls on row blocks, so the causal upper triangle is mostly skipped, never exponentiated.
//  - T5's general attention (mha: bias, key mask, causal, Tq != Tk) runs one (batch, head)
//    pair per OpenMP iteration with full Tq x Tk sgemm calls; masked scores are set to -inf
//    and their probabilities then to exactly 0, so padded keys never contribute.
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
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

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
// Row block of the causal attention GEMMs: only blocks on or below the diagonal are computed.
constexpr int64_t kAttnBlock = 64;

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
inline float row_max(const float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, x[j]);
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
// causal self-attention. Per (b, h): S = Q K^T / sqrt(hs) (lower triangle), P = softmax(S),
// out = P V. Row blocks of kAttnBlock: block [i0, i1) needs only columns [0, i1).

namespace {
void check_attention_shapes(int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B < 0 || T < 0 || C <= 0 || H <= 0 || C % H != 0 || 3 * C > INT_MAX || T > INT_MAX) {
    throw Error("cpu backend: attention: bad shape B=" + std::to_string(B) +
                " T=" + std::to_string(T) + " C=" + std::to_string(C) +
                " H=" + std::to_string(H) + " (expected C divisible by H)");
  }
}
}  // namespace

void CpuKernels::attention_forward(float* out, float* att, const float* qkv, int64_t B,
                                   int64_t T, int64_t C, int64_t H) const {
  check_attention_shapes(B, T, C, H);
  const int64_t hs = C / H, C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int nt = threads_for(B * H * T * T, 4096);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * hs;  // q: [T, hs], row stride 3C
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* a = att + bh * T * T;  // a: [T, T]
    float* o = out + b * T * C + h * hs;  // o: [T, hs], row stride C
    for (int64_t i0 = 0; i0 < T; i0 += kAttnBlock) {
      const int64_t i1 = std::min(T, i0 + kAttnBlock);
      const int rows = static_cast<int>(i1 - i0);
      // a[i0:i1, 0:i1] = scale * q[i0:i1] @ k[0:i1]^T
      sgemm1(false, true, rows, static_cast<int>(i1), static_cast<int>(hs), sc, q + i0 * C3,
             static_cast<int>(C3), k, static_cast<int>(C3), 0.0f, a + i0 * T,
             static_cast<int>(T));
      for (int64_t i = i0; i < i1; ++i) {
        float* row = a + i * T;
        const int64_t len = i + 1;
        const float mx = row_max(row, len);
        const float inv = static_cast<float>(1.0 / exp_shift_inplace(row, len, mx));
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) row[j] *= inv;
        std::fill(row + len, row + T, 0.0f);
      }
      // o[i0:i1] = a[i0:i1, 0:i1] @ v[0:i1]
      sgemm1(false, false, rows, static_cast<int>(hs), static_cast<int>(i1), 1.0f, a + i0 * T,
             static_cast<int>(T), v, static_cast<int>(C3), 0.0f, o + i0 * C,
             static_cast<int>(C));
    }
  }
}

void CpuKernels::attention_backward(float* dqkv, float* scratch, const float* dout,
                                    const float* qkv, const float* att, int64_t B, int64_t T,
                                    int64_t C, int64_t H) const {
  // dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)); dQ = dS K * scale;
  // dK = dS^T Q * scale. P and dS are zero above the diagonal, so the transposed products
  // for rows [j0, j1) of dK/dV only read rows i >= j0.
  check_attention_shapes(B, T, C, H);
  const int64_t hs = C / H, C3 = 3 * C;
  const float sc = 1.0f / std::sqrt(static_cast<float>(hs));
  const int ihs = static_cast<int>(hs), iT = static_cast<int>(T), iC = static_cast<int>(C),
            iC3 = static_cast<int>(C3);
  const int nt = threads_for(B * H * T * T, 4096);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* q = qkv + b * T * C3 + h * hs;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * C3 + h * hs;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* dO = dout + b * T * C + h * hs;  // [T, hs], row stride C
    const float* p = att + bh * T * T;
    float* ds = scratch + bh * T * T;
    for (int64_t i0 = 0; i0 < T; i0 += kAttnBlock) {
      const int64_t i1 = std::min(T, i0 + kAttnBlock);
      const int rows = static_cast<int>(i1 - i0);
      // dP[i0:i1, 0:i1] = dO[i0:i1] @ V[0:i1]^T
      sgemm1(false, true, rows, static_cast<int>(i1), ihs, 1.0f, dO + i0 * C, iC, v, iC3, 0.0f,
             ds + i0 * T, iT);
      for (int64_t i = i0; i < i1; ++i) {
        float* dsr = ds + i * T;
        const float* pr = p + i * T;
        const int64_t len = i + 1;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < len; ++j) dot += dsr[j] * pr[j];
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) dsr[j] = pr[j] * (dsr[j] - dot);
        std::fill(dsr + len, dsr + i1, 0.0f);
      }
      // dQ[i0:i1] = scale * dS[i0:i1, 0:i1] @ K[0:i1]
      sgemm1(false, false, rows, ihs, static_cast<int>(i1), sc, ds + i0 * T, iT, k, iC3, 0.0f,
             dq + i0 * C3, iC3);
    }
    for (int64_t j0 = 0; j0 < T; j0 += kAttnBlock) {
      const int64_t j1 = std::min(T, j0 + kAttnBlock);
      const int rows = static_cast<int>(j1 - j0);
      const int kk = static_cast<int>(T - j0);
      // dV[j0:j1] = P[j0:T, j0:j1]^T @ dO[j0:T]
      sgemm1(true, false, rows, ihs, kk, 1.0f, p + j0 * T + j0, iT, dO + j0 * C, iC, 0.0f,
             dv + j0 * C3, iC3);
      // dK[j0:j1] = scale * dS[j0:T, j0:j1]^T @ Q[j0:T]
      sgemm1(true, false, rows, ihs, kk, sc, ds + j0 * T + j0, iT, q + j0 * C3, iC3, 0.0f,
             dk + j0 * C3, iC3);
    }
  }
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

void CpuKernels::position_bias_forward(float* bias, const float* table, const int32_t* buckets,
                                       int64_t H, int64_t Tq, int64_t Tk) const {
  const int64_t n = Tq * Tk;
#pragma omp parallel for num_threads(threads_for(H * n, kParallelMinElems)) schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    float* o = bias + h * n;
    for (int64_t ij = 0; ij < n; ++ij) o[ij] = table[static_cast<int64_t>(buckets[ij]) * H + h];
  }
}

void CpuKernels::position_bias_backward(float* dtable, const float* dbias, const int32_t* buckets,
                                        int64_t NB, int64_t H, int64_t Tq, int64_t Tk) const {
  // Per head (one thread each): every bucket's sum over (i, j) in row-major order, in
  // double, added to dtable once. Independent of the thread count.
  const int64_t n = Tq * Tk;
#pragma omp parallel for num_threads(threads_for(H * n, kParallelMinElems)) schedule(static)
  for (int64_t h = 0; h < H; ++h) {
    std::vector<double> acc(static_cast<std::size_t>(NB), 0.0);
    const float* d = dbias + h * n;
    for (int64_t ij = 0; ij < n; ++ij) acc[static_cast<std::size_t>(buckets[ij])] += d[ij];
    for (int64_t b = 0; b < NB; ++b) dtable[b * H + h] += static_cast<float>(acc[b]);
  }
}

namespace {
// C[M,N] (row stride ldc) = alpha op(A) op(B) on the calling thread; K == 0 gives zeros.
void gemm_block(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m) std::fill(C + m * ldc, C + m * ldc + N, 0.0f);
    return;
  }
  sgemm1(ta, tb, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A,
         static_cast<int>(lda), B, static_cast<int>(ldb), 0.0f, C, static_cast<int>(ldc));
}
void check_mha_shapes(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D) {
  if (B < 0 || Tq < 0 || Tk < 0 || H < 0 || D < 0 || H * D > INT_MAX || Tq > INT_MAX ||
      Tk > INT_MAX) {
    throw Error("cpu backend: mha: bad shape B=" + std::to_string(B) + " Tq=" +
                std::to_string(Tq) + " Tk=" + std::to_string(Tk) + " H=" + std::to_string(H) +
                " D=" + std::to_string(D));
  }
}
}  // namespace

void CpuKernels::mha_forward(float* out, float* att, const float* q, const float* k,
                             const float* v, const float* bias, const int32_t* key_mask,
                             int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                             bool causal) const {
  // Per (b, h): S = scale Q K^T (+ bias[h]); masked scores -inf; P = softmax over the
  // unmasked keys (masked exactly 0, an all-masked row all 0); O = P V.
  check_mha_shapes(B, Tq, Tk, H, D);
  const int64_t HD = H * D, TT = Tq * Tk;
  const float ninf = -std::numeric_limits<float>::infinity();
  const int nt = threads_for(B * H * TT, 4096);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* qh = q + b * Tq * HD + h * D;  // [Tq, D], row stride HD
    const float* kh = k + b * Tk * HD + h * D;  // [Tk, D]
    const float* vh = v + b * Tk * HD + h * D;
    float* a = att + bh * TT;                    // [Tq, Tk]
    float* o = out + b * Tq * HD + h * D;
    const int32_t* km = key_mask ? key_mask + b * Tk : nullptr;
    gemm_block(false, true, Tq, Tk, D, scale, qh, HD, kh, HD, a, Tk);
    for (int64_t i = 0; i < Tq; ++i) {
      float* row = a + i * Tk;
      // Keys [0, len) may be unmasked (causal: j <= i).
      const int64_t len = causal ? std::min(Tk, i + 1) : Tk;
      if (bias) {
        const float* br = bias + (h * Tq + i) * Tk;
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) row[j] += br[j];
      }
      if (km) {
        for (int64_t j = 0; j < len; ++j) {
          if (km[j] == 0) row[j] = ninf;
        }
      }
      const float mx = row_max(row, len);
      if (len == 0 || mx == ninf) {  // every key masked
        std::fill(row, row + Tk, 0.0f);
        continue;
      }
      double sum = exp_shift_inplace(row, len, mx);
      if (km) {  // vexp(-inf) is tiny, not 0: zero the masked keys and re-sum
        sum = 0.0;
        for (int64_t j = 0; j < len; ++j) {
          if (km[j] == 0) row[j] = 0.0f;
          sum += row[j];
        }
      }
      const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) row[j] *= inv;
      std::fill(row + len, row + Tk, 0.0f);
    }
    gemm_block(false, false, Tq, D, Tk, 1.0f, a, Tk, vh, HD, o, HD);
  }
}

void CpuKernels::mha_backward(float* dq, float* dk, float* dv, float* dbias, float* scratch,
                              const float* dout, const float* q, const float* k, const float* v,
                              const float* att, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                              int64_t D, float scale) const {
  // dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dP * P)) (0 where P is 0, i.e. masked);
  // dQ = scale dS K; dK = scale dS^T Q; dbias[h] += sum over b of dS[b, h] (b in order).
  check_mha_shapes(B, Tq, Tk, H, D);
  const int64_t HD = H * D, TT = Tq * Tk;
  const int nt = threads_for(B * H * TT, 4096);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* qh = q + b * Tq * HD + h * D;
    const float* kh = k + b * Tk * HD + h * D;
    const float* vh = v + b * Tk * HD + h * D;
    const float* dO = dout + b * Tq * HD + h * D;
    float* dqh = dq + b * Tq * HD + h * D;
    float* dkh = dk + b * Tk * HD + h * D;
    float* dvh = dv + b * Tk * HD + h * D;
    const float* p = att + bh * TT;
    float* ds = scratch + bh * TT;
    gemm_block(false, true, Tq, Tk, D, 1.0f, dO, HD, vh, HD, ds, Tk);
    for (int64_t i = 0; i < Tq; ++i) {
      float* dsr = ds + i * Tk;
      const float* pr = p + i * Tk;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < Tk; ++j) dot += dsr[j] * pr[j];
#pragma omp simd
      for (int64_t j = 0; j < Tk; ++j) dsr[j] = pr[j] * (dsr[j] - dot);
    }
    gemm_block(false, false, Tq, D, Tk, scale, ds, Tk, kh, HD, dqh, HD);
    gemm_block(true, false, Tk, D, Tq, scale, ds, Tk, qh, HD, dkh, HD);
    gemm_block(true, false, Tk, D, Tq, 1.0f, p, Tk, dO, HD, dvh, HD);
  }
  if (!dbias) return;
  const int64_t n = H * TT;
#pragma omp parallel for num_threads(threads_for(B * n, kParallelMinElems)) schedule(static)
  for (int64_t e = 0; e < n; ++e) {
    double s = 0.0;
    for (int64_t b = 0; b < B; ++b) s += scratch[b * n + e];
    dbias[e] += static_cast<float>(s);
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
}  // namespace

double CpuKernels::cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                  int64_t R, int64_t V, int64_t ld,
                                                  float grad_scale) const {
  check_targets(targets, R, V);
  std::vector<double> row_loss(static_cast<std::size_t>(R));
#pragma omp parallel for num_threads(threads_for(R * ld, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    float* x = logits + r * ld;
    std::fill(x + V, x + ld, 0.0f);     // padding columns: no class, zero gradient
    if (targets[r] == kIgnoreTarget) {  // no loss, zero gradient row
      row_loss[static_cast<std::size_t>(r)] = 0.0;
      std::fill(x, x + V, 0.0f);
      continue;
    }
    const int64_t t = targets[r];
    const float xt = x[t];
    const float mx = row_max(x, V);
    const double sum = exp_shift_inplace(x, V, mx);
    row_loss[static_cast<std::size_t>(r)] =
        static_cast<double>(mx) + std::log(sum) - static_cast<double>(xt);
    const float f = static_cast<float>(static_cast<double>(grad_scale) / sum);
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) x[j] *= f;
    x[t] -= grad_scale;
  }
  return sum_in_order(row_loss);
}

double CpuKernels::cross_entropy_forward(const float* logits, const int32_t* targets, int64_t R,
                                         int64_t V, int64_t ld) const {
  check_targets(targets, R, V);
  std::vector<double> row_loss(static_cast<std::size_t>(R));
#pragma omp parallel for num_threads(threads_for(R * V, kParallelMinElems)) schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    const float* x = logits + r * ld;
    if (targets[r] == kIgnoreTarget) {
      row_loss[static_cast<std::size_t>(r)] = 0.0;
      continue;
    }
    const float mx = row_max(x, V);
    const double sum = exp_shift_sum(x, V, mx);
    row_loss[static_cast<std::size_t>(r)] =
        static_cast<double>(mx) + std::log(sum) - static_cast<double>(x[targets[r]]);
  }
  return sum_in_order(row_loss);
}

// ---------------------------------------------------------------------------------------
// optimizers: the element order of operations follows torch.optim (single-tensor path).

namespace {
// The decimal a float hyperparameter was most likely written as (the shortest decimal that
// rounds to it, e.g. 0.999f -> 0.999), as a double. torch.optim computes 1 - beta2,
// 1 - lr * wd and the bias corrections in double from the Python floats; doing the same from
// the decimal value makes e.g. 1 - beta2 = 0.001 rather than 1 - 0.999f = 0.00099998713.
// Never further from the float than half its ulp.
double decimal_value(float f) {
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, f);
  double d = static_cast<double>(f);
  if (res.ec == std::errc()) std::from_chars(buf, res.ptr, d);
  return d;
}
}  // namespace

void CpuKernels::adamw_update(float* param, const float* grad, float* exp_avg,
                              float* exp_avg_sq, int64_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int64_t step) const {
  if (step < 1) {
    throw Error("cpu backend: adamw_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  const double lr_d = decimal_value(lr), b1 = decimal_value(beta1), b2 = decimal_value(beta2);
  const double wd = decimal_value(weight_decay);
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(step));
  // torch: p.mul_(1 - lr wd); m.mul_(b1).add_(g, alpha=1-b1); v.mul_(b2).addcmul_(g, g,
  // value=1-b2); denom = (v.sqrt() / sqrt(bc2)).add_(eps); p.addcdiv_(m, denom, -lr/bc1).
  const float decay = static_cast<float>(1.0 - lr_d * wd);
  const float neg_step_size = static_cast<float>(-lr_d / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float one_m_b1 = static_cast<float>(1.0 - b1);
  const float one_m_b2 = static_cast<float>(1.0 - b2);
#pragma omp parallel for simd num_threads(threads_for(n, kParallelMinElems)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float p = param[i] * decay;
    const float m = exp_avg[i] * beta1 + one_m_b1 * g;
    const float v = exp_avg_sq[i] * beta2 + one_m_b2 * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    const float denom = std::sqrt(v) / bc2_sqrt + eps;
    param[i] = p + neg_step_size * m / denom;
  }
}

void CpuKernels::sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n,
                            float lr, float momentum, float weight_decay, int64_t step) const {
  if (step < 1) {
    throw Error("cpu backend: sgd_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  const int nt = threads_for(n, kParallelMinElems);
  if (momentum == 0.0f) {  // torch keeps no buffer; momentum_buf is not touched (may be null)
#pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      param[i] -= lr * g;
    }
    return;
  }
  const bool first = step == 1;
#pragma omp parallel for simd num_threads(nt) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] + weight_decay * param[i];
    const float b = first ? g : momentum * momentum_buf[i] + g;
    momentum_buf[i] = b;
    param[i] -= lr * b;
  }
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
      convert_loop(static_cast<uint16_t*>(dst), src, n, nt, [](float f) { return f32_to_f16(f); });
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
