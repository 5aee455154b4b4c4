// The model registry and ModelConfig's typed access (see fsdp/model/model.hpp).
#include "fsdp/model/model.hpp"

#include <algorithm>

#include "fsdp/model/gpt2.hpp"
#include "fsdp/model/t5.hpp"

namespace fsdp {
namespace {

const char* type_name(const ModelValue& v) {
  switch (v.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a boolean";
    default: return "a string";
  }
}

const ModelValue& lookup(const ModelConfig& c, const std::string& key) {
  auto it = c.values.find(key);
  if (it == c.values.end()) {
    throw Error("model." + key + ": not a key of model.type = \"" + c.type + "\"");
  }
  return it->second;
}

template <class T>
const T& typed(const ModelConfig& c, const std::string& key) {
  const ModelValue& v = lookup(c, key);
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw Error("model." + key + ": holds " + type_name(v) + ", read as another type");
}

}  // namespace

const std::vector<const ModelFamily*>& model_families() {
  static const std::vector<const ModelFamily*> families = {&gpt2_family(), &t5_family()};
  return families;
}

const ModelFamily& model_family(const std::string& type) {
  std::string names;
  for (const ModelFamily* f : model_families()) {
    if (f->type() == type) return *f;
    names += (names.empty() ? "" : ", ") + f->type();
  }
  throw InputError("model.type: unknown value \"" + type + "\" (expected one of " + names + ")");
}

ModelConfig ModelConfig::defaults(const std::string& type) {
  ModelConfig c;
  c.type = type;
  for (const ModelKey& k : model_family(type).keys()) c.values[k.name] = k.default_value;
  return c;
}

int64_t ModelConfig::integer(const std::string& key) const { return typed<int64_t>(*this, key); }
double ModelConfig::number(const std::string& key) const { return typed<double>(*this, key); }
bool ModelConfig::boolean(const std::string& key) const { return typed<bool>(*this, key); }
const std::string& ModelConfig::string(const std::string& key) const {
  return typed<std::string>(*this, key);
}

void ModelConfig::set(const std::string& key, ModelValue value) {
  const ModelValue& old = lookup(*this, key);
  if (old.index() != value.index()) {
    throw Error("model." + key + ": expected " + std::string(type_name(old)) + ", got " +
                type_name(value));
  }
  values[key] = std::move(value);
}

nlohmann::json model_config_json(const ModelConfig& c) {
  nlohmann::json j = {{"model_type", c.type}};
  for (const ModelKey& k : model_family(c.type).keys()) {
    std::visit([&](const auto& v) { j[k.name] = v; }, lookup(c, k.name));
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
  ModelConfig c = ModelConfig::defaults(type);
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
                        type_name(k.default_value));
    };
    switch (k.default_value.index()) {
      case 0:
        if (!v.is_number_integer()) throw wrong();
        c.values[k.name] = v.get<int64_t>();
        break;
      case 1:
        if (!v.is_number()) throw wrong();
        c.values[k.name] = v.get<double>();
        break;
      case 2:
        if (!v.is_boolean()) throw wrong();
        c.values[k.name] = v.get<bool>();
        break;
      default:
        if (!v.is_string()) throw wrong();
        c.values[k.name] = v.get<std::string>();
    }
  }
  return c;
}

}  // namespace fsdp
