// fsdp/data/token_dataset.hpp: one split of an HDF5 token file (schema in docs/data.md).
//
// The file holds 1-D integer datasets /train/tokens and /val/tokens (8-, 16-, 32- or 64-bit,
// signed or unsigned: h5py's default int64 too) and root attributes vocab_size (int64) and
// tokenizer (string, "bytes" for byte-level). Like nanoGPT's train.bin/val.bin, but
// self-describing.
//
// Splits of up to kInMemoryLimit tokens (256 MiB as int32) are read whole at open, and every
// token is checked against vocab_size then; larger splits stay on disk and each read() is
// one HDF5 hyperslab read whose tokens are checked as they arrive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/data/split.hpp"
#include "fsdp/data/token_source.hpp"

namespace fsdp::h5 { class File; }

namespace fsdp::data {

// Refuses a token dataset whose type is not an integer of 1, 2, 4 or 8 bytes: InputError
// "<file>: <dataset>: tokens are not 8-, 16-, 32- or 64-bit integers". Every size is read as
// int32 by HDF5's conversion, which clips values outside int32 to INT32_MIN / INT32_MAX: both
// lie outside [0, vocab_size) (vocab_size < 2^31), so a clipped token is still refused by the
// range check, which says the value may be larger (token_range_error).
void check_token_type(const h5::File& file, const std::string& dataset);
// The InputError for token `value` at `position` of `dataset` in `path`, outside
// [0, <bound> = vocab_size) (bound: the key that sets it, "vocab_size" or "model.vocab_size");
// INT32_MAX / INT32_MIN are named as clipped ("2147483647 or more").
[[noreturn]] void token_range_error(const std::string& path, const std::string& dataset,
                                    int64_t value, int64_t position, int64_t vocab_size,
                                    const char* bound = "vocab_size");

// The token that ends each document of token file `path`, for data.attn_mask_type =
// "block_causal": its root attribute eos_id (fsdp_prepare --tokenizer writes the model's).
// Throws fsdp::InputError naming data.attn_mask_type, the file and data.eos_token_id when the
// file has none: no eos_id attribute or -1 ("<path> has no eos_id (byte-level or imported
// tokens); set data.eos_token_id"), or add_eos = 0 (prepared with --no-add-eos: the id is
// the model's, not in the stream) unless the file's BOS, added before each document, is that
// same token (GPT-2's <|endoftext|>, which then separates the documents). Also for an
// unreadable file or an eos_id outside [0, 2^31).
int32_t document_eos_id(const std::string& path);

class TokenDataset final : public TokenSource {
 public:
  static constexpr int64_t kInMemoryLimit = int64_t{1} << 26;

  // Opens split `split` (dataset /train/tokens or /val/tokens) of `path`.
  // If expect_vocab_size > 0 (the model's model.vocab_size), the file's vocab_size must not
  // exceed it (a larger model vocabulary is allowed, as in nanoGPT's 50257 -> 50304 padding).
  // If seq_len > 0 (data.seq_len), the split must hold at least seq_len + 1 tokens (one
  // sample: seq_len inputs plus the shifted target).
  // Throws fsdp::InputError (exit code 2) naming the file and dataset for: a missing or
  // unreadable file, a missing dataset or vocab_size attribute, a dataset that is not 1-D
  // integer (check_token_type), vocab_size outside [1, 2^31), a token < 0 or >= vocab_size;
  // naming data.path and model.vocab_size for a vocabulary mismatch; naming data.seq_len for
  // too few tokens. Splits of more than in_memory_limit tokens are read from disk on demand.
  TokenDataset(const std::string& path, Split split, int64_t expect_vocab_size = 0,
               int64_t seq_len = 0, int64_t in_memory_limit = kInMemoryLimit);
  ~TokenDataset() override;
  TokenDataset(TokenDataset&&) noexcept;
  TokenDataset& operator=(TokenDataset&&) noexcept;

  int64_t num_tokens() const override { return num_tokens_; }
  int64_t vocab_size() const override { return vocab_size_; }
  // Tokens [offset, offset + count) as int32. Throws fsdp::Error if out of range, or
  // fsdp::InputError if a token read from disk (large splits) is outside [0, vocab_size).
  void read(int64_t offset, int64_t count, int32_t* out) const override;

  const std::string& path() const { return path_; }
  Split split() const { return split_; }
  const std::string& dataset() const { return dataset_; }  // "/train/tokens"
  // The root attribute `tokenizer` ("bytes" for byte-level); "unknown" if absent.
  const std::string& tokenizer() const { return tokenizer_; }
  bool in_memory() const { return file_ == nullptr; }

 private:
  void check_tokens(const int32_t* t, int64_t n, int64_t offset) const;

  std::string path_;
  Split split_;
  std::string dataset_, tokenizer_;
  int64_t num_tokens_ = 0;
  int64_t vocab_size_ = 0;
  std::vector<int32_t> tokens_;          // the whole split, when in memory
  std::unique_ptr<h5::File> file_;       // kept open for on-disk reads otherwise
};

}  // namespace fsdp::data
