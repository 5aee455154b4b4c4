#!/usr/bin/env bash
# tests/cli/run_dir.sh: what fsdp_train does with a run_dir that already holds checkpoints.
#
#   bash tests/cli/run_dir.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE refuse_fresh_run: a second run without --resume into a run_dir with checkpoints stops
#   with exit code 2 naming train.run_dir, and leaves the checkpoint, `latest` and
#   metrics.jsonl byte-for-byte as they were.
# CASE resume: on an HDF5 token file, 3 steps, then --resume with max_steps = 5, gives the same metrics (loss, lr,
#   grad_norm, val_loss) as one uninterrupted 5-step run, appends to metrics.jsonl and writes
#   step_00000005. The resume state is only the global step plus the sharded parameters and
#   optimizer state (docs/data.md), so the continued run must match the uninterrupted one.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# snapshot DIR: checksums of every file under DIR, sorted by path.
snapshot() {
  (cd "$1" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
}

case "$CASE" in
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
    run_train tiny.toml --set train.max_steps=5 --set optim.decay_steps=5 --resume
    expect_rc 0
    if ! grep -q "resumed from step 3" "$OUT"; then fail "no 'resumed from step 3' line"; fi
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
