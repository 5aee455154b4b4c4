#!/usr/bin/env python3
"""tests/check_bench_shapes.py: the GPU benchmark's PyTorch side counts what fsdp_train counts.

tools/bench_gpu.sh compares fsdp_train with PyTorch at three shapes (tools/bench_torch_gpu.py
MODELS) and computes every row's MFU from bench_torch_gpu.py's FLOPs per token. This checks,
without torch or a GPU, for each model: the configuration `bench_torch_gpu.py
--fsdp-train-toml` writes for fsdp_train is accepted by `fsdp_train --dry-run` (on the CPU),
which builds exactly the parameter count `--describe` states (so the PyTorch model, checked
against that count on the GPU, is fsdp_train's), and whose banner's model FLOPs per token
(ModelFamily::train_flops_per_sample, printed to 3 significant digits) equal `--describe`'s
within that rounding.

  check_bench_shapes.py --fsdp-train BIN --mpiexec MPIEXEC --work DIR
"""
import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "tools", "bench_torch_gpu.py")
PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsdp-train", required=True)
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    sys.path.insert(0, os.path.dirname(BENCH))
    import bench_torch_gpu  # without torch it still has MODELS (and --describe, --fsdp-train-toml)
    models = sorted(bench_torch_gpu.MODELS)
    bad = []
    for m in models:
        desc = json.loads(subprocess.run([sys.executable, BENCH, "--model", m, "--describe"],
                                         capture_output=True, text=True, check=True).stdout)
        toml = os.path.join(a.work, m + ".toml")
        with open(toml, "w") as f:
            f.write(subprocess.run([sys.executable, BENCH, "--model", m, "--fsdp-train-toml"],
                                   capture_output=True, text=True, check=True).stdout)
        r = subprocess.run([a.mpiexec, "-np", "1", a.fsdp_train, toml, "--dry-run", "--set", "train.device=cpu",
                            "--set", 'train.run_dir="%s"' % os.path.join(a.work, "run_" + m)],
                           capture_output=True, text=True)
        out = r.stdout + r.stderr
        params = re.search(r"^model: \w+, (\d+) parameters", out, re.M)
        flops = re.search(r"^mfu: model FLOPs ([0-9.]+) ([kMGTP]?)FLOP per token", out, re.M)
        if r.returncode != 0 or not params or not flops:
            bad.append("%s: fsdp_train --dry-run exited %d or printed no parameter / FLOP line:\n%s"
                       % (m, r.returncode, out[-1500:]))
            continue
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
    for b in bad:
        print("check_bench_shapes.py: FAILED: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
