// Sharded checkpoint files and the step-directory protocol (see fsdp/checkpoint/checkpoint.hpp
// and docs/checkpoint.md). All HDF5 access goes through fsdp::h5::File.
#include "fsdp/checkpoint/checkpoint.hpp"

// xxHash's header-only mode: compiled with our flags (-march=x86-64-v3), XXH3 uses AVX2 and
// hashes at memory speed (Debian's libxxhash is built for baseline x86-64, half as fast).
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fsdp/core/atomic_file.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/h5/hdf5.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fsdp::ckpt {

// The checksum is over the little-endian bytes; the in-memory floats are those bytes.
static_assert(std::endian::native == std::endian::little, "checkpoint checksums assume a little-endian host");

// Blocked so the common (all finite) case is a branch-free, vectorisable pass.
int64_t first_nonfinite(const float* data, int64_t n) {
  constexpr int64_t kBlock = 4096;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    uint32_t bad = 0;
    for (int64_t i = b; i < e; ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(data[i]);
      bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    }
    if (bad)
      for (int64_t i = b; i < e; ++i)
        if (!std::isfinite(data[i])) return i;
  }
  return -1;
}

namespace {

// One pass over a dataset's floats, in cache-sized blocks: each block is scanned for
// non-finite values and then hashed while it is still in cache, so the data is read from
// memory once. Feed the dataset in order with update(), possibly in several calls.
class IntegrityScan {
 public:
  IntegrityScan() {
    XXH3_INITSTATE(&state_);
    if (XXH3_64bits_reset(&state_) != XXH_OK) throw Error("xxHash: cannot reset a hash state");
  }
  void update(const float* data, int64_t n) {
    constexpr int64_t kBlock = 16384;  // floats: 64 KiB
    for (int64_t b = 0; b < n; b += kBlock) {
      const int64_t c = std::min(kBlock, n - b);
      if (bad_ < 0) {
        const int64_t i = first_nonfinite(data + b, c);
        if (i >= 0) {
          bad_ = pos_ + b + i;
          bad_value_ = data[b + i];
        }
      }
      XXH3_64bits_update(&state_, data + b, static_cast<std::size_t>(c) * sizeof(float));
    }
    pos_ += n;
  }
  uint64_t digest() const { return XXH3_64bits_digest(&state_); }
  int64_t first_bad() const { return bad_; }  // element index, -1 if all finite
  float bad_value() const { return bad_value_; }

 private:
  XXH3_state_t state_;
  int64_t pos_ = 0;
  int64_t bad_ = -1;
  float bad_value_ = 0.0f;
};

std::string float_name(float v) { return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"); }

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// "tensor /units/3/param (unit h.1)": how integrity messages name a dataset.
std::string tensor_name(int unit, const std::string& unit_name, const std::string& dataset) {
  return "tensor /units/" + std::to_string(unit) + "/" + dataset + " (unit " + unit_name + ")";
}

// "flat element 1041, parameter h.1.ln_1.weight" (or "padding") for a flat element index.
std::string flat_element_name(const FlatParamLayout& l, int64_t flat) {
  std::string where = "flat element " + std::to_string(flat);
  for (const FlatEntry& e : l.entries)
    if (flat >= e.offset && flat < e.offset + e.spec.numel()) return where + ", parameter " + e.spec.name;
  return where + ", padding";
}

std::string unit_group(int u) { return "/units/" + std::to_string(u); }

json entries_json(const FlatParamLayout& l) {
  json arr = json::array();
  for (const FlatEntry& e : l.entries) {
    arr.push_back({{"name", e.spec.name},
                   {"shape", e.spec.shape},
                   {"offset", e.offset},
                   {"weight_decay", e.spec.weight_decay}});
  }
  return arr;
}


// Throws the standard incompatibility message.
template <class A, class B>
[[noreturn]] void incompatible(const std::string& file, const std::string& what, const A& has,
                               const B& run) {
  std::ostringstream os;
  os << file << ": incompatible checkpoint: " << what << " differs (checkpoint has " << has
     << ", run has " << run << ")";
  throw InputError(os.str());
}

void check_layout_sane(const std::string& file, int u, const FlatParamLayout& l) {
  const std::string where = file + ": unit " + std::to_string(u) + " (" + l.unit_name + "): ";
  if (l.num_shards < 1 || l.shard_numel < 0 || l.padded_numel != l.shard_numel * l.num_shards ||
      l.numel > l.padded_numel || l.numel < 0)
    throw InputError(where + "inconsistent layout (numel " + std::to_string(l.numel) + ", padded_numel " +
                     std::to_string(l.padded_numel) + ", num_shards " + std::to_string(l.num_shards) +
                     ", shard_numel " + std::to_string(l.shard_numel) + ")");
  for (const FlatEntry& e : l.entries) {
    if (e.offset < 0 || e.offset + e.spec.numel() > l.numel)
      throw InputError(where + "entry " + e.spec.name + " at offset " + std::to_string(e.offset) +
                       " with " + std::to_string(e.spec.numel()) + " elements exceeds numel " +
                       std::to_string(l.numel));
  }
}

// The N of every shard_i-of-N.h5 file in `step_dir` (a directory that exists).
std::set<int64_t> shard_counts(const std::string& step_dir) {
  static const std::regex pat(R"(shard_(\d{5,})-of-(\d{5,})\.h5)");
  std::set<int64_t> counts;
  std::error_code ec;
  for (const auto& de : fs::directory_iterator(step_dir, ec)) {
    std::smatch mt;
    const std::string name = de.path().filename().string();
    if (std::regex_match(name, mt, pat)) counts.insert(std::stoll(mt[2].str()));
  }
  return counts;
}

// The single shard count of `step_dir`'s files, 0 if none or ambiguous.
int stored_shard_count(const std::string& step_dir) {
  const auto c = shard_counts(step_dir);
  return c.size() == 1 ? static_cast<int>(*c.begin()) : 0;
}

// ---- the metadata checksum (format version 3; metadata_checksum in checkpoint.hpp) ----

// The attributes covered, in hashing order, with the type the format gives them.
enum class AttrKind : char { i64 = 'i', f64 = 'f', str = 's' };
struct AttrDecl {
  const char* name;
  AttrKind kind;
};
constexpr AttrDecl kRootAttrs[] = {
    {"format", AttrKind::str},           {"format_version", AttrKind::i64},
    {"step", AttrKind::i64},             {"world_size", AttrKind::i64},
    {"shard_size", AttrKind::i64},       {"replicate_size", AttrKind::i64},
    {"shard_index", AttrKind::i64},      {"sharding_strategy", AttrKind::str},
    {"optimizer", AttrKind::str},        {"seed", AttrKind::i64},
    {"sampler_epoch", AttrKind::i64},    {"sampler_position", AttrKind::i64},
    {"optimizer_updates", AttrKind::i64}, {"loss_scale", AttrKind::f64},
    {"loss_scale_good_steps", AttrKind::i64}, {"model_config", AttrKind::str},
    {"train_config", AttrKind::str},     {"config_fingerprint", AttrKind::str},
    {"run_id", AttrKind::str},           {"launch_id", AttrKind::str},
    {"num_units", AttrKind::i64}};
constexpr AttrDecl kUnitAttrs[] = {
    {"unit_name", AttrKind::str}, {"numel", AttrKind::i64},       {"padded_numel", AttrKind::i64},
    {"num_shards", AttrKind::i64}, {"shard_numel", AttrKind::i64}, {"entries", AttrKind::str},
    {"state", AttrKind::str}};

// Streams the framed items of the metadata into XXH3-64.
class MetadataHasher {
 public:
  MetadataHasher() {
    XXH3_INITSTATE(&state_);
    if (XXH3_64bits_reset(&state_) != XXH_OK) throw Error("xxHash: cannot reset a hash state");
  }
  // Hashes attribute `a` of `obj` (or its absence) as the format's type; returns the value
  // when it is a string (the unit's `state` list is needed to find its datasets).
  std::string attr(const h5::File& f, const std::string& obj, const AttrDecl& a) {
    put(obj.data(), obj.size() + 1);  // with the NUL
    put(a.name, std::strlen(a.name) + 1);
    if (!f.has_attr(obj, a.name)) {
      put("-", 1);
      return {};
    }
    const char tag = static_cast<char>(a.kind);
    put(&tag, 1);
    switch (a.kind) {
      case AttrKind::i64: {
        const int64_t v = f.attr_i64(obj, a.name);
        put(&v, 8);
        return {};
      }
      case AttrKind::f64: {
        const double v = f.attr_f64(obj, a.name);
        put(&v, 8);
        return {};
      }
      case AttrKind::str: {
        std::string v = f.attr_str(obj, a.name);
        const uint64_t n = v.size();
        put(&n, 8);
        put(v.data(), v.size());
        return v;
      }
    }
    return {};
  }
  std::string hex() const { return hex64(XXH3_64bits_digest(&state_)); }

 private:
  void put(const void* p, std::size_t n) { XXH3_64bits_update(&state_, p, n); }
  XXH3_state_t state_;
};

// metadata_checksum of an open file (write_shard_file hashes what it has just written, so the
// writer and the reader hash exactly the same values).
std::string metadata_digest(const h5::File& f) {
  MetadataHasher h;
  for (const AttrDecl& a : kRootAttrs) h.attr(f, "/", a);
  const int64_t num_units = f.has_attr("/", "num_units") ? f.attr_i64("/", "num_units") : 0;
  for (int64_t u = 0; u < num_units; ++u) {
    const std::string g = "/units/" + std::to_string(u);
    if (!f.exists(g)) break;  // a forged num_units: the digest differs, no need to go on
    std::string state;
    for (const AttrDecl& a : kUnitAttrs) {
      std::string v = h.attr(f, g, a);
      if (std::strcmp(a.name, "state") == 0) state = std::move(v);
    }
    std::vector<std::string> datasets{"param"};
    try {
      const json names = json::parse(state);
      if (names.is_array())
        for (const json& n : names)
          if (n.is_string()) datasets.push_back(n.get<std::string>());
    } catch (const json::exception&) {
      // Not a list: the reader refuses it later; its bytes are hashed above.
    }
    for (const std::string& d : datasets) {
      if (d.empty() || d.find('/') != std::string::npos || !f.exists(g + "/" + d)) continue;
      h.attr(f, g + "/" + d, AttrDecl{kChecksumAttr, AttrKind::str});
    }
  }
  return h.hex();
}

}  // namespace

std::string metadata_checksum(const std::string& path) {
  const h5::File f = h5::File::open_read(path);
  return metadata_digest(f);
}

const std::string& process_run_id() {
  static const std::string id = new_run_id();
  return id;
}

bool is_run_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

std::string new_run_id() {
  struct {
    uint64_t random[4] = {0, 0, 0, 0};
    int64_t wall_ns = 0, steady_ns = 0;
    int64_t pid = 0;
    uint64_t counter = 0;
  } seed;
  try {
    std::random_device rd;
    for (uint64_t& w : seed.random) w = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {
    // No entropy source: the clocks, pid and counter below still make it unique in practice.
  }
  static std::atomic<uint64_t> calls{0};
  seed.wall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch()).count();
  seed.steady_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch()).count();
  seed.pid = static_cast<int64_t>(::getpid());
  seed.counter = calls.fetch_add(1);
  const XXH128_hash_t h = XXH3_128bits(&seed, sizeof seed);
  return hex64(h.high64) + hex64(h.low64);
}

// ---- writing ----

void write_shard_file(const std::string& path, const CheckpointMeta& meta,
                      const std::vector<UnitShardView>& units) {
  // Validate before touching the disk.
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitShardView& v = units[u];
    const std::string where = path + ": unit " + std::to_string(u) + ": ";
    if (!v.layout || !v.param) throw Error(where + "null layout or param pointer");
    if (v.layout->num_shards != meta.shard_size)
      throw Error(where + "layout has num_shards " + std::to_string(v.layout->num_shards) +
                  " but meta.shard_size is " + std::to_string(meta.shard_size));
    for (const auto& [name, ptr] : v.state) {
      if (name.empty() || name == "param" || name.find('/') != std::string::npos)
        throw Error(where + "invalid optimizer-state name \"" + name + "\"");
      if (!ptr) throw Error(where + "null pointer for state \"" + name + "\"");
    }
  }
  if (meta.shard_index < 0 || meta.shard_index >= meta.shard_size)
    throw Error(path + ": shard_index " + std::to_string(meta.shard_index) + " out of range [0, " +
                std::to_string(meta.shard_size) + ")");
  if (!is_run_id(meta.run_id) || !is_run_id(meta.launch_id))
    throw Error(path + ": meta.run_id \"" + safetensors::escape_name(meta.run_id) + "\" or meta.launch_id \"" +
                safetensors::escape_name(meta.launch_id) + "\" is not 32 lowercase hex digits (ckpt::new_run_id)");
  // Never publish a non-finite value: a resume would load it and every later step be NaN.
  // The same pass (one read of each buffer, hashed block by block while in cache) computes
  // the checksums: param, then the state datasets, unit by unit.
  // Fetched views are scanned as they are written (below), with the same error.
  auto scanned = [&](std::size_t u, const std::string& dataset, const float* data) {
    const UnitShardView& v = units[u];
    IntegrityScan scan;
    scan.update(data, v.layout->shard_numel);
    if (const int64_t bad = scan.first_bad(); bad >= 0)
      throw Error(path + ": refusing to save step " + std::to_string(meta.step) + ": " +
                  tensor_name(static_cast<int>(u), v.layout->unit_name, dataset) + " element " +
                  std::to_string(bad) + " (" +
                  flat_element_name(*v.layout, meta.shard_index * v.layout->shard_numel + bad) +
                  ") is " + float_name(scan.bad_value()));
    return hex64(scan.digest());
  };
  std::vector<std::string> sums;
  for (std::size_t u = 0; u < units.size(); ++u) {
    const UnitShardView& v = units[u];
    if (v.fetch) continue;
    sums.push_back(scanned(u, "param", v.param));
    for (const auto& [name, ptr] : v.state) sums.push_back(scanned(u, name, ptr));
  }
  std::vector<float> staged;  // a fetched dataset's host copy, reused

  AtomicFile out(path);
  out.write([&](const std::string& tmp) {
    h5::File f = h5::File::create(tmp);
    f.set_attr("/", "format", std::string(kFormatName));
    f.set_attr("/", "format_version", kFormatVersion);
    f.set_attr("/", "step", meta.step);
    f.set_attr("/", "world_size", int64_t{meta.world_size});
    f.set_attr("/", "shard_size", int64_t{meta.shard_size});
    f.set_attr("/", "replicate_size", int64_t{meta.replicate_size});
    f.set_attr("/", "shard_index", int64_t{meta.shard_index});
    f.set_attr("/", "sharding_strategy", meta.sharding_strategy);
    f.set_attr("/", "optimizer", meta.optimizer);
    f.set_attr("/", "seed", static_cast<int64_t>(meta.seed));  // same bits
    f.set_attr("/", "sampler_epoch", meta.sampler_epoch);
    f.set_attr("/", "sampler_position", meta.sampler_position);
    f.set_attr("/", "optimizer_updates", meta.optimizer_updates < 0 ? meta.step : meta.optimizer_updates);
    f.set_attr("/", "loss_scale", meta.loss_scale);
    f.set_attr("/", "loss_scale_good_steps", meta.loss_scale_good_steps);
    f.set_attr("/", "model_config", meta.model_config_json);
    f.set_attr("/", "train_config", meta.train_config_toml);
    f.set_attr("/", "config_fingerprint", meta.config_fingerprint);
    f.set_attr("/", "run_id", meta.run_id);
    f.set_attr("/", "launch_id", meta.launch_id);
    f.set_attr("/", "num_units", static_cast<int64_t>(units.size()));
    f.create_group("/units");
    std::size_t next_sum = 0;
    for (std::size_t u = 0; u < units.size(); ++u) {
      const UnitShardView& v = units[u];
      const FlatParamLayout& l = *v.layout;
      const std::string g = unit_group(static_cast<int>(u));
      f.create_group(g);
      f.set_attr(g, "unit_name", l.unit_name);
      f.set_attr(g, "numel", l.numel);
      f.set_attr(g, "padded_numel", l.padded_numel);
      f.set_attr(g, "num_shards", l.num_shards);
      f.set_attr(g, "shard_numel", l.shard_numel);
      f.set_attr(g, "entries", entries_json(l).dump());
      json names = json::array();
      for (const auto& s : v.state) names.push_back(s.first);
      f.set_attr(g, "state", names.dump());
      const std::vector<hsize_t> shape{static_cast<hsize_t>(l.shard_numel)};
      auto write = [&](const std::string& dataset, const float* data) {
        std::string sum;
        if (v.fetch) {
          staged.resize(static_cast<std::size_t>(l.shard_numel));
          v.fetch(data, staged.data(), l.shard_numel);
          data = staged.data();
          sum = scanned(u, dataset, data);
        } else {
          sum = sums.at(next_sum++);
        }
        f.write_f32(g + "/" + dataset, data, shape);
        f.set_attr(g + "/" + dataset, kChecksumAttr, sum);
      };
      write("param", v.param);
      for (const auto& [name, ptr] : v.state) write(name, ptr);
    }
    // Last: the checksum of every attribute above, as the reader will read them back.
    f.set_attr("/", kMetadataChecksumAttr, metadata_digest(f));
    f.close();
  });
}

// ---- reading ----

ShardFile::ShardFile() = default;
ShardFile::ShardFile(ShardFile&&) noexcept = default;
ShardFile& ShardFile::operator=(ShardFile&&) noexcept = default;
ShardFile::~ShardFile() = default;

const std::string& ShardFile::path() const { return file_->path(); }

ShardFile ShardFile::open(const std::string& path) {
  ShardFile sf;
  sf.file_ = std::make_unique<h5::File>(h5::File::open_read(path));
  const h5::File& f = *sf.file_;
  if (!f.has_attr("/", "format") || f.attr_str("/", "format") != kFormatName)
    throw InputError(path + ": not an fsdp_train checkpoint (root attribute format != \"" +
                     std::string(kFormatName) + "\")");
  const int64_t version = f.attr_i64("/", "format_version");
  if (version < kMinFormatVersion || version > kFormatVersion)
    throw InputError(path + ": unsupported checkpoint format_version " + std::to_string(version) +
                     " (expected " + std::to_string(kMinFormatVersion) + " to " +
                     std::to_string(kFormatVersion) + ")");
  // The metadata checksum, before any other value of the file is believed. A file holding
  // the attribute is verified whatever its format_version says (a version changed after the
  // save is caught here: format_version is hashed too).
  const bool has_sum = f.has_attr("/", kMetadataChecksumAttr);
  if (version >= 3 && !has_sum)
    throw InputError(path + ": no " + std::string(kMetadataChecksumAttr) + " attribute (format_version " +
                     std::to_string(version) + " has one): the file is corrupted");
  if (has_sum) {
    const std::string stored = f.attr_str("/", kMetadataChecksumAttr);
    const std::string computed = metadata_digest(f);
    if (stored != computed)
      throw InputError(path + ": metadata checksum mismatch (stored " +
                       safetensors::escape_name(stored.substr(0, 32)) + ", computed " + computed +
                       "): an attribute was changed after the save (model config, layouts, step, run id, "
                       "optimizer state, ...); the file is corrupted");
  }
  CheckpointMeta& m = sf.meta_;
  m.format_version = version;
  m.step = f.attr_i64("/", "step");
  if (m.step < 0 || m.step > kMaxStep)
    throw InputError(path + ": root attribute step = " + std::to_string(m.step) +
                     " is out of range [0, 2^40]: the file is corrupted");
  m.world_size = static_cast<int>(f.attr_i64("/", "world_size"));
  m.shard_size = static_cast<int>(f.attr_i64("/", "shard_size"));
  m.replicate_size = static_cast<int>(f.attr_i64("/", "replicate_size"));
  m.shard_index = static_cast<int>(f.attr_i64("/", "shard_index"));
  m.sharding_strategy = f.attr_str("/", "sharding_strategy");
  m.optimizer = f.attr_str("/", "optimizer");
  m.seed = static_cast<uint64_t>(f.attr_i64("/", "seed"));
  m.sampler_epoch = f.attr_i64("/", "sampler_epoch");
  m.sampler_position = f.attr_i64("/", "sampler_position");
  m.optimizer_updates = f.has_attr("/", "optimizer_updates") ? f.attr_i64("/", "optimizer_updates") : m.step;
  if (m.optimizer_updates < 0 || m.optimizer_updates > m.step)
    throw InputError(path + ": root attribute optimizer_updates = " + std::to_string(m.optimizer_updates) +
                     " is out of range [0, step = " + std::to_string(m.step) + "]: the file is corrupted");
  m.loss_scale = f.has_attr("/", "loss_scale") ? f.attr_f64("/", "loss_scale") : 0.0;
  m.loss_scale_good_steps =
      f.has_attr("/", "loss_scale_good_steps") ? f.attr_i64("/", "loss_scale_good_steps") : 0;
  m.model_config_json = f.attr_str("/", "model_config");
  m.train_config_toml = f.attr_str("/", "train_config");
  if (version >= 2) m.config_fingerprint = f.attr_str("/", "config_fingerprint");
  m.run_id.clear();  // not the defaults (process_run_id): "" unless the file has them
  m.launch_id.clear();
  if (version >= 3) {
    m.run_id = f.attr_str("/", "run_id");
    m.launch_id = f.attr_str("/", "launch_id");
    for (const auto* id : {&m.run_id, &m.launch_id})
      if (!is_run_id(*id))
        throw InputError(path + ": root attribute " + (id == &m.run_id ? "run_id" : "launch_id") + " = \"" +
                         safetensors::escape_name(id->substr(0, 64)) +
                         "\" is not 32 lowercase hex digits: the file is corrupted");
  }
  const int64_t num_units = f.attr_i64("/", "num_units");
  if (num_units < 0) throw InputError(path + ": negative num_units");
  for (int u = 0; u < num_units; ++u) {
    const std::string g = unit_group(u);
    FlatParamLayout l;
    l.unit_name = f.attr_str(g, "unit_name");
    l.numel = f.attr_i64(g, "numel");
    l.padded_numel = f.attr_i64(g, "padded_numel");
    l.num_shards = f.attr_i64(g, "num_shards");
    l.shard_numel = f.attr_i64(g, "shard_numel");
    std::vector<std::string> state;
    try {
      for (const json& e : json::parse(f.attr_str(g, "entries"))) {
        FlatEntry fe;
        fe.spec.name = e.at("name").get<std::string>();
        fe.spec.shape = e.at("shape").get<std::vector<int64_t>>();
        fe.spec.weight_decay = e.value("weight_decay", true);
        fe.offset = e.at("offset").get<int64_t>();
        l.entries.push_back(std::move(fe));
      }
      state = json::parse(f.attr_str(g, "state")).get<std::vector<std::string>>();
    } catch (const json::exception& e) {
      throw InputError(path + ": " + g + ": malformed entries/state attribute: " + e.what());
    }
    check_layout_sane(path, u, l);
    if (l.num_shards != m.shard_size)
      throw InputError(path + ": unit " + std::to_string(u) + " has num_shards " +
                       std::to_string(l.num_shards) + " but the file's shard_size is " +
                       std::to_string(m.shard_size));
    std::vector<std::string> datasets = state;
    datasets.insert(datasets.begin(), "param");
    for (const std::string& d : datasets) {
      const auto dims = f.dims(g + "/" + d);
      if (dims.size() != 1 || static_cast<int64_t>(dims[0]) != l.shard_numel)
        throw InputError(path + ": " + g + "/" + d + " has the wrong size (expected " +
                         std::to_string(l.shard_numel) + " elements)");
    }
    sf.layouts_.push_back(std::move(l));
    sf.state_names_.push_back(std::move(state));
  }
  sf.verified_.resize(sf.layouts_.size());
  return sf;
}

const std::vector<std::string>& ShardFile::state_names(int unit) const {
  if (unit < 0 || unit >= num_units())
    throw InputError(path() + ": no unit " + std::to_string(unit) + " (checkpoint has " +
                     std::to_string(num_units()) + ")");
  return state_names_[unit];
}

bool ShardFile::has_dataset(int unit, const std::string& dataset) const {
  if (unit < 0 || unit >= num_units()) return false;
  if (dataset == "param") return true;
  for (const auto& s : state_names_[unit])
    if (s == dataset) return true;
  return false;
}

bool ShardFile::is_verified(int unit, const std::string& dataset) const {
  const auto& v = verified_.at(static_cast<std::size_t>(unit));
  return std::find(v.begin(), v.end(), dataset) != v.end();
}

namespace {

// The end of a verification: checksum first (a mismatch means the bytes are not the ones
// written, whatever they hold), then finiteness.
void verify_result(const h5::File& f, int64_t version, int unit, const FlatParamLayout& l,
                   int shard_index, const std::string& dataset, uint64_t computed, int64_t bad,
                   float bad_value) {
  const std::string ds = unit_group(unit) + "/" + dataset;
  const std::string where = f.path() + ": " + tensor_name(unit, l.unit_name, dataset) + ": ";
  if (version >= 2) {
    if (!f.has_attr(ds, kChecksumAttr))
      throw InputError(where + "no " + std::string(kChecksumAttr) + " checksum attribute (format_version " +
                       std::to_string(version) + " has one per dataset): the file is corrupted");
    const std::string stored = f.attr_str(ds, kChecksumAttr);
    if (stored != hex64(computed))
      throw InputError(where + "checksum mismatch (stored " + safetensors::escape_name(stored.substr(0, 32)) +
                       ", computed " + hex64(computed) + "): the file is corrupted");
  }
  if (bad >= 0)
    throw InputError(where + "element " + std::to_string(bad) + " (" +
                     flat_element_name(l, shard_index * l.shard_numel + bad) + ") is " +
                     float_name(bad_value) + ": the checkpoint holds a non-finite value");
}

}  // namespace

void ShardFile::check_data(int unit, const std::string& dataset, const float* data, int64_t n) const {
  IntegrityScan scan;
  scan.update(data, n);
  verify_result(*file_, meta_.format_version, unit, layouts_[unit], meta_.shard_index, dataset,
                scan.digest(), scan.first_bad(), scan.bad_value());
  verified_[static_cast<std::size_t>(unit)].push_back(dataset);
}

void ShardFile::verify(int unit, const std::string& dataset) const {
  if (!has_dataset(unit, dataset))
    throw InputError(path() + ": unit " + std::to_string(unit) + " has no dataset \"" + dataset + "\"");
  if (is_verified(unit, dataset)) return;
  const int64_t n = layouts_[unit].shard_numel;
  constexpr int64_t kChunk = int64_t{1} << 20;  // floats: 4 MiB
  std::vector<float> buf(static_cast<std::size_t>(std::min(n, kChunk)));
  IntegrityScan scan;
  for (int64_t b = 0; b < n; b += kChunk) {
    const int64_t c = std::min(kChunk, n - b);
    file_->read_f32(unit_group(unit) + "/" + dataset, buf.data(), static_cast<hsize_t>(b), static_cast<hsize_t>(c));
    scan.update(buf.data(), c);
  }
  verify_result(*file_, meta_.format_version, unit, layouts_[unit], meta_.shard_index, dataset,
                scan.digest(), scan.first_bad(), scan.bad_value());
  verified_[static_cast<std::size_t>(unit)].push_back(dataset);
}

void ShardFile::verify_all() const {
  for (int u = 0; u < num_units(); ++u) {
    verify(u, "param");
    for (const std::string& s : state_names_[u]) verify(u, s);
  }
}

void ShardFile::read_unit_range(int unit, const std::string& dataset, int64_t offset, int64_t count,
                                float* out) const {
  if (!has_dataset(unit, dataset))
    throw InputError(path() + ": unit " + std::to_string(unit) + " has no dataset \"" + dataset + "\"");
  const int64_t n = layouts_[unit].shard_numel;
  if (offset < 0 || count < 0 || offset + count > n)
    throw Error(path() + ": " + tensor_name(unit, layouts_[unit].unit_name, dataset) + ": range [" +
                std::to_string(offset) + ", " + std::to_string(offset + count) + ") outside its " +
                std::to_string(n) + " elements");
  const bool whole = offset == 0 && count == n;
  if (!whole) verify(unit, dataset);  // streamed once, before the first partial read
  file_->read_f32(unit_group(unit) + "/" + dataset, out, static_cast<hsize_t>(offset),
                  static_cast<hsize_t>(count));
  if (whole && !is_verified(unit, dataset)) check_data(unit, dataset, out, n);
}

void ShardFile::read_unit(int unit, const std::string& dataset, float* out) const {
  if (unit < 0 || unit >= num_units()) (void)state_names(unit);  // throws the message
  read_unit_range(unit, dataset, 0, layouts_[unit].shard_numel, out);
}

void ShardFile::check_compatible(const CheckpointMeta& expected,
                                 const std::vector<FlatParamLayout>& expected_layouts) const {
  const std::string& p = path();
  const CheckpointMeta& m = meta_;
  if (m.world_size != expected.world_size) incompatible(p, "world_size", m.world_size, expected.world_size);
  if (m.shard_size != expected.shard_size) incompatible(p, "shard_size", m.shard_size, expected.shard_size);
  if (m.replicate_size != expected.replicate_size)
    incompatible(p, "replicate_size", m.replicate_size, expected.replicate_size);
  if (m.shard_index != expected.shard_index) incompatible(p, "shard_index", m.shard_index, expected.shard_index);
  if (m.optimizer != expected.optimizer) incompatible(p, "optimizer", m.optimizer, expected.optimizer);
  if (layouts_.size() != expected_layouts.size())
    incompatible(p, "number of FSDP units", layouts_.size(), expected_layouts.size());
  for (std::size_t u = 0; u < layouts_.size(); ++u) {
    const FlatParamLayout& a = layouts_[u];
    const FlatParamLayout& b = expected_layouts[u];
    const std::string unit = "unit " + std::to_string(u) + " ";
    if (a.unit_name != b.unit_name) incompatible(p, unit + "name", a.unit_name, b.unit_name);
    const std::string un = "unit " + std::to_string(u) + " (" + a.unit_name + ") ";
    if (a.numel != b.numel) incompatible(p, un + "numel", a.numel, b.numel);
    if (a.num_shards != b.num_shards) incompatible(p, un + "num_shards", a.num_shards, b.num_shards);
    if (a.padded_numel != b.padded_numel) incompatible(p, un + "padded_numel", a.padded_numel, b.padded_numel);
    if (a.shard_numel != b.shard_numel) incompatible(p, un + "shard_numel", a.shard_numel, b.shard_numel);
    if (a.entries.size() != b.entries.size())
      incompatible(p, un + "number of parameters", a.entries.size(), b.entries.size());
    for (std::size_t i = 0; i < a.entries.size(); ++i) {
      const FlatEntry& ea = a.entries[i];
      const FlatEntry& eb = b.entries[i];
      const std::string en = un + "parameter " + std::to_string(i) + " ";
      if (ea.spec.name != eb.spec.name) incompatible(p, en + "name", ea.spec.name, eb.spec.name);
      if (ea.spec.shape != eb.spec.shape)
        incompatible(p, un + ea.spec.name + " shape", shape_json(ea.spec.shape), shape_json(eb.spec.shape));
      if (ea.offset != eb.offset) incompatible(p, un + ea.spec.name + " offset", ea.offset, eb.offset);
    }
  }
}

// ---- a whole step directory ----

CheckpointSet CheckpointSet::open(const std::string& step_dir) {
  CheckpointSet set;
  set.dir_ = step_dir;
  std::error_code ec;
  if (!fs::is_directory(step_dir, ec))
    throw InputError(step_dir + ": checkpoint directory not found");
  const std::set<int64_t> counts = shard_counts(step_dir);
  if (counts.empty())
    throw InputError(step_dir + ": no shard files (expected " + shard_file_name(0, 1) + " or " +
                     shard_file_name(0, 2) + ", ...)");
  if (counts.size() > 1)
    throw InputError(step_dir + ": shard files of different shard counts (" +
                     std::to_string(*counts.begin()) + " and " + std::to_string(*counts.rbegin()) + ")");
  const int n = static_cast<int>(*counts.begin());
  if (n < 1) throw InputError(step_dir + ": shard files claim 0 shards");
  for (int s = 0; s < n; ++s) {
    const std::string p = (fs::path(step_dir) / shard_file_name(s, n)).string();
    if (!fs::exists(p, ec))
      throw InputError(p + ": missing shard file (the checkpoint has " + std::to_string(n) + " shards)");
  }
  for (int s = 0; s < n; ++s) {
    const std::string p = (fs::path(step_dir) / shard_file_name(s, n)).string();
    ShardFile sf = ShardFile::open(p);
    const CheckpointMeta& m = sf.meta();
    if (m.shard_size != n) incompatible(p, "shard_size (file name vs attribute)", m.shard_size, n);
    if (m.shard_index != s) incompatible(p, "shard_index (file name vs attribute)", m.shard_index, s);
    if (s > 0) {
      const ShardFile& first = set.shards_.front();
      if (m.step != first.meta().step)
        throw InputError(p + ": step " + std::to_string(m.step) + " differs from " + first.path() +
                         " (step " + std::to_string(first.meta().step) + ")");
      CheckpointMeta expect = first.meta();
      expect.shard_index = s;
      try {
        sf.check_compatible(expect, first.layouts());
      } catch (const Error& e) {
        throw InputError(std::string(e.what()) + " [compared with " + first.path() + "]");
      }
      if (m.model_config_json != first.meta().model_config_json)
        throw InputError(p + ": model_config differs from " + first.path());
      if (m.format_version != first.meta().format_version)
        throw InputError(p + ": format_version " + std::to_string(m.format_version) + " differs from " +
                         first.path() + " (format_version " + std::to_string(first.meta().format_version) + ")");
      if (m.run_id != first.meta().run_id)
        throw InputError(p + ": run_id " + m.run_id + " differs from " + first.path() + " (run_id " +
                         first.meta().run_id + "): the shards come from different runs");
      if (m.launch_id != first.meta().launch_id)
        throw InputError(p + ": launch_id " + m.launch_id + " differs from " + first.path() + " (launch_id " +
                         first.meta().launch_id +
                         "): the shards were written by different launches of fsdp_train, not by one save");
      if (m.config_fingerprint != first.meta().config_fingerprint)
        throw InputError(p + ": config_fingerprint " + m.config_fingerprint + " differs from " + first.path() +
                         " (" + first.meta().config_fingerprint + "): the shards come from different runs");
      // The run-level counters every shard of one save holds alike.
      const CheckpointMeta& f0 = first.meta();
      auto same = [&](const char* what, auto a, auto b) {
        if (a == b) return;
        std::ostringstream os;
        os.precision(17);
        os << p << ": " << what << " " << a << " differs from " << first.path() << " (" << b
           << "): the shards do not come from one save";
        throw InputError(os.str());
      };
      same("seed", m.seed, f0.seed);
      same("sampler_epoch", m.sampler_epoch, f0.sampler_epoch);
      same("sampler_position", m.sampler_position, f0.sampler_position);
      same("optimizer_updates", m.optimizer_updates, f0.optimizer_updates);
      same("loss_scale", m.loss_scale, f0.loss_scale);
      same("loss_scale_good_steps", m.loss_scale_good_steps, f0.loss_scale_good_steps);
      for (int u = 0; u < sf.num_units(); ++u)
        if (sf.state_names(u) != first.state_names(u))
          throw InputError(p + ": unit " + std::to_string(u) + " optimizer-state datasets differ from " +
                           first.path());
    }
    set.shards_.push_back(std::move(sf));
  }
  return set;
}

void CheckpointSet::verify_all() const {
  for (const ShardFile& s : shards_) s.verify_all();
}

void CheckpointSet::read_flat(int unit, const std::string& dataset, int64_t begin, int64_t count,
                              float* out) const {
  const auto& ls = layouts();
  if (unit < 0 || unit >= static_cast<int>(ls.size()))
    throw InputError(dir_ + ": no unit " + std::to_string(unit));
  const FlatParamLayout& l = ls[unit];
  if (begin < 0 || count < 0 || begin + count > l.padded_numel)
    throw Error(dir_ + ": unit " + std::to_string(unit) + ": flat range [" + std::to_string(begin) + ", " +
                std::to_string(begin + count) + ") outside padded_numel " + std::to_string(l.padded_numel));
  if (count == 0 || l.shard_numel == 0) return;
  const int64_t end = begin + count;
  for (int64_t s = begin / l.shard_numel; s < l.num_shards && l.shard_begin(s) < end; ++s) {
    const int64_t lo = std::max(begin, l.shard_begin(s));
    const int64_t hi = std::min(end, l.shard_end(s));
    if (lo >= hi) continue;
    shards_.at(s).read_unit_range(unit, dataset, lo - l.shard_begin(s), hi - lo, out + (lo - begin));
  }
}

bool same_layouts(const std::vector<FlatParamLayout>& a, const std::vector<FlatParamLayout>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t u = 0; u < a.size(); ++u) {
    const FlatParamLayout& x = a[u];
    const FlatParamLayout& y = b[u];
    if (x.unit_name != y.unit_name || x.numel != y.numel || x.num_shards != y.num_shards ||
        x.padded_numel != y.padded_numel || x.shard_numel != y.shard_numel ||
        x.entries.size() != y.entries.size())
      return false;
    for (std::size_t i = 0; i < x.entries.size(); ++i) {
      const FlatEntry& e = x.entries[i];
      const FlatEntry& f = y.entries[i];
      if (e.spec.name != f.spec.name || e.spec.shape != f.spec.shape || e.offset != f.offset) return false;
    }
  }
  return true;
}

void read_resharded(const CheckpointSet& set, const FlatParamLayout& layout, int64_t shard_index,
                    const std::string& dataset, float* out) {
  if (shard_index < 0 || shard_index >= layout.num_shards)
    throw Error(set.dir() + ": unit " + layout.unit_name + ": shard_index " + std::to_string(shard_index) +
                " outside [0, " + std::to_string(layout.num_shards) + ")");
  // Where each parameter lives in the checkpoint: (old unit, entry).
  struct Where {
    int unit;
    const FlatEntry* entry;
  };
  std::map<std::string, Where> by_name;
  const std::vector<FlatParamLayout>& old = set.layouts();
  for (int u = 0; u < static_cast<int>(old.size()); ++u)
    for (const FlatEntry& e : old[u].entries)
      if (!by_name.emplace(e.spec.name, Where{u, &e}).second)
        throw InputError(set.dir() + ": parameter " + e.spec.name +
                         " is stored twice in the checkpoint: the file is corrupted");
  const int64_t lo = layout.shard_begin(shard_index), hi = layout.shard_end(shard_index);
  std::fill(out, out + (hi - lo), 0.0f);  // padding (and anything no parameter covers)
  for (const FlatEntry& e : layout.entries) {
    const auto it = by_name.find(e.spec.name);
    if (it == by_name.end())
      throw InputError(set.dir() + ": parameter " + e.spec.name + " (unit " + layout.unit_name +
                       ") is missing from the checkpoint");
    const Where& w = it->second;
    const std::vector<int64_t>& stored = w.entry->spec.shape;
    // Another vocabulary padding (model.pad_vocab_multiple changed): the same model rows
    // [0, vocab_rows) and row width, a different number of zero pad rows after them.
    const bool repadded = e.spec.vocab_rows > 0 && stored.size() == e.spec.shape.size() && !stored.empty() &&
                          stored[0] >= e.spec.vocab_rows &&
                          std::equal(stored.begin() + 1, stored.end(), e.spec.shape.begin() + 1);
    if (stored != e.spec.shape && !repadded)
      throw InputError(set.dir() + ": parameter " + e.spec.name + ": shape " + shape_json(stored) +
                       " in the checkpoint (unit " + old[w.unit].unit_name + ") differs from the run's " +
                       shape_json(e.spec.shape));
    // The part of the parameter inside the new shard, in flat coordinates of the new unit; of
    // a re-padded one only the model's rows (a row-major prefix) are read, its pad rows stay 0.
    const int64_t from_file = stored == e.spec.shape ? e.spec.numel() : e.spec.unpadded_numel();
    const int64_t b = std::max(lo, e.offset), end = std::min(hi, e.offset + from_file);
    if (b >= end) continue;
    set.read_flat(w.unit, dataset, w.entry->offset + (b - e.offset), end - b, out + (b - lo));
  }
}

ShardFile open_for_resume(const std::string& step_dir, const CheckpointMeta& expected,
                          const std::vector<FlatParamLayout>& expected_layouts) {
  const std::string file = (fs::path(step_dir) / shard_file_name(expected.shard_index, expected.shard_size)).string();
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    const int stored = stored_shard_count(step_dir);
    if (stored > 0 && stored != expected.shard_size) incompatible(step_dir, "shard_size", stored, expected.shard_size);
    throw InputError(file + ": missing shard file");
  }
  ShardFile sf = ShardFile::open(file);
  sf.check_compatible(expected, expected_layouts);
  return sf;
}

// ---- directories ----

std::string shape_json(const std::vector<int64_t>& shape) { return json(shape).dump(); }

std::string checksum_hex(const float* data, int64_t count) {
  return hex64(XXH3_64bits(data, static_cast<std::size_t>(count) * sizeof(float)));
}

std::string checkpoints_dir(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoints").string();
}

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step_%08lld", static_cast<long long>(step));
  return buf;
}

std::string step_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(checkpoints_dir(run_dir)) / step_dir_name(step)).string();
}

std::string tmp_step_dir(const std::string& run_dir, int64_t step) {
  return step_dir(run_dir, step) + ".tmp";
}

std::string shard_file_name(int shard_index, int shard_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard_%05d-of-%05d.h5", shard_index, shard_size);
  return buf;
}

void prepare_tmp_step_dir(const std::string& tmp) {
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (ec) throw Error(tmp + ": cannot remove stale temporary checkpoint: " + ec.message());
  fs::create_directories(tmp, ec);
  if (ec) throw Error(tmp + ": cannot create checkpoint directory: " + ec.message());
}

void discard_tmp_step_dir(const std::string& tmp) noexcept {
  std::error_code ec;
  fs::remove_all(tmp, ec);
}

void commit_step_dir(const std::string& tmp, const std::string& final_dir) {
  std::error_code ec;
  if (!fs::is_directory(tmp, ec)) throw Error(tmp + ": temporary checkpoint directory not found");
  fsync_path(tmp, true);
  if (fs::exists(final_dir, ec)) {
    const std::string old = final_dir + ".old";
    fs::remove_all(old, ec);
    rename_durably(final_dir, old);
    rename_durably(tmp, final_dir);
    fs::remove_all(old, ec);
    if (ec) throw Error(old + ": cannot remove the replaced checkpoint: " + ec.message());
  } else {
    rename_durably(tmp, final_dir);
  }
}

void publish_latest(const std::string& run_dir, int64_t step) {
  write_file_atomically((fs::path(checkpoints_dir(run_dir)) / "latest").string(),
                        step_dir_name(step) + "\n");
}

namespace {
// The step of a step directory's name ("step_00000100" -> 100: step_ and 8 to 18 digits, what
// step_dir_name writes), nullopt for any other name.
std::optional<int64_t> step_of_dir_name(const std::string& name) {
  static const std::regex pat(R"(step_([0-9]{8,18}))");
  std::smatch m;
  if (!std::regex_match(name, m, pat)) return std::nullopt;
  return std::stoll(m[1].str());
}
}  // namespace

PruneResult prune_step_dirs(const std::string& run_dir, int64_t latest_step, int64_t keep) {
  PruneResult r;
  if (keep < 1) return r;
  const fs::path dir = checkpoints_dir(run_dir);
  const std::string doomed = ".deleting";
  std::vector<std::pair<int64_t, std::string>> older;  // complete step dirs before latest_step
  std::vector<std::string> leftovers;                  // step_N.deleting of an interrupted prune
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dec;
    if (!it->is_directory(dec) || it->is_symlink(dec)) continue;
    if (const std::optional<int64_t> step = step_of_dir_name(name)) {
      if (*step < latest_step) older.emplace_back(*step, name);
    } else if (name.size() > doomed.size() && name.ends_with(doomed) &&
               step_of_dir_name(name.substr(0, name.size() - doomed.size()))) {
      leftovers.push_back(name);
    }
  }
  if (ec) {
    r.errors.push_back(dir.string() + ": cannot list: " + ec.message());
    return r;
  }
  auto remove = [&](const fs::path& p) {
    fs::remove_all(p, ec);
    if (ec) r.errors.push_back(p.string() + ": cannot remove: " + ec.message());
  };
  std::sort(leftovers.begin(), leftovers.end());
  for (const std::string& name : leftovers) remove(dir / name);
  std::sort(older.begin(), older.end());
  const auto excess = static_cast<int64_t>(older.size()) - (keep - 1);
  for (int64_t i = 0; i < excess; ++i) {
    const std::string& name = older[static_cast<std::size_t>(i)].second;
    const fs::path renamed = dir / (name + doomed);
    fs::rename(dir / name, renamed, ec);
    if (ec) {
      r.errors.push_back((dir / name).string() + ": cannot rename: " + ec.message());
      continue;
    }
    r.removed.push_back(name);
    remove(renamed);
  }
  return r;
}

namespace {
// The step directory named by dir/latest (dir: a checkpoints directory); find_latest's rules.
std::optional<std::string> latest_in(const fs::path& dir) {
  const std::string path = (dir / "latest").string();
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  // The content is untrusted: read at most 4 KiB, quote it escaped and cut.
  constexpr std::size_t kMaxLatest = 4096;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read (expected a step directory name)");
  std::string content(kMaxLatest + 1, '\0');
  in.read(content.data(), static_cast<std::streamsize>(content.size()));
  content.resize(static_cast<std::size_t>(in.gcount()));
  const std::string expected = " (expected one line such as " + step_dir_name(100) + ")";
  if (content.size() > kMaxLatest)
    throw InputError(path + ": longer than " + std::to_string(kMaxLatest) + " bytes" + expected);
  std::string name = content.substr(0, content.find('\n'));
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (!step_of_dir_name(name)) {
    const bool cut = name.size() > 64;
    throw InputError(path + ": invalid content \"" + safetensors::escape_name(name.substr(0, 64)) +
                     (cut ? "...\"" : "\"") + expected);
  }
  const std::string step = (dir / name).string();
  if (!fs::is_directory(step, ec))
    throw InputError(path + ": names " + name + " but " + step + " does not exist");
  return step;
}
}  // namespace

std::optional<std::string> find_latest(const std::string& run_dir) {
  return latest_in(checkpoints_dir(run_dir));
}

bool is_step_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && !shard_counts(dir).empty();
}

std::vector<int64_t> checkpoint_steps(const std::string& run_dir) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoints_dir(run_dir), ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::optional<int64_t> step = step_of_dir_name(it->path().filename().string());
    if (step && is_step_dir(it->path().string())) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string resume_step_dir(const std::string& run_dir, const std::string& choice) {
  const std::string what = "--resume=" + choice + ": ";
  const std::string ckdir = checkpoints_dir(run_dir);
  auto listed = [&]() -> std::string {
    const std::vector<int64_t> steps = checkpoint_steps(run_dir);
    if (steps.empty()) return " (it holds no checkpoint)";
    std::string s = " (its checkpoints: step";
    s += steps.size() > 1 ? "s " : " ";
    const std::size_t from = steps.size() > 8 ? steps.size() - 8 : 0;  // the newest 8
    if (from > 0) s += "..., ";
    for (std::size_t i = from; i < steps.size(); ++i)
      s += (i > from ? ", " : "") + std::to_string(steps[i]);
    return s + ")";
  };
  const bool number = !choice.empty() && choice.size() <= 18 &&
                      choice.find_first_not_of("0123456789") == std::string::npos;
  if (number) {
    const int64_t step = std::stoll(choice);
    const std::string dir = step_dir(run_dir, step);
    if (!is_step_dir(dir))
      throw InputError(what + ckdir + " has no checkpoint of step " + std::to_string(step) +
                       listed());
    return dir;
  }
  const std::string dir = resolve_step_dir(choice).step_dir;
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // "step_00000004/"
  std::error_code ec;
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const bool here = fs::equivalent(parent, ckdir, ec) && !ec;
  if (!here) {
    throw InputError(what + "not a checkpoint of train.run_dir = \"" + run_dir + "\" (expected a "
                     "step number or a step directory in " + ckdir + "); a new run starts from "
                     "another run's weights through fsdp_merge and model.init_from");
  }
  if (!step_of_dir_name(p.filename().string()) || !is_step_dir(dir))
    throw InputError(what + dir + " is not a complete checkpoint" + listed());
  return p.string();
}

StepDirChoice resolve_step_dir(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  std::optional<fs::path> dir;  // the checkpoints directory whose `latest` to follow
  if (fs::is_regular_file(p, ec) && p.filename() == "latest") {
    dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  } else if (fs::is_directory(p, ec) && !is_step_dir(path)) {
    if (fs::is_regular_file(p / "latest", ec)) {
      dir = p;
    } else if (fs::is_regular_file(p / "checkpoints" / "latest", ec)) {
      dir = p / "checkpoints";
    }
  }
  const std::optional<std::string> step = dir ? latest_in(*dir) : std::nullopt;
  if (!step) return {path, ""};
  return {*step, (*dir / "latest").string()};
}

}  // namespace fsdp::ckpt
