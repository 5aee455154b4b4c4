// Streaming safetensors writer and hardened range reader (see fsdp/checkpoint/safetensors.hpp).
#include "fsdp/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/core/dtype.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps");

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    default: break;
  }
  throw Error("safetensors: the writer does not store " + std::string(to_string(t)));
}

const char* torch_dtype_name(DType t) {
  (void)dtype_name(t);  // the same set of dtypes
  return t == DType::f32 ? "float32" : t == DType::bf16 ? "bfloat16" : "float16";
}

std::string Writer::encode_header(const std::vector<TensorInfo>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  nlohmann::ordered_json meta = nlohmann::ordered_json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  std::set<std::string> seen;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__")
      throw Error("safetensors: invalid tensor name \"" + t.name + "\"");
    if (!seen.insert(t.name).second)
      throw Error("safetensors: duplicate tensor name \"" + t.name + "\"");
    for (int64_t d : t.shape)
      if (d < 0) throw Error("safetensors: negative dimension in tensor \"" + t.name + "\"");
    const int64_t bytes = t.bytes();
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

Writer::Writer(std::string path, std::vector<TensorInfo> tensors,
               std::map<std::string, std::string> metadata)
    : file_(std::move(path)), tensors_(std::move(tensors)) {
  const std::string header = encode_header(tensors_, metadata);
  out_.open(file_.tmp_path(), std::ios::binary | std::ios::trunc);
  if (!out_) throw Error(file_.path() + ": cannot create " + file_.tmp_path() + ": " + std::strerror(errno));
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (!out_) throw Error(file_.path() + ": write failed: " + std::strerror(errno));
}

// The ofstream closes first (declared after file_), then file_ removes the temporary unless
// finish() committed it.
Writer::~Writer() = default;

std::string Writer::next_name() const {
  return next_ < tensors_.size() ? tensors_[next_].name : std::string();
}

void Writer::write_next(const float* data, int64_t count) {
  if (closed_ || next_ >= tensors_.size())
    throw Error(file_.path() + ": safetensors writer: more tensors written than declared");
  const TensorInfo& t = tensors_[next_];
  if (count != t.numel())
    throw Error(file_.path() + ": safetensors writer: tensor \"" + t.name + "\" has " +
                std::to_string(t.numel()) + " elements, got " + std::to_string(count));
  auto failed = [&] {
    return Error(file_.path() + ": write failed for tensor \"" + t.name + "\": " + std::strerror(errno));
  };
  if (t.dtype == DType::f32) {
    out_.write(reinterpret_cast<const char*>(data),
               static_cast<std::streamsize>(count * static_cast<int64_t>(sizeof(float))));
    if (!out_) throw failed();
  } else {  // rounded in chunks: memory stays at one tensor
    const bool bf16 = t.dtype == DType::bf16;
    std::vector<uint16_t> buf;
    constexpr int64_t kChunk = int64_t{1} << 16;
    for (int64_t at = 0; at < count; at += kChunk) {
      const int64_t n = std::min(kChunk, count - at);
      buf.resize(static_cast<std::size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const float x = data[at + i];
        buf[static_cast<std::size_t>(i)] = bf16 ? f32_to_bf16(x) : f32_to_f16(x);
        if (!bf16 && std::isfinite(x) && !std::isfinite(f16_to_f32(buf[static_cast<std::size_t>(i)]))) {
          throw InputError(file_.path() + ": tensor \"" + t.name + "\": element " +
                           std::to_string(at + i) + " = " + format_number(x) +
                           " is beyond fp16's range (|x| <= 65504); keep it fp32 or bf16");
        }
      }
      out_.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(2 * n));
      if (!out_) throw failed();
    }
  }
  ++next_;
}

void Writer::close() {
  if (closed_) return;
  if (next_ != tensors_.size())
    throw Error(file_.path() + ": safetensors writer: finish() before tensor \"" +
                tensors_[next_].name + "\" was written");
  out_.flush();
  if (!out_) throw Error(file_.path() + ": write failed: " + std::strerror(errno));
  out_.close();
  if (!out_) throw Error(file_.path() + ": write failed: " + std::strerror(errno));
  closed_ = true;
}

void Writer::commit() {
  if (finished_) return;
  if (!closed_) throw Error(file_.path() + ": safetensors writer: commit() before close()");
  file_.commit();
  finished_ = true;
}

void Writer::finish() {
  close();
  commit();
}

// ---- reader ----

std::string escape_name(const std::string& s) { return printable(s, 200); }

namespace {

constexpr int64_t kMaxTensors = 1 << 20;          // tensors per file
constexpr std::size_t kMaxMetadataEntries = 1 << 16;
constexpr std::size_t kMaxIndexBytes = 64ull << 20;  // model.safetensors.index.json
constexpr std::size_t kReadChunk = 1 << 20;          // bytes per pread

// A name from the file, quoted for a one-line message (see escape_name).
std::string quote(const std::string& s) {
  std::string out(1, '\'');
  out += escape_name(s);
  out += '\'';
  return out;
}

// A message from a library (nlohmann's "last read: '...'" echoes input bytes) made one line.
std::string one_line(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < 400; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return out;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Reads exactly n bytes at offset off. A short read means the file shrank after open.
void pread_all(int fd, char* buf, std::size_t n, uint64_t off, const std::string& path,
               const std::string& what) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, buf, n, static_cast<off_t>(off));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(path + ": " + what + ": read failed: " + std::strerror(errno));
    }
    if (r == 0)
      throw InputError(path + ": " + what +
                       ": unexpected end of file (did the file change after it was opened?)");
    buf += r;
    n -= static_cast<std::size_t>(r);
    off += static_cast<uint64_t>(r);
  }
}

struct DtypeDesc {
  const char* name;
  int size;
  bool as_float;
};
constexpr DtypeDesc kDtypes[] = {
    {"F64", 8, true},  {"F32", 4, true},     {"F16", 2, true},     {"BF16", 2, true},
    {"I64", 8, false}, {"I32", 4, false},    {"I16", 2, false},    {"I8", 1, false},
    {"U64", 8, false}, {"U32", 4, false},    {"U16", 2, false},    {"U8", 1, false},
    {"BOOL", 1, false}, {"F8_E4M3", 1, false}, {"F8_E5M2", 1, false},
};

const DtypeDesc* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

// SAX handler for a safetensors header. Enforces the header's shape while parsing (root
// object; depth-1 objects; depth-2 strings or arrays of integers), so memory stays bounded by
// what is kept and nothing nests deeper than 3 levels. Each tensor entry is validated when
// its object closes. Throws InputError on the first problem.
class HeaderSax {
 public:
  using json = nlohmann::json;
  struct Parsed {
    std::vector<std::string> names;
    std::map<std::string, SafetensorsFile::Entry> entries;
    std::map<std::string, std::string> metadata;
  };

  HeaderSax(const std::string& path, uint64_t data_size, Parsed& out)
      : path_(path), data_size_(data_size), out_(out) {}

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) { return integer(v, false); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return integer(0, true);
    return integer(static_cast<int64_t>(v), false);
  }
  bool number_float(json::number_float_t, const json::string_t&) { return scalar("a float"); }
  bool binary(json::binary_t&) { return scalar("binary"); }
  bool string(json::string_t& s) {
    if (depth_ == 2 && in_meta_) {
      out_.metadata[key2_] = s;
      return true;
    }
    if (depth_ == 2 && field_ == Field::kDtype) {
      dtype_ = s;
      has_dtype_ = true;
      return true;
    }
    return scalar("a string");
  }
  bool start_object(std::size_t) {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      start_entry();
      return true;
    }
    container_error("an object");
    return false;
  }
  bool start_array(std::size_t) {
    if (depth_ == 2 && !in_meta_) {
      depth_ = 3;
      array_.clear();
      return true;
    }
    container_error("an array");
    return false;
  }
  bool key(json::string_t& k) {
    if (depth_ == 1) {
      key1_ = k;
      in_meta_ = k == "__metadata__";
      if (in_meta_) {
        if (seen_meta_) throw InputError(path_ + ": header: \"__metadata__\" appears twice");
        seen_meta_ = true;
      } else {
        if (out_.entries.count(k) != 0 || pending_.count(k) != 0)
          throw InputError(path_ + ": header: tensor " + quote(k) + " appears twice");
        if (static_cast<int64_t>(out_.names.size()) >= kMaxTensors)
          throw InputError(path_ + ": header: more than " + std::to_string(kMaxTensors) +
                           " tensors");
        pending_.insert(k);
        out_.names.push_back(k);
      }
      return true;
    }
    // depth 2: a field of a tensor entry, or a metadata key.
    key2_ = k;
    if (in_meta_) {
      if (out_.metadata.count(k) != 0)
        throw InputError(path_ + ": header: \"__metadata__\" key " + quote(k) + " appears twice");
      if (out_.metadata.size() >= kMaxMetadataEntries)
        throw InputError(path_ + ": header: \"__metadata__\" has more than " +
                         std::to_string(kMaxMetadataEntries) + " entries");
      return true;
    }
    field_ = k == "dtype" ? Field::kDtype
             : k == "shape" ? Field::kShape
             : k == "data_offsets" ? Field::kOffsets
                                   : Field::kOther;
    if (field_ != Field::kOther) {
      bool& seen = field_ == Field::kDtype ? seen_dtype_ : field_ == Field::kShape ? seen_shape_ : seen_offsets_;
      if (seen) tensor_error("field \"" + k + "\" appears twice");
      seen = true;
    }
    return true;
  }
  bool end_array() {
    depth_ = 2;
    if (field_ == Field::kShape) {
      shape_ = array_;
      has_shape_ = true;
    } else if (field_ == Field::kOffsets) {
      if (array_.size() != 2) type_error();
      offsets_ = array_;
      has_offsets_ = true;
    }
    return true;
  }
  bool end_object() {
    if (depth_ == 2) {
      depth_ = 1;
      if (!in_meta_) finish_entry();
      return true;
    }
    depth_ = 0;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    throw InputError(path_ + ": header: invalid JSON: " + one_line(e.what()));
  }

 private:
  enum class Field { kDtype, kShape, kOffsets, kOther };

  [[noreturn]] void tensor_error(const std::string& what) const {
    throw InputError(path_ + ": tensor " + quote(key1_) + ": " + what);
  }
  // The message for a known field holding the wrong JSON type.
  [[noreturn]] void type_error() const {
    switch (field_) {
      case Field::kDtype: tensor_error("\"dtype\" is not a string");
      case Field::kShape: tensor_error("\"shape\" is not an array of integers");
      case Field::kOffsets:
        tensor_error("\"data_offsets\" is not an array of two non-negative integers");
      case Field::kOther: break;
    }
    tensor_error("field " + quote(key2_) + " has an unexpected JSON type");
  }
  void start_entry() {
    has_dtype_ = has_shape_ = has_offsets_ = false;
    seen_dtype_ = seen_shape_ = seen_offsets_ = false;
    field_ = Field::kOther;
  }
  // A non-container value at the current depth.
  bool scalar(const char* what) {
    if (depth_ == 0) throw InputError(path_ + ": header: JSON is not an object");
    if (depth_ == 1) {
      if (in_meta_) throw InputError(path_ + ": header: \"__metadata__\" is not an object");
      tensor_error("entry is not a JSON object");
    }
    if (depth_ == 2) {
      if (in_meta_)
        throw InputError(path_ + ": header: \"__metadata__\" value for " + quote(key2_) +
                         " is not a string");
      if (field_ == Field::kOther) return true;  // unknown fields are ignored
      type_error();
    }
    // depth 3: an array element
    if (field_ == Field::kOther) return true;
    (void)what;
    type_error();
  }
  bool integer(int64_t v, bool too_large) {
    if (depth_ != 3) return scalar("an integer");
    if (field_ == Field::kOther) return true;
    if (too_large) {
      if (field_ == Field::kShape) tensor_error("shape dimension larger than int64");
      tensor_error("data_offsets value larger than int64");
    }
    if (field_ == Field::kOffsets && v < 0) type_error();
    if (field_ == Field::kShape && array_.size() >= static_cast<std::size_t>(kMaxRank))
      tensor_error("shape has more than " + std::to_string(kMaxRank) + " dimensions");
    if (field_ == Field::kOffsets && array_.size() >= 2) type_error();
    array_.push_back(v);
    return true;
  }
  [[noreturn]] void container_error(const char* what) {
    if (depth_ == 0) throw InputError(path_ + ": header: JSON is not an object");
    if (depth_ == 1) {
      if (in_meta_) throw InputError(path_ + ": header: \"__metadata__\" is not an object");
      tensor_error("entry is not a JSON object");
    }
    if (in_meta_)
      throw InputError(path_ + ": header: \"__metadata__\" value for " + quote(key2_) +
                       " is not a string");
    if (field_ != Field::kOther) type_error();
    tensor_error("field " + quote(key2_) + " holds " + what + " nested too deeply");
  }
  void finish_entry() {
    pending_.erase(key1_);
    if (!has_dtype_) tensor_error("missing \"dtype\"");
    if (!has_shape_) tensor_error("missing \"shape\"");
    if (!has_offsets_) tensor_error("missing \"data_offsets\"");
    const DtypeDesc* dt = find_dtype(dtype_);
    if (!dt) tensor_error("unknown dtype " + quote(dtype_));
    int64_t numel = 1;
    for (int64_t d : shape_) {
      if (d < 0) tensor_error("negative dimension " + std::to_string(d) + " in shape " + shape_str(shape_));
      if (__builtin_mul_overflow(numel, d, &numel))
        tensor_error("shape " + shape_str(shape_) + " has more elements than int64 can count");
    }
    int64_t bytes = 0;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(dt->size), &bytes))
      tensor_error("shape " + shape_str(shape_) + " of " + dtype_ + " has more bytes than int64 can count");
    const int64_t begin = offsets_[0], end = offsets_[1];
    const std::string offs = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) tensor_error(offs + ": begin > end");
    if (static_cast<uint64_t>(end) > data_size_)
      tensor_error(offs + ": end is beyond the end of the file (the data holds " +
                   std::to_string(data_size_) + " bytes)");
    if (end - begin != bytes)
      tensor_error(offs + " hold " + std::to_string(end - begin) + " bytes, but shape " +
                   shape_str(shape_) + " of " + dtype_ + " needs " + std::to_string(bytes));
    SafetensorsFile::Entry e;
    e.dtype = dtype_;
    e.shape = shape_;
    e.begin = begin;
    e.end = end;
    e.numel = numel;
    e.elem_size = dt->size;
    out_.entries.emplace(key1_, std::move(e));
  }

  const std::string& path_;
  const uint64_t data_size_;
  Parsed& out_;
  int depth_ = 0;  // containers open
  bool in_meta_ = false, seen_meta_ = false;
  std::string key1_, key2_;
  std::set<std::string> pending_;  // entry opened, not yet closed (for duplicate detection)
  Field field_ = Field::kOther;
  bool has_dtype_ = false, has_shape_ = false, has_offsets_ = false;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  std::string dtype_;
  std::vector<int64_t> shape_, offsets_, array_;
};

}  // namespace

int dtype_size(const std::string& dtype) {
  const DtypeDesc* d = find_dtype(dtype);
  return d ? d->size : 0;
}

bool dtype_readable_as_float(const std::string& dtype) {
  const DtypeDesc* d = find_dtype(dtype);
  return d && d->as_float;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is rejected below.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw InputError(path_ + ": cannot open safetensors file: " + std::strerror(errno));
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw Error(path_ + ": fstat failed: " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw InputError(path_ + ": header: not a regular file");
    file_size_ = static_cast<uint64_t>(st.st_size);
    if (file_size_ < 8)
      throw InputError(path_ + ": header: file is " + std::to_string(file_size_) +
                       " bytes, shorter than the 8-byte header length");
    unsigned char n8[8];
    pread_all(fd_, reinterpret_cast<char*>(n8), 8, 0, path_, "header");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | n8[i];
    if (n == 0) throw InputError(path_ + ": header: header length is 0");
    if (n > kMaxHeaderBytes)
      throw InputError(path_ + ": header: header length " + std::to_string(n) +
                       " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
    if (n > file_size_ - 8)
      throw InputError(path_ + ": header: header length " + std::to_string(n) +
                       " extends beyond the end of the file (" + std::to_string(file_size_) +
                       " bytes)");
    header_size_ = n;
    std::string json(n, '\0');
    pread_all(fd_, json.data(), n, 8, path_, "header");
    parse_header(json);
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

void SafetensorsFile::parse_header(const std::string& json) {
  const uint64_t data_size = file_size_ - 8 - header_size_;
  HeaderSax::Parsed parsed;
  HeaderSax sax(path_, data_size, parsed);
  // nlohmann's lexer takes a NUL byte outside a string for the end of the input, which would
  // accept "{}\0garbage"; NUL is never valid in JSON text, so reject it outright.
  if (const auto nul = json.find('\0'); nul != std::string::npos)
    throw InputError(path_ + ": header: invalid JSON: NUL byte at header offset " + std::to_string(nul));
  nlohmann::json::sax_parse(json.begin(), json.end(), &sax);
  // Overlap: sort the non-empty byte ranges by begin; each must start at or after the end of
  // the one before (which, with no overlap so far, is the furthest end seen).
  std::vector<std::pair<std::pair<int64_t, int64_t>, const std::string*>> ranges;
  ranges.reserve(parsed.entries.size());
  for (const auto& [name, e] : parsed.entries)
    if (e.end > e.begin) ranges.push_back({{e.begin, e.end}, &name});
  std::sort(ranges.begin(), ranges.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    const auto& [prev, prev_name] = ranges[i - 1];
    const auto& [cur, cur_name] = ranges[i];
    if (cur.first < prev.second)
      throw InputError(path_ + ": tensor " + quote(*cur_name) + ": bytes [" +
                       std::to_string(cur.first) + ", " + std::to_string(cur.second) +
                       ") overlap tensor " + quote(*prev_name) + " [" +
                       std::to_string(prev.first) + ", " + std::to_string(prev.second) + ")");
  }
  names_ = std::move(parsed.names);
  entries_ = std::move(parsed.entries);
  metadata_ = std::move(parsed.metadata);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      file_size_(o.file_size_),
      header_size_(o.header_size_),
      names_(std::move(o.names_)),
      entries_(std::move(o.entries_)),
      metadata_(std::move(o.metadata_)),
      bytes_read_(o.bytes_read_) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    file_size_ = o.file_size_;
    header_size_ = o.header_size_;
    names_ = std::move(o.names_);
    entries_ = std::move(o.entries_);
    metadata_ = std::move(o.metadata_);
    bytes_read_ = o.bytes_read_;
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(path_ + ": no tensor " + quote(name));
  return it->second;
}

void SafetensorsFile::read_f32(const std::string& name, int64_t elem_begin, int64_t elem_count,
                               float* out) const {
  const Entry& e = entry(name);
  const std::string where = "tensor " + quote(name);
  if (!dtype_readable_as_float(e.dtype))
    throw InputError(path_ + ": " + where + ": dtype " + e.dtype + " cannot be read as float");
  if (elem_begin < 0 || elem_count < 0 || elem_begin > e.numel || elem_count > e.numel - elem_begin)
    throw InputError(path_ + ": " + where + ": elements [" + std::to_string(elem_begin) + ", +" +
                     std::to_string(elem_count) + ") are outside the tensor's " +
                     std::to_string(e.numel) + " elements");
  if (fd_ < 0) throw Error(path_ + ": read from a moved-from SafetensorsFile");
  const auto es = static_cast<uint64_t>(e.elem_size);
  // Validated at open: begin + numel * elem_size = end <= data size, so no overflow here.
  uint64_t off = 8 + header_size_ + static_cast<uint64_t>(e.begin) + static_cast<uint64_t>(elem_begin) * es;
  auto left = static_cast<uint64_t>(elem_count);
  if (e.dtype == "F32") {
    pread_all(fd_, reinterpret_cast<char*>(out), left * 4, off, path_, where);
    bytes_read_ += left * 4;
    return;
  }
  std::vector<unsigned char> buf(static_cast<std::size_t>(std::min<uint64_t>(left * es, kReadChunk)));
  const uint64_t per_chunk = buf.size() / es;
  while (left > 0) {
    const uint64_t n = std::min(left, per_chunk);
    pread_all(fd_, reinterpret_cast<char*>(buf.data()), n * es, off, path_, where);
    const unsigned char* p = buf.data();
    if (e.dtype == "BF16") {
      for (uint64_t i = 0; i < n; ++i)
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(p[2 * i] | (p[2 * i + 1] << 8)) << 16);
    } else if (e.dtype == "F16") {
      for (uint64_t i = 0; i < n; ++i)
        out[i] = f16_to_f32(static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
    } else {  // F64
      for (uint64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
    }
    out += n;
    left -= n;
    off += n * es;
    bytes_read_ += n * es;
  }
}

void SafetensorsFile::read_raw(const std::string& name, int64_t elem_begin, int64_t elem_count,
                               void* out) const {
  const Entry& e = entry(name);
  const std::string where = "tensor " + quote(name);
  if (elem_begin < 0 || elem_count < 0 || elem_begin > e.numel || elem_count > e.numel - elem_begin)
    throw InputError(path_ + ": " + where + ": elements [" + std::to_string(elem_begin) + ", +" +
                     std::to_string(elem_count) + ") are outside the tensor's " +
                     std::to_string(e.numel) + " elements");
  if (fd_ < 0) throw Error(path_ + ": read from a moved-from SafetensorsFile");
  const auto es = static_cast<uint64_t>(e.elem_size);
  const uint64_t off =
      8 + header_size_ + static_cast<uint64_t>(e.begin) + static_cast<uint64_t>(elem_begin) * es;
  const uint64_t bytes = static_cast<uint64_t>(elem_count) * es;
  pread_all(fd_, static_cast<char*>(out), bytes, off, path_, where);
  bytes_read_ += bytes;
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
  const Entry& e = entry(name);
  if (!dtype_readable_as_float(e.dtype))
    throw InputError(path_ + ": tensor " + quote(name) + ": dtype " + e.dtype +
                     " cannot be read as float");
  std::vector<float> out(static_cast<std::size_t>(e.numel));
  read_f32(name, 0, e.numel, out.data());
  return out;
}

// ---- checkpoint directory ----

namespace {

// Parses the index with a depth limit (nothing in a real index nests deeper than 3 levels).
nlohmann::json parse_index(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError(path + ": cannot read: " + ec.message());
  if (size > kMaxIndexBytes)
    throw InputError(path + ": index is " + std::to_string(size) + " bytes, more than the limit of " +
                     std::to_string(kMaxIndexBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::string text(static_cast<std::size_t>(size), '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size)))
    throw InputError(path + ": cannot read the index");
  if (const auto nul = text.find('\0'); nul != std::string::npos)  // see parse_header
    throw InputError(path + ": invalid JSON: NUL byte at offset " + std::to_string(nul));
  auto depth_limit = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json&) {
    if ((ev == nlohmann::json::parse_event_t::object_start ||
         ev == nlohmann::json::parse_event_t::array_start) && depth >= 16)
      throw InputError(path + ": index JSON is nested more than 16 levels deep");
    return true;
  };
  try {
    return nlohmann::json::parse(text, depth_limit);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": invalid JSON: " + one_line(e.what()));
  }
}

}  // namespace

SafetensorsCheckpoint::SafetensorsCheckpoint(std::string dir) : dir_(std::move(dir)) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw InputError(dir_ + ": not a directory");
  const fs::path single = fs::path(dir_) / "model.safetensors";
  const fs::path index = fs::path(dir_) / "model.safetensors.index.json";
  if (fs::exists(single, ec)) {
    files_.emplace_back(single.string());
    names_ = files_[0].names();
    for (const auto& n : names_) file_of_[n] = 0;
    return;
  }
  if (!fs::exists(index, ec))
    throw InputError(dir_ + ": holds neither model.safetensors nor model.safetensors.index.json");
  sharded_ = true;
  const std::string ipath = index.string();
  const nlohmann::json j = parse_index(ipath);
  if (!j.is_object()) throw InputError(ipath + ": index is not a JSON object");
  auto wm = j.find("weight_map");
  if (wm == j.end()) throw InputError(ipath + ": missing \"weight_map\"");
  if (!wm->is_object()) throw InputError(ipath + ": \"weight_map\" is not an object");
  std::map<std::string, std::size_t> file_index;  // file name -> index into files_
  for (const auto& [tensor, file_val] : wm->items()) {
    if (!file_val.is_string())
      throw InputError(ipath + ": tensor " + quote(tensor) + ": file name is not a string");
    const std::string file = file_val.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos ||
        file.find('\\') != std::string::npos || file.find("..") != std::string::npos ||
        file.find('\0') != std::string::npos)
      throw InputError(ipath + ": tensor " + quote(tensor) + ": file name " + quote(file) +
                       " must be a plain file name (no '/', '\\' or '..')");
    auto it = file_index.find(file);
    if (it == file_index.end()) {
      const fs::path fp = fs::path(dir_) / file;
      if (!fs::is_regular_file(fp, ec))
        throw InputError(ipath + ": tensor " + quote(tensor) + ": file " + quote(file) +
                         " does not exist in " + dir_);
      files_.emplace_back(fp.string());
      it = file_index.emplace(file, files_.size() - 1).first;
    }
    if (!files_[it->second].has(tensor))
      throw InputError(ipath + ": tensor " + quote(tensor) + " is mapped to " + quote(file) +
                       ", which does not hold it");
    file_of_[tensor] = it->second;
    names_.push_back(tensor);
  }
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) throw InputError(dir_ + ": no tensor " + quote(name));
  return files_[it->second];
}

const SafetensorsFile::Entry& SafetensorsCheckpoint::entry(const std::string& name) const {
  return file_of(name).entry(name);
}

void SafetensorsCheckpoint::read_f32(const std::string& name, int64_t elem_begin,
                                     int64_t elem_count, float* out) const {
  file_of(name).read_f32(name, elem_begin, elem_count, out);
}

std::vector<float> SafetensorsCheckpoint::read_f32(const std::string& name) const {
  return file_of(name).read_f32(name);
}

void SafetensorsCheckpoint::read_raw(const std::string& name, int64_t elem_begin,
                                     int64_t elem_count, void* out) const {
  file_of(name).read_raw(name, elem_begin, elem_count, out);
}

uint64_t SafetensorsCheckpoint::bytes_read() const {
  uint64_t n = 0;
  for (const auto& f : files_) n += f.bytes_read();
  return n;
}

void SafetensorsCheckpoint::reset_bytes_read() {
  for (auto& f : files_) f.reset_bytes_read();
}

// ---- Hugging Face model directories (writing) ----

int64_t parse_shard_size(const std::string& text, const std::string& what) {
  const std::string quoted = "\"" + escape_name(text) + "\"";
  const std::string expected =
      " (expected bytes as an integer, or an integer followed by KB, MB, GB = 10^3, 10^6, 10^9 "
      "bytes or KiB, MiB, GiB = 2^10, 2^20, 2^30 bytes, as save_pretrained's max_shard_size: "
      "\"5GB\", \"500MB\", \"2GiB\")";
  auto bad = [&](const std::string& why) { return InputError(what + ": " + why); };
  auto upper_ends_with = [&](const char* suffix) {
    const std::size_t n = std::strlen(suffix);
    if (text.size() < n) return false;
    for (std::size_t i = 0; i < n; ++i) {
      const char c = text[text.size() - n + i];
      if ((c >= 'a' && c <= 'z' ? static_cast<char>(c - 'a' + 'A') : c) != suffix[i]) return false;
    }
    return true;
  };
  // transformers' order of tests: the binary units first, then the decimal ones.
  struct Unit {
    const char* suffix;
    int64_t factor;
    bool bits_if_lowercase_b;
  };
  constexpr Unit kUnits[] = {{"GIB", int64_t{1} << 30, false}, {"MIB", int64_t{1} << 20, false},
                             {"KIB", int64_t{1} << 10, false}, {"GB", 1'000'000'000, true},
                             {"MB", 1'000'000, true},          {"KB", 1'000, true}};
  std::string number = text;
  int64_t factor = 1;
  bool bits = false;
  for (const Unit& u : kUnits) {
    if (upper_ends_with(u.suffix)) {
      number = text.substr(0, text.size() - std::strlen(u.suffix));
      factor = u.factor;
      bits = u.bits_if_lowercase_b && text.back() == 'b';
      break;
    }
  }
  // Python's int(): surrounding whitespace, an optional sign, digits with single '_' between.
  auto space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; };
  std::size_t b = 0, e = number.size();
  while (b < e && space(number[b])) ++b;
  while (e > b && space(number[e - 1])) --e;
  bool negative = false;
  if (b < e && (number[b] == '+' || number[b] == '-')) negative = number[b++] == '-';
  if (b == e) throw bad((text.empty() ? "empty" : quoted + " has no number") + expected);
  int64_t value = 0;
  bool overflow = false;
  for (std::size_t i = b; i < e; ++i) {
    const char c = number[i];
    if (c == '_' && i > b && i + 1 < e && number[i - 1] != '_' && number[i + 1] >= '0' && number[i + 1] <= '9') continue;
    if (c < '0' || c > '9') throw bad(quoted + " is not a size" + expected);
    overflow = overflow || __builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, c - '0', &value);
  }
  overflow = overflow || __builtin_mul_overflow(value, factor, &value);
  if (overflow)
    throw bad(quoted + " is more than " + std::to_string(std::numeric_limits<int64_t>::max()) + " bytes");
  if (bits) value /= 8;  // transformers: "5Gb" (lowercase b) is bits
  if (negative || value < 1) throw bad(quoted + " is less than 1 byte (a shard holds at least one)");
  return value;
}

std::vector<int> assign_shards(const std::vector<TensorInfo>& tensors, int64_t max_shard_size) {
  if (max_shard_size < 1)
    throw Error("safetensors: max_shard_size " + std::to_string(max_shard_size) + " is below 1 byte");
  std::vector<int> shard_of;
  shard_of.reserve(tensors.size());
  int shard = 0;
  int64_t size = 0;  // tensor bytes in `shard` so far
  for (const TensorInfo& t : tensors) {
    const int64_t bytes = t.bytes();
    if (!shard_of.empty() && bytes > max_shard_size - size) {
      ++shard;
      size = 0;
    }
    shard_of.push_back(shard);
    size += bytes;
  }
  return shard_of;
}

std::string shard_file_name(int index, int count) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index + 1, count);
  return buf;
}

bool is_shard_file_name(const std::string& f) {
  // model-<digits>-of-<digits>.safetensors, at least five digits each.
  auto digits = [&](std::size_t& i) {
    const std::size_t start = i;
    while (i < f.size() && f[i] >= '0' && f[i] <= '9') ++i;
    return i - start >= 5;
  };
  const std::string head = "model-", mid = "-of-", tail = ".safetensors";
  if (f.compare(0, head.size(), head) != 0) return false;
  std::size_t i = head.size();
  if (!digits(i) || f.compare(i, mid.size(), mid) != 0) return false;
  i += mid.size();
  if (!digits(i)) return false;
  return f.size() == i + tail.size() && f.compare(i, tail.size(), tail) == 0;
}

namespace {

// Removes `path` if it exists (not following a symlink). Throws fsdp::Error naming it.
void remove_if_present(const std::filesystem::path& path, const std::string& why) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) throw Error(path.string() + ": cannot remove " + why + ": " + ec.message());
}

}  // namespace

ModelWriter::ModelWriter(std::string dir, std::vector<TensorInfo> tensors, int64_t max_shard_size,
                         std::map<std::string, std::string> metadata)
    : dir_(std::move(dir)), tensors_(std::move(tensors)), metadata_(std::move(metadata)) {
  (void)Writer::encode_header(tensors_, {});  // names and dimensions across all shards
  shard_of_ = assign_shards(tensors_, max_shard_size);
  const int n = shard_of_.empty() ? 1 : shard_of_.back() + 1;
  for (int k = 0; k < n; ++k) files_.push_back(n == 1 ? std::string(kSingleFileName) : shard_file_name(k, n));
  for (const TensorInfo& t : tensors_) total_size_ += t.bytes();
  open_shard(0);
}

// The writers close their streams, then remove their temporaries unless committed.
ModelWriter::~ModelWriter() = default;

void ModelWriter::open_shard(int shard) {
  std::vector<TensorInfo> infos;
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    if (shard_of_[i] == shard) infos.push_back(tensors_[i]);
  writers_.push_back(std::make_unique<Writer>(
      (std::filesystem::path(dir_) / files_[static_cast<std::size_t>(shard)]).string(), std::move(infos), metadata_));
}

void ModelWriter::write_next(const float* data, int64_t count) {
  if (next_ >= tensors_.size())
    throw Error(dir_ + ": safetensors writer: more tensors written than declared");
  const int shard = shard_of_[next_];
  if (static_cast<std::size_t>(shard) == writers_.size()) open_shard(shard);
  Writer& w = *writers_[static_cast<std::size_t>(shard)];
  w.write_next(data, count);
  ++next_;
  if (next_ == tensors_.size() || shard_of_[next_] != shard) w.close();
}

std::string ModelWriter::index_json() const {
  nlohmann::json weight_map = nlohmann::json::object();
  for (std::size_t i = 0; i < tensors_.size(); ++i)
    weight_map[tensors_[i].name] = files_[static_cast<std::size_t>(shard_of_[i])];
  // nlohmann::json objects keep their keys sorted: json.dumps(index, indent=2, sort_keys=True).
  const nlohmann::json index = {{"metadata", {{"total_size", total_size_}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

void ModelWriter::finish() {
  namespace fs = std::filesystem;
  if (finished_) return;
  if (next_ != tensors_.size())
    throw Error(dir_ + ": safetensors writer: finish() before tensor \"" + tensors_[next_].name +
                "\" was written");
  for (auto& w : writers_) w->close();
  const fs::path dir(dir_);
  if (!sharded()) {
    writers_[0]->commit();  // from here on model.safetensors is what loads
    remove_stale(true);
    finished_ = true;
    return;
  }
  // Every shard is complete under its ".tmp" name; the index joins them.
  AtomicFile index((dir / kIndexFileName).string());
  {
    const std::string text = index_json();
    std::ofstream out(index.tmp_path(), std::ios::binary | std::ios::trunc);
    if (!out) throw Error(index.path() + ": cannot create " + index.tmp_path() + ": " + std::strerror(errno));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.close();
    if (!out) throw Error(index.path() + ": write failed: " + std::strerror(errno));
  }
  // A previous save's index must not name a file this save is about to replace: a crash
  // between the renames would leave it joining old and new shards.
  bool taken = false;
  std::error_code ec;
  for (const std::string& f : files_) taken = taken || fs::exists(fs::symlink_status(dir / f, ec));
  if (taken && fs::exists(fs::symlink_status(dir / kIndexFileName, ec))) {
    remove_if_present(dir / kIndexFileName, "the previous save's index");
    fsync_path(dir_, true);
  }
  for (auto& w : writers_) w->commit();
  index.commit();  // the new set is complete; an older model.safetensors still wins until removed
  remove_stale(false);
  finished_ = true;
}

void ModelWriter::remove_stale(bool single) {
  namespace fs = std::filesystem;
  const fs::path dir(dir_);
  // First the file that would still win (sharded) or join the stale shards (single).
  remove_if_present(dir / (single ? kIndexFileName : kSingleFileName), "a previous save's weights");
  remove_if_present(dir / (std::string(kIndexFileName) + ".tmp"), "a temporary of an earlier save");
  remove_if_present(dir / (std::string(kSingleFileName) + ".tmp"), "a temporary of an earlier save");
  const std::set<std::string> keep(files_.begin(), files_.end());
  std::vector<fs::path> stale;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool tmp = name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") == 0;
    const std::string base = tmp ? name.substr(0, name.size() - 4) : name;
    std::error_code ec2;
    if (is_shard_file_name(base) && (tmp || !keep.count(base)) && it->is_regular_file(ec2))
      stale.push_back(it->path());
  }
  if (ec) throw Error(dir_ + ": cannot list the directory: " + ec.message());
  for (const fs::path& p : stale) remove_if_present(p, "a previous save's shard");
  fsync_path(dir_, true);
}

}  // namespace fsdp::safetensors
