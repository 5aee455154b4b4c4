#!/usr/bin/env python3
"""tools/hf_check.py: fsdp_merge's output loads in Hugging Face transformers and gives our loss.

For GPT-2 (GPT2LMHeadModel, byte-level causal LM), T5 (T5ForConditionalGeneration, ByT5
bytes, seq2seq; gated-gelu untied and relu tied), Qwen2ForCausalLM, Qwen3ForCausalLM,
MistralForCausalLM, Olmo2ForCausalLM, Olmo3ForCausalLM, Phi3ForCausalLM, Gemma3ForCausalLM,
SmolLM3ForCausalLM, GraniteForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM,
OlmoeForCausalLM, Qwen2MoeForCausalLM, Glm4MoeForCausalLM, DeepseekV3ForCausalLM,
DeepseekV2ForCausalLM, GptOssForCausalLM, Llama4ForCausalLM, Qwen3_5ForCausalLM,
Qwen3_5MoeForCausalLM (LLAMA_CASES below)
and Llama (LlamaForCausalLM, causal LM on the
same bytes with a 300-token vocabulary, padded by fsdp_train to 384 rows; two cases, both
grouped-query attention (4 query heads, 2 K/V heads) and RoPE theta 5e5 with Llama 3.1's llama3
scaling set so that its three branches (kept, smoothed, scaled) all occur: untied with
head_dim 8 != hidden_size / heads (48 / 4), and tied with q/k/v/o and MLP biases): prepares a
small real-text data set with fsdp_prepare, trains 3 steps with fsdp_train on 2 CPU ranks (FULL_SHARD; the last step
evaluates the whole validation split), merges the final checkpoint with fsdp_merge, loads the
merged directory with `<Class>.from_pretrained` and computes the validation loss the way
fsdp_train defines it (docs/data.md: summed cross-entropy over every target token of the
split / number of target tokens), in float64 on the CPU. Passes when it equals the run's
final val_loss within 1e-5 relative. That checks the names, layouts, config.json and the
architecture against transformers itself (tests/test_t5.cpp checks T5 against our own torch
reading of modeling_t5.py, tools/t5_reference.py; tests/test_llama.cpp Llama against
tools/llama_reference.py's).

Needs python3 with torch and transformers (the GPU machine has both; tools/gpu_check.sh runs
this with the bundle's binaries), and fsdp_prepare, fsdp_train, fsdp_merge, mpirun on PATH
after sourcing --env (the bundle's env.sh; omit when they already are).
  hf_check.py [--env gpu_bundle/env.sh] [--work DIR] [--impl hf|reference] [--only WORDS]
              [--bin-dir DIR]
--impl reference replaces transformers by our own readings of it (T5: tools/t5_reference.py's
TinyT5; GPT-2: tests/check_merge.py's numpy forward; Llama: tools/llama_reference.py's
forward), for trying the script where transformers is missing (ctest tools_hf_check_reference
does so on the CPU machine, with torch 1.13). --only runs the cases whose name holds one of the
comma-separated words (e.g. --only llama); --bin-dir puts DIR (fsdp_prepare, fsdp_train,
fsdp_merge) first on PATH. Prints one markdown table row per case; exit 0 all passed, 1 a
mismatch or failure, 77 torch (or, impl hf, transformers) missing.
"""
import argparse
import json
import math
import os
import shlex
import shutil
import struct
import subprocess
import sys
import tempfile

TOL = 1e-5
BIN_DIR = ""  # --bin-dir
# The Llama cases (check_llama): name -> [model] keys besides the shared ones of LLAMA_COMMON.
# RoPE: head_dim 8 at theta 1e4 has wavelengths 2 pi / inv_freq of ~6.3, ~63, ~628, ~6283;
# original 128 with low 1 / high 4 puts the bounds at 128 and 32, so they are kept, smoothed,
# scaled, scaled (max_position_embeddings above original, as transformers expects), and over
# the 32 positions of a window the smoothed and scaled angles differ from unscaled ones by up
# to ~1.5 rad. initializer_range 0.3 (not 0.02) makes the attention of the 3-step model sharp,
# so that a wrong RoPE, GQA head mapping or norm changes the loss far beyond the tolerance.
LLAMA_COMMON = {"vocab_size": 300, "intermediate_size": 64, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
                "rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 128},
                "initializer_range": 0.3}
# "type" (default llama) is model.type, HF's model_type: Qwen2 adds its q/k/v biases, Qwen3 its
# per-head q/k RMSNorms (with head_dim 12 != 32 / 4), Mistral its sliding window (here 1024,
# covering every sequence), OLMo 2 its output norms; each through AutoModelForCausalLM and its
# own config.json.
LLAMA_CASES = {
    "llama gqa untied llama3": {"hidden_size": 48, "head_dim": 8, "tie_word_embeddings": False},
    "llama gqa tied llama3 biases": {"hidden_size": 32, "tie_word_embeddings": True,
                                     "attention_bias": True, "mlp_bias": True},
    "qwen2 gqa untied llama3": {"type": "qwen2", "hidden_size": 32, "tie_word_embeddings": False},
    "qwen3 gqa tied llama3 head_dim": {"type": "qwen3", "hidden_size": 32, "head_dim": 12,
                                       "tie_word_embeddings": True},
    "mistral gqa untied llama3": {"type": "mistral", "hidden_size": 32, "sliding_window": 1024,
                                  "tie_word_embeddings": False},
    # A window of 8 over the 32-token rows: transformers' sliding-window mask.
    "mistral gqa tied window 8": {"type": "mistral", "hidden_size": 32, "sliding_window": 8,
                                  "tie_word_embeddings": True},
    # OLMo 2: the norms on the sublayers' outputs and q/k norms over whole rows (Olmo2Config
    # has no head_dim: 32 / 4 = 8).
    "olmo2 gqa untied llama3": {"type": "olmo2", "hidden_size": 32, "tie_word_embeddings": False},
    # Phi-3 (Phi-3-mini, Phi-4): q/k/v in one qkv_proj and gate/up in one gate_up_proj, no
    # head_dim (32 / 4 = 8), a window of 8 over the 32-token rows, no rope scaling.
    "phi3 gqa untied window 8": {"type": "phi3", "hidden_size": 32, "sliding_window": 8,
                                 "tie_word_embeddings": False,
                                 "rope_scaling": {"rope_type": "default"}},
    # Phi-4-mini's RoPE: 6 of each head's 8 columns rotated (partial_rotary_factor 0.75), and
    # LongRoPE's long factors (the 32-token rows exceed original 16), cos and sin scaled by
    # sqrt(1 + ln(1024 / 16) / ln 16); tied, as Phi-4-mini.
    "phi3 gqa tied longrope partial": {"type": "phi3", "hidden_size": 32,
                                       "partial_rotary_factor": 0.75,
                                       "original_max_position_embeddings": 16,
                                       "rope_scaling": {"rope_type": "longrope",
                                                        "short_factor": [1.0, 1.5, 2.0],
                                                        "long_factor": [2.0, 4.0, 8.0]},
                                       "tie_word_embeddings": True},
    # Gemma 3 (Gemma3ForCausalLM, model_type gemma3_text): (1 + w) norms, four a layer, and
    # per-head q/k norms; the embedding scaled by sqrt(32); GeGLU; scores scaled by 10^-1/2;
    # layers sliding (window 8, local RoPE period 1e4) then global (rope_theta 1e6 with
    # Gemma 3 4B's linear scaling); head_dim 12 != 32 / 4; tied; the space byte as padding row.
    "gemma3 gqa tied window 8 linear": {"type": "gemma3_text", "hidden_size": 32, "head_dim": 12,
                                        "rope_theta": 1e6,
                                        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                                        "query_pre_attn_scalar": 10, "sliding_window": 8,
                                        "sliding_window_pattern": 2, "pad_token_id": 32,
                                        "tie_word_embeddings": True},
    # Gemma 2 (Gemma2ForCausalLM): Gemma 3's layer without q/k norms, every even layer sliding
    # (window 8), one RoPE; scores and logits tanh soft-capped at 2 and 5 (small enough to bend
    # this model's values; Gemma 2's are 50 and 30); untied; the space byte as padding row.
    "gemma2 gqa untied window 8 softcaps": {"type": "gemma2", "hidden_size": 32, "head_dim": 12,
                                            "query_pre_attn_scalar": 10, "sliding_window": 8,
                                            "attn_logit_softcapping": 2.0,
                                            "final_logit_softcapping": 5.0, "pad_token_id": 32,
                                            "tie_word_embeddings": False},
    # Gemma 1 (GemmaForCausalLM): Llama's layer with (1 + w) norms, the scaled embedding and
    # GeGLU; head_dim 12 != 32 / 4; tied; the space byte as padding row.
    "gemma gqa tied": {"type": "gemma", "hidden_size": 32, "head_dim": 12, "pad_token_id": 32,
                       "tie_word_embeddings": True},
    # EXAONE 4: OLMo 2's layer with per-head q/k norms; the first layer slides over 8
    # positions with RoPE (LLAMA_COMMON's llama3 scaling), the second is global without RoPE.
    "exaone4 gqa untied window 8": {"type": "exaone4", "hidden_size": 32, "head_dim": 12,
                                    "sliding_window": 8, "sliding_window_pattern": 2,
                                    "tie_word_embeddings": False},
    # SmolLM3: no RoPE on every 2nd layer (NoPE), which slides over 8 positions; tied.
    "smollm3 gqa tied nope window 8": {"type": "smollm3", "hidden_size": 32,
                                       "no_rope_layer_interval": 2, "use_sliding_window": True,
                                       "sliding_window": 8, "tie_word_embeddings": True},
    # Granite: the embedding, residual branches, scores and logits multiplied as Granite 3's
    # (multipliers of its size: 12, 0.22, 1/128 would flatten the 3-step model; these do not).
    "granite gqa untied multipliers": {"type": "granite", "hidden_size": 32,
                                       "embedding_multiplier": 3.0, "residual_multiplier": 0.5,
                                       "attention_multiplier": 0.2, "logits_scaling": 4.0,
                                       "tie_word_embeddings": False},
    # Mixture of experts: 4 SwiGLU experts a layer, each token routed to 2 (Qwen3-MoE: per-head
    # q/k norms, head_dim 12, experts 24 wide, the top-2 weights renormalised; Mixtral: always
    # renormalised, a window of 8, tied; OLMoE: whole-row q/k norms, not renormalised).
    "qwen3_moe gqa untied 4 experts": {"type": "qwen3_moe", "hidden_size": 32, "head_dim": 12,
                                       "num_experts": 4, "num_experts_per_tok": 2,
                                       "moe_intermediate_size": 24, "norm_topk_prob": True,
                                       "tie_word_embeddings": False},
    "mixtral gqa tied window 8 4 experts": {"type": "mixtral", "hidden_size": 32,
                                            "num_local_experts": 4, "num_experts_per_tok": 2,
                                            "sliding_window": 8, "tie_word_embeddings": True},
    "olmoe gqa untied 4 experts": {"type": "olmoe", "hidden_size": 32, "num_experts": 4,
                                   "num_experts_per_tok": 2, "tie_word_embeddings": False},
    # Qwen2-MoE: Qwen2's q/k/v biases, the routed experts and a sigmoid-gated shared expert.
    "qwen2_moe gqa untied 4 experts shared": {"type": "qwen2_moe", "hidden_size": 32,
                                              "num_experts": 4, "num_experts_per_tok": 2,
                                              "moe_intermediate_size": 24,
                                              "shared_expert_intermediate_size": 28,
                                              "tie_word_embeddings": False},
    # GLM-4.5 (Glm4MoeForCausalLM): q/k/v biases (o_proj none), half of each 12-wide head
    # rotated; layer 0 dense, layer 1 sparse with DeepSeek-V3's sigmoid routing over 8 experts
    # in 4 groups (the best 2 kept), weights scaled by 2.5, and an ungated shared expert.
    "glm4_moe gqa untied 8 experts 4 groups": {"type": "glm4_moe", "hidden_size": 32,
                                               "head_dim": 12, "attention_bias": True,
                                               "n_routed_experts": 8, "num_experts_per_tok": 2,
                                               "moe_intermediate_size": 24, "n_group": 4,
                                               "topk_group": 2, "routed_scaling_factor": 2.5,
                                               "n_shared_experts": 1,
                                               "first_k_dense_replace": 1,
                                               "tie_word_embeddings": False},
    # DeepSeek-V3 (DeepseekV3ForCausalLM): GLM-4.5's sparse block with Multi-head Latent
    # Attention: queries compressed to 16, keys and values to 24, heads of 8 + 8 columns (the
    # rope pairs interleaved), values 12 wide; LLAMA_COMMON's llama3 scaling on the rope part.
    "deepseek_v3 mla 8 experts 4 groups": {"type": "deepseek_v3", "hidden_size": 32,
                                           "q_lora_rank": 16, "kv_lora_rank": 24,
                                           "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                                           "v_head_dim": 12, "n_routed_experts": 8,
                                           "num_experts_per_tok": 2,
                                           "moe_intermediate_size": 24, "n_group": 4,
                                           "topk_group": 2, "first_k_dense_replace": 1,
                                           "tie_word_embeddings": False},
    # DeepSeek-V2 (DeepseekV2ForCausalLM): the same attention with a plain q_proj, softmax
    # routing scaled by 1.5 (never renormalised), 2 shared experts.
    "deepseek_v2 mla softmax 8 experts": {"type": "deepseek_v2", "hidden_size": 32,
                                          "q_lora_rank": 0, "kv_lora_rank": 24,
                                          "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
                                          "v_head_dim": 12, "n_routed_experts": 8,
                                          "num_experts_per_tok": 2,
                                          "moe_intermediate_size": 24,
                                          "routed_scaling_factor": 1.5, "n_shared_experts": 2,
                                          "first_k_dense_replace": 1,
                                          "tie_word_embeddings": False},
    # gpt-oss (GptOssForCausalLM): attention sinks, q/k/v/o biases, layer 0 sliding over 8
    # positions, yarn not truncated (head_dim 8, theta 1e4, original 256: pair 1 blended by
    # 0.59, 0.5 if truncated), the router's bias, 8 packed experts with biases and the clamped
    # SwiGLU.
    "gpt_oss sinks packed 8 experts yarn": {"type": "gpt_oss", "hidden_size": 32, "head_dim": 8,
                                            "num_local_experts": 8, "num_experts_per_tok": 2,
                                            "sliding_window": 8, "tie_word_embeddings": False,
                                            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                             "original_max_position_embeddings": 256,
                                                             "truncate": False}},
    # Llama 4 (Llama4ForCausalLM): layer 0 dense with RoPE on adjacent pairs in chunks of 8 and
    # q/k L2 norms, layer 1 sparse (one of 4 experts a token, input-scaled, a shared expert)
    # and NoPE with its queries' temperature (floor_scale 8: positions 7.. scaled).
    "llama4 chunks nope temperature": {"type": "llama4_text", "hidden_size": 32, "head_dim": 8,
                                       "num_local_experts": 4, "num_experts_per_tok": 1,
                                       "intermediate_size_mlp": 64,
                                       "interleave_moe_layer_step": 2,
                                       "no_rope_layer_interval": 2, "attention_chunk_size": 8,
                                       "floor_scale": 8, "attn_scale": 0.5,
                                       "tie_word_embeddings": False},
    # Qwen3.5 (Qwen3_5ForCausalLM): layer 0 Gated DeltaNet (2 key heads of 8, 4 value heads of
    # 8, a conv of 4 taps), layer 1 gated full attention (q/k norms, half of each head of 8
    # rotated); every norm but the DeltaNet's (1 + w); unscaled RoPE (transformers 5 reads
    # rope_parameters).
    "qwen3_5 linear gated": {"type": "qwen3_5_text", "hidden_size": 32, "head_dim": 8,
                             "full_attention_interval": 2, "linear_num_key_heads": 2,
                             "linear_num_value_heads": 4, "linear_key_head_dim": 8,
                             "linear_value_head_dim": 8, "partial_rotary_factor": 0.5,
                             "rope_scaling": {"rope_type": "default"},
                             "tie_word_embeddings": False},
    # Qwen3.5-MoE (Qwen3_5MoeForCausalLM): the same layers, each MLP Qwen2-MoE's sparse block
    # (4 experts, 2 a token, always renormalised; a sigmoid-gated shared expert).
    "qwen3_5_moe linear gated 4 experts": {"type": "qwen3_5_moe_text", "hidden_size": 32,
                                           "head_dim": 8, "full_attention_interval": 2,
                                           "linear_num_key_heads": 2,
                                           "linear_num_value_heads": 4,
                                           "linear_key_head_dim": 8,
                                           "linear_value_head_dim": 8,
                                           "partial_rotary_factor": 0.5,
                                           "num_experts": 4, "num_experts_per_tok": 2,
                                           "moe_intermediate_size": 32,
                                           "shared_expert_intermediate_size": 48,
                                           "rope_scaling": {"rope_type": "default"},
                                           "tie_word_embeddings": False},
    # OLMo 3: OLMo 2's layers, the first sliding over 8 positions with unscaled RoPE, the second
    # global with LLAMA_COMMON's llama3 scaling (Olmo3Model's rotary_embs).
    "olmo3 gqa untied window 8": {"type": "olmo3", "hidden_size": 32, "sliding_window": 8,
                                  "sliding_window_pattern": 2, "tie_word_embeddings": False},
    # YaRN as Qwen2.5 / Qwen3 extend their context (head_dim 8, theta 1e4, original 256: pairs
    # 0 and 1 kept, 2 blended, 3 interpolated; cos and sin scaled by 1 + 0.1 ln 4).
    "qwen3 gqa tied yarn": {"type": "qwen3", "hidden_size": 32, "head_dim": 8, "tie_word_embeddings": True,
                            "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                             "original_max_position_embeddings": 256}},
    # Document masking (data.attn_mask_type = "block_causal", reset_position_ids, documents
    # ending at each space byte): transformers is given the windows with position_ids that
    # restart after each space (its padding-free packing: masking_utils finds the packed
    # sequences and masks across them); the reference runs each document alone.
    "llama gqa untied documents": {"hidden_size": 32, "tie_word_embeddings": False,
                                   "documents": True},
}
# The [data] keys of a case with "documents": True, and its EOS (the space byte).
DOCUMENTS_EOS = 32
DOCUMENTS_DATA = ('attn_mask_type = "block_causal"\nreset_position_ids = true\n'
                  'eos_token_id = %d\n' % DOCUMENTS_EOS)
# Real text: the project's own words, repeated with variations (no download needed).
SENTENCES = [
    "fully sharded data parallel training keeps one shard of every parameter per rank",
    "an all-gather rebuilds the unit before its forward and a reduce-scatter averages its gradient",
    "the root unit holds the shared embedding and the final layer norms",
    "hybrid sharding shards within a node and replicates across nodes",
    "activation checkpointing keeps each block's input and recomputes its forward in backward",
    "a relative position bias is bucketed logarithmically beyond half the buckets",
    "mixed precision stores parameters in bfloat16 and keeps master weights in float32",
    "checkpoints are written atomically and resumed bit for bit",
]


def run(cmd, env_file, cwd):
    line = " ".join(shlex.quote(c) for c in cmd)
    if env_file:
        line = "source %s && %s" % (shlex.quote(env_file), line)
    if BIN_DIR:
        line = "export PATH=%s:\"$PATH\" && %s" % (shlex.quote(BIN_DIR), line)
    r = subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError("%s exited %d: %s" % (line, r.returncode, (r.stdout + r.stderr)[-2000:]))
    return r.stdout


def read_safetensors(path, torch):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", e
        b, end = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[b:end]), dtype=torch.float32).reshape(e["shape"])
    return out


def final_val_loss(run_dir):
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    return [r["val_loss"] for r in rows if "val_loss" in r][-1]


def train_and_merge(work, name, toml, env_file):
    path = os.path.join(work, name + ".toml")
    with open(path, "w") as f:
        f.write(toml)
    run_dir = os.path.join(work, "run_" + name)
    for old in (run_dir, os.path.join(work, "hf_" + name)):  # a previous hf_check's, same --work
        shutil.rmtree(old, ignore_errors=True)
    run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", "fsdp_train", path], env_file, work)
    step = open(os.path.join(run_dir, "checkpoints", "latest")).read().strip()
    hf = os.path.join(work, "hf_" + name)
    run(["fsdp_merge", os.path.join(run_dir, "checkpoints", step), hf], env_file, work)
    return run_dir, hf


def common_toml(name, work):
    return """[train]
global_batch_size = 4
max_steps = 3
seed = 7
run_dir = "%s"
device = "cpu"
num_threads = 1
[optim]
lr = 1e-2
warmup_steps = 1
[fsdp]
sharding_strategy = "FULL_SHARD"
[eval]
every = 0
""" % os.path.join(work, "run_" + name)


def byte_corpus(work, env_file, h5):
    """The byte corpus (GPT-2 and Llama), prepared by fsdp_prepare into work/h5 with a 0.1
    validation split; returns the text and its validation bytes."""
    text = "".join("%s (%d).\n" % (s, i) for i in range(40) for s in SENTENCES).encode()
    with open(os.path.join(work, "corpus.txt"), "wb") as f:
        f.write(text)
    out = run(["fsdp_prepare", "-o", h5, "--val-fraction", "0.1", "corpus.txt"], env_file, work)
    if ", %d val tokens" % int(0.1 * len(text)) not in out:  # docs/data.md: the last floor(F n) bytes
        raise RuntimeError("fsdp_prepare's split is not the one assumed here: " + out.strip())
    return text, text[len(text) - int(0.1 * len(text)):]  # the last floor(F * n) bytes


def check_gpt2(work, env_file, torch, impl):
    text, val = byte_corpus(work, env_file, "gpt2.h5")
    L = 32
    toml = """[model]
type = "gpt2"
n_layer = 2
n_head = 2
n_embd = 32
n_positions = 64
vocab_size = 256
[data]
path = "%s"
seq_len = %d
""" % (os.path.join(work, "gpt2.h5"), L) + common_toml("gpt2", work)
    run_dir, hf = train_and_merge(work, "gpt2", toml, env_file)
    n = (len(val) - 1) // L
    if impl == "hf":
        from transformers import GPT2LMHeadModel
        model = GPT2LMHeadModel.from_pretrained(hf).double().eval()
        ids = torch.tensor([list(val[i * L:i * L + L + 1]) for i in range(n)], dtype=torch.long)
        with torch.no_grad():
            logits = model(ids[:, :-1]).logits
        total = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1),
                                                  reduction="sum").item()
        return total / (n * L), final_val_loss(run_dir)
    # reference: tests/check_merge.py's numpy GPT-2 forward (HF conventions, Conv1D layouts)
    with open(os.path.join(work, "val.bin"), "wb") as f:
        f.write(val)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "check_merge.py")
    out = subprocess.run([sys.executable, script, hf, "--eval-bytes", os.path.join(work, "val.bin"),
                          "--seq-len", str(L), "--windows", str(n)], capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("check_merge: val loss ")]
    if out.returncode != 0 or not line:
        raise RuntimeError("check_merge.py: " + (out.stdout + out.stderr)[-500:])
    return float(line[0].split()[-1]), final_val_loss(run_dir)


def check_t5(work, env_file, torch, ff, tied, impl):
    pairs = []
    for i in range(120):
        s = SENTENCES[i % len(SENTENCES)].split()
        k = 2 + i % 5
        pairs.append((" ".join(s[k:]) + " %d" % i, " ".join(s[:k])))
    tsv = os.path.join(work, "pairs.tsv")
    with open(tsv, "w") as f:
        f.write("".join("%s\t%s\n" % p for p in pairs))
    run(["fsdp_prepare", "--pairs", tsv, "-o", "t5.h5", "--val-fraction", "0.25"], env_file, work)
    name = "t5_%s_%s" % (ff, "tied" if tied else "untied")
    toml = """[model]
type = "t5"
d_model = 32
d_kv = 8
d_ff = 64
num_layers = 2
num_decoder_layers = 2
num_heads = 4
relative_attention_num_buckets = 8
relative_attention_max_distance = 20
feed_forward_proj = "%s"
tie_word_embeddings = %s
vocab_size = 384
[data]
path = "%s"
objective = "seq2seq"
max_input_len = 128
max_target_len = 64
""" % (ff, "true" if tied else "false", os.path.join(work, "t5.h5")) + common_toml(name, work)
    run_dir, hf = train_and_merge(work, name, toml, env_file)
    val = pairs[len(pairs) - int(0.25 * len(pairs)):]
    enc = [[b + 3 for b in a.encode()] + [1] for a, _ in val]  # ByT5 ids, eos appended
    lab = [[b + 3 for b in t.encode()] + [1] for _, t in val]
    Te, Td = max(map(len, enc)), max(map(len, lab))
    ids = torch.tensor([e + [0] * (Te - len(e)) for e in enc], dtype=torch.long)
    labels = torch.tensor([t + [-100] * (Td - len(t)) for t in lab], dtype=torch.long)
    count = int((labels != -100).sum())
    if impl == "hf":
        from transformers import T5ForConditionalGeneration
        model = T5ForConditionalGeneration.from_pretrained(hf).double().eval()
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels).logits
        total = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                                  ignore_index=-100, reduction="sum").item()
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import t5_reference
        cfg = json.load(open(os.path.join(hf, "config.json")))
        params = {k: v.double() for k, v in read_safetensors(os.path.join(hf, "model.safetensors"), torch).items()}
        with torch.no_grad():
            total = t5_reference.TinyT5(cfg, params).loss(ids, labels).item()
    return total / count, final_val_loss(run_dir)


def llama_toml(name, work, h5, seq_len):
    """fsdp_train's configuration of a Llama case (LLAMA_CASES) on the byte corpus."""
    keys = dict(LLAMA_COMMON, **LLAMA_CASES[name])
    model_type = keys.pop("type", "llama")
    documents = keys.pop("documents", False)
    if model_type in ("deepseek_v3", "deepseek_v2"):  # MLA's keys and values are per head
        keys["num_key_value_heads"] = keys["num_attention_heads"]

    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join("%s = %s" % (k, value(x)) for k, x in v.items()) + " }"
        return repr(v)
    model = "[model]\ntype = %s\n" % json.dumps(model_type) + "".join("%s = %s\n" % (k, value(v)) for k, v in keys.items())
    tag = name.replace(" ", "_")
    return (model + "[data]\npath = %s\nseq_len = %d\n" % (json.dumps(os.path.join(work, h5)), seq_len) +
            (DOCUMENTS_DATA if documents else "") + common_toml(tag, work))


def document_positions(inputs, torch):
    """HF's position_ids of padding-free packing for [N, L] inputs: 0 at a row's first token
    and after each DOCUMENTS_EOS, else the previous + 1 (fsdp_train's Batch::position_ids)."""
    pos = torch.zeros_like(inputs)
    for r in range(inputs.shape[0]):
        for t in range(1, inputs.shape[1]):
            pos[r, t] = 0 if inputs[r, t - 1] == DOCUMENTS_EOS else pos[r, t - 1] + 1
    return pos


def check_llama(work, env_file, torch, name, impl):
    text, val = byte_corpus(work, env_file, "llama.h5")
    L = 32
    documents = LLAMA_CASES[name].get("documents", False)
    tag = name.replace(" ", "_")
    run_dir, hf = train_and_merge(work, tag, llama_toml(name, work, "llama.h5", L), env_file)
    n = (len(val) - 1) // L
    ids = torch.tensor([list(val[i * L:i * L + L + 1]) for i in range(n)], dtype=torch.long)
    if impl == "hf":
        from transformers import AutoModelForCausalLM  # the class config.json's model_type names
        # Gemma 2's attention soft-cap is in transformers' eager attention (sdpa has no score
        # hook): its model card asks for eager.
        eager = json.load(open(os.path.join(hf, "config.json")))["model_type"] == "gemma2"
        model = AutoModelForCausalLM.from_pretrained(
            hf, **({"attn_implementation": "eager"} if eager else {})).double().eval()
        want = json.load(open(os.path.join(hf, "config.json")))["architectures"][0]
        if type(model).__name__ != want:
            raise RuntimeError("from_pretrained made a %s, config.json names %s" % (type(model).__name__, want))
        with torch.no_grad():
            if documents:
                logits = model(ids[:, :-1], position_ids=document_positions(ids[:, :-1], torch)).logits
            else:
                logits = model(ids[:, :-1]).logits
    else:  # tools/llama_reference.py's float64 forward, on the merged weights and config.json
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import llama_reference
        cfg = json.load(open(os.path.join(hf, "config.json")))
        params = {k: v.double() for k, v in read_safetensors(os.path.join(hf, "model.safetensors"), torch).items()}
        with torch.no_grad():
            if documents:  # each document of each window alone
                inputs = ids[:, :-1]
                pos = document_positions(inputs, torch)
                rows = []
                for r in range(inputs.shape[0]):
                    starts = [t for t in range(inputs.shape[1]) if pos[r, t] == 0] + [inputs.shape[1]]
                    rows.append(torch.cat([llama_reference.forward(params, cfg, inputs[r:r + 1, a:b])[0]
                                           for a, b in zip(starts, starts[1:])]))
                logits = torch.stack(rows)
            else:
                logits = llama_reference.forward(params, cfg, ids[:, :-1])
    V = LLAMA_COMMON["vocab_size"]
    if logits.shape[-1] != V:
        raise RuntimeError("the merged model has %d logits per token, expected vocab_size %d" % (logits.shape[-1], V))
    total = torch.nn.functional.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1),
                                              reduction="sum").item()
    return total / (n * L), final_val_loss(run_dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--env", default="")
    ap.add_argument("--work", default="")
    ap.add_argument("--impl", choices=["hf", "reference"], default="hf")
    ap.add_argument("--only", default="", help="comma-separated words: run the cases whose name holds one")
    ap.add_argument("--bin-dir", default="", help="folder put first on PATH (fsdp_prepare, fsdp_train, fsdp_merge)")
    a = ap.parse_args()
    global BIN_DIR
    BIN_DIR = os.path.abspath(a.bin_dir) if a.bin_dir else ""
    for tool in ("fsdp_prepare", "fsdp_train", "fsdp_merge") if BIN_DIR else ():
        if not os.access(os.path.join(BIN_DIR, tool), os.X_OK):
            print("hf_check: --bin-dir %s has no %s" % (BIN_DIR, tool))
            return 1
    try:
        import torch
    except ImportError:
        print("hf_check: torch is not installed for %s" % sys.executable)
        return 77
    if a.impl == "hf":
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("hf_check: transformers is not installed (use --impl reference to try without it)")
            return 77
    work = a.work or tempfile.mkdtemp(prefix="hf_check.")
    os.makedirs(work, exist_ok=True)
    env_file = os.path.abspath(a.env) if a.env else ""
    checks = [("gpt2", lambda: check_gpt2(work, env_file, torch, a.impl)),
              ("t5 gated-gelu untied", lambda: check_t5(work, env_file, torch, "gated-gelu", False, a.impl)),
              ("t5 relu tied", lambda: check_t5(work, env_file, torch, "relu", True, a.impl))]
    checks += [(name, lambda name=name: check_llama(work, env_file, torch, name, a.impl)) for name in LLAMA_CASES]
    words = [w.strip() for w in a.only.split(",") if w.strip()]
    if words:
        checks = [(name, fn) for name, fn in checks if any(w in name for w in words)]
        if not checks:
            print("hf_check: --only %s matches no case" % a.only)
            return 1
    print("| model | %s val loss | fsdp_train val loss | rel. diff | result |"
          % ("transformers" if a.impl == "hf" else "reference (not transformers)"))
    print("|---|---:|---:|---:|---|")
    ok = True
    for name, fn in checks:
        try:
            theirs, ours = fn()
            rel = abs(theirs - ours) / abs(ours)
            good = math.isfinite(rel) and rel <= TOL
            print("| %s | %.8f | %.8f | %.2e | %s |" % (name, theirs, ours, rel, "PASS" if good else "**FAIL**"))
        except Exception as e:  # one line per failure, then the next model
            good = False
            print("| %s | | | | **FAIL**: %s |" % (name, str(e).replace("\n", " ")[:300]))
        ok = ok and good
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
