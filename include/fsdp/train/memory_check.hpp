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
// The host rows of fsdp.cpu_offload (shards, gradients, optimizer state, staging of the
// copies), in print order; "total" last.
std::vector<std::pair<const char*, int64_t>> host_rows(const MemoryRows& h);

// Why `plan` does not fit, as the one line of the InputError the trainer throws (naming what
// is needed, the budget and how it was measured, the largest row and what to change), or ""
// when it fits. Without offload the device rows plus `activation_bytes` must fit in
// `device`. With plan.offload the host rows must also fit in `host`; where the device is the
// host (`device_is_host`: the CPU backend) the two are one memory, so their sum must fit in
// `device`. An unmeasured budget (bytes < 0) accepts anything.
std::string memory_refusal(const EngineMemoryPlan& plan, int64_t activation_bytes,
                           const MemoryBudget& device, const MemoryBudget& host,
                           bool device_is_host);

}  // namespace fsdp
