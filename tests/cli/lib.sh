# tests/cli/lib.sh: helpers shared by the end-to-end CLI tests (sourced, not run).
#
# The tests drive the real executables the way a user does: fsdp_train under
# `mpirun -np 2 --oversubscribe`, fsdp_prepare directly. Each test script is called by ctest
# (tests/test_cli.cmake) as
#   bash tests/cli/SCRIPT.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC [CASE]
# and works in a fresh `mktemp -d` directory that is removed on exit. Every launch is wrapped
# in `timeout 60`, so a hang (ranks waiting in a collective after one failed) fails the test
# with exit code 124 instead of blocking ctest.
#
# Contract checked for bad input (docs/config.md "Errors"): exit code exactly 2 (what mpirun
# returns, i.e. the ranks agreed on it), exactly one line `fsdp_train: <message>` on stderr
# (printed by one rank, not once per rank), the message names the offending key or file, and
# the failure went through collective_guard (no MPI_Abort).

set -u

if [ $# -lt 3 ]; then
  echo "usage: $0 FSDP_TRAIN FSDP_PREPARE MPIEXEC [CASE]" >&2
  exit 2
fi
FSDP_TRAIN=$1
FSDP_PREPARE=$2
MPIEXEC=$3
CASE=${4:-}
SRC_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)   # repository root
TINY=$SRC_DIR/inputs/tiny.toml
# shellcheck disable=SC2034  # used by the scripts that source this file
FIXTURES=$SRC_DIR/tests/data/cli

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fsdp_cli.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1

FAILURES=0
RC=0        # exit code of the last run_train / run_prepare
OUT=$WORK/stdout.txt
ERR=$WORK/stderr.txt

# fail MESSAGE: records a failed check and shows the last command's output.
fail() {
  echo "FAIL [${CASE:-$(basename "$0")}]: $*" >&2
  echo "---- stdout ----" >&2; tail -n 40 "$OUT" >&2 2>/dev/null
  echo "---- stderr ----" >&2; tail -n 40 "$ERR" >&2 2>/dev/null
  echo "----------------" >&2
  FAILURES=$((FAILURES + 1))
}

# finish: exit status of the test script (0 iff every check passed).
finish() {
  if [ "$FAILURES" -ne 0 ]; then
    echo "${CASE:-$(basename "$0")}: $FAILURES check(s) failed" >&2
    exit 1
  fi
  echo "${CASE:-$(basename "$0")}: ok"
  exit 0
}

# run_train [-np N] ARGS...: fsdp_train under mpirun (2 ranks by default); sets RC, OUT, ERR.
run_train() {
  local np=2
  if [ "${1:-}" = "-np" ]; then np=$2; shift 2; fi
  timeout 60 "$MPIEXEC" -np "$np" --oversubscribe --bind-to none "$FSDP_TRAIN" "$@" \
    >"$OUT" 2>"$ERR" </dev/null
  RC=$?
  if [ "$RC" -eq 124 ]; then fail "fsdp_train $* did not finish within 60 s (hang?)"; fi
}

# run_prepare ARGS...: fsdp_prepare (no MPI); sets RC, OUT, ERR.
run_prepare() {
  timeout 60 "$FSDP_PREPARE" "$@" >"$OUT" 2>"$ERR" </dev/null
  RC=$?
  if [ "$RC" -eq 124 ]; then fail "fsdp_prepare $* did not finish within 60 s"; fi
}

# expect_rc CODE: the last command exited with CODE.
expect_rc() {
  if [ "$RC" -ne "$1" ]; then fail "exit code $RC, expected $1"; fi
}

# expect_one_error PROGRAM NEEDLE...: stderr holds exactly one line starting with
# "PROGRAM: ", and that line contains every NEEDLE (fixed strings).
expect_one_error() {
  local prog=$1; shift
  local n
  n=$(grep -c "^$prog: " "$ERR")
  if [ "$n" -ne 1 ]; then
    fail "expected exactly one '$prog: ...' line on stderr, found $n"
    return
  fi
  local line
  line=$(grep "^$prog: " "$ERR")
  echo "error line: $line"
  local needle
  for needle in "$@"; do
    case "$line" in
      *"$needle"*) ;;
      *) fail "error line does not contain '$needle': $line" ;;
    esac
  done
  # Nothing else on stderr (no second line of the message, no HDF5 error stack, no output of
  # another rank) apart from mpirun's own notices, which sit between lines of dashes.
  local rest
  rest=$(awk '/^--------------------+$/ { inside = !inside; next } !inside' "$ERR" | grep -v "^$prog: ")
  if [ -n "$rest" ]; then fail "unexpected stderr besides the error line: $rest"; fi
  # The message must come from the agreed path, not from a rank aborting alone.
  if grep -q "MPI_ABORT" "$ERR"; then fail "a rank called MPI_Abort instead of agreeing"; fi
  case "$line" in
    "$prog: rank "*) fail "error was not agreed across ranks (printed with a rank prefix): $line" ;;
  esac
}

# expect_input_error NEEDLE...: fsdp_train failed with exit code 2 and one line naming NEEDLEs.
expect_input_error() {
  expect_rc 2
  expect_one_error fsdp_train "$@"
}

# expect_error_matches REGEX: the single fsdp_train error line matches an extended regex.
expect_error_matches() {
  if ! grep "^fsdp_train: " "$ERR" | grep -Eq -- "$1"; then
    fail "error line does not match /$1/"
  fi
}

# tiny_config FILE [LINE...]: inputs/tiny.toml with train.run_dir = $WORK/run, plus LINEs
# appended verbatim. TOML forbids re-opening a table, so appended lines can only add a new
# table; keys of existing tables are changed with --set or sed.
tiny_config() {
  local file=$1; shift
  sed "s|^run_dir = .*|run_dir = \"$WORK/run\"|" "$TINY" >"$file"
  local line
  for line in "$@"; do printf '%s\n' "$line" >>"$file"; done
}

# make_text_dir DIR: a folder with two small text files (3000 + 2000 bytes) for fsdp_prepare.
make_text_dir() {
  mkdir -p "$1/sub"
  yes "the quick brown fox jumps over the lazy dog" | head -c 3000 >"$1/a.txt"
  yes "pack my box with five dozen liquor jugs" | head -c 2000 >"$1/sub/b.txt"
}

# snapshot DIR [NAME]: checksums of every file under DIR, sorted by path, except the run_dir
# lock file (a refused run may create it; it is empty again once released) and files named
# NAME. Compare two snapshots to prove a command left DIR byte-identical.
snapshot() {
  (cd "$1" && find . -type f ! -name fsdp_train.lock ! -name "${2:-fsdp_train.lock}" -print0 |
     sort -z | xargs -0 sha256sum)
}

# wait_for SECONDS CMD...: runs CMD every 0.05 s until it succeeds (0) or SECONDS pass (1):
# a bounded poll for an event (a metrics line, a file), never a fixed sleep.
wait_for() {
  local limit=$1; shift
  local end=$((SECONDS + limit))
  until "$@"; do
    if [ "$SECONDS" -ge "$end" ]; then return 1; fi
    sleep 0.05
  done
}

# bpe_json FILE [EDIT]: a minimal valid byte-level BPE tokenizer.json (the 256 byte tokens, the
# merge "t h" -> 256, the added token <eos> 257), after the Python statement EDIT on its dict t
# (json only: any python3). tests/cli/tokenizers.sh, disk_full.sh.
bpe_json() {
  python3 - "$1" "${2:-pass}" <<'EOF'
import json, sys
chars, n = [], 256
for b in range(256):
    printable = 33 <= b <= 126 or 161 <= b <= 172 or b >= 174
    chars.append(chr(b) if printable else chr(n))
    n += 0 if printable else 1
vocab = {c: i for i, c in enumerate(chars)}
vocab["th"] = 256
t = {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
     "added_tokens": [{"id": 257, "content": "<eos>", "special": True}],
     "model": {"type": "BPE", "vocab": vocab, "merges": ["t h"]}}
exec(sys.argv[2])
json.dump(t, open(sys.argv[1], "w"))
EOF
}
