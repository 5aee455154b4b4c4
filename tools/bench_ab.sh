#!/usr/bin/env bash
# tools/bench_ab.sh: A/B throughput of two fsdp_train binaries (e.g. main before and after a
# change), interleaved so background load hits both alike. Same model as tools/bench_cpu.sh
# (GPT-2 4L/4H/128C, seq 128, global batch 32, vocab 256, synthetic tokens, AdamW, FULL_SHARD),
# at 1 rank x 2 threads and at 4 ranks x 1 thread (--oversubscribe on 2 cores). Per run: the
# median tokens_per_sec of steps 6..STEPS from metrics.jsonl; reported: every run and the
# median over rounds per binary and layout, and the ratio B / A.
#
# Usage: tools/bench_ab.sh A_FSDP_TRAIN B_FSDP_TRAIN   (ROUNDS=3, STEPS=30; ~4 min on 2 cores)
# Both binaries must accept the config below (keys common to both versions).
set -euo pipefail
[[ $# -eq 2 ]] || { echo "usage: $0 A_FSDP_TRAIN B_FSDP_TRAIN" >&2; exit 2; }
A="$(realpath "$1")"; B="$(realpath "$2")"
ROUNDS="${ROUNDS:-3}"; STEPS="${STEPS:-30}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS || true
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
CFG="$WORK/ab.toml"
cat >"$CFG" <<TOML
[model]
n_layer = 4
n_head = 4
n_embd = 128
n_positions = 128
vocab_size = 256
[data]
source = "synthetic"
seq_len = 128
[train]
global_batch_size = 32
max_steps = $STEPS
log_every = 1000
[optim]
name = "adamw"
warmup_steps = 5
[fsdp]
sharding_strategy = "FULL_SHARD"
[eval]
every = 0
max_windows = 1
TOML
run() {  # $1 binary, $2 ranks, $3 threads, $4 tag -> median tok/s of steps > 5
  local dir="$WORK/$4"
  mpirun -np "$2" --oversubscribe --bind-to none "$1" "$CFG" --set "train.run_dir=\"$dir\"" \
    --set "train.num_threads=$3" >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  python3 -c 'import json,statistics,sys
r=[json.loads(l)["tokens_per_sec"] for l in open(sys.argv[1]) if json.loads(l)["step"]>5]
print(f"{statistics.median(r):.1f}")' "$dir/metrics.jsonl"
}
declare -A RES
for layout in "1 2" "4 1"; do
  read -r np th <<<"$layout"
  for r in $(seq "$ROUNDS"); do
    a=$(run "$A" "$np" "$th" "a_${np}_$r"); b=$(run "$B" "$np" "$th" "b_${np}_$r")
    echo "np $np x $th threads, round $r: A $a tok/s, B $b tok/s"
    RES[a$np]+="$a "; RES[b$np]+="$b "
  done
done
med() { python3 -c 'import statistics,sys; print(f"{statistics.median(map(float,sys.argv[1:])):.1f}")' $1; }
for np in 1 4; do
  ma=$(med "${RES[a$np]}"); mb=$(med "${RES[b$np]}")
  echo "np $np: median A $ma tok/s, B $mb tok/s, B/A $(python3 -c "print(f'{$mb/$ma:.3f}')")"
done
