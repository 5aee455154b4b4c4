// fsdp/model/t5.hpp: T5 encoder-decoder with the exact architecture of Hugging Face
// T5ForConditionalGeneration (Raffel et al. 2020, "Exploring the Limits of Transfer Learning
// with a Unified Text-to-Text Transformer"; transformers/models/t5/modeling_t5.py).
//
//  - `shared` token embedding [V, d_model] feeds both stacks (no position embedding).
//  - Encoder and decoder stacks of T5Block. Every sub-layer is pre-norm: T5LayerNorm (RMSNorm:
//    no mean, no bias, eps inside the sqrt), the sub-layer, then a residual add.
//    Self-attention: q, k, v, o Linear without bias, inner = num_heads * d_kv, NO 1/sqrt(d_kv)
//    scaling (Mesh TensorFlow's convention), plus a relative position bias. Encoder
//    self-attention masks padded keys (input id 0); decoder self-attention is causal only (HF's
//    behaviour when decoder_attention_mask is None). Decoder blocks add EncDecAttention (q from
//    the decoder, k/v from the encoder's final normed output, padded encoder keys masked, no
//    position bias). Feed-forward: relu (T5 v1.0: wo(relu(wi x))) or gated-gelu (T5 v1.1:
//    wo(gelu_new(wi_0 x) * wi_1 x), gelu_new = tanh approximation).
//  - Relative position bias: block 0 of each stack owns relative_attention_bias [NB, H] and
//    computes the bias once, by relative position: fp32 [H, 2T - 1], bias[h, j - i + T - 1] =
//    table[bucket(j - i), h] (kernels.hpp relative_positions; HF's [1, H, T, T] position_bias
//    holds the same value along each diagonal). Later blocks reuse that activation (HF passes
//    position_bias along), so the bias gradient of every block is summed and turned into
//    block 0's table gradient in block 0's backward.
//  - final_layer_norm on each stack. LM head: tied -> logits = (x * d_model^-0.5) @ shared^T;
//    untied -> logits = x @ lm_head.weight^T (no scaling). Dropout is always off.
//  - Decoder input: labels shifted right with decoder_start_token_id = pad = 0, kIgnoreIndex
//    replaced by pad (HF T5PreTrainedModel._shift_right). Loss: cross-entropy summed over the
//    labels != kIgnoreIndex.
//
// Explicit forward and backward per module, llm.c style, on fsdp::Kernels
// (fsdp/backend/kernels.hpp), no autograd.
// Parameter names are HF's state-dict names; nn.Linear weights are stored [out, in] as HF does.
// HF state dicts also hold encoder.embed_tokens.weight and decoder.embed_tokens.weight, aliases
// of shared.weight: a merge writes only shared.weight (HF re-ties them on load), and a loader
// may find any of the three names holding the same tensor.
//
// Initialisation: HF T5PreTrainedModel._init_weights with initializer_factor 1: shared and
// untied lm_head N(0, 1); wi, wi_0, wi_1 N(0, d_model^-0.5); wo N(0, d_ff^-0.5);
// q N(0, (d_model*d_kv)^-0.5); k, v N(0, d_model^-0.5); o N(0, (num_heads*d_kv)^-0.5);
// relative_attention_bias N(0, d_model^-0.5); layer norms 1. No AdamW weight decay on layer
// norms and embeddings (shared, relative_attention_bias), as for GPT-2.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

// T5LayerFF's variant (HF T5Config.feed_forward_proj).
enum class T5FeedForward {
  relu,        // "relu": T5 v1.0 DenseReluDense (wi, wo)
  gated_gelu,  // "gated-gelu": T5 v1.1 gated GELU (wi_0, wi_1, wo), gelu_new (tanh GELU)
};
// HF's spelling, which to_string, the parser below and the choices of feed_forward_proj's row
// in src/model/t5_family.cpp (validation, --list-keys, config.json) read.
template <>
struct EnumNames<T5FeedForward> {
  static constexpr EnumName<T5FeedForward> table[] = {{T5FeedForward::relu, "relu"},
                                                      {T5FeedForward::gated_gelu, "gated-gelu"}};
};
// The one parser of feed_forward_proj: HF's spelling, exact and case-sensitive; nullopt for
// anything else.
constexpr std::optional<T5FeedForward> t5_feed_forward_from_string(std::string_view s) {
  return enum_from_name<T5FeedForward>(s);
}

// Hugging Face T5Config fields (same names and meanings), declared once with their ranges,
// docs and config.json defaults in t5_family.cpp's table (fsdp/model/model_args.hpp).
// Defaults: the [model] defaults of type = "t5", a small ByT5-vocabulary T5 v1.0 for CPU runs
// (the ByT5 vocabulary: pad 0, eos 1, unk 2, byte b -> b + 3; HF T5Config's own defaults are
// t5-small's sizes with a 32128 SentencePiece vocabulary).
struct T5Config {
  int64_t vocab_size = 384;
  int64_t d_model = 128;
  int64_t d_kv = 32;                   // per-head width of q, k, v
  int64_t d_ff = 512;
  int64_t num_layers = 2;              // encoder blocks
  int64_t num_decoder_layers = 2;      // decoder blocks
  int64_t num_heads = 4;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  T5FeedForward feed_forward_proj = T5FeedForward::relu;
  bool tie_word_embeddings = true;
  double layer_norm_epsilon = 1e-6;
  // model.pad_vocab_multiple (not a T5Config field): shared and lm_head have padded_vocab()
  // rows in training (ByT5's 384 and t5-small's 32128 are multiples of 128 already).
  int64_t pad_vocab_multiple = kDefaultPadVocabMultiple;
  int64_t padded_vocab() const { return padded_vocab_size(vocab_size, pad_vocab_multiple); }
  // From the [model] section (type "t5"); throws fsdp::Error on a missing key, InputError on
  // an unknown feed_forward_proj.
  static T5Config from(const ModelConfig& config);
  friend bool operator==(const T5Config&, const T5Config&) = default;
};

// What the model itself needs of a T5Config built in code (a parsed config was checked at
// parse time, with the same messages): throws fsdp::InputError
// "model.<key>: <value> is out of range (expected ...)" when a key is outside its row's range
// (every size >= 1, relative_attention_num_buckets >= 4: each half of the bidirectional
// buckets needs an exact and a logarithmic part; layer_norm_epsilon > 0),
// relative_attention_max_distance <= relative_attention_num_buckets / 2 (the log range would
// be empty), or pad_vocab_multiple < 1.
void validate_t5_config(const T5Config& c);

// HF T5Attention._relative_position_bucket for one relative position (key_pos - query_pos),
// computed as HF's torch code does in float32: with n the distance (bidirectional: |rp|, and
// the upper half of the buckets for rp > 0; causal: max(-rp, 0)), max_exact = buckets/2 (of
// the half, when bidirectional), n < max_exact -> n, else
// min(max_exact + trunc(logf(float(n)/max_exact) / float(log(max_distance/max_exact)) *
// (buckets - max_exact)), buckets - 1). Returns a bucket in [0, num_buckets).
int32_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance);
// The bucket of every relative position, as the position_bias kernels take them
// (fsdp/backend/kernels.hpp): int32 [relative_positions(query_length, key_length)] =
// [query_length + key_length - 1] (empty when either length is 0), element o =
// bucket(o - (query_length - 1)), the bucket of every (i, j) with j - i = o - query_length + 1,
// as HF's T5Attention.compute_bias (bidirectional for the encoder, causal for the decoder).
std::vector<int32_t> t5_relative_position_buckets(int64_t query_length, int64_t key_length,
                                                  bool bidirectional, int64_t num_buckets,
                                                  int64_t max_distance);

// The decoder input ids HF builds from labels ([B, T] row-major): row b is
// [0, labels[b,0], ..., labels[b,T-2]] with kIgnoreIndex replaced by pad 0
// (T5PreTrainedModel._shift_right with decoder_start_token_id = pad_token_id = 0).
std::vector<int32_t> t5_shift_right(const std::vector<int32_t>& labels, int64_t B, int64_t T);

// Modules in forward order, HF state-dict parameter names, shapes [out, in]:
//   "shared" (class "T5Embedding"): shared.weight [Vp, d_model] (Vp = padded_vocab(),
//     vocab_rows = V: the pad rows are zero and outside the softmax);
//   "encoder.block.{i}" (class "T5Block"): encoder.block.i.layer.0.SelfAttention.{q,k,v}.weight
//     [H*d_kv, d_model], .o.weight [d_model, H*d_kv], block 0 only:
//     encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight [NB, H];
//     layer.0.layer_norm.weight [d_model]; layer.1.DenseReluDense.{wi | wi_0, wi_1}.weight
//     [d_ff, d_model], .wo.weight [d_model, d_ff]; layer.1.layer_norm.weight [d_model];
//   "encoder.final_layer_norm" (class "T5LayerNorm"): encoder.final_layer_norm.weight;
//   "decoder.block.{i}" (class "T5Block"): layer.0.SelfAttention (as the encoder's, with the
//     relative_attention_bias in block 0), layer.0.layer_norm, layer.1.EncDecAttention.{q,k,v,o}
//     .weight, layer.1.layer_norm.weight, layer.2.DenseReluDense.*, layer.2.layer_norm.weight;
//   "decoder.final_layer_norm" (class "T5LayerNorm"); with the tied head it also computes the
//     logits from shared.weight (root unit);
//   "lm_head" (class "T5LMHead", untied only): lm_head.weight [Vp, d_model] (vocab_rows = V).
// Throws as validate_t5_config.
std::vector<ModuleDecl> t5_modules(const T5Config& c);

// A Hugging Face config.json for this model that T5ForConditionalGeneration.from_pretrained
// accepts: the T5Config fields above (the table's rows; feed_forward_proj "relu" |
// "gated-gelu") and the constants architectures ["T5ForConditionalGeneration"], model_type
// "t5", dropout_rate 0, initializer_factor 1, is_encoder_decoder true, pad_token_id 0,
// eos_token_id 1, decoder_start_token_id 0, torch_dtype "float32".
nlohmann::json t5_hf_config(const T5Config& c);

// Reads a Hugging Face T5Config JSON object (config.json). Required: vocab_size, d_model, d_kv,
// d_ff, num_layers, num_heads (integers). Optional, with HF's defaults: num_decoder_layers
// (missing or null: num_layers), relative_attention_num_buckets (32),
// relative_attention_max_distance (128), feed_forward_proj ("relu"; "relu" or "gated-gelu"),
// tie_word_embeddings (true), layer_norm_epsilon (1e-6). Attributes that are not keys:
// dropout_rate and initializer_factor are ignored (training runs without dropout; the
// initialisation uses factor 1); those that change the math must describe this model.
// Throws fsdp::InputError "<origin>: \"<field>\" ..." when a required field is missing, a
// field has the wrong JSON type, a key is outside its range or choices (the TOML config's
// wording after the field) or relative_attention_max_distance <= relative_attention_num_buckets
// / 2, or a value is unsupported: model_type other than "t5", is_encoder_decoder false,
// dense_act_fn or is_gated_act other than feed_forward_proj's (relu: "relu", false;
// gated-gelu: "gelu_new" or its equal "gelu_pytorch_tanh", true), pad_token_id or
// decoder_start_token_id other than 0.
T5Config t5_config_from_hf(const nlohmann::json& j, const std::string& origin);

// The "t5" entry of the model registry (fsdp/model/model.hpp); src/model/t5_family.cpp.
const ModelFamily& t5_family();

class T5Model final : public Model {
 public:
  // activation_dtype: storage of activations and their gradients (the mixed-precision
  // param_dtype); RMSNorm statistics, the position bias and its gradient stay fp32.
  // activation_checkpointing (Accelerate's fsdp_activation_checkpointing, per T5Block; every
  // block or the first N, the encoder's then the decoder's): forward keeps only a recomputing
  // block's input (the residual streams); its internals live in ONE set of buffers shared
  // with the other recomputing blocks and the block after them (sized for the largest of
  // them, field by field) and are recomputed inside the block's backward after the engine's
  // pre_backward has gathered its parameters. Same kernels on the same inputs: results are
  // bit-identical to activation_checkpointing = false.
  // Throws as validate_t5_config.
  T5Model(const T5Config& config, Kernels& kernels, DType activation_dtype = DType::f32,
          ActivationCheckpointing activation_checkpointing = {});
  ~T5Model() override;
  T5Model(const T5Model&) = delete;
  T5Model& operator=(const T5Model&) = delete;

  const T5Config& config() const { return cfg_; }
  // t5_modules(config()).
  const std::vector<ModuleDecl>& modules() const override { return modules_; }

  // One training micro-batch. batch.inputs [B, L]: encoder ids in [0, V), 0 = pad (masked as a
  // key in encoder self-attention and cross-attention); batch.targets [B, target_len]: labels in
  // [0, V) or kIgnoreIndex. loss[0] (fp64 [1] device scalar) += SUM of the cross-entropy (nats)
  // over the labels != kIgnoreIndex; gradients accumulate into hooks.grad() scaled by
  // grad_scale. Throws fsdp::Error on sizes that do not match B, L, target_len or ids out of
  // range.
  void forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                        const TensorView& loss) override;
  // Forward and loss only (evaluation): loss[0] += the summed cross-entropy.
  void forward_loss(const data::Batch& batch, ModuleHooks& hooks, const TensorView& loss) override;

  // Bytes of activations (saved for backward, their gradients and the backward scratch,
  // MemCategory::activations) for a micro-batch of B rows of `shape` (L encoder tokens,
  // target_len decoder tokens) stored in `activation_dtype`, with or without activation
  // checkpointing: exactly what forward allocates (one table serves both).
  static int64_t activation_bytes(const T5Config& config, int64_t B, const data::BatchShape& shape,
                                  DType activation_dtype,
                                  ActivationCheckpointing activation_checkpointing = {});

 private:
  struct Acts;
  struct Ids;
  void ensure_buffers(int64_t B, int64_t Te, int64_t Td);
  void forward(const data::Batch& batch, ModuleHooks& hooks, bool with_backward, float grad_scale,
               const TensorView& loss);
  void backward(int64_t B, int64_t Te, int64_t Td, ModuleHooks& hooks);
  // Block l's forward kernels (no hooks), from its input residual stream to its saved internals
  // and, when write_output, the next residual stream. recompute: activation checkpointing's
  // recompute in backward (block 0 then reuses the position bias it computed in forward).
  void encoder_block_forward(int64_t l, int64_t B, int64_t Te, ModuleHooks& hooks,
                             bool write_output, bool recompute);
  void decoder_block_forward(int64_t l, int64_t B, int64_t Te, int64_t Td, ModuleHooks& hooks,
                             bool write_output, bool recompute);
  void encoder_block_backward(int64_t l, int64_t B, int64_t Te, ModuleHooks& hooks);
  void decoder_block_backward(int64_t l, int64_t B, int64_t Te, int64_t Td, ModuleHooks& hooks);

  T5Config cfg_;
  Kernels& be_;
  DeviceRuntime& rt_;  // be_.runtime(): activation buffers, input copies, zero fills
  DType act_dtype_;
  ActivationCheckpointing checkpointing_;
  std::vector<ModuleDecl> modules_;
  std::unique_ptr<Ids> ids_;
  std::unique_ptr<Acts> acts_;
};

}  // namespace fsdp
