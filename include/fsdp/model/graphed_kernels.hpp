// fsdp/model/graphed_kernels.hpp: train.cuda_graphs, the model's kernels captured once and
// replayed as graphs (CUDA Graphs; issue 32 item 2), segment by segment.
//
// A training step cannot be one graph: between a unit's kernels the FSDP engine's hooks wait
// on all-gathers, record events, take blocks from the caching allocator and decide on the
// host (fsdp/fsdp/engine.hpp). What lies between two hooks is a run of kernels only, and that
// is what GraphedKernels graphs. It is a Kernels decorator the model is built on:
//  - each kernel call is recorded (an op id, its pointers, dtypes, shapes and scalars)
//    instead of enqueued;
//  - the segment ends at the next hook (SegmentHooks wraps the engine's ModuleHooks), at any
//    call of the model into the runtime (runtime() is a DeviceRuntime that ends the segment
//    before each call), and at flush(), which the trainer calls after each model call;
//  - at its end the segment's record is looked up: a graph captured from an identical record
//    (every pointer and scalar equal) is launched; a record seen once before is captured
//    (Kernels::capture_graph) and launched; otherwise the calls run one by one, as without
//    graphs. So a graph only ever runs on the memory and values it was captured with, and a
//    changed pointer (a unit unsharded into another block, a new batch shape, T5's loss scale
//    over a padded batch) falls back to eager for that segment instead of replaying stale
//    arguments. Capturing at the second sighting is PyTorch's warm-up before capture: the
//    first run finds the cuBLASLt algorithms and kernel attributes outside capture.
// On CUDA the graphs are cudaGraphExec_t's launched on the compute stream, their kernel
// scratch in an arena all graphs share (src/cuda/cuda_backend.cpp, graph_scratch); on the CPU
// the twin replays the recorded calls, so the CPU tests check the segmenting, the cache and
// the ordering against the runtime (graphed == eager bit for bit). Replays need the caching
// allocator to hand a unit the same blocks each step: the trainer sets its ordered reuse
// (DeviceRuntime::set_ordered_reuse). Not thread-safe: one per model, driven from the thread
// that runs it. Errors: a kernel's fsdp::Error surfaces at the flush that runs it (a hook, a
// runtime call or flush()); a failed capture does not throw (Options::on_capture_failure).
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/fsdp/module.hpp"

namespace fsdp {

// What the segments did since construction (the run's last `cuda_graphs:` line and
// TrainResult::graphs).
struct KernelGraphStats {
  int64_t segments = 0;  // non-empty segments ended
  int64_t replays = 0;   // segments launched as a graph captured earlier
  int64_t captures = 0;  // graphs captured (each launched at once)
  int64_t eager = 0;     // segments run call by call (first sighting, or too short)
  int64_t calls = 0;     // kernel calls recorded
  int64_t graphed_calls = 0;  // of those, run inside a graph (replayed or just captured)
  int64_t evictions = 0;      // graphs dropped to stay within max_graphs
  bool capture_failed = false;  // a capture threw: every segment since ran eagerly
};

class GraphedKernels final : public Kernels {
 public:
  struct Options {
    int64_t min_calls = 2;      // shorter segments run eagerly (a graph saves nothing there)
    int64_t max_graphs = 1024;  // graphs kept; the least recently launched goes first
    // Told, once, why a capture failed (Kernels::capture_graph threw fsdp::Error): that
    // segment and every later one then run eagerly (torch.compile's cudagraph trees also fall
    // back to eager), so the run goes on, bit for bit the same. Null: not told.
    std::function<void(const std::string&)> on_capture_failure;
  };
  // `inner`: the backend's kernels, which run everything (it must outlive this object).
  explicit GraphedKernels(Kernels& inner);
  GraphedKernels(Kernels& inner, Options options);
  ~GraphedKernels() override;
  GraphedKernels(const GraphedKernels&) = delete;
  GraphedKernels& operator=(const GraphedKernels&) = delete;

  // Ends the current segment: launches its calls (a graph or one by one). The pending record
  // is taken first, so an exception from a call leaves no segment pending.
  void flush();
  // Hooks that end the segment before each pre/post hook of `inner` (param/grad/training
  // pass through). The model's hooks while graphing.
  ModuleHooks& hooks(ModuleHooks& inner);
  const KernelGraphStats& stats() const { return stats_; }
  int64_t graphs() const { return static_cast<int64_t>(lru_.size()); }

  // ---- Kernels: record (see fsdp/backend/kernels.hpp for each call's contract) ----
  DeviceRuntime& runtime() override;
  std::unique_ptr<KernelGraph> capture_graph(std::function<void()> enqueue) override;
  void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
            const TensorView& A, const TensorView& B, float beta, const TensorView& C) override;
  void add_bias(const TensorView& out, const TensorView& bias, int64_t R, int64_t C) override;
  void gemm_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                 const TensorView& B, const TensorView& bias, const TensorView& C) override;
  void bias_backward(const TensorView& dbias, const TensorView& dout, int64_t R,
                     int64_t C) override;
  void add(const TensorView& out, const TensorView& a, const TensorView& b) override;
  void scale(const TensorView& x, float alpha) override;
  void embedding_forward(const TensorView& out, const TensorView& tokens, const TensorView& wte,
                         const TensorView& wpe, int64_t B, int64_t T, int64_t C) override;
  void embedding_backward(const TensorView& dwte, const TensorView& dwpe, const TensorView& dout,
                          const TensorView& tokens, int64_t B, int64_t T, int64_t C) override;
  void layernorm_forward(const TensorView& out, const TensorView& mean, const TensorView& rstd,
                         const TensorView& x, const TensorView& weight, const TensorView& bias,
                         int64_t R, int64_t C, float eps) override;
  void layernorm_backward(const TensorView& dx, const TensorView& dweight,
                          const TensorView& dbias, const TensorView& dout, const TensorView& x,
                          const TensorView& weight, const TensorView& mean,
                          const TensorView& rstd, int64_t R, int64_t C) override;
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
  void gemm_bias_gelu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                      const TensorView& A, const TensorView& B, const TensorView& bias,
                      const TensorView& fc, const TensorView& out) override;
  void gelu_bias_backward(const TensorView& dfc, const TensorView& dbias, const TensorView& fc,
                          const TensorView& dout, int64_t R, int64_t C) override;
  void gemm_dgelu_bias_grad(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                            const TensorView& A, const TensorView& B, const TensorView& fc,
                            const TensorView& dfc, const TensorView& dbias) override;
  void gemm_weight_bias_grad(bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                             const TensorView& B, const TensorView& C,
                             const TensorView& dbias) override;
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
  void gemm_relu(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const TensorView& A,
                 const TensorView& B, const TensorView& out) override;
  void mul(const TensorView& out, const TensorView& a, const TensorView& b) override;
  void geglu_forward(const TensorView& out, const TensorView& gate,
                     const TensorView& up) override;
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
  void rope_forward(const TensorView& out, const TensorView& x, const TensorView& cos,
                    const TensorView& sin, int64_t B, int64_t T, int64_t H, int64_t D,
                    int64_t R) override;
  void rope_backward(const TensorView& dx, const TensorView& dout, const TensorView& cos,
                     const TensorView& sin, int64_t B, int64_t T, int64_t H,
                     int64_t D, int64_t R) override;
  void swiglu_forward(const TensorView& out, const TensorView& gate,
                      const TensorView& up) override;
  void swiglu_backward(const TensorView& dgate, const TensorView& dup, const TensorView& dout,
                       const TensorView& gate, const TensorView& up) override;
  void gqa_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q,
                             const TensorView& k, const TensorView& v, int64_t B, int64_t T,
                             int64_t H, int64_t Hkv, int64_t D, float scale, int64_t window,
                             float softcap, const TensorView& doc_start) override;
  void gqa_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k,
                              const TensorView& v, const TensorView& out, const TensorView& lse,
                              int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D, float scale,
                              int64_t window, float softcap, const TensorView& doc_start) override;
  void moe_router_forward(const TensorView& idx, const TensorView& weights,
                          const TensorView& logits, int64_t R, int64_t E, int64_t K,
                          bool normalize) override;
  void moe_router_backward(const TensorView& dlogits, const TensorView& dweights,
                           const TensorView& logits, const TensorView& idx, int64_t R, int64_t E,
                           int64_t K, bool normalize) override;
  void strided_copy(const TensorView& dst, const Strided& dst_at, const TensorView& src,
                    const Strided& src_at, int64_t R, int64_t G, int64_t W,
                    bool accumulate) override;
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
  void attention_sink_forward(const TensorView& out, const TensorView& lse,
                              const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                              int64_t D) override;
  void attention_sink_backward(const TensorView& dsinks, const TensorView& dout,
                               const TensorView& out, const TensorView& lse,
                               const TensorView& sinks, int64_t B, int64_t T, int64_t H,
                               int64_t D) override;
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

 private:
  class FlushingRuntime;
  class SegmentHooks;
  using Call = std::function<void(Kernels&)>;
  struct Cached {
    uint64_t hash;  // of record: its key in by_hash_
    std::vector<uint64_t> record;
    std::unique_ptr<KernelGraph> graph;
  };
  // Appends one call: its op id and arguments to the record, the call itself to the segment.
  template <class... P, class... A>
  void record(uint64_t op, void (Kernels::*fn)(P...), const A&... args);
  void put(const TensorView& v);
  void put(int64_t v) { pending_.record.push_back(static_cast<uint64_t>(v)); }
  void put(bool v) { pending_.record.push_back(v ? 1 : 0); }
  void put(float v);
  void put(double v) { pending_.record.push_back(std::bit_cast<uint64_t>(v)); }
  void put(const Strided& s) {
    put(s.row);
    put(s.offset);
    put(s.group);
    put(s.col);
  }
  void put(const SigmoidRouting& g) {
    put(g.n_group);
    put(g.topk_group);
    put(g.normalize);
    put(g.scale);
  }
  void run_eager(const std::vector<Call>& calls);

  struct Segment {
    std::vector<uint64_t> record;
    std::vector<Call> calls;
    void clear() {
      record.clear();
      calls.clear();
    }
  };
  Kernels& inner_;
  Options options_;
  std::unique_ptr<FlushingRuntime> runtime_;
  std::unique_ptr<SegmentHooks> hooks_;
  Segment pending_;
  KernelGraphStats stats_;
  // Graphs by their record's hash, most recently launched at the front of lru_.
  std::list<Cached> lru_;
  std::unordered_multimap<uint64_t, std::list<Cached>::iterator> by_hash_;
  std::unordered_set<uint64_t> seen_;  // hashes of records run eagerly once
};

}  // namespace fsdp
