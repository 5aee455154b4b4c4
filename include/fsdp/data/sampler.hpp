// fsdp/data/sampler.hpp: which training samples each data-parallel rank reads at each step.
//
// Samples are the non-overlapping windows of the training stream: with L = seq_len, sample i
// is tokens [i*L, i*L + L + 1) (inputs the first L, targets the last L), so
// num_samples = (num_tokens - 1) / L. This is torch.utils.data.DistributedSampler
// (shuffle=True, drop_last=True, set_epoch(e) every epoch) adapted so that the GLOBAL batch
// of a step does not depend on the world size:
//   * epoch e visits the samples in the order of a permutation that is a pure function of
//     (seed, e), computed per position without a table (a keyed Feistel bijection, cycle-
//     walked into [0, num_samples): tf.random.experimental.index_shuffle's idea; sampler.cpp
//     IndexShuffle), so neither memory nor set-up time grows with the dataset;
//   * an epoch is floor(num_samples / G) steps of G = global_batch_size samples (the tail that
//     does not fill a global batch is dropped, like drop_last); global step s belongs to epoch
//     s / steps_per_epoch and takes the permutation's entries [p*G, p*G + G), p = s % steps;
//   * data-parallel rank r of D takes the contiguous slice [r*G/D, (r+1)*G/D) of that global
//     batch (torch strides rank::D over the whole epoch instead, which depends on D).
// So the union over ranks of a step's samples equals the 1-rank batch, and the only state a
// resumed run needs is the global step (epoch and position follow from it).
//
// A data mixture (data.paths, docs/data.md "Data mixtures"): the samples are the
// concatenation of the files' (part d owns indices offset_d + [0, n_d)), and the global
// batches are consecutive positions j = step*G + k of one blended stream:
//   * position j draws from the part d that maximises w_d * (j + 1) - c_d, c_d being the
//     draws of part d before j (ties: the lowest d); w = weights / sum(weights). This is
//     Megatron-LM's blending rule (build_blending_indices): after n positions every part has
//     drawn round(w_d * n) samples give or take one, at every step and for any batch size;
//   * the c-th draw of part d is its sample perm_d(c / n_d)[c % n_d]: each part runs through
//     its own epochs, each a permutation of its samples that is a pure function of (seed, d,
//     epoch) (the same table-free bijection), so a part drawn more than its size repeats
//     itself only after it has shown every sample, and a part drawn less shows a different
//     subset in each of its epochs.
// The ranks' slices and the world-size independence are as above; the resume state is still
// the global step (a resumed sampler replays the blending rule from position 0: D operations
// per position, 1.0 s per 10^8 positions with 3 files, docs/data.md).
#pragma once

#include <algorithm>
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
  // A data mixture of parts with `part_samples[d]` (>= 1) samples each, drawn with
  // `weights[d]` (> 0, any scale; empty = part_samples, a blend in the parts' natural
  // proportions). Throws fsdp::InputError naming train.global_batch_size as above (a mixture
  // needs no full batch per part: parts repeat), fsdp::Error if a part is empty or the sizes
  // of part_samples and weights differ.
  DistributedSampler(std::vector<int64_t> part_samples, std::vector<double> weights,
                     int64_t global_batch, int dp_rank, int dp_size, uint64_t seed);

  int64_t num_samples() const { return num_samples_; }  // a mixture's: summed over its parts
  int64_t global_batch() const { return global_batch_; }
  int64_t local_batch() const { return global_batch_ / dp_size_; }  // G / D samples per rank
  // A mixture's "epoch" is num_samples() positions of the blend (at least one step): a unit for
  // the banner and the checkpoint's sampler_epoch, not a pass over every part.
  int64_t steps_per_epoch() const { return std::max<int64_t>(1, num_samples_ / global_batch_); }
  int64_t epoch_of(int64_t step) const { return step / steps_per_epoch(); }
  // Index of `step` within its epoch, in [0, steps_per_epoch()).
  int64_t position_in_epoch(int64_t step) const { return step % steps_per_epoch(); }

  // The order of the samples in `epoch` (a permutation of [0, num_samples)), materialised
  // (num_samples entries: for tests; the sampler itself never builds it).
  std::vector<int64_t> epoch_permutation(int64_t epoch) const;
  // A mixture's parts: samples and normalised weights (sum 1); empty for one file.
  const std::vector<int64_t>& part_samples() const { return part_samples_; }
  const std::vector<double>& part_weights() const { return part_weights_; }
  // Part d's draws among the first `positions` positions of the blend (a mixture only;
  // tests and the banner).
  std::vector<int64_t> part_draws(int64_t positions) const;
  // All G sample indices of global step `step` (>= 0), in batch order.
  std::vector<int64_t> global_indices(int64_t step) const;
  // This rank's G / D sample indices of `step`: global_indices(step)[r*G/D, (r+1)*G/D).
  std::vector<int64_t> sample_indices(int64_t step) const;

 private:
  // Positions [first, first + count) of `step`'s global batch in its epoch's order.
  std::vector<int64_t> positions(int64_t step, int64_t first, int64_t count) const;
  std::vector<int64_t> blended_indices(int64_t step) const;  // a mixture's global_indices
  void advance_blend(int64_t position) const;  // blend state to `position` (replays if behind)
  int64_t draw_part() const;                   // the part of position blend_pos_ (no advance)

  int64_t num_samples_;
  int64_t global_batch_;
  int dp_rank_;
  int dp_size_;
  uint64_t seed_;
  // A mixture: its parts (empty: one file, the plain sampler), their normalised weights,
  // the blend's replay state (next position, draws per part so far).
  std::vector<int64_t> part_samples_, part_offsets_;
  std::vector<double> part_weights_;
  mutable int64_t blend_pos_ = 0;
  mutable std::vector<int64_t> blend_draws_;
  mutable int64_t blend_step_ = -1;          // the last step computed, and its global batch
  mutable std::vector<int64_t> blend_batch_;
};

}  // namespace fsdp::data
