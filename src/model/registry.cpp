// The model registry: the families, their schemas for config, and the model JSON of
// checkpoints (see fsdp/model/model.hpp).
#include "fsdp/model/model.hpp"

#include <algorithm>

#include "fsdp/model/gpt2.hpp"
#include "fsdp/model/llama.hpp"
#include "fsdp/model/t5.hpp"

namespace fsdp {
const ModelSchemas& model_schemas() {
  static const ModelSchemas schemas(model_families().begin(), model_families().end());
  return schemas;
}

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = [] {
    std::vector<const ModelFamily*> f = {&gpt2_family(), &t5_family()};
    for (LlamaArch a : llama_archs()) f.push_back(&llama_family(a));
    return f;
  }();
  return families;
}

const ModelFamily& model_family(const std::string& type) {
  // Every schema of model_schemas() is a family: one lookup, one message.
  return static_cast<const ModelFamily&>(model_schema(model_schemas(), type));
}

const ModelFamily& model_family_of_hf(const std::string& model_type) {
  std::string all;
  for (const ModelFamily* f : model_families()) {
    for (const std::string& t : f->hf_model_types()) {
      if (t == model_type) return *f;
      all += (all.empty() ? "" : ", ") + t;
    }
  }
  throw InputError("\"model_type\" \"" + model_type + "\" is not supported (expected one of " +
                   all + ")");
}

ModelConfig model_defaults(const std::string& type) { return ModelConfig::of(model_family(type)); }

void check_sizes(const Config& c) {
  const ModelFamily& family = model_family(c.model.type);
  const std::vector<ModuleDecl> modules = family.modules(c.model);  // finite: keys are bounded
  long double params = 0;
  int64_t widest = 1;
  for (const ModuleDecl& m : modules) {
    for (const ParamSpec& p : m.params) {
      long double n = 1;
      for (int64_t d : p.shape) {
        n *= static_cast<long double>(d);
        widest = std::max(widest, d);
      }
      params += n;
    }
  }
  // Counts stay exact in the doubles metrics and banners print, and every byte count in int64.
  constexpr long double kExact = 9007199254740992.0L;  // 2^53
  auto num = [](long double x) { return format_number(static_cast<double>(x)); };
  if (params > kExact) {
    std::string keys;
    for (const ModelKey& k : family.keys()) {
      if (const ModelValue* v = c.model.find(k.name); v && v->index() == 0) {
        keys += (keys.empty() ? "" : ", ") + ("model." + k.name) + " = " +
                std::to_string(std::get<int64_t>(*v));
      }
    }
    throw InputError("model: " + num(params) + " parameters is more than fsdp_train counts (2^53; " +
                     keys + ")");
  }
  const bool pairs = c.data.objective == Objective::seq2seq;
  const long double sample = pairs ? static_cast<long double>(c.data.max_input_len) + c.data.max_target_len
                                   : static_cast<long double>(c.data.seq_len);
  const std::string sample_keys = pairs ? "data.max_input_len + data.max_target_len" : "data.seq_len";
  const long double step_tokens = sample * static_cast<long double>(c.train.global_batch_size);
  if (step_tokens > kExact) {
    throw InputError("train.global_batch_size: " + std::to_string(c.train.global_batch_size) +
                     " sequences x " + num(sample) + " tokens (" + sample_keys + ") = " +
                     num(step_tokens) + " tokens per step is more than fsdp_train counts (2^53)");
  }
  // Activation bytes of a micro-batch (the families' tables are sums of at most a few terms
  // per module of rows x tokens x a width, in at most 8-byte elements): bounded below 2^62.
  const long double rows = static_cast<long double>(
      c.train.micro_batch_size > 0 ? c.train.micro_batch_size : c.train.global_batch_size);
  const long double bound = rows * sample * static_cast<long double>(widest) *
                            static_cast<long double>(modules.size() + 16) * 8 * 8;
  if (bound > 4611686018427387904.0L) {  // 2^62
    throw InputError(sample_keys + ": " + num(sample) + " tokens x " + num(rows) +
                     " sequences per forward (train.micro_batch_size, or the whole batch) x width " +
                     std::to_string(widest) + " is more activation memory than fsdp_train can count");
  }
}

namespace {
// The data keys that must fit the model: an EOS id of document masking inside its vocabulary
// (the family's, whatever key spells it). Throws InputError naming data.eos_token_id.
void check_data_fits_model(const Config& c) {
  const int64_t V = model_family(c.model.type).vocab_size(c.model);
  if (c.data.eos_token_id >= V) {
    throw InputError("data.eos_token_id: " + std::to_string(c.data.eos_token_id) +
                     " is out of range (expected -1 <= x < the model's vocabulary size " +
                     std::to_string(V) + ")");
  }
}
}  // namespace

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Config c = parse_config(toml_text, origin, overrides, model_schemas());
  check_sizes(c);
  check_data_fits_model(c);
  return c;
}

Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides) {
  Config c = load_config(toml_path, overrides, model_schemas());
  check_sizes(c);
  check_data_fits_model(c);
  return c;
}

void check_config(const Config& config) {
  check_config(config, model_schemas());
  check_sizes(config);
  check_data_fits_model(config);
}

nlohmann::json model_config_json(const ModelConfig& c) {
  nlohmann::json j = {{"model_type", c.type}};
  for (const auto& [name, value] : c.values) {
    std::visit([&](const auto& v) { j[name] = v; }, value);
  }
  j["pad_vocab_multiple"] = c.pad_vocab_multiple;
  return j;
}

ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object() || !j.contains("model_type") || !j["model_type"].is_string()) {
    throw InputError(origin + ": model config has no \"model_type\" string");
  }
  const std::string type = j["model_type"].get<std::string>();
  const ModelFamily* family = nullptr;
  try {
    family = &model_family(type);
  } catch (const Error& e) {
    throw InputError(origin + ": " + e.what());
  }
  ModelConfig c = model_defaults(type);
  // Checkpoints written before model.pad_vocab_multiple existed hold unpadded tensors.
  c.pad_vocab_multiple = 1;
  if (j.contains("pad_vocab_multiple")) {
    const nlohmann::json& v = j["pad_vocab_multiple"];
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxPadVocabMultiple) {
      throw InputError(origin + ": model config \"pad_vocab_multiple\": expected an integer 1 <= x <= " +
                       std::to_string(kMaxPadVocabMultiple) + ", got " + v.dump());
    }
    c.pad_vocab_multiple = v.get<int64_t>();
  }
  for (const ModelKey& k : family->keys()) {
    // A key added after the checkpoint was written keeps its default, the behaviour of the
    // build that wrote it (a key is added with that behaviour as its default, as
    // pad_vocab_multiple's 1 above): an older run's checkpoint still merges.
    if (!j.contains(k.name)) continue;
    const nlohmann::json& v = j[k.name];
    auto wrong = [&] {
      return InputError(origin + ": model config \"" + k.name + "\": expected " +
                        value_type_name(k.default_value));
    };
    ModelValue value;
    if (!model_value_from_json(v, k.default_value, &value)) throw wrong();
    c.set(k.name, std::move(value));
  }
  return c;
}

}  // namespace fsdp
