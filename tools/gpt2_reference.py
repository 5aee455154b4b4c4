#!/usr/bin/env python3
"""Reference values for tests/test_model.cpp (Gpt2.MatchesTorchReference*), computed with
PyTorch following Hugging Face transformers' GPT2LMHeadModel (models/gpt2/modeling_gpt2.py:
token + position embeddings, pre-LayerNorm blocks of causal self-attention and an MLP with
the tanh GELU "gelu_new", HF's Conv1D layers storing weights as [in, out], ln_f, and the LM
head tied to wte; mean cross-entropy over the targets) -- written from that description, not
copied. llm.c's test_gpt2 checks its model the same way against a PyTorch GPT-2.

Regenerate the committed fixtures (Debian: apt-get install -y python3-torch) from the
repository root:
    /usr/bin/python3 tools/gpt2_reference.py 3 > tests/data/gpt2/reference_3_layers.txt
    /usr/bin/python3 tools/gpt2_reference.py 1 > tests/data/gpt2/reference_1_layer.txt

ARG = n_layer. A tiny GPT-2 (n_embd 16, 2 heads, n_positions 8, vocab 37: not a multiple of
anything, so fsdp_train pads it) with seeded float32 weights drawn far from GPT-2's
initialisation (LayerNorm weights 1 + N(0, 0.3), biases N(0, 0.3), matrices N(0, 0.3)) so that
no term vanishes, run in float64 on one batch of B 2 x T 6 tokens. Lines:
    config <HF config.json, one line>
    batch B T
    tokens <B*T ids>
    targets <B*T ids>
    loss <mean cross-entropy over the B*T targets>
    logits <B*T*vocab_size values, row-major [B, T, V]>
    param <HF name> <numel> <float32 values, HF layout (Conv1D weights [in, out])>
    grad <HF name> <numel> <d(mean loss)/d(param), float64>
"""
import json
import math
import sys

import torch

N_EMBD, N_HEAD, N_POSITIONS, VOCAB, EPS = 16, 2, 8, 37, 1e-5
B, T = 2, 6


def hf_config(n_layer):
    """The config.json that fsdp_train's fsdp_merge writes for this shape."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": VOCAB,
        "n_positions": N_POSITIONS, "n_ctx": N_POSITIONS, "n_embd": N_EMBD,
        "n_layer": n_layer, "n_head": N_HEAD, "n_inner": None,
        "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
        "attn_pdrop": 0.0, "layer_norm_epsilon": EPS, "initializer_range": 0.02,
        "bos_token_id": VOCAB - 1, "eos_token_id": VOCAB - 1, "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }


def make_params(n_layer, gen):
    """HF GPT2LMHeadModel's state dict (lm_head.weight tied: not listed), float32 values."""
    C = N_EMBD
    normal = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32) * 0.3
    ones = lambda n: 1.0 + normal(n)
    p = {"transformer.wte.weight": normal(VOCAB, C), "transformer.wpe.weight": normal(N_POSITIONS, C)}
    for l in range(n_layer):
        h = f"transformer.h.{l}."
        p[h + "ln_1.weight"] = ones(C)
        p[h + "ln_1.bias"] = normal(C)
        p[h + "attn.c_attn.weight"] = normal(C, 3 * C)  # Conv1D: [in, out]
        p[h + "attn.c_attn.bias"] = normal(3 * C)
        p[h + "attn.c_proj.weight"] = normal(C, C)
        p[h + "attn.c_proj.bias"] = normal(C)
        p[h + "ln_2.weight"] = ones(C)
        p[h + "ln_2.bias"] = normal(C)
        p[h + "mlp.c_fc.weight"] = normal(C, 4 * C)
        p[h + "mlp.c_fc.bias"] = normal(4 * C)
        p[h + "mlp.c_proj.weight"] = normal(4 * C, C)
        p[h + "mlp.c_proj.bias"] = normal(C)
    p["transformer.ln_f.weight"] = ones(C)
    p["transformer.ln_f.bias"] = normal(C)
    return p


def layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased, as torch.nn.LayerNorm
    return (x - mean) / torch.sqrt(var + EPS) * w + b


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, n_layer, tokens):
    """Logits [B, T, V] of GPT2LMHeadModel (eval: no dropout)."""
    C, H = N_EMBD, N_HEAD
    D = C // H
    pos = torch.arange(T)
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][pos]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(n_layer):
        h = f"transformer.h.{l}."
        a = layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"])
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        heads = lambda t: t.view(B, T, H, D).transpose(1, 2)  # [B, H, T, D]
        q, k, v = heads(q), heads(k), heads(v)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"]
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        f = gelu_new(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"])
        x = x + f @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"]
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return x @ p["transformer.wte.weight"].T  # the tied LM head


def fmt(values, digits):
    return " ".join(f"{v:.{digits}e}" for v in values)


def main(argv):
    if len(argv) != 2 or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: gpt2_reference.py N_LAYER", file=sys.stderr)
        return 2
    n_layer = int(argv[1])
    gen = torch.Generator().manual_seed(1234 + n_layer)
    params32 = make_params(n_layer, gen)
    tokens = torch.randint(0, VOCAB, (B, T), generator=gen)
    targets = torch.randint(0, VOCAB, (B, T), generator=gen)
    params = {n: t.to(torch.float64).requires_grad_(True) for n, t in params32.items()}
    logits = forward(params, n_layer, tokens)
    loss = torch.nn.functional.cross_entropy(logits.view(B * T, VOCAB), targets.view(B * T))
    loss.backward()
    out = sys.stdout
    print("config " + json.dumps(hf_config(n_layer), separators=(",", ":")), file=out)
    print(f"batch {B} {T}", file=out)
    print("tokens " + " ".join(str(int(t)) for t in tokens.flatten()), file=out)
    print("targets " + " ".join(str(int(t)) for t in targets.flatten()), file=out)
    print(f"loss {loss.item():.17e}", file=out)
    print("logits " + fmt(logits.detach().flatten().tolist(), 17), file=out)
    for name, t in params32.items():
        print(f"param {name} {t.numel()} " + fmt(t.flatten().tolist(), 9), file=out)
    for name, t in params.items():
        print(f"grad {name} {t.numel()} " + fmt(t.grad.flatten().tolist(), 17), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
