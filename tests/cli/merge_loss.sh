#!/usr/bin/env bash
# tests/cli/merge_loss.sh: the merged model computes the trainer's loss (issue 21 item 8).
#
#   bash tests/cli/merge_loss.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# CASE llama: the same chain on a 2-layer GQA Llama (untied head, llama3 RoPE) against
#            check_merge.py's numpy LlamaForCausalLM (RMSNorm, rotate-half RoPE, repeat_kv,
#            SwiGLU; HF names, nn.Linear layouts).
# CASE gpt2: fsdp_prepare a 6000-byte text with --val-fraction 0.1 (the validation split is
#            the text's last 600 bytes, docs/data.md); fsdp_train the tiny GPT-2 on it for 4
#            steps on 2 ranks (FULL_SHARD), evaluating the whole split at the last step;
#            fsdp_merge the final checkpoint; then tests/check_merge.py's independent numpy
#            GPT-2 (Hugging Face conventions: Conv1D weights [in, out], the tied LM head) reads
#            model.safetensors + config.json and its mean cross-entropy over the same 37
#            windows of 16 tokens equals the run's final val_loss within 1e-5: training,
#            sharded save, merge, names, transposes and config.json checked as one chain.
# Environment (set by tests/test_cli.cmake): FSDP_MERGE (fsdp_merge), FSDP_TEST_PYTHON (a
# python3 with numpy).
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

FSDP_MERGE=${FSDP_MERGE:-$(dirname "$FSDP_TRAIN")/fsdp_merge}
PY=${FSDP_TEST_PYTHON:-/usr/bin/python3}
CHECK_MERGE=$SRC_DIR/tests/check_merge.py

case "$CASE" in
  gpt2|llama)
    L=16
    # Real words, varied, one file (the split is defined on the concatenated stream).
    for i in $(seq 1 200); do
      echo "shard $i of the flat parameter is all-gathered, then reduce-scattered."
    done | head -c 6000 >"$WORK/corpus.txt"
    run_prepare -o "$WORK/tokens.h5" --val-fraction 0.1 "$WORK/corpus.txt"
    expect_rc 0
    grep -q ", 600 val tokens" "$OUT" || fail "fsdp_prepare's split is not the last 600 bytes"
    tail -c 600 "$WORK/corpus.txt" >"$WORK/val.bin"
    tiny_config tiny.toml
    sed -i "s|^source = .*|source = \"hdf5\"\npath = \"$WORK/tokens.h5\"|" tiny.toml
    if [ "$CASE" = llama ]; then
      # The same run on a GQA Llama (untied head, llama3 RoPE): [model] and the wrap class
      # replaced, every other section kept.
      sed -i '/^\[model\]/,/^\[data\]/{/^\[data\]/!d}' tiny.toml
      sed -i 's/"GPT2Block"/"LlamaDecoderLayer"/' tiny.toml
      cat >>tiny.toml <<'EOF'
[model]
type = "llama"
num_hidden_layers = 2
hidden_size = 16
num_attention_heads = 4
num_key_value_heads = 2
intermediate_size = 24
max_position_embeddings = 32
vocab_size = 256
rope_theta = 500000.0
rope_scaling = { rope_type = "llama3", factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position_embeddings = 8 }
EOF
    fi
    run_train tiny.toml --set train.max_steps=4 --set checkpoint.every=4 \
      --set optim.lr=1e-2 --set eval.max_windows=0
    expect_rc 0
    X=$("$PY" - "$WORK/run/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = [r for r in rows if r.get("step") == 4 and "val_loss" in r]
print(repr(last[-1]["val_loss"]) if last else "")
EOF
)
    [ -n "$X" ] || fail "no val_loss at step 4 in run/metrics.jsonl"
    timeout 60 "$FSDP_MERGE" "$WORK/run/checkpoints/step_00000004" "$WORK/hf" >"$OUT" 2>"$ERR" </dev/null ||
      fail "fsdp_merge of step 4 failed"
    windows=$(( (600 - 1) / L ))
    timeout 120 "$PY" "$CHECK_MERGE" "$WORK/hf" --eval-bytes "$WORK/val.bin" --seq-len "$L" \
      --windows "$windows" --expect-loss "$X" >"$OUT" 2>"$ERR" </dev/null ||
      fail "the merged model's validation loss is not the trainer's ($X)"
    grep "val loss" "$OUT"
    echo "trainer val_loss $X over $windows windows of $L tokens"
    ;;
  *)
    echo "unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
