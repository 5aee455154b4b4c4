// TokenDataset: one split of an HDF5 token file, validated at open (see token_dataset.hpp).
#include "fsdp/data/token_dataset.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "fsdp/core/error.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fsdp::data {

TokenDataset::TokenDataset(const std::string& path, Split split, int64_t expect_vocab_size,
                           int64_t seq_len, int64_t in_memory_limit)
    : path_(path), split_(split), dataset_(std::string("/") + to_string(split) + "/tokens") {
  auto file = std::make_unique<h5::File>(h5::File::open_read(path));
  const std::string where = path + ": " + dataset_;

  if (!file->exists(dataset_)) {
    throw InputError(where + ": dataset not found (expected a 1-D integer token dataset; "
                     "make one with fsdp_prepare)");
  }
  const auto dims = file->dims(dataset_);
  if (dims.size() != 1) {
    throw InputError(where + ": dataset has " + std::to_string(dims.size()) + " dimensions (expected 1)");
  }
  check_token_type(*file, dataset_);
  num_tokens_ = static_cast<int64_t>(dims[0]);

  if (!file->has_attr("/", "vocab_size")) {
    throw InputError(path + ": root attribute vocab_size not found (expected the tokenizer's vocabulary size)");
  }
  vocab_size_ = file->attr_i64("/", "vocab_size");
  if (vocab_size_ < 1 || vocab_size_ > (int64_t{1} << 31) - 1) {
    throw InputError(path + ": vocab_size = " + std::to_string(vocab_size_) + " (expected 1 .. 2^31-1)");
  }
  tokenizer_ = file->has_attr("/", "tokenizer") ? file->attr_str("/", "tokenizer") : "unknown";

  if (expect_vocab_size > 0 && vocab_size_ > expect_vocab_size) {
    throw InputError("data.path: " + path + " has vocab_size " + std::to_string(vocab_size_) +
                     " (tokenizer \"" + tokenizer_ + "\") but model.vocab_size is " +
                     std::to_string(expect_vocab_size) + " (expected model.vocab_size >= the file's vocab_size)");
  }
  if (seq_len > 0 && num_tokens_ < seq_len + 1) {
    throw InputError("data.seq_len: " + std::to_string(seq_len) + " needs at least " + std::to_string(seq_len + 1) +
                     " tokens per sample but " + where + " has " + std::to_string(num_tokens_));
  }

  if (num_tokens_ <= in_memory_limit) {
    tokens_.resize(static_cast<std::size_t>(num_tokens_));
    file->read_i32(dataset_, tokens_.data(), 0, static_cast<hsize_t>(num_tokens_));
    check_tokens(tokens_.data(), num_tokens_, 0);
  } else {
    file_ = std::move(file);
  }
}

TokenDataset::~TokenDataset() = default;
TokenDataset::TokenDataset(TokenDataset&&) noexcept = default;
TokenDataset& TokenDataset::operator=(TokenDataset&&) noexcept = default;

int32_t document_eos_id(const std::string& path) {
  const h5::File f = h5::File::open_read(path);
  const std::string what = "data.attn_mask_type = \"block_causal\": " + path;
  auto attr = [&](const char* name) {
    return f.has_attr("/", name) ? f.attr_i64("/", name) : int64_t{-1};
  };
  const int64_t eos = attr("eos_id");
  if (eos < 0) {
    throw InputError(what +
                     " has no eos_id (byte-level or imported tokens); set data.eos_token_id");
  }
  if (eos > INT32_MAX) {
    throw InputError(what + " has eos_id " + std::to_string(eos) +
                     " (expected an id below 2^31); set data.eos_token_id");
  }
  // add_eos = 0: the attribute is the model's EOS, not a separator of this stream, unless the
  // BOS put before each document is that same token (one token for both: GPT-2).
  if (attr("add_eos") == 0 && !(attr("add_bos") == 1 && attr("bos_id") == eos)) {
    throw InputError(what + " has eos_id " + std::to_string(eos) +
                     " but no EOS after its documents (add_eos = 0: prepared with --no-add-eos); "
                     "set data.eos_token_id to the token that separates them");
  }
  return static_cast<int32_t>(eos);
}

void check_token_type(const h5::File& file, const std::string& dataset) {
  const std::size_t size = file.type_size(dataset);
  if (file.type_class(dataset) != H5T_INTEGER || (size != 1 && size != 2 && size != 4 && size != 8))
    throw InputError(file.path() + ": " + dataset +
                     ": tokens are not 8-, 16-, 32- or 64-bit integers");
}

void token_range_error(const std::string& path, const std::string& dataset, int64_t value,
                       int64_t position, int64_t vocab_size, const char* bound) {
  // Tokens beyond int32 (uint32 >= 2^31, 64-bit ones) arrive clipped by HDF5's conversion.
  std::string v = std::to_string(value);
  if (value == INT32_MAX) v += " or more";
  if (value == INT32_MIN) v += " or less";
  throw InputError(path + ": " + dataset + ": token " + v + " at position " +
                   std::to_string(position) + " is outside [0, " + bound + " = " +
                   std::to_string(vocab_size) + ")");
}

void TokenDataset::check_tokens(const int32_t* t, int64_t n, int64_t offset) const {
  const int32_t vocab = static_cast<int32_t>(vocab_size_);
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0 || t[i] >= vocab)
      token_range_error(path_, dataset_, t[i], offset + i, vocab_size_);
  }
}

void TokenDataset::read(int64_t offset, int64_t count, int32_t* out) const {
  if (offset < 0 || count < 0 || offset > num_tokens_ - count) {
    throw Error(path_ + ": " + dataset_ + ": read of [" + std::to_string(offset) + ", " +
                std::to_string(offset + count) + ") is out of range (" + std::to_string(num_tokens_) + " tokens)");
  }
  if (count == 0) return;
  if (file_) {
    file_->read_i32(dataset_, out, static_cast<hsize_t>(offset), static_cast<hsize_t>(count));
    check_tokens(out, count, offset);
  } else {
    std::memcpy(out, tokens_.data() + offset, static_cast<std::size_t>(count) * sizeof(int32_t));
  }
}

}  // namespace fsdp::data
