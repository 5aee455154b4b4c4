// Stream-ordered caching allocator (see fsdp/core/caching_allocator.hpp).
#include "fsdp/core/caching_allocator.hpp"

#include <functional>

#include <sstream>

#include "fsdp/core/error.hpp"

namespace fsdp {

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free, MemoryTracker& tracker)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)), tracker_(tracker) {}

CachingAllocator::~CachingAllocator() {
  for (auto& [size, blocks] : cache_) {
    for (auto& b : blocks) {
      if (b.pending) b.pending->synchronize();
      raw_free_(b.ptr);
    }
  }
}

void* CachingAllocator::allocate(std::size_t bytes, MemCategory category, Stream& stream) {
  if (bytes == 0) return nullptr;
  const std::size_t size = round_size(bytes);
  auto it = cache_.find(size);
  if (it != cache_.end() && !it->second.empty()) {
    auto& blocks = it->second;
    // Prefer a block whose pending work is done; otherwise order the stream after the
    // oldest pending one (the first freed). Ordered reuse: the lowest address, always.
    std::size_t pick = 0;
    if (ordered_) {
      for (std::size_t i = 1; i < blocks.size(); ++i) {
        if (std::less<void*>()(blocks[i].ptr, blocks[pick].ptr)) pick = i;
      }
    } else {
      for (std::size_t i = 0; i < blocks.size(); ++i) {
        if (!blocks[i].pending || blocks[i].pending->query()) {
          pick = i;
          break;
        }
      }
    }
    Cached b = std::move(blocks[pick]);
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(pick));
    if (b.pending && !b.pending->query()) stream.wait(*b.pending);
    ++stats_.cache_hits;
    tracker_.on_alloc(category, bytes);
    return b.ptr;
  }
  void* p = raw_alloc_(size);
  if (!p) {
    empty_cache();
    p = raw_alloc_(size);
  }
  if (!p) {
    std::ostringstream os;
    os << "out of memory: cannot allocate " << bytes << " bytes for " << to_string(category)
       << " (" << tracker_.current_total() << " bytes in use)";
    throw Error(os.str());
  }
  ++stats_.raw_allocs;
  stats_.reserved_bytes += static_cast<int64_t>(size);
  tracker_.on_alloc(category, bytes);
  return p;
}

void CachingAllocator::deallocate(void* ptr, std::size_t bytes, MemCategory category,
                                  std::shared_ptr<Event> pending) noexcept {
  if (!ptr) return;
  tracker_.on_free(category, bytes);
  try {
    cache_[round_size(bytes)].push_back({ptr, std::move(pending)});
  } catch (...) {  // bad_alloc growing the free list: give the block back instead
    raw_free_(ptr);
    ++stats_.raw_frees;
    stats_.reserved_bytes -= static_cast<int64_t>(round_size(bytes));
  }
}

void CachingAllocator::empty_cache() {
  for (auto& [size, blocks] : cache_) {
    std::vector<Cached> keep;
    for (auto& b : blocks) {
      if (b.pending && !b.pending->query()) {
        keep.push_back(std::move(b));
        continue;
      }
      raw_free_(b.ptr);
      ++stats_.raw_frees;
      stats_.reserved_bytes -= static_cast<int64_t>(size);
    }
    blocks = std::move(keep);
  }
}

}  // namespace fsdp
