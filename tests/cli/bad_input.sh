#!/usr/bin/env bash
# tests/cli/bad_input.sh: fsdp_train refuses bad input cleanly at 2 ranks.
#
#   bash tests/cli/bad_input.sh FSDP_TRAIN FSDP_PREPARE MPIEXEC CASE
#
# One CASE per ctest (tests/test_cli.cmake registers cli_bad_input_<CASE>). Every case runs
# `mpirun -np 2 fsdp_train ...` on a wrong config, command line or data file and checks the
# contract of docs/config.md "Errors" and docs/data.md: exit code 2 on every rank (mpirun
# returns it), one `fsdp_train: <message>` line on stderr naming the key or file, no hang.
# shellcheck source=tests/cli/lib.sh
source "$(dirname "$0")/lib.sh"

# A valid byte-level token file (vocab 256) made by fsdp_prepare, for the data cases.
make_token_file() {
  make_text_dir "$WORK/text"
  "$FSDP_PREPARE" -o "$WORK/tokens.h5" "$WORK/text" >/dev/null 2>&1 ||
    { fail "fsdp_prepare could not make the token file"; finish; }
}

case "$CASE" in
  malformed_toml)
    # Line 3 has a key without a value: the parser reports bad.toml:3:<col>.
    printf '[model]\nn_layer = 2\nn_head =\n' >bad.toml
    run_train bad.toml
    expect_input_error "bad.toml"
    expect_error_matches '^fsdp_train: [^ ]*bad\.toml:3:[0-9]+: '
    ;;
  unknown_key)
    tiny_config bad.toml
    sed -i 's/^sharding_strategy = /shardin_strategy = /' bad.toml
    run_train bad.toml
    expect_input_error "bad.toml" "fsdp.shardin_strategy" "fsdp.sharding_strategy"
    ;;
  unknown_key_set)
    tiny_config good.toml
    run_train good.toml --set fsdp.shardin_strategy=FULL_SHARD
    expect_input_error "--set fsdp.shardin_strategy=FULL_SHARD" "fsdp.shardin_strategy"
    ;;
  unknown_section)
    tiny_config bad.toml '[modle]' 'n_layer = 2'
    run_train bad.toml
    expect_input_error "bad.toml" "modle"
    ;;
  wrong_type)
    tiny_config bad.toml
    sed -i 's/^n_layer = 2/n_layer = "four"/' bad.toml
    run_train bad.toml
    expect_input_error "bad.toml" "model.n_layer" "integer"
    ;;
  out_of_range_set)
    tiny_config good.toml
    run_train good.toml --set optim.lr=-1
    expect_input_error "--set optim.lr=-1" "optim.lr"
    ;;
  pad_vocab_multiple)
    # model.pad_vocab_multiple: 0, negative, not an integer, too large (file and --set).
    tiny_config good.toml
    for v in 0 -128 1.5 100000; do
      run_train good.toml --set model.pad_vocab_multiple=$v
      expect_input_error "--set model.pad_vocab_multiple=$v" "model.pad_vocab_multiple"
    done
    tiny_config bad.toml
    sed -i 's|^\[model\]$|[model]\npad_vocab_multiple = 0|' bad.toml
    run_train bad.toml
    expect_input_error "bad.toml: model.pad_vocab_multiple: 0 is out of range"
    ;;
  negative_peak_flops)
    tiny_config good.toml
    run_train good.toml --set train.peak_flops=-1e12
    expect_input_error "--set train.peak_flops=-1e12" "train.peak_flops"
    ;;
  bad_set_syntax)
    tiny_config good.toml
    run_train good.toml --set model.n_layer
    expect_input_error "--set model.n_layer" "section.key=value"
    ;;
  missing_config)
    run_train "$WORK/no_such_dir/missing.toml"
    expect_input_error "missing.toml"
    ;;
  no_config_argument)
    run_train
    expect_input_error "CONFIG.toml"
    ;;
  unknown_option)
    tiny_config good.toml
    run_train good.toml --frobnicate
    expect_input_error "frobnicate"
    ;;
  missing_data_path)
    # data.source = "hdf5" without data.path.
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5
    expect_input_error "data.path"
    ;;
  missing_data_file)
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/nonexistent.h5"
    expect_input_error "nonexistent.h5"
    if [ -e "$WORK/run/checkpoints" ]; then fail "a failed run created checkpoints"; fi
    ;;
  mixture_errors)
    # data.paths / data.weights (docs/data.md "Data mixtures"): each mistake one line naming
    # the key, or the file by its place in data.paths.
    make_token_file
    tiny_config good.toml
    two="data.paths=[\"$WORK/tokens.h5\", \"$WORK/tokens.h5\"]"
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5" --set "$two"
    expect_input_error "data.paths" "not both"
    run_train good.toml --set data.source=hdf5 --set "$two" --set "data.weights=[1]"
    expect_input_error "data.weights" "1 weights for 2 data.paths"
    run_train good.toml --set data.source=hdf5 --set "$two" --set "data.weights=[1, -2]"
    expect_input_error "data.weights" "element 1 is -2"
    run_train good.toml --set "$two"
    expect_input_error "data.paths" "data.source"
    run_train good.toml --set data.source=hdf5 \
      --set "data.paths=[\"$WORK/tokens.h5\", \"$WORK/nonexistent.h5\"]"
    expect_input_error "data.paths[1]: $WORK/nonexistent.h5"
    run_train good.toml --set data.source=hdf5 --set "$two" --set model.vocab_size=50
    expect_input_error "data.paths[0]: $WORK/tokens.h5" "vocab_size"
    if [ -e "$WORK/run/checkpoints" ]; then fail "a refused run created checkpoints"; fi
    ;;
  document_masking_errors)
    # data.attn_mask_type = "block_causal" (docs/data.md "Document masking"): a byte-level file
    # has no eos_id, synthetic data no EOS, an EOS id outside the vocabulary, reset positions
    # without the mask: each one line naming the key (and the file); nothing written.
    make_token_file
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5" \
      --set data.attn_mask_type=block_causal
    expect_input_error "data.attn_mask_type" "tokens.h5 has no eos_id"
    run_train good.toml --set data.attn_mask_type=block_causal
    expect_input_error "data.attn_mask_type" "synthetic data has no EOS; set data.eos_token_id"
    run_train good.toml --set data.attn_mask_type=block_causal --set data.eos_token_id=256
    expect_input_error "data.eos_token_id: 256 is out of range"
    run_train good.toml --set data.reset_position_ids=true
    expect_input_error "data.reset_position_ids" "block_causal"
    run_train good.toml --set data.attn_mask_type=document
    expect_input_error "data.attn_mask_type" "unknown value"
    if [ -e "$WORK/run/checkpoints" ]; then fail "a refused run created checkpoints"; fi
    ;;
  not_hdf5_file)
    tiny_config good.toml
    printf 'this is plain text, not an HDF5 file\n' >garbage.h5
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/garbage.h5"
    expect_input_error "garbage.h5"
    ;;
  truncated_hdf5)
    # The first 3000 bytes of a valid token file: the superblock is there, the rest is not.
    make_token_file
    head -c 3000 tokens.h5 >truncated.h5
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/truncated.h5"
    expect_input_error "truncated.h5"
    ;;
  missing_val_dataset)
    # Fixture: a valid token file with /train/tokens only (tests/data/cli/make_no_val_h5.c).
    cp "$FIXTURES/no_val.h5" no_val.h5
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/no_val.h5" \
      --set data.seq_len=8
    expect_input_error "no_val.h5" "/val/tokens"
    ;;
  vocab_mismatch)
    make_token_file
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5" \
      --set model.vocab_size=128
    expect_input_error "tokens.h5" "model.vocab_size"
    ;;
  seq_len_too_long)
    # data.seq_len 64 > model.n_positions 32.
    tiny_config good.toml
    run_train good.toml --set data.seq_len=64
    expect_input_error "data.seq_len"
    ;;
  seq_len_longer_than_data)
    # 5000 bytes, 5% validation = 250 tokens: a validation split shorter than seq_len + 1.
    make_token_file
    tiny_config good.toml
    run_train good.toml --set data.source=hdf5 --set data.path="$WORK/tokens.h5" \
      --set model.n_positions=512 --set data.seq_len=300
    expect_input_error "tokens.h5" "data.seq_len"
    ;;
  key_of_another_class)
    # Qwen2Config has no head_dim (hidden_size / heads): the key is unknown for type qwen2.
    tiny_config good.toml
    sed -i '/^\[model\]/,/^\[/{/^\[model\]/!{/^\[/!d}}' good.toml
    sed -i 's/^\[model\]$/[model]\ntype = "qwen2"\nhidden_size = 32\nnum_attention_heads = 2\nhead_dim = 8/' good.toml
    run_train good.toml
    expect_input_error "model.head_dim"
    ;;
  unknown_strategy)
    tiny_config good.toml
    run_train good.toml --set fsdp.sharding_strategy=FUL_SHARD
    expect_input_error "fsdp.sharding_strategy" "FUL_SHARD"
    ;;
  micro_batch_not_dividing)
    tiny_config good.toml
    run_train good.toml --set train.micro_batch_size=3
    expect_input_error "train.micro_batch_size" "3"
    ;;
  unknown_dtype)
    tiny_config good.toml
    run_train good.toml --set mixed_precision.param_dtype=fp8
    expect_input_error "mixed_precision.param_dtype" "fp8"
    ;;
  n_embd_not_divisible)
    tiny_config good.toml
    run_train good.toml --set model.n_head=3
    expect_input_error "model.n_embd" "model.n_head"
    ;;
  batch_not_divisible)
    tiny_config good.toml
    run_train good.toml --set train.global_batch_size=3
    expect_input_error "train.global_batch_size"
    ;;
  world_size_without_dry_run)
    # --world-size plans a world that is not there: only with --dry-run.
    tiny_config good.toml
    run_train good.toml --world-size 8 --set mesh.shard_size=4
    expect_input_error "--world-size" "--dry-run"
    if [ -e "$WORK/run" ]; then fail "a refused --world-size created $WORK/run"; fi
    ;;
  world_size_not_divisible)
    # The planned world is validated as a real run of that size: mesh.shard_size must divide
    # it, must be set at all, and the batch must divide over it.
    tiny_config good.toml
    run_train good.toml --dry-run --world-size 6 --set mesh.shard_size=3
    expect_input_error "train.global_batch_size" "world size 6 (--world-size)"
    run_train good.toml --dry-run --world-size 8 --set mesh.shard_size=3
    expect_input_error "mesh.shard_size" "does not divide the world size 8" "--world-size"
    run_train good.toml --dry-run --world-size 8
    expect_input_error "mesh.shard_size" "must be set" "--world-size 8"
    run_train good.toml --dry-run --world-size 0 --set mesh.shard_size=4
    expect_input_error "--world-size" "expected >= 1"
    ;;
  shard_size_not_dividing)
    tiny_config good.toml
    run_train good.toml --set fsdp.sharding_strategy=HYBRID_SHARD --set mesh.shard_size=3
    expect_input_error "mesh.shard_size"
    ;;
  shard_size_not_dividing_full_shard)
    # The check is made at start-up whatever the strategy (docs/config.md [mesh]).
    tiny_config good.toml
    run_train good.toml --set mesh.shard_size=3
    expect_input_error "mesh.shard_size"
    ;;
  resume_without_checkpoint)
    tiny_config good.toml
    run_train good.toml --resume
    expect_input_error "--resume" "$WORK/run"
    ;;
  init_from_missing_dir)
    tiny_config good.toml
    run_train good.toml --set model.init_from="$WORK/no_such_hf_dir"
    expect_input_error "model.init_from" "$WORK/no_such_hf_dir"
    if [ -e "$WORK/run/metrics.jsonl" ]; then fail "a failed init_from run started training"; fi
    ;;
  config_differs_between_ranks)
    # Rank 1 reads another learning rate (MPMD here; in a job, a config edited while it
    # started, or a node's stale copy): exit 2 naming the key and both values, nothing written.
    tiny_config good.toml
    sed 's/^lr = .*/lr = 2e-3/' good.toml >other.toml
    timeout 60 "$MPIEXEC" --oversubscribe --bind-to none -np 1 "$FSDP_TRAIN" good.toml \
      : -np 1 "$FSDP_TRAIN" other.toml >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_input_error "the ranks read different configs" \
      "optim.lr = 0.002 on rank 1, 0.001 on rank 0"
    if [ -e "$WORK/run" ]; then fail "a run whose ranks read different configs wrote $WORK/run"; fi
    ;;
  build_differs_between_ranks)
    # Rank 1 runs another build (a node with its own, older install): a copy of fsdp_train
    # whose build id (fsdp::build_id, one string in the executable) is patched to another of
    # the same length. Exit 2 naming both ids, before anything else is compared or written.
    id=$("$FSDP_TRAIN" --version | sed 's/^fsdp_train //')
    python3 - "$FSDP_TRAIN" "$WORK/fsdp_train_other" "$id" <<'PY' || fail "patching the copy failed"
import re, sys
src, dst, id_ = sys.argv[1], sys.argv[2], sys.argv[3]
other = re.sub(r"\+g[0-9a-f]{12}", "+g" + "f" * 12, id_)
if other == id_:
    other = id_.replace("+unknown", "+UNKNOWN")
data = open(src, "rb").read()
n = data.count(id_.encode() + b"\0")
if n < 1 or other == id_:
    sys.exit(f"{n} copies of {id_!r} in {src}")
open(dst, "wb").write(data.replace(id_.encode() + b"\0", other.encode() + b"\0"))
print("patched", n, "copies:", other)
PY
    chmod +x "$WORK/fsdp_train_other"
    other=$("$WORK/fsdp_train_other" --version | sed 's/^fsdp_train //')
    if [ "$other" = "$id" ]; then fail "the patched copy reports the same build id"; fi
    tiny_config good.toml
    timeout 60 "$MPIEXEC" --oversubscribe --bind-to none -np 1 "$FSDP_TRAIN" good.toml \
      : -np 1 "$WORK/fsdp_train_other" good.toml >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_input_error "the ranks run different fsdp_train builds: $other on rank 1" \
      ", $id on rank 0 (every node must run the same executable"
    if [ -e "$WORK/run" ]; then fail "a run whose ranks run different builds wrote $WORK/run"; fi
    ;;
  data_differs_between_ranks)
    # The same relative data.path is another file for rank 1 (its working directory: a node
    # reading a stale copy staged to local disk): exit 2 naming data.path and both counts.
    make_text_dir text
    mkdir a b
    run_prepare -o a/data.h5 text
    expect_rc 0
    run_prepare -o b/data.h5 text/a.txt
    expect_rc 0
    tiny_config good.toml
    set_data=(--set 'data.source="hdf5"' --set 'data.path="data.h5"')
    timeout 60 "$MPIEXEC" --oversubscribe --bind-to none \
      -np 1 --wdir "$WORK/a" "$FSDP_TRAIN" "$WORK/good.toml" "${set_data[@]}" \
      : -np 1 --wdir "$WORK/b" "$FSDP_TRAIN" "$WORK/good.toml" "${set_data[@]}" \
      >"$OUT" 2>"$ERR" </dev/null
    RC=$?
    expect_input_error "data.path (\"data.h5\"): train tokens: the ranks read different data" \
      "2850 on rank 1, 4750 on rank 0"
    if [ -e "$WORK/run" ]; then fail "a run whose ranks read different data wrote $WORK/run"; fi
    ;;
  init_from_checkpoint)
    # An fsdp_train checkpoint given as model.init_from (its step directory, run directory or
    # checkpoints directory) is named as such, with the way to a Hugging Face directory.
    tiny_config src.toml
    run_train src.toml --set train.max_steps=1 --set train.run_dir="$WORK/src_run"
    expect_rc 0
    tiny_config good.toml
    ck="$WORK/src_run/checkpoints"
    for dir in "$ck/step_00000001" "$WORK/src_run" "$ck"; do
      run_train good.toml --set model.init_from="$dir"
      expect_input_error "model.init_from" "\"$dir\" is an fsdp_train checkpoint" \
        "fsdp_merge $dir OUT"
      if [ -e "$WORK/run/metrics.jsonl" ]; then fail "a failed init_from run started training"; fi
    done
    ;;
  init_from_wrong_shape)
    # A real Hugging Face directory (1 step of the tiny model, merged by fsdp_merge) whose
    # transformer.wpe.weight header says [16,32] instead of [32,16] (same bytes).
    tiny_config src.toml
    run_train src.toml --set train.max_steps=1 --set train.run_dir="$WORK/src_run"
    expect_rc 0
    "$(dirname "$FSDP_TRAIN")/fsdp_merge" "$WORK/src_run/checkpoints/step_00000001" "$WORK/hf" \
      >/dev/null 2>&1 || { fail "fsdp_merge of the source run failed"; finish; }
    /usr/bin/python3 - "$WORK/hf/model.safetensors" <<'PY' || { fail "could not edit the header"; finish; }
import json, struct, sys
path = sys.argv[1]
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
header = json.loads(raw[8:8 + n])
header["transformer.wpe.weight"]["shape"].reverse()
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * (-len(text) % 8)
open(path, "wb").write(struct.pack("<Q", len(text)) + text + raw[8 + n:])
PY
    tiny_config good.toml
    run_train good.toml --set model.init_from="$WORK/hf"
    expect_input_error "$WORK/hf/model.safetensors" "transformer.wpe.weight" "[16,32]" "[32,16]"
    ;;
  *)
    echo "bad_input.sh: unknown case '$CASE'" >&2
    exit 2
    ;;
esac
finish
