// The --dry-run memory plan (see plan_memory in fsdp/fsdp/engine.hpp): the real FsdpEngine
// and Optimizer driven through one training step on a backend that only counts allocations
// and on communicators that move nothing. Nothing is allocated, so it runs for any model
// size, and the plan cannot drift from what the engine does.
#include <cstdint>

#include "fsdp/core/error.hpp"
#include "fsdp/fsdp/engine.hpp"
#include "fsdp/optim/optimizer.hpp"

namespace fsdp {
namespace {

// Hands out distinct fake addresses and records every allocation in its MemoryTracker; all
// kernels are no-ops. Never dereferences anything.
class CountingBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  Stream& compute_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override { return std::make_unique<HostStream>(); }
  std::unique_ptr<Event> create_event() override { return std::make_unique<HostEvent>(); }
  void* allocate(std::size_t bytes, MemCategory category) override {
    if (bytes == 0) return nullptr;
    memory_.on_alloc(category, bytes);
    next_ += CachingAllocator::round_size(bytes) + 512;
    return reinterpret_cast<void*>(next_);
  }
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event>) noexcept override {
    if (ptr) memory_.on_free(category, bytes);
  }
  MemoryTracker& memory() override { return memory_; }
  const AllocatorStats& allocator_stats() const override { return stats_; }
  void fill_zero(const TensorView&) override {}
  void copy(const TensorView&, const TensorView&) override {}
  void cast(const TensorView&, const TensorView&) override {}
  void copy_to_host(void*, const TensorView&) override {}
  void copy_from_host(const TensorView&, const void*) override {}
  void synchronize() override {}
  void gemm(bool, bool, int64_t, int64_t, int64_t, float, const TensorView&, const TensorView&,
            float, const TensorView&) override {}
  void add_bias(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void bias_backward(const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void add(const TensorView&, const TensorView&, const TensorView&) override {}
  void axpy(const TensorView&, float, const TensorView&) override {}
  void scale(const TensorView&, float) override {}
  void squared_norm(const TensorView&, const TensorView&) override {}
  void clip_coefficient(const TensorView&, const TensorView&, const TensorView&, double) override {}
  void scale_by(const TensorView&, const TensorView&) override {}
  void unscale_and_check(const TensorView&, float, const TensorView&) override {}
  void embedding_forward(const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, int64_t, int64_t, int64_t) override {}
  void embedding_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, int64_t, int64_t, int64_t) override {}
  void layernorm_forward(const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t, float) override {}
  void layernorm_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void gelu_forward(const TensorView&, const TensorView&) override {}
  void gelu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void attention_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                         int64_t, int64_t, int64_t) override {}
  void attention_backward(const TensorView&, const TensorView&, const TensorView&,
                          const TensorView&, const TensorView&, int64_t, int64_t, int64_t,
                          int64_t) override {}
  void cross_entropy_forward_backward(const TensorView&, const TensorView&, const TensorView&,
                                      int64_t, int64_t, float) override {}
  void cross_entropy_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t) override {}
  void embedding_lookup_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                int64_t) override {}
  void embedding_lookup_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                                 int64_t) override {}
  void rmsnorm_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       int64_t, int64_t, float) override {}
  void rmsnorm_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                        const TensorView&, const TensorView&, int64_t, int64_t) override {}
  void relu_forward(const TensorView&, const TensorView&) override {}
  void relu_backward(const TensorView&, const TensorView&, const TensorView&) override {}
  void mul(const TensorView&, const TensorView&, const TensorView&) override {}
  void position_bias_forward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                             int64_t, int64_t) override {}
  void position_bias_backward(const TensorView&, const TensorView&, const TensorView&, int64_t,
                              int64_t, int64_t) override {}
  void mha_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                   const TensorView&, const TensorView&, const TensorView&, int64_t, int64_t,
                   int64_t, int64_t, int64_t, float, bool) override {}
  void mha_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    int64_t, int64_t, int64_t, int64_t, int64_t, float, bool) override {}
  void adamw_update(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    float, float, float, float, float, int64_t) override {}
  void sgd_update(const TensorView&, const TensorView&, const TensorView&, float, float, float,
                  int64_t) override {}

 private:
  HostStream stream_;
  MemoryTracker memory_;
  AllocatorStats stats_;
  std::uintptr_t next_ = 0x10000;
};

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

 private:
  int size_;
  HostStream stream_;
};

}  // namespace

EngineMemoryPlan plan_memory(const std::vector<ModuleDecl>& modules, const Config& config,
                             int world_size, int shard_group_size) {
  const int shards = static_cast<int>(
      shards_for(config.fsdp.sharding_strategy, world_size, shard_group_size));
  SilentCommunicator shard(shards), replicate(world_size / shards);
  CountingBackend be;
  FsdpEngine engine(modules, config.fsdp, config.mixed_precision, shard, replicate, be,
                    config.train.seed, /*initialise=*/false);
  Optimizer optimizer(config.optim, be);
  for (int u = 0; u < engine.num_units(); ++u) {
    optimizer.add_shard(engine.shard_param(u), engine.shard_grad(u),
                        decay_segments(engine.layout(u), engine.shard_index()));
  }
  // One training step, modules entered in declaration order and left in reverse (the
  // ModuleHooks contract), then the step's end as the trainer runs it.
  const int M = static_cast<int>(modules.size());
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
  const MemoryTracker& t = be.memory();
  auto peak = [&](MemCategory c) { return static_cast<int64_t>(t.peak(c)); };
  EngineMemoryPlan p;
  p.sharded_params = peak(MemCategory::sharded_params);
  p.grads = peak(MemCategory::grads);
  p.optimizer_state = peak(MemCategory::optimizer_state);
  p.unsharded_params = peak(MemCategory::unsharded_params);
  p.unsharded_grads = peak(MemCategory::unsharded_grads);
  p.comm_buffers = peak(MemCategory::comm_buffers);
  p.total = static_cast<int64_t>(t.peak_total());
  return p;
}

}  // namespace fsdp
