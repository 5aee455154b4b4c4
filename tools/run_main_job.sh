#!/usr/bin/env bash
# The main job, end to end on real data: installs dependencies, builds (Release), turns the
# Debian `fortunes` corpus into an HDF5 byte-token file, trains a byte-level GPT-2 with
# FULL_SHARD on 4 MPI ranks (inputs/gpt2_fortunes.toml), and merges the final sharded
# checkpoint into runs/fortunes/hf/model.safetensors + config.json.
# Extra arguments go to fsdp_train, e.g. --set train.max_steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
build=${FSDP_BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mkdir -p data
if [[ ! -f data/fortunes.h5 ]]; then
  "$build/fsdp_prepare" -o data/fortunes.h5 /usr/share/games/fortunes
fi
run_dir=runs/fortunes
if [[ -f "$run_dir/checkpoints/latest" ]]; then
  stamp=$(date +%Y%m%d-%H%M%S)
  echo "run_main_job: keeping the previous run as $run_dir.$stamp"
  mv "$run_dir" "$run_dir.$stamp"
fi
start=$(date +%s)
mpirun -np 4 --oversubscribe --bind-to none "$build/fsdp_train" inputs/gpt2_fortunes.toml \
  --set train.run_dir="$run_dir" "$@"
end=$(date +%s)
echo "run_main_job: training took $((end - start)) s"
"$build/fsdp_merge" "$run_dir/checkpoints/$(cat "$run_dir/checkpoints/latest")" "$run_dir/hf"
ls -l "$run_dir/hf"
