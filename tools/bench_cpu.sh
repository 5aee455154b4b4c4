#!/usr/bin/env bash
# tools/bench_cpu.sh: CPU benchmark of fsdp_train against PyTorch eager, plus the FSDP
# memory scaling check. Documented, with recorded figures, in docs/benchmarks.md.
#
# Part 1, throughput: GPT-2 with 4 layers, 4 heads, n_embd 128, seq_len 128, global batch 32,
# vocab 256, synthetic tokens, AdamW. fsdp_train runs at 1 rank with train.num_threads=2 and
# tools/bench_torch_gpt2.py trains the same model in PyTorch eager with 2 threads. The two
# are run interleaved (ours, torch, ours, torch, ...) for ROUNDS rounds so that background
# load on the machine hits both alike. Per run: the median tokens/s of the timed steps (ours:
# steps after the first OURS_SKIP, read from metrics.jsonl; torch: steps after TORCH_WARMUP).
# Reported: each run, the median over runs of each, and the ratio ours/torch.
#
# Part 2, memory: `fsdp_train --dry-run` with FULL_SHARD at N = 1, 2, 4 ranks prints the
# per-rank memory plan (rows sharded_params, unsharded_params, grads, unsharded_grads,
# optimizer_state, activations, comm_buffers, total), all reported. Model state = ZeRO's
# "model states", what each rank keeps between steps: sharded_params + grads (the gradient
# shard) + optimizer_state. The transient full units (unsharded_params, unsharded_grads) are
# listed beside it. Target: model state at N=4 <= 0.3x N=1.
#
# Usage: tools/bench_cpu.sh            (from anywhere; about 3-5 minutes on 2 cores)
# Environment (all optional):
#   FSDP_BUILD_DIR  build directory holding fsdp_train (default: <repo>/build). It is
#                   configured (Release, FSDP_CUDA=OFF) if it has no CMakeCache.txt, and
#                   fsdp_train is (re)built incrementally unless FSDP_NO_BUILD=1.
#   ROUNDS          interleaved rounds (default 3)
#   OURS_STEPS      fsdp_train steps per run (default 30); OURS_SKIP leading steps dropped (5)
#   TORCH_STEPS     PyTorch steps per run (default 20); TORCH_WARMUP untimed steps (5)
#   THREADS         threads for both programs (default 2)
#   PYTHON          interpreter with torch (default /usr/bin/python3, Debian's python3-torch)
set -euo pipefail

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Keep OpenBLAS/OpenMP from taking their own thread counts from the environment.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS || true

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build}"
"$REPO/tools/install_deps.sh" --bench   # python3-torch for the PyTorch side
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
ROUNDS="${ROUNDS:-3}"
OURS_STEPS="${OURS_STEPS:-30}"
OURS_SKIP="${OURS_SKIP:-5}"
TORCH_STEPS="${TORCH_STEPS:-20}"
TORCH_WARMUP="${TORCH_WARMUP:-5}"
THREADS="${THREADS:-2}"
PYTHON="${PYTHON:-/usr/bin/python3}"

# Benchmark shape (both programs).
N_LAYER=4 N_HEAD=4 N_EMBD=128 SEQ_LEN=128 BATCH=32 VOCAB=256

die() { echo "bench_cpu.sh: $*" >&2; exit 1; }
[[ "$OURS_STEPS" -gt "$OURS_SKIP" ]] || die "OURS_STEPS ($OURS_STEPS) must exceed OURS_SKIP ($OURS_SKIP)"
[[ "$TORCH_STEPS" -gt "$TORCH_WARMUP" ]] || die "TORCH_STEPS must exceed TORCH_WARMUP"
[[ "$ROUNDS" -ge 1 ]] || die "ROUNDS must be >= 1"
command -v mpirun >/dev/null || die "mpirun not found"
"$PYTHON" -c "import torch" 2>/dev/null || die "$PYTHON cannot import torch (set PYTHON=...)"

# ---- build --------------------------------------------------------------------------------
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  echo "configuring $BUILD_DIR (Release, FSDP_CUDA=OFF)"
  cmake -S "$REPO" -B "$BUILD_DIR" -DFSDP_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
if [[ "${FSDP_NO_BUILD:-0}" != 1 ]]; then
  echo "building fsdp_train in $BUILD_DIR"
  cmake --build "$BUILD_DIR" -j"$(nproc)" --target fsdp_train >"${TMPDIR:-/tmp}/fsdp_bench_build.$$.log" 2>&1 ||
    { tail -40 "${TMPDIR:-/tmp}/fsdp_bench_build.$$.log" >&2; die "build failed"; }
  rm -f "${TMPDIR:-/tmp}/fsdp_bench_build.$$.log"
fi
BIN="$BUILD_DIR/fsdp_train"
[[ -x "$BIN" ]] || die "$BIN not found"

WORK="$(mktemp -d /tmp/fsdp_bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# One self-contained config, so the benchmark does not follow edits to inputs/*.toml.
CFG="$WORK/bench.toml"
cat >"$CFG" <<EOF
# fsdp_train benchmark configuration (written by tools/bench_cpu.sh)
[model]
n_layer = $N_LAYER
n_head = $N_HEAD
n_embd = $N_EMBD
n_positions = $SEQ_LEN
vocab_size = $VOCAB

[data]
source = "synthetic"
seq_len = $SEQ_LEN

[train]
global_batch_size = $BATCH
max_steps = $OURS_STEPS
seed = 1234
log_every = 1
num_threads = $THREADS

[optim]
name = "adamw"
lr = 1e-3
min_lr = 1e-4
warmup_steps = 5
weight_decay = 0.1
grad_clip = 1.0

[fsdp]
sharding_strategy = "FULL_SHARD"
auto_wrap_policy = "TRANSFORMER_BASED_WRAP"
transformer_layer_cls_to_wrap = ["GPT2Block"]

[checkpoint]
every = 0

[eval]
every = 0
max_windows = 1
EOF

# median of the numbers on stdin (one per line)
median() { "$PYTHON" -c 'import sys,statistics; v=[float(x) for x in sys.stdin.read().split()]; print(f"{statistics.median(v):.1f}")'; }

# ---- part 1: throughput, interleaved --------------------------------------------------------
run_ours() {  # $1 = round; prints the run's median tokens/s
  local dir="$WORK/ours_$1"
  mpirun -np 1 --oversubscribe "$BIN" "$CFG" --set "train.run_dir=\"$dir\"" \
    >"$WORK/ours_$1.log" 2>&1 || { cat "$WORK/ours_$1.log" >&2; die "fsdp_train failed (round $1)"; }
  "$PYTHON" - "$dir/metrics.jsonl" "$OURS_SKIP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skip = int(sys.argv[2])
rates = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r and r["step"] > skip]
if not rates:
    sys.exit("no timed steps in " + sys.argv[1])
print(f"{statistics.median(rates):.1f}")
PY
}

run_torch() {  # $1 = round; prints the run's median tokens/s
  local out
  out="$("$PYTHON" "$REPO/tools/bench_torch_gpt2.py" --n-layer $N_LAYER --n-head $N_HEAD \
    --n-embd $N_EMBD --seq-len $SEQ_LEN --batch $BATCH --vocab $VOCAB --threads "$THREADS" \
    --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP")" || die "bench_torch_gpt2.py failed (round $1)"
  awk '$1 == "torch_tokens_per_sec" { print $2 }' <<<"$out"
}

echo "throughput: $ROUNDS interleaved rounds; fsdp_train $OURS_STEPS steps (median of steps" \
     "> $OURS_SKIP), torch $TORCH_STEPS steps (median after $TORCH_WARMUP warmup); $THREADS threads"
OURS=() TORCH=()
START=$SECONDS
for ((r = 1; r <= ROUNDS; r++)); do
  o="$(run_ours "$r")";  OURS+=("$o");  echo "  round $r: fsdp_train $o tok/s"
  t="$(run_torch "$r")"; TORCH+=("$t"); echo "  round $r: torch      $t tok/s"
done
OURS_MED="$(printf '%s\n' "${OURS[@]}" | median)"
TORCH_MED="$(printf '%s\n' "${TORCH[@]}" | median)"
RATIO="$(awk -v a="$OURS_MED" -v b="$TORCH_MED" 'BEGIN { printf "%.2f", a / b }')"
echo "  median: fsdp_train $OURS_MED tok/s, torch $TORCH_MED tok/s, ratio $RATIO" \
     "($((SECONDS - START)) s)"

# ---- part 2: per-rank memory plan, FULL_SHARD at N = 1, 2, 4 --------------------------------
declare -A MEM
NS=(1 2 4)
ROWS=(sharded_params unsharded_params grads unsharded_grads optimizer_state activations comm_buffers total)
for n in "${NS[@]}"; do
  log="$WORK/dry_$n.log"
  mpirun -np "$n" --oversubscribe "$BIN" "$CFG" --dry-run \
    --set "train.run_dir=\"$WORK/dry_$n\"" >"$log" 2>&1 ||
    { cat "$log" >&2; die "dry run at N=$n failed"; }
  for row in "${ROWS[@]}"; do
    v="$(awk -v k="$row" '/^memory plan per rank/ { on = 1; next } on && $1 == k { print $2; exit }' "$log")"
    [[ -n "$v" ]] || { cat "$log" >&2; die "no '$row' row in the N=$n memory plan"; }
    MEM[$n,$row]="$v"
  done
  MEM[$n,state]=$((MEM[$n,sharded_params] + MEM[$n,grads] + MEM[$n,optimizer_state]))
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
RATIO_STATE="$(ratio "${MEM[4,state]}" "${MEM[1,state]}")"

# ---- summary (markdown) ---------------------------------------------------------------------
met() { awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN { ok = (op == ">=") ? (x >= y) : (x <= y); print ok ? "met" : "NOT met" }'; }
echo
echo "### Summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
echo
TORCH_VER="$("$PYTHON" -c 'import torch; print(torch.__version__)')"
BLAS_VER="$(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo unknown)"
echo "GPT-2 ${N_LAYER}L/${N_HEAD}H/${N_EMBD}C, seq $SEQ_LEN, global batch $BATCH, vocab $VOCAB, AdamW, $THREADS threads, 1 rank."
echo "torch $TORCH_VER ($PYTHON), OpenBLAS $BLAS_VER, fsdp_train from $BIN."
echo
echo "| round | fsdp_train tok/s | PyTorch eager tok/s |"
echo "|---|---:|---:|"
for ((r = 0; r < ROUNDS; r++)); do echo "| $((r + 1)) | ${OURS[$r]} | ${TORCH[$r]} |"; done
echo "| **median** | **$OURS_MED** | **$TORCH_MED** |"
echo
echo "Ratio fsdp_train / PyTorch (medians): **$RATIO** (target >= 1.0: $(met "$RATIO" ">=" 1.0))"
echo
echo "Per-rank memory plan, FULL_SHARD (\`fsdp_train --dry-run\`), bytes:"
echo
echo "| row | N=1 | N=2 | N=4 |"
echo "|---|---:|---:|---:|"
for row in "${ROWS[@]}"; do
  echo "| $row | ${MEM[1,$row]} | ${MEM[2,$row]} | ${MEM[4,$row]} |"
done
echo "| **model state** = sharded_params + grads + optimizer_state | **${MEM[1,state]}** | **${MEM[2,state]}** | **${MEM[4,state]}** |"
echo
echo "Model state N=4 / N=1: **$RATIO_STATE** (target <= 0.3: $(met "$RATIO_STATE" "<=" 0.3))"
