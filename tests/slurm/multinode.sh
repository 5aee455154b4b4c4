#!/usr/bin/env bash
# tests/slurm/multinode.sh: jobs/t5_multinode_cpu.slurm on a real two-node Slurm
# (tools/slurm_local.sh; started here unless `sinfo` already answers, and then stopped again).
#
#   bash tests/slurm/multinode.sh FSDP_TRAIN FSDP_PREPARE
#
# The T5 config (inputs/t5_wordnet.toml) made small with --set's, on a tiny seq2seq pairs
# file made with fsdp_prepare --pairs, 2 nodes x 2 tasks under srun --mpi=pmix:
# 1. Job A runs uninterrupted: the log shows the mesh "replicate 2 x shard 2" (two nodes seen
#    by MPI, shard group = the node), every step, exit 0, and the checkpoints.
# 2. Job B, the same run: after some steps `scancel -s USR1` signals its ranks; fsdp_train saves
#    a checkpoint and exits 3, the job requeues itself (scontrol requeue), runs again
#    (--resume=auto: "resumed from step K") and finishes. Its metrics.jsonl has every step once,
#    and loss, lr and grad_norm are the same text as job A's (bit for bit).
# 3. Job C, the same with FSDP_LAUNCHER=mpirun and --signal=B:USR1: `scancel -s USR1 --batch`
#    signals the batch shell only, whose trap forwards it to mpirun.
# Needs root (namespaces), about 1-3 minutes here. Labelled "slurm" (ctest -L slurm).
set -uo pipefail

FSDP_TRAIN=$(realpath "$1")
FSDP_PREPARE=$(realpath "$2")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
STEPS=${FSDP_SLURM_TEST_STEPS:-200}  # long enough that the signal lands mid-run
T0=$(date +%s)
FAILED=0
fail() { echo "FAIL: $*"; FAILED=1; }
elapsed() { echo $(($(date +%s) - T0)); }

WORK=$(mktemp -d /tmp/fsdp-slurm-test.XXXXXX)
STARTED=0
JOBS=()
cleanup() {
  local id
  for id in ${JOB_A:-} "${JOBS[@]}"; do scancel "$id" 2>/dev/null; done
  if [ "$STARTED" -eq 1 ]; then "$REPO/tools/slurm_local.sh" stop >/dev/null; fi
  if [ "$FAILED" -eq 0 ]; then rm -rf "$WORK"; else echo "kept $WORK for inspection"; fi
}
trap cleanup EXIT

# The cluster: a running one (SLURM_CONF set and answering), else our own.
if [ -z "${SLURM_CONF:-}" ] || ! timeout 10 sinfo >/dev/null 2>&1; then
  if ! "$REPO/tools/slurm_local.sh" start >"$WORK/slurm_start.log" 2>&1; then
    cat "$WORK/slurm_start.log"
    echo "FAIL: tools/slurm_local.sh start failed"
    FAILED=1
    exit 1
  fi
  STARTED=1
  # shellcheck disable=SC1091
  source "${FSDP_SLURM_DIR:-/tmp/fsdp-slurm}/env.sh"
fi
echo "cluster up after $(elapsed) s:"; sinfo -N

# job_field ID FIELD: one field of `scontrol show job` (empty once the job is forgotten).
job_field() {
  scontrol show job -o "$1" 2>/dev/null | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# wait_done ID SECONDS: poll until the job is COMPLETED/FAILED/CANCELLED/...; sets STATE.
wait_done() {
  local id=$1 limit=$(($(date +%s) + $2))
  while [ "$(date +%s)" -lt "$limit" ]; do
    STATE=$(job_field "$id" JobState)
    case "$STATE" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) return 0 ;;
    esac
    sleep 1
  done
  STATE="still $STATE after $2 s"
  return 1
}

# Tiny seq2seq pairs: "number N in words is ..." -> "N".
python3 - "$WORK/pairs.tsv" <<'EOF'
import sys
ones = "zero one two three four five six seven eight nine".split()
with open(sys.argv[1], "w") as f:
    for n in range(400):
        words = " ".join(ones[int(d)] for d in str(n))
        f.write(f"the digits {words}\t{n}\n")
EOF
"$FSDP_PREPARE" --pairs "$WORK/pairs.tsv" "$WORK/pairs.h5" --val-fraction 0.1 >"$WORK/prepare.log" 2>&1 ||
  { cat "$WORK/prepare.log"; fail "fsdp_prepare --pairs failed"; exit 1; }

ARGS=(--set data.path="$WORK/pairs.h5" --set model.d_model=64 --set model.d_kv=16
      --set model.d_ff=128 --set model.num_layers=2 --set model.num_decoder_layers=2
      --set model.num_heads=4 --set data.max_input_len=32 --set data.max_target_len=8
      --set train.global_batch_size=8 --set train.max_steps="$STEPS" --set train.log_every=1
      --set optim.warmup_steps=5 --set checkpoint.every=50 --set eval.every=0
      --set eval.on_start=false --set eval.max_windows=16)
export FSDP_TRAIN FSDP_RUN_ROOT="$WORK/runs"
cd "$REPO" || exit 1

submit() {  # submit NAME: sbatch the CPU multinode job; prints the job id
  sbatch --parsable --output="$WORK/$1-%j.out" --time=00:15:00 \
    jobs/t5_multinode_cpu.slurm "${ARGS[@]}"
}

# 1. Uninterrupted.
JOB_A=$(submit a) || { fail "sbatch failed"; exit 1; }
echo "job A: $JOB_A"
wait_done "$JOB_A" 400 || fail "job A: $STATE"
OUT_A="$WORK/a-$JOB_A.out"
RUN_A="$WORK/runs/t5-multinode-cpu-$JOB_A"
echo "job A: $STATE, exit $(job_field "$JOB_A" ExitCode) after $(elapsed) s"
[ "$STATE" = COMPLETED ] || fail "job A ended $STATE"
grep -E "^mesh: " "$OUT_A" | head -1
if ! grep -q "^mesh: world 4 = replicate 2 x shard 2" "$OUT_A"; then
  fail "job A: no mesh line 'world 4 = replicate 2 x shard 2' (MPI does not see two nodes of 2 ranks: $(grep -m1 '^mesh: ' "$OUT_A"))"
fi
grep -q "on n\[1-2\]" "$OUT_A" || fail "job A did not run on n[1-2]: $(grep -m1 '^fsdp job' "$OUT_A")"
grep -q "^step $STEPS/$STEPS | loss" "$OUT_A" || fail "job A: no 'step $STEPS/$STEPS | loss' line"
grep -q -- "--resume auto: no checkpoint" "$OUT_A" || fail "job A: no '--resume auto: no checkpoint' line"
for s in 50 $STEPS; do
  d=$(printf 'step_%08d' "$s")
  [ -d "$RUN_A/checkpoints/$d" ] || fail "job A: no checkpoint $RUN_A/checkpoints/$d"
done

# preempted NAME SCANCEL_OPT [sbatch options...]: the same run as job A, signalled with
# `scancel -s USR1 SCANCEL_OPT` after 5 steps; it must save, exit 3, requeue itself, resume
# (--resume=auto) and finish with job A's metrics, bit for bit.
preempted() {
  local name=$1 how=$2 id run out n limit
  shift 2
  id=$(sbatch --parsable --output="$WORK/$name-%j.out" --time=00:15:00 "$@" \
    jobs/t5_multinode_cpu.slurm "${ARGS[@]}") || { fail "$name: sbatch failed"; return; }
  JOBS+=("$id")
  echo "job $name: $id"
  run="$WORK/runs/t5-multinode-cpu-$id"
  out="$WORK/$name-$id.out"
  limit=$(($(date +%s) + 300))
  n=0
  while [ "$(date +%s)" -lt "$limit" ]; do
    [ -f "$run/metrics.jsonl" ] && n=$(wc -l <"$run/metrics.jsonl")
    [ "$n" -ge 5 ] && break
    sleep 0.5
  done
  echo "job $name: $n steps in metrics.jsonl after $(elapsed) s; scancel -s USR1 $how $id"
  # shellcheck disable=SC2086  # $how: no option or one
  scancel -s USR1 $how "$id" || fail "$name: scancel -s USR1 $how failed"
  wait_done "$id" 400 || fail "job $name: $STATE"
  echo "job $name: $STATE, restarts $(job_field "$id" Restarts), after $(elapsed) s"
  [ "$STATE" = COMPLETED ] || fail "job $name ended $STATE"
  grep -q "received SIGUSR1 on rank" "$out" ||
    fail "job $name: no 'received SIGUSR1' line (did the run end before the signal came? raise FSDP_SLURM_TEST_STEPS)"
  grep -q "interrupted, checkpoint saved; requeueing" "$out" || fail "job $name did not requeue itself"
  grep -q "(restart 1)" "$out" || fail "job $name: no second run (restart 1)"
  grep -E -m1 "resumed from step [0-9]+" "$out" || fail "job $name: no 'resumed from step' line"
  grep -q "^step $STEPS/$STEPS | loss" "$out" || fail "job $name: no 'step $STEPS/$STEPS | loss' line"
  python3 - "$RUN_A/metrics.jsonl" "$run/metrics.jsonl" "$STEPS" <<'EOF' || fail "job $name: metrics of the preempted run differ from job A's"
import json, sys
def load(p):  # floats kept as their printed text: equal text = equal bits
    return [json.loads(l, parse_float=str) for l in open(p) if l.strip()]
a, b, steps = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
sa, sb = [r["step"] for r in a], [r["step"] for r in b]
assert sa == list(range(1, steps + 1)), ("A steps", sa)
assert sb == sa, ("preempted run's steps (each once)", sb)
diff = [(ra["step"], k, ra[k], rb[k]) for ra, rb in zip(a, b) for k in ("loss", "lr", "grad_norm")
        if ra.get(k) != rb.get(k)]
assert not diff, diff[:5]
print(f"metrics: {steps} steps, loss/lr/grad_norm identical to job A's; last loss {a[-1]['loss']}")
EOF
}

# 2. srun --mpi=pmix (the default): scancel -s USR1 signals every task of the srun step.
preempted b ""
# 3. FSDP_LAUNCHER=mpirun, submitted with --signal=B:USR1@120: Slurm signals only the batch
#    shell (scancel --batch, as the time limit would), which forwards SIGUSR1 to mpirun.
FSDP_LAUNCHER=mpirun preempted c --batch --signal=B:USR1@120

echo "took $(elapsed) s"
if [ "$FAILED" -ne 0 ]; then
  for f in "$WORK"/*.out; do echo "==== $f"; tail -40 "$f"; done
  exit 1
fi
echo PASS
