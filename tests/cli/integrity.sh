#!/usr/bin/env bash
# tests/cli/integrity.sh: corrupted, mixed or incompatible checkpoints are refused, never
# loaded and never changed (docs/checkpoint.md "Integrity" and "Resume checks").
#
#   bash tests/cli/integrity.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# Environment (set by tests/test_cli.cmake): FSDP_MERGE (fsdp_merge) and FSDP_H5_POKE
# (tests/cli/h5_poke.cpp: sets an HDF5 attribute, prints a dataset's byte offset).
# Every case trains tiny.toml at 2 ranks for 2 steps, damages or changes something, then
# checks the exit code, the one error line and that the checkpoints directory is
# byte-for-byte what it was (sha256 of every file).
#
# CASE shard_from_other_step  step 1's shard 1 copied over step 2's: --resume exits 2 naming
#                             both files (no hang: rank 0 checks every shard first).
# CASE flipped_byte           one byte inside a dataset flipped: --resume and fsdp_merge exit
#                             2 naming the file and the tensor; fsdp_merge writes nothing.
# CASE resume_changed_key     --resume with model.n_head, model.layer_norm_epsilon or
#                             train.seed changed exits 2 naming the key; train.max_steps may change.
# CASE bad_step_attr          root attribute step = -5 or 2^62: exit 2 naming file and attribute.
# CASE max_steps_below        train.max_steps below the checkpoint's step: exit 2; equal: exit 0,
#                             "nothing to train", nothing written.
# CASE garbage_latest         binary bytes in checkpoints/latest: exit 2, printed escaped.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

FSDP_MERGE=${FSDP_MERGE:-$(dirname "$FSDP_TRAIN")/fsdp_merge}
FSDP_H5_POKE=${FSDP_H5_POKE:-$(dirname "$FSDP_TRAIN")/tests/fsdp_h5_poke}
CK=$WORK/run/checkpoints

# expect_unchanged BEFORE: the checkpoints directory still has snapshot BEFORE.
expect_unchanged() {
  local after
  after=$(snapshot "$CK")
  if [ "$1" != "$after" ]; then
    fail "the refused command changed $CK:"$'\n'"$(diff <(echo "$1") <(echo "$after"))"
  fi
}

# train_two_steps [ARGS...]: 2 steps at 2 ranks into $WORK/run, with ARGS; must succeed.
train_two_steps() {
  tiny_config tiny.toml
  run_train tiny.toml --set train.max_steps=2 "$@"
  expect_rc 0
  if [ ! -f "$CK/step_00000002/shard_00001-of-00002.h5" ]; then fail "no step 2 checkpoint"; finish; fi
}

# flip_byte FILE OFFSET: xor one byte of FILE with 0x10.
flip_byte() {
  python3 - "$1" "$2" <<'PY'
import sys
path, off = sys.argv[1], int(sys.argv[2])
with open(path, "r+b") as f:
    f.seek(off); b = f.read(1)[0]
    f.seek(off); f.write(bytes([b ^ 0x10]))
PY
}

case "$CASE" in
  shard_from_other_step)
    train_two_steps --set checkpoint.every=1
    cp "$CK/step_00000001/shard_00001-of-00002.h5" "$CK/step_00000002/shard_00001-of-00002.h5"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$CK/step_00000002/shard_00001-of-00002.h5: step 1 differs from" \
      "$CK/step_00000002/shard_00000-of-00002.h5 (step 2)"
    expect_unchanged "$before"
    ;;
  flipped_byte)
    train_two_steps
    file=$CK/step_00000002/shard_00000-of-00002.h5
    off=$("$FSDP_H5_POKE" offset "$file" /units/1/param) || { fail "fsdp_h5_poke offset failed"; finish; }
    flip_byte "$file" $((off + 13))
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$file: tensor /units/1/param (unit " "checksum mismatch (stored " \
      "the file is corrupted"
    expect_unchanged "$before"
    timeout 60 "$FSDP_MERGE" "$CK/step_00000002" "$WORK/hf" >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_rc 2
    expect_one_error fsdp_merge "$file: tensor /units/1/param (unit " "checksum mismatch"
    if [ -e "$WORK/hf" ]; then fail "fsdp_merge wrote $WORK/hf for a corrupted checkpoint"; fi
    expect_unchanged "$before"
    ;;
  resume_changed_key)
    train_two_steps
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --set model.n_head=4 --resume
    expect_input_error "--resume: model.n_head differs (checkpoint has 2, config has 4)" "$CK/step_00000002"
    expect_unchanged "$before"
    run_train tiny.toml --set train.max_steps=3 --set model.layer_norm_epsilon=1e-6 --resume
    expect_input_error "--resume: model.layer_norm_epsilon differs (checkpoint has "
    expect_unchanged "$before"
    run_train tiny.toml --set train.max_steps=3 --set train.seed=99 --resume
    expect_input_error "--resume: train.seed differs (checkpoint has 1234, config has 99)"
    expect_unchanged "$before"
    # Keys in the may-change list are accepted: more steps, another log and eval cadence.
    run_train tiny.toml --set train.max_steps=3 --set train.log_every=2 --set eval.every=1 --resume
    expect_rc 0
    if ! grep -q "resumed from step 2" "$OUT"; then fail "no 'resumed from step 2' line"; fi
    if [ ! -d "$CK/step_00000003" ]; then fail "no step_00000003 after the accepted resume"; fi
    ;;
  bad_step_attr)
    train_two_steps
    "$FSDP_H5_POKE" set-i64 "$CK/step_00000002/shard_00001-of-00002.h5" / step -5 || fail "poke failed"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$CK/step_00000002/shard_00001-of-00002.h5: root attribute step = -5 is out of range"
    expect_unchanged "$before"
    "$FSDP_H5_POKE" set-i64 "$CK/step_00000002/shard_00000-of-00002.h5" / step 4611686018427387904 || fail "poke failed"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$CK/step_00000002/shard_00000-of-00002.h5: root attribute step = 4611686018427387904 is out of range"
    expect_unchanged "$before"
    ;;
  max_steps_below)
    train_two_steps
    before=$(snapshot "$WORK/run")
    run_train tiny.toml --set train.max_steps=1 --resume
    expect_input_error "train.max_steps = 1 is below the checkpoint's step 2" "$CK/step_00000002"
    if [ "$before" != "$(snapshot "$WORK/run")" ]; then fail "the refused run changed $WORK/run"; fi
    # Equal: nothing to do, exit 0, and not a byte written (metrics.jsonl included).
    run_train tiny.toml --set train.max_steps=2 --resume
    expect_rc 0
    if ! grep -q "nothing to train: checkpoint is at step 2 = train.max_steps" "$OUT"; then
      fail "no 'nothing to train' line"
    fi
    if grep -q "^step " "$OUT"; then fail "a training step ran"; fi
    if [ "$before" != "$(snapshot "$WORK/run")" ]; then fail "the run directory changed"; fi
    ;;
  garbage_latest)
    train_two_steps
    printf '\x7fELF\x02\x01\x01\x00\x1b[2J\xff\xfe%0300d\n' 0 >"$CK/latest"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$CK/latest: invalid content \"\\x7fELF\\x02\\x01\\x01\\x00\\x1b[2J\\xff\\xfe000" \
      "...\" (expected one line such as step_00000100)"
    if LC_ALL=C grep -q '[^ -~]' "$ERR"; then fail "stderr holds unescaped bytes"; fi
    expect_unchanged "$before"
    ;;
  *)
    echo "integrity.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
