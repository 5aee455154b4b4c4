// fsdp/fsdp/param_group.hpp: one FSDP unit (PyTorch FSDP2's FSDPParamGroup): a FlatParameter
// with this rank's fp32 shard and gradient shard, its state machine (TrainingState,
// ShardedState, GradState), and the unit's own operations on them: unshard (the all-gather,
// after the upload from host memory with CPU offload), reshard (free the full buffer), reduce
// (the gradient's reduce-scatter / all-reduce, or the offload accumulator and host staging)
// and their completion, with the streams and events those need.
//
// A group never decides when: the engine (fsdp/fsdp/engine.hpp, FSDP2's FSDPState role) calls
// these in the order its schedule (execution order, prefetch, limit_all_gathers, the
// gradient accumulation boundary, the host's staged adds) says. The strategies, dtypes and
// offload semantics are the engine header's; this file holds the per-unit mechanics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/profiler.hpp"
#include "fsdp/fsdp/collectives.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "fsdp/fsdp/step_timer.hpp"

namespace fsdp {

// Where a unit is in the current pass (PyTorch FSDP2's TrainingState, per FSDPParamGroup).
// Legal transitions, by hook (anything else throws fsdp::Error naming the unit, the hook and
// both states):
//   IDLE          -> FORWARD        pre_forward of the unit's first module this pass
//   FORWARD       -> FORWARD        pre_forward / post_forward of its other modules
//   FORWARD       -> IDLE           post_forward of its last module (forward complete)
//   IDLE          -> PRE_BACKWARD   pre_backward of its first module (training, forward
//                                   complete): zeroed gradient storage is provided
//   PRE_BACKWARD  -> PRE_BACKWARD   pre_backward / post_backward of its other modules
//   PRE_BACKWARD  -> POST_BACKWARD  post_backward of its last module: the gradient reduction
//                                   is issued and the unit resharded
//   any           -> IDLE           end_step (a pass cut short included)
// begin_step requires every unit IDLE (the previous pass was ended with end_step).
// param() is legal while the unit is unsharded; grad() only in PRE_BACKWARD.
enum class TrainingState {
  IDLE,           // outside the unit's forward and backward (FSDP2 IDLE)
  FORWARD,        // between its first pre_forward and its last post_forward (FSDP2 FORWARD)
  PRE_BACKWARD,   // in its backward: gradients are being written (FSDP2 PRE_BACKWARD)
  POST_BACKWARD,  // its backward is done and its reduction issued, until end_step (FSDP2
                  // POST_BACKWARD, which FSDP2 leaves at the root's final callback)
};
template <>
struct EnumNames<TrainingState> {
  static constexpr EnumName<TrainingState> table[] = {
      {TrainingState::IDLE, "IDLE"},
      {TrainingState::FORWARD, "FORWARD"},
      {TrainingState::PRE_BACKWARD, "PRE_BACKWARD"},
      {TrainingState::POST_BACKWARD, "POST_BACKWARD"}};
};

// Whether a unit's full parameter buffer exists (PyTorch FSDP2's ShardedState; FSDP2's
// SHARDED_POST_FORWARD, resharding to a smaller group after forward, is not modelled).
//   SHARDED   -> UNSHARDED  the all-gather is issued (unshard; the Work may still be in
//                           flight: FSDP2 flips at wait_for_unshard, here the pending Work
//                           is kept with the unit and waited before the first use)
//   UNSHARDED -> SHARDED    reshard (the full buffer is freed; a pending gather is waited)
// Both are idempotent (unsharding an unsharded unit or resharding a sharded one does
// nothing), as FSDP2's unshard / reshard are. A unit whose shard is the full parameter (one
// shard, fp32 param_dtype) stays SHARDED: the model reads the shard itself.
enum class ShardedState {
  SHARDED,    // only this rank's fp32 shard exists (FSDP2 SHARDED)
  UNSHARDED,  // the param_dtype full buffer exists and is (being) gathered (FSDP2 UNSHARDED)
};
template <>
struct EnumNames<ShardedState> {
  static constexpr EnumName<ShardedState> table[] = {{ShardedState::SHARDED, "SHARDED"},
                                                     {ShardedState::UNSHARDED, "UNSHARDED"}};
};

// Whether a unit's fp32 gradient shard holds gradients (FSDP2: sharded_param.grad is None or
// not; foreach_reduce then assigns or accumulates).
//   EMPTY       -> ACCUMULATED  the unit's reduction is issued (or a test injects a value)
//   any         -> EMPTY        zero_grad (the shard is set to 0)
// EMPTY lets an fp32 reduce-scatter write the shard directly (its 0 + x is exact).
enum class GradState {
  EMPTY,        // the shard is 0
  ACCUMULATED,  // the shard holds gradients of one or more steps
};
template <>
struct EnumNames<GradState> {
  static constexpr EnumName<GradState> table[] = {{GradState::EMPTY, "EMPTY"},
                                                  {GradState::ACCUMULATED, "ACCUMULATED"}};
};

// What every param group of one engine shares. Owned by the engine, which outlives its
// groups; timer and profiler may change between steps (the engine's setters).
struct ParamGroupContext {
  DeviceRuntime* be = nullptr;         // the compute backend: full buffers, collectives
  DeviceRuntime* sh = nullptr;         // the shards' runtime: be, or the host (cpu_offload)
  MixedPrecisionConfig mp;             // param_dtype / reduce_dtype
  Communicator* shard = nullptr;       // the group the parameters shard over
  Communicator* replicate = nullptr;   // the group gradients are then averaged over (HSDP)
  Stream* reduce_stream = nullptr;     // HSDP's all-reduces; offload's gradient copies
  Stream* copy_stream = nullptr;       // offload: the parameter uploads; else null
  // fsdp.offload_optimizer: each unit's param_dtype shard stays on the device between
  // steps (refresh_copies uploads it once per update); unshards gather from it.
  bool resident = false;
  // Offload without loss scaling: a gradient shard that is exactly a device buffer copied
  // across (the local accumulator) gets its squared norm computed on the device too, so the
  // host's clip need not read it again (FsdpParamGroup::grad_norm_sq).
  bool device_norms = false;
  StepTimer* timer = nullptr;          // comm waits are Phase::comm_wait (null: none)
  Profiler* profiler = nullptr;        // issue / wait host ranges (null: none)
  bool offloaded() const { return sh != be; }
};

class FsdpParamGroup {
 public:
  // Unit `index` (0: the root) with `layout` (layout.num_shards == ctx.shard->size()):
  // allocates its fp32 shard and gradient shard on ctx.sh (MemCategory::sharded_params,
  // grads) and, offloaded with a 16-bit param_dtype, the host param_dtype copy the uploads
  // read (MemCategory::comm_buffers of the host). initialise: the gradient shard is zeroed
  // (the shard itself is filled by init_shard or its owner).
  FsdpParamGroup(int index, FlatParamLayout layout, const ParamGroupContext& ctx,
                 bool initialise);
  ~FsdpParamGroup();
  FsdpParamGroup(const FsdpParamGroup&) = delete;
  FsdpParamGroup& operator=(const FsdpParamGroup&) = delete;

  // ---- structure ----
  int index() const { return index_; }
  const ParamGroupContext& context() const { return ctx_; }
  const FlatParamLayout& layout() const { return layout_; }
  const std::string& name() const { return layout_.unit_name; }
  // The modules (ModuleDecl indices) of the unit, in declaration order.
  const std::vector<int>& modules() const { return modules_; }
  void add_module(int module) { modules_.push_back(module); }
  DeviceBuffer& shard_param() { return shard_param_; }  // fp32 [shard_numel], ctx.sh
  DeviceBuffer& shard_grad() { return shard_grad_; }    // fp32 [shard_numel], ctx.sh
  // A full buffer is needed when the unit is sharded, computes in another dtype than fp32,
  // or its shard is in host memory (offload); else the model reads and writes the shard.
  bool needs_full() const;

  // ---- initialisation ----
  // Fills this rank's shard (shard ctx.shard->rank()): element k of a parameter is
  // init(seed, key(name), k) whatever the world size (counter-based RNG, core/rng.hpp), so
  // any thread count gives the same values; vocabulary padding rows are 0.
  void init_shard(uint64_t seed);
  // Offload, after this rank's shard was written: casts the fp32 shard into the host
  // param_dtype copy (if any) and, resident, enqueues its upload into the device shard on
  // the copy stream (after the compute stream's work so far, which may still gather from
  // it); the next unshard's compute stream waits for that upload. The caller makes sure no
  // upload still reads the host copy. No-op without offload.
  void refresh_copies();
  // The host param_dtype copy ([shard_numel] bf16 or fp16 in ctx.sh's memory) that the
  // uploads read, which an update writes in its own pass instead of a cast
  // (Optimizer::step_shard's compute_copy); an empty view when the unit has none (not
  // offloaded, or an fp32 param_dtype).
  TensorView host_copy() const { return host_param_ ? host_param_.view() : TensorView{}; }
  // refresh_copies' host half after an update that wrote host_copy() itself (or where there
  // is none): no device call, so update_shards' host thread runs it; the resident upload it
  // leaves due is enqueued by the next unshard (the thread that owns the device's streams).
  void host_copy_written() { upload_due_ = static_cast<bool>(device_param_); }

  // ---- state (see TrainingState, ShardedState, GradState) ----
  TrainingState training_state() const { return training_; }
  ShardedState sharded_state() const { return sharded_; }
  GradState grad_state() const { return grad_; }
  // The pass's start: the module counts return to 0. Throws fsdp::Error unless IDLE.
  void begin_pass();
  // The pass's end (a cut-short one included): the full gradient is dropped, IDLE.
  void end_pass();

  // ---- module hooks: the transitions above, counted per module ----
  // Each throws fsdp::Error on an illegal transition, naming the unit and `hook`.
  // pre_forward: true when this is the unit's first module this pass (IDLE -> FORWARD).
  bool pre_forward();
  // post_forward: true when it was the unit's last module (the unit's forward is done).
  bool post_forward();
  // pre_backward (training pass): true for the unit's first module (IDLE -> PRE_BACKWARD).
  // Throws fsdp::Error in an evaluation pass (`training` false) or before the unit's
  // forward completed.
  bool pre_backward(bool training);
  // The zeroed param_dtype full gradient the unit's backward writes (if needs_full()),
  // MemCategory::unsharded_grads: after the first pre_backward's unshard has been waited.
  void provide_grad_storage();
  // post_backward: true when it was the unit's last module (-> POST_BACKWARD).
  bool post_backward();
  bool forward_started() const { return fwd_done_ > 0; }
  bool backward_started() const { return bwd_done_ > 0; }

  // ---- unshard / reshard ----
  // Issues the unshard (foreach_all_gather; offloaded: after the upload of the host copy,
  // both on the copy stream); UNSHARDED. No-op if already UNSHARDED or !needs_full().
  // Offloaded, throws fsdp::Error unless `host_copy_ready` (the shards were written through
  // FsdpEngine::write_shards / update_shards, which refresh the copies). Resident
  // (offload_optimizer), the device shard is first refreshed if a cast left it due, unless
  // `refresh` is false (a delayed update's host thread may be writing the host copy: the
  // gather then sends the device shard from before it).
  void unshard(bool host_copy_ready, bool refresh = true);
  // The compute stream waits for the pending all-gather (and offloaded, the upload): a
  // Phase::comm_wait, ranged "all_gather wait unit U (name)".
  void wait_for_unshard();
  // Frees the full parameter buffer (after a pending gather, if any); SHARDED.
  void reshard();

  // ---- gradient reduction ----
  // Issues the unit's reduction at its post_backward (GradState -> ACCUMULATED):
  //  - !needs_full(): shard_grad holds the gradient; the replica all-reduce if any;
  //  - offloaded, between accumulation boundaries (`boundary` false), or at the boundary of
  //    a local unit (nothing communicated) that already has an accumulator: into the fp32
  //    device accumulator (allocated zeroed at first use, MemCategory::grads), which at the
  //    boundary is then staged to the host;
  //  - else foreach_reduce into the shard (offloaded: staged to host memory, the
  //    accumulator of earlier micro-batches staged first).
  // Offloaded, each host copy for shard_grad goes to `to_host` as soon as it is issued (the
  // earlier micro-batches' accumulator before this reduction is issued): the caller hands
  // each, in that order, to add_staged once its `copied` event completes. The first copy
  // since the shard was zeroed or discarded writes it: an fp32 one lands in it (the device
  // copies into the host shard, nothing for the host to add), a 16-bit one is cast into it.
  using StagedSink = std::function<void(HostStaging)>;
  void reduce(bool boundary, const StagedSink& to_host);
  // Waits for the pending reduce-scatter (a Phase::comm_wait).
  void wait_reduce_scatter();
  // Waits for the pending all-reduce and adds the reduced gradient (if it did not land in
  // place) into the accumulator or shard on the compute stream.
  void finish_reduction();
  // refresh_copies' device half (offload_optimizer): the upload of the host copy into the
  // device shard on the copy stream, after the compute stream's work so far, if a refresh or
  // an update since the last one left it due; nothing otherwise. Main thread only (it reads
  // what the host thread's update wrote: the engine waits for that write first).
  void upload_resident();
  // Offload (ctx.device_norms): when the gradient shard is exactly what the device copied
  // across (the local accumulator's landing, nothing added since), `value` = its squared
  // norm in fp64, summed on the device as DeviceRuntime::squared_norm sums it (what the
  // host's squared_norm of the shard would add, bit for bit on the CPU backend); blocks on
  // the compute stream. false (value untouched) otherwise.
  bool grad_norm_sq(double& value);
  // Offload: a host copy from reduce() whose `copied` event has completed goes into the
  // gradient shard: nothing if it landed there, a cast if it is the first since the shard
  // held nothing (`assign`), else ctx.sh->axpy (the sum the device path makes). Host work only.
  void add_staged(const HostStaging& copy);
  // Sets the gradient shard to 0 and drops the accumulator; EMPTY.
  void zero_grad();
  // The host half of zero_grad after a completed step (the accumulator was staged at the
  // boundary, so there is none): the gradient shard to 0, EMPTY. No device call, so the
  // engine's host thread may run it.
  void zero_grad_shard();
  // As zero_grad_shard without writing the shard: its contents are dead and read as 0. The
  // next reduction's first host copy writes every element (lands or is cast), so the 4 bytes
  // a parameter of zeroes are never written; settle_grad writes them for a shard that no
  // reduction wrote. Offload's host thread calls this after each update.
  void discard_grad_shard();
  // Writes the zeros a discarded gradient shard stands for, if nothing wrote it since (a unit
  // without a backward this step); nothing otherwise. Host work only. The engine calls it at
  // the accumulation boundary's end_step and before anyone reads the shard.
  void settle_grad();
  // Test hook: +inf into element 0 of the gradient shard; ACCUMULATED.
  void inject_nonfinite_grad();

  // ---- views the model reads and writes (ModuleHooks::param / grad) ----
  // [offset, offset + shape.numel()) of the full parameter (or of the shard when
  // !needs_full()). Throws fsdp::Error while SHARDED with a full buffer needed.
  TensorView param(int64_t offset, const Shape& shape);
  // The same of the gradient; throws fsdp::Error outside PRE_BACKWARD.
  TensorView grad(int64_t offset, const Shape& shape);

  // The collective trace of this unit (profiler ranges named "<op> <stage> unit U (name)").
  CollectiveTrace trace() const;

 private:
  void transition(TrainingState from, TrainingState to, const char* hook);
  HostStaging stage_accumulator();

  int index_;
  FlatParamLayout layout_;
  const ParamGroupContext& ctx_;
  std::vector<int> modules_;
  DeviceBuffer shard_param_;      // fp32 [shard_numel], MemCategory::sharded_params (ctx.sh)
  DeviceBuffer shard_grad_;       // fp32 [shard_numel], MemCategory::grads (ctx.sh)
  DeviceBuffer full_param_;       // param_dtype [padded_numel] while unsharded (if needs_full)
  DeviceBuffer full_grad_;        // param_dtype [padded_numel] during backward (if needs_full)
  std::unique_ptr<Work> gather_;  // pending all-gather into full_param
  // cpu_offload: full_param is filled once `ready` completes (the upload, then the gather).
  std::shared_ptr<Event> ready_;
  // cpu_offload with a 16-bit param_dtype: the shard cast to param_dtype once per update,
  // what each unshard (resident: each update) uploads: [shard_numel], MemCategory::comm_buffers
  // of the host.
  DeviceBuffer host_param_;
  // fsdp.offload_optimizer: this rank's param_dtype shard on the device, [shard_numel],
  // MemCategory::sharded_params; `uploaded` completes when the last refresh has landed.
  DeviceBuffer device_param_;
  std::shared_ptr<Event> uploaded_;
  bool upload_due_ = false;  // resident: the host copy changed since the last upload
  // cpu_offload between gradient accumulation boundaries: the reduced gradients of the
  // step's micro-batches so far, fp32 [shard_numel] on the device (MemCategory::grads).
  DeviceBuffer grad_acc_;
  // Gradient reduction in flight (issued at post_backward, completed by the engine's
  // end_step): reduced (reduce_dtype [shard_numel], unless the result is shard_grad) and
  // its Works.
  ReduceResult reduction_;
  TrainingState training_ = TrainingState::IDLE;
  ShardedState sharded_ = ShardedState::SHARDED;
  GradState grad_ = GradState::EMPTY;
  // Offload: what shard_grad holds. An accumulator may hold micro-batches meanwhile: grad_ is
  // then ACCUMULATED while the shard is still zero or discarded.
  enum class ShardGrad {
    zero,         // zeros written: the next host copy writes it (lands or is cast)
    discarded,    // reads as zeros, not written (settle_grad writes them if no copy comes)
    accumulator,  // exactly the local accumulator that landed in it, its squared norm in
                  // norm_sq_ (ctx.device_norms)
    sum,          // anything else
  };
  ShardGrad shard_grad_holds_ = ShardGrad::zero;
  bool shard_unwritten() const {  // no host copy since it was zeroed or discarded
    return shard_grad_holds_ == ShardGrad::zero || shard_grad_holds_ == ShardGrad::discarded;
  }
  DeviceBuffer norm_sq_;  // ctx.device_norms: fp64 [1] on the device
  int fwd_done_ = 0;  // modules of this unit done in forward this pass
  int bwd_done_ = 0;  // modules of this unit done in backward this pass
};

}  // namespace fsdp
