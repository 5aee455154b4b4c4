#!/usr/bin/env bash
# tests/cli/async_save.sh: checkpoint.async_save (docs/checkpoint.md "Asynchronous saves").
#
#   bash tests/cli/async_save.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#   (environment: FSDP_MERGE, the fsdp_merge executable)
#
# CASE same_as_sync: the tiny model, 6 steps, checkpoint.every = 2, once with synchronous
#   and once with asynchronous saves. Both runs log bit-identical losses; steps 2 and 4 were
#   saved in the background (a "staged" and a "committed" line each) and merge (fsdp_merge:
#   every shard present, every checksum verified) into byte-identical model.safetensors;
#   a resume from the async step_00000004 to step 6 gives the losses of the uninterrupted
#   run bit for bit (so the optimizer state saved in the background is the same too).
# CASE sigkill_during_write: a larger model saving every step in the background; once a
#   step_*.tmp directory exists (a save in flight: polled, bounded), rank 1 gets SIGKILL.
#   The job fails; `latest` names a step directory that fsdp_merge accepts as complete
#   (all shards, all checksums) and --resume from it trains on.
# CASE signal_with_save_in_flight: saves every step in the background; SIGUSR1 to rank 0:
#   exit code 3, `latest` names the stopped step (saved synchronously), the previous step's
#   background save was committed as well, no temporary is left, and --resume trains on.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

MERGE=${FSDP_MERGE:-$(dirname "$FSDP_TRAIN")/fsdp_merge}
BG=""
cleanup() {
  if [ -n "$BG" ] && kill -0 "$BG" 2>/dev/null; then kill -KILL "$BG" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# losses FILE [FIRST]: "step loss" per metrics line from step FIRST on (JSON numbers as
# written: bit-identical values print identically).
losses() {
  python3 - "$1" "${2:-1}" <<'PY'
import json, sys
for l in open(sys.argv[1]).read().splitlines():
    r = json.loads(l)
    if r["step"] >= int(sys.argv[2]):
        print(r["step"], repr(r["loss"]), repr(r["grad_norm"]))
PY
}

# same_tensors A B: two model.safetensors hold the same tensors (names, dtypes, shapes,
# offsets) and byte-identical data; the header's __metadata__ (it names the source directory)
# is ignored.
same_tensors() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    header.pop("__metadata__", None)
    return header, b[8 + n:]
ha, da = load(sys.argv[1])
hb, db = load(sys.argv[2])
assert ha == hb, "headers differ"
assert len(da) > 0 and da == db, "tensor data differs"
PY
}

tiny_config tiny.toml
COMMON=(--set train.max_steps=6 --set optim.decay_steps=6 --set checkpoint.every=2)

case "$CASE" in
  same_as_sync)
    run_train tiny.toml "${COMMON[@]}" --set checkpoint.async_save=false --set train.run_dir="$WORK/sync"
    expect_rc 0
    if grep -q "writing in the background" "$OUT"; then fail "a synchronous run saved in the background"; fi
    run_train tiny.toml "${COMMON[@]}" --set checkpoint.async_save=true
    expect_rc 0
    for s in 2 4; do
      grep -q "^checkpoint: $WORK/run/checkpoints/step_0000000$s staged in .* ms; writing in the background\$" "$OUT" ||
        fail "no 'staged' line for step $s"
      grep -q "^checkpoint: $WORK/run/checkpoints/step_0000000$s (committed at step [0-9]*," "$OUT" ||
        fail "no 'committed' line for step $s"
    done
    # The final save (step 6) is synchronous.
    grep -q "^checkpoint: $WORK/run/checkpoints/step_00000006 ([0-9.]* ms)\$" "$OUT" || fail "step 6 not saved synchronously"
    [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")" = step_00000006 ] || fail "latest is not step_00000006"
    if [ -n "$(find "$WORK/run" -name '*.tmp')" ]; then fail "temporaries left: $(find "$WORK/run" -name '*.tmp')"; fi
    [ "$(losses "$WORK/sync/metrics.jsonl")" = "$(losses "$WORK/run/metrics.jsonl")" ] ||
      fail "async and sync runs logged different losses"
    for s in 2 4 6; do
      d=step_0000000$s
      "$MERGE" "$WORK/sync/checkpoints/$d" "$WORK/merged_sync_$s" >/dev/null 2>"$WORK/merge.err" || fail "fsdp_merge sync $d: $(cat "$WORK/merge.err")"
      "$MERGE" "$WORK/run/checkpoints/$d" "$WORK/merged_async_$s" >/dev/null 2>"$WORK/merge.err" || fail "fsdp_merge async $d: $(cat "$WORK/merge.err")"
      same_tensors "$WORK/merged_sync_$s/model.safetensors" "$WORK/merged_async_$s/model.safetensors" ||
        fail "$d: parameters saved asynchronously differ from the synchronous save"
    done
    # Resume from the async-saved step 4 (a run directory holding only that checkpoint).
    mkdir -p "$WORK/resume/checkpoints"
    cp -r "$WORK/run/checkpoints/step_00000004" "$WORK/resume/checkpoints/"
    echo step_00000004 >"$WORK/resume/checkpoints/latest"
    run_train tiny.toml "${COMMON[@]}" --set checkpoint.async_save=true --set train.run_dir="$WORK/resume" --resume
    expect_rc 0
    grep -q "resumed from step 4\$" "$OUT" || fail "no 'resumed from step 4' line"
    [ "$(losses "$WORK/sync/metrics.jsonl" 5)" = "$(losses "$WORK/resume/metrics.jsonl" 5)" ] ||
      fail "resumed from the async step 4: losses differ from the uninterrupted run:"$'\n'"$(losses "$WORK/sync/metrics.jsonl" 5)"$'\n'"$(losses "$WORK/resume/metrics.jsonl" 5)"
    ;;
  sigkill_during_write)
    # 4 layers x 128 wide: ~0.8 M parameters, a few MB of shard file per rank and save.
    timeout 120 "$MPIEXEC" -np 2 --oversubscribe --bind-to none "$FSDP_TRAIN" tiny.toml \
      --set model.n_layer=4 --set model.n_embd=128 --set model.n_head=4 \
      --set train.max_steps=100000 --set optim.decay_steps=100000 --set train.log_every=100000 \
      --set checkpoint.every=1 --set checkpoint.async_save=true >"$OUT" 2>"$ERR" </dev/null &
    BG=$!
    committed() { [ -f "$WORK/run/checkpoints/latest" ]; }
    in_flight() { compgen -G "$WORK/run/checkpoints/step_*.tmp" >/dev/null; }
    wait_for 60 committed || { fail "no checkpoint committed within 60 s"; finish; }
    wait_for 30 in_flight || { fail "no save in flight (step_*.tmp) within 30 s"; finish; }
    mpirun_pid=$(pgrep -P "$BG" | head -n 1)
    pid=""
    for p in $(pgrep -P "$mpirun_pid"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then pid=$p; fi
    done
    [ -n "$pid" ] || { fail "no process of rank 1 under mpirun $mpirun_pid"; finish; }
    echo "in flight: $(cd "$WORK/run/checkpoints" && echo step_*.tmp); SIGKILL to rank 1 (pid $pid)"
    kill -KILL "$pid"
    wait "$BG"
    RC=$?
    BG=""
    if [ "$RC" -eq 0 ] || [ "$RC" -eq 124 ]; then fail "exit code $RC after SIGKILL, expected a failure"; fi
    name=$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")
    echo "latest: $name; left: $(cd "$WORK/run/checkpoints" && echo *)"
    [[ "$name" =~ ^step_[0-9]{8}$ ]] || { fail "latest holds '$name'"; finish; }
    "$MERGE" "$WORK/run/checkpoints/$name" "$WORK/merged" >/dev/null 2>"$WORK/merge.err" ||
      fail "latest ($name) is not a complete checkpoint: $(cat "$WORK/merge.err")"
    step=$((10#${name#step_}))
    run_train tiny.toml --set model.n_layer=4 --set model.n_embd=128 --set model.n_head=4 \
      --set train.max_steps=$((step + 2)) --set optim.decay_steps=100000 --set train.log_every=100000 \
      --set checkpoint.every=1 --set checkpoint.async_save=true --resume
    expect_rc 0
    grep -q "resumed from step $step\$" "$OUT" || fail "no 'resumed from step $step' line"
    [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")" = "$(printf 'step_%08d' $((step + 2)))" ] ||
      fail "the resumed run did not publish step $((step + 2))"
    ;;
  signal_with_save_in_flight)
    # checkpoint.every = 1 with async saves: a save is pending at almost every boundary. A
    # SIGUSR1 to rank 0 finishes (commits) it, then saves the stopped step synchronously.
    timeout 120 "$MPIEXEC" -np 2 --oversubscribe --bind-to none "$FSDP_TRAIN" tiny.toml \
      --set train.max_steps=100000 --set optim.decay_steps=100000 \
      --set checkpoint.every=1 --set checkpoint.async_save=true >"$OUT" 2>"$ERR" </dev/null &
    BG=$!
    steps_logged() { [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l <"$WORK/run/metrics.jsonl")" -ge 4 ]; }
    wait_for 60 steps_logged || { fail "the run did not log 4 steps within 60 s"; finish; }
    mpirun_pid=$(pgrep -P "$BG" | head -n 1)
    pid=""
    for p in $(pgrep -P "$mpirun_pid"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then pid=$p; fi
    done
    [ -n "$pid" ] || { fail "no process of rank 0 under mpirun $mpirun_pid"; finish; }
    kill -USR1 "$pid"
    wait "$BG"
    RC=$?
    BG=""
    expect_rc 3
    line=$(grep "^fsdp_train: received SIGUSR1 on rank 0" "$ERR")
    [[ "$line" =~ at\ step\ ([0-9]+)\; ]] || { fail "no stop line: $line"; finish; }
    step=${BASH_REMATCH[1]}
    [ "$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")" = "$(printf 'step_%08d' "$step")" ] ||
      fail "latest does not name the stopped step $step"
    # The save in flight when the signal came was committed too (step - 1), and nothing is left.
    [ -d "$WORK/run/checkpoints/$(printf 'step_%08d' $((step - 1)))" ] || fail "step $((step - 1)) was not committed"
    if [ -n "$(find "$WORK/run" -name '*.tmp')" ]; then fail "temporaries left: $(find "$WORK/run" -name '*.tmp')"; fi
    run_train tiny.toml --set train.max_steps=$((step + 1)) --set optim.decay_steps=100000 --resume
    expect_rc 0
    grep -q "resumed from step $step\$" "$OUT" || fail "no 'resumed from step $step' line"
    ;;
  *)
    echo "async_save.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
