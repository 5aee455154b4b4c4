// The "t5" model family (registry entry; see fsdp/model/model.hpp and fsdp/model/t5.hpp).
#include <sstream>

#include "fsdp/core/error.hpp"
#include "fsdp/model/t5.hpp"

namespace fsdp {
namespace {

T5Config t5_config_of(const ModelConfig& c) {
  T5Config t;
  t.vocab_size = c.integer("vocab_size");
  t.d_model = c.integer("d_model");
  t.d_kv = c.integer("d_kv");
  t.d_ff = c.integer("d_ff");
  t.num_layers = c.integer("num_layers");
  t.num_decoder_layers = c.integer("num_decoder_layers");
  t.num_heads = c.integer("num_heads");
  t.relative_attention_num_buckets = c.integer("relative_attention_num_buckets");
  t.relative_attention_max_distance = c.integer("relative_attention_max_distance");
  // Validation has rejected an unknown value of a parsed config (naming its origin); this
  // parses the same way, with the same message, for a ModelConfig built in code.
  t.feed_forward_proj = parse_t5_feed_forward(c.string("feed_forward_proj"), "model.feed_forward_proj");
  t.tie_word_embeddings = c.boolean("tie_word_embeddings");
  t.layer_norm_epsilon = c.number("layer_norm_epsilon");
  t.pad_vocab_multiple = c.pad_vocab_multiple;
  return t;
}

class T5Family final : public ModelFamily {
 public:
  std::string type() const override { return "t5"; }
  // Defaults: a small ByT5-vocabulary T5 v1.0 for CPU runs (HF T5Config's names; its own
  // defaults are t5-small's sizes with a 32128 SentencePiece vocabulary).
  std::vector<ModelKey> keys() const override {
    return {{"d_model", int64_t{128}, "Hidden size."},
            {"d_kv", int64_t{32},
             "Width of one attention head (need not be `d_model / num_heads`)."},
            {"d_ff", int64_t{512}, "Feed-forward width."},
            {"num_layers", int64_t{2}, "Encoder blocks."},
            {"num_decoder_layers", int64_t{2}, "Decoder blocks."},
            {"num_heads", int64_t{4}, "Attention heads."},
            {"relative_attention_num_buckets", int64_t{32}, "Relative position buckets."},
            {"relative_attention_max_distance", int64_t{128},
             "Distance beyond which positions share the last bucket."},
            {"feed_forward_proj", std::string("relu"), "Feed-forward block."},
            {"tie_word_embeddings", true, "Whether the LM head is the shared embedding."},
            {"layer_norm_epsilon", 1e-6, "T5LayerNorm epsilon."},
            {"vocab_size", int64_t{384},
             "Vocabulary (ByT5: 3 specials + 256 bytes + 125 sentinel ids)."}};
  }
  std::string hf_config_class() const override { return "T5Config"; }
  std::vector<std::string> wrap_classes() const override { return {"T5Block"}; }
  std::vector<Objective> objectives() const override {
    return {Objective::seq2seq, Objective::span_corruption};
  }
  void validate(const Config& c, const KeyFail& fail) const override {
    const ModelConfig& m = c.model;
    if (const std::string& ff = m.string("feed_forward_proj"); !t5_feed_forward_from_string(ff)) {
      throw fail("model.feed_forward_proj", t5_feed_forward_unknown(ff));
    }
    for (const char* key : {"d_model", "d_kv", "d_ff", "num_layers", "num_decoder_layers",
                            "num_heads"}) {
      require_at_least(fail, std::string("model.") + key, m.integer(key), 1);
    }
    // ByT5's byte vocabulary: 3 special ids and 256 bytes at least.
    if (m.integer("vocab_size") < 259) {
      throw fail("model.vocab_size", std::to_string(m.integer("vocab_size")) +
                                         " is out of range (expected >= 259: pad, eos, unk and "
                                         "256 bytes, as ByT5)");
    }
    const int64_t nb = m.integer("relative_attention_num_buckets");
    require_at_least(fail, "model.relative_attention_num_buckets", nb, 4);
    const int64_t md = m.integer("relative_attention_max_distance");
    if (md <= nb / 2) {
      throw fail("model.relative_attention_max_distance",
                 std::to_string(md) + " is out of range (expected > relative_attention_num_buckets"
                                      " / 2 = " + std::to_string(nb / 2) + ")");
    }
    if (!(m.number("layer_norm_epsilon") > 0)) {
      std::ostringstream os;
      os << m.number("layer_norm_epsilon");
      throw fail("model.layer_norm_epsilon", os.str() + " is out of range (expected > 0)");
    }
  }
  std::vector<ModuleDecl> modules(const ModelConfig& c) const override {
    return t5_modules(t5_config_of(c));
  }
  std::unique_ptr<Model> create(const ModelConfig& c, Kernels& kernels, DType act,
                                bool checkpointing) const override {
    return std::make_unique<T5Model>(t5_config_of(c), kernels, act, checkpointing);
  }
  int64_t activation_bytes(const ModelConfig& c, int64_t rows, const data::BatchShape& shape,
                           DType act, bool checkpointing) const override {
    return T5Model::activation_bytes(t5_config_of(c), rows, shape, act, checkpointing);
  }
  int64_t vocab_size(const ModelConfig& c) const override { return t5_config_of(c).vocab_size; }
  // Encoder tokens (shape.L) pass through the encoder blocks and the decoder's cross-attention
  // k and v; target tokens (shape.target_len) through the decoder's self-attention q k v o,
  // cross-attention q and o, feed-forwards and the LM head. Inner width I = num_heads x d_kv;
  // feed-forward: wi + wo (relu) or wi_0 + wi_1 + wo (gated-gelu). The LM head counts the
  // model's own vocabulary (model.pad_vocab_multiple's padding rows are not model FLOPs).
  double train_flops_per_sample(const ModelConfig& c, const data::BatchShape& shape) const override {
    const T5Config t = t5_config_of(c);
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
    for (const ModuleDecl& m : t5_modules(t5_config_of(c))) {
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
    return t5_hf_config(t5_config_of(c));
  }
  ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& origin) const override {
    const T5Config t = t5_config_from_hf(hf, origin);
    ModelConfig c = model_defaults("t5");
    c.set("vocab_size", t.vocab_size);
    c.set("d_model", t.d_model);
    c.set("d_kv", t.d_kv);
    c.set("d_ff", t.d_ff);
    c.set("num_layers", t.num_layers);
    c.set("num_decoder_layers", t.num_decoder_layers);
    c.set("num_heads", t.num_heads);
    c.set("relative_attention_num_buckets", t.relative_attention_num_buckets);
    c.set("relative_attention_max_distance", t.relative_attention_max_distance);
    c.set("feed_forward_proj", std::string(to_string(t.feed_forward_proj)));
    c.set("tie_word_embeddings", t.tie_word_embeddings);
    c.set("layer_norm_epsilon", t.layer_norm_epsilon);
    return c;
  }
};

}  // namespace

const ModelFamily& t5_family() {
  static const T5Family family;
  return family;
}

}  // namespace fsdp
