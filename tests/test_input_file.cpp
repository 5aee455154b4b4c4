// tests/test_input_file.cpp: fsdp_prepare's compressed inputs (fsdp/data/input_file.hpp).
// gzip, zstd and xz files written here with zlib, libzstd and liblzma read back as the text
// they hold (one member, frame or stream, several, skippable frames, across the reader's
// 256 KiB chunks); every proper prefix of a compressed file and every corrupted byte is an
// InputError naming the file or, where the format cannot tell (gzip's header time stamp), the
// same text: never other text; bzip2, zip, 7z and lz4 files are refused by name;
// fsdp_prepare's byte, pairs and tokenizer paths give the plain file's output for its
// compressed copies.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fsdp/core/error.hpp"
#include "temp_dir.hpp"
#include "fsdp/core/rng.hpp"
#include "fsdp/data/input_file.hpp"
#include "fsdp/data/prepare.hpp"
#include "fsdp/h5/hdf5.hpp"
#include "compress_util.hpp"

namespace fs = std::filesystem;
using fsdp::data::Compression;
using fsdp::data::InputFile;

namespace {

using test_util::TempDir;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Lines of pseudo-random words: text that compresses like text, `bytes` long or more.
std::string corpus(std::size_t bytes, uint64_t seed) {
  static const char* words[] = {"the", "fortune", "cookie", "says", "über", "naïve", "FSDP",
                                "shard", "gradient", "{\"text\":", "\\n", "42", "zstd"};
  std::string s;
  for (uint64_t i = 0; s.size() < bytes; ++i) {
    const uint64_t r = fsdp::rng::bits(seed, 0, i);
    s += words[r % (sizeof(words) / sizeof(words[0]))];
    s += (r >> 32) % 9 == 0 ? '\n' : ' ';
  }
  return s;
}

std::string read_all(const std::string& path) {
  InputFile f(path);
  return std::string(std::istreambuf_iterator<char>(f.stream()), std::istreambuf_iterator<char>());
}

// The InputError (exit 2) reading `path` throws; "" when it reads to the end.
std::string read_error(const std::string& path, std::string* text = nullptr) {
  try {
    const std::string t = read_all(path);
    if (text) *text = t;
    return "";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), 2) << e.what();
    return e.what();
  }
}

}  // namespace

TEST(InputFile, ReadsPlainGzipAndZstdAlike) {
  TempDir d("alike");
  const std::string text = corpus(700000, 1);  // the reader's 256 KiB chunks, three times
  const std::string a = text.substr(0, 300000), b = text.substr(300000);
  struct Case {
    const char* name;
    std::string bytes;
    Compression kind;
  };
  const std::vector<Case> cases = {
      {"plain.txt", text, Compression::none},
      {"one.gz", gzip(text), Compression::gzip},
      {"stored.gz", gzip(text, 0), Compression::gzip},  // level 0: stored blocks
      {"members.gz", gzip(a) + gzip("") + gzip(b), Compression::gzip},  // cat a.gz b.gz; pigz
      {"one.zst", zstd(text), Compression::zstd},
      {"frames.zst", zstd(a, false) + skippable_frame("index") + zstd(b), Compression::zstd},
      {"skippable_first.zst", skippable_frame("") + zstd(text), Compression::zstd},
      {"one.xz", xz(text), Compression::xz},
      {"streams.xz", xz(a) + xz(b), Compression::xz},  // cat a.xz b.xz
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = d.file(c.name);
    write_file(path, c.bytes);
    InputFile f(path);
    EXPECT_EQ(f.compression(), c.kind);
    EXPECT_EQ(f.path(), fs::path(path));
    // Read as fsdp_prepare does: lines (getline) after a first chunk read with read().
    std::string got(1000, '\0');
    f.stream().read(got.data(), 1000);
    got.resize(static_cast<std::size_t>(f.stream().gcount()));
    std::string line;
    while (std::getline(f.stream(), line)) got += line + (f.stream().eof() ? "" : "\n");
    EXPECT_EQ(got.size(), text.size());
    EXPECT_TRUE(got == text);
    EXPECT_EQ(f.disk_bytes_read(), static_cast<int64_t>(c.bytes.size()));
  }
  write_file(d.file("empty"), "");
  EXPECT_EQ(read_all(d.file("empty")), "");
  EXPECT_EQ(InputFile(d.file("empty")).compression(), Compression::none);
  EXPECT_STREQ(fsdp::data::compression_name(Compression::zstd), "zstd");
}

// Any file cut short inside a member or frame (a copy interrupted, a full disk) is an error
// naming the file, at every cut point: never the text decoded so far taken for all of it.
TEST(InputFile, EveryCutShortFileIsAnError) {
  TempDir d("cut");
  const std::string text = corpus(3000, 2);
  // (from the magic number's length on: a shorter prefix is no longer of the format)
  for (const auto& [name, bytes, magic] :
       {std::tuple<std::string, std::string, std::size_t>{"t.gz", gzip(text), 3},
        {"t.zst", zstd(text), 4}, {"nosum.zst", zstd(text, false), 4}, {"t.xz", xz(text), 6}}) {
    SCOPED_TRACE(name);
    const std::string path = d.file(name);
    int errors = 0;
    for (std::size_t cut = magic; cut < bytes.size(); ++cut) {
      write_file(path, bytes.substr(0, cut));
      const std::string e = read_error(path);
      ASSERT_NE(e, "") << "cut at " << cut << " of " << bytes.size() << " read without an error";
      EXPECT_NE(e.find(path), std::string::npos) << e;
      EXPECT_NE(e.find("damaged or was cut short"), std::string::npos) << e;
      ++errors;
    }
    EXPECT_EQ(errors, static_cast<int>(bytes.size() - magic));
    write_file(path, bytes);
    std::string whole;
    EXPECT_EQ(read_error(path, &whole), "");
    EXPECT_TRUE(whole == text);
  }
  // The message says where: a gzip member and a zstd frame cut at byte 500.
  ASSERT_GT(gzip(text).size(), 600u);
  ASSERT_GT(zstd(text).size(), 600u);
  write_file(d.file("c.gz"), gzip(text).substr(0, 500));
  EXPECT_NE(read_error(d.file("c.gz")).find("gzip data ends inside a member at compressed byte 500 "),
            std::string::npos) << read_error(d.file("c.gz"));
  write_file(d.file("c.zst"), zstd(text).substr(0, 500));
  EXPECT_NE(read_error(d.file("c.zst")).find("zstd data ends inside a frame at compressed byte 500 "),
            std::string::npos) << read_error(d.file("c.zst"));
  write_file(d.file("c.xz"), xz(text).substr(0, 500));
  EXPECT_NE(read_error(d.file("c.xz")).find("xz data ends inside a stream at compressed byte 500 "),
            std::string::npos) << read_error(d.file("c.xz"));
  // Cut exactly between two members, or between two frames, is two whole files: no error.
  write_file(d.file("two.gz"), gzip(text) + gzip(text));
  EXPECT_EQ(read_all(d.file("two.gz")), text + text);
}

// A byte changed anywhere after the magic number gives an error or, where the format does not
// cover it (gzip's time stamp and OS bytes), the same text: never different text. zstd with
// its checksum (the `zstd` command's default). (A damaged magic number makes the file another
// format's: it is then read as plain bytes, which the tokenizers refuse unless it is UTF-8.)
TEST(InputFile, CorruptBytesNeverChangeTheTextSilently) {
  TempDir d("corrupt");
  const std::string text = corpus(2000, 3);
  for (const auto& [name, bytes, magic] :
       {std::tuple<std::string, std::string, std::size_t>{"t.gz", gzip(text), 3},
        {"t.zst", zstd(text), 4}, {"t.xz", xz(text), 6}}) {
    SCOPED_TRACE(name);
    const std::string path = d.file(name);
    int errors = 0;
    for (std::size_t at = magic; at < bytes.size(); ++at) {
      for (const unsigned char flip : {0x01, 0x80}) {
        std::string bad = bytes;
        bad[at] = static_cast<char>(static_cast<unsigned char>(bad[at]) ^ flip);
        write_file(path, bad);
        std::string got;
        const std::string e = read_error(path, &got);
        if (e.empty()) {
          ASSERT_TRUE(got == text) << "byte " << at << " ^ " << int{flip} << " changed the text silently";
        } else {
          ++errors;
        }
      }
    }
    // Every change is caught but 13 of gzip's header: its time stamp, XFL and OS bytes (2
    // flips each) and the FTEXT flag, which no reader checks (xz's header, blocks and index
    // each have their CRC).
    EXPECT_GE(errors, 2 * static_cast<int>(bytes.size() - magic) - 13);
  }
  // Bytes after the last member that are not another member.
  write_file(d.file("g.gz"), gzip(text) + "trailing\n");
  const std::string e = read_error(d.file("g.gz"));
  EXPECT_NE(e.find(d.file("g.gz")), std::string::npos) << e;
  EXPECT_NE(e.find("gzip incorrect header check"), std::string::npos) << e;
  write_file(d.file("g.zst"), zstd(text) + "trailing\n");
  EXPECT_NE(read_error(d.file("g.zst")).find("zstd: "), std::string::npos);
}

TEST(InputFile, OtherCompressionsAreRefusedByName) {
  TempDir d("foreign");
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"a.bz2", std::string("BZh91AY&SY\x01\x02", 12), "bzip2-compressed"},
      {"a.zip", std::string("PK\x03\x04\x14\x00", 6), "zip-compressed"},
      {"a.7z", std::string("7z\xBC\xAF\x27\x1C\x00\x04", 8), "7z-compressed"},
      {"a.lz4", std::string("\x04\x22\x4D\x18\x64\x40", 6), "lz4-compressed"},
  };
  for (const auto& [name, bytes, what] : cases) {
    write_file(d.file(name), bytes);
    const std::string e = read_error(d.file(name));
    EXPECT_NE(e.find(d.file(name) + ": " + what), std::string::npos) << e;
    EXPECT_NE(e.find("decompress it first"), std::string::npos) << e;
  }
  // Text that merely starts like one is text.
  write_file(d.file("bz.txt"), "BZh9 is not a bzip2 header\n");
  EXPECT_EQ(read_all(d.file("bz.txt")), "BZh9 is not a bzip2 header\n");
  // A missing file, and a read error (read(2) on a folder: EISDIR).
  EXPECT_NE(read_error(d.file("missing")).find(d.file("missing") + ": cannot read input file"),
            std::string::npos);
  fs::create_directories(d.file("folder"));
  EXPECT_NE(read_error(d.file("folder")).find("error while reading input file"), std::string::npos);
}

// fsdp_prepare reads a corpus's compressed copies as the plain files: bytes mode over a folder
// of .gz / .zst / plain files, and the seq2seq pairs file.
TEST(InputFile, PrepareReadsCompressedCopiesAsThePlainFiles) {
  TempDir d("prepare");
  const std::string a = corpus(50000, 4), b = corpus(30000, 5), c = corpus(20000, 6);
  fs::create_directories(d.file("plain"));
  fs::create_directories(d.file("packed"));
  write_file(d.file("plain/a.txt"), a);
  write_file(d.file("plain/b.txt"), b);
  write_file(d.file("plain/c.txt"), c);
  write_file(d.file("packed/a.txt"), gzip(a));  // names sort the same: a, b, c
  write_file(d.file("packed/b.txt"), zstd(b));
  write_file(d.file("packed/c.txt"), c);
  const auto s1 = fsdp::data::prepare_byte_dataset({d.file("plain")}, d.file("plain.h5"), 0.1);
  const auto s2 = fsdp::data::prepare_byte_dataset({d.file("packed")}, d.file("packed.h5"), 0.1);
  EXPECT_EQ(s1.train_tokens, s2.train_tokens);
  EXPECT_EQ(s1.val_tokens, s2.val_tokens);
  auto tokens = [](const std::string& path, const char* split) {
    auto f = fsdp::h5::File::open_read(path);
    const auto n = f.dims(split).at(0);
    std::vector<int32_t> t(static_cast<std::size_t>(n));
    f.read_i32(split, t.data(), 0, n);
    return t;
  };
  EXPECT_EQ(tokens(d.file("plain.h5"), "/train/tokens"), tokens(d.file("packed.h5"), "/train/tokens"));
  EXPECT_EQ(tokens(d.file("plain.h5"), "/val/tokens"), tokens(d.file("packed.h5"), "/val/tokens"));

  const std::string tsv = "cat\tchat\ndog\tchien\r\nbird\toiseau\nfish\tpoisson\n";
  write_file(d.file("pairs.tsv"), tsv);
  write_file(d.file("pairs.tsv.gz"), gzip(tsv));
  const auto p1 = fsdp::data::read_pairs_tsv(d.file("pairs.tsv"));
  const auto p2 = fsdp::data::read_pairs_tsv(d.file("pairs.tsv.gz"));
  EXPECT_EQ(p2.size(), 4);
  EXPECT_EQ(p1.inputs, p2.inputs);
  EXPECT_EQ(p1.targets, p2.targets);
  // A damaged file stops the run before anything is written.
  write_file(d.file("packed/b.txt"), zstd(b).substr(0, 5000));
  try {
    fsdp::data::prepare_byte_dataset({d.file("packed")}, d.file("cut.h5"), 0.1);
    ADD_FAILURE() << "expected an InputError";
  } catch (const fsdp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(d.file("packed/b.txt") + ": zstd data ends inside a frame"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(d.file("cut.h5")));
  EXPECT_FALSE(fs::exists(d.file("cut.h5.tmp")));
}
