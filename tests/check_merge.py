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
  check_merge.py OUT_DIR   only step 2's format/name/forward checks of an existing output.
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
    for name, e in header.items():
        if e["dtype"] != "F32":
            fail(f"{path}: {name} dtype {e['dtype']}")
        b, end = e["data_offsets"]
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        if end - b != 4 * numel:
            fail(f"{path}: {name} offsets {b},{end} do not match shape {e['shape']}")
        spans.append((b, end))
        tensors[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    spans.sort()
    pos = 0
    for b, end in spans:
        if b != pos:
            fail(f"{path}: gap or overlap at byte {pos} of the data")
        pos = end
    if pos != len(data):
        fail(f"{path}: data is {len(data)} bytes, tensors cover {pos}")
    return list(header.keys()), tensors


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


def check_output(out_dir):
    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") == "t5":
        return check_t5_output(out_dir, cfg)
    if cfg.get("architectures") != ["GPT2LMHeadModel"] or cfg.get("model_type") != "gpt2":
        fail(f"{out_dir}/config.json: not a GPT2LMHeadModel config")
    if cfg.get("tie_word_embeddings") is not True:
        fail("config.json: tie_word_embeddings must be true (lm_head.weight is not stored)")
    names, tensors = read_safetensors(os.path.join(out_dir, "model.safetensors"))
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
    names, tensors = read_safetensors(os.path.join(out_dir, "model.safetensors"))
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


def compare_merge(merge, step_dir, expected, out_dir):
    """Runs the tool on step_dir, checks its output and compares it with the library's."""
    rc, out = run([merge, step_dir, out_dir])
    if rc != 0:
        fail(f"merge {step_dir}: rc {rc}, output {out!r}")
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


def eval_loss(tensors, cfg, path, L, windows):
    with open(path, "rb") as f:
        toks = np.frombuffer(f.read(), dtype=np.uint8).astype(np.int64)
    if L < 1 or windows < 1 or windows * L + 1 > len(toks):
        fail(f"--seq-len {L} --windows {windows} do not fit {len(toks)} tokens of {path}")
    losses = []
    for w in range(windows):
        x, y = toks[w * L:w * L + L], toks[w * L + 1:w * L + L + 1]
        lg = gpt2_forward(tensors, cfg, list(x))
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

    compare_merge(a.merge, a.step_dir, a.expected, os.path.join(a.work, "out"))
    if a.t5_step_dir:
        compare_merge(a.merge, a.t5_step_dir, a.t5_expected, os.path.join(a.work, "out_t5"))
    shutil.rmtree(a.work, ignore_errors=True)
    print("check_merge: OK")


if __name__ == "__main__":
    main()
