#!/usr/bin/env bash
# tools/gpu_quick.sh: the whole GPU verification in ONE call of at most QUICK_BUDGET_S (540) s,
# for a session lent only 15 minutes of device time (machine start included), where the three
# calls of docs/gpu.md do not fit. Run it on the GPU machine from the repo root with the bundle
# of tools/gpu_bundle.sh carried:
#   run(carry=["gpu_bundle"], command="tools/gpu_quick.sh", timeout_s=590)
#
# In order, each step cut to what is left:
#   1. tools/gpu_check.sh with every gpu test ONCE (GPU_CHECK_REPEAT=1) and the profiler's top-20
#      kernel table of GPT-2 124M; no Hugging Face check, no phase table (GPU_CHECK_SKIP_HF=1,
#      GPU_CHECK_SKIP_PHASES=1); at most QUICK_CHECK_S (300) s
#   2. bench_kernels and tools/bench_kernels_torch.py (norm / bias-GELU kernels against
#      PyTorch's), at most 90 s, into $OUT/bench_kernels.txt
#   3. tools/bench_gpu.sh on GPT-2 124M (QUICK_MODELS, e.g. llama-1b: bench_torch_gpu.py's
#      models), one round, fsdp_train against plain PyTorch eager and torch.compile
#      (QUICK_CONTENDERS), in what is left
# Everything goes to $OUT (gpu_summary.md, gpu_check.log, gpu_logs.tar.gz, bench_kernels.txt,
# bench_gpu.md, bench_gpu_results.jsonl, bench_gpu_logs.tar.gz: 7 files, the run tool returns 8).
# Exit: gpu_check.sh's status (the benchmarks only report).
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
START=$SECONDS
BUDGET="${QUICK_BUDGET_S:-540}"
left() { echo $((BUDGET - (SECONDS - START))); }
DEST="${OUT:-$PWD}"
mkdir -p "$DEST"

GPU_CHECK_REPEAT=1 GPU_CHECK_SKIP_HF=1 GPU_CHECK_SKIP_PHASES=1 \
  GPU_CHECK_BUDGET_S="${QUICK_CHECK_S:-300}" POST_RESERVE_S=100 GPU_TEST_TIMEOUT=150 \
  bash tools/gpu_check.sh
check_rc=$?

t=$(( $(left) < 90 ? $(left) : 90 ))
if (( t > 20 )); then
  echo "[gpu_quick +$((SECONDS - START))s] bench_kernels, bench_kernels_torch.py (${t} s at most)"
  {
    echo "## bench_kernels (fsdp_train's CUDA kernels)"
    ( source gpu_bundle/env.sh >/dev/null 2>&1; timeout -k 5 $((t / 2)) bench_kernels ) 2>&1
    echo; echo "## tools/bench_kernels_torch.py (PyTorch's kernels at the same shapes)"
    timeout -k 5 $((t / 2)) python3 tools/bench_kernels_torch.py 2>&1
  } >"$DEST/bench_kernels.txt"
  tail -40 "$DEST/bench_kernels.txt"
fi

b=$(( $(left) - 10 ))
if (( b > 60 )); then
  echo "[gpu_quick +$((SECONDS - START))s] bench_gpu.sh: ${QUICK_MODELS:-gpt2-124m}, 1 round (${b} s at most)"
  MODELS="${QUICK_MODELS:-gpt2-124m}" ROUNDS=1 CONTENDERS="${QUICK_CONTENDERS:-fsdp_train none:eager none:compile}" \
    BENCH_BUDGET_S="$b" RUN_TIMEOUT="$b" timeout -k 5 "$b" bash tools/bench_gpu.sh
fi
echo "[gpu_quick +$((SECONDS - START))s] done; gpu_check.sh exit $check_rc"
exit "$check_rc"
