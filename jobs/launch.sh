# shellcheck shell=bash
# jobs/launch.sh: sourced by jobs/*.slurm (after `cd "$SLURM_SUBMIT_DIR"`; submit from the
# repository root). fsdp_launch CONFIG NAME [fsdp_train args...] runs fsdp_train on every task
# of the allocation and makes the run survive preemption and time limits by itself:
#
# - the run directory is runs/NAME-$SLURM_JOB_ID ($FSDP_RUN_ROOT instead of runs/): the job
#   id stays the same across requeues, so a requeued job finds its own checkpoints;
# - fsdp_train always gets --resume=auto: resume from run_dir/checkpoints/latest if there is
#   one, else start fresh; the job's own arguments (`sbatch job.slurm --set k=v`) go after
#   the job's --set's, so they win;
# - threads: train.num_threads = OMP_NUM_THREADS = $SLURM_CPUS_PER_TASK;
# - launcher: `srun --mpi=pmix` (default; #SBATCH --signal=USR1@T signals every task), or
#   mpirun when FSDP_LAUNCHER=mpirun. Slurm does not signal mpirun's ranks on the batch node,
#   so submit with `sbatch --signal=B:USR1@120 ...`: the batch shell traps USR1 and forwards
#   it to mpirun, which signals every rank;
# - executable: $FSDP_TRAIN (default build/fsdp_train);
# - fsdp_train exits 3 after a signal made it save a checkpoint (docs/checkpoint.md
#   "Signals"): the job requeues itself (scontrol requeue, needs --requeue) and the next run
#   resumes. Any other exit code ends the job with that code.
fsdp_launch() {
  local config=$1 name=$2
  shift 2
  local exe=${FSDP_TRAIN:-build/fsdp_train}
  local threads=${SLURM_CPUS_PER_TASK:-1}
  local run_dir=${FSDP_RUN_ROOT:-runs}/${name}-${SLURM_JOB_ID:?not inside a Slurm job}
  export OMP_NUM_THREADS=$threads
  local args=("$exe" "$config" --set train.num_threads="$threads"
              --set train.run_dir="$run_dir" "$@" --resume=auto)
  echo "fsdp job $SLURM_JOB_ID (restart ${SLURM_RESTART_COUNT:-0}) on ${SLURM_JOB_NODELIST:-?}:" \
       "${SLURM_NNODES:-?} nodes, ${SLURM_NTASKS:-?} tasks, $threads threads each, run_dir $run_dir"
  local rc=0
  if [ "${FSDP_LAUNCHER:-srun}" = mpirun ]; then
    mpirun --bind-to none "${args[@]}" &
    local mpirun_pid=$!
    # shellcheck disable=SC2064
    trap "echo 'fsdp job: SIGUSR1, forwarding to mpirun'; kill -USR1 $mpirun_pid 2>/dev/null" USR1
    # `wait` returns early (status > 128) when the trap runs: wait again until mpirun is gone.
    while :; do
      rc=0
      wait "$mpirun_pid" || rc=$?
      kill -0 "$mpirun_pid" 2>/dev/null || break
    done
    trap - USR1
  else
    srun --mpi=pmix "${args[@]}" || rc=$?
  fi
  if [ "$rc" -eq 3 ]; then
    echo "fsdp job $SLURM_JOB_ID: interrupted, checkpoint saved; requeueing (scontrol requeue)"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  echo "fsdp job $SLURM_JOB_ID: fsdp_train exit code $rc"
  return "$rc"
}
