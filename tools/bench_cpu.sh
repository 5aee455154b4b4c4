#!/usr/bin/env bash
# tools/bench_cpu.sh: CPU benchmark of fsdp_train against PyTorch eager, plus the FSDP memory
# scaling check; with --scaling, tokens/s and activation memory against width and sequence
# length. Documented, with recorded figures, in docs/benchmarks.md.
#
# Part 1, throughput (default): GPT-2 with 4 layers, 4 heads, n_embd 128, seq_len 128, global
# batch 32, vocab 256, synthetic tokens, AdamW, FULL_SHARD. Per round, interleaved so that
# background load on the machine hits every program alike:
#   fsdp_train 1 rank x 1 thread, 1 rank x THREADS threads, THREADS ranks x 1 thread
#   (`mpirun -np R` with Open MPI's default binding: what a user types);
#   tools/bench_torch_gpt2.py at THREADS threads, untuned (plain `python3`) and tuned
#   (TORCH_TUNED_ENV below: what a user who profiles their run sets).
# Per run: the median tokens/s of the timed steps (ours: steps after OURS_SKIP, read from
# metrics.jsonl; torch: steps after TORCH_WARMUP). Reported: each run, the median over rounds
# of each, the thread scaling (1 x THREADS over 1 x 1) and the ratios against PyTorch; the
# ratio that counts is 1 rank x THREADS threads over the tuned PyTorch.
#
# Part 2, memory: `fsdp_train --dry-run` with FULL_SHARD at N = 1, 2, 4 ranks prints the
# per-rank memory plan, all rows reported. Model state = ZeRO's "model states", what each rank
# keeps between steps: sharded_params + grads (the gradient shard) + optimizer_state.
# Target: model state at N=4 <= 0.3x N=1.
#
# --scaling (instead of parts 1 and 2): for n_embd in WIDTHS x seq_len in SEQS (4 layers, head
# size 32, 4096 tokens per step = global batch 4096 / seq_len, vocab 256), fsdp_train at
# 1 rank x THREADS threads and the tuned PyTorch, interleaved, SCALING_ROUNDS rounds; with
# each shape's activation memory: ours from the --dry-run plan (`activations` row; attention
# keeps only its output and an fp32 row logsumexp per layer since issue 20), PyTorch's as the
# bytes autograd saves for backward in one step (bench_torch_gpt2.py --activation-bytes).
#
# Usage: tools/bench_cpu.sh [--scaling]   (from anywhere; part 1+2 about 6 minutes on 2 cores,
#                                          --scaling about 8 minutes a round)
# Environment (all optional):
#   FSDP_BUILD_DIR  build directory holding fsdp_train (default: <repo>/build). It is
#                   configured (Release, FSDP_CUDA=OFF) if it has no CMakeCache.txt, and
#                   fsdp_train is (re)built incrementally unless FSDP_NO_BUILD=1.
#   ROUNDS          interleaved rounds of part 1 (default 3); SCALING_ROUNDS of --scaling (1)
#   OURS_STEPS      fsdp_train steps per run (default 30); OURS_SKIP leading steps dropped (5)
#   TORCH_STEPS     PyTorch steps per run (default 20); TORCH_WARMUP untimed steps (5)
#   THREADS         threads (default 2)
#   WIDTHS, SEQS    --scaling shapes (default "128 256 512 768", "128 512 1024")
#   PYTHON          interpreter with torch (default /usr/bin/python3, Debian's python3-torch)
set -euo pipefail

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Neither program takes thread counts from the environment here: both are given THREADS.
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS OMP_WAIT_POLICY || true

MODE=throughput
case "${1:-}" in
  "") ;;
  --scaling) MODE=scaling ;;
  *) echo "usage: $0 [--scaling]" >&2; exit 2 ;;
esac

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build}"
"$REPO/tools/install_deps.sh" --bench   # python3-torch for the PyTorch side
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
ROUNDS="${ROUNDS:-3}"
SCALING_ROUNDS="${SCALING_ROUNDS:-1}"
OURS_STEPS="${OURS_STEPS:-30}"
OURS_SKIP="${OURS_SKIP:-5}"
TORCH_STEPS="${TORCH_STEPS:-20}"
TORCH_WARMUP="${TORCH_WARMUP:-5}"
THREADS="${THREADS:-2}"
WIDTHS="${WIDTHS:-128 256 512 768}"
SEQS="${SEQS:-128 512 1024}"
PYTHON="${PYTHON:-/usr/bin/python3}"
# PyTorch as a user who profiled it runs it: libgomp threads sleep instead of spinning
# (otherwise they fight OpenBLAS's own pthreads for the cores), and glibc keeps freed
# activation memory instead of returning it to the kernel every step (trim threshold raised,
# mmap threshold at glibc's maximum, 32 MiB).
TORCH_TUNED_ENV=(OMP_WAIT_POLICY=PASSIVE MALLOC_TRIM_THRESHOLD_=17179869184
                 MALLOC_MMAP_THRESHOLD_=33554432)

die() { echo "bench_cpu.sh: $*" >&2; exit 1; }
[[ "$OURS_STEPS" -gt "$OURS_SKIP" ]] || die "OURS_STEPS ($OURS_STEPS) must exceed OURS_SKIP ($OURS_SKIP)"
[[ "$TORCH_STEPS" -gt "$TORCH_WARMUP" ]] || die "TORCH_STEPS must exceed TORCH_WARMUP"
[[ "$ROUNDS" -ge 1 && "$SCALING_ROUNDS" -ge 1 ]] || die "ROUNDS and SCALING_ROUNDS must be >= 1"
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

# write_config FILE N_EMBD N_HEAD SEQ_LEN BATCH: one self-contained config, so the benchmark
# does not follow edits to inputs/*.toml. 4 layers, vocab 256.
write_config() {
  cat >"$1" <<EOF
# fsdp_train benchmark configuration (written by tools/bench_cpu.sh)
[model]
n_layer = 4
n_head = $3
n_embd = $2
n_positions = $4
vocab_size = 256

[data]
source = "synthetic"
seq_len = $4

[train]
global_batch_size = $5
max_steps = $OURS_STEPS
seed = 1234
log_every = 1

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
}

# median of the numbers on stdin (one per line)
median() { "$PYTHON" -c 'import sys,statistics; v=[float(x) for x in sys.stdin.read().split()]; print(f"{statistics.median(v):.1f}")'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
met() { awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN { ok = (op == ">=") ? (x >= y) : (x <= y); print ok ? "met" : "NOT met" }'; }

# run_ours CFG RANKS THREADS TAG: the run's median tokens/s.
run_ours() {
  local dir="$WORK/ours_$4"
  mpirun -np "$2" "$BIN" "$1" --set "train.run_dir=\"$dir\"" --set "train.num_threads=$3" \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; die "fsdp_train failed ($4)"; }
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

# run_torch tuned|untuned N_EMBD N_HEAD SEQ_LEN BATCH [extra args]: prints the script's output
# lines (torch_tokens_per_sec ..., torch_activation_bytes ...).
run_torch() {
  local envs=()
  [[ "$1" == tuned ]] && envs=("${TORCH_TUNED_ENV[@]}")
  env "${envs[@]}" "$PYTHON" "$REPO/tools/bench_torch_gpt2.py" --n-layer 4 --n-head "$3" \
    --n-embd "$2" --seq-len "$4" --batch "$5" --vocab 256 --threads "$THREADS" \
    --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" "${@:6}" || die "bench_torch_gpt2.py failed ($1)"
}
torch_field() { awk -v k="$1" '$1 == k { print $2 }'; }

# dry_run CFG RANKS: fsdp_train --dry-run; prints the path of its log (the memory plan).
dry_run() {
  local log="$WORK/dry_$(basename "$1" .toml)_$2.log"
  mpirun -np "$2" --oversubscribe "$BIN" "$1" --dry-run --set "train.run_dir=\"$WORK/dry\"" \
    >"$log" 2>&1 || { cat "$log" >&2; die "dry run of $1 at N=$2 failed"; }
  echo "$log"
}
# plan_row LOG ROW: one row of the per-rank memory plan in a dry run's LOG, in bytes.
plan_row() {
  local v
  v="$(awk -v k="$2" '/^memory plan per rank/ { on = 1; next } on && $1 == k { print $2; exit }' "$1")"
  [[ -n "$v" ]] || { cat "$1" >&2; die "no '$2' row in the memory plan of $1"; }
  echo "$v"
}

machine_line() {
  echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//');" \
       "torch $("$PYTHON" -c 'import torch; print(torch.__version__)') ($PYTHON)," \
       "OpenBLAS $(dpkg-query -W -f='${Version}' libopenblas0-pthread 2>/dev/null || echo unknown)," \
       "fsdp_train from $BIN (git $(git -C "$REPO" describe --always --dirty 2>/dev/null || echo unknown))"
}

# ---- --scaling ------------------------------------------------------------------------------
if [[ "$MODE" == scaling ]]; then
  TOKENS=4096
  echo "scaling: 4 layers, head size 32, $TOKENS tokens per step, $SCALING_ROUNDS round(s);" \
       "fsdp_train 1 rank x $THREADS threads, torch tuned at $THREADS threads"
  declare -A OURS TORCH ACT TACT
  for ((r = 1; r <= SCALING_ROUNDS; r++)); do
    for C in $WIDTHS; do
      for T in $SEQS; do
        H=$((C / 32)); B=$((TOKENS / T))
        cfg="$WORK/scale_${C}_${T}.toml"
        write_config "$cfg" "$C" "$H" "$T" "$B"
        o="$(run_ours "$cfg" 1 "$THREADS" "s${C}_${T}_$r")"
        out="$(run_torch tuned "$C" "$H" "$T" "$B" --activation-bytes)"
        t="$(torch_field torch_tokens_per_sec <<<"$out")"
        OURS[$C,$T]+="$o " TORCH[$C,$T]+="$t "
        TACT[$C,$T]="$(torch_field torch_activation_bytes <<<"$out")"
        if ((r == 1)); then
          ACT[$C,$T]="$(plan_row "$(dry_run "$cfg" 1)" activations)"
        fi
        echo "  round $r: n_embd $C seq $T (batch $B, $H heads): fsdp_train $o tok/s, torch tuned $t tok/s"
      done
    done
  done
  mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
  echo
  echo "### Scaling ($(date -u +%Y-%m-%dT%H:%MZ); $(machine_line))"
  echo
  echo "| n_embd | seq | batch | fsdp_train tok/s | PyTorch tuned tok/s | ratio | fsdp_train activations MiB | PyTorch saved for backward MiB |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|"
  for C in $WIDTHS; do
    for T in $SEQS; do
      o="$(printf '%s\n' ${OURS[$C,$T]} | median)"; t="$(printf '%s\n' ${TORCH[$C,$T]} | median)"
      echo "| $C | $T | $((TOKENS / T)) | $o | $t | $(ratio "$o" "$t") | $(mib "${ACT[$C,$T]}") | $(mib "${TACT[$C,$T]}") |"
    done
  done
  exit 0
fi

# ---- part 1: throughput, interleaved --------------------------------------------------------
CFG="$WORK/bench.toml"
write_config "$CFG" 128 4 128 32
LAYOUTS=("1 1" "1 $THREADS" "$THREADS 1")  # ranks threads
echo "throughput: $ROUNDS interleaved rounds; fsdp_train $OURS_STEPS steps (median of steps" \
     "> $OURS_SKIP), torch $TORCH_STEPS steps (median after $TORCH_WARMUP warmup)"
declare -A RES
START=$SECONDS
for ((r = 1; r <= ROUNDS; r++)); do
  for layout in "${LAYOUTS[@]}"; do
    read -r np th <<<"$layout"
    v="$(run_ours "$CFG" "$np" "$th" "${np}x${th}_$r")"; RES[ours$np,$th]+="$v "
    echo "  round $r: fsdp_train $np rank(s) x $th thread(s): $v tok/s"
  done
  for kind in untuned tuned; do
    v="$(run_torch "$kind" 128 4 128 32 | torch_field torch_tokens_per_sec)"; RES[torch_$kind]+="$v "
    echo "  round $r: torch $kind, $THREADS threads: $v tok/s"
  done
done
declare -A MED
for key in "${!RES[@]}"; do MED[$key]="$(printf '%s\n' ${RES[$key]} | median)"; done
echo "  ($((SECONDS - START)) s)"

# ---- part 2: per-rank memory plan, FULL_SHARD at N = 1, 2, 4 --------------------------------
declare -A MEM
NS=(1 2 4)
ROWS=(sharded_params unsharded_params grads unsharded_grads optimizer_state activations comm_buffers total)
for n in "${NS[@]}"; do
  log="$(dry_run "$CFG" "$n")"
  for row in "${ROWS[@]}"; do MEM[$n,$row]="$(plan_row "$log" "$row")"; done
  MEM[$n,state]=$((MEM[$n,sharded_params] + MEM[$n,grads] + MEM[$n,optimizer_state]))
done
RATIO_STATE="$(awk -v a="${MEM[4,state]}" -v b="${MEM[1,state]}" 'BEGIN { printf "%.3f", a / b }')"

# ---- summary (markdown) ---------------------------------------------------------------------
O11="${MED[ours1,1]}" O1T="${MED[ours1,$THREADS]}" OT1="${MED[ours$THREADS,1]}"
TU="${MED[torch_untuned]}" TT="${MED[torch_tuned]}"
echo
echo "### Summary ($(date -u +%Y-%m-%dT%H:%MZ); $(machine_line))"
echo
echo "GPT-2 4L/4H/128C, seq 128, global batch 32, vocab 256, AdamW, FULL_SHARD; tokens/s."
echo
echo "| round | ours 1x1 | ours 1x$THREADS | ours ${THREADS}x1 | torch untuned | torch tuned |"
echo "|---|---:|---:|---:|---:|---:|"
col() { echo "${RES[$1]}" | awk -v i="$2" '{ print $i }'; }
for ((r = 1; r <= ROUNDS; r++)); do
  echo "| $r | $(col ours1,1 $r) | $(col ours1,$THREADS $r) | $(col ours$THREADS,1 $r) | $(col torch_untuned $r) | $(col torch_tuned $r) |"
done
echo "| **median** | **$O11** | **$O1T** | **$OT1** | **$TU** | **$TT** |"
echo
S="$(ratio "$O1T" "$O11")" RT="$(ratio "$O1T" "$TT")"
echo "- thread scaling, 1 rank x $THREADS threads / 1 x 1: **$S** (target >= 1.8: $(met "$S" ">=" 1.8))"
echo "- 1 rank x $THREADS threads / PyTorch tuned: **$RT** (target >= 1.2: $(met "$RT" ">=" 1.2))"
echo "- 1 rank x $THREADS threads / PyTorch untuned: $(ratio "$O1T" "$TU");" \
     "1 x $THREADS / $THREADS ranks x 1: $(ratio "$O1T" "$OT1"); PyTorch tuned / untuned: $(ratio "$TT" "$TU")"
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
