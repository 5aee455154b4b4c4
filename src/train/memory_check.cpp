// The memory plan against the budgets (see fsdp/train/memory_check.hpp).
#include "fsdp/train/memory_check.hpp"

#include <algorithm>

#include "fsdp/core/host_memory.hpp"

namespace fsdp {

std::vector<std::pair<const char*, int64_t>> plan_rows(const MemoryRows& p,
                                                       int64_t activation_bytes) {
  return {{"sharded_params", p.sharded_params},   {"unsharded_params", p.unsharded_params},
          {"grads", p.grads},                     {"unsharded_grads", p.unsharded_grads},
          {"optimizer_state", p.optimizer_state}, {"activations", activation_bytes},
          {"comm_buffers", p.comm_buffers},       {"total", p.total + activation_bytes}};
}

std::vector<std::pair<const char*, int64_t>> host_rows(const EngineMemoryPlan& p) {
  std::vector<std::pair<const char*, int64_t>> rows;
  if (p.offload) {
    rows = {{"sharded_params", p.host.sharded_params}, {"grads", p.host.grads},
            {"optimizer_state", p.host.optimizer_state}, {"comm_buffers", p.host.comm_buffers}};
  }
  if (p.save_staging > 0) rows.emplace_back("save_staging", p.save_staging);
  rows.emplace_back("total", p.host_total());
  return rows;
}

namespace {

using Row = std::pair<const char*, int64_t>;

Row largest_of(std::vector<Row> rows) {
  rows.pop_back();  // "total"
  return *std::max_element(rows.begin(), rows.end(),
                           [](const Row& a, const Row& b) { return a.second < b.second; });
}

std::string refusal(const char* where, int64_t need, const MemoryBudget& budget, Row largest,
                    const std::string& advice) {
  return std::string("memory plan: ") + where + human_bytes(static_cast<double>(need)) +
         " per rank does not fit in the " + human_bytes(static_cast<double>(budget.bytes)) +
         " this rank may use (" + budget.source + "); largest row: " + largest.first + " " +
         human_bytes(static_cast<double>(largest.second)) + "; " + advice +
         " (or train.check_memory = false to try anyway)";
}

}  // namespace

EngineMemoryPlan with_staging_share(EngineMemoryPlan plan, int node_writers, int local_size) {
  const int64_t ranks = std::max(1, local_size);
  plan.save_staging = (plan.save_staging * node_writers + ranks - 1) / ranks;
  return plan;
}

MemoryBudget auto_offload_budget(const MemoryBudget& device) {
  if (device.bytes < 0) return device;
  return {static_cast<int64_t>(static_cast<double>(device.bytes) * (1.0 - kAutoOffloadHeadroom)),
          device.source};
}

double auto_offload_ratio(const std::vector<ModuleDecl>& modules, const Config& config,
                          int world_size, int shard_group_size, int optimizer_states,
                          int64_t activation_bytes, const MemoryBudget& device,
                          bool device_is_host) {
  if (device.bytes < 0 || device_is_host) return 1.0;
  const MemoryBudget usable = auto_offload_budget(device);
  const MemoryBudget unmeasured{};
  Config c = config;
  auto fits = [&](double ratio) {
    c.fsdp.offload_optimizer_ratio = ratio;
    const EngineMemoryPlan p =
        plan_memory(modules, c, world_size, shard_group_size, optimizer_states);
    return memory_refusal(p, activation_bytes, usable, unmeasured, false).empty();
  };
  double lo = 0.0, hi = 1.0;  // hi fits (or nothing does); lo: more than fits, or 0
  if (!fits(hi)) return 1.0;
  for (int i = 0; i < 12; ++i) {
    const double mid = 0.5 * (lo + hi);
    (fits(mid) ? hi : lo) = mid;
  }
  return hi;
}

std::string memory_refusal(const EngineMemoryPlan& plan, int64_t activation_bytes,
                           const MemoryBudget& device, const MemoryBudget& host,
                           bool device_is_host) {
  const bool offload = plan.offload;
  const bool staging = plan.save_staging > 0;
  const int64_t host_need = plan.host_total();
  const int64_t need = plan.total + activation_bytes + (device_is_host ? host_need : 0);
  Row largest = largest_of(plan_rows(plan, activation_bytes));
  if (device_is_host && host_need > 0) {
    const Row h = largest_of(host_rows(plan));
    if (h.second > largest.second) largest = h;
  }
  // checkpoint.async_save's staging is the first thing to give up where it counts.
  const std::string no_staging = "checkpoint.async_save = false (a synchronous save stages "
                                 "nothing), ";
  if (device.bytes >= 0 && need > device.bytes) {
    // On the CPU backend offload moves nothing out of the one memory: not advised there.
    const std::string advice =
        (device_is_host && staging ? no_staging : std::string()) +
        (device_is_host ? "use more ranks, FULL_SHARD, fsdp.activation_checkpointing or a "
                          "smaller train.micro_batch_size"
         : offload      ? "use more ranks, FULL_SHARD, fsdp.activation_checkpointing, a smaller "
                          "train.micro_batch_size or a higher fsdp.offload_optimizer_ratio"
                        : "use more ranks, FULL_SHARD, fsdp.activation_checkpointing, "
                          "fsdp.cpu_offload or a smaller train.micro_batch_size");
    return refusal(offload && !device_is_host ? "device " : "", need, device, largest,
                   advice);
  }
  if (!device_is_host && host_need > 0 && host.bytes >= 0 && host_need > host.bytes) {
    const std::string advice =
        (staging ? no_staging : std::string()) +
        (offload ? "use more ranks (the host rows shrink with the shard group), FULL_SHARD or, "
                   "with fsdp.offload_optimizer, a lower fsdp.offload_optimizer_ratio"
                 : "use more ranks (the staging shrinks with the shard group) or FULL_SHARD");
    return refusal("host ", host_need, host, largest_of(host_rows(plan)), advice);
  }
  return "";
}

}  // namespace fsdp
