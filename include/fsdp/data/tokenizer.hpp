// fsdp/data/tokenizer.hpp: the tokenizers of fsdp_prepare other than its byte level
// (docs/data.md "fsdp_prepare --tokenizer", "fsdp_prepare --token-file").
//
//  - SentencePiece (the tokenizer of Llama 2, Mistral, T5): a `tokenizer.model` file (a
//    serialized sentencepiece.ModelProto) loaded with Debian's libsentencepiece
//    (sentencepiece::SentencePieceProcessor); ids are in [0, GetPieceSize()).
//  - Token files written by other projects, imported as they are (no text involved):
//    llm.c's data files (karpathy/llm.c dev/data/data_common.py write_datafile, read by
//    llmc/dataloader.h): a header of 256 little-endian int32 (header[0] = magic, header[1] =
//    version, header[2] = token count, the rest 0), then the tokens, little-endian:
//      magic 20240520, version 1: uint16 tokens (GPT-2 BPE, llm.c's "gpt-2");
//      magic 20240801, version 7: uint32 tokens (Llama 3 tiktoken, llm.c's "llama-3");
//    and nanoGPT's raw `.bin` (karpathy/nanoGPT data/*/prepare.py: np.uint16 tokens,
//    little-endian, no header). Neither records its vocabulary size: the caller supplies it.
//  - The record of what made a token file (root attributes of the HDF5, TokenizerRecord).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/core/enum_names.hpp"

namespace fsdp::data {

// ---------------------------------------------------------------- file digests

// SHA-256 (FIPS 180-4) of `bytes` as 64 lowercase hex digits (what `sha256sum` prints).
std::string sha256_hex(std::string_view bytes);

// The whole content of a regular file. Throws fsdp::InputError "<path>: <what> (<what was
// expected>)" naming `what_it_is` (e.g. "tokenizer model") if the path does not exist, is
// not a regular file (a FIFO is refused without being opened: reading it would block) or
// cannot be read.
std::string read_whole_file(const std::string& path, const std::string& what_it_is);

// ---------------------------------------------------------------- text tokenizers

// A tokenizer of text (fsdp_prepare --tokenizer): SentencePieceTokenizer below, or
// BpeTokenizer (fsdp/data/bpe_tokenizer.hpp, a Hugging Face tokenizer.json). Ids are int32 in
// [0, vocab_size()).
class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;
  // The HDF5 attribute `tokenizer`: "sentencepiece" or "hf-bpe".
  virtual std::string kind() const = 0;
  virtual const std::string& path() const = 0;          // the model file, as given
  virtual int64_t model_bytes() const = 0;              // its size in bytes
  virtual const std::string& model_sha256() const = 0;  // sha256_hex of its bytes
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1: none
  virtual int32_t eos_id() const = 0;  // -1: none
  // Appends the ids of `text` (UTF-8) to `out`, no BOS / EOS; `where` names the input in
  // errors (fsdp::InputError). Not thread-safe on one object: see clone_for_thread.
  virtual void encode(std::string_view text, std::vector<int32_t>& out, const std::string& where) const = 0;
  // Another handle on the same tokenizer, for another thread: encode() may run on different
  // handles at once. Shares the loaded model (no file is read again); its ids are this one's.
  virtual std::unique_ptr<TextTokenizer> clone_for_thread() const = 0;
};

// ---------------------------------------------------------------- SentencePiece

// One loaded SentencePiece model. Not copyable (the processor is not); movable.
class SentencePieceTokenizer final : public TextTokenizer {
 public:
  // Loads `model_path` (a SentencePiece .model file: Llama 2's / Mistral's / T5's
  // tokenizer.model, or one made by spm_train). The file is read once: the digest below and
  // the processor come from the same bytes. Throws fsdp::InputError naming the path (one
  // line, exit code 2) if it is missing, not a regular file, empty, or not a valid model
  // (the sentencepiece library's reason in parentheses).
  explicit SentencePieceTokenizer(const std::string& model_path);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  std::string kind() const override { return "sentencepiece"; }
  const std::string& path() const override { return path_; }        // as given
  int64_t model_bytes() const override { return model_bytes_; }    // the file's size in bytes
  const std::string& model_sha256() const override { return sha256_; }  // sha256_hex of the file
  int64_t vocab_size() const override;  // GetPieceSize(): ids are in [0, vocab_size)
  int32_t bos_id() const override;      // the model's BOS id (Llama: 1), -1 if it has none (T5)
  int32_t eos_id() const override;      // the model's EOS id (Llama: 2, T5: 1), -1 if it has none

  // Appends the ids of `text` (UTF-8; one SentencePieceProcessor::Encode call, so the
  // model's normalizer and dummy prefix apply once, at the start of `text`, exactly as
  // `sp.encode(text)` in Python) to `out`; no BOS/EOS (the caller adds them). `where`
  // names the input in errors. Throws fsdp::InputError "<where>: SentencePiece encode
  // failed (<reason>)".
  void encode(std::string_view text, std::vector<int32_t>& out, const std::string& where) const override;
  // Shares the processor: its Encode is const and safe to call from several threads.
  std::unique_ptr<TextTokenizer> clone_for_thread() const override;

 private:
  struct Impl;
  SentencePieceTokenizer() = default;
  std::shared_ptr<const Impl> impl_;
  std::string path_, sha256_;
  int64_t model_bytes_ = 0;
};

// ---------------------------------------------------------------- llm.c / nanoGPT token files

inline constexpr int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 tokens
inline constexpr int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 tokens
inline constexpr int32_t kLlmcMagicEval = 20240522;    // llm.c's multiple-choice eval files (refused)
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// How a token file is read. auto_detect: llm.c if the file's first 4 bytes are one of the
// two llm.c magics (little-endian int32), nanoGPT otherwise. (A nanoGPT file starting with
// the tokens 54856, 308 or 55137, 308 would be taken for llm.c: not possible with GPT-2's
// 50257 ids; name the format to be sure.)
enum class TokenFileFormat { auto_detect, llmc, nanogpt };

}  // namespace fsdp::data

template <>
struct fsdp::EnumNames<fsdp::data::TokenFileFormat> {
  using F = fsdp::data::TokenFileFormat;
  static constexpr EnumName<F> table[] = {
      {F::auto_detect, "auto"}, {F::llmc, "llm.c"}, {F::nanogpt, "nanogpt"}};
};

namespace fsdp::data {

// The table's names and back (--token-format; "llmc" is also read as llm.c). parse throws
// fsdp::InputError naming --token-format for anything else.
TokenFileFormat parse_token_file_format(const std::string& name);
std::string to_string(TokenFileFormat format);

// What inspect_token_file found in a file's first bytes and its size.
struct TokenFileInfo {
  std::string path;
  TokenFileFormat format = TokenFileFormat::nanogpt;  // llmc or nanogpt (never auto_detect)
  int32_t magic = 0, version = 0;  // llm.c only
  int token_bytes = 2;             // 2 (uint16) or 4 (uint32)
  int64_t data_offset = 0;         // byte offset of the first token (1024 for llm.c, 0)
  int64_t num_tokens = 0;          // >= 1
  // "llm.c gpt-2 (magic 20240520, version 1, uint16)", "nanogpt (raw uint16)": for the
  // summary line and the HDF5 attribute token_format.
  std::string describe() const;
  // "llm.c" or "nanogpt": the HDF5 attribute tokenizer.
  std::string kind() const;
};

// Reads the header (llm.c) or size (nanoGPT) of `path` and checks it; reads no tokens.
// Throws fsdp::InputError, one line naming the file (exit code 2), for: a missing file or
// one that is not a regular file (FIFOs are not opened); an empty file; nanoGPT: an odd
// byte length; llm.c: a file shorter than the 1024-byte header ("truncated llm.c header"),
// a magic that is not llm.c's (only when `format` is llmc: "bad magic"), llm.c's eval-file
// magic, a version other than the magic's, a token count < 1, or a count that disagrees
// with the file size (1024 + count * token bytes).
TokenFileInfo inspect_token_file(const std::string& path, TokenFileFormat format);

// Sequential reader of one inspected token file's tokens, as int32.
class TokenFileReader {
 public:
  // Opens info.path at its first token; ids are checked against `vocab_size` (>= 1).
  // Throws fsdp::InputError naming the file if it cannot be opened.
  TokenFileReader(const TokenFileInfo& info, int64_t vocab_size);
  ~TokenFileReader();
  TokenFileReader(const TokenFileReader&) = delete;
  TokenFileReader& operator=(const TokenFileReader&) = delete;

  int64_t remaining() const { return info_.num_tokens - position_; }
  // Reads the next `count` (<= remaining()) tokens into out[0, count). Throws
  // fsdp::InputError "<path>: token <id> at position <i> (byte offset <b>) is >= --vocab-size
  // <N> ..." for the first id out of range (position = the token's index in this file, from
  // 0), or "<path>: file ended early ..." if the file shrank since it was inspected.
  void read(int64_t count, int32_t* out);

 private:
  TokenFileInfo info_;
  int64_t vocab_size_;
  int64_t position_ = 0;
  int fd_ = -1;
  std::vector<unsigned char> buf_;
};

// ---------------------------------------------------------------- the HDF5 record

// What made a token file: root attributes of the HDF5 (docs/data.md "File schema"). Files
// written before these attributes existed have `tokenizer` (or not) and `vocab_size` only;
// read_tokenizer_record fills the rest with the defaults below.
struct TokenizerRecord {
  std::string kind = "unknown";  // attribute tokenizer: "bytes" | "sentencepiece" | "hf-bpe" | "llm.c" | ...
  int64_t vocab_size = 0;        // attribute vocab_size: ids are in [0, vocab_size)
  // sentencepiece and hf-bpe only (absent otherwise):
  std::string model_path;        // tokenizer_model: absolute path of the .model / tokenizer.json
  int64_t model_bytes = -1;      // tokenizer_model_bytes
  std::string model_sha256;      // tokenizer_model_sha256 (sha256sum of the file)
  int64_t bos_id = -1, eos_id = -1;  // bos_id, eos_id: the model's (-1: none)
  bool add_bos = false, add_eos = false;  // add_bos, add_eos (int64 0/1): added to each document
  int64_t num_documents = -1;    // num_documents
  // llm.c / nanogpt only: token_format, e.g. "llm.c gpt-2 (magic 20240520, version 1, uint16)".
  std::string token_format;
};

// Reads the record of an HDF5 token or pairs file. Throws fsdp::InputError naming the file
// if it cannot be opened or has no vocab_size attribute.
TokenizerRecord read_tokenizer_record(const std::string& h5_path);

}  // namespace fsdp::data
