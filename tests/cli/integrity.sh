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
# CASE bad_step_attr          root attribute step = -5 or 2^62: exit 2 naming the file (the
#                             metadata checksum); resealed, naming the file and attribute.
# CASE max_steps_below        train.max_steps below the checkpoint's step: exit 2; equal: exit 0,
#                             "nothing to train", nothing written.
# CASE garbage_latest         binary bytes in checkpoints/latest: exit 2, printed escaped.
# CASE shard_from_other_run   a shard of a run differing only in optim.lr (same config
#                             fingerprint) copied into another run's step: --resume and
#                             fsdp_merge exit 2 naming the file and both run ids; nothing written.
# CASE run_id_kept_on_resume  every shard of a run carries its run_id, kept by --resume (also
#                             at 1 rank: another world size), with a new launch_id per start; a
#                             fresh run has another run_id.
# CASE tampered_metadata      one changed byte in a 1-rank checkpoint's model config (epsilon)
#                             or a unit's entry offset, or a changed scalar attribute: fsdp_merge
#                             and --resume exit 2 naming the file (metadata checksum); nothing
#                             written.
# CASE merge_into_checkpoints fsdp_merge STEP STEP (and STEP/hf, checkpoints/, checkpoints/hf):
#                             exit 2, one line, nothing written; run_dir/hf beside it is fine.
# CASE merge_concurrent       while another process holds OUT_DIR/.fsdp_merge.lock (util-linux
#                             flock(1), as a second fsdp_merge into OUT_DIR would), fsdp_merge
#                             exits 2 with one line naming OUT_DIR and the lock file; OUT_DIR's
#                             files are unchanged. Released (the holder leaves its file: a
#                             killed merge's leftover), it merges the same bytes and removes it.
# CASE merge_latest           fsdp_merge RUN_DIR, RUN_DIR/checkpoints and checkpoints/latest
#                             merge the step `latest` names (DeepSpeed's zero_to_fp32 reads its
#                             folder's `latest` so), saying so: the bytes of merging that step
#                             directory by name; `latest` set back to step 1 merges step 1; a
#                             run directory without checkpoints: exit 2, one line, no output.
# CASE resume_step            --resume=STEP continues from an earlier checkpoint (a step number
#                             or step directory): the redone steps' losses equal the first
#                             run's bit for bit, and `latest` names the chosen step until the
#                             run saves again. A damaged newest checkpoint: --resume exits 2
#                             naming the earlier ones and the --resume=STEP to use, which then
#                             continues. A step there is not, a directory of another run, an
#                             empty --resume= or a renamed step directory: exit 2, one line,
#                             nothing changed.
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

# run_merge STEP_DIR OUT_DIR: fsdp_merge; sets RC, OUT, ERR.
run_merge() {
  timeout 60 "$FSDP_MERGE" "$1" "$2" >"$OUT" 2>"$ERR" </dev/null
  RC=$?
}

# attr FILE NAME: the root string attribute NAME of a shard file.
attr() {
  "$FSDP_H5_POKE" get-str "$1" / "$2" || fail "fsdp_h5_poke get-str $1 $2 failed"
}

# edit_byte FILE REGEX: the one match of the Python bytes regex REGEX in FILE has the last
# byte of its group 1 (a digit) changed to another digit: one changed byte.
edit_byte() {
  python3 - "$1" "$2" <<'PY' || fail "edit_byte $1 '$2' failed"
import re, sys
path, pat = sys.argv[1], sys.argv[2].encode()
data = bytearray(open(path, "rb").read())
found = list(re.finditer(pat, data))
if len(found) != 1:
    sys.exit(f"{len(found)} matches of {pat!r} in {path}")
at = found[0].end(1) - 1
data[at] = ord("1") if data[at] != ord("1") else ord("2")
open(path, "r+b").write(data)
PY
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
    expect_input_error "$CK/step_00000002/shard_00001-of-00002.h5: metadata checksum mismatch" "the file is corrupted"
    expect_unchanged "$before"
    # Behind the checksum (a file whose checksum covers the bad value): the range check.
    "$FSDP_H5_POKE" reseal "$CK/step_00000002/shard_00001-of-00002.h5" || fail "reseal failed"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$CK/step_00000002/shard_00001-of-00002.h5: root attribute step = -5 is out of range"
    expect_unchanged "$before"
    "$FSDP_H5_POKE" set-i64 "$CK/step_00000002/shard_00000-of-00002.h5" / step 4611686018427387904 || fail "poke failed"
    "$FSDP_H5_POKE" reseal "$CK/step_00000002/shard_00000-of-00002.h5" || fail "reseal failed"
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
  shard_from_other_run)
    train_two_steps
    # Run B: the same config but optim.lr (a key that may change on resume: the config
    # fingerprints are equal, so only the run id tells the runs apart).
    run_train tiny.toml --set train.max_steps=2 --set optim.lr=5e-4 --set train.run_dir="$WORK/runB"
    expect_rc 0
    file=$CK/step_00000002/shard_00001-of-00002.h5
    cp "$WORK/runB/checkpoints/step_00000002/shard_00001-of-00002.h5" "$file"
    run_a=$(attr "$CK/step_00000002/shard_00000-of-00002.h5" run_id)
    run_b=$(attr "$file" run_id)
    if [ "$run_a" = "$run_b" ]; then fail "two fresh runs have the same run_id $run_a"; fi
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=3 --resume
    expect_input_error "$file: run_id $run_b differs from $CK/step_00000002/shard_00000-of-00002.h5 (run_id $run_a)" \
      "the shards come from different runs"
    expect_unchanged "$before"
    run_merge "$CK/step_00000002" "$WORK/hf"
    expect_rc 2
    expect_one_error fsdp_merge "$file: run_id $run_b differs from" "the shards come from different runs"
    if [ -e "$WORK/hf" ]; then fail "fsdp_merge wrote $WORK/hf for a mixed checkpoint"; fi
    expect_unchanged "$before"
    ;;
  run_id_kept_on_resume)
    train_two_steps --set checkpoint.every=1
    run_id=$(attr "$CK/step_00000001/shard_00000-of-00002.h5" run_id)
    launch=$(attr "$CK/step_00000001/shard_00000-of-00002.h5" launch_id)
    if ! [[ "$run_id" =~ ^[0-9a-f]{32}$ && "$launch" =~ ^[0-9a-f]{32}$ ]]; then
      fail "run_id '$run_id' / launch_id '$launch' are not 32 hex digits"
    fi
    for f in "$CK"/step_0000000[12]/shard_*.h5; do
      [ "$(attr "$f" run_id)" = "$run_id" ] || fail "$f: another run_id"
      [ "$(attr "$f" launch_id)" = "$launch" ] || fail "$f: another launch_id"
    done
    # --resume keeps the run id; the launch id is new.
    run_train tiny.toml --set train.max_steps=3 --set checkpoint.every=1 --resume
    expect_rc 0
    for f in "$CK"/step_00000003/shard_0000[01]-of-00002.h5; do
      [ "$(attr "$f" run_id)" = "$run_id" ] || fail "$f: run_id changed on --resume"
      [ "$(attr "$f" launch_id)" != "$launch" ] || fail "$f: launch_id not renewed on --resume"
    done
    launch3=$(attr "$CK/step_00000003/shard_00001-of-00002.h5" launch_id)
    # ... also on another world size (1 rank: resharded on load).
    run_train -np 1 tiny.toml --set train.max_steps=4 --set checkpoint.every=1 --resume
    expect_rc 0
    f=$CK/step_00000004/shard_00000-of-00001.h5
    [ "$(attr "$f" run_id)" = "$run_id" ] || fail "$f: run_id changed on a resume at 1 rank"
    [ "$(attr "$f" launch_id)" != "$launch3" ] || fail "$f: launch_id not renewed"
    # A fresh run is another run.
    run_train tiny.toml --set train.max_steps=1 --set train.run_dir="$WORK/run2"
    expect_rc 0
    other=$(attr "$WORK/run2/checkpoints/step_00000001/shard_00000-of-00002.h5" run_id)
    [ "$other" != "$run_id" ] || fail "a fresh run reused run_id $run_id"
    ;;
  tampered_metadata)
    # One rank: one shard, so no other shard's copy of the metadata to compare with.
    tiny_config tiny.toml
    run_train -np 1 tiny.toml --set train.max_steps=2
    expect_rc 0
    file=$CK/step_00000002/shard_00000-of-00001.h5
    cp "$file" "$WORK/pristine.h5"
    for edit in epsilon offset sampler_position; do
      cp "$WORK/pristine.h5" "$file"
      rm -rf "$WORK/hf"
      case $edit in
        epsilon) edit_byte "$file" '"layer_norm_epsilon":1e-0(5)' ;;  # 1e-05 -> 1e-01
        offset) edit_byte "$file" '"name":"h\.0\.ln_1\.bias","offset":([0-9]+)' ;;
        sampler_position) "$FSDP_H5_POKE" set-i64 "$file" / sampler_position 3 || fail "poke failed" ;;
      esac
      before=$(snapshot "$CK")
      run_merge "$CK/step_00000002" "$WORK/hf"
      expect_rc 2
      expect_one_error fsdp_merge "$file: metadata checksum mismatch (stored " "the file is corrupted"
      if [ -e "$WORK/hf" ]; then fail "fsdp_merge wrote $WORK/hf for a tampered checkpoint ($edit)"; fi
      run_train -np 1 tiny.toml --set train.max_steps=3 --resume
      expect_input_error "$file: metadata checksum mismatch (stored " "the file is corrupted"
      expect_unchanged "$before"
    done
    ;;
  merge_into_checkpoints)
    train_two_steps
    before=$(snapshot "$WORK/run")
    for out in "$CK/step_00000002" "$CK/step_00000002/hf" "$CK" "$CK/hf"; do
      run_merge "$CK/step_00000002" "$out"
      expect_rc 2
      expect_one_error fsdp_merge "OUT_DIR $out is inside the checkpoint" "choose a directory outside"
      if [ "$before" != "$(snapshot "$WORK/run")" ]; then fail "fsdp_merge into $out changed $WORK/run"; fi
    done
    if [ -e "$CK/hf" ] || [ -e "$CK/step_00000002/hf" ]; then fail "fsdp_merge created an output directory"; fi
    # Beside the checkpoints tree, in the run directory: fine.
    run_merge "$CK/step_00000002" "$WORK/run/hf"
    expect_rc 0
    if [ ! -f "$WORK/run/hf/model.safetensors" ]; then fail "no $WORK/run/hf/model.safetensors"; fi
    ;;
  merge_concurrent)
    train_two_steps
    run_merge "$CK/step_00000002" "$WORK/hf"
    expect_rc 0
    if [ -e "$WORK/hf/.fsdp_merge.lock" ]; then fail "a merge left its lock file"; fi
    before=$(snapshot "$WORK/hf")
    # This shell holds the lock on descriptor 9 (flock(1)); the merge does not inherit it.
    exec 9>"$WORK/hf/.fsdp_merge.lock"
    flock -n 9 || fail "flock(1) could not take $WORK/hf/.fsdp_merge.lock"
    run_merge "$CK/step_00000002" "$WORK/hf" 9>&-
    exec 9>&-
    expect_rc 2
    expect_one_error fsdp_merge "OUT_DIR: $WORK/hf is being written by another process" \
      "it holds $WORK/hf/.fsdp_merge.lock" "wait for it to end"
    if [ "$before" != "$(snapshot "$WORK/hf" .fsdp_merge.lock)" ]; then
      fail "the refused merge changed $WORK/hf"
    fi
    run_merge "$CK/step_00000002" "$WORK/hf"
    expect_rc 0
    if [ "$before" != "$(snapshot "$WORK/hf")" ]; then fail "the same merge wrote other bytes"; fi
    if [ -e "$WORK/hf/.fsdp_merge.lock" ]; then fail "the leftover lock file stayed"; fi
    ;;
  merge_latest)
    train_two_steps --set checkpoint.every=1
    for s in 1 2; do
      run_merge "$CK/step_0000000$s" "$WORK/named_$s"
      expect_rc 0
    done
    for from in "$WORK/run" "$CK" "$CK/latest" "$WORK/run/"; do
      rm -rf "$WORK/hf"
      run_merge "$from" "$WORK/hf"
      expect_rc 0
      said='^fsdp_merge: merging .*checkpoints/step_00000002 \(named by .*checkpoints/latest\)$'
      grep -qE "$said" "$OUT" || fail "fsdp_merge $from did not say it merges latest's step_00000002"
      if [ "$(snapshot "$WORK/named_2")" != "$(snapshot "$WORK/hf")" ]; then
        fail "fsdp_merge $from wrote other bytes than fsdp_merge $CK/step_00000002"
      fi
    done
    printf 'step_00000001\n' >"$CK/latest"
    rm -rf "$WORK/hf"
    run_merge "$WORK/run" "$WORK/hf"
    expect_rc 0
    if [ "$(snapshot "$WORK/named_1")" != "$(snapshot "$WORK/hf")" ]; then
      fail "with latest = step_00000001, fsdp_merge RUN_DIR did not merge step 1"
    fi
    mkdir "$WORK/empty_run"
    run_merge "$WORK/empty_run" "$WORK/hf_none"
    expect_rc 2
    expect_one_error fsdp_merge "$WORK/empty_run: no shard files"
    if [ -e "$WORK/hf_none" ]; then fail "a refused merge created its OUT_DIR"; fi
    ;;
  resume_step)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=3 --set checkpoint.every=1
    expect_rc 0
    # same_losses STEP: every metrics.jsonl line of STEP has the same loss; at least 2 of them.
    same_losses() {
      python3 - "$WORK/run/metrics.jsonl" "$1" <<'PY' || fail "step $1's losses differ"
import json, sys
losses = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if r.get("step") == int(sys.argv[2])]
print("step", sys.argv[2], "losses:", losses)
sys.exit(0 if len(losses) >= 2 and len(set(losses)) == 1 else 1)
PY
    }
    run_train tiny.toml --set train.max_steps=3 --resume=1
    expect_rc 0
    grep -q "resumed from step 1" "$OUT" || fail "no 'resumed from step 1' line"
    grep -q "checkpoints/latest now names step_00000001 (it named step_00000003)" "$OUT" ||
      fail "no line saying latest now names step_00000001"
    same_losses 2
    same_losses 3
    if [ "$(cat "$CK/latest")" != step_00000003 ]; then fail "latest is not step_00000003 after the run"; fi
    # The newest checkpoint damaged: the error names the earlier ones and the way on.
    file=$CK/step_00000003/shard_00001-of-00002.h5
    off=$("$FSDP_H5_POKE" offset "$file" /units/0/param) || { fail "fsdp_h5_poke offset failed"; finish; }
    flip_byte "$file" $((off + 5))
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=4 --resume
    expect_input_error "$file: tensor /units/0/param" "the file is corrupted; earlier checkpoints" \
      "of this run: step_00000002, step_00000001 (--resume=2 continues from the newest of them)"
    expect_unchanged "$before"
    for bad in 7 "$WORK/elsewhere/checkpoints/step_00000002" "$CK/step_00000003.tmp"; do
      run_train tiny.toml --set train.max_steps=4 --resume="$bad"
      expect_input_error "--resume=$bad: "
      expect_unchanged "$before"
    done
    grep -q "its checkpoints: steps 1, 2, 3)" "$ERR" || fail "no list of the checkpoints"
    run_train tiny.toml --set train.max_steps=4 --resume=
    expect_input_error "command line: --resume=: expected auto, a step number or a step directory"
    run_train tiny.toml --set train.max_steps=4 --resume=2
    expect_rc 0
    grep -q "resumed from step 2" "$OUT" || fail "no 'resumed from step 2' line after the damage"
    same_losses 3
    if [ "$(cat "$CK/latest")" != step_00000004 ]; then fail "latest is not step_00000004"; fi
    # A step directory; without a save after it, the choice stands: latest names it.
    run_train tiny.toml --set train.max_steps=4 --set checkpoint.enable=false \
      --resume="$CK/step_00000002/"
    expect_rc 0
    grep -q "latest now names step_00000002 (it named step_00000004)" "$OUT" ||
      fail "no line for --resume=DIR"
    if [ "$(cat "$CK/latest")" != step_00000002 ]; then fail "latest is not step_00000002"; fi
    # A renamed step directory: its files' step is not its name's.
    mv "$CK/step_00000001" "$CK/step_00000009"
    before=$(snapshot "$CK")
    run_train tiny.toml --set train.max_steps=12 --resume=9
    expect_input_error "$CK/step_00000009/shard_00000-of-00002.h5: step 1 is not the step its" \
      "directory's name says"
    expect_unchanged "$before"
    ;;
  *)
    echo "integrity.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
