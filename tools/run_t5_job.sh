#!/usr/bin/env bash
# The T5 main job, end to end on real data: installs dependencies (wordnet-base among them),
# builds (Release), turns WordNet 3.0's glosses into a seq2seq pairs file (gloss -> headword,
# tools/prepare_wordnet.sh), trains a byte-level T5 with HYBRID_SHARD (shard groups of 2) on
# 4 MPI ranks (inputs/t5_wordnet.toml), and merges the final sharded checkpoint into
# runs/t5_wordnet/hf/ (model.safetensors with T5ForConditionalGeneration names + config.json).
# Prints the step-0 and final validation losses and the training time.
# Extra arguments go to fsdp_train, e.g. --set train.max_steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
tools/build.sh
build=${FSDP_BUILD_DIR:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

mkdir -p data
if [[ ! -f data/wordnet_pairs.h5 ]]; then
  tools/prepare_wordnet.sh data/wordnet_pairs.h5 "$build/fsdp_prepare"
fi
run_dir=runs/t5_wordnet
if [[ -e "$run_dir" ]]; then
  stamp=$(date +%Y%m%d-%H%M%S)
  echo "run_t5_job: keeping the previous run as $run_dir.$stamp"
  mv "$run_dir" "$run_dir.$stamp"
fi
start=$(date +%s)
mpirun -np 4 --oversubscribe --bind-to none "$build/fsdp_train" inputs/t5_wordnet.toml \
  --set train.run_dir="$run_dir" "$@"
end=$(date +%s)
echo "run_t5_job: training took $((end - start)) s"
"$build/fsdp_merge" "$run_dir/checkpoints/$(cat "$run_dir/checkpoints/latest")" "$run_dir/hf"
ls -l "$run_dir/hf"
python3 - "$run_dir" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
(s0, v0), (s1, v1) = val[0], val[-1]
print(f"run_t5_job: val_loss {v0:.4f} at step {s0} -> {v1:.4f} at step {s1} "
      f"(ratio {v1 / v0:.3f}; the job asks for <= 0.5)")
PY
