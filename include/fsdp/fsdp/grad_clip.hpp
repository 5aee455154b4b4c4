// fsdp/fsdp/grad_clip.hpp: gradient-norm clipping and dynamic loss scaling over an FSDP
// engine's fp32 gradient shards, the roles of torch.nn.utils.clip_grad_norm_ (FSDP's
// FullyShardedDataParallel.clip_grad_norm_) and torch.amp.GradScaler (FSDP's
// ShardedGradScaler). They run between the engine's end_step and the optimizer step, on the
// shards' runtime (the host's cores with fsdp.cpu_offload, whose device scalars they copy
// across), and know nothing of the engine's schedule.
#pragma once

#include <cstdint>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/device_runtime.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/fsdp/engine.hpp"

namespace fsdp {

// torch.nn.utils.clip_grad_norm_ over the engine's gradient shards, with its in-place scaling
// folded into the optimizer's update.
class GradNormClipper {
 public:
  // Allocates the scalars clip() uses on the engine's backend (MemCategory::other:
  // fp64 [1 + num_shards] partial sums, fp32 [1] coefficient, and with units both offloaded
  // and on the device fp64 [num_units]); `engine` must outlive it.
  explicit GradNormClipper(FsdpEngine& engine);
  // The global L2 norm of the gradient (of this rank's shard group; replicas hold equal
  // shards) is written to norm[0] (fp64 [1] device scalar), bitwise identical on every rank
  // (per-shard partial sums are all-gathered and added in shard order, not all-reduced); if
  // max_norm > 0, coefficient(unit) then holds what the gradient is to be multiplied by:
  // max_norm / (norm + 1e-6) where the norm exceeds max_norm, else 1 (torch's formula and
  // clamp). The shards are not scaled here: torch's clip_grad_norm_ scales them in place, a
  // pass over every gradient (8 bytes a parameter; with CPU offload on the host's memory,
  // before the host step may start), while the optimizer multiplies as it reads
  // (Optimizer::step's grad_scale), the same update bit for bit. Joins the engine's shard
  // writes first (FsdpEngine::update_shards' host thread may still read the previous
  // coefficient). Nothing waits for the device but the all-gather (a Phase::comm_wait, ranged
  // "all_gather issue/wait grad_norm") and, offloaded, the coefficient's copy to the host.
  // Collective over the engine's shard group.
  void clip(double max_norm, const TensorView& norm);
  // The last clip()'s coefficient for `unit`'s update: fp32 [1] in the memory of the unit's
  // shard runtime (FsdpEngine::shard_runtime: the device's, or the host's for an offloaded
  // unit), what Optimizer::step_shard takes as grad_scale. Empty when that clip had
  // max_norm <= 0 (nothing to scale) or before the first clip. Valid until the next clip().
  TensorView coefficient(int unit);

 private:
  FsdpEngine& engine_;
  DeviceBuffer norm_parts_;  // fp64 [1 + num_shards]: local sum, then gathered parts
  DeviceBuffer clip_coef_;   // fp32 [1]
  // fsdp.offload_optimizer_ratio < 1: fp64 [num_units], the squared norms of the units on the
  // device (the others' slots unused), copied to the host in one copy.
  DeviceBuffer unit_norms_;
  float host_coef_ = 1.0f;   // offload: clip_coef_ copied to the host
  bool has_coef_ = false;    // the last clip had max_norm > 0
};

// fp16 dynamic loss scaling (torch.amp.GradScaler with init_scale, growth_factor,
// backoff_factor, growth_interval from mixed_precision.*). Disabled (scale 1, nothing to do)
// unless the policy uses fp16.
class GradScaler {
 public:
  GradScaler() = default;  // disabled
  explicit GradScaler(const MixedPrecisionConfig& mp);
  bool enabled() const { return enabled_; }
  // The scale the loss is multiplied by before backward (1 when disabled).
  double scale() const { return scale_; }
  // Clean steps since the scale last changed (GradScaler's _growth_tracker).
  int64_t growth_tracker() const { return growth_tracker_; }
  // A checkpoint's state (a scale <= 0 leaves the current state: none was saved).
  void load_state(double scale, int64_t growth_tracker);
  // GradScaler.unscale_ for this rank's shards: gradient shards *= 1 / scale; found_inf[0]
  // (fp64 [1] device scalar, of the engine's backend) = 1 if any element is inf or NaN. The
  // caller all-reduces found_inf (max) so that every rank takes the same decision.
  void unscale(FsdpEngine& engine, const TensorView& found_inf) const;
  // GradScaler.update: scale *= backoff_factor after an overflow (found_inf), *= growth_factor
  // after growth_interval clean steps.
  void update(bool found_inf);

 private:
  bool enabled_ = false;
  double scale_ = 1.0;
  int64_t growth_tracker_ = 0;
  double growth_factor_ = 2.0, backoff_factor_ = 0.5;
  int64_t growth_interval_ = 2000;
};

}  // namespace fsdp
