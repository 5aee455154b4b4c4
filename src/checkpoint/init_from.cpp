// model.init_from: this rank's fp32 shards from a Hugging Face directory (see
// fsdp/checkpoint/init_from.hpp).
#include "fsdp/checkpoint/init_from.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/model/model.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fsdp::ckpt {
namespace {

std::string value_str(const ModelValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* s = std::get_if<std::string>(&v)) return json(*s).dump();
  if (const auto* a = std::get_if<std::vector<double>>(&v)) return json(*a).dump();
  return json(std::get<double>(v)).dump();  // the shortest text that reads back the same
}

std::string origin_of(const std::string& dir) {
  return " (model.init_from = " + json(dir).dump() + ")";
}

// Where one of our parameters is in the files.
struct Source {
  HfTensor hf;
  std::string stored;  // the name found in the files (hf.name, an alias or the packed tensor)
  int64_t offset = 0;  // packed (ModelFamily::hf_packed): where its elements start in `stored`
  // MXFP4 (ModelFamily::hf_mxfp4; `stored` is its blocks): dequantized as it is read
  std::optional<HfMxfp4> mxfp4;
};

// The e2m1 values of the 16 nibbles (OCP Microscaling: sign, 2 exponent bits, 1 mantissa
// bit; transformers' FP4_VALUES).
constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// The MXFP4 tensors `m` in the files, as HfMxfp4 describes them: both U8, of its shapes (cols a
// multiple of 32). InputError naming the file and tensor otherwise.
void check_mxfp4(const safetensors::SafetensorsCheckpoint& ckpt, const HfMxfp4& m,
                 const std::string& param, const std::string& type, const std::string& dir) {
  if (m.cols % 32 != 0) {
    throw InputError(ckpt.file_of(m.blocks).path() + ": tensor '" + m.blocks +
                     "': MXFP4 blocks of 32 do not divide the " + std::to_string(m.cols) +
                     " input features of the " + type + " parameter " + param + origin_of(dir));
  }
  const int64_t G = m.cols / 32;
  for (const auto& [name, shape] :
       {std::pair{m.blocks, std::vector<int64_t>{m.experts, m.rows, G, 16}},
        std::pair{m.scales, std::vector<int64_t>{m.experts, m.rows, G}}}) {
    const safetensors::SafetensorsFile::Entry& info = ckpt.entry(name);
    if (info.dtype != "U8" || info.shape != shape) {
      throw InputError(ckpt.file_of(name).path() + ": tensor '" + name + "' is " + info.dtype +
                       " " + shape_json(info.shape) + ", expected U8 " + shape_json(shape) +
                       " (the MXFP4 form of the " + type + " parameter " + param + ")" +
                       origin_of(dir));
    }
  }
}

// Elements [k0, k1) of our [experts, cols, rows] tensor from its MXFP4 blocks and scales
// (transformers' convert_moe_packed_tensors, then .transpose(1, 2)): element (e, c, r) of ours
// is the dequantized (e, r, c) = e2m1(nibble) * 2^(scale - 127), the nibble of input feature c
// being byte c / 2 of row (e, r)'s blocks, its low half for an even c; the scale that of block
// c / 32. Each expert the range touches is read whole (rows x cols / 2 bytes of blocks and
// rows x cols / 32 scales) into dst[0 .. k1 - k0). A value beyond fp32 (a scale of 255, or 254
// with 4 or 6) is an InputError naming the blocks tensor and the element.
void read_mxfp4(const safetensors::SafetensorsCheckpoint& ckpt, const HfMxfp4& m, int64_t k0,
                int64_t k1, float* dst, const std::string& param, const std::string& type,
                const std::string& dir) {
  const int64_t R = m.rows, Cc = m.cols, G = Cc / 32, per = R * Cc;
  std::vector<uint8_t> blocks(static_cast<std::size_t>(R * G * 16));
  std::vector<uint8_t> scales(static_cast<std::size_t>(R * G));
  float values[16];  // a block's 16 e2m1 values times its scale (ldexp: exact, inf beyond fp32)
  for (int64_t e = k0 / per; e * per < k1; ++e) {
    const int64_t lo = std::max(k0, e * per) - e * per, hi = std::min(k1, (e + 1) * per) - e * per;
    ckpt.read_raw(m.blocks, e * R * G * 16, R * G * 16, blocks.data());
    ckpt.read_raw(m.scales, e * R * G, R * G, scales.data());
    // ours (e, c, r) at dst[base + c * R + r], for c * R + r in [lo, hi)
    const int64_t base = e * per - k0;
    // The input features c of row r in [lo, hi): c * R + r in it
    const int64_t c_first = lo / R, c_last = (hi - 1) / R;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t c_lo = c_first + (c_first * R + r < lo ? 1 : 0);
      const int64_t c_hi = c_last + (c_last * R + r < hi ? 1 : 0);
      for (int64_t g = c_lo / 32; g * 32 < c_hi; ++g) {
        const uint8_t s = scales[static_cast<std::size_t>(r * G + g)];
        for (int v = 0; v < 16; ++v) values[v] = std::ldexp(kE2m1[v], static_cast<int>(s) - 127);
        const uint8_t* row = blocks.data() + (r * G + g) * 16;
        for (int64_t c = std::max(c_lo, g * 32); c < std::min(c_hi, g * 32 + 32); ++c) {
          const uint8_t byte = row[(c % 32) / 2];
          const float x = values[(c & 1) != 0 ? byte >> 4 : byte & 0x0F];
          if (!std::isfinite(x)) {
            throw InputError(ckpt.file_of(m.blocks).path() + ": tensor '" + m.blocks +
                             "': element " + shape_json({e, r, c}) + " dequantizes to " +
                             (x > 0 ? "inf" : "-inf") + " (scale " + std::to_string(s) +
                             "; the " + type + " parameter " + param +
                             "): the weights hold a non-finite value" + origin_of(dir));
          }
          dst[base + c * R + r] = x;
        }
      }
    }
  }
}

// The values just read: `count` fp32 values of tensor `s.stored`, the first being element
// `first` (row-major, in the file's shape). A NaN or infinity is an input error naming the
// file, the tensor and the element: weights that would make every loss NaN (and the run
// blame its learning rate) are refused before the first step.
void check_finite(const safetensors::SafetensorsCheckpoint& ckpt, const Source& s, const std::string& param,
                  const std::string& type, const std::string& dir, const float* data, int64_t count,
                  int64_t first) {
  const int64_t bad = first_nonfinite(data, count);
  if (bad < 0) return;
  const float v = data[bad];
  const std::string what = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  const safetensors::SafetensorsFile::Entry& info = ckpt.entry(s.stored);
  std::string element = std::to_string(first + bad);
  if (info.shape.size() >= 2) {  // also as an index: [row, col] of a matrix, [i, j, k] ...
    std::vector<int64_t> idx(info.shape.size());
    int64_t rest = first + bad;
    for (std::size_t d = info.shape.size(); d-- > 0;) {
      const int64_t n = std::max<int64_t>(info.shape[d], 1);
      idx[d] = rest % n;
      rest /= n;
    }
    element += " " + shape_json(idx);
  }
  const std::string converted =
      !std::isnan(v) && info.dtype == "F64" ? " (an F64 value beyond the range of fp32)" : "";
  throw InputError(ckpt.file_of(s.stored).path() + ": tensor '" + safetensors::escape_name(s.stored) +
                   "': element " + element + " is " + what + converted + " (the " + type + " parameter " +
                   param + "): the weights hold a non-finite value" + origin_of(dir));
}

// Whether model.init_from names one of fsdp_merge's STEP_DIR forms (a step directory, a run
// directory, its checkpoints directory or `latest`) instead of a Hugging Face directory.
bool names_a_checkpoint(const std::string& dir) {
  if (is_step_dir(dir)) return true;
  try {
    return !resolve_step_dir(dir).latest.empty();
  } catch (const Error&) {
    return true;  // a `latest` there, unreadable or naming nothing: a checkpoints tree still
  }
}

// DIR/config.json of the Hugging Face model directory `dir` (model.init_from's checks: a
// directory, not a checkpoint, a readable JSON object of at most 100 MiB), and its path.
// `option` names where dir came from in the messages ("model.init_from", "--model-from").
std::pair<json, std::string> read_hf_config(const std::string& dir, const std::string& option) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InputError(option + ": " + json(dir).dump() +
                     " is not a directory (expected a Hugging Face model directory with "
                     "config.json and model.safetensors)");
  }
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(path, ec) && names_a_checkpoint(dir)) {
    throw InputError(option + ": " + json(dir).dump() +
                     " is an fsdp_train checkpoint, not a Hugging Face model directory (no "
                     "config.json): fsdp_merge " + dir + " OUT writes one to set as "
                     "model.init_from; --resume continues that run");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open" + origin_of(dir));
  // config.json is small; a huge one is not a config (same cap as the safetensors header).
  std::string text;
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0 || static_cast<uint64_t>(size) > safetensors::kMaxHeaderBytes) {
    throw InputError(path + ": not a regular file of at most 100 MiB" + origin_of(dir));
  }
  in.seekg(0);
  text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  json hf;
  try {
    hf = json::parse(text);
  } catch (const json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
  if (!hf.is_object()) throw InputError(path + ": not a JSON object");
  return {std::move(hf), path};
}

}  // namespace

void check_hf_config(const std::string& dir, const ModelConfig& config) {
  const auto [hf, path] = read_hf_config(dir, "model.init_from");
  const ModelFamily& family = model_family(config.type);
  const ModelConfig theirs = family.canonical(family.from_hf_config(hf, path));
  const ModelConfig ours = family.canonical(config);
  for (const ModelKey& k : family.keys()) {
    const ModelValue *a = theirs.find(k.name), *b = ours.find(k.name);
    if (!a || !b) continue;
    if (*a != *b) {
      // Compared in canonical form (Llama's head_dim 8 of hidden 16 / 2 heads is its 0), told
      // as written: the file's attribute and the key's value.
      const std::string file_value =
          hf.contains(k.name) && !hf[k.name].is_null() ? hf[k.name].dump() : value_str(*a);
      const ModelValue* given = config.find(k.name);
      throw InputError(path + ": " + k.name + " = " + file_value + " but model." + k.name + " = " +
                       value_str(given ? *given : *b) + origin_of(dir));
    }
  }
}

ModelConfig hf_model_config(const std::string& dir) {
  const auto [hf, path] = read_hf_config(dir, "--model-from");
  if (!hf.contains("model_type") || !hf["model_type"].is_string()) {
    throw InputError(path + ": \"model_type\" missing (expected a Hugging Face config.json)");
  }
  const ModelFamily* family = nullptr;
  try {
    family = &model_family_of_hf(hf["model_type"].get<std::string>());
  } catch (const Error& e) {
    throw InputError(path + ": " + e.what());
  }
  ModelConfig c = family->canonical(family->from_hf_config(hf, path));
  c.init_from = dir;
  return c;
}

InitFromResult load_hf_shards(const std::string& dir, const ModelConfig& config,
                              const std::vector<FlatParamLayout>& layouts, int64_t shard_index,
                              const std::vector<float*>& shards) {
  if (shards.size() != layouts.size()) {
    throw Error("load_hf_shards: " + std::to_string(shards.size()) + " shard buffers for " +
                std::to_string(layouts.size()) + " units");
  }
  check_hf_config(dir, config);
  const ModelFamily& family = model_family(config.type);
  const safetensors::SafetensorsCheckpoint ckpt(dir);
  const std::string where = ckpt.sharded()
                                ? (fs::path(dir) / "model.safetensors.index.json").string()
                                : (fs::path(dir) / "model.safetensors").string();

  // Rank-independent checks, from the headers only: every expected tensor present with its
  // shape and a float dtype.
  InitFromResult result;
  std::set<std::string> used;
  std::vector<std::vector<Source>> sources(layouts.size());
  // Each parameter's Hugging Face tensor first: their names are the model's own, and an alias
  // that is another parameter's name is that parameter's tensor (an untied head's
  // lm_head.weight is not the embedding's), never a stand-in.
  std::set<std::string> own;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    for (const FlatEntry& e : layouts[u].entries) {
      // The file holds the model's own rows; vocabulary padding rows are ours alone.
      const std::optional<HfTensor> hf = family.hf_tensor(config, e.spec.name, e.spec.unpadded_shape());
      if (!hf) {
        throw Error("init_from: parameter " + e.spec.name + " has no Hugging Face name in the " +
                    config.type + " family");
      }
      own.insert(hf->name);
      sources[u].push_back(Source{*hf, "", 0, std::nullopt});
    }
  }
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    for (std::size_t i = 0; i < layouts[u].entries.size(); ++i) {
      const FlatEntry& e = layouts[u].entries[i];
      Source& s = sources[u][i];
      const HfTensor* const hf = &s.hf;
      if (ckpt.has(hf->name)) {
        s.stored = hf->name;
      } else {
        for (const std::string& alias : family.hf_aliases(hf->name)) {
          if (ckpt.has(alias) && !own.count(alias)) {
            s.stored = alias;
            break;
          }
        }
      }
      std::vector<int64_t> stored_shape = hf->shape;
      const std::optional<HfPacked> packed =
          s.stored.empty() ? family.hf_packed(config, hf->name) : std::nullopt;
      if (packed && ckpt.has(packed->name)) {  // transformers 5's packed experts
        s.stored = packed->name;
        s.offset = packed->offset;
        stored_shape = packed->shape;
      }
      const std::optional<HfMxfp4> mx =
          s.stored.empty() ? family.hf_mxfp4(config, hf->name) : std::nullopt;
      if (mx && ckpt.has(mx->blocks) && ckpt.has(mx->scales)) {  // the Hub's gpt-oss experts
        check_mxfp4(ckpt, *mx, e.spec.name, config.type, dir);
        s.stored = mx->blocks;
        s.mxfp4 = mx;
        used.insert(mx->blocks);
        used.insert(mx->scales);
        result.num_tensors += 1;
        result.model_bytes += 4 * e.spec.unpadded_numel();
        continue;
      }
      if (s.stored.empty()) {
        std::string also;
        for (const std::string& alias : family.hf_aliases(hf->name)) also += " or '" + alias + "'";
        if (packed) also += " or its elements of '" + packed->name + "'";
        if (mx) also += " or its MXFP4 '" + mx->blocks + "' and '" + mx->scales + "'";
        throw InputError(where + ": no tensor '" + hf->name + "'" + also + " (the " +
                         config.type + " parameter " + e.spec.name + ")" + origin_of(dir));
      }
      const safetensors::SafetensorsFile::Entry& info = ckpt.entry(s.stored);
      if (info.shape != stored_shape) {
        throw InputError(ckpt.file_of(s.stored).path() + ": tensor '" + s.stored + "' has shape " +
                         shape_json(info.shape) + ", expected " + shape_json(stored_shape) +
                         " (the " + config.type + " parameter " + e.spec.name + ")" +
                         origin_of(dir));
      }
      if (!safetensors::dtype_readable_as_float(info.dtype)) {
        throw InputError(ckpt.file_of(s.stored).path() + ": tensor '" + s.stored + "' has dtype " +
                         info.dtype + " (expected F32, F16, BF16 or F64)" + origin_of(dir));
      }
      if (hf->transpose && hf->shape.size() != 2) {
        throw Error("init_from: transposed tensor " + hf->name + " is not 2-D");
      }
      used.insert(s.stored);
      result.num_tensors += 1;
      result.model_bytes += 4 * e.spec.unpadded_numel();
    }
  }
  // Unused tensors: neither read nor a known duplicate (aliases of an expected tensor, the
  // tied lm_head.weight).
  std::set<std::string> duplicates;
  for (const auto& unit : sources) {
    for (const Source& s : unit) {
      duplicates.insert(s.hf.name);
      for (const std::string& a : family.hf_aliases(s.hf.name)) duplicates.insert(a);
    }
  }
  const json hf_cfg = family.hf_config(config);
  if (hf_cfg.value("tie_word_embeddings", false)) duplicates.insert("lm_head.weight");
  for (const std::string& name : ckpt.names()) {
    if (!used.count(name) && !duplicates.count(name)) result.unused.push_back(safetensors::escape_name(name));
  }

  // This rank's elements.
  std::vector<float> row;
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    const FlatParamLayout& l = layouts[u];
    if (shard_index < 0 || shard_index >= l.num_shards) {
      throw Error("load_hf_shards: shard index " + std::to_string(shard_index) + " out of range [0, " +
                  std::to_string(l.num_shards) + ")");
    }
    const int64_t sb = l.shard_begin(shard_index), se = l.shard_end(shard_index);
    float* out = shards[u];
    std::fill(out, out + l.shard_numel, 0.0f);  // padding and vocabulary pad rows stay 0
    for (std::size_t k = 0; k < l.entries.size(); ++k) {
      const FlatEntry& e = l.entries[k];
      const Source& s = sources[u][k];
      // Only the model's own rows (a row-major prefix) come from the file.
      const int64_t n = e.spec.unpadded_numel();
      const int64_t lo = std::max(sb, e.offset), hi = std::min(se, e.offset + n);
      if (lo >= hi) continue;
      result.tensors_read += 1;
      // Elements [k0, k1) of our row-major tensor go to out[lo - sb ...].
      const int64_t k0 = lo - e.offset, k1 = hi - e.offset;
      float* dst = out + (lo - sb);
      if (s.mxfp4) {
        read_mxfp4(ckpt, *s.mxfp4, k0, k1, dst, e.spec.name, config.type, dir);
        continue;
      }
      if (!s.hf.transpose) {
        ckpt.read_f32(s.stored, s.offset + k0, k1 - k0, dst);
        check_finite(ckpt, s, e.spec.name, config.type, dir, dst, k1 - k0, s.offset + k0);
        continue;
      }
      // Ours [R, Cc] (out, in) = HF [Cc, R] transposed: our (r, c) is HF (c, r). HF row c
      // holds our column c; the rows r of it we need are those with k0 <= r*Cc + c < k1,
      // a contiguous range [r_lo, r_hi) of that HF row.
      const int64_t R = e.spec.unpadded_shape()[0], Cc = e.spec.shape[1];
      for (int64_t c = 0; c < Cc; ++c) {
        const int64_t r_lo = k0 <= c ? 0 : (k0 - c + Cc - 1) / Cc;
        const int64_t r_hi = std::min(R, k1 <= c ? 0 : (k1 - c + Cc - 1) / Cc);
        if (r_lo >= r_hi) continue;
        row.resize(static_cast<std::size_t>(r_hi - r_lo));
        ckpt.read_f32(s.stored, c * R + r_lo, r_hi - r_lo, row.data());
        check_finite(ckpt, s, e.spec.name, config.type, dir, row.data(), r_hi - r_lo, c * R + r_lo);
        for (int64_t r = r_lo; r < r_hi; ++r) dst[r * Cc + c - k0] = row[static_cast<std::size_t>(r - r_lo)];
      }
    }
  }
  result.bytes_read = ckpt.bytes_read();
  return result;
}

}  // namespace fsdp::ckpt
