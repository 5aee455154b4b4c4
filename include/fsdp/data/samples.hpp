// fsdp/data/samples.hpp: a data split as numbered samples, for every data.objective.
//
// The trainer sees only this: a split has num_samples() samples; the DistributedSampler
// picks indices; load(indices) returns them as one padded Batch (batch.hpp). The same
// indices give the same rows on any rank and any world size (loading is a pure function of
// the file, the config and the sample index), so N ranks see the 1-rank global batch.
//
//  causal_lm        sample i = stream window [i*L, i*L + L + 1) (L = data.seq_len);
//  seq2seq          sample i = example i of the split's pairs (docs/data.md), inputs
//                   truncated/padded to data.max_input_len, targets to data.max_target_len;
//  span_corruption  sample i = stream window [i*L, (i+1)*L) corrupted as in the T5 paper,
//                   with randomness a pure function of (train.seed, split, i);
//  sft              sample i = example i of the split's pairs as one decoder row: prompt ++
//                   completion cut to L + 1 tokens, targets on the completion only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/data/split.hpp"

namespace fsdp::data {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t num_samples() const = 0;
  // Tokens stored in the split (banner).
  virtual int64_t num_tokens() const = 0;
  // Rows of a batch of this source: every load() returns rows of this shape.
  virtual BatchShape shape() const = 0;
  // The samples `indices` (each in [0, num_samples())) as rows of one Batch, in order.
  // Throws fsdp::Error on an index out of range.
  virtual Batch load(const std::vector<int64_t>& indices) const = 0;
  // The number of targets (!= kIgnoreIndex) of every sample when it is fixed (causal_lm: L;
  // span_corruption: its target length), else 0 (seq2seq: it depends on the example). The
  // trainer then knows a step's global target count without communicating.
  virtual int64_t fixed_targets_per_sample() const { return 0; }
  // Examples truncated to fit the row lengths so far (seq2seq; 0 otherwise).
  virtual int64_t num_truncated() const { return 0; }
  // The samples of each file of a data mixture (data.paths), in order: indices
  // [0, n_0) are the first file's, [n_0, n_0 + n_1) the second's, ...; one file: {num_samples()}.
  virtual std::vector<int64_t> part_samples() const { return {num_samples()}; }
};

// The row lengths of config's batches (what activation memory is planned for):
// causal_lm and sft {seq_len, seq_len} (causal_lm: block_causal and reset_position_ids from
// data.attn_mask_type and data.reset_position_ids); seq2seq {max_input_len, max_target_len};
// span_corruption {L - num_noise + num_spans + 1, num_noise + num_spans + 1} (span_corruption.hpp).
// Throws InputError naming the data.* key for invalid span_corruption parameters.
BatchShape batch_shape(const Config& config);

// Opens split `split` of the config's data (data.source, data.path,
// data.objective, ...). vocab_size: the model's; a token outside [0, vocab_size) in the file
// is an InputError naming the file. Throws InputError (exit 2) naming the file and what is
// wrong: missing file, missing split or dataset, wrong dtype or shape, inconsistent offsets.
// Details (docs/data.md "Objectives"):
//  causal_lm: TokenDataset or SyntheticTokens exactly as the trainer builds them (synthetic:
//    train 1024 * global_batch * L + 1 tokens, seed train.seed; val 64 * L + 1, seed + 1);
//    val num_samples = num_val_windows(tokens, L, eval.max_windows); load = load_batch.
//    data.attn_mask_type = "block_causal" (docs/data.md "Document masking"): every batch also
//    gets position_ids (set_document_positions) with the EOS id data.eos_token_id, or when
//    that is -1 the file's eos_id attribute (document_eos_id, token_dataset.hpp; a mixture's
//    files must agree). InputError naming data.attn_mask_type and the file for a file without
//    one (a mixture's: the two files that differ), synthetic data with data.eos_token_id = -1,
//    an EOS id >= vocab_size (naming data.eos_token_id when it came from there). "causal"
//    reads nothing more and leaves position_ids empty. Batch::reset_position_ids is
//    data.reset_position_ids on block_causal batches.
//  sft: as seq2seq below (the pairs' inputs are the prompts, their targets the completions),
//    rows of data.seq_len; an example longer than seq_len + 1 tokens counts in num_truncated().
//  seq2seq: data.source must be "hdf5" (else InputError naming data.source); the split is
//    read whole and validated at open; val is capped at eval.max_windows (> 0) examples;
//    truncation keeps max - 1 tokens + eos and is counted in num_truncated(). Inputs padded
//    with 0, targets with kIgnoreIndex.
//  span_corruption: files with tokenizer "bytes" are read as ByT5 ids b + 3; synthetic ids
//    are in [3, vocab_size - 125); sentinel j = vocab_size - 1 - j must stay above the
//    data's ids (else InputError naming data.seq_len and model.vocab_size); num_samples =
//    tokens / L (val capped at eval.max_windows).
// `config` is a checked one (parse_config, or check_config for a Config built in code, as
// train() does): the keys config validation checks (data.path present for data.source =
// "hdf5", data.max_input_len, data.max_target_len, eval.max_windows) are not checked again.
//  data.paths (a mixture): each file opened as data.path would be, the split's samples
//    their concatenation (part_samples() says where each file's begin; each file's val capped
//    at eval.max_windows on its own); an error of file d (one too short for a sample
//    included) names data.paths[d] (exit code unchanged).
std::unique_ptr<SampleSource> open_samples(const Config& config, Split split, int64_t vocab_size);

}  // namespace fsdp::data
