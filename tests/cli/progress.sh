#!/usr/bin/env bash
# tests/cli/progress.sh: the progress line of fsdp_prepare and fsdp_merge (fsdp/core/progress.hpp;
# docs/data.md "fsdp_prepare", docs/checkpoint.md "fsdp_merge").
#
#   bash tests/cli/progress.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# Environment (set by tests/test_progress.cmake): FSDP_MERGE (fsdp_merge).
# A terminal is a pseudo-terminal made by util-linux `script -qec CMD /dev/null` (the pty
# turns "\n" into "\r\n"; the checks undo that).
#
# CASE prepare_tty: fsdp_prepare on a small corpus (5000 bytes in 2 files). Piped: stdout is
#              exactly the summary line it always printed, stderr empty, no "\r" or escape
#              byte anywhere. Under a terminal: status lines "\r...\033[K" ending in
#              "fsdp_prepare: 4.9 KiB / 4.9 KiB (100%), R MiB/s, ETA 0s", then one newline,
#              then the same summary line; the same with --pairs (a TSV's bytes).
# CASE merge_tty: a tiny run (inputs/tiny.toml, 2 ranks, 2 steps) merged with fsdp_merge.
#              Piped: exactly the "wrote 28 tensors" line, stderr empty, no "\r" or escape.
#              Under a terminal: the last status line is "fsdp_merge: 28 / 28 tensors, S / S
#              (100%), R MiB/s, ETA 0s", ended by a newline before the same summary line,
#              and model.safetensors is byte-identical to the piped run's.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

FSDP_MERGE=${FSDP_MERGE:-$(dirname "$FSDP_TRAIN")/fsdp_merge}
TTY=$WORK/tty.txt

if ! command -v script >/dev/null; then
  echo "progress.sh: util-linux 'script' not found (needed for a pseudo-terminal)" >&2
  exit 1
fi

# run_tty ARGS...: ARGS (each quoted) under a pseudo-terminal; output (stdout and stderr
# together, as a terminal shows them) in $TTY; sets RC.
run_tty() {
  local cmd
  cmd=$(printf '%q ' "$@")
  timeout 60 script -qec "$cmd" /dev/null >"$TTY" 2>&1 </dev/null
  RC=$?
  if [ "$RC" -eq 124 ]; then fail "$* under script did not finish within 60 s"; fi
}

# expect_plain: the last piped run wrote no "\r" and no escape byte to stdout or stderr.
expect_plain() {
  if LC_ALL=C grep -q $'[\r\033]' "$OUT" "$ERR"; then fail "piped output holds '\\r' or an escape sequence"; fi
  if [ -s "$ERR" ]; then fail "stderr not empty when piped"; fi
}

# expect_tty_progress FINAL_REGEX SUMMARY: $TTY is status lines, the last one matching
# FINAL_REGEX (Python regex of the line's text), each drawn as "\r" + line + "\033[K", then
# one newline, then exactly the line SUMMARY, then nothing.
expect_tty_progress() {
  python3 - "$TTY" "$1" "$2" <<'EOF' ||
import re, sys
path, final_re, summary = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(path, "rb").read().decode()
text = data.replace("\r\n", "\n")  # the pty's output processing (onlcr)
lines = text.split("\n")
assert lines[-1] == "", f"output does not end with a newline: {data!r}"
assert len(lines) == 3, f"expected the progress line, the summary and a final newline: {data!r}"
status, got_summary = lines[0], lines[1]
assert got_summary == summary, f"summary {got_summary!r}, expected {summary!r}"
draws = status.split("\r")
assert draws[0] == "" and len(draws) >= 2, f"status line not drawn with '\\r': {status!r}"
for d in draws[1:]:
    assert d.endswith("\x1b[K"), f"a draw without the erase-to-end-of-line: {d!r}"
    assert "MiB/s" in d and ", ETA " in d, f"a draw without rate or ETA: {d!r}"
last = draws[-1][: -len("\x1b[K")]
assert re.fullmatch(final_re, last), f"last status line {last!r} does not match {final_re!r}"
print(f"{len(draws) - 1} draw(s), last: {last}")
EOF
    { fail "terminal output check failed"; echo "---- tty ----" >&2; cat -v "$TTY" >&2; }
}

case "$CASE" in
  prepare_tty)
    make_text_dir "$WORK/text"  # 3000 + 2000 bytes
    want="fsdp_prepare: $WORK/out.h5: 2 files, 4750 train tokens, 250 val tokens (vocab 256, bytes)"
    run_prepare -o "$WORK/out.h5" "$WORK/text"
    expect_rc 0
    if [ "$(cat "$OUT")" != "$want" ]; then fail "piped summary: expected '$want'"; fi
    expect_plain
    rm -f "$WORK/out.h5"
    run_tty "$FSDP_PREPARE" -o "$WORK/out.h5" "$WORK/text"
    expect_rc 0
    expect_tty_progress 'fsdp_prepare: 4\.9 KiB / 4\.9 KiB \(100%\), [0-9]+\.[0-9] MiB/s, ETA 0s' "$want"
    if [ ! -s "$WORK/out.h5" ]; then fail "no out.h5 from the run under a terminal"; fi

    # --pairs: progress over the TSV's bytes (10 + 12 + 5 = 27).
    printf 'a cat\tcat\nthe dog\tdog\nx\tyz\n' >"$WORK/p.tsv"
    want="fsdp_prepare: $WORK/p.h5: 3 pairs (2 train, 1 val), 16 input tokens, 11 target tokens, input len max 8 mean 5.3, target len max 4 mean 3.7 (ByT5 ids, eos included)"
    run_prepare --pairs "$WORK/p.tsv" "$WORK/p.h5" --val-fraction 0.34
    expect_rc 0
    if [ "$(cat "$OUT")" != "$want" ]; then fail "piped --pairs summary: expected '$want'"; fi
    expect_plain
    rm -f "$WORK/p.h5"
    run_tty "$FSDP_PREPARE" --pairs "$WORK/p.tsv" "$WORK/p.h5" --val-fraction 0.34
    expect_rc 0
    expect_tty_progress 'fsdp_prepare: 27 B / 27 B \(100%\), [0-9]+\.[0-9] MiB/s, ETA 0s' "$want"
    ;;
  merge_tty)
    tiny_config tiny.toml
    run_train tiny.toml --set train.max_steps=2
    expect_rc 0
    step=$WORK/run/checkpoints/step_00000002
    if [ ! -f "$step/shard_00001-of-00002.h5" ]; then fail "no step 2 checkpoint"; finish; fi
    timeout 60 "$FSDP_MERGE" "$step" "$WORK/hf_plain" >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_rc 0
    # tiny.toml: wte, wpe, 2 blocks x 12 tensors, ln_f weight and bias.
    line="fsdp_merge: wrote 28 tensors \([0-9]+ parameters\) to $WORK/hf_plain/model.safetensors and config.json"
    if ! grep -Eqx "$line" "$OUT" || [ "$(wc -l <"$OUT")" -ne 1 ]; then
      fail "piped stdout is not exactly the 'wrote 28 tensors' line"
    fi
    expect_plain
    want=$(sed "s|$WORK/hf_plain/|$WORK/hf_tty/|" "$OUT")
    run_tty "$FSDP_MERGE" "$step" "$WORK/hf_tty"
    expect_rc 0
    size='[0-9]+(\.[0-9])? (B|KiB|MiB)'
    expect_tty_progress "fsdp_merge: 28 / 28 tensors, ($size) / \\1 \\(100%\\), [0-9]+\\.[0-9] MiB/s, ETA 0s" "$want"
    if ! cmp -s "$WORK/hf_plain/model.safetensors" "$WORK/hf_tty/model.safetensors"; then
      fail "model.safetensors differs between the piped run and the run under a terminal"
    fi
    ;;
  *)
    echo "progress.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
