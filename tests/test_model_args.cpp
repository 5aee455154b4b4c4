// Every model family's configuration is one table of keys (fsdp/model/model_args.hpp), for
// every family of fsdp::model_families(), present and future: the [model] defaults survive
// config.json out and in (fsdp_merge, model.init_from); every key has its doc and every
// integer key its range; and no key is spelled in src/ outside the tables (issue 28 item 1:
// "No model key is spelled in more than one place in src/"), bar a short, justified list.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <typeindex>
#include <typeinfo>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/core/error.hpp"
#include "fsdp/model/model.hpp"

namespace {

namespace fs = std::filesystem;
using fsdp::ModelConfig;
using fsdp::ModelFamily;
using fsdp::ModelKey;

TEST(ModelArgs, DefaultsRoundTripThroughHfConfig) {
  ASSERT_FALSE(fsdp::model_families().empty());
  for (const ModelFamily* f : fsdp::model_families()) {
    SCOPED_TRACE("model.type = " + f->type());
    const ModelConfig defaults = fsdp::model_defaults(f->type());
    const nlohmann::json hf = f->hf_config(defaults);
    EXPECT_EQ(f->from_hf_config(hf, "config.json"), defaults);
    // The same through the text fsdp_merge writes and init_from reads.
    EXPECT_EQ(f->from_hf_config(nlohmann::json::parse(hf.dump(2)), "config.json"), defaults);
  }
}

// Every family reads a config.json of its own model.type (init_from, --model-from), each
// model_type names one family (Gemma 3 4B+'s multimodal "gemma3" the gemma3_text decoder), and
// an unknown one is one line listing what is read.
TEST(ModelArgs, EachHfModelTypeNamesOneFamily) {
  std::map<std::string, std::string> owner;
  for (const ModelFamily* f : fsdp::model_families()) {
    const std::vector<std::string> types = f->hf_model_types();
    EXPECT_TRUE(std::find(types.begin(), types.end(), f->type()) != types.end()) << f->type();
    for (const std::string& t : types) {
      EXPECT_TRUE(owner.emplace(t, f->type()).second) << t << ": read by two families";
      EXPECT_EQ(&fsdp::model_family_of_hf(t), f) << t;
    }
  }
  EXPECT_EQ(fsdp::model_family_of_hf("gemma3").type(), "gemma3_text");
  try {
    fsdp::model_family_of_hf("bert");
    ADD_FAILURE() << "bert has a family";
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("\"model_type\" \"bert\" is not supported (expected one of gpt2, t5, "),
              std::string::npos) << msg;
    EXPECT_NE(msg.find("gemma3_text, gemma3, "), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(ModelArgs, EveryKeyHasItsDocAndEveryIntegerKeyItsRange) {
  for (const ModelFamily* f : fsdp::model_families()) {
    SCOPED_TRACE("model.type = " + f->type());
    std::set<std::string> names;
    ASSERT_FALSE(f->keys().empty());
    for (const ModelKey& k : f->keys()) {
      EXPECT_TRUE(names.insert(k.name).second) << k.name << " declared twice";
      EXPECT_FALSE(k.doc.empty()) << k.name << " has no one-line doc";
      EXPECT_EQ(k.doc.find('\n'), std::string::npos) << k.name << ": the doc is one line";
      const auto& v = k.default_value;
      if (std::holds_alternative<int64_t>(v)) {
        EXPECT_TRUE(k.range.bounded()) << k.name << ": an integer key (a size) needs a range";
        EXPECT_TRUE(k.range.integer) << k.name << ": an integer key's range is of integers";
      }
      if (k.range.bounded() &&
          (std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v))) {
        const double x = std::holds_alternative<int64_t>(v)
                             ? static_cast<double>(std::get<int64_t>(v))
                             : std::get<double>(v);
        EXPECT_TRUE(k.range.contains(x)) << k.name << ": the default is outside its range";
      }
      if (k.range.bounded()) {  // (an array of numbers: each element in the range)
        EXPECT_TRUE(std::holds_alternative<int64_t>(v) || std::holds_alternative<double>(v) ||
                    std::holds_alternative<std::vector<double>>(v))
            << k.name << ": a range on a key that is not a number";
      }
      if (const auto* a = std::get_if<std::vector<double>>(&v)) {
        for (double x : *a) EXPECT_TRUE(k.range.contains(x)) << k.name << ": a default element";
      }
      if (!k.choices.empty()) {
        ASSERT_TRUE(std::holds_alternative<std::string>(v))
            << k.name << ": choices on a non-string key";
        EXPECT_NE(std::find(k.choices.begin(), k.choices.end(), std::get<std::string>(v)),
                  k.choices.end())
            << k.name << ": the default is not among its choices";
      }
    }
  }
}

// ---- the source scan ----

// The string literals of a C++ source, comments skipped: each literal's text as written
// (escapes not resolved), adjacent literals separately.
std::vector<std::string> string_literals(const std::string& s) {
  std::vector<std::string> out;
  const std::size_t n = s.size();
  std::size_t i = 0;
  while (i < n) {
    const char c = s[i];
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      i = s.find('\n', i);
      if (i == std::string::npos) break;
    } else if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      i = s.find("*/", i + 2);
      if (i == std::string::npos) break;
      i += 2;
    } else if (c == '"') {
      if (i > 0 && s[i - 1] == 'R') {  // raw string R"delim( ... )delim"
        const std::size_t open = s.find('(', i);
        if (open == std::string::npos) break;
        const std::string close = ")" + s.substr(i + 1, open - i - 1) + "\"";
        const std::size_t end = s.find(close, open + 1);
        if (end == std::string::npos) break;
        out.push_back(s.substr(open + 1, end - open - 1));
        i = end + close.size();
        continue;
      }
      std::size_t j = i + 1;
      while (j < n && s[j] != '"' && s[j] != '\n') j += s[j] == '\\' ? 2 : 1;
      out.push_back(s.substr(i + 1, std::min(j, n) - i - 1));
      i = j + 1;
    } else if (c == '\'') {
      // A digit separator (1'000) or a character literal.
      if (i > 0 && std::isalnum(static_cast<unsigned char>(s[i - 1])) && i + 1 < n &&
          std::isxdigit(static_cast<unsigned char>(s[i + 1]))) {
        ++i;
        continue;
      }
      std::size_t j = i + 1;
      while (j < n && s[j] != '\'' && s[j] != '\n') j += s[j] == '\\' ? 2 : 1;
      i = j + 1;
    } else {
      ++i;
    }
  }
  return out;
}

bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Spellings of `name` in one literal: the literal "name" itself, "model.name" inside a message
// and \"name\" (a quoted attribute inside a message).
int spellings(const std::string& literal, const std::string& name) {
  int count = literal == name;
  const std::string dotted = "model." + name;
  for (std::size_t at = literal.find(dotted); at != std::string::npos;
       at = literal.find(dotted, at + 1)) {
    const std::size_t end = at + dotted.size();
    const bool alone = (at == 0 || !ident(literal[at - 1])) &&
                       (end == literal.size() || (!ident(literal[end]) && literal[end] != '.'));
    count += alone;
  }
  const std::string quoted = "\\\"" + name + "\\\"";
  for (std::size_t at = literal.find(quoted); at != std::string::npos;
       at = literal.find(quoted, at + 1)) {
    ++count;
  }
  return count;
}

// Where a key name may be spelled outside the families' tables, on purpose: the name, a file
// or a folder (ending in '/') under the source root, and why. Keep it short.
struct Allowed {
  const char* name;
  const char* where;
  const char* why;
};
const Allowed kAllowed[] = {
    {"vocab_size", "src/data/",
     "the HDF5 token file's root attribute (docs/data.md) has the same name: a file format's "
     "field, not the model key; the data layer's messages compare it with model.vocab_size, "
     "which reaches it as ModelFamily::vocab_size()"},
    {"tie_word_embeddings", "src/checkpoint/init_from.cpp",
     "reads any family's hf_config() output for whether lm_head.weight is a tied copy: a "
     "config.json attribute of every family, not one family's key"},
    // Attributes of GPT2Config that other families have as keys: constants of gpt2's
    // config.json (written, and checked on the way in), not gpt2 keys.
    {"tie_word_embeddings", "src/model/gpt2.cpp", "fsdp_train's GPT-2 is always tied: true"},
    {"initializer_range", "src/model/gpt2.cpp", "written as HF's 0.02 (the initialisation's std)"},
    // T5Config's pad_token_id (a gemma3_text key): a constant of t5's config.json, the 0 its
    // shifted decoder inputs start with (written, and checked on the way in).
    {"pad_token_id", "src/model/t5_family.cpp", "T5's decoder inputs pad with 0"},
};

bool allowed(const std::string& name, const std::string& path) {
  for (const Allowed& a : kAllowed) {
    const std::string where = a.where;
    const bool match = where.back() == '/' ? path.rfind(where, 0) == 0 : path == where;
    if (match && name == a.name) return true;
  }
  return false;
}

TEST(ModelArgs, EveryKeyIsSpelledOnceInSrc) {
  // name -> the number of family classes that declare it (each class's table spells it once;
  // one class may serve several model.types, as LlamaFamily serves llama, mistral, qwen2 and
  // qwen3 from one table builder).
  std::map<std::string, std::set<std::type_index>> classes;
  for (const ModelFamily* f : fsdp::model_families()) {
    for (const ModelKey& k : f->keys()) classes[k.name].insert(std::type_index(typeid(*f)));
  }
  std::map<std::string, int> declared;
  for (const auto& [name, c] : classes) declared[name] = static_cast<int>(c.size());
  ASSERT_FALSE(declared.empty());
  const fs::path root = FSDP_SOURCE_DIR;
  ASSERT_TRUE(fs::is_directory(root / "src")) << root / "src";
  std::map<std::string, std::map<std::string, int>> found;  // name -> file -> spellings
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(root / "src")) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() ||
        (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) {
      continue;
    }
    ++files;
    std::ifstream in(e.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    const std::string path = fs::relative(e.path(), root).generic_string();
    for (const std::string& literal : string_literals(text.str())) {
      for (const auto& [name, n] : declared) {
        if (const int k = spellings(literal, name); k > 0 && !allowed(name, path))
          found[name][path] += k;
      }
    }
  }
  ASSERT_GT(files, 0);
  for (const auto& [name, families] : declared) {
    int total = 0;
    std::string where;
    for (const auto& [path, k] : found[name]) {
      total += k;
      where += "\n  " + path + ": " + std::to_string(k);
    }
    EXPECT_EQ(total, families) << "\"" << name << "\" is a key of " << families << " family class"
                               << (families == 1 ? "" : "es")
                               << " and should be spelled once in each table, as a string "
                                  "literal; spelled in src/:"
                               << where;
  }
}

TEST(ModelArgs, TheScanSeesLiteralsNotComments) {
  const auto lits = string_literals(
      "// \"d_model\"\n/* \"d_model\" */ f(\"d_model\", 'x', '\"', 1'000);\n"
      "g(\"a \\\"num_heads\\\" b\", R\"(model.d_kv)\");");
  ASSERT_EQ(lits.size(), 3u);
  EXPECT_EQ(spellings(lits[0], "d_model"), 1);
  EXPECT_EQ(spellings(lits[1], "num_heads"), 1);
  EXPECT_EQ(spellings(lits[2], "d_kv"), 1);
  EXPECT_EQ(spellings("model.d_kv_x and submodel.d_kv", "d_kv"), 0);
  EXPECT_EQ(spellings("model.d_kv: 0 is out of range", "d_kv"), 1);
}

// config.json fields that change the math must describe the model each family implements:
// different values are one line naming the field, equivalent spellings load (issue 29 item 4:
// GPT-2 loaded scale_attn_weights false and refused n_inner = 4 n_embd; issue 28: Llama's
// rope types, activations and transformers 5's rope_parameters).
std::string hf_error(const std::string& type, const nlohmann::json& hf) {
  try {
    fsdp::model_family(type).from_hf_config(hf, "config.json");
  } catch (const fsdp::Error& e) {
    EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << e.what();
    return e.what();
  }
  return "";
}

TEST(ModelArgs, HfConfigFieldsThatChangeTheMathAreChecked) {
  const ModelFamily& gpt2 = fsdp::model_family("gpt2");
  nlohmann::json g = gpt2.hf_config(fsdp::model_defaults("gpt2"));
  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"scale_attn_weights", false}, {"scale_attn_by_inverse_layer_idx", true},
           {"add_cross_attention", true}, {"activation_function", "relu"},
           {"n_inner", 100}, {"tie_word_embeddings", false}}) {
    nlohmann::json bad = g;
    bad[field] = value;
    EXPECT_NE(hf_error("gpt2", bad).find("\"" + field + "\""), std::string::npos) << field;
  }
  for (auto [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"n_inner", 4 * 128}, {"activation_function", "gelu_pytorch_tanh"},
           {"scale_attn_weights", true}, {"scale_attn_by_inverse_layer_idx", false}}) {
    nlohmann::json ok = g;
    ok[field] = value;
    EXPECT_EQ(hf_error("gpt2", ok), "") << field << " = " << value.dump() << " is what GPT-2 computes";
  }

  const ModelFamily& llama = fsdp::model_family("llama");
  const ModelConfig defaults = fsdp::model_defaults("llama");
  nlohmann::json l = llama.hf_config(defaults);
  auto with = [&](const std::string& field, const nlohmann::json& value) {
    nlohmann::json j = l;
    j[field] = value;
    return j;
  };
  EXPECT_NE(hf_error("llama", with("hidden_act", "gelu")).find("\"hidden_act\""), std::string::npos);
  EXPECT_NE(hf_error("llama", with("attention_dropout", 0.1)).find("\"attention_dropout\""),
            std::string::npos);
  EXPECT_NE(hf_error("llama", with("rope_scaling", {{"rope_type", "dynamic"}, {"factor", 4.0}}))
                .find("\"rope_scaling.rope_type\": unknown value \"dynamic\" (expected one of default, "
                      "linear, llama3, yarn)"),
            std::string::npos);
  EXPECT_NE(hf_error("llama", with("num_hidden_layers", "4")).find("\"num_hidden_layers\""),
            std::string::npos);
  // Legacy rope_scaling "type" and transformers 5's rope_parameters read as the same model.
  const nlohmann::json llama3 = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  nlohmann::json legacy = llama3;
  legacy.erase("rope_type");
  legacy["type"] = "llama3";
  const ModelConfig a = llama.from_hf_config(with("rope_scaling", llama3), "a.json");
  EXPECT_EQ(llama.from_hf_config(with("rope_scaling", legacy), "b.json"), a);
  nlohmann::json v5 = l;
  v5.erase("rope_theta");
  v5.erase("rope_scaling");
  v5["rope_parameters"] = llama3;
  v5["rope_parameters"]["rope_theta"] = 10000.0;
  EXPECT_EQ(llama.from_hf_config(v5, "c.json"), a);
  EXPECT_EQ(a.string("rope_scaling.rope_type"), "llama3");
  // Absent attributes take LlamaConfig's defaults: no num_key_value_heads is MHA, no head_dim
  // is hidden_size / num_attention_heads; the canonical form spells both 0.
  nlohmann::json old = l;
  old.erase("num_key_value_heads");
  old.erase("head_dim");
  EXPECT_EQ(llama.from_hf_config(old, "d.json"), llama.canonical(defaults));

  // Each rope type's config.json carries its own fields only, and reads back the same; yarn's
  // attention_factor 0 is HF's None (left out); DeepSeek's mscale and a yarn without
  // original_max_position_embeddings are refused by name.
  const nlohmann::json yarn = {{"rope_type", "yarn"}, {"factor", 4.0},
                               {"original_max_position_embeddings", 32768}};
  const ModelConfig y = llama.from_hf_config(with("rope_scaling", yarn), "e.json");
  const nlohmann::json y_out = llama.hf_config(y)["rope_scaling"];
  EXPECT_EQ(y_out, nlohmann::json({{"rope_type", "yarn"}, {"factor", 4.0},
                                   {"original_max_position_embeddings", 32768}, {"beta_fast", 32.0},
                                   {"beta_slow", 1.0}, {"truncate", true}}));
  EXPECT_EQ(llama.from_hf_config(with("rope_scaling", y_out), "f.json"), y);
  nlohmann::json y_af = yarn;
  y_af["attention_factor"] = 0.8;
  EXPECT_EQ(llama.hf_config(llama.from_hf_config(with("rope_scaling", y_af), "g.json"))["rope_scaling"]["attention_factor"],
            0.8);
  EXPECT_EQ(llama.hf_config(a)["rope_scaling"].size(), 5u) << "llama3: rope_type and its four fields";
  const nlohmann::json linear = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_EQ(llama.hf_config(llama.from_hf_config(with("rope_scaling", linear), "h.json"))["rope_scaling"], linear);
  nlohmann::json deepseek = yarn;
  deepseek["mscale"] = 0.707;
  EXPECT_NE(hf_error("llama", with("rope_scaling", deepseek)).find("\"rope_scaling.mscale\""), std::string::npos);
  nlohmann::json no_orig = yarn;
  no_orig.erase("original_max_position_embeddings");
  EXPECT_NE(hf_error("qwen3", [&] {
              nlohmann::json q = fsdp::model_family("qwen3").hf_config(fsdp::model_defaults("qwen3"));
              q["rope_scaling"] = no_orig;
              return q;
            }()).find("\"rope_scaling.original_max_position_embeddings\" missing"),
            std::string::npos);
}

// Mistral, Qwen2, Qwen3 and OLMo 2 are the Llama model under their own HF classes: each config.json
// names its class and has that class's attributes only; each reads back to the same [model];
// a config.json of another class and Qwen's layer_types other than the flags give are one line
// naming the field; sliding windows shorter than the sequences are accepted.
TEST(ModelArgs, LlamaFamilyClassesHaveTheirOwnConfigJson) {
  struct Want {
    const char* type;
    const char* architecture;
    std::vector<std::string> present, absent;
  };
  for (const Want& w : {Want{"mistral", "MistralForCausalLM", {"head_dim", "sliding_window"},
                             {"attention_bias", "mlp_bias", "use_sliding_window", "pretraining_tp"}},
                        Want{"qwen2", "Qwen2ForCausalLM",
                             {"use_sliding_window", "sliding_window", "max_window_layers"},
                             {"head_dim", "attention_bias", "mlp_bias", "pretraining_tp"}},
                        Want{"qwen3", "Qwen3ForCausalLM",
                             {"head_dim", "attention_bias", "use_sliding_window", "max_window_layers"},
                             {"mlp_bias", "pretraining_tp"}},
                        Want{"olmo2", "Olmo2ForCausalLM", {"attention_bias", "rms_norm_eps"},
                             {"head_dim", "mlp_bias", "sliding_window", "use_sliding_window",
                              "pretraining_tp"}}}) {
    SCOPED_TRACE(w.type);
    const ModelFamily& f = fsdp::model_family(w.type);
    const ModelConfig defaults = fsdp::model_defaults(w.type);
    const nlohmann::json hf = f.hf_config(defaults);
    EXPECT_EQ(hf["model_type"], w.type);
    EXPECT_EQ(hf["architectures"], nlohmann::json::array({w.architecture}));
    for (const std::string& k : w.present) EXPECT_TRUE(hf.contains(k)) << k;
    for (const std::string& k : w.absent) EXPECT_FALSE(hf.contains(k)) << k;
    EXPECT_EQ(f.wrap_classes(), std::vector<std::string>{std::string(w.architecture).substr(
                                    0, std::string(w.architecture).find("For")) + "DecoderLayer"});
    EXPECT_EQ(f.from_hf_config(hf, "config.json"), f.canonical(defaults));
    EXPECT_NE(hf_error(w.type, fsdp::model_family("llama").hf_config(fsdp::model_defaults("llama")))
                  .find("\"model_type\" is not \"" + std::string(w.type) + "\""),
              std::string::npos);
  }

  // Mistral: HF's null window is 0 both ways.
  const ModelFamily& mistral = fsdp::model_family("mistral");
  nlohmann::json m = mistral.hf_config(fsdp::model_defaults("mistral"));
  m["sliding_window"] = nullptr;
  const ModelConfig none = mistral.from_hf_config(m, "config.json");
  EXPECT_EQ(std::get<int64_t>(*none.find("sliding_window")), 0);
  EXPECT_TRUE(mistral.hf_config(none)["sliding_window"].is_null());
  m.erase("sliding_window");  // absent: MistralConfig's 4096
  EXPECT_EQ(std::get<int64_t>(*mistral.from_hf_config(m, "config.json").find("sliding_window")), 4096);

  // OLMo 2 without rms_norm_eps reads as Olmo2Config's 1e-5 (LlamaConfig's is 1e-6).
  const ModelFamily& olmo2 = fsdp::model_family("olmo2");
  nlohmann::json o = olmo2.hf_config(fsdp::model_defaults("olmo2"));
  o.erase("rms_norm_eps");
  EXPECT_EQ(std::get<double>(*olmo2.from_hf_config(o, "config.json").find("rms_norm_eps")), 1e-5);

  // Qwen3 without head_dim reads as Qwen3Config's 128; layer_types must match the flags.
  const ModelFamily& qwen3 = fsdp::model_family("qwen3");
  nlohmann::json q = qwen3.hf_config(fsdp::model_defaults("qwen3"));
  q.erase("head_dim");
  EXPECT_EQ(std::get<int64_t>(*qwen3.from_hf_config(q, "config.json").find("head_dim")), 128);
  q = qwen3.hf_config(fsdp::model_defaults("qwen3"));
  const int64_t layers = q["num_hidden_layers"].get<int64_t>();
  q["layer_types"] = std::vector<std::string>(static_cast<std::size_t>(layers), "full_attention");
  EXPECT_EQ(hf_error("qwen3", q), "");
  q["layer_types"][layers - 1] = "sliding_attention";
  EXPECT_NE(hf_error("qwen3", q).find("\"layer_types\""), std::string::npos);
  q["use_sliding_window"] = true;
  q["max_window_layers"] = layers - 1;
  EXPECT_EQ(hf_error("qwen3", q), "") << "the last layer slides, as the flags say";

  // The window must cover data.seq_len wherever a layer slides.
  auto config_error = [](const std::string& model_keys, int64_t seq_len) -> std::string {
    try {
      fsdp::parse_config("[model]\n" + model_keys + "\n[data]\nsource = \"synthetic\"\nseq_len = " +
                             std::to_string(seq_len) + "\n",
                         "input.toml", {});
    } catch (const fsdp::Error& e) {
      EXPECT_EQ(e.exit_code(), fsdp::kExitInputError) << e.what();
      return e.what();
    }
    return "";
  };
  // Windows shorter than the sequences are sliding-window attention (gqa_attention_*'s window).
  EXPECT_EQ(config_error("type = \"mistral\"\nsliding_window = 64", 128), "");
  EXPECT_EQ(config_error("type = \"mistral\"\nsliding_window = 128", 128), "");
  EXPECT_EQ(config_error("type = \"mistral\"\nsliding_window = 0", 128), "");
  const std::string qwen_keys = "type = \"qwen2\"\nsliding_window = 64\nnum_hidden_layers = 4\n";
  EXPECT_EQ(config_error(qwen_keys + "use_sliding_window = false", 128), "");
  EXPECT_EQ(config_error(qwen_keys + "use_sliding_window = true\nmax_window_layers = 4", 128), "")
      << "no layer from max_window_layers on: nothing slides";
  EXPECT_EQ(config_error(qwen_keys + "use_sliding_window = true\nmax_window_layers = 3", 128), "");
  // Qwen2 has no head_dim key: hidden_size / heads must be whole and even.
  EXPECT_NE(config_error("type = \"qwen2\"\nhead_dim = 8", 16).find("model.head_dim"),
            std::string::npos);
  EXPECT_NE(config_error("type = \"qwen2\"\nhidden_size = 36\nnum_attention_heads = 4", 16)
                .find("model.hidden_size: 36 / model.num_attention_heads = 9 is odd"),
            std::string::npos);
}

// Published config.json files (Qwen/Qwen3-0.6B, Qwen/Qwen2.5-0.5B, mistralai/Mistral-7B-v0.3,
// an OLMo 2 7B
// on the Hugging Face Hub, as saved by transformers 4.40-4.51: integer rope_theta, null
// sliding_window, token ids and transformers_version that are not keys) read as the
// published sizes, and write back the same numbers.
TEST(ModelArgs, PublishedLlamaFamilyConfigsRead) {
  struct Published {
    const char* type;
    const char* json;
    std::vector<std::pair<std::string, fsdp::ModelValue>> want;
  };
  const std::vector<Published> files = {
      {"qwen3",
       R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
           "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
           "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
           "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
           "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
           "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
           "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
           "vocab_size": 151936})",
       {{"head_dim", int64_t{128}}, {"num_key_value_heads", int64_t{8}},
        {"rope_theta", 1e6}, {"tie_word_embeddings", true}, {"vocab_size", int64_t{151936}}}},
      {"qwen2",
       R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
           "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
           "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
           "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
           "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
           "tie_word_embeddings": true, "torch_dtype": "bfloat16",
           "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
           "vocab_size": 151936})",
       {{"hidden_size", int64_t{896}}, {"num_key_value_heads", int64_t{2}},
        {"sliding_window", int64_t{32768}}, {"use_sliding_window", false}}},
      {"mistral",
       R"({"architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
           "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
           "initializer_range": 0.02, "intermediate_size": 14336,
           "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
           "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
           "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false,
           "torch_dtype": "bfloat16", "transformers_version": "4.42.0.dev0", "use_cache": true,
           "vocab_size": 32768})",
       {{"head_dim", int64_t{0}}, {"sliding_window", int64_t{0}}, {"rms_norm_eps", 1e-5},
        {"vocab_size", int64_t{32768}}}},
      // OLMo 2 7B's shape (allenai/OLMo-2-1124-7B: the model card's 32 layers, hidden 4096, 32
      // heads, context 4096; the OLMo 2 paper's RoPE theta 5e5 and padded vocabulary 100352),
      // written as transformers 4.47 saves an Olmo2Config: no head_dim, pad_token_id.
      {"olmo2",
       R"({"architectures": ["Olmo2ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
           "eos_token_id": 100257, "hidden_act": "silu", "hidden_size": 4096,
           "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
           "model_type": "olmo2", "num_attention_heads": 32, "num_hidden_layers": 32,
           "num_key_value_heads": 32, "pad_token_id": 100277, "rms_norm_eps": 1e-06,
           "rope_scaling": null, "rope_theta": 500000, "tie_word_embeddings": false,
           "torch_dtype": "float32", "transformers_version": "4.47.0.dev0", "use_cache": true,
           "vocab_size": 100352})",
       {{"num_key_value_heads", int64_t{0}}, {"rope_theta", 5e5}, {"rms_norm_eps", 1e-6},
        {"max_position_embeddings", int64_t{4096}}, {"vocab_size", int64_t{100352}}}},
  };
  for (const Published& p : files) {
    SCOPED_TRACE(p.type);
    const ModelFamily& f = fsdp::model_family(p.type);
    const nlohmann::json in = nlohmann::json::parse(p.json);
    const ModelConfig c = f.from_hf_config(in, "config.json");
    for (const auto& [key, value] : p.want) {
      ASSERT_NE(c.find(key), nullptr) << key;
      EXPECT_EQ(*c.find(key), value) << key;
    }
    const nlohmann::json out = f.hf_config(c);
    for (const auto& [key, value] : in.items()) {
      if (key == "torch_dtype" || key == "transformers_version" || key.find("token_id") != std::string::npos) {
        continue;  // not the model's math
      }
      if (key == "head_dim" || key == "num_key_value_heads" || value.is_number()) {
        EXPECT_EQ(out.at(key).get<double>(), value.get<double>()) << key;
      } else if (key == "sliding_window" && p.type != std::string("mistral")) {
        EXPECT_TRUE(out.contains(key)) << key;  // Qwen's unused window: 4096 for null, as HF
      } else {
        EXPECT_EQ(out.at(key), value) << key;
      }
    }
  }
}

}  // namespace
