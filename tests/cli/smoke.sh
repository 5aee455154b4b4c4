#!/usr/bin/env bash
# tests/cli/smoke.sh: fsdp_train's successful paths at 2 ranks, end to end.
#
#   bash tests/cli/smoke.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE train:   inputs/tiny.toml for 5 steps (train.peak_flops = 1e12) writes
#               run_dir/metrics.jsonl (5 lines with step, loss, lr, grad_norm, tokens,
#               tokens_per_sec, mfu, peak_mem_bytes, step_s and the 7 phase times, which add
#               up to step_s within 5%; val_loss on the last) and the final sharded checkpoint
#               checkpoints/step_00000005 plus `latest`; the banner has the mfu line and the
#               last progress line shows mfu and every phase, eval and ckpt included.
# CASE hdf5:    the same on a token file made by fsdp_prepare (data.source = "hdf5").
# CASE mixture: a data mixture (data.paths = two fsdp_prepare files, data.weights = [3, 1]):
#               the banner lists each file with its samples and 75.0 / 25.0 % of the draws;
#               2 ranks equal 1 rank (loss within 1e-5 relative, same tokens); 2 steps then
#               --resume to 4 print the same losses, lr and grad_norm as 4 uninterrupted steps;
#               an evaluation reports val_loss_per_path, and at step 0 (eval.on_start) each
#               file's equals that file's val_loss alone (data.path) bit for bit, and val_loss
#               their mean weighted by each file's validation windows.
# CASE mixed_precision: bf16 params + fp32 reduce, then fp16 with loss scaling, 3 steps each:
#               finite losses near ln(256); fp16 lines carry loss_scale and skipped; the
#               banner names the dtypes.
# CASE dry_run: --dry-run prints the resolved config and memory plan, exits 0, writes nothing.
# CASE t5_dry_run: inputs/t5_wordnet.toml (HYBRID_SHARD, shard_size 2) --dry-run on a small
#               pairs file made by fsdp_prepare --pairs: prints the t5 model, its T5Block
#               units and the memory plan, writes nothing; with
#               fsdp.activation_checkpointing=true the activations row (and the total) is
#               smaller by the same amount and every other row is unchanged.
# CASE dry_run_world_size: --dry-run --world-size 4 from ONE process prints the same units and
#               memory plan as a real 4-rank dry run (mpirun -np 4) of the same config
#               (HYBRID_SHARD_ZERO2 over shard groups of 2, so both mesh dimensions count,
#               then FULL_SHARD); --world-size 8 (FULL_SHARD, shard groups of 4) halves
#               sharded_params, grads and optimizer_state relative to 4 ranks and keeps
#               unsharded_params and activations (micro batch 1); the banner says the plan
#               is for N ranks and shows the planned mesh.
# CASE threads_bound_by_mpirun: `mpirun -np 1` (Open MPI binds the rank to one core) with
#               train.num_threads = 2: the banner shows 2 threads on >= 2 CPUs; with
#               `--bind-to core` too, plus the note that a deliberate binding was overridden.
# CASE help / version: exit 0, printed once (rank 0 only); --version prints fsdp::build_id().
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# check_metrics FILE N: FILE has N JSON lines for steps 1..N with the documented fields,
# finite values in range, and val_loss on (only) the last line (eval.every = 0).
check_metrics() {
  python3 - "$1" "$2" <<'EOF' || fail "metrics.jsonl check failed"
import json, math, sys
path, n = sys.argv[1], int(sys.argv[2])
lines = open(path).read().splitlines()
assert len(lines) == n, f"{len(lines)} lines, expected {n}"
fields = ["step", "loss", "lr", "grad_norm", "tokens", "tokens_per_sec", "mfu", "peak_mem_bytes",
          "step_s", "data_s", "forward_s", "backward_s", "comm_wait_s", "optimizer_s", "eval_s",
          "checkpoint_s"]
for i, text in enumerate(lines):
    rec = json.loads(text)
    for f in fields:
        assert f in rec, f"line {i + 1}: missing {f}: {text}"
        assert isinstance(rec[f], (int, float)) and math.isfinite(rec[f]), f"line {i + 1}: {f} = {rec[f]}"
    assert rec["step"] == i + 1, f"line {i + 1}: step {rec['step']}"
    # Synthetic uniform tokens over 256 ids: the loss of a barely trained model is ~ln(256).
    assert 4.5 < rec["loss"] < 6.5, f"line {i + 1}: loss {rec['loss']}"
    assert 0 < rec["lr"] <= 1e-3, f"line {i + 1}: lr {rec['lr']}"
    assert rec["grad_norm"] > 0 and rec["tokens_per_sec"] > 0 and rec["peak_mem_bytes"] > 0, text
    phases = sum(rec[k] for k in fields if k.endswith("_s") and k != "step_s")
    assert abs(phases - rec["step_s"]) <= 0.05 * rec["step_s"], f"line {i + 1}: phases {phases} vs {text}"
    assert 0 < rec["mfu"] < 1, text
    has_val = "val_loss" in rec
    assert has_val == (i == n - 1), f"line {i + 1}: val_loss present = {has_val}"
    if has_val:
        assert math.isfinite(rec["val_loss"]) and 4.5 < rec["val_loss"] < 6.5, text
EOF
}

# check_checkpoint RUN_DIR STEP NSHARDS: checkpoints/latest names step_<STEP> and that
# directory holds NSHARDS shard files and no leftover .tmp directory.
check_checkpoint() {
  local ck=$1/checkpoints name
  name=$(printf 'step_%08d' "$2")
  if [ ! -f "$ck/latest" ]; then fail "no $ck/latest"; return; fi
  if [ "$(tr -d '[:space:]' <"$ck/latest")" != "$name" ]; then
    fail "latest says '$(cat "$ck/latest")', expected $name"
  fi
  if [ ! -d "$ck/$name" ]; then fail "no checkpoint directory $ck/$name"; return; fi
  local i
  for ((i = 0; i < $3; i++)); do
    local f
    f=$ck/$name/$(printf 'shard_%05d-of-%05d.h5' "$i" "$3")
    if [ ! -s "$f" ]; then fail "missing or empty shard file $f"; fi
  done
  local n
  n=$(find "$ck/$name" -name 'shard_*.h5' | wc -l)
  if [ "$n" -ne "$3" ]; then fail "$n shard files in $ck/$name, expected $3"; fi
  if compgen -G "$ck/*.tmp" >/dev/null; then fail "a .tmp step directory was left behind"; fi
}

case "$CASE" in
  train)
    tiny_config tiny.toml
    run_train tiny.toml --set train.peak_flops=1e12
    expect_rc 0
    if [ -s "$ERR" ] && grep -q "^fsdp_train: " "$ERR"; then fail "error line on a successful run"; fi
    check_metrics "$WORK/run/metrics.jsonl" 5
    check_checkpoint "$WORK/run" 5 2
    # Rank 0 alone prints: one banner, one line per step.
    n=$(grep -c '^step 5/5' "$OUT")
    if [ "$n" -ne 1 ]; then fail "'step 5/5' printed $n times on stdout, expected 1"; fi
    # The progress line shows MFU (peak known: train.peak_flops below) and the phase times.
    grep -Eq '^step 5/5 .*\| mfu [0-9.]+% \|.*\| [0-9.]+ ms = data [0-9.]+ \+ fwd [0-9.]+ \+ bwd [0-9.]+ \+ comm [0-9.]+ \+ opt [0-9.]+ \+ eval [0-9.]+ \+ ckpt [0-9.]+$' "$OUT" ||
      fail "step 5/5 line lacks mfu or the phase times: $(grep '^step 5/5' "$OUT")"
    grep -q '^mfu: model FLOPs .* per token .*peak 1 TFLOP/s per rank (train.peak_flops)' "$OUT" ||
      fail "banner lacks the mfu line: $(grep '^mfu:' "$OUT")"
    ;;
  hdf5)
    make_text_dir "$WORK/text"
    run_prepare -o "$WORK/tokens.h5" --val-fraction 0.2 "$WORK/text"
    expect_rc 0
    tiny_config tiny.toml
    run_train tiny.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5" \
      --set train.max_steps=3 --set fsdp.sharding_strategy=SHARD_GRAD_OP
    expect_rc 0
    # Repetitive text is easier than uniform noise, so only check shape and finiteness here.
    python3 - "$WORK/run/metrics.jsonl" <<'EOF' || fail "metrics.jsonl (hdf5) check failed"
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
assert [r["step"] for r in recs] == [1, 2, 3], recs
assert all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in recs), recs
assert "val_loss" in recs[-1] and math.isfinite(recs[-1]["val_loss"]), recs[-1]
EOF
    check_checkpoint "$WORK/run" 3 2
    ;;
  mixture)
    make_text_dir "$WORK/text_a"
    mkdir -p "$WORK/text_b"
    yes "sphinx of black quartz, judge my vow" | head -c 4000 >"$WORK/text_b/c.txt"
    val_tokens=()
    for f in a b; do
      run_prepare -o "$WORK/$f.h5" --val-fraction 0.2 "$WORK/text_$f"
      expect_rc 0
      val_tokens+=("$(grep -o '[0-9]* val tokens' "$OUT" | cut -d' ' -f1)")
    done
    tiny_config tiny.toml
    mix=(--set data.source=hdf5 --set "data.paths=[\"$WORK/a.h5\", \"$WORK/b.h5\"]"
         --set "data.weights=[3, 1]" --set optim.decay_steps=4)
    run_train tiny.toml "${mix[@]}" --set train.max_steps=4 --set train.run_dir="$WORK/np2" \
      --set eval.on_start=true
    expect_rc 0
    if ! grep -Eq '^step 0/4 \| val_loss [0-9.]+ \(per path [0-9.]+, [0-9.]+\)$' "$OUT"; then
      fail "no step 0 line with the per-path val_loss"
    fi
    for idx in 0 1; do
      f=$([ $idx = 0 ] && echo a || echo b)
      share=$([ $idx = 0 ] && echo 75.0 || echo 25.0)
      if ! grep -Eq "^  data.paths\[$idx\] $WORK/$f.h5: [0-9]+ training samples, $share % of the samples drawn$" "$OUT"; then
        fail "banner lacks data.paths[$idx] with $share %"
      fi
    done
    for f in a b; do
      run_train tiny.toml --set data.source=hdf5 --set data.path="$WORK/$f.h5" --set eval.on_start=true \
        --set train.max_steps=1 --set train.run_dir="$WORK/only_$f"
      expect_rc 0
    done
    run_train -np 1 tiny.toml "${mix[@]}" --set train.max_steps=4 --set train.run_dir="$WORK/np1" \
      --set eval.on_start=true
    expect_rc 0
    run_train tiny.toml "${mix[@]}" --set train.max_steps=2 --set train.run_dir="$WORK/res"
    expect_rc 0
    run_train tiny.toml "${mix[@]}" --set train.max_steps=4 --set train.run_dir="$WORK/res" --resume
    expect_rc 0
    python3 - "$WORK/np2/metrics.jsonl" "$WORK/np1/metrics.jsonl" "$WORK/res/metrics.jsonl" \
      "$WORK/only_a/metrics.jsonl" "$WORK/only_b/metrics.jsonl" "${val_tokens[@]}" <<'EOF' || fail "mixture runs differ"
import json, sys
np2, np1, res, only_a, only_b = ([json.loads(l) for l in open(p).read().splitlines()] for p in sys.argv[1:6])
# Step 0: each file's loss is that file's alone; the total is weighted by target tokens.
zero = np2.pop(0)
assert zero["step"] == 0, zero
assert zero["val_loss_per_path"] == [only_a[0]["val_loss"], only_b[0]["val_loss"]], (zero, only_a[0], only_b[0])
windows = [(int(n) - 1) // 16 for n in sys.argv[6:8]]  # tiny.toml: seq_len 16
mean = sum(w * l for w, l in zip(windows, zero["val_loss_per_path"])) / sum(windows)
assert abs(zero["val_loss"] - mean) <= 1e-12 * mean, (zero, windows, mean)
assert len(np2[-1]["val_loss_per_path"]) == 2, np2[-1]
assert "val_loss_per_path" not in only_a[-1], only_a[-1]
np1.pop(0)
assert [r["step"] for r in np2] == [1, 2, 3, 4], np2
for a, b in zip(np2, np1):
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"]), (a, b)
    assert a["tokens"] == b["tokens"], (a, b)
assert [r["step"] for r in res] == [1, 2, 3, 4], res
for a, b in zip(np2, res):
    for k in ("loss", "lr", "grad_norm"):
        assert a[k] == b[k], (k, a, b)
EOF
    ;;
  mixed_precision)
    tiny_config tiny.toml
    run_train tiny.toml --set mixed_precision.param_dtype=bf16 --set train.max_steps=3
    expect_rc 0
    if ! grep -q "param_dtype bf16, reduce_dtype fp32" "$OUT"; then fail "banner lacks the dtypes"; fi
    mv "$WORK/run" "$WORK/run_bf16"
    run_train tiny.toml --set mixed_precision.param_dtype=fp16 \
      --set mixed_precision.reduce_dtype=fp16 --set train.max_steps=3
    expect_rc 0
    python3 - "$WORK/run_bf16/metrics.jsonl" "$WORK/run/metrics.jsonl" <<'EOF' || fail "mixed-precision metrics check failed"
import json, math, sys
bf16 = [json.loads(l) for l in open(sys.argv[1]).read().splitlines()]
fp16 = [json.loads(l) for l in open(sys.argv[2]).read().splitlines()]
for recs in (bf16, fp16):
    assert [r["step"] for r in recs] == [1, 2, 3], recs
    assert all(math.isfinite(r["loss"]) and 4.5 < r["loss"] < 6.5 for r in recs), recs
assert all("loss_scale" not in r for r in bf16), bf16[0]
assert all(r["loss_scale"] == 65536.0 and r["skipped"] is False for r in fp16), fp16
EOF
    ;;
  dry_run)
    tiny_config tiny.toml
    run_train tiny.toml --dry-run
    expect_rc 0
    for want in "memory plan per rank" "sharded_params" "optimizer_state" "activations" \
                "total" "FULL_SHARD" "n_layer = 2"; do
      if ! grep -q -- "$want" "$OUT"; then fail "dry-run output lacks '$want'"; fi
    done
    n=$(grep -c "memory plan per rank" "$OUT")
    if [ "$n" -ne 1 ]; then fail "memory plan printed $n times, expected once (rank 0)"; fi
    if [ -e "$WORK/run/checkpoints" ]; then fail "--dry-run created $WORK/run/checkpoints"; fi
    if [ -e "$WORK/run/metrics.jsonl" ]; then fail "--dry-run wrote metrics.jsonl"; fi
    ;;
  dry_run_world_size)
    tiny_config tiny.toml
    common=(--dry-run --set train.micro_batch_size=1 --set mixed_precision.param_dtype=bf16)
    # plan_rows FILE: the unit lines and the memory plan's "name bytes" rows.
    unit_and_plan_rows() { awk '/^  unit /; /^memory plan per rank/ { on = 1; next } on && $2 ~ /^[0-9]+$/ { print $1, $2 }' "$1"; }
    for strategy in HYBRID_SHARD_ZERO2 FULL_SHARD; do
      run_train -np 4 tiny.toml "${common[@]}" --set mesh.shard_size=2 \
        --set fsdp.sharding_strategy=$strategy
      expect_rc 0
      unit_and_plan_rows "$OUT" >"$WORK/real4.txt"
      run_train -np 1 tiny.toml "${common[@]}" --world-size 4 --set mesh.shard_size=2 \
        --set fsdp.sharding_strategy=$strategy
      expect_rc 0
      unit_and_plan_rows "$OUT" >"$WORK/plan4.txt"
      if ! grep -q "^total " "$WORK/plan4.txt"; then fail "no plan rows: $(cat "$WORK/plan4.txt")"; fi
      if ! diff "$WORK/real4.txt" "$WORK/plan4.txt"; then
        fail "$strategy: --world-size 4 from one process differs from the 4-rank dry run"
      fi
      if ! grep -q "plan for 4 ranks" "$OUT"; then fail "banner does not say the plan is for 4 ranks"; fi
      if ! grep -q "world 4 = replicate 2 x shard 2 (planned)" "$OUT"; then
        fail "banner lacks the planned mesh"
      fi
    done
    # FULL_SHARD at 8 ranks (shard groups of 4) against 4 ranks: every tiny unit's numel is
    # a multiple of 8, so the sharded rows halve exactly.
    run_train -np 1 tiny.toml "${common[@]}" --world-size 8 --set mesh.shard_size=4
    expect_rc 0
    unit_and_plan_rows "$OUT" >"$WORK/plan8.txt"
    if ! grep -q "plan for 8 ranks" "$OUT"; then fail "banner does not say the plan is for 8 ranks"; fi
    if ! grep -q "world 8 = replicate 2 x shard 4 (planned)" "$OUT"; then
      fail "banner lacks the planned mesh"
    fi
    python3 - "$WORK/plan4.txt" "$WORK/plan8.txt" <<'EOF' || fail "--world-size 8 vs 4 check failed"
import sys
def rows(path):
    return {l.split()[0]: int(l.split()[1]) for l in open(path) if l.split()[0] != "unit"}
four, eight = rows(sys.argv[1]), rows(sys.argv[2])
for name in ("sharded_params", "grads", "optimizer_state"):
    assert four[name] > 0 and eight[name] * 2 == four[name], (name, four[name], eight[name])
for name in ("unsharded_params", "activations"):
    assert four[name] > 0 and eight[name] == four[name], (name, four[name], eight[name])
print("plan at 4:", four)
print("plan at 8:", eight)
EOF
    ;;
  t5_dry_run)
    # 40 pairs (gloss -> word, different lengths): 38 train >= global_batch_size 32.
    for i in $(seq 1 40); do
      printf 'a gloss of %s words for entry %d\tword%d\n' "$(seq -s ' ' 1 $((i % 7 + 1)))" "$i" "$i"
    done >"$WORK/pairs.tsv"
    run_prepare --pairs "$WORK/pairs.tsv" "$WORK/pairs.h5" --val-fraction 0.05
    expect_rc 0
    # plan_rows: the memory plan's "name bytes" rows of the last run.
    plan_rows() { awk '/^memory plan per rank/ { on = 1; next } on && $2 ~ /^[0-9]+$/ { print $1, $2 }' "$OUT"; }
    t5=(--dry-run --set data.path="$WORK/pairs.h5" --set train.run_dir="$WORK/run")
    run_train "$SRC_DIR/inputs/t5_wordnet.toml" "${t5[@]}"
    expect_rc 0
    for want in "memory plan per rank" "model: t5," "HYBRID_SHARD" 'type = "t5"' \
                "unit encoder.block.0" "unit decoder.block.2" "data: seq2seq, " "activations" "total"; do
      if ! grep -qF -- "$want" "$OUT"; then fail "t5 dry-run output lacks '$want'"; fi
    done
    n=$(grep -c "memory plan per rank" "$OUT")
    if [ "$n" -ne 1 ]; then fail "memory plan printed $n times, expected once (rank 0)"; fi
    plan_rows >"$WORK/plan_off.txt"
    run_train "$SRC_DIR/inputs/t5_wordnet.toml" "${t5[@]}" --set fsdp.activation_checkpointing=true
    expect_rc 0
    plan_rows >"$WORK/plan_on.txt"
    python3 - "$WORK/plan_off.txt" "$WORK/plan_on.txt" <<'EOF' || fail "activation checkpointing plan check failed"
import sys
off, on = ({k: int(v) for k, v in (l.split() for l in open(p))} for p in sys.argv[1:])
rows = ["sharded_params", "unsharded_params", "grads", "unsharded_grads", "optimizer_state",
        "activations", "comm_buffers", "total"]
assert sorted(off) == sorted(rows) and sorted(on) == sorted(rows), (off, on)
assert 0 < on["activations"] < off["activations"], (off["activations"], on["activations"])
for k in rows:
    if k not in ("activations", "total"):
        assert on[k] == off[k], (k, off[k], on[k])
assert off["total"] - on["total"] == off["activations"] - on["activations"], (off, on)
print("activations", off["activations"], "->", on["activations"])
EOF
    if [ -e "$WORK/run" ]; then fail "--dry-run created $WORK/run"; fi
    ;;
  threads_bound_by_mpirun)
    # Open MPI binds a lone rank to one core by default; train.num_threads = 2 must still get
    # two cores (fsdp/backend/cpu_threads.hpp), and a deliberate --bind-to core is overridden
    # only with a note. Needs a machine with 2 cores or more (CI has 2).
    cores=$(getconf _NPROCESSORS_ONLN)  # not nproc: it honours OMP_NUM_THREADS (=1 here)
    if [ "$cores" -lt 2 ]; then fail "this case needs >= 2 cores, nproc = $cores"; fi
    tiny_config tiny.toml
    # cpus_of: the CPU count in the banner's "rank 0 on CPUs LIST" (LIST like 0-1 or 0,4).
    cpus_of() {
      python3 -c 'import re,sys
m = re.search(r"rank 0 on CPUs ([0-9,-]+)", open(sys.argv[1]).read())
if not m: sys.exit("no \"rank 0 on CPUs\" in the banner")
n = 0
for part in m.group(1).split(","):
    lo, _, hi = part.partition("-")
    n += int(hi or lo) - int(lo) + 1
print(n)' "$OUT"
    }
    for bind in "" "--bind-to core"; do
      # shellcheck disable=SC2086  # $bind is zero or two words
      timeout 60 "$MPIEXEC" -np 1 $bind "$FSDP_TRAIN" tiny.toml --set train.num_threads=2 \
        --set train.max_steps=2 --set "train.run_dir=\"$WORK/run_${bind// /_}\"" \
        >"$OUT" 2>"$ERR" </dev/null
      RC=$?
      expect_rc 0
      grep "^device:" "$OUT"
      if ! grep -q "^device: cpu (2 threads per rank; rank 0 on CPUs " "$OUT"; then
        fail "mpirun -np 1 $bind: banner does not show 2 threads per rank"
      fi
      n=$(cpus_of) || fail "mpirun -np 1 $bind: $n"
      if [ "$n" -lt 2 ]; then fail "mpirun -np 1 $bind: rank 0 bound to $n CPU(s), expected >= 2"; fi
      note=$(grep -c "exceeds the CPUs the launcher bound this rank to" "$OUT")
      if [ -n "$bind" ] && [ "$note" -ne 1 ]; then fail "--bind-to core overridden without a note"; fi
      if [ -z "$bind" ] && [ "$note" -ne 0 ]; then fail "Open MPI's default binding reported as deliberate"; fi
    done
    ;;
  help)
    run_train --help
    expect_rc 0
    if ! grep -q -- "--set" "$OUT" || ! grep -q -- "--resume" "$OUT" ||
       ! grep -q -- "--dry-run" "$OUT"; then
      fail "--help does not list --set, --resume and --dry-run"
    fi
    n=$(grep -c "^Usage" "$OUT")
    if [ "$n" -ne 1 ]; then fail "usage printed $n times, expected once"; fi
    ;;
  version)
    run_train --version
    expect_rc 0
    # fsdp::build_id: version+g<commit>[.dirty.<diff hash>] (<build type>, <backend>).
    n=$(grep -cE '^fsdp_train [0-9]+\.[0-9]+\.[0-9]+\+(g[0-9a-f]{12}(\.dirty\.[0-9a-f]{8})?|unknown) \([A-Za-z]*, (CPU only|CUDA sm [0-9,]+)\)$' "$OUT")
    if [ "$n" -ne 1 ]; then fail "version line printed $n times, expected once"; fi
    ;;
  list_keys)
    # The key table (describe_keys), printed once by rank 0: every section, every model.type's
    # [model] keys, defaults, PyTorch/HF names and docs.
    run_train --list-keys
    expect_rc 0
    for want in '^optim.lr = 0.001  (float, 0 < x <= 10; --resume may change it)$' \
                '^    Peak learning rate.  \[torch.optim.AdamW lr\]$' \
                '^fsdp.sharding_strategy = "FULL_SHARD"' '^model.n_layer = 4 ' '^model.d_kv = 32 ' \
                '^    Hidden size.  \[HF T5Config.d_model\]$' '^eval.on_start = false' \
                '^fsdp.transformer_layer_cls_to_wrap = \["GPT2Block"\]' \
                '^    Number of LlamaDecoderLayer blocks.  \[HF LlamaConfig.num_hidden_layers\]$' \
                '^# model.type = "mistral" (MistralConfig): its \[model\] keys$' \
                '^# model.type = "qwen2" (Qwen2Config): its \[model\] keys$' \
                '^    Number of Qwen3DecoderLayer blocks.  \[HF Qwen3Config.num_hidden_layers\]$' \
                '^model.fused_linear_cross_entropy = false  (boolean; --resume may change it)$' \
                '^model.fused_linear_cross_entropy_chunk_rows = 0  (integer >= 0; --resume may change it)$'; do
      n=$(grep -c -- "$want" "$OUT")
      if [ "$n" -ne 1 ]; then fail "--list-keys: '$want' printed $n times, expected once"; fi
    done
    ;;
  model_from)
    # --model-from prints, once (rank 0), the [model] section of a Hugging Face directory (here
    # fsdp_merge's of a 1-step tiny run): with the tiny run's other sections it trains from
    # those weights.
    tiny_config src.toml
    run_train src.toml --set train.max_steps=1 --set train.run_dir="$WORK/src_run"
    expect_rc 0
    "$(dirname "$FSDP_TRAIN")/fsdp_merge" "$WORK/src_run/checkpoints/step_00000001" "$WORK/hf" \
      >/dev/null 2>&1 || fail "fsdp_merge of the source run failed"
    run_train --model-from "$WORK/hf"
    expect_rc 0
    for want in '^\[model\]$' '^type = "gpt2"$' "^init_from = \"$WORK/hf\"\$" '^n_embd = '; do
      n=$(grep -c -- "$want" "$OUT")
      if [ "$n" -ne 1 ]; then fail "--model-from: '$want' printed $n times, expected once"; fi
    done
    if grep -q '^\[data\]' "$OUT"; then fail "--model-from printed more than [model]"; fi
    { cat "$OUT"; sed -n '/^\[data\]/,$p' "$TINY" | sed "s|^run_dir = .*|run_dir = \"$WORK/run\"|"; } \
      >from.toml
    run_train from.toml --set train.max_steps=1
    expect_rc 0
    grep -q "^init_from: $WORK/hf: " "$OUT" || fail "the run from --model-from's section did not load $WORK/hf"
    run_train --model-from "$WORK/no_such_dir"
    expect_input_error "--model-from" "$WORK/no_such_dir"
    ;;
  input_headers)
    # Every dry-run command an inputs/*.toml header shows works as written (issue 29 item 7:
    # gpt_7b.toml's exited 2), with build/fsdp_train the fsdp_train under test.
    n=0
    for f in "$SRC_DIR"/inputs/*.toml; do
      while IFS= read -r line; do
        cmd=${line#\#}
        cmd=${cmd//build\/fsdp_train/$FSDP_TRAIN}
        (cd "$SRC_DIR" && eval "timeout 60 $cmd") >"$OUT" 2>"$ERR" </dev/null
        rc=$?
        if [ "$rc" -ne 0 ]; then fail "$(basename "$f"): '$line' exited $rc: $(head -c 300 "$ERR")"; fi
        n=$((n + 1))
      done < <(grep -E '^#\s+build/fsdp_train .*--dry-run' "$f")
    done
    [ "$n" -ge 5 ] || fail "only $n header dry-run commands found in inputs/*.toml"
    echo "$n header commands ran"
    ;;
  *)
    echo "smoke.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
