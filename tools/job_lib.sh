# tools/job_lib.sh: the steps the main-job scripts share (sourced by tools/run_main_job.sh and
# tools/run_t5_job.sh; not run on its own).
#   train_and_merge NAME INPUT RUN_DIR [fsdp_train args...]
# moves an earlier RUN_DIR aside (RUN_DIR.<timestamp>), trains INPUT on 4 MPI ranks with
# train.run_dir = RUN_DIR, prints the training time, and merges the final checkpoint into
# RUN_DIR/hf, then draws the run (tools/plot_run.py: losses, learning rate, tokens/s, MFU and
# where each step's time went) into RUN_DIR/run.png. Expects $build (the build directory)
# and runs from the repository root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

train_and_merge() {
  local name=$1 input=$2 run_dir=$3
  shift 3
  if [[ -e "$run_dir" ]]; then
    local stamp
    stamp=$(date +%Y%m%d-%H%M%S)
    echo "$name: keeping the previous run as $run_dir.$stamp"
    mv "$run_dir" "$run_dir.$stamp"
  fi
  local start end
  start=$(date +%s)
  mpirun -np 4 --oversubscribe --bind-to none "$build/fsdp_train" "$input" \
    --set train.run_dir="$run_dir" "$@"
  end=$(date +%s)
  echo "$name: training took $((end - start)) s"
  "$build/fsdp_merge" "$run_dir/checkpoints/$(cat "$run_dir/checkpoints/latest")" "$run_dir/hf"
  ls -l "$run_dir/hf"
  /usr/bin/python3 tools/plot_run.py "$run_dir"
}
