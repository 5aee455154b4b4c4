// fsdp/data/prepare.hpp: the logic of tools/fsdp_prepare (text files -> HDF5 token file).
//
// Byte-level tokenisation (vocab 256, tokenizer "bytes", like ByT5 / nanoGPT's char-level
// shakespeare but on raw bytes): the input files' bytes are concatenated in sorted path
// order; the last val_fraction of the bytes become /val/tokens, the rest /train/tokens.
//
// Pairs (fsdp_prepare --pairs, seq2seq for T5/ByT5): one `input<TAB>target` per line of a
// TSV file; each side's bytes become ByT5 ids b + 3 with eos (1) appended; the last
// val_fraction of the pairs become /val, the rest /train (schema in docs/data.md).
//
// Tokenizers (fsdp_prepare --tokenizer MODEL): the same input files, each document encoded
// by a SentencePiece model (tokenizer "sentencepiece") or a Hugging Face byte-level BPE
// tokenizer.json (tokenizer "hf-bpe", fsdp/data/bpe_tokenizer.hpp) with its BOS / EOS around it.
//
// Token files (fsdp_prepare --token-file FILE...): ids tokenized by llm.c or nanoGPT,
// imported as they are and checked against a given vocabulary size (tokenizer "llm.c" or
// "nanogpt"). Formats in fsdp/data/tokenizer.hpp.
//
// Every prepare_*_dataset checks its output path (its folder exists, it is none of the inputs
// and not inside an input folder), then holds an fsdp::OutputLock on it
// (fsdp/core/output_lock.hpp: `out + ".lock"`) until it returns, before reading any input:
// while another process writes the same output it throws InputError (exit 2) "-o/--output:
// <out> is being written by another process (it holds <out>.lock); ...".
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/data/bpe_tokenizer.hpp"
#include "fsdp/data/tokenizer.hpp"

namespace fsdp {
class ProgressMeter;  // fsdp/core/progress.hpp
}

namespace fsdp::data {

// Progress (fsdp_prepare's status line on a terminal): the functions below that read input
// take an optional ProgressMeter (kBytes; default none). They call set_total(input bytes) once
// the inputs are known, then add() the bytes read as they go (in chunks of at most 1 MiB, so
// one large file moves the line too); they never call finish(): the caller owns the meter.

// Files named by `inputs` (files or folders, folders searched recursively), keeping regular
// files only: symbolic links (to files or folders) and files ending in ".dat" (fortune's
// index files) are skipped wherever they are found; FIFOs, sockets and devices found in a
// folder are skipped without being opened and listed in `skipped` ("<path> (a FIFO)", path
// escaped with fsdp::printable) when it is given. Sorted by path string, duplicates removed.
// Throws fsdp::InputError naming the input if one does not exist, if an input named directly
// is a FIFO, socket or device (refused without opening it), or if no file is left
// ("no input files ...").
std::vector<std::filesystem::path> collect_input_files(const std::vector<std::string>& inputs,
                                                       std::vector<std::string>* skipped = nullptr);

// Refuses an output that is one of the inputs (std::filesystem::equivalent, so hard links
// and other spellings of the path count) or lies inside an input folder, whether or not it
// exists yet (paths compared after weakly_canonical). Throws fsdp::InputError naming
// -o/--output, the output and the input (escaped).
void check_output_not_input(const std::string& out, const std::vector<std::string>& inputs);

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
// if either split would be empty. `progress`: total = the files' sizes (as stat(2) reports
// them before reading), add() per chunk read.
ByteSplit build_byte_split(const std::vector<std::filesystem::path>& files, double val_fraction,
                           ProgressMeter* progress = nullptr);

// Writes the schema of docs/data.md: /train/tokens, /val/tokens (uint8), root attributes
// vocab_size = 256, tokenizer = "bytes", source = `source`, num_files. Written to
// out + ".tmp" and renamed onto `out` only when complete (fsdp::AtomicFile: fsync, rename,
// directory fsync). Throws fsdp::Error naming `out` (and strerror) on failure; no temporary
// is left.
void write_byte_token_file(const std::string& out, const ByteSplit& split, const std::string& source);

struct PrepareSummary {
  int64_t files = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> skipped;  // non-regular files found in input folders (escaped)
};

// check_output_not_input + collect_input_files + build_byte_split (with `progress`) +
// write_byte_token_file.
PrepareSummary prepare_byte_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                    double val_fraction, ProgressMeter* progress = nullptr);

// ---- pairs (seq2seq) ----

// The examples of one split, concatenated: example i is inputs[input_offsets[i] ..
// input_offsets[i + 1]) and likewise for targets (offsets start at 0, have n + 1 entries).
struct PairExamples {
  std::vector<int32_t> inputs, targets;
  std::vector<int64_t> input_offsets{0}, target_offsets{0};
  int64_t size() const { return static_cast<int64_t>(input_offsets.size()) - 1; }
  // Appends one example (ids as given).
  void add(const std::vector<int32_t>& input, const std::vector<int32_t>& target);
};

// Reads a TSV of `input<TAB>target` lines (the last line may lack its newline; a trailing
// CR is removed, for CRLF files). Each side's UTF-8 bytes b become ByT5 ids b + 3 (bytes are
// not checked to be valid UTF-8; ByT5 works on bytes) and eos 1 is appended to both.
// Throws fsdp::InputError "FILE:LINE: ..." for a line with no tab or more than one tab, an
// empty input or an empty target; "FILE: ..." if it cannot be read, is not a regular file
// (a FIFO is refused without being opened) or holds no lines. `progress`: total = the file's
// size, add() of the bytes of the lines read (every 1 MiB and at the end).
PairExamples read_pairs_tsv(const std::string& path, ProgressMeter* progress = nullptr);

// Splits off the last val_token_count(n, val_fraction) examples as validation. Throws
// fsdp::InputError naming --val-fraction if it is out of (0, 1) or either split would be
// empty.
struct PairSplit {
  PairExamples train, val;
};
PairSplit split_pairs(const PairExamples& all, double val_fraction);

// The ids' vocabulary and their tokenizer, as a pairs file records them: ByT5's by default
// (ids < 3 + 256).
struct PairsVocab {
  int64_t vocab_size = 259;
  std::string tokenizer = "byt5";
};

// Writes the seq2seq schema of docs/data.md: /<split>/{inputs (int32), input_offsets (int64),
// targets (int32), target_offsets (int64)} for train and val, root attributes vocab_size and
// tokenizer (`vocab`), source = `source`, num_examples. Written atomically like
// write_byte_token_file. Throws fsdp::Error naming `out` on failure.
void write_pairs_file(const std::string& out, const PairSplit& split, const std::string& source,
                      const PairsVocab& vocab = {});

// Sizes of a pairs file (lengths are in tokens, eos included; bytes = tokens - 1 per side).
struct PairsSummary {
  int64_t train_examples = 0, val_examples = 0;
  int64_t input_tokens = 0, target_tokens = 0;  // both splits
  int64_t max_input_len = 0, max_target_len = 0;
  double mean_input_len = 0, mean_target_len = 0;
};
PairsSummary summarize_pairs(const PairSplit& split);

// read_pairs_tsv (with `progress`) + split_pairs + write_pairs_file (checks first that the
// output folder exists and that the output is not the TSV: check_output_not_input).
PairsSummary prepare_pairs_dataset(const std::string& tsv, const std::string& out, double val_fraction,
                                   ProgressMeter* progress = nullptr);

// ---- tokenizers (--tokenizer: SentencePiece, tokenizer.json) ----

// What one document is (--document): `file`, a whole input file (the default; its bytes as
// they are, newlines included); `line`, each line of each file (the newline and a trailing
// CR removed; one document per line); `jsonl`, each line of each file is a JSON object and
// the document is its string field DocumentFormat::text_key ("text": the JSON Lines that
// Hugging Face datasets' to_json, FineWeb, RedPajama and Dolma ship), JSON escapes decoded.
// Documents of zero bytes (empty files, empty lines, empty texts) and blank lines are
// skipped: they get no BOS/EOS either.
enum class DocumentUnit { file, line, jsonl };
// "file" / "line" / "jsonl"; throws fsdp::InputError naming --document otherwise.
DocumentUnit parse_document_unit(const std::string& name);

// --document and --text-key.
struct DocumentFormat {
  DocumentFormat(DocumentUnit u = DocumentUnit::file, std::string key = "text")
      : unit(u), text_key(std::move(key)) {}
  DocumentUnit unit;
  std::string text_key;  // jsonl only: the field that holds a document's text
};

struct TokenizerOptions {
  // --tokenizer: a SentencePiece .model, a tokenizer.json, or a folder holding one
  // (load_text_tokenizer).
  std::string model;
  BpeSpecialTokens specials;  // --bos-token / --eos-token (tokenizer.json only)
  // --add-bos / --no-add-bos, --add-eos / --no-add-eos. Unset (the default): add the token
  // if the tokenizer has one (bos_id / eos_id >= 0): Llama 2 and Mistral get <s> ... </s>, T5
  // (no BOS) ... </s>, Llama 3 <|begin_of_text|> ... <|end_of_text|>. When BOS and EOS are
  // one token (GPT-2's <|endoftext|>), the default adds it once, before each document (as
  // llm.c's fineweb.py does), or after it with --no-add-bos. true with a tokenizer that has
  // none is an error.
  std::optional<bool> add_bos, add_eos;
  DocumentFormat document;  // --document, --text-key
  int num_threads = 0;  // --num-threads: encoding threads (0: usable_cpus())
};

// Whether to add a BOS (`flag` "--add-bos") or EOS token whose id in the tokenizer is `id`
// (-1: none), given the option `want`. Throws fsdp::InputError naming `flag` and `model` if
// `want` is true and id < 0.
bool resolve_special(const std::optional<bool>& want, int32_t id, const std::string& flag,
                     const std::string& model);

// What encode_documents read and emitted.
struct TokenStreamCounts {
  int64_t files = 0, documents = 0, tokens = 0;
};

// Encodes `files` (in the given order) document by document with `tok` and hands the stream
// to `emit` in order: for each non-empty document [bos if add_bos] + tok.encode(document) +
// [eos if add_eos]. A jsonl line that is not a JSON object with a string field
// document.text_key is an fsdp::InputError "FILE:LINE: ..." naming the key. Documents are
// encoded in batches (`batch_bytes` of input per thread) on
// `num_threads` threads (0: usable_cpus()), each with its own tok.clone_for_thread(); the
// stream is the same for every thread count and batch size. Memory: one batch's text and
// ids, or the largest document if it is larger. Throws fsdp::InputError naming a file that
// cannot be read, and the tokenizer's errors (the first document in order that failed). `progress`:
// total = the files' sizes, add() per batch.
TokenStreamCounts encode_documents(const std::vector<std::filesystem::path>& files,
                                   const TextTokenizer& tok, bool add_bos, bool add_eos,
                                   const DocumentFormat& document, int num_threads,
                                   const std::function<void(const int32_t*, std::size_t)>& emit,
                                   ProgressMeter* progress = nullptr,
                                   std::size_t batch_bytes = 4 << 20);

// HDF5 dataset type of a token stream with ids < vocab_size: 2 bytes (uint16) up to 65536,
// else 4 (uint32).
int token_dtype_bytes(int64_t vocab_size);

struct TokenizedSummary {
  std::string kind;  // TextTokenizer::kind(): "sentencepiece" or "hf-bpe"
  int64_t files = 0, documents = 0, train_tokens = 0, val_tokens = 0, vocab_size = 0;
  int32_t bos_id = -1, eos_id = -1;  // the ids added to each document, -1 where none is added
  std::vector<std::string> skipped;  // as PrepareSummary::skipped
  std::string tokenizer_note;        // load_text_tokenizer's note ("" when none)
};

// Checks the output (folder exists, not an input nor the model) and holds its lock, loads the
// tokenizer (load_text_tokenizer: errors name it), resolves BOS/EOS, collect_input_files
// (sorted), encode_documents into an unnamed temporary file in the output's folder (int32 ids:
// 4 bytes a token of disk there until it returns; nothing left behind whatever ends the
// process), then writes /train/tokens and /val/tokens (the last val_token_count ids) as
// uint16 or uint32 (token_dtype_bytes) with the record (tokenizer kind, vocab_size, the model
// file's absolute path, size and SHA-256, bos_id, eos_id, add_bos, add_eos, num_documents),
// source and num_files, atomically like write_byte_token_file. Throws fsdp::InputError naming
// --val-fraction for an empty split, fsdp::Error naming the output for a write that fails.
TokenizedSummary prepare_tokenized_dataset(const std::vector<std::string>& inputs, const std::string& out,
                                           double val_fraction, const TokenizerOptions& options,
                                           ProgressMeter* progress = nullptr);

// ---- prompt-completion pairs with a tokenizer (--pairs FILE.jsonl --tokenizer, sft) ----

// Reads JSON Lines of {"prompt": ..., "completion": ...} (TRL's prompt-completion format;
// other fields ignored, blank lines skipped) and encodes each: input = [bos if add_bos] +
// tok.encode(prompt), target = tok.encode(completion) + [eos if add_eos]. Throws
// fsdp::InputError "FILE:LINE: ..." for a line that is not a JSON object with string fields
// "prompt" and "completion", or whose completion is empty; "FILE: ..." if the file cannot be
// read or holds no examples.
PairExamples read_prompt_completion_jsonl(const std::string& path, const TextTokenizer& tok,
                                          bool add_bos, bool add_eos);

struct TokenizedPairsSummary {
  PairsSummary pairs;
  std::string kind;  // TextTokenizer::kind()
  int64_t vocab_size = 0;
  int32_t bos_id = -1, eos_id = -1;  // the ids added (to each prompt, each completion), -1: none
  std::string tokenizer_note;        // load_text_tokenizer's note ("" when none)
};

// fsdp_prepare --pairs FILE.jsonl --tokenizer MODEL: claims the output (not an input nor the
// model), loads the tokenizer (options.model, options.specials) and resolves BOS / EOS as
// prepare_tokenized_dataset does (options.add_bos, add_eos; one token for both is added to
// both here: before the prompt and after the completion), reads the pairs, splits off the
// last val_token_count(n, val_fraction) examples as validation (split_pairs) and writes the
// pairs file (vocab_size and tokenizer kind of the tokenizer). The file is what
// data.objective = "sft" trains on.
TokenizedPairsSummary prepare_tokenized_pairs(const std::string& jsonl, const std::string& out,
                                              double val_fraction, const TokenizerOptions& options);

// ---- token files of other projects (--token-file) ----

struct TokenFileOptions {
  std::vector<std::string> files;      // --token-file: the training stream, in this order
  std::vector<std::string> val_files;  // --val-token-file: the validation stream (optional)
  int64_t vocab_size = 0;              // --vocab-size: required, in [1, 2^31)
  TokenFileFormat format = TokenFileFormat::auto_detect;  // --token-format
};

struct TokenFilesSummary {
  int64_t train_files = 0, val_files = 0, train_tokens = 0, val_tokens = 0, vocab_size = 0;
  std::string format;  // TokenFileInfo::describe() of the files (all alike)
};

// Imports token files as they are. Every file is inspected first (inspect_token_file: all
// must be of one format, and llm.c files of one magic); then the ids are streamed (1 Mi
// tokens at a time) into the HDF5, each checked against vocab_size (TokenFileReader: the
// first bad id fails with its file and position). Without val_files the validation split is
// the last val_token_count(n, val_fraction) ids of the files' concatenation; with val_files
// it is their concatenation and val_fraction is not used. Stored as uint16 or uint32
// (token_dtype_bytes), attributes tokenizer "llm.c" | "nanogpt", token_format, vocab_size.
// Throws fsdp::InputError (exit 2) naming the file for every bad file (see
// inspect_token_file, TokenFileReader), naming --vocab-size if it is missing or out of
// range, --val-fraction for an empty split; the output is written atomically (nothing is
// left on error).
TokenFilesSummary prepare_token_file_dataset(const TokenFileOptions& options, const std::string& out,
                                             double val_fraction, ProgressMeter* progress = nullptr);

}  // namespace fsdp::data
