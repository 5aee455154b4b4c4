// fsdp/checkpoint/init_from.hpp: model.init_from, fine-tuning from published Hugging Face
// weights without any rank holding the whole model.
//
// A Hugging Face model directory (what `save_pretrained` writes, or fsdp_merge) holds
// config.json and model.safetensors (or a sharded model.safetensors.index.json). Each rank
// fills only its own fp32 shard of each FSDP unit's FlatParameter, reading only the bytes of
// the elements that shard owns (Accelerate's cpu_ram_efficient_loading idea, done per
// shard rather than "rank 0 loads, then broadcasts"): about 1/N of the model per rank for N
// shards. Names, shapes and transposes come from the model family (ModelFamily::hf_tensor,
// hf_aliases), as for fsdp_merge, so what fsdp_merge writes loads back bit for bit.
//
// Checks (all fsdp::InputError, exit 2, one line naming the file, key or tensor). Everything
// except the data reads and the finiteness check depends only on config.json and the
// safetensors headers, which every rank reads, so every rank fails the same way:
//  * DIR is a directory; DIR/config.json exists, is JSON, and family.from_hf_config of it
//    equals the configured [model] keys: "<DIR>/config.json: n_embd = 32 but model.n_embd =
//    16 (model.init_from = "<DIR>")";
//  * the weights open (SafetensorsCheckpoint: every header check of the hardened reader);
//  * every tensor the model expects is present (under its HF name or one of the family's
//    aliases, e.g. GPT-2 Hub files without "transformer."), has the HF shape
//    (hf_tensor's shape, i.e. the transpose of ours for GPT-2 Conv1D weights) and a float
//    dtype (F32, F16, BF16, F64; converted to fp32 as HF's from_pretrained does with
//    torch_dtype float32).
//  * every value this rank reads is finite (checked on the values read, after the conversion
//    to fp32; no extra read): "<file>: tensor '<name>': element 17 [0,17] is nan (the gpt2
//    parameter h.0.attn.c_attn.weight): the weights hold a non-finite value (model.init_from =
//    "<DIR>")" (element: row-major index in the file's shape, then as an index; an F64 value
//    beyond fp32's range is named as such). This check depends on the rank's slice: only the
//    ranks whose shard holds the value fail (the trainer's collective_guard stops the others).
// Vocabulary padding (model.pad_vocab_multiple, ParamSpec::vocab_rows): the files hold the
// model's own vocab_size rows (HF shape [vocab_size, ...]); they fill the first rows of our
// padded tensor and the pad rows are set to 0 (nothing is read for them).
// Tensors in the files that the model does not use are NOT an error: like HF from_pretrained
// ("Some weights of the model checkpoint were not used"), they are returned in `unused` for
// the trainer to warn about on rank 0. Published GPT-2 files hold such tensors (the
// h.<i>.attn.bias causal-mask buffers HF lists in _keys_to_ignore_on_load_unexpected), so
// failing on them would reject the real checkpoints. The other names of an expected tensor
// (T5's encoder/decoder.embed_tokens.weight beside shared.weight) and lm_head.weight of a
// model with tied embeddings are expected duplicates and not listed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/config/config.hpp"
#include "fsdp/fsdp/flat_param.hpp"

namespace fsdp::ckpt {

struct InitFromResult {
  uint64_t bytes_read = 0;          // payload bytes this rank read (headers not counted)
  int64_t num_tensors = 0;          // tensors the model expects (all checked on every rank)
  int64_t tensors_read = 0;         // of those, how many this rank read elements of
  int64_t model_bytes = 0;          // fp32 bytes of all the model's parameters (4 x numel,
                                    // vocabulary padding rows not counted: what the files hold)
  std::vector<std::string> unused;  // tensors in the files the model does not use (escaped)
};

// Reads and checks DIR/config.json against `config` (see above); returns nothing, throws
// InputError naming "<DIR>/config.json" and the first differing key in the family's key
// order.
void check_hf_config(const std::string& dir, const ModelConfig& config);

// The [model] section that fine-tunes from the Hugging Face model directory `dir`
// (fsdp_train --model-from): DIR/config.json read by the family its model_type names (HF's
// "gemma3", Gemma 3 4B+'s multimodal config: "gemma3_text", its text_config), in canonical
// form (what check_hf_config compares), with init_from = dir; the other [model] keys
// (pad_vocab_multiple, the fused head) at their defaults. Throws InputError as
// check_hf_config, and naming config.json when its model_type is missing or not a type of
// the registry.
ModelConfig hf_model_config(const std::string& dir);

// Fills this rank's fp32 shards from the Hugging Face directory `dir`.
//  layouts:     every FSDP unit's FlatParamLayout (the engine's layouts(); all ranks pass the
//               same), in unit order; parameter names are ours (ModelFamily::modules).
//  shard_index: this rank's shard, 0 <= shard_index < layouts[u].num_shards.
//  shards[u]:   host buffer of layouts[u].shard_numel floats: flat elements
//               [shard_begin(shard_index), shard_end(shard_index)) of unit u. Every element is
//               written: parameters' values, 0 for the padding past the unit's numel and for
//               vocabulary padding rows.
// Reads only the elements each shard owns: one contiguous range per (parameter, shard) for
// a tensor stored as we lay it out; for a transposed 2-D tensor (HF [in, out], ours
// [out, in]) one contiguous segment per HF row, so bytes read equal the shard's share
// (4 bytes x owned parameter elements for F32 files, 2 for F16/BF16).
// Throws InputError as listed in the file comment; fsdp::Error on an I/O error or when a
// parameter has no Hugging Face name in its family (a bug, not input).
InitFromResult load_hf_shards(const std::string& dir, const ModelConfig& config,
                              const std::vector<FlatParamLayout>& layouts, int64_t shard_index,
                              const std::vector<float*>& shards);

}  // namespace fsdp::ckpt
