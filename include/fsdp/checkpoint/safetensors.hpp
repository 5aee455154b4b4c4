// fsdp/checkpoint/safetensors.hpp: a streaming writer and a hardened, range-reading reader
// of the safetensors format (https://github.com/huggingface/safetensors).
//
// Format (the safetensors spec): 8-byte little-endian u64 N, then N bytes of UTF-8 JSON
//   {"__metadata__":{"format":"pt"},            (optional; string -> string)
//    "name":{"dtype":"F32","shape":[...],"data_offsets":[begin,end]}, ...}
// then the byte buffer: raw little-endian, row-major tensor data. data_offsets are bytes,
// relative to the start of the buffer (byte 8 + N of the file), end exclusive.
//
// Writer: F32, BF16 or F16 tensors (each TensorInfo's dtype; the data always arrives as
// fp32 and is rounded to nearest-even on the way out). Pads the JSON with spaces so N is a
// multiple of 8 (the buffer starts 8-byte aligned) and lays tensors out contiguously in header
// order with no gaps. It is
// streaming: it takes the (name, shape) list first, writes the header, then accepts the
// tensors' data one at a time in that order, so memory stays at one tensor.
//
// Reader (SafetensorsFile, SafetensorsCheckpoint): the files come from strangers (Hugging
// Face model repositories), so opening validates the whole header against the file and every
// later read stays inside the tensor's validated byte range; reads fetch only the requested
// elements' bytes (pread), never the whole file. All problems with the file's contents are
// fsdp::InputError (exit 2) with one line "<path>: header: <what>" or
// "<path>: tensor '<name>': <what>" (names are quoted with non-printable bytes escaped).
// See docs/checkpoint.md "safetensors reader".
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/dtype.hpp"

namespace fsdp::safetensors {

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // row-major; {} is a scalar (1 element)
  DType dtype = DType::f32;    // as stored: f32, bf16 or f16 (what Writer writes)
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // Bytes of the stored data: numel x the dtype's size.
  int64_t bytes() const { return numel() * static_cast<int64_t>(fsdp::dtype_size(dtype)); }
};

// The safetensors dtype name Writer stores for `t` ("F32", "BF16", "F16"); throws
// fsdp::Error for a dtype Writer does not write.
const char* dtype_name(DType t);
// transformers' name of `t` in config.json's torch_dtype ("float32", "bfloat16",
// "float16"); throws fsdp::Error as dtype_name.
const char* torch_dtype_name(DType t);

// Writes `path` atomically through fsdp::AtomicFile: everything goes to `path + ".tmp"`,
// fsynced and renamed by finish(). If the writer is destroyed before finish() (an
// exception), the temp file is removed. I/O errors throw fsdp::Error naming `path` and
// strerror ("No space left on device").
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

  // Appends the data of the next tensor in header order: `count` must equal its numel. The
  // fp32 values are rounded to the tensor's dtype (to nearest, ties to even: what torch's
  // .to(torch.bfloat16) / .half() do). Throws fsdp::Error if all tensors were written already
  // or the count differs; InputError (exit 2) naming the tensor and the value if a finite
  // value is beyond F16's range (|x| > 65504 rounds to inf; torch would store the inf).
  void write_next(const float* data, int64_t count);
  // Name of the tensor write_next expects next ("" when all are written).
  std::string next_name() const;
  // Checks every tensor was written, flushes, fsyncs and renames to `path` (close() then
  // commit()). A second call does nothing.
  void finish();
  // finish() in two steps, for files that are published together (ModelWriter's shards):
  // close() checks every tensor was written, flushes and closes the temporary
  // (`path + ".tmp"`) without publishing it; commit() fsyncs it and renames it onto `path`
  // (AtomicFile::commit). Throws fsdp::Error naming `path`: close() before every tensor was
  // written, an I/O failure (strerror), commit() before close(). Each does nothing when
  // already done.
  void close();
  void commit();
  const std::string& path() const { return file_.path(); }

  // The header bytes (8-byte size + padded JSON) for `tensors`; exposed for tests.
  static std::string encode_header(const std::vector<TensorInfo>& tensors,
                                   const std::map<std::string, std::string>& metadata);

 private:
  AtomicFile file_;  // before out_: the stream closes before the temporary is removed
  std::vector<TensorInfo> tensors_;
  std::size_t next_ = 0;
  std::ofstream out_;
  bool closed_ = false, finished_ = false;
};

// ---- Hugging Face model directories: one model.safetensors or a sharded set ----

inline constexpr const char* kSingleFileName = "model.safetensors";
inline constexpr const char* kIndexFileName = "model.safetensors.index.json";
// save_pretrained's default max_shard_size, "5GB": 5 * 10^9 bytes.
inline constexpr int64_t kDefaultMaxShardSize = 5'000'000'000;

// Parses a shard size as transformers' convert_file_size_to_int (save_pretrained's
// max_shard_size) does, in bytes: a plain integer is bytes ("1000000"); an integer followed
// by a unit, case-insensitive: KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes; KB, MB, GB = 10^3,
// 10^6, 10^9 bytes, except that a lowercase final 'b' means bits, as in transformers ("5GB"
// = 5 * 10^9, "2GiB" = 2^31, "500mb" = 500 * 10^6 / 8). The integer is Python int()'s:
// optional surrounding spaces, an optional '+', single '_' between digits ("1_000KB").
// Departure: a size below 1 byte is refused (transformers accepts it and then writes one
// tensor per shard). Throws InputError (exit 2), one line naming `what` (fsdp_merge passes
// "--max-shard-size") and the text, e.g. `--max-shard-size: "5TB" is not a size (expected
// ...)`, on an empty string, a fraction ("1.5GB"), an unknown unit ("5TB", "5G"), a value of 0
// or below (after the bits division: "7kb" is 875 bytes, "1b" is refused), or one above int64.
int64_t parse_shard_size(const std::string& text, const std::string& what = "max_shard_size");

// The shard each tensor goes to (0-based, non-decreasing, one entry per tensor), for tensor
// data of TensorInfo::bytes() each (what Writer stores): tensors in the given order, a new shard
// started when adding the next tensor to a non-empty shard would take the shard's tensor
// bytes above `max_shard_size` (headers not counted), so a tensor larger than the limit is
// alone in its shard. This is transformers' shard_checkpoint (what save_pretrained used until
// 2024); huggingface_hub's split_state_dict_into_shards, which it calls now, groups the same
// way except that it puts a tensor larger than the limit in a shard of its own ahead of the
// shard it is filling (both load the same). Throws fsdp::Error if max_shard_size < 1.
std::vector<int> assign_shards(const std::vector<TensorInfo>& tensors, int64_t max_shard_size);
// Hugging Face's shard file name: shard_file_name(0, 3) = "model-00001-of-00003.safetensors"
// (1-based, at least five digits).
std::string shard_file_name(int index, int count);
// Whether `file_name` is one of those names: "model-<digits>-of-<digits>.safetensors" with at
// least five digits each (what a previous save left and the next one may replace).
bool is_shard_file_name(const std::string& file_name);

// Writes a Hugging Face model directory's weights as save_pretrained(max_shard_size=...)
// lays them out: DIR/model.safetensors when the tensors' bytes fit the limit (one shard),
// else DIR/model-00001-of-0000N.safetensors ... with DIR/model.safetensors.index.json
//   {"metadata": {"total_size": <tensor bytes>}, "weight_map": {"<tensor>": "<file>", ...}}
// (2-space indented, keys sorted, newline-terminated: save_pretrained's json.dumps). Each
// file is a Writer (fp32; "__metadata__" {"format": "pt"} plus `metadata`). Streaming like
// Writer: tensors arrive one at a time in the given order, and each shard is written under
// its ".tmp" name as its tensors arrive.
//
// Publication (finish()), so that no crash or I/O failure leaves a directory that loads a
// half-written or mixed model (transformers' from_pretrained and SafetensorsCheckpoint both
// take model.safetensors before the index):
//  * one file: model.safetensors is renamed into place (from then on it is what loads), then
//    a previous save's index and shard files are removed;
//  * shards: every shard and the index are complete and fsynced under ".tmp" names first;
//    if a new shard's name is taken by a previous save's file (same shard count), the old
//    index is removed first (a crash then leaves no index rather than one that mixes old and
//    new shards); the shards are renamed into place, then the index (with other names, the
//    rename replaces the old index in one step), then a previous save's model.safetensors
//    is removed (until then it is what loads) and its shard files that the new index does
//    not name.
// Only these names are removed: model.safetensors, model.safetensors.index.json, and regular
// files that is_shard_file_name accepts (with or without ".tmp"); nothing else in DIR is
// touched. Destroying the writer before finish() (an exception) removes every temporary and
// leaves DIR as it was. I/O errors throw fsdp::Error naming the file and strerror.
class ModelWriter {
 public:
  // `dir` must exist. Throws fsdp::Error on an empty, duplicate or "__metadata__" name, a
  // negative dimension, max_shard_size < 1, or an I/O failure creating the first file.
  ModelWriter(std::string dir, std::vector<TensorInfo> tensors, int64_t max_shard_size,
              std::map<std::string, std::string> metadata = {});
  ModelWriter(const ModelWriter&) = delete;
  ModelWriter& operator=(const ModelWriter&) = delete;
  ~ModelWriter();

  // As Writer::write_next (`count` = the next tensor's numel).
  void write_next(const float* data, int64_t count);
  // Publishes the files and removes a previous save's (see above). Throws fsdp::Error if a
  // tensor was not written, or on an I/O failure.
  void finish();

  bool sharded() const { return files_.size() > 1; }
  // File names in DIR, shard order: {"model.safetensors"} or the shard names.
  const std::vector<std::string>& files() const { return files_; }
  // Tensor bytes (TensorInfo::bytes() summed): the index's total_size.
  int64_t total_size() const { return total_size_; }
  // The index text for these tensors (sharded() only; exposed for tests).
  std::string index_json() const;

 private:
  void open_shard(int shard);
  void remove_stale(bool single);
  std::string dir_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  std::vector<int> shard_of_;         // tensor -> shard
  std::vector<std::string> files_;    // shard -> file name
  std::vector<std::unique_ptr<Writer>> writers_;  // opened so far, shard order
  std::size_t next_ = 0;
  int64_t total_size_ = 0;
  bool finished_ = false;
};

// Bytes per element of a safetensors dtype name (F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16
// U8 BOOL F8_E4M3 F8_E5M2); 0 for a name the spec does not define.
int dtype_size(const std::string& dtype);
// Whether read_f32 converts this dtype: F32, BF16, F16 and F64.
bool dtype_readable_as_float(const std::string& dtype);
// A tensor name from a stranger's file made printable on one line: printable ASCII kept except
// '\\' and '\'', every other byte as \xNN, cut at 200 bytes ("..."). Error messages quote it.
std::string escape_name(const std::string& name);

// Limits of the reader (the safetensors library also caps the header at 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // header length N
inline constexpr int kMaxRank = 64;                         // dimensions per shape

// One open safetensors file: the validated header plus an open descriptor for ranged reads.
// Movable, not copyable. Not thread-safe: use one object per thread (bytes_read is a plain
// counter).
class SafetensorsFile {
 public:
  struct Entry {
    std::string dtype;           // as in the header, e.g. "F32", "BF16"
    std::vector<int64_t> shape;  // row-major; {} is a scalar
    int64_t begin = 0, end = 0;  // data_offsets: bytes relative to the buffer start
    int64_t numel = 0;           // product of shape (1 for a scalar)
    int elem_size = 0;           // bytes per element (dtype_size(dtype))
  };

  // Opens `path` and reads and validates only the header (8 + N bytes). Throws InputError
  // "<path>: cannot open safetensors file: <reason>" if it cannot be opened; "<path>: header:
  // ..." when it is not a regular file, is shorter than 8 bytes, N is 0, above
  // kMaxHeaderBytes or beyond the file, the JSON is malformed (a NUL byte included), not an
  // object, nested deeper than a safetensors header, names a tensor twice or more than 2^20
  // tensors, or "__metadata__" is not an object of at most 65536 strings; and "<path>: tensor '<name>': ..." when an entry is not an object,
  // lacks dtype/shape/data_offsets or has them with the wrong JSON type, has an unknown
  // dtype, a negative dimension, more than kMaxRank dimensions, an element or byte count
  // overflowing int64, data_offsets with begin > end or end beyond the file, a byte count
  // != numel x dtype size, or bytes overlapping another tensor's. Holes between tensors
  // are accepted (the spec forbids them; real files never have them, and they are harmless).
  explicit SafetensorsFile(std::string path);
  static SafetensorsFile open(const std::string& path) { return SafetensorsFile(path); }
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  uint64_t header_size() const { return header_size_; }  // N
  uint64_t file_size() const { return file_size_; }      // bytes, at open
  // Tensor names in the order they appear in the header ("__metadata__" excluded).
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return entries_.count(name) != 0; }
  // InputError "<path>: no tensor '<name>'" if absent.
  const Entry& entry(const std::string& name) const;
  // "__metadata__" (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Reads elements [elem_begin, elem_begin + elem_count) of tensor `name` (row-major flat
  // index) into out[0 .. elem_count), converting F32/BF16/F16/F64 to float (F16/BF16 exactly;
  // F64 rounded). Reads only those elements' bytes, via pread in chunks of at most 1 MiB.
  // Throws InputError naming the file and tensor if the tensor is absent, its dtype is not
  // one of those four, the range is negative or past numel, or the file became shorter than
  // at open (short read); fsdp::Error on an I/O error.
  void read_f32(const std::string& name, int64_t elem_begin, int64_t elem_count,
                float* out) const;
  // The whole tensor as floats (same conversions and errors).
  std::vector<float> read_f32(const std::string& name) const;
  // Reads elements [elem_begin, elem_begin + elem_count) of tensor `name` as stored (no
  // conversion: elem_count * its dtype size bytes) into `out`: an integer tensor's values (the
  // U8 blocks and scales of an MXFP4 tensor). Errors as read_f32's, for any dtype.
  void read_raw(const std::string& name, int64_t elem_begin, int64_t elem_count,
                void* out) const;

  // Payload bytes read by read_f32 and read_raw since open (the header is not counted).
  uint64_t bytes_read() const { return bytes_read_; }
  void reset_bytes_read() { bytes_read_ = 0; }

 private:
  void parse_header(const std::string& json);
  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0, header_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
  mutable uint64_t bytes_read_ = 0;
};

// Before the hardened reader this was the reader's name; kept for existing callers.
using Reader = SafetensorsFile;

// A Hugging Face model directory's weights: either DIR/model.safetensors, or (when that is
// absent) a sharded DIR/model.safetensors.index.json
//   {"metadata": {...}, "weight_map": {"tensor name": "model-00001-of-00002.safetensors", ...}}
// whose files lie in DIR. Each referenced file is opened once (its header validated as by
// SafetensorsFile); reads go to the file holding the tensor. Movable, not thread-safe.
class SafetensorsCheckpoint {
 public:
  // Throws InputError "<dir>: ..." if DIR is not a directory or holds neither file, and
  // "<dir>/model.safetensors.index.json: ..." if the index is not valid JSON (or larger than
  // kMaxHeaderBytes), not an object, lacks an object "weight_map" of string -> string, names
  // a file that is empty, contains '/', '\\' or "..", does not exist, or does not hold the
  // tensor mapped to it. Errors inside a weight file are those of SafetensorsFile.
  explicit SafetensorsCheckpoint(std::string dir);
  static SafetensorsCheckpoint open(const std::string& dir) { return SafetensorsCheckpoint(dir); }

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }  // opened through the index
  // Single file: its header order. Sharded: the weight_map's names, sorted.
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return file_of_.count(name) != 0; }
  // InputError "<dir>: no tensor '<name>'" if absent.
  const SafetensorsFile::Entry& entry(const std::string& name) const;
  // The file holding `name` (InputError if absent).
  const SafetensorsFile& file_of(const std::string& name) const;
  const std::vector<SafetensorsFile>& files() const { return files_; }

  // As SafetensorsFile::read_f32, on the file holding `name`.
  void read_f32(const std::string& name, int64_t elem_begin, int64_t elem_count,
                float* out) const;
  std::vector<float> read_f32(const std::string& name) const;
  // As SafetensorsFile::read_raw, on the file holding `name`.
  void read_raw(const std::string& name, int64_t elem_begin, int64_t elem_count,
                void* out) const;
  // Sum of the files' bytes_read().
  uint64_t bytes_read() const;
  void reset_bytes_read();

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, std::size_t> file_of_;  // tensor -> index into files_
  std::vector<std::string> names_;
};

}  // namespace fsdp::safetensors
