#!/usr/bin/env bash
# tools/gpu_check.sh: the one-command GPU verification (docs/gpu.md). Run it on the GPU machine
# from the repo root, with the bundle of tools/gpu_bundle.sh carried (gpu_bundle/):
#
#   1. versions: nvidia-smi (GPU, driver), the CUDA libraries env.sh chose for the bundle
#      (toolkit lib64 or PyTorch's nvidia-* packages), nvcc, torch, OS/glibc; nvidia-smi's table
#   2. smoke: fsdp_train --version and `mpirun -np 2 hostname` from the bundle
#   3. every `gpu` test of the bundle (gpu_tests.txt: ctest's command at its rank count, under
#      the bundled mpirun, with ctest's ENVIRONMENT; the 1-rank ones first), each under
#      `timeout`: a crash, a hang or exit 77 (no device seen) is recorded as a failure and the
#      next test runs
#   4. tools/hf_check.py: GPT-2 and T5 merged by fsdp_merge load in transformers and give
#      fsdp_train's validation loss (<= 1e-5)
#   5. tools/bench_phases.sh on the GPU: a 4-rank FULL_SHARD run's phase times and exposed
#      communication (comm_wait) with prefetch on and off (4 ranks share the GPU, so the mesh
#      is MPI staged through host memory), 2 rounds of 30 steps, at most 150 s
#   6. tools/bench_gpu.sh (fsdp_train vs PyTorch FSDP2 eager / torch.compile), in the time left
#
# Writes ONE summary, $OUT/gpu_summary.md when $OUT is set (the run tool's folder), else
# ./gpu_summary.md, rewritten after every step so that a run cut off at its time limit still
# leaves what was done; plus gpu_check.log (everything printed) and gpu_logs.tar.gz (each
# test's and benchmark run's log) beside it.
# Exit: 0 all tests passed and the benchmark ran; 1 a test failed, timed out, was not run, or
# the bundle is unusable; 3 tests passed but the benchmark failed.
#
# Environment (optional): GPU_BUNDLE_DIR (default ./gpu_bundle); GPU_CHECK_BUDGET_S (570: whole
# script, the run tool allows 600 s a call); GPU_TEST_TIMEOUT (240: cap per test, ctest's own
# TIMEOUT if lower); BENCH_RESERVE_S (330: time kept for the benchmark); GPU_CHECK_SKIP_BENCH=1;
# GPU_CHECK_SKIP_TESTS=1; GPU_CHECK_TESTS (regex: only the matching tests);
# GPU_CHECK_ALLOW_NOT_RUN=1 (exit 77 is not
# a failure: for trying the script on a machine without a GPU); FSDP_CUDA_LIB_DIRS (see env.sh).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
START=$SECONDS
BUDGET="${GPU_CHECK_BUDGET_S:-570}"
TEST_CAP="${GPU_TEST_TIMEOUT:-240}"
BENCH_RESERVE="${BENCH_RESERVE_S:-330}"
BUNDLE="${GPU_BUNDLE_DIR:-$REPO/gpu_bundle}"
case "$BUNDLE" in /*) ;; *) BUNDLE="$PWD/$BUNDLE" ;; esac
if [[ -n "${OUT:-}" ]]; then DEST="$OUT"; else DEST="$PWD"; fi
mkdir -p "$DEST"
SUMMARY="$DEST/gpu_summary.md"
LOG="$DEST/gpu_check.log"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
mkdir -p "$WORK/logs"
exec > >(tee "$LOG") 2>&1

say() { echo "[gpu_check $(date -u +%H:%M:%S) +$((SECONDS - START))s] $*"; }
left() { echo $((BUDGET - (SECONDS - START))); }
# Run a command in the bundle's environment (a subshell: python3 and nvidia-smi keep the system's).
inb() { ( source "$BUNDLE/env.sh" 2>/dev/null; "$@" ); }
# Kill what a timed-out test leaves behind: Open MPI puts each rank in its own process group, so
# `timeout` does not reach them. Every process of a test carries FSDP_GPU_CHECK_TAG=<tag> in its
# environment (mpirun passes it on); those are killed, by pid.
reap() {
  local f p n=0
  while IFS= read -r f; do
    p="${f#/proc/}" p="${p%%/*}"
    [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
    kill -9 "$p" 2>/dev/null && n=$((n + 1))
  done < <(grep -lzx -- "FSDP_GPU_CHECK_TAG=$1" /proc/[0-9]*/environ 2>/dev/null)
  (( n == 0 )) || say "  killed $n leftover process(es) of $1"
}

# ---- summary: sections kept in files, the whole file rewritten after each step --------------
S_HEAD="$WORK/s_head" S_VER="$WORK/s_ver" S_TESTS="$WORK/s_tests" S_HF="$WORK/s_hf" S_BENCH="$WORK/s_bench" S_END="$WORK/s_end"
: >"$S_VER"; : >"$S_TESTS"; : >"$S_HF"; : >"$S_BENCH"; : >"$S_END"
write_summary() {
  {
    cat "$S_HEAD"
    echo; echo "## Versions"; echo; cat "$S_VER"
    echo; echo "## gpu tests"; echo
    if [[ -s "$S_TESTS" ]]; then
      echo "| test | ranks | result | time s | gtest |"; echo "|---|---:|---|---:|---|"; cat "$S_TESTS"
    else
      echo "(not run yet)"
    fi
    echo; echo "## Hugging Face transformers loads our merges (tools/hf_check.py)"; echo
    if [[ -s "$S_HF" ]]; then cat "$S_HF"; else echo "(not run yet)"; fi
    echo; echo "## Phase times, 4-rank FULL_SHARD, prefetch on / off (tools/bench_phases.sh)"; echo
    if [[ -s "$WORK/s_phases" ]]; then cat "$WORK/s_phases"; else echo "(not run yet)"; fi
    echo; echo "## Benchmark (tools/bench_gpu.sh)"; echo
    if [[ -s "$S_BENCH" ]]; then cat "$S_BENCH"; else echo "(not run yet)"; fi
    echo; cat "$S_END"
  } >"$SUMMARY.tmp" && mv "$SUMMARY.tmp" "$SUMMARY"
}
pack_logs() { tar -C "$WORK" -czf "$DEST/gpu_logs.tar.gz" logs 2>/dev/null || true; }
finish() {  # $1 = exit code
  {
    echo "## Result"; echo
    echo "$RESULT_LINE"
    echo
    echo "Total $((SECONDS - START)) s. Logs: gpu_check.log, gpu_logs.tar.gz (beside this file)."
  } >"$S_END"
  write_summary
  pack_logs
  say "summary: $SUMMARY"
  echo "$RESULT_LINE"
  rm -rf "$WORK"
  exit "$1"
}

MANIFEST="$BUNDLE/manifest.txt"
mf() { sed -n "s/^$1=//p" "$MANIFEST" 2>/dev/null | head -1; }
{
  echo "# GPU check ($(date -u +%Y-%m-%dT%H:%MZ))"
  echo
  echo "Host $(hostname), repo $REPO, bundle ${BUNDLE#$REPO/}: commit $(mf commit)" \
       "($(mf modified_tracked_files) modified tracked files), built $(mf created) on $(mf build_os)" \
       "(nvcc $(mf nvcc), archs $(mf cuda_architectures), Open MPI $(mf openmpi))."
  echo "Command: \`tools/gpu_check.sh\` (budget ${BUDGET} s; per test at most ${TEST_CAP} s)."
} >"$S_HEAD"
write_summary

if [[ ! -f "$BUNDLE/env.sh" || ! -f "$MANIFEST" ]]; then
  RESULT_LINE="**FAILED**: no bundle at $BUNDLE (run tools/gpu_bundle.sh here, carry gpu_bundle)"
  finish 1
fi

# ---- 1. versions ------------------------------------------------------------------------------
say "versions"
SMI_OK=0
{
  if command -v nvidia-smi >/dev/null; then
    q="$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1)" && SMI_OK=1
    echo "- GPU (nvidia-smi): $q"
    echo "- CUDA version the driver supports: $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)"
  else
    echo "- nvidia-smi: **not found**"
  fi
  if command -v nvcc >/dev/null; then
    echo "- nvcc (GPU machine): $(nvcc --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p')"
  elif [[ -x /usr/local/cuda/bin/nvcc ]]; then
    echo "- nvcc (GPU machine): $(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p')"
  fi
  echo "- python3 / torch: $(python3 -c 'import sys, torch; print(sys.version.split()[0], "/", torch.__version__, "CUDA", torch.version.cuda, "NCCL", ".".join(map(str, torch.cuda.nccl.version())), "devices", torch.cuda.device_count())' 2>&1 | tail -1)"
  echo "- OS: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}') (bundle needs GLIBC_$(mf need_glibc)), kernel $(uname -r)"
  echo "- CUDA libraries used by the bundle (env.sh):"
  inb bash -c 'printf "%s" "$FSDP_CUDA_LIB_REPORT" | sed "s/^/    - /"; [[ -z "$FSDP_CUDA_LIB_MISSING" ]] || echo "    - **MISSING: $FSDP_CUDA_LIB_MISSING**"; echo "- libstdc++: $FSDP_LIBSTDCXX"'
} >>"$S_VER"
cat "$S_VER"
write_summary
if command -v nvidia-smi >/dev/null; then nvidia-smi 2>&1 | tee "$WORK/logs/nvidia-smi.txt"; fi
MISSING="$(inb bash -c 'echo "$FSDP_CUDA_LIB_MISSING"')"

# ---- 2. smoke -----------------------------------------------------------------------------------
say "smoke: fsdp_train --version, mpirun -np 2 hostname, ldd"
SMOKE_OK=1
v="$(inb timeout 60 fsdp_train --version 2>&1)" || SMOKE_OK=0
echo "- \`fsdp_train --version\`: $(tail -1 <<<"$v")" >>"$S_VER"
h="$(inb timeout 60 mpirun -np 2 --oversubscribe hostname 2>&1)" || SMOKE_OK=0
echo "- \`mpirun -np 2 --oversubscribe hostname\` (bundled Open MPI): $(tr '\n' ' ' <<<"$h" | cut -c1-200)" >>"$S_VER"
nf="$(inb bash -c 'for f in "$FSDP_BUNDLE"/bin/*; do ldd "$f" 2>/dev/null | grep "not found" | sed "s|^|$(basename "$f"): |"; done' | sort -u)"
if [[ -n "$nf" ]]; then
  SMOKE_OK=0
  echo "- **libraries not found**: $(tr '\n' ';' <<<"$nf")" >>"$S_VER"
fi
NEED_GLIBC="$(mf need_glibc)" HAVE_GLIBC="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')"
if [[ -n "$NEED_GLIBC" && -n "$HAVE_GLIBC" && "$(printf '%s\n%s\n' "$NEED_GLIBC" "$HAVE_GLIBC" | sort -V | head -1)" != "$NEED_GLIBC" ]]; then
  SMOKE_OK=0
  echo "- **glibc $HAVE_GLIBC is older than the GLIBC_$NEED_GLIBC the bundle needs** (docs/gpu.md, Troubleshooting)" >>"$S_VER"
fi
[[ "$SMOKE_OK" == 1 ]] || echo "- **smoke failed**: see gpu_check.log (output above the tests)" >>"$S_VER"
printf '%s\n%s\n%s\n' "$v" "$h" "$nf"
write_summary

# ---- 3. the build and source paths compiled into the test binaries ------------------------------
# The tests use FSDP_BINARY_DIR (their build directory: fsdp_train, test_runs/) and
# FSDP_TEST_DATA_DIR (<source>/tests/data) as absolute paths of the machine that built them.
BUILD_ORIG="$(mf build_dir)" SOURCE_ORIG="$(mf source_dir)"
if [[ -n "$SOURCE_ORIG" && ! -e "$SOURCE_ORIG" ]]; then
  mkdir -p "$(dirname "$SOURCE_ORIG")" && ln -s "$REPO" "$SOURCE_ORIG" &&
    say "linked the build machine's source path $SOURCE_ORIG -> $REPO"
fi
if [[ -n "$BUILD_ORIG" && ! -e "$BUILD_ORIG" ]]; then
  if mkdir -p "$BUILD_ORIG" 2>/dev/null; then
    while IFS=$'\t' read -r name rel; do
      [[ -n "$name" ]] || continue
      mkdir -p "$(dirname "$BUILD_ORIG/$rel")" && ln -sf "$BUNDLE/bin/$name" "$BUILD_ORIG/$rel"
    done <"$BUNDLE/bin_map.txt"
    say "recreated the build directory $BUILD_ORIG (links to the bundle's binaries)"
  else
    say "WARNING: cannot create $BUILD_ORIG: tests that use FSDP_BINARY_DIR will fail"
  fi
fi

# ---- 4. gpu tests -------------------------------------------------------------------------------
NT=0 NPASS=0 NFAIL=0
FAILED_NAMES=()
# Fields are TAB-separated and may be empty: read them split on \037 (IFS whitespace would merge
# consecutive TABs).
while IFS=$'\037' read -r name np tmo skip env wd cmd; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  [[ "${GPU_CHECK_SKIP_TESTS:-0}" == 1 ]] && continue
  if [[ -n "${GPU_CHECK_TESTS:-}" && ! "$name" =~ ${GPU_CHECK_TESTS} ]]; then continue; fi
  NT=$((NT + 1))
  reserve=$BENCH_RESERVE; [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]] && reserve=0
  avail=$(( $(left) - reserve ))
  t="$TEST_CAP"; (( tmo > 0 && tmo < t )) && t=$tmo
  if (( avail < 20 )); then
    echo "| $name | $np | **NOT RUN: out of time** (budget ${BUDGET} s) | 0 | |" >>"$S_TESTS"
    NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("$name"); write_summary; continue
  fi
  (( t > avail )) && t=$avail
  eval "args=($cmd)"
  args=("${args[@]//@BUNDLE@/$BUNDLE}")
  args=("${args[@]//@REPO@/$REPO}")
  envs=()
  if [[ -n "$env" ]]; then IFS=';' read -r -a envs <<<"$env"; fi
  run_dir="$wd"
  [[ -n "$run_dir" && -d "$run_dir" ]] || { run_dir="$WORK/run_$name"; mkdir -p "$run_dir"; }
  say "test $name ($np ranks, timeout ${t} s): ${args[*]}"
  t0=$SECONDS
  ( cd "$run_dir" && inb env "${envs[@]}" FSDP_GPU_CHECK_TAG="$name" timeout -k 15 "$t" "${args[@]}" ) \
    </dev/null >"$WORK/logs/$name.log" 2>&1
  rc=$?
  reap "$name"
  dt=$((SECONDS - t0))
  okc="$(grep -c '^\[       OK \]' "$WORK/logs/$name.log")"
  flc="$(grep -c '^\[  FAILED  \]' "$WORK/logs/$name.log")"
  gt="$okc ok"; (( flc > 0 )) && gt+=", failed: $(grep '^\[  FAILED  \]' "$WORK/logs/$name.log" | grep -v 'listed below' | sed 's/^\[  FAILED  \] //; s/ (.*//' | sort -u | tr '\n' ' ')"
  if [[ $rc == 0 ]]; then
    res="PASS"; NPASS=$((NPASS + 1))
  else
    if [[ $rc == 124 || $rc == 137 ]]; then res="**TIMEOUT** (${t} s)"
    elif [[ -n "$skip" && $rc == "$skip" ]]; then res="**NOT RUN** (exit $rc: no CUDA device seen)"
    elif (( rc > 128 )); then res="**CRASH** (signal $((rc - 128)))"
    else res="**FAIL** (exit $rc)"; fi
    if [[ -n "$skip" && $rc == "$skip" && "${GPU_CHECK_ALLOW_NOT_RUN:-0}" == 1 ]]; then
      NPASS=$((NPASS + 1))
    else
      NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("$name")
    fi
    echo "----- last lines of $name -----"; tail -25 "$WORK/logs/$name.log"
  fi
  say "  -> $res in ${dt} s ($gt)"
  echo "| $name | $np | $res | $dt | $gt |" >>"$S_TESTS"
  write_summary
  pack_logs
done < <(grep -v '^#' "$BUNDLE/gpu_tests.txt" | sort -t $'\t' -s -k2,2n | tr '\t' '\037')  # np 1 first
if [[ "${GPU_CHECK_SKIP_TESTS:-0}" == 1 ]]; then
  echo "| (skipped: GPU_CHECK_SKIP_TESTS=1) | | | | |" >>"$S_TESTS"
elif (( NT == 0 )); then
  echo "| (none) | | **the bundle lists no gpu test** (none registered when it was built?) | | |" >>"$S_TESTS"
  NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("(no tests)")
fi
write_summary

# ---- 4b. merged checkpoints in Hugging Face transformers ---------------------------------------
# GPT-2 and T5 trained 3 steps on 2 CPU ranks by the bundle's fsdp_train, merged, loaded with
# from_pretrained by the system python3 (torch + transformers): same validation loss <= 1e-5.
if (( $(left) > BENCH_RESERVE + 30 )); then
  say "Hugging Face check: tools/hf_check.py"
  mkdir -p "$WORK/logs/hf_check"
  timeout -k 10 120 python3 "$REPO/tools/hf_check.py" --env "$BUNDLE/env.sh" --work "$WORK/logs/hf_check" \
    </dev/null >"$S_HF" 2>"$WORK/logs/hf_check.err"
  rc=$?
  find "$WORK/logs/hf_check" -name '*.h5' -delete 2>/dev/null
  case $rc in
    0) say "  -> PASS" ;;
    77) echo; echo "(not run: $(head -1 "$S_HF"))" >>"$S_HF"; say "  -> not run (no transformers)" ;;
    *) echo; echo "**hf_check.py exited $rc**: $(tail -3 "$WORK/logs/hf_check.err" | tr '\n' ' ')" >>"$S_HF"
       NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("hf_check"); say "  -> FAIL ($rc)" ;;
  esac
else
  echo "(skipped: $(left) s left, kept for the benchmark)" >"$S_HF"
fi
write_summary

# ---- 5. phase times and exposed communication, prefetch on / off ------------------------------
S_PHASES="$WORK/s_phases"
if [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
  echo "(skipped: GPU_CHECK_SKIP_BENCH=1)" >"$S_PHASES"
elif (( $(left) < BENCH_RESERVE + 60 )); then
  echo "(skipped: $(left) s left, kept for the benchmark)" >"$S_PHASES"
else
  say "phases: tools/bench_phases.sh --np 4 (prefetch on / off, train.device = cuda)"
  FSDP_GPU_CHECK_TAG=phases inb timeout -k 10 150 bash "$REPO/tools/bench_phases.sh" --np 4 \
    --steps 30 --rounds 2 -- --set train.device=cuda >"$WORK/logs/phases.txt" 2>&1
  rc=$?
  reap phases
  { echo "Command: \`tools/bench_phases.sh --np 4 --steps 30 --rounds 2 -- --set train.device=cuda\`" \
         "(exit $rc; ms per step, medians)"; echo; grep '^|' "$WORK/logs/phases.txt" || tail -20 "$WORK/logs/phases.txt"; } >"$S_PHASES"
fi
write_summary

# ---- 6. benchmark -------------------------------------------------------------------------------
BENCH_RC=0
if [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
  echo "(skipped: GPU_CHECK_SKIP_BENCH=1)" >"$S_BENCH"
elif (( $(left) < 90 )); then
  echo "**not run: $(left) s left of the ${BUDGET} s budget**" >"$S_BENCH"; BENCH_RC=1
else
  b=$(( $(left) - 35 ))  # bench_gpu.sh keeps to it; the timeout below is only a safety net
  say "benchmark: tools/bench_gpu.sh (budget ${b} s)"
  mkdir -p "$WORK/logs/bench"
  FSDP_BUNDLE="$BUNDLE" BENCH_BUDGET_S="$b" BENCH_LOG_DIR="$WORK/logs/bench" FSDP_GPU_CHECK_TAG=bench \
    RUN_TIMEOUT="${RUN_TIMEOUT:-$(( b < 240 ? b : 240 ))}" \
    timeout -k 15 "$((b + 20))" bash "$REPO/tools/bench_gpu.sh" </dev/null >"$WORK/bench.md" 2> >(tee "$WORK/logs/bench/progress.log" >&2)
  BENCH_RC=$?
  reap bench
  sleep 1  # let tee finish
  # The table starts at its "### GPU benchmark" heading.
  sed -n '/^### GPU benchmark/,$p' "$WORK/bench.md" | sed 's/^### /#### /' >"$S_BENCH"
  [[ -s "$S_BENCH" ]] || cp "$WORK/bench.md" "$S_BENCH"
  if grep -q -E '^bench_gpu.sh: .*(failed|stopping|cannot|not found)' "$WORK/logs/bench/progress.log" 2>/dev/null; then
    { echo; echo "Notes from bench_gpu.sh:"; echo; echo '```'
      grep -E '^bench_gpu.sh: .*(failed|stopping|cannot|not found)' "$WORK/logs/bench/progress.log" | cut -c1-400 | head -20; echo '```'; } >>"$S_BENCH"
  fi
  if [[ $BENCH_RC != 0 ]]; then
    echo; echo "**bench_gpu.sh exited $BENCH_RC** (124 = budget exceeded); see gpu_check.log" >>"$S_BENCH"
  fi
  find "$WORK/logs/bench" -name '*.h5' -delete 2>/dev/null  # no checkpoint goes into the logs
  pack_logs
fi
write_summary

# ---- result -------------------------------------------------------------------------------------
if (( NFAIL > 0 )) || [[ "$SMOKE_OK" != 1 || "$SMI_OK" != 1 || -n "$MISSING" ]]; then
  RESULT_LINE="**FAILED**: $NPASS of $NT gpu tests passed"
  (( NFAIL > 0 )) && RESULT_LINE+="; failed or not run: ${FAILED_NAMES[*]}"
  [[ "$SMOKE_OK" == 1 ]] || RESULT_LINE+="; smoke checks failed"
  [[ "$SMI_OK" == 1 ]] || RESULT_LINE+="; nvidia-smi failed"
  [[ -z "$MISSING" ]] || RESULT_LINE+="; CUDA libraries missing: $MISSING"
  [[ $BENCH_RC == 0 ]] || RESULT_LINE+="; benchmark failed"
  finish 1
elif [[ $BENCH_RC != 0 ]]; then
  RESULT_LINE="**TESTS PASSED** ($NPASS of $NT), **benchmark failed** (exit $BENCH_RC)"
  finish 3
else
  RESULT_LINE="**PASSED**: $NPASS of $NT gpu tests; benchmark done"
  finish 0
fi
