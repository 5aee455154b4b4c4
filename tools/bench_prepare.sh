#!/usr/bin/env bash
# tools/bench_prepare.sh: fsdp_prepare --tokenizer's speed and memory on real text, beside
# js-tiktoken (docs/benchmarks.md "fsdp_prepare").
#
#   tools/bench_prepare.sh [BUILD_DIR]     (default: build)
#   env: COPIES (10: copies of the fortunes corpus), THREADS ("1 2": --num-threads values),
#        REPEAT (2: runs of each, the best kept)
#
# Corpus: the fortunes (Debian package fortunes, 2.8 MB, 43 files) copied COPIES times into a
# temporary folder. Tokenizers: GPT-2 and cl100k_base in Llama 3's layout, written as
# tokenizer.json by tools/tiktoken_reference.cjs (js-tiktoken from tools/install_deps.sh).
# Each row: fsdp_prepare at one thread count (wall seconds of the whole run: reading,
# encoding, the spill and the HDF5; input MB/s; peak RSS from /usr/bin/time), and the peer,
# js-tiktoken's encode of the same texts (one thread; JavaScript, not tiktoken's Rust core;
# encoding only, the files read before the clock starts). Runs are interleaved per repeat.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PREPARE=$BUILD/fsdp_prepare
COPIES=${COPIES:-10}
THREADS=${THREADS:-1 2}
REPEAT=${REPEAT:-2}
[[ -x $PREPARE ]] || { echo "bench_prepare: $PREPARE not built" >&2; exit 2; }
[[ -x /usr/bin/time ]] || { echo "bench_prepare: /usr/bin/time missing (Debian package time)" >&2; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/bench_prepare.XXXXXX")
trap 'rm -rf "$W"' EXIT
for c in $(seq 1 "$COPIES"); do
  mkdir -p "$W/corpus/$c"
  find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' -exec cp {} "$W/corpus/$c/" \;
done
mapfile -t files < <(find "$W/corpus" -type f | LC_ALL=C sort)
mb=$(du -sb "$W/corpus" | awk '{ printf "%.1f", $1 / 1e6 }')
echo "corpus: ${#files[@]} files, $mb MB; $(nproc) CPUs ($(lscpu | sed -n 's/^Model name: *//p'))"
node tools/tiktoken_reference.cjs tokenizer gpt2 gpt2 "$W/gpt2" >/dev/null
node tools/tiktoken_reference.cjs tokenizer cl100k_base llama3 "$W/l3" >/dev/null
declare -A best
for r in $(seq 1 "$REPEAT"); do
  for tok in gpt2 l3; do
    for t in $THREADS; do
      /usr/bin/time -f "%e %M" -o "$W/time" "$PREPARE" --tokenizer "$W/$tok" --num-threads "$t" \
        -o "$W/out.h5" "$W/corpus" >"$W/summary"
      read -r s kb <"$W/time"
      key="$tok fsdp_prepare --num-threads $t"
      if [[ -z ${best[$key]:-} ]] || awk -v a="$s" -v b="${best[$key]%% *}" 'BEGIN { exit !(a < b) }'; then
        best[$key]="$s $kb $(grep -o '[0-9]* train tokens, [0-9]* val' "$W/summary" | awk '{ print $1 + $4 }')"
      fi
      rm -f "$W/out.h5"
    done
    enc=$([[ $tok == gpt2 ]] && echo gpt2 || echo cl100k_base)
    read -r s n < <(node tools/tiktoken_reference.cjs time "$enc" "${files[@]}")
    key="$tok js-tiktoken (encode only)"
    if [[ -z ${best[$key]:-} ]] || awk -v a="$s" -v b="${best[$key]%% *}" 'BEGIN { exit !(a < b) }'; then
      best[$key]="$s - $n"
    fi
  done
done
printf '| tokenizer | run | seconds | MB/s | tokens | peak RSS |\n|---|---|---:|---:|---:|---:|\n'
for key in $(printf '%s\n' "${!best[@]}" | tr ' ' '~' | LC_ALL=C sort); do
  k=${key//\~/ }
  read -r s kb n <<<"${best[$k]}"
  rss=$([[ $kb == - ]] && echo "-" || echo "$((kb / 1024)) MiB")
  printf '| %s | %s | %.2f | %.1f | %s | %s |\n' "${k%% *}" "${k#* }" "$s" "$(awk -v m="$mb" -v s="$s" 'BEGIN { print m / s }')" "$n" "$rss"
done
