// fsdp/core/caching_allocator.hpp: a stream-ordered caching allocator (the PyTorch CUDA
// caching allocator's idea, reduced to what the FSDP engine needs).
//
// Blocks are cached by size class (bytes rounded up to 512) and reused instead of being
// returned to the system, so a steady-state training step allocates and frees nothing: the
// unsharded units and gradients of step 2 reuse the blocks of step 1. A block freed while
// other work may still read or write it (the input of an in-flight reduce-scatter) is freed
// with that work's completion Event; it is handed out again only once the event completes,
// or after the allocating stream has been made to wait on it (Stream::wait), so reuse is
// ordered after the pending work without blocking the host on a device.
//
// Accounting: the MemoryTracker sees logical bytes (what callers hold, by MemCategory);
// stats() reports the raw allocations, frees and reserved bytes underneath. Not
// thread-safe (one per backend, used from the thread that drives it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "fsdp/core/memory.hpp"
#include "fsdp/core/stream.hpp"

namespace fsdp {

struct AllocatorStats {
  int64_t raw_allocs = 0;       // calls to the raw allocator (cudaMalloc / aligned_alloc)
  int64_t raw_frees = 0;        // calls to the raw free
  int64_t cache_hits = 0;       // allocations served from the cache
  int64_t reserved_bytes = 0;   // bytes held from the system (in use + cached)
};

class CachingAllocator {
 public:
  using RawAlloc = std::function<void*(std::size_t bytes)>;  // returns nullptr when out of memory
  using RawFree = std::function<void(void*)>;

  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, MemoryTracker& tracker);
  ~CachingAllocator();  // returns every cached block (blocks still in use are leaked: a bug)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` bytes for use on `stream`. Throws fsdp::Error naming the
  // size and category when the raw allocator fails even after the cache is emptied.
  void* allocate(std::size_t bytes, MemCategory category, Stream& stream);
  // Returns `ptr` (from allocate, with the same bytes and category) to the cache. With
  // `pending`, the block is not reused before that event completes. Never throws.
  void deallocate(void* ptr, std::size_t bytes, MemCategory category,
                  std::shared_ptr<Event> pending = nullptr) noexcept;
  // Returns all cached blocks whose pending work is complete to the system.
  void empty_cache();
  // true: an allocation takes the cached block of its size class with the lowest address (the
  // stream made to wait on its pending work if any; PyTorch's allocator also picks by
  // address), so which block it gets depends only on which blocks are cached, never on how
  // far the device has got, and a step that frees and allocates the same blocks as the step
  // before gets them in the same places (taking the oldest instead would rotate them).
  // train.cuda_graphs needs that for a segment's pointers, and so its record, to repeat step
  // after step (fsdp/model/graphed_kernels.hpp). false (the default): the oldest block whose
  // pending work is done, else the oldest.
  void set_ordered_reuse(bool on) { ordered_ = on; }
  const AllocatorStats& stats() const { return stats_; }
  static std::size_t round_size(std::size_t bytes) { return (bytes + 511) / 512 * 512; }

 private:
  struct Cached {
    void* ptr;
    std::shared_ptr<Event> pending;
  };
  RawAlloc raw_alloc_;
  RawFree raw_free_;
  MemoryTracker& tracker_;
  std::map<std::size_t, std::vector<Cached>> cache_;  // size class -> free blocks
  AllocatorStats stats_;
  bool ordered_ = false;
};

}  // namespace fsdp
