// fsdp/data/batch.hpp: token batches for training and validation.
//
// A causal-LM Batch is B sequences of L tokens: inputs[b, t] and targets[b, t] = the next
// token, both int32, row-major [B, L]. Sample (or validation window) i is the token window
// [i*L, i*L + L + 1): inputs = its first L tokens, targets = its last L (the HF/nanoGPT
// causal-LM convention, with the shift done here rather than in the loss).
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/data/token_source.hpp"

namespace fsdp::data {

// Token id of a target position that carries no loss (torch's ignore_index; equal to
// fsdp::kIgnoreIndex of the backend).
inline constexpr int32_t kIgnoreIndex = -100;

// Row lengths of the batches of a config: L input tokens and target_len target tokens.
struct BatchShape {
  int64_t L = 0;
  int64_t target_len = 0;
  // Whether the batches carry position_ids (data.attn_mask_type = "block_causal") and
  // reset_position_ids: the model's document-masking buffers in the memory plan.
  bool block_causal = false;
  bool reset_position_ids = false;
};

// B rows. causal_lm: inputs[b,t] and targets[b,t] (the next token), both [B,L], target_len
// == L. seq2seq and span_corruption (T5): inputs [B,L] are the encoder ids, padded with the
// pad id 0 (ByT5: pad 0, eos 1, unk 2, byte b -> b + 3), and targets [B,target_len] the
// labels, padded with kIgnoreIndex; the model builds the decoder input (labels shifted
// right, decoder_start_token_id = pad) and the encoder mask (input != pad).
struct Batch {
  int64_t B = 0;                 // rows
  int64_t L = 0;                 // input tokens per row
  int64_t target_len = 0;        // target tokens per row
  std::vector<int32_t> inputs;   // [B, L]
  std::vector<int32_t> targets;  // [B, target_len]
  // causal_lm with data.attn_mask_type = "block_causal" (document masking): each input
  // token's position in its document within its row: 0 at a row's first token and at every
  // token whose previous input token (same row) is the EOS id, else the previous + 1 (Hugging
  // Face's position_ids of padding-free packing, DataCollatorWithFlattening). The EOS token
  // belongs to the document it ends; the token after it starts the next. Query t may attend
  // to key j <= t of its row only where no EOS lies in inputs [j, t) (equivalently
  // position_ids[t] - position_ids[j] == t - j). Empty otherwise (data.attn_mask_type =
  // "causal", and the other objectives).
  std::vector<int32_t> position_ids;  // [B, L] or empty
  // With position_ids: whether RoPE reads them (data.reset_position_ids) instead of each
  // token's position in its row (torchtitan's block_causal keeps the row's positions).
  bool reset_position_ids = false;
  // Targets that carry loss (!= kIgnoreIndex).
  int64_t num_targets() const;
  // Rows [begin, begin + count) as a Batch (gradient accumulation's micro-batches),
  // position_ids included when present.
  Batch rows(int64_t begin, int64_t count) const;
};

// Fills b.position_ids ([B, L]) from b.inputs as documented at Batch::position_ids, with
// `eos_id` the token that ends a document. Throws fsdp::Error if eos_id < 0 or b.inputs does
// not hold B * L tokens.
void set_document_positions(Batch& b, int32_t eos_id);

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
  std::vector<int64_t> indices() const;  // begin, begin + 1, ..., end - 1
};

// The contiguous block of `num_windows` that data-parallel rank `dp_rank` of `dp_size`
// evaluates: [r*n/D, (r+1)*n/D). Blocks cover every window once; sizes differ by at most one
// (and can be 0), so reduce summed losses and token counts, not per-rank means.
WindowRange rank_windows(int64_t num_windows, int dp_rank, int dp_size);


}  // namespace fsdp::data
