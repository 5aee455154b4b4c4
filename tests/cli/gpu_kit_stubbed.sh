#!/usr/bin/env bash
# tests/cli/gpu_kit_stubbed.sh: the GPU kit's reporting (tools/gpu_check.sh and
# tools/gpu_kernel_ab.sh, docs/gpu.md) on a machine without a GPU, MPI run or torch: the
# scripts run against a fake bundle whose programs are stubs, and their summaries, stdout and
# exit codes are checked. A bug in the kit is otherwise found only on the rarely lent GPU
# machine, at the cost of its lease.
#
#   bash tests/cli/gpu_kit_stubbed.sh        (ctest: tools_gpu_kit_stubbed, tests/test_tools.cmake)
#
# FSDP_TEST_PYTHON (default python3) runs the tree's tools/bench_torch_gpu.py --fsdp-train-toml
# and tools/profile_summary.py (standard library only); gpu_check.sh's torch version probe is
# stubbed. Everything lives in one mktemp directory, removed on exit, with a copy of the
# scripts at REPO/tools (so REPO/gpu_bundle is the fake bundle, never the checkout's); the
# kit's own temporary folders (/tmp/gpu_check.*, /tmp/kernel_ab.*: gpu_kernel_ab.sh keeps its
# own) are recorded by the stubs and removed too. GPU_KIT_KEEP=1 keeps the mktemp directory
# (the summaries, each case's stdout) and prints its path.
#
# The fake bundle (tools/gpu_bundle.sh's layout: env.sh, manifest.txt, gpu_tests.txt, bin/):
#   bin/mpirun          drops mpirun's options, runs the program once; Open MPI's closing
#                       banner on a failure
#   bin/fsdp_train      --version; otherwise writes RUN_DIR/metrics.jsonl (tok/s 100000 + 10 *
#                       step, + 5000 with train.cuda_graphs="on", which also prints the closing
#                       `cuda_graphs: ...` line), a Chrome trace with --profile; T5 with graphs
#                       on fails (`fsdp_train: ...` error, exit 1) when FAKE_FAIL_T5_GRAPHS=1
#   bin/test_gpu_train  1 rank, passes: gtest lines, `[offload] ...`, `[rank 0] cuda_graphs gpt2:`
#   bin/test_nccl_comm  2 ranks: rank 0's gtest passes, rank 1 fails two cases
#                       (tests/rank_printer.hpp's `[rank 1] FAILED Suite.Name (N ms)`), exit 1
#   bin/test_cuda_backend  passes its first run, dies of SIGTERM on the second
#   bin/test_cuda_kernels  passes; one failing case with FAKE_KERNELS_FAIL=1
# Every stub ends its lines with \r (mpirun hands the ranks a pty) and colours gtest's
# markers unless GTEST_COLOR=no. On PATH: stub nvidia-smi and hostname, and a python3 that
# runs FSDP_TEST_PYTHON.
#
# Cases (each a run of a script; each check prints what it expected and what it found):
#   check_fail   gpu_check.sh as docs/gpu.md's next-lease command runs it (GPU_CHECK_REPEAT=2,
#                the SKIP flags, budget 330 s): exit 1, **FAILED** naming the 2 failing tests;
#                rank 1's failures named in the gtest column; the SIGTERM run a CRASH; the
#                1-rank tests first; the [offload] / cuda_graphs lines in the summary, free of
#                \r; the last stdout line is the result; logs in gpu_logs.tar.gz; its temp
#                folder removed
#   check_budget budget 15 s (under the 20 s a run needs): every run "NOT RUN: out of budget",
#                none started, **INCOMPLETE** (no failure), exit 1
#   check_pass   GPU_CHECK_TESTS=^test_gpu_train: **PASSED**, exit 0
#   ab_plan      gpu_kernel_ab.sh as the next-lease command runs it (AB_SKIP_TESTS=1,
#                AB_NEW_SETS='train.cuda_graphs="on"', T5 then GPT-2, AB_BUDGET_S=210) with T5's
#                graphed runs failing: the tok/s medians, each new run's cuda_graphs line, the
#                failing run's error line (not Open MPI's banner), the failed profile, the
#                kernel tables (A/B side by side), the traces tarball; stdout ends with the
#                recap (the same as kernel_ab.md's), whose last line is the total; exit 0
#   ab_tests     test_cuda_kernels failing one case and test_gpu_train run (AB_SKIP_TESTS unset)
#   ab_no_time   AB_BUDGET_S=12: every step "not run: out of time", nothing started
# gpu_kernel_ab.sh's header documents no exit code: it ends with the recap's pipeline, 0.
set -u

SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # repository root
PY=$(command -v "${FSDP_TEST_PYTHON:-python3}") ||
  { echo "gpu_kit_stubbed: no python '${FSDP_TEST_PYTHON:-python3}'" >&2; exit 1; }
START=$SECONDS
# The kit's knobs, if the caller's environment has any, would change what is checked.
unset OUT GPU_BUNDLE_DIR GPU_CHECK_BUDGET_S GPU_CHECK_REPEAT GPU_TEST_TIMEOUT POST_RESERVE_S \
  GPU_CHECK_SKIP_TESTS GPU_CHECK_SKIP_POST GPU_CHECK_SKIP_HF GPU_CHECK_SKIP_PHASES \
  GPU_CHECK_HF_ONLY GPU_CHECK_TESTS GPU_CHECK_ALLOW_NOT_RUN ROUNDS WARMUP STEPS AB_MODELS \
  AB_BUDGET_S AB_SKIP_TESTS AB_BASE AB_BASE_ENV AB_NEW_SETS AB_BASE_SETS

T=$(mktemp -d "${TMPDIR:-/tmp}/fsdp_gpu_kit.XXXXXX")
STATE=$T/state                                  # the stubs' records
cleanup() {
  local d
  if [[ -f "$STATE/tmpdirs" ]]; then
    while IFS= read -r d; do
      case "$d" in /tmp/gpu_check.?*|/tmp/kernel_ab.?*) rm -rf -- "$d" ;; esac
    done < <(sort -u "$STATE/tmpdirs")
  fi
  if [[ -n "${GPU_KIT_KEEP:-}" ]]; then echo "kept: $T" >&2; else rm -rf -- "$T"; fi
}
trap cleanup EXIT
mkdir -p "$STATE" "$T/stubbin" "$T/repo/tools" "$T/repo/gpu_bundle/bin"
for f in gpu_check.sh gpu_kernel_ab.sh kit_lib.sh bench_torch_gpu.py bench_torch_gpt2.py \
    profile_summary.py
do
  cp "$SRC_DIR/tools/$f" "$T/repo/tools/" || { echo "cannot copy tools/$f" >&2; exit 1; }
done
B=$T/repo/gpu_bundle

# ---- stubs on PATH --------------------------------------------------------------------------
cat >"$T/stubbin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
case "$*" in
  *--query-gpu=name,driver_version*)
    echo "NVIDIA H100 80GB HBM3 (stub), 580.65.06, 81559 MiB, 9.0" ;;
  *--query-gpu=name*) echo "NVIDIA H100 80GB HBM3 (stub)" ;;
  *) echo "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |" ;;
esac
EOF
printf '#!/bin/sh\necho stubhost\n' >"$T/stubbin/hostname"
# python3: FSDP_TEST_PYTHON, but gpu_check.sh's probe of torch answers without torch; records
# the folder of gpu_kernel_ab.sh's work files (bench_torch_gpu.py's stdout goes there).
cat >"$T/stubbin/python3" <<EOF
#!/usr/bin/env bash
if [[ "\${1:-}" == -c && "\${2:-}" == *torch* ]]; then
  echo "3.11.2 / 2.9.0+stub CUDA 13.0 NCCL 2.27.3 devices 1"; exit 0
fi
if [[ "\${1:-}" == *bench_torch_gpu.py ]]; then
  d=\$(readlink -f /proc/\$\$/fd/1); echo "\${d%/*}" >>"$STATE/tmpdirs"
fi
exec "$PY" "\$@"
EOF

# ---- the fake bundle ------------------------------------------------------------------------
cat >"$B/env.sh" <<'EOF'
# stub of tools/gpu_bundle.sh's env.sh (nothing to unpack)
FSDP_BUNDLE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export FSDP_BUNDLE PATH="$FSDP_BUNDLE/bin:$PATH"
export FSDP_CUDA_LIB_REPORT="libcudart.so.13 -> /stub/libcudart.so.13.0.48 (stub)
" FSDP_CUDA_LIB_MISSING="" FSDP_LIBSTDCXX="system (stub)"
EOF
# No build_dir / source_dir: gpu_check.sh would create those paths.
COMMIT=0123456789abcdef0123456789abcdef01234567
cat >"$B/manifest.txt" <<EOF
# fsdp_train GPU bundle (stub of tests/cli/gpu_kit_stubbed.sh); key=value
created=2026-01-01T00:00Z
commit=$COMMIT
modified_tracked_files=0
build_type=Release
cuda_architectures=compute_90 sm_90
nvcc=13.0
openmpi=4.1.4
build_os=Debian GNU/Linux 12 (bookworm)
need_glibc=2.17
need_glibcxx=3.4.30
gpu_tests=test_nccl_comm_np2 test_gpu_train_np1 test_cuda_backend_np1
EOF
# As tools/gpu_bundle.sh writes it (TAB-separated; the 2-rank test first, as ctest may list it).
ENV_F='OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMP_NUM_THREADS=1'
MPI_F='@BUNDLE@/bin/mpirun -n'
{
  printf '# name\tranks\ttimeout_s\tskip_rc\tenv(;)\tctest_working_dir\tcommand '
  printf '(@BUNDLE@ = this folder, @REPO@ = the repo root); written by tools/gpu_bundle.sh\n'
  for t in test_nccl_comm:2 test_gpu_train:1 test_cuda_backend:1; do
    n=${t%:*} np=${t#*:}
    printf '%s\t%s\t900\t77\t%s\t\t%s\n' "${n}_np$np" "$np" "$ENV_F" \
      "$MPI_F $np --oversubscribe --bind-to none @BUNDLE@/bin/$n"
  done
} >"$B/gpu_tests.txt"

cat >"$B/bin/mpirun" <<'EOF'
#!/usr/bin/env bash
# stub mpirun: drops the options, runs the program once; Open MPI's banner on a failure
while (($#)); do
  case "$1" in -n|-np|-c|--bind-to|--map-by) shift 2 ;; --oversubscribe) shift ;; *) break ;; esac
done
"$@"
rc=$?
if ((rc != 0)); then
  printf -- '-%.0s' {1..74}; echo
  echo "Primary job  terminated normally, but 1 process returned"
  echo "a non-zero exit code. Per user-direction, the job has been aborted."
  printf -- '-%.0s' {1..74}; echo
fi >&2
exit "$rc"
EOF
# The lines gpu_check.sh copies into its summary (tests/test_gpu_train.cpp's).
GRAPHS_T='[rank 0] cuda_graphs gpt2: 10 segments, 50 replayed, 10 captured, 0 eager; 900 of 1000'
GRAPHS_T+=' calls in graphs'
OFFLOAD_T='[offload] cpu_offload full_shard/bf16: loss rel diff per step: 0 0 1.2e-07; params'
OFFLOAD_T+=' 2e-07; largest: h.0.attn.w 3e-07'
# gtest's lines: rank 0's own printer (coloured unless GTEST_COLOR=no), \r from the pty.
# shellcheck disable=SC2016  # expanded by the stubs
GT_HEAD='#!/usr/bin/env bash
echo "${PWD%/*}" >>"$FAKE_STATE/tmpdirs"; echo "$(basename "$0")" >>"$FAKE_STATE/calls"
g() { if [[ "${GTEST_COLOR:-}" == no ]]; then printf "%s %s\r\n" "$1" "$2"
      else printf "\033[0;32m%s \033[m%s\r\n" "$1" "$2"; fi; }'
cat >"$B/bin/test_gpu_train" <<EOF
$GT_HEAD
g "[==========]" "Running 2 tests from 1 test suite."
g "[ RUN      ]" "GpuTrain.CudaGraphsEqualEagerBitForBit"
printf '%s\r\n' '$GRAPHS_T'
g "[       OK ]" "GpuTrain.CudaGraphsEqualEagerBitForBit (812 ms)"
g "[ RUN      ]" "GpuTrain.CpuOffloadMatchesTheDeviceOptimizer"
printf '%s\r\n' '$OFFLOAD_T'
g "[       OK ]" "GpuTrain.CpuOffloadMatchesTheDeviceOptimizer (640 ms)"
g "[==========]" "2 tests from 1 test suite ran. (1452 ms total)"
g "[  PASSED  ]" "2 tests."
EOF
cat >"$B/bin/test_nccl_comm" <<EOF
$GT_HEAD
g "[==========]" "Running 2 tests from 2 test suites."
g "[ RUN      ]" "NcclComm.AllGatherMatchesMpi"
printf '[rank 1] tests/test_nccl_comm.cpp:88: Failure\r\n'
printf '[rank 1] Expected equality of these values: got[5] 1.5 vs want[5] 2\r\n'
printf '[rank 1] FAILED NcclComm.AllGatherMatchesMpi (12 ms)\r\n'
g "[       OK ]" "NcclComm.AllGatherMatchesMpi (12 ms)"
g "[ RUN      ]" "Sizes/NcclBroadcast.Matches/2"
printf '[rank 1] FAILED Sizes/NcclBroadcast.Matches/2 (param 4096) (3 ms)\r\n'
g "[       OK ]" "Sizes/NcclBroadcast.Matches/2 (3 ms)"
g "[  PASSED  ]" "2 tests."
exit 1
EOF
cat >"$B/bin/test_cuda_backend" <<EOF
$GT_HEAD
g "[ RUN      ]" "CudaBackend.Mha"
if ((\$(grep -c '^test_cuda_backend\$' "\$FAKE_STATE/calls") > 1)); then kill -TERM \$\$; fi
g "[       OK ]" "CudaBackend.Mha (5 ms)"
g "[  PASSED  ]" "1 test."
EOF
cat >"$B/bin/test_cuda_kernels" <<EOF
$GT_HEAD
if [[ -n "\${FAKE_KERNELS_FAIL:-}" ]]; then
  g "[ RUN      ]" "CudaKernels.Softmax"
  printf 'tests/test_cuda_kernels.cpp:120: Failure\r\n'
  g "[  FAILED  ]" "CudaKernels.Softmax (3 ms)"
  g "[  PASSED  ]" "39 tests."
  g "[  FAILED  ]" "1 test, listed below:"
  g "[  FAILED  ]" "CudaKernels.Softmax"
  exit 1
fi
g "[  PASSED  ]" "40 tests."
EOF
cat >"$B/bin/fsdp_train" <<'EOF'
#!/usr/bin/env bash
# stub fsdp_train: CONFIG [--set K=V]... [--profile A:B]
[[ "${1:-}" == --version ]] && { echo "fsdp_train 0.0.0-stub (commit 0123456789ab)"; exit 0; }
cfg=$1; shift; run="" graphs=0 prof=0
while (($#)); do
  case "$1" in
    --set) case "$2" in
             train.run_dir=*) run=${2#train.run_dir=} run=${run//\"/} ;;
             train.cuda_graphs=*on*) graphs=1 ;;
           esac; shift 2 ;;
    --profile) prof=1; shift 2 ;;
    *) shift ;;
  esac
done
echo "${run%/*}" >>"$FAKE_STATE/tmpdirs"; echo "fsdp_train $run" >>"$FAKE_STATE/calls"
model=$(sed -n 's/^type = "\(.*\)"$/\1/p' "$cfg" | head -1)
steps=$(sed -n 's/^max_steps = //p' "$cfg" | head -1)
if [[ $model == t5 && $graphs == 1 && -n "${FAKE_FAIL_T5_GRAPHS:-}" ]]; then
  printf 'fsdp_train: CUDA error: out of memory (cudaMalloc of 512 MiB, graph pool)\r\n' >&2
  exit 1
fi
mkdir -p "$run"
for ((s = 1; s <= ${steps:-11}; s++)); do
  printf '{"step": %d, "loss": 3.5, "tokens_per_sec": %d, "peak_mem_bytes": %d}\n' \
    "$s" $((100000 + 10 * s + 5000 * graphs)) $((123456789 + graphs)) >>"$run/metrics.jsonl"
  printf 'step %d | loss 3.5000\r\n' "$s"
done
if ((graphs)); then
  printf 'cuda_graphs: 12 segments: 40 replayed, 12 captured, 3 eager; 900 of 950 kernel calls'
  printf ' in graphs (12 graphs kept)\r\n'
fi
if ((prof)); then
  mkdir -p "$run/profile"
  k=$((600 - 100 * graphs))
  cat >"$run/profile/rank_0.trace.json" <<JSON
{"traceEvents": [
 {"name": "step 3", "cat": "step", "ph": "X", "ts": 0, "dur": 1000, "pid": 0, "tid": 0},
 {"name": "step 4", "cat": "step", "ph": "X", "ts": 1000, "dur": 1000, "pid": 0, "tid": 0},
 {"name": "stub_gemm_bf16_kernel", "cat": "kernel", "ph": "X", "ts": 10, "dur": $k, "pid": 1},
 {"name": "stub_gemm_bf16_kernel", "cat": "kernel", "ph": "X", "ts": 1010, "dur": $k, "pid": 1},
 {"name": "stub_flash_fwd_kernel", "cat": "kernel", "ph": "X", "ts": 700, "dur": 200, "pid": 1}
]}
JSON
fi
EOF
chmod +x "$T"/stubbin/* "$B"/bin/*
export FAKE_STATE=$STATE

# ---- checks -----------------------------------------------------------------------------------
FAILURES=0 CASE=""
fail() { echo "FAIL [$CASE]: $*" >&2; FAILURES=$((FAILURES + 1)); }
vis() { sed -e 's/\r/^M/g' -e 's/\x1b/^[/g' -e 's/^/    /'; }  # \r, ESC shown; indented
# expect KIND FILE PATTERN [SHOW]: KIND line (a line holds the fixed string PATTERN), exact (a
# line is PATTERN), re (a line matches the extended regex PATTERN) or no (no line holds
# PATTERN). On failure: the expectation, then what FILE holds instead: its lines matching the
# extended regex SHOW, else its last 15 lines.
expect() {
  local kind=$1 file=$2 pat=$3 show=${4:-} found
  if [[ ! -f "$file" ]]; then fail "${file#"$T"/} missing (expected $kind: $pat)"; return; fi
  case "$kind" in
    line) grep -qF -- "$pat" "$file" && return ;;
    exact) grep -qxF -- "$pat" "$file" && return ;;
    re) grep -qE -- "$pat" "$file" && return ;;
    no) grep -qF -- "$pat" "$file" || return
        show=${show:-$(printf '%s' "$pat" | sed 's/[][\.*^$]/\\&/g')} ;;
  esac
  if [[ -n "$show" ]]; then
    found=$(grep -E -- "$show" "$file" | head -20 | vis)
    found=${found:-"    (no line matches /$show/)"}
  else
    found=$(tail -15 "$file" | vis)
  fi
  fail "${file#"$T"/}: expected $( [[ $kind == no ]] && echo "no line holding" ||
    echo "a line ($kind)"): $pat"$'\n'"  found:"$'\n'"$found"
}
# expect_eq WHAT GOT WANT
expect_eq() { [[ "$2" == "$3" ]] || fail "$1: expected '$3', found '$2'"; }
# expect_count FILE REGEX N [WHAT [SHOW]]: N lines of FILE match REGEX (WHAT names them);
# on failure the lines matching SHOW (default REGEX) are shown.
expect_count() {
  local n found; n=$(grep -cE -- "$2" "$1" 2>/dev/null)
  [[ "$n" == "$3" ]] && return
  found=$(grep -E -- "${5:-$2}" "$1" | head -20 | vis)
  fail "${1#"$T"/}: expected $3 ${4:-lines matching /$2/}, found $n:"$'\n'"${found:-    (none)}"
}
section() {  # section FILE HEADING: the lines from HEADING (a fixed line) to the end
  awk -v h="$2" '$0 == h { on = 1 } on' "$1"
}

# run_kit CASE SCRIPT VAR=VALUE...: tools/SCRIPT from the fake repo with OUT=$T/CASE; its stdout
# and stderr in $T/CASE/stdout (through a pipe: cat ends after gpu_check.sh's tee), RC.
run_kit() {
  CASE=$1; local script=$2; shift 2
  mkdir -p "$T/$CASE"; : >"$STATE/calls"
  (cd "$T/repo" && env "$@" OUT="$T/$CASE" PATH="$T/stubbin:$PATH" \
     timeout 60 bash "tools/$script" </dev/null 2>&1) | cat >"$T/$CASE/stdout"
  RC=${PIPESTATUS[0]}
  echo "$CASE: tools/$script $* -> exit $RC"
}
PLAN_CHECK=(GPU_CHECK_REPEAT=2 GPU_CHECK_SKIP_HF=1 GPU_CHECK_SKIP_PHASES=1 GPU_CHECK_SKIP_POST=1)

# ---- gpu_check.sh: failures, as the next lease runs it ---------------------------------------
run_kit check_fail gpu_check.sh "${PLAN_CHECK[@]}" GPU_CHECK_BUDGET_S=330
S=$T/$CASE/gpu_summary.md
expect_eq "exit code of gpu_check.sh (a test failed)" "$RC" 1
R='**FAILED**: 1 of 3 gpu tests passed all 2 runs (3 of 6 runs); failed or not run:'
expect exact "$S" "$R test_cuda_backend_np1 test_nccl_comm_np2" '\*\*(FAILED|PASSED|INCOMPLETE)'
expect_eq "last line of stdout (the result line)" "$(tail -1 "$T/$CASE/stdout")" \
  "$R test_cuda_backend_np1 test_nccl_comm_np2"
# rank 1's failures (rank 0's gtest passed them), plain and parameterised
for k in 1 2; do
  expect re "$S" "^\| test_nccl_comm_np2 \| 2 \| $k/2 \| \*\*FAIL\*\* \(exit 1\) \| [0-9]+ \| \
2 ok, failed: NcclComm\.AllGatherMatchesMpi Sizes/NcclBroadcast\.Matches/2 +\|$" '^\| test_nccl'
  expect re "$S" "^\| test_gpu_train_np1 \| 1 \| $k/2 \| PASS \| [0-9]+ \| 2 ok \|$" \
    '^\| test_gpu_train'
done
expect re "$S" '^\| test_cuda_backend_np1 \| 1 \| 1/2 \| PASS \| [0-9]+ \| 1 ok \|$' '^\| test_cuda'
expect re "$S" '^\| test_cuda_backend_np1 \| 1 \| 2/2 \| \*\*CRASH\*\* \(signal 15\) \|' \
  '^\| test_cuda'
expect_eq "first test run (1-rank tests first)" \
  "$(grep -m1 -E '^\| test_' "$S" | cut -d'|' -f2-4)" " test_gpu_train_np1 | 1 | 1/2 "
expect exact "$S" "### The tests' [offload] and cuda_graphs lines (first 40 of 4)" '^###'
for k in 1 2; do
  expect exact "$S" "test_gpu_train_np1 run $k: $OFFLOAD_T" 'offload'
  expect exact "$S" "test_gpu_train_np1 run $k: $GRAPHS_T" 'cuda_graphs'
done
expect exact "$S" "- test_gpu_train_np1: GpuTrain.CudaGraphsEqualEagerBitForBit 812 ms, \
GpuTrain.CpuOffloadMatchesTheDeviceOptimizer 640 ms" '^- test_gpu'
expect_count "$S" $'\r|\033' 0 "lines with \\r or ESC (plain())"
for s in HF POST PHASES; do expect exact "$S" "(skipped: GPU_CHECK_SKIP_$s=1)" '^\(skipped'; done
expect line "$S" "bundle gpu_bundle: commit $COMMIT (0 modified tracked files)" '^Host'
expect line "$S" "- GPU (nvidia-smi): NVIDIA H100 80GB HBM3 (stub), 580.65.06" '^- '
expect no "$S" "**smoke failed**"
expect line "$T/$CASE/gpu_check.log" "----- last lines of test_nccl_comm_np2 (run 2) -----" '^-----'
tar -tzf "$T/$CASE/gpu_logs.tar.gz" >"$T/$CASE/tar.txt" 2>&1
expect exact "$T/$CASE/tar.txt" "logs/test_nccl_comm_np2.run2.log"
left=$(grep -E '^/tmp/gpu_check\.' "$STATE/tmpdirs" | sort -u | while IFS= read -r d; do
  [[ -e "$d" ]] && echo "$d"; done)
expect_eq "gpu_check.sh's temporary folder after the run" "$left" ""

# ---- gpu_check.sh: a budget no run fits in ----------------------------------------------------
run_kit check_budget gpu_check.sh "${PLAN_CHECK[@]}" GPU_CHECK_BUDGET_S=15
S=$T/$CASE/gpu_summary.md
expect_eq "exit code of gpu_check.sh (runs not run)" "$RC" 1
NOT_RUN='^\| test_[a-z_]+_np[12] \| [12] \| [12]/2 \| NOT RUN: out of budget \([0-9]+ s left, '
expect_count "$S" "$NOT_RUN"'needs 20 s\) \| 0 \| \|$' 6 "" '^\| test_'
expect exact "$S" "**INCOMPLETE** (no failure): 0 of 3 gpu tests passed all 2 runs (0 of 6 runs); \
not run or cut by budget: test_gpu_train_np1 test_cuda_backend_np1 test_nccl_comm_np2" '\*\*[A-Z]'
expect_eq "test binaries started under a 15 s budget" "$(grep -c . "$STATE/calls")" 0

# ---- gpu_check.sh: all passed -----------------------------------------------------------------
run_kit check_pass gpu_check.sh "${PLAN_CHECK[@]}" GPU_CHECK_BUDGET_S=330 \
  GPU_CHECK_TESTS=^test_gpu_train
S=$T/$CASE/gpu_summary.md
expect_eq "exit code of gpu_check.sh (all passed)" "$RC" 0
expect exact "$S" '**PASSED**: 1 of 1 gpu tests passed all 2 runs (2 of 2 runs)' '\*\*[A-Z]'

# ---- gpu_kernel_ab.sh: as the next lease runs it, T5's graphed runs failing -------------------
run_kit ab_plan gpu_kernel_ab.sh AB_SKIP_TESTS=1 "AB_NEW_SETS=train.cuda_graphs=\"on\"" \
  "AB_MODELS=t5-small-byt5 gpt2-124m" AB_BUDGET_S=210 FAKE_FAIL_T5_GRAPHS=1
K=$T/$CASE/kernel_ab.md O=$T/$CASE/stdout
expect_eq "exit code of gpu_kernel_ab.sh" "$RC" 0
expect line "$K" "bundle: ${COMMIT:0:12}" '^bundle'
expect_count "$K" '^\(skipped: AB_SKIP_TESTS=1\)$' 2
expect exact "$K" 'new: --set train.cuda_graphs="on"' '^(new|base):'
GRAPHS='cuda_graphs: 12 segments: 40 replayed, 12 captured, 3 eager; 900 of 950 kernel calls in'
GRAPHS+=' graphs (12 graphs kept)'
ERRL='fsdp_train: CUDA error: out of memory (cudaMalloc of 512 MiB, graph pool)'
for r in 1 2; do
  expect exact "$K" "| $r | new | 105075 | 123456790 (last loss 3.5) |" '^\| [12] \|'
  expect exact "$K" "| $r | base | 100075 | 123456789 (last loss 3.5) |" '^\| [12] \|'
  expect re "$K" "^\| $r \| new \| run failed \(exit 1\): .*metrics\.jsonl" '^\| [12] \| new'
  expect exact "$K" "- round $r, new: $GRAPHS" '^- round'
  expect exact "$K" "- round $r, new: $ERRL" '^- round'
done
expect_count "$K" '^- round [12], base: ' 0
expect no "$K" "Primary job"
expect exact "$K" "**profile run failed**: exit 1, no rank_0.trace.json" 'profile'
expect re "$K" '^\| stub_gemm_bf16_kernel \| 2 \| 1\.000 \| 500\.0 \|' 'stub_'  # new's table
expect exact "$K" "## profile, gpt2-124m, new (A) against base (B)" '^## '
expect re "$K" 'B/A' '^\|'
tar -tzf "$T/$CASE/ab_traces.tar.gz" 2>&1 | sort >"$T/$CASE/tar.txt"
expect_eq "ab_traces.tar.gz" "$(tr '\n' ' ' <"$T/$CASE/tar.txt")" "traces/ traces/trace_gpt2-124m_\
base.json traces/trace_gpt2-124m_new.json traces/trace_t5-small-byt5_base.json "
RECAP='## recap (tok/s rows, cuda_graphs and error lines; the tables are above)'
expect_eq "last '## ' heading of stdout" "$(grep '^## ' "$O" | tail -1)" "$RECAP"
section "$O" "$RECAP" >"$T/$CASE/recap.txt"
for l in "### t5-small-byt5 (round, contender, tok/s, peak_mem_bytes)" "- round 1, new: $ERRL" \
         "| 2 | base | 100075 | 123456789 (last loss 3.5) |" "- round 2, new: $GRAPHS" \
         "### gpt2-124m (round, contender, tok/s, peak_mem_bytes)"; do
  expect exact "$T/$CASE/recap.txt" "$l" '^[#|-]'
done
expect re "$T/$CASE/recap.txt" '^\| 1 \| new \| run failed \(exit 1\)' '^\|'
expect_eq "last line of stdout" "$(tail -1 "$O" | sed -E 's/total [0-9]+ s/total N s/')" \
  "total N s (budget 210 s)"
expect_eq "kernel_ab.md's recap (as stdout's)" "$(section "$K" "$RECAP")" \
  "$(cat "$T/$CASE/recap.txt")"

# ---- gpu_kernel_ab.sh: the test binaries, one kernel test failing ----------------------------
run_kit ab_tests gpu_kernel_ab.sh AB_MODELS=gpt2-124m ROUNDS=1 FAKE_KERNELS_FAIL=1
K=$T/$CASE/kernel_ab.md
expect_eq "exit code of gpu_kernel_ab.sh" "$RC" 0
expect exact "$K" "test_cuda_kernels: exit 1" '^test_'
expect line "$K" "[  FAILED  ] CudaKernels.Softmax (3 ms)" 'FAILED'
expect exact "$K" "test_gpu_train: exit 0" '^test_'
expect exact "$K" "| 1 | new | 100075 | 123456789 (last loss 3.5) |" '^\|'
expect no "$K" "(A) against base"
section "$T/$CASE/stdout" "$RECAP" >"$T/$CASE/recap.txt"
expect exact "$T/$CASE/recap.txt" "test_cuda_kernels: exit 1" '^test_'
expect exact "$T/$CASE/recap.txt" "test_gpu_train: exit 0" '^test_'

# ---- gpu_kernel_ab.sh: out of time ------------------------------------------------------------
run_kit ab_no_time gpu_kernel_ab.sh AB_MODELS=gpt2-124m AB_BUDGET_S=12
K=$T/$CASE/kernel_ab.md
expect_eq "exit code of gpu_kernel_ab.sh" "$RC" 0
expect exact "$K" "test_cuda_kernels: not run: out of time" '^test_'
expect_count "$K" '^\| [12] \| new \| not run: out of time \| \|$' 4  # table, recap
expect exact "$K" "not run: out of time" 'not run'
expect re "$K" '^test_gpu_train: not run: out of time \([0-9]+ s left\)$' '^test_'
expect_eq "programs started with 12 s" "$(grep -c . "$STATE/calls")" 0
expect_eq "last line of stdout" \
  "$(tail -1 "$T/$CASE/stdout" | sed -E 's/total [0-9]+ s/total N s/')" "total N s (budget 12 s)"

CASE=gpu_kit_stubbed
if ((FAILURES)); then
  echo "gpu_kit_stubbed: $FAILURES check(s) failed ($((SECONDS - START)) s; GPU_KIT_KEEP=1 keeps"\
    "the files)" >&2
  exit 1
fi
echo "gpu_kit_stubbed: ok ($((SECONDS - START)) s)"
