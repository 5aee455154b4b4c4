// Memory accounting by category (see fsdp/core/memory.hpp).
#include "fsdp/core/memory.hpp"

#include <algorithm>

namespace fsdp {

std::string_view to_string(MemCategory c) {
  switch (c) {
    case MemCategory::sharded_params: return "sharded_params";
    case MemCategory::unsharded_params: return "unsharded_params";
    case MemCategory::grads: return "grads";
    case MemCategory::unsharded_grads: return "unsharded_grads";
    case MemCategory::optimizer_state: return "optimizer_state";
    case MemCategory::activations: return "activations";
    case MemCategory::comm_buffers: return "comm_buffers";
    case MemCategory::other: return "other";
    case MemCategory::count_: break;
  }
  return "unknown";
}

void MemoryTracker::on_alloc(MemCategory c, std::size_t bytes) {
  const int i = static_cast<int>(c);
  current_[i] += bytes;
  peak_[i] = std::max(peak_[i], current_[i]);
  total_ += bytes;
  peak_total_ = std::max(peak_total_, total_);
}

void MemoryTracker::on_free(MemCategory c, std::size_t bytes) {
  const int i = static_cast<int>(c);
  current_[i] -= std::min(current_[i], bytes);
  total_ -= std::min(total_, bytes);
}

void MemoryTracker::reset_peaks() {
  peak_ = current_;
  peak_total_ = total_;
}

}  // namespace fsdp
