// src/cuda/kernels.hpp: the CUDA backend's kernel launchers and its cuBLAS/cuBLASLt GEMMs
// (internal to src/cuda/).
//
// cuda_backend.cpp puts the typed Backend interface on top of these: it checks every
// argument (dtype, size), maps fsdp::DType to the storage type `ST` below, takes kernel
// scratch from the caching allocator, and calls these functions, which only enqueue work on
// the given stream (a launch failure throws fsdp::Error through FSDP_CHECK_CUDA). Shapes and
// semantics are those of the same-named Backend kernels (fsdp/backend/kernels.hpp, device_runtime.hpp).
//
// This header is included by the .cu files, which nvcc compiles as C++17, so it includes
// nothing of fsdp/core that needs C++20 (dtype.hpp does): storage types are spelled `ST`.
//
// "float" arguments (In/Out) are fp32, bf16 or fp16 storage; kernels load them, compute in
// fp32 registers and store rounded to nearest even. When all float arguments of a call share
// one storage type the kernel is the instantiation for that type (vectorised 16-byte loads
// where the pointers allow); a call that mixes types runs the same kernel reading each
// argument through a run-time type switch.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "fsdp/backend/optimizer_math.hpp"

namespace fsdp::cuda::kernels {

// Whether p is 16-byte aligned (vector accesses in the kernels; cuBLASLt epilogues' bias and
// aux in cuda_backend.cpp).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Storage types (fsdp::DType's f32, bf16, f16, f64).
enum class ST : int { f32 = 0, bf16 = 1, f16 = 2, f64 = 3 };
inline std::size_t st_size(ST t) { return t == ST::f64 ? 8 : t == ST::f32 ? 4 : 2; }
const char* st_name(ST t);

struct In {  // a device array read by a kernel
  const void* p;
  ST t;
};
struct Out {  // a device array written (or read and written) by a kernel
  void* p;
  ST t;
};

// ---- errors recorded on the device (see fsdp/cuda/cuda_backend.hpp) ----
// The first out-of-range index a kernel meets; code 0 = none. Read by the host after a
// stream synchronisation; reset to zeros by the host.
enum ErrorCode : int {
  kErrNone = 0,
  kErrEmbeddingForward = 1,   // a token outside [0, V) in embedding_forward
  kErrEmbeddingBackward = 2,  // ... in embedding_backward
  kErrCrossEntropy = 3,       // a target outside [0, V) (and not kIgnoreTarget) in cross_entropy_*
  kErrEmbeddingLookupForward = 4,   // a token outside [0, V) in embedding_lookup_forward
  kErrEmbeddingLookupBackward = 5,  // ... in embedding_lookup_backward
  kErrPositionBiasForward = 6,      // a bucket outside [0, NB) in position_bias_forward
  kErrPositionBiasBackward = 7,     // ... in position_bias_backward
};
// The cross-entropy target that skips its row: fsdp::kIgnoreIndex (kernels.hpp, which this
// C++17 header cannot include; cuda_backend.cpp static_asserts that they agree).
constexpr int32_t kIgnoreTarget = -100;
struct DeviceError {
  int code;
  int unused;
  long long position;  // index into tokens / targets
  long long value;     // the offending index
  long long bound;     // V
};
// Records (code, position, value, bound) in *err for the first i < n with idx[i] outside
// [0, bound) (and, with allow_ignore, not kIgnoreTarget), unless *err already holds an error.
void check_indices(const int32_t* idx, int64_t n, int64_t bound, int code, DeviceError* err,
                   cudaStream_t s, bool allow_ignore = false);
// A small device-to-host read without the copy engines: one block stores `bytes` bytes of
// `src` (device memory) into `dst` and *err into *err_dst (skipped where err_dst is null),
// both the device addresses of page-locked, mapped host memory (cudaHostGetDevicePointer).
// The stores are the SMs' own writes over PCIe, so the read does not queue behind bulk
// cudaMemcpyAsync transfers on other streams that a copy engine serves first. Visible to
// the host once the stream has synchronised. bytes >= 0 (4-byte words when both addresses
// and the size allow, else bytes).
void read_to_mapped(void* dst, const void* src, int64_t bytes, DeviceError* err_dst,
                    const DeviceError* err, cudaStream_t s);

// ---- elementwise (kernels_elementwise.cu) ----
void cast(Out dst, In src, int64_t n, cudaStream_t s);     // any of f32/f64/bf16/f16 to any
void add(Out out, In a, In b, int64_t n, cudaStream_t s);  // out may alias a or b
void axpy(Out y, float alpha, In x, int64_t n, cudaStream_t s);
void scale(Out x, float alpha, int64_t n, cudaStream_t s);
void scale_by(Out x, const float* coef, int64_t n, cudaStream_t s);  // coef: device fp32 [1]
void gelu_forward(Out out, In x, int64_t n, cudaStream_t s);
void gelu_backward(Out dx, In x, In dout, int64_t n, cudaStream_t s);  // dx may alias dout
void add_bias(Out out, In bias, int64_t R, int64_t C, cudaStream_t s);
// h[R,C] = round(round(h + bias[C]) + residual[R,C]) (bias.p null: round(h + residual)):
// add_bias then add in one pass. h must not alias residual.
void add_bias_residual(Out h, In bias, In residual, int64_t R, int64_t C, cudaStream_t s);
// fc[R,C] += bias[C], then out = gelu(fc as stored): add_bias + gelu_forward in one pass.
void bias_gelu_forward(Out out, Out fc, In bias, int64_t R, int64_t C, cudaStream_t s);
void relu_forward(Out out, In x, int64_t n, cudaStream_t s);
void relu_backward(Out dx, In x, In dout, int64_t n, cudaStream_t s);  // dx may alias dout
void mul(Out out, In a, In b, int64_t n, cudaStream_t s);              // out may alias a or b
// GeGLU: out = gelu(gate) (rounded to gate's type) * up; out may alias gate or up.
void geglu_forward(Out out, In gate, In up, int64_t n, cudaStream_t s);
// dup = dout * gelu(gate) (rounded as above), dgate = gelu'(gate) * (dout * up, rounded to
// dgate's type); dgate may alias dout.
void geglu_backward(Out dgate, Out dup, In dout, In gate, In up, int64_t n, cudaStream_t s);
// Gated attention's output gate (Qwen3-Next): out = x * sigmoid(gate); out may alias x (not
// gate).
void sigmoid_gate_forward(Out out, In x, In gate, int64_t n, cudaStream_t s);
// dx = dout * s, dgate = dout * x * s (1 - s), s = sigmoid(gate); dx may alias dout and dgate
// may alias gate.
void sigmoid_gate_backward(Out dx, Out dgate, In dout, In x, In gate, int64_t n, cudaStream_t s);
// fsdp/backend/kernels.hpp's strided_copy: element (r, g, c) of a view at r * row + offset +
// g * group + c * col (elements, all >= 0; dst.col >= 1). For r < R, g < G, c < W: dst(r, g,
// c) = src(r, g, c), or += with `accumulate`, in fp32, rounded once to dst's type; src.group
// == 0 broadcasts; dst.group == 0 writes (adds) the fp32 sum over g ascending, from 0, into
// one output per (r, c). One thread per output, no atomics: deterministic (8 consecutive
// outputs per thread with 16-byte accesses when dst and src share a storage type and 16-byte
// alignment, both col strides are 1, and W, the offsets, row and group strides are multiples
// of 8). dst must not overlap src. R G W == 0 launches nothing.
struct Strided {
  int64_t row, offset, group, col;
};
void strided_copy(Out dst, const Strided& d, In src, const Strided& s, int64_t R, int64_t G,
                  int64_t W, bool accumulate, cudaStream_t st);
// x (fp32) *= inv_scale; *found_inf = 1.0 if any x was inf or NaN (untouched otherwise).
void unscale_and_check(float* x, float inv_scale, int64_t n, double* found_inf, cudaStream_t s);

// ---- reductions (kernels_reduce.cu). Scratch sizes depend on the shapes only. ----
int64_t bias_backward_scratch_floats(int64_t R, int64_t C);
void bias_backward(Out dbias, In dout, int64_t R, int64_t C, float* scratch, cudaStream_t s);
// dx[R,C] = dout * gelu'(x) (dx may alias dout), dbias[C] += column sums of dx as stored:
// gelu_backward + bias_backward in one pass (scratch: bias_backward_scratch_floats(R, C)).
void gelu_bias_backward(Out dx, Out dbias, In x, In dout, int64_t R, int64_t C, float* scratch,
                        cudaStream_t s);
// out0[c] += sum over g of partial[0, g, c] and, with Q == 2, out1[c] += sum of
// partial[1, g, c] (partial: fp32 [Q, G, C]); g in a fixed order in fp64, rounded once. The
// second pass of every column-sum reduction (bias, LayerNorm and RMSNorm weight gradients).
void column_partials_finish(const char* what, Out out0, Out out1, const float* partial, int Q,
                            int64_t G, int64_t C, cudaStream_t s);
int64_t squared_norm_scratch_doubles(int64_t n);
void squared_norm(double* acc, In x, int64_t n, double* scratch, cudaStream_t s);
void clip_coefficient(double* norm, float* coef, const double* parts, int64_t n, double max_norm,
                      cudaStream_t s);
// *acc += sum of values[0..n) in a fixed order (one block).
void sum_into(double* acc, const double* values, int64_t n, cudaStream_t s);

// ---- LayerNorm (kernels_layernorm.cu) ----
void layernorm_forward(Out out, float* mean, float* rstd, In x, In weight, In bias, int64_t R,
                       int64_t C, float eps, cudaStream_t s);
int64_t layernorm_backward_scratch_floats(int64_t R, int64_t C);
void layernorm_backward(Out dx, Out dweight, Out dbias, In dout, In x, In weight, const float* mean,
                        const float* rstd, int64_t R, int64_t C, float* scratch, cudaStream_t s);

// add_bias_residual(h, proj_bias, residual), then layernorm_forward(out, .., h as stored, ..):
// one launch (kernels_layernorm.cu). out must alias neither h nor residual.
void add_layernorm_forward(Out h, Out out, float* mean, float* rstd, In residual, In proj_bias,
                           In weight, In bias, int64_t R, int64_t C, float eps, cudaStream_t s);

// ---- RMSNorm (kernels_layernorm.cu): rstd in fp32, sum of squares in fp64 ----
// add_bias_residual, then rmsnorm_forward of h as stored, in one launch.
void add_rmsnorm_forward(Out h, Out out, float* rstd, In residual, In proj_bias, In weight,
                         int64_t R, int64_t C, float eps, cudaStream_t s);
void rmsnorm_forward(Out out, float* rstd, In x, In weight, int64_t R, int64_t C, float eps,
                     cudaStream_t s);
int64_t rmsnorm_backward_scratch_floats(int64_t R, int64_t C);
void rmsnorm_backward(Out dx, Out dweight, In dout, In x, In weight, const float* rstd, int64_t R,
                      int64_t C, float* scratch, cudaStream_t s);

// ---- embeddings (kernels_embedding.cu); tokens are checked by check_indices first,
// kernels skip (forward: write zeros for) out-of-range ones ----
void embedding_forward(Out out, const int32_t* tokens, In wte, In wpe, int64_t B, int64_t T,
                       int64_t C, int64_t V, cudaStream_t s);
struct EmbeddingScratch {
  int64_t floats = 0;  // fp32 accumulator rows for a 16-bit dwte
  int64_t ints = 0;    // token flags and their compacted row numbers
};
EmbeddingScratch embedding_backward_scratch(ST dwte_type, int64_t B, int64_t T, int64_t C,
                                            int64_t V);
void embedding_backward(Out dwte, Out dwpe, In dout, const int32_t* tokens, int64_t B, int64_t T,
                        int64_t C, int64_t V, float* fscratch, int32_t* iscratch, cudaStream_t s);
// T5's token lookup: out[n, :] = table[tokens[n], :]; backward dtable[tokens[n]] += dout[n]
// with the dwte machinery of embedding_backward (scratch: embedding_backward_scratch(
// dtable type, 1, N, C, V)).
void embedding_lookup_forward(Out out, const int32_t* tokens, In table, int64_t N, int64_t C,
                              int64_t V, cudaStream_t s);
void embedding_lookup_backward(Out dtable, In dout, const int32_t* tokens, int64_t N, int64_t C,
                               int64_t V, float* fscratch, int32_t* iscratch, cudaStream_t s);

// ---- T5 relative position bias (kernels_t5.cu); buckets checked by check_indices first,
// out-of-range ones give 0 / are skipped ----
// By relative position, P = Tq + Tk - 1 (fsdp::relative_positions): bias (fp32) [H, P] =
// table[buckets[o], h]; table [NB, H]; buckets [P].
void position_bias_forward(float* bias, In table, const int32_t* buckets, int64_t NB, int64_t H,
                           int64_t Tq, int64_t Tk, cudaStream_t s);
// dtable[nb, h] += sum over o ascending (fp64) of dbias[h, o] with buckets[o] == nb.
void position_bias_backward(Out dtable, const float* dbias, const int32_t* buckets, int64_t NB,
                            int64_t H, int64_t Tq, int64_t Tk, cudaStream_t s);

// ---- Llama pieces (kernels_llama.cu) ----
// x, out [B,T,H*D] (out may alias x); cos, sin: device fp32 [>= T, R/2]: the first R columns
// of each head rotated, the other D - R copied. transpose: the backward (rope_backward: dx
// from dout, sin negated).
void rope(Out out, In x, const float* cos, const float* sin, int64_t B, int64_t T, int64_t H,
          int64_t D, int64_t R, bool transpose, cudaStream_t s);
// out = silu(gate) up (out may alias gate or up).
void swiglu_forward(Out out, In gate, In up, int64_t n, cudaStream_t s);
// dgate = dout up silu'(gate), dup = dout silu(gate) (dgate may alias gate or dout, dup up).
void swiglu_backward(Out dgate, Out dup, In dout, In gate, In up, int64_t n, cudaStream_t s);
// gpt-oss's clamped SwiGLU on interleaved pairs gate_up [2n] (gate even, up odd): out[i] =
// (u + 1) g sigmoid(alpha g), g = min(gate, limit), u = clamp(up, -limit, limit); out [n]
// must not alias gate_up.
void clamped_swiglu_forward(Out out, In gate_up, int64_t n, float alpha, float limit,
                            cudaStream_t s);
// dgate_up [2n] from dout [n]: the gate's gradient where gate <= limit, the up's where
// -limit <= up <= limit, else 0. dgate_up may alias gate_up (not dout).
void clamped_swiglu_backward(Out dgate_up, In dout, In gate_up, int64_t n, float alpha,
                             float limit, cudaStream_t s);

// ---- mixture of experts (kernels_moe.cu): R tokens, E experts, K picks per token ----
// Top-k routing: idx (int32 [R,K]) and weights (fp32 [R,K]) from logits [R,E]; p =
// softmax(logits[r, :]) in fp32 (fp64 sum of exps), the K largest in descending order, ties
// to the lower expert, divided by their fp32 sum when `normalize`. One warp per row.
void moe_router_forward(int32_t* idx, float* weights, In logits, int64_t R, int64_t E, int64_t K,
                        bool normalize, cudaStream_t s);
// Its backward: dlogits [R,E] (written; may alias logits) from dweights (fp32 [R,K]), p
// recomputed from logits exactly as the forward does. Picks outside [0, E) are skipped.
void moe_router_backward(Out dlogits, const float* dweights, In logits, const int32_t* idx,
                         int64_t R, int64_t E, int64_t K, bool normalize, cudaStream_t s);
// Sigmoid routing with a selection bias and group-limited choice (DeepSeek-V3 / GLM-4.5;
// fsdp/backend/kernels.hpp's moe_sigmoid_router_*): the fields of Kernels::SigmoidRouting.
struct SigmoidRouting {
  int64_t n_group, topk_group;  // E / n_group consecutive experts a group; groups kept
  bool normalize;
  float scale;
};
// idx (int32 [R,K]) and weights (fp32 [R,K]) from logits [R,E] and bias [E] (any float
// types): c = sigmoid(logit) + bias in fp32, the experts outside the topk_group best groups
// (the sum of a group's two largest c; ties to the lower group) at c = 0, the K largest c in
// descending order, ties to the lower expert; weights = scale s, s / (their fp32 sum + 1e-20)
// first when `normalize`. One warp per row, its c in shared memory: E <= 1024, else
// fsdp::Error (thrown even for R = 0).
void moe_sigmoid_router_forward(int32_t* idx, float* weights, In logits, In bias, int64_t R,
                                int64_t E, int64_t K, const SigmoidRouting& g, cudaStream_t s);
// Its backward: dlogits [R,E] (written; may alias logits) from dweights (fp32 [R,K]), s
// recomputed from logits exactly as the forward does; no limit on E. Picks outside [0, E)
// are skipped.
void moe_sigmoid_router_backward(Out dlogits, const float* dweights, In logits, const int32_t* idx,
                                 int64_t R, int64_t E, int64_t K, const SigmoidRouting& g,
                                 cudaStream_t s);
// out[r, :] = sum over j ascending of weights[r, j] rows[slot[r K + j], :] (fp32, rounded
// once); rows [N,C]; weights fp32 [R,K] or null (ones); a slot outside [0, N) adds nothing.
// out must not overlap rows.
void moe_combine_forward(Out out, In rows, const float* weights, const int32_t* slot, int64_t R,
                         int64_t K, int64_t C, int64_t N, cudaStream_t s);
// drows[slot[q], :] = weights[q] dout[r, :] and dweights[q] = dout[r, :] . rows[slot[q], :]
// (fp32, fixed order) for q = r K + j; rows, drows [N,C] (other rows of drows untouched); a
// slot outside [0, N) writes no row and a zero dweight. drows must overlap neither dout nor
// rows.
void moe_combine_backward(Out drows, float* dweights, In dout, In rows, const float* weights,
                          const int32_t* slot, int64_t R, int64_t K, int64_t C, int64_t N,
                          cudaStream_t s);
// The load-balancing loss: psum[e] += sum_r p[r,e] (fp64 partials of 64-row blocks in
// `scratch`, moe_router_prob_sums_scratch_doubles(R, E) of them, summed in block order; E <=
// 1024, else fsdp::Error); loss[0] += alpha sum_e counts[e] psum[e]; dlogits[r,e] += p[r,e]
// (dprobs[e] - p[r,:] . dprobs).
// A shared expert's sigmoid gate: out[r,:] += sigmoid(logit[r]) shared[r,:]; backward
// dshared = s dout, dlogit[r] = s (1 - s) dout[r,:] . shared[r,:] (one warp per row).
void moe_shared_gate_forward(Out out, In shared, In logit, int64_t R, int64_t C,
                             cudaStream_t s);
void moe_shared_gate_backward(Out dshared, Out dlogit, In dout, In shared, In logit, int64_t R,
                              int64_t C, cudaStream_t s);
int64_t moe_router_prob_sums_scratch_doubles(int64_t R, int64_t E);
void moe_router_prob_sums(float* psum, In logits, int64_t R, int64_t E, double* scratch,
                          cudaStream_t s);
void moe_aux_loss(double* loss, const float* counts, const float* psum, int64_t E, double alpha,
                  cudaStream_t s);
void moe_aux_loss_backward(Out dlogits, In logits, const float* dprobs, int64_t R, int64_t E,
                           cudaStream_t s);

// ---- attention: FlashAttention-2 (kernels_flash.cu; kernels in kernels_flash_{mma,simt}.cu) ----
// One attention problem (kernels.hpp's attention_*, mha_* and gqa_attention_*). Head h of
// batch b: queries at q + (b*Tq + i)*ldq + h*D, keys and values of its key/value head
// g = h / group at k / v + (b*Tk + j)*ldk / ldv + g*D, output (and dout) rows at
// out + (b*Tq + i)*ldo + h*D, lse (fp32) at (b*H + h)*Tq + i; gradients share the strides of
// their inputs. Every float array except lse, bias and dbias has storage type t. GPT-2: q, k,
// v are the column blocks of qkv (ldq = ldk = ldv = 3C, ldo = C). Grouped-query attention
// (group = H / Hkv > 1, Llama): dk, dv of key/value head g are summed over its query heads
// g*group .. g*group + group - 1 in that order, in fp32, by the one block that owns the key
// tile (no atomics).
struct FlashProblem {
  int64_t B, Tq, Tk, H, D;
  int64_t ldq, ldk, ldv, ldo;
  float scale;
  bool causal;              // key j masked for query i when j > i
  const float* bias;        // fp32 [H, Tq+Tk-1] by relative position j - i + Tq - 1, or null
  const int32_t* key_mask;  // int32 [B,Tk] (0 = padding) or null
  ST t;
  int64_t group = 1;        // query heads per key/value head (H % group == 0)
  int64_t window = 0;       // > 0 (causal only): key j also masked for query i when j <= i - window
  // > 0: the score is softcap * tanh(scale q.k / softcap) (+ bias), Gemma 2's
  // attn_logit_softcapping; backward multiplies dS by 1 - tanh^2 (not with a bias gradient).
  float softcap = 0.0f;
  // int32 [B,Tq] (Tq == Tk, causal) or null: key j also masked for query i when
  // j < doc_start[b*Tq + i] (document masking; each row nondecreasing, doc_start[b*Tq + i] <= i)
  const int32_t* doc_start = nullptr;
};
// Writes out and lse. One launch.
void flash_forward(const FlashProblem& p, const void* q, const void* k, const void* v, void* out,
                   float* lse, cudaStream_t s);
// fp32 scratch of flash_backward: D_i = rowsum(dO * O), [B,H,Tq], and with a bias gradient
// the dQ kernels' partial rows of it (the larger of the two paths' needs: for the
// tensor-core path B*H*ceil(Tq/64)*(64*ceil(Tk/64) + 64) floats, 1/16 of a [B,H,Tq,Tk]
// fp32 tensor).
int64_t flash_backward_scratch_floats(const FlashProblem& p, bool dbias);
// Writes dq, dk, dv; dbias (fp32 [H, Tq+Tk-1] by relative position, or null) += dS summed
// over b and each relative position (kernels_flash.cuh, DbiasPartials). Three launches (D_i,
// dK/dV, dQ), and a fourth that adds the partial rows into dbias; deterministic.
void flash_backward(const FlashProblem& p, const void* q, const void* k, const void* v,
                    const void* out, const float* lse, const void* dout, void* dq, void* dk,
                    void* dv, float* dbias, float* scratch, cudaStream_t s);

// ---- attention sinks (kernels_attention_sink.cu) on flash_forward's results ----
// out [B,T,H*D], lse fp32 [B,H,T] (at (b*H + h)*T + t), sinks [H]: each row with a finite
// (or -inf) lse L: out row *= 1 / (1 + exp(s - L)), L = log(exp(L) + exp(s)), in place.
void attention_sink_forward(Out out, float* lse, In sinks, int64_t B, int64_t T, int64_t H,
                            int64_t D, cudaStream_t s);
// dsinks[h] += -(sum over b, t of exp(sinks[h] - L) dout row . out row), one block a head,
// fixed order (deterministic, no atomics). dsinks [H] must not overlap the others.
void attention_sink_backward(Out dsinks, In dout, In out, const float* lse, In sinks, int64_t B,
                             int64_t T, int64_t H, int64_t D, cudaStream_t s);

// ---- cross-entropy (kernels_loss.cu); targets checked by check_indices first ----
// logits [R,ld] (ld >= V; columns [V,ld) are padding outside the softmax). Per row:
// row_loss[r] = logsumexp(logits[r, 0:V]) - logits[r, target] (0 for a kIgnoreTarget or bad
// target); with `backward`, logits[r, 0:V] = (softmax - onehot) * grad_scale (a zero row for
// a kIgnoreTarget or bad target) and logits[r, V:ld] = 0. Then *loss += sum of row_loss in a
// fixed order. row_loss: device scratch [R]. softcap > 0: every logit x reads as
// softcap * tanh(x / softcap), and the gradient is times 1 - tanh^2.
void cross_entropy(Out logits, const int32_t* targets, int64_t R, int64_t V, int64_t ld,
                   float grad_scale, float softcap, bool backward, double* row_loss, double* loss,
                   cudaStream_t s);

// ---- optimizers (kernels_optim.cu), fp32 flat shards ----
// The elements that take weight decay, passed by value to the kernel: count < 0 means every
// element, else the sorted, disjoint ranges [begin[k], end[k]) for k < count (0: none). A
// shard with more ranges is updated piece by piece (cuda_backend.cpp).
constexpr int kMaxDecayRanges = 24;
struct DecayRanges {
  int count = -1;
  int64_t begin[kMaxDecayRanges] = {};
  int64_t end[kMaxDecayRanges] = {};
};
// a: fsdp/backend/optimizer_math.hpp's scalars; a.decay applies where `decay` says, 1
// elsewhere. copy: none (copy.p null) or n bf16 / fp16 elements written in the same pass with
// the updated param, rounded as cast. grad_scale: null, or a device fp32 [1] each gradient
// element is multiplied by as it is read (the clip coefficient).
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWCoefficients& a, const DecayRanges& decay, Out copy,
                  const float* grad_scale, cudaStream_t s);
// weight_decay applies where `decay` says, 0 elsewhere. copy, grad_scale: as adamw_update's.
void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float weight_decay, const DecayRanges& decay, bool first_step,
                Out copy, const float* grad_scale, cudaStream_t s);

// ---- GEMMs (kernels_gemm.cpp) ----
// Row-major GEMMs through cuBLASLt (single) and cuBLAS (strided batched), fp32 compute
// (CUBLAS_COMPUTE_32F: no TF32), on one stream. Owns both handles and a workspace; caches a
// cuBLASLt plan (descriptors + heuristic algorithm) per shape, types and pointer alignment.
class Blas {
 public:
  explicit Blas(cudaStream_t stream);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // The combinations cuBLAS runs directly: A and B of one type, C of that type or fp32.
  static bool direct(ST ab, ST c);
  // C[M,N] = alpha op(A) op(B) + beta C (backend.hpp's gemm), M, N, K > 0, direct types.
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
            const void* B, ST ab, float beta, void* C, ST c);
  // cuBLASLt epilogues (as llm.c's matmul_cublaslt uses them), alpha 1:
  //  - bias: C[M,N] = op(A) op(B) + bias[N] (beta 0);
  //  - relu: C[M,N] = max(op(A) op(B), 0) (beta 0; no bias);
  //  - gelu_aux_bias: aux[M,N] = op(A) op(B) + bias[N] (row stride N) and C = GELU(aux)
  //    (cuBLASLt's GELU is the tanh approximation), GELU taken of the fp32 value before aux
  //    is rounded (beta 0);
  //  - dgelu_bgrad: C[M,N] = (op(A) op(B)) * GELU'(aux[M,N]) (aux read, row stride N) and
  //    bias[N] = the column sums of C (written, not accumulated; beta 0);
  //  - bgradb: C[M,N] = op(A) op(B) + beta C and bias[M] = sum over k of op(A)[m, k], i.e. the
  //    column sums of A as stored [K, M] (written; trans_a must be true: cuBLASLt sums its
  //    second operand, which is A here, only when that operand is transposed).
  // A, B, C, bias and aux of one type (cuBLASLt's bias and aux types default to D's, and it
  // refuses an aux type that is not D's).
  enum class Epilogue : int {
    none = 0,
    bias = 1,
    gelu_aux_bias = 2,
    dgelu_bgrad = 3,
    bgradb = 4,
    relu = 5
  };
  // Enqueues the GEMM with `epilogue` and returns true, or returns false with nothing
  // enqueued when cuBLASLt has no algorithm for it or refuses it (the caller then runs the
  // unfused kernels). M, N, K > 0; pointers as gemm's; bias and aux as above.
  bool gemm_epilogue(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
                     const void* B, ST t, float beta, void* C, Epilogue epilogue,
                     const void* bias, const void* aux);
  // For each i < batch: C_i = alpha op(A_i) op(B_i) + beta C_i with X_i = X + i * stride_x
  // (elements), leading dims = stored row widths; direct types.
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            float alpha, const void* A, int64_t lda, int64_t stride_a,
                            const void* B, int64_t ldb, int64_t stride_b, ST ab, float beta,
                            void* C, int64_t ldc, int64_t stride_c, ST c, int64_t batch);

 private:
  struct Plan;
  // (transposes, M, N, K, A/B type, C type, alignments of A, B, C, epilogue, alignments of
  // the epilogue's bias vector and aux matrix)
  using Key =
      std::tuple<bool, bool, int64_t, int64_t, int64_t, int, int, int, int, int, int, int, int>;
  // The plan of `key`, made at its first call. An epilogue's `bias` and `aux` (that first
  // call's) are set before the algorithm search: cublasLtMatmulAlgoGetHeuristic reads their
  // addresses for the alignment it may assume (cublasLt.h, BIAS_POINTER / AUX_POINTER), so
  // every later call of the key has pointers of the same alignments.
  Plan& plan(const Key& key, const void* bias = nullptr, const void* aux = nullptr);
  void gemm_fallback(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                     const void* A, const void* B, ST ab, float beta, void* C, ST c);

  cudaStream_t stream_;
  cublasHandle_t blas_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace fsdp::cuda::kernels
