#!/usr/bin/env bash
# tests/cli/run_dir.sh: what fsdp_train does with its run_dir: an earlier run's checkpoints,
# the run_dir lock (docs/checkpoint.md "The run directory"), unwritable paths, resuming.
#
#   bash tests/cli/run_dir.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE refuse_fresh_run: a second run without --resume into a run_dir with checkpoints stops
#   with exit code 2 naming train.run_dir, and leaves the checkpoint, `latest` and
#   metrics.jsonl byte-for-byte as they were.
# CASE resume: on an HDF5 token file, 3 steps (metrics.jsonl ending in an unfinished line,
#   as if the run died writing it: cut off by the resume, saying so), then --resume with
#   max_steps = 5, gives the same metrics (loss, lr,
#   grad_norm, val_loss) as one uninterrupted 5-step run, appends to metrics.jsonl and writes
#   step_00000005. The resume state is only the global step plus the sharded parameters and
#   optimizer state (docs/data.md), so the continued run must match the uninterrupted one.
# CASE second_run_refused: while run A trains (its lock line "host H pid P started T" in
#   run/fsdp_train.lock), run B into the same run_dir exits 2 on every rank with one line
#   naming the run_dir and A's pid, and leaves A's lock line as it was.
# CASE stale_lock_taken_over: a lock file left by a dead run (content, no flock) is taken over
#   with the log line "taking over the stale lock of host H pid P (started T)"; the run
#   succeeds and leaves the lock file empty (released).
# CASE refuse_step_dirs_without_latest: a fresh run into a run_dir with a step directory but
#   no `latest` exits 2 naming it, and changes nothing.
# CASE refuse_metrics_only: likewise for a run_dir holding only a non-empty metrics.jsonl;
#   an empty metrics.jsonl and a released lock file do not count (the run goes ahead).
# CASE checkpoints_unwritable_at_start: run_dir/checkpoints a regular file stops the run at
#   start with exit 2 naming the path, before any step.
# CASE checkpoints_read_only_fs: likewise for a read-only tmpfs mounted on checkpoints/ (root
#   cannot be stopped by chmod); needs mount: exit 77 (ctest: skipped) where it is not
#   permitted.
# CASE resume_auto_fresh: --resume=auto into an empty run_dir starts fresh (log line
#   "--resume auto: no checkpoint"), trains and writes its checkpoint.
# CASE resume_auto_continues: --resume=auto into a run_dir with a checkpoint (which a fresh
#   run refuses) resumes from it like --resume ("resumed from step 2"), appends to
#   metrics.jsonl and writes step_00000004 (written `--resume auto`, the spaced form);
#   --resume=maybe is a command-line error.
# CASE save_total_limit: checkpoint.save_total_limit = 2 with a save every step (async saves)
#   leaves the two newest checkpoints, logging each removal; a --resume with limit 3 (sync
#   saves) keeps three, removes an interrupted removal's leftover step_N.deleting and leaves
#   a step directory above `latest` (a rewound latest) alone.
# CASE not_shared: a relative run_dir from two working directories (as node-local disks would
#   be): rank 1 does not see rank 0's directory, so the run stops at start with exit 2 naming
#   train.run_dir and the probe file, before any step; rank 0's probe is removed. With
#   checkpoint.enable = false the run goes ahead (only rank 0 writes there).
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

case "$CASE" in
  not_shared)
    tiny_config cfg.toml
    mkdir a b
    on_two_dirs() {
      timeout 60 "$MPIEXEC" --oversubscribe --bind-to none \
        -np 1 --wdir "$WORK/a" "$FSDP_TRAIN" "$WORK/cfg.toml" --set 'train.run_dir="run"' "$@" \
        : -np 1 --wdir "$WORK/b" "$FSDP_TRAIN" "$WORK/cfg.toml" --set 'train.run_dir="run"' "$@" \
        >"$OUT" 2>"$ERR" </dev/null
      RC=$?
    }
    on_two_dirs
    expect_input_error "train.run_dir: rank 1 on" "does not see rank 0's run directory run" \
      "run/checkpoints/.shared_probe." "a file system every node shares"
    if [ -e "$WORK/a/run/metrics.jsonl" ] || [ -e "$WORK/b/run" ]; then
      fail "the refused run started: $(find "$WORK/a" "$WORK/b")"
    fi
    if compgen -G "$WORK/a/run/checkpoints/.shared_probe.*" >/dev/null; then
      fail "rank 0's probe file was left behind"
    fi
    rm -rf "$WORK/a/run"
    on_two_dirs --set checkpoint.enable=false
    expect_rc 0
    if [ ! -s "$WORK/a/run/metrics.jsonl" ]; then
      fail "the run without checkpoints wrote no metrics"
    fi
    ;;
  refuse_fresh_run)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2
    expect_rc 0
    if [ ! -f "$WORK/run/checkpoints/latest" ]; then fail "first run wrote no checkpoint"; finish; fi
    before=$(snapshot "$WORK/run")
    run_train tiny.toml --set train.max_steps=2
    expect_input_error "train.run_dir" "$WORK/run" "--resume"
    after=$(snapshot "$WORK/run")
    if [ "$before" != "$after" ]; then
      fail "the refused run changed $WORK/run:"$'\n'"$(diff <(echo "$before") <(echo "$after"))"
    fi
    ;;
  save_total_limit)
    tiny_config tiny.toml
    ck=$WORK/run/checkpoints
    run_train tiny.toml --set train.max_steps=4 --set optim.decay_steps=6 --set checkpoint.every=1 \
      --set checkpoint.async_save=true --set checkpoint.save_total_limit=2
    expect_rc 0
    left=$(cd "$ck" 2>/dev/null && ls | tr '\n' ' ')
    if [ "$left" != "latest step_00000003 step_00000004 " ]; then fail "checkpoints/ holds '$left'"; fi
    for s in 1 2; do
      if ! grep -qx "checkpoint: removed step_0000000$s (checkpoint.save_total_limit = 2)" "$OUT"; then
        fail "no removal line for step $s"
      fi
    done
    mkdir -p "$ck/step_00000002.deleting/x" && echo partial >"$ck/step_00000002.deleting/x/f"
    mkdir -p "$ck/step_00000009" && echo rewound >"$ck/step_00000009/f"
    run_train tiny.toml --set train.max_steps=6 --set optim.decay_steps=6 --set checkpoint.every=1 \
      --set checkpoint.save_total_limit=3 --resume
    expect_rc 0
    if ! grep -q "resumed from step 4" "$OUT"; then fail "no 'resumed from step 4' line"; fi
    left=$(cd "$ck" 2>/dev/null && ls | tr '\n' ' ')
    if [ "$left" != "latest step_00000004 step_00000005 step_00000006 step_00000009 " ]; then
      fail "checkpoints/ holds '$left' after the resumed run"
    fi
    if [ "$(tr -d '[:space:]' <"$ck/latest")" != step_00000006 ]; then fail "latest is not step 6"; fi
    if [ -s "$ERR" ] && grep -q warning "$ERR"; then fail "warnings: $(cat "$ERR")"; fi
    ;;
  resume_auto_fresh)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2 --resume=auto
    expect_rc 0
    if ! grep -q -- "--resume auto: no checkpoint in $WORK/run/checkpoints, starting fresh" "$OUT"; then
      fail "no '--resume auto: no checkpoint ... starting fresh' line"
    fi
    if grep -q "resumed from step" "$OUT"; then fail "a fresh auto run says it resumed"; fi
    if [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest" 2>/dev/null)" != step_00000002 ]; then
      fail "latest does not name step_00000002"
    fi
    ;;
  resume_auto_continues)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2 --set optim.decay_steps=4
    expect_rc 0
    run_train tiny.toml --set train.max_steps=4 --set optim.decay_steps=4 --resume auto
    expect_rc 0
    if ! grep -q "resumed from step 2" "$OUT"; then fail "no 'resumed from step 2' line"; fi
    if [ ! -d "$WORK/run/checkpoints/step_00000004" ]; then fail "no step_00000004 after auto resume"; fi
    steps=$(python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1]) if l.strip()))' "$WORK/run/metrics.jsonl")
    if [ "$steps" != "1 2 3 4" ]; then fail "metrics.jsonl steps '$steps', expected '1 2 3 4'"; fi
    run_train tiny.toml --set train.max_steps=4 --resume=maybe
    expect_input_error "--resume" "maybe"
    ;;
  second_run_refused)
    # A: many steps on an HDF5 file (memory does not grow with max_steps), nothing logged
    # after the banner. Its stdout comes through a FIFO: the banner is printed after the lock
    # is taken, so reading up to it is the synchronisation (no sleeps, bounded by read -t).
    make_text_dir "$WORK/text"
    "$FSDP_PREPARE" -o "$WORK/tokens.h5" --val-fraction 0.2 "$WORK/text" >/dev/null ||
      { fail "fsdp_prepare failed"; finish; }
    tiny_config tiny.toml
    sed -i "s|^source = .*|source = \"hdf5\"\npath = \"$WORK/tokens.h5\"|" tiny.toml
    mkfifo "$WORK/a.out"
    timeout 120 "$MPIEXEC" -np 2 --oversubscribe --bind-to none "$FSDP_TRAIN" tiny.toml \
      --set train.max_steps=1000000 --set train.log_every=1000000 \
      >"$WORK/a.out" 2>"$WORK/a.err" </dev/null &
    a_pid=$!
    exec 3<"$WORK/a.out"
    seen=0
    for _ in $(seq 200); do
      IFS= read -r -t 60 -u 3 line || break
      case "$line" in data:*) seen=1; break ;; esac
    done
    if [ "$seen" -ne 1 ]; then fail "run A printed no banner"; kill "$a_pid"; finish; fi
    cat <&3 >/dev/null &   # keep draining A's stdout
    drain=$!
    holder=$(cat "$WORK/run/fsdp_train.lock")
    echo "lock line of A: $holder"
    if ! [[ "$holder" =~ ^host\ [^\ ]+\ pid\ ([0-9]+)\ started\ [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$ ]]; then
      fail "lock line '$holder' is not 'host H pid P started T'"
    fi
    a_rank0=${BASH_REMATCH[1]:-unknown}
    run_train tiny.toml --set train.max_steps=2
    expect_input_error "train.run_dir" "$WORK/run" "is in use by another fsdp_train run" "pid $a_rank0" "started "
    if [ "$(cat "$WORK/run/fsdp_train.lock")" != "$holder" ]; then fail "run B changed A's lock line"; fi
    if ! kill -0 "$a_pid" 2>/dev/null; then fail "run A is not running any more (it should be)"; fi
    kill -TERM "$a_pid" 2>/dev/null
    wait "$a_pid" 2>/dev/null
    kill "$drain" 2>/dev/null
    exec 3<&-
    ;;
  stale_lock_taken_over)
    mkdir -p "$WORK/run"
    stale="host deadhost pid 999999 started 2026-01-02T03:04:05Z"
    echo "$stale" >"$WORK/run/fsdp_train.lock"
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2
    expect_rc 0
    if ! grep -qF "taking over the stale lock of host deadhost pid 999999 (started 2026-01-02T03:04:05Z)" "$OUT"; then
      fail "no 'taking over the stale lock' line"
    fi
    if [ -s "$WORK/run/fsdp_train.lock" ]; then fail "the lock file was not emptied at exit"; fi
    if [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")" != step_00000002 ]; then
      fail "the run after the takeover wrote no step_00000002"
    fi
    ;;
  refuse_step_dirs_without_latest)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2
    expect_rc 0
    rm -f "$WORK/run/checkpoints/latest"
    before=$(snapshot "$WORK/run")
    run_train tiny.toml --set train.max_steps=2
    expect_input_error "train.run_dir" "$WORK/run" "step_00000002" "--resume"
    after=$(snapshot "$WORK/run")
    if [ "$before" != "$after" ]; then
      fail "the refused run changed $WORK/run:"$'\n'"$(diff <(echo "$before") <(echo "$after"))"
    fi
    ;;
  refuse_metrics_only)
    tiny_config tiny.toml
    mkdir -p "$WORK/run"
    printf '{"step":1,"loss":5.5}\n' >"$WORK/run/metrics.jsonl"
    before=$(snapshot "$WORK/run")
    run_train tiny.toml --set train.max_steps=2
    expect_input_error "train.run_dir" "$WORK/run" "metrics.jsonl" "--resume"
    after=$(snapshot "$WORK/run")
    if [ "$before" != "$after" ]; then
      fail "the refused run changed $WORK/run:"$'\n'"$(diff <(echo "$before") <(echo "$after"))"
    fi
    if [ -s "$WORK/run/fsdp_train.lock" ]; then fail "the refused run left its lock line"; fi
    # An empty metrics.jsonl and a released (empty) lock file are no earlier run.
    : >"$WORK/run/metrics.jsonl"
    : >"$WORK/run/fsdp_train.lock"
    run_train tiny.toml --set train.max_steps=2
    expect_rc 0
    if [ "$(wc -l <"$WORK/run/metrics.jsonl")" -ne 2 ]; then fail "metrics.jsonl does not hold 2 lines"; fi
    ;;
  checkpoints_unwritable_at_start)
    tiny_config tiny.toml
    mkdir -p "$WORK/run"
    echo "not a directory" >"$WORK/run/checkpoints"
    run_train tiny.toml --set train.max_steps=2 --set eval.on_start=true
    expect_input_error "train.run_dir" "$WORK/run/checkpoints"
    if grep -q "^step " "$OUT"; then fail "a step or evaluation ran before the refusal"; fi
    if [ "$(cat "$WORK/run/checkpoints")" != "not a directory" ]; then fail "run/checkpoints was changed"; fi
    if [ -e "$WORK/run/metrics.jsonl" ]; then fail "metrics.jsonl was created"; fi
    ;;
  checkpoints_read_only_fs)
    tiny_config tiny.toml
    mkdir -p "$WORK/run/checkpoints"
    if ! mount -t tmpfs -o ro,size=64k tmpfs "$WORK/run/checkpoints" 2>/dev/null; then
      echo "checkpoints_read_only_fs: SKIPPED: mounting a tmpfs is not permitted here"
      rm -rf "$WORK"
      exit 77
    fi
    trap 'umount "$WORK/run/checkpoints" 2>/dev/null; rm -rf "$WORK"' EXIT
    run_train tiny.toml --set train.max_steps=2
    expect_input_error "train.run_dir" "$WORK/run/checkpoints" "Read-only file system"
    if grep -q "^step " "$OUT"; then fail "a step ran before the refusal (read-only checkpoints/)"; fi
    umount "$WORK/run/checkpoints"
    ;;
  resume)
    # HDF5 data: a synthetic stream's length depends on train.max_steps (see trainer.cpp
    # open_data), which would change the batches between the two runs.
    make_text_dir "$WORK/text"
    "$FSDP_PREPARE" -o "$WORK/tokens.h5" --val-fraction 0.2 "$WORK/text" >/dev/null ||
      { fail "fsdp_prepare failed"; finish; }
    tiny_config tiny.toml
    sed -i "s|^source = .*|source = \"hdf5\"\npath = \"$WORK/tokens.h5\"|" tiny.toml
    # Reference: 5 uninterrupted steps in run_ref.
    run_train tiny.toml --set train.run_dir="$WORK/run_ref"
    expect_rc 0
    # Interrupted: 3 steps (final checkpoint at 3), then resume to 5. Same max_steps for the
    # lr schedule: optim.decay_steps pins the cosine end so both runs share one schedule.
    run_train tiny.toml --set train.max_steps=3 --set optim.decay_steps=5
    expect_rc 0
    # The interrupted run died while writing a line (no newline): the resume cuts it off
    # instead of appending its lines to it (which made one malformed line of two).
    printf '{"step": 4, "loss": 5.5' >>"$WORK/run/metrics.jsonl"
    run_train tiny.toml --set train.max_steps=5 --set optim.decay_steps=5 --resume
    expect_rc 0
    if ! grep -q "resumed from step 3" "$OUT"; then fail "no 'resumed from step 3' line"; fi
    if ! grep -q "metrics.jsonl: cut off an unfinished last line of 23 bytes" "$OUT"; then
      fail "no line about the unfinished metrics line cut off"
    fi
    if [ ! -d "$WORK/run/checkpoints/step_00000005" ]; then fail "no step_00000005 after resume"; fi
    if [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")" != step_00000005 ]; then
      fail "latest does not name step_00000005 after resume"
    fi
    if [ ! -d "$WORK/run/checkpoints/step_00000003" ]; then fail "step_00000003 was removed"; fi
    python3 - "$WORK/run_ref/metrics.jsonl" "$WORK/run/metrics.jsonl" <<'EOF' || fail "resumed metrics differ"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
got = [json.loads(l) for l in open(sys.argv[2]).read().splitlines()]
assert [r["step"] for r in got] == [1, 2, 3, 4, 5], [r["step"] for r in got]
# Steps 1-3 of the interrupted run evaluate at step 3 (its last step); the reference does not.
for r, g in zip(ref, got):
    for k in ("loss", "lr", "grad_norm"):
        assert abs(r[k] - g[k]) <= 1e-6 * max(1.0, abs(r[k])), (r["step"], k, r[k], g[k])
assert "val_loss" in got[2] and "val_loss" in got[4], got
assert abs(ref[4]["val_loss"] - got[4]["val_loss"]) <= 1e-6 * abs(ref[4]["val_loss"]), (ref[4], got[4])
EOF
    ;;
  *)
    echo "run_dir.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
