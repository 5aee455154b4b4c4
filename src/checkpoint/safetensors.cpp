// Streaming safetensors writer and small reader (see fsdp/checkpoint/safetensors.hpp).
#include "fsdp/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/core/error.hpp"

namespace fsdp::safetensors {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; a big-endian host needs byte swaps");

namespace {

// Flushes a written file to disk so the rename that follows publishes complete data.
void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open for fsync: " + std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw Error(path + ": fsync failed: " + std::strerror(errno));
}

}  // namespace

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
    const int64_t bytes = t.numel() * static_cast<int64_t>(sizeof(float));
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
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
    : path_(std::move(path)), tmp_path_(path_ + ".tmp"), tensors_(std::move(tensors)) {
  const std::string header = encode_header(tensors_, metadata);
  out_.open(tmp_path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error(tmp_path_ + ": cannot create file: " + std::strerror(errno));
  out_.write(header.data(), static_cast<std::streamsize>(header.size()));
  if (!out_) {
    out_.close();
    std::filesystem::remove(tmp_path_);
    throw Error(tmp_path_ + ": write failed");
  }
}

Writer::~Writer() {
  if (!finished_) {
    out_.close();
    std::error_code ec;
    std::filesystem::remove(tmp_path_, ec);  // never throw from a destructor
  }
}

std::string Writer::next_name() const {
  return next_ < tensors_.size() ? tensors_[next_].name : std::string();
}

void Writer::write_next(const float* data, int64_t count) {
  if (finished_ || next_ >= tensors_.size())
    throw Error(path_ + ": safetensors writer: more tensors written than declared");
  const TensorInfo& t = tensors_[next_];
  if (count != t.numel())
    throw Error(path_ + ": safetensors writer: tensor \"" + t.name + "\" has " +
                std::to_string(t.numel()) + " elements, got " + std::to_string(count));
  out_.write(reinterpret_cast<const char*>(data),
             static_cast<std::streamsize>(count * static_cast<int64_t>(sizeof(float))));
  if (!out_) throw Error(tmp_path_ + ": write failed for tensor \"" + t.name + "\"");
  ++next_;
}

void Writer::finish() {
  if (finished_) return;
  if (next_ != tensors_.size())
    throw Error(path_ + ": safetensors writer: finish() before tensor \"" +
                tensors_[next_].name + "\" was written");
  out_.flush();
  if (!out_) throw Error(tmp_path_ + ": flush failed");
  out_.close();
  fsync_file(tmp_path_);
  std::error_code ec;
  std::filesystem::rename(tmp_path_, path_, ec);
  if (ec) throw Error(path_ + ": cannot rename from " + tmp_path_ + ": " + ec.message());
  finished_ = true;
}

// ---- reader ----

Reader::Reader(std::string path) : path_(std::move(path)) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) throw InputError(path_ + ": cannot open safetensors file");
  const auto file_size = std::filesystem::file_size(path_);
  unsigned char n8[8];
  if (!in.read(reinterpret_cast<char*>(n8), 8))
    throw InputError(path_ + ": not a safetensors file (shorter than 8 bytes)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | n8[i];
  if (n > file_size - 8)
    throw InputError(path_ + ": safetensors header size " + std::to_string(n) +
                     " exceeds the file size " + std::to_string(file_size));
  header_size_ = n;
  std::string json(n, '\0');
  if (!in.read(json.data(), static_cast<std::streamsize>(n)))
    throw InputError(path_ + ": cannot read safetensors header");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path_ + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) throw InputError(path_ + ": safetensors header is not a JSON object");
  const uint64_t data_size = file_size - 8 - n;
  try {
    for (const auto& [key, val] : header.items()) {
      if (key == "__metadata__") {
        for (const auto& [mk, mv] : val.items()) metadata_[mk] = mv.get<std::string>();
        continue;
      }
      Entry e;
      e.dtype = val.at("dtype").get<std::string>();
      e.shape = val.at("shape").get<std::vector<int64_t>>();
      const auto offs = val.at("data_offsets").get<std::vector<int64_t>>();
      if (offs.size() != 2) throw InputError(path_ + ": tensor \"" + key + "\": data_offsets needs 2 values");
      e.begin = offs[0];
      e.end = offs[1];
      int64_t numel = 1;
      for (int64_t d : e.shape) numel *= d;
      const int64_t esize = e.dtype == "F32" ? 4 : e.dtype == "F16" || e.dtype == "BF16" ? 2 : 0;
      if (esize == 0) throw InputError(path_ + ": tensor \"" + key + "\": unsupported dtype " + e.dtype);
      if (e.begin < 0 || e.end - e.begin != numel * esize ||
          static_cast<uint64_t>(e.end) > data_size)
        throw InputError(path_ + ": tensor \"" + key + "\": data_offsets [" +
                         std::to_string(e.begin) + ", " + std::to_string(e.end) +
                         ") do not match its shape or the file size");
      names_.push_back(key);
      entries_[key] = std::move(e);
    }
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path_ + ": malformed safetensors header: " + e.what());
  }
}

const Reader::Entry& Reader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw InputError(path_ + ": no tensor named \"" + name + "\"");
  return it->second;
}

std::vector<float> Reader::read_f32(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.dtype != "F32") throw InputError(path_ + ": tensor \"" + name + "\" is " + e.dtype + ", not F32");
  std::vector<float> out(static_cast<std::size_t>((e.end - e.begin) / 4));
  std::ifstream in(path_, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(8 + header_size_ + e.begin));
  if (!in.read(reinterpret_cast<char*>(out.data()), e.end - e.begin))
    throw InputError(path_ + ": cannot read tensor \"" + name + "\"");
  return out;
}

}  // namespace fsdp::safetensors
