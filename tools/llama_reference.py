#!/usr/bin/env python3
"""Reference values for a C++ Llama (tests/data/llama/*.txt.xz, xz-compressed text), computed with PyTorch in float64
following Hugging Face transformers' LlamaForCausalLM (models/llama/modeling_llama.py and the
"llama3" branch of modeling_rope_utils.py) -- written from that description, not copied:
token embeddings; per decoder layer an RMSNorm (x * rsqrt(mean(x^2) + eps) * weight), causal
self-attention with q/k/v/o nn.Linear projections (y = x W^T (+ b when attention_bias)),
rotary position embeddings in HF's rotate-half layout on q and k, grouped-query attention
(query head h reads key/value head h // (H / Hkv)), a residual, a second RMSNorm, the SwiGLU MLP
down_proj(silu(gate_proj(x)) * up_proj(x)) (+ biases when mlp_bias), a residual; the final
`norm`, lm_head (or embed_tokens when tie_word_embeddings) and the mean cross-entropy over the
B*T targets (given per position: HF's own `labels` argument would shift them by one). The
embedding is nn.Embedding with padding_idx = pad_token_id (the class's default when config.json
has none: Olmo2Config and OlmoeConfig 1, Phi3Config 32000, Gemma3TextConfig 0, else None (Glm4MoeConfig and
DeepseekV3Config too)), as every one of
these classes builds it: the lookup adds nothing to that row's gradient (the phi3 variants'
pad_token_id 0 is looked up in 1l_gqa_untied_rope1e4_phi3).

Regenerate the committed fixtures (Debian: apt-get install -y python3-torch; the Debian
interpreter, /usr/bin/python3, not another one first on PATH) from the repository root:
    for v in $(/usr/bin/python3 tools/llama_reference.py --list); do
      /usr/bin/python3 tools/llama_reference.py $v | xz -9e > tests/data/llama/reference_$v.txt.xz
    done
Check that the committed fixtures are what this script makes, and the script's own self-tests
(finite differences, a loop-by-loop second implementation, GQA/MHA and tied/untied identities,
the llama3 RoPE branches, the MoE routing margins and the K = E dense identity, Qwen2-MoE's
shared expert at a zero gate, GLM-4.5's (and DeepSeek-V3's) router bias, groups, scaling and
shared experts, DeepSeek-V3's Multi-head Latent Attention (rope_interleave against permuted rope
rows, the lora norms' eps, the yarn mscale factors), DeepSeek-V2's (its pairs against V3's
rotate-half with permuted rows, no mscale^2) and its MoE block (norm_topk_prob ignored,
routed_scaling_factor), GPT-OSS's attention sinks, router, clamped interleaved SwiGLU and
untruncated yarn, Llama 4's chunk mask, adjacent-pair RoPE, L2 norm, temperature, input-scaled
experts and chunked gate / up, the load-balancing loss's identities and finite differences,
Qwen3.5's gated delta rule against HF's chunked algorithm, its short convolution, gates and
output gate, and the float32 conditioning of its fixtures; Qwen3.5-MoE's always-renormalised router
(a norm_topk_prob key changes nothing) and its layers against Qwen3.5's with every expert one copied
MLP):
    /usr/bin/python3 tools/llama_reference.py --check       # exit status 0 when all match
    /usr/bin/python3 tools/llama_reference.py --selftest

VARIANT = <layers>l_<attn>_<tied>_<rope>[_<arch>][_attnbias][_mlpbias][_swa][_aux] (see VARIANTS), e.g.
3l_gqa_untied_llama3: attn is mha (num_key_value_heads 4), gqa (2) or mqa (1); rope is rope1e4
(rope_theta 1e4, rope_scaling null), llama3 (rope_theta 5e5 with Llama 3.1's rope_scaling), yarn
(rope_theta 1e4 with YARN_SCALING; deepseekv3, deepseekv2: DEEPSEEK_YARN; gptoss: GPTOSS_YARN), linear
(factor 2) or longrope (phi3 only);
arch is absent (LlamaForCausalLM) or the Llama-family class of the same math with its own
config attributes (other_arch_config): mistral (MistralForCausalLM, a sliding window covering
every sequence; with _swa a window of 3 < T: each query sees itself and the 2 positions
before it, transformers' kv_idx > q_idx - sliding_window), qwen2 (Qwen2ForCausalLM: q/k/v
biases, none on o_proj; modeling_qwen2.py; with _swa, use_sliding_window and the window 3 on
the layers from max_window_layers = 1 on), qwen3 (Qwen3ForCausalLM: q_norm / k_norm, an RMSNorm over each head of q and k before RoPE, and
head_dim 12 != hidden / heads; modeling_qwen3.py) or olmo2 (Olmo2ForCausalLM, modeling_olmo2.py:
the norms moved to the sublayers' outputs, x + post_attention_layernorm(attn(x)) and
h + post_feedforward_layernorm(mlp(h)), and q_norm / k_norm over the whole q and k projections
[H*D] and [Hkv*D] before RoPE) or phi3 (Phi3ForCausalLM, modeling_phi3.py: Llama's math with
q/k/v in one qkv_proj.weight [(H + 2 Hkv) D, C], rows q then k then v, and gate/up in one
gate_up_proj.weight [2I, C], gate's rows first; no head_dim attribute, no biases; with _swa a
window of 3 < T, as Mistral's) or olmo3 (Olmo3ForCausalLM, modeling_olmo3.py: OLMo 2's layers,
the window of 3 on the layers layer_types names sliding_attention (here 0 and 2 of 3), whose
RoPE is unscaled; the llama3 scaling on the full_attention layer only) or granite (GraniteForCausalLM, modeling_granite.py: Llama's math
with the embedding times embedding_multiplier 3, each sublayer's output times
residual_multiplier 0.5 before its residual add, scores times attention_multiplier 0.2, logits
divided by logits_scaling 4; no head_dim attribute) or smollm3 (SmolLM3ForCausalLM, modeling_smollm3.py: Llama's math
without RoPE on every no_rope_layer_interval-th layer, here 2: layer 1 of 3, which with _swa
alone has the window of 3; no head_dim attribute) or gemma3 (Gemma3ForCausalLM, model_type gemma3_text,
modeling_gemma3.py: every RMSNorm multiplies by 1 + weight (the weights drawn as N(0, 0.3)
offsets); four norms a layer, x + post_attention_layernorm(attn(input_layernorm(x))) and
h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))); per-head q_norm / k_norm
as Qwen3's; the embedding times sqrt(hidden) as a float32 number, with padding_idx =
pad_token_id 5 (the batch holds token 5 twice: the lookup adds nothing to that row's
gradient); the MLP gelu_tanh(gate) * up; scores scaled by query_pre_attn_scalar 10^-1/2
(head_dim 12); layer l slides (window sliding_window) unless (l + 1) % sliding_window_pattern
== 0, and the sliding layers' RoPE has period rope_local_base_freq 1e4 unscaled, the others
rope_theta 1e6 with rope_scaling (rope word rope1e4: none, linear: factor 2). The 1-layer
variant: pattern 6, a window covering the sequence; 3l ..._swa: pattern 2 (sliding, global,
sliding), window 3) or gemma2 (Gemma2ForCausalLM, modeling_gemma2.py: gemma3's layer without
q_norm / k_norm or the local RoPE, the even layers sliding, and tanh soft-caps of 2 on the
scores and 5 on the logits) or gemma (GemmaForCausalLM, modeling_gemma.py: Llama's layer with
the (1 + w) norms, the scaled embedding, its padding row and GeGLU; head_dim 12) or exaone4
(Exaone4ForCausalLM, modeling_exaone4.py: OLMo 2's layer with per-head q_norm / k_norm; with
_swa the window of 3 on layers 0 and 2 of 3 ("LG"), which alone rotate q and k; without, a
null window: every layer global and rotated; head_dim 12) or one of the Mixture-of-Experts
classes, whose layers put a sparse MoE block where the MLP was (the router sizes per variant in
MOE): qwen3moe (Qwen3MoeForCausalLM, model_type qwen3_moe, modeling_qwen3_moe.py: Qwen3's
attention, per-head q_norm / k_norm, head_dim 12; every layer sparse (decoder_sparse_step 1,
mlp_only_layers []); experts moe_intermediate_size wide; the K weights renormalised when
norm_topk_prob) or mixtral (MixtralForCausalLM, modeling_mixtral.py: Mistral's attention,
sliding_window null, with _swa 3 < T; the block under block_sparse_moe, experts w1 (gate), w3
(up), w2 (down) intermediate_size wide; the K weights always renormalised) or olmoe
(OlmoeForCausalLM, modeling_olmoe.py: Llama's pre-norm layer with OLMo 2's q_norm / k_norm
over the whole q and k projections [H*D], [Hkv*D] before RoPE; clip_qkv null; experts
intermediate_size wide; norm_topk_prob; padding_idx OlmoeConfig's 1) or qwen2moe
(Qwen2MoeForCausalLM, model_type qwen2_moe, modeling_qwen2_moe.py: Qwen2's attention, q/k/v
biases (qkv_bias true), none on o_proj, no head_dim attribute; with _swa use_sliding_window and
the window 3 on the layers from max_window_layers = 1 on, as qwen2's, and layer_types spelled
out to match (transformers 5's Qwen2MoeConfig derives another list when it is absent); every
layer sparse; experts moe_intermediate_size wide; norm_topk_prob; and a shared expert) or glm4moe
(Glm4MoeForCausalLM, model_type glm4_moe, modeling_glm4_moe.py, GLM-4.5 and GLM-4.5-Air: Llama's
pre-norm layer (DeepseekV3's decoder layer); q/k/v biases under attention_bias, none on o_proj;
per-head q_norm / k_norm (Qwen3's) under use_qk_norm; head_dim 12; partial_rotary_factor 0.5:
RoPE in the rotate-half layout on the first 6 of each head's 12 columns (pairs (i, i + 3),
inv_freq over dim 6, Phi-3's _partial rotation), the rest passed through; no window; the first
first_k_dense_replace layers dense (Llama's MLP, intermediate_size wide), the others sparse with
DeepseekV3's block, sizes per variant in MOE and GLM4_MOE, as are attention_bias and
use_qk_norm (no _attnbias word: 1l_gqa_untied_rope1e4_glm4moe's q/k/v are biased, and layer 0
sparse; 3l_mqa_tied_llama3_glm4moe's heads q/k-normed, layer 0 dense); no auxiliary loss: the
class has none) or deepseekv3 (DeepseekV3ForCausalLM, model_type deepseek_v3,
modeling_deepseek_v3.py: DeepSeek-V3 / R1, Kimi K2, Moonlight): Llama's pre-norm layer, GLM-4.5's
MLP (dense below first_k_dense_replace, else the same DeepseekV3 MoE block, sizes per variant in
MOE and DEEPSEEK_V3), and Multi-head Latent Attention (the DeepSeek-V2 paper's; mla_attention) in
place of Llama's attention, on the input_layernorm output x, H heads, dn = qk_nope_head_dim, dr =
qk_rope_head_dim, dv = v_head_dim, D = dn + dr: q = q_proj(x) [H D] (q_lora_rank null; never
biased) or q_b_proj(q_a_layernorm(q_a_proj(x))) (q_a_proj [q_lora_rank, C], biased under
attention_bias; q_b_proj unbiased), each head's D columns [q_nope (dn) | q_rot (dr)]; ckv =
kv_a_proj_with_mqa(x) [kv_lora_rank + dr] (biased under attention_bias) = [c | k_rot], k_rot one
rope key for every head; kv_b_proj(kv_a_layernorm(c)) [H (dn + dv)] (unbiased), each head's
[k_nope (dn) | v (dv)]; both lora norms RMSNorms with eps 1e-6 whatever rms_norm_eps (HF builds
them with DeepseekV3RMSNorm's default; rms_norm_eps is 1e-3 in these variants so that the two
differ); RoPE over dim dr (DeepseekV3Config sets head_dim = qk_rope_head_dim; config.json has no
head_dim) on q_rot and k_rot, Llama's rotate-half (pairs (i, i + dr/2)), or under rope_interleave
HF's apply_rotary_pos_emb_interleave: the dr columns de-interleaved ([x0, x2, ..., x1, x3, ...])
and then rotated half, i.e. pairs (2i, 2i+1) at frequency i (the same for q and k: q.k does not
see the order); key [k_nope | k_rot], query [q_nope | q_rot]; the causal softmax of q.k times
D^-1/2, times get_mscale(factor, mscale_all_dim)^2 when rope_scaling is set with a nonzero
mscale_all_dim (get_mscale(s, m) = 0.1 m ln s + 1 for s > 1, else 1); per head P @ v [dv]; o_proj
[C, H dv] (biased under attention_bias). num_key_value_heads = num_attention_heads (HF's eager
attention would repeat_kv the H heads otherwise). Layer names in state-dict order:
self_attn.q_proj.weight, or self_attn.q_a_proj.weight (.bias), q_a_layernorm.weight,
q_b_proj.weight; then kv_a_proj_with_mqa.weight (.bias), kv_a_layernorm.weight, kv_b_proj.weight,
o_proj.weight (.bias); then the mlp as GLM-4.5's, input_layernorm, post_attention_layernorm.
1l_mha_untied_rope1e4_deepseekv3: plain q_proj, dv 6, rotate-half, no biases, layer 0 sparse
(8 experts in 4 groups, 2 kept, top 2, norm_topk_prob, routed_scaling_factor 2.5, one shared
expert); 3l_mha_tied_yarn_deepseekv3: q_lora_rank 12, dv 8, rope_interleave, biases, DeepSeek's
yarn (DEEPSEEK_YARN), layer 0 dense, then 6 experts in one group, top 2, no renormalisation,
routed_scaling_factor 1, two shared experts. Or deepseekv2 (DeepseekV2ForCausalLM, model_type
deepseek_v2, modeling_deepseek_v2.py: DeepSeek-V2, DeepSeek-V2-Lite, DeepSeek-Coder-V2-Lite):
deepseekv3's layers and Multi-head Latent Attention (the same modules, names and lora norms' eps
1e-6) with three differences: no rope_interleave attribute, the dr columns always rotated in the
pairs (2i, 2i+1) (HF's apply_rotary_emb: view_as_complex of adjacent pairs times polar(1, freqs),
times the cos/sin scale: deepseekv3's rope_interleave rotation); the softmax scale D^-1/2 alone
(DeepseekV2Attention's scaling has no mscale^2, even under yarn); and DeepseekV2Moe in the sparse
layers (from first_k_dense_replace on; the dense ones Llama's MLP, intermediate_size wide): p =
softmax(x gate.weight^T) over the E = n_routed_experts experts (gate.weight [E, C], no bias
buffer, no groups: topk_method "greedy", n_group / topk_group null), the K largest p
(torch.topk), weights those p times routed_scaling_factor, never renormalised (norm_topk_prob is
written to config.json, false, and read by no code of the class), output sum_j w_j expert_j(x)
(moe_intermediate_size wide) + shared_experts(x) (ungated, moe_intermediate_size *
n_shared_experts wide); in the state dict mlp.experts.{e}.*, mlp.gate.weight,
mlp.shared_experts.*; its routing checked as the softmax classes' (ROUTE_MARGIN) and config.json
DeepseekV2Config's attributes in its __init__ order (bos 1, eos 2, mlp_bias false, pad_token_id
absent). 1l_mha_untied_rope1e4_deepseekv2: plain q_proj, dv 6, no biases, layer 0 sparse (6
experts, top 2, routed_scaling_factor 2.5, one shared expert); 3l_mha_tied_yarn_deepseekv2:
q_lora_rank 12, dv 8, biases, DEEPSEEK_YARN, layer 0 dense, then 4 experts, top 2,
routed_scaling_factor 1, two shared experts. Or gptoss (GptOssForCausalLM, model_type gpt_oss,
modeling_gpt_oss.py: OpenAI's gpt-oss-20b / 120b; gptoss_config): Llama's pre-norm layer, h = x +
o_proj(attn(input_layernorm(x))), h + mlp(post_attention_layernorm(h)); q/k/v/o all biased
(attention_bias true); head_dim 12; RoPE rotate-half (rope1e4: rope_scaling {"rope_type":
"default"}; yarn: GPTOSS_YARN, truncate false: the correction range not floored / ceiled); GQA;
scores times head_dim^-1/2, causal, and on the layers layer_types names sliding_attention (the
even ones, spelled out) the window 3 < T in every gptoss variant (_swa changes nothing); attention
sinks: self_attn.sinks [H], per head one more logit sinks[h] appended to every query's masked
score row, the softmax over the row with it, the sink's column dropped before P @ V (rows sum to
< 1; sink_attention); every layer's MLP GptOssMLP: router logits x router.weight^T + router.bias
(router.weight [E, C], router.bias [E]), the K largest (torch.topk) and their softmax as the
weights (the E-way softmax renormalised over the K), the experts packed, not nn.Linear:
mlp.experts.gate_up_proj [E, C, 2I], gate_up_proj_bias [E, 2I], down_proj [E, I, C],
down_proj_bias [E, C] (I = intermediate_size, each expert's); expert e on x: gate_up = x
gate_up_proj[e] + gate_up_proj_bias[e], gate its even columns and up its odd ones
(interleaved), gate clamped above at 7, up to [-7, 7], out = ((up + 1) * gate * sigmoid(1.702
gate)) down_proj[e] + down_proj_bias[e] (GptOssExperts' limit and alpha, not config
attributes; gptoss_glu); the block's output sum_j w_j out_j; its aux loss (_aux) on the raw router
logits, bias included (transformers 5's router_logits). Names: model.layers.{l}.self_attn.sinks
first (GptOssAttention's own parameter precedes its submodules in the state dict), then
self_attn.{q,k,v,o}_proj.{weight,bias}, mlp.router.{weight,bias}, mlp.experts.{gate_up_proj,
gate_up_proj_bias, down_proj, down_proj_bias}, input_layernorm, post_attention_layernorm; the
3-D tensors' param / grad lines row-major. Draws: sinks N(0, 1), gate_up_proj_bias N(0, 2.5),
the rest as below; the routers (weight and bias) re-drawn for ROUTE_MARGIN as the softmax
classes', then gate_up_proj_bias (crc32("<variant>/experts<n>")) until every layer clamps a few
routed values at each bound and none lies within 1e-2 of a kink (GPTOSS_MIN_CLAMPED,
GPTOSS_KINK_GAP; both re-checked after either re-draw). 1l_gqa_untied_yarn_gptoss: 4 experts,
top 2, I 24, layer 0 sliding, yarn (max_position_embeddings 2048); 3l_mqa_tied_rope1e4_gptoss_swa_aux:
5 experts, top 2, I 20, layers 0 and 2 sliding, the load-balancing loss (its twin without _aux is
drawn for --selftest, not a fixture). Or llama4 (Llama4ForCausalLM, model_type llama4_text,
modeling_llama4.py: the text decoder of Llama 4 Scout / Maverick; llama4_config, sizes in MOE and
LLAMA4): Llama's pre-norm layer, h = x + o_proj(attn(input_layernorm(x))), h +
feed_forward(post_attention_layernorm(h)); q/k/v/o unbiased, head_dim 8; on the layers
no_rope_layers marks 1 (layer l unless (l + 1) % no_rope_layer_interval == 0) RoPE on ADJACENT pairs
(apply_rotary_emb: each head's D values as D/2 complex numbers x[2i] + i x[2i+1] times exp(i t
inv_freq[i]); inv_freq llama3-scaled whenever rope_scaling is set), then under use_qk_norm
Llama4TextL2Norm on each head of q and k (x rsqrt(mean(x^2) + rms_norm_eps), no weight; RoPE layers
only); on the other (NoPE) layers under attn_temperature_tuning q times log(floor((t + 1) /
floor_scale) + 1) attn_scale + 1 at position t; scores times head_dim^-1/2, GQA, causal, and on the
"chunked_attention" layers (layer_types: the RoPE ones) key j visible to query i only when j //
attention_chunk_size == i // attention_chunk_size; the NoPE ones "full_attention". feed_forward:
on moe_layers (range(interleave_moe_layer_step - 1, L, step)) Llama4TextMoe: logits x
router.weight^T (router.weight [E, C], no bias), the K largest (torch.topk), score = their sigmoid
(0 for the other experts: HF scatters -inf and takes the sigmoid), each chosen expert on x * score
(the input scaled, not the output): gate_up = (x score) experts.gate_up_proj[e] ([E, C, 2I]), gate
its first I columns and up the next I (chunk(2): not interleaved), out_e = (up silu(gate))
experts.down_proj[e] ([E, I, C]); the block sum_j out_j + shared_expert(x) (Llama4TextMLP of
intermediate_size on x itself, unscaled); elsewhere Llama4TextMLP of intermediate_size_mlp; no
auxiliary loss (Llama4ForCausalLM adds none); pad_token_id null. Names in state-dict order:
self_attn.{q,k,v,o}_proj.weight, feed_forward.experts.gate_up_proj, feed_forward.experts.down_proj,
feed_forward.router.weight, feed_forward.shared_expert.{gate_proj,up_proj,down_proj}.weight (dense
layers feed_forward.{gate_proj,up_proj,down_proj}.weight), input_layernorm, post_attention_layernorm;
the 3-D tensors row-major. The router re-drawn for ROUTE_MARGIN as the softmax classes' (on the
softmax of the logits: the same order). 3l_gqa_untied_llama3_llama4: layers 0 and 1 RoPE (qk-normed,
chunk 3 < T), layer 2 NoPE with the temperature (floor_scale 2, attn_scale 0.5: scales 1, 1.35,
1.35, 1.55, 1.55, 1.69, 1.69), layer 1 sparse (4 experts, top 1, I 24), layers 0 and 2 dense
(intermediate_size_mlp 40), llama3; 1l_mqa_tied_rope1e4_llama4: layer 0 RoPE, chunked (4 < T),
sparse (3 experts, top 1, I 20), no qk norm, no temperature. Or qwen35 (Qwen3_5ForCausalLM,
model_type qwen3_5_text, models/qwen3_5/modular_qwen3_5.py over models/qwen3_next: the Qwen3.5 text
decoder; qwen35_config, layer_types per variant in QWEN35_LAYER_TYPES, sizes in QWEN35_LINEAR):
Llama's pre-norm layer, h = x + mixer(input_layernorm(x)), h + mlp(post_attention_layernorm(h))
(Llama's SwiGLU, no biases), the mixer per layer_types; every RMSNorm (input_layernorm,
post_attention_layernorm, model.norm, q_norm, k_norm) Qwen3_5RMSNorm = Gemma 3's x rsqrt(mean(x^2)
+ eps) (1 + w) (the weights drawn as N(0, 0.3) offsets); no embedding scale, pad_token_id null;
RoPE from rope_parameters (transformers 5: {"rope_type": "default", "rope_theta": 1e4,
"partial_rotary_factor": 0.5}, no top-level rope_theta; qwen35_rope): rotate-half on the first R =
6 of each head's 12 columns, the rest passed through (the three mrope grids of text positions are
equal: plain RoPE). "full_attention" (Qwen3NextAttention, gated_attention): q_proj [H 2D, C] viewed
[B, T, H, 2D] and chunked: each head's first D columns its query, the next D its gate; query and
key (k_proj [Hkv D, C]) through the per-head q_norm / k_norm (1 + w, over D), v_proj [Hkv D, C];
RoPE; causal GQA softmax of q.k times D^-1/2; the heads' output [B, T, H D] times sigmoid(gate);
o_proj [C, H D]. "linear_attention" (Qwen3_5GatedDeltaNet, gated_deltanet; Kd = Hk Dk, Vd = Hv Dv
with Hk linear_num_key_heads 2, Dk linear_key_head_dim 8, Hv linear_num_value_heads 4, Dv
linear_value_head_dim 6, K linear_conv_kernel_dim 4): mixed = in_proj_qkv(x) [B, T, 2 Kd + Vd];
the depthwise causal conv1d (weight [2 Kd + Vd, 1, K], no bias, padding K - 1, the first T
outputs: out[t, c] = sum_j w[c, 0, j] mixed[t - K + 1 + j, c], zeros before t = 0) then silu;
split into q [B, T, Hk, Dk] (the first Kd columns), k (the next Kd), v [B, T, Hv, Dv]; z =
in_proj_z(x) [B, T, Hv, Dv]; beta = sigmoid(in_proj_b(x)), g = -exp(A_log) softplus(in_proj_a(x) +
dt_bias) [B, T, Hv]; q, k repeat_interleave'd Hv / Hk times (value head j reads key head j //
(Hv / Hk)); q, k l2-normalised (x rsqrt(sum(x^2) + 1e-6)), q times Dk^-1/2; the gated delta rule
per (batch, value head) from S = 0 [Dk, Dv]: S = S exp(g_t); delta = (v_t - S^T k_t) beta_t; S =
S + k_t delta^T; o_t = S^T q_t; per token and head Qwen3_5RMSNormGated: rms_norm(o, norm.weight,
rms_norm_eps) (a plain weight [Dv], not 1 + w) times silu(z); [B, T, Vd]; out_proj [C, Vd]. Names
per layer in state-dict order: the mixer's (self_attn.{q,k,v,o}_proj.weight, self_attn.q_norm,
k_norm; or linear_attn.dt_bias, A_log (the module's own parameters first), conv1d.weight (3-D,
row-major), norm.weight, out_proj.weight, in_proj_qkv.weight, in_proj_z.weight, in_proj_b.weight,
in_proj_a.weight), mlp.{gate,up,down}_proj.weight, input_layernorm, post_attention_layernorm. Draws:
A_log, dt_bias U(-1, 1) (decays exp(g) from ~0 to ~1, QWEN35_GATE_RANGE), linear_attn.norm 1 + N(0,
0.3); the linear_attn parameters re-drawn (crc32("<variant>/linear<n>")) until the float32 rounding
of the parameters barely moves the gradients (QWEN35_SENSITIVITY: o's RMSNorm discards its scale,
so where o = S^T q is small against its terms float32's rounding is amplified).
3l_gqa_untied_rope1e4_qwen35: layers linear, full, linear; 1l_mqa_tied_rope1e4_qwen35: one
full_attention layer, MQA, tied. Or qwen35moe (Qwen3_5MoeForCausalLM, model_type qwen3_5_moe_text,
models/qwen3_5_moe/modular_qwen3_5_moe.py: the Qwen3.5 MoE text decoder, e.g. Qwen3.5-35B-A3B's;
qwen35moe_config, layer_types in QWEN35_LAYER_TYPES, sizes in MOE and QWEN35_LINEAR): qwen35's layers
exactly (the same token mixers, (1 + w) norms, rope_parameters, draws of A_log / dt_bias and the
same names for them) except that EVERY layer's mlp is Qwen3_5MoeSparseMoeBlock (Qwen2-MoE's block
with Qwen3VLMoeTextTopKRouter): p = softmax(x mlp.gate.weight^T) over the E = num_experts experts
(gate.weight [E, C], no bias; HF in float32, here float64), the K = num_experts_per_tok largest
(torch.topk), their weights ALWAYS divided by their sum (the router has no norm_topk_prob: the
config class deletes that attribute, with intermediate_size, decoder_sparse_step and
mlp_only_layers, so config.json has none of them); experts SwiGLU MLPs of moe_intermediate_size,
mlp.experts.{e}.{gate_proj, up_proj, down_proj}.weight [I, C], [I, C], [C, I] (the per-expert names,
as Qwen2-MoE's; transformers 5 packs them on load into experts.gate_up_proj [E, 2I, C] and
experts.down_proj [E, C, I]); plus the shared expert, a SwiGLU MLP of
shared_expert_intermediate_size on every token times sigmoid(x mlp.shared_expert_gate.weight^T)
([1, C]). No auxiliary loss (output_router_logits false, router_aux_loss_coef 0.001). Names per
layer in state-dict order: the mixer's (as qwen35's), mlp.gate.weight, mlp.experts.{e}.{gate_proj,
up_proj, down_proj}.weight for e = 0..E-1, mlp.shared_expert.{gate_proj, up_proj, down_proj}.weight,
mlp.shared_expert_gate.weight, input_layernorm, post_attention_layernorm. make_case re-draws the
routers (ROUTE_MARGIN, crc32("<variant>/router<n>")) and the linear_attn parameters
(QWEN35_SENSITIVITY, crc32("<variant>/linear<n>")) until both hold at once (each re-draw re-checks
both). 3l_gqa_untied_rope1e4_qwen35moe: layers linear, full, linear, GQA, untied; 4 experts, top 2,
moe_intermediate_size 12, shared_expert_intermediate_size 16. The MoE
block on a token x (the post_attention_layernorm output): p = softmax(x gate.weight^T) over the
E experts (gate.weight [E, C]); the K = num_experts_per_tok largest p (torch.topk, descending)
and their experts; w = those p, divided by their sum when renormalised; output sum_j w_j
down(silu(gate(x)) * up(x)) of expert j, no biases; Qwen2-MoE adds its shared expert, a SwiGLU
MLP shared_expert_intermediate_size wide run on every token, times the token's
sigmoid(x shared_expert_gate.weight^T) (shared_expert_gate.weight [1, C]): routed sum +
sigmoid(gate) * shared_expert(x) (Qwen3.5-MoE the same; Qwen3-MoE, Mixtral and OLMoE have no shared
expert). GLM-4.5's
block is DeepseekV3's instead: s = sigmoid(x gate.weight^T) (HF's GEMM in float32); choice
scores c = s + gate.e_score_correction_bias (a float32 buffer [E], in the state dict, never
trained); the E experts are n_group groups of E / n_group consecutive ones, a group's score the
sum of its two largest c; the topk_group best groups kept, every other expert's c set to 0.0
(masked_fill 0.0, not -inf); the K largest masked c chosen (torch.topk); w = the chosen s (not
c), divided by (their sum + 1e-20) under norm_topk_prob, times routed_scaling_factor; output sum_j
w_j expert_j(x) + shared_experts(x), a SwiGLU MLP moe_intermediate_size * n_shared_experts wide on
every token, ungated and unscaled. The choice carries no gradient: the weights' flows through s,
and the bias gets none (its grad line is zeros, the C++ model's never-trained parameter). No auxiliary
load-balancing loss (output_router_logits false: the loss is the plain cross-entropy) unless
_aux (MoE only; no qwen35moe variant has it): output_router_logits true and router_aux_loss_coef
0.1 (else the class's default, 0.001, or OLMoE's 0.01), the loss then HF's mean cross-entropy + 0.1 aux, where aux is
transformers' load_balancing_loss_func without an attention mask (Switch Transformer): every
sparse layer's router logits [B*T, E] stacked into [L*B*T, E], p their softmax over the E
experts (the raw router softmax, not the renormalised top-K weights; the routers only, not
Qwen2-MoE's shared_expert_gate), the one-hot [L*B*T, K, E] of each token's topk choices,
aux = E sum_{k,e} mean_n(one-hot)[k, e] mean_n(p)[e] (K when p or the choices are uniform); the
one-hot carries no gradient, only mean p does, so the term's gradient reaches the routers and
everything before them (not the last layer's experts, the final norm or the head); `loss` and
every `grad` line are the total's, `logits` unchanged. An _aux variant draws the weights,
tokens and targets of its twin without _aux (seed_name): the same logits and routing. Names:
model.layers.{l}.mlp.gate.weight and mlp.experts.{e}.{gate_proj, up_proj, down_proj}.weight
(Qwen3-MoE, OLMoE, Qwen2-MoE, Qwen3.5-MoE; Qwen2-MoE's and Qwen3.5-MoE's then mlp.shared_expert.{gate_proj, up_proj,
down_proj}.weight [Is, C], [Is, C], [C, Is] and mlp.shared_expert_gate.weight [1, C]); GLM-4.5's
in another order: mlp.experts.{e}.{gate_proj, up_proj, down_proj}.weight for e = 0..E-1, then
mlp.gate.weight [E, C], mlp.gate.e_score_correction_bias [E], mlp.shared_experts.{gate_proj,
up_proj, down_proj}.weight [Is, C], [Is, C], [C, Is] (Is = moe_intermediate_size *
n_shared_experts), and its dense layers' mlp.{gate_proj, up_proj, down_proj}.weight as Llama's,
model.layers.{l}.block_sparse_moe.gate.weight and
block_sparse_moe.experts.{e}.{w1, w2, w3}.weight (Mixtral; listed w1, w2, w3), after the
attention's and before the two norms. The routing is unambiguous in float32: for every token of every layer the
sorted probabilities p_1 >= ... >= p_K+1 differ by at least ROUTE_MARGIN = 1e-3 relative
(p_j - p_j+1 >= 1e-3 p_j, j = 1..K), and every expert is chosen by some token; make_case
re-draws the router weights from the seed crc32("<variant>/router<n>") (the variant's name less
_aux), n = 1, 2, ..., until both hold (asserted; the other draws are unchanged). GLM-4.5's
routing is checked in float32 (the float64 forward's router logits rounded to float32, the
float32 bias): the sorted masked choice scores c_j - c_j+1 >= 1e-3 |c_j| for j = 1..K (so the
chosen c are > 0 wherever a group is masked: a masked 0.0 is never chosen, and a -inf mask would
choose alike), with n_group > 1 the topk_group-th and the next sorted group score as far apart,
every expert chosen in every sparse layer, the float64 forward's choices, and the bias changing
some token's choice against a zero bias; its e_score_correction_bias is drawn N(0, 0.1), rounded
to 1e-3, from crc32("<variant>/bias") (not from the variant's seed, whose draws skip it); only
the routers are re-drawn.
A tiny Llama (hidden 32, 4 heads of head_dim 8 (qwen3, qwen3moe, gemma3, glm4moe, gptoss, qwen35, qwen35moe: 12; deepseekv3, deepseekv2: MLA's
q/k 12 = 8 nope + 4 rope, v 6 or 8, kv_lora_rank 16), intermediate 40, vocab 37: not a multiple
of anything, so the C++ model pads it; max_position_embeddings 16 (1l_gqa_untied_yarn_gptoss:
2048, GPTOSS_YARN), rms_norm_eps 1e-6 (deepseekv3,
deepseekv2: 1e-3, the lora norms 1e-6)) with seeded
float32 weights drawn far from Llama's initialisation so that no term vanishes (matrices and
biases N(0, 0.3), RMSNorm weights 1 + N(0, 0.3); every value rounded to a multiple of 1e-3 so
that its short decimal text is exactly the float32 the model ran with), run in float64 on one
batch of B 2 x T 7 tokens. Lines (the format of tests/reference_file.hpp, as gpt2_reference.py):
    config <the HF config.json of this LlamaForCausalLM, one line>
    batch B T
    tokens <B*T ids>
    targets <B*T ids>
    loss <mean cross-entropy over the B*T targets (_aux: + router_aux_loss_coef * aux)>
    logits <B*T*vocab_size values, row-major [B, T, V]>
    param <HF name> <numel> <float32 values, HF state-dict layout (nn.Linear weights [out, in])>
    grad <HF name> <numel> <d(loss)/d(param), float64 rounded to 10 significant digits>
The params and grads are listed in HF state-dict order; lm_head.weight only when untied.

Precision: this is the exact math in float64. HF itself, even for a float64 model, computes a few
pieces in float32 (inv_freq, the llama3 rescaling and cos/sin; RMSNorm's normalisation; the eager
softmax in recent versions; the MoE blocks' router softmax; Llama 4's apply_rotary_emb (q and k cast
to float32 for the complex product), its L2 norm, router sigmoid and temperature scales; Qwen3.5's
gated delta rule, its l2 norms, gates and gated RMSNorm); those differences (~1e-7 relative)
are far below what the tests resolve. The grads are printed to 10 significant digits (gpt2_reference.py prints 18) and the
params as short decimals to keep the files small: 1-layer files ~200-265 KB, 3-layer ~490-660 KB
(MoE: 1-layer ~355-420 KB, 3-layer ~770 KB-1.1 MB; glm4moe's 8 experts and shared experts 1-layer
~660 KB, 3-layer ~1.1 MB; deepseekv3's 1-layer ~640 KB, 3-layer ~1.1 MB; deepseekv2's 1-layer
~535 KB, 3-layer ~930 KB; gptoss's 1-layer ~400 KB, 3-layer ~1.0 MB; llama4's 1-layer ~280 KB, 3-layer
~730 KB; qwen35's 1-layer ~255 KB, 3-layer ~655 KB; qwen35moe's 3-layer ~830 KB).

llama3 numbers: head_dim 8 and rope_theta 5e5 give wavelengths 2*pi/inv_freq of
~6.28, ~167, ~4443, ~1.2e5; original_max_position_embeddings 8 (< max_position_embeddings 16,
as HF's validation wants), low_freq_factor 0.01 and high_freq_factor 0.1 put the low/high
wavelength bounds at 800 and 80, so the four frequencies are untouched / smoothed (s ~ 0.42) /
scaled / scaled: every branch is exercised (checked by --selftest). glm4moe rotates 6 of its 12
columns: 3 frequencies over dim 6, wavelengths ~6.28, ~499, ~4.0e4: untouched / smoothed /
scaled (checked by --selftest too). deepseekv3 rotates dr = 4 columns: 2 frequencies, 1 and
0.01 at theta 1e4; 3l_mha_tied_yarn_deepseekv3's yarn (DEEPSEEK_YARN: factor 4,
original_max_position_embeddings 4 = max_position_embeddings 16 / 4, beta_fast 32, beta_slow 1,
mscale 1, mscale_all_dim 0.8) has the correction range [0, 0] (+0.001): frequency 0 kept (the
extrapolation branch), frequency 1 divided by factor (the interpolation branch) -- no blend, which
at dr 4 would need original_max_position_embeddings > 628, beyond max_position_embeddings (the
original 8 would blend nothing either: range [0, 1]; and transformers 4.4x-4.5x read factor as
max_position_embeddings / original_max_position_embeddings when original is given, 5.x the
explicit factor: with 4 = 16 / 4 both agree); cos and sin times (1 + 0.1 ln 4) / (1 + 0.08 ln 4)
~ 1.025, the scores times (1 + 0.08 ln 4)^2 ~ 1.234 (checked by --selftest); 3l_mha_tied_yarn_deepseekv2
the same frequencies and cos/sin scale, its scores times D^-1/2 alone.
"""
import json
import lzma
import math
import os
import random
import sys
import zlib

import torch

HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 32, 4, 8, 40, 37
MAX_POS, EPS = 16, 1e-6
B, T = 2, 7
# YaRN at head_dim 8, theta 1e4, original 2048: beta_fast 32 / beta_slow 1 turn at dimensions
# 1.008 / 2.51, truncated to the range [1, 3]: pairs 0 and 1 keep their frequency, pair 2 is
# half interpolated, pair 3 divided by factor; cos and sin scaled by 0.1 ln 4 + 1.
YARN_SCALING = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048}
LINEAR_SCALING = {"rope_type": "linear", "factor": 2.0}
SCALINGS = {"rope1e4": None, "yarn": YARN_SCALING, "linear": LINEAR_SCALING}
# Phi-3's LongRoPE (the _longrope variants, phi3 only): frequency i divided by short_factor[i],
# or long_factor[i] when T = 7 exceeds original_max_position_embeddings: 4 for the _partial
# variant (long factors), 8 otherwise (short); cos and sin scaled by sqrt(1 + ln s / ln o),
# s = MAX_POS / o. _partial: partial_rotary_factor 0.75 (6 of the 8 head columns rotated,
# Phi-4-mini's fraction), so 3 factors each.
LONGROPE_SHORT, LONGROPE_LONG = [1.0, 1.5, 2.0, 3.0], [2.0, 4.0, 8.0, 16.0]
PARTIAL_ROTARY = 0.75
LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 0.01, "high_freq_factor": 0.1,
                  "original_max_position_embeddings": 8, "rope_type": "llama3"}
KV_HEADS = {"mha": 4, "gqa": 2, "mqa": 1}
ARCHS = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "qwen3": "Qwen3",
         "olmo2": "Olmo2", "phi3": "Phi3", "gemma3": "Gemma3", "smollm3": "SmolLM3",
         "granite": "Granite", "olmo3": "Olmo3", "gemma2": "Gemma2", "gemma": "Gemma",
         "exaone4": "Exaone4", "qwen3moe": "Qwen3Moe", "mixtral": "Mixtral", "olmoe": "Olmoe",
         "qwen2moe": "Qwen2Moe", "glm4moe": "Glm4Moe", "deepseekv3": "DeepseekV3",
         "deepseekv2": "DeepseekV2", "gptoss": "GptOss", "llama4": "Llama4",
         "qwen35": "Qwen3_5", "qwen35moe": "Qwen3_5Moe"}  # HF class prefix
MODEL_TYPES = {"gemma3": "gemma3_text", "qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe",
               "glm4moe": "glm4_moe", "deepseekv3": "deepseek_v3",
               "deepseekv2": "deepseek_v2", "gptoss": "gpt_oss",
               "llama4": "llama4_text", "qwen35": "qwen3_5_text",
               "qwen35moe": "qwen3_5_moe_text"}  # HF model_type where it is not the variant's word
MOE_ARCHS = {"qwen3moe", "mixtral", "olmoe", "qwen2moe", "glm4moe", "deepseekv3", "deepseekv2",
             "gptoss", "llama4", "qwen35moe"}  # the Mixture-of-Experts classes' words
GEMMA_PAD = 5  # the gemma3 variants' pad_token_id; the batch holds it twice (make_case)
HEAD_DIM_QWEN3 = 12  # != hidden / heads, as Qwen3-0.6B's 128 against 1024 / 16
VARIANTS = [
    "1l_mha_untied_rope1e4",
    "1l_gqa_tied_llama3",
    "1l_mqa_untied_llama3_attnbias_mlpbias",
    "1l_gqa_untied_rope1e4_attnbias",
    "1l_mha_tied_llama3_mlpbias",
    "3l_gqa_untied_llama3",
    "3l_mqa_tied_rope1e4_attnbias_mlpbias",
    "1l_gqa_untied_rope1e4_mistral",
    "1l_gqa_untied_rope1e4_qwen2",
    "1l_gqa_untied_rope1e4_qwen3",
    "3l_mqa_tied_llama3_qwen3_attnbias",
    "1l_gqa_untied_yarn",
    "1l_mha_tied_linear_qwen2",
    "1l_gqa_untied_rope1e4_olmo2",
    "3l_mqa_tied_llama3_olmo2_attnbias",
    "1l_gqa_untied_rope1e4_mistral_swa",
    "3l_mqa_tied_llama3_qwen2_swa",
    "1l_gqa_untied_rope1e4_phi3",
    "3l_mqa_tied_rope1e4_phi3_swa",
    "1l_gqa_tied_rope1e4_gemma3",
    "3l_mqa_untied_linear_gemma3_swa",
    "3l_gqa_tied_llama3_smollm3_swa",
    "3l_gqa_untied_rope1e4_granite",
    "3l_gqa_untied_llama3_olmo3_swa",
    "1l_gqa_untied_longrope_phi3_partial",
    "3l_mqa_tied_longrope_phi3_swa",
    "1l_gqa_tied_rope1e4_gemma2",
    "3l_mqa_untied_linear_gemma2_swa",
    "1l_mha_tied_rope1e4_gemma",
    "3l_gqa_untied_llama3_gemma",
    "3l_gqa_untied_llama3_exaone4_swa",
    "1l_mqa_tied_rope1e4_exaone4",
    "1l_gqa_untied_rope1e4_qwen3moe",
    "3l_mqa_tied_llama3_qwen3moe",
    "1l_gqa_untied_rope1e4_mixtral",
    "3l_gqa_untied_llama3_mixtral_swa",
    "1l_mha_untied_rope1e4_olmoe",
    "3l_gqa_tied_llama3_olmoe",
    "1l_gqa_untied_rope1e4_qwen3moe_aux",
    "3l_gqa_tied_llama3_olmoe_aux",
    "1l_gqa_untied_rope1e4_qwen2moe",
    "3l_mqa_tied_llama3_qwen2moe_swa",
    "1l_gqa_untied_rope1e4_glm4moe",
    "3l_mqa_tied_llama3_glm4moe",
    "1l_mha_untied_rope1e4_deepseekv3",
    "3l_mha_tied_yarn_deepseekv3",
    "1l_mha_untied_rope1e4_deepseekv2",
    "3l_mha_tied_yarn_deepseekv2",
    "1l_gqa_untied_yarn_gptoss",
    "3l_mqa_tied_rope1e4_gptoss_swa_aux",
    "3l_gqa_untied_llama3_llama4",
    "1l_mqa_tied_rope1e4_llama4",
    "3l_gqa_untied_rope1e4_qwen35",
    "1l_mqa_tied_rope1e4_qwen35",
    "3l_gqa_untied_rope1e4_qwen35moe",
]
# The Mixture-of-Experts variants' routers: (experts E, experts per token K, expert size,
# norm_topk_prob; None: Mixtral, GPT-OSS and Qwen3.5-MoE, whose K weights are always renormalised, and Llama 4, whose
# are the chosen logits' sigmoids[, Qwen2-MoE and Qwen3.5-MoE: the shared
# expert's size; GLM-4.5: its GLM4_MOE row; DeepSeek-V3: its DEEPSEEK_V3 row; DeepSeek-V2: its
# DEEPSEEK_V2 row (norm_topk_prob only written to config.json: DeepseekV2Moe never renormalises);
# Llama 4: its LLAMA4 row (the expert size is also the shared expert's)]). The expert size is
# Qwen3MoeConfig's, Qwen2MoeConfig's, Qwen3_5MoeTextConfig's, Glm4MoeConfig's and DeepseekV3Config's
# moe_intermediate_size, MixtralConfig's, OlmoeConfig's and Llama4TextConfig's intermediate_size; the
# shared expert's Qwen2MoeConfig's (Qwen3_5MoeTextConfig's) shared_expert_intermediate_size.
MOE = {
    "1l_gqa_untied_rope1e4_qwen3moe": (4, 2, 24, True),
    "3l_mqa_tied_llama3_qwen3moe": (5, 3, 20, False),
    "1l_gqa_untied_rope1e4_mixtral": (4, 2, 24, None),
    "3l_gqa_untied_llama3_mixtral_swa": (3, 2, 24, None),
    "1l_mha_untied_rope1e4_olmoe": (4, 2, 24, False),
    "3l_gqa_tied_llama3_olmoe": (6, 2, 20, True),
    "1l_gqa_untied_rope1e4_qwen3moe_aux": (4, 2, 24, True),
    "3l_gqa_tied_llama3_olmoe_aux": (6, 2, 20, True),
    "1l_gqa_untied_rope1e4_qwen2moe": (4, 2, 24, False, 28),
    "3l_mqa_tied_llama3_qwen2moe_swa": (5, 2, 20, True, 24),
    "1l_gqa_untied_rope1e4_glm4moe": (8, 2, 24, True, "1l_gqa_untied_rope1e4_glm4moe"),
    "3l_mqa_tied_llama3_glm4moe": (6, 2, 20, False, "3l_mqa_tied_llama3_glm4moe"),
    "1l_mha_untied_rope1e4_deepseekv3": (8, 2, 24, True, "1l_mha_untied_rope1e4_deepseekv3"),
    "3l_mha_tied_yarn_deepseekv3": (6, 2, 20, False, "3l_mha_tied_yarn_deepseekv3"),
    "1l_mha_untied_rope1e4_deepseekv2": (6, 2, 24, False, "1l_mha_untied_rope1e4_deepseekv2"),
    "3l_mha_tied_yarn_deepseekv2": (4, 2, 20, False, "3l_mha_tied_yarn_deepseekv2"),
    "1l_gqa_untied_yarn_gptoss": (4, 2, 24, None),
    "3l_mqa_tied_rope1e4_gptoss_swa_aux": (5, 2, 20, None),
    "3l_mqa_tied_rope1e4_gptoss_swa": (5, 2, 20, None),  # (the _aux variant's twin: drawn, not a fixture)
    "3l_gqa_untied_llama3_llama4": (4, 1, 24, None, "3l_gqa_untied_llama3_llama4"),
    "1l_mqa_tied_rope1e4_llama4": (3, 1, 20, None, "1l_mqa_tied_rope1e4_llama4"),
    "3l_gqa_untied_rope1e4_qwen35moe": (4, 2, 12, None, 16),
}
# The glm4moe variants' other Glm4MoeConfig attributes: the first first_k_dense_replace layers
# dense (Llama's MLP, intermediate_size wide), the others sparse; n_shared_experts (the shared
# experts' MLP is moe_intermediate_size * n_shared_experts wide); n_group groups of E / n_group
# consecutive experts, of which topk_group are kept; routed_scaling_factor; attention_bias (q/k/v
# only); use_qk_norm (per-head q_norm / k_norm).
GLM4_MOE = {
    "1l_gqa_untied_rope1e4_glm4moe": {"first_k_dense_replace": 0, "n_shared_experts": 1, "n_group": 4,
                                      "topk_group": 2, "routed_scaling_factor": 2.5,
                                      "attention_bias": True, "use_qk_norm": False},
    "3l_mqa_tied_llama3_glm4moe": {"first_k_dense_replace": 1, "n_shared_experts": 2, "n_group": 1,
                                   "topk_group": 1, "routed_scaling_factor": 1.0,
                                   "attention_bias": False, "use_qk_norm": True},
}
# The deepseekv3 variants' other DeepseekV3Config attributes: the MoE block's as GLM4_MOE's, and
# Multi-head Latent Attention's: q_lora_rank (None: a plain q_proj), kv_lora_rank, the per-head
# widths qk_nope_head_dim (dn), qk_rope_head_dim (dr: the shared rotary key, and the RoPE dim) and
# v_head_dim (dv), rope_interleave (the dr columns in pairs (2i, 2i+1)) and attention_bias (q_a_proj,
# kv_a_proj_with_mqa and o_proj biased; never q_proj, q_b_proj or kv_b_proj).
DEEPSEEK_V3 = {
    "1l_mha_untied_rope1e4_deepseekv3": {"first_k_dense_replace": 0, "n_shared_experts": 1, "n_group": 4,
                                         "topk_group": 2, "routed_scaling_factor": 2.5, "q_lora_rank": None,
                                         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                                         "v_head_dim": 6, "rope_interleave": False, "attention_bias": False},
    "3l_mha_tied_yarn_deepseekv3": {"first_k_dense_replace": 1, "n_shared_experts": 2, "n_group": 1,
                                    "topk_group": 1, "routed_scaling_factor": 1.0, "q_lora_rank": 12,
                                    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                                    "v_head_dim": 8, "rope_interleave": True, "attention_bias": True},
}
# The deepseekv2 variants' other DeepseekV2Config attributes: Multi-head Latent Attention's as
# DEEPSEEK_V3's, less rope_interleave (DeepseekV2 always rotates the pairs (2i, 2i+1): its
# apply_rotary_emb's view_as_complex); first_k_dense_replace, n_shared_experts,
# routed_scaling_factor of DeepseekV2Moe (softmax router, greedy top-K, no bias, no groups:
# n_group / topk_group null, topk_method "greedy").
DEEPSEEK_V2 = {
    "1l_mha_untied_rope1e4_deepseekv2": {"first_k_dense_replace": 0, "n_shared_experts": 1,
                                         "routed_scaling_factor": 2.5, "q_lora_rank": None,
                                         "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                                         "v_head_dim": 6, "attention_bias": False},
    "3l_mha_tied_yarn_deepseekv2": {"first_k_dense_replace": 1, "n_shared_experts": 2,
                                    "routed_scaling_factor": 1.0, "q_lora_rank": 12,
                                    "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                                    "v_head_dim": 8, "attention_bias": True},
}
# DeepSeek-V3's YaRN (the deepseekv3 and deepseekv2 yarn variants), DeepSeek-V3's own keys at tiny sizes: over the
# dr = 4 rotary columns, theta 1e4, original_max_position_embeddings 4 = max_position_embeddings 16
# / factor 4 (transformers 4.4x-4.5x replace factor by that ratio whenever
# original_max_position_embeddings is given, 5.x keeps the explicit factor: equal here, so every
# version computes the same), beta_fast 32 / beta_slow 1 turn at dimensions -0.85 / -0.098,
# truncated to [0, 0] (+0.001): pair 0 keeps its frequency, pair 1 is divided by factor (no pair
# blended: that would need original > 628 with dr 4). cos and sin times get_mscale(4, mscale 1) /
# get_mscale(4, mscale_all_dim 0.8) = (1 + 0.1 ln 4) / (1 + 0.08 ln 4); the softmax scale D^-1/2
# times get_mscale(4, 0.8)^2 (D = dn + dr).
DEEPSEEK_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "beta_fast": 32.0,
                 "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}
DEEPSEEK_EPS = 1e-3  # the deepseekv3 variants' rms_norm_eps: not the lora norms' fixed 1e-6
LORA_EPS = 1e-6  # DeepseekV3RMSNorm's default eps: q_a_layernorm's and kv_a_layernorm's, whatever rms_norm_eps
GLM_PARTIAL_ROTARY = 0.5  # Glm4MoeConfig's partial_rotary_factor (GLM-4.5's): 6 of head_dim 12 rotated
GLM_BIAS_STD = 0.1  # the std of the drawn e_score_correction_bias (its own seed; see make_params)
# GptOssForCausalLM (the gptoss variants): GptOssExperts' clamped SwiGLU constants alpha and limit
# (hard-coded in modeling_gpt_oss.py, not config.json attributes); the stds of the drawn attention
# sinks (N(0, 1): they move the softmax) and expert gate_up_proj_bias (N(0, 2.5): a few routed
# pre-activations beyond +-limit, the rest N(0, 0.3) as every other weight); make_case re-draws
# gate_up_proj_bias (seed crc32("<variant>/experts<n>")) until every layer clamps at least
# GPTOSS_MIN_CLAMPED routed gate values above +limit, up values above +limit and up values below
# -limit, and no routed pre-activation lies within GPTOSS_KINK_GAP of a kink (gate's +limit, up's
# +-limit): float32 clamps them alike and the gradient is unambiguous.
GPTOSS_ALPHA, GPTOSS_LIMIT = 1.702, 7.0
GPTOSS_SINK_STD, GPTOSS_GATE_UP_BIAS_STD = 1.0, 2.5
GPTOSS_KINK_GAP, GPTOSS_MIN_CLAMPED = 1e-2, 3
CLAMP_REDRAWS = {}  # variant -> the gate_up_proj_bias re-draws make_case needed (printed by --selftest)
GPTOSS_CHUNKED = False  # (--selftest only: gate / up as gate_up's two halves instead of interleaved)
# 1l_gqa_untied_yarn_gptoss's YaRN: gpt-oss's keys (truncate false) at tiny sizes, rope_theta 1e4,
# head_dim 12; factor 4 = max_position_embeddings 2048 / original_max_position_embeddings 512
# (transformers 4.55's yarn reads factor as that ratio, 5.x the explicit factor: equal here). An
# original of 4 (16 / 4) would put the whole correction range below 0 (every dimension turns less
# than beta_slow = 1 time in 4 positions): no pair blended, truncated or not. With 512: beta_fast
# 32 / beta_slow 1 turn at dimensions 0.609 / 2.867; untruncated (truncate false) the ramp over the
# 6 pairs is 0, 0.173, 0.616, 1, 1, 1 (pair 0 kept, 1 and 2 blended, 3 to 5 / factor), where
# truncating to [0, 3] would give 0, 1/3, 2/3, 1, 1, 1; cos and sin times 0.1 ln 4 + 1.
GPTOSS_YARN = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
               "original_max_position_embeddings": 512}
GPTOSS_YARN_MAX_POS = 2048
# The llama4 variants' other Llama4TextConfig attributes: intermediate_size_mlp (the dense layers'
# MLP; intermediate_size is each expert's and the shared expert's), interleave_moe_layer_step (layer
# l sparse iff l in range(step - 1, L, step); moe_layers spelled out), no_rope_layer_interval (layer
# l rotates iff (l + 1) % interval != 0; no_rope_layers spelled out), use_qk_norm (the weightless
# L2 norm of each head of q and k, RoPE layers only), attention_chunk_size (the RoPE layers'
# "chunked_attention": query i sees key j <= i only when j // chunk == i // chunk), and the NoPE
# layers' attn_temperature_tuning: q times log(floor((t + 1) / floor_scale) + 1) * attn_scale + 1.
# 3l: layers 0, 1 rotate and are chunked (chunk 3 < T), layer 2 NoPE with the temperature
# (1, 1.35, 1.35, 1.55, 1.55, 1.69, 1.69 over T = 7), layer 1 sparse; 1l: layer 0 rotates, is
# chunked (4 < T) and sparse, no qk norm, no temperature (floor_scale / attn_scale the class's
# defaults, unused).
LLAMA4 = {
    "3l_gqa_untied_llama3_llama4": {"intermediate_size_mlp": 40, "interleave_moe_layer_step": 2,
                                    "no_rope_layer_interval": 3, "use_qk_norm": True, "attention_chunk_size": 3,
                                    "attn_temperature_tuning": True, "floor_scale": 2, "attn_scale": 0.5},
    "1l_mqa_tied_rope1e4_llama4": {"intermediate_size_mlp": 40, "interleave_moe_layer_step": 1,
                                   "no_rope_layer_interval": 4, "use_qk_norm": False, "attention_chunk_size": 4,
                                   "attn_temperature_tuning": False, "floor_scale": 8192, "attn_scale": 0.1},
}
# The qwen35 (and qwen35moe) variants' layer_types (Qwen3_5TextConfig's: each layer's token mixer,
# "linear_attention" (Qwen3_5GatedDeltaNet) or "full_attention" (the gated Qwen3NextAttention)): 3l
# linear, full, linear; 1l a full_attention layer alone (the other file has both kinds).
QWEN35_LAYER_TYPES = {
    "3l_gqa_untied_rope1e4_qwen35": ["linear_attention", "full_attention", "linear_attention"],
    "1l_mqa_tied_rope1e4_qwen35": ["full_attention"],
    "3l_gqa_untied_rope1e4_qwen35moe": ["linear_attention", "full_attention", "linear_attention"],
}
# Qwen3_5TextConfig's linear-attention sizes (every qwen35 and qwen35moe variant): 2 key heads of 8 (q and k) and 4
# value heads of 6 (each key head serves 2 consecutive value heads), the depthwise causal conv over
# 4 positions (< T); partial_rotary_factor 0.5 of head_dim 12 (6 columns rotated, 3 frequencies);
# A_log and dt_bias drawn U(-1, 1) (QWEN35_GATE_RANGE; HF initialises dt_bias 1 and A_log ln U(0.01,
# 16)): decays exp(g) from ~0 to ~1 across tokens and heads.
QWEN35_LINEAR = {"linear_conv_kernel_dim": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 6,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 4}
QWEN35_PARTIAL_ROTARY = 0.5
QWEN35_GATE_RANGE = 1.0
QWEN35_QK_L2_EPS = 1e-6  # the l2norm of q and k in the gated delta rule (HF's fixed eps, FLA's)
# A qwen35 fixture the C++ model's float32 can reproduce: the Gated DeltaNet's output is an RMSNorm of
# o = S^T q, whose scale it discards, so wherever o is small against its terms (q . k ~ 0 in 8
# dimensions, deltas v - S^T k cancelling) the float32 rounding of the inputs comes out amplified
# (some draws of the 3-layer variant move float32's gradients by 20x tests/test_llama.cpp's bound
# 1e-5 |grad| + 1e-6). make_case re-draws the linear_attn parameters (seed
# crc32("<variant>/linear<n>"), n = 1, 2, ...) until perturbation_sensitivity, in float64: every
# parameter times 1 + QWEN35_PERTURBATION N(0, 1) (float32's rounding, two fixed draws), moves no
# gradient tensor by more than QWEN35_SENSITIVITY times that bound (torch's float32 forward/backward
# then lands within ~0.2-0.5 of it, as the 3-layer Llama variants do).
QWEN35_PERTURBATION = 6e-8
QWEN35_SENSITIVITY = 0.3
LINEAR_REDRAWS = {}  # variant -> the linear_attn re-draws make_case needed (printed by --selftest)
# (--selftest only) the llama4 variants run with one piece swapped for another: rotate_half (RoPE
# in the rotate-half layout instead of adjacent pairs), gate_up_interleaved (gate / up as gate_up's
# even / odd columns instead of its two halves), scale_output (the router score times the expert's
# output instead of its input), qk_norm_nope (the L2 norm on the NoPE layers too).
LLAMA4_ALT = {"rotate_half": False, "gate_up_interleaved": False, "scale_output": False, "qk_norm_nope": False}
# The _aux variants' auxiliary load-balancing loss (output_router_logits true): its weight
# router_aux_loss_coef (the classes' defaults, in the other MoE variants' config.json: Qwen3-MoE,
# Qwen2-MoE and Mixtral 0.001, OLMoE 0.01). An _aux variant draws the weights, tokens and targets of its twin
# without _aux (seed_name): the same logits, the loss and the grads those plus the aux term's.
AUX_COEF = 0.1
AUX_DEFAULT_COEF = {"qwen3moe": 0.001, "mixtral": 0.001, "olmoe": 0.01, "qwen2moe": 0.001, "gptoss": 0.001,
                    "qwen35moe": 0.001}
# Routing that float32 reproduces: for every token of every MoE layer the sorted softmax
# probabilities p1 >= p2 >= ... differ by at least ROUTE_MARGIN relative (p_j - p_j+1 >= margin
# * p_j) for j = 1..K (the K chosen ones among themselves, and the K-th from the (K+1)-th), and
# every expert is chosen by some token (so that every expert weight has a gradient). make_case
# re-draws the router weights (seed crc32("<variant>/router<n>"), n = 1, 2, ...) until it holds.
ROUTE_MARGIN = 1e-3
ROUTER_REDRAWS = {}  # variant -> the re-draws make_case needed (printed by --selftest)
# Gemma 2's soft-caps in the gemma2 variants: small enough to bend this tiny model's scores
# (|scale q.k| up to ~3) and logits (up to ~10); Gemma 2's own are 50 and 30.
GEMMA2_ATTN_SOFTCAP, GEMMA2_FINAL_SOFTCAP = 2.0, 5.0
SWA_WINDOW = 3  # the _swa variants' sliding window: shorter than T = 7
DATA_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "llama"))


def hf_config(variant):
    """The config.json of a LlamaForCausalLM (MistralForCausalLM, Qwen2ForCausalLM,
    Qwen3ForCausalLM with the word mistral, qwen2, qwen3; the other classes' words in ARCHS;
    the MoE classes sized by MOE) of this variant (keys in a fixed order)."""
    words = variant.split("_")
    layers, attn, tied, rope, flags = words[0], words[1], words[2], words[3], set(words[4:])
    assert layers.endswith("l") and layers[:-1].isdigit(), variant
    assert attn in KV_HEADS and tied in ("tied", "untied") and rope in ("rope1e4", "llama3", "yarn", "linear", "longrope"), variant
    assert flags <= {"attnbias", "mlpbias", "swa", "partial", "aux"} | set(ARCHS), variant
    assert (rope != "longrope" and "partial" not in flags) or "phi3" in flags, variant
    archs = flags & set(ARCHS)
    assert len(archs) <= 1, variant
    assert "aux" not in flags or archs & MOE_ARCHS, variant  # (MoE only)
    if archs == {"qwen35moe"}:  # (sized by MOE[variant], its layer_types in QWEN35_LAYER_TYPES)
        assert variant in MOE and variant in QWEN35_LAYER_TYPES, variant
        return qwen35moe_config(MOE[variant], QWEN35_LAYER_TYPES[variant], int(layers[:-1]), attn, tied, rope, flags)
    if archs & MOE_ARCHS:  # sized by MOE[variant]
        assert variant in MOE, variant
        moe_config = {"qwen3moe": qwen3moe_config, "mixtral": mixtral_config, "olmoe": olmoe_config,
                      "qwen2moe": qwen2moe_config, "glm4moe": glm4moe_config, "deepseekv3": deepseekv3_config,
                      "deepseekv2": deepseekv2_config, "gptoss": gptoss_config, "llama4": llama4_config}
        return moe_config[archs.pop()](MOE[variant], int(layers[:-1]), attn, tied, rope, flags)
    if archs == {"qwen35"}:  # (its layer_types per variant: QWEN35_LAYER_TYPES)
        assert variant in QWEN35_LAYER_TYPES, variant
        return qwen35_config(QWEN35_LAYER_TYPES[variant], int(layers[:-1]), attn, tied, rope, flags)
    if archs:
        return other_arch_config(archs.pop(), int(layers[:-1]), attn, tied, rope, flags)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
        "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": int(layers[:-1]), "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS[attn], "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
        "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
        "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS[rope] and dict(SCALINGS[rope]),
        "attention_bias": "attnbias" in flags, "attention_dropout": 0.0,
        "mlp_bias": "mlpbias" in flags, "tie_word_embeddings": tied == "tied",
        "hidden_act": "silu", "initializer_range": 0.02, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1, "use_cache": True,
    }


def other_arch_config(arch, layers, attn, tied, rope, flags):
    """config.json of the Mistral / Qwen2 / Qwen3 variants: each class's own attributes
    (MistralConfig: head_dim, sliding_window; Qwen2Config: no head_dim, attention_bias or
    mlp_bias; Qwen3Config: head_dim, attention_bias; both Qwen: use_sliding_window,
    max_window_layers). Sliding windows are off or cover every sequence."""
    assert arch == "smollm3" or "mlpbias" not in flags and ("attnbias" not in flags or arch in ("qwen3", "olmo2")), (arch, flags)
    own = {"gemma3": gemma3_config, "gemma2": gemma2_config, "gemma": gemma1_config,
           "exaone4": exaone4_config, "smollm3": smollm3_config, "granite": granite_config,
           "olmo3": olmo3_config}  # the classes with a config function of their own
    if arch in own:
        return own[arch](layers, attn, tied, rope, flags)
    cfg = {"architectures": [ARCHS[arch] + "ForCausalLM"], "model_type": arch, "vocab_size": VOCAB,
           "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
           "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn]}
    if arch not in ("qwen2", "olmo2"):  # Qwen2Config and Olmo2Config have no head_dim
        cfg["head_dim"] = HEAD_DIM_QWEN3 if arch == "qwen3" else HEAD_DIM
    cfg.update({"max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
                "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
                "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS.get(rope) and dict(SCALINGS[rope])})
    if arch in ("qwen3", "olmo2"):
        cfg["attention_bias"] = "attnbias" in flags
    swa = "swa" in flags  # a window shorter than the sequence (Qwen: layers 1.. slide)
    assert not swa or arch in ("mistral", "qwen2", "qwen3", "phi3"), (arch, flags)
    if arch == "phi3":  # Phi3Config: no head_dim; dropouts; its own LongRoPE and partial rotary
        del cfg["head_dim"]
        partial = "partial" in flags
        cfg.update({"sliding_window": SWA_WINDOW if swa else None, "resid_pdrop": 0.0,
                    "embd_pdrop": 0.0, "original_max_position_embeddings": MAX_POS,
                    "pad_token_id": 0})
        if partial:
            cfg["partial_rotary_factor"] = PARTIAL_ROTARY
        if rope == "longrope":  # Phi3Config's three fields, the legacy "type" spelling
            n = rotary_dim(cfg) // 2
            cfg["rope_scaling"] = {"type": "longrope", "short_factor": LONGROPE_SHORT[:n],
                                   "long_factor": LONGROPE_LONG[:n]}
            cfg["original_max_position_embeddings"] = 4 if partial else 8
        assert rope in ("rope1e4", "longrope"), flags
    elif arch == "mistral":
        cfg["sliding_window"] = SWA_WINDOW if swa else MAX_POS
    elif arch != "olmo2" and swa:
        cfg.update({"use_sliding_window": True, "sliding_window": SWA_WINDOW, "max_window_layers": 1})
    elif arch != "olmo2":
        cfg.update({"use_sliding_window": False, "sliding_window": None, "max_window_layers": layers})
    cfg.update({"attention_dropout": 0.0, "tie_word_embeddings": tied == "tied", "hidden_act": "silu",
                "initializer_range": 0.02, "torch_dtype": "float32", "bos_token_id": 1,
                "eos_token_id": 2, "use_cache": True})
    return cfg


def gemma3_config(layers, attn, tied, rope, flags):
    """config.json of a Gemma3ForCausalLM variant (Gemma3TextConfig's attributes): head_dim 12
    != hidden / heads, query_pre_attn_scalar 10 != head_dim, global rope_theta 1e6 with the
    variant's scaling (rope1e4: none; linear: factor 2), local period 1e4; one layer: pattern
    6, a sliding layer with a window covering the sequence; three layers (_swa): pattern 2,
    sliding / global / sliding, window 3 < T."""
    assert rope in ("rope1e4", "linear") and "attnbias" not in flags, (rope, flags)
    swa = "swa" in flags
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "head_dim": HEAD_DIM_QWEN3, "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": SCALINGS[rope] and dict(SCALINGS[rope]), "query_pre_attn_scalar": 10,
            "sliding_window": SWA_WINDOW if swa else MAX_POS, "sliding_window_pattern": 2 if swa else 6,
            "attention_bias": False, "attention_dropout": 0.0, "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": None, "attn_logit_softcapping": None,
            "tie_word_embeddings": tied == "tied", "pad_token_id": GEMMA_PAD, "initializer_range": 0.02,
            "torch_dtype": "float32", "bos_token_id": 2, "eos_token_id": 1, "use_cache": True}


def gemma2_config(layers, attn, tied, rope, flags):
    """config.json of a Gemma2ForCausalLM variant (Gemma2Config's attributes): head_dim 12 !=
    hidden / heads, query_pre_attn_scalar 10, one RoPE (rope_theta 1e4 with the variant's
    scaling) for every layer, the even layers sliding (layer_types spelled out, as transformers
    5 derives it), window 3 < T with _swa (else the sequence), both soft-caps on."""
    assert rope in ("rope1e4", "linear") and "attnbias" not in flags, (rope, flags)
    types = ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(layers)]
    return {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "head_dim": HEAD_DIM_QWEN3, "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 10000.0, "rope_scaling": SCALINGS[rope] and dict(SCALINGS[rope]),
            "query_pre_attn_scalar": 10, "sliding_window": SWA_WINDOW if "swa" in flags else MAX_POS,
            "layer_types": types, "attention_bias": False, "attention_dropout": 0.0,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh",
            "final_logit_softcapping": GEMMA2_FINAL_SOFTCAP,
            "attn_logit_softcapping": GEMMA2_ATTN_SOFTCAP,
            "tie_word_embeddings": tied == "tied", "pad_token_id": GEMMA_PAD, "initializer_range": 0.02,
            "torch_dtype": "float32", "bos_token_id": 2, "eos_token_id": 1, "use_cache": True}


def gemma1_config(layers, attn, tied, rope, flags):
    """config.json of a GemmaForCausalLM variant (GemmaConfig's attributes): head_dim 12 !=
    hidden / heads, Llama's two norms and head_dim^-1/2 scores, no window; the Hub's Gemma 1
    spelling of the activation (hidden_act "gelu", hidden_activation "gelu_pytorch_tanh")."""
    assert "swa" not in flags and "attnbias" not in flags, flags
    return {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "head_dim": HEAD_DIM_QWEN3, "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
            "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS[rope] and dict(SCALINGS[rope]),
            "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "gelu",
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": tied == "tied",
            "pad_token_id": GEMMA_PAD, "initializer_range": 0.02, "torch_dtype": "float32",
            "bos_token_id": 2, "eos_token_id": 1, "use_cache": True}


def exaone4_config(layers, attn, tied, rope, flags):
    """config.json of an Exaone4ForCausalLM variant (Exaone4Config's attributes, head_dim 12 !=
    hidden / heads): with _swa a window of 3 and sliding_window_pattern "LG" (layer_types
    spelled out: sliding, global, sliding), only the sliding layers rotating; without, a null
    window: every layer global and rotated."""
    assert "attnbias" not in flags and "mlpbias" not in flags, flags
    swa = "swa" in flags
    types = ["sliding_attention" if swa and (l + 1) % 2 else "full_attention" for l in range(layers)]
    return dict(sized_config("Exaone4ForCausalLM", "exaone4", layers, attn, rope), **{
            "head_dim": HEAD_DIM_QWEN3, "attention_dropout": 0.0,
            "sliding_window": SWA_WINDOW if swa else None,
            "sliding_window_pattern": "LG" if swa else None, "layer_types": types,
            "tie_word_embeddings": tied == "tied", "hidden_act": "silu", "initializer_range": 0.02,
            "torch_dtype": "float32", "bos_token_id": 0, "eos_token_id": 2, "use_cache": True})


def moe_attributes(sizes, *names):
    """The router attributes of a MoE config (names: the class's spelling of the expert count
    and of the expert size; norm_topk_prob unless sizes says None, Mixtral's)."""
    E, K, size, norm = sizes[:4]
    out = {names[0]: E, "num_experts_per_tok": K, names[1]: size}
    if norm is not None:
        out["norm_topk_prob"] = norm
    return out


def aux_attributes(arch, flags):
    """output_router_logits and router_aux_loss_coef: with _aux true and AUX_COEF, else false and
    the class's default (AUX_DEFAULT_COEF)."""
    aux = "aux" in flags
    return {"output_router_logits": aux, "router_aux_loss_coef": AUX_COEF if aux else AUX_DEFAULT_COEF[arch]}


def qwen3moe_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a Qwen3MoeForCausalLM variant: the qwen3 variants' attributes (head_dim
    12, no window) and Qwen3MoeConfig's: every layer sparse (decoder_sparse_step 1,
    mlp_only_layers []), num_experts / num_experts_per_tok / moe_intermediate_size /
    norm_topk_prob from MOE, no auxiliary loss (output_router_logits false; with _aux true,
    router_aux_loss_coef 0.1); intermediate_size 40, the dense MLP's, unused."""
    assert "swa" not in flags and "mlpbias" not in flags, flags
    cfg = {}
    for key, value in other_arch_config("qwen3", layers, attn, tied, rope, flags).items():
        cfg[key] = value
        if key == "attention_dropout":
            cfg.update({"decoder_sparse_step": 1, "mlp_only_layers": []})
            cfg.update(moe_attributes(sizes, "num_experts", "moe_intermediate_size"))
            cfg.update(aux_attributes("qwen3moe", flags))
    return dict(cfg, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe")


def qwen2moe_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a Qwen2MoeForCausalLM variant (Qwen2MoeConfig's attributes): the qwen2
    variants' attention (no head_dim; q/k/v biases, qkv_bias true; use_sliding_window with the
    window 3 on the layers from max_window_layers 1 on with _swa, else off) and layer_types
    spelled out as that rule gives them (transformers 5's Qwen2MoeConfig derives another list
    when it is absent); every layer sparse (decoder_sparse_step 1, mlp_only_layers []),
    num_experts / num_experts_per_tok / moe_intermediate_size / norm_topk_prob /
    shared_expert_intermediate_size from MOE, no auxiliary loss (with _aux: output_router_logits,
    router_aux_loss_coef 0.1); intermediate_size 40, the dense MLP's, unused."""
    assert "attnbias" not in flags and "mlpbias" not in flags and len(sizes) == 5, (flags, sizes)
    base = other_arch_config("qwen2", layers, attn, tied, rope, flags)
    cfg = {}
    for key, value in base.items():
        cfg[key] = value
        if key == "max_window_layers":
            cfg["layer_types"] = ["sliding_attention" if base["use_sliding_window"] and l >= value
                                  else "full_attention" for l in range(layers)]
        if key == "attention_dropout":
            cfg.update({"decoder_sparse_step": 1, "mlp_only_layers": []})
            cfg.update(moe_attributes(sizes, "num_experts", "moe_intermediate_size"))
            cfg["shared_expert_intermediate_size"] = sizes[4]
            cfg.update(aux_attributes("qwen2moe", flags))
            cfg["qkv_bias"] = True
    return dict(cfg, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe")


def mixtral_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a MixtralForCausalLM variant (MixtralConfig's attributes): Mistral's
    attention (head_dim 8, no biases; sliding_window null, or 3 < T with _swa),
    num_local_experts / num_experts_per_tok from MOE, each expert intermediate_size wide; no
    auxiliary loss (with _aux: output_router_logits, router_aux_loss_coef 0.1), no router
    jitter."""
    assert "attnbias" not in flags and "mlpbias" not in flags and sizes[3] is None, (flags, sizes)
    E, K, size, _ = sizes
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": size, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn], "head_dim": HEAD_DIM,
            "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
            "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS[rope] and dict(SCALINGS[rope]),
            "sliding_window": SWA_WINDOW if "swa" in flags else None, "attention_dropout": 0.0,
            "num_local_experts": E, "num_experts_per_tok": K, **aux_attributes("mixtral", flags),
            "router_jitter_noise": 0.0,
            "tie_word_embeddings": tied == "tied", "hidden_act": "silu", "initializer_range": 0.02,
            "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2, "use_cache": True}


def olmoe_config(sizes, layers, attn, tied, rope, flags):
    """config.json of an OlmoeForCausalLM variant (OlmoeConfig's attributes; no head_dim, no
    window, clip_qkv null; pad_token_id absent: the class's 1): num_experts /
    num_experts_per_tok / norm_topk_prob from MOE, each expert intermediate_size wide; no
    auxiliary loss (with _aux: output_router_logits, router_aux_loss_coef 0.1)."""
    assert "swa" not in flags and "attnbias" not in flags and "mlpbias" not in flags, flags
    cfg = sized_config("OlmoeForCausalLM", "olmoe", layers, attn, rope)
    cfg.update({"attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None})
    cfg.update(moe_attributes(sizes, "num_experts", "intermediate_size"))  # (keeps its place)
    cfg.update(aux_attributes("olmoe", flags))
    cfg.update({"tie_word_embeddings": tied == "tied", "hidden_act": "silu", "initializer_range": 0.02,
                "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2, "use_cache": True})
    return cfg


def glm4moe_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a Glm4MoeForCausalLM variant (Glm4MoeConfig's attributes in its order):
    head_dim 12 != hidden / heads, partial_rotary_factor 0.5, no window, pad_token_id absent
    (None); n_routed_experts / num_experts_per_tok / moe_intermediate_size / norm_topk_prob from
    MOE, the rest from GLM4_MOE; no auxiliary loss (the class has none), no MTP layer
    (num_nextn_predict_layers 0); intermediate_size 40, the dense layers' MLP."""
    assert not flags & {"attnbias", "mlpbias", "swa", "aux"} and len(sizes) == 5, (flags, sizes)
    E, K, size, norm, name = sizes
    glm = GLM4_MOE[name]
    assert 0 <= glm["first_k_dense_replace"] < layers and E % glm["n_group"] == 0 and E // glm["n_group"] >= 2
    return {"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "partial_rotary_factor": GLM_PARTIAL_ROTARY,
            "num_key_value_heads": KV_HEADS[attn], "hidden_act": "silu", "max_position_embeddings": MAX_POS,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "use_cache": True,
            "tie_word_embeddings": tied == "tied", "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
            "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS[rope] and dict(SCALINGS[rope]),
            "attention_bias": glm["attention_bias"], "attention_dropout": 0.0,
            "moe_intermediate_size": size, "num_experts_per_tok": K,
            "n_shared_experts": glm["n_shared_experts"], "n_routed_experts": E,
            "routed_scaling_factor": glm["routed_scaling_factor"], "n_group": glm["n_group"],
            "topk_group": glm["topk_group"], "first_k_dense_replace": glm["first_k_dense_replace"],
            "norm_topk_prob": norm, "use_qk_norm": glm["use_qk_norm"], "head_dim": HEAD_DIM_QWEN3,
            "num_nextn_predict_layers": 0, "torch_dtype": "float32"}


def deepseekv3_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a DeepseekV3ForCausalLM variant (DeepseekV3Config's attributes in its
    __init__ order): Multi-head Latent Attention sized by DEEPSEEK_V3 (num_key_value_heads =
    num_attention_heads: MLA's keys and values are per head; no head_dim attribute: the class sets
    head_dim = qk_rope_head_dim itself, the RoPE dim), rms_norm_eps 1e-3, pad_token_id absent
    (None), rope1e4 or DeepSeek's yarn (DEEPSEEK_YARN); n_routed_experts / num_experts_per_tok /
    moe_intermediate_size / norm_topk_prob from MOE, the rest of GLM-4.5's MoE attributes from
    DEEPSEEK_V3; no auxiliary loss (the class has none); intermediate_size 40, the dense layers'
    MLP."""
    assert not flags & {"attnbias", "mlpbias", "swa", "aux"} and len(sizes) == 5, (flags, sizes)
    assert attn == "mha" and rope in ("rope1e4", "yarn"), (attn, rope)
    E, K, size, norm, name = sizes
    ds = DEEPSEEK_V3[name]
    assert 0 <= ds["first_k_dense_replace"] < layers and E % ds["n_group"] == 0 and E // ds["n_group"] >= 2
    assert ds["qk_rope_head_dim"] % 2 == 0
    return {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "moe_intermediate_size": size,
            "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "n_shared_experts": ds["n_shared_experts"], "n_routed_experts": E,
            "routed_scaling_factor": ds["routed_scaling_factor"], "kv_lora_rank": ds["kv_lora_rank"],
            "q_lora_rank": ds["q_lora_rank"], "qk_rope_head_dim": ds["qk_rope_head_dim"],
            "v_head_dim": ds["v_head_dim"], "qk_nope_head_dim": ds["qk_nope_head_dim"], "n_group": ds["n_group"],
            "topk_group": ds["topk_group"], "num_experts_per_tok": K,
            "first_k_dense_replace": ds["first_k_dense_replace"], "norm_topk_prob": norm, "hidden_act": "silu",
            "max_position_embeddings": MAX_POS, "initializer_range": 0.02, "rms_norm_eps": DEEPSEEK_EPS,
            "use_cache": True, "bos_token_id": 0, "eos_token_id": 1, "pretraining_tp": 1,
            "tie_word_embeddings": tied == "tied", "rope_theta": 10000.0,
            "rope_scaling": dict(DEEPSEEK_YARN) if rope == "yarn" else None,
            "rope_interleave": ds["rope_interleave"], "attention_bias": ds["attention_bias"],
            "attention_dropout": 0.0, "torch_dtype": "float32"}


def deepseekv2_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a DeepseekV2ForCausalLM variant (DeepseekV2Config's attributes in its
    __init__ order): Multi-head Latent Attention sized by DEEPSEEK_V2 (num_key_value_heads =
    num_attention_heads; no head_dim attribute; no rope_interleave: the class always rotates the
    pairs (2i, 2i+1)), rms_norm_eps 1e-3, pad_token_id absent (None), bos 1, eos 2, rope1e4 or
    DeepSeek's yarn (DEEPSEEK_YARN); mlp_bias false; n_routed_experts / num_experts_per_tok /
    moe_intermediate_size / norm_topk_prob (false; DeepseekV2Moe ignores it) from MOE, the rest
    from DEEPSEEK_V2; topk_method "greedy", n_group / topk_group null; no auxiliary loss (the
    class has none); intermediate_size 40, the dense layers' MLP."""
    assert not flags & {"attnbias", "mlpbias", "swa", "aux"} and len(sizes) == 5, (flags, sizes)
    assert attn == "mha" and rope in ("rope1e4", "yarn"), (attn, rope)
    E, K, size, norm, name = sizes
    ds = DEEPSEEK_V2[name]
    assert 0 <= ds["first_k_dense_replace"] < layers and K < E and ds["qk_rope_head_dim"] % 2 == 0
    return {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn], "hidden_act": "silu",
            "max_position_embeddings": MAX_POS, "initializer_range": 0.02, "rms_norm_eps": DEEPSEEK_EPS,
            "use_cache": True, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": tied == "tied",
            "rope_theta": 10000.0, "rope_scaling": dict(DEEPSEEK_YARN) if rope == "yarn" else None,
            "attention_bias": ds["attention_bias"], "attention_dropout": 0.0, "mlp_bias": False,
            "first_k_dense_replace": ds["first_k_dense_replace"], "kv_lora_rank": ds["kv_lora_rank"],
            "q_lora_rank": ds["q_lora_rank"], "n_group": None, "n_routed_experts": E,
            "n_shared_experts": ds["n_shared_experts"], "qk_nope_head_dim": ds["qk_nope_head_dim"],
            "qk_rope_head_dim": ds["qk_rope_head_dim"], "routed_scaling_factor": ds["routed_scaling_factor"],
            "topk_group": None, "topk_method": "greedy", "norm_topk_prob": norm, "v_head_dim": ds["v_head_dim"],
            "num_experts_per_tok": K, "moe_intermediate_size": size, "torch_dtype": "float32"}


def gptoss_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a GptOssForCausalLM variant (GptOssConfig's attributes): head_dim 12 != hidden /
    heads; q/k/v/o biased (attention_bias true, always); the even layers sliding (layer_types
    spelled out, GptOssConfig's default rule) with the window 3 < T, every variant (the _swa word
    changes nothing); rope_theta 1e4 with gpt-oss's yarn (GPTOSS_YARN, truncate false, and
    max_position_embeddings 2048 = factor * original), or rope1e4: rope_scaling {"rope_type":
    "default"} (not null: transformers 5's GptOssConfig takes a null rope_scaling for its own yarn
    default, 4.55 for none; "default" is plain RoPE in both); num_local_experts /
    num_experts_per_tok / intermediate_size (each expert's) from MOE; no auxiliary loss (with
    _aux: output_router_logits, router_aux_loss_coef 0.1); pad_token_id null (GptOssConfig's
    None)."""
    assert not flags & {"attnbias", "mlpbias"} and rope in ("rope1e4", "yarn") and sizes[3] is None, (flags, rope, sizes)
    E, K, size, _ = sizes
    assert K < E
    yarn = rope == "yarn"
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": size, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn], "head_dim": HEAD_DIM_QWEN3,
            "max_position_embeddings": GPTOSS_YARN_MAX_POS if yarn else MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 10000.0, "rope_scaling": dict(GPTOSS_YARN) if yarn else {"rope_type": "default"},
            "sliding_window": SWA_WINDOW,
            "layer_types": ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(layers)],
            "num_local_experts": E, "num_experts_per_tok": K, **aux_attributes("gptoss", flags),
            "tie_word_embeddings": tied == "tied", "initializer_range": 0.02, "attention_bias": True,
            "hidden_act": "silu", "attention_dropout": 0.0, "pad_token_id": None, "torch_dtype": "float32",
            "use_cache": True}


def llama4_config(sizes, layers, attn, tied, rope, flags):
    """config.json of a Llama4ForCausalLM variant (Llama4TextConfig's attributes in its order, model_type
    llama4_text): head_dim 8; num_local_experts / num_experts_per_tok / intermediate_size (each
    expert's and the shared expert's) from MOE, the rest from LLAMA4, with the lists the class would
    derive spelled out: moe_layers (range(step - 1, L, step)), no_rope_layers (1: RoPE, 0: NoPE every
    no_rope_layer_interval-th layer) and layer_types ("chunked_attention" on the RoPE layers,
    "full_attention" on the NoPE ones); rope1e4 (rope_scaling null) or llama3 (LLAMA3_SCALING: the
    class rotates with llama3 whenever rope_scaling is set); no biases; pad_token_id null; no
    auxiliary loss (Llama4ForCausalLM adds none: output_router_logits false, the class's
    router_aux_loss_coef written, no _aux variant)."""
    assert not flags & {"attnbias", "mlpbias", "swa", "aux"} and rope in ("rope1e4", "llama3"), (flags, rope)
    E, K, size, norm, name = sizes
    assert norm is None and K < E, sizes
    l4 = LLAMA4[name]
    step, interval = l4["interleave_moe_layer_step"], l4["no_rope_layer_interval"]
    no_rope = [int((l + 1) % interval != 0) for l in range(layers)]
    return {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": size, "intermediate_size_mlp": l4["intermediate_size_mlp"],
            "num_hidden_layers": layers, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "head_dim": HEAD_DIM, "hidden_act": "silu", "max_position_embeddings": MAX_POS,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "use_cache": True, "pad_token_id": None,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": tied == "tied", "attention_dropout": 0.0,
            "num_experts_per_tok": K, "num_local_experts": E, "moe_layers": list(range(step - 1, layers, step)),
            "interleave_moe_layer_step": step, "use_qk_norm": l4["use_qk_norm"], "output_router_logits": False,
            "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
            "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
            "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else None,
            "no_rope_layers": no_rope, "no_rope_layer_interval": interval,
            "attention_chunk_size": l4["attention_chunk_size"],
            "layer_types": ["chunked_attention" if r else "full_attention" for r in no_rope],
            "attn_temperature_tuning": l4["attn_temperature_tuning"], "floor_scale": l4["floor_scale"],
            "attn_scale": l4["attn_scale"], "attention_bias": False, "torch_dtype": "float32"}


def qwen35_config(layer_types, layers, attn, tied, rope, flags):
    """config.json of a Qwen3_5ForCausalLM variant (model_type qwen3_5_text; Qwen3_5TextConfig's
    attributes as transformers 5's to_dict() writes them): head_dim 12 != hidden / heads; RoPE in
    rope_parameters (rope_type default, rope_theta 1e4, partial_rotary_factor 0.5: no top-level
    rope_theta or rope_scaling); layer_types (the token mixer of each layer) and the linear-attention
    sizes of QWEN35_LINEAR; no biases (attention_bias false); pad_token_id null (the class's
    default)."""
    assert rope == "rope1e4" and not flags - {"qwen35"} and len(layer_types) == layers, (rope, flags, layer_types)
    assert set(layer_types) <= {"linear_attention", "full_attention"}, layer_types
    return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn], "head_dim": HEAD_DIM_QWEN3,
            "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "partial_rotary_factor": QWEN35_PARTIAL_ROTARY},
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": tied == "tied",
            "hidden_act": "silu", "initializer_range": 0.02, "layer_types": list(layer_types),
            **QWEN35_LINEAR, "pad_token_id": None, "bos_token_id": 1, "eos_token_id": 2, "use_cache": True,
            "torch_dtype": "float32"}


def qwen35moe_config(sizes, layer_types, layers, attn, tied, rope, flags):
    """config.json of a Qwen3_5MoeForCausalLM variant (model_type qwen3_5_moe_text;
    Qwen3_5MoeTextConfig's attributes as transformers 5's to_dict() writes them): qwen35_config's
    (head_dim 12, rope_parameters with partial_rotary_factor 0.5, layer_types, QWEN35_LINEAR's sizes,
    no biases, pad_token_id null) less intermediate_size, and the MoE block's num_experts /
    num_experts_per_tok / moe_intermediate_size / shared_expert_intermediate_size from MOE; no
    auxiliary loss (output_router_logits false, the class's router_aux_loss_coef 0.001). No
    decoder_sparse_step, norm_topk_prob or mlp_only_layers: the class deletes them (every layer
    sparse, the top-K weights always renormalised)."""
    assert not flags - {"qwen35moe"} and len(sizes) == 5 and sizes[3] is None, (flags, sizes)
    E, K, size, _, shared = sizes
    assert K < E, sizes
    cfg = {}
    for key, value in qwen35_config(layer_types, layers, attn, tied, rope, set()).items():
        if key == "intermediate_size":
            continue
        cfg[key] = value
        if key == "linear_num_value_heads":
            cfg.update({"num_experts": E, "num_experts_per_tok": K, "moe_intermediate_size": size,
                        "shared_expert_intermediate_size": shared, **aux_attributes("qwen35moe", flags)})
    return dict(cfg, architectures=["Qwen3_5MoeForCausalLM"], model_type="qwen3_5_moe_text")


def sized_config(cls, model_type, layers, attn, rope):
    """The leading attributes every class without head_dim shares: class, sizes, norm epsilon
    and RoPE (rope1e4 / linear / yarn: theta 1e4; llama3: theta 5e5 with LLAMA3_SCALING)."""
    return {"architectures": [cls], "model_type": model_type, "vocab_size": VOCAB,
            "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS[attn],
            "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
            "rope_theta": 500000.0 if rope == "llama3" else 10000.0,
            "rope_scaling": dict(LLAMA3_SCALING) if rope == "llama3" else SCALINGS[rope] and dict(SCALINGS[rope])}


def smollm3_config(layers, attn, tied, rope, flags):
    """config.json of a SmolLM3ForCausalLM variant (SmolLM3Config's attributes; no head_dim):
    no_rope_layer_interval 2, so layer 1 of 3 has no RoPE (NoPE) and, with _swa, slides
    (use_sliding_window, window 3 < T: HF's layer_types); pad_token_id null (SmolLM3Config's
    128004 is beyond the tiny vocabulary)."""
    swa = "swa" in flags
    return dict(sized_config("SmolLM3ForCausalLM", "smollm3", layers, attn, rope), **{
            "no_rope_layer_interval": 2, "use_sliding_window": swa,
            "sliding_window": SWA_WINDOW if swa else None, "attention_bias": "attnbias" in flags,
            "attention_dropout": 0.0, "mlp_bias": "mlpbias" in flags,
            "tie_word_embeddings": tied == "tied", "pad_token_id": None, "hidden_act": "silu",
            "initializer_range": 0.02, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
            "use_cache": True})


def granite_config(layers, attn, tied, rope, flags):
    """config.json of a GraniteForCausalLM variant (GraniteConfig's attributes; no head_dim):
    its four multipliers away from 1 (Granite 3's are 12, 0.22, 1/128 and 8)."""
    assert "attnbias" not in flags and "mlpbias" not in flags, flags
    return dict(sized_config("GraniteForCausalLM", "granite", layers, attn, rope), **{
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.2,
            "logits_scaling": 4.0, "tie_word_embeddings": tied == "tied", "hidden_act": "silu",
            "initializer_range": 0.02, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
            "use_cache": True})


def olmo3_config(layers, attn, tied, rope, flags):
    """config.json of an Olmo3ForCausalLM variant (Olmo3Config: OLMo 2's attributes, its
    sliding_window and an explicit layer_types: sliding, global, sliding), window 3 < T with
    _swa; the llama3 scaling applies to the global layer only (Olmo3Model's rotary_embs)."""
    assert "swa" in flags and "mlpbias" not in flags, flags
    types = ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(layers)]
    return dict(sized_config("Olmo3ForCausalLM", "olmo3", layers, attn, rope), **{
            "attention_bias": "attnbias" in flags, "attention_dropout": 0.0,
            "sliding_window": SWA_WINDOW, "layer_types": types, "pad_token_id": None,
            "tie_word_embeddings": tied == "tied", "hidden_act": "silu", "initializer_range": 0.02,
            "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": 2, "use_cache": True})


def granite(cfg):  # GraniteForCausalLM's four multipliers (1 for the other classes)
    return cfg["model_type"] == "granite"


def uses_rope(cfg, layer):
    """SmolLM3Attention's use_rope: its no_rope_layers entry, else 0 on every
    no_rope_layer_interval-th layer; Exaone4Attention's: with a window, the sliding layers only
    ("global NoPE for hybrid attention"); Llama4TextAttention's as SmolLM3's (its no_rope_layers entry,
    else the interval rule); every other class rotates every layer."""
    if cfg["model_type"] == "exaone4":
        return cfg.get("sliding_window") is None or sliding(cfg, layer)
    if cfg["model_type"] not in ("smollm3", "llama4_text"):
        return True
    if cfg.get("no_rope_layers"):
        return bool(cfg["no_rope_layers"][layer])
    return (layer + 1) % cfg.get("no_rope_layer_interval", 4) != 0


# What each class makes of its config (HF's getattr defaults for the attributes it lacks).
def head_dim(cfg):  # (DeepseekV3Config sets head_dim = qk_rope_head_dim: its RoPE dim)
    if mla(cfg):
        return cfg["qk_rope_head_dim"]
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rotary_dim(cfg):  # the columns of a head RoPE rotates (Phi3's partial_rotary_factor)
    if qwen35(cfg) and "partial_rotary_factor" not in cfg:  # (transformers 5: inside rope_parameters)
        return int(head_dim(cfg) * qwen35_rope(cfg)["partial_rotary_factor"])
    return int(head_dim(cfg) * cfg.get("partial_rotary_factor", 1.0))


def scaling_type(s):  # rope_scaling's type ("rope_type", or Phi-3's legacy "type")
    return None if s is None else s.get("rope_type", s.get("type"))


def qkv_bias(cfg):  # Qwen2Attention: q/k/v always biased, o_proj never (Qwen2-MoE: qkv_bias, default true)
    if cfg["model_type"] == "qwen2_moe":
        return cfg.get("qkv_bias", True)
    return cfg.get("attention_bias", False) or cfg["model_type"] == "qwen2"


def o_bias(cfg):  # (Glm4MoeAttention: o_proj never biased)
    return cfg.get("attention_bias", False) and not glm4moe(cfg)


def mlp_bias(cfg):
    return cfg.get("mlp_bias", False)


def qk_norm(cfg):  # Qwen3Attention's (Qwen3-MoE's, Gemma 3's, EXAONE 4's) q_norm / k_norm over each head
    # (GLM-4.5's under use_qk_norm)
    if glm4moe(cfg):
        return cfg.get("use_qk_norm", False)
    return cfg["model_type"] in ("qwen3", "qwen3_moe", "gemma3_text", "exaone4")


def gemma3(cfg):
    """Gemma3ForCausalLM alone: q_norm / k_norm; sliding layers with the local RoPE
    (rope_local_base_freq, unscaled)."""
    return cfg["model_type"] == "gemma3_text"


def gemma(cfg):
    """GemmaForCausalLM, Gemma2ForCausalLM and Gemma3ForCausalLM: (1 + w) RMSNorms; the
    embedding times sqrt(hidden) rounded to float32, padding_idx pad_token_id; GeGLU (gelu
    tanh)."""
    return cfg["model_type"] in ("gemma", "gemma2", "gemma3_text")


def gemma2_layer(cfg):
    """Gemma 2's and 3's layer (not Gemma 1's): four norms (input, post_attention,
    pre_feedforward, post_feedforward); scores times query_pre_attn_scalar^-1/2; layer_types'
    sliding layers."""
    return cfg["model_type"] in ("gemma2", "gemma3_text")


def softcaps(cfg):
    """Gemma 2's (attn_logit_softcapping, final_logit_softcapping); None: none (the others)."""
    if cfg["model_type"] != "gemma2":
        return None, None
    return cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")


def sliding(cfg, layer):  # (Gemma 3, OLMo 3, EXAONE 4, GPT-OSS)
    """Gemma 3: whether a layer is a "sliding_attention" one (its layer_types entry, else the
    pattern rule: (layer + 1) % sliding_window_pattern != 0)."""
    if cfg.get("layer_types"):
        return cfg["layer_types"][layer] == "sliding_attention"
    return (layer + 1) % cfg.get("sliding_window_pattern", 6) != 0


def pad_token(cfg):
    """The class's nn.Embedding padding_idx: config.json's pad_token_id, or the class's default
    when absent (Olmo2Config 1, OlmoeConfig 1, Phi3Config 32000, Gemma3TextConfig 0, the others
    None)."""
    default = {"olmo2": 1, "olmo3": 1, "olmoe": 1, "phi3": 32000, "gemma3_text": 0, "gemma2": 0,
               "gemma": 0, "smollm3": 128004}.get(cfg["model_type"])
    return cfg.get("pad_token_id", default)


def norm_weight(cfg, w):  # what an RMSNorm multiplies by: Gemma3RMSNorm's 1 + w (Qwen3_5RMSNorm's too)
    return 1.0 + w if gemma(cfg) or qwen35(cfg) else w


def embed_scale(cfg):  # Gemma3TextScaledWordEmbedding: sqrt(hidden) as a float32 tensor
    if granite(cfg):
        return cfg["embedding_multiplier"]
    return torch.tensor(cfg["hidden_size"] ** 0.5, dtype=torch.float32).item() if gemma(cfg) else 1.0


def score_scale(cfg):  # query_pre_attn_scalar^-1/2 (Gemma 3), attention_multiplier (Granite)
    if granite(cfg):
        return cfg["attention_multiplier"]
    return cfg["query_pre_attn_scalar"] ** -0.5 if gemma2_layer(cfg) else head_dim(cfg) ** -0.5


def rope_cfg(cfg, layer):
    """The config whose RoPE a layer uses: Gemma 3's sliding layers rope_local_base_freq with no
    scaling (Gemma3TextModel's rotary_emb_local), every other layer the config itself."""
    if gemma3(cfg) and sliding(cfg, layer):
        return dict(cfg, rope_theta=cfg["rope_local_base_freq"], rope_scaling=None)
    if qwen35(cfg):  # (its rope_parameters, flattened)
        return qwen35_rope(cfg)
    if cfg["model_type"] == "olmo3" and sliding(cfg, layer):  # rotary_embs["sliding_attention"]
        return dict(cfg, rope_scaling=None)
    return cfg


def qwen35(cfg):
    """Qwen3_5ForCausalLM (model_type qwen3_5_text, the Qwen3.5 text decoder) and
    Qwen3_5MoeForCausalLM (qwen3_5_moe_text: the same layers, the MLP replaced by the sparse block,
    qwen35moe): each layer's token mixer per layer_types, the gated attention (gated_attention) or
    the Gated DeltaNet (gated_deltanet); Llama's pre-norm layer and SwiGLU MLP otherwise; every
    RMSNorm but the DeltaNet's gated one times 1 + w; RoPE from rope_parameters (qwen35_rope)."""
    return cfg.get("model_type") in ("qwen3_5_text", "qwen3_5_moe_text")


def qwen35moe(cfg):
    """Qwen3_5MoeForCausalLM (model_type qwen3_5_moe_text): qwen35's layers with
    Qwen3_5MoeSparseMoeBlock as every layer's MLP (Qwen2-MoE's block with Qwen3VLMoeTextTopKRouter:
    softmax router, torch.topk, the K weights always renormalised; SwiGLU experts of
    moe_intermediate_size; a shared expert times sigmoid(shared_expert_gate))."""
    return cfg.get("model_type") == "qwen3_5_moe_text"


def qwen35_rope(cfg):
    """The config with Qwen3_5TextConfig's rope_parameters flattened into the attributes inv_freq,
    rotary_dim and naive_frequencies read: rope_theta, rope_scaling null (rope_type default only:
    Qwen3_5TextRotaryEmbedding's compute_default_rope_parameters), partial_rotary_factor (the class's
    0.25 when rope_parameters has none). Text-only positions: the three mrope grids (t, h, w) are
    the same positions, so the interleaved mrope sections pick the same angles: plain RoPE."""
    rp = cfg["rope_parameters"]
    assert rp.get("rope_type", "default") == "default", rp
    return dict(cfg, rope_theta=rp["rope_theta"], rope_scaling=None,
                partial_rotary_factor=rp.get("partial_rotary_factor", 0.25))


def qwen35_mixer(cfg, layer):  # a qwen35 layer's token mixer module: linear_attn or self_attn
    return "linear_attn" if cfg["layer_types"][layer] == "linear_attention" else "self_attn"


def gelu_tanh(g):  # "gelu_pytorch_tanh"
    return 0.5 * g * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g * g * g)))


def olmo2(cfg):  # Olmo2 (and Olmo3, OLMoE): q_norm / k_norm over whole rows
    return cfg["model_type"] in ("olmo2", "olmo3", "olmoe")


def post_norms(cfg):  # Olmo2DecoderLayer (OLMo 2, OLMo 3, EXAONE 4): sublayer outputs normalised
    return cfg["model_type"] in ("olmo2", "olmo3", "exaone4")  # (not OLMoE: pre-norm as Llama)


def moe(cfg):  # the Mixture-of-Experts classes
    return cfg["model_type"] in ("qwen3_moe", "mixtral", "olmoe", "qwen2_moe", "glm4_moe", "deepseek_v3", "deepseek_v2",
                                 "gpt_oss", "llama4_text", "qwen3_5_moe_text")


def gptoss(cfg):
    """GptOssForCausalLM: attention sinks (self_attn.sinks [H], one extra logit per head in every
    softmax row, dropped before P @ V), q/k/v/o biases, the even layers sliding; GptOssMLP in every
    layer: router.weight [E, C] and router.bias [E], the top-K router logits' softmax as the
    weights, packed experts (gate_up_proj [E, C, 2I] with gate / up interleaved, down_proj [E, I,
    C], both biased) with the clamped SwiGLU (gptoss_glu)."""
    return cfg.get("model_type") == "gpt_oss"


def llama4(cfg):
    """Llama4ForCausalLM (model_type llama4_text): RoPE on adjacent pairs (2i, 2i+1) on the layers
    no_rope_layers marks, then (use_qk_norm) the weightless L2 norm of each head of q and k there; the
    NoPE layers' q times the temperature scale (attn_temperature_tuning); the RoPE layers
    ("chunked_attention") see only their attention_chunk_size chunk; Llama4TextMoe (sigmoid of the
    top-K router logits scaling each chosen expert's input, packed experts with gate / up chunked,
    a shared expert) on moe_layers, Llama4TextMLP of intermediate_size_mlp elsewhere; all under
    feed_forward."""
    return cfg.get("model_type") == "llama4_text"


def chunked_layer(cfg, layer):
    """Llama 4: whether a layer's mask is "chunked_attention" (its layer_types entry)."""
    return llama4(cfg) and cfg["layer_types"][layer] == "chunked_attention"


def glm4moe(cfg):
    """Glm4MoeForCausalLM (DeepseekV3's MoE block): the sigmoid router with
    e_score_correction_bias, group-limited top-K, routed_scaling_factor, ungated shared experts;
    the first first_k_dense_replace layers dense."""
    return cfg["model_type"] == "glm4_moe"


def deepseek_moe(cfg):
    """DeepseekV3's MoE block (Glm4MoeForCausalLM's and DeepseekV3ForCausalLM's): the sigmoid
    router with e_score_correction_bias, group-limited top-K, routed_scaling_factor, ungated shared
    experts; the first first_k_dense_replace layers dense."""
    return cfg["model_type"] in ("glm4_moe", "deepseek_v3")


def mla(cfg):
    """DeepseekV3ForCausalLM's and DeepseekV2ForCausalLM's Multi-head Latent Attention
    (mla_attention) in place of Llama's."""
    return cfg.get("model_type") in ("deepseek_v3", "deepseek_v2")


def deepseek_v2(cfg):
    """DeepseekV2ForCausalLM: MLA with the rope pairs (2i, 2i+1) always and the softmax scale
    D^-1/2 alone; DeepseekV2Moe (softmax router, greedy top-K times routed_scaling_factor, never
    renormalised, ungated shared experts); the first first_k_dense_replace layers dense."""
    return cfg.get("model_type") == "deepseek_v2"


def rope_interleaved(cfg):
    """MLA's rope columns in pairs (2i, 2i+1): DeepseekV3's rope_interleave, DeepseekV2's always
    (apply_rotary_emb: view_as_complex of adjacent pairs)."""
    return deepseek_v2(cfg) or bool(cfg.get("rope_interleave", False))


def mla_scale(cfg):
    """DeepseekV3Attention's softmax scale: (dn + dr)^-1/2, times get_mscale(factor,
    mscale_all_dim)^2 when rope_scaling is set (not default) with a nonzero mscale_all_dim;
    DeepseekV2Attention's: (dn + dr)^-1/2 alone, whatever rope_scaling."""
    scale = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    if deepseek_v2(cfg):
        return scale
    s = cfg["rope_scaling"]
    if scaling_type(s) not in (None, "default") and s.get("mscale_all_dim"):
        m = get_mscale(s["factor"], s["mscale_all_dim"])
        scale = scale * m * m
    return scale


def get_mscale(factor, m=1.0):  # YaRN's 0.1 m ln(factor) + 1 (1 for factor <= 1)
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def shared_expert(cfg):
    """Qwen2-MoE's (Qwen3.5-MoE's) shared expert: a SwiGLU MLP of shared_expert_intermediate_size on
    every token of a sparse layer, times sigmoid(x shared_expert_gate.weight^T), added to the routed
    sum."""
    return cfg["model_type"] in ("qwen2_moe", "qwen3_5_moe_text")


def sparse_layer(cfg, layer):
    """Whether a layer has the sparse MoE block in place of the MLP: Qwen3MoeDecoderLayer's and
    Qwen2MoeDecoderLayer's rule (not in mlp_only_layers, and (layer + 1) % decoder_sparse_step
    == 0); Glm4MoeDecoderLayer's: from first_k_dense_replace on; every layer of Mixtral, OLMoE and
    Qwen3.5-MoE (Qwen3_5MoeDecoderLayer always builds the sparse block)."""
    if deepseek_moe(cfg) or deepseek_v2(cfg):
        return layer >= cfg["first_k_dense_replace"]
    if cfg["model_type"] in ("qwen3_moe", "qwen2_moe"):
        return layer not in cfg.get("mlp_only_layers", []) and (layer + 1) % cfg.get("decoder_sparse_step", 1) == 0
    if llama4(cfg):  # Llama4TextDecoderLayer: layer_idx in moe_layers
        return layer in cfg["moe_layers"]
    return moe(cfg)


def moe_prefix(cfg, layer):  # the block's module: Mixtral's block_sparse_moe, Llama 4's feed_forward, the others' mlp
    if llama4(cfg):
        return f"model.layers.{layer}.feed_forward."
    return f"model.layers.{layer}." + ("block_sparse_moe." if cfg["model_type"] == "mixtral" else "mlp.")


def num_experts(cfg):  # MixtralConfig's (GptOssConfig's) num_local_experts, Glm4MoeConfig's n_routed_experts, the others' num_experts
    if deepseek_moe(cfg) or deepseek_v2(cfg):
        return cfg["n_routed_experts"]
    return cfg["num_local_experts"] if cfg["model_type"] in ("mixtral", "gpt_oss", "llama4_text") else cfg["num_experts"]


def expert_size(cfg):  # Qwen3-MoE's, Qwen2-MoE's, Qwen3.5-MoE's, GLM-4.5's moe_intermediate_size; Mixtral's and OLMoE's intermediate_size
    moe_sized = cfg["model_type"] in ("qwen3_moe", "qwen2_moe", "glm4_moe", "deepseek_v3", "deepseek_v2", "qwen3_5_moe_text")
    return cfg["moe_intermediate_size"] if moe_sized else cfg["intermediate_size"]


def expert_projs(cfg):
    """An expert's (gate, up, down) names, and their state-dict order: Mixtral's w1 (gate), w3
    (up), w2 (down), listed w1, w2, w3; the others' gate_proj, up_proj, down_proj."""
    if cfg["model_type"] == "mixtral":
        return ("w1", "w3", "w2"), ("w1", "w2", "w3")
    return ("gate_proj", "up_proj", "down_proj"), ("gate_proj", "up_proj", "down_proj")


def renormalise(cfg):  # the K weights divided by their sum: Mixtral, Qwen3.5-MoE always, the others norm_topk_prob
    if deepseek_v2(cfg):  # (DeepseekV2Moe never: norm_topk_prob is read by no code of the class)
        return False
    # (Qwen3VLMoeTextTopKRouter has no norm_topk_prob: it always divides by the sum)
    return cfg["model_type"] in ("mixtral", "qwen3_5_moe_text") or cfg.get("norm_topk_prob", False)


def layer_window(cfg, layer):
    """The sliding window of a layer (0: none): Mistral's every layer; Qwen's from
    max_window_layers on under use_sliding_window (HF's layer_types). Query t sees keys
    s > t - window (transformers' sliding_window_overlay)."""
    if cfg["model_type"] in ("mistral", "phi3", "mixtral"):
        return cfg.get("sliding_window") or 0
    if cfg["model_type"] in ("qwen2", "qwen3", "qwen3_moe", "qwen2_moe") and cfg.get("use_sliding_window"):
        return cfg["sliding_window"] if layer >= cfg["max_window_layers"] else 0
    if gemma2_layer(cfg) or cfg["model_type"] in ("olmo3", "exaone4", "gpt_oss"):
        return (cfg["sliding_window"] or 0) if sliding(cfg, layer) else 0
    if cfg["model_type"] == "smollm3" and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        return cfg["sliding_window"] if not uses_rope(cfg, layer) else 0  # the NoPE layers
    return 0


def phi3(cfg):  # Phi3: q, k, v in one qkv_proj and gate, up in one gate_up_proj (rows stacked)
    return cfg["model_type"] == "phi3"


def unfused(p, cfg):
    """The params under LlamaForCausalLM's names: Phi-3's qkv_proj.weight [(H + 2 Hkv) D, C]
    split by rows into q_proj [H D, C], k_proj and v_proj [Hkv D, C] (Phi3Attention's
    qkv[..., :H D], the next Hkv D, the rest), gate_up_proj.weight [2I, C] into gate_proj (its
    first I rows) and up_proj (Phi3MLP's chunk(2)). Views: gradients reach the fused tensors."""
    if not phi3(cfg):
        return p
    H, Hkv, D, I = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg), cfg["intermediate_size"]
    out = dict(p)
    for l in range(cfg["num_hidden_layers"]):
        a, m = f"model.layers.{l}.self_attn.", f"model.layers.{l}.mlp."
        qkv, gu = p[a + "qkv_proj.weight"], p[m + "gate_up_proj.weight"]
        out[a + "q_proj.weight"] = qkv[:H * D]
        out[a + "k_proj.weight"] = qkv[H * D:(H + Hkv) * D]
        out[a + "v_proj.weight"] = qkv[(H + Hkv) * D:]
        out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = gu[:I], gu[I:]
    return out


def layer_norm_names(cfg):  # a decoder layer's RMSNorms, in state-dict order
    if gemma2_layer(cfg):
        return ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                "post_feedforward_layernorm")
    if post_norms(cfg):
        return "post_attention_layernorm", "post_feedforward_layernorm"
    return "input_layernorm", "post_attention_layernorm"


def param_shapes(cfg):
    """HF state-dict names and shapes of the variant's class, in state-dict order."""
    C, I, V = cfg["hidden_size"], cfg.get("intermediate_size"), cfg["vocab_size"]  # (Qwen3.5-MoE: no intermediate_size)
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    shapes = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        a, m = f"model.layers.{l}.self_attn.", f"model.layers.{l}.mlp."
        if qwen35(cfg):  # the token mixer, Llama's MLP (Qwen3.5-MoE: the sparse block), the two norms
            shapes += qwen35_mixer_shapes(cfg, l)
            if sparse_layer(cfg, l):
                shapes += softmax_moe_shapes(cfg, l)
            else:
                shapes += [(m + name + ".weight", dims) for name, dims in
                           (("gate_proj", (I, C)), ("up_proj", (I, C)), ("down_proj", (C, I)))]
            shapes += [(f"model.layers.{l}.{norm}.weight", (C,)) for norm in layer_norm_names(cfg)]
            continue
        if phi3(cfg):
            shapes += [(a + "qkv_proj.weight", ((H + 2 * Hkv) * D, C)), (a + "o_proj.weight", (C, H * D)),
                       (m + "gate_up_proj.weight", (2 * I, C)), (m + "down_proj.weight", (C, I))]
            shapes += [(f"model.layers.{l}.{norm}.weight", (C,)) for norm in layer_norm_names(cfg)]
            continue
        if gptoss(cfg):  # GptOssAttention's own parameter before its submodules' (state-dict order)
            shapes.append((a + "sinks", (H,)))
        for name, out, inp, bias in mla_shapes(cfg) if mla(cfg) else (
                ("q_proj", H * D, C, qkv_bias(cfg)), ("k_proj", Hkv * D, C, qkv_bias(cfg)),
                ("v_proj", Hkv * D, C, qkv_bias(cfg)), ("o_proj", C, H * D, o_bias(cfg))):
            if inp is None:  # (an RMSNorm's weight)
                shapes.append((a + name + ".weight", (out,)))
                continue
            shapes.append((a + name + ".weight", (out, inp)))
            if bias:
                shapes.append((a + name + ".bias", (out,)))
        if qk_norm(cfg):
            shapes += [(a + "q_norm.weight", (D,)), (a + "k_norm.weight", (D,))]
        if olmo2(cfg):
            shapes += [(a + "q_norm.weight", (H * D,)), (a + "k_norm.weight", (Hkv * D,))]
        if gptoss(cfg):  # GptOssMLP: router (weight, bias), then the packed experts (GptOssExperts' order)
            x, E, Im = moe_prefix(cfg, l), num_experts(cfg), expert_size(cfg)
            shapes += [(x + "router.weight", (E, C)), (x + "router.bias", (E,)),
                       (x + "experts.gate_up_proj", (E, C, 2 * Im)), (x + "experts.gate_up_proj_bias", (E, 2 * Im)),
                       (x + "experts.down_proj", (E, Im, C)), (x + "experts.down_proj_bias", (E, C))]
        elif llama4(cfg):  # feed_forward: Llama4TextMoe (experts, router, shared_expert) or Llama4TextMLP
            f, Im = moe_prefix(cfg, l), expert_size(cfg)
            if sparse_layer(cfg, l):
                shapes += [(f + "experts.gate_up_proj", (num_experts(cfg), C, 2 * Im)),
                           (f + "experts.down_proj", (num_experts(cfg), Im, C)),
                           (f + "router.weight", (num_experts(cfg), C))]
                f += "shared_expert."
            else:
                Im = cfg["intermediate_size_mlp"]
            shapes += [(f + "gate_proj.weight", (Im, C)), (f + "up_proj.weight", (Im, C)), (f + "down_proj.weight", (C, Im))]
        elif sparse_layer(cfg, l) and deepseek_moe(cfg):  # the experts, the router and its bias, the shared experts
            x, Im, Is = moe_prefix(cfg, l), expert_size(cfg), expert_size(cfg) * cfg["n_shared_experts"]
            shapes += [(f"{x}experts.{e}.{name}.weight", dims) for e in range(num_experts(cfg))
                       for name, dims in (("gate_proj", (Im, C)), ("up_proj", (Im, C)), ("down_proj", (C, Im)))]
            shapes += [(x + "gate.weight", (num_experts(cfg), C)),
                       (x + "gate.e_score_correction_bias", (num_experts(cfg),))]
            shapes += [(x + "shared_experts.gate_proj.weight", (Is, C)), (x + "shared_experts.up_proj.weight", (Is, C)),
                       (x + "shared_experts.down_proj.weight", (C, Is))]
        elif sparse_layer(cfg, l) and deepseek_v2(cfg):  # the experts, the router, the shared experts
            x, Im, Is = moe_prefix(cfg, l), expert_size(cfg), expert_size(cfg) * cfg["n_shared_experts"]
            shapes += [(f"{x}experts.{e}.{name}.weight", dims) for e in range(num_experts(cfg))
                       for name, dims in (("gate_proj", (Im, C)), ("up_proj", (Im, C)), ("down_proj", (C, Im)))]
            shapes.append((x + "gate.weight", (num_experts(cfg), C)))
            shapes += [(x + "shared_experts.gate_proj.weight", (Is, C)), (x + "shared_experts.up_proj.weight", (Is, C)),
                       (x + "shared_experts.down_proj.weight", (C, Is))]
        elif sparse_layer(cfg, l):  # the router, then each expert's three matrices
            shapes += softmax_moe_shapes(cfg, l)
        for name, out, inp in () if sparse_layer(cfg, l) or llama4(cfg) else (("gate_proj", I, C), ("up_proj", I, C), ("down_proj", C, I)):
            shapes.append((m + name + ".weight", (out, inp)))
            if mlp_bias(cfg):
                shapes.append((m + name + ".bias", (out,)))
        for norm in layer_norm_names(cfg):
            shapes.append((f"model.layers.{l}.{norm}.weight", (C,)))
    shapes.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        shapes.append(("lm_head.weight", (V, C)))
    return shapes


def softmax_moe_shapes(cfg, layer):
    """A softmax-routed sparse block in state-dict order (name, shape): the router gate.weight [E,
    C], then each expert's three matrices (expert_projs' order), and under shared_expert (Qwen2-MoE,
    Qwen3.5-MoE) shared_expert.{gate_proj, up_proj, down_proj}.weight [Is, C], [Is, C], [C, Is] and
    shared_expert_gate.weight [1, C]."""
    C, x, Im = cfg["hidden_size"], moe_prefix(cfg, layer), expert_size(cfg)
    shapes = [(x + "gate.weight", (num_experts(cfg), C))]
    dims = dict(zip(expert_projs(cfg)[0], ((Im, C), (Im, C), (C, Im))))
    shapes += [(f"{x}experts.{e}.{name}.weight", dims[name])
               for e in range(num_experts(cfg)) for name in expert_projs(cfg)[1]]
    if shared_expert(cfg):  # Qwen2-MoE, Qwen3.5-MoE: then the shared expert and its sigmoid gate
        Is = cfg["shared_expert_intermediate_size"]
        shapes += [(x + "shared_expert.gate_proj.weight", (Is, C)), (x + "shared_expert.up_proj.weight", (Is, C)),
                   (x + "shared_expert.down_proj.weight", (C, Is)), (x + "shared_expert_gate.weight", (1, C))]
    return shapes


def qwen35_mixer_shapes(cfg, layer):
    """A qwen35 layer's token mixer in state-dict order (name, shape). full_attention
    (Qwen3_5Attention): self_attn.q_proj [H 2D, C] (each head's query and then its gate),
    k_proj, v_proj [Hkv D, C], o_proj [C, H D], q_norm, k_norm [D]; linear_attention
    (Qwen3_5GatedDeltaNet: the module's own parameters before its submodules', these in
    registration order): linear_attn.dt_bias, A_log [Hv], conv1d.weight [2 Kd + Vd, 1, K],
    norm.weight [Dv], out_proj.weight [C, Vd], in_proj_qkv.weight [2 Kd + Vd, C], in_proj_z.weight
    [Vd, C], in_proj_b.weight, in_proj_a.weight [Hv, C] (Kd = linear_num_key_heads *
    linear_key_head_dim, Vd = linear_num_value_heads * linear_value_head_dim, Hv =
    linear_num_value_heads)."""
    C, H, Hkv, D = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    pre = f"model.layers.{layer}.{qwen35_mixer(cfg, layer)}."
    if qwen35_mixer(cfg, layer) == "self_attn":
        return [(pre + "q_proj.weight", (H * 2 * D, C)), (pre + "k_proj.weight", (Hkv * D, C)),
                (pre + "v_proj.weight", (Hkv * D, C)), (pre + "o_proj.weight", (C, H * D)),
                (pre + "q_norm.weight", (D,)), (pre + "k_norm.weight", (D,))]
    Hv, Dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
    Kd, Vd = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"], Hv * Dv
    return [(pre + "dt_bias", (Hv,)), (pre + "A_log", (Hv,)),
            (pre + "conv1d.weight", (2 * Kd + Vd, 1, cfg["linear_conv_kernel_dim"])), (pre + "norm.weight", (Dv,)),
            (pre + "out_proj.weight", (C, Vd)), (pre + "in_proj_qkv.weight", (2 * Kd + Vd, C)),
            (pre + "in_proj_z.weight", (Vd, C)), (pre + "in_proj_b.weight", (Hv, C)), (pre + "in_proj_a.weight", (Hv, C))]


def mla_shapes(cfg):
    """DeepseekV3Attention's modules in state-dict order: (name, out, in (None: an RMSNorm of out),
    bias): q_proj [H D, C] (never biased), or q_a_proj [q_lora_rank, C] (+ bias under
    attention_bias), q_a_layernorm [q_lora_rank], q_b_proj [H D, q_lora_rank]; kv_a_proj_with_mqa
    [kv_lora_rank + dr, C] (+ bias), kv_a_layernorm [kv_lora_rank], kv_b_proj [H (dn + dv),
    kv_lora_rank]; o_proj [C, H dv] (+ bias). D = dn + dr."""
    C, H, ab = cfg["hidden_size"], cfg["num_attention_heads"], cfg["attention_bias"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    if qr is None:
        q = [("q_proj", H * (dn + dr), C, False)]
    else:
        q = [("q_a_proj", qr, C, ab), ("q_a_layernorm", qr, None, False), ("q_b_proj", H * (dn + dr), qr, False)]
    return q + [("kv_a_proj_with_mqa", kvr + dr, C, ab), ("kv_a_layernorm", kvr, None, False),
                ("kv_b_proj", H * (dn + dv), kvr, False), ("o_proj", C, H * dv, ab)]


def draw(cfg, name, shape, gen):
    """One float32 tensor, each value a multiple of 1e-3 (printed exactly by fmt_param): N(0, 0.3)
    (RMSNorm weights 1 + N(0, 0.3); Gemma's and Qwen3.5's N(0, 0.3) offsets from 1, Qwen3.5's gated
    linear_attn.norm 1 + N(0, 0.3)); GPT-OSS's sinks N(0, GPTOSS_SINK_STD), gate_up_proj_bias
    N(0, GPTOSS_GATE_UP_BIAS_STD); Qwen3.5's A_log and dt_bias U(-1, 1) (QWEN35_GATE_RANGE)."""
    std = 0.3
    if gptoss(cfg) and name.endswith(".sinks"):
        std = GPTOSS_SINK_STD
    if gptoss(cfg) and name.endswith(".gate_up_proj_bias"):
        std = GPTOSS_GATE_UP_BIAS_STD
    if qwen35(cfg) and (name.endswith(".A_log") or name.endswith(".dt_bias")):  # U(-1, 1)
        x = (torch.rand(*shape, generator=gen, dtype=torch.float32) * 2 - 1) * QWEN35_GATE_RANGE
    else:
        x = torch.randn(*shape, generator=gen, dtype=torch.float32) * std
    # Gemma's and Qwen3.5's are offsets from 1 (Qwen3.5's gated linear_attn.norm excepted: a plain weight)
    if name.endswith("norm.weight") and not (gemma(cfg) or (qwen35(cfg) and not name.endswith(".linear_attn.norm.weight"))):
        x = 1.0 + x
    return (torch.round(x.to(torch.float64) * 1000.0) / 1000.0 + 0.0).to(torch.float32)


def make_params(cfg, gen, bias_gen=None):
    """float32 values, each a multiple of 1e-3 (printed exactly by fmt_param); GLM-4.5's
    e_score_correction_bias drawn from bias_gen instead (draw_bias)."""
    return {name: draw_bias(shape, bias_gen) if name.endswith(".e_score_correction_bias")
            else draw(cfg, name, shape, gen) for name, shape in param_shapes(cfg)}


def draw_bias(shape, gen):
    """A GLM-4.5 router's e_score_correction_bias: N(0, GLM_BIAS_STD), a multiple of 1e-3."""
    x = torch.randn(*shape, generator=gen, dtype=torch.float32) * GLM_BIAS_STD
    return (torch.round(x.to(torch.float64) * 1000.0) / 1000.0 + 0.0).to(torch.float32)


def seed_name(variant):
    """The name a variant's draws are seeded by: its own, less the _aux flag (an _aux variant
    shares its twin's weights, tokens and targets)."""
    return "_".join(w for w in variant.split("_") if w != "aux")


def make_case(variant):
    """(config, float32 params, tokens [B, T], targets [B, T]) of a variant, seeded by its name
    (seed_name). MoE variants: the router weights re-drawn until the routing is unambiguous
    (ROUTE_MARGIN); GPT-OSS's router weights and biases, and then its gate_up_proj_bias until the
    clamps are exercised and unambiguous (clamps_ok), each re-draw re-checking both. GLM-4.5: the e_score_correction_bias drawn from crc32("<variant>/bias")
    (the other draws as without it). Qwen3.5: the linear_attn parameters re-drawn from
    crc32("<variant>/linear<n>") until perturbation_sensitivity <= QWEN35_SENSITIVITY. Qwen3.5-MoE:
    both re-draws (the routers' and the linear_attn parameters') until both hold at once."""
    cfg = hf_config(variant)
    seed = seed_name(variant)
    gen = torch.Generator().manual_seed(zlib.crc32(seed.encode()))
    bias_gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/bias".encode())) if deepseek_moe(cfg) else None
    params = make_params(cfg, gen, bias_gen)
    tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen)
    if gemma(cfg):  # the padding row is looked up (and gets no gradient from it)
        tokens[0, 2] = tokens[1, 4] = cfg["pad_token_id"]
    if qwen35moe(cfg):  # both: the routing (ROUTE_MARGIN) and float32's conditioning (QWEN35_SENSITIVITY)
        router_attempt, linear_attempt = 0, 0
        while True:  # (each re-draw re-checks both: the linear layers feed the routers, the routers the gradients)
            if not routing_ok(cfg, params, tokens):
                router_attempt += 1
                assert router_attempt <= 100, variant
                redraw = torch.Generator().manual_seed(zlib.crc32(f"{seed}/router{router_attempt}".encode()))
                for name, shape in param_shapes(cfg):
                    if name.endswith(".gate.weight"):
                        params[name] = draw(cfg, name, shape, redraw)
                continue
            if perturbation_sensitivity(cfg, params, tokens, targets) > QWEN35_SENSITIVITY:
                linear_attempt += 1
                assert linear_attempt <= 200 and any(".linear_attn." in n for n in params), variant
                redraw = torch.Generator().manual_seed(zlib.crc32(f"{seed}/linear{linear_attempt}".encode()))
                for name, shape in param_shapes(cfg):
                    if ".linear_attn." in name:
                        params[name] = draw(cfg, name, shape, redraw)
                continue
            break
        ROUTER_REDRAWS[variant], LINEAR_REDRAWS[variant] = router_attempt, linear_attempt
        return cfg, params, tokens, targets
    if qwen35(cfg):  # well-conditioned for float32 (QWEN35_SENSITIVITY)
        attempt = 0
        while perturbation_sensitivity(cfg, params, tokens, targets) > QWEN35_SENSITIVITY:
            attempt += 1
            assert attempt <= 200 and any(".linear_attn." in n for n in params), variant
            redraw = torch.Generator().manual_seed(zlib.crc32(f"{seed}/linear{attempt}".encode()))
            for name, shape in param_shapes(cfg):
                if ".linear_attn." in name:
                    params[name] = draw(cfg, name, shape, redraw)
        LINEAR_REDRAWS[variant] = attempt
    if moe(cfg):
        attempt, clamp_attempt = 0, 0
        while True:
            if not routing_ok(cfg, params, tokens):
                attempt += 1
                assert attempt <= 100, variant
                redraw = torch.Generator().manual_seed(zlib.crc32(f"{seed}/router{attempt}".encode()))
                for name, shape in param_shapes(cfg):
                    if name.endswith(".gate.weight") or name.endswith(".router.weight") or name.endswith(".router.bias"):
                        params[name] = draw(cfg, name, shape, redraw)
                continue
            if gptoss(cfg) and not clamps_ok(gptoss_clamps(cfg, params, tokens)):
                clamp_attempt += 1
                assert clamp_attempt <= 100, variant
                redraw = torch.Generator().manual_seed(zlib.crc32(f"{seed}/experts{clamp_attempt}".encode()))
                for name, shape in param_shapes(cfg):
                    if name.endswith(".gate_up_proj_bias"):
                        params[name] = draw(cfg, name, shape, redraw)
                continue
            break
        assert routing_ok(cfg, params, tokens), variant
        ROUTER_REDRAWS[variant] = attempt
        if gptoss(cfg):
            CLAMP_REDRAWS[variant] = clamp_attempt
    return cfg, params, tokens, targets


def perturbation_sensitivity(cfg, params32, tokens, targets):
    """How far float32-sized perturbations move the gradients, in float64: the largest ||grad(p (1 +
    QWEN35_PERTURBATION xi)) - grad(p)|| / (1e-5 ||grad(p)|| + 1e-6) over the parameter tensors and
    two draws of xi ~ N(0, 1) (seeds crc32("perturb0"), crc32("perturb1")), tests/test_llama.cpp's
    per-tensor bound as the unit."""
    base, _, _ = run(cfg, params32, tokens, targets)
    worst = 0.0
    for s in range(2):
        gen = torch.Generator().manual_seed(zlib.crc32(f"perturb{s}".encode()))
        moved = {n: t.to(torch.float64) * (1 + QWEN35_PERTURBATION * torch.randn(t.shape, generator=gen, dtype=torch.float64))
                 for n, t in params32.items()}
        other, _, _ = run(cfg, moved, tokens, targets)
        worst = max(worst, max(float((other[n].grad - base[n].grad).norm()) / (1e-5 * float(base[n].grad.norm()) + 1e-6)
                               for n in base))
    return worst


def router_probs(cfg, params32, tokens):
    """Each sparse layer's router softmax [B*T, E] of the float64 forward (its routing)."""
    probe = []
    with torch.no_grad():
        forward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, probe)
    return probe


def routing_margin(cfg, probs):
    """(the smallest relative gap p_j - p_j+1 over p_j, j = 1..K, of the sorted probabilities of
    any token of any layer; whether every layer chose every expert)."""
    K, E = cfg["num_experts_per_tok"], num_experts(cfg)
    margin, covered = float("inf"), True
    for pr in probs:
        top = pr.sort(-1, descending=True).values
        for j in range(min(K, E - 1)):
            margin = min(margin, float(((top[:, j] - top[:, j + 1]) / top[:, j]).min()))
        covered = covered and set(torch.topk(pr, K, dim=-1).indices.flatten().tolist()) == set(range(E))
    return margin, covered


def gptoss_clamps(cfg, params32, tokens):
    """GPT-OSS's routed expert pre-activations of the float64 forward, per layer: {"gate_high",
    "up_high", "up_low": the counts of routed gate values > limit, up values > limit, up values <
    -limit, one per layer; "gap": the smallest distance of a routed pre-activation to a kink
    (gate's +limit, up's +-limit); "pairs": the (token, expert) pairs per layer}. Gate / up
    interleaved (or chunked under GPTOSS_CHUNKED, as gptoss_glu)."""
    acts = []
    with torch.no_grad():
        forward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, acts=acts)
    L, lim = cfg["num_hidden_layers"], GPTOSS_LIMIT
    out = {"gate_high": [0] * L, "up_high": [0] * L, "up_low": [0] * L, "gap": float("inf"), "pairs": [0] * L}
    for l, gu in acts:
        gate, up = gate_up_split(gu)
        out["gate_high"][l] += int((gate > lim).sum())
        out["up_high"][l] += int((up > lim).sum())
        out["up_low"][l] += int((up < -lim).sum())
        out["pairs"][l] += gu.shape[0]
        out["gap"] = min(out["gap"], float((gate - lim).abs().min()), float((up.abs() - lim).abs().min()))
    return out


def clamps_ok(c):
    return c["gap"] >= GPTOSS_KINK_GAP and min(c["gate_high"] + c["up_high"] + c["up_low"]) >= GPTOSS_MIN_CLAMPED


def routing_ok(cfg, params32, tokens):
    if deepseek_moe(cfg):
        r = glm_routing(cfg, params32, tokens)
        return (r["margin"] >= ROUTE_MARGIN and r["group_margin"] >= ROUTE_MARGIN and r["covered"]
                and r["same"] and r["bias_moves"] > 0)
    margin, covered = routing_margin(cfg, router_probs(cfg, params32, tokens))
    return margin >= ROUTE_MARGIN and covered


def glm_route(logits, bias, cfg):
    """GLM-4.5's (DeepseekV3's) routing of router logits [N, E] with e_score_correction_bias [E],
    in the logits' dtype: (s = sigmoid(logits), the group scores [N, n_group], the masked choice
    scores [N, E], the K chosen experts [N, K] (torch.topk, descending), their weights [N, K]).
    c = s + bias; a group's score the sum of its two largest c; the topk_group best groups kept,
    every other group's c set to 0.0; the K largest masked c chosen; the weights the chosen s
    (not c), / (their sum + 1e-20) when norm_topk_prob, times routed_scaling_factor."""
    N, E = logits.shape
    G, K = cfg["n_group"], cfg["num_experts_per_tok"]
    s = torch.sigmoid(logits)
    c = s + bias
    groups = c.view(N, G, E // G).topk(2, dim=-1).values.sum(-1)
    kept = torch.zeros(N, G, dtype=torch.bool).scatter(1, torch.topk(groups, cfg["topk_group"], dim=-1).indices, True)
    masked = c.masked_fill(~kept.repeat_interleave(E // G, dim=1), 0.0)
    idx = torch.topk(masked, K, dim=-1).indices
    w = s.gather(1, idx)
    if cfg["norm_topk_prob"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return s, groups, masked, idx, w * cfg["routed_scaling_factor"]


def glm_routing(cfg, params32, tokens):
    """GLM-4.5's routing recomputed in float32 from each sparse layer's router logits (of the
    float64 forward, rounded to float32: HF's router GEMM is float32) and the float32 bias:
    margin, the smallest relative gap (c_j - c_j+1) / |c_j|, j = 1..K, of the sorted masked
    choice scores (0 for a tie); group_margin, that of the topk_group-th and the next sorted group
    score (inf with one group); covered, whether every layer chose every expert; same, whether the
    float32 choices are the float64 forward's; bias_moves, the tokens (of all layers) whose chosen
    set differs with a zero bias; groups_move, those whose chosen set differs with every group
    kept."""
    K, E, G, TG = cfg["num_experts_per_tok"], num_experts(cfg), cfg["n_group"], cfg["topk_group"]
    probe, routers = [], []
    with torch.no_grad():
        forward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, probe, routers)
    out = {"margin": float("inf"), "group_margin": float("inf"), "covered": True, "same": True,
           "bias_moves": 0, "groups_move": 0}
    layers = [l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l)]

    def rel_gap(top, j):  # (top[:, j] - top[:, j + 1]) / |top[:, j]| of each row, 0 where not > 0
        gap = top[:, j] - top[:, j + 1]
        return float(torch.where(gap > 0, gap / top[:, j].abs(), torch.zeros_like(gap)).min())

    def chosen_sets(idx):
        return idx.sort(-1).values

    for l, logits, masked64 in zip(layers, routers, probe):
        bias = params32[moe_prefix(cfg, l) + "gate.e_score_correction_bias"]
        _, groups, masked, idx, _ = glm_route(logits.to(torch.float32), bias, cfg)
        top = masked.sort(-1, descending=True).values
        out["margin"] = min([out["margin"]] + [rel_gap(top, j) for j in range(K)])
        if G > 1:
            out["group_margin"] = min(out["group_margin"], rel_gap(groups.sort(-1, descending=True).values, TG - 1))
        out["covered"] = out["covered"] and set(idx.flatten().tolist()) == set(range(E))
        chosen64 = torch.topk(masked64, K, dim=-1).indices
        out["same"] = out["same"] and torch.equal(chosen_sets(idx), chosen_sets(chosen64))
        unbiased = glm_route(logits.to(torch.float32), torch.zeros_like(bias), cfg)[3]
        out["bias_moves"] += int((chosen_sets(unbiased) != chosen_sets(idx)).any(-1).sum())
        ungrouped = glm_route(logits.to(torch.float32), bias, dict(cfg, topk_group=G))[3]
        out["groups_move"] += int((chosen_sets(ungrouped) != chosen_sets(idx)).any(-1).sum())
    return out


# ---- the model (vectorised) ---------------------------------------------------------------------

def llama3_branch(cfg, wavelen):
    """'untouched', 'smoothed' or 'scaled': the llama3 rule for one wavelength."""
    s = cfg["rope_scaling"]
    orig = s["original_max_position_embeddings"]
    low_wl, high_wl = orig / s["low_freq_factor"], orig / s["high_freq_factor"]
    if wavelen > low_wl:
        return "scaled"
    if wavelen < high_wl:
        return "untouched"
    return "smoothed"


def yarn_range(cfg):
    """(low, high): YaRN's correction range in dimensions (modeling_rope_utils'
    find_correction_range), from beta_fast / beta_slow rotations over the original context."""
    s, D, base = cfg["rope_scaling"], head_dim(cfg), cfg["rope_theta"]
    orig = s["original_max_position_embeddings"]

    def dim(rotations):
        return D * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low, high = dim(s.get("beta_fast") or 32), dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, D - 1)
    return low, (high + 0.001 if high == low else high)


def attention_scaling(cfg):
    """The factor HF's rotary embedding multiplies cos and sin by: yarn's attention_factor, else
    get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are set and nonzero
    (DeepSeek's), else 0.1 ln(factor) + 1 (1 for factor <= 1); 1 for every other rope type."""
    s = cfg["rope_scaling"]
    if scaling_type(s) not in ("yarn", "longrope"):
        return 1.0
    if s.get("attention_factor") is not None:
        return s["attention_factor"]
    if scaling_type(s) == "longrope":  # Phi-3's ratio, whichever factor list is used
        orig = cfg["original_max_position_embeddings"]
        ratio = cfg["max_position_embeddings"] / orig
        return 1.0 if ratio <= 1 else math.sqrt(1 + math.log(ratio) / math.log(orig))
    if s.get("mscale") and s.get("mscale_all_dim"):  # DeepSeek's: get_mscale(f, mscale) / get_mscale(f, mscale_all_dim)
        return get_mscale(s["factor"], s["mscale"]) / get_mscale(s["factor"], s["mscale_all_dim"])
    return get_mscale(s["factor"])


def inv_freq(cfg, seq_len=None):
    """RoPE inverse frequencies [rotary_dim / 2], float64, with the configured rescaling: linear
    (/ factor), llama3, yarn or longrope (/ long_factor when seq_len > original, else
    short_factor) (modeling_rope_utils.py)."""
    D = rotary_dim(cfg)
    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    s = cfg["rope_scaling"]
    if s is None or scaling_type(s) == "default":  # (GPT-OSS's rope1e4: {"rope_type": "default"})
        return inv
    if scaling_type(s) == "longrope":
        long = seq_len is not None and seq_len > cfg["original_max_position_embeddings"]
        return inv / torch.tensor(s["long_factor" if long else "short_factor"], dtype=torch.float64)
    if s["rope_type"] == "linear":
        return inv / s["factor"]
    if s["rope_type"] == "yarn":
        low, high = yarn_range(cfg)
        ramp = ((torch.arange(D // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        return inv / s["factor"] * ramp + inv * (1 - ramp)
    assert s["rope_type"] == "llama3"
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    orig = s["original_max_position_embeddings"]
    wavelen = 2.0 * math.pi / inv
    smooth = (orig / wavelen - low) / (high - low)
    smoothed = (1.0 - smooth) * inv / factor + smooth * inv
    scaled = torch.where(wavelen > orig / low, inv / factor, inv)
    medium = (wavelen >= orig / high) & (wavelen <= orig / low)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def gate_up_split(gu):
    """GptOssExperts' gate and up of gate_up [..., 2I]: the even and odd columns (gate_up[..., ::2],
    gate_up[..., 1::2]); under GPTOSS_CHUNKED (--selftest only) the two halves instead."""
    if GPTOSS_CHUNKED:
        return gu.chunk(2, dim=-1)
    return gu[..., 0::2], gu[..., 1::2]


def gptoss_glu(gu):
    """GptOssExperts._apply_gate on gate_up [..., 2I]: gate clamped above at limit, up to
    [-limit, limit]; (up + 1) * gate * sigmoid(alpha * gate)."""
    gate, up = gate_up_split(gu)
    gate = gate.clamp(max=GPTOSS_LIMIT)
    up = up.clamp(min=-GPTOSS_LIMIT, max=GPTOSS_LIMIT)
    return (up + 1) * (gate * torch.sigmoid(gate * GPTOSS_ALPHA))


def gptoss_moe(x, p, cfg, m, probe=None, routers=None, acts=None, layer=None):
    """GptOssMLP on x [N, C] (block prefix m): router logits x router.weight^T + router.bias [N, E];
    the K largest (torch.topk, descending) and their softmax as the weights (= the softmax
    probabilities renormalised over the K); each chosen expert e: gate_up = x gate_up_proj[e] +
    gate_up_proj_bias[e] [2I], gptoss_glu, then down_proj[e] + down_proj_bias[e]; the weighted sum,
    expert by expert over the tokens that chose it (index_add, as HF). probe gets the softmax of
    the logits over the E experts (its topk is the choice), routers the logits (with the bias; the
    aux loss's), acts (layer, gate_up of the tokens routed to e) per expert."""
    logits = x @ p[m + "router.weight"].T + p[m + "router.bias"]  # [N, E]
    if probe is not None:
        probe.append(logits.softmax(-1).detach())
    if routers is not None:
        routers.append(logits)
    top, idx = torch.topk(logits, cfg["num_experts_per_tok"], dim=-1)  # [N, K]
    w = top.softmax(-1)
    out = torch.zeros_like(x)
    ex = m + "experts."
    for e in range(num_experts(cfg)):
        rows, slot = torch.where(idx == e)
        if rows.numel() == 0:
            continue
        gu = x[rows] @ p[ex + "gate_up_proj"][e] + p[ex + "gate_up_proj_bias"][e]
        if acts is not None:
            acts.append((layer, gu.detach()))
        y = gptoss_glu(gu) @ p[ex + "down_proj"][e] + p[ex + "down_proj_bias"][e]
        out = out.index_add(0, rows, y * w[rows, slot, None])
    return out


def sink_attention(q, k, v, sinks, visible, scale):
    """GPT-OSS's eager attention on q [B, H, T, D] and k, v [B, H, T, D] (repeated for GQA): the
    scores q k^T * scale, -inf where not visible [T, T], one more column per row, the head's sink
    logit sinks[h]; the softmax over the row with it; the sink column dropped (rows sum < 1) before
    P @ v."""
    Bn, H, Tn, _ = q.shape
    att = (q @ k.transpose(-1, -2)) * scale
    att = att.masked_fill(~visible, float("-inf"))
    att = torch.cat((att, sinks.view(1, H, 1, 1).expand(Bn, H, Tn, 1)), dim=-1).softmax(-1)[..., :-1]
    return att @ v


def rotate_pairs(x, inv):
    """Llama 4's apply_rotary_emb on x [..., T, D]: each position's D values as D/2 complex numbers
    x[2i] + i x[2i+1] (adjacent pairs), times exp(i t inv[i]) at position t; under
    LLAMA4_ALT["rotate_half"] (--selftest only) Llama's rotate-half layout (pairs (i, i + D/2)) instead."""
    freqs = torch.outer(torch.arange(x.shape[-2], dtype=torch.float64), inv)  # [T, D/2]
    cos, sin = freqs.cos(), freqs.sin()
    if LLAMA4_ALT["rotate_half"]:
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        return x * cos + rotate_half(x) * sin
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)


def l2_norm(x, eps):
    """Llama4TextL2Norm over the last dim: x * rsqrt(mean(x^2) + eps), no weight."""
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)


def temperature_scales(cfg, Tn):
    """Llama 4's NoPE-layer query scales [T]: log(floor((t + 1) / floor_scale) + 1) * attn_scale + 1 at
    position t (Llama4TextAttention's attn_temperature_tuning; log1p as HF)."""
    t = torch.arange(Tn, dtype=torch.float64)
    return torch.log1p(torch.floor((t + 1.0) / cfg["floor_scale"])) * cfg["attn_scale"] + 1.0


def chunk_visible(Tn, chunk):
    """The "chunked_attention" mask [T, T]: key j visible to query i iff j <= i and j // chunk == i //
    chunk (transformers' chunked_overlay and the causal mask, no padding)."""
    pos = torch.arange(Tn)
    return (pos[None, :] <= pos[:, None]) & (pos[None, :] // chunk == pos[:, None] // chunk)


def llama4_qk(q, k, cfg, layer):
    """Llama4TextAttention on q [B, H, T, D] and k [B, Hkv, T, D] before the scores: on a RoPE layer
    (no_rope_layers) adjacent-pair RoPE (rotate_pairs, inv_freq: llama3-scaled when rope_scaling is
    set), then under use_qk_norm the L2 norm of each head (eps rms_norm_eps); on a NoPE layer under
    attn_temperature_tuning q times temperature_scales per position."""
    rope = uses_rope(cfg, layer)
    if rope:
        inv = inv_freq(cfg)
        q, k = rotate_pairs(q, inv), rotate_pairs(k, inv)
    if cfg["use_qk_norm"] and (rope or LLAMA4_ALT["qk_norm_nope"]):
        q, k = l2_norm(q, cfg["rms_norm_eps"]), l2_norm(k, cfg["rms_norm_eps"])
    if cfg["attn_temperature_tuning"] and not rope:
        q = q * temperature_scales(cfg, q.shape[-2])[:, None]
    return q, k


def llama4_gate_up(gu):
    """Llama4TextExperts' gate and up of gate_up [..., 2I]: its first and second halves (chunk(2));
    under LLAMA4_ALT["gate_up_interleaved"] (--selftest only) its even and odd columns."""
    if LLAMA4_ALT["gate_up_interleaved"]:
        return gu[..., 0::2], gu[..., 1::2]
    return gu.chunk(2, dim=-1)


def llama4_moe(x, p, cfg, m, probe=None, routers=None):
    """Llama4TextMoe on x [N, C] (block prefix m, feed_forward.): router logits x router.weight^T [N, E];
    the K largest (torch.topk) and their sigmoids as the scores (HF: -inf scattered elsewhere, so 0 for
    the other experts); each chosen expert e on the scaled input x * score: gate_up = (x * score)
    gate_up_proj[e] [2I], gate / up its two halves, (up * silu(gate)) down_proj[e]; their sum plus the
    shared expert's SwiGLU MLP of x itself (unscaled), expert by expert over the tokens that chose it
    (index_add). Under LLAMA4_ALT["scale_output"] (--selftest only) the score times the expert's
    output instead. probe gets the softmax of the logits over the E experts (its topk is the choice),
    routers the logits."""
    logits = x @ p[m + "router.weight"].T  # [N, E]
    if probe is not None:
        probe.append(logits.softmax(-1).detach())
    if routers is not None:
        routers.append(logits)
    top, idx = torch.topk(logits, cfg["num_experts_per_tok"], dim=-1)  # [N, K]
    score = torch.sigmoid(top)
    out = shared_mlp(x, p, m)
    ex = m + "experts."
    for e in range(num_experts(cfg)):
        rows, slot = torch.where(idx == e)
        if rows.numel() == 0:
            continue
        s = score[rows, slot, None]
        xin = x[rows] if LLAMA4_ALT["scale_output"] else x[rows] * s
        gate, up = llama4_gate_up(xin @ p[ex + "gate_up_proj"][e])
        y = (up * (gate * torch.sigmoid(gate))) @ p[ex + "down_proj"][e]
        out = out.index_add(0, rows, y * s if LLAMA4_ALT["scale_output"] else y)
    return out


def moe_block(h, p, cfg, layer, probe=None, routers=None, acts=None):
    """The sparse MoE block on h [B, T, C] (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock,
    OlmoeSparseMoeBlock, Qwen2MoeSparseMoeBlock, Qwen3_5MoeSparseMoeBlock; Glm4MoeMoE and DeepseekV3MoE: glm_route's sigmoid, bias, groups and
    scaled weights in place of the softmax, plus its shared experts, ungated, and probe gets the
    masked choice scores): router softmax over the E experts, its K largest
    (torch.topk, in descending order) as the weights, divided by their sum when renormalise(cfg);
    each token's output the weighted sum of its K experts' SwiGLU MLPs, computed expert by expert
    over the tokens that chose it (index_add, as HF); Qwen2-MoE (Qwen3.5-MoE) adds to that sum its shared
    expert's SwiGLU MLP of every token times sigmoid(x shared_expert_gate.weight^T), one gate value
    per token. probe: a list that gets the router softmax (detached); routers: a list that gets the
    router logits [B*T, E] (with their graph, for the aux loss)."""
    Bn, Tn, C = h.shape
    if llama4(cfg):  # Llama4TextMoe
        return llama4_moe(h.reshape(Bn * Tn, C), p, cfg, moe_prefix(cfg, layer), probe, routers).view(Bn, Tn, C)
    if gptoss(cfg):  # GptOssMLP
        return gptoss_moe(h.reshape(Bn * Tn, C), p, cfg, moe_prefix(cfg, layer), probe, routers, acts,
                          layer).view(Bn, Tn, C)
    m, (gate, up, down) = moe_prefix(cfg, layer), expert_projs(cfg)[0]
    x = h.reshape(Bn * Tn, C)
    logits = x @ p[m + "gate.weight"].T  # [N, E]
    if deepseek_moe(cfg):  # GLM-4.5, DeepSeek-V3: sigmoid, the bias (selection only), groups, routed_scaling_factor
        _, _, masked, idx, w = glm_route(logits, p[m + "gate.e_score_correction_bias"].detach(), cfg)
        probs = masked  # (probe: the masked choice scores, whose topk is the choice)
    else:
        probs = logits.softmax(-1)
    if probe is not None:
        probe.append(probs.detach())
    if routers is not None:
        routers.append(logits)
    if not deepseek_moe(cfg):
        w, idx = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)  # [N, K]
    if renormalise(cfg) and not deepseek_moe(cfg):
        w = w / w.sum(-1, keepdim=True)
    if deepseek_v2(cfg):  # DeepseekV2Moe's greedy top-K: the softmax values times routed_scaling_factor
        w = w * cfg["routed_scaling_factor"]
    out = torch.zeros_like(x)
    for e in range(num_experts(cfg)):
        rows, slot = torch.where(idx == e)  # the tokens that chose e, and in which of the K places
        if rows.numel() == 0:
            continue
        ex, xe = f"{m}experts.{e}.", x[rows]
        g = xe @ p[ex + gate + ".weight"].T
        y = (g * torch.sigmoid(g) * (xe @ p[ex + up + ".weight"].T)) @ p[ex + down + ".weight"].T
        out = out.index_add(0, rows, y * w[rows, slot, None])
    if shared_expert(cfg):  # routed sum + sigmoid(gate logit [N, 1]) * shared_expert(x)
        s = m + "shared_expert."
        g = x @ p[s + "gate_proj.weight"].T
        y = (g * torch.sigmoid(g) * (x @ p[s + "up_proj.weight"].T)) @ p[s + "down_proj.weight"].T
        out = out + torch.sigmoid(x @ p[m + "shared_expert_gate.weight"].T) * y
    if deepseek_moe(cfg) or deepseek_v2(cfg):  # + the shared experts, ungated and unscaled
        out = out + shared_mlp(x, p, m, "shared_experts.")
    return out.view(Bn, Tn, C)


def mla_attention(h, p, cfg, a, cos, sin, causal):
    """DeepseekV3Attention (Multi-head Latent Attention) on h [B, T, C] (the input_layernorm
    output), eval: y [B, T, H dv] before o_proj. q = q_proj(h), or q_b_proj(q_a_layernorm(q_a_proj(h)))
    (the lora norm's eps LORA_EPS), each head's D = dn + dr columns [q_nope | q_rot]; ckv =
    kv_a_proj_with_mqa(h) = [c (kv_lora_rank) | k_rot (dr, one for every head)]; kv_b_proj(
    kv_a_layernorm(c)), each head's dn + dv columns [k_nope | v]. RoPE (cos / sin [T, dr]) on q_rot
    and k_rot: rotate-half, after de-interleaving the dr columns ([x0, x2, ..., x1, x3, ...]) under
    rope_interleave; key [k_nope | k_rot], query [q_nope | q_rot]; causal softmax of q.k times
    mla_scale (D^-1/2, times mscale^2 under yarn with mscale_all_dim); P @ v per head."""
    Bn, Tn, _ = h.shape
    H, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    kvr, ab = cfg["kv_lora_rank"], cfg["attention_bias"]
    assert cfg["num_key_value_heads"] == H, "MLA: num_key_value_heads must be num_attention_heads"

    def linear(x, name, bias):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    if cfg["q_lora_rank"] is None:
        q = linear(h, a + "q_proj", False)
    else:
        q = linear(h, a + "q_a_proj", ab)
        q = linear(rms_norm(q, p[a + "q_a_layernorm.weight"], LORA_EPS), a + "q_b_proj", False)
    q = q.view(Bn, Tn, H, dn + dr).transpose(1, 2)  # [B, H, T, D]
    q_nope, q_rot = q[..., :dn], q[..., dn:]
    ckv = linear(h, a + "kv_a_proj_with_mqa", ab)
    c, k_rot = ckv[..., :kvr], ckv[..., kvr:].unsqueeze(1)  # [B, T, kvr], [B, 1, T, dr]
    kv = linear(rms_norm(c, p[a + "kv_a_layernorm.weight"], LORA_EPS), a + "kv_b_proj", False)
    kv = kv.view(Bn, Tn, H, dn + dv).transpose(1, 2)  # [B, H, T, dn + dv]
    k_nope, v = kv[..., :dn], kv[..., dn:]
    if rope_interleaved(cfg):  # pairs (2i, 2i+1) -> (i, i + dr/2)
        q_rot = torch.cat((q_rot[..., 0::2], q_rot[..., 1::2]), dim=-1)
        k_rot = torch.cat((k_rot[..., 0::2], k_rot[..., 1::2]), dim=-1)
    q_rot = q_rot * cos + rotate_half(q_rot) * sin
    k_rot = (k_rot * cos + rotate_half(k_rot) * sin).expand(Bn, H, Tn, dr)
    q, k = torch.cat((q_nope, q_rot), dim=-1), torch.cat((k_nope, k_rot), dim=-1)
    att = (q @ k.transpose(-1, -2)) * mla_scale(cfg)
    att = att.masked_fill(~causal, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(Bn, Tn, H * dv)


def gated_attention(h, p, cfg, a, cos, sin, causal):
    """Qwen3_5Attention (Qwen3NextAttention) on h [B, T, C] (the input_layernorm output), eval: its
    o_proj output [B, T, C]. q_proj(h) viewed [B, T, H, 2D], chunked in two along the last dim: each
    head's first D columns its query, the next D its gate (gate reshaped [B, T, H D]); query and key
    (k_proj(h) [B, T, Hkv, D]) through the per-head q_norm / k_norm (1 + w); RoPE (cos / sin [T, R])
    rotate-half on each head's first R = rotary_dim columns, the rest passed through; causal GQA
    softmax of q.k times D^-1/2; the heads' P @ v [B, T, H D] times sigmoid(gate); o_proj. No
    biases (attention_bias false)."""
    Bn, Tn, _ = h.shape
    H, Hkv, D, eps = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg), cfg["rms_norm_eps"]
    R, cos, sin = cos.shape[-1], cos.to(h.dtype), sin.to(h.dtype)  # (h float32: --selftest's float32 run)
    assert not cfg.get("attention_bias", False), "qwen35: attention_bias"
    qg = (h @ p[a + "q_proj.weight"].T).view(Bn, Tn, H, 2 * D)
    q, gate = torch.chunk(qg, 2, dim=-1)
    gate = gate.reshape(Bn, Tn, H * D)
    q = rms_norm(q, 1.0 + p[a + "q_norm.weight"], eps).transpose(1, 2)  # [B, H, T, D]
    k = rms_norm((h @ p[a + "k_proj.weight"].T).view(Bn, Tn, Hkv, D), 1.0 + p[a + "k_norm.weight"], eps).transpose(1, 2)
    v = (h @ p[a + "v_proj.weight"].T).view(Bn, Tn, Hkv, D).transpose(1, 2)

    def rotate(x):  # the first R columns rotated, the rest kept (apply_rotary_pos_emb's q_pass / k_pass)
        r, rest = x[..., :R], x[..., R:]
        return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)

    q, k = rotate(q), rotate(k)
    k = k.repeat_interleave(H // Hkv, dim=1)
    v = v.repeat_interleave(H // Hkv, dim=1)
    att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    att = att.masked_fill(~causal, float("-inf")).softmax(-1)
    y = (att @ v).transpose(1, 2).reshape(Bn, Tn, H * D)
    return (y * torch.sigmoid(gate)) @ p[a + "o_proj.weight"].T


def causal_conv_silu(x, w):
    """The Gated DeltaNet's short convolution on x [B, T, N] (torch_causal_conv1d_fn, no bias, hidden_act
    silu): the depthwise nn.Conv1d of weight w [N, 1, K] with K - 1 zeros of padding on each side, the
    first T outputs kept, then silu: out[t, c] = silu(sum_j w[c, 0, j] x[t - K + 1 + j, c]), the x before
    t = 0 zero."""
    Tn, K = x.shape[1], w.shape[-1]
    y = torch.nn.functional.conv1d(x.transpose(1, 2), w, padding=K - 1, groups=x.shape[-1])[..., :Tn]
    return torch.nn.functional.silu(y).transpose(1, 2)


def qk_l2norm(x, eps=QWEN35_QK_L2_EPS):
    """The gated delta rule's l2norm over the last dim (FLA's): x * rsqrt(sum(x^2) + eps)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def gated_delta_rule(q, k, v, g, beta):
    """The gated delta rule, token by token (torch_recurrent_gated_delta_rule with
    use_qk_l2norm_in_kernel): q, k [B, T, Hv, Dk] (already repeated to the value heads), v [B, T, Hv,
    Dv], g (log decays, <= 0) and beta [B, T, Hv]. q and k l2-normalised (qk_l2norm), q times
    Dk^-1/2; per (batch, head) from S = 0 [Dk, Dv]: S = S exp(g_t); kv_mem = S^T k_t; delta = (v_t -
    kv_mem) beta_t; S = S + k_t delta^T; o_t = S^T q_t. Returns o [B, T, Hv, Dv]."""
    q, k = qk_l2norm(q) / math.sqrt(q.shape[-1]), qk_l2norm(k)
    Bn, Tn, Hv, Dk = k.shape
    S = torch.zeros(Bn, Hv, Dk, v.shape[-1], dtype=v.dtype)
    out = []
    for t in range(Tn):
        S = S * torch.exp(g[:, t])[..., None, None]
        kv_mem = (S * k[:, t, :, :, None]).sum(-2)  # [B, Hv, Dv]
        delta = (v[:, t] - kv_mem) * beta[:, t, :, None]
        S = S + k[:, t, :, :, None] * delta[:, :, None, :]
        out.append((S * q[:, t, :, :, None]).sum(-2))
    return torch.stack(out, dim=1)


def gated_deltanet(h, p, cfg, a, acts=None):
    """Qwen3_5GatedDeltaNet on h [B, T, C] (the input_layernorm output), no cache, eval: its
    out_proj output [B, T, C]. mixed = causal_conv_silu(in_proj_qkv(h), conv1d.weight) [B, T, 2 Kd +
    Vd], split into q [B, T, Hk, Dk] (its first Kd columns), k (the next Kd), v [B, T, Hv, Dv] (the
    last Vd); z = in_proj_z(h) [B, T, Hv, Dv]; beta = sigmoid(in_proj_b(h)); g = -exp(A_log)
    softplus(in_proj_a(h) + dt_bias) [B, T, Hv]; q and k repeat_interleave'd Hv / Hk times over the
    heads (value head j reads key head j // (Hv / Hk)); o = gated_delta_rule; per token and value
    head Qwen3_5RMSNormGated: rms_norm(o, norm.weight, rms_norm_eps) (plain weight, not 1 + w) times
    silu(z); reshaped [B, T, Vd]; out_proj. acts: a list that gets o (detached) [B, T, Hv, Dv]."""
    Bn, Tn, _ = h.shape
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    Kd = Hk * Dk
    mixed = causal_conv_silu(h @ p[a + "in_proj_qkv.weight"].T, p[a + "conv1d.weight"])
    q = mixed[..., :Kd].reshape(Bn, Tn, Hk, Dk).repeat_interleave(Hv // Hk, dim=2)
    k = mixed[..., Kd:2 * Kd].reshape(Bn, Tn, Hk, Dk).repeat_interleave(Hv // Hk, dim=2)
    v = mixed[..., 2 * Kd:].reshape(Bn, Tn, Hv, Dv)
    z = (h @ p[a + "in_proj_z.weight"].T).reshape(Bn, Tn, Hv, Dv)
    beta = torch.sigmoid(h @ p[a + "in_proj_b.weight"].T)
    g = -torch.exp(p[a + "A_log"]) * torch.nn.functional.softplus(h @ p[a + "in_proj_a.weight"].T + p[a + "dt_bias"])
    o = gated_delta_rule(q, k, v, g, beta)
    if acts is not None:
        acts.append(o.detach())
    o = rms_norm(o, p[a + "norm.weight"], cfg["rms_norm_eps"]) * torch.nn.functional.silu(z)
    return o.reshape(Bn, Tn, Hv * Dv) @ p[a + "out_proj.weight"].T


def forward(p, cfg, tokens, probe=None, routers=None, acts=None):
    """Logits [B, T, V] of LlamaForCausalLM (eval: no dropout), float64. probe: a list that gets
    each sparse MoE layer's router softmax [B*T, E]; routers: one that gets its router logits;
    acts: one that gets GPT-OSS's routed expert pre-activations (gptoss_moe)."""
    p = unfused(p, cfg)
    Bn, Tn = tokens.shape
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps = cfg["rms_norm_eps"]

    def linear(x, name, bias):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    def norm(x, name):
        return rms_norm(x, norm_weight(cfg, p[name + ".weight"]), eps)

    def cos_sin(rc):
        freqs = torch.outer(torch.arange(Tn, dtype=torch.float64), inv_freq(rc, Tn))
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, R]
        return emb.cos() * attention_scaling(rc), emb.sin() * attention_scaling(rc)

    R = rotary_dim(cfg)

    def rotate(x, cos, sin):  # Phi3's apply_rotary_pos_emb: the first R columns, the rest kept
        r, rest = x[..., :R], x[..., R:]
        return torch.cat((r * cos + rotate_half(r) * sin, rest), dim=-1)

    causal = torch.tril(torch.ones(Tn, Tn, dtype=torch.bool))
    # nn.Embedding's padding_idx: no gradient into that row from the lookup
    x = torch.nn.functional.embedding(tokens, p["model.embed_tokens.weight"], padding_idx=pad_token(cfg))
    x = x * embed_scale(cfg)
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        a, ab = pre + "self_attn.", qkv_bias(cfg)
        cos, sin = cos_sin(rope_cfg(cfg, l))
        h = x if post_norms(cfg) else norm(x, pre + "input_layernorm")
        if qwen35(cfg):  # the layer's token mixer, then Llama's MLP (no biases; Qwen3.5-MoE: the sparse block)
            if qwen35_mixer(cfg, l) == "linear_attn":
                x = x + gated_deltanet(h, p, cfg, pre + "linear_attn.", acts)
            else:
                x = x + gated_attention(h, p, cfg, a, cos, sin, causal)
            h = norm(x, pre + "post_attention_layernorm")
            if sparse_layer(cfg, l):  # Qwen3_5MoeSparseMoeBlock
                x = x + moe_block(h, p, cfg, l, probe, routers)
                continue
            g = linear(h, pre + "mlp.gate_proj", False)
            x = x + linear(g * torch.sigmoid(g) * linear(h, pre + "mlp.up_proj", False), pre + "mlp.down_proj", False)
            continue
        if mla(cfg):  # DeepSeek-V3's Multi-head Latent Attention: y [B, T, H dv]
            y = mla_attention(h, p, cfg, a, cos, sin, causal)
        else:
            q, k = linear(h, a + "q_proj", ab), linear(h, a + "k_proj", ab)
            if olmo2(cfg):  # over the whole projection, before the split into heads
                q, k = norm(q, a + "q_norm"), norm(k, a + "k_norm")
            q, k = q.view(Bn, Tn, H, D), k.view(Bn, Tn, Hkv, D)
            if qk_norm(cfg):  # over each head's D values, before RoPE
                q, k = norm(q, a + "q_norm"), norm(k, a + "k_norm")
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # [B, H, T, D], [B, Hkv, T, D]
            v = linear(h, a + "v_proj", ab).view(Bn, Tn, Hkv, D).transpose(1, 2)
            if llama4(cfg):  # adjacent-pair RoPE, the L2 norm, the NoPE layers' temperature
                q, k = llama4_qk(q, k, cfg, l)
            elif uses_rope(cfg, l):  # not on SmolLM3's NoPE layers
                q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
            visible = causal
            if layer_window(cfg, l):
                visible = causal & ~torch.tril(torch.ones(Tn, Tn, dtype=torch.bool), -layer_window(cfg, l))
            if chunked_layer(cfg, l):  # Llama 4's chunked_attention layers
                visible = chunk_visible(Tn, cfg["attention_chunk_size"])
            if gptoss(cfg):  # the attention sinks
                y = sink_attention(q, k, v, p[a + "sinks"], visible, D ** -0.5).transpose(1, 2).reshape(Bn, Tn, H * D)
                x = x + linear(y, a + "o_proj", o_bias(cfg))
                x = x + moe_block(norm(x, pre + "post_attention_layernorm"), p, cfg, l, probe, routers, acts)
                continue
            att = q @ k.transpose(-1, -2)
            att = att * score_scale(cfg) if gemma2_layer(cfg) or granite(cfg) else att / math.sqrt(D)
            if softcaps(cfg)[0]:  # Gemma 2: before the mask
                att = softcaps(cfg)[0] * torch.tanh(att / softcaps(cfg)[0])
            att = att.masked_fill(~visible, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(Bn, Tn, H * D)
        m, mb = pre + ("feed_forward." if llama4(cfg) else "mlp."), mlp_bias(cfg)
        if gemma2_layer(cfg):  # sandwich norms, GeGLU
            x = x + norm(linear(y, a + "o_proj", o_bias(cfg)), pre + "post_attention_layernorm")
            h = norm(x, pre + "pre_feedforward_layernorm")
            mlp = linear(gelu_tanh(linear(h, m + "gate_proj", mb)) * linear(h, m + "up_proj", mb), m + "down_proj", mb)
            x = x + norm(mlp, pre + "post_feedforward_layernorm")
            continue
        if post_norms(cfg):
            x = x + norm(linear(y, a + "o_proj", o_bias(cfg)), pre + "post_attention_layernorm")
            g = linear(x, m + "gate_proj", mb)
            mlp = linear(g * torch.sigmoid(g) * linear(x, m + "up_proj", mb), m + "down_proj", mb)
            x = x + norm(mlp, pre + "post_feedforward_layernorm")
            continue
        rm = cfg["residual_multiplier"] if granite(cfg) else 1.0
        x = x + linear(y, a + "o_proj", o_bias(cfg)) * rm
        h = norm(x, pre + "post_attention_layernorm")
        if sparse_layer(cfg, l):  # Qwen3-MoE, Mixtral, OLMoE: the MoE block in place of the MLP
            x = x + moe_block(h, p, cfg, l, probe, routers)
            continue
        g = linear(h, m + "gate_proj", mb)
        act = gelu_tanh(g) if gemma(cfg) else g * torch.sigmoid(g)  # Gemma 1: GeGLU
        x = x + linear(act * linear(h, m + "up_proj", mb), m + "down_proj", mb) * rm
    x = norm(x, "model.norm")
    head = p["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    logits = x @ head.T
    if softcaps(cfg)[1]:  # Gemma 2: logits / cap, tanh, * cap
        logits = softcaps(cfg)[1] * torch.tanh(logits / softcaps(cfg)[1])
    return logits / cfg["logits_scaling"] if granite(cfg) else logits


def mean_ce(logits, targets):
    V = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))


def load_balancing_loss(router_logits, E, K):
    """The auxiliary load-balancing loss of the MoE classes (transformers' load_balancing_loss_func
    with no attention_mask, the Switch Transformer's): the sparse layers' router logits [B*T, E]
    stacked into [L*B*T, E]; p = their softmax over the E experts (the raw router softmax, not the
    renormalised top-K weights); the one-hot [L*B*T, K, E] of each token's K largest (torch.topk);
    E * sum over slots and experts of (the fraction of tokens whose slot k chose e) * (the mean
    of p_e over the tokens). The selection carries no gradient: only the mean p does."""
    probs = torch.cat(list(router_logits), dim=0).softmax(-1)  # [L*B*T, E]
    chosen = torch.topk(probs, K, dim=-1).indices
    return balance(probs, chosen, E)


def balance(probs, chosen, E):
    """The load-balancing loss of router probabilities [N, E] and each token's K chosen experts
    [N, K]: E * sum_{k, e} mean_n(chosen[n, k] == e) * mean_n(probs[n, e]). (K when either the
    mean probabilities or the choices are uniform over the experts.)"""
    picked = torch.nn.functional.one_hot(chosen, E).to(probs.dtype)  # [N, K, E], no gradient
    return E * (picked.mean(0) * probs.mean(0)[None, :]).sum()


def aux_on(cfg):  # output_router_logits: the loss adds router_aux_loss_coef * the aux loss
    return moe(cfg) and not llama4(cfg) and bool(cfg.get("output_router_logits", False))  # (Llama 4: never)


def model_loss(p, cfg, tokens, targets, probe=None, aux=None):
    """(logits, the loss HF's *ForCausalLM returns): the mean cross-entropy, plus
    router_aux_loss_coef times load_balancing_loss of every sparse layer's router logits under
    output_router_logits. aux: a list that gets that aux loss (detached), if on."""
    routers = [] if aux_on(cfg) else None
    logits = forward(p, cfg, tokens, probe, routers)
    loss = mean_ce(logits, targets)
    if routers is not None:
        lb = load_balancing_loss(routers, num_experts(cfg), cfg["num_experts_per_tok"])
        loss = loss + cfg["router_aux_loss_coef"] * lb
        if aux is not None:
            aux.append(lb.detach())
    return logits, loss


def run(cfg, params32, tokens, targets):
    """(float64 params with .grad, logits, loss) of one forward/backward (the loss of model_loss)."""
    params = {n: t.to(torch.float64).requires_grad_(True) for n, t in params32.items()}
    logits, loss = model_loss(params, cfg, tokens, targets)
    loss.backward()
    zero_unused_grads(params)
    return params, logits.detach(), loss.detach()


def zero_unused_grads(params):
    """A gradient of zeros for each tensor the loss does not reach (GLM-4.5's
    e_score_correction_bias: a buffer used only to choose the experts)."""
    for t in params.values():
        if t.grad is None:
            t.grad = torch.zeros_like(t)


# ---- the fixture text ---------------------------------------------------------------------------

def fmt(values, digits):
    return " ".join(f"{v:.{digits}e}" for v in values)


def fmt_param(values):
    """Multiples of 1e-3 as their short decimal, which parses (strtof) back to the same float32."""
    out = []
    for v in values:
        s = f"{round(v, 3):g}"
        assert torch.tensor(float(s), dtype=torch.float32).item() == v, (v, s)
        out.append(s)
    return " ".join(out)


def fixture_text(variant):
    cfg, params32, tokens, targets = make_case(variant)
    params, logits, loss = run(cfg, params32, tokens, targets)
    lines = ["config " + json.dumps(cfg, separators=(",", ":")),
             f"batch {B} {T}",
             "tokens " + " ".join(str(int(t)) for t in tokens.flatten()),
             "targets " + " ".join(str(int(t)) for t in targets.flatten()),
             f"loss {loss.item():.17e}",
             "logits " + fmt(logits.flatten().tolist(), 17)]
    for name, t in params32.items():
        lines.append(f"param {name} {t.numel()} " + fmt_param(t.flatten().tolist()))
    for name, t in params.items():
        lines.append(f"grad {name} {t.numel()} " + fmt(t.grad.flatten().tolist(), 9))
    return "\n".join(lines) + "\n"


def compare_text(want, got, rel=1e-8):
    """None when `got` matches `want` (the numbers of loss/logits/grad lines within `rel` of each
    value, or of 1e-3 of the line's largest; every other line exactly), else the first difference."""
    a, b = want.splitlines(), got.splitlines()
    if len(a) != len(b):
        return f"{len(a)} lines, regenerated {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        if x == y:
            continue
        wx, wy = x.split(), y.split()
        kind = wx[0] if wx else ""
        head = 3 if kind == "grad" else 1  # words before the numbers
        if kind not in ("loss", "logits", "grad") or len(wx) != len(wy) or wx[:head] != wy[:head]:
            return f"line {i + 1} ({' '.join(wx[:head])}) differs"
        nx, ny = [float(s) for s in wx[head:]], [float(s) for s in wy[head:]]
        top = max(abs(u) for u in nx)
        for u, w in zip(nx, ny):
            if abs(u - w) > rel * max(abs(u), 1e-3 * top):
                return f"line {i + 1} ({' '.join(wx[:head])}): {u!r} vs {w!r}"
    return None


def check(data_dir):
    ok = True
    names = sorted(f for f in os.listdir(data_dir) if f.startswith("reference_"))
    expected = sorted(f"reference_{v}.txt.xz" for v in VARIANTS)
    if names != expected:
        print(f"FAIL {data_dir}: files {names}, expected {expected}")
        ok = False
    for v in VARIANTS:
        path = os.path.join(data_dir, f"reference_{v}.txt.xz")
        if not os.path.exists(path):
            print(f"FAIL {path}: missing")
            ok = False
            continue
        with lzma.open(path, "rt") as f:
            want = f.read()
        got = fixture_text(v)
        if want == got:
            print(f"ok   {path}: byte-identical ({len(want)} bytes)")
            continue
        diff = compare_text(want, got)
        if diff is None:
            print(f"ok   {path}: equal within 1e-8 relative (not byte-identical: other BLAS/CPU rounding)")
        else:
            print(f"FAIL {path}: {diff}")
            ok = False
    return ok


# ---- self-tests -----------------------------------------------------------------------------------

def naive_loss(p, cfg, tokens, targets):
    """The same model again, element by element: explicit per-pair rotation angles, per-head loops
    with the key/value head h // (H / Hkv), a hand-written softmax and cross-entropy, the
    llama3 frequencies from Python floats, and under output_router_logits the load-balancing
    loss from per-expert counts and sums over every token of every sparse layer; DeepSeek-V3's
    Multi-head Latent Attention token by token and head by head (naive_mla). Slow; a check of the
    vectorised forward only."""
    if qwen35(cfg):
        return naive_qwen35_loss(p, cfg, tokens, targets)
    p = unfused(p, cfg)
    H, D, C = cfg["num_attention_heads"], head_dim(cfg), cfg["hidden_size"]
    eps, group = cfg["rms_norm_eps"], cfg["num_attention_heads"] // cfg["num_key_value_heads"]
    R = rotary_dim(cfg)
    tables = {}  # per layer: (RoPE frequencies, cos/sin scale) of its config (rope_cfg)
    for l in range(cfg["num_hidden_layers"]):
        rc = rope_cfg(cfg, l)
        key = (rc["rope_theta"], json.dumps(rc["rope_scaling"], sort_keys=True))
        tables[l] = tables.get(key) or naive_frequencies(rc, R, tokens.shape[1])
        tables[key] = tables[l]
    is_gemma, sandwich = gemma(cfg), gemma2_layer(cfg)
    acap, fcap = softcaps(cfg)

    def norm(x, w, e=None):  # (e: another epsilon than rms_norm_eps)
        n = x.shape[0]
        w = 1.0 + w if is_gemma else w  # GemmaRMSNorm
        return x / torch.sqrt(sum(x[c] * x[c] for c in range(n)) / n + (eps if e is None else e)) * w

    def lin(x, name, bias):
        y = torch.mv(p[name + ".weight"], x)
        return y + p[name + ".bias"] if bias else y

    def naive_mla(hs, a, l):
        """DeepseekV3Attention of one sequence (hs: its input_layernorm outputs), token by token and
        head by head: each token's query (q_proj, or q_a_proj, its RMSNorm with eps 1e-6, q_b_proj),
        latent (kv_a_proj_with_mqa: c, then the shared rope key), per-head k_nope and v (kv_b_proj
        of c through its RMSNorm, eps 1e-6); the score of query t and key s the sum of the nope
        dot product and that of the rope parts, each pair of the dr columns ((2i, 2i+1) under
        rope_interleave, kept in place; else (i, i + dr/2)) turned by position * frequency i, both
        times the cos/sin scale; the scores times D^-1/2 mscale^2 (yarn with mscale_all_dim); the
        o_proj of the heads' softmax-weighted values, per token."""
        dn, dr, dv, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        ab, Dq = cfg["attention_bias"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        inv, cs_scale = tables[l]
        pairs = [(2 * i, 2 * i + 1) if rope_interleaved(cfg) else (i, i + dr // 2) for i in range(dr // 2)]

        def turn(x, pos):  # x [dr]: each pair turned by pos * inv[i], cos and sin times cs_scale
            out = [x[j] for j in range(dr)]
            for i, (j, k) in enumerate(pairs):
                c, sn = cs_scale * math.cos(pos * inv[i]), cs_scale * math.sin(pos * inv[i])
                out[j], out[k] = x[j] * c - x[k] * sn, x[k] * c + x[j] * sn
            return torch.stack(out)

        s = cfg["rope_scaling"]
        ms = 1.0
        if s is not None and s.get("mscale_all_dim") and s["factor"] > 1 and cfg["model_type"] == "deepseek_v3":
            ms = 1.0 + 0.1 * s["mscale_all_dim"] * math.log(s["factor"])  # (DeepseekV2: none)
        sc_scale = ms * ms / math.sqrt(Dq)
        queries, nope_keys, rope_keys, values = [], [], [], []
        for h in hs:
            if cfg["q_lora_rank"] is None:
                q = torch.mv(p[a + "q_proj.weight"], h)
            else:
                q = torch.mv(p[a + "q_b_proj.weight"], norm(lin(h, a + "q_a_proj", ab), p[a + "q_a_layernorm.weight"], 1e-6))
            ckv = lin(h, a + "kv_a_proj_with_mqa", ab)
            kv = torch.mv(p[a + "kv_b_proj.weight"], norm(ckv[:kvr], p[a + "kv_a_layernorm.weight"], 1e-6))
            queries.append([q[hd * Dq:(hd + 1) * Dq] for hd in range(H)])
            rope_keys.append(ckv[kvr:kvr + dr])
            nope_keys.append([kv[hd * (dn + dv):hd * (dn + dv) + dn] for hd in range(H)])
            values.append([kv[hd * (dn + dv) + dn:(hd + 1) * (dn + dv)] for hd in range(H)])
        out = []
        for t in range(len(hs)):
            heads = []
            for hd in range(H):
                qn, qr = queries[t][hd][:dn], turn(queries[t][hd][dn:], t)
                scores = [(torch.dot(qn, nope_keys[u][hd]) + torch.dot(qr, turn(rope_keys[u], u))) * sc_scale
                          for u in range(t + 1)]
                top = max(float(sc) for sc in scores)
                w = [torch.exp(sc - top) for sc in scores]
                z = sum(w)
                heads.append(sum(w[u] / z * values[u][hd] for u in range(t + 1)))
            out.append(lin(torch.cat(heads), a + "o_proj", o_bias(cfg)))
        return out

    def rope(x, t, l):  # x [D]: pairs (i, i + R/2) rotated by t * inv[i] of layer l's table,
        if not uses_rope(cfg, l):  # columns R.. as they are (Llama 4: pairs (2i, 2i+1))
            return x
        inv, scale = tables[l]
        out = [(j, x[j]) for j in range(R, D)]
        for i in range(R // 2):
            c, sn = scale * math.cos(t * inv[i]), scale * math.sin(t * inv[i])
            j, k = (2 * i, 2 * i + 1) if llama4(cfg) and not LLAMA4_ALT["rotate_half"] else (i, i + R // 2)
            out.append((j, x[j] * c - x[k] * sn))
            out.append((k, x[k] * c + x[j] * sn))
        return torch.stack([v for _, v in sorted(out, key=lambda e: e[0])])

    def l4_head(x, t, l, is_q):  # Llama 4's head after RoPE: the L2 norm written out, the temperature
        if not llama4(cfg):
            return x
        if cfg["use_qk_norm"] and (uses_rope(cfg, l) or LLAMA4_ALT["qk_norm_nope"]):
            x = x / torch.sqrt(sum(x[c] * x[c] for c in range(D)) / D + eps)
        if is_q and cfg["attn_temperature_tuning"] and not uses_rope(cfg, l):
            x = x * (math.log(math.floor((t + 1) / cfg["floor_scale"]) + 1) * cfg["attn_scale"] + 1)
        return x

    def act(g):  # SwiGLU's silu, or Gemma's gelu tanh written out
        if not is_gemma:
            return g / (1 + torch.exp(-g))
        inner = math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)
        return g * (torch.exp(inner) / (torch.exp(inner) + torch.exp(-inner)))  # = 0.5 g (1 + tanh)

    def swiglu(h, pre):  # down(silu(gate h) * up h) of the MLP named pre
        return lin(act(lin(h, pre + "gate_proj", False)) * lin(h, pre + "up_proj", False), pre + "down_proj", False)

    def glm_mlp(h, l):
        """One token's GLM-4.5 (and DeepSeek-V3) block, loop by loop: the E sigmoids; the choice scores s + bias as
        Python floats; each group's two best summed; the topk_group best groups kept, the others'
        scores 0.0; the K best scores picked one by one; the chosen sigmoids (/ their sum + 1e-20
        under norm_topk_prob) times routed_scaling_factor; + the shared experts' MLP."""
        m, E, G = moe_prefix(cfg, l), num_experts(cfg), cfg["n_group"]
        size = E // G
        s = [1 / (1 + torch.exp(-torch.dot(p[m + "gate.weight"][e], h))) for e in range(E)]
        bias = p[m + "gate.e_score_correction_bias"].tolist()
        c = [float(s[e]) + bias[e] for e in range(E)]
        score = [sum(sorted(c[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(G)]
        kept = sorted(range(G), key=lambda g: -score[g])[:cfg["topk_group"]]
        c = [c[e] if e // size in kept else 0.0 for e in range(E)]
        chosen = []
        for _ in range(cfg["num_experts_per_tok"]):
            chosen.append(max((e for e in range(E) if e not in chosen), key=lambda e: c[e]))
        w = [s[e] for e in chosen]
        if cfg["norm_topk_prob"]:
            total_w = sum(w) + 1e-20
            w = [v / total_w for v in w]
        out = swiglu(h, m + "shared_experts.")
        for wj, e in zip(w, chosen):
            out = out + (wj * cfg["routed_scaling_factor"]) * swiglu(h, f"{m}experts.{e}.")
        return out

    def gptoss_mlp(h, l):
        """One token's GptOssMLP, loop by loop: the E router logits (dot + bias), the K largest
        picked one by one, their softmax by hand; each chosen expert's gate_up column by column
        (h . gate_up_proj[e, :, j] + bias), gate the even columns and up the odd ones (chunked
        halves under GPTOSS_CHUNKED), each clamped by comparison, (up + 1) gate / (1 +
        e^(-alpha gate)), then output column by column (act . down_proj[e, :, c] + bias)."""
        m = moe_prefix(cfg, l)
        W, bias = p[m + "router.weight"], p[m + "router.bias"]
        z = [torch.dot(W[e], h) + bias[e] for e in range(num_experts(cfg))]
        top = max(float(v) for v in z)
        ez = [torch.exp(v - top) for v in z]
        chosen = []
        for _ in range(cfg["num_experts_per_tok"]):
            chosen.append(max((e for e in range(len(z)) if e not in chosen), key=lambda e: float(z[e])))
        routing.append(([v / sum(ez) for v in ez], chosen))  # (the aux loss: the softmax of the logits over E)
        ztop = max(float(z[e]) for e in chosen)
        wexp = [torch.exp(z[e] - ztop) for e in chosen]
        w = [v / sum(wexp) for v in wexp]
        gu_w, gu_b = p[m + "experts.gate_up_proj"], p[m + "experts.gate_up_proj_bias"]
        dn_w, dn_b = p[m + "experts.down_proj"], p[m + "experts.down_proj_bias"]
        I = expert_size(cfg)
        out = 0.0
        for wj, e in zip(w, chosen):
            gu = [torch.dot(h, gu_w[e, :, j]) + gu_b[e, j] for j in range(2 * I)]
            act = []
            for i in range(I):
                g, u = (gu[i], gu[I + i]) if GPTOSS_CHUNKED else (gu[2 * i], gu[2 * i + 1])
                g = g if float(g) <= GPTOSS_LIMIT else g * 0 + GPTOSS_LIMIT
                u = u if -GPTOSS_LIMIT <= float(u) <= GPTOSS_LIMIT else u * 0 + math.copysign(GPTOSS_LIMIT, float(u))
                act.append((u + 1) * g / (1 + torch.exp(-GPTOSS_ALPHA * g)))
            act = torch.stack(act)
            y = torch.stack([torch.dot(act, dn_w[e, :, c]) + dn_b[e, c] for c in range(C)])
            out = out + wj * y
        return out

    def llama4_mlp(h, l):
        """One token's Llama4TextMoe, loop by loop: the E router logits, the K largest picked one by
        one, each one's logistic 1 / (1 + e^-z) scaling the token before that expert (after it under
        LLAMA4_ALT["scale_output"]); the expert's gate_up column by column, gate the first I columns
        and up the next I (the even / odd ones under LLAMA4_ALT["gate_up_interleaved"]), up * gate /
        (1 + e^-gate), then its output column by column; plus the shared expert's MLP of h."""
        m = moe_prefix(cfg, l)
        z = [torch.dot(p[m + "router.weight"][e], h) for e in range(num_experts(cfg))]
        chosen = []
        for _ in range(cfg["num_experts_per_tok"]):
            chosen.append(max((e for e in range(len(z)) if e not in chosen), key=lambda e: float(z[e])))
        gu_w, dn_w, I = p[m + "experts.gate_up_proj"], p[m + "experts.down_proj"], expert_size(cfg)
        out = swiglu(h, m + "shared_expert.")
        for e in chosen:
            score = 1 / (1 + torch.exp(-z[e]))
            xin = h if LLAMA4_ALT["scale_output"] else h * score
            gu = [torch.dot(xin, gu_w[e, :, j]) for j in range(2 * I)]
            acts = []
            for i in range(I):
                g, u = (gu[2 * i], gu[2 * i + 1]) if LLAMA4_ALT["gate_up_interleaved"] else (gu[i], gu[I + i])
                acts.append(u * g / (1 + torch.exp(-g)))
            acts = torch.stack(acts)
            y = torch.stack([torch.dot(acts, dn_w[e, :, c]) for c in range(C)])
            out = out + (y * score if LLAMA4_ALT["scale_output"] else y)
        return out

    def moe_mlp(h, l):  # one token's MoE block: the router softmax by hand, the K largest picked
        if deepseek_moe(cfg):  # one by one, each chosen expert's MLP
            return glm_mlp(h, l)
        if gptoss(cfg):
            return gptoss_mlp(h, l)
        if llama4(cfg):
            return llama4_mlp(h, l)
        m, (gate, up, down) = moe_prefix(cfg, l), expert_projs(cfg)[0]
        z = [torch.dot(p[m + "gate.weight"][e], h) for e in range(num_experts(cfg))]
        top = max(float(v) for v in z)
        ez = [torch.exp(v - top) for v in z]
        prob = [v / sum(ez) for v in ez]
        chosen = []
        for _ in range(cfg["num_experts_per_tok"]):
            chosen.append(max((e for e in range(len(z)) if e not in chosen), key=lambda e: float(prob[e])))
        routing.append((prob, chosen))  # (for the load-balancing loss)
        w = [prob[e] for e in chosen]
        if renormalise(cfg):
            w = [v / sum(w) for v in w]
        if cfg["model_type"] == "deepseek_v2":  # never renormalised; times routed_scaling_factor
            w = [v * cfg["routed_scaling_factor"] for v in w]
        out = 0.0
        for wj, e in zip(w, chosen):
            ex = f"{m}experts.{e}."
            out = out + wj * lin(act(lin(h, ex + gate, False)) * lin(h, ex + up, False), ex + down, False)
        if shared_expert(cfg):  # Qwen2-MoE: + the shared expert, times the logistic of one dot product
            s = m + "shared_expert."
            shared = lin(act(lin(h, s + "gate_proj", False)) * lin(h, s + "up_proj", False), s + "down_proj", False)
            out = out + shared / (1 + torch.exp(-torch.dot(p[m + "shared_expert_gate.weight"][0], h)))
        if cfg["model_type"] == "deepseek_v2":  # + the shared experts, ungated
            out = out + swiglu(h, m + "shared_experts.")
        return out

    emb = p["model.embed_tokens.weight"]
    pad = pad_token(cfg)
    # Gemma: sqrt(hidden) as float32; the padding row's lookup detached (padding_idx)
    escale = float(torch.tensor(C ** 0.5, dtype=torch.float32)) if is_gemma else 1.0
    sscale = 1 / math.sqrt(cfg["query_pre_attn_scalar"]) if sandwich else 1 / math.sqrt(D)
    rmul, lscale = 1.0, 1.0
    if granite(cfg):  # its four multipliers
        escale, sscale = cfg["embedding_multiplier"], cfg["attention_multiplier"]
        rmul, lscale = cfg["residual_multiplier"], cfg["logits_scaling"]
    total, routing = 0.0, []  # routing: (the E probabilities, the K chosen experts) per token per sparse layer
    for b in range(tokens.shape[0]):
        xs = [(emb[int(tokens[b, t])].detach() if int(tokens[b, t]) == pad else emb[int(tokens[b, t])]) * escale
              for t in range(tokens.shape[1])]
        for l in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            a, ab, mb = pre + "self_attn.", qkv_bias(cfg), mlp_bias(cfg)
            hs = xs if post_norms(cfg) else [norm(x, p[pre + "input_layernorm.weight"]) for x in xs]
            if mla(cfg):  # DeepSeek-V3: Multi-head Latent Attention
                xs = [x + o for x, o in zip(xs, naive_mla(hs, a, l))]
            else:
                qs = [lin(h, a + "q_proj", ab) for h in hs]
                ks = [lin(h, a + "k_proj", ab) for h in hs]
                if olmo2(cfg):  # Olmo2's norms over the whole q and k rows
                    qs = [norm(q, p[a + "q_norm.weight"]) for q in qs]
                    ks = [norm(k, p[a + "k_norm.weight"]) for k in ks]
                vs = [lin(h, a + "v_proj", ab) for h in hs]
                new = []

                def head(x, i, which):  # head i of a q or k row, through Qwen3's / Gemma's norm if any
                    y = x[i * D:(i + 1) * D]
                    return norm(y, p[a + which + "_norm.weight"]) if qk_norm(cfg) else y

                for t in range(len(xs)):
                    heads = []
                    for hd in range(H):
                        kv = hd // group
                        q = l4_head(rope(head(qs[t], hd, "q"), t, l), t, l, True)
                        first = max(0, t - layer_window(cfg, l) + 1) if layer_window(cfg, l) else 0
                        if chunked_layer(cfg, l):  # Llama 4: the keys of t's chunk up to t
                            first = t // cfg["attention_chunk_size"] * cfg["attention_chunk_size"]
                        seen = range(first, t + 1)
                        scores = [torch.dot(q, l4_head(rope(head(ks[s], kv, "k"), s, l), s, l, False)) * sscale
                                  for s in seen]
                        if acap:  # tanh written out: (e^2u - 1) / (e^2u + 1)
                            scores = [acap * (torch.exp(2 * sc / acap) - 1) / (torch.exp(2 * sc / acap) + 1)
                                      for sc in scores]
                        if gptoss(cfg):  # the head's sink: one more logit in the sum, no value
                            sink = p[a + "sinks"][hd]
                            top = max([float(sc) for sc in scores] + [float(sink)])
                            w = [torch.exp(sc - top) for sc in scores]
                            z = sum(w) + torch.exp(sink - top)
                        else:
                            top = max(float(sc) for sc in scores)
                            w = [torch.exp(sc - top) for sc in scores]
                            z = sum(w)
                        heads.append(sum(w[n] / z * vs[s][kv * D:(kv + 1) * D] for n, s in enumerate(seen)))
                    o = lin(torch.cat(heads), a + "o_proj", o_bias(cfg))
                    if post_norms(cfg) or sandwich:
                        o = norm(o, p[pre + "post_attention_layernorm.weight"])
                    new.append(xs[t] + o * rmul)
                xs = new
            new = []
            for x in xs:
                h = x if post_norms(cfg) else norm(x, p[pre + ("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight")])
                if sparse_layer(cfg, l):
                    new.append(x + moe_mlp(h, l))
                    continue
                f = pre + ("feed_forward." if llama4(cfg) else "mlp.")
                g, u = lin(h, f + "gate_proj", mb), lin(h, f + "up_proj", mb)
                m = lin(act(g) * u, f + "down_proj", mb)
                if post_norms(cfg) or sandwich:
                    m = norm(m, p[pre + "post_feedforward_layernorm.weight"])
                new.append(x + m * rmul)
            xs = new
        head = p["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
        for t, x in enumerate(xs):
            z = torch.mv(head, norm(x, p["model.norm.weight"])) / lscale
            if fcap:
                z = fcap * (torch.exp(2 * z / fcap) - 1) / (torch.exp(2 * z / fcap) + 1)
            top = float(z.max())
            total = total + (top + torch.log(torch.exp(z - top).sum()) - z[int(targets[b, t])])
    if not aux_on(cfg):
        return total / tokens.numel()
    E, n = num_experts(cfg), len(routing)  # n = sparse layers * B * T
    lb = 0.0
    for e in range(E):  # E * (share of the n * K choices' slots that picked e, per token) * (mean p_e)
        picks = sum(1 for _, chosen in routing for c in chosen if c == e)
        lb = lb + (picks / n) * (sum(prob[e] for prob, _ in routing) / n)
    return total / tokens.numel() + cfg["router_aux_loss_coef"] * (E * lb)


def naive_qwen35_loss(p, cfg, tokens, targets):
    """Qwen3_5ForCausalLM again, token by token and head by head (naive_loss's qwen35 part): the
    norms' sums written out (1 + w; the gated norm w); the full_attention layers' per-head query
    (rows h 2D .. h 2D + D of q_proj), gate (the next D rows) and key / value head h // (H / Hkv),
    each pair (i, i + R/2) of the first R columns turned by t * inv[i] (naive_frequencies), a
    hand-written softmax, each head's output times 1 / (1 + e^-gate); the linear_attention layers'
    convolution as a sum over the K taps of the tokens t - K + 1 .. t, the l2 norms, exp / log1p
    of the gates, and the delta rule on the state's Dk rows one by one: row i decayed, the memory
    sum_i S_i k_i, the delta, each row plus k_i delta, the output sum_i S_i q_i. Qwen3.5-MoE's sparse
    block token by token: the E router dot products, their softmax by hand, the K largest picked one
    by one, their weights divided by their sum, each chosen expert's MLP, plus the shared expert's
    times 1 / (1 + e^-(shared_expert_gate . h)); under output_router_logits the load-balancing loss
    from per-expert counts and sums (as naive_loss). Slow."""
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    eps, group = cfg["rms_norm_eps"], H // Hkv
    rc = qwen35_rope(cfg)
    R = int(D * rc["partial_rotary_factor"])
    inv, _ = naive_frequencies(rc, R, tokens.shape[1])
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    Dk, Dv, K = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    Kd = Hk * Dk

    def norm(x, w, plus_one=True):
        n = x.shape[0]
        return x / torch.sqrt(sum(x[c] * x[c] for c in range(n)) / n + eps) * ((1.0 + w) if plus_one else w)

    def lin(x, name):
        return torch.mv(p[name + ".weight"], x)

    def silu(u):
        return u / (1 + torch.exp(-u))

    def rope(x, t):  # x [D]: pairs (i, i + R/2) of the first R columns turned by t * inv[i]
        out = [x[j] for j in range(D)]
        for i in range(R // 2):
            c, sn = math.cos(t * inv[i]), math.sin(t * inv[i])
            out[i], out[i + R // 2] = x[i] * c - x[i + R // 2] * sn, x[i + R // 2] * c + x[i] * sn
        return torch.stack(out)

    def attention(hs, a):
        qs = [lin(h, a + "q_proj") for h in hs]
        ks = [lin(h, a + "k_proj") for h in hs]
        vs = [lin(h, a + "v_proj") for h in hs]
        out = []
        for t in range(len(hs)):
            heads = []
            for hd in range(H):
                kv = hd // group
                q = rope(norm(qs[t][hd * 2 * D:hd * 2 * D + D], p[a + "q_norm.weight"]), t)
                gate = qs[t][hd * 2 * D + D:(hd + 1) * 2 * D]
                scores = [torch.dot(q, rope(norm(ks[s][kv * D:(kv + 1) * D], p[a + "k_norm.weight"]), s)) / math.sqrt(D)
                          for s in range(t + 1)]
                top = max(float(sc) for sc in scores)
                w = [torch.exp(sc - top) for sc in scores]
                y = sum(w[s] / sum(w) * vs[s][kv * D:(kv + 1) * D] for s in range(t + 1))
                heads.append(y / (1 + torch.exp(-gate)))
            out.append(lin(torch.cat(heads), a + "o_proj"))
        return out

    def deltanet(hs, a):
        mixed = [lin(h, a + "in_proj_qkv") for h in hs]
        w = p[a + "conv1d.weight"]  # [N, 1, K]
        conv = [silu(sum(w[:, 0, j] * mixed[t - K + 1 + j] for j in range(K) if t - K + 1 + j >= 0))
                for t in range(len(hs))]
        A = [torch.exp(p[a + "A_log"][j]) for j in range(Hv)]
        states = [[torch.zeros(Dv, dtype=torch.float64) for _ in range(Dk)] for _ in range(Hv)]  # per head: Dk rows
        out = []
        for t, h in enumerate(hs):
            b, av, z = lin(h, a + "in_proj_b"), lin(h, a + "in_proj_a"), lin(h, a + "in_proj_z")
            heads = []
            for j in range(Hv):
                kh = j // (Hv // Hk)
                q = conv[t][kh * Dk:(kh + 1) * Dk]
                k = conv[t][Kd + kh * Dk:Kd + (kh + 1) * Dk]
                v = conv[t][2 * Kd + j * Dv:2 * Kd + (j + 1) * Dv]
                q = q / torch.sqrt(sum(q[i] * q[i] for i in range(Dk)) + QWEN35_QK_L2_EPS) / math.sqrt(Dk)
                k = k / torch.sqrt(sum(k[i] * k[i] for i in range(Dk)) + QWEN35_QK_L2_EPS)
                u = av[j] + p[a + "dt_bias"][j]
                decay = torch.exp(-A[j] * torch.log1p(torch.exp(u)))  # exp(g): softplus written out
                beta = 1 / (1 + torch.exp(-b[j]))
                S = [row * decay for row in states[j]]
                mem = sum(S[i] * k[i] for i in range(Dk))
                delta = (v - mem) * beta
                S = [S[i] + k[i] * delta for i in range(Dk)]
                states[j] = S
                o = sum(S[i] * q[i] for i in range(Dk))
                heads.append(norm(o, p[a + "norm.weight"], plus_one=False) * silu(z[j * Dv:(j + 1) * Dv]))
            out.append(lin(torch.cat(heads), a + "out_proj"))
        return out

    def swiglu(h, pre):  # down(silu(gate h) * up h) of the MLP named pre
        return lin(silu(lin(h, pre + "gate_proj")) * lin(h, pre + "up_proj"), pre + "down_proj")

    routing = []  # (the E probabilities, the K chosen experts) per token per sparse layer

    def sparse_mlp(h, m):  # one token's Qwen3_5MoeSparseMoeBlock (block prefix m)
        z = [torch.dot(p[m + "gate.weight"][e], h) for e in range(num_experts(cfg))]
        top = max(float(v) for v in z)
        ez = [torch.exp(v - top) for v in z]
        prob = [v / sum(ez) for v in ez]
        chosen = []
        for _ in range(cfg["num_experts_per_tok"]):
            chosen.append(max((e for e in range(len(z)) if e not in chosen), key=lambda e: float(prob[e])))
        routing.append((prob, chosen))
        w = [prob[e] for e in chosen]
        out = swiglu(h, m + "shared_expert.") / (1 + torch.exp(-torch.dot(p[m + "shared_expert_gate.weight"][0], h)))
        for wj, e in zip(w, chosen):  # (always renormalised: Qwen3VLMoeTextTopKRouter)
            out = out + wj / sum(w) * swiglu(h, f"{m}experts.{e}.")
        return out

    emb, pad = p["model.embed_tokens.weight"], pad_token(cfg)
    head = p["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    total = 0.0
    for bi in range(tokens.shape[0]):
        xs = [emb[int(tk)].detach() if int(tk) == pad else emb[int(tk)] for tk in tokens[bi]]
        for l in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{l}."
            hs = [norm(x, p[pre + "input_layernorm.weight"]) for x in xs]
            mix = deltanet(hs, pre + "linear_attn.") if cfg["layer_types"][l] == "linear_attention" else attention(hs, pre + "self_attn.")
            xs = [x + o for x, o in zip(xs, mix)]
            new = []
            for x in xs:
                h = norm(x, p[pre + "post_attention_layernorm.weight"])
                new.append(x + (sparse_mlp(h, pre + "mlp.") if sparse_layer(cfg, l) else swiglu(h, pre + "mlp.")))
            xs = new
        for t, x in enumerate(xs):
            z = torch.mv(head, norm(x, p["model.norm.weight"]))
            top = float(z.max())
            total = total + (top + torch.log(torch.exp(z - top).sum()) - z[int(targets[bi, t])])
    if not aux_on(cfg):
        return total / tokens.numel()
    E, n = num_experts(cfg), len(routing)  # n = sparse layers * B * T
    lb = 0.0
    for e in range(E):
        picks = sum(1 for _, chosen in routing for c in chosen if c == e)
        lb = lb + (picks / n) * (sum(prob[e] for prob, _ in routing) / n)
    return total / tokens.numel() + cfg["router_aux_loss_coef"] * (E * lb)


def naive_frequencies(cfg, D, T):
    """(the D/2 RoPE frequencies, the cos/sin scale) of `cfg` for sequences of T tokens from
    Python floats, rule by rule."""
    inv = []
    s = cfg["rope_scaling"]
    scale = 1.0
    if scaling_type(s) == "longrope":  # LongRoPE: Phi3LongRoPEScaledRotaryEmbedding's rule
        o = cfg["original_max_position_embeddings"]
        ext = s["long_factor"] if T > o else s["short_factor"]
        ratio = cfg["max_position_embeddings"] / o
        scale = math.sqrt(1 + math.log(ratio) / math.log(o)) if ratio > 1 else 1.0
        return [cfg["rope_theta"] ** (-2.0 * i / D) / ext[i] for i in range(D // 2)], scale
    if s is not None and s["rope_type"] == "default":
        s = None
    if s is not None and s["rope_type"] == "yarn":  # the paper's notation, loop by loop
        orig, b, f = s["original_max_position_embeddings"], cfg["rope_theta"], s["factor"]
        r_dim = [D * math.log(orig / (2 * math.pi * r)) / (2 * math.log(b))
                 for r in (s.get("beta_fast") or 32, s.get("beta_slow") or 1)]
        if s.get("truncate", True):  # (GPT-OSS: truncate false, the range as it falls)
            r_dim = [math.floor(r_dim[0]), math.ceil(r_dim[1])]
        lo, hi = max(r_dim[0], 0), min(r_dim[1], D - 1)
        scale = 0.1 * math.log(f) + 1.0
        if s.get("mscale") and s.get("mscale_all_dim"):  # DeepSeek's ratio of two mscales
            scale = (0.1 * s["mscale"] * math.log(f) + 1.0) / (0.1 * s["mscale_all_dim"] * math.log(f) + 1.0)
    for i in range(D // 2):
        f = cfg["rope_theta"] ** (-2.0 * i / D)
        if s is not None and s["rope_type"] == "linear":
            f = f / s["factor"]
        elif s is not None and s["rope_type"] == "yarn":
            # 0: extrapolate, 1: interpolate (an empty range, lo == hi: a step after lo)
            gamma = min(max((i - lo) / (hi - lo), 0.0), 1.0) if hi > lo else float(i > lo)
            f = gamma * f / s["factor"] + (1 - gamma) * f
        elif s is not None:
            wl, orig = 2 * math.pi / f, s["original_max_position_embeddings"]
            branch = llama3_branch(cfg, wl)
            if branch == "scaled":
                f = f / s["factor"]
            elif branch == "smoothed":
                sm = (orig / wl - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
                f = (1 - sm) * f / s["factor"] + sm * f
        inv.append(f)
    return inv, scale


def shared_mlp(x, p, m, module="shared_expert."):
    """Qwen2-MoE's shared expert (block prefix m) on x [N, C], ungated: down(silu(gate x) * up x);
    module "shared_experts.": GLM-4.5's."""
    s = m + module
    g = x @ p[s + "gate_proj.weight"].T
    return (g * torch.sigmoid(g) * (x @ p[s + "up_proj.weight"].T)) @ p[s + "down_proj.weight"].T


def chunked_gated_delta_rule(q, k, v, g, beta, chunk=64):
    """HF's torch_chunk_gated_delta_rule (use_qk_l2norm_in_kernel), re-derived for --selftest: the
    same outputs as gated_delta_rule by another route. q, k l2-normalised, q times Dk^-1/2; [B, H, T,
    .]; T padded with zeros to a multiple of `chunk` (g 0, beta 0: later positions touch nothing
    earlier). Within a chunk with state S0 at its start and G = cumsum(g) (from the chunk's start),
    unrolling the recurrence gives S_i = e^G_i S0 + sum_{j <= i} e^(G_i - G_j) k_j u_j^T with the
    deltas u_i = beta_i (v_i - e^G_i S0^T k_i - sum_{j < i} e^(G_i - G_j) (k_i . k_j) u_j), i.e.
    (I + L) U = V_beta - (K_beta e^G) S0, L the strictly lower beta_i e^(G_i - G_j) k_i . k_j: U =
    new - w S0 with new = (I + L)^-1 V_beta, w = (I + L)^-1 (K_beta e^G) (solve_triangular,
    unitriangular); o_i = e^G_i S0^T q_i + sum_{j <= i} e^(G_i - G_j) (q_i . k_j) u_j; the state
    after the chunk e^G_last S0 + sum_j e^(G_last - G_j) k_j u_j^T."""
    q, k = qk_l2norm(q) / math.sqrt(q.shape[-1]), qk_l2norm(k)
    q, k, v, beta, g = (x.transpose(1, 2) for x in (q, k, v, beta, g))  # [B, H, T, .]
    Bn, Hn, Tn, Dk = k.shape
    Dv = v.shape[-1]
    pad = (chunk - Tn % chunk) % chunk
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (torch.nn.functional.pad(x, (0, pad)) for x in (beta, g))
    n = (Tn + pad) // chunk
    q, k, v = (x.reshape(Bn, Hn, n, chunk, x.shape[-1]) for x in (q, k, v))
    beta, G = beta.reshape(Bn, Hn, n, chunk), g.reshape(Bn, Hn, n, chunk).cumsum(-1)
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool))  # j <= i
    decay = (G[..., :, None] - G[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # e^(G_i - G_j), j <= i
    kb, vb = k * beta[..., None], v * beta[..., None]
    system = (kb @ k.transpose(-1, -2)) * decay  # its strictly lower part L (the diagonal: unitriangular)
    new = torch.linalg.solve_triangular(system, vb, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * G.exp()[..., None], upper=False, unitriangular=True)
    S = torch.zeros(Bn, Hn, Dk, Dv, dtype=v.dtype)
    out = []
    for c in range(n):
        u = new[:, :, c] - w[:, :, c] @ S
        intra = (q[:, :, c] @ k[:, :, c].transpose(-1, -2)) * decay[:, :, c]
        out.append((q[:, :, c] * G[:, :, c, :, None].exp()) @ S + intra @ u)
        last = G[:, :, c, -1]
        S = S * last.exp()[..., None, None] + (k[:, :, c] * (last[..., None] - G[:, :, c]).exp()[..., None]).transpose(-1, -2) @ u
    return torch.cat(out, dim=2)[:, :, :Tn].transpose(1, 2)


def rel_err(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-300))



def routed_differences(base64, names, per_tensor, value, routes, grads, rng, h=1e-4):
    """Fourth-order central differences of value()[0] at `per_tensor` random entries of each
    tensor `names` of base64 (perturbed in place and restored), against grads[n].grad: returns
    (worst abs err, worst rel err, entries checked, perturbed points whose routing, value()[1],
    differs from `routes`)."""
    worst_abs, worst_rel, count, moved = 0.0, 0.0, 0, 0
    for n in names:
        flat = base64[n].view(-1)
        for _ in range(per_tensor):
            i = rng.randrange(flat.numel())
            old, f = flat[i].item(), {}
            for step in (h, -h, h / 2, -h / 2):
                flat[i] = old + step
                f[step], r = value()
                moved += any(not torch.equal(a, b) for a, b in zip(r, routes))
            flat[i] = old
            numeric = (4 * (f[h / 2] - f[-h / 2]) / h - (f[h] - f[-h]) / (2 * h)) / 3
            analytic = grads[n].grad.view(-1)[i].item()
            worst_abs = max(worst_abs, abs(numeric - analytic))
            worst_rel = max(worst_rel, abs(numeric - analytic) / max(abs(analytic), 1e-4))
            count += 1
    return worst_abs, worst_rel, count, moved

def selftest():
    global LORA_EPS, GPTOSS_CHUNKED, GPTOSS_LIMIT  # (4i: the lora norms' eps, 4j: the gate / up split and the clamp
    # limit, each changed for one run)
    torch.manual_seed(0)
    fails = []

    def expect(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            fails.append(what)

    # 1. llama3 RoPE branches.
    cfg = hf_config("1l_gqa_tied_llama3")
    D = head_dim(cfg)
    base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    wl = (2 * math.pi / base).tolist()
    branches = [llama3_branch(cfg, w) for w in wl]
    scaled = inv_freq(cfg)
    print("llama3 wavelengths " + " ".join(f"{w:.6g}" for w in wl) + " -> " + " ".join(branches))
    expect(branches == ["untouched", "smoothed", "scaled", "scaled"], "llama3: one untouched, one smoothed, two scaled frequencies")
    f = cfg["rope_scaling"]["factor"]
    expect(scaled[0] == base[0] and torch.allclose(scaled[2:], base[2:] / f, rtol=0, atol=0)
           and base[1] / f < scaled[1] < base[1], "llama3: untouched kept, scaled divided by factor, smoothed strictly between")

    # 1b. yarn: the correction range, each pair's blend and the cos/sin scale (YARN_SCALING).
    cfg = hf_config("1l_gqa_untied_yarn")
    base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, 8, 2, dtype=torch.float64) / 8))
    ratio = (inv_freq(cfg) / base).tolist()
    print("yarn range %s, frequency ratios %s, scale %.6f" % (yarn_range(cfg), ratio, attention_scaling(cfg)))
    expect(yarn_range(cfg) == (1, 3) and all(abs(a - b) < 1e-15 for a, b in zip(ratio, [1, 1, 0.625, 0.25]))
           and abs(attention_scaling(cfg) - (1 + 0.1 * math.log(4))) < 1e-15,
           "yarn: pairs 0, 1 kept, 2 half interpolated, 3 divided by factor; cos/sin scaled by 1 + 0.1 ln 4")
    cfg = hf_config("1l_mha_tied_linear_qwen2")
    expect(torch.equal(inv_freq(cfg), base / 2), "linear: every frequency halved")

    # 1b'. DeepSeek-V3's yarn (DEEPSEEK_YARN) over dr = 4: factor = max_position_embeddings /
    #      original_max_position_embeddings (so transformers' two readings of factor agree); the
    #      range [0, 0] (+0.001): pair 0 kept, pair 1 divided by factor; cos/sin scaled by
    #      get_mscale(4, 1) / get_mscale(4, 0.8); the softmax scale D^-1/2 get_mscale(4, 0.8)^2 (the
    #      rope1e4 variant: D^-1/2 and unscaled frequencies); the loop-by-loop frequencies agree.
    #      DeepSeek-V2 (deepseekv2): the same frequencies and cos/sin scale, the softmax scale
    #      D^-1/2 alone (DeepseekV2Attention has no mscale^2).
    for v in (x for x in VARIANTS if x.endswith("_deepseekv3") or x.endswith("_deepseekv2")):
        cfg = hf_config(v)
        s, dr, D = cfg["rope_scaling"], cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
        naive_inv, naive_scale = naive_frequencies(cfg, dr, T)
        same = (max(abs(a - b) for a, b in zip(naive_inv, inv_freq(cfg).tolist())) < 1e-15
                and abs(naive_scale - attention_scaling(cfg)) < 1e-15)
        if s is None:
            expect(head_dim(cfg) == rotary_dim(cfg) == dr and torch.equal(inv_freq(cfg), base)
                   and attention_scaling(cfg) == 1.0 and mla_scale(cfg) == D ** -0.5 and same,
                   f"{v}: RoPE over dr = {dr} at 1 / theta^(2i/{dr}), unscaled; softmax scale D^-1/2 = {D}^-1/2")
            continue
        f, m_all = s["factor"], 1 + 0.1 * s["mscale_all_dim"] * math.log(s["factor"])
        ratio = (inv_freq(cfg) / base).tolist()
        cs = (1 + 0.1 * s["mscale"] * math.log(f)) / m_all
        sm = 1.0 if deepseek_v2(cfg) else m_all ** 2  # the softmax scale's factor over D^-1/2
        print("%s: yarn range %s, frequency ratios %s, cos/sin scale %.12f, softmax scale %.12f"
              % (v, yarn_range(cfg), ratio, attention_scaling(cfg), mla_scale(cfg)))
        expect(cfg["max_position_embeddings"] / s["original_max_position_embeddings"] == f
               and yarn_range(cfg) == (0, 0.001) and ratio == [1.0, 1 / f]
               and abs(attention_scaling(cfg) - cs) < 1e-15 and abs(mla_scale(cfg) - sm / math.sqrt(D)) < 1e-15
               and same, f"{v}: yarn over dr = {dr}: max_position_embeddings / original_max_position_embeddings = "
               f"factor {f:g}; pair 0 kept, pair 1 / factor; cos/sin x {cs:.6f} = get_mscale({f:g}, {s['mscale']:g}) / "
               f"get_mscale({f:g}, {s['mscale_all_dim']:g}); softmax scale D^-1/2 x {sm:.6f}"
               + (" (DeepseekV2: no mscale^2)" if deepseek_v2(cfg) else "") + "; the loop-by-loop "
               f"frequencies and scale agree")

    # 2. Per variant: the vectorised model against the loop-by-loop one, and finite differences.
    rng = random.Random(0)
    for v in VARIANTS:
        cfg, params32, tokens, targets = make_case(v)
        params, logits, loss = run(cfg, params32, tokens, targets)
        p2 = {n: t.to(torch.float64).requires_grad_(True) for n, t in params32.items()}
        loss2 = naive_loss(p2, cfg, tokens, targets)
        loss2.backward()
        zero_unused_grads(p2)
        gerr = max(rel_err(p2[n].grad, params[n].grad) for n in params)
        expect(abs(loss2.item() - loss.item()) <= 1e-13 * abs(loss.item()) and gerr < 1e-11,
               f"{v}: loop-by-loop model: loss {loss.item():.15f} vs {loss2.item():.15f}, max grad rel err {gerr:.1e}")
        buffers = [n for n in params if n.endswith(".e_score_correction_bias")]  # (GLM-4.5: never trained)
        norms = {n: float(t.grad.norm()) for n, t in params.items() if n not in buffers}
        expect(min(norms.values()) > 1e-4 and all(bool((params[n].grad == 0).all()) for n in buffers),
               f"{v}: every gradient tensor non-negligible (smallest norm {min(norms.values()):.2e}, {min(norms, key=norms.get)})"
               + (f"; the {len(buffers)} e_score_correction_bias gradient(s) exactly 0" if buffers else ""))
        # Central differences of the float64 loss (model_loss: with the aux term under
        # output_router_logits) at steps h and h/2, Richardson-extrapolated (error O(h^4)), for 2
        # random elements of every tensor.
        h, worst_abs, worst_rel, count = 1e-4, 0.0, 0.0, 0
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}

        def central(flat, i, old, step):
            flat[i] = old + step
            up = model_loss(base64, cfg, tokens, targets)[1].item()
            flat[i] = old - step
            down = model_loss(base64, cfg, tokens, targets)[1].item()
            flat[i] = old
            return (up - down) / (2 * step)

        with torch.no_grad():
            for n, t in base64.items():
                for _ in range(2):
                    i = rng.randrange(t.numel())
                    if n == "model.embed_tokens.weight":  # a row that is looked up (not the
                        looked = [int(x) for x in tokens.flatten() if int(x) != pad_token(cfg)]
                        i = looked[i % len(looked)] * t.shape[1] + i % t.shape[1]  # padding row)
                    flat = t.view(-1)
                    old = flat[i].item()
                    numeric = (4 * central(flat, i, old, h / 2) - central(flat, i, old, h)) / 3
                    analytic = params[n].grad.view(-1)[i].item()
                    worst_abs = max(worst_abs, abs(numeric - analytic))
                    worst_rel = max(worst_rel, abs(numeric - analytic) / max(abs(analytic), 1e-4))
                    count += 1
        expect(worst_abs < 1e-9 and worst_rel < 1e-6,
               f"{v}: finite differences, {count} elements of {len(base64)} tensors: "
               f"worst abs err {worst_abs:.1e}, worst rel err {worst_rel:.1e}")

    # 3. GQA / MQA == MHA with each key/value head repeated for its query heads; the GQA k/v
    #    gradients are the sums over the copies. And Hkv == H through the same code is plain MHA
    #    (the loop-by-loop model above checks that on the mha variants).
    for v in ("1l_gqa_tied_llama3", "1l_mqa_untied_llama3_attnbias_mlpbias", "3l_gqa_untied_llama3",
              "1l_gqa_untied_rope1e4_qwen3",  # (not olmo2, olmoe: their k_norm spans all kv heads)
              "1l_gqa_tied_rope1e4_gemma3", "3l_mqa_tied_llama3_qwen3moe", "1l_gqa_untied_rope1e4_mixtral",
              "3l_mqa_tied_llama3_qwen2moe_swa", "1l_gqa_untied_rope1e4_glm4moe", "3l_mqa_tied_llama3_glm4moe",
              "1l_gqa_untied_yarn_gptoss", "3l_mqa_tied_rope1e4_gptoss_swa_aux",
              "3l_gqa_untied_llama3_llama4", "1l_mqa_tied_rope1e4_llama4",
              "3l_gqa_untied_rope1e4_qwen35", "1l_mqa_tied_rope1e4_qwen35", "3l_gqa_untied_rope1e4_qwen35moe"):
        cfg, params32, tokens, targets = make_case(v)
        H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
        mha = dict(cfg, num_key_value_heads=H)
        rows = torch.cat([torch.arange(kv * D, (kv + 1) * D) for kv in range(Hkv) for _ in range(H // Hkv)])
        expanded = {n: (t[rows] if (".k_proj." in n or ".v_proj." in n) else t) for n, t in params32.items()}
        pg, lg, lossg = run(cfg, params32, tokens, targets)
        pm, lm, lossm = run(mha, expanded, tokens, targets)
        err = rel_err(lm, lg)
        gerr = 0.0
        for n in pg:
            gm = pm[n].grad
            if ".k_proj." in n or ".v_proj." in n:
                gm = torch.zeros_like(pg[n].grad).index_add_(0, rows, gm)
            gerr = max(gerr, rel_err(gm, pg[n].grad))
        expect(err < 1e-14 and gerr < 1e-12, f"{v}: equals MHA with repeated k/v heads (logits {err:.1e}, grads {gerr:.1e})")

    # 4. Tied == untied with lm_head.weight a copy of embed_tokens.weight; the tied embedding's
    #    gradient is the sum of the untied embedding's and lm_head's.
    for v in ("1l_gqa_tied_llama3", "3l_mqa_tied_rope1e4_attnbias_mlpbias", "1l_gqa_tied_rope1e4_gemma3",
              "3l_mqa_tied_llama3_qwen3moe", "3l_gqa_tied_llama3_olmoe", "3l_gqa_tied_llama3_olmoe_aux",
              "3l_mqa_tied_llama3_qwen2moe_swa", "3l_mqa_tied_llama3_glm4moe", "3l_mha_tied_yarn_deepseekv3",
              "3l_mha_tied_yarn_deepseekv2", "3l_mqa_tied_rope1e4_gptoss_swa_aux", "1l_mqa_tied_rope1e4_llama4",
              "1l_mqa_tied_rope1e4_qwen35"):
        cfg, params32, tokens, targets = make_case(v)
        untied = dict(cfg, tie_word_embeddings=False)
        p_untied = dict(params32, **{"lm_head.weight": params32["model.embed_tokens.weight"].clone()})
        pt, lt, losst = run(cfg, params32, tokens, targets)
        pu, lu, lossu = run(untied, p_untied, tokens, targets)
        gsum = pu["model.embed_tokens.weight"].grad + pu["lm_head.weight"].grad
        err, gerr = rel_err(lu, lt), rel_err(gsum, pt["model.embed_tokens.weight"].grad)
        others = max(rel_err(pu[n].grad, pt[n].grad) for n in pt if n != "model.embed_tokens.weight")
        expect(err < 1e-14 and gerr < 1e-12 and others < 1e-12,
               f"{v}: equals untied with a copied lm_head (logits {err:.1e}, embed grad {gerr:.1e}, others {others:.1e})")
        pad = pad_token(cfg)
        if pad is not None and pad in tokens.flatten().tolist():  # the padding row: the head's part only
            tied_row = pt["model.embed_tokens.weight"].grad[pad]
            head_row = pu["lm_head.weight"].grad[pad]
            expect(bool((pu["model.embed_tokens.weight"].grad[pad] == 0).all()) and float(head_row.abs().sum()) > 0
                   and rel_err(tied_row, head_row) < 1e-13,
                   f"{v}: the tied padding row {pad}'s gradient is the LM head's alone "
                   f"(rel err {rel_err(tied_row, head_row):.1e} against the untied lm_head row)")

    # 4b. The _swa windows change the model (a window that masked nothing would pass the
    #     comparisons above), and a window covering the sequence changes nothing.
    for v in (x for x in VARIANTS if x.endswith("_swa")):
        cfg, params32, tokens, targets = make_case(v)
        wide = dict(cfg, sliding_window=MAX_POS)
        none = dict(cfg, sliding_window=None, use_sliding_window=False) if "use_sliding_window" in cfg else None
        _, _, loss = run(cfg, params32, tokens, targets)
        _, _, loss_wide = run(wide, params32, tokens, targets)
        same = none is None or run(none, params32, tokens, targets)[2].item() == loss_wide.item()
        expect(abs(loss.item() - loss_wide.item()) > 1e-3 * abs(loss_wide.item()) and same,
               f"{v}: window {cfg['sliding_window']} changes the loss ({loss.item():.6f} vs "
               f"{loss_wide.item():.6f} with a window covering the sequence, = no window)")

    # 4b'. Qwen2-MoE's config.json spells layer_types out (transformers 5's Qwen2MoeConfig would
    #      derive another list): it names exactly the layers the use_sliding_window /
    #      max_window_layers rule (layer_window) slides.
    for v in (x for x in VARIANTS if "_qwen2moe" in x):
        cfg = hf_config(v)
        rule = ["sliding_attention" if layer_window(cfg, l) else "full_attention" for l in range(cfg["num_hidden_layers"])]
        expect(cfg["layer_types"] == rule, f"{v}: layer_types {cfg['layer_types']} = the max_window_layers "
               f"{cfg['max_window_layers']} rule's windows {[layer_window(cfg, l) for l in range(cfg['num_hidden_layers'])]}")

    # 4c. The padding row gets nothing from the lookup (untied: its gradient is 0, another
    #     looked-up row's is not; tied: exactly the LM head's part, checked in 4). Gemma 3: the
    #     local RoPE period and query_pre_attn_scalar each change the loss.
    padded = 0
    for v in VARIANTS:
        cfg, params32, tokens, targets = make_case(v)
        pad = pad_token(cfg)
        if cfg["tie_word_embeddings"] or pad is None or pad not in tokens.flatten().tolist():
            continue
        params, _, _ = run(cfg, params32, tokens, targets)
        g = params["model.embed_tokens.weight"].grad
        other = next(int(t) for t in tokens.flatten() if int(t) != pad)
        expect(bool((g[pad] == 0).all()) and float(g[other].abs().sum()) > 0,
               f"{v}: the padding row {pad} gets no gradient from the lookup")
        padded += 1
    expect(padded >= 2, f"{padded} untied variants look their padding token up (phi3, gemma3)")
    for v in (x for x in VARIANTS if x.endswith("gemma3") or "_gemma3_" in x):
        cfg, params32, tokens, targets = make_case(v)
        params, _, loss = run(cfg, params32, tokens, targets)
        same_rope = run(dict(cfg, rope_local_base_freq=cfg["rope_theta"]), params32, tokens, targets)[2]
        plain_scale = run(dict(cfg, query_pre_attn_scalar=head_dim(cfg)), params32, tokens, targets)[2]
        expect(abs(same_rope.item() - loss.item()) > 1e-4 and abs(plain_scale.item() - loss.item()) > 1e-4,
               f"{v}: the local RoPE period and query_pre_attn_scalar change the loss ({loss.item():.6f} vs "
               f"{same_rope.item():.6f}, {plain_scale.item():.6f})")

    # 4c'. Gemma 2: each soft-cap changes the loss (one of 0 would pass the comparisons above),
    #      and a cap far above every score or logit is no cap.
    for v in (x for x in VARIANTS if "_gemma2" in x):
        cfg, params32, tokens, targets = make_case(v)
        loss = run(cfg, params32, tokens, targets)[2].item()
        no_attn = run(dict(cfg, attn_logit_softcapping=None), params32, tokens, targets)[2].item()
        no_final = run(dict(cfg, final_logit_softcapping=None), params32, tokens, targets)[2].item()
        huge = run(dict(cfg, attn_logit_softcapping=1e9, final_logit_softcapping=1e9), params32, tokens,
                   targets)[2].item()
        none = run(dict(cfg, attn_logit_softcapping=None, final_logit_softcapping=None), params32,
                   tokens, targets)[2].item()
        expect(abs(no_attn - loss) > 1e-3 * loss and abs(no_final - loss) > 1e-3 * loss
               and abs(huge - none) < 1e-9 * none,
               f"{v}: the attention cap and the logit cap each change the loss ({loss:.6f}; without "
               f"the attention cap {no_attn:.6f}, without the logit cap {no_final:.6f}; caps of 1e9 "
               f"{huge:.9f} = none {none:.9f})")

    # 4d. SmolLM3's NoPE layer changes the model (with every layer rotating, the loss differs).
    for v in (x for x in VARIANTS if "_smollm3" in x):
        cfg, params32, tokens, targets = make_case(v)
        _, _, loss = run(cfg, params32, tokens, targets)
        rotating = dict(cfg, no_rope_layer_interval=cfg["num_hidden_layers"] + 1, use_sliding_window=False)
        nope_off = run(rotating, params32, tokens, targets)[2]
        window_off = run(dict(cfg, use_sliding_window=False), params32, tokens, targets)[2]
        expect(abs(nope_off.item() - window_off.item()) > 1e-4 and abs(window_off.item() - loss.item()) > 1e-4,
               f"{v}: the NoPE layer and its window each change the loss ({loss.item():.6f}; no window "
               f"{window_off.item():.6f}; every layer rotating, no window {nope_off.item():.6f})")

    # 4d'. OLMo 3: the global layer's scaling is its own (scaling every layer changes the loss).
    for v in (x for x in VARIANTS if "_olmo3" in x):
        cfg, params32, tokens, targets = make_case(v)
        loss = run(cfg, params32, tokens, targets)[2].item()
        scaled_all = run(dict(cfg, layer_types=["full_attention"] * cfg["num_hidden_layers"]),
                         params32, tokens, targets)[2].item()
        expect(abs(scaled_all - loss) > 1e-6, f"{v}: the sliding layers' unscaled RoPE and window change the loss "
               f"({loss:.8f} vs {scaled_all:.8f} with every layer global)")

    # 4e. Granite's multipliers each change the model.
    for v in (x for x in VARIANTS if "_granite" in x):
        cfg, params32, tokens, targets = make_case(v)
        loss = run(cfg, params32, tokens, targets)[2].item()
        for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
            other = run(dict(cfg, **{key: 1.0}), params32, tokens, targets)[2].item()
            # (the embedding's only through its share of the residual stream: RMSNorm is scale-free)
            expect(abs(other - loss) > 1e-6, f"{v}: {key} {cfg[key]} changes the loss ({loss:.8f} vs {other:.8f} at 1)")

    # 4f. Phi-3's LongRoPE: the factor list T picks and the cos/sin scale each change the
    #     loss; the partial variant's pass-through columns are not rotated (rotating them too
    #     changes the loss, and the frequencies are those of the 6 rotated columns).
    for v in (x for x in VARIANTS if "_longrope" in x):
        cfg, params32, tokens, targets = make_case(v)
        loss = run(cfg, params32, tokens, targets)[2].item()
        s = cfg["rope_scaling"]
        other_list = dict(s, short_factor=s["long_factor"], long_factor=s["short_factor"])
        swapped = run(dict(cfg, rope_scaling=other_list), params32, tokens, targets)[2].item()
        unscaled = run(dict(cfg, rope_scaling=dict(s, attention_factor=1.0)), params32, tokens, targets)[2].item()
        long = tokens.shape[1] > cfg["original_max_position_embeddings"]
        expect(abs(swapped - loss) > 1e-6 and abs(unscaled - loss) > 1e-6 and attention_scaling(cfg) > 1,
               f"{v}: the {'long' if long else 'short'} factors and the scale {attention_scaling(cfg):.6f} each "
               f"change the loss ({loss:.8f}; other list {swapped:.8f}; scale 1 {unscaled:.8f})")
        if "partial_rotary_factor" in cfg:
            n = head_dim(cfg) // 2
            full = dict(cfg, partial_rotary_factor=1.0,
                        rope_scaling=dict(s, short_factor=LONGROPE_SHORT[:n], long_factor=LONGROPE_LONG[:n]))
            whole = run(full, params32, tokens, targets)[2].item()
            base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, 6, 2, dtype=torch.float64) / 6))
            expect(rotary_dim(cfg) == 6 and abs(whole - loss) > 1e-6
                   and torch.equal(inv_freq(cfg, 7), base / torch.tensor(LONGROPE_LONG[:3], dtype=torch.float64)),
                   f"{v}: 6 of 8 columns rotated at 1 / theta^(2i/6) / long_factor; rotating all 8 changes the "
                   f"loss ({loss:.8f} vs {whole:.8f})")

    # 4g. Mixture of Experts: the routing is unambiguous (ROUTE_MARGIN) and covers every expert;
    #     finite differences of the loss w.r.t. entries of every router, of the three matrices of
    #     an expert layer 0 chose, and of layer 0's attention (Qwen2-MoE: also of layer 0's shared
    #     expert and of every shared_expert_gate), with the routing unchanged at every perturbed
    #     point; with K = E and the weights renormalised the block is the dense softmax-weighted
    #     sum of all the experts (Qwen2-MoE: plus the gated shared expert); norm_topk_prob and K
    #     each change the loss. Qwen2-MoE: with shared_expert_gate.weight zeros the shared expert
    #     adds exactly 0.5 * shared_expert(x) (sigmoid(0)), and removing it changes the loss.
    #     (The loss of the _aux variants is model_loss's total: cross-entropy + coef * aux.)
    #     GLM-4.5: the margins of glm_routing (the choice scores and the group scores, in float32,
    #     the same choices as the float64 forward's), the finite differences also of the shared
    #     experts and of e_score_correction_bias (0: it only chooses); the K = E block is
    #     sum_e rsf s_e / sum(s) expert_e + the shared experts; see 4g' for the rest.
    for v in (x for x in VARIANTS if x in MOE):
        cfg, params32, tokens, targets = make_case(v)
        E, K, C = num_experts(cfg), cfg["num_experts_per_tok"], cfg["hidden_size"]
        if deepseek_moe(cfg):
            r = glm_routing(cfg, params32, tokens)
            expect(r["margin"] >= ROUTE_MARGIN and r["group_margin"] >= ROUTE_MARGIN and r["covered"] and r["same"],
                   f"{v}: float32 routing margins: choice scores {r['margin']:.2e}, group scores "
                   f"{r['group_margin']:.2e} (n_group {cfg['n_group']}, topk_group {cfg['topk_group']}) >= "
                   f"{ROUTE_MARGIN:g} relative; every expert chosen in every sparse layer; the float64 forward's "
                   f"choices (E {E}, K {K}; router weights re-drawn {ROUTER_REDRAWS[v]} time(s))")
        else:
            margin, covered = routing_margin(cfg, router_probs(cfg, params32, tokens))
            expect(margin >= ROUTE_MARGIN and covered,
                   f"{v}: routing margin {margin:.2e} >= {ROUTE_MARGIN:g} relative, every expert chosen in every "
                   f"layer (E {E}, K {K}; router weights re-drawn {ROUTER_REDRAWS[v]} time(s))")
        params, _, loss = run(cfg, params32, tokens, targets)
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}

        def routed():  # (loss, each layer's chosen experts [B*T, K]) at the current base64
            probe = []
            value = model_loss(base64, cfg, tokens, targets, probe)[1].item()
            return value, [torch.topk(pr, K, dim=-1).indices for pr in probe]

        with torch.no_grad():
            routes = routed()[1]
            first = int(routes[0][0, 0])  # the expert token 0 puts first in the first sparse layer
            l0 = min(l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l))
            names = [n for n in base64 if n.endswith(".gate.weight") or ".router." in n]
            names += [n for n in base64 if n.startswith(f"{moe_prefix(cfg, l0)}experts.{first}.")]
            names += [n for n in base64 if (gptoss(cfg) or llama4(cfg)) and n.startswith(f"{moe_prefix(cfg, l0)}experts.")]  # (packed)
            names += [n for n in base64 if n.startswith(f"{moe_prefix(cfg, l0)}shared_expert.")]
            names += [n for n in base64 if n.endswith(".shared_expert_gate.weight")]
            names += [n for n in base64 if n.startswith(f"{moe_prefix(cfg, l0)}shared_experts.")]
            names += [n for n in base64 if n.endswith(".e_score_correction_bias")]
            names += [n for n in base64 if n.startswith("model.layers.0.self_attn.")]
            worst_abs, worst_rel, count, moved = routed_differences(
                base64, names, 3, routed, routes, params, rng)
        expect(moved == 0 and worst_abs < 1e-9 and worst_rel < 1e-6,
               f"{v}: finite differences of the {'total ' if aux_on(cfg) else ''}loss, {count} router / "
               f"{'packed experts (and router bias) / ' if gptoss(cfg) else 'packed experts / ' if llama4(cfg) else f'expert {first} / '}"
               f"{'shared expert / ' if shared_expert(cfg) else ''}"
               f"{'shared experts / router bias / ' if deepseek_moe(cfg) else ''}attention entries ({len(names)} "
               f"tensors): routing unchanged at all {4 * count} points ({moved} moved), worst abs err "
               f"{worst_abs:.1e}, rel err {worst_rel:.1e}")
        every = dict(cfg, num_experts_per_tok=E, norm_topk_prob=True)
        hx = torch.randn(B, T, C, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        x, (gate, up, down), err = hx.reshape(-1, C), expert_projs(cfg)[0], 0.0
        for l in (l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l)):
            m = moe_prefix(cfg, l)
            if llama4(cfg):  # the shared expert + every expert on x times its logit's sigmoid
                sg, ex = torch.sigmoid(x @ base64[m + "router.weight"].T), m + "experts."
                dense = shared_mlp(x, base64, m)
                for e in range(E):
                    g, u = ((x * sg[:, e:e + 1]) @ base64[ex + "gate_up_proj"][e]).chunk(2, dim=-1)
                    dense = dense + (u * g * torch.sigmoid(g)) @ base64[ex + "down_proj"][e]
                err = max(err, rel_err(moe_block(hx, base64, every, l).reshape(-1, C), dense))
                continue
            if gptoss(cfg):  # the softmax of the biased logits over all E, each expert's clamped SwiGLU and biases
                pr = (x @ base64[m + "router.weight"].T + base64[m + "router.bias"]).softmax(-1)
                ex = m + "experts."
                dense = sum(pr[:, e:e + 1] * (gptoss_glu(x @ base64[ex + "gate_up_proj"][e] + base64[ex + "gate_up_proj_bias"][e])
                                              @ base64[ex + "down_proj"][e] + base64[ex + "down_proj_bias"][e])
                            for e in range(E))
                err = max(err, rel_err(moe_block(hx, base64, every, l).reshape(-1, C), dense))
                continue
            pr = (x @ base64[m + "gate.weight"].T).softmax(-1)
            if deepseek_moe(cfg):  # every expert chosen whatever the groups: rsf * s / (sum s + 1e-20)
                sg = torch.sigmoid(x @ base64[m + "gate.weight"].T)
                pr = sg / (sg.sum(-1, keepdim=True) + 1e-20) * cfg["routed_scaling_factor"]
            if deepseek_v2(cfg):  # the softmax (summing to 1 with K = E) times routed_scaling_factor
                pr = pr * cfg["routed_scaling_factor"]
            ds_shared = deepseek_moe(cfg) or deepseek_v2(cfg)
            dense = shared_mlp(x, base64, m, "shared_experts.") if ds_shared else 0.0
            for e in range(E):
                ex = f"{m}experts.{e}."
                g = x @ base64[ex + gate + ".weight"].T
                dense = dense + pr[:, e:e + 1] * ((g * torch.sigmoid(g) * (x @ base64[ex + up + ".weight"].T))
                                                  @ base64[ex + down + ".weight"].T)
            if shared_expert(cfg):
                dense = dense + torch.sigmoid(x @ base64[m + "shared_expert_gate.weight"].T) * shared_mlp(x, base64, m)
            err = max(err, rel_err(moe_block(hx, base64, every, l).reshape(-1, C), dense))
        expect(err < 1e-14, f"{v}: with K = E = {E} the block is the shared expert plus every expert on its input "
               f"times the sigmoid of its router logit (rel err {err:.1e})" if llama4(cfg) else
               f"{v}: with K = E = {E} and renormalised weights"
               f"{' (DeepseekV2: never renormalised, the softmax of all E sums to 1)' if deepseek_v2(cfg) else ''} the block is the dense "
               f"{'sigmoid' if deepseek_moe(cfg) else 'softmax'}-weighted sum of all experts"
               f"{' plus the gated shared expert' if shared_expert(cfg) else ''}"
               f"{' (times routed_scaling_factor) plus the shared experts' if deepseek_moe(cfg) or deepseek_v2(cfg) else ''} "
               f"(rel err {err:.1e})")
        if shared_expert(cfg):
            # shared_expert_gate.weight zeros: sigmoid(0) = 0.5 exactly. With every routed expert's
            # down_proj zeroed too the block is exactly 0.5 * shared_expert(x); with the routed
            # experts kept, the routed block (shared down_proj zeroed) + 0.5 * shared_expert(x).
            exact, err, gates = True, 0.0, []
            for l in (l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l)):
                m = moe_prefix(cfg, l)
                half = 0.5 * shared_mlp(x, base64, m)
                zero_gate = dict(base64, **{m + "shared_expert_gate.weight": torch.zeros(1, C, dtype=torch.float64)})
                no_routed = dict(zero_gate, **{f"{m}experts.{e}.{down}.weight": torch.zeros_like(base64[f"{m}experts.{e}.{down}.weight"])
                                               for e in range(E)})
                exact = exact and torch.equal(moe_block(hx, no_routed, cfg, l).reshape(-1, C), half)
                no_shared = dict(base64, **{m + "shared_expert.down_proj.weight": torch.zeros_like(base64[m + "shared_expert.down_proj.weight"])})
                routed = moe_block(hx, no_shared, cfg, l).reshape(-1, C)
                err = max(err, rel_err(moe_block(hx, zero_gate, cfg, l).reshape(-1, C), routed + half))
                gates.append(torch.sigmoid(x @ base64[m + "shared_expert_gate.weight"].T))
            without = run(cfg, {n: (torch.zeros_like(t) if ".shared_expert.down_proj." in n else t)
                                for n, t in params32.items()}, tokens, targets)[2].item()
            spread = torch.cat(gates)
            expect(exact and err < 1e-14 and abs(without - loss.item()) > 1e-3,
                   f"{v}: shared_expert_gate zeros: the shared expert adds exactly 0.5 * shared_expert(x) "
                   f"(bit-equal with the routed experts zeroed; routed + 0.5 shared, rel err {err:.1e}); "
                   f"its sigmoid gates here {float(spread.min()):.3f}..{float(spread.max()):.3f}; without the shared "
                   f"expert the loss {without:.8f} vs {loss.item():.8f}")
        if deepseek_v2(cfg):  # DeepseekV2Moe ignores norm_topk_prob: true changes nothing, though
            flipped = run(dict(cfg, norm_topk_prob=True), params32, tokens, targets)  # the K weights sum < 1
            sums = torch.cat([torch.topk(pr, K, dim=-1).values.sum(-1) for pr in router_probs(cfg, params32, tokens)])
            expect(not cfg["norm_topk_prob"] and flipped[2].item() == loss.item()
                   and all(torch.equal(flipped[0][n].grad, params[n].grad) for n in params) and float(sums.max()) < 0.999,
                   f"{v}: norm_topk_prob true in the config changes nothing (loss and grads bit-equal), though the "
                   f"K chosen probabilities sum to {float(sums.min()):.3f}..{float(sums.max()):.3f}, not 1")
        elif qwen35moe(cfg):  # Qwen3VLMoeTextTopKRouter always renormalises: a norm_topk_prob key changes nothing
            sums = torch.cat([torch.topk(pr, K, dim=-1).values.sum(-1) for pr in router_probs(cfg, params32, tokens)])
            same = True
            for flag in (False, True):
                flipped = run(dict(cfg, norm_topk_prob=flag), params32, tokens, targets)
                same = same and flipped[2].item() == loss.item() and all(torch.equal(flipped[0][n].grad, params[n].grad)
                                                                         for n in params)
            expect("norm_topk_prob" not in cfg and renormalise(cfg) and same and float(sums.max()) < 0.999,
                   f"{v}: no norm_topk_prob in config.json, and norm_topk_prob false or true added to it changes nothing "
                   f"(loss and grads bit-equal): the K weights always renormalised, though the K chosen probabilities "
                   f"sum to {float(sums.min()):.3f}..{float(sums.max()):.3f}, not 1")
        elif cfg["model_type"] not in ("mixtral", "gpt_oss", "llama4_text"):  # (Mixtral's, GPT-OSS's weights are always
            # renormalised; Llama 4's the sigmoids, never)
            flipped = run(dict(cfg, norm_topk_prob=not cfg["norm_topk_prob"]), params32, tokens, targets)[2].item()
            expect(abs(flipped - loss.item()) > 1e-6,
                   f"{v}: norm_topk_prob {cfg['norm_topk_prob']} matters ({loss.item():.8f} vs {flipped:.8f})")
        more = run(dict(cfg, num_experts_per_tok=K + 1), params32, tokens, targets)[2].item()
        expect(abs(more - loss.item()) > 1e-6, f"{v}: K = {K} matters ({loss.item():.8f} vs {more:.8f} with K + 1)")

    # 4g'. GLM-4.5 (glm4moe) and DeepSeek-V3 (deepseekv3, the same MoE block): the layers' kinds
    #      (first_k_dense_replace); e_score_correction_bias
    #      changes some token's choice (and gets a zero gradient, checked in 2); with n_group > 1
    #      the group mask changes some token's choice and the loss; every chosen choice score is
    #      > 0 wherever a group is masked (so the masked 0.0 and a -inf choose alike here); the
    #      routed part scales exactly with routed_scaling_factor, which changes the loss; the
    #      shared experts are added ungated and unscaled (bit-equal with the routed experts
    #      zeroed) and change the loss; GLM-4.5: RoPE on 6 of 12 columns (rotating all 12 changes the
    #      loss; the llama3 variant's 3 frequencies take the untouched / smoothed / scaled branches).
    #      DeepSeek-V2 (deepseekv2, DeepseekV2Moe): the layers' kinds, the shared experts and
    #      routed_scaling_factor as above (no bias, no groups; its routing margins in 4g).
    for v in (x for x in VARIANTS if x in MOE and (deepseek_moe(hf_config(x)) or deepseek_v2(hf_config(x)))):
        cfg, params32, tokens, targets = make_case(v)
        E, K, C, L = num_experts(cfg), cfg["num_experts_per_tok"], cfg["hidden_size"], cfg["num_hidden_layers"]
        shapes = dict(param_shapes(cfg))
        kinds = ["sparse" if sparse_layer(cfg, l) else "dense" for l in range(L)]
        Is = expert_size(cfg) * cfg["n_shared_experts"]
        expect(all((f"model.layers.{l}.mlp.experts.{E - 1}.down_proj.weight" in shapes
                    and shapes[f"model.layers.{l}.mlp.shared_experts.gate_proj.weight"] == (Is, C)
                    and f"model.layers.{l}.mlp.gate_proj.weight" not in shapes) if kind == "sparse"
                   else shapes.get(f"model.layers.{l}.mlp.gate_proj.weight") == (cfg["intermediate_size"], C)
                   for l, kind in enumerate(kinds))
               and kinds == ["dense"] * cfg["first_k_dense_replace"] + ["sparse"] * (L - cfg["first_k_dense_replace"]),
               f"{v}: first_k_dense_replace {cfg['first_k_dense_replace']}: layers {', '.join(kinds)}")
        loss = run(cfg, params32, tokens, targets)[2].item()
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}
        if deepseek_moe(cfg):  # the router bias and the groups (DeepseekV2Moe's greedy top-K has neither)
            r = glm_routing(cfg, params32, tokens)
            expect(r["bias_moves"] > 0, f"{v}: e_score_correction_bias changes the choice of {r['bias_moves']} token(s) "
                   f"of {len(tokens.flatten()) * kinds.count('sparse')} (against a zero bias)")
            if cfg["n_group"] > 1:
                ungrouped = run(dict(cfg, topk_group=cfg["n_group"]), params32, tokens, targets)[2].item()
                expect(r["groups_move"] > 0 and abs(ungrouped - loss) > 1e-6,
                       f"{v}: keeping {cfg['topk_group']} of {cfg['n_group']} groups changes the choice of "
                       f"{r['groups_move']} token(s) and the loss ({loss:.8f} vs {ungrouped:.8f} with every group kept)")
            probe = []
            with torch.no_grad():
                forward(base64, cfg, tokens, probe)
            smallest = min(float(c.topk(K, dim=-1).values[:, -1].min()) for c in probe)
            expect(cfg["n_group"] == cfg["topk_group"] or smallest > 0,
                   f"{v}: the smallest chosen choice score {smallest:.4f}"
                   + (" > 0: no masked expert (0.0) is chosen, a -inf mask would choose alike"
                      if cfg["n_group"] > cfg["topk_group"] else " (no group masked)"))
        hx = torch.randn(B, T, C, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        x, rsf, exact, err = hx.reshape(-1, C), cfg["routed_scaling_factor"], True, 0.0
        for l in (l for l in range(L) if sparse_layer(cfg, l)):
            m = moe_prefix(cfg, l)
            shared = shared_mlp(x, base64, m, "shared_experts.")
            no_routed = dict(base64, **{f"{m}experts.{e}.down_proj.weight": torch.zeros(C, expert_size(cfg), dtype=torch.float64)
                                        for e in range(E)})
            exact = exact and torch.equal(moe_block(hx, no_routed, cfg, l).reshape(-1, C), shared)
            routed = moe_block(hx, base64, cfg, l).reshape(-1, C) - shared
            doubled = moe_block(hx, base64, dict(cfg, routed_scaling_factor=2 * rsf), l).reshape(-1, C) - shared
            err = max(err, rel_err(doubled, 2 * routed))
        no_shared = run(cfg, {n: (torch.zeros_like(t) if ".shared_experts.down_proj." in n else t)
                              for n, t in params32.items()}, tokens, targets)[2].item()
        rsf_doubled = run(dict(cfg, routed_scaling_factor=2 * rsf), params32, tokens, targets)[2].item()
        expect(exact and err < 1e-13 and abs(no_shared - loss) > 1e-3 and abs(rsf_doubled - loss) > 1e-3,
               f"{v}: the shared experts add their MLP ungated and unscaled (bit-equal with the routed experts "
               f"zeroed), without them the loss {no_shared:.8f} vs {loss:.8f}; the routed part scales with "
               f"routed_scaling_factor (x2: rel err {err:.1e}), routed_scaling_factor {2 * rsf:g} gives {rsf_doubled:.8f}")
        if not glm4moe(cfg):  # (DeepSeek-V3's attention: 4i)
            continue
        D, R = head_dim(cfg), rotary_dim(cfg)
        whole = run(dict(cfg, partial_rotary_factor=1.0), params32, tokens, targets)[2].item()
        base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
        branches = ([llama3_branch(cfg, w) for w in (2 * math.pi / base).tolist()]
                    if scaling_type(cfg["rope_scaling"]) == "llama3" else None)
        expect(D == 12 and R == 6 and abs(whole - loss) > 1e-6
               and (torch.equal(inv_freq(cfg), base) if branches is None else branches == ["untouched", "smoothed", "scaled"]),
               f"{v}: RoPE on {R} of {D} columns at 1 / theta^(2i/{R})"
               + (f" (llama3: {', '.join(branches)})" if branches else "")
               + f"; rotating all {D} changes the loss ({loss:.8f} vs {whole:.8f})")

    # 4i. DeepSeek-V3's Multi-head Latent Attention: the attention modules (names, shapes, which
    #     are biased); rope_interleave: the model equals the other layout with each rope block's
    #     rows permuted (q_proj's / q_b_proj's last dr rows of each head, kv_a_proj_with_mqa's
    #     last dr rows and bias entries): interleaved pair (2i, 2i+1) is rotate-half pair (i, i +
    #     dr/2), so the logits agree and the grads are the permuted ones; flipping rope_interleave
    #     alone changes the loss. The lora norms' eps 1e-6 (rms_norm_eps instead changes the loss);
    #     under yarn, mscale_all_dim 0 (no mscale^2, cos/sin 1 + 0.1 ln 4) changes the loss, and
    #     so does the mscale^2 softmax factor alone (the cos/sin scale pinned by attention_factor);
    #     pair 1's scaling (blended instead with original 4096) changes the loss.
    #     DeepSeek-V2 (no rope_interleave attribute: always pairs (2i, 2i+1)): its attention equals
    #     DeepseekV3Attention's rotate-half layout (rope_interleave false, mscale_all_dim 0: no
    #     mscale^2) with the rope rows permuted, and differs without the permutation; under yarn
    #     DeepseekV3's mscale^2 softmax factor is the V2 attention with q_b_proj times mscale^2 (q
    #     linear in it), which changes the loss; mscale_all_dim enters through the cos/sin scale
    #     alone (pinning that scale, mscale_all_dim 0 gives the same loss exactly).
    for v in (x for x in VARIANTS if x.endswith("_deepseekv3") or x.endswith("_deepseekv2")):
        cfg, params32, tokens, targets = make_case(v)
        H, C, ab = cfg["num_attention_heads"], cfg["hidden_size"], cfg["attention_bias"]
        dn, dr, dv, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
        D, qr = dn + dr, cfg["q_lora_rank"]
        shapes = dict(param_shapes(cfg))
        a = "model.layers.0.self_attn."
        want = ({a + "q_proj.weight": (H * D, C)} if qr is None else
                dict({a + "q_a_proj.weight": (qr, C), a + "q_a_layernorm.weight": (qr,), a + "q_b_proj.weight": (H * D, qr)},
                     **({a + "q_a_proj.bias": (qr,)} if ab else {})))
        want.update({a + "kv_a_proj_with_mqa.weight": (kvr + dr, C), a + "kv_a_layernorm.weight": (kvr,),
                     a + "kv_b_proj.weight": (H * (dn + dv), kvr), a + "o_proj.weight": (C, H * dv)})
        if ab:
            want.update({a + "kv_a_proj_with_mqa.bias": (kvr + dr,), a + "o_proj.bias": (C,)})
        got = {n: t for n, t in shapes.items() if n.startswith(a)}
        expect(got == want and list(got) == [n for n in got if n in want],
               f"{v}: attention modules {', '.join(n[len(a):] for n in got)}")
        params, logits, loss = run(cfg, params32, tokens, targets)
        loss = loss.item()
        # interleaved column 2i + j (j = 0, 1) is rotate-half column i + j dr/2: the other layout's
        # rows are rows[perm] with perm the de-interleaving order [0, 2, ..., 1, 3, ...]
        perm = torch.cat((torch.arange(0, dr, 2), torch.arange(1, dr, 2)))
        order = perm if rope_interleaved(cfg) else torch.argsort(perm)  # new rows = old rows[order]
        q_name = "q_proj" if qr is None else "q_b_proj"
        rows = {q_name: torch.cat([torch.cat((torch.arange(h * D, h * D + dn), h * D + dn + order)) for h in range(H)]),
                "kv_a_proj_with_mqa": torch.cat((torch.arange(kvr), kvr + order))}

        def permuted(n):  # the rows of n to take, or None
            for key, r in rows.items():
                if n.endswith(f"self_attn.{key}.weight") or n.endswith(f"self_attn.{key}.bias"):
                    return r
            return None
        other32 = {n: (t[permuted(n)] if permuted(n) is not None else t) for n, t in params32.items()}
        if deepseek_v2(cfg):
            sc = cfg["rope_scaling"]
            v3 = dict(cfg, model_type="deepseek_v3", rope_interleave=False,
                      rope_scaling=sc and dict(sc, mscale_all_dim=0.0))  # (mla_scale D^-1/2)
            base64 = {n: t.to(torch.float64) for n, t in params32.items()}
            other64 = {n: t.to(torch.float64) for n, t in other32.items()}
            hx = torch.randn(B, T, C, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
            freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cfg, T))
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos() * attention_scaling(cfg), emb.sin() * attention_scaling(cfg)
            causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
            errs, diffs = 0.0, float("inf")
            for l in range(cfg["num_hidden_layers"]):
                al = f"model.layers.{l}.self_attn."
                y2 = mla_attention(hx, base64, cfg, al, cos, sin, causal)
                errs = max(errs, rel_err(mla_attention(hx, other64, v3, al, cos, sin, causal), y2))
                diffs = min(diffs, rel_err(mla_attention(hx, base64, v3, al, cos, sin, causal), y2))
            expect(errs < 1e-14 and diffs > 1e-3 and "rope_interleave" not in cfg and rope_interleaved(cfg)
                   and mla_scale(cfg) == D ** -0.5,
                   f"{v}: every layer's attention (pairs (2i, 2i+1), softmax scale D^-1/2) equals DeepseekV3's "
                   f"rotate-half one (mscale_all_dim 0) with the rope rows of {q_name} and kv_a_proj_with_mqa"
                   f"{' (and its bias)' if ab else ''} permuted (rel err {errs:.1e}); without the permutation "
                   f"rel diff >= {diffs:.2e}")
            if sc is not None:
                m2 = get_mscale(sc["factor"], sc["mscale_all_dim"]) ** 2
                v3i = dict(cfg, model_type="deepseek_v3", rope_interleave=True)  # (its mla_scale D^-1/2 m2)
                scaled_q = dict(base64, **{n: t * m2 for n, t in base64.items() if n.endswith(f"self_attn.{q_name}.weight")})
                errs = max(rel_err(mla_attention(hx, scaled_q, cfg, f"model.layers.{l}.self_attn.", cos, sin, causal),
                                   mla_attention(hx, base64, v3i, f"model.layers.{l}.self_attn.", cos, sin, causal))
                           for l in range(cfg["num_hidden_layers"]))
                v3_logits, v3_loss = model_loss(scaled_q, cfg, tokens, targets)
                v3_loss, v3_dlogit = v3_loss.item(), float((v3_logits - logits).abs().max())
                expect(q_name == "q_b_proj" and errs < 1e-14 and abs(v3_loss - loss) > 1e-4 and v3_dlogit > 1e-2,
                       f"{v}: DeepseekV3's mscale^2 = {m2:.6f} softmax factor is the attention with {q_name} x mscale^2 "
                       f"(rel err {errs:.1e}), which gives the loss {v3_loss:.8f} vs {loss:.8f} (none), logits up to "
                       f"{v3_dlogit:.4f} apart")
        else:
            flipped = dict(cfg, rope_interleave=not cfg["rope_interleave"])
            po, lo, losso = run(flipped, other32, tokens, targets)
            gerr = 0.0
            for n in params:
                g = params[n].grad
                if permuted(n) is not None:
                    g = g[permuted(n)]
                gerr = max(gerr, rel_err(po[n].grad, g))
            moved = sum(1 for n in params32 if permuted(n) is not None and not torch.equal(other32[n], params32[n]))
            plain = run(flipped, params32, tokens, targets)[2].item()
            expect(rel_err(lo, logits) < 1e-14 and gerr < 1e-12 and moved == cfg["num_hidden_layers"] * (2 + ab)
                   and abs(plain - loss) > 1e-3,
                   f"{v}: rope_interleave {cfg['rope_interleave']} equals rope_interleave {not cfg['rope_interleave']} with "
                   f"the rope rows of {q_name} and kv_a_proj_with_mqa{' (and its bias)' if ab else ''} permuted "
                   f"(logits {rel_err(lo, logits):.1e}, grads {gerr:.1e}); without the permutation the loss "
                   f"{plain:.8f} vs {loss:.8f}")
        saved = LORA_EPS
        try:
            LORA_EPS = cfg["rms_norm_eps"]
            other_eps = run(cfg, params32, tokens, targets)[2].item()
        finally:
            LORA_EPS = saved
        norms = [n for n in shapes if n.endswith("_a_layernorm.weight")]
        expect(LORA_EPS == 1e-6 != cfg["rms_norm_eps"] and len(norms) == cfg["num_hidden_layers"] * (1 + (qr is not None))
               and abs(other_eps - loss) > 1e-7,
               f"{v}: the {len(norms)} lora norms ({', '.join(sorted(set(n.split('.')[-2] for n in norms)))}) use eps 1e-6, "
               f"not rms_norm_eps {cfg['rms_norm_eps']:g} (which gives {other_eps:.8f} vs {loss:.8f})")
        s = cfg["rope_scaling"]
        if s is None:
            continue
        no_mscale = run(dict(cfg, rope_scaling=dict(s, mscale_all_dim=0.0)), params32, tokens, targets)[2].item()
        pinned = dict(s, mscale_all_dim=0.0, attention_factor=attention_scaling(cfg))
        softmax_only = run(dict(cfg, rope_scaling=pinned), params32, tokens, targets)[2].item()
        blended = dict(s, original_max_position_embeddings=4096, attention_factor=attention_scaling(cfg))
        blend_loss = run(dict(cfg, rope_scaling=blended), params32, tokens, targets)[2].item()
        blend_ratio = (inv_freq(dict(cfg, rope_scaling=blended)) / inv_freq(dict(cfg, rope_scaling=None))).tolist()
        expect(abs(no_mscale - loss) > 1e-3 and abs(blend_loss - loss) > 1e-4
               and (softmax_only == loss if deepseek_v2(cfg) else abs(softmax_only - loss) > 1e-3)
               and mla_scale(dict(cfg, rope_scaling=pinned)) == D ** -0.5 and blend_ratio[0] == 1.0 and abs(blend_ratio[1] - 0.625) < 1e-15,
               f"{v}: mscale_all_dim {s['mscale_all_dim']:g} vs 0: loss {loss:.8f} vs {no_mscale:.8f}; "
               + ("mscale_all_dim 0 with the cos/sin scale pinned: the same loss exactly, "
                  f"{softmax_only:.15f} (no mscale^2 softmax factor)" if deepseek_v2(cfg) else
                  f"the mscale^2 softmax factor alone (cos/sin scale pinned): {softmax_only:.8f}")
               + f"; pair 1 half blended instead of / factor (original 4096): {blend_loss:.8f}")

    # 4h. The load-balancing loss (output_router_logits, the _aux variants). The function itself:
    #     E * sum_e f_e P_e is exactly K when the mean probabilities P are uniform (whatever the
    #     choices, here balanced ones, and all-zero logits through the softmax and topk path) or
    #     the choices balanced (whatever P), more when a skewed router keeps choosing the same
    #     experts. Per variant: the same logits as its twin (the same draws); with coef 0 its loss
    #     and grads are the twin's exactly; coef 0.1 adds 0.1 aux; the aux term's own gradient
    #     reaches every router and what is upstream of one, not the last layer's experts, the final
    #     norm or the untied head; finite differences of the aux term alone w.r.t. entries of every
    #     router and of layer 0's q_proj (routing unchanged at every perturbed point).
    N4, E4, K4 = 8, 4, 2
    uniform = torch.full((N4, E4), 1.0 / E4, dtype=torch.float64)
    balanced = torch.tensor([[n % E4, (n + 1) % E4] for n in range(N4)])
    lopsided = torch.tensor([[0, 1]] * N4)
    skewed = torch.tensor([3.0, 2.0, 0.0, 0.0], dtype=torch.float64).expand(N4, E4)
    random_p = torch.rand(N4, E4, generator=torch.Generator().manual_seed(2), dtype=torch.float64).softmax(-1)
    ids = {"uniform p, balanced choices": balance(uniform, balanced, E4).item(),
           "uniform p, lopsided choices": balance(uniform, lopsided, E4).item(),
           "zero logits (uniform softmax, tied topk)": load_balancing_loss([torch.zeros(N4, E4, dtype=torch.float64)], E4, K4).item(),
           "random p, balanced choices": balance(random_p, balanced, E4).item()}
    skew = load_balancing_loss([skewed], E4, K4).item()
    expect(all(value == K4 for name, value in ids.items() if not name.startswith("random"))
           and abs(ids["random p, balanced choices"] - K4) < 1e-15 and skew > K4 + 1,
           f"load-balancing loss (E {E4}, K {K4}, {N4} tokens): " + ", ".join(f"{name} {value!r}" for name, value in ids.items())
           + f" (= K); a skewed router, logits (3, 2, 0, 0) for every token: {skew:.6f} > K")
    aux_variants = [x for x in VARIANTS if aux_on(hf_config(x))]
    expect(len(aux_variants) >= 2 and all(seed_name(x) in VARIANTS or seed_name(x) in MOE for x in aux_variants),
           f"{len(aux_variants)} variants with the load-balancing loss, each with its twin (a fixture, or in MOE): "
           f"{', '.join(aux_variants)}")
    for v in aux_variants:
        cfg, params32, tokens, targets = make_case(v)
        twin_cfg, twin32, twin_tokens, twin_targets = make_case(seed_name(v))
        E, K, coef = num_experts(cfg), cfg["num_experts_per_tok"], cfg["router_aux_loss_coef"]
        same_draws = (torch.equal(tokens, twin_tokens) and torch.equal(targets, twin_targets)
                      and all(torch.equal(params32[n], twin32[n]) for n in twin32) and set(params32) == set(twin32))
        params, logits, loss = run(cfg, params32, tokens, targets)
        tparams, tlogits, tloss = run(twin_cfg, twin32, tokens, targets)
        zparams, zlogits, zloss = run(dict(cfg, router_aux_loss_coef=0.0), params32, tokens, targets)
        zero_same = zloss.item() == tloss.item() and all(torch.equal(zparams[n].grad, tparams[n].grad) for n in tparams)
        with torch.no_grad():
            got = []
            model_loss({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, targets, aux=got)
        lb = got[0].item()
        added = loss.item() - tloss.item()
        expect(same_draws and torch.equal(logits, tlogits) and zero_same and coef == AUX_COEF
               and abs(added - coef * lb) < 1e-13 and abs(added) > 1e-3,
               f"{v}: the draws and logits of {seed_name(v)}; coef 0 gives its loss {tloss.item():.15f} and grads "
               f"exactly; aux {lb:.15f} (K {K} at balance), coef {coef:g}: loss {loss.item():.15f} = "
               f"{tloss.item():.15f} + {added:.15f} (coef * aux {coef * lb:.15f})")
        # the aux term's own gradient
        p64 = {n: t.to(torch.float64).requires_grad_(True) for n, t in params32.items()}
        routers = []
        forward(p64, cfg, tokens, None, routers)
        load_balancing_loss(routers, E, K).backward()
        gnorm = {n: 0.0 if t.grad is None else float(t.grad.norm()) for n, t in p64.items()}
        last = max(l for l in range(cfg["num_hidden_layers"]) if sparse_layer(cfg, l))
        downstream = [n for n in p64 if n.startswith(f"{moe_prefix(cfg, last)}experts.")
                      or n in ("model.norm.weight", "lm_head.weight")]
        upstream = [n for n in p64 if n.endswith(".gate.weight") or ".router." in n
                    or n.startswith("model.layers.0.self_attn.") or n == "model.embed_tokens.weight"]
        expect(all(gnorm[n] == 0.0 for n in downstream) and min(gnorm[n] for n in upstream) > 1e-6,
               f"{v}: the aux term's gradient is 0 on the {len(downstream)} tensors after every router (the last "
               f"layer's experts, the final norm{', the head' if 'lm_head.weight' in p64 else ''}), non-zero on the "
               f"{len(upstream)} router, embedding and layer 0 attention tensors (smallest norm "
               f"{min(gnorm[n] for n in upstream):.2e})")
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}

        def aux_alone():  # (aux, each layer's chosen experts) at the current base64
            probe, rl = [], []
            forward(base64, cfg, tokens, probe, rl)
            return load_balancing_loss(rl, E, K).item(), [torch.topk(pr, K, dim=-1).indices for pr in probe]

        with torch.no_grad():
            routes = aux_alone()[1]
            names = [n for n in base64 if n.endswith(".gate.weight") or ".router." in n]
            names += ["model.layers.0.self_attn.q_proj.weight"]
            worst_abs, worst_rel, count, moved = routed_differences(
                base64, names, 4, aux_alone, routes, p64, rng)
        expect(moved == 0 and worst_abs < 1e-9 and worst_rel < 1e-6,
               f"{v}: finite differences of the aux term alone, {count} entries of {len(names) - 1} router tensor(s) and "
               f"layer 0's q_proj: routing unchanged at all {4 * count} points ({moved} moved), worst abs err "
               f"{worst_abs:.1e}, rel err {worst_rel:.1e}")

    # 4j. GPT-OSS (gptoss): the layer's parameters in state-dict order (self_attn.sinks, GptOssAttention's
    #     own, before the four biased projections; the router's weight and bias; the packed experts);
    #     layer_types spelled out as GptOssConfig's default rule, the window 3 on the even layers
    #     (a window covering the sequence changes the loss); the sink softmax against a loop-by-loop
    #     one on random scores, with rows summing to < 1, and sinks of -inf giving the plain softmax
    #     attention exactly (and another loss); the router's weights the softmax of the top-K logits
    #     = the E-way softmax renormalised over the K, and its bias changes the loss; every layer
    #     clamps routed gate values above +limit and up values beyond either bound (no routed value
    #     within GPTOSS_KINK_GAP of a kink), and without the clamps the loss differs; gate / up taken
    #     as gate_up's two halves instead of interleaved changes the loss; the yarn variant's
    #     untruncated correction range (truncate false) against the truncated one: other
    #     frequencies and another loss, the loop-by-loop frequencies agreeing with both; rope1e4's
    #     {"rope_type": "default"} is no scaling (bit-equal to rope_scaling null).
    for v in (x for x in VARIANTS if "_gptoss" in x):
        cfg, params32, tokens, targets = make_case(v)
        H, Hkv, D, C, L = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg), cfg["hidden_size"], cfg["num_hidden_layers"]
        E, K, I = num_experts(cfg), cfg["num_experts_per_tok"], expert_size(cfg)
        a, m = "model.layers.0.self_attn.", "model.layers.0.mlp."
        got = [(n, dims) for n, dims in param_shapes(cfg) if n.startswith("model.layers.0.")]
        want = [(a + "sinks", (H,))]
        for name, out, inp in (("q_proj", H * D, C), ("k_proj", Hkv * D, C), ("v_proj", Hkv * D, C), ("o_proj", C, H * D)):
            want += [(a + name + ".weight", (out, inp)), (a + name + ".bias", (out,))]
        want += [(m + "router.weight", (E, C)), (m + "router.bias", (E,)), (m + "experts.gate_up_proj", (E, C, 2 * I)),
                 (m + "experts.gate_up_proj_bias", (E, 2 * I)), (m + "experts.down_proj", (E, I, C)),
                 (m + "experts.down_proj_bias", (E, C)), ("model.layers.0.input_layernorm.weight", (C,)),
                 ("model.layers.0.post_attention_layernorm.weight", (C,))]
        expect(got == want, f"{v}: layer 0's parameters in state-dict order: " + ", ".join(n[len("model.layers.0."):] for n, _ in got))
        params, logits, loss = run(cfg, params32, tokens, targets)
        loss = loss.item()
        rule = ["sliding_attention" if (l + 1) % 2 else "full_attention" for l in range(L)]
        wide = run(dict(cfg, sliding_window=MAX_POS), params32, tokens, targets)[2].item()
        expect(cfg["layer_types"] == rule and [layer_window(cfg, l) for l in range(L)] == [SWA_WINDOW if r == rule[0] else 0 for r in rule]
               and abs(wide - loss) > 1e-3,
               f"{v}: layer_types {rule} (GptOssConfig's rule), windows {[layer_window(cfg, l) for l in range(L)]}; a window "
               f"covering the sequence gives {wide:.8f} vs {loss:.8f}")
        # the sink softmax, vectorised against loops, on random q, k, v and the windowed mask
        g = torch.Generator().manual_seed(5)
        q, k, vv = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
        sinks = params32[a + "sinks"].to(torch.float64)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        visible = causal & ~torch.tril(torch.ones(T, T, dtype=torch.bool), -SWA_WINDOW)
        fast = sink_attention(q, k, vv, sinks, visible, D ** -0.5)
        err, sums = 0.0, []
        for b in range(B):
            for hd in range(H):
                for t in range(T):
                    seen = [s for s in range(T) if t - SWA_WINDOW < s <= t]
                    sc = [float(torch.dot(q[b, hd, t], k[b, hd, s])) / math.sqrt(D) for s in seen]
                    top = max(sc + [float(sinks[hd])])
                    ws = [math.exp(x - top) for x in sc]
                    z = sum(ws) + math.exp(float(sinks[hd]) - top)
                    sums.append(sum(ws) / z)
                    slow = sum(w / z * vv[b, hd, s] for w, s in zip(ws, seen))
                    err = max(err, float((slow - fast[b, hd, t]).abs().max()) / float(fast.abs().max()))
        plain = (((q @ k.transpose(-1, -2)) * D ** -0.5).masked_fill(~visible, float("-inf")).softmax(-1)) @ vv
        no_sink = sink_attention(q, k, vv, torch.full((H,), float("-inf"), dtype=torch.float64), visible, D ** -0.5)
        minus_inf = {n: (torch.full_like(t, float("-inf")) if n.endswith(".sinks") else t) for n, t in params32.items()}
        with torch.no_grad():
            sinkless = model_loss({n: t.to(torch.float64) for n, t in minus_inf.items()}, cfg, tokens, targets)[1].item()
        expect(err < 1e-14 and max(sums) < 1 and torch.equal(no_sink, plain) and abs(sinkless - loss) > 1e-3,
               f"{v}: the sink softmax equals a loop-by-loop one (rel err {err:.1e}; its rows sum to {min(sums):.4f}.."
               f"{max(sums):.4f} < 1); sinks of -inf give the plain softmax attention exactly and the loss "
               f"{sinkless:.8f} vs {loss:.8f} (sinks {', '.join(f'{x:.3f}' for x in params32[a + 'sinks'].tolist())})")
        # the router
        routers, probe = [], []
        with torch.no_grad():
            forward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, probe, routers)
        werr = 0.0
        for lg, pr in zip(routers, probe):
            top, idx = torch.topk(lg, K, dim=-1)
            renorm = pr.gather(1, idx) / pr.gather(1, idx).sum(-1, keepdim=True)
            werr = max(werr, rel_err(top.softmax(-1), renorm))
        unbiased = run(cfg, {n: (torch.zeros_like(t) if n.endswith(".router.bias") else t) for n, t in params32.items()},
                       tokens, targets)[2].item()
        expect(werr < 1e-14 and abs(unbiased - loss) > 1e-3,
               f"{v}: the K weights softmax(top-K logits) = the E-way softmax renormalised over the K (rel err "
               f"{werr:.1e}); zero router biases give {unbiased:.8f} vs {loss:.8f}")
        # the clamps
        c = gptoss_clamps(cfg, params32, tokens)
        saved = GPTOSS_LIMIT
        try:
            GPTOSS_LIMIT = 1e9
            unclamped = run(cfg, params32, tokens, targets)[2].item()
        finally:
            GPTOSS_LIMIT = saved
        expect(clamps_ok(c) and min(c["gate_high"] + c["up_high"] + c["up_low"]) >= GPTOSS_MIN_CLAMPED
               and c["gap"] >= GPTOSS_KINK_GAP and abs(unclamped - loss) > 1e-3,
               f"{v}: clamped per layer, of {c['pairs']} routed (token, expert) pairs x {I}: gate > {GPTOSS_LIMIT:g} "
               f"{c['gate_high']}, up > {GPTOSS_LIMIT:g} {c['up_high']}, up < -{GPTOSS_LIMIT:g} {c['up_low']}; the nearest "
               f"routed pre-activation {c['gap']:.4f} from a kink (>= {GPTOSS_KINK_GAP:g}); gate_up_proj_bias re-drawn "
               f"{CLAMP_REDRAWS[v]} time(s); without the clamps the loss {unclamped:.8f} vs {loss:.8f}")
        try:
            GPTOSS_CHUNKED = True
            chunked = run(cfg, params32, tokens, targets)[2].item()
            p2 = {n: t.to(torch.float64).requires_grad_(True) for n, t in params32.items()}
            chunked_naive = naive_loss(p2, cfg, tokens, targets).item()
        finally:
            GPTOSS_CHUNKED = False
        expect(abs(chunked - loss) > 1e-3 and abs(chunked_naive - chunked) < 1e-12 * abs(chunked),
               f"{v}: gate / up as gate_up's halves instead of its even / odd columns gives {chunked:.8f} (the "
               f"loop-by-loop model alike, {chunked_naive:.8f}) vs {loss:.8f}")
        s = cfg["rope_scaling"]
        if scaling_type(s) == "default":
            base_cfg = dict(cfg, rope_scaling=None)
            expect(torch.equal(inv_freq(cfg), inv_freq(base_cfg)) and attention_scaling(cfg) == 1.0
                   and run(base_cfg, params32, tokens, targets)[2].item() == loss,
                   f"{v}: rope_scaling {json.dumps(s)} is no scaling (frequencies, scale and loss those of null)")
            continue
        base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
        truncated = dict(cfg, rope_scaling=dict(s, truncate=True))
        lo, hi = yarn_range(cfg)
        ramp = [min(max((i - lo) / (hi - lo), 0.0), 1.0) for i in range(D // 2)]
        f = s["factor"]
        want = [b / f * r + b * (1 - r) for b, r in zip(base.tolist(), ramp)]
        agree = all(max(abs(x - y) for x, y in zip(naive_frequencies(c2, D, T)[0], inv_freq(c2).tolist())) < 1e-15
                    for c2 in (cfg, truncated))
        t_loss = run(truncated, params32, tokens, targets)[2].item()
        t_ramp = ((1 - inv_freq(truncated) / base) / (1 - 1 / f)).tolist()  # (inv = base (1 - r + r / f))
        print(f"{v}: yarn range untruncated ({lo:.6f}, {hi:.6f}), ramp {[round(r, 6) for r in ramp]}; truncated "
              f"{yarn_range(truncated)}, ramp {[round(r, 6) for r in t_ramp]}")
        expect(s["truncate"] is False and cfg["max_position_embeddings"] / s["original_max_position_embeddings"] == f
               and 0 < lo < 1 and 2 < hi < 3 and yarn_range(truncated) == (0, 3)
               and max(abs(x - y) for x, y in zip(want, inv_freq(cfg).tolist())) < 1e-15
               and [round(r, 3) for r in ramp] == [0.0, 0.173, 0.616, 1.0, 1.0, 1.0]
               and max(abs(x - y) for x, y in zip(t_ramp, [0, 1 / 3, 2 / 3, 1, 1, 1])) < 1e-14
               and not torch.equal(inv_freq(cfg), inv_freq(truncated)) and agree
               and abs(attention_scaling(cfg) - (1 + 0.1 * math.log(f))) < 1e-15 and abs(t_loss - loss) > 1e-5,
               f"{v}: yarn with truncate false: range ({lo:.3f}, {hi:.3f}), pair 0 kept, 1 and 2 blended, 3 to 5 / "
               f"factor {f:g} (= max_position_embeddings / original); truncated (0, 3) blends 1 and 2 by 1/3 and 2/3 "
               f"instead and gives the loss {t_loss:.8f} vs {loss:.8f}; the loop-by-loop frequencies agree with both; "
               f"cos/sin x 1 + 0.1 ln {f:g}")

    # 4k. Llama 4 (llama4, Llama4ForCausalLM): the spelled-out lists of the config are
    #     Llama4TextConfig's own rules (moe_layers, no_rope_layers, layer_types) and the layers'
    #     parameters in state-dict order (feed_forward: experts.gate_up_proj, experts.down_proj,
    #     router, shared_expert; the dense layers' MLP intermediate_size_mlp wide). Attention: the
    #     chunk mask's masked softmax against a loop-by-loop one on random q, k, v (the whole model's
    #     loop-by-loop twin in 2), a chunk >= T the plain causal mask exactly (the loss with every
    #     layer "full_attention"), the variant's chunk another loss; adjacent-pair RoPE equal to
    #     complex multiplication (view_as_complex) and to rotate-half with each head's q / k rows
    #     de-interleaved (logits, permuted grads), rotate-half on the same rows another loss; the
    #     llama3 branches; the L2 norm (each head's mean square ms / (ms + eps), commuting with RoPE)
    #     on the RoPE layers only (use_qk_norm flipped, or the norm on the NoPE layer too: other
    #     losses); the NoPE layer's temperature scales (1 at t = 0, > 1 after with floor_scale 2;
    #     exactly 1 with floor_scale > T: the loss without tuning, bit-equal; no tuning another
    #     loss; with no NoPE layer tuning changes nothing). MoE: the chosen experts' sigmoid scores
    #     (not renormalised: < 1 with K = 1) scale each expert's input (its output instead: another
    #     loss); gate / up the two halves of gate_up (interleaved: another loss; the loop-by-loop
    #     model alike under each alternative); the shared expert unscaled (bit-equal with the routed
    #     experts zeroed) and changing the loss.
    for v in (x for x in VARIANTS if "_llama4" in x):
        cfg, params32, tokens, targets = make_case(v)
        L, H, Hkv, D, C = (cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
                           head_dim(cfg), cfg["hidden_size"])
        E, I, chunk, eps = num_experts(cfg), expert_size(cfg), cfg["attention_chunk_size"], cfg["rms_norm_eps"]
        step, interval = cfg["interleave_moe_layer_step"], cfg["no_rope_layer_interval"]
        no_rope = [int((l + 1) % interval != 0) for l in range(L)]
        kinds = ["sparse" if sparse_layer(cfg, l) else "dense" for l in range(L)]
        expect(cfg["moe_layers"] == list(range(step - 1, L, step)) and cfg["no_rope_layers"] == no_rope
               and cfg["layer_types"] == ["chunked_attention" if r else "full_attention" for r in no_rope]
               and [uses_rope(cfg, l) for l in range(L)] == [bool(r) for r in no_rope]
               and [uses_rope(dict(cfg, no_rope_layers=None), l) for l in range(L)] == [bool(r) for r in no_rope]
               and [chunked_layer(cfg, l) for l in range(L)] == [bool(r) for r in no_rope]
               and kinds == ["sparse" if l in cfg["moe_layers"] else "dense" for l in range(L)],
               f"{v}: moe_layers {cfg['moe_layers']} (interleave_moe_layer_step {step}: {', '.join(kinds)}), "
               f"no_rope_layers {no_rope} (interval {interval}), layer_types {cfg['layer_types']}: Llama4TextConfig's rules")
        want = []
        for l in range(L):
            a, f, w = f"model.layers.{l}.self_attn.", f"model.layers.{l}.feed_forward.", cfg["intermediate_size_mlp"]
            want += [(a + "q_proj.weight", (H * D, C)), (a + "k_proj.weight", (Hkv * D, C)),
                     (a + "v_proj.weight", (Hkv * D, C)), (a + "o_proj.weight", (C, H * D))]
            if sparse_layer(cfg, l):
                want += [(f + "experts.gate_up_proj", (E, C, 2 * I)), (f + "experts.down_proj", (E, I, C)),
                         (f + "router.weight", (E, C))]
                f, w = f + "shared_expert.", I
            want += [(f + "gate_proj.weight", (w, C)), (f + "up_proj.weight", (w, C)), (f + "down_proj.weight", (C, w)),
                     (f"model.layers.{l}.input_layernorm.weight", (C,)),
                     (f"model.layers.{l}.post_attention_layernorm.weight", (C,))]
        got = [(n, dims) for n, dims in param_shapes(cfg) if n.startswith("model.layers.")]
        ls = cfg["moe_layers"][0]
        expect(got == want, f"{v}: the layers' parameters in state-dict order; sparse layer {ls}: "
               + ", ".join(f"{n[len(f'model.layers.{ls}.'):]} {list(dims)}" for n, dims in got if n.startswith(f"model.layers.{ls}.")))
        params, logits, loss = run(cfg, params32, tokens, targets)
        loss = loss.item()
        # the chunked mask: vectorised against loops on random q, k, v
        g = torch.Generator().manual_seed(6)
        q, k, vv = (torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))
        vis = chunk_visible(T, chunk)
        fast = ((q @ k.transpose(-1, -2)) / math.sqrt(D)).masked_fill(~vis, float("-inf")).softmax(-1) @ vv
        err, hidden = 0.0, 0
        for b in range(B):
            for hd in range(H):
                for t in range(T):
                    seen = [j for j in range(t + 1) if j // chunk == t // chunk]
                    hidden += t + 1 - len(seen)
                    sc = [float(torch.dot(q[b, hd, t], k[b, hd, j])) / math.sqrt(D) for j in seen]
                    top = max(sc)
                    ws = [math.exp(x - top) for x in sc]
                    slow = sum(wj / sum(ws) * vv[b, hd, j] for wj, j in zip(ws, seen))
                    err = max(err, float((slow - fast[b, hd, t]).abs().max()) / float(fast.abs().max()))
        full = run(dict(cfg, layer_types=["full_attention"] * L), params32, tokens, targets)[2].item()
        wide = [run(dict(cfg, attention_chunk_size=c), params32, tokens, targets)[2].item() for c in (T, MAX_POS)]
        expect(err < 1e-14 and hidden > 0 and all(x == full for x in wide) and abs(full - loss) > 1e-3,
               f"{v}: chunk {chunk}: the masked softmax equals a loop-by-loop one keeping keys j <= t with j // {chunk} == "
               f"t // {chunk} (rel err {err:.1e}; {hidden // (B * H)} of the {T * (T + 1) // 2} causal pairs hidden); chunks "
               f"{T} and {MAX_POS} (>= T) give the loss of every layer full_attention exactly ({full:.15f}), chunk "
               f"{chunk} {loss:.15f}")
        # adjacent-pair RoPE
        x = torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
        inv = inv_freq(cfg)
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
        cplx = torch.view_as_real(torch.view_as_complex(x.reshape(B, H, T, D // 2, 2).contiguous())
                                  * torch.polar(torch.ones_like(freqs), freqs)).flatten(-2)
        cerr = rel_err(rotate_pairs(x, inv), cplx)
        perm = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))  # pair (2i, 2i+1) -> (i, i + D/2)
        qrows, krows = (torch.cat([hd * D + perm for hd in range(n)]) for n in (H, Hkv))

        def deinterleaved(n):  # the rows of n to take, or None
            return qrows if n.endswith(".q_proj.weight") else krows if n.endswith(".k_proj.weight") else None
        other32 = {n: (t[deinterleaved(n)] if deinterleaved(n) is not None else t) for n, t in params32.items()}
        try:
            LLAMA4_ALT["rotate_half"] = True
            po, lo, _ = run(cfg, other32, tokens, targets)
            half = run(cfg, params32, tokens, targets)[2].item()
            half_naive = naive_loss({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, targets).item()
        finally:
            LLAMA4_ALT["rotate_half"] = False
        gerr = max(rel_err(po[n].grad, params[n].grad[deinterleaved(n)] if deinterleaved(n) is not None else params[n].grad)
                   for n in params)
        expect(cerr < 1e-15 and rel_err(lo, logits) < 1e-13 and gerr < 1e-11 and abs(half - loss) > 1e-3
               and abs(half_naive - half) < 1e-12 * abs(half),
               f"{v}: RoPE on adjacent pairs (2i, 2i+1) = complex multiplication by exp(i t inv_freq) (rel err {cerr:.1e}) "
               f"= rotate-half with each head's q_proj / k_proj rows de-interleaved (logits {rel_err(lo, logits):.1e}, "
               f"grads {gerr:.1e}); rotate-half on the same rows gives {half:.8f} (loop-by-loop alike) vs {loss:.8f}")
        if scaling_type(cfg["rope_scaling"]) == "llama3":
            base = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
            branches = [llama3_branch(cfg, wl) for wl in (2 * math.pi / base).tolist()]
            unscaled = run(dict(cfg, rope_scaling=None), params32, tokens, targets)[2].item()
            expect(branches == ["untouched", "smoothed", "scaled", "scaled"] and abs(unscaled - loss) > 1e-5,
                   f"{v}: llama3 frequencies {', '.join(branches)}; rope_scaling null gives {unscaled:.8f} vs {loss:.8f}")
        # the L2 norm
        y = l2_norm(x, eps)
        ms = (x * x).mean(-1)
        nerr = rel_err((y * y).mean(-1), ms / (ms + eps))
        commute = rel_err(l2_norm(rotate_pairs(x, inv), eps), rotate_pairs(l2_norm(x, eps), inv))
        flipped = run(dict(cfg, use_qk_norm=not cfg["use_qk_norm"]), params32, tokens, targets)[2].item()
        nope = [l for l in range(L) if not uses_rope(cfg, l)]
        everywhere = loss
        if nope and cfg["use_qk_norm"]:
            try:
                LLAMA4_ALT["qk_norm_nope"] = True
                everywhere = run(cfg, params32, tokens, targets)[2].item()
            finally:
                LLAMA4_ALT["qk_norm_nope"] = False
        expect(nerr < 1e-14 and commute < 1e-14 and abs(flipped - loss) > 1e-3
               and (abs(everywhere - loss) > 1e-3 if nope and cfg["use_qk_norm"] else True),
               f"{v}: use_qk_norm {cfg['use_qk_norm']}: each head's mean square after the L2 norm ms / (ms + eps) (rel err "
               f"{nerr:.1e}), the norm commuting with the rotation (rel err {commute:.1e}); use_qk_norm "
               f"{not cfg['use_qk_norm']} gives {flipped:.8f} vs {loss:.8f}"
               + (f"; the norm on the NoPE layer(s) {nope} too {everywhere:.8f}" if nope and cfg["use_qk_norm"] else ""))
        # the temperature
        scales = temperature_scales(cfg, T).tolist()
        untuned = run(dict(cfg, attn_temperature_tuning=False), params32, tokens, targets)[2].item()
        floored_cfg = dict(cfg, attn_temperature_tuning=True, floor_scale=T + 1)
        floored = run(floored_cfg, params32, tokens, targets)[2].item()
        if nope:
            expect(cfg["attn_temperature_tuning"] and scales[0] == 1.0 and min(scales[1:]) > 1.0
                   and abs(untuned - loss) > 1e-3 and floored == untuned
                   and temperature_scales(floored_cfg, T).tolist() == [1.0] * T,
                   f"{v}: the NoPE layer(s) {nope}: query scales {', '.join(f'{x:.6f}' for x in scales)} (floor_scale "
                   f"{cfg['floor_scale']}, attn_scale {cfg['attn_scale']:g}); without tuning {untuned:.8f} vs {loss:.8f}; "
                   f"floor_scale {T + 1} > T: every scale exactly 1, the loss of no tuning exactly")
        else:
            tuned = run(dict(cfg, attn_temperature_tuning=True, floor_scale=2, attn_scale=0.5), params32, tokens, targets)[2].item()
            expect(tuned == untuned == loss, f"{v}: no NoPE layer: attn_temperature_tuning (floor_scale 2, attn_scale 0.5) "
                   f"changes nothing ({tuned:.15f})")
        # the MoE block: scores, input scaling, chunked gate / up, the shared expert
        probe, routers = [], []
        with torch.no_grad():
            forward({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, probe, routers)
        chosen = torch.cat([torch.sigmoid(torch.topk(lg, cfg["num_experts_per_tok"], dim=-1).values).flatten() for lg in routers])
        alts = {}
        for key in ("scale_output", "gate_up_interleaved"):
            try:
                LLAMA4_ALT[key] = True
                alts[key] = (run(cfg, params32, tokens, targets)[2].item(),
                             naive_loss({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, targets).item())
            finally:
                LLAMA4_ALT[key] = False
        hx = torch.randn(B, T, C, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}
        exact = True
        for l in cfg["moe_layers"]:
            m = moe_prefix(cfg, l)
            no_routed = dict(base64, **{m + "experts.down_proj": torch.zeros_like(base64[m + "experts.down_proj"])})
            exact = exact and torch.equal(moe_block(hx, no_routed, cfg, l).reshape(-1, C), shared_mlp(hx.reshape(-1, C), base64, m))
        no_shared = run(cfg, {n: (torch.zeros_like(t) if ".shared_expert.down_proj." in n else t) for n, t in params32.items()},
                        tokens, targets)[2].item()
        expect(0 < float(chosen.min()) and float(chosen.max()) < 0.999
               and all(abs(a - loss) > 1e-3 and abs(b - a) < 1e-12 * abs(a) for a, b in alts.values())
               and exact and abs(no_shared - loss) > 1e-3,
               f"{v}: the chosen experts' scores sigmoid(logit) {float(chosen.min()):.4f}..{float(chosen.max()):.4f} (K "
               f"{cfg['num_experts_per_tok']}, not renormalised); the score on each expert's output instead of its input "
               f"gives {alts['scale_output'][0]:.8f}, gate / up interleaved instead of chunked {alts['gate_up_interleaved'][0]:.8f} "
               f"(the loop-by-loop model alike) vs {loss:.8f}; the shared expert alone (bit-equal) with the routed experts "
               f"zeroed, without it {no_shared:.8f}")

    # 4l. Qwen3.5 (qwen35, Qwen3_5ForCausalLM): the state dict per layer_types (linear_attn's or
    #     self_attn's modules, never both); the gated delta rule against HF's chunked algorithm
    #     (chunked_gated_delta_rule, chunk 64) on T = 70 > one chunk, outputs and input gradients;
    #     the short convolution: K = 1 is silu(w x), K = 4 the sum over the taps of the tokens t - 3
    #     .. t (nothing later: causal); finite differences of the loss on every A_log and dt_bias
    #     element and on conv1d / in_proj_a / in_proj_b / norm entries; the gates non-trivial (exp(g)
    #     and beta spread over (0, 1)); RoPE on 6 of 12 columns (all 12 change the loss); the full
    #     attention layer with its gate rows zeroed (sigmoid 0.5) and o_proj doubled equals
    #     Qwen3ForCausalLM's attention (the generic path, partial_rotary_factor 0.5, the 1 + w
    #     norms passed as plain weights) on the query rows.
    for v in (x for x in VARIANTS if "_qwen35" in x):
        cfg, params32, tokens, targets = make_case(v)
        L, C = cfg["num_hidden_layers"], cfg["hidden_size"]
        names = list(params32)
        kinds_ok = all((any(n.startswith(f"model.layers.{l}.linear_attn.") for n in names)
                        == (cfg["layer_types"][l] == "linear_attention"))
                       and (any(n.startswith(f"model.layers.{l}.self_attn.") for n in names)
                            == (cfg["layer_types"][l] == "full_attention")) for l in range(L))
        expect(kinds_ok and [n for n, _ in param_shapes(cfg)] == names and rotary_dim(cfg) == 6 and head_dim(cfg) == 12
               and torch.equal(inv_freq(qwen35_rope(cfg)), 1.0 / (10000.0 ** (torch.arange(0, 6, 2, dtype=torch.float64) / 6))),
               f"{v}: layer_types {cfg['layer_types']}: each layer's token mixer (linear_attn or self_attn) alone in the "
               f"state dict; RoPE on {rotary_dim(cfg)} of {head_dim(cfg)} columns at 1 / 1e4^(2i/6)")
        params, _, loss = run(cfg, params32, tokens, targets)
        loss = loss.item()
        whole = run(dict(cfg, rope_parameters=dict(cfg["rope_parameters"], partial_rotary_factor=1.0)),
                    params32, tokens, targets)[2].item()
        expect(abs(whole - loss) > 1e-6, f"{v}: rotating all 12 columns changes the loss ({loss:.8f} vs {whole:.8f})")
        linear_layers = [l for l in range(L) if cfg["layer_types"][l] == "linear_attention"]
        full_layers = [l for l in range(L) if cfg["layer_types"][l] == "full_attention"]
        if L == 1 and full_layers:  # the gated attention against Qwen3's with the gate at 0.5
            H, D = cfg["num_attention_heads"], head_dim(cfg)
            a = "model.layers.0.self_attn."
            rows = torch.arange(H * 2 * D).view(H, 2, D)
            q3 = dict(other_arch_config("qwen3", 1, "mqa" if cfg["num_key_value_heads"] == 1 else "gqa",
                                        "tied" if cfg["tie_word_embeddings"] else "untied", "rope1e4", set()),
                      partial_rotary_factor=0.5)
            assert q3["num_key_value_heads"] == cfg["num_key_value_heads"]
            plain = {n: (1.0 + t.to(torch.float64) if n.endswith("norm.weight") else t) for n, t in params32.items()}
            plain[a + "q_proj.weight"] = params32[a + "q_proj.weight"][rows[:, 0].flatten()]
            plain[a + "o_proj.weight"] = params32[a + "o_proj.weight"] * 0.5
            gated = dict(params32)
            gated[a + "q_proj.weight"] = params32[a + "q_proj.weight"].clone()
            gated[a + "q_proj.weight"][rows[:, 1].flatten()] = 0.0
            l_gated, l_plain = run(cfg, gated, tokens, targets)[2].item(), run(q3, plain, tokens, targets)[2].item()
            expect(abs(l_gated - l_plain) < 1e-13 * abs(l_plain) and abs(l_gated - loss) > 1e-3,
                   f"{v}: the gate rows (each head's second {D} of q_proj's {2 * D}) zeroed: sigmoid 0.5 times the heads = "
                   f"Qwen3ForCausalLM's attention on the query rows with o_proj halved ({l_gated:.15f} vs {l_plain:.15f}; "
                   f"the drawn gate gives {loss:.8f})")
        # float32: the same forward / backward in float32 (torch's, on this CPU) against the fixture's
        # float64, in units of tests/test_llama.cpp's bounds (logits and loss 1e-5 relative, each
        # gradient tensor 1e-5 |grad| + 1e-6); and the float64 sensitivity make_case bounds
        p32g = {n: t.clone().requires_grad_(True) for n, t in params32.items()}
        logits32, loss32 = model_loss(p32g, cfg, tokens, targets)
        loss32.backward()
        logits64 = model_loss({n: t.to(torch.float64) for n, t in params32.items()}, cfg, tokens, targets)[0]
        f32_logits = rel_err(logits32.detach().to(torch.float64), logits64) / 1e-5
        f32_grads = max((float((p32g[n].grad.to(torch.float64) - params[n].grad).norm())
                         / (1e-5 * float(params[n].grad.norm()) + 1e-6), n) for n in params)
        sens = perturbation_sensitivity(cfg, params32, tokens, targets)
        expect(logits32.dtype == torch.float32 and f32_logits < 1 and f32_grads[0] < 1 and abs(loss32.item() - loss) < 1e-5 * loss
               and sens <= QWEN35_SENSITIVITY,
               f"{v}: float32 forward / backward within tests/test_llama.cpp's bounds: logits {f32_logits:.2f}, worst "
               f"gradient {f32_grads[0]:.2f} of them ({f32_grads[1]}); float64 sensitivity to float32-sized perturbations "
               f"{sens:.3f} <= {QWEN35_SENSITIVITY} (linear_attn re-drawn {LINEAR_REDRAWS[v]} time(s))")
        if not linear_layers:
            continue
        # the gates of the linear layers: spread over (0, 1)
        base64 = {n: t.to(torch.float64) for n, t in params32.items()}
        decays, betas = [], []
        with torch.no_grad():
            x = torch.nn.functional.embedding(tokens, base64["model.embed_tokens.weight"])
            for l in range(L):  # (the linear layers' inputs: run the layers in order)
                pre = f"model.layers.{l}."
                h = rms_norm(x, 1.0 + base64[pre + "input_layernorm.weight"], cfg["rms_norm_eps"])
                if l in linear_layers:
                    a = pre + "linear_attn."
                    decays.append(torch.exp(-torch.exp(base64[a + "A_log"]) * torch.nn.functional.softplus(
                        h @ base64[a + "in_proj_a.weight"].T + base64[a + "dt_bias"])).flatten())
                    betas.append(torch.sigmoid(h @ base64[a + "in_proj_b.weight"].T).flatten())
                    x = x + gated_deltanet(h, base64, cfg, a)
                else:
                    cos_sin_cfg = qwen35_rope(cfg)
                    fr = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq(cos_sin_cfg))
                    emb = torch.cat((fr, fr), dim=-1)
                    x = x + gated_attention(h, base64, cfg, pre + "self_attn.", emb.cos(), emb.sin(),
                                            torch.tril(torch.ones(T, T, dtype=torch.bool)))
                h = rms_norm(x, 1.0 + base64[pre + "post_attention_layernorm.weight"], cfg["rms_norm_eps"])
                if sparse_layer(cfg, l):  # (Qwen3.5-MoE's sparse block)
                    x = x + moe_block(h, base64, cfg, l)
                    continue
                g = h @ base64[pre + "mlp.gate_proj.weight"].T
                x = x + (g * torch.sigmoid(g) * (h @ base64[pre + "mlp.up_proj.weight"].T)) @ base64[pre + "mlp.down_proj.weight"].T
            again = model_loss(base64, cfg, tokens, targets)[1].item()
        decays, betas = torch.cat(decays), torch.cat(betas)
        expect(abs(again - loss) < 1e-14 * abs(loss) and float(decays.min()) < 0.1 and float(decays.max()) > 0.9
               and float(betas.min()) < 0.1 and float(betas.max()) > 0.9,
               f"{v}: the linear layers' decays exp(g) {float(decays.min()):.4f}..{float(decays.max()):.4f}, beta "
               f"{float(betas.min()):.4f}..{float(betas.max()):.4f} (A_log, dt_bias U(-1, 1))")
        # finite differences on the gates and the short convolution
        rng_q = random.Random(35)
        picked = []
        for l in linear_layers:
            a = f"model.layers.{l}.linear_attn."
            picked += [(a + "A_log", i) for i in range(base64[a + "A_log"].numel())]
            picked += [(a + "dt_bias", i) for i in range(base64[a + "dt_bias"].numel())]
            for n, count in (("conv1d.weight", 8), ("in_proj_a.weight", 6), ("in_proj_b.weight", 4), ("norm.weight", 3)):
                picked += [(a + n, rng_q.randrange(base64[a + n].numel())) for _ in range(count)]
        h_step, worst_abs, worst_rel = 1e-4, 0.0, 0.0
        with torch.no_grad():
            for n, i in picked:
                flat = base64[n].view(-1)
                old, f = flat[i].item(), {}
                for step in (h_step, -h_step, h_step / 2, -h_step / 2):
                    flat[i] = old + step
                    f[step] = model_loss(base64, cfg, tokens, targets)[1].item()
                flat[i] = old
                numeric = (4 * (f[h_step / 2] - f[-h_step / 2]) / h_step - (f[h_step] - f[-h_step]) / (2 * h_step)) / 3
                analytic = params[n].grad.view(-1)[i].item()
                worst_abs = max(worst_abs, abs(numeric - analytic))
                worst_rel = max(worst_rel, abs(numeric - analytic) / max(abs(analytic), 1e-4))
        expect(worst_abs < 1e-9 and worst_rel < 1e-6,
               f"{v}: finite differences of the loss on {len(picked)} linear_attn entries (every A_log and dt_bias, "
               f"conv1d, in_proj_a, in_proj_b, norm): worst abs err {worst_abs:.1e}, worst rel err {worst_rel:.1e}")

    # 4m. Qwen3.5-MoE (qwen35moe, Qwen3_5MoeForCausalLM): config.json without the attributes the class
    #     deletes (intermediate_size, decoder_sparse_step, norm_topk_prob, mlp_only_layers), every layer
    #     sparse; and qwen35's layers exactly: with every expert of a layer a copy of one SwiGLU MLP and
    #     the shared expert's down_proj zeroed, the model is Qwen3_5ForCausalLM (qwen35) with that MLP
    #     (intermediate_size = moe_intermediate_size) -- the renormalised K weights sum to 1 whatever the
    #     routing (the K chosen probabilities alone do not: 4g) -- in loss, logits and every gradient
    #     (the dense MLP's the sum of the experts' copies; the routers' and shared_expert_gate's ~0).
    for v in (x for x in VARIANTS if "_qwen35moe" in x):
        cfg, params32, tokens, targets = make_case(v)
        L, E, Im = cfg["num_hidden_layers"], num_experts(cfg), expert_size(cfg)
        absent = [k for k in ("intermediate_size", "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers") if k in cfg]
        expect(not absent and all(sparse_layer(cfg, l) for l in range(L)) and renormalise(cfg) and shared_expert(cfg)
               and cfg["architectures"] == ["Qwen3_5MoeForCausalLM"] and not aux_on(cfg),
               f"{v}: config.json has no {', '.join(absent) or 'intermediate_size, decoder_sparse_step, norm_topk_prob, mlp_only_layers'}"
               f"; all {L} layers sparse (E {E}, K {cfg['num_experts_per_tok']}, experts {Im} wide, shared expert "
               f"{cfg['shared_expert_intermediate_size']}), always renormalised, no aux loss")
        dense_cfg = dict(cfg, model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], intermediate_size=Im)
        copies, dense = dict(params32), {}
        for n, t in params32.items():
            if ".mlp." not in n:
                dense[n] = t
        for l in range(L):
            m = f"model.layers.{l}.mlp."
            for proj in ("gate_proj", "up_proj", "down_proj"):
                one = params32[f"{m}experts.0.{proj}.weight"]
                dense[f"{m}{proj}.weight"] = one
                for e in range(E):
                    copies[f"{m}experts.{e}.{proj}.weight"] = one.clone()
            copies[m + "shared_expert.down_proj.weight"] = torch.zeros_like(params32[m + "shared_expert.down_proj.weight"])
        dense = {n: dense[n] for n, _ in param_shapes(dense_cfg)}  # (its state-dict order)
        pm, lm, lossm = run(cfg, copies, tokens, targets)
        pd, ld, lossd = run(dense_cfg, dense, tokens, targets)
        gerr, quiet = 0.0, 0.0
        for n in pd:
            if ".mlp." in n:  # the dense MLP's gradient: the sum of its E copies'
                l, proj = n.split(".")[2], n.split(".")[-2]
                got = sum(pm[f"model.layers.{l}.mlp.experts.{e}.{proj}.weight"].grad for e in range(E))
            else:
                got = pm[n].grad
            gerr = max(gerr, rel_err(got, pd[n].grad))
        scale = max(float(t.grad.norm()) for t in pm.values())
        for n in pm:
            if n.endswith(".mlp.gate.weight") or n.endswith(".shared_expert_gate.weight"):
                quiet = max(quiet, float(pm[n].grad.norm()) / scale)
        own_loss = run(cfg, params32, tokens, targets)[2].item()
        expect(abs(lossm.item() - lossd.item()) < 1e-13 * abs(lossd.item()) and rel_err(lm, ld) < 1e-13 and gerr < 1e-10
               and quiet < 1e-13 and abs(own_loss - lossd.item()) > 1e-3,
               f"{v}: every expert a copy of one MLP, the shared expert's down_proj zeroed: Qwen3_5ForCausalLM with that "
               f"MLP (loss {lossm.item():.15f} vs {lossd.item():.15f}, logits {rel_err(lm, ld):.1e}, grads {gerr:.1e}, "
               f"the dense MLP's the sum of the copies'; routers' and shared_expert_gate's {quiet:.1e} of the largest); "
               f"the drawn experts give {own_loss:.8f}")

    # the gated delta rule: the recurrence against HF's chunked algorithm on T = 70 (two chunks of 64)
    gen_q = torch.Generator().manual_seed(3535)
    Bq, Tq, Hq, Dkq, Dvq = 2, 70, 4, 8, 6
    qq = torch.randn(Bq, Tq, Hq, Dkq, generator=gen_q, dtype=torch.float64).requires_grad_(True)
    kq = torch.randn(Bq, Tq, Hq, Dkq, generator=gen_q, dtype=torch.float64).requires_grad_(True)
    vq = torch.randn(Bq, Tq, Hq, Dvq, generator=gen_q, dtype=torch.float64).requires_grad_(True)
    a_log = torch.rand(Hq, generator=gen_q, dtype=torch.float64) * 2 - 1
    gq = (-torch.exp(a_log) * torch.nn.functional.softplus(
        torch.randn(Bq, Tq, Hq, generator=gen_q, dtype=torch.float64) * 1.5 + torch.rand(Hq, generator=gen_q, dtype=torch.float64) * 2 - 1)
          ).requires_grad_(True)
    bq = torch.sigmoid(torch.randn(Bq, Tq, Hq, generator=gen_q, dtype=torch.float64) * 1.5).requires_grad_(True)
    cot = torch.randn(Bq, Tq, Hq, Dvq, generator=gen_q, dtype=torch.float64)
    rec = gated_delta_rule(qq, kq, vq, gq, bq)
    grads_rec = torch.autograd.grad((rec * cot).sum(), (qq, kq, vq, gq, bq))
    chk = chunked_gated_delta_rule(qq, kq, vq, gq, bq, 64)
    grads_chk = torch.autograd.grad((chk * cot).sum(), (qq, kq, vq, gq, bq))
    gerr = max(rel_err(x, y) for x, y in zip(grads_chk, grads_rec))
    chk7 = chunked_gated_delta_rule(qq[:, :7], kq[:, :7], vq[:, :7], gq[:, :7], bq[:, :7], 4)
    expect(rel_err(chk, rec) < 1e-12 and gerr < 1e-12 and rel_err(chk7, rec[:, :7]) < 1e-12
           and float(torch.exp(gq).min()) < 0.05 and float(torch.exp(gq).max()) > 0.95,
           f"gated delta rule (B 2, T 70, 4 heads, Dk 8, Dv 6; exp(g) {float(torch.exp(gq).min()):.3f}.."
           f"{float(torch.exp(gq).max()):.3f}): the token-by-token recurrence = HF's chunked algorithm with chunk 64 "
           f"(two chunks, the second padded) to {rel_err(chk, rec):.1e} (input grads {gerr:.1e}); T 7 in chunks of 4 "
           f"{rel_err(chk7, rec[:, :7]):.1e}")
    # the short convolution: K = 1, K = 4 against the taps, causality
    xc = torch.randn(2, 9, 5, generator=gen_q, dtype=torch.float64)
    w1 = torch.randn(5, 1, 1, generator=gen_q, dtype=torch.float64)
    one = causal_conv_silu(xc, w1)
    w4 = torch.randn(5, 1, 4, generator=gen_q, dtype=torch.float64)
    taps = torch.nn.functional.silu(sum(w4[:, 0, j] * torch.nn.functional.pad(xc, (0, 0, 3 - j, 0))[:, :9] for j in range(4)))
    moved = xc.clone()
    moved[:, 5] += 1.0
    diff = (causal_conv_silu(moved, w4) - causal_conv_silu(xc, w4)).abs().amax(dim=(0, 2))
    expect(rel_err(one, torch.nn.functional.silu(xc * w1[:, 0, 0])) < 1e-15
           and rel_err(causal_conv_silu(xc, w4), taps) < 1e-14
           and float(diff[:5].max()) == 0.0 and float(diff[5:].min()) > 0.0,
           "short convolution: K = 1 is silu(w x) (rel err "
           f"{rel_err(one, torch.nn.functional.silu(xc * w1[:, 0, 0])):.1e}); K = 4 is silu(sum_j w[:, 0, j] x[t - 3 + j]) "
           f"over the taps before t, zeros before 0 ({rel_err(causal_conv_silu(xc, w4), taps):.1e}); a change at t = 5 "
           f"moves the outputs from t = 5 on only")

    # 5. The fixture text parses back to the run's numbers.
    v = VARIANTS[0]
    text = fixture_text(v)
    cfg, params32, _, _ = make_case(v)
    got = {}
    for line in text.splitlines():
        w = line.split()
        if w[0] == "param":
            vals = torch.tensor([float(s) for s in w[3:]], dtype=torch.float32)
            got[w[1]] = int(w[2]) == vals.numel() and torch.equal(vals, params32[w[1]].flatten())
    expect(set(got) == set(params32) and all(got.values()), f"{v}: param text is exactly the float32 params")
    lines = text.splitlines()
    g = next(i for i, line in enumerate(lines) if line.startswith("grad "))
    w = lines[g].split()
    j = max(range(3, len(w)), key=lambda k: abs(float(w[k])))  # its largest value

    def changed(by):
        words = w[:j] + [f"{float(w[j]) * (1 + by):.9e}"] + w[j + 1:]
        return "\n".join(lines[:g] + [" ".join(words)] + lines[g + 1:]) + "\n"

    nudged, broken = changed(2e-10), changed(1e-6)
    assert nudged != text
    expect(compare_text(text, nudged) is None and compare_text(text, broken) is not None,
           "--check's comparison accepts a last-printed-digit change of a grad and rejects a 1e-6 one")

    print(f"selftest: {len(fails)} failure(s)")
    return not fails


def main(argv):
    torch.set_num_threads(1)  # one summation order: reproducible text
    if len(argv) == 2 and argv[1] == "--list":
        print("\n".join(VARIANTS))
        return 0
    if len(argv) == 2 and argv[1] == "--selftest":
        return 0 if selftest() else 1
    if len(argv) in (2, 3) and argv[1] == "--check":
        return 0 if check(argv[2] if len(argv) == 3 else DATA_DIR) else 1
    if len(argv) == 2 and argv[1] in VARIANTS:
        sys.stdout.write(fixture_text(argv[1]))
        return 0
    print("usage: llama_reference.py VARIANT | --list | --check [DIR] | --selftest\n"
          "variants: " + " ".join(VARIANTS), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
