#!/usr/bin/env bash
# tools/bench_resume.sh [FSDP_TRAIN]: resume cost: wall time of a 1-step continuation from a 4-rank checkpoint, on 4 ranks (same
# layout: each rank reads its own file) and on 2 ranks (resharded: each rank reads the flat
# ranges of its new shard from the old files), minus the wall time of a fresh 1-step run on
# the same ranks. Model: GPT-2 8 layers x 512 wide (25.6 M parameters; 307 MB of fp32 params +
# AdamW state), synthetic tokens.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
B=${1:-build/fsdp_train}; W=$(mktemp -d)
S=(--set model.n_layer=8 --set model.n_embd=512 --set model.n_head=8 --set model.n_positions=128
   --set data.seq_len=128 --set train.global_batch_size=4 --set eval.every=0 --set eval.max_windows=4
   --set optim.decay_steps=10 --set train.num_threads=1)
run() { local np=$1; shift; local t0=$(date +%s.%N); mpirun -np "$np" --oversubscribe --bind-to none "$B" inputs/tiny.toml "${S[@]}" "$@" >/dev/null; echo "$(date +%s.%N) - $t0" | bc; }
run 4 --set train.run_dir=$W/base --set train.max_steps=2 >/dev/null
for r in 1 2 3; do
  rm -rf $W/f4 $W/f2 $W/r4 $W/r2; cp -r $W/base $W/r4; cp -r $W/base $W/r2
  f4=$(run 4 --set train.run_dir=$W/f4 --set train.max_steps=1)
  r4=$(run 4 --set train.run_dir=$W/r4 --set train.max_steps=3 --resume)
  f2=$(run 2 --set train.run_dir=$W/f2 --set train.max_steps=1)
  r2=$(run 2 --set train.run_dir=$W/r2 --set train.max_steps=3 --resume)
  echo "round $r: 4 ranks fresh $f4 s, resume (same layout) $r4 s; 2 ranks fresh $f2 s, resume (resharded 4->2) $r2 s"
done
du -sh $W/base/checkpoints/step_00000002
rm -rf "$W"
