#!/usr/bin/env bash
# tests/test_rank_printer.sh MPIEXEC PROBE: every rank's failures are printed, prefixed with
# the rank, and passing ranks other than 0 stay quiet (tests/rank_printer.hpp, used by
# tests/mpi_main.cpp and tests/gpu_main.cpp).
set -uo pipefail
mpiexec=$1 probe=$2
export GTEST_COLOR=no  # plain text to grep
fail() { echo "FAIL: $*"; echo "--- output ---"; echo "$out"; exit 1; }
run() { out=$("$mpiexec" -np 3 --oversubscribe --bind-to none "$probe" 2>&1); rc=$?; }

# A failure on rank 2 only: its message and its FAILED line, each prefixed, and every rank
# exits non-zero.
FSDP_PROBE_FAIL_RANK=2 run
[[ $rc -ne 0 ]] || fail "exit 0 with a failure on rank 2"
grep -q '^\[rank 2\] .*rank_printer_probe.cpp:[0-9]*: Failure$' <<<"$out" || fail "no prefixed file:line"
grep -q '^\[rank 2\] deliberate failure on rank 2$' <<<"$out" || fail "no prefixed message"
grep -q '^\[rank 2\] FAILED RankPrinterProbe.FailsOnOneRank (' <<<"$out" || fail "no prefixed FAILED line"
grep -q '^\[rank 1\]' <<<"$out" && fail "rank 1 passed but printed"
grep -q 'a test failed on another rank' <<<"$out" || fail "rank 0 did not say another rank failed"

# Everything passes: only rank 0 prints (gtest's usual summary), exit 0.
run
[[ $rc -eq 0 ]] || fail "exit $rc with every rank passing"
grep -q '^\[rank [0-9]*\]' <<<"$out" && fail "a passing rank printed a prefixed line"
grep -q '\[  PASSED  \] 1 test' <<<"$out" || fail "rank 0's summary missing"
[[ $(grep -c 'RankPrinterProbe.FailsOnOneRank' <<<"$out") -eq 2 ]] || fail "more than rank 0 printed the test"
echo "ok"
