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
// Gradients are averaged over the data-parallel world (all ranks). The root unit (modules
// not wrapped, e.g. embeddings and ln_f) stays unsharded from its first forward use to the
// end of backward, as PyTorch does for the root. Units are resharded after backward.
// Prefetch runs one unit ahead (forward, and BACKWARD_PRE/POST in backward), so at most two
// units besides the root are unsharded: fsdp.limit_all_gathers holds by construction.
// The engine knows nothing about the model: it sees ModuleDecls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/backend.hpp"
#include "fsdp/backend/buffer.hpp"
#include "fsdp/comm/communicator.hpp"
#include "fsdp/comm/device_mesh.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "fsdp/fsdp/module.hpp"

namespace fsdp {

// Groups modules into units. TRANSFORMER_BASED_WRAP: every module whose class is listed in
// `transformer_layer_cls_to_wrap` is a unit; all other modules form the root unit (index 0).
// NO_WRAP: one root unit. Returns unit index per module. Units are numbered root first,
// then wrapped modules in declaration (forward) order.
std::vector<int> wrap_modules(const std::vector<ModuleDecl>& modules, const FsdpConfig& fsdp);

// The FlatParameter layouts of the units for `num_shards` shards (no allocation).
std::vector<FlatParamLayout> build_unit_layouts(const std::vector<ModuleDecl>& modules,
                                                const FsdpConfig& fsdp, int64_t num_shards);

// Number of shards each FlatParameter is split into under `strategy` on `mesh`.
int64_t shards_for(ShardingStrategy strategy, int world_size, int shard_group_size);

// Bytes per rank the engine will hold at its peak, by category (the --dry-run memory plan).
// Computed from the layouts alone, so it can be printed for any model and world size.
// sharded_params + grads + optimizer_state are the persistent model states (ZeRO's "model
// states"), which shrink as 1/num_shards; unsharded_params and unsharded_grads are the
// transient full units of the running (and prefetched) units.
struct EngineMemoryPlan {
  int64_t sharded_params = 0, unsharded_params = 0, grads = 0, unsharded_grads = 0,
          optimizer_state = 0, comm_buffers = 0;
};
EngineMemoryPlan plan_memory(const std::vector<FlatParamLayout>& layouts,
                             ShardingStrategy strategy, const std::string& optimizer);

class FsdpEngine final : public ModuleHooks {
 public:
  // Builds the units and their layouts for `mesh` and the strategy, allocates this rank's
  // shards and initialises them from `seed` (only this rank's slice is generated).
  FsdpEngine(const std::vector<ModuleDecl>& modules, const FsdpConfig& config,
             const DeviceMesh& mesh, Backend& backend, uint64_t seed);
  ~FsdpEngine() override;

  // ---- structure ----
  int num_units() const { return static_cast<int>(units_.size()); }
  const FlatParamLayout& layout(int unit) const;
  int shard_index() const { return shard_comm_->rank(); }    // this rank's shard
  int num_shards() const { return shard_comm_->size(); }
  Communicator& shard_comm() const { return *shard_comm_; }  // group the params shard over
  Communicator& replicate_comm() const { return *replicate_comm_; }
  ShardingStrategy strategy() const { return strategy_; }
  int64_t num_params() const;  // model parameters (unpadded)

  // ---- this rank's shards: shard_numel(unit) floats each ----
  int64_t shard_numel(int unit) const;
  float* shard_param(int unit);
  float* shard_grad(int unit);

  // ---- step ----
  // Starts a forward(+backward) pass. training = false: evaluation, units reshard after
  // forward and no gradients are produced.
  void begin_step(bool training);
  // Waits for outstanding collectives and reshards every unit. After a training step the
  // averaged gradient of this rank's shard is in shard_grad().
  void end_step();
  // Global L2 norm of the averaged gradient, identical (bitwise) on every rank.
  double grad_norm();
  // Multiplies every shard gradient by `factor` (clipping).
  void scale_grads(float factor);

  // Full (unsharded) fp32 value of every parameter, gathered over the shard group; for
  // tests and fsdp_merge comparisons. Collective over the shard group.
  std::map<std::string, std::vector<float>> gather_full_params();

  // ---- ModuleHooks ----
  void pre_forward(int module) override;
  void post_forward(int module) override;
  void pre_backward(int module) override;
  void post_backward(int module) override;
  float* param(int param) override;
  float* grad(int param) override;
  bool training() const override { return training_; }

 private:
  struct Unit;
  void init_shard(int unit, uint64_t seed);
  void issue_unshard(int unit);
  void wait_unshard(int unit);
  void reshard(int unit);
  void reduce_grads(int unit);
  bool reshard_after_forward(int unit) const;
  void prefetch_forward(int unit);
  void prefetch_backward(int unit);

  Backend& be_;
  ShardingStrategy strategy_;
  std::string backward_prefetch_;
  Communicator* shard_comm_;
  Communicator* replicate_comm_;
  int world_size_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<int> module_unit_;            // module -> unit
  std::vector<std::pair<int, int64_t>> param_loc_;  // param -> (unit, offset in flat)
  bool training_ = false;
};

}  // namespace fsdp
