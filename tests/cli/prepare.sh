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
# CASE output_is_input: `-o f.txt f.txt` (also through another spelling of the path, and a
#              hard link) exits 2 naming -o/--output and the input; the input is unchanged.
# CASE output_inside_input_dir: an output that does not exist yet inside an input folder
#              (also through a symlinked parent) exits 2 naming the folder; nothing written.
# CASE fifo_input: a FIFO inside an input folder is skipped with one warning line (never
#              opened: the run does not hang) and the summary counts the regular files only;
#              a FIFO named as INPUT or as --pairs FILE is refused with exit 2 naming it.
# CASE fifo_data_path: fsdp_train with a FIFO as data.path, or as the config file, exits 2
#              naming it instead of blocking in open().
# CASE group_not_dataset: fsdp_train on a token file whose /train/tokens is a group
#              (tests/data/cli/group_tokens.h5) exits 2 with one line naming the file and
#              /train/tokens, no HDF5 error stack.
# CASE corrupted_header: a token file with garbage over its superblock or over the metadata
#              after it exits 2 with one line naming the file, no HDF5 error stack.
# CASE concurrent_output: while another process holds OUT.h5.lock (util-linux flock(1), as a
#              second fsdp_prepare of OUT.h5 would), fsdp_prepare -o OUT.h5 exits 2 with one
#              line naming -o/--output, OUT.h5 and the lock file; the earlier OUT.h5 and the
#              holder's lock file are unchanged. A lock file left by a dead writer is taken
#              over; no OUT.h5.lock or OUT.h5.tmp stays after a run.
# CASE compressed: the same folder with its files compressed by the gzip, zstd and xz
#              commands gives the plain folder's summary line; a .zst cut short exits 2 with
#              one line naming it and "ends inside a frame"; a bzip2 file exits 2 naming bzip2
#              and how to decompress it. Nothing is written by either.
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
  compressed)
    make_text_dir "$WORK/text"  # 3000 + 2000 bytes
    mkdir -p "$WORK/packed/sub"
    gzip -c "$WORK/text/a.txt" >"$WORK/packed/a.txt.gz"
    zstd -q -c "$WORK/text/sub/b.txt" >"$WORK/packed/sub/b.txt.zst"
    printf 'plain tail\n' | xz -c >"$WORK/packed/c.txt"
    printf 'plain tail\n' >"$WORK/text/c.txt"
    run_prepare -o "$WORK/plain.h5" --val-fraction 0.1 "$WORK/text"
    expect_rc 0
    want="3 files, 4510 train tokens, 501 val tokens (vocab 256, bytes)"
    if ! grep -qF "$want" "$OUT"; then fail "plain folder: expected '$want'"; fi
    run_prepare -o "$WORK/packed.h5" --val-fraction 0.1 "$WORK/packed"
    expect_rc 0
    if ! grep -qF "$want" "$OUT"; then fail "compressed folder: expected '$want' (got '$(cat "$OUT")')"; fi
    if [ -s "$ERR" ]; then fail "stderr not empty on success"; fi
    zstd -q -c "$WORK/text/a.txt" | head -c 20 >"$WORK/packed/sub/b.txt.zst"
    run_prepare -o "$WORK/out.h5" "$WORK/packed"
    expect_prepare_error "$WORK/packed/sub/b.txt.zst" "ends inside a frame"
    rm "$WORK/packed/sub/b.txt.zst"
    printf 'BZh91AY&SY\001\002' >"$WORK/packed/d.bz2"  # a bzip2 header
    run_prepare -o "$WORK/out.h5" "$WORK/packed"
    expect_prepare_error "$WORK/packed/d.bz2" "bzip2-compressed" "bzip2 -dk"
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
  output_is_input)
    make_text_dir "$WORK/text"
    cp "$WORK/text/a.txt" "$WORK/f.txt"
    sum=$(sha256sum <"$WORK/f.txt")
    run_prepare -o "$WORK/f.txt" "$WORK/f.txt"
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "$WORK/f.txt" "is the input"
    run_prepare -o "$WORK/text/../f.txt" "$WORK/f.txt"           # another spelling
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "is the input"
    ln "$WORK/f.txt" "$WORK/hard.txt"                            # a hard link: the same file
    run_prepare -o "$WORK/hard.txt" "$WORK/f.txt"
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "hard.txt" "is the input"
    run_prepare --pairs "$WORK/f.txt" "$WORK/f.txt" --val-fraction 0.5
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "is the input"
    if [ "$(sha256sum <"$WORK/f.txt")" != "$sum" ]; then fail "the input f.txt was changed"; fi
    if [ -e "$WORK/f.txt.tmp" ]; then fail "f.txt.tmp left behind"; fi
    ;;
  output_inside_input_dir)
    make_text_dir "$WORK/text"
    before=$(cd "$WORK/text" && find . -type f | sort | xargs sha256sum)
    run_prepare -o "$WORK/text/out.h5" "$WORK/text"
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "$WORK/text/out.h5" "inside the input folder" "$WORK/text"
    run_prepare -o "$WORK/text/sub/out.h5" "$WORK/extra_missing_is_later" "$WORK/text"
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "inside the input folder"
    ln -s "$WORK/text/sub" "$WORK/alias"                          # the same folder by a symlink
    run_prepare -o "$WORK/alias/out.h5" "$WORK/text"
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output" "inside the input folder"
    after=$(cd "$WORK/text" && find . -type f | sort | xargs sha256sum)
    if [ "$before" != "$after" ]; then fail "the input folder was changed"; fi
    ;;
  fifo_input)
    make_text_dir "$WORK/text"                      # 3000 + 2000 bytes
    mkfifo "$WORK/text/pipe"
    run_prepare -o "$WORK/out.h5" --val-fraction 0.1 "$WORK/text"
    expect_rc 0
    if ! grep -qF "2 files, 4500 train tokens, 500 val tokens" "$OUT"; then fail "FIFO not skipped: wrong counts"; fi
    if [ "$(grep -c . "$ERR")" -ne 1 ] ||
       ! grep -qF "fsdp_prepare: warning: skipped $WORK/text/pipe (a FIFO)" "$ERR"; then
      fail "expected one warning line naming the FIFO"
    fi
    rm -f "$WORK/out.h5"
    # A FIFO with an untrusted name is printed escaped.
    mkfifo "$WORK/text/bad"$'\e'"name"
    run_prepare -o "$WORK/out.h5" --val-fraction 0.1 "$WORK/text"
    expect_rc 0
    if ! grep -qF 'bad\x1bname (a FIFO)' "$ERR"; then fail "the FIFO's name was not escaped"; fi
    if grep -q $'\e' "$ERR"; then fail "a raw escape byte reached stderr"; fi
    rm -f "$WORK/out.h5"
    # Named directly: refused without opening it (opening would block: timeout = fail).
    run_prepare -o "$WORK/out.h5" "$WORK/text/pipe"
    expect_prepare_error "$WORK/text/pipe" "a FIFO"
    run_prepare --pairs "$WORK/text/pipe" "$WORK/out.h5" --val-fraction 0.5
    expect_prepare_error "$WORK/text/pipe" "a FIFO"
    ;;
  fifo_data_path)
    mkfifo "$WORK/tokens.h5"
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5"
    expect_rc 2
    expect_one_error fsdp_train "$WORK/tokens.h5" "a FIFO"
    mkfifo "$WORK/config.toml"
    run_train "$WORK/config.toml"
    expect_rc 2
    expect_one_error fsdp_train "$WORK/config.toml" "a FIFO"
    if [ -e "$WORK/run" ]; then fail "the refused runs created train.run_dir"; fi
    ;;
  group_not_dataset)
    cp "$FIXTURES/group_tokens.h5" group_tokens.h5
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/group_tokens.h5" --set data.seq_len=8
    expect_rc 2
    expect_one_error fsdp_train "$WORK/group_tokens.h5" "/train/tokens" "is a group"
    if cmp -s group_tokens.h5 "$FIXTURES/group_tokens.h5"; then :; else fail "the data file was changed"; fi
    ;;
  corrupted_header)
    make_text_dir "$WORK/text"
    "$FSDP_PREPARE" -o "$WORK/tokens.h5" --val-fraction 0.2 "$WORK/text" >/dev/null ||
      { fail "fsdp_prepare failed"; finish; }
    tiny_config good.toml
    # Garbage over the superblock (after its 8-byte signature: H5Fopen fails), over the
    # metadata after it (H5Fopen fails too), and over the root group's links further on (the
    # file opens, then looking up /train/tokens fails: still an input error, exit 2).
    for range in "8 88" "96 1400" "800 200"; do
      set -- $range
      cp "$WORK/tokens.h5" "$WORK/bad.h5"
      head -c "$2" /dev/zero | tr '\0' '\377' |
        dd of="$WORK/bad.h5" bs=1 seek="$1" conv=notrunc 2>/dev/null
      sum=$(sha256sum <"$WORK/bad.h5")
      run_train good.toml --set data.source=hdf5 --set data.path="$WORK/bad.h5"
      expect_rc 2
      expect_one_error fsdp_train "$WORK/bad.h5"
      if [ "$(sha256sum <"$WORK/bad.h5")" != "$sum" ]; then fail "the data file was changed"; fi
    done
    ;;
  concurrent_output)
    make_text_dir "$WORK/text"
    run_prepare -o "$WORK/out.h5" "$WORK/text"
    expect_rc 0
    before=$(sha256sum <"$WORK/out.h5")
    # This shell holds the lock on descriptor 9 (flock(1)); fsdp_prepare does not inherit it.
    head -c 9000 /dev/zero | tr '\0' 'y' >"$WORK/other.txt"
    exec 9>"$WORK/out.h5.lock"
    flock -n 9 || fail "flock(1) could not take $WORK/out.h5.lock"
    run_prepare -o "$WORK/out.h5" "$WORK/other.txt" 9>&-
    exec 9>&-
    expect_rc 2
    expect_one_error fsdp_prepare "-o/--output: $WORK/out.h5 is being written by another process" \
      "it holds $WORK/out.h5.lock" "wait for it to end"
    if [ "$(sha256sum <"$WORK/out.h5")" != "$before" ]; then
      fail "the refused run changed out.h5"
    fi
    if [ -e "$WORK/out.h5.tmp" ]; then fail "the refused run left out.h5.tmp"; fi
    # The holder created the lock file and does not remove it: it stands for a dead writer's.
    if [ ! -e "$WORK/out.h5.lock" ]; then fail "the refused run removed the holder's lock file"; fi
    run_prepare -o "$WORK/out.h5" --val-fraction 0.1 "$WORK/text"
    expect_rc 0
    if ! grep -qF "2 files, 4500 train tokens, 500 val tokens" "$OUT"; then
      fail "after the holder: wrong counts"
    fi
    if [ -e "$WORK/out.h5.lock" ] || [ -e "$WORK/out.h5.tmp" ]; then
      fail "out.h5.lock or out.h5.tmp left behind by a successful run"
    fi
    ;;
  *)
    echo "prepare.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
