// fsdp/backend/counting_runtime.hpp: a DeviceRuntime that computes nothing and counts.
//
// Every operation is a no-op and memory is never touched: allocate() hands out distinct fake
// addresses and records the bytes by category in its MemoryTracker. The --dry-run memory plan
// (plan_memory, fsdp/fsdp/engine.hpp) drives the real engine and optimizer through a step on
// it, so the plan is what the engine allocates, for any model size, without allocating it.
// It implements only the runtime (fsdp/backend/device_runtime.hpp): the engine and the
// optimizers call nothing else. Nothing it returns may be dereferenced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fsdp/backend/device_runtime.hpp"

namespace fsdp {

class CountingRuntime final : public DeviceRuntime {
 public:
  Device device() const override { return Device::cpu; }
  Stream& compute_stream() override { return stream_; }
  std::unique_ptr<Stream> create_stream() override;
  std::unique_ptr<Event> create_event() override;
  void* allocate(std::size_t bytes, MemCategory category) override;
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event>) noexcept override;
  MemoryTracker& memory() override { return memory_; }
  const AllocatorStats& allocator_stats() const override { return stats_; }
  void set_ordered_reuse(bool) override {}  // no memory behind it
  void fill_zero(const TensorView&) override {}
  void copy(const TensorView&, const TensorView&) override {}
  void cast(const TensorView&, const TensorView&) override {}
  void copy_to_host(void*, const TensorView&) override {}
  void copy_from_host(const TensorView&, const void*) override {}
  void copy_to_host_async(void*, const TensorView&, Stream&) override {}
  void copy_from_host_async(const TensorView&, const void*, Stream&) override {}
  void synchronize() override {}
  void axpy(const TensorView&, float, const TensorView&) override {}
  void squared_norm(const TensorView&, const TensorView&) override {}
  void clip_coefficient(const TensorView&, const TensorView&, const TensorView&, double) override {}
  void scale_by(const TensorView&, const TensorView&) override {}
  void unscale_and_check(const TensorView&, float, const TensorView&) override {}
  void adamw_update(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                    float, float, float, float, const WeightDecay&, int64_t,
                    const TensorView& = {}, const TensorView& = {}) override {}
  void sgd_update(const TensorView&, const TensorView&, const TensorView&, float, float,
                  const WeightDecay&, int64_t, const TensorView& = {},
                  const TensorView& = {}) override {}

 private:
  HostStream stream_;
  MemoryTracker memory_;
  AllocatorStats stats_;
  std::uintptr_t next_ = 0x10000;
};

}  // namespace fsdp
