// DistributedSampler: world-size-independent shuffled global batches (see sampler.hpp).
#include "fsdp/data/sampler.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "fsdp/core/error.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp::data {

int64_t num_samples_of(int64_t num_tokens, int64_t seq_len) {
  if (seq_len < 1) throw InputError("data.seq_len: " + std::to_string(seq_len) + " (expected >= 1)");
  return num_tokens < 1 ? 0 : (num_tokens - 1) / seq_len;
}

DistributedSampler::DistributedSampler(int64_t num_samples, int64_t global_batch, int dp_rank, int dp_size,
                                       uint64_t seed)
    : num_samples_(num_samples), global_batch_(global_batch), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw Error("DistributedSampler: data-parallel rank " + std::to_string(dp_rank) + " of " +
                std::to_string(dp_size) + " (expected 0 <= rank < size)");
  }
  if (global_batch < 1) {
    throw InputError("train.global_batch_size: " + std::to_string(global_batch) + " (expected >= 1)");
  }
  if (global_batch % dp_size != 0) {
    throw InputError("train.global_batch_size: " + std::to_string(global_batch) +
                     " is not a multiple of the data-parallel world size " + std::to_string(dp_size) +
                     " (expected global_batch_size % data-parallel ranks == 0)");
  }
  if (num_samples < global_batch) {
    throw InputError("train.global_batch_size: " + std::to_string(global_batch) + " exceeds the " +
                     std::to_string(num_samples) +
                     " training samples of data.seq_len tokens (expected at least one full global batch; "
                     "use a smaller batch, a shorter data.seq_len or more data)");
  }
}

std::vector<int64_t> DistributedSampler::epoch_permutation(int64_t epoch) const {
  std::vector<int64_t> p(static_cast<std::size_t>(num_samples_));
  std::iota(p.begin(), p.end(), int64_t{0});
  const uint64_t stream = rng::mix64(rng::key_of("data.sampler.epoch") ^ static_cast<uint64_t>(epoch));
  for (int64_t i = num_samples_ - 1; i > 0; --i) {  // Fisher-Yates (Durstenfeld)
    const auto j = static_cast<int64_t>(rng::below(static_cast<uint64_t>(i + 1), seed_, stream, static_cast<uint64_t>(i)));
    std::swap(p[static_cast<std::size_t>(i)], p[static_cast<std::size_t>(j)]);
  }
  return p;
}

const std::vector<int64_t>& DistributedSampler::permutation(int64_t epoch) const {
  if (epoch != cached_epoch_) {
    cached_perm_ = epoch_permutation(epoch);
    cached_epoch_ = epoch;
  }
  return cached_perm_;
}

std::vector<int64_t> DistributedSampler::global_indices(int64_t step) const {
  if (step < 0) throw Error("DistributedSampler: negative step " + std::to_string(step));
  const auto& p = permutation(epoch_of(step));
  const auto begin = p.begin() + position_in_epoch(step) * global_batch_;
  return std::vector<int64_t>(begin, begin + global_batch_);
}

std::vector<int64_t> DistributedSampler::sample_indices(int64_t step) const {
  if (step < 0) throw Error("DistributedSampler: negative step " + std::to_string(step));
  const auto& p = permutation(epoch_of(step));
  const auto begin = p.begin() + position_in_epoch(step) * global_batch_ + dp_rank_ * local_batch();
  return std::vector<int64_t>(begin, begin + local_batch());
}

}  // namespace fsdp::data
