#!/usr/bin/env bash
# tests/cli/prepare.sh: fsdp_prepare end to end (docs/data.md "fsdp_prepare").
#
#   bash tests/cli/prepare.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE ok:     files and folders in, one summary line out with the exact token counts
#              (sorted files, symlinks and *.dat skipped, validation = last floor(F * n) bytes),
#              no OUT.h5.tmp left behind.
#              --pairs (seq2seq TSV): both `--pairs TSV OUT` and `--pairs TSV -o OUT`, one
#              summary line with exact pair, token and length counts (eos included).
# CASE errors: each bad input (missing input, no files, bad --val-fraction, missing output
#              folder, no -o, unknown option; --pairs: a line without a tab, an empty input
#              or target, an extra argument) exits 2 with one `fsdp_prepare: ...` line naming
#              the problem (FILE:LINE for TSV lines), and writes no output file.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# expect_prepare_error NEEDLE...: exit code 2, one error line with every NEEDLE, no output.
expect_prepare_error() {
  expect_rc 2
  expect_one_error fsdp_prepare "$@"
  if [ -e "$WORK/out.h5" ] || [ -e "$WORK/out.h5.tmp" ]; then
    fail "a failed fsdp_prepare left out.h5 or out.h5.tmp"
    rm -f "$WORK/out.h5" "$WORK/out.h5.tmp"
  fi
}

case "$CASE" in
  ok)
    make_text_dir "$WORK/text"                      # 3000 + 2000 bytes
    printf 'index data\n' >"$WORK/text/a.dat"       # fortune index: skipped
    ln -s "$WORK/text/a.txt" "$WORK/text/link.txt"  # symlink: skipped
    head -c 1000 /dev/zero | tr '\0' 'x' >"$WORK/extra.txt"
    run_prepare -o "$WORK/out.h5" --val-fraction 0.1 "$WORK/text" "$WORK/extra.txt"
    expect_rc 0
    # 6000 bytes from 3 files; val = floor(0.1 * 6000) = 600.
    want="fsdp_prepare: $WORK/out.h5: 3 files, 5400 train tokens, 600 val tokens (vocab 256, bytes)"
    if [ "$(cat "$OUT")" != "$want" ]; then fail "summary line: expected '$want'"; fi
    if [ ! -s "$WORK/out.h5" ]; then fail "no out.h5"; fi
    if [ -e "$WORK/out.h5.tmp" ]; then fail "out.h5.tmp left behind"; fi
    if [ -s "$ERR" ]; then fail "stderr not empty on success"; fi
    # Default fraction 0.05 of 5000 bytes = 250.
    run_prepare -o "$WORK/out2.h5" "$WORK/text"
    expect_rc 0
    if ! grep -qF "2 files, 4750 train tokens, 250 val tokens" "$OUT"; then
      fail "default --val-fraction: wrong counts"
    fi
    # --pairs: 4 pairs, val = floor(0.25 * 4) = 1; lengths are bytes + 1 (eos).
    printf 'a cat\tcat\nthe dog barks\tdog\nx\tyz\nsome bird\tbird\n' >"$WORK/p.tsv"
    run_prepare --pairs "$WORK/p.tsv" "$WORK/p.h5" --val-fraction 0.25
    expect_rc 0
    want="fsdp_prepare: $WORK/p.h5: 4 pairs (3 train, 1 val), 32 input tokens, 16 target tokens, input len max 14 mean 8.0, target len max 5 mean 4.0 (ByT5 ids, eos included)"
    if [ "$(cat "$OUT")" != "$want" ]; then fail "--pairs summary line: expected '$want'"; fi
    if [ ! -s "$WORK/p.h5" ] || [ -e "$WORK/p.h5.tmp" ]; then fail "--pairs: no p.h5, or p.h5.tmp left"; fi
    run_prepare --pairs "$WORK/p.tsv" -o "$WORK/p2.h5" --val-fraction 0.5
    expect_rc 0
    if ! grep -qF "p2.h5: 4 pairs (2 train, 2 val)" "$OUT"; then fail "--pairs -o: wrong counts"; fi
    if [ -s "$ERR" ]; then fail "stderr not empty on --pairs success"; fi
    ;;
  errors)
    make_text_dir "$WORK/text"
    mkdir -p "$WORK/empty"

    run_prepare -o "$WORK/out.h5" "$WORK/does_not_exist"
    expect_prepare_error "does_not_exist"

    run_prepare -o "$WORK/out.h5" "$WORK/empty"
    expect_prepare_error "empty"

    run_prepare -o "$WORK/out.h5" --val-fraction 1.5 "$WORK/text"
    expect_prepare_error "--val-fraction" "1.5"

    run_prepare -o "$WORK/out.h5" --val-fraction 0 "$WORK/text"
    expect_prepare_error "--val-fraction" "0"

    run_prepare -o "$WORK/no_such_dir/out.h5" "$WORK/text"
    expect_prepare_error "no_such_dir"
    if [ -e "$WORK/no_such_dir" ]; then fail "fsdp_prepare created the missing output folder"; fi

    run_prepare "$WORK/text"
    expect_prepare_error "-o"

    run_prepare -o "$WORK/out.h5"
    expect_prepare_error "INPUT"

    run_prepare -o "$WORK/out.h5" --bogus "$WORK/text"
    expect_prepare_error "bogus"

    # --pairs: bad lines name FILE:LINE.
    printf 'a\tb\nno tab\n' >"$WORK/notab.tsv"
    run_prepare --pairs "$WORK/notab.tsv" "$WORK/out.h5"
    expect_prepare_error "$WORK/notab.tsv:2:" "no tab"
    printf 'a\tb\n\tb\n' >"$WORK/noinput.tsv"
    run_prepare --pairs "$WORK/noinput.tsv" "$WORK/out.h5"
    expect_prepare_error "$WORK/noinput.tsv:2:" "empty input"
    printf 'a\t\n' >"$WORK/notarget.tsv"
    run_prepare --pairs "$WORK/notarget.tsv" "$WORK/out.h5"
    expect_prepare_error "$WORK/notarget.tsv:1:" "empty target"
    printf 'a\tb\nc\td\n' >"$WORK/two.tsv"
    run_prepare --pairs "$WORK/two.tsv" "$WORK/out.h5"           # 0.05 of 2 pairs: empty val
    expect_prepare_error "--val-fraction" "2 pairs"
    run_prepare --pairs "$WORK/two.tsv" -o "$WORK/out.h5" "$WORK/extra"
    expect_prepare_error "--pairs" "extra"
    run_prepare --pairs "$WORK/missing.tsv" "$WORK/out.h5" --val-fraction 0.5
    expect_prepare_error "missing.tsv"
    run_prepare --pairs "$WORK/two.tsv"
    expect_prepare_error "--pairs" "output"
    ;;
  *)
    echo "prepare.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
