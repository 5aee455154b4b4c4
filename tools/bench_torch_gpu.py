#!/usr/bin/env python3
"""tools/bench_torch_gpu.py: the PyTorch side of tools/bench_gpu.sh, one training run on one GPU.

    bench_torch_gpu.py --model gpt2-124m|gpt2-1.5b|t5-small-byt5|llama-1b --mode eager|compile
                       --wrap none|fsdp2 [--impl plain|hf] [--compile-scope model|block]
                       [--compile-mode default|max-autotune-no-cudagraphs]
                       [--steps 10] [--warmup 3] [--warmup-max 30] [--settle-tol 0.02]

trains the model on uniformly random tokens and prints ONE line on stdout, a JSON object
(tokens_per_sec = the median over the --steps timed steps; see RESULT_KEYS). Everything else
goes to stderr. Two more actions need no torch (tests/test_tools.cmake runs them on the CPU
machine against fsdp_train --dry-run):
    --describe         the model's shape, parameters, tokens and FLOPs per step (JSON line)
    --fsdp-train-toml  fsdp_train's configuration of the same run (TOML on stdout)

The models (MODELS below; the one place their shapes live, bench_gpu.sh reads them here):
  gpt2-124m      GPT-2 small: 12 layers x 768, 12 heads, vocab 50257, seq 1024, batch 8
  gpt2-1.5b      GPT-2 XL: 48 layers x 1600, 25 heads, vocab 50257, seq 1024, batch 4
  t5-small-byt5  t5-small's shape (d_model 512, d_ff 2048, d_kv 64, 8 heads, 6 + 6 blocks,
                 ReLU, tied head; inputs/t5_small.toml) with the ByT5 vocabulary (384), span
                 corruption of 512-token windows (noise 0.15, mean span 3: inputs 462,
                 targets 104 tokens), batch 32
  llama-1b       Llama 3.2 1B's shape (its published config.json: 16 layers x 2048, 32 query and
                 8 K/V heads of 64, SwiGLU 8192, vocab 128256, tied embeddings, RMSNorm eps 1e-5,
                 rope_theta 5e5 with llama3 scaling factor 32, low 1, high 4, original 8192;
                 max_position_embeddings 131072), seq 2048, batch 4
GPT-2 is tools/bench_torch_gpt2.py's GPT2 (HF GPT2LMHeadModel without dropout; attention is
F.scaled_dot_product_attention(is_causal=True)), T5 is transformers' T5ForConditionalGeneration
(dropout 0). Llama has two implementations (--impl; default plain): `plain`, the Llama written
below (HF LlamaForCausalLM's architecture and module names: nn.Linear q/k/v/o and SwiGLU
gate/up/down without biases, RMSNorm with fp32 statistics, RoPE in the rotate-half layout with
cos/sin precomputed in float64 for the sequence and applied in the activations' dtype,
F.scaled_dot_product_attention(is_causal=True, enable_gqa=True), PyTorch >= 2.5), and `hf`,
transformers' LlamaForCausalLM built from a LlamaConfig of the same shape (rope_parameters in
transformers >= 5, rope_theta / rope_scaling before) with attn_implementation "sdpa" (checked).
Every model is built on the GPU in fp32 and checked to have fsdp_train's parameter count;
Llama's RoPE inverse frequencies (the plain buffer, HF's rotary_emb.inv_freq) are checked
against llama_inv_freq below (fsdp_train's llama_inv_freq) within 1e-5.

--wrap none (what a single-GPU user runs; the strongest single-GPU baseline): fp32 weights,
  torch.autocast(bfloat16) around forward and loss, AdamW(fused=True), TF32 on for what stays
  fp32. --mode compile: torch.compile of the whole model with its loss, one compiled function
  (--compile-scope model, the default at every shape), or of each transformer block on its own
  (--compile-scope block, PyTorch's "regional compilation"); --compile-mode
  max-autotune-no-cudagraphs passes that mode to torch.compile (Inductor benchmarks Triton
  GEMM/convolution templates against cuBLAS and keeps the fastest; no CUDA graphs, which
  fsdp_train does not use either); default: torch.compile's default mode.
--wrap fsdp2: torch.distributed.fsdp.fully_shard at world size 1 (one process, NCCL process
  group from MASTER_ADDR / MASTER_PORT, set here to 127.0.0.1 and a free port unless given):
  fully_shard on each block, then on the root, MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32), fp32 sharded master weights, AdamW(fused=True). --mode compile is
  torchtitan's: torch.compile(block, fullgraph=True) for each block before fully_shard (the
  Hugging Face blocks of --impl hf: fullgraph=False; --compile-scope block likewise).
Both: AdamW lr 6e-4 constant, betas (0.9, 0.999), eps 1e-8, weight decay 0.1 on the 2-D
weights except embeddings (a tied LM head is the embedding: not decayed, as in fsdp_train);
clip_grad_norm_(1.0). A step (timed between two
torch.cuda.synchronize()): zero_grad, forward + loss, backward, clipping, optimizer step; the
batch is drawn on the GPU before the timer. Warm-up (untimed; compilation, autotuning and any
recompilation happen there): at least --warmup steps, then more until the step time has
settled -- the last 3 warm-up steps within --settle-tol (2 %) of each other, max / min - 1 --
or --warmup-max steps were run (settled: false in the result then). The result reports
warmup_steps, warmup_s (their wall time) and compile_s = the warm-up's time above the timed
median step (sum over the warm-up steps of max(0, step - median)): compilation and autotuning,
reported apart from the timed throughput.

Tokens and FLOPs are fsdp_train's (src/train/trainer.cpp, src/model/gpt2.cpp,
src/model/t5_family.cpp, src/model/llama.cpp ModelFamily::train_flops_per_sample): a GPT-2
sample counts its T tokens and 6 x (T (12 L C^2 + V C) + 2 L T^2 C) FLOPs (6N + 12 L T C per
token, N the matrix weights with the tied LM head); a T5 sample counts its inputs + targets
(462 + 104) and the encoder/decoder sum of t5_family.cpp; a Llama sample its T tokens and
6 x (T (L (C (2Q + 2KV) + 3 C I) + V C) + 2 L T^2 Q) FLOPs (Q = heads x head_dim, KV = K/V
heads x head_dim, I = intermediate_size; the head counted once also when tied, the causal
mask not discounted). MFU = tokens/s x flops_per_token / peak. The loss of GPT-2 and Llama
(both implementations) is F.cross_entropy of the logits upcast to fp32 against the next
tokens, over all B x T positions as fsdp_train counts them; T5's is Hugging Face's own.
"""
import argparse
import contextlib
import json
import math
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Module level on purpose: an `import torch.x` inside a function makes `torch` local to the whole
# function (issue 19; tests/check_py_scopes.py).
try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # --describe and --fsdp-train-toml need no torch
    torch = None
try:  # a run needs these too; a torch without them (Debian's 1.13) still defines the models
    import torch._dynamo        # below, which tests/check_bench_shapes.py runs on the CPU
    import torch._dynamo.utils
    import torch.distributed as dist
    from bench_torch_gpt2 import GPT2
except ImportError:
    pass

MODELS = {
    "gpt2-124m": {"family": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "seq_len": 1024,
                  "vocab": 50257, "batch": 8},
    "gpt2-1.5b": {"family": "gpt2", "n_layer": 48, "n_head": 25, "n_embd": 1600, "seq_len": 1024,
                  "vocab": 50257, "batch": 4},
    "t5-small-byt5": {"family": "t5", "d_model": 512, "d_ff": 2048, "d_kv": 64, "num_heads": 8,
                      "num_layers": 6, "num_decoder_layers": 6, "vocab": 384,
                      "feed_forward_proj": "relu", "tie_word_embeddings": True,
                      "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
                      "layer_norm_epsilon": 1e-6, "seq_len": 512, "noise_density": 0.15,
                      "mean_noise_span_length": 3.0, "batch": 32},
    # Llama 3.2 1B (meta-llama/Llama-3.2-1B config.json); initializer_range only sets the init.
    "llama-1b": {"family": "llama", "num_hidden_layers": 16, "hidden_size": 2048,
                 "intermediate_size": 8192, "num_attention_heads": 32, "num_key_value_heads": 8,
                 "head_dim": 64, "vocab": 128256, "max_position_embeddings": 131072,
                 "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                 "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
                 "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": True,
                 "initializer_range": 0.02, "seq_len": 2048, "batch": 4},
}
# --impl: the PyTorch implementations of each family, the first the default.
IMPLS = {"gpt2": ("plain",), "t5": ("hf",), "llama": ("plain", "hf")}
# ByT5: pad 0, eos 1, unk 2, bytes 3..258, 125 sentinels above; fsdp_train's synthetic span
# corruption draws ids in [3, vocab - 125) (docs/data.md), and so does this script.
T5_SENTINELS = 125
RESULT_KEYS = ("model", "mode", "wrap", "impl", "compile_scope", "compile_mode", "tokens_per_sec",
               "step_ms", "step_ms_min", "tokens_per_step", "flops_per_token", "params",
               "max_memory_allocated", "max_memory_reserved", "warmup_s", "warmup_steps",
               "settled", "compile_s", "first_loss",
               "last_loss", "graph_breaks", "graph_break_reasons", "unique_graphs", "torch",
               "cuda", "gpu")  # + "attn_implementation", "transformers" for Hugging Face models


def span_counts(L, noise_density, mean_noise_span_length):
    """(input_len, target_len) of T5 span corruption on an L-token window: fsdp_train's
    data::span_counts (round half to even, as Python's round and numpy's np.round)."""
    num_noise = min(max(round(L * noise_density), 1), L - 1)
    num_spans = min(max(1, round(num_noise / mean_noise_span_length)), L - num_noise)
    return (L - num_noise) + num_spans + 1, num_noise + num_spans + 1


def describe(name, spec=None):
    """Shape, parameter count, tokens and training FLOPs per step of MODELS[name] (or of `spec`,
    an entry of the same form), counted as fsdp_train counts them (see the top of this file)."""
    m = dict(MODELS[name] if spec is None else spec)
    if m["family"] == "gpt2":
        L, C, T, V = m["n_layer"], m["n_embd"], m["seq_len"], m["vocab"]
        params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # tied head
        tokens_per_sample = T
        flops_per_sample = 6.0 * (T * (12.0 * L * C * C + V * C) + L * 2.0 * T * T * C)
    elif m["family"] == "llama":
        L, C, T, V, I = m["num_hidden_layers"], m["hidden_size"], m["seq_len"], m["vocab"], m["intermediate_size"]
        Q, KV = m["num_attention_heads"] * m["head_dim"], m["num_key_value_heads"] * m["head_dim"]
        layer = C * (2 * Q + 2 * KV) + 3 * C * I + 2 * C  # q, k, v, o, gate, up, down, 2 RMSNorms
        layer += (Q + 2 * KV + C if m["attention_bias"] else 0) + (2 * I + C if m["mlp_bias"] else 0)
        params = V * C + L * layer + C + (0 if m["tie_word_embeddings"] else V * C)
        tokens_per_sample = T
        flops_per_sample = 6.0 * (T * (L * (C * (2.0 * Q + 2.0 * KV) + 3.0 * C * I) + V * C) +
                                  L * 2.0 * T * T * Q)
    else:
        Ti, Tt = span_counts(m["seq_len"], m["noise_density"], m["mean_noise_span_length"])
        m["input_len"], m["target_len"] = Ti, Tt
        D, Fd, V = m["d_model"], m["d_ff"], m["vocab"]
        I = m["num_heads"] * m["d_kv"]
        Le, Ld = m["num_layers"], m["num_decoder_layers"]
        ff_mats = 3 if m["feed_forward_proj"] == "gated-gelu" else 2
        rel = m["relative_attention_num_buckets"] * m["num_heads"]  # first block of each stack
        enc_block = 4 * I * D + ff_mats * D * Fd + 2 * D
        dec_block = 8 * I * D + ff_mats * D * Fd + 3 * D
        params = (V * D + Le * enc_block + Ld * dec_block + 2 * rel + 2 * D +
                  (0 if m["tie_word_embeddings"] else V * D))
        tokens_per_sample = Ti + Tt
        ff = ff_mats * Fd * D
        enc = Ti * Le * (4.0 * I * D + ff) + Le * 2.0 * Ti * Ti * I
        dec = Ld * (Tt * (6.0 * I * D + ff) + Ti * 2.0 * I * D) + Ld * (2.0 * Tt * Tt * I + 2.0 * Tt * Ti * I)
        flops_per_sample = 6.0 * (enc + dec + Tt * V * D)
    m.update(model=name, params=params, tokens_per_sample=tokens_per_sample,
             tokens_per_step=m["batch"] * tokens_per_sample,
             flops_per_token=flops_per_sample / tokens_per_sample,
             flops_per_step=flops_per_sample * m["batch"])
    return m


def llama_inv_freq(m):
    """RoPE inverse frequencies (radians per position, head_dim / 2 Python floats) of a llama
    MODELS entry: 1 / rope_theta^(2i / head_dim), then with rope_scaling llama3 Llama 3.1's
    rescaling: wavelengths 2 pi / f above original / low_freq_factor divided by factor, below
    original / high_freq_factor kept, smoothly interpolated between (fsdp_train's
    llama_inv_freq in src/model/llama.cpp; transformers' _compute_llama3_parameters)."""
    D, theta = m["head_dim"], m["rope_theta"]
    inv = [1.0 / theta ** (2 * i / D) for i in range(D // 2)]
    s = m.get("rope_scaling")
    if not s or s.get("rope_type", "default") == "default":
        return inv
    if s["rope_type"] != "llama3":
        raise ValueError("rope_type %r is not implemented here (default or llama3)" % s["rope_type"])
    orig, factor = float(s["original_max_position_embeddings"]), s["factor"]
    low, high = s["low_freq_factor"], s["high_freq_factor"]
    out = []
    for f in inv:
        wl = 2 * math.pi / f
        if wl > orig / low:
            f = f / factor
        elif wl >= orig / high:
            smooth = (orig / wl - low) / (high - low)
            f = (1 - smooth) * f / factor + smooth * f
        out.append(f)
    return out


def toml_value(v):
    """A Python bool / int / float / str / flat dict as a TOML value (inline table for a dict)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, dict):
        return "{ " + ", ".join("%s = %s" % (k, toml_value(x)) for k, x in v.items()) + " }"
    return repr(v)


def fsdp_train_toml(name, max_steps, seed):
    """fsdp_train's configuration of the same training: bf16 parameters and compute over fp32
    master weights, fp32 gradient reduction, FULL_SHARD (world size 1 in the benchmark), the
    optimizer above, synthetic data (train.run_dir and train.peak_flops are set by --set)."""
    m = describe(name)
    if m["family"] == "gpt2":
        model = ("[model]\ntype = \"gpt2\"\nn_layer = %d\nn_head = %d\nn_embd = %d\nn_positions = %d\n"
                 "vocab_size = %d\n" % (m["n_layer"], m["n_head"], m["n_embd"], m["seq_len"], m["vocab"]))
        data = "[data]\nsource = \"synthetic\"\nobjective = \"causal_lm\"\nseq_len = %d\n" % m["seq_len"]
        block = "GPT2Block"
    elif m["family"] == "llama":
        keys = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
                "rope_theta", "rope_scaling", "attention_bias", "mlp_bias", "tie_word_embeddings",
                "initializer_range"]
        model = "[model]\ntype = \"llama\"\nvocab_size = %d\n" % m["vocab"] + "".join(
            "%s = %s\n" % (k, toml_value(m[k])) for k in keys if m.get(k) is not None)
        data = "[data]\nsource = \"synthetic\"\nobjective = \"causal_lm\"\nseq_len = %d\n" % m["seq_len"]
        block = "LlamaDecoderLayer"
    else:
        model = ("[model]\ntype = \"t5\"""\nd_model = %d\nd_kv = %d\nd_ff = %d\nnum_layers = %d\n"
                 "num_decoder_layers = %d\nnum_heads = %d\nrelative_attention_num_buckets = %d\n"
                 "relative_attention_max_distance = %d\nfeed_forward_proj = \"%s\"\n"
                 "tie_word_embeddings = %s\nlayer_norm_epsilon = %r\nvocab_size = %d\n"
                 % (m["d_model"], m["d_kv"], m["d_ff"], m["num_layers"], m["num_decoder_layers"],
                    m["num_heads"], m["relative_attention_num_buckets"],
                    m["relative_attention_max_distance"], m["feed_forward_proj"],
                    "true" if m["tie_word_embeddings"] else "false", m["layer_norm_epsilon"], m["vocab"]))
        data = ("[data]\nsource = \"synthetic\"\nobjective = \"span_corruption\"\nseq_len = %d\n"
                "noise_density = %r\nmean_noise_span_length = %r\n"
                % (m["seq_len"], m["noise_density"], m["mean_noise_span_length"]))
        block = "T5Block"
    return ("# fsdp_train side of tools/bench_gpu.sh for %s (tools/bench_torch_gpu.py --fsdp-train-toml)\n"
            "%s\n%s\n[train]\ndevice = \"cuda\"\nglobal_batch_size = %d\nmax_steps = %d\nseed = %d\n"
            "log_every = 1\n\n"
            "[optim]\nname = \"adamw\"\nlr = 6e-4\nmin_lr = 6e-4\nwarmup_steps = 0\nweight_decay = 0.1\n"
            "grad_clip = 1.0\nbeta1 = 0.9\nbeta2 = 0.999\neps = 1e-8\n\n"
            "[fsdp]\nsharding_strategy = \"FULL_SHARD\"\nauto_wrap_policy = \"TRANSFORMER_BASED_WRAP\"\n"
            "transformer_layer_cls_to_wrap = [\"%s\"]\nactivation_checkpointing = false\n\n"
            "[mixed_precision]\nparam_dtype = \"bf16\"\nreduce_dtype = \"fp32\"\n\n"
            "[comm]\nbackend = \"auto\"\n\n[checkpoint]\nenable = false\n\n[eval]\nevery = 0\nmax_windows = 1\n"
            % (name, model, data, m["batch"], max_steps, seed, block))


# ---- the plain PyTorch Llama ----------------------------------------------------------------------
# HF LlamaForCausalLM's architecture and module names (modeling_llama.py), written for speed the
# way a PyTorch user writes it: no cache, no masks (is_causal), GQA in SDPA. Defined without torch
# too (as plain classes), so that --describe and --fsdp-train-toml import this file anywhere.
_Module = nn.Module if torch is not None else object


class LlamaRMSNorm(_Module):
    """x * rsqrt(mean(x^2) + eps) in fp32, back to x's dtype, times the weight (HF's order)."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaAttention(_Module):
    """q/k/v/o projections, RoPE on q and k, causal SDPA with num_key_value_heads K/V heads."""

    def __init__(self, m):
        super().__init__()
        C, D, bias = m["hidden_size"], m["head_dim"], m["attention_bias"]
        self.H, self.Hkv, self.D = m["num_attention_heads"], m["num_key_value_heads"], D
        self.q_proj = nn.Linear(C, self.H * D, bias=bias)
        self.k_proj = nn.Linear(C, self.Hkv * D, bias=bias)
        self.v_proj = nn.Linear(C, self.Hkv * D, bias=bias)
        self.o_proj = nn.Linear(self.H * D, C, bias=bias)

    def forward(self, x, cos, sin):  # x [B, T, C]; cos, sin [T, D] fp32
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.D).transpose(1, 2)  # [B, H, T, D]
        k = self.k_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)  # [B, Hkv, T, D]
        v = self.v_proj(x).view(B, T, self.Hkv, self.D).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)  # bf16 under autocast, as the projections
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [B, H, T, D]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.H * self.D))


class LlamaMLP(_Module):
    def __init__(self, m):
        super().__init__()
        C, I, bias = m["hidden_size"], m["intermediate_size"], m["mlp_bias"]
        self.gate_proj = nn.Linear(C, I, bias=bias)
        self.up_proj = nn.Linear(C, I, bias=bias)
        self.down_proj = nn.Linear(I, C, bias=bias)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(_Module):
    def __init__(self, m):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(m["hidden_size"], m["rms_norm_eps"])
        self.self_attn = LlamaAttention(m)
        self.post_attention_layernorm = LlamaRMSNorm(m["hidden_size"], m["rms_norm_eps"])
        self.mlp = LlamaMLP(m)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(_Module):
    """The decoder stack (HF LlamaModel's modules: embed_tokens, layers, norm)."""

    def __init__(self, m):
        super().__init__()
        self.embed_tokens = nn.Embedding(m["vocab"], m["hidden_size"])
        self.layers = nn.ModuleList(LlamaDecoderLayer(m) for _ in range(m["num_hidden_layers"]))
        self.norm = LlamaRMSNorm(m["hidden_size"], m["rms_norm_eps"])


class Llama(_Module):
    """LlamaForCausalLM's math, its state-dict names (model.embed_tokens.weight, ...,
    lm_head.weight). idx [B, T] int64 -> logits [B, T, V]. Weights as HF initialises them
    (Linear and Embedding N(0, initializer_range), biases 0, RMSNorm weights 1); the RoPE tables
    cos/sin [seq_len, head_dim] of llama_inv_freq, computed in float64, kept in fp32."""

    def __init__(self, m):
        super().__init__()
        self.model = LlamaModel(m)
        self.lm_head = nn.Linear(m["hidden_size"], m["vocab"], bias=False)
        if m["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight
        for mod in self.modules():
            if isinstance(mod, (nn.Linear, nn.Embedding)):
                nn.init.normal_(mod.weight, mean=0.0, std=m["initializer_range"])
                if getattr(mod, "bias", None) is not None:
                    nn.init.zeros_(mod.bias)
        self.inv_freq = llama_inv_freq(m)
        freqs = torch.outer(torch.arange(m["seq_len"], dtype=torch.float64),
                            torch.tensor(self.inv_freq, dtype=torch.float64))
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]: HF's rotate-half layout
        self.register_buffer("rope_cos", emb.cos().float(), persistent=False)
        self.register_buffer("rope_sin", emb.sin().float(), persistent=False)

    def forward(self, idx):
        T = idx.shape[1]
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        x = self.model.embed_tokens(idx)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))


# ---- the PyTorch run ---------------------------------------------------------------------------
def hf_llama(spec, device):
    """transformers' LlamaForCausalLM of a llama MODELS entry, fp32 on `device`, attention "sdpa"."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM
    kw = dict(vocab_size=spec["vocab"], hidden_size=spec["hidden_size"],
              intermediate_size=spec["intermediate_size"], num_hidden_layers=spec["num_hidden_layers"],
              num_attention_heads=spec["num_attention_heads"],
              num_key_value_heads=spec["num_key_value_heads"], head_dim=spec["head_dim"],
              max_position_embeddings=spec["max_position_embeddings"], rms_norm_eps=spec["rms_norm_eps"],
              initializer_range=spec["initializer_range"], attention_bias=spec["attention_bias"],
              mlp_bias=spec["mlp_bias"], attention_dropout=0.0, hidden_act="silu",
              tie_word_embeddings=spec["tie_word_embeddings"], use_cache=False)
    scaling = spec.get("rope_scaling") or None
    if int(transformers.__version__.split(".")[0]) >= 5:  # rope_theta and the scaling in one dict
        cfg = LlamaConfig(rope_parameters=dict(scaling or {"rope_type": "default"}, rope_theta=spec["rope_theta"]), **kw)
    else:
        cfg = LlamaConfig(rope_theta=spec["rope_theta"], rope_scaling=dict(scaling) if scaling else None, **kw)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    if getattr(model.config, "_attn_implementation", None) != "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        raise SystemExit("bench_torch_gpu.py: LlamaForCausalLM's attention is %r, not sdpa"
                         % getattr(model.config, "_attn_implementation", None))
    model.train()
    return model


def check_rope(name, model, spec):
    """The model's RoPE inverse frequencies are llama_inv_freq's (within 1e-5: HF's are fp32)."""
    want = llama_inv_freq(spec)
    if isinstance(model, Llama):
        got = model.inv_freq
    else:
        rot = getattr(getattr(model, "model", None), "rotary_emb", None)
        if rot is None or not hasattr(rot, "inv_freq"):
            print("bench_torch_gpu.py: %s: no model.rotary_emb.inv_freq to check" % name, file=sys.stderr)
            return
        got = rot.inv_freq.double().cpu().tolist()
        scale = float(getattr(rot, "attention_scaling", 1.0))
        if abs(scale - 1.0) > 1e-6:
            raise SystemExit("bench_torch_gpu.py: %s: RoPE attention_scaling %r, expected 1" % (name, scale))
    bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if abs(g - w) > 1e-5 * abs(w)]
    if len(got) != len(want) or bad:
        raise SystemExit("bench_torch_gpu.py: %s: RoPE inverse frequencies differ from fsdp_train's "
                         "(index, model, expected): %s" % (name, bad[:4] or (len(got), len(want))))


def build_model(spec, device, impl):
    """The model in fp32 on `device` and its list of transformer blocks (containers, index)."""
    if spec["family"] == "gpt2":
        with torch.device(device):
            model = GPT2(spec["vocab"], spec["n_layer"], spec["n_head"], spec["n_embd"], spec["seq_len"])
        return model, [(model.h, i) for i in range(len(model.h))]
    if spec["family"] == "llama":
        if impl == "plain":
            with torch.device(device):
                model = Llama(spec)
        else:
            model = hf_llama(spec, device)
        return model, [(model.model.layers, i) for i in range(len(model.model.layers))]
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=spec["vocab"], d_model=spec["d_model"], d_kv=spec["d_kv"],
                   d_ff=spec["d_ff"], num_layers=spec["num_layers"],
                   num_decoder_layers=spec["num_decoder_layers"], num_heads=spec["num_heads"],
                   relative_attention_num_buckets=spec["relative_attention_num_buckets"],
                   relative_attention_max_distance=spec["relative_attention_max_distance"],
                   dropout_rate=0.0, layer_norm_epsilon=spec["layer_norm_epsilon"],
                   feed_forward_proj=spec["feed_forward_proj"],
                   tie_word_embeddings=spec["tie_word_embeddings"], use_cache=False,
                   pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    model = T5ForConditionalGeneration(cfg).to(device)
    model.train()
    blocks = [(model.encoder.block, i) for i in range(len(model.encoder.block))]
    blocks += [(model.decoder.block, i) for i in range(len(model.decoder.block))]
    return model, blocks


class WithLoss(_Module):
    """model + its loss: (x, y) -> mean cross-entropy over the target tokens.
    GPT-2, Llama: x, y [B, T] int64, y = x shifted by one; logits [B, T, V] upcast to fp32
    (Hugging Face's Llama: its output's .logits, the same cross-entropy).
    T5: x [B, input_len] encoder ids, y [B, target_len] labels; Hugging Face's own loss
    (decoder inputs = labels shifted right), as its users train it."""

    def __init__(self, model, family, vocab, impl):
        super().__init__()
        self.model, self.family, self.vocab, self.impl = model, family, vocab, impl

    def forward(self, x, y):
        if self.family == "t5":
            return self.model(input_ids=x, labels=y).loss
        if self.impl == "hf":
            logits = self.model(input_ids=x).logits  # [B, T, V]
        else:
            logits = self.model(x)  # [B, T, V]
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), y.reshape(-1))


def decay_groups(model, weight_decay):
    """Weight decay on the 2-D weights that are not embeddings (nanoGPT / HF grouping)."""
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, other = [], []
    for p in model.parameters():  # tied weights once
        (decay if p.dim() == 2 and id(p) not in emb else other).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": other, "weight_decay": 0.0}]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def draw_batch(spec, device, gen):
    B, lo, V = spec["batch"], 3, spec["vocab"]
    if spec["family"] != "t5":
        data = torch.randint(0, V, (B, spec["seq_len"] + 1), device=device, generator=gen)
        return data[:, :-1], data[:, 1:]
    hi = V - T5_SENTINELS
    return (torch.randint(lo, hi, (B, spec["input_len"]), device=device, generator=gen),
            torch.randint(lo, hi, (B, spec["target_len"]), device=device, generator=gen))


def dynamo_report():
    """Graph breaks (total and the most frequent reasons) and graphs compiled so far."""
    c = torch._dynamo.utils.counters
    breaks = c.get("graph_break", {})
    top = sorted(breaks.items(), key=lambda kv: -kv[1])[:5]
    return {"graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": ["%s (x%d)" % (str(k).replace("\n", " ")[:200], v) for k, v in top],
            "unique_graphs": int(c.get("stats", {}).get("unique_graphs", 0))}


SETTLE_WINDOW = 3  # warm-up steps whose times must agree within --settle-tol


def settled_steps(warm, tol):
    """True when the last SETTLE_WINDOW warm-up step times agree within tol (max / min - 1)."""
    last = warm[-SETTLE_WINDOW:]
    return len(last) == SETTLE_WINDOW and max(last) <= (1.0 + tol) * min(last)


def warm_done(warm, args):
    """Whether the warm-up is over (the next step is timed): at least --warmup steps, then until
    the step time settles (settled_steps) or --warmup-max steps were run."""
    if len(warm) < args.warmup:
        return False
    return len(warm) >= args.warmup_max or settled_steps(warm, args.settle_tol)


def run(args, spec):
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True  # TF32 for whatever runs in fp32
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    if args.wrap == "fsdp2":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    try:
        torch.manual_seed(args.seed)
        model, blocks = build_model(spec, device, args.impl)
        n_params = sum(p.numel() for p in model.parameters())
        if n_params != spec["params"]:
            raise SystemExit("bench_torch_gpu.py: %s (--impl %s) has %d parameters, fsdp_train's has %d"
                             % (args.model, args.impl, n_params, spec["params"]))
        if spec["family"] == "llama":
            check_rope("%s (--impl %s)" % (args.model, args.impl), model, spec)
        # Each block compiled on its own shares one graph (same code, parameters as inputs);
        # never let the per-code-object recompile limit send some blocks back to eager.
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 4 * len(blocks)))
                break
        scope = args.compile_scope if args.wrap == "none" else "block"
        ckw = {} if args.compile_mode == "default" else {"mode": args.compile_mode}
        if args.mode == "compile" and scope == "block":
            for container, i in blocks:
                container[i] = torch.compile(container[i], fullgraph=args.impl == "plain", **ckw)
        if args.wrap == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for container, i in blocks:
                fully_shard(container[i], mp_policy=mp, reshard_after_forward=True)
            fully_shard(model, mp_policy=mp, reshard_after_forward=True)
            autocast = contextlib.nullcontext
        else:
            def autocast():
                return torch.autocast("cuda", dtype=torch.bfloat16)
        net = WithLoss(model, spec["family"], spec["vocab"], args.impl)
        if args.mode == "compile" and scope == "model":
            net = torch.compile(net, **ckw)  # the model and its loss: one compiled function
        opt = torch.optim.AdamW(decay_groups(model, 0.1), lr=6e-4, betas=(0.9, 0.999), eps=1e-8,
                                fused=True)
        gen = torch.Generator(device=device).manual_seed(args.seed)
        torch.cuda.reset_peak_memory_stats(device)
        times, losses, warm = [], [], []
        t_start = time.perf_counter()
        warmup_s = 0.0
        step = 0
        while len(times) < args.steps:
            x, y = draw_batch(spec, device, gen)
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            with autocast():
                loss = net(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize(device)
            dt = time.perf_counter() - t0
            losses.append(loss.item())
            step += 1
            timed = warm_done(warm, args)
            if not timed:
                warm.append(dt)
                warmup_s = time.perf_counter() - t_start
            else:
                times.append(dt)
            if args.verbose:
                print("step %d (%s) | loss %.4f | %.1f ms | %.0f tok/s" % (
                    step, "timed %d/%d" % (len(times), args.steps) if timed else "warm-up",
                    losses[-1], dt * 1e3, spec["tokens_per_step"] / dt), file=sys.stderr)
        if not all(math.isfinite(v) for v in losses):
            raise SystemExit("bench_torch_gpu.py: non-finite loss: %s" % losses)
        med = statistics.median(times)
        settled = settled_steps(warm, args.settle_tol)
        result = {
            "model": args.model, "mode": args.mode, "wrap": args.wrap, "impl": args.impl,
            "compile_scope": scope if args.mode == "compile" else "",
            "compile_mode": args.compile_mode if args.mode == "compile" else "",
            "tokens_per_sec": round(spec["tokens_per_step"] / med, 1),
            "step_ms": round(med * 1e3, 2), "step_ms_min": round(min(times) * 1e3, 2),
            "tokens_per_step": spec["tokens_per_step"], "flops_per_token": spec["flops_per_token"],
            "params": n_params,
            "max_memory_allocated": torch.cuda.max_memory_allocated(device),
            "max_memory_reserved": torch.cuda.max_memory_reserved(device),
            "warmup_s": round(warmup_s, 1), "warmup_steps": len(warm), "settled": settled,
            "compile_s": round(sum(max(0.0, w - med) for w in warm), 1),
            "first_loss": round(losses[0], 4),
            "last_loss": round(losses[-1], 4), "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(device),
        }
        result.update(dynamo_report())
        if args.impl == "hf":
            result["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        return result
    finally:
        if args.wrap == "fsdp2":
            dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--mode", choices=["eager", "compile"], default="eager")
    ap.add_argument("--wrap", choices=["none", "fsdp2"], default="none")
    ap.add_argument("--impl", choices=["plain", "hf"], default=None,
                    help="the PyTorch model: written here (plain) or transformers' (hf); default "
                         "and choices per family: gpt2 plain, t5 hf, llama plain | hf")
    ap.add_argument("--compile-scope", choices=["model", "block"], default="model",
                    help="--wrap none --mode compile: the whole model with its loss as one compiled "
                         "function (default), or each block (--wrap fsdp2 compiles each block)")
    ap.add_argument("--compile-mode", choices=["default", "max-autotune-no-cudagraphs"],
                    default="default", help="torch.compile's mode (--mode compile)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=3,
                    help="untimed steps first, at least (compilation); then until the step time "
                         "settles (--settle-tol) or --warmup-max")
    ap.add_argument("--warmup-max", type=int, default=30,
                    help="untimed steps at most (default 30; at least --warmup)")
    ap.add_argument("--settle-tol", type=float, default=0.02,
                    help="settled: the last 3 warm-up steps within this fraction (default 0.02)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--verbose", action="store_true", help="one line per step on stderr")
    ap.add_argument("--describe", action="store_true", help="print the model's shape and FLOPs, no run")
    ap.add_argument("--fsdp-train-toml", action="store_true",
                    help="print fsdp_train's configuration of --warmup + --steps steps, no run")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        ap.error("--steps must be >= 1 and --warmup >= 0")
    args.warmup_max = max(args.warmup_max, args.warmup)
    if args.settle_tol < 0:
        ap.error("--settle-tol must be >= 0")
    if args.mode == "eager" and args.compile_mode != "default":
        ap.error("--compile-mode %s needs --mode compile" % args.compile_mode)
    spec = describe(args.model)
    impls = IMPLS[spec["family"]]
    args.impl = args.impl or impls[0]
    if args.impl not in impls:
        ap.error("--impl %s: %s has %s" % (args.impl, args.model, " | ".join(impls)))
    if args.describe:
        print(json.dumps(spec))
        return 0
    if args.fsdp_train_toml:
        sys.stdout.write(fsdp_train_toml(args.model, args.warmup + args.steps, args.seed))
        return 0
    if torch is None:
        print("bench_torch_gpu.py: torch is not installed for %s" % sys.executable, file=sys.stderr)
        return 1
    if not hasattr(torch, "_dynamo") or "GPT2" not in globals():
        print("bench_torch_gpu.py: torch %s has no torch._dynamo (a run needs PyTorch >= 2.5)"
              % torch.__version__, file=sys.stderr)
        return 1
    if args.mode == "compile" and not hasattr(torch, "compile"):
        print("bench_torch_gpu.py: torch %s has no torch.compile (--mode compile needs PyTorch >= 2.0; "
              "the benchmark's runs >= 2.5)" % torch.__version__, file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench_torch_gpu.py: no CUDA device visible to torch", file=sys.stderr)
        return 1
    result = run(args, spec)
    if args.impl == "hf":
        import transformers
        result["transformers"] = transformers.__version__
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
