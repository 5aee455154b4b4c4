// src/backend/cpu/cpu_kernels.hpp: the CPU backend's fp32 kernels on raw pointers (internal
// to src/backend/cpu/).
//
// These are the tuned fp32 implementations (OpenBLAS GEMMs, OpenMP splits, vectorised exp;
// see cpu_kernels.cpp). CpuBackend (cpu_backend.cpp) puts the typed Backend interface on
// top: fp32 views go straight through to these functions, bf16/fp16 views are converted to
// fp32 scratch around them ("store 16-bit, compute fp32"). Shapes and semantics are those of
// the same-named Backend kernels (fsdp/backend/kernels.hpp, device_runtime.hpp), with float* arguments, explicit
// element counts, and the reductions returning their double sums.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/core/dtype.hpp"

namespace fsdp::cpu {

// Element counts below which an elementwise loop stays on the calling thread (the fork/join
// of an OpenMP region costs a few microseconds).
inline constexpr int64_t kParallelMinElems = 1 << 15;
// The cross-entropy target that skips its row (fsdp::kIgnoreIndex, torch's ignore_index).
inline constexpr int32_t kIgnoreTarget = -100;

// One attention problem (kernels.hpp's attention_* and mha_*), fp32. Head h of batch b
// reads the [Tq, D] matrix of queries at q + b*Tq*ldq + h*D with row stride ldq (keys and
// values: Tk rows at k + b*Tk*ldk + g*D, stride ldk / ldv, g = h / (H/Hkv) its key/value
// head), writes its output rows at out + b*Tq*ldo + h*D (stride ldo; dout alike) and lse at
// (b*H + h)*Tq. GPT-2: q, k, v are the three column blocks of qkv (ldq = ldk = ldv = 3C),
// ldo = C, D = C/H; Llama (gqa_attention_*): ldq = ldo = H*D, ldk = ldv = Hkv*D.
struct AttentionProblem {
  int64_t B = 0, Tq = 0, Tk = 0, H = 0, D = 0;
  int64_t ldq = 0, ldk = 0, ldv = 0, ldo = 0;
  // Key/value heads (grouped-query attention): query head h reads key/value head
  // h / (H / Hkv), and backward sums dk, dv over each group's query heads in ascending order.
  // 0 means H (every head its own keys and values). H % Hkv != 0 throws.
  int64_t Hkv = 0;
  float scale = 1.0f;
  bool causal = false;             // key j masked for query i when j > i
  // Sliding window (with causal): key j also masked for query i when j <= i - window, so a
  // query sees its `window` latest positions, itself included (HF's sliding_window). 0: none.
  int64_t window = 0;
  // Logit soft-cap (Gemma 2's attn_logit_softcapping): > 0 replaces the scaled score s =
  // scale q.k by softcap * tanh(s / softcap) before the bias and masks; 0: none.
  float softcap = 0.0f;
  // [H,P] by relative position (P = relative_positions(Tq, Tk), kernels.hpp): the bias of
  // query i, key j is bias[h * P + j - i + Tq - 1]; or null.
  const float* bias = nullptr;
  const int32_t* key_mask = nullptr;  // [B,Tk] (0 = padding) or null
  // Document masking (with causal, Tq == Tk): [B,Tq], key j also masked for query i of row b
  // when j < doc_start[b * Tq + i]; rows nondecreasing, doc_start[b,i] <= i. Or null.
  const int32_t* doc_start = nullptr;
};

class CpuKernels {
 public:
  // num_threads >= 1: threads of the OpenMP loops (OpenBLAS itself is set to one thread).
  explicit CpuKernels(int num_threads);
  int num_threads() const { return n_; }

  // ---- dense algebra ----
  // C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C.
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const float* A, const float* B, float beta, float* C) const;
  void add_bias(float* out, const float* bias, int64_t R, int64_t C) const;  // out[R,C] += bias[C]
  void bias_backward(float* dbias, const float* dout, int64_t R,
                     int64_t C) const;  // dbias[C] += colsum
  void add(float* out, const float* a, const float* b, int64_t n) const;
  // h[R,C] = (h + bias[C]) + residual[R,C] in fp32 (bias may be null: h + residual): the
  // values of add_bias then add, in one pass.
  void add_bias_residual(float* h, const float* bias, const float* residual, int64_t R,
                         int64_t C) const;
  void axpy(float* y, float alpha, const float* x, int64_t n) const;
  void scale(float* x, float alpha, int64_t n) const;
  // sum of x[i]^2 over n elements in double (fixed chunks summed in order).
  double squared_norm(const float* x, int64_t n) const;
  // x[n] *= inv_scale; returns true if any x[i] was inf or NaN.
  bool unscale_and_check(float* x, float inv_scale, int64_t n) const;

  // ---- transformer pieces ----
  // tokens [B,T] (forward throws on a negative one); wte [V,C]; wpe [Tmax,C]; out [B,T,C].
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         int64_t B, int64_t T, int64_t C) const;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          int64_t B, int64_t T, int64_t C) const;
  // x [R,C]; weight, bias [C]; out [R,C]; mean, rstd [R].
  void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight,
                         const float* bias, int64_t R, int64_t C, float eps) const;
  void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                          const float* x, const float* weight, const float* mean, const float* rstd,
                          int64_t R, int64_t C) const;
  void gelu_forward(float* out, const float* x, int64_t n) const;
  void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) const;
  // fc [R,C] += bias [C]; out [R,C] = gelu(fc) (out may alias fc): add_bias + gelu_forward.
  void bias_gelu_forward(float* out, float* fc, const float* bias, int64_t R, int64_t C) const;
  // dfc [R,C] = dout * gelu'(fc) (dfc may alias dout); dbias [C] += column sums of dfc:
  // gelu_backward + bias_backward, the same values and summation order.
  void gelu_bias_backward(float* dfc, float* dbias, const float* fc, const float* dout, int64_t R,
                          int64_t C) const;
  // logits [R,ld], classes in columns [0,V), padding columns [V,ld) ignored by the softmax
  // (written 0 with the gradient); targets [R] (throw unless in [0,V) or kIgnoreTarget: such
  // a row adds no loss and, with the gradient, becomes a zero row). Return the summed row
  // losses. softcap > 0: the softmax reads softcap * tanh(logit / softcap) (kernels.hpp).
  double cross_entropy_forward_backward(float* logits, const int32_t* targets, int64_t R, int64_t V,
                                        int64_t ld, float grad_scale, float softcap) const;
  double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t R, int64_t V,
                               int64_t ld, float softcap) const;

  // ---- T5 pieces ----
  // tokens [N] (in range, checked by the caller); table [V,C]; out [N,C].
  void embedding_lookup_forward(float* out, const int32_t* tokens, const float* table, int64_t N,
                                int64_t C) const;
  // dtable[tokens[n]] += dout[n], n ascending (column chunks per thread).
  void embedding_lookup_backward(float* dtable, const float* dout, const int32_t* tokens,
                                 int64_t N, int64_t C) const;
  // x [R,C]; weight [C]; out [R,C]; rstd [R].
  void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t R,
                       int64_t C, float eps) const;
  void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x,
                        const float* weight, const float* rstd, int64_t R, int64_t C) const;
  void relu_forward(float* out, const float* x, int64_t n) const;
  void relu_backward(float* dx, const float* x, const float* dout, int64_t n) const;
  void mul(float* out, const float* a, const float* b, int64_t n) const;
  // GeGLU (kernels.hpp geglu_forward/backward) in fp32 with the intermediate roundings of the
  // unfused chain: gelu(gate) to gate_t, dout * up to dgate_t (fp32: none).
  void geglu_forward(float* out, const float* gate, const float* up, int64_t n, DType gate_t) const;
  void geglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                      const float* up, int64_t n, DType gate_t, DType dgate_t) const;
  // table [NB,H]; buckets [P] (in [0,NB), checked by the caller); bias, dbias [H,P] fp32,
  // P = relative_positions(Tq, Tk). Backward: per head, each bucket's sum over o ascending in
  // double, added to dtable once.
  void position_bias_forward(float* bias, const float* table, const int32_t* buckets, int64_t H,
                             int64_t Tq, int64_t Tk) const;
  void position_bias_backward(float* dtable, const float* dbias, const int32_t* buckets,
                              int64_t NB, int64_t H, int64_t Tq, int64_t Tk) const;
  // ---- Llama pieces ----
  // x, out [B,T,H*D] (out may be x); cos, sin [>= T, R/2]: the first R columns of each head
  // rotated, the rest copied. transpose: the backward (sin negated), rope_backward's dx from
  // dout.
  void rope(float* out, const float* x, const float* cos, const float* sin, int64_t B, int64_t T,
            int64_t H, int64_t D, int64_t R, bool transpose) const;
  // out = silu(gate) up (out may be gate or up).
  void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) const;
  // dgate = dout up silu'(gate), dup = dout silu(gate) (dgate may be gate or dout, dup up).
  void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                       const float* up, int64_t n) const;
  // kernels.hpp's sigmoid_gate_*: out = x sigmoid(gate) (out may be x); dx = dout s, dgate =
  // dout x s (1 - s), s = sigmoid(gate) (dx may be dout, dgate may be gate).
  void sigmoid_gate_forward(float* out, const float* x, const float* gate, int64_t n) const;
  void sigmoid_gate_backward(float* dx, float* dgate, const float* dout, const float* x,
                             const float* gate, int64_t n) const;
  // kernels.hpp's clamped_swiglu_*: out [n] from interleaved gate_up [2n]; dgate_up [2n] (may
  // be gate_up) from dout [n].
  void clamped_swiglu_forward(float* out, const float* gate_up, int64_t n, float alpha,
                              float limit) const;
  void clamped_swiglu_backward(float* dgate_up, const float* dout, const float* gate_up,
                               int64_t n, float alpha, float limit) const;
  // kernels.hpp's attention_sink_*: out, dout [B,T,H*D], lse [B,H,T], sinks, dsinks [H].
  void attention_sink_forward(float* out, float* lse, const float* sinks, int64_t B, int64_t T,
                              int64_t H, int64_t D) const;
  void attention_sink_backward(float* dsinks, const float* dout, const float* out,
                               const float* lse, const float* sinks, int64_t B, int64_t T,
                               int64_t H, int64_t D) const;
  // kernels.hpp's causal_conv1d_*: x, out, dx, dout [B,T,C]; weight, dweight [C,K].
  // doc_start: int32 [B,T] or null (no document masking), in this and gated_delta_rule_*.
  void causal_conv1d_forward(float* out, const float* x, const float* weight, int64_t B,
                             int64_t T, int64_t C, int64_t K, const int32_t* doc_start) const;
  void causal_conv1d_backward(float* dx, float* dweight, const float* dout, const float* x,
                              const float* weight, int64_t B, int64_t T, int64_t C, int64_t K,
                              const int32_t* doc_start) const;
  // kernels.hpp's gated_delta_rule_*: qkv, dqkv [B,T,2*Hk*Dk + Hv*Dv]; a, b, da, db [B,T,Hv];
  // A_log, dt_bias, dA_log, ddt_bias [Hv]; out, dout [B,T,Hv*Dv].
  void gated_delta_rule_forward(float* out, const float* qkv, const float* a, const float* b,
                                const float* A_log, const float* dt_bias, int64_t B, int64_t T,
                                int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                const int32_t* doc_start) const;
  void gated_delta_rule_backward(float* dqkv, float* da, float* db, float* dA_log,
                                 float* ddt_bias, const float* dout, const float* qkv,
                                 const float* a, const float* b, const float* A_log,
                                 const float* dt_bias, int64_t B, int64_t T, int64_t Hk,
                                 int64_t Hv, int64_t Dk, int64_t Dv,
                                 const int32_t* doc_start) const;
  // kernels.hpp's strided_copy on fp32 views: element (r, g, c) at r * row + offset + g *
  // group + c * col of each ({row, offset, group, col}); d_group 0 sums the groups.
  void strided_copy(float* dst, const int64_t d[4], const float* src, const int64_t s[4],
                    int64_t R, int64_t G, int64_t W, bool accumulate) const;
  // ---- mixture of experts (kernels.hpp's moe_*; R tokens, E experts, K per token) ----
  // logits [R,E]; idx [R,K] (descending p, ties to the lower expert), w [R,K].
  void moe_router_forward(int32_t* idx, float* w, const float* logits, int64_t R, int64_t E,
                          int64_t K, bool normalize) const;
  // dlogits [R,E] written from dw [R,K].
  void moe_router_backward(float* dlogits, const float* dw, const float* logits,
                           const int32_t* idx, int64_t R, int64_t E, int64_t K,
                           bool normalize) const;
  // Sigmoid routing (kernels.hpp's moe_sigmoid_router_*): s = sigmoid(logits), choice
  // s + bias among the topk_group best of n_group groups (the others 0); idx [R,K], w [R,K]
  // = scale * s (/ (sum + 1e-20) when normalize).
  void moe_sigmoid_router_forward(int32_t* idx, float* w, const float* logits, const float* bias,
                                  int64_t R, int64_t E, int64_t K, int64_t n_group,
                                  int64_t topk_group, bool normalize, float scale) const;
  // dlogits [R,E] written from dw [R,K].
  void moe_sigmoid_router_backward(float* dlogits, const float* dw, const float* logits,
                                   const int32_t* idx, int64_t R, int64_t E, int64_t K,
                                   bool normalize, float scale) const;
  // out [R,C] = sum_j w[r,j] rows[slot[r*K+j]] (w null: 1), j ascending in fp32.
  void moe_combine_forward(float* out, const float* rows, const float* w, const int32_t* slot,
                           int64_t R, int64_t K, int64_t C) const;
  // drows[slot[r*K+j]] = w[r,j] dout[r]; dw[r,j] = dout[r] . rows[slot[r*K+j]] (fp64 sum).
  void moe_combine_backward(float* drows, float* dw, const float* dout, const float* rows,
                            const float* w, const int32_t* slot, int64_t R, int64_t K,
                            int64_t C) const;
  // psum[e] += sum_r softmax(logits[r])[e] (rows in order, fp64).
  void moe_router_prob_sums(float* psum, const float* logits, int64_t R, int64_t E) const;
  // dlogits[r,e] += p[r,e] (dprobs[e] - p[r,:] . dprobs).
  void moe_aux_loss_backward(float* dlogits, const float* logits, const float* dprobs, int64_t R,
                             int64_t E) const;
  // out[r] += sigmoid(logit[r]) shared[r]; backward: dshared = s dout, dlogit = s (1 - s)
  // dout[r] . shared[r] (fp64 sum).
  void moe_shared_gate_forward(float* out, const float* shared, const float* logit, int64_t R,
                               int64_t C) const;
  void moe_shared_gate_backward(float* dshared, float* dlogit, const float* dout,
                                const float* shared, const float* logit, int64_t R,
                                int64_t C) const;
  // ---- attention (FlashAttention-2, blocked; see cpu_kernels.cpp) ----
  // GPT-2's attention_* (causal, packed qkv) and T5's mha_* are both this problem.
  void attention_forward(const AttentionProblem& p, const float* q, const float* k,
                         const float* v, float* out, float* lse) const;
  // dq, dk, dv written (row strides ldq, ldk, ldv as q, k, v); dbias [H,P] (as p.bias)
  // accumulated (or null): dS summed over b and each relative position, in an order fixed by
  // the shapes (independent of the thread count).
  void attention_backward(const AttentionProblem& p, const float* q, const float* k,
                          const float* v, const float* out, const float* lse,
                          const float* dout, float* dq, float* dk, float* dv,
                          float* dbias) const;

  // ---- optimizers (n elements each) ----
  // One pass over the shard on all threads. copy (optional, null = none): n values of
  // copy_dtype (bf16 or fp16 bit patterns) written in the same pass with the updated param
  // rounded to nearest even, the bits from_f32 gives (the param_dtype copy, fused).
  // grad_scale: each grad element is multiplied by it as it is read (1: exactly the gradient).
  void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                    float lr, float beta1, float beta2, float eps, const WeightDecay& weight_decay,
                    int64_t step, void* copy = nullptr, DType copy_dtype = DType::bf16,
                    float grad_scale = 1.0f) const;
  void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                  float momentum, const WeightDecay& weight_decay, int64_t step,
                  void* copy = nullptr, DType copy_dtype = DType::bf16,
                  float grad_scale = 1.0f) const;

  // ---- conversions (n elements; 16-bit values are their bit patterns) ----
  // dst (fp32) = src of dtype `from` (fp32, bf16 or fp16; exact).
  void to_f32(float* dst, const void* src, DType from, int64_t n) const;
  // dst of dtype `to` (fp32, bf16 or fp16) = src rounded to nearest even.
  void from_f32(void* dst, DType to, const float* src, int64_t n) const;
  // dst (dtype `to`) = src (dtype `from`), any of fp32, fp64, bf16, fp16; correctly rounded
  // to nearest even (fp64 -> 16-bit rounds once, not through fp32 twice).
  void cast(void* dst, DType to, const void* src, DType from, int64_t n) const;

 private:
  // Threads for a loop of `work` elements: all of them, or 1 below `min_work`.
  int threads_for(int64_t work, int64_t min_work) const { return work >= min_work ? n_ : 1; }
  // Runs body(c0, c1) over column chunks of [0, C) (multiples of 16 columns), one per thread.
  template <typename Body>
  void for_column_chunks(int64_t C, int64_t R, const Body& body) const;
  // Column sums over R rows, independent of the thread count: body(r0, r1, acc) adds the
  // contribution of rows [r0, r1) (a block whose bounds depend on R alone) to acc[0, W) (zeroed
  // doubles); blocks run in parallel, then finish(total) gets total[w] = the block partials
  // summed in block order.
  template <typename Body, typename Finish>
  void reduce_row_blocks(int64_t R, int64_t W, const Body& body, const Finish& finish) const;

  int n_;
  // reduce_row_blocks' partial sums, grown as needed (the kernels run on one host thread).
  mutable std::vector<double> row_block_partials_;
};

}  // namespace fsdp::cpu
