// Sharded checkpoint -> Hugging Face GPT2LMHeadModel directory (see
// fsdp/checkpoint/merge.hpp). One full tensor (plus its transpose) in memory at a time.
#include "fsdp/checkpoint/merge.hpp"

#include <filesystem>
#include <fstream>
#include <map>

#include "fsdp/checkpoint/checkpoint.hpp"
#include "fsdp/checkpoint/safetensors.hpp"
#include "fsdp/core/error.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace fsdp::ckpt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

int64_t cfg_int(const json& cfg, const char* key, const std::string& origin) {
  if (!cfg.contains(key) || !cfg[key].is_number_integer() || cfg[key].get<int64_t>() <= 0)
    throw InputError(origin + ": model_config." + key + " missing or not a positive integer");
  return cfg[key].get<int64_t>();
}

}  // namespace

std::optional<HfTensor> hf_gpt2_tensor(const std::string& name, const std::vector<int64_t>& shape) {
  static const char* kTopLevel[] = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"};
  static const char* kBlock[] = {"ln_1.weight",      "ln_1.bias",      "attn.c_attn.weight", "attn.c_attn.bias",
                                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
                                 "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};
  HfTensor t{"transformer." + name, shape, false};
  for (const char* n : kTopLevel)
    if (name == n) return t;
  // "h.<i>.<suffix>"
  if (name.rfind("h.", 0) != 0) return std::nullopt;
  std::size_t i = 2;
  while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
  if (i == 2 || i >= name.size() || name[i] != '.') return std::nullopt;
  const std::string suffix = name.substr(i + 1);
  bool known = false;
  for (const char* n : kBlock) known = known || suffix == n;
  if (!known) return std::nullopt;
  // Linear layers: ours [out, in] (nn.Linear), HF Conv1D [in, out].
  if (ends_with(suffix, ".weight") && suffix.rfind("ln_", 0) != 0 && shape.size() == 2) {
    t.shape = {shape[1], shape[0]};
    t.transpose = true;
  }
  return t;
}

std::vector<ModelParam> gpt2_param_specs(const json& cfg) {
  const std::string origin = "model_config";
  const int64_t L = cfg_int(cfg, "n_layer", origin), C = cfg_int(cfg, "n_embd", origin);
  const int64_t V = cfg_int(cfg, "vocab_size", origin), P = cfg_int(cfg, "n_positions", origin);
  std::vector<ModelParam> p;
  p.push_back({"wte.weight", {V, C}});
  p.push_back({"wpe.weight", {P, C}});
  for (int64_t i = 0; i < L; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    p.push_back({h + "ln_1.weight", {C}});
    p.push_back({h + "ln_1.bias", {C}});
    p.push_back({h + "attn.c_attn.weight", {3 * C, C}});
    p.push_back({h + "attn.c_attn.bias", {3 * C}});
    p.push_back({h + "attn.c_proj.weight", {C, C}});
    p.push_back({h + "attn.c_proj.bias", {C}});
    p.push_back({h + "ln_2.weight", {C}});
    p.push_back({h + "ln_2.bias", {C}});
    p.push_back({h + "mlp.c_fc.weight", {4 * C, C}});
    p.push_back({h + "mlp.c_fc.bias", {4 * C}});
    p.push_back({h + "mlp.c_proj.weight", {C, 4 * C}});
    p.push_back({h + "mlp.c_proj.bias", {C}});
  }
  p.push_back({"ln_f.weight", {C}});
  p.push_back({"ln_f.bias", {C}});
  return p;
}

json hf_gpt2_config(const json& cfg) {
  const std::string origin = "model_config";
  const int64_t V = cfg_int(cfg, "vocab_size", origin);
  const int64_t P = cfg_int(cfg, "n_positions", origin);
  json out = json::object();
  out["architectures"] = {"GPT2LMHeadModel"};
  out["model_type"] = "gpt2";
  out["vocab_size"] = V;
  out["n_positions"] = P;
  out["n_ctx"] = P;
  out["n_embd"] = cfg_int(cfg, "n_embd", origin);
  out["n_layer"] = cfg_int(cfg, "n_layer", origin);
  out["n_head"] = cfg_int(cfg, "n_head", origin);
  out["n_inner"] = nullptr;
  out["activation_function"] = "gelu_new";
  out["resid_pdrop"] = 0.0;
  out["embd_pdrop"] = 0.0;
  out["attn_pdrop"] = 0.0;
  out["layer_norm_epsilon"] = cfg.value("layer_norm_epsilon", 1e-5);
  out["initializer_range"] = 0.02;
  out["bos_token_id"] = V - 1;  // GPT-2 convention (<|endoftext|> = last id); byte-level
  out["eos_token_id"] = V - 1;  // vocabularies have no special token, so this is nominal
  out["tie_word_embeddings"] = true;
  out["torch_dtype"] = "float32";
  return out;
}

MergeStats merge_to_hf(const std::string& step_dir, const std::string& out_dir) {
  const CheckpointSet set = CheckpointSet::open(step_dir);
  const std::string first = set.shard(0).path();
  json cfg;
  try {
    cfg = json::parse(set.meta().model_config_json);
  } catch (const json::exception& e) {
    throw InputError(first + ": model_config attribute is not valid JSON: " + e.what());
  }
  const std::string model_type = cfg.value("model_type", std::string());
  if (model_type != "gpt2")
    throw InputError(first + ": unsupported model_type \"" + model_type + "\" (expected \"gpt2\")");
  std::vector<ModelParam> expected;
  json hf_config;
  try {
    expected = gpt2_param_specs(cfg);
    hf_config = hf_gpt2_config(cfg);
  } catch (const Error& e) {
    throw InputError(first + ": " + e.what());
  }

  // Index every stored parameter by name, whatever unit holds it.
  struct Loc {
    int unit;
    const FlatEntry* entry;
  };
  std::map<std::string, Loc> where;
  const auto& layouts = set.layouts();
  for (std::size_t u = 0; u < layouts.size(); ++u) {
    for (const FlatEntry& e : layouts[u].entries) {
      if (!where.emplace(e.spec.name, Loc{static_cast<int>(u), &e}).second)
        throw InputError(first + ": parameter " + e.spec.name + " stored twice");
      if (!hf_gpt2_tensor(e.spec.name, e.spec.shape))
        throw InputError(first + ": unknown GPT-2 parameter " + e.spec.name +
                         " (expected e.g. wte.weight or h.0.attn.c_attn.weight)");
    }
  }
  std::vector<safetensors::TensorInfo> infos;
  std::vector<HfTensor> hf;
  for (const ModelParam& p : expected) {
    auto it = where.find(p.name);
    if (it == where.end())
      throw InputError(first + ": parameter " + p.name + " missing (model_config needs it)");
    if (it->second.entry->spec.shape != p.shape)
      throw InputError(first + ": parameter " + p.name + " has shape " + shape_str(it->second.entry->spec.shape) +
                       " (expected " + shape_str(p.shape) + " from model_config)");
    hf.push_back(*hf_gpt2_tensor(p.name, p.shape));
    infos.push_back({hf.back().name, hf.back().shape});
  }
  if (where.size() != expected.size())
    throw InputError(first + ": " + std::to_string(where.size()) + " parameters stored, model_config needs " +
                     std::to_string(expected.size()));

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) throw InputError(out_dir + ": cannot create output directory: " + ec.message());

  MergeStats stats;
  {
    std::map<std::string, std::string> meta{{"source", fs::absolute(step_dir).lexically_normal().string()},
                                            {"step", std::to_string(set.meta().step)}};
    safetensors::Writer writer((fs::path(out_dir) / "model.safetensors").string(), infos, meta);
    std::vector<float> full, trans;
    for (std::size_t k = 0; k < expected.size(); ++k) {
      const Loc& loc = where.at(expected[k].name);
      const int64_t n = loc.entry->spec.numel();
      full.resize(static_cast<std::size_t>(n));
      set.read_flat(loc.unit, "param", loc.entry->offset, n, full.data());
      const float* data = full.data();
      if (hf[k].transpose) {
        const int64_t rows = loc.entry->spec.shape[0], cols = loc.entry->spec.shape[1];
        trans.resize(full.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) trans[c * rows + r] = full[r * cols + c];
        data = trans.data();
      }
      writer.write_next(data, n);
      stats.num_tensors += 1;
      stats.num_elements += n;
    }
    writer.finish();
  }
  const std::string cfg_path = (fs::path(out_dir) / "config.json").string();
  {
    std::ofstream out(cfg_path + ".tmp", std::ios::trunc);
    out << hf_config.dump(2) << "\n";
    out.flush();
    if (!out) throw Error(cfg_path + ".tmp: write failed");
  }
  fs::rename(cfg_path + ".tmp", cfg_path, ec);
  if (ec) throw Error(cfg_path + ": cannot rename from " + cfg_path + ".tmp: " + ec.message());
  return stats;
}

}  // namespace fsdp::ckpt
