#!/usr/bin/env bash
# tests/cli/profile.sh: the built-in profiler from the command line (fsdp_train --profile,
# train.profile_steps) and tools/profile_summary.py.
#
#   bash tests/cli/profile.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE option:     inputs/tiny.toml on 2 ranks for 4 steps with --profile 2:3 writes
#                  run/profile/rank_0.trace.json and rank_1.trace.json: Chrome traces (a
#                  "traceEvents" list) holding the ranges "step 2" and "step 3" only, each
#                  rank's process named "rank R"; rank 0 logs where they went; --profile
#                  wins over a --set train.profile_steps given before it and loses to one
#                  given after it (command-line order, as between two --set). A run without
#                  --profile writes no run/profile.
# CASE summary:    profile_summary.py on such a trace: the step count and time, a host-range
#                  table whose phases add up to the profiled time (100% within rounding),
#                  no kernel table on a CPU trace; GPU idle gaps (total, by length, by the
#                  kernel that ends them) on a synthetic device trace; two traces side by
#                  side with the B/A ratio column; --markdown tables; --top; one-line errors
#                  for a missing file and a file that is not a trace.
# CASE bad_values: --profile 3:2, 0:1, 2-3, 2:x, "", --profile= and train.profile_steps = [3]
#                  or [0, 2] in the file are each refused with exit 2 and one line naming
#                  --profile or the key.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

PY=python3
SUMMARY=$SRC_DIR/tools/profile_summary.py

# run_summary ARGS...: profile_summary.py; sets RC, OUT, ERR.
run_summary() {
  timeout 60 "$PY" "$SUMMARY" "$@" >"$OUT" 2>"$ERR" </dev/null
  RC=$?
}

# check_trace FILE RANK: a Chrome trace of rank RANK with the ranges "step 2" and "step 3" only.
check_trace() {
  "$PY" - "$1" "$2" <<'EOF' || fail "$1 is not the expected trace"
import json, sys
path, rank = sys.argv[1], int(sys.argv[2])
doc = json.load(open(path))
events = doc["traceEvents"]
steps = sorted(e["name"] for e in events if e.get("ph") == "X" and e.get("cat") == "step")
assert steps == ["step 2", "step 3"], steps
names = [e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"]
assert names == [f"rank {rank}"], names
assert all(e["pid"] == rank for e in events), "pid is not the rank"
phases = {e["name"] for e in events if e.get("cat") == "phase"}
assert {"forward", "backward", "optimizer", "comm_wait"} <= phases, phases
colls = [e["name"] for e in events if e.get("cat") == "collective"]
assert any(n.startswith("all_gather wait unit 1 (h.0)") for n in colls), colls[:10]
print(f"{path}: {len(events)} events, steps {steps}")
EOF
}

# make_traces: a 4-step run traced at steps 2-3 in $WORK/run.
make_traces() {
  tiny_config tiny.toml
  run_train tiny.toml --set train.max_steps=4 --set train.profile_steps=[1,4] --profile 2:3
  expect_rc 0
}

case "$CASE" in
  option)
    make_traces
    check_trace "$WORK/run/profile/rank_0.trace.json" 0
    check_trace "$WORK/run/profile/rank_1.trace.json" 1
    grep -qF "profile: steps 2-3 traced into $WORK/run/profile/rank_*.trace.json" "$OUT" ||
      fail "no log line naming the traces"
    grep -q "^profile_steps = \[2, 3\]$" "$OUT" || fail "the banner's resolved config lacks profile_steps = [2, 3]"
    ls "$WORK/run/profile" | grep -q '\.tmp$' && fail "a temporary file was left in run/profile"
    # Command-line order: a --set after --profile wins, as between two --set (issue 29 item 7).
    tiny_config order.toml
    sed -i "s|^run_dir = .*|run_dir = \"$WORK/order\"|" order.toml
    run_train order.toml --dry-run --profile 2:3 --set train.profile_steps=[1,1]
    expect_rc 0
    grep -q "^profile_steps = \[1, 1\]$" "$OUT" || fail "a --set after --profile did not win"
    run_train order.toml --dry-run --set train.profile_steps=[1,1] --profile 2:3
    expect_rc 0
    grep -q "^profile_steps = \[2, 3\]$" "$OUT" || fail "--profile after a --set did not win"
    # Off: no profile directory.
    tiny_config off.toml
    sed -i "s|^run_dir = .*|run_dir = \"$WORK/off\"|" off.toml
    run_train off.toml --set train.max_steps=2
    expect_rc 0
    if [ -e "$WORK/off/profile" ]; then fail "a run without --profile wrote $WORK/off/profile"; fi
    ;;
  summary)
    make_traces
    T0=$WORK/run/profile/rank_0.trace.json
    T1=$WORK/run/profile/rank_1.trace.json
    run_summary "$T0"
    expect_rc 0
    cat "$OUT"
    grep -q "2 profiled step(s) (step 2, step 3)" "$OUT" || fail "no step summary"
    grep -q "^Top host ranges by time (top 20)" "$OUT" || fail "no host-range table"
    grep -q "no kernels in the trace" "$OUT" || fail "a CPU trace should say it has no kernels"
    # The phases tile the steps: their % column adds up to 100 (all rows: --top 100).
    run_summary "$T0" --top 100
    expect_rc 0
    "$PY" - "$OUT" <<'EOF' || fail "phase percentages do not add up to 100"
import sys
phases = {"data", "forward", "backward", "comm_wait", "optimizer", "eval", "checkpoint"}
total = 0.0
for line in open(sys.argv[1]):
    cells = line.split()
    if cells and cells[0] in phases:
        total += float(cells[4])
assert abs(total - 100.0) < 0.5, total
print("phases add up to", total)
EOF
    run_summary "$T0" "$T1" --top 5
    expect_rc 0
    grep -q "B/A" "$OUT" || fail "no ratio column for two traces"
    # comm_wait is in both traces: its row ends with B/A = B ms/step / A ms/step. The
    # ratio is computed from unrounded times and printed to 2 decimals, the ms/step cells
    # to 3: the tolerance is the ratio's rounding (0.005) plus what rounding each cell by
    # 0.0005 ms moves b/a by (a CPU step's comm_wait is ~0.1 ms, so this is not tiny).
    awk '$1 == "comm_wait" { r = $NF; a = $6; b = $11; gsub(",", "", a); gsub(",", "", b);
         d = b / a - r; if (d < 0) d = -d;
         ok = (r ~ /^[0-9]+\.[0-9][0-9]$/) && (a > 0) && (d <= 0.005 + 0.0005 * (1 + b / a) / a + 1e-9) }
         END { exit ok ? 0 : 1 }' "$OUT" || fail "no comm_wait row with its ratio"
    rows=$(awk '/^Top host ranges/ {on = 1; next} on && NF {n++} END {print n}' "$OUT")
    [ "$rows" -eq 6 ] || fail "--top 5: expected a header and 5 rows, got $rows lines"
    run_summary "$T0" --markdown --only host
    expect_rc 0
    grep -q "^### Top host ranges by time (top 20)$" "$OUT" || fail "no markdown heading"
    grep -q "^| name | count | total ms | mean us | % | ms/step |$" "$OUT" || fail "no markdown header row"
    grep -q "^|---|---:|" "$OUT" || fail "no markdown alignment row"
    grep -q "^| forward | " "$OUT" || fail "no markdown forward row"
    # GPU idle gaps on a synthetic device trace: kernels a [10, 30), b [25, 35), c [37, 40),
    # d [41, 91) in a step [0, 100), a copy outside it: idle 10 (before a) + 2 (c) + 1 (d) +
    # 9 (the step's tail) = 22 us, two gaps < 5 us and two of 5-50 us.
    "$PY" - "$WORK/gpu.json" <<'EOF'
import json, sys
k = lambda n, ts, dur, cat="kernel": {"ph": "X", "cat": cat, "name": n, "ts": ts, "dur": dur}
ev = [{"ph": "X", "cat": "step", "name": "step 1", "ts": 0, "dur": 100},
      k("a", 10, 20), k("b", 25, 10), k("c", 37, 3), k("d", 41, 50), k("HtoD", 600, 3, "gpu_memcpy")]
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
EOF
    run_summary "$WORK/gpu.json"
    expect_rc 0
    cat "$OUT"
    grep -qF "GPU idle 0.022 ms/step (22.0%) [< 5 us: 2 gaps 0.003 ms/step; 5-50 us: 2 gaps 0.019 ms/step;" "$OUT" ||
      fail "no or a wrong GPU idle summary"
    grep -q "^GPU idle gaps by the activity that ends them" "$OUT" || fail "no idle table"
    awk '$1 == "a" && $2 == 1 && $3 == "0.010" { a = 1 } $1 == "(step" && $4 == "0.009" { e = 1 }
         END { exit (a && e) ? 0 : 1 }' "$OUT" || fail "idle rows: expected a 0.010 ms and (step end) 0.009 ms"
    # Errors: one line naming the file, exit 2.
    run_summary "$WORK/missing.json"
    [ "$RC" -eq 2 ] || fail "missing file: exit $RC, expected 2"
    [ "$(wc -l <"$ERR")" -eq 1 ] && grep -q "^profile_summary.py: $WORK/missing.json: no such file$" "$ERR" ||
      fail "missing file: expected one error line"
    echo '{"foo": 1}' >"$WORK/not_trace.json"
    run_summary "$WORK/not_trace.json"
    [ "$RC" -eq 2 ] || fail "not a trace: exit $RC, expected 2"
    grep -q "^profile_summary.py: $WORK/not_trace.json: no \"traceEvents\" list" "$ERR" ||
      fail "not a trace: expected one error line"
    ;;
  bad_values)
    tiny_config good.toml
    run_train good.toml --profile 3:2
    expect_input_error "--profile 3:2" "last step 2 is before the first step 3"
    run_train good.toml --profile 0:1
    expect_input_error "--profile 0:1" "first step 0 is out of range"
    run_train good.toml --profile 2-3
    expect_input_error "--profile 2-3" "expected FIRST:LAST"
    run_train good.toml --profile 2:x
    expect_input_error "--profile 2:x" "expected FIRST:LAST"
    run_train good.toml --profile ""
    expect_input_error '--profile "": expected FIRST:LAST'
    run_train good.toml --profile=
    expect_input_error "command line:" "--profile"
    tiny_config bad.toml
    sed -i 's/^max_steps = 5$/max_steps = 5\nprofile_steps = [3]/' bad.toml
    run_train bad.toml
    expect_input_error "bad.toml" "train.profile_steps" "two step numbers"
    run_train good.toml --set "train.profile_steps=[0, 2]"
    expect_input_error "--set train.profile_steps=[0, 2]" "train.profile_steps" "out of range"
    ;;
  *)
    echo "profile.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
