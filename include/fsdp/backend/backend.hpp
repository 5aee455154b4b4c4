// fsdp/backend/backend.hpp: the kernels interface. Model, FSDP engine and optimizers call
// only this; `cpu/` (fp32, OpenBLAS, the numerical reference) and `cuda/` implement it.
//
// Conventions for every kernel:
//  - All tensors are fp32, contiguous, row-major; pointers are device pointers of this
//    backend (host memory for the CPU backend). Shapes are given beside each argument.
//  - Kernels are enqueued in order on the backend's compute stream (the CPU backend runs
//    them synchronously); `synchronize()` waits for all of them.
//  - "writes" means the output is overwritten; "accumulates" means `out += ...`.
//    Parameter gradients always accumulate (the engine zeroes them before backward);
//    activation gradients are written unless stated otherwise.
//  - B = batch, T = sequence length, C = channels, H = heads, V = vocabulary, R = rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/memory.hpp"

namespace fsdp {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;

  // ---- memory: every allocation is tagged, see MemoryTracker ----
  // Returns 64-byte aligned uninitialised memory; throws fsdp::Error when out of memory.
  virtual void* allocate(std::size_t bytes, MemCategory category) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes, MemCategory category) noexcept = 0;
  virtual MemoryTracker& memory() = 0;
  virtual void fill_zero(void* dst, std::size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;            // device->device
  virtual void copy_to_host(void* host_dst, const void* src, std::size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, std::size_t bytes) = 0;
  virtual void synchronize() = 0;

  // ---- dense algebra ----
  // C[M,N] = alpha * op(A) @ op(B) + beta * C. op(A) is [M,K] (A stored [K,M] if trans_a),
  // op(B) is [K,N] (B stored [N,K] if trans_b). Row-major, leading dims = stored widths.
  virtual void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                    const float* A, const float* B, float beta, float* C) = 0;
  // out[R,C] += bias[C] broadcast over rows.
  virtual void add_bias(float* out, const float* bias, int64_t R, int64_t C) = 0;
  // dbias[C] += sum over rows of dout[R,C].
  virtual void bias_backward(float* dbias, const float* dout, int64_t R, int64_t C) = 0;
  // out[n] = a[n] + b[n] (out may alias a or b).
  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;
  // y[n] += alpha * x[n].
  virtual void axpy(float* y, float alpha, const float* x, int64_t n) = 0;
  // x[n] *= alpha.
  virtual void scale(float* x, float alpha, int64_t n) = 0;
  // Returns sum of x[i]^2 over n elements, accumulated in double, on the host.
  virtual double squared_norm(const float* x, int64_t n) = 0;

  // ---- transformer pieces ----
  // Token + learned position embedding (GPT-2 wte/wpe).
  // tokens: [B,T] int32 in [0,V); wte: [V,C]; wpe: [Tmax,C] (T <= Tmax); writes out: [B,T,C].
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t B, int64_t T, int64_t C) = 0;
  // Accumulates dwte[V,C] and dwpe[Tmax,C] from dout: [B,T,C].
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int64_t B, int64_t T, int64_t C) = 0;

  // LayerNorm over the last dim (biased variance, eps inside the sqrt, as torch.nn.LayerNorm).
  // x: [R,C]; weight, bias: [C]; writes out: [R,C], mean: [R], rstd: [R] (1/sqrt(var+eps)).
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* x,
                                 const float* weight, const float* bias, int64_t R, int64_t C,
                                 float eps) = 0;
  // ACCUMULATES dx[R,C] (so a residual branch can add into the residual grad), and
  // accumulates dweight[C], dbias[C]. Uses x, weight and the saved mean/rstd.
  virtual void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout,
                                  const float* x, const float* weight, const float* mean,
                                  const float* rstd, int64_t R, int64_t C) = 0;

  // GELU, tanh approximation (GPT-2 "gelu_new"):
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). Writes out[n].
  virtual void gelu_forward(float* out, const float* x, int64_t n) = 0;
  // Writes dx[n] = dout[n] * gelu'(x[n]). dx may alias dout (elementwise).
  virtual void gelu_backward(float* dx, const float* x, const float* dout, int64_t n) = 0;

  // Causal multi-head self-attention core (no projections), GPT-2 layout.
  // qkv: [B,T,3C] with q = qkv[..., 0:C], k = [C:2C], v = [2C:3C], head h uses columns
  // [h*hs, (h+1)*hs) of each, hs = C/H. Scores scaled by 1/sqrt(hs), causal mask, softmax.
  // Writes out: [B,T,C] (heads concatenated) and att: [B,H,T,T] (softmax probabilities,
  // zeros above the diagonal), saved for backward.
  virtual void attention_forward(float* out, float* att, const float* qkv, int64_t B,
                                 int64_t T, int64_t C, int64_t H) = 0;
  // Writes dqkv: [B,T,3C] from dout: [B,T,C], using qkv and att from forward.
  // scratch: at least B*H*T*T floats of workspace.
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout,
                                  const float* qkv, const float* att, int64_t B, int64_t T,
                                  int64_t C, int64_t H) = 0;

  // Softmax cross-entropy over V classes for R rows, fused with its gradient.
  // logits: [R,V] (row stride V); targets: [R] int32.
  // Returns sum over rows of -log softmax(logits)[target] (double, on the host) and
  // overwrites logits in place with dlogits = (softmax - onehot) * grad_scale.
  virtual double cross_entropy_forward_backward(float* logits, const int32_t* targets,
                                                int64_t R, int64_t V, float grad_scale) = 0;
  // Same loss without gradient; logits are left unchanged.
  virtual double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t R,
                                       int64_t V) = 0;

  // ---- optimizers, on flat shards ----
  // AdamW (Loshchilov & Hutter 2019; torch.optim.AdamW semantics): step is 1-based.
  // p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  // p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps).
  virtual void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int64_t step) = 0;
  // SGD with momentum, torch.optim.SGD semantics (dampening 0, nesterov off, coupled wd):
  // g += wd * p; buf = momentum * buf + g (buf = g at step 1); p -= lr * buf.
  virtual void sgd_update(float* param, const float* grad, float* momentum_buf, int64_t n,
                          float lr, float momentum, float weight_decay, int64_t step) = 0;
};

}  // namespace fsdp
