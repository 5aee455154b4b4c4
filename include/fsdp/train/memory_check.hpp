// fsdp/train/memory_check.hpp: the memory plan against what a rank may use, before anything
// is allocated (train.check_memory). The plan is plan_memory's (fsdp/fsdp/engine.hpp) plus the
// model's activation bytes; the budgets are the Runtime's (fsdp/train/runtime.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp/engine.hpp"

namespace fsdp {

// What a rank may use, bytes (-1: could not be measured, never refuses) and how it was
// measured ("MemAvailable 22.5 GiB / 2 ranks on this node", "cuda:0 free 79.1 GiB / 1 rank").
struct MemoryBudget {
  int64_t bytes = -1;
  std::string source;
};

// The device rows of a plan (bytes), in print order; "total" (p.total + activation_bytes)
// last.
std::vector<std::pair<const char*, int64_t>> plan_rows(const MemoryRows& p,
                                                       int64_t activation_bytes);
// The host rows (bytes), in print order: with offload its shards, gradients, optimizer state
// and the copies' staging; with checkpoint.async_save the save's staging (save_staging);
// "total" (EngineMemoryPlan::host_total) last.
std::vector<std::pair<const char*, int64_t>> host_rows(const EngineMemoryPlan& p);

// Why `plan` does not fit, as the one line of the InputError the trainer throws (naming what
// is needed, the budget and how it was measured, the largest row and what to change), or ""
// when it fits. Without offload the device rows plus `activation_bytes` must fit in
// `device`. The host rows (plan.offload's, checkpoint.async_save's staging) must also fit in
// `host`; where the device is the host (`device_is_host`: the CPU backend) the two are one
// memory, so their sum must fit in `device`. With staging the line's advice starts with
// checkpoint.async_save = false. An unmeasured budget (bytes < 0) accepts anything.
std::string memory_refusal(const EngineMemoryPlan& plan, int64_t activation_bytes,
                           const MemoryBudget& device, const MemoryBudget& host,
                           bool device_is_host);

// `plan` with save_staging replaced by this rank's share of its node's staging: only the
// `node_writers` ranks of the node that write a shard file (replica 0 of their shard group)
// stage an async save, while each of the node's `local_size` ranks is budgeted an equal part
// of its memory; so each is charged staging x node_writers / local_size (rounded up), and the
// node's ranks together are charged exactly the node's staging (NO_SHARD: rank 0's alone).
EngineMemoryPlan with_staging_share(EngineMemoryPlan plan, int node_writers, int local_size);

// The share of the device's budget fsdp.offload_optimizer_ratio = 0 ("auto") leaves to what
// the plan does not count (the CUDA context's later growth, cuBLAS workspaces, NCCL's buffers,
// the caching allocator's fragmentation).
inline constexpr double kAutoOffloadHeadroom = 0.10;
// What fsdp.offload_optimizer_ratio = 0 fits plans into: `device` less kAutoOffloadHeadroom
// of it (an unmeasured budget stays unmeasured).
MemoryBudget auto_offload_budget(const MemoryBudget& device);

// fsdp.offload_optimizer_ratio = 0 ("auto", with fsdp.offload_optimizer): the smallest ratio
// (the most units kept on the device, DeepSpeed's offload_optimizer.ratio chosen for the user)
// whose plan (plan_memory of `config` with that ratio, world_size / shard_group_size /
// optimizer_states as there, plus `activation_bytes`) fits in the device's budget less
// kAutoOffloadHeadroom of it; the device's need falls as the ratio rises, so a bisection
// over (0, 1] finds it to 1/4096 (unit boundaries are coarser). 1 (everything offloaded) when
// the budget is unmeasured (bytes < 0), when the device is the host (the CPU backend: one
// memory, nothing to gain) or when nothing more fits. The host's budget is checked afterwards
// by memory_refusal, as for any ratio. `config`'s ratio itself is not read.
double auto_offload_ratio(const std::vector<ModuleDecl>& modules, const Config& config,
                          int world_size, int shard_group_size, int optimizer_states,
                          int64_t activation_bytes, const MemoryBudget& device,
                          bool device_is_host);

}  // namespace fsdp
