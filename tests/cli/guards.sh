#!/usr/bin/env bash
# tests/cli/guards.sh: the run's guards against losing work, end to end at 2 ranks.
#
#   bash tests/cli/guards.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE lr_too_large: optim.lr = 1e3 (a typo for 1e-3) and 1e308 are refused at start-up,
#   exit 2 naming optim.lr, nothing written.
# CASE diverge_stops: SGD with lr 10 and weight_decay 100 multiplies the weights by -999 a
#   step until they overflow: the run stops at the first non-finite gradient norm with exit 1
#   and one line naming the step; `latest` names the last checkpoint written before it, and no
#   checkpoint of that step or later exists.
# CASE diverge_stops_async: the same saving every step with checkpoint.async_save: the
#   background save of the step before is committed and `latest` names it.
# CASE diverge_skips: the same with train.skip_nonfinite = true runs to the end, logging each
#   skipped step and marking it "nonfinite" in metrics.jsonl.
# CASE memory_too_large: n_layer = 10000 x n_embd = 1024 (a plan of hundreds of GiB per rank) is refused with
#   exit 2 before anything is allocated: one line naming the plan and its largest row, the plan
#   printed on stdout, within seconds instead of an OOM kill.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

DIVERGE=(--set optim.name=sgd --set optim.lr=10 --set optim.weight_decay=100
         --set optim.warmup_steps=0 --set optim.min_lr=0 --set train.max_steps=30
         --set checkpoint.every=2)

case "$CASE" in
  lr_too_large)
    tiny_config tiny.toml
    run_train tiny.toml --set optim.lr=1e3
    expect_input_error "--set optim.lr=1e3" "optim.lr" "out of range"
    run_train tiny.toml --set optim.lr=1e308
    expect_input_error "optim.lr" "out of range"
    if [ -e "$WORK/run" ]; then fail "a refused config wrote $WORK/run"; fi
    ;;
  diverge_stops | diverge_stops_async)
    tiny_config tiny.toml
    extra=()
    [ "$CASE" = diverge_stops_async ] && extra=(--set checkpoint.every=1 --set checkpoint.async_save=true)
    run_train tiny.toml "${DIVERGE[@]}" "${extra[@]}"
    expect_rc 1
    expect_one_error fsdp_train "training diverged" "last checkpoint: $WORK/run/checkpoints/step_"
    expect_error_matches '^fsdp_train: step [0-9]+: (grad_norm|loss) is (nan|-?inf)'
    step=$(grep '^fsdp_train: ' "$ERR" | sed -E 's/^fsdp_train: step ([0-9]+):.*/\1/')
    latest=$(cat "$WORK/run/checkpoints/latest" 2>/dev/null)
    last=$(grep -o 'last checkpoint: [^ ]*' "$ERR" | sed 's|.*/||')
    if [ -z "$latest" ] || [ "$latest" != "$last" ]; then
      fail "latest ($latest) does not name the last checkpoint of the message ($last)"
    fi
    for d in "$WORK"/run/checkpoints/step_*; do
      n=$((10#${d##*step_}))
      if [ "$n" -ge "$step" ]; then fail "a checkpoint of step $n >= the diverged step $step exists"; fi
    done
    if ls "$WORK"/run/checkpoints | grep -q tmp; then fail "temporary checkpoint left"; fi
    # Saving every step in the background: the save in flight when the step diverged (the
    # step before) is committed and is the last checkpoint.
    if [ "$CASE" = diverge_stops_async ] && [ "$latest" != "$(printf 'step_%08d' $((step - 1)))" ]; then
      fail "latest ($latest) is not the step before the diverged step $step"
    fi
    ;;
  diverge_skips)
    tiny_config tiny.toml
    run_train tiny.toml "${DIVERGE[@]}" --set train.skip_nonfinite=true
    expect_rc 0
    if ! grep -q "update skipped (train.skip_nonfinite" "$OUT"; then fail "no 'update skipped' log line"; fi
    n=$(grep -c '"nonfinite":true' "$WORK/run/metrics.jsonl")
    if [ "$n" -lt 1 ]; then fail "metrics.jsonl marks no step nonfinite"; fi
    if [ "$(cat "$WORK/run/checkpoints/latest")" != "step_00000030" ]; then fail "the run did not reach step 30"; fi
    ;;
  memory_too_large)
    tiny_config tiny.toml
    SECONDS=0
    run_train tiny.toml --set model.n_layer=10000 --set model.n_embd=1024 --set model.n_head=4
    expect_input_error "memory plan: " "does not fit" "largest row: " "train.check_memory"
    if ! grep -q "^memory plan per rank" "$OUT"; then fail "the memory plan was not printed"; fi
    if ! grep -q "available per rank: " "$OUT"; then fail "the available memory was not printed"; fi
    if [ "$SECONDS" -gt 30 ]; then fail "refusing took $SECONDS s"; fi
    if [ -e "$WORK/run/checkpoints" ]; then fail "a refused run wrote checkpoints"; fi
    ;;
  memory_too_large_offload)
    # fsdp.cpu_offload moves the model states to the host rows; on the CPU backend they are
    # the same memory, so the sum is checked and still refused, with both tables printed.
    tiny_config tiny.toml
    run_train tiny.toml --set model.n_layer=10000 --set model.n_embd=1024 --set model.n_head=4 \
      --set fsdp.offload_params=true
    expect_input_error "memory plan: " "does not fit" "largest row: " "train.check_memory"
    if ! grep -q "^host (fsdp.cpu_offload):" "$OUT"; then fail "the host rows were not printed"; fi
    if [ -e "$WORK/run/checkpoints" ]; then fail "a refused run wrote checkpoints"; fi
    # With micro-batches the device's grads row is the accumulator, and the plan says so;
    # with one micro-batch a step there is none.
    run_train tiny.toml --dry-run --set fsdp.cpu_offload=true --set train.micro_batch_size=1
    if [ "$RC" -ne 0 ]; then fail "the offloaded dry run failed: $(cat "$ERR")"; fi
    if ! grep -q "(grads: the fp32 accumulator of the micro-batches" "$OUT"; then
      fail "the plan does not explain the device's grads row"; fi
    run_train tiny.toml --dry-run --set fsdp.cpu_offload=true
    if grep -q "(grads: the fp32 accumulator" "$OUT"; then
      fail "a plan without micro-batches mentions an accumulator"; fi
    ;;
  *)
    echo "unknown case $CASE" >&2
    exit 2
    ;;
esac
finish
