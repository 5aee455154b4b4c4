// fsdp/core/memory.hpp: memory accounting by category, and an owning buffer.
//
// Memory is planned, not discovered: every allocation the trainer makes is tagged with a
// MemCategory, and MemoryTracker keeps current and peak bytes per category and in total.
// `--dry-run` predicts the same categories (see fsdp/fsdp/memory_plan.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdp {

enum class MemCategory : int {
  sharded_params = 0,  // this rank's fp32 master shards (FlatParameter local shard)
  unsharded_params,    // all-gathered full units, in param_dtype
  grads,               // fp32 gradient shards
  unsharded_grads,     // full unit gradients during backward, in param_dtype
  optimizer_state,     // AdamW exp_avg/exp_avg_sq or SGD momentum, on the shard
  activations,         // saved forward activations and their grads
  comm_buffers,        // staging for collectives (reduce_dtype casts, reduction results)
  other,
  count_
};
inline constexpr int kNumMemCategories = static_cast<int>(MemCategory::count_);
std::string_view to_string(MemCategory c);

// Current and peak bytes per category on one rank. Not thread-safe (one per backend).
class MemoryTracker {
 public:
  void on_alloc(MemCategory c, std::size_t bytes);
  void on_free(MemCategory c, std::size_t bytes);
  std::size_t current(MemCategory c) const { return current_[static_cast<int>(c)]; }
  std::size_t peak(MemCategory c) const { return peak_[static_cast<int>(c)]; }
  std::size_t current_total() const { return total_; }
  std::size_t peak_total() const { return peak_total_; }
  void reset_peaks();

 private:
  std::array<std::size_t, kNumMemCategories> current_{};
  std::array<std::size_t, kNumMemCategories> peak_{};
  std::size_t total_ = 0;
  std::size_t peak_total_ = 0;
};

}  // namespace fsdp
