// train.cuda_graphs: segment-wise capture and replay of the model's kernels (see
// fsdp/model/graphed_kernels.hpp).
#include "fsdp/model/graphed_kernels.hpp"

#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "fsdp/core/error.hpp"

namespace fsdp {

namespace {

// splitmix64's finaliser over the record's words.
uint64_t hash_record(const std::vector<uint64_t>& r) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ r.size();
  for (uint64_t w : r) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    h ^= h >> 31;
  }
  return h;
}

// Records run eagerly once and remembered for a capture at their next sighting; past this many
// the memory is cleared (records that never repeat, e.g. a scalar that changes every step).
constexpr std::size_t kMaxSeen = 1 << 16;

}  // namespace

// The runtime the graphed model sees: every call first ends the pending segment, so what the
// model enqueues through the runtime (input copies, zero fills, new buffers) keeps its place
// among the kernels. deallocate() does not: it never throws, and a freed block is handed out
// again only to work enqueued after the segment has ended (a hook or a runtime call).
class GraphedKernels::FlushingRuntime final : public DeviceRuntime {
 public:
  FlushingRuntime(GraphedKernels& g, DeviceRuntime& rt) : g_(g), rt_(rt) {}
  Device device() const override { return rt_.device(); }
  bool host_addressable() const override { return rt_.host_addressable(); }
  Stream& compute_stream() override { return (g_.flush(), rt_.compute_stream()); }
  std::unique_ptr<Stream> create_stream() override { return rt_.create_stream(); }
  std::unique_ptr<Event> create_event() override { return rt_.create_event(); }
  std::unique_ptr<TimedEvent> create_timed_event() override { return rt_.create_timed_event(); }
  void* allocate(std::size_t bytes, MemCategory category) override {
    g_.flush();
    return rt_.allocate(bytes, category);
  }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event> pending) noexcept override {
    rt_.deallocate(ptr, bytes, category, std::move(pending));
  }
  MemoryTracker& memory() override { return rt_.memory(); }
  const AllocatorStats& allocator_stats() const override { return rt_.allocator_stats(); }
  void set_ordered_reuse(bool on) override { rt_.set_ordered_reuse(on); }
  void fill_zero(const TensorView& dst) override {
    g_.flush();
    rt_.fill_zero(dst);
  }
  void copy(const TensorView& dst, const TensorView& src) override {
    g_.flush();
    rt_.copy(dst, src);
  }
  void cast(const TensorView& dst, const TensorView& src) override {
    g_.flush();
    rt_.cast(dst, src);
  }
  void copy_to_host(void* host_dst, const TensorView& src) override {
    g_.flush();
    rt_.copy_to_host(host_dst, src);
  }
  void copy_from_host(const TensorView& dst, const void* host_src) override {
    g_.flush();
    rt_.copy_from_host(dst, host_src);
  }
  void copy_to_host_async(void* host_dst, const TensorView& src, Stream& stream) override {
    g_.flush();
    rt_.copy_to_host_async(host_dst, src, stream);
  }
  void copy_from_host_async(const TensorView& dst, const void* host_src,
                            Stream& stream) override {
    g_.flush();
    rt_.copy_from_host_async(dst, host_src, stream);
  }
  void synchronize() override {
    g_.flush();
    rt_.synchronize();
  }
  void axpy(const TensorView& y, float alpha, const TensorView& x) override {
    g_.flush();
    rt_.axpy(y, alpha, x);
  }
  void squared_norm(const TensorView& acc, const TensorView& x) override {
    g_.flush();
    rt_.squared_norm(acc, x);
  }
  void clip_coefficient(const TensorView& norm, const TensorView& coef, const TensorView& parts,
                        double max_norm) override {
    g_.flush();
    rt_.clip_coefficient(norm, coef, parts, max_norm);
  }
  void scale_by(const TensorView& x, const TensorView& coef) override {
    g_.flush();
    rt_.scale_by(x, coef);
  }
  void unscale_and_check(const TensorView& x, float inv_scale,
                         const TensorView& found_inf) override {
    g_.flush();
    rt_.unscale_and_check(x, inv_scale, found_inf);
  }
  void adamw_update(const TensorView& param, const TensorView& grad, const TensorView& exp_avg,
                    const TensorView& exp_avg_sq, float lr, float beta1, float beta2, float eps,
                    const WeightDecay& weight_decay, int64_t step,
                    const TensorView& compute_copy, const TensorView& grad_scale) override {
    g_.flush();
    rt_.adamw_update(param, grad, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, weight_decay, step,
                     compute_copy, grad_scale);
  }
  void sgd_update(const TensorView& param, const TensorView& grad, const TensorView& momentum_buf,
                  float lr, float momentum, const WeightDecay& weight_decay, int64_t step,
                  const TensorView& compute_copy, const TensorView& grad_scale) override {
    g_.flush();
    rt_.sgd_update(param, grad, momentum_buf, lr, momentum, weight_decay, step, compute_copy,
                   grad_scale);
  }

 private:
  GraphedKernels& g_;
  DeviceRuntime& rt_;
};

// The engine's hooks with a segment boundary before each pre/post hook.
class GraphedKernels::SegmentHooks final : public ModuleHooks {
 public:
  SegmentHooks(GraphedKernels& g, ModuleHooks& inner) : g_(g), inner_(inner) {}
  void pre_forward(int module) override {
    g_.flush();
    inner_.pre_forward(module);
  }
  void post_forward(int module) override {
    g_.flush();
    inner_.post_forward(module);
  }
  void pre_backward(int module) override {
    g_.flush();
    inner_.pre_backward(module);
  }
  void post_backward(int module) override {
    g_.flush();
    inner_.post_backward(module);
  }
  TensorView param(int p) override { return inner_.param(p); }
  TensorView grad(int p) override { return inner_.grad(p); }
  bool training() const override { return inner_.training(); }
  ModuleHooks& inner() { return inner_; }

 private:
  GraphedKernels& g_;
  ModuleHooks& inner_;
};

GraphedKernels::GraphedKernels(Kernels& inner) : GraphedKernels(inner, Options{}) {}

GraphedKernels::GraphedKernels(Kernels& inner, Options options)
    : inner_(inner), options_(options),
      runtime_(std::make_unique<FlushingRuntime>(*this, inner.runtime())) {
  if (options_.max_graphs < 1) throw Error("GraphedKernels: max_graphs must be >= 1");
}

GraphedKernels::~GraphedKernels() = default;

DeviceRuntime& GraphedKernels::runtime() { return *runtime_; }

ModuleHooks& GraphedKernels::hooks(ModuleHooks& inner) {
  if (!hooks_ || &hooks_->inner() != &inner) hooks_ = std::make_unique<SegmentHooks>(*this, inner);
  return *hooks_;
}

std::unique_ptr<KernelGraph> GraphedKernels::capture_graph(std::function<void()>) {
  throw Error("GraphedKernels::capture_graph: graphs are captured by the backend it wraps");
}

void GraphedKernels::put(const TensorView& v) {
  auto& r = pending_.record;
  r.push_back(reinterpret_cast<uintptr_t>(v.data));
  r.push_back(static_cast<uint64_t>(v.dtype) << 8 | static_cast<uint64_t>(v.shape.ndim()));
  for (int i = 0; i < v.shape.ndim(); ++i) r.push_back(static_cast<uint64_t>(v.shape[i]));
}

void GraphedKernels::put(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof bits);
  pending_.record.push_back(bits);
}

template <class... P, class... A>
void GraphedKernels::record(uint64_t op, void (Kernels::*fn)(P...), const A&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "GraphedKernels::record: one argument per parameter");
  pending_.record.push_back(op);
  (put(static_cast<std::decay_t<P>>(args)), ...);
  pending_.calls.emplace_back(
      [fn, saved = std::tuple<std::decay_t<P>...>(args...)](Kernels& k) {
        std::apply([&](const auto&... a) { (k.*fn)(a...); }, saved);
      });
  ++stats_.calls;
}

void GraphedKernels::run_eager(const std::vector<Call>& calls) {
  for (const Call& c : calls) c(inner_);
}

void GraphedKernels::flush() {
  if (pending_.calls.empty()) return;
  Segment seg = std::move(pending_);
  pending_.clear();
  ++stats_.segments;
  const auto n = static_cast<int64_t>(seg.calls.size());
  if (n < options_.min_calls || stats_.capture_failed) {
    ++stats_.eager;
    run_eager(seg.calls);
    return;
  }
  const uint64_t h = hash_record(seg.record);
  const auto [lo, hi] = by_hash_.equal_range(h);
  for (auto it = lo; it != hi; ++it) {
    if (it->second->record != seg.record) continue;
    lru_.splice(lru_.begin(), lru_, it->second);  // iterators stay valid
    ++stats_.replays;
    stats_.graphed_calls += n;
    lru_.front().graph->launch();
    return;
  }
  if (seen_.find(h) == seen_.end()) {  // first sighting: warm-up, eagerly
    if (seen_.size() >= kMaxSeen) seen_.clear();
    seen_.insert(h);
    ++stats_.eager;
    run_eager(seg.calls);
    return;
  }
  seen_.erase(h);
  auto calls = std::make_shared<std::vector<Call>>(std::move(seg.calls));
  Kernels& in = inner_;
  std::unique_ptr<KernelGraph> graph;
  try {
    graph = inner_.capture_graph([calls, &in] {
      for (const Call& c : *calls) c(in);
    });
  } catch (const Error& e) {
    stats_.capture_failed = true;
    if (options_.on_capture_failure) options_.on_capture_failure(e.what());
    ++stats_.eager;
    run_eager(*calls);
    return;
  }
  if (static_cast<int64_t>(lru_.size()) >= options_.max_graphs) {
    const auto victim = std::prev(lru_.end());
    const auto [vlo, vhi] = by_hash_.equal_range(victim->hash);
    for (auto it = vlo; it != vhi; ++it) {
      if (it->second == victim) {
        by_hash_.erase(it);
        break;
      }
    }
    lru_.erase(victim);
    ++stats_.evictions;
  }
  lru_.push_front(Cached{h, std::move(seg.record), std::move(graph)});
  by_hash_.emplace(h, lru_.begin());
  ++stats_.captures;
  stats_.graphed_calls += n;
  lru_.front().graph->launch();
}

// ---- the calls: each records itself under a distinct op id (its line here) ----
#define FSDP_RECORD(fn, ...) record(__LINE__, &Kernels::fn, __VA_ARGS__)

void GraphedKernels::gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                          const TensorView& A, const TensorView& B, float beta,
                          const TensorView& C) {
  FSDP_RECORD(gemm, ta, tb, M, N, K, alpha, A, B, beta, C);
}
void GraphedKernels::add_bias(const TensorView& out, const TensorView& bias, int64_t R,
                              int64_t C) {
  FSDP_RECORD(add_bias, out, bias, R, C);
}
void GraphedKernels::gemm_bias(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               const TensorView& A, const TensorView& B, const TensorView& bias,
                               const TensorView& C) {
  FSDP_RECORD(gemm_bias, ta, tb, M, N, K, A, B, bias, C);
}
void GraphedKernels::bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                                   int64_t C) {
  FSDP_RECORD(bias_backward, dbias, dout, R, C);
}
void GraphedKernels::add(const TensorView& out, const TensorView& a, const TensorView& b) {
  FSDP_RECORD(add, out, a, b);
}
void GraphedKernels::scale(const TensorView& x, float alpha) { FSDP_RECORD(scale, x, alpha); }
void GraphedKernels::embedding_forward(const TensorView& out, const TensorView& tokens,
                                       const TensorView& wte, const TensorView& wpe, int64_t B,
                                       int64_t T, int64_t C) {
  FSDP_RECORD(embedding_forward, out, tokens, wte, wpe, B, T, C);
}
void GraphedKernels::embedding_backward(const TensorView& dwte, const TensorView& dwpe,
                                        const TensorView& dout, const TensorView& tokens,
                                        int64_t B, int64_t T, int64_t C) {
  FSDP_RECORD(embedding_backward, dwte, dwpe, dout, tokens, B, T, C);
}
void GraphedKernels::layernorm_forward(const TensorView& out, const TensorView& mean,
                                       const TensorView& rstd, const TensorView& x,
                                       const TensorView& weight, const TensorView& bias,
                                       int64_t R, int64_t C, float eps) {
  FSDP_RECORD(layernorm_forward, out, mean, rstd, x, weight, bias, R, C, eps);
}
void GraphedKernels::layernorm_backward(const TensorView& dx, const TensorView& dweight,
                                        const TensorView& dbias, const TensorView& dout,
                                        const TensorView& x, const TensorView& weight,
                                        const TensorView& mean, const TensorView& rstd,
                                        int64_t R, int64_t C) {
  FSDP_RECORD(layernorm_backward, dx, dweight, dbias, dout, x, weight, mean, rstd, R, C);
}
void GraphedKernels::add_bias_residual(const TensorView& h, const TensorView& proj_bias,
                                       const TensorView& residual, int64_t R, int64_t C) {
  FSDP_RECORD(add_bias_residual, h, proj_bias, residual, R, C);
}
void GraphedKernels::add_layernorm_forward(const TensorView& h, const TensorView& out,
                                           const TensorView& mean, const TensorView& rstd,
                                           const TensorView& residual,
                                           const TensorView& proj_bias, const TensorView& weight,
                                           const TensorView& bias, int64_t R, int64_t C,
                                           float eps) {
  FSDP_RECORD(add_layernorm_forward, h, out, mean, rstd, residual, proj_bias, weight, bias, R, C,
              eps);
}
void GraphedKernels::add_rmsnorm_forward(const TensorView& h, const TensorView& out,
                                         const TensorView& rstd, const TensorView& residual,
                                         const TensorView& proj_bias, const TensorView& weight,
                                         int64_t R, int64_t C, float eps) {
  FSDP_RECORD(add_rmsnorm_forward, h, out, rstd, residual, proj_bias, weight, R, C, eps);
}
void GraphedKernels::gelu_forward(const TensorView& out, const TensorView& x) {
  FSDP_RECORD(gelu_forward, out, x);
}
void GraphedKernels::gelu_backward(const TensorView& dx, const TensorView& x,
                                   const TensorView& dout) {
  FSDP_RECORD(gelu_backward, dx, x, dout);
}
void GraphedKernels::bias_gelu_forward(const TensorView& out, const TensorView& fc,
                                       const TensorView& bias, int64_t R, int64_t C) {
  FSDP_RECORD(bias_gelu_forward, out, fc, bias, R, C);
}
void GraphedKernels::gemm_bias_gelu(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                    const TensorView& A, const TensorView& B,
                                    const TensorView& bias, const TensorView& fc,
                                    const TensorView& out) {
  FSDP_RECORD(gemm_bias_gelu, ta, tb, M, N, K, A, B, bias, fc, out);
}
void GraphedKernels::gelu_bias_backward(const TensorView& dfc, const TensorView& dbias,
                                        const TensorView& fc, const TensorView& dout, int64_t R,
                                        int64_t C) {
  FSDP_RECORD(gelu_bias_backward, dfc, dbias, fc, dout, R, C);
}
void GraphedKernels::gemm_dgelu_bias_grad(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                                          const TensorView& A, const TensorView& B,
                                          const TensorView& fc, const TensorView& dfc,
                                          const TensorView& dbias) {
  FSDP_RECORD(gemm_dgelu_bias_grad, ta, tb, M, N, K, A, B, fc, dfc, dbias);
}
void GraphedKernels::gemm_weight_bias_grad(bool tb, int64_t M, int64_t N, int64_t K,
                                           const TensorView& A, const TensorView& B,
                                           const TensorView& C, const TensorView& dbias) {
  FSDP_RECORD(gemm_weight_bias_grad, tb, M, N, K, A, B, C, dbias);
}
void GraphedKernels::attention_forward(const TensorView& out, const TensorView& lse,
                                       const TensorView& qkv, int64_t B, int64_t T, int64_t C,
                                       int64_t H, const TensorView& doc_start) {
  FSDP_RECORD(attention_forward, out, lse, qkv, B, T, C, H, doc_start);
}
void GraphedKernels::attention_backward(const TensorView& dqkv, const TensorView& dout,
                                        const TensorView& qkv, const TensorView& out,
                                        const TensorView& lse, int64_t B, int64_t T, int64_t C,
                                        int64_t H, const TensorView& doc_start) {
  FSDP_RECORD(attention_backward, dqkv, dout, qkv, out, lse, B, T, C, H, doc_start);
}
void GraphedKernels::cross_entropy_forward_backward(const TensorView& loss,
                                                    const TensorView& logits,
                                                    const TensorView& targets, int64_t R, int64_t V,
                                                    int64_t ld, float grad_scale, float softcap) {
  FSDP_RECORD(cross_entropy_forward_backward, loss, logits, targets, R, V, ld, grad_scale, softcap);
}
void GraphedKernels::cross_entropy_forward(const TensorView& loss, const TensorView& logits,
                                           const TensorView& targets, int64_t R, int64_t V,
                                           int64_t ld, float softcap) {
  FSDP_RECORD(cross_entropy_forward, loss, logits, targets, R, V, ld, softcap);
}
void GraphedKernels::embedding_lookup_forward(const TensorView& out, const TensorView& tokens,
                                              const TensorView& table, int64_t N, int64_t C) {
  FSDP_RECORD(embedding_lookup_forward, out, tokens, table, N, C);
}
void GraphedKernels::embedding_lookup_backward(const TensorView& dtable, const TensorView& dout,
                                               const TensorView& tokens, int64_t N, int64_t C) {
  FSDP_RECORD(embedding_lookup_backward, dtable, dout, tokens, N, C);
}
void GraphedKernels::rmsnorm_forward(const TensorView& out, const TensorView& rstd,
                                     const TensorView& x, const TensorView& weight, int64_t R,
                                     int64_t C, float eps) {
  FSDP_RECORD(rmsnorm_forward, out, rstd, x, weight, R, C, eps);
}
void GraphedKernels::rmsnorm_backward(const TensorView& dx, const TensorView& dweight,
                                      const TensorView& dout, const TensorView& x,
                                      const TensorView& weight, const TensorView& rstd, int64_t R,
                                      int64_t C) {
  FSDP_RECORD(rmsnorm_backward, dx, dweight, dout, x, weight, rstd, R, C);
}
void GraphedKernels::relu_forward(const TensorView& out, const TensorView& x) {
  FSDP_RECORD(relu_forward, out, x);
}
void GraphedKernels::relu_backward(const TensorView& dx, const TensorView& x,
                                   const TensorView& dout) {
  FSDP_RECORD(relu_backward, dx, x, dout);
}
void GraphedKernels::gemm_relu(bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                               const TensorView& A, const TensorView& B, const TensorView& out) {
  FSDP_RECORD(gemm_relu, ta, tb, M, N, K, A, B, out);
}
void GraphedKernels::mul(const TensorView& out, const TensorView& a, const TensorView& b) {
  FSDP_RECORD(mul, out, a, b);
}
void GraphedKernels::geglu_forward(const TensorView& out, const TensorView& gate,
                                   const TensorView& up) {
  FSDP_RECORD(geglu_forward, out, gate, up);
}
void GraphedKernels::geglu_backward(const TensorView& dgate, const TensorView& dup,
                                    const TensorView& dout, const TensorView& gate,
                                    const TensorView& up) {
  FSDP_RECORD(geglu_backward, dgate, dup, dout, gate, up);
}
void GraphedKernels::position_bias_forward(const TensorView& bias, const TensorView& table,
                                           const TensorView& buckets, int64_t H, int64_t Tq,
                                           int64_t Tk) {
  FSDP_RECORD(position_bias_forward, bias, table, buckets, H, Tq, Tk);
}
void GraphedKernels::position_bias_backward(const TensorView& dtable, const TensorView& dbias,
                                            const TensorView& buckets, int64_t H, int64_t Tq,
                                            int64_t Tk) {
  FSDP_RECORD(position_bias_backward, dtable, dbias, buckets, H, Tq, Tk);
}
void GraphedKernels::mha_forward(const TensorView& out, const TensorView& lse,
                                 const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& bias, const TensorView& key_mask, int64_t B,
                                 int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                                 bool causal) {
  FSDP_RECORD(mha_forward, out, lse, q, k, v, bias, key_mask, B, Tq, Tk, H, D, scale, causal);
}
void GraphedKernels::mha_backward(const TensorView& dq, const TensorView& dk,
                                  const TensorView& dv, const TensorView& dbias,
                                  const TensorView& dout, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& lse,
                                  const TensorView& bias, const TensorView& key_mask, int64_t B,
                                  int64_t Tq, int64_t Tk, int64_t H, int64_t D, float scale,
                                  bool causal) {
  FSDP_RECORD(mha_backward, dq, dk, dv, dbias, dout, q, k, v, out, lse, bias, key_mask, B, Tq,
              Tk, H, D, scale, causal);
}
void GraphedKernels::rope_forward(const TensorView& out, const TensorView& x,
                                  const TensorView& cos, const TensorView& sin, int64_t B,
                                  int64_t T, int64_t H, int64_t D, int64_t R) {
  FSDP_RECORD(rope_forward, out, x, cos, sin, B, T, H, D, R);
}
void GraphedKernels::rope_backward(const TensorView& dx, const TensorView& dout,
                                   const TensorView& cos, const TensorView& sin, int64_t B,
                                   int64_t T, int64_t H, int64_t D, int64_t R) {
  FSDP_RECORD(rope_backward, dx, dout, cos, sin, B, T, H, D, R);
}
void GraphedKernels::swiglu_forward(const TensorView& out, const TensorView& gate,
                                    const TensorView& up) {
  FSDP_RECORD(swiglu_forward, out, gate, up);
}
void GraphedKernels::swiglu_backward(const TensorView& dgate, const TensorView& dup,
                                     const TensorView& dout, const TensorView& gate,
                                     const TensorView& up) {
  FSDP_RECORD(swiglu_backward, dgate, dup, dout, gate, up);
}
void GraphedKernels::gqa_attention_forward(const TensorView& out, const TensorView& lse,
                                           const TensorView& q, const TensorView& k,
                                           const TensorView& v, int64_t B, int64_t T, int64_t H,
                                           int64_t Hkv, int64_t D, float scale, int64_t window,
                                           float softcap, const TensorView& doc_start) {
  FSDP_RECORD(gqa_attention_forward, out, lse, q, k, v, B, T, H, Hkv, D, scale, window, softcap,
              doc_start);
}
void GraphedKernels::gqa_attention_backward(const TensorView& dq, const TensorView& dk,
                                            const TensorView& dv, const TensorView& dout,
                                            const TensorView& q, const TensorView& k,
                                            const TensorView& v, const TensorView& out,
                                            const TensorView& lse, int64_t B, int64_t T, int64_t H,
                                            int64_t Hkv, int64_t D, float scale, int64_t window,
                                            float softcap, const TensorView& doc_start) {
  FSDP_RECORD(gqa_attention_backward, dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D, scale,
              window, softcap, doc_start);
}
void GraphedKernels::moe_router_forward(const TensorView& idx, const TensorView& weights,
                                        const TensorView& logits, int64_t R, int64_t E, int64_t K,
                                        bool normalize) {
  FSDP_RECORD(moe_router_forward, idx, weights, logits, R, E, K, normalize);
}
void GraphedKernels::moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                                         const TensorView& logits, const TensorView& idx,
                                         int64_t R, int64_t E, int64_t K, bool normalize) {
  FSDP_RECORD(moe_router_backward, dlogits, dweights, logits, idx, R, E, K, normalize);
}
void GraphedKernels::strided_copy(const TensorView& dst, const Strided& dst_at,
                                  const TensorView& src, const Strided& src_at, int64_t R,
                                  int64_t G, int64_t W, bool accumulate) {
  FSDP_RECORD(strided_copy, dst, dst_at, src, src_at, R, G, W, accumulate);
}
void GraphedKernels::causal_conv1d_forward(const TensorView& out, const TensorView& x,
                                           const TensorView& weight, int64_t B, int64_t T,
                                           int64_t C, int64_t K, const TensorView& doc_start) {
  FSDP_RECORD(causal_conv1d_forward, out, x, weight, B, T, C, K, doc_start);
}
void GraphedKernels::causal_conv1d_backward(const TensorView& dx, const TensorView& dweight,
                                            const TensorView& dout, const TensorView& x,
                                            const TensorView& weight, int64_t B, int64_t T,
                                            int64_t C, int64_t K, const TensorView& doc_start) {
  FSDP_RECORD(causal_conv1d_backward, dx, dweight, dout, x, weight, B, T, C, K, doc_start);
}
void GraphedKernels::gated_delta_rule_forward(const TensorView& out, const TensorView& qkv,
                                              const TensorView& a, const TensorView& b,
                                              const TensorView& A_log, const TensorView& dt_bias,
                                              int64_t B, int64_t T, int64_t Hk, int64_t Hv,
                                              int64_t Dk, int64_t Dv, const TensorView& doc_start) {
  FSDP_RECORD(gated_delta_rule_forward, out, qkv, a, b, A_log, dt_bias, B, T, Hk, Hv, Dk, Dv,
              doc_start);
}
void GraphedKernels::gated_delta_rule_backward(
    const TensorView& dqkv, const TensorView& da, const TensorView& db, const TensorView& dA_log,
    const TensorView& ddt_bias, const TensorView& dout, const TensorView& qkv,
    const TensorView& a, const TensorView& b, const TensorView& A_log, const TensorView& dt_bias,
    int64_t B, int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv,
    const TensorView& doc_start) {
  FSDP_RECORD(gated_delta_rule_backward, dqkv, da, db, dA_log, ddt_bias, dout, qkv, a, b, A_log,
              dt_bias, B, T, Hk, Hv, Dk, Dv, doc_start);
}
void GraphedKernels::sigmoid_gate_forward(const TensorView& out, const TensorView& x,
                                          const TensorView& gate) {
  FSDP_RECORD(sigmoid_gate_forward, out, x, gate);
}
void GraphedKernels::sigmoid_gate_backward(const TensorView& dx, const TensorView& dgate,
                                           const TensorView& dout, const TensorView& x,
                                           const TensorView& gate) {
  FSDP_RECORD(sigmoid_gate_backward, dx, dgate, dout, x, gate);
}
void GraphedKernels::clamped_swiglu_forward(const TensorView& out, const TensorView& gate_up,
                                            float alpha, float limit) {
  FSDP_RECORD(clamped_swiglu_forward, out, gate_up, alpha, limit);
}
void GraphedKernels::clamped_swiglu_backward(const TensorView& dgate_up, const TensorView& dout,
                                             const TensorView& gate_up, float alpha,
                                             float limit) {
  FSDP_RECORD(clamped_swiglu_backward, dgate_up, dout, gate_up, alpha, limit);
}
void GraphedKernels::attention_sink_forward(const TensorView& out, const TensorView& lse,
                                            const TensorView& sinks, int64_t B, int64_t T,
                                            int64_t H, int64_t D) {
  FSDP_RECORD(attention_sink_forward, out, lse, sinks, B, T, H, D);
}
void GraphedKernels::attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                                             const TensorView& out, const TensorView& lse,
                                             const TensorView& sinks, int64_t B, int64_t T,
                                             int64_t H, int64_t D) {
  FSDP_RECORD(attention_sink_backward, dsinks, dout, out, lse, sinks, B, T, H, D);
}
void GraphedKernels::moe_sigmoid_router_forward(const TensorView& idx, const TensorView& weights,
                                                const TensorView& logits, const TensorView& bias,
                                                int64_t R, int64_t E, int64_t K,
                                                const SigmoidRouting& g) {
  FSDP_RECORD(moe_sigmoid_router_forward, idx, weights, logits, bias, R, E, K, g);
}
void GraphedKernels::moe_sigmoid_router_backward(const TensorView& dlogits,
                                                 const TensorView& dweights,
                                                 const TensorView& logits, const TensorView& idx,
                                                 int64_t R, int64_t E, int64_t K,
                                                 const SigmoidRouting& g) {
  FSDP_RECORD(moe_sigmoid_router_backward, dlogits, dweights, logits, idx, R, E, K, g);
}
void GraphedKernels::moe_combine_forward(const TensorView& out, const TensorView& rows,
                                         const TensorView& weights, const TensorView& slot,
                                         int64_t R, int64_t K, int64_t C) {
  FSDP_RECORD(moe_combine_forward, out, rows, weights, slot, R, K, C);
}
void GraphedKernels::moe_combine_backward(const TensorView& drows, const TensorView& dweights,
                                          const TensorView& dout, const TensorView& rows,
                                          const TensorView& weights, const TensorView& slot,
                                          int64_t R, int64_t K, int64_t C) {
  FSDP_RECORD(moe_combine_backward, drows, dweights, dout, rows, weights, slot, R, K, C);
}
void GraphedKernels::moe_router_prob_sums(const TensorView& psum, const TensorView& logits,
                                          int64_t R, int64_t E) {
  FSDP_RECORD(moe_router_prob_sums, psum, logits, R, E);
}
void GraphedKernels::moe_aux_loss(const TensorView& loss, const TensorView& counts,
                                  const TensorView& psum, int64_t E, double alpha) {
  FSDP_RECORD(moe_aux_loss, loss, counts, psum, E, alpha);
}
void GraphedKernels::moe_aux_loss_backward(const TensorView& dlogits, const TensorView& logits,
                                           const TensorView& dprobs, int64_t R, int64_t E) {
  FSDP_RECORD(moe_aux_loss_backward, dlogits, logits, dprobs, R, E);
}
void GraphedKernels::moe_shared_gate_forward(const TensorView& out, const TensorView& shared,
                                             const TensorView& logit, int64_t R, int64_t C) {
  FSDP_RECORD(moe_shared_gate_forward, out, shared, logit, R, C);
}
void GraphedKernels::moe_shared_gate_backward(const TensorView& dshared, const TensorView& dlogit,
                                              const TensorView& dout, const TensorView& shared,
                                              const TensorView& logit, int64_t R, int64_t C) {
  FSDP_RECORD(moe_shared_gate_backward, dshared, dlogit, dout, shared, logit, R, C);
}

#undef FSDP_RECORD

}  // namespace fsdp
