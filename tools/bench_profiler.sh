#!/usr/bin/env bash
# tools/bench_profiler.sh: what the built-in profiler costs on the CPU backend
# (docs/benchmarks.md "Profiler"). Same model as tools/bench_ab.sh (GPT-2 4L/4H/128C, seq
# 128, global batch 32, vocab 256, synthetic tokens, AdamW, FULL_SHARD) on 2 ranks x 1
# thread. Each round runs, interleaved so background load hits them alike:
#   off:  no train.profile_steps;
#   on:   --profile 6:STEPS (every measured step traced);
#   base: BASE_FSDP_TRAIN without profiling, if given (e.g. main before the profiler).
# Per run: the median tokens_per_sec of steps 6..STEPS from metrics.jsonl (the trace is
# written after the last step, outside every step's time). Reported: every run, the median
# over rounds, on / off (and off / base), and the size of rank 0's trace.
#
# Usage: tools/bench_profiler.sh FSDP_TRAIN [BASE_FSDP_TRAIN]   (ROUNDS=3, STEPS=20)
set -euo pipefail
[[ $# -ge 1 && $# -le 2 ]] || { echo "usage: $0 FSDP_TRAIN [BASE_FSDP_TRAIN]" >&2; exit 2; }
BIN="$(realpath "$1")"; BASE="${2:+$(realpath "$2")}"
ROUNDS="${ROUNDS:-3}"; STEPS="${STEPS:-20}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS || true
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
CFG="$WORK/bench.toml"
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
num_threads = 1
[optim]
name = "adamw"
warmup_steps = 5
[fsdp]
sharding_strategy = "FULL_SHARD"
[eval]
every = 0
max_windows = 1
TOML
run() {  # $1 binary, $2 tag, $3... extra args -> median tok/s of steps > 5
  local bin=$1 tag=$2; shift 2
  local dir="$WORK/$tag"
  mpirun -np 2 --oversubscribe --bind-to none "$bin" "$CFG" --set "train.run_dir=\"$dir\"" "$@" \
    >"$dir.log" 2>&1 || { cat "$dir.log" >&2; exit 1; }
  python3 -c 'import json,statistics,sys
r=[json.loads(l)["tokens_per_sec"] for l in open(sys.argv[1]) if json.loads(l)["step"]>5]
print(f"{statistics.median(r):.1f}")' "$dir/metrics.jsonl"
}
OFF=""; ON=""; BASES=""
for r in $(seq "$ROUNDS"); do
  off=$(run "$BIN" "off_$r"); on=$(run "$BIN" "on_$r" --profile "6:$STEPS")
  line="round $r: off $off tok/s, on $on tok/s"
  OFF+="$off "; ON+="$on "
  if [[ -n "$BASE" ]]; then base=$(run "$BASE" "base_$r"); BASES+="$base "; line+=", base $base tok/s"; fi
  echo "$line"
done
python3 - "$OFF" "$ON" "$BASES" "$WORK/on_1/profile/rank_0.trace.json" "$STEPS" <<'EOF'
import json, os, statistics, sys
off, on, base = ([float(x) for x in a.split()] for a in sys.argv[1:4])
trace, steps = sys.argv[4], int(sys.argv[5]) - 5
m_off, m_on = statistics.median(off), statistics.median(on)
print(f"median: off {m_off:.1f} tok/s, on {m_on:.1f} tok/s, on/off {m_on / m_off:.3f}")
if base:
    m_base = statistics.median(base)
    print(f"median: base {m_base:.1f} tok/s, off/base {m_off / m_base:.3f}")
events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
print(f"rank 0 trace: {os.path.getsize(trace) / 1e6:.2f} MB, {len(events)} ranges over "
      f"{steps} steps ({len(events) / steps:.0f} per step)")
EOF
