// tests/test_kernels.cpp: the CPU backend's model kernels (fsdp/backend/kernels.hpp) against
// naive double-precision references, finite-difference gradient checks for every kernel with a
// backward, the write-vs-accumulate contract of kernels.hpp, and independence of results from
// the thread count; then the typed interface: the "store bf16/fp16, compute fp32" contract for
// every kernel (tests/cpu_backend_util.hpp) and argument checks. The DeviceRuntime half of the
// backend (memory, copies, casts, streams, the optimizers' and the engine's arithmetic, the
// caching allocator) is tests/test_device_runtime.cpp's.
//
// Gradient checks: for an op out = f(inputs) we take L = sum(out * Rw) with fixed random Rw,
// feed dout = Rw to the backward kernel and compare each analytic input gradient with
// central differences of L (L summed in double, forward in fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_ref.hpp"
#include "cpu_backend_util.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using namespace cpu_test;

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// ||a - n|| / ||n|| over all elements (n = numeric reference).
double rel_err(const Vec& analytic, const std::vector<double>& numeric) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double d = analytic[i] - numeric[i];
    num += d * d;
    den += numeric[i] * numeric[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

// Central differences of `loss` with respect to every element of `x` (perturbed in place).
std::vector<double> numeric_grad(Vec& x, const std::function<double()>& loss, float h) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float orig = x[i];
    x[i] = orig + h;
    const double plus = loss();
    x[i] = orig - h;
    const double minus = loss();
    x[i] = orig;
    g[i] = (plus - minus) / (2.0 * static_cast<double>(h));
  }
  return g;
}


class Kernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::mt19937 rng{1234};
};


// ---------------------------------------------------------------------------------------
// dense algebra

// Reference C = alpha op(A) op(B) + beta C in double.
std::vector<double> naive_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                               const Vec& A, const Vec& B, float beta, const Vec& C) {
  std::vector<double> out(static_cast<std::size_t>(M * N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double a = ta ? A[k * M + m] : A[m * K + k];
        const double b = tb ? B[n * K + k] : B[k * N + n];
        s += a * b;
      }
      out[m * N + n] = alpha * s + static_cast<double>(beta) * C[m * N + n];
    }
  }
  return out;
}

TEST_F(Kernels, GemmAllTransposesAndSizes) {
  struct Dims {
    int64_t M, N, K;
  };
  // Small (single-threaded) and large enough to be split over rows / over columns.
  for (Dims s : {Dims{7, 5, 3}, Dims{37, 53, 29}, Dims{301, 70, 200}, Dims{40, 290, 210}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        Vec A = random_vec(s.M * s.K, rng), B = random_vec(s.K * s.N, rng);
        Vec C = random_vec(s.M * s.N, rng);
        const auto ref = naive_gemm(ta, tb, s.M, s.N, s.K, 0.7f, A, B, 0.3f, C);
        be->gemm(ta, tb, s.M, s.N, s.K, 0.7f, f32(A), f32(B), 0.3f, f32(C));
        double max_err = 0.0;
        for (std::size_t i = 0; i < C.size(); ++i) {
          max_err = std::max(max_err, std::abs(C[i] - ref[i]));
        }
        EXPECT_LT(max_err, 1e-4) << "M=" << s.M << " N=" << s.N << " K=" << s.K
                                 << " ta=" << ta << " tb=" << tb;
      }
    }
  }
}

TEST_F(Kernels, GemmBetaZeroOverwritesGarbage) {
  const int64_t M = 64, N = 48, K = 100;  // also the threaded path (M*N*K*2 > 4e5)
  for (int64_t m : {int64_t{5}, M}) {
    Vec A = random_vec(m * K, rng), B = random_vec(K * N, rng);
    Vec C(m * N, std::numeric_limits<float>::quiet_NaN());
    be->gemm(false, false, m, N, K, 1.0f, f32(A), f32(B), 0.0f, f32(C));
    const auto ref = naive_gemm(false, false, m, N, K, 1.0f, A, B, 0.0f, Vec(m * N, 0.0f));
    for (std::size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(C[i], ref[i], 1e-4);
  }
  Vec C(6, std::numeric_limits<float>::quiet_NaN());  // K = 0: C = beta * C, beta 0 -> zeros
  be->gemm(false, false, 2, 3, 0, 1.0f, TensorView{}, TensorView{}, 0.0f, f32(C));
  for (float c : C) EXPECT_EQ(c, 0.0f);
}

// A linear layer y = x W^T + b (GPT-2 Conv1D/nn.Linear) and its backward through gemm:
// dx = dy W (written), dW += dy^T x and db += colsum(dy) (accumulated).
TEST_F(Kernels, LinearGradientCheck) {
  const int64_t R = 6, Cin = 5, Cout = 4;
  Vec x = random_vec(R * Cin, rng), W = random_vec(Cout * Cin, rng), b = random_vec(Cout, rng);
  const Vec Rw = random_vec(R * Cout, rng);
  auto forward = [&](Vec& y) {
    be->gemm(false, true, R, Cout, Cin, 1.0f, f32(x), f32(W), 0.0f, f32(y));
    be->add_bias(f32(y), f32(b), R, Cout);
  };
  auto loss = [&] {
    Vec y(R * Cout);
    forward(y);
    return dot(y, Rw);
  };
  Vec y(R * Cout);
  forward(y);
  // y against the reference
  const auto yref = naive_gemm(false, true, R, Cout, Cin, 1.0f, x, W, 0.0f, Vec(R * Cout, 0));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < Cout; ++c)
      EXPECT_NEAR(y[r * Cout + c], yref[r * Cout + c] + b[c], 1e-5);
  }
  Vec dx(R * Cin, 99.0f), dW(Cout * Cin, 0.5f), db(Cout, -0.25f);  // dW, db pre-filled
  be->gemm(false, false, R, Cin, Cout, 1.0f, f32(Rw), f32(W), 0.0f, f32(dx));
  be->gemm(true, false, Cout, Cin, R, 1.0f, f32(Rw), f32(x), 1.0f, f32(dW));
  be->bias_backward(f32(db), f32(Rw), R, Cout);
  for (auto& v : dW) v -= 0.5f;
  for (auto& v : db) v += 0.25f;
  EXPECT_LT(rel_err(dx, numeric_grad(x, loss, 1e-2f)), 5e-5);
  EXPECT_LT(rel_err(dW, numeric_grad(W, loss, 1e-2f)), 5e-5);
  EXPECT_LT(rel_err(db, numeric_grad(b, loss, 1e-2f)), 5e-5);
}

TEST_F(Kernels, BiasBackwardLargeMatchesReference) {
  const int64_t R = 1000, C = 77;  // threaded column chunks, C not a multiple of 16
  Vec d = random_vec(R * C, rng);
  Vec db(C, 1.0f);
  be->bias_backward(f32(db), f32(d), R, C);
  for (int64_t c = 0; c < C; ++c) {
    double s = 1.0;
    for (int64_t r = 0; r < R; ++r) s += d[r * C + c];
    EXPECT_NEAR(db[c], s, 1e-4);
  }
}

TEST_F(Kernels, ElementwiseOps) {
  const int64_t n = 70001;  // above the threading threshold, odd length
  Vec a = random_vec(n, rng), b = random_vec(n, rng), out(n);
  be->add(f32(out), f32(a), f32(b));
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(out[i], a[i] + b[i]);
  Vec z = a;
  be->scale(f32(z), 3.0f);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(z[i], a[i] * 3.0f);
  be->add(f32(a).slice(0, 3), f32(a), f32(b));  // aliasing out == a
  EXPECT_EQ(a[2], out[2]);
}

// ---------------------------------------------------------------------------------------
// embedding

TEST_F(Kernels, EmbeddingForwardAndGradient) {
  const int64_t B = 2, T = 5, C = 8, V = 6, Tmax = 7;
  const Tokens tokens = {3, 1, 3, 0, 5, 3, 3, 2, 1, 0};  // repeated tokens
  Vec wte = random_vec(V * C, rng), wpe = random_vec(Tmax * C, rng);
  const Vec Rw = random_vec(B * T * C, rng);
  Vec out(B * T * C);
  be->embedding_forward(f32(out), i32(tokens), f32(wte), f32(wpe), B, T, C);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
      }
    }
  }
  auto loss = [&] {
    Vec o(B * T * C);
    be->embedding_forward(f32(o), i32(tokens), f32(wte), f32(wpe), B, T, C);
    return dot(o, Rw);
  };
  Vec dwte(V * C, 2.0f), dwpe(Tmax * C, -1.0f);  // pre-filled: backward accumulates
  be->embedding_backward(f32(dwte), f32(dwpe), f32(Rw), i32(tokens), B, T, C);
  for (auto& v : dwte) v -= 2.0f;
  for (auto& v : dwpe) v += 1.0f;
  EXPECT_LT(rel_err(dwte, numeric_grad(wte, loss, 1e-2f)), 2e-5);
  EXPECT_LT(rel_err(dwpe, numeric_grad(wpe, loss, 1e-2f)), 2e-5);
  // token 3 appears 4 times: its row is the sum of those 4 dout rows
  for (int64_t c = 0; c < C; ++c) {
    const float expect = Rw[0 * C + c] + Rw[2 * C + c] + Rw[5 * C + c] + Rw[6 * C + c];
    EXPECT_NEAR(dwte[3 * C + c], expect, 1e-5);
  }
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwte[4 * C + c], 0.0f);  // unused token
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dwpe[6 * C + c], 0.0f);  // position >= T
}

TEST_F(Kernels, EmbeddingRejectsBadToken) {
  Vec wte(4 * 2), wpe(2 * 2), out(2 * 2);
  EXPECT_THROW(be->embedding_forward(f32(out), i32({0, -1}), f32(wte), f32(wpe), 1, 2, 2), Error);
  // 4 rows in wte: token 4 is out of range (forward and backward)
  EXPECT_THROW(be->embedding_forward(f32(out), i32({0, 4}), f32(wte), f32(wpe), 1, 2, 2), Error);
  EXPECT_THROW(be->embedding_backward(f32(wte), f32(wpe), f32(out), i32({4, 0}), 1, 2, 2), Error);
}

// ---------------------------------------------------------------------------------------
// LayerNorm

TEST_F(Kernels, LayerNormForwardMatchesFormula) {
  const int64_t R = 7, C = 19;
  const float eps = 1e-5f;
  Vec x = random_vec(R * C, rng, -3.0f, 5.0f), w = random_vec(C, rng), b = random_vec(C, rng);
  Vec out(R * C), mean(R), rstd(R);
  be->layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), R, C, eps);
  for (int64_t r = 0; r < R; ++r) {
    double mu = 0.0, var = 0.0;
    for (int64_t c = 0; c < C; ++c) mu += x[r * C + c];
    mu /= C;
    for (int64_t c = 0; c < C; ++c) var += (x[r * C + c] - mu) * (x[r * C + c] - mu);
    var /= C;  // biased, as torch.nn.LayerNorm
    const double rs = 1.0 / std::sqrt(var + eps);
    EXPECT_NEAR(mean[r], mu, 1e-6);
    EXPECT_NEAR(rstd[r], rs, 1e-5 * rs);
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(out[r * C + c], (x[r * C + c] - mu) * rs * w[c] + b[c], 1e-5);
    }
  }
}

TEST_F(Kernels, LayerNormGradientCheckAndAccumulation) {
  const int64_t R = 10, C = 8;  // B=2, T=5
  const float eps = 1e-5f;
  Vec x = random_vec(R * C, rng), w = random_vec(C, rng, 0.5f, 1.5f), b = random_vec(C, rng);
  const Vec Rw = random_vec(R * C, rng);
  auto loss = [&] {
    Vec o(R * C), m(R), rs(R);
    be->layernorm_forward(f32(o), f32(m), f32(rs), f32(x), f32(w), f32(b), R, C, eps);
    return dot(o, Rw);
  };
  Vec out(R * C), mean(R), rstd(R);
  be->layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), R, C, eps);
  const Vec prefill = random_vec(R * C, rng);
  Vec dx = prefill, dw(C, 1.0f), db(C, 3.0f);
  be->layernorm_backward(f32(dx), f32(dw), f32(db), f32(Rw), f32(x), f32(w), f32(mean),
                         f32(rstd), R, C);
  for (int64_t i = 0; i < R * C; ++i) dx[i] -= prefill[i];  // dx accumulated into prefill
  for (auto& v : dw) v -= 1.0f;
  for (auto& v : db) v -= 3.0f;
  EXPECT_LT(rel_err(dx, numeric_grad(x, loss, 1e-2f)), 3e-4);
  EXPECT_LT(rel_err(dw, numeric_grad(w, loss, 1e-2f)), 5e-5);
  EXPECT_LT(rel_err(db, numeric_grad(b, loss, 1e-2f)), 5e-5);
}

// ---------------------------------------------------------------------------------------
// GELU

double gelu_ref(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

TEST_F(Kernels, GeluKnownValues) {
  // torch.nn.functional.gelu(x, approximate='tanh') in float64 (torch 1.13)
  const Vec x = {-50.f, -10.f, -3.f, -1.f, -0.5f, 0.f, 0.5f, 1.f, 3.f, 10.f, 50.f};
  const std::vector<double> expect = {-0.0,         -0.0,           -0.00363739208177,
                                      -0.158808009392, -0.154285990175, 0.0,
                                      0.345714009825,  0.841191990608,  2.99636260792,
                                      10.0,            50.0};
  Vec out(x.size());
  be->gelu_forward(f32(out), f32(x));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(out[i], expect[i], 2e-7 + 2e-7 * std::abs(expect[i])) << "x=" << x[i];
  }
}

TEST_F(Kernels, GeluMatchesReferenceAndGradient) {
  const int64_t n = 1003;  // vector body + tail
  Vec x = random_vec(n, rng, -6.0f, 6.0f), out(n);
  be->gelu_forward(f32(out), f32(x));
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(out[i], gelu_ref(x[i]), 1e-6 + 1e-6 * std::abs(out[i]));
  // analytic derivative against the double-precision derivative of the reference
  const Vec ones(n, 1.0f);
  Vec dx(n, std::numeric_limits<float>::quiet_NaN());  // written, not accumulated
  be->gelu_backward(f32(dx), f32(x), f32(ones));
  for (int64_t i = 0; i < n; ++i) {
    const double h = 1e-6;
    const double d = (gelu_ref(x[i] + h) - gelu_ref(x[i] - h)) / (2 * h);
    EXPECT_NEAR(dx[i], d, 1e-5) << "x=" << x[i];
  }
  // finite differences through the fp32 kernel, L = sum(gelu(x) * R)
  const int64_t m = 80;
  Vec xs = random_vec(m, rng, -3.0f, 3.0f);
  const Vec Rw = random_vec(m, rng);
  auto loss = [&] {
    Vec o(m);
    be->gelu_forward(f32(o), f32(xs));
    return dot(o, Rw);
  };
  Vec g(m);
  be->gelu_backward(f32(g), f32(xs), f32(Rw));
  EXPECT_LT(rel_err(g, numeric_grad(xs, loss, 1e-2f)), 1e-4);
  // large threaded call agrees with the small path
  const int64_t big = 100003;
  Vec xb = random_vec(big, rng, -8.0f, 8.0f), ob(big);
  be->gelu_forward(f32(ob), f32(xb));
  for (int64_t i = 0; i < big; i += 101)
    ASSERT_NEAR(ob[i], gelu_ref(xb[i]), 1e-6 + 1e-6 * std::abs(ob[i]));
}

// The GPT-2 MLP's fused bias + GELU: values against the double reference, and gradients of
// L = sum(gelu(x + b) * Rw) with respect to x and b by central differences.
TEST_F(Kernels, BiasGeluMatchesReferenceAndGradient) {
  const int64_t R = 7, C = 13;
  Vec x = random_vec(R * C, rng, -3.0f, 3.0f), b = random_vec(C, rng);
  const Vec Rw = random_vec(R * C, rng);
  Vec fc = x, out(R * C, std::numeric_limits<float>::quiet_NaN());
  be->bias_gelu_forward(f32(out), f32(fc), f32(b), R, C);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      const int64_t i = r * C + c;
      ASSERT_EQ(fc[i], x[i] + b[c]);  // fc += bias, in place
      ASSERT_NEAR(out[i], gelu_ref(x[i] + b[c]), 1e-6 + 1e-6 * std::abs(out[i]));
    }
  }
  auto loss = [&] {
    Vec f = x, o(R * C);
    be->bias_gelu_forward(f32(o), f32(f), f32(b), R, C);
    return dot(o, Rw);
  };
  Vec dfc = Rw, db(C, 0.5f);  // dfc aliases dout; db accumulates into 0.5
  be->gelu_bias_backward(f32(dfc), f32(db), f32(fc), f32(dfc), R, C);
  for (auto& v : db) v -= 0.5f;
  EXPECT_LT(rel_err(dfc, numeric_grad(x, loss, 1e-2f)), 1e-4);
  EXPECT_LT(rel_err(db, numeric_grad(b, loss, 1e-2f)), 1e-4);
}

// ---------------------------------------------------------------------------------------
// attention

// Forward against the naive reference (tests/attention_ref.hpp; tests/test_attention.cpp
// covers every gradient against it too), backward by finite differences.
void check_attention(Backend& be, std::mt19937& rng, int64_t B, int64_t T, int64_t C,
                     int64_t H, bool grad_check) {
  Vec qkv = random_vec(B * T * 3 * C, rng, -1.5f, 1.5f);
  Vec out(B * T * C), lse(B * H * T, std::numeric_limits<float>::quiet_NaN());
  be.attention_forward(f32(out), f32(lse), f32(qkv), B, T, C, H, TensorView{});
  Vec q, k, v;
  test_util::split_qkv(qkv, B * T, C, q, k, v);
  const int64_t hs = C / H;
  const test_util::AttnRef ref = test_util::naive_attention(
      {B, T, T, H, hs, 1.0f / std::sqrt(static_cast<float>(hs)), true}, q, k, v, {}, {});
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref.out[i], 2e-6) << i;
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref.lse[i], 2e-6) << i;
  if (!grad_check) return;
  const Vec Rw = random_vec(B * T * C, rng);
  // The thousands of small forwards of the finite differences run on one thread (a fork/join
  // per call is slow on a loaded machine); attention results do not depend on the threads.
  auto single = make_cpu_backend(1);
  auto loss = [&] {
    Vec o(B * T * C), l(B * H * T);
    single->attention_forward(f32(o), f32(l), f32(qkv), B, T, C, H, TensorView{});
    return dot(o, Rw);
  };
  Vec dqkv(B * T * 3 * C, std::numeric_limits<float>::quiet_NaN());  // written
  be.attention_backward(f32(dqkv), f32(Rw), f32(qkv), f32(out), f32(lse), B, T, C, H, TensorView{});
  const auto num = numeric_grad(qkv, loss, 1e-2f);
  EXPECT_LT(rel_err(dqkv, num), 5e-4) << "B=" << B << " T=" << T << " C=" << C << " H=" << H;
  // each of q, k, v gets a gradient (no section silently zero)
  for (int part = 0; part < 3; ++part) {
    double n2 = 0.0;
    for (int64_t r = 0; r < B * T; ++r) {
      for (int64_t c = 0; c < C; ++c) n2 += std::abs(dqkv[r * 3 * C + part * C + c]);
    }
    EXPECT_GT(n2, 1e-3) << "part " << part;
  }
}

TEST_F(Kernels, AttentionSmall) { check_attention(*be, rng, 2, 5, 8, 2, true); }
TEST_F(Kernels, AttentionAcrossRowBlocks) { check_attention(*be, rng, 1, 70, 8, 2, true); }
TEST_F(Kernels, AttentionLargerForward) { check_attention(*be, rng, 3, 131, 64, 4, false); }

TEST_F(Kernels, AttentionRejectsBadHeads) {
  Vec qkv(3 * 10), out(10), lse(3);
  EXPECT_THROW(be->attention_forward(f32(out), f32(lse), f32(qkv), 1, 1, 10, 3, TensorView{}),
               Error);
}

// ---------------------------------------------------------------------------------------
// cross-entropy

TEST_F(Kernels, CrossEntropyMatchesLogSumExpAndGradient) {
  const int64_t R = 10, V = 37;
  Vec logits = random_vec(R * V, rng, -4.0f, 4.0f);
  for (int64_t j = 0; j < V; ++j) logits[3 * V + j] += 1000.0f;  // needs max subtraction
  Tokens targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 7) % V);
  double ref = 0.0;
  std::vector<double> grad_ref(R * V);
  const float gs = 0.25f;
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[r * V + j]));
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[r * V + j] - mx);
    ref += mx + std::log(s) - logits[r * V + targets[r]];
    for (int64_t j = 0; j < V; ++j) {
      grad_ref[r * V + j] = (std::exp(logits[r * V + j] - mx) / s - (j == targets[r])) * gs;
    }
  }
  const Vec orig = logits;
  double loss = 0.0;
  be->cross_entropy_forward(f64(loss), f32(logits), i32(targets), R, V, V, 0.f);
  EXPECT_NEAR(loss, ref, 1e-5 * ref);
  EXPECT_EQ(logits, orig);  // forward-only leaves logits unchanged
  double loss2 = 0.0;
  be->cross_entropy_forward_backward(f64(loss2), f32(logits), i32(targets), R, V, V, gs, 0.f);
  EXPECT_NEAR(loss2, ref, 1e-5 * ref);
  EXPECT_EQ(bits(loss2), bits(loss));
  for (int64_t i = 0; i < R * V; ++i) ASSERT_NEAR(logits[i], grad_ref[i], 1e-7);
  // each row of the gradient sums to zero
  for (int64_t r = 0; r < R; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += logits[r * V + j];
    EXPECT_NEAR(s, 0.0, 1e-7);
  }
  // the loss accumulates into the device scalar
  double acc = 1.5;
  be->cross_entropy_forward(f64(acc), f32(orig), i32(targets), R, V, V, 0.f);
  EXPECT_EQ(bits(acc), bits(1.5 + loss));
}

TEST_F(Kernels, CrossEntropyGradientCheck) {
  const int64_t R = 10, V = 11;
  Vec logits = random_vec(R * V, rng, -2.0f, 2.0f);
  Tokens targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 3 + 1) % V);
  auto loss = [&] {
    double l = 0.0;
    be->cross_entropy_forward(f64(l), f32(logits), i32(targets), R, V, V, 0.f);
    return l;
  };
  const auto num = numeric_grad(logits, loss, 1e-2f);
  Vec g = logits;
  double l = 0.0;
  be->cross_entropy_forward_backward(f64(l), f32(g), i32(targets), R, V, V, 1.0f, 0.f);
  EXPECT_LT(rel_err(g, num), 5e-5);
}

// Gemma 2's final_logit_softcapping: the loss of softcap * tanh(logits / softcap) in double,
// the gradient against finite differences through the cap, a padded row stride and an
// ignored row; a cap changes the loss, a negative or infinite one throws.
TEST_F(Kernels, CrossEntropySoftcapIsTheLossOfCappedLogits) {
  const int64_t R = 6, V = 13, ld = 16;
  const float cap = 3.0f;
  Vec logits(R * ld, 7.0f);  // padding columns: any finite value
  const Vec raw = random_vec(R * V, rng, -6.0f, 6.0f);
  for (int64_t r = 0; r < R; ++r) std::copy(&raw[r * V], &raw[r * V] + V, &logits[r * ld]);
  Tokens targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 5 + 2) % V);
  targets[4] = -100;  // kIgnoreIndex: no loss, a zero row
  double ref = 0.0, plain = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] < 0) continue;
    double mx = -1e300, s = 0.0;
    std::vector<double> c(V);
    for (int64_t j = 0; j < V; ++j) {
      c[j] = cap * std::tanh(static_cast<double>(logits[r * ld + j]) / cap);
      mx = std::max(mx, c[j]);
    }
    for (int64_t j = 0; j < V; ++j) s += std::exp(c[j] - mx);
    ref += mx + std::log(s) - c[targets[r]];
  }
  be->cross_entropy_forward(f64(plain), f32(logits), i32(targets), R, V, ld, 0.f);
  EXPECT_GT(std::abs(plain - ref), 0.1) << "the cap changed nothing";
  double loss = 0.0;
  be->cross_entropy_forward(f64(loss), f32(logits), i32(targets), R, V, ld, cap);
  EXPECT_NEAR(loss, ref, 1e-6 * ref);
  auto f = [&] {
    double l = 0.0;
    be->cross_entropy_forward(f64(l), f32(logits), i32(targets), R, V, ld, cap);
    return l;
  };
  const auto num = numeric_grad(logits, f, 1e-2f);
  Vec g = logits;
  double l2 = 0.0;
  be->cross_entropy_forward_backward(f64(l2), f32(g), i32(targets), R, V, ld, 1.0f, cap);
  EXPECT_EQ(bits(l2), bits(loss));
  EXPECT_LT(rel_err(g, num), 5e-4);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = V; j < ld; ++j) ASSERT_EQ(g[r * ld + j], 0.0f) << "padding column";
  }
  for (int64_t j = 0; j < ld; ++j) ASSERT_EQ(g[4 * ld + j], 0.0f) << "ignored row";
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity()}) {
    double l = 0.0;
    EXPECT_THROW(be->cross_entropy_forward(f64(l), f32(logits), i32(targets), R, V, ld, bad),
                 Error);
  }
  // Each row's gradient is its own: the rows in one call or in two (as two ranks' shares of
  // a batch) are bit-identical, at a vocabulary large enough for the threaded path.
  const int64_t R2 = 8, V2 = 5000;
  const Vec big = random_vec(R2 * V2, rng, -8.0f, 8.0f);
  Tokens t2(R2);
  for (int64_t r = 0; r < R2; ++r) t2[r] = static_cast<int32_t>((r * 977) % V2);
  Vec whole = big, halves = big;
  double lw = 0.0, lh = 0.0;
  be->cross_entropy_forward_backward(f64(lw), f32(whole), i32(t2), R2, V2, V2, 0.125f, cap);
  for (int64_t h = 0; h < 2; ++h) {
    Vec part(halves.begin() + h * (R2 / 2) * V2, halves.begin() + (h + 1) * (R2 / 2) * V2);
    Tokens tp(t2.begin() + h * (R2 / 2), t2.begin() + (h + 1) * (R2 / 2));
    be->cross_entropy_forward_backward(f64(lh), f32(part), i32(tp), R2 / 2, V2, V2, 0.125f, cap);
    std::copy(part.begin(), part.end(), halves.begin() + h * (R2 / 2) * V2);
  }
  for (int64_t i = 0; i < R2 * V2; ++i) ASSERT_EQ(bits(whole[i]), bits(halves[i])) << i;
}

TEST_F(Kernels, CrossEntropyLargeVocabThreaded) {
  const int64_t R = 16, V = 50257;
  Vec logits = random_vec(R * V, rng, -10.0f, 10.0f);
  Tokens targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 4999) % V);
  double ref = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, s = 0.0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[r * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[r * V + j] - mx);
    ref += mx + std::log(s) - logits[r * V + targets[r]];
  }
  double loss = 0.0;
  be->cross_entropy_forward(f64(loss), f32(logits), i32(targets), R, V, V, 0.f);
  EXPECT_NEAR(loss, ref, 1e-6 * ref);
}

TEST_F(Kernels, CrossEntropyPaddedRowStrideEqualsUnpadded) {
  // logits [R, ld] whose first V columns are the classes and the rest vocabulary padding
  // (Megatron's padded vocabulary): the loss is the [R, V] loss bit for bit, whatever the
  // padding holds (here large values that would dominate a softmax over all ld columns);
  // with the gradient the class columns equal the unpadded dlogits bit for bit and the padding
  // columns are 0; forward-only leaves every column unchanged. Rows of 1001 and 50257 classes
  // padded to multiples of 128 (threaded rows), with an ignored row.
  for (auto [V, ld] : {std::pair<int64_t, int64_t>{37, 128}, {1001, 1024}, {50257, 50304}}) {
    const int64_t R = 6;
    const Vec dense = random_vec(R * V, rng, -6.0f, 6.0f);
    Tokens targets(R);
    for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 977 + 5) % V);
    targets[2] = fsdp::kIgnoreIndex;
    Vec padded(R * ld);
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < ld; ++j) padded[r * ld + j] = j < V ? dense[r * V + j] : 100.0f + j;
    }
    const Vec padded_in = padded;
    double l_dense = 0.0, l_pad = 0.0, lf_dense = 0.0, lf_pad = 0.0;
    be->cross_entropy_forward(f64(lf_dense), f32(dense), i32(targets), R, V, V, 0.f);
    be->cross_entropy_forward(f64(lf_pad), f32(padded), i32(targets), R, V, ld, 0.f);
    EXPECT_EQ(bits(lf_pad), bits(lf_dense)) << V;
    EXPECT_EQ(padded, padded_in) << V;  // forward-only: unchanged, padding included
    Vec g = dense;
    be->cross_entropy_forward_backward(f64(l_dense), f32(g), i32(targets), R, V, V, 0.5f, 0.f);
    be->cross_entropy_forward_backward(f64(l_pad), f32(padded), i32(targets), R, V, ld, 0.5f, 0.f);
    EXPECT_EQ(bits(l_pad), bits(l_dense)) << V;
    EXPECT_EQ(bits(l_pad), bits(lf_pad)) << V;
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t j = 0; j < ld; ++j) {
        const float want = j < V ? g[r * V + j] : 0.0f;
        ASSERT_EQ(bits(padded[r * ld + j]), bits(want)) << "V " << V << " row " << r << " col " << j;
      }
    }
  }
  // ld < V is an argument error naming ld.
  Vec logits(2 * 4, 0.0f);
  double loss = 0.0;
  try {
    be->cross_entropy_forward(f64(loss), f32(logits), i32({0, 1}), 2, 4, 3, 0.f);
    ADD_FAILURE() << "ld < V accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cross_entropy_forward: ld"), std::string::npos) << e.what();
  }
}

TEST_F(Kernels, CrossEntropyRejectsBadTarget) {
  Vec logits(2 * 3, 0.0f);
  const Tokens bad_hi = {0, 3}, bad_lo = {-1, 0};  // -100 is kIgnoreIndex, not an error
  double loss = 0.0;
  EXPECT_THROW(be->cross_entropy_forward(f64(loss), f32(logits), i32(bad_hi), 2, 3, 3, 0.f), Error);
  EXPECT_THROW(
      be->cross_entropy_forward_backward(f64(loss), f32(logits), i32(bad_lo), 2, 3, 3, 1.0f, 0.f),
      Error);
  EXPECT_EQ(loss, 0.0);
}

// ---------------------------------------------------------------------------------------
// T5 pieces: embedding lookup, RMSNorm, ReLU, mul, relative position bias, general
// multi-head attention (HF transformers/models/t5/modeling_t5.py semantics)

TEST_F(Kernels, EmbeddingLookupForwardAndGradient) {
  const int64_t N = 9, C = 7, V = 6;
  const Tokens tokens = {3, 1, 3, 0, 5, 3, 2, 1, 0};  // token 3 three times, 4 unused
  Vec table = random_vec(V * C, rng);
  const Vec Rw = random_vec(N * C, rng);
  Vec out(N * C, std::numeric_limits<float>::quiet_NaN());  // written
  be->embedding_lookup_forward(f32(out), i32(tokens), f32(table), N, C);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[n * C + c], table[tokens[n] * C + c]);
  }
  auto loss = [&] {
    Vec o(N * C);
    be->embedding_lookup_forward(f32(o), i32(tokens), f32(table), N, C);
    return dot(o, Rw);
  };
  Vec dtable(V * C, 0.5f);  // pre-filled: backward accumulates
  be->embedding_lookup_backward(f32(dtable), f32(Rw), i32(tokens), N, C);
  for (auto& g : dtable) g -= 0.5f;
  EXPECT_LT(rel_err(dtable, numeric_grad(table, loss, 1e-2f)), 2e-5);
  for (int64_t c = 0; c < C; ++c) {
    EXPECT_NEAR(dtable[3 * C + c], Rw[0 * C + c] + Rw[2 * C + c] + Rw[5 * C + c], 1e-6);
    EXPECT_EQ(dtable[4 * C + c], 0.0f);  // unused row untouched
  }
  EXPECT_THROW(be->embedding_lookup_forward(f32(out), i32({0, 6}), f32(table), 2, C), Error);
  EXPECT_THROW(be->embedding_lookup_backward(f32(dtable), f32(Rw), i32({-1, 0}), 2, C), Error);
}

TEST_F(Kernels, RmsNormMatchesT5LayerNormFormula) {
  // HF T5LayerNorm: variance = x.pow(2).mean(-1) in fp32; x * rsqrt(variance + eps) * weight.
  const int64_t R = 7, C = 19;
  const float eps = 1e-6f;
  Vec x = random_vec(R * C, rng, -3.0f, 5.0f), w = random_vec(C, rng, 0.5f, 1.5f);
  x[2 * C + 3] = 0.0f;
  for (int64_t c = 0; c < C; ++c) x[4 * C + c] = 0.0f;  // all-zero row: rstd = 1/sqrt(eps)
  Vec out(R * C), rstd(R);
  be->rmsnorm_forward(f32(out), f32(rstd), f32(x), f32(w), R, C, eps);
  for (int64_t r = 0; r < R; ++r) {
    double ms = 0.0;
    for (int64_t c = 0; c < C; ++c) ms += static_cast<double>(x[r * C + c]) * x[r * C + c];
    ms /= C;  // no mean subtraction
    const double rs = 1.0 / std::sqrt(ms + eps);
    EXPECT_NEAR(rstd[r], rs, 1e-6 * rs) << r;
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_NEAR(out[r * C + c], w[c] * x[r * C + c] * rs, 2e-6 * std::max(1.0, rs)) << r;
    }
  }
  EXPECT_NEAR(rstd[4], 1.0 / std::sqrt(1e-6), 1.0);
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(out[4 * C + c], 0.0f);
}

TEST_F(Kernels, RmsNormGradientCheckAndAccumulation) {
  const int64_t R = 6, C = 11;
  const float eps = 1e-6f;
  Vec x = random_vec(R * C, rng), w = random_vec(C, rng, 0.5f, 1.5f);
  const Vec Rw = random_vec(R * C, rng);
  auto loss = [&] {
    Vec o(R * C), rs(R);
    be->rmsnorm_forward(f32(o), f32(rs), f32(x), f32(w), R, C, eps);
    return dot(o, Rw);
  };
  Vec out(R * C), rstd(R);
  be->rmsnorm_forward(f32(out), f32(rstd), f32(x), f32(w), R, C, eps);
  const Vec prefill = random_vec(R * C, rng);
  Vec dx = prefill, dw(C, 2.0f);
  be->rmsnorm_backward(f32(dx), f32(dw), f32(Rw), f32(x), f32(w), f32(rstd), R, C);
  for (int64_t i = 0; i < R * C; ++i) dx[i] -= prefill[i];
  for (auto& g : dw) g -= 2.0f;
  EXPECT_LT(rel_err(dx, numeric_grad(x, loss, 1e-2f)), 3e-4);
  EXPECT_LT(rel_err(dw, numeric_grad(w, loss, 1e-2f)), 5e-5);
}

TEST_F(Kernels, ReluAndMulValuesAndGradients) {
  const int64_t n = 37;
  Vec x = random_vec(n, rng, -2.0f, 2.0f), y = random_vec(n, rng, -2.0f, 2.0f);
  for (auto& v : x) {
    if (std::abs(v) < 0.05f) v = 0.3f;  // keep finite differences off the kink
  }
  x[5] = 0.0f;  // relu'(0) = 0 (torch's threshold_backward)
  const Vec Rw = random_vec(n, rng);
  Vec r(n), m(n), dx(n), da(n), db(n);
  be->relu_forward(f32(r), f32(x));
  be->mul(f32(m), f32(x), f32(y));
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(r[i], x[i] > 0.0f ? x[i] : 0.0f);
    ASSERT_EQ(m[i], x[i] * y[i]);
  }
  be->relu_backward(f32(dx), f32(x), f32(Rw));
  EXPECT_EQ(dx[5], 0.0f);
  Vec xc = x;
  xc[5] = 0.3f;  // finite differences only away from 0
  Vec dxc(n);
  be->relu_backward(f32(dxc), f32(xc), f32(Rw));
  auto relu_loss = [&] {
    Vec o(n);
    be->relu_forward(f32(o), f32(xc));
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dxc, numeric_grad(xc, relu_loss, 1e-2f)), 5e-5);  // |x| >= 0.05 > h: no kink crossed
  // mul's gradients are two more products: da = dout * b, db = dout * a
  be->mul(f32(da), f32(Rw), f32(y));
  be->mul(f32(db), f32(Rw), f32(x));
  auto mul_loss = [&] {
    Vec o(n);
    be->mul(f32(o), f32(x), f32(y));
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(da, numeric_grad(x, mul_loss, 1e-2f)), 1e-5);
  EXPECT_LT(rel_err(db, numeric_grad(y, mul_loss, 1e-2f)), 1e-5);
  // aliasing: relu_backward in place on dout, mul in place on a
  Vec d = Rw;
  be->relu_backward(f32(d), f32(x), f32(d));
  EXPECT_EQ(d, dx);
  Vec a = x;
  be->mul(f32(a), f32(a), f32(y));
  EXPECT_EQ(a, m);
}

TEST_F(Kernels, PositionBiasForwardAndGradient) {
  // By relative position: P = Tq + Tk - 1 = 9 entries o = j - i + Tq - 1 per head.
  const int64_t NB = 5, H = 3, Tq = 4, Tk = 6, P = relative_positions(Tq, Tk);
  ASSERT_EQ(P, 9);
  const Tokens buckets = {3, 2, 1, 0, 4, 4, 1, 2, 3};
  // table[nb, h] = 10 nb + h: bias[h, o] = 10 buckets[o] + h
  Vec table(NB * H);
  for (int64_t nb = 0; nb < NB; ++nb) {
    for (int64_t h = 0; h < H; ++h) table[nb * H + h] = static_cast<float>(10 * nb + h);
  }
  Vec bias(H * P, std::numeric_limits<float>::quiet_NaN());
  be->position_bias_forward(f32(bias), f32(table), i32(buckets), H, Tq, Tk);
  EXPECT_EQ(bias, (Vec{30, 20, 10, 0, 40, 40, 10, 20, 30,    // h = 0
                       31, 21, 11, 1, 41, 41, 11, 21, 31,    // h = 1
                       32, 22, 12, 2, 42, 42, 12, 22, 32}));  // h = 2
  // dbias[h, o] = 100 h + o: dtable[nb, h] += the sum over the o with buckets[o] == nb
  Vec db(H * P), dtable(NB * H, 0.5f);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t o = 0; o < P; ++o) db[h * P + o] = static_cast<float>(100 * h + o);
  }
  be->position_bias_backward(f32(dtable), f32(db), i32(buckets), H, Tq, Tk);
  // bucket 0: o = 3; 1: o = 2, 6; 2: o = 1, 7; 3: o = 0, 8; 4: o = 4, 5
  const int64_t count[NB] = {1, 2, 2, 2, 2}, osum[NB] = {3, 8, 8, 8, 9};
  for (int64_t nb = 0; nb < NB; ++nb) {
    for (int64_t h = 0; h < H; ++h) {
      EXPECT_EQ(dtable[nb * H + h], 0.5f + static_cast<float>(100 * h * count[nb] + osum[nb]))
          << "bucket " << nb << " head " << h;
    }
  }
  // random table and dbias: finite differences, and each entry the sum of dbias over the
  // relative positions of its bucket
  table = random_vec(NB * H, rng);
  const Vec Rw = random_vec(H * P, rng);
  auto loss = [&] {
    Vec b(H * P);
    be->position_bias_forward(f32(b), f32(table), i32(buckets), H, Tq, Tk);
    return dot(b, Rw);
  };
  dtable.assign(NB * H, -1.0f);
  be->position_bias_backward(f32(dtable), f32(Rw), i32(buckets), H, Tq, Tk);
  for (auto& g : dtable) g += 1.0f;
  EXPECT_LT(rel_err(dtable, numeric_grad(table, loss, 1e-2f)), 2e-5);
  for (int64_t nb = 0; nb < NB; ++nb) {
    for (int64_t h = 0; h < H; ++h) {
      double s = 0.0;
      for (int64_t o = 0; o < P; ++o) {
        if (buckets[o] == nb) s += Rw[h * P + o];
      }
      EXPECT_NEAR(dtable[nb * H + h], s, 1e-5);
    }
  }
  Tokens bad = buckets;
  bad[7] = NB;
  EXPECT_THROW(be->position_bias_forward(f32(bias), f32(table), i32(bad), H, Tq, Tk), Error);
  EXPECT_THROW(be->position_bias_backward(f32(dtable), f32(Rw), i32(bad), H, Tq, Tk), Error);
  // buckets and bias sized [P] and [H,P]: one element short throws
  const Tokens short_b(buckets.begin(), buckets.end() - 1);
  EXPECT_THROW(be->position_bias_forward(f32(bias), f32(table), i32(short_b), H, Tq, Tk), Error);
  EXPECT_THROW(be->position_bias_forward(f32(bias).slice(0, H * P - 1), f32(table), i32(buckets),
                                         H, Tq, Tk),
               Error);
}

using test_util::AttnShape;
using MhaShape = AttnShape;

struct MhaCase {
  MhaShape s;
  bool with_bias, with_mask;
};

// Forward against the naive reference (out and lse; the [H,P] bias by relative position
// expanded to its [H,Tq,Tk]); finite-difference check of dq, dk, dv and dbias [H,P] (dbias
// accumulates into a pre-filled buffer); padded keys get zero dk, dv.
void check_mha(Backend& be, std::mt19937& rng, const MhaCase& c) {
  const MhaShape& s = c.s;
  const int64_t HD = s.H * s.D, nq = s.B * s.Tq * HD, nk = s.B * s.Tk * HD;
  const int64_t nl = s.B * s.H * s.Tq, nb = s.H * relative_positions(s.Tq, s.Tk);
  Vec q = random_vec(nq, rng, -1.5f, 1.5f), k = random_vec(nk, rng, -1.5f, 1.5f),
      v = random_vec(nk, rng);
  Vec bias = c.with_bias ? random_vec(nb, rng, -2.0f, 2.0f) : Vec{};
  Tokens mask;
  if (c.with_mask) {
    mask.assign(s.B * s.Tk, 1);
    for (int64_t b = 0; b < s.B; ++b) {  // batch b pads its last b+1 keys
      for (int64_t j = std::max<int64_t>(0, s.Tk - 1 - b); j < s.Tk; ++j) mask[b * s.Tk + j] = 0;
    }
  }
  const TensorView bias_v = c.with_bias ? f32(bias) : TensorView{};
  const TensorView mask_v = c.with_mask ? i32(mask) : TensorView{};
  Vec out(nq, std::numeric_limits<float>::quiet_NaN()), lse(nl, std::numeric_limits<float>::quiet_NaN());
  be.mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), bias_v, mask_v, s.B, s.Tq, s.Tk, s.H,
                 s.D, s.scale, s.causal);
  const test_util::AttnRef ref = test_util::naive_attention(
      s, q, k, v, test_util::expand_rel_bias(bias, s.H, s.Tq, s.Tk), mask);
  for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(out[i], ref.out[i], 3e-6) << i;
  for (int64_t i = 0; i < nl; ++i) ASSERT_NEAR(lse[i], ref.lse[i], 3e-6) << i;
  const Vec Rw = random_vec(nq, rng);
  auto single = make_cpu_backend(1);
  auto loss = [&] {
    Vec o(nq), l(nl);
    single->mha_forward(f32(o), f32(l), f32(q), f32(k), f32(v), c.with_bias ? f32(bias) : TensorView{},
                        mask_v, s.B, s.Tq, s.Tk, s.H, s.D, s.scale, s.causal);
    return dot(o, Rw);
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec dq(nq, nan), dk(nk, nan), dv(nk, nan);
  Vec dbias(nb, 0.75f);
  be.mha_backward(f32(dq), f32(dk), f32(dv), c.with_bias ? f32(dbias) : TensorView{}, f32(Rw),
                  f32(q), f32(k), f32(v), f32(out), f32(lse), bias_v, mask_v, s.B, s.Tq, s.Tk, s.H,
                  s.D, s.scale, s.causal);
  const std::string what = "B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) +
                           " Tk=" + std::to_string(s.Tk) + " H=" + std::to_string(s.H) +
                           " D=" + std::to_string(s.D) + " causal=" + std::to_string(s.causal);
  EXPECT_LT(rel_err(dq, numeric_grad(q, loss, 1e-2f)), 5e-4) << "dq " << what;
  EXPECT_LT(rel_err(dk, numeric_grad(k, loss, 1e-2f)), 5e-4) << "dk " << what;
  EXPECT_LT(rel_err(dv, numeric_grad(v, loss, 1e-2f)), 5e-4) << "dv " << what;
  if (c.with_bias) {
    for (auto& g : dbias) g -= 0.75f;
    EXPECT_LT(rel_err(dbias, numeric_grad(bias, loss, 1e-2f)), 5e-4) << "dbias " << what;
  }
  // padded keys get exactly zero gradients
  if (c.with_mask) {
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t j = 0; j < s.Tk; ++j) {
        if (mask[b * s.Tk + j] != 0) continue;
        for (int64_t e = 0; e < HD; ++e) {
          ASSERT_EQ(dk[(b * s.Tk + j) * HD + e], 0.0f);
          ASSERT_EQ(dv[(b * s.Tk + j) * HD + e], 0.0f);
        }
      }
    }
  }
}

TEST_F(Kernels, MhaSelfAttentionNoBiasNoMask) {
  check_mha(*be, rng, {{2, 5, 5, 2, 4, 0.5f, false}, false, false});
}
TEST_F(Kernels, MhaCausalWithBiasScaleOne) {  // T5 decoder self-attention: scale 1, bias
  check_mha(*be, rng, {{2, 6, 6, 3, 5, 1.0f, true}, true, false});
}
TEST_F(Kernels, MhaCrossAttentionMaskedTqNeTk) {  // T5 encoder-decoder attention
  check_mha(*be, rng, {{3, 4, 7, 2, 3, 1.0f, false}, false, true});
}
TEST_F(Kernels, MhaEncoderBiasAndMask) {
  check_mha(*be, rng, {{2, 5, 5, 2, 6, 1.0f, false}, true, true});
}
TEST_F(Kernels, MhaCausalTqNeTkBiasMask) {  // j > i masked with Tq != Tk
  check_mha(*be, rng, {{2, 6, 4, 2, 3, 0.7f, true}, true, true});
}
TEST_F(Kernels, MhaAcrossKeyTilesGradientCheck) {  // 2 query and 2 key tiles of 64
  check_mha(*be, rng, {{1, 66, 67, 1, 2, 1.0f, true}, true, true});
}

TEST_F(Kernels, MhaPaddedKeysDoNotMatterAndFullyMaskedRowIsZero) {
  const MhaShape s{2, 3, 5, 2, 4, 1.0f, false};
  const int64_t HD = s.H * s.D, nq = s.B * s.Tq * HD, nk = s.B * s.Tk * HD;
  const int64_t nl = s.B * s.H * s.Tq;
  const Vec q = random_vec(nq, rng);
  Vec k = random_vec(nk, rng), v = random_vec(nk, rng);
  const int64_t P = relative_positions(s.Tq, s.Tk);  // 7
  const Vec bias = random_vec(s.H * P, rng);
  // batch 0: keys 3, 4 padded; batch 1: every key padded
  Tokens mask = {1, 1, 1, 0, 0, 0, 0, 0, 0, 0};
  Vec out1(nq), lse1(nl), out2(nq), lse2(nl);
  be->mha_forward(f32(out1), f32(lse1), f32(q), f32(k), f32(v), f32(bias), i32(mask), s.B, s.Tq,
                  s.Tk, s.H, s.D, s.scale, s.causal);
  const Vec dout = random_vec(nq, rng);
  auto grads = [&](const Vec& out, const Vec& lse) {
    std::vector<Vec> g = {Vec(nq), Vec(nk), Vec(nk), Vec(s.H * P, 0.0f)};
    be->mha_backward(f32(g[0]), f32(g[1]), f32(g[2]), f32(g[3]), f32(dout), f32(q), f32(k), f32(v),
                     f32(out), f32(lse), f32(bias), i32(mask), s.B, s.Tq, s.Tk, s.H, s.D, s.scale,
                     s.causal);
    return g;
  };
  const std::vector<Vec> g1 = grads(out1, lse1);
  // other (finite, large) values in the padded keys and values: identical results
  for (int64_t j : {3, 4}) {
    for (int64_t e = 0; e < HD; ++e) {
      k[j * HD + e] = 1e3f * (e + 1);
      v[j * HD + e] = -7e2f;
    }
  }
  for (int64_t i = s.Tk * HD; i < nk; ++i) k[i] = v[i] = 50.0f;
  be->mha_forward(f32(out2), f32(lse2), f32(q), f32(k), f32(v), f32(bias), i32(mask), s.B, s.Tq,
                  s.Tk, s.H, s.D, s.scale, s.causal);
  EXPECT_EQ(out1, out2);
  EXPECT_EQ(lse1, lse2);
  const std::vector<Vec> g2 = grads(out2, lse2);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(g1[i], g2[i]) << "gradient " << i;
  // batch 1: output 0, lse +inf, and zero gradients
  for (int64_t i = s.Tq * HD; i < nq; ++i) ASSERT_EQ(out1[i], 0.0f);
  for (int64_t i = s.H * s.Tq; i < nl; ++i) ASSERT_EQ(lse1[i], std::numeric_limits<float>::infinity());
  for (int64_t i = s.Tq * HD; i < nq; ++i) ASSERT_EQ(g1[0][i], 0.0f);
  for (int64_t i = s.Tk * HD; i < nk; ++i) ASSERT_EQ(g1[1][i] + g1[2][i], 0.0f);
  // dbias of relative positions whose keys are all padded is 0 (batch 1 contributes
  // nothing): j - i >= 3, i.e. o = j - i + Tq - 1 >= 5, has j >= 3 for every query i
  for (int64_t h = 0; h < s.H; ++h) {
    for (int64_t o = 5; o < P; ++o) EXPECT_EQ(g1[3][h * P + o], 0.0f) << o;
    EXPECT_NE(g1[3][h * P + 4], 0.0f);  // (i, j) = (0, 2) is a key of batch 0
  }
}

// Empty lengths (kernels.hpp: Tk == 0 is allowed): no queries leave every key's dk, dv zero;
// no keys give out 0, lse +inf and dq 0; dbias ([H, 0]) is untouched. Causal with keys past
// the last query: those keys get zero dk, dv.
TEST_F(Kernels, MhaEmptyLengthsAndUnseenKeysGiveZeroGradients) {
  const int64_t B = 2, H = 2, D = 3;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  {  // Tq = 0, Tk = 5
    const int64_t Tk = 5, nk = B * Tk * H * D;
    const Vec k = random_vec(nk, rng), v = random_vec(nk, rng);
    Vec none, dk(nk, nan), dv(nk, nan);
    be->mha_backward(f32(none), f32(dk), f32(dv), TensorView{}, f32(none), f32(none), f32(k),
                     f32(v), f32(none), f32(none), TensorView{}, TensorView{}, B, 0, Tk, H, D,
                     1.0f, false);
    for (int64_t i = 0; i < nk; ++i) ASSERT_EQ(dk[i], 0.0f) << i;
    for (int64_t i = 0; i < nk; ++i) ASSERT_EQ(dv[i], 0.0f) << i;
  }
  {  // Tq = 4, Tk = 0
    const int64_t Tq = 4, nq = B * Tq * H * D, nl = B * H * Tq;
    const Vec q = random_vec(nq, rng), dout = random_vec(nq, rng);
    Vec none, out(nq, nan), lse(nl, nan), dq(nq, nan);
    be->mha_forward(f32(out), f32(lse), f32(q), f32(none), f32(none), TensorView{}, TensorView{},
                    B, Tq, 0, H, D, 1.0f, false);
    for (int64_t i = 0; i < nq; ++i) ASSERT_EQ(out[i], 0.0f) << i;
    for (int64_t i = 0; i < nl; ++i) ASSERT_EQ(lse[i], std::numeric_limits<float>::infinity());
    be->mha_backward(f32(dq), f32(none), f32(none), TensorView{}, f32(dout), f32(q), f32(none),
                     f32(none), f32(out), f32(lse), TensorView{}, TensorView{}, B, Tq, 0, H, D,
                     1.0f, false);
    for (int64_t i = 0; i < nq; ++i) ASSERT_EQ(dq[i], 0.0f) << i;
  }
  {  // causal, Tq = 3 queries, Tk = 9 keys: keys 3..8 are seen by no query
    const int64_t Tq = 3, Tk = 9, nq = B * Tq * H * D, nk = B * Tk * H * D, nl = B * H * Tq;
    const Vec q = random_vec(nq, rng), k = random_vec(nk, rng), v = random_vec(nk, rng),
              dout = random_vec(nq, rng);
    Vec out(nq), lse(nl), dq(nq, nan), dk(nk, nan), dv(nk, nan);
    be->mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), TensorView{}, TensorView{}, B, Tq,
                    Tk, H, D, 1.0f, true);
    be->mha_backward(f32(dq), f32(dk), f32(dv), TensorView{}, f32(dout), f32(q), f32(k), f32(v),
                     f32(out), f32(lse), TensorView{}, TensorView{}, B, Tq, Tk, H, D, 1.0f, true);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < Tk; ++j) {
        for (int64_t e = 0; e < H * D; ++e) {
          const int64_t i = (b * Tk + j) * H * D + e;
          if (j >= Tq) {
            ASSERT_EQ(dk[i], 0.0f) << "b " << b << " key " << j;
            ASSERT_EQ(dv[i], 0.0f) << "b " << b << " key " << j;
          } else {
            ASSERT_TRUE(std::isfinite(dk[i]) && std::isfinite(dv[i]));
          }
        }
      }
    }
  }
}

TEST_F(Kernels, MhaCausalRowZeroSeesOnlyKeyZeroAndScaleMatters) {
  const Vec q = {1, 2, 3, 4, 5, 6}, k = {0.5f, -1, 2, 0.25f, -0.5f, 1}, v = {1, 2, 3, 4, 5, 6};
  Vec out(6), lse(3);
  be->mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), TensorView{}, TensorView{}, 1, 3, 3,
                  1, 2, 1.0f, true);
  EXPECT_EQ(out[0], 1.0f);  // row 0: only key 0, probability exactly 1
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_FLOAT_EQ(lse[0], 1 * 0.5f + 2 * -1.0f);
  // row 1 by hand: s = [q1.k0, q1.k1] * scale, scale 1 (T5) vs 1/sqrt(2)
  for (float sc : {1.0f, 0.70710678f}) {
    be->mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), TensorView{}, TensorView{}, 1, 3,
                    3, 1, 2, sc, true);
    const double s0 = sc * (3 * 0.5 + 4 * -1.0), s1 = sc * (3 * 2.0 + 4 * 0.25);
    const double p0 = 1.0 / (1.0 + std::exp(s1 - s0));
    EXPECT_NEAR(out[2], p0 * 1 + (1 - p0) * 3, 1e-5) << sc;
    EXPECT_NEAR(out[3], p0 * 2 + (1 - p0) * 4, 1e-5) << sc;
    EXPECT_NEAR(lse[1], std::log(std::exp(s0) + std::exp(s1)), 1e-5) << sc;
  }
}

// ---------------------------------------------------------------------------------------
// determinism: results must not depend on the number of threads

TEST_F(Kernels, ResultsIndependentOfThreadCount) {
  auto one = make_cpu_backend(1);
  const int64_t R = 512, C = 96, V = 40, T = 64;
  Vec x = random_vec(R * C, rng), w = random_vec(C, rng), b = random_vec(C, rng);
  Vec dout = random_vec(R * C, rng);
  Vec mean(R), rstd(R), out(R * C);
  be->layernorm_forward(f32(out), f32(mean), f32(rstd), f32(x), f32(w), f32(b), R, C, 1e-5f);
  Vec dx1(R * C, 0.0f), dw1(C, 0.0f), db1(C, 0.0f), dx2 = dx1, dw2 = dw1, db2 = db1;
  one->layernorm_backward(f32(dx1), f32(dw1), f32(db1), f32(dout), f32(x), f32(w), f32(mean),
                          f32(rstd), R, C);
  be->layernorm_backward(f32(dx2), f32(dw2), f32(db2), f32(dout), f32(x), f32(w), f32(mean),
                         f32(rstd), R, C);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(db1, db2);
  be->rmsnorm_forward(f32(out), f32(rstd), f32(x), f32(w), R, C, 1e-6f);
  Vec rx1(R * C, 0.0f), rw1(C, 0.0f), rx2 = rx1, rw2 = rw1;
  one->rmsnorm_backward(f32(rx1), f32(rw1), f32(dout), f32(x), f32(w), f32(rstd), R, C);
  be->rmsnorm_backward(f32(rx2), f32(rw2), f32(dout), f32(x), f32(w), f32(rstd), R, C);
  EXPECT_EQ(rx1, rx2);
  EXPECT_EQ(rw1, rw2);
  Tokens tokens(R);
  for (int64_t i = 0; i < R; ++i) tokens[i] = static_cast<int32_t>((i * 13) % V);
  Vec e1(V * C, 0.0f), p1(T * C, 0.0f), e2 = e1, p2 = p1;
  one->embedding_backward(f32(e1), f32(p1), f32(dout), i32(tokens), R / T, T, C);
  be->embedding_backward(f32(e2), f32(p2), f32(dout), i32(tokens), R / T, T, C);
  EXPECT_EQ(e1, e2);
  EXPECT_EQ(p1, p2);
  Vec bb1(C, 0.0f), bb2(C, 0.0f);
  one->bias_backward(f32(bb1), f32(dout), R, C);
  be->bias_backward(f32(bb2), f32(dout), R, C);
  EXPECT_EQ(bb1, bb2);
  Vec l1 = dout, l2 = dout;
  Tokens tg(R * C / V);
  for (std::size_t i = 0; i < tg.size(); ++i) tg[i] = static_cast<int32_t>(i % V);
  const int64_t rows = static_cast<int64_t>(tg.size());
  double c1 = 0.0, c2 = 0.0;
  one->cross_entropy_forward_backward(f64(c1), f32(l1), i32(tg), rows, V, V, 0.5f, 0.f);
  be->cross_entropy_forward_backward(f64(c2), f32(l2), i32(tg), rows, V, V, 0.5f, 0.f);
  EXPECT_EQ(bits(c1), bits(c2));
  EXPECT_EQ(l1, l2);
}

// ---------------------------------------------------------------------------------------
// "store bf16/fp16, compute fp32" (tests/cpu_backend_util.hpp)

TEST_F(Kernels, StoreContractGemm) {
  struct Dims {
    int64_t M, N, K;
  };
  for (DType dt : k16) {
    for (Dims s : {Dims{7, 5, 3}, Dims{301, 70, 200}, Dims{40, 290, 210}}) {
      for (int ta = 0; ta < 2; ++ta) {
        for (int tb = 0; tb < 2; ++tb) {
          for (float beta : {0.0f, 0.3f}) {
            const Vec A = rounded(random_vec(s.M * s.K, rng), dt);
            const Vec B = rounded(random_vec(s.K * s.N, rng), dt);
            // beta == 0: C is garbage (NaN), which must be ignored, not loaded
            const Vec C0 = beta == 0.0f ? Vec(s.M * s.N, std::numeric_limits<float>::quiet_NaN())
                                        : rounded(random_vec(s.M * s.N, rng), dt);
            expect_store_contract(
                dt,
                [&](DType st) {
                  Store a(st, A), b(st, B), c(st, C0);
                  be->gemm(ta, tb, s.M, s.N, s.K, 0.7f, a.view(), b.view(), beta, c.view());
                  return Outputs{{c.values()}, {}, {}};
                },
                "gemm M=" + std::to_string(s.M) + " ta=" + std::to_string(ta) +
                    " tb=" + std::to_string(tb) + " beta=" + std::to_string(beta));
          }
        }
      }
    }
  }
}

TEST_F(Kernels, StoreContractMixedDtypes) {
  // gemm with A bf16, B fp32, C fp16.
  const int64_t M = 33, N = 17, K = 45;
  const Vec A = rounded(random_vec(M * K, rng), DType::bf16), B = random_vec(K * N, rng);
  const Vec C0 = rounded(random_vec(M * N, rng), DType::f16);
  Vec ref = C0;
  be->gemm(false, false, M, N, K, 1.0f, f32(A), f32(B), 1.0f, f32(ref));
  Store a(DType::bf16, A), c(DType::f16, C0);
  be->gemm(false, false, M, N, K, 1.0f, a.view(), f32(B), 1.0f, c.view());
  expect_rounded(DType::f16, ref, c.values(), "mixed gemm");
}


// bias_gelu_forward / gelu_bias_backward give exactly the values of the kernels they fuse
// (add_bias + gelu_forward, gelu_backward + bias_backward), in every storage dtype,
// including out aliasing fc and dfc aliasing dout; R = 1000 takes the threaded paths.
TEST_F(Kernels, BiasGeluEqualsTheKernelsItFuses) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [R, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {300, 96}, {1000, 77}}) {
      SCOPED_TRACE(std::string(to_string(dt)) + " R=" + std::to_string(R) + " C=" + std::to_string(C));
      const Vec fc0 = rounded(random_vec(R * C, rng, -6.0f, 6.0f), dt);
      const Vec b0 = rounded(random_vec(C, rng), dt), d0 = rounded(random_vec(R * C, rng), dt);
      const Vec db0 = rounded(random_vec(C, rng), dt);
      Store fa(dt, fc0), fb(dt, fc0), fcc(dt, fc0), bias(dt, b0);
      Store oa(dt, Vec(R * C, 9.0f)), ob(dt, Vec(R * C, 9.0f));
      be->bias_gelu_forward(oa.view(), fa.view(), bias.view(), R, C);
      be->bias_gelu_forward(fcc.view(), fcc.view(), bias.view(), R, C);  // out aliases fc
      be->add_bias(fb.view(), bias.view(), R, C);
      be->gelu_forward(ob.view(), fb.view());
      expect_rounded(dt, fb.values(), fa.values(), "fc");
      expect_rounded(dt, ob.values(), oa.values(), "out");
      expect_rounded(dt, ob.values(), fcc.values(), "out aliasing fc");

      Store ga(dt, d0), gb(dt, d0), dout(dt, d0), gc(dt, Vec(R * C, 9.0f));
      Store dba(dt, db0), dbb(dt, db0), dbc(dt, db0);
      be->gelu_bias_backward(ga.view(), dba.view(), fa.view(), ga.view(), R, C);  // dfc = dout
      be->gelu_bias_backward(gc.view(), dbc.view(), fa.view(), dout.view(), R, C);
      be->gelu_backward(gb.view(), fb.view(), gb.view());
      be->bias_backward(dbb.view(), gb.view(), R, C);
      expect_rounded(dt, gb.values(), ga.values(), "dfc aliasing dout");
      expect_rounded(dt, gb.values(), gc.values(), "dfc");
      expect_rounded(dt, dbb.values(), dba.values(), "dbias");
      expect_rounded(dt, dbb.values(), dbc.values(), "dbias (dfc apart)");
    }
  }
}

// add_bias_residual / add_layernorm_forward / add_rmsnorm_forward give exactly the values of
// the kernels they fuse (add_bias, add, then the norm of h as stored), in every storage dtype,
// with and without the projection bias; R = 1000 takes the threaded paths.
TEST_F(Kernels, ResidualNormsEqualTheKernelsTheyFuse) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const auto& [R, C] : {std::pair<int64_t, int64_t>{1, 1}, {7, 13}, {300, 96}, {1000, 77}}) {
      for (const bool with_bias : {true, false}) {
        SCOPED_TRACE(std::string(to_string(dt)) + " R=" + std::to_string(R) + " C=" +
                     std::to_string(C) + (with_bias ? " proj_bias" : " no proj_bias"));
        const Vec h0 = rounded(random_vec(R * C, rng, -3.0f, 3.0f), dt);
        const Vec x0 = rounded(random_vec(R * C, rng, -3.0f, 3.0f), dt);
        const Vec pb0 = rounded(random_vec(C, rng), dt), w0 = rounded(random_vec(C, rng), dt);
        const Vec b0 = rounded(random_vec(C, rng), dt);
        Store x(dt, x0), pb(dt, pb0), w(dt, w0), b(dt, b0);
        const TensorView bias = with_bias ? pb.view() : TensorView{};
        auto unfused_h = [&](Store& h) {
          if (with_bias) be->add_bias(h.view(), pb.view(), R, C);
          be->add(h.view(), h.view(), x.view());
        };
        Store ha(dt, h0), hb(dt, h0);
        be->add_bias_residual(ha.view(), bias, x.view(), R, C);
        unfused_h(hb);
        expect_rounded(dt, hb.values(), ha.values(), "add_bias_residual");

        Store hl(dt, h0), hu(dt, h0), ol(dt, Vec(R * C, 9.0f)), ou(dt, Vec(R * C, 9.0f));
        Vec ml(R, 9.0f), rl(R, 9.0f), mu(R, 9.0f), ru(R, 9.0f);
        be->add_layernorm_forward(hl.view(), ol.view(), f32(ml), f32(rl), x.view(), bias, w.view(),
                                  b.view(), R, C, 1e-5f);
        unfused_h(hu);
        be->layernorm_forward(ou.view(), f32(mu), f32(ru), hu.view(), w.view(), b.view(), R, C, 1e-5f);
        expect_rounded(dt, hu.values(), hl.values(), "add_layernorm_forward h");
        expect_rounded(dt, ou.values(), ol.values(), "add_layernorm_forward out");
        expect_rounded(DType::f32, mu, ml, "add_layernorm_forward mean");
        expect_rounded(DType::f32, ru, rl, "add_layernorm_forward rstd");

        Store hr(dt, h0), hv(dt, h0), orr(dt, Vec(R * C, 9.0f)), ov(dt, Vec(R * C, 9.0f));
        Vec sr(R, 9.0f), sv(R, 9.0f);
        be->add_rmsnorm_forward(hr.view(), orr.view(), f32(sr), x.view(), bias, w.view(), R, C, 1e-6f);
        unfused_h(hv);
        be->rmsnorm_forward(ov.view(), f32(sv), hv.view(), w.view(), R, C, 1e-6f);
        expect_rounded(dt, hv.values(), hr.values(), "add_rmsnorm_forward h");
        expect_rounded(dt, ov.values(), orr.values(), "add_rmsnorm_forward out");
        expect_rounded(DType::f32, sv, sr, "add_rmsnorm_forward rstd");
      }
    }
  }
  // The residual must be the sum's other operand, not h itself (the CUDA kernel reads both
  // rows into registers; aliasing would hide a stale read), and out distinct from both.
  Vec h(64, 0.5f), o(64, 0.5f), w(8, 1.0f), bb(8, 0.0f), m(8), r(8);
  expect_arg_error([&] { be->add_bias_residual(f32(h), TensorView{}, f32(h), 8, 8); },
                   "add_bias_residual", "h");
  expect_arg_error(
      [&] {
        be->add_layernorm_forward(f32(h), f32(h), f32(m), f32(r), f32(o), TensorView{}, f32(w),
                                  f32(bb), 8, 8, 1e-5f);
      },
      "add_layernorm_forward", "out");
  expect_arg_error(
      [&] { be->add_rmsnorm_forward(f32(h), f32(o), f32(r), f32(o), TensorView{}, f32(w), 8, 8, 1e-6f); },
      "add_rmsnorm_forward", "out");
  expect_arg_error(
      [&] { be->add_rmsnorm_forward(f32(h), f32(o), f32(r), f32(bb), f32(w).slice(0, 7), f32(w), 8, 8, 1e-6f); },
      "add_rmsnorm_forward", "residual");
  expect_arg_error(
      [&] { be->add_layernorm_forward(f32(h), f32(o), f32(m), f32(r), f32(h).slice(0, 0), f32(w).slice(0, 7),
                                      f32(w), f32(bb), 8, 8, 1e-5f); },
      "add_layernorm_forward", "residual");
}

// geglu_forward / geglu_backward give exactly the values of the chain they fuse (T5's
// gated-GELU before: gelu_forward into a gate-typed buffer, mul; mul, mul, gelu_backward),
// in every storage dtype, with dgate aliasing dout; n = 70001 takes the threaded path.
TEST_F(Kernels, GegluEqualsTheKernelsItFuses) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const int64_t n : {int64_t{1}, int64_t{13}, int64_t{70001}}) {
      SCOPED_TRACE(std::string(to_string(dt)) + " n=" + std::to_string(n));
      const Vec g0 = rounded(random_vec(n, rng, -5.0f, 5.0f), dt);
      const Vec u0 = rounded(random_vec(n, rng, -2.0f, 2.0f), dt);
      const Vec d0 = rounded(random_vec(n, rng, -2.0f, 2.0f), dt);
      Store gate(dt, g0), up(dt, u0);
      Store out(dt, Vec(n, 9.0f)), gl(dt, Vec(n, 9.0f)), ref(dt, Vec(n, 9.0f));
      be->geglu_forward(out.view(), gate.view(), up.view());
      be->gelu_forward(gl.view(), gate.view());
      be->mul(ref.view(), gl.view(), up.view());
      expect_rounded(dt, ref.values(), out.values(), "geglu_forward");

      Store dg(dt, d0), du(dt, Vec(n, 9.0f));  // dgate aliases dout
      be->geglu_backward(dg.view(), du.view(), dg.view(), gate.view(), up.view());
      Store rdu(dt, Vec(n, 9.0f)), t(dt, d0);
      be->mul(rdu.view(), t.view(), gl.view());  // d up = d prod * gelu(gate)
      be->mul(t.view(), t.view(), up.view());    // d gelu = d prod * up
      be->gelu_backward(t.view(), gate.view(), t.view());
      expect_rounded(dt, rdu.values(), du.values(), "geglu_backward dup");
      expect_rounded(dt, t.values(), dg.values(), "geglu_backward dgate");
      Store dout(dt, d0), dg2(dt, Vec(n, 9.0f)), du2(dt, Vec(n, 9.0f));
      be->geglu_backward(dg2.view(), du2.view(), dout.view(), gate.view(), up.view());
      expect_rounded(dt, t.values(), dg2.values(), "geglu_backward dgate (dout apart)");
      expect_rounded(dt, dout.values(), rounded(d0, dt), "geglu_backward leaves dout");
    }
  }
  Vec a(64, 0.5f), b(64, 0.5f);
  expect_arg_error([&] { be->geglu_forward(f32(a), f32(b).slice(0, 63), f32(b)); }, "geglu_forward",
                   "gate");
  expect_arg_error([&] { be->geglu_backward(f32(a), f32(b), f32(b), f32(a), f32(a)); },
                   "geglu_backward", "dup");
}

TEST_F(Kernels, StoreContractElementwise) {
  for (DType dt : k16) {
    for (int64_t n : {int64_t{13}, int64_t{70001}}) {  // tail only / threaded
      const Vec a = rounded(random_vec(n, rng), dt), b = rounded(random_vec(n, rng), dt);
      const Vec g = rounded(random_vec(n, rng, -6.0f, 6.0f), dt);
      const std::string sz = " n=" + std::to_string(n);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store o(st, Vec(n, 7.0f)), sa(st, a), sb(st, b);
            be->add(o.view(), sa.view(), sb.view());
            be->add(sa.view(), sa.view(), sb.view());  // out aliases a
            return Outputs{{o.values(), sa.values()}, {}, {}};
          },
          "add" + sz);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, a);
            be->scale(x.view(), 1.3f);
            return Outputs{{x.values()}, {}, {}};
          },
          "scale" + sz);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, g), o(st, Vec(n, 0.0f)), d(st, b), dx(st, Vec(n, 0.0f)), d2(st, b);
            be->gelu_forward(o.view(), x.view());
            be->gelu_backward(dx.view(), x.view(), d.view());
            be->gelu_backward(d2.view(), x.view(), d2.view());  // dx aliases dout
            return Outputs{{o.values(), dx.values(), d2.values()}, {}, {}};
          },
          "gelu" + sz);
    }
    // bias: R=1000, C=77 takes the threaded column chunks
    const int64_t R = 1000, C = 77;
    const Vec out0 = rounded(random_vec(R * C, rng), dt), bias = rounded(random_vec(C, rng), dt);
    const Vec dout = rounded(random_vec(R * C, rng), dt), db0 = rounded(random_vec(C, rng), dt);
    expect_store_contract(
        dt,
        [&](DType st) {
          Store o(st, out0), b(st, bias), d(st, dout), db(st, db0);
          be->add_bias(o.view(), b.view(), R, C);
          be->bias_backward(db.view(), d.view(), R, C);
          return Outputs{{o.values(), db.values()}, {}, {}};
        },
        "add_bias/bias_backward");
  }
}

TEST_F(Kernels, StoreContractEmbedding) {
  const int64_t B = 4, T = 64, C = 96, V = 50, Tmax = 80;  // threaded column chunks
  Tokens tokens(B * T);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 13) % V);
  for (DType dt : k16) {
    const Vec wte = rounded(random_vec(V * C, rng), dt),
              wpe = rounded(random_vec(Tmax * C, rng), dt);
    const Vec dout = rounded(random_vec(B * T * C, rng), dt);
    const Vec dwte0 = rounded(random_vec(V * C, rng), dt),
              dwpe0 = rounded(random_vec(Tmax * C, rng), dt);
    expect_store_contract(
        dt,
        [&](DType st) {
          Store e(st, wte), p(st, wpe), o(st, Vec(B * T * C, 0.0f)), d(st, dout), de(st, dwte0),
              dp(st, dwpe0);
          be->embedding_forward(o.view(), i32(tokens), e.view(), p.view(), B, T, C);
          be->embedding_backward(de.view(), dp.view(), d.view(), i32(tokens), B, T, C);
          return Outputs{{o.values(), de.values(), dp.values()}, {}, {}};
        },
        "embedding");
  }
}

TEST_F(Kernels, StoreContractLayerNorm) {
  const int64_t C = 96;
  for (DType dt : k16) {
    for (int64_t R : {int64_t{10}, int64_t{512}}) {
      const Vec x = rounded(random_vec(R * C, rng, -3.0f, 5.0f), dt);
      const Vec w = rounded(random_vec(C, rng), dt), b = rounded(random_vec(C, rng), dt);
      const Vec dout = rounded(random_vec(R * C, rng), dt),
                dx0 = rounded(random_vec(R * C, rng), dt);
      const Vec dw0 = rounded(random_vec(C, rng), dt), db0 = rounded(random_vec(C, rng), dt);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store sx(st, x), sw(st, w), sb(st, b), o(st, Vec(R * C, 0.0f)), d(st, dout),
                dx(st, dx0), dw(st, dw0), db(st, db0);
            Vec mean(R), rstd(R);
            be->layernorm_forward(o.view(), f32(mean), f32(rstd), sx.view(), sw.view(), sb.view(),
                                  R, C, 1e-5f);
            be->layernorm_backward(dx.view(), dw.view(), db.view(), d.view(), sx.view(), sw.view(),
                                   f32(mean), f32(rstd), R, C);
            return Outputs{{o.values(), dx.values(), dw.values(), db.values()}, {mean, rstd}, {}};
          },
          "layernorm R=" + std::to_string(R));
    }
  }
}

TEST_F(Kernels, StoreContractAttention) {
  struct Dims {
    int64_t B, T, C, H;
  };
  for (DType dt : k16) {
    for (Dims s : {Dims{2, 5, 8, 2}, Dims{1, 70, 16, 2}}) {
      const int64_t nqkv = s.B * s.T * 3 * s.C, nout = s.B * s.T * s.C, nl = s.B * s.H * s.T;
      const Vec qkv = rounded(random_vec(nqkv, rng, -1.5f, 1.5f), dt);
      const Vec dout = rounded(random_vec(nout, rng), dt);
      // backward's out input: the forward output rounded to dt (lse is fp32 either way)
      Vec out(nout), lse(nl);
      be->attention_forward(f32(out), f32(lse), f32(qkv), s.B, s.T, s.C, s.H, TensorView{});
      out = rounded(out, dt);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store q(st, qkv), o(st, Vec(nout, 0.0f)), d(st, dout), o_in(st, out),
                dq(st, Vec(nqkv, 0.0f));
            Vec l(nl);
            be->attention_forward(o.view(), f32(l), q.view(), s.B, s.T, s.C, s.H, TensorView{});
            be->attention_backward(dq.view(), d.view(), q.view(), o_in.view(), f32(lse), s.B, s.T,
                                   s.C, s.H, TensorView{});
            return Outputs{{o.values(), dq.values()}, {l}, {}};
          },
          "attention T=" + std::to_string(s.T));
    }
  }
}

TEST_F(Kernels, StoreContractCrossEntropy) {
  for (DType dt : k16) {
    for (int64_t V : {int64_t{37}, int64_t{5003}}) {  // single / threaded rows
      const int64_t R = 16;
      Vec lg = random_vec(R * V, rng, -8.0f, 8.0f);
      for (int64_t j = 0; j < V; ++j) lg[3 * V + j] += 1000.0f;  // needs max subtraction
      const Vec logits = rounded(lg, dt);
      Tokens targets(R);
      for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 4999) % V);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, logits), y(st, logits);
            double l1 = 0.5, l2 = 0.0;
            be->cross_entropy_forward_backward(f64(l1), x.view(), i32(targets), R, V, V, 0.25f,
                                               0.f);
            be->cross_entropy_forward(f64(l2), y.view(), i32(targets), R, V, V, 0.f);
            return Outputs{{x.values(), y.values()}, {}, {l1, l2}};
          },
          "cross_entropy V=" + std::to_string(V));
    }
  }
}

TEST_F(Kernels, StoreContractT5Kernels) {
  for (DType dt : k16) {
    // embedding lookup (threaded column chunks: N * C >= 2^15)
    {
      const int64_t N = 400, C = 96, V = 50;
      Tokens tokens(N);
      for (int64_t i = 0; i < N; ++i) tokens[i] = static_cast<int32_t>((i * 7) % V);
      const Vec table = rounded(random_vec(V * C, rng), dt), dout = rounded(random_vec(N * C, rng), dt);
      const Vec dt0 = rounded(random_vec(V * C, rng), dt);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store t(st, table), o(st, Vec(N * C, 0.0f)), d(st, dout), g(st, dt0);
            be->embedding_lookup_forward(o.view(), i32(tokens), t.view(), N, C);
            be->embedding_lookup_backward(g.view(), d.view(), i32(tokens), N, C);
            return Outputs{{o.values(), g.values()}, {}, {}};
          },
          "embedding_lookup");
    }
    // RMSNorm
    for (int64_t R : {int64_t{10}, int64_t{512}}) {
      const int64_t C = 96;
      const Vec x = rounded(random_vec(R * C, rng, -3.0f, 5.0f), dt), w = rounded(random_vec(C, rng), dt);
      const Vec dout = rounded(random_vec(R * C, rng), dt), dx0 = rounded(random_vec(R * C, rng), dt);
      const Vec dw0 = rounded(random_vec(C, rng), dt);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store sx(st, x), sw(st, w), o(st, Vec(R * C, 0.0f)), d(st, dout), dx(st, dx0), dw(st, dw0);
            Vec rstd(R);
            be->rmsnorm_forward(o.view(), f32(rstd), sx.view(), sw.view(), R, C, 1e-6f);
            be->rmsnorm_backward(dx.view(), dw.view(), d.view(), sx.view(), sw.view(), f32(rstd), R, C);
            return Outputs{{o.values(), dx.values(), dw.values()}, {rstd}, {}};
          },
          "rmsnorm R=" + std::to_string(R));
    }
    // ReLU, mul (with aliasing)
    for (int64_t n : {int64_t{13}, int64_t{70001}}) {
      const Vec a = rounded(random_vec(n, rng, -2.0f, 2.0f), dt), b = rounded(random_vec(n, rng), dt);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store x(st, a), y(st, b), o(st, Vec(n, 1.0f)), dx(st, Vec(n, 1.0f)), d2(st, b),
                m(st, Vec(n, 1.0f)), ma(st, a);
            be->relu_forward(o.view(), x.view());
            be->relu_backward(dx.view(), x.view(), y.view());
            be->relu_backward(d2.view(), x.view(), d2.view());
            be->mul(m.view(), x.view(), y.view());
            be->mul(ma.view(), ma.view(), y.view());
            return Outputs{{o.values(), dx.values(), d2.values(), m.values(), ma.values()}, {}, {}};
          },
          "relu/mul n=" + std::to_string(n));
    }
    // position bias: 16-bit table, fp32 bias
    {
      const int64_t NB = 32, H = 4, Tq = 20, Tk = 30, P = relative_positions(Tq, Tk);
      Tokens buckets(P);
      for (int64_t i = 0; i < P; ++i) buckets[i] = static_cast<int32_t>((i * 5) % NB);
      const Vec table = rounded(random_vec(NB * H, rng), dt), dt0 = rounded(random_vec(NB * H, rng), dt);
      const Vec dbias = random_vec(H * P, rng);
      expect_store_contract(
          dt,
          [&](DType st) {
            Store t(st, table), g(st, dt0);
            Vec bias(H * P);
            be->position_bias_forward(f32(bias), t.view(), i32(buckets), H, Tq, Tk);
            be->position_bias_backward(g.view(), f32(dbias), i32(buckets), H, Tq, Tk);
            return Outputs{{g.values()}, {bias}, {}};
          },
          "position_bias");
    }
    // mha with bias, mask, causal
    {
      const int64_t B = 2, Tq = 9, Tk = 11, H = 2, D = 5, HD = H * D;
      const int64_t nq = B * Tq * HD, nk = B * Tk * HD, nl = B * H * Tq;
      const int64_t P = relative_positions(Tq, Tk);
      const Vec q = rounded(random_vec(nq, rng, -1.5f, 1.5f), dt), k = rounded(random_vec(nk, rng), dt),
                v = rounded(random_vec(nk, rng), dt), dout = rounded(random_vec(nq, rng), dt);
      const Vec bias = random_vec(H * P, rng);
      Tokens mask(B * Tk, 1);
      mask[Tk + 9] = mask[Tk + 10] = 0;
      for (bool causal : {false, true}) {
        Vec lse(nl), out(nq);
        be->mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), f32(bias), i32(mask), B, Tq, Tk,
                        H, D, 1.0f, causal);
        out = rounded(out, dt);
        expect_store_contract(
            dt,
            [&](DType st) {
              Store sq(st, q), sk(st, k), sv(st, v), o(st, Vec(nq, 0.0f)), d(st, dout),
                  o_in(st, out), dq(st, Vec(nq, 0.0f)), dk(st, Vec(nk, 0.0f)),
                  dv(st, Vec(nk, 0.0f));
              Vec l(nl), dbias(H * P, 0.5f);
              be->mha_forward(o.view(), f32(l), sq.view(), sk.view(), sv.view(), f32(bias),
                              i32(mask), B, Tq, Tk, H, D, 1.0f, causal);
              be->mha_backward(dq.view(), dk.view(), dv.view(), f32(dbias), d.view(), sq.view(),
                               sk.view(), sv.view(), o_in.view(), f32(lse), f32(bias), i32(mask), B,
                               Tq, Tk, H, D, 1.0f, causal);
              return Outputs{{o.values(), dq.values(), dk.values(), dv.values()}, {l, dbias}, {}};
            },
            std::string("mha causal=") + (causal ? "1" : "0"));
      }
    }
  }
}

TEST_F(Kernels, MhaBf16StorageWithinTolerance) {
  // bf16 storage of q, k, v, out vs the fp32 kernel on the unrounded inputs. Inputs carry a
  // relative rounding of 2^-9, the scores (|s| <~ 5) an absolute error ~2e-2, and the stored
  // results another 2^-9: |bf16 - fp32| <= 3e-2 elementwise (values are O(1)).
  const int64_t B = 2, Tq = 8, Tk = 10, H = 2, D = 6, HD = H * D;
  const int64_t nq = B * Tq * HD, nk = B * Tk * HD, nl = B * H * Tq;
  const Vec q = random_vec(nq, rng), k = random_vec(nk, rng), v = random_vec(nk, rng);
  const int64_t P = relative_positions(Tq, Tk);
  const Vec bias = random_vec(H * P, rng), dout = random_vec(nq, rng);
  Tokens mask(B * Tk, 1);
  mask[Tk + 8] = mask[Tk + 9] = 0;
  Vec out(nq), lse(nl), dq(nq), dk(nk), dv(nk), db32(H * P, 0.0f);
  be->mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), f32(bias), i32(mask), B, Tq, Tk, H, D,
                  1.0f, true);
  be->mha_backward(f32(dq), f32(dk), f32(dv), f32(db32), f32(dout), f32(q), f32(k), f32(v),
                   f32(out), f32(lse), f32(bias), i32(mask), B, Tq, Tk, H, D, 1.0f, true);
  Store sq(DType::bf16, q), sk(DType::bf16, k), sv(DType::bf16, v), so(DType::bf16, Vec(nq)),
      sd(DType::bf16, dout), gq(DType::bf16, Vec(nq)), gk(DType::bf16, Vec(nk)),
      gv(DType::bf16, Vec(nk));
  Vec l16(nl), db16(H * P, 0.0f);
  be->mha_forward(so.view(), f32(l16), sq.view(), sk.view(), sv.view(), f32(bias), i32(mask), B,
                  Tq, Tk, H, D, 1.0f, true);
  be->mha_backward(gq.view(), gk.view(), gv.view(), f32(db16), sd.view(), sq.view(), sk.view(),
                   sv.view(), so.view(), f32(l16), f32(bias), i32(mask), B, Tq, Tk, H, D, 1.0f, true);
  const std::pair<const char*, std::pair<Vec, Vec>> pairs[] = {
      {"out", {out, so.values()}}, {"lse", {lse, l16}},        {"dq", {dq, gq.values()}},
      {"dk", {dk, gk.values()}},   {"dv", {dv, gv.values()}}, {"dbias", {db32, db16}}};
  for (const auto& [name, p] : pairs) {
    double worst = 0.0;
    for (std::size_t i = 0; i < p.first.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(p.first[i] - p.second[i])));
    }
    EXPECT_LE(worst, 3e-2) << name;
  }
  // padded keys: exactly zero gradients in bf16 too
  const Vec k16 = gk.values(), v16 = gv.values();
  for (int64_t j : {Tk + 8, Tk + 9}) {
    for (int64_t e = 0; e < HD; ++e) {
      ASSERT_EQ(k16[j * HD + e], 0.0f);
      ASSERT_EQ(v16[j * HD + e], 0.0f);
    }
  }
}

TEST_F(Kernels, CrossEntropyIgnoreIndexRows) {
  const int64_t R = 6, V = 9;
  const Vec logits = random_vec(R * V, rng, -3.0f, 3.0f);
  const Tokens targets = {2, kIgnoreIndex, 0, 8, kIgnoreIndex, 4};
  // reference: the loss and gradient of the kept rows alone
  Vec kept;
  Tokens kept_t;
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    kept.insert(kept.end(), logits.begin() + r * V, logits.begin() + (r + 1) * V);
    kept_t.push_back(targets[r]);
  }
  const int64_t Rk = static_cast<int64_t>(kept_t.size());
  double ref = 0.0;
  be->cross_entropy_forward_backward(f64(ref), f32(kept), i32(kept_t), Rk, V, V, 0.5f, 0.f);
  double ref_manual = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    if (targets[r] == kIgnoreIndex) continue;
    double mx = -1e300, s = 0.0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[r * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[r * V + j] - mx);
    ref_manual += mx + std::log(s) - logits[r * V + targets[r]];
  }
  EXPECT_NEAR(ref, ref_manual, 1e-5 * ref_manual);
  double loss = 0.0, loss_fwd = 0.0;
  Vec g = logits;
  be->cross_entropy_forward_backward(f64(loss), f32(g), i32(targets), R, V, V, 0.5f, 0.f);
  be->cross_entropy_forward(f64(loss_fwd), f32(logits), i32(targets), R, V, V, 0.f);
  EXPECT_EQ(bits(loss), bits(ref));
  EXPECT_EQ(bits(loss_fwd), bits(ref));
  int64_t k = 0;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t j = 0; j < V; ++j) {
      if (targets[r] == kIgnoreIndex) {
        ASSERT_EQ(bits(g[r * V + j]), 0u) << r;  // +0: a zero gradient row
      } else {
        ASSERT_EQ(g[r * V + j], kept[k * V + j]) << r;
      }
    }
    if (targets[r] != kIgnoreIndex) ++k;
  }
  // every row ignored: zero loss, zero gradient; 16-bit storage too
  const Tokens all_ignored(R, kIgnoreIndex);
  Store x(DType::bf16, logits);
  double l0 = 0.0;
  be->cross_entropy_forward_backward(f64(l0), x.view(), i32(all_ignored), R, V, V, 1.0f, 0.f);
  EXPECT_EQ(l0, 0.0);
  EXPECT_EQ(x.values(), Vec(R * V, 0.0f));
  // other negative targets are still errors
  Vec lg = logits;
  double l1 = 0.0;
  EXPECT_THROW(be->cross_entropy_forward(f64(l1), f32(lg), i32({0, -1, 0, 0, 0, 0}), R, V, V, 0.f),
               Error);
  EXPECT_THROW(
      be->cross_entropy_forward(f64(l1), f32(lg), i32({0, -101, 0, 0, 0, 0}), R, V, V, 0.f), Error);
}


// ---------------------------------------------------------------------------------------
// argument checks (expect_arg_error: tests/cpu_backend_util.hpp)

TEST_F(Kernels, RejectsWrongDtypesAndSmallViews) {
  Vec a(64, 0.5f), b(64, 0.5f), c(64, 0.5f), d(64, 0.5f);
  std::vector<uint16_t> h(64, 0);
  const TensorView bf(h.data(), DType::bf16, {64});
  const Tokens tok(8, 0);
  double s = 0.0;
  auto sv = [&] { return f64(s); };
  expect_arg_error(
      [&] { be->gemm(false, false, 5, 5, 5, 1.0f, f32(a), f32(b), 0.0f, f32(c).slice(0, 24)); },
      "gemm", "C");
  expect_arg_error([&] { be->gemm(false, false, 9, 8, 8, 1.0f, f32(a), f32(b), 0.0f, f32(c)); },
                   "gemm", "A");
  expect_arg_error([&] { be->gemm(false, false, -1, 2, 2, 1.0f, f32(a), f32(b), 0.0f, f32(c)); },
                   "gemm", "M");
  expect_arg_error([&] { be->gemm(false, false, 2, 2, 2, 1.0f, i32(tok), f32(b), 0.0f, f32(c)); },
                   "gemm", "A");
  expect_arg_error([&] { be->add_bias(f32(a), f32(b).slice(0, 7), 8, 8); }, "add_bias", "bias");
  expect_arg_error([&] { be->add(f32(a), f32(b).slice(0, 10), f32(c)); }, "add", "a");
  expect_arg_error(
      [&] {
        be->layernorm_forward(f32(a), bf.slice(0, 8), f32(b), f32(c), f32(d), f32(d), 8, 8, 1e-5f);
      },
      "layernorm_forward", "mean");
  expect_arg_error(
      [&] {
        be->layernorm_backward(f32(a), f32(b), f32(c), f32(d), f32(a), f32(b), f32(c), bf, 8, 8);
      },
      "layernorm_backward", "rstd");
  expect_arg_error(
      [&] { be->attention_backward(f32(a), f32(b), f32(c), f32(d), bf, 1, 2, 4, 2, TensorView{}); },
      "attention_backward", "lse");
  expect_arg_error(
      [&] {
        be->attention_backward(f32(a), f32(b), f32(c), bf.slice(0, 7), f32(d), 1, 2, 4, 2,
                               TensorView{});
      },
      "attention_backward", "out");
  expect_arg_error(
      [&] { be->attention_forward(f32(a), f32(b).slice(0, 3), f32(c), 1, 2, 4, 2, TensorView{}); },
      "attention_forward", "lse");
  expect_arg_error(
      [&] { be->embedding_forward(f32(a), f32(b).slice(0, 8), f32(c), f32(d), 1, 8, 8); },
      "embedding_forward", "tokens");
  expect_arg_error(
      [&] { be->embedding_forward(f32(a), i32(tok), f32(c), f32(d).slice(0, 63), 1, 8, 8); },
      "embedding_forward", "wpe");
  expect_arg_error(
      [&] { be->cross_entropy_forward(f32(a).slice(0, 1), f32(b), i32(tok), 8, 8, 8, 0.f); },
      "cross_entropy_forward", "loss");
  expect_arg_error(
      [&] { be->cross_entropy_forward_backward(sv(), f32(b), i32(tok), 8, 9, 9, 1.0f, 0.f); },
      "cross_entropy_forward_backward", "logits");
  expect_arg_error([&] { be->bias_gelu_forward(f32(a), f32(b), f32(c).slice(0, 7), 8, 8); },
                   "bias_gelu_forward", "bias");
  expect_arg_error([&] { be->bias_gelu_forward(f32(a), i32(tok), f32(c), 2, 4); },
                   "bias_gelu_forward", "fc");
  expect_arg_error([&] { be->gelu_bias_backward(f32(a), f32(b), f32(c).slice(0, 63), f32(a), 8, 8); },
                   "gelu_bias_backward", "fc");
  expect_arg_error([&] { be->gelu_bias_backward(f32(a), sv(), f32(c), f32(a), 8, 8); },
                   "gelu_bias_backward", "dbias");
  // a 16-bit kernel that throws stores nothing (here C % H != 0, found by the fp32 kernel)
  Store out(DType::bf16, Vec(10, 3.0f)), qkv(DType::bf16, Vec(30, 1.0f));
  Vec lse(3, 3.0f);
  EXPECT_THROW(be->attention_forward(out.view(), f32(lse), qkv.view(), 1, 1, 10, 3, TensorView{}),
               Error);
  EXPECT_EQ(out.values(), Vec(10, 3.0f));
  EXPECT_EQ(lse, Vec(3, 3.0f));
  Store logits(DType::f16, Vec(6, 3.0f));
  double loss = 0.0;
  EXPECT_THROW(
      be->cross_entropy_forward_backward(f64(loss), logits.view(), i32({0, 5}), 2, 3, 3, 1.0f, 0.f),
      Error);
  EXPECT_EQ(logits.values(), Vec(6, 3.0f));
  EXPECT_EQ(loss, 0.0);
}

TEST_F(Kernels, T5KernelsRejectWrongDtypesAndSmallViews) {
  Vec a(64, 0.5f), b(64, 0.5f), c(64, 0.5f);
  std::vector<uint16_t> h(64, 0);
  const TensorView bf(h.data(), DType::bf16, {64});
  const Tokens tok(8, 0);
  expect_arg_error([&] { be->embedding_lookup_forward(f32(a), f32(b), f32(c), 8, 8); },
                   "embedding_lookup_forward", "tokens");
  expect_arg_error([&] { be->embedding_lookup_forward(f32(a).slice(0, 63), i32(tok), f32(c), 8, 8); },
                   "embedding_lookup_forward", "out");
  expect_arg_error([&] { be->embedding_lookup_backward(f32(a), f32(b).slice(0, 9), i32(tok), 8, 8); },
                   "embedding_lookup_backward", "dout");
  expect_arg_error([&] { be->rmsnorm_forward(f32(a), bf.slice(0, 8), f32(b), f32(c), 8, 8, 1e-6f); },
                   "rmsnorm_forward", "rstd");
  expect_arg_error(
      [&] { be->rmsnorm_backward(f32(a), f32(b).slice(0, 7), f32(c), f32(a), f32(b), f32(c), 8, 8); },
      "rmsnorm_backward", "dweight");
  expect_arg_error([&] { be->relu_forward(f32(a), f32(b).slice(0, 10)); }, "relu_forward", "x");
  expect_arg_error([&] { be->relu_backward(f32(a), f32(b), i32(Tokens(64))); }, "relu_backward",
                   "dout");
  expect_arg_error([&] { be->mul(f32(a), f32(b), f32(c).slice(0, 3)); }, "mul", "b");
  expect_arg_error([&] { be->position_bias_forward(bf, f32(b), i32(tok), 2, 2, 4); },
                   "position_bias_forward", "bias");
  expect_arg_error([&] { be->position_bias_backward(f32(a), f32(b), f32(c), 2, 2, 4); },
                   "position_bias_backward", "buckets");
  // B*Tq*H*D = 2*3*2*4 = 48; B*H*Tq = 12; H*P = H*(Tq+Tk-1) = 10
  expect_arg_error(
      [&] {
        be->mha_forward(f32(a), f32(b), f32(c).slice(0, 40), f32(c), f32(c), TensorView{},
                        TensorView{}, 2, 3, 3, 2, 4, 1.0f, false);
      },
      "mha_forward", "q");
  expect_arg_error(
      [&] {
        be->mha_forward(f32(a), f32(b), f32(c), f32(c), f32(c), bf, TensorView{}, 2, 3, 3, 2, 4,
                        1.0f, false);
      },
      "mha_forward", "bias");
  expect_arg_error(
      [&] {
        be->mha_forward(f32(a), f32(b), f32(c), f32(c), f32(c), TensorView{}, f32(a), 2, 3, 3, 2, 4,
                        1.0f, false);
      },
      "mha_forward", "key_mask");
  expect_arg_error(
      [&] {
        be->mha_forward(f32(a), f32(b), f32(c), f32(c), f32(c), TensorView{}, TensorView{}, 2, 3, 3,
                        2, -4, 1.0f, false);
      },
      "mha_forward", "D");
  expect_arg_error(
      [&] {
        be->mha_forward(f32(a), bf, f32(c), f32(c), f32(c), TensorView{}, TensorView{}, 2, 3, 3, 2,
                        4, 1.0f, false);
      },
      "mha_forward", "lse");
  expect_arg_error(
      [&] {
        be->mha_backward(f32(a), f32(b), f32(c), TensorView{}, f32(a), f32(b), f32(c), f32(a),
                         f32(b), bf, TensorView{}, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false);
      },
      "mha_backward", "lse");
  expect_arg_error(
      [&] {
        be->mha_backward(f32(a), f32(b), f32(c), f32(a).slice(0, 9), f32(b), f32(a), f32(b), f32(c),
                         f32(a), f32(b), TensorView{}, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false);
      },
      "mha_backward", "dbias");
  expect_arg_error(
      [&] {
        be->mha_backward(f32(a), f32(b), f32(c), TensorView{}, f32(b), f32(a), f32(b), f32(c),
                         f32(a), f32(b), bf, TensorView{}, 2, 3, 3, 2, 4, 1.0f, false);
      },
      "mha_backward", "bias");
}

}  // namespace
}  // namespace fsdp
