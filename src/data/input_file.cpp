// fsdp_prepare's inputs, plain or gzip / zstd compressed (fsdp/data/input_file.hpp): a
// std::streambuf over read(2) with zlib's inflate or libzstd's streaming decompression.
#include "fsdp/data/input_file.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <lzma.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <streambuf>
#include <vector>

#include "fsdp/core/error.hpp"
#include "fsdp/core/file_lock.hpp"

namespace fsdp::data {

const char* compression_name(Compression c) {
  switch (c) {
    case Compression::gzip: return "gzip";
    case Compression::zstd: return "zstd";
    case Compression::xz: return "xz";
    case Compression::none: break;
  }
  return "plain";
}

namespace {

constexpr std::size_t kChunk = std::size_t{1} << 18;  // 256 KiB read and decompressed at a time

bool starts_with_at(const std::vector<char>& buf, std::size_t n, std::size_t at,
                    std::initializer_list<unsigned char> magic) {
  if (n < at + magic.size()) return false;
  std::size_t i = at;
  for (const unsigned char m : magic) {
    if (static_cast<unsigned char>(buf[i++]) != m) return false;
  }
  return true;
}

bool starts_with(const std::vector<char>& buf, std::size_t n, std::initializer_list<unsigned char> magic) {
  return starts_with_at(buf, n, 0, magic);
}

// A compressed format this reader does not decompress: its name and the command that does.
struct Foreign {
  const char* name;
  const char* command;
};

const Foreign* foreign_format(const std::vector<char>& buf, std::size_t n) {
  static const Foreign bzip2{"bzip2", "bzip2 -dk FILE"}, zip{"zip", "unzip FILE"},
      sevenz{"7z", "7z x FILE"}, lz4{"lz4", "lz4 -d FILE"};
  // "BZh", a block size digit, then a block's or the end's 48-bit magic (pi or sqrt(pi)).
  if (n >= 10 && starts_with(buf, n, {'B', 'Z', 'h'}) && buf[3] >= '1' && buf[3] <= '9' &&
      (std::memcmp(&buf[4], "\x31\x41\x59\x26\x53\x59", 6) == 0 ||
       std::memcmp(&buf[4], "\x17\x72\x45\x38\x50\x90", 6) == 0)) {
    return &bzip2;
  }
  if (starts_with(buf, n, {'P', 'K', 0x03, 0x04})) return &zip;
  if (starts_with(buf, n, {'7', 'z', 0xBC, 0xAF, 0x27, 0x1C})) return &sevenz;
  if (starts_with(buf, n, {0x04, 0x22, 0x4D, 0x18})) return &lz4;
  return nullptr;
}

}  // namespace

class InputFile::Buffer : public std::streambuf {
 public:
  explicit Buffer(const std::filesystem::path& path) : path_(path), name_(printable(path.string())) {
    fd_.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) throw InputError(name_ + ": cannot read input file (" + std::strerror(errno) + ")");
    in_.resize(kChunk);
    refill();
    if (starts_with(in_, in_len_, {0x1F, 0x8B, 0x08})) {
      compression_ = Compression::gzip;
      // 15 + 16: a 32 KiB window, gzip wrapper only (header and CRC-32 / length trailer checked).
      if (inflateInit2(&z_, 15 + 16) != Z_OK) throw InputError(name_ + ": zlib inflateInit2 failed");
      z_open_ = true;
    } else if (starts_with(in_, in_len_, {0x28, 0xB5, 0x2F, 0xFD}) ||
               (in_len_ >= 4 && (static_cast<unsigned char>(in_[0]) & 0xF0) == 0x50 &&
                starts_with_at(in_, in_len_, 1, {0x2A, 0x4D, 0x18}))) {
      // RFC 8878: a frame's magic 0xFD2FB528, or a skippable frame's 0x184D2A5?, little-endian.
      compression_ = Compression::zstd;
      zstd_ = ZSTD_createDStream();
      if (zstd_ == nullptr) throw InputError(name_ + ": ZSTD_createDStream failed");
    } else if (starts_with(in_, in_len_, {0xFD, '7', 'z', 'X', 'Z', 0x00})) {
      compression_ = Compression::xz;  // (.xz: every stream of the file, as `xz -d` reads it)
      if (lzma_stream_decoder(&xz_, UINT64_MAX, LZMA_CONCATENATED) != LZMA_OK) {
        throw InputError(name_ + ": liblzma lzma_stream_decoder failed");
      }
      xz_open_ = true;
    } else if (const Foreign* f = foreign_format(in_, in_len_)) {
      throw InputError(name_ + ": " + f->name +
                       "-compressed (fsdp_prepare reads plain text and gzip, zstd or xz files; "
                       "decompress it first: " + f->command + ")");
    }
    out_.resize(compression_ == Compression::none ? 0 : kChunk);
  }
  ~Buffer() override {
    if (xz_open_) lzma_end(&xz_);
    if (z_open_) inflateEnd(&z_);
    if (zstd_ != nullptr) ZSTD_freeDStream(zstd_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  Compression compression() const { return compression_; }
  int64_t disk_bytes_read() const { return consumed_; }
  const std::filesystem::path& path() const { return path_; }

 protected:
  int_type underflow() override {
    if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
    std::size_t n = 0;
    char* base = nullptr;
    switch (compression_) {
      case Compression::none:
        if (in_pos_ == in_len_) refill();
        base = in_.data() + in_pos_;
        n = in_len_ - in_pos_;
        in_pos_ = in_len_;
        consumed_ += static_cast<int64_t>(n);
        break;
      case Compression::gzip:
        base = out_.data();
        n = inflate_some();
        break;
      case Compression::zstd:
        base = out_.data();
        n = zstd_some();
        break;
      case Compression::xz:
        base = out_.data();
        n = xz_some();
        break;
    }
    if (n == 0) return traits_type::eof();
    setg(base, base, base + n);
    return traits_type::to_int_type(*gptr());
  }

 private:
  // Reads the next chunk of the file into in_ (in_len_ = 0 at its end).
  void refill() {
    in_pos_ = 0;
    in_len_ = 0;
    for (;;) {
      const ssize_t r = ::read(fd_.get(), in_.data(), in_.size());
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw InputError(name_ + ": error while reading input file (" + std::strerror(errno) + ")");
      in_len_ = static_cast<std::size_t>(r);
      at_end_ = r == 0;
      return;
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(name_ + ": " + what + " at compressed byte " + std::to_string(consumed_) +
                     " (the file is damaged or was cut short; nothing was written)");
  }

  // Decompresses into out_ until it is full or the file ends; 0 only at the clean end of the
  // last gzip member.
  std::size_t inflate_some() {
    z_.next_out = reinterpret_cast<Bytef*>(out_.data());
    z_.avail_out = static_cast<uInt>(out_.size());
    while (z_.avail_out > 0) {
      if (in_pos_ == in_len_ && !at_end_) refill();
      if (in_pos_ == in_len_) {
        if (member_open_) fail("gzip data ends inside a member");
        break;
      }
      z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      member_open_ = true;
      const int ret = inflate(&z_, Z_NO_FLUSH);
      const std::size_t used = (in_len_ - in_pos_) - z_.avail_in;
      in_pos_ += used;
      consumed_ += static_cast<int64_t>(used);
      if (ret == Z_STREAM_END) {
        member_open_ = false;  // what follows, if anything, must be another member
        if (inflateReset(&z_) != Z_OK) fail("zlib inflateReset failed");
      } else if (ret != Z_OK) {
        fail(std::string("gzip ") + (z_.msg != nullptr ? z_.msg : "error " + std::to_string(ret)));
      }
    }
    return out_.size() - z_.avail_out;
  }

  // Decompresses into out_ until it is full or the file ends; 0 only at the clean end of the
  // last frame.
  std::size_t zstd_some() {
    ZSTD_outBuffer out{out_.data(), out_.size(), 0};
    while (out.pos < out.size) {
      if (in_pos_ == in_len_ && !at_end_) refill();
      const bool no_more_input = in_pos_ == in_len_;
      if (no_more_input && frame_done_) break;
      const std::size_t before = out.pos;
      ZSTD_inBuffer in{in_.data(), in_len_, in_pos_};
      const std::size_t ret = ZSTD_decompressStream(zstd_, &out, &in);
      if (ZSTD_isError(ret) != 0) fail(std::string("zstd: ") + ZSTD_getErrorName(ret));
      consumed_ += static_cast<int64_t>(in.pos - in_pos_);
      in_pos_ = in.pos;
      frame_done_ = ret == 0;
      // The file has ended, the frame has not, and nothing more came out of what was buffered.
      if (no_more_input && !frame_done_ && out.pos == before) fail("zstd data ends inside a frame");
    }
    return out.pos;
  }

  // Decompresses into out_ until it is full or the file ends; 0 only at the clean end of the
  // last stream (LZMA_CONCATENATED: with LZMA_FINISH at the file's end, lzma_code returns
  // LZMA_STREAM_END only after a whole stream; a cut-short one is LZMA_BUF_ERROR or
  // LZMA_DATA_ERROR).
  std::size_t xz_some() {
    if (xz_done_) return 0;
    xz_.next_out = reinterpret_cast<uint8_t*>(out_.data());
    xz_.avail_out = out_.size();
    while (xz_.avail_out > 0) {
      if (in_pos_ == in_len_ && !at_end_) refill();
      xz_.next_in = reinterpret_cast<const uint8_t*>(in_.data() + in_pos_);
      xz_.avail_in = in_len_ - in_pos_;
      const lzma_action action = in_pos_ == in_len_ && at_end_ ? LZMA_FINISH : LZMA_RUN;
      const std::size_t before_out = xz_.avail_out;
      const lzma_ret ret = lzma_code(&xz_, action);
      const std::size_t used = (in_len_ - in_pos_) - xz_.avail_in;
      in_pos_ += used;
      consumed_ += static_cast<int64_t>(used);
      if (ret == LZMA_STREAM_END) {
        xz_done_ = true;
        break;
      }
      if (ret == LZMA_BUF_ERROR || (action == LZMA_FINISH && ret == LZMA_OK &&
                                    xz_.avail_out == before_out)) {
        fail("xz data ends inside a stream");
      }
      if (ret != LZMA_OK) fail(std::string("xz: ") + xz_error(ret));
    }
    return out_.size() - xz_.avail_out;
  }
  static const char* xz_error(lzma_ret r) {
    switch (r) {
      case LZMA_DATA_ERROR: return "corrupt data";
      case LZMA_FORMAT_ERROR: return "not an xz stream";
      case LZMA_OPTIONS_ERROR: return "unsupported options";
      case LZMA_MEM_ERROR: return "out of memory";
      default: return "decoder error";
    }
  }

  std::filesystem::path path_;
  std::string name_;
  UniqueFd fd_;
  Compression compression_ = Compression::none;
  std::vector<char> in_, out_;  // the file's bytes; the decompressed ones (compressed only)
  std::size_t in_pos_ = 0, in_len_ = 0;
  bool at_end_ = false;   // read(2) returned 0
  int64_t consumed_ = 0;  // file bytes handed to the decompressor (or out, when plain)
  z_stream z_{};
  bool z_open_ = false;
  bool member_open_ = false;  // gzip: inside a member (its end not yet seen)
  ZSTD_DStream* zstd_ = nullptr;
  lzma_stream xz_ = LZMA_STREAM_INIT;
  bool xz_open_ = false, xz_done_ = false;
  bool frame_done_ = true;  // zstd: the last call ended a frame and flushed it
};

InputFile::InputFile(const std::filesystem::path& path)
    : buffer_(std::make_unique<Buffer>(path)), stream_(buffer_.get()) {
  stream_.exceptions(std::ios::badbit);
}

InputFile::~InputFile() = default;

Compression InputFile::compression() const { return buffer_->compression(); }
int64_t InputFile::disk_bytes_read() const { return buffer_->disk_bytes_read(); }
const std::filesystem::path& InputFile::path() const { return buffer_->path(); }

}  // namespace fsdp::data
