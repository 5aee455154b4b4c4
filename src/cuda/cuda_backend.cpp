// src/cuda/cuda_backend.cpp: the CUDA backend (see fsdp/cuda/cuda_backend.hpp), the typed
// Backend interface over the kernels of kernels_*.cu and the GEMMs of kernels_gemm.cpp.
//
// This file is host C++20 (it includes backend.hpp, whose dtype.hpp needs C++20, while nvcc
// compiles the .cu files as C++17): it checks arguments, maps DType to the kernels' storage
// types, owns the stream, the allocator, the cuBLAS handles and the device error word, takes
// per-call scratch from the allocator, and sequences the multi-kernel operations (attention,
// mixed-type GEMMs).
//
// Every kernel checks its arguments before enqueuing anything, with the CPU backend's rules
// and messages ("cuda backend: gemm: C is ..."): float arguments fp32, bf16 or fp16,
// arguments marked fp32 in the interface fp32, device scalars fp64 with at least one element,
// token/target views int32, and each view large enough. Index values live on the device and
// are checked there (see cuda_backend.hpp).
//
// Attention (GPT-2's attention_* over qkv [B,T,3C], T5's mha_* over separate q, k, v) is
// one fused FlashAttention-2 problem (kernels_flash.cu): q, k, v and the output are strided
// head matrices read in place, nothing of size T x T is allocated, and the launches per call
// do not depend on B or H: forward 1 kernel, backward 3 (D_i = rowsum(dO * O), dK/dV, and
// dQ with the bias gradient summed over the batch in order). Llama's grouped-query attention
// (gqa_attention_*) is the same problem with H / Hkv query heads per key/value head: the
// dK/dV blocks own a key/value head and sum its query heads in order. Calls whose float
// arguments mix storage types run on fp32 copies and cast the results (a few more launches).
#include "fsdp/cuda/cuda_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "fsdp/backend/optimizer_math.hpp"
#include "fsdp/backend/arg_checks.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/cuda/check.hpp"
#include "fsdp/cuda/stream.hpp"
#include "kernels.hpp"

namespace fsdp::cuda {
namespace {

namespace k = kernels;
static_assert(k::kIgnoreTarget == kIgnoreIndex, "kernels.hpp's kIgnoreTarget is fsdp::kIgnoreIndex");

// ---------------------------------------------------------------------------------------
// argument checks: fsdp/backend/arg_checks.hpp, with this backend's name

struct BackendName {
  static constexpr const char* name = "cuda backend";
};
using Chk = ArgChecks<BackendName>;

void check_attention_shapes(const char* kernel, int64_t B, int64_t T, int64_t C, int64_t H) {
  if (B < 0 || T < 0 || C <= 0 || H <= 0 || C % H != 0 || 3 * C > INT32_MAX || T > INT32_MAX) {
    throw Error("cuda backend: " + std::string(kernel) + ": bad shape B=" + std::to_string(B) +
                " T=" + std::to_string(T) + " C=" + std::to_string(C) + " H=" + std::to_string(H) +
                " (expected C divisible by H)");
  }
}

// FSDP_GEMM_EPILOGUES: which cuBLASLt epilogues the backend uses, one bit per
// k::Blas::Epilogue. "1" (or empty) every one, "0" none, else a comma-separated list of names
// (bias, gelu_aux_bias, dgelu_bgrad, bgradb, relu): only those, or, when every name has a
// leading '-', all but those (e.g. -dgelu_bgrad). Throws fsdp::Error on another name.
unsigned epilogue_mask(const std::string& spec) {
  static constexpr const char* kNames[] = {"", "bias", "gelu_aux_bias", "dgelu_bgrad",
                                           "bgradb", "relu"};
  if (spec.empty() || spec == "1") return ~0u;
  if (spec == "0") return 0u;
  std::vector<std::string> items;
  for (std::size_t at = 0; at <= spec.size();) {
    const std::size_t comma = std::min(spec.find(',', at), spec.size());
    items.push_back(spec.substr(at, comma - at));
    at = comma + 1;
  }
  const bool except = std::all_of(items.begin(), items.end(),
                                  [](const std::string& i) { return i.rfind('-', 0) == 0; });
  unsigned mask = except ? ~0u : 0u;
  for (std::string item : items) {
    if (except) item.erase(0, 1);
    int bit = 0;
    for (int b = 1; b < static_cast<int>(std::size(kNames)); ++b) {
      if (item == kNames[b]) bit = b;
    }
    if (bit == 0) {
      throw Error("FSDP_GEMM_EPILOGUES=" + spec + ": unknown epilogue '" + item +
                  "' (expected 1, 0, or names of bias, gelu_aux_bias, dgelu_bgrad, bgradb, relu, "
                  "each with a leading - to leave it out)");
    }
    mask = except ? mask & ~(1u << bit) : mask | (1u << bit);
  }
  return mask;
}

// ---------------------------------------------------------------------------------------
// DType -> storage type, typed pointers

k::ST st(DType t) {
  switch (t) {
    case DType::f32:
      return k::ST::f32;
    case DType::bf16:
      return k::ST::bf16;
    case DType::f16:
      return k::ST::f16;
    case DType::f64:
      return k::ST::f64;
    default:
      break;
  }
  throw Error("cuda backend: dtype " + std::string(to_string(t)) + " is not a float type");
}
k::In in(const TensorView& v) { return {v.data, st(v.dtype)}; }
k::Out out(const TensorView& v) { return {v.data, st(v.dtype)}; }

// Element `i` of a view's memory (pointer arithmetic in the view's dtype).
template <class P>
P* at(P* base, DType t, int64_t i) {
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  return reinterpret_cast<Byte*>(base) + i * static_cast<int64_t>(dtype_size(t));
}

void* raw_alloc(std::size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();  // out of memory is not sticky: clear it; the allocator reports
    return nullptr;
  }
  return p;
}
void raw_free(void* p) { cudaFree(p); }

int set_device(int ordinal) {
  FSDP_CHECK_CUDA(cudaSetDevice(ordinal));
  return ordinal;
}

// ---------------------------------------------------------------------------------------

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda; }

  // ---- streams and events ----
  Stream& compute_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override { return std::make_unique<CudaEvent>(); }
  std::unique_ptr<TimedEvent> create_timed_event() override {
    return std::make_unique<CudaEvent>(/*timing=*/true);
  }

  // ---- memory ----
  void* allocate(std::size_t bytes, MemCategory category) override;
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
  void copy_to_host_async(void* host_dst, const TensorView& src, Stream& stream) override;
  void copy_from_host_async(const TensorView& dst, const void* host_src, Stream& stream) override;
  void synchronize() override;

  // ---- graphs (train.cuda_graphs) ----
  std::unique_ptr<KernelGraph> capture_graph(std::function<void()> enqueue) override;

  // ---- dense algebra ----
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const TensorView& A, const TensorView& B, float beta, const TensorView& C) override;
  void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) override;
  void gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                 const TensorView& B, const TensorView& bias, const TensorView& C) override;
  void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      const TensorView& A, const TensorView& B, const TensorView& bias,
                      const TensorView& fc, const TensorView& out) override;
  void gemm_dgelu_bias_grad(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const TensorView& A, const TensorView& B, const TensorView& fc,
                            const TensorView& dfc, const TensorView& dbias) override;
  void gemm_weight_bias_grad(bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                             const TensorView& B, const TensorView& C,
                             const TensorView& dbias) override;
  void gemm_relu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                 const TensorView& B, const TensorView& out) override;
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
  void sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                            const TensorView& gate) override;
  void sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate, const TensorView& dout,
                             const TensorView& x, const TensorView& gate) override;
  void clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up, float alpha,
                              float limit) override;
  void clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                               const TensorView& gate_up, float alpha, float limit) override;
  void gqa_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                             const TensorView& k, const TensorView& v, int64_t B, int64_t T,
                             int64_t H, int64_t Hkv, int64_t D, float scale, int64_t window,
                             float softcap, const TensorView& doc_start) override;
  void gqa_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                              int64_t window, float softcap,
                              const TensorView& doc_start) override;
  void attention_sink_forward(const TensorView& out, const TensorView& lse,
                              const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                              int64_t D) override;
  void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                               int64_t D) override;

  // ---- strided copies ----
  void strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                    const Strided& src_at, int64_t R, int64_t G, int64_t W,
                    bool accumulate) override;

  // ---- mixture of experts ----
  void moe_router_forward(const TensorView& idx, const TensorView& weights,
                          const TensorView& logits, int64_t R, int64_t E, int64_t K,
                          bool normalize) override;
  void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                           const TensorView& logits, const TensorView& idx, int64_t R, int64_t E,
                           int64_t K, bool normalize) override;
  // Forward: E <= 1024 (one warp's shared memory holds a row), else fsdp::Error naming the
  // kernel and E; the backward takes any E.
  void moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                  const TensorView& logits, const TensorView& bias, int64_t R,
                                  int64_t E, int64_t K, const SigmoidRouting& g) override;
  void moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                   const TensorView& logits, const TensorView& idx, int64_t R,
                                   int64_t E, int64_t K, const SigmoidRouting& g) override;
  void moe_combine_forward(const TensorView& out, const TensorView& rows, const TensorView& weights,
                           const TensorView& slot, int64_t R, int64_t K, int64_t C) override;
  void moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                            const TensorView& dout, const TensorView& rows,
                            const TensorView& weights, const TensorView& slot, int64_t R, int64_t K,
                            int64_t C) override;
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
  // Device memory for the duration of one call (kernel scratch), from the caching allocator
  // as MemCategory::other (kernel workspace: the plan's categories, activations included,
  // stay exactly what the model and engine hold). Returned without an event: everything that uses it is enqueued on the
  // compute stream, and the allocator hands memory out for use on that stream.
  // While a graph is being captured, scratch comes from the graph arena instead (below).
  struct ArenaAt {  // a place in the graph arena: chunk index, byte offset in it
    std::size_t chunk = 0, offset = 0;
  };
  class Scratch {
   public:
    Scratch(CudaBackend& be, std::size_t bytes)
        : be_(be), bytes_(bytes), in_graph_(be.capturing_), mark_(be.arena_at_),
          p_(in_graph_ ? be.graph_scratch(bytes) : be.allocate(bytes, MemCategory::other)) {}
    ~Scratch() {
      // In a capture the arena is a stack: a captured stream's kernels run one after the
      // other, so the next call's scratch may take these bytes again.
      if (in_graph_) {
        be_.arena_at_ = mark_;
      } else {
        be_.deallocate(p_, bytes_, MemCategory::other, nullptr);
      }
    }
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    template <class T>
    T* as() const {
      return static_cast<T*>(p_);
    }

   private:
    CudaBackend& be_;
    std::size_t bytes_;
    bool in_graph_;
    ArenaAt mark_;  // the arena's next bytes before this scratch (in a capture)
    void* p_;
  };
  // A device copy of `v` converted to fp32 (scratch), for the mixed-type fallbacks.
  struct F32Copy {
    F32Copy(CudaBackend& be, const TensorView& v, int64_t n, bool load)
        : mem(be, static_cast<std::size_t>(n) * sizeof(float)),
          view(mem.as<float>(), DType::f32, {n}) {
      if (load && n > 0) k::cast({view.data, k::ST::f32}, in(v), n, be.s());
    }
    Scratch mem;
    TensorView view;
  };

  cudaStream_t s() const { return stream_.handle(); }
  // Kernel scratch of a call being captured: the next `bytes` of the graph arena. Every
  // graph runs on stream_, one after another, and its scratch is dead once its call ends, so
  // all graphs share the arena: each capture starts again at its beginning. A graph keeps
  // the addresses it was captured with, so the arena never moves or shrinks: a capture that
  // needs more adds a chunk (cudaMalloc under relaxed capture mode, as PyTorch's private
  // graph pools do). Counted as MemCategory::other; freed with the backend.
  void* graph_scratch(std::size_t bytes);
  // The values of tokens [n] (int32 and size already checked by ArgChecks), on the device,
  // against [0, V) (no upper bound if V < 0).
  void check_tokens(const char* kernel, const TensorView& tokens, int64_t n, int64_t V, int code);
  // Enqueues the copy of the device error word; call before synchronising the stream.
  void fetch_device_error();
  // After the stream is synchronised: throws the recorded index error, if any (and resets it).
  void raise_device_error();
  void cross_entropy(const char* kernel, const TensorView& loss, const TensorView& logits,
                     const TensorView& targets, int64_t R, int64_t V, int64_t ld, float grad_scale,
                     float softcap, bool backward);
  // The fused attention kernels (kernels_flash.cu) on arrays of p.t; backward takes its
  // D_i scratch from the allocator.
  void flash_backward(const k::FlashProblem& p, const void* q, const void* kk, const void* v,
                      const void* out, const float* lse, const void* dout, void* dq, void* dk,
                      void* dv, float* dbias);

  int device_;
  MemoryTracker memory_;  // before alloc_, which reports to it
  CudaStream stream_;
  CachingAllocator alloc_;
  k::Blas blas_;
  // cuBLASLt epilogues in gemm_bias, gemm_bias_gelu, gemm_dgelu_bias_grad,
  // gemm_weight_bias_grad and gemm_relu, one bit per k::Blas::Epilogue; FSDP_GEMM_EPILOGUES
  // in the environment picks them (epilogue_mask: an A/B in one binary).
  unsigned epilogues_ = ~0u;
  bool epilogue(k::Blas::Epilogue e) const { return (epilogues_ >> static_cast<int>(e)) & 1u; }
  k::DeviceError* dev_error_ = nullptr;   // device memory
  k::DeviceError* host_error_ = nullptr;  // pinned host mirror (mapped for kernel reads)
  // FSDP_SMALL_READS=kernel (default "copy"): copy_to_host of at most kSmallRead bytes, and
  // the device error word, are read by k::read_to_mapped (the SMs store into mapped host
  // memory) instead of cudaMemcpyAsync, whose copy engine may serve the reduction stream's
  // bulk gradient copies first (issue 31: the step's norm, clip and loss reads behind the
  // offloaded gradients' device-to-host copies). An A/B in one binary, as FSDP_GEMM_EPILOGUES.
  static constexpr int64_t kSmallRead = 4096;
  bool kernel_reads_ = false;
  struct FreePinned {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<void, FreePinned> small_read_;  // kSmallRead bytes, mapped (kernel reads)
  void* small_read_dev_ = nullptr;                 // its device address
  k::DeviceError* host_error_dev_ = nullptr;       // host_error_'s device address
  bool capturing_ = false;                // inside capture_graph's enqueue
  struct ArenaChunk {
    std::unique_ptr<void, void (*)(void*)> ptr;  // raw_free, after the dtor synchronised stream_
    std::size_t bytes;
  };
  std::vector<ArenaChunk> arena_;         // graph scratch (graph_scratch)
  ArenaAt arena_at_;                      // the current capture's next bytes
};

CudaBackend::CudaBackend(int device)
    : device_(set_device(device)),
      stream_(0),
      alloc_(raw_alloc, raw_free, memory_),
      blas_(stream_.handle()) {
  if (const char* e = std::getenv("FSDP_GEMM_EPILOGUES")) epilogues_ = epilogue_mask(e);
  if (const char* r = std::getenv("FSDP_SMALL_READS")) {
    const std::string v(r);
    if (v != "kernel" && v != "copy") {
      throw Error("FSDP_SMALL_READS=" + v + " (expected kernel or copy)");
    }
    kernel_reads_ = v == "kernel";
  }
  try {
    FSDP_CHECK_CUDA(cudaMalloc(&dev_error_, sizeof(k::DeviceError)));
    void* mirror = nullptr;
    FSDP_CHECK_CUDA(cudaHostAlloc(&mirror, sizeof(k::DeviceError),
                                  kernel_reads_ ? cudaHostAllocMapped : cudaHostAllocDefault));
    host_error_ = static_cast<k::DeviceError*>(mirror);
    *host_error_ = k::DeviceError{};
    if (kernel_reads_) {
      void* p = nullptr;
      FSDP_CHECK_CUDA(cudaHostAlloc(&p, kSmallRead, cudaHostAllocMapped));
      small_read_.reset(p);
      FSDP_CHECK_CUDA(cudaHostGetDevicePointer(&small_read_dev_, p, 0));
      void* e = nullptr;
      FSDP_CHECK_CUDA(cudaHostGetDevicePointer(&e, host_error_, 0));
      host_error_dev_ = static_cast<k::DeviceError*>(e);
    }
    FSDP_CHECK_CUDA(cudaMemsetAsync(dev_error_, 0, sizeof(k::DeviceError), s()));
    FSDP_CHECK_CUDA(cudaStreamSynchronize(s()));
  } catch (...) {
    if (host_error_) cudaFreeHost(host_error_);
    if (dev_error_) cudaFree(dev_error_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(s());  // errors ignored: destructors never throw
  cudaFreeHost(host_error_);
  cudaFree(dev_error_);
}

std::unique_ptr<Stream> CudaBackend::create_stream() {
  int least = 0, greatest = 0;
  FSDP_CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return std::make_unique<CudaStream>(greatest);  // communication streams: highest priority
}

// ---------------------------------------------------------------------------------------
// graphs (train.cuda_graphs; fsdp/model/graphed_kernels.hpp)

namespace {

// One captured segment: a cudaGraphExec_t launched on the backend's compute stream.
class CudaKernelGraph final : public KernelGraph {
 public:
  CudaKernelGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  // A launch still in flight is not stopped: CUDA frees the exec when it completes
  // (cudaGraphExecDestroy), so an eviction does not wait for the stream.
  ~CudaKernelGraph() override { cudaGraphExecDestroy(exec_); }
  CudaKernelGraph(const CudaKernelGraph&) = delete;
  CudaKernelGraph& operator=(const CudaKernelGraph&) = delete;
  void launch() override { FSDP_CHECK_CUDA(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

// cudaThreadExchangeStreamCaptureMode as a scope: this thread's capture mode set to `mode`.
class CaptureModeScope {
 public:
  explicit CaptureModeScope(cudaStreamCaptureMode mode) : mode_(mode) {
    FSDP_CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&mode_));
  }
  ~CaptureModeScope() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;

 private:
  cudaStreamCaptureMode mode_;
};

}  // namespace

void* CudaBackend::graph_scratch(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  bytes = (bytes + 255) / 256 * 256;  // the allocator's alignment
  ArenaAt& at = arena_at_;
  for (; at.chunk < arena_.size(); ++at.chunk, at.offset = 0) {
    const ArenaChunk& c = arena_[at.chunk];
    if (at.offset + bytes <= c.bytes) {
      void* p = static_cast<char*>(c.ptr.get()) + at.offset;
      at.offset += bytes;
      return p;
    }
  }
  const std::size_t chunk = std::max<std::size_t>(bytes, std::size_t{8} << 20);
  void* p = nullptr;
  cudaError_t rc;
  {
    const CaptureModeScope relaxed(cudaStreamCaptureModeRelaxed);
    rc = cudaMalloc(&p, chunk);
  }
  if (rc != cudaSuccess) {
    cudaGetLastError();
    throw Error("train.cuda_graphs: no device memory for " + std::to_string(chunk) +
                " bytes of graph kernel scratch (" + cudaGetErrorString(rc) +
                "); train.cuda_graphs = \"off\" runs without");
  }
  std::unique_ptr<void, void (*)(void*)> owned(p, raw_free);
  arena_.push_back({std::move(owned), chunk});
  memory_.on_alloc(MemCategory::other, chunk);
  at = {arena_.size() - 1, bytes};
  return p;
}

std::unique_ptr<KernelGraph> CudaBackend::capture_graph(std::function<void()> enqueue) {
  if (capturing_) throw Error("cuda backend: capture_graph inside a capture");
  // ThreadLocal: only this thread's unsafe calls are refused; the host-step and checkpoint
  // threads go on with their own streams.
  // Every failure below clears the thread's last error before it throws: the caller runs
  // the segment eagerly next (GraphedKernels), and a stale error would fail its first
  // launch check (FSDP_CHECK_LAUNCH reads cudaGetLastError).
  const auto fail = [](const char* what, cudaError_t rc) {
    cudaGetLastError();
    return Error(std::string("cuda backend: capture_graph: ") + what + ": " +
                 cudaGetErrorString(rc));
  };
  cudaError_t rc = cudaStreamBeginCapture(s(), cudaStreamCaptureModeThreadLocal);
  if (rc != cudaSuccess) throw fail("cudaStreamBeginCapture", rc);
  capturing_ = true;
  arena_at_ = {};
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    capturing_ = false;
    if (cudaStreamEndCapture(s(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  capturing_ = false;
  rc = cudaStreamEndCapture(s(), &graph);
  if (rc != cudaSuccess) {
    if (graph) cudaGraphDestroy(graph);
    throw fail("cudaStreamEndCapture", rc);
  }
  cudaGraphExec_t exec = nullptr;
  rc = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (rc != cudaSuccess) throw fail("cudaGraphInstantiate", rc);
  return std::make_unique<CudaKernelGraph>(exec, s());
}

// ---------------------------------------------------------------------------------------
// memory, copies, casts, device errors

void* CudaBackend::allocate(std::size_t bytes, MemCategory category) {
  if (bytes > std::numeric_limits<std::size_t>::max() - 1024) {
    throw Error("cuda backend: allocation of " + std::to_string(bytes) + " bytes for " +
                std::string(to_string(category)) + " overflows");
  }
  return alloc_.allocate(bytes, category, stream_);
}

void CudaBackend::fill_zero(const TensorView& dst) {
  Chk::fill_zero(dst);
  if (dst.bytes()) FSDP_CHECK_CUDA(cudaMemsetAsync(dst.data, 0, dst.bytes(), s()));
}

void CudaBackend::copy(const TensorView& dst, const TensorView& src) {
  Chk::copy(dst, src);
  if (dst.bytes() && dst.data != src.data) {
    FSDP_CHECK_CUDA(
        cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, s()));
  }
}

void CudaBackend::cast(const TensorView& dst, const TensorView& src) {
  Chk::cast(dst, src);
  k::cast(out(dst), in(src), dst.numel(), s());
}

void CudaBackend::copy_to_host(void* host_dst, const TensorView& src) {
  Chk::copy_to_host(src);
  const auto bytes = static_cast<int64_t>(src.bytes());
  if (kernel_reads_ && bytes <= kSmallRead) {  // the value and the error word in one kernel
    k::read_to_mapped(small_read_dev_, src.data, bytes, host_error_dev_, dev_error_, s());
    FSDP_CHECK_CUDA(cudaStreamSynchronize(s()));
    if (bytes > 0) std::memcpy(host_dst, small_read_.get(), static_cast<std::size_t>(bytes));
    raise_device_error();
    return;
  }
  if (src.bytes()) {
    FSDP_CHECK_CUDA(cudaMemcpyAsync(host_dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, s()));
  }
  fetch_device_error();
  FSDP_CHECK_CUDA(cudaStreamSynchronize(s()));
  raise_device_error();
}

void CudaBackend::copy_from_host(const TensorView& dst, const void* host_src) {
  Chk::copy_from_host(dst);
  if (!dst.bytes()) return;
  FSDP_CHECK_CUDA(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, s()));
  FSDP_CHECK_CUDA(cudaStreamSynchronize(s()));  // blocking: host_src may be reused at once
}

void CudaBackend::copy_to_host_async(void* host_dst, const TensorView& src, Stream& stream) {
  Chk::copy_to_host(src);
  const cudaStream_t cs = native(stream);  // throws for a host stream
  if (src.bytes()) {
    FSDP_CHECK_CUDA(cudaMemcpyAsync(host_dst, src.data, src.bytes(), cudaMemcpyDeviceToHost, cs));
  }
}

void CudaBackend::copy_from_host_async(const TensorView& dst, const void* host_src,
                                       Stream& stream) {
  Chk::copy_from_host(dst);
  const cudaStream_t cs = native(stream);  // throws for a host stream
  if (dst.bytes()) {
    FSDP_CHECK_CUDA(cudaMemcpyAsync(dst.data, host_src, dst.bytes(), cudaMemcpyHostToDevice, cs));
  }
}

void CudaBackend::synchronize() {
  fetch_device_error();
  stream_.synchronize();
  raise_device_error();
}

void CudaBackend::fetch_device_error() {
  if (kernel_reads_) {
    k::read_to_mapped(nullptr, nullptr, 0, host_error_dev_, dev_error_, s());
    return;
  }
  FSDP_CHECK_CUDA(cudaMemcpyAsync(host_error_, dev_error_, sizeof(k::DeviceError),
                                  cudaMemcpyDeviceToHost, s()));
}

void CudaBackend::raise_device_error() {
  const k::DeviceError e = *host_error_;
  if (e.code == k::kErrNone) return;
  *host_error_ = k::DeviceError{};
  FSDP_CHECK_CUDA(cudaMemsetAsync(dev_error_, 0, sizeof(k::DeviceError), s()));
  FSDP_CHECK_CUDA(cudaStreamSynchronize(s()));
  const std::string pos = std::to_string(e.position), val = std::to_string(e.value),
                    bound = std::to_string(e.bound);
  switch (e.code) {
    case k::kErrEmbeddingForward:
    case k::kErrEmbeddingBackward:
      throw Error(std::string("cuda backend: ") +
                  (e.code == k::kErrEmbeddingForward ? "embedding_forward" : "embedding_backward") +
                  ": tokens holds " + val + " at position " + pos + " (expected 0 <= token < " +
                  bound + ", the rows of wte)");
    case k::kErrCrossEntropy:
      throw Error("cuda backend: cross_entropy: target " + val + " at row " + pos +
                  " (expected 0 <= target < " + bound + ", or " +
                  std::to_string(k::kIgnoreTarget) + " to skip the row)");
    case k::kErrEmbeddingLookupForward:
    case k::kErrEmbeddingLookupBackward:
      throw Error(std::string("cuda backend: ") +
                  (e.code == k::kErrEmbeddingLookupForward ? "embedding_lookup_forward"
                                                           : "embedding_lookup_backward") +
                  ": tokens holds " + val + " at position " + pos + " (expected 0 <= token < " +
                  bound + ", the rows of the table)");
    case k::kErrPositionBiasForward:
    case k::kErrPositionBiasBackward:
      throw Error(std::string("cuda backend: ") +
                  (e.code == k::kErrPositionBiasForward ? "position_bias_forward"
                                                        : "position_bias_backward") +
                  ": buckets holds " + val + " at position " + pos + " (expected 0 <= bucket < " +
                  bound + ", the rows of the table)");
    default:
      throw Error("cuda backend: unknown device error code " + std::to_string(e.code));
  }
}

// ---------------------------------------------------------------------------------------
// dense algebra

void CudaBackend::gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const TensorView& A, const TensorView& B, float beta, const TensorView& C) {
  // A: [M,K] ([K,M] if trans_a), B: [K,N] ([N,K] if trans_b), C: [M,N].
  Chk::gemm(M, N, K, A, B, C);
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta C (BLAS semantics: beta == 0 overwrites, even NaN)
    if (beta == 0.0f) {
      FSDP_CHECK_CUDA(
          cudaMemsetAsync(C.data, 0, static_cast<std::size_t>(M * N) * dtype_size(C.dtype), s()));
    } else {
      k::scale(out(C), beta, M * N, s());
    }
    return;
  }
  const k::ST at = st(A.dtype), bt = st(B.dtype), ct = st(C.dtype);
  if (at == bt && k::Blas::direct(at, ct)) {
    blas_.gemm(trans_a, trans_b, M, N, K, alpha, A.data, B.data, at, beta, C.data, ct);
    return;
  }
  // Types cuBLAS does not take together: A and B of different types run in fp32 (16-bit
  // values are exact in fp32), and a C of another type than the inputs goes through an fp32
  // copy, rounded once at the end, as the CPU backend does.
  std::unique_ptr<F32Copy> a32, b32, c32;
  const void* pa = A.data;
  const void* pb = B.data;
  k::ST ab = at;
  if (at != bt) {
    if (at != k::ST::f32) a32 = std::make_unique<F32Copy>(*this, A, M * K, true);
    if (bt != k::ST::f32) b32 = std::make_unique<F32Copy>(*this, B, K * N, true);
    if (a32) pa = a32->view.data;
    if (b32) pb = b32->view.data;
    ab = k::ST::f32;
  }
  if (k::Blas::direct(ab, ct)) {
    blas_.gemm(trans_a, trans_b, M, N, K, alpha, pa, pb, ab, beta, C.data, ct);
    return;
  }
  c32 = std::make_unique<F32Copy>(*this, C, M * N, beta != 0.0f);
  blas_.gemm(trans_a, trans_b, M, N, K, alpha, pa, pb, ab, beta, c32->view.data, k::ST::f32);
  k::cast(out(C), {c32->view.data, k::ST::f32}, M * N, s());
}

void CudaBackend::gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const TensorView& A, const TensorView& B, const TensorView& bias,
                            const TensorView& C) {
  // C [M,N] = op(A) op(B) + bias [N]: one cuBLASLt call with the BIAS epilogue when it takes
  // it (one dtype, aligned bias), else gemm + add_bias.
  Chk::gemm(M, N, K, A, B, C);
  Chk::need_float("gemm_bias", "bias", bias, N);
  const DType t = C.dtype;
  if (epilogue(k::Blas::Epilogue::bias) && M > 0 && N > 0 && K > 0 && A.dtype == t &&
      B.dtype == t && bias.dtype == t && t != DType::f64 && k::aligned16(bias.data) &&
      blas_.gemm_epilogue(trans_a, trans_b, M, N, K, A.data, B.data, st(t), 0.0f, C.data,
                          k::Blas::Epilogue::bias, bias.data, nullptr)) {
    return;
  }
  Backend::gemm_bias(trans_a, trans_b, M, N, K, A, B, bias, C);
}

void CudaBackend::gemm_bias_gelu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                                 const TensorView& A, const TensorView& B,
                                 const TensorView& bias, const TensorView& fc,
                                 const TensorView& out_) {
  // fc [M,N] = op(A) op(B) + bias [N], out = GELU(fc): one cuBLASLt call with the
  // GELU_AUX_BIAS epilogue (D = out, aux = fc) when it takes it, else gemm +
  // bias_gelu_forward. 16-bit types only: the epilogue's tanh is an approximation (CUTLASS's
  // fast tanh, ~2^-11 relative) whose error an fp32 output would show, not a 16-bit one.
  Chk::gemm(M, N, K, A, B, fc);
  Chk::need_float("gemm_bias_gelu", "bias", bias, N);
  Chk::need_float("gemm_bias_gelu", "out", out_, M * N);
  const DType t = fc.dtype;
  if (epilogue(k::Blas::Epilogue::gelu_aux_bias) && M > 0 && N > 0 && K > 0 && N % 8 == 0 &&
      A.dtype == t && B.dtype == t && bias.dtype == t && out_.dtype == t &&
      (t == DType::bf16 || t == DType::f16) && k::aligned16(bias.data) && k::aligned16(fc.data) &&
      k::aligned16(out_.data) && out_.data != fc.data &&
      blas_.gemm_epilogue(trans_a, trans_b, M, N, K, A.data, B.data, st(t), 0.0f, out_.data,
                          k::Blas::Epilogue::gelu_aux_bias, bias.data, fc.data)) {
    return;
  }
  Backend::gemm_bias_gelu(trans_a, trans_b, M, N, K, A, B, bias, fc, out_);
}

void CudaBackend::gemm_dgelu_bias_grad(bool trans_a, bool trans_b, int64_t M, int64_t N,
                                       int64_t K, const TensorView& A, const TensorView& B,
                                       const TensorView& fc, const TensorView& dfc,
                                       const TensorView& dbias) {
  // dfc [M,N] = (op(A) op(B)) gelu'(fc); dbias [N] += colsum(dfc): DGELU_BGRAD writes the
  // column sums (dfc's dtype) into scratch, added to dbias after. 16-bit types only, as
  // gemm_bias_gelu.
  Chk::gemm(M, N, K, A, B, dfc);
  Chk::need_float("gemm_dgelu_bias_grad", "fc", fc, M * N);
  Chk::need_float("gemm_dgelu_bias_grad", "dbias", dbias, N);
  const DType t = dfc.dtype;
  if (epilogue(k::Blas::Epilogue::dgelu_bgrad) && M > 0 && N > 0 && K > 0 && N % 8 == 0 &&
      A.dtype == t && B.dtype == t && (t == DType::bf16 || t == DType::f16) && fc.dtype == t &&
      k::aligned16(fc.data) && k::aligned16(dfc.data) && fc.data != dfc.data) {
    Scratch sums(*this, static_cast<std::size_t>(N) * dtype_size(t));
    if (blas_.gemm_epilogue(trans_a, trans_b, M, N, K, A.data, B.data, st(t), 0.0f, dfc.data,
                            k::Blas::Epilogue::dgelu_bgrad, sums.as<void>(), fc.data)) {
      k::axpy(out(dbias), 1.0f, k::In{sums.as<void>(), st(t)}, N, s());
      return;
    }
  }
  Backend::gemm_dgelu_bias_grad(trans_a, trans_b, M, N, K, A, B, fc, dfc, dbias);
}

void CudaBackend::gemm_weight_bias_grad(bool trans_b, int64_t M, int64_t N, int64_t K,
                                        const TensorView& A, const TensorView& B,
                                        const TensorView& C, const TensorView& dbias) {
  // C [M,N] += A^T op(B), A stored [K,M]; dbias [M] += colsum(A): BGRADB writes the sums
  // (C's dtype) into scratch, added to dbias after.
  Chk::gemm(M, N, K, A, B, C);
  Chk::need_float("gemm_weight_bias_grad", "dbias", dbias, M);
  const DType t = C.dtype;
  if (epilogue(k::Blas::Epilogue::bgradb) && M > 0 && N > 0 && K > 0 && A.dtype == t &&
      B.dtype == t) {
    Scratch sums(*this, static_cast<std::size_t>(M) * dtype_size(t));
    if (blas_.gemm_epilogue(true, trans_b, M, N, K, A.data, B.data, st(t), 1.0f, C.data,
                            k::Blas::Epilogue::bgradb, sums.as<void>(), nullptr)) {
      k::axpy(out(dbias), 1.0f, k::In{sums.as<void>(), st(t)}, M, s());
      return;
    }
  }
  Backend::gemm_weight_bias_grad(trans_b, M, N, K, A, B, C, dbias);
}

void CudaBackend::gemm_relu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const TensorView& A, const TensorView& B, const TensorView& out_) {
  // out [M,N] = max(op(A) op(B), 0): one cuBLASLt call with the RELU epilogue when it takes
  // it (one dtype), else gemm + relu_forward in place.
  Chk::gemm(M, N, K, A, B, out_);
  const DType t = out_.dtype;
  if (epilogue(k::Blas::Epilogue::relu) && M > 0 && N > 0 && K > 0 && A.dtype == t &&
      B.dtype == t &&
      blas_.gemm_epilogue(trans_a, trans_b, M, N, K, A.data, B.data, st(t), 0.0f, out_.data,
                          k::Blas::Epilogue::relu, nullptr, nullptr)) {
    return;
  }
  Backend::gemm_relu(trans_a, trans_b, M, N, K, A, B, out_);
}

void CudaBackend::add_bias(const TensorView& out_, const TensorView& bias, int64_t R, int64_t C) {
  // out: [R,C] += bias: [C]
  Chk::add_bias(out_, bias, R, C);
  k::add_bias(out(out_), in(bias), R, C, s());
}

void CudaBackend::bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                                int64_t C) {
  // dbias: [C] += colsum(dout: [R,C])
  Chk::bias_backward(dbias, dout, R, C);
  if (R == 0 || C == 0) return;
  Scratch partial(*this,
                  static_cast<std::size_t>(k::bias_backward_scratch_floats(R, C)) * sizeof(float));
  k::bias_backward(out(dbias), in(dout), R, C, partial.as<float>(), s());
}

void CudaBackend::add(const TensorView& out_, const TensorView& a, const TensorView& b) {
  // out[n] = a[n] + b[n], n = out.numel()
  const int64_t n = out_.numel();
  Chk::binary("add", out_, a, b);
  k::add(out(out_), in(a), in(b), n, s());
}

void CudaBackend::axpy(const TensorView& y, float alpha, const TensorView& x) {
  // y[n] += alpha x[n], n = y.numel()
  const int64_t n = y.numel();
  Chk::axpy(y, x);
  k::axpy(out(y), alpha, in(x), n, s());
}

void CudaBackend::scale(const TensorView& x, float alpha) {
  // x[n] *= alpha
  const int64_t n = x.numel();
  Chk::scale(x);
  k::scale(out(x), alpha, n, s());
}

// ---------------------------------------------------------------------------------------
// reductions into device scalars

void CudaBackend::squared_norm(const TensorView& acc, const TensorView& x) {
  // acc[0] (fp64) += sum x[n]^2
  double* a = Chk::squared_norm(acc, x);
  const int64_t n = x.numel();
  if (n == 0) return;
  Scratch partial(*this,
                  static_cast<std::size_t>(k::squared_norm_scratch_doubles(n)) * sizeof(double));
  k::squared_norm(a, in(x), n, partial.as<double>(), s());
}

void CudaBackend::clip_coefficient(const TensorView& norm, const TensorView& coef,
                                   const TensorView& parts, double max_norm) {
  // norm[0] (fp64) = sqrt(sum parts[n] (fp64)); coef[0] (fp32) = clip coefficient
  double* nrm = Chk::clip_coefficient(norm, coef, parts);
  k::clip_coefficient(nrm, static_cast<float*>(coef.data), static_cast<const double*>(parts.data),
                      parts.numel(), max_norm, s());
}

void CudaBackend::scale_by(const TensorView& x, const TensorView& coef) {
  // x[n] *= coef[0] (fp32)
  Chk::scale_by(x, coef);
  const int64_t n = x.numel();
  k::scale_by(out(x), static_cast<const float*>(coef.data), n, s());
}

void CudaBackend::unscale_and_check(const TensorView& x, float inv_scale,
                                    const TensorView& found_inf) {
  // x[n] (fp32) *= inv_scale; found_inf[0] (fp64) = 1 if any x was inf or NaN
  double* found = Chk::unscale_and_check(x, found_inf);
  k::unscale_and_check(static_cast<float*>(x.data), inv_scale, x.numel(), found, s());
}

// ---------------------------------------------------------------------------------------
// transformer pieces

void CudaBackend::check_tokens(const char* kernel, const TensorView& tokens, int64_t n, int64_t V,
                               int code) {
  const int64_t bound = V >= 0 ? V : std::numeric_limits<int32_t>::max() + int64_t{1};
  k::check_indices(static_cast<const int32_t*>(tokens.data), n, bound, code, dev_error_, s());
}

void CudaBackend::embedding_forward(const TensorView& out_, const TensorView& tokens,
                                    const TensorView& wte, const TensorView& wpe, int64_t B,
                                    int64_t T, int64_t C) {
  // tokens: [B,T] int32; wte: [V,C]; wpe: [Tmax,C]; out: [B,T,C]. V = wte.numel() / C.
  const int64_t V = Chk::embedding_forward(out_, tokens, wte, wpe, B, T, C);
  check_tokens("embedding_forward", tokens, B * T, V, k::kErrEmbeddingForward);
  if (C == 0) return;
  k::embedding_forward(out(out_), static_cast<const int32_t*>(tokens.data), in(wte), in(wpe), B, T,
                       C, V, s());
}

void CudaBackend::embedding_backward(const TensorView& dwte, const TensorView& dwpe,
                                     const TensorView& dout, const TensorView& tokens, int64_t B,
                                     int64_t T, int64_t C) {
  // dwte: [V,C] += scatter of dout: [B,T,C] by tokens: [B,T]; dwpe: [Tmax,C] (rows < T) +=.
  const int64_t V = Chk::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  check_tokens("embedding_backward", tokens, B * T, V, k::kErrEmbeddingBackward);
  if (C == 0 || B * T == 0) return;
  const k::EmbeddingScratch need = k::embedding_backward_scratch(st(dwte.dtype), B, T, C, V);
  Scratch fs(*this, static_cast<std::size_t>(need.floats) * sizeof(float));
  Scratch is(*this, static_cast<std::size_t>(need.ints) * sizeof(int32_t));
  k::embedding_backward(out(dwte), out(dwpe), in(dout), static_cast<const int32_t*>(tokens.data), B,
                        T, C, V, fs.as<float>(), is.as<int32_t>(), s());
}

void CudaBackend::layernorm_forward(const TensorView& out_, const TensorView& mean,
                                    const TensorView& rstd, const TensorView& x,
                                    const TensorView& weight, const TensorView& bias, int64_t R,
                                    int64_t C, float eps) {
  // x: [R,C]; weight, bias: [C]; out: [R,C]; mean, rstd: [R] fp32.
  Chk::layernorm_forward(out_, mean, rstd, x, weight, bias, R, C);
  k::layernorm_forward(out(out_), static_cast<float*>(mean.data), static_cast<float*>(rstd.data),
                       in(x), in(weight), in(bias), R, C, eps, s());
}

// The fused residual adds (fsdp/backend/kernels.hpp): an empty proj_bias is a null In.
namespace {
k::In optional_in(const TensorView& v, DType otherwise) {
  return v.data ? in(v) : k::In{nullptr, st(otherwise)};
}
}  // namespace

void CudaBackend::add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                                    const TensorView& residual, int64_t R, int64_t C) {
  Chk::add_bias_residual(h, proj_bias, residual, R, C);
  k::add_bias_residual(out(h), optional_in(proj_bias, h.dtype), in(residual), R, C, s());
}

void CudaBackend::add_layernorm_forward(const TensorView& h, const TensorView& out_,
                                        const TensorView& mean, const TensorView& rstd,
                                        const TensorView& residual, const TensorView& proj_bias,
                                        const TensorView& weight, const TensorView& bias,
                                        int64_t R, int64_t C, float eps) {
  Chk::add_layernorm_forward(h, out_, mean, rstd, residual, proj_bias, weight, bias, R, C);
  k::add_layernorm_forward(out(h), out(out_), static_cast<float*>(mean.data),
                           static_cast<float*>(rstd.data), in(residual),
                           optional_in(proj_bias, h.dtype), in(weight), in(bias), R, C, eps, s());
}

void CudaBackend::add_rmsnorm_forward(const TensorView& h, const TensorView& out_,
                                      const TensorView& rstd, const TensorView& residual,
                                      const TensorView& proj_bias, const TensorView& weight,
                                      int64_t R, int64_t C, float eps) {
  Chk::add_rmsnorm_forward(h, out_, rstd, residual, proj_bias, weight, R, C);
  k::add_rmsnorm_forward(out(h), out(out_), static_cast<float*>(rstd.data), in(residual),
                         optional_in(proj_bias, h.dtype), in(weight), R, C, eps, s());
}

void CudaBackend::layernorm_backward(const TensorView& dx, const TensorView& dweight,
                                     const TensorView& dbias, const TensorView& dout,
                                     const TensorView& x, const TensorView& weight,
                                     const TensorView& mean, const TensorView& rstd, int64_t R,
                                     int64_t C) {
  // dx: [R,C] +=; dweight, dbias: [C] +=; dout, x: [R,C]; weight: [C]; mean, rstd: [R] fp32.
  Chk::layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd, R, C);
  if (R == 0 || C == 0) return;
  Scratch partial(
      *this, static_cast<std::size_t>(k::layernorm_backward_scratch_floats(R, C)) * sizeof(float));
  k::layernorm_backward(out(dx), out(dweight), out(dbias), in(dout), in(x), in(weight),
                        static_cast<const float*>(mean.data), static_cast<const float*>(rstd.data),
                        R, C, partial.as<float>(), s());
}

void CudaBackend::gelu_forward(const TensorView& out_, const TensorView& x) {
  // out[n] = gelu(x[n]), n = out.numel()
  const int64_t n = out_.numel();
  Chk::unary_forward("gelu_forward", out_, x);
  k::gelu_forward(out(out_), in(x), n, s());
}

void CudaBackend::gelu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) {
  // dx[n] = dout[n] gelu'(x[n]), n = dx.numel() (dx may alias dout)
  const int64_t n = dx.numel();
  Chk::unary_backward("gelu_backward", dx, x, dout);
  k::gelu_backward(out(dx), in(x), in(dout), n, s());
}

void CudaBackend::bias_gelu_forward(const TensorView& out_, const TensorView& fc,
                                    const TensorView& bias, int64_t R, int64_t C) {
  // fc: [R,C] += bias: [C]; out: [R,C] = gelu(fc as stored)
  Chk::bias_gelu_forward(out_, fc, bias, R, C);
  k::bias_gelu_forward(out(out_), out(fc), in(bias), R, C, s());
}

void CudaBackend::gelu_bias_backward(const TensorView& dfc, const TensorView& dbias,
                                     const TensorView& fc, const TensorView& dout, int64_t R,
                                     int64_t C) {
  // dfc: [R,C] = dout gelu'(fc) (may alias dout); dbias: [C] += colsum(dfc as stored)
  Chk::gelu_bias_backward(dfc, dbias, fc, dout, R, C);
  if (R == 0 || C == 0) return;
  Scratch partial(*this,
                  static_cast<std::size_t>(k::bias_backward_scratch_floats(R, C)) * sizeof(float));
  k::gelu_bias_backward(out(dfc), out(dbias), in(fc), in(dout), R, C, partial.as<float>(), s());
}

void CudaBackend::flash_backward(const k::FlashProblem& p, const void* q, const void* kk,
                                 const void* v, const void* out, const float* lse,
                                 const void* dout, void* dq, void* dk, void* dv, float* dbias) {
  const int64_t floats = k::flash_backward_scratch_floats(p, dbias != nullptr);
  Scratch di(*this, static_cast<std::size_t>(floats) * sizeof(float));
  k::flash_backward(p, q, kk, v, out, lse, dout, dq, dk, dv, dbias, di.as<float>(), s());
}

namespace {
// GPT-2's attention as a FlashProblem over qkv [B,T,3C] (q, k, v at column offsets 0, C, 2C).
k::FlashProblem gpt2_problem(int64_t B, int64_t T, int64_t C, int64_t H, k::ST t,
                             const TensorView& doc_start) {
  const int64_t hs = C / H;
  k::FlashProblem p{B, T, T, H, hs, 3 * C, 3 * C, 3 * C, C,
                    1.0f / std::sqrt(static_cast<float>(hs)), true, nullptr, nullptr, t};
  p.doc_start = doc_start ? static_cast<const int32_t*>(doc_start.data) : nullptr;
  return p;
}
}  // namespace

void CudaBackend::attention_forward(const TensorView& out_, const TensorView& lse,
                                    const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                    int64_t H, const TensorView& doc_start) {
  // qkv: [B,T,3C]; out: [B,T,C]; lse: [B,H,T] fp32; doc_start: int32 [B,T] or null.
  Chk::attention_forward(out_, lse, qkv, B, T, C, H, doc_start);
  check_attention_shapes("attention_forward", B, T, C, H);
  if (B == 0 || T == 0) return;
  auto* l = static_cast<float*>(lse.data);
  if (out_.dtype == qkv.dtype) {
    const DType dt = qkv.dtype;
    const void* q = qkv.data;
    k::flash_forward(gpt2_problem(B, T, C, H, st(dt), doc_start), q, at(q, dt, C), at(q, dt, 2 * C),
                     out_.data, l, s());
    return;
  }
  // Mixed storage types: run in fp32 and round the output once.
  const F32Copy q(*this, qkv, B * T * 3 * C, true), o(*this, out_, B * T * C, false);
  const float* qf = static_cast<const float*>(q.view.data);
  k::flash_forward(gpt2_problem(B, T, C, H, k::ST::f32, doc_start), qf, qf + C, qf + 2 * C,
                   o.view.data, l, s());
  k::cast(out(out_), in(o.view), B * T * C, s());
}

void CudaBackend::attention_backward(const TensorView& dqkv, const TensorView& dout,
                                     const TensorView& qkv, const TensorView& out_,
                                     const TensorView& lse, int64_t B, int64_t T, int64_t C,
                                     int64_t H, const TensorView& doc_start) {
  // dqkv: [B,T,3C] written; dout, out: [B,T,C]; qkv: [B,T,3C]; lse: [B,H,T] fp32; doc_start
  // as in forward.
  Chk::attention_backward(dqkv, dout, qkv, out_, lse, B, T, C, H, doc_start);
  check_attention_shapes("attention_backward", B, T, C, H);
  if (B == 0 || T == 0) return;
  const auto* l = static_cast<const float*>(lse.data);
  const DType dt = qkv.dtype;
  if (dqkv.dtype == dt && dout.dtype == dt && out_.dtype == dt) {
    const void* q = qkv.data;
    void* g = dqkv.data;
    flash_backward(gpt2_problem(B, T, C, H, st(dt), doc_start), q, at(q, dt, C), at(q, dt, 2 * C),
                   out_.data, l, dout.data, g, at(g, dt, C), at(g, dt, 2 * C), nullptr);
    return;
  }
  const F32Copy d(*this, dout, B * T * C, true), q(*this, qkv, B * T * 3 * C, true),
      o(*this, out_, B * T * C, true);
  const F32Copy g(*this, dqkv, B * T * 3 * C, false);
  const float* qf = static_cast<const float*>(q.view.data);
  float* gf = static_cast<float*>(g.view.data);
  flash_backward(gpt2_problem(B, T, C, H, k::ST::f32, doc_start), qf, qf + C, qf + 2 * C,
                 o.view.data, l, d.view.data, gf, gf + C, gf + 2 * C, nullptr);
  k::cast(out(dqkv), in(g.view), B * T * 3 * C, s());
}

void CudaBackend::cross_entropy(const char* kernel, const TensorView& loss,
                                const TensorView& logits, const TensorView& targets, int64_t R,
                                int64_t V, int64_t ld, float grad_scale, float softcap,
                                bool backward) {
  // loss[0] (fp64) += sum of row losses; logits: [R,ld] (-> dlogits in place if backward,
  // padding columns [V,ld) = 0); targets: [R] int32.
  double* l = Chk::cross_entropy(kernel, loss, logits, targets, R, V, ld, softcap);
  if (R == 0) return;
  const auto* tg = static_cast<const int32_t*>(targets.data);
  k::check_indices(tg, R, V, k::kErrCrossEntropy, dev_error_, s(), /*allow_ignore=*/true);
  Scratch rows(*this, static_cast<std::size_t>(R) * sizeof(double));
  k::cross_entropy(out(logits), tg, R, V, ld, grad_scale, softcap, backward, rows.as<double>(), l,
                   s());
}

void CudaBackend::cross_entropy_forward_backward(const TensorView& loss, const TensorView& logits,
                                                 const TensorView& targets, int64_t R, int64_t V,
                                                 int64_t ld, float grad_scale, float softcap) {
  cross_entropy("cross_entropy_forward_backward", loss, logits, targets, R, V, ld, grad_scale,
                softcap, true);
}

void CudaBackend::cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                                        const TensorView& targets, int64_t R, int64_t V, int64_t ld,
                                        float softcap) {
  cross_entropy("cross_entropy_forward", loss, logits, targets, R, V, ld, 0.0f, softcap, false);
}

// ---------------------------------------------------------------------------------------
// T5 pieces

void CudaBackend::embedding_lookup_forward(const TensorView& out_, const TensorView& tokens,
                                           const TensorView& table, int64_t N, int64_t C) {
  // tokens: [N] int32; table: [V,C]; out: [N,C]. V = table.numel() / C.
  const int64_t V = Chk::embedding_lookup_forward(out_, tokens, table, N, C);
  check_tokens("embedding_lookup_forward", tokens, N, V, k::kErrEmbeddingLookupForward);
  if (C == 0) return;
  k::embedding_lookup_forward(out(out_), static_cast<const int32_t*>(tokens.data), in(table), N, C,
                              V, s());
}

void CudaBackend::embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                            const TensorView& tokens, int64_t N, int64_t C) {
  // dtable: [V,C] += scatter of dout: [N,C] by tokens: [N].
  const int64_t V = Chk::embedding_lookup_backward(dtable, dout, tokens, N, C);
  check_tokens("embedding_lookup_backward", tokens, N, V, k::kErrEmbeddingLookupBackward);
  if (C == 0 || N == 0 || V <= 0) return;
  const k::EmbeddingScratch need = k::embedding_backward_scratch(st(dtable.dtype), 1, N, C, V);
  Scratch fs(*this, static_cast<std::size_t>(need.floats) * sizeof(float));
  Scratch is(*this, static_cast<std::size_t>(need.ints) * sizeof(int32_t));
  k::embedding_lookup_backward(out(dtable), in(dout), static_cast<const int32_t*>(tokens.data), N,
                               C, V, fs.as<float>(), is.as<int32_t>(), s());
}

void CudaBackend::rmsnorm_forward(const TensorView& out_, const TensorView& rstd,
                                  const TensorView& x, const TensorView& weight, int64_t R,
                                  int64_t C, float eps) {
  // x: [R,C]; weight: [C]; out: [R,C]; rstd: [R] fp32.
  Chk::rmsnorm_forward(out_, rstd, x, weight, R, C);
  k::rmsnorm_forward(out(out_), static_cast<float*>(rstd.data), in(x), in(weight), R, C, eps, s());
}

void CudaBackend::rmsnorm_backward(const TensorView& dx, const TensorView& dweight,
                                   const TensorView& dout, const TensorView& x,
                                   const TensorView& weight, const TensorView& rstd, int64_t R,
                                   int64_t C) {
  // dx: [R,C] +=; dweight: [C] +=; dout, x: [R,C]; weight: [C]; rstd: [R] fp32.
  Chk::rmsnorm_backward(dx, dweight, dout, x, weight, rstd, R, C);
  if (R == 0 || C == 0) return;
  Scratch partial(
      *this, static_cast<std::size_t>(k::rmsnorm_backward_scratch_floats(R, C)) * sizeof(float));
  k::rmsnorm_backward(out(dx), out(dweight), in(dout), in(x), in(weight),
                      static_cast<const float*>(rstd.data), R, C, partial.as<float>(), s());
}

void CudaBackend::relu_forward(const TensorView& out_, const TensorView& x) {
  // out[n] = max(x[n], 0), n = out.numel()
  const int64_t n = out_.numel();
  Chk::unary_forward("relu_forward", out_, x);
  k::relu_forward(out(out_), in(x), n, s());
}

void CudaBackend::relu_backward(const TensorView& dx, const TensorView& x, const TensorView& dout) {
  // dx[n] = x[n] > 0 ? dout[n] : 0, n = dx.numel() (dx may alias dout)
  const int64_t n = dx.numel();
  Chk::unary_backward("relu_backward", dx, x, dout);
  k::relu_backward(out(dx), in(x), in(dout), n, s());
}

void CudaBackend::mul(const TensorView& out_, const TensorView& a, const TensorView& b) {
  // out[n] = a[n] * b[n], n = out.numel() (out may alias a or b)
  const int64_t n = out_.numel();
  Chk::binary("mul", out_, a, b);
  k::mul(out(out_), in(a), in(b), n, s());
}

void CudaBackend::geglu_forward(const TensorView& out_, const TensorView& gate,
                                const TensorView& up) {
  Chk::geglu_forward(out_, gate, up);
  k::geglu_forward(out(out_), in(gate), in(up), out_.numel(), s());
}

void CudaBackend::geglu_backward(const TensorView& dgate, const TensorView& dup,
                                 const TensorView& dout, const TensorView& gate,
                                 const TensorView& up) {
  Chk::geglu_backward(dgate, dup, dout, gate, up);
  k::geglu_backward(out(dgate), out(dup), in(dout), in(gate), in(up), dgate.numel(), s());
}

void CudaBackend::position_bias_forward(const TensorView& bias, const TensorView& table,
                                        const TensorView& buckets, int64_t H, int64_t Tq,
                                        int64_t Tk) {
  // table: [NB,H]; buckets: [P] int32 in [0,NB); bias: [H,P] fp32, by relative position
  // (P = relative_positions(Tq, Tk)). NB = numel / H.
  const int64_t NB = Chk::position_bias_forward(bias, table, buckets, H, Tq, Tk);
  const auto* bk = static_cast<const int32_t*>(buckets.data);
  const int64_t bound = NB >= 0 ? NB : std::numeric_limits<int32_t>::max() + int64_t{1};
  k::check_indices(bk, relative_positions(Tq, Tk), bound, k::kErrPositionBiasForward, dev_error_,
                   s());
  k::position_bias_forward(static_cast<float*>(bias.data), in(table), bk, NB, H, Tq, Tk, s());
}

void CudaBackend::position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                                         const TensorView& buckets, int64_t H, int64_t Tq,
                                         int64_t Tk) {
  // dtable: [NB,H] +=; dbias: [H,P] fp32; buckets: [P] int32 in [0,NB).
  const int64_t NB = Chk::position_bias_backward(dtable, dbias, buckets, H, Tq, Tk);
  const auto* bk = static_cast<const int32_t*>(buckets.data);
  const int64_t bound = NB >= 0 ? NB : std::numeric_limits<int32_t>::max() + int64_t{1};
  k::check_indices(bk, relative_positions(Tq, Tk), bound, k::kErrPositionBiasBackward, dev_error_,
                   s());
  k::position_bias_backward(out(dtable), static_cast<const float*>(dbias.data), bk, NB, H, Tq, Tk,
                            s());
}

namespace {
// cuBLAS limits, run by ArgChecks::mha_forward/backward after the dimensions (>= 0).
void check_mha_limits(const char* kernel, int64_t, int64_t Tq, int64_t Tk, int64_t H, int64_t D) {
  if (H * D > INT32_MAX || Tq > INT32_MAX || Tk > INT32_MAX) {
    throw Error("cuda backend: " + std::string(kernel) + ": bad shape Tq=" + std::to_string(Tq) +
                " Tk=" + std::to_string(Tk) + " H=" + std::to_string(H) + " D=" +
                std::to_string(D) + " (cuBLAS dimensions must fit in int32)");
  }
}
}  // namespace

namespace {
k::FlashProblem mha_problem(const TensorView& bias, const TensorView& key_mask, int64_t B,
                            int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale, bool causal,
                            k::ST t) {
  return {B, Tq, Tk, H, D, H * D, H * D, H * D, H * D, scale, causal,
          static_cast<const float*>(bias.data), static_cast<const int32_t*>(key_mask.data), t};
}
}  // namespace

void CudaBackend::mha_forward(const TensorView& out_, const TensorView& lse, const TensorView& q,
                              const TensorView& k, const TensorView& v, const TensorView& bias,
                              const TensorView& key_mask, int64_t B, int64_t Tq, int64_t Tk,
                              int64_t H, int64_t D, float scale, bool causal) {
  // q: [B,Tq,H*D]; k, v: [B,Tk,H*D]; bias: [H,Tq+Tk-1] fp32 (by relative position) or none;
  // key_mask: [B,Tk] int32 or none; out: [B,Tq,H*D]; lse: [B,H,Tq] fp32.
  Chk::mha_forward(out_, lse, q, k, v, bias, key_mask, B, Tq, Tk, H, D, check_mha_limits);
  const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
  auto* l = static_cast<float*>(lse.data);
  const DType dt = q.dtype;
  if (k.dtype == dt && v.dtype == dt && out_.dtype == dt) {
    k::flash_forward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal, st(dt)), q.data,
                     k.data, v.data, out_.data, l, s());
    return;
  }
  // Mixed storage types: run in fp32 and round the output once.
  const F32Copy fq(*this, q, nq, true), fk(*this, k, nk, true), fv(*this, v, nk, true);
  const F32Copy fo(*this, out_, nq, false);
  k::flash_forward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal, k::ST::f32),
                   fq.view.data, fk.view.data, fv.view.data, fo.view.data, l, s());
  if (nq > 0) k::cast(out(out_), in(fo.view), nq, s());
}

void CudaBackend::mha_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                               const TensorView& dbias, const TensorView& dout,
                               const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out_, const TensorView& lse,
                               const TensorView& bias, const TensorView& key_mask, int64_t B,
                               int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                               bool causal) {
  // dq: [B,Tq,H*D], dk, dv: [B,Tk,H*D] written; dbias: [H,Tq+Tk-1] fp32 += or none; dout, out:
  // [B,Tq,H*D]; q, k, v, lse, bias, key_mask as in forward.
  Chk::mha_backward(dq, dk, dv, dbias, dout, q, k, v, out_, lse, bias, key_mask, B, Tq, Tk, H, D,
                    check_mha_limits);
  const int64_t nq = B * Tq * H * D, nk = B * Tk * H * D;
  const auto* l = static_cast<const float*>(lse.data);
  auto* db = static_cast<float*>(dbias.data);
  const DType dt = q.dtype;
  bool same = true;
  for (const TensorView* x : {&dq, &dk, &dv, &dout, &k, &v, &out_}) same = same && x->dtype == dt;
  if (same) {
    flash_backward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal, st(dt)), q.data,
                   k.data, v.data, out_.data, l, dout.data, dq.data, dk.data, dv.data, db);
    return;
  }
  const F32Copy fd(*this, dout, nq, true), fq(*this, q, nq, true), fk(*this, k, nk, true),
      fv(*this, v, nk, true), fo(*this, out_, nq, true);
  const F32Copy gq(*this, dq, nq, false), gk(*this, dk, nk, false), gv(*this, dv, nk, false);
  flash_backward(mha_problem(bias, key_mask, B, Tq, Tk, H, D, scale, causal, k::ST::f32),
                 fq.view.data, fk.view.data, fv.view.data, fo.view.data, l, fd.view.data,
                 gq.view.data, gk.view.data, gv.view.data, db);
  if (nq > 0) k::cast(out(dq), in(gq.view), nq, s());
  if (nk > 0) {
    k::cast(out(dk), in(gk.view), nk, s());
    k::cast(out(dv), in(gv.view), nk, s());
  }
}

// ---------------------------------------------------------------------------------------
// Llama pieces: rope, SwiGLU and clamped SwiGLU in kernels_llama.cu (mixed storage types
// through the run-time-typed instantiation), grouped-query attention on the flash kernels with
// FlashProblem::group = H / Hkv, attention sinks in kernels_attention_sink.cu.

void CudaBackend::rope_forward(const TensorView& out_, const TensorView& x, const TensorView& cos,
                               const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                               int64_t R) {
  // x, out: [B,T,H*D] (out may alias x); cos, sin: fp32 [>= T, R/2].
  Chk::rope_forward(out_, x, cos, sin, B, T, H, D, R);
  k::rope(out(out_), in(x), static_cast<const float*>(cos.data),
          static_cast<const float*>(sin.data), B, T, H, D, R, false, s());
}

void CudaBackend::rope_backward(const TensorView& dx, const TensorView& dout,
                                const TensorView& cos, const TensorView& sin, int64_t B,
                                int64_t T, int64_t H, int64_t D, int64_t R) {
  // dout, dx: [B,T,H*D] (dx written, may alias dout); cos, sin: fp32 [>= T, R/2].
  Chk::rope_backward(dx, dout, cos, sin, B, T, H, D, R);
  k::rope(out(dx), in(dout), static_cast<const float*>(cos.data),
          static_cast<const float*>(sin.data), B, T, H, D, R, true, s());
}

void CudaBackend::swiglu_forward(const TensorView& out_, const TensorView& gate,
                                 const TensorView& up) {
  // out[n] = silu(gate[n]) up[n], n = out.numel() (out may alias gate or up)
  const int64_t n = out_.numel();
  Chk::swiglu_forward(out_, gate, up);
  k::swiglu_forward(out(out_), in(gate), in(up), n, s());
}

void CudaBackend::swiglu_backward(const TensorView& dgate, const TensorView& dup,
                                  const TensorView& dout, const TensorView& gate,
                                  const TensorView& up) {
  // dgate = dout up silu'(gate), dup = dout silu(gate), n = dgate.numel()
  const int64_t n = dgate.numel();
  Chk::swiglu_backward(dgate, dup, dout, gate, up);
  k::swiglu_backward(out(dgate), out(dup), in(dout), in(gate), in(up), n, s());
}

// Gated DeltaNet (Qwen3.5's linear_attention layers): the CPU backend's kernels are the
// reference; the CUDA kernels are not written yet, and no model calls these on CUDA yet.
namespace {
[[noreturn]] void no_cuda_kernel(const char* kernel) {
  throw Error(std::string(kernel) +
              ": not implemented on the CUDA backend yet (Gated DeltaNet runs on the CPU "
              "backend, train.device = \"cpu\")");
}
}  // namespace

void CudaBackend::causal_conv1d_forward(const TensorView& out_, const TensorView& x,
                                        const TensorView& weight, int64_t B, int64_t T,
                                        int64_t C, int64_t K, const TensorView& doc_start) {
  Chk::causal_conv1d_forward(out_, x, weight, B, T, C, K, doc_start);
  no_cuda_kernel("causal_conv1d_forward");
}
void CudaBackend::causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                                         const TensorView& dout, const TensorView& x,
                                         const TensorView& weight, int64_t B, int64_t T,
                                         int64_t C, int64_t K, const TensorView& doc_start) {
  Chk::causal_conv1d_backward(dx, dweight, dout, x, weight, B, T, C, K, doc_start);
  no_cuda_kernel("causal_conv1d_backward");
}
void CudaBackend::gated_delta_rule_forward(const TensorView& out_, const TensorView& qkv,
                                           const TensorView& a, const TensorView& b,
                                           const TensorView& A_log, const TensorView& dt_bias,
                                           int64_t B, int64_t T, int64_t Hk, int64_t Hv,
                                           int64_t Dk, int64_t Dv, const TensorView& doc_start) {
  Chk::gated_delta_rule_forward(out_, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv,
                                doc_start);
  no_cuda_kernel("gated_delta_rule_forward");
}
void CudaBackend::gated_delta_rule_backward(const TensorView& dqkv, const TensorView& da,
                                            const TensorView& db, const TensorView& dA_log,
                                            const TensorView& ddt_bias, const TensorView& dout,
                                            const TensorView& qkv, const TensorView& a,
                                            const TensorView& b, const TensorView& A_log,
                                            const TensorView& dt_bias, int64_t B, int64_t T,
                                            int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
                                            const TensorView& doc_start) {
  Chk::gated_delta_rule_backward(dqkv, da, db, dA_log, ddt_bias, dout, qkv, a, b, A_log,
                                 dt_bias, B, T, Hk, Hv, Dk, Dv, doc_start);
  no_cuda_kernel("gated_delta_rule_backward");
}

void CudaBackend::sigmoid_gate_forward(const TensorView& out_, const TensorView& x,
                                       const TensorView& gate) {
  // out[n] = x[n] sigmoid(gate[n]), n = out.numel() (out may alias x)
  const int64_t n = out_.numel();
  Chk::sigmoid_gate_forward(out_, x, gate);
  k::sigmoid_gate_forward(out(out_), in(x), in(gate), n, s());
}

void CudaBackend::sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate,
                                        const TensorView& dout, const TensorView& x,
                                        const TensorView& gate) {
  // dx = dout s, dgate = dout x s (1 - s), s = sigmoid(gate), n = dout.numel() (dx may alias
  // dout, dgate may alias gate)
  const int64_t n = dout.numel();
  Chk::sigmoid_gate_backward(dx, dgate, dout, x, gate);
  k::sigmoid_gate_backward(out(dx), out(dgate), in(dout), in(x), in(gate), n, s());
}

void CudaBackend::clamped_swiglu_forward(const TensorView& out_, const TensorView& gate_up,
                                         float alpha, float limit) {
  // out[n] = (u + 1) g sigmoid(alpha g) of the pairs gate_up[2n] (out must not alias gate_up)
  const int64_t n = out_.numel();
  Chk::clamped_swiglu_forward(out_, gate_up, alpha, limit);
  k::clamped_swiglu_forward(out(out_), in(gate_up), n, alpha, limit, s());
}

void CudaBackend::clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                                          const TensorView& gate_up, float alpha, float limit) {
  // dgate_up[2n] from dout[n], n = dout.numel() (dgate_up may alias gate_up)
  const int64_t n = dout.numel();
  Chk::clamped_swiglu_backward(dgate_up, dout, gate_up, alpha, limit);
  k::clamped_swiglu_backward(out(dgate_up), in(dout), in(gate_up), n, alpha, limit, s());
}

namespace {
// Llama's attention as a FlashProblem: q, out [B,T,H*D], k, v [B,T,Hkv*D], causal (within
// `window` positions when window > 0, and within each query's document when doc_start is not
// null), query head h on key/value head h / (H/Hkv).
k::FlashProblem gqa_problem(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                            k::ST t, int64_t window, float softcap, const TensorView& doc_start) {
  k::FlashProblem p{B,     T,    T,       H,       D, H * D, Hkv * D, Hkv * D, H * D,
                    scale, true, nullptr, nullptr, t};
  p.group = H / Hkv;
  p.window = window;
  p.softcap = softcap;
  p.doc_start = static_cast<const int32_t*>(doc_start.data);  // int32 [B,T] or null
  return p;
}
}  // namespace

void CudaBackend::gqa_attention_forward(const TensorView& out_, const TensorView& lse,
                                        const TensorView& q, const TensorView& k,
                                        const TensorView& v, int64_t B, int64_t T, int64_t H,
                                        int64_t Hkv, int64_t D, float scale, int64_t window,
                                        float softcap, const TensorView& doc_start) {
  // q, out: [B,T,H*D]; k, v: [B,T,Hkv*D]; lse: [B,H,T] fp32; doc_start: int32 [B,T] or null.
  Chk::gqa_attention_forward(out_, lse, q, k, v, B, T, H, Hkv, D, window, softcap, doc_start,
                             check_mha_limits);
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
  auto* l = static_cast<float*>(lse.data);
  const DType dt = q.dtype;
  if (k.dtype == dt && v.dtype == dt && out_.dtype == dt) {
    k::flash_forward(gqa_problem(B, T, H, Hkv, D, scale, st(dt), window, softcap, doc_start),
                     q.data, k.data, v.data, out_.data, l, s());
    return;
  }
  // Mixed storage types: run in fp32 and round the output once.
  const F32Copy fq(*this, q, nq, true), fk(*this, k, nk, true), fv(*this, v, nk, true);
  const F32Copy fo(*this, out_, nq, false);
  k::flash_forward(gqa_problem(B, T, H, Hkv, D, scale, k::ST::f32, window, softcap, doc_start),
                   fq.view.data, fk.view.data, fv.view.data, fo.view.data, l, s());
  if (nq > 0) k::cast(out(out_), in(fo.view), nq, s());
}

void CudaBackend::gqa_attention_backward(const TensorView& dq, const TensorView& dk,
                                         const TensorView& dv, const TensorView& dout,
                                         const TensorView& q, const TensorView& k,
                                         const TensorView& v, const TensorView& out_,
                                         const TensorView& lse, int64_t B, int64_t T, int64_t H,
                                         int64_t Hkv, int64_t D, float scale, int64_t window,
                                         float softcap, const TensorView& doc_start) {
  // dq: [B,T,H*D], dk, dv: [B,T,Hkv*D] written; dout, out: [B,T,H*D]; q, k, v, lse, doc_start
  // as in forward.
  Chk::gqa_attention_backward(dq, dk, dv, dout, q, k, v, out_, lse, B, T, H, Hkv, D, window,
                              softcap, doc_start, check_mha_limits);
  const int64_t nq = B * T * H * D, nk = B * T * Hkv * D;
  if (H == 0) {  // no query head reads the key/value heads (the flash kernels write nothing)
    if (nk > 0) {
      fill_zero(dk.slice(0, nk));
      fill_zero(dv.slice(0, nk));
    }
    return;
  }
  const auto* l = static_cast<const float*>(lse.data);
  const DType dt = q.dtype;
  bool same = true;
  for (const TensorView* x : {&dq, &dk, &dv, &dout, &k, &v, &out_}) same = same && x->dtype == dt;
  if (same) {
    flash_backward(gqa_problem(B, T, H, Hkv, D, scale, st(dt), window, softcap, doc_start),
                   q.data, k.data, v.data, out_.data, l, dout.data, dq.data, dk.data, dv.data,
                   nullptr);
    return;
  }
  const F32Copy fd(*this, dout, nq, true), fq(*this, q, nq, true), fk(*this, k, nk, true),
      fv(*this, v, nk, true), fo(*this, out_, nq, true);
  const F32Copy gq(*this, dq, nq, false), gk(*this, dk, nk, false), gv(*this, dv, nk, false);
  flash_backward(gqa_problem(B, T, H, Hkv, D, scale, k::ST::f32, window, softcap, doc_start),
                 fq.view.data, fk.view.data, fv.view.data, fo.view.data, l, fd.view.data,
                 gq.view.data, gk.view.data, gv.view.data, nullptr);
  if (nq > 0) k::cast(out(dq), in(gq.view), nq, s());
  if (nk > 0) {
    k::cast(out(dk), in(gk.view), nk, s());
    k::cast(out(dv), in(gv.view), nk, s());
  }
}

void CudaBackend::attention_sink_forward(const TensorView& out_, const TensorView& lse,
                                         const TensorView& sinks, int64_t B, int64_t T,
                                         int64_t H, int64_t D) {
  // out: [B,T,H*D] and lse: fp32 [B,H,T], in place, from sinks: [H] (kernels_attention_sink.cu)
  Chk::attention_sink_forward(out_, lse, sinks, B, T, H, D);
  k::attention_sink_forward(out(out_), static_cast<float*>(lse.data), in(sinks), B, T, H, D,
                            s());
}

void CudaBackend::attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                                          const TensorView& out_, const TensorView& lse,
                                          const TensorView& sinks, int64_t B, int64_t T,
                                          int64_t H, int64_t D) {
  // dsinks: [H] += -sum over b, t of p_s (dout . out); one block a head, no atomics
  Chk::attention_sink_backward(dsinks, dout, out_, lse, sinks, B, T, H, D);
  k::attention_sink_backward(out(dsinks), in(dout), in(out_), static_cast<const float*>(lse.data),
                             in(sinks), B, T, H, D, s());
}

// ---------------------------------------------------------------------------------------
// strided copies (kernels_elementwise.cu)

void CudaBackend::strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                               const Strided& src_at, int64_t R, int64_t G, int64_t W,
                               bool accumulate) {
  // dst, src: float views, element (r, g, c) at r * row + offset + g * group + c * col;
  // dst(r, g, c) = (or +=) src(r, g, c); dst_at.group == 0: the sum over g, one per (r, c).
  Chk::strided_copy(dst, dst_at, src, src_at, R, G, W);
  k::strided_copy(out(dst), {dst_at.row, dst_at.offset, dst_at.group, dst_at.col}, in(src),
                  {src_at.row, src_at.offset, src_at.group, src_at.col}, R, G, W, accumulate,
                  s());
}

// ---------------------------------------------------------------------------------------
// mixture of experts (kernels_moe.cu). Indices are not checked on the device: the kernels
// skip out-of-range picks and slots (the CPU backend throws).

void CudaBackend::moe_router_forward(const TensorView& idx, const TensorView& weights,
                                     const TensorView& logits, int64_t R, int64_t E, int64_t K,
                                     bool normalize) {
  // logits: [R,E]; writes idx: [R,K] int32, weights: [R,K] fp32.
  Chk::moe_router_forward(idx, weights, logits, R, E, K);
  k::moe_router_forward(static_cast<int32_t*>(idx.data), static_cast<float*>(weights.data),
                        in(logits), R, E, K, normalize, s());
}

void CudaBackend::moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                      const TensorView& logits, const TensorView& idx, int64_t R,
                                      int64_t E, int64_t K, bool normalize) {
  // dlogits: [R,E] written; dweights: [R,K] fp32; logits: [R,E]; idx: [R,K] int32.
  Chk::moe_router_backward(dlogits, dweights, logits, idx, R, E, K);
  k::moe_router_backward(out(dlogits), static_cast<const float*>(dweights.data), in(logits),
                         static_cast<const int32_t*>(idx.data), R, E, K, normalize, s());
}

// Sigmoid routing with a bias and group-limited choice (DeepSeek-V3, GLM-4.5). The forward
// takes E <= 1024 (a row's choice values live in one warp's shared memory); a larger E throws
// fsdp::Error ("cuda backend: moe_sigmoid_router_forward: E = ... (expected at most 1024)"),
// even when R = 0. The backward has no such limit.
void CudaBackend::moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                             const TensorView& logits, const TensorView& bias,
                                             int64_t R, int64_t E, int64_t K,
                                             const SigmoidRouting& g) {
  // logits: [R,E]; bias: [E]; writes idx: [R,K] int32, weights: [R,K] fp32.
  Chk::moe_sigmoid_router_forward(idx, weights, logits, bias, R, E, K, g);
  k::moe_sigmoid_router_forward(static_cast<int32_t*>(idx.data), static_cast<float*>(weights.data),
                                in(logits), in(bias), R, E, K,
                                {g.n_group, g.topk_group, g.normalize, g.scale}, s());
}

void CudaBackend::moe_sigmoid_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                              const TensorView& logits, const TensorView& idx,
                                              int64_t R, int64_t E, int64_t K,
                                              const SigmoidRouting& g) {
  // dlogits: [R,E] written; dweights: [R,K] fp32; logits: [R,E]; idx: [R,K] int32.
  Chk::moe_sigmoid_router_backward(dlogits, dweights, logits, idx, R, E, K, g);
  k::moe_sigmoid_router_backward(out(dlogits), static_cast<const float*>(dweights.data), in(logits),
                                 static_cast<const int32_t*>(idx.data), R, E, K,
                                 {g.n_group, g.topk_group, g.normalize, g.scale}, s());
}

void CudaBackend::moe_combine_forward(const TensorView& out_, const TensorView& rows,
                                      const TensorView& weights, const TensorView& slot, int64_t R,
                                      int64_t K, int64_t C) {
  // out: [R,C] written; rows: [N,C]; weights: [R,K] fp32 or none (1); slot: [R*K] int32.
  const int64_t N = Chk::moe_combine_forward(out_, rows, weights, slot, R, K, C);
  k::moe_combine_forward(out(out_), in(rows),
                         weights ? static_cast<const float*>(weights.data) : nullptr,
                         static_cast<const int32_t*>(slot.data), R, K, C, N, s());
}

void CudaBackend::moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                                       const TensorView& dout, const TensorView& rows,
                                       const TensorView& weights, const TensorView& slot, int64_t R,
                                       int64_t K, int64_t C) {
  // drows: [N,C], the rows slot names written; dweights: [R,K] fp32 written; dout: [R,C].
  const int64_t N = Chk::moe_combine_backward(drows, dweights, dout, rows, weights, slot, R, K, C);
  k::moe_combine_backward(out(drows), static_cast<float*>(dweights.data), in(dout), in(rows),
                          static_cast<const float*>(weights.data),
                          static_cast<const int32_t*>(slot.data), R, K, C, N, s());
}

void CudaBackend::moe_router_prob_sums(const TensorView& psum, const TensorView& logits,
                                       int64_t R, int64_t E) {
  // psum: [E] fp32 +=; logits: [R,E].
  Chk::moe_router_prob_sums(psum, logits, R, E);
  if (R == 0 || E == 0) return;
  Scratch partial(*this, static_cast<std::size_t>(k::moe_router_prob_sums_scratch_doubles(R, E)) *
                             sizeof(double));
  k::moe_router_prob_sums(static_cast<float*>(psum.data), in(logits), R, E,
                          partial.as<double>(), s());
}

void CudaBackend::moe_aux_loss(const TensorView& loss, const TensorView& counts,
                               const TensorView& psum, int64_t E, double alpha) {
  // loss: fp64 [1] += alpha sum_e counts[e] psum[e]; counts, psum: [E] fp32.
  double* l = Chk::moe_aux_loss(loss, counts, psum, E);
  k::moe_aux_loss(l, static_cast<const float*>(counts.data), static_cast<const float*>(psum.data),
                  E, alpha, s());
}

void CudaBackend::moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                                        const TensorView& dprobs, int64_t R, int64_t E) {
  // dlogits: [R,E] +=; logits: [R,E]; dprobs: [E] fp32.
  Chk::moe_aux_loss_backward(dlogits, logits, dprobs, R, E);
  k::moe_aux_loss_backward(out(dlogits), in(logits), static_cast<const float*>(dprobs.data), R,
                           E, s());
}

void CudaBackend::moe_shared_gate_forward(const TensorView& out_, const TensorView& shared,
                                          const TensorView& logit, int64_t R, int64_t C) {
  // out: [R,C] +=; shared: [R,C]; logit: [R].
  Chk::moe_shared_gate_forward(out_, shared, logit, R, C);
  k::moe_shared_gate_forward(out(out_), in(shared), in(logit), R, C, s());
}

void CudaBackend::moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                           const TensorView& dout, const TensorView& shared,
                                           const TensorView& logit, int64_t R, int64_t C) {
  // dshared: [R,C] written; dlogit: [R] written; dout, shared: [R,C]; logit: [R].
  Chk::moe_shared_gate_backward(dshared, dlogit, dout, shared, logit, R, C);
  k::moe_shared_gate_backward(out(dshared), out(dlogit), in(dout), in(shared), in(logit), R, C,
                              s());
}

// ---------------------------------------------------------------------------------------
// optimizers (fp32 shards only)

// The weight-decay ranges as kernel arguments, or, past kMaxDecayRanges, update(lo, hi,
// ranges) once per piece of the shard (each wholly decayed, count -1, or not, count 0).
template <class Update>
void with_decay_ranges(int64_t n, const WeightDecay& wd, Update&& update) {
  k::DecayRanges r;
  if (wd.ranges == nullptr) return update(0, n, r);
  if (wd.ranges->size() <= static_cast<std::size_t>(k::kMaxDecayRanges)) {
    r.count = static_cast<int>(wd.ranges->size());
    for (int i = 0; i < r.count; ++i) {
      r.begin[i] = (*wd.ranges)[static_cast<std::size_t>(i)].begin;
      r.end[i] = (*wd.ranges)[static_cast<std::size_t>(i)].end;
    }
    return update(0, n, r);
  }
  wd.for_each_piece(0, n, [&](int64_t lo, int64_t hi, float rate) {
    k::DecayRanges piece;
    piece.count = rate == 0.f ? 0 : -1;
    update(lo, hi, piece);
  });
}

// Elements [lo, ...) of an update's optional param_dtype copy as a kernel argument (p null:
// none).
k::Out copy_part(const TensorView& copy, int64_t lo) {
  if (!copy) return {nullptr, k::ST::bf16};
  return {static_cast<char*>(copy.data) + lo * static_cast<int64_t>(dtype_size(copy.dtype)),
          st(copy.dtype)};
}

void CudaBackend::adamw_update(const TensorView& param, const TensorView& grad,
                               const TensorView& exp_avg, const TensorView& exp_avg_sq, float lr,
                               float beta1, float beta2, float eps, const WeightDecay& weight_decay,
                               int64_t step, const TensorView& compute_copy,
                               const TensorView& grad_scale) {
  // param, grad, exp_avg, exp_avg_sq: [n] fp32, n = param.numel(); compute_copy: none or [n]
  // bf16/fp16, written by the same kernel; grad_scale: none or fp32 [1] device memory.
  Chk::adamw_update(param, grad, exp_avg, exp_avg_sq, weight_decay, compute_copy, grad_scale);
  const int64_t n = param.numel();
  if (step < 1) {
    throw Error("cuda backend: adamw_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  // fsdp/backend/optimizer_math.hpp (torch.optim's formulas; scalars and element update
  // shared with the CPU backend)
  const AdamWCoefficients a = adamw_coefficients(lr, beta1, beta2, eps, weight_decay.rate, step);
  auto* p = static_cast<float*>(param.data);
  const auto* g = static_cast<const float*>(grad.data);
  auto* m = static_cast<float*>(exp_avg.data);
  auto* v = static_cast<float*>(exp_avg_sq.data);
  with_decay_ranges(n, weight_decay, [&](int64_t lo, int64_t hi, const k::DecayRanges& r) {
    k::adamw_update(p + lo, g + lo, m + lo, v + lo, hi - lo, a, r, copy_part(compute_copy, lo),
                    static_cast<const float*>(grad_scale.data), s());
  });
}

void CudaBackend::sgd_update(const TensorView& param, const TensorView& grad,
                             const TensorView& momentum_buf, float lr, float momentum,
                             const WeightDecay& weight_decay, int64_t step,
                             const TensorView& compute_copy, const TensorView& grad_scale) {
  // param, grad, momentum_buf: [n] fp32, n = param.numel(); momentum_buf unused (may be
  // empty) when momentum == 0; compute_copy: none or [n] bf16/fp16, written by the same kernel;
  // grad_scale: none or fp32 [1] device memory.
  Chk::sgd_update(param, grad, momentum_buf, momentum, weight_decay, compute_copy, grad_scale);
  const int64_t n = param.numel();
  if (step < 1) {
    throw Error("cuda backend: sgd_update: step = " + std::to_string(step) +
                " (expected >= 1, 1-based)");
  }
  auto* p = static_cast<float*>(param.data);
  const auto* g = static_cast<const float*>(grad.data);
  auto* b = static_cast<float*>(momentum_buf.data);
  with_decay_ranges(n, weight_decay, [&](int64_t lo, int64_t hi, const k::DecayRanges& r) {
    k::sgd_update(p + lo, g + lo, b == nullptr ? nullptr : b + lo, hi - lo, lr, momentum,
                  weight_decay.rate, r, step == 1, copy_part(compute_copy, lo),
                  static_cast<const float*>(grad_scale.data), s());
  });
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device_ordinal) {
  return std::make_unique<CudaBackend>(device_ordinal);
}

}  // namespace fsdp::cuda
