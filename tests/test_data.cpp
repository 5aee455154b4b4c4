// tests/test_data.cpp: the HDF5 wrapper (fsdp::h5), the data layer (TokenDataset,
// synthetic tokens, DistributedSampler, validation windows, batches) and fsdp_prepare's logic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "fsdp/data/batch.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/samples.hpp"
#include "fsdp/data/span_corruption.hpp"
#include "fsdp/data/token_dataset.hpp"
#include "fsdp/data/token_source.hpp"
#include "fsdp/h5/hdf5.hpp"
#include "fsdp/model/model.hpp"  // check_config, model_defaults
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

using test_util::TempDir;

// Expects `f` to throw fsdp::Error with `exit_code` and a message containing every `parts`.
template <class F>
void expect_error(F&& f, int exit_code, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected fsdp::Error";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), exit_code) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
  }
}

}  // namespace

// ---------------------------------------------------------------- HDF5 wrapper

TEST(Hdf5, RoundTripDatasetsAndAttributes) {
  TempDir dir("h5");
  const std::string path = dir.file("a.h5");
  {
    auto f = fsdp::h5::File::create(path);
    f.create_group("/g1/g2/g3");
    const float xf[5] = {1.5f, -2.f, 3.25f, 0.f, 1e-3f};
    const int64_t xi[3] = {-1, 1ll << 40, 7};
    const uint8_t xu[4] = {0, 1, 200, 255};
    f.write_f32("/g1/f", xf, {5});
    f.write_i64("/deep/er/i", xi, {3});  // parents created on the fly
    f.write_u8("/u", xu, {4});
    const float m[6] = {1, 2, 3, 4, 5, 6};
    f.write_f32("/m", m, {2, 3});
    f.set_attr("/", "vocab_size", int64_t{50257});
    f.set_attr("/", "lr", 3e-4);
    f.set_attr("/g1/f", "tokenizer", std::string("bytes"));
    f.set_attr("/", "vocab_size", int64_t{256});  // overwrite
    f.close();
  }
  auto f = fsdp::h5::File::open_read(path);
  EXPECT_TRUE(f.exists("/g1/g2/g3"));
  EXPECT_TRUE(f.exists("/deep/er/i"));
  EXPECT_FALSE(f.exists("/nope/deeper"));
  EXPECT_FALSE(f.exists("/g1/nope"));
  EXPECT_EQ(f.dims("/m"), (std::vector<hsize_t>{2, 3}));
  EXPECT_EQ(f.type_class("/g1/f"), H5T_FLOAT);
  EXPECT_EQ(f.type_class("/u"), H5T_INTEGER);
  EXPECT_EQ(f.type_size("/u"), 1u);
  EXPECT_EQ(f.type_size("/deep/er/i"), 8u);
  EXPECT_EQ(f.read_all_f32("/g1/f"), (std::vector<float>{1.5f, -2.f, 3.25f, 0.f, 1e-3f}));
  EXPECT_EQ(f.read_all_f32("/m"), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.read_all_i64("/deep/er/i"), (std::vector<int64_t>{-1, 1ll << 40, 7}));
  int32_t u[2] = {0, 0};
  f.read_i32("/u", u, 2, 2);  // hyperslab + uint8 -> int32 conversion
  EXPECT_EQ(u[0], 200);
  EXPECT_EQ(u[1], 255);
  int64_t one = 0;
  f.read_i64("/deep/er/i", &one, 1, 1);
  EXPECT_EQ(one, 1ll << 40);
  float g = 0;
  f.read_f32("/g1/f", &g, 4, 1);
  EXPECT_FLOAT_EQ(g, 1e-3f);
  EXPECT_TRUE(f.has_attr("/", "vocab_size"));
  EXPECT_FALSE(f.has_attr("/", "nope"));
  EXPECT_FALSE(f.has_attr("/missing", "vocab_size"));
  EXPECT_EQ(f.attr_i64("/", "vocab_size"), 256);
  EXPECT_DOUBLE_EQ(f.attr_f64("/", "lr"), 3e-4);
  EXPECT_EQ(f.attr_str("/g1/f", "tokenizer"), "bytes");
  // Errors name the file and the object.
  expect_error([&] { f.read_i32("/u", u, 3, 2); }, 2, {path, "/u", "out of range"});
  expect_error([&] { f.dims("/missing"); }, 2, {path, "/missing"});
  expect_error([&] { f.attr_i64("/", "nope"); }, 2, {path, "nope"});
  expect_error([&] { f.attr_str("/", "vocab_size"); }, 2, {path, "vocab_size", "string"});
}

TEST(Hdf5, ReadsFixedLengthStringAttributes) {
  TempDir dir("h5fixed");
  const std::string path = dir.file("fixed.h5");
  {
    auto f = fsdp::h5::File::create(path);
    // Written through the C API directly, as numpy/h5py's np.bytes_ attributes are.
    fsdp::h5::Handle t(H5Tcopy(H5T_C_S1));
    ASSERT_GE(H5Tset_size(t.id(), 8), 0);
    ASSERT_GE(H5Tset_strpad(t.id(), H5T_STR_NULLPAD), 0);
    fsdp::h5::Handle s(H5Screate(H5S_SCALAR));
    fsdp::h5::Handle a(H5Acreate2(f.id(), "tokenizer", t.id(), s.id(), H5P_DEFAULT, H5P_DEFAULT));
    const char buf[8] = {'b', 'y', 't', 'e', 's', 0, 0, 0};
    ASSERT_GE(H5Awrite(a.id(), t.id(), buf), 0);
  }
  auto f = fsdp::h5::File::open_read(path);
  EXPECT_EQ(f.attr_str("/", "tokenizer"), "bytes");
}

TEST(Hdf5, OpenMissingOrBadFileIsInputError) {
  TempDir dir("h5bad");
  expect_error([&] { fsdp::h5::File::open_read(dir.file("missing.h5")); }, 2,
               {dir.file("missing.h5"), "cannot open HDF5 file"});
  std::ofstream(dir.file("text.h5")) << "not hdf5";
  expect_error([&] { fsdp::h5::File::open_read(dir.file("text.h5")); }, 2,
               {dir.file("text.h5"), "cannot open HDF5 file"});
  expect_error([&] { fsdp::h5::File::create(dir.file("no/such/dir/x.h5")); }, 1, {"no/such/dir/x.h5"});
}

// ---------------------------------------------------------------- fsdp_prepare logic

namespace {
void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}
}  // namespace

TEST(Prepare, CollectsSortedRegularFilesSkippingDatAndSymlinks) {
  TempDir dir("prep");
  const fs::path in = dir.path() / "in";  // the output goes next to it: never inside an input
  write_text(in / "b", "BBBB");
  write_text(in / "a", "AA");
  write_text(in / "a.dat", "index");
  write_text(in / "sub" / "c", "CCCCCC");
  fs::create_symlink(in / "a", in / "a.u8");
  fs::create_directory_symlink(in / "sub", in / "linkdir");
  const auto files = fsdp::data::collect_input_files({in.string()});
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], in / "a");
  EXPECT_EQ(files[1], in / "b");
  EXPECT_EQ(files[2], in / "sub" / "c");
  // A file named twice (directly and through its folder) is read once.
  EXPECT_EQ(fsdp::data::collect_input_files({(in / "b").string(), in.string()}).size(), 3u);

  // 12 bytes, val fraction 0.25 -> the last 3 bytes are validation.
  const std::string out = dir.file("out.h5");
  const auto sum = fsdp::data::prepare_byte_dataset({in.string()}, out, 0.25);
  EXPECT_EQ(sum.files, 3);
  EXPECT_EQ(sum.train_tokens, 9);
  EXPECT_EQ(sum.val_tokens, 3);
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  fsdp::data::TokenDataset train(out, fsdp::data::Split::train, 256, 8);
  fsdp::data::TokenDataset val(out, fsdp::data::Split::val);
  EXPECT_EQ(train.vocab_size(), 256);
  EXPECT_EQ(train.tokenizer(), "bytes");
  ASSERT_EQ(train.num_tokens(), 9);
  ASSERT_EQ(val.num_tokens(), 3);
  std::vector<int32_t> t(9), v(3);
  train.read(0, 9, t.data());
  val.read(0, 3, v.data());
  const std::string all = "AABBBBCCCCCC";
  for (int i = 0; i < 9; ++i) EXPECT_EQ(t[i], static_cast<int32_t>(all[i])) << i;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v[i], static_cast<int32_t>(all[9 + i])) << i;
  auto f = fsdp::h5::File::open_read(out);
  EXPECT_EQ(f.attr_i64("/", "num_files"), 3);
  EXPECT_NE(f.attr_str("/", "source").find(in.string()), std::string::npos);
  // The output may not be an input, nor lie inside an input folder (existing or not).
  expect_error([&] { fsdp::data::prepare_byte_dataset({in.string()}, (in / "o.h5").string(), 0.25); }, 2,
               {"-o/--output", (in / "o.h5").string(), "inside the input folder"});
  expect_error([&] { fsdp::data::prepare_byte_dataset({(in / "b").string()}, (in / "b").string(), 0.25); }, 2,
               {"-o/--output", "is the input"});
  EXPECT_FALSE(fs::exists(in / "o.h5"));
}

TEST(Prepare, ErrorsNameTheProblem) {
  TempDir dir("prep_err");
  const std::string in = (dir.path() / "in").string();
  write_text(dir.path() / "in" / "x.dat", "index only");
  expect_error([&] { fsdp::data::collect_input_files({dir.file("missing")}); }, 2, {dir.file("missing"), "not found"});
  expect_error([&] { fsdp::data::collect_input_files({in}); }, 2, {"no input files"});
  write_text(dir.path() / "in" / "t", "0123456789");
  expect_error([&] { fsdp::data::prepare_byte_dataset({in}, dir.file("o.h5"), 1.0); }, 2,
               {"--val-fraction"});
  expect_error([&] { fsdp::data::prepare_byte_dataset({in}, dir.file("o.h5"), 0.0); }, 2,
               {"--val-fraction"});
  // 10 bytes * 0.05 = 0.5 -> no validation bytes.
  expect_error([&] { fsdp::data::prepare_byte_dataset({in}, dir.file("o.h5"), 0.05); }, 2,
               {"--val-fraction", "empty validation"});
  expect_error([&] { fsdp::data::prepare_byte_dataset({in}, dir.file("nodir/o.h5"), 0.5); }, 2,
               {"nodir"});
  EXPECT_FALSE(fs::exists(dir.file("o.h5")));
  EXPECT_FALSE(fs::exists(dir.file("o.h5.tmp")));
  EXPECT_EQ(fsdp::data::val_token_count(2576674, 0.05), 128833);
}

// ---------------------------------------------------------------- TokenDataset

namespace {
// A token file with uint8 /train/tokens = 0..n-1 (mod 256) and the given vocab_size.
std::string make_token_file(const TempDir& dir, const std::string& name, int n, int64_t vocab, bool with_vocab = true) {
  const std::string path = dir.file(name);
  auto f = fsdp::h5::File::create(path);
  std::vector<uint8_t> t(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<std::size_t>(i)] = static_cast<uint8_t>(i % 256);
  f.write_u8("/train/tokens", t.data(), {static_cast<hsize_t>(n)});
  if (with_vocab) f.set_attr("/", "vocab_size", vocab);
  return path;
}
}  // namespace

TEST(TokenDataset, ReadsWindowsAndReportsMetadata) {
  TempDir dir("ds");
  const auto path = make_token_file(dir, "t.h5", 300, 256);
  fsdp::data::TokenDataset ds(path, fsdp::data::Split::train, 256, 16);
  EXPECT_EQ(ds.num_tokens(), 300);
  EXPECT_EQ(ds.tokenizer(), "unknown");
  EXPECT_EQ(ds.dataset(), "/train/tokens");
  EXPECT_TRUE(ds.in_memory());
  std::vector<int32_t> w(5);
  ds.read(254, 5, w.data());
  EXPECT_EQ(w, (std::vector<int32_t>{254, 255, 0, 1, 2}));
  expect_error([&] { ds.read(298, 5, w.data()); }, 1, {path, "out of range"});
  // The same reads from disk (splits above the in-memory limit), with the token check.
  fsdp::data::TokenDataset lazy(path, fsdp::data::Split::train, 256, 16, /*in_memory_limit=*/0);
  EXPECT_FALSE(lazy.in_memory());
  std::vector<int32_t> w2(5);
  lazy.read(254, 5, w2.data());
  EXPECT_EQ(w2, w);
  expect_error([&] { lazy.read(298, 5, w2.data()); }, 1, {path, "out of range"});
  const auto bad = make_token_file(dir, "bad.h5", 100, 50);
  fsdp::data::TokenDataset lazy_bad(bad, fsdp::data::Split::train, 0, 0, 0);  // not checked at open
  std::vector<int32_t> w3(50);
  EXPECT_NO_THROW(lazy_bad.read(0, 50, w3.data()));
  expect_error([&] { lazy_bad.read(45, 10, w3.data()); }, 2, {bad, "token 50 at position 50"});
  // A larger model vocabulary is accepted (padding, as nanoGPT's 50304).
  EXPECT_NO_THROW(fsdp::data::TokenDataset(path, fsdp::data::Split::train, 512, 0));
}

TEST(TokenDataset, ErrorsNameFileDatasetAndKey) {
  TempDir dir("ds_err");
  const auto path = make_token_file(dir, "t.h5", 300, 256);
  expect_error([&] { fsdp::data::TokenDataset(dir.file("missing.h5"), fsdp::data::Split::train); }, 2,
               {dir.file("missing.h5"), "cannot open"});
  expect_error([&] { fsdp::data::TokenDataset(path, fsdp::data::Split::val); }, 2, {path, "/val/tokens", "not found"});
  expect_error([&] { fsdp::data::TokenDataset(path, fsdp::data::Split::train, 128); }, 2, {"data.path", path, "model.vocab_size", "128"});
  expect_error([&] { fsdp::data::TokenDataset(path, fsdp::data::Split::train, 256, 300); }, 2, {"data.seq_len", "300", "/train/tokens"});
  const auto novocab = make_token_file(dir, "nv.h5", 10, 0, false);
  expect_error([&] { fsdp::data::TokenDataset(novocab, fsdp::data::Split::train); }, 2, {novocab, "vocab_size"});
  // Tokens 0..99 with vocab 50: token 50 at position 50 is out of range.
  const auto bad = make_token_file(dir, "bad.h5", 100, 50);
  expect_error([&] { fsdp::data::TokenDataset(bad, fsdp::data::Split::train); }, 2, {bad, "token 50 at position 50"});
  // A float dataset is not a token dataset.
  {
    auto f = fsdp::h5::File::create(dir.file("f.h5"));
    const float x[3] = {1, 2, 3};
    f.write_f32("/train/tokens", x, {3});
    f.set_attr("/", "vocab_size", int64_t{4});
  }
  expect_error([&] { fsdp::data::TokenDataset(dir.file("f.h5"), fsdp::data::Split::train); }, 2,
               {"f.h5", "/train/tokens", "tokens are not 8-, 16-, 32- or 64-bit integers"});
}

// int64 tokens (what h5py writes for a NumPy array of Python ints) are read; a value beyond
// int32 arrives clipped and is still refused, named as clipped.
TEST(TokenDataset, ReadsInt64TokensAndRefusesClippedOnes) {
  TempDir dir("ds64");
  auto write = [&](const std::string& name, std::vector<int64_t> t, int64_t in_memory_limit) {
    const std::string path = dir.file(name);
    {
      auto f = fsdp::h5::File::create(path);
      f.write_i64("/train/tokens", t.data(), {static_cast<hsize_t>(t.size())});
      f.set_attr("/", "vocab_size", int64_t{50257});
    }
    return fsdp::data::TokenDataset(path, fsdp::data::Split::train, 50304, 3, in_memory_limit);
  };
  for (int64_t limit : {fsdp::data::TokenDataset::kInMemoryLimit, int64_t{0}}) {
    const auto ds = write("ok.h5", {50256, 0, 40000, 7}, limit);
    EXPECT_EQ(ds.in_memory(), limit > 0);
    std::vector<int32_t> w(4);
    ds.read(0, 4, w.data());
    EXPECT_EQ(w, (std::vector<int32_t>{50256, 0, 40000, 7}));
    const int64_t huge = int64_t{1} << 40;
    const std::string big = dir.file("big.h5");
    auto read_big = [&] { write("big.h5", {1, 2, huge, 3}, limit).read(0, 4, w.data()); };
    expect_error(read_big, 2, {big, "/train/tokens", "token 2147483647 or more at position 2",
                               "vocab_size = 50257"});
    const std::string neg = dir.file("neg.h5");
    auto read_neg = [&] { write("neg.h5", {1, -huge, 2, 3}, limit).read(0, 4, w.data()); };
    expect_error(read_neg, 2, {neg, "token -2147483648 or less at position 1"});
  }
}

TEST(TokenDataset, ReadsUint16Tokens) {
  // GPT-2 BPE files store uint16 (as nanoGPT's train.bin); written here with the raw C API.
  TempDir dir("ds16");
  const std::string path = dir.file("u16.h5");
  {
    auto f = fsdp::h5::File::create(path);
    f.create_group("/train");
    const uint16_t t[4] = {50256, 0, 40000, 7};
    const hsize_t n = 4;
    fsdp::h5::Handle space(H5Screate_simple(1, &n, nullptr));
    fsdp::h5::Handle d(H5Dcreate2(f.id(), "/train/tokens", H5T_STD_U16LE, space.id(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
    ASSERT_GE(H5Dwrite(d.id(), H5T_NATIVE_UINT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, t), 0);
    f.set_attr("/", "vocab_size", int64_t{50257});
    f.set_attr("/", "tokenizer", std::string("gpt2"));
  }
  fsdp::data::TokenDataset ds(path, fsdp::data::Split::train, 50304, 3);
  EXPECT_EQ(ds.tokenizer(), "gpt2");
  std::vector<int32_t> w(4);
  ds.read(0, 4, w.data());
  EXPECT_EQ(w, (std::vector<int32_t>{50256, 0, 40000, 7}));
}

TEST(SyntheticTokens, DeterministicInRangeAndWindowConsistent) {
  fsdp::data::SyntheticTokens s(1000, 50257, 7);
  std::vector<int32_t> a(100), b(10);
  s.read(0, 100, a.data());
  s.read(45, 10, b.data());
  for (int i = 0; i < 10; ++i) EXPECT_EQ(b[i], a[45 + i]);
  for (int32_t t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 50257);
  }
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 90u);  // random, not constant
  fsdp::data::SyntheticTokens other(1000, 50257, 8);
  std::vector<int32_t> c(100);
  other.read(0, 100, c.data());
  EXPECT_NE(a, c);
  expect_error([&] { s.read(995, 10, b.data()); }, 1, {"out of range"});
}

// ---------------------------------------------------------------- sampler

TEST(Sampler, RanksPartitionTheWorldSizeIndependentGlobalBatch) {
  const int64_t n = 103, G = 8;
  fsdp::data::DistributedSampler one(n, G, 0, 1, 42);
  EXPECT_EQ(one.steps_per_epoch(), 12);
  for (int64_t step : {0, 1, 11, 12, 13, 40}) {
    const auto global = one.global_indices(step);
    EXPECT_EQ(one.sample_indices(step), global);
    for (int D : {1, 2, 4}) {
      std::vector<int64_t> uni;
      std::set<int64_t> seen;
      for (int r = 0; r < D; ++r) {
        fsdp::data::DistributedSampler s(n, G, r, D, 42);
        const auto mine = s.sample_indices(step);
        ASSERT_EQ(static_cast<int64_t>(mine.size()), G / D);
        for (int64_t i : mine) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " on two ranks";
        uni.insert(uni.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(uni, global) << "D=" << D << " step=" << step;
    }
  }
}

TEST(Sampler, EpochsArePermutationsAndDiffer) {
  const int64_t n = 50, G = 5;
  fsdp::data::DistributedSampler s(n, G, 0, 1, 3);
  EXPECT_EQ(s.epoch_of(9), 0);
  EXPECT_EQ(s.epoch_of(10), 1);
  EXPECT_EQ(s.position_in_epoch(23), 3);
  std::vector<int64_t> e0, e1;
  for (int64_t step = 0; step < 10; ++step) {
    auto b = s.sample_indices(step);
    e0.insert(e0.end(), b.begin(), b.end());
  }
  for (int64_t step = 10; step < 20; ++step) {
    auto b = s.sample_indices(step);
    e1.insert(e1.end(), b.begin(), b.end());
  }
  EXPECT_EQ(e0, s.epoch_permutation(0));
  std::vector<int64_t> ident(n);
  std::iota(ident.begin(), ident.end(), int64_t{0});
  auto s0 = e0, s1 = e1;
  std::sort(s0.begin(), s0.end());
  std::sort(s1.begin(), s1.end());
  EXPECT_EQ(s0, ident);  // each epoch visits every sample once
  EXPECT_EQ(s1, ident);
  EXPECT_NE(e0, e1);
  EXPECT_NE(e0, ident);
  // Another seed, another order; same seed, same order (resume needs only the step).
  EXPECT_NE(fsdp::data::DistributedSampler(n, G, 0, 1, 4).epoch_permutation(0), e0);
  EXPECT_EQ(fsdp::data::DistributedSampler(n, G, 0, 1, 3).sample_indices(13), s.sample_indices(13));
  // drop_last: 52 samples with G = 5 still gives 10 steps.
  EXPECT_EQ(fsdp::data::DistributedSampler(52, G, 0, 1, 3).steps_per_epoch(), 10);
}

// The epoch order is computed per position without a table: a bijection at every size
// (powers of 4 and their neighbours, where the Feistel domain changes), uniform over the
// epochs (chi-square of the value at three positions over 4000 epochs of 64 samples,
// 63 degrees of freedom: limit 130, p < 1e-6 for a uniform order), without structure
// (consecutive positions hold consecutive samples ~1/64 of the time; a long order's mean
// displacement is n/3 as for a random permutation), and a sampler of 2^40 samples (a table
// would be 8 TiB) gives its batches at once.
TEST(Sampler, EpochOrderIsATableFreeUniformPermutation) {
  for (int64_t n : {1, 2, 3, 4, 5, 15, 16, 17, 63, 64, 65, 1000, 4096, 4097}) {
    const fsdp::data::DistributedSampler s(n, 1, 0, 1, 7);
    for (int64_t epoch : {0, 1, 9}) {
      auto p = s.epoch_permutation(epoch);
      std::sort(p.begin(), p.end());
      std::vector<int64_t> ident(static_cast<std::size_t>(n));
      std::iota(ident.begin(), ident.end(), int64_t{0});
      EXPECT_EQ(p, ident) << "n " << n << " epoch " << epoch;
    }
  }
  const int64_t n = 64, epochs = 4000;
  const fsdp::data::DistributedSampler s(n, 8, 0, 1, 5);
  std::vector<std::vector<double>> counts(3, std::vector<double>(n, 0));
  int64_t consecutive = 0;
  for (int64_t e = 0; e < epochs; ++e) {
    const auto p = s.epoch_permutation(e);
    counts[0][static_cast<std::size_t>(p[0])] += 1;
    counts[1][static_cast<std::size_t>(p[31])] += 1;
    counts[2][static_cast<std::size_t>(p[63])] += 1;
    for (int64_t i = 0; i + 1 < n; ++i) consecutive += p[i + 1] == p[i] + 1;
  }
  const double expected = static_cast<double>(epochs) / n;
  for (const auto& c : counts) {
    double chi2 = 0;
    for (double x : c) chi2 += (x - expected) * (x - expected) / expected;
    EXPECT_LT(chi2, 130.0);
  }
  const double frac = static_cast<double>(consecutive) / static_cast<double>(epochs * (n - 1));
  EXPECT_NEAR(frac, 1.0 / n, 0.5 / n);
  const int64_t big = 100000;
  const auto p = fsdp::data::DistributedSampler(big, 8, 0, 1, 5).epoch_permutation(3);
  double displacement = 0;
  for (int64_t i = 0; i < big; ++i) displacement += static_cast<double>(std::abs(p[i] - i));
  EXPECT_NEAR(displacement / static_cast<double>(big), big / 3.0, 0.02 * big / 3.0);
  const int64_t huge = int64_t{1} << 40;
  const fsdp::data::DistributedSampler h(huge, 512, 1, 2, 5);
  for (int64_t step : {int64_t{0}, int64_t{123456789}}) {
    auto b = h.sample_indices(step);
    ASSERT_EQ(b.size(), 256u);
    for (int64_t i : b) EXPECT_TRUE(i >= 0 && i < huge) << i;
    std::sort(b.begin(), b.end());
    EXPECT_EQ(std::adjacent_find(b.begin(), b.end()), b.end()) << "a sample twice in a batch";
  }
}

TEST(Sampler, RejectsBadBatchSizes) {
  expect_error([] { fsdp::data::DistributedSampler(100, 6, 0, 4, 1); }, 2, {"train.global_batch_size", "6", "4"});
  expect_error([] { fsdp::data::DistributedSampler(5, 8, 0, 1, 1); }, 2, {"train.global_batch_size", "data.seq_len"});
  expect_error([] { fsdp::data::DistributedSampler(100, 0, 0, 1, 1); }, 2, {"train.global_batch_size"});
  EXPECT_EQ(fsdp::data::num_samples_of(1025, 128), 8);
  EXPECT_EQ(fsdp::data::num_samples_of(1024, 128), 7);
}

// A data mixture (data.paths): Megatron's blending rule, checked against a direct
// transcription of it; every part's draws within one of weight x positions at every step;
// each part runs through its own permuted epochs; the global batch independent of the world
// size; a query of an earlier step (a resumed run) gives what the first pass gave.
TEST(Sampler, MixtureDrawsEachPartByWeightThroughItsOwnEpochs) {
  const std::vector<int64_t> parts = {7, 40, 3};
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  const std::vector<int64_t> offsets = {0, 7, 47};
  const int64_t G = 4;
  fsdp::data::DistributedSampler s(parts, weights, G, 0, 1, 11);
  EXPECT_EQ(s.num_samples(), 50);
  EXPECT_EQ(s.steps_per_epoch(), 12);
  // The rule, written out: position j goes to argmax_d w_d (j + 1) - c_d, lowest d on ties.
  std::vector<int64_t> c(3, 0);
  std::vector<std::vector<int64_t>> seen(3);  // each part's local samples, in draw order
  for (int64_t step = 0; step < 80; ++step) {
    const auto batch = s.global_indices(step);
    ASSERT_EQ(static_cast<int64_t>(batch.size()), G);
    for (int64_t k = 0; k < G; ++k) {
      const int64_t j = step * G + k;
      int best = 0;
      for (int d = 1; d < 3; ++d) {
        if (weights[d] * (j + 1) - c[d] > weights[best] * (j + 1) - c[best]) best = d;
      }
      ++c[best];
      const int64_t i = batch[static_cast<std::size_t>(k)];
      ASSERT_GE(i, offsets[best]) << "position " << j;
      ASSERT_LT(i, offsets[best] + parts[best]) << "position " << j;
      seen[best].push_back(i - offsets[best]);
    }
    for (int d = 0; d < 3; ++d) {
      EXPECT_LE(std::abs(static_cast<double>(c[d]) - weights[d] * (step + 1) * G), 1.0)
          << "part " << d << " after step " << step;
    }
  }
  EXPECT_EQ(s.part_draws(320), c);
  // Each part's draws: whole epochs are permutations of its samples, and epochs differ.
  for (int d = 0; d < 3; ++d) {
    const int64_t n = parts[d];
    std::vector<int64_t> ident(static_cast<std::size_t>(n));
    std::iota(ident.begin(), ident.end(), int64_t{0});
    ASSERT_GE(static_cast<int64_t>(seen[d].size()), 2 * n) << "part " << d;
    std::vector<int64_t> e0(seen[d].begin(), seen[d].begin() + n),
        e1(seen[d].begin() + n, seen[d].begin() + 2 * n);
    if (n > 3) EXPECT_NE(e0, e1) << "part " << d;
    std::sort(e0.begin(), e0.end());
    std::sort(e1.begin(), e1.end());
    EXPECT_EQ(e0, ident) << "part " << d;
    EXPECT_EQ(e1, ident) << "part " << d;
  }
  // World-size independent, and an earlier step (a resumed run replays) gives the same batch.
  fsdp::data::DistributedSampler fresh(parts, weights, G, 0, 1, 11);
  for (int64_t step : {37, 3, 59, 0}) {
    const auto global = fresh.global_indices(step);
    EXPECT_EQ(s.global_indices(step), global) << "step " << step;
    std::vector<int64_t> uni;
    for (int r = 0; r < 2; ++r) {
      const auto mine =
          fsdp::data::DistributedSampler(parts, weights, G, r, 2, 11).sample_indices(step);
      uni.insert(uni.end(), mine.begin(), mine.end());
    }
    EXPECT_EQ(uni, global) << "step " << step;
  }
  // A step asked twice (global, then this rank's) is the same batch, without a replay.
  EXPECT_EQ(fresh.sample_indices(59), fresh.global_indices(59));
  EXPECT_EQ(fresh.global_indices(60), s.global_indices(60));
  // No weights: the parts' sizes. Another seed, another order within the parts.
  fsdp::data::DistributedSampler natural(parts, {}, G, 0, 1, 11);
  EXPECT_EQ(natural.part_draws(50), parts);
  EXPECT_NE(fsdp::data::DistributedSampler(parts, weights, G, 0, 1, 12).global_indices(0),
            s.global_indices(0));
  // Weights of any scale; a part smaller than the batch is fine (it repeats).
  EXPECT_EQ(fsdp::data::DistributedSampler(parts, {5, 3, 2}, G, 0, 1, 11).global_indices(9),
            s.global_indices(9));
  expect_error([&] { fsdp::data::DistributedSampler(parts, weights, 6, 0, 4, 1); }, 2,
               {"train.global_batch_size"});
  expect_error([&] { fsdp::data::DistributedSampler({3, 0}, {}, 2, 0, 1, 1); }, 1, {"part 1"});
}

// ---------------------------------------------------------------- batches and validation

TEST(Batch, ShiftedWindowsOfSamples) {
  TempDir dir("batch");
  const auto path = make_token_file(dir, "t.h5", 100, 256);
  fsdp::data::TokenDataset ds(path, fsdp::data::Split::train);
  const auto b = fsdp::data::load_batch(ds, {3, 0}, 8);
  EXPECT_EQ(b.B, 2);
  EXPECT_EQ(b.L, 8);
  ASSERT_EQ(b.inputs.size(), 16u);
  for (int t = 0; t < 8; ++t) {
    EXPECT_EQ(b.inputs[t], 24 + t);
    EXPECT_EQ(b.targets[t], 25 + t);
    EXPECT_EQ(b.inputs[8 + t], t);
    EXPECT_EQ(b.targets[8 + t], t + 1);
  }
  // 100 tokens, L = 8: samples 0..11 (the last one ends at token 96 inclusive).
  EXPECT_NO_THROW(fsdp::data::load_batch(ds, {11}, 8));
  expect_error([&] { fsdp::data::load_batch(ds, {12}, 8); }, 1, {"sample 12"});
}

// Document masking's positions (batch.hpp Batch::position_ids): 0 at a row's start and after
// each EOS (which belongs to the document it ends), else the previous + 1.
TEST(Batch, DocumentPositionsRestartAfterEachEos) {
  constexpr int32_t E = 2;  // the EOS id
  fsdp::data::Batch b;
  b.B = 4;
  b.L = 6;
  b.target_len = 6;
  b.inputs = {E, 5, 6, E, 7, 8,   // EOS at the row's start: a document of one token, then two
              5, 6, 7, 8, 9, E,   // EOS at the row's end: one document
              5, E, E, E, 6, 7,   // consecutive EOS: one-token documents
              9, 9, 9, 9, 9, 9};  // no EOS
  b.targets.assign(24, 1);
  fsdp::data::set_document_positions(b, E);
  EXPECT_EQ(b.position_ids, (std::vector<int32_t>{0, 0, 1, 2, 0, 1,  //
                                                  0, 1, 2, 3, 4, 5,  //
                                                  0, 1, 0, 0, 0, 1,  //
                                                  0, 1, 2, 3, 4, 5}));
  // The mask it stands for: key j visible to query t of its row iff j <= t and no EOS lies
  // in inputs [j, t), i.e. pos[t] - pos[j] == t - j.
  for (int64_t r = 0; r < b.B; ++r) {
    for (int64_t t = 0; t < b.L; ++t) {
      for (int64_t j = 0; j <= t; ++j) {
        bool eos_between = false;
        for (int64_t k = j; k < t; ++k) eos_between |= b.inputs[r * b.L + k] == E;
        EXPECT_EQ(!eos_between, b.position_ids[r * b.L + t] - b.position_ids[r * b.L + j] == t - j)
            << "row " << r << " query " << t << " key " << j;
      }
    }
  }
  // Another EOS id, the same tokens: only 9 ends documents now.
  fsdp::data::set_document_positions(b, 9);
  EXPECT_EQ(std::vector<int32_t>(b.position_ids.begin() + 18, b.position_ids.end()),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(b.position_ids.begin(), b.position_ids.begin() + 6),
            (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  fsdp::data::Batch empty;
  fsdp::data::set_document_positions(empty, E);
  EXPECT_TRUE(empty.position_ids.empty());
  expect_error([&] { fsdp::data::set_document_positions(b, -1); }, 1, {"EOS id -1"});
  b.inputs.pop_back();
  expect_error([&] { fsdp::data::set_document_positions(b, E); }, 1,
               {"23 inputs for a batch of 4 x 6"});
}

TEST(Batch, RowsSliceDocumentPositions) {
  fsdp::data::SyntheticTokens s(4 * 10 + 1, 5, 7);  // 5 ids: EOS 0 comes often
  auto b = fsdp::data::load_batch(s, {0, 1, 2, 3}, 10);
  EXPECT_TRUE(b.rows(1, 2).position_ids.empty());  // causal: none to slice
  fsdp::data::set_document_positions(b, 0);
  const auto mid = b.rows(1, 2);
  EXPECT_EQ(mid.position_ids,
            std::vector<int32_t>(b.position_ids.begin() + 10, b.position_ids.begin() + 30));
  EXPECT_EQ(mid.inputs, std::vector<int32_t>(b.inputs.begin() + 10, b.inputs.begin() + 30));
  // A slice's positions are those its own rows give.
  auto again = mid;
  fsdp::data::set_document_positions(again, 0);
  EXPECT_EQ(again.position_ids, mid.position_ids);
  EXPECT_TRUE(b.rows(2, 0).position_ids.empty());
  EXPECT_EQ(b.rows(0, 4).position_ids, b.position_ids);
}

TEST(Validation, WindowRangesCoverEveryWindowOnce) {
  EXPECT_EQ(fsdp::data::num_val_windows(1001, 10, 0), 100);
  EXPECT_EQ(fsdp::data::num_val_windows(1000, 10, 0), 99);
  EXPECT_EQ(fsdp::data::num_val_windows(1001, 10, 7), 7);
  EXPECT_EQ(fsdp::data::num_val_windows(1001, 10, 500), 100);
  EXPECT_EQ(fsdp::data::num_val_windows(5, 10, 0), 0);
  expect_error([] { fsdp::data::num_val_windows(100, 10, -1); }, 2, {"eval.max_windows"});
  for (int64_t n : {0, 1, 3, 7, 100}) {
    for (int D : {1, 2, 3, 4, 8}) {
      std::vector<int> hits(static_cast<std::size_t>(n), 0);
      int64_t prev_end = 0;
      for (int r = 0; r < D; ++r) {
        const auto w = fsdp::data::rank_windows(n, r, D);
        EXPECT_EQ(w.begin, prev_end);  // contiguous, in rank order
        EXPECT_LE(w.size(), n / D + 1);
        EXPECT_GE(w.size(), n / D);
        for (int64_t i = w.begin; i < w.end; ++i) ++hits[static_cast<std::size_t>(i)];
        prev_end = w.end;
      }
      EXPECT_EQ(prev_end, n);
      for (int h : hits) EXPECT_EQ(h, 1);
    }
  }
  fsdp::data::SyntheticTokens s(101, 1000, 1);
  const auto b = fsdp::data::load_batch(s, fsdp::data::WindowRange{2, 5}.indices(), 10);
  EXPECT_EQ(b.B, 3);
  std::vector<int32_t> raw(31);
  s.read(20, 31, raw.data());
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(b.inputs[static_cast<std::size_t>(i)], raw[static_cast<std::size_t>(i)]);
    EXPECT_EQ(b.targets[static_cast<std::size_t>(i)], raw[static_cast<std::size_t>(i + 1)]);
  }
}

// ---------------------------------------------------------------- SampleSource (open_samples)

namespace {

fsdp::Config data_config(fsdp::Objective objective, const std::string& path) {
  fsdp::Config c;
  c.data.objective = objective;
  c.data.source = path.empty() ? fsdp::DataSource::synthetic : fsdp::DataSource::hdf5;
  c.data.path = path;
  return c;
}

// Row r of a batch's inputs / targets.
std::vector<int32_t> in_row(const fsdp::data::Batch& b, int64_t r) {
  return {b.inputs.begin() + r * b.L, b.inputs.begin() + (r + 1) * b.L};
}
std::vector<int32_t> tgt_row(const fsdp::data::Batch& b, int64_t r) {
  return {b.targets.begin() + r * b.target_len, b.targets.begin() + (r + 1) * b.target_len};
}

// ByT5 ids of a string: byte b -> b + 3.
std::vector<int32_t> ids(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char ch : s) v.push_back(static_cast<int32_t>(ch) + 3);
  return v;
}
std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST(Samples, CausalLmEqualsLoadBatch) {
  TempDir dir("causal");
  write_text(dir.path() / "t.txt", std::string(2000, 'a') + "the quick brown fox");
  fsdp::data::prepare_byte_dataset({dir.file("t.txt")}, dir.file("t.h5"), 0.25);
  auto c = data_config(fsdp::Objective::causal_lm, dir.file("t.h5"));
  c.data.seq_len = 16;
  c.eval.max_windows = 5;
  EXPECT_EQ(fsdp::data::batch_shape(c).L, 16);
  EXPECT_EQ(fsdp::data::batch_shape(c).target_len, 16);
  const auto train = fsdp::data::open_samples(c, fsdp::data::Split::train, 256);
  const fsdp::data::TokenDataset ds(dir.file("t.h5"), fsdp::data::Split::train);
  EXPECT_EQ(train->num_samples(), (ds.num_tokens() - 1) / 16);
  EXPECT_EQ(train->num_tokens(), ds.num_tokens());
  EXPECT_EQ(train->num_truncated(), 0);
  const std::vector<int64_t> idx = {7, 0, train->num_samples() - 1};
  const auto a = train->load(idx), b = fsdp::data::load_batch(ds, idx, 16);
  EXPECT_EQ(a.B, 3);
  EXPECT_EQ(a.target_len, 16);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.targets, b.targets);
  expect_error([&] { train->load({train->num_samples()}); }, 1, {"sample"});
  // Validation: windows capped by eval.max_windows.
  const auto val = fsdp::data::open_samples(c, fsdp::data::Split::val, 256);
  const fsdp::data::TokenDataset vds(dir.file("t.h5"), fsdp::data::Split::val);
  EXPECT_EQ(val->num_samples(), fsdp::data::num_val_windows(vds.num_tokens(), 16, 5));
  EXPECT_EQ(val->num_samples(), 5);
  EXPECT_EQ(val->load({4}).inputs, fsdp::data::load_batch(vds, {4}, 16).inputs);
  // Synthetic: the trainer's streams (1024 global batches; val 64 windows, seed + 1).
  auto s = data_config(fsdp::Objective::causal_lm, "");
  s.data.seq_len = 8;
  s.train.global_batch_size = 4;
  s.train.seed = 99;
  const auto st = fsdp::data::open_samples(s, fsdp::data::Split::train, 1000);
  const fsdp::data::SyntheticTokens ref(1024 * 4 * 8 + 1, 1000, 99);
  EXPECT_EQ(st->num_samples(), 1024 * 4);
  EXPECT_EQ(st->load({4095, 3}).targets, fsdp::data::load_batch(ref, {4095, 3}, 8).targets);
  const auto sv = fsdp::data::open_samples(s, fsdp::data::Split::val, 1000);
  const fsdp::data::SyntheticTokens vref(64 * 8 + 1, 1000, 100);
  EXPECT_EQ(sv->num_samples(), 64);
  EXPECT_EQ(sv->load({63}).inputs, fsdp::data::load_batch(vref, {63}, 8).inputs);
}

// data.paths: each file's samples one after the other, its rows what it loads alone; each
// file's val split capped on its own; a file's error names data.paths[d].
TEST(Samples, MixtureConcatenatesTheFilesSamples) {
  TempDir dir("mixture");
  write_text(dir.path() / "a.txt", std::string(700, 'a') + "the quick brown fox");
  write_text(dir.path() / "b.txt", std::string(1500, 'b') + "jumps over the lazy dog");
  fsdp::data::prepare_byte_dataset({dir.file("a.txt")}, dir.file("a.h5"), 0.25);
  fsdp::data::prepare_byte_dataset({dir.file("b.txt")}, dir.file("b.h5"), 0.25);
  auto c = data_config(fsdp::Objective::causal_lm, "");
  c.data.source = fsdp::DataSource::hdf5;
  c.data.paths = {dir.file("a.h5"), dir.file("b.h5")};
  c.data.seq_len = 16;
  c.eval.max_windows = 3;
  auto one = [&](const std::string& path, fsdp::data::Split split) {
    auto o = c;
    o.data.paths.clear();
    o.data.path = path;
    return fsdp::data::open_samples(o, split, 256);
  };
  const auto a = one(dir.file("a.h5"), fsdp::data::Split::train);
  const auto b = one(dir.file("b.h5"), fsdp::data::Split::train);
  const auto mix = fsdp::data::open_samples(c, fsdp::data::Split::train, 256);
  const int64_t na = a->num_samples(), nb = b->num_samples();
  EXPECT_EQ(mix->part_samples(), (std::vector<int64_t>{na, nb}));
  EXPECT_EQ(mix->num_samples(), na + nb);
  EXPECT_EQ(mix->num_tokens(), a->num_tokens() + b->num_tokens());
  EXPECT_EQ(mix->fixed_targets_per_sample(), 16);
  const auto rows = mix->load({na + 2, 1, na + nb - 1, 0, na});
  const auto ra = a->load({1, 0}), rb = b->load({2, nb - 1, 0});
  EXPECT_EQ(in_row(rows, 0), in_row(rb, 0));
  EXPECT_EQ(in_row(rows, 1), in_row(ra, 0));
  EXPECT_EQ(in_row(rows, 2), in_row(rb, 1));
  EXPECT_EQ(in_row(rows, 3), in_row(ra, 1));
  EXPECT_EQ(in_row(rows, 4), in_row(rb, 2));
  EXPECT_EQ(tgt_row(rows, 1), tgt_row(ra, 0));
  expect_error([&] { mix->load({na + nb}); }, 1, {"sample"});
  const auto val = fsdp::data::open_samples(c, fsdp::data::Split::val, 256);
  EXPECT_EQ(val->num_samples(), one(dir.file("a.h5"), fsdp::data::Split::val)->num_samples() +
                                    one(dir.file("b.h5"), fsdp::data::Split::val)->num_samples());
  EXPECT_EQ(val->num_samples(), 6);  // eval.max_windows = 3 per file
  // Errors name the file's place in data.paths.
  c.data.paths = {dir.file("a.h5"), dir.file("missing.h5")};
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 256); }, 2,
               {"data.paths[1]", "missing.h5"});
  c.data.paths = {dir.file("b.h5"), dir.file("a.h5")};
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 50); }, 2,
               {"data.paths[0]: ", "b.h5", "vocab"});
  c.data.seq_len = 1000;  // a.h5 holds fewer tokens: TokenDataset's own check
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 256); }, 2,
               {"data.paths[1]: data.seq_len: 1000", "a.h5"});
  c.data.objective = fsdp::Objective::span_corruption;  // tokens / L samples: none in a.h5
  c.data.seq_len = 600;
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 1000); }, 2,
               {"data.paths[1]: data.seq_len: 600", "a.h5"});
}

namespace {

// A token stream of n_docs documents as fsdp_prepare --tokenizer writes them: <s> = 0, ids in
// [3, 63), </s> = 1 after each; lengths cycle from `seed`.
std::vector<uint8_t> document_stream(int n_docs, int seed) {
  std::vector<uint8_t> s;
  const int lengths[] = {1, 5, 12, 3, 20, 2, 7, 30, 4};
  for (int d = 0; d < n_docs; ++d) {
    s.push_back(0);
    const int n = lengths[(d + seed) % 9];
    for (int k = 0; k < n; ++k) s.push_back(static_cast<uint8_t>(3 + (d * 7 + k * 3 + seed) % 60));
    s.push_back(1);
  }
  return s;
}

// A token file of such streams (train 60 documents, val 20) with vocab_size 64, tokenizer
// "sentencepiece" and the root attributes `attrs` (bos_id, eos_id, add_bos, add_eos: the
// record fsdp_prepare writes, docs/data.md "File schema").
std::string make_document_file(const TempDir& dir, const std::string& name,
                               const std::vector<std::pair<std::string, int64_t>>& attrs,
                               int seed = 0) {
  const std::string path = dir.file(name);
  auto f = fsdp::h5::File::create(path);
  const auto train = document_stream(60, seed), val = document_stream(20, seed + 1);
  f.write_u8("/train/tokens", train.data(), {static_cast<hsize_t>(train.size())});
  f.write_u8("/val/tokens", val.data(), {static_cast<hsize_t>(val.size())});
  f.set_attr("/", "vocab_size", int64_t{64});
  f.set_attr("/", "tokenizer", std::string("sentencepiece"));
  for (const auto& [k, v] : attrs) f.set_attr("/", k, v);
  return path;
}
const std::vector<std::pair<std::string, int64_t>> kLlamaRecord = {
    {"bos_id", 0}, {"eos_id", 1}, {"add_bos", 1}, {"add_eos", 1}};

// Row positions of the windows `indices` of a split (stream windows [i*L, i*L + L)), computed
// from the whole stream: a token's position in its document, capped by its place in the row.
std::vector<int32_t> window_positions(const fsdp::data::TokenSource& src,
                                      const std::vector<int64_t>& indices, int64_t L, int32_t eos) {
  std::vector<int32_t> stream(static_cast<std::size_t>(src.num_tokens()));
  src.read(0, src.num_tokens(), stream.data());
  std::vector<int64_t> in_doc(stream.size());
  for (std::size_t p = 0; p < stream.size(); ++p)
    in_doc[p] = (p == 0 || stream[p - 1] == eos) ? 0 : in_doc[p - 1] + 1;
  std::vector<int32_t> out;
  for (int64_t i : indices) {
    for (int64_t t = 0; t < L; ++t)
      out.push_back(static_cast<int32_t>(std::min(t, in_doc[static_cast<std::size_t>(i * L + t)])));
  }
  return out;
}

std::vector<int64_t> all_indices(int64_t n) {
  std::vector<int64_t> idx(static_cast<std::size_t>(n));
  std::iota(idx.begin(), idx.end(), int64_t{0});
  return idx;
}

}  // namespace

// data.attn_mask_type = "block_causal": every causal_lm batch (train and val, one file, a
// mixture, synthetic) carries the position_ids of its documents, with the EOS id of the file's
// eos_id attribute or data.eos_token_id; causal batches carry none, and the tokens are the same.
TEST(Samples, BlockCausalPositionsFromTheFilesEosId) {
  TempDir dir("block_causal");
  const auto path = make_document_file(dir, "d.h5", kLlamaRecord);
  auto causal = data_config(fsdp::Objective::causal_lm, path);
  causal.data.seq_len = 16;
  auto c = causal;
  c.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  for (const auto split : {fsdp::data::Split::train, fsdp::data::Split::val}) {
    SCOPED_TRACE(split == fsdp::data::Split::train ? "train" : "val");
    const auto src = fsdp::data::open_samples(c, split, 64);
    const auto plain = fsdp::data::open_samples(causal, split, 64);
    const fsdp::data::TokenDataset ds(path, split);
    auto idx = all_indices(src->num_samples());
    std::reverse(idx.begin(), idx.end());
    const auto b = src->load(idx), p = plain->load(idx);
    EXPECT_EQ(b.inputs, p.inputs);
    EXPECT_EQ(b.targets, p.targets);
    EXPECT_TRUE(p.position_ids.empty());
    EXPECT_FALSE(b.reset_position_ids);  // data.reset_position_ids = false
    EXPECT_TRUE(src->shape().block_causal);
    EXPECT_FALSE(src->shape().reset_position_ids);
    EXPECT_FALSE(plain->shape().block_causal);
    ASSERT_EQ(b.position_ids.size(), b.inputs.size());
    EXPECT_EQ(b.position_ids, window_positions(ds, idx, 16, 1));
    int64_t starts = 0;  // documents that start inside a row
    for (std::size_t k = 0; k < b.position_ids.size(); ++k)
      starts += k % 16 != 0 && b.position_ids[k] == 0;
    EXPECT_GT(starts, 5);
    // Gradient accumulation's micro-batches keep them.
    EXPECT_EQ(b.rows(1, 2).position_ids,
              std::vector<int32_t>(b.position_ids.begin() + 16, b.position_ids.begin() + 48));
  }
  EXPECT_TRUE(fsdp::data::batch_shape(c).block_causal);
  EXPECT_FALSE(fsdp::data::batch_shape(causal).block_causal);
  // data.reset_position_ids rides on every batch (the model's RoPE reads position_ids), its
  // micro-batches and the plan's shape.
  c.data.reset_position_ids = true;
  {
    const auto src = fsdp::data::open_samples(c, fsdp::data::Split::train, 64);
    const auto b = src->load({4, 2, 0});
    EXPECT_TRUE(b.reset_position_ids);
    EXPECT_TRUE(b.rows(1, 1).reset_position_ids);
    EXPECT_TRUE(src->shape().reset_position_ids);
    EXPECT_TRUE(fsdp::data::batch_shape(c).reset_position_ids);
  }
  c.data.reset_position_ids = false;
  // data.eos_token_id wins over the attribute (here the BOS, 0, ends the "documents").
  c.data.eos_token_id = 0;
  {
    const auto src = fsdp::data::open_samples(c, fsdp::data::Split::train, 64);
    const fsdp::data::TokenDataset ds(path, fsdp::data::Split::train);
    const std::vector<int64_t> idx = {3, 0, 7};
    EXPECT_EQ(src->load(idx).position_ids, window_positions(ds, idx, 16, 0));
  }
  c.data.eos_token_id = -1;
  // One token before each document for both BOS and EOS (GPT-2's <|endoftext|>, add_eos = 0):
  // it separates the documents, so it is taken.
  const auto gpt2 = make_document_file(
      dir, "gpt2.h5", {{"bos_id", 0}, {"eos_id", 0}, {"add_bos", 1}, {"add_eos", 0}});
  c.data.path = gpt2;
  {
    const auto src = fsdp::data::open_samples(c, fsdp::data::Split::train, 64);
    const fsdp::data::TokenDataset ds(gpt2, fsdp::data::Split::train);
    EXPECT_EQ(src->load({2, 5}).position_ids, window_positions(ds, {2, 5}, 16, 0));
  }
  // A mixture: each row's positions are those its file gives it.
  const auto other = make_document_file(dir, "e.h5", kLlamaRecord, /*seed=*/4);
  c.data.path.clear();
  c.data.paths = {path, other};
  auto one = [&](const std::string& p) {
    auto o = c;
    o.data.paths.clear();
    o.data.path = p;
    return fsdp::data::open_samples(o, fsdp::data::Split::train, 64);
  };
  const auto mix = fsdp::data::open_samples(c, fsdp::data::Split::train, 64);
  const auto a = one(path), e = one(other);
  const int64_t na = a->num_samples();
  const auto rows = mix->load({na + 3, 1, na, 4});
  const auto ra = a->load({1, 4}), re = e->load({3, 0});
  ASSERT_EQ(rows.position_ids.size(), rows.inputs.size());
  EXPECT_EQ(rows.rows(0, 1).position_ids, re.rows(0, 1).position_ids);
  EXPECT_EQ(rows.rows(1, 1).position_ids, ra.rows(0, 1).position_ids);
  EXPECT_EQ(rows.rows(2, 1).position_ids, re.rows(1, 1).position_ids);
  EXPECT_EQ(rows.rows(3, 1).position_ids, ra.rows(1, 1).position_ids);
  EXPECT_EQ(rows.rows(0, 1).inputs, re.rows(0, 1).inputs);
  EXPECT_EQ(fsdp::data::open_samples(c, fsdp::data::Split::val, 64)->load({0}).position_ids.size(),
            16u);
  EXPECT_TRUE(mix->shape().block_causal);
  c.data.reset_position_ids = true;
  EXPECT_TRUE(
      fsdp::data::open_samples(c, fsdp::data::Split::train, 64)->load({na, 0}).reset_position_ids);
  c.data.reset_position_ids = false;
  // Synthetic data with data.eos_token_id: load_batch's rows, positions of that id.
  auto s = data_config(fsdp::Objective::causal_lm, "");
  s.data.seq_len = 8;
  s.train.global_batch_size = 4;
  s.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  s.data.eos_token_id = 3;
  const auto st = fsdp::data::open_samples(s, fsdp::data::Split::train, 6);
  auto ref = fsdp::data::load_batch(fsdp::data::SyntheticTokens(1024 * 4 * 8 + 1, 6, s.train.seed),
                                    {9, 4095, 0}, 8);
  fsdp::data::set_document_positions(ref, 3);
  const auto sb = st->load({9, 4095, 0});
  EXPECT_EQ(sb.inputs, ref.inputs);
  EXPECT_EQ(sb.position_ids, ref.position_ids);
  EXPECT_EQ(fsdp::data::open_samples(s, fsdp::data::Split::val, 6)->load({63}).position_ids.size(),
            8u);
}

// Each error of block_causal's EOS id is one InputError naming the key and the file.
TEST(Samples, BlockCausalErrorsNameKeyAndFile) {
  TempDir dir("block_causal_err");
  const std::string key = "data.attn_mask_type = \"block_causal\": ";
  write_text(dir.path() / "t.txt", std::string(300, 'a'));
  fsdp::data::prepare_byte_dataset({dir.file("t.txt")}, dir.file("bytes.h5"), 0.25);
  auto c = data_config(fsdp::Objective::causal_lm, dir.file("bytes.h5"));
  c.data.seq_len = 16;
  EXPECT_NO_THROW(
      fsdp::data::open_samples(c, fsdp::data::Split::train, 256));  // causal: no EOS needed
  c.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  for (const auto split : {fsdp::data::Split::train, fsdp::data::Split::val}) {
    expect_error([&] { fsdp::data::open_samples(c, split, 256); }, 2,
                 {key + dir.file("bytes.h5") +
                  " has no eos_id (byte-level or imported tokens); set data.eos_token_id"});
  }
  // With data.eos_token_id the byte file is read: every 'a' ends a document.
  c.data.eos_token_id = 'a';
  const auto b = fsdp::data::open_samples(c, fsdp::data::Split::train, 256)->load({0, 1});
  EXPECT_EQ(b.position_ids, std::vector<int32_t>(32, 0));
  c.data.eos_token_id = 256;
  expect_error(
      [&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 256); }, 2,
      {"data.eos_token_id: 256 is out of range (expected -1 <= x < model.vocab_size = 256)"});
  c.data.eos_token_id = -1;
  // eos_id = -1 (a model without EOS); add_eos = 0 (prepared with --no-add-eos).
  const auto none = make_document_file(
      dir, "none.h5", {{"bos_id", 0}, {"eos_id", -1}, {"add_bos", 1}, {"add_eos", 0}});
  c.data.path = none;
  expect_error(
      [&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 64); }, 2,
      {key + none + " has no eos_id (byte-level or imported tokens); set data.eos_token_id"});
  const auto no_add = make_document_file(
      dir, "no_add.h5", {{"bos_id", 0}, {"eos_id", 1}, {"add_bos", 1}, {"add_eos", 0}});
  c.data.path = no_add;
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 64); }, 2,
               {key + no_add + " has eos_id 1 but no EOS after its documents", "--no-add-eos",
                "set data.eos_token_id"});
  // The file's eos_id outside the model's vocabulary.
  const auto big = make_document_file(dir, "big.h5", {{"eos_id", 70}});
  c.data.path = big;
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 64); }, 2,
               {key + big + " has eos_id 70, outside model.vocab_size = 64"});
  // Synthetic data has no EOS of its own.
  auto s = data_config(fsdp::Objective::causal_lm, "");
  s.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  expect_error([&] { fsdp::data::open_samples(s, fsdp::data::Split::train, 100); }, 2,
               {key + "synthetic data has no EOS; set data.eos_token_id"});
  s.data.eos_token_id = 100;
  expect_error([&] { fsdp::data::open_samples(s, fsdp::data::Split::val, 100); }, 2,
               {"data.eos_token_id: 100 is out of range"});
  // A mixture: the files' eos_id must agree (both named); a file without one is named as
  // data.paths[d].
  const auto a = make_document_file(dir, "a.h5", kLlamaRecord);
  const auto e2 = make_document_file(
      dir, "e2.h5", {{"bos_id", 0}, {"eos_id", 2}, {"add_bos", 1}, {"add_eos", 1}});
  c.data.path.clear();
  c.data.paths = {a, e2};
  expect_error(
      [&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 64); }, 2,
      {key + "data.paths[0] " + a + " has eos_id 1 but data.paths[1] " + e2 + " has eos_id 2"});
  c.data.paths = {a, none};
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::val, 64); }, 2,
               {"data.paths[1]: " + key + none + " has no eos_id"});
  // data.eos_token_id settles it for every file (no attribute read).
  c.data.eos_token_id = 1;
  c.data.paths = {a, e2, none};
  EXPECT_EQ(
      fsdp::data::open_samples(c, fsdp::data::Split::train, 64)->load({0}).position_ids.size(),
      16u);
  // The objective: a config check (test_config), before any file is read.
  auto q = data_config(fsdp::Objective::sft, "unused.h5");
  q.model = fsdp::model_defaults("gpt2");
  q.fsdp.transformer_layer_cls_to_wrap = {"GPT2Block"};
  q.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  q.data.seq_len = 16;
  expect_error(
      [&] { fsdp::check_config(q); }, 2,
      {"data.attn_mask_type: \"block_causal\" needs data.objective = \"causal_lm\" (got \"sft\""});
  // A hostile file: eos_id stored as a string, and one of 5000 for a vocabulary of 64.
  c.data.paths.clear();
  c.data.eos_token_id = -1;
  for (const bool text : {true, false}) {
    const std::string path = dir.file(text ? "str.h5" : "big.h5");
    {
      auto f = fsdp::h5::File::create(path);
      const std::vector<uint8_t> toks(200, 5);
      f.write_u8("/train/tokens", toks.data(), {200});
      f.write_u8("/val/tokens", toks.data(), {100});
      f.set_attr("/", "vocab_size", int64_t{64});
      if (text) {
        f.set_attr("/", "eos_id", std::string("two"));
      } else {
        f.set_attr("/", "eos_id", int64_t{5000});
      }
    }
    c.data.path = path;
    expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 64); }, 2,
                 {path, "eos_id", text ? "expected an integer attribute" : "5000"});
  }
}

namespace {
// Writes `lines` (each "input\ttarget") to name.tsv; returns the path.
std::string write_tsv(const TempDir& dir, const std::string& name, const std::string& text) {
  write_text(dir.path() / name, text);
  return dir.file(name);
}
}  // namespace

TEST(Samples, Seq2SeqRoundTripPadsAndTruncates) {
  TempDir dir("s2s");
  const auto tsv = write_tsv(dir, "p.tsv",
                             "ab\tX\n"
                             "hello world\tY\r\n"      // CRLF; input truncated to 6
                             "\xc3\xa9\tlong target\n"  // UTF-8 bytes; target truncated to 4
                             "q\tr\n"
                             "s\ttt");                  // no final newline
  const auto sum = fsdp::data::prepare_pairs_dataset(tsv, dir.file("p.h5"), 0.4);
  EXPECT_EQ(sum.train_examples, 3);
  EXPECT_EQ(sum.val_examples, 2);
  EXPECT_EQ(sum.input_tokens, 3 + 12 + 3 + 2 + 2);  // eos included
  EXPECT_EQ(sum.target_tokens, 2 + 2 + 12 + 2 + 3);
  EXPECT_EQ(sum.max_input_len, 12);
  EXPECT_EQ(sum.max_target_len, 12);
  EXPECT_DOUBLE_EQ(sum.mean_input_len, 22.0 / 5);

  auto c = data_config(fsdp::Objective::seq2seq, dir.file("p.h5"));
  c.data.max_input_len = 6;
  c.data.max_target_len = 4;
  EXPECT_EQ(fsdp::data::batch_shape(c).L, 6);
  EXPECT_EQ(fsdp::data::batch_shape(c).target_len, 4);
  const auto train = fsdp::data::open_samples(c, fsdp::data::Split::train, 384);
  EXPECT_EQ(train->num_samples(), 3);
  EXPECT_EQ(train->num_tokens(), 3 + 12 + 3 + 2 + 2 + 12);
  EXPECT_EQ(train->num_truncated(), 2);
  const auto b = train->load({2, 0, 1});
  EXPECT_EQ(b.B, 3);
  EXPECT_EQ(b.L, 6);
  EXPECT_EQ(b.target_len, 4);
  const int32_t I = fsdp::data::kIgnoreIndex;
  EXPECT_EQ(in_row(b, 0), (std::vector<int32_t>{0xc3 + 3, 0xa9 + 3, 1, 0, 0, 0}));
  EXPECT_EQ(tgt_row(b, 0), cat(ids("lon"), {1}));  // first max - 1 tokens, then eos
  EXPECT_EQ(in_row(b, 1), cat(ids("ab"), {1, 0, 0, 0}));
  EXPECT_EQ(tgt_row(b, 1), (std::vector<int32_t>{'X' + 3, 1, I, I}));
  EXPECT_EQ(in_row(b, 2), cat(ids("hello"), {1}));  // "\r" of the CRLF line dropped
  EXPECT_EQ(tgt_row(b, 2), (std::vector<int32_t>{'Y' + 3, 1, I, I}));
  EXPECT_EQ(b.num_targets(), 4 + 2 + 2);
  expect_error([&] { train->load({3}); }, 1, {"sample 3"});

  const auto val = fsdp::data::open_samples(c, fsdp::data::Split::val, 384);
  EXPECT_EQ(val->num_samples(), 2);
  EXPECT_EQ(val->num_truncated(), 0);
  const auto v = val->load({1});
  EXPECT_EQ(in_row(v, 0), cat(ids("s"), {1, 0, 0, 0, 0}));
  EXPECT_EQ(tgt_row(v, 0), cat(ids("tt"), {1, I}));
  c.eval.max_windows = 1;  // caps the validation examples
  EXPECT_EQ(fsdp::data::open_samples(c, fsdp::data::Split::val, 384)->num_samples(), 1);
  // max length 1: only the eos is left.
  c.data.max_input_len = 1;
  const auto one = fsdp::data::open_samples(c, fsdp::data::Split::train, 384);
  EXPECT_EQ(one->num_truncated(), 3);
  EXPECT_EQ(in_row(one->load({1}), 0), (std::vector<int32_t>{1}));
  // File vocab (259) above the model's; tokens above a small model vocabulary.
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 258); }, 2, {dir.file("p.h5"), "model.vocab_size"});
}

TEST(Samples, PairsTsvErrorsNameFileAndLine) {
  TempDir dir("tsv");
  const auto no_tab = write_tsv(dir, "a.tsv", "a\tb\nno tab here\n");
  expect_error([&] { fsdp::data::read_pairs_tsv(no_tab); }, 2, {no_tab + ":2:", "no tab"});
  const auto empty_in = write_tsv(dir, "b.tsv", "a\tb\nc\td\n\tx\n");
  expect_error([&] { fsdp::data::read_pairs_tsv(empty_in); }, 2, {empty_in + ":3:", "empty input"});
  const auto empty_tgt = write_tsv(dir, "c.tsv", "x\t\n");
  expect_error([&] { fsdp::data::read_pairs_tsv(empty_tgt); }, 2, {empty_tgt + ":1:", "empty target"});
  const auto two_tabs = write_tsv(dir, "d.tsv", "a\tb\tc\n");
  expect_error([&] { fsdp::data::read_pairs_tsv(two_tabs); }, 2, {two_tabs + ":1:", "more than one tab"});
  const auto blank = write_tsv(dir, "e.tsv", "a\tb\n\nc\td\n");
  expect_error([&] { fsdp::data::read_pairs_tsv(blank); }, 2, {blank + ":2:"});
  const auto none = write_tsv(dir, "f.tsv", "");
  expect_error([&] { fsdp::data::read_pairs_tsv(none); }, 2, {none, "no lines"});
  expect_error([&] { fsdp::data::read_pairs_tsv(dir.file("missing.tsv")); }, 2, {"missing.tsv"});
  const auto one = write_tsv(dir, "g.tsv", "a\tb\n");
  expect_error([&] { fsdp::data::prepare_pairs_dataset(one, dir.file("o.h5"), 0.5); }, 2, {"--val-fraction"});
  EXPECT_FALSE(fs::exists(dir.file("o.h5")));
}

namespace {
// A seq2seq file with /train only, built by hand: uint8 tokens, int64 offsets.
struct RawPairs {
  std::vector<uint8_t> inputs{10, 11, 1, 12, 1}, targets{20, 1, 21, 22, 1};
  std::vector<int64_t> input_offsets{0, 3, 5}, target_offsets{0, 2, 5};
  bool float_inputs = false, skip_targets = false;
};
std::string write_raw_pairs(const TempDir& dir, const std::string& name, const RawPairs& p) {
  const std::string path = dir.file(name);
  auto f = fsdp::h5::File::create(path);
  if (p.float_inputs) {
    std::vector<float> x(p.inputs.begin(), p.inputs.end());
    f.write_f32("/train/inputs", x.data(), {x.size()});
  } else {
    f.write_u8("/train/inputs", p.inputs.data(), {p.inputs.size()});
  }
  f.write_i64("/train/input_offsets", p.input_offsets.data(), {p.input_offsets.size()});
  if (!p.skip_targets) f.write_u8("/train/targets", p.targets.data(), {p.targets.size()});
  f.write_i64("/train/target_offsets", p.target_offsets.data(), {p.target_offsets.size()});
  f.close();
  return path;
}
}  // namespace

// data.objective = "sft": a row is prompt ++ completion cut to L + 1 tokens; inputs its first
// L (padded with 0), targets the next token where that token is the completion's (the
// prompt's and the padding's are kIgnoreIndex); an example cut short is counted.
TEST(Samples, SftRowsMaskThePromptAndTruncateTheEnd) {
  TempDir dir("sft");
  fsdp::data::PairExamples train, val;
  train.add({11, 12, 13}, {21, 22});                // fits: 5 tokens, L + 1 = 5
  train.add({31}, {41, 42, 43, 44, 45, 46});       // cut: 7 tokens
  train.add({51, 52, 53, 54, 55, 56}, {61});       // the prompt alone fills the row
  train.add({}, {71, 72});                         // no prompt
  val.add({1, 2}, {3});
  fsdp::data::write_pairs_file(dir.file("p.h5"), {train, val}, "test");
  auto c = data_config(fsdp::Objective::sft, dir.file("p.h5"));
  c.data.seq_len = 4;
  EXPECT_EQ(fsdp::data::batch_shape(c).L, 4);
  EXPECT_EQ(fsdp::data::batch_shape(c).target_len, 4);
  const auto s = fsdp::data::open_samples(c, fsdp::data::Split::train, 300);
  EXPECT_EQ(s->num_samples(), 4);
  EXPECT_EQ(s->num_truncated(), 2);
  EXPECT_EQ(s->fixed_targets_per_sample(), 0);
  const auto b = s->load({0, 1, 2, 3});
  const int32_t I = fsdp::data::kIgnoreIndex;
  EXPECT_EQ(in_row(b, 0), (std::vector<int32_t>{11, 12, 13, 21}));
  EXPECT_EQ(tgt_row(b, 0), (std::vector<int32_t>{I, I, 21, 22}));
  EXPECT_EQ(in_row(b, 1), (std::vector<int32_t>{31, 41, 42, 43}));
  EXPECT_EQ(tgt_row(b, 1), (std::vector<int32_t>{41, 42, 43, 44}));
  EXPECT_EQ(in_row(b, 2), (std::vector<int32_t>{51, 52, 53, 54}));
  EXPECT_EQ(tgt_row(b, 2), (std::vector<int32_t>{I, I, I, I}));
  EXPECT_EQ(in_row(b, 3), (std::vector<int32_t>{71, 0, 0, 0}));
  EXPECT_EQ(tgt_row(b, 3), (std::vector<int32_t>{72, I, I, I}));
  EXPECT_EQ(b.num_targets(), 2 + 4 + 0 + 1);
  const auto v = fsdp::data::open_samples(c, fsdp::data::Split::val, 300)->load({0});
  EXPECT_EQ(in_row(v, 0), (std::vector<int32_t>{1, 2, 0, 0}));
  EXPECT_EQ(tgt_row(v, 0), (std::vector<int32_t>{I, 3, I, I}));
  c.data.source = fsdp::DataSource::synthetic;
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 300); }, 2,
               {"data.source: \"synthetic\" is not supported with data.objective = \"sft\""});
}

// data.eod_mask_loss (Megatron-LM's --eod-mask-loss) with block_causal: the target after each
// EOS input (the next document's first token) is ignored and every other target is the
// unmasked batch's; the number of targets then varies (no fixed count), train and val.
TEST(Samples, EodMaskLossIgnoresTheTargetAfterEachEos) {
  TempDir dir("eod_mask");
  const auto path = make_document_file(dir, "d.h5", kLlamaRecord);
  auto c = data_config(fsdp::Objective::causal_lm, path);
  c.data.seq_len = 16;
  c.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  auto m = c;
  m.data.eod_mask_loss = true;
  for (const auto split : {fsdp::data::Split::train, fsdp::data::Split::val}) {
    const auto plain = fsdp::data::open_samples(c, split, 64);
    const auto masked = fsdp::data::open_samples(m, split, 64);
    EXPECT_EQ(plain->fixed_targets_per_sample(), 16);
    EXPECT_EQ(masked->fixed_targets_per_sample(), 0);
    const auto idx = all_indices(masked->num_samples());
    const auto p = plain->load(idx), b = masked->load(idx);
    EXPECT_EQ(b.inputs, p.inputs);
    EXPECT_EQ(b.position_ids, p.position_ids);
    const int32_t eos = fsdp::data::document_eos_id(path);
    int64_t masked_targets = 0;
    for (std::size_t k = 0; k < b.inputs.size(); ++k) {
      if (b.inputs[k] == eos) {
        EXPECT_EQ(b.targets[k], fsdp::data::kIgnoreIndex) << k;
        ++masked_targets;
      } else {
        EXPECT_EQ(b.targets[k], p.targets[k]) << k;
      }
    }
    EXPECT_GT(masked_targets, 0);
    EXPECT_EQ(b.num_targets(), p.num_targets() - masked_targets);
  }
}

// data.packing (TRL's SFTConfig packing="bfd" with padding_free): examples of 3, 4, 1, 2, 2
// and 5 positions (their lengths less one; a 1-token example fills none and is left out) go
// into rows of 6 by best-fit decreasing: 5 alone -> row 0 (1 left), 4 -> row 1 (2 left), 3 ->
// row 2 (3 left), 2 -> row 1 (fits exactly), 2 -> row 2 (1 left), 1 -> row 0 (the least room
// that fits). Each example keeps its tokens and its prompt mask; position_ids restart at each
// example and at the padding; the shape says block_causal; without packing a row is one
// example as before.
TEST(Samples, SftPackingPlacesExamplesBestFitDecreasing) {
  TempDir dir("sftpack");
  fsdp::data::PairExamples train, val;
  train.add({10, 11}, {12, 13});          // 0: 3 positions
  train.add({20}, {21, 22, 23, 24});      // 1: 4
  train.add({}, {30, 31});                // 2: 1
  train.add({40}, {41, 42});              // 3: 2
  train.add({50, 51, 52}, {});            // 4: 2 (no completion: no target)
  train.add({60}, {61, 62, 63, 64, 65});  // 5: 5
  train.add({}, {70});                    // 6: 0 positions: left out
  val.add({1}, {2, 3});
  fsdp::data::write_pairs_file(dir.file("p.h5"), {train, val}, "test");
  auto c = data_config(fsdp::Objective::sft, dir.file("p.h5"));
  c.data.seq_len = 6;
  c.data.packing = true;
  c.data.attn_mask_type = fsdp::AttnMaskType::block_causal;
  c.data.reset_position_ids = true;
  EXPECT_TRUE(fsdp::data::batch_shape(c).block_causal);
  EXPECT_TRUE(fsdp::data::batch_shape(c).reset_position_ids);
  const auto s = fsdp::data::open_samples(c, fsdp::data::Split::train, 300);
  ASSERT_EQ(s->num_samples(), 3);
  EXPECT_TRUE(s->shape().block_causal);
  const auto b = s->load({0, 1, 2});
  const int32_t I = fsdp::data::kIgnoreIndex;
  auto pos_row = [&](int64_t r) {
    return std::vector<int32_t>(b.position_ids.begin() + r * 6, b.position_ids.begin() + r * 6 + 6);
  };
  EXPECT_TRUE(b.reset_position_ids);
  EXPECT_EQ(in_row(b, 0), (std::vector<int32_t>{60, 61, 62, 63, 64, 30}));
  EXPECT_EQ(tgt_row(b, 0), (std::vector<int32_t>{61, 62, 63, 64, 65, 31}));
  EXPECT_EQ(pos_row(0), (std::vector<int32_t>{0, 1, 2, 3, 4, 0}));
  EXPECT_EQ(in_row(b, 1), (std::vector<int32_t>{20, 21, 22, 23, 40, 41}));
  EXPECT_EQ(tgt_row(b, 1), (std::vector<int32_t>{21, 22, 23, 24, 41, 42}));
  EXPECT_EQ(pos_row(1), (std::vector<int32_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(in_row(b, 2), (std::vector<int32_t>{10, 11, 12, 50, 51, 0}));
  EXPECT_EQ(tgt_row(b, 2), (std::vector<int32_t>{I, 12, 13, I, I, I}));
  EXPECT_EQ(pos_row(2), (std::vector<int32_t>{0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(b.num_targets(), 6 + 6 + 2);  // every completion token of the split, once
  // The validation split is packed too; without packing one example a row, no position_ids.
  const auto v = fsdp::data::open_samples(c, fsdp::data::Split::val, 300)->load({0});
  EXPECT_EQ(in_row(v, 0), (std::vector<int32_t>{1, 2, 0, 0, 0, 0}));
  EXPECT_EQ(v.position_ids, (std::vector<int32_t>{0, 1, 0, 1, 2, 3}));
  c.data.packing = false;
  const auto u = fsdp::data::open_samples(c, fsdp::data::Split::train, 300);
  EXPECT_EQ(u->num_samples(), 7);
  EXPECT_TRUE(u->load({0}).position_ids.empty());
}

TEST(Samples, Seq2SeqBadFilesAreInputErrorsNamingFileAndDataset) {
  TempDir dir("s2sbad");
  auto open = [](const std::string& path, fsdp::data::Split split = fsdp::data::Split::train, int64_t vocab = 384) {
    auto c = data_config(fsdp::Objective::seq2seq, path);
    return fsdp::data::open_samples(c, split, vocab);
  };
  const auto good = write_raw_pairs(dir, "good.h5", {});
  const auto s = open(good);
  EXPECT_EQ(s->num_samples(), 2);
  EXPECT_EQ(in_row(s->load({1}), 0)[0], 12);
  EXPECT_EQ(tgt_row(s->load({1}), 0)[1], 22);

  expect_error([&] { open(good, fsdp::data::Split::val); }, 2, {good, "/val", "group not found"});
  expect_error([&] { open(dir.file("nope.h5")); }, 2, {"nope.h5"});
  RawPairs p;
  p.skip_targets = true;
  const auto missing = write_raw_pairs(dir, "missing.h5", p);
  expect_error([&] { open(missing); }, 2, {missing, "/train/targets", "not found"});
  p = {};
  p.float_inputs = true;
  const auto flt = write_raw_pairs(dir, "float.h5", p);
  expect_error([&] { open(flt); }, 2, {flt, "/train/inputs", "integers"});
  p = {};
  p.input_offsets = {0, 3, 4};  // last != 5 tokens
  const auto last = write_raw_pairs(dir, "last.h5", p);
  expect_error([&] { open(last); }, 2, {last, "/train/input_offsets", "last offset is 4"});
  p = {};
  p.target_offsets = {0, 3, 2, 5};
  p.input_offsets = {0, 1, 3, 5};
  const auto dec = write_raw_pairs(dir, "decreasing.h5", p);
  expect_error([&] { open(dec); }, 2, {dec, "/train/target_offsets", "non-decreasing"});
  p = {};
  p.input_offsets = {1, 3, 5};
  const auto first = write_raw_pairs(dir, "first.h5", p);
  expect_error([&] { open(first); }, 2, {first, "/train/input_offsets", "first offset"});
  p = {};
  p.target_offsets = {0, 5};
  const auto count = write_raw_pairs(dir, "count.h5", p);
  expect_error([&] { open(count); }, 2, {count, "/train/target_offsets", "one input and one target"});
  p = {};
  p.targets[3] = 250;
  const auto range = write_raw_pairs(dir, "range.h5", p);
  expect_error([&] { open(range, fsdp::data::Split::train, 200); }, 2, {range, "/train/targets", "token 250 at position 3"});
  EXPECT_NO_THROW(open(range, fsdp::data::Split::train, 251));
}

// ---------------------------------------------------------------- span corruption

TEST(SpanCorruption, CountsFollowT5Rounding) {
  using fsdp::data::span_counts;
  const auto c = span_counts(512, 0.15, 3.0);  // round(76.8) = 77, round(25.67) = 26
  EXPECT_EQ(c.num_noise, 77);
  EXPECT_EQ(c.num_spans, 26);
  EXPECT_EQ(c.input_len(), 512 - 77 + 26 + 1);
  EXPECT_EQ(c.target_len(), 77 + 26 + 1);
  EXPECT_EQ(span_counts(10, 0.15, 3.0).num_noise, 2);   // 1.5 -> 2 (half to even)
  EXPECT_EQ(span_counts(10, 0.25, 3.0).num_noise, 2);   // 2.5 -> 2 (half to even, numpy)
  EXPECT_EQ(span_counts(10, 0.25, 3.0).num_spans, 1);   // max(1, round(0.67))
  EXPECT_EQ(span_counts(10, 0.01, 3.0).num_noise, 1);   // at least 1
  EXPECT_EQ(span_counts(10, 0.99, 3.0).num_noise, 9);   // at most L - 1
  EXPECT_EQ(span_counts(100, 0.9, 1.0).num_spans, 10);  // at most L - num_noise
  expect_error([] { span_counts(1, 0.15, 3.0); }, 2, {"data.seq_len"});
  expect_error([] { span_counts(64, 1.0, 3.0); }, 2, {"data.noise_density"});
  expect_error([] { span_counts(64, 0.15, 0.5); }, 2, {"data.mean_noise_span_length"});
  auto cfg = data_config(fsdp::Objective::span_corruption, "");
  cfg.data.seq_len = 512;
  EXPECT_EQ(fsdp::data::batch_shape(cfg).L, 462);
  EXPECT_EQ(fsdp::data::batch_shape(cfg).target_len, 104);
}

TEST(SpanCorruption, RandomSegmentationIsAPositiveComposition) {
  for (int64_t n : {1, 2, 5, 77}) {
    for (int64_t k = 1; k <= n; k += (n > 10 ? 13 : 1)) {
      const auto seg = fsdp::data::random_segmentation(n, k, 7, 3, 0);
      ASSERT_EQ(static_cast<int64_t>(seg.size()), k);
      EXPECT_EQ(std::accumulate(seg.begin(), seg.end(), int64_t{0}), n);
      for (int64_t x : seg) EXPECT_GE(x, 1);
    }
  }
  EXPECT_EQ(fsdp::data::random_segmentation(4, 4, 1, 1, 0), (std::vector<int64_t>{1, 1, 1, 1}));
  expect_error([] { fsdp::data::random_segmentation(3, 4, 1, 1, 0); }, 1, {"segments"});
}

namespace {
// Rebuilds the original window from a span-corruption row: each sentinel of the inputs is
// replaced by the tokens that follow the same sentinel in the targets. Checks the row layout
// (sentinels vocab-1, vocab-2, ... in order, eos last) on the way; returns the noise span
// lengths through `spans`.
std::vector<int32_t> reconstruct(const std::vector<int32_t>& in, const std::vector<int32_t>& tgt, int64_t vocab,
                                 int64_t num_spans, std::vector<int64_t>* spans) {
  const auto is_sentinel = [&](int32_t t) { return t >= vocab - num_spans && t < vocab; };
  std::vector<int32_t> out;
  EXPECT_EQ(in.back(), 1);
  EXPECT_EQ(tgt.back(), 1);
  std::size_t tp = 0;
  int32_t next = static_cast<int32_t>(vocab - 1);
  for (std::size_t i = 0; i + 1 < in.size(); ++i) {
    if (!is_sentinel(in[i])) {
      out.push_back(in[i]);
      continue;
    }
    EXPECT_EQ(in[i], next);
    EXPECT_EQ(tgt[tp], next);
    --next;
    ++tp;
    int64_t len = 0;
    for (; tp + 1 < tgt.size() && !is_sentinel(tgt[tp]); ++tp, ++len) out.push_back(tgt[tp]);
    if (spans) spans->push_back(len);
  }
  EXPECT_EQ(tp + 1, tgt.size());
  EXPECT_EQ(vocab - 1 - next, num_spans);
  return out;
}
}  // namespace

TEST(SpanCorruption, StatisticsAndExactReconstructionOverManyWindows) {
  constexpr int64_t L = 512, V = 384, N = 2000;
  auto c = data_config(fsdp::Objective::span_corruption, "");
  c.data.seq_len = L;
  c.train.global_batch_size = 2;  // 1024 * 2 windows of L
  c.train.seed = 5;
  const auto src = fsdp::data::open_samples(c, fsdp::data::Split::train, V);
  ASSERT_EQ(src->num_samples(), 2048);
  EXPECT_EQ(src->num_tokens(), 2048 * L);
  const auto counts = fsdp::data::span_counts(L, 0.15, 3.0);
  // The synthetic stream: ids 3 + rng::below(V - 128, seed, "data.synthetic", p).
  const fsdp::data::SyntheticTokens raw(2048 * L, V - 128, 5);
  std::vector<int64_t> idx(N);
  std::iota(idx.begin(), idx.end(), int64_t{0});
  const auto b = src->load(idx);
  ASSERT_EQ(b.L, counts.input_len());
  ASSERT_EQ(b.target_len, counts.target_len());
  EXPECT_EQ(b.num_targets(), N * b.target_len);  // fixed lengths: no padding
  std::vector<int64_t> noise_spans, first_nonnoise;
  std::vector<int64_t> noise_at(L, 0);
  int64_t noise_tokens = 0;
  for (int64_t r = 0; r < N; ++r) {
    std::vector<int32_t> window(L);
    raw.read(r * L, L, window.data());
    for (auto& t : window) t += 3;
    std::vector<int64_t> spans;
    const auto rebuilt = reconstruct(in_row(b, r), tgt_row(b, r), V, counts.num_spans, &spans);
    ASSERT_EQ(rebuilt, window) << "window " << r;
    // Noise positions of this window, from the row: walk the inputs.
    const auto in = in_row(b, r);
    int64_t pos = 0, s = 0;
    bool first = true;
    for (std::size_t i = 0; i + 1 < in.size(); ++i) {
      if (in[i] >= V - counts.num_spans) {
        if (first) first_nonnoise.push_back(pos);
        first = false;
        for (int64_t t = 0; t < spans[static_cast<std::size_t>(s)]; ++t) ++noise_at[static_cast<std::size_t>(pos++)];
        ++s;
      } else {
        ++pos;
      }
    }
    for (int64_t x : spans) noise_tokens += x;
    noise_spans.insert(noise_spans.end(), spans.begin(), spans.end());
  }
  // Noise density: exactly round(0.15 L) / L per window, within 0.5 / L of 0.15 (rounding).
  const double density = static_cast<double>(noise_tokens) / static_cast<double>(N * L);
  EXPECT_DOUBLE_EQ(density, 77.0 / 512.0);
  EXPECT_NEAR(density, 0.15, 0.5 / L);
  // Mean noise span length: num_noise / round(num_noise / 3) = 77 / 26, within 0.5 * 3 /
  // num_spans of 3 (rounding of the span count).
  const double mean_span = static_cast<double>(noise_tokens) / static_cast<double>(noise_spans.size());
  EXPECT_DOUBLE_EQ(mean_span, 77.0 / 26.0);
  EXPECT_NEAR(mean_span, 3.0, 0.5 * 3.0 / 26.0);
  for (int64_t x : noise_spans) ASSERT_GE(x, 1);
  // T5's segmentation is a uniform composition of n into k positive parts, so every part is
  // 1 with probability (k - 1) / (n - 1): 25/76 for the noise spans. 52000 spans: standard
  // error sqrt(p(1-p)/52000) = 0.0021; bound 5 standard errors.
  const double p1 = 25.0 / 76.0;
  const double f1 = static_cast<double>(std::count(noise_spans.begin(), noise_spans.end(), 1)) /
                    static_cast<double>(noise_spans.size());
  EXPECT_NEAR(f1, p1, 5 * std::sqrt(p1 * (1 - p1) / static_cast<double>(noise_spans.size())));
  // The first non-noise span has mean (L - num_noise) / k = 435/26 = 16.7 and, for a uniform
  // composition, variance (n/k)^2 (k-1)/(k+1) (n-k)/... <= (n/k)^2: bound 5 * (n/k) / sqrt(N).
  const double mean_first = static_cast<double>(std::accumulate(first_nonnoise.begin(), first_nonnoise.end(), int64_t{0})) /
                            static_cast<double>(N);
  EXPECT_NEAR(mean_first, 435.0 / 26.0, 5 * (435.0 / 26.0) / std::sqrt(static_cast<double>(N)));
  // T5 starts with non-noise and ends with noise: position 0 is never masked, L-1 always.
  EXPECT_EQ(noise_at[0], 0);
  EXPECT_EQ(noise_at[L - 1], N);
  // Interior positions are masked at about the density (each in [0.10, 0.20] over 2000 windows).
  for (int64_t p = 64; p < L - 64; ++p) {
    const double f = static_cast<double>(noise_at[static_cast<std::size_t>(p)]) / N;
    EXPECT_GT(f, 0.10) << p;
    EXPECT_LT(f, 0.20) << p;
  }
}

TEST(SpanCorruption, RowsArePureFunctionsOfSeedSplitAndIndex) {
  auto c = data_config(fsdp::Objective::span_corruption, "");
  c.data.seq_len = 64;
  c.train.global_batch_size = 1;
  const auto a = fsdp::data::open_samples(c, fsdp::data::Split::train, 384);
  const auto all = a->load({5, 17, 3, 900});
  const auto alone = a->load({17});
  EXPECT_EQ(in_row(all, 1), in_row(alone, 0));
  EXPECT_EQ(tgt_row(all, 1), tgt_row(alone, 0));
  // Two "ranks" each loading half of the global batch see the 1-rank rows.
  const auto r0 = a->load({5, 17}), r1 = a->load({3, 900});
  EXPECT_EQ(cat(r0.inputs, r1.inputs), all.inputs);
  EXPECT_EQ(cat(r0.targets, r1.targets), all.targets);
  // A second source opened from the same config agrees; another seed does not.
  EXPECT_EQ(fsdp::data::open_samples(c, fsdp::data::Split::train, 384)->load({900}).targets, a->load({900}).targets);
  c.train.seed += 1;
  EXPECT_NE(fsdp::data::open_samples(c, fsdp::data::Split::train, 384)->load({900}).targets, a->load({900}).targets);
  expect_error([&] { a->load({1024}); }, 1, {"sample 1024"});
  // Synthetic val: 64 windows (capped by eval.max_windows).
  c.eval.max_windows = 10;
  EXPECT_EQ(fsdp::data::open_samples(c, fsdp::data::Split::val, 384)->num_samples(), 10);
}

TEST(SpanCorruption, ByteFilesAreReadAsByT5Ids) {
  TempDir dir("span");
  std::string text;
  for (int i = 0; i < 40; ++i) text += "pack my box with five dozen liquor jugs " + std::to_string(i) + "\n";
  write_text(dir.path() / "t.txt", text);
  fsdp::data::prepare_byte_dataset({dir.file("t.txt")}, dir.file("t.h5"), 0.25);
  auto c = data_config(fsdp::Objective::span_corruption, dir.file("t.h5"));
  c.data.seq_len = 100;
  const auto train = fsdp::data::open_samples(c, fsdp::data::Split::train, 384);
  const fsdp::data::TokenDataset ds(dir.file("t.h5"), fsdp::data::Split::train);
  EXPECT_EQ(train->num_samples(), ds.num_tokens() / 100);
  const auto counts = fsdp::data::span_counts(100, 0.15, 3.0);  // 15 noise, 5 spans
  const auto b = train->load({train->num_samples() - 1, 0});
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t i = r == 0 ? train->num_samples() - 1 : 0;
    std::vector<int32_t> window(100);
    ds.read(i * 100, 100, window.data());
    for (auto& t : window) t += 3;
    EXPECT_EQ(reconstruct(in_row(b, r), tgt_row(b, r), 384, counts.num_spans, nullptr), window);
  }
  // The split is part of the randomness: train and val sample 0 place their sentinels
  // differently (positions in the inputs depend only on the span layout).
  const auto val = fsdp::data::open_samples(c, fsdp::data::Split::val, 384);
  EXPECT_EQ(val->num_samples(), fsdp::data::TokenDataset(dir.file("t.h5"), fsdp::data::Split::val).num_tokens() / 100);
  auto sentinel_positions = [](const std::vector<int32_t>& row) {
    std::vector<std::size_t> p;
    for (std::size_t i = 0; i < row.size(); ++i) if (row[i] >= 379) p.push_back(i);
    return p;
  };
  const auto vt = sentinel_positions(in_row(val->load({0}), 0));
  EXPECT_EQ(vt.size(), 5u);
  EXPECT_NE(vt, sentinel_positions(in_row(train->load({0}), 0)));
  // Too few sentinel ids above the byte ids 3..258: vocab 262 leaves 3 for 5 spans.
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 262); }, 2, {"data.seq_len", "model.vocab_size 262", "sentinel"});
  EXPECT_NO_THROW(fsdp::data::open_samples(c, fsdp::data::Split::train, 264));
  // Model vocabulary below the mapped byte ids.
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 258); }, 2, {dir.file("t.h5"), "model.vocab_size"});
  // A window longer than the split.
  c.data.seq_len = 100000;
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 384); }, 2, {"data.seq_len", "/train/tokens"});
}

// data.source and the split are enums (an unknown data.source is rejected by the config
// parser, test_config), so only their combinations are left to check here.
TEST(Samples, BadSource) {
  auto c = data_config(fsdp::Objective::seq2seq, "");
  expect_error([&] { fsdp::data::open_samples(c, fsdp::data::Split::train, 384); }, 2, {"data.source", "seq2seq"});
  // A Config built in code gets the config's checks, with its messages, from check_config
  // (train() calls it; open_samples takes a checked config and does not check them again).
  c.model = fsdp::model_defaults("t5");
  c.data.source = fsdp::DataSource::hdf5;
  expect_error([&] { fsdp::check_config(c); }, 2, {"data.path: required (path to an HDF5 token file"});
  auto q = data_config(fsdp::Objective::seq2seq, "unused.h5");
  q.model = fsdp::model_defaults("t5");
  q.fsdp.transformer_layer_cls_to_wrap = {"T5Block"};
  q.data.max_input_len = 0;
  expect_error([&] { fsdp::check_config(q); }, 2,
               {"data.max_input_len: 0 is out of range (expected an integer >= 1)"});
  q.data.max_input_len = 4;
  q.data.max_target_len = -2;
  expect_error([&] { fsdp::check_config(q); }, 2,
               {"data.max_target_len: -2 is out of range (expected an integer >= 1)"});
  q.data.max_target_len = 4;
  q.eval.max_windows = -1;
  expect_error([&] { fsdp::check_config(q); }, 2,
               {"eval.max_windows: -1 is out of range (expected an integer >= 0)"});
  auto s = data_config(fsdp::Objective::span_corruption, "");
  expect_error([&] { fsdp::data::open_samples(s, fsdp::data::Split::train, 128); }, 2, {"model.vocab_size"});
}
