#!/usr/bin/python3
"""Checks fsdp_merge from the outside: command-line behaviour, and its output parsed by an
independent safetensors reader (struct + numpy, no safetensors package).

Usage (ctest fsdp_merge_cli runs this after test_checkpoint left its fixture):
  check_merge.py --merge BIN --step-dir DIR --expected HF_DIR --work TMP
    1. `BIN --help` exits 0; no arguments and a missing step directory exit 2, naming it.
    2. `BIN DIR TMP/out` exits 0; TMP/out/model.safetensors parses (8-byte little-endian
       header size, space-padded JSON header, 8-byte aligned, contiguous offsets covering
       the whole data), its tensors are bit-identical to HF_DIR's (written by the library),
       the names/shapes are exactly those of a GPT2LMHeadModel state dict for config.json
       (lm_head.weight tied, so absent), and a GPT-2 forward pass with Hugging Face
       conventions (Conv1D: y = x @ W + b) runs on them and gives finite logits.
    3. With --t5-step-dir T5_DIR --t5-expected T5_HF_DIR: the same for a T5 checkpoint
       (names/shapes of a T5ForConditionalGeneration state dict, bit-identical to the
       library's merge; no forward pass).
    4. Sharded output (--max-shard-size, save_pretrained's max_shard_size) of each: "100"
       (GPT-2) and "1KB" (T5), below their largest tensors, give several
       model-0000k-of-0000N.safetensors and model.safetensors.index.json, read by
       following the index (every shard a safetensors file with {"format": "pt"}, the weight
       map exactly the shards' tensors, total_size their bytes), the tensors bit-identical to
       the single-file merge, and the assignment to shards the one recomputed here from the
       single file's tensor order (a new shard when the next tensor would take the shard's
       bytes past the limit; a larger tensor alone). A limit of exactly the tensors' bytes
       gives model.safetensors, one byte less two shards. Merging into the same directory
       again, single after sharded and sharded after single, leaves only the new files.
       Bad sizes ("5XB", "0", "1.5GB", "", a missing value) exit 2 with one line naming
       --max-shard-size and create nothing.
  check_merge.py OUT_DIR   only step 2's format/name/forward checks of an existing output
                           (model.safetensors, or the shards of model.safetensors.index.json).
  check_merge.py OUT_DIR --eval-bytes VAL.bin --seq-len L --windows N [--expect-loss X]
    also prints the mean next-token cross-entropy of the merged model over the first N
    non-overlapping L-token windows of VAL.bin's bytes (byte-level tokens; window i is
    inputs [iL, iL+L), targets shifted by one, as fsdp_train's validation), and fails if it
    differs from X by more than 1e-5. With VAL.bin = the validation bytes of a run
    (`tail -c <val tokens> corpus`), X = its final val_loss from metrics.jsonl: this checks
    the whole chain (training, sharded save, merge, HF names and Conv1D transposes).
"""
import argparse
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys

import numpy as np


def fail(msg):
    print("check_merge: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    if n % 8 != 0:
        fail(f"{path}: header size {n} is not a multiple of 8")
    header_bytes = raw[8:8 + n]
    text = header_bytes.decode("utf-8")
    if not text.rstrip(" ").endswith("}"):
        fail(f"{path}: header is not a JSON object padded with spaces")
    header = json.loads(text)
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    if meta.get("format") != "pt":
        fail(f"{path}: __metadata__.format is {meta.get('format')!r}, expected 'pt'")
    tensors = {}
    spans = []
    sizes = {"F32": 4, "BF16": 2, "F16": 2}  # what fsdp_merge writes (--dtype)
    for name, e in header.items():
        if e["dtype"] not in sizes:
            fail(f"{path}: {name} dtype {e['dtype']}")
        b, end = e["data_offsets"]
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        if end - b != sizes[e["dtype"]] * numel:
            fail(f"{path}: {name} offsets {b},{end} do not match shape {e['shape']}")
        spans.append((b, end))
        raw_t = data[b:end]
        if e["dtype"] == "F32":
            t = np.frombuffer(raw_t, dtype="<f4")
        elif e["dtype"] == "F16":
            t = np.frombuffer(raw_t, dtype="<f2").astype(np.float32)
        else:  # bfloat16: the high half of a float32
            t = (np.frombuffer(raw_t, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        tensors[name] = t.reshape(e["shape"])
    spans.sort()
    pos = 0
    for b, end in spans:
        if b != pos:
            fail(f"{path}: gap or overlap at byte {pos} of the data")
        pos = end
    if pos != len(data):
        fail(f"{path}: data is {len(data)} bytes, tensors cover {pos}")
    return list(header.keys()), tensors


SHARD_RE = re.compile(r"model-(\d{5,})-of-(\d{5,})\.safetensors")


def read_weights(out_dir):
    """The weights of a Hugging Face directory as from_pretrained finds them: model.safetensors,
    else the shards named by model.safetensors.index.json (checked against the index).
    Returns (names in file order, {name: array}, {name: file})."""
    single = os.path.join(out_dir, "model.safetensors")
    index_path = os.path.join(out_dir, "model.safetensors.index.json")
    shard_files = sorted(f for f in os.listdir(out_dir) if SHARD_RE.fullmatch(f))
    if os.path.exists(single):
        if os.path.exists(index_path) or shard_files:
            fail(f"{out_dir}: model.safetensors beside an index or shards {shard_files}")
        names, tensors = read_safetensors(single)
        return names, tensors, {n: "model.safetensors" for n in names}
    if not os.path.exists(index_path):
        fail(f"{out_dir}: neither model.safetensors nor model.safetensors.index.json")
    with open(index_path) as f:
        text = f.read()
    index = json.loads(text)
    if text != json.dumps(index, indent=2, sort_keys=True) + "\n":
        fail(f"{index_path}: not save_pretrained's json.dumps(indent=2, sort_keys=True) layout")
    if set(index) != {"metadata", "weight_map"} or not isinstance(index["metadata"].get("total_size"), int):
        fail(f"{index_path}: expected {{metadata: {{total_size: int}}, weight_map}}, got keys {sorted(index)}")
    weight_map = index["weight_map"]
    files = sorted(set(weight_map.values()))
    n = len(files)
    if n < 2 or files != [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]:
        fail(f"{index_path}: shard files {files} are not model-00001-of-{n:05d}.safetensors ...")
    if shard_files != files:
        fail(f"{out_dir}: shard files on disk {shard_files} differ from the index's {files}")
    names, tensors, where = [], {}, {}
    for file in files:
        shard_names, shard = read_safetensors(os.path.join(out_dir, file))
        mapped = sorted(t for t, f in weight_map.items() if f == file)
        if sorted(shard_names) != mapped:
            fail(f"{file}: holds {sorted(shard_names)}, the index maps {mapped} to it")
        for name in shard_names:
            if name in tensors:
                fail(f"{name} in two shards")
            names.append(name)
            tensors[name] = shard[name]
            where[name] = file
    total = sum(t.nbytes for t in tensors.values())
    if index["metadata"]["total_size"] != total:
        fail(f"{index_path}: total_size {index['metadata']['total_size']}, the tensors hold {total} bytes")
    return names, tensors, where


def expected_shards(names, tensors, limit):
    """transformers' shard_checkpoint over `names` in order: {name: 0-based shard}."""
    shard, size, out = 0, 0, {}
    for name in names:
        b = tensors[name].nbytes
        if out and size + b > limit:
            shard, size = shard + 1, 0
        out[name] = shard
        size += b
    return out


def hf_gpt2_shapes(cfg):
    C, V, P, L = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"], cfg["n_layer"]
    s = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C]}
    for i in range(L):
        h = f"transformer.h.{i}."
        s.update({h + "ln_1.weight": [C], h + "ln_1.bias": [C],
                  h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
                  h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
                  h + "ln_2.weight": [C], h + "ln_2.bias": [C],
                  h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
                  h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C]})
    s.update({"transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]})
    return s


def hf_t5_shapes(cfg):
    """T5ForConditionalGeneration state dict (tied duplicates embed_tokens left out)."""
    V, D, H = cfg["vocab_size"], cfg["d_model"], cfg["num_heads"]
    I, F, NB = H * cfg["d_kv"], cfg["d_ff"], cfg["relative_attention_num_buckets"]
    gated = cfg["feed_forward_proj"] == "gated-gelu"
    s = {"shared.weight": [V, D]}

    def attn(p):
        s.update({p + "q.weight": [I, D], p + "k.weight": [I, D], p + "v.weight": [I, D],
                  p + "o.weight": [D, I]})

    def ff(p):
        wi = ["wi_0", "wi_1"] if gated else ["wi"]
        s.update({f"{p}DenseReluDense.{w}.weight": [F, D] for w in wi})
        s.update({p + "DenseReluDense.wo.weight": [D, F], p + "layer_norm.weight": [D]})

    for stack, n in (("encoder", cfg["num_layers"]), ("decoder", cfg["num_decoder_layers"])):
        for i in range(n):
            p = f"{stack}.block.{i}.layer."
            attn(p + "0.SelfAttention.")
            if i == 0:
                s[p + "0.SelfAttention.relative_attention_bias.weight"] = [NB, H]
            s[p + "0.layer_norm.weight"] = [D]
            if stack == "decoder":
                attn(p + "1.EncDecAttention.")
                s[p + "1.layer_norm.weight"] = [D]
            ff(p + ("2." if stack == "decoder" else "1."))
        s[stack + ".final_layer_norm.weight"] = [D]
    if not cfg["tie_word_embeddings"]:
        s["lm_head.weight"] = [V, D]
    return s


def gpt2_forward(t, cfg, tokens):
    """GPT2LMHeadModel forward (eval mode) with HF conventions, in numpy float64."""
    C, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg["layer_norm_epsilon"]
    g = {k: v.astype(np.float64) for k, v in t.items()}

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    T = len(tokens)
    x = g["transformer.wte.weight"][tokens] + g["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        a = ln(x, g[p + "ln_1.weight"], g[p + "ln_1.bias"])
        qkv = a @ g[p + "attn.c_attn.weight"] + g[p + "attn.c_attn.bias"]  # Conv1D [C, 3C]
        q, k, v = np.split(qkv, 3, axis=-1)
        d = C // H
        q, k, v = (m.reshape(T, H, d).transpose(1, 0, 2) for m in (q, k, v))
        att = q @ k.transpose(0, 2, 1) / math.sqrt(d)
        att = att + np.triu(np.full((T, T), -np.inf), 1)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ g[p + "attn.c_proj.weight"] + g[p + "attn.c_proj.bias"]
        m = ln(x, g[p + "ln_2.weight"], g[p + "ln_2.bias"])
        m = gelu_new(m @ g[p + "mlp.c_fc.weight"] + g[p + "mlp.c_fc.bias"])
        x = x + m @ g[p + "mlp.c_proj.weight"] + g[p + "mlp.c_proj.bias"]
    x = ln(x, g["transformer.ln_f.weight"], g["transformer.ln_f.bias"])
    return x @ g["transformer.wte.weight"].T  # tied lm_head


def hf_llama_shapes(cfg):
    """LlamaForCausalLM's state-dict names and shapes for config.json `cfg` (nn.Linear [out, in];
    lm_head.weight only when untied: save_pretrained drops a tied head)."""
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    att_b, mlp_b = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)
    out = {"model.embed_tokens.weight": [V, C], "model.norm.weight": [C]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, o, k, b in (("self_attn.q_proj", H * D, C, att_b), ("self_attn.k_proj", Hkv * D, C, att_b),
                           ("self_attn.v_proj", Hkv * D, C, att_b), ("self_attn.o_proj", C, H * D, att_b),
                           ("mlp.gate_proj", I, C, mlp_b), ("mlp.up_proj", I, C, mlp_b),
                           ("mlp.down_proj", C, I, mlp_b)):
            out[p + n + ".weight"] = [o, k]
            if b:
                out[p + n + ".bias"] = [o]
        out[p + "input_layernorm.weight"] = [C]
        out[p + "post_attention_layernorm.weight"] = [C]
    if not cfg.get("tie_word_embeddings", False):
        out["lm_head.weight"] = [V, C]
    return out


def llama_inv_freq(cfg):
    """LlamaRotaryEmbedding's inverse frequencies, with rope_scaling "llama3" if given."""
    D, theta = cfg["head_dim"], cfg["rope_theta"]
    f = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) != "llama3":
        return f
    orig, factor = rs["original_max_position_embeddings"], rs["factor"]
    low, high = rs["low_freq_factor"], rs["high_freq_factor"]
    wl = 2 * math.pi / f
    smooth = (orig / wl - low) / (high - low)
    scaled = np.where(wl > orig / low, f / factor, f)
    medium = (wl >= orig / high) & (wl <= orig / low)
    return np.where(medium, (1 - smooth) * f / factor + smooth * f, scaled)


def llama_forward(t, cfg, tokens):
    """LlamaForCausalLM forward with HF conventions (RMSNorm, rotate-half RoPE, repeat_kv,
    SwiGLU), in numpy float64, written from the architecture's description."""
    H, Hkv, D = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    eps = cfg["rms_norm_eps"]
    g = {k: v.astype(np.float64) for k, v in t.items()}
    T = len(tokens)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def lin(x, name):
        y = x @ g[name + ".weight"].T
        return y + g[name + ".bias"] if name + ".bias" in g else y

    ang = np.arange(T, dtype=np.float64)[:, None] * llama_inv_freq(cfg)[None, :]
    cos, sin = np.cos(ang), np.sin(ang)  # [T, D/2]

    def rope(x):  # [heads, T, D]
        a, b = x[..., :D // 2], x[..., D // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = g["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms(x, g[p + "input_layernorm.weight"])
        q = rope(lin(a, p + "self_attn.q_proj").reshape(T, H, D).transpose(1, 0, 2))
        k = rope(lin(a, p + "self_attn.k_proj").reshape(T, Hkv, D).transpose(1, 0, 2))
        v = lin(a, p + "self_attn.v_proj").reshape(T, Hkv, D).transpose(1, 0, 2)
        k, v = np.repeat(k, H // Hkv, axis=0), np.repeat(v, H // Hkv, axis=0)
        att = q @ k.transpose(0, 2, 1) / math.sqrt(D) + np.triu(np.full((T, T), -np.inf), 1)
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        x = x + lin((att @ v).transpose(1, 0, 2).reshape(T, H * D), p + "self_attn.o_proj")
        m = rms(x, g[p + "post_attention_layernorm.weight"])
        gate, up = lin(m, p + "mlp.gate_proj"), lin(m, p + "mlp.up_proj")
        x = x + lin(gate / (1 + np.exp(-gate)) * up, p + "mlp.down_proj")
    x = rms(x, g["model.norm.weight"])
    head = g.get("lm_head.weight", g["model.embed_tokens.weight"])
    return x @ head.T


def check_llama_output(out_dir, cfg):
    if cfg.get("architectures") != ["LlamaForCausalLM"]:
        fail(f"{out_dir}/config.json: not a LlamaForCausalLM config")
    names, tensors, _ = read_weights(out_dir)
    want = hf_llama_shapes(cfg)
    if set(names) != set(want):
        fail(f"tensor names differ from LlamaForCausalLM: extra {sorted(set(names) - set(want))}, "
             f"missing {sorted(set(want) - set(names))}")
    for n, s in want.items():
        if list(tensors[n].shape) != s:
            fail(f"{n}: shape {list(tensors[n].shape)}, expected {s}")
    tokens = [i % cfg["vocab_size"] for i in range(min(16, cfg["max_position_embeddings"]))]
    logits = llama_forward(tensors, cfg, tokens)
    if logits.shape != (len(tokens), cfg["vocab_size"]) or not np.all(np.isfinite(logits)):
        fail("Llama forward on the merged tensors gave bad logits")
    return tensors


def forward(tensors, cfg, tokens):
    """The logits [T, V] of the merged causal LM (GPT-2 or Llama) on `tokens`."""
    return (llama_forward if cfg.get("model_type") == "llama" else gpt2_forward)(tensors, cfg, tokens)


def check_output(out_dir):
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") == "t5":
        return check_t5_output(out_dir, cfg)
    if cfg.get("model_type") == "llama":
        return check_llama_output(out_dir, cfg)
    if cfg.get("architectures") != ["GPT2LMHeadModel"] or cfg.get("model_type") != "gpt2":
        fail(f"{out_dir}/config.json: not a GPT2LMHeadModel config")
    if cfg.get("tie_word_embeddings") is not True:
        fail("config.json: tie_word_embeddings must be true (lm_head.weight is not stored)")
    names, tensors, _ = read_weights(out_dir)
    want = hf_gpt2_shapes(cfg)
    if set(names) != set(want):
        fail(f"tensor names differ from GPT2LMHeadModel: extra {sorted(set(names) - set(want))}, "
             f"missing {sorted(set(want) - set(names))}")
    for n, s in want.items():
        if list(tensors[n].shape) != s:
            fail(f"{n}: shape {list(tensors[n].shape)}, expected {s}")
    tokens = [i % cfg["vocab_size"] for i in range(cfg["n_positions"])]
    logits = gpt2_forward(tensors, cfg, tokens)
    if logits.shape != (len(tokens), cfg["vocab_size"]) or not np.all(np.isfinite(logits)):
        fail("GPT-2 forward on the merged tensors gave bad logits")
    return tensors


def check_t5_output(out_dir, cfg):
    """Names and shapes of a T5ForConditionalGeneration directory (no forward pass)."""
    if cfg.get("architectures") != ["T5ForConditionalGeneration"] or \
            cfg.get("is_encoder_decoder") is not True:
        fail(f"{out_dir}/config.json: not a T5ForConditionalGeneration config")
    names, tensors, _ = read_weights(out_dir)
    want = hf_t5_shapes(cfg)
    if set(names) != set(want):
        fail(f"tensor names differ from T5ForConditionalGeneration: extra "
             f"{sorted(set(names) - set(want))}, missing {sorted(set(want) - set(names))}")
    for n, sh in want.items():
        if list(tensors[n].shape) != sh:
            fail(f"{n}: shape {list(tensors[n].shape)}, expected {sh}")
        if not np.all(np.isfinite(tensors[n])):
            fail(f"{n}: non-finite values")
    return tensors


def compare_merge(merge, step_dir, expected, out_dir, extra=()):
    """Runs the tool on step_dir, checks its output and compares it with the library's
    single-file merge. Returns the tool's stdout and {tensor: file}."""
    rc, out = run([merge, step_dir, out_dir, *extra])
    if rc != 0:
        fail(f"merge {step_dir} {list(extra)}: rc {rc}, output {out!r}")
    got = check_output(out_dir)
    _, ref = read_safetensors(os.path.join(expected, "model.safetensors"))
    if set(got) != set(ref):
        fail(f"{out_dir}: tensor names differ from the library's merge in {expected}")
    for n in ref:
        if got[n].tobytes() != ref[n].tobytes():
            fail(f"{n}: differs from the library's merge in {expected}")
    with open(os.path.join(out_dir, "config.json")) as f, \
            open(os.path.join(expected, "config.json")) as g:
        if json.load(f) != json.load(g):
            fail("config.json differs from the library's merge")
    leftovers = [f for f in os.listdir(out_dir) if f.endswith(".tmp")]
    if leftovers:
        fail(f"temporary files left: {leftovers}")
    return out, read_weights(out_dir)[2]


def round_bf16(x):
    """float32 -> the nearest bfloat16 (ties to even), as float32 (finite x)."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


def check_dtypes(merge, step_dir, expected, work):
    """--dtype bf16 / fp16: each tensor the library's fp32 merge rounded to nearest-even
    (numpy's float16 cast; bfloat16 by the bits), config.json the same but for torch_dtype;
    an unknown --dtype is one line, exit 2, and no output directory."""
    _, ref = read_safetensors(os.path.join(expected, "model.safetensors"))
    with open(os.path.join(expected, "config.json")) as g:
        ref_cfg = json.load(g)
    for dtype, torch_name, st_name, rnd in (("bf16", "bfloat16", "BF16", round_bf16),
                                            ("fp16", "float16", "F16",
                                             lambda x: x.astype(np.float16).astype(np.float32))):
        out_dir = os.path.join(work, "out_" + dtype)
        rc, out = run([merge, step_dir, out_dir, "--dtype", dtype])
        if rc != 0:
            fail(f"--dtype {dtype}: rc {rc}, output {out!r}")
        names, got = read_safetensors(os.path.join(out_dir, "model.safetensors"))
        with open(os.path.join(out_dir, "model.safetensors"), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        if set(got) != set(ref) or any(header[k]["dtype"] != st_name for k in got):
            fail(f"--dtype {dtype}: tensors or dtypes differ: {sorted(got)}")
        for k in ref:
            if not np.array_equal(got[k], rnd(ref[k])):
                fail(f"--dtype {dtype}: {k} is not the fp32 merge rounded to nearest-even")
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg = json.load(f)
        if cfg.get("torch_dtype") != torch_name or dict(cfg, torch_dtype=None) != dict(ref_cfg, torch_dtype=None):
            fail(f"--dtype {dtype}: config.json torch_dtype {cfg.get('torch_dtype')!r} or other fields differ")
    bad_out = os.path.join(work, "out_f8")
    rc, out = run([merge, step_dir, bad_out, "--dtype", "f8"])
    if rc != 2 or len(out.strip().splitlines()) != 1 or "--dtype" not in out or os.path.exists(bad_out):
        fail(f"--dtype f8: rc {rc} (expected 2, one line naming --dtype, no output), output {out!r}")


def check_sharded(merge, step_dir, expected, out_dir, size, limit):
    """--max-shard-size `size` (= `limit` bytes, below the largest tensor's bytes): shards and
    index like save_pretrained's; merges into the same directory replace each other."""
    order, ref = read_safetensors(os.path.join(expected, "model.safetensors"))  # write order
    total = sum(t.nbytes for t in ref.values())
    out, where = compare_merge(merge, step_dir, expected, out_dir, ["--max-shard-size", size])
    want = expected_shards(order, ref, limit)
    n = max(want.values()) + 1
    got = {k: int(m.group(1)) - 1 if (m := SHARD_RE.fullmatch(f)) else -1 for k, f in where.items()}
    if n < 3 or got != want:
        fail(f"{out_dir}: shard assignment {where} is not shard_checkpoint's {want} at {size}")
    if not any(ref[k].nbytes > limit and list(want.values()).count(s) == 1 for k, s in want.items()):
        fail(f"{out_dir}: no tensor larger than {size} alone in its shard (the fixture should have one)")
    if f"model.safetensors.index.json ({n} shards: model-00001-of-{n:05d}.safetensors" not in out:
        fail(f"stdout does not name the index and {n} shards: {out!r}")
    # The same directory again: single replaces shards, shards replace single.
    compare_merge(merge, step_dir, expected, out_dir, ["--max-shard-size", str(total)])
    if not os.path.exists(os.path.join(out_dir, "model.safetensors")):
        fail(f"--max-shard-size {total} (exactly the tensors' bytes): expected one model.safetensors")
    _, where = compare_merge(merge, step_dir, expected, out_dir, ["--max-shard-size", str(total - 1)])
    if sorted(set(where.values())) != ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]:
        fail(f"--max-shard-size {total - 1}: expected 2 shards, got {sorted(set(where.values()))}")
    compare_merge(merge, step_dir, expected, out_dir, ["--max-shard-size", size])
    compare_merge(merge, step_dir, expected, out_dir, ["--max-shard-size", size])  # same names
    compare_merge(merge, step_dir, expected, out_dir)  # default 5GB: one file
    # Bad sizes: exit 2, one line naming the option, nothing created.
    bad_dir = out_dir + "_bad"
    for bad in (["--max-shard-size", "5XB"], ["--max-shard-size", "0"], ["--max-shard-size", "1.5GB"],
                ["--max-shard-size", ""], ["--max-shard-size=-1GB"], ["--max-shard-size"]):
        rc, out = run([merge, step_dir, bad_dir, *bad])
        if rc != 2 or "--max-shard-size" not in out or len(out.strip().splitlines()) != 1:
            fail(f"{bad}: rc {rc} (expected 2 and one line naming --max-shard-size), output {out!r}")
        if os.path.exists(bad_dir):
            fail(f"{bad}: created {bad_dir}")


def eval_loss(tensors, cfg, path, L, windows):
    with open(path, "rb") as f:
        toks = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    if L < 1 or windows < 1 or windows * L + 1 > len(toks):
        fail(f"--seq-len {L} --windows {windows} do not fit {len(toks)} tokens of {path}")
    losses = []
    for w in range(windows):
        x, y = toks[w * L:w * L + L], toks[w * L + 1:w * L + L + 1]
        lg = forward(tensors, cfg, list(x))
        lg = lg - lg.max(-1, keepdims=True)
        lp = lg - np.log(np.exp(lg).sum(-1, keepdims=True))
        losses.extend(-lp[np.arange(L), y])
    return float(np.mean(losses))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--merge")
    ap.add_argument("--step-dir")
    ap.add_argument("--expected")
    ap.add_argument("--work")
    ap.add_argument("--t5-step-dir")
    ap.add_argument("--t5-expected")
    ap.add_argument("--eval-bytes")
    ap.add_argument("--seq-len", type=int, default=0)
    ap.add_argument("--windows", type=int, default=0)
    ap.add_argument("--expect-loss", type=float)
    a = ap.parse_args()
    if a.out_dir:
        tensors = check_output(a.out_dir)
        if a.eval_bytes:
            with open(os.path.join(a.out_dir, "config.json")) as f:
                cfg = json.load(f)
            loss = eval_loss(tensors, cfg, a.eval_bytes, a.seq_len, a.windows)
            print(f"check_merge: val loss {loss:.10f}")
            if a.expect_loss is not None and abs(loss - a.expect_loss) > 1e-5:
                fail(f"val loss {loss} differs from the expected {a.expect_loss}")
        print("check_merge: OK")
        return
    if not (a.merge and a.step_dir and a.expected and a.work):
        ap.error("give OUT_DIR, or all of --merge --step-dir --expected --work")
    if bool(a.t5_step_dir) != bool(a.t5_expected):
        ap.error("--t5-step-dir and --t5-expected go together")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)

    rc, out = run([a.merge, "--help"])
    if rc != 0 or "STEP_DIR OUT_DIR" not in out:
        fail(f"--help: rc {rc}, output {out!r}")
    rc, out = run([a.merge])
    if rc != 2:
        fail(f"no arguments: rc {rc} (expected 2), output {out!r}")
    missing = os.path.join(a.work, "no_such_step")
    rc, out = run([a.merge, missing, os.path.join(a.work, "x")])
    if rc != 2 or missing not in out or len(out.strip().splitlines()) != 1:
        fail(f"missing step dir: rc {rc} (expected 2 and one line naming it), output {out!r}")

    # A step dir with one shard file removed: exit 2, the message names the file.
    partial = os.path.join(a.work, "partial")
    shutil.copytree(a.step_dir, partial)
    shards = sorted(f for f in os.listdir(partial) if f.endswith(".h5"))
    os.remove(os.path.join(partial, shards[-1]))
    rc, out = run([a.merge, partial, os.path.join(a.work, "y")])
    if rc != 2 or shards[-1] not in out:
        fail(f"missing shard file: rc {rc} (expected 2 naming {shards[-1]}), output {out!r}")

    rc, out = run([a.merge, "--help"])
    if "--max-shard-size" not in out:
        fail(f"--help does not document --max-shard-size: {out!r}")
    compare_merge(a.merge, a.step_dir, a.expected, os.path.join(a.work, "out"))
    check_dtypes(a.merge, a.step_dir, a.expected, a.work)
    # The tiny GPT-2 fixture's largest tensor is 256 bytes, T5's 8288.
    check_sharded(a.merge, a.step_dir, a.expected, os.path.join(a.work, "out_sharded"), "100", 100)
    if a.t5_step_dir:
        compare_merge(a.merge, a.t5_step_dir, a.t5_expected, os.path.join(a.work, "out_t5"))
        check_sharded(a.merge, a.t5_step_dir, a.t5_expected, os.path.join(a.work, "out_t5_sharded"),
                      "1KB", 1000)
    shutil.rmtree(a.work, ignore_errors=True)
    print("check_merge: OK")


if __name__ == "__main__":
    main()
