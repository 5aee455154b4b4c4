#!/usr/bin/env bash
# tools/prepare_wordnet.sh: a seq2seq data set "gloss -> headword" from WordNet 3.0 (Debian
# package wordnet-base), written as a pairs TSV and turned into an HDF5 pairs file by
# `fsdp_prepare --pairs` (docs/data.md, "seq2seq pairs").
#
#   tools/prepare_wordnet.sh [OUT.h5] [FSDP_PREPARE]
#     OUT.h5        default data/wordnet_pairs.h5 (the TSV is written beside it, OUT.tsv)
#     FSDP_PREPARE  default build/fsdp_prepare
#   env: WORDNET_DIR (default /usr/share/wordnet), VAL_FRACTION (default 0.05)
#
# From every synset line of data.noun, data.verb, data.adj and data.adv (the license header's
# lines, which start with two spaces, are skipped):
#   input  = the gloss (the text after " | ") up to its first ';' (where the examples begin),
#            with surrounding spaces removed;
#   target = the synset's first word (field 5), its adjective marker "(a)", "(p)" or "(ip)"
#            removed and underscores turned into spaces.
# Lines are ordered by a multiplicative hash of their line number (Knuth: n * 2654435761
# mod 2^32), a fixed order that spreads the four parts of speech evenly, so the validation
# split (the last VAL_FRACTION of the lines) is not all adverbs. Prints the counts.
set -euo pipefail

out=${1:-data/wordnet_pairs.h5}
prepare=${2:-build/fsdp_prepare}
wn=${WORDNET_DIR:-/usr/share/wordnet}
val_fraction=${VAL_FRACTION:-0.05}
files=("$wn/data.noun" "$wn/data.verb" "$wn/data.adj" "$wn/data.adv")

for f in "${files[@]}"; do
  if [[ ! -r $f ]]; then
    echo "prepare_wordnet: $f: not found (install the Debian package wordnet-base: tools/install_deps.sh)" >&2
    exit 2
  fi
done
if [[ ! -x $prepare ]]; then
  echo "prepare_wordnet: $prepare: fsdp_prepare not found (build it, or pass its path as the 2nd argument)" >&2
  exit 2
fi
mkdir -p "$(dirname "$out")"
tsv=${out%.h5}.tsv

export LC_ALL=C
LC_ALL=C awk -v counts="$tsv.counts" '
  /^  / { next }                          # license header
  {
    bar = index($0, " | ")
    if (bar == 0) { nobar++; next }
    gloss = substr($0, bar + 3)
    semi = index(gloss, ";")
    if (semi > 0) gloss = substr(gloss, 1, semi - 1)
    gsub(/^[ \t]+|[ \t]+$/, "", gloss)
    split(substr($0, 1, bar - 1), field, " ")
    word = field[5]
    sub(/\((a|p|ip)\)$/, "", word)
    gsub(/_/, " ", word)
    if (gloss == "" || word == "") { empty++; next }
    n++
    pos[field[3]]++
    printf "%.0f\t%s\t%s\n", (n * 2654435761) % 4294967296, gloss, word  # %.0f: mawk clamps %d at 2^31-1
  }
  END {
    printf "synsets %d (n %d, v %d, a %d, s %d, r %d), skipped %d without gloss separator, %d empty\n",
           n, pos["n"], pos["v"], pos["a"], pos["s"], pos["r"], nobar, empty > counts
  }' "${files[@]}" | sort -t "$(printf '\t')" -k1,1n -s | cut -f2- >"$tsv.tmp"
mv "$tsv.tmp" "$tsv"
echo "prepare_wordnet: $tsv: $(cat "$tsv.counts") (pos: n noun, v verb, a adjective, s satellite adjective, r adverb)"
rm -f "$tsv.counts"
echo "prepare_wordnet: $tsv: $(wc -l <"$tsv") pairs, $(cut -f1 "$tsv" | wc -c) input bytes (with newlines), $(cut -f2 "$tsv" | wc -c) target bytes (with newlines)"
"$prepare" --pairs "$tsv" "$out" --val-fraction "$val_fraction"
