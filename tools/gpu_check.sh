#!/usr/bin/env bash
# tools/gpu_check.sh: the one-command GPU verification (docs/gpu.md). Run it on the GPU machine
# from the repo root, with the bundle of tools/gpu_bundle.sh carried (gpu_bundle/):
#
#   1. versions: nvidia-smi (GPU, driver), the CUDA libraries env.sh chose for the bundle
#      (toolkit lib64 or PyTorch's nvidia-* packages), nvcc, torch, OS/glibc; nvidia-smi's table
#   2. smoke: fsdp_train --version and `mpirun -np 2 hostname` from the bundle
#   3. every `gpu` test of the bundle (gpu_tests.txt: ctest's command at its rank count, under
#      the bundled mpirun, with ctest's ENVIRONMENT and GTEST_COLOR=no; the 1-rank ones first),
#      GPU_CHECK_REPEAT (3) times: all tests, then all again, ...; a test passes when every run
#      passed. Each run under `timeout`: a crash, a hang or exit 77 (no device seen) is a
#      failure and the next run goes on. A run is not started when what is left of the budget
#      is under 20 s or (rounds 2+) under its round-1 time + 5 s ("NOT RUN: out of budget"),
#      and one cut at the budget is "cut by budget": neither counts as a failure. The tests'
#      [offload] and cuda_graphs lines are copied into the summary (the first 40), and each
#      test's 4 slowest gtest cases of its first run (where a round's time goes)
#   4. tools/hf_check.py: GPT-2, T5 (2 cases), Llama (GQA with llama3 RoPE, untied and tied
#      with biases), Qwen2, Qwen3 (head_dim != hidden / heads; and with YaRN), Mistral (and with
#      a window of 8 < the 32-token rows) and OLMo 2 merged by fsdp_merge load in transformers
#      (AutoModelForCausalLM) and give fsdp_train's validation loss (<= 1e-5); up to
#      GPU_CHECK_HF_TIMEOUT s (default 240: 11 cases)
#   5. the profiler once on GPT-2 124M (tools/bench_torch_gpu.py's gpt2-124m configuration:
#      `fsdp_train CONFIG --profile 3:4`) and `tools/profile_summary.py --top 20 --markdown` of its
#      rank_0 trace: the top-20 kernel table (not run while the tree has no profile_summary.py)
#   6. tools/bench_phases.sh on the GPU: a 4-rank FULL_SHARD run's phase times and exposed
#      communication (comm_wait) with prefetch on and off (4 ranks share the GPU, so the mesh
#      is MPI staged through host memory), 2 rounds of 30 steps, at most 150 s
# Not the benchmark: tools/bench_gpu.sh takes a call of its own (docs/gpu.md).
#
# Writes ONE summary, $OUT/gpu_summary.md when $OUT is set (the run tool's folder), else
# ./gpu_summary.md, rewritten after every step so that a run cut off at its time limit still
# leaves what was done; plus gpu_check.log (everything printed) and gpu_logs.tar.gz (each
# test run's log, the profile's trace) beside it.
# Exit: 0 every run of every gpu test passed and the later steps passed or were skipped for
# time; 1 a test run failed or timed out, a later step failed, or the bundle is unusable
# (result **FAILED**), or a test run was not run or cut by the budget (**INCOMPLETE**).
#
# Environment (optional): GPU_BUNDLE_DIR (default ./gpu_bundle); GPU_CHECK_BUDGET_S (570: whole
# script, the run tool allows 600 s a call); GPU_CHECK_REPEAT (3: runs of each test);
# GPU_TEST_TIMEOUT (240: cap per test run, ctest's own TIMEOUT if lower); POST_RESERVE_S (300:
# time kept after the tests for steps 4-6); GPU_CHECK_SKIP_TESTS=1; GPU_CHECK_SKIP_POST=1 (no
# steps 4-6); GPU_CHECK_SKIP_HF=1, GPU_CHECK_SKIP_PHASES=1 (no step 4, 6: a short
# session's call); GPU_CHECK_HF_ONLY (only step 4's cases whose name holds it: hf_check.py
# --only, e.g. llama); GPU_CHECK_TESTS (regex: only the matching tests);
# GPU_CHECK_ALLOW_NOT_RUN=1 (exit 77 is not a failure: for trying the script on a machine
# without a GPU); FSDP_CUDA_LIB_DIRS (see env.sh).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$REPO/tools/kit_lib.sh"
START=$SECONDS
BUDGET="${GPU_CHECK_BUDGET_S:-570}"
TEST_CAP="${GPU_TEST_TIMEOUT:-240}"
POST_RESERVE="${POST_RESERVE_S:-300}"
REPEAT="${GPU_CHECK_REPEAT:-3}"
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
# Kill what a timed-out test leaves behind: every process of a test carries
# FSDP_GPU_CHECK_TAG=<tag> (tools/kit_lib.sh kill_tagged).
reap() {
  local n
  n="$(kill_tagged FSDP_GPU_CHECK_TAG "$1")"
  (( n == 0 )) || say "  killed $n leftover process(es) of $1"
}

# ---- summary: sections kept in files, the whole file rewritten after each step --------------
S_HEAD="$WORK/s_head" S_VER="$WORK/s_ver" S_TESTS="$WORK/s_tests" S_HF="$WORK/s_hf" S_PROF="$WORK/s_prof"
S_PHASES="$WORK/s_phases" S_END="$WORK/s_end" S_LINES="$WORK/s_lines" S_SLOW="$WORK/s_slow"
: >"$S_VER"; : >"$S_TESTS"; : >"$S_HF"; : >"$S_PROF"; : >"$S_PHASES"; : >"$S_END"; : >"$S_LINES"
: >"$S_SLOW"
write_summary() {
  {
    cat "$S_HEAD"
    echo; echo "## Versions"; echo; cat "$S_VER"
    echo; echo "## gpu tests"; echo
    if [[ -s "$S_TESTS" ]]; then
      echo "| test | ranks | run | result | time s | gtest |"; echo "|---|---:|---:|---|---:|---|"; cat "$S_TESTS"
    else
      echo "(not run yet)"
    fi
    if [[ -s "$S_LINES" ]]; then
      echo; echo "### The tests' [offload] and cuda_graphs lines (first 40 of $(wc -l <"$S_LINES"))"
      echo; echo '```'; head -40 "$S_LINES"; echo '```'
    fi
    if [[ -s "$S_SLOW" ]]; then  # where a round's time goes, for trimming it
      echo; echo "### The slowest gtest cases of each test (run 1)"; echo; cat "$S_SLOW"
    fi
    echo; echo "## Hugging Face transformers loads our merges (tools/hf_check.py)"; echo
    if [[ -s "$S_HF" ]]; then cat "$S_HF"; else echo "(not run yet)"; fi
    echo; echo "## Profile: GPT-2 124M, steps 3-4, top 20 kernels (fsdp_train --profile, tools/profile_summary.py)"; echo
    if [[ -s "$S_PROF" ]]; then cat "$S_PROF"; else echo "(not run yet)"; fi
    echo; echo "## Phase times, 4-rank FULL_SHARD, prefetch on / off (tools/bench_phases.sh)"; echo
    if [[ -s "$S_PHASES" ]]; then cat "$S_PHASES"; else echo "(not run yet)"; fi
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
  echo "Command: \`tools/gpu_check.sh\` (budget ${BUDGET} s; each gpu test ${REPEAT} times, a run at most ${TEST_CAP} s)."
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

# ---- 4. gpu tests, GPU_CHECK_REPEAT rounds -------------------------------------------------------
# gtest's [ OK ] / [ FAILED ] lines of a run's log are read through plain (tools/kit_lib.sh).
TESTS=()
if [[ "${GPU_CHECK_SKIP_TESTS:-0}" != 1 ]]; then
  while IFS= read -r line; do
    name="${line%%$'\t'*}"
    if [[ -n "${GPU_CHECK_TESTS:-}" && ! "$name" =~ ${GPU_CHECK_TESTS} ]]; then continue; fi
    TESTS+=("$line")
  done < <(grep -v -e '^#' -e '^$' "$BUNDLE/gpu_tests.txt" | sort -t $'\t' -s -k2,2n)  # np 1 first
fi
NT=${#TESTS[@]} NRUNS=0 NRUN_PASS=0 NFAIL=0 NTBAD=0
FAILED_NAMES=() UNRUN_NAMES=()
# TEST_UNRUN: a run not started or cut for the budget (not a failure); TEST_DT: round 1's time
declare -A TEST_FAILED=() TEST_UNRUN=() TEST_DT=()
reserve=$POST_RESERVE; [[ "${GPU_CHECK_SKIP_POST:-0}" == 1 ]] && reserve=0
for ((k = 1; k <= REPEAT; k++)); do
  for line in "${TESTS[@]}"; do
    # Fields are TAB-separated and may be empty: split on \037 (IFS whitespace would merge
    # consecutive TABs).
    IFS=$'\037' read -r name np tmo skip env wd cmd <<<"$(tr '\t' '\037' <<<"$line")"
    NRUNS=$((NRUNS + 1))
    avail=$(( $(left) - reserve ))
    t="$TEST_CAP"; (( tmo > 0 && tmo < t )) && t=$tmo
    need=$(( ${TEST_DT[$name]:-0} + 5 )); (( need < 20 )) && need=20
    if (( avail < need )); then
      echo "| $name | $np | $k/$REPEAT | NOT RUN: out of budget ($((avail > 0 ? avail : 0)) s" \
        "left, needs ${need} s) | 0 | |" >>"$S_TESTS"
      TEST_UNRUN[$name]=1; write_summary; continue
    fi
    capped=0; (( t > avail )) && t=$avail capped=1
    eval "args=($cmd)"
    args=("${args[@]//@BUNDLE@/$BUNDLE}")
    args=("${args[@]//@REPO@/$REPO}")
    envs=()
    if [[ -n "$env" ]]; then IFS=';' read -r -a envs <<<"$env"; fi
    run_dir="$wd"
    [[ -n "$run_dir" && -d "$run_dir" ]] || { run_dir="$WORK/run_$name"; mkdir -p "$run_dir"; }
    log="$WORK/logs/$name.run$k.log"
    say "test $name ($np ranks, run $k/$REPEAT, timeout ${t} s): ${args[*]}"
    t0=$SECONDS
    ( cd "$run_dir" && inb env "${envs[@]}" GTEST_COLOR=no FSDP_GPU_CHECK_TAG="$name" timeout -k 15 "$t" "${args[@]}" ) \
      </dev/null >"$log" 2>&1
    rc=$?
    reap "$name"
    dt=$((SECONDS - t0))
    (( k == 1 )) && TEST_DT[$name]=$dt
    okc="$(plain "$log" | grep -c '^\[       OK \]')"
    # rank 0's gtest lines, and tests/rank_printer.hpp's of the other ranks: [rank N] FAILED X.Y
    failed="$(plain "$log" | grep -E '^\[  FAILED  \] |^\[rank [0-9]+\] FAILED ' \
      | grep -v 'listed below' | sed -E -e 's/^\[  FAILED  \] //' \
        -e 's/^\[rank [0-9]+\] FAILED //; s/[ ,].*//' | sort -u | tr '\n' ' ')"
    plain "$log" | grep -E '^\[offload\]|cuda_graphs' | sed "s/^/$name run $k: /" >>"$S_LINES"
    if (( k == 1 )); then  # "- name: Suite.Case 812 ms, ..." (the 4 slowest passed cases)
      slow="$(plain "$log" | sed -nE 's/^\[       OK \] ([^ ]+) \(([0-9]+) ms\)$/\2 \1/p' |
        sort -rn | head -4 | awk '{printf "%s%s %s ms", (NR > 1 ? ", " : ""), $2, $1}')"
      [[ -n "$slow" ]] && echo "- $name: $slow" >>"$S_SLOW"
    fi
    gt="$okc ok"; [[ -n "$failed" ]] && gt+=", failed: $failed"
    if [[ $rc == 0 ]]; then
      res="PASS"; NRUN_PASS=$((NRUN_PASS + 1))
    else
      # Killed at a limit cut to the budget: "cut by budget" unless a case failed before.
      if [[ $rc == 124 || $rc == 137 ]] && (( capped )); then res="cut by budget (${t} s)"
      elif [[ $rc == 124 || $rc == 137 ]]; then res="**TIMEOUT** (${t} s)"
      elif [[ -n "$skip" && $rc == "$skip" ]]; then res="**NOT RUN** (exit $rc: no CUDA device seen)"
      elif (( rc > 128 )); then res="**CRASH** (signal $((rc - 128)))"
      else res="**FAIL** (exit $rc)"; fi
      if [[ $res == cut* && -z "$failed" ]]; then
        TEST_UNRUN[$name]=1
      elif [[ -n "$skip" && $rc == "$skip" && "${GPU_CHECK_ALLOW_NOT_RUN:-0}" == 1 ]]; then
        NRUN_PASS=$((NRUN_PASS + 1))
      else
        TEST_FAILED[$name]=1
      fi
      echo "----- last lines of $name (run $k) -----"; plain "$log" | tail -25
    fi
    say "  -> $res in ${dt} s ($gt)"
    echo "| $name | $np | $k/$REPEAT | $res | $dt | $gt |" >>"$S_TESTS"
    write_summary
    pack_logs
  done
done
for line in "${TESTS[@]}"; do
  name="${line%%$'\t'*}"
  if [[ -n "${TEST_FAILED[$name]:-}" ]]; then
    NFAIL=$((NFAIL + 1)) NTBAD=$((NTBAD + 1)); FAILED_NAMES+=("$name")
  elif [[ -n "${TEST_UNRUN[$name]:-}" ]]; then
    NTBAD=$((NTBAD + 1)); UNRUN_NAMES+=("$name")
  fi
done
if [[ "${GPU_CHECK_SKIP_TESTS:-0}" == 1 ]]; then
  echo "| (skipped: GPU_CHECK_SKIP_TESTS=1) | | | | | |" >>"$S_TESTS"
elif (( NT == 0 )); then
  echo "| (none) | | | **the bundle lists no gpu test** (none registered when it was built?) | | |" >>"$S_TESTS"
  NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("(no tests)")
fi
write_summary

# Later steps: each runs when its time limit fits in what is left, else is recorded as skipped.
HF_TIMEOUT=${GPU_CHECK_HF_TIMEOUT:-240}
post_skip() {  # $1 = summary file, $2 = the step's time limit: true (and a note) when it is skipped
  if [[ "${GPU_CHECK_SKIP_POST:-0}" == 1 ]]; then echo "(skipped: GPU_CHECK_SKIP_POST=1)" >"$1"; return 0; fi
  if (( $(left) < $2 )); then
    echo "(skipped: $(left) s left of the ${BUDGET} s budget, the step may take $2 s; split the call: docs/gpu.md)" >"$1"
    return 0
  fi
  return 1
}

# ---- 5. merged checkpoints in Hugging Face transformers ----------------------------------------
# GPT-2, T5 and Llama trained 3 steps on 2 CPU ranks by the bundle's fsdp_train, merged, loaded
# with from_pretrained by the system python3 (torch + transformers): same validation loss <= 1e-5.
# GPU_CHECK_HF_ONLY (e.g. llama) runs only the cases whose name holds it (hf_check.py --only).
if [[ "${GPU_CHECK_SKIP_HF:-0}" == 1 ]]; then
  echo "(skipped: GPU_CHECK_SKIP_HF=1)" >"$S_HF"
elif ! post_skip "$S_HF" "$HF_TIMEOUT"; then
  say "Hugging Face check: tools/hf_check.py"
  mkdir -p "$WORK/logs/hf_check"
  timeout -k 10 "$HF_TIMEOUT" python3 "$REPO/tools/hf_check.py" --env "$BUNDLE/env.sh" --work "$WORK/logs/hf_check" \
    ${GPU_CHECK_HF_ONLY:+--only "$GPU_CHECK_HF_ONLY"} </dev/null >"$S_HF" 2>"$WORK/logs/hf_check.err"
  rc=$?
  find "$WORK/logs/hf_check" -name '*.h5' -delete 2>/dev/null
  case $rc in
    0) say "  -> PASS" ;;
    77) echo; echo "(not run: $(head -1 "$S_HF"))" >>"$S_HF"; say "  -> not run (no transformers)" ;;
    *) echo; echo "**hf_check.py exited $rc**: $(tail -3 "$WORK/logs/hf_check.err" | tr '\n' ' ')" >>"$S_HF"
       NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("hf_check"); say "  -> FAIL ($rc)" ;;
  esac
fi
write_summary

# ---- 6. the profiler on GPT-2 124M: top-20 kernels ----------------------------------------------
# fsdp_train's --profile FIRST:LAST writes RUN_DIR/profile/rank_N.trace.json (Chrome trace);
# tools/profile_summary.py prints its tables. The run: bench_torch_gpu.py's gpt2-124m
# configuration (tools/bench_gpu.sh's), 5 steps, steps 3 and 4 profiled.
PROFILE_SUMMARY="$REPO/tools/profile_summary.py"
[[ -f "$PROFILE_SUMMARY" ]] || PROFILE_SUMMARY="$BUNDLE/tools/profile_summary.py"
if [[ ! -f "$PROFILE_SUMMARY" ]]; then
  echo "(not run: no tools/profile_summary.py in the tree or the bundle: the profiler is not in this commit)" >"$S_PROF"
elif ! post_skip "$S_PROF" 90; then
  say "profile: fsdp_train --profile 3:4 on GPT-2 124M, then tools/profile_summary.py --top 20 --markdown"
  prof_dir="$WORK/profile_run"
  rm -rf "$prof_dir"
  prof_ok=0
  if python3 "$REPO/tools/bench_torch_gpu.py" --model gpt2-124m --fsdp-train-toml --warmup 2 --steps 3 \
      >"$WORK/logs/profile.toml" 2>"$WORK/logs/profile.err"; then
    FSDP_GPU_CHECK_TAG=profile inb timeout -k 10 80 mpirun -np 1 --bind-to none fsdp_train "$WORK/logs/profile.toml" \
      --set "train.run_dir=\"$prof_dir\"" --profile 3:4 </dev/null >"$WORK/logs/profile.log" 2>&1
    rc=$?
    reap profile
    traces=("$prof_dir"/profile/rank_*.trace.json)
    if [[ $rc == 0 && -f "${traces[0]}" ]]; then
      if timeout 60 python3 "$PROFILE_SUMMARY" --top 20 --markdown "${traces[@]}" >"$S_PROF.tmp" 2>>"$WORK/logs/profile.err"; then
        { echo "Command: \`fsdp_train gpt2-124m.toml --profile 3:4\` (\`tools/bench_torch_gpu.py --model gpt2-124m" \
               "--fsdp-train-toml --warmup 2 --steps 3\`), then \`python3 tools/profile_summary.py --top 20 --markdown" \
               "$(basename "${traces[0]}")\`"; echo; cat "$S_PROF.tmp"; } >"$S_PROF"
        prof_ok=1
        for f in "${traces[@]}"; do gzip -c "$f" >"$WORK/logs/$(basename "$f").gz"; done
      else
        echo "**tools/profile_summary.py failed**: $(tail -3 "$WORK/logs/profile.err" | tr '\n' ' ')" >"$S_PROF"
      fi
    else
      echo "**fsdp_train --profile 3:4 exited $rc** (or wrote no $prof_dir/profile/rank_*.trace.json): $(plain "$WORK/logs/profile.log" | grep -m1 -E '^fsdp_train:|rror' | cut -c1-300)" >"$S_PROF"
    fi
  else
    echo "**bench_torch_gpu.py --fsdp-train-toml failed**: $(tail -1 "$WORK/logs/profile.err")" >"$S_PROF"
  fi
  rm -rf "$prof_dir"
  if [[ $prof_ok == 1 ]]; then say "  -> done"; else
    NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("profile"); say "  -> FAIL: $(cat "$S_PROF")"
  fi
fi
write_summary
pack_logs

# ---- 7. phase times and exposed communication, prefetch on / off ------------------------------
if [[ "${GPU_CHECK_SKIP_PHASES:-0}" == 1 ]]; then
  echo "(skipped: GPU_CHECK_SKIP_PHASES=1)" >"$S_PHASES"
elif ! post_skip "$S_PHASES" 150; then
  say "phases: tools/bench_phases.sh --np 4 (prefetch on / off, train.device = cuda)"
  FSDP_GPU_CHECK_TAG=phases inb timeout -k 10 150 bash "$REPO/tools/bench_phases.sh" --np 4 \
    --steps 30 --rounds 2 -- --set train.device=cuda >"$WORK/logs/phases.txt" 2>&1
  rc=$?
  reap phases
  { echo "Command: \`tools/bench_phases.sh --np 4 --steps 30 --rounds 2 -- --set train.device=cuda\`" \
         "(exit $rc; ms per step, medians)"; echo; grep '^|' "$WORK/logs/phases.txt" || tail -20 "$WORK/logs/phases.txt"; } >"$S_PHASES"
  if [[ $rc != 0 ]]; then NFAIL=$((NFAIL + 1)); FAILED_NAMES+=("bench_phases"); fi
fi
write_summary

# ---- result -------------------------------------------------------------------------------------
TESTS_LINE="$((NT - NTBAD)) of $NT gpu tests passed all $REPEAT runs ($NRUN_PASS of $NRUNS runs)"
UNRUN_NOTE=""
(( ${#UNRUN_NAMES[@]} > 0 )) && UNRUN_NOTE="; not run or cut by budget: ${UNRUN_NAMES[*]}"
if (( NFAIL > 0 )) || [[ "$SMOKE_OK" != 1 || "$SMI_OK" != 1 || -n "$MISSING" ]]; then
  RESULT_LINE="**FAILED**: $TESTS_LINE"
  (( NFAIL > 0 )) && RESULT_LINE+="; failed or not run: ${FAILED_NAMES[*]}"
  RESULT_LINE+="$UNRUN_NOTE"
  [[ "$SMOKE_OK" == 1 ]] || RESULT_LINE+="; smoke checks failed"
  [[ "$SMI_OK" == 1 ]] || RESULT_LINE+="; nvidia-smi failed"
  [[ -z "$MISSING" ]] || RESULT_LINE+="; CUDA libraries missing: $MISSING"
  finish 1
elif (( ${#UNRUN_NAMES[@]} > 0 )); then
  RESULT_LINE="**INCOMPLETE** (no failure): $TESTS_LINE$UNRUN_NOTE"
  finish 1
else
  RESULT_LINE="**PASSED**: $TESTS_LINE"
  finish 0
fi
