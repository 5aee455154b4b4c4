// fsdp/data/sampler.hpp: which training samples each data-parallel rank reads at each step.
//
// Samples are the non-overlapping windows of the training stream: with L = seq_len, sample i
// is tokens [i*L, i*L + L + 1) (inputs the first L, targets the last L), so
// num_samples = (num_tokens - 1) / L. This is torch.utils.data.DistributedSampler
// (shuffle=True, drop_last=True, set_epoch(e) every epoch) adapted so that the GLOBAL batch
// of a step does not depend on the world size:
//   * epoch e visits the samples in the order of a permutation that is a pure function of
//     (seed, e): Fisher-Yates with swap j = rng::below(i + 1, seed, stream(e), counter = i);
//   * an epoch is floor(num_samples / G) steps of G = global_batch_size samples (the tail that
//     does not fill a global batch is dropped, like drop_last); global step s belongs to epoch
//     s / steps_per_epoch and takes the permutation's entries [p*G, p*G + G), p = s % steps;
//   * data-parallel rank r of D takes the contiguous slice [r*G/D, (r+1)*G/D) of that global
//     batch (torch strides rank::D over the whole epoch instead, which depends on D).
// So the union over ranks of a step's samples equals the 1-rank batch, and the only state a
// resumed run needs is the global step (epoch and position follow from it).
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp::data {

// Number of training samples of L = seq_len tokens (+1 target) in a stream of num_tokens.
// Throws fsdp::InputError naming data.seq_len if seq_len < 1.
int64_t num_samples_of(int64_t num_tokens, int64_t seq_len);

class DistributedSampler {
 public:
  // Throws fsdp::InputError naming train.global_batch_size if global_batch < 1, if it is not
  // a multiple of dp_size, or if num_samples < global_batch (not one full step per epoch;
  // the message also names data.seq_len); fsdp::Error if dp_rank is not in [0, dp_size).
  DistributedSampler(int64_t num_samples, int64_t global_batch, int dp_rank, int dp_size, uint64_t seed);

  int64_t num_samples() const { return num_samples_; }
  int64_t global_batch() const { return global_batch_; }
  int64_t local_batch() const { return global_batch_ / dp_size_; }  // G / D samples per rank
  int64_t steps_per_epoch() const { return num_samples_ / global_batch_; }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch(); }
  // Index of `step` within its epoch, in [0, steps_per_epoch()).
  int64_t position_in_epoch(int64_t step) const { return step % steps_per_epoch(); }

  // The order of the samples in `epoch` (a permutation of [0, num_samples)).
  std::vector<int64_t> epoch_permutation(int64_t epoch) const;
  // All G sample indices of global step `step` (>= 0), in batch order.
  std::vector<int64_t> global_indices(int64_t step) const;
  // This rank's G / D sample indices of `step`: global_indices(step)[r*G/D, (r+1)*G/D).
  std::vector<int64_t> sample_indices(int64_t step) const;

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;  // cached per epoch

  int64_t num_samples_;
  int64_t global_batch_;
  int dp_rank_;
  int dp_size_;
  uint64_t seed_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> cached_perm_;
};

}  // namespace fsdp::data
