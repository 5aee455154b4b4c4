// fsdp/model/model.hpp: the Model interface and the registry of model families.
//
// Everything fsdp_train knows about one architecture lives in that model's own files and
// reaches the rest of the program through a ModelFamily (one per `model.type`): its [model]
// keys and their checks, its modules and wrap classes, its activation-memory table, its
// Hugging Face names, layouts and config.json, and a factory for the Model that runs
// forward/backward on a data::Batch. The trainer, config validation (through the ModelSchema
// each family is, config knowing no model), engine, memory plan, merge tool and init_from ask
// the family; none of them names GPT-2 or T5.
//
// Adding a model: write model/<name>.{hpp,cpp} with a ModelFamily and list it in
// model_families() (src/model/registry.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fsdp/backend/kernels.hpp"
#include "fsdp/config/config.hpp"
#include "fsdp/core/error.hpp"
#include "fsdp/data/batch.hpp"
#include "fsdp/fsdp/flat_param.hpp"
#include "fsdp/fsdp/module.hpp"

namespace fsdp {

// One training/evaluation model instance on a backend (activations, scratch, kernels).
class Model {
 public:
  virtual ~Model() = default;
  // Modules in forward order (name, wrap class, parameters); what the engine shards.
  virtual const std::vector<ModuleDecl>& modules() const = 0;
  // One micro-batch: forward, loss, backward. loss[0] (fp64 [1] device scalar) += the SUM of
  // the cross-entropy (nats) over the batch's targets that are not kIgnoreIndex; gradients
  // accumulate into hooks.grad() scaled by `grad_scale` (the trainer passes 1 / (global
  // number of target tokens of the step), times the loss scale under fp16).
  virtual void forward_backward(const data::Batch& batch, float grad_scale, ModuleHooks& hooks,
                                const TensorView& loss) = 0;
  // Forward and loss only (evaluation): loss[0] += the summed cross-entropy.
  virtual void forward_loss(const data::Batch& batch, ModuleHooks& hooks,
                            const TensorView& loss) = 0;
  // Mixture of experts: the largest load of one expert in one layer over the training
  // micro-batches since the last call, as a multiple of the balanced load (the (token, pick)
  // pairs routed to it / (all pairs / num_experts)): 1 when every expert gets as many,
  // num_experts / num_experts_per_tok when one gets every token (the tokens-per-expert
  // counts MoE trainers log, reduced to their worst ratio). Resets. 0 for a model without
  // experts.
  virtual double take_max_expert_load() { return 0.0; }
  // Auxiliary-loss-free load balancing (optim.moe_router_bias_update_rate; fsdp/optim/
  // router_bias.hpp): for each router with a selection bias (GLM-4.5's and DeepSeek-V3's
  // e_score_correction_bias), in layer order, the bias parameter's name and the (token, pick)
  // pairs the training forwards since the last call routed to each of its experts (fp64 [E];
  // a recompute under activation checkpointing does not count again). Resets. Empty for a
  // model without such routers.
  struct RouterLoad {
    std::string param;
    std::vector<double> counts;
  };
  virtual std::vector<RouterLoad> take_router_loads() { return {}; }
};

// How one of our parameters appears in a Hugging Face checkpoint.
struct HfTensor {
  std::string name;            // e.g. "transformer.h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;  // HF shape, e.g. [C, 3C]
  bool transpose = false;      // our [out, in] <-> HF Conv1D [in, out] (2-D only)
};

// Where a checkpoint may hold a tensor packed with others into one stored tensor (transformers
// 5's Mixture-of-Experts layout: every expert's gate and up projections in one
// mlp.experts.gate_up_proj [E, 2I, C], the down projections in mlp.experts.down_proj [E, C,
// I]): the packed tensor's name and shape, and the element (row-major) where the tensor's own
// contiguous elements start in it.
struct HfPacked {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;
};

// Where a checkpoint may hold a tensor quantized to MXFP4 (OCP Microscaling, 4-bit e2m1 values
// in blocks of 32 sharing an 8-bit power-of-two scale; the Hub's openai/gpt-oss-* experts):
// `blocks` U8 [experts, rows, cols / 32, 16] (two values a byte, the low nibble first) and
// `scales` U8 [experts, rows, cols / 32] (exponent + 127), the dequantized tensor [experts,
// rows, cols] (rows: the output features) being ours transposed: ours is [experts, cols, rows]
// (transformers' convert_moe_packed_tensors, then .transpose(1, 2)).
struct HfMxfp4 {
  std::string blocks, scales;
  int64_t experts = 0, rows = 0, cols = 0;
};

// A model family: the schema config reads (fsdp/config/config.hpp ModelSchema: type, keys,
// wrap classes, objectives, validate) and everything else the program asks of a model.
class ModelFamily : public ModelSchema {
 public:
  // The modules (names, wrap classes, parameter specs with their initialisation) of a model
  // with this config, without building one. Parameter names are ours (nn.Linear layout).
  virtual std::vector<ModuleDecl> modules(const ModelConfig& config) const = 0;
  // A model on `kernels` (and their runtime); activations stored in `activation_dtype` (the
  // mixed-precision param_dtype); `activation_checkpointing` per
  // fsdp.activation_checkpointing.
  virtual std::unique_ptr<Model> create(const ModelConfig& config, Kernels& kernels,
                                        DType activation_dtype,
                                        ActivationCheckpointing activation_checkpointing) const = 0;
  // Bytes of activations (saved for backward, their gradients and scratch) that create()'s
  // model allocates for a micro-batch of `batch_rows` rows of `shape`; the same table the
  // model allocates from.
  virtual int64_t activation_bytes(const ModelConfig& config, int64_t batch_rows,
                                   const data::BatchShape& shape, DType activation_dtype,
                                   ActivationCheckpointing activation_checkpointing) const = 0;
  // The model's own token vocabulary (config.json's vocab_size; the embedding's rows before
  // model.pad_vocab_multiple's padding): what the data's token ids must stay below.
  virtual int64_t vocab_size(const ModelConfig& config) const = 0;
  // Model FLOPs of training on one sample of `shape` (forward + backward, recomputation under
  // activation checkpointing not counted): 3 x the forward's matrix-multiply FLOPs at 2 per
  // multiply-add, i.e. every weight matrix times the tokens that pass through it plus
  // attention's Q K^T and P V (2 x T_query x T_key x width per layer each, causal masks not
  // discounted). For a decoder this is PaLM's 6N + 12 L H Q T per token (Chowdhery et al.
  // 2022, appendix B; nanoGPT's estimate_mfu), with N the weights of the matrix multiplies
  // (the LM head included, embedding lookups, biases and norms not). The numerator of MFU.
  virtual double train_flops_per_sample(const ModelConfig& config,
                                        const data::BatchShape& shape) const = 0;

  // Hugging Face layout of our parameter `name` of shape `shape`, or nullopt if the name is
  // not one of this family's parameters.
  virtual std::optional<HfTensor> hf_tensor(const ModelConfig& config, const std::string& name,
                                            const std::vector<int64_t>& shape) const = 0;
  // Extra names a published checkpoint may hold for a tensor we read as `hf_name` (e.g. the
  // "transformer." prefix GPT-2 checkpoints on the Hub omit). Default: none.
  virtual std::vector<std::string> hf_aliases(const std::string& hf_name) const { return {}; }
  // The packed form of the tensor `hf_name` (of `config`), when checkpoints may hold it so
  // (init_from reads it when neither the name nor an alias is stored). Default: none.
  virtual std::optional<HfPacked> hf_packed(const ModelConfig& config,
                                            const std::string& hf_name) const {
    return std::nullopt;
  }
  // The MXFP4 form of the tensor `hf_name` (of `config`), when checkpoints may hold it so
  // (init_from dequantizes it when neither the name, an alias nor a packed form is stored).
  // Default: none.
  virtual std::optional<HfMxfp4> hf_mxfp4(const ModelConfig& config,
                                          const std::string& hf_name) const {
    return std::nullopt;
  }
  // The Hugging Face config.json for `config` (architectures, model_type, sizes, ...).
  virtual nlohmann::json hf_config(const ModelConfig& config) const = 0;
  // The form of `config` two configs of the same model compare equal in (init_from's check of
  // config.json against [model]): e.g. Llama's derived sizes spelled 0 (HF's None) or
  // explicitly. Default: `config` itself.
  virtual ModelConfig canonical(const ModelConfig& config) const { return config; }
  // Our ModelConfig from a Hugging Face config.json (init_from). Throws InputError naming
  // `origin` and the field on a missing or unsupported field.
  virtual ModelConfig from_hf_config(const nlohmann::json& hf, const std::string& origin) const = 0;
  // The config.json model_types from_hf_config reads: type() (and Gemma 3's "gemma3", the
  // multimodal Gemma3ForConditionalGeneration whose text_config holds the decoder).
  virtual std::vector<std::string> hf_model_types() const { return {type()}; }
};

// Every registered family, in a fixed order.
const std::vector<const ModelFamily*>& model_families();
// The same as config's schemas (what parse_config takes).
const ModelSchemas& model_schemas();
// The family of `type`; throws InputError `model.type: unknown value "x" (expected one of
// gpt2, t5, llama, mistral, qwen2, qwen3)` (config's model_schema).
const ModelFamily& model_family(const std::string& type);
// The family whose hf_model_types() has `model_type` (a config.json's); throws InputError
// `"model_type" "x" is not supported (expected one of gpt2, t5, ...)` when none has.
const ModelFamily& model_family_of_hf(const std::string& model_type);
// The family's [model] defaults (ModelConfig::of); throws as model_family.
ModelConfig model_defaults(const std::string& type);

// load_config / parse_config (fsdp/config/config.hpp) over the registered families: what
// fsdp_train and the tests call.
Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides);
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides);
void check_config(const Config& config);
// The products a valid config forms, checked before anything is allocated or printed
// (load_config, parse_config and check_config above run it): the parameter count and the
// tokens per step at most 2^53 (exact in doubles), a micro-batch's activation bytes within
// int64. Throws InputError naming the keys (their values included) on the first too large.
void check_sizes(const Config& config);

// The [model] section as checkpoints and merge carry it: {"model_type": type, key: value...,
// "pad_vocab_multiple": m} (the family's keys, then the vocabulary padding the stored
// tensors have; init_from is not carried).
nlohmann::json model_config_json(const ModelConfig& config);
// Inverse of model_config_json; throws InputError naming `origin` on an unknown model_type or
// a key of the wrong type. A JSON without "pad_vocab_multiple" (written before it existed,
// when tensors were never padded) reads as 1, and one without a family key (written by a
// build before that key existed, e.g. Phi-3's partial_rotary_factor) reads as the key's
// default, which is what that build computed.
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& origin);

}  // namespace fsdp
