#!/usr/bin/env bash
# tests/cli/signals.sh: stopping fsdp_train with signals, and the peer watchdog
# (docs/checkpoint.md "Signals", docs/config.md comm.timeout_s).
#
#   bash tests/cli/signals.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# Each case starts a 2-rank run of the tiny model with a large train.max_steps in the
# background, polls (bounded) until metrics.jsonl shows some steps, then signals one rank's
# process (found among mpirun's children by OMPI_COMM_WORLD_RANK in its environment) or
# mpirun itself, and waits (bounded) for mpirun to exit.
#
# CASE sigterm_rank: SIGTERM to rank 1: exit code 3, the line "received SIGTERM on rank 1
#   (host H); saved checkpoint .../step_N at step N; resume with --resume", `latest` names
#   step_N with N > 0, and --resume to N + 2 gives the losses of an uninterrupted run.
# CASE sigusr1_rank: SIGUSR1 to rank 0: exit code 3, the line names SIGUSR1 and rank 0, the
#   checkpoint resumes.
# CASE sigusr1_checkpoint_disabled: checkpoint.enable = false, SIGUSR1 to rank 1: exit code
#   3, the line "received SIGUSR1 on rank 1 (host H); stopped at step N without saving
#   (checkpoint.enable = false)" with N the last step logged, and no checkpoint written.
# CASE sigterm_mpirun / sigint_mpirun: SIGTERM / SIGINT to mpirun started with
#   `--mca odls_base_sigkill_timeout 5`: mpirun sends SIGTERM to both ranks (after 5 s),
#   which save the step and exit before its SIGKILL; mpirun exits with 1 (its own code for an
#   aborted job), the line and the checkpoint are there and it resumes.
# CASE sigusr1_mpirun: SIGUSR1 to mpirun is forwarded to the ranks: exit code 3 from mpirun.
# CASE second_sigint_exits_now: rank 1 is stopped (SIGSTOP), sent SIGINT and SIGTERM, and
#   continued (SIGCONT): the first of the two is the stop request, the second, still before
#   any checkpoint could be saved, kills the rank by its default action. Deterministic: both
#   are pending when the rank resumes, so no step boundary can come between them. The job
#   ends with a non-zero code other than 3 and no checkpoint.
# CASE sigstop_rank: comm.timeout_s = 5, SIGSTOP to rank 1: the job ends 5 to 20 s later
#   with the line "rank 0 (host H): ... did not complete within comm.timeout_s = 5 s; rank 1
#   (host H, pid P) is stopped", and the last checkpoint resumes.
# CASE sigkill_rank: SIGKILL to rank 1: the job ends within 20 s with a non-zero code and a
#   line naming rank 1 (the watchdog's "has exited" or mpirun's own notice), and the last
#   checkpoint resumes.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

BG=""          # pid of the background `timeout mpirun ...`
MPIRUN_PID=""  # mpirun's pid
STOPPED_PID="" # a rank this test stopped: SIGKILLed on exit whatever happens
cleanup() {
  if [ -n "$STOPPED_PID" ]; then kill -KILL "$STOPPED_PID" 2>/dev/null; fi
  if [ -n "$BG" ] && kill -0 "$BG" 2>/dev/null; then kill -KILL "$BG" 2>/dev/null; fi
  if [ -n "$MPIRUN_PID" ]; then kill -KILL "$MPIRUN_PID" 2>/dev/null; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# start_train [MPIRUN_ARGS...] -- FSDP_TRAIN_ARGS...: a 2-rank run in the background (killed
# after 120 s); sets BG and MPIRUN_PID.
start_train() {
  local mpi_args=()
  while [ "$1" != "--" ]; do mpi_args+=("$1"); shift; done
  shift
  timeout 120 "$MPIEXEC" "${mpi_args[@]}" -np 2 --oversubscribe --bind-to none "$FSDP_TRAIN" "$@" \
    >"$OUT" 2>"$ERR" </dev/null &
  BG=$!
  find_mpirun() { MPIRUN_PID=$(pgrep -P "$BG" | head -n 1); [ -n "$MPIRUN_PID" ]; }
  wait_for 30 find_mpirun || fail "mpirun did not start"
}

# rank_pid R: the pid of world rank R (a child of mpirun with OMPI_COMM_WORLD_RANK=R).
rank_pid() {
  local p
  for p in $(pgrep -P "$MPIRUN_PID"); do
    if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1"; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

metrics_at_least() {  # metrics_at_least N: metrics.jsonl has N lines
  [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l <"$WORK/run/metrics.jsonl")" -ge "$1" ]
}
has_latest() { [ -f "$WORK/run/checkpoints/latest" ]; }

# await_steps N: polls until the run has logged N steps; fails (and stops the case) if not.
await_steps() {
  if ! wait_for 60 metrics_at_least "$1"; then
    fail "the run did not log $1 steps within 60 s"
    finish
  fi
}

# end_train: waits for the background mpirun; sets RC and ELAPSED (seconds since T0).
end_train() {
  wait "$BG"
  RC=$?
  ELAPSED=$((SECONDS - T0))
  BG=""
  if [ "$RC" -eq 124 ]; then fail "the job did not end within 120 s (hang)"; fi
}

# latest_step: the step number `latest` names (e.g. 7 for step_00000007).
latest_step() {
  local name
  name=$(tr -d '[:space:]' <"$WORK/run/checkpoints/latest")
  echo $((10#${name#step_}))
}

# expect_resumes STEP: --resume to STEP + 1 starts at STEP and completes.
expect_resumes() {
  run_train tiny.toml --resume --set train.max_steps=$(($1 + 1))
  expect_rc 0
  if ! grep -q "resumed from step $1\$" "$OUT"; then fail "no 'resumed from step $1' line"; fi
}

# expect_stop_line SIGNAL RANK [RC]: exit code RC (default 3), the one stop line, and
# `latest` at its step > 0; sets STOP_STEP.
expect_stop_line() {
  expect_rc "${3:-3}"
  local n
  n=$(grep -c "^fsdp_train: " "$ERR")
  if [ "$n" -ne 1 ]; then fail "expected exactly one 'fsdp_train: ...' line on stderr, found $n"; fi
  local line
  line=$(grep "^fsdp_train: " "$ERR" | head -n 1)
  echo "stop line: $line"
  local re="^fsdp_train: received $1 on rank $2 \\(host $(hostname)\\); saved checkpoint $WORK/run/checkpoints/step_([0-9]{8}) at step ([0-9]+); resume with --resume\$"
  if ! [[ "$line" =~ $re ]]; then fail "stop line does not match /$re/"; STOP_STEP=0; return; fi
  STOP_STEP=${BASH_REMATCH[2]}
  if [ "$((10#${BASH_REMATCH[1]}))" -ne "$STOP_STEP" ] || [ "$STOP_STEP" -le 0 ]; then
    fail "stop line names step_${BASH_REMATCH[1]} at step $STOP_STEP"
  fi
  if ! has_latest || [ "$(latest_step)" -ne "$STOP_STEP" ]; then
    fail "latest does not name the step the stop line reports ($STOP_STEP)"
  fi
  if [ "$(wc -l <"$WORK/run/metrics.jsonl")" -ne "$STOP_STEP" ]; then
    fail "metrics.jsonl has $(wc -l <"$WORK/run/metrics.jsonl") lines, expected $STOP_STEP"
  fi
  if grep -q val_loss "$WORK/run/metrics.jsonl"; then fail "the stopped run evaluated"; fi
}

LONG=(--set train.max_steps=100000 --set optim.decay_steps=100000)
# Runs that must outlast mpirun's kill timers: no per-step log line, enough steps.
HUGE=(--set train.max_steps=100000000 --set train.log_every=100000000)
tiny_config tiny.toml

case "$CASE" in
  sigterm_rank)
    # HDF5 data: the batches do not depend on train.max_steps (see run_dir.sh resume).
    make_text_dir "$WORK/text"
    "$FSDP_PREPARE" -o "$WORK/tokens.h5" --val-fraction 0.2 "$WORK/text" >/dev/null ||
      { fail "fsdp_prepare failed"; finish; }
    sed -i "s|^source = .*|source = \"hdf5\"\npath = \"$WORK/tokens.h5\"|" tiny.toml
    start_train -- tiny.toml "${LONG[@]}"
    await_steps 3
    pid=$(rank_pid 1) || { fail "no process of rank 1 under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    kill -TERM "$pid"
    end_train
    expect_stop_line SIGTERM 1
    [ "$STOP_STEP" -gt 0 ] || finish
    n=$((STOP_STEP + 2))
    run_train tiny.toml "${LONG[@]}" --set train.max_steps=$n --resume
    expect_rc 0
    if ! grep -q "resumed from step $STOP_STEP\$" "$OUT"; then fail "no 'resumed from step $STOP_STEP' line"; fi
    # Reference: the same steps uninterrupted (same schedule: optim.decay_steps).
    run_train tiny.toml "${LONG[@]}" --set train.max_steps=$n --set train.run_dir="$WORK/run_ref"
    expect_rc 0
    python3 - "$WORK/run_ref/metrics.jsonl" "$WORK/run/metrics.jsonl" "$n" <<'EOF' || fail "resumed losses differ from the uninterrupted run's"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
got = [json.loads(l) for l in open(sys.argv[2]).read().splitlines()]
n = int(sys.argv[3])
assert [r["step"] for r in got] == list(range(1, n + 1)), [r["step"] for r in got]
assert [r["step"] for r in ref] == list(range(1, n + 1)), [r["step"] for r in ref]
for r, g in zip(ref, got):
    for k in ("loss", "lr", "grad_norm"):
        assert abs(r[k] - g[k]) <= 1e-6 * max(1.0, abs(r[k])), (r["step"], k, r[k], g[k])
EOF
    ;;
  sigusr1_rank | sigusr1_offload | sigusr1_offload_optimizer | sigusr1_delayed_update)
    # sigusr1_offload (issue 22): SIGUSR1 to rank 1 of an offloaded run saves the host shards
    # (the host step of the step before may still be running beside the forward: the save
    # waits for it); the checkpoint resumes without offload (the shard files are the same).
    # sigusr1_offload_optimizer (issue 31): the same with the param_dtype shards resident, and
    # half the model's optimizer on the device (fsdp.offload_optimizer_ratio: the save reads
    # each unit where it lives).
    # sigusr1_delayed_update: and with fsdp.delayed_parameter_update, whose pending update
    # (running beside the step the signal arrives in) the save completes first.
    rank=0 extra=()
    [ "$CASE" = sigusr1_offload ] && rank=1 extra=(--set fsdp.cpu_offload=true)
    [ "$CASE" = sigusr1_offload_optimizer ] && rank=1 \
      extra=(--set fsdp.offload_optimizer=true --set fsdp.offload_optimizer_ratio=0.5)
    [ "$CASE" = sigusr1_delayed_update ] && rank=1 \
      extra=(--set fsdp.offload_optimizer=true --set fsdp.delayed_parameter_update=true)
    start_train -- tiny.toml "${LONG[@]}" "${extra[@]}"
    await_steps 3
    pid=$(rank_pid "$rank") || { fail "no process of rank $rank under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    kill -USR1 "$pid"
    end_train
    expect_stop_line SIGUSR1 "$rank"
    [ "$STOP_STEP" -gt 0 ] && expect_resumes "$STOP_STEP"
    ;;
  sigusr1_checkpoint_disabled)
    # checkpoint.enable = false: SIGUSR1 to rank 1 stops the run at the step boundary (exit
    # 3) with one line saying nothing was saved; no checkpoint directory is written.
    start_train -- tiny.toml "${LONG[@]}" --set checkpoint.enable=false
    await_steps 3
    pid=$(rank_pid 1) || { fail "no process of rank 1 under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    kill -USR1 "$pid"
    end_train
    expect_rc 3
    if [ "$(grep -c "^fsdp_train: " "$ERR")" -ne 1 ]; then fail "expected one 'fsdp_train: ...' line"; fi
    re="^fsdp_train: received SIGUSR1 on rank 1 \\(host $(hostname)\\); stopped at step ([0-9]+) without saving \\(checkpoint.enable = false\\)\$"
    line=$(grep "^fsdp_train: " "$ERR" | head -n 1)
    echo "stop line: $line"
    if ! [[ "$line" =~ $re ]]; then fail "stop line does not match /$re/"; fi
    if [ "${BASH_REMATCH[1]:-0}" -ne "$(wc -l <"$WORK/run/metrics.jsonl")" ]; then
      fail "the stop line's step is not metrics.jsonl's last"
    fi
    if [ -n "$(find "$WORK/run" -path '*checkpoints/*')" ]; then fail "a checkpoint was written"; fi
    ;;
  sigterm_mpirun | sigint_mpirun)
    # mpirun (Open MPI 4.1) aborting on SIGTERM / SIGINT: SIGCONT to the ranks, sleep
    # odls_base_sigkill_timeout, SIGTERM, sleep again, SIGKILL; it stops forwarding the
    # ranks' output meanwhile, so rank 0 logs nothing per step here (a full pipe would block
    # it). Every rank gets SIGTERM; the lowest rank that has it at the agreeing step boundary
    # reports it (either, on a loaded machine). mpirun itself exits with 1.
    sig=TERM
    [ "$CASE" = sigint_mpirun ] && sig=INT
    start_train --mca odls_base_sigkill_timeout 5 -- tiny.toml "${HUGE[@]}"
    await_steps 3
    T0=$SECONDS
    kill -"$sig" "$MPIRUN_PID"
    end_train
    expect_stop_line SIGTERM "[01]" 1
    if [ "$ELAPSED" -gt 30 ]; then fail "mpirun took $ELAPSED s to end"; fi
    [ "$STOP_STEP" -gt 0 ] && expect_resumes "$STOP_STEP"
    ;;
  sigusr1_mpirun)
    # mpirun forwards SIGUSR1 to every rank at once and returns the ranks' exit code.
    start_train -- tiny.toml "${HUGE[@]}"
    await_steps 3
    T0=$SECONDS
    kill -USR1 "$MPIRUN_PID"
    end_train
    expect_stop_line SIGUSR1 "[01]"
    if [ "$ELAPSED" -gt 20 ]; then fail "mpirun took $ELAPSED s to end"; fi
    [ "$STOP_STEP" -gt 0 ] && expect_resumes "$STOP_STEP"
    ;;
  second_sigint_exits_now)
    start_train -- tiny.toml "${LONG[@]}"
    await_steps 3
    pid=$(rank_pid 1) || { fail "no process of rank 1 under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    STOPPED_PID=$pid
    kill -STOP "$pid"
    kill -INT "$pid"
    kill -TERM "$pid"
    kill -CONT "$pid"
    end_train
    if [ "$RC" -eq 0 ] || [ "$RC" -eq 3 ]; then fail "exit code $RC, expected a failure (not 0 or 3)"; fi
    if grep -q "received SIG" "$ERR"; then fail "a checkpoint was saved after the second signal"; fi
    if has_latest; then fail "a checkpoint was published after the second signal"; fi
    if ! grep -Eq "rank 1 .*(exited on signal (2|15)|has exited)" "$ERR"; then
      fail "no line says that rank 1 died of the second signal"
    fi
    if [ "$ELAPSED" -gt 20 ]; then fail "the job took $ELAPSED s to end after the second signal"; fi
    ;;
  sigstop_rank)
    start_train -- tiny.toml "${LONG[@]}" --set checkpoint.every=5 --set comm.timeout_s=5
    await_steps 6
    wait_for 30 has_latest || fail "no checkpoint before the stop"
    pid=$(rank_pid 1) || { fail "no process of rank 1 under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    STOPPED_PID=$pid
    kill -STOP "$pid"
    end_train
    if [ "$RC" -eq 0 ] || [ "$RC" -eq 3 ]; then fail "exit code $RC, expected a failure"; fi
    if [ "$ELAPSED" -lt 4 ] || [ "$ELAPSED" -gt 20 ]; then
      fail "the job ended $ELAPSED s after SIGSTOP, expected comm.timeout_s = 5 s (4 to 20 s)"
    fi
    n=$(grep -c "^fsdp_train: " "$ERR")
    if [ "$n" -ne 1 ]; then fail "expected exactly one 'fsdp_train: ...' line, found $n"; fi
    expect_error_matches "^fsdp_train: rank 0 \\(host $(hostname)\\): [a-z_]+ did not complete within comm.timeout_s = 5 s; rank 1 \\(host $(hostname), pid $pid\\) is stopped\$"
    kill -KILL "$pid" 2>/dev/null
    STOPPED_PID=""
    expect_resumes "$(latest_step)"
    ;;
  sigkill_rank)
    start_train -- tiny.toml "${LONG[@]}" --set checkpoint.every=5
    await_steps 6
    wait_for 30 has_latest || fail "no checkpoint before the kill"
    pid=$(rank_pid 1) || { fail "no process of rank 1 under mpirun $MPIRUN_PID"; finish; }
    T0=$SECONDS
    kill -KILL "$pid"
    end_train
    if [ "$RC" -eq 0 ] || [ "$RC" -eq 3 ]; then fail "exit code $RC, expected a failure"; fi
    if [ "$ELAPSED" -gt 20 ]; then fail "the job took $ELAPSED s to end after SIGKILL"; fi
    if ! grep -Eq "rank 1 .*(exited on signal 9|has exited)" "$ERR"; then
      fail "no line says that rank 1 died"
    fi
    expect_resumes "$(latest_step)"
    ;;
  *)
    echo "signals.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
