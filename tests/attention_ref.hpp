// tests/attention_ref.hpp: the naive attention the backends replaced (the T x T probability
// matrix formed, stored and read back), in double precision, as the reference of the CPU
// and CUDA attention tests. Semantics: backend.hpp's mha_forward / mha_backward.
//
// Forward, per (b, h, i): s_j = scale q_i . k_j + bias[h,i,j] over the keys j that are not
// masked (key_mask[b,j] != 0, j <= i when causal, and j > i - window when window > 0: the
// sliding window of gqa_attention_*); P_ij = softmax_j(s); out_i =
// sum_j P_ij v_j; lse_i = log sum_j exp(s_j) (+inf, out 0 for a row with no key).
// Backward from dout: dP_ij = dout_i . v_j, dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik),
// dq_i = scale sum_j dS_ij k_j, dk_j = scale sum_i dS_ij q_i, dv_j = sum_i P_ij dout_i,
// dbias[h,i,j] = sum over b of dS_ij. (The backends take T5's bias and its gradient by
// relative position, [H, Tq + Tk - 1]: expand_rel_bias and contract_rel_dbias below convert.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace test_util {

struct AttnShape {
  int64_t B, Tq, Tk, H, D;
  float scale;
  bool causal;
  int64_t window = 0;  // > 0: also masked where j <= i - window
  double softcap = 0;  // > 0: scale q.k becomes softcap tanh(scale q.k / softcap) (no bias)
};

struct AttnRef {
  std::vector<double> out, lse, p;    // [B,Tq,H*D], [B,H,Tq], [B,H,Tq,Tk]
  std::vector<double> dq, dk, dv, dbias;  // [B,Tq,H*D], [B,Tk,H*D] x2, [H,Tq,Tk] (with dout)
};

// q: [B,Tq,H*D]; k, v: [B,Tk,H*D]; bias: [H,Tq,Tk] or empty; mask: [B,Tk] or empty; dout:
// [B,Tq,H*D] or empty (no backward).
inline AttnRef naive_attention(const AttnShape& s, const std::vector<float>& q,
                               const std::vector<float>& k, const std::vector<float>& v,
                               const std::vector<float>& bias, const std::vector<int32_t>& mask,
                               const std::vector<float>& dout = {}) {
  const int64_t HD = s.H * s.D;
  AttnRef r;
  r.out.assign(s.B * s.Tq * HD, 0.0);
  r.lse.assign(s.B * s.H * s.Tq, std::numeric_limits<double>::infinity());
  r.p.assign(s.B * s.H * s.Tq * s.Tk, 0.0);
  const bool bwd = !dout.empty();
  if (bwd) {
    r.dq.assign(s.B * s.Tq * HD, 0.0);
    r.dk.assign(s.B * s.Tk * HD, 0.0);
    r.dv.assign(s.B * s.Tk * HD, 0.0);
    r.dbias.assign(s.H * s.Tq * s.Tk, 0.0);
  }
  auto qi = [&](int64_t b, int64_t i, int64_t h) { return (b * s.Tq + i) * HD + h * s.D; };
  auto kj = [&](int64_t b, int64_t j, int64_t h) { return (b * s.Tk + j) * HD + h * s.D; };
  std::vector<double> sc(s.Tk), dp(s.Tk), dcap(s.Tk, 1.0);
  std::vector<bool> on(s.Tk);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.Tq; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < s.Tk; ++j) {
          on[j] = !(s.causal && j > i) && !(s.window > 0 && j <= i - s.window) &&
                  (mask.empty() || mask[b * s.Tk + j] != 0);
          if (!on[j]) continue;
          double d = 0.0;
          for (int64_t e = 0; e < s.D; ++e) {
            d += static_cast<double>(q[qi(b, i, h) + e]) * k[kj(b, j, h) + e];
          }
          sc[j] = static_cast<double>(s.scale) * d;
          if (s.softcap > 0) {
            const double th = std::tanh(sc[j] / s.softcap);
            sc[j] = s.softcap * th;
            dcap[j] = 1.0 - th * th;
          }
          sc[j] += bias.empty() ? 0.0 : bias[(h * s.Tq + i) * s.Tk + j];
          mx = std::max(mx, sc[j]);
        }
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // no key: 0, lse +inf
        double sum = 0.0;
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (on[j]) sum += std::exp(sc[j] - mx);
        }
        r.lse[(b * s.H + h) * s.Tq + i] = mx + std::log(sum);
        double* prow = &r.p[((b * s.H + h) * s.Tq + i) * s.Tk];
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!on[j]) continue;
          prow[j] = std::exp(sc[j] - mx) / sum;
          for (int64_t e = 0; e < s.D; ++e) r.out[qi(b, i, h) + e] += prow[j] * v[kj(b, j, h) + e];
        }
        if (!bwd) continue;
        double dot = 0.0;
        for (int64_t j = 0; j < s.Tk; ++j) {
          dp[j] = 0.0;
          if (!on[j]) continue;
          for (int64_t e = 0; e < s.D; ++e) {
            dp[j] += static_cast<double>(dout[qi(b, i, h) + e]) * v[kj(b, j, h) + e];
          }
          dot += prow[j] * dp[j];
        }
        for (int64_t j = 0; j < s.Tk; ++j) {
          if (!on[j]) continue;
          const double ds = prow[j] * (dp[j] - dot);
          r.dbias[(h * s.Tq + i) * s.Tk + j] += ds;
          const double dsc = ds * dcap[j];  // through the soft-cap
          for (int64_t e = 0; e < s.D; ++e) {
            r.dq[qi(b, i, h) + e] += s.scale * dsc * k[kj(b, j, h) + e];
            r.dk[kj(b, j, h) + e] += s.scale * dsc * q[qi(b, i, h) + e];
            r.dv[kj(b, j, h) + e] += prow[j] * dout[qi(b, i, h) + e];
          }
        }
      }
    }
  }
  return r;
}

// T5's bias by relative position (fsdp/backend/kernels.hpp, relative_positions): rel
// [H, Tq + Tk - 1] -> the [H,Tq,Tk] bias naive_attention takes, element (h, i, j) =
// rel[h, j - i + Tq - 1]. Empty in, empty out.
inline std::vector<float> expand_rel_bias(const std::vector<float>& rel, int64_t H, int64_t Tq,
                                          int64_t Tk) {
  if (rel.empty()) return {};
  const int64_t P = Tq + Tk - 1;
  std::vector<float> full(static_cast<std::size_t>(H * Tq * Tk));
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < Tq; ++i) {
      for (int64_t j = 0; j < Tk; ++j) full[(h * Tq + i) * Tk + j] = rel[h * P + j - i + Tq - 1];
    }
  }
  return full;
}
// The reverse for gradients: dbias [H,Tq,Tk] -> [H, Tq + Tk - 1], element (h, o) = the sum of
// dbias[h,i,j] over the (i, j) with j - i + Tq - 1 = o (i ascending), in double.
inline std::vector<double> contract_rel_dbias(const std::vector<double>& dbias, int64_t H,
                                              int64_t Tq, int64_t Tk) {
  const int64_t P = Tq > 0 && Tk > 0 ? Tq + Tk - 1 : 0;
  std::vector<double> rel(static_cast<std::size_t>(H * P), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < Tq; ++i) {
      for (int64_t j = 0; j < Tk; ++j) rel[h * P + j - i + Tq - 1] += dbias[(h * Tq + i) * Tk + j];
    }
  }
  return rel;
}

// GPT-2's packed layout: qkv [B,T,3C] <-> q, k, v [B,T,C] (C = H*D).
inline void split_qkv(const std::vector<float>& qkv, int64_t BT, int64_t C, std::vector<float>& q,
                      std::vector<float>& k, std::vector<float>& v) {
  q.resize(BT * C);
  k.resize(BT * C);
  v.resize(BT * C);
  for (int64_t r = 0; r < BT; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      q[r * C + c] = qkv[r * 3 * C + c];
      k[r * C + c] = qkv[r * 3 * C + C + c];
      v[r * C + c] = qkv[r * 3 * C + 2 * C + c];
    }
  }
}
inline std::vector<double> join_qkv(const std::vector<double>& q, const std::vector<double>& k,
                                    const std::vector<double>& v, int64_t BT, int64_t C) {
  std::vector<double> qkv(BT * 3 * C);
  for (int64_t r = 0; r < BT; ++r) {
    for (int64_t c = 0; c < C; ++c) {
      qkv[r * 3 * C + c] = q[r * C + c];
      qkv[r * 3 * C + C + c] = k[r * C + c];
      qkv[r * 3 * C + 2 * C + c] = v[r * C + c];
    }
  }
  return qkv;
}

}  // namespace test_util
