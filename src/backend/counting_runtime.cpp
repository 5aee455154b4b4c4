// The counting runtime (see fsdp/backend/counting_runtime.hpp).
#include "fsdp/backend/counting_runtime.hpp"

namespace fsdp {

std::unique_ptr<Stream> CountingRuntime::create_stream() { return std::make_unique<HostStream>(); }
std::unique_ptr<Event> CountingRuntime::create_event() { return std::make_unique<HostEvent>(); }

void* CountingRuntime::allocate(std::size_t bytes, MemCategory category) {
  if (bytes == 0) return nullptr;
  memory_.on_alloc(category, bytes);
  next_ += CachingAllocator::round_size(bytes) + 512;
  return reinterpret_cast<void*>(next_);
}

void CountingRuntime::deallocate(void* ptr, std::size_t bytes, MemCategory category,
                                 std::shared_ptr<Event>) noexcept {
  if (ptr) memory_.on_free(category, bytes);
}

}  // namespace fsdp
