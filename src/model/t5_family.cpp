// The "t5" model family (registry entry; see fsdp/model/model.hpp and fsdp/model/t5.hpp), its
// one table of [model] keys (fsdp/model/model_args.hpp) and Hugging Face config.json.
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/core/error.hpp"
#include "fsdp/model/model_args.hpp"
#include "fsdp/model/t5.hpp"

namespace fsdp {
namespace {

// feed_forward_proj as T5Config's enum (HF's spelling in TOML and config.json).
std::string feed_forward_get(const T5Config& c) { return to_string(c.feed_forward_proj); }
bool feed_forward_set(T5Config& c, const std::string& s) {
  const auto f = t5_feed_forward_from_string(s);
  if (f) c.feed_forward_proj = *f;
  return f.has_value();
}

// HF T5Config's attributes fsdp_train trains, in the order --list-keys and to_toml print them.
// Defaults: T5Config's (a small ByT5-vocabulary T5 v1.0 for CPU runs). config.json: vocab_size,
// d_model, d_kv, d_ff, num_layers and num_heads are required (a T5 config.json always has
// them); the others take HF T5Config's defaults when absent, num_decoder_layers num_layers'
// value (t5_config_from_hf: a row's default is a constant).
const ModelArgs<T5Config>& t5_args() {
  using A = ModelArg<T5Config>;
  static const ModelArgs<T5Config> args({
      A{"d_model", &T5Config::d_model, "Hidden size.", KeyRange::size(1)},
      A{"d_kv", &T5Config::d_kv, "Width of one attention head (need not be `d_model / num_heads`).",
        KeyRange::size(1)},
      A{"d_ff", &T5Config::d_ff, "Feed-forward width.", KeyRange::size(1)},
      A{"num_layers", &T5Config::num_layers, "Encoder blocks.", KeyRange::layers()},
      A{"num_decoder_layers", &T5Config::num_decoder_layers, "Decoder blocks.",
        KeyRange::layers()},
      A{"num_heads", &T5Config::num_heads, "Attention heads.", KeyRange::size(1)},
      // Each half of the bidirectional buckets needs an exact and a logarithmic part.
      A{"relative_attention_num_buckets", &T5Config::relative_attention_num_buckets,
        "Relative position buckets.", KeyRange::size(4), {}, true, int64_t{32}},
      A{"relative_attention_max_distance", &T5Config::relative_attention_max_distance,
        "Distance beyond which positions share the last bucket.", KeyRange::size(1), {}, true,
        int64_t{128}},
      A{"feed_forward_proj", EnumMember<T5Config>{feed_forward_get, feed_forward_set},
        "Feed-forward block.", {},
        enum_names<T5FeedForward>(), true,
        std::string(to_string(T5FeedForward::relu))},
      A{"tie_word_embeddings", &T5Config::tie_word_embeddings,
        "Whether the LM head is the shared embedding.", {}, {}, true, true},
      A{"layer_norm_epsilon", &T5Config::layer_norm_epsilon, "T5LayerNorm epsilon.",
        KeyRange::above(0), {}, true, 1e-6},
      A{"vocab_size", &T5Config::vocab_size,
        "Vocabulary (ByT5: 3 specials + 256 bytes + 125 sentinel ids).", KeyRange::size(1)},
  });
  return args;
}

// HF's bucket function takes the log of max_distance / (buckets / 2): it must exceed 1.
// `name(member)` spells a key as the message's origin does (model.x; config.json's "x").
template <class Name, class Fail>
void check_max_distance(const T5Config& t, const Name& name, const Fail& fail) {
  const int64_t nb = t.relative_attention_num_buckets, md = t.relative_attention_max_distance;
  if (md <= nb / 2) {
    throw fail(name(&T5Config::relative_attention_max_distance),
               std::to_string(md) + " is out of range (expected > " +
                   name(&T5Config::relative_attention_num_buckets) + " / 2 = " +
                   std::to_string(nb / 2) + ")");
  }
}
// ByT5's byte vocabulary: 3 special ids and 256 bytes at least (the data fsdp_train trains on;
// a model built in code, or a config.json, may have fewer).
constexpr int64_t kByT5MinVocab = 259;

}  // namespace

T5Config T5Config::from(const ModelConfig& c) {
  T5Config t = t5_args().read(c);
  t.pad_vocab_multiple = c.pad_vocab_multiple;
  return t;
}

void validate_t5_config(const T5Config& c) {
  const KeyFail fail = [](const std::string& key, const std::string& what) {
    return InputError(key + ": " + what);
  };
  t5_args().check(c, fail);
  require_at_least(fail, "model.pad_vocab_multiple", c.pad_vocab_multiple, 1);
  check_max_distance(c, [](auto member) { return t5_args().key(member); }, fail);
}

nlohmann::json t5_hf_config(const T5Config& c) {
  nlohmann::json j = t5_args().to_hf(c);
  j["architectures"] = {"T5ForConditionalGeneration"};
  j["model_type"] = "t5";
  j["dropout_rate"] = 0.0;
  j["initializer_factor"] = 1.0;
  j["is_encoder_decoder"] = true;
  j["pad_token_id"] = 0;
  j["eos_token_id"] = 1;
  j["decoder_start_token_id"] = 0;
  j["torch_dtype"] = "float32";
  return j;
}

T5Config t5_config_from_hf(const nlohmann::json& hf, const std::string& origin) {
  if (!hf.is_object()) throw InputError(origin + ": a T5 config must be a JSON object");
  const auto& args = t5_args();
  auto present = [&](const char* field) { return hf.contains(field) && !hf[field].is_null(); };
  auto refuse = [&](const char* field, const std::string& expected) {
    return InputError(origin + ": \"" + field + "\" " + hf[field].dump() +
                      " is not supported (expected " + expected + ")");
  };
  if (present("model_type") && hf["model_type"] != "t5") throw refuse("model_type", "\"t5\"");
  // HF T5Config: num_decoder_layers None (or absent) means num_layers.
  nlohmann::json j = hf;
  const std::string dec = args.name(&T5Config::num_decoder_layers);
  if ((!j.contains(dec) || j[dec].is_null()) && j.contains(args.name(&T5Config::num_layers))) {
    j[dec] = j[args.name(&T5Config::num_layers)];
  }
  const T5Config c = args.from_hf(j, origin, T5Config{});
  check_max_distance(
      c, [&](auto member) { return nlohmann::json(args.name(member)).dump(); },
      [&](const std::string& key, const std::string& what) {
        return InputError(origin + ": " + key + ": " + what);
      });
  // Attributes that are not keys. Those that change the math must describe this model (an
  // equivalent spelling accepted); the rest (dropout_rate: fsdp_train trains without dropout,
  // initializer_factor, eos_token_id, use_cache, n_positions, ...) do not matter for training
  // from the weights.
  if (present("is_encoder_decoder") && hf["is_encoder_decoder"] != true) {
    throw refuse("is_encoder_decoder", "true");
  }
  // HF T5Config derives its DenseReluDense from feed_forward_proj, but a config.json's own
  // dense_act_fn / is_gated_act override that (PretrainedConfig sets every attribute given).
  // gated-gelu's gelu_new is the tanh approximation, which HF also spells gelu_pytorch_tanh.
  const bool gated = c.feed_forward_proj == T5FeedForward::gated_gelu;
  using Names = std::vector<nlohmann::json>;
  const Names acts = gated ? Names{"gelu_new", "gelu_pytorch_tanh"} : Names{"relu"};
  const std::string with = " with \"" + args.name(feed_forward_get) + "\" \"" +
                           to_string(c.feed_forward_proj) + "\"";
  if (present("dense_act_fn") &&
      std::find(acts.begin(), acts.end(), hf["dense_act_fn"]) == acts.end()) {
    std::string names;
    for (const auto& a : acts) names += (names.empty() ? "" : " or ") + a.dump();
    throw refuse("dense_act_fn", names + with);
  }
  if (present("is_gated_act") && hf["is_gated_act"] != gated) {
    throw refuse("is_gated_act", (gated ? "true" : "false") + with);
  }
  // Decoder inputs are the labels shifted right with pad 0 (t5_shift_right).
  for (const char* f : {"pad_token_id", "decoder_start_token_id"}) {
    if (present(f) && hf[f] != 0) throw refuse(f, "0, the pad id");
  }
  return c;
}

namespace {

class T5Family final : public ModelFamily {
 public:
  std::string type() const override { return "t5"; }
  std::vector<ModelKey> keys() const override { return t5_args().keys(); }
  std::string hf_config_class() const override { return "T5Config"; }
  std::vector<std::string> wrap_classes() const override { return {"T5Block"}; }
  std::vector<Objective> objectives() const override {
    return {Objective::seq2seq, Objective::span_corruption};
  }
  // The ranges and choices are the rows'; what is left relates keys, or is what the data
  // needs of the vocabulary.
  void validate(const Config& c, const KeyFail& fail) const override {
    const T5Config t = T5Config::from(c.model);
    const auto& a = t5_args();
    if (t.vocab_size < kByT5MinVocab) {
      throw fail(a.key(&T5Config::vocab_size),
                 std::to_string(t.vocab_size) + " is out of range (expected >= " +
                     std::to_string(kByT5MinVocab) + ": pad, eos, unk and 256 bytes, as ByT5)");
    }
    check_max_distance(t, [&](auto member) { return a.key(member); }, fail);
    if (c.model.fused_linear_cross_entropy) {
      throw fail("model.fused_linear_cross_entropy",
                 "true is not supported for model.type = \"t5\" (only the causal LMs, gpt2 and "
                 "llama, chunk their LM head)");
    }
    check_recompute_num_layers(c, t.num_layers + t.num_decoder_layers, fail);
    check_router_bias_update(c, false, fail);
  }
  std::vector<ModuleDecl> modules(const ModelConfig& c) const override {
    return t5_modules(T5Config::from(c));
  }
  std::unique_ptr<Model> create(const ModelConfig& c, Kernels& kernels, DType act,
                                ActivationCheckpointing checkpointing) const override {
    return std::make_unique<T5Model>(T5Config::from(c), kernels, act, checkpointing);
  }
  int64_t activation_bytes(const ModelConfig& c, int64_t rows, const data::BatchShape& shape,
                           DType act, ActivationCheckpointing checkpointing) const override {
    return T5Model::activation_bytes(T5Config::from(c), rows, shape, act, checkpointing);
  }
  int64_t vocab_size(const ModelConfig& c) const override { return T5Config::from(c).vocab_size; }
  // Encoder tokens (shape.L) pass through the encoder blocks and the decoder's cross-attention
  // k and v; target tokens (shape.target_len) through the decoder's self-attention q k v o,
  // cross-attention q and o, feed-forwards and the LM head. Inner width I = num_heads x d_kv;
  // feed-forward: wi + wo (relu) or wi_0 + wi_1 + wo (gated-gelu). The LM head counts the
  // model's own vocabulary (model.pad_vocab_multiple's padding rows are not model FLOPs).
  double train_flops_per_sample(const ModelConfig& c, const data::BatchShape& shape) const override {
    const T5Config t = T5Config::from(c);
    const double Ti = static_cast<double>(shape.L), Tt = static_cast<double>(shape.target_len);
    const double D = static_cast<double>(t.d_model), F = static_cast<double>(t.d_ff),
                 I = static_cast<double>(t.num_heads * t.d_kv), V = static_cast<double>(t.vocab_size);
    const double Le = static_cast<double>(t.num_layers), Ld = static_cast<double>(t.num_decoder_layers);
    const double ff = (t.feed_forward_proj == T5FeedForward::gated_gelu ? 3.0 : 2.0) * F * D;
    const double enc = Ti * Le * (4.0 * I * D + ff) + Le * 2.0 * Ti * Ti * I;
    const double dec = Ld * (Tt * (6.0 * I * D + ff) + Ti * 2.0 * I * D) +
                       Ld * (2.0 * Tt * Tt * I + 2.0 * Tt * Ti * I);
    return 6.0 * (enc + dec + Tt * V * D);
  }
  // Our names are HF's state-dict names and nn.Linear layouts: no renaming, no transpose.
  std::optional<HfTensor> hf_tensor(const ModelConfig& c, const std::string& name,
                                    const std::vector<int64_t>& shape) const override {
    for (const ModuleDecl& m : t5_modules(T5Config::from(c))) {
      for (const ParamSpec& p : m.params) {
        if (p.name == name) return HfTensor{name, shape, false};
      }
    }
    return std::nullopt;
  }
  // shared.weight is also stored as the stacks' embed_tokens (tied aliases in HF state dicts).
  std::vector<std::string> hf_aliases(const std::string& hf_name) const override {
    if (hf_name == "shared.weight") {
      return {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
    }
    return {};
  }
  nlohmann::json hf_config(const ModelConfig& c) const override {
    return t5_hf_config(T5Config::from(c));
  }
  ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& origin) const override {
    ModelConfig c = model_defaults(type());
    t5_args().write(t5_config_from_hf(hf, origin), &c);
    return c;
  }
};

}  // namespace

const ModelFamily& t5_family() {
  static const T5Family family;
  return family;
}

}  // namespace fsdp
