// fsdp/data/batch.hpp: token batches for training and validation.
//
// A Batch is B sequences of L tokens: inputs[b, t] and targets[b, t] = the next token, both
// int32, row-major [B, L]. Sample (or validation window) i is the token window
// [i*L, i*L + L + 1): inputs = its first L tokens, targets = its last L (the HF/nanoGPT
// causal-LM convention, with the shift done here rather than in the loss).
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/data/token_source.hpp"

namespace fsdp::data {

struct Batch {
  int64_t B = 0;                 // sequences
  int64_t L = 0;                 // tokens per sequence (seq_len)
  std::vector<int32_t> inputs;   // [B, L]
  std::vector<int32_t> targets;  // [B, L]
};

// Loads samples `sample_indices` (each i with (i + 1) * seq_len + 1 <= num_tokens) as rows of
// a Batch. Throws fsdp::Error if a window lies outside the source.
Batch load_batch(const TokenSource& source, const std::vector<int64_t>& sample_indices, int64_t seq_len);

// ---- validation: mean cross-entropy over the non-overlapping seq_len windows of /val ----

// Number of validation windows: (num_tokens - 1) / seq_len, capped at max_windows when
// max_windows > 0 (eval.max_windows; 0 = all). Throws fsdp::InputError naming data.seq_len if
// seq_len < 1, or eval.max_windows if it is negative.
int64_t num_val_windows(int64_t num_tokens, int64_t seq_len, int64_t max_windows);

// A half-open range [begin, end) of window indices.
struct WindowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The contiguous block of `num_windows` that data-parallel rank `dp_rank` of `dp_size`
// evaluates: [r*n/D, (r+1)*n/D). Blocks cover every window once; sizes differ by at most one
// (and can be 0), so reduce summed losses and token counts, not per-rank means.
WindowRange rank_windows(int64_t num_windows, int dp_rank, int dp_size);

// Loads windows [begin, end) as a Batch with B = end - begin (same layout as load_batch).
Batch load_windows(const TokenSource& source, WindowRange windows, int64_t seq_len);

}  // namespace fsdp::data
