// fsdp/data/input_file.hpp: fsdp_prepare's text inputs, plain or compressed.
//
// Corpora are shipped compressed: Dolma, The Pile, RedPajama and SlimPajama as JSON Lines in
// zstd (`*.jsonl.zst`), C4 and many Hub datasets in gzip (`*.json.gz`). An InputFile reads
// such a file as its decompressed bytes, so `fsdp_prepare --document jsonl data/*.jsonl.zst`
// needs no decompressed copy on disk. The format is told by the file's first bytes, not its
// name (`zcat` and `zstdcat` do the same with -f): gzip (RFC 1952: 1f 8b 08) and zstd
// (RFC 8878: a frame or a skippable frame) and xz (the .xz container, `xz` / `*.jsonl.xz`)
// are decompressed; every other file is read as it is.
//
// Nothing is lost silently (the point of this reader over boost::iostreams' zstd filter, which
// returns a truncated file's first frames as if they were all): a file that ends inside a
// gzip member, a zstd frame or an xz stream, a checksum or data error, and bytes after the last
// gzip member that are not another member are each one InputError naming the file and the
// compressed byte offset. Several gzip members (`cat a.gz b.gz`, pigz, bgzip) and zstd frames (`zstd
// --rsyncable`, pzstd) are read one after another, as `gzip -d` and `zstd -d` do.
//
// Files in a compressed format it does not read (bzip2, zip, 7z, lz4) are refused by name with
// the command that decompresses them, rather than taken for text.
#pragma once

#include <cstdint>
#include <filesystem>
#include <istream>
#include <memory>
#include <string>

namespace fsdp::data {

enum class Compression { none, gzip, zstd, xz };

// "plain", "gzip", "zstd" or "xz".
const char* compression_name(Compression c);

class InputFile {
 public:
  // Opens `path` and reads its first bytes to tell its format. Throws InputError (exit 2)
  // "<path>: cannot read input file (<strerror>)" if it cannot be opened or read, and
  // "<path>: <format>-compressed (fsdp_prepare reads plain text and gzip, zstd or xz files;
  // ...)" for bzip2, zip, 7z and lz4 files.
  explicit InputFile(const std::filesystem::path& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // The decompressed bytes. Reading past a corrupt or truncated part throws InputError
  // "<path>: <what> at compressed byte <offset> ..." out of the read call (std::getline,
  // read, istreambuf_iterator): the stream's exception mask holds badbit, so the reader's
  // own exception is what propagates. A read error of the file (EIO) is an InputError too.
  std::istream& stream() { return stream_; }

  Compression compression() const;
  // Bytes of the file (compressed bytes for gzip and zstd) consumed so far: a progress meter
  // over files' on-disk sizes advances by these.
  int64_t disk_bytes_read() const;
  const std::filesystem::path& path() const;

 private:
  class Buffer;  // the std::streambuf that reads and decompresses
  std::unique_ptr<Buffer> buffer_;
  std::istream stream_;
};

}  // namespace fsdp::data
