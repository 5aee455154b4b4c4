#!/usr/bin/env bash
# tools/gpu_kernel_ab.sh: one short GPU call that checks and measures a kernel change:
#   1. test_cuda_kernels (every CUDA model kernel against the CPU backend)
#   2. fsdp_train on GPT-2 124M (AB_MODELS: tools/bench_torch_gpu.py's models, default gpt2-124m;
#      e.g. AB_MODELS="gpt2-124m t5-small-byt5"; its configuration, WARMUP 3 +
#      STEPS 8 steps), ROUNDS rounds: median tokens/s and the peak memory of each run; with
#      AB_BASE (below) the new build and the base build interleaved (new, base, new, ...)
#   3. the profiler (--profile 3:4): tools/profile_summary.py --top 15
#   4. test_gpu_train at 1 rank (GPU training against the CPU backend), if time is left
# AB_SKIP_TESTS=1 skips 1 and 4 (after tools/gpu_check.sh in the same call, which ran them).
# Run on the GPU machine from the repo root with the bundle carried:
#   run(carry=["gpu_bundle"], command="tools/gpu_kernel_ab.sh", timeout_s=150)
# AB_BUDGET_S (130) bounds the whole script: each run's time limit is cut to what is left less
# 5 s, and a run or profile with under 10 s left is not started ("not run: out of time").
# Writes $OUT/kernel_ab.md (else ./kernel_ab.md), ending with a recap (the tok/s rows and
# fsdp_train's cuda_graphs lines, also the end of stdout), and the profiles' Chrome traces in
# ab_traces.tar.gz (traces/trace_MODEL_LABEL.json); about 100 s on an H100 per model with
# AB_BASE (two contenders, as the mma/wmma comparison took), less without.
#
# AB_BASE=FILE compares two builds (a change's before and after on one lease): FILE is an older
# fsdp_train (stripped, or xz-compressed as FILE.xz to keep the carried size down; built as
# tools/gpu_bundle.sh builds, so the bundle's libraries serve it), run as "base" against the
# bundle's "new", interleaved, and step 3 profiles both (the kernel tables before and after).
# Make one with: git worktree add /tmp/base COMMIT; build its fsdp_train with the bundle's
# CMake arguments; strip; xz -c > gpu_base/fsdp_train.xz; carry ["gpu_bundle", "gpu_base"].
# AB_BASE_ENV="VAR=VALUE ..." runs the base contender with those environment variables: alone
# (no AB_BASE), the bundle's own fsdp_train with a switch flipped, e.g.
# AB_BASE_ENV=FSDP_GEMM_EPILOGUES=0 (GPT-2's cuBLASLt epilogues off: unfused bias and GELU),
# or one of them off, e.g. AB_BASE_ENV=FSDP_GEMM_EPILOGUES=-dgelu_bgrad (names: bias,
# gelu_aux_bias, dgelu_bgrad, bgradb, relu; src/cuda/cuda_backend.cpp epilogue_mask).
# AB_NEW_SETS / AB_BASE_SETS="KEY=VALUE ..." add `--set KEY=VALUE` to one contender's runs (with
# neither AB_BASE nor AB_BASE_ENV, the base is the bundle's own fsdp_train), e.g. CUDA graphs
# against eager in one binary: AB_NEW_SETS='train.cuda_graphs="on"'.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/tools/kit_lib.sh"
cd "$REPO" || exit 1
DEST="${OUT:-$PWD}"
SUMMARY="$DEST/kernel_ab.md"
ROUNDS="${ROUNDS:-2}" WARMUP="${WARMUP:-3}" STEPS="${STEPS:-8}"
AB_MODELS="${AB_MODELS:-gpt2-124m}"  # tools/bench_torch_gpu.py MODELS, each measured and profiled
BUDGET="${AB_BUDGET_S:-130}"  # the whole script's seconds
START=$SECONDS
WORK="$(mktemp -d /tmp/kernel_ab.XXXXXX)"
RECAP="$WORK/recap"  # the rows and lines repeated at the end (the run tool returns the tail)
: >"$RECAP"
inb() { ( source gpu_bundle/env.sh >/dev/null 2>&1; "$@" ); }
# The time limit of a step: its own cap $1, cut to what is left of the budget less 5 s (the
# kill grace of `timeout -k 5`); prints nothing and fails when that is under 10 s.
cap() {
  local l=$((BUDGET - (SECONDS - START) - 5))
  (( l > $1 )) && l=$1
  (( l >= 10 )) && echo "$l"
}
# Kill what a timed-out run leaves behind: every process of a run carries FSDP_AB_TAG=<tag>
# (tools/kit_lib.sh kill_tagged).
reap() { kill_tagged FSDP_AB_TAG "$1" >/dev/null; }
ended() {  # $1 = exit code, $2 = time limit: "exit N", "(timed out at N s)" for 124 and 137
  echo "exit $1$( (( $1 == 124 || $1 == 137 )) && echo " (timed out at $2 s)")"
}
# The lines of fsdp_train's log $1 (exit $2) worth keeping: its closing cuda_graphs line and a
# failed capture's warning; on a failure its error lines too (the log ends with Open MPI's
# banner, the fsdp_train: line is the first).
run_lines() {
  local pat='cuda_graphs: ([0-9]+ segments|a capture failed)'
  [[ $2 == 0 ]] || pat+='|^fsdp_train:|rror|warning'
  plain "$1" | grep -m6 -E "$pat"
}
export GTEST_COLOR=no
{
  echo "# kernel A/B ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
  echo; echo "bundle: $(sed -n 's/^commit=//p' gpu_bundle/manifest.txt | cut -c1-12)"
} >"$SUMMARY"

echo "## test_cuda_kernels" | tee -a "$SUMMARY"
if [[ "${AB_SKIP_TESTS:-0}" == 1 ]]; then
  echo "(skipped: AB_SKIP_TESTS=1)" | tee -a "$SUMMARY"
elif ! lim=$(cap 60); then
  echo "test_cuda_kernels: not run: out of time" | tee -a "$SUMMARY" "$RECAP"
else
  FSDP_AB_TAG=kernels inb timeout -k 5 "$lim" mpirun -n 1 --bind-to none \
    gpu_bundle/bin/test_cuda_kernels >"$WORK/kernels.log" 2>&1
  rc=$?
  reap kernels
  echo "test_cuda_kernels: $(ended "$rc" "$lim")" | tee -a "$SUMMARY" "$RECAP"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|actual|qkv |max " \
    "$WORK/kernels.log" | head -60 | tee -a "$SUMMARY"
fi

# The contenders: (label, executable). Without AB_BASE the bundle's build alone (the
# superseded wmma attention kernels it used to be compared with are gone).
if [[ -n "${AB_BASE:-}" ]]; then
  base_bin="$WORK/fsdp_train_base"
  if [[ "$AB_BASE" == *.xz ]]; then xz -dc "$AB_BASE" >"$base_bin"; else cp "$AB_BASE" "$base_bin"; fi
  chmod +x "$base_bin"
  LABELS=(new base) BINS=(fsdp_train "$base_bin") ENVS=("" "${AB_BASE_ENV:-}")
  base_version="$(inb "$base_bin" --version 2>&1 | head -1)"
  echo "base: $AB_BASE ($base_version)${AB_BASE_ENV:+ with $AB_BASE_ENV}" | tee -a "$SUMMARY"
elif [[ -n "${AB_BASE_ENV:-}${AB_NEW_SETS:-}${AB_BASE_SETS:-}" ]]; then
  LABELS=(new base) BINS=(fsdp_train fsdp_train) ENVS=("" "${AB_BASE_ENV:-}")
  echo "base: the bundle's fsdp_train${AB_BASE_ENV:+ with $AB_BASE_ENV}" \
    "${AB_BASE_SETS:+--set $AB_BASE_SETS}" | tee -a "$SUMMARY"
else
  LABELS=(new) BINS=(fsdp_train) ENVS=("")
fi
SETS=("${AB_NEW_SETS:-}" "${AB_BASE_SETS:-}")  # by contender index, as LABELS
[[ -n "${AB_NEW_SETS:-}" ]] && echo "new: --set $AB_NEW_SETS" | tee -a "$SUMMARY"
# "K=V K2=V2" -> --set K=V --set K2=V2 (one word each: values without spaces)
set_args() { for kv in $1; do printf '%s\n' --set "$kv"; done; }
NC=${#LABELS[@]}

for model in $AB_MODELS; do
  python3 tools/bench_torch_gpu.py --model "$model" --fsdp-train-toml --warmup "$WARMUP" \
    --steps "$STEPS" >"$WORK/$model.toml"
  echo; echo "## fsdp_train $model, $(IFS=/; echo "${LABELS[*]}")$( ((NC > 1)) && echo " interleaved")" | tee -a "$SUMMARY"
  echo "### $model (round, contender, tok/s, peak_mem_bytes)" >>"$RECAP"
  : >"$WORK/notes"  # each run's cuda_graphs and error lines, below the table
  echo "| round | contender | tok/s (median of steps > $WARMUP) | peak_mem_bytes |" | tee -a "$SUMMARY"
  echo "|---:|---|---:|---:|" | tee -a "$SUMMARY"
  for r in $(seq 1 "$ROUNDS"); do
    for i in $(seq 0 $((NC - 1))); do
      k="${LABELS[$i]}"
      run="$WORK/run_${model}_${k}_$r"
      if ! lim=$(cap 40); then
        echo "| $r | $k | not run: out of time | |" | tee -a "$SUMMARY" "$RECAP"
        continue
      fi
      mapfile -t extra < <(set_args "${SETS[$i]}")
      # shellcheck disable=SC2086  # ENVS[i]: VAR=VALUE words for env
      FSDP_AB_TAG="${run##*/}" inb timeout -k 5 "$lim" mpirun -np 1 --bind-to none \
        env ${ENVS[$i]} "${BINS[$i]}" "$WORK/$model.toml" --set "train.run_dir=\"$run\"" \
        "${extra[@]}" >"$run.log" 2>&1
      rc=$?
      reap "${run##*/}"
      python3 - "$run/metrics.jsonl" "$r" "$k" "$(ended "$rc" "$lim")" "$WARMUP" <<'EOF' \
        | tee -a "$SUMMARY" "$RECAP"
import json, statistics, sys
path, r, k, rc, warm = sys.argv[1:6]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
    steps = [x for x in rows if "tokens_per_sec" in x and x.get("step", 0) > int(warm)]
    tok = statistics.median(x["tokens_per_sec"] for x in steps)
    mem = max(x.get("peak_mem_bytes", 0) for x in steps)
    loss = steps[-1].get("loss")
    print(f"| {r} | {k} | {tok:.0f} | {mem} (last loss {loss}) |")
except Exception as e:
    print(f"| {r} | {k} | run failed ({rc}): {e} | |")
EOF
      run_lines "$run.log" "$rc" | sed "s/^/- round $r, $k: /" >>"$WORK/notes"
    done
  done
  if [[ -s "$WORK/notes" ]]; then echo; cat "$WORK/notes"; fi | tee -a "$SUMMARY" "$RECAP"

  # The profiles: every contender (with AB_BASE: A = new, B = base, side by side).
  traces=()
  for i in $(seq 0 $((NC - 1))); do
    echo; echo "## profile, $model, ${LABELS[$i]} (--profile 3:4)" | tee -a "$SUMMARY"
    prof="$WORK/prof_${model}_${LABELS[$i]}"
    trace="$prof/profile/rank_0.trace.json"
    if ! lim=$(cap 40); then echo "not run: out of time" | tee -a "$SUMMARY"; continue; fi
    mapfile -t extra < <(set_args "${SETS[$i]}")
    # shellcheck disable=SC2086
    FSDP_AB_TAG="${prof##*/}" inb timeout -k 5 "$lim" mpirun -np 1 --bind-to none env ${ENVS[$i]} \
      "${BINS[$i]}" "$WORK/$model.toml" --set "train.run_dir=\"$prof\"" "${extra[@]}" \
      --profile 3:4 >"$prof.log" 2>&1
    rc=$?
    reap "${prof##*/}"
    if [[ $rc != 0 || ! -f "$trace" ]]; then
      trace_note=""; [[ -f "$trace" ]] || trace_note=", no rank_0.trace.json"
      { echo "**profile run failed**: $(ended "$rc" "$lim")${trace_note}"
        run_lines "$prof.log" 1; } | tee -a "$SUMMARY"
      continue
    fi
    run_lines "$prof.log" 0 | tee -a "$SUMMARY"
    python3 tools/profile_summary.py --top 15 --markdown --only kernels "$trace" \
      2>&1 | tee -a "$SUMMARY"
    traces+=("$trace")
    # The trace itself, for offline analysis (Perfetto; tools/profile_summary.py reads it).
    mkdir -p "$WORK/traces" && cp "$trace" "$WORK/traces/trace_${model}_${LABELS[$i]}.json"
  done
  if (( ${#traces[@]} == 2 )); then
    echo; echo "## profile, $model, new (A) against base (B)" | tee -a "$SUMMARY"
    python3 tools/profile_summary.py --top 20 --markdown "${traces[@]}" 2>&1 | tee -a "$SUMMARY"
  fi
  # Every trace so far in one file (the run tool returns at most 8 files); none, no file.
  [[ -d "$WORK/traces" ]] && tar -C "$WORK" -czf "$DEST/ab_traces.tar.gz" traces
done

echo; echo "## test_gpu_train (1 rank)" | tee -a "$SUMMARY"
left=$((BUDGET - (SECONDS - START)))
if [[ "${AB_SKIP_TESTS:-0}" == 1 ]]; then
  echo "(skipped: AB_SKIP_TESTS=1)" | tee -a "$SUMMARY"
elif (( left > 45 )); then
  FSDP_AB_TAG=train inb timeout -k 5 $((left - 5)) mpirun -n 1 --bind-to none \
    gpu_bundle/bin/test_gpu_train >"$WORK/train.log" 2>&1
  rc=$?
  reap train
  echo "test_gpu_train: $(ended "$rc" $((left - 5)))" | tee -a "$SUMMARY" "$RECAP"
  grep -E "^\[  (PASSED|FAILED) |Failure" "$WORK/train.log" | head -20 | tee -a "$SUMMARY"
else
  echo "test_gpu_train: not run: out of time (${left} s left)" | tee -a "$SUMMARY" "$RECAP"
fi
# The end of stdout is what the run tool returns: the recap comes last.
{ echo; echo "## recap (tok/s rows, cuda_graphs and error lines; the tables are above)"
  cat "$RECAP"; echo "total $((SECONDS - START)) s (budget $BUDGET s)"; } | tee -a "$SUMMARY"
