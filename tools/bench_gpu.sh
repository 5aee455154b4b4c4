#!/usr/bin/env bash
# tools/bench_gpu.sh: GPT-2 124M training throughput, MFU and peak device memory on ONE GPU:
# fsdp_train against PyTorch FSDP2 (fully_shard), eager and torch.compile, run interleaved.
#
#   Model: GPT-2 small (12 layers, 12 heads, n_embd 768, seq 1024 = n_positions, vocab 50257,
#   tied LM head: 124,439,808 parameters), uniformly random tokens, micro-batch = global batch
#   = BATCH sequences (default 8 x 1024 = 8,192 tokens per step), bf16 compute with fp32
#   master weights and fp32 gradient reduction, FULL_SHARD at world size 1, AdamW lr 6e-4
#   (betas 0.9/0.999, eps 1e-8, weight decay 0.1 on the Linear weights), clipping at 1.0.
#   - fsdp_train: `mpirun -np 1 fsdp_train bench.toml` with train.device = "cuda",
#     mixed_precision.param_dtype = "bf16", reduce_dtype = "fp32" (config written below);
#     tokens/s = median of metrics.jsonl's tokens_per_sec over steps > OURS_SKIP; memory =
#     metrics.jsonl's peak_mem_bytes (the caching allocator's tracked peak).
#   - PyTorch: tools/bench_torch_fsdp2.py (FSDP2 fully_shard per block + root,
#     MixedPrecisionPolicy(bf16, fp32), AdamW(fused=True)), eager and --compile; tokens/s =
#     median over the steps after TORCH_WARMUP; memory = torch.cuda.max_memory_allocated.
#   - Both: nvidia-smi memory.used sampled every 100 ms during the run, peak minus the value
#     before it (the whole process: CUDA context, cuBLAS/NCCL workspaces, allocator caches).
#   - MFU = tokens/s x FLOPs/token / peak, FLOPs/token = 6N + 12·L·T·C (PaLM appendix B;
#     N = parameters without the position table, as nanoGPT), peak = the GPU's dense bf16
#     tensor-core rate: H100 SXM / H200 989.4 TFLOPS, H100 NVL 835, H100 PCIe 756, A100 312
#     (detected from nvidia-smi's name; PEAK_TFLOPS overrides).
#
# Usage (from anywhere): tools/bench_gpu.sh            about 4-5 minutes on an H100
# It runs fsdp_train from the GPU bundle (gpu_bundle/, tools/gpu_bundle.sh; sourced env.sh)
# when there is one, else from $FSDP_BUILD_DIR (default <repo>/build-gpu) with the system's
# mpirun. Markdown table on stdout (last), progress on stderr.
# Environment (all optional):
#   FSDP_BUNDLE   bundle folder (default <repo>/gpu_bundle if it has env.sh)
#   FSDP_BUILD_DIR build directory holding fsdp_train when there is no bundle
#   ROUNDS (2)    interleaved rounds: ours, eager, compile, ours, ...
#   BATCH (8)     sequences of 1024 tokens per step, both programs
#   OURS_STEPS (30) / OURS_SKIP (10)      fsdp_train steps per run / leading steps dropped
#   TORCH_STEPS (30) / TORCH_WARMUP (10)  PyTorch steps per run / untimed leading steps
#   RUN_TIMEOUT (240) seconds per run;  BENCH_BUDGET_S: stop starting new rounds once less
#                  than one round's estimated time is left (tools/gpu_check.sh sets it)
#   PEAK_TFLOPS    dense bf16 peak of the GPU, TFLOPS;  PYTHON (python3)
#   BENCH_LOG_DIR  keep logs, configs and metrics here (default: a temp dir, removed)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ROUNDS="${ROUNDS:-2}"
BATCH="${BATCH:-8}"
OURS_STEPS="${OURS_STEPS:-30}" OURS_SKIP="${OURS_SKIP:-10}"
TORCH_STEPS="${TORCH_STEPS:-30}" TORCH_WARMUP="${TORCH_WARMUP:-10}"
RUN_TIMEOUT="${RUN_TIMEOUT:-240}"
BUDGET="${BENCH_BUDGET_S:-0}"
PYTHON="${PYTHON:-python3}"
N_LAYER=12 N_HEAD=12 N_EMBD=768 SEQ_LEN=1024 VOCAB=50257

die() { echo "bench_gpu.sh: $*" >&2; exit 1; }
say() { echo "bench_gpu.sh: $*" >&2; }
[[ "$OURS_STEPS" -gt "$OURS_SKIP" ]] || die "OURS_STEPS must exceed OURS_SKIP"
[[ "$TORCH_STEPS" -gt "$TORCH_WARMUP" ]] || die "TORCH_STEPS must exceed TORCH_WARMUP"
START=$SECONDS

# ---- where fsdp_train comes from ------------------------------------------------------------
BUNDLE="${FSDP_BUNDLE:-}"
[[ -z "$BUNDLE" && -f "$REPO/gpu_bundle/env.sh" ]] && BUNDLE="$REPO/gpu_bundle"
if [[ -n "$BUNDLE" ]]; then
  BUNDLE="$(cd "$BUNDLE" && pwd)" || die "bundle $BUNDLE not found"
  [[ -f "$BUNDLE/env.sh" ]] || die "$BUNDLE has no env.sh (tools/gpu_bundle.sh makes it)"
  # The bundle's environment for fsdp_train only; python3 and nvidia-smi keep the system's.
  in_ours() { ( source "$BUNDLE/env.sh" >/dev/null 2>&1; "$@" ); }
  OURS_FROM="bundle $(realpath --relative-to="$PWD" "$BUNDLE") (commit $(sed -n 's/^commit=//p' "$BUNDLE/manifest.txt" | cut -c1-12))"
  BIN=fsdp_train
else
  BUILD_DIR="${FSDP_BUILD_DIR:-$REPO/build-gpu}"
  BIN="$BUILD_DIR/fsdp_train"
  [[ -x "$BIN" ]] || die "no bundle (gpu_bundle/env.sh) and no $BIN: run tools/gpu_bundle.sh"
  in_ours() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"; }
  OURS_FROM="$BIN"
fi
command -v nvidia-smi >/dev/null || die "nvidia-smi not found (no NVIDIA driver?)"
"$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null ||
  die "$PYTHON cannot import torch with CUDA (set PYTHON=...)"

WORK="${BENCH_LOG_DIR:-}"
if [[ -n "$WORK" ]]; then mkdir -p "$WORK"; else WORK="$(mktemp -d /tmp/fsdp_bench_gpu.XXXXXX)"; trap 'rm -rf "$WORK"' EXIT; fi

# ---- GPU, peak ------------------------------------------------------------------------------
GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -1)"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader -i 0 | head -1)"
if [[ -n "${PEAK_TFLOPS:-}" ]]; then
  PEAK="$PEAK_TFLOPS" PEAK_WHY="PEAK_TFLOPS"
else
  case "$GPU_NAME" in
    *H200*NVL*|*H100*NVL*) PEAK=835 PEAK_WHY="H100/H200 NVL dense bf16" ;;
    *H200*) PEAK=989.4 PEAK_WHY="H200 dense bf16 (same SM clocks as H100 SXM)" ;;
    *H100*PCIe*) PEAK=756 PEAK_WHY="H100 PCIe dense bf16" ;;
    *H100*|*H800*) PEAK=989.4 PEAK_WHY="H100 SXM dense bf16" ;;
    *A100*) PEAK=312 PEAK_WHY="A100 dense bf16" ;;
    *) PEAK="" PEAK_WHY="unknown GPU: set PEAK_TFLOPS" ;;
  esac
fi

# Parameters and FLOPs per token of the model (both programs build exactly this).
read -r N_TOTAL N_MFU FLOPS_TOK < <(awk -v L=$N_LAYER -v C=$N_EMBD -v T=$SEQ_LEN -v V=$VOCAB 'BEGIN {
  total = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
  n = total - T * C
  printf "%d %d %d\n", total, n, 6 * n + 12 * L * T * C }')
mfu() { [[ -n "$PEAK" && "$1" != "-" ]] && awk -v r="$1" -v f="$FLOPS_TOK" -v p="$PEAK" 'BEGIN { printf "%.1f%%", 100 * r * f / (p * 1e12) }' || echo "n/a"; }
mib() { [[ "$1" =~ ^[0-9]+$ ]] && awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }' || echo "-"; }

# Kill what a timed-out run leaves behind (Open MPI gives each rank its own process group, which
# `timeout` does not reach): every process of a run carries FSDP_BENCH_TAG=<tag>; by pid.
reap() {
  local tag="FSDP_BENCH_TAG=$1" p
  for p in /proc/[0-9]*; do
    [[ "${p#/proc/}" == "$$" || "${p#/proc/}" == "$BASHPID" ]] && continue
    grep -qzx -- "$tag" "$p/environ" 2>/dev/null && kill -9 "${p#/proc/}" 2>/dev/null
  done
  return 0
}

# nvidia-smi sampler: start before a run, stop after; prints the peak MiB above the baseline.
smi_start() {
  SMI_BASE="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 >"$WORK/smi.$1" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null
  awk -v b="${SMI_BASE:-0}" '$1 ~ /^[0-9]+$/ && $1 > m { m = $1 } END { if (m == "") print "-"; else print m - b }' "$WORK/smi.$1"
}

# ---- fsdp_train config ----------------------------------------------------------------------
CFG="$WORK/bench_gpu.toml"
cat >"$CFG" <<EOF
# fsdp_train GPU benchmark configuration (written by tools/bench_gpu.sh)
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
device = "cuda"
global_batch_size = $BATCH
max_steps = $OURS_STEPS
seed = 1234
log_every = 1

[optim]
name = "adamw"
lr = 6e-4
min_lr = 6e-4
warmup_steps = 0
weight_decay = 0.1
grad_clip = 1.0
beta1 = 0.9
beta2 = 0.999
eps = 1e-8

[fsdp]
sharding_strategy = "FULL_SHARD"
auto_wrap_policy = "TRANSFORMER_BASED_WRAP"
transformer_layer_cls_to_wrap = ["GPT2Block"]

[mixed_precision]
param_dtype = "bf16"
reduce_dtype = "fp32"

[comm]
backend = "auto"

[checkpoint]
every = 0

[eval]
every = 0
max_windows = 1
EOF

# ---- runs -----------------------------------------------------------------------------------
# Seconds a run may take: RUN_TIMEOUT, or less so that the whole benchmark keeps to
# BENCH_BUDGET_S (the table is printed at the end, so the script must end by itself).
run_limit() {
  local t=$RUN_TIMEOUT rem
  if (( BUDGET > 0 )); then
    rem=$(( BUDGET - (SECONDS - START) - 10 ))
    (( rem < t )) && t=$rem
  fi
  echo "$t"
}
# Each prints "tokens_per_sec mem_bytes smi_mib seconds" (or "- - - seconds" on failure).
run_ours() {
  local r=$1 dir="$WORK/ours_$1" t0=$SECONDS smi lim
  lim="$(run_limit)"
  if (( lim < 30 )); then say "fsdp_train round $r not run: out of time"; echo "- - - 0"; return; fi
  rm -rf "$dir"
  smi_start "ours_$r"
  FSDP_BENCH_TAG="ours_$r" in_ours timeout -k 10 "$lim" mpirun -np 1 --bind-to none "$BIN" "$CFG" \
      --set "train.run_dir=\"$dir\"" </dev/null >"$WORK/ours_$r.log" 2>&1
  local rc=$?
  reap "ours_$r"
  smi="$(smi_stop "ours_$r")"
  rm -rf "$dir/checkpoints"  # the final checkpoint (about 1.5 GB) is not part of the benchmark
  if [[ $rc != 0 ]]; then
    say "fsdp_train failed (round $r, exit $rc): $(grep -m1 -E '^fsdp_train:|rror' "$WORK/ours_$r.log")"
    say "last lines of $WORK/ours_$r.log:"
    tail -15 "$WORK/ours_$r.log" >&2
    echo "- - $smi $((SECONDS - t0))"; return
  fi
  cp "$dir/metrics.jsonl" "$WORK/ours_$r.metrics.jsonl" 2>/dev/null
  local res
  res="$("$PYTHON" - "$dir/metrics.jsonl" "$OURS_SKIP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skip = int(sys.argv[2])
steps = [r for r in rows if "tokens_per_sec" in r and r["step"] > skip]
if not steps:
    sys.exit("no timed steps in " + sys.argv[1])
peak = max(r.get("peak_mem_bytes", 0) for r in rows)
print(f"{statistics.median(r['tokens_per_sec'] for r in steps):.1f} {peak}")
PY
)" || res="- -"
  echo "$res $smi $((SECONDS - t0))"
}

run_torch() {  # $1 = round, $2 = eager|compile
  local r=$1 mode=$2 t0=$SECONDS smi out flag=() lim
  [[ "$mode" == compile ]] && flag=(--compile)
  lim="$(run_limit)"
  if (( lim < 30 )); then say "FSDP2 $mode round $r not run: out of time"; echo "- - - 0"; return; fi
  smi_start "torch_${mode}_$r"
  FSDP_BENCH_TAG="torch_${mode}_$r" timeout -k 10 "$lim" "$PYTHON" "$REPO/tools/bench_torch_fsdp2.py" --n-layer $N_LAYER \
    --n-head $N_HEAD --n-embd $N_EMBD --seq-len $SEQ_LEN --vocab $VOCAB --batch "$BATCH" \
    --steps "$TORCH_STEPS" --warmup "$TORCH_WARMUP" "${flag[@]}" </dev/null >"$WORK/torch_${mode}_$r.log" 2>&1
  local rc=$?
  reap "torch_${mode}_$r"
  smi="$(smi_stop "torch_${mode}_$r")"
  out="$(sed -n 's/^RESULT //p' "$WORK/torch_${mode}_$r.log" | tail -1)"
  if [[ $rc != 0 || -z "$out" ]]; then
    say "bench_torch_fsdp2.py $mode failed (round $r, exit $rc): $(grep -E 'Error|error' "$WORK/torch_${mode}_$r.log" | tail -1)"
    say "last lines of $WORK/torch_${mode}_$r.log:"
    tail -15 "$WORK/torch_${mode}_$r.log" >&2
    echo "- - $smi $((SECONDS - t0))"; return
  fi
  "$PYTHON" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["tokens_per_sec"], d["max_memory_allocated"], end=" ")' "$out"
  echo "$smi $((SECONDS - t0))"
  echo "$out" >"$WORK/torch_${mode}_$r.json"
}

say "GPU: $GPU_NAME (driver $DRIVER); peak ${PEAK:-?} TFLOPS ($PEAK_WHY)"
say "fsdp_train from $OURS_FROM; $ROUNDS rounds of: fsdp_train, FSDP2 eager, FSDP2 + torch.compile"
declare -a OURS TE TC
declare -A MEM SMI SEC
done_rounds=0
for ((r = 1; r <= ROUNDS; r++)); do
  if (( r > 1 && BUDGET > 0 )); then
    per=$(( (SECONDS - START) / (r - 1) ))
    if (( SECONDS - START + per > BUDGET )); then
      say "stopping after $((r - 1)) round(s): another takes about ${per} s, budget ${BUDGET} s"
      break
    fi
  fi
  read -r a m s t < <(run_ours "$r");         OURS[r]=$a MEM[o$r]=$m SMI[o$r]=$s SEC[o$r]=$t
  say "round $r: fsdp_train        $a tok/s, tracked peak $(mib "$m") MiB, nvidia-smi +$s MiB (${t} s)"
  read -r a m s t < <(run_torch "$r" eager);   TE[r]=$a MEM[e$r]=$m SMI[e$r]=$s SEC[e$r]=$t
  say "round $r: FSDP2 eager       $a tok/s, max_allocated $(mib "$m") MiB, nvidia-smi +$s MiB (${t} s)"
  read -r a m s t < <(run_torch "$r" compile); TC[r]=$a MEM[c$r]=$m SMI[c$r]=$s SEC[c$r]=$t
  say "round $r: FSDP2 compile     $a tok/s, max_allocated $(mib "$m") MiB, nvidia-smi +$s MiB (${t} s)"
  done_rounds=$r
done

median() { "$PYTHON" -c 'import sys,statistics; v=[float(x) for x in sys.argv[1:] if x not in ("-", "")]; print(f"{statistics.median(v):.1f}" if v else "-")' "$@"; }
maxof() { "$PYTHON" -c 'import sys; v=[float(x) for x in sys.argv[1:] if x not in ("-", "")]; print(int(max(v)) if v else "-")' "$@"; }
col() { local k=$1 r out=(); for ((r = 1; r <= done_rounds; r++)); do out+=("${MEM[$k$r]:-}"); done; echo "${out[@]}"; }
scol() { local k=$1 r out=(); for ((r = 1; r <= done_rounds; r++)); do out+=("${SMI[$k$r]:-}"); done; echo "${out[@]}"; }
MO="$(median "${OURS[@]:-}")" ME="$(median "${TE[@]:-}")" MC="$(median "${TC[@]:-}")"
ratio() { [[ "$1" != "-" && "$2" != "-" ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }' || echo "n/a"; }
TORCH_VER="$("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"

# ---- table ----------------------------------------------------------------------------------
echo
echo "### GPU benchmark ($(date -u +%Y-%m-%dT%H:%MZ), $GPU_NAME, driver $DRIVER)"
echo
echo "GPT-2 124M (${N_LAYER}L/${N_HEAD}H/${N_EMBD}C, seq $SEQ_LEN, vocab $VOCAB, $N_TOTAL parameters)," \
     "synthetic tokens, batch $BATCH x $SEQ_LEN = $((BATCH * SEQ_LEN)) tokens/step, bf16 params/compute," \
     "fp32 master + reduce, FULL_SHARD world 1, AdamW lr 6e-4, clip 1.0. $done_rounds interleaved round(s)."
echo "MFU: FLOPs/token = 6N + 12·L·T·C = $FLOPS_TOK (N = $N_MFU without the position table);" \
     "peak ${PEAK:-n/a} TFLOPS ($PEAK_WHY)."
echo "fsdp_train: $OURS_FROM, median of steps $((OURS_SKIP + 1))..$OURS_STEPS; PyTorch $TORCH_VER," \
     "median of steps $((TORCH_WARMUP + 1))..$TORCH_STEPS."
echo
echo "| run | tok/s | MFU | peak memory, program's own (MiB) | nvidia-smi peak above idle (MiB) | wall s |"
echo "|---|---:|---:|---:|---:|---:|"
for ((r = 1; r <= done_rounds; r++)); do
  echo "| fsdp_train, round $r | ${OURS[r]} | $(mfu "${OURS[r]}") | $(mib "${MEM[o$r]}") (tracked peak_mem_bytes) | ${SMI[o$r]} | ${SEC[o$r]} |"
  echo "| FSDP2 eager, round $r | ${TE[r]} | $(mfu "${TE[r]}") | $(mib "${MEM[e$r]}") (max_memory_allocated) | ${SMI[e$r]} | ${SEC[e$r]} |"
  echo "| FSDP2 + torch.compile, round $r | ${TC[r]} | $(mfu "${TC[r]}") | $(mib "${MEM[c$r]}") (max_memory_allocated) | ${SMI[c$r]} | ${SEC[c$r]} |"
done
# shellcheck disable=SC2046  # col/scol print one value per round, split on purpose
echo "| **fsdp_train, median** | **$MO** | **$(mfu "$MO")** | $(mib "$(maxof $(col o))") | $(maxof $(scol o)) | |"
# shellcheck disable=SC2046
echo "| **FSDP2 eager, median** | **$ME** | **$(mfu "$ME")** | $(mib "$(maxof $(col e))") | $(maxof $(scol e)) | |"
# shellcheck disable=SC2046
echo "| **FSDP2 + torch.compile, median** | **$MC** | **$(mfu "$MC")** | $(mib "$(maxof $(col c))") | $(maxof $(scol c)) | |"
echo
echo "Ratio fsdp_train / (FSDP2 + torch.compile): **$(ratio "$MO" "$MC")**;" \
     "fsdp_train / FSDP2 eager: **$(ratio "$MO" "$ME")**."
echo
echo "Commands:"
echo
echo '```'
echo "mpirun -np 1 --bind-to none fsdp_train bench_gpu.toml --set train.run_dir=\"...\"   # bundle env sourced"
echo "$PYTHON tools/bench_torch_fsdp2.py --n-layer $N_LAYER --n-head $N_HEAD --n-embd $N_EMBD --seq-len $SEQ_LEN --vocab $VOCAB --batch $BATCH --steps $TORCH_STEPS --warmup $TORCH_WARMUP [--compile]"
echo '```'
echo
echo "bench_gpu.toml (written by tools/bench_gpu.sh):"
echo
echo '```toml'
grep -v '^#' "$CFG" | cat -s
echo '```'
echo
echo "Whole benchmark: $((SECONDS - START)) s."
[[ "$MO" != "-" && "$MC" != "-" && "$ME" != "-" ]] || exit 1
