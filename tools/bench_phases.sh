#!/usr/bin/env bash
# tools/bench_phases.sh: where a step's time goes with FSDP prefetch on and off.
#
# Trains the main job's model (inputs/gpt2_fortunes.toml: GPT-2 4 layers x 128, seq 128,
# global batch 32, FULL_SHARD) on NP MPI ranks for STEPS steps, once with prefetch on
# (backward_prefetch = BACKWARD_PRE, forward_prefetch = true: the main job's setting) and once
# with it off (NO_PREFETCH, forward_prefetch = false), ROUNDS times interleaved (on, off, on,
# off, ...), and prints per setting the median over rounds of each run's median per-step
# phase times (metrics.jsonl: data_s ... checkpoint_s, step_s), tokens/s and MFU. The first 5
# steps (warm-up) and the last (it evaluates and saves) are left out.
#
#   tools/bench_phases.sh [--np 4] [--steps 60] [--rounds 3] [--threads 1] [--data PATH]
#                         [-- extra fsdp_train args]
#
# Data: data/fortunes.h5 when present (tools/run_main_job.sh makes it), else synthetic tokens.
# The executable: $FSDP_TRAIN if set; else, under the GPU bundle's environment (`source
# gpu_bundle/env.sh` exports FSDP_BUNDLE), the bundle's bin/fsdp_train; else
# ${FSDP_BUILD_DIR:-build}/fsdp_train (a build tree; relative paths are from the repo root).
# tools/gpu_check.sh runs it in the bundle's environment with `-- --set train.device=cuda`.
# Ranks beyond the cores are oversubscribed (--oversubscribe --bind-to none): on a machine
# with fewer cores than ranks, comm_wait then also holds the time a rank waits for a peer that
# is descheduled, which is what such a run really waits.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${FSDP_TRAIN:-}" ]]; then
  train_bin=$FSDP_TRAIN
elif [[ -n "${FSDP_BUNDLE:-}" ]]; then
  train_bin=$FSDP_BUNDLE/bin/fsdp_train
else
  train_bin=${FSDP_BUILD_DIR:-build}/fsdp_train
fi
np=4 steps=60 rounds=3 threads=1 data=""
extra=()
while (($#)); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "bench_phases: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [[ ! -x "$train_bin" ]]; then
  echo "bench_phases: $train_bin is not an executable (set FSDP_TRAIN or FSDP_BUILD_DIR, or source gpu_bundle/env.sh)" >&2
  exit 2
fi
if [[ -z "$data" && -f data/fortunes.h5 ]]; then data=data/fortunes.h5; fi
data_args=(--set data.source=synthetic)
[[ -n "$data" ]] && data_args=(--set data.source=hdf5 --set data.path="$data")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/bench_phases.XXXXXX)
trap 'rm -rf "$work"' EXIT

declare -A setting=(
  [on]="--set fsdp.backward_prefetch=BACKWARD_PRE --set fsdp.forward_prefetch=true"
  [off]="--set fsdp.backward_prefetch=NO_PREFETCH --set fsdp.forward_prefetch=false"
)
echo "bench_phases: $train_bin, $np ranks x $threads thread(s), $steps steps, $rounds rounds, data ${data:-synthetic}"
for ((r = 1; r <= rounds; ++r)); do
  for s in on off; do
    dir=$work/$s.$r
    # shellcheck disable=SC2086
    mpirun -np "$np" --oversubscribe --bind-to none "$train_bin" inputs/gpt2_fortunes.toml \
      --set train.run_dir="$dir" --set train.max_steps="$steps" --set train.log_every=1000000 \
      --set train.num_threads="$threads" --set eval.every=0 --set checkpoint.every=0 \
      "${data_args[@]}" ${setting[$s]} "${extra[@]}" > "$work/$s.$r.log" 2>&1 ||
      { cat "$work/$s.$r.log"; exit 1; }
    echo "  round $r prefetch $s: done"
  done
done

# The statistics need only python3's standard library; under the GPU bundle's environment
# (tools/gpu_bundle.sh env.sh) python3 runs with the system's PATH and libraries.
PATH="${FSDP_SAVED_PATH:-$PATH}" LD_LIBRARY_PATH="${FSDP_SAVED_LD_LIBRARY_PATH-${LD_LIBRARY_PATH:-}}" \
  python3 - "$work" "$rounds" <<'EOF'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
keys = ["step_s", "data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s",
        "checkpoint_s", "tokens_per_sec", "mfu"]
def run_medians(path):
    lines = [json.loads(l) for l in open(path)]
    lines = [l for l in lines if "step_s" in l][5:-1]
    return {k: statistics.median(l.get(k, 0.0) for l in lines) for k in keys}
print()
print("| prefetch | step ms | data | forward | backward | comm_wait | optimizer | comm_wait share | tok/s | MFU |")
print("|---|---|---|---|---|---|---|---|---|---|")
for s in ("on", "off"):
    runs = [run_medians(f"{work}/{s}.{r}/metrics.jsonl") for r in range(1, rounds + 1)]
    m = {k: statistics.median(x[k] for x in runs) for k in keys}
    ms = lambda k: f"{1e3 * m[k]:.2f}"
    print(f"| {s} | {ms('step_s')} | {ms('data_s')} | {ms('forward_s')} | {ms('backward_s')} | "
          f"{ms('comm_wait_s')} | {ms('optimizer_s')} | {100 * m['comm_wait_s'] / m['step_s']:.1f}% | "
          f"{m['tokens_per_sec']:.0f} | {100 * m['mfu']:.1f}% |")
EOF
