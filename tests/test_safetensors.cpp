// Tests of fsdp/checkpoint/safetensors.hpp's reader: every header rejection with its message,
// round trips with the Writer, dtype conversions, ranged reads (bytes_read counts exactly the
// range's bytes), and sharded model.safetensors.index.json directories; and of its model
// directory writer: parse_shard_size (save_pretrained's max_shard_size strings), the shard
// assignment, ModelWriter's files and index, and its publication order (a previous save's
// files replaced, never mixed; a failure midway leaves the directory as it was).
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"

namespace fs = std::filesystem;
using namespace fsdp;
using namespace fsdp::safetensors;

namespace {

class StTest : public testing::Test {
 protected:
  void SetUp() override {
    const auto* info = testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("fsdp_test_safetensors_" + std::to_string(::getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes raw bytes to `name` and returns its path.
  std::string write_raw(const std::string& name, const std::string& bytes) const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // A safetensors file: 8-byte little-endian length of `json`, `json`, then `data`.
  std::string write_st(const std::string& name, const std::string& json, const std::string& data = "") const {
    return write_raw(name, le64(json.size()) + json + data);
  }
  static std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    return s;
  }
  // Expects opening `file` to throw InputError whose message starts with the path and
  // contains `fragment`, on one line.
  void expect_reject(const std::string& file, const std::string& fragment) const {
    expect_input_error([&] { SafetensorsFile f(file); }, file + ": ", fragment);
  }
  static void expect_input_error(const std::function<void()>& f, const std::string& prefix,
                                 const std::string& fragment) {
    try {
      f();
      ADD_FAILURE() << "expected InputError containing: " << fragment;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.exit_code(), kExitInputError) << msg;
      EXPECT_EQ(msg.rfind(prefix, 0), 0u) << msg << "\n  does not start with: " << prefix;
      EXPECT_NE(msg.find(fragment), std::string::npos) << msg << "\n  lacks: " << fragment;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  fs::path dir_;
};

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
std::string u16_bytes(const std::vector<uint16_t>& v) {
  std::string s;
  for (uint16_t x : v) s += {static_cast<char>(x & 0xff), static_cast<char>(x >> 8)};
  return s;
}
std::vector<float> iota(int64_t n, float start) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + 0.25f * static_cast<float>(i);
  return v;
}

// One tensor "w": dtype F32, shape [2], data_offsets [0, 8] with 8 data bytes, with
// `field` replaced by `value` (or removed when value is empty).
std::string entry_with(const std::string& field, const std::string& value) {
  std::string dtype = "\"dtype\":\"F32\"", shape = "\"shape\":[2]", offs = "\"data_offsets\":[0,8]";
  std::string* f = field == "dtype" ? &dtype : field == "shape" ? &shape : &offs;
  *f = value.empty() ? "" : "\"" + field + "\":" + value;
  std::string body;
  for (const std::string* p : {&dtype, &shape, &offs})
    if (!p->empty()) body += (body.empty() ? "" : ",") + *p;
  return "{\"w\":{" + body + "}}";
}

// ---- header-level rejections ----

TEST_F(StTest, RejectsFileShorterThan8Bytes) {
  expect_reject(write_raw("a", "12345"), "header: file is 5 bytes, shorter than the 8-byte header length");
  expect_reject(write_raw("e", ""), "file is 0 bytes");
}

TEST_F(StTest, RejectsMissingFileAndNonRegularFile) {
  expect_reject(path("missing"), "cannot open safetensors file");
  fs::create_directories(path("sub"));
  expect_reject(path("sub"), "header: not a regular file");
}

TEST_F(StTest, RejectsHeaderLengthZero) { expect_reject(write_raw("a", le64(0) + "{}"), "header: header length is 0"); }

TEST_F(StTest, RejectsAbsurdHeaderLength) {
  expect_reject(write_raw("a", le64(200ull << 20) + "{}"),
                "header: header length 209715200 exceeds the limit of 104857600 bytes");
  expect_reject(write_raw("b", le64(~0ull) + "{}"), "exceeds the limit");
}

TEST_F(StTest, RejectsHeaderBeyondFile) {
  expect_reject(write_raw("a", le64(100) + "{\"a\":1}"),
                "header: header length 100 extends beyond the end of the file (15 bytes)");
}

TEST_F(StTest, RejectsMalformedJson) {
  expect_reject(write_st("a", "{\"w\":"), "header: invalid JSON");
  expect_reject(write_st("b", "{} x"), "header: invalid JSON");
  expect_reject(write_st("c", std::string("{\"\xff\xfe\":1}")), "header: invalid JSON");  // bad UTF-8
  expect_reject(write_st("d", std::string("{}\0\0", 4)), "header: invalid JSON: NUL byte at header offset 2");
}

TEST_F(StTest, RejectsJsonNotObject) {
  expect_reject(write_st("a", "[1,2]"), "header: JSON is not an object");
  expect_reject(write_st("b", "5"), "header: JSON is not an object");
  expect_reject(write_st("c", "\"x\""), "header: JSON is not an object");
  expect_reject(write_st("d", std::string(100000, '[') + std::string(100000, ']')), "header: JSON is not an object");
}

TEST_F(StTest, RejectsEntryNotObject) {
  expect_reject(write_st("a", "{\"w\":3}"), "tensor 'w': entry is not a JSON object");
  expect_reject(write_st("b", "{\"w\":[1]}"), "tensor 'w': entry is not a JSON object");
}

TEST_F(StTest, RejectsMissingFields) {
  expect_reject(write_st("a", entry_with("dtype", ""), std::string(8, 0)), "tensor 'w': missing \"dtype\"");
  expect_reject(write_st("b", entry_with("shape", ""), std::string(8, 0)), "tensor 'w': missing \"shape\"");
  expect_reject(write_st("c", entry_with("data_offsets", ""), std::string(8, 0)), "tensor 'w': missing \"data_offsets\"");
}

TEST_F(StTest, RejectsWrongJsonTypes) {
  const std::string d(8, 0);
  expect_reject(write_st("a", entry_with("dtype", "5"), d), "tensor 'w': \"dtype\" is not a string");
  expect_reject(write_st("b", entry_with("dtype", "[\"F32\"]"), d), "\"dtype\" is not a string");
  expect_reject(write_st("c", entry_with("shape", "\"2\""), d), "tensor 'w': \"shape\" is not an array of integers");
  expect_reject(write_st("d", entry_with("shape", "[2.0]"), d), "\"shape\" is not an array of integers");
  expect_reject(write_st("e", entry_with("shape", "[[2]]"), d), "\"shape\" is not an array of integers");
  expect_reject(write_st("f", entry_with("shape", "{}"), d), "\"shape\" is not an array of integers");
  const std::string offs = "tensor 'w': \"data_offsets\" is not an array of two non-negative integers";
  expect_reject(write_st("g", entry_with("data_offsets", "[0]"), d), offs);
  expect_reject(write_st("h", entry_with("data_offsets", "[0,8,8]"), d), offs);
  expect_reject(write_st("i", entry_with("data_offsets", "[-1,7]"), d), offs);
  expect_reject(write_st("j", entry_with("data_offsets", "[0,\"8\"]"), d), offs);
  expect_reject(write_st("k", entry_with("data_offsets", "null"), d), offs);
  expect_reject(write_st("l", entry_with("data_offsets", "[0,18446744073709551615]"), d),
                "data_offsets value larger than int64");
  expect_reject(write_st("m", "{\"w\":{\"x\":{\"y\":1}}}"), "tensor 'w': field 'x' holds an object nested too deeply");
  // Found by fuzz_safetensors: an unknown field's name went into the message unescaped.
  expect_reject(write_st("p", "{\"w\":{\"a\\nb\":{}}}"), "tensor 'w': field 'a\\x0ab' holds an object");
  expect_reject(write_st("n", "{\"w\":{\"x\":[[1]]}}"), "nested too deeply");
  expect_reject(write_st("o", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\"}}"), "tensor 'w': field \"dtype\" appears twice");
}

TEST_F(StTest, RejectsDuplicateTensor) {
  expect_reject(write_st("a", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                              "\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"),
                "header: tensor 'w' appears twice");
}

TEST_F(StTest, RejectsBadMetadata) {
  expect_reject(write_st("a", "{\"__metadata__\":{\"k\":1}}"), "header: \"__metadata__\" value for 'k' is not a string");
  expect_reject(write_st("b", "{\"__metadata__\":{\"k\":[\"v\"]}}"), "\"__metadata__\" value for 'k' is not a string");
  expect_reject(write_st("c", "{\"__metadata__\":[]}"), "header: \"__metadata__\" is not an object");
  expect_reject(write_st("d", "{\"__metadata__\":\"x\"}"), "header: \"__metadata__\" is not an object");
}

TEST_F(StTest, RejectsUnknownDtype) {
  expect_reject(write_st("a", entry_with("dtype", "\"F12\""), std::string(8, 0)), "tensor 'w': unknown dtype 'F12'");
  expect_reject(write_st("b", entry_with("dtype", "\"f32\""), std::string(8, 0)), "unknown dtype 'f32'");
}

TEST_F(StTest, RejectsNegativeShape) {
  expect_reject(write_st("a", entry_with("shape", "[-2,-1]"), std::string(8, 0)),
                "tensor 'w': negative dimension -2 in shape [-2, -1]");
}

TEST_F(StTest, RejectsOverflowingShape) {
  expect_reject(write_st("a", entry_with("shape", "[4294967296,4294967296]"), std::string(8, 0)),
                "tensor 'w': shape [4294967296, 4294967296] has more elements than int64 can count");
  expect_reject(write_st("b", entry_with("shape", "[4611686018427387904]"), std::string(8, 0)),
                "shape [4611686018427387904] of F32 has more bytes than int64 can count");
  expect_reject(write_st("c", entry_with("shape", "[9223372036854775808]"), std::string(8, 0)),
                "shape dimension larger than int64");
  std::string many = "[1";
  for (int i = 0; i < kMaxRank; ++i) many += ",1";
  expect_reject(write_st("d", entry_with("shape", many + "]"), std::string(8, 0)), "shape has more than 64 dimensions");
}

TEST_F(StTest, RejectsBeginAfterEnd) {
  expect_reject(write_st("a", entry_with("data_offsets", "[8,0]"), std::string(8, 0)),
                "tensor 'w': data_offsets [8, 0]: begin > end");
}

TEST_F(StTest, RejectsEndBeyondFile) {
  expect_reject(write_st("a", entry_with("data_offsets", "[0,8]"), std::string(7, 0)),
                "tensor 'w': data_offsets [0, 8]: end is beyond the end of the file (the data holds 7 bytes)");
}

TEST_F(StTest, RejectsByteCountMismatch) {
  expect_reject(write_st("a", entry_with("shape", "[3]"), std::string(12, 0)),
                "tensor 'w': data_offsets [0, 8] hold 8 bytes, but shape [3] of F32 needs 12");
  expect_reject(write_st("b", entry_with("dtype", "\"BF16\""), std::string(8, 0)), "of BF16 needs 4");
}

TEST_F(StTest, RejectsOverlap) {
  expect_reject(write_st("a", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", std::string(12, 0)),
                "tensor 'b': bytes [4, 12) overlap tensor 'a' [0, 8)");
  // Contained in a long earlier tensor, after a short one: still found.
  expect_reject(write_st("b", "{\"a\":{\"dtype\":\"U8\",\"shape\":[16],\"data_offsets\":[0,16]},"
                              "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},"
                              "\"c\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[8,10]}}", std::string(16, 0)),
                "overlap tensor 'a' [0, 16)");
}

TEST_F(StTest, AcceptsHolesEmptyTensorsAndUnknownFields) {
  // a [0,8), hole [8,16), b [16,20); an empty tensor anywhere; extra fields ignored.
  const std::string f = write_st(
      "a", "{\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[16,20],\"extra\":[1,\"x\"]},"
           "\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ",
      f32_bytes({1, 2, 0, 0, 3}));
  SafetensorsFile st(f);
  EXPECT_EQ(st.names(), (std::vector<std::string>{"b", "e", "a"}));
  EXPECT_EQ(st.read_f32("a"), (std::vector<float>{1, 2}));
  EXPECT_EQ(st.read_f32("b"), (std::vector<float>{3}));
  EXPECT_TRUE(st.read_f32("e").empty());
  EXPECT_EQ(st.entry("e").numel, 0);
  EXPECT_TRUE(st.metadata().empty());
  SafetensorsFile empty(write_st("empty", "{}"));
  EXPECT_TRUE(empty.names().empty());
}

TEST_F(StTest, MessagesEscapeNames) {
  expect_reject(write_st("a", "{\"a\\nb\\u00e9\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,4]}}", std::string(4, 0)),
                "tensor 'a\\x0ab\\xc3\\xa9': unknown dtype 'X'");
}

// ---- reads ----

TEST_F(StTest, WriterRoundTripAndRangedReads) {
  const std::string file = path("m.safetensors");
  const std::vector<TensorInfo> infos{{"x", {3, 4}}, {"s", {}}, {"y", {5}}};
  {
    Writer w(file, infos, {{"step", "7"}});
    w.write_next(iota(12, 1).data(), 12);
    w.write_next(iota(1, -3).data(), 1);
    w.write_next(iota(5, 10).data(), 5);
    w.finish();
  }
  SafetensorsFile st = SafetensorsFile::open(file);
  EXPECT_EQ(st.names(), (std::vector<std::string>{"x", "s", "y"}));
  EXPECT_EQ(st.metadata().at("step"), "7");
  EXPECT_TRUE(st.has("x"));
  EXPECT_FALSE(st.has("z"));
  EXPECT_EQ(st.entry("y").begin, 52);
  EXPECT_EQ(st.entry("y").end, 72);
  EXPECT_EQ(st.entry("y").numel, 5);
  EXPECT_EQ(st.entry("y").elem_size, 4);
  EXPECT_EQ(st.bytes_read(), 0u);
  EXPECT_EQ(st.read_f32("x"), iota(12, 1));
  EXPECT_EQ(st.read_f32("s"), iota(1, -3));
  EXPECT_EQ(st.bytes_read(), 52u);
  st.reset_bytes_read();
  std::vector<float> out(4, -1);
  st.read_f32("x", 5, 4, out.data());
  EXPECT_EQ(out, (std::vector<float>{2.25f, 2.5f, 2.75f, 3.0f}));
  EXPECT_EQ(st.bytes_read(), 16u);
  st.read_f32("y", 4, 1, out.data());
  EXPECT_EQ(out[0], 11.0f);
  st.read_f32("y", 5, 0, out.data());  // empty range at the end
  EXPECT_EQ(st.bytes_read(), 20u);
  expect_input_error([&] { st.entry("z"); }, file + ": ", "no tensor 'z'");
  expect_input_error([&] { st.read_f32("y", 3, 3, out.data()); }, file + ": ",
                     "tensor 'y': elements [3, +3) are outside the tensor's 5 elements");
  expect_input_error([&] { st.read_f32("y", -1, 1, out.data()); }, file + ": ", "outside the tensor's");
  expect_input_error([&] { st.read_f32("y", 1, -1, out.data()); }, file + ": ", "outside the tensor's");
  EXPECT_EQ(st.bytes_read(), 20u);

  // Four "ranks" each read a quarter of the concatenated parameters: 1/4 of the bytes each.
  const int64_t total = 18;
  uint64_t sum = 0;
  for (int r = 0; r < 4; ++r) {
    SafetensorsFile rank(file);
    int64_t lo = total * r / 4, hi = total * (r + 1) / 4, flat = 0;
    for (const auto& n : rank.names()) {
      const int64_t numel = rank.entry(n).numel;
      const int64_t b = std::max(lo, flat), e = std::min(hi, flat + numel);
      if (b < e) {
        std::vector<float> buf(static_cast<std::size_t>(e - b));
        rank.read_f32(n, b - flat, e - b, buf.data());
      }
      flat += numel;
    }
    EXPECT_EQ(rank.bytes_read(), static_cast<uint64_t>(4 * (hi - lo)));
    sum += rank.bytes_read();
  }
  EXPECT_EQ(sum, 4u * total);
}

TEST_F(StTest, ConvertsBf16F16F64) {
  // BF16: 1, -2.5, 3.140625 (0x4049), -inf. F16: 1, -2, 65504, 2^-24 (subnormal), 0.5, +inf,
  // NaN, -0. F64: 0.1, -1e300 (rounds to -inf in float).
  const std::string bf = u16_bytes({0x3f80, 0xc020, 0x4049, 0xff80});
  const std::string hf = u16_bytes({0x3c00, 0xc000, 0x7bff, 0x0001, 0x3800, 0x7c00, 0x7e00, 0x8000});
  const double f64[2] = {0.1, -1e300};
  const std::string d64(reinterpret_cast<const char*>(f64), 16);
  const std::string f = write_st(
      "c", "{\"bf\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,8]},"
           "\"hf\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[8,24]},"
           "\"d\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[24,40]},"
           "\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[40,48]},"
           "\"__metadata__\":{\"format\":\"pt\"}}",
      bf + hf + d64 + std::string(8, 0));
  SafetensorsFile st(f);
  EXPECT_EQ(st.names(), (std::vector<std::string>{"bf", "hf", "d", "i"}));
  EXPECT_EQ(st.metadata().at("format"), "pt");
  EXPECT_EQ(st.read_f32("bf"), (std::vector<float>{1.0f, -2.5f, 3.140625f, -INFINITY}));
  EXPECT_EQ(st.bytes_read(), 8u);
  const auto h = st.read_f32("hf");
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], 65504.0f);
  EXPECT_EQ(h[3], std::ldexp(1.0f, -24));
  EXPECT_EQ(h[4], 0.5f);
  EXPECT_EQ(h[5], INFINITY);
  EXPECT_TRUE(std::isnan(h[6]));
  EXPECT_EQ(h[7], 0.0f);
  EXPECT_TRUE(std::signbit(h[7]));
  const auto dd = st.read_f32("d");
  EXPECT_EQ(dd[0], 0.1f);
  EXPECT_EQ(dd[1], -INFINITY);
  st.reset_bytes_read();
  std::vector<float> out(2);
  st.read_f32("hf", 3, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{std::ldexp(1.0f, -24), 0.5f}));
  EXPECT_EQ(st.bytes_read(), 4u);
  st.read_f32("bf", 1, 1, out.data());
  EXPECT_EQ(out[0], -2.5f);
  EXPECT_EQ(st.bytes_read(), 6u);
  EXPECT_EQ(dtype_size("BF16"), 2);
  EXPECT_EQ(dtype_size("BOOL"), 1);
  EXPECT_EQ(dtype_size("nope"), 0);
  expect_input_error([&] { st.read_f32("i"); }, f + ": ", "tensor 'i': dtype I64 cannot be read as float");
}

TEST_F(StTest, FileTruncatedAfterOpen) {
  const std::string f = write_st("t", entry_with("shape", "[2]"), f32_bytes({1, 2}));
  SafetensorsFile st(f);
  fs::resize_file(f, fs::file_size(f) - 2);
  expect_input_error([&] { st.read_f32("w"); }, f + ": ", "tensor 'w': unexpected end of file");
}

// ---- directories ----

TEST_F(StTest, CheckpointSingleFile) {
  fs::create_directories(path("m"));
  {
    Writer w(path("m/model.safetensors"), {{"a", {2}}, {"b", {3}}});
    w.write_next(iota(2, 0).data(), 2);
    w.write_next(iota(3, 5).data(), 3);
    w.finish();
  }
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(path("m"));
  EXPECT_FALSE(ck.sharded());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(ck.read_f32("b"), iota(3, 5));
  EXPECT_EQ(ck.bytes_read(), 12u);
}

TEST_F(StTest, CheckpointShardedIndex) {
  fs::create_directories(path("m"));
  {
    Writer w(path("m/model-00001-of-00002.safetensors"), {{"a", {2}}, {"b", {3}}});
    w.write_next(iota(2, 0).data(), 2);
    w.write_next(iota(3, 5).data(), 3);
    w.finish();
    Writer w2(path("m/model-00002-of-00002.safetensors"), {{"c", {4}}, {"unlisted", {1}}});
    w2.write_next(iota(4, 9).data(), 4);
    w2.write_next(iota(1, 0).data(), 1);
    w2.finish();
  }
  write_raw("m/model.safetensors.index.json",
            R"({"metadata":{"total_size":36},"weight_map":{"c":"model-00002-of-00002.safetensors",)"
            R"("b":"model-00001-of-00002.safetensors","a":"model-00001-of-00002.safetensors"}})");
  SafetensorsCheckpoint ck(path("m"));
  EXPECT_TRUE(ck.sharded());
  EXPECT_EQ(ck.files().size(), 2u);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_FALSE(ck.has("unlisted"));
  EXPECT_EQ(ck.entry("c").shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(ck.file_of("c").path(), path("m/model-00002-of-00002.safetensors"));
  std::vector<float> out(2);
  ck.read_f32("c", 2, 2, out.data());
  EXPECT_EQ(out, (std::vector<float>{9.5f, 9.75f}));
  ck.read_f32("a", 0, 1, out.data());
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(ck.bytes_read(), 12u);
  ck.reset_bytes_read();
  EXPECT_EQ(ck.bytes_read(), 0u);
  expect_input_error([&] { ck.entry("zz"); }, path("m") + ": ", "no tensor 'zz'");
}

TEST_F(StTest, CheckpointRejections) {
  fs::create_directories(path("m"));
  const std::string idx = path("m/model.safetensors.index.json");
  expect_input_error([&] { SafetensorsCheckpoint c(path("nodir")); }, path("nodir") + ": ", "not a directory");
  expect_input_error([&] { SafetensorsCheckpoint c(path("m")); }, path("m") + ": ",
                     "holds neither model.safetensors nor model.safetensors.index.json");
  {
    Writer w(path("m/one.safetensors"), {{"a", {2}}});
    w.write_next(iota(2, 0).data(), 2);
    w.finish();
  }
  auto reject = [&](const std::string& json, const std::string& fragment) {
    write_raw("m/model.safetensors.index.json", json);
    expect_input_error([&] { SafetensorsCheckpoint c(path("m")); }, idx + ": ", fragment);
  };
  reject("{\"weight_map\":", "invalid JSON");
  reject("[]", "index is not a JSON object");
  reject("{\"metadata\":{}}", "missing \"weight_map\"");
  reject("{\"weight_map\":[]}", "\"weight_map\" is not an object");
  reject("{\"weight_map\":{\"a\":1}}", "tensor 'a': file name is not a string");
  reject("{\"weight_map\":{\"a\":\"../m/one.safetensors\"}}", "must be a plain file name");
  reject("{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "must be a plain file name");
  reject("{\"weight_map\":{\"a\":\"..\"}}", "must be a plain file name");
  reject("{\"weight_map\":{\"a\":\"\"}}", "must be a plain file name");
  reject("{\"weight_map\":{\"a\":\"two.safetensors\"}}", "tensor 'a': file 'two.safetensors' does not exist");
  reject("{\"weight_map\":{\"b\":\"one.safetensors\"}}", "tensor 'b' is mapped to 'one.safetensors', which does not hold it");
  reject(std::string(1000, '[') + std::string(1000, ']'), "nested more than 16 levels");
  // A bad shard file: the error names the shard.
  write_raw("m/bad.safetensors", "xx");
  write_raw("m/model.safetensors.index.json", "{\"weight_map\":{\"a\":\"bad.safetensors\"}}");
  expect_input_error([&] { SafetensorsCheckpoint c(path("m")); }, path("m/bad.safetensors") + ": ", "shorter than");
}

// ---- writing model directories ----

TEST(ShardSize, ParsesSavePretrainedsStrings) {
  EXPECT_EQ(parse_shard_size("5GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("5GB"), kDefaultMaxShardSize);
  EXPECT_EQ(parse_shard_size("500MB"), 500'000'000);
  EXPECT_EQ(parse_shard_size("10KB"), 10'000);
  EXPECT_EQ(parse_shard_size("1KB"), 1'000);
  EXPECT_EQ(parse_shard_size("2GiB"), int64_t{2} << 30);
  EXPECT_EQ(parse_shard_size("3MiB"), int64_t{3} << 20);
  EXPECT_EQ(parse_shard_size("7KiB"), 7 * 1024);
  EXPECT_EQ(parse_shard_size("1000"), 1000);  // an integer: bytes
  EXPECT_EQ(parse_shard_size("1"), 1);
  // Units are case-insensitive; a lowercase final 'b' of KB/MB/GB means bits (transformers).
  EXPECT_EQ(parse_shard_size("2gib"), int64_t{2} << 30);
  EXPECT_EQ(parse_shard_size("2GIb"), int64_t{2} << 30);
  EXPECT_EQ(parse_shard_size("5gB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size("5Gb"), 625'000'000);
  EXPECT_EQ(parse_shard_size("500mb"), 62'500'000);
  EXPECT_EQ(parse_shard_size("1kb"), 125);
  // Python int(): spaces around the number, '+', '_' between digits.
  EXPECT_EQ(parse_shard_size("5 GB"), 5'000'000'000);
  EXPECT_EQ(parse_shard_size(" 10KB"), 10'000);
  EXPECT_EQ(parse_shard_size("+7KB"), 7'000);
  EXPECT_EQ(parse_shard_size("1_000KB"), 1'000'000);
  EXPECT_EQ(parse_shard_size("8589934591GiB"), (int64_t{8589934591} << 30));  // 2^63 - 2^30
}

TEST(ShardSize, RejectsBadValuesOnOneLineNamingTheOption) {
  for (const std::string& bad : std::vector<std::string>{"", "GB", "5XB", "5TB", "5G", "5B", "1.5GB", "5e9", "-1GB", "0", "0KB", "-0",
                                "0kb", "7b", "_1KB", "1__0KB", "1_KB", "5GB ", "five", "9223372036854775808",
                                "9999999999GB", "8589934592GiB", "5 5GB", "+"}) {
    try {
      (void)parse_shard_size(bad, "--max-shard-size");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(e.exit_code(), kExitInputError) << msg;
      EXPECT_EQ(msg.rfind("--max-shard-size: ", 0), 0u) << msg;
      if (!bad.empty()) EXPECT_NE(msg.find("\"" + escape_name(bad) + "\""), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  auto message = [](const std::string& text) {
    try {
      (void)parse_shard_size(text, "--max-shard-size");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message("5XB"),
            "--max-shard-size: \"5XB\" is not a size (expected bytes as an integer, or an integer followed by "
            "KB, MB, GB = 10^3, 10^6, 10^9 bytes or KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes, as save_pretrained's "
            "max_shard_size: \"5GB\", \"500MB\", \"2GiB\")");
  EXPECT_EQ(message("0"), "--max-shard-size: \"0\" is less than 1 byte (a shard holds at least one)");
  EXPECT_NE(message("-1GB").find("\"-1GB\" is less than 1 byte"), std::string::npos);
  EXPECT_NE(message("7b").find("\"7b\" is not a size"), std::string::npos);
  EXPECT_NE(message("GB").find("\"GB\" has no number (expected"), std::string::npos);
  EXPECT_EQ(message("9999999999GB"), "--max-shard-size: \"9999999999GB\" is more than 9223372036854775807 bytes");
  EXPECT_NE(message("8589934592GiB").find("is more than"), std::string::npos);  // 2^33 * 2^30 = 2^63
  EXPECT_EQ(message("").rfind("--max-shard-size: empty (expected bytes", 0), 0u);
  EXPECT_EQ(message("9223372036854775807"), "accepted");
}

std::vector<TensorInfo> tensors_of_bytes(const std::vector<int64_t>& bytes) {
  std::vector<TensorInfo> t;
  for (std::size_t i = 0; i < bytes.size(); ++i) t.push_back({"t" + std::to_string(i), {bytes[i] / 4}});
  return t;
}

TEST(ShardSize, AssignsInOrderAndStartsAShardWhenTheNextTensorWouldExceedTheLimit) {
  // transformers' shard_checkpoint docstring: limit 10, weights 6, 6, 2, 6, 2, 2 -> [6], [6+2], [6+2+2].
  EXPECT_EQ(assign_shards(tensors_of_bytes({24, 24, 8, 24, 8, 8}), 40), (std::vector<int>{0, 1, 1, 2, 2, 2}));
  // Exactly at the limit fits; one byte over starts a new shard.
  EXPECT_EQ(assign_shards(tensors_of_bytes({20, 20, 4}), 40), (std::vector<int>{0, 0, 1}));
  EXPECT_EQ(assign_shards(tensors_of_bytes({20, 20, 4}), 44), (std::vector<int>{0, 0, 0}));
  // A tensor larger than the limit is alone in its shard, in order (shard_checkpoint's
  // grouping; huggingface_hub would write [B], [a, c]).
  EXPECT_EQ(assign_shards(tensors_of_bytes({8, 400, 8}), 40), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(assign_shards(tensors_of_bytes({400}), 40), (std::vector<int>{0}));
  EXPECT_EQ(assign_shards(tensors_of_bytes({400, 400}), 40), (std::vector<int>{0, 1}));
  // Empty tensors cost nothing; the first tensor never starts a second shard.
  EXPECT_EQ(assign_shards(tensors_of_bytes({0, 40, 0, 4}), 40), (std::vector<int>{0, 0, 0, 1}));
  EXPECT_TRUE(assign_shards({}, 40).empty());
  EXPECT_EQ(assign_shards(tensors_of_bytes({4, 4, 4}), 1), (std::vector<int>{0, 1, 2}));
  EXPECT_THROW(assign_shards(tensors_of_bytes({4}), 0), Error);
  EXPECT_EQ(shard_file_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_EQ(shard_file_name(99999, 100000), "model-100000-of-100000.safetensors");
  for (const std::string ok : {"model-00001-of-00003.safetensors", "model-100000-of-100000.safetensors"})
    EXPECT_TRUE(is_shard_file_name(ok)) << ok;
  for (const std::string no : {"model.safetensors", "model-0001-of-00003.safetensors", "model-00001-of-00003.bin",
                               "model-00001-of-00003.safetensors.tmp", "xmodel-00001-of-00003.safetensors",
                               "model-00001-00003.safetensors", "model-0000a-of-00003.safetensors",
                               "model-00001-of-00003.safetensorsx", "tokenizer.json"})
    EXPECT_FALSE(is_shard_file_name(no)) << no;
}

// A model directory to write into: tensors "t<i>" of `numel[i]` elements, tensor i's element k
// = 1000 * i + k + `base` (so two saves differ everywhere).
class ModelDirTest : public StTest {
 protected:
  static std::vector<TensorInfo> infos(const std::vector<int64_t>& numel) {
    std::vector<TensorInfo> t;
    for (std::size_t i = 0; i < numel.size(); ++i) t.push_back({"t" + std::to_string(i), {numel[i]}});
    return t;
  }
  static std::vector<float> values(std::size_t i, int64_t n, float base) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (int64_t k = 0; k < n; ++k) v[static_cast<std::size_t>(k)] = base + 1000.0f * static_cast<float>(i) + static_cast<float>(k);
    return v;
  }
  // Writes a complete save into `dir`; returns its files.
  std::vector<std::string> save(const std::string& dir, const std::vector<int64_t>& numel, int64_t max, float base,
                                const std::map<std::string, std::string>& meta = {}) const {
    ModelWriter w(dir, infos(numel), max, meta);
    for (std::size_t i = 0; i < numel.size(); ++i) w.write_next(values(i, numel[i], base).data(), numel[i]);
    w.finish();
    return w.files();
  }
  // Every tensor of `dir` (through the reader, index or not) equals save(..., base)'s.
  void expect_loads(const std::string& dir, const std::vector<int64_t>& numel, float base) const {
    SafetensorsCheckpoint ck(dir);
    ASSERT_EQ(ck.names().size(), numel.size());
    for (std::size_t i = 0; i < numel.size(); ++i)
      EXPECT_EQ(ck.read_f32("t" + std::to_string(i)), values(i, numel[i], base)) << dir << " t" << i;
  }
  std::vector<std::string> listing(const std::string& dir) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(ModelDirTest, AtOrBelowTheLimitOneModelSafetensors) {
  fs::create_directories(path("m"));
  // 10 + 20 + 5 floats = 140 bytes: a limit of exactly 140 keeps one file.
  const auto files = save(path("m"), {10, 20, 5}, 140, 0);
  EXPECT_EQ(files, std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(listing(path("m")), std::vector<std::string>{"model.safetensors"});
  SafetensorsFile f(path("m/model.safetensors"));
  EXPECT_EQ(f.metadata().at("format"), "pt");
  expect_loads(path("m"), {10, 20, 5}, 0);
}

TEST_F(ModelDirTest, AboveTheLimitShardsWithAnIndexLikeSavePretrained) {
  fs::create_directories(path("m"));
  // Bytes 40, 80, 20, 8, 400 (larger than the limit), 4 with a limit of 100:
  // [t0] (40 + 80 > 100), [t1 t2] (exactly 100), [t3], [t4] alone, [t5] (400 + 4 > 100).
  const std::vector<int64_t> numel{10, 20, 5, 2, 100, 1};
  const auto files = save(path("m"), numel, 100, 0, {{"step", "9"}});
  const std::vector<std::string> want{"model-00001-of-00005.safetensors", "model-00002-of-00005.safetensors",
                                      "model-00003-of-00005.safetensors", "model-00004-of-00005.safetensors",
                                      "model-00005-of-00005.safetensors"};
  EXPECT_EQ(files, want);
  std::vector<std::string> all = want;
  all.push_back("model.safetensors.index.json");
  EXPECT_EQ(listing(path("m")), all);
  // The index: save_pretrained's JSON (sorted keys, 2-space indent, final newline).
  std::ifstream in(path("m/model.safetensors.index.json"));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text,
            "{\n  \"metadata\": {\n    \"total_size\": 552\n  },\n  \"weight_map\": {\n"
            "    \"t0\": \"model-00001-of-00005.safetensors\",\n    \"t1\": \"model-00002-of-00005.safetensors\",\n"
            "    \"t2\": \"model-00002-of-00005.safetensors\",\n    \"t3\": \"model-00003-of-00005.safetensors\",\n"
            "    \"t4\": \"model-00004-of-00005.safetensors\",\n    \"t5\": \"model-00005-of-00005.safetensors\"\n  }\n}\n");
  // Each shard: a safetensors file with {"format": "pt"} (and the caller's metadata), its
  // tensors in order, data within the limit except the lone large tensor.
  const std::vector<std::vector<std::string>> held{{"t0"}, {"t1", "t2"}, {"t3"}, {"t4"}, {"t5"}};
  for (std::size_t k = 0; k < want.size(); ++k) {
    SafetensorsFile f(path("m/" + want[k]));
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("step"), "9");
    EXPECT_EQ(f.names(), held[k]);
    EXPECT_EQ(f.header_size() % 8, 0u);
    const uint64_t data = f.file_size() - 8 - f.header_size();
    if (held[k] != std::vector<std::string>{"t4"}) {
      EXPECT_LE(data, 100u);
    } else {
      EXPECT_EQ(data, 400u);
    }
  }
  SafetensorsCheckpoint ck(path("m"));
  EXPECT_TRUE(ck.sharded());
  expect_loads(path("m"), numel, 0);
}

TEST_F(ModelDirTest, ASaveReplacesThePreviousOnesFilesOnlyOnceItIsComplete) {
  const std::string m = path("m");
  fs::create_directories(m);
  write_raw("m/tokenizer.json", "{}");
  write_raw("m/model-00001-of-00001.bin", "x");  // not ours: kept
  // Single -> sharded (3): model.safetensors goes.
  save(m, {10, 10}, 1000, 0);
  EXPECT_EQ(save(m, {10, 10, 10}, 40, 1).size(), 3u);
  EXPECT_FALSE(fs::exists(m + "/model.safetensors"));
  expect_loads(m, {10, 10, 10}, 1);
  // Sharded (3) -> sharded (2): the third old shard goes; the index is the new one.
  EXPECT_EQ(save(m, {20, 10}, 80, 2).size(), 2u);
  EXPECT_FALSE(fs::exists(m + "/model-00003-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(m + "/model-00001-of-00003.safetensors"));
  expect_loads(m, {20, 10}, 2);
  // Sharded (2) -> sharded (2), same names (the old index is removed before the renames).
  EXPECT_EQ(save(m, {20, 10}, 80, 3).size(), 2u);
  expect_loads(m, {20, 10}, 3);
  // Sharded -> single: the index and every shard go.
  save(m, {20, 10}, 1000, 4);
  expect_loads(m, {20, 10}, 4);
  EXPECT_EQ(listing(m), (std::vector<std::string>{"model-00001-of-00001.bin", "model.safetensors", "tokenizer.json"}));
  // Leftover temporaries of an earlier crash go too.
  write_raw("m/model-00002-of-00007.safetensors.tmp", "x");
  write_raw("m/model-00002-of-00007.safetensors", "x");
  write_raw("m/model.safetensors.index.json.tmp", "x");
  EXPECT_EQ(save(m, {20, 10}, 80, 5).size(), 2u);
  EXPECT_EQ(listing(m), (std::vector<std::string>{"model-00001-of-00001.bin", "model-00001-of-00002.safetensors",
                                                  "model-00002-of-00002.safetensors", "model.safetensors.index.json",
                                                  "tokenizer.json"}));
  expect_loads(m, {20, 10}, 5);
}

TEST_F(ModelDirTest, UntilFinishThePreviousSaveIsWhatLoadsAndAnAbandonedSaveLeavesNoTrace) {
  const std::string m = path("m");
  fs::create_directories(m);
  save(m, {20, 10, 10}, 80, 0);  // 2 shards
  const auto before = listing(m);
  {
    ModelWriter w(m, infos({20, 10, 10}), 80);  // same names as the files in place
    for (std::size_t i = 0; i < 3; ++i) w.write_next(values(i, i ? 10 : 20, 7).data(), i ? 10 : 20);
    // Every shard is complete under its temporary name; nothing published yet.
    EXPECT_TRUE(fs::exists(m + "/model-00001-of-00002.safetensors.tmp"));
    expect_loads(m, {20, 10, 10}, 0);
  }  // destroyed without finish(): an exception on the way
  EXPECT_EQ(listing(m), before);
  expect_loads(m, {20, 10, 10}, 0);
  {
    ModelWriter w(m, infos({20, 10, 10}), 1000);  // single file, abandoned half-way
    w.write_next(values(0, 20, 7).data(), 20);
  }
  EXPECT_EQ(listing(m), before);
  expect_loads(m, {20, 10, 10}, 0);
  // Misuse is an error, not a half save.
  ModelWriter w(m, infos({20, 10}), 80);
  w.write_next(values(0, 20, 7).data(), 20);
  EXPECT_THROW(w.finish(), Error);
  EXPECT_THROW(w.write_next(values(1, 3, 7).data(), 3), Error);
  EXPECT_THROW((void)ModelWriter(m, {{"a", {1}}, {"a", {2}}}, 80), Error);  // a name twice, across shards
  EXPECT_THROW((void)ModelWriter(m, infos({1}), 0), Error);
}

// The file-size limit (RLIMIT_FSIZE) makes a write fail midway, as a full disk does.
TEST_F(ModelDirTest, AWriteFailureMidwayLeavesThePreviousSave) {
  const std::string m = path("m");
  fs::create_directories(m);
  save(m, {1000, 1000}, 1'000'000, 0);  // model.safetensors, 8000 bytes of data
  const auto before = listing(m);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* old_handler = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = 6000;  // the first shard (4000 bytes + header) fits, the second does not
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  std::string what;
  try {
    ModelWriter w(m, infos({1000, 1000, 2000}), 4000);
    for (std::size_t i = 0; i < 3; ++i) {
      const int64_t n = i == 2 ? 2000 : 1000;
      w.write_next(values(i, n, 9).data(), n);
    }
    w.finish();
  } catch (const Error& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(what.find("model-00003-of-00003.safetensors: write failed"), std::string::npos) << what;
  EXPECT_NE(what.find("File too large"), std::string::npos) << what;
  EXPECT_EQ(listing(m), before);
  expect_loads(m, {1000, 1000}, 0);
}

}  // namespace
