#!/usr/bin/env python3
"""tools/bench_async_save.py: the step-time cost of a checkpoint save, synchronous against
checkpoint.async_save (docs/benchmarks.md "Asynchronous checkpoint saves").

    python3 tools/bench_async_save.py BUILD_DIR [--rounds 2] [--steps 20] [--every 5]

Runs fsdp_train under `mpirun -np 2` on a GPT-2 of 8 layers x 512 wide (inputs/tiny.toml
with --set overrides), alternating sync and async runs (interleaved, `--rounds` of each),
and timestamps rank 0's per-step log lines as they arrive (train.log_every = 1). The time
between the lines of steps N-1 and N is step N plus whatever ran between them; a save of
step N runs after N's line, so the interval of step N+1 holds the synchronous save, and with
async_save the staging copy plus step N+1 slowed by the background write (and the commit at
a later boundary). Prints per run: the mean interval of steps right after a save, of the
other steps (the first two excluded: warm-up), and the run's wall time; then the means.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

p = argparse.ArgumentParser()
p.add_argument("build")
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--every", type=int, default=5)
a = p.parse_args()
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
train = os.path.join(os.path.abspath(a.build), "fsdp_train")
env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
MODEL = ["model.n_layer=8", "model.n_embd=512", "model.n_head=8", "model.n_positions=64",
         "data.seq_len=64", "train.global_batch_size=4", "train.log_every=1",
         "eval.every=0", "eval.max_windows=2"]
step_re = re.compile(r"^step (\d+)/")


def run(async_save, work):
    run_dir = os.path.join(work, "run")
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = MODEL + [f"train.max_steps={a.steps}", f"optim.decay_steps={a.steps}",
                    f"checkpoint.every={a.every}", f"train.run_dir={run_dir}",
                    f"checkpoint.async_save={'true' if async_save else 'false'}"]
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", train,
           os.path.join(root, "inputs", "tiny.toml")]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    stamps, notes = {}, []
    for line in proc.stdout:
        m = step_re.match(line)
        if m:
            stamps[int(m.group(1))] = time.monotonic()
        elif line.startswith("checkpoint:"):
            notes.append(line.strip())
    if proc.wait() != 0:
        sys.exit(f"fsdp_train failed: {' '.join(cmd)}")
    wall = time.monotonic() - t0
    after, other = [], []
    for n in range(3, a.steps + 1):
        d = stamps[n] - stamps[n - 1]
        (after if (n - 1) % a.every == 0 else other).append(d)
    shutil.rmtree(run_dir, ignore_errors=True)
    return statistics.mean(after), statistics.mean(other), wall, notes


work = tempfile.mkdtemp(prefix="bench_async_save.")
res = {False: [], True: []}
for r in range(a.rounds):
    for mode in (False, True):
        after, other, wall, notes = run(mode, work)
        res[mode].append((after, other, wall))
        print(f"round {r} {'async' if mode else 'sync '}: step after a save {after * 1000:8.1f} ms, "
              f"other steps {other * 1000:8.1f} ms, cost {1000 * (after - other):8.1f} ms, "
              f"wall {wall:6.1f} s", flush=True)
        for n in notes[:3]:
            print("   ", n)
shutil.rmtree(work, ignore_errors=True)
for mode in (False, True):
    rows = res[mode]
    print(f"{'async' if mode else 'sync '} mean: step after a save "
          f"{1000 * statistics.mean(r[0] for r in rows):.1f} ms, other steps "
          f"{1000 * statistics.mean(r[1] for r in rows):.1f} ms, cost "
          f"{1000 * statistics.mean(r[0] - r[1] for r in rows):.1f} ms, wall "
          f"{statistics.mean(r[2] for r in rows):.1f} s")
