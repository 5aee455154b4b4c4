// fsdp/checkpoint/safetensors.hpp: a streaming writer and a small reader of the
// safetensors format (https://github.com/huggingface/safetensors), fp32 only.
//
// Layout: 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
//   {"__metadata__":{"format":"pt"},
//    "name":{"dtype":"F32","shape":[...],"data_offsets":[begin,end]}, ...}
// padded with spaces so N is a multiple of 8 (the data then starts 8-byte aligned), then
// the raw little-endian tensor bytes. Offsets are relative to the start of the data; tensors
// are laid out contiguously in header order with no gaps (the layout the safetensors
// library validates). The writer is streaming: it takes the (name, shape) list first,
// writes the header, then accepts the tensors' data one at a time in that order, so memory
// stays at one tensor whatever the model size.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace fsdp::safetensors {

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // row-major; {} is a scalar (1 element)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Writes `path` atomically: everything goes to `path + ".tmp"`, renamed by finish().
// If the writer is destroyed before finish() (an exception), the temp file is removed.
class Writer {
 public:
  // Writes the header. Throws fsdp::Error on duplicate/empty names, negative dims, or an
  // I/O failure; metadata (string -> string) is stored under "__metadata__" together with
  // "format":"pt".
  Writer(std::string path, std::vector<TensorInfo> tensors,
         std::map<std::string, std::string> metadata = {});
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;
  ~Writer();

  // Appends the data of the next tensor in header order: `count` must equal its numel.
  // Throws fsdp::Error if all tensors were written already or the count differs.
  void write_next(const float* data, int64_t count);
  // Name of the tensor write_next expects next ("" when all are written).
  std::string next_name() const;
  // Checks every tensor was written, flushes, fsyncs and renames to `path`.
  void finish();

  // The header bytes (8-byte size + padded JSON) for `tensors`; exposed for tests.
  static std::string encode_header(const std::vector<TensorInfo>& tensors,
                                   const std::map<std::string, std::string>& metadata);

 private:
  std::string path_, tmp_path_;
  std::vector<TensorInfo> tensors_;
  std::size_t next_ = 0;
  std::ofstream out_;
  bool finished_ = false;
};

// Reads a safetensors file's header and tensors (fp32 only). For tests and tools.
class Reader {
 public:
  struct Entry {
    std::string dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0, end = 0;  // data_offsets (bytes, relative to the data start)
  };
  // Parses and validates the header: size within the file, JSON object, known fields,
  // offsets matching shape x dtype size, in range. Throws InputError naming the file.
  explicit Reader(std::string path);

  uint64_t header_size() const { return header_size_; }  // N
  // Tensor names in the order they appear in the header (metadata excluded).
  const std::vector<std::string>& names() const { return names_; }
  const Entry& entry(const std::string& name) const;  // InputError if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's values (dtype must be F32).
  std::vector<float> read_f32(const std::string& name) const;

 private:
  std::string path_;
  uint64_t header_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace fsdp::safetensors
