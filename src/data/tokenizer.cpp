// SentencePiece models, file digests and the HDF5 tokenizer record (fsdp/data/tokenizer.hpp).
#include "fsdp/data/tokenizer.hpp"

#include <sentencepiece_processor.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "fsdp/core/error.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fs = std::filesystem;

namespace fsdp::data {

// ---------------------------------------------------------------- SHA-256 (FIPS 180-4)

namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes (FIPS
// 180-4, 4.2.2).
constexpr std::array<uint32_t, 64> kSha256K = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// One 64-byte block into the state (FIPS 180-4, 6.2.2).
void sha256_block(std::array<uint32_t, 8>& h, const unsigned char* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = (uint32_t{p[4 * t]} << 24) | (uint32_t{p[4 * t + 1]} << 16) | (uint32_t{p[4 * t + 2]} << 8) |
           uint32_t{p[4 * t + 3]};
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kSha256K[t] + w[t];
    const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

}  // namespace

std::string sha256_hex(std::string_view bytes) {
  std::array<uint32_t, 8> h = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                               0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) sha256_block(h, p + i);
  // Padding: 0x80, zeros, the message length in bits as a big-endian uint64.
  unsigned char tail[128] = {};
  const std::size_t rest = n - i;
  std::memcpy(tail, p + i, rest);
  tail[rest] = 0x80;
  const std::size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
  const uint64_t bits = static_cast<uint64_t>(n) * 8;
  for (int b = 0; b < 8; ++b) tail[tail_len - 1 - b] = static_cast<unsigned char>(bits >> (8 * b));
  for (std::size_t off = 0; off < tail_len; off += 64) sha256_block(h, tail + off);
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint32_t v : h) {
    for (int s = 28; s >= 0; s -= 4) out += hex[(v >> s) & 0xf];
  }
  return out;
}

std::string read_whole_file(const std::string& path, const std::string& what_it_is) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);  // stat before open: a FIFO would block
  if (ec || !fs::exists(st)) {
    throw InputError(printable(path) + ": " + what_it_is + " not found (expected an existing regular file)");
  }
  if (!fs::is_regular_file(st)) {
    throw InputError(printable(path) + ": " + what_it_is + " is " +
                     (fs::is_directory(st) ? std::string("a directory") : std::string("not a regular file")) +
                     " (expected a regular file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(printable(path) + ": cannot read " + what_it_is + " (" + std::strerror(errno) + ")");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(printable(path) + ": error while reading " + what_it_is);
  return bytes;
}

// ---------------------------------------------------------------- SentencePiece

struct SentencePieceTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_path) : path_(model_path) {
  auto impl = std::make_shared<Impl>();
  const std::string bytes = read_whole_file(model_path, "tokenizer model");
  if (bytes.empty()) {
    throw InputError(printable(model_path) + ": tokenizer model is empty (expected a SentencePiece .model file)");
  }
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) {
    // The library's message names its source line; a parse failure is said plainly.
    const std::string why = std::string(status.message()).find("ParseFromArray") != std::string::npos
                                ? std::string("its bytes do not parse as a sentencepiece ModelProto")
                                : "sentencepiece: " + printable(status.ToString(), 300);
    throw InputError(printable(model_path) + ": not a SentencePiece model (" + why +
                     "; expected a .model file such as Llama 2's tokenizer.model; for a tiktoken file such as Llama "
                     "3's original tokenizer.model, give the model's tokenizer.json instead)");
  }
  if (impl->sp.GetPieceSize() < 1) {
    throw InputError(printable(model_path) + ": SentencePiece model has no pieces (expected a trained model)");
  }
  model_bytes_ = static_cast<int64_t>(bytes.size());
  sha256_ = sha256_hex(bytes);
  impl_ = std::move(impl);
}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::unique_ptr<TextTokenizer> SentencePieceTokenizer::clone_for_thread() const {
  std::unique_ptr<SentencePieceTokenizer> copy(new SentencePieceTokenizer());
  copy->impl_ = impl_;
  copy->path_ = path_;
  copy->sha256_ = sha256_;
  copy->model_bytes_ = model_bytes_;
  return copy;
}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }
int32_t SentencePieceTokenizer::bos_id() const { return impl_->sp.bos_id(); }
int32_t SentencePieceTokenizer::eos_id() const { return impl_->sp.eos_id(); }

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out,
                                    const std::string& where) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) {
    throw InputError(where + ": SentencePiece encode failed (" + printable(status.ToString(), 300) + ")");
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

// ---------------------------------------------------------------- the HDF5 record

TokenizerRecord read_tokenizer_record(const std::string& h5_path) {
  const h5::File f = h5::File::open_read(h5_path);
  TokenizerRecord r;
  if (!f.has_attr("/", "vocab_size")) {
    throw InputError(h5_path + ": root attribute vocab_size not found (expected the tokenizer's vocabulary size)");
  }
  r.vocab_size = f.attr_i64("/", "vocab_size");
  auto str = [&](const char* name, std::string& v) {
    if (f.has_attr("/", name)) v = f.attr_str("/", name);
  };
  auto i64 = [&](const char* name, int64_t& v) {
    if (f.has_attr("/", name)) v = f.attr_i64("/", name);
  };
  str("tokenizer", r.kind);
  str("tokenizer_model", r.model_path);
  str("tokenizer_model_sha256", r.model_sha256);
  str("token_format", r.token_format);
  i64("tokenizer_model_bytes", r.model_bytes);
  i64("bos_id", r.bos_id);
  i64("eos_id", r.eos_id);
  i64("num_documents", r.num_documents);
  int64_t flag = 0;
  i64("add_bos", flag);
  r.add_bos = flag != 0;
  flag = 0;
  i64("add_eos", flag);
  r.add_eos = flag != 0;
  return r;
}

}  // namespace fsdp::data
