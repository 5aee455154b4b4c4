#!/usr/bin/env bash
# The main job, end to end on real data: installs dependencies, builds the three programs it
# runs (Release; the CUDA backend only where a GPU is visible), turns the
# Debian `fortunes` corpus into an HDF5 byte-token file, trains a byte-level GPT-2 with
# FULL_SHARD on 4 MPI ranks (inputs/gpt2_fortunes.toml), and merges the final sharded
# checkpoint into runs/fortunes/hf/model.safetensors + config.json.
# Extra arguments go to fsdp_train, e.g. --set train.max_steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
source tools/job_lib.sh
build_job_programs

mkdir -p data
if [[ ! -f data/fortunes.h5 ]]; then
  "$build/fsdp_prepare" -o data/fortunes.h5 /usr/share/games/fortunes
fi
train_and_merge run_main_job inputs/gpt2_fortunes.toml runs/fortunes "$@"
