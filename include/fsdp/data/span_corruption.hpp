// fsdp/data/span_corruption.hpp: T5's span-corruption objective on one window of tokens.
//
// Source: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
// Text-to-Text Transformer", section 3.1.4 (and 3.3.4 for span lengths), as implemented by
// t5.data.preprocessors.random_spans_noise_mask, noise_span_to_unique_sentinel (inputs) and
// nonnoise_span_to_unique_sentinel (targets). Written from that description, not copied.
//
// For a window of L tokens:
//   num_noise = round(L * noise_density), clamped to [1, L - 1];
//   num_spans = max(1, round(num_noise / mean_noise_span_length)), and at most L - num_noise
//               (T5 does not clamp; its segmentation fails there, so this only changes
//               configurations T5 cannot run);
//   round() is round-half-to-even, as numpy's np.round used by T5.
// The num_noise noise tokens and the L - num_noise other tokens are each split into
// num_spans positive lengths by T5's _random_segmentation (a uniformly random composition:
// num_spans - 1 distinct cut points among the n - 1 gaps), and the window is
//   nonnoise[0], noise[0], nonnoise[1], noise[1], ..., nonnoise[k-1], noise[k-1]
// (it starts with non-noise tokens, so token 0 is never masked).
//   inputs  = each non-noise span, then noise span j replaced by sentinel j; then eos (1):
//             length (L - num_noise) + num_spans + 1;
//   targets = for each noise span j: sentinel j, then its tokens; then eos (1):
//             length num_noise + num_spans + 1.
// Sentinel j (j = 0, 1, ...) is id vocab_size - 1 - j: T5's sentinel_id(vocabulary) =
// vocab_size - 1 counting down, and ByT5's vocabulary of 384 has its 125 extra ids at
// 259..383 (<extra_id_0> = 383 ... <extra_id_124> = 259) above the byte ids 3..258.
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp::data {

// End-of-sequence id (ByT5/T5: pad 0, eos 1, unk 2).
inline constexpr int32_t kEosId = 1;
inline constexpr int32_t kPadId = 0;
// ByT5 id of byte b: b + kByteOffset.
inline constexpr int32_t kByteOffset = 3;

// The span counts of a window; all lengths are in tokens.
struct SpanCounts {
  int64_t L = 0;          // window length
  int64_t num_noise = 0;  // masked tokens
  int64_t num_spans = 0;  // noise spans (= non-noise spans)
  int64_t input_len() const { return (L - num_noise) + num_spans + 1; }
  int64_t target_len() const { return num_noise + num_spans + 1; }
};

// The counts for a window of L tokens (see the top of this file). Throws fsdp::InputError
// naming data.seq_len if L < 2, data.noise_density unless 0 < density < 1, or
// data.mean_noise_span_length unless it is >= 1.
SpanCounts span_counts(int64_t L, double noise_density, double mean_noise_span_length);

// T5's _random_segmentation: num_items split into num_segments positive lengths (in order,
// summing to num_items), uniformly among all such compositions. The randomness is a pure
// function of (seed, stream, counter_base + 0 .. num_items - 2): a partial Fisher-Yates
// shuffle of the num_items - 1 gaps picks the num_segments - 1 cut points.
// Throws fsdp::Error unless 1 <= num_segments <= num_items.
std::vector<int64_t> random_segmentation(int64_t num_items, int64_t num_segments, uint64_t seed,
                                         uint64_t stream, uint64_t counter_base);

// The span layout of one window: nonnoise[j] and noise[j] (j < num_spans), interleaved
// nonnoise[0], noise[0], nonnoise[1], ... Pure function of (counts, seed, stream).
struct SpanLayout {
  std::vector<int64_t> nonnoise;
  std::vector<int64_t> noise;
};
SpanLayout random_span_layout(const SpanCounts& counts, uint64_t seed, uint64_t stream);

// Applies `layout` to window[0 .. counts.L): writes counts.input_len() ids to `inputs` and
// counts.target_len() ids to `targets` (layout at the top of this file). Sentinel j is
// vocab_size - 1 - j. Throws fsdp::Error if the layout does not sum to L.
void corrupt_spans(const int32_t* window, const SpanCounts& counts, const SpanLayout& layout,
                   int64_t vocab_size, int32_t* inputs, int32_t* targets);

}  // namespace fsdp::data
