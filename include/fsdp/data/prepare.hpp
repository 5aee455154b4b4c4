// fsdp/data/prepare.hpp: the logic of tools/fsdp_prepare (text files -> HDF5 token file).
//
// Byte-level tokenisation (vocab 256, tokenizer "bytes", like ByT5 / nanoGPT's char-level
// shakespeare but on raw bytes): the input files' bytes are concatenated in sorted path
// order; the last val_fraction of the bytes become /val/tokens, the rest /train/tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fsdp::data {

// Files named by `inputs` (files or folders, folders searched recursively), keeping regular
// files only: symbolic links (to files or folders) and files ending in ".dat" (fortune's
// index files) are skipped wherever they are found. Sorted by path string, duplicates
// removed. Throws fsdp::InputError naming the input if one does not exist, or if no file is
// left ("no input files ...").
std::vector<std::filesystem::path> collect_input_files(const std::vector<std::string>& inputs);

// A byte corpus split at train_tokens: [0, train_tokens) train, the rest validation.
struct ByteSplit {
  std::vector<uint8_t> bytes;   // all files, concatenated
  int64_t num_files = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens() const { return static_cast<int64_t>(bytes.size()) - train_tokens; }
};

// Validation size for n tokens: floor(val_fraction * n). Throws fsdp::InputError naming
// --val-fraction unless 0 < val_fraction < 1.
int64_t val_token_count(int64_t n, double val_fraction);

// Reads and concatenates `files`, then splits off the last val_token_count(n, val_fraction)
// bytes. Throws fsdp::InputError naming a file that cannot be read, or naming --val-fraction
// if either split would be empty.
ByteSplit build_byte_split(const std::vector<std::filesystem::path>& files, double val_fraction);

// Writes the schema of docs/data.md: /train/tokens, /val/tokens (uint8), root attributes
// vocab_size = 256, tokenizer = "bytes", source = `source`, num_files. Written to
// out + ".tmp" and renamed onto `out` only when complete. Throws fsdp::Error on failure.
void write_byte_token_file(const std::string& out, const ByteSplit& split, const std::string& source);

struct PrepareSummary {
  int64_t files = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};

// collect_input_files + build_byte_split + write_byte_token_file.
PrepareSummary prepare_byte_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                    double val_fraction);

}  // namespace fsdp::data
