#!/usr/bin/env bash
# tools/bench_gpu.sh: fsdp_train against PyTorch on ONE GPU: training throughput, MFU and peak
# memory at three shapes (a fourth, llama-1b, on request), every contender run in each of ROUNDS interleaved rounds (round 1:
# each model's contenders in turn, then round 2, ...; GPU clocks and thermals drift alike for
# all), medians reported.
#
# Models (tools/bench_torch_gpu.py MODELS; synthetic uniformly random tokens on both sides):
#   gpt2-124m      12 layers x 768, 12 heads, vocab 50257, batch 8 x 1024 tokens
#   gpt2-1.5b      48 layers x 1600, 25 heads, vocab 50257, batch 4 x 1024 tokens
#   t5-small-byt5  t5-small's shape with the ByT5 vocabulary (384), span corruption of 512
#                  bytes (inputs 462, targets 104), batch 32
#   llama-1b       (not in the default MODELS: its own call, MODELS=llama-1b, see Usage) Llama
#                  3.2 1B's shape: 16 layers x 2048, 32 query / 8 K/V heads of 64, SwiGLU 8192,
#                  vocab 128256, tied, RoPE theta 5e5 with llama3 scaling; batch 4 x 2048 tokens
# Contenders (each its own process; WARMUP untimed steps -- PyTorch's: at least WARMUP, then until
# the step time settles, see below --, then STEPS timed, median step):
#   fsdp_train     bf16 parameters and compute over fp32 master weights, fp32 gradient
#                  reduction, FULL_SHARD at world size 1 (`mpirun -np 1`), its configuration
#                  from `bench_torch_gpu.py --fsdp-train-toml`; tok/s = median of metrics.jsonl's
#                  tokens_per_sec over steps > WARMUP; memory = peak_mem_bytes (its caching
#                  allocator's tracked peak)
#   PyTorch        tools/bench_torch_gpu.py: --wrap none (plain single-GPU PyTorch: bf16
#                  autocast over fp32 weights, AdamW(fused=True), SDPA, TF32): none:eager;
#                  none:compile, torch.compile of the whole model with its loss as one function
#                  (--compile-scope model), at every shape; none:compile-block, torch.compile of
#                  each block (--compile-scope block); none:autotune, the whole model with
#                  mode="max-autotune-no-cudagraphs" (--compile-mode), run in each round after
#                  every other contender of every model and only while the budget allows
#                  (AUTOTUNE_NEED_S before its first run; AUTOTUNE=0: no such rows);
#                  --wrap fsdp2 (fully_shard per block + root at world size 1,
#                  MixedPrecisionPolicy(bf16, fp32)), eager and torch.compile of each block
#                  before fully_shard (torchtitan); T5: Hugging Face T5ForConditionalGeneration,
#                  plain eager and compile, and FSDP2 eager and compile (T5_FSDP2=0: without).
#                  Llama: none:eager / none:compile are the Llama written in bench_torch_gpu.py
#                  (--impl plain: SDPA is_causal + enable_gqa), and hf:eager / hf:compile
#                  transformers' LlamaForCausalLM (--wrap none --impl hf, attention sdpa), both
#                  one GPU, bf16 autocast, fused AdamW, compile = model + loss; no FSDP2 rows
#                  unless LLAMA_FSDP2=1 (time). memory = torch.cuda.max_memory_allocated.
#                  Warm-up: at least WARMUP steps, then until the last 3 steps agree within 2 %
#                  (or WARMUP_MAX steps); compilation and autotuning happen there and are
#                  reported apart (the table's "compile s": the warm-up's time above the timed
#                  median step), never in the timed steps
#   all            nvidia-smi's memory.used sampled every 100 ms during the run (peak minus the
#                  value before it: CUDA context, library workspaces and allocator caches too)
# Tokens and MFU: tokens per step as fsdp_train counts them (GPT-2: B x T; T5: B x (inputs +
# targets)), FLOPs per token from ModelFamily::train_flops_per_sample (bench_torch_gpu.py
# --describe: 6N + attention, N = the matrix weights), the same for every row; MFU = tok/s x
# FLOPs/token / peak dense bf16 of the GPU (H100 SXM / H200 989.4 TFLOPS, H100 NVL 835, H100
# PCIe 756, A100 312; PEAK_TFLOPS overrides); fsdp_train also gets it as train.peak_flops, so
# its own metrics.jsonl mfu must agree (the table's notes show both).
# Ratio: every row's tok/s ÷ the BEST PyTorch row's of its model (the fastest of eager, each
# compile, FSDP2, Hugging Face), named above the table; fsdp_train's row is the headline ratio.
# If torch.compile is slower than eager for a model, the notes say why the script thinks so
# (graph breaks and their reasons from torch._dynamo.utils.counters, graphs, compile time).
#
# Usage, from the repo root (it keeps to BENCH_BUDGET_S; with every PyTorch row the three
# default models no longer fit 3 rounds, docs/gpu.md "The benchmark" gives one call per model):
#   tools/bench_gpu.sh
#   MODELS=llama-1b ROUNDS=2 BENCH_BUDGET_S=480 tools/bench_gpu.sh   # the Llama row, its own call
#     (5 contenders; two torch.compile warm-ups of a 16-layer model in round 1)
# fsdp_train runs from the GPU bundle (gpu_bundle/, tools/gpu_bundle.sh; its env.sh sourced in a
# subshell) when there is one, else from $FSDP_BUILD_DIR (default build-gpu/) with the system's
# mpirun. The markdown table goes to stdout (last) and, with $OUT set (the run tool's folder) or
# BENCH_OUT_DIR, to bench_gpu.md there, with bench_gpu_results.jsonl (one line per run) and
# bench_gpu_logs.tar.gz (each run's log, fsdp_train's metrics.jsonl, the configurations).
# Progress on stderr.
# Environment (all optional):
#   MODELS ("gpt2-124m gpt2-1.5b t5-small-byt5")  ROUNDS (3)  WARMUP (3)  STEPS (10)
#   WARMUP_MAX (30): PyTorch warm-up steps at most when the step time does not settle
#   BENCH_BUDGET_S (450): no run starts that its previous round's time says would not end in
#                  it; each run is also cut there, so the script ends by itself with its table
#   CONTENDERS (every model's default: "fsdp_train fsdp_train:graphs
#                  fsdp_train:graphs+fused_ce none:eager none:compile-block none:compile
#                  fsdp2:eager fsdp2:compile none:autotune", T5 without graphs+fused_ce,
#                  which only the causal LMs have; llama-1b: "fsdp_train
#                  fsdp_train:graphs fsdp_train:graphs+fused_ce none:eager
#                  none:compile-block none:compile hf:eager hf:compile none:autotune") e.g.
#                  "fsdp_train none:compile" for a short call; a PyTorch contender is
#                  WRAP:MODE, WRAP none | hf | fsdp2, MODE eager | compile | compile-block |
#                  autotune (fsdp2: eager | compile, its compile is per block);
#                  "fsdp_train:offload" adds fsdp_train with fsdp.cpu_offload = true (issue 22:
#                  its tok/s ÷ fsdp_train is offload's cost; host_mem_bytes its host peak);
#                  fsdp_train:OPT[+OPT...] adds options, OPT graphs (train.cuda_graphs =
#                  "on", issue 32), fused_ce (model.fused_linear_cross_entropy: no
#                  [tokens, vocab] logits), offload (fsdp.cpu_offload), e.g.
#                  "fsdp_train:graphs+fused_ce"
#   AUTOTUNE (1; 0: no none:autotune rows)  AUTOTUNE_NEED_S (180): seconds of budget an
#                  autotune run needs before its first run (then its previous run's time)
#   RUN_TIMEOUT (240) seconds per run at most;  T5_FSDP2 (1; 0 leaves
#                  T5 without its FSDP2 runs);  LLAMA_FSDP2 (0; 1 adds FSDP2 eager and compile
#                  of the plain Llama to llama-1b's contenders)
#   PEAK_TFLOPS;  PYTHON (python3);  FSDP_BUNDLE (default gpu_bundle/ if it has env.sh);
#   FSDP_BUILD_DIR;  BENCH_LOG_DIR (keep the work folder there; default a temp folder)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/tools/kit_lib.sh"
MODELS="${MODELS:-gpt2-124m gpt2-1.5b t5-small-byt5}"
ROUNDS="${ROUNDS:-3}" WARMUP="${WARMUP:-3}" STEPS="${STEPS:-10}"
BUDGET="${BENCH_BUDGET_S:-450}"
RUN_TIMEOUT="${RUN_TIMEOUT:-240}"
WARMUP_MAX="${WARMUP_MAX:-30}"
AUTOTUNE="${AUTOTUNE:-1}"
AUTOTUNE_NEED_S="${AUTOTUNE_NEED_S:-180}"
T5_FSDP2="${T5_FSDP2:-1}"
LLAMA_FSDP2="${LLAMA_FSDP2:-0}"
PYTHON="${PYTHON:-python3}"
BENCH_PY="$REPO/tools/bench_torch_gpu.py"
START=$SECONDS

die() { echo "bench_gpu.sh: $*" >&2; exit 1; }
say() { echo "bench_gpu.sh: [+$((SECONDS - START))s] $*" >&2; }
for v in ROUNDS WARMUP STEPS BUDGET RUN_TIMEOUT WARMUP_MAX AUTOTUNE_NEED_S; do
  [[ "${!v}" =~ ^[0-9]+$ ]] || die "$v=${!v} is not a non-negative integer"
done
(( STEPS >= 1 && ROUNDS >= 1 )) || die "STEPS and ROUNDS must be >= 1"
[[ -z "${PLAIN_COMPILE_SCOPE:-}" ]] ||
  die "PLAIN_COMPILE_SCOPE is gone: none:compile is the whole model + loss, none:compile-block each block (CONTENDERS)"

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
  BIN="${FSDP_BUILD_DIR:-$REPO/build-gpu}/fsdp_train"
  [[ -x "$BIN" ]] || die "no bundle (gpu_bundle/env.sh) and no $BIN: run tools/gpu_bundle.sh"
  in_ours() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$@"; }
  OURS_FROM="$BIN"
fi
command -v nvidia-smi >/dev/null || die "nvidia-smi not found (no NVIDIA driver?)"
"$PYTHON" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null ||
  die "$PYTHON cannot import torch with CUDA (set PYTHON=...)"

WORK="${BENCH_LOG_DIR:-}"
if [[ -n "$WORK" ]]; then mkdir -p "$WORK"; else WORK="$(mktemp -d /tmp/fsdp_bench_gpu.XXXXXX)"; trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK/logs"
DEST="${BENCH_OUT_DIR:-${OUT:-}}"
[[ -z "$DEST" ]] || mkdir -p "$DEST"
RESULTS="$WORK/results.jsonl"
: >"$RESULTS"

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
PEAK_SET=()
[[ -n "$PEAK" ]] && PEAK_SET=(--set "train.peak_flops=$(awk -v p="$PEAK" 'BEGIN { printf "%.6e", p * 1e12 }')")

# Each model's fsdp_train configuration and description (shape, tokens, FLOPs: one place).
for m in $MODELS; do
  "$PYTHON" "$BENCH_PY" --model "$m" --describe >"$WORK/$m.describe.json" 2>"$WORK/logs/describe.err" ||
    die "unknown model '$m' (MODELS): $(tail -1 "$WORK/logs/describe.err")"
  "$PYTHON" "$BENCH_PY" --model "$m" --fsdp-train-toml --warmup "$WARMUP" --steps "$STEPS" >"$WORK/$m.toml" ||
    die "bench_torch_gpu.py --fsdp-train-toml failed for $m"
done
contenders() {  # $1 = model
  if [[ -n "${CONTENDERS:-}" ]]; then echo "$CONTENDERS"; return; fi
  local c="fsdp_train fsdp_train:graphs"
  [[ "$1" == t5* ]] || c+=" fsdp_train:graphs+fused_ce"  # causal LMs only
  c+=" none:eager none:compile-block none:compile"
  case "$1" in
    t5*) [[ "$T5_FSDP2" == 1 ]] && c+=" fsdp2:eager fsdp2:compile" ;;
    llama*) c+=" hf:eager hf:compile"; [[ "$LLAMA_FSDP2" == 1 ]] && c+=" fsdp2:eager fsdp2:compile" ;;
    *) c+=" fsdp2:eager fsdp2:compile" ;;
  esac
  [[ "$AUTOTUNE" == 1 ]] && c+=" none:autotune"
  echo "$c"
}

# Kill what a timed-out run leaves behind: every process of a run carries FSDP_BENCH_TAG=<tag>
# (tools/kit_lib.sh kill_tagged).
reap() { kill_tagged FSDP_BENCH_TAG "$1" >/dev/null; }
# nvidia-smi sampler: started before a run, stopped after; prints the peak MiB above the value
# before the run.
smi_start() {
  SMI_BASE="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')"
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 >"$WORK/logs/$1.smi" 2>/dev/null &
  SMI_PID=$!
}
smi_stop() {
  kill "$SMI_PID" 2>/dev/null; wait "$SMI_PID" 2>/dev/null
  awk -v b="${SMI_BASE:-0}" '$1 ~ /^[0-9]+$/ && $1 > m { m = $1 } END { if (m == "") print "null"; else print m - b }' "$WORK/logs/$1.smi"
}
# One line of results.jsonl: model, contender, round, then key=value pairs (values are JSON).
record() {
  "$PYTHON" - "$@" >>"$RESULTS" <<'PY'
import json, sys
m, who, r = sys.argv[1:4]
d = {"model": m, "who": who, "round": int(r)}
for kv in sys.argv[4:]:
    k, v = kv.split("=", 1)
    d[k] = json.loads(v)
print(json.dumps(d))
PY
}
js() { "$PYTHON" -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

# Seconds the next run may take: RUN_TIMEOUT, cut to what is left of BENCH_BUDGET_S.
run_limit() {
  local t=$RUN_TIMEOUT rem=$(( BUDGET - (SECONDS - START) - 15 ))
  (( rem < t )) && t=$rem
  echo "$t"
}

# fsdp_train[:OPT[+OPT...]] -> its --set arguments, one per line; false for an unknown OPT.
ours_sets() {  # $1 = contender
  [[ "$1" == fsdp_train ]] && return 0
  [[ "$1" == fsdp_train:* ]] || return 1
  local opt
  for opt in $(tr '+' ' ' <<<"${1#fsdp_train:}"); do
    case "$opt" in
      offload) printf '%s\n' --set fsdp.cpu_offload=true ;;
      graphs) printf '%s\n' --set 'train.cuda_graphs="on"' ;;
      fused_ce) printf '%s\n' --set model.fused_linear_cross_entropy=true ;;
      *) return 1 ;;
    esac
  done
}

run_ours() {  # $1 = model, $2 = round, $3 = time limit, $4 = fsdp_train[:OPT[+OPT...]]
  local m=$1 r=$2 who=${4:-fsdp_train} lim=$3 t0=$SECONDS smi rc res extra=()
  local tag="ours_$1_${who//[:+]/_}_$2" dir="$WORK/run_ours_$1_${who//[:+]/_}_$2"
  mapfile -t extra < <(ours_sets "$who")
  rm -rf "$dir"
  smi_start "$tag"
  FSDP_BENCH_TAG="$tag" in_ours timeout -k 10 "$lim" mpirun -np 1 --bind-to none "$BIN" "$WORK/$m.toml" \
    --set "train.run_dir=\"$dir\"" "${PEAK_SET[@]}" "${extra[@]}" </dev/null >"$WORK/logs/$tag.log" 2>&1
  rc=$?
  reap "$tag"
  smi="$(smi_stop "$tag")"
  rm -rf "$dir/checkpoints"  # none: the tomls set checkpoint.enable = false (1.5B: 18.7 GB a save)
  cp "$dir/metrics.jsonl" "$WORK/logs/$tag.metrics.jsonl" 2>/dev/null
  if [[ $rc == 0 ]] && res="$("$PYTHON" - "$dir/metrics.jsonl" "$WARMUP" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = [r for r in rows if "tokens_per_sec" in r and r["step"] > int(sys.argv[2])]
if not timed:
    sys.exit("no timed steps in " + sys.argv[1])
mfu = [r["mfu"] for r in timed if "mfu" in r]
print(json.dumps({"tokens_per_sec": statistics.median(r["tokens_per_sec"] for r in timed),
                  "mem_bytes": max(r.get("peak_mem_bytes", 0) for r in rows),
                  "host_mem_bytes": max(r.get("host_peak_mem_bytes", 0) for r in rows),
                  "own_mfu": statistics.median(mfu) if mfu else None}))
PY
)"; then
    record "$m" "$who" "$r" ok=true "result=$res" "smi_mib=$smi" "wall_s=$((SECONDS - t0))"
    say "round $r $m $who: $res, nvidia-smi +$smi MiB ($((SECONDS - t0)) s)"
  else
    local why
    why="exit $rc$( (( rc == 124 || rc == 137 )) && echo " (timed out at $lim s)"): $(grep -m1 -E '^fsdp_train:|rror' "$WORK/logs/$tag.log" | cut -c1-300)"
    record "$m" "$who" "$r" ok=false "error=$(js "$why")" "smi_mib=$smi" "wall_s=$((SECONDS - t0))"
    say "round $r $m $who FAILED: $why; last lines of its log:"
    tail -15 "$WORK/logs/$tag.log" >&2
  fi
}

# A PyTorch contender WRAP:MODE as bench_torch_gpu.py arguments (hf = --wrap none --impl hf).
torch_args() {  # $1 = wrap:mode
  local wrap=${1%%:*} mode=${1##*:} a=()
  [[ "$wrap" == hf ]] && wrap=none a+=(--impl hf)
  case "$wrap" in none|fsdp2) ;; *) return 1 ;; esac
  case "$mode" in
    eager) a+=(--mode eager) ;;
    compile) a+=(--mode compile) ;;  # none: the whole model + loss; fsdp2: each block
    compile-block) [[ "$wrap" == none ]] || return 1; a+=(--mode compile --compile-scope block) ;;
    autotune) [[ "$wrap" == none ]] || return 1
      a+=(--mode compile --compile-scope model --compile-mode max-autotune-no-cudagraphs) ;;
    *) return 1 ;;
  esac
  echo "--wrap $wrap ${a[*]}"
}
for m in $MODELS; do
  for who in $(contenders "$m"); do
    ours_sets "$who" >/dev/null || torch_args "$who" >/dev/null ||
      die "unknown contender '$who' (CONTENDERS): fsdp_train[:OPT[+OPT]] (OPT offload, graphs, fused_ce) or WRAP:MODE, WRAP none|hf|fsdp2, MODE eager|compile|compile-block|autotune (compile-block, autotune: none and hf only)"
  done
done

run_torch() {  # $1 = model, $2 = wrap:mode (wrap hf = none with --impl hf), $3 = round, $4 = time limit
  local m=$1 who=$2 r=$3 lim=$4 tag="torch_$1_${2/:/_}_$3" t0=$SECONDS smi rc out
  local targs
  read -r -a targs <<<"$(torch_args "$who")"
  smi_start "$tag"
  FSDP_BENCH_TAG="$tag" timeout -k 10 "$lim" "$PYTHON" "$BENCH_PY" --model "$m" "${targs[@]}" \
    --warmup "$WARMUP" --warmup-max "$WARMUP_MAX" --steps "$STEPS" \
    </dev/null >"$WORK/logs/$tag.out" 2>"$WORK/logs/$tag.log"
  rc=$?
  reap "$tag"
  smi="$(smi_stop "$tag")"
  out="$(tail -1 "$WORK/logs/$tag.out")"
  if [[ $rc == 0 ]] && "$PYTHON" -c 'import json, sys; json.loads(sys.argv[1])["tokens_per_sec"]' "$out" 2>/dev/null; then
    record "$m" "$who" "$r" ok=true "result=$out" "smi_mib=$smi" "wall_s=$((SECONDS - t0))"
    say "round $r $m $who: $("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["tokens_per_sec"], "tok/s, max_allocated", d["max_memory_allocated"] >> 20, "MiB, warm-up", d["warmup_s"], "s in", d.get("warmup_steps"), "steps (settled:", str(d.get("settled")) + ", compile", d.get("compile_s"), "s), graph breaks", d["graph_breaks"])' "$out"), nvidia-smi +$smi MiB ($((SECONDS - t0)) s)"
  else
    local why
    why="exit $rc$( (( rc == 124 || rc == 137 )) && echo " (timed out at $lim s)"): $(grep -E 'Error|error' "$WORK/logs/$tag.log" | tail -1 | cut -c1-300)"
    record "$m" "$who" "$r" ok=false "error=$(js "$why")" "smi_mib=$smi" "wall_s=$((SECONDS - t0))"
    say "round $r $m $who FAILED: $why; last lines of its log:"
    tail -15 "$WORK/logs/$tag.log" >&2
  fi
}

say "GPU: $GPU_NAME (driver $DRIVER); peak ${PEAK:-?} TFLOPS ($PEAK_WHY); budget $BUDGET s"
say "fsdp_train from $OURS_FROM; models: $MODELS; $ROUNDS round(s) of $WARMUP + $STEPS steps"
declare -A LAST=()  # model/contender -> seconds its last run took
# Each round: every contender of every model but the autotune ones, then (pass 2) the autotune
# ones, so that a long max-autotune compile never takes the budget of a cheaper row.
for ((r = 1; r <= ROUNDS; r++)); do
  for pass in 1 2; do
  for m in $MODELS; do
    for who in $(contenders "$m"); do
      if [[ "$who" == *:autotune ]]; then [[ $pass == 2 ]] || continue; else [[ $pass == 1 ]] || continue; fi
      lim="$(run_limit)"
      default_need=30
      [[ "$who" == *:autotune ]] && default_need=$AUTOTUNE_NEED_S
      need="${LAST[$m/$who]:-$default_need}"
      if (( lim < need || lim < 20 )); then
        say "round $r $m $who not run: ${lim} s left of the budget, it needs ${need} s (its last run's time; before the first: 30 s, autotune AUTOTUNE_NEED_S)"
        printf '{"model": "%s", "who": "%s", "round": %d, "ok": false, "skipped": true, "error": "not run: out of time (BENCH_BUDGET_S=%d)"}\n' \
          "$m" "$who" "$r" "$BUDGET" >>"$RESULTS"
        continue
      fi
      t0=$SECONDS
      if [[ "$who" == fsdp_train* ]]; then run_ours "$m" "$r" "$lim" "$who"; else run_torch "$m" "$who" "$r" "$lim"; fi
      LAST[$m/$who]=$((SECONDS - t0))
    done
  done
  done
done

# ---- table ----------------------------------------------------------------------------------
TORCH_VER="$("$PYTHON" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"
TF_VER="$("$PYTHON" -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo "not installed")"
TABLE="$WORK/bench_gpu.md"
"$PYTHON" - "$RESULTS" "$WORK" "$PEAK" >"$TABLE" <<PY
import json, statistics, sys
results_path, work, peak = sys.argv[1], sys.argv[2], sys.argv[3]
peak = float(peak) * 1e12 if peak else None
rows = [json.loads(l) for l in open(results_path) if l.strip()]
models = "$MODELS".split()
OPT = {  # fsdp_train:OPT[+OPT...] (ours_sets in the script)
    "offload": "fsdp.cpu_offload (master, grads, AdamW on the host)",
    "graphs": "train.cuda_graphs = \"on\" (kernels between hooks as CUDA graphs)",
    "fused_ce": "model.fused_linear_cross_entropy (no logits kept)",
}
LABEL = {
    "fsdp_train": "fsdp_train (bf16 over fp32 master, FULL_SHARD, world 1)",
    "none:eager": "PyTorch, one GPU, eager",
    "none:compile-block": "PyTorch, one GPU, torch.compile per block",
    "none:compile": "PyTorch, one GPU, torch.compile (whole model + loss)",
    "none:autotune": "PyTorch, one GPU, torch.compile max-autotune-no-cudagraphs (whole model + loss)",
    "hf:eager": "Hugging Face model (sdpa), one GPU, eager",
    "hf:compile-block": "Hugging Face model (sdpa), one GPU, torch.compile per block",
    "hf:compile": "Hugging Face model (sdpa), one GPU, torch.compile (whole model + loss)",
    "hf:autotune": "Hugging Face model (sdpa), one GPU, torch.compile max-autotune-no-cudagraphs (whole model + loss)",
    "fsdp2:eager": "PyTorch FSDP2, eager",
    "fsdp2:compile": "PyTorch FSDP2 + torch.compile per block",
}
ours = [w for w in dict.fromkeys(r["who"] for r in rows) if w.startswith("fsdp_train:")]
LABEL = {"fsdp_train": LABEL["fsdp_train"],
         **{w: "fsdp_train, " + ", ".join(OPT[o] for o in w.split(":", 1)[1].split("+"))
            for w in ours},
         **{w: l for w, l in LABEL.items() if w != "fsdp_train"}}
def med(v):
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None
def fmt(x, f="%.0f"):
    return "-" if x is None else f % x
print("### GPU benchmark ($(date -u +%Y-%m-%dT%H:%MZ), $GPU_NAME, driver $DRIVER)")
print()
print("fsdp_train: $OURS_FROM. PyTorch $TORCH_VER, transformers $TF_VER. Synthetic tokens; "
      "$WARMUP warm-up steps (compilation included) then $STEPS timed steps per run, the run's "
      "median step; $ROUNDS interleaved round(s), the median over rounds. MFU = tok/s x FLOPs "
      "per token (fsdp_train's ModelFamily::train_flops_per_sample, the same for every row) / "
      "peak ${PEAK:-n/a} TFLOPS ($PEAK_WHY). Program memory: fsdp_train's peak_mem_bytes, "
      "PyTorch's torch.cuda.max_memory_allocated; nvidia-smi: peak memory.used above the value "
      "before the run. tok/s ratio: this row / the best PyTorch row of the model (named above "
      "its table; fsdp_train's row is fsdp_train / best PyTorch); memory ratio: this row / "
      "fsdp_train. PyTorch warm-up: at least $WARMUP steps, then until 3 consecutive steps agree "
      "within 2 % (at most $WARMUP_MAX); compile s = the warm-up's time above the timed median "
      "step (compilation, autotuning), not in tok/s.")
status = 0
notes = []
for m in models:
    d = json.load(open("%s/%s.describe.json" % (work, m)))
    mine = [r for r in rows if r["model"] == m]
    if d["family"] == "gpt2":
        shape = ("GPT-2 %d x %d, %d heads, vocab %d, %d parameters; batch %d x %d = %d tokens/step"
                 % (d["n_layer"], d["n_embd"], d["n_head"], d["vocab"], d["params"], d["batch"],
                    d["seq_len"], d["tokens_per_step"]))
    elif d["family"] == "llama":
        rs = d.get("rope_scaling") or {}
        shape = ("Llama %d x %d, %d query / %d K/V heads of %d, SwiGLU %d, vocab %d, %s, RoPE theta "
                 "%g%s, %d parameters; batch %d x %d = %d tokens/step; PyTorch rows: the Llama of "
                 "bench_torch_gpu.py (SDPA, enable_gqa) and transformers' LlamaForCausalLM (hf)"
                 % (d["num_hidden_layers"], d["hidden_size"], d["num_attention_heads"],
                    d["num_key_value_heads"], d["head_dim"], d["intermediate_size"], d["vocab"],
                    "tied" if d["tie_word_embeddings"] else "untied", d["rope_theta"],
                    (" %s x%g" % (rs["rope_type"], rs["factor"])) if rs.get("rope_type") == "llama3" else "",
                    d["params"], d["batch"], d["seq_len"], d["tokens_per_step"]))
    else:
        shape = ("T5 d_model %d, d_ff %d, %d heads x %d, %d + %d blocks, %s, vocab %d (ByT5), %d "
                 "parameters; span corruption of %d tokens: batch %d x (%d inputs + %d targets) = %d "
                 "tokens/step (inputs + targets, as fsdp_train counts)"
                 % (d["d_model"], d["d_ff"], d["num_heads"], d["d_kv"], d["num_layers"],
                    d["num_decoder_layers"], d["feed_forward_proj"], d["vocab"], d["params"],
                    d["seq_len"], d["batch"], d["input_len"], d["target_len"], d["tokens_per_step"]))
    print()
    print("#### %s: %s; %.4g GFLOP/token" % (m, shape, d["flops_per_token"] / 1e9))
    print()
    agg = {}
    for who in LABEL:
        runs = [r for r in mine if r["who"] == who]
        if not runs:
            continue
        ok = [r for r in runs if r.get("ok")]
        tps = [r["result"]["tokens_per_sec"] for r in ok]
        mem = [r["result"].get("mem_bytes", r["result"].get("max_memory_allocated")) for r in ok]
        smi = [r.get("smi_mib") for r in ok]
        agg[who] = {"tps": med(tps), "mem": max(mem) if mem else None,
                    "smi": max([s for s in smi if s is not None], default=None), "ok": ok, "runs": runs,
                    "compile_s": med([r["result"].get("compile_s") for r in ok])}
        if not ok and not (who.endswith(":autotune") and all(r.get("skipped") for r in runs)):
            status = 1  # (an autotune row the budget left out is not a failure)
    base = agg.get("fsdp_train", {})
    # The best PyTorch row (any wrap, mode, implementation): the ratio's denominator.
    torch_best = max(((a["tps"], w) for w, a in agg.items() if not w.startswith("fsdp_train") and a["tps"]), default=None)
    if torch_best:
        head = "Best PyTorch row: **%s**, %.0f tok/s" % (LABEL[torch_best[1]], torch_best[0])
        if base.get("tps"):
            head += "; fsdp_train ÷ best PyTorch = **%.2f**" % (base["tps"] / torch_best[0])
        print(head + ".")
    else:
        print("No PyTorch row ran: no ratio.")
    print()
    print("| contender | tok/s (median) | per round | MFU | compile s | program peak MiB | nvidia-smi peak MiB | tok/s ÷ best PyTorch | memory ÷ fsdp_train |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for who, a in agg.items():
        label = LABEL[who]
        if torch_best and who == torch_best[1]:
            label = "**" + label + "** (best PyTorch)"
        per = " / ".join(fmt(r["result"]["tokens_per_sec"]) if r.get("ok") else "**%s**" % r.get("error", "failed")[:80]
                         for r in sorted(a["runs"], key=lambda r: r["round"]))
        mfu = "-" if a["tps"] is None or peak is None else "%.1f%%" % (100 * a["tps"] * d["flops_per_token"] / peak)
        rt = "-" if a["tps"] is None or not torch_best else "%.2f" % (a["tps"] / torch_best[0])
        if who == "fsdp_train" and rt != "-":
            rt = "**" + rt + "**"
        rm = "-" if a["mem"] is None or not base.get("mem") else "%.2f" % (a["mem"] / base["mem"])
        print("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            label, fmt(a["tps"]), per, mfu, fmt(a["compile_s"], "%.1f"),
            fmt(a["mem"] / 1048576 if a["mem"] else None), fmt(a["smi"]), rt, rm))
    off = agg.get("fsdp_train:offload")
    if off and off["ok"]:
        host = max(r["result"].get("host_mem_bytes", 0) for r in off["ok"])
        ratio = off["tps"] / base["tps"] if base.get("tps") and off["tps"] else None
        notes.append("%s: fsdp.cpu_offload keeps %.0f MiB in host memory; its tok/s ÷ fsdp_train = %s "
                     "(issue 22: at least 0.75 at 1.5B)" % (m, host / 1048576, fmt(ratio, "%.2f")))
    if base.get("tps") and torch_best:
        notes.append("%s: fsdp_train ÷ best PyTorch (%s) = **%.2f**" % (m, LABEL[torch_best[1]], base["tps"] / torch_best[0]))
    # Each fsdp_train variant against fsdp_train and against the best PyTorch row: speed, and
    # program peak memory (issue 32: >= 1.2x its speed at <= its memory).
    tb_mem = agg[torch_best[1]]["mem"] if torch_best else None
    for w in [w for w in agg if w.startswith("fsdp_train:") and w != "fsdp_train:offload"]:
        a = agg[w]
        if not a["tps"] or not base.get("tps"):
            continue
        notes.append("%s: %s: %.2f x fsdp_train%s%s" % (
            m, w, a["tps"] / base["tps"],
            ", %.2f x best PyTorch" % (a["tps"] / torch_best[0]) if torch_best else "",
            ", peak %.0f MiB = %.2f x best PyTorch's" % (a["mem"] / 1048576, a["mem"] / tb_mem)
            if a["mem"] and tb_mem else ""))
    own = med([r["result"].get("own_mfu") for r in base.get("ok", [])])
    if own is not None and base.get("tps") and peak:
        notes.append("%s: fsdp_train's own metrics.jsonl mfu %.1f%% (train.peak_flops = the peak above) "
                     "against this table's %.1f%%" % (m, 100 * own, 100 * base["tps"] * d["flops_per_token"] / peak))
    # torch.compile slower than eager: say why, from what the compiled runs reported.
    for cw in [w for w in agg if ":" in w and not w.startswith("fsdp_train") and not w.endswith(":eager")]:
        wrap = cw.split(":")[0]
        e, c = agg.get(wrap + ":eager", {}), agg[cw]
        if not e.get("tps") or not c.get("tps") or c["tps"] >= e["tps"]:
            continue
        res = [r["result"] for r in c["ok"]]
        gb = max(r.get("graph_breaks", 0) for r in res)
        reasons = sorted({x for r in res for x in r.get("graph_break_reasons", [])})[:5]
        why = ("%s: %s is slower than eager (%.0f vs %.0f tok/s). Graph breaks: %d%s; graphs "
               "compiled: %d; warm-up (compilation) %.0f s. "
               % (m, LABEL[cw], c["tps"], e["tps"], gb,
                  (" (" + "; ".join(reasons) + ")") if reasons else "",
                  max(r.get("unique_graphs", 0) for r in res), max(r.get("warmup_s", 0) for r in res)))
        if gb:
            why += "Likely: the breaks split the compiled regions and add guard and launch overhead."
        elif cw == "fsdp2:compile":
            why += ("No graph breaks, so likely: only the blocks are compiled; FSDP2's per-block "
                    "all-gather copy-in/copy-out, reduce-scatter and hooks, the embeddings, head "
                    "and loss stay eager, and at world size 1 their fixed cost is not hidden "
                    "behind communication.")
        else:
            why += ("No graph breaks, so likely: the eager kernels (cuBLAS GEMMs, SDPA's flash "
                    "attention) already dominate and Inductor's generated kernels for this shape "
                    "are not faster; see the run's log.")
        notes.append(why)
        print("bench_gpu.sh: " + why, file=sys.stderr)
print()
if notes:
    print("Notes:")
    print()
    for n in notes:
        print("- " + n)
    print()
print("Commands (per run; tools/bench_gpu.sh runs them):")
print()
print("\`\`\`")
print("mpirun -np 1 --bind-to none fsdp_train MODEL.toml --set train.run_dir=... --set train.peak_flops=...   # bundle env")
print("python3 tools/bench_torch_gpu.py --model MODEL --fsdp-train-toml --warmup $WARMUP --steps $STEPS > MODEL.toml")
print("python3 tools/bench_torch_gpu.py --model MODEL --wrap none|fsdp2 [--impl plain|hf] --mode eager|compile [--compile-scope model|block] [--compile-mode max-autotune-no-cudagraphs] --warmup $WARMUP --warmup-max $WARMUP_MAX --steps $STEPS")
print("\`\`\`")
sys.exit(status)
PY
STATUS=$?
echo "Whole benchmark: $((SECONDS - START)) s (budget $BUDGET s)." >>"$TABLE"
if [[ -n "$DEST" ]]; then
  cp "$TABLE" "$DEST/bench_gpu.md"
  cp "$RESULTS" "$DEST/bench_gpu_results.jsonl"
  cp "$WORK"/*.toml "$WORK/logs/" 2>/dev/null
  tar -C "$WORK" -czf "$DEST/bench_gpu_logs.tar.gz" logs 2>/dev/null
fi
echo
cat "$TABLE"
exit "$STATUS"
