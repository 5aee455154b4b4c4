// tests/test_llama_kernels.cpp: the CPU backend's Llama kernels (kernels.hpp "Llama pieces"):
// rotary embedding, SwiGLU and causal grouped-query attention; and gpt-oss's pieces: the
// clamped SwiGLU on interleaved gate/up pairs (clamped_swiglu_forward/backward) and attention
// sinks (attention_sink_forward/backward, after gqa_attention_forward).
//  - Values against double-precision references written from Hugging Face's formulas
//    (apply_rotary_pos_emb with rotate_half and cos/sin = cat(freqs, freqs); LlamaMLP's
//    silu(gate) * up; LlamaAttention with repeat_kv; GptOssExperts._apply_gate with its
//    clamps, on and beyond the bounds; eager_attention_forward's softmax with a sink column).
//  - Finite-difference gradient checks: L = sum(out * Rw) with fixed random Rw, dout = Rw fed
//    to the backward, central differences of L (L summed in double, forward in fp32).
//  - GQA against the existing mha_forward/backward on k, v repeated H/Hkv times
//    (repeat_interleave order): forward equal, dq equal, dk/dv equal to mha's summed over each
//    group; MHA (Hkv == H) and MQA (Hkv == 1), across query tiles.
//    Attention sinks: the gradients of the kernel pair (attention_sink_backward adding to
//    dsinks, then gqa_attention_backward on the sinked out and lse) with respect to q, k, v
//    and the sinks; a row without keys (lse +inf) left as it is.
//  - The documented aliasing (in-place results equal out-of-place ones bit for bit), the
//    "store bf16/fp16, compute fp32" contract, independence from the thread count, and the
//    argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "attention_ref.hpp"
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

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// ||a - n|| / ||n|| (n = numeric reference).
double rel_err(const Vec& analytic, const DVec& numeric) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    const double d = analytic[i] - numeric[i];
    num += d * d;
    den += numeric[i] * numeric[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-12);
}

// Central differences of `loss` with respect to every element of x (perturbed in place).
DVec numeric_grad(Vec& x, const std::function<double()>& loss, float h) {
  DVec g(x.size());
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

TensorView f32(const Vec& v) { return {v.data(), DType::f32, {static_cast<int64_t>(v.size())}}; }
uint32_t bits(float f) { return std::bit_cast<uint32_t>(f); }

// Every element bit-identical.
void expect_same_bits(const Vec& a, const Vec& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(bits(a[i]), bits(b[i])) << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

class LlamaKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::mt19937 rng{20240611};
};

// ---------------------------------------------------------------------------------------
// rotary embedding

// Llama's tables: inv_freq[i] = theta^(-2i/D), cos/sin[t, i] = cos/sin(t inv_freq[i]),
// fp32 [Tmax, D/2] (HF's rotary embedding keeps the D/2 frequencies twice).
void rope_tables(int64_t Tmax, int64_t D, double theta, Vec& cos, Vec& sin) {
  const int64_t half = D / 2;
  cos.resize(Tmax * half);
  sin.resize(Tmax * half);
  for (int64_t t = 0; t < Tmax; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double f = static_cast<double>(t) * std::pow(theta, -2.0 * i / static_cast<double>(D));
      cos[t * half + i] = static_cast<float>(std::cos(f));
      sin[t * half + i] = static_cast<float>(std::sin(f));
    }
  }
}

// HF's apply_rotary_pos_emb literally: out = x * cat(c, c) + rotate_half(x) * cat(s, s),
// rotate_half(x) = cat(-x2, x1), in double.
DVec rope_ref(const Vec& x, const Vec& cos, const Vec& sin, int64_t B, int64_t T, int64_t H,
              int64_t D) {
  const int64_t half = D / 2;
  DVec out(x.size());
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t off = ((b * T + t) * H + h) * D;
        for (int64_t e = 0; e < D; ++e) {
          const double c = cos[t * half + e % half], s = sin[t * half + e % half];
          const double rot = e < half ? -static_cast<double>(x[off + e + half]) : x[off + e - half];
          out[off + e] = x[off + e] * c + rot * s;
        }
      }
    }
  }
  return out;
}

TEST_F(LlamaKernels, RopeMatchesHuggingFaceFormula) {
  const int64_t B = 2, T = 5, Tmax = 9, H = 3, D = 8;  // T < Tmax: rows T.. of the tables unused
  Vec cos, sin;
  rope_tables(Tmax, D, 10000.0, cos, sin);
  const Vec x = random_vec(B * T * H * D, rng);
  Vec out(x.size(), std::numeric_limits<float>::quiet_NaN());
  be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), B, T, H, D, D);
  const DVec ref = rope_ref(x, cos, sin, B, T, H, D);
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-6) << i;
  // position 0 is the identity (cos 1, sin 0); the rotation keeps each pair's norm
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t e = 0; e < H * D; ++e) {
      EXPECT_EQ(out[b * T * H * D + e], x[b * T * H * D + e]);
    }
  }
  for (int64_t r = 0; r < B * T * H; ++r) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const double a = x[r * D + i], c = x[r * D + i + D / 2];
      const double p = out[r * D + i], q = out[r * D + i + D / 2];
      EXPECT_NEAR(p * p + q * q, a * a + c * c, 1e-5);
    }
  }
  // a hand-computed pair: D = 2, one head, position 1 at angle 0.5
  const Vec c1 = {1.0f, std::cos(0.5f)}, s1 = {0.0f, std::sin(0.5f)}, x1 = {9, 9, 3.0f, -2.0f};
  Vec o1(4);
  be->rope_forward(f32(o1), f32(x1), f32(c1), f32(s1), 1, 2, 1, 2, 2);
  EXPECT_FLOAT_EQ(o1[2], 3.0f * std::cos(0.5f) + 2.0f * std::sin(0.5f));
  EXPECT_FLOAT_EQ(o1[3], -2.0f * std::cos(0.5f) + 3.0f * std::sin(0.5f));
}

TEST_F(LlamaKernels, RopeBackwardIsTheTransposeAndGradientCheck) {
  const int64_t B = 2, T = 4, H = 2, D = 6;
  Vec cos, sin;
  rope_tables(T + 3, D, 500.0, cos, sin);
  Vec x = random_vec(B * T * H * D, rng);
  const Vec Rw = random_vec(x.size(), rng);
  Vec dx(x.size(), std::numeric_limits<float>::quiet_NaN());
  be->rope_backward(f32(dx), f32(Rw), f32(cos), f32(sin), B, T, H, D, D);
  auto loss = [&] {
    Vec o(x.size());
    be->rope_forward(f32(o), f32(x), f32(cos), f32(sin), B, T, H, D, D);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dx, numeric_grad(x, loss, 1e-2f)), 1e-4);
  // the stated formula: dx[i] = dout[i] c + dout[i+D/2] s; dx[i+D/2] = dout[i+D/2] c - dout[i] s
  const int64_t half = D / 2;
  for (int64_t r = 0; r < B * T * H; ++r) {
    const int64_t t = (r / H) % T;
    for (int64_t i = 0; i < half; ++i) {
      const double c = cos[t * half + i], s = sin[t * half + i];
      const double a = Rw[r * D + i], b = Rw[r * D + i + half];
      EXPECT_NEAR(dx[r * D + i], a * c + b * s, 1e-6);
      EXPECT_NEAR(dx[r * D + i + half], b * c - a * s, 1e-6);
    }
  }
  // forward then backward is the identity (a rotation)
  Vec y(x.size()), back(x.size());
  be->rope_forward(f32(y), f32(x), f32(cos), f32(sin), B, T, H, D, D);
  be->rope_backward(f32(back), f32(y), f32(cos), f32(sin), B, T, H, D, D);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(back[i], x[i], 1e-6);
}

TEST_F(LlamaKernels, RopeInPlaceEqualsOutOfPlace) {
  const int64_t B = 3, T = 7, H = 4, D = 16;  // rows of 8-lane multiples and more
  Vec cos, sin;
  rope_tables(T, D, 10000.0, cos, sin);
  const Vec x = random_vec(B * T * H * D, rng);
  Vec out(x.size()), inplace = x;
  be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), B, T, H, D, D);
  be->rope_forward(f32(inplace), f32(inplace), f32(cos), f32(sin), B, T, H, D, D);
  expect_same_bits(out, inplace, "rope_forward in place");
  Vec dx(x.size()), dinplace = x;
  be->rope_backward(f32(dx), f32(x), f32(cos), f32(sin), B, T, H, D, D);
  be->rope_backward(f32(dinplace), f32(dinplace), f32(cos), f32(sin), B, T, H, D, D);
  expect_same_bits(dx, dinplace, "rope_backward in place");
}

// Partial rotary (Phi-4-mini's partial_rotary_factor): HF's cat(rope(x[..., :R]), x[..., R:])
// with the rotate-half pairs (i, i + R/2); the other D - R columns pass through unchanged,
// out of place and in place, forward and backward; the backward is still the transpose.
TEST_F(LlamaKernels, PartialRopeRotatesTheFirstRColumns) {
  const int64_t B = 2, T = 5, H = 3, D = 10, R = 6;
  Vec cos, sin;
  rope_tables(T, R, 10000.0, cos, sin);  // [T, R/2]
  Vec x = random_vec(B * T * H * D, rng);
  Vec out(x.size(), std::numeric_limits<float>::quiet_NaN());
  be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), B, T, H, D, R);
  // the reference: the rotated part of each head as a D = R rope, the rest copied
  Vec xr, rest;
  for (int64_t r = 0; r < B * T * H; ++r) {
    xr.insert(xr.end(), x.begin() + r * D, x.begin() + r * D + R);
  }
  const DVec ref = rope_ref(xr, cos, sin, B, T, H, R);
  for (int64_t r = 0; r < B * T * H; ++r) {
    for (int64_t e = 0; e < D; ++e) {
      if (e < R) {
        ASSERT_NEAR(out[r * D + e], ref[r * R + e], 1e-6) << r << " " << e;
      } else {
        ASSERT_EQ(out[r * D + e], x[r * D + e]) << r << " " << e;
      }
    }
  }
  Vec inplace = x;
  be->rope_forward(f32(inplace), f32(inplace), f32(cos), f32(sin), B, T, H, D, R);
  expect_same_bits(out, inplace, "partial rope_forward in place");
  const Vec Rw = random_vec(x.size(), rng);
  Vec dx(x.size(), std::numeric_limits<float>::quiet_NaN());
  be->rope_backward(f32(dx), f32(Rw), f32(cos), f32(sin), B, T, H, D, R);
  auto loss = [&] {
    Vec o(x.size());
    be->rope_forward(f32(o), f32(x), f32(cos), f32(sin), B, T, H, D, R);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dx, numeric_grad(x, loss, 1e-2f)), 1e-4);
  for (int64_t r = 0; r < B * T * H; ++r) {
    for (int64_t e = R; e < D; ++e) EXPECT_EQ(dx[r * D + e], Rw[r * D + e]);
  }
  Vec dinplace = Rw;
  be->rope_backward(f32(dinplace), f32(dinplace), f32(cos), f32(sin), B, T, H, D, R);
  expect_same_bits(dx, dinplace, "partial rope_backward in place");
}

TEST_F(LlamaKernels, RopeArgumentErrors) {
  Vec x(2 * 3 * 2 * 4), out(x.size()), cos(3 * 2), sin(3 * 2), short_tab(2 * 2);
  EXPECT_NO_THROW(be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), 2, 3, 2, 4, 4));
  // an odd rotated width, or one outside [2, D]
  Vec xo(2 * 3 * 2 * 3);
  EXPECT_THROW(be->rope_forward(f32(xo), f32(xo), f32(cos), f32(sin), 2, 3, 2, 3, 3), Error);
  EXPECT_THROW(be->rope_backward(f32(xo), f32(xo), f32(cos), f32(sin), 2, 3, 2, 3, 3), Error);
  EXPECT_NO_THROW(be->rope_forward(f32(xo), f32(xo), f32(cos), f32(sin), 2, 3, 2, 3, 2));
  EXPECT_THROW(be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), 2, 3, 2, 4, 6), Error);
  EXPECT_THROW(be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), 2, 3, 2, 4, 0), Error);
  // tables shorter than T rows, or not fp32
  EXPECT_THROW(be->rope_forward(f32(out), f32(x), f32(short_tab), f32(sin), 2, 3, 2, 4, 4), Error);
  EXPECT_THROW(be->rope_backward(f32(out), f32(x), f32(cos), f32(short_tab), 2, 3, 2, 4, 4), Error);
  std::vector<uint16_t> cos16(cos.size());
  EXPECT_THROW(be->rope_forward(f32(out), f32(x), TensorView(cos16.data(), DType::bf16, {6}),
                                f32(sin), 2, 3, 2, 4, 4),
               Error);
  // x too small
  EXPECT_THROW(be->rope_forward(f32(out), f32(cos), f32(cos), f32(sin), 2, 3, 2, 4, 4), Error);
  EXPECT_THROW(be->rope_forward(f32(out), f32(x), f32(cos), f32(sin), -1, 3, 2, 4, 4), Error);
}

// ---------------------------------------------------------------------------------------
// SwiGLU

double silu_ref(double g) { return g / (1.0 + std::exp(-g)); }

TEST_F(LlamaKernels, SwigluValuesAndGradientCheck) {
  const int64_t n = 83;  // 10 vectors of 8 and a tail of 3
  Vec gate = random_vec(n, rng, -6.0f, 6.0f), up = random_vec(n, rng, -2.0f, 2.0f);
  gate[0] = 0.0f;
  gate[1] = -30.0f;
  gate[2] = 30.0f;
  Vec out(n, std::numeric_limits<float>::quiet_NaN());
  be->swiglu_forward(f32(out), f32(gate), f32(up));
  for (int64_t i = 0; i < n; ++i) {
    const double want = silu_ref(gate[i]) * up[i];
    ASSERT_NEAR(out[i], want, 2e-6 * std::max(1.0, std::abs(want))) << i;
  }
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[2], 30.0 * up[2], 1e-4);
  const Vec Rw = random_vec(n, rng);
  Vec dgate(n, std::numeric_limits<float>::quiet_NaN()), dup(n, std::numeric_limits<float>::quiet_NaN());
  be->swiglu_backward(f32(dgate), f32(dup), f32(Rw), f32(gate), f32(up));
  for (int64_t i = 0; i < n; ++i) {  // the stated formulas, in double
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    const double dg = Rw[i] * up[i] * s * (1.0 + g * (1.0 - s)), du = Rw[i] * silu_ref(g);
    ASSERT_NEAR(dgate[i], dg, 2e-6 * std::max(1.0, std::abs(dg))) << i;
    ASSERT_NEAR(dup[i], du, 2e-6 * std::max(1.0, std::abs(du))) << i;
  }
  auto loss = [&] {
    Vec o(n);
    be->swiglu_forward(f32(o), f32(gate), f32(up));
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dgate, numeric_grad(gate, loss, 1e-3f)), 2e-4);
  EXPECT_LT(rel_err(dup, numeric_grad(up, loss, 1e-2f)), 1e-4);
}

TEST_F(LlamaKernels, SwigluAliasingEqualsOutOfPlace) {
  const int64_t n = 1000;
  const Vec gate = random_vec(n, rng, -5.0f, 5.0f), up = random_vec(n, rng), dout = random_vec(n, rng);
  Vec out(n);
  be->swiglu_forward(f32(out), f32(gate), f32(up));
  Vec g1 = gate, u1 = up;
  be->swiglu_forward(f32(g1), f32(g1), f32(up));  // out = gate
  expect_same_bits(out, g1, "swiglu_forward out = gate");
  be->swiglu_forward(f32(u1), f32(gate), f32(u1));  // out = up
  expect_same_bits(out, u1, "swiglu_forward out = up");

  Vec dgate(n), dup(n);
  be->swiglu_backward(f32(dgate), f32(dup), f32(dout), f32(gate), f32(up));
  Vec g2 = gate, u2 = up;  // dgate = gate, dup = up
  be->swiglu_backward(f32(g2), f32(u2), f32(dout), f32(g2), f32(u2));
  expect_same_bits(dgate, g2, "swiglu_backward dgate = gate");
  expect_same_bits(dup, u2, "swiglu_backward dup = up");
  Vec d3 = dout, u3(n);  // dgate = dout
  be->swiglu_backward(f32(d3), f32(u3), f32(d3), f32(gate), f32(up));
  expect_same_bits(dgate, d3, "swiglu_backward dgate = dout");
  expect_same_bits(dup, u3, "swiglu_backward dup with dgate = dout");
}

TEST_F(LlamaKernels, SwigluArgumentErrors) {
  Vec a(10), b(10), c(9);
  EXPECT_THROW(be->swiglu_forward(f32(a), f32(b), f32(c)), Error);
  EXPECT_THROW(be->swiglu_backward(f32(a), f32(b), f32(c), f32(a), f32(b)), Error);
  EXPECT_THROW(be->swiglu_backward(f32(a), f32(c), f32(b), f32(a), f32(b)), Error);
  std::vector<int32_t> ints(10);
  EXPECT_THROW(be->swiglu_forward(f32(a), TensorView(ints.data(), DType::i32, {10}), f32(b)),
               Error);
}

// ---------------------------------------------------------------------------------------
// grouped-query attention

struct GqaShape {
  int64_t B, T, H, Hkv, D;
};

// k: [B,T,Hkv*D] -> [B,T,H*D], kv head g repeated H/Hkv times in place (repeat_interleave,
// HF's repeat_kv): query head h reads kv head h / (H/Hkv).
Vec repeat_kv(const Vec& k, const GqaShape& s) {
  const int64_t group = s.H / s.Hkv;
  Vec r(s.B * s.T * s.H * s.D);
  for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t e = 0; e < s.D; ++e) {
        r[(bt * s.H + h) * s.D + e] = k[(bt * s.Hkv + h / group) * s.D + e];
      }
    }
  }
  return r;
}
// The transpose: dk[B,T,Hkv*D] = sum over each group's heads (ascending) of drep[B,T,H*D].
Vec sum_groups(const Vec& drep, const GqaShape& s) {
  const int64_t group = s.H / s.Hkv;
  Vec r(s.B * s.T * s.Hkv * s.D, 0.0f);
  for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t e = 0; e < s.D; ++e) {
        r[(bt * s.Hkv + h / group) * s.D + e] += drep[(bt * s.H + h) * s.D + e];
      }
    }
  }
  return r;
}

std::string describe(const GqaShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) +
         " Hkv=" + std::to_string(s.Hkv) + " D=" + std::to_string(s.D);
}

void expect_near_all(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) {
      worst = d;
      at = i;
    }
  }
  EXPECT_LE(worst, tol) << what << ": worst at " << at << ": " << got[at] << " vs " << want[at];
}

// GQA against mha on repeated k, v; and against the double-precision naive attention.
void check_gqa_equals_repeated_mha(Backend& be, std::mt19937& rng, const GqaShape& s) {
  const std::string what = describe(s);
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  const Vec q = random_vec(nq, rng, -2.0f, 2.0f), k = random_vec(nk, rng, -2.0f, 2.0f),
            v = random_vec(nk, rng), dout = random_vec(nq, rng);
  const Vec kr = repeat_kv(k, s), vr = repeat_kv(v, s);
  const float nan = std::numeric_limits<float>::quiet_NaN();

  Vec out(nq, nan), lse(nl, nan), mout(nq, nan), mlse(nl, nan);
  be.gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                           scale, 0, 0.f, TensorView{});
  be.mha_forward(f32(mout), f32(mlse), f32(q), f32(kr), f32(vr), TensorView{}, TensorView{}, s.B,
                 s.T, s.T, s.H, s.D, scale, true);
  expect_near_all(out, mout, 1e-6, "out vs mha " + what);
  expect_near_all(lse, mlse, 1e-6, "lse vs mha " + what);

  const test_util::AttnShape as{s.B, s.T, s.T, s.H, s.D, scale, true};
  const test_util::AttnRef ref = test_util::naive_attention(as, q, kr, vr, {}, {}, dout);
  for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(out[i], ref.out[i], 3e-6) << "out " << what << " " << i;
  for (int64_t i = 0; i < nl; ++i) ASSERT_NEAR(lse[i], ref.lse[i], 3e-6) << "lse " << what << " " << i;

  Vec dq(nq, nan), dk(nk, nan), dv(nk, nan), mdq(nq, nan), mdk(nq, nan), mdv(nq, nan);
  be.gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v), f32(out),
                            f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, 0, 0.f, TensorView{});
  be.mha_backward(f32(mdq), f32(mdk), f32(mdv), TensorView{}, f32(dout), f32(q), f32(kr), f32(vr),
                  f32(mout), f32(mlse), TensorView{}, TensorView{}, s.B, s.T, s.T, s.H, s.D, scale,
                  true);
  expect_near_all(dq, mdq, 1e-6, "dq vs mha " + what);
  expect_near_all(dk, sum_groups(mdk, s), 1e-5, "dk vs summed mha " + what);
  expect_near_all(dv, sum_groups(mdv, s), 1e-5, "dv vs summed mha " + what);
  // and the double-precision reference, its dk/dv summed over the groups in double
  Vec rdk(nq), rdv(nq);
  for (int64_t i = 0; i < nq; ++i) {
    rdk[i] = static_cast<float>(ref.dk[i]);
    rdv[i] = static_cast<float>(ref.dv[i]);
  }
  for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(dq[i], ref.dq[i], 2e-5) << "dq " << what << " " << i;
  expect_near_all(dk, sum_groups(rdk, s), 3e-5, "dk vs naive " + what);
  expect_near_all(dv, sum_groups(rdv, s), 3e-5, "dv vs naive " + what);
}

TEST_F(LlamaKernels, GqaEqualsMhaOnRepeatedKv) {
  check_gqa_equals_repeated_mha(*be, rng, {2, 7, 4, 2, 8});
}
TEST_F(LlamaKernels, GqaMhaCaseHkvEqualsH) {
  check_gqa_equals_repeated_mha(*be, rng, {2, 6, 3, 3, 4});
}
TEST_F(LlamaKernels, GqaMqaCaseHkvOne) { check_gqa_equals_repeated_mha(*be, rng, {2, 5, 4, 1, 6}); }
TEST_F(LlamaKernels, GqaAcrossQueryTiles) {  // T = 70 > the 64-query tile; groups of 3
  check_gqa_equals_repeated_mha(*be, rng, {1, 70, 6, 2, 8});
}
TEST_F(LlamaKernels, GqaLlamaHeadWidth) {  // D = 64, 8 query heads on 2 kv heads
  check_gqa_equals_repeated_mha(*be, rng, {1, 33, 8, 2, 64});
}

// Finite differences of L = sum(out * Rw) with respect to q, k and v (with a sliding window
// and a soft-cap when given).
void gqa_gradient_check(Backend& be, std::mt19937& rng, const GqaShape& s, float scale,
                        int64_t window = 0, float softcap = 0.f,
                        const TensorView& doc_start = TensorView{}) {
  const std::string what = describe(s) + " window=" + std::to_string(window) +
                           " softcap=" + std::to_string(softcap) +
                           (doc_start ? " with documents" : "");
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
  Vec q = random_vec(nq, rng, -1.5f, 1.5f), k = random_vec(nk, rng, -1.5f, 1.5f),
      v = random_vec(nk, rng);
  const Vec Rw = random_vec(nq, rng);
  Vec out(nq), lse(nl);
  be.gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                           scale, window, softcap, doc_start);
  Vec dq(nq), dk(nk), dv(nk);
  be.gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(Rw), f32(q), f32(k), f32(v), f32(out),
                            f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, window, softcap, doc_start);
  auto loss = [&] {
    Vec o(nq), l(nl);
    be.gqa_attention_forward(f32(o), f32(l), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                             scale, window, softcap, doc_start);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dq, numeric_grad(q, loss, 1e-2f)), 5e-4) << "dq " << what;
  EXPECT_LT(rel_err(dk, numeric_grad(k, loss, 1e-2f)), 5e-4) << "dk " << what;
  EXPECT_LT(rel_err(dv, numeric_grad(v, loss, 1e-2f)), 5e-4) << "dv " << what;
}

TEST_F(LlamaKernels, GqaGradientCheck) {
  gqa_gradient_check(*be, rng, {2, 5, 4, 2, 4}, 0.5f);
  gqa_gradient_check(*be, rng, {1, 6, 3, 1, 4}, 1.0f);   // MQA
  gqa_gradient_check(*be, rng, {1, 4, 2, 2, 6}, 0.4f);   // MHA
}

// out, lse, dq against the double-precision naive attention on repeated k/v, and dk, dv
// against its gradients summed over each group.
void expect_matches_naive(const Vec& out, const Vec& lse, const Vec& dq, const Vec& dk,
                          const Vec& dv, const test_util::AttnRef& ref, const GqaShape& s,
                          const std::string& what) {
  const int64_t nq = s.B * s.T * s.H * s.D, nl = s.B * s.H * s.T;
  for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(out[i], ref.out[i], 3e-6) << what << " out " << i;
  for (int64_t i = 0; i < nl; ++i) ASSERT_NEAR(lse[i], ref.lse[i], 3e-6) << what << " lse " << i;
  for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(dq[i], ref.dq[i], 2e-5) << what << " dq " << i;
  Vec rdk(nq), rdv(nq);
  for (int64_t i = 0; i < nq; ++i) {
    rdk[i] = static_cast<float>(ref.dk[i]);
    rdv[i] = static_cast<float>(ref.dv[i]);
  }
  expect_near_all(dk, sum_groups(rdk, s), 3e-5, "dk " + what);
  expect_near_all(dv, sum_groups(rdv, s), 3e-5, "dv " + what);
}

// The sliding window (Mistral, Qwen2's sliding layers): key j visible to query i iff
// i - window < j <= i, against the double-precision naive attention with that mask, forward
// and backward, across query and key tiles (T = 300: the CPU's 64-query tiles start their
// keys inside a 256-key tile), GQA groups; a window of T or more equals no window bit for bit,
// and window 1 is each query's own value. Finite differences at a window of 2.
TEST_F(LlamaKernels, GqaSlidingWindowMasksKeysOutsideIt) {
  for (const auto& [s, window] : std::vector<std::pair<GqaShape, int64_t>>{
           {{2, 7, 4, 2, 8}, 3},
           {{1, 300, 4, 2, 8}, 70},
           {{1, 300, 2, 1, 4}, 257},
           {{2, 5, 2, 2, 4}, 1}}) {
    const std::string what = describe(s) + " window=" + std::to_string(window);
    const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
    const Vec q = random_vec(nq, rng, -2.0f, 2.0f), k = random_vec(nk, rng, -2.0f, 2.0f),
              v = random_vec(nk, rng), dout = random_vec(nq, rng);
    Vec out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                              scale, window, 0.f, TensorView{});
    be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v),
                               f32(out), f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, window, 0.f,
                               TensorView{});
    test_util::AttnShape as{s.B, s.T, s.T, s.H, s.D, scale, true};
    as.window = window;
    const test_util::AttnRef ref =
        test_util::naive_attention(as, q, repeat_kv(k, s), repeat_kv(v, s), {}, {}, dout);
    expect_matches_naive(out, lse, dq, dk, dv, ref, s, what);
    if (window == 1) {  // each query sees only itself: out = v of its own position
      for (int64_t bt = 0; bt < s.B * s.T; ++bt) {
        for (int64_t h = 0; h < s.H; ++h) {
          for (int64_t e = 0; e < s.D; ++e) {
            ASSERT_EQ(out[(bt * s.H + h) * s.D + e], v[(bt * s.Hkv + h / (s.H / s.Hkv)) * s.D + e])
                << what;
          }
        }
      }
    }
    // A window of T (or more) masks nothing the causal mask does not.
    Vec full(nq), full_lse(nl), wide(nq), wide_lse(nl);
    be->gqa_attention_forward(f32(full), f32(full_lse), f32(q), f32(k), f32(v), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, 0, 0.f, TensorView{});
    be->gqa_attention_forward(f32(wide), f32(wide_lse), f32(q), f32(k), f32(v), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, s.T, 0.f, TensorView{});
    expect_same_bits(wide, full, "window T vs none " + what);
    expect_same_bits(wide_lse, full_lse, "lse, window T vs none " + what);
  }
  gqa_gradient_check(*be, rng, {1, 6, 2, 1, 4}, 0.5f, /*window=*/2);  // through the window
}

// Document masking (doc_start; torchtitan's block_causal, HF's padding-free packing): a row
// packing documents of lengths `docs` attends within each document only, so each document's
// rows of out, lse, dq, dk and dv equal those of the document run alone (B = 1, T = its
// length), to rounding (the tiles fall elsewhere); with a window, the window applies inside
// the document. Documents cross the CPU's 64-query and 256-key tiles (T = 300); a document of
// one token sees only itself. doc_start all 0 is the plain causal mask bit for bit, and
// finite differences hold through the mask.
std::vector<int32_t> doc_starts(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<int32_t> start;
  for (const auto& docs : rows) {
    int64_t t0 = 0;
    for (int64_t n : docs) {
      for (int64_t t = 0; t < n; ++t) start.push_back(static_cast<int32_t>(t0));
      t0 += n;
    }
  }
  return start;
}
TensorView i32(const std::vector<int32_t>& v) {
  return {v.data(), DType::i32, {static_cast<int64_t>(v.size())}};
}
TEST_F(LlamaKernels, GqaDocumentMaskEqualsEachDocumentAlone) {
  struct Case {
    GqaShape s;
    std::vector<std::vector<int64_t>> docs;  // per row, lengths summing to T
    int64_t window;
  };
  for (const Case& c : std::vector<Case>{
           {{2, 9, 4, 2, 8}, {{3, 1, 5}, {9}}, 0},
           {{1, 300, 4, 2, 8}, {{1, 70, 190, 39}}, 0},
           {{2, 300, 2, 1, 4}, {{257, 43}, {64, 64, 1, 171}}, 0},
           {{1, 300, 4, 4, 8}, {{100, 200}}, 30}}) {
    const GqaShape& s = c.s;
    const std::string what = describe(s) + " window=" + std::to_string(c.window);
    const int64_t Q = s.H * s.D, KV = s.Hkv * s.D, nq = s.B * s.T * Q, nk = s.B * s.T * KV;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
    const Vec q = random_vec(nq, rng, -2.0f, 2.0f), k = random_vec(nk, rng, -2.0f, 2.0f),
              v = random_vec(nk, rng), dout = random_vec(nq, rng);
    const std::vector<int32_t> start = doc_starts(c.docs);
    ASSERT_EQ(static_cast<int64_t>(start.size()), s.B * s.T);
    Vec out(nq), lse(s.B * s.H * s.T), dq(nq), dk(nk), dv(nk);
    be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv,
                              s.D, scale, c.window, 0.f, i32(start));
    be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v),
                               f32(out), f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, c.window,
                               0.f, i32(start));
    for (int64_t b = 0; b < s.B; ++b) {
      int64_t t0 = 0;
      for (int64_t n : c.docs[static_cast<std::size_t>(b)]) {
        auto rows = [&](const Vec& x, int64_t w) {
          return Vec(x.begin() + (b * s.T + t0) * w, x.begin() + (b * s.T + t0 + n) * w);
        };
        const Vec dq1 = rows(q, Q), dk1 = rows(k, KV), dv1 = rows(v, KV), ddo = rows(dout, Q);
        Vec o1(n * Q), l1(s.H * n), gq(n * Q), gk(n * KV), gv(n * KV);
        be->gqa_attention_forward(f32(o1), f32(l1), f32(dq1), f32(dk1), f32(dv1), 1, n, s.H, s.Hkv,
                                  s.D, scale, c.window, 0.f, TensorView{});
        be->gqa_attention_backward(f32(gq), f32(gk), f32(gv), f32(ddo), f32(dq1), f32(dk1),
                                   f32(dv1), f32(o1), f32(l1), 1, n, s.H, s.Hkv, s.D, scale,
                                   c.window, 0.f, TensorView{});
        const std::string doc = what + " row " + std::to_string(b) + " document at " +
                                std::to_string(t0) + " of " + std::to_string(n);
        expect_near_all(rows(out, Q), o1, 2e-6, "out " + doc);
        expect_near_all(rows(dq, Q), gq, 1e-5, "dq " + doc);
        expect_near_all(rows(dk, KV), gk, 1e-5, "dk " + doc);
        expect_near_all(rows(dv, KV), gv, 1e-5, "dv " + doc);
        for (int64_t h = 0; h < s.H; ++h) {
          for (int64_t t = 0; t < n; ++t) {
            ASSERT_NEAR(lse[(b * s.H + h) * s.T + t0 + t], l1[h * n + t], 2e-6) << "lse " << doc;
          }
        }
        if (n == 1) {  // a document of one token: its own value
          for (int64_t e = 0; e < Q; ++e) {
            const int64_t h = e / s.D;
            ASSERT_EQ(out[(b * s.T + t0) * Q + e],
                      v[(b * s.T + t0) * KV + (h / (s.H / s.Hkv)) * s.D + e % s.D])
                << doc;
          }
        }
        t0 += n;
      }
    }
    // Every token in document 0: the causal mask alone, bit for bit.
    const std::vector<int32_t> zeros(static_cast<std::size_t>(s.B * s.T), 0);
    Vec plain(nq), plain_lse(s.B * s.H * s.T), zero(nq), zero_lse(s.B * s.H * s.T);
    be->gqa_attention_forward(f32(plain), f32(plain_lse), f32(q), f32(k), f32(v), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, c.window, 0.f, TensorView{});
    be->gqa_attention_forward(f32(zero), f32(zero_lse), f32(q), f32(k), f32(v), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, c.window, 0.f, i32(zeros));
    expect_same_bits(zero, plain, "doc_start 0 vs none " + what);
    expect_same_bits(zero_lse, plain_lse, "lse, doc_start 0 vs none " + what);
  }
  const std::vector<int32_t> start = doc_starts({{2, 3, 1}, {6}});
  gqa_gradient_check(*be, rng, {2, 6, 2, 1, 4}, 0.5f, 0, 0.f, i32(start));
  gqa_gradient_check(*be, rng, {2, 6, 2, 2, 4}, 0.5f, /*window=*/2, 0.f, i32(start));
}

TEST_F(LlamaKernels, GqaDocumentMaskArgumentErrors) {
  const int64_t B = 1, T = 4, H = 2, D = 4;
  const Vec q(B * T * H * D, 0.1f), k(B * T * H * D, 0.2f), v(B * T * H * D, 0.3f);
  Vec out(q.size()), lse(B * H * T);
  const std::vector<int32_t> short_start(3, 0);
  const std::vector<float> float_start(4, 0.f);
  for (const TensorView& bad : {i32(short_start), f32(float_start)}) {
    try {
      be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), B, T, H, H, D, 0.5f,
                                0, 0.f, bad);
      ADD_FAILURE() << "no throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gqa_attention_forward: doc_start"), std::string::npos)
          << e.what();
    }
    Vec g(q.size());
    EXPECT_THROW(be->gqa_attention_backward(f32(g), f32(g), f32(g), f32(q), f32(q), f32(k),
                                            f32(v), f32(out), f32(lse), B, T, H, H, D, 0.5f, 0,
                                            0.f, bad),
                 Error);
  }
}

// Gemma 2's attention soft-cap (attn_logit_softcapping): scores softcap tanh(scale q.k /
// softcap), against the double-precision naive attention with the cap, forward and backward,
// with and without a window, across query and key tiles; a cap changes the result (large
// scores), finite differences through the cap, and a negative or infinite cap throws.
TEST_F(LlamaKernels, GqaSoftcapMatchesTanhCappedScores) {
  for (const auto& [s, window, cap] :
       std::vector<std::tuple<GqaShape, int64_t, float>>{{{2, 7, 4, 2, 8}, 0, 2.0f},
                                                         {{1, 300, 4, 2, 8}, 70, 5.0f},
                                                         {{1, 70, 2, 1, 16}, 0, 1.0f}}) {
    const std::string what =
        describe(s) + " window=" + std::to_string(window) + " softcap=" + std::to_string(cap);
    const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
    const float scale = 1.0f;  // large scores: the cap bends them
    const Vec q = random_vec(nq, rng, -1.5f, 1.5f), k = random_vec(nk, rng, -1.5f, 1.5f),
              v = random_vec(nk, rng), dout = random_vec(nq, rng);
    Vec out(nq), lse(nl), dq(nq), dk(nk), dv(nk), plain(nq), plain_lse(nl);
    be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                              scale, window, cap, TensorView{});
    be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v),
                               f32(out), f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, window, cap,
                               TensorView{});
    be->gqa_attention_forward(f32(plain), f32(plain_lse), f32(q), f32(k), f32(v), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, window, 0.f, TensorView{});
    test_util::AttnShape as{s.B, s.T, s.T, s.H, s.D, scale, true};
    as.window = window;
    as.softcap = cap;
    const test_util::AttnRef ref =
        test_util::naive_attention(as, q, repeat_kv(k, s), repeat_kv(v, s), {}, {}, dout);
    double moved = 0.0;
    for (int64_t i = 0; i < nq; ++i)
      moved = std::max(moved, std::abs(double(plain[i]) - ref.out[i]));
    EXPECT_GT(moved, 1e-2) << what << ": the cap changed nothing";
    expect_matches_naive(out, lse, dq, dk, dv, ref, s, what);
  }
  gqa_gradient_check(*be, rng, {1, 6, 2, 1, 4}, 1.0f, 0, /*softcap=*/1.5f);
  gqa_gradient_check(*be, rng, {1, 7, 4, 2, 4}, 1.0f, /*window=*/3, /*softcap=*/1.0f);
  const GqaShape s{1, 6, 2, 1, 4};
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
  const Vec q(nq, 0.5f), k(nk, 0.5f), v(nk, 0.5f);
  Vec out(nq), lse(nl);
  for (float bad :
       {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T,
                                           s.H, s.Hkv, s.D, 1.0f, 0, bad, TensorView{}),
                 Error);
  }
}

TEST_F(LlamaKernels, GqaCausalRowZeroSeesOnlyKeyZero) {
  // B = 1, T = 2, H = 2 query heads on Hkv = 1: row 0 of each head equals v[0] exactly
  const Vec q = {1, 2, -1, 0.5f, 3, 4, 0.25f, -2}, k = {0.5f, -1, 2, 0.25f}, v = {1, 2, 3, 4};
  Vec out(8), lse(4);
  be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), 1, 2, 2, 1, 2, 1.0f, 0,
                            0.f, TensorView{});
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 2.0f);
  EXPECT_FLOAT_EQ(lse[0], 1 * 0.5f + 2 * -1.0f);     // head 0, row 0
  EXPECT_FLOAT_EQ(lse[2], -1 * 0.5f + 0.5f * -1.0f);  // head 1, row 0 (lse is [B,H,T])
  // head 1, row 1 by hand
  const double s0 = 0.25 * 0.5 + -2.0 * -1.0, s1 = 0.25 * 2.0 + -2.0 * 0.25;
  const double p0 = 1.0 / (1.0 + std::exp(s1 - s0));
  EXPECT_NEAR(out[6], p0 * 1 + (1 - p0) * 3, 1e-6);
  EXPECT_NEAR(out[7], p0 * 2 + (1 - p0) * 4, 1e-6);
  EXPECT_NEAR(lse[3], std::log(std::exp(s0) + std::exp(s1)), 1e-6);
}

TEST_F(LlamaKernels, GqaResultsIndependentOfThreadCount) {
  const GqaShape s{2, 130, 8, 2, 16};
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
  const Vec q = random_vec(nq, rng), k = random_vec(nk, rng), v = random_vec(nk, rng),
            dout = random_vec(nq, rng);
  auto run = [&](Backend& b) {
    std::vector<Vec> r = {Vec(nq), Vec(nl), Vec(nq), Vec(nk), Vec(nk)};
    b.gqa_attention_forward(f32(r[0]), f32(r[1]), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                            0.25f, 0, 0.f, TensorView{});
    b.gqa_attention_backward(f32(r[2]), f32(r[3]), f32(r[4]), f32(dout), f32(q), f32(k), f32(v),
                             f32(r[0]), f32(r[1]), s.B, s.T, s.H, s.Hkv, s.D, 0.25f, 0, 0.f,
                             TensorView{});
    return r;
  };
  auto one = make_cpu_backend(1), three = make_cpu_backend(3);
  const std::vector<Vec> a = run(*one), b = run(*three), c = run(*be);
  for (int i = 0; i < 5; ++i) {
    expect_same_bits(a[i], b[i], "1 vs 3 threads, result " + std::to_string(i));
    expect_same_bits(a[i], c[i], "1 vs 2 threads, result " + std::to_string(i));
  }
}

TEST_F(LlamaKernels, GqaArgumentErrors) {
  const int64_t B = 1, T = 3, D = 4;
  Vec q(B * T * 6 * D), kv(B * T * 6 * D), out(q.size()), lse(B * 6 * T), g(q.size());
  // H = 6 on Hkv = 4: 6 % 4 != 0
  EXPECT_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(kv), f32(kv), B, T, 6, 4,
                                         D, 0.5f, 0, 0.f, TensorView{}),
               Error);
  EXPECT_THROW(
      be->gqa_attention_backward(f32(g), f32(g), f32(g), f32(g), f32(q), f32(kv), f32(kv), f32(out),
                                 f32(lse), B, T, 6, 4, D, 0.5f, 0, 0.f, TensorView{}),
      Error);
  // Hkv = 0 and Hkv > H
  EXPECT_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(kv), f32(kv), B, T, 6, 0,
                                         D, 0.5f, 0, 0.f, TensorView{}),
               Error);
  EXPECT_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(kv), f32(kv), B, T, 2, 4,
                                         D, 0.5f, 0, 0.f, TensorView{}),
               Error);
  try {
    be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(kv), f32(kv), B, T, 6, 4, D, 0.5f, 0,
                              0.f, TensorView{});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gqa_attention_forward: Hkv"), std::string::npos)
        << e.what();
  }
  // valid: 6 on 3, 2 and 1
  for (int64_t hkv : {6, 3, 2, 1}) {
    EXPECT_NO_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(kv), f32(kv), B, T, 6,
                                              hkv, D, 0.5f, 0, 0.f, TensorView{}))
        << hkv;
  }
  // k too small for Hkv = 3; lse not fp32
  Vec ksmall(B * T * 3 * D - 1);
  EXPECT_THROW(be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(ksmall), f32(kv), B, T, 6,
                                         3, D, 0.5f, 0, 0.f, TensorView{}),
               Error);
  std::vector<uint16_t> lse16(lse.size());
  EXPECT_THROW(be->gqa_attention_forward(
                   f32(out), TensorView(lse16.data(), DType::bf16, {B * 6 * T}), f32(q), f32(kv),
                   f32(kv), B, T, 6, 3, D, 0.5f, 0, 0.f, TensorView{}),
               Error);
}

// ---------------------------------------------------------------------------------------
// strided copies (Multi-head Latent Attention's layout work)

// strided_copy against the loops of its contract: a column block of each head, a broadcast
// over the heads, the heads summed (with and without accumulate), a de-interleave (col stride
// 2) and its inverse, a bf16 destination; argument errors.
TEST_F(LlamaKernels, StridedCopyMovesBroadcastsAndSumsColumnBlocks) {
  using S = fsdp::Kernels::Strided;
  const int64_t R = 5, H = 3, D = 7;
  const Vec src = random_vec(R * H * D, rng), one = random_vec(R * 4, rng);
  auto at = [](const S& a, int64_t r, int64_t g, int64_t c) {
    return r * a.row + a.offset + g * a.group + c * a.col;
  };
  struct Case {
    const char* what;
    const Vec& from;
    S d, s;
    int64_t G, W, dst_size;
    bool accumulate;
  };
  for (const Case& t : {
           Case{"columns 2..5 of each head", src, S{H * 3, 0, 3, 1}, S{H * D, 2, D, 1}, H, 3,
                R * H * 3, false},
           Case{"a broadcast over the heads", one, S{H * D, 3, D, 1}, S{4, 0, 0, 1}, H, 4,
                R * H * D, false},
           Case{"the heads summed", src, S{4, 1, 0, 1}, S{H * D, 3, D, 1}, H, 3, R * 4, false},
           Case{"the heads summed, accumulated", src, S{4, 1, 0, 1}, S{H * D, 3, D, 1}, H, 3,
                R * 4, true},
           Case{"evens then odds (de-interleave)", src, S{H * 6, 0, 6, 1}, S{H * D, 0, D, 2}, H,
                3, R * H * 6, true},
           Case{"back to pairs (interleave)", src, S{H * 6, 1, 6, 2}, S{H * D, 4, D, 1}, H, 3,
                R * H * 6, false}}) {
    Vec dst = random_vec(t.dst_size, rng);
    DVec want(dst.begin(), dst.end());
    for (int64_t r = 0; r < R; ++r) {
      for (int64_t c = 0; c < t.W; ++c) {
        if (t.d.group == 0) {
          double sum = 0;
          for (int64_t g = 0; g < t.G; ++g) sum += t.from[at(t.s, r, g, c)];
          want[at(t.d, r, 0, c)] = (t.accumulate ? want[at(t.d, r, 0, c)] : 0.0) + sum;
          continue;
        }
        for (int64_t g = 0; g < t.G; ++g) {
          double& w = want[at(t.d, r, g, c)];
          w = (t.accumulate ? w : 0.0) + t.from[at(t.s, r, g, c)];
        }
      }
    }
    be->strided_copy(f32(dst), t.d, f32(const_cast<Vec&>(t.from)), t.s, R, t.G, t.W,
                     t.accumulate);
    for (std::size_t i = 0; i < dst.size(); ++i)
      ASSERT_NEAR(dst[i], want[i], 1e-6) << t.what << " " << i;
  }
  // bf16 destination: each written element rounded once, the others kept bit for bit
  std::vector<uint16_t> bf(static_cast<std::size_t>(R * H * D), 0x3f80);  // 1.0
  const fsdp::TensorView bview(bf.data(), fsdp::DType::bf16, {R * H * D});
  be->strided_copy(bview, S{H * D, 1, D, 2}, f32(const_cast<Vec&>(src)), S{H * D, 0, D, 1}, R, H,
                   3, false);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t g = 0; g < H; ++g) {
      for (int64_t c = 0; c < D; ++c) {
        const uint16_t got = bf[static_cast<std::size_t>(r * H * D + g * D + c)];
        const bool written = c % 2 == 1 && c / 2 < 3;
        float v = 1.f;
        if (written) v = src[static_cast<std::size_t>(r * H * D + g * D + c / 2)];
        ASSERT_EQ(got, written ? fsdp::f32_to_bf16(v) : uint16_t{0x3f80})
            << r << " " << g << " " << c;
      }
    }
  }
  Vec small(10);
  EXPECT_THROW(be->strided_copy(f32(small), S{-1, 0, 0, 1}, f32(small), S{}, 1, 1, 1, false),
               Error);
  EXPECT_THROW(be->strided_copy(f32(small), S{0, 0, 0, 0}, f32(small), S{}, 1, 1, 1, false),
               Error);
  try {
    be->strided_copy(f32(small), S{4, 0, 1, 1}, f32(const_cast<Vec&>(src)), S{}, 3, 1, 4, false);
    ADD_FAILURE() << "a view too short accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("strided_copy: dst is fp32 [10] but needs at least 12"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------
// mixture of experts

TensorView i32(std::vector<int32_t>& v) {
  return {v.data(), DType::i32, {static_cast<int64_t>(v.size())}};
}

// HF's routing in double (Qwen3MoeSparseMoeBlock / MixtralSparseMoeBlock): softmax, the K
// largest in descending order, optionally divided by their sum. Returns (idx, weights).
std::pair<std::vector<int32_t>, DVec> route_ref(const Vec& logits, int64_t R, int64_t E, int64_t K,
                                                bool normalize) {
  std::vector<int32_t> idx(static_cast<std::size_t>(R * K));
  DVec w(idx.size());
  for (int64_t r = 0; r < R; ++r) {
    DVec p(static_cast<std::size_t>(E));
    double mx = -1e300, sum = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(logits[r * E + e]));
    for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(logits[r * E + e] - mx);
    std::vector<int64_t> order(static_cast<std::size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
    double top = 0;
    for (int64_t j = 0; j < K; ++j) top += p[order[j]] / sum;
    for (int64_t j = 0; j < K; ++j) {
      idx[r * K + j] = static_cast<int32_t>(order[j]);
      w[r * K + j] = p[order[j]] / sum / (normalize ? top : 1.0);
    }
  }
  return {idx, w};
}

TEST_F(LlamaKernels, MoeRouterMatchesTopKOfTheSoftmaxAndGradientCheck) {
  for (bool normalize : {true, false}) {
    for (auto [R, E, K] : {std::tuple<int64_t, int64_t, int64_t>{7, 4, 2}, {5, 8, 3}, {3, 5, 5},
                           {4, 6, 1}}) {
      const std::string what = "R " + std::to_string(R) + " E " + std::to_string(E) + " K " +
                               std::to_string(K) + (normalize ? " normalised" : "");
      Vec logits = random_vec(R * E, rng, -3.0f, 3.0f);
      std::vector<int32_t> idx(R * K, -1);
      Vec w(R * K, std::numeric_limits<float>::quiet_NaN());
      be->moe_router_forward(i32(idx), f32(w), f32(logits), R, E, K, normalize);
      const auto [ref_idx, ref_w] = route_ref(logits, R, E, K, normalize);
      ASSERT_EQ(idx, ref_idx) << what;
      for (std::size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], ref_w[i], 1e-6) << what;
      // d(sum w * Rw)/d logits with the routing fixed (random logits: no near ties at h)
      const Vec Rw = random_vec(R * K, rng);
      Vec dlogits(R * E, std::numeric_limits<float>::quiet_NaN());
      be->moe_router_backward(f32(dlogits), f32(Rw), f32(logits), i32(idx), R, E, K, normalize);
      auto loss = [&] {
        std::vector<int32_t> ix(R * K);
        Vec ww(R * K);
        be->moe_router_forward(i32(ix), f32(ww), f32(logits), R, E, K, normalize);
        EXPECT_EQ(ix, idx) << what << ": the routing moved under the perturbation";
        return dot(ww, Rw);
      };
      EXPECT_LT(rel_err(dlogits, numeric_grad(logits, loss, 1e-3f)), 1e-3) << what;
    }
  }
  // Ties go to the lower expert: all-equal logits pick 0, 1, ... in order.
  Vec flat(6, 0.5f);
  std::vector<int32_t> idx(3);
  Vec w(3);
  be->moe_router_forward(i32(idx), f32(w), f32(flat), 1, 6, 3, false);
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FLOAT_EQ(w[0], 1.0f / 6);
}

// DeepSeek-V3's routing in double (HF DeepseekV3MoE.route_tokens_to_experts, Glm4MoeMoE):
// sigmoid, + bias for the choice, groups scored by their two largest choices, the best
// topk_group kept (the rest 0), the K largest choices; weights the sigmoids (over their sum
// + 1e-20 when normalised) times scale. Returns (idx, weights).
std::pair<std::vector<int32_t>, DVec> sigmoid_route_ref(const Vec& logits, const Vec& bias,
                                                        int64_t R, int64_t E, int64_t K,
                                                        const fsdp::Kernels::SigmoidRouting& g) {
  std::vector<int32_t> idx(static_cast<std::size_t>(R * K));
  DVec w(idx.size());
  const int64_t per = E / g.n_group;
  for (int64_t r = 0; r < R; ++r) {
    DVec s(static_cast<std::size_t>(E)), c(s.size());
    for (int64_t e = 0; e < E; ++e) {
      s[e] = 1 / (1 + std::exp(-double(logits[r * E + e])));
      c[e] = s[e] + bias[e];
    }
    std::vector<int64_t> groups(static_cast<std::size_t>(g.n_group));
    DVec score(groups.size());
    for (int64_t q = 0; q < g.n_group; ++q) {
      DVec in(c.begin() + q * per, c.begin() + (q + 1) * per);
      std::sort(in.rbegin(), in.rend());
      score[q] = in[0] + (per > 1 ? in[1] : 0.0);
      groups[q] = q;
    }
    std::stable_sort(groups.begin(), groups.end(),
                     [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    for (int64_t j = g.topk_group; j < g.n_group; ++j) {
      for (int64_t e = groups[j] * per; e < (groups[j] + 1) * per; ++e) c[e] = 0.0;
    }
    std::vector<int64_t> order(static_cast<std::size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return c[a] > c[b]; });
    double top = 1e-20;
    for (int64_t j = 0; j < K; ++j) top += s[order[j]];
    for (int64_t j = 0; j < K; ++j) {
      idx[r * K + j] = static_cast<int32_t>(order[j]);
      w[r * K + j] = s[order[j]] / (g.normalize ? top : 1.0) * g.scale;
    }
  }
  return {idx, w};
}

TEST_F(LlamaKernels, MoeSigmoidRouterMatchesGroupLimitedTopKAndGradientCheck) {
  using G = fsdp::Kernels::SigmoidRouting;
  struct Case {
    int64_t R, E, K;
    G g;
  };
  for (const Case& t : {Case{7, 8, 2, G{4, 2, true, 2.5f}}, Case{5, 6, 3, G{1, 1, false, 1.f}},
                        Case{6, 12, 4, G{3, 1, true, 1.f}}, Case{4, 8, 8, G{2, 2, false, 0.5f}},
                        Case{3, 16, 1, G{8, 3, true, 1.f}}}) {
    const std::string what = "R " + std::to_string(t.R) + " E " + std::to_string(t.E) + " K " +
                             std::to_string(t.K) + " groups " + std::to_string(t.g.n_group) +
                             "/" + std::to_string(t.g.topk_group) +
                             (t.g.normalize ? " normalised" : "");
    const int64_t R = t.R, E = t.E, K = t.K;
    Vec logits, bias;
    std::vector<int32_t> idx(R * K, -1);
    Vec w(R * K, std::numeric_limits<float>::quiet_NaN());
    // Draws whose routing no perturbation of 2h (the finite differences' h = 1e-3) moves.
    auto stable = [&] {
      for (std::size_t i = 0; i < logits.size(); ++i) {
        for (float d : {-2e-3f, 2e-3f}) {
          Vec moved = logits;
          moved[i] += d;
          std::vector<int32_t> ix(R * K);
          Vec ww(R * K);
          be->moe_sigmoid_router_forward(i32(ix), f32(ww), f32(moved), f32(bias), R, E, K, t.g);
          if (ix != idx) return false;
        }
      }
      return true;
    };
    int draws = 0;
    do {
      logits = random_vec(R * E, rng, -3.0f, 3.0f);
      bias = random_vec(E, rng, -0.2f, 0.2f);
      be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(logits), f32(bias), R, E, K, t.g);
      ASSERT_LT(++draws, 100) << what;
    } while (!stable());
    const auto [ref_idx, ref_w] = sigmoid_route_ref(logits, bias, R, E, K, t.g);
    ASSERT_EQ(idx, ref_idx) << what;
    for (std::size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(w[i], ref_w[i], 2e-6) << what;
    // The bias picks: without it some token chooses otherwise (it is not a no-op here).
    if (K < E) {
      std::vector<int32_t> plain(R * K);
      Vec pw(R * K), zero(E, 0.f);
      be->moe_sigmoid_router_forward(i32(plain), f32(pw), f32(logits), f32(zero), R, E, K, t.g);
      EXPECT_EQ(plain, sigmoid_route_ref(logits, zero, R, E, K, t.g).first) << what;
    }
    // d(sum w * Rw)/d logits with the routing fixed; the bias gets no gradient
    const Vec Rw = random_vec(R * K, rng);
    Vec dlogits(R * E, std::numeric_limits<float>::quiet_NaN());
    be->moe_sigmoid_router_backward(f32(dlogits), f32(Rw), f32(logits), i32(idx), R, E, K, t.g);
    auto loss = [&] {
      std::vector<int32_t> ix(R * K);
      Vec ww(R * K);
      be->moe_sigmoid_router_forward(i32(ix), f32(ww), f32(logits), f32(bias), R, E, K, t.g);
      EXPECT_EQ(ix, idx) << what << ": the routing moved under the perturbation";
      return dot(ww, Rw);
    };
    EXPECT_LT(rel_err(dlogits, numeric_grad(logits, loss, 1e-3f)), 1e-3) << what;
    for (int64_t r = 0; r < R; ++r) {  // zero off the chosen experts
      for (int64_t e = 0; e < E; ++e) {
        bool chosen = false;
        for (int64_t j = 0; j < K; ++j) chosen = chosen || idx[r * K + j] == e;
        if (!chosen) ASSERT_EQ(dlogits[r * E + e], 0.f) << what;
      }
    }
  }
  // Ties go to the lower group and the lower expert; a masked group's experts score 0 (HF's
  // masked_fill 0.0), and once the kept ones are taken the lowest of them is next.
  Vec flat(8, 0.f), nobias(8, 0.f);
  std::vector<int32_t> idx(3);
  Vec w(3);
  be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(flat), f32(nobias), 1, 8, 3,
                                 G{4, 1, false, 1.f});
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  Vec neg = {-0.9f, -0.9f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f}, low(8, -3.f);
  low[0] = low[1] = 3.f;  // group 0's sigmoids near 1, minus 0.9: choices ~0.05 > 0
  be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(low), f32(neg), 1, 8, 3,
                                 G{4, 1, true, 1.f});
  EXPECT_EQ(idx, (std::vector<int32_t>{0, 1, 2}));  // then expert 2, masked to 0
}

TEST_F(LlamaKernels, MoeCombineIsTheWeightedSumAndGradientCheck) {
  const int64_t R = 5, K = 3, C = 19, N = R * K;
  std::vector<int32_t> slot(N);
  for (int64_t i = 0; i < N; ++i) slot[i] = static_cast<int32_t>((i * 7) % N);  // a permutation
  Vec rows = random_vec(N * C, rng), w = random_vec(R * K, rng, 0.f, 1.f);
  Vec out(R * C, std::numeric_limits<float>::quiet_NaN());
  be->moe_combine_forward(f32(out), f32(rows), f32(w), i32(slot), R, K, C);
  Vec sum(R * C);
  be->moe_combine_forward(f32(sum), f32(rows), TensorView{}, i32(slot), R, K, C);  // weights 1
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      double want = 0, plain = 0;
      for (int64_t j = 0; j < K; ++j) {
        want += double(w[r * K + j]) * rows[slot[r * K + j] * C + c];
        plain += rows[slot[r * K + j] * C + c];
      }
      ASSERT_NEAR(out[r * C + c], want, 1e-6) << r << " " << c;
      ASSERT_NEAR(sum[r * C + c], plain, 1e-6) << r << " " << c;
    }
  }
  const Vec Rw = random_vec(R * C, rng);
  Vec drows(N * C, std::numeric_limits<float>::quiet_NaN()), dw(R * K);
  be->moe_combine_backward(f32(drows), f32(dw), f32(Rw), f32(rows), f32(w), i32(slot), R, K, C);
  auto loss = [&] {
    Vec o(R * C);
    be->moe_combine_forward(f32(o), f32(rows), f32(w), i32(slot), R, K, C);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(drows, numeric_grad(rows, loss, 1e-2f)), 1e-4);
  EXPECT_LT(rel_err(dw, numeric_grad(w, loss, 1e-2f)), 1e-4);
}

// The load-balancing loss (HF's load_balancing_loss_func): the probability sums against a
// double softmax, the loss term alpha sum_e counts_e psum_e, and the backward against finite
// differences of that term through the softmax.
TEST_F(LlamaKernels, MoeLoadBalancingLossAndGradientCheck) {
  const int64_t R = 9, E = 5;
  Vec logits = random_vec(R * E, rng, -2.0f, 2.0f);
  Vec psum = {0.5f, 0.f, 0.f, 1.f, 0.f};  // accumulated onto
  be->moe_router_prob_sums(f32(psum), f32(logits), R, E);
  const Vec start = {0.5f, 0.f, 0.f, 1.f, 0.f};
  DVec want(E, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    double mx = -1e300, z = 0;
    for (int64_t e = 0; e < E; ++e) mx = std::max(mx, double(logits[r * E + e]));
    for (int64_t e = 0; e < E; ++e) z += std::exp(logits[r * E + e] - mx);
    for (int64_t e = 0; e < E; ++e) want[e] += std::exp(logits[r * E + e] - mx) / z;
  }
  for (int64_t e = 0; e < E; ++e) EXPECT_NEAR(psum[e], start[e] + want[e], 1e-5) << e;
  const Vec counts = {3.f, 0.f, 7.f, 1.f, 2.f};
  double loss = 0.125;
  be->moe_aux_loss(TensorView(&loss, DType::f64, {1}), f32(counts), f32(psum), E, 0.5);
  double term = 0;
  for (int64_t e = 0; e < E; ++e) term += double(counts[e]) * psum[e];
  EXPECT_NEAR(loss, 0.125 + 0.5 * term, 1e-12);
  // d(sum_e dprobs_e psum_e)/d logits, accumulated onto a starting dlogits
  const Vec dprobs = random_vec(E, rng);
  const Vec dstart = random_vec(R * E, rng);
  Vec dlogits = dstart;
  be->moe_aux_loss_backward(f32(dlogits), f32(logits), f32(dprobs), R, E);
  auto objective = [&] {
    Vec ps(E, 0.f);
    be->moe_router_prob_sums(f32(ps), f32(logits), R, E);
    return dot(ps, dprobs);
  };
  const DVec numeric = numeric_grad(logits, objective, 1e-2f);
  Vec added(R * E);
  for (int64_t i = 0; i < R * E; ++i) added[i] = dlogits[i] - dstart[i];
  EXPECT_LT(rel_err(added, numeric), 1e-3);
}

// Qwen2-MoE's shared expert gate: out += sigmoid(logit) * shared, accumulated; its backward
// against finite differences of sum(out * Rw).
TEST_F(LlamaKernels, MoeSharedGateAndGradientCheck) {
  const int64_t R = 6, C = 13;
  Vec shared = random_vec(R * C, rng), logit = random_vec(R, rng, -3.f, 3.f);
  const Vec start = random_vec(R * C, rng);
  Vec out = start;
  be->moe_shared_gate_forward(f32(out), f32(shared), f32(logit), R, C);
  for (int64_t r = 0; r < R; ++r) {
    const double s = 1.0 / (1.0 + std::exp(-double(logit[r])));
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_NEAR(out[r * C + c], start[r * C + c] + s * shared[r * C + c], 1e-6);
    }
  }
  const Vec Rw = random_vec(R * C, rng);
  Vec dshared(R * C, std::numeric_limits<float>::quiet_NaN()), dlogit(R);
  be->moe_shared_gate_backward(f32(dshared), f32(dlogit), f32(Rw), f32(shared), f32(logit), R,
                               C);
  auto loss = [&] {
    Vec o(R * C, 0.f);
    be->moe_shared_gate_forward(f32(o), f32(shared), f32(logit), R, C);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dshared, numeric_grad(shared, loss, 1e-2f)), 1e-4);
  EXPECT_LT(rel_err(dlogit, numeric_grad(logit, loss, 1e-3f)), 1e-3);
}

TEST_F(LlamaKernels, MoeArgumentErrors) {
  Vec logits(12), w(6), dl(12);
  std::vector<int32_t> idx(6), bad_slot = {0, 1, 2, 3, 4, 6};
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  // K > E, K = 0
  expect_error([&] { be->moe_router_forward(i32(idx), f32(w), f32(logits), 3, 4, 5, true); },
               "moe_router_forward: K = 5 (expected 1 <= K <= E = 4)");
  expect_error([&] { be->moe_router_forward(i32(idx), f32(w), f32(logits), 3, 4, 0, true); },
               "moe_router_forward: K = 0");
  // idx not int32; logits too small
  expect_error([&] { be->moe_router_forward(f32(w), f32(w), f32(logits), 3, 4, 2, true); },
               "moe_router_forward: idx is fp32");
  expect_error([&] { be->moe_router_forward(i32(idx), f32(w), f32(logits), 4, 4, 2, true); },
               "moe_router_forward: idx is int32 [6] but needs at least 8 elements");
  // the sigmoid router's groups: not dividing E, of one expert, more kept than there are
  using G = fsdp::Kernels::SigmoidRouting;
  Vec bias(4);
  expect_error([&] {
    be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(logits), f32(bias), 3, 4, 2,
                                   G{3, 1, true, 1.f});
  }, "moe_sigmoid_router_forward: n_group = 3 (expected 1, or a divisor of E = 4 into groups "
     "of at least 2 experts)");
  expect_error([&] {
    be->moe_sigmoid_router_backward(f32(dl), f32(w), f32(logits), i32(idx), 3, 4, 2,
                                    G{4, 1, true, 1.f});
  }, "moe_sigmoid_router_backward: n_group = 4");
  expect_error([&] {
    be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(logits), f32(bias), 3, 4, 2,
                                   G{2, 3, true, 1.f});
  }, "moe_sigmoid_router_forward: topk_group = 3 (expected 1 <= topk_group <= n_group = 2)");
  Vec short_bias(3);
  expect_error([&] {
    be->moe_sigmoid_router_forward(i32(idx), f32(w), f32(logits), f32(short_bias), 3, 4, 2,
                                   G{2, 1, true, 1.f});
  }, "moe_sigmoid_router_forward: bias is fp32 [3] but needs at least 4 elements");
  // an expert index out of range in backward; a slot out of range
  std::vector<int32_t> bad_idx = {0, 1, 2, 3, 0, 4};
  expect_error([&] {
    be->moe_router_backward(f32(dl), f32(w), f32(logits), i32(bad_idx), 3, 4, 2, true);
  }, "moe_router_backward: idx holds 4 at position 5");
  Vec rows(6 * 2), out(3 * 2), drows(6 * 2);
  expect_error(
      [&] { be->moe_combine_forward(f32(out), f32(rows), f32(w), i32(bad_slot), 3, 2, 2); },
      "moe_combine_forward: slot holds 6 at position 5 (expected 0 <= value < 6");
  // out overlapping rows; drows overlapping dout
  expect_error([&] {
    be->moe_combine_forward(f32(rows), f32(rows), f32(w), i32(idx), 3, 2, 2);
  }, "moe_combine_forward: out overlaps rows");
  expect_error([&] {
    be->moe_combine_backward(f32(drows), f32(w), f32(drows), f32(rows), f32(w), i32(idx), 3, 2, 2);
  }, "moe_combine_backward: drows overlaps dout");
}

// ---------------------------------------------------------------------------------------
// "store bf16/fp16, compute fp32": each 16-bit result is round_to(dtype, the fp32 kernel on
// the same rounded values), bit for bit; fp32 outputs (lse) equal.

class Store {
 public:
  Store(DType t, const Vec& v) : t_(t), f_(v) {
    if (t != DType::f32) {
      h_.resize(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) {
        h_[i] = t == DType::bf16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
      }
    }
  }
  TensorView view() {
    const auto n = static_cast<int64_t>(f_.size());
    return {t_ == DType::f32 ? static_cast<void*>(f_.data()) : h_.data(), t_, {n}};
  }
  Vec values() const {
    if (t_ == DType::f32) return f_;
    Vec v(h_.size());
    for (std::size_t i = 0; i < h_.size(); ++i) {
      v[i] = t_ == DType::bf16 ? bf16_to_f32(h_[i]) : f16_to_f32(h_[i]);
    }
    return v;
  }

 private:
  DType t_;
  Vec f_;
  std::vector<uint16_t> h_;
};

Vec rounded(const Vec& v, DType t) {
  Vec r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = round_to(t, v[i]);
  return r;
}

void expect_rounded(DType dt, const Vec& ref, const Vec& got, const std::string& what) {
  ASSERT_EQ(ref.size(), got.size()) << what;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_EQ(bits(round_to(dt, ref[i])), bits(got[i]))
        << what << " (" << to_string(dt) << ") element " << i << ": got " << got[i]
        << ", want round_to(" << ref[i] << ")";
  }
}

constexpr DType k16[] = {DType::bf16, DType::f16};

TEST_F(LlamaKernels, StoreContractRopeAndSwiglu) {
  const int64_t B = 2, T = 5, H = 3, D = 8, n = B * T * H * D;
  Vec cos, sin;
  rope_tables(T, D, 10000.0, cos, sin);
  for (DType dt : k16) {
    const Vec x = rounded(random_vec(n, rng, -3.0f, 3.0f), dt);
    const Vec gate = rounded(random_vec(n, rng, -5.0f, 5.0f), dt), up = rounded(random_vec(n, rng), dt);
    // fp32 references
    Vec ro(n), rd(n), so(n), sg(n), su(n);
    be->rope_forward(f32(ro), f32(x), f32(cos), f32(sin), B, T, H, D, D);
    be->rope_backward(f32(rd), f32(x), f32(cos), f32(sin), B, T, H, D, D);
    be->swiglu_forward(f32(so), f32(gate), f32(up));
    be->swiglu_backward(f32(sg), f32(su), f32(x), f32(gate), f32(up));
    // 16-bit storage, also in place (out = x, dgate = gate, dup = up)
    Store sx(dt, x), o(dt, Vec(n)), sgate(dt, gate), sup(dt, up), dg(dt, Vec(n)), du(dt, Vec(n));
    be->rope_forward(o.view(), sx.view(), f32(cos), f32(sin), B, T, H, D, D);
    expect_rounded(dt, ro, o.values(), "rope_forward");
    be->rope_backward(o.view(), sx.view(), f32(cos), f32(sin), B, T, H, D, D);
    expect_rounded(dt, rd, o.values(), "rope_backward");
    Store inplace(dt, x);
    be->rope_forward(inplace.view(), inplace.view(), f32(cos), f32(sin), B, T, H, D, D);
    expect_rounded(dt, ro, inplace.values(), "rope_forward in place");
    be->swiglu_forward(o.view(), sgate.view(), sup.view());
    expect_rounded(dt, so, o.values(), "swiglu_forward");
    be->swiglu_backward(dg.view(), du.view(), sx.view(), sgate.view(), sup.view());
    expect_rounded(dt, sg, dg.values(), "swiglu_backward dgate");
    expect_rounded(dt, su, du.values(), "swiglu_backward dup");
    be->swiglu_backward(sgate.view(), sup.view(), sx.view(), sgate.view(), sup.view());
    expect_rounded(dt, sg, sgate.values(), "swiglu_backward dgate = gate");
    expect_rounded(dt, su, sup.values(), "swiglu_backward dup = up");
  }
}

TEST_F(LlamaKernels, StoreContractGqaAttention) {
  const GqaShape s{2, 9, 4, 2, 8};
  const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
  const float scale = 1.0f / std::sqrt(8.0f);
  for (DType dt : k16) {
    const Vec q = rounded(random_vec(nq, rng, -2.0f, 2.0f), dt),
              k = rounded(random_vec(nk, rng, -2.0f, 2.0f), dt), v = rounded(random_vec(nk, rng), dt),
              dout = rounded(random_vec(nq, rng), dt);
    // fp32 on the rounded values; backward reads out as stored (rounded)
    Vec out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
    be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv, s.D,
                              scale, 0, 0.f, TensorView{});
    const Vec out_r = rounded(out, dt);
    be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v),
                               f32(out_r), f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, 0, 0.f,
                               TensorView{});
    Store sq(dt, q), sk(dt, k), sv(dt, v), sd(dt, dout), so(dt, Vec(nq)), gq(dt, Vec(nq)),
        gk(dt, Vec(nk)), gv(dt, Vec(nk));
    Vec lse16(nl);
    be->gqa_attention_forward(so.view(), f32(lse16), sq.view(), sk.view(), sv.view(), s.B, s.T, s.H,
                              s.Hkv, s.D, scale, 0, 0.f, TensorView{});
    expect_rounded(dt, out, so.values(), "gqa out");
    expect_same_bits(lse, lse16, std::string("gqa lse ") + std::string(to_string(dt)));
    be->gqa_attention_backward(gq.view(), gk.view(), gv.view(), sd.view(), sq.view(), sk.view(),
                               sv.view(), so.view(), f32(lse16), s.B, s.T, s.H, s.Hkv, s.D, scale,
                               0, 0.f, TensorView{});
    expect_rounded(dt, dq, gq.values(), "gqa dq");
    expect_rounded(dt, dk, gk.values(), "gqa dk");
    expect_rounded(dt, dv, gv.values(), "gqa dv");
    // and the 16-bit output is within one rounding of the fp32 one
    const Vec o16 = so.values();
    for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(o16[i], out[i], 1e-2) << i;
  }
}

// ---------------------------------------------------------------------------------------
// gpt-oss pieces: the clamped SwiGLU on interleaved gate/up pairs and attention sinks

// kernels.hpp's clamped_swiglu_forward/backward in double: g = min(gate, limit), u =
// clamp(up, -limit, limit), out = (u + 1) g sigmoid(alpha g); d gate passes where gate <=
// limit, d up where -limit <= up <= limit (a value on a bound passes).
struct ClampedRef {
  DVec out, dgate_up;
};
ClampedRef clamped_swiglu_ref(const Vec& gate_up, const Vec& dout, float alpha, float limit) {
  const std::size_t n = gate_up.size() / 2;
  const double a = alpha, lim = limit;
  ClampedRef r{DVec(n), DVec(2 * n)};
  for (std::size_t i = 0; i < n; ++i) {
    const double gate = gate_up[2 * i], up = gate_up[2 * i + 1];
    const double g = std::min(gate, lim), u = std::clamp(up, -lim, lim);
    const double s = 1.0 / (1.0 + std::exp(-a * g));
    r.out[i] = (u + 1.0) * g * s;
    r.dgate_up[2 * i] = gate <= lim ? dout[i] * (u + 1.0) * (s + a * g * s * (1.0 - s)) : 0.0;
    r.dgate_up[2 * i + 1] = up >= -lim && up <= lim ? dout[i] * g * s : 0.0;
  }
  return r;
}

// Values against the double formulas (forward and backward), then finite differences of
// L = sum(out * Rw) on `fd` (its values at least 0.5 away from the bounds +-limit).
void check_clamped_swiglu(Backend& be, std::mt19937& rng, const Vec& gate_up, Vec fd, float alpha,
                          float limit, const std::string& what) {
  const int64_t n = static_cast<int64_t>(gate_up.size() / 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Vec dout = random_vec(n, rng);
  Vec out(n, nan), dgu(2 * n, nan);
  be.clamped_swiglu_forward(f32(out), f32(gate_up), alpha, limit);
  be.clamped_swiglu_backward(f32(dgu), f32(dout), f32(gate_up), alpha, limit);
  const ClampedRef ref = clamped_swiglu_ref(gate_up, dout, alpha, limit);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(out[i], ref.out[i], 2e-6 * std::max(1.0, std::abs(ref.out[i])))
        << what << " out " << i << " (gate " << gate_up[2 * i] << ", up " << gate_up[2 * i + 1]
        << ")";
  }
  for (int64_t i = 0; i < 2 * n; ++i) {
    ASSERT_NEAR(dgu[i], ref.dgate_up[i], 2e-6 * std::max(1.0, std::abs(ref.dgate_up[i])))
        << what << " dgate_up " << i << " (value " << gate_up[i] << ")";
    if (ref.dgate_up[i] == 0.0) ASSERT_EQ(dgu[i], 0.0f) << what << " dgate_up " << i;
  }
  // finite differences; no perturbation crosses a bound
  const int64_t m = static_cast<int64_t>(fd.size() / 2);
  for (float x : fd) ASSERT_GE(std::abs(std::abs(x) - limit), 0.5f) << what << " fd value " << x;
  const Vec Rw = random_vec(m, rng);
  Vec dfd(2 * m, nan);
  be.clamped_swiglu_backward(f32(dfd), f32(Rw), f32(fd), alpha, limit);
  auto loss = [&] {
    Vec o(m);
    be.clamped_swiglu_forward(f32(o), f32(fd), alpha, limit);
    return dot(o, Rw);
  };
  EXPECT_LT(rel_err(dfd, numeric_grad(fd, loss, 1e-2f)), 2e-4) << what;
}

// `n` pairs uniform in [lo, hi], each value resampled until it is at least `gap` away from
// +-limit.
Vec pairs_away_from(float limit, int64_t n, std::mt19937& rng, float lo, float hi, float gap) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(2 * n);
  for (auto& x : v) {
    do x = d(rng);
    while (std::abs(std::abs(x) - limit) < gap);
  }
  return v;
}

// HF GptOssExperts._apply_gate: gate clamped above only (min), up on both sides; the gradient
// passes on a bound (torch.clamp) and is 0 beyond it. alpha and limit are honoured (a second
// pair, alpha 1, limit 2.5).
TEST_F(LlamaKernels, ClampedSwigluValuesAndGradientCheck) {
  const float alpha = 1.702f, limit = 7.0f;
  const int64_t n = 83;  // pairs
  Vec gu = random_vec(2 * n, rng, -10.0f, 10.0f);  // pair i: gate gu[2i], up gu[2i + 1]
  gu[0] = 7.0f;                       // pair 0: gate on the bound, passes its gradient
  gu[2] = 7.5f, gu[3] = gu[1];        // pair 1: gate beyond (out uses 7, d gate 0), pair 0's up
  gu[4] = 1.25f, gu[5] = -7.0f;       // pair 2: up on -limit, passes
  gu[6] = 1.25f, gu[7] = 7.0f;        // pair 3: up on +limit, passes
  gu[8] = 1.25f, gu[9] = -8.0f;       // pair 4: up below -limit, d up 0
  gu[10] = 1.25f, gu[11] = 8.0f;      // pair 5: up above +limit, d up 0
  gu[12] = -9.5f, gu[13] = 0.5f;      // pair 6: gate far below -limit, not clamped (min only)
  gu[14] = 0.0f;                      // pair 7: gate 0
  const Vec fd = pairs_away_from(limit, 40, rng, -9.0f, 9.0f, 0.5f);
  check_clamped_swiglu(*be, rng, gu, fd, alpha, limit, "alpha 1.702 limit 7");

  // the explicit cases, exactly
  Vec out(n), dgu(2 * n);
  const Vec ones(n, 1.0f);
  be->clamped_swiglu_forward(f32(out), f32(gu), alpha, limit);
  be->clamped_swiglu_backward(f32(dgu), f32(ones), f32(gu), alpha, limit);
  EXPECT_EQ(bits(out[1]), bits(out[0])) << "gate 7.5 is computed as 7";
  EXPECT_NE(dgu[0], 0.0f) << "gate = limit passes";
  EXPECT_EQ(dgu[2], 0.0f) << "gate > limit: no gradient";
  EXPECT_NE(dgu[3], 0.0f) << "up of a clamped gate still has one";
  EXPECT_NE(dgu[5], 0.0f) << "up = -limit passes";
  EXPECT_NE(dgu[7], 0.0f) << "up = limit passes";
  EXPECT_EQ(dgu[9], 0.0f) << "up < -limit: no gradient";
  EXPECT_EQ(dgu[11], 0.0f) << "up > limit: no gradient";
  EXPECT_NE(dgu[12], 0.0f) << "gate < -limit is not clamped";
  EXPECT_EQ(out[7], 0.0f) << "gate 0";
  // up -8 and 8 compute as -7 and 7: the same as pairs 2 and 3 (the same gate 1.25)
  EXPECT_EQ(bits(out[4]), bits(out[2])) << "up -8 is computed as -7";
  EXPECT_EQ(bits(out[5]), bits(out[3])) << "up 8 is computed as 7";

  // another alpha and limit
  const float alpha2 = 1.0f, limit2 = 2.5f;
  Vec gu2 = random_vec(2 * 37, rng, -5.0f, 5.0f);
  gu2[0] = 2.5f, gu2[2] = 3.0f, gu2[3] = gu2[1];            // pairs 0, 1: gate on, beyond
  gu2[4] = gu2[6] = 0.75f, gu2[5] = -2.5f, gu2[7] = -3.0f;  // pairs 2, 3: up on, beyond -limit
  gu2[8] = gu2[10] = -1.5f, gu2[9] = 2.5f, gu2[11] = 3.0f;  // pairs 4, 5: and +limit
  check_clamped_swiglu(*be, rng, gu2, pairs_away_from(limit2, 40, rng, -5.0f, 5.0f, 0.5f), alpha2,
                       limit2, "alpha 1 limit 2.5");
  Vec o2(37), o1(37), d2(2 * 37);
  be->clamped_swiglu_forward(f32(o2), f32(gu2), alpha2, limit2);
  be->clamped_swiglu_forward(f32(o1), f32(gu2), alpha, limit);
  EXPECT_EQ(bits(o2[1]), bits(o2[0])) << "gate 3 computed as 2.5";
  EXPECT_EQ(bits(o2[3]), bits(o2[2])) << "up -3 computed as -2.5";
  EXPECT_EQ(bits(o2[5]), bits(o2[4])) << "up 3 computed as 2.5";
  EXPECT_NE(o2[1], o1[1]) << "limit 2.5 vs 7 on gate 3";
  EXPECT_NE(o2[6], o1[6]) << "alpha 1 vs 1.702";
  const Vec ones2(37, 1.0f);
  be->clamped_swiglu_backward(f32(d2), f32(ones2), f32(gu2), alpha2, limit2);
  EXPECT_NE(d2[0], 0.0f);
  EXPECT_EQ(d2[2], 0.0f);
  EXPECT_NE(d2[5], 0.0f);
  EXPECT_EQ(d2[7], 0.0f);
  EXPECT_NE(d2[9], 0.0f);
  EXPECT_EQ(d2[11], 0.0f);
}

// dgate_up = gate_up equals out of place bit for bit; 16-bit storage is round_to(the fp32
// kernel on the rounded values), out of place and in place.
TEST_F(LlamaKernels, ClampedSwigluInPlaceAndStoreContract) {
  const float alpha = 1.702f, limit = 7.0f;
  const int64_t n = 1000;
  const Vec gu = random_vec(2 * n, rng, -10.0f, 10.0f), dout = random_vec(n, rng);
  Vec dgu(2 * n), inplace = gu;
  be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(gu), alpha, limit);
  be->clamped_swiglu_backward(f32(inplace), f32(dout), f32(inplace), alpha, limit);
  expect_same_bits(dgu, inplace, "clamped_swiglu_backward dgate_up = gate_up");
  for (DType dt : k16) {
    const Vec g = rounded(gu, dt), d = rounded(dout, dt);
    Vec ro(n), rd(2 * n);
    be->clamped_swiglu_forward(f32(ro), f32(g), alpha, limit);
    be->clamped_swiglu_backward(f32(rd), f32(d), f32(g), alpha, limit);
    Store sg(dt, g), sd(dt, d), so(dt, Vec(n)), sdg(dt, Vec(2 * n));
    be->clamped_swiglu_forward(so.view(), sg.view(), alpha, limit);
    expect_rounded(dt, ro, so.values(), "clamped_swiglu_forward");
    be->clamped_swiglu_backward(sdg.view(), sd.view(), sg.view(), alpha, limit);
    expect_rounded(dt, rd, sdg.values(), "clamped_swiglu_backward");
    be->clamped_swiglu_backward(sg.view(), sd.view(), sg.view(), alpha, limit);
    expect_rounded(dt, rd, sg.values(), "clamped_swiglu_backward dgate_up = gate_up");
  }
}

// The softmax with a sink column (HF eager_attention_forward with sinks), in double: per
// (b, h, i), s_j = scale q_i . k_j over the visible j (j <= i, and j > i - window when
// window > 0), p = softmax over [s..., sink], out = sum_j p_j v_j (the sink column dropped),
// lse = log(sum_j exp(s_j) + exp(sink)).
struct SinkRef {
  DVec out, lse;
};
SinkRef sink_attention_ref(const GqaShape& s, int64_t window, float scale, const Vec& q,
                           const Vec& k, const Vec& v, const Vec& sinks) {
  const int64_t group = s.H / s.Hkv;
  SinkRef r{DVec(s.B * s.T * s.H * s.D, 0.0), DVec(s.B * s.H * s.T)};
  DVec sc(s.T);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.T; ++i) {
        const int64_t j0 = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
        double mx = sinks[h];
        for (int64_t j = j0; j <= i; ++j) {
          double d = 0.0;
          for (int64_t e = 0; e < s.D; ++e) {
            d += double(q[((b * s.T + i) * s.H + h) * s.D + e]) *
                 k[((b * s.T + j) * s.Hkv + g) * s.D + e];
          }
          sc[j] = double(scale) * d;
          mx = std::max(mx, sc[j]);
        }
        double z = std::exp(double(sinks[h]) - mx);
        for (int64_t j = j0; j <= i; ++j) z += std::exp(sc[j] - mx);
        r.lse[(b * s.H + h) * s.T + i] = mx + std::log(z);
        for (int64_t j = j0; j <= i; ++j) {
          const double p = std::exp(sc[j] - mx) / z;
          for (int64_t e = 0; e < s.D; ++e) {
            r.out[((b * s.T + i) * s.H + h) * s.D + e] +=
                p * v[((b * s.T + j) * s.Hkv + g) * s.D + e];
          }
        }
      }
    }
  }
  return r;
}

Vec normal_vec(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  Vec v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// gqa_attention_forward then attention_sink_forward is the softmax with a sink column (a
// large sink and a very negative one take the two stable branches); the gradients of that
// pair (attention_sink_backward, which adds to dsinks, then gqa_attention_backward on the
// sinked out and lse) against finite differences with respect to q, k, v and sinks.
TEST_F(LlamaKernels, AttentionSinkIsTheSoftmaxWithASinkColumn) {
  for (const auto& [s, window] : std::vector<std::pair<GqaShape, int64_t>>{
           {{2, 6, 4, 2, 4}, 0},
           {{2, 6, 4, 2, 4}, 3},
           {{1, 5, 4, 1, 6}, 0},  // MQA
           {{1, 7, 3, 1, 4}, 2}}) {
    const std::string what = describe(s) + " window=" + std::to_string(window);
    const int64_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.Hkv * s.D, nl = s.B * s.H * s.T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Vec q = random_vec(nq, rng, -1.5f, 1.5f), k = random_vec(nk, rng, -1.5f, 1.5f),
        v = random_vec(nk, rng), sinks = normal_vec(s.H, rng);
    sinks[0] = 20.0f;   // the sink takes nearly all: exp(L - s) branch
    sinks[1] = -30.0f;  // the sink takes nearly nothing: exp(s - L) branch
    auto forward = [&](Vec& out, Vec& lse) {
      be->gqa_attention_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), s.B, s.T, s.H, s.Hkv,
                                s.D, scale, window, 0.f, TensorView{});
      be->attention_sink_forward(f32(out), f32(lse), f32(sinks), s.B, s.T, s.H, s.D);
    };
    Vec out(nq, nan), lse(nl, nan);
    forward(out, lse);
    const SinkRef ref = sink_attention_ref(s, window, scale, q, k, v, sinks);
    for (int64_t i = 0; i < nq; ++i) ASSERT_NEAR(out[i], ref.out[i], 3e-6) << what << " out " << i;
    for (int64_t i = 0; i < nl; ++i) ASSERT_NEAR(lse[i], ref.lse[i], 3e-6) << what << " lse " << i;
    for (int64_t i = 0; i < nl; ++i) {  // head 0's lse is the sink's to within exp(L - 20)
      if ((i / s.T) % s.H == 0) ASSERT_NEAR(lse[i], 20.0, 1e-5) << what << " " << i;
    }

    const Vec Rw = random_vec(nq, rng);
    const float c = 0.75f;
    Vec dsinks(s.H, c), dq(nq, nan), dk(nk, nan), dv(nk, nan);
    be->attention_sink_backward(f32(dsinks), f32(Rw), f32(out), f32(lse), f32(sinks), s.B, s.T,
                                s.H, s.D);
    be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(Rw), f32(q), f32(k), f32(v), f32(out),
                               f32(lse), s.B, s.T, s.H, s.Hkv, s.D, scale, window, 0.f,
                               TensorView{});
    Vec added(s.H);
    for (int64_t h = 0; h < s.H; ++h) added[h] = dsinks[h] - c;
    auto loss = [&] {
      Vec o(nq), l(nl);
      forward(o, l);
      return dot(o, Rw);
    };
    EXPECT_LT(rel_err(dq, numeric_grad(q, loss, 1e-2f)), 5e-4) << "dq " << what;
    EXPECT_LT(rel_err(dk, numeric_grad(k, loss, 1e-2f)), 5e-4) << "dk " << what;
    EXPECT_LT(rel_err(dv, numeric_grad(v, loss, 1e-2f)), 5e-4) << "dv " << what;
    EXPECT_LT(rel_err(added, numeric_grad(sinks, loss, 1e-2f)), 5e-4) << "dsinks " << what;
    // the documented sum in double: dsinks[h] - c = -sum over b, t of p_s (dout . out)
    for (int64_t h = 0; h < s.H; ++h) {
      double want = 0.0;
      for (int64_t b = 0; b < s.B; ++b) {
        for (int64_t t = 0; t < s.T; ++t) {
          double d = 0.0;
          for (int64_t e = 0; e < s.D; ++e) {
            const int64_t at = ((b * s.T + t) * s.H + h) * s.D + e;
            d += double(Rw[at]) * out[at];
          }
          want -= std::exp(double(sinks[h]) - lse[(b * s.H + h) * s.T + t]) * d;
        }
      }
      EXPECT_NEAR(added[h], want, 1e-5 * std::max(1.0, std::abs(want))) << what << " h " << h;
    }
  }
}

// A row with lse = +inf (no visible key) is left as it is by forward and adds nothing to
// dsinks; "store bf16/fp16, compute fp32" for out (forward, in place) and dsinks (backward,
// accumulated onto the loaded value); lse stays fp32, equal bit for bit.
TEST_F(LlamaKernels, AttentionSinkRowWithoutKeysAndStoreContract) {
  const int64_t B = 2, T = 3, H = 2, D = 5, n = B * T * H * D, nl = B * H * T;
  const float inf = std::numeric_limits<float>::infinity();
  const Vec out0 = random_vec(n, rng), dout = random_vec(n, rng);
  Vec lse0 = random_vec(nl, rng, -1.0f, 2.0f);
  const int64_t b0 = 1, h0 = 1, t0 = 2;  // the row without keys
  lse0[(b0 * H + h0) * T + t0] = inf;
  const Vec sinks = {0.5f, 3.0f};  // head 1's sink above some lse values, head 0's mostly below
  auto row = [&](int64_t b, int64_t t, int64_t h) { return ((b * T + t) * H + h) * D; };

  Vec out = out0, lse = lse0;
  be->attention_sink_forward(f32(out), f32(lse), f32(sinks), B, T, H, D);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        const int64_t l = (b * H + h) * T + t;
        if (b == b0 && h == h0 && t == t0) {
          EXPECT_EQ(bits(lse[l]), bits(inf)) << "lse of the row without keys";
          for (int64_t e = 0; e < D; ++e) {
            EXPECT_EQ(bits(out[row(b, t, h) + e]), bits(out0[row(b, t, h) + e])) << e;
          }
          continue;
        }
        const double L = lse0[l], sk = sinks[h];
        EXPECT_NEAR(lse[l], std::log(std::exp(L) + std::exp(sk)), 1e-6) << l;
        const double f = 1.0 / (1.0 + std::exp(sk - L));
        for (int64_t e = 0; e < D; ++e) {
          EXPECT_NEAR(out[row(b, t, h) + e], f * out0[row(b, t, h) + e], 3e-7) << l << " " << e;
        }
      }
    }
  }
  // backward: the row without keys contributes nothing (the same bits with its dout zeroed)
  const float c = -0.375f;
  Vec ds(H, c), ds0(H, c), dz = dout;
  for (int64_t e = 0; e < D; ++e) dz[row(b0, t0, h0) + e] = 0.0f;
  be->attention_sink_backward(f32(ds), f32(dout), f32(out), f32(lse), f32(sinks), B, T, H, D);
  be->attention_sink_backward(f32(ds0), f32(dz), f32(out), f32(lse), f32(sinks), B, T, H, D);
  expect_same_bits(ds, ds0, "dsinks with the row without keys");
  for (int64_t h = 0; h < H; ++h) EXPECT_TRUE(std::isfinite(ds[h])) << h;

  for (DType dt : k16) {
    const std::string name(to_string(dt));
    const Vec o_r = rounded(out0, dt), s_r = rounded(sinks, dt), d_r = rounded(dout, dt);
    // fp32 on the rounded values
    Vec ro = o_r, rl = lse0;
    be->attention_sink_forward(f32(ro), f32(rl), f32(s_r), B, T, H, D);
    Store so(dt, o_r), ss(dt, s_r), sd(dt, d_r);
    Vec l16 = lse0;
    be->attention_sink_forward(so.view(), f32(l16), ss.view(), B, T, H, D);
    expect_rounded(dt, ro, so.values(), "attention_sink_forward out");
    expect_same_bits(rl, l16, "attention_sink_forward lse " + name);
    // backward reads out as stored; dsinks loaded, accumulated in fp32, rounded once
    const Vec stored = so.values();
    Vec rds(H, round_to(dt, 0.3f));
    be->attention_sink_backward(f32(rds), f32(d_r), f32(stored), f32(l16), f32(s_r), B, T, H, D);
    Store sds(dt, Vec(H, 0.3f));
    be->attention_sink_backward(sds.view(), sd.view(), so.view(), f32(l16), ss.view(), B, T, H, D);
    expect_rounded(dt, rds, sds.values(), "attention_sink_backward dsinks");
  }
}

TEST_F(LlamaKernels, GptOssKernelsArgumentErrors) {
  auto expect_error = [](const std::function<void()>& f, const std::string& text) {
    try {
      f();
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Vec gu(8), out(4), dout(4), dgu(8), short_gu(7);
  EXPECT_NO_THROW(be->clamped_swiglu_forward(f32(out), f32(gu), 1.702f, 7.0f));
  EXPECT_NO_THROW(be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(gu), 1.702f, 7.0f));
  EXPECT_NO_THROW(be->clamped_swiglu_backward(f32(gu), f32(dout), f32(gu), 1.702f, 7.0f));
  EXPECT_NO_THROW(be->clamped_swiglu_forward(f32(out), f32(gu), -1.0f, 1e-3f));  // any finite alpha
  // limit 0, negative or infinite; alpha not finite
  expect_error([&] { be->clamped_swiglu_forward(f32(out), f32(gu), 1.702f, 0.0f); },
               "cpu backend: clamped_swiglu_forward: limit = 0");
  expect_error([&] { be->clamped_swiglu_forward(f32(out), f32(gu), 1.702f, -7.0f); },
               "clamped_swiglu_forward: limit = -7");
  expect_error([&] { be->clamped_swiglu_forward(f32(out), f32(gu), 1.702f, inf); },
               "clamped_swiglu_forward: limit = inf (expected > 0 and finite)");
  expect_error([&] { be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(gu), 1.702f, inf); },
               "cpu backend: clamped_swiglu_backward: limit");
  expect_error([&] { be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(gu), 1.702f, nan); },
               "clamped_swiglu_backward: limit");
  expect_error([&] { be->clamped_swiglu_forward(f32(out), f32(gu), nan, 7.0f); },
               "cpu backend: clamped_swiglu_forward: alpha");
  expect_error([&] { be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(gu), -inf, 7.0f); },
               "clamped_swiglu_backward: alpha = -inf (not finite)");
  // gate_up shorter than 2n; dgate_up too
  expect_error([&] { be->clamped_swiglu_forward(f32(out), f32(short_gu), 1.702f, 7.0f); },
               "clamped_swiglu_forward: gate_up is fp32 [7] but needs at least 8 elements");
  expect_error(
      [&] { be->clamped_swiglu_backward(f32(dgu), f32(dout), f32(short_gu), 1.702f, 7.0f); },
      "clamped_swiglu_backward: gate_up is fp32 [7] but needs at least 8 elements");
  expect_error(
      [&] { be->clamped_swiglu_backward(f32(short_gu), f32(dout), f32(gu), 1.702f, 7.0f); },
      "clamped_swiglu_backward: dgate_up is fp32 [7] but needs at least 8 elements");
  // out overlapping gate_up (even partly); dout overlapping dgate_up or gate_up
  expect_error(
      [&] {
        be->clamped_swiglu_forward(TensorView(gu.data(), DType::f32, {4}), f32(gu), 1.702f, 7.0f);
      },
      "clamped_swiglu_forward: out overlaps gate_up");
  expect_error(
      [&] {
        be->clamped_swiglu_forward(TensorView(gu.data() + 6, DType::f32, {2}),
                                   TensorView(gu.data(), DType::f32, {7}), 1.702f, 3.0f);
      },
      "clamped_swiglu_forward: out overlaps gate_up");
  expect_error(
      [&] {
        be->clamped_swiglu_backward(f32(dgu), TensorView(dgu.data() + 4, DType::f32, {4}),
                                    f32(gu), 1.702f, 7.0f);
      },
      "clamped_swiglu_backward: dout overlaps dgate_up");
  expect_error(
      [&] {
        be->clamped_swiglu_backward(f32(dgu), TensorView(gu.data(), DType::f32, {4}), f32(gu),
                                    1.702f, 7.0f);
      },
      "clamped_swiglu_backward: dout overlaps gate_up");

  // attention sinks: B 1, T 2, H 2, D 3
  const int64_t B = 1, T = 2, H = 2, D = 3;
  Vec o(B * T * H * D), d(o.size()), lse(B * H * T), sinks(H), dsinks(H), short_sinks(H - 1);
  EXPECT_NO_THROW(be->attention_sink_forward(f32(o), f32(lse), f32(sinks), B, T, H, D));
  EXPECT_NO_THROW(
      be->attention_sink_backward(f32(dsinks), f32(d), f32(o), f32(lse), f32(sinks), B, T, H, D));
  std::vector<uint16_t> lse16(lse.size());
  const TensorView lse_bf16(lse16.data(), DType::bf16, {B * H * T});
  expect_error([&] { be->attention_sink_forward(f32(o), lse_bf16, f32(sinks), B, T, H, D); },
               "cpu backend: attention_sink_forward: lse is bf16 [4] (expected fp32)");
  expect_error(
      [&] {
        be->attention_sink_backward(f32(dsinks), f32(d), f32(o), lse_bf16, f32(sinks), B, T, H, D);
      },
      "attention_sink_backward: lse is bf16 [4] (expected fp32)");
  expect_error([&] { be->attention_sink_forward(f32(o), f32(lse), f32(short_sinks), B, T, H, D); },
               "attention_sink_forward: sinks is fp32 [1] but needs at least 2 elements");
  expect_error(
      [&] {
        be->attention_sink_backward(f32(dsinks), f32(d), f32(o), f32(lse), f32(short_sinks), B, T,
                                    H, D);
      },
      "attention_sink_backward: sinks is fp32 [1] but needs at least 2 elements");
  expect_error(
      [&] {
        be->attention_sink_backward(f32(short_sinks), f32(d), f32(o), f32(lse), f32(sinks), B, T,
                                    H, D);
      },
      "attention_sink_backward: dsinks is fp32 [1] but needs at least 2 elements");
  expect_error([&] { be->attention_sink_forward(f32(o), f32(lse), f32(sinks), B, T + 1, H, D); },
               "attention_sink_forward: out is fp32 [12] but needs at least 18 elements");
  std::vector<int32_t> isinks(H);
  expect_error(
      [&] { be->attention_sink_forward(f32(o), f32(lse), i32(isinks), B, T, H, D); },
      "attention_sink_forward: sinks is int32 [2] (expected fp32, bf16 or fp16)");
  // dsinks overlapping dout (or the other inputs)
  expect_error(
      [&] {
        be->attention_sink_backward(TensorView(d.data() + 3, DType::f32, {H}), f32(d), f32(o),
                                    f32(lse), f32(sinks), B, T, H, D);
      },
      "cpu backend: attention_sink_backward: dsinks overlaps dout");
  expect_error(
      [&] {
        be->attention_sink_backward(f32(sinks), f32(d), f32(o), f32(lse), f32(sinks), B, T, H, D);
      },
      "attention_sink_backward: dsinks overlaps sinks");
  expect_error(
      [&] {
        be->attention_sink_backward(TensorView(lse.data(), DType::f32, {H}), f32(d), f32(o),
                                    f32(lse), f32(sinks), B, T, H, D);
      },
      "attention_sink_backward: dsinks overlaps lse");
}

}  // namespace
}  // namespace fsdp
