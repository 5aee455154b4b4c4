// fsdp/backend/backend.hpp: the kernels interface. Model, FSDP engine and optimizers call
// only this; `cpu/` (the numerical reference) and `cuda/` implement it.
//
// Conventions for every kernel:
//  - Tensors are TensorViews (pointer, dtype, shape): contiguous, row-major, in this
//    backend's memory. Dimensions that a kernel needs are also passed explicitly; a view
//    must hold at least that many elements (checked).
//  - Storage dtypes. "float" arguments may be fp32, bf16 or fp16 (the mixed-precision
//    param_dtype of parameters, gradients and activations); every kernel computes in fp32
//    and rounds to nearest even when it stores (the CPU backend converts on the way in and
//    out; CUDA kernels load, compute in fp32 registers and store). Arguments marked "fp32"
//    must be fp32: LayerNorm statistics, optimizer shards and state, gradient shards.
//    Device scalars (loss and norm accumulators) are fp64 [1] views in backend memory, so a
//    training step never waits for the device until its end.
//  - Kernels are enqueued in order on compute_stream() (the CPU backend runs them
//    synchronously on the calling thread); synchronize() waits for all of them.
//  - "writes" means the output is overwritten; "accumulates" means `out += ...`.
//    Parameter gradients always accumulate (the engine zeroes them before backward);
//    activation gradients are written unless stated otherwise.
//  - B = batch, T = sequence length, C = channels, H = heads, V = vocabulary, R = rows.
//  - Errors: a view too small or of a dtype the kernel does not take throws fsdp::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fsdp/core/caching_allocator.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/memory.hpp"
#include "fsdp/core/stream.hpp"
#include "fsdp/core/tensor.hpp"

namespace fsdp {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- streams and events ----
  // The stream every kernel below is enqueued on.
  virtual Stream& compute_stream() = 0;
  virtual std::unique_ptr<Stream> create_stream() = 0;
  virtual std::unique_ptr<Event> create_event() = 0;

  // ---- memory: a stream-ordered caching allocator; every allocation is tagged ----
  // Returns 256-byte aligned uninitialised memory for use on compute_stream(); throws
  // fsdp::Error when out of memory. bytes == 0 returns nullptr.
  virtual void* allocate(std::size_t bytes, MemCategory category) = 0;
  // Returns memory to the cache; with `pending`, not reused before that event completes
  // (e.g. the Work event of a collective still reading it). Never throws.
  virtual void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                          std::shared_ptr<Event> pending = nullptr) noexcept = 0;
  virtual MemoryTracker& memory() = 0;                 // logical bytes by category
  virtual const AllocatorStats& allocator_stats() const = 0;  // raw allocations underneath
  // dst = 0 (all bytes of the view).
  virtual void fill_zero(const TensorView& dst) = 0;
  // dst = src, same dtype and numel (device to device).
  virtual void copy(const TensorView& dst, const TensorView& src) = 0;
  // dst = src converted elementwise (any of fp32, bf16, fp16, fp64 to any), same numel;
  // rounds to nearest even. The mixed-precision casts of the engine.
  virtual void cast(const TensorView& dst, const TensorView& src) = 0;
  // Blocking copies between host memory and the view (src.bytes() / dst.bytes() bytes).
  virtual void copy_to_host(void* host_dst, const TensorView& src) = 0;
  virtual void copy_from_host(const TensorView& dst, const void* host_src) = 0;
  virtual void synchronize() = 0;

  // ---- dense algebra ----
  // C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is [M,K] (A stored [K,M] if trans_a),
  // op(B) is [K,N] (B stored [N,K] if trans_b). Row-major, leading dims = stored widths.
  // A, B, C: float (any storage dtype, fp32 accumulation). beta == 0 ignores C's contents.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const TensorView& A, const TensorView& B, float beta,
                    const TensorView& C) = 0;
  // out[R,C] += bias[C] broadcast over rows.
  virtual void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) = 0;
  // dbias[C] += sum over rows of dout[R,C].
  virtual void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                             int64_t C) = 0;
  // out[n] = a[n] + b[n], n = out.numel() (out may alias a or b).
  virtual void add(const TensorView& out, const TensorView& a, const TensorView& b) = 0;
  // y[n] += alpha * x[n], n = y.numel(); x may have another float dtype than y.
  virtual void axpy(const TensorView& y, float alpha, const TensorView& x) = 0;
  // x[n] *= alpha.
  virtual void scale(const TensorView& x, float alpha) = 0;

  // ---- reductions into device scalars (fp64 [1] views) ----
  // acc[0] += sum of x[i]^2 over x.numel() elements, summed in fp64 (deterministic order).
  virtual void squared_norm(const TensorView& acc, const TensorView& x) = 0;
  // torch.nn.utils.clip_grad_norm_'s tail: total = sum of parts[0..n) in index order,
  // norm[0] = sqrt(total) (fp64 [1]); coef[0] (fp32 [1]) = float(max_norm / (norm + 1e-6))
  // if max_norm > 0 and norm > max_norm, else 1 (so scaling by it is exact when no clipping).
  virtual void clip_coefficient(const TensorView& norm, const TensorView& coef,
                                const TensorView& parts, double max_norm) = 0;
  // x[n] *= coef[0] (coef: fp32 [1] device scalar).
  virtual void scale_by(const TensorView& x, const TensorView& coef) = 0;
  // Dynamic loss scaling (torch._amp_foreach_non_finite_check_and_unscale_): x (fp32)
  // *= inv_scale; found_inf[0] (fp64 [1]) = 1 if any element of x was inf or NaN (left
  // unchanged otherwise).
  virtual void unscale_and_check(const TensorView& x, float inv_scale,
                                 const TensorView& found_inf) = 0;

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

  // GELU, tanh approximation (GPT-2 "gelu_new"):
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Writes out[n], n = out.numel().
  virtual void gelu_forward(const TensorView& out, const TensorView& x) = 0;
  // Writes dx[n] = dout[n] * gelu'(x[n]). dx may alias dout (elementwise).
  virtual void gelu_backward(const TensorView& dx, const TensorView& x,
                             const TensorView& dout) = 0;

  // Causal multi-head self-attention core (no projections), GPT-2 layout.
  // qkv: [B,T,3C] with q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h uses columns
  // [h*hs, (h+1)*hs) of each, hs = C/H. Scores scaled by 1/sqrt(hs), causal mask, softmax
  // in fp32. Writes out: [B,T,C] (heads concatenated) and att: [B,H,T,T] (softmax
  // probabilities, zeros above the diagonal), saved for backward.
  virtual void attention_forward(const TensorView& out, const TensorView& att,
                                 const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                 int64_t H) = 0;
  // Writes dqkv: [B,T,3C] from dout: [B,T,C], using qkv and att from forward.
  // scratch: fp32, at least B*H*T*T elements of workspace.
  virtual void attention_backward(const TensorView& dqkv, const TensorView& scratch,
                                  const TensorView& dout, const TensorView& qkv,
                                  const TensorView& att, int64_t B, int64_t T, int64_t C,
                                  int64_t H) = 0;

  // Softmax cross-entropy over V classes for R rows, fused with its gradient, in fp32.
  // logits: [R,V] (row stride V); targets: [R] int32.
  // loss[0] (fp64 [1] device scalar) += sum over rows of -log softmax(logits)[target]; logits
  // are overwritten in place with dlogits = (softmax - onehot) * grad_scale.
  virtual void cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                              const TensorView& targets, int64_t R, int64_t V,
                                              float grad_scale) = 0;
  // Same loss without gradient; logits are left unchanged.
  virtual void cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                                     const TensorView& targets, int64_t R, int64_t V) = 0;

  // ---- optimizers, on fp32 flat shards (n = param.numel()) ----
  // AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW semantics): step is 1-based.
  // p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps).
  virtual void adamw_update(const TensorView& param, const TensorView& grad,
                            const TensorView& exp_avg, const TensorView& exp_avg_sq, float lr,
                            float beta1, float beta2, float eps, float weight_decay,
                            int64_t step) = 0;
  // SGD with momentum, torch.optim.SGD semantics (dampening 0, nesterov off, coupled wd):
  // g += wd * p; buf = momentum * buf + g (buf = g at step 1); p -= lr * buf.
  virtual void sgd_update(const TensorView& param, const TensorView& grad,
                          const TensorView& momentum_buf, float lr, float momentum,
                          float weight_decay, int64_t step) = 0;
};

}  // namespace fsdp
