// Token files of llm.c and nanoGPT: header checks and a sequential id-checking reader
// (fsdp/data/tokenizer.hpp; formats described there and in docs/data.md).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "fsdp/core/error.hpp"
#include "fsdp/data/tokenizer.hpp"

namespace fs = std::filesystem;

namespace fsdp::data {

namespace {

int32_t le_i32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t{p[0]} | (uint32_t{p[1]} << 8) | (uint32_t{p[2]} << 16) |
                              (uint32_t{p[3]} << 24));
}

// Reads up to `n` bytes at `offset` (fewer only at the end of the file). Returns the count.
int64_t pread_full(int fd, unsigned char* out, int64_t n, int64_t offset) {
  int64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, out + done, static_cast<std::size_t>(n - done), offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += r;
  }
  return done;
}

const char* kExpectedLlmc =
    "expected version 1 with magic 20240520 (llm.c gpt-2, uint16) or version 7 with magic 20240801 "
    "(llm.c llama-3, uint32)";

}  // namespace

TokenFileFormat parse_token_file_format(const std::string& name) {
  if (name == "llmc") return TokenFileFormat::llmc;
  if (const auto f = enum_from_name<TokenFileFormat>(name)) return *f;
  throw InputError("--token-format: '" + printable(name, 64) + "' (expected " +
                   enum_name_list<TokenFileFormat>() + ")");
}

std::string to_string(TokenFileFormat format) { return enum_name(format); }

std::string TokenFileInfo::kind() const { return format == TokenFileFormat::llmc ? "llm.c" : "nanogpt"; }

std::string TokenFileInfo::describe() const {
  if (format == TokenFileFormat::nanogpt) return "nanogpt (raw uint16)";
  return std::string("llm.c ") + (magic == kLlmcMagicGpt2 ? "gpt-2" : "llama-3") + " (magic " +
         std::to_string(magic) + ", version " + std::to_string(version) + ", " +
         (token_bytes == 2 ? "uint16" : "uint32") + ")";
}

TokenFileInfo inspect_token_file(const std::string& path, TokenFileFormat format) {
  const std::string p = printable(path);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // stat before open: a FIFO would block
  if (ec || !fs::exists(st)) {
    throw InputError(p + ": token file not found (expected an llm.c data file or a nanoGPT .bin)");
  }
  if (!fs::is_regular_file(st)) {
    throw InputError(p + ": token file is " +
                     (fs::is_directory(st) ? std::string("a directory") : std::string("not a regular file")) +
                     " (expected a regular file: an llm.c data file or a nanoGPT .bin)");
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(p + ": cannot open token file (" + std::strerror(errno) + ")");
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) {
    const int err = errno;
    ::close(fd);
    throw InputError(p + ": cannot stat token file (" + std::strerror(err) + ")");
  }
  const int64_t size = sb.st_size;
  unsigned char head[kLlmcHeaderBytes] = {};
  const int64_t got = pread_full(fd, head, std::min<int64_t>(size, kLlmcHeaderBytes), 0);
  const int err = errno;
  ::close(fd);
  if (got < 0) throw InputError(p + ": cannot read token file (" + std::strerror(err) + ")");

  TokenFileInfo info;
  info.path = path;
  if (size == 0) {
    throw InputError(p + ": empty token file (expected an llm.c data file or a nanoGPT .bin of uint16 tokens)");
  }
  const bool has_magic = got >= 4;
  const int32_t magic = has_magic ? le_i32(head) : 0;
  if (format == TokenFileFormat::auto_detect && has_magic && magic == kLlmcMagicEval) {
    throw InputError(p + ": an llm.c eval file (magic 20240522: multiple-choice examples), not a token stream "
                         "(expected an llm.c data file or a nanoGPT .bin)");
  }
  const bool llmc = format == TokenFileFormat::llmc ||
                    (format == TokenFileFormat::auto_detect && has_magic &&
                     (magic == kLlmcMagicGpt2 || magic == kLlmcMagicLlama3));
  if (!llmc) {
    if (size % 2 != 0) {
      throw InputError(p + ": odd byte length " + std::to_string(size) +
                       " (a nanoGPT .bin holds uint16 tokens, 2 bytes each; an llm.c file starts with magic "
                       "20240520 or 20240801)");
    }
    info.format = TokenFileFormat::nanogpt;
    info.token_bytes = 2;
    info.data_offset = 0;
    info.num_tokens = size / 2;
    return info;
  }
  if (!has_magic) {
    throw InputError(p + ": truncated llm.c header: " + std::to_string(size) +
                     " bytes (expected a header of 256 int32 = 1024 bytes, then the tokens)");
  }
  if (magic != kLlmcMagicGpt2 && magic != kLlmcMagicLlama3) {
    throw InputError(p + ": bad magic " + std::to_string(magic) + " in the llm.c header (" +
                     (magic == kLlmcMagicEval ? std::string("20240522 is an llm.c eval file; ") : std::string()) +
                     "expected 20240520 or 20240801 as the first little-endian int32 of an llm.c data file)");
  }
  if (size < kLlmcHeaderBytes) {
    throw InputError(p + ": truncated llm.c header: " + std::to_string(size) +
                     " bytes (expected a header of 256 int32 = 1024 bytes, then the tokens)");
  }
  info.format = TokenFileFormat::llmc;
  info.magic = magic;
  info.version = le_i32(head + 4);
  const int32_t want_version = magic == kLlmcMagicGpt2 ? 1 : 7;
  if (info.version != want_version) {
    throw InputError(p + ": llm.c header has version " + std::to_string(info.version) + " with magic " +
                     std::to_string(magic) + " (" + kExpectedLlmc + ")");
  }
  info.token_bytes = magic == kLlmcMagicGpt2 ? 2 : 4;
  info.data_offset = kLlmcHeaderBytes;
  const int64_t count = le_i32(head + 8);
  if (count < 1) {
    throw InputError(p + ": llm.c header says " + std::to_string(count) + " tokens (expected at least 1)");
  }
  const int64_t expected = kLlmcHeaderBytes + count * info.token_bytes;
  if (expected != size) {
    throw InputError(p + ": llm.c header says " + std::to_string(count) + " tokens (1024 + " +
                     std::to_string(count) + " * " + std::to_string(info.token_bytes) + " = " +
                     std::to_string(expected) + " bytes) but the file has " + std::to_string(size) +
                     " bytes (truncated or not an llm.c data file)");
  }
  info.num_tokens = count;
  return info;
}

TokenFileReader::TokenFileReader(const TokenFileInfo& info, int64_t vocab_size)
    : info_(info), vocab_size_(vocab_size) {
  fd_ = ::open(info.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(printable(info.path) + ": cannot open token file (" + std::strerror(errno) + ")");
}

TokenFileReader::~TokenFileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFileReader::read(int64_t count, int32_t* out) {
  if (count < 0 || count > remaining()) {
    throw Error(printable(info_.path) + ": read of " + std::to_string(count) + " tokens with " +
                std::to_string(remaining()) + " left");
  }
  const int tb = info_.token_bytes;
  const int64_t bytes = count * tb;
  buf_.resize(static_cast<std::size_t>(bytes));
  const int64_t offset = info_.data_offset + position_ * tb;
  const int64_t got = pread_full(fd_, buf_.data(), bytes, offset);
  if (got < 0) {
    throw InputError(printable(info_.path) + ": error while reading token file (" + std::strerror(errno) + ")");
  }
  if (got != bytes) {
    throw InputError(printable(info_.path) + ": file ended early at byte " + std::to_string(offset + got) +
                     " (expected " + std::to_string(info_.data_offset + info_.num_tokens * tb) +
                     " bytes; was it changed while being read?)");
  }
  const unsigned char* b = buf_.data();
  for (int64_t i = 0; i < count; ++i) {
    const unsigned char* q = b + i * tb;
    const uint32_t id = tb == 2 ? (uint32_t{q[0]} | (uint32_t{q[1]} << 8))
                                : (uint32_t{q[0]} | (uint32_t{q[1]} << 8) | (uint32_t{q[2]} << 16) |
                                   (uint32_t{q[3]} << 24));
    if (static_cast<int64_t>(id) >= vocab_size_) {
      const int64_t pos = position_ + i;
      throw InputError(printable(info_.path) + ": token " + std::to_string(id) + " at position " +
                       std::to_string(pos) + " (byte offset " + std::to_string(info_.data_offset + pos * tb) +
                       ") is >= --vocab-size " + std::to_string(vocab_size_) +
                       " (expected ids in [0, " + std::to_string(vocab_size_) +
                       "): give the tokenizer's vocabulary size, e.g. 50257 for GPT-2, 128256 for Llama 3)");
    }
    out[i] = static_cast<int32_t>(id);
  }
  position_ += count;
}

}  // namespace fsdp::data
