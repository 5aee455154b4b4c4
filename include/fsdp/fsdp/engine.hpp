// fsdp/fsdp/engine.hpp: the FSDP engine: wraps modules into units (one FlatParameter each),
// owns this rank's shards, and schedules unshard (all-gather), reshard (free), gradient
// reduce-scatter / all-reduce and prefetch for each sharding strategy, as PyTorch FSDP does
// (torch.distributed.fsdp, FullyShardedDataParallel; ZeRO, Rajbhandari et al. SC'20):
//
//   strategy            params sharded over   grads reduced over        reshard after fwd
//   FULL_SHARD          world                 reduce-scatter(world)     yes (ZeRO-3)
//   SHARD_GRAD_OP       world                 reduce-scatter(world)     no  (ZeRO-2)
//   NO_SHARD            nobody                all-reduce(world)         -   (DDP)
//   HYBRID_SHARD        shard group           RS(shard) + AR(replicate) yes
//   HYBRID_SHARD_ZERO2  shard group           RS(shard) + AR(replicate) no
//
// (strategy_traits() below is that table, the only place the engine reads it from.)
//
// Mixed precision (torch.distributed.fsdp.MixedPrecision): shards, gradient shards and
// optimizer state are fp32. A unit is unsharded by casting this rank's shard to param_dtype
// into its slot of the full buffer and all-gathering in place; the model computes with
// param_dtype parameters and writes param_dtype gradients; after the unit's backward those
// are cast to reduce_dtype, reduce-scattered with ReduceOp::avg over the shard group
// (all-reduced with avg over the replicate group) and accumulated into the fp32 gradient
// shard. Gradients are averaged over the data-parallel world (all ranks). Where nothing is
// sharded or reduced (world size 1) the param_dtype gradient is added into the fp32 shard as
// soon as the unit's backward ends: no reduce_dtype copy is staged (only a 16-bit
// reduce_dtype other than param_dtype is cast first, one unit at a time, keeping its
// rounding), so comm_buffers is 0 there.
//
// CPU offload (fsdp.cpu_offload; PyTorch's CPUOffload(offload_params=True), DeepSpeed
// ZeRO-Offload): the fp32 shards and gradient shards live in an offload runtime (a CPU
// backend: host memory), and so does the optimizer state the trainer allocates through
// shard_runtime(unit), so the optimizer steps on the host's cores. Every unit then has a full
// buffer on the device.
//  - Parameters: after each write of the shards (update_shards, write_shards) the host
//    casts each written shard to param_dtype once, into a host copy (page-locked on CUDA);
//    each unshard copies that into
//    the unit's slot on the engine's copy stream and issues the all-gather after the copy,
//    so a prefetched unit's upload and gather overlap the current unit's compute.
//  - Gradients: a unit's reduced gradient shard (reduce_dtype, on the device) is copied to
//    the host on the reduction stream as soon as its collectives complete (overlapping the
//    rest of backward on CUDA). The step's first copy into a shard writes it: an fp32 one
//    lands in the host fp32 gradient shard itself (no host pass), a 16-bit one goes to
//    staging and is cast into it; a later one (the boundary's gradient after the
//    accumulator) is staged and added. The host does so a few units later (at most
//    kStagedCopies staged copies wait), the rest in end_step. Copies that land are not
//    waited for by end_step: whoever next touches that shard on the host waits for its own
//    copy (shard_grad, zero_grad, a staged add), and update_shards' host thread writes the
//    units in the order their copies were issued, each once its copy has landed, so the
//    host step overlaps the copies still in flight. update_shards leaves the
//    shards discarded, not zeroed: the next step's first copy overwrites them. Between
//    gradient accumulation boundaries (set_gradient_accumulation_boundary: the micro-batches
//    of a step but the last) the reduced gradients are added into an fp32 accumulator on
//    the device instead, sent to the host once at the boundary: the host adds once per step.
//    Where nothing is communicated (world size 1) the boundary's gradient joins the
//    accumulator on the device too, and only the accumulator is copied; a step of one
//    micro-batch copies its reduce_dtype gradient, as with collectives.
//  - Norms and loss-scale unscaling run on the host shards, their device scalars copied
//    across; the clip coefficient is applied by the host optimizer as it reads each gradient
//    (fsdp/fsdp/grad_clip.hpp).
// The host does the same arithmetic in the same order as the device would on the CPU
// backend, so offloaded runs equal non-offloaded ones bit for bit there.
// fsdp.offload_optimizer_ratio < 1 (DeepSpeed's offload_optimizer.ratio, ZeRO-Offload++
// "Twin-Flow"): only that fraction of the parameters is offloaded. The units in forward order
// whose parameters fit in the rest (1 - ratio of the model) are not offloaded at all: their
// shards, gradient shards and optimizer state stay on the device and they step there, on the
// main thread, before update_shards hands the offloaded units to the host thread; the host's
// step and the gradients' copies shrink by the same fraction, and the next forward's first
// units need no host write. shard_runtime(unit) says where each unit's shards live.
//
// Collectives: unshard and reduce are fsdp/fsdp/collectives.hpp's foreach_all_gather and
// foreach_reduce (PyTorch FSDP2's names), which return the buffer they fill and its Work;
// the engine decides when to call them and keeps the results in the unit.
//
// Streams: kernels run on the backend's compute stream, collectives are ordered after it
// (Communicator). Each unit's reduction stays in flight (its Work is kept) until end_step;
// its unsharded gradient goes back to the stream-ordered allocator with the collective's
// completion event, so it is reused only once the reduce-scatter has read it. HYBRID_SHARD:
// a unit's replica all-reduce is issued in its post_backward right after its reduce-scatter,
// on the engine's reduction stream (which waits for the reduce-scatter's completion event;
// the compute stream is not held), as PyTorch FSDP does for HSDP, so the inter-replica
// traffic overlaps the rest of backward; end_step makes the compute stream wait for it. Every
// rank issues the same collectives in the same order: units in backward order, each unit's
// all-reduce right after its reduce-scatter.
//
// Units: each unit is an FsdpParamGroup (fsdp/fsdp/param_group.hpp, PyTorch FSDP2's
// FSDPParamGroup: its shards, unshard / reshard / reduce and its state); the engine is FSDP2's
// FSDPState: it maps modules to units and schedules them. Gradient clipping and loss scaling
// are fsdp/fsdp/grad_clip.hpp's, outside the engine.
//
// Unit state (PyTorch FSDP2's FSDPParamGroup state; see TrainingState, ShardedState and
// GradState in param_group.hpp): each unit has a TrainingState (where it is in the pass), a ShardedState
// (whether its full parameter buffer exists) and a GradState (whether its fp32 gradient
// shard holds accumulated gradients). Hooks called out of order throw fsdp::Error.
//
// Unsharded units: the root unit (modules not wrapped, e.g. embeddings and ln_f) stays
// unsharded from its first forward use to the end of backward, as PyTorch does for the root.
// Prefetch follows PyTorch FSDP's execution order: forward_prefetch all-gathers the next
// unit to run forward when a unit starts its forward (the root prefetches the first block);
// BACKWARD_PRE all-gathers the next unit to run backward when a unit starts its backward,
// BACKWARD_POST when it ends (before its gradient reduction), NO_PREFETCH never.
// limit_all_gathers: under ZeRO-3 (and in evaluation) a prefetch is not issued while two
// units besides the root are already unsharded.
// The engine knows nothing about the model: it sees ModuleDecls.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/profiler.hpp"
#include "fsdp/fsdp/collectives.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/fsdp/param_group.hpp"
#include "fsdp/fsdp/step_timer.hpp"

namespace fsdp {

// What a sharding strategy means to the engine (the table above).
struct StrategyTraits {
  enum class ShardOver { world, shard_group, nobody } shard_over;
  bool reshard_after_forward;  // ZeRO-3 (true) or ZeRO-2 / DDP (false)
};
StrategyTraits strategy_traits(ShardingStrategy strategy);

// Groups modules into units. TRANSFORMER_BASED_WRAP: every module whose class is listed in
// `transformer_layer_cls_to_wrap` is a unit; all other modules form the root unit (index 0).
// NO_WRAP: one root unit. Returns unit index per module. Units are numbered root first,
// then wrapped modules in declaration (forward) order.
std::vector<int> wrap_modules(const std::vector<ModuleDecl>& modules, const FsdpConfig& fsdp);

// The FlatParameter layouts of the units for `num_shards` shards (no allocation).
std::vector<FlatParamLayout> build_unit_layouts(const std::vector<ModuleDecl>& modules,
                                                const FsdpConfig& fsdp, int64_t num_shards);

// Number of shards each FlatParameter is split into under `strategy`.
int64_t shards_for(ShardingStrategy strategy, int world_size, int shard_group_size);
// The groups of `mesh` a strategy shards over (FULL_SHARD / SHARD_GRAD_OP: the world; HYBRID:
// the shard group; NO_SHARD: this rank alone) and replicates over (the rest: gradients are
// averaged there; its rank 0 writes the shard file of a save), as the engine built on `mesh`
// uses them.
Communicator& shard_group_of(ShardingStrategy strategy, const DeviceMesh& mesh);
Communicator& replicate_group_of(ShardingStrategy strategy, const DeviceMesh& mesh);

// The elements of shard `shard` of `layout` that take weight decay (ParamSpec::weight_decay),
// as shard-local [begin, end) ranges, sorted, adjacent decayed parameters merged into one
// range; the padding takes none. What Optimizer::add_shard takes for the shard.
std::vector<ElementRange> decayed_ranges(const FlatParamLayout& layout, int64_t shard);

// Peak bytes per rank by MemCategory of one training step (forward + backward + reduction +
// optimizer state), the --dry-run memory plan. Computed by running the real engine on a
// backend that only counts allocations and on communicators that move nothing, with the
// modules entered in declaration order and left in reverse (the ModuleHooks contract), so it
// follows the strategy, the prefetch modes and the mixed-precision policy exactly and costs
// no memory. The optimizer state is what the caller says the optimizer keeps:
// `optimizer_states` fp32 tensors the size of each shard (optimizer_states(kind).size() of
// fsdp/optim/optimizer.hpp: AdamW 2, SGD 1), allocated on the shards' runtime as
// Optimizer::add_shard allocates them, in the same order. Activations are the model's to add.
// With fsdp.cpu_offload the shards, gradient shards, optimizer state and the host staging of
// the copies live in host memory: those peaks are `host`'s, and the device rows hold what
// stays on the device (unsharded parameters and gradients, reduction buffers).
struct MemoryRows {
  int64_t sharded_params = 0;    // fp32 shards (model states shrink as 1/num_shards)
  int64_t grads = 0;             // fp32 gradient shards
  int64_t optimizer_state = 0;   // AdamW exp_avg/exp_avg_sq or SGD momentum, fp32 shards
  int64_t unsharded_params = 0;  // peak of the all-gathered units (param_dtype)
  int64_t unsharded_grads = 0;   // peak of the units' full gradients (param_dtype)
  int64_t comm_buffers = 0;      // peak of reduce_dtype staging for reductions (host: of the
                                 // param_dtype / reduce_dtype copies to and from the device)
  int64_t total = 0;             // peak of all of the above together
};
struct EngineMemoryPlan : MemoryRows {  // the device's rows (the only ones without offload)
  bool offload = false;                 // fsdp.cpu_offload
  MemoryRows host;                      // offload: the host's rows; all 0 otherwise
  // Config::stages_async_saves(): host bytes of a writing rank's staging buffers (its fp32
  // parameter shards and every optimizer state, what its shard file holds; allocated at the
  // first periodic save and reused); 0 otherwise.
  int64_t save_staging = 0;
  // Host bytes the plan needs beside the device's: the offloaded rows and the staging.
  int64_t host_total() const { return (offload ? host.total : 0) + save_staging; }
};
EngineMemoryPlan plan_memory(const std::vector<ModuleDecl>& modules, const Config& config,
                             int world_size, int shard_group_size, int optimizer_states);

class FsdpEngine;
// Bytes of the datasets of this rank's shard file (what a save writes and an async save
// stages): each unit's fp32 parameter shard and its `optimizer_states` optimizer-state
// buffers of its shard_numel elements, 4 bytes each (ckpt::UnitShardView's datasets).
int64_t shard_file_bytes(const FsdpEngine& engine, int optimizer_states);

class FsdpEngine final : public ModuleHooks {
 public:
  // Builds the units and their layouts for the strategy's groups of `mesh`, allocates this
  // rank's shards and initialises them from `seed` (only this rank's slice is generated).
  // fsdp.cpu_offload needs `offload`: the host runtime (a CPU backend) that holds the fp32
  // shards, gradient shards and, through shard_runtime(unit), the optimizer state; it is not
  // owned and must outlive the engine. Throws fsdp::Error if cpu_offload is set without one.
  // init_params = false leaves the parameter shards unwritten for a caller that fills every
  // element through write_shards before the first pass (a checkpoint load, model.init_from):
  // generating the initial normals is most of a large model's start-up (~76 ns a parameter
  // per core). Until that write, any read of a parameter throws fsdp::Error.
  FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
             const MixedPrecisionConfig& mixed_precision, const DeviceMesh& mesh,
             DeviceRuntime& backend, uint64_t seed, DeviceRuntime* offload = nullptr,
             bool init_params = true);
  // The same over explicit groups: params shard over `shard`, gradients are then averaged
  // over `replicate`; world = shard x replicate. initialise = false leaves the shards and the
  // gradient shards uninitialised (the memory plan).
  FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
             const MixedPrecisionConfig& mixed_precision, Communicator& shard,
             Communicator& replicate, DeviceRuntime& backend, uint64_t seed, bool initialise,
             DeviceRuntime* offload = nullptr, bool init_params = true);
  ~FsdpEngine() override;

  // ---- structure ----
  int num_units() const { return static_cast<int>(units_.size()); }
  const FlatParamLayout& layout(int unit) const;
  std::vector<FlatParamLayout> layouts() const;
  int shard_index() const { return ctx_.shard->rank(); }    // this rank's shard
  int num_shards() const { return ctx_.shard->size(); }
  Communicator& shard_comm() const { return *ctx_.shard; }  // group the params shard over
  Communicator& replicate_comm() const { return *ctx_.replicate; }
  int64_t num_params() const;  // model parameters (unpadded)

  // ---- this rank's shards: shard_numel(unit) fp32 elements each ----
  // The runtime whose memory holds `unit`'s shard and gradient shard (and the optimizer state
  // the trainer allocates for it): the offload runtime for an offloaded unit, else the
  // backend. Copies of its shard views (checkpoints) go through it.
  DeviceRuntime& shard_runtime(int unit) const { return *units_.at(unit)->context().sh; }
  DeviceRuntime& backend() { return *ctx_.be; }  // the compute backend
  // Whether any unit is offloaded (fsdp.cpu_offload / offload_optimizer), and whether `unit` is
  // (all of them but those fsdp.offload_optimizer_ratio keeps on the device).
  bool offloaded() const { return ctx_.offloaded(); }
  bool offloaded(int unit) const { return units_.at(unit)->context().offloaded(); }
  // The offload runtime (host memory) when any unit is offloaded, else null.
  DeviceRuntime* offload_runtime() const { return offloaded() ? ctx_.sh : nullptr; }
  int64_t shard_numel(int unit) const;
  // This rank's fp32 shard / gradient shard of `unit` (both wait for pending writes first).
  TensorView shard_param(int unit);
  TensorView shard_grad(int unit);
  // Offload without loss scaling, where the unit's gradient shard is exactly the device's
  // accumulator copied across (one rank alone, micro-batches): true and `value` = its squared
  // norm, summed on the device (fp64) as the shard runtime's squared_norm would sum the
  // shard, so the clip need not read the host shard (GradNormClipper). false otherwise.
  bool grad_norm_sq_on_device(int unit, double& value);

  // ---- step ----
  // Starts a forward(+backward) pass. training = false: evaluation, units reshard after
  // forward and no gradients are produced. Throws fsdp::Error if a unit is not IDLE (the
  // previous pass was not ended with end_step).
  void begin_step(bool training);
  // Waits for every unit's gradient reduction (issued during backward: reduce-scatters in
  // unit order, then all-reduces in unit order), accumulates the averaged gradients into the
  // fp32 shards (shard_grad), reshards every unit and sets every unit IDLE.
  void end_step();
  // Sets every gradient shard to zero (optimizer.zero_grad()); gradients of later steps
  // accumulate until then.
  void zero_grad();
  // ---- writing this rank's fp32 shards ----
  // Every write to the shards goes through one of these two, so the param_dtype copies the
  // unshards read (offload: the host copy and, with fsdp.offload_optimizer, the device
  // shard) are made current right after; there is nothing else to call. Both first wait for
  // uploads still reading the host copies.
  // update_shards: write(u, compute_copy) for every unit u, in forward order (the order the
  // next forward unshards them), each unit's copies refreshed and its gradient shard zeroed
  // (the update consumed it) as soon as its write returns: the optimizer step
  // (Optimizer::begin_update, then Optimizer::step_shard(u, lr, scale, compute_copy) in
  // write); a step without an update calls zero_grad. compute_copy, when not empty, is the
  // unit's host param_dtype copy (offloaded with a 16-bit param_dtype: [shard_numel] bf16 or
  // fp16, host memory) and write must leave it equal to the cast of the updated fp32 shard,
  // as Optimizer::step_shard does in the update's own pass (issue 31 item 3: one pass over
  // the shard instead of the update and then the cast); where it is empty the engine makes
  // the unit's copies itself.
  // With offload the writes run on a host thread and update_shards returns at once: the next
  // pass's unshard of unit u waits only for u's write and cast (ZeRO-Offload's overlap of the
  // host step with the device's next forward, without its one-step delay: the same update),
  // charged to Phase::optimizer while it blocks; every other access to the shards
  // (shard_param, shard_grad, zero_grad, gather_full_params, write_shards, the next
  // update_shards, the destructor) waits for all of them. `write` runs on that thread, so it
  // may only touch host memory (the shard runtime's); an exception it throws is rethrown by
  // the next of those waits.
  // fsdp.delayed_parameter_update (with offload_optimizer; ZeRO-Offload's one-step delayed
  // parameter update): the host thread writes the units in backward order instead, and the
  // next passes neither wait for it nor upload: they gather the device shards from before the
  // update, until the accumulation boundary's backward, where each unit's post_backward waits
  // for its write (its new gradient then lands in the shard the update has read) and enqueues
  // its upload once this step's last use of the old shard is behind the compute stream. So
  // the update of step n runs beside step n+1's forward and backward, and step n+1's
  // gradient is taken at the parameters before update n (each gradient one update late; the
  // update rule is unchanged). An evaluation pass (begin_step(false)), write_shards and
  // complete_update finish the pending update first. `delay` false runs this update
  // undelayed (fsdp.delayed_parameter_update_warmup_steps).
  using ShardWrite = std::function<void(int unit, const TensorView& compute_copy)>;
  void update_shards(const ShardWrite& write, bool delay = true);
  // fsdp.delayed_parameter_update: waits for the pending update's writes and enqueues the
  // uploads of the units not yet uploaded, so the next pass uses the updated parameters
  // (what the trainer does before a checkpoint, so a resumed run equals the uninterrupted
  // one). Nothing without a pending update.
  void complete_update();
  // Waits for the writes update_shards left running (rethrowing their exception); returns
  // at once when none are.
  void wait_shard_writes();
  // write_shards: write() writes any of the shards (a checkpoint load, model.init_from,
  // tests), then every unit's copies are refreshed. The constructor does this after
  // initialising; an unshard of an engine built without initialisation before its first
  // write throws fsdp::Error (offload: it has no copy to upload).
  void write_shards(const std::function<void()>& write);
  // DeepSpeed's gradient accumulation boundary (default true): false for the passes of a
  // step's micro-batches but the last. With cpu_offload, a pass that is not a boundary adds
  // each unit's reduced gradient into an fp32 accumulator on the device (MemCategory::grads,
  // 4 bytes per shard element) instead of copying it to the host; the boundary's pass copies
  // the accumulator, then its own gradient, and the host adds both in that order (where
  // nothing is communicated, the device adds the last gradient too and the host adds the
  // accumulator alone): the sums of accumulating on the host, with one device-to-host copy
  // and one host pass per step. No effect without offload.
  void set_gradient_accumulation_boundary(bool boundary);
  // Full (unsharded) fp32 value of every parameter, gathered over the shard group; for
  // tests and fsdp_merge comparisons. Collective over the shard group.
  std::map<std::string, std::vector<float>> gather_full_params();

  // Charges the engine's part of a step to `timer` (null: none; not owned): a training
  // pass enters Phase::backward at its first pre_backward, and every wait on a collective
  // (all-gather before a unit's use, HYBRID's reduce-scatter -> all-reduce hand-off in
  // post_backward, the reductions in end_step; GradNormClipper's all-gather) is a
  // Phase::comm_wait scope.
  void set_step_timer(StepTimer* timer) { ctx_.timer = device_ctx_.timer = timer; }
  StepTimer* step_timer() const { return ctx_.timer; }
  // Records the issue and the wait of every collective as a host range of `profiler` (null:
  // none; not owned), named after the collective and the unit: "all_gather issue unit 3
  // (h.2)", "reduce_scatter wait unit 0 (root)", "all_reduce wait unit 1 (h.0)",
  // "all_gather issue grad_norm"; args: unit, unit_name, in_bytes and out_bytes (this rank's
  // input and output buffers), dtype, ranks (the group's size).
  void set_profiler(Profiler* profiler) { ctx_.profiler = device_ctx_.profiler = profiler; }
  Profiler* profiler() const { return ctx_.profiler; }

  // Test hook: adds +inf to element 0 of this rank's gradient shard of unit 0 (an overflow).
  void inject_nonfinite_grad();

  // ---- unit state (see TrainingState, ShardedState, GradState) ----
  TrainingState training_state(int unit) const;
  ShardedState sharded_state(int unit) const;
  GradState grad_state(int unit) const;

  // ---- ModuleHooks ----
  // Each throws fsdp::Error on an illegal TrainingState transition (TrainingState above).
  void pre_forward(int module) override;
  void post_forward(int module) override;
  void pre_backward(int module) override;
  void post_backward(int module) override;
  TensorView param(int param) override;
  TensorView grad(int param) override;
  bool training() const override { return training_; }

 private:
  struct ParamLoc {
    int unit;
    int64_t offset;
    Shape shape;
  };
  void build(const std::vector<ModuleDecl>& modules, uint64_t seed, bool initialise,
             bool init_params);
  // fwd_order_, fwd_next_, bwd_next_ from module_unit_ for `n_units` units.
  void plan_prefetch(std::size_t n_units);
  std::vector<char> units_on_device(const std::vector<FlatParamLayout>& layouts) const;
  void refresh_all();
  FsdpParamGroup& unit(int u) { return *units_[u]; }
  void unshard(int unit);
  void wait_unshard(int unit);
  void reshard(int unit);
  void drain_staged(std::size_t keep);
  bool reshard_after_forward(int unit) const;
  void prefetch(int unit, bool backward);
  int unsharded_blocks() const;  // units besides the root holding a full parameter buffer

  FsdpConfig config_;
  StrategyTraits traits_;
  // The reduction stream (HSDP's replica all-reduces, offload's gradient copies) and the copy
  // stream (cpu_offload's parameter uploads); declared before units_, whose pending Works may
  // still refer to them when they are destroyed.
  std::unique_ptr<Stream> reduce_stream_;
  std::unique_ptr<Stream> copy_stream_;
  ParamGroupContext ctx_;  // what every unit shares; outlives units_
  // fsdp.offload_optimizer_ratio: what the units kept on the device share instead (ctx_ with
  // the backend as their shards' runtime: not offloaded).
  ParamGroupContext device_ctx_;
  std::vector<std::unique_ptr<FsdpParamGroup>> units_;
  // Offload: update_shards' host thread and the units it has written (engine.cpp).
  struct ShardWriter;
  std::unique_ptr<ShardWriter> writer_;
  void wait_written(int unit);  // blocks until update_shards' write of `unit` is done
  // Offload: the device-to-host copies that landed straight in a gradient shard (the
  // accumulator's, an fp32 reduction's) are not waited for at end_step: landing_[u] is the
  // event of unit u's copy still in flight, landing_order_ the units in the order their copies
  // were issued. Whoever reads or writes u's gradient shard on the host first waits for it
  // (wait_landed): shard_grad, zero_grad, a staged add after it, and update_shards' host
  // thread, which writes the units in landing order, each once its copy has landed, so the
  // host step overlaps the copies still in flight. Main thread, but for update_shards' thread,
  // which owns a unit's entry until it has written that unit.
  std::vector<std::shared_ptr<Event>> landing_;
  std::vector<int> landing_order_;
  void wait_landed(int unit);
  // delayed_parameter_update: an update is running on the host thread whose uploads are not
  // all enqueued; passes gather the shards from before it (main thread only).
  bool delayed_pending_ = false;
  // cpu_offload: reduced gradients copied to the host, not yet handed to their unit (oldest
  // first). At most kStagedCopies copies into staging memory (not landed in the shard) stay
  // pending after a unit's reduction; staged_waiting_ counts those.
  struct Staged {
    int unit;
    HostStaging copy;  // reduce_dtype or fp32 [shard_numel]: host comm_buffers, or landed
  };
  static constexpr std::size_t kStagedCopies = 2;
  std::deque<Staged> staged_;
  std::size_t staged_waiting_ = 0;
  bool shards_written_ = false;       // the shards (and copies) were written once
  bool boundary_ = true;           // set_gradient_accumulation_boundary
  std::vector<int> module_unit_;   // module -> unit
  std::vector<ParamLoc> param_loc_;  // param -> (unit, offset in the flat buffer, shape)
  std::vector<int> fwd_next_, bwd_next_;  // prefetch target per unit (-1: none)
  std::vector<int> fwd_order_;     // units by their first module (forward order)
  bool training_ = false;
  int unsharded_blocks_ = 0;       // units besides the root UNSHARDED (O(1) for
                                   // limit_all_gathers, which asks before every prefetch)
};

}  // namespace fsdp
