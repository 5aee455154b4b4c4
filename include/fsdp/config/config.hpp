// fsdp/config/config.hpp: the typed, validated run configuration.
//
// Loaded from a TOML file (toml++) with `--set section.key=value` overrides applied on top.
// Every key is documented, with its default, in docs/config.md; names follow PyTorch FSDP /
// Accelerate (fsdp.sharding_strategy, fsdp.auto_wrap_policy,
// fsdp.transformer_layer_cls_to_wrap, ...); the [model] keys are the model family's own,
// named as its Hugging Face config names them (GPT2Config's n_layer, T5Config's d_model, ...).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fsdp/core/dtype.hpp"
#include "fsdp/core/enum_names.hpp"
#include "fsdp/core/error.hpp"

namespace fsdp {

// The one wording of an integer key below its minimum: "<v> is out of range (expected an
// integer >= <lo>)", the `what` of fail(key, what).
inline std::string below_minimum(int64_t v, int64_t lo) {
  return std::to_string(v) + " is out of range (expected an integer >= " + std::to_string(lo) +
         ")";
}
// Throws fail(key, below_minimum(v, lo)) when v < lo. `fail` builds the exception: config
// validation's prefixes where the key's value came from, a model family's is its KeyFail, code
// that checks a Config built in code passes one that makes an InputError.
template <class Fail>
void require_at_least(const Fail& fail, const std::string& key, int64_t v, int64_t lo) {
  if (v < lo) throw fail(key, below_minimum(v, lo));
}

// A key's admissible numbers: config validation checks every ranged key (the key table's and
// the model families' own, ModelKey::range) with one message, "<value> is out of range
// (expected <text()>)". Bounds are open (<) or closed (<=); `var` names the value in a
// two-sided text ("0 < lr <= 10"); `note` follows the bound. A default KeyRange is unbounded.
struct KeyRange {
  enum Bound : char { none, open, closed };
  bool integer = false;
  Bound lo_bound = none, hi_bound = none;
  double lo = 0, hi = 0;
  const char* var = "x";
  const char* note = "";

  constexpr bool bounded() const { return lo_bound != none || hi_bound != none; }
  constexpr bool contains(double v) const {
    const bool above = lo_bound == none || (lo_bound == open ? v > lo : v >= lo);
    const bool below = hi_bound == none || (hi_bound == open ? v < hi : v <= hi);
    return above && below;  // false for NaN with any bound
  }
  // The bounds around `name`: ">= 1", "> 0", "0 < lr <= 10".
  std::string bounds(const char* name) const;
  // The message's: "an integer >= 1", "0 < lr <= 10", "an integer 1 <= x <= 65536; 1 = ...".
  std::string text() const;
  // The type column of docs/config.md: "integer >= 1", "integer, 1 <= x <= 65536",
  // "float > 0", "float, 0 < x < 1".
  std::string doc_type() const;

  // Integers >= lo.
  static constexpr KeyRange at_least(int64_t lo) {
    return {true, closed, none, static_cast<double>(lo), 0, "x", ""};
  }
  // Integers in [lo, hi].
  static constexpr KeyRange between(int64_t lo, int64_t hi) {
    return {true, closed, closed, static_cast<double>(lo), static_cast<double>(hi), "x", ""};
  }
  // A model family's size keys (widths, heads, vocabulary, positions): integers in
  // [lo, kMaxModelSize]; its layer counts: [1, kMaxModelLayers]. The bounds keep every product
  // fsdp_train forms of them (parameter counts, activation bytes) within int64 and every
  // declaration loop finite; real models are far inside them (Llama 3.1 405B: 126 layers,
  // width 16384, vocabulary 128256, 131072 positions).
  static constexpr int64_t kMaxModelSize = int64_t{1} << 24;
  static constexpr int64_t kMaxModelLayers = 10000;
  static constexpr KeyRange size(int64_t lo = 1) { return between(lo, kMaxModelSize); }
  static constexpr KeyRange layers() { return between(1, kMaxModelLayers); }
  // Floats in (lo, inf).
  static constexpr KeyRange above(double lo) { return {false, open, none, lo, 0, "x", ""}; }
  // Floats in [lo, inf).
  static constexpr KeyRange nonnegative() { return {false, closed, none, 0, 0, "x", ""}; }
  // Floats in (0, 1).
  static constexpr KeyRange open_unit() { return {false, open, open, 0, 1, "x", ""}; }
  // Floats in [0, 1).
  static constexpr KeyRange unit_interval() { return {false, closed, open, 0, 1, "x", ""}; }
  // Floats in (0, 1] (a fraction of something, all of it included).
  static constexpr KeyRange unit_above_zero() { return {false, open, closed, 0, 1, "x", ""}; }
};

// Each enum's spellings are its EnumNames table (fsdp/core/enum_names.hpp), read by to_string,
// parsing, the "expected one of" messages, --list-keys and docs/config.md's checks; the
// table's order is the order they list the values in.

enum class ShardingStrategy { FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD, HYBRID_SHARD_ZERO2 };
// The torch.distributed.fsdp.ShardingStrategy names.
template <>
struct EnumNames<ShardingStrategy> {
  static constexpr EnumName<ShardingStrategy> table[] = {
      {ShardingStrategy::FULL_SHARD, "FULL_SHARD"},
      {ShardingStrategy::SHARD_GRAD_OP, "SHARD_GRAD_OP"},
      {ShardingStrategy::NO_SHARD, "NO_SHARD"},
      {ShardingStrategy::HYBRID_SHARD, "HYBRID_SHARD"},
      {ShardingStrategy::HYBRID_SHARD_ZERO2, "HYBRID_SHARD_ZERO2"}};
};
// Inverse of to_string (exact, case-sensitive). Throws fsdp::InputError (exit 2)
// `fsdp.sharding_strategy: unknown value "X" (expected one of FULL_SHARD, ...)`.
ShardingStrategy parse_sharding_strategy(const std::string& name);

// torch.distributed.fsdp.BackwardPrefetch; NO_PREFETCH is PyTorch's `None`.
enum class BackwardPrefetch { BACKWARD_PRE, BACKWARD_POST, NO_PREFETCH };
template <>
struct EnumNames<BackwardPrefetch> {
  static constexpr EnumName<BackwardPrefetch> table[] = {
      {BackwardPrefetch::BACKWARD_PRE, "BACKWARD_PRE"},
      {BackwardPrefetch::BACKWARD_POST, "BACKWARD_POST"},
      {BackwardPrefetch::NO_PREFETCH, "NO_PREFETCH"}};
};
// Accelerate's fsdp_auto_wrap_policy values fsdp_train implements.
enum class AutoWrapPolicy { TRANSFORMER_BASED_WRAP, NO_WRAP };
template <>
struct EnumNames<AutoWrapPolicy> {
  static constexpr EnumName<AutoWrapPolicy> table[] = {
      {AutoWrapPolicy::TRANSFORMER_BASED_WRAP, "TRANSFORMER_BASED_WRAP"},
      {AutoWrapPolicy::NO_WRAP, "NO_WRAP"}};
};
// Where the model runs: "auto" = CUDA when fsdp_train was built with it and a GPU is visible.
enum class DeviceKind { auto_, cpu, cuda };
template <>
struct EnumNames<DeviceKind> {
  static constexpr EnumName<DeviceKind> table[] = {
      {DeviceKind::auto_, "auto"}, {DeviceKind::cpu, "cpu"}, {DeviceKind::cuda, "cuda"}};
};
// train.cuda_graphs: capture the model's kernels between the engine's hooks as graphs and
// replay them (fsdp/model/graphed_kernels.hpp). "auto" = off for now: no GPU has yet run the
// graphed == eager test (docs/gpu.md); "on" graphs on CUDA and, on the CPU, replays the
// recorded calls (the twin the tests use).
enum class CudaGraphs { auto_, on, off };
template <>
struct EnumNames<CudaGraphs> {
  static constexpr EnumName<CudaGraphs> table[] = {
      {CudaGraphs::auto_, "auto"}, {CudaGraphs::on, "on"}, {CudaGraphs::off, "off"}};
};
// The communicator of the mesh: "auto" = NCCL when the CUDA backend runs, else MPI.
enum class CommBackend { auto_, nccl, mpi };
template <>
struct EnumNames<CommBackend> {
  static constexpr EnumName<CommBackend> table[] = {
      {CommBackend::auto_, "auto"}, {CommBackend::nccl, "nccl"}, {CommBackend::mpi, "mpi"}};
};
// optim.name. Header-only, as every table: the optimizer (optim layer) names itself in
// messages without the config library.
enum class OptimizerKind { adamw, sgd };
template <>
struct EnumNames<OptimizerKind> {
  static constexpr EnumName<OptimizerKind> table[] = {{OptimizerKind::adamw, "adamw"},
                                                      {OptimizerKind::sgd, "sgd"}};
};

// The learning-rate schedule after warmup (optim.lr_scheduler_type), named as Hugging Face
// TrainingArguments.lr_scheduler_type names them (fsdp/optim/optimizer.hpp learning_rate).
enum class LrSchedulerType { cosine, linear, constant_with_warmup, warmup_stable_decay };
template <>
struct EnumNames<LrSchedulerType> {
  static constexpr EnumName<LrSchedulerType> table[] = {
      {LrSchedulerType::cosine, "cosine"},
      {LrSchedulerType::linear, "linear"},
      {LrSchedulerType::constant_with_warmup, "constant_with_warmup"},
      {LrSchedulerType::warmup_stable_decay, "warmup_stable_decay"}};
};
// The shape of warmup_stable_decay's decay (HF get_wsd_schedule's decay_type).
enum class DecayType { cosine, linear, one_minus_sqrt };
template <>
struct EnumNames<DecayType> {
  static constexpr EnumName<DecayType> table[] = {{DecayType::cosine, "cosine"},
                                                  {DecayType::linear, "linear"},
                                                  {DecayType::one_minus_sqrt, "1-sqrt"}};
};

// The [model] section: `type` picks a model family from the registry
// (fsdp/model/model.hpp: "gpt2", "t5"); every other key belongs to that family, is named as
// its Hugging Face config names it, and is declared with its default by the family alone
// (ModelSchema::keys). A value keeps the type of the declared default.
// (An array of numbers: a list attribute such as Phi-3's rope_scaling.short_factor.)
using ModelValue = std::variant<int64_t, double, bool, std::string, std::vector<double>>;
// "an integer", "a number", "a boolean", "a string" or "an array of numbers": the type of
// `v`, for messages.
const char* value_type_name(const ModelValue& v);
// `v` (config.json or a checkpoint's model config) as a value of the type of `like`, in
// `*out`; false when it is of another type (an integer where a number is wanted is one).
bool model_value_from_json(const nlohmann::json& v, const ModelValue& like, ModelValue* out);

// A [model] key of a family: its name (the Hugging Face config name), its default, whose
// variant alternative is the key's type (int64_t, double, bool, std::string or an array of
// numbers), and one line
// of doc (the first sentence of its row in docs/config.md).
// `range` bounds a number key (validation, --list-keys and docs/config.md read it); `choices`
// lists the values a string key accepts (empty: any); `hf_name` is the attribute of the
// family's Hugging Face config class (hf_config_class()) the key is, "" for none.
struct ModelKey {
  std::string name;
  ModelValue default_value;
  std::string doc;
  KeyRange range = {};
  std::vector<std::string> choices = {};
  std::string hf_name = {};
};

// "" when `v` lies in `range` (numbers) and among `choices` (strings; empty: any), else what
// is wrong with it: "<v> is out of range (expected <range.text()>)" or "unknown value \"v\"
// (expected one of a, b)". The one wording of a model key's value check: config validation
// (ModelKey) and a family's ModelArgs (struct built in code, config.json in) both use it.
std::string value_violation(const KeyRange& range, const std::vector<std::string>& choices,
                            const ModelValue& v);

// Builds the one-line error for a key: fail("model.n_embd", "100 is not divisible ...")
// returns an input Error (exit 2) prefixed with where that key's value came from.
using KeyFail = std::function<Error(const std::string& key, const std::string& what)>;

class ModelSchema;

// model.pad_vocab_multiple's default: Megatron-LM's --make-vocab-size-divisible-by (128), so
// the LM head's GEMM dimension is a multiple of 8 (16-bit tensor-core alignment) and of the
// usual tile widths (GPT-2's 50257 -> 50304).
inline constexpr int64_t kDefaultPadVocabMultiple = 128;
// Largest model.pad_vocab_multiple accepted (a larger one only adds padding rows).
inline constexpr int64_t kMaxPadVocabMultiple = 65536;
// vocab_size rounded up to a multiple of `multiple` (>= 1): the rows of the token embedding
// and LM head in training (Megatron-LM's padded_vocab_size); vocab_size when multiple == 1.
inline int64_t padded_vocab_size(int64_t vocab_size, int64_t multiple) {
  return multiple <= 1 ? vocab_size : (vocab_size + multiple - 1) / multiple * multiple;
}

struct ModelConfig {
  std::string type;                            // a registered model.type
  // Every key of the family, in its declaration order (the order to_toml prints them),
  // defaults filled in.
  std::vector<std::pair<std::string, ModelValue>> values;
  // Fine-tuning start: a Hugging Face model directory (model.safetensors or a sharded
  // model.safetensors.index.json, plus config.json) whose weights replace the initialisation;
  // each rank reads only its own shard's byte ranges. "" = random initialisation.
  std::string init_from;
  // model.pad_vocab_multiple: the token embedding and LM head hold
  // padded_vocab_size(vocab_size, pad_vocab_multiple) rows in training, so every GEMM of the
  // LM head has aligned dimensions (Megatron-LM's --make-vocab-size-divisible-by). The pad
  // rows are zero, take no part in the softmax (zero gradient) and never leave fsdp_train:
  // merges and init_from see the model's own vocab_size. Integer >= 1; 1 = no padding.
  int64_t pad_vocab_multiple = kDefaultPadVocabMultiple;
  // model.fused_linear_cross_entropy (Liger-Kernel's fused_linear_cross_entropy): the causal
  // LMs (GPT-2, Llama) run the LM head and the cross-entropy over chunks of rows inside the
  // head's backward, so no [tokens, vocabulary] logits are kept (fsdp/model/causal_lm.hpp).
  // An execution knob, as fsdp.activation_checkpointing: the same GEMMs, the loss and
  // gradients up to the order of the LM-head weight gradient's sums; not carried by
  // checkpoints or config.json.
  bool fused_linear_cross_entropy = false;
  // model.fused_linear_cross_entropy_chunk_rows: rows (tokens) per chunk; 0 = auto (a chunk's
  // logits about the size of the [tokens, hidden] activations, Liger's heuristic, at least
  // 256 rows).
  int64_t fused_linear_cross_entropy_chunk_rows = 0;

  // The family's defaults: type, every key at its default (model_defaults(type) in
  // fsdp/model/model.hpp looks the family up by name).
  static ModelConfig of(const ModelSchema& schema);
  // The value of a declared key, or null.
  const ModelValue* find(const std::string& key) const;
  // Typed reads of a declared key; throw fsdp::Error if missing or of another type.
  int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool boolean(const std::string& key) const;
  const std::string& string(const std::string& key) const;
  // Sets a declared key; throws fsdp::Error if undeclared or of another type.
  void set(const std::string& key, ModelValue value);
  friend bool operator==(const ModelConfig&, const ModelConfig&) = default;
};

// What a sample is and what the loss is over (data.objective).
//  causal_lm: next-token prediction over windows of a token stream (GPT-2);
//  seq2seq: (input, target) example pairs (T5), loss over the target tokens;
//  span_corruption: T5's pre-training objective over windows of a token stream.
// What a sample is (docs/data.md "Objectives"): causal_lm windows of a token stream; seq2seq
// (input, target) pairs (T5); span_corruption (T5 pre-training); sft: a decoder's
// prompt-completion pairs with the loss on the completion only (TRL SFTTrainer's
// completion_only_loss).
enum class Objective { causal_lm, seq2seq, span_corruption, sft };
template <>
struct EnumNames<Objective> {
  static constexpr EnumName<Objective> table[] = {{Objective::causal_lm, "causal_lm"},
                                                  {Objective::seq2seq, "seq2seq"},
                                                  {Objective::span_corruption, "span_corruption"},
                                                  {Objective::sft, "sft"}};
};

// Where the tokens come from (data.source): an HDF5 file (data.path) or random tokens
// (benchmarks, tests). Parsed once from its TOML spelling; an unknown value is an InputError
// at parse time.
enum class DataSource { hdf5, synthetic };
template <>
struct EnumNames<DataSource> {
  static constexpr EnumName<DataSource> table[] = {{DataSource::hdf5, "hdf5"},
                                                   {DataSource::synthetic, "synthetic"}};
};

// What a token of a causal_lm row attends to (data.attn_mask_type; torchtitan's
// attn_mask_type): `causal`, every earlier token of its row; `block_causal` (document
// masking), only the earlier tokens of its own document, documents ending at the EOS token
// (data.eos_token_id). With block_causal every causal_lm Batch carries position_ids
// (fsdp/data/batch.hpp), from which the model builds the mask.
enum class AttnMaskType { causal, block_causal };
template <>
struct EnumNames<AttnMaskType> {
  static constexpr EnumName<AttnMaskType> table[] = {{AttnMaskType::causal, "causal"},
                                                     {AttnMaskType::block_causal, "block_causal"}};
};

struct DataConfig {
  DataSource source = DataSource::hdf5;
  std::string path;                   // HDF5 token file; required when source == hdf5
  // A data mixture instead of `path` (docs/data.md "Data mixtures"): HDF5 token files, each
  // sampled with its weight (> 0; empty = in proportion to its training samples).
  std::vector<std::string> paths;
  std::vector<double> weights;
  Objective objective = Objective::causal_lm;
  int64_t seq_len = 128;              // causal_lm / span_corruption: stream tokens per sample
  int64_t max_input_len = 128;        // seq2seq: encoder tokens per row (longer ones truncated)
  int64_t max_target_len = 32;        // seq2seq: target tokens per row (longer ones truncated)
  double noise_density = 0.15;        // span_corruption: fraction of tokens masked
  double mean_noise_span_length = 3.0;  // span_corruption: mean masked span length
  // causal, or block_causal (document masking; docs/data.md "Document masking"): causal_lm,
  // or sft with packing. block_causal with another objective is an InputError naming the key.
  AttnMaskType attn_mask_type = AttnMaskType::causal;
  // With block_causal: the model's RoPE positions are the batch's position_ids (restarting
  // at 0 at each document, Megatron-LM's --reset-position-ids) instead of 0 .. L-1. true
  // without block_causal is an InputError naming the key.
  bool reset_position_ids = false;
  // The token that ends a document for block_causal; -1: the data file's root attribute
  // eos_id (fsdp_prepare --tokenizer writes it). Must be below model.vocab_size.
  int64_t eos_token_id = -1;
  // With block_causal: no loss on the target after each EOS (a document's first token,
  // predicted across the boundary); Megatron-LM's --eod-mask-loss.
  bool eod_mask_loss = false;
  // sft: several examples a row (best-fit decreasing), each attending only to itself (TRL's
  // SFTConfig packing with padding_free); needs block_causal. false: one example a row.
  bool packing = false;
  friend bool operator==(const DataConfig&, const DataConfig&) = default;
};

struct TrainConfig {
  int64_t global_batch_size = 32;     // sequences per step over all data-parallel ranks
  int64_t micro_batch_size = 0;       // sequences per rank per forward/backward; 0 = all of them
  int64_t max_steps = 1000;
  uint64_t seed = 1234;
  std::string run_dir = "runs/default";
  int64_t log_every = 1;              // steps between log lines
  int64_t num_threads = 0;            // CPU threads per rank; 0 = cores / local ranks
  DeviceKind device = DeviceKind::auto_;  // "auto" | "cpu" | "cuda"
  CudaGraphs cuda_graphs = CudaGraphs::auto_;  // "auto" | "on" | "off"
  bool skip_nonfinite = false;        // a step with non-finite loss/grad norm: skip (true) or stop
  bool check_memory = true;           // refuse a memory plan larger than the rank's memory
  double peak_flops = 0;              // FLOP/s per rank for MFU; 0 = the device's known peak
  // [first, last]: 1-based steps (inclusive) the profiler records into
  // run_dir/profile/rank_N.trace.json (fsdp/core/profiler.hpp); empty = off. --profile F:L.
  std::vector<int64_t> profile_steps;
  friend bool operator==(const TrainConfig&, const TrainConfig&) = default;
};

// Sequences per forward/backward on each rank of a world of `world_size`: train.micro_batch_size,
// or (0) the whole per-rank batch, train.global_batch_size / world_size (the trainer checks
// both divide). The trainer's gradient accumulation and the memory plan both read it.
inline int64_t micro_batch_size(const TrainConfig& t, int world_size) {
  return t.micro_batch_size > 0 ? t.micro_batch_size
                                : t.global_batch_size / std::max(1, world_size);
}

// Largest optim.lr accepted. No published recipe trains a transformer above lr = 1 (AdamW
// runs use 1e-5..1e-2, SGD on LAMB-style schedules at most a few); a larger value is a typo
// (1e3 for 1e-3) that would turn the weights to inf within a few steps.
inline constexpr double kMaxLearningRate = 10.0;

struct OptimConfig {
  OptimizerKind name = OptimizerKind::adamw;  // "adamw" | "sgd"
  double lr = 1e-3;                   // peak learning rate
  double min_lr = 1e-4;               // floor of the decay
  LrSchedulerType lr_scheduler_type = LrSchedulerType::cosine;
  int64_t warmup_steps = 100;         // linear warmup from 0
  int64_t decay_steps = 0;            // step the decay ends at, warmup included; 0 = train.max_steps
  int64_t num_decay_steps = 0;        // warmup_stable_decay: steps of the decay, ending at decay_steps
  DecayType decay_type = DecayType::cosine;  // warmup_stable_decay's decay
  double weight_decay = 0.1;
  double grad_clip = 1.0;             // max global L2 norm; 0 disables clipping
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.9;              // sgd only
  // Auxiliary-loss-free load balancing (DeepSeek-V3): each step every router selection bias
  // moves by this toward balance; 0 = off (fsdp/optim/router_bias.hpp)
  double moe_router_bias_update_rate = 0.0;
  friend bool operator==(const OptimConfig&, const OptimConfig&) = default;
};

// Which transformer blocks recompute their internals in backward instead of keeping them
// from forward (activation checkpointing): none, every block (Accelerate's
// fsdp_activation_checkpointing), or the first N in forward order (Megatron-LM's
// recompute_method "block"). Recomputing runs the same kernels on the same inputs, so
// results do not depend on it; only memory (each recomputed block's internals share one set
// of buffers) and time (one more forward of each recomputed block) do.
class ActivationCheckpointing {
 public:
  constexpr ActivationCheckpointing() = default;
  // Every block (true) or none (false).
  constexpr ActivationCheckpointing(bool every_block)  // NOLINT: a bool is the common case
      : first_(every_block ? kEvery : 0) {}
  // No integer converts to the bool above.
  template <class T>
  ActivationCheckpointing(T) = delete;
  // The first n blocks (n >= 0).
  static constexpr ActivationCheckpointing first_blocks(int64_t n) {
    ActivationCheckpointing a;
    a.first_ = n < 0 ? 0 : n;
    return a;
  }
  // Whether block `block` (0-based, forward order) recomputes.
  constexpr bool recomputes(int64_t block) const { return block < first_; }
  // How many of a model's `num_blocks` blocks recompute.
  constexpr int64_t recomputed(int64_t num_blocks) const {
    return first_ < num_blocks ? first_ : num_blocks;
  }
  constexpr bool any() const { return first_ > 0; }
  // Sets of per-block internals a model of `num_blocks` blocks keeps: set 0 is shared by the
  // blocks that recompute (each refills it in its backward) and the first block after them
  // (its forward writes set 0 last, and its backward reads it before any recompute does);
  // every later block has its own. So recomputing n < num_blocks blocks saves n sets.
  constexpr int64_t buffer_sets(int64_t num_blocks) const {
    const int64_t n = recomputed(num_blocks);
    if (n == 0) return num_blocks;
    return num_blocks - n > 1 ? num_blocks - n : 1;
  }
  // Block `block`'s set among them.
  constexpr int64_t buffer_set(int64_t block) const {
    if (first_ == 0) return block;
    return block <= first_ ? 0 : block - first_;
  }
  friend constexpr bool operator==(ActivationCheckpointing, ActivationCheckpointing) = default;

 private:
  static constexpr int64_t kEvery = INT64_MAX;
  int64_t first_ = 0;
};

struct FsdpConfig {
  ShardingStrategy sharding_strategy = ShardingStrategy::FULL_SHARD;
  AutoWrapPolicy auto_wrap_policy = AutoWrapPolicy::TRANSFORMER_BASED_WRAP;  // NO_WRAP: one root unit
  std::vector<std::string> transformer_layer_cls_to_wrap;  // unset: the model's wrap classes
  BackwardPrefetch backward_prefetch = BackwardPrefetch::BACKWARD_PRE;
  bool forward_prefetch = false;      // all-gather the next unit before this unit's forward
  bool limit_all_gathers = true;      // at most two units (besides the root) unsharded at once
  // Accelerate's fsdp_activation_checkpointing: keep each wrapped block's input only and
  // recompute its internals in backward; recompute_num_layers limits it to the first blocks.
  bool activation_checkpointing = false;
  // Megatron-LM's recompute_num_layers with recompute_method "block": with
  // activation_checkpointing, only the first N transformer blocks in forward order (T5: the
  // encoder's, then the decoder's) recompute; the others keep their internals from forward.
  // -1: every block. Each family's validate refuses N above its block count.
  int64_t recompute_num_layers = -1;
  // PyTorch's CPUOffload(offload_params=True), Accelerate's fsdp_offload_params (accepted as
  // the alias fsdp.offload_params): fp32 shards, gradient shards and optimizer state in host
  // memory, the optimizer step on the host's cores (fsdp/fsdp/engine.hpp).
  bool cpu_offload = false;
  // DeepSpeed ZeRO's offload_optimizer without offload_param: the fp32 master shards, their
  // gradients and the optimizer state in host memory as with cpu_offload, but each unit's
  // param_dtype shard stays resident on the device between steps, refreshed once per
  // optimizer step (one upload per step instead of one per unshard). cpu_offload wins when
  // both are set.
  bool offload_optimizer = false;
  // DeepSpeed's offload_optimizer.ratio (ZeRO-Offload++ "Twin-Flow"): with offload_optimizer,
  // the fraction of the parameters whose master shards, gradients and optimizer state are
  // offloaded; the units in forward order up to the rest (1 - ratio of the parameters) keep
  // theirs on the device and step there, as without offload (fsdp/fsdp/engine.hpp). 1: all
  // offloaded. 0: "auto", the smallest ratio whose memory plan fits the device
  // (auto_offload_ratio, fsdp/train/memory_check.hpp), chosen by the trainer before it builds
  // anything; an engine given 0 offloads everything.
  double offload_optimizer_ratio = 1.0;
  // ZeRO-Offload's one-step delayed parameter update (DPU; Ren et al., USENIX ATC 2021, sec.
  // 5.2), with offload_optimizer only: the host's update of step n runs beside step n+1's
  // forward and backward, which use the parameters from before it, so each gradient is taken
  // one update late (fsdp/fsdp/engine.hpp update_shards). Evaluation, checkpoints and the run's
  // end complete the pending update first.
  bool delayed_parameter_update = false;
  // Steps trained undelayed first (the update of steps 1..N completes before the next step),
  // since stale gradients hurt most while the loss still falls fast.
  int64_t delayed_parameter_update_warmup_steps = 0;
  // The two keys above as the models take them.
  ActivationCheckpointing checkpointing() const {
    if (!activation_checkpointing) return ActivationCheckpointing(false);
    return recompute_num_layers < 0 ? ActivationCheckpointing(true)
                                    : ActivationCheckpointing::first_blocks(recompute_num_layers);
  }
  // Whether the shards live in host memory (either key).
  bool offloaded() const { return cpu_offload || offload_optimizer; }
  // Whether the param_dtype shards stay on the device (offload_optimizer alone).
  bool params_resident() const { return offload_optimizer && !cpu_offload; }
  // The fraction of the parameters offloaded: offload_optimizer_ratio with offload_optimizer
  // alone (1 for "auto" not yet resolved), 1 with cpu_offload, 0 without offload.
  double offloaded_fraction() const {
    if (!offloaded()) return 0.0;
    return params_resident() && offload_optimizer_ratio > 0 ? offload_optimizer_ratio : 1.0;
  }
  friend bool operator==(const FsdpConfig&, const FsdpConfig&) = default;
};

// torch.distributed.fsdp.MixedPrecision (param_dtype, reduce_dtype), and for fp16 the dynamic
// loss scaling of torch.amp.GradScaler (same names and defaults). Shards, master weights and
// optimizer state stay fp32 whatever the policy.
struct MixedPrecisionConfig {
  DType param_dtype = DType::f32;     // "fp32" | "bf16" | "fp16": unsharded params, compute
  DType reduce_dtype = DType::f32;    // "fp32" | "bf16" | "fp16": gradient reduce-scatter
  double init_scale = 65536.0;        // fp16 only: initial loss scale
  double growth_factor = 2.0;         // fp16 only: scale *= this after growth_interval good steps
  double backoff_factor = 0.5;        // fp16 only: scale *= this on a step with inf/NaN grads
  int64_t growth_interval = 2000;     // fp16 only
  bool uses_fp16() const { return param_dtype == DType::f16 || reduce_dtype == DType::f16; }
  friend bool operator==(const MixedPrecisionConfig&, const MixedPrecisionConfig&) = default;
};

struct MeshConfig {
  int64_t shard_size = 0;             // ranks per shard group; 0 = the ranks of one node
  friend bool operator==(const MeshConfig&, const MeshConfig&) = default;
};

// torch.distributed's backend choice and init_process_group(timeout=...).
struct CommConfig {
  CommBackend backend = CommBackend::auto_;  // "auto" | "nccl" | "mpi"
  double timeout_s = 600.0;           // a collective not done by then aborts the job (NCCL)
  friend bool operator==(const CommConfig&, const CommConfig&) = default;
};

struct CheckpointConfig {
  // false: no checkpoint is written (periodic, final or on a stop signal); --resume still
  // reads one. torchtitan's [checkpoint] enable.
  bool enable = true;
  int64_t every = 0;                  // steps between checkpoints; 0 = only at the end
  // Periodic saves stage the shards in host memory and write them from a background thread;
  // the commit waits until every rank's write finished (docs/checkpoint.md). torch DCP's
  // async_save. The final save and the save on a stop signal are synchronous.
  bool async_save = false;
  // Checkpoints kept in run_dir/checkpoints: after each commit the oldest beyond this many are
  // removed (ckpt::prune_step_dirs); 0 = all. HF TrainingArguments.save_total_limit.
  int64_t save_total_limit = 0;
  friend bool operator==(const CheckpointConfig&, const CheckpointConfig&) = default;
};

struct EvalConfig {
  int64_t every = 100;                // steps between validation passes; 0 = only at the end
  int64_t max_windows = 0;            // limit on validation samples (windows, examples); 0 = all
  bool on_start = false;              // also evaluate before the first step (HF eval_on_start)
  friend bool operator==(const EvalConfig&, const EvalConfig&) = default;
};

struct Config {
  // model.type's default; the family's keys are filled in from its schema (parse_config,
  // model_defaults). A Config built in code sets them itself.
  ModelConfig model{"gpt2", {}, "", kDefaultPadVocabMultiple};
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  FsdpConfig fsdp;
  MixedPrecisionConfig mixed_precision;
  MeshConfig mesh;
  CommConfig comm;
  CheckpointConfig checkpoint;
  EvalConfig eval;
  std::string source_path;            // the TOML file it came from (for messages)
  // Whether a periodic save is staged in host memory (checkpoint.async_save with a save
  // every checkpoint.every steps before train.max_steps; the final save is synchronous):
  // the run then holds one host copy of its shard file's datasets (the plan's
  // save_staging row).
  bool stages_async_saves() const {
    return checkpoint.enable && checkpoint.async_save && checkpoint.every > 0 &&
           checkpoint.every < train.max_steps;
  }
  // Field-by-field equality (source_path included).
  friend bool operator==(const Config&, const Config&) = default;
};

// What the configuration needs of a model family, declared here and implemented above it
// (fsdp/model/model.hpp: every ModelFamily is one; model_schemas() lists them), so config
// knows no model: the [model] keys, the wrap classes and objectives a family takes, and its
// own checks.
class ModelSchema {
 public:
  virtual ~ModelSchema() = default;
  // The model.type value, e.g. "gpt2".
  virtual std::string type() const = 0;
  // The [model] keys beside `type`, in the order to_toml prints them.
  virtual std::vector<ModelKey> keys() const = 0;
  // The Hugging Face config class whose attributes the keys are, e.g. "GPT2Config".
  virtual std::string hf_config_class() const = 0;
  // Module classes transformer_layer_cls_to_wrap may name (the first ones are the default,
  // like Hugging Face's _no_split_modules), e.g. {"GPT2Block"}.
  virtual std::vector<std::string> wrap_classes() const = 0;
  // data.objective values this model trains on (the first is the default).
  virtual std::vector<Objective> objectives() const = 0;
  // Checks the family's keys and their relation to the rest of the config (e.g. data
  // lengths); throws fail(key, what).
  virtual void validate(const Config& config, const KeyFail& fail) const = 0;
};
// For a family's validate: throws fail("fsdp.recompute_num_layers", ...) when it names more
// blocks than the model's `num_blocks` (with activation_checkpointing on).
void check_recompute_num_layers(const Config& config, int64_t num_blocks, const KeyFail& fail);
// For a family's validate: throws fail("optim.moe_router_bias_update_rate", ...) when it is
// above 0 and the model (`has_router_bias` false) has no router with a selection bias.
void check_router_bias_update(const Config& config, bool has_router_bias, const KeyFail& fail);
// The families a configuration may name, in a fixed order.
using ModelSchemas = std::vector<const ModelSchema*>;
// The schema of model.type `type` among `models`; throws InputError `model.type: unknown
// value "x" (expected one of gpt2, t5, llama, mistral, qwen2, qwen3)`.
const ModelSchema& model_schema(const ModelSchemas& models, const std::string& type);

// Why [first, last] is not a valid profiling window (train.profile_steps, --profile): "" if it
// is (1 <= first <= last), else the reason, e.g. "first step 0 is out of range (expected >= 1)".
std::string profile_steps_error(int64_t first, int64_t last);

// Parses `toml_path`, applies `overrides` ("section.key=value", value parsed as a TOML value;
// bare words are taken as strings), validates, and returns the config.
// Throws fsdp::InputError (exit 2) with one line naming the file and key on: unreadable or
// malformed TOML (with line:column), unknown section or key (model keys: those of the chosen
// model.type), wrong type, invalid value (unknown strategy or optimizer name, non-positive
// sizes, the model family's own checks such as n_embd % n_head != 0), malformed override.
// `models`: the families [model] may name (fsdp/model/model.hpp's load_config passes the
// registry's).
Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides,
                   const ModelSchemas& models);

// Same from TOML text already in memory (`origin` names it in messages).
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides, const ModelSchemas& models);

// Checks a Config built in code as parse_config checks a parsed one: the same checks (the key
// table's ranges, the family's own, the relations between keys), each in one place with one
// message, "section.key: ..." (no file to name). Throws InputError. train() calls it, so code
// below it (data sources, models, the engine) takes its config as checked.
void check_config(const Config& config, const ModelSchemas& models);

// The resolved config as TOML text (every key, defaults included), for the rank-0 banner
// and for checkpoints.
std::string to_toml(const Config& config);

// One key of the key table (src/config/config.cpp visit_keys), as `fsdp_train --list-keys`
// prints it and docs/config.md lists it (checked by Config.DocsListEveryKeyWithItsDefault).
struct KeyDescription {
  std::string key;            // "section.key", as the TOML file spells it
  // docs/config.md's type column: the bounds of a ranged key ("integer >= 1",
  // "float, 0 < x < 1"), else "integer", "float", "boolean", "string", "array of strings",
  // "array of integers" or "one of A, B, C" (an enum)
  std::string type;
  std::string default_value;  // TOML text, as to_toml prints it
  // The same knob's name in PyTorch, Accelerate, DeepSpeed or Hugging Face
  // ("PyTorch FSDP sharding_strategy", "HF GPT2Config.n_layer"); "" if it has none.
  std::string peer;
  std::string doc;            // one line
  bool resume_may_change = false;  // resume_may_change(key)
  bool family_key = false;  // one of the family's own [model] keys (ModelSchema::keys)
};

// Every key of a config of model family `family` (its own [model] keys included), in the
// order to_toml prints them.
std::vector<KeyDescription> describe_keys(const ModelSchema& family);

// Whether `--resume` may change `key` ("section.key", as the TOML file spells it): the key
// table's flag (src/config/config.cpp visit_keys; docs/checkpoint.md "Resume checks" lists
// them and says why). False for the model family's own keys and for a name the table does not
// hold (a key of an older version's checkpoint must then be equal).
bool resume_may_change(const std::string& key);

}  // namespace fsdp
