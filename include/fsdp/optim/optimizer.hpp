// fsdp/optim/optimizer.hpp: AdamW and SGD with momentum on flat shards, the learning-rate
// schedule, and the optimizer-state layout that checkpoints store.
//
// Each registered shard is one "param group" whose elements do or do not take weight decay
// (none on biases, LayerNorm and embeddings, the usual GPT recipe): the caller passes the
// decayed element ranges (the engine computes them from its FlatParameter layouts,
// fsdp/fsdp/engine.hpp decayed_ranges; the optimizer knows no FlatParameter). Updates are
// elementwise, so sharding does not change them: shard updates equal the unsharded update.
// Each shard is updated by one call (one kernel launch on CUDA, one parallel region on the
// CPU) with its decayed ranges as WeightDecay ranges, as torch's fused / multi-tensor AdamW
// updates a param group at once, not one call per parameter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/enum_names.hpp"

namespace fsdp {

// Learning rate at 1-based `step` (docs/config.md "[optim]"): linear warmup 0 -> lr over
// warmup_steps W, then by optim.lr_scheduler_type up to D = decay_steps (0 = max_steps):
//  - cosine: min_lr + (lr - min_lr) (1 + cos(pi (s - W) / (D - W))) / 2 (nanoGPT / llm.c);
//  - linear: min_lr + (lr - min_lr) (1 - (s - W) / (D - W)) (HF get_linear_schedule_with_warmup
//    with a floor);
//  - constant_with_warmup: lr (no decay; min_lr and D unused);
//  - warmup_stable_decay (WSD; Hu et al. 2024, MiniCPM; HF get_wsd_schedule): lr until
//    S = D - num_decay_steps, then min_lr + (lr - min_lr) f(p), p = (s - S) / num_decay_steps,
//    f = (1 + cos(pi p)) / 2, 1 - p or 1 - sqrt(p) by decay_type;
// then min_lr from D on (except constant_with_warmup). A pure function of its arguments.
double learning_rate(const OptimConfig& optim, int64_t max_steps, int64_t step);

// An optimizer state tensor, named as torch.optim's state_dict names it: AdamW has exp_avg and
// exp_avg_sq, SGD (with momentum) has momentum_buffer.
enum class OptimState { exp_avg, exp_avg_sq, momentum_buffer };
// The torch.optim state-dict names, which are also the states' dataset names in checkpoint
// shard files (checkpoint.hpp).
template <>
struct EnumNames<OptimState> {
  static constexpr EnumName<OptimState> table[] = {{OptimState::exp_avg, "exp_avg"},
                                                   {OptimState::exp_avg_sq, "exp_avg_sq"},
                                                   {OptimState::momentum_buffer, "momentum_buffer"}};
};
// The states optimizer `kind` keeps, in checkpoint order: adamw {exp_avg, exp_avg_sq},
// sgd {momentum_buffer}.
std::vector<OptimState> optimizer_states(OptimizerKind kind);
// optimizer_states(kind).size(): the fp32 tensors of a shard's size the optimizer keeps per
// shard (what plan_memory of fsdp/fsdp/engine.hpp is told).
inline int num_optimizer_states(OptimizerKind kind) {
  return static_cast<int>(optimizer_states(kind).size());
}

class Optimizer {
 public:
  Optimizer(const OptimConfig& config, DeviceRuntime& backend);
  // Registers one fp32 shard (param and grad: [n] fp32 views; their memory stays owned by
  // the caller) whose elements in `decayed` (sorted, disjoint, shard-local [begin, end))
  // take weight decay. Allocates its state (MemCategory::optimizer_state): the
  // optimizer_states(kind) tensors of n fp32 each, zero-initialised.
  // runtime (optional; null: the optimizer's): the runtime whose memory holds param and grad,
  // where the shard's state is allocated and its updates run (FsdpEngine::shard_runtime(unit):
  // the host's for an offloaded unit, the device's for one fsdp.offload_optimizer_ratio keeps
  // there).
  void add_shard(const TensorView& param, const TensorView& grad,
                 std::vector<ElementRange> decayed, DeviceRuntime* runtime = nullptr);
  // One update of every registered shard with learning rate `lr`; the update count
  // (torch.optim's per-parameter `step`, used by AdamW's bias correction) advances by one.
  // A step skipped for overflow (fp16 loss scaling) does not call this, as GradScaler.
  // grad_scale (optional): an fp32 [1] scalar in the optimizer's runtime memory that the
  // gradients are multiplied by as the update reads them (GradNormClipper::coefficient: the
  // clip folded into the update, DeviceRuntime::adamw_update's grad_scale); the gradient
  // shards are not written.
  void step(double lr, const TensorView& grad_scale = {});
  // The same update one shard at a time (what FsdpEngine::update_shards drives, unit by unit):
  // begin_update() advances the update count once, then step_shard(i, lr, grad_scale) updates
  // shard i (registration order) as step() would. step() is begin_update() and every shard in
  // order. Throws fsdp::Error for an index that is not a registered shard.
  // compute_copy (optional; the default empty view is none): an [n] bf16 or fp16 view in the
  // shard runtime's memory that the update writes in its own pass with the updated param
  // rounded to nearest even: bit for bit what the runtime's cast(compute_copy, param) writes
  // after it. With offload and a 16-bit param_dtype it is the unit's host param_dtype copy
  // (what is uploaded for the all-gather, FsdpEngine::update_shards' compute_copy): one pass
  // over the shard instead of the update and then the engine's cast (the host step is memory
  // bound: 30 bytes a parameter instead of 34; DeepSpeed's cpu_adam writes its fp16 copy the
  // same way). Throws fsdp::Error on another dtype or size.
  void begin_update() { ++updates_; }
  void step_shard(int index, double lr, const TensorView& grad_scale = {},
                  const TensorView& compute_copy = {});
  // Updates applied so far (checkpointed; a resumed run sets it back).
  int64_t num_updates() const { return updates_; }
  void set_num_updates(int64_t n) { updates_ = n; }

  OptimizerKind kind() const { return cfg_.name; }
  // The states this optimizer keeps: optimizer_states(kind()).
  std::vector<OptimState> states() const { return optimizer_states(kind()); }
  // The runtime shard `index`'s state lives in and its updates run on (add_shard's).
  DeviceRuntime& runtime(int index);
  // State `s` of shard `index` ([n] fp32, runtime(index)'s memory). Throws fsdp::Error naming the
  // optimizer and the state when this optimizer has no such state (e.g. exp_avg of sgd), or
  // when index is not a registered shard.
  TensorView state(int index, OptimState s);
  int num_shards() const { return static_cast<int>(shards_.size()); }

 private:
  struct Shard {
    TensorView param, grad;
    std::vector<ElementRange> decayed;  // the segments with decay: one update per shard
    DeviceRuntime* rt;                  // where the shard, its state and its update live
    DeviceBuffer s0, s1;  // adamw: exp_avg, exp_avg_sq; sgd: momentum_buffer, (none)
  };
  OptimConfig cfg_;
  DeviceRuntime& be_;
  std::vector<Shard> shards_;
  int64_t updates_ = 0;
};

}  // namespace fsdp
