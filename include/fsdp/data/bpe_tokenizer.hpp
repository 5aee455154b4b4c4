// fsdp/data/bpe_tokenizer.hpp: Hugging Face byte-level BPE tokenizers (a `tokenizer.json` of
// the `tokenizers` library: GPT-2, Llama 3, and other models whose tokenizer is byte-level
// BPE), for fsdp_prepare --tokenizer (docs/data.md "fsdp_prepare --tokenizer").
//
// What a tokenizer.json holds and how it is applied (tokenizers' TokenizerImpl::encode, matched
// here for the parts byte-level BPE files use; anything else is refused when loading):
//  - normalizer: null (GPT-2, Llama 3), or one Unicode normalization form, NFC (Qwen2), NFD,
//    NFKC or NFKD, alone or in a Sequence, applied with utf8proc (Debian's libutf8proc) before
//    the pre-tokenizer. Others (Lowercase, Replace, Prepend, several in a Sequence) are refused.
//  - pre_tokenizer: ByteLevel {add_prefix_space, use_regex}, or Split {pattern: {Regex},
//    behavior: Isolated, invert: false} followed by ByteLevel {use_regex: false} in a Sequence
//    (Llama 3's layout). A Split cuts each piece at the regex's matches and keeps matches and
//    the text between them as pieces (Isolated); ByteLevel with use_regex cuts with GPT-2's
//    pattern the same way. Regular expressions run on Oniguruma (Debian's libonig), with its
//    default syntax and UTF-8, as tokenizers' own SysRegex does. With add_prefix_space each
//    piece that does not start with ' ' gets one in front.
//  - model: BPE with byte-level symbols (GPT-2's bytes_to_unicode: each byte is one character
//    of the vocabulary's strings). A piece's bytes start as one symbol each; the adjacent pair
//    whose merge comes first in `merges` is merged, leftmost first on ties, until no pair has a
//    merge (tokenizers' Word::merge_all). With ignore_merges (Llama 3) a piece that is itself in
//    the vocabulary is that one token. dropout, continuing_subword_prefix, end_of_word_suffix
//    and byte_fallback must be unset. merges may be "a b" strings or ["a", "b"] pairs.
//  - added_tokens: looked up by --bos-token / --eos-token; text is encoded as ordinary text, so
//    a special token's spelling in a document is not that token (tiktoken's encode_ordinary,
//    llm.c's fineweb.py), unlike tokenizers' encode, which matches added tokens in the text.
//  - BOS / EOS (not part of tokenizers' model): --bos-token / --eos-token name them; else
//    `tokenizer_config.json` beside the tokenizer.json (bos_token, eos_token: transformers'
//    special tokens; null is none); else the post_processor's TemplateProcessing `single`
//    template (a special token before $A is BOS, one after it EOS); else none.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fsdp/data/tokenizer.hpp"

namespace fsdp::data {

// BOS / EOS chosen on the command line: an added token's (or vocabulary entry's) content, e.g.
// "<|endoftext|>". Empty: from tokenizer_config.json or the post_processor (see above).
struct BpeSpecialTokens {
  std::string bos_token, eos_token;
};

// One loaded byte-level BPE tokenizer.json. Not thread-safe: encode() keeps a cache of the
// pieces it has seen (tokenizers' BPE cache) and Oniguruma's match state; each thread takes
// its own clone_for_thread().
class BpeTokenizer final : public TextTokenizer {
 public:
  // Loads `json_path` (a tokenizer.json file). Throws fsdp::InputError, one line naming the
  // file (or --bos-token / --eos-token) and what is wrong (exit code 2): missing, not a regular
  // file, not JSON (the parser's byte offset), a model other than BPE, a component listed above
  // as refused (named with its type), a merge naming a token not in the vocabulary or whose
  // result is not in it, a byte with no token, an id < 0, a regex Oniguruma rejects (its
  // message), a BOS / EOS token that is not in the vocabulary or added tokens; or if
  // tokenizer_config.json exists beside it and is not JSON.
  explicit BpeTokenizer(const std::string& json_path, const BpeSpecialTokens& specials = {});
  ~BpeTokenizer() override;

  std::string kind() const override { return "hf-bpe"; }
  const std::string& path() const override { return path_; }
  int64_t model_bytes() const override { return model_bytes_; }
  const std::string& model_sha256() const override { return sha256_; }
  // 1 + the largest id in the vocabulary and added_tokens (len(tokenizer) in transformers
  // when the ids are dense: 50257 for GPT-2, 128256 for Llama 3).
  int64_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return bos_id_; }  // -1: none
  int32_t eos_id() const override { return eos_id_; }  // -1: none
  int64_t num_merges() const;

  // Appends the ids of `text` (UTF-8) to `out`, no BOS / EOS. Throws fsdp::InputError
  // "<where>: not valid UTF-8 at byte <offset> ..." (the offset counts from the start of
  // `text`) for text that is not UTF-8; tokenizers takes only UTF-8 strings.
  void encode(std::string_view text, std::vector<int32_t>& out,
              const std::string& where) const override;

  // A handle with its own regexes and cache on the same loaded model.
  std::unique_ptr<TextTokenizer> clone_for_thread() const override;

  // The id of a token given by its content (an added token's content, or a vocabulary entry
  // in raw bytes); -1 if there is none.
  int32_t token_id(std::string_view content) const;

 private:
  struct Impl;
  BpeTokenizer() = default;
  std::unique_ptr<Impl> impl_;
  std::string path_, sha256_;
  int64_t model_bytes_ = 0, vocab_size_ = 0;
  int32_t bos_id_ = -1, eos_id_ = -1;
};

// Whether `path` names a tokenizer.json: a folder holding one, a file named *.json (any
// case), or a file whose first byte that is not whitespace (after a UTF-8 byte order mark) is
// '{' (a SentencePiece model is a protobuf, which cannot start so).
bool is_tokenizer_json(const std::string& path);

// The tokenizer --tokenizer names: a tokenizer.json file (BpeTokenizer); a SentencePiece
// .model file (SentencePieceTokenizer); or a folder (a Hugging Face model folder) holding
// tokenizer.json (taken first) or tokenizer.model. `specials` applies to tokenizer.json only.
// A folder holding both whose tokenizer.json BpeTokenizer refuses (Llama 2's, Mistral's: the
// SentencePiece model converted, Metaspace and byte fallback, not byte-level) is read through
// its tokenizer.model when no `specials` are given (transformers' fast and slow tokenizers of
// such a model encode alike); `note`, if given, is then set to one line saying so and why.
// Throws fsdp::InputError naming the path for a folder with neither file, and the loaders'
// errors (tokenizer.json's when tokenizer.model fails too).
std::unique_ptr<TextTokenizer> load_text_tokenizer(const std::string& path,
                                                   const BpeSpecialTokens& specials = {},
                                                   std::string* note = nullptr);

}  // namespace fsdp::data
