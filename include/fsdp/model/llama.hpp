// fsdp/model/llama.hpp: Llama-family decoder with the exact architecture of Hugging Face
// LlamaForCausalLM (Touvron et al. 2023; transformers/models/llama/modeling_llama.py), the
// architecture of Llama 2/3, TinyLlama, SmolLM and Mistral-style models without a sliding
// window:
//
//  - embed_tokens [V, C] (no position embedding);
//  - num_hidden_layers LlamaDecoderLayer: x + o_proj(attn(RoPE(q_proj(n1)), RoPE(k_proj(n1)),
//    v_proj(n1))), n1 = input_layernorm(x); then h + down_proj(silu(gate_proj(n2)) *
//    up_proj(n2)), n2 = post_attention_layernorm(h). RMSNorm (Zhang & Sennrich 2019) in fp32,
//    then scaled by its weight (HF LlamaRMSNorm). RoPE (Su et al. 2021) in HF's rotate-half
//    layout on q and k, optionally with Llama 3.1's "llama3" frequency scaling; grouped-query
//    attention (Ainslie et al. 2023): num_key_value_heads K/V heads, each shared by
//    num_attention_heads / num_key_value_heads query heads (HF repeat_kv), causal, scaled by
//    1/sqrt(head_dim). Optional biases on q/k/v/o (attention_bias) and the MLP (mlp_bias);
//  - final `norm` (RMSNorm) and lm_head [V, C], or the embedding when tie_word_embeddings.
//
// Parameter and module names are HF's state-dict and module names ("model.layers.3.mlp.
// up_proj.weight", module "model.layers.3"): merges and init_from need no renaming, and
// nn.Linear's [out, in] layout is ours. FSDP units: one per LlamaDecoderLayer (the wrap
// class); embed_tokens, norm and lm_head in the root unit. The vocabulary is padded to
// model.pad_vocab_multiple rows as for GPT-2 (fsdp/model/gpt2.hpp). Initialisation is HF
// LlamaPreTrainedModel._init_weights: Linear and Embedding N(0, initializer_range), biases 0,
// RMSNorm weights 1 (pad rows 0). AdamW decays the Linear weights only (not the norms, biases
// or embedding), as fsdp_train's GPT-2 and T5.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/fsdp/module.hpp"
#include "fsdp/model/causal_lm.hpp"
#include "fsdp/model/model.hpp"

namespace fsdp {

// Hugging Face LlamaConfig's fields ([model] with type = "llama"; same names, meanings and,
// where HF has them, defaults; sizes default to a small CPU model). The [model] key table,
// with docs and ranges, is llama_args() in src/model/llama.cpp.
struct LlamaConfig {
  enum class RopeType { default_, llama3 };

  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 344;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;   // 0 = num_attention_heads (HF's None: MHA)
  int64_t head_dim = 0;              // 0 = hidden_size / num_attention_heads (HF's None)
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // rope_scaling: HF's dict, here its fields; default_ = no scaling (rope_scaling null).
  RopeType rope_type = RopeType::default_;
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  bool attention_bias = false;
  bool mlp_bias = false;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  int64_t pad_vocab_multiple = kDefaultPadVocabMultiple;
  // model.fused_linear_cross_entropy[_chunk_rows] (not LlamaConfig keys): the chunked LM head.
  FusedLinearCrossEntropy fused_lce;

  int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  int64_t padded_vocab() const { return padded_vocab_size(vocab_size, pad_vocab_multiple); }
  // From the [model] section (type "llama"); throws fsdp::Error on a missing key.
  static LlamaConfig from(const ModelConfig& config);
};

// rope_scaling.rope_type's spellings: HF's rope_type names.
template <>
struct EnumNames<LlamaConfig::RopeType> {
  static constexpr EnumName<LlamaConfig::RopeType> table[] = {
      {LlamaConfig::RopeType::default_, "default"}, {LlamaConfig::RopeType::llama3, "llama3"}};
};

// The D/2 RoPE inverse frequencies (radians per position) of `c`, in float64: HF's
// rope_init_fn, 1 / rope_theta^(2i/D), then for rope_type llama3 Llama 3.1's scaling
// (transformers' _compute_llama3_parameters: wavelengths above original/low_freq_factor
// divided by factor, below original/high_freq_factor kept, smoothly interpolated between).
std::vector<double> llama_inv_freq(const LlamaConfig& c);

// The "llama" entry of the model registry (fsdp/model/model.hpp).
const ModelFamily& llama_family();

// Modules in forward order: "model.embed_tokens" (class "Embedding": embed_tokens.weight
// [Vp,C]), "model.layers.{l}" (class "LlamaDecoderLayer"), "model.norm" (class
// "LlamaRMSNorm"), and "lm_head" (class "Linear", lm_head.weight [Vp,C]) unless tied.
std::vector<ModuleDecl> llama_modules(const LlamaConfig& config);

class LlamaModel final : public CausalLm {
 public:
  // activation_dtype: storage of activations and their gradients (the mixed-precision
  // param_dtype); RMSNorm statistics, attention's logsumexp and the RoPE tables stay fp32.
  // activation_checkpointing: as Gpt2Model (one shared set of per-layer buffers, recomputed in
  // each layer's backward; bit-identical results).
  LlamaModel(const LlamaConfig& config, Kernels& kernels, DType activation_dtype = DType::f32,
             bool activation_checkpointing = false);
  ~LlamaModel() override;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const std::vector<ModuleDecl>& modules() const override { return modules_; }
  // Throws fsdp::Error under model.fused_linear_cross_entropy.
  TensorView last_logits() const override;

  // Bytes of activations (saved for backward, their gradients, scratch, the RoPE tables) for a
  // [B,T] micro-batch; exactly what forward allocates (the logits [B*T, Vp], or one chunk of
  // them under config.fused_lce).
  static int64_t activation_bytes(const LlamaConfig& config, int64_t B, int64_t T,
                                  DType activation_dtype, bool activation_checkpointing = false);

 private:
  struct Acts;
  const char* family_name() const override { return "Llama"; }
  void ensure_buffers(int64_t B, int64_t T);
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               ModuleHooks& hooks, bool backward, float grad_scale, const TensorView& loss) override;
  void backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                const TensorView& loss) override;
  void layer_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks, bool write_output);
  // The chunked LM head's views for BT rows (model.fused_linear_cross_entropy).
  LmHeadChunks head_chunks(int64_t BT, const TensorView& weight) const;

  LlamaConfig cfg_;
  Kernels& be_;
  DeviceRuntime& rt_;
  DType act_dtype_;
  bool checkpointing_;
  std::vector<ModuleDecl> modules_;
  std::unique_ptr<Acts> acts_;
  int64_t last_rows_ = 0;
};

}  // namespace fsdp
