// fsdp/model/model_args.hpp: a model family's configuration, declared once.
//
// Each family's configuration is a plain struct (Gpt2Config, T5Config, LlamaConfig) whose
// fields carry their defaults, and one table of ModelArg rows, one per field: the [model] key
// (which is also the Hugging Face config.json attribute), the member, its range or accepted
// values, one line of doc and how config.json treats it. That table is the only place a key
// is spelled: the family's ModelSchema::keys() (TOML parsing, --set, validation of ranges and
// choices, --list-keys, docs/config.md's check), the typed read of a parsed [model] section,
// config.json out (fsdp_merge) and in (model.init_from) all come from it. torchtitan's
// ModelArgs and Hugging Face's PretrainedConfig play the same role.
//
// A dotted name ("rope_scaling.factor") is a field of a nested config.json dict
// (LlamaConfig.rope_scaling["factor"]); TOML may write it as a dotted key or a sub-table of
// [model] (config parsing flattens them).
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/config/config.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

// A string key stored as an enum member: `get` spells the member's value, `set` parses a
// spelling into it and returns false for one it does not know (the row's choices list the
// spellings). Captureless lambdas convert to these pointers.
template <class Cfg>
struct EnumMember {
  std::string (*get)(const Cfg&);
  bool (*set)(Cfg&, const std::string&);
};

// The EnumMember of an enum member `Member` (E Cfg::*) whose spellings are EnumNames<E>'s
// table (fsdp/core/enum_names.hpp): its row's choices are enum_names<E>().
template <class Cfg, auto Member>
EnumMember<Cfg> enum_member() {
  using E = std::remove_cvref_t<decltype(std::declval<Cfg&>().*Member)>;
  return {[](const Cfg& c) { return std::string(enum_name(c.*Member)); },
          [](Cfg& c, const std::string& s) {
            const std::optional<E> v = enum_from_name<E>(s);
            if (v) c.*Member = *v;
            return v.has_value();
          }};
}

template <class Cfg>
struct ModelArg {
  using Member =
      std::variant<int64_t Cfg::*, double Cfg::*, bool Cfg::*, std::string Cfg::*,
                   std::vector<double> Cfg::*, EnumMember<Cfg>>;
  const char* name;  // [model] key == config.json attribute ("a.b": attribute b of dict a)
  Member member;
  const char* doc;   // one line, the first sentence of its docs/config.md row
  KeyRange range = {};                    // numbers: bounds checked at parse time
  std::vector<std::string> choices = {};  // strings: the accepted values (empty: any)
  // config.json: whether merge writes it and init_from reads it (false: an fsdp_train-only
  // key), and the value Hugging Face's config class assumes when a config.json lacks it
  // (nullopt: init_from requires the attribute).
  bool hf = true;
  std::optional<ModelValue> hf_default = std::nullopt;
};

template <class Cfg>
class ModelArgs {
 public:
  // `defaults`: the [model] defaults of the family (a default-constructed Cfg unless given).
  explicit ModelArgs(std::vector<ModelArg<Cfg>> args, Cfg defaults = Cfg{})
      : args_(std::move(args)), defaults_(std::move(defaults)) {}
  const std::vector<ModelArg<Cfg>>& args() const { return args_; }
  const Cfg& defaults() const { return defaults_; }

  // The schema's keys: every row with its default.
  std::vector<ModelKey> keys() const {
    std::vector<ModelKey> out;
    for (const auto& a : args_) {
      out.push_back({a.name, get(defaults_, a), a.doc, a.range, a.choices, a.hf ? a.name : ""});
    }
    return out;
  }

  // The typed struct of a [model] section of this family (ModelConfig::of filled every key).
  // Fields the table does not list keep their defaults. Throws fsdp::Error on a missing key
  // or one of another type (a ModelConfig of another family), InputError on a string not
  // among the row's choices (validation's message: a ModelConfig built in code is not
  // validated, and an enum member cannot hold an unknown spelling).
  Cfg read(const ModelConfig& c) const {
    Cfg g = defaults_;
    for (const auto& a : args_) {
      const ModelValue* v = c.find(a.name);
      if (!v) throw Error(std::string("model.") + a.name + ": not set (model.type = \"" + c.type + "\")");
      if (const auto* s = std::get_if<std::string>(v)) {
        if (const std::string bad = value_violation(KeyRange{}, a.choices, *s); !bad.empty()) {
          throw InputError(std::string("model.") + a.name + ": " + bad);
        }
      }
      set(g, a, *v, [&] { return Error(std::string("model.") + a.name + ": holds " +
                                       value_type_name(*v) + ", read as another type"); });
    }
    return g;
  }
  // The inverse: every row's value of `g` set into `c` (a ModelConfig of this family).
  void write(const Cfg& g, ModelConfig* c) const {
    for (const auto& a : args_) c->set(a.name, get(g, a));
  }
  // Every row's range and choices on the values of `g` (a Cfg built in code; config
  // validation checked a parsed one from keys()): throws fail("model.<name>", what) with
  // config validation's what: "<value> is out of range (expected ...)" or
  // "unknown value \"s\" (expected one of ...)".
  void check(const Cfg& g, const KeyFail& fail) const {
    for (const auto& a : args_) {
      if (const std::string bad = violation(a, get(g, a)); !bad.empty()) {
        throw fail(std::string("model.") + a.name, bad);
      }
    }
  }

  // The name (config.json attribute) of the row of `member`, or of the enum row whose
  // EnumMember::get is `enum_get`, for messages of a family's own checks.
  template <class T>
  std::string name(T Cfg::* member) const {
    for (const auto& a : args_) {
      if (const auto* m = std::get_if<T Cfg::*>(&a.member); m && *m == member) return a.name;
    }
    throw Error("ModelArgs::name: a member without a row");
  }
  std::string name(std::string (*enum_get)(const Cfg&)) const {
    for (const auto& a : args_) {
      if (const auto* m = std::get_if<EnumMember<Cfg>>(&a.member); m && m->get == enum_get) {
        return a.name;
      }
    }
    throw Error("ModelArgs::name: an enum member without a row");
  }
  // Whether `member` has a row (a key of this table).
  template <class T>
  bool has(T Cfg::* member) const {
    for (const auto& a : args_) {
      if (const auto* m = std::get_if<T Cfg::*>(&a.member); m && *m == member) return true;
    }
    return false;
  }
  // "model.<name>" of the row of `member` (as name()).
  template <class M>
  std::string key(M member) const {
    return "model." + name(member);
  }

  // The rows with hf = true as config.json attributes; a dotted name nests.
  nlohmann::json to_hf(const Cfg& g) const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& a : args_) {
      if (!a.hf) continue;
      std::visit([&](const auto& v) { at(j, a.name) = v; }, get(g, a));
    }
    return j;
  }

  // `base` with every hf row read from config.json `j`: the attribute's value, or its
  // hf_default when absent (or null, for a nested dict that is null). Throws InputError
  // "<origin>: \"<name>\" ..." on a required attribute missing, a value of the wrong type,
  // a number out of the row's range or a string not among its choices.
  Cfg from_hf(const nlohmann::json& j, const std::string& origin, Cfg base) const {
    for (const auto& a : args_) {
      if (!a.hf) continue;
      const nlohmann::json* v = find(j, a.name);
      const std::string where = origin + ": \"" + a.name + "\"";
      ModelValue value;
      if (!v) {
        if (!a.hf_default) throw InputError(where + " missing");
        value = *a.hf_default;
      } else {
        const ModelValue like = get(base, a);  // the row's type
        if (!model_value_from_json(*v, like, &value)) {
          throw InputError(where + ": expected " + value_type_name(like) + ", got " + v->dump());
        }
      }
      if (const std::string bad = v ? violation(a, value) : std::string(); !bad.empty()) {
        throw InputError(where + ": " + bad);
      }
      set(base, a, value, [] { return Error("ModelArgs::from_hf: type"); });
    }
    return base;
  }

 private:
  // "" when `v` is inside the row's range and among its choices, else what is wrong with it
  // (config's value_violation: the wording config validation uses).
  static std::string violation(const ModelArg<Cfg>& a, const ModelValue& v) {
    return value_violation(a.range, a.choices, v);
  }
  static ModelValue get(const Cfg& g, const ModelArg<Cfg>& a) {
    return std::visit(
        [&](auto m) -> ModelValue {
          if constexpr (std::is_same_v<decltype(m), EnumMember<Cfg>>) {
            return m.get(g);
          } else {
            return g.*m;
          }
        },
        a.member);
  }
  // Sets the row's member from `v`; throws wrong() when v has another type. An enum row's
  // unknown spelling leaves the member as it is (validation names it, from the choices).
  template <class Wrong>
  static void set(Cfg& g, const ModelArg<Cfg>& a, const ModelValue& v, Wrong&& wrong) {
    std::visit(
        [&](auto m) {
          if constexpr (std::is_same_v<decltype(m), EnumMember<Cfg>>) {
            const auto* p = std::get_if<std::string>(&v);
            if (!p) throw wrong();
            m.set(g, *p);
          } else {
            using T = std::decay_t<decltype(g.*m)>;
            const T* p = std::get_if<T>(&v);
            if (!p) throw wrong();
            g.*m = *p;
          }
        },
        a.member);
  }
  // j at dotted path `name`, or null when a part is missing or not an object.
  static const nlohmann::json* find(const nlohmann::json& j, const std::string& name) {
    const nlohmann::json* cur = &j;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = name.find('.', start);
      const std::string part = name.substr(start, dot == std::string::npos ? dot : dot - start);
      if (!cur->is_object() || !cur->contains(part) || (*cur)[part].is_null()) return nullptr;
      cur = &(*cur)[part];
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }
  static nlohmann::json& at(nlohmann::json& j, const std::string& name) {
    nlohmann::json* cur = &j;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = name.find('.', start);
      cur = &(*cur)[name.substr(start, dot == std::string::npos ? dot : dot - start)];
      if (dot == std::string::npos) return *cur;
      start = dot + 1;
    }
  }

  std::vector<ModelArg<Cfg>> args_;
  Cfg defaults_;
};

}  // namespace fsdp
