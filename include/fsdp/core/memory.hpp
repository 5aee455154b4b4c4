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

#include "fsdp/core/enum_names.hpp"

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
template <>
struct EnumNames<MemCategory> {
  static constexpr EnumName<MemCategory> table[] = {
      {MemCategory::sharded_params, "sharded_params"},
      {MemCategory::unsharded_params, "unsharded_params"},
      {MemCategory::grads, "grads"},
      {MemCategory::unsharded_grads, "unsharded_grads"},
      {MemCategory::optimizer_state, "optimizer_state"},
      {MemCategory::activations, "activations"},
      {MemCategory::comm_buffers, "comm_buffers"},
      {MemCategory::other, "other"}};
};
// Its table's name; "unknown" for count_.
constexpr std::string_view to_string(MemCategory c) { return enum_name(c, "unknown"); }

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
