// Llama forward and backward on fsdp::Kernels, and the "llama" model family (see
// fsdp/model/llama.hpp). Shapes: B batch, T sequence, C = hidden_size, H query heads,
// Hkv key/value heads, D = head_dim, Q = H*D, KV = Hkv*D, I = intermediate_size,
// Vp = padded vocabulary, BT = B*T rows.
#include "fsdp/model/llama.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/backend/buffer.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/model/model_args.hpp"

namespace fsdp {
namespace {

// Every Llama-family class, in LlamaArch order (model.type is EnumNames<LlamaArch>): HF's
// class-name prefix (<prefix>DecoderLayer, <prefix>RMSNorm, <prefix>ForCausalLM), config
// class and, where a published multimodal model wraps this decoder, that model's model_type
// (Gemma3ForConditionalGeneration: Gemma 3 4B-27B; Mistral3ForConditionalGeneration: Mistral
// Small 3.1 and 3.2): its config.json holds the decoder's as text_config and its files the
// decoder's tensors under "language_model.model." (transformers 4.5x, the Hub's) or
// "model.language_model." (transformers 5); and a causal LM class not named <prefix>ForCausalLM
// (Llama 4's decoder classes are Llama4Text*, its causal LM Llama4ForCausalLM). The one list the
// prefix, the key tables, the families and the registry are made from.
struct ArchNames {
  LlamaArch arch;
  const char* prefix;
  const char* config_class;
  const char* multimodal = nullptr;
  const char* causal_lm = nullptr;  // nullptr: <prefix>ForCausalLM
};
constexpr ArchNames kArchNames[] = {
    {LlamaArch::llama, "Llama", "LlamaConfig"},
    {LlamaArch::mistral, "Mistral", "MistralConfig", "mistral3"},
    {LlamaArch::qwen2, "Qwen2", "Qwen2Config"},
    {LlamaArch::qwen3, "Qwen3", "Qwen3Config"},
    {LlamaArch::olmo2, "Olmo2", "Olmo2Config"},
    {LlamaArch::phi3, "Phi3", "Phi3Config"},
    {LlamaArch::gemma3_text, "Gemma3", "Gemma3TextConfig", "gemma3"},
    {LlamaArch::smollm3, "SmolLM3", "SmolLM3Config"},
    {LlamaArch::granite, "Granite", "GraniteConfig"},
    {LlamaArch::olmo3, "Olmo3", "Olmo3Config"},
    {LlamaArch::gemma2, "Gemma2", "Gemma2Config"},
    {LlamaArch::gemma, "Gemma", "GemmaConfig"},
    {LlamaArch::exaone4, "Exaone4", "Exaone4Config"},
    {LlamaArch::qwen3_moe, "Qwen3Moe", "Qwen3MoeConfig"},
    {LlamaArch::mixtral, "Mixtral", "MixtralConfig"},
    {LlamaArch::olmoe, "Olmoe", "OlmoeConfig"},
    {LlamaArch::qwen2_moe, "Qwen2Moe", "Qwen2MoeConfig"},
    {LlamaArch::glm4_moe, "Glm4Moe", "Glm4MoeConfig"},
    {LlamaArch::deepseek_v3, "DeepseekV3", "DeepseekV3Config"},
    {LlamaArch::deepseek_v2, "DeepseekV2", "DeepseekV2Config"},
    {LlamaArch::gpt_oss, "GptOss", "GptOssConfig"},
    {LlamaArch::llama4_text, "Llama4Text", "Llama4TextConfig", "llama4", "Llama4ForCausalLM"},
    {LlamaArch::qwen3_5_text, "Qwen3_5", "Qwen3_5TextConfig", "qwen3_5"},
    {LlamaArch::qwen3_5_moe_text, "Qwen3_5Moe", "Qwen3_5MoeTextConfig", "qwen3_5_moe"},
};
constexpr bool arch_names_in_enum_order() {
  if (std::size(kArchNames) != std::size(EnumNames<LlamaArch>::table)) return false;
  for (std::size_t i = 0; i < std::size(kArchNames); ++i) {
    if (kArchNames[i].arch != EnumNames<LlamaArch>::table[i].value ||
        static_cast<std::size_t>(kArchNames[i].arch) != i) {
      return false;
    }
  }
  return true;
}
static_assert(arch_names_in_enum_order(), "kArchNames: one row per LlamaArch, in its order");
const ArchNames& arch_names(LlamaArch arch) { return kArchNames[static_cast<int>(arch)]; }

// Whether `arch`'s config spells "no sliding window" as a null sliding_window (fsdp_train's
// 0): MistralConfig, Phi3Config, SmolLM3Config, Exaone4Config, MixtralConfig.
bool window_may_be_null(LlamaArch arch) {
  return arch == LlamaArch::mistral || arch == LlamaArch::phi3 || arch == LlamaArch::smollm3 ||
         arch == LlamaArch::exaone4 || arch == LlamaArch::mixtral;
}

// Whether `arch`'s config has head_dim (Qwen2Config, Olmo2Config and Phi3Config do not: their
// heads are hidden_size / num_attention_heads wide).
bool has_head_dim_key(LlamaArch arch) {
  return arch != LlamaArch::qwen2 && arch != LlamaArch::olmo2 && arch != LlamaArch::phi3 &&
         arch != LlamaArch::smollm3 && arch != LlamaArch::granite && arch != LlamaArch::olmo3 &&
         arch != LlamaArch::olmoe && arch != LlamaArch::qwen2_moe &&
         arch != LlamaArch::deepseek_v3 &&
         arch != LlamaArch::deepseek_v2;  // (MLA's heads: qk_nope_head_dim + qk_rope_head_dim)
}

// The [model] key table of each Llama-family type: the only place one of their keys is
// spelled. The rows are HF's config attributes of that class (LlamaConfig, MistralConfig,
// Qwen2Config, Qwen3Config, Olmo2Config, Phi3Config), with the class's own default for an
// attribute a config.json leaves out.
ModelArgs<LlamaConfig> make_llama_args(LlamaArch arch) {
  using A = ModelArg<LlamaConfig>;
  using L = LlamaConfig;
  // Mixtral's attention is Mistral's, Qwen3-MoE's Qwen3's, OLMoE's defaults start from Llama's
  // (each class's own differ below).
  const bool mixtral = arch == LlamaArch::mixtral, olmoe = arch == LlamaArch::olmoe;
  const bool qwen3_moe = arch == LlamaArch::qwen3_moe, qwen2_moe = arch == LlamaArch::qwen2_moe;
  const bool glm = arch == LlamaArch::glm4_moe;  // GLM-4.5's own defaults below
  const bool ds = arch == LlamaArch::deepseek_v3;  // DeepSeek-V3's: its MoE block is GLM-4.5's
  const bool ds2 = arch == LlamaArch::deepseek_v2;  // DeepSeek-V2's: MLA, softmax routing
  const bool mla = ds || ds2, ds_moe = glm || mla;
  const bool oss = arch == LlamaArch::gpt_oss;  // gpt-oss's: its own defaults throughout
  const bool l4 = arch == LlamaArch::llama4_text;  // Llama 4's: its own defaults throughout
  // Qwen3.5's (dense and MoE): their own defaults throughout
  const bool q35moe = arch == LlamaArch::qwen3_5_moe_text;
  const bool q35 = arch == LlamaArch::qwen3_5_text || q35moe;
  const bool moe = mixtral || olmoe || qwen3_moe || qwen2_moe || ds_moe || oss || l4 || q35moe;
  const bool llama = arch == LlamaArch::llama || olmoe;
  const bool mistral = arch == LlamaArch::mistral || mixtral;
  const bool qwen = arch == LlamaArch::qwen2 || arch == LlamaArch::qwen3 || qwen3_moe || qwen2_moe;
  // OLMo 3's config is OLMo 2's (Olmo3Config derives Olmo2Config) plus its window.
  const bool olmo3 = arch == LlamaArch::olmo3;
  const bool olmo2 = arch == LlamaArch::olmo2 || olmo3, phi3 = arch == LlamaArch::phi3;
  const bool gemma3 = arch == LlamaArch::gemma3_text, gemma2 = arch == LlamaArch::gemma2;
  const bool gemma1 = arch == LlamaArch::gemma, gemma23 = gemma2 || gemma3;
  const bool gemma = gemma1 || gemma23, smol = arch == LlamaArch::smollm3;
  const bool granite = arch == LlamaArch::granite, exaone = arch == LlamaArch::exaone4;
  // HF's defaults by class: llama (and olmo2 unless given), mistral, qwen2/qwen3, phi3, gemma3
  // (and gemma2 where they agree); SmolLM3's, Gemma 2's and Gemma 1's where they differ, below
  // (GemmaConfig: Gemma 7B's shape).
  auto by = [&](auto l, auto m, auto q, auto p, auto g) {
    return llama || olmo2 || granite ? l : mistral ? m : phi3 ? p : gemma ? g : q;
  };
  static const std::vector<std::string> layers_docs = [] {
    std::vector<std::string> docs;
    for (const ArchNames& a : kArchNames) {
      docs.push_back(std::string("Number of ") + a.prefix + "DecoderLayer blocks.");
    }
    return docs;
  }();
  const char* layers_doc = layers_docs[static_cast<std::size_t>(arch)].c_str();
  using I64 = int64_t;
  std::vector<A> rows = {
      A{"vocab_size", &L::vocab_size, "Token vocabulary.", KeyRange::size(1), {}, true,
        olmo2 || olmoe ? I64{50304}
        : q35    ? I64{248320}
        : oss    ? I64{201088}
        : l4     ? I64{202048}
        : glm    ? I64{151552}
        : ds     ? I64{129280}
        : ds2    ? I64{32000}
        : smol   ? I64{128256}
        : exaone ? I64{102400}
        : gemma2 || gemma1 ? I64{256000}
                           : by(I64{32000}, I64{32000}, I64{151936}, I64{32064}, I64{262208})},
      A{"hidden_size", &L::hidden_size, "Hidden size.", KeyRange::size(1), {}, true,
        smol || olmoe || qwen3_moe || qwen2_moe ? I64{2048}
        : oss    ? I64{2880}
        : l4     ? I64{5120}
        : q35moe ? I64{2048}
        : glm || q35 ? I64{4096}
        : ds     ? I64{7168}
        : ds2    ? I64{4096}
        : gemma1 ? I64{3072}
                 : by(I64{4096}, I64{4096}, I64{4096}, I64{3072}, I64{2304})},
      A{"intermediate_size", &L::intermediate_size,
        gemma       ? "Width of the GeGLU MLP."
        : qwen3_moe || qwen2_moe || q35moe ? "Width of a dense MLP (mlp_only_layers: none here, "
                                             "every layer is sparse; unused)."
        : ds_moe    ? "Width of the dense layers' SwiGLU MLP (the first first_k_dense_replace)."
        : oss       ? "Width of each expert's clamped SwiGLU MLP (gate_up_proj: 2x it)."
        : l4        ? "Width of each expert's and the shared expert's SwiGLU MLP."
        : moe       ? "Width of each expert's SwiGLU MLP."
                    : "Width of the SwiGLU MLP.",
        KeyRange::size(1), {}, !q35moe,  // (Qwen3_5MoeTextConfig has no intermediate_size)
        gemma1      ? I64{24576}
        : q35       ? I64{12288}
        : oss       ? I64{2880}
        : l4        ? I64{8192}
        : exaone    ? I64{16384}
        : qwen3_moe ? I64{6144}
        : qwen2_moe ? I64{5632}
        : glm       ? I64{10944}
        : ds        ? I64{18432}
        : ds2       ? I64{11008}
        : olmoe     ? I64{2048}
                 : by(I64{11008}, I64{14336}, I64{22016}, I64{8192}, I64{9216})},
      A{"num_hidden_layers", &L::num_hidden_layers, layers_doc, KeyRange::layers(), {},
        true, gemma1 ? I64{28} : gemma ? I64{26} : smol ? I64{36} : qwen3_moe || qwen2_moe ? I64{24}
              : q35moe ? I64{40}
              : olmoe ? I64{16} : glm ? I64{46} : ds ? I64{61} : oss ? I64{36}
              : l4 ? I64{48} : I64{32}},
      A{"num_attention_heads", &L::num_attention_heads, "Query heads per layer.", KeyRange::size(1), {},
        true, gemma1 ? I64{16} : gemma ? I64{8} : smol || olmoe || qwen2_moe || q35 ? I64{16}
              : glm ? I64{96} : ds ? I64{128} : oss ? I64{64} : l4 ? I64{40} : I64{32}},
      // HF's absent num_key_value_heads: Llama's and Phi-3's None (MHA), Mistral's 8, Qwen's 32,
      // Gemma 2's and 3's 4, Gemma 1's 16 (MHA).
      A{"num_key_value_heads", &L::num_key_value_heads,
        "Key/value heads (grouped-query attention); 0 = num_attention_heads (MHA), 1 = MQA.",
        KeyRange::size(0), {}, true,
        q35moe                   ? I64{2}
        : smol || qwen3_moe || q35 ? I64{4}
        : gemma1 || qwen2_moe ? I64{16}
        : glm || oss || l4    ? I64{8}
        : ds                  ? I64{128}
        : ds2                 ? I64{0}
                 : by(I64{0}, I64{8}, I64{32}, I64{0}, I64{4})},
  };
  if (has_head_dim_key(arch)) {
    rows.push_back(A{"head_dim", &L::head_dim, "Width of one attention head; 0 = hidden_size / "
                     "num_attention_heads.", KeyRange::size(0), {}, true,
                     arch == LlamaArch::qwen3 || l4 ? I64{128} : gemma || q35 ? I64{256}
                     : oss ? I64{64} : I64{0}});
  }
  rows.insert(rows.end(), {
      A{"max_position_embeddings", &L::max_position_embeddings,
        "Longest sequence the model is trained for.", KeyRange::size(1), {}, true,
        smol               ? I64{32768}
        : exaone           ? I64{2048}
        : olmoe            ? I64{4096}
        : glm || oss || l4 ? I64{131072}
        : ds               ? I64{4096}
        : ds2              ? I64{2048}
        : gemma2 || gemma1 ? I64{8192}
                           : by(I64{2048}, I64{131072}, I64{32768}, I64{4096}, I64{131072})},
      A{"rms_norm_eps", &L::rms_norm_eps, "RMSNorm epsilon.", KeyRange::above(0), {}, true,
        olmo2 || phi3 || exaone || mixtral || olmoe || glm || oss || l4 ? 1e-5 : 1e-6},
      A{"rope_theta", &L::rope_theta,
        gemma3 ? "RoPE base period of the global (full-attention) layers." : "RoPE base period.",
        KeyRange::above(0), {}, true,
        gemma3 || mixtral ? 1e6 : smol ? 2e6 : oss ? 150000.0 : l4 ? 500000.0 : 10000.0},
      A{"rope_scaling.rope_type", enum_member<L, &L::rope_type>(),
        gemma3 ? "RoPE frequency scaling of the global layers: default (none), linear (position "
                 "interpolation), Llama 3.1's llama3 or yarn."
        : phi3 ? "RoPE frequency scaling: default (none) or longrope (Phi-3's LongRoPE)."
        : l4   ? "RoPE frequency scaling: default (none) or Llama 3.1's llama3 (Llama 4's "
                 "rotary embedding reads any rope_scaling as llama3)."
               : "RoPE frequency scaling: default (none), linear (position interpolation), Llama "
                 "3.1's llama3 or yarn.", {},
        phi3 ? std::vector<std::string>{"default", "longrope"}
        : l4 ? std::vector<std::string>{"default", "llama3"}
             : std::vector<std::string>{"default", "linear", "llama3", "yarn"},
        true, std::string(enum_name(oss ? L::RopeType::yarn : L::RopeType::default_))},
      A{"rope_scaling.factor", &L::rope_factor, "linear, llama3, yarn: how much longer than "
        "the original context the model runs.", KeyRange::above(0), {}, true, oss ? 32.0 : 8.0},
      A{"rope_scaling.low_freq_factor", &L::rope_low_freq_factor,
        "llama3: wavelengths above original / low_freq_factor are scaled by 1 / factor.",
        KeyRange::above(0), {}, true, 1.0},
      A{"rope_scaling.high_freq_factor", &L::rope_high_freq_factor,
        "llama3: wavelengths below original / high_freq_factor are kept (>= low_freq_factor; "
        "equal: no band between).", KeyRange::above(0), {},
        true, 4.0},
      A{"rope_scaling.original_max_position_embeddings", &L::rope_original_max_position_embeddings,
        "llama3, yarn: the context length the model was pre-trained with.", KeyRange::size(1), {},
        true, oss ? int64_t{4096} : int64_t{8192}},
      A{"rope_scaling.beta_fast", &L::rope_beta_fast, "yarn: dimensions turning more than "
        "beta_fast times over the original context keep their frequency.", KeyRange::above(0), {},
        true, 32.0},
      A{"rope_scaling.beta_slow", &L::rope_beta_slow, "yarn: dimensions turning fewer than "
        "beta_slow times are interpolated (frequency / factor).", KeyRange::above(0), {}, true, 1.0},
      A{"rope_scaling.attention_factor", &L::rope_attention_factor,
        phi3 ? "longrope: the factor cos and sin are scaled by; 0 = sqrt(1 + ln(s) / "
               "ln(original_max_position_embeddings)), s = max_position_embeddings / "
               "original_max_position_embeddings."
             : "yarn: the factor cos and sin are scaled by; 0 = 0.1 ln(factor) + 1.",
        KeyRange::nonnegative(), {}, true, 0.0},
      A{"rope_scaling.truncate", &L::rope_truncate, "yarn: round the correction range out to "
        "whole dimensions.", {}, {}, true, !oss},
  });
  if (phi3) {  // Phi3Config's LongRoPE and partial rotary embedding
    rows.insert(rows.end(), {
        A{"rope_scaling.short_factor", &L::rope_short_factor,
          "longrope: frequency i is divided by short_factor[i] when data.seq_len <= "
          "original_max_position_embeddings (rotary_dim / 2 numbers).", KeyRange::above(0), {},
          true, std::vector<double>{}},
        A{"rope_scaling.long_factor", &L::rope_long_factor,
          "longrope: frequency i is divided by long_factor[i] when data.seq_len > "
          "original_max_position_embeddings (rotary_dim / 2 numbers).", KeyRange::above(0), {},
          true, std::vector<double>{}},
        A{"original_max_position_embeddings", &L::original_max_position_embeddings,
          "longrope: the context length the model was pre-trained with.", KeyRange::size(1), {},
          true, I64{4096}},
    });
  }
  if (mla) {  // DeepseekV3Config's and DeepseekV2Config's yarn attention factors
    rows.insert(rows.end(), {
        A{"rope_scaling.mscale", &L::rope_mscale, "yarn: with mscale_all_dim, cos and sin are "
          "scaled by (0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1); 0 = "
          "none.", KeyRange::nonnegative(), {}, true, 0.0},
        A{"rope_scaling.mscale_all_dim", &L::rope_mscale_all_dim, "yarn (any rope_type but "
          "default; DeepSeek-V3 only): the scores are scaled by (0.1 mscale_all_dim ln(factor) + "
          "1)^2 more; 0 = none.", KeyRange::nonnegative(), {}, true, 0.0},
    });
  }
  if (phi3 || glm || q35) {  // Phi3Config's, Glm4MoeConfig's, Qwen3_5TextConfig's partial RoPE
    rows.push_back(A{"partial_rotary_factor", &L::partial_rotary_factor,
                     "RoPE rotates the first int(head_dim * partial_rotary_factor) columns of "
                     "each q and k head; the rest pass through.", KeyRange::unit_above_zero(),
                     {}, true, glm ? 0.5 : q35 ? 0.25 : 1.0});
  }
  if (gemma3) {
    rows.push_back(A{"rope_local_base_freq", &L::rope_local_base_freq,
                     "RoPE base period of the sliding layers (never scaled).", KeyRange::above(0),
                     {}, true, 10000.0});
  }
  if (llama || arch == LlamaArch::qwen3 || qwen3_moe || olmo2 || gemma || smol || granite ||
      ds_moe || q35) {
    rows.push_back(A{"attention_bias", &L::attention_bias,
                     glm  ? "Biases on q_proj, k_proj and v_proj (o_proj has none)."
                     : mla ? "Biases on q_a_proj, kv_a_proj_with_mqa and o_proj."
                          : "Biases on q_proj, k_proj, v_proj and o_proj.",
                     {}, {}, true, false});
  }
  if (mla) {  // Multi-head Latent Attention
    rows.insert(rows.end(), {
        A{"q_lora_rank", &L::q_lora_rank, "Width of the queries' compression (q_a_proj, "
          "q_a_layernorm, q_b_proj); 0 = none (HF's null: one q_proj).", KeyRange::size(0), {},
          true, I64{1536}},
        A{"kv_lora_rank", &L::kv_lora_rank, "Width of the keys' and values' compression "
          "(kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj).", KeyRange::size(1), {}, true,
          I64{512}},
        A{"qk_nope_head_dim", &L::qk_nope_head_dim, "Columns of each q and k head without "
          "RoPE.", KeyRange::size(1), {}, true, I64{128}},
        A{"qk_rope_head_dim", &L::qk_rope_head_dim, "Columns of each q and k head with RoPE (k's "
          "shared by all heads).", KeyRange::size(2), {}, true, I64{64}},
        A{"v_head_dim", &L::v_head_dim, "Width of each value head.", KeyRange::size(1), {}, true,
          I64{128}},
    });
  }
  if (ds) {  // (DeepSeek-V2 always rotates adjacent pairs: HF's apply_rotary_emb)
    rows.push_back(A{"rope_interleave", &L::rope_interleave, "RoPE rotates adjacent pairs (2i, "
                     "2i + 1) of the rope columns (else the two halves).", {}, {}, true, true});
  }
  if (glm || l4) {
    rows.push_back(A{"use_qk_norm", &L::use_qk_norm,
                     l4 ? "On the RoPE layers, a weightless L2 (RMS) norm over each head of q and "
                          "k after RoPE (Llama4TextL2Norm, eps rms_norm_eps)."
                        : "An RMSNorm over each head of q and k before RoPE (q_norm, k_norm).",
                     {}, {}, true, l4});
  }
  if ((llama && !olmoe) || smol || granite) {
    rows.push_back(A{"mlp_bias", &L::mlp_bias, "Biases on gate_proj, up_proj and down_proj.", {},
                     {}, true, false});
  }
  if (qwen || smol) {
    rows.push_back(A{"use_sliding_window", &L::use_sliding_window,
                     smol ? "Sliding-window attention on the NoPE layers."
                          : "Sliding-window attention on the layers from max_window_layers on.",
                     {}, {}, true, false});
  }
  // Mistral's and Phi-3's 0 is HF's null; Qwen's under the flag; Gemma 2's and 3's on their
  // sliding layers (Gemma 1 has none).
  if (mistral || qwen || phi3 || gemma23 || smol || olmo3 || exaone || oss) {
    rows.push_back(A{"sliding_window", &L::sliding_window,
                     exaone ? "Sliding-window attention span of the sliding layers (positions per "
                              "query, itself included); 0 = none: every layer global and rotated."
                     : mistral || phi3 || smol ? "Sliding-window attention span (positions per "
                                                 "query, itself included); 0 = none."
                     : gemma23 || olmo3 || oss ? "Sliding-window attention span of the sliding "
                                                 "layers (positions per query, itself included)."
                             : "Sliding-window attention span (positions per query, "
                               "itself included) under use_sliding_window.",
                     KeyRange::size(window_may_be_null(arch) ? 0 : 1), {}, true,
                     phi3 || smol || mixtral ? int64_t{0} : oss ? int64_t{128} : int64_t{4096}});
  }
  if (granite) {
    rows.insert(rows.end(), {
        A{"embedding_multiplier", &L::embedding_multiplier,
          "The token embedding's output is multiplied by it.", KeyRange::above(0), {}, true, 1.0},
        A{"residual_multiplier", &L::residual_multiplier,
          "Each sublayer's output is multiplied by it before its residual add.",
          KeyRange::above(0), {}, true, 1.0},
        A{"attention_multiplier", &L::attention_multiplier,
          "The attention scores' scale (instead of 1 / sqrt(head_dim)).", KeyRange::above(0), {},
          true, 1.0},
        A{"logits_scaling", &L::logits_scaling, "The logits are divided by it.",
          KeyRange::above(0), {}, true, 1.0},
    });
  }
  if (smol || l4) {
    rows.push_back(A{"no_rope_layer_interval", &L::no_rope_layer_interval,
                     l4 ? "Layer l has no RoPE (NoPE: global, temperature-tuned) when l + 1 is a "
                          "multiple of it; the others rotate and attend within chunks."
                        : "Layer l has no RoPE (NoPE) when l + 1 is a multiple of it.",
                     KeyRange::size(1), {}, true, I64{4}});
  }
  if (l4) {  // Llama4TextConfig's own
    rows.insert(rows.end(), {
        A{"intermediate_size_mlp", &L::intermediate_size_mlp,
          "Width of the dense layers' SwiGLU MLP.", KeyRange::size(1), {}, true, I64{16384}},
        A{"interleave_moe_layer_step", &L::interleave_moe_layer_step,
          "Layer l is sparse (router, experts, shared expert) when l + 1 is a multiple of it; "
          "the others dense.", KeyRange::size(1), {}, true, I64{1}},
        A{"attention_chunk_size", &L::attention_chunk_size,
          "The RoPE layers attend within chunks of this many positions (key j visible to query "
          "i iff j // chunk == i // chunk); 0 = none.", KeyRange::size(0), {}, true, I64{8192}},
        A{"attn_temperature_tuning", &L::attn_temperature_tuning,
          "Scale the NoPE layers' queries by log(floor((t + 1) / floor_scale) + 1) * attn_scale "
          "+ 1 at position t.", {}, {}, true, true},
        A{"floor_scale", &L::floor_scale, "attn_temperature_tuning: positions per step of the "
          "log.", KeyRange::size(1), {}, true, I64{8192}},
        A{"attn_scale", &L::attn_scale, "attn_temperature_tuning: the log's factor.",
          KeyRange::nonnegative(), {}, true, 0.1},
    });
  }
  if (q35) {  // Qwen3_5TextConfig's linear attention (Qwen3NextConfig's attributes)
    rows.insert(rows.end(), {
        A{"full_attention_interval", &L::full_attention_interval,
          "Layer l is full attention when l + 1 is a multiple of it, else linear attention "
          "(Gated DeltaNet).", KeyRange::size(1), {}, false, I64{4}},
        A{"linear_conv_kernel_dim", &L::linear_conv_kernel_dim,
          "Taps of the linear layers' causal depthwise convolution.", KeyRange::size(1), {}, true,
          I64{4}},
        A{"linear_key_head_dim", &L::linear_key_head_dim,
          "Width of each linear-attention q and k head.", KeyRange::size(1), {}, true, I64{128}},
        A{"linear_value_head_dim", &L::linear_value_head_dim,
          "Width of each linear-attention value head.", KeyRange::size(1), {}, true, I64{128}},
        A{"linear_num_key_heads", &L::linear_num_key_heads,
          "Linear-attention q and k heads.", KeyRange::size(1), {}, true, I64{16}},
        A{"linear_num_value_heads", &L::linear_num_value_heads,
          "Linear-attention value heads (each reads q and k head h / (value heads / key "
          "heads)).", KeyRange::size(1), {}, true, I64{32}},
    });
  }
  if (qwen) {
    rows.push_back(A{"max_window_layers", &L::max_window_layers,
                     "Layers 0 .. max_window_layers - 1 attend fully; later ones slide under "
                     "use_sliding_window.", KeyRange::size(0), {}, true, int64_t{28}});
  }
  if (gemma23) {
    rows.push_back(A{"query_pre_attn_scalar", &L::query_pre_attn_scalar,
                     "Attention scores are scaled by query_pre_attn_scalar^-1/2 (not "
                     "head_dim^-1/2).", KeyRange::size(1), {}, true, I64{256}});
  }
  // Gemma3TextConfig's attribute; Olmo3Config has layer_types only (an fsdp_train key there:
  // config.json in and out spell the list); Gemma 2's pattern is fixed (2, not a key).
  if (gemma3 || olmo3 || exaone) {
    rows.push_back(A{"sliding_window_pattern", &L::sliding_window_pattern,
                     gemma3   ? "Layer l slides unless l + 1 is a multiple of it (6: five sliding "
                                "layers, then one global)."
                     : exaone ? "Layer l slides unless l + 1 is a multiple of it (EXAONE 4: 4, "
                                "\"LLLG\"); the global layers have no RoPE."
                              : "Layer l slides unless l + 1 is a multiple of it (OLMo 3: 4, three "
                                "sliding layers, then one global).",
                     KeyRange::size(1), {}, gemma3 || exaone, gemma3 ? I64{6} : I64{4}});
  }
  if (gemma2) {  // Gemma2Config's soft-caps; config.json's null is 0
    rows.insert(rows.end(), {
        A{"attn_logit_softcapping", &L::attn_logit_softcapping,
          "Attention scores s become c * tanh(s / c) before the mask (c this value); 0 = none.",
          KeyRange::nonnegative(), {}, true, 50.0},
        A{"final_logit_softcapping", &L::final_logit_softcapping,
          "Logits z become c * tanh(z / c) before the loss (c this value); 0 = none.",
          KeyRange::nonnegative(), {}, true, 30.0},
    });
  }
  if (moe) {  // the sparse MLP (Qwen3MoeConfig, MixtralConfig, OlmoeConfig)
    rows.insert(rows.end(), {
        A{mixtral || oss || l4 ? "num_local_experts" : ds_moe ? "n_routed_experts" : "num_experts",
          &L::num_experts,
          ds_moe ? "Routed experts (SwiGLU MLPs) per sparse layer."
          : oss  ? "Experts (clamped SwiGLU MLPs with biases) per layer."
          : l4   ? "Routed experts (SwiGLU MLPs) per sparse layer."
                 : "Experts (SwiGLU MLPs) per layer.",
          KeyRange::size(1), {}, true,
          qwen3_moe || glm || oss ? I64{128} : ds || q35moe ? I64{256} : olmoe || ds2 ? I64{64}
          : l4 ? I64{16}
                                      : qwen2_moe ? I64{60} : I64{8}},
        // (DeepseekV2Config's None means a dense model: a config.json must give it)
        A{"num_experts_per_tok", &L::num_experts_per_tok,
          ds_moe && !ds2 ? "Experts each token is routed to (the top k of the router's sigmoid "
                           "scores plus e_score_correction_bias)."
          : oss          ? "Experts each token is routed to (the top k of the router's logits, "
                           "weighted by their softmax)."
          : l4           ? "Experts each token is routed to (the top k of the router's logits; "
                           "their sigmoids scale the experts' inputs). fsdp_train: 1."
                         : "Experts each token is routed to (the top k of the router's softmax).",
          KeyRange::size(1), {}, true,
          ds2 ? std::optional<ModelValue>()
              : std::optional<ModelValue>(mixtral ? I64{2} : qwen2_moe || oss ? I64{4}
                                          : l4 ? I64{1} : I64{8})},
    });
    if (qwen3_moe || qwen2_moe || ds_moe || q35moe) {
      rows.push_back(A{"moe_intermediate_size", &L::moe_intermediate_size,
                       "Width of each expert's SwiGLU MLP.", KeyRange::size(1), {}, true,
                       qwen2_moe || glm ? I64{1408} : ds ? I64{2048} : ds2 ? I64{1407}
                       : q35moe ? I64{512}
                                : I64{768}});
    }
    if (ds_moe) {  // Glm4MoeConfig's, DeepseekV3Config's and DeepseekV2Config's routing, layers
      rows.insert(rows.end(), {
          A{"n_shared_experts", &L::n_shared_experts,
            "Shared experts: one SwiGLU MLP n_shared_experts * moe_intermediate_size wide that "
            "every token runs beside its routed experts.", KeyRange::size(1), {}, true,
            ds2 ? I64{2} : I64{1}},
          A{"routed_scaling_factor", &L::routed_scaling_factor,
            "The routed experts' weights are multiplied by it.", KeyRange::above(0), {}, true,
            ds ? 2.5 : 1.0},
          A{"first_k_dense_replace", &L::first_k_dense_replace,
            "Layers 0 .. first_k_dense_replace - 1 have a dense MLP (intermediate_size), the "
            "others experts.", KeyRange::size(0), {}, true, ds ? I64{3} : ds2 ? I64{0} : I64{1}},
      });
    }
    if (glm || ds) {  // the sigmoid routing's groups (DeepSeek-V2's group_limited_greedy: refused)
      rows.insert(rows.end(), {
          A{"n_group", &L::n_group,
            "Groups of consecutive experts (a group scores the sum of its two best choices).",
            KeyRange::size(1), {}, true, ds ? I64{8} : I64{1}},
          A{"topk_group", &L::topk_group,
            "Groups each token's experts are chosen from (the best topk_group of n_group).",
            KeyRange::size(1), {}, true, ds ? I64{4} : I64{1}},
      });
    }
    if (qwen2_moe || q35moe) {
      rows.push_back(A{"shared_expert_intermediate_size", &L::shared_expert_intermediate_size,
                       "Width of the shared expert's SwiGLU MLP (every token runs it, scaled by "
                       "sigmoid(shared_expert_gate)).", KeyRange::size(1), {}, true,
                       q35moe ? I64{512} : I64{5632}});
    }
    // Mixtral, gpt-oss and Qwen3.5-MoE always renormalise, DeepseekV2Moe and Llama 4 never
    if (!mixtral && !ds2 && !oss && !l4 && !q35moe) {
      rows.push_back(A{"norm_topk_prob", &L::norm_topk_prob,
                       "Divide each token's top-k routing weights by their sum.", {}, {}, true,
                       ds_moe});
    }
    // (Glm4MoeForCausalLM, DeepseekV3ForCausalLM and Llama4ForCausalLM have no auxiliary loss)
    if (!ds_moe && !l4) {
      rows.insert(rows.end(), {
          A{"output_router_logits", &L::output_router_logits,
            "Add the auxiliary load-balancing loss (router_aux_loss_coef times it) to the loss.",
            {}, {}, true, false},
          A{"router_aux_loss_coef", &L::router_aux_loss_coef,
            "Weight of the load-balancing loss under output_router_logits.",
            KeyRange::nonnegative(), {}, true, olmoe ? 0.01 : oss ? 0.9 : 0.001},
      });
    }
  }
  rows.insert(rows.end(), {
      A{"tie_word_embeddings", &L::tie_word_embeddings,
        "Whether the LM head is the token embedding.", {}, {}, true, gemma},
      A{"initializer_range", &L::initializer_range,
        "Standard deviation of the weights' normal initialisation.", KeyRange::above(0), {}, true,
        0.02},
  });
  // Every class builds its embedding as nn.Embedding(vocab, hidden, padding_idx =
  // config.pad_token_id); a config.json without it means the class's default: None (-1) but
  // Olmo2Config's 1, Phi3Config's 32000 and Gemma3TextConfig's 0.
  rows.push_back(A{"pad_token_id", &L::pad_token_id,
                   "Padding token: its embedding row starts at 0 and gets no gradient from the "
                   "lookup (nn.Embedding's padding_idx); -1 = none.", KeyRange::at_least(-1), {},
                   true, olmo2 || olmoe ? I64{1}
                         : phi3  ? I64{32000}
                         : gemma ? I64{0}
                         : smol  ? I64{128004}
                                 : I64{-1}});
  LlamaConfig defaults;
  defaults.arch = arch;
  if (phi3 || mixtral) defaults.sliding_window = 0;  // Phi3Config's, MixtralConfig's None
  if (olmoe) defaults.router_aux_loss_coef = 0.01;  // OlmoeConfig's
  if (l4) {  // Llama4TextConfig's (one expert a token: what fsdp_train implements)
    defaults.use_qk_norm = true;
    defaults.num_experts_per_tok = 1;
  }
  if (oss) {  // GptOssConfig's: yarn 32x from 4096 (not truncated), every other layer sliding
    defaults.router_aux_loss_coef = 0.9;
    defaults.rope_type = L::RopeType::yarn;
    defaults.rope_factor = 32.0;
    defaults.rope_original_max_position_embeddings = 4096;
    defaults.rope_truncate = false;
    defaults.sliding_window = 128;
    defaults.sliding_window_pattern = 2;
  }
  if (ds_moe) defaults.norm_topk_prob = true;  // Glm4MoeConfig's, DeepseekV3Config's
  if (glm) defaults.partial_rotary_factor = 0.5;  // half of each head rotated
  if (q35) defaults.partial_rotary_factor = 0.25;  // Qwen3NextConfig's
  if (gemma) {  // GemmaConfig's, Gemma2Config's and Gemma3TextConfig's: tied, padding token 0
    defaults.tie_word_embeddings = true;
    defaults.pad_token_id = 0;
  }
  if (gemma3) defaults.rope_theta = 1e6;
  if (gemma2) defaults.sliding_window_pattern = 2;  // Gemma2Config's layer_types: even layers
  if (olmo3 || exaone) defaults.sliding_window_pattern = 4;  // Olmo3's layer_types, Exaone4's
  if (smol) {  // SmolLM3Config's: tied, no window, its rope_theta (not its pad 128004 > vocab)
    defaults.tie_word_embeddings = true;
    defaults.sliding_window = 0;
    defaults.rope_theta = 2e6;
  }
  return ModelArgs<LlamaConfig>(std::move(rows), defaults);
}

const ModelArgs<LlamaConfig>& llama_args(LlamaArch arch) {
  static const std::vector<ModelArgs<LlamaConfig>> tables = [] {
    std::vector<ModelArgs<LlamaConfig>> t;
    for (const ArchNames& a : kArchNames) t.push_back(make_llama_args(a.arch));
    return t;
  }();
  return tables[static_cast<std::size_t>(arch)];
}

// The rope_scaling fields (config.json's names inside the dict) each rope type reads
// (transformers' modeling_rope_utils.py): what config.json carries for it; the other fields
// keep their defaults and are not written.
// The name of a rope_scaling member inside config.json's dict: "rope_scaling.factor" -> "factor".
template <class M>
std::string rope_field(const ModelArgs<LlamaConfig>& a, M member) {
  const std::string key = a.name(member);
  return key.substr(key.find('.') + 1);
}

std::vector<std::string> rope_fields(const ModelArgs<LlamaConfig>& a, LlamaConfig::RopeType t) {
  using L = LlamaConfig;
  using R = L::RopeType;
  auto f = [&](auto member) { return rope_field(a, member); };
  if (t == R::default_) return {};  // rope_scaling null
  if (t == R::longrope) {  // its factor is max_position_embeddings / original (Phi3Config's)
    return {"rope_type", f(&L::rope_short_factor), f(&L::rope_long_factor),
            f(&L::rope_attention_factor)};
  }
  std::vector<std::string> out = {"rope_type", f(&L::rope_factor)};
  if (t == R::llama3) {
    for (double L::*m : {&L::rope_low_freq_factor, &L::rope_high_freq_factor}) out.push_back(f(m));
  }
  if (t == R::llama3 || t == R::yarn) out.push_back(f(&L::rope_original_max_position_embeddings));
  if (t == R::yarn) {
    for (double L::*m : {&L::rope_beta_fast, &L::rope_beta_slow, &L::rope_attention_factor}) {
      out.push_back(f(m));
    }
    out.push_back(f(&L::rope_truncate));
    for (double L::*m : {&L::rope_mscale, &L::rope_mscale_all_dim}) {  // DeepSeek-V3's
      if (a.has(m)) out.push_back(f(m));
    }
  }
  return out;
}

// Indices of one layer's parameters among its module's (-1: absent), in HF's state-dict
// order: self_attn q, k, v, o (then q_norm, k_norm); mlp gate, up, down; the norms by role, in
// this order: attn_in (input_layernorm), attn_out (OLMo 2's and Gemma 3's
// post_attention_layernorm), mlp_in (Llama's post_attention_layernorm, Gemma 3's
// pre_feedforward_layernorm), mlp_out (post_feedforward_layernorm).
struct LayerIndex {
  int q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, q_norm, k_norm, gate_w, gate_b, up_w, up_b, down_w,
      down_b, attn_in, attn_out, mlp_in, mlp_out, count;
  // fused_projections() (Phi-3): the parameters qkv_proj and gate_up_proj; q_w, k_w, v_w,
  // gate_w and up_w are then slots >= count standing for their rows (layer_slot); -1 otherwise.
  int qkv = -1, gate_up = -1;
  // A sparse layer (layer_sparse(); gate_w .. down_b -1): the router `router` (HF's mlp.gate,
  // [E, C]), under sigmoid_routing() its e_score_correction_bias `e_bias` [E] (a buffer: never
  // trained, see layer_module), and expert e's gate, up and down projections at expert0 + 3 e
  // + e_gate / e_up / e_down (HF's order: gate_proj, up_proj, down_proj; Mixtral's w1, w2, w3
  // = gate, down, up).
  int router = -1, e_bias = -1, expert0 = -1, e_gate = 0, e_up = 1, e_down = 2;
  // shared_expert(): the shared expert's gate, up, down projections and Qwen2-MoE's sigmoid
  // gate (shared_expert_gated(); HF's order: mlp.shared_expert.*, then
  // mlp.shared_expert_gate); else -1.
  int s_gate = -1, s_up = -1, s_down = -1, s_sigmoid = -1;
  // mla() (k_w .. v_b -1; q_w is q_proj, or q_b_proj under q_lora_rank): q_a_proj and its
  // bias, q_a_layernorm (q_lora_rank only), kv_a_proj_with_mqa and its bias, kv_a_layernorm,
  // kv_b_proj (HF's order); else -1.
  int qa_w = -1, qa_b = -1, qa_norm = -1, kva_w = -1, kva_b = -1, kva_norm = -1, kvb_w = -1;
  // attention_sinks(): self_attn.sinks [H] (after o_proj, HF's order); else -1.
  int sinks = -1;
  // packed_experts() (gpt-oss; expert0 -1): the router's bias mlp.router.bias [E], and the
  // experts as HF stores them: gate_up_proj [E, C, 2I], gate_up_proj_bias [E, 2I], down_proj
  // [E, I, C], down_proj_bias [E, C] (expert e's slice of each: packed_slice); else -1.
  int router_b = -1, px_gate_up = -1, px_gate_up_b = -1, px_down = -1, px_down_b = -1;
  // A linear-attention layer (layer_linear(); q_w .. v_b, q_norm, k_norm -1, o_w its
  // out_proj): linear_attn's conv1d.weight [CD, 1, K], dt_bias [Hv], A_log [Hv], norm.weight
  // [Dv], in_proj_qkv [CD, C], in_proj_z [Vd, C], in_proj_b and in_proj_a [Hv, C] (HF's
  // order: conv1d, dt_bias, A_log, norm, out_proj, then the projections Qwen3_5GatedDeltaNet
  // adds); else -1.
  int la_conv = -1, la_dt = -1, la_A = -1, la_norm = -1, la_qkv = -1, la_z = -1, la_b = -1,
      la_a = -1;
  int expert_gate(int64_t e) const { return expert0 + 3 * static_cast<int>(e) + e_gate; }
  int expert_up(int64_t e) const { return expert0 + 3 * static_cast<int>(e) + e_up; }
  int expert_down(int64_t e) const { return expert0 + 3 * static_cast<int>(e) + e_down; }
};
// The parameters of a layer: a sparse one (layer_sparse()) or a dense one; a linear-attention
// one (layer_linear()).
LayerIndex layer_index(const LlamaConfig& c, bool sparse, bool linear = false) {
  LayerIndex x{};
  int n = 0;
  auto lin = [&](int& w, int& b, bool bias) {
    w = n++;
    b = bias ? n++ : -1;
  };
  auto norms = [&] {
    x.attn_in = c.norm_before() ? n++ : -1;
    x.attn_out = c.norm_after() ? n++ : -1;
    x.mlp_in = c.norm_before() ? n++ : -1;
    x.mlp_out = c.norm_after() ? n++ : -1;
  };
  if (linear) {  // Qwen3.5's Gated DeltaNet, then the MLP (dense or sparse) below
    x.q_w = x.q_b = x.k_w = x.k_b = x.v_w = x.v_b = x.o_b = -1;
    x.la_conv = n++;
    x.la_dt = n++;
    x.la_A = n++;
    x.la_norm = n++;
    x.o_w = n++;
    x.la_qkv = n++;
    x.la_z = n++;
    x.la_b = n++;
    x.la_a = n++;
  }
  if (c.fused_projections()) {  // HF's order: qkv_proj, o_proj, gate_up_proj, down_proj, norms
    x.qkv = n++;
    x.q_b = x.k_b = x.v_b = x.gate_b = x.up_b = x.down_b = x.o_b = -1;
    x.o_w = n++;
    x.q_norm = x.k_norm = -1;
    x.gate_up = n++;
    x.down_w = n++;
    norms();
    x.count = n;
    x.q_w = n++;  // the slots of the fused rows
    x.k_w = n++;
    x.v_w = n++;
    x.gate_w = n++;
    x.up_w = n;
    return x;
  }
  if (linear) {
    // (the linear layer's parameters above)
  } else if (c.mla()) {  // (q_proj and q_b_proj have no bias)
    if (c.q_lora_rank > 0) {
      lin(x.qa_w, x.qa_b, c.attention_bias);
      x.qa_norm = n++;
    }
    lin(x.q_w, x.q_b, false);
    x.k_w = x.k_b = x.v_w = x.v_b = -1;
    lin(x.kva_w, x.kva_b, c.attention_bias);
    x.kva_norm = n++;
    x.kvb_w = n++;
  } else {
    lin(x.q_w, x.q_b, c.qkv_bias());
    lin(x.k_w, x.k_b, c.qkv_bias());
    lin(x.v_w, x.v_b, c.qkv_bias());
  }
  if (!linear) lin(x.o_w, x.o_b, c.o_bias());
  x.sinks = c.attention_sinks() ? n++ : -1;
  // (Llama 4's q/k norms have no weight; a linear layer has none)
  x.q_norm = c.qk_norm() && !c.llama4() && !linear ? n++ : -1;
  x.k_norm = c.qk_norm() && !c.llama4() && !linear ? n++ : -1;
  if (sparse && c.packed_experts()) {  // gpt-oss: mlp.router.{weight,bias}, mlp.experts.*
    // (Llama 4: feed_forward.router, feed_forward.experts without biases, the shared expert)
    const bool biases = c.gpt_oss();
    x.gate_w = x.gate_b = x.up_w = x.up_b = x.down_w = x.down_b = -1;
    x.router = n++;
    x.router_b = biases ? n++ : -1;
    x.px_gate_up = n++;
    x.px_gate_up_b = biases ? n++ : -1;
    x.px_down = n++;
    x.px_down_b = biases ? n++ : -1;
    if (c.shared_expert()) {
      x.s_gate = n++;
      x.s_up = n++;
      x.s_down = n++;
    }
  } else if (sparse) {
    x.gate_w = x.gate_b = x.up_w = x.up_b = x.down_w = x.down_b = -1;
    x.router = n++;
    x.e_bias = c.selection_bias() ? n++ : -1;
    x.expert0 = n;
    n += static_cast<int>(3 * c.num_experts);
    if (c.arch == LlamaArch::mixtral) {  // w1, w2, w3
      x.e_up = 2;
      x.e_down = 1;
    }
    if (c.shared_expert()) {
      x.s_gate = n++;
      x.s_up = n++;
      x.s_down = n++;
      x.s_sigmoid = c.shared_expert_gated() ? n++ : -1;
    }
  } else {
    lin(x.gate_w, x.gate_b, c.mlp_bias);
    lin(x.up_w, x.up_b, c.mlp_bias);
    lin(x.down_w, x.down_b, c.mlp_bias);
  }
  norms();
  x.count = n;
  return x;
}

// Decoder layer l's parameters: its LayerIndex and the id of its first parameter (embed_tokens
// is 0, then the layers' in order; the final norm's is layer_params(c, L).p0).
struct LayerParams {
  LayerIndex x;
  int p0;
};
LayerParams layer_params(const LlamaConfig& c, int64_t l) {
  if (c.qwen3_5()) {  // layers of two kinds: their counts summed
    int64_t before = 0;
    for (int64_t i = 0; i < l; ++i) {
      before += layer_index(c, c.layer_sparse(i), c.layer_linear(i)).count;
    }
    const bool layer = l < c.num_hidden_layers;  // (l == L: the final norm's id)
    return {layer_index(c, layer && c.layer_sparse(l), layer && c.layer_linear(l)),
            static_cast<int>(1 + before)};
  }
  int64_t dense_before = 0;  // (DeepSeek's first layers, Llama 4's interleaved ones)
  for (int64_t i = 0; i < l; ++i) dense_before += c.layer_sparse(i) ? 0 : 1;
  const int64_t dense = layer_index(c, false).count,
                sparse = c.moe() ? layer_index(c, true).count : 0;
  const int64_t before = dense_before * dense + (l - dense_before) * sparse;
  return {layer_index(c, c.layer_sparse(l)), static_cast<int>(1 + before)};
}

// Slot `k` of a layer as a tensor: parameter k itself (`param(k)`: its weight or gradient), or
// for a slot >= x.count the rows of the fused parameter it stands for, [rows, C] (Phi-3: q, k,
// v are rows [0, Q), [Q, Q + KV), [Q + KV, Q + 2 KV) of qkv_proj; gate and up rows [0, I) and
// [I, 2I) of gate_up_proj). Contiguous rows, so the GEMMs read and write them in place.
template <class Param>
TensorView layer_slot(const LlamaConfig& c, const LayerIndex& x, int k, Param&& param) {
  if (k < 0) {
    throw Error("layer_slot: the layer has no such parameter (slot " + std::to_string(k) + ")");
  }
  if (k < x.count) return param(k);
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  const int64_t Q = c.num_attention_heads * c.head_size(), KV = c.kv_heads() * c.head_size();
  auto rows = [&](int p, int64_t first, int64_t n) {
    return param(p).slice(first * C, n * C).reshape({n, C});
  };
  if (k == x.q_w) return rows(x.qkv, 0, Q);
  if (k == x.k_w) return rows(x.qkv, Q, KV);
  if (k == x.v_w) return rows(x.qkv, Q + KV, KV);
  if (k == x.gate_w) return rows(x.gate_up, 0, I);
  if (k == x.up_w) return rows(x.gate_up, I, I);
  throw Error("layer_slot: no slot " + std::to_string(k));
}

// Qwen3.5's gated q_proj output [BT, H, 2D] (each head's query, then its gate) and the
// [BT, H, D] views its halves are copied to and from (Kernels::strided_copy's layouts).
struct GatedQ {
  Kernels::Strided queries, gates, heads;
};
GatedQ gated_q(int64_t Q, int64_t D) {
  return {{2 * Q, 0, 2 * D, 1}, {2 * Q, D, 2 * D, 1}, {Q, 0, D, 1}};
}

// The row views of the q/k norms over BT tokens: Qwen3's rows are heads (BT*H rows of D),
// OLMo 2's tokens (BT rows of H*D, and of Hkv*D for k).
struct QkNormRows {
  int64_t q, q_width, k, k_width;
};
QkNormRows qk_norm_rows(const LlamaConfig& c, int64_t BT) {
  const int64_t H = c.num_attention_heads, Hkv = c.kv_heads(), D = c.head_size();
  if (c.qk_norm_per_head()) return {BT * H, D, BT * Hkv, D};
  return {BT, H * D, BT, Hkv * D};
}

}  // namespace

const char* llama_arch_prefix(LlamaArch arch) { return arch_names(arch).prefix; }

namespace {
// The module class of one decoder layer (the FSDP wrap class): "Qwen3DecoderLayer", ...
std::string layer_class(LlamaArch arch) {
  return std::string(llama_arch_prefix(arch)) + "DecoderLayer";
}
}  // namespace

int64_t LlamaConfig::layer_window(int64_t layer) const {
  switch (arch) {
    case LlamaArch::mistral:
    case LlamaArch::mixtral:
    case LlamaArch::phi3: return sliding_window;
    case LlamaArch::qwen2:
    case LlamaArch::qwen3:
    case LlamaArch::qwen3_moe:
    case LlamaArch::qwen2_moe:  // HF's layer_types: sliding from layer max_window_layers on
      return use_sliding_window && layer >= max_window_layers ? sliding_window : 0;
    case LlamaArch::gemma2:
    case LlamaArch::gemma3_text:
    case LlamaArch::olmo3:
    case LlamaArch::gpt_oss:
    case LlamaArch::exaone4:  // (sliding_window 0, HF's null: no sliding layer)
      return pattern_slides(layer) ? sliding_window : 0;
    case LlamaArch::smollm3:  // HF's layer_types: the NoPE layers slide under the flag
      return use_sliding_window && !layer_rope(layer) ? sliding_window : 0;
    case LlamaArch::olmo2:
    case LlamaArch::granite:
    case LlamaArch::gemma:
    case LlamaArch::olmoe:
    case LlamaArch::glm4_moe:
    case LlamaArch::deepseek_v3:
    case LlamaArch::deepseek_v2:
    case LlamaArch::llama4_text:  // (its chunks: layer_chunk)
    case LlamaArch::qwen3_5_text:
    case LlamaArch::qwen3_5_moe_text:
    case LlamaArch::llama: break;
  }
  return 0;
}

bool LlamaConfig::layer_rope(int64_t layer) const {
  // EXAONE 4: with a window only the sliding layers rotate (Exaone4Attention's "global NoPE
  // for hybrid attention").
  if (arch == LlamaArch::exaone4) return sliding_window == 0 || layer_window(layer) > 0;
  return (arch != LlamaArch::smollm3 && !llama4()) || (layer + 1) % no_rope_layer_interval != 0;
}

double LlamaConfig::temperature_scale(int64_t t) const {
  // Llama4TextAttention: log(floor((cache_position + 1) / floor_scale) + 1) * attn_scale + 1
  const double steps = std::floor(static_cast<double>(t + 1) / static_cast<double>(floor_scale));
  return std::log(steps + 1.0) * attn_scale + 1.0;
}

bool LlamaConfig::layer_local_rope(int64_t layer) const {
  return local_rope() && pattern_slides(layer);
}

double LlamaConfig::embed_scale() const {
  if (arch == LlamaArch::granite) return embedding_multiplier;
  return gemma() ? std::sqrt(static_cast<double>(hidden_size)) : 1.0;
}

namespace {
// DeepSeek's yarn_get_mscale: 0.1 m ln(s) + 1 for a scale s > 1, else 1.
double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; }
}  // namespace

float LlamaConfig::attention_scale() const {
  if (arch == LlamaArch::granite) return static_cast<float>(attention_multiplier);
  if (mla()) {  // DeepseekV3Attention: qk_head_dim^-1/2, times mscale^2 with a scaled RoPE
    // (DeepseekV2Attention: without it)
    double scale = std::pow(static_cast<double>(head_size()), -0.5);
    if (arch == LlamaArch::deepseek_v3 && rope_type != RopeType::default_ &&
        rope_mscale_all_dim != 0.0) {
      const double m = yarn_mscale(rope_factor, rope_mscale_all_dim);
      scale *= m * m;
    }
    return static_cast<float>(scale);
  }
  if (gemma2_layer()) {
    return static_cast<float>(std::pow(static_cast<double>(query_pre_attn_scalar), -0.5));
  }
  return 1.f / std::sqrt(static_cast<float>(head_size()));
}

LlamaConfig llama_local_rope_config(const LlamaConfig& c) {
  LlamaConfig local = c;
  if (c.gemma3()) local.rope_theta = c.rope_local_base_freq;
  local.rope_type = LlamaConfig::RopeType::default_;
  return local;
}

std::vector<double> llama_inv_freq(const LlamaConfig& c, int64_t seq_len) {
  const int64_t D = c.rotary_dim();  // HF's `dim`: the rotated columns of a head
  std::vector<double> f(static_cast<std::size_t>(D / 2));
  for (int64_t i = 0; i < D / 2; ++i) {
    f[static_cast<std::size_t>(i)] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(D));
  }
  using R = LlamaConfig::RopeType;
  if (c.rope_type == R::default_) return f;
  if (c.rope_type == R::longrope) {
    const bool long_seq = seq_len > c.original_max_position_embeddings;
    const std::vector<double>& ext = long_seq ? c.rope_long_factor : c.rope_short_factor;
    if (ext.size() != f.size()) {
      throw Error(std::string("llama_inv_freq: longrope's ") + (long_seq ? "long" : "short") +
                  "_factor has " + std::to_string(ext.size()) + " entries (expected " +
                  std::to_string(f.size()) + ")");
    }
    for (std::size_t i = 0; i < f.size(); ++i) f[i] /= ext[i];
    return f;
  }
  if (c.rope_type == R::linear) {
    for (double& x : f) x /= c.rope_factor;
    return f;
  }
  const double orig = static_cast<double>(c.rope_original_max_position_embeddings);
  if (c.rope_type == R::yarn) {
    const double d = static_cast<double>(D), two_pi = 2 * 3.14159265358979323846;
    auto dim_of = [&](double rotations) {  // the dimension that turns `rotations` times
      return d * std::log(orig / (rotations * two_pi)) / (2 * std::log(c.rope_theta));
    };
    double low = dim_of(c.rope_beta_fast), high = dim_of(c.rope_beta_slow);
    if (c.rope_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, d - 1);
    if (low == high) high += 0.001;  // HF's guard against a zero-width ramp
    for (int64_t i = 0; i < D / 2; ++i) {
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      double& x = f[static_cast<std::size_t>(i)];
      x = x / c.rope_factor * ramp + x * (1 - ramp);  // extrapolation weight 1 - ramp
    }
    return f;
  }
  const double low_wl = orig / c.rope_low_freq_factor, high_wl = orig / c.rope_high_freq_factor;
  const double pi = 3.14159265358979323846;
  for (double& x : f) {
    const double wl = 2 * pi / x;
    if (wl > low_wl) {
      x /= c.rope_factor;
    } else if (wl >= high_wl && c.rope_high_freq_factor > c.rope_low_freq_factor) {
      // (equal factors, Llama 4 Scout's: no band between, the cut-off alone)
      const double s = (orig / wl - c.rope_low_freq_factor) /
                       (c.rope_high_freq_factor - c.rope_low_freq_factor);
      x = (1 - s) * x / c.rope_factor + s * x;
    }
  }
  return f;
}

double llama_rope_attention_scaling(const LlamaConfig& c) {
  using R = LlamaConfig::RopeType;
  if (c.rope_type != R::yarn && c.rope_type != R::longrope) return 1.0;
  if (c.rope_attention_factor > 0) return c.rope_attention_factor;
  if (c.rope_type == R::longrope) {
    const double orig = static_cast<double>(c.original_max_position_embeddings);
    const double s = static_cast<double>(c.max_position_embeddings) / orig;
    return s <= 1 ? 1.0 : std::sqrt(1 + std::log(s) / std::log(orig));
  }
  if (c.rope_type == R::yarn && c.rope_mscale != 0.0 && c.rope_mscale_all_dim != 0.0) {
    return yarn_mscale(c.rope_factor, c.rope_mscale) /
           yarn_mscale(c.rope_factor, c.rope_mscale_all_dim);  // DeepSeek's
  }
  return c.rope_factor <= 1 ? 1.0 : 0.1 * std::log(c.rope_factor) + 1.0;
}

namespace {
// RMSNorm weights: 1, or Gemma's offsets from 1 at 0.
InitKind norm_init_of(const LlamaConfig& c) {
  return c.norm_weight_offset() ? InitKind::zeros : InitKind::ones;
}

// Decoder layer l's module "model.layers.{l}" (llama_modules).
ModuleDecl layer_module(const LlamaConfig& c, int64_t l) {
  const int64_t C = c.hidden_size;
  const int64_t Q = c.num_attention_heads * c.head_size(), KV = c.kv_heads() * c.head_size();
  const bool sparse = c.layer_sparse(l);
  const int64_t I = sparse ? c.intermediate_size : c.mlp_width(l);  // a dense layer's MLP
  // Llama 4's MLP is its feed_forward (Llama4TextMoe, Llama4TextMLP)
  const std::string ff = c.llama4() ? "feed_forward." : "mlp.";
  const float std0 = static_cast<float>(c.initializer_range);
  const bool linear_layer = c.layer_linear(l);
  const LayerIndex x = layer_index(c, sparse, linear_layer);
  const InitKind norm_init = norm_init_of(c);
  const std::string m = "model.layers." + std::to_string(l);
  ModuleDecl layer{m, layer_class(c.arch), {}};
  layer.params.resize(static_cast<std::size_t>(x.count));
  auto put = [&](int i, const std::string& name, std::vector<int64_t> shape, InitKind init,
                 bool decay) {
    if (i >= 0) {
      layer.params[static_cast<std::size_t>(i)] =
          ParamSpec{m + "." + name, std::move(shape), init,
                    init == InitKind::normal ? std0 : 0.f, decay};
    }
  };
  auto linear = [&](int w, int b, const std::string& name, int64_t out, int64_t in) {
    put(w, name + ".weight", {out, in}, InitKind::normal, true);
    put(b, name + ".bias", {out}, InitKind::zeros, false);
  };
  if (linear_layer) {  // Qwen3_5GatedDeltaNet: HF's parameters and their initialisation
    const int64_t CD = c.linear_conv_dim(), Vd = c.linear_value_dim();
    const int64_t Hv = c.linear_num_value_heads;
    put(x.la_conv, "linear_attn.conv1d.weight", {CD, 1, c.linear_conv_kernel_dim},
        InitKind::normal, true);
    put(x.la_dt, "linear_attn.dt_bias", {Hv}, InitKind::ones, false);
    // A = exp(A_log) uniform in [0.01, 16] (Qwen3_5PreTrainedModel._init_weights; MoE: [0, 16])
    put(x.la_A, "linear_attn.A_log", {Hv}, InitKind::log_uniform, false);
    // (Qwen3_5MoePreTrainedModel: U(0, 16))
    layer.params[static_cast<std::size_t>(x.la_A)].init_low =
        c.arch == LlamaArch::qwen3_5_moe_text ? 0.f : 0.01f;
    layer.params[static_cast<std::size_t>(x.la_A)].init_high = 16.f;
    // (Qwen3NextRMSNormGated: a plain weight, initialised to 1)
    put(x.la_norm, "linear_attn.norm.weight", {c.linear_value_head_dim}, InitKind::ones, false);
    linear(x.o_w, -1, "linear_attn.out_proj", C, Vd);
    linear(x.la_qkv, -1, "linear_attn.in_proj_qkv", CD, C);
    linear(x.la_z, -1, "linear_attn.in_proj_z", Vd, C);
    linear(x.la_b, -1, "linear_attn.in_proj_b", Hv, C);
    linear(x.la_a, -1, "linear_attn.in_proj_a", Hv, C);
    linear(x.gate_w, x.gate_b, "mlp.gate_proj", I, C);
    linear(x.up_w, x.up_b, "mlp.up_proj", I, C);
  } else if (c.fused_projections()) {  // the slots q_w .. up_w are rows of these (layer_slot)
    put(x.qkv, "self_attn.qkv_proj.weight", {Q + 2 * KV, C}, InitKind::normal, true);
    put(x.gate_up, "mlp.gate_up_proj.weight", {2 * I, C}, InitKind::normal, true);
  } else if (c.mla()) {  // DeepSeek-V3's Multi-head Latent Attention
    const int64_t H = c.num_attention_heads, ql = c.q_lora_rank, r = c.kv_lora_rank;
    linear(x.qa_w, x.qa_b, "self_attn.q_a_proj", ql, C);
    put(x.qa_norm, "self_attn.q_a_layernorm.weight", {ql}, InitKind::ones, false);
    linear(x.q_w, x.q_b, ql > 0 ? "self_attn.q_b_proj" : "self_attn.q_proj", Q, ql > 0 ? ql : C);
    linear(x.kva_w, x.kva_b, "self_attn.kv_a_proj_with_mqa", r + c.qk_rope_head_dim, C);
    put(x.kva_norm, "self_attn.kv_a_layernorm.weight", {r}, InitKind::ones, false);
    linear(x.kvb_w, -1, "self_attn.kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), r);
    linear(x.gate_w, x.gate_b, "mlp.gate_proj", I, C);
    linear(x.up_w, x.up_b, "mlp.up_proj", I, C);
  } else {
    // (Qwen3.5's gated attention: each head's query, then its gate)
    linear(x.q_w, x.q_b, "self_attn.q_proj", c.gated_attention() ? 2 * Q : Q, C);
    linear(x.k_w, x.k_b, "self_attn.k_proj", KV, C);
    linear(x.v_w, x.v_b, "self_attn.v_proj", KV, C);
    linear(x.gate_w, x.gate_b, ff + "gate_proj", I, C);
    linear(x.up_w, x.up_b, ff + "up_proj", I, C);
  }
  put(x.sinks, "self_attn.sinks", {c.num_attention_heads}, InitKind::normal, false);
  if (sparse && c.packed_experts()) {  // gpt-oss: HF's GptOssTopKRouter and GptOssExperts
    const int64_t E = c.num_experts, Im = c.expert_size();
    put(x.router, ff + "router.weight", {E, C}, InitKind::normal, true);
    put(x.router_b, ff + "router.bias", {E}, InitKind::normal, false);  // (HF: normal too)
    put(x.px_gate_up, ff + "experts.gate_up_proj", {E, C, 2 * Im}, InitKind::normal, true);
    put(x.px_gate_up_b, ff + "experts.gate_up_proj_bias", {E, 2 * Im}, InitKind::zeros, false);
    put(x.px_down, ff + "experts.down_proj", {E, Im, C}, InitKind::normal, true);
    put(x.px_down_b, ff + "experts.down_proj_bias", {E, C}, InitKind::zeros, false);
    const int64_t Is = c.shared_size();  // Llama 4's shared expert
    put(x.s_gate, ff + "shared_expert.gate_proj.weight", {Is, C}, InitKind::normal, true);
    put(x.s_up, ff + "shared_expert.up_proj.weight", {Is, C}, InitKind::normal, true);
    put(x.s_down, ff + "shared_expert.down_proj.weight", {C, Is}, InitKind::normal, true);
  } else if (sparse) {  // the router and the experts (HF's names: Mixtral's block_sparse_moe, w1-3)
    const bool mixtral = c.arch == LlamaArch::mixtral;
    const std::string moe = mixtral ? "block_sparse_moe" : "mlp";
    const int64_t Im = c.expert_size();
    put(x.router, moe + ".gate.weight", {c.num_experts, C}, InitKind::normal, true);
    // GLM-4.5's and DeepSeek-V3's selection bias, a buffer (HF's register_buffer: in the state
    // dict, not a parameter): a parameter here that the model never writes a gradient to and AdamW
    // does not decay, so every optimizer step leaves it as it was (its AdamW moments stay 0).
    put(x.e_bias, moe + ".gate.e_score_correction_bias", {c.num_experts}, InitKind::zeros, false);
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string ex = moe + ".experts." + std::to_string(e) + ".";
      put(x.expert_gate(e), ex + (mixtral ? "w1" : "gate_proj") + ".weight", {Im, C},
          InitKind::normal, true);
      put(x.expert_up(e), ex + (mixtral ? "w3" : "up_proj") + ".weight", {Im, C},
          InitKind::normal, true);
      put(x.expert_down(e), ex + (mixtral ? "w2" : "down_proj") + ".weight", {C, Im},
          InitKind::normal, true);
    }
    const int64_t Is = c.shared_size();
    // Qwen2-MoE's mlp.shared_expert, GLM-4.5's mlp.shared_experts
    const std::string sh = c.deepseek_moe() ? "mlp.shared_experts." : "mlp.shared_expert.";
    put(x.s_gate, sh + "gate_proj.weight", {Is, C}, InitKind::normal, true);
    put(x.s_up, sh + "up_proj.weight", {Is, C}, InitKind::normal, true);
    put(x.s_down, sh + "down_proj.weight", {C, Is}, InitKind::normal, true);
    put(x.s_sigmoid, "mlp.shared_expert_gate.weight", {1, C}, InitKind::normal, true);
  }
  if (!linear_layer) {
    linear(x.o_w, x.o_b, "self_attn.o_proj", C, c.num_attention_heads * c.value_head_size());
  }
  const bool per_head = c.qk_norm_per_head();
  put(x.q_norm, "self_attn.q_norm.weight", {per_head ? c.head_size() : Q}, norm_init, false);
  put(x.k_norm, "self_attn.k_norm.weight", {per_head ? c.head_size() : KV}, norm_init, false);
  linear(x.down_w, x.down_b, ff + "down_proj", C, I);
  put(x.attn_in, "input_layernorm.weight", {C}, norm_init, false);
  put(x.attn_out, "post_attention_layernorm.weight", {C}, norm_init, false);
  put(x.mlp_in,
      c.gemma2_layer() ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight",
      {C},
      norm_init, false);
  put(x.mlp_out, "post_feedforward_layernorm.weight", {C}, norm_init, false);
  return layer;
}
}  // namespace

std::vector<ModuleDecl> llama_modules(const LlamaConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, Vp = c.padded_vocab();
  const float std0 = static_cast<float>(c.initializer_range);
  std::vector<ModuleDecl> modules;
  ModuleDecl emb{"model.embed_tokens",
                 c.gemma3()  ? "Gemma3TextScaledWordEmbedding"
                 : c.gemma() ? "GemmaTextScaledWordEmbedding"
                             : "Embedding",
                 {}};
  emb.params.push_back({"model.embed_tokens.weight", {Vp, C}, InitKind::normal, std0, false, V});
  emb.params.back().zero_row = c.pad_token_id;
  modules.push_back(std::move(emb));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) modules.push_back(layer_module(c, l));
  modules.push_back({"model.norm", std::string(llama_arch_prefix(c.arch)) + "RMSNorm",
                     {ParamSpec{"model.norm.weight", {C}, norm_init_of(c), 0.f, false}}});
  if (!c.tie_word_embeddings) {
    ModuleDecl head{"lm_head", "Linear", {}};
    head.params.push_back({"lm_head.weight", {Vp, C}, InitKind::normal, std0, true, V});
    modules.push_back(std::move(head));
  }
  return modules;
}

// ---- the model ----

namespace {
// What a norm of `c` multiplies by: its weight `w` itself, or under norm_weight_offset()
// (Gemma3RMSNorm's `1.0 + self.weight.float()`) 1 + w in fp32, written into the values
// [offset, offset + w.numel()) of `scratch` (Acts::norm_w) first: rmsnorm_forward and
// rmsnorm_backward then run unchanged, and the gradient of 1 + w is the gradient of w.
TensorView norm_weight(DeviceRuntime& rt, const LlamaConfig& c, const TensorView& w,
                       const DeviceBuffer& ones, const DeviceBuffer& scratch, int64_t offset) {
  if (!c.norm_weight_offset()) return w;
  const int64_t n = w.numel();
  const TensorView out = scratch.view().slice(offset, n);
  rt.cast(out, w);
  rt.axpy(out, 1.f, ones.view().slice(0, n));
  return out;
}

// A Linear's forward over R rows: out [R,n] = inp [R,m] @ w[n,m]^T (+ b, in the GEMM's
// epilogue where the backend has one: kernels.hpp's gemm_bias; b empty: none).
void linear_forward(Kernels& k, int64_t R, const TensorView& out, const TensorView& inp,
                    const TensorView& w, const TensorView& b, int64_t n, int64_t m) {
  if (b.data != nullptr) {
    k.gemm_bias(false, true, R, n, m, inp, w, b, out);
  } else {
    k.gemm(false, true, R, n, m, 1.f, inp, w, 0.f, out);
  }
}
// Its weight gradient from dout [R,n]: gw += alpha dout^T inp (gb += the column sums of dout,
// in the same GEMM where the backend has it; gb empty: no bias). `alpha` scales dout (Granite's
// residual_multiplier); a bias with alpha != 1 throws fsdp::Error.
void linear_weight_grad(Kernels& k, int64_t R, const TensorView& dout, const TensorView& inp,
                        const TensorView& gw, const TensorView& gb, int64_t n, int64_t m,
                        float alpha = 1.f) {
  if (gb.data != nullptr) {
    if (alpha != 1.f) throw Error("LlamaModel: a scaled linear with a bias");
    k.gemm_weight_bias_grad(false, n, m, R, dout, inp, gw, gb);
  } else {
    k.gemm(true, false, n, m, R, alpha, dout, inp, 1.f, gw);
  }
}

// One decoder layer's norm weights as the kernels take them (norm_weight), by role (empty
// where the layer has none): each in its own part of Acts::norm_w, so all stay valid through
// the layer's forward or backward.
struct LayerNorms {
  TensorView attn_in, attn_out, mlp_in, mlp_out, q, k;
};
template <class Param>
LayerNorms layer_norms(DeviceRuntime& rt, const LlamaConfig& c, const LayerIndex& x, Param&& W,
                       const DeviceBuffer& ones, const DeviceBuffer& scratch) {
  const int64_t C = c.hidden_size, D = c.head_size();
  auto get = [&](int k, int64_t offset) {
    return k < 0 ? TensorView{} : norm_weight(rt, c, W(k), ones, scratch, offset);
  };
  return {get(x.attn_in, 0),      get(x.attn_out, C), get(x.mlp_in, 2 * C),
          get(x.mlp_out, 3 * C), get(x.q_norm, 4 * C), get(x.k_norm, 4 * C + D)};
}

// The factor the token embedding's output is multiplied by, as HF applies it: embed_scale()
// rounded to float32, then to the embedding weight's dtype (Gemma3TextScaledWordEmbedding's
// `self.embed_scale.to(self.weight.dtype)`; bf16 turns sqrt(3072) = 55.43 into 55.5).
// Granite's embedding_multiplier is a Python float times the tensor: not rounded first.
float embed_alpha(const LlamaConfig& c, DType weight_dtype) {
  const auto alpha = static_cast<float>(c.embed_scale());
  return c.gemma() ? round_to(weight_dtype, alpha) : alpha;
}
}  // namespace

namespace {
// The up projection's rows of a dense layer: its own buffer, or under packed_experts() (whose
// gate buffer holds a sparse layer's [rows, 2I] and there is no up buffer; Llama 4's dense
// layers) the second half of the gate buffer.
TensorView dense_up(const DeviceBuffer& gate, const DeviceBuffer& up, int64_t rows,
                    int64_t width) {
  if (up.numel() > 0) return up.view({rows, width});
  if (gate.numel() < 2 * rows * width) return TensorView{};  // (a sparse layer's: unused)
  return gate.view().slice(rows * width, rows * width).reshape({rows, width});
}
// Llama 4's RoPE pairs: HF's adjacent columns (2i, 2i + 1) of each of G heads D wide (its
// apply_rotary_emb's complex view) as ours (i, i + D/2), the rotate-half layout rope_forward
// rotates (the evens, then the odds), or back (`to_ours` false). q.k is a sum over the columns,
// so the attention reads the permuted q and k unchanged.
void pair_layout(Kernels& k, const TensorView& ours, const TensorView& hf, int64_t R, int64_t G,
                 int64_t D, bool to_ours) {
  for (int64_t h = 0; h < 2; ++h) {
    const Kernels::Strided o{G * D, h * (D / 2), D, 1}, f{G * D, h, D, 2};
    if (to_ours) {
      k.strided_copy(ours, o, hf, f, R, G, D / 2, false);
    } else {
      k.strided_copy(hf, f, ours, o, R, G, D / 2, false);
    }
  }
}
}  // namespace

struct LlamaModel::Acts {
  int64_t B = 0, T = 0;  // capacity
  std::vector<DeviceBuffer> res;  // L+1 residual streams [BT,C]
  struct Layer {
    // q [BT,Q] and k [BT,KV] after RoPE; lse fp32 [B,H,T]. silu(gate) * up is not kept:
    // see dI1 below. Under qk_norm(): q_raw, k_raw the projections before their RMSNorm,
    // q_rstd and k_rstd fp32 its statistics ([BT*H], [BT*Hkv] per head; [BT] each for OLMo
    // 2's whole-row norms; else empty). The input norms' outputs are not kept, only their
    // statistics (ln1_rstd, ln2_rstd; under norm_before()): see dln below. norm_after()
    // (OLMo 2, Gemma 3): ln1 holds o_proj's output and ln2 down_proj's, the inputs of the two
    // output norms, their statistics in o_rstd and m_rstd; empty otherwise.
    DeviceBuffer ln1, ln1_rstd, q, k, v, lse, atty, res2, ln2, ln2_rstd, gate, up;
    DeviceBuffer q_raw, k_raw, q_rstd, k_rstd, o_rstd, m_rstd;
    // moe() (gate and up then hold the BT*K routed rows [BT*K, expert_size()], grouped by
    // expert): the router's logits [BT,E]; the top-k experts idx [BT*K] int32 and weights
    // [BT*K] fp32 (moe_router_forward); the routed rows' tokens src [BT*K] int32 and each
    // (token, k)'s row slot [BT*K] int32; the experts' outputs [BT*K, C] (read by the combine's
    // backward); on the host, expert e's rows [offsets[e], offsets[e + 1]).
    DeviceBuffer router_logits, moe_idx, moe_w, moe_src, moe_slot, expert_out;
    std::vector<int64_t> moe_offsets;
    // shared_expert(): its gate and up projections [BT, Is], its output [BT, C] and its
    // sigmoid gate's logit [BT] (Is = shared_expert_intermediate_size).
    DeviceBuffer s_gate, s_up, shared_out, shared_logit;
    // mla() (q, k, v, atty then hold mla_forward's [BT, H, D] layouts: q and k with their rope
    // columns first, v padded to D, the attention's D-wide output): q_a_proj's output
    // [BT, q_lora_rank] and q_a_layernorm's statistics fp32 [BT] (under q_lora_rank), the
    // compressed kv c [BT, kv_lora_rank] and kv_a_layernorm's statistics fp32 [BT].
    DeviceBuffer mla_qa, mla_qa_rstd, mla_c, mla_c_rstd;
    // gated_attention() (Qwen3.5's full layers): the gate [BT, Q] (q_proj's second half of
    // each head; the attention's output is atty, its gated product Acts::o_in).
    DeviceBuffer attn_gate;
    // Qwen3.5's linear layers (layer_linear; the sets that serve one):
    // in_proj_qkv's output [BT, CD] (the conv's input) and the conv's output [BT, CD] (the
    // delta rule's q, k, v), in_proj_z's [BT, Vd], in_proj_a's and in_proj_b's [BT, Hv], the
    // delta rule's output [BT, Vd], the gated norm's output [BT, Vd] and statistics fp32
    // [BT*Hv] (CD = linear_conv_dim(), Vd = linear_value_dim(), Hv its heads).
    DeviceBuffer la_qkv_pre, la_qkv, la_z, la_a, la_b, la_core, la_normed, la_rstd;
  };
  // One shared by the layers that recompute (activation checkpointing), one per other layer.
  std::vector<Layer> layers;
  ActivationCheckpointing checkpointing;
  Layer& layer(int64_t l) { return layers[static_cast<std::size_t>(checkpointing.buffer_set(l))]; }
  // logits [BT,Vp] (dlogits after CE); [chunk,Vp] under model.fused_linear_cross_entropy
  DeviceBuffer lnf, lnf_rstd, logits;
  // Backward scratch. dI1 [BT,I] also holds act = silu(gate) * up where one layer needs it:
  // in forward each layer's, read by its down_proj GEMM; in backward the layer's own,
  // recomputed from its gate and up for the down_proj weight gradient before dI1 is
  // overwritten (torch.compile's partitioner recomputes such pointwise ops too).
  // dln [BT,C] also holds input_layernorm's and post_attention_layernorm's outputs where one
  // layer needs them (not under norm_after()): in forward for the projections they feed; in
  // backward recomputed (rmsnorm_forward of the kept layer input and res2: the same kernel on
  // the same values, so the same bits) before the projections' weight gradients, which run
  // before their input gradients overwrite dln. Two [BT,C] activations fewer per layer.
  DeviceBuffer dres, dln, dI1, dI2, datty, dq, dk, dv;
  // moe(): the routed rows' scratch [BT*K, C] (forward: the gathered inputs; backward: the
  // experts' output gradients, then again the inputs, then their gradients), d weights fp32
  // [BT*K], d router logits [BT,E]. Empty otherwise.
  DeviceBuffer moe_rows, moe_dw, moe_dlogits;
  // aux_loss(): the router probabilities summed over every layer's tokens fp32 [E]
  // (moe_router_prob_sums), the routed (token, pick) counts [E] fp32 (from the host's
  // moe_count), and d loss / d p [E] fp32 (the load-balancing loss's backward). Empty
  // otherwise.
  DeviceBuffer moe_psum, moe_counts, moe_dprobs;
  // input_scaled_routing() (Llama 4): the scaled inputs [BT, C] (forward: w * ln2; backward: the
  // same again, then their gradient) and d ln2 through the scaling [BT, C]; the identity slot
  // 0 .. BT-1 [BT] int32; a zero selection bias [E] fp32 (moe_sigmoid_router_forward's). Empty
  // otherwise.
  DeviceBuffer moe_xs, moe_dxs, moe_identity, moe_zero_bias;
  // shared_expert(): scratch [BT, Is] x2 (forward: its activation; backward: d gate, d up),
  // d output [BT, C], d logit [BT].
  DeviceBuffer s_act, s_dup, s_dout, s_dlogit;
  // mla(): scratch: kv_b_proj's output (backward: its gradient) [BT, H (dn + dv)]; a lora
  // norm's output, its gradient and the norm's input gradient [BT, max(q_lora_rank,
  // kv_lora_rank)] each; o_proj's input (backward: its gradient) [BT, H dv];
  // kv_a_proj_with_mqa's output (backward: its gradient) [BT, kv_lora_rank + dr]. Empty
  // otherwise.
  DeviceBuffer mla_kv, mla_n, mla_dn, mla_dc, mla_o, mla_ckv;
  // qwen3_5(): o_proj's (out_proj's) input [BT, max(Q, Vd)] (forward: the gated attention's
  // output, or the linear layer's; backward: it again for the weight gradient, then its
  // gradient, then the gate's); q_proj's output [BT, 2Q] (backward: its gradient); the linear
  // layers' backward scratch: d z, d normed, d core [BT, Vd], d qkv, d qkv_pre [BT, CD], d a,
  // d b [BT, Hv]. Empty otherwise.
  DeviceBuffer o_in, qg, la_dz, la_dn, la_dcore, la_dqkv, la_dqkv_pre, la_da, la_db;
  std::vector<double> moe_count;  // host: this forward's counts per expert, all layers
  DeviceBuffer rope_cos, rope_sin;               // fp32 [T, R/2], R = rotary_dim()
  // Gemma 3's sliding layers' RoPE (layer_local_rope), fp32 [T, R/2]; else empty.
  DeviceBuffer rope_local_cos, rope_local_sin;
  // Llama 4's NoPE layers' query temperature as a rotation table (cos = the scale at position
  // t, sin = 0: rope_forward multiplies q by it) fp32 [T, D/2], when some scale is not 1
  // (temperature_table()); else empty.
  DeviceBuffer temp_cos, temp_sin;
  // Gemma 3 (norm_weight_offset()): fp32 ones [max(C, D)], and the (1 + weight) of one
  // layer's norms [4C + 2D] (attn_in, attn_out, mlp_in, mlp_out, q_norm, k_norm; the final
  // norm's in its first C), rebuilt before each use (norm_weight, layer_norms). Its first C
  // values also hold the padding row of the embedding's gradient across the lookup's
  // backward (pad_token_id). Empty otherwise.
  DeviceBuffer ones, norm_w;
  DeviceBuffer tokens_dev, targets_dev;          // [BT] int32
  // Document masking (Documents; allocated by the first forward that has them): each
  // token's position in its document and its document's first position in the row (t minus
  // it: gqa_attention's doc_start), int32 [BT]; under reset_positions the RoPE tables' rows
  // at those positions, fp32 [BT, R/2] (and the sliding layers' under local_rope()). Empty
  // otherwise.
  DeviceBuffer doc_pos, doc_start, pos_cos, pos_sin, pos_local_cos, pos_local_sin;
  // Llama 4's chunked layers under document masking: each token's first visible key, the later
  // of its document's start and its chunk's (attention_chunk_size), int32 [BT]; else empty.
  DeviceBuffer chunk_start;
};

namespace {
struct ActCounts {
  int64_t act = 0, f32 = 0, i32 = 0;
};
// What one set of per-layer buffers (Acts::Layer; activation checkpointing's recomputed
// layers share one) holds for the MLP of the layers it serves: gate and up of `mlp` elements
// each (the largest layer's), and the sparse layers' routing buffers when one is sparse; the
// attention's buffers when one of them attends, Qwen3.5's linear layers' when one is linear.
struct BufferSet {
  int64_t mlp = 0;
  bool sparse = false, attention = false, linear = false;
};
std::vector<BufferSet> buffer_sets(const LlamaConfig& c, int64_t BT,
                                   ActivationCheckpointing checkpointing) {
  std::vector<BufferSet> sets(
      static_cast<std::size_t>(checkpointing.buffer_sets(c.num_hidden_layers)));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    BufferSet& b = sets[static_cast<std::size_t>(checkpointing.buffer_set(l))];
    b.mlp = std::max(b.mlp, BT * c.mlp_rows_per_token(l) * c.mlp_width(l));
    b.sparse = b.sparse || c.layer_sparse(l);
    b.linear = b.linear || c.layer_linear(l);
    b.attention = b.attention || !c.layer_linear(l);
  }
  return sets;
}
// The router logits' storage: fp32 for DeepSeek's block (HF's DeepseekV3TopkRouter and
// DeepseekV2Moe compute them in fp32), else the activations'.
DType router_dtype(const LlamaConfig& c, DType act) {
  return c.deepseek_moe() ? DType::f32 : act;
}
// Whether the model needs Acts::ones and Acts::norm_w (Gemma's (1 + weight) norms, a padding
// row's kept gradient, Llama 4's weightless q/k norms).
bool norm_scratch(const LlamaConfig& c) {
  return c.norm_weight_offset() || c.pad_token_id >= 0 || (c.llama4() && c.use_qk_norm);
}
// Whether sequences of T tokens need Llama 4's temperature table: a NoPE layer, the tuning on,
// and a position t < T whose scale is not 1 (t + 1 >= floor_scale).
bool temperature_table(const LlamaConfig& c, int64_t T) {
  if (!c.llama4() || !c.attn_temperature_tuning || T < c.floor_scale) return false;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.layer_rope(l)) return true;
  }
  return false;
}
// Whether document masking needs Acts::chunk_start: Llama 4 with chunked attention layers.
bool chunked_documents(const LlamaConfig& c) { return c.llama4() && c.attention_chunk_size > 0; }
// Element counts of what ensure_buffers allocates, by storage class: one table for the
// allocation and the memory plan.
ActCounts act_counts(const LlamaConfig& c, int64_t B, int64_t T,
                     ActivationCheckpointing checkpointing, DocumentMasking docs) {
  const int64_t BT = B * T, C = c.hidden_size, H = c.num_attention_heads, D = c.head_size();
  const int64_t Q = H * D, KV = c.kv_heads() * D, Vp = c.padded_vocab();
  const std::vector<BufferSet> sets = buffer_sets(c, BT, checkpointing);
  const auto S = static_cast<int64_t>(sets.size());
  // dI1, dI2 each; gate and up; routing; the attention's and the linear layers' buffers
  int64_t MI = 0, set_mlp = 0, sparse_sets = 0, A = 0, Ls = 0;
  for (const BufferSet& b : sets) {
    MI = std::max(MI, b.mlp);
    set_mlp += 2 * b.mlp;
    sparse_sets += b.sparse ? 1 : 0;
    A += b.attention ? 1 : 0;
    Ls += b.linear ? 1 : 0;
  }
  const int64_t logit_rows = c.fused_lce.logits_rows(BT, C, Vp);  // BT, or one chunk
  ActCounts n;
  n.act = (c.num_hidden_layers + 1) * BT * C                            // residual streams
          + A * BT * (Q + 2 * KV + Q) + S * BT * C + set_mlp  // q k v atty; res2; gate up
          + (c.norm_after() ? S * BT * 2 * C : 0)           // ln1 ln2 (output norms' inputs)
          + BT * C + logit_rows * Vp                                      // norm, logits
          + BT * (2 * C + 2 * Q + 2 * KV) + 2 * MI;                       // backward scratch
  const int64_t norms = (c.norm_before() ? 2 : 0) + (c.norm_after() ? 2 : 0);
  const int64_t rope_tables = c.local_rope() ? 2 : 1;  // global (and the sliding layers')
  const int64_t R = c.rotary_dim();
  n.f32 = S * norms * BT + A * B * H * T + BT + rope_tables * 2 * T * (R / 2);  // rstd, lse; ...
  if (norm_scratch(c)) n.f32 += std::max(C, D) + 4 * C + 2 * D;
  if (temperature_table(c, T)) n.f32 += 2 * T * (D / 2);
  if (c.qk_norm()) {
    n.act += A * BT * (Q + KV);                  // q_raw, k_raw
    n.f32 += A * BT * (c.qk_norm_per_head() ? H + c.kv_heads() : 2);  // q_rstd, k_rstd
  }
  n.i32 = 2 * BT;
  if (docs.enabled)
    n.i32 += (chunked_documents(c) ? 3 : 2) * BT;  // doc_pos, doc_start, chunk_start
  if (docs.reset_positions) n.f32 += rope_tables * 2 * BT * (R / 2);          // pos_cos, pos_sin
  if (c.qwen3_5()) {  // per set: the gate, the linear layers' buffers; the scratch (Acts::o_in ..)
    const int64_t CD = c.linear_conv_dim(), Vd = c.linear_value_dim(),
                  Hv = c.linear_num_value_heads;
    n.act += A * BT * Q + Ls * BT * (2 * CD + 3 * Vd + 2 * Hv) +
             BT * (std::max(Q, Vd) + 2 * Q + 3 * Vd + 2 * CD + 2 * Hv);
    n.f32 += Ls * BT * Hv;
  }
  if (c.mla()) {  // per set: q_a_proj's output, c and their norms' statistics; the scratch
    const int64_t H = c.num_attention_heads, ql = c.q_lora_rank, r = c.kv_lora_rank;
    n.act += S * BT * (ql + r) +
             BT * (H * (c.qk_nope_head_dim + c.v_head_dim) + 3 * std::max(ql, r) +
                   H * c.v_head_dim + r + c.qk_rope_head_dim);
    n.f32 += S * BT * ((ql > 0 ? 1 : 0) + 1);
  }
  if (sparse_sets > 0) {
    const int64_t E = c.num_experts, RK = BT * c.num_experts_per_tok;
    // router logits (per set; d router logits scratch), of the router's dtype
    int64_t& logits = router_dtype(c, DType::bf16) == DType::f32 ? n.f32 : n.act;
    logits += (sparse_sets + 1) * BT * E;
    n.act += sparse_sets * RK * C  // expert outputs
             + RK * C;             // scratch: routed rows
    n.f32 += sparse_sets * RK + RK;  // weights; d weights
    n.i32 += sparse_sets * 3 * RK;   // idx, src, slot
    if (c.aux_loss()) n.f32 += 3 * E;  // psum, counts, dprobs
    if (c.input_scaled_routing()) {  // scaled inputs, d ln2 scratch; identity slot; zero bias
      n.act += 2 * BT * C;
      n.i32 += BT;
      n.f32 += E;
    }
    if (c.shared_expert()) {  // gate, up (Qwen2-MoE: output, logit); their scratch (d output)
      const int64_t Is = c.shared_size(), gated = c.shared_expert_gated() ? 1 : 0;
      n.act += (sparse_sets + 1) * 2 * BT * Is + (sparse_sets + 1) * gated * (BT * C + BT);
    }
  }
  return n;
}
}  // namespace

int64_t LlamaModel::activation_bytes(const LlamaConfig& c, int64_t B, int64_t T, DType act,
                                     ActivationCheckpointing checkpointing,
                                     DocumentMasking docs) {
  const ActCounts n = act_counts(c, B, T, checkpointing, docs);  // (router logits' dtype included)
  return n.act * static_cast<int64_t>(dtype_size(act)) + 4 * n.f32 + 4 * n.i32;
}

LlamaModel::LlamaModel(const LlamaConfig& config, Kernels& kernels, DType activation_dtype,
                       ActivationCheckpointing activation_checkpointing)
    : cfg_(config), be_(kernels), rt_(kernels.runtime()), act_dtype_(activation_dtype),
      checkpointing_(activation_checkpointing), modules_(llama_modules(config)),
      router_counts_(static_cast<std::size_t>(config.num_hidden_layers)) {}

LlamaModel::~LlamaModel() = default;

void LlamaModel::ensure_buffers(int64_t B, int64_t T) {
  if (acts_ && B <= acts_->B && T <= acts_->T) return;
  if (acts_) {
    B = std::max(B, acts_->B);
    T = std::max(T, acts_->T);
  }
  acts_.reset();
  auto a = std::make_unique<Acts>();
  a->B = B;
  a->T = T;
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads, D = cfg_.head_size();
  const int64_t Q = H * D, KV = cfg_.kv_heads() * D, Vp = cfg_.padded_vocab();
  const std::vector<BufferSet> sets = buffer_sets(cfg_, BT, checkpointing_);
  int64_t MI = 0;  // the scratch dI1, dI2: the widest layer's
  bool any_sparse = false;
  for (const BufferSet& b : sets) {
    MI = std::max(MI, b.mlp);
    any_sparse = any_sparse || b.sparse;
  }
  const auto cat = MemCategory::activations;
  auto f = [&](int64_t n) { return DeviceBuffer(rt_, act_dtype_, n, cat); };
  auto f32 = [&](int64_t n) { return DeviceBuffer(rt_, DType::f32, n, cat); };
  auto logits_buf = [&](int64_t n) {
    return DeviceBuffer(rt_, router_dtype(cfg_, act_dtype_), n, cat);
  };
  for (int64_t l = 0; l <= cfg_.num_hidden_layers; ++l) a->res.push_back(f(BT * C));
  a->layers.resize(sets.size());
  a->checkpointing = checkpointing_;
  for (std::size_t i = 0; i < sets.size(); ++i) {
    Acts::Layer& y = a->layers[i];
    const BufferSet& set = sets[i];
    if (cfg_.norm_after()) {
      y.ln1 = f(BT * C); y.ln2 = f(BT * C); y.o_rstd = f32(BT); y.m_rstd = f32(BT);
    }
    if (cfg_.norm_before()) { y.ln1_rstd = f32(BT); y.ln2_rstd = f32(BT); }
    if (set.attention) {
      y.q = f(BT * Q); y.k = f(BT * KV); y.v = f(BT * KV);
      y.lse = f32(B * H * T); y.atty = f(BT * Q);
    }
    y.res2 = f(BT * C);
    if (cfg_.packed_experts()) {  // gate_up [BT*K, 2I] (interleaved), no separate up
      y.gate = f(2 * set.mlp);
    } else {
      y.gate = f(set.mlp); y.up = f(set.mlp);
    }
    if (set.sparse) {
      const int64_t E = cfg_.num_experts, RK = BT * cfg_.num_experts_per_tok;
      auto i32 = [&](int64_t n) { return DeviceBuffer(rt_, DType::i32, n, cat); };
      y.router_logits = logits_buf(BT * E); y.expert_out = f(RK * C); y.moe_w = f32(RK);
      y.moe_idx = i32(RK); y.moe_src = i32(RK); y.moe_slot = i32(RK);
      if (cfg_.shared_expert()) {
        const int64_t Is = cfg_.shared_size();
        y.s_gate = f(BT * Is); y.s_up = f(BT * Is);
        if (cfg_.shared_expert_gated()) { y.shared_out = f(BT * C); y.shared_logit = f(BT); }
      }
    }
    if (cfg_.mla()) {
      const int64_t ql = cfg_.q_lora_rank;
      if (ql > 0) { y.mla_qa = f(BT * ql); y.mla_qa_rstd = f32(BT); }
      y.mla_c = f(BT * cfg_.kv_lora_rank); y.mla_c_rstd = f32(BT);
    }
    if (cfg_.qwen3_5() && set.attention) y.attn_gate = f(BT * Q);
    if (set.linear) {
      const int64_t CD = cfg_.linear_conv_dim(), Vd = cfg_.linear_value_dim(),
                    Hv = cfg_.linear_num_value_heads;
      y.la_qkv_pre = f(BT * CD); y.la_qkv = f(BT * CD); y.la_z = f(BT * Vd);
      y.la_a = f(BT * Hv); y.la_b = f(BT * Hv); y.la_core = f(BT * Vd);
      y.la_normed = f(BT * Vd); y.la_rstd = f32(BT * Hv);
    }
    if (cfg_.qk_norm() && set.attention) {
      y.q_raw = f(BT * Q); y.k_raw = f(BT * KV);
      const bool per_head = cfg_.qk_norm_per_head();
      y.q_rstd = f32(per_head ? BT * H : BT); y.k_rstd = f32(per_head ? BT * cfg_.kv_heads() : BT);
    }
  }
  a->lnf = f(BT * C); a->lnf_rstd = f32(BT);
  a->logits = f(cfg_.fused_lce.logits_rows(BT, C, Vp) * Vp);
  a->dres = f(BT * C); a->dln = f(BT * C); a->dI1 = f(MI); a->dI2 = f(MI);
  if (any_sparse) {
    const int64_t RK = BT * cfg_.num_experts_per_tok;
    a->moe_rows = f(RK * C);
    a->moe_dw = f32(RK);
    a->moe_dlogits = logits_buf(BT * cfg_.num_experts);
    if (cfg_.aux_loss()) {
      const int64_t E = cfg_.num_experts;
      a->moe_psum = f32(E); a->moe_counts = f32(E); a->moe_dprobs = f32(E);
    }
    if (cfg_.input_scaled_routing()) {
      a->moe_xs = f(BT * C); a->moe_dxs = f(BT * C);
      a->moe_identity = DeviceBuffer(rt_, DType::i32, BT, cat);
      std::vector<int32_t> ids(static_cast<std::size_t>(BT));
      for (int64_t i = 0; i < BT; ++i) ids[static_cast<std::size_t>(i)] = static_cast<int32_t>(i);
      rt_.copy_from_host(a->moe_identity.view({BT}), ids.data());
      a->moe_zero_bias = f32(cfg_.num_experts);
      rt_.fill_zero(a->moe_zero_bias.view());
    }
    if (cfg_.shared_expert()) {
      const int64_t Is = cfg_.shared_size();
      a->s_act = f(BT * Is); a->s_dup = f(BT * Is);
      if (cfg_.shared_expert_gated()) { a->s_dout = f(BT * C); a->s_dlogit = f(BT); }
    }
  }
  a->datty = f(BT * Q); a->dq = f(BT * Q); a->dk = f(BT * KV); a->dv = f(BT * KV);
  if (cfg_.qwen3_5()) {
    const int64_t CD = cfg_.linear_conv_dim(), Vd = cfg_.linear_value_dim(),
                  Hv = cfg_.linear_num_value_heads;
    a->o_in = f(BT * std::max(Q, Vd)); a->qg = f(BT * 2 * Q);
    a->la_dz = f(BT * Vd); a->la_dn = f(BT * Vd); a->la_dcore = f(BT * Vd);
    a->la_dqkv = f(BT * CD); a->la_dqkv_pre = f(BT * CD); a->la_da = f(BT * Hv);
    a->la_db = f(BT * Hv);
  }
  if (cfg_.mla()) {
    const int64_t r = cfg_.kv_lora_rank, lora = std::max(cfg_.q_lora_rank, r);
    a->mla_kv = f(BT * H * (cfg_.qk_nope_head_dim + cfg_.v_head_dim));
    a->mla_n = f(BT * lora); a->mla_dn = f(BT * lora); a->mla_dc = f(BT * lora);
    a->mla_o = f(BT * H * cfg_.v_head_dim); a->mla_ckv = f(BT * (r + cfg_.qk_rope_head_dim));
  }
  // RoPE tables for positions 0..T-1 of the R rotated columns: angle t * inv_freq[i] in
  // float64 (longrope's factors chosen by T), stored fp32.
  const int64_t half = cfg_.rotary_dim() / 2;
  auto rope_table = [&](const LlamaConfig& rc, DeviceBuffer& cos, DeviceBuffer& sin) {
    cos = f32(T * half);
    sin = f32(T * half);
    const std::vector<double> inv = llama_inv_freq(rc, T);
    const double scale = llama_rope_attention_scaling(rc);  // yarn's, longrope's; 1 otherwise
    std::vector<float> cs(static_cast<std::size_t>(T * half)), sn(cs.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(t) * inv[static_cast<std::size_t>(i)];
        cs[static_cast<std::size_t>(t * half + i)] = static_cast<float>(scale * std::cos(ang));
        sn[static_cast<std::size_t>(t * half + i)] = static_cast<float>(scale * std::sin(ang));
      }
    }
    rt_.copy_from_host(cos.view({T, half}), cs.data());
    rt_.copy_from_host(sin.view({T, half}), sn.data());
  };
  rope_table(cfg_, a->rope_cos, a->rope_sin);
  if (cfg_.local_rope()) {
    rope_table(llama_local_rope_config(cfg_), a->rope_local_cos, a->rope_local_sin);
  }
  if (temperature_table(cfg_, T)) {  // cos = the scale at t, sin = 0: q times the scale
    const int64_t half = D / 2;
    a->temp_cos = f32(T * half);
    a->temp_sin = f32(T * half);
    std::vector<float> cs(static_cast<std::size_t>(T * half));
    for (int64_t t = 0; t < T; ++t) {
      std::fill_n(cs.begin() + t * half, half, static_cast<float>(cfg_.temperature_scale(t)));
    }
    rt_.copy_from_host(a->temp_cos.view({T, half}), cs.data());
    rt_.fill_zero(a->temp_sin.view());
  }
  if (norm_scratch(cfg_)) {
    const int64_t n1 = std::max(C, D);
    a->ones = f32(n1);
    const std::vector<float> one(static_cast<std::size_t>(n1), 1.f);
    rt_.copy_from_host(a->ones.view({n1}), one.data());
    a->norm_w = f32(4 * C + 2 * D);
  }
  a->tokens_dev = DeviceBuffer(rt_, DType::i32, BT, cat);
  a->targets_dev = DeviceBuffer(rt_, DType::i32, BT, cat);
  acts_ = std::move(a);
}

void LlamaModel::prepare_documents(int64_t B, int64_t T) {
  Acts& a = *acts_;
  const DocumentMasking docs = document_masking();
  if (!docs.enabled) return;
  const int64_t BT = B * T, NB = a.B * a.T, half = cfg_.rotary_dim() / 2;
  const auto cat = MemCategory::activations;
  // sized for the largest micro-batch, as ensure_buffers' buffers
  const std::vector<int32_t> start = upload_documents(rt_, a.doc_pos, a.doc_start, B, T, NB);
  if (chunked_documents(cfg_) && !a.chunk_start) {
    a.chunk_start = DeviceBuffer(rt_, DType::i32, NB, cat);
  }
  if (docs.reset_positions && !a.pos_cos) {
    a.pos_cos = DeviceBuffer(rt_, DType::f32, NB * half, cat);
    a.pos_sin = DeviceBuffer(rt_, DType::f32, NB * half, cat);
    if (cfg_.local_rope()) {
      a.pos_local_cos = DeviceBuffer(rt_, DType::f32, NB * half, cat);
      a.pos_local_sin = DeviceBuffer(rt_, DType::f32, NB * half, cat);
    }
  }
  if (chunked_documents(cfg_)) {  // HF: the chunks by position in the row (cache_position)
    const int64_t c = cfg_.attention_chunk_size;
    std::vector<int32_t> chunk(start.size());
    for (int64_t i = 0; i < BT; ++i) {
      const int64_t t = i % T;
      chunk[static_cast<std::size_t>(i)] =
          std::max(start[static_cast<std::size_t>(i)], static_cast<int32_t>(t / c * c));
    }
    rt_.copy_from_host(a.chunk_start.view({BT}), chunk.data());
  }
  if (docs.reset_positions) {  // each token's row of the tables, at its position
    auto gather = [&](const DeviceBuffer& out, const DeviceBuffer& table) {
      be_.embedding_lookup_forward(out.view({BT, half}), a.doc_pos.view({BT}),
                                   table.view({T, half}), BT, half);
    };
    gather(a.pos_cos, a.rope_cos);
    gather(a.pos_sin, a.rope_sin);
    if (cfg_.local_rope()) {
      gather(a.pos_local_cos, a.rope_local_cos);
      gather(a.pos_local_sin, a.rope_local_sin);
    }
  }
}

LlamaModel::RopeTables LlamaModel::rope_tables(bool local, int64_t B, int64_t T) const {
  const Acts& a = *acts_;
  const int64_t half = cfg_.rotary_dim() / 2;
  if (document_masking().reset_positions) {
    return {(local ? a.pos_local_cos : a.pos_cos).view({B * T, half}),
            (local ? a.pos_local_sin : a.pos_sin).view({B * T, half}), 1, B * T};
  }
  return {(local ? a.rope_local_cos : a.rope_cos).view({T, half}),
          (local ? a.rope_local_sin : a.rope_sin).view({T, half}), B, T};
}

TensorView LlamaModel::doc_start(int64_t BT) const {
  return docs_.positions ? acts_->doc_start.view({BT}) : TensorView{};
}

TensorView LlamaModel::chunk_doc_start(int64_t l, int64_t BT) const {
  return cfg_.layer_chunk(l) > 0 ? acts_->chunk_start.view({BT}) : doc_start(BT);
}

TensorView LlamaModel::last_logits() const {
  if (cfg_.fused_lce.enabled) throw fused_logits_error();
  if (!acts_ || last_rows_ == 0) return {};
  return acts_->logits.view({last_rows_, cfg_.padded_vocab()});
}

double LlamaModel::take_max_expert_load() {
  const double load = max_expert_load_;
  max_expert_load_ = 0.0;
  return load;
}

std::vector<Model::RouterLoad> LlamaModel::take_router_loads() {
  std::vector<RouterLoad> loads;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    const LayerParams lp = layer_params(cfg_, l);
    if (!cfg_.layer_sparse(l) || lp.x.e_bias < 0) continue;
    auto& counts = router_counts_[static_cast<std::size_t>(l)];
    counts.resize(static_cast<std::size_t>(cfg_.num_experts), 0.0);
    loads.push_back({modules_[static_cast<std::size_t>(1 + l)]
                         .params[static_cast<std::size_t>(lp.x.e_bias)]
                         .name,
                     counts});
    std::fill(counts.begin(), counts.end(), 0.0);
  }
  return loads;
}

TensorView LlamaModel::router_logits(int64_t layer) const {
  if (!acts_ || last_rows_ == 0 || layer < 0 || layer >= cfg_.num_hidden_layers ||
      !cfg_.layer_sparse(layer) || checkpointing_.recomputes(layer)) {
    return {};
  }
  return acts_->layer(layer).router_logits.view({last_rows_, cfg_.num_experts});
}

// Parameter ids: embed_tokens 0; layer l's from layer_params(l).p0; the final norm's
// layer_params(L).p0; lm_head next.
void LlamaModel::forward(const int32_t* tokens_host, const int32_t* targets_host, int64_t B,
                         int64_t T, ModuleHooks& hooks, bool with_backward, float grad_scale,
                         const TensorView& loss) {
  if (T > cfg_.max_position_embeddings) {
    throw Error("Llama forward: T exceeds max_position_embeddings");
  }
  ensure_buffers(B, T);
  Acts& a = *acts_;
  const int64_t BT = B * T, C = cfg_.hidden_size, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  const int64_t L = cfg_.num_hidden_layers;
  last_rows_ = BT;
  const TensorView tokens = a.tokens_dev.view({BT}), targets = a.targets_dev.view({BT});
  rt_.copy_from_host(tokens, tokens_host);
  rt_.copy_from_host(targets, targets_host);
  prepare_documents(B, T);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };

  training_forward_ = with_backward;
  if (cfg_.aux_loss()) {  // the load-balancing loss's sums over this forward's layers
    rt_.fill_zero(a.moe_psum.view());
    a.moe_count.assign(static_cast<std::size_t>(cfg_.num_experts), 0.0);
  }
  hooks.pre_forward(0);
  be_.embedding_lookup_forward(rows(a.res[0], C), tokens, hooks.param(0), BT, C);
  if (cfg_.embed_scale() != 1.0) {
    be_.scale(rows(a.res[0], C), embed_alpha(cfg_, hooks.param(0).dtype));
  }
  hooks.post_forward(0);

  for (int64_t l = 0; l < L; ++l) {
    const int m = static_cast<int>(1 + l);
    hooks.pre_forward(m);
    layer_forward(l, B, T, hooks, /*write_output=*/true);
    hooks.post_forward(m);
  }
  if (cfg_.aux_loss()) aux_loss_forward(targets_host, BT, with_backward, grad_scale, loss);

  const int m_norm = static_cast<int>(1 + L), p_norm = layer_params(cfg_, L).p0;
  const bool tied = cfg_.tie_word_embeddings;
  const int p_head = tied ? 0 : p_norm + 1;
  const TensorView lnf = rows(a.lnf, C);
  // logits [BT,Vp] = norm(x) @ W^T, W the LM head (or the tied embedding) [Vp,C]; tied, the
  // head runs inside the norm module (as GPT-2's ln_f), else in its own. Chunked
  // (model.fused_linear_cross_entropy): evaluation computes the loss chunk by chunk here;
  // training leaves the head to backward.
  auto head = [&] {
    if (cfg_.fused_lce.enabled) {
      if (!with_backward) lm_head_chunks_loss(be_, head_chunks(BT, hooks.param(p_head)), loss);
      return;
    }
    const TensorView logits = rows(a.logits, Vp);  // Granite's: divided by logits_scaling
    be_.gemm(false, true, BT, Vp, C, cfg_.logit_scale(), lnf, hooks.param(p_head), 0.f, logits);
    if (with_backward) {
      be_.cross_entropy_forward_backward(loss, logits, targets, BT, V, Vp, grad_scale,
                                         cfg_.logit_softcap());
    } else {
      be_.cross_entropy_forward(loss, logits, targets, BT, V, Vp, cfg_.logit_softcap());
    }
  };
  hooks.pre_forward(m_norm);
  be_.rmsnorm_forward(lnf, a.lnf_rstd.view({BT}), rows(a.res[L], C),
                      norm_weight(rt_, cfg_, hooks.param(p_norm), a.ones, a.norm_w, 0), BT, C,
                      static_cast<float>(cfg_.rms_norm_eps));
  if (tied) head();
  hooks.post_forward(m_norm);
  if (!tied) {
    hooks.pre_forward(m_norm + 1);
    head();
    hooks.post_forward(m_norm + 1);
  }
}

void LlamaModel::layer_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                               bool write_output) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  const int p0 = lp.p0;
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.kv_heads(), D = cfg_.head_size(), I = cfg_.mlp_width(l);
  const int64_t Q = H * D, KV = Hkv * D, MR = BT * cfg_.mlp_rows_per_token(l);
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };
  auto W = [&](int k) {
    return layer_slot(cfg_, x, k, [&](int i) { return hooks.param(p0 + i); });
  };
  auto& y = a.layer(l);
  const LayerNorms nw = layer_norms(rt_, cfg_, x, W, a.ones, a.norm_w);
  // The input norms' outputs in the dln scratch (Acts::dln); the output norms' inputs kept
  // (ln1: o_proj's output, ln2: down_proj's; norm_after()).
  const bool before = cfg_.norm_before(), after = cfg_.norm_after();
  // (a linear layer's set may hold no attention buffers: BufferSet::attention)
  const bool linear_layer = cfg_.layer_linear(l), gated = cfg_.gated_attention() && !linear_layer;
  auto attn_rows = [&](const DeviceBuffer& b, int64_t width) {
    return linear_layer ? TensorView{} : rows(b, width);
  };
  const TensorView in = rows(a.res[l], C), n1 = rows(a.dln, C), q = attn_rows(y.q, Q),
                   k = attn_rows(y.k, KV), v = attn_rows(y.v, KV), atty = attn_rows(y.atty, Q),
                   res2 = rows(y.res2, C), gate = y.gate.view({MR, I}),
                   up = dense_up(y.gate, y.up, MR, I), act = a.dI1.view({MR, I});  // Acts::dI1
  const int64_t R = cfg_.rotary_dim();  // RoPE's rotated columns of a head; R/2 frequencies
  const RopeTables rope = rope_tables(cfg_.layer_local_rope(l), B, T);
  // out [BT,n] = inp [BT,m] @ W[n,m]^T (+ b)
  auto linear = [&](const TensorView& out, const TensorView& inp, int w, int b, int64_t n,
                    int64_t m) {
    linear_forward(be_, BT, out, inp, W(w), b >= 0 ? W(b) : TensorView{}, n, m);
  };
  // The projections read input_layernorm(in), or `in` itself without input norms (OLMo 2).
  if (before) be_.rmsnorm_forward(n1, y.ln1_rstd.view({BT}), in, nw.attn_in, BT, C, eps);
  const TensorView xin = before ? n1 : in;
  if (cfg_.mla()) {
    mla_forward(l, B, T, hooks, xin);
  } else if (cfg_.llama4()) {
    llama4_attention_forward(l, B, T, hooks, xin);
  } else if (linear_layer) {
    linear_attention_forward(l, B, T, hooks, xin);
  } else {
    if (cfg_.qk_norm()) {  // q = q_norm(q_proj(xin)) (Qwen3, Gemma 3: per head; OLMo 2: per row)
      const QkNormRows n = qk_norm_rows(cfg_, BT);
      if (gated) {  // q_proj's head h: [query | gate], D each: the queries to q_raw, the gates kept
        linear(rows(a.qg, 2 * Q), xin, x.q_w, x.q_b, 2 * Q, C);
        const GatedQ g = gated_q(Q, D);
        be_.strided_copy(rows(y.q_raw, Q), g.heads, rows(a.qg, 2 * Q), g.queries, BT, H, D, false);
        be_.strided_copy(rows(y.attn_gate, Q), g.heads, rows(a.qg, 2 * Q), g.gates, BT, H, D,
                         false);
      } else {
        linear(rows(y.q_raw, Q), xin, x.q_w, x.q_b, Q, C);
      }
      linear(rows(y.k_raw, KV), xin, x.k_w, x.k_b, KV, C);
      be_.rmsnorm_forward(y.q.view({n.q, n.q_width}), y.q_rstd.view({n.q}),
                          y.q_raw.view({n.q, n.q_width}), nw.q, n.q, n.q_width, eps);
      be_.rmsnorm_forward(y.k.view({n.k, n.k_width}), y.k_rstd.view({n.k}),
                          y.k_raw.view({n.k, n.k_width}), nw.k, n.k, n.k_width, eps);
    } else {
      linear(q, xin, x.q_w, x.q_b, Q, C);
      linear(k, xin, x.k_w, x.k_b, KV, C);
    }
    linear(v, xin, x.v_w, x.v_b, KV, C);
    if (cfg_.layer_rope(l)) {  // not on SmolLM3's NoPE layers
      be_.rope_forward(q, q, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
      be_.rope_forward(k, k, rope.cos, rope.sin, rope.B, rope.T, Hkv, D, R);
    }
    be_.gqa_attention_forward(atty, y.lse.view({B, H, T}), q, k, v, B, T, H, Hkv, D,
                              cfg_.attention_scale(), cfg_.layer_window(l),
                              cfg_.attention_softcap(), doc_start(BT));
    // gpt-oss's sinks: out and lse become the softmax-with-sink's (the backward reads both)
    if (cfg_.attention_sinks()) {
      be_.attention_sink_forward(atty, y.lse.view({B, H, T}), W(x.sinks), B, T, H, D);
    }
  }
  // o_proj's input: the attention's output, or MLA's heads of v_head_dim (Acts::mla_o), or
  // Qwen3.5's gated output or linear layer's (Acts::o_in)
  const int64_t Qo = linear_layer ? cfg_.linear_value_dim() : H * cfg_.value_head_size();
  const TensorView o_in = cfg_.mla()                 ? a.mla_o.view({BT, Qo})
                          : linear_layer || gated ? a.o_in.view({BT, Qo})
                                                  : atty;
  if (gated) be_.sigmoid_gate_forward(o_in, atty, rows(y.attn_gate, Q));
  // The MLP's gated activation into `out`: silu(gate) * up, or Gemma 3's gelu_tanh(gate) * up.
  auto mlp_act = [&](const TensorView& out) {
    if (cfg_.gelu_mlp()) {
      be_.geglu_forward(out, gate, up);
    } else {
      be_.swiglu_forward(out, gate, up);
    }
  };
  if (after) {
    // res2 = in + post_attention_layernorm(o), o = o_proj(atty) kept in ln1
    const TensorView o = rows(y.ln1, C), m = rows(y.ln2, C);
    linear(o, atty, x.o_w, x.o_b, C, Q);
    be_.rmsnorm_forward(res2, y.o_rstd.view({BT}), o, nw.attn_out, BT, C, eps);
    be_.add_bias_residual(res2, TensorView{}, in, BT, C);
    // The MLP reads res2 itself (OLMo 2) or pre_feedforward_layernorm(res2) in dln (Gemma 3).
    if (before) be_.rmsnorm_forward(n1, y.ln2_rstd.view({BT}), res2, nw.mlp_in, BT, C, eps);
    const TensorView hin = before ? n1 : res2;
    linear(gate, hin, x.gate_w, x.gate_b, I, C);
    linear(up, hin, x.up_w, x.up_b, I, C);
    mlp_act(act);
    // out = res2 + post_feedforward_layernorm(m), m = down_proj(act) kept in ln2. The
    // recompute of activation checkpointing needs m and the norm's statistics, not the
    // output: the norm then writes into the free dln.
    linear(m, act, x.down_w, x.down_b, C, I);
    const TensorView out = write_output ? rows(a.res[l + 1], C) : n1;
    be_.rmsnorm_forward(out, y.m_rstd.view({BT}), m, nw.mlp_out, BT, C, eps);
    if (write_output) be_.add_bias_residual(out, TensorView{}, res2, BT, C);
    return;
  }
  // res2 = in + o_proj(atty); ln2 = RMSNorm(res2) into dln: the bias, residual and norm in one
  // pass
  auto bias = [&](int b) { return b >= 0 ? W(b) : TensorView{}; };
  const TensorView ln2 = n1;
  // Granite's residual_multiplier scales each sublayer's output before its residual add (HF:
  // residual + hidden_states * residual_multiplier; Granite has no biases here, validate()).
  const float rs = cfg_.residual_scale();
  be_.gemm(false, true, BT, C, Qo, 1.f, o_in, W(x.o_w), 0.f, res2);
  if (rs != 1.f) be_.scale(res2, rs);
  be_.add_rmsnorm_forward(res2, ln2, y.ln2_rstd.view({BT}), in, bias(x.o_b), nw.mlp_in, BT, C,
                          eps);
  if (cfg_.layer_sparse(l)) {
    moe_forward(l, BT, hooks, write_output);
    return;
  }
  linear(gate, ln2, x.gate_w, x.gate_b, I, C);
  linear(up, ln2, x.up_w, x.up_b, I, C);
  mlp_act(act);
  if (!write_output) return;
  const TensorView out = rows(a.res[l + 1], C);
  be_.gemm(false, true, BT, C, I, 1.f, act, W(x.down_w), 0.f, out);
  if (rs != 1.f) be_.scale(out, rs);
  be_.add_bias_residual(out, bias(x.down_b), res2, BT, C);
}

namespace {
// The column blocks of MLA's layouts (mla_forward): with H heads, dn = qk_nope_head_dim, dr =
// qk_rope_head_dim, dv = v_head_dim, D = dn + dr. HF's q head is [nope | rope], kv_b_proj's
// head [k_nope | v], kv_a_proj_with_mqa's row [c | k_rope]; ours (q, k: the attention's) is
// [rope | nope], the rope columns de-interleaved under rope_interleave (evens then odds: HF's
// apply_rotary_pos_emb_interleave order, whose rotate-half pairs are HF's adjacent pairs)
// so that rope_forward rotates the first dr columns of each head.
struct MlaLayout {
  int64_t H, dn, dr, dv, D, r;
  bool interleave;
  using S = Kernels::Strided;
  // Column block [offset, offset + W) of each of G heads `group` apart in rows `row` wide.
  static S at(int64_t row, int64_t offset, int64_t group, int64_t col = 1) {
    return {row, offset, group, col};
  }
  // A rope part (HF's, `from` in a row `hf_row` wide with heads `hf_group` apart; group 0: one
  // shared by all heads) to or from ours (the first dr columns of each D-wide head): `to_ours`
  // copies HF's into ours, else ours into HF's (summed over the heads when hf_group is 0).
  void rope(Kernels& k, const TensorView& ours, const TensorView& hf, int64_t rows,
            int64_t hf_row, int64_t from, int64_t hf_group, bool to_ours,
            bool accumulate = false) const {
    const int64_t halves = interleave ? 2 : 1, w = dr / halves;
    for (int64_t h = 0; h < halves; ++h) {  // evens, then odds (or the whole block once)
      const S o = at(H * D, h * w, D), f = at(hf_row, from + h, hf_group, halves);
      if (to_ours) {
        k.strided_copy(ours, o, hf, f, rows, H, w, accumulate);
      } else {
        k.strided_copy(hf, f, ours, o, rows, H, w, accumulate);
      }
    }
  }
};
MlaLayout mla_layout(const LlamaConfig& c) {
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim;
  return {c.num_attention_heads, dn, dr, c.v_head_dim, dn + dr, c.kv_lora_rank,
          c.rope_interleave};
}
// The eps of MLA's two lora norms: HF builds them as DeepseekV3RMSNorm(width), its default.
constexpr float kMlaNormEps = 1e-6f;
}  // namespace

void LlamaModel::mla_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                             const TensorView& xin) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto& y = a.layer(l);
  const MlaLayout m = mla_layout(cfg_);
  const int64_t BT = B * T, C = cfg_.hidden_size, H = m.H, D = m.D, ql = cfg_.q_lora_rank;
  const int64_t kv_w = H * (m.dn + m.dv), ckv_w = m.r + m.dr;
  using S = Kernels::Strided;
  // out [BT,n] = inp [BT,k] @ W[n,k]^T (+ b)
  auto linear = [&](const TensorView& out, const TensorView& inp, int w, int b, int64_t n,
                    int64_t k) {
    linear_forward(be_, BT, out, inp, W(w), b >= 0 ? W(b) : TensorView{}, n, k);
  };
  // q (HF's layout) into the free dq: q_proj(xin), or q_b_proj(q_a_layernorm(q_a_proj(xin)))
  const TensorView q_hf = a.dq.view({BT, H * D});
  if (ql > 0) {
    const TensorView qa = y.mla_qa.view({BT, ql}), qn = a.mla_n.view().slice(0, BT * ql);
    linear(qa, xin, x.qa_w, x.qa_b, ql, C);
    be_.rmsnorm_forward(qn.reshape({BT, ql}), y.mla_qa_rstd.view({BT}), qa, W(x.qa_norm), BT, ql,
                        kMlaNormEps);
    linear(q_hf, qn.reshape({BT, ql}), x.q_w, -1, H * D, ql);
  } else {
    linear(q_hf, xin, x.q_w, -1, H * D, C);
  }
  // [c | k_rope] = kv_a_proj_with_mqa(xin); c kept; kv = kv_b_proj(kv_a_layernorm(c))
  const TensorView ckv = a.mla_ckv.view({BT, ckv_w}), c = y.mla_c.view({BT, m.r});
  linear(ckv, xin, x.kva_w, x.kva_b, ckv_w, C);
  be_.strided_copy(c, S{m.r, 0, 0, 1}, ckv, S{ckv_w, 0, 0, 1}, BT, 1, m.r, false);
  const TensorView cn = a.mla_n.view().slice(0, BT * m.r).reshape({BT, m.r});
  be_.rmsnorm_forward(cn, y.mla_c_rstd.view({BT}), c, W(x.kva_norm), BT, m.r, kMlaNormEps);
  const TensorView kv = a.mla_kv.view({BT, kv_w});
  linear(kv, cn, x.kvb_w, -1, kv_w, m.r);
  // q and k in our layout, rotated; v padded to D
  const TensorView q = y.q.view({BT, H * D}), k = y.k.view({BT, H * D}),
                   v = y.v.view({BT, H * D}), atty = y.atty.view({BT, H * D});
  be_.strided_copy(q, MlaLayout::at(H * D, m.dr, D), q_hf, MlaLayout::at(H * D, 0, D), BT, H,
                   m.dn, false);
  m.rope(be_, q, q_hf, BT, H * D, m.dn, D, /*to_ours=*/true);
  be_.strided_copy(k, MlaLayout::at(H * D, m.dr, D), kv, MlaLayout::at(kv_w, 0, m.dn + m.dv), BT,
                   H, m.dn, false);
  m.rope(be_, k, ckv, BT, ckv_w, m.r, /*hf_group=*/0, /*to_ours=*/true);  // one k_rope, H copies
  const int64_t R = cfg_.rotary_dim();
  const RopeTables rope = rope_tables(false, B, T);
  be_.rope_forward(q, q, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
  be_.rope_forward(k, k, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
  rt_.fill_zero(v);
  be_.strided_copy(v, MlaLayout::at(H * D, 0, D), kv, MlaLayout::at(kv_w, m.dn, m.dn + m.dv), BT,
                   H, m.dv, false);
  be_.gqa_attention_forward(atty, y.lse.view({B, H, T}), q, k, v, B, T, H, H, D,
                            cfg_.attention_scale(), 0, 0.f, doc_start(BT));
  // o_proj's input: each head's first dv columns
  be_.strided_copy(a.mla_o.view({BT, H * m.dv}), MlaLayout::at(H * m.dv, 0, m.dv), atty,
                   MlaLayout::at(H * D, 0, D), BT, H, m.dv, false);
}

void LlamaModel::mla_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                              const TensorView& norm_weight, const TensorView& norm_grad) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto G = [&](int k) { return hooks.grad(lp.p0 + k); };
  auto& y = a.layer(l);
  const MlaLayout m = mla_layout(cfg_);
  const int64_t BT = B * T, C = cfg_.hidden_size, H = m.H, D = m.D, ql = cfg_.q_lora_rank;
  const int64_t kv_w = H * (m.dn + m.dv), ckv_w = m.r + m.dr, Qo = H * m.dv;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  using S = Kernels::Strided;
  // dW += dout^T inp (and db), then din (=, or += when accumulate) dout @ W; inp may be din
  auto wgrad = [&](const TensorView& dout, const TensorView& inp, int w, int b, int64_t n,
                   int64_t k) {
    linear_weight_grad(be_, BT, dout, inp, G(w), b >= 0 ? G(b) : TensorView{}, n, k);
  };
  auto dgrad = [&](const TensorView& din, const TensorView& dout, int w, int64_t n, int64_t k,
                   bool accumulate) {
    be_.gemm(false, false, BT, k, n, 1.f, dout, W(w), accumulate ? 1.f : 0.f, din);
  };
  const TensorView dres = a.dres.view({BT, C}), dln = a.dln.view({BT, C});
  const TensorView q = y.q.view({BT, H * D}), k = y.k.view({BT, H * D}),
                   v = y.v.view({BT, H * D}), atty = y.atty.view({BT, H * D});
  // o_proj: its input again (each head's first dv columns), read by the weight gradient
  // before d input replaces it; then d atty padded to D
  const TensorView o = a.mla_o.view({BT, Qo});
  be_.strided_copy(o, MlaLayout::at(Qo, 0, m.dv), atty, MlaLayout::at(H * D, 0, D), BT, H, m.dv,
                   false);
  wgrad(dres, o, x.o_w, x.o_b, C, Qo);
  dgrad(o, dres, x.o_w, C, Qo, false);
  const TensorView datty = a.datty.view({BT, H * D}), dq = a.dq.view({BT, H * D}),
                   dk = a.dk.view({BT, H * D}), dv = a.dv.view({BT, H * D});
  rt_.fill_zero(datty);
  be_.strided_copy(datty, MlaLayout::at(H * D, 0, D), o, MlaLayout::at(Qo, 0, m.dv), BT, H, m.dv,
                   false);
  be_.gqa_attention_backward(dq, dk, dv, datty, q, k, v, atty, y.lse.view({B, H, T}), B, T, H, H,
                             D, cfg_.attention_scale(), 0, 0.f, doc_start(BT));
  const int64_t R = cfg_.rotary_dim();
  const RopeTables rope = rope_tables(false, B, T);
  be_.rope_backward(dq, dq, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
  be_.rope_backward(dk, dk, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
  // d q in HF's layout (into the free datty); d kv (into mla_kv); d [c | k_rope] (mla_ckv):
  // k_rope's gradient summed over the heads
  const TensorView dq_hf = datty;
  be_.strided_copy(dq_hf, MlaLayout::at(H * D, 0, D), dq, MlaLayout::at(H * D, m.dr, D), BT, H,
                   m.dn, false);
  m.rope(be_, dq, dq_hf, BT, H * D, m.dn, D, /*to_ours=*/false);
  const TensorView dkv = a.mla_kv.view({BT, kv_w}), dckv = a.mla_ckv.view({BT, ckv_w});
  be_.strided_copy(dkv, MlaLayout::at(kv_w, 0, m.dn + m.dv), dk, MlaLayout::at(H * D, m.dr, D),
                   BT, H, m.dn, false);
  be_.strided_copy(dkv, MlaLayout::at(kv_w, m.dn, m.dn + m.dv), dv, MlaLayout::at(H * D, 0, D),
                   BT, H, m.dv, false);
  m.rope(be_, dk, dckv, BT, ckv_w, m.r, /*hf_group=*/0, /*to_ours=*/false);
  // kv_b_proj, then kv_a_layernorm: d c into dckv's first r columns
  const TensorView c = y.mla_c.view({BT, m.r});
  const TensorView cn = a.mla_n.view().slice(0, BT * m.r).reshape({BT, m.r}),
                   dcn = a.mla_dn.view().slice(0, BT * m.r).reshape({BT, m.r}),
                   dc = a.mla_dc.view().slice(0, BT * m.r).reshape({BT, m.r});
  be_.rmsnorm_forward(cn, y.mla_c_rstd.view({BT}), c, W(x.kva_norm), BT, m.r, kMlaNormEps);
  wgrad(dkv, cn, x.kvb_w, -1, kv_w, m.r);
  dgrad(dcn, dkv, x.kvb_w, kv_w, m.r, false);
  rt_.fill_zero(dc);
  be_.rmsnorm_backward(dc, G(x.kva_norm), dcn, c, W(x.kva_norm), y.mla_c_rstd.view({BT}), BT,
                       m.r);
  be_.strided_copy(dckv, S{ckv_w, 0, 0, 1}, dc, S{m.r, 0, 0, 1}, BT, 1, m.r, false);
  // q_b_proj and q_a_layernorm: d q_a into mla_dc (under q_lora_rank)
  const TensorView qa = ql > 0 ? y.mla_qa.view({BT, ql}) : TensorView{};
  const TensorView dqa = ql > 0 ? a.mla_dc.view().slice(0, BT * ql).reshape({BT, ql})
                                : TensorView{};
  if (ql > 0) {
    const TensorView qn = a.mla_n.view().slice(0, BT * ql).reshape({BT, ql}),
                     dqn = a.mla_dn.view().slice(0, BT * ql).reshape({BT, ql});
    be_.rmsnorm_forward(qn, y.mla_qa_rstd.view({BT}), qa, W(x.qa_norm), BT, ql, kMlaNormEps);
    wgrad(dq_hf, qn, x.q_w, -1, H * D, ql);
    dgrad(dqn, dq_hf, x.q_w, H * D, ql, false);
    rt_.fill_zero(dqa);
    be_.rmsnorm_backward(dqa, G(x.qa_norm), dqn, qa, W(x.qa_norm), y.mla_qa_rstd.view({BT}), BT,
                         ql);
  }
  // The projections' input ln1 = input_layernorm(res[l]) again into dln, read by the weight
  // gradients before the input gradients replace it; then through the norm into dres
  const TensorView in = a.res[static_cast<std::size_t>(l)].view({BT, C});
  be_.rmsnorm_forward(dln, y.ln1_rstd.view({BT}), in, norm_weight, BT, C, eps);
  wgrad(dckv, dln, x.kva_w, x.kva_b, ckv_w, C);
  if (ql > 0) {
    wgrad(dqa, dln, x.qa_w, x.qa_b, ql, C);
  } else {
    wgrad(dq_hf, dln, x.q_w, -1, H * D, C);
  }
  dgrad(dln, dckv, x.kva_w, ckv_w, C, false);
  if (ql > 0) {
    dgrad(dln, dqa, x.qa_w, ql, C, true);
  } else {
    dgrad(dln, dq_hf, x.q_w, H * D, C, true);
  }
  be_.rmsnorm_backward(dres, norm_grad, dln, in, norm_weight, y.ln1_rstd.view({BT}), BT, C);
}

void LlamaModel::group_routed_rows(int64_t l, int64_t BT) {
  auto& y = acts_->layer(l);
  const int64_t E = cfg_.num_experts, K = cfg_.num_experts_per_tok, RK = BT * K;
  std::vector<int32_t> idx(static_cast<std::size_t>(RK));
  rt_.copy_to_host(idx.data(), y.moe_idx.view({RK}));
  std::vector<int64_t>& offsets = y.moe_offsets;
  offsets.assign(static_cast<std::size_t>(E + 1), 0);
  for (const int32_t e : idx) {
    if (e < 0 || e >= E) {
      throw Error("LlamaModel: layer " + std::to_string(l) + "'s router chose expert " +
                  std::to_string(e) + " of " + std::to_string(E));
    }
    ++offsets[static_cast<std::size_t>(e) + 1];
  }
  for (std::size_t e = 0; e < static_cast<std::size_t>(E); ++e) offsets[e + 1] += offsets[e];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  std::vector<int32_t> src(idx.size()), slot(idx.size());
  for (int64_t i = 0; i < RK; ++i) {  // i = token * K + k, ascending: stable within an expert
    const int64_t r = next[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])]++;
    src[static_cast<std::size_t>(r)] = static_cast<int32_t>(i / K);
    slot[static_cast<std::size_t>(i)] = static_cast<int32_t>(r);
  }
  rt_.copy_from_host(y.moe_src.view({RK}), src.data());
  rt_.copy_from_host(y.moe_slot.view({RK}), slot.data());
}

namespace {
// Expert e's rows [offsets[e], offsets[e + 1]) of a [rows, width] buffer, as [n, width].
TensorView expert_rows(const DeviceBuffer& b, const std::vector<int64_t>& offsets, int64_t e,
                       int64_t width) {
  const int64_t first = offsets[static_cast<std::size_t>(e)];
  const int64_t n = offsets[static_cast<std::size_t>(e) + 1] - first;
  return b.view().slice(first * width, n * width).reshape({n, width});
}
// GLM-4.5's routing, as moe_sigmoid_router_* take it (Llama 4's: one group, the sigmoids as
// they are).
Kernels::SigmoidRouting sigmoid_routing(const LlamaConfig& c) {
  if (c.llama4()) return {1, 1, false, 1.f};
  return {c.n_group, c.topk_group, c.norm_topk_prob, static_cast<float>(c.routed_scaling_factor)};
}
}  // namespace

void LlamaModel::aux_loss_forward(const int32_t* targets_host, int64_t BT, bool backward,
                                  float grad_scale, const TensorView& loss) {
  // HF's load_balancing_loss_func over the L layers' N = L * BT rows: aux = E sum_e (count_e
  // / N) (psum_e / N). The loss sums cross-entropy over this micro-batch's n target tokens
  // (the trainer divides by all of the step's), so coef * aux enters it times n: a mean over
  // micro-batches weighted by their tokens (HF's mean when they are equal).
  Acts& a = *acts_;
  const int64_t E = cfg_.num_experts;
  int64_t sparse_layers = 0;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) sparse_layers += cfg_.layer_sparse(l);
  const double N = static_cast<double>(sparse_layers * BT);
  int64_t n = 0;
  for (int64_t i = 0; i < BT; ++i) n += targets_host[i] != kIgnoreIndex ? 1 : 0;
  const double alpha = cfg_.router_aux_loss_coef * static_cast<double>(n) *
                       static_cast<double>(E) / (N * N);
  std::vector<float> counts(a.moe_count.begin(), a.moe_count.end());  // exact below 2^24
  rt_.copy_from_host(a.moe_counts.view(), counts.data());
  be_.moe_aux_loss(loss, a.moe_counts.view(), a.moe_psum.view(), E, alpha);
  if (!backward) return;
  // d (grad_scale * alpha sum_e count_e psum_e) / d p[l, t, e]: the same for every row
  std::vector<float> dprobs(counts.size());
  for (std::size_t e = 0; e < dprobs.size(); ++e) {
    dprobs[e] = static_cast<float>(static_cast<double>(grad_scale) * alpha * a.moe_count[e]);
  }
  rt_.copy_from_host(a.moe_dprobs.view(), dprobs.data());
}

void LlamaModel::moe_forward(int64_t l, int64_t BT, ModuleHooks& hooks, bool write_output) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  const int p0 = lp.p0;
  auto W = [&](int k) { return hooks.param(p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  const int64_t I = cfg_.expert_size(), RK = BT * K;
  const TensorView ln2 = a.dln.view({BT, C}), logits = y.router_logits.view({BT, E});
  // router_logits = ln2 @ gate^T (GLM-4.5: fp32; gpt-oss: + its bias); the top-k experts and
  // weights of each token
  linear_forward(be_, BT, logits, ln2, W(x.router), x.router_b >= 0 ? W(x.router_b) : TensorView{},
                 E, C);
  if (cfg_.sigmoid_routing()) {
    // (Llama 4: no selection bias, a zero one)
    be_.moe_sigmoid_router_forward(y.moe_idx.view({RK}), y.moe_w.view({RK}), logits,
                                   x.e_bias >= 0 ? W(x.e_bias) : a.moe_zero_bias.view(), BT, E,
                                   K, sigmoid_routing(cfg_));
  } else {
    be_.moe_router_forward(y.moe_idx.view({RK}), y.moe_w.view({RK}), logits, BT, E, K,
                           cfg_.normalize_top_k());
    // DeepSeek-V2: the softmax's top-k weights times routed_scaling_factor
    if (cfg_.deepseek_moe() && cfg_.routed_scaling_factor != 1.0) {
      be_.scale(y.moe_w.view({RK}), static_cast<float>(cfg_.routed_scaling_factor));
    }
  }
  group_routed_rows(l, BT);
  const std::vector<int64_t>& off = y.moe_offsets;
  // This forward's counts per expert (not again in a recompute): the expert load of a
  // training forward, the load-balancing loss's counts beside its probability sums.
  if (write_output && (training_forward_ || cfg_.aux_loss())) {
    if (cfg_.aux_loss()) be_.moe_router_prob_sums(a.moe_psum.view(), logits, BT, E);
    for (std::size_t e = 0; e < static_cast<std::size_t>(E); ++e) {
      const auto n = static_cast<double>(off[e + 1] - off[e]);
      if (training_forward_) {
        max_expert_load_ =
            std::max(max_expert_load_, n * static_cast<double>(E) / static_cast<double>(RK));
        if (x.e_bias >= 0) {
          auto& counts = router_counts_[static_cast<std::size_t>(l)];
          counts.resize(static_cast<std::size_t>(E), 0.0);
          counts[e] += n;
        }
      }
      if (cfg_.aux_loss()) a.moe_count[e] += n;
    }
  }
  // The routed rows: each token's ln2 once per expert it chose, grouped by expert; then each
  // expert's SwiGLU MLP on its rows: down(silu(gate(x)) * up(x)).
  // (Llama 4: each token's ln2 times its expert's score: one expert a token)
  const bool scaled = cfg_.input_scaled_routing();
  if (scaled) {
    be_.moe_combine_forward(a.moe_xs.view({BT, C}), ln2, y.moe_w.view({RK}),
                            a.moe_identity.view({BT}), BT, 1, C);
  }
  be_.embedding_lookup_forward(a.moe_rows.view({RK, C}), y.moe_src.view({RK}),
                               scaled ? a.moe_xs.view({BT, C}) : ln2, RK, C);
  if (cfg_.llama4()) {
    llama4_experts_forward(l, BT, hooks);
  } else if (cfg_.packed_experts()) {
    packed_experts_forward(l, BT, hooks);
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const TensorView in = expert_rows(a.moe_rows, off, e, C);
      if (in.numel() == 0) continue;
      const int64_t n = in.shape[0];
      be_.gemm(false, true, n, I, C, 1.f, in, W(x.expert_gate(e)), 0.f,
               expert_rows(y.gate, off, e, I));
      be_.gemm(false, true, n, I, C, 1.f, in, W(x.expert_up(e)), 0.f, expert_rows(y.up, off, e, I));
    }
    be_.swiglu_forward(a.dI1.view({RK, I}), y.gate.view({RK, I}), y.up.view({RK, I}));
    for (int64_t e = 0; e < E; ++e) {
      const TensorView act = expert_rows(a.dI1, off, e, I);
      if (act.numel() == 0) continue;
      be_.gemm(false, true, act.shape[0], C, I, 1.f, act, W(x.expert_down(e)), 0.f,
               expert_rows(y.expert_out, off, e, C));
    }
  }
  // The shared expert on every token: Qwen2-MoE's output and its gate's logit kept;
  // GLM-4.5's output (ungated) added to the layer's output below
  const bool gated = cfg_.shared_expert_gated();
  const int64_t Is = cfg_.shared_size();
  if (cfg_.shared_expert()) {
    const TensorView s_gate = y.s_gate.view({BT, Is}), s_up = y.s_up.view({BT, Is}),
                     s_act = a.s_act.view({BT, Is});
    if (gated) {
      be_.gemm(false, true, BT, 1, C, 1.f, ln2, W(x.s_sigmoid), 0.f,
               y.shared_logit.view({BT, 1}));
    }
    be_.gemm(false, true, BT, Is, C, 1.f, ln2, W(x.s_gate), 0.f, s_gate);
    be_.gemm(false, true, BT, Is, C, 1.f, ln2, W(x.s_up), 0.f, s_up);
    be_.swiglu_forward(s_act, s_gate, s_up);
    if (gated) {
      be_.gemm(false, true, BT, C, Is, 1.f, s_act, W(x.s_down), 0.f,
               y.shared_out.view({BT, C}));
    }
  }
  if (!write_output) return;
  // res[l + 1] = res2 + sum_k weight_k * expert_k(ln2) (+ Qwen2-MoE's sigmoid(logit) * shared,
  // GLM-4.5's shared)
  const TensorView out = a.res[static_cast<std::size_t>(l + 1)].view({BT, C});
  // (Llama 4: the outputs unweighted, their inputs were scaled)
  be_.moe_combine_forward(out, y.expert_out.view({RK, C}),
                          scaled ? TensorView{} : y.moe_w.view({RK}), y.moe_slot.view({RK}), BT,
                          K, C);
  if (cfg_.shared_expert() && gated) {
    be_.moe_shared_gate_forward(out, y.shared_out.view({BT, C}), y.shared_logit.view({BT}), BT,
                                C);
  } else if (cfg_.shared_expert()) {
    be_.gemm(false, true, BT, C, Is, 1.f, a.s_act.view({BT, Is}), W(x.s_down), 1.f, out);
  }
  be_.add_bias_residual(out, TensorView{}, y.res2.view({BT, C}), BT, C);
}

void LlamaModel::moe_backward(int64_t l, int64_t BT, ModuleHooks& hooks,
                              const TensorView& norm_weight, bool recompute) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  const int p0 = lp.p0;
  auto W = [&](int k) { return hooks.param(p0 + k); };
  auto G = [&](int k) { return hooks.grad(p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, K = cfg_.num_experts_per_tok;
  const int64_t I = cfg_.expert_size(), RK = BT * K;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const std::vector<int64_t>& off = y.moe_offsets;
  const bool packed = cfg_.packed_experts();
  const TensorView dres = a.dres.view({BT, C}), dln = a.dln.view({BT, C}),
                   res2 = y.res2.view({BT, C}), gate = y.gate.view({RK, I}),
                   up = packed ? TensorView{} : y.up.view({RK, I}), act = a.dI1.view({RK, I}),
                   dup = a.dI2.view({RK, I}),
                   rows = a.moe_rows.view({RK, C}), w = y.moe_w.view({RK}),
                   slot = y.moe_slot.view({RK}), dw = a.moe_dw.view({RK}),
                   dlogits = a.moe_dlogits.view({BT, E});
  // ln2 = post_attention_layernorm(res2) again into dln (the recompute has left it there),
  // read below by the experts' gradients (their inputs gathered again from it) and the router's
  if (!recompute) be_.rmsnorm_forward(dln, y.ln2_rstd.view({BT}), res2, norm_weight, BT, C, eps);
  // d expert outputs (into the routed rows) and d weights from dres = d res[l + 1]
  if (cfg_.llama4()) {
    // d expert outputs: each token's dres (unweighted, one expert a token); the experts'
    // backward re-gathers their scaled inputs from ln2 (into dln); then d xs = each token's row
    // gradient, through the scaling into d ln2 (moe_dxs) and d w
    be_.embedding_lookup_forward(rows, y.moe_src.view({RK}), dres, RK, C);
    llama4_experts_backward(l, BT, hooks, recompute);
    be_.moe_combine_forward(a.moe_xs.view({BT, C}), rows, TensorView{}, slot, BT, 1, C);
    be_.moe_combine_backward(a.moe_dxs.view({BT, C}), dw, a.moe_xs.view({BT, C}), dln, w,
                             a.moe_identity.view({BT}), BT, 1, C);
  } else if (packed) {
    be_.moe_combine_backward(rows, dw, dres, y.expert_out.view({RK, C}), w, slot, BT, K, C);
    packed_experts_backward(l, BT, hooks, recompute);  // (ln2 in dln, kept)
  } else {
    // act = silu(gate) * up again into dI1 (the recompute has left it there)
    if (!recompute) be_.swiglu_forward(act, gate, up);
    be_.moe_combine_backward(rows, dw, dres, y.expert_out.view({RK, C}), w, slot, BT, K, C);
    // down: d W += dy^T act, then d act = dy @ W over act's rows (read first)
    for (int64_t e = 0; e < E; ++e) {
      const TensorView dy = expert_rows(a.moe_rows, off, e, C);
      if (dy.numel() == 0) continue;
      const int64_t n = dy.shape[0];
      const TensorView act_e = expert_rows(a.dI1, off, e, I);
      be_.gemm(true, false, C, I, n, 1.f, dy, act_e, 1.f, G(x.expert_down(e)));
      be_.gemm(false, false, n, I, C, 1.f, dy, W(x.expert_down(e)), 0.f, act_e);
    }
    be_.swiglu_backward(act, dup, act, gate, up);  // d gate into dI1, d up into dI2
    // ln2 (in dln) gathered again into the routed rows, read by the gate and up weight
    // gradients before each expert's input gradient replaces its rows
    be_.embedding_lookup_forward(rows, y.moe_src.view({RK}), dln, RK, C);
    for (int64_t e = 0; e < E; ++e) {
      const TensorView in = expert_rows(a.moe_rows, off, e, C);
      if (in.numel() == 0) continue;
      const int64_t n = in.shape[0];
      const TensorView dg = expert_rows(a.dI1, off, e, I), du = expert_rows(a.dI2, off, e, I);
      be_.gemm(true, false, I, C, n, 1.f, dg, in, 1.f, G(x.expert_gate(e)));
      be_.gemm(true, false, I, C, n, 1.f, du, in, 1.f, G(x.expert_up(e)));
      be_.gemm(false, false, n, C, I, 1.f, dg, W(x.expert_gate(e)), 0.f, in);
      be_.gemm(false, false, n, C, I, 1.f, du, W(x.expert_up(e)), 1.f, in);
    }
  }
  // the router: d logits from d weights; d gate += d logits^T ln2 (GLM-4.5's
  // e_score_correction_bias, a buffer, gets no gradient)
  if (cfg_.sigmoid_routing()) {
    be_.moe_sigmoid_router_backward(dlogits, dw, y.router_logits.view({BT, E}),
                                    y.moe_idx.view({RK}), BT, E, K, sigmoid_routing(cfg_));
  } else {
    if (cfg_.deepseek_moe() && cfg_.routed_scaling_factor != 1.0) {  // DeepSeek-V2's scale
      be_.scale(dw, static_cast<float>(cfg_.routed_scaling_factor));
    }
    be_.moe_router_backward(dlogits, dw, y.router_logits.view({BT, E}), y.moe_idx.view({RK}),
                            BT, E, K, cfg_.normalize_top_k());
  }
  if (cfg_.aux_loss()) {  // the load-balancing loss's gradient through this layer's softmax
    be_.moe_aux_loss_backward(dlogits, y.router_logits.view({BT, E}), a.moe_dprobs.view(), BT, E);
  }
  linear_weight_grad(be_, BT, dlogits, dln, G(x.router),
                     x.router_b >= 0 ? G(x.router_b) : TensorView{}, E, C);
  // The shared expert: d output (Qwen2-MoE: and d logit through the sigmoid gate; GLM-4.5:
  // dres itself), then its SwiGLU's weight gradients (ln2 still in dln); its input gradient
  // joins below
  const bool shared = cfg_.shared_expert(), gated = cfg_.shared_expert_gated();
  const int64_t Is = cfg_.shared_size();
  auto view = [&](const DeviceBuffer& buf, int64_t width, bool has = true) {
    return shared && has ? buf.view({BT, width}) : TensorView{};
  };
  const TensorView s_gate = view(y.s_gate, Is), s_up = view(y.s_up, Is), s_act = view(a.s_act, Is),
                   s_dup = view(a.s_dup, Is), s_dlogit = view(a.s_dlogit, 1, gated),
                   s_dout = gated ? view(a.s_dout, C) : dres;
  if (shared) {
    if (gated) {
      be_.moe_shared_gate_backward(s_dout, a.s_dlogit.view({BT}), dres,
                                   y.shared_out.view({BT, C}), y.shared_logit.view({BT}), BT, C);
    }
    be_.swiglu_forward(s_act, s_gate, s_up);  // act again (the same kernel, the same bits)
    be_.gemm(true, false, C, Is, BT, 1.f, s_dout, s_act, 1.f, G(x.s_down));
    be_.gemm(false, false, BT, Is, C, 1.f, s_dout, W(x.s_down), 0.f, s_act);  // d act
    be_.swiglu_backward(s_act, s_dup, s_act, s_gate, s_up);  // d gate into s_act, d up
    be_.gemm(true, false, Is, C, BT, 1.f, s_act, dln, 1.f, G(x.s_gate));
    be_.gemm(true, false, Is, C, BT, 1.f, s_dup, dln, 1.f, G(x.s_up));
    if (gated) be_.gemm(true, false, 1, C, BT, 1.f, s_dlogit, dln, 1.f, G(x.s_sigmoid));
  }
  // d ln2 = each token's routed rows' gradients summed + d logits @ gate (+ the shared
  // expert's: through its gate and up projections and its sigmoid gate); then the norm
  if (cfg_.input_scaled_routing()) {
    rt_.cast(dln, a.moe_dxs.view({BT, C}));
  } else {
    be_.moe_combine_forward(dln, rows, TensorView{}, slot, BT, K, C);
  }
  be_.gemm(false, false, BT, C, E, 1.f, dlogits, W(x.router), 1.f, dln);
  if (shared) {
    be_.gemm(false, false, BT, C, Is, 1.f, s_act, W(x.s_gate), 1.f, dln);
    be_.gemm(false, false, BT, C, Is, 1.f, s_dup, W(x.s_up), 1.f, dln);
    if (gated) be_.gemm(false, false, BT, C, 1, 1.f, s_dlogit, W(x.s_sigmoid), 1.f, dln);
  }
  be_.rmsnorm_backward(dres, G(x.mlp_in), dln, res2, norm_weight, y.ln2_rstd.view({BT}), BT, C);
}

namespace {
// Expert e's [rows, cols] slice of a packed expert tensor [E, rows, cols] (gpt-oss's
// gate_up_proj [E, C, 2I], down_proj [E, I, C], and the biases as [E, 1, n]).
TensorView packed_slice(const TensorView& t, int64_t e, int64_t rows, int64_t cols) {
  return t.slice(e * rows * cols, rows * cols).reshape({rows, cols});
}
}  // namespace

void LlamaModel::packed_experts_forward(int64_t l, int64_t BT, ModuleHooks& hooks) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, I = cfg_.expert_size();
  const int64_t RK = BT * cfg_.num_experts_per_tok;
  const std::vector<int64_t>& off = y.moe_offsets;
  // gate_up [n, 2I] = x @ gate_up_proj[e] + gate_up_proj_bias[e] (HF's layout: [C, 2I], no
  // transpose), act = clamped SwiGLU of its interleaved pairs into dI1, then down_proj[e]
  // ([I, C]) and its bias into the experts' outputs
  for (int64_t e = 0; e < E; ++e) {
    const TensorView in = expert_rows(a.moe_rows, off, e, C);
    if (in.numel() == 0) continue;
    be_.gemm_bias(false, false, in.shape[0], 2 * I, C, in,
                  packed_slice(W(x.px_gate_up), e, C, 2 * I),
                  packed_slice(W(x.px_gate_up_b), e, 1, 2 * I), expert_rows(y.gate, off, e, 2 * I));
  }
  be_.clamped_swiglu_forward(a.dI1.view({RK, I}), y.gate.view({RK, 2 * I}),
                             LlamaConfig::kClampedSwigluAlpha, LlamaConfig::kClampedSwigluLimit);
  for (int64_t e = 0; e < E; ++e) {
    const TensorView act = expert_rows(a.dI1, off, e, I);
    if (act.numel() == 0) continue;
    be_.gemm_bias(false, false, act.shape[0], C, I, act, packed_slice(W(x.px_down), e, I, C),
                  packed_slice(W(x.px_down_b), e, 1, C), expert_rows(y.expert_out, off, e, C));
  }
}

void LlamaModel::packed_experts_backward(int64_t l, int64_t BT, ModuleHooks& hooks,
                                         bool recompute) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto G = [&](int k) { return hooks.grad(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, I = cfg_.expert_size();
  const int64_t RK = BT * cfg_.num_experts_per_tok;
  const std::vector<int64_t>& off = y.moe_offsets;
  const float alpha = LlamaConfig::kClampedSwigluAlpha, limit = LlamaConfig::kClampedSwigluLimit;
  const TensorView gate_up = y.gate.view({RK, 2 * I}), act = a.dI1.view({RK, I});
  // act again into dI1 (the recompute has left it there)
  if (!recompute) be_.clamped_swiglu_forward(act, gate_up, alpha, limit);
  // down: d W[e] += act^T dy, d b[e] += sum dy, then d act = dy @ W[e]^T over act's rows
  for (int64_t e = 0; e < E; ++e) {
    const TensorView dy = expert_rows(a.moe_rows, off, e, C);
    if (dy.numel() == 0) continue;
    const int64_t n = dy.shape[0];
    const TensorView act_e = expert_rows(a.dI1, off, e, I);
    be_.gemm(true, false, I, C, n, 1.f, act_e, dy, 1.f, packed_slice(G(x.px_down), e, I, C));
    be_.bias_backward(packed_slice(G(x.px_down_b), e, 1, C), dy, n, C);
    be_.gemm(false, true, n, I, C, 1.f, dy, packed_slice(W(x.px_down), e, I, C), 0.f, act_e);
  }
  // d gate_up over gate_up itself (the forward's last reader), then the routed rows again
  // (ln2 in dln), read by the gate_up weight gradients before each expert's input gradient
  // replaces its rows
  be_.clamped_swiglu_backward(gate_up, act, gate_up, alpha, limit);
  be_.embedding_lookup_forward(a.moe_rows.view({RK, C}), y.moe_src.view({RK}),
                               a.dln.view({BT, C}), RK, C);
  for (int64_t e = 0; e < E; ++e) {
    const TensorView in = expert_rows(a.moe_rows, off, e, C);
    if (in.numel() == 0) continue;
    const int64_t n = in.shape[0];
    const TensorView dgu = expert_rows(y.gate, off, e, 2 * I);
    be_.gemm(true, false, C, 2 * I, n, 1.f, in, dgu, 1.f,
             packed_slice(G(x.px_gate_up), e, C, 2 * I));
    be_.bias_backward(packed_slice(G(x.px_gate_up_b), e, 1, 2 * I), dgu, n, 2 * I);
    be_.gemm(false, true, n, C, 2 * I, 1.f, dgu, packed_slice(W(x.px_gate_up), e, C, 2 * I), 0.f,
             in);
  }
}

namespace {
// The calls of a causal attention over B sequences of T tokens in chunks of `chunk` positions
// (0 or >= T: one call): `f(row0, b, t, lse0)` attends b sequences of t tokens from row row0,
// their logsumexp from element lse0 ([b, H, t]). Whole chunks are sequences of their own (a
// reshape); a shorter last chunk of each sequence is its own call.
template <class F>
void for_chunks(int64_t B, int64_t T, int64_t H, int64_t chunk, F&& f) {
  if (chunk <= 0 || chunk >= T) {
    f(0, B, T, 0);
    return;
  }
  const int64_t whole = T / chunk, tail = T % chunk;
  if (tail == 0) {
    f(0, B * whole, chunk, 0);
    return;
  }
  for (int64_t b = 0; b < B; ++b) {
    f(b * T, whole, chunk, b * H * T);
    f(b * T + whole * chunk, 1, tail, b * H * T + whole * H * chunk);
  }
}
}  // namespace

void LlamaModel::chunked_attention_forward(int64_t l, int64_t B, int64_t T, const TensorView& out,
                                           const TensorView& lse, const TensorView& q,
                                           const TensorView& k, const TensorView& v) {
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.kv_heads(), D = cfg_.head_size();
  const int64_t Q = H * D, KV = Hkv * D;
  const float scale = cfg_.attention_scale();
  if (docs_.positions) {  // one call: the chunks' starts in the documents' (chunk_doc_start)
    be_.gqa_attention_forward(out, lse, q, k, v, B, T, H, Hkv, D, scale, 0, 0.f,
                              chunk_doc_start(l, B * T));
    return;
  }
  for_chunks(B, T, H, cfg_.layer_chunk(l), [&](int64_t r0, int64_t b, int64_t t, int64_t l0) {
    be_.gqa_attention_forward(out.slice(r0 * Q, b * t * Q), lse.slice(l0, b * H * t),
                              q.slice(r0 * Q, b * t * Q), k.slice(r0 * KV, b * t * KV),
                              v.slice(r0 * KV, b * t * KV), b, t, H, Hkv, D, scale, 0, 0.f,
                              TensorView{});
  });
}

void LlamaModel::chunked_attention_backward(int64_t l, int64_t B, int64_t T, const TensorView& dq,
                                            const TensorView& dk, const TensorView& dv,
                                            const TensorView& dout, const TensorView& q,
                                            const TensorView& k, const TensorView& v,
                                            const TensorView& out, const TensorView& lse) {
  const int64_t H = cfg_.num_attention_heads, Hkv = cfg_.kv_heads(), D = cfg_.head_size();
  const int64_t Q = H * D, KV = Hkv * D;
  const float scale = cfg_.attention_scale();
  if (docs_.positions) {  // as forward's one call
    be_.gqa_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, B, T, H, Hkv, D, scale, 0,
                               0.f, chunk_doc_start(l, B * T));
    return;
  }
  for_chunks(B, T, H, cfg_.layer_chunk(l), [&](int64_t r0, int64_t b, int64_t t, int64_t l0) {
    auto sq = [&](const TensorView& x) { return x.slice(r0 * Q, b * t * Q); };
    auto skv = [&](const TensorView& x) { return x.slice(r0 * KV, b * t * KV); };
    be_.gqa_attention_backward(sq(dq), skv(dk), skv(dv), sq(dout), sq(q), skv(k), skv(v), sq(out),
                               lse.slice(l0, b * H * t), b, t, H, Hkv, D, scale, 0, 0.f,
                               TensorView{});
  });
}

void LlamaModel::llama4_attention_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                          const TensorView& xin) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.kv_heads(), D = cfg_.head_size(), Q = H * D, KV = Hkv * D;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const TensorView q = y.q.view({BT, Q}), k = y.k.view({BT, KV}), v = y.v.view({BT, KV});
  auto proj = [&](const TensorView& out, int w, int64_t n) {  // (Llama 4: no biases)
    be_.gemm(false, true, BT, n, C, 1.f, xin, W(w), 0.f, out);
  };
  proj(v, x.v_w, KV);
  if (cfg_.layer_rope(l)) {
    // q, k projected into the dq, dk scratch, de-interleaved into ours, rotated; then (qk_norm)
    // L2-normed per head, the rotated values kept in q_raw, k_raw for the backward
    const bool norm = cfg_.use_qk_norm;
    const TensorView qr = norm ? y.q_raw.view({BT, Q}) : q, kr = norm ? y.k_raw.view({BT, KV}) : k;
    const TensorView pq = a.dq.view({BT, Q}), pk = a.dk.view({BT, KV});
    proj(pq, x.q_w, Q);
    proj(pk, x.k_w, KV);
    pair_layout(be_, qr, pq, BT, H, D, true);
    pair_layout(be_, kr, pk, BT, Hkv, D, true);
    const RopeTables rope = rope_tables(false, B, T);  // R = D
    be_.rope_forward(qr, qr, rope.cos, rope.sin, rope.B, rope.T, H, D, D);
    be_.rope_forward(kr, kr, rope.cos, rope.sin, rope.B, rope.T, Hkv, D, D);
    if (norm) {
      const TensorView ones = a.ones.view().slice(0, D);
      be_.rmsnorm_forward(y.q.view({BT * H, D}), y.q_rstd.view({BT * H}),
                          y.q_raw.view({BT * H, D}), ones, BT * H, D, eps);
      be_.rmsnorm_forward(y.k.view({BT * Hkv, D}), y.k_rstd.view({BT * Hkv}),
                          y.k_raw.view({BT * Hkv, D}), ones, BT * Hkv, D, eps);
    }
  } else {  // NoPE: q times the temperature where it is not 1
    proj(q, x.q_w, Q);
    proj(k, x.k_w, KV);
    if (a.temp_cos.numel() > 0) {
      be_.rope_forward(q, q, a.temp_cos.view({T, D / 2}), a.temp_sin.view({T, D / 2}), B, T, H, D,
                       D);
    }
  }
  chunked_attention_forward(l, B, T, y.atty.view({BT, Q}), y.lse.view({B, H, T}), q, k, v);
}

void LlamaModel::llama4_attention_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                           const TensorView& xin, const TensorView& dxin) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto G = [&](int k) { return hooks.grad(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.kv_heads(), D = cfg_.head_size(), Q = H * D, KV = Hkv * D;
  const TensorView q = y.q.view({BT, Q}), k = y.k.view({BT, KV}), v = y.v.view({BT, KV});
  const TensorView datty = a.datty.view({BT, Q}), dq = a.dq.view({BT, Q}), dk = a.dk.view({BT, KV}),
                   dv = a.dv.view({BT, KV});
  chunked_attention_backward(l, B, T, dq, dk, dv, datty, q, k, v, y.atty.view({BT, Q}),
                             y.lse.view({B, H, T}));
  // The projections' output gradients in HF's layout: dq_proj, dk_proj
  TensorView dq_proj = dq, dk_proj = dk;
  if (cfg_.layer_rope(l)) {
    const RopeTables rope = rope_tables(false, B, T);  // R = D
    if (cfg_.use_qk_norm) {
      // d q_raw into datty (free since the attention's backward; the norm's backward adds into
      // zeros), back through RoPE, re-interleaved into dq; then k the same way through datty's
      // first BT*KV values into dk. The weightless norm's weight gradient goes to scratch.
      const TensorView ones = a.ones.view().slice(0, D), dw = a.norm_w.view().slice(4 * C, D);
      rt_.fill_zero(datty);
      be_.rmsnorm_backward(a.datty.view({BT * H, D}), dw, a.dq.view({BT * H, D}),
                           y.q_raw.view({BT * H, D}), ones, y.q_rstd.view({BT * H}), BT * H, D);
      be_.rope_backward(datty, datty, rope.cos, rope.sin, rope.B, rope.T, H, D, D);
      pair_layout(be_, datty, dq, BT, H, D, false);
      const TensorView dkr = a.datty.view().slice(0, BT * KV).reshape({BT, KV});
      rt_.fill_zero(dkr);
      be_.rmsnorm_backward(dkr.reshape({BT * Hkv, D}), dw, a.dk.view({BT * Hkv, D}),
                           y.k_raw.view({BT * Hkv, D}), ones, y.k_rstd.view({BT * Hkv}),
                           BT * Hkv, D);
      be_.rope_backward(dkr, dkr, rope.cos, rope.sin, rope.B, rope.T, Hkv, D, D);
      pair_layout(be_, dkr, dk, BT, Hkv, D, false);
    } else {  // back through RoPE in place, re-interleaved: q into datty, k into dq (then free)
      be_.rope_backward(dq, dq, rope.cos, rope.sin, rope.B, rope.T, H, D, D);
      pair_layout(be_, dq, datty, BT, H, D, false);
      dq_proj = datty;
      be_.rope_backward(dk, dk, rope.cos, rope.sin, rope.B, rope.T, Hkv, D, D);
      dk_proj = a.dq.view().slice(0, BT * KV).reshape({BT, KV});
      pair_layout(be_, dk, dk_proj, BT, Hkv, D, false);
    }
  } else if (a.temp_cos.numel() > 0) {  // d q_proj = d q times the temperature
    be_.rope_backward(dq, dq, a.temp_cos.view({T, D / 2}), a.temp_sin.view({T, D / 2}), B, T, H,
                      D, D);
  }
  // the three weight gradients read xin before the input gradients replace it (dxin may be xin)
  be_.gemm(true, false, Q, C, BT, 1.f, dq_proj, xin, 1.f, G(x.q_w));
  be_.gemm(true, false, KV, C, BT, 1.f, dk_proj, xin, 1.f, G(x.k_w));
  be_.gemm(true, false, KV, C, BT, 1.f, dv, xin, 1.f, G(x.v_w));
  be_.gemm(false, false, BT, C, Q, 1.f, dq_proj, W(x.q_w), 0.f, dxin);
  be_.gemm(false, false, BT, C, KV, 1.f, dk_proj, W(x.k_w), 1.f, dxin);
  be_.gemm(false, false, BT, C, KV, 1.f, dv, W(x.v_w), 1.f, dxin);
}

void LlamaModel::llama4_experts_forward(int64_t l, int64_t BT, ModuleHooks& hooks) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, I = cfg_.expert_size();
  const std::vector<int64_t>& off = y.moe_offsets;
  // Expert e's n rows: gate_up^T [2I, n] = gate_up_proj[e]^T rows^T (HF's [C, 2I]; transposed
  // so that gate's I rows and up's are contiguous), act^T [I, n] = silu(gate) * up, out [n, C]
  // = act down_proj[e] ([I, C])
  for (int64_t e = 0; e < E; ++e) {
    const TensorView in = expert_rows(a.moe_rows, off, e, C);
    if (in.numel() == 0) continue;
    const int64_t n = in.shape[0];
    const TensorView gu = expert_rows(y.gate, off, e, 2 * I).reshape({2 * I, n});
    const TensorView act = expert_rows(a.dI1, off, e, I).reshape({I, n});
    be_.gemm(true, true, 2 * I, n, C, 1.f, packed_slice(W(x.px_gate_up), e, C, 2 * I), in, 0.f, gu);
    be_.swiglu_forward(act, gu.slice(0, I * n), gu.slice(I * n, I * n));
    be_.gemm(true, false, n, C, I, 1.f, act, packed_slice(W(x.px_down), e, I, C), 0.f,
             expert_rows(y.expert_out, off, e, C));
  }
}

void LlamaModel::llama4_experts_backward(int64_t l, int64_t BT, ModuleHooks& hooks,
                                         bool recompute) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto G = [&](int k) { return hooks.grad(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t C = cfg_.hidden_size, E = cfg_.num_experts, I = cfg_.expert_size();
  const int64_t RK = BT * cfg_.num_experts_per_tok;
  const std::vector<int64_t>& off = y.moe_offsets;
  // down: d W[e] += act^T dy (act^T [I, n] kept in dI1 or recomputed), d act^T = W[e] dy^T over
  // it, then d gate and d up over gate_up^T itself (swiglu_backward in place)
  for (int64_t e = 0; e < E; ++e) {
    const TensorView dy = expert_rows(a.moe_rows, off, e, C);
    if (dy.numel() == 0) continue;
    const int64_t n = dy.shape[0];
    const TensorView gu = expert_rows(y.gate, off, e, 2 * I).reshape({2 * I, n});
    const TensorView act = expert_rows(a.dI1, off, e, I).reshape({I, n});
    const TensorView gate = gu.slice(0, I * n), up = gu.slice(I * n, I * n);
    if (!recompute) be_.swiglu_forward(act, gate, up);
    be_.gemm(false, false, I, C, n, 1.f, act, dy, 1.f, packed_slice(G(x.px_down), e, I, C));
    be_.gemm(false, true, I, n, C, 1.f, packed_slice(W(x.px_down), e, I, C), dy, 0.f, act);
    be_.swiglu_backward(gate, up, act, gate, up);
  }
  // the scaled inputs again (ln2 in dln times each token's score), gathered into the rows, read
  // by the gate_up weight gradients before each expert's input gradient replaces them
  be_.moe_combine_forward(a.moe_xs.view({BT, C}), a.dln.view({BT, C}), y.moe_w.view({RK}),
                          a.moe_identity.view({BT}), BT, 1, C);
  be_.embedding_lookup_forward(a.moe_rows.view({RK, C}), y.moe_src.view({RK}),
                               a.moe_xs.view({BT, C}), RK, C);
  for (int64_t e = 0; e < E; ++e) {
    const TensorView in = expert_rows(a.moe_rows, off, e, C);
    if (in.numel() == 0) continue;
    const int64_t n = in.shape[0];
    const TensorView dgu = expert_rows(y.gate, off, e, 2 * I).reshape({2 * I, n});
    be_.gemm(true, true, C, 2 * I, n, 1.f, in, dgu, 1.f,
             packed_slice(G(x.px_gate_up), e, C, 2 * I));
    be_.gemm(true, true, n, C, 2 * I, 1.f, dgu, packed_slice(W(x.px_gate_up), e, C, 2 * I), 0.f,
             in);
  }
}

void LlamaModel::linear_attention_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                          const TensorView& xin) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t BT = B * T, C = cfg_.hidden_size, CD = cfg_.linear_conv_dim(),
                Vd = cfg_.linear_value_dim(), Hv = cfg_.linear_num_value_heads,
                Dv = cfg_.linear_value_head_dim, K = cfg_.linear_conv_kernel_dim;
  auto proj = [&](const DeviceBuffer& out, int w, int64_t n) {
    linear_forward(be_, BT, out.view({BT, n}), xin, W(w), TensorView{}, n, C);
  };
  proj(y.la_qkv_pre, x.la_qkv, CD);
  proj(y.la_z, x.la_z, Vd);
  proj(y.la_b, x.la_b, Hv);
  proj(y.la_a, x.la_a, Hv);
  // conv1d.weight [CD, 1, K] is the kernel's [CD, K]
  be_.causal_conv1d_forward(y.la_qkv.view({BT, CD}), y.la_qkv_pre.view({BT, CD}),
                            W(x.la_conv).reshape({CD, K}), B, T, CD, K, doc_start(BT));
  be_.gated_delta_rule_forward(y.la_core.view({BT, Vd}), y.la_qkv.view({BT, CD}),
                               y.la_a.view({BT, Hv}), y.la_b.view({BT, Hv}), W(x.la_A),
                               W(x.la_dt), B, T, cfg_.linear_num_key_heads, Hv,
                               cfg_.linear_key_head_dim, Dv, doc_start(BT));
  // each head's RMSNorm (a plain weight), times silu(z)
  be_.rmsnorm_forward(y.la_normed.view({BT * Hv, Dv}), y.la_rstd.view({BT * Hv}),
                      y.la_core.view({BT * Hv, Dv}), W(x.la_norm), BT * Hv, Dv,
                      static_cast<float>(cfg_.rms_norm_eps));
  be_.swiglu_forward(a.o_in.view({BT, Vd}), y.la_z.view({BT, Vd}), y.la_normed.view({BT, Vd}));
}

void LlamaModel::linear_attention_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                           const TensorView& dres, const TensorView& xin,
                                           const TensorView& dxin) {
  Acts& a = *acts_;
  const LayerParams lp = layer_params(cfg_, l);
  const LayerIndex& x = lp.x;
  auto W = [&](int k) { return hooks.param(lp.p0 + k); };
  auto G = [&](int k) { return hooks.grad(lp.p0 + k); };
  auto& y = a.layer(l);
  const int64_t BT = B * T, C = cfg_.hidden_size, CD = cfg_.linear_conv_dim(),
                Vd = cfg_.linear_value_dim(), Hv = cfg_.linear_num_value_heads,
                Dv = cfg_.linear_value_head_dim, K = cfg_.linear_conv_kernel_dim;
  const TensorView o_in = a.o_in.view({BT, Vd}), z = y.la_z.view({BT, Vd}),
                   normed = y.la_normed.view({BT, Vd}), dz = a.la_dz.view({BT, Vd}),
                   dn = a.la_dn.view({BT, Vd}), dcore = a.la_dcore.view({BT, Vd}),
                   dqkv = a.la_dqkv.view({BT, CD}), dqkv_pre = a.la_dqkv_pre.view({BT, CD}),
                   da = a.la_da.view({BT, Hv}), db = a.la_db.view({BT, Hv});
  // out_proj: its input silu(z) * normed again into o_in, read by the weight gradient, then
  // d o_in over it
  be_.swiglu_forward(o_in, z, normed);
  linear_weight_grad(be_, BT, dres, o_in, G(x.o_w), TensorView{}, C, Vd);
  be_.gemm(false, false, BT, Vd, C, 1.f, dres, W(x.o_w), 0.f, o_in);
  be_.swiglu_backward(dz, dn, o_in, z, normed);
  rt_.fill_zero(dcore);  // (rmsnorm_backward accumulates)
  be_.rmsnorm_backward(dcore.reshape({BT * Hv, Dv}), G(x.la_norm), dn.reshape({BT * Hv, Dv}),
                       y.la_core.view({BT * Hv, Dv}), W(x.la_norm), y.la_rstd.view({BT * Hv}),
                       BT * Hv, Dv);
  be_.gated_delta_rule_backward(dqkv, da, db, G(x.la_A), G(x.la_dt), dcore,
                                y.la_qkv.view({BT, CD}), y.la_a.view({BT, Hv}),
                                y.la_b.view({BT, Hv}), W(x.la_A), W(x.la_dt), B, T,
                                cfg_.linear_num_key_heads, Hv, cfg_.linear_key_head_dim, Dv,
                                doc_start(BT));
  be_.causal_conv1d_backward(dqkv_pre, G(x.la_conv).reshape({CD, K}), dqkv,
                             y.la_qkv_pre.view({BT, CD}), W(x.la_conv).reshape({CD, K}), B, T,
                             CD, K, doc_start(BT));
  // the four projections of xin: weight gradients (xin read), then d xin
  const std::tuple<TensorView, int, int64_t> projections[] = {
      {dqkv_pre, x.la_qkv, CD}, {dz, x.la_z, Vd}, {db, x.la_b, Hv}, {da, x.la_a, Hv}};
  for (const auto& [d, w, n] : projections) {
    linear_weight_grad(be_, BT, d, xin, G(w), TensorView{}, n, C);
  }
  for (std::size_t i = 0; i < std::size(projections); ++i) {  // (= the first, += the others)
    const auto& [d, w, n] = projections[i];
    be_.gemm(false, false, BT, C, n, 1.f, d, W(w), i == 0 ? 0.f : 1.f, dxin);
  }
}

LmHeadChunks LlamaModel::head_chunks(int64_t BT, const TensorView& weight) const {
  const int64_t C = cfg_.hidden_size, Vp = cfg_.padded_vocab();
  return {acts_->lnf.view({BT, C}), weight, acts_->targets_dev.view({BT}), acts_->logits.view(),
          BT, C, cfg_.vocab_size, Vp, cfg_.fused_lce.chunk_for(BT, C, Vp), cfg_.logit_scale(),
          cfg_.logit_softcap()};
}

void LlamaModel::backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                          const TensorView& loss) {
  Acts& a = *acts_;
  const int64_t BT = B * T, C = cfg_.hidden_size, H = cfg_.num_attention_heads,
                Hkv = cfg_.kv_heads(), D = cfg_.head_size();
  const int64_t Q = H * D, KV = Hkv * D, Vp = cfg_.padded_vocab(), L = cfg_.num_hidden_layers;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  auto rows = [&](const DeviceBuffer& b, int64_t width) { return b.view({BT, width}); };
  const TensorView dres = rows(a.dres, C), dln = rows(a.dln, C), datty = rows(a.datty, Q),
                   dq = rows(a.dq, Q), dk = rows(a.dk, KV), dv = rows(a.dv, KV);

  // LM head and norm. a.logits holds dlogits [BT,Vp] after the fused cross-entropy (0 in the
  // padding columns). Chunked (model.fused_linear_cross_entropy): the head's forward, loss
  // and backward, chunk by chunk.
  const bool tied = cfg_.tie_word_embeddings;
  const int m_norm = static_cast<int>(1 + L), p_norm = layer_params(cfg_, L).p0;
  const int m_head = tied ? m_norm : m_norm + 1, p_head = tied ? 0 : p_norm + 1;
  hooks.pre_backward(m_head);
  if (cfg_.fused_lce.enabled) {
    lm_head_chunks_backward(be_, head_chunks(BT, hooks.param(p_head)), grad_scale, loss,
                            hooks.grad(p_head), dln);
  } else {
    const TensorView dlogits = rows(a.logits, Vp);
    const float ls = cfg_.logit_scale();
    be_.gemm(true, false, Vp, C, BT, ls, dlogits, rows(a.lnf, C), 1.f, hooks.grad(p_head));
    be_.gemm(false, false, BT, C, Vp, ls, dlogits, hooks.param(p_head), 0.f, dln);
  }
  if (!tied) {
    hooks.post_backward(m_head);
    hooks.pre_backward(m_norm);
  }
  rt_.fill_zero(dres);
  be_.rmsnorm_backward(dres, hooks.grad(p_norm), dln, rows(a.res[L], C),
                       norm_weight(rt_, cfg_, hooks.param(p_norm), a.ones, a.norm_w, 0),
                       a.lnf_rstd.view({BT}), BT, C);
  hooks.post_backward(m_norm);

  for (int64_t l = L - 1; l >= 0; --l) {
    const int m = static_cast<int>(1 + l);
    const LayerParams lp = layer_params(cfg_, l);
    const LayerIndex& x = lp.x;
    const int p0 = lp.p0;
    // The dense MLP's views (a sparse one's are moe_backward's), I wide (Llama 4's dense layers:
    // intermediate_size_mlp)
    const bool sparse = cfg_.layer_sparse(l);
    const int64_t I = cfg_.mlp_width(l);
    auto mlp_rows = [&](const DeviceBuffer& b) { return sparse ? TensorView{} : rows(b, I); };
    const TensorView dI1 = mlp_rows(a.dI1), dI2 = mlp_rows(a.dI2);
    auto W = [&](int k) {
      return layer_slot(cfg_, x, k, [&](int i) { return hooks.param(p0 + i); });
    };
    auto G = [&](int k) {
      return layer_slot(cfg_, x, k, [&](int i) { return hooks.grad(p0 + i); });
    };
    auto& y = a.layer(l);
    hooks.pre_backward(m);
    const bool recompute = checkpointing_.recomputes(l);
    if (recompute) layer_forward(l, B, T, hooks, /*write_output=*/false);
    const LayerNorms nw = layer_norms(rt_, cfg_, x, W, a.ones, a.norm_w);
    const int64_t R = cfg_.rotary_dim();
    const RopeTables rope = rope_tables(cfg_.layer_local_rope(l), B, T);
    // Linear out = inp @ W^T + b, given dout: dW += dout^T inp, db += sum dout
    // (linear_wgrad), and din (=, or += when `accumulate`) dout @ W (linear_dgrad); `alpha`
    // scales dout (Granite's residual_multiplier on o_proj and down_proj; no bias then).
    auto linear_wgrad = [&](const TensorView& dout, const TensorView& inp, int w, int b,
                            int64_t n, int64_t m_in, float alpha = 1.f) {
      linear_weight_grad(be_, BT, dout, inp, G(w), b >= 0 ? G(b) : TensorView{}, n, m_in, alpha);
    };
    auto linear_dgrad = [&](const TensorView& din, const TensorView& dout, int w, int64_t n,
                            int64_t m_in, bool accumulate, float alpha = 1.f) {
      be_.gemm(false, false, BT, m_in, n, alpha, dout, W(w), accumulate ? 1.f : 0.f, din);
    };
    auto linear_backward = [&](const TensorView& din, const TensorView& dout, const TensorView& inp,
                               int w, int b, int64_t n, int64_t m_in, bool accumulate,
                               float alpha = 1.f) {
      linear_wgrad(dout, inp, w, b, n, m_in, alpha);
      linear_dgrad(din, dout, w, n, m_in, accumulate, alpha);
    };
    const float rs = cfg_.residual_scale();
    // MLP: dres = d res[l+1] = d (res2 + down(act)), OLMo 2 and Gemma 3: d (res2 +
    // norm(down(act))). act = silu(gate) * up (Gemma 3: gelu_tanh(gate) * up) into dI1 (the
    // checkpointing recompute has just put it there); linear_backward reads it for the weight
    // gradient before it writes d act over it.
    const bool before = cfg_.norm_before(), after = cfg_.norm_after();
    const TensorView gate = mlp_rows(y.gate), res2 = rows(y.res2, C),
                     up = sparse ? TensorView{} : dense_up(y.gate, y.up, BT, I);
    if (sparse) {
      moe_backward(l, BT, hooks, nw.mlp_in, recompute);
    } else {
      if (after) {  // d m (m = down(act) in ln2) into dln: rmsnorm_backward adds to zeros
        rt_.fill_zero(dln);
        be_.rmsnorm_backward(dln, G(x.mlp_out), dres, rows(y.ln2, C), nw.mlp_out,
                             y.m_rstd.view({BT}), BT, C);
      }
      if (!recompute) {
        if (cfg_.gelu_mlp()) {
          be_.geglu_forward(dI1, gate, up);
        } else {
          be_.swiglu_forward(dI1, gate, up);
        }
      }
      linear_backward(dI1, after ? dln : dres, dI1, x.down_w, x.down_b, C, I, false, rs);  // d act
      if (cfg_.gelu_mlp()) {                                                        // d gate, d up
        be_.geglu_backward(dI1, dI2, dI1, gate, up);
      } else {
        be_.swiglu_backward(dI1, dI2, dI1, gate, up);
      }
      if (after) {
        // The MLP read res2 itself (OLMo 2: its input gradient adds to dres = d res2), or
        // pre_feedforward_layernorm(res2) (Gemma 3: again into dln, read by both weight
        // gradients before d ln2 replaces it, then through the norm into dres).
        if (before) be_.rmsnorm_forward(dln, y.ln2_rstd.view({BT}), res2, nw.mlp_in, BT, C, eps);
        const TensorView hin = before ? dln : res2, dhin = before ? dln : dres;
        linear_wgrad(dI1, hin, x.gate_w, x.gate_b, I, C);
        linear_wgrad(dI2, hin, x.up_w, x.up_b, I, C);
        linear_dgrad(dhin, dI1, x.gate_w, I, C, !before);
        linear_dgrad(dhin, dI2, x.up_w, I, C, true);
        if (before) {
          be_.rmsnorm_backward(dres, G(x.mlp_in), dln, res2, nw.mlp_in, y.ln2_rstd.view({BT}), BT,
                               C);
        }
        // res2 = in + post_attention_layernorm(o), o = o_proj(atty) in ln1: d o into dln
        rt_.fill_zero(dln);
        be_.rmsnorm_backward(dln, G(x.attn_out), dres, rows(y.ln1, C), nw.attn_out,
                             y.o_rstd.view({BT}), BT, C);
      } else {
        // ln2 = post_attention_layernorm(res2) again into dln (Acts::dln; the checkpointing
        // recompute has left it there), read by both weight gradients before d ln2 replaces it
        if (!recompute) {
          be_.rmsnorm_forward(dln, y.ln2_rstd.view({BT}), res2, nw.mlp_in, BT, C, eps);
        }
        linear_wgrad(dI1, dln, x.gate_w, x.gate_b, I, C);
        linear_wgrad(dI2, dln, x.up_w, x.up_b, I, C);
        linear_dgrad(dln, dI1, x.gate_w, I, C, false);
        linear_dgrad(dln, dI2, x.up_w, I, C, true);  // d ln2
        be_.rmsnorm_backward(dres, G(x.mlp_in), dln, res2, nw.mlp_in, y.ln2_rstd.view({BT}), BT,
                             C);  // dres = d res2
      }
    }
    if (cfg_.mla()) {  // (a pre-norm layer: dres = d res2)
      mla_backward(l, B, T, hooks, nw.attn_in, G(x.attn_in));
      hooks.post_backward(m);
      continue;
    }
    if (cfg_.layer_linear(l)) {  // (a pre-norm layer: its input ln1 again into dln, d ln1 over it)
      be_.rmsnorm_forward(dln, y.ln1_rstd.view({BT}), rows(a.res[l], C), nw.attn_in, BT, C, eps);
      linear_attention_backward(l, B, T, hooks, dres, dln, dln);
      be_.rmsnorm_backward(dres, G(x.attn_in), dln, rows(a.res[l], C), nw.attn_in,
                           y.ln1_rstd.view({BT}), BT, C);
      hooks.post_backward(m);
      continue;
    }
    // attention: res2 = in + o_proj(atty) (OLMo 2, Gemma 3: d o in dln); Qwen3.5's o_proj
    // reads atty * sigmoid(gate), recomputed into Acts::o_in, whose gradient goes through the
    // gate (d gate into o_in: o_proj's weight gradient has read it)
    const bool gated = cfg_.gated_attention();
    const TensorView gate_in = gated ? rows(y.attn_gate, Q) : TensorView{},
                     o_in = gated ? rows(a.o_in, Q) : rows(y.atty, Q);
    if (gated) be_.sigmoid_gate_forward(o_in, rows(y.atty, Q), gate_in);
    linear_backward(datty, after ? dln : dres, o_in, x.o_w, x.o_b, C, Q, false, rs);
    if (gated) be_.sigmoid_gate_backward(datty, o_in, datty, rows(y.atty, Q), gate_in);
    if (cfg_.llama4()) {  // (a pre-norm layer: its input ln1 again into dln, d ln1 over it)
      be_.rmsnorm_forward(dln, y.ln1_rstd.view({BT}), rows(a.res[l], C), nw.attn_in, BT, C, eps);
      llama4_attention_backward(l, B, T, hooks, dln, dln);
      be_.rmsnorm_backward(dres, G(x.attn_in), dln, rows(a.res[l], C), nw.attn_in,
                           y.ln1_rstd.view({BT}), BT, C);
      hooks.post_backward(m);
      continue;
    }
    if (cfg_.attention_sinks()) {  // d sinks from the sinked out and lse (attention_sink_forward)
      be_.attention_sink_backward(G(x.sinks), datty, rows(y.atty, Q), y.lse.view({B, H, T}),
                                  W(x.sinks), B, T, H, D);
    }
    be_.gqa_attention_backward(dq, dk, dv, datty, rows(y.q, Q), rows(y.k, KV), rows(y.v, KV),
                               rows(y.atty, Q), y.lse.view({B, H, T}), B, T, H, Hkv, D,
                               cfg_.attention_scale(), cfg_.layer_window(l),
                               cfg_.attention_softcap(), doc_start(BT));
    if (cfg_.layer_rope(l)) {
      be_.rope_backward(dq, dq, rope.cos, rope.sin, rope.B, rope.T, H, D, R);
      be_.rope_backward(dk, dk, rope.cos, rope.sin, rope.B, rope.T, Hkv, D, R);
    }
    // The projections' gradients: d q and d k, or under qk_norm() d q_raw into datty (free
    // since the attention's backward) and d k_raw into dq (free once q_norm's backward has
    // read d q): rmsnorm_backward accumulates into zeros.
    TensorView dq_proj = dq, dk_proj = dk;
    if (cfg_.qk_norm()) {
      const QkNormRows n = qk_norm_rows(cfg_, BT);
      rt_.fill_zero(datty);
      be_.rmsnorm_backward(a.datty.view({n.q, n.q_width}), G(x.q_norm), a.dq.view({n.q, n.q_width}),
                           y.q_raw.view({n.q, n.q_width}), nw.q, y.q_rstd.view({n.q}), n.q,
                           n.q_width);
      dq_proj = datty;
      dk_proj = a.dq.view({BT, KV});
      rt_.fill_zero(dk_proj);
      be_.rmsnorm_backward(a.dq.view({n.k, n.k_width}), G(x.k_norm), a.dk.view({n.k, n.k_width}),
                           y.k_raw.view({n.k, n.k_width}), nw.k, y.k_rstd.view({n.k}), n.k,
                           n.k_width);
    }
    // The projections' input xin: ln1 = input_layernorm(res[l]) again into dln (Acts::dln),
    // read by the three weight gradients before the input gradients replace it with d ln1
    // (then through the input norm); or (OLMo 2) res[l] itself, whose gradient adds to dres.
    if (before) {
      be_.rmsnorm_forward(dln, y.ln1_rstd.view({BT}), rows(a.res[l], C), nw.attn_in, BT, C, eps);
    }
    const TensorView xin = before ? dln : rows(a.res[l], C), dxin = before ? dln : dres;
    int64_t q_rows = Q;  // q_proj's output width
    if (gated) {  // d q_proj's output: each head's [d query | d gate] (d gate in o_in)
      const GatedQ g = gated_q(Q, D);
      be_.strided_copy(rows(a.qg, 2 * Q), g.queries, dq_proj, g.heads, BT, H, D, false);
      be_.strided_copy(rows(a.qg, 2 * Q), g.gates, o_in, g.heads, BT, H, D, false);
      dq_proj = rows(a.qg, 2 * Q);
      q_rows = 2 * Q;
    }
    linear_wgrad(dq_proj, xin, x.q_w, x.q_b, q_rows, C);
    linear_wgrad(dk_proj, xin, x.k_w, x.k_b, KV, C);
    linear_wgrad(dv, xin, x.v_w, x.v_b, KV, C);
    linear_dgrad(dxin, dq_proj, x.q_w, q_rows, C, !before);
    linear_dgrad(dxin, dk_proj, x.k_w, KV, C, true);
    linear_dgrad(dxin, dv, x.v_w, KV, C, true);                                      // d xin
    if (before) {
      be_.rmsnorm_backward(dres, G(x.attn_in), dln, rows(a.res[l], C), nw.attn_in,
                           y.ln1_rstd.view({BT}), BT, C);                         // dres = d res[l]
    }
    hooks.post_backward(m);
  }

  // The embedding: Gemma 3's scale (d lookup = d res[0] * alpha, rounded as HF's product's
  // gradient); nn.Embedding's padding_idx: the lookup adds nothing to row pad_token_id (its
  // gradient so far, the tied head's, kept in Acts::norm_w across the scatter and put back).
  hooks.pre_backward(0);
  if (cfg_.embed_scale() != 1.0) be_.scale(dres, embed_alpha(cfg_, hooks.param(0).dtype));
  const TensorView dtable = hooks.grad(0);
  TensorView pad_row, kept;
  if (cfg_.pad_token_id >= 0) {
    pad_row = dtable.slice(cfg_.pad_token_id * C, C);
    kept = a.norm_w.view().slice(0, C);
    rt_.cast(kept, pad_row);
  }
  be_.embedding_lookup_backward(dtable, dres, a.tokens_dev.view({BT}), BT, C);
  if (pad_row.data != nullptr) rt_.cast(pad_row, kept);
  hooks.post_backward(0);
}

// ---- the "llama" model family (registry entry) ----
namespace {

// Gemma 2's soft-caps, and their config.json names (Gemma 2's keys; Gemma 3's config.json
// carries them as null).
constexpr double LlamaConfig::*kSoftcaps[] = {&LlamaConfig::final_logit_softcapping,
                                              &LlamaConfig::attn_logit_softcapping};
std::string softcap_name(double LlamaConfig::*cap) {
  return llama_args(LlamaArch::gemma2).name(cap);
}

// HF's layer_types of `g`: "sliding_attention" for each layer with a window (layer_window),
// else "full_attention" — the list every class with per-layer windows derives.
nlohmann::json layer_types_of(const LlamaConfig& g) {
  nlohmann::json types = nlohmann::json::array();
  for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
    if (g.llama4()) {  // Llama4TextConfig's: its RoPE layers chunked, whatever the chunk size
      types.push_back(g.layer_rope(l) ? "chunked_attention" : "full_attention");
    } else if (g.qwen3_5()) {  // Qwen3_5TextConfig's, from full_attention_interval
      types.push_back(g.layer_linear(l) ? "linear_attention" : "full_attention");
    } else {
      types.push_back(g.layer_window(l) > 0 ? "sliding_attention" : "full_attention");
    }
  }
  return types;
}

// The input error for a config.json attribute fsdp_train does not implement: "<origin>:
// \"<field>\" <value> is not supported (expected <expected>)".
// The decimal number of `name` from `at` to the next '.' (a layer's or an expert's index in a
// parameter name, "model.layers.12.mlp..."), its dot's position in *dot; nullopt unless 1 to
// 9 digits are followed by a '.'.
std::optional<int64_t> dotted_index(const std::string& name, std::size_t at, std::size_t* dot) {
  *dot = name.find('.', at);
  if (*dot == std::string::npos || *dot == at || *dot - at > 9) return std::nullopt;
  const std::string digits = name.substr(at, *dot - at);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  return std::stoll(digits);
}

Error unsupported(const std::string& origin, const std::string& field, const nlohmann::json& value,
                  const std::string& expected) {
  return InputError(origin + ": \"" + field + "\" " + value.dump() +
                    " is not supported (expected " + expected + ")");
}

// One entry per LlamaArch: the same model, HF's class names, keys and config.json of each.
class LlamaFamily final : public ModelFamily {
 public:
  explicit LlamaFamily(LlamaArch arch) : arch_(arch) {}
  std::string type() const override { return std::string(enum_name(arch_)); }
  std::vector<ModelKey> keys() const override { return args().keys(); }
  std::string hf_config_class() const override { return arch_names(arch_).config_class; }
  std::vector<std::string> hf_model_types() const override {
    if (const char* mm = arch_names(arch_).multimodal) return {type(), mm};
    return {type()};
  }
  std::vector<std::string> wrap_classes() const override { return {layer_class(arch_)}; }
  std::vector<Objective> objectives() const override {
    return {Objective::causal_lm, Objective::sft};
  }
  void validate(const Config& c, const KeyFail& fail) const override {
    const LlamaConfig g = LlamaConfig::from(c.model);
    const auto& a = args();
    const auto n = [](int64_t v) { return std::to_string(v); };
    check_router_bias_update(c, g.selection_bias(), fail);
    if (g.qwen3_5()) {
      if (g.linear_num_value_heads % g.linear_num_key_heads != 0) {
        throw fail(a.key(&LlamaConfig::linear_num_value_heads),
                   n(g.linear_num_value_heads) + " is not a multiple of " +
                       a.key(&LlamaConfig::linear_num_key_heads) + " = " +
                       n(g.linear_num_key_heads) + " (each key head serves a group of value heads)");
      }
      if (c.train.device == DeviceKind::cuda) {
        throw fail("train.device", "\"cuda\" is not supported for qwen3_5_text yet (the CUDA "
                                   "kernels of its linear attention are not written; expected "
                                   "\"cpu\")");
      }
    }
    // Document masking with reset positions: not longrope, whose factors HF picks by the
    // largest position id (ours: by the row's length)
    if (c.data.reset_position_ids && g.rope_type == LlamaConfig::RopeType::longrope) {
      throw fail("data.reset_position_ids",
                 "true is not supported with longrope (HF picks its factors by the largest "
                 "position id; expected false)");
    }
    const bool has_head_dim = has_head_dim_key(arch_);
    if (g.head_dim == 0 && g.hidden_size % g.num_attention_heads != 0) {
      throw fail(a.key(&LlamaConfig::hidden_size),
                 n(g.hidden_size) + " is not divisible by " + a.key(&LlamaConfig::num_attention_heads) +
                     " = " + n(g.num_attention_heads) +
                     (has_head_dim ? " (or set " + a.key(&LlamaConfig::head_dim) + ")" : ""));
    }
    if (g.head_size() % 2 != 0) {
      throw fail(has_head_dim ? a.key(&LlamaConfig::head_dim) : a.key(&LlamaConfig::hidden_size),
                 has_head_dim ? n(g.head_size()) + " is odd (RoPE rotates pairs)"
                              : n(g.hidden_size) + " / " + a.key(&LlamaConfig::num_attention_heads) +
                                    " = " + n(g.head_size()) + " is odd (RoPE rotates pairs)");
    }
    if (g.num_attention_heads % g.kv_heads() != 0) {
      throw fail(a.key(&LlamaConfig::num_key_value_heads),
                 n(g.kv_heads()) + " does not divide " + a.key(&LlamaConfig::num_attention_heads) +
                     " = " + n(g.num_attention_heads));
    }
    // (Which rope types a type takes is its rope_type row's choices: Phi-3 default or
    // longrope, the others not longrope.)
    const int64_t rotated = g.rotary_dim();
    if (g.mla()) {  // (qk_rope_head_dim >= 2 by its range)
      if (rotated % 2 != 0) {
        throw fail(a.key(&LlamaConfig::qk_rope_head_dim),
                   n(rotated) + " is odd (RoPE rotates pairs)");
      }
      if (g.num_key_value_heads != 0 && g.num_key_value_heads != g.num_attention_heads) {
        throw fail(a.key(&LlamaConfig::num_key_value_heads),
                   n(g.num_key_value_heads) + " is not " +
                       a.key(&LlamaConfig::num_attention_heads) + " = " + n(g.num_attention_heads) +
                       " (MLA's keys and values are per head)");
      }
      if (g.v_head_dim > g.head_size()) {
        throw fail(a.key(&LlamaConfig::v_head_dim),
                   n(g.v_head_dim) + " exceeds qk_nope_head_dim + qk_rope_head_dim = " +
                       n(g.head_size()) + " (not implemented: values are padded to the q/k width)");
      }
    } else if (rotated < 2 || rotated % 2 != 0) {  // (only Phi-3 has the key; 1 elsewhere)
      throw fail(a.key(&LlamaConfig::partial_rotary_factor),
                 format_number(g.partial_rotary_factor) + " rotates int(" + n(g.head_size()) +
                     " * " + format_number(g.partial_rotary_factor) + ") = " + n(rotated) +
                     " columns of each head (expected an even number >= 2)");
    }
    if (g.rope_type == LlamaConfig::RopeType::longrope) {
      for (std::vector<double> LlamaConfig::*m :
           {&LlamaConfig::rope_short_factor, &LlamaConfig::rope_long_factor}) {
        if (static_cast<int64_t>((g.*m).size()) != rotated / 2) {
          throw fail(a.key(m), n(static_cast<int64_t>((g.*m).size())) +
                                   " numbers (expected rotary_dim / 2 = " + n(rotated / 2) +
                                   ": one per rotated frequency)");
        }
      }
    }
    // (equal factors are a hard cut-off: Llama 4 Scout's 1 and 1)
    if (g.rope_type == LlamaConfig::RopeType::llama3 &&
        !(g.rope_high_freq_factor >= g.rope_low_freq_factor)) {
      throw fail(a.key(&LlamaConfig::rope_high_freq_factor),
                 format_number(g.rope_high_freq_factor) + " is out of range (expected >= " +
                     a.name(&LlamaConfig::rope_low_freq_factor) + " = " +
                     format_number(g.rope_low_freq_factor) + ")");
    }
    if (arch_ == LlamaArch::granite && (g.attention_bias || g.mlp_bias)) {
      const bool attn = g.attention_bias;
      throw fail(a.key(attn ? &LlamaConfig::attention_bias : &LlamaConfig::mlp_bias),
                 "true is not supported for granite (expected false: residual_multiplier's "
                 "scaled backward has no bias gradient; Granite checkpoints have no biases)");
    }
    if (g.pad_token_id >= g.vocab_size) {
      throw fail(a.key(&LlamaConfig::pad_token_id),
                 n(g.pad_token_id) + " is out of range (expected -1 <= pad_token_id < " +
                     a.key(&LlamaConfig::vocab_size) + " = " + n(g.vocab_size) + ")");
    }
    if (c.data.seq_len > g.max_position_embeddings) {
      throw fail("data.seq_len", n(c.data.seq_len) + " exceeds " +
                                     a.key(&LlamaConfig::max_position_embeddings) + " = " +
                                     n(g.max_position_embeddings) +
                                     " (expected 1 <= seq_len <= max_position_embeddings)");
    }
    if (g.moe() && g.num_experts_per_tok > g.num_experts) {
      throw fail(a.key(&LlamaConfig::num_experts_per_tok),
                 n(g.num_experts_per_tok) + " exceeds " + a.key(&LlamaConfig::num_experts) +
                     " = " + n(g.num_experts));
    }
    // Llama 4's input-scaled routing, implemented for one expert a token (its published models')
    if (g.llama4() && g.num_experts_per_tok != 1) {
      throw fail(a.key(&LlamaConfig::num_experts_per_tok),
                 n(g.num_experts_per_tok) + " is not supported (expected 1: Llama 4's routing "
                 "scales each expert's input, done here for one expert a token)");
    }
    if (g.selection_bias()) {  // moe_sigmoid_router_forward's groups
      const int64_t E = g.num_experts, G = g.n_group;
      if (E % G != 0 || (G > 1 && E / G < 2)) {
        throw fail(a.key(&LlamaConfig::n_group),
                   n(G) + " does not divide " + a.key(&LlamaConfig::num_experts) + " = " + n(E) +
                       " into groups of at least 2 experts (a group scores its two best)");
      }
      if (g.topk_group > G) {
        throw fail(a.key(&LlamaConfig::topk_group), n(g.topk_group) + " exceeds " +
                                                        a.key(&LlamaConfig::n_group) + " = " +
                                                        n(G));
      }
    }
    check_recompute_num_layers(c, g.num_hidden_layers, fail);
  }
  std::vector<ModuleDecl> modules(const ModelConfig& c) const override {
    return llama_modules(LlamaConfig::from(c));
  }
  std::unique_ptr<Model> create(const ModelConfig& c, Kernels& kernels, DType act,
                                ActivationCheckpointing checkpointing) const override {
    // (validate refuses train.device = "cuda"; "auto" may still resolve to a GPU)
    if (args().defaults().qwen3_5() && kernels.runtime().device() == Device::cuda) {
      throw InputError("model.type = \"" + type() +
                       "\": the CUDA kernels of its linear attention are not written yet "
                       "(expected train.device = \"cpu\")");
    }
    return std::make_unique<LlamaModel>(LlamaConfig::from(c), kernels, act, checkpointing);
  }
  int64_t activation_bytes(const ModelConfig& c, int64_t rows, const data::BatchShape& shape,
                           DType act, ActivationCheckpointing checkpointing) const override {
    return LlamaModel::activation_bytes(LlamaConfig::from(c), rows, shape.L, act, checkpointing,
                                        {shape.block_causal, shape.reset_position_ids});
  }
  int64_t vocab_size(const ModelConfig& c) const override { return LlamaConfig::from(c).vocab_size; }
  // Per token per layer: q, k, v, o (C (2Q + 2KV) multiply-adds; MLA's own projections) and the
  // MLP (3 C I); the LM head V C; attention T Q each for Q K^T and P V (MLA: T Q and T H dv;
  // causal mask not discounted, as for GPT-2).
  double train_flops_per_sample(const ModelConfig& c, const data::BatchShape& shape) const override {
    const LlamaConfig g = LlamaConfig::from(c);
    const double T = static_cast<double>(shape.L), C = static_cast<double>(g.hidden_size),
                 L = static_cast<double>(g.num_hidden_layers), V = static_cast<double>(g.vocab_size),
                 Q = static_cast<double>(g.num_attention_heads * g.head_size()),
                 KV = static_cast<double>(g.kv_heads() * g.head_size());
    // A sparse MLP: the router (C E) and the K experts each token runs (the active
    // parameters, as MoE MFU is counted), and the shared expert (Qwen2-MoE's gate: C more).
    const double shared = g.shared_expert() ? 3 * C * static_cast<double>(g.shared_size()) +
                                                  (g.shared_expert_gated() ? C : 0.0)
                                            : 0.0;
    double mlp = 0;  // over the layers
    for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
      const double I = static_cast<double>(g.mlp_width(l));
      mlp += g.layer_sparse(l) ? static_cast<double>(g.num_experts_per_tok) * 3 * C * I +
                                     C * static_cast<double>(g.num_experts) + shared
                               : 3 * C * I;
    }
    // MLA: its projections (q_a, q_b or q_proj; kv_a, kv_b; o) and the scores over D, the
    // values over v_head_dim
    double proj = C * (2 * Q + 2 * KV), scores = 2.0 * Q;
    if (g.mla()) {
      const double H = static_cast<double>(g.num_attention_heads),
                   ql = static_cast<double>(g.q_lora_rank), r = static_cast<double>(g.kv_lora_rank),
                   dr = static_cast<double>(g.qk_rope_head_dim),
                   dn = static_cast<double>(g.qk_nope_head_dim),
                   dv = static_cast<double>(g.v_head_dim);
      proj = (ql > 0 ? C * ql + ql * Q : C * Q) + C * (r + dr) + r * H * (dn + dv) + H * dv * C;
      scores = Q + H * dv;
    }
    double layers_proj = L * proj, attn_layers = L;
    if (g.qwen3_5()) {  // full layers: q_proj's gates too; linear layers: their projections,
                        // conv and the delta rule's 4 Dk Dv a token and value head
      const double CD = static_cast<double>(g.linear_conv_dim()),
                   Vd = static_cast<double>(g.linear_value_dim()),
                   Hv = static_cast<double>(g.linear_num_value_heads),
                   Dk = static_cast<double>(g.linear_key_head_dim),
                   Dv = static_cast<double>(g.linear_value_head_dim),
                   K = static_cast<double>(g.linear_conv_kernel_dim);
      const double lin = C * (CD + 2 * Vd + 2 * Hv) + CD * K + Hv * 4 * Dk * Dv;
      double linear_layers = 0;
      for (int64_t l = 0; l < g.num_hidden_layers; ++l) linear_layers += g.layer_linear(l) ? 1 : 0;
      attn_layers = L - linear_layers;
      layers_proj = attn_layers * (proj + C * Q) + linear_layers * lin;
    }
    const double macs = T * (layers_proj + mlp + V * C) + attn_layers * T * T * scores;
    return 6.0 * macs;
  }
  // Our names are HF's state-dict names and nn.Linear layouts. A layer's parameter is looked
  // up in its own layer's module (an MoE model has ~400 a layer).
  std::optional<HfTensor> hf_tensor(const ModelConfig& c, const std::string& name,
                                    const std::vector<int64_t>& shape) const override {
    const LlamaConfig g = LlamaConfig::from(c);
    const std::string layers = "model.layers.";
    if (name.rfind(layers, 0) == 0) {
      std::size_t dot = 0;
      const std::optional<int64_t> l = dotted_index(name, layers.size(), &dot);
      if (!l || *l >= g.num_hidden_layers) return std::nullopt;
      for (const ParamSpec& p : layer_module(g, *l).params) {
        if (p.name == name) return HfTensor{name, shape, false};
      }
      return std::nullopt;
    }
    LlamaConfig outer = g;
    outer.num_hidden_layers = 0;  // the embedding, the final norm, the head
    for (const ModuleDecl& m : llama_modules(outer)) {
      for (const ParamSpec& p : m.params) {
        if (p.name == name) return HfTensor{name, shape, false};
      }
    }
    return std::nullopt;
  }
  // A tied checkpoint may also store the head under its own name. The multimodal models of
  // kArchNames hold the text decoder's tensors under "language_model.model." (transformers
  // 4.5x, the Hub's files) or "model.language_model." (transformers 5), the head under
  // "language_model.lm_head.weight" / "lm_head.weight".
  // The name's own prefixed forms come before the head's.
  std::vector<std::string> hf_aliases(const std::string& hf_name) const override {
    std::vector<std::string> names = {hf_name};
    if (hf_name == "model.embed_tokens.weight") names.push_back("lm_head.weight");
    // transformers 5's Mixtral keeps its router under mlp. (block_sparse_moe. in the Hub's
    // files and 4.x)
    const std::string sparse = ".block_sparse_moe.gate.weight";
    if (arch_ == LlamaArch::mixtral && hf_name.size() > sparse.size() &&
        hf_name.compare(hf_name.size() - sparse.size(), sparse.size(), sparse) == 0) {
      names.push_back(hf_name.substr(0, hf_name.size() - sparse.size()) + ".mlp.gate.weight");
    }
    std::vector<std::string> out;
    const std::string model = "model.";
    for (const std::string& n : names) {
      if (n != hf_name) out.push_back(n);
      if (arch_names(arch_).multimodal == nullptr) continue;
      if (n.rfind(model, 0) == 0) {
        out.push_back("language_model." + n);
        out.push_back("model.language_model." + n.substr(model.size()));
      } else {
        out.push_back("language_model." + n);
      }
    }
    return out;
  }
  // transformers 5's packed experts (Qwen3MoeExperts, MixtralExperts, OlmoeExperts: every
  // class under mlp.experts.): expert e's gate_proj (Mixtral's w1) is rows [2 e I, 2 e I + I)
  // of gate_up_proj [E, 2I, C] and its up_proj (w3) the next I rows (gate_up_proj[e] chunked
  // in two along its rows), its down_proj (w2) down_proj[e] of [E, C, I].
  std::optional<HfPacked> hf_packed(const ModelConfig& c,
                                    const std::string& hf_name) const override {
    const LlamaConfig g = LlamaConfig::from(c);
    if (!g.moe()) return std::nullopt;
    const std::string layers = "model.layers.", experts = ".experts.";
    const std::size_t at = hf_name.find(experts);
    if (hf_name.rfind(layers, 0) != 0 || at == std::string::npos) return std::nullopt;
    std::size_t dot = 0, e_end = 0;
    const std::optional<int64_t> layer = dotted_index(hf_name, layers.size(), &dot);
    const std::optional<int64_t> expert = dotted_index(hf_name, at + experts.size(), &e_end);
    if (!layer || !expert || *expert >= g.num_experts) return std::nullopt;
    const int64_t e = *expert, E = g.num_experts, I = g.expert_size(), C = g.hidden_size;
    const std::string proj = hf_name.substr(e_end + 1);
    const bool mixtral = arch_ == LlamaArch::mixtral;
    const std::string packed = layers + std::to_string(*layer) + ".mlp.experts.";
    if (proj == (mixtral ? "w1.weight" : "gate_proj.weight")) {
      return HfPacked{packed + "gate_up_proj", {E, 2 * I, C}, e * 2 * I * C};
    }
    if (proj == (mixtral ? "w3.weight" : "up_proj.weight")) {
      return HfPacked{packed + "gate_up_proj", {E, 2 * I, C}, e * 2 * I * C + I * C};
    }
    if (proj == (mixtral ? "w2.weight" : "down_proj.weight")) {
      return HfPacked{packed + "down_proj", {E, C, I}, e * C * I};
    }
    return std::nullopt;
  }
  // The Hub's gpt-oss checkpoints hold the experts' weights in MXFP4: gate_up_proj as
  // gate_up_proj_blocks [E, 2I, C / 32, 16] and _scales [E, 2I, C / 32] (dequantized [E, 2I, C],
  // ours [E, C, 2I]), down_proj as down_proj_blocks [E, C, I / 32, 16] (ours [E, I, C]).
  std::optional<HfMxfp4> hf_mxfp4(const ModelConfig& c,
                                  const std::string& hf_name) const override {
    const LlamaConfig g = LlamaConfig::from(c);
    if (!g.gpt_oss()) return std::nullopt;
    const int64_t E = g.num_experts, I = g.expert_size(), C = g.hidden_size;
    for (const auto& [proj, rows, cols] : {std::tuple{".mlp.experts.gate_up_proj", 2 * I, C},
                                           std::tuple{".mlp.experts.down_proj", C, I}}) {
      const std::string p = proj;
      if (hf_name.size() > p.size() &&
          hf_name.compare(hf_name.size() - p.size(), p.size(), p) == 0) {
        return HfMxfp4{hf_name + "_blocks", hf_name + "_scales", E, rows, cols};
      }
    }
    return std::nullopt;
  }
  nlohmann::json hf_config(const ModelConfig& c) const override {
    LlamaConfig g = LlamaConfig::from(c);
    // HF's None for the derived sizes is spelled out: the values every reader agrees on.
    g.num_key_value_heads = g.kv_heads();
    g.head_dim = g.head_size();
    nlohmann::json out = args().to_hf(g);
    const char* causal_lm = arch_names(arch_).causal_lm;
    out["architectures"] = {causal_lm ? std::string(causal_lm) : prefix() + "ForCausalLM"};
    out["model_type"] = type();
    if (g.rope_type == LlamaConfig::RopeType::default_) {
      out["rope_scaling"] = nullptr;
    } else {  // the fields of its type; attention_factor 0 is HF's None (left out)
      nlohmann::json rs = nlohmann::json::object();
      for (const std::string& f : rope_fields(args(), g.rope_type)) rs[f] = out["rope_scaling"][f];
      if (g.rope_attention_factor == 0.0) {
        rs.erase(rope_field(args(), &LlamaConfig::rope_attention_factor));
      }
      if (g.rope_type == LlamaConfig::RopeType::longrope) {
        // transformers 4.x's Phi3Config takes exactly {type, short_factor, long_factor}; 5
        // reads "type" as rope_type.
        rs.erase("rope_type");
        rs["type"] = enum_name(g.rope_type);
      }
      out["rope_scaling"] = rs;
    }
    const bool gemma = g.gemma();
    if (window_may_be_null(arch_) && g.sliding_window == 0) {
      out[args().name(&LlamaConfig::sliding_window)] = nullptr;  // HF's spelling of none
    }
    if (g.llama4()) {  // the lists Llama4TextConfig derives, spelled out; its fixed attributes
      nlohmann::json moe = nlohmann::json::array();
      for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
        if (g.layer_sparse(l)) moe.push_back(l);
      }
      out["moe_layers"] = moe;
      out[llama_args(LlamaArch::llama).name(&LlamaConfig::attention_bias)] = false;
      if (g.attention_chunk_size == 0) {
        out[args().name(&LlamaConfig::attention_chunk_size)] = nullptr;  // HF's None: none
      }
    }
    if (arch_ == LlamaArch::smollm3 || g.llama4()) {  // the lists SmolLM3Config would derive
      nlohmann::json rope = nlohmann::json::array();
      for (int64_t l = 0; l < g.num_hidden_layers; ++l) rope.push_back(g.layer_rope(l) ? 1 : 0);
      out["no_rope_layers"] = rope;
      out["layer_types"] = layer_types_of(g);
    }
    if (g.pad_token_id < 0) out[args().name(&LlamaConfig::pad_token_id)] = nullptr;  // None
    if (g.mla() && g.q_lora_rank == 0) out[args().name(&LlamaConfig::q_lora_rank)] = nullptr;
    // Gemma 3: transformers >= 4.53 reads layer_types (older ones the pattern): both, agreeing;
    // OLMo 3: layer_types only; Gemma 2: the list its class derives.
    if (g.patterned_window() || g.llama4() || g.qwen3_5()) out["layer_types"] = layer_types_of(g);
    if (gemma) {
      out["hidden_activation"] = "gelu_pytorch_tanh";
      if (!g.gemma3()) {
        // GemmaConfig's activation (v5: hidden_act; 4.x: hidden_activation when set); the
        // Hub's Gemma 2 files carry both
        out["hidden_act"] = "gelu_pytorch_tanh";
      }
      // A soft-cap of 0 is HF's None; Gemma 3 has neither (Gemma 2's keys), Gemma 1 no such
      // attribute.
      for (double LlamaConfig::*cap : kSoftcaps) {
        if (g.gemma2_layer() && (arch_ != LlamaArch::gemma2 || g.*cap == 0.0)) {
          out[softcap_name(cap)] = nullptr;
        }
      }
    }
    if (arch_ == LlamaArch::phi3) {  // Phi3Config's dropouts (0: what fsdp_train trains with)
      out["resid_pdrop"] = 0.0;
      out["embd_pdrop"] = 0.0;
    }
    if (g.moe()) {
      // both names of the experts' number (transformers 5.8+ reads num_local_experts)
      if (arch_ != LlamaArch::mixtral && !g.deepseek_moe()) {
        out[llama_args(LlamaArch::mixtral).name(&LlamaConfig::num_experts)] = g.num_experts;
      }
      // GLM-4.5's multi-token-prediction layers are neither built nor trained (HF's causal-LM
      // loss never runs them): the merged model has none
      if (arch_ == LlamaArch::glm4_moe) out["num_nextn_predict_layers"] = 0;
      if (arch_ == LlamaArch::deepseek_v2) out["topk_method"] = "greedy";
      if (arch_ == LlamaArch::qwen3_moe || arch_ == LlamaArch::qwen2_moe) {  // every layer sparse
        out["decoder_sparse_step"] = 1;
        out["mlp_only_layers"] = nlohmann::json::array();
      }
      if (arch_ == LlamaArch::mixtral) out["router_jitter_noise"] = 0.0;
      if (arch_ == LlamaArch::qwen2_moe) {
        // Qwen2MoeConfig's q/k/v biases (always ours), and its layer_types spelled out: newer
        // transformers derive another default list for this class than Qwen2's
        out["qkv_bias"] = true;
        out["layer_types"] = layer_types_of(g);
      }
      if (arch_ == LlamaArch::olmoe) out["clip_qkv"] = nullptr;
      // GptOssConfig's (its class sets attention_bias true whatever it is given, and its
      // experts hard-code the clamp the Hub's files also spell as swiglu_limit)
      if (g.gpt_oss()) {
        out[llama_args(LlamaArch::llama).name(&LlamaConfig::attention_bias)] = true;
        out["swiglu_limit"] = static_cast<double>(LlamaConfig::kClampedSwigluLimit);
      }
    }
    if (g.qwen3_5()) {
      // Qwen3_5TextConfig exists in transformers 5 only: its rope_parameters, as to_dict writes
      // them (rope_theta, partial_rotary_factor and the scaling in one dict)
      nlohmann::json rp = out["rope_scaling"].is_object() ? out["rope_scaling"]
                                                          : nlohmann::json{{"rope_type", "default"}};
      for (const std::string& attr : {args().name(&LlamaConfig::rope_theta),
                                     args().name(&LlamaConfig::partial_rotary_factor)}) {
        rp[attr] = out[attr];
        out.erase(attr);
      }
      out.erase("rope_scaling");
      out["rope_parameters"] = rp;
    }
    if (!gemma) out["hidden_act"] = "silu";
    out["attention_dropout"] = 0.0;
    if (arch_ == LlamaArch::llama) out["pretraining_tp"] = 1;
    out["use_cache"] = true;
    out["torch_dtype"] = "float32";
    return out;
  }
  // Config attributes that change the math and are not keys must be what fsdp_train
  // implements. Accepts transformers 5's `rope_parameters` (rope_theta and the scaling in one
  // dict) and the legacy rope_scaling "type" spelling; Mistral's and Phi-3's null
  // sliding_window is 0. Qwen's explicit layer_types must be the list use_sliding_window and
  // max_window_layers give (MistralConfig ignores layer_types, as here). Dropouts must be 0 and
  // Phi-3's partial_rotary_factor 1.
  ModelConfig from_hf_config(const nlohmann::json& hf_in, const std::string& origin) const override {
    const LlamaConfig& cls = args().defaults();  // the class's predicates
    const bool gemma3 = cls.gemma3(), gemma2 = arch_ == LlamaArch::gemma2, gemma = cls.gemma();
    // A multimodal model around this decoder (Gemma 3 4B+'s model_type "gemma3", Mistral Small
    // 3.1's "mistral3"): its text decoder is text_config, of this class (what it leaves out
    // takes the class's defaults).
    const char* mm = arch_names(arch_).multimodal;
    if (mm && hf_in.value("model_type", std::string()) == mm && hf_in.contains("text_config") &&
        hf_in["text_config"].is_object()) {
      nlohmann::json text = hf_in["text_config"];
      text["model_type"] = type();
      return from_hf_config(text, origin + " (text_config)");
    }
    if (hf_in.value("model_type", std::string()) != type()) {
      throw InputError(origin + ": \"model_type\" is not \"" + type() + "\"" +
                       (mm ? std::string(" (or \"") + mm + "\" with a text_config)"
                           : std::string()));
    }
    nlohmann::json hf = hf_in;
    if (window_may_be_null(arch_)) {
      const std::string window = args().name(&LlamaConfig::sliding_window);
      if (hf.contains(window) && hf[window].is_null()) hf[window] = 0;
    }
    if (arch_ == LlamaArch::exaone4) exaone4_pattern_from_hf(hf, origin);
    if (arch_ == LlamaArch::deepseek_v2 && hf.contains("topk_method") &&
        hf["topk_method"] != "greedy") {  // (DeepseekV2Moe's group_limited_greedy: DeepSeek-V2)
      throw unsupported(origin, "topk_method", hf["topk_method"], "\"greedy\"");
    }
    if (cls.mla()) {  // DeepseekV3Config's null q_lora_rank: no query compression (0)
      const std::string ql = args().name(&LlamaConfig::q_lora_rank);
      if (hf.contains(ql) && hf[ql].is_null()) hf[ql] = 0;
      // HF's attention would repeat MLA's per-head keys: only num_attention_heads works
      const std::string heads = args().name(&LlamaConfig::num_attention_heads);
      const std::string kv = args().name(&LlamaConfig::num_key_value_heads);
      if (hf.contains(kv) && !hf[kv].is_null() && hf.contains(heads) && hf[kv] != hf[heads]) {
        throw unsupported(origin, kv, hf[kv],
                          hf[heads].dump() + ", num_attention_heads: MLA's keys and values are "
                          "per head");
      }
    }
    auto refuse = [&](const char* field, const std::string& expected) {
      return unsupported(origin, field, hf[field], expected);
    };
    if (gemma) gemma_from_hf(hf, origin);
    if (gemma3 || arch_ == LlamaArch::olmo3) layer_type_rope_from_hf(hf, origin);
    if (hf.contains("rope_parameters") && hf["rope_parameters"].is_object()) {
      const nlohmann::json rp = hf["rope_parameters"];
      const std::string theta = args().name(&LlamaConfig::rope_theta);
      if (!hf.contains(theta) && rp.contains(theta)) hf[theta] = rp[theta];
      if (!hf.contains("rope_scaling") || hf["rope_scaling"].is_null()) hf["rope_scaling"] = rp;
    }
    if (arch_ == LlamaArch::phi3 || arch_ == LlamaArch::glm4_moe || cls.qwen3_5()) {
      partial_rotary_from_hf(hf, origin);
    }
    if (cls.qwen3_5()) qwen3_5_from_hf(hf, origin);
    if (arch_ == LlamaArch::phi3) phi3_rope_from_hf(hf, origin);
    if (hf.contains("rope_scaling") && hf["rope_scaling"].is_object()) {
      nlohmann::json& rs = hf["rope_scaling"];
      if (!rs.contains("rope_type") && rs.contains("type")) rs["rope_type"] = rs["type"];
      // DeepSeek's yarn attention factors (mscale / mscale_all_dim): DeepSeek-V3's keys (null
      // is 0, none); another class refuses them rather than scale differently.
      for (const char* f : {"mscale", "mscale_all_dim"}) {
        if (args().has(&LlamaConfig::rope_mscale)) {
          if (rs.contains(f) && rs[f].is_null()) rs.erase(f);
          continue;
        }
        if (rs.contains(f) && !rs[f].is_null()) {
          throw InputError(origin + ": \"rope_scaling." + f + "\" " + rs[f].dump() +
                           " is not supported (expected none: fsdp_train's yarn takes attention_factor)");
        }
      }
      // transformers 5 requires yarn's original_max_position_embeddings: no default here either.
      const std::string orig = args().name(&LlamaConfig::rope_original_max_position_embeddings);
      const std::string orig_field =
          rope_field(args(), &LlamaConfig::rope_original_max_position_embeddings);
      if (rs.value("rope_type", std::string()) ==
              enum_name(LlamaConfig::RopeType::yarn) &&
          (!rs.contains(orig_field) || rs[orig_field].is_null())) {
        throw InputError(origin + ": \"" + orig + "\" missing (yarn needs the pre-training context length)");
      }
    }
    if (!gemma && hf.contains("hidden_act") && hf["hidden_act"] != "silu") {
      throw refuse("hidden_act", "\"silu\"");
    }
    for (const char* dropout : {"attention_dropout", "resid_pdrop", "embd_pdrop"}) {
      if (hf.contains(dropout) && hf[dropout].is_number() && hf[dropout].get<double>() != 0.0) {
        throw refuse(dropout, "0.0");
      }
    }
    if (cls.moe()) moe_from_hf(hf, origin);
    if (cls.gpt_oss()) gpt_oss_from_hf(hf, origin);
    if (cls.llama4()) {
      // Llama4TextConfig's attn_temperature_tuning is an int (default 4) read as a truth value;
      // its null attention_chunk_size is no chunking (0)
      const std::string tuning = args().name(&LlamaConfig::attn_temperature_tuning);
      if (hf.contains(tuning) && hf[tuning].is_number()) hf[tuning] = hf[tuning].get<double>() != 0;
      const std::string chunk = args().name(&LlamaConfig::attention_chunk_size);
      if (hf.contains(chunk) && hf[chunk].is_null()) hf[chunk] = 0;
    }
    // The keys config.json does not carry (OLMo 3's sliding_window_pattern) at the type's
    // defaults; every other one is read or takes its class's default.
    LlamaConfig g = args().from_hf(hf, origin, args().defaults());
    if (arch_ == LlamaArch::phi3) check_longrope_factor(hf, g, origin);
    const std::string pad = args().name(&LlamaConfig::pad_token_id);
    if (hf.contains(pad) && hf[pad].is_null()) g.pad_token_id = -1;  // HF's None: no padding
    if ((gemma3 || arch_ == LlamaArch::olmo3 || arch_ == LlamaArch::exaone4) &&
        hf.contains("layer_types") &&
        !hf["layer_types"].is_null()) {
      g.sliding_window_pattern =
          period_of(hf["layer_types"], g.sliding_window_pattern, g.num_hidden_layers,
                    "sliding_attention", "full_attention", "layer_types",
                    args().name(&LlamaConfig::sliding_window_pattern), origin);
    }
    if (cls.qwen3_5()) {
      // HF builds layer_types from the full_attention_interval kwarg (default 4) when a
      // config.json has no list; ours is the list's period
      const std::string interval = args().name(&LlamaConfig::full_attention_interval);
      if (hf.contains(interval) && hf[interval].is_number_integer() && hf[interval].get<int64_t>() >= 1) {
        g.full_attention_interval = hf[interval].get<int64_t>();
      }
      if (hf.contains("layer_types") && !hf["layer_types"].is_null()) {
        g.full_attention_interval =
            period_of(hf["layer_types"], g.full_attention_interval, g.num_hidden_layers,
                      "linear_attention", "full_attention", "layer_types",
                      args().name(&LlamaConfig::full_attention_interval), origin);
      }
    }
    const bool smol = arch_ == LlamaArch::smollm3, l4 = arch_ == LlamaArch::llama4_text;
    // (Llama4TextConfig: an empty no_rope_layers means the default, as HF's `if no_rope_layers`)
    if ((smol || l4) && hf.contains("no_rope_layers") && !hf["no_rope_layers"].is_null() &&
        !(l4 && hf["no_rope_layers"].is_array() && hf["no_rope_layers"].empty())) {
      g.no_rope_layer_interval =
          period_of(hf["no_rope_layers"], g.no_rope_layer_interval, g.num_hidden_layers, 1, 0,
                    "no_rope_layers", args().name(&LlamaConfig::no_rope_layer_interval), origin);
    }
    const bool qwen = arch_ == LlamaArch::qwen2 || arch_ == LlamaArch::qwen3 ||
                      arch_ == LlamaArch::qwen3_moe || arch_ == LlamaArch::qwen2_moe;
    const bool oss = arch_ == LlamaArch::gpt_oss;
    if (l4 && hf.contains("moe_layers") && !hf["moe_layers"].is_null()) {
      nlohmann::json want = nlohmann::json::array();
      for (int64_t l = 0; l < g.num_hidden_layers; ++l) {
        if (g.layer_sparse(l)) want.push_back(l);
      }
      if (hf["moe_layers"] != want) {
        throw refuse("moe_layers", want.dump() + ", the layers interleave_moe_layer_step gives");
      }
    }
    if ((qwen || smol || gemma2 || oss || l4) && hf.contains("layer_types") &&
        !hf["layer_types"].is_null()) {
      const nlohmann::json want = layer_types_of(g);
      if (hf["layer_types"] != want) {
        throw refuse("layer_types", want.dump() + (qwen ? ", the layers use_sliding_window and "
                                                          "max_window_layers give"
                                                   : gemma2 ? ", Gemma 2's even layers sliding"
                                                   : oss    ? ", gpt-oss's even layers sliding"
                                                   : l4     ? ", the RoPE layers chunked"
                                                            : ", the layers use_sliding_window, "
                                                              "sliding_window and no_rope_layers "
                                                              "give"));
      }
    }
    ModelConfig c = model_defaults(type());
    args().write(g, &c);
    return canonical(c);
  }
  // The derived sizes spelled as HF's None (0) when they equal what None means, the
  // rope_scaling fields its rope_type does not read (rope_fields) at their defaults (a
  // config.json carries only the others, and they change nothing).
  // GptOssConfig's attributes that are not keys: a quantization_config must be the Hub's
  // MXFP4 experts (init_from dequantizes them, hf_mxfp4; another method is refused by name),
  // and swiglu_limit, which GptOssExperts never reads (it clamps at 7), must be 7 when given
  // (a file that says otherwise was not made by this class).
  void gpt_oss_from_hf(const nlohmann::json& hf, const std::string& origin) const {
    if (hf.contains("quantization_config") && !hf["quantization_config"].is_null()) {
      const nlohmann::json& q = hf["quantization_config"];
      const std::string method =
          q.is_object() && q.contains("quant_method") && q["quant_method"].is_string()
              ? q["quant_method"].get<std::string>()
              : q.dump();
      if (method != "mxfp4") {
        throw InputError(origin + ": \"quantization_config\" " + method +
                         " is not supported (expected none, or the Hub's \"mxfp4\" experts)");
      }
    }
    const double limit = LlamaConfig::kClampedSwigluLimit;
    if (hf.contains("swiglu_limit") && !hf["swiglu_limit"].is_null() &&
        (!hf["swiglu_limit"].is_number() || hf["swiglu_limit"].get<double>() != limit)) {
      throw unsupported(origin, "swiglu_limit", hf["swiglu_limit"],
                        "7.0 (GptOssExperts' fixed clamp)");
    }
  }
  // Qwen3.5's rope_parameters, in place: its multimodal RoPE's sections (mrope_section,
  // mrope_interleaved; Qwen3_5TextRotaryEmbedding) rotate the text's positions as plain RoPE
  // (a text token's temporal, height and width positions are one), so they are read and
  // dropped; the sections must still cover the rotated frequencies (rotary_dim / 2 in all).
  // The multi-token-prediction layers (mtp_*) are neither built nor trained, as HF's
  // Qwen3_5ForCausalLM ignores them.
  void qwen3_5_from_hf(nlohmann::json& hf, const std::string& origin) const {
    if (!hf.contains("rope_scaling") || !hf["rope_scaling"].is_object()) return;
    nlohmann::json& rs = hf["rope_scaling"];
    if (rs.contains("mrope_section") && !rs["mrope_section"].is_null()) {
      const nlohmann::json& sec = rs["mrope_section"];
      int64_t sum = 0;
      bool ok = sec.is_array();
      for (const auto& v : sec) {
        ok = ok && v.is_number_integer() && v.get<int64_t>() >= 0;
        if (ok) sum += v.get<int64_t>();
      }
      const LlamaConfig& d = args().defaults();
      const int64_t D = hf.value(args().name(&LlamaConfig::head_dim), d.head_size());
      const double f = hf.value(args().name(&LlamaConfig::partial_rotary_factor),
                                d.partial_rotary_factor);
      const auto half = static_cast<int64_t>(static_cast<double>(D) * f) / 2;
      if (!ok || sum != half) {
        throw unsupported(origin, "rope_parameters.mrope_section", sec,
                          "sections summing to rotary_dim / 2 = " + std::to_string(half));
      }
    }
    rs.erase("mrope_section");
    rs.erase("mrope_interleaved");
  }
  // partial_rotary_factor, in place (Phi3Config, Glm4MoeConfig): transformers 5 keeps it in
  // rope_parameters (the top-level one wins, and must agree).
  void partial_rotary_from_hf(nlohmann::json& hf, const std::string& origin) const {
    lift_rope_attributes(hf, origin, {args().name(&LlamaConfig::partial_rotary_factor)});
  }
  // `attrs` of rope_scaling (or rope_parameters) that are top-level attributes of the class,
  // in place: a top-level one wins and must agree.
  void lift_rope_attributes(nlohmann::json& hf, const std::string& origin,
                            const std::vector<std::string>& attrs) const {
    if (!hf.contains("rope_scaling") || !hf["rope_scaling"].is_object()) return;
    nlohmann::json& rs = hf["rope_scaling"];
    for (const std::string& attr : attrs) {
      if (!rs.contains(attr) || rs[attr].is_null()) continue;
      if (!hf.contains(attr) || hf[attr].is_null()) {
        hf[attr] = rs[attr];
      } else if (hf[attr] != rs[attr]) {
        throw unsupported(origin, "rope_parameters." + attr, rs[attr],
                          "the top-level " + attr + " " + hf[attr].dump());
      }
    }
  }
  // Phi-3's RoPE attributes, in place (Phi3Config): transformers 5 keeps
  // original_max_position_embeddings in rope_parameters as well (lift_rope_attributes); the
  // legacy rope types "su" and "yarn" are longrope.
  void phi3_rope_from_hf(nlohmann::json& hf, const std::string& origin) const {
    if (!hf.contains("rope_scaling") || !hf["rope_scaling"].is_object()) return;
    lift_rope_attributes(hf, origin, {args().name(&LlamaConfig::original_max_position_embeddings)});
    nlohmann::json& rs = hf["rope_scaling"];
    const char* type_key = rs.contains("rope_type") ? "rope_type" : "type";
    if (rs.contains(type_key) && (rs[type_key] == "su" || rs[type_key] == "yarn")) {
      rs[type_key] = enum_name(LlamaConfig::RopeType::longrope);
    }
  }
  // A longrope config.json's rope_scaling.factor (transformers 5 would scale by it) must be
  // the ratio every version derives from `g`'s two lengths (Phi3Config's).
  void check_longrope_factor(const nlohmann::json& hf, const LlamaConfig& g,
                             const std::string& origin) const {
    const std::string factor = rope_field(args(), &LlamaConfig::rope_factor);
    if (g.rope_type != LlamaConfig::RopeType::longrope || !hf["rope_scaling"].contains(factor) ||
        hf["rope_scaling"][factor].is_null()) {
      return;
    }
    const nlohmann::json& f = hf["rope_scaling"][factor];
    const double ratio = static_cast<double>(g.max_position_embeddings) /
                         static_cast<double>(g.original_max_position_embeddings);
    if (!f.is_number() || f.get<double>() != ratio) {
      throw unsupported(origin, "rope_scaling." + factor, f,
                        "none, or " + args().name(&LlamaConfig::max_position_embeddings) +
                            " / " + args().name(&LlamaConfig::original_max_position_embeddings) +
                            " = " + std::to_string(g.max_position_embeddings) + " / " +
                            std::to_string(g.original_max_position_embeddings));
    }
  }
  // The sparse MLP's attributes that change the math and are not keys: HF's defaults or
  // refused: no router jitter (Mixtral), every layer sparse (Qwen3-MoE's decoder_sparse_step 1
  // and no mlp_only_layers), no q/k/v clipping (OLMoE's clip_qkv), Qwen2-MoE's q/k/v biases
  // (qkv_bias true).
  // transformers 5.8 renamed Qwen3MoeConfig's num_experts to num_local_experts (Mixtral's
  // name): either spelling is read, in place, and both must agree when both are given.
  void moe_from_hf(nlohmann::json& hf, const std::string& origin) const {
    auto set = [&](const std::string& f) { return hf.contains(f) && !hf[f].is_null(); };
    auto refuse = [&](const std::string& f, const std::string& expected) {
      return unsupported(origin, f, hf[f], expected);
    };
    const std::string experts = args().name(&LlamaConfig::num_experts);
    for (const LlamaArch spelling : {LlamaArch::qwen3_moe, LlamaArch::mixtral}) {
      const std::string other = llama_args(spelling).name(&LlamaConfig::num_experts);
      if (other == experts || !set(other)) continue;
      if (set(experts) && hf[experts] != hf[other]) {
        throw refuse(other, "the same number as \"" + experts + "\" " + hf[experts].dump());
      }
      hf[experts] = hf[other];
    }
    if (set("router_jitter_noise") &&
        (!hf["router_jitter_noise"].is_number() || hf["router_jitter_noise"].get<double>() != 0)) {
      throw refuse("router_jitter_noise", "0.0");
    }
    if (set("decoder_sparse_step") && hf["decoder_sparse_step"] != 1) {
      throw refuse("decoder_sparse_step", "1 (every layer sparse)");
    }
    if (set("mlp_only_layers") &&
        !(hf["mlp_only_layers"].is_array() && hf["mlp_only_layers"].empty())) {
      throw refuse("mlp_only_layers", "[] (every layer sparse)");
    }
    if (set("clip_qkv")) throw refuse("clip_qkv", "null");
    if (set("qkv_bias") && hf["qkv_bias"] != true) throw refuse("qkv_bias", "true");
  }
  // EXAONE 4's sliding_window_pattern, in place: Exaone4Config takes an int or a string of
  // "L" (local) and "G" (global) layers repeating from layer 0; "L...LG" (k - 1 L's) is the
  // int k, null (a config without a window) the class's 4. Other strings are refused.
  void exaone4_pattern_from_hf(nlohmann::json& hf, const std::string& origin) const {
    const std::string key = args().name(&LlamaConfig::sliding_window_pattern);
    if (!hf.contains(key)) return;
    nlohmann::json& p = hf[key];
    if (p.is_null()) {
      hf.erase(key);
      return;
    }
    if (!p.is_string()) return;
    const std::string s = p.get<std::string>();
    if (s.empty() || s.back() != 'G' ||
        s.find_first_not_of('L') != s.size() - 1) {
      throw unsupported(origin, key, p, "an int or \"L...LG\" (layers sliding, then one global)");
    }
    p = static_cast<int64_t>(s.size());
  }
  // Gemma's config.json attributes that change the math and are not keys, in place: the
  // activation must be gelu_pytorch_tanh (hidden_activation; or, Gemma 1 without it, hidden_act,
  // where the Hub's "gelu" is what transformers 4.39+ reads as gelu_pytorch_tanh, the
  // approximation Gemma was trained with), attention causal (use_bidirectional_attention is
  // EmbeddingGemma's); Gemma 3's soft-cappings null (Gemma 2's keys: null becomes 0).
  void gemma_from_hf(nlohmann::json& hf, const std::string& origin) const {
    auto refuse = [&](const std::string& field, const nlohmann::json& v,
                      const std::string& expected) {
      return unsupported(origin, field, v, expected);
    };
    const bool activation = hf.contains("hidden_activation") && !hf["hidden_activation"].is_null();
    if (activation && hf["hidden_activation"] != "gelu_pytorch_tanh") {
      throw refuse("hidden_activation", hf["hidden_activation"], "\"gelu_pytorch_tanh\"");
    }
    if (arch_ == LlamaArch::gemma && !activation && hf.contains("hidden_act") &&
        hf["hidden_act"] != "gelu_pytorch_tanh" && hf["hidden_act"] != "gelu") {
      throw refuse("hidden_act", hf["hidden_act"], "\"gelu_pytorch_tanh\" (or Gemma's \"gelu\")");
    }
    for (double LlamaConfig::*member : kSoftcaps) {
      const std::string cap = softcap_name(member);
      if (arch_ == LlamaArch::gemma2) {
        if (hf.contains(cap) && hf[cap].is_null()) hf[cap] = 0.0;
      } else if (hf.contains(cap) && !hf[cap].is_null()) {
        throw refuse(cap, hf[cap], "null");
      }
    }
    const char* bidirectional = "use_bidirectional_attention";
    if (hf.contains(bidirectional) && !hf[bidirectional].is_null() && hf[bidirectional] != false) {
      throw refuse(bidirectional, hf[bidirectional], "false");
    }
  }
  // Gemma 3's and OLMo 3's transformers 5 rope_parameters, in place: {"full_attention": {...},
  // "sliding_attention": {...}} become rope_theta and rope_scaling (full) and, for Gemma 3,
  // rope_local_base_freq (sliding: unscaled; OLMo 3's sliding layers use rope_theta).
  void layer_type_rope_from_hf(nlohmann::json& hf, const std::string& origin) const {
    auto refuse = [&](const std::string& field, const nlohmann::json& v,
                      const std::string& expected) {
      return unsupported(origin, field, v, expected);
    };
    if (!hf.contains("rope_parameters") || !hf["rope_parameters"].is_object() ||
        !hf["rope_parameters"].contains("full_attention")) {
      return;
    }
    const nlohmann::json rp = hf["rope_parameters"];
    hf.erase("rope_parameters");
    const std::string theta = args().name(&LlamaConfig::rope_theta);  // also the dicts' name
    // A layer type's dict, and its rope type ("rope_type", or the legacy "type"; "default").
    auto dict = [&](const char* layer_type) {
      const std::string field = std::string("rope_parameters.") + layer_type;
      if (!rp[layer_type].is_object()) throw refuse(field, rp[layer_type], "a dict");
      const nlohmann::json& d = rp[layer_type];
      const nlohmann::json type = d.contains("rope_type") ? d["rope_type"]
                                  : d.contains("type")    ? d["type"]
                                                          : nlohmann::json("default");
      if (!type.is_string()) throw refuse(field + ".rope_type", type, "a string");
      return std::make_pair(d, type.get<std::string>());
    };
    auto [full, type] = dict("full_attention");
    if (full.contains(theta)) hf[theta] = full[theta];
    full.erase(theta);
    if (type != "default") hf["rope_scaling"] = full;
    if (rp.contains("sliding_attention")) {
      const auto [local, local_type] = dict("sliding_attention");
      if (local_type != "default") {
        throw refuse("rope_parameters.sliding_attention.rope_type", local_type, "\"default\"");
      }
      if (!local.contains(theta)) return;
      if (arch_ == LlamaArch::gemma3_text) {
        hf[args().name(&LlamaConfig::rope_local_base_freq)] = local[theta];
      } else if (!hf.contains(theta) || local[theta] != hf[theta]) {
        throw refuse("rope_parameters.sliding_attention.rope_theta", local[theta],
                     "full_attention's rope_theta: OLMo 3's layers share one period");
      }
    }
  }
  // The period p of a per-layer list that config.json spells out (Gemma 3's layer_types,
  // SmolLM3's no_rope_layers), where layer l's entry is on(l, p) for (l + 1) % p != 0 and
  // off otherwise: `given` (the config's own period key, or its default) when it gives the
  // list, else the smallest p that does (L + 1: every entry `on`); throws InputError naming
  // `attr` and `period_key` when none does.
  static int64_t period_of(const nlohmann::json& list, int64_t given, int64_t layers,
                           const nlohmann::json& on, const nlohmann::json& off, const char* attr,
                           const std::string& period_key, const std::string& origin) {
    auto gives = [&](int64_t p) {
      nlohmann::json want = nlohmann::json::array();
      for (int64_t l = 0; l < layers; ++l) want.push_back((l + 1) % p != 0 ? on : off);
      return list == want;
    };
    if (given >= 1 && gives(given)) return given;
    for (int64_t p = 1; p <= layers + 1; ++p) {
      if (gives(p)) return p;
    }
    throw InputError(origin + ": \"" + attr + "\" " + list.dump() + " is not supported (expected every " +
                     period_key + "-th layer " + off.dump() + ", the others " + on.dump() + ")");
  }
  ModelConfig canonical(const ModelConfig& c) const override {
    using L = LlamaConfig;
    LlamaConfig g = LlamaConfig::from(c);
    if (g.num_key_value_heads == g.num_attention_heads) g.num_key_value_heads = 0;
    if (g.num_attention_heads > 0 && g.head_dim * g.num_attention_heads == g.hidden_size) g.head_dim = 0;
    const L d;
    const std::vector<std::string> read = rope_fields(args(), g.rope_type);
    auto unread = [&](auto member) {
      return std::find(read.begin(), read.end(), rope_field(args(), member)) == read.end();
    };
    for (double L::*m : {&L::rope_factor, &L::rope_low_freq_factor, &L::rope_high_freq_factor,
                         &L::rope_beta_fast, &L::rope_beta_slow, &L::rope_attention_factor}) {
      if (unread(m)) g.*m = d.*m;
    }
    if (unread(&L::rope_original_max_position_embeddings)) {
      g.rope_original_max_position_embeddings = d.rope_original_max_position_embeddings;
    }
    if (unread(&L::rope_truncate)) g.rope_truncate = d.rope_truncate;
    // Qwen3.5-MoE's intermediate_size: not an attribute of its class, and unused (every layer
    // sparse): its default, whatever was given
    if (arch_ == LlamaArch::qwen3_5_moe_text) g.intermediate_size = args().defaults().intermediate_size;
    if (arch_ == LlamaArch::phi3) {  // (the only type with LongRoPE's rows)
      for (std::vector<double> L::*m : {&L::rope_short_factor, &L::rope_long_factor}) {
        if (unread(m)) (g.*m).clear();
      }
    }
    ModelConfig out = c;
    args().write(g, &out);
    return out;
  }

 private:
  const ModelArgs<LlamaConfig>& args() const { return llama_args(arch_); }
  std::string prefix() const { return llama_arch_prefix(arch_); }
  LlamaArch arch_;
};

}  // namespace

LlamaConfig LlamaConfig::from(const ModelConfig& c) {
  const std::optional<LlamaArch> arch = enum_from_name<LlamaArch>(c.type);
  if (!arch) throw Error("LlamaConfig::from: model.type \"" + c.type + "\" is not a Llama-family type");
  LlamaConfig g = llama_args(*arch).read(c);
  g.pad_vocab_multiple = c.pad_vocab_multiple;
  g.fused_lce = FusedLinearCrossEntropy::from(c);
  return g;
}

const ModelFamily& llama_family(LlamaArch arch) {
  static const std::vector<std::unique_ptr<LlamaFamily>> families = [] {
    std::vector<std::unique_ptr<LlamaFamily>> f;
    for (const ArchNames& a : kArchNames) f.push_back(std::make_unique<LlamaFamily>(a.arch));
    return f;
  }();
  return *families[static_cast<std::size_t>(arch)];
}

std::vector<LlamaArch> llama_archs() {
  std::vector<LlamaArch> out;
  for (const ArchNames& a : kArchNames) out.push_back(a.arch);
  return out;
}

}  // namespace fsdp
