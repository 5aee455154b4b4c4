#!/usr/bin/env bash
# The Llama job, end to end on real data with a real tokenizer: installs dependencies, builds
# the three programs it runs (Release), trains a SentencePiece BPE model (Llama 2's tokenizer
# family: byte fallback, unk 0 / bos 1 / eos 2) on the Debian `fortunes` corpus with spm_train,
# tokenizes the corpus with it into data/fortunes_llama.h5 (fsdp_prepare --tokenizer), trains
# the small GQA Llama of inputs/llama_fortunes.toml with FULL_SHARD on 4 MPI ranks, merges the
# final checkpoint into runs/llama_fortunes/hf/ (model.safetensors + a config.json that
# transformers' LlamaForCausalLM.from_pretrained loads; the tokenizer.model is copied beside
# it) and draws the run into runs/llama_fortunes/run.png.
# Extra arguments go to fsdp_train, e.g. --set train.max_steps=100.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
source tools/job_lib.sh
build_job_programs

mkdir -p data
vocab=$(sed -n 's/^vocab_size *= *\([0-9]*\).*/\1/p' inputs/llama_fortunes.toml)
if [[ ! -f data/fortunes_spm.model ]]; then
  # One text file of the corpus: the fortune files, not their .dat indexes nor the .u8 links.
  find /usr/share/games/fortunes -type f ! -name '*.dat' -print0 | sort -z | xargs -0 cat > data/fortunes.txt
  spm_train --input=data/fortunes.txt --model_prefix=data/fortunes_spm --vocab_size="$vocab" \
    --model_type=bpe --character_coverage=1.0 --byte_fallback=true \
    --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1 --max_sentence_length=16384 --minloglevel=1
fi
if [[ ! -f data/fortunes_llama.h5 ]]; then
  "$build/fsdp_prepare" --tokenizer data/fortunes_spm.model -o data/fortunes_llama.h5 /usr/share/games/fortunes
fi
train_and_merge run_llama_job inputs/llama_fortunes.toml runs/llama_fortunes "$@"
cp data/fortunes_spm.model runs/llama_fortunes/hf/tokenizer.model
