#!/usr/bin/env bash
# tools/bench_offload.sh: issue 22's GPU acceptance on ONE GPU: GPT 7B (inputs/gpt_7b.toml:
# 32 x 4096, 32 heads, seq 2048, vocab 50257, bf16, activation checkpointing) trains STEPS
# steps offloaded (MODES below); without offload the same plan must be refused before anything
# is allocated. If the host cannot hold the offloaded state (~100 GiB; the plan says so), the
# largest depth of N_LAYERS the plan accepts is trained instead, and refused without offload.
# Prints one summary line per run and writes bench_offload.md into $OUT (or BENCH_OUT_DIR).
#
# Usage, from the repo root on the GPU machine (the bundle's fsdp_train, tools/gpu_bundle.sh):
#   tools/bench_offload.sh        # STEPS (20), N_LAYERS ("32 28 24 20 16"), RUN_TIMEOUT (500)
# Then offload's cost at GPT-2 1.5B (bench_gpu.sh's gpt2-1.5b configuration, 4 x 1024 tokens
# a micro-batch): tok/s with fsdp.cpu_offload ÷ without, interleaved, COST_ROUNDS (1) rounds,
# at ACCUM (32; a list, e.g. "32 64", runs each) micro-batches a step (131k tokens; GPT-2
# itself trained with 512 x 1024).
# Offloaded, the micro-batches accumulate their gradients on the device, so per step the
# host pays once: one device-to-host copy of the fp32 gradients, AdamW reading and writing
# ~28 bytes per parameter (~44 GB at 1.5B), the bf16 cast for the uploads. As with DeepSpeed
# ZeRO-Offload that is hidden only at a batch large enough; at bench_gpu.sh's one
# micro-batch a step (MODELS=gpt2-1.5b CONTENDERS="fsdp_train fsdp_train:offload"
# tools/bench_gpu.sh) it cannot come near the issue's 0.75.
# PARTS ("host 7b cost") picks the parts: "host" the host optimizer's bandwidth on this machine
# (bench_host_optimizer --elements HOST_ELEMENTS (268435456), all cores: its table, the host
# step's bytes per parameter against the host's copy bandwidth), "7b" the 7B run, "cost" the
# 1.5B comparison.
# MODES ("offload_optimizer ratio delayed cpu_offload") picks the offload modes each part
# runs: fsdp.cpu_offload (every unshard uploads), fsdp.offload_optimizer (the param_dtype
# shards resident on the device, one upload a step; issue 31), "ratio" (offload_optimizer
# with fsdp.offload_optimizer_ratio=RATIO, default 0 = auto, what inputs/gpt_7b.toml runs:
# the first units' optimizer on the device, as many as 90 % of it fits, the host's step and
# copies the rest; its line gives the ratio chosen; a plan the device refuses is reported,
# and the next mode runs) and "delayed" (offload_optimizer with
# fsdp.delayed_parameter_update: the host's update beside the next step's forward and
# backward). Each 7B line also gives MFU, the start-up line and the step split: forward,
# backward, optimizer (the host step's exposed part: waits for its writes) and comm_wait (with
# offload, the waits for the gradients' device-to-host copies at the step's end).
# A mode with the suffix +kernel_reads (e.g. ratio+kernel_reads) runs with FSDP_SMALL_READS=
# kernel: the step's small device-to-host reads (loss, norms, clip coefficient) through a
# kernel into mapped host memory instead of the copy engines (cuda_backend.hpp), the A/B for
# whether they wait behind the gradients' bulk copies.
# SEQS (empty: the toml's 8) sets the 7B runs' train.global_batch_size: sequences of 2048 a
# step, one per micro-batch (issue 31's "32 micro-batches a step": SEQS=32). SETS (empty)
# adds --set arguments to every 7B run, e.g. SETS='fsdp.activation_checkpointing=true' for
# the toml's setting before 2026-11-28 (every block recomputed), or
# 'fsdp.activation_checkpointing=true fsdp.recompute_num_layers=16'.
# SKIP_NONE (empty) set skips the run without offload after the first mode (refused on an
# 80 GB device; on an H200 the plan without recomputation, 107.5 GiB, fits and it trains).
# BENCH_TAG (empty) names the summary bench_offload_<tag>.md, so several runs (e.g. two SEQS)
# keep theirs in one $OUT; the profile traces get the tag too.
# PROFILE_STEP (6; empty: none) profiles that step of each 7B run (train.profile_steps): the
# summary gets tools/profile_summary.py's tables (top kernels, the GPU's idle gaps charged to
# what ended them, host ranges) and $OUT gets the gzipped trace, offload_<mode>.trace.json.gz
# (every kernel and copy on its stream's track: whether the step's small device-to-host reads
# waited behind the gradients' copies).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STEPS="${STEPS:-20}" N_LAYERS="${N_LAYERS:-32 28 24 20 16}" RUN_TIMEOUT="${RUN_TIMEOUT:-500}"
COST_ROUNDS="${COST_ROUNDS:-1}" ACCUM="${ACCUM:-32}" PARTS="${PARTS:-host 7b cost}"
HOST_ELEMENTS="${HOST_ELEMENTS:-268435456}"
PROFILE_STEP="${PROFILE_STEP-6}"
SEQS="${SEQS:-}" SETS="${SETS:-}"
extra_sets=()  # SEQS and SETS as --set arguments
[[ -n $SEQS ]] && extra_sets+=(--set "train.global_batch_size=$SEQS")
for kv in $SETS; do extra_sets+=(--set "$kv"); done
MODES="${MODES:-offload_optimizer ratio delayed cpu_offload}" RATIO="${RATIO:-0}"
reads() {  # $1 = a mode: FSDP_SMALL_READS's value for it (+kernel_reads: kernel)
  [[ $1 == *+kernel_reads ]] && echo kernel || echo copy
}
keys() {  # $1 = none | cpu_offload | offload_optimizer | ratio | delayed [+kernel_reads]: the keys' --set arguments
  local m=${1%+kernel_reads}
  echo "--set fsdp.cpu_offload=$([[ $m == cpu_offload ]] && echo true || echo false)" \
       "--set fsdp.offload_optimizer=$([[ $m == offload_optimizer || $m == ratio || $m == delayed ]] && echo true || echo false)" \
       "--set fsdp.offload_optimizer_ratio=$([[ $m == ratio ]] && echo "$RATIO" || echo 1)" \
       "--set fsdp.delayed_parameter_update=$([[ $m == delayed ]] && echo true || echo false)"
}
BUNDLE="${FSDP_BUNDLE:-$REPO/gpu_bundle}"
if [[ -f "$BUNDLE/env.sh" ]]; then
  in_ours() { ( source "$BUNDLE/env.sh" >/dev/null 2>&1; "$@" ); }
  BIN=fsdp_train
else
  in_ours() { "$@"; }
  BIN="${FSDP_BUILD_DIR:-$REPO/build-gpu}/fsdp_train"
fi
OUTDIR="${OUT:-${BENCH_OUT_DIR:-$REPO}}"
WORK="$(mktemp -d)"; trap 'rm -rf "$WORK"' EXIT
MD="$OUTDIR/bench_offload${BENCH_TAG:+_$BENCH_TAG}.md"  # BENCH_TAG: several runs in one $OUT
: >"$MD"
say() { echo "$*" | tee -a "$MD"; }

train() {  # $1 = n_layer, $2 = none or a mode (keys[+kernel_reads]); exit code, log in $WORK/log
  rm -rf "$WORK/run"
  local profile=()
  [[ -n $PROFILE_STEP && $2 != none && $PROFILE_STEP -le $STEPS ]] &&
    profile=(--set "train.profile_steps=[$PROFILE_STEP,$PROFILE_STEP]")
  # shellcheck disable=SC2046
  in_ours env FSDP_SMALL_READS="$(reads "$2")" timeout -k 10 "$RUN_TIMEOUT" mpirun -np 1 --bind-to none \
    "$BIN" "$REPO/inputs/gpt_7b.toml" \
    --set "model.n_layer=$1" $(keys "$2") --set "train.max_steps=$STEPS" "${profile[@]}" \
    "${extra_sets[@]}" --set checkpoint.enable=false \
    --set "train.run_dir=\"$WORK/run\"" </dev/null >"$WORK/log" 2>&1
}
summary() {  # $1 = n_layer, $2 = seconds, $3 = mode (or none): the run's line from metrics.jsonl
  python3 - "$WORK/run/metrics.jsonl" "$1" "$2" "$3" "$RATIO" <<'PY' | tee -a "$MD"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r for r in rows if r["step"] > 3 and "tokens_per_sec" in r]
base, kernel_reads = sys.argv[4].removesuffix("+kernel_reads"), sys.argv[4].endswith("+kernel_reads")
mode = {"none": "no offload", "delayed": "offload_optimizer + delayed_parameter_update",
        "ratio": "offload_optimizer + offload_optimizer_ratio " + (
            "auto" if float(sys.argv[5]) == 0 else sys.argv[5])}.get(base, base)
mode = mode if base == "none" else "fsdp." + mode
mode += " (FSDP_SMALL_READS=kernel)" if kernel_reads else ""
print("- n_layer %s with %s: %d steps in %s s; median %.0f tok/s, MFU %.1f %% (steps 4..), step %.2f s "
      "(forward %.2f, backward %.2f, optimizer %.2f, comm_wait %.2f); device peak %.1f GiB, host peak %.1f GiB; "
      "loss %.4f -> %.4f" % (
          sys.argv[2], mode, len(rows), sys.argv[3], statistics.median(r["tokens_per_sec"] for r in timed),
          100 * statistics.median(r.get("mfu", 0) for r in timed),
          statistics.median(r["step_s"] for r in timed), statistics.median(r["forward_s"] for r in timed),
          statistics.median(r["backward_s"] for r in timed), statistics.median(r["optimizer_s"] for r in timed),
          statistics.median(r.get("comm_wait_s", 0) for r in timed),
          max(r["peak_mem_bytes"] for r in rows) / 2**30,
          max(r.get("host_peak_mem_bytes", 0) for r in rows) / 2**30, rows[0]["loss"], rows[-1]["loss"]))
# Issue 31's MFU lines, where this run is their shape: the toml's 8 sequences of 2048 a step
# (>= 20 %) or 32 (>= 35 %); "tokens" counts the run's tokens up to its step.
if base != "none" and rows[-1].get("step", 0) > 0:
    seqs = round(rows[-1]["tokens"] / rows[-1]["step"] / 2048)
    target = {8: 20.0, 32: 35.0}.get(seqs)
    mfu = 100 * statistics.median(r.get("mfu", 0) for r in timed)
    if target is not None and sys.argv[2] == "32":
        print("    issue 31: MFU %.1f %% at %d sequences a step against >= %.0f %%: %s" % (
            mfu, seqs, target, "met" if mfu >= target else "NOT met"))
PY
}
PROFILE_SUMMARY="$REPO/tools/profile_summary.py"
[[ -f "$PROFILE_SUMMARY" ]] || PROFILE_SUMMARY="$BUNDLE/tools/profile_summary.py"

say "## CPU offload on one GPU ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1), host $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo))"
[[ -n $SEQS || -n $SETS ]] && say "(7B runs: inputs/gpt_7b.toml${SEQS:+ with train.global_batch_size=$SEQS}${SETS:+ and --set $SETS})"
if [[ " $PARTS " == *" host "* ]]; then
  say ""
  say "### Host optimizer (bench_host_optimizer --elements $HOST_ELEMENTS, $(nproc) CPUs)"
  say ""
  if [[ -f "$BUNDLE/env.sh" ]]; then HOST_BENCH=bench_host_optimizer
  else HOST_BENCH="${FSDP_BUILD_DIR:-$REPO/build-gpu}/bench_host_optimizer"; fi
  in_ours timeout -k 10 "$RUN_TIMEOUT" "$HOST_BENCH" --elements "$HOST_ELEMENTS" \
    </dev/null >"$WORK/host.log" 2>&1
  rc=$?
  tee -a "$MD" <"$WORK/host.log"
  [[ $rc == 0 ]] || say "bench_host_optimizer: exit $rc"
fi
for MODE in $MODES; do
for L in $N_LAYERS; do
  [[ " $PARTS " == *" 7b "* ]] || break
  t0=$SECONDS
  train "$L" "$MODE"; rc=$?
  if [[ $rc == 2 ]] && grep -q "memory plan: host" "$WORK/log"; then
    say "- n_layer $L with $MODE: refused by the plan ($(grep -m1 'memory plan:' "$WORK/log" | cut -c1-240))"
    continue
  fi
  if [[ $rc == 2 && ${MODE%+kernel_reads} == ratio ]] && grep -q "memory plan: device" "$WORK/log"; then
    say "- n_layer $L with offload_optimizer_ratio $RATIO: refused by the device's plan ($(grep -m1 'memory plan:' "$WORK/log" | cut -c1-240)); try a higher RATIO"
    break
  fi
  failed=0
  if [[ $rc != 0 ]]; then
    # A failed run does not end the bench: the next mode runs. The steps it finished (at
    # least 4: steps 4.. are timed) still give its line below, marked by this one.
    say "- n_layer $L with $MODE: FAILED (exit $rc$([[ $rc == 124 ]] && echo ", cut by RUN_TIMEOUT = $RUN_TIMEOUT s")): $(grep -m1 -E '^fsdp_train:|rror' "$WORK/log" | cut -c1-300)"
    tail -20 "$WORK/log"
    failed=1
    [[ -s $WORK/run/metrics.jsonl && $(wc -l <"$WORK/run/metrics.jsonl") -ge 4 ]] || break
  fi
  summary "$L" "$((SECONDS - t0))" "$MODE"
  grep -m1 "^start-up:" "$WORK/log" | sed 's/^/    /' | tee -a "$MD"
  startup=$(grep -m1 -oE '^start-up: [0-9.]+' "$WORK/log" | grep -oE '[0-9.]+$')
  if [[ -n $startup && $L == 32 ]]; then  # issue 31: the first step <= 30 s after start
    say "    issue 31: start-up $startup s against <= 30 s: $(python3 -c "print('met' if $startup <= 30 else 'NOT met')")"
  fi
  [[ $failed == 0 ]] || break  # its profile and the run without offload: not after a failure
  grep -m1 "offload_optimizer_ratio = 0 (auto)" "$WORK/log" | sed 's/^/    /' | tee -a "$MD"
  trace="$WORK/run/profile/rank_0.trace.json"
  if [[ -f $trace && -f $PROFILE_SUMMARY ]]; then
    say "    profile of step $PROFILE_STEP ($MODE; offload_${BENCH_TAG:+${BENCH_TAG}_}${MODE/+/_}.trace.json.gz):"
    python3 "$PROFILE_SUMMARY" "$trace" --top 12 --markdown --name-width 60 >>"$MD" 2>&1
    gzip -c "$trace" >"$OUTDIR/offload_${BENCH_TAG:+${BENCH_TAG}_}${MODE/+/_}.trace.json.gz"
  fi
  grep -A18 "^memory plan per rank" "$WORK/log" | sed 's/^/    /' >>"$MD"
  [[ $MODE == "${MODES%% *}" && -z ${SKIP_NONE:-} ]] || break  # the run without offload: once
  t0=$SECONDS
  train "$L" none; rc=$?
  if [[ $rc == 2 ]] && grep -q "does not fit" "$WORK/log"; then
    say "- n_layer $L without offload: refused before allocating: $(grep -m1 'memory plan:' "$WORK/log" | cut -c1-300)"
  elif [[ $rc == 0 ]]; then  # a device that fits it (an H200): the baseline offload is against
    summary "$L" "$((SECONDS - t0))" none
  else
    say "- n_layer $L without offload: NOT refused, and failed (exit $rc): $(grep -m1 -E '^fsdp_train:|rror' "$WORK/log" | cut -c1-300)"
  fi
  break
done
done

# ---- offload's cost at 1.5B ------------------------------------------------------------------
[[ " $PARTS " == *" cost "* ]] || exit 0
python3 "$REPO/tools/bench_torch_gpu.py" --model gpt2-1.5b --fsdp-train-toml --warmup 2 --steps 4 \
  >"$WORK/1.5b.toml" || { say "- 1.5B: bench_torch_gpu.py --fsdp-train-toml failed"; exit 1; }
for A in $ACCUM; do
say ""
say "### Offload's cost at GPT-2 1.5B ($((4 * A)) sequences of 1024 a step, micro-batch 4)"
for ((r = 1; r <= COST_ROUNDS; r++)); do
  for off in none $MODES; do
    rm -rf "$WORK/run"
    # shellcheck disable=SC2046
    in_ours env FSDP_SMALL_READS="$(reads "$off")" timeout -k 10 "$RUN_TIMEOUT" \
      mpirun -np 1 --bind-to none "$BIN" "$WORK/1.5b.toml" \
      --set "train.global_batch_size=$((4 * A))" --set train.micro_batch_size=4 \
      $(keys "$off") --set checkpoint.enable=false --set "train.run_dir=\"$WORK/run\"" \
      </dev/null >"$WORK/log" 2>&1
    rc=$?
    if [[ $rc != 0 ]]; then
      say "- round $r offload=$off: FAILED (exit $rc): $(grep -m1 -E '^fsdp_train:|rror' "$WORK/log" | cut -c1-300)"
      continue
    fi
    python3 - "$WORK/run/metrics.jsonl" "$r" "$off" <<'PY' | tee -a "$MD"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r for r in rows if r["step"] > 2]
print("- round %s offload=%s: median %.0f tok/s (step %.2f s, backward %.2f s, optimizer %.3f s), "
      "device peak %.1f GiB, host peak %.1f GiB" % (
          sys.argv[2], sys.argv[3], statistics.median(r["tokens_per_sec"] for r in timed),
          statistics.median(r["step_s"] for r in timed), statistics.median(r["backward_s"] for r in timed),
          statistics.median(r["optimizer_s"] for r in timed), max(r["peak_mem_bytes"] for r in rows) / 2**30,
          max(r.get("host_peak_mem_bytes", 0) for r in rows) / 2**30))
PY
  done
done
done
