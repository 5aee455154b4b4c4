// fsdp/backend/kernels.hpp: the model kernels (dense algebra, the transformer, T5 and Llama
// pieces, attention, cross-entropy) that fsdp/model calls. Each Kernels object runs on one
// DeviceRuntime (fsdp/backend/device_runtime.hpp), which owns the memory its views point
// into, the stream its kernels are enqueued on, and the copies; its conventions (views,
// storage dtypes, device scalars, "writes" vs "accumulates", errors) hold for every kernel
// here. `cpu/` (the numerical reference) and `cuda/` implement both (fsdp::Backend).
//  - B = batch, T = sequence length, C = channels, H = heads, V = vocabulary, R = rows.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "fsdp/backend/device_runtime.hpp"

namespace fsdp {

// Target id whose row the cross-entropy kernels skip (torch's ignore_index default).
inline constexpr int32_t kIgnoreIndex = -100;

// Relative positions of Tq queries and Tk keys: o = j - i + Tq - 1 in [0, Tq + Tk - 1) for
// query i and key j (0 when either length is 0). T5's position bias depends on j - i alone
// (HF T5Attention.compute_bias: relative_position = memory_position - context_position), so
// the kernels below keep it, and its gradient, as [H, relative_positions(Tq, Tk)] rather
// than [H, Tq, Tk]: the bias of (i, j) is bias[h, j - i + Tq - 1].
inline constexpr int64_t relative_positions(int64_t Tq, int64_t Tk) {
  return Tq > 0 && Tk > 0 ? Tq + Tk - 1 : 0;
}

// A captured sequence of kernel calls that launch() enqueues again on the compute stream,
// with the same arguments (the same pointers: it reads and writes the memory it was captured
// with): CUDA Graphs' cudaGraphExec_t, or on the CPU its twin, the calls themselves.
class KernelGraph {
 public:
  virtual ~KernelGraph() = default;
  virtual void launch() = 0;
};

class Kernels {
 public:
  virtual ~Kernels() = default;
  // The runtime whose memory and compute stream these kernels use (for the model's
  // activation buffers, input copies and zero fills).
  virtual DeviceRuntime& runtime() = 0;

  // ---- graphs (train.cuda_graphs; fsdp/model/graphed_kernels.hpp records the calls) ----
  // Captures the kernels that `enqueue` issues through this object into a graph, without
  // running them (torch.cuda.graph's capture). `enqueue` may call the kernels below only:
  // nothing of the runtime (no allocation, copy or synchronisation; CUDA: the capture fails).
  // Kernel scratch taken during the capture belongs to the graph for its lifetime (PyTorch's
  // graph-private memory pool). The default, the CPU twin, keeps `enqueue` and calls it
  // again at each launch(). Throws fsdp::Error if the capture fails.
  virtual std::unique_ptr<KernelGraph> capture_graph(std::function<void()> enqueue);

  // ---- dense algebra ----
  // C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is [M,K] (A stored [K,M] if trans_a),
  // op(B) is [K,N] (B stored [N,K] if trans_b). Row-major, leading dims = stored widths.
  // A, B, C: float (any storage dtype, fp32 accumulation). beta == 0 ignores C's contents.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const TensorView& A, const TensorView& B, float beta,
                    const TensorView& C) = 0;
  // out[R,C] += bias[C] broadcast over rows.
  virtual void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) = 0;
  // GEMM with the bias in its epilogue (cuBLASLt's CUBLASLT_EPILOGUE_BIAS, as llm.c's
  // matmul_cublaslt): C[M,N] = op(A) op(B) + bias[N] (alpha 1, beta 0; shapes and dtypes as
  // gemm; bias [N] broadcast over rows). The values of gemm(trans_a, trans_b, M, N, K, 1, A,
  // B, 0, C) then add_bias(C, bias, M, N), except that a backend may add the bias to the
  // fp32 accumulator and round C once (the CUDA backend where cuBLASLt takes the epilogue:
  // C, A, B and bias of one dtype, bias 16-byte aligned): equal to one rounding of C's dtype.
  // This default makes the two calls (the CPU backend's twin, and CUDA's fallback).
  virtual void gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const TensorView& A, const TensorView& B, const TensorView& bias,
                         const TensorView& C) {
    gemm(trans_a, trans_b, M, N, K, 1.f, A, B, 0.f, C);
    add_bias(C, bias, M, N);
  }
  // dbias[C] += sum over rows of dout[R,C].
  virtual void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                             int64_t C) = 0;
  // out[n] = a[n] + b[n], n = out.numel() (out may alias a or b).
  virtual void add(const TensorView& out, const TensorView& a, const TensorView& b) = 0;
  // x[n] *= alpha.
  virtual void scale(const TensorView& x, float alpha) = 0;

  // ---- transformer pieces ----
  // Token + learned position embedding (GPT-2 wte/wpe).
  // tokens: [B,T] int32 in [0,V); wte: [V,C]; wpe: [Tmax,C] (T <= Tmax); writes out: [B,T,C].
  virtual void embedding_forward(const TensorView& out, const TensorView& tokens,
                                 const TensorView& wte, const TensorView& wpe, int64_t B,
                                 int64_t T, int64_t C) = 0;
  // Accumulates dwte[V,C] and dwpe[Tmax,C] from dout: [B,T,C].
  virtual void embedding_backward(const TensorView& dwte, const TensorView& dwpe,
                                  const TensorView& dout, const TensorView& tokens, int64_t B,
                                  int64_t T, int64_t C) = 0;

  // LayerNorm over the last dim (biased variance, eps inside the sqrt, as torch.nn.LayerNorm),
  // statistics in fp32. x: [R,C]; weight, bias: [C]; writes out: [R,C], mean: [R] fp32,
  // rstd: [R] fp32 (1/sqrt(var+eps)).
  virtual void layernorm_forward(const TensorView& out, const TensorView& mean,
                                 const TensorView& rstd, const TensorView& x,
                                 const TensorView& weight, const TensorView& bias, int64_t R,
                                 int64_t C, float eps) = 0;
  // ACCUMULATES dx[R,C] (so a residual branch can add into the residual grad), and
  // accumulates dweight[C], dbias[C]. Uses x, weight and the saved mean/rstd.
  virtual void layernorm_backward(const TensorView& dx, const TensorView& dweight,
                                  const TensorView& dbias, const TensorView& dout,
                                  const TensorView& x, const TensorView& weight,
                                  const TensorView& mean, const TensorView& rstd, int64_t R,
                                  int64_t C) = 0;

  // ---- the residual add fused into what follows it (llm.c's fused_residual_forward; Apex's
  // and Megatron's fused add + norm): one pass over the rows instead of two or three, the same
  // values as the unfused calls, bit for bit in every dtype (each step rounds to h's dtype as
  // the unfused call would). proj_bias may be an empty view (data == nullptr): no bias. ----
  // h[R,C] += proj_bias[C]; h += residual[R,C]: the values of add_bias(h, proj_bias, R, C)
  // then add(h, h, residual). h must not alias residual.
  virtual void add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                                 const TensorView& residual, int64_t R, int64_t C) = 0;
  // add_bias_residual(h, proj_bias, residual, R, C), then layernorm_forward(out, mean, rstd,
  // h, weight, bias, R, C, eps) of h as stored. out must alias neither h nor residual.
  virtual void add_layernorm_forward(const TensorView& h, const TensorView& out,
                                     const TensorView& mean, const TensorView& rstd,
                                     const TensorView& residual, const TensorView& proj_bias,
                                     const TensorView& weight, const TensorView& bias, int64_t R,
                                     int64_t C, float eps) = 0;
  // add_bias_residual(h, proj_bias, residual, R, C), then rmsnorm_forward(out, rstd, h, weight,
  // R, C, eps) of h as stored. out must alias neither h nor residual.
  virtual void add_rmsnorm_forward(const TensorView& h, const TensorView& out,
                                   const TensorView& rstd, const TensorView& residual,
                                   const TensorView& proj_bias, const TensorView& weight,
                                   int64_t R, int64_t C, float eps) = 0;

  // GELU, tanh approximation (GPT-2 "gelu_new"):
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Writes out[n], n = out.numel().
  virtual void gelu_forward(const TensorView& out, const TensorView& x) = 0;
  // Writes dx[n] = dout[n] * gelu'(x[n]). dx may alias dout (elementwise).
  virtual void gelu_backward(const TensorView& dx, const TensorView& x,
                             const TensorView& dout) = 0;
  // The GPT-2 MLP's bias and GELU in one pass: fc[R,C] += bias[C], then out[R,C] = GELU(fc)
  // of fc as stored (rounded to fc's dtype): the values of add_bias(fc, bias, R, C) followed
  // by gelu_forward(out, fc). out may alias fc (then fc ends as GELU(fc + bias)).
  virtual void bias_gelu_forward(const TensorView& out, const TensorView& fc,
                                 const TensorView& bias, int64_t R, int64_t C) = 0;
  // The GPT-2 MLP's c_fc with its bias and GELU in the GEMM's epilogue (cuBLASLt's
  // CUBLASLT_EPILOGUE_GELU_AUX_BIAS, as llm.c): fc[M,N] = op(A) op(B) + bias[N] (GELU's input,
  // kept for the backward) and out[M,N] = GELU(fc). The values of gemm(trans_a, trans_b, M,
  // N, K, 1, A, B, 0, fc) then bias_gelu_forward(out, fc, bias, M, N), except that a backend
  // may round fc once after the bias and take GELU of the unrounded fp32 value (the CUDA
  // backend where cuBLASLt takes the epilogue: A, B, fc, out and bias of one 16-bit dtype,
  // bias and fc 16-byte aligned, N % 8 == 0): equal to rounding of the storage dtype. out must not
  // alias fc. This default makes the two calls (the CPU backend's twin, CUDA's fallback).
  virtual void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                              const TensorView& A, const TensorView& B, const TensorView& bias,
                              const TensorView& fc, const TensorView& out) {
    gemm(trans_a, trans_b, M, N, K, 1.f, A, B, 0.f, fc);
    bias_gelu_forward(out, fc, bias, M, N);
  }
  // Its backward in one pass: writes dfc[R,C] = dout * gelu'(fc) (dfc may alias dout) and
  // ACCUMULATES dbias[C] += sum over rows of dfc as stored: the values of gelu_backward(dfc,
  // fc, dout) followed by bias_backward(dbias, dfc, R, C).
  virtual void gelu_bias_backward(const TensorView& dfc, const TensorView& dbias,
                                  const TensorView& fc, const TensorView& dout, int64_t R,
                                  int64_t C) = 0;
  // The GEMM that produces GELU's output gradient with gelu_bias_backward in its epilogue
  // (cuBLASLt's CUBLASLT_EPILOGUE_DGELU_BGRAD, reading fc as its aux): dfc[M,N] =
  // (op(A) op(B)) * gelu'(fc[M,N]) and ACCUMULATES dbias[N] += the column sums of dfc. The
  // values of gemm(trans_a, trans_b, M, N, K, 1, A, B, 0, dfc) then gelu_bias_backward(dfc,
  // dbias, fc, dfc, M, N), except that a backend may apply gelu' to the fp32 product and sum
  // the columns before rounding (the CUDA backend where cuBLASLt takes the epilogue: A, B,
  // fc, dfc of one 16-bit dtype, fc 16-byte aligned, N % 8 == 0; the sums come back in dfc's dtype
  // and are added to dbias): equal to rounding of the storage dtype. dfc must not alias fc.
  // This default makes the two calls (the CPU backend's twin, CUDA's fallback).
  virtual void gemm_dgelu_bias_grad(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                    const TensorView& A, const TensorView& B,
                                    const TensorView& fc, const TensorView& dfc,
                                    const TensorView& dbias) {
    gemm(trans_a, trans_b, M, N, K, 1.f, A, B, 0.f, dfc);
    gelu_bias_backward(dfc, dbias, fc, dfc, M, N);
  }
  // A weight gradient with its bias gradient in the epilogue (cuBLASLt's
  // CUBLASLT_EPILOGUE_BGRADB): C[M,N] += A^T op(B) (A stored [K,M]: the output gradient, K =
  // rows) and ACCUMULATES dbias[M] += the column sums of A as stored. The values of
  // gemm(true, trans_b, M, N, K, 1, A, B, 1, C) then bias_backward(dbias, A, K, M), except
  // that a backend may sum in the GEMM (the CUDA backend where cuBLASLt takes the epilogue:
  // A, B, C of one dtype; the sums come back in C's dtype and are added to dbias): equal to
  // rounding of the storage dtype. This default makes the two calls (the CPU backend's twin,
  // CUDA's fallback).
  virtual void gemm_weight_bias_grad(bool trans_b, int64_t M, int64_t N, int64_t K,
                                     const TensorView& A, const TensorView& B,
                                     const TensorView& C, const TensorView& dbias) {
    gemm(true, trans_b, M, N, K, 1.f, A, B, 1.f, C);
    bias_backward(dbias, A, K, M);
  }

  // ---- attention (FlashAttention-2: Dao 2023, "FlashAttention-2: Faster Attention with
  // Better Parallelism and Work Partitioning", Algorithms 1 and 2) ----
  // The T x T matrix of probabilities is never stored. Forward walks key tiles for each tile
  // of queries with an online softmax (running row max m and sum l, the output rescaled by
  // exp(m_old - m_new) as m grows) and keeps only the output O and the row logsumexp
  // lse_i = m_i + log l_i = log sum_j exp(s_ij). Backward recomputes P_ij = exp(s_ij - lse_i)
  // tile by tile and uses D_i = rowsum(dO_i * O_i) (= sum_j P_ij dP_ij) for
  // dS_ij = P_ij (dP_ij - D_i), dP = dO V^T: dV = P^T dO, dQ = scale dS K, dK = scale dS^T Q.
  // Workspace is per tile, never O(T^2). Scores, softmax and every accumulation are fp32;
  // lse is an fp32 [B,H,Tq] view (row i of head h of batch b at (b*H + h)*Tq + i).
  // A query row whose every key is masked gets output 0, lse = +inf (so exp(s - lse) = 0,
  // as flash-attention's softmax.h) and zero gradients. Masked keys (probability exactly 0)
  // get zero dk/dv; their k, v values do not change any result as long as they are finite.
  // The CPU backend tiles 64 queries x 256 keys (src/backend/cpu/cpu_kernels.cpp); the CUDA
  // backend runs fused tensor-core kernels (src/cuda/kernels_flash.cu). Both recompute
  // the forward's exponentials in backward (about one more QK^T per layer) to save the
  // [B,H,T,T] probabilities and their fp32 gradient scratch.

  // Causal multi-head self-attention core (no projections), GPT-2 layout.
  // qkv: [B,T,3C] with q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h uses columns
  // [h*hs, (h+1)*hs) of each, hs = C/H (C % H != 0 throws). Scores scaled by 1/sqrt(hs),
  // key j visible to query i iff j <= i and, with doc_start (document masking: int32 [B,T]
  // or a null view, as gqa_attention_forward's below), j >= doc_start[b,i]. Writes out:
  // [B,T,C] (heads concatenated) and lse: fp32 [B,H,T], both saved for backward.
  virtual void attention_forward(const TensorView& out, const TensorView& lse,
                                 const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t H, const TensorView& doc_start) = 0;
  // Writes dqkv: [B,T,3C] (dq, dk, dv in the layout of qkv) from dout: [B,T,C], using qkv,
  // out and lse from forward (the same doc_start).
  virtual void attention_backward(const TensorView& dqkv, const TensorView& dout,
                                  const TensorView& qkv, const TensorView& out,
                                  const TensorView& lse, int64_t B, int64_t T, int64_t C,
                                  int64_t H, const TensorView& doc_start) = 0;

  // Softmax cross-entropy over V classes for R rows, fused with its gradient, in fp32.
  // logits: [R,ld] with row stride ld >= V: the first V columns of a row are its classes, the
  // columns [V, ld) are padding (a vocabulary padded to a GEMM-friendly multiple, Megatron-LM's
  // --make-vocab-size-divisible-by) that takes no part in the softmax; ld == V for none.
  // targets: [R] int32 in [0,V), or kIgnoreIndex (-100, torch.nn.CrossEntropyLoss's
  // ignore_index): such a row adds no loss and gets a zero gradient row.
  // loss[0] (fp64 [1] device scalar) += sum over rows of -log softmax(logits[r, 0:V])[target],
  // i.e. exactly the loss of the unpadded [R,V] logits; logits are overwritten in place with
  // dlogits = (softmax - onehot) * grad_scale in columns [0, V) and 0 in the padding columns
  // (so a GEMM reading dlogits gives the padded rows of the weight a zero gradient).
  // softcap > 0 (Gemma 2's final_logit_softcapping; HF Gemma2ForCausalLM: logits / cap, tanh,
  // * cap before the loss): the softmax reads softcap * tanh(logit / softcap) for every class
  // and dlogits is times the cap's derivative 1 - tanh^2; 0: the logits as they are. Throws
  // fsdp::Error when ld < V or softcap is negative or not finite.
  virtual void cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                              const TensorView& targets, int64_t R, int64_t V,
                                              int64_t ld, float grad_scale, float softcap) = 0;
  // Same loss (and softcap) without gradient; logits (every column) are left unchanged.
  virtual void cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                                     const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                                     float softcap) = 0;

  // ---- T5 pieces (Raffel et al. 2020; HF transformers/models/t5/modeling_t5.py) ----
  // Token embedding without positions (T5's `shared`): out[n,:] = table[tokens[n],:].
  // tokens: [N] int32 in [0,V) (V = table.numel() / C; out of range throws fsdp::Error, on
  // CUDA at the next synchronisation); table: [V,C]; writes out: [N,C].
  virtual void embedding_lookup_forward(const TensorView& out, const TensorView& tokens,
                                        const TensorView& table, int64_t N, int64_t C) = 0;
  // Accumulates dtable[tokens[n],:] += dout[n,:] (deterministic order: n ascending).
  virtual void embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                         const TensorView& tokens, int64_t N, int64_t C) = 0;

  // T5LayerNorm (RMSNorm, Zhang & Sennrich 2019): no mean subtraction, no bias.
  // rstd[r] = 1/sqrt(mean_c x[r,c]^2 + eps) in fp32; out[r,c] = weight[c] * (x[r,c] * rstd[r]).
  // x: [R,C]; weight: [C]; writes out: [R,C], rstd: [R] fp32.
  virtual void rmsnorm_forward(const TensorView& out, const TensorView& rstd, const TensorView& x,
                               const TensorView& weight, int64_t R, int64_t C, float eps) = 0;
  // ACCUMULATES dx[R,C] and dweight[C] from dout[R,C], using x, weight and the saved rstd.
  virtual void rmsnorm_backward(const TensorView& dx, const TensorView& dweight,
                                const TensorView& dout, const TensorView& x,
                                const TensorView& weight, const TensorView& rstd, int64_t R,
                                int64_t C) = 0;

  // ReLU (T5 v1.0 DenseReluDense). Writes out[n] = max(x[n], 0), n = out.numel().
  virtual void relu_forward(const TensorView& out, const TensorView& x) = 0;
  // Writes dx[n] = x[n] > 0 ? dout[n] : 0. dx may alias dout.
  virtual void relu_backward(const TensorView& dx, const TensorView& x,
                             const TensorView& dout) = 0;
  // T5's wi with its ReLU in the GEMM's epilogue (cuBLASLt's CUBLASLT_EPILOGUE_RELU): out[M,N]
  // = max(op(A) op(B), 0). The values of gemm(trans_a, trans_b, M, N, K, 1, A, B, 0, out)
  // then relu_forward(out, out) exactly (rounding commutes with max(., 0)); the CUDA backend
  // runs one cuBLASLt call where cuBLASLt takes it (A, B, out of one dtype). This default
  // makes the two calls (the CPU backend's twin, CUDA's fallback).
  virtual void gemm_relu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                         const TensorView& A, const TensorView& B, const TensorView& out) {
    gemm(trans_a, trans_b, M, N, K, 1.f, A, B, 0.f, out);
    relu_forward(out, out);
  }
  // Writes out[n] = a[n] * b[n], n = out.numel(). out may alias a or b. (The models' gated
  // products use geglu_* / swiglu_* below; this is the unfused product their tests compare
  // against.)
  virtual void mul(const TensorView& out, const TensorView& a, const TensorView& b) = 0;
  // GeGLU, T5 v1.1's gated-GELU (Shazeer 2020, "GLU Variants Improve Transformer"; HF
  // T5DenseGatedActDense with "gelu_new"): out[n] = gelu(gate[n]) * up[n], with gelu(gate)
  // rounded to gate's dtype first: the values of gelu_forward(g, gate) then mul(out, g, up)
  // for a g of gate's dtype, in one pass and without g. n = out.numel(); out may alias gate
  // or up.
  virtual void geglu_forward(const TensorView& out, const TensorView& gate,
                             const TensorView& up) = 0;
  // Its backward in one pass, the values of the unfused chain with g = gelu(gate) as above:
  // WRITES dup[n] = dout[n] * g[n], and dgate[n] = gelu'(gate[n]) * t[n] with t = dout[n] *
  // up[n] rounded to dgate's dtype (mul(dup, dout, g), mul(t, dout, up), gelu_backward(dgate,
  // gate, t)). n = dgate.numel(). dgate may alias dout (each element's inputs are read before
  // its outputs are written); dup aliases none of the inputs.
  virtual void geglu_backward(const TensorView& dgate, const TensorView& dup,
                              const TensorView& dout, const TensorView& gate,
                              const TensorView& up) = 0;

  // T5 relative position bias by relative position (relative_positions above; P =
  // relative_positions(Tq, Tk)): bias[h,o] = table[buckets[o], h] (fp32 out), the bias of
  // every (i, j) with j - i + Tq - 1 = o.
  // table: [NB,H] (relative_attention_bias.weight, float; NB = table.numel() / H); buckets:
  // [P] int32 in [0,NB) (computed by the caller: t5_relative_position_buckets, HF's
  // _relative_position_bucket of j - i); writes bias: [H,P] fp32. A bucket out of range
  // throws fsdp::Error (CUDA: at the next synchronisation, as token indices).
  virtual void position_bias_forward(const TensorView& bias, const TensorView& table,
                                     const TensorView& buckets, int64_t H, int64_t Tq,
                                     int64_t Tk) = 0;
  // Accumulates dtable[buckets[o], h] += dbias[h,o] (dbias fp32 [H,P]); each table entry's
  // sum taken over o ascending in fp64 and added once (deterministic).
  virtual void position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                                      const TensorView& buckets, int64_t H, int64_t Tq,
                                      int64_t Tk) = 0;

  // General multi-head attention core (no projections) with separate query and key/value
  // lengths and a head width D independent of the model width (T5's d_kv), computed as the
  // attention block above.
  // q: [B,Tq,H*D]; k, v: [B,Tk,H*D]; head h uses columns [h*D, (h+1)*D).
  // scores[b,h,i,j] = scale * q_i . k_j + bias[h, j - i + Tq - 1] (bias: fp32 [H,P] by
  // relative position, P = relative_positions(Tq, Tk), shared over the batch: T5's position
  // bias, which depends on j - i alone; or an empty view for none); key j is masked out
  // (probability exactly 0) when key_mask is given (int32 [B,Tk], 0 = padding) and
  // key_mask[b,j] == 0, or when `causal` and j > i. Softmax in fp32 over the unmasked keys.
  // Writes out: [B,Tq,H*D] and lse: fp32 [B,H,Tq] (saved for backward). T5 passes scale = 1
  // (no 1/sqrt(D)). "Empty" means a view with data == nullptr (TensorView{}).
  // Matches HF T5Attention (scores + position_bias + mask, softmax in fp32) and
  // torch.nn.functional.scaled_dot_product_attention with a boolean mask, except that a
  // fully masked row gives 0 rather than NaN. D == 0 or Tk == 0 are allowed (out = 0).
  virtual void mha_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                           const TensorView& k, const TensorView& v, const TensorView& bias,
                           const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                           int64_t H, int64_t D, float scale, bool causal) = 0;
  // Writes dq: [B,Tq,H*D], dk, dv: [B,Tk,H*D] from dout: [B,Tq,H*D], using q, k, v, out and
  // lse from forward and the same bias, key_mask, scale and causal. If dbias is not empty
  // (fp32 [H,P], as bias) ACCUMULATES the score gradient summed over the batch and over each
  // relative position into it (HF T5: the gradient of position_bias, which broadcasts over
  // the batch, reduced to the relative positions it was gathered from): dbias[h,o] += sum of
  // dS[b,h,i,j] over b and the (i, j) with j - i + Tq - 1 = o, in fp32, in an order fixed by
  // the shapes alone (no atomics): deterministic and independent of the thread count on each
  // backend, the two backends equal to rounding. Every (b, h, query tile) works in
  // parallel: on CUDA each block sums its tile's diagonals into a partial row of its own and
  // one more pass adds the partial rows, b and tile ascending (kernels_flash.cu).
  virtual void mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                            const TensorView& dbias, const TensorView& dout, const TensorView& q,
                            const TensorView& k, const TensorView& v, const TensorView& out,
                            const TensorView& lse, const TensorView& bias,
                            const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                            int64_t H, int64_t D, float scale, bool causal) = 0;

  // ---- Llama pieces (Touvron et al. 2023; HF transformers/models/llama/modeling_llama.py) ----
  // RMSNorm is rmsnorm_forward/backward above (LlamaRMSNorm is T5LayerNorm with its own eps).
  // As everywhere here, float views may be stored fp32, bf16 or fp16 (math in fp32); views
  // marked fp32 must be fp32. A view with fewer elements than its shape, a bad dtype or a
  // negative dimension throws fsdp::Error naming the kernel and argument.

  // Rotary position embedding (Su et al. 2021, RoFormer) in Hugging Face's rotate-half layout
  // (transformers' apply_rotary_pos_emb: x*cos + rotate_half(x)*sin, rotate_half(x) =
  // cat(-x2, x1)) on the first R columns of each head, the other D - R passed through
  // (partial rotary, Phi3Attention's / GPTNeoXAttention's rotary_dim = partial_rotary_factor
  // * D: cat(rope(x[..., :R]), x[..., R:])). x, out: [B,T,H*D] (head h = columns
  // [h*D,(h+1)*D)), R even, 2 <= R <= D; cos, sin: fp32 [Tmax, R/2] with T <= Tmax (row t =
  // position t; HF's cos/sin have R columns that repeat these R/2, emb = cat(freqs, freqs)).
  // For each (b,t,h), i < R/2, R <= j < D:
  //   out[i]       = x[i] cos[t,i] - x[i+R/2] sin[t,i];
  //   out[i+R/2]   = x[i+R/2] cos[t,i] + x[i] sin[t,i];
  //   out[j]       = x[j].
  // fp32 math. out may alias x. Throws fsdp::Error when R is odd or outside [2, D], or cos/sin
  // are not fp32 with at least T*R/2 elements.
  virtual void rope_forward(const TensorView& out, const TensorView& x, const TensorView& cos,
                            const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                            int64_t R) = 0;
  // The transpose: dx[i] = dout[i] cos + dout[i+R/2] sin; dx[i+R/2] = dout[i+R/2] cos -
  // dout[i] sin; dx[j] = dout[j]. WRITES dx: [B,T,H*D]; dx may alias dout. Shapes and errors
  // as rope_forward.
  virtual void rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                             const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                             int64_t R) = 0;

  // SwiGLU (Shazeer 2020, "GLU Variants Improve Transformer"; HF LlamaMLP's
  // act_fn(gate_proj(x)) * up_proj(x) with act "silu"): out[n] = silu(gate[n]) * up[n],
  // silu(x) = x * sigmoid(x), fp32 math, n = out.numel() (gate, up: at least n elements).
  // out may alias gate or up.
  virtual void swiglu_forward(const TensorView& out, const TensorView& gate,
                              const TensorView& up) = 0;
  // WRITES dgate[n] = dout[n] * up[n] * silu'(gate[n]) (silu'(x) = s (1 + x (1 - s)),
  // s = sigmoid(x)) and dup[n] = dout[n] * silu(gate[n]), n = dgate.numel() (dup, dout, gate,
  // up: at least n elements). dgate may alias gate and dup may alias up (each element's inputs
  // are read before its outputs are written); dout may alias dgate.
  virtual void swiglu_backward(const TensorView& dgate, const TensorView& dup,
                               const TensorView& dout, const TensorView& gate,
                               const TensorView& up) = 0;

  // Output gate of gated attention (Qiu et al. 2025, "Gated Attention for Large Language
  // Models"; HF Qwen3NextAttention, Qwen3-Next / Qwen3.5: attn_output = attn_output *
  // torch.sigmoid(gate)): out[n] = x[n] * sigmoid(gate[n]), fp32 math, n = out.numel() (x,
  // gate: at least n elements). out may alias x (in place) but must not overlap gate.
  virtual void sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                                    const TensorView& gate) = 0;
  // WRITES dx[n] = dout[n] * s and dgate[n] = dout[n] * x[n] * s * (1 - s), s =
  // sigmoid(gate[n]), n = dout.numel() (dx, dgate, x, gate: at least n elements). dx may alias
  // dout and dgate may alias gate (each element's inputs are read before its outputs are
  // written); dx must not overlap x, gate or dgate; dgate must not overlap dout or x.
  virtual void sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate,
                                     const TensorView& dout, const TensorView& x,
                                     const TensorView& gate) = 0;

  // gpt-oss's clamped SwiGLU (HF GptOssExperts._apply_gate; OpenAI 2025, "gpt-oss-120b &
  // gpt-oss-20b Model Card") on interleaved pairs: for i < n = out.numel(), with g =
  // min(gate_up[2i], limit) and u = clamp(gate_up[2i + 1], -limit, limit), out[i] = (u + 1) g
  // sigmoid(alpha g), fp32 math (HF: alpha 1.702, limit 7). gate_up: [2n] (a row of HF's
  // gate_up_proj output: gate columns even, up columns odd). out must not alias gate_up.
  // fsdp::Error when alpha or limit is not finite or limit <= 0.
  virtual void clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up,
                                      float alpha, float limit) = 0;
  // WRITES, with s = sigmoid(alpha g): dgate_up[2i] = dout[i] (u + 1) (s + alpha g s (1 - s))
  // where gate_up[2i] <= limit, else 0; dgate_up[2i + 1] = dout[i] g s where -limit <=
  // gate_up[2i + 1] <= limit, else 0 (torch.clamp's gradient: a value on a bound passes), n =
  // dout.numel() (dgate_up, gate_up: 2n). dgate_up may alias gate_up (each pair is read
  // before it is written); dout must alias neither. Errors as forward.
  virtual void clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                                       const TensorView& gate_up, float alpha, float limit) = 0;

  // Causal grouped-query self-attention core (Ainslie et al. 2023, "GQA: Training Generalized
  // Multi-Query Transformer Models from Multi-Head Checkpoints"; HF LlamaAttention with
  // repeat_kv), FlashAttention-2 like the attention above (no T x T matrix stored).
  // q: [B,T,H*D]; k, v: [B,T,Hkv*D]; H % Hkv == 0 (Hkv < 1 or H % Hkv != 0 throws
  // fsdp::Error); query head h reads kv head h / (H/Hkv) (repeat_kv's repeat_interleave
  // order). scores = scale * q.k (Llama: scale = 1/sqrt(D)), key j visible to query i iff
  // j <= i and, when window > 0, j > i - window (a sliding window of `window` positions, the
  // query's own included: transformers' sliding_window_overlay, Mistral / Qwen2; window < 0
  // throws). Hkv == H is MHA (the values of mha_forward with causal = true and no bias or
  // mask), Hkv == 1 is MQA. softcap > 0 (Gemma 2's attn_logit_softcapping; HF's eager
  // Gemma 2 attention: scores / cap, tanh, * cap before the mask) replaces each score s by
  // softcap * tanh(s / softcap); 0: none; negative or not finite throws.
  // doc_start (document masking; torchtitan's "block_causal" mask, HF's padding-free packing
  // with position_ids under flash_attention_2's varlen kernels): int32 [B,T], the first
  // position of query t's document in row b; key j is also masked for query t when j <
  // doc_start[b,t]. Each row must be nondecreasing with 0 <= doc_start[b,t] <= t (the model
  // builds it so: t minus the token's position in its document); the kernels skip the key
  // tiles left of a query tile's first start. A null view (TensorView{}): no document mask.
  // A view that is not int32 or has fewer than B*T elements throws fsdp::Error.
  // Writes out: [B,T,H*D] and lse: fp32 [B,H,T] (saved for backward).
  virtual void gqa_attention_forward(const TensorView& out, const TensorView& lse,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                     float scale, int64_t window, float softcap,
                                     const TensorView& doc_start) = 0;
  // WRITES dq: [B,T,H*D], dk, dv: [B,T,Hkv*D] from dout: [B,T,H*D] using q, k, v, out, lse of
  // forward (the same scale, window, softcap and doc_start). dk/dv of a kv head are the sum
  // over its group's H/Hkv query heads, in ascending head order, in fp32, deterministic (no
  // atomics) on both backends (= mha_backward's dk/dv of k, v repeated H/Hkv times, summed over
  // each group).
  virtual void gqa_attention_backward(const TensorView& dq, const TensorView& dk,
                                      const TensorView& dv, const TensorView& dout,
                                      const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& out, const TensorView& lse, int64_t B,
                                      int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                                      int64_t window, float softcap,
                                      const TensorView& doc_start) = 0;

  // Attention sinks (gpt-oss; HF GptOssAttention's `sinks` [H] and eager_attention_forward:
  // a per-head logit joins every query's scores in the softmax, and its column is dropped
  // before P V), applied to gqa_attention_forward's results, exactly: with L = lse[b,h,t]
  // (the logsumexp of the visible scores) and s = sinks[h], L' = log(exp(L) + exp(s)) and
  // out[b,t,h,:] *= exp(L - L') = 1 / (1 + exp(s - L)), lse[b,h,t] = L', in place, fp32 math.
  // gqa_attention_backward then runs unchanged on these out and lse: its P = exp(score - L')
  // and D_i = dout . out are the softmax-with-sink's (the sink's column has no value row).
  // A row with L = +inf (no visible key) is left as it is. out: [B,T,H*D] float; lse: fp32
  // [B,H,T]; sinks: [H] float. fsdp::Error on a short view, a non-float dtype or lse not fp32.
  virtual void attention_sink_forward(const TensorView& out, const TensorView& lse,
                                      const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                                      int64_t D) = 0;
  // The sinks' gradient: dsinks[h] += -sum over b, t of p_s (dout[b,t,h,:] . out[b,t,h,:]),
  // p_s = exp(sinks[h] - lse[b,h,t]) the sink's probability, with out and lse as
  // attention_sink_forward left them; fp32 sums, for each h over b then t ascending
  // (deterministic), added to dsinks once. dsinks: [H] float (not aliasing the others); dout,
  // out: [B,T,H*D]; lse fp32 [B,H,T]; sinks [H]. Errors as forward.
  virtual void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                                       const TensorView& out, const TensorView& lse,
                                       const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                                       int64_t D) = 0;

  // ---- linear attention (Gated DeltaNet: Qwen3-Next / Qwen3.5's linear_attention layers) ----
  // Causal depthwise convolution with SiLU (HF Qwen3NextGatedDeltaNet's conv1d, groups =
  // channels, padding K - 1, the first T outputs kept, no bias, then silu: causal_conv1d_fn
  // with activation "silu"): out[b,t,c] = silu(sum over j < K of weight[c,j] x[b,t-K+1+j,c]),
  // x taken as 0 before the row's first token. x, out: [B,T,C]; weight: [C,K] (HF's
  // conv1d.weight [C,1,K]); fp32 math. doc_start (document masking, as gqa_attention_forward's:
  // int32 [B,T], each row nondecreasing with 0 <= doc_start[b,t] <= t, or a null view): x is
  // also taken as 0 before doc_start[b,t] (causal_conv1d_fn's seq_idx, each packed document
  // convolved alone). out must not alias x. fsdp::Error on a dimension < 1 (K >= 1), a short
  // or non-float view, a doc_start that is not int32 [B,T], or out aliasing x.
  virtual void causal_conv1d_forward(const TensorView& out, const TensorView& x,
                                     const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                     int64_t K, const TensorView& doc_start) = 0;
  // WRITES dx[B,T,C] and ACCUMULATES dweight[C,K] (summed over b then t ascending, fp32),
  // from dout[B,T,C], x and weight (the pre-activation recomputed). dx must alias none of the
  // others. Errors as forward.
  virtual void causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                                      const TensorView& dout, const TensorView& x,
                                      const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                      int64_t K, const TensorView& doc_start) = 0;
  // The gated delta rule (Yang, Kautz, Hatamizadeh 2025, "Gated Delta Networks: Improving
  // Mamba2 with Delta Rule", eq. 10; HF's torch_recurrent_gated_delta_rule with
  // use_qk_l2norm_in_kernel, and the gating of Qwen3NextGatedDeltaNet.forward), from zero
  // state, fp32 math. qkv: [B,T,2*Hk*Dk + Hv*Dv], each token's q (Hk heads of Dk), k (Hk
  // heads of Dk) and v (Hv heads of Dv) columns, the conv's output; a, b: [B,T,Hv] (in_proj_a
  // and in_proj_b's outputs); A_log, dt_bias: [Hv]. Value head h reads q/k head h / (Hv/Hk)
  // (repeat_interleave). With q~ = l2norm(q) / sqrt(Dk), k~ = l2norm(k) (l2norm(x) = x /
  // sqrt(sum x^2 + 1e-6)), g = -exp(A_log[h]) softplus(a + dt_bias[h]) (torch's softplus:
  // x above 20 is x), beta = sigmoid(b) and the state S [Dk,Dv] per (b, h):
  //   S = exp(g_t) S;  u = S^T k~_t;  S += k~_t (beta_t (v_t - u))^T;  out_t = S^T q~_t.
  // out: [B,T,Hv*Dv]. doc_start (as causal_conv1d_forward's, or null): the state is zero
  // again before each token that starts a document (doc_start[b,t] == t; the chunked kernel's
  // cu_seqlens, each packed document its own sequence). Nothing is saved: backward recomputes
  // the states. fsdp::Error on a dimension < 1, Hv not a multiple of Hk, a short or non-float
  // view, a doc_start that is not int32 [B,T], out aliasing an input.
  virtual void gated_delta_rule_forward(const TensorView& out, const TensorView& qkv,
                                        const TensorView& a, const TensorView& b,
                                        const TensorView& A_log, const TensorView& dt_bias,
                                        int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk,
                                        int64_t Dv, const TensorView& doc_start) = 0;
  // WRITES dqkv [B,T,2*Hk*Dk + Hv*Dv] (a q/k head's gradient summed over its Hv/Hk value
  // heads), da, db [B,T,Hv]; ACCUMULATES dA_log, ddt_bias [Hv] (for each head the sums over
  // t descending, added over b ascending, fp32; deterministic). From dout [B,T,Hv*Dv] and forward's inputs;
  // the states are recomputed (checkpoints every 64 tokens, then each 64-token chunk's states
  // again). The outputs must alias none of the inputs. Errors as forward.
  virtual void gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                         const TensorView& db, const TensorView& dA_log,
                                         const TensorView& ddt_bias, const TensorView& dout,
                                         const TensorView& qkv, const TensorView& a,
                                         const TensorView& b, const TensorView& A_log,
                                         const TensorView& dt_bias, int64_t B, int64_t T,
                                         int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                         const TensorView& doc_start) = 0;

  // ---- strided copies (torch's narrow / expand / sum over a dim, then copy_) ----
  // A view of a flat tensor as [R, G, W] elements at r * row + offset + g * group + c * col
  // (element strides, all >= 0).
  struct Strided {
    int64_t row = 0, offset = 0, group = 0, col = 1;
    // The elements a view needs for [R, G, W] of them: its last element's index + 1 (0 when
    // R, G or W is 0).
    int64_t extent(int64_t R, int64_t G, int64_t W) const {
      if (R == 0 || G == 0 || W == 0) return 0;
      return (R - 1) * row + offset + (G - 1) * group + (W - 1) * col + 1;
    }
  };
  // For r < R, c < W and g < G: dst(r, g, c) = src(r, g, c), or += when `accumulate`, in fp32,
  // rounded once to dst's dtype. src.group == 0 repeats src's [R, W] block in every group (a
  // broadcast); dst.group == 0 writes (adds) the sum over g ascending of src(r, g, c), in fp32
  // (a reduction: MLA's shared rope key and its gradient, DeepSeek-V2's kv_a_proj_with_mqa).
  // dst's positions must be distinct but for dst.group == 0, and must not overlap src's.
  // dst, src: any float dtype. Throws fsdp::Error when a stride is negative, dst.col < 1, or an
  // element reaches past either view.
  virtual void strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                            const Strided& src_at, int64_t R, int64_t G, int64_t W,
                            bool accumulate) = 0;

  // ---- Mixture of experts (Shazeer et al. 2017, "Outrageously Large Neural Networks"; HF
  // Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock, OlmoeSparseMoeBlock) ----
  // A layer routes each of R tokens to K of E experts (these two kernels), runs each expert's
  // MLP on the rows routed to it (GEMMs on row segments, grouped by the model) and sums the K
  // outputs of each token weighted by its routing weights (moe_combine_*).
  //
  // Top-k routing: p = softmax(logits[r,:]) in fp32; idx[r,j], j < K, the experts of the K
  // largest p in descending order, ties to the lower expert index (torch.topk's order on
  // distinct values); weights[r,j] = p[idx[r,j]], divided by the sum of the K when `normalize`
  // (Qwen3MoeConfig / OlmoeConfig norm_topk_prob; Mixtral always). logits: [R,E] float;
  // WRITES idx: [R,K] int32 and weights: [R,K] fp32. Throws fsdp::Error unless 1 <= K <= E.
  virtual void moe_router_forward(const TensorView& idx, const TensorView& weights,
                                  const TensorView& logits, int64_t R, int64_t E, int64_t K,
                                  bool normalize) = 0;
  // Its backward (p recomputed from logits, idx of forward): WRITES dlogits: [R,E] (any float
  // dtype) from dweights: [R,K] fp32, in fp32 math: with w the forward weights and S the sum of
  // the K selected p, dp[idx[r,j]] = (dweights[r,j] - sum_i w[r,i] dweights[r,i]) / S when
  // `normalize`, else dweights[r,j]; dp = 0 at the other experts; dlogits[r,e] = p[e] (dp[e] -
  // sum_e' p[e'] dp[e']) (softmax's Jacobian). Same errors as forward.
  virtual void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                   const TensorView& logits, const TensorView& idx, int64_t R,
                                   int64_t E, int64_t K, bool normalize) = 0;
  // Sigmoid top-k routing with a selection bias and group-limited choice (DeepSeek-V3's
  // auxiliary-loss-free "noaux_tc" routing, DeepSeek-AI 2024, "DeepSeek-V3 Technical Report",
  // section 2.1.2; HF DeepseekV3MoE.route_tokens_to_experts, which Glm4MoeMoE inherits). Per
  // row r: s = sigmoid(logits[r,:]) in fp32; c = s + bias (bias: HF's e_score_correction_bias
  // [E], a buffer that only picks experts); the E experts form g.n_group groups of E / n_group
  // consecutive experts, a group's score the sum of its two largest c (topk(2)); the
  // g.topk_group groups of the largest scores (ties to the lower group) keep their c, every
  // other expert's c becomes 0 (HF's masked_fill(..., 0.0)); idx[r,j], j < K: the experts of
  // the K largest c in descending order, ties to the lower expert; weights[r,j] = g.scale *
  // s[idx[r,j]], divided by (sum_j s[idx[r,j]] + 1e-20) first when g.normalize
  // (norm_topk_prob; g.scale is routed_scaling_factor). logits: [R,E] float (HF's router GEMM
  // is fp32); bias: [E] float; WRITES idx: [R,K] int32 and weights: [R,K] fp32. Throws
  // fsdp::Error unless 1 <= K <= E, n_group >= 1 divides E into groups of >= 2 experts (HF's
  // topk(2)) or n_group == 1, and 1 <= topk_group <= n_group.
  struct SigmoidRouting {
    int64_t n_group = 1, topk_group = 1;
    bool normalize = true;
    float scale = 1.f;
  };
  virtual void moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                          const TensorView& logits, const TensorView& bias,
                                          int64_t R, int64_t E, int64_t K,
                                          const SigmoidRouting& g) = 0;
  // Its backward (s recomputed from logits, idx of forward; the bias gets no gradient):
  // WRITES dlogits: [R,E] (any float dtype; not overlapping logits) from dweights: [R,K]
  // fp32, in fp32 math: with S = sum_j s[idx[r,j]] + 1e-20, ds[idx[r,j]] = g.scale *
  // (dweights[r,j] - sum_i dweights[r,i] s[idx[r,i]] / S) / S when g.normalize, else g.scale
  // * dweights[r,j]; dlogits[r,e] = ds[e] s[e] (1 - s[e]) at the K chosen experts, 0 at the
  // others. Same errors as forward (CUDA: forward takes E <= 1024).
  virtual void moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                           const TensorView& logits, const TensorView& idx,
                                           int64_t R, int64_t E, int64_t K,
                                           const SigmoidRouting& g) = 0;
  // The weighted sum of each token's K expert outputs: WRITES out[r,:] = sum_j weights[r,j] *
  // rows[slot[r*K+j],:], j ascending, in fp32, rounded once to out's dtype. rows: [N,C] (the
  // experts' output rows, grouped by expert; N = rows.numel() / C); slot: [R*K] int32 in
  // [0,N) (on the CPU a value out of range throws fsdp::Error; CUDA does not check); weights:
  // [R,K] fp32, or an empty view for weights of 1 (backward's gather-sum of the input
  // gradient). out: [R,C], must not overlap rows.
  virtual void moe_combine_forward(const TensorView& out, const TensorView& rows,
                                   const TensorView& weights, const TensorView& slot, int64_t R,
                                   int64_t K, int64_t C) = 0;
  // Its backward: WRITES drows[slot[r*K+j],:] = weights[r,j] * dout[r,:] (rounded to drows'
  // dtype; rows no slot names are left as they are) and dweights[r,j] = sum_c dout[r,c] *
  // rows[slot[r*K+j],c] (fp32 accumulation; the order is the backend's). dout: [R,C]; rows,
  // drows: [N,C], drows must not overlap dout or rows; dweights: [R,K] fp32.
  virtual void moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                                    const TensorView& dout, const TensorView& rows,
                                    const TensorView& weights, const TensorView& slot, int64_t R,
                                    int64_t K, int64_t C) = 0;
  // The auxiliary load-balancing loss (Fedus et al. 2021, "Switch Transformers", eq. 4; HF's
  // load_balancing_loss_func over every layer's router logits): aux = E sum_e f_e P_e, f_e
  // the fraction of the (token, pick) pairs routed to e, P_e the mean router probability of
  // e, both over all layers' tokens. The model counts f on the host (its grouping) and sums P
  // with this kernel: ACCUMULATES psum[e] += sum_r p[r,e], p = softmax(logits[r,:]) in fp32
  // as moe_router_forward computes it, summed in fp64 in an order fixed by R and E (rounded
  // once to fp32 per call). logits: [R,E] float; psum: [E] fp32.
  virtual void moe_router_prob_sums(const TensorView& psum, const TensorView& logits, int64_t R,
                                    int64_t E) = 0;
  // loss[0] (fp64 [1]) += alpha * sum_e counts[e] * psum[e], in fp64, e ascending (the
  // auxiliary loss's value, alpha holding coef * E / N^2 and the loss's token weight).
  // counts, psum: [E] fp32.
  virtual void moe_aux_loss(const TensorView& loss, const TensorView& counts,
                            const TensorView& psum, int64_t E, double alpha) = 0;
  // The auxiliary loss's backward through the softmax: ACCUMULATES dlogits[r,e] += p[r,e]
  // (dprobs[e] - sum_e' p[r,e'] dprobs[e']) in fp32 (rounded once to dlogits' dtype), p
  // recomputed from logits; dprobs: [E] fp32, d aux / d p, the same for every row.
  virtual void moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                                     const TensorView& dprobs, int64_t R, int64_t E) = 0;
  // A shared expert's sigmoid gate (HF Qwen2MoeSparseMoeBlock: sigmoid(shared_expert_gate(x))
  // * shared_expert(x) added to the routed experts' sum): ACCUMULATES out[r,:] +=
  // sigmoid(logit[r]) * shared[r,:] in fp32 (rounded once to out's dtype). out, shared:
  // [R,C]; logit: [R] float. out must not overlap shared.
  virtual void moe_shared_gate_forward(const TensorView& out, const TensorView& shared,
                                       const TensorView& logit, int64_t R, int64_t C) = 0;
  // Its backward: WRITES dshared[r,:] = sigmoid(logit[r]) * dout[r,:] and dlogit[r] =
  // s (1 - s) sum_c dout[r,c] shared[r,c], s = sigmoid(logit[r]) (fp32 accumulation; the
  // order is the backend's). dshared: [R,C], must not overlap dout or shared; dlogit: [R].
  virtual void moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                        const TensorView& dout, const TensorView& shared,
                                        const TensorView& logit, int64_t R, int64_t C) = 0;
};

}  // namespace fsdp
