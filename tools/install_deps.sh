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
  python3-sentencepiece                 # tests: the Python encoder cross-checks fsdp_prepare's ids
  libgtest-dev python3-numpy             # tests (python3-numpy: tests/check_merge.py)
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
  exit 0
fi
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
