// tests/test_bpe_tokenizer.cpp: the tokenizer.json reader (fsdp/data/bpe_tokenizer.hpp) on
// small tokenizers built here, each checking one rule of Hugging Face tokenizers' byte-level BPE
// whose result is worked out by hand: merge order and the leftmost tie, ignore_merges, the
// Unicode normalizers, Split's
// Isolated pieces (the text between matches kept, empty matches skipped), add_prefix_space,
// both merge spellings, ids of added tokens, BOS / EOS from the flags, tokenizer_config.json
// and the post_processor in that order, and the UTF-8 check; encode_documents gives the same
// stream on any number of threads and batch size, reports the first bad document in order,
// and reads JSON Lines records' text fields. Real vocabularies against tiktoken:
// tests/cli/tokenizers.sh hf_bpe_*.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/data/bpe_tokenizer.hpp"
#include "fsdp/data/prepare.hpp"
#include "compress_util.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using fsdp::data::BpeSpecialTokens;
using fsdp::data::BpeTokenizer;
using Ids = std::vector<int32_t>;

namespace {

// GPT-2's bytes_to_unicode spelled as UTF-8: byte b's character in a vocabulary.
std::string byte_char(int b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)) {
    int n = 0;
    for (int c = 0; c < b; ++c)
      n += (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174 ? 0 : 1;
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A byte-level tokenizer.json: token b (0..255) is byte b; `extra` tokens get ids 256, 257, ...
// in order (spelled in raw ASCII, which byte level leaves as it is); merges as "a b" strings;
// pre_tokenizer ByteLevel without regex unless changed.
json tokenizer(const std::vector<std::string>& extra, const std::vector<std::string>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  for (std::size_t i = 0; i < extra.size(); ++i) vocab[extra[i]] = 256 + static_cast<int>(i);
  return {
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"added_tokens", json::array()},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}}};
}

class BpeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(FSDP_BINARY_DIR) / "test_tmp" /
           ("bpe_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const json& j) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << j.dump();
    return path;
  }
  Ids encode(const json& j, const std::string& text) {
    BpeTokenizer tok(write("tokenizer.json", j));
    Ids ids;
    tok.encode(text, ids, "text");
    return ids;
  }

  fs::path dir_;
};

TEST_F(BpeFiles, MergesApplyInRankOrderLeftmostFirst) {
  // "b c" ranks before "a b": abc -> a + bc, although ab comes first in the text.
  EXPECT_EQ(encode(tokenizer({"bc", "ab"}, {"b c", "a b"}), "abc"), (Ids{'a', 256}));
  EXPECT_EQ(encode(tokenizer({"bc", "ab"}, {"a b", "b c"}), "abc"), (Ids{257, 'c'}));
  // Equal ranks: the leftmost pair first. aaa -> aa + a; aaaa -> aa + aa, then aaaa.
  EXPECT_EQ(encode(tokenizer({"aa"}, {"a a"}), "aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(encode(tokenizer({"aa", "aaaa"}, {"a a", "aa aa"}), "aaaaa"), (Ids{257, 'a'}));
  // A merge's result takes part in later merges (th + e -> the).
  EXPECT_EQ(encode(tokenizer({"th", "the"}, {"t h", "th e"}), "thethe"), (Ids{257, 257}));
}

TEST_F(BpeFiles, MergesAsPairsEqualMergesAsStrings) {
  json pairs = tokenizer({"th", "the"}, {});
  pairs["model"]["merges"] = json::array({json::array({"t", "h"}), json::array({"th", "e"})});
  EXPECT_EQ(encode(pairs, "the other"),
            encode(tokenizer({"th", "the"}, {"t h", "th e"}), "the other"));
  EXPECT_EQ(encode(pairs, "the"), (Ids{257}));
}

TEST_F(BpeFiles, IgnoreMergesTakesAWholePieceFromTheVocabulary) {
  // "abc" is a token that no merge reaches (ab + c has no merge).
  json j = tokenizer({"ab", "abc"}, {"a b"});
  EXPECT_EQ(encode(j, "abc"), (Ids{256, 'c'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(encode(j, "abc"), (Ids{257}));
  EXPECT_EQ(encode(j, "abcd"), (Ids{256, 'c', 'd'}));  // not itself in the vocabulary: merges
}

TEST_F(BpeFiles, SplitKeepsMatchesAndTheTextBetween) {
  // Isolated: "ab12cd" -> ab | 12 | cd; merges never cross a piece (b1 has a merge).
  json j = tokenizer({"b1", "ab", "12"}, {"b 1", "a b", "1 2"});
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"},
         {"pattern", {{"Regex", "\\d+"}}},
         {"behavior", "Isolated"},
         {"invert", false}},
        {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  EXPECT_EQ(encode(j, "ab12cd"), (Ids{257, 258, 'c', 'd'}));
  EXPECT_EQ(encode(tokenizer({"b1", "ab", "12"}, {"b 1", "a b", "1 2"}), "ab12cd"),
            (Ids{'a', 256, '2', 'c', 'd'}));
  // A pattern that matches empty strings: they are skipped, not looped on.
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "1*";
  EXPECT_EQ(encode(j, "ab12cd"), (Ids{257, '1', '2', 'c', 'd'}));
}

TEST_F(BpeFiles, ByteLevelRegexIsGpt2sPattern) {
  // use_regex: "hi  you" -> "hi" | " " | " you": the space before a word stays with it.
  json j = tokenizer({" y", " yo", " you", "hi"}, {"Ġ y", "Ġy o", "Ġyo u", "h i"});
  j["model"]["vocab"].erase(" y"), j["model"]["vocab"].erase(" yo"),
      j["model"]["vocab"].erase(" you");
  j["model"]["vocab"]["Ġy"] = 256, j["model"]["vocab"]["Ġyo"] = 257,
  j["model"]["vocab"]["Ġyou"] = 258;
  j["pre_tokenizer"]["use_regex"] = true;
  EXPECT_EQ(encode(j, "hi  you"), (Ids{259, ' ', 258}));
  j["pre_tokenizer"]["use_regex"] = false;  // one piece: no merge joins i and the spaces here
  EXPECT_EQ(encode(j, "hi  you"), (Ids{259, ' ', 258}));
  EXPECT_EQ(encode(j, "hiyou"), (Ids{259, 'y', 'o', 'u'}));
  j["pre_tokenizer"]["add_prefix_space"] = true;  // " you" as a text of its own
  EXPECT_EQ(encode(j, "you"), (Ids{258}));
  EXPECT_EQ(encode(j, " you"), (Ids{258}));  // already starts with a space: none added
}

TEST_F(BpeFiles, NormalizersApplyTheirUnicodeForm) {
  json j = tokenizer({}, {});
  const std::string e_acute = "e\xcc\x81", composed = "\xc3\xa9", fi = "\xef\xac\x81";  // é, ﬁ
  EXPECT_EQ(encode(j, e_acute), (Ids{'e', 0xcc, 0x81}));  // no normalizer: as it is
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(encode(j, e_acute + fi), (Ids{0xc3, 0xa9, 0xef, 0xac, 0x81}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}}}};
  EXPECT_EQ(encode(j, composed), (Ids{'e', 0xcc, 0x81}));
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(encode(j, e_acute + fi), (Ids{0xc3, 0xa9, 'f', 'i'}));
  j["normalizer"] = {{"type", "NFKD"}};
  EXPECT_EQ(encode(j, composed + fi), (Ids{'e', 0xcc, 0x81, 'f', 'i'}));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array()}};
  EXPECT_EQ(encode(j, e_acute), (Ids{'e', 0xcc, 0x81}));
}

TEST_F(BpeFiles, VocabSizeAndAddedTokens) {
  json j = tokenizer({"ab"}, {"a b"});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|eot|>"}, {"special", true}}});
  BpeTokenizer tok(write("tokenizer.json", j));
  EXPECT_EQ(tok.vocab_size(), 301);
  EXPECT_EQ(tok.token_id("<|eot|>"), 300);
  EXPECT_EQ(tok.token_id("ab"), 256);
  EXPECT_EQ(tok.token_id("nope"), -1);
  EXPECT_EQ(tok.num_merges(), 1);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_EQ(tok.eos_id(), -1);
  EXPECT_EQ(tok.kind(), "hf-bpe");
  // The added token's spelling in text is ordinary text.
  Ids ids;
  tok.encode("<|eot|>", ids, "text");
  EXPECT_EQ(ids, (Ids{'<', '|', 'e', 'o', 't', '|', '>'}));
}

TEST_F(BpeFiles, BosAndEosComeFromFlagsThenConfigThenTemplate) {
  json j = tokenizer({}, {});
  j["added_tokens"] = json::array({{{"id", 256}, {"content", "<s>"}},
                                   {{"id", 257}, {"content", "</s>"}},
                                   {{"id", 258}, {"content", "<x>"}}});
  j["post_processor"] = {{"type", "Sequence"},
                         {"processors",
                          {{{"type", "ByteLevel"}},
                           {{"type", "TemplateProcessing"},
                            {"single",
                             {{{"SpecialToken", {{"id", "<s>"}}}},
                              {{"Sequence", {{"id", "A"}}}},
                              {{"SpecialToken", {{"id", "</s>"}}}}}}}}}};
  const std::string path = write("tokenizer.json", j);
  {
    BpeTokenizer tok(path);  // no config: the template's
    EXPECT_EQ(tok.bos_id(), 256);
    EXPECT_EQ(tok.eos_id(), 257);
  }
  write("tokenizer_config.json",
        {{"bos_token", {{"content", "<x>"}, {"__type", "AddedToken"}}}, {"eos_token", nullptr}});
  {
    BpeTokenizer tok(path);  // the config's: an AddedToken object, and null for none
    EXPECT_EQ(tok.bos_id(), 258);
    EXPECT_EQ(tok.eos_id(), -1);
  }
  write("tokenizer_config.json", {{"model_max_length", 1024}});
  {
    BpeTokenizer tok(path, BpeSpecialTokens{"</s>", ""});  // flag first; EOS from the template
    EXPECT_EQ(tok.bos_id(), 257);
    EXPECT_EQ(tok.eos_id(), 257);
  }
  std::ofstream(dir_ / "tokenizer_config.json") << "{not json";
  try {
    BpeTokenizer tok(path);
    FAIL() << "a tokenizer_config.json that is not JSON was read";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json: not JSON"), std::string::npos)
        << e.what();
  }
}

TEST_F(BpeFiles, TextMustBeUtf8) {
  BpeTokenizer tok(write("tokenizer.json", tokenizer({}, {})));
  Ids ids;
  tok.encode("caf\xc3\xa9", ids, "x");  // é
  EXPECT_EQ(ids, (Ids{'c', 'a', 'f', 0xc3, 0xa9}));
  for (const auto& [text, offset] :
       std::vector<std::pair<std::string, int>>{{"ok\xff", 2},
                                                {"a\xc3", 1},
                                                {"\xed\xa0\x80", 0} /* a surrogate */,
                                                {"ab\xc0\xaf", 2} /* overlong */}) {
    try {
      tok.encode(text, ids, "doc.txt");
      ADD_FAILURE() << "accepted invalid UTF-8 at " << offset;
    } catch (const fsdp::Error& e) {
      EXPECT_NE(
          std::string(e.what()).find("doc.txt: not valid UTF-8 at byte " + std::to_string(offset)),
          std::string::npos)
          << e.what();
    }
  }
}

TEST_F(BpeFiles, LoadTextTokenizerPicksTheFormat) {
  const std::string path = write("tokenizer.json", tokenizer({}, {}));
  EXPECT_TRUE(fsdp::data::is_tokenizer_json(path));
  EXPECT_TRUE(fsdp::data::is_tokenizer_json(dir_.string()));
  EXPECT_EQ(fsdp::data::load_text_tokenizer(dir_.string())->kind(), "hf-bpe");
  std::ofstream(dir_ / "x.model") << "\x0a\x05garbage";
  EXPECT_FALSE(fsdp::data::is_tokenizer_json((dir_ / "x.model").string()));
  EXPECT_THROW(fsdp::data::load_text_tokenizer((dir_ / "x.model").string()), fsdp::Error);
  // Saved with a UTF-8 byte order mark (as some editors do), under another name: still JSON.
  const std::string bom = (dir_ / "tok.bom").string();
  std::ofstream(bom) << "\xef\xbb\xbf\n " << tokenizer({}, {}).dump();
  EXPECT_TRUE(fsdp::data::is_tokenizer_json(bom));
  EXPECT_EQ(fsdp::data::load_text_tokenizer(bom)->kind(), "hf-bpe");
  // A damaged *.json is reported by the JSON parser, not as a bad SentencePiece model.
  const std::string damaged = (dir_ / "damaged.JSON").string();
  std::ofstream(damaged) << "garbage{";
  EXPECT_TRUE(fsdp::data::is_tokenizer_json(damaged));
  try {
    fsdp::data::load_text_tokenizer(damaged);
    ADD_FAILURE() << "a damaged tokenizer.json loaded";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("damaged.JSON: not a tokenizer.json (JSON parse error"),
              std::string::npos)
        << e.what();
  }
}

// A corpus of several files of lines (words with merges, digits, blank lines), a BPE with
// merges and a regex: encode_documents on 1 thread in one batch is the reference.
class EncodeDocuments : public BpeFiles {
 protected:
  void SetUp() override {
    BpeFiles::SetUp();
    json j = tokenizer({"th", "the", " the", "he"}, {"t h", "th e", "Ġ the", "h e"});
    j["model"]["vocab"].erase(" the");
    j["model"]["vocab"]["Ġthe"] = 258;
    j["pre_tokenizer"]["use_regex"] = true;
    j["added_tokens"] =
        json::array({{{"id", 260}, {"content", "<s>"}}, {{"id", 261}, {"content", "</s>"}}});
    tok_ =
        std::make_unique<BpeTokenizer>(write("tokenizer.json", j), BpeSpecialTokens{"<s>", "</s>"});
    for (int f = 0; f < 5; ++f) {
      std::string text;
      for (int l = 0; l < 40 + 13 * f; ++l) {
        text += (l % 7 == 3) ? "\n" : "the other " + std::to_string(l * f) + " hethe\n";
      }
      const fs::path p = dir_ / "corpus" / ("f" + std::to_string(f) + ".txt");
      fs::create_directories(p.parent_path());
      std::ofstream(p) << text;
      files_.push_back(p);
    }
  }
  Ids stream(fsdp::data::DocumentUnit unit, int threads, std::size_t batch_bytes,
             fsdp::data::TokenStreamCounts* counts = nullptr) {
    Ids all;
    const auto c = fsdp::data::encode_documents(
        files_, *tok_, true, true, unit, threads,
        [&](const int32_t* ids, std::size_t n) { all.insert(all.end(), ids, ids + n); }, nullptr,
        batch_bytes);
    if (counts) *counts = c;
    return all;
  }
  std::unique_ptr<BpeTokenizer> tok_;
  std::vector<fs::path> files_;
};

TEST_F(EncodeDocuments, SameStreamOnAnyThreadsAndBatches) {
  for (const auto unit : {fsdp::data::DocumentUnit::file, fsdp::data::DocumentUnit::line}) {
    fsdp::data::TokenStreamCounts ref_counts;
    const Ids ref = stream(unit, 1, std::size_t{1} << 30, &ref_counts);
    // The reference itself: one document's ids by hand.
    Ids first;
    tok_->encode(unit == fsdp::data::DocumentUnit::file ? std::string("the other 0 hethe\n")
                                                        : std::string("the other 0 hethe"),
                 first, "x");
    ASSERT_GE(ref.size(), first.size() + 2);
    EXPECT_EQ(ref[0], 260);
    if (unit == fsdp::data::DocumentUnit::line) {
      EXPECT_EQ(Ids(ref.begin() + 1, ref.begin() + 1 + first.size()), first);
      EXPECT_EQ(ref[1 + first.size()], 261);
      // the | " other" | " 0" | " hethe": in " hethe", t h (rank 0) then th e go before h e.
      EXPECT_EQ(first, (Ids{257, ' ', 'o', 257, 'r', ' ', '0', ' ', 259, 257}));
    }
    EXPECT_EQ(ref_counts.files, 5);
    EXPECT_EQ(ref_counts.tokens, static_cast<int64_t>(ref.size()));
    for (const int threads : {2, 3, 8}) {
      for (const std::size_t batch : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 30}) {
        fsdp::data::TokenStreamCounts c;
        EXPECT_EQ(stream(unit, threads, batch, &c), ref) << threads << " threads, batch " << batch;
        EXPECT_EQ(c.documents, ref_counts.documents);
        EXPECT_EQ(c.tokens, ref_counts.tokens);
      }
    }
  }
}

TEST_F(EncodeDocuments, FirstBadDocumentInOrderIsReported) {
  std::ofstream(files_[1], std::ios::app) << "bad \xff byte\n";
  std::ofstream(files_[3], std::ios::app) << "also \xfe bad\n";
  for (const auto& [threads, batch] : std::vector<std::pair<int, std::size_t>>{
           {1, 1}, {4, 1}, {4, std::size_t{1} << 30}, {8, std::size_t{1} << 30}}) {
    try {
      stream(fsdp::data::DocumentUnit::line, threads, batch);  // both bad lines in one batch
      ADD_FAILURE() << "invalid UTF-8 accepted on " << threads << " threads";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("f1.txt:"), std::string::npos) << msg;
      EXPECT_NE(msg.find("not valid UTF-8 at byte 4"), std::string::npos) << msg;
    }
  }
}

TEST_F(EncodeDocuments, JsonLinesAreTheTextFieldsOfTheirLines) {
  // Each line of each file as a record {"n": i, "text": line} (empty lines as ""), one blank
  // line between records: the same stream as --document line over the files themselves.
  std::vector<fs::path> jsonl;
  for (const auto& f : files_) {
    std::ifstream in(f);
    const fs::path p = dir_ / "jsonl" / (f.stem().string() + ".jsonl");
    fs::create_directories(p.parent_path());
    std::ofstream out(p);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      out << json{{"n", n++}, {"text", line}}.dump() << "\n\n";
    }
    jsonl.push_back(p);
  }
  const auto run = [&](const std::vector<fs::path>& files, const fsdp::data::DocumentFormat& format,
                       int threads) {
    Ids all;
    fsdp::data::encode_documents(
        files, *tok_, true, false, format, threads,
        [&](const int32_t* ids, std::size_t n) { all.insert(all.end(), ids, ids + n); });
    return all;
  };
  const Ids lines = run(files_, fsdp::data::DocumentUnit::line, 1);
  EXPECT_EQ(run(jsonl, fsdp::data::DocumentUnit::jsonl, 1), lines);
  EXPECT_EQ(run(jsonl, fsdp::data::DocumentUnit::jsonl, 3), lines);
  // The same files compressed, as corpora ship (Dolma's *.jsonl.zst, C4's *.json.gz).
  std::vector<fs::path> packed;
  for (std::size_t i = 0; i < jsonl.size(); ++i) {
    std::ifstream in(jsonl[i], std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    packed.push_back(jsonl[i].string() + (i % 2 == 0 ? ".zst" : ".gz"));
    std::ofstream(packed.back(), std::ios::binary) << (i % 2 == 0 ? zstd(text) : gzip(text));
  }
  EXPECT_EQ(run(packed, fsdp::data::DocumentUnit::jsonl, 3), lines);
  // JSON escapes are decoded; another key by --text-key.
  const fs::path esc = dir_ / "esc.jsonl";
  std::ofstream(esc) << R"({"body": "caf\u00e9\nthe", "text": 7})"
                     << "\n";
  Ids want{260};
  tok_->encode("caf\xc3\xa9\nthe", want, "x");
  EXPECT_EQ(run({esc}, {fsdp::data::DocumentUnit::jsonl, "body"}, 1), want);
  for (const auto& [line, needle] : std::vector<std::pair<std::string, std::string>>{
           {R"({"body": "x", "text": 7})", "esc.jsonl:1: no string field \"text\""},
           {R"(["text"])", "esc.jsonl:1: no string field \"text\""},
           {R"({"text": "unterminated)", "esc.jsonl:1: not JSON (parse error at byte"}}) {
    std::ofstream(esc) << line << "\n";
    try {
      run({esc}, fsdp::data::DocumentUnit::jsonl, 1);
      ADD_FAILURE() << "accepted " << line;
    } catch (const fsdp::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

// fsdp_prepare --pairs FILE.jsonl --tokenizer: each {"prompt", "completion"} line becomes
// [bos] + the prompt's ids and the completion's ids + [eos] (one example of the pairs file
// data.objective = "sft" reads), the last of them validation; bad lines name file and line.
TEST_F(EncodeDocuments, PromptCompletionPairsForSft) {
  const std::string jsonl = (dir_ / "sft.jsonl").string();
  std::ofstream(jsonl) << "{\"prompt\": \"the other\", \"completion\": \" hethe\", \"x\": 1}\n\n"
                       << "{\"prompt\": \"\", \"completion\": \"the\"}\n"
                       << "{\"prompt\": \"he\", \"completion\": \"other\"}\n";
  fsdp::data::TokenizerOptions o;
  o.model = (dir_ / "tokenizer.json").string();
  o.specials = {"<s>", "</s>"};
  const std::string out = (dir_ / "sft.h5").string();
  const auto s = fsdp::data::prepare_tokenized_pairs(jsonl, out, 0.34, o);
  EXPECT_EQ(s.pairs.train_examples, 2);
  EXPECT_EQ(s.pairs.val_examples, 1);
  EXPECT_EQ(s.bos_id, 260);
  EXPECT_EQ(s.eos_id, 261);
  EXPECT_EQ(s.vocab_size, tok_->vocab_size());
  auto ids = [&](const std::string& text) {
    Ids v;
    tok_->encode(text, v, "x");
    return v;
  };
  const auto ex = fsdp::data::read_prompt_completion_jsonl(jsonl, *tok_, true, true);
  ASSERT_EQ(ex.size(), 3);
  Ids p0 = {260}, c0 = ids(" hethe");
  const Ids t = ids("the other");
  p0.insert(p0.end(), t.begin(), t.end());
  c0.push_back(261);
  EXPECT_EQ(Ids(ex.inputs.begin(), ex.inputs.begin() + ex.input_offsets[1]), p0);
  EXPECT_EQ(Ids(ex.targets.begin(), ex.targets.begin() + ex.target_offsets[1]), c0);
  EXPECT_EQ(ex.input_offsets[2] - ex.input_offsets[1], 1);  // an empty prompt: just <s>
  const auto plain = fsdp::data::read_prompt_completion_jsonl(jsonl, *tok_, false, false);
  EXPECT_EQ(Ids(plain.inputs.begin(), plain.inputs.begin() + plain.input_offsets[1]), t);
  for (const auto& [line, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{\"prompt\": \"a\"}", "sft_bad.jsonl:1: no string \"completion\""},
           {"{\"prompt\": \"a\", \"completion\": \"\"}", "\"completion\" is empty"},
           {"[1, 2]", "no string \"prompt\""},
           {"{oops", "sft_bad.jsonl:1: not a JSON object"}}) {
    const std::string bad = (dir_ / "sft_bad.jsonl").string();
    std::ofstream(bad) << line << "\n";
    try {
      fsdp::data::read_prompt_completion_jsonl(bad, *tok_, true, true);
      ADD_FAILURE() << "accepted " << line;
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST_F(EncodeDocuments, HandlesShareTheModel) {
  const auto clone = tok_->clone_for_thread();
  EXPECT_EQ(clone->vocab_size(), tok_->vocab_size());
  EXPECT_EQ(clone->bos_id(), 260);
  EXPECT_EQ(clone->eos_id(), 261);
  EXPECT_EQ(clone->model_sha256(), tok_->model_sha256());
  Ids a, b;
  tok_->encode("the other hethe", a, "x");
  clone->encode("the other hethe", b, "x");
  EXPECT_EQ(a, b);
}

}  // namespace
