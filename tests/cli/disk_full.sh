#!/usr/bin/env bash
# tests/cli/disk_full.sh: fsdp_train on a full disk (docs/checkpoint.md "Write errors").
#
#   bash tests/cli/disk_full.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# train.run_dir is a small tmpfs mounted for the test, so it needs root and a kernel that
# lets it mount; otherwise the case exits 77 (ctest: SKIP_RETURN_CODE).
#
# CASE save_enospc: the tmpfs holds one checkpoint and a half (sized from a checkpoint of
#   the same model on the ordinary disk). A run saves step 2; resumed with checkpoint.every
#   = 2 and max_steps = 4, its save of step 4 runs out of space (the start-up warning said a
#   save would not fit: expect_save_warning). That run exits 1 (not 139:
#   no crash in HDF5 at exit) with one line naming the file of step_00000004 and "No space
#   left on device"; `latest` still names step_00000002, and both are byte-identical to what
#   they were before; no *.tmp file or step_*.tmp directory is left, the lock is released.
# CASE save_enospc_async: the same with checkpoint.async_save = true and max_steps = 6: the
#   background write of step 4 fails; the run stops with the same line and leaves the same.
# CASE save_too_big_warned: the tmpfs holds half a checkpoint. A fresh 2-step run prints one
#   start-up warning naming train.run_dir and both sizes (the save's and the space free), then
#   its final save runs out of space (exit 1, the line naming step_00000002); the same run with
#   checkpoint.enable = false trains to the end (exit 0), warns nothing and writes no
#   checkpoint.
# CASE metrics_enospc: the tmpfs has room for the start-up probes and a few lines of
#   metrics.jsonl only. The run stops with exit 1 and one line naming metrics.jsonl and "No
#   space left on device"; every line left in metrics.jsonl is complete JSON.
# CASE prepare_enospc: fsdp_prepare --tokenizer (lib.sh's bpe_json) writes into a
#   1 MiB tmpfs that holds its earlier output; the token stream's unnamed temporary file (4
#   bytes a token, in the output's folder) runs out of room. Exit 1, one line naming the
#   output and "No space left on device"; the earlier out.h5 is byte-identical and nothing
#   else is on the disk (no temporary, no lock file).
# CASE merge_enospc: fsdp_merge into a 1 MiB tmpfs that holds an earlier merge of the tiny
#   model, of a checkpoint whose weights (~2.5 MB) do not fit. Exit 1, one line naming the
#   output and "No space left on device"; the earlier model.safetensors and config.json are
#   byte-identical and nothing else is left on the disk (no temporary, no lock file).
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

DISK=$WORK/disk
mkdir -p "$DISK"
# mount_disk SIZE: a tmpfs of SIZE at $DISK, or exit 77 (skipped) when mount is refused.
mount_disk() {
  if [ "$(id -u)" -ne 0 ] || ! mount -t tmpfs -o "size=$1" tmpfs "$DISK" 2>/dev/null; then
    echo "${CASE}: SKIPPED: needs root and permission to mount a tmpfs (mount -t tmpfs failed)"
    exit 77
  fi
  trap 'umount "$DISK" 2>/dev/null; rm -rf "$WORK"' EXIT
}

# disk_with_one_checkpoint DECAY: a tmpfs at $DISK with room for one checkpoint of
# inputs/tiny.toml and a half (size measured on the ordinary disk first), tiny.toml pointing
# train.run_dir into it, and a run of 2 steps saved there (optim.decay_steps = DECAY, so the
# resumed run shares its schedule). Sets BEFORE: checksums of `latest` and step_00000002.
disk_with_one_checkpoint() {
  tiny_config tiny.toml
  run_train tiny.toml --set train.max_steps=2 --set train.run_dir="$WORK/measure"
  expect_rc 0
  local ckpt_kb size_kb
  ckpt_kb=$(du -sk "$WORK/measure/checkpoints/step_00000002" | cut -f1)
  # Room for one checkpoint and a half, plus the lock, metrics and `latest` (pages of 4 KiB).
  size_kb=$((ckpt_kb * 3 / 2 + 32))
  echo "one checkpoint: ${ckpt_kb} KiB; tmpfs: ${size_kb} KiB"
  mount_disk "${size_kb}k"
  sed -i "s|^run_dir = .*|run_dir = \"$DISK/run\"|" tiny.toml
  run_train tiny.toml --set train.max_steps=2 --set optim.decay_steps="$1"
  expect_rc 0
  BEFORE=$(cd "$DISK/run/checkpoints" && sha256sum latest step_00000002/*)
}

# expect_save_warning: exactly one start-up warning on $ERR that a save does not fit the free
# space of train.run_dir, which is then removed from $ERR (expect_one_error wants nothing else).
expect_save_warning() {
  local n
  n=$(grep -c "^warning: checkpoint: a save writes .* but train.run_dir (.*) has .* free" "$ERR")
  if [ "$n" -ne 1 ]; then
    fail "expected one start-up warning that a save does not fit, found $n"
  fi
  sed -i '/^warning: checkpoint: a save writes /d' "$ERR"
}

# expect_no_tmp DIR: no *.tmp file or directory under DIR.
expect_no_tmp() {
  local left
  left=$(find "$1" -name '*.tmp')
  if [ -n "$left" ]; then fail "temporary files left behind: $left"; fi
}

case "$CASE" in
  save_too_big_warned)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2 --set train.run_dir="$WORK/measure"
    expect_rc 0
    ckpt_kb=$(du -sk "$WORK/measure/checkpoints/step_00000002" | cut -f1)
    echo "one checkpoint: ${ckpt_kb} KiB; tmpfs: $((ckpt_kb / 2)) KiB"
    mount_disk "$((ckpt_kb / 2))k"
    run_train tiny.toml --set train.max_steps=2 --set train.run_dir="$DISK/a"
    expect_rc 1
    warned="^warning: checkpoint: a save writes .* but train.run_dir ($DISK/a) has .* free"
    if [ "$(grep -c "$warned" "$ERR")" -ne 1 ]; then
      fail "expected one start-up warning that the save does not fit: $(cat "$ERR")"
    fi
    if ! grep -q "^fsdp_train: .*step_00000002.*No space left on device" "$ERR"; then
      fail "the final save did not fail with the ENOSPC line: $(cat "$ERR")"
    fi
    rm -rf "$DISK/a"
    run_train tiny.toml --set train.max_steps=2 --set train.run_dir="$DISK/b" \
      --set checkpoint.enable=false
    expect_rc 0
    if grep -q "warning" "$ERR"; then fail "a warning with checkpoint.enable = false: $(cat "$ERR")"; fi
    if [ -n "$(find "$DISK/b" -path '*checkpoints/*')" ]; then
      fail "checkpoint.enable = false wrote: $(find "$DISK/b" -path '*checkpoints/*')"
    fi
    if ! grep -q '"step":2' "$DISK/b/metrics.jsonl"; then fail "the run did not reach step 2"; fi
    ;;
  save_enospc)
    # Step 2 saved (fits), then resumed to step 4 with checkpoint.every = 2: the save of step
    # 4 does not fit next to step 2.
    disk_with_one_checkpoint 4
    before=$BEFORE
    run_train tiny.toml --set train.max_steps=4 --set optim.decay_steps=4 --set checkpoint.every=2 --resume
    if [ "$RC" -eq 139 ] || grep -q "Segmentation fault\|signal 11" "$ERR"; then fail "fsdp_train crashed (exit $RC)"; fi
    expect_rc 1
    expect_save_warning
    expect_one_error fsdp_train "step_00000004" "No space left on device"
    if [ "$(tr -d '[:space:]' <"$DISK/run/checkpoints/latest")" != step_00000002 ]; then
      fail "latest does not name step_00000002 after the failed save"
    fi
    after=$(cd "$DISK/run/checkpoints" && sha256sum latest step_00000002/*)
    if [ "$before" != "$after" ]; then fail "latest or step_00000002 changed:"$'\n'"$before"$'\n'"$after"; fi
    expect_no_tmp "$DISK/run"
    if [ -e "$DISK/run/checkpoints/step_00000004" ]; then fail "a step_00000004 directory was published"; fi
    if [ -s "$DISK/run/fsdp_train.lock" ]; then fail "the lock file was not released"; fi
    ;;
  save_enospc_async)
    # As save_enospc, with checkpoint.async_save = true and max_steps = 6: the save of step
    # 4 is a background write that runs out of space. The failure is agreed at the next step
    # boundary (or before the final save): same exit code, one line naming step_00000004,
    # `latest` and step_00000002 unchanged, no temporary, no step_00000004 or step_00000006.
    disk_with_one_checkpoint 6
    before=$BEFORE
    run_train tiny.toml --set train.max_steps=6 --set optim.decay_steps=6 --set checkpoint.every=2 \
      --set checkpoint.async_save=true --resume
    if [ "$RC" -eq 139 ] || grep -q "Segmentation fault\|signal 11" "$ERR"; then fail "fsdp_train crashed (exit $RC)"; fi
    expect_rc 1
    expect_save_warning
    expect_one_error fsdp_train "step_00000004" "No space left on device"
    grep -q "^checkpoint: $DISK/run/checkpoints/step_00000004 staged in" "$OUT" || fail "step 4 was not saved in the background"
    if [ "$(tr -d '[:space:]' <"$DISK/run/checkpoints/latest")" != step_00000002 ]; then
      fail "latest does not name step_00000002 after the failed save"
    fi
    after=$(cd "$DISK/run/checkpoints" && sha256sum latest step_00000002/*)
    if [ "$before" != "$after" ]; then fail "latest or step_00000002 changed:"$'\n'"$before"$'\n'"$after"; fi
    expect_no_tmp "$DISK/run"
    for s in 4 6; do
      if [ -e "$DISK/run/checkpoints/step_0000000$s" ]; then fail "a step_0000000$s directory was published"; fi
    done
    if [ -s "$DISK/run/fsdp_train.lock" ]; then fail "the lock file was not released"; fi
    ;;
  metrics_enospc)
    tiny_config tiny.toml
    mount_disk 256k
    sed -i "s|^run_dir = .*|run_dir = \"$DISK/run\"|" tiny.toml
    # Fill the tmpfs, then free two pages: one for the lock line, one for the write probe of
    # checkpoints/ (removed again) and then metrics.jsonl, which runs out after ~25 lines.
    dd if=/dev/zero of="$DISK/filler" bs=4096 2>/dev/null
    truncate -s -8192 "$DISK/filler"
    run_train tiny.toml --set train.max_steps=200 --set checkpoint.every=0
    if [ "$RC" -eq 139 ]; then fail "fsdp_train crashed (exit 139)"; fi
    expect_rc 1
    expect_save_warning  # the final save would not fit either
    expect_one_error fsdp_train "$DISK/run/metrics.jsonl" "No space left on device"
    python3 - "$DISK/run/metrics.jsonl" <<'EOF' || fail "metrics.jsonl holds an incomplete line"
import json, sys
lines = open(sys.argv[1]).read().split("\n")
assert lines[-1] == "", "last line not terminated"
steps = [json.loads(l)["step"] for l in lines[:-1]]
assert steps == list(range(1, len(steps) + 1)) and 1 <= len(steps) < 200, steps
EOF
    if [ -e "$DISK/run/checkpoints/latest" ]; then fail "a checkpoint was published after the failure"; fi
    expect_no_tmp "$DISK/run"
    ;;
  prepare_enospc)
    mount_disk 1m
    bpe_json "$WORK/tokenizer.json"
    python3 - "$WORK/small" "$WORK/large" <<'EOF'
import os, sys
for d, kib in ((sys.argv[1], 8), (sys.argv[2], 600)):
    os.makedirs(d)
    open(d + "/a.txt", "w").write(("All work and no play makes Jack a dull boy.\n" * 24)[:1024] * kib)
EOF
    run_prepare --tokenizer "$WORK/tokenizer.json" -o "$DISK/out.h5" "$WORK/small"
    expect_rc 0
    before=$(sha256sum <"$DISK/out.h5")
    run_prepare --tokenizer "$WORK/tokenizer.json" -o "$DISK/out.h5" "$WORK/large"
    expect_rc 1
    expect_one_error fsdp_prepare "$DISK/out.h5" "No space left on device"
    if [ "$(sha256sum <"$DISK/out.h5")" != "$before" ]; then fail "the earlier out.h5 changed"; fi
    left=$(ls -A "$DISK")
    if [ "$left" != out.h5 ]; then fail "left on the disk besides out.h5: $left"; fi
    ;;
  merge_enospc)
    merge=$(dirname "$FSDP_TRAIN")/fsdp_merge
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=1 --set train.run_dir="$WORK/small"
    expect_rc 0
    run_train tiny.toml --set train.max_steps=1 --set train.run_dir="$WORK/large" \
      --set model.n_embd=160 --set model.n_layer=2
    expect_rc 0
    mount_disk 1m
    "$merge" "$WORK/small" "$DISK/hf" >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_rc 0
    before=$(snapshot "$DISK")
    "$merge" "$WORK/large" "$DISK/hf" >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_rc 1
    expect_one_error fsdp_merge "$DISK/hf" "No space left on device"
    if [ "$(snapshot "$DISK")" != "$before" ]; then
      fail "the refused merge changed the disk:"$'\n'"$(diff <(echo "$before") <(snapshot "$DISK"))"
    fi
    ;;
  *)
    echo "disk_full.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
