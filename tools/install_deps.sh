#!/usr/bin/env bash
# Installs every Debian package fsdp_train needs to build, test and run its main job.
# Idempotent: packages already installed are left alone, and apt-get runs only if needed.
#   tools/install_deps.sh          build + test + main-job packages
#   tools/install_deps.sh --bench  the same (python3-torch, which tools/bench_cpu.sh needs, is
#                                  now a test package; the flag is kept for its callers)
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev            # MPI bootstrap and CPU collectives
  libhdf5-dev                           # datasets and checkpoints (HDF5 C API)
  libopenblas-dev                       # CPU GEMMs
  libxxhash-dev                         # checkpoint checksums (XXH3-64)
  libtomlplusplus-dev nlohmann-json3-dev libboost-program-options-dev
  libsentencepiece-dev sentencepiece    # fsdp_prepare --tokenizer (SentencePiece; spm_train for tests)
  libonig-dev libutf8proc-dev           # fsdp_prepare --tokenizer tokenizer.json (regexes, NFC)
  zlib1g-dev libzstd-dev zstd liblzma-dev  # fsdp_prepare's gzip / zstd / xz inputs (zstd: tests)
  python3-sentencepiece python3-h5py    # tests: the Python encoder cross-checks fsdp_prepare's ids
  libgtest-dev python3-numpy             # tests (python3-numpy: tests/check_merge.py)
  xz-utils                              # tests: the Llama reference fixtures (*.txt.xz)
  python3-torch                         # tests: tools_hf_check_reference (the float64 torch
                                        # models read fsdp_merge's files; exit 77 without it) and
                                        # tools_bench_shapes' Llama check (fails without it)
  python3-matplotlib                    # tools/plot_run.py (the main job's plot; its test)
  clang libclang-rt-14-dev              # tests/fuzz_safetensors.sh (clang++, libFuzzer + ASan runtime)
  fortunes                              # the main job's text corpus
  wordnet-base                          # the T5 main job's seq2seq pairs (tools/prepare_wordnet.sh)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all packages present"
else
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  echo "install_deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Tests: js-tiktoken (npm), OpenAI's tiktoken vocabularies in JavaScript, the reference that
# tests/cli/tokenizers.sh hf_bpe_* compares fsdp_prepare's tokenizer.json reader with
# (tools/tiktoken_reference.cjs). Into .deps/node of the repository (ignored by git). Without
# npm or the registry it says so and goes on: those cases then exit 77 and ctest reports them
# as not run.
JS_TIKTOKEN=js-tiktoken@1.0.21
deps=$(cd "$(dirname "$0")/.." && pwd)/.deps/node
if [[ -f $deps/node_modules/js-tiktoken/package.json ]] &&
   grep -q "\"version\": \"${JS_TIKTOKEN#*@}\"" "$deps/node_modules/js-tiktoken/package.json"; then
  echo "install_deps: $JS_TIKTOKEN present"
elif command -v npm >/dev/null && command -v node >/dev/null; then
  mkdir -p "$deps"
  if timeout 300 npm install --silent --no-audit --no-fund --no-save --prefix "$deps" "$JS_TIKTOKEN"; then
    echo "install_deps: installed $JS_TIKTOKEN into $deps"
  else
    echo "install_deps: npm install $JS_TIKTOKEN failed: the hf_bpe tokenizer cases will not run"
  fi
else
  echo "install_deps: no node/npm: $JS_TIKTOKEN not installed, the hf_bpe tokenizer cases will not run"
fi
