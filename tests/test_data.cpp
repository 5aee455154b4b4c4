// tests/test_data.cpp: the HDF5 wrapper (fsdp::h5), the data layer (TokenDataset,
// synthetic tokens, DistributedSampler, validation windows, batches) and fsdp_prepare's logic.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <algorithm>
#include <numeric>
#include <set>

#include "fsdp/data/batch.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/data/sampler.hpp"
#include "fsdp/data/token_dataset.hpp"
#include "fsdp/data/token_source.hpp"
#include "fsdp/detail/hdf5.hpp"

namespace fs = std::filesystem;

namespace {

// A fresh folder under the build dir, removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& tag) {
    static int counter = 0;
    path_ = fs::path(FSDP_BINARY_DIR) / "test_tmp" /
            ("data_" + tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

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
  write_text(dir.path() / "b", "BBBB");
  write_text(dir.path() / "a", "AA");
  write_text(dir.path() / "a.dat", "index");
  write_text(dir.path() / "sub" / "c", "CCCCCC");
  fs::create_symlink(dir.path() / "a", dir.path() / "a.u8");
  fs::create_directory_symlink(dir.path() / "sub", dir.path() / "linkdir");
  const auto files = fsdp::data::collect_input_files({dir.path().string()});
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], dir.path() / "a");
  EXPECT_EQ(files[1], dir.path() / "b");
  EXPECT_EQ(files[2], dir.path() / "sub" / "c");
  // A file named twice (directly and through its folder) is read once.
  EXPECT_EQ(fsdp::data::collect_input_files({(dir.path() / "b").string(), dir.path().string()}).size(), 3u);

  // 12 bytes, val fraction 0.25 -> the last 3 bytes are validation.
  const std::string out = dir.file("out.h5");
  const auto sum = fsdp::data::prepare_byte_dataset({dir.path().string()}, out, 0.25);
  EXPECT_EQ(sum.files, 3);
  EXPECT_EQ(sum.train_tokens, 9);
  EXPECT_EQ(sum.val_tokens, 3);
  EXPECT_FALSE(fs::exists(out + ".tmp"));

  fsdp::data::TokenDataset train(out, "train", 256, 8);
  fsdp::data::TokenDataset val(out, "val");
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
  EXPECT_NE(f.attr_str("/", "source").find(dir.path().string()), std::string::npos);
}

TEST(Prepare, ErrorsNameTheProblem) {
  TempDir dir("prep_err");
  write_text(dir.path() / "x.dat", "index only");
  expect_error([&] { fsdp::data::collect_input_files({dir.file("missing")}); }, 2, {dir.file("missing"), "not found"});
  expect_error([&] { fsdp::data::collect_input_files({dir.path().string()}); }, 2, {"no input files"});
  write_text(dir.path() / "t", "0123456789");
  expect_error([&] { fsdp::data::prepare_byte_dataset({dir.path().string()}, dir.file("o.h5"), 1.0); }, 2,
               {"--val-fraction"});
  expect_error([&] { fsdp::data::prepare_byte_dataset({dir.path().string()}, dir.file("o.h5"), 0.0); }, 2,
               {"--val-fraction"});
  // 10 bytes * 0.05 = 0.5 -> no validation bytes.
  expect_error([&] { fsdp::data::prepare_byte_dataset({dir.path().string()}, dir.file("o.h5"), 0.05); }, 2,
               {"--val-fraction", "empty validation"});
  expect_error([&] { fsdp::data::prepare_byte_dataset({dir.path().string()}, dir.file("nodir/o.h5"), 0.5); }, 2,
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
  fsdp::data::TokenDataset ds(path, "train", 256, 16);
  EXPECT_EQ(ds.num_tokens(), 300);
  EXPECT_EQ(ds.tokenizer(), "unknown");
  EXPECT_EQ(ds.dataset(), "/train/tokens");
  EXPECT_TRUE(ds.in_memory());
  std::vector<int32_t> w(5);
  ds.read(254, 5, w.data());
  EXPECT_EQ(w, (std::vector<int32_t>{254, 255, 0, 1, 2}));
  expect_error([&] { ds.read(298, 5, w.data()); }, 1, {path, "out of range"});
  // The same reads from disk (splits above the in-memory limit), with the token check.
  fsdp::data::TokenDataset lazy(path, "train", 256, 16, /*in_memory_limit=*/0);
  EXPECT_FALSE(lazy.in_memory());
  std::vector<int32_t> w2(5);
  lazy.read(254, 5, w2.data());
  EXPECT_EQ(w2, w);
  expect_error([&] { lazy.read(298, 5, w2.data()); }, 1, {path, "out of range"});
  const auto bad = make_token_file(dir, "bad.h5", 100, 50);
  fsdp::data::TokenDataset lazy_bad(bad, "train", 0, 0, 0);  // not checked at open
  std::vector<int32_t> w3(50);
  EXPECT_NO_THROW(lazy_bad.read(0, 50, w3.data()));
  expect_error([&] { lazy_bad.read(45, 10, w3.data()); }, 2, {bad, "token 50 at position 50"});
  // A larger model vocabulary is accepted (padding, as nanoGPT's 50304).
  EXPECT_NO_THROW(fsdp::data::TokenDataset(path, "train", 512, 0));
}

TEST(TokenDataset, ErrorsNameFileDatasetAndKey) {
  TempDir dir("ds_err");
  const auto path = make_token_file(dir, "t.h5", 300, 256);
  expect_error([&] { fsdp::data::TokenDataset(dir.file("missing.h5"), "train"); }, 2,
               {dir.file("missing.h5"), "cannot open"});
  expect_error([&] { fsdp::data::TokenDataset(path, "val"); }, 2, {path, "/val/tokens", "not found"});
  expect_error([&] { fsdp::data::TokenDataset(path, "train", 128); }, 2, {"data.path", path, "model.vocab_size", "128"});
  expect_error([&] { fsdp::data::TokenDataset(path, "train", 256, 300); }, 2, {"data.seq_len", "300", "/train/tokens"});
  const auto novocab = make_token_file(dir, "nv.h5", 10, 0, false);
  expect_error([&] { fsdp::data::TokenDataset(novocab, "train"); }, 2, {novocab, "vocab_size"});
  // Tokens 0..99 with vocab 50: token 50 at position 50 is out of range.
  const auto bad = make_token_file(dir, "bad.h5", 100, 50);
  expect_error([&] { fsdp::data::TokenDataset(bad, "train"); }, 2, {bad, "token 50 at position 50"});
  // A float dataset is not a token dataset.
  {
    auto f = fsdp::h5::File::create(dir.file("f.h5"));
    const float x[3] = {1, 2, 3};
    f.write_f32("/train/tokens", x, {3});
    f.set_attr("/", "vocab_size", int64_t{4});
  }
  expect_error([&] { fsdp::data::TokenDataset(dir.file("f.h5"), "train"); }, 2, {"f.h5", "integers"});
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
  fsdp::data::TokenDataset ds(path, "train", 50304, 3);
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

TEST(Sampler, RejectsBadBatchSizes) {
  expect_error([] { fsdp::data::DistributedSampler(100, 6, 0, 4, 1); }, 2, {"train.global_batch_size", "6", "4"});
  expect_error([] { fsdp::data::DistributedSampler(5, 8, 0, 1, 1); }, 2, {"train.global_batch_size", "data.seq_len"});
  expect_error([] { fsdp::data::DistributedSampler(100, 0, 0, 1, 1); }, 2, {"train.global_batch_size"});
  EXPECT_EQ(fsdp::data::num_samples_of(1025, 128), 8);
  EXPECT_EQ(fsdp::data::num_samples_of(1024, 128), 7);
}

// ---------------------------------------------------------------- batches and validation

TEST(Batch, ShiftedWindowsOfSamples) {
  TempDir dir("batch");
  const auto path = make_token_file(dir, "t.h5", 100, 256);
  fsdp::data::TokenDataset ds(path, "train");
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
  const auto b = fsdp::data::load_windows(s, fsdp::data::WindowRange{2, 5}, 10);
  EXPECT_EQ(b.B, 3);
  std::vector<int32_t> raw(31);
  s.read(20, 31, raw.data());
  for (int i = 0; i < 30; ++i) {
    EXPECT_EQ(b.inputs[static_cast<std::size_t>(i)], raw[static_cast<std::size_t>(i)]);
    EXPECT_EQ(b.targets[static_cast<std::size_t>(i)], raw[static_cast<std::size_t>(i + 1)]);
  }
}
