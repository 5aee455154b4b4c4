// The --dry-run memory plan (see plan_memory in fsdp/fsdp/engine.hpp): the real FsdpEngine
// driven through one training step on a backend that only counts allocations
// (CountingRuntime, fsdp/backend/counting_runtime.hpp) and on communicators that move
// nothing, with the optimizer state the caller names allocated as the Optimizer allocates it.
// Nothing is allocated, so it runs for any model size, and the plan cannot drift from what
// the engine does (tests/test_memory_plan.cpp checks it against measured peaks).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/backend/counting_runtime.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/fsdp/grad_clip.hpp"

namespace fsdp {
namespace {

class NoWork final : public Work {
 public:
  void wait() override {}
  std::shared_ptr<Event> done() override { return std::make_shared<HostEvent>(); }
};

// Rank 0 of a group of `size` whose collectives do nothing.
class SilentCommunicator final : public Communicator {
 public:
  explicit SilentCommunicator(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu; }
  Stream& default_stream() override { return stream_; }
  void barrier() override {}
  std::unique_ptr<Communicator> split(int, int) override {
    throw Error("memory plan: split is not available");
  }
  std::unique_ptr<Communicator> split_node() override {
    throw Error("memory plan: split_node is not available");
  }

 protected:
  std::unique_ptr<Work> all_gather_impl(const void*, void*, std::size_t, DType, Stream&) override {
    return std::make_unique<NoWork>();
  }
  std::unique_ptr<Work> reduce_scatter_impl(const void*, void*, std::size_t, DType, ReduceOp,
                                            Stream&) override {
    return std::make_unique<NoWork>();
  }
  std::unique_ptr<Work> all_reduce_impl(const void*, void*, std::size_t, DType, ReduceOp,
                                        Stream&) override {
    return std::make_unique<NoWork>();
  }
  std::unique_ptr<Work> broadcast_impl(void*, std::size_t, DType, int, Stream&) override {
    return std::make_unique<NoWork>();
  }
  // Count 0 or a group of one (NO_SHARD's shard group, a world of one): no copy either, the
  // buffers are the counting runtime's, never backed by memory.
  std::unique_ptr<Work> local_impl(const char*, const void*, void*, std::size_t, DType,
                                   Stream&) override {
    return std::make_unique<NoWork>();
  }

 private:
  int size_;
  HostStream stream_;
};

}  // namespace

EngineMemoryPlan plan_memory(const std::vector<ModuleDecl>& modules, const Config& config,
                             int world_size, int shard_group_size, int optimizer_states) {
  const int shards = static_cast<int>(
      shards_for(config.fsdp.sharding_strategy, world_size, shard_group_size));
  SilentCommunicator shard(shards), replicate(world_size / shards);
  CountingRuntime be, host;  // host: fsdp.cpu_offload's shards, gradients, optimizer state
  const bool offload = config.fsdp.offloaded();
  FsdpEngine engine(modules, config.fsdp, config.mixed_precision, shard, replicate, be,
                    config.train.seed, /*initialise=*/false, offload ? &host : nullptr);
  GradNormClipper clipper(engine);  // its scalars, allocated where the trainer allocates them
  // The optimizer state: Optimizer::add_shard's tensors, unit by unit, on the shards' runtime.
  std::vector<DeviceBuffer> optimizer_state;
  for (int u = 0; u < engine.num_units(); ++u) {
    for (int i = 0; i < optimizer_states; ++i) {
      optimizer_state.push_back(DeviceBuffer::floats(engine.shard_runtime(u),
                                                     engine.shard_param(u).numel(),
                                                     MemCategory::optimizer_state));
    }
  }
  engine.write_shards([] {});  // what the trainer does once the shards hold their values
  // One training pass, modules entered in declaration order and left in reverse (the
  // ModuleHooks contract), then the pass's end as the trainer runs it.
  const int M = static_cast<int>(modules.size());
  auto pass = [&](bool boundary) {
    engine.set_gradient_accumulation_boundary(boundary);
    engine.begin_step(true);
    for (int m = 0; m < M; ++m) {
      engine.pre_forward(m);
      engine.post_forward(m);
    }
    for (int m = M - 1; m >= 0; --m) {
      engine.pre_backward(m);
      engine.post_backward(m);
    }
    engine.end_step();
  };
  // A step of several micro-batches (gradient accumulation) runs passes before the last one
  // (offloaded, those accumulate on the device; sharded, a pass's reductions and buffers are
  // still alive when the next one gathers): every pass of the step, as the trainer runs them,
  // so the peak is the step's whatever pass reaches it.
  const int64_t local = config.train.global_batch_size / std::max(1, world_size);
  const int64_t micro = micro_batch_size(config.train, world_size);
  const int64_t passes = micro > 0 ? std::max<int64_t>(1, local / micro) : 1;
  for (int64_t i = 0; i + 1 < passes; ++i) pass(false);
  pass(true);
  auto rows = [](const MemoryTracker& t) {
    auto peak = [&](MemCategory c) { return static_cast<int64_t>(t.peak(c)); };
    MemoryRows r;
    r.sharded_params = peak(MemCategory::sharded_params);
    r.grads = peak(MemCategory::grads);
    r.optimizer_state = peak(MemCategory::optimizer_state);
    r.unsharded_params = peak(MemCategory::unsharded_params);
    r.unsharded_grads = peak(MemCategory::unsharded_grads);
    r.comm_buffers = peak(MemCategory::comm_buffers);
    r.total = static_cast<int64_t>(t.peak_total());
    return r;
  };
  EngineMemoryPlan p;
  static_cast<MemoryRows&>(p) = rows(be.memory());
  p.offload = offload;
  if (offload) p.host = rows(host.memory());
  if (config.stages_async_saves()) p.save_staging = shard_file_bytes(engine, optimizer_states);
  return p;
}

int64_t shard_file_bytes(const FsdpEngine& engine, int optimizer_states) {
  int64_t bytes = 0;
  for (int u = 0; u < engine.num_units(); ++u) {
    bytes += engine.layout(u).shard_numel * (1 + optimizer_states) *
             static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

}  // namespace fsdp
