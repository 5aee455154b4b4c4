// tests/test_linear_attention.cpp: the CPU backend's Gated DeltaNet kernels (kernels.hpp
// "linear attention"), the pieces of Qwen3-Next / Qwen3.5's linear_attention layers.
//  - causal_conv1d_*: values against a double-precision reference written from HF's
//    conv1d(groups = C, padding = K - 1)[..., :T] then silu; the gradients of x and weight
//    against central differences of that reference; dweight accumulates, dx is written.
//  - gated_delta_rule_*: values against HF's torch_recurrent_gated_delta_rule (with
//    use_qk_l2norm_in_kernel) and Qwen3NextGatedDeltaNet's gates, written out in double;
//    T = 130 crosses the backward's 64-token checkpoints (two full chunks and a short one);
//    grouped heads (Hv = 2 Hk); a gate past torch's softplus threshold. The gradients of qkv,
//    a, b, A_log and dt_bias against central differences of the double reference (L = sum
//    out * R, R fixed random); dA_log / ddt_bias accumulate, the rest are written.
//  - Document masking (doc_start): each packed document equals its run alone, bit for bit.
//  - One thread and three give the same bits; the argument errors name kernel and argument.
//  - sigmoid_gate_*: gated attention's output gate (HF Qwen3NextAttention: attn_output *
//    sigmoid(gate)): values and central-difference gradients of a double reference, in-place
//    forward and aliased backward give the out-of-place bits, 16-bit storage is round_to(the
//    fp32 kernel on the rounded inputs).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using Vec = std::vector<float>;
using DVec = std::vector<double>;

Vec random_vec(std::size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

TensorView f32(const Vec& v) { return {v.data(), DType::f32, {static_cast<int64_t>(v.size())}}; }

template <class A, class B>
double rel_err(const A& got, const B& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - static_cast<double>(want[i]);
    num += d * d;
    den += static_cast<double>(want[i]) * static_cast<double>(want[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

double dot(const DVec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// HF: F.conv1d(x^T, weight [C,1,K], groups = C, padding = K - 1)[..., :T], then silu.
DVec conv_ref(const DVec& x, const DVec& w, int64_t B, int64_t T, int64_t C, int64_t K) {
  DVec out(static_cast<std::size_t>(B * T * C));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t c = 0; c < C; ++c) {
        double acc = 0.0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= 0) acc += w[c * K + j] * x[(b * T + src) * C + c];
        }
        out[(b * T + t) * C + c] = acc * sigmoid(acc);
      }
    }
  }
  return out;
}

struct DeltaShape {
  int64_t B, T, Hk, Hv, Dk, Dv;
  int64_t width() const { return 2 * Hk * Dk + Hv * Dv; }
};

// torch_recurrent_gated_delta_rule(l2norm'd q, k; q / sqrt(Dk)) with Qwen3NextGatedDeltaNet's
// g = -exp(A_log) softplus(a + dt_bias) (softplus threshold 20) and beta = sigmoid(b), in
// double, from zero state.
DVec delta_ref(const DVec& qkv, const DVec& a, const DVec& bg, const DVec& A_log,
               const DVec& dt_bias, const DeltaShape& s) {
  const int64_t W = s.width(), group = s.Hv / s.Hk;
  DVec out(static_cast<std::size_t>(s.B * s.T * s.Hv * s.Dv));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.Hv; ++h) {
      const int64_t kh = h / group;
      DVec S(static_cast<std::size_t>(s.Dk * s.Dv), 0.0), q(s.Dk), k(s.Dk), kv(s.Dv);
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t bt = b * s.T + t;
        const double* row = qkv.data() + bt * W;
        double sq = 0.0, sk = 0.0;
        for (int64_t i = 0; i < s.Dk; ++i) {
          sq += row[kh * s.Dk + i] * row[kh * s.Dk + i];
          sk += row[s.Hk * s.Dk + kh * s.Dk + i] * row[s.Hk * s.Dk + kh * s.Dk + i];
        }
        for (int64_t i = 0; i < s.Dk; ++i) {
          q[i] = row[kh * s.Dk + i] / std::sqrt(sq + 1e-6) / std::sqrt(static_cast<double>(s.Dk));
          k[i] = row[s.Hk * s.Dk + kh * s.Dk + i] / std::sqrt(sk + 1e-6);
        }
        const double x = a[bt * s.Hv + h] + dt_bias[h];
        const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
        const double g = -std::exp(A_log[h]) * sp, beta = sigmoid(bg[bt * s.Hv + h]);
        for (auto& e : S) e *= std::exp(g);
        for (int64_t j = 0; j < s.Dv; ++j) {
          kv[j] = 0.0;
          for (int64_t i = 0; i < s.Dk; ++i) kv[j] += S[i * s.Dv + j] * k[i];
        }
        const double* v = row + 2 * s.Hk * s.Dk + h * s.Dv;
        for (int64_t i = 0; i < s.Dk; ++i) {
          for (int64_t j = 0; j < s.Dv; ++j) S[i * s.Dv + j] += k[i] * (v[j] - kv[j]) * beta;
        }
        for (int64_t j = 0; j < s.Dv; ++j) {
          double o = 0.0;
          for (int64_t i = 0; i < s.Dk; ++i) o += S[i * s.Dv + j] * q[i];
          out[(bt * s.Hv + h) * s.Dv + j] = o;
        }
      }
    }
  }
  return out;
}

DVec to_double(const Vec& v) { return DVec(v.begin(), v.end()); }

// Central differences of loss(x) at the elements `at` of x (a double copy perturbed).
DVec numeric_grad(DVec x, const std::vector<std::size_t>& at, const std::function<double(const DVec&)>& loss,
                  double h) {
  DVec g(at.size());
  for (std::size_t n = 0; n < at.size(); ++n) {
    const double orig = x[at[n]];
    x[at[n]] = orig + h;
    const double plus = loss(x);
    x[at[n]] = orig - h;
    const double minus = loss(x);
    x[at[n]] = orig;
    g[n] = (plus - minus) / (2.0 * h);
  }
  return g;
}

std::vector<std::size_t> all_of(std::size_t n) {
  std::vector<std::size_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = i;
  return v;
}

std::vector<std::size_t> some_of(std::size_t n, std::size_t count, std::mt19937& rng) {
  std::vector<std::size_t> v = all_of(n);
  std::shuffle(v.begin(), v.end(), rng);
  v.resize(std::min(count, n));
  return v;
}

template <class V>
DVec pick(const V& v, const std::vector<std::size_t>& at) {
  DVec r(at.size());
  for (std::size_t n = 0; n < at.size(); ++n) r[n] = v[at[n]];
  return r;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

class LinearAttention : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(3);
  std::mt19937 rng{20261129};
};

TEST_F(LinearAttention, CausalConv1dValuesAndGradientCheck) {
  const int64_t B = 2, T = 9, C = 5, K = 4;  // T > K: full windows and the zero-padded start
  const Vec x = random_vec(B * T * C, rng, -2.0f, 2.0f), w = random_vec(C * K, rng);
  Vec out(B * T * C);
  be->causal_conv1d_forward(f32(out), f32(x), f32(w), B, T, C, K, {});
  const DVec ref = conv_ref(to_double(x), to_double(w), B, T, C, K);
  EXPECT_LT(rel_err(out, ref), 1e-6);
  // The first output reads x[0] alone: silu(w[c, K-1] x[b, 0, c]).
  const double pre = static_cast<double>(w[K - 1]) * x[0];
  EXPECT_NEAR(out[0], pre * sigmoid(pre), 1e-6);

  const Vec R = random_vec(B * T * C, rng);
  Vec dx(B * T * C, 123.0f), dw(C * K, 0.5f);  // dx is written, dw accumulated
  be->causal_conv1d_backward(f32(dx), f32(dw), f32(R), f32(x), f32(w), B, T, C, K, {});
  const DVec xd = to_double(x), wd = to_double(w);
  const DVec ndx = numeric_grad(
      xd, all_of(x.size()), [&](const DVec& xx) { return dot(conv_ref(xx, wd, B, T, C, K), R); },
      1e-6);
  const DVec ndw = numeric_grad(
      wd, all_of(w.size()), [&](const DVec& ww) { return dot(conv_ref(xd, ww, B, T, C, K), R); },
      1e-6);
  EXPECT_LT(rel_err(dx, ndx), 1e-5);
  Vec dw_only(dw.size());
  for (std::size_t i = 0; i < dw.size(); ++i) dw_only[i] = dw[i] - 0.5f;
  EXPECT_LT(rel_err(dw_only, ndw), 1e-5);

  // K = 1 (a per-channel scale) and T < K.
  Vec o1(B * 2 * C);
  be->causal_conv1d_forward(f32(o1), f32(x), f32(w), B, 2, C, 1, {});
  EXPECT_LT(rel_err(o1, conv_ref(xd, DVec(wd.begin(), wd.begin() + C), B, 2, C, 1)), 1e-6);
  Vec o2(B * 2 * C);
  be->causal_conv1d_forward(f32(o2), f32(x), f32(w), B, 2, C, K, {});
  EXPECT_LT(rel_err(o2, conv_ref(xd, wd, B, 2, C, K)), 1e-6);
}

// kernels.hpp's sigmoid_gate_forward in double: out = x sigmoid(gate).
DVec sigmoid_gate_ref(const DVec& x, const DVec& gate) {
  DVec out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = x[i] * sigmoid(gate[i]);
  return out;
}

uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

void expect_same_bits(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(bits(a[i]), bits(b[i])) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

// A vector stored as bf16 or fp16 (rounded to nearest even), read back as fp32.
struct Stored16 {
  DType t;
  std::vector<uint16_t> h;
  Stored16(DType type, const Vec& v) : t(type), h(v.size()) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      h[i] = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
    }
  }
  TensorView view() { return {h.data(), t, {static_cast<int64_t>(h.size())}}; }
  Vec values() const {
    Vec v(h.size());
    for (std::size_t i = 0; i < h.size(); ++i) {
      v[i] = t == DType::bf16 ? bf16_to_f32(h[i]) : f16_to_f32(h[i]);
    }
    return v;
  }
};

Vec rounded(const Vec& v, DType t) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

// Every element of got is round_to(dt, ref[i]), bit for bit.
void expect_rounded(DType dt, const Vec& ref, const Vec& got, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(bits(round_to(dt, ref[i])), bits(got[i]))
        << what << " (" << to_string(dt) << ") element " << i << ": got " << got[i]
        << ", want round_to(" << ref[i] << ")";
  }
}

TEST_F(LinearAttention, SigmoidGateValuesAndGradientCheck) {
  const int64_t n = 1000;
  const Vec x = random_vec(n, rng, -3.0f, 3.0f);
  Vec gate = random_vec(n, rng, -8.0f, 8.0f);
  gate[0] = 0.0f;    // s = 1/2
  gate[1] = 40.0f;   // s = 1: out = x, no gate gradient
  gate[2] = -40.0f;  // s ~ 0: exp(40) stays finite in fp32
  gate[3] = -100.0f;  // exp(100) overflows to inf: s = 0
  const DVec xd = to_double(x), gd = to_double(gate);

  Vec out(n, 7.0f);
  be->sigmoid_gate_forward(f32(out), f32(x), f32(gate));
  const DVec ref = sigmoid_gate_ref(xd, gd);
  EXPECT_LT(rel_err(out, ref), 1e-6);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(out[i], ref[i], 1e-6 * std::abs(ref[i]) + 1e-30) << "element " << i;
  }
  EXPECT_EQ(out[1], x[1]);
  EXPECT_EQ(out[3], 0.0f);

  // L = sum(out * R): dx = R s, dgate = R x s (1 - s). Both are written (not accumulated).
  const Vec R = random_vec(n, rng);
  Vec dx(n, 123.0f), dgate(n, -5.0f);
  be->sigmoid_gate_backward(f32(dx), f32(dgate), f32(R), f32(x), f32(gate));
  const DVec ndx = numeric_grad(
      xd, all_of(n), [&](const DVec& xx) { return dot(sigmoid_gate_ref(xx, gd), R); }, 1e-6);
  const DVec ndg = numeric_grad(
      gd, all_of(n), [&](const DVec& gg) { return dot(sigmoid_gate_ref(xd, gg), R); }, 1e-6);
  EXPECT_LT(rel_err(dx, ndx), 1e-5);
  EXPECT_LT(rel_err(dgate, ndg), 1e-5);
  for (int64_t i = 0; i < n; ++i) {
    const double s = sigmoid(gd[i]);
    ASSERT_NEAR(dx[i], R[i] * s, 1e-6 * std::abs(R[i] * s) + 1e-30) << "dx element " << i;
    // fp32's 1 - s cancels where s is near 1: an absolute error of about an ulp of 1 in s.
    const double want = R[i] * xd[i] * s * (1.0 - s);
    ASSERT_NEAR(dgate[i], want, 1e-5 * std::abs(want) + 1.5e-7 * std::abs(R[i] * xd[i]))
        << "dgate element " << i;
  }
  EXPECT_EQ(dx[0], 0.5f * R[0]);
  EXPECT_EQ(dgate[1], 0.0f);
  EXPECT_EQ(dgate[3], 0.0f);

  // Aliasing: out = x in place; dx = dout and dgate = gate. 70000 elements: several threads.
  const int64_t m = 70000;
  const Vec bx = random_vec(m, rng, -3.0f, 3.0f), bg = random_vec(m, rng, -8.0f, 8.0f),
            bd = random_vec(m, rng);
  Vec bo(m), bdx(m), bdg(m);
  be->sigmoid_gate_forward(f32(bo), f32(bx), f32(bg));
  be->sigmoid_gate_backward(f32(bdx), f32(bdg), f32(bd), f32(bx), f32(bg));
  Vec ip = bx;
  be->sigmoid_gate_forward(f32(ip), f32(ip), f32(bg));
  expect_same_bits(bo, ip, "sigmoid_gate_forward out = x");
  Vec adx = bd, adg = bg;
  be->sigmoid_gate_backward(f32(adx), f32(adg), f32(adx), f32(bx), f32(adg));
  expect_same_bits(bdx, adx, "sigmoid_gate_backward dx = dout");
  expect_same_bits(bdg, adg, "sigmoid_gate_backward dgate = gate");

  // 16-bit storage: round_to(dtype, the fp32 kernel on the rounded inputs), out of place and
  // aliased as above.
  for (DType dt : {DType::bf16, DType::f16}) {
    const Vec rx = rounded(x, dt), rg = rounded(gate, dt), rR = rounded(R, dt);
    Vec ro(n), rdx(n), rdg(n);
    be->sigmoid_gate_forward(f32(ro), f32(rx), f32(rg));
    be->sigmoid_gate_backward(f32(rdx), f32(rdg), f32(rR), f32(rx), f32(rg));
    Stored16 sx(dt, x), sg(dt, gate), sR(dt, R), so(dt, Vec(n)), sdx(dt, Vec(n)),
        sdg(dt, Vec(n));
    be->sigmoid_gate_forward(so.view(), sx.view(), sg.view());
    expect_rounded(dt, ro, so.values(), "sigmoid_gate_forward");
    be->sigmoid_gate_backward(sdx.view(), sdg.view(), sR.view(), sx.view(), sg.view());
    expect_rounded(dt, rdx, sdx.values(), "sigmoid_gate_backward dx");
    expect_rounded(dt, rdg, sdg.values(), "sigmoid_gate_backward dgate");
    Stored16 ix(dt, x);
    be->sigmoid_gate_forward(ix.view(), ix.view(), sg.view());
    expect_rounded(dt, ro, ix.values(), "sigmoid_gate_forward out = x");
    be->sigmoid_gate_backward(sR.view(), sg.view(), sR.view(), sx.view(), sg.view());
    expect_rounded(dt, rdx, sR.values(), "sigmoid_gate_backward dx = dout");
    expect_rounded(dt, rdg, sg.values(), "sigmoid_gate_backward dgate = gate");
  }
  // Mixed storage: bf16 x, fp32 gate, fp32 out.
  {
    const Vec rx = rounded(x, DType::bf16);
    Vec ro(n), mo(n);
    be->sigmoid_gate_forward(f32(ro), f32(rx), f32(gate));
    Stored16 sx(DType::bf16, x);
    be->sigmoid_gate_forward(f32(mo), sx.view(), f32(gate));
    expect_same_bits(ro, mo, "sigmoid_gate_forward bf16 x, fp32 gate and out");
  }

  // Argument errors name the kernel and the argument.
  expect_error([&] { be->sigmoid_gate_forward(f32(gate), f32(x), f32(gate)); },
               {"cpu backend: sigmoid_gate_forward: out overlaps gate"});
  const Vec short_gate(n - 1);
  expect_error([&] { be->sigmoid_gate_forward(f32(out), f32(x), f32(short_gate)); },
               {"sigmoid_gate_forward: gate is fp32 [999] but needs at least 1000 elements"});
  expect_error([&] { be->sigmoid_gate_backward(f32(x), f32(dgate), f32(R), f32(x), f32(gate)); },
               {"cpu backend: sigmoid_gate_backward: dx overlaps x"});
  expect_error([&] { be->sigmoid_gate_backward(f32(dx), f32(R), f32(R), f32(x), f32(gate)); },
               {"sigmoid_gate_backward: dgate overlaps dout"});
  expect_error([&] { be->sigmoid_gate_backward(f32(dx), f32(dx), f32(R), f32(x), f32(gate)); },
               {"sigmoid_gate_backward: dx overlaps dgate"});
  const std::vector<int32_t> ints(n);
  expect_error(
      [&] {
        be->sigmoid_gate_forward(f32(out), TensorView(ints.data(), DType::i32, {n}), f32(gate));
      },
      {"sigmoid_gate_forward: x", "expected fp32, bf16 or fp16"});
}

class GatedDeltaRule : public LinearAttention {
 protected:
  void make(const DeltaShape& s) {
    shape = s;
    qkv = random_vec(s.B * s.T * s.width(), rng, -1.5f, 1.5f);
    a = random_vec(s.B * s.T * s.Hv, rng, -3.0f, 3.0f);
    b = random_vec(s.B * s.T * s.Hv, rng, -3.0f, 3.0f);
    A_log = random_vec(s.Hv, rng, -1.5f, 0.5f);
    dt_bias = random_vec(s.Hv, rng, -1.0f, 1.0f);
  }
  DVec ref() const {
    return delta_ref(to_double(qkv), to_double(a), to_double(b), to_double(A_log),
                     to_double(dt_bias), shape);
  }
  Vec forward() {
    Vec out(shape.B * shape.T * shape.Hv * shape.Dv);
    be->gated_delta_rule_forward(f32(out), f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias),
                                 shape.B, shape.T, shape.Hk, shape.Hv, shape.Dk, shape.Dv, {});
    return out;
  }
  struct Grads {
    Vec dqkv, da, db, dA_log, ddt_bias;
  };
  Grads backward(const Vec& dout, Backend& backend, float fill = 0.0f) {
    const DeltaShape& s = shape;
    Grads g{Vec(qkv.size(), 77.0f), Vec(a.size(), 77.0f), Vec(b.size(), 77.0f),
            Vec(s.Hv, fill), Vec(s.Hv, fill)};
    backend.gated_delta_rule_backward(f32(g.dqkv), f32(g.da), f32(g.db), f32(g.dA_log),
                                      f32(g.ddt_bias), f32(dout), f32(qkv), f32(a), f32(b),
                                      f32(A_log), f32(dt_bias), s.B, s.T, s.Hk, s.Hv, s.Dk, s.Dv, {});
    return g;
  }
  DeltaShape shape{};
  Vec qkv, a, b, A_log, dt_bias;
};

TEST_F(GatedDeltaRule, ForwardIsTheRecurrence) {
  make({2, 130, 2, 4, 8, 6});
  a[5] = 25.0f;  // a + dt_bias past softplus's threshold 20
  const Vec out = forward();
  const DVec want = ref();
  EXPECT_LT(rel_err(out, want), 2e-6);
  // One token alone: S = beta k~ v^T, so out = beta (k~ . q~) v.
  DeltaShape one{1, 1, 1, 1, 4, 3};
  shape = one;
  qkv = {1, 2, 0, -1, /*k*/ 0.5f, 0.5f, 1, 0, /*v*/ 3, -2, 1};
  a = {0.3f};
  b = {0.7f};
  A_log = {0.1f};
  dt_bias = {-0.2f};
  const Vec o = forward();
  const double qn = std::sqrt(6.0 + 1e-6), kn = std::sqrt(1.5 + 1e-6);
  const double qk = (0.5 + 1.0 + 0.0) / (qn * kn) / 2.0;  // q~ . k~, q~ divided by sqrt(4)
  for (int j = 0; j < 3; ++j) EXPECT_NEAR(o[j], sigmoid(0.7) * qk * qkv[8 + j], 1e-6) << j;
}

TEST_F(GatedDeltaRule, GradientCheck) {
  make({2, 130, 2, 4, 8, 6});
  a[7] = 24.0f;  // past softplus's threshold
  const Vec R = random_vec(shape.B * shape.T * shape.Hv * shape.Dv, rng);
  const Grads g = backward(R, *be, 0.25f);
  const DVec xq = to_double(qkv), xa = to_double(a), xb = to_double(b), xA = to_double(A_log),
             xdt = to_double(dt_bias);
  const auto at_q = some_of(qkv.size(), 400, rng);
  const auto at_ab = some_of(a.size(), 150, rng);
  const double h = 1e-6;
  const DVec nq = numeric_grad(
      xq, at_q, [&](const DVec& v) { return dot(delta_ref(v, xa, xb, xA, xdt, shape), R); }, h);
  const DVec na = numeric_grad(
      xa, at_ab, [&](const DVec& v) { return dot(delta_ref(xq, v, xb, xA, xdt, shape), R); }, h);
  const DVec nb = numeric_grad(
      xb, at_ab, [&](const DVec& v) { return dot(delta_ref(xq, xa, v, xA, xdt, shape), R); }, h);
  const DVec nA = numeric_grad(
      xA, all_of(A_log.size()),
      [&](const DVec& v) { return dot(delta_ref(xq, xa, xb, v, xdt, shape), R); }, h);
  const DVec ndt = numeric_grad(
      xdt, all_of(dt_bias.size()),
      [&](const DVec& v) { return dot(delta_ref(xq, xa, xb, xA, v, shape), R); }, h);
  EXPECT_LT(rel_err(pick(g.dqkv, at_q), nq), 1e-4);
  EXPECT_LT(rel_err(pick(g.da, at_ab), na), 1e-4);
  EXPECT_LT(rel_err(pick(g.db, at_ab), nb), 1e-4);
  Vec dA(A_log.size()), ddt(dt_bias.size());
  for (std::size_t i = 0; i < dA.size(); ++i) {
    dA[i] = g.dA_log[i] - 0.25f;  // accumulated onto 0.25
    ddt[i] = g.ddt_bias[i] - 0.25f;
  }
  EXPECT_LT(rel_err(dA, nA), 1e-4);
  EXPECT_LT(rel_err(ddt, ndt), 1e-4);
  // The thresholded gate: d/da of softplus is 1 there, and a contributes to dt_bias too.
  EXPECT_NE(g.da[7], 0.0f);
}

// The q/k gradient of a head shared by a group is the sum over the group's value heads: the
// kernel on Hk = Hv (each head its own q/k copy) gives per-head gradients whose group sums
// equal the grouped run's.
TEST_F(GatedDeltaRule, GroupedHeadsSumTheirGroupsGradients) {
  make({1, 70, 1, 3, 4, 5});
  const Vec R = random_vec(shape.B * shape.T * shape.Hv * shape.Dv, rng);
  const Vec out_g = forward();
  const Grads gg = backward(R, *be);
  // The same problem with the q/k head copied three times.
  const DeltaShape grouped = shape;
  DeltaShape wide = grouped;
  wide.Hk = 3;
  Vec qkv_w(wide.B * wide.T * wide.width());
  for (int64_t t = 0; t < wide.T; ++t) {
    const float* src = &qkv[t * grouped.width()];
    float* dst = &qkv_w[t * wide.width()];
    for (int64_t h = 0; h < 3; ++h) {
      std::copy_n(src, 4, dst + h * 4);          // q
      std::copy_n(src + 4, 4, dst + 12 + h * 4);  // k
    }
    std::copy_n(src + 8, 15, dst + 24);  // v
  }
  qkv.swap(qkv_w);
  shape = wide;
  const Vec out_w = forward();
  const Grads gw = backward(R, *be);
  EXPECT_LT(rel_err(out_w, out_g), 1e-7);
  Vec sum(grouped.T * 8, 0.0f), want(grouped.T * 8);
  for (int64_t t = 0; t < grouped.T; ++t) {
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t i = 0; i < 4; ++i) {
        sum[t * 8 + i] += gw.dqkv[t * wide.width() + h * 4 + i];
        sum[t * 8 + 4 + i] += gw.dqkv[t * wide.width() + 12 + h * 4 + i];
      }
    }
    std::copy_n(&gg.dqkv[t * grouped.width()], 8, &want[t * 8]);
  }
  EXPECT_LT(rel_err(sum, to_double(want)), 1e-5);
  EXPECT_EQ(gw.da, gg.da);
  EXPECT_EQ(gw.db, gg.db);
}

TEST_F(GatedDeltaRule, ThreadsGiveTheSameBits) {
  make({3, 100, 2, 4, 8, 8});
  const Vec R = random_vec(shape.B * shape.T * shape.Hv * shape.Dv, rng);
  const Vec out3 = forward();
  const Grads g3 = backward(R, *be);
  auto one = make_cpu_backend(1);
  Vec out1(out3.size());
  one->gated_delta_rule_forward(f32(out1), f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias),
                                shape.B, shape.T, shape.Hk, shape.Hv, shape.Dk, shape.Dv, {});
  const Grads g1 = backward(R, *one);
  EXPECT_EQ(out1, out3);
  EXPECT_EQ(g1.dqkv, g3.dqkv);
  EXPECT_EQ(g1.da, g3.da);
  EXPECT_EQ(g1.db, g3.db);
  EXPECT_EQ(g1.dA_log, g3.dA_log);
  EXPECT_EQ(g1.ddt_bias, g3.ddt_bias);
  Vec dx1(shape.B * shape.T * 10), dx3(dx1.size()), dw1(40, 0.0f), dw3(40, 0.0f);
  const Vec x = random_vec(dx1.size(), rng), w = random_vec(40, rng);
  one->causal_conv1d_backward(f32(dx1), f32(dw1), f32(x), f32(x), f32(w), shape.B, shape.T, 10, 4, {});
  // (dout = x: a read-only input may be passed twice)
  be->causal_conv1d_backward(f32(dx3), f32(dw3), f32(x), f32(x), f32(w), shape.B, shape.T, 10, 4, {});
  EXPECT_EQ(dx1, dx3);
  EXPECT_EQ(dw1, dw3);
}

// Document masking: a row packing documents (starts 0, 40, 64 = a checkpoint, 100, 149 = a
// one-token document) gives each document's outputs of that document run alone as its own
// row, and gradients that are the sum of the documents' runs (A_log, dt_bias, the conv
// weight) or each document's own (every per-token gradient). An all-zero doc_start is no
// mask, bit for bit.
TEST_F(GatedDeltaRule, DocumentsAreSeparateSequences) {
  const DeltaShape row{1, 150, 2, 4, 8, 6};
  make(row);
  const std::vector<int64_t> starts = {0, 40, 64, 100, 149};
  std::vector<int32_t> doc(row.T);
  for (int64_t t = 0, k = 0; t < row.T; ++t) {
    if (k + 1 < static_cast<int64_t>(starts.size()) && t == starts[k + 1]) ++k;
    doc[t] = static_cast<int32_t>(starts[k]);
  }
  const TensorView ds{doc.data(), DType::i32, {row.T}};
  const int64_t W = row.width(), C = 10, K = 4;
  const Vec R = random_vec(row.T * row.Hv * row.Dv, rng), x = random_vec(row.T * C, rng),
            w = random_vec(C * K, rng), Rc = random_vec(row.T * C, rng);
  Vec out(row.T * row.Hv * row.Dv), cout(row.T * C);
  be->gated_delta_rule_forward(f32(out), f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias),
                               row.B, row.T, row.Hk, row.Hv, row.Dk, row.Dv, ds);
  be->causal_conv1d_forward(f32(cout), f32(x), f32(w), 1, row.T, C, K, ds);
  Grads g{Vec(qkv.size()), Vec(a.size()), Vec(b.size()), Vec(row.Hv, 0.0f), Vec(row.Hv, 0.0f)};
  be->gated_delta_rule_backward(f32(g.dqkv), f32(g.da), f32(g.db), f32(g.dA_log),
                                f32(g.ddt_bias), f32(R), f32(qkv), f32(a), f32(b), f32(A_log),
                                f32(dt_bias), row.B, row.T, row.Hk, row.Hv, row.Dk, row.Dv, ds);
  Vec cdx(x.size()), cdw(w.size(), 0.0f);
  be->causal_conv1d_backward(f32(cdx), f32(cdw), f32(Rc), f32(x), f32(w), 1, row.T, C, K, ds);

  Vec sum_dA(row.Hv, 0.0f), sum_ddt(row.Hv, 0.0f), sum_dw(w.size(), 0.0f);
  for (std::size_t k = 0; k < starts.size(); ++k) {
    const int64_t t0 = starts[k], n = (k + 1 < starts.size() ? starts[k + 1] : row.T) - t0;
    SCOPED_TRACE("document at " + std::to_string(t0) + " of " + std::to_string(n) + " tokens");
    const auto part = [&](const Vec& v, int64_t width) {
      return Vec(v.begin() + t0 * width, v.begin() + (t0 + n) * width);
    };
    const Vec q1 = part(qkv, W), a1 = part(a, row.Hv), b1 = part(b, row.Hv),
              R1 = part(R, row.Hv * row.Dv), x1 = part(x, C), Rc1 = part(Rc, C);
    Vec o1(n * row.Hv * row.Dv), co1(n * C);
    be->gated_delta_rule_forward(f32(o1), f32(q1), f32(a1), f32(b1), f32(A_log), f32(dt_bias), 1,
                                 n, row.Hk, row.Hv, row.Dk, row.Dv, {});
    be->causal_conv1d_forward(f32(co1), f32(x1), f32(w), 1, n, C, K, {});
    EXPECT_EQ(part(out, row.Hv * row.Dv), o1);
    EXPECT_EQ(part(cout, C), co1);
    Vec dq1(q1.size()), da1(a1.size()), db1(b1.size()), dA1(row.Hv, 0.0f), ddt1(row.Hv, 0.0f);
    be->gated_delta_rule_backward(f32(dq1), f32(da1), f32(db1), f32(dA1), f32(ddt1), f32(R1),
                                  f32(q1), f32(a1), f32(b1), f32(A_log), f32(dt_bias), 1, n,
                                  row.Hk, row.Hv, row.Dk, row.Dv, {});
    EXPECT_EQ(part(g.dqkv, W), dq1);
    EXPECT_EQ(part(g.da, row.Hv), da1);
    EXPECT_EQ(part(g.db, row.Hv), db1);
    Vec dx1(x1.size()), dw1(w.size(), 0.0f);
    be->causal_conv1d_backward(f32(dx1), f32(dw1), f32(Rc1), f32(x1), f32(w), 1, n, C, K, {});
    EXPECT_EQ(part(cdx, C), dx1);
    for (int64_t h = 0; h < row.Hv; ++h) {
      sum_dA[h] += dA1[h];
      sum_ddt[h] += ddt1[h];
    }
    for (std::size_t i = 0; i < w.size(); ++i) sum_dw[i] += dw1[i];
  }
  // (summed in another order: equal to rounding)
  EXPECT_LT(rel_err(g.dA_log, to_double(sum_dA)), 1e-5);
  EXPECT_LT(rel_err(g.ddt_bias, to_double(sum_ddt)), 1e-5);
  EXPECT_LT(rel_err(cdw, to_double(sum_dw)), 1e-5);

  // All-zero starts: one document, the unmasked kernels' bits.
  std::vector<int32_t> zeros(row.T, 0);
  const TensorView z{zeros.data(), DType::i32, {row.T}};
  Vec o_z(out.size()), o_n(out.size());
  be->gated_delta_rule_forward(f32(o_z), f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias),
                               row.B, row.T, row.Hk, row.Hv, row.Dk, row.Dv, z);
  be->gated_delta_rule_forward(f32(o_n), f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias),
                               row.B, row.T, row.Hk, row.Hv, row.Dk, row.Dv, {});
  EXPECT_EQ(o_z, o_n);
  EXPECT_NE(o_n, out) << "the mask changes the outputs";
  // A doc_start that is not int32 [B,T].
  const Vec wrong(row.T);
  expect_error(
      [&] {
        be->gated_delta_rule_forward(f32(o_z), f32(qkv), f32(a), f32(b), f32(A_log),
                                     f32(dt_bias), row.B, row.T, row.Hk, row.Hv, row.Dk, row.Dv,
                                     f32(wrong));
      },
      {"gated_delta_rule_forward", "doc_start", "expected int32"});
}

TEST_F(GatedDeltaRule, ArgumentErrors) {
  make({1, 4, 2, 3, 4, 4});  // Hv 3 is no multiple of Hk 2
  Vec out(1 * 4 * 3 * 4);
  expect_error([&] { forward(); }, {"gated_delta_rule_forward", "Hv", "multiple of Hk = 2"});
  make({1, 4, 1, 2, 4, 4});
  Vec small(3);
  expect_error(
      [&] {
        be->gated_delta_rule_forward(f32(out), f32(small), f32(a), f32(b), f32(A_log),
                                     f32(dt_bias), 1, 4, 1, 2, 4, 4, {});
      },
      {"gated_delta_rule_forward", "qkv", "needs at least"});
  expect_error(
      [&] {
        be->gated_delta_rule_forward(f32(qkv), f32(qkv), f32(a), f32(b), f32(A_log),
                                     f32(dt_bias), 1, 4, 1, 2, 4, 4, {});
      },
      {"gated_delta_rule_forward", "out", "overlaps qkv"});
  const Vec dout(1 * 4 * 2 * 4, 1.0f);
  Vec da(a.size()), db(b.size()), dA(2), ddt(2);
  expect_error(
      [&] {
        be->gated_delta_rule_backward(f32(qkv), f32(da), f32(db), f32(dA), f32(ddt), f32(dout),
                                      f32(qkv), f32(a), f32(b), f32(A_log), f32(dt_bias), 1, 4,
                                      1, 2, 4, 4, {});
      },
      {"gated_delta_rule_backward", "dqkv", "overlaps qkv"});
  expect_error(
      [&] {
        Vec x(20), w(8);
        be->causal_conv1d_forward(f32(x), f32(x), f32(w), 1, 5, 4, 2, {});
      },
      {"causal_conv1d_forward", "out", "overlaps x"});
  expect_error(
      [&] {
        Vec x(20), o(20), w(8);
        be->causal_conv1d_forward(f32(o), f32(x), f32(w), 1, 5, 4, 0, {});
      },
      {"causal_conv1d_forward", "K", "expected >= 1"});
}

}  // namespace
}  // namespace fsdp
