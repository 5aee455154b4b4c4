// fsdp/checkpoint/merge.hpp: sharded checkpoint -> Hugging Face model directory.
//
// What `fsdp_merge STEP_DIR OUT_DIR` does, as a library function (so tests call it without
// a process): read every shard file of a step directory, rebuild each full parameter from
// the flat shards, rename and re-lay it as Hugging Face's GPT2LMHeadModel expects, and
// stream it into OUT_DIR/model.safetensors (fp32) with OUT_DIR/config.json beside it. The
// result loads with `GPT2LMHeadModel.from_pretrained(OUT_DIR)`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp::ckpt {

// How one of our parameters appears in a Hugging Face checkpoint.
struct HfTensor {
  std::string name;            // e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. [C, 3C]
  bool transpose = false;      // our [out, in] -> HF Conv1D [in, out]
};

// GPT-2 mapping. Our names (nn.Linear layout, weight [out, in]) -> GPT2LMHeadModel:
// every name gets the "transformer." prefix; the 2-D weights of attn.c_attn, attn.c_proj,
// mlp.c_fc and mlp.c_proj are transposed (HF's Conv1D stores [in, out]); wte/wpe,
// LayerNorms and biases are copied as they are. lm_head.weight is not produced (tied to
// wte; HF ties it on load). Returns nullopt for a name that is not a GPT-2 parameter.
std::optional<HfTensor> hf_gpt2_tensor(const std::string& name, const std::vector<int64_t>& shape);

// Our parameter names and shapes of a GPT-2 with this model config (model_config_json of
// CheckpointMeta): the set the merge requires, in HF state-dict order.
struct ModelParam {
  std::string name;
  std::vector<int64_t> shape;
};
std::vector<ModelParam> gpt2_param_specs(const nlohmann::json& model_config);

// config.json of a GPT2LMHeadModel for `model_config` (our model_config_json object):
// architectures, model_type, vocab_size, n_positions, n_ctx, n_embd, n_layer, n_head,
// n_inner null, activation_function "gelu_new", dropouts 0, layer_norm_epsilon,
// initializer_range 0.02, bos/eos_token_id = vocab_size - 1, tie_word_embeddings true,
// torch_dtype "float32".
nlohmann::json hf_gpt2_config(const nlohmann::json& model_config);

// Merges the checkpoint in `step_dir` into `out_dir` (created if missing):
// out_dir/model.safetensors and out_dir/config.json, each written under a temp name and
// renamed. Parameters are looked up by name wherever they live (any wrap policy), written
// in the order of gpt2_param_specs. Throws InputError (exit 2) naming the file on a
// missing/inconsistent shard file, an unsupported model_type, a missing, duplicated,
// unknown or wrongly-shaped parameter.
struct MergeStats {
  int64_t num_tensors = 0;
  int64_t num_elements = 0;
};
MergeStats merge_to_hf(const std::string& step_dir, const std::string& out_dir);

}  // namespace fsdp::ckpt
