# tools/job_lib.sh: the steps the main-job scripts share (sourced by tools/run_main_job.sh,
# tools/run_t5_job.sh and tools/run_llama_job.sh; not run on its own).
#   train_and_merge NAME INPUT RUN_DIR [fsdp_train args...]
# moves an earlier RUN_DIR aside (RUN_DIR.<timestamp>), trains INPUT on 4 MPI ranks with
# train.run_dir = RUN_DIR, prints the training time, and merges the final checkpoint into
# RUN_DIR/hf, then draws the run (tools/plot_run.py: losses, learning rate, tokens/s, MFU and
# where each step's time went) into RUN_DIR/run.png. Expects $build (the build directory)
# and runs from the repository root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# build_job_programs: builds only what a job runs (fsdp_prepare, fsdp_train, fsdp_merge; the
# test command builds the rest), and the CUDA backend only where a GPU is visible
# (nvidia-smi -L lists one): a job on a machine without one runs on the CPU backend, so
# compiling the kernels would only delay it. FSDP_CUDA set by the caller wins. Sets $build.
build_job_programs() {
  local cuda=${FSDP_CUDA:-}
  if [[ -z $cuda ]]; then
    if nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; else cuda=OFF; fi
  fi
  FSDP_CUDA=$cuda FSDP_BUILD_TARGETS="fsdp_prepare fsdp_train fsdp_merge" tools/build.sh
  build=${FSDP_BUILD_DIR:-build}
}

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
