#!/usr/bin/env python3
"""tests/check_bench_shapes.py: the GPU benchmark's PyTorch side counts what fsdp_train counts.

tools/bench_gpu.sh compares fsdp_train with PyTorch at the shapes of tools/bench_torch_gpu.py
MODELS (GPT-2 124M and 1.5B, t5-small/ByT5, Llama 3.2 1B) and computes every row's MFU from
bench_torch_gpu.py's FLOPs per token. This checks, without a GPU, for each model:

  1. the configuration `bench_torch_gpu.py --fsdp-train-toml` writes for fsdp_train is accepted
     by `fsdp_train --dry-run` (on the CPU), and every [model] key it writes (inline tables such
     as Llama's rope_scaling flattened to rope_scaling.factor, ...) is in the dry run's resolved
     configuration with the written value (so no key was dropped or defaulted: Llama's llama3
     factor 32 is not the default 8); needs tomllib (Python >= 3.11), else skipped with a note;
  2. the dry run builds exactly the parameter count `--describe` states (so the PyTorch model,
     checked against that count on the GPU, is fsdp_train's), and its banner's model FLOPs per
     token (ModelFamily::train_flops_per_sample, printed to 3 significant digits) equal
     `--describe`'s within that rounding;
  3. Llama only, with torch (Debian's python3-torch 1.13 will do; tools/install_deps.sh
     installs it, and without it this check fails, naming the package): bench_torch_gpu.py's
     plain PyTorch Llama (`--impl plain`) computes
     tools/llama_reference.py's LlamaForCausalLM (float64, written from HF's modeling_llama.py)
     on that script's tiny seeded cases -- GQA / MQA, tied / untied, llama3 / default RoPE,
     with and without biases -- with the same HF state-dict names (load_state_dict strict), the
     parameter count of `--describe`'s formula, logits and loss within 1e-6 (its RoPE tables are
     fp32); and llama_inv_freq (the RoPE frequencies the GPU run checks both PyTorch models
     against) equals llama_reference.inv_freq for those cases and for every llama MODELS entry.
     A torch without F.scaled_dot_product_attention (1.13) gets a stand-in of PyTorch's
     documented semantics (enable_gqa: K/V heads repeat_interleave'd to the query heads).
  4. the PyTorch runs' warm-up rule (bench_torch_gpu.py warm_done / settled_steps: at least
     --warmup steps, then until the last 3 agree within --settle-tol, at most --warmup-max),
     on step-time sequences with a compile step, a recompile and a never-settling one; and
     that a torch without torch.compile (Debian's 1.13) refuses --mode compile with a clear
     message (exit 1) while --compile-mode without --mode compile is a usage error (exit 2).

  check_bench_shapes.py --fsdp-train BIN --mpiexec MPIEXEC --work DIR
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS = os.path.normpath(os.path.join(HERE, "..", "tools"))
BENCH = os.path.join(TOOLS, "bench_torch_gpu.py")
PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
# tools/llama_reference.py's cases for check 3 (every attention kind, tie, RoPE and bias).
LLAMA_VARIANTS = ["3l_gqa_untied_llama3", "1l_gqa_tied_llama3", "1l_mqa_untied_llama3_attnbias_mlpbias",
                  "3l_mqa_tied_rope1e4_attnbias_mlpbias", "1l_mha_tied_llama3_mlpbias"]


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, prefix + k + "."))
        else:
            out[prefix + k] = v
    return out


def same_value(a, b):
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)


def resolved_model_keys(toml_text, dry_run_out):
    """[] when every [model] key of the written TOML has its value in the dry run's resolved
    configuration, else one line per difference; None when tomllib is missing."""
    try:
        import tomllib
    except ImportError:
        return None
    lines, inside = [], False
    for line in dry_run_out.splitlines():
        if line.startswith("# resolved config"):
            inside = True
            continue
        if inside:
            if re.match(r"^\w+: ", line):  # "device: cpu ...": the banner after the config
                break
            lines.append(line)
    resolved = flatten(tomllib.loads("\n".join(lines)).get("model", {}))
    written = flatten(tomllib.loads(toml_text)["model"])
    bad = []
    for k, v in written.items():
        if k not in resolved:
            bad.append("model.%s = %r is not in the resolved configuration" % (k, v))
        elif not same_value(v, resolved[k]):
            bad.append("model.%s: written %r, resolved %r" % (k, v, resolved[k]))
    return bad


def check_dry_run(bench_torch_gpu, a, m, bad):
    desc = json.loads(subprocess.run([sys.executable, BENCH, "--model", m, "--describe"],
                                     capture_output=True, text=True, check=True).stdout)
    toml_text = subprocess.run([sys.executable, BENCH, "--model", m, "--fsdp-train-toml"],
                               capture_output=True, text=True, check=True).stdout
    toml = os.path.join(a.work, m + ".toml")
    with open(toml, "w") as f:
        f.write(toml_text)
    r = subprocess.run([a.mpiexec, "-np", "1", a.fsdp_train, toml, "--dry-run", "--set", "train.device=cpu",
                        "--set", 'train.run_dir="%s"' % os.path.join(a.work, "run_" + m)],
                       capture_output=True, text=True)
    out = r.stdout + r.stderr
    params = re.search(r"^model: \w+, (\d+) parameters", out, re.M)
    flops = re.search(r"^mfu: model FLOPs ([0-9.]+) ([kMGTP]?)FLOP per token", out, re.M)
    if r.returncode != 0 or not params or not flops:
        bad.append("%s: fsdp_train --dry-run exited %d or printed no parameter / FLOP line:\n%s"
                   % (m, r.returncode, out[-1500:]))
        return
    # The banner counts the vocabulary padding rows (model.pad_vocab_multiple) in the
    # total and says how many: the model's own parameters are the difference.
    pad = re.search(r"^model: .*, (\d+) of them vocabulary padding", out, re.M)
    ours_params = int(params.group(1)) - (int(pad.group(1)) if pad else 0)
    ours_flops = float(flops.group(1)) * PREFIX[flops.group(2)]
    rel = abs(ours_flops - desc["flops_per_token"]) / desc["flops_per_token"]
    ok = ours_params == desc["params"] and rel <= 5e-3  # 3 significant digits
    print("%-14s parameters fsdp_train %d, bench %d; FLOP/token fsdp_train %.4g, bench %.6g "
          "(rel. diff %.1e): %s" % (m, ours_params, desc["params"], ours_flops,
                                    desc["flops_per_token"], rel, "ok" if ok else "MISMATCH"))
    if not ok:
        bad.append(m)
    keys = resolved_model_keys(toml_text, out)
    if keys is None:
        print("%-14s [model] keys against the resolved configuration: skipped (no tomllib in %s)"
              % (m, sys.executable))
    else:
        print("%-14s [model] keys written by --fsdp-train-toml, as resolved by fsdp_train: %s"
              % (m, "ok" if not keys else "MISMATCH"))
        bad.extend("%s: %s" % (m, k) for k in keys)


class _SdpaStandIn:
    """torch.nn.functional with scaled_dot_product_attention added for a torch without it:
    softmax(q k^T / sqrt(D) + causal mask) v, K/V heads repeat_interleave'd when enable_gqa
    (PyTorch's documented semantics)."""

    def __init__(self, F, torch):
        self._F, self._torch = F, torch

    def __getattr__(self, name):
        return getattr(self._F, name)

    def scaled_dot_product_attention(self, q, k, v, is_causal=False, enable_gqa=False):
        if enable_gqa and k.shape[-3] != q.shape[-3]:
            rep = q.shape[-3] // k.shape[-3]
            k, v = k.repeat_interleave(rep, dim=-3), v.repeat_interleave(rep, dim=-3)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        if is_causal:
            T, S = q.shape[-2], k.shape[-2]
            keep = self._torch.ones(T, S, dtype=self._torch.bool, device=q.device).tril()
            att = att.masked_fill(~keep, float("-inf"))
        return att.softmax(-1) @ v


def check_plain_llama(bench, bad):
    """Check 3 (see the top of this file)."""
    try:
        import torch
        sys.path.insert(0, TOOLS)
        import llama_reference
    except ImportError as e:
        bad.append("plain Llama against tools/llama_reference.py cannot run: %s in %s "
                   "(install python3-torch: tools/install_deps.sh)" % (e, sys.executable))
        return
    if bench.torch is None:
        bad.append("bench_torch_gpu.py did not import torch although %s has it" % sys.executable)
        return
    if not hasattr(bench.F, "scaled_dot_product_attention"):
        bench.F = _SdpaStandIn(bench.F, torch)
    torch.manual_seed(0)
    for name, m in sorted(bench.MODELS.items()):
        if m["family"] != "llama":
            continue
        cfg = {"head_dim": m["head_dim"], "rope_theta": m["rope_theta"], "rope_scaling": m.get("rope_scaling")}
        want = llama_reference.inv_freq(cfg).tolist()
        got = bench.llama_inv_freq(m)
        err = max(abs(g - w) / w for g, w in zip(got, want)) if len(got) == len(want) else float("inf")
        print("%-14s llama_inv_freq against llama_reference.inv_freq: max rel. diff %.1e: %s"
              % (name, err, "ok" if err <= 1e-12 else "MISMATCH"))
        if err > 1e-12:
            bad.append("%s: llama_inv_freq differs from llama_reference.inv_freq by %.1e" % (name, err))
    for variant in LLAMA_VARIANTS:
        cfg, params32, tokens, targets = llama_reference.make_case(variant)
        B, T = tokens.shape
        spec = {"family": "llama", "num_hidden_layers": cfg["num_hidden_layers"],
                "hidden_size": cfg["hidden_size"], "intermediate_size": cfg["intermediate_size"],
                "num_attention_heads": cfg["num_attention_heads"],
                "num_key_value_heads": cfg["num_key_value_heads"], "head_dim": cfg["head_dim"],
                "vocab": cfg["vocab_size"], "max_position_embeddings": cfg["max_position_embeddings"],
                "rms_norm_eps": cfg["rms_norm_eps"], "rope_theta": cfg["rope_theta"],
                "rope_scaling": cfg["rope_scaling"], "attention_bias": cfg["attention_bias"],
                "mlp_bias": cfg["mlp_bias"], "tie_word_embeddings": cfg["tie_word_embeddings"],
                "initializer_range": cfg["initializer_range"], "seq_len": T, "batch": B}
        problems = []
        model = bench.Llama(spec)
        n = sum(p.numel() for p in model.parameters())
        expected = bench.describe(None, spec)["params"]
        if n != expected:
            problems.append("%d parameters, --describe's formula says %d" % (n, expected))
        state = {k: v.double() for k, v in params32.items()}
        if cfg["tie_word_embeddings"]:
            state["lm_head.weight"] = state["model.embed_tokens.weight"]
        model = model.double()
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as e:
            problems.append("state-dict names differ from HF's: %s" % str(e).replace("\n", " ")[:300])
        if not problems:
            bench.check_rope(variant, model, spec)  # exits on a mismatch
            with torch.no_grad():
                logits = model(tokens)
                loss = bench.WithLoss(model, "llama", spec["vocab"], "plain")(tokens, targets).item()
                ref_logits = llama_reference.forward(state, cfg, tokens)
                ref_loss = llama_reference.mean_ce(ref_logits, targets).item()
            err = ((logits - ref_logits).abs().max() / ref_logits.abs().max()).item()
            lerr = abs(loss - ref_loss) / abs(ref_loss)
            if not (err <= 1e-6 and lerr <= 1e-6):
                problems.append("logits differ by %.1e (of the largest), loss %.9f vs %.9f" % (err, loss, ref_loss))
        print("plain Llama    %-40s against tools/llama_reference.py: %s"
              % (variant, "ok (%d parameters, logits rel. diff %.1e, loss rel. diff %.1e)" % (n, err, lerr)
                 if not problems else "MISMATCH: " + "; ".join(problems)))
        bad.extend("plain Llama %s: %s" % (variant, p) for p in problems)


def check_warmup(bench, bad):
    """Check 4 (see the top of this file)."""
    class A:
        warmup, warmup_max, settle_tol = 3, 30, 0.02

    def steps_to_settle(times, a=A):
        warm = []
        for t in times:
            if bench.warm_done(warm, a):
                return len(warm)
            warm.append(t)
        return None  # still warming when the sequence ended

    cases = [  # (what, step times in seconds, warm-up steps expected before the first timed one)
        ("compile then steady", [60.0, 0.101, 0.100, 0.1005, 0.1, 0.1], 4),
        ("steady from the start (eager)", [0.1, 0.1, 0.1, 0.1], 3),
        ("recompile at step 3", [60.0, 0.1, 20.0, 0.1, 0.1, 0.101, 0.1], 6),
        ("3 % apart: not settled", [5.0, 0.100, 0.103, 0.100, 0.1005, 0.1, 0.1], 6),
    ]
    for what, times, want in cases:
        got = steps_to_settle(times)
        ok = got == want
        print("warm-up rule   %-32s %d warm-up steps (expected %d): %s" % (what, got or -1, want, "ok" if ok else "WRONG"))
        if not ok:
            bad.append("warm-up rule, %s: %s warm-up steps, expected %d" % (what, got, want))
    never = [0.1 * (1 + 0.05 * (i % 2)) for i in range(40)]
    got = steps_to_settle(never)
    if got != A.warmup_max:
        bad.append("warm-up rule: a never-settling run warmed %s steps, expected --warmup-max %d" % (got, A.warmup_max))
    print("warm-up rule   %-32s %s warm-up steps (expected --warmup-max %d): %s"
          % ("never settles", got, A.warmup_max, "ok" if got == A.warmup_max else "WRONG"))
    r = subprocess.run([sys.executable, BENCH, "--model", "gpt2-124m", "--compile-mode",
                        "max-autotune-no-cudagraphs"], capture_output=True, text=True)
    if r.returncode != 2 or "needs --mode compile" not in r.stderr:
        bad.append("--compile-mode without --mode compile: exit %d, %r" % (r.returncode, r.stderr[-200:]))
    if bench.torch is not None and not hasattr(bench.torch, "compile"):
        r = subprocess.run([sys.executable, BENCH, "--model", "gpt2-124m", "--mode", "compile"],
                           capture_output=True, text=True)
        ok = r.returncode == 1 and "PyTorch >=" in r.stderr and not r.stdout.strip()
        print("torch %-8s --mode compile refused: %s" % (bench.torch.__version__.split("+")[0], "ok" if ok else "WRONG"))
        if not ok:
            bad.append("--mode compile under torch %s: exit %d, %r" % (bench.torch.__version__, r.returncode, r.stderr[-200:]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp-train", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    sys.path.insert(0, TOOLS)
    import bench_torch_gpu  # without torch it still has MODELS (and --describe, --fsdp-train-toml)
    bad = []
    for m in sorted(bench_torch_gpu.MODELS):
        check_dry_run(bench_torch_gpu, a, m, bad)
    check_plain_llama(bench_torch_gpu, bad)
    check_warmup(bench_torch_gpu, bad)
    for b in bad:
        print("check_bench_shapes.py: FAILED: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
