#!/usr/bin/env bash
# tests/cli/tokenizers.sh: fsdp_prepare's real tokenizers end to end (docs/data.md
# "fsdp_prepare --tokenizer", "fsdp_prepare --token-file").
#
#   bash tests/cli/tokenizers.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE sentencepiece_ok:  a model trained here with spm_train (Debian package `sentencepiece`;
#              exit 77 = skipped without it) encodes a folder: one exact summary line (files,
#              documents, tokens, vocab, bos + eos per document), nothing on stderr, no .tmp;
#              --document line --no-add-bos says "eos 2 per document"; where /usr/bin/python3
#              has sentencepiece and h5py, the stored ids equal Python's encoding and the
#              record (tokenizer, vocab_size, tokenizer_model_sha256 = sha256sum) is checked.
# CASE sentencepiece_errors: a missing, empty, corrupt or truncated tokenizer.model, a folder
#              as model, --add-bos on a model without BOS, --add-bos with --no-add-bos, a bad
#              --document, SentencePiece options without --tokenizer, two modes at once: each
#              exits 2 with one `fsdp_prepare: ...` line naming the file or option, no output.
# CASE token_files_ok: llm.c GPT-2 (v1, uint16) and Llama 3 (v7, uint32) files and a nanoGPT
#              .bin written here: exact summary lines; --val-token-file; ids checked in Python
#              (h5py) where available.
# CASE token_files_errors: truncated llm.c header, bad magic (--token-format llm.c), a count
#              that disagrees with the size, odd-length nanoGPT file, an id >= --vocab-size, an
#              empty file, a missing --vocab-size, mixed formats: exit 2, one line naming the
#              file (and position/value), no output.
# CASE hf_bpe_gpt2: a GPT-2 tokenizer.json + tokenizer_config.json (tiktoken's GPT-2 ranks
#              from js-tiktoken, tools/tiktoken_reference.cjs; exit 77 = skipped without it)
#              encodes the fortunes corpus and a generated Unicode stress corpus: the ids equal
#              tiktoken's, <|endoftext|> once before each document (BOS = EOS), the record
#              (tokenizer hf-bpe, vocab_size 50257, sha256sum of the file, uint16); the folder and
#              the file both load; --no-add-bos puts it after each document instead; with an
#              NFC or NFKC normalizer added, the ids equal tiktoken's of Python's normalized text.
# CASE hf_bpe_llama3: cl100k_base in Meta-Llama-3's tokenizer.json layout (Split + ByteLevel,
#              ignore_merges, merges as pairs, BOS from the TemplateProcessing), encoded on 3
#              threads: ids equal tiktoken's with <|begin_of_text|> first, uint32 ids;
#              --document line with --eos-token '<|end_of_text|>' puts both around every
#              non-empty line; --document jsonl --text-key content reads JSON Lines records.
# CASE hf_bpe_o200k: o200k_base in openai/gpt-oss's tokenizer.json layout (o200k's Split pattern
#              with its letter-case classes and (?i:...) contractions, ByteLevel, no template,
#              tokenizer_config.json: no BOS, EOS <|endoftext|>; Llama 4's pattern is the same),
#              encoded on 2 threads: ids equal tiktoken's o200k_base with EOS 199999 after each
#              document, on the fortunes corpus and the Unicode stress corpus.
# CASE hf_bpe_errors: tokenizer.json files that are not JSON, not BPE, not byte-level, with a
#              Lowercase normalizer, a field of the wrong type, a merge of an unknown token, a
#              bad regex; an unknown --bos-token, --add-eos without an EOS, --eos-token with a
#              SentencePiece model, --num-threads -2, --text-key without jsonl, plain text as
#              jsonl, a folder with no tokenizer file, an input that is not UTF-8: each exits 2 with one line naming the file or option, no
#              output.
# CASE train: fsdp_train trains on a SentencePiece-prepared file (model.vocab_size = the
#              model's piece count) and on imported llm.c ids; a model.vocab_size below the
#              file's recorded vocab_size exits 2 naming both.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

PY=/usr/bin/python3   # Debian's interpreter: python3-sentencepiece, python3-h5py, numpy

# expect_prepare_error NEEDLE...: exit code 2, one error line with every NEEDLE, no output.
expect_prepare_error() {
  expect_rc 2
  expect_one_error fsdp_prepare "$@"
  if [ -e "$WORK/out.h5" ] || [ -e "$WORK/out.h5.tmp" ]; then
    fail "a failed fsdp_prepare left out.h5 or out.h5.tmp"
    rm -f "$WORK/out.h5" "$WORK/out.h5.tmp"
  fi
}

# make_corpus DIR: two text files of a few hundred lines (words from a fixed list).
make_corpus() {
  mkdir -p "$1/sub"
  "$PY" - "$1" <<'EOF'
import random, sys
rng = random.Random(7)
words = "the quick brown fox jumps over lazy dog pack my box with five dozen liquor jugs café über".split()
def lines(n):
    return "".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + "\n" for _ in range(n))
open(sys.argv[1] + "/a.txt", "w").write(lines(300))
open(sys.argv[1] + "/sub/b.txt", "w").write(lines(200) + "\n\n")
EOF
}

# train_spm PREFIX ARGS...: spm_train on $WORK/corpus/a.txt (exit 77 if spm_train is missing).
train_spm() {
  local prefix=$1; shift
  if ! command -v spm_train >/dev/null; then
    echo "spm_train not found (Debian package sentencepiece): skipped"
    exit 77
  fi
  spm_train --input="$WORK/corpus/a.txt" --model_prefix="$prefix" --minloglevel=2 \
    --character_coverage=1.0 --num_threads=1 "$@" >"$WORK/spm.log" 2>&1 ||
    { fail "spm_train failed: $(tail -3 "$WORK/spm.log")"; finish; }
}

# write_tokens KIND PATH [ARGS]: token files as llm.c / nanoGPT write them.
#   llmc PATH MAGIC VERSION WIDTH N VOCAB [COUNT]: header + N ids (i * 7919 % VOCAB)
#   nano PATH N VOCAB: raw uint16
#   raw PATH HEX: bytes given in hex
write_tokens() {
  "$PY" - "$@" <<'EOF'
import struct, sys
kind, path = sys.argv[1], sys.argv[2]
a = sys.argv[3:]
if kind == "llmc":
    magic, version, width, n, vocab = map(int, a[:5])
    count = int(a[5]) if len(a) > 5 else n
    header = struct.pack("<256i", magic, version, count, *([0] * 253))
    fmt = "<%d%s" % (n, "H" if width == 2 else "I")
    open(path, "wb").write(header + struct.pack(fmt, *[(i * 7919) % vocab for i in range(n)]))
elif kind == "nano":
    n, vocab = map(int, a[:2])
    open(path, "wb").write(struct.pack("<%dH" % n, *[(i * 7919) % vocab for i in range(n)]))
elif kind == "raw":
    open(path, "wb").write(bytes.fromhex(a[0]))
EOF
}

have_py_h5() { "$PY" -c 'import h5py, numpy, sentencepiece' 2>/dev/null; }

# tiktoken_reference ARGS...: tools/tiktoken_reference.cjs (exit 77 where node or js-tiktoken
# is missing: tools/install_deps.sh installs it).
tiktoken_reference() {
  if ! command -v node >/dev/null; then
    echo "node not found: the tiktoken reference cannot run: skipped"
    exit 77
  fi
  node "$SRC_DIR/tools/tiktoken_reference.cjs" "$@" >"$WORK/node.log" 2>&1
  local rc=$?
  if [ "$rc" -eq 77 ]; then cat "$WORK/node.log"; exit 77; fi
  if [ "$rc" -ne 0 ]; then fail "tiktoken_reference.cjs $1 failed: $(tail -3 "$WORK/node.log")"; finish; fi
}

# input_files DIR: the regular files of DIR (recursive, *.dat and symbolic links left out),
# sorted by path as fsdp_prepare reads them.
input_files() {
  "$PY" - "$1" <<'EOF'
import os, sys
print("\n".join(sorted(os.path.join(r, f) for r, _, fs in os.walk(sys.argv[1]) for f in fs
                       if not f.endswith(".dat") and not os.path.islink(os.path.join(r, f)))))
EOF
}

# expect_tiktoken_ids H5 ENCODING BOS EOS DIR: the token stream of H5 (train then val) equals
# [BOS] + tiktoken's ids + [EOS] for each file of DIR in order (-1: none), and the record's
# add_bos / add_eos say so.
expect_tiktoken_ids() {
  local h5=$1 encoding=$2 bos=$3 eos=$4 dir=$5
  local files
  mapfile -t files < <(input_files "$dir")
  tiktoken_reference encode "$encoding" "$WORK/want.json" "${files[@]}"
  "$PY" - "$h5" "$WORK/want.json" "$bos" "$eos" <<'EOF' || fail "$h5: ids differ from tiktoken's ($encoding)"
import json, sys, h5py, numpy as np
h5, want_json, bos, eos = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
f = h5py.File(h5, "r")
got = np.concatenate([f["/train/tokens"][:], f["/val/tokens"][:]]).astype(np.int64)
want = []
for ids in json.load(open(want_json)):
    want += ([bos] if bos >= 0 else []) + ids + ([eos] if eos >= 0 else [])
want = np.array(want, dtype=np.int64)
n = min(len(got), len(want))
diff = np.nonzero(got[:n] != want[:n])[0]
if len(got) != len(want) or len(diff):
    i = int(diff[0]) if len(diff) else n
    sys.exit("%d ids, tiktoken %d; first difference at %d: %s vs %s" %
             (len(got), len(want), i, got[i:i + 8].tolist(), want[i:i + 8].tolist()))
a = f.attrs
assert a["add_bos"] == (bos >= 0) and a["add_eos"] == (eos >= 0), dict(a)
print("%s: %d ids equal to tiktoken's" % (h5, len(got)))
EOF
}

# make_stress_corpus DIR: text that exercises the pre-tokenizer's regex: contractions in both
# cases, digits of several scripts, CR LF and whitespace runs, CJK, emoji with modifiers,
# combining marks, control bytes, a special token's spelling, a long letter run.
make_stress_corpus() {
  mkdir -p "$1"
  "$PY" - "$1" <<'EOF'
import random, sys
rng = random.Random(3)
pieces = ["Hello", " world", "IT'S", "they'Re", "don't", "'ll", "12345678", "３４５", "٣٤٥", "\r\n",
          "\n\n\n", "   ", "\t\t", " \u00a0 ", "日本語のテキスト", "한국어", "emoji 😀👍🏽", "e\u0301",
          "naïve café", "Ωμέγα", "—", "...", "!!!", "$$$", "<|endoftext|>", "\u200b", "x" * 300,
          "\u2028", "ǅ", "ﬁ", "  \n  ", "a1b2c3", "3.14159", "foo_bar-baz", "\x00\x01\x7f",
          "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "     end"]
for k in range(3):
    with open("%s/s%d.txt" % (sys.argv[1], k), "w", encoding="utf-8") as f:
        f.write("".join(rng.choice(pieces) + rng.choice(["", " ", "\n"]) for _ in range(3000)))
EOF
}

FORTUNES=/usr/share/games/fortunes  # the main job's corpus (Debian package fortunes)
need_fortunes() {
  if [ ! -d "$FORTUNES" ]; then fail "$FORTUNES missing (Debian package fortunes, tools/install_deps.sh)"; finish; fi
}

case "$CASE" in
  sentencepiece_ok)
    make_corpus "$WORK/corpus"
    train_spm "$WORK/m" --model_type=bpe --vocab_size=300 --byte_fallback=true
    run_prepare --tokenizer "$WORK/m.model" -o "$WORK/out.h5" --val-fraction 0.1 "$WORK/corpus"
    expect_rc 0
    if ! grep -Eq "^fsdp_prepare: $WORK/out.h5: 2 files, 2 documents, [0-9]+ train tokens, [0-9]+ val tokens \(vocab 300, sentencepiece $WORK/m.model, bos 1 \+ eos 2 per document\)$" "$OUT"; then
      fail "summary line"
    fi
    if [ -s "$ERR" ]; then fail "stderr not empty on success"; fi
    if [ -e "$WORK/out.h5.tmp" ]; then fail "out.h5.tmp left behind"; fi
    run_prepare --tokenizer "$WORK/m.model" --document line --no-add-bos -o "$WORK/lines.h5" "$WORK/corpus"
    expect_rc 0
    if ! grep -Eq "2 files, 500 documents, .*\(vocab 300, sentencepiece .*, eos 2 per document\)$" "$OUT"; then
      fail "--document line --no-add-bos summary"
    fi
    # Prompt-completion pairs for data.objective = "sft" (TRL's JSON Lines).
    for i in $(seq 1 20); do
      printf '{"prompt": "fully sharded %d", "completion": " data parallel %d", "id": %d}\n' "$i" "$i" "$i"
    done >"$WORK/sft.jsonl"
    run_prepare --pairs "$WORK/sft.jsonl" --tokenizer "$WORK/m.model" -o "$WORK/sft.h5" --val-fraction 0.1
    expect_rc 0
    if ! grep -Eq "^fsdp_prepare: $WORK/sft.h5: 20 pairs \(18 train, 2 val\), .*\(vocab 300, sentencepiece, bos 1 before each prompt, eos 2 after each completion; data.objective = \"sft\"\)$" "$OUT"; then
      fail "--pairs --tokenizer summary"
    fi
    if have_py_h5; then
      "$PY" - "$WORK" "$(sha256sum <"$WORK/m.model" | cut -d' ' -f1)" <<'EOF' || fail "ids or record differ from Python's sentencepiece"
import sys, h5py, numpy as np, sentencepiece as spm
work, sha = sys.argv[1], sys.argv[2]
sp = spm.SentencePieceProcessor(model_file=work + "/m.model")
def stored(path):
    f = h5py.File(path, "r")
    return f, list(np.concatenate([f["/train/tokens"][:], f["/val/tokens"][:]]))
texts = [open(work + "/corpus/" + p, "rb").read().decode() for p in ("a.txt", "sub/b.txt")]
f, ids = stored(work + "/out.h5")
assert ids == sum(([1] + sp.encode(t) + [2] for t in texts), []), "files"
a = dict(f.attrs)
assert a["tokenizer"] == "sentencepiece" and a["vocab_size"] == 300, a
assert a["tokenizer_model"] == work + "/m.model" and a["tokenizer_model_sha256"] == sha, a
assert a["add_bos"] == 1 and a["add_eos"] == 1 and a["bos_id"] == 1 and a["eos_id"] == 2, a
assert f["/train/tokens"].dtype == np.uint16, f["/train/tokens"].dtype
f, ids = stored(work + "/lines.h5")
assert ids == sum((sp.encode(l) + [2] for t in texts for l in t.split("\n") if l), []), "lines"
f = h5py.File(work + "/sft.h5", "r")
assert f.attrs["vocab_size"] == 300 and f.attrs["tokenizer"] == "sentencepiece", dict(f.attrs)
o = f["/train/input_offsets"][:]
assert list(f["/train/inputs"][o[0]:o[1]]) == [1] + sp.encode("fully sharded 1"), "prompt"
o = f["/train/target_offsets"][:]
assert list(f["/train/targets"][o[0]:o[1]]) == sp.encode(" data parallel 1") + [2], "completion"
EOF
    else
      echo "no sentencepiece/h5py in $PY: Python cross-check skipped"
    fi
    ;;
  sentencepiece_errors)
    make_corpus "$WORK/corpus"
    train_spm "$WORK/m" --model_type=bpe --vocab_size=150
    train_spm "$WORK/nobos" --model_type=unigram --vocab_size=40 --bos_id=-1 --eos_id=1 --unk_id=2 --pad_id=0
    : >"$WORK/empty.model"
    head -c 4000 /dev/urandom >"$WORK/garbage.model"
    head -c 2000 "$WORK/m.model" >"$WORK/truncated.model"
    mkdir "$WORK/dir.model"
    run_prepare --tokenizer "$WORK/missing.model" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/missing.model" "not found"
    run_prepare --tokenizer "$WORK/empty.model" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/empty.model" "empty"
    run_prepare --tokenizer "$WORK/garbage.model" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/garbage.model" "not a SentencePiece model"
    run_prepare --tokenizer "$WORK/truncated.model" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/truncated.model" "not a SentencePiece model"
    run_prepare --tokenizer "$WORK/dir.model" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/dir.model" "neither tokenizer.json nor tokenizer.model"
    run_prepare --tokenizer "$WORK/nobos.model" --add-bos -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--add-bos" "nobos.model" "no BOS"
    run_prepare --tokenizer "$WORK/m.model" --add-bos --no-add-bos -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--add-bos" "--no-add-bos"
    run_prepare --tokenizer "$WORK/m.model" --document paragraph -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--document" "paragraph"
    run_prepare --no-add-eos -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--no-add-eos" "without --tokenizer"
    run_prepare --tokenizer "$WORK/m.model" --pairs "$WORK/p.jsonl" -o "$WORK/out.h5"
    expect_prepare_error "p.jsonl" "cannot read input file (No such file or directory)"
    printf '{"prompt": "a", "completion": ""}\n' >"$WORK/empty_completion.jsonl"
    run_prepare --tokenizer "$WORK/m.model" --pairs "$WORK/empty_completion.jsonl" -o "$WORK/out.h5"
    expect_prepare_error "empty_completion.jsonl:1" '"completion" is empty'
    run_prepare --tokenizer "$WORK/m.model" --pairs "$WORK/empty_completion.jsonl" --document line -o "$WORK/out.h5"
    expect_prepare_error "--document" "with --pairs"
    run_prepare --tokenizer "$WORK/m.model" -o "$WORK/out.h5" "$WORK/missing_dir"
    expect_prepare_error "missing_dir"
    ;;
  token_files_ok)
    write_tokens llmc "$WORK/gpt2_000.bin" 20240520 1 2 3000 50257
    write_tokens llmc "$WORK/gpt2_001.bin" 20240520 1 2 1000 50257
    write_tokens llmc "$WORK/gpt2_val.bin" 20240520 1 2 500 50257
    run_prepare --token-file "$WORK/gpt2_000.bin" "$WORK/gpt2_001.bin" --vocab-size 50257 -o "$WORK/g.h5" --val-fraction 0.1
    expect_rc 0
    want="fsdp_prepare: $WORK/g.h5: 2 files, 3600 train tokens, 400 val tokens (vocab 50257, llm.c gpt-2 (magic 20240520, version 1, uint16))"
    if [ "$(cat "$OUT")" != "$want" ]; then fail "llm.c summary: expected '$want'"; fi
    if [ -s "$ERR" ]; then fail "stderr not empty on success"; fi
    # Repeated --token-file and --val-token-file.
    run_prepare --token-file "$WORK/gpt2_000.bin" --token-file "$WORK/gpt2_001.bin" \
      --val-token-file "$WORK/gpt2_val.bin" --vocab-size 50257 -o "$WORK/gv.h5"
    expect_rc 0
    if ! grep -qF "gv.h5: 2 files + 1 val file, 4000 train tokens, 500 val tokens (vocab 50257," "$OUT"; then
      fail "--val-token-file summary"
    fi
    write_tokens llmc "$WORK/llama3.bin" 20240801 7 4 2000 128256
    run_prepare --token-file "$WORK/llama3.bin" --vocab-size 128256 -o "$WORK/l.h5"
    expect_rc 0
    want="fsdp_prepare: $WORK/l.h5: 1 file, 1900 train tokens, 100 val tokens (vocab 128256, llm.c llama-3 (magic 20240801, version 7, uint32))"
    if [ "$(cat "$OUT")" != "$want" ]; then fail "llama-3 summary: expected '$want'"; fi
    write_tokens nano "$WORK/train.bin" 2000 50257
    run_prepare --token-file "$WORK/train.bin" --vocab-size 50304 -o "$WORK/n.h5"
    expect_rc 0
    want="fsdp_prepare: $WORK/n.h5: 1 file, 1900 train tokens, 100 val tokens (vocab 50304, nanogpt (raw uint16))"
    if [ "$(cat "$OUT")" != "$want" ]; then fail "nanoGPT summary: expected '$want'"; fi
    if have_py_h5; then
      "$PY" - "$WORK" <<'EOF' || fail "imported ids differ"
import sys, h5py, numpy as np
w = sys.argv[1]
def ids(p):
    f = h5py.File(w + "/" + p, "r")
    return f, list(np.concatenate([f["/train/tokens"][:], f["/val/tokens"][:]]))
f, got = ids("g.h5")
assert got == [(i * 7919) % 50257 for i in range(3000)] + [(i * 7919) % 50257 for i in range(1000)]
assert f.attrs["tokenizer"] == "llm.c" and f.attrs["vocab_size"] == 50257, dict(f.attrs)
f, got = ids("l.h5")
assert got == [(i * 7919) % 128256 for i in range(2000)] and f["/train/tokens"].dtype == np.uint32
f, got = ids("n.h5")
assert got == [(i * 7919) % 50257 for i in range(2000)] and f.attrs["tokenizer"] == "nanogpt"
EOF
    fi
    ;;
  token_files_errors)
    write_tokens llmc "$WORK/ok.bin" 20240520 1 2 100 50257
    head -c 700 "$WORK/ok.bin" >"$WORK/trunc.bin"
    write_tokens llmc "$WORK/count.bin" 20240520 1 2 100 50257 150
    write_tokens nano "$WORK/nano.bin" 100 50257
    head -c 199 "$WORK/nano.bin" >"$WORK/odd.bin"
    write_tokens nano "$WORK/big_ids.bin" 100 60000   # id 55433 at position 7 (7 * 7919 % 60000)
    : >"$WORK/empty.bin"
    run_prepare --token-file "$WORK/trunc.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/trunc.bin" "truncated llm.c header" "700 bytes"
    run_prepare --token-file "$WORK/nano.bin" --token-format llm.c --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/nano.bin" "bad magic"
    run_prepare --token-file "$WORK/count.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/count.bin" "150 tokens" "1324 bytes" "file has 1224 bytes"
    run_prepare --token-file "$WORK/odd.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/odd.bin" "odd byte length 199"
    run_prepare --token-file "$WORK/big_ids.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/big_ids.bin" "token 55433 at position 7" "--vocab-size 50257"
    run_prepare --token-file "$WORK/empty.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/empty.bin" "empty"
    run_prepare --token-file "$WORK/missing.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/missing.bin" "not found"
    run_prepare --token-file "$WORK/ok.bin" -o "$WORK/out.h5"
    expect_prepare_error "--vocab-size" "missing"
    run_prepare --token-file "$WORK/ok.bin" "$WORK/nano.bin" --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "$WORK/nano.bin" "one format"
    run_prepare --token-file "$WORK/ok.bin" --val-token-file "$WORK/ok.bin" --val-fraction 0.2 \
      --vocab-size 50257 -o "$WORK/out.h5"
    expect_prepare_error "--val-fraction" "--val-token-file"
    run_prepare --vocab-size 50257 -o "$WORK/out.h5" "$WORK/ok.bin"
    expect_prepare_error "--vocab-size" "without --token-file"
    ;;
  hf_bpe_gpt2)
    need_fortunes
    tiktoken_reference tokenizer gpt2 gpt2 "$WORK/gpt2"
    make_stress_corpus "$WORK/stress"
    run_prepare --tokenizer "$WORK/gpt2" -o "$WORK/f.h5" "$FORTUNES"
    expect_rc 0
    if ! grep -Eq "^fsdp_prepare: $WORK/f.h5: [0-9]+ files, [0-9]+ documents, [0-9]+ train tokens, [0-9]+ val tokens \(vocab 50257, hf-bpe $WORK/gpt2, bos 50256 per document\)$" "$OUT"; then
      fail "summary line"
    fi
    if [ -s "$ERR" ]; then fail "stderr not empty on success"; fi
    expect_tiktoken_ids "$WORK/f.h5" gpt2 50256 -1 "$FORTUNES"
    "$PY" - "$WORK/f.h5" "$WORK/gpt2/tokenizer.json" "$(sha256sum <"$WORK/gpt2/tokenizer.json" | cut -d' ' -f1)" <<'EOF' || fail "record"
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
a = f.attrs
assert a["tokenizer"] == "hf-bpe" and a["vocab_size"] == 50257, dict(a)
assert a["tokenizer_model"] == sys.argv[2] and a["tokenizer_model_sha256"] == sys.argv[3], dict(a)
assert a["bos_id"] == 50256 and a["eos_id"] == 50256, dict(a)
assert f["/train/tokens"].dtype == np.uint16, f["/train/tokens"].dtype
EOF
    # The file itself (not its folder), the stress corpus, EOS after each document instead.
    run_prepare --tokenizer "$WORK/gpt2/tokenizer.json" --no-add-bos -o "$WORK/s.h5" "$WORK/stress"
    expect_rc 0
    if ! grep -qF "(vocab 50257, hf-bpe $WORK/gpt2/tokenizer.json, eos 50256 per document)" "$OUT"; then
      fail "--no-add-bos summary"
    fi
    expect_tiktoken_ids "$WORK/s.h5" gpt2 -1 50256 "$WORK/stress"
    # Normalizers (Qwen2's tokenizer.json has NFC): GPT-2's file with NFC or NFKC added encodes
    # the stress corpus (e + combining acute, ﬁ, fullwidth digits, ǅ) as tiktoken encodes
    # Python's unicodedata.normalize of it; no tokenizer_config.json there: no BOS/EOS.
    for form in NFC NFKC; do
      "$PY" - "$form" "$WORK" <<'EOF'
import json, os, sys, unicodedata
form, w = sys.argv[1], sys.argv[2]
t = json.load(open(w + "/gpt2/tokenizer.json"))
t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": form}]}
os.makedirs("%s/gpt2_%s" % (w, form))
json.dump(t, open("%s/gpt2_%s/tokenizer.json" % (w, form), "w"))
os.makedirs("%s/stress_%s" % (w, form))
for f in os.listdir(w + "/stress"):
    text = open(w + "/stress/" + f, encoding="utf-8", newline="").read()
    assert unicodedata.normalize(form, text) != text
    open("%s/stress_%s/%s" % (w, form, f), "w", encoding="utf-8", newline="").write(
        unicodedata.normalize(form, text))
EOF
      run_prepare --tokenizer "$WORK/gpt2_$form" -o "$WORK/$form.h5" "$WORK/stress"
      expect_rc 0
      expect_tiktoken_ids "$WORK/$form.h5" gpt2 -1 -1 "$WORK/stress_$form"
    done
    ;;
  hf_bpe_llama3)
    need_fortunes
    tiktoken_reference tokenizer cl100k_base llama3 "$WORK/l3"
    make_stress_corpus "$WORK/stress"
    for corpus in "$FORTUNES" "$WORK/stress"; do  # on 3 threads: the same ids as on one
      run_prepare --tokenizer "$WORK/l3/tokenizer.json" --num-threads 3 -o "$WORK/l.h5" "$corpus"
      expect_rc 0
      if ! grep -qF "(vocab 100279, hf-bpe $WORK/l3/tokenizer.json, bos 100277 per document)" "$OUT"; then
        fail "summary line ($corpus)"
      fi
      expect_tiktoken_ids "$WORK/l.h5" cl100k_base 100277 -1 "$corpus"
      "$PY" -c 'import sys, h5py, numpy as np; assert h5py.File(sys.argv[1], "r")["/val/tokens"].dtype == np.uint32' \
        "$WORK/l.h5" || fail "ids above 65535 not stored as uint32"
      rm -f "$WORK/l.h5"
    done
    # --document line and an explicit EOS: BOS line EOS for every non-empty line; the reference
    # encodes the same lines as files.
    mkdir -p "$WORK/lines" "$WORK/lines_as_files"
    printf 'First line.\r\nSecond: 42 cats\n\nthird\n' >"$WORK/lines/a.txt"
    printf 'First line.' >"$WORK/lines_as_files/1.txt"
    printf 'Second: 42 cats' >"$WORK/lines_as_files/2.txt"
    printf 'third' >"$WORK/lines_as_files/3.txt"
    run_prepare --tokenizer "$WORK/l3" --document line --eos-token '<|end_of_text|>' --val-fraction 0.3 \
      -o "$WORK/lines.h5" "$WORK/lines"
    expect_rc 0
    if ! grep -q "1 files, 3 documents, .*bos 100277 + eos 100278 per document)$" "$OUT"; then
      fail "--document line summary"
    fi
    expect_tiktoken_ids "$WORK/lines.h5" cl100k_base 100277 100278 "$WORK/lines_as_files"
    # --document jsonl --text-key content: JSON Lines records (escapes decoded, a blank line
    # skipped, other fields ignored); the reference encodes the same texts as files.
    "$PY" - "$WORK" <<'EOF'
import json, os, sys
w = sys.argv[1]
texts = ["First line.", "Second: 42 cats\nand a caf\u00e9\t\u00e9t\u00e9", "third \U0001F600"]
os.makedirs(w + "/jsonl")
os.makedirs(w + "/jsonl_as_files")
with open(w + "/jsonl/a.jsonl", "w") as f:
    for i, t in enumerate(texts):
        f.write(json.dumps({"id": i, "content": t, "text": "not this"}) + ("\n\n" if i == 0 else "\n"))
for i, t in enumerate(texts):
    open("%s/jsonl_as_files/%d.txt" % (w, i), "w", encoding="utf-8", newline="").write(t)
EOF
    run_prepare --tokenizer "$WORK/l3" --document jsonl --text-key content --val-fraction 0.3 \
      -o "$WORK/jsonl.h5" "$WORK/jsonl"
    expect_rc 0
    if ! grep -q "1 files, 3 documents, .*bos 100277 per document)$" "$OUT"; then fail "--document jsonl summary"; fi
    expect_tiktoken_ids "$WORK/jsonl.h5" cl100k_base 100277 -1 "$WORK/jsonl_as_files"
    # Qwen2 / Qwen3's layout (their tokenizer.json over this vocabulary): NFC, Qwen's Split
    # pattern (single digits: \p{N}, where Llama 3's takes \p{N}{1,3}), a ByteLevel
    # post_processor, and tokenizer_config.json's null bos_token with EOS <|endoftext|>: no BOS,
    # EOS after each document, "2026" four digit tokens.
    mkdir -p "$WORK/qwen" "$WORK/qwen_docs"
    "$PY" - "$WORK" <<'EOF'
import json, sys
w = sys.argv[1]
t = json.load(open(w + "/l3/tokenizer.json", encoding="utf-8"))
t["normalizer"] = {"type": "NFC"}
t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = (
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
t["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                       "use_regex": False}
json.dump(t, open(w + "/qwen/tokenizer.json", "w", encoding="utf-8"), ensure_ascii=False)
json.dump({"bos_token": None, "eos_token": "<|endoftext|>", "tokenizer_class": "Qwen2Tokenizer"},
          open(w + "/qwen/tokenizer_config.json", "w"))
open(w + "/qwen_docs/a.txt", "w").write("a 2026\n")
open(w + "/qwen_docs/b.txt", "w").write("b 7\n")
EOF
    run_prepare --tokenizer "$WORK/qwen" --val-fraction 0.4 -o "$WORK/qwen.h5" "$WORK/qwen_docs"
    expect_rc 0
    if ! grep -qF "hf-bpe $WORK/qwen, eos 100257 per document)" "$OUT"; then
      fail "Qwen layout summary: $(tail -1 "$OUT")"
    fi
    "$PY" - "$WORK" <<'EOF' || fail "Qwen layout ids"
import json, sys, h5py
w = sys.argv[1]
vocab = json.load(open(w + "/qwen/tokenizer.json", encoding="utf-8"))["model"]["vocab"]
f = h5py.File(w + "/qwen.h5", "r")
got = [int(x) for x in list(f["/train/tokens"][:]) + list(f["/val/tokens"][:])]
want = [vocab[p] for p in ["a", "\u0120", "2", "0", "2", "6", "\u010a"]] + [100257] + \
    [vocab[p] for p in ["b", "\u0120", "7", "\u010a"]] + [100257]
assert got == want, (got, want)
EOF
    ;;
  hf_bpe_o200k)
    need_fortunes
    tiktoken_reference tokenizer o200k_base o200k "$WORK/o200k"
    make_stress_corpus "$WORK/stress"
    for corpus in "$FORTUNES" "$WORK/stress"; do
      run_prepare --tokenizer "$WORK/o200k" --num-threads 2 -o "$WORK/o.h5" "$corpus"
      expect_rc 0
      if ! grep -qF "hf-bpe $WORK/o200k, eos 199999 per document)" "$OUT"; then
        fail "o200k summary line ($corpus): $(tail -1 "$OUT")"
      fi
      expect_tiktoken_ids "$WORK/o.h5" o200k_base -1 199999 "$corpus"
      rm -f "$WORK/o.h5"
    done
    ;;
  hf_bpe_errors)
    make_corpus "$WORK/corpus"
    bpe_json "$WORK/ok.json"
    run_prepare --tokenizer "$WORK/ok.json" -o "$WORK/out.h5" "$WORK/corpus"
    expect_rc 0
    if ! grep -qF "(vocab 258, hf-bpe $WORK/ok.json, no bos/eos)" "$OUT"; then fail "minimal tokenizer.json summary"; fi
    rm -f "$WORK/out.h5"
    printf '{"model": {"type": "BPE", "vocab": {' >"$WORK/truncated.json"
    run_prepare --tokenizer "$WORK/truncated.json" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/truncated.json" "not a tokenizer.json" "JSON parse error at byte"
    # bad_bpe NAME EDIT NEEDLE...: NAME.json = bpe_json after EDIT is refused, naming it.
    bad_bpe() {
      local name=$1 edit=$2; shift 2
      bpe_json "$WORK/$name.json" "$edit"
      run_prepare --tokenizer "$WORK/$name.json" -o "$WORK/out.h5" "$WORK/corpus"
      expect_prepare_error "$WORK/$name.json" "$@"
    }
    bad_bpe wordpiece 't["model"]["type"] = "WordPiece"' "model WordPiece is not BPE"
    bad_bpe lowercase 't["normalizer"] = {"type": "Lowercase"}' "normalizer Lowercase is not supported"
    bad_bpe two_forms 't["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "NFKC"}]}' \
      "a Sequence of 2 normalizers is not supported"
    bad_bpe metaspace 't["pre_tokenizer"] = {"type": "Metaspace", "replacement": "_"}' \
      "pre_tokenizer Metaspace last, not ByteLevel"
    bad_bpe nobyte 'del t["model"]["vocab"][chars[0]]' "byte 0x00 has no token"
    bad_bpe wrong_type 't["pre_tokenizer"]["use_regex"] = "yes"' "not a valid tokenizer.json" "type must be boolean"
    bad_bpe badmerge 't["model"]["merges"].append(["q", "zz"])' "merge 1 (q zz): zz is not in the vocabulary"
    bad_bpe regex 't["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
      {"type": "Split", "pattern": {"Regex": "(?<x"}, "behavior": "Isolated", "invert": False},
      {"type": "ByteLevel", "use_regex": False}]}' "pre_tokenizer 0 (Split)" "regex rejected by Oniguruma"
    run_prepare --tokenizer "$WORK/ok.json" --bos-token '<bos>' -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--bos-token <bos> is not in the vocabulary or added_tokens of $WORK/ok.json"
    run_prepare --tokenizer "$WORK/ok.json" --add-eos -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--add-eos" "ok.json" "no EOS token"
    run_prepare --tokenizer "$WORK/ok.json" --num-threads -2 -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--num-threads: -2"
    run_prepare --tokenizer "$WORK/ok.json" --text-key body -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--text-key: only with --document jsonl"
    run_prepare --tokenizer "$WORK/ok.json" --document jsonl -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/corpus/a.txt:1: not JSON (parse error at byte"
    mkdir -p "$WORK/empty_model_dir"
    run_prepare --tokenizer "$WORK/empty_model_dir" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/empty_model_dir" "neither tokenizer.json nor tokenizer.model"
    printf 'caf\xe9 au lait\n' >"$WORK/corpus/latin1.txt"
    run_prepare --tokenizer "$WORK/ok.json" -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "$WORK/corpus/latin1.txt" "not valid UTF-8 at byte 3"
    rm "$WORK/corpus/latin1.txt"
    train_spm "$WORK/m" --model_type=bpe --vocab_size=150
    run_prepare --tokenizer "$WORK/m.model" --eos-token '</s>' -o "$WORK/out.h5" "$WORK/corpus"
    expect_prepare_error "--eos-token" "only with a tokenizer.json" "m.model"
    ;;
  train)
    make_corpus "$WORK/corpus"
    train_spm "$WORK/m" --model_type=bpe --vocab_size=300 --byte_fallback=true
    run_prepare --tokenizer "$WORK/m.model" -o "$WORK/sp.h5" --val-fraction 0.2 "$WORK/corpus"
    expect_rc 0
    tiny_config tiny.toml
    run_train tiny.toml --set data.source=hdf5 --set data.path="$WORK/sp.h5" --set model.vocab_size=300 \
      --set train.max_steps=3
    expect_rc 0
    if ! [ "$(wc -l <"$WORK/run/metrics.jsonl")" -eq 3 ]; then fail "expected 3 metrics lines"; fi
    run_train tiny.toml --set data.source=hdf5 --set data.path="$WORK/sp.h5" --set model.vocab_size=256 \
      --set train.max_steps=3 --set train.run_dir="$WORK/run2"
    expect_input_error "$WORK/sp.h5" "vocab_size 300" "sentencepiece" "model.vocab_size is 256"
    write_tokens llmc "$WORK/ids.bin" 20240520 1 2 3000 300
    run_prepare --token-file "$WORK/ids.bin" --vocab-size 300 -o "$WORK/llmc.h5" --val-fraction 0.2
    expect_rc 0
    run_train tiny.toml --set data.source=hdf5 --set data.path="$WORK/llmc.h5" --set model.vocab_size=304 \
      --set train.max_steps=3 --set train.run_dir="$WORK/run3"
    expect_rc 0
    ;;
  *)
    echo "tokenizers.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
