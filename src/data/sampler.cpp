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

namespace {

// The checks of both constructors on the batch and the data-parallel split.
void check_batch_split(int64_t global_batch, int dp_rank, int dp_size) {
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
}

// A keyed bijection of [0, n) computed per index, with no table (TensorFlow's
// tf.random.experimental.index_shuffle and Grain's index_shuffle do the same): a balanced
// Feistel network of kRounds rounds over the 2h-bit domain [0, 4^h), 4^h the smallest power
// of 4 >= n (h >= 1), whose round function is rng::mix64 of (key, round, right half), then
// cycle-walked into [0, n) (a value >= n is enciphered again; 4^h < 4n, so fewer than 4
// encipherings on average). A Feistel network is a bijection of its domain for any round
// function, and cycle-walking a bijection of [0, 4^h) restricted to the cycles' elements
// below n is one of [0, n). 8 bytes of state instead of 8 bytes a sample: 10^9 samples cost
// no memory and no time to set up an epoch (Fisher-Yates needed both, 8 GB a rank).
class IndexShuffle {
 public:
  IndexShuffle(int64_t n, uint64_t key) : n_(static_cast<uint64_t>(n)), key_(key) {
    if (n < 1 || n > (int64_t{1} << 62)) {
      throw Error("IndexShuffle: " + std::to_string(n) + " elements (expected 1 .. 2^62)");
    }
    while ((uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
    mask_ = (uint64_t{1} << half_bits_) - 1;
  }
  int64_t operator()(int64_t i) const {
    uint64_t x = static_cast<uint64_t>(i);
    do {
      x = encipher(x);
    } while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  static constexpr uint64_t kRounds = 6;
  uint64_t encipher(uint64_t x) const {
    uint64_t left = x >> half_bits_, right = x & mask_;
    for (uint64_t round = 0; round < kRounds; ++round) {
      const uint64_t f = rng::mix64(key_ ^ rng::mix64((round << 58) ^ right)) & mask_;
      const uint64_t next = left ^ f;
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }
  uint64_t n_, key_, mask_ = 0;
  unsigned half_bits_ = 1;
};

// The order of n samples drawn from stream `stream` of `seed`.
IndexShuffle keyed_shuffle(int64_t n, uint64_t seed, uint64_t stream) {
  return IndexShuffle(n, rng::mix64(rng::mix64(seed) ^ stream));
}

// Epoch `epoch`'s order of the sampler's num_samples.
IndexShuffle epoch_shuffle(int64_t n, uint64_t seed, int64_t epoch) {
  static const uint64_t key = rng::key_of("data.sampler.epoch");
  return keyed_shuffle(n, seed, rng::mix64(key ^ static_cast<uint64_t>(epoch)));
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t num_samples, int64_t global_batch, int dp_rank,
                                       int dp_size, uint64_t seed)
    : num_samples_(num_samples), global_batch_(global_batch), dp_rank_(dp_rank), dp_size_(dp_size),
      seed_(seed) {
  check_batch_split(global_batch, dp_rank, dp_size);
  if (num_samples < global_batch) {
    throw InputError("train.global_batch_size: " + std::to_string(global_batch) + " exceeds the " +
                     std::to_string(num_samples) +
                     " training samples of data.seq_len tokens (expected at least one full global batch; "
                     "use a smaller batch, a shorter data.seq_len or more data)");
  }
}

DistributedSampler::DistributedSampler(std::vector<int64_t> part_samples,
                                       std::vector<double> weights, int64_t global_batch,
                                       int dp_rank, int dp_size, uint64_t seed)
    : num_samples_(0), global_batch_(global_batch), dp_rank_(dp_rank), dp_size_(dp_size),
      seed_(seed) {
  check_batch_split(global_batch, dp_rank, dp_size);
  if (part_samples.empty()) throw Error("DistributedSampler: a mixture of no parts");
  if (weights.empty()) weights.assign(part_samples.begin(), part_samples.end());
  if (weights.size() != part_samples.size()) {
    throw Error("DistributedSampler: " + std::to_string(weights.size()) + " weights for " +
                std::to_string(part_samples.size()) + " parts");
  }
  double total = 0;
  for (std::size_t d = 0; d < part_samples.size(); ++d) {
    if (part_samples[d] < 1 || !(weights[d] > 0)) {
      throw Error("DistributedSampler: part " + std::to_string(d) + " has " +
                  std::to_string(part_samples[d]) + " samples and weight " +
                  std::to_string(weights[d]) + " (expected >= 1 and > 0)");
    }
    part_offsets_.push_back(num_samples_);
    num_samples_ += part_samples[d];
    total += weights[d];
  }
  for (double w : weights) part_weights_.push_back(w / total);
  part_samples_ = std::move(part_samples);
  blend_draws_.assign(part_samples_.size(), 0);
}

std::vector<int64_t> DistributedSampler::epoch_permutation(int64_t epoch) const {
  const IndexShuffle order = epoch_shuffle(num_samples_, seed_, epoch);
  std::vector<int64_t> p(static_cast<std::size_t>(num_samples_));
  for (int64_t i = 0; i < num_samples_; ++i) p[static_cast<std::size_t>(i)] = order(i);
  return p;
}

int64_t DistributedSampler::draw_part() const {
  std::size_t best = 0;
  double best_gap = 0;
  for (std::size_t d = 0; d < part_weights_.size(); ++d) {
    const double gap = part_weights_[d] * static_cast<double>(blend_pos_ + 1) -
                       static_cast<double>(blend_draws_[d]);
    if (d == 0 || gap > best_gap) {
      best = d;
      best_gap = gap;
    }
  }
  return static_cast<int64_t>(best);
}

void DistributedSampler::advance_blend(int64_t position) const {
  if (position < blend_pos_) {
    blend_pos_ = 0;
    std::fill(blend_draws_.begin(), blend_draws_.end(), 0);
  }
  for (; blend_pos_ < position; ++blend_pos_) ++blend_draws_[static_cast<std::size_t>(draw_part())];
}

std::vector<int64_t> DistributedSampler::part_draws(int64_t positions) const {
  if (part_samples_.empty()) throw Error("DistributedSampler::part_draws: not a mixture");
  advance_blend(positions);
  return blend_draws_;
}

std::vector<int64_t> DistributedSampler::blended_indices(int64_t step) const {
  // The same step again (global_indices then sample_indices): no replay from position 0.
  if (step == blend_step_) return blend_batch_;
  advance_blend(step * global_batch_);
  std::vector<int64_t> out;
  out.reserve(static_cast<std::size_t>(global_batch_));
  for (int64_t k = 0; k < global_batch_; ++k, ++blend_pos_) {
    const auto d = static_cast<std::size_t>(draw_part());
    const int64_t c = blend_draws_[d]++;
    const int64_t n = part_samples_[d], epoch = c / n;
    static const uint64_t key = rng::key_of("data.mixture.part");
    const uint64_t part = rng::mix64(key ^ static_cast<uint64_t>(d));
    const IndexShuffle order =
        keyed_shuffle(n, seed_, rng::mix64(part ^ static_cast<uint64_t>(epoch)));
    out.push_back(part_offsets_[d] + order(c % n));
  }
  blend_step_ = step;
  blend_batch_ = out;
  return out;
}

std::vector<int64_t> DistributedSampler::global_indices(int64_t step) const {
  if (step < 0) throw Error("DistributedSampler: negative step " + std::to_string(step));
  if (!part_samples_.empty()) return blended_indices(step);
  return positions(step, 0, global_batch_);
}

std::vector<int64_t> DistributedSampler::sample_indices(int64_t step) const {
  if (step < 0) throw Error("DistributedSampler: negative step " + std::to_string(step));
  if (!part_samples_.empty()) {
    const std::vector<int64_t> all = blended_indices(step);
    const auto begin = all.begin() + dp_rank_ * local_batch();
    return std::vector<int64_t>(begin, begin + local_batch());
  }
  return positions(step, dp_rank_ * local_batch(), local_batch());
}

std::vector<int64_t> DistributedSampler::positions(int64_t step, int64_t first,
                                                   int64_t count) const {
  const IndexShuffle order = epoch_shuffle(num_samples_, seed_, epoch_of(step));
  const int64_t begin = position_in_epoch(step) * global_batch_ + first;
  std::vector<int64_t> out(static_cast<std::size_t>(count));
  for (int64_t k = 0; k < count; ++k) out[static_cast<std::size_t>(k)] = order(begin + k);
  return out;
}

}  // namespace fsdp::data
