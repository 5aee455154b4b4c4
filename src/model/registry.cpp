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
  static const std::vector<const ModelFamily*> families = {&gpt2_family(), &t5_family(), &llama_family()};
  return families;
}

const ModelFamily& model_family(const std::string& type) {
  // Every schema of model_schemas() is a family: one lookup, one message.
  return static_cast<const ModelFamily&>(model_schema(model_schemas(), type));
}

ModelConfig model_defaults(const std::string& type) { return ModelConfig::of(model_family(type)); }

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  return parse_config(toml_text, origin, overrides, model_schemas());
}

Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides) {
  return load_config(toml_path, overrides, model_schemas());
}

void check_config(const Config& config) { check_config(config, model_schemas()); }

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
    if (!j.contains(k.name)) {
      throw InputError(origin + ": model config of \"" + type + "\" has no \"" + k.name + "\"");
    }
    const nlohmann::json& v = j[k.name];
    auto wrong = [&] {
      return InputError(origin + ": model config \"" + k.name + "\": expected " +
                        value_type_name(k.default_value));
    };
    switch (k.default_value.index()) {
      case 0:
        if (!v.is_number_integer()) throw wrong();
        c.set(k.name, v.get<int64_t>());
        break;
      case 1:
        if (!v.is_number()) throw wrong();
        c.set(k.name, v.get<double>());
        break;
      case 2:
        if (!v.is_boolean()) throw wrong();
        c.set(k.name, v.get<bool>());
        break;
      default:
        if (!v.is_string()) throw wrong();
        c.set(k.name, v.get<std::string>());
    }
  }
  return c;
}

}  // namespace fsdp
