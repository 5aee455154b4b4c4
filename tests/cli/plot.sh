#!/usr/bin/env bash
# tests/cli/plot.sh: tools/plot_run.py (one PNG of a run's curves from metrics.jsonl).
#
#   bash tests/cli/plot.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# Runs the tool with Debian's /usr/bin/python3 (python3-matplotlib), whatever python3 is
# first on PATH.
#
# CASE small_run: inputs/tiny.toml on 2 ranks for 6 steps, eval every 3 steps and at the
#               start; plot_run.py RUN writes RUN/run.png (path printed on stdout): a PNG of
#               plausible size. A second run (other seed and lr) in OTHER/run, then both runs
#               (same basename, told apart by their parents) into -o out.png.
# CASE fixture: hand-written metrics.jsonl files: "new" has every key of the step-time
#               breakdown (tokens, step_s, the phase *_s keys, mfu), a step-0 val line, a
#               resumed stretch (steps 5 and 6 twice; the first copies carry loss 99 that
#               must not survive) and a null loss; "old" has none of the new keys (plotted
#               against step). Each alone, both together, --smooth; the loading logic is
#               checked by importing the module (last line of a step wins, sorted, names).
#               A run still writing (an unfinished last line, no newline) plots with a note.
#               Errors: a missing run directory, an empty file, a malformed line (named with
#               its line number), a file without step lines and an unwritable output each
#               exit non-zero with exactly one line `plot_run.py: FILE...` on stderr and
#               write no PNG.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3
PLOT=$SRC_DIR/tools/plot_run.py

# run_plot ARGS...: plot_run.py; sets RC, OUT, ERR.
run_plot() {
  timeout 120 "$PY" "$PLOT" "$@" >"$OUT" 2>"$ERR" </dev/null
  RC=$?
  if [ "$RC" -eq 124 ]; then fail "plot_run.py $* did not finish within 120 s"; fi
}

# check_png FILE: a PNG (signature, IHDR first) wider and taller than 500 px.
check_png() {
  if [ ! -s "$1" ]; then fail "no PNG (or an empty one) at $1"; return; fi
  "$PY" - "$1" <<'EOF' || fail "$1 is not a plausible PNG"
import struct, sys
head = open(sys.argv[1], "rb").read(32)
assert head[:8] == b"\x89PNG\r\n\x1a\n", f"no PNG signature: {head[:8]!r}"
assert head[12:16] == b"IHDR", f"first chunk is {head[12:16]!r}, not IHDR"
w, h = struct.unpack(">II", head[16:24])
assert w > 500 and h > 500, f"{w} x {h} px"
print(f"{sys.argv[1]}: PNG {w} x {h}")
EOF
}

# expect_printed PATH: the tool printed exactly PATH on stdout.
expect_printed() {
  if [ "$(cat "$OUT")" != "$1" ]; then fail "stdout is '$(cat "$OUT")', expected '$1'"; fi
}

# expect_plot_error NEEDLE...: non-zero exit, stderr is exactly one line
# `plot_run.py: ...` holding every NEEDLE.
expect_plot_error() {
  if [ "$RC" -eq 0 ]; then fail "exit code 0, expected a failure"; fi
  local n
  n=$(wc -l <"$ERR")
  if [ "$n" -ne 1 ] || ! grep -q "^plot_run.py: " "$ERR"; then
    fail "expected exactly one 'plot_run.py: ...' line on stderr, got $n line(s)"
    return
  fi
  echo "error line (exit $RC): $(cat "$ERR")"
  local needle
  for needle in "$@"; do
    if ! grep -qF -- "$needle" "$ERR"; then fail "error line does not contain '$needle'"; fi
  done
}

# Fixture lines. NEW: all keys (tokens = 4096 per step); a step-0 val line; steps 5 and 6
# logged twice (a run killed after step 6 and resumed from the step-4 checkpoint): the first
# copies say loss 99, the resumed ones are kept; step 7 is a skipped nonfinite step (null
# loss); eval every 4 steps; a checkpoint at step 4 and 8.
write_new_fixture() {
  cat >"$1" <<'EOF'
{"step":0,"tokens":0,"val_loss":5.61}
{"step":1,"loss":5.60,"lr":0.0005,"grad_norm":2.1,"tokens_per_sec":20000,"peak_mem_bytes":1000,"tokens":4096,"step_s":0.205,"data_s":0.005,"forward_s":0.06,"backward_s":0.09,"comm_wait_s":0.03,"optimizer_s":0.02,"eval_s":0,"checkpoint_s":0,"mfu":0.31}
{"step":2,"loss":5.31,"lr":0.001,"grad_norm":1.9,"tokens_per_sec":21000,"peak_mem_bytes":1000,"tokens":8192,"step_s":0.195,"data_s":0.004,"forward_s":0.058,"backward_s":0.088,"comm_wait_s":0.027,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.33}
{"step":3,"loss":5.02,"lr":0.00095,"grad_norm":1.5,"tokens_per_sec":21500,"peak_mem_bytes":1000,"tokens":12288,"step_s":0.19,"data_s":0.004,"forward_s":0.057,"backward_s":0.086,"comm_wait_s":0.025,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.34}
{"step":4,"loss":4.80,"lr":0.0008,"grad_norm":1.2,"tokens_per_sec":12000,"peak_mem_bytes":1000,"tokens":16384,"val_loss":4.85,"step_s":0.34,"data_s":0.004,"forward_s":0.057,"backward_s":0.085,"comm_wait_s":0.026,"optimizer_s":0.018,"eval_s":0.07,"checkpoint_s":0.08,"mfu":0.19}
{"step":5,"loss":99.0,"lr":0.0006,"grad_norm":1.0,"tokens_per_sec":21700,"peak_mem_bytes":1000,"tokens":20480,"step_s":0.188,"data_s":0.004,"forward_s":0.056,"backward_s":0.085,"comm_wait_s":0.025,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.34}
{"step":6,"loss":99.0,"lr":0.0004,"grad_norm":0.9,"tokens_per_sec":21800,"peak_mem_bytes":1000,"tokens":24576,"step_s":0.187,"data_s":0.004,"forward_s":0.056,"backward_s":0.084,"comm_wait_s":0.025,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.35}
{"step":5,"loss":4.62,"lr":0.0006,"grad_norm":1.0,"tokens_per_sec":19000,"peak_mem_bytes":1000,"tokens":20480,"step_s":0.215,"data_s":0.03,"forward_s":0.056,"backward_s":0.085,"comm_wait_s":0.026,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.30}
{"step":6,"loss":4.51,"lr":0.0004,"grad_norm":0.9,"tokens_per_sec":21800,"peak_mem_bytes":1000,"tokens":24576,"step_s":0.187,"data_s":0.004,"forward_s":0.056,"backward_s":0.084,"comm_wait_s":0.025,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.35}
{"step":7,"loss":null,"lr":0.0002,"grad_norm":null,"tokens_per_sec":21900,"peak_mem_bytes":1000,"tokens":28672,"nonfinite":true,"skipped":true,"step_s":0.186,"data_s":0.004,"forward_s":0.056,"backward_s":0.084,"comm_wait_s":0.024,"optimizer_s":0.018,"eval_s":0,"checkpoint_s":0,"mfu":0.35}
{"step":8,"loss":4.40,"lr":0.0001,"grad_norm":0.8,"tokens_per_sec":12500,"peak_mem_bytes":1000,"tokens":32768,"val_loss":4.47,"step_s":0.33,"data_s":0.004,"forward_s":0.056,"backward_s":0.084,"comm_wait_s":0.024,"optimizer_s":0.018,"eval_s":0.07,"checkpoint_s":0.074,"mfu":0.2}
EOF
}

# OLD: the format before the step-time breakdown (no tokens, step_s, *_s, mfu).
write_old_fixture() {
  cat >"$1" <<'EOF'
{"grad_norm":2.2,"loss":5.58,"lr":0.0005,"peak_mem_bytes":900,"step":1,"tokens_per_sec":15000}
{"grad_norm":2.0,"loss":5.35,"lr":0.001,"peak_mem_bytes":900,"step":2,"tokens_per_sec":15500}
{"grad_norm":1.7,"loss":5.12,"lr":0.0009,"peak_mem_bytes":900,"step":3,"tokens_per_sec":15800}
{"grad_norm":1.4,"loss":4.95,"lr":0.0006,"peak_mem_bytes":900,"step":4,"tokens_per_sec":15700}
{"grad_norm":1.2,"loss":4.83,"lr":0.0003,"peak_mem_bytes":900,"step":5,"tokens_per_sec":15900,"val_loss":4.9}
EOF
}

case "$CASE" in
  small_run)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=6 --set eval.every=3 --set eval.on_start=true
    expect_rc 0
    if [ ! -s "$WORK/run/metrics.jsonl" ]; then fail "the run wrote no metrics.jsonl"; fi
    run_plot "$WORK/run"
    expect_rc 0
    expect_printed "$WORK/run/run.png"
    check_png "$WORK/run/run.png"

    # A second run beside it: another seed and learning rate, also named "run".
    run_train tiny.toml --set train.max_steps=6 --set eval.every=3 --set train.seed=7 \
      --set optim.lr=5e-4 --set train.run_dir="$WORK/other/run"
    expect_rc 0
    run_plot "$WORK/run" "$WORK/other/run" -o "$WORK/out.png" --smooth 2
    expect_rc 0
    expect_printed "$WORK/out.png"
    check_png "$WORK/out.png"
    "$PY" - "$SRC_DIR/tools" "$WORK" <<'EOF' || fail "names of the two runs"
import os, sys
sys.path.insert(0, sys.argv[1])
import plot_run
work = sys.argv[2]
names = plot_run.run_names([os.path.join(work, "run"), os.path.join(work, "other", "run")])
assert names == [os.path.basename(work) + "/run", "other/run"], names
print("names:", names)
EOF
    ;;
  fixture)
    mkdir -p "$WORK/new" "$WORK/old"
    write_new_fixture "$WORK/new/metrics.jsonl"
    write_old_fixture "$WORK/old/metrics.jsonl"
    "$PY" - "$SRC_DIR/tools" "$WORK" <<'EOF' || fail "loading the fixtures"
import os, sys
sys.path.insert(0, sys.argv[1])
import plot_run
work = sys.argv[2]
recs = plot_run.load_records(os.path.join(work, "new", "metrics.jsonl"))
assert [r["step"] for r in recs] == list(range(9)), [r["step"] for r in recs]
assert [r.get("loss") for r in recs][5:7] == [4.62, 4.51], "the resumed lines must win"
new = plot_run.Run("new", "new", recs)
assert new.has_tokens and new.tokens_per_step == 4096, new.tokens_per_step
xs, ys = new.series("loss", True)
assert 99.0 not in ys and len(ys) == 7, ys  # 8 steps, one null loss
assert xs[-1] == 32768, xs
assert new.series("val_loss", True, steps_only=False) == ([0, 16384, 32768], [5.61, 4.85, 4.47])
assert new.final_val() == (8, 4.47)
means, step_s, n = new.phase_means()
assert n == 8 and abs(sum(means.values()) - step_s) < 1e-9, (means, step_s)
old = plot_run.Run("old", "old", plot_run.load_records(os.path.join(work, "old", "metrics.jsonl")))
assert not old.has_tokens and old.phase_means() is None and old.final_val() == (5, 4.9)
print("fixtures load as expected")
EOF
    run_plot "$WORK/new"
    expect_rc 0
    expect_printed "$WORK/new/run.png"
    check_png "$WORK/new/run.png"
    run_plot "$WORK/old/metrics.jsonl" -o "$WORK/old.png"
    expect_rc 0
    check_png "$WORK/old.png"
    # Default output for several runs: ./runs.png (the working directory is $WORK).
    run_plot "$WORK/new" "$WORK/old" --smooth 3
    expect_rc 0
    expect_printed "runs.png"
    check_png "$WORK/runs.png"

    # Errors: one line naming the file, non-zero exit, no PNG.
    run_plot "$WORK/missing" -o "$WORK/err.png"
    expect_plot_error "$WORK/missing/metrics.jsonl"
    mkdir -p "$WORK/empty" "$WORK/bad" "$WORK/nosteps"
    : >"$WORK/empty/metrics.jsonl"
    run_plot "$WORK/new" "$WORK/empty" -o "$WORK/err.png"
    expect_plot_error "$WORK/empty/metrics.jsonl" "empty"
    write_new_fixture "$WORK/bad/metrics.jsonl"
    sed -i '4s/.*/{"step":3,"loss":5.02,/' "$WORK/bad/metrics.jsonl"
    run_plot "$WORK/bad" -o "$WORK/err.png"
    expect_plot_error "$WORK/bad/metrics.jsonl:4:" "malformed"
    # A run still writing: an unfinished last line (no newline) is skipped, the rest plotted.
    mkdir -p "$WORK/live"
    write_new_fixture "$WORK/live/metrics.jsonl"
    printf '{"step":99,"loss":5.0' >>"$WORK/live/metrics.jsonl"
    run_plot "$WORK/live" -o "$WORK/live.png"
    expect_rc 0
    check_png "$WORK/live.png"
    grep -q "unfinished last line" "$ERR" || fail "no note about the unfinished last line"
    echo '{"step":0,"val_loss":5.5}' >"$WORK/nosteps/metrics.jsonl"
    run_plot "$WORK/nosteps" -o "$WORK/err.png"
    expect_plot_error "$WORK/nosteps/metrics.jsonl" "no step lines"
    if [ -e "$WORK/err.png" ]; then fail "a PNG was written despite the error"; fi
    run_plot "$WORK/new" -o "$WORK/no_such_dir/x.png"
    expect_plot_error "$WORK/no_such_dir/x.png"
    ;;
  *)
    echo "plot.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
