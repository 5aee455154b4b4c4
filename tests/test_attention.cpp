// tests/test_attention.cpp: the CPU backend's blocked attention (FlashAttention-2 on 64 x 256
// tiles, backend.hpp) against the naive attention it replaced (tests/attention_ref.hpp, in
// double): fp32, every element of out, lse, dq, dk, dv and dbias within 1e-5 of the
// reference (relative to the largest magnitude of that tensor, at least 1). Shapes around
// the tile sizes (64 queries: T = 1, 63, 64, 65; 256 keys: 255, 256, 257) and T = 1024 (16
// query and 4 key tiles, small B, H, D), GPT-2's
// causal packed attention and T5's mha: causal + bias (decoder self-attention), key padding
// + bias (encoder), Tq != Tk with padding (cross-attention), fully padded batch rows. T5's
// bias and dbias are by relative position, [H, Tq + Tk - 1] (kernels.hpp): a random bias is
// expanded to the reference's [H,Tq,Tk] and the reference's dbias summed along its diagonals.
// Also: results independent of the thread count bit for bit, and dbias accumulates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "attention_ref.hpp"
#include "fsdp/backend/cpu_backend.hpp"
#include "fsdp/backend/kernels.hpp"

namespace fsdp {
namespace {

using test_util::AttnRef;
using test_util::AttnShape;
using Vec = std::vector<float>;
using Tokens = std::vector<int32_t>;

constexpr double kTol = 1e-5;

Vec random_vec(int64_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(static_cast<std::size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}
TensorView f32(const Vec& v) { return {v.data(), DType::f32, {static_cast<int64_t>(v.size())}}; }
TensorView i32(const Tokens& v) { return {v.data(), DType::i32, {static_cast<int64_t>(v.size())}}; }

// |got - ref| <= kTol * max(1, max |ref|) elementwise; infinities must match exactly.
void expect_close(const Vec& got, const std::vector<double>& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 1.0;
  for (double r : ref) {
    if (std::isfinite(r)) scale = std::max(scale, std::abs(r));
  }
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(ref[i])) {
      if (got[i] != ref[i] && bad++ == 0) first = i;
      continue;
    }
    const double err = std::abs(got[i] - ref[i]);
    worst = std::max(worst, err / scale);
    if (!(err <= kTol * scale) && bad++ == 0) first = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << ": got " << got[first] << ", want "
                     << ref[first] << " (worst relative error " << worst << ")";
}

std::string describe(const AttnShape& s) {
  return "B=" + std::to_string(s.B) + " Tq=" + std::to_string(s.Tq) + " Tk=" +
         std::to_string(s.Tk) + " H=" + std::to_string(s.H) + " D=" + std::to_string(s.D) +
         (s.causal ? " causal" : "");
}

// GPT-2's attention_forward/backward (causal, packed qkv, scale 1/sqrt(hs)) vs the reference.
void check_gpt2(Backend& be, std::mt19937& rng, int64_t B, int64_t T, int64_t H, int64_t hs) {
  const int64_t C = H * hs, BT = B * T;
  const Vec qkv = random_vec(BT * 3 * C, rng, -1.5f, 1.5f), dout = random_vec(BT * C, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec out(BT * C, nan), lse(B * H * T, nan), dqkv(BT * 3 * C, nan);  // all written
  be.attention_forward(f32(out), f32(lse), f32(qkv), B, T, C, H, TensorView{});
  be.attention_backward(f32(dqkv), f32(dout), f32(qkv), f32(out), f32(lse), B, T, C, H,
                        TensorView{});
  Vec q, k, v;
  test_util::split_qkv(qkv, BT, C, q, k, v);
  const AttnShape s{B, T, T, H, hs, 1.0f / std::sqrt(static_cast<float>(hs)), true};
  const AttnRef r = test_util::naive_attention(s, q, k, v, {}, {}, dout);
  const std::string what = "gpt2 " + describe(s);
  expect_close(out, r.out, what + " out");
  expect_close(lse, r.lse, what + " lse");
  expect_close(dqkv, test_util::join_qkv(r.dq, r.dk, r.dv, BT, C), what + " dqkv");
}

struct MhaCase {
  AttnShape s;
  bool bias, mask;
};

// Keys padded by batch row: row b pads its last (b * 3) % (Tk + 1) keys; with Tk >= 1 and
// B >= 2 some row is fully padded when `full_row`.
Tokens padding_mask(int64_t B, int64_t Tk, bool full_row) {
  Tokens m(static_cast<std::size_t>(B * Tk), 1);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t pad = (full_row && b == B - 1) ? Tk : std::min(Tk - 1, (b * 3) % (Tk + 1));
    for (int64_t j = Tk - pad; j < Tk; ++j) m[b * Tk + j] = 0;
  }
  return m;
}

void check_mha(Backend& be, std::mt19937& rng, const MhaCase& c, bool full_row = false) {
  const AttnShape& s = c.s;
  const int64_t HD = s.H * s.D, nq = s.B * s.Tq * HD, nk = s.B * s.Tk * HD;
  const int64_t nb = s.H * relative_positions(s.Tq, s.Tk);  // bias, dbias [H,P]
  const Vec q = random_vec(nq, rng, -1.5f, 1.5f), k = random_vec(nk, rng, -1.5f, 1.5f),
            v = random_vec(nk, rng), dout = random_vec(nq, rng);
  const Vec bias = c.bias ? random_vec(nb, rng, -2.0f, 2.0f) : Vec{};
  const Tokens mask = c.mask ? padding_mask(s.B, s.Tk, full_row) : Tokens{};
  const TensorView bv = c.bias ? f32(bias) : TensorView{}, mv = c.mask ? i32(mask) : TensorView{};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Vec out(nq, nan), lse(s.B * s.H * s.Tq, nan), dq(nq, nan), dk(nk, nan), dv(nk, nan);
  Vec dbias(nb, 0.25f);  // accumulates
  be.mha_forward(f32(out), f32(lse), f32(q), f32(k), f32(v), bv, mv, s.B, s.Tq, s.Tk, s.H, s.D,
                 s.scale, s.causal);
  be.mha_backward(f32(dq), f32(dk), f32(dv), f32(dbias), f32(dout), f32(q), f32(k), f32(v),
                  f32(out), f32(lse), bv, mv, s.B, s.Tq, s.Tk, s.H, s.D, s.scale, s.causal);
  const AttnRef r = test_util::naive_attention(
      s, q, k, v, test_util::expand_rel_bias(bias, s.H, s.Tq, s.Tk), mask, dout);
  const std::string what = "mha " + describe(s) + (c.bias ? " bias" : "") + (c.mask ? " mask" : "");
  expect_close(out, r.out, what + " out");
  expect_close(lse, r.lse, what + " lse");
  expect_close(dq, r.dq, what + " dq");
  expect_close(dk, r.dk, what + " dk");
  expect_close(dv, r.dv, what + " dv");
  for (auto& g : dbias) g -= 0.25f;
  expect_close(dbias, test_util::contract_rel_dbias(r.dbias, s.H, s.Tq, s.Tk), what + " dbias");
  // padded keys: exactly zero dk and dv
  for (int64_t b = 0; b < (c.mask ? s.B : 0); ++b) {
    for (int64_t j = 0; j < s.Tk; ++j) {
      if (mask[b * s.Tk + j] != 0) continue;
      for (int64_t e = 0; e < HD; ++e) {
        ASSERT_EQ(dk[(b * s.Tk + j) * HD + e], 0.0f) << what;
        ASSERT_EQ(dv[(b * s.Tk + j) * HD + e], 0.0f) << what;
      }
    }
  }
}

class BlockedAttention : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> be = make_cpu_backend(2);
  std::mt19937 rng{2024};
};

TEST_F(BlockedAttention, Gpt2AroundTheTileSize) {
  for (int64_t T : {1, 2, 63, 64, 65, 130, 255, 256, 257}) check_gpt2(*be, rng, 2, T, 2, 16);
}

TEST_F(BlockedAttention, Gpt2LongSequence) { check_gpt2(*be, rng, 1, 1024, 1, 8); }

TEST_F(BlockedAttention, Gpt2HeadSize64) { check_gpt2(*be, rng, 1, 100, 2, 64); }

// GPT-2's attention with a document mask (doc_start) equals the grouped-query kernel's on the
// same q, k, v (H key/value heads) with that mask, which tests/test_llama_kernels.cpp checks
// against each document run alone; documents crossing the 64-query tiles.
TEST_F(BlockedAttention, Gpt2DocumentMaskEqualsTheGqaKernels) {
  const int64_t B = 2, T = 150, H = 2, hs = 8, C = H * hs, BT = B * T;
  std::vector<int32_t> start;
  for (const std::vector<int64_t>& docs : {std::vector<int64_t>{1, 70, 79}, {100, 50}}) {
    int64_t t0 = 0;
    for (int64_t n : docs) {
      for (int64_t t = 0; t < n; ++t) start.push_back(static_cast<int32_t>(t0));
      t0 += n;
    }
  }
  const TensorView ds(start.data(), fsdp::DType::i32, {BT});
  const Vec qkv = random_vec(BT * 3 * C, rng, -1.5f, 1.5f), dout = random_vec(BT * C, rng);
  Vec out(BT * C), lse(B * H * T), dqkv(BT * 3 * C);
  be->attention_forward(f32(out), f32(lse), f32(qkv), B, T, C, H, ds);
  be->attention_backward(f32(dqkv), f32(dout), f32(qkv), f32(out), f32(lse), B, T, C, H, ds);
  Vec q, k, v;
  test_util::split_qkv(qkv, BT, C, q, k, v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  Vec gout(BT * C), glse(B * H * T), dq(BT * C), dk(BT * C), dv(BT * C);
  be->gqa_attention_forward(f32(gout), f32(glse), f32(q), f32(k), f32(v), B, T, H, H, hs, scale, 0,
                            0.f, ds);
  be->gqa_attention_backward(f32(dq), f32(dk), f32(dv), f32(dout), f32(q), f32(k), f32(v),
                             f32(gout), f32(glse), B, T, H, H, hs, scale, 0, 0.f, ds);
  expect_close(out, std::vector<double>(gout.begin(), gout.end()), "gpt2 documents out");
  expect_close(lse, std::vector<double>(glse.begin(), glse.end()), "gpt2 documents lse");
  const std::vector<double> want = test_util::join_qkv(
      std::vector<double>(dq.begin(), dq.end()), std::vector<double>(dk.begin(), dk.end()),
      std::vector<double>(dv.begin(), dv.end()), BT, C);
  expect_close(dqkv, want, "gpt2 documents dqkv");
  // and the mask acts: the plain causal output differs
  Vec plain(BT * C), plain_lse(B * H * T);
  be->attention_forward(f32(plain), f32(plain_lse), f32(qkv), B, T, C, H, TensorView{});
  EXPECT_NE(plain, out);
}

TEST_F(BlockedAttention, T5DecoderSelfAttentionCausalBias) {
  for (int64_t T : {1, 63, 64, 65}) check_mha(*be, rng, {{2, T, T, 2, 8, 1.0f, true}, true, false});
  check_mha(*be, rng, {{1, 1024, 1024, 1, 8, 1.0f, true}, true, false});
}

TEST_F(BlockedAttention, T5EncoderPaddingAndBias) {
  for (int64_t T : {1, 63, 64, 65}) check_mha(*be, rng, {{3, T, T, 2, 8, 1.0f, false}, true, true});
  check_mha(*be, rng, {{1, 1024, 1024, 1, 8, 1.0f, false}, true, true});
}

TEST_F(BlockedAttention, T5CrossAttentionTqNeTk) {
  check_mha(*be, rng, {{3, 65, 130, 2, 8, 1.0f, false}, false, true});
  check_mha(*be, rng, {{2, 1, 64, 2, 8, 1.0f, false}, false, true});
  check_mha(*be, rng, {{2, 64, 1, 2, 8, 1.0f, false}, false, false});
  check_mha(*be, rng, {{2, 100, 63, 2, 8, 0.5f, false}, true, true});
  check_mha(*be, rng, {{1, 64, 1024, 1, 8, 1.0f, false}, false, true});
  for (int64_t Tk : {255, 256, 257}) check_mha(*be, rng, {{2, 70, Tk, 2, 8, 1.0f, false}, true, true});
}

TEST_F(BlockedAttention, CausalTqNeTkWithBiasAndPadding) {
  check_mha(*be, rng, {{2, 70, 65, 2, 8, 0.7f, true}, true, true});
  check_mha(*be, rng, {{2, 40, 130, 2, 8, 0.7f, true}, true, true});
}

TEST_F(BlockedAttention, FullyPaddedRowsGiveZeroOutputAndGradients) {
  // The last batch row has every key padded: out 0, lse +inf, dq 0, and no dbias share
  // (the reference has them so; expect_close checks every element and the infinities).
  check_mha(*be, rng, {{3, 65, 70, 2, 8, 1.0f, false}, true, true}, /*full_row=*/true);
  // no keys at all
  const int64_t B = 2, Tq = 5, H = 2, D = 4, nq = B * Tq * H * D;
  const Vec q = random_vec(nq, rng), dout = random_vec(nq, rng), none;
  Vec out(nq, 7.0f), lse(B * H * Tq, 7.0f), dq(nq, 7.0f);
  be->mha_forward(f32(out), f32(lse), f32(q), f32(none), f32(none), TensorView{}, TensorView{}, B,
                  Tq, 0, H, D, 1.0f, false);
  be->mha_backward(f32(dq), f32(none), f32(none), TensorView{}, f32(dout), f32(q), f32(none),
                   f32(none), f32(out), f32(lse), TensorView{}, TensorView{}, B, Tq, 0, H, D, 1.0f,
                   false);
  for (float x : out) ASSERT_EQ(x, 0.0f);
  for (float x : lse) ASSERT_EQ(x, std::numeric_limits<float>::infinity());
  for (float x : dq) ASSERT_EQ(x, 0.0f);
}

TEST_F(BlockedAttention, ResultsIndependentOfThreadCount) {
  auto one = make_cpu_backend(1), five = make_cpu_backend(5);
  // GPT-2: 3 x 2 heads x 3 query tiles
  {
    const int64_t B = 3, T = 150, H = 2, C = 32;
    const Vec qkv = random_vec(B * T * 3 * C, rng), dout = random_vec(B * T * C, rng);
    Vec o[2], l[2], g[2];
    Backend* bes[2] = {be.get(), one.get()};
    for (int r = 0; r < 2; ++r) {
      o[r].assign(B * T * C, 0.0f);
      l[r].assign(B * H * T, 0.0f);
      g[r].assign(B * T * 3 * C, 0.0f);
      bes[r]->attention_forward(f32(o[r]), f32(l[r]), f32(qkv), B, T, C, H, TensorView{});
      bes[r]->attention_backward(f32(g[r]), f32(dout), f32(qkv), f32(o[r]), f32(l[r]), B, T, C, H,
                                 TensorView{});
    }
    EXPECT_EQ(o[0], o[1]);
    EXPECT_EQ(l[0], l[1]);
    EXPECT_EQ(g[0], g[1]);
  }
  // mha with bias, padding and dbias (summed over the batch and the diagonals; 1, 2 and 5
  // threads over 4 x 3 (b, head) units), causal and not
  for (bool causal : {false, true}) {
    const AttnShape s{4, 70, 90, 3, 16, 1.0f, causal};
    const int64_t HD = s.H * s.D, nq = s.B * s.Tq * HD, nk = s.B * s.Tk * HD;
    const int64_t nb = s.H * relative_positions(s.Tq, s.Tk);
    const Vec q = random_vec(nq, rng), k = random_vec(nk, rng), v = random_vec(nk, rng),
              bias = random_vec(nb, rng), dout = random_vec(nq, rng);
    const Tokens mask = padding_mask(s.B, s.Tk, false);
    Vec res[3][6];
    Backend* bes[3] = {be.get(), one.get(), five.get()};
    for (int r = 0; r < 3; ++r) {
      Vec& o = res[r][0];
      Vec& l = res[r][1];
      o.assign(nq, 0.0f);
      l.assign(s.B * s.H * s.Tq, 0.0f);
      res[r][2].assign(nq, 0.0f);
      res[r][3].assign(nk, 0.0f);
      res[r][4].assign(nk, 0.0f);
      res[r][5].assign(nb, 0.5f);
      bes[r]->mha_forward(f32(o), f32(l), f32(q), f32(k), f32(v), f32(bias), i32(mask), s.B, s.Tq,
                          s.Tk, s.H, s.D, s.scale, s.causal);
      bes[r]->mha_backward(f32(res[r][2]), f32(res[r][3]), f32(res[r][4]), f32(res[r][5]),
                           f32(dout), f32(q), f32(k), f32(v), f32(o), f32(l), f32(bias), i32(mask),
                           s.B, s.Tq, s.Tk, s.H, s.D, s.scale, s.causal);
    }
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(res[0][i], res[1][i]) << "output " << i << " causal " << causal;
      EXPECT_EQ(res[2][i], res[1][i]) << "output " << i << " causal " << causal;
    }
  }
}

}  // namespace
}  // namespace fsdp
