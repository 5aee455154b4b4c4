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
source tools/job_lib.sh
build_job_programs

mkdir -p data
if [[ ! -f data/wordnet_pairs.h5 ]]; then
  tools/prepare_wordnet.sh data/wordnet_pairs.h5 "$build/fsdp_prepare"
fi
run_dir=runs/t5_wordnet
train_and_merge run_t5_job inputs/t5_wordnet.toml "$run_dir" "$@"
python3 - "$run_dir" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
(s0, v0), (s1, v1) = val[0], val[-1]
print(f"run_t5_job: val_loss {v0:.4f} at step {s0} -> {v1:.4f} at step {s1} "
      f"(ratio {v1 / v0:.3f}; the job asks for <= 0.5)")
PY
