// src/backend/cpu/cpu_backend.cpp: the CPU backend (see fsdp/backend/cpu_backend.hpp), the
// typed Backend interface over the fp32 kernels of cpu_kernels.cpp.
//
// Storage dtypes: every kernel computes in fp32. An fp32 view is handed straight to the fp32
// kernel (no copy), so fp32 results are exactly the kernel's. A bf16/fp16 argument is
// converted to fp32 scratch before the kernel runs (F32In), and a bf16/fp16 result is
// rounded to nearest even back into its view after the kernel returns (F32Out; its scratch
// is first loaded with the view's values when the kernel reads them: accumulating outputs,
// gemm with beta != 0, in-place updates). A 16-bit result is therefore
// round_to(dtype, fp32 kernel on the same inputs), bit for bit, on any thread count.
// Scratch is a per-backend stack of fp32 slots, one per converted argument of the kernel in
// flight, kept and grown between calls (a training step's shapes repeat, so after the first
// step no scratch is allocated). Scratch is host working memory outside the MemoryTracker.
//
// Memory comes from a stream-ordered CachingAllocator over aligned_alloc(256) (blocks cached
// by size class; a block freed with a pending Event is reused only after it completes). The
// compute stream is a HostStream: kernels run synchronously on the calling thread, so
// synchronize() has nothing to wait for and device scalars are plain host doubles.
//
// Every kernel checks its arguments before touching memory: float arguments must be fp32,
// bf16 or fp16, arguments marked fp32 in the interface must be fp32, device scalars fp64 with
// at least one element, token/target views int32, and each view must hold at least the
// elements its dimensions require. Violations throw fsdp::Error naming the kernel and the
// argument.
#include "fsdp/backend/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cpu_kernels.hpp"
#include "fsdp/backend/arg_checks.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

using cpu::CpuKernels;

constexpr std::size_t kAlignment = 256;

// ---------------------------------------------------------------------------------------
// argument checks

struct BackendName {
  static constexpr const char* name = "cpu backend";
};
using Chk = ArgChecks<BackendName>;

// ---------------------------------------------------------------------------------------
// fp32 scratch for 16-bit arguments

void* aligned_bytes(std::size_t bytes) {
  const std::size_t rounded =
      std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  return rounded < bytes ? nullptr : std::aligned_alloc(kAlignment, rounded);
}

// A stack of fp32 buffers: push(n) returns the next slot grown to >= n floats, pop() gives
// the top one back. Slots keep their memory for the next kernel.
class Scratch {
 public:
  float* push(int64_t n) {
    if (depth_ == slots_.size()) slots_.emplace_back();
    Slot& s = slots_[depth_];
    if (s.capacity < n) {
      s.data.reset();
      s.capacity = 0;
      void* p = aligned_bytes(static_cast<std::size_t>(n) * sizeof(float));
      if (p == nullptr) {
        throw Error("cpu backend: out of host memory for " + std::to_string(n) +
                    " floats of fp32 scratch");
      }
      s.data.reset(static_cast<float*>(p));
      s.capacity = n;
    }
    ++depth_;
    return s.data.get();
  }
  void pop() noexcept { --depth_; }

 private:
  struct Free {
    void operator()(float* p) const noexcept { std::free(p); }
  };
  struct Slot {
    std::unique_ptr<float, Free> data;
    int64_t capacity = 0;
  };
  std::vector<Slot> slots_;
  std::size_t depth_ = 0;
};

// A float input [n] as const float*: the view's memory when fp32, else an fp32 copy in
// scratch. Construct inputs before the outputs they may alias.
class F32In {
 public:
  F32In(const CpuKernels& k, Scratch& s, const TensorView& v, int64_t n) {
    if (v.dtype == DType::f32 || n == 0) {
      p_ = static_cast<const float*>(v.data);
      return;
    }
    float* buf = s.push(n);
    try {
      k.to_f32(buf, v.data, v.dtype, n);
    } catch (...) {
      s.pop();
      throw;
    }
    p_ = buf;
    s_ = &s;
  }
  ~F32In() {
    if (s_) s_->pop();
  }
  F32In(const F32In&) = delete;
  F32In& operator=(const F32In&) = delete;
  operator const float*() const { return p_; }

 private:
  const float* p_ = nullptr;
  Scratch* s_ = nullptr;
};

// A float output [n] as float*: the view's memory when fp32, else fp32 scratch rounded back
// into the view when this goes out of scope, unless the kernel threw. `load`: the kernel
// reads the output's values (accumulates into it, or updates it in place).
class F32Out {
 public:
  F32Out(const CpuKernels& k, Scratch& s, const TensorView& v, int64_t n, bool load)
      : k_(k), v_(v), n_(n) {
    if (v.dtype == DType::f32 || n == 0) {
      p_ = static_cast<float*>(v.data);
      return;
    }
    p_ = s.push(n);
    if (load) {
      try {
        k.to_f32(p_, v.data, v.dtype, n);
      } catch (...) {
        s.pop();
        throw;
      }
    }
    s_ = &s;
    exceptions_ = std::uncaught_exceptions();
  }
  ~F32Out() {
    if (!s_) return;
    if (std::uncaught_exceptions() == exceptions_) k_.from_f32(v_.data, v_.dtype, p_, n_);
    s_->pop();
  }
  F32Out(const F32Out&) = delete;
  F32Out& operator=(const F32Out&) = delete;
  operator float*() const { return p_; }

 private:
  const CpuKernels& k_;
  TensorView v_;
  int64_t n_;
  float* p_ = nullptr;
  Scratch* s_ = nullptr;
  int exceptions_ = 0;
};

// ---------------------------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, HostAllocator allocator)
      : k_(num_threads),
        alloc_(std::move(allocator.allocate), std::move(allocator.free), memory_) {}

  Device device() const override { return Device::cpu; }
  bool host_addressable() const override { return true; }

  // ---- streams and events ----
  Stream& compute_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<HostStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<HostEvent>(); }

  // ---- memory ----
  void* allocate(std::size_t bytes, MemCategory category) override {
    if (bytes > std::numeric_limits<std::size_t>::max() - 2 * kAlignment) {
      throw Error("cpu backend: allocation of " + std::to_string(bytes) + " bytes for " +
                  std::string(to_string(category)) + " overflows");
    }
    return alloc_.allocate(bytes, category, stream_);
  }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event> pending) noexcept override {
    alloc_.deallocate(ptr, bytes, category, std::move(pending));
  }
  MemoryTracker& memory() override { return memory_; }
  const AllocatorStats& allocator_stats() const override { return alloc_.stats(); }
  void set_ordered_reuse(bool on) override { alloc_.set_ordered_reuse(on); }
  void fill_zero(const TensorView& dst) override;
  void copy(const TensorView& dst, const TensorView& src) override;
  void cast(const TensorView& dst, const TensorView& src) override;
  void copy_to_host(void* host_dst, const TensorView& src) override;
  void copy_from_host(const TensorView& dst, const void* host_src) override;
  void copy_to_host_async(void* host_dst, const TensorView& src, Stream&) override {
    copy_to_host(host_dst, src);  // host streams run their work at once
  }
  void copy_from_host_async(const TensorView& dst, const void* host_src, Stream&) override {
    copy_from_host(dst, host_src);
  }
  void synchronize() override {}

  // ---- dense algebra ----
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const TensorView& A, const TensorView& B, float beta, const TensorView& C) override;
  void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) override;
  void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                     int64_t C) override;
  void add(const TensorView& out, const TensorView& a, const TensorView& b) override;
  void axpy(const TensorView& y, float alpha, const TensorView& x) override;
  void scale(const TensorView& x, float alpha) override;

  // ---- reductions into device scalars ----
  void squared_norm(const TensorView& acc, const TensorView& x) override;
  void clip_coefficient(const TensorView& norm, const TensorView& coef, const TensorView& parts,
                        double max_norm) override;
  void scale_by(const TensorView& x, const TensorView& coef) override;
  void unscale_and_check(const TensorView& x, float inv_scale,
                         const TensorView& found_inf) override;

  // ---- transformer pieces ----
  void embedding_forward(const TensorView& out, const TensorView& tokens, const TensorView& wte,
                         const TensorView& wpe, int64_t B, int64_t T, int64_t C) override;
  void embedding_backward(const TensorView& dwte, const TensorView& dwpe, const TensorView& dout,
                          const TensorView& tokens, int64_t B, int64_t T, int64_t C) override;
  void layernorm_forward(const TensorView& out, const TensorView& mean, const TensorView& rstd,
                         const TensorView& x, const TensorView& weight, const TensorView& bias,
                         int64_t R, int64_t C, float eps) override;
  void layernorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dbias,
                          const TensorView& dout, const TensorView& x, const TensorView& weight,
                          const TensorView& mean, const TensorView& rstd, int64_t R,
                          int64_t C) override;
  void add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                         const TensorView& residual, int64_t R, int64_t C) override;
  void add_layernorm_forward(const TensorView& h, const TensorView& out, const TensorView& mean,
                             const TensorView& rstd, const TensorView& residual,
                             const TensorView& proj_bias, const TensorView& weight,
                             const TensorView& bias, int64_t R, int64_t C, float eps) override;
  void add_rmsnorm_forward(const TensorView& h, const TensorView& out, const TensorView& rstd,
                           const TensorView& residual, const TensorView& proj_bias,
                           const TensorView& weight, int64_t R, int64_t C, float eps) override;
  void gelu_forward(const TensorView& out, const TensorView& x) override;
  void gelu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) override;
  void bias_gelu_forward(const TensorView& out, const TensorView& fc, const TensorView& bias,
                         int64_t R, int64_t C) override;
  void gelu_bias_backward(const TensorView& dfc, const TensorView& dbias, const TensorView& fc,
                          const TensorView& dout, int64_t R, int64_t C) override;
  void attention_forward(const TensorView& out, const TensorView& lse, const TensorView& qkv,
                         int64_t B, int64_t T, int64_t C, int64_t H,
                         const TensorView& doc_start) override;
  void attention_backward(const TensorView& dqkv, const TensorView& dout, const TensorView& qkv,
                          const TensorView& out, const TensorView& lse, int64_t B, int64_t T,
                          int64_t C, int64_t H, const TensorView& doc_start) override;
  void cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                      const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                                      float grad_scale, float softcap) override;
  void cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                             const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                             float softcap) override;

  // ---- T5 pieces ----
  void embedding_lookup_forward(const TensorView& out, const TensorView& tokens,
                                const TensorView& table, int64_t N, int64_t C) override;
  void embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                 const TensorView& tokens, int64_t N, int64_t C) override;
  void rmsnorm_forward(const TensorView& out, const TensorView& rstd, const TensorView& x,
                       const TensorView& weight, int64_t R, int64_t C, float eps) override;
  void rmsnorm_backward(const TensorView& dx, const TensorView& dweight, const TensorView& dout,
                        const TensorView& x, const TensorView& weight, const TensorView& rstd,
                        int64_t R, int64_t C) override;
  void relu_forward(const TensorView& out, const TensorView& x) override;
  void relu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) override;
  void mul(const TensorView& out, const TensorView& a, const TensorView& b) override;
  void geglu_forward(const TensorView& out, const TensorView& gate, const TensorView& up) override;
  void geglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dout,
                      const TensorView& gate, const TensorView& up) override;
  void position_bias_forward(const TensorView& bias, const TensorView& table,
                             const TensorView& buckets, int64_t H, int64_t Tq,
                             int64_t Tk) override;
  void position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                              const TensorView& buckets, int64_t H, int64_t Tq,
                              int64_t Tk) override;
  void mha_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                   const TensorView& k, const TensorView& v, const TensorView& bias,
                   const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk, int64_t H,
                   int64_t D, float scale, bool causal) override;
  void mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                    const TensorView& dbias, const TensorView& dout, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& out,
                    const TensorView& lse, const TensorView& bias, const TensorView& key_mask,
                    int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                    bool causal) override;

  // ---- Llama pieces ----
  void rope_forward(const TensorView& out, const TensorView& x, const TensorView& cos,
                    const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                    int64_t R) override;
  void rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                     const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                     int64_t R) override;
  void swiglu_forward(const TensorView& out, const TensorView& gate, const TensorView& up) override;
  void sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                            const TensorView& gate) override;
  void sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate, const TensorView& dout,
                             const TensorView& x, const TensorView& gate) override;
  void clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up, float alpha,
                              float limit) override;
  void clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                               const TensorView& gate_up, float alpha, float limit) override;
  void attention_sink_forward(const TensorView& out, const TensorView& lse,
                              const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                              int64_t D) override;
  void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                               int64_t D) override;
  void swiglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dout,
                       const TensorView& gate, const TensorView& up) override;
  void causal_conv1d_forward(const TensorView& out, const TensorView& x, const TensorView& weight,
                             int64_t B, int64_t T, int64_t C, int64_t K,
                             const TensorView& doc_start) override;
  void causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                              const TensorView& dout, const TensorView& x,
                              const TensorView& weight, int64_t B, int64_t T, int64_t C,
                              int64_t K, const TensorView& doc_start) override;
  void gated_delta_rule_forward(const TensorView& out, const TensorView& qkv, const TensorView& a,
                                const TensorView& b, const TensorView& A_log,
                                const TensorView& dt_bias, int64_t B, int64_t T, int64_t Hk,
                                int64_t Hv, int64_t Dk, int64_t Dv,
                                const TensorView& doc_start) override;
  void gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                 const TensorView& db, const TensorView& dA_log,
                                 const TensorView& ddt_bias, const TensorView& dout,
                                 const TensorView& qkv, const TensorView& a, const TensorView& b,
                                 const TensorView& A_log, const TensorView& dt_bias, int64_t B,
                                 int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                 const TensorView& doc_start) override;

  void gqa_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                             const TensorView& k, const TensorView& v, int64_t B, int64_t T,
                             int64_t H, int64_t Hkv, int64_t D, float scale, int64_t window,
                             float softcap, const TensorView& doc_start) override;
  void gqa_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                              int64_t window, float softcap, const TensorView& doc_start) override;

  // ---- mixture of experts ----
  void moe_router_forward(const TensorView& idx, const TensorView& weights,
                          const TensorView& logits, int64_t R, int64_t E, int64_t K,
                          bool normalize) override;
  void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                           const TensorView& logits, const TensorView& idx, int64_t R, int64_t E,
                           int64_t K, bool normalize) override;
  void strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                    const Strided& src_at, int64_t R, int64_t G, int64_t W,
                    bool accumulate) override;
  void moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                  const TensorView& logits, const TensorView& bias, int64_t R,
                                  int64_t E, int64_t K, const SigmoidRouting& g) override;
  void moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                   const TensorView& logits, const TensorView& idx, int64_t R,
                                   int64_t E, int64_t K, const SigmoidRouting& g) override;
  void moe_combine_forward(const TensorView& out, const TensorView& rows,
                           const TensorView& weights, const TensorView& slot, int64_t R, int64_t K,
                           int64_t C) override;
  void moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                            const TensorView& dout, const TensorView& rows,
                            const TensorView& weights, const TensorView& slot, int64_t R,
                            int64_t K, int64_t C) override;
  void moe_router_prob_sums(const TensorView& psum, const TensorView& logits, int64_t R,
                            int64_t E) override;
  void moe_aux_loss(const TensorView& loss, const TensorView& counts, const TensorView& psum,
                    int64_t E, double alpha) override;
  void moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                             const TensorView& dprobs, int64_t R, int64_t E) override;
  void moe_shared_gate_forward(const TensorView& out, const TensorView& shared,
                               const TensorView& logit, int64_t R, int64_t C) override;
  void moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                const TensorView& dout, const TensorView& shared,
                                const TensorView& logit, int64_t R, int64_t C) override;

  // ---- optimizers ----
  void adamw_update(const TensorView& param, const TensorView& grad, const TensorView& exp_avg,
                    const TensorView& exp_avg_sq, float lr, float beta1, float beta2, float eps,
                    const WeightDecay& weight_decay, int64_t step,
                    const TensorView& compute_copy, const TensorView& grad_scale) override;
  void sgd_update(const TensorView& param, const TensorView& grad, const TensorView& momentum_buf,
                  float lr, float momentum, const WeightDecay& weight_decay, int64_t step,
                  const TensorView& compute_copy, const TensorView& grad_scale) override;

 private:
  F32In in(const TensorView& v, int64_t n) { return F32In(k_, scratch_, v, n); }
  // add_bias_residual after its argument checks (the fused norms run theirs first).
  void bias_residual_checked(const TensorView& h, const TensorView& proj_bias,
                             const TensorView& residual, int64_t R, int64_t C);
  F32Out out(const TensorView& v, int64_t n, bool load) { return F32Out(k_, scratch_, v, n, load); }
  // The values of tokens [n] (int32, already checked by ArgChecks) in [0, V) (no upper
  // bound when V < 0); `rows_of` names the table.
  void check_tokens(const char* kernel, const TensorView& tokens, int64_t n, int64_t V,
                    const char* arg = "tokens", const char* rows_of = "wte") const;

  CpuKernels k_;
  MemoryTracker memory_;  // before alloc_, which reports to it
  HostStream stream_;
  CachingAllocator alloc_;
  Scratch scratch_;
};

// ---------------------------------------------------------------------------------------
// memory and casts

namespace {
// Applies f(lo, hi) to byte ranges covering [0, bytes): split over `threads` OpenMP threads
// when the range is large (at least 8 MiB a thread, in 4 KiB-aligned pieces), else one call.
// A large zeroing or copy is mostly first touch of fresh pages (the optimizer state's zeros,
// a shard's upload), which the kernel serves per faulting thread: one thread ran the 3.2 GB
// of AdamW state of a 404M model in 7 s on the CI VM.
template <typename F>
void for_byte_ranges(std::size_t bytes, int threads, const F& f) {
  constexpr std::size_t kPerThread = std::size_t{8} << 20, kPage = 4096;
  const int nt = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(std::max(threads, 1)),
                                                        bytes / kPerThread));
  if (nt <= 1) {
    if (bytes) f(std::size_t{0}, bytes);
    return;
  }
  const std::size_t piece = (bytes / static_cast<std::size_t>(nt) + kPage - 1) / kPage * kPage;
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (int t = 0; t < nt; ++t) {
    const std::size_t lo = std::min(bytes, static_cast<std::size_t>(t) * piece);
    const std::size_t hi = std::min(bytes, lo + piece);
    if (lo < hi) f(lo, hi);
  }
}

// dst <- src for `bytes` bytes: in parallel pieces when the two do not overlap, else one
// memmove (the only overlap callers make is dst == src, which copies nothing).
void copy_bytes(void* dst, const void* src, std::size_t bytes, int threads) {
  if (!bytes || dst == src) return;
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) {
    std::memmove(d, s, bytes);
    return;
  }
  for_byte_ranges(bytes, threads, [&](std::size_t lo, std::size_t hi) { std::memcpy(d + lo, s + lo, hi - lo); });
}
}  // namespace

void CpuBackend::fill_zero(const TensorView& dst) {
  Chk::fill_zero(dst);
  auto* d = static_cast<char*>(dst.data);
  for_byte_ranges(dst.bytes(), k_.num_threads(),
                  [&](std::size_t lo, std::size_t hi) { std::memset(d + lo, 0, hi - lo); });
}

void CpuBackend::copy(const TensorView& dst, const TensorView& src) {
  Chk::copy(dst, src);
  copy_bytes(dst.data, src.data, dst.bytes(), k_.num_threads());
}

void CpuBackend::cast(const TensorView& dst, const TensorView& src) {
  Chk::cast(dst, src);
  k_.cast(dst.data, dst.dtype, src.data, src.dtype, dst.numel());
}

void CpuBackend::copy_to_host(void* host_dst, const TensorView& src) {
  Chk::copy_to_host(src);
  copy_bytes(host_dst, src.data, src.bytes(), k_.num_threads());
}

void CpuBackend::copy_from_host(const TensorView& dst, const void* host_src) {
  Chk::copy_from_host(dst);
  copy_bytes(dst.data, host_src, dst.bytes(), k_.num_threads());
}

// ---------------------------------------------------------------------------------------
// dense algebra

void CpuBackend::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                      const TensorView& A, const TensorView& B, float beta, const TensorView& C) {
  // A: [M,K] ([K,M] if trans_a), B: [K,N] ([N,K] if trans_b), C: [M,N].
  Chk::gemm(M, N, K, A, B, C);
  const F32In a = in(A, M * K), b = in(B, K * N);
  const F32Out c = out(C, M * N, beta != 0.0f);
  k_.gemm(trans_a, trans_b, M, N, K, alpha, a, b, beta, c);
}

void CpuBackend::add_bias(const TensorView& out_, const TensorView& bias, int64_t R, int64_t C) {
  // out: [R,C] += bias: [C]
  Chk::add_bias(out_, bias, R, C);
  const F32In b = in(bias, C);
  const F32Out o = out(out_, R * C, true);
  k_.add_bias(o, b, R, C);
}

void CpuBackend::bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                               int64_t C) {
  // dbias: [C] += colsum(dout: [R,C])
  Chk::bias_backward(dbias, dout, R, C);
  const F32In d = in(dout, R * C);
  const F32Out db = out(dbias, C, true);
  k_.bias_backward(db, d, R, C);
}

void CpuBackend::add(const TensorView& out_, const TensorView& a, const TensorView& b) {
  // out[n] = a[n] + b[n], n = out.numel()
  const int64_t n = out_.numel();
  Chk::binary("add", out_, a, b);
  const F32In fa = in(a, n), fb = in(b, n);
  const F32Out o = out(out_, n, false);
  k_.add(o, fa, fb, n);
}

// The fused residual adds (kernels.hpp): one pass in fp32; in bf16/fp16 the unfused calls
// in order, which round h after each step exactly as the contract says.
void CpuBackend::add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                                   const TensorView& residual, int64_t R, int64_t C) {
  Chk::add_bias_residual(h, proj_bias, residual, R, C);
  bias_residual_checked(h, proj_bias, residual, R, C);
}

void CpuBackend::bias_residual_checked(const TensorView& h, const TensorView& proj_bias,
                                       const TensorView& residual, int64_t R, int64_t C) {
  const TensorView hv = h.slice(0, R * C);
  if (h.dtype != DType::f32) {
    if (proj_bias.data) add_bias(hv, proj_bias, R, C);
    add(hv, hv, residual.slice(0, R * C));
    return;
  }
  const F32In b = in(proj_bias, proj_bias.data ? C : 0), x = in(residual, R * C);
  k_.add_bias_residual(static_cast<float*>(h.data), b, x, R, C);
}

void CpuBackend::add_layernorm_forward(const TensorView& h, const TensorView& out_,
                                       const TensorView& mean, const TensorView& rstd,
                                       const TensorView& residual, const TensorView& proj_bias,
                                       const TensorView& weight, const TensorView& bias,
                                       int64_t R, int64_t C, float eps) {
  Chk::add_layernorm_forward(h, out_, mean, rstd, residual, proj_bias, weight, bias, R, C);
  bias_residual_checked(h, proj_bias, residual, R, C);
  layernorm_forward(out_, mean, rstd, h, weight, bias, R, C, eps);
}

void CpuBackend::add_rmsnorm_forward(const TensorView& h, const TensorView& out_,
                                     const TensorView& rstd, const TensorView& residual,
                                     const TensorView& proj_bias, const TensorView& weight,
                                     int64_t R, int64_t C, float eps) {
  Chk::add_rmsnorm_forward(h, out_, rstd, residual, proj_bias, weight, R, C);
  bias_residual_checked(h, proj_bias, residual, R, C);
  rmsnorm_forward(out_, rstd, h, weight, R, C, eps);
}

void CpuBackend::axpy(const TensorView& y, float alpha, const TensorView& x) {
  // y[n] += alpha x[n], n = y.numel()
  const int64_t n = y.numel();
  Chk::axpy(y, x);
  const F32In fx = in(x, n);
  const F32Out fy = out(y, n, true);
  k_.axpy(fy, alpha, fx, n);
}

void CpuBackend::scale(const TensorView& x, float alpha) {
  // x[n] *= alpha
  const int64_t n = x.numel();
  Chk::scale(x);
  const F32Out fx = out(x, n, true);
  k_.scale(fx, alpha, n);
}

// ---------------------------------------------------------------------------------------
// reductions into device scalars

void CpuBackend::squared_norm(const TensorView& acc, const TensorView& x) {
  // acc[0] (fp64) += sum x[n]^2
  double& a = *Chk::squared_norm(acc, x);
  const int64_t n = x.numel();
  const F32In fx = in(x, n);
  a += k_.squared_norm(fx, n);
}

void CpuBackend::clip_coefficient(const TensorView& norm, const TensorView& coef,
                                  const TensorView& parts, double max_norm) {
  // norm[0] (fp64) = sqrt(sum parts[n] (fp64)); coef[0] (fp32) = clip coefficient
  double& nrm = *Chk::clip_coefficient(norm, coef, parts);
  const double* p = static_cast<const double*>(parts.data);
  double total = 0.0;
  for (int64_t i = 0; i < parts.numel(); ++i) total += p[i];
  const double value = std::sqrt(total);
  nrm = value;
  *static_cast<float*>(coef.data) =
      (max_norm > 0 && value > max_norm) ? static_cast<float>(max_norm / (value + 1e-6)) : 1.0f;
}

void CpuBackend::scale_by(const TensorView& x, const TensorView& coef) {
  // x[n] *= coef[0] (fp32)
  Chk::scale_by(x, coef);
  const int64_t n = x.numel();
  const float alpha = *static_cast<const float*>(coef.data);
  if (alpha == 1.0f) return;  // x * 1 is x: no clipping costs no pass over the gradient
  const F32Out fx = out(x, n, true);
  k_.scale(fx, alpha, n);
}

void CpuBackend::unscale_and_check(const TensorView& x, float inv_scale,
                                   const TensorView& found_inf) {
  // x[n] (fp32) *= inv_scale; found_inf[0] (fp64) = 1 if any x was inf or NaN
  double& found = *Chk::unscale_and_check(x, found_inf);
  if (k_.unscale_and_check(static_cast<float*>(x.data), inv_scale, x.numel())) found = 1.0;
}

// ---------------------------------------------------------------------------------------
// transformer pieces

void CpuBackend::check_tokens(const char* kernel, const TensorView& tokens, int64_t n,
                              int64_t V, const char* arg, const char* rows_of) const {
  const int32_t* t = static_cast<const int32_t*>(tokens.data);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0 || (V >= 0 && t[i] >= V)) {
      Chk::error(kernel, arg,
                "holds " + std::to_string(t[i]) + " at position " + std::to_string(i) +
                    " (expected 0 <= value < " + std::to_string(V) + ", the rows of " + rows_of +
                    ")");
    }
  }
}

void CpuBackend::embedding_forward(const TensorView& out_, const TensorView& tokens,
                                   const TensorView& wte, const TensorView& wpe, int64_t B,
                                   int64_t T, int64_t C) {
  // tokens: [B,T] int32; wte: [V,C]; wpe: [Tmax,C]; out: [B,T,C]. V = wte.numel() / C.
  const int64_t V = Chk::embedding_forward(out_, tokens, wte, wpe, B, T, C);
  check_tokens("embedding_forward", tokens, B * T, V);
  const F32In e = in(wte, std::max<int64_t>(V, 0) * C), p = in(wpe, T * C);
  const F32Out o = out(out_, B * T * C, false);
  k_.embedding_forward(o, static_cast<const int32_t*>(tokens.data), e, p, B, T, C);
}

void CpuBackend::embedding_backward(const TensorView& dwte, const TensorView& dwpe,
                                    const TensorView& dout, const TensorView& tokens, int64_t B,
                                    int64_t T, int64_t C) {
  // dwte: [V,C] += scatter of dout: [B,T,C] by tokens: [B,T]; dwpe: [Tmax,C] (rows < T) +=.
  const int64_t V = Chk::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  check_tokens("embedding_backward", tokens, B * T, V);
  const F32In d = in(dout, B * T * C);
  const F32Out e = out(dwte, std::max<int64_t>(V, 0) * C, true), p = out(dwpe, T * C, true);
  k_.embedding_backward(e, p, d, static_cast<const int32_t*>(tokens.data), B, T, C);
}

void CpuBackend::layernorm_forward(const TensorView& out_, const TensorView& mean,
                                   const TensorView& rstd, const TensorView& x,
                                   const TensorView& weight, const TensorView& bias, int64_t R,
                                   int64_t C, float eps) {
  // x: [R,C]; weight, bias: [C]; out: [R,C]; mean, rstd: [R] fp32.
  Chk::layernorm_forward(out_, mean, rstd, x, weight, bias, R, C);
  const F32In fx = in(x, R * C), w = in(weight, C), b = in(bias, C);
  const F32Out o = out(out_, R * C, false);
  k_.layernorm_forward(o, static_cast<float*>(mean.data), static_cast<float*>(rstd.data), fx, w, b,
                       R, C, eps);
}

void CpuBackend::layernorm_backward(const TensorView& dx, const TensorView& dweight,
                                    const TensorView& dbias, const TensorView& dout,
                                    const TensorView& x, const TensorView& weight,
                                    const TensorView& mean, const TensorView& rstd, int64_t R,
                                    int64_t C) {
  // dx: [R,C] +=; dweight, dbias: [C] +=; dout, x: [R,C]; weight: [C]; mean, rstd: [R] fp32.
  Chk::layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, R, C);
  const F32In d = in(dout, R * C), fx = in(x, R * C), w = in(weight, C);
  const F32Out g = out(dx, R * C, true), gw = out(dweight, C, true), gb = out(dbias, C, true);
  k_.layernorm_backward(g, gw, gb, d, fx, w, static_cast<const float*>(mean.data),
                        static_cast<const float*>(rstd.data), R, C);
}

void CpuBackend::gelu_forward(const TensorView& out_, const TensorView& x) {
  // out[n] = gelu(x[n]), n = out.numel()
  const int64_t n = out_.numel();
  Chk::unary_forward("gelu_forward", out_, x);
  const F32In fx = in(x, n);
  const F32Out o = out(out_, n, false);
  k_.gelu_forward(o, fx, n);
}

void CpuBackend::gelu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) {
  // dx[n] = dout[n] gelu'(x[n]), n = dx.numel() (dx may alias dout)
  const int64_t n = dx.numel();
  Chk::unary_backward("gelu_backward", dx, x, dout);
  const F32In fx = in(x, n), d = in(dout, n);
  const F32Out g = out(dx, n, false);
  k_.gelu_backward(g, fx, d, n);
}

void CpuBackend::bias_gelu_forward(const TensorView& out_, const TensorView& fc,
                                   const TensorView& bias, int64_t R, int64_t C) {
  // fc: [R,C] += bias: [C]; out: [R,C] = gelu(fc as stored)
  Chk::bias_gelu_forward(out_, fc, bias, R, C);
  if (fc.dtype != DType::f32) {  // GELU reads the rounded fc: the two kernels, in order
    add_bias(fc, bias, R, C);
    gelu_forward(out_.slice(0, R * C), fc.slice(0, R * C));
    return;
  }
  const F32In b = in(bias, C);
  const F32Out o = out(out_, R * C, false);
  k_.bias_gelu_forward(o, static_cast<float*>(fc.data), b, R, C);
}

void CpuBackend::gelu_bias_backward(const TensorView& dfc, const TensorView& dbias,
                                    const TensorView& fc, const TensorView& dout, int64_t R,
                                    int64_t C) {
  // dfc: [R,C] = dout gelu'(fc) (may alias dout); dbias: [C] += colsum(dfc as stored)
  Chk::gelu_bias_backward(dfc, dbias, fc, dout, R, C);
  if (dfc.dtype != DType::f32) {  // the bias gradient sums the rounded dfc: the two kernels
    gelu_backward(dfc.slice(0, R * C), fc.slice(0, R * C), dout.slice(0, R * C));
    bias_backward(dbias, dfc, R, C);
    return;
  }
  const F32In x = in(fc, R * C), d = in(dout, R * C);
  const F32Out db = out(dbias, C, true);
  k_.gelu_bias_backward(static_cast<float*>(dfc.data), db, x, d, R, C);
}

namespace {
// GPT-2's attention as an attention problem: head h of batch b is columns [h*hs, (h+1)*hs)
// of the q, k, v blocks of qkv (row stride 3C) and of out (row stride C); causal, 1/sqrt(hs);
// within each document under doc_start (or null).
cpu::AttentionProblem gpt2_attention(int64_t B, int64_t T, int64_t C, int64_t H,
                                     const TensorView& doc_start) {
  if (C <= 0 || H <= 0 || C % H != 0) {
    throw Error("cpu backend: attention: bad shape B=" + std::to_string(B) +
                " T=" + std::to_string(T) + " C=" + std::to_string(C) + " H=" +
                std::to_string(H) + " (expected C divisible by H)");
  }
  cpu::AttentionProblem p;
  p.B = B;
  p.Tq = p.Tk = T;
  p.H = H;
  p.D = C / H;
  p.ldq = p.ldk = p.ldv = 3 * C;
  p.ldo = C;
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.D));
  p.causal = true;
  p.doc_start = doc_start ? static_cast<const int32_t*>(doc_start.data) : nullptr;
  return p;
}
}  // namespace

void CpuBackend::attention_forward(const TensorView& out_, const TensorView& lse,
                                   const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                   int64_t H, const TensorView& doc_start) {
  // qkv: [B,T,3C]; out: [B,T,C]; lse: [B,H,T] fp32; doc_start: int32 [B,T] or null.
  Chk::attention_forward(out_, lse, qkv, B, T, C, H, doc_start);
  const cpu::AttentionProblem p = gpt2_attention(B, T, C, H, doc_start);
  const F32In q = in(qkv, B * T * 3 * C);
  const F32Out o = out(out_, B * T * C, false);
  k_.attention_forward(p, q, q + C, q + 2 * C, o, static_cast<float*>(lse.data));
}

void CpuBackend::attention_backward(const TensorView& dqkv, const TensorView& dout,
                                    const TensorView& qkv, const TensorView& out_,
                                    const TensorView& lse, int64_t B, int64_t T, int64_t C,
                                    int64_t H, const TensorView& doc_start) {
  // dqkv: [B,T,3C] written; dout, out: [B,T,C]; qkv: [B,T,3C]; lse: [B,H,T] fp32; doc_start
  // as in forward.
  Chk::attention_backward(dqkv, dout, qkv, out_, lse, B, T, C, H, doc_start);
  const cpu::AttentionProblem p = gpt2_attention(B, T, C, H, doc_start);
  const F32In d = in(dout, B * T * C), q = in(qkv, B * T * 3 * C), o = in(out_, B * T * C);
  const F32Out g = out(dqkv, B * T * 3 * C, false);
  float* gp = g;
  k_.attention_backward(p, q, q + C, q + 2 * C, o, static_cast<const float*>(lse.data), d, gp,
                        gp + C, gp + 2 * C, nullptr);
}

void CpuBackend::cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                                const TensorView& targets, int64_t R, int64_t V,
                                                int64_t ld, float grad_scale, float softcap) {
  // loss[0] (fp64) += sum of row losses; logits: [R,ld] -> dlogits in place (padding columns
  // [V,ld) = 0); targets: [R] int32.
  double& l = *Chk::cross_entropy("cross_entropy_forward_backward", loss, logits, targets, R, V, ld,
                                  softcap);
  const F32Out x = out(logits, R * ld, true);
  l += k_.cross_entropy_forward_backward(x, static_cast<const int32_t*>(targets.data), R, V, ld,
                                         grad_scale, softcap);
}

void CpuBackend::cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                                       const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                                       float softcap) {
  // loss[0] (fp64) += sum of row losses; logits: [R,ld] unchanged; targets: [R] int32.
  double& l =
      *Chk::cross_entropy("cross_entropy_forward", loss, logits, targets, R, V, ld, softcap);
  const F32In x = in(logits, R * ld);
  l += k_.cross_entropy_forward(x, static_cast<const int32_t*>(targets.data), R, V, ld, softcap);
}

// ---------------------------------------------------------------------------------------
// T5 pieces

void CpuBackend::embedding_lookup_forward(const TensorView& out_, const TensorView& tokens,
                                          const TensorView& table, int64_t N, int64_t C) {
  // tokens: [N] int32; table: [V,C]; out: [N,C]. V = table.numel() / C.
  const int64_t V = Chk::embedding_lookup_forward(out_, tokens, table, N, C);
  check_tokens("embedding_lookup_forward", tokens, N, V, "tokens", "table");
  const F32In e = in(table, std::max<int64_t>(V, 0) * C);
  const F32Out o = out(out_, N * C, false);
  k_.embedding_lookup_forward(o, static_cast<const int32_t*>(tokens.data), e, N, C);
}

void CpuBackend::embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                           const TensorView& tokens, int64_t N, int64_t C) {
  // dtable: [V,C] += scatter of dout: [N,C] by tokens: [N].
  const int64_t V = Chk::embedding_lookup_backward(dtable, dout, tokens, N, C);
  check_tokens("embedding_lookup_backward", tokens, N, V, "tokens", "dtable");
  const F32In d = in(dout, N * C);
  const F32Out g = out(dtable, std::max<int64_t>(V, 0) * C, true);
  k_.embedding_lookup_backward(g, d, static_cast<const int32_t*>(tokens.data), N, C);
}

void CpuBackend::rmsnorm_forward(const TensorView& out_, const TensorView& rstd,
                                 const TensorView& x, const TensorView& weight, int64_t R,
                                 int64_t C, float eps) {
  // x: [R,C]; weight: [C]; out: [R,C]; rstd: [R] fp32.
  Chk::rmsnorm_forward(out_, rstd, x, weight, R, C);
  const F32In fx = in(x, R * C), w = in(weight, C);
  const F32Out o = out(out_, R * C, false);
  k_.rmsnorm_forward(o, static_cast<float*>(rstd.data), fx, w, R, C, eps);
}

void CpuBackend::rmsnorm_backward(const TensorView& dx, const TensorView& dweight,
                                  const TensorView& dout, const TensorView& x,
                                  const TensorView& weight, const TensorView& rstd, int64_t R,
                                  int64_t C) {
  // dx: [R,C] +=; dweight: [C] +=; dout, x: [R,C]; weight: [C]; rstd: [R] fp32.
  Chk::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, R, C);
  const F32In d = in(dout, R * C), fx = in(x, R * C), w = in(weight, C);
  const F32Out g = out(dx, R * C, true), gw = out(dweight, C, true);
  k_.rmsnorm_backward(g, gw, d, fx, w, static_cast<const float*>(rstd.data), R, C);
}

void CpuBackend::relu_forward(const TensorView& out_, const TensorView& x) {
  // out[n] = max(x[n], 0), n = out.numel()
  const int64_t n = out_.numel();
  Chk::unary_forward("relu_forward", out_, x);
  const F32In fx = in(x, n);
  const F32Out o = out(out_, n, false);
  k_.relu_forward(o, fx, n);
}

void CpuBackend::relu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) {
  // dx[n] = x[n] > 0 ? dout[n] : 0, n = dx.numel() (dx may alias dout)
  const int64_t n = dx.numel();
  Chk::unary_backward("relu_backward", dx, x, dout);
  const F32In fx = in(x, n), d = in(dout, n);
  const F32Out g = out(dx, n, false);
  k_.relu_backward(g, fx, d, n);
}

void CpuBackend::mul(const TensorView& out_, const TensorView& a, const TensorView& b) {
  // out[n] = a[n] * b[n], n = out.numel() (out may alias a or b)
  const int64_t n = out_.numel();
  Chk::binary("mul", out_, a, b);
  const F32In fa = in(a, n), fb = in(b, n);
  const F32Out o = out(out_, n, false);
  k_.mul(o, fa, fb, n);
}

void CpuBackend::position_bias_forward(const TensorView& bias, const TensorView& table,
                                       const TensorView& buckets, int64_t H, int64_t Tq,
                                       int64_t Tk) {
  // table: [NB,H]; buckets: [P] int32 in [0,NB); bias: [H,P] fp32, P =
  // relative_positions(Tq, Tk). NB = numel / H.
  const int64_t NB = Chk::position_bias_forward(bias, table, buckets, H, Tq, Tk);
  check_tokens("position_bias_forward", buckets, relative_positions(Tq, Tk), NB, "buckets",
               "table");
  const F32In t = in(table, std::max<int64_t>(NB, 0) * H);
  k_.position_bias_forward(static_cast<float*>(bias.data), t,
                           static_cast<const int32_t*>(buckets.data), H, Tq, Tk);
}

void CpuBackend::position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                                        const TensorView& buckets, int64_t H, int64_t Tq,
                                        int64_t Tk) {
  // dtable: [NB,H] +=; dbias: [H,P] fp32; buckets: [P] int32 in [0,NB), P =
  // relative_positions(Tq, Tk).
  const int64_t NB = Chk::position_bias_backward(dtable, dbias, buckets, H, Tq, Tk);
  check_tokens("position_bias_backward", buckets, relative_positions(Tq, Tk), NB, "buckets",
               "dtable");
  const int64_t nb = std::max<int64_t>(NB, 0);
  const F32Out g = out(dtable, nb * H, true);
  k_.position_bias_backward(g, static_cast<const float*>(dbias.data),
                            static_cast<const int32_t*>(buckets.data), nb, H, Tq, Tk);
}

namespace {
// T5's attention as an attention problem: separate q [B,Tq,H*D], k, v [B,Tk,H*D].
cpu::AttentionProblem mha_problem(const TensorView& bias, const TensorView& key_mask, int64_t B,
                                  int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                                  bool causal) {
  cpu::AttentionProblem p;
  p.B = B;
  p.Tq = Tq;
  p.Tk = Tk;
  p.H = H;
  p.D = D;
  p.ldq = p.ldk = p.ldv = p.ldo = H * D;
  p.scale = scale;
  p.causal = causal;
  p.bias = static_cast<const float*>(bias.data);
  p.key_mask = static_cast<const int32_t*>(key_mask.data);
  return p;
}
}  // namespace

void CpuBackend::mha_forward(const TensorView& out_, const TensorView& lse, const TensorView& q,
                             const TensorView& k, const TensorView& v, const TensorView& bias,
                             const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                             int64_t H, int64_t D, float scale, bool causal) {
  // q: [B,Tq,H*D]; k, v: [B,Tk,H*D]; bias: [H,P] fp32 by relative position (P =
  // relative_positions(Tq, Tk)) or none; key_mask: [B,Tk] int32 or none; out: [B,Tq,H*D];
  // lse: [B,H,Tq] fp32.
  Chk::mha_forward(out_, lse, q, k, v, bias, key_mask, B, Tq, Tk, H, D);
  const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
  const F32In fq = in(q, nq), fk = in(k, nk), fv = in(v, nk);
  const F32Out o = out(out_, nq, false);
  k_.attention_forward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal), fq, fk, fv, o,
                       static_cast<float*>(lse.data));
}

void CpuBackend::mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dbias, const TensorView& dout,
                              const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out_, const TensorView& lse,
                              const TensorView& bias, const TensorView& key_mask, int64_t B,
                              int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                              bool causal) {
  // dq: [B,Tq,H*D], dk, dv: [B,Tk,H*D] written; dbias: [H,P] fp32 += or none; dout, out:
  // [B,Tq,H*D]; q, k, v, lse, bias, key_mask as in forward.
  Chk::mha_backward(dq, dk, dv, dbias, dout, q, k, v, out_, lse, bias, key_mask, B, Tq, Tk, H, D);
  const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
  const F32In d = in(dout, nq), fq = in(q, nq), fk = in(k, nk), fv = in(v, nk), o = in(out_, nq);
  const F32Out gq = out(dq, nq, false), gk = out(dk, nk, false), gv = out(dv, nk, false);
  k_.attention_backward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal), fq, fk, fv, o,
                        static_cast<const float*>(lse.data), d, gq, gk, gv,
                        static_cast<float*>(dbias.data));
}

// ---------------------------------------------------------------------------------------
// Llama pieces

void CpuBackend::rope_forward(const TensorView& out_, const TensorView& x, const TensorView& cos,
                              const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                              int64_t R) {
  // x, out: [B,T,H*D] (out may alias x); cos, sin: fp32 [>= T, R/2].
  Chk::rope_forward(out_, x, cos, sin, B, T, H, D, R);
  const int64_t n = B * T * H * D;
  const F32In fx = in(x, n);  // before the output it may alias
  const F32Out o = out(out_, n, false);
  k_.rope(o, fx, static_cast<const float*>(cos.data), static_cast<const float*>(sin.data), B, T,
          H, D, R, false);
}

void CpuBackend::rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                               const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                               int64_t R) {
  // dout, dx: [B,T,H*D] (dx written, may alias dout); cos, sin: fp32 [>= T, R/2].
  Chk::rope_backward(dx, dout, cos, sin, B, T, H, D, R);
  const int64_t n = B * T * H * D;
  const F32In d = in(dout, n);
  const F32Out g = out(dx, n, false);
  k_.rope(g, d, static_cast<const float*>(cos.data), static_cast<const float*>(sin.data), B, T, H,
          D, R, true);
}

void CpuBackend::geglu_forward(const TensorView& out_, const TensorView& gate,
                               const TensorView& up) {
  // out[n] = round_gate(gelu(gate[n])) up[n], n = out.numel() (out may alias gate or up)
  const int64_t n = out_.numel();
  Chk::geglu_forward(out_, gate, up);
  const F32In g = in(gate, n), u = in(up, n);
  const F32Out o = out(out_, n, false);
  k_.geglu_forward(o, g, u, n, gate.dtype);
}

void CpuBackend::geglu_backward(const TensorView& dgate, const TensorView& dup,
                                const TensorView& dout, const TensorView& gate,
                                const TensorView& up) {
  // dup = dout round_gate(gelu(gate)), dgate = gelu'(gate) round_dgate(dout up),
  // n = dgate.numel() (dgate may alias dout)
  const int64_t n = dgate.numel();
  Chk::geglu_backward(dgate, dup, dout, gate, up);
  const F32In d = in(dout, n), g = in(gate, n), u = in(up, n);
  const F32Out gg = out(dgate, n, false), gu = out(dup, n, false);
  k_.geglu_backward(gg, gu, d, g, u, n, gate.dtype, dgate.dtype);
}

void CpuBackend::swiglu_forward(const TensorView& out_, const TensorView& gate,
                                const TensorView& up) {
  // out[n] = silu(gate[n]) up[n], n = out.numel() (out may alias gate or up)
  const int64_t n = out_.numel();
  Chk::swiglu_forward(out_, gate, up);
  const F32In g = in(gate, n), u = in(up, n);
  const F32Out o = out(out_, n, false);
  k_.swiglu_forward(o, g, u, n);
}

void CpuBackend::swiglu_backward(const TensorView& dgate, const TensorView& dup,
                                 const TensorView& dout, const TensorView& gate,
                                 const TensorView& up) {
  // dgate = dout up silu'(gate), dup = dout silu(gate), n = dgate.numel() (dgate may alias
  // gate or dout, dup may alias up)
  const int64_t n = dgate.numel();
  Chk::swiglu_backward(dgate, dup, dout, gate, up);
  const F32In d = in(dout, n), g = in(gate, n), u = in(up, n);
  const F32Out gg = out(dgate, n, false), gu = out(dup, n, false);
  k_.swiglu_backward(gg, gu, d, g, u, n);
}

void CpuBackend::sigmoid_gate_forward(const TensorView& out_, const TensorView& x,
                                      const TensorView& gate) {
  // out[n] = x[n] sigmoid(gate[n]), n = out.numel() (out may alias x)
  const int64_t n = out_.numel();
  Chk::sigmoid_gate_forward(out_, x, gate);
  const F32In xi = in(x, n), g = in(gate, n);
  const F32Out o = out(out_, n, false);
  k_.sigmoid_gate_forward(o, xi, g, n);
}

void CpuBackend::sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate,
                                       const TensorView& dout, const TensorView& x,
                                       const TensorView& gate) {
  // dx = dout s, dgate = dout x s (1 - s), s = sigmoid(gate), n = dout.numel() (dx may be
  // dout, dgate may be gate: F32In copies a 16-bit input before the outputs are written)
  const int64_t n = dout.numel();
  Chk::sigmoid_gate_backward(dx, dgate, dout, x, gate);
  const F32In d = in(dout, n), xi = in(x, n), g = in(gate, n);
  const F32Out ox = out(dx, n, false), og = out(dgate, n, false);
  k_.sigmoid_gate_backward(ox, og, d, xi, g, n);
}

void CpuBackend::clamped_swiglu_forward(const TensorView& out_, const TensorView& gate_up,
                                        float alpha, float limit) {
  const int64_t n = out_.numel();
  Chk::clamped_swiglu_forward(out_, gate_up, alpha, limit);
  const F32In gu = in(gate_up, 2 * n);
  const F32Out o = out(out_, n, false);
  k_.clamped_swiglu_forward(o, gu, n, alpha, limit);
}

void CpuBackend::clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                                         const TensorView& gate_up, float alpha, float limit) {
  // (dgate_up may be gate_up: F32In copies a 16-bit gate_up before the output is written)
  const int64_t n = dout.numel();
  Chk::clamped_swiglu_backward(dgate_up, dout, gate_up, alpha, limit);
  const F32In d = in(dout, n), gu = in(gate_up, 2 * n);
  const F32Out g = out(dgate_up, 2 * n, false);
  k_.clamped_swiglu_backward(g, d, gu, n, alpha, limit);
}

void CpuBackend::attention_sink_forward(const TensorView& out_, const TensorView& lse,
                                        const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                                        int64_t D) {
  Chk::attention_sink_forward(out_, lse, sinks, B, T, H, D);
  const F32In s = in(sinks, H);
  const F32Out o = out(out_, B * T * H * D, /*load=*/true);  // scaled in place
  k_.attention_sink_forward(o, static_cast<float*>(lse.data), s, B, T, H, D);
}

void CpuBackend::attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                                         const TensorView& out_, const TensorView& lse,
                                         const TensorView& sinks, int64_t B, int64_t T,
                                         int64_t H, int64_t D) {
  Chk::attention_sink_backward(dsinks, dout, out_, lse, sinks, B, T, H, D);
  const int64_t n = B * T * H * D;
  const F32In d = in(dout, n), o = in(out_, n), s = in(sinks, H);
  const F32Out g = out(dsinks, H, /*load=*/true);  // accumulated
  k_.attention_sink_backward(g, d, o, static_cast<const float*>(lse.data), s, B, T, H, D);
}

void CpuBackend::causal_conv1d_forward(const TensorView& out_, const TensorView& x,
                                       const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                       int64_t K, const TensorView& doc_start) {
  Chk::causal_conv1d_forward(out_, x, weight, B, T, C, K, doc_start);
  const F32In xi = in(x, B * T * C), w = in(weight, C * K);
  const F32Out o = out(out_, B * T * C, false);
  k_.causal_conv1d_forward(o, xi, w, B, T, C, K, static_cast<const int32_t*>(doc_start.data));
}

void CpuBackend::causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                                        const TensorView& dout, const TensorView& x,
                                        const TensorView& weight, int64_t B, int64_t T, int64_t C,
                                        int64_t K, const TensorView& doc_start) {
  Chk::causal_conv1d_backward(dx, dweight, dout, x, weight, B, T, C, K, doc_start);
  const F32In d = in(dout, B * T * C), xi = in(x, B * T * C), w = in(weight, C * K);
  const F32Out g = out(dx, B * T * C, false), gw = out(dweight, C * K, /*load=*/true);
  k_.causal_conv1d_backward(g, gw, d, xi, w, B, T, C, K,
                            static_cast<const int32_t*>(doc_start.data));
}

void CpuBackend::gated_delta_rule_forward(const TensorView& out_, const TensorView& qkv,
                                          const TensorView& a, const TensorView& b,
                                          const TensorView& A_log, const TensorView& dt_bias,
                                          int64_t B, int64_t T, int64_t Hk, int64_t Hv,
                                          int64_t Dk, int64_t Dv, const TensorView& doc_start) {
  Chk::gated_delta_rule_forward(out_, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv,
                                doc_start);
  const F32In x = in(qkv, B * T * (2 * Hk * Dk + Hv * Dv)), ai = in(a, B * T * Hv),
              bi = in(b, B * T * Hv), al = in(A_log, Hv), dt = in(dt_bias, Hv);
  const F32Out o = out(out_, B * T * Hv * Dv, false);
  k_.gated_delta_rule_forward(o, x, ai, bi, al, dt, B, T, Hk, Hv, Dk, Dv,
                              static_cast<const int32_t*>(doc_start.data));
}

void CpuBackend::gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                           const TensorView& db, const TensorView& dA_log,
                                           const TensorView& ddt_bias, const TensorView& dout,
                                           const TensorView& qkv, const TensorView& a,
                                           const TensorView& b, const TensorView& A_log,
                                           const TensorView& dt_bias, int64_t B, int64_t T,
                                           int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                           const TensorView& doc_start) {
  Chk::gated_delta_rule_backward(dqkv, da, db, dA_log, ddt_bias, dout, qkv, a, b, A_log, dt_bias,
                                 B, T, Hk, Hv, Dk, Dv, doc_start);
  const int64_t W = 2 * Hk * Dk + Hv * Dv;
  const F32In d = in(dout, B * T * Hv * Dv), x = in(qkv, B * T * W), ai = in(a, B * T * Hv),
              bi = in(b, B * T * Hv), al = in(A_log, Hv), dt = in(dt_bias, Hv);
  const F32Out gx = out(dqkv, B * T * W, false), ga = out(da, B * T * Hv, false),
               gb = out(db, B * T * Hv, false), gal = out(dA_log, Hv, /*load=*/true),
               gdt = out(ddt_bias, Hv, /*load=*/true);
  k_.gated_delta_rule_backward(gx, ga, gb, gal, gdt, d, x, ai, bi, al, dt, B, T, Hk, Hv, Dk, Dv,
                               static_cast<const int32_t*>(doc_start.data));
}

namespace {
// Llama's attention as an attention problem: q [B,T,H*D], k, v [B,T,Hkv*D], causal, within
// `window` positions when window > 0, within each document under doc_start (or null).
cpu::AttentionProblem gqa_problem(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                                  float scale, int64_t window, float softcap,
                                  const TensorView& doc_start) {
  cpu::AttentionProblem p;
  p.B = B;
  p.Tq = p.Tk = T;
  p.H = H;
  p.Hkv = Hkv;
  p.D = D;
  p.ldq = p.ldo = H * D;
  p.ldk = p.ldv = Hkv * D;
  p.scale = scale;
  p.causal = true;
  p.window = window;
  p.softcap = softcap;
  p.doc_start = doc_start ? static_cast<const int32_t*>(doc_start.data) : nullptr;
  return p;
}
}  // namespace

void CpuBackend::gqa_attention_forward(const TensorView& out_, const TensorView& lse,
                                       const TensorView& q, const TensorView& k,
                                       const TensorView& v, int64_t B, int64_t T, int64_t H,
                                       int64_t Hkv, int64_t D, float scale, int64_t window,
                                       float softcap, const TensorView& doc_start) {
  // q, out: [B,T,H*D]; k, v: [B,T,Hkv*D]; lse: [B,H,T] fp32; doc_start: int32 [B,T] or null.
  Chk::gqa_attention_forward(out_, lse, q, k, v, B, T, H, Hkv, D, window, softcap, doc_start);
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
  const F32In fq = in(q, nq), fk = in(k, nk), fv = in(v, nk);
  const F32Out o = out(out_, nq, false);
  k_.attention_forward(gqa_problem(B, T, H, Hkv, D, scale, window, softcap, doc_start), fq, fk,
                       fv, o,
                       static_cast<float*>(lse.data));
}

void CpuBackend::gqa_attention_backward(const TensorView& dq, const TensorView& dk,
                                        const TensorView& dv, const TensorView& dout,
                                        const TensorView& q, const TensorView& k,
                                        const TensorView& v, const TensorView& out_,
                                        const TensorView& lse, int64_t B, int64_t T, int64_t H,
                                        int64_t Hkv, int64_t D, float scale, int64_t window,
                                        float softcap, const TensorView& doc_start) {
  // dq: [B,T,H*D], dk, dv: [B,T,Hkv*D] written; dout, out: [B,T,H*D]; q, k, v, lse,
  // doc_start as in forward.
  Chk::gqa_attention_backward(dq, dk, dv, dout, q, k, v, out_, lse, B, T, H, Hkv, D, window,
                              softcap, doc_start);
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
  const F32In d = in(dout, nq), fq = in(q, nq), fk = in(k, nk), fv = in(v, nk), o = in(out_, nq);
  const F32Out gq = out(dq, nq, false), gk = out(dk, nk, false), gv = out(dv, nk, false);
  k_.attention_backward(gqa_problem(B, T, H, Hkv, D, scale, window, softcap, doc_start), fq, fk,
                        fv, o,
                        static_cast<const float*>(lse.data), d, gq, gk, gv, nullptr);
}

// ---------------------------------------------------------------------------------------
// mixture of experts

void CpuBackend::moe_router_forward(const TensorView& idx, const TensorView& weights,
                                    const TensorView& logits, int64_t R, int64_t E, int64_t K,
                                    bool normalize) {
  // logits: [R,E]; writes idx: [R,K] int32, weights: [R,K] fp32.
  Chk::moe_router_forward(idx, weights, logits, R, E, K);
  const F32In x = in(logits, R * E);
  k_.moe_router_forward(static_cast<int32_t*>(idx.data), static_cast<float*>(weights.data), x, R,
                        E, K, normalize);
}

void CpuBackend::moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                     const TensorView& logits, const TensorView& idx, int64_t R,
                                     int64_t E, int64_t K, bool normalize) {
  // dlogits: [R,E] written; dweights: [R,K] fp32; logits: [R,E]; idx: [R,K] int32 in [0,E).
  Chk::moe_router_backward(dlogits, dweights, logits, idx, R, E, K);
  check_tokens("moe_router_backward", idx, R * K, E, "idx", "logits");
  const F32In x = in(logits, R * E);
  const F32Out g = out(dlogits, R * E, false);
  k_.moe_router_backward(g, static_cast<const float*>(dweights.data), x,
                         static_cast<const int32_t*>(idx.data), R, E, K, normalize);
}

void CpuBackend::strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                              const Strided& src_at, int64_t R, int64_t G, int64_t W,
                              bool accumulate) {
  Chk::strided_copy(dst, dst_at, src, src_at, R, G, W);
  if (R == 0 || G == 0 || W == 0) return;
  const F32In x = in(src, src_at.extent(R, G, W));
  const F32Out o = out(dst, dst_at.extent(R, G, W), /*load=*/true);  // the others kept
  const int64_t d[4] = {dst_at.row, dst_at.offset, dst_at.group, dst_at.col};
  const int64_t s[4] = {src_at.row, src_at.offset, src_at.group, src_at.col};
  k_.strided_copy(o, d, x, s, R, G, W, accumulate);
}

void CpuBackend::moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                            const TensorView& logits, const TensorView& bias,
                                            int64_t R, int64_t E, int64_t K,
                                            const SigmoidRouting& g) {
  // logits: [R,E]; bias: [E]; writes idx: [R,K] int32, weights: [R,K] fp32.
  Chk::moe_sigmoid_router_forward(idx, weights, logits, bias, R, E, K, g);
  const F32In x = in(logits, R * E);
  const F32In b = in(bias, E);
  k_.moe_sigmoid_router_forward(static_cast<int32_t*>(idx.data),
                                static_cast<float*>(weights.data), x, b, R, E, K, g.n_group,
                                g.topk_group, g.normalize, g.scale);
}

void CpuBackend::moe_sigmoid_router_backward(const TensorView& dlogits,
                                             const TensorView& dweights, const TensorView& logits,
                                             const TensorView& idx, int64_t R, int64_t E,
                                             int64_t K, const SigmoidRouting& g) {
  // dlogits: [R,E] written; dweights: [R,K] fp32; logits: [R,E]; idx: [R,K] int32 in [0,E).
  Chk::moe_sigmoid_router_backward(dlogits, dweights, logits, idx, R, E, K, g);
  check_tokens("moe_sigmoid_router_backward", idx, R * K, E, "idx", "logits");
  const F32In x = in(logits, R * E);
  const F32Out o = out(dlogits, R * E, false);
  k_.moe_sigmoid_router_backward(o, static_cast<const float*>(dweights.data), x,
                                 static_cast<const int32_t*>(idx.data), R, E, K, g.normalize,
                                 g.scale);
}

void CpuBackend::moe_combine_forward(const TensorView& out_, const TensorView& rows,
                                     const TensorView& weights, const TensorView& slot, int64_t R,
                                     int64_t K, int64_t C) {
  // out: [R,C] written; rows: [N,C]; weights: [R,K] fp32 or none (1); slot: [R*K] in [0,N).
  const int64_t N = Chk::moe_combine_forward(out_, rows, weights, slot, R, K, C);
  check_tokens("moe_combine_forward", slot, R * K, N, "slot", "rows");
  const F32In x = in(rows, N * C);
  const F32Out o = out(out_, R * C, false);
  k_.moe_combine_forward(o, x, weights ? static_cast<const float*>(weights.data) : nullptr,
                         static_cast<const int32_t*>(slot.data), R, K, C);
}

void CpuBackend::moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                                      const TensorView& dout, const TensorView& rows,
                                      const TensorView& weights, const TensorView& slot,
                                      int64_t R, int64_t K, int64_t C) {
  // drows: [N,C], the rows slot names written; dweights: [R,K] fp32 written; dout: [R,C].
  const int64_t N = Chk::moe_combine_backward(drows, dweights, dout, rows, weights, slot, R, K, C);
  check_tokens("moe_combine_backward", slot, R * K, N, "slot", "rows");
  const F32In d = in(dout, R * C), x = in(rows, N * C);
  const F32Out g = out(drows, N * C, true);
  k_.moe_combine_backward(g, static_cast<float*>(dweights.data), d, x,
                          static_cast<const float*>(weights.data),
                          static_cast<const int32_t*>(slot.data), R, K, C);
}

void CpuBackend::moe_router_prob_sums(const TensorView& psum, const TensorView& logits,
                                      int64_t R, int64_t E) {
  // psum: [E] fp32 +=; logits: [R,E].
  Chk::moe_router_prob_sums(psum, logits, R, E);
  const F32In x = in(logits, R * E);
  k_.moe_router_prob_sums(static_cast<float*>(psum.data), x, R, E);
}

void CpuBackend::moe_aux_loss(const TensorView& loss, const TensorView& counts,
                              const TensorView& psum, int64_t E, double alpha) {
  // loss: fp64 [1] += alpha sum_e counts[e] psum[e]; counts, psum: [E] fp32.
  double& l = *Chk::moe_aux_loss(loss, counts, psum, E);
  const auto* c = static_cast<const float*>(counts.data);
  const auto* p = static_cast<const float*>(psum.data);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) sum += static_cast<double>(c[e]) * p[e];
  l += alpha * sum;
}

void CpuBackend::moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                                       const TensorView& dprobs, int64_t R, int64_t E) {
  // dlogits: [R,E] +=; logits: [R,E]; dprobs: [E] fp32.
  Chk::moe_aux_loss_backward(dlogits, logits, dprobs, R, E);
  const F32In x = in(logits, R * E);
  const F32Out g = out(dlogits, R * E, true);
  k_.moe_aux_loss_backward(g, x, static_cast<const float*>(dprobs.data), R, E);
}

void CpuBackend::moe_shared_gate_forward(const TensorView& out_, const TensorView& shared,
                                         const TensorView& logit, int64_t R, int64_t C) {
  // out: [R,C] +=; shared: [R,C]; logit: [R].
  Chk::moe_shared_gate_forward(out_, shared, logit, R, C);
  const F32In x = in(shared, R * C), g = in(logit, R);
  const F32Out o = out(out_, R * C, true);
  k_.moe_shared_gate_forward(o, x, g, R, C);
}

void CpuBackend::moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                          const TensorView& dout, const TensorView& shared,
                                          const TensorView& logit, int64_t R, int64_t C) {
  // dshared: [R,C] written; dlogit: [R] written; dout, shared: [R,C]; logit: [R].
  Chk::moe_shared_gate_backward(dshared, dlogit, dout, shared, logit, R, C);
  const F32In d = in(dout, R * C), x = in(shared, R * C), g = in(logit, R);
  const F32Out gs = out(dshared, R * C, false), gl = out(dlogit, R, false);
  k_.moe_shared_gate_backward(gs, gl, d, x, g, R, C);
}

// ---------------------------------------------------------------------------------------
// optimizers (fp32 shards only: no conversions)

// An optional fp32 [1] host scalar's value; 1 (the gradient as it is) when there is none.
float scalar_or_one(const TensorView& s) {
  return s ? *static_cast<const float*>(s.data) : 1.0f;
}

void CpuBackend::adamw_update(const TensorView& param, const TensorView& grad,
                              const TensorView& exp_avg, const TensorView& exp_avg_sq, float lr,
                              float beta1, float beta2, float eps, const WeightDecay& weight_decay,
                              int64_t step, const TensorView& compute_copy,
                              const TensorView& grad_scale) {
  // param, grad, exp_avg, exp_avg_sq: [n] fp32, n = param.numel(); compute_copy: none or
  // [n] bf16/fp16, written in the same pass; grad_scale: none or fp32 [1] (host memory).
  Chk::adamw_update(param, grad, exp_avg, exp_avg_sq, weight_decay, compute_copy, grad_scale);
  const int64_t n = param.numel();
  k_.adamw_update(static_cast<float*>(param.data), static_cast<const float*>(grad.data),
                  static_cast<float*>(exp_avg.data), static_cast<float*>(exp_avg_sq.data), n, lr,
                  beta1, beta2, eps, weight_decay, step, compute_copy.data, compute_copy.dtype,
                  scalar_or_one(grad_scale));
}

void CpuBackend::sgd_update(const TensorView& param, const TensorView& grad,
                            const TensorView& momentum_buf, float lr, float momentum,
                            const WeightDecay& weight_decay, int64_t step,
                            const TensorView& compute_copy, const TensorView& grad_scale) {
  // param, grad, momentum_buf: [n] fp32, n = param.numel(); momentum_buf unused (may be
  // empty) when momentum == 0; compute_copy: none or [n] bf16/fp16, written in the same pass;
  // grad_scale: none or fp32 [1] (host memory).
  Chk::sgd_update(param, grad, momentum_buf, momentum, weight_decay, compute_copy, grad_scale);
  const int64_t n = param.numel();
  k_.sgd_update(static_cast<float*>(param.data), static_cast<const float*>(grad.data),
                static_cast<float*>(momentum_buf.data), n, lr, momentum, weight_decay, step,
                compute_copy.data, compute_copy.dtype, scalar_or_one(grad_scale));
}

}  // namespace

HostAllocator aligned_host_allocator() {
  return {[](std::size_t bytes) { return aligned_bytes(bytes); }, [](void* p) { std::free(p); }};
}

std::unique_ptr<Backend> make_cpu_backend(int num_threads, HostAllocator allocator) {
  if (!allocator.allocate || !allocator.free) allocator = aligned_host_allocator();
  return std::make_unique<CpuBackend>(num_threads, std::move(allocator));
}

}  // namespace fsdp
