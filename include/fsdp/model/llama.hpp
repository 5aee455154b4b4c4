// fsdp/model/llama.hpp: Llama-family decoders with the exact architectures of twenty Hugging
// Face classes, one model.type each (HF's model_type), sharing this one model:
//
//  - "llama": LlamaForCausalLM (Touvron et al. 2023; transformers/models/llama/
//    modeling_llama.py): Llama 2/3, TinyLlama, SmolLM;
//  - "mistral": MistralForCausalLM (models/mistral): Llama without biases, plus a sliding window
//    (each query attends to its sliding_window latest positions);
//  - "qwen2": Qwen2ForCausalLM (models/qwen2): Qwen2 and Qwen2.5, biases on q_proj, k_proj and
//    v_proj (not o_proj), the sliding window as Mistral's when use_sliding_window;
//  - "qwen3": Qwen3ForCausalLM (models/qwen3): Qwen3, an RMSNorm over each head of q and k
//    (self_attn.q_norm, k_norm [head_dim]) before RoPE, attention_bias as Llama's;
//  - "olmo2": Olmo2ForCausalLM (models/olmo2; OLMo 2, Team OLMo 2024, "2 OLMo 2 Furious"): the
//    norms moved from the sublayers' inputs to their outputs, x + post_attention_layernorm(
//    attn(x)) and h + post_feedforward_layernorm(mlp(h)), and q_norm / k_norm over the whole
//    q and k projections ([H*D], [Hkv*D]) before RoPE; attention_bias as Llama's, no head_dim;
//  - "phi3": Phi3ForCausalLM (models/phi3): Phi-3, Phi-3.5 and Phi-4, Llama's math with q/k/v
//    stored in one qkv_proj and gate/up in one gate_up_proj (fused_projections()); RoPE on
//    the first partial_rotary_factor of each head (Phi-4-mini's 3/4) and LongRoPE scaling
//    (Ding et al. 2024; Phi-3-128k, Phi-3.5, Phi-4-mini: per-frequency short_factor /
//    long_factor, cos and sin scaled);
//  - "gemma3_text": Gemma3ForCausalLM (models/gemma3; Gemma Team 2025, "Gemma 3 Technical
//    Report"), the text decoder of Gemma 3: every RMSNorm scales by (1 + weight) (Gemma3RMSNorm,
//    weights initialised to 0); the embedding multiplied by sqrt(hidden_size) rounded to the
//    weight's dtype (Gemma3TextScaledWordEmbedding); four norms a layer, x + post_attention_layernorm(
//    attn(input_layernorm(x))) and h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(
//    h))); Qwen3's per-head q_norm / k_norm; the MLP gelu_tanh(gate_proj) * up_proj (GeGLU,
//    "gelu_pytorch_tanh"); scores scaled by query_pre_attn_scalar^-1/2; layer l slides
//    (sliding_window) unless (l + 1) % sliding_window_pattern == 0, and the sliding layers'
//    RoPE has period rope_local_base_freq without scaling, the others rope_theta and
//    rope_scaling (Gemma3TextModel's rotary_emb_local and rotary_emb);
//  - "smollm3": SmolLM3ForCausalLM (models/smollm3): Llama's math with no RoPE on every
//    no_rope_layer_interval-th layer (NoPE; SmolLM3Attention's use_rope), the sliding window
//    (use_sliding_window) on those layers only, no head_dim attribute;
//  - "granite": GraniteForCausalLM (models/granite; IBM Granite 3.x): Llama's math with muP-style
//    multipliers: the embedding times embedding_multiplier, each sublayer's output times
//    residual_multiplier before its residual add, scores times attention_multiplier (not
//    1/sqrt(head_dim)), logits divided by logits_scaling; no head_dim attribute;
//  - "olmo3": Olmo3ForCausalLM (models/olmo3; OLMo 3): OLMo 2's layer with a sliding window
//    on 3 of 4 layers (HF's layer_types: here sliding_window_pattern, an fsdp_train key), whose
//    RoPE is never scaled (Olmo3Model's rotary_embs["sliding_attention"]);
//  - "gemma2": Gemma2ForCausalLM (models/gemma2; Gemma Team 2024, "Gemma 2: Improving Open
//    Language Models at a Practical Size"): Gemma 3's (1 + weight) norms, scaled embedding,
//    four norms a layer, GeGLU and query_pre_attn_scalar, without q_norm / k_norm; every even
//    layer (l % 2 == 0) slides, all layers share one RoPE; and tanh soft-capping (Gemma 2
//    section 2): the attention scores become attn_logit_softcapping * tanh(s /
//    attn_logit_softcapping) before the mask, the logits final_logit_softcapping * tanh(z /
//    final_logit_softcapping) before the loss;
//  - "gemma": GemmaForCausalLM (models/gemma; Gemma Team 2024, "Gemma: Open Models Based on
//    Gemini Research and Technology"; Gemma 2B, 7B, CodeGemma): Llama's layer (two norms,
//    scores scaled by head_dim^-1/2, no window) with Gemma's (1 + weight) norms, scaled
//    embedding and GeGLU;
//  - "exaone4": Exaone4ForCausalLM (models/exaone4; LG AI Research's EXAONE 4.0): OLMo 2's
//    layer (norms on the sublayers' outputs only) with Qwen3's per-head q_norm / k_norm; with
//    a sliding_window, layer l slides unless (l + 1) % sliding_window_pattern == 0 and only
//    the sliding layers rotate q and k (the global ones are NoPE); without one, every layer
//    is global and rotated;
//  - three sparse Mixture-of-Experts decoders (Shazeer et al. 2017; Fedus et al. 2021), whose
//    MLP is a router and num_experts SwiGLU experts: router_logits = gate(n2) [E], p =
//    softmax(router_logits) in fp32, each token runs the num_experts_per_tok = K experts of
//    the K largest p (torch.topk) and sums their outputs weighted by those p (divided by their
//    sum under norm_topk_prob); with output_router_logits (HF's default false) the loss adds
//    router_aux_loss_coef times the load-balancing loss of HF's load_balancing_loss_func
//    (Switch Transformers' E sum_e f_e P_e over every layer's tokens of the micro-batch):
//    "qwen3_moe": Qwen3MoeForCausalLM (models/qwen3_moe; Qwen3-30B-A3B, 235B-A22B): Qwen3's
//    attention, every layer sparse (decoder_sparse_step 1, no mlp_only_layers), experts of
//    moe_intermediate_size under mlp.gate / mlp.experts.{e}.{gate,up,down}_proj;
//    "mixtral": MixtralForCausalLM (models/mixtral; Jiang et al. 2024, "Mixtral of Experts"):
//    Mistral's attention, the K weights always renormalised, experts of intermediate_size
//    under block_sparse_moe.gate / block_sparse_moe.experts.{e}.w1 (gate), w2 (down), w3 (up);
//    "olmoe": OlmoeForCausalLM (models/olmoe; Muennighoff et al. 2024, "OLMoE"): Llama's
//    pre-norm layer with OLMo 2's q_norm / k_norm over the whole projections, experts of
//    intermediate_size under Qwen3-MoE's names;
//    "qwen2_moe": Qwen2MoeForCausalLM (models/qwen2_moe; Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B):
//    Qwen2's attention (q/k/v biases) and Qwen3-MoE's routed experts plus a shared expert, a
//    SwiGLU MLP of shared_expert_intermediate_size on every token scaled by
//    sigmoid(shared_expert_gate(n2)) (mlp.shared_expert.{gate,up,down}_proj,
//    mlp.shared_expert_gate [1, C]);
//  - "glm4_moe": Glm4MoeForCausalLM (models/glm4_moe; GLM-4.5, GLM-4.5-Air), whose sparse block
//    is DeepSeek-V3's (DeepSeek-AI 2024; DeepseekV3MoE): Llama's pre-norm layer with q/k/v
//    biases (attention_bias; o_proj none), per-head q_norm / k_norm under use_qk_norm and RoPE
//    on the first partial_rotary_factor of each head; the first first_k_dense_replace layers
//    dense (Llama's MLP of intermediate_size), the others a router whose fp32 logits are
//    routed by sigmoid plus the buffer mlp.gate.e_score_correction_bias among the best
//    topk_group of n_group expert groups (kernels.hpp's moe_sigmoid_router_forward), weights the
//    sigmoids (renormalised under norm_topk_prob) times routed_scaling_factor, experts of
//    moe_intermediate_size under mlp.experts.{e}.*, plus n_shared_experts ungated shared
//    experts (one SwiGLU MLP, mlp.shared_experts.*); no auxiliary loss;
//  - "deepseek_v3": DeepseekV3ForCausalLM (models/deepseek_v3; DeepSeek-V3, R1, Kimi K2,
//    Moonlight): GLM-4.5's layers and sparse block with Multi-head Latent Attention (DeepSeek-AI
//    2024, "DeepSeek-V2", section 2.1; mla(), LlamaModel::mla_forward): the queries (optionally)
//    and the keys and values compressed through low-rank projections with their own RMSNorms,
//    each head's q and k a part without RoPE and a rope part (k's shared by all heads), values
//    of v_head_dim, yarn's mscale / mscale_all_dim;
//  - "deepseek_v2": DeepseekV2ForCausalLM (models/deepseek_v2; DeepSeek-V2-Lite,
//    DeepSeek-Coder-V2-Lite): DeepSeek-V3's MLA (rope pairs always adjacent, the scores without
//    the mscale factor) and block with softmax routing: the top-k probabilities times
//    routed_scaling_factor, never renormalised, no router bias (topk_method "greedy" only);
//  - "gpt_oss": GptOssForCausalLM (models/gpt_oss; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b
//    Model Card"): Llama's pre-norm layer with biases on q/k/v/o (always), attention sinks
//    (self_attn.sinks [H]: a learned per-head logit in each query's softmax whose column is
//    dropped; kernels.hpp's attention_sink_forward), every even layer sliding (sliding_window
//    128) and yarn RoPE (factor 32 from 4096, not truncated); every layer sparse: a router with
//    a bias (mlp.router.weight [E, C], .bias [E]) whose top num_experts_per_tok logits are
//    softmaxed, and experts stored packed in HF's layout (mlp.experts.gate_up_proj [E, C, 2I]
//    with gate and up columns interleaved, gate_up_proj_bias [E, 2I], down_proj [E, I, C],
//    down_proj_bias [E, C]) whose activation is the clamped SwiGLU (u + 1) g sigmoid(1.702 g),
//    g = min(gate, 7), u = clamp(up, -7, 7) (kernels.hpp's clamped_swiglu_forward);
//  - "llama4_text": Llama4ForCausalLM (models/llama4; Meta 2025, Llama 4 Scout and Maverick,
//    whose Llama4ForConditionalGeneration wraps this decoder as its text_config): RoPE on
//    adjacent pairs (apply_rotary_emb's complex product) on all but every
//    no_rope_layer_interval-th layer, those RoPE layers attending within chunks of
//    attention_chunk_size positions ("chunked_attention": key j visible to query i iff they
//    share a chunk) with a weightless per-head L2 norm of q and k after RoPE (use_qk_norm), the
//    NoPE layers global with their queries scaled by log(floor((t + 1) / floor_scale) + 1) *
//    attn_scale + 1 (attn_temperature_tuning); every interleave_moe_layer_step-th layer sparse:
//    a router whose top num_experts_per_tok logits' sigmoids scale each chosen expert's INPUT,
//    experts packed in HF's layout (feed_forward.experts.gate_up_proj [E, C, 2I], gate then up
//    columns, down_proj [E, I, C]) and a shared expert (Llama's MLP of intermediate_size); the
//    other layers Llama's MLP of intermediate_size_mlp (feed_forward.*);
//  - "qwen3_5_text": Qwen3_5ForCausalLM (models/qwen3_5, the text decoder of Qwen3.5, whose
//    Qwen3_5ForConditionalGeneration wraps it as its text_config; layers of Qwen3-Next's,
//    models/qwen3_next), a hybrid of linear and full attention: layer l is a Gated DeltaNet
//    (Yang et al. 2025, "Gated Delta Networks"; Qwen3_5GatedDeltaNet, layer_linear()) unless
//    (l + 1) % full_attention_interval == 0 (HF's layer_types). A linear layer's token mixer:
//    in_proj_qkv(n1) through a causal depthwise conv1d of linear_conv_kernel_dim taps and
//    SiLU, split into q, k (linear_num_key_heads of linear_key_head_dim) and v
//    (linear_num_value_heads of linear_value_head_dim); the gated delta rule over them with
//    beta = sigmoid(in_proj_b(n1)) and decay exp(-exp(A_log) softplus(in_proj_a(n1) +
//    dt_bias)) (kernels.hpp's causal_conv1d_forward, gated_delta_rule_forward); each head's
//    output RMSNormed (linear_attn.norm, a plain weight) times silu(in_proj_z(n1)); out_proj.
//    A full layer: Qwen3's attention (per-head q_norm / k_norm, partial_rotary_factor of each
//    head rotated) whose q_proj also gives a per-head gate, the attention's output times
//    sigmoid(gate) before o_proj (Qwen3NextAttention; gated_attention()). Every RMSNorm but
//    the linear layers' scales by (1 + weight) (Qwen3_5RMSNorm is Gemma3RMSNorm); the MLP is
//    Llama's SwiGLU;
//  - "qwen3_5_moe_text": Qwen3_5MoeForCausalLM (models/qwen3_5_moe; Qwen3.5's MoE models, e.g.
//    Qwen3.5-35B-A3B): Qwen3.5's layers with every MLP sparse as Qwen2-MoE's block (a softmax
//    top-k router whose weights are always renormalised, Qwen3VLMoeTextTopKRouter; experts of
//    moe_intermediate_size; a shared expert scaled by sigmoid(shared_expert_gate)).
//
// The decoder:
//  - embed_tokens [V, C] (no position embedding), nn.Embedding with padding_idx =
//    pad_token_id: the lookup adds nothing to that row's gradient;
//  - num_hidden_layers decoder layers: x + o_proj(attn(RoPE(q_proj(n1)), RoPE(k_proj(n1)),
//    v_proj(n1))), n1 = input_layernorm(x); then h + down_proj(silu(gate_proj(n2)) *
//    up_proj(n2)), n2 = post_attention_layernorm(h). RMSNorm (Zhang & Sennrich 2019) in fp32,
//    then scaled by its weight (HF LlamaRMSNorm). RoPE (Su et al. 2021) in HF's rotate-half
//    layout on q and k, optionally with linear, Llama 3.1's "llama3" or YaRN frequency scaling
//    (llama_inv_freq; YaRN also scales cos and sin, llama_rope_attention_scaling); grouped-query
//    attention (Ainslie et al. 2023): num_key_value_heads K/V heads, each shared by
//    num_attention_heads / num_key_value_heads query heads (HF repeat_kv), causal, scaled by
//    1/sqrt(head_dim). Optional biases on q/k/v/o (attention_bias) and the MLP (mlp_bias);
//    Qwen3's q_norm / k_norm: RMSNorm of each head's D values with weight [D], as HF's
//    Qwen3Attention applies them to q_proj(n1) and k_proj(n1) viewed [.., heads, D];
//  - final `norm` (RMSNorm) and lm_head [V, C], or the embedding when tie_word_embeddings.
//
// Parameter and module names are HF's state-dict and module names ("model.layers.3.mlp.
// up_proj.weight", module "model.layers.3"): merges and init_from need no renaming, and
// nn.Linear's [out, in] layout is ours. FSDP units: one per decoder layer (the wrap class:
// <prefix>DecoderLayer: LlamaDecoderLayer, ..., Olmo2DecoderLayer); embed_tokens,
// norm and lm_head in the root unit. The vocabulary is padded to model.pad_vocab_multiple rows
// as for GPT-2 (fsdp/model/gpt2.hpp). Initialisation is HF LlamaPreTrainedModel._init_weights
// (the other classes initialise alike): Linear and Embedding N(0, initializer_range),
// biases 0, RMSNorm weights 1 (Gemma 3's 0), the pad_token_id row and vocabulary pad rows 0.
// AdamW decays the Linear weights only (not the norms, biases or embedding), as fsdp_train's
// GPT-2 and T5.
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

// Which Hugging Face class a Llama-family model is: model.type, HF's model_type.
enum class LlamaArch {
  llama,
  mistral,
  qwen2,
  qwen3,
  olmo2,
  phi3,
  gemma3_text,
  smollm3,
  granite,
  olmo3,
  gemma2,
  gemma,
  exaone4,
  qwen3_moe,
  mixtral,
  olmoe,
  qwen2_moe,
  glm4_moe,
  deepseek_v3,
  deepseek_v2,
  gpt_oss,
  llama4_text,
  qwen3_5_text,
  qwen3_5_moe_text
};

template <>
struct EnumNames<LlamaArch> {
  static constexpr EnumName<LlamaArch> table[] = {{LlamaArch::llama, "llama"},
                                                  {LlamaArch::mistral, "mistral"},
                                                  {LlamaArch::qwen2, "qwen2"},
                                                  {LlamaArch::qwen3, "qwen3"},
                                                  {LlamaArch::olmo2, "olmo2"},
                                                  {LlamaArch::phi3, "phi3"},
                                                  {LlamaArch::gemma3_text, "gemma3_text"},
                                                  {LlamaArch::smollm3, "smollm3"},
                                                  {LlamaArch::granite, "granite"},
                                                  {LlamaArch::olmo3, "olmo3"},
                                                  {LlamaArch::gemma2, "gemma2"},
                                                  {LlamaArch::gemma, "gemma"},
                                                  {LlamaArch::exaone4, "exaone4"},
                                                  {LlamaArch::qwen3_moe, "qwen3_moe"},
                                                  {LlamaArch::mixtral, "mixtral"},
                                                  {LlamaArch::olmoe, "olmoe"},
                                                  {LlamaArch::qwen2_moe, "qwen2_moe"},
                                                  {LlamaArch::glm4_moe, "glm4_moe"},
                                                  {LlamaArch::deepseek_v3, "deepseek_v3"},
                                                  {LlamaArch::deepseek_v2, "deepseek_v2"},
                                                  {LlamaArch::gpt_oss, "gpt_oss"},
                                                  {LlamaArch::llama4_text, "llama4_text"},
                                                  {LlamaArch::qwen3_5_text, "qwen3_5_text"},
                                                  {LlamaArch::qwen3_5_moe_text, "qwen3_5_moe_text"}};
};

// HF's class-name prefix of `arch`: "Llama", "Mistral", "Qwen2", "Qwen3", "Olmo2", "Phi3",
// "Gemma3", "SmolLM3", "Granite", "Olmo3", "Gemma2", "Gemma", "Exaone4", "Qwen3Moe",
// "Mixtral", "Olmoe", "Qwen2Moe", "Glm4Moe", "DeepseekV3", "DeepseekV2", "GptOss",
// "Llama4Text", "Qwen3_5", "Qwen3_5Moe" (the classes
// <prefix>DecoderLayer, <prefix>RMSNorm, <prefix>ForCausalLM and, but for Gemma 3's
// Gemma3TextConfig, <prefix>Config).
const char* llama_arch_prefix(LlamaArch arch);

// Hugging Face LlamaConfig's fields, and those of MistralConfig, Qwen2Config, Qwen3Config,
// Olmo2Config, Phi3Config, Gemma3TextConfig, SmolLM3Config, GraniteConfig, Olmo3Config,
// Gemma2Config, GemmaConfig, Exaone4Config, Qwen3MoeConfig, MixtralConfig, OlmoeConfig,
// Qwen2MoeConfig, Glm4MoeConfig, DeepseekV3Config, DeepseekV2Config, GptOssConfig,
// Llama4TextConfig, Qwen3_5TextConfig and Qwen3_5MoeTextConfig ([model] with type =
// "llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "gemma3_text", "smollm3", "granite",
// "olmo3", "gemma2", "gemma", "exaone4", "qwen3_moe", "mixtral", "olmoe", "qwen2_moe",
// "glm4_moe", "deepseek_v3", "deepseek_v2", "gpt_oss", "llama4_text", "qwen3_5_text" or
// "qwen3_5_moe_text"; same
// names, meanings and, where HF has them, defaults; sizes default to a small CPU model). Each
// type's [model] key table, with docs and ranges, is llama_args(arch) in src/model/llama.cpp:
// a field that is not one of its type's keys keeps the default here (Qwen2 has no
// attention_bias, mlp_bias or head_dim, OLMo 2 no mlp_bias or head_dim, Phi-3 none of the
// three, SmolLM3 and Granite no head_dim; only Qwen's have max_window_layers, only Qwen's and
// SmolLM3's use_sliding_window, only Gemma 3's the three fields below pad_token_id (Gemma 2
// has query_pre_attn_scalar; its pattern is a fixed 2), only SmolLM3's
// no_rope_layer_interval, only Granite's the four multipliers, only Phi-3's the LongRoPE
// factor lists, original_max_position_embeddings and partial_rotary_factor, only Gemma 2's
// the two soft-caps, only the MoE classes the experts' fields (Mixtral's number of experts is
// num_local_experts, it always renormalises; moe_intermediate_size is Qwen's, Mixtral's and
// OLMoE's experts are intermediate_size wide; only Qwen2-MoE has a shared expert)).
struct LlamaConfig {
  enum class RopeType { default_, linear, llama3, yarn, longrope };

  LlamaArch arch = LlamaArch::llama;  // model.type (not a [model] key)
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
  // rope_scaling: HF's dict, here its fields; default_ = no scaling (rope_scaling null). Which
  // fields each type reads: rope_fields() in src/model/llama.cpp.
  RopeType rope_type = RopeType::default_;
  double rope_factor = 8.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  double rope_beta_fast = 32.0;         // yarn
  double rope_beta_slow = 1.0;          // yarn
  // yarn, longrope; 0 = HF's None (yarn: 0.1 ln(factor) + 1; longrope:
  // llama_rope_attention_scaling)
  double rope_attention_factor = 0.0;
  bool rope_truncate = true;            // yarn
  // longrope (Phi-3's; transformers' _compute_longrope_parameters): frequency i is divided by
  // short_factor[i], or long_factor[i] when the sequence is longer than
  // original_max_position_embeddings (rotary_dim() / 2 entries each).
  std::vector<double> rope_short_factor;
  std::vector<double> rope_long_factor;
  // Phi3Config's own attributes: the pre-training context length LongRoPE scales from (a
  // top-level attribute, not rope_scaling's), and the fraction of each head RoPE rotates.
  int64_t original_max_position_embeddings = 4096;
  double partial_rotary_factor = 1.0;
  bool attention_bias = false;
  bool mlp_bias = false;
  // Sliding-window attention (Mistral and Phi-3; Qwen2/3 when use_sliding_window, on the
  // layers from max_window_layers on): each query attends to the `sliding_window` latest
  // positions, itself included (transformers' kv_idx > q_idx - sliding_window). Mistral's and
  // Phi-3's 0 is HF's null (no window).
  bool use_sliding_window = false;
  int64_t sliding_window = 4096;
  int64_t max_window_layers = 28;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // nn.Embedding's padding_idx (every class; -1 = HF's None: none): the row starts at 0 and
  // the lookup adds nothing to its gradient.
  int64_t pad_token_id = -1;
  // Gemma 3 (Gemma3TextConfig): the sliding layers' RoPE period, the attention's score scale
  // query_pre_attn_scalar^-1/2, which layers slide (l + 1 not a multiple of
  // sliding_window_pattern).
  double rope_local_base_freq = 10000.0;
  int64_t query_pre_attn_scalar = 256;
  int64_t sliding_window_pattern = 6;
  // SmolLM3 (SmolLM3Config): layer l has no RoPE when (l + 1) % no_rope_layer_interval == 0.
  int64_t no_rope_layer_interval = 4;
  // Granite (GraniteConfig; muP-style, 1 = Llama's math): the embedding's output is multiplied
  // by embedding_multiplier, each sublayer's output by residual_multiplier before its residual
  // add, the attention scores by attention_multiplier (instead of 1/sqrt(head_dim)), and the
  // logits divided by logits_scaling.
  double embedding_multiplier = 1.0;
  double residual_multiplier = 1.0;
  double attention_multiplier = 1.0;
  double logits_scaling = 1.0;
  // Gemma 2 (Gemma2Config; 0 = HF's None): tanh soft-caps of the attention scores and of the
  // logits (attention_softcap(), logit_softcap()).
  double attn_logit_softcapping = 50.0;
  double final_logit_softcapping = 30.0;
  // Mixture of experts (moe(); Qwen3MoeConfig, MixtralConfig, OlmoeConfig): num_experts
  // (Mixtral's num_local_experts) SwiGLU experts per layer, num_experts_per_tok of them per
  // token, of width moe_intermediate_size (Qwen3-MoE; Mixtral's and OLMoE's experts are
  // intermediate_size wide: expert_size()); the top-k weights divided by their sum under
  // norm_topk_prob (Mixtral: always, normalize_top_k()).
  int64_t num_experts = 8;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 96;
  int64_t shared_expert_intermediate_size = 128;  // Qwen2-MoE's shared expert (shared_expert())
  bool norm_topk_prob = false;
  // GLM-4.5 (Glm4MoeConfig; DeepSeek-V3's MoE block, DeepseekV3MoE): n_shared_experts shared
  // experts as one SwiGLU MLP n_shared_experts * moe_intermediate_size wide that every token
  // runs, unscaled; sigmoid routing (sigmoid_routing(): kernels.hpp's
  // moe_sigmoid_router_forward) limited to the topk_group best of n_group expert groups, the
  // weights times routed_scaling_factor; the first first_k_dense_replace layers dense (Llama's
  // MLP of intermediate_size, layer_sparse()); use_qk_norm: Qwen3's per-head q_norm / k_norm.
  int64_t n_shared_experts = 1;
  double routed_scaling_factor = 1.0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 1;
  bool use_qk_norm = false;
  // DeepSeek-V3 and V2 (DeepseekV3Config, DeepseekV2Config; mla()): Multi-head Latent
  // Attention (DeepSeek-AI 2024, "DeepSeek-V2", section 2.1). q = q_proj(x), or with
  // q_lora_rank (0 = HF's None) q_b_proj(q_a_layernorm(q_a_proj(x))); each head of q is [nope:
  // qk_nope_head_dim | rope: qk_rope_head_dim]. kv_a_proj_with_mqa(x) = [c: kv_lora_rank |
  // k_rope: qk_rope_head_dim], k_rope one key part all heads share;
  // kv_b_proj(kv_a_layernorm(c)) gives each head [k_nope: qk_nope_head_dim | v: v_head_dim].
  // RoPE on the rope parts, in adjacent pairs (2i, 2i+1) under rope_interleave (HF's
  // apply_rotary_pos_emb_interleave; DeepSeek-V2 always), else rotate-half. The two lora norms
  // use eps 1e-6 whatever rms_norm_eps is (HF builds them with the class default).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 16;
  int64_t qk_nope_head_dim = 16;
  int64_t qk_rope_head_dim = 8;
  int64_t v_head_dim = 16;
  bool rope_interleave = true;
  // yarn's mscale and mscale_all_dim (DeepSeek's rope_scaling; 0 = HF's None): cos and sin
  // scale by get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) and the scores by
  // get_mscale(factor, mscale_all_dim)^2 (DeepSeek-V3 only; llama_rope_attention_scaling,
  // attention_scale()).
  double rope_mscale = 0.0;
  double rope_mscale_all_dim = 0.0;
  // The auxiliary load-balancing loss (HF's output_router_logits, router_aux_loss_coef;
  // aux_loss()): loss + router_aux_loss_coef * E sum_e f_e P_e over all layers' tokens.
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  // Llama 4 (Llama4TextConfig; llama4()): the dense layers' MLP width, every
  // interleave_moe_layer_step-th layer sparse (layer_sparse()), the RoPE layers' chunk
  // (layer_chunk(); 0 = none), the NoPE layers' query temperature (attn_temperature_tuning:
  // q times log(floor((t + 1) / floor_scale) + 1) * attn_scale + 1 at position t).
  int64_t intermediate_size_mlp = 688;
  int64_t interleave_moe_layer_step = 1;
  int64_t attention_chunk_size = 8192;
  bool attn_temperature_tuning = true;
  int64_t floor_scale = 8192;
  double attn_scale = 0.1;
  // Qwen3.5 (Qwen3_5TextConfig; qwen3_5()): layer l is linear attention (layer_linear) unless
  // (l + 1) % full_attention_interval == 0 (HF derives layer_types from it); the linear
  // layers' heads (linear_num_key_heads q/k heads of linear_key_head_dim, each shared by
  // linear_num_value_heads / linear_num_key_heads value heads of linear_value_head_dim) and
  // their causal conv's taps.
  // (small CPU-model sizes, as above; a config.json without them means HF's 16 and 32 heads
  // of 128)
  int64_t full_attention_interval = 4;
  int64_t linear_conv_kernel_dim = 4;
  int64_t linear_key_head_dim = 16;
  int64_t linear_value_head_dim = 16;
  int64_t linear_num_key_heads = 2;
  int64_t linear_num_value_heads = 4;
  int64_t pad_vocab_multiple = kDefaultPadVocabMultiple;
  // model.fused_linear_cross_entropy[_chunk_rows] (not LlamaConfig keys): the chunked LM head.
  FusedLinearCrossEntropy fused_lce;

  // Multi-head Latent Attention (DeepSeek-V3): the attention's own projections (q, kv
  // compressed to kv_lora_rank, per-head k_nope and v), heads of q and k head_size() =
  // qk_nope_head_dim + qk_rope_head_dim wide, of v v_head_dim wide.
  bool mla() const { return arch == LlamaArch::deepseek_v3 || arch == LlamaArch::deepseek_v2; }
  int64_t kv_heads() const {
    if (mla()) return num_attention_heads;  // (MLA's keys and values are per head)
    return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads;
  }
  int64_t head_size() const {
    if (mla()) return qk_nope_head_dim + qk_rope_head_dim;
    return head_dim > 0 ? head_dim : hidden_size / num_attention_heads;
  }
  // The width of each head of the attention's output (o_proj's input: H of them).
  int64_t value_head_size() const { return mla() ? v_head_dim : head_size(); }
  // The columns of each q / k head RoPE rotates, from the first (the rest pass through):
  // int(head_size() * partial_rotary_factor), as HF's rope init computes `dim`; MLA's
  // qk_rope_head_dim (HF's DeepseekV3Config.head_dim), which its layout puts first (mla_forward).
  int64_t rotary_dim() const {
    if (mla()) return qk_rope_head_dim;
    return static_cast<int64_t>(static_cast<double>(head_size()) * partial_rotary_factor);
  }
  int64_t padded_vocab() const { return padded_vocab_size(vocab_size, pad_vocab_multiple); }
  // Qwen3-MoE, Mixtral, OLMoE, Qwen2-MoE, GLM-4.5: a layer's MLP is a router and num_experts
  // experts (GLM-4.5's from layer first_k_dense_replace on: layer_sparse()).
  bool moe() const {
    return arch == LlamaArch::qwen3_moe || arch == LlamaArch::mixtral ||
           arch == LlamaArch::olmoe || arch == LlamaArch::qwen2_moe || deepseek_moe() ||
           gpt_oss() || llama4() || arch == LlamaArch::qwen3_5_moe_text;
  }
  // Llama 4's text decoder (Llama4TextConfig).
  bool llama4() const { return arch == LlamaArch::llama4_text; }
  // Qwen3.5's text decoders (Qwen3_5TextConfig, Qwen3_5MoeTextConfig: its layers with
  // Qwen2-MoE's sparse block as every MLP).
  bool qwen3_5() const {
    return arch == LlamaArch::qwen3_5_text || arch == LlamaArch::qwen3_5_moe_text;
  }
  // Whether decoder layer `layer` is Qwen3.5's Gated DeltaNet (linear_attn.*) rather than
  // attention (self_attn.*): HF's layer_types "linear_attention".
  bool layer_linear(int64_t layer) const {
    return qwen3_5() && (layer + 1) % full_attention_interval != 0;
  }
  // Qwen3-Next's gated attention: q_proj's rows give each head its query and then a gate of
  // the same width ([H, 2D] per token), and the attention's output is multiplied by
  // sigmoid(gate) before o_proj (kernels.hpp's sigmoid_gate_forward).
  bool gated_attention() const { return qwen3_5(); }
  // The linear layers' widths: q and k (each linear_key_dim()), v and the output
  // (linear_value_dim()), and the conv's channels q, k, v (linear_conv_dim()).
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
  // Llama 4's routing: the chosen experts' sigmoid scores scale each expert's input (not its
  // output; Llama4TextMoe's routed_in), the outputs summed unweighted.
  bool input_scaled_routing() const { return llama4(); }
  // The chunk of decoder layer `layer`'s attention (Llama 4's RoPE layers: key j visible to
  // query i iff j // chunk == i // chunk, besides causality; 0: none).
  int64_t layer_chunk(int64_t layer) const {
    return llama4() && layer_rope(layer) ? attention_chunk_size : 0;
  }
  // Llama 4's NoPE layers' query scale at position t (attn_temperature_tuning): exactly 1 while
  // t + 1 < floor_scale.
  double temperature_scale(int64_t t) const;
  // gpt-oss (GptOssForCausalLM): attention sinks, a router with a bias, packed experts with
  // biases and the clamped SwiGLU (packed_experts()).
  bool gpt_oss() const { return arch == LlamaArch::gpt_oss; }
  // A learned per-head sink logit in the attention's softmax (self_attn.sinks [H]).
  bool attention_sinks() const { return gpt_oss(); }
  // The experts are HF's packed tensors, read as x @ W[e]: gate_up_proj [E, C, 2I] and
  // down_proj [E, I, C]. gpt-oss's (GptOssExperts) have biases, their gate and up columns
  // interleaved and clamped_swiglu_forward's activation, and the router a bias (mlp.router.bias
  // [E], trained); Llama 4's (Llama4TextExperts) are gate then up columns, SwiGLU, no biases.
  bool packed_experts() const { return gpt_oss() || llama4(); }
  // GptOssExperts' fixed constants (HF hard-codes them; config.json's swiglu_limit is not
  // read by the class).
  static constexpr float kClampedSwigluAlpha = 1.702f;
  static constexpr float kClampedSwigluLimit = 7.0f;
  // DeepSeek's MoE block (DeepseekV3MoE, DeepseekV2Moe: dense first layers, ungated shared
  // experts, routed_scaling_factor, fp32 router logits), which GLM-4.5 (Glm4MoeMoE) has too;
  // DeepSeek-V2's routes by softmax (not sigmoid_routing()).
  bool deepseek_moe() const { return arch == LlamaArch::glm4_moe || mla(); }
  // Whether decoder layer `layer` is sparse (a router and experts) rather than Llama's dense
  // MLP of intermediate_size: every layer of a moe() class but GLM-4.5's first
  // first_k_dense_replace.
  bool layer_sparse(int64_t layer) const {
    if (llama4()) return (layer + 1) % interleave_moe_layer_step == 0;  // HF's moe_layers
    return moe() && (!deepseek_moe() || layer >= first_k_dense_replace);
  }
  int64_t expert_size() const {
    return arch == LlamaArch::qwen3_moe || arch == LlamaArch::qwen2_moe || deepseek_moe() ||
                   arch == LlamaArch::qwen3_5_moe_text
               ? moe_intermediate_size
               : intermediate_size;
  }
  // A shared expert beside the routed ones that every token runs: Qwen2-MoE's, scaled by a
  // per-token sigmoid gate (shared_expert_gated()), and GLM-4.5's n_shared_experts, unscaled;
  // shared_size() wide.
  bool shared_expert() const {
    return shared_expert_gated() || deepseek_moe() || llama4();
  }
  // (Qwen3.5-MoE's block is Qwen2-MoE's)
  bool shared_expert_gated() const {
    return arch == LlamaArch::qwen2_moe || arch == LlamaArch::qwen3_5_moe_text;
  }
  int64_t shared_size() const {
    return deepseek_moe() ? n_shared_experts * moe_intermediate_size
           : llama4()     ? intermediate_size
                          : shared_expert_intermediate_size;
  }
  // DeepSeek-V3's routing (GLM-4.5): sigmoid scores, e_score_correction_bias, groups, the
  // scaling factor (moe_sigmoid_router_forward); the others: softmax top-k (moe_router_forward).
  // The router's logits are then fp32, as HF's DeepseekV3TopkRouter computes them. Llama 4
  // routes by sigmoid too (the K largest logits' sigmoids, no groups, no bias, not
  // renormalised; its logits in the activations' dtype, as Llama4Router's).
  bool sigmoid_routing() const {
    return (deepseek_moe() && arch != LlamaArch::deepseek_v2) || llama4();
  }
  // DeepSeek-V3's e_score_correction_bias (GLM-4.5's too): the buffer the sigmoid routing
  // chooses by, and its expert groups (n_group, topk_group).
  bool selection_bias() const { return sigmoid_routing() && !llama4(); }
  // (HF's DeepseekV2Moe ignores norm_topk_prob: never.)
  // (Qwen3.5-MoE's router, Qwen3VLMoeTextTopKRouter, has no norm_topk_prob: always.)
  // (gpt-oss softmaxes its top-k logits: the same weights, always.)
  bool normalize_top_k() const {
    return arch == LlamaArch::mixtral || gpt_oss() || arch == LlamaArch::qwen3_5_moe_text ||
           (norm_topk_prob && arch != LlamaArch::deepseek_v2);
  }
  // Whether the loss has the load-balancing term (a coefficient of 0 adds nothing).
  // (GLM-4.5 has none: output_router_logits is not one of its keys.)
  bool aux_loss() const {
    return moe() && !deepseek_moe() && !llama4() && output_router_logits &&
           router_aux_loss_coef != 0.0;
  }
  // The rows and width of layer `layer`'s MLP activations (gate, up, silu(gate) * up): BT
  // tokens of intermediate_size, or when layer_sparse(layer) BT * num_experts_per_tok routed
  // rows of expert_size().
  int64_t mlp_rows_per_token(int64_t layer) const {
    return layer_sparse(layer) ? num_experts_per_tok : 1;
  }
  int64_t mlp_width(int64_t layer) const {
    return layer_sparse(layer) ? expert_size()
           : llama4()          ? intermediate_size_mlp
                               : intermediate_size;
  }
  // Biases on q_proj, k_proj, v_proj (Qwen2 always; the others with attention_bias) and on
  // o_proj (attention_bias).
  bool qkv_bias() const {
    return attention_bias || arch == LlamaArch::qwen2 || arch == LlamaArch::qwen2_moe ||
           gpt_oss();
  }
  // (GLM-4.5's o_proj: none; DeepSeek-V3's under attention_bias; gpt-oss's always: GptOssConfig
  // sets attention_bias true whatever it is given)
  bool o_bias() const { return (attention_bias && arch != LlamaArch::glm4_moe) || gpt_oss(); }
  // An RMSNorm of q and k after their projections, before RoPE (self_attn.q_norm, k_norm):
  // Qwen3's (and Qwen3-MoE's) over each head's D values (weight [D]), OLMo 2's (and OLMoE's)
  // over the whole projection (weights [H*D], [Hkv*D]).
  // (Llama 4's: on its RoPE layers, weightless and after RoPE: llama4_attention_forward)
  bool qk_norm() const {
    return qwen3_attention() || olmo_layer() || gemma3() || qwen3_5() || arch == LlamaArch::olmoe ||
           ((arch == LlamaArch::glm4_moe || llama4()) && use_qk_norm);
  }
  bool qk_norm_per_head() const {
    return qwen3_attention() || gemma3() || qwen3_5() || arch == LlamaArch::exaone4 ||
           ((arch == LlamaArch::glm4_moe || llama4()) && use_qk_norm);
  }
  // Qwen3's attention (per-head q_norm / k_norm): Qwen3 and Qwen3-MoE.
  bool qwen3_attention() const { return arch == LlamaArch::qwen3 || arch == LlamaArch::qwen3_moe; }
  // Norms on the sublayers' inputs (input_layernorm before the attention, Llama's
  // post_attention_layernorm or Gemma's pre_feedforward_layernorm before the MLP): all but
  // OLMo 2's layer.
  bool norm_before() const { return !olmo_layer(); }
  // Norms on the sublayers' outputs before their residual adds (post_attention_layernorm,
  // post_feedforward_layernorm): OLMo 2 (instead of the input norms) and Gemma 2 and 3
  // (besides them).
  bool norm_after() const { return olmo_layer() || gemma2_layer(); }
  // Gemma 1, 2 and 3 (GemmaConfig, Gemma2Config, Gemma3TextConfig): the (1 + weight) norms,
  // GeGLU, the scaled embedding, a padding row.
  bool gemma() const { return arch == LlamaArch::gemma || gemma2_layer(); }
  // Gemma 2's layer, Gemma 3's too: four norms, scores scaled by query_pre_attn_scalar^-1/2,
  // sliding and global layers.
  bool gemma2_layer() const { return arch == LlamaArch::gemma2 || gemma3(); }
  // Gemma 3 (Gemma3TextConfig) alone.
  bool gemma3() const { return arch == LlamaArch::gemma3_text; }
  // OLMo 2 and OLMo 3 (Olmo2Config, Olmo3Config: OLMo 3's layers are OLMo 2's).
  bool olmo() const { return arch == LlamaArch::olmo2 || arch == LlamaArch::olmo3; }
  // OLMo 2's layer (norms on the sublayers' outputs only): OLMo 2, OLMo 3 and EXAONE 4
  // (Exaone4DecoderLayer is Olmo2DecoderLayer).
  bool olmo_layer() const { return olmo() || arch == LlamaArch::exaone4; }
  // Gemma 2's, Gemma 3's and OLMo 3's pattern: layer l slides unless (l + 1) %
  // sliding_window_pattern == 0 (Gemma 2: always 2, its even layers slide).
  bool patterned_window() const {
    return gemma2_layer() || arch == LlamaArch::olmo3 || arch == LlamaArch::exaone4 || gpt_oss();
  }
  // Every RMSNorm multiplies by (1 + weight) (GemmaRMSNorm, Gemma2RMSNorm, Gemma3RMSNorm;
  // Qwen3_5RMSNorm, but for the linear layers' gated norm), its weights initialised to 0.
  bool norm_weight_offset() const { return gemma() || qwen3_5(); }
  // The MLP's activation: gelu_tanh(gate) * up ("gelu_pytorch_tanh", GeGLU), not SwiGLU.
  bool gelu_mlp() const { return gemma(); }
  // What the token embedding's output is multiplied by: sqrt(hidden_size) for Gemma (HF
  // rounds it to the weight's dtype first), Granite's embedding_multiplier, 1 otherwise.
  double embed_scale() const;
  // The attention's score scale: query_pre_attn_scalar^-1/2 (Gemma 2, 3; HF's Python float,
  // rounded once to fp32), Granite's attention_multiplier, else 1/sqrt(head_dim).
  float attention_scale() const;
  // What each sublayer's output is multiplied by before its residual add (Granite's
  // residual_multiplier; 1 otherwise), and the logits (1 / logits_scaling; 1 otherwise).
  float residual_scale() const {
    return arch == LlamaArch::granite ? static_cast<float>(residual_multiplier) : 1.f;
  }
  float logit_scale() const {
    return arch == LlamaArch::granite ? static_cast<float>(1.0 / logits_scaling) : 1.f;
  }
  // Gemma 2's soft-caps as the kernels take them (kernels.hpp's softcap; 0: none, and for
  // every other class).
  float attention_softcap() const {
    return arch == LlamaArch::gemma2 ? static_cast<float>(attn_logit_softcapping) : 0.f;
  }
  float logit_softcap() const {
    return arch == LlamaArch::gemma2 ? static_cast<float>(final_logit_softcapping) : 0.f;
  }
  // Whether the sliding layers have a RoPE table of their own (llama_local_rope_config):
  // Gemma 3 and OLMo 3.
  bool local_rope() const { return gemma3() || arch == LlamaArch::olmo3; }
  // Whether decoder layer `layer` uses the local RoPE (llama_local_rope_config: no scaling;
  // Gemma 3's period rope_local_base_freq): the sliding layers of Gemma 3 and OLMo 3 (Gemma 2's
  // sliding layers share the global RoPE).
  bool layer_local_rope(int64_t layer) const;
  // Whether decoder layer `layer` is a sliding layer of patterned_window()'s pattern
  // ((layer + 1) % sliding_window_pattern != 0; false for the other classes).
  bool pattern_slides(int64_t layer) const {
    return patterned_window() && (layer + 1) % sliding_window_pattern != 0;
  }
  // Whether decoder layer `layer` rotates q and k at all: all but SmolLM3's NoPE layers and
  // EXAONE 4's global layers (when it has a sliding window).
  bool layer_rope(int64_t layer) const;
  // Phi-3's fused projections: self_attn.qkv_proj.weight [Q + 2 KV, C] holds q_proj's, k_proj's
  // and v_proj's rows one after the other (Phi3Attention splits its output so), and
  // mlp.gate_up_proj.weight [2I, C] gate_proj's then up_proj's (Phi3MLP's chunk(2)). The math
  // is Llama's: each projection is its rows of the fused weight (no biases).
  bool fused_projections() const { return arch == LlamaArch::phi3; }
  // The sliding window of decoder layer `layer` (HF's layer_types "sliding_attention": every
  // Mistral layer with a window; Qwen's from max_window_layers on under use_sliding_window;
  // Gemma 3's with (layer + 1) % sliding_window_pattern != 0; SmolLM3's NoPE layers under
  // use_sliding_window), 0 for a layer that attends to every earlier position.
  int64_t layer_window(int64_t layer) const;
  // From the [model] section (a type of LlamaArch);
  // throws fsdp::Error on a missing key.
  static LlamaConfig from(const ModelConfig& config);
};

// rope_scaling.rope_type's spellings: HF's rope_type names.
template <>
struct EnumNames<LlamaConfig::RopeType> {
  static constexpr EnumName<LlamaConfig::RopeType> table[] = {
      {LlamaConfig::RopeType::default_, "default"},
      {LlamaConfig::RopeType::linear, "linear"},
      {LlamaConfig::RopeType::llama3, "llama3"},
      {LlamaConfig::RopeType::yarn, "yarn"},
      {LlamaConfig::RopeType::longrope, "longrope"}};
};

// The R/2 RoPE inverse frequencies (radians per position) of `c` (R = c.rotary_dim()) for
// sequences of `seq_len` tokens, in float64: HF's rope_init_fn, 1 / rope_theta^(2i/R), then by
// rope_type (transformers' modeling_rope_utils.py):
//  - linear (Position Interpolation, Chen et al. 2023; _compute_linear_scaling_rope_parameters):
//    every frequency divided by factor;
//  - llama3 (Llama 3.1; _compute_llama3_parameters): wavelengths above
//    original/low_freq_factor divided by factor, below original/high_freq_factor kept,
//    smoothly interpolated between;
//  - yarn (Peng et al. 2023, YaRN; _compute_yarn_parameters): dimension i keeps its frequency
//    (extrapolates) below the correction range [low, high] and is divided by factor
//    (interpolates) above it, linearly in between, where low / high are the dimensions
//    d(r) = D ln(original / (2 pi r)) / (2 ln theta) of beta_fast and beta_slow rotations
//    over original_max_position_embeddings (floored / ceiled when truncate), clamped to
//    [0, D - 1];
//  - longrope (LongRoPE, Ding et al. 2024; _compute_longrope_parameters): frequency i divided
//    by long_factor[i] when seq_len > original_max_position_embeddings (Phi3Config's
//    attribute), else by short_factor[i] (HF's RotaryEmbedding switches on the batch's
//    positions, here the data.seq_len the table covers; 0 = short).
// Throws fsdp::Error when longrope's factor lists do not have R/2 entries.
std::vector<double> llama_inv_freq(const LlamaConfig& c, int64_t seq_len = 0);
// The config whose llama_inv_freq and llama_rope_attention_scaling are the sliding layers'
// RoPE: `c` without scaling, and for Gemma 3 rope_theta = rope_local_base_freq
// (Gemma3TextModel's rotary_emb_local, Olmo3Model's rotary_embs["sliding_attention"]).
LlamaConfig llama_local_rope_config(const LlamaConfig& c);
// What HF multiplies cos and sin by (LlamaRotaryEmbedding's attention_scaling; q.k then
// scales by its square): yarn's and longrope's attention_factor, or when that is 0 (HF's
// None) yarn's 0.1 ln(factor) + 1 (1 for factor <= 1) and longrope's sqrt(1 + ln s / ln o),
// s = max_position_embeddings / o, o = original_max_position_embeddings (1 for s <= 1:
// Phi-3's ratio, whatever the sequence length); 1 for the other types.
double llama_rope_attention_scaling(const LlamaConfig& c);

// The registry's entry of model.type `arch` (fsdp/model/model.hpp).
const ModelFamily& llama_family(LlamaArch arch = LlamaArch::llama);
// Every LlamaArch, in its order (the registry lists their families so).
std::vector<LlamaArch> llama_archs();

// Modules in forward order: "model.embed_tokens" (class "Embedding", Gemma 3's
// "Gemma3TextScaledWordEmbedding", Gemma 1's and 2's "GemmaTextScaledWordEmbedding":
// embed_tokens.weight [Vp,C], row pad_token_id initialised to 0), "model.layers.{l}" (class
// "<prefix>DecoderLayer"; its norms input_layernorm and post_attention_layernorm, OLMo 2's
// post_attention_layernorm and post_feedforward_layernorm, Gemma 2's and 3's
// input_layernorm, post_attention_layernorm, pre_feedforward_layernorm and
// post_feedforward_layernorm; Phi-3's fused qkv_proj and gate_up_proj), "model.norm" (class
// "<prefix>RMSNorm"), and "lm_head" (class "Linear", lm_head.weight [Vp,C]) unless tied;
// <prefix> is llama_arch_prefix(config.arch).
std::vector<ModuleDecl> llama_modules(const LlamaConfig& config);

class LlamaModel final : public CausalLm {
 public:
  // activation_dtype: storage of activations and their gradients (the mixed-precision
  // param_dtype); RMSNorm statistics, attention's logsumexp and the RoPE tables stay fp32.
  // activation_checkpointing: as Gpt2Model (every layer or the first N; one shared set of
  // per-layer buffers, recomputed in each such layer's backward; bit-identical results).
  LlamaModel(const LlamaConfig& config, Kernels& kernels, DType activation_dtype = DType::f32,
             ActivationCheckpointing activation_checkpointing = {});
  ~LlamaModel() override;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  const std::vector<ModuleDecl>& modules() const override { return modules_; }
  // The head's output, before Gemma 2's final soft-cap (which the loss kernel applies; HF's
  // logits are after it). Throws fsdp::Error under model.fused_linear_cross_entropy.
  TensorView last_logits() const override;
  // Decoder layer `layer`'s router logits of the last forward, [B*T, num_experts] (the
  // routing's inputs: tests check its margins; fp32 under sigmoid_routing(), else the
  // activations' dtype). A null view (data nullptr) before a forward, for a dense layer (or
  // model), and for a layer that shares its buffers with recomputed ones (activation
  // checkpointing).
  TensorView router_logits(int64_t layer) const;
  double take_max_expert_load() override;
  std::vector<RouterLoad> take_router_loads() override;

  // Bytes of activations (saved for backward, their gradients, scratch, the RoPE tables) for a
  // [B,T] micro-batch; exactly what forward allocates (the logits [B*T, Vp], or one chunk of
  // them under config.fused_lce; with `docs`, the buffers of document masking).
  static int64_t activation_bytes(const LlamaConfig& config, int64_t B, int64_t T,
                                  DType activation_dtype,
                                  ActivationCheckpointing activation_checkpointing = {},
                                  DocumentMasking docs = {});

 private:
  struct Acts;
  const char* family_name() const override { return llama_arch_prefix(cfg_.arch); }
  bool supports_documents() const override { return true; }
  void ensure_buffers(int64_t B, int64_t T);
  // RoPE's cos and sin tables for B rows of T tokens (the sliding layers' when `local`), and
  // the (B, T) rope_forward indexes them with: [T, R/2] by position in the row, (B, T); under
  // Documents::reset_positions one row per token [B*T, R/2], (1, B*T).
  struct RopeTables {
    TensorView cos, sin;
    int64_t B, T;
  };
  RopeTables rope_tables(bool local, int64_t B, int64_t T) const;
  // The running micro-batch's document starts, int32 [BT] (gqa_attention's doc_start), or a
  // null view without document masking.
  TensorView doc_start(int64_t BT) const;
  // Layer l's doc_start for Llama 4's chunked attention under document masking: one call over
  // the row whose starts are the later of the document's and the chunk's (Acts::chunk_start),
  // the masks of HF's chunked and packed-sequence overlays together; doc_start(BT) on a layer
  // without chunks.
  TensorView chunk_doc_start(int64_t l, int64_t BT) const;
  // forward's start, with documents (docs_): uploads their positions and starts
  // (upload_documents), Llama 4's chunk starts, and under reset_positions gathers the RoPE
  // tables' rows; throws fsdp::Error naming the entry when a row's positions do not count up
  // from 0 (restarting only at 0).
  void prepare_documents(int64_t B, int64_t T);
  void forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
               ModuleHooks& hooks, bool backward, float grad_scale, const TensorView& loss) override;
  void backward(int64_t B, int64_t T, ModuleHooks& hooks, float grad_scale,
                const TensorView& loss) override;
  void layer_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks, bool write_output);
  // moe(): layer l's sparse MLP on its post_attention_layernorm output (in Acts::dln) over BT
  // tokens: the router, the top-k routing, the grouping of the routed rows by expert, the
  // experts' SwiGLU MLPs; with write_output res[l + 1] = res2 + the weighted sum of each
  // token's expert outputs.
  void moe_forward(int64_t l, int64_t BT, ModuleHooks& hooks, bool write_output);
  // Its backward from dres (d res[l + 1]): every router and expert weight gradient, and dres
  // += d res2 through post_attention_layernorm (weight `norm_weight`). `recompute`: the
  // layer's forward has just been recomputed (act and ln2 in place).
  void moe_backward(int64_t l, int64_t BT, ModuleHooks& hooks, const TensorView& norm_weight,
                    bool recompute);
  // packed_experts() (gpt-oss): the experts' part of moe_forward, on the routed rows (in
  // Acts::moe_rows): gate_up, the clamped SwiGLU, down_proj, into the experts' outputs.
  void packed_experts_forward(int64_t l, int64_t BT, ModuleHooks& hooks);
  // Its backward from the experts' output gradients (in Acts::moe_rows; ln2 in Acts::dln): every
  // expert weight and bias gradient, and each routed row's input gradient into Acts::moe_rows.
  void packed_experts_backward(int64_t l, int64_t BT, ModuleHooks& hooks, bool recompute);
  // llama4(): layer l's attention on xin [BT, C] (input_layernorm's output): q, k, v; on a
  // RoPE layer q and k de-interleaved per head (adjacent pairs to rotate-half), rotated, then
  // L2-normed per head (use_qk_norm; the pre-norm values kept in q_raw, k_raw); on a NoPE
  // layer q scaled by the temperature; the attention within chunks (layer_chunk) into atty.
  void llama4_attention_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                const TensorView& xin);
  // Its backward from datty (d atty): every projection's weight gradient and dxin (=, into
  // the dln scratch that held xin; recomputed first) through them.
  void llama4_attention_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                 const TensorView& xin, const TensorView& dxin);
  // The attention core of layer l over chunks of layer_chunk(l) positions (one call when the
  // chunk is 0 or covers T): each chunk is a sequence of its own, the lse laid out per call.
  void chunked_attention_forward(int64_t l, int64_t B, int64_t T, const TensorView& out,
                                 const TensorView& lse, const TensorView& q, const TensorView& k,
                                 const TensorView& v);
  void chunked_attention_backward(int64_t l, int64_t B, int64_t T, const TensorView& dq,
                                  const TensorView& dk, const TensorView& dv,
                                  const TensorView& dout, const TensorView& q,
                                  const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& lse);
  // llama4(): the experts' part of moe_forward / moe_backward (the routed rows already scaled
  // by their scores): gate_up as [2I, n] per expert (transposed GEMMs: gate and up rows
  // contiguous), SwiGLU, down_proj.
  void llama4_experts_forward(int64_t l, int64_t BT, ModuleHooks& hooks);
  void llama4_experts_backward(int64_t l, int64_t BT, ModuleHooks& hooks, bool recompute);
  // mla(): layer l's Multi-head Latent Attention on xin [BT, C] (input_layernorm's output):
  // the projections and their norms, q and k laid out per head as [rope (de-interleaved under
  // rope_interleave) | nope] and rotated, v padded to D, the attention into the layer's atty
  // (D wide a head) and o_proj's input [BT, H v_head_dim] into Acts::mla_o.
  void mla_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks, const TensorView& xin);
  // Its backward from dres = d res2 (o_proj's output gradient, times alpha: Granite's
  // residual_multiplier, 1 here): every weight gradient of the attention, and dres += d res[l]
  // through input_layernorm (weight `norm_weight`, its gradient `norm_grad`).
  void mla_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                    const TensorView& norm_weight, const TensorView& norm_grad);
  // layer_linear(l) (Qwen3.5): layer l's Gated DeltaNet on xin [BT, C] (input_layernorm's
  // output): in_proj_qkv, the causal conv, in_proj_z / b / a, the gated delta rule, the gated
  // RMSNorm, into out_proj's input (Acts::o_in [BT, linear_value_dim()]).
  void linear_attention_forward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                const TensorView& xin);
  // Its backward from dres = d res2 (out_proj's output gradient): every weight gradient of
  // linear_attn and dxin (=, into the scratch that held xin; xin is read first) through the
  // projections.
  void linear_attention_backward(int64_t l, int64_t B, int64_t T, ModuleHooks& hooks,
                                 const TensorView& dres, const TensorView& xin,
                                 const TensorView& dxin);
  // Copies layer l's routing (idx) to the host, groups the BT * K routed rows by expert
  // (expert-major, then token and k ascending) and uploads each row's token (src) and each
  // (token, k)'s row (slot); the experts' row ranges stay on the host (Acts::Layer).
  void group_routed_rows(int64_t l, int64_t BT);
  // aux_loss(): after the layers' forward, loss += the load-balancing loss (router_aux_loss_
  // coef times HF's load_balancing_loss_func, weighted by the micro-batch's target tokens:
  // targets_host [BT], kIgnoreIndex not counted); with `backward` also its d / d p for
  // moe_backward (times grad_scale).
  void aux_loss_forward(const int32_t* targets_host, int64_t BT, bool backward, float grad_scale,
                        const TensorView& loss);
  // The chunked LM head's views for BT rows (model.fused_linear_cross_entropy).
  LmHeadChunks head_chunks(int64_t BT, const TensorView& weight) const;

  LlamaConfig cfg_;
  // moe(): whether the running forward trains (its routing counts toward the expert load),
  // and the largest expert load since take_max_expert_load.
  bool training_forward_ = false;
  double max_expert_load_ = 0.0;
  Kernels& be_;
  DeviceRuntime& rt_;
  DType act_dtype_;
  ActivationCheckpointing checkpointing_;
  std::vector<ModuleDecl> modules_;
  std::unique_ptr<Acts> acts_;
  int64_t last_rows_ = 0;
  // selection_bias(): the training forwards' (token, pick) counts per expert of each sparse
  // layer since take_router_loads, [layer][E] (empty for a dense layer).
  std::vector<std::vector<double>> router_counts_;
};

}  // namespace fsdp
