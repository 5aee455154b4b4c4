// T5 span corruption on one window (see fsdp/data/span_corruption.hpp).
#include "fsdp/data/span_corruption.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/core/rng.hpp"

namespace fsdp::data {

namespace {

// numpy's np.round: to nearest, ties to even (std::nearbyint in the default rounding mode).
int64_t round_half_even(double x) { return static_cast<int64_t>(std::nearbyint(x)); }

}  // namespace

SpanCounts span_counts(int64_t L, double noise_density, double mean_noise_span_length) {
  if (L < 2) {
    throw InputError("data.seq_len: " + std::to_string(L) +
                     " is too short for span_corruption (expected >= 2: one masked and one kept token)");
  }
  if (!(noise_density > 0.0 && noise_density < 1.0)) {
    throw InputError("data.noise_density: " + format_number(noise_density) +
                     " is out of range (expected 0 < x < 1)");
  }
  if (!(mean_noise_span_length >= 1.0)) {
    throw InputError("data.mean_noise_span_length: " + format_number(mean_noise_span_length) +
                     " is out of range (expected >= 1)");
  }
  SpanCounts c;
  c.L = L;
  c.num_noise = std::clamp<int64_t>(round_half_even(static_cast<double>(L) * noise_density), 1, L - 1);
  c.num_spans = std::max<int64_t>(1, round_half_even(static_cast<double>(c.num_noise) / mean_noise_span_length));
  c.num_spans = std::min(c.num_spans, L - c.num_noise);
  return c;
}

std::vector<int64_t> random_segmentation(int64_t num_items, int64_t num_segments, uint64_t seed,
                                         uint64_t stream, uint64_t counter_base) {
  if (num_segments < 1 || num_segments > num_items) {
    throw Error("random_segmentation: " + std::to_string(num_items) + " items in " +
                std::to_string(num_segments) + " segments (expected 1 <= segments <= items)");
  }
  // Gaps g in [1, num_items): a cut at g starts a new segment at item g. Choose
  // num_segments - 1 distinct gaps by a partial Fisher-Yates shuffle.
  const int64_t num_gaps = num_items - 1, cuts = num_segments - 1;
  std::vector<int64_t> gaps(static_cast<std::size_t>(num_gaps));
  std::iota(gaps.begin(), gaps.end(), int64_t{1});
  for (int64_t j = 0; j < cuts; ++j) {
    const auto r = static_cast<int64_t>(
        rng::below(static_cast<uint64_t>(num_gaps - j), seed, stream, counter_base + static_cast<uint64_t>(j)));
    std::swap(gaps[static_cast<std::size_t>(j)], gaps[static_cast<std::size_t>(j + r)]);
  }
  std::sort(gaps.begin(), gaps.begin() + cuts);
  std::vector<int64_t> lengths(static_cast<std::size_t>(num_segments));
  int64_t prev = 0;
  for (int64_t j = 0; j < cuts; ++j) {
    lengths[static_cast<std::size_t>(j)] = gaps[static_cast<std::size_t>(j)] - prev;
    prev = gaps[static_cast<std::size_t>(j)];
  }
  lengths[static_cast<std::size_t>(cuts)] = num_items - prev;
  return lengths;
}

SpanLayout random_span_layout(const SpanCounts& c, uint64_t seed, uint64_t stream) {
  SpanLayout l;
  // Disjoint counter ranges for the two segmentations (each uses < L counters).
  l.noise = random_segmentation(c.num_noise, c.num_spans, seed, stream, 0);
  l.nonnoise = random_segmentation(c.L - c.num_noise, c.num_spans, seed, stream, uint64_t{1} << 40);
  return l;
}

void corrupt_spans(const int32_t* window, const SpanCounts& c, const SpanLayout& l, int64_t vocab_size,
                   int32_t* inputs, int32_t* targets) {
  const auto k = static_cast<std::size_t>(c.num_spans);
  if (l.noise.size() != k || l.nonnoise.size() != k ||
      std::accumulate(l.noise.begin(), l.noise.end(), int64_t{0}) != c.num_noise ||
      std::accumulate(l.nonnoise.begin(), l.nonnoise.end(), int64_t{0}) != c.L - c.num_noise) {
    throw Error("corrupt_spans: the span layout does not match " + std::to_string(c.num_spans) + " spans of " +
                std::to_string(c.num_noise) + " noise tokens in " + std::to_string(c.L));
  }
  int64_t pos = 0, in = 0, out = 0;
  for (std::size_t j = 0; j < k; ++j) {
    const auto sentinel = static_cast<int32_t>(vocab_size - 1 - static_cast<int64_t>(j));
    for (int64_t t = 0; t < l.nonnoise[j]; ++t) inputs[in++] = window[pos++];
    inputs[in++] = sentinel;
    targets[out++] = sentinel;
    for (int64_t t = 0; t < l.noise[j]; ++t) targets[out++] = window[pos++];
  }
  inputs[in] = kEosId;
  targets[out] = kEosId;
}

}  // namespace fsdp::data
