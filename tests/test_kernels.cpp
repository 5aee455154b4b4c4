// tests/test_kernels.cpp: the CPU backend's kernels against naive double-precision
// references, finite-difference gradient checks for every kernel with a backward, the
// write-vs-accumulate contract of backend.hpp, optimizer steps against values produced by
// torch.optim (1.13), memory tracking, and independence of results from the thread count.
//
// Gradient checks: for an op out = f(inputs) we take L = sum(out * Rw) with fixed random Rw,
// feed dout = Rw to the backward kernel and compare each analytic input gradient with
// central differences of L (L summed in double, forward in fp32).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using Vec = std::vector<float>;

Vec random_vec(std::size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

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
// memory

TEST_F(Kernels, AllocateIsAlignedAndTracked) {
  MemoryTracker& mem = be->memory();
  void* a = be->allocate(100, MemCategory::activations);
  void* b = be->allocate(1000, MemCategory::grads);
  void* c = be->allocate(0, MemCategory::other);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b) % 64, 0u);
  EXPECT_EQ(mem.current(MemCategory::activations), 100u);
  EXPECT_EQ(mem.current(MemCategory::grads), 1000u);
  EXPECT_EQ(mem.current_total(), 1100u);
  be->fill_zero(b, 1000);
  EXPECT_EQ(static_cast<unsigned char*>(b)[999], 0);
  be->deallocate(a, 100, MemCategory::activations);
  EXPECT_EQ(mem.current(MemCategory::activations), 0u);
  EXPECT_EQ(mem.peak(MemCategory::activations), 100u);
  EXPECT_EQ(mem.current_total(), 1000u);
  EXPECT_EQ(mem.peak_total(), 1100u);
  be->deallocate(b, 1000, MemCategory::grads);
  be->deallocate(c, 0, MemCategory::other);
  be->deallocate(nullptr, 0, MemCategory::other);
  EXPECT_EQ(mem.current_total(), 0u);
  EXPECT_EQ(be->device(), Device::cpu);
}

TEST_F(Kernels, HugeAllocationThrows) {
  EXPECT_THROW(be->allocate(std::size_t{1} << 62, MemCategory::other), Error);
  EXPECT_EQ(be->memory().current_total(), 0u);
}

TEST_F(Kernels, BadThreadCountThrows) { EXPECT_THROW(make_cpu_backend(0), Error); }

TEST_F(Kernels, CopyRoundTrip) {
  Vec src = random_vec(37, rng), mid(37), dst(37);
  be->copy_from_host(mid.data(), src.data(), 37 * sizeof(float));
  be->copy(dst.data(), mid.data(), 37 * sizeof(float));
  Vec host(37);
  be->copy_to_host(host.data(), dst.data(), 37 * sizeof(float));
  be->synchronize();
  EXPECT_EQ(host, src);
}

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
  struct Shape {
    int64_t M, N, K;
  };
  // Small (single-threaded) and large enough to be split over rows / over columns.
  for (Shape s : {Shape{7, 5, 3}, Shape{37, 53, 29}, Shape{301, 70, 200}, Shape{40, 290, 210}}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        Vec A = random_vec(s.M * s.K, rng), B = random_vec(s.K * s.N, rng);
        Vec C = random_vec(s.M * s.N, rng);
        const auto ref = naive_gemm(ta, tb, s.M, s.N, s.K, 0.7f, A, B, 0.3f, C);
        be->gemm(ta, tb, s.M, s.N, s.K, 0.7f, A.data(), B.data(), 0.3f, C.data());
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
    be->gemm(false, false, m, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
    const auto ref = naive_gemm(false, false, m, N, K, 1.0f, A, B, 0.0f, Vec(m * N, 0.0f));
    for (std::size_t i = 0; i < C.size(); ++i) ASSERT_NEAR(C[i], ref[i], 1e-4);
  }
  Vec C(6, std::numeric_limits<float>::quiet_NaN());  // K = 0: C = beta * C, beta 0 -> zeros
  be->gemm(false, false, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, C.data());
  for (float c : C) EXPECT_EQ(c, 0.0f);
}

// A linear layer y = x W^T + b (GPT-2 Conv1D/nn.Linear) and its backward through gemm:
// dx = dy W (written), dW += dy^T x and db += colsum(dy) (accumulated).
TEST_F(Kernels, LinearGradientCheck) {
  const int64_t R = 6, Cin = 5, Cout = 4;
  Vec x = random_vec(R * Cin, rng), W = random_vec(Cout * Cin, rng), b = random_vec(Cout, rng);
  const Vec Rw = random_vec(R * Cout, rng);
  auto forward = [&](Vec& y) {
    be->gemm(false, true, R, Cout, Cin, 1.0f, x.data(), W.data(), 0.0f, y.data());
    be->add_bias(y.data(), b.data(), R, Cout);
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
    for (int64_t c = 0; c < Cout; ++c) EXPECT_NEAR(y[r * Cout + c], yref[r * Cout + c] + b[c], 1e-5);
  }
  Vec dx(R * Cin, 99.0f), dW(Cout * Cin, 0.5f), db(Cout, -0.25f);  // dW, db pre-filled
  be->gemm(false, false, R, Cin, Cout, 1.0f, Rw.data(), W.data(), 0.0f, dx.data());
  be->gemm(true, false, Cout, Cin, R, 1.0f, Rw.data(), x.data(), 1.0f, dW.data());
  be->bias_backward(db.data(), Rw.data(), R, Cout);
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
  be->bias_backward(db.data(), d.data(), R, C);
  for (int64_t c = 0; c < C; ++c) {
    double s = 1.0;
    for (int64_t r = 0; r < R; ++r) s += d[r * C + c];
    EXPECT_NEAR(db[c], s, 1e-4);
  }
}

TEST_F(Kernels, ElementwiseOps) {
  const int64_t n = 70001;  // above the threading threshold, odd length
  Vec a = random_vec(n, rng), b = random_vec(n, rng), out(n);
  be->add(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(out[i], a[i] + b[i]);
  Vec y = a;
  be->axpy(y.data(), -0.5f, b.data(), n);
  for (int64_t i = 0; i < n; i += 997) EXPECT_FLOAT_EQ(y[i], a[i] - 0.5f * b[i]);
  Vec z = a;
  be->scale(z.data(), 3.0f, n);
  for (int64_t i = 0; i < n; i += 997) EXPECT_EQ(z[i], a[i] * 3.0f);
  be->add(a.data(), a.data(), b.data(), 3);  // aliasing out == a
  EXPECT_EQ(a[2], out[2]);
  double ref = 0.0;
  for (float v : b) ref += static_cast<double>(v) * v;
  EXPECT_NEAR(be->squared_norm(b.data(), n), ref, 1e-9 * ref);
  EXPECT_EQ(be->squared_norm(b.data(), 0), 0.0);
}

// ---------------------------------------------------------------------------------------
// embedding

TEST_F(Kernels, EmbeddingForwardAndGradient) {
  const int64_t B = 2, T = 5, C = 8, V = 6, Tmax = 7;
  const std::vector<int32_t> tokens = {3, 1, 3, 0, 5, 3, 3, 2, 1, 0};  // repeated tokens
  Vec wte = random_vec(V * C, rng), wpe = random_vec(Tmax * C, rng);
  const Vec Rw = random_vec(B * T * C, rng);
  Vec out(B * T * C);
  be->embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        EXPECT_EQ(out[(b * T + t) * C + c], wte[tokens[b * T + t] * C + c] + wpe[t * C + c]);
      }
    }
  }
  auto loss = [&] {
    Vec o(B * T * C);
    be->embedding_forward(o.data(), tokens.data(), wte.data(), wpe.data(), B, T, C);
    return dot(o, Rw);
  };
  Vec dwte(V * C, 2.0f), dwpe(Tmax * C, -1.0f);  // pre-filled: backward accumulates
  be->embedding_backward(dwte.data(), dwpe.data(), Rw.data(), tokens.data(), B, T, C);
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

TEST_F(Kernels, EmbeddingRejectsNegativeToken) {
  const std::vector<int32_t> tokens = {0, -1};
  Vec wte(4 * 2), wpe(2 * 2), out(2 * 2);
  EXPECT_THROW(be->embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), 1, 2, 2),
               Error);
}

// ---------------------------------------------------------------------------------------
// LayerNorm

TEST_F(Kernels, LayerNormForwardMatchesFormula) {
  const int64_t R = 7, C = 19;
  const float eps = 1e-5f;
  Vec x = random_vec(R * C, rng, -3.0f, 5.0f), w = random_vec(C, rng), b = random_vec(C, rng);
  Vec out(R * C), mean(R), rstd(R);
  be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R,
                        C, eps);
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
    be->layernorm_forward(o.data(), m.data(), rs.data(), x.data(), w.data(), b.data(), R, C,
                          eps);
    return dot(o, Rw);
  };
  Vec out(R * C), mean(R), rstd(R);
  be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R,
                        C, eps);
  const Vec prefill = random_vec(R * C, rng);
  Vec dx = prefill, dw(C, 1.0f), db(C, 3.0f);
  be->layernorm_backward(dx.data(), dw.data(), db.data(), Rw.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), R, C);
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
  be->gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  for (std::size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(out[i], expect[i], 2e-7 + 2e-7 * std::abs(expect[i])) << "x=" << x[i];
  }
}

TEST_F(Kernels, GeluMatchesReferenceAndGradient) {
  const int64_t n = 1003;  // vector body + tail
  Vec x = random_vec(n, rng, -6.0f, 6.0f), out(n);
  be->gelu_forward(out.data(), x.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], gelu_ref(x[i]), 1e-6 + 1e-6 * std::abs(out[i]));
  // analytic derivative against the double-precision derivative of the reference
  const Vec ones(n, 1.0f);
  Vec dx(n, std::numeric_limits<float>::quiet_NaN());  // written, not accumulated
  be->gelu_backward(dx.data(), x.data(), ones.data(), n);
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
    be->gelu_forward(o.data(), xs.data(), m);
    return dot(o, Rw);
  };
  Vec g(m);
  be->gelu_backward(g.data(), xs.data(), Rw.data(), m);
  EXPECT_LT(rel_err(g, numeric_grad(xs, loss, 1e-2f)), 1e-4);
  // large threaded call agrees with the small path
  const int64_t big = 100003;
  Vec xb = random_vec(big, rng, -8.0f, 8.0f), ob(big);
  be->gelu_forward(ob.data(), xb.data(), big);
  for (int64_t i = 0; i < big; i += 101) ASSERT_NEAR(ob[i], gelu_ref(xb[i]), 1e-6 + 1e-6 * std::abs(ob[i]));
}

// ---------------------------------------------------------------------------------------
// attention

// Naive causal attention in double: out [B,T,C], att [B,H,T,T].
void attention_ref(const Vec& qkv, int64_t B, int64_t T, int64_t C, int64_t H,
                   std::vector<double>& out, std::vector<double>& att) {
  const int64_t hs = C / H;
  out.assign(B * T * C, 0.0);
  att.assign(B * H * T * T, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> s(i + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0.0;
          for (int64_t e = 0; e < hs; ++e) {
            d += static_cast<double>(qkv[(b * T + i) * 3 * C + h * hs + e]) *
                 qkv[(b * T + j) * 3 * C + C + h * hs + e];
          }
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += (s[j] = std::exp(s[j] - mx));
        for (int64_t j = 0; j <= i; ++j) {
          const double p = s[j] / sum;
          att[((b * H + h) * T + i) * T + j] = p;
          for (int64_t e = 0; e < hs; ++e) {
            out[(b * T + i) * C + h * hs + e] += p * qkv[(b * T + j) * 3 * C + 2 * C + h * hs + e];
          }
        }
      }
    }
  }
}

void check_attention(Backend& be, std::mt19937& rng, int64_t B, int64_t T, int64_t C,
                     int64_t H, bool grad_check) {
  Vec qkv = random_vec(B * T * 3 * C, rng, -1.5f, 1.5f);
  Vec out(B * T * C), att(B * H * T * T, std::numeric_limits<float>::quiet_NaN());
  be.attention_forward(out.data(), att.data(), qkv.data(), B, T, C, H);
  std::vector<double> out_ref, att_ref;
  attention_ref(qkv, B, T, C, H, out_ref, att_ref);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], out_ref[i], 2e-6) << i;
  for (std::size_t i = 0; i < att.size(); ++i) ASSERT_NEAR(att[i], att_ref[i], 2e-6) << i;
  // upper triangle exactly zero
  for (int64_t i = 0; i < T; ++i) {
    for (int64_t j = i + 1; j < T; ++j) ASSERT_EQ(att[i * T + j], 0.0f);
  }
  if (!grad_check) return;
  const Vec Rw = random_vec(B * T * C, rng);
  // The thousands of small forwards of the finite differences run on one thread (a fork/join
  // per call is slow on a loaded machine); attention results do not depend on the threads.
  auto single = make_cpu_backend(1);
  auto loss = [&] {
    Vec o(B * T * C), a(B * H * T * T);
    single->attention_forward(o.data(), a.data(), qkv.data(), B, T, C, H);
    return dot(o, Rw);
  };
  Vec dqkv(B * T * 3 * C, std::numeric_limits<float>::quiet_NaN());  // written
  Vec scratch(B * H * T * T, std::numeric_limits<float>::quiet_NaN());
  be.attention_backward(dqkv.data(), scratch.data(), Rw.data(), qkv.data(), att.data(), B, T,
                        C, H);
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
  Vec qkv(3 * 10), out(10), att(4);
  EXPECT_THROW(be->attention_forward(out.data(), att.data(), qkv.data(), 1, 1, 10, 3), Error);
}

// ---------------------------------------------------------------------------------------
// cross-entropy

TEST_F(Kernels, CrossEntropyMatchesLogSumExpAndGradient) {
  const int64_t R = 10, V = 37;
  Vec logits = random_vec(R * V, rng, -4.0f, 4.0f);
  for (int64_t j = 0; j < V; ++j) logits[3 * V + j] += 1000.0f;  // needs max subtraction
  std::vector<int32_t> targets(R);
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
  const double loss = be->cross_entropy_forward(logits.data(), targets.data(), R, V);
  EXPECT_NEAR(loss, ref, 1e-5 * ref);
  EXPECT_EQ(logits, orig);  // forward-only leaves logits unchanged
  const double loss2 = be->cross_entropy_forward_backward(logits.data(), targets.data(), R, V, gs);
  EXPECT_NEAR(loss2, ref, 1e-5 * ref);
  for (int64_t i = 0; i < R * V; ++i) ASSERT_NEAR(logits[i], grad_ref[i], 1e-7);
  // each row of the gradient sums to zero
  for (int64_t r = 0; r < R; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < V; ++j) s += logits[r * V + j];
    EXPECT_NEAR(s, 0.0, 1e-7);
  }
}

TEST_F(Kernels, CrossEntropyGradientCheck) {
  const int64_t R = 10, V = 11;
  Vec logits = random_vec(R * V, rng, -2.0f, 2.0f);
  std::vector<int32_t> targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 3 + 1) % V);
  auto loss = [&] { return be->cross_entropy_forward(logits.data(), targets.data(), R, V); };
  const auto num = numeric_grad(logits, loss, 1e-2f);
  Vec g = logits;
  be->cross_entropy_forward_backward(g.data(), targets.data(), R, V, 1.0f);
  EXPECT_LT(rel_err(g, num), 5e-5);
}

TEST_F(Kernels, CrossEntropyLargeVocabThreaded) {
  const int64_t R = 16, V = 50257;
  Vec logits = random_vec(R * V, rng, -10.0f, 10.0f);
  std::vector<int32_t> targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 4999) % V);
  double ref = 0.0;
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, s = 0.0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, static_cast<double>(logits[r * V + j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(logits[r * V + j] - mx);
    ref += mx + std::log(s) - logits[r * V + targets[r]];
  }
  EXPECT_NEAR(be->cross_entropy_forward(logits.data(), targets.data(), R, V), ref, 1e-6 * ref);
}

TEST_F(Kernels, CrossEntropyRejectsBadTarget) {
  Vec logits(2 * 3, 0.0f);
  const std::vector<int32_t> bad_hi = {0, 3}, bad_lo = {-100, 0};
  EXPECT_THROW(be->cross_entropy_forward(logits.data(), bad_hi.data(), 2, 3), Error);
  EXPECT_THROW(be->cross_entropy_forward_backward(logits.data(), bad_lo.data(), 2, 3, 1.0f),
               Error);
}

// ---------------------------------------------------------------------------------------
// optimizers: expected values from torch 1.13 (torch.optim.AdamW / SGD, fp32) for three
// steps with p0 = [1, -0.5, 0.25, 2] and the gradients below.

const Vec kP0 = {1.0f, -0.5f, 0.25f, 2.0f};
const std::vector<Vec> kGrads = {
    {0.5f, -0.1f, 0.0f, 3.0f}, {-0.2f, 0.3f, 1e-3f, -1.0f}, {0.1f, 0.1f, -2.0f, 0.5f}};

void expect_close(const Vec& got, const Vec& want, double rel, const char* what, int step) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel * std::max(1e-3, std::abs(static_cast<double>(want[i]))))
        << what << " step " << step << " element " << i;
  }
}

TEST_F(Kernels, AdamWMatchesTorch) {
  // lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01
  const std::vector<Vec> p_want = {{0.899000049f, -0.399500012f, 0.249750003f, 1.898f},
                                   {0.863540471f, -0.448519498f, 0.175087631f, 1.85608017f},
                                   {0.824737728f, -0.50376296f, 0.23876515f, 1.81368148f}};
  const std::vector<Vec> m_want = {{0.0500000007f, -0.0100000007f, 0.0f, 0.300000012f},
                                   {0.0249999966f, 0.0210000016f, 0.000100000005f, 0.170000017f},
                                   {0.0324999988f, 0.0289000012f, -0.19991f, 0.203000009f}};
  const std::vector<Vec> v_want = {
      {0.000250000012f, 1.00000007e-05f, 0.0f, 0.00899999961f},
      {0.000289750024f, 9.99900076e-05f, 1.00000019e-09f, 0.00999099948f},
      {0.000299460255f, 0.000109890025f, 0.00400000112f, 0.0102310078f}};
  Vec p = kP0, m(4, 0.0f), v(4, 0.0f);
  for (int s = 0; s < 3; ++s) {
    be->adamw_update(p.data(), kGrads[s].data(), m.data(), v.data(), 4, 0.1f, 0.9f, 0.999f,
                     1e-8f, 0.01f, s + 1);
    expect_close(p, p_want[s], 2e-6, "param", s + 1);
    expect_close(m, m_want[s], 2e-6, "exp_avg", s + 1);
    expect_close(v, v_want[s], 2e-6, "exp_avg_sq", s + 1);
  }
  EXPECT_THROW(be->adamw_update(p.data(), kGrads[0].data(), m.data(), v.data(), 4, 0.1f, 0.9f,
                                0.999f, 1e-8f, 0.01f, 0),
               Error);
}

TEST_F(Kernels, AdamWLargeThreadedMatchesSmall) {
  const int64_t n = 100000;
  Vec p = random_vec(n, rng), g = random_vec(n, rng), m(n, 0.0f), v(n, 0.0f);
  Vec p1(p.begin(), p.begin() + 5), m1(5, 0.0f), v1(5, 0.0f);
  be->adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1);
  be->adamw_update(p1.data(), g.data(), m1.data(), v1.data(), 5, 1e-3f, 0.9f, 0.95f, 1e-8f,
                   0.1f, 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(p[i], p1[i]);
}

TEST_F(Kernels, SgdMatchesTorch) {
  // lr=0.1, momentum=0.9, weight_decay=0.01 (dampening 0, nesterov off)
  const std::vector<Vec> p_want = {{0.949000001f, -0.489499986f, 0.249750003f, 1.69799995f},
                                   {0.922151029f, -0.509560466f, 0.249175251f, 1.52450192f},
                                   {0.887064755f, -0.537105381f, 0.448408812f, 1.3168292f}};
  const std::vector<Vec> buf_want = {{0.50999999f, -0.105000004f, 0.00249999994f, 3.01999998f},
                                     {0.268489987f, 0.200605005f, 0.00574749988f, 1.73497987f},
                                     {0.350862503f, 0.275448889f, -1.99233556f, 2.07672691f}};
  Vec p = kP0, buf(4, 12345.0f);  // garbage: step 1 must set buf = g, not read it
  for (int s = 0; s < 3; ++s) {
    be->sgd_update(p.data(), kGrads[s].data(), buf.data(), 4, 0.1f, 0.9f, 0.01f, s + 1);
    expect_close(p, p_want[s], 2e-6, "param", s + 1);
    expect_close(buf, buf_want[s], 2e-6, "momentum_buffer", s + 1);
  }
  // momentum 0: plain SGD, buffer untouched (may be null)
  const std::vector<Vec> p0_want = {{0.949000001f, -0.489499986f, 0.249750003f, 1.69799995f},
                                    {0.968051016f, -0.519010484f, 0.249400258f, 1.79630196f},
                                    {0.957082987f, -0.528491497f, 0.44915086f, 1.74450564f}};
  Vec q = kP0;
  for (int s = 0; s < 3; ++s) {
    be->sgd_update(q.data(), kGrads[s].data(), nullptr, 4, 0.1f, 0.0f, 0.01f, s + 1);
    expect_close(q, p0_want[s], 2e-6, "param (momentum 0)", s + 1);
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
  be->layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), R,
                        C, 1e-5f);
  Vec dx1(R * C, 0.0f), dw1(C, 0.0f), db1(C, 0.0f), dx2 = dx1, dw2 = dw1, db2 = db1;
  one->layernorm_backward(dx1.data(), dw1.data(), db1.data(), dout.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), R, C);
  be->layernorm_backward(dx2.data(), dw2.data(), db2.data(), dout.data(), x.data(), w.data(),
                         mean.data(), rstd.data(), R, C);
  EXPECT_EQ(dx1, dx2);
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(db1, db2);
  std::vector<int32_t> tokens(R);
  for (int64_t i = 0; i < R; ++i) tokens[i] = static_cast<int32_t>((i * 13) % V);
  Vec e1(V * C, 0.0f), p1(T * C, 0.0f), e2 = e1, p2 = p1;
  one->embedding_backward(e1.data(), p1.data(), dout.data(), tokens.data(), R / T, T, C);
  be->embedding_backward(e2.data(), p2.data(), dout.data(), tokens.data(), R / T, T, C);
  EXPECT_EQ(e1, e2);
  EXPECT_EQ(p1, p2);
  Vec bb1(C, 0.0f), bb2(C, 0.0f);
  one->bias_backward(bb1.data(), dout.data(), R, C);
  be->bias_backward(bb2.data(), dout.data(), R, C);
  EXPECT_EQ(bb1, bb2);
  EXPECT_EQ(one->squared_norm(dout.data(), R * C), be->squared_norm(dout.data(), R * C));
  Vec l1 = dout, l2 = dout;
  std::vector<int32_t> tg(R * C / V);
  for (std::size_t i = 0; i < tg.size(); ++i) tg[i] = static_cast<int32_t>(i % V);
  const int64_t rows = static_cast<int64_t>(tg.size());
  EXPECT_EQ(one->cross_entropy_forward_backward(l1.data(), tg.data(), rows, V, 0.5f),
            be->cross_entropy_forward_backward(l2.data(), tg.data(), rows, V, 0.5f));
  EXPECT_EQ(l1, l2);
}

}  // namespace
}  // namespace fsdp
