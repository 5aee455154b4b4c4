// tests/test_tokenizers.cpp: fsdp_prepare's real tokenizers (fsdp/data/tokenizer.hpp,
// fsdp/data/prepare.hpp): SentencePiece models trained here (a Llama-like BPE with byte
// fallback, <s> and </s>; a T5-like unigram with no BOS) encode files and lines into the
// HDF5 exactly as the processor (and Debian's Python sentencepiece, where installed) does,
// with BOS/EOS around each document; llm.c (GPT-2 v1 uint16, Llama 3 v7 uint32) and nanoGPT
// token files written here round-trip exactly; every bad file is one InputError (exit code
// 2) naming it, and leaves no output; the tokenizer record in the HDF5, and files without it.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "fsdp/core/error.hpp"
#include "temp_dir.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/data/token_dataset.hpp"
#include "fsdp/data/tokenizer.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fs = std::filesystem;
using fsdp::data::Split;

namespace {

using test_util::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Expects `f` to throw fsdp::Error with exit code 2 and a message holding every `parts`,
// on one line.
template <class F>
void expect_input_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fsdp::InputError";
  } catch (const fsdp::Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << "\n  lacks: " << p;
  }
}

// Both splits of a token file, concatenated (TokenDataset: what the trainer reads).
std::vector<int32_t> read_stream(const std::string& h5, int64_t* train_tokens = nullptr) {
  std::vector<int32_t> all;
  for (Split s : {Split::train, Split::val}) {
    fsdp::data::TokenDataset ds(h5, s);
    std::vector<int32_t> part(static_cast<std::size_t>(ds.num_tokens()));
    ds.read(0, ds.num_tokens(), part.data());
    if (s == Split::train && train_tokens) *train_tokens = ds.num_tokens();
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

std::size_t stored_bytes(const std::string& h5) {
  const auto f = fsdp::h5::File::open_read(h5);
  EXPECT_EQ(f.type_size("/train/tokens"), f.type_size("/val/tokens"));
  return f.type_size("/train/tokens");
}

// Deterministic text: `n` lines of words from a small list (with non-ASCII words, so the
// byte-fallback pieces and the normalizer are exercised), by a fixed LCG.
std::string corpus_lines(int n, uint64_t seed) {
  static const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "pack", "my",
                                "box", "with", "five", "dozen", "liquor", "jugs", "sphinx", "of", "black",
                                "quartz", "judge", "vow", "café", "über", "naïve", "日本語", "tokens", "2024",
                                "model", "shard", "gradient", "all-gather", "reduce-scatter", "(FSDP)", "x=1;"};
  const int nw = static_cast<int>(sizeof(words) / sizeof(words[0]));
  uint64_t x = seed;
  auto next = [&] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((x >> 33) % 1000003);
  };
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int len = 3 + next() % 12;
    for (int w = 0; w < len; ++w) {
      if (w) out += ' ';
      out += words[next() % nw];
    }
    out += (i % 7 == 3) ? ".\n" : "\n";
  }
  return out;
}

// Ids of `text` by the reference processor (the library itself, not fsdp's wrapper).
std::vector<int32_t> reference_ids(const sentencepiece::SentencePieceProcessor& sp, const std::string& text) {
  std::vector<int> ids;
  EXPECT_TRUE(sp.Encode(text, &ids).ok());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

// Two models trained once for the suite: a Llama-like BPE (byte fallback, unk 0, <s> 1,
// </s> 2) and a T5-like unigram (pad 0, </s> 1, unk 2, no BOS).
class SentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir("spm");
    const std::string corpus = dir_->file("corpus.txt");
    write_file(corpus, corpus_lines(400, 7));
    const std::string common = "--input=" + corpus + " --num_threads=1 --character_coverage=1.0 --minloglevel=2";
    auto train = [&](const std::string& args) {
      const auto st = sentencepiece::SentencePieceTrainer::Train(common + " " + args);
      ASSERT_TRUE(st.ok()) << st.ToString();
    };
    train("--model_prefix=" + dir_->file("llama") +
          " --model_type=bpe --vocab_size=400 --byte_fallback=true --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1");
    train("--model_prefix=" + dir_->file("t5") +
          " --model_type=unigram --vocab_size=80 --pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1");
    llama_ = dir_->file("llama.model");
    t5_ = dir_->file("t5.model");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  // The reference processor (not copyable nor movable: held by pointer).
  static std::unique_ptr<sentencepiece::SentencePieceProcessor> load(const std::string& model) {
    auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
    EXPECT_TRUE(sp->Load(model).ok());
    return sp;
  }

  static TempDir* dir_;
  static std::string llama_, t5_;
};
TempDir* SentencePiece::dir_ = nullptr;
std::string SentencePiece::llama_, SentencePiece::t5_;

TEST_F(SentencePiece, TokenizerWrapsTheProcessor) {
  fsdp::data::SentencePieceTokenizer tok(llama_);
  auto sp = load(llama_);
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.vocab_size(), sp->GetPieceSize());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.model_bytes(), static_cast<int64_t>(fs::file_size(llama_)));
  EXPECT_EQ(tok.model_sha256(), fsdp::data::sha256_hex(read_file(llama_)));
  const std::string text = "the naïve fox über 日本語 and unseen Ωmega";  // (nmt_nfkc: a tab would become a space)
  std::vector<int32_t> ids;
  tok.encode(text, ids, "x");
  EXPECT_EQ(ids, reference_ids(*sp, text));
  EXPECT_EQ(sp->DecodeIds(std::vector<int>(ids.begin(), ids.end())), text);  // byte fallback: lossless

  fsdp::data::SentencePieceTokenizer t5(t5_);
  EXPECT_EQ(t5.vocab_size(), 80);
  EXPECT_EQ(t5.bos_id(), -1);
  EXPECT_EQ(t5.eos_id(), 1);
}

// Files as documents (the default): [bos] + encode(file) + [eos] per non-empty file, files
// in sorted path order; the record names the model, its size and SHA-256.
TEST_F(SentencePiece, PrepareFilesMatchesProcessor) {
  TempDir d("files");
  const std::string c = corpus_lines(300, 11);
  write_file(d.file("in/b.txt"), c.substr(0, 5000));
  write_file(d.file("in/a.txt"), c.substr(5000, 4000));
  write_file(d.file("in/sub/c.txt"), c.substr(9000));
  write_file(d.file("in/empty.txt"), "");  // no document: no bos/eos either
  fsdp::data::TokenizerOptions o;
  o.model = llama_;
  const auto s = fsdp::data::prepare_tokenized_dataset({d.file("in")}, d.file("out.h5"), 0.1, o);
  auto sp = load(llama_);
  std::vector<int32_t> want;
  for (const char* f : {"in/a.txt", "in/b.txt", "in/sub/c.txt"}) {
    want.push_back(1);
    const auto ids = reference_ids(*sp, read_file(d.file(f)));
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(2);
  }
  int64_t train = 0;
  EXPECT_EQ(read_stream(d.file("out.h5"), &train), want);
  const auto n = static_cast<int64_t>(want.size());
  EXPECT_EQ(s.files, 4);
  EXPECT_EQ(s.documents, 3);
  EXPECT_EQ(s.val_tokens, static_cast<int64_t>(0.1 * static_cast<double>(n)));
  EXPECT_EQ(s.train_tokens, n - s.val_tokens);
  EXPECT_EQ(train, s.train_tokens);
  EXPECT_EQ(s.vocab_size, 400);
  EXPECT_EQ(s.bos_id, 1);
  EXPECT_EQ(s.eos_id, 2);
  EXPECT_EQ(stored_bytes(d.file("out.h5")), 2u);  // vocab 400: uint16

  const auto r = fsdp::data::read_tokenizer_record(d.file("out.h5"));
  EXPECT_EQ(r.kind, "sentencepiece");
  EXPECT_EQ(r.vocab_size, 400);
  EXPECT_EQ(r.model_path, fs::absolute(llama_).lexically_normal().string());
  EXPECT_EQ(r.model_bytes, static_cast<int64_t>(fs::file_size(llama_)));
  EXPECT_EQ(r.model_sha256, fsdp::data::sha256_hex(read_file(llama_)));
  EXPECT_EQ(r.bos_id, 1);
  EXPECT_EQ(r.eos_id, 2);
  EXPECT_TRUE(r.add_bos);
  EXPECT_TRUE(r.add_eos);
  EXPECT_EQ(r.num_documents, 3);
  EXPECT_TRUE(r.token_format.empty());

  // The trainer's check: model.vocab_size must hold the file's vocabulary.
  fsdp::data::TokenDataset ok(d.file("out.h5"), Split::train, /*expect_vocab_size=*/400);
  EXPECT_EQ(ok.tokenizer(), "sentencepiece");
  expect_input_error([&] { fsdp::data::TokenDataset(d.file("out.h5"), Split::train, 399); },
                     {"vocab_size 400", "sentencepiece", "model.vocab_size is 399"});
}

// --document line: each line (newline and a trailing CR removed) is a document; empty lines
// are skipped. --no-add-bos: eos only.
TEST_F(SentencePiece, PrepareLinesNoBos) {
  TempDir d("lines");
  write_file(d.file("a.txt"), "first line über\r\n\nsecond line\n  \nlast without newline");
  fsdp::data::TokenizerOptions o;
  o.model = llama_;
  o.document = fsdp::data::DocumentUnit::line;
  o.add_bos = false;
  const auto s = fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out.h5"), 0.2, o);
  auto sp = load(llama_);
  std::vector<int32_t> want;
  for (const char* line : {"first line über", "second line", "  ", "last without newline"}) {
    const auto ids = reference_ids(*sp, line);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(2);
  }
  EXPECT_EQ(read_stream(d.file("out.h5")), want);
  EXPECT_EQ(s.documents, 4);
  EXPECT_EQ(s.bos_id, -1);
  const auto r = fsdp::data::read_tokenizer_record(d.file("out.h5"));
  EXPECT_FALSE(r.add_bos);
  EXPECT_TRUE(r.add_eos);
  EXPECT_EQ(r.bos_id, 1);  // the model's, recorded even when not added
}

TEST_F(SentencePiece, NoSpecialsIsPlainConcatenation) {
  TempDir d("plain");
  const std::string c = corpus_lines(50, 3);
  write_file(d.file("a.txt"), c);
  fsdp::data::TokenizerOptions o;
  o.model = llama_;
  o.add_bos = false;
  o.add_eos = false;
  fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out.h5"), 0.1, o);
  EXPECT_EQ(read_stream(d.file("out.h5")), reference_ids(*load(llama_), c));
}

// A T5-like model has no BOS: by default each document ends in </s> only; asking for a BOS
// is an error naming --add-bos and the model.
TEST_F(SentencePiece, ModelWithoutBos) {
  TempDir d("t5");
  const std::string c = corpus_lines(40, 5);
  write_file(d.file("a.txt"), c);
  fsdp::data::TokenizerOptions o;
  o.model = t5_;
  const auto s = fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out.h5"), 0.1, o);
  auto want = reference_ids(*load(t5_), c);
  want.push_back(1);
  EXPECT_EQ(read_stream(d.file("out.h5")), want);
  EXPECT_EQ(s.bos_id, -1);
  EXPECT_EQ(s.eos_id, 1);
  EXPECT_EQ(fsdp::data::read_tokenizer_record(d.file("out.h5")).bos_id, -1);
  o.add_bos = true;
  expect_input_error([&] { fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out2.h5"), 0.1, o); },
                     {"--add-bos", "t5.model", "no BOS"});
  EXPECT_FALSE(fs::exists(d.file("out2.h5")));
}

// A Hugging Face folder of a SentencePiece model (Llama 2, Mistral) holds tokenizer.json
// (the model converted: Metaspace, byte fallback; not byte-level, which BpeTokenizer reads)
// beside tokenizer.model: --tokenizer FOLDER encodes with tokenizer.model, saying why.
TEST_F(SentencePiece, FolderWithAnUnreadableTokenizerJsonUsesTokenizerModel) {
  TempDir d("hf_spm");
  fs::create_directories(d.file("model"));
  fs::copy_file(llama_, d.file("model/tokenizer.model"));
  write_file(d.file("model/tokenizer.json"),
             R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []},
                 "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}})");
  const std::string c = corpus_lines(40, 5);
  write_file(d.file("a.txt"), c);
  fsdp::data::TokenizerOptions o;
  o.model = d.file("model");
  const auto s = fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out.h5"), 0.1, o);
  EXPECT_EQ(s.kind, "sentencepiece");
  auto want = reference_ids(*load(llama_), c);
  want.insert(want.begin(), 1);  // BOS
  want.push_back(2);             // EOS
  EXPECT_EQ(read_stream(d.file("out.h5")), want);
  EXPECT_NE(s.tokenizer_note.find("model/tokenizer.json: "), std::string::npos) << s.tokenizer_note;
  const std::string used = "encoding with " + d.file("model/tokenizer.model") + " beside it";
  EXPECT_NE(s.tokenizer_note.find(used), std::string::npos) << s.tokenizer_note;
  EXPECT_EQ(fsdp::data::read_tokenizer_record(d.file("out.h5")).model_path,
            fs::absolute(d.file("model/tokenizer.model")).string());
  // With --bos-token / --eos-token (tokenizer.json's options) nothing falls back: its error.
  o.specials.bos_token = "<s>";
  expect_input_error(
      [&] { fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out2.h5"), 0.1, o); },
      {"model/tokenizer.json", "byte"});
  // A tokenizer.model that does not load either: tokenizer.json's error, the file taken first.
  o.specials = {};
  write_file(d.file("model/tokenizer.model"), "\x0a\x05garbage");
  expect_input_error(
      [&] { fsdp::data::prepare_tokenized_dataset({d.file("a.txt")}, d.file("out3.h5"), 0.1, o); },
      {"model/tokenizer.json", "byte"});
}

// Debian's Python binding (python3-sentencepiece, /usr/bin/python3) encodes the same files
// to the same ids, BOS/EOS placed as fsdp_prepare places them. Skipped where it is missing.
TEST_F(SentencePiece, MatchesPythonSentencePiece) {
  if (std::system("/usr/bin/python3 -c 'import sentencepiece' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 has no sentencepiece module (Debian: python3-sentencepiece)";
  }
  TempDir d("py");
  const std::string c = corpus_lines(200, 13);
  write_file(d.file("in/1.txt"), c.substr(0, 6000));
  write_file(d.file("in/2.txt"), "café, naïve, 日本語; unseen Ωmega ✓\n" + c.substr(6000));
  for (const bool lines : {false, true}) {
    fsdp::data::TokenizerOptions o;
    o.model = llama_;
    if (lines) o.document = fsdp::data::DocumentUnit::line;
    const std::string out = d.file(lines ? "lines.h5" : "files.h5");
    fsdp::data::prepare_tokenized_dataset({d.file("in")}, out, 0.05, o);
    write_file(d.file("enc.py"),
               "import sys, sentencepiece as spm\n"
               "sp = spm.SentencePieceProcessor(model_file=sys.argv[1])\n"
               "lines = sys.argv[2] == 'line'\n"
               "ids = []\n"
               "for path in sys.argv[3:]:\n"
               "    text = open(path, 'rb').read().decode('utf-8')\n"
               "    docs = [l[:-1] if l.endswith('\\r') else l for l in text.split('\\n')] if lines else [text]\n"
               "    for doc in docs:\n"
               "        if doc:\n"
               "            ids += [sp.bos_id()] + sp.encode(doc) + [sp.eos_id()]\n"
               "print(' '.join(map(str, ids)))\n");
    const std::string cmd = "/usr/bin/python3 " + d.file("enc.py") + " " + llama_ + (lines ? " line " : " file ") +
                            d.file("in/1.txt") + " " + d.file("in/2.txt") + " > " + d.file("py_ids.txt");
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    std::istringstream in(read_file(d.file("py_ids.txt")));
    std::vector<int32_t> py;
    for (int32_t v; in >> v;) py.push_back(v);
    EXPECT_EQ(read_stream(out), py) << (lines ? "--document line" : "--document file");
  }
}

// Bad tokenizer.model files: one line naming the file, exit code 2, no output left.
TEST_F(SentencePiece, BadModelFiles) {
  TempDir d("badmodel");
  write_file(d.file("in/a.txt"), corpus_lines(20, 1));
  write_file(d.file("empty.model"), "");
  write_file(d.file("garbage.model"), std::string(3000, '\xff'));
  write_file(d.file("truncated.model"), read_file(llama_).substr(0, 1000));
  write_file(d.file("tokenizer.json"), "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}");
  write_file(d.file("tiktoken.model"), "IQ== 0\nIg== 1\nIw== 2\n");  // Llama 3's original tokenizer.model
  fs::create_directories(d.file("dir.model"));
  const std::string out = d.file("out.h5");
  struct Case {
    std::string model, needle;
  };
  for (const Case& c : {Case{d.file("missing.model"), "not found"}, Case{d.file("empty.model"), "empty"},
                        Case{d.file("garbage.model"), "not a SentencePiece model"},
                        Case{d.file("truncated.model"), "not a SentencePiece model"},
                        Case{d.file("tokenizer.json"), "not a byte-level BPE"},
                        Case{d.file("tiktoken.model"), "give the model's tokenizer.json"},
                        Case{d.file("dir.model"), "neither tokenizer.json nor tokenizer.model"}}) {
    fsdp::data::TokenizerOptions o;
    o.model = c.model;
    expect_input_error([&] { fsdp::data::prepare_tokenized_dataset({d.file("in")}, out, 0.1, o); },
                       {c.model + ": ", c.needle});
    EXPECT_FALSE(fs::exists(out)) << c.model;
    EXPECT_FALSE(fs::exists(out + ".tmp")) << c.model;
  }
  // Too little text for both splits.
  write_file(d.file("tiny/a.txt"), "x");
  fsdp::data::TokenizerOptions o;
  o.model = t5_;
  o.add_eos = false;
  expect_input_error([&] { fsdp::data::prepare_tokenized_dataset({d.file("tiny")}, out, 0.1, o); },
                     {"--val-fraction", "empty validation split"});
}

// ---------------------------------------------------------------- llm.c / nanoGPT files

// llm.c's write_datafile: 256 int32 header (magic, version, count), then the tokens.
void write_llmc(const std::string& path, int32_t magic, int32_t version, const std::vector<uint32_t>& tokens,
                int token_bytes, int64_t count_override = -1) {
  std::string bytes(1024, '\0');
  auto put32 = [&](std::size_t at, uint32_t v) {
    for (int b = 0; b < 4; ++b) bytes[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  };
  put32(0, static_cast<uint32_t>(magic));
  put32(4, static_cast<uint32_t>(version));
  put32(8, static_cast<uint32_t>(count_override >= 0 ? count_override : static_cast<int64_t>(tokens.size())));
  for (uint32_t t : tokens) {
    for (int b = 0; b < token_bytes; ++b) bytes += static_cast<char>((t >> (8 * b)) & 0xff);
  }
  write_file(path, bytes);
}

// nanoGPT's np.uint16 tofile: raw little-endian uint16.
void write_nanogpt(const std::string& path, const std::vector<uint32_t>& tokens) {
  std::string bytes;
  for (uint32_t t : tokens) {
    bytes += static_cast<char>(t & 0xff);
    bytes += static_cast<char>((t >> 8) & 0xff);
  }
  write_file(path, bytes);
}

std::vector<uint32_t> random_ids(std::size_t n, uint32_t vocab, uint64_t seed) {
  std::vector<uint32_t> v(n);
  uint64_t x = seed;
  for (auto& t : v) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    t = static_cast<uint32_t>((x >> 33) % vocab);
  }
  if (n > 1) v[1] = vocab - 1;  // the largest id is allowed
  return v;
}

std::vector<int32_t> as_i32(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b = {}) {
  std::vector<int32_t> out(a.begin(), a.end());
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

fsdp::data::TokenFilesSummary import(const std::vector<std::string>& files, int64_t vocab, const std::string& out,
                                     double val_fraction = 0.1, const std::vector<std::string>& val_files = {},
                                     fsdp::data::TokenFileFormat format = fsdp::data::TokenFileFormat::auto_detect) {
  fsdp::data::TokenFileOptions o;
  o.files = files;
  o.val_files = val_files;
  o.vocab_size = vocab;
  o.format = format;
  return fsdp::data::prepare_token_file_dataset(o, out, val_fraction, nullptr);
}

TEST(TokenFiles, LlmcGpt2RoundTrip) {
  TempDir d("gpt2");
  const auto a = random_ids(5000, 50257, 1), b = random_ids(333, 50257, 2);
  write_llmc(d.file("train_000.bin"), 20240520, 1, a, 2);
  write_llmc(d.file("train_001.bin"), 20240520, 1, b, 2);
  const auto s = import({d.file("train_000.bin"), d.file("train_001.bin")}, 50257, d.file("out.h5"), 0.1);
  int64_t train = 0;
  EXPECT_EQ(read_stream(d.file("out.h5"), &train), as_i32(a, b));
  EXPECT_EQ(s.val_tokens, 533);  // floor(0.1 * 5333)
  EXPECT_EQ(s.train_tokens, 4800);
  EXPECT_EQ(train, 4800);
  EXPECT_EQ(s.train_files, 2);
  EXPECT_EQ(stored_bytes(d.file("out.h5")), 2u);
  const auto r = fsdp::data::read_tokenizer_record(d.file("out.h5"));
  EXPECT_EQ(r.kind, "llm.c");
  EXPECT_EQ(r.vocab_size, 50257);
  EXPECT_EQ(r.token_format, "llm.c gpt-2 (magic 20240520, version 1, uint16)");
  EXPECT_TRUE(r.model_path.empty());
  fsdp::data::TokenDataset ds(d.file("out.h5"), Split::val, /*expect_vocab_size=*/50304);  // nanoGPT's padding
  EXPECT_EQ(ds.tokenizer(), "llm.c");
}

// Llama 3 (llm.c "llama-3": magic 20240801, version 7, uint32): ids above 65535 survive.
TEST(TokenFiles, LlmcLlama3RoundTripWithValFiles) {
  TempDir d("llama3");
  const auto a = random_ids(4000, 128256, 3), v = random_ids(700, 128256, 4);
  write_llmc(d.file("train.bin"), 20240801, 7, a, 4);
  write_llmc(d.file("val.bin"), 20240801, 7, v, 4);
  const auto s = import({d.file("train.bin")}, 128256, d.file("out.h5"), 0.1, {d.file("val.bin")});
  int64_t train = 0;
  EXPECT_EQ(read_stream(d.file("out.h5"), &train), as_i32(a, v));
  EXPECT_EQ(train, 4000);
  EXPECT_EQ(s.val_tokens, 700);
  EXPECT_EQ(s.val_files, 1);
  EXPECT_EQ(stored_bytes(d.file("out.h5")), 4u);
  EXPECT_EQ(fsdp::data::read_tokenizer_record(d.file("out.h5")).token_format,
            "llm.c llama-3 (magic 20240801, version 7, uint32)");
}

// nanoGPT's train.bin: raw uint16. More than one 1 Mi-token chunk, the split falling inside
// a chunk, so the streaming copy's boundaries are exercised.
TEST(TokenFiles, NanoGptRoundTrip) {
  TempDir d("nano");
  const auto a = random_ids((std::size_t{1} << 20) + 12345, 50257, 5), b = random_ids(1000, 50257, 6);
  write_nanogpt(d.file("train.bin"), a);
  write_nanogpt(d.file("more.bin"), b);
  const auto s = import({d.file("train.bin"), d.file("more.bin")}, 50257, d.file("out.h5"), 0.3);
  int64_t train = 0;
  EXPECT_EQ(read_stream(d.file("out.h5"), &train), as_i32(a, b));
  const int64_t n = static_cast<int64_t>(a.size() + b.size());
  EXPECT_EQ(s.val_tokens, static_cast<int64_t>(0.3 * static_cast<double>(n)));
  EXPECT_EQ(train, n - s.val_tokens);
  const auto r = fsdp::data::read_tokenizer_record(d.file("out.h5"));
  EXPECT_EQ(r.kind, "nanogpt");
  EXPECT_EQ(r.token_format, "nanogpt (raw uint16)");
  // --token-format nanogpt reads an llm.c file's header as tokens; llm.c insists on the magic.
  write_llmc(d.file("l.bin"), 20240520, 1, random_ids(10, 50257, 7), 2);
  const auto forced = import({d.file("l.bin")}, 65536, d.file("forced.h5"), 0.5, {},
                             fsdp::data::TokenFileFormat::nanogpt);
  EXPECT_EQ(forced.train_tokens + forced.val_tokens, 512 + 10);
}

TEST(TokenFiles, FormatNamesAndDtype) {
  using fsdp::data::TokenFileFormat;
  EXPECT_EQ(fsdp::data::parse_token_file_format("auto"), TokenFileFormat::auto_detect);
  EXPECT_EQ(fsdp::data::parse_token_file_format("llm.c"), TokenFileFormat::llmc);
  EXPECT_EQ(fsdp::data::parse_token_file_format("nanogpt"), TokenFileFormat::nanogpt);
  expect_input_error([] { fsdp::data::parse_token_file_format("gguf"); }, {"--token-format", "gguf"});
  EXPECT_EQ(fsdp::data::token_dtype_bytes(256), 2);
  EXPECT_EQ(fsdp::data::token_dtype_bytes(65536), 2);
  EXPECT_EQ(fsdp::data::token_dtype_bytes(65537), 4);
  EXPECT_EQ(fsdp::data::token_dtype_bytes(128256), 4);
}

// Every bad file: one InputError naming the file (and what is wrong), nothing written.
TEST(TokenFiles, BadFiles) {
  TempDir d("bad");
  const auto ok = random_ids(100, 50257, 8);
  write_llmc(d.file("ok.bin"), 20240520, 1, ok, 2);
  const std::string good = read_file(d.file("ok.bin"));
  write_file(d.file("empty.bin"), "");
  write_file(d.file("trunc_header.bin"), good.substr(0, 700));
  write_file(d.file("three.bin"), good.substr(0, 3));  // not even the magic: nanoGPT, odd
  write_llmc(d.file("count_high.bin"), 20240520, 1, ok, 2, 101);
  write_llmc(d.file("count_low.bin"), 20240520, 1, ok, 2, 99);
  write_llmc(d.file("count_zero.bin"), 20240520, 1, {}, 2);
  write_llmc(d.file("version2.bin"), 20240520, 2, ok, 4);  // no llm.c writer makes this
  write_llmc(d.file("llama_v1.bin"), 20240801, 1, ok, 4);
  write_llmc(d.file("eval.bin"), 20240522, 1, ok, 2);
  write_file(d.file("odd.bin"), std::string(501, '\x01'));
  auto bad_ids = ok;
  bad_ids[42] = 50257;
  write_llmc(d.file("bad_id.bin"), 20240520, 1, bad_ids, 2);
  auto nano_ids = random_ids(2000, 50257, 9);
  nano_ids[1999] = 65535;
  write_nanogpt(d.file("bad_id_nano.bin"), nano_ids);
  write_nanogpt(d.file("nano.bin"), ok);
  write_llmc(d.file("llama.bin"), 20240801, 7, ok, 4);
  fs::create_directories(d.file("folder.bin"));

  const std::string out = d.file("out.h5");
  struct Case {
    std::vector<std::string> files;
    std::vector<std::string> needles;
    fsdp::data::TokenFileFormat format = fsdp::data::TokenFileFormat::auto_detect;
  };
  const std::vector<Case> cases = {
      {{d.file("missing.bin")}, {"missing.bin: ", "not found"}},
      {{d.file("folder.bin")}, {"folder.bin: ", "a directory"}},
      {{d.file("empty.bin")}, {"empty.bin: ", "empty token file"}},
      {{d.file("trunc_header.bin")}, {"trunc_header.bin: ", "truncated llm.c header", "700 bytes"}},
      {{d.file("three.bin")}, {"three.bin: ", "odd byte length 3"}},
      {{d.file("three.bin")}, {"three.bin: ", "truncated llm.c header"}, fsdp::data::TokenFileFormat::llmc},
      {{d.file("nano.bin")}, {"nano.bin: ", "bad magic"}, fsdp::data::TokenFileFormat::llmc},
      {{d.file("count_high.bin")}, {"count_high.bin: ", "101 tokens", "1226 bytes", "file has 1224 bytes"}},
      {{d.file("count_low.bin")}, {"count_low.bin: ", "99 tokens", "1222 bytes", "file has 1224 bytes"}},
      {{d.file("count_zero.bin")}, {"count_zero.bin: ", "0 tokens", "at least 1"}},
      {{d.file("version2.bin")}, {"version2.bin: ", "version 2 with magic 20240520", "version 1 with magic 20240520"}},
      {{d.file("llama_v1.bin")}, {"llama_v1.bin: ", "version 1 with magic 20240801", "version 7"}},
      {{d.file("eval.bin")}, {"eval.bin: ", "eval file"}},
      {{d.file("odd.bin")}, {"odd.bin: ", "odd byte length 501"}},
      {{d.file("bad_id.bin")}, {"bad_id.bin: ", "token 50257 at position 42", "byte offset 1108", "--vocab-size 50257"}},
      {{d.file("ok.bin"), d.file("bad_id_nano.bin")}, {"bad_id_nano.bin: "}},  // mixed formats, caught first
      {{d.file("bad_id_nano.bin")}, {"bad_id_nano.bin: ", "token 65535 at position 1999", "byte offset 3998"}},
      {{d.file("ok.bin"), d.file("llama.bin")}, {"llama.bin: ", "llama-3", "ok.bin", "one format"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.files.back());
    try {
      import(c.files, 50257, out, 0.1, {}, c.format);
      ADD_FAILURE() << "expected fsdp::InputError";
    } catch (const fsdp::Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      for (const auto& n : c.needles) EXPECT_NE(msg.find(n), std::string::npos) << msg << "\n  lacks: " << n;
      EXPECT_EQ(msg.rfind(d.path().string(), 0), 0u) << "the line starts with the input file: " << msg;
    }
    EXPECT_FALSE(fs::exists(out));
    EXPECT_FALSE(fs::exists(out + ".tmp"));
  }
  // The vocabulary size is required; an empty split is refused.
  expect_input_error([&] { import({d.file("ok.bin")}, 0, out); }, {"--vocab-size", "missing", "50257"});
  expect_input_error([&] { import({d.file("ok.bin")}, int64_t{1} << 31, out); }, {"--vocab-size"});
  expect_input_error([&] { import({d.file("ok.bin")}, 50257, out, 0.001); }, {"--val-fraction", "100 tokens"});
  expect_input_error([&] { import({d.file("ok.bin")}, 50257, d.file("ok.bin")); }, {"-o/--output", "is the input"});
  EXPECT_EQ(read_file(d.file("ok.bin")), good);
}

// ---------------------------------------------------------------- record and digests

// Files made before the record existed: byte files (tokenizer "bytes", vocab 256) and files
// with vocab_size only still open, and their record says what little they hold.
TEST(TokenizerRecord, OlderFiles) {
  TempDir d("old");
  write_file(d.file("in/a.txt"), std::string(1000, 'x'));
  fsdp::data::prepare_byte_dataset({d.file("in")}, d.file("bytes.h5"), 0.1);
  auto r = fsdp::data::read_tokenizer_record(d.file("bytes.h5"));
  EXPECT_EQ(r.kind, "bytes");
  EXPECT_EQ(r.vocab_size, 256);
  EXPECT_TRUE(r.model_path.empty());
  EXPECT_EQ(r.model_bytes, -1);
  EXPECT_EQ(r.bos_id, -1);
  EXPECT_FALSE(r.add_bos);
  {
    auto f = fsdp::h5::File::create(d.file("bare.h5"));
    const std::vector<uint8_t> t(64, 7);
    f.write_u8("/train/tokens", t.data(), {t.size()});
    f.write_u8("/val/tokens", t.data(), {t.size()});
    f.set_attr("/", "vocab_size", int64_t{50257});
    f.close();
  }
  r = fsdp::data::read_tokenizer_record(d.file("bare.h5"));
  EXPECT_EQ(r.kind, "unknown");
  EXPECT_EQ(r.vocab_size, 50257);
  EXPECT_EQ(fsdp::data::TokenDataset(d.file("bare.h5"), Split::train, 50304).tokenizer(), "unknown");
}

// SHA-256 against the FIPS 180-2 examples and, for every length 0..200 (the padding's edge
// cases at 55, 56, 63, 64, 119, 120), against sha256sum.
TEST(TokenizerRecord, Sha256) {
  using fsdp::data::sha256_hex;
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  TempDir d("sha");
  std::string bytes;
  for (int n = 0; n <= 200; ++n) {
    const std::string path = d.file("f" + std::to_string(n));
    write_file(path, bytes);
    FILE* p = ::popen(("sha256sum " + path).c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[65] = {};
    ASSERT_EQ(std::fread(buf, 1, 64, p), 64u);
    ::pclose(p);
    EXPECT_EQ(sha256_hex(bytes), std::string(buf)) << "length " << n;
    bytes += static_cast<char>(n * 37 + 11);
  }
}

}  // namespace
