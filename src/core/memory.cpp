// Memory accounting by category (see fsdp/core/memory.hpp).
#include "fsdp/core/memory.hpp"

#include <algorithm>

namespace fsdp {

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
