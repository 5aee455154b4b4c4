// src/config/config.cpp: loading, overriding, validating and printing the run configuration
// (fsdp/config/config.hpp).
//
// One list of keys (visit_keys below) drives everything: which sections and keys exist, how
// each TOML value is converted to its typed field, and the order of to_toml's output. So a
// key added to the structs and to visit_keys is parsed, overridable with --set, rejected
// when misspelled and printed, with no second list to keep in step (docs/config.md aside).
//
// Every failure is an fsdp::InputError (exit code 2) with one line that starts with where
// the value came from (the TOML file, or the `--set ...` text that set it) and names the key.
#include "fsdp/config/config.hpp"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "fsdp/core/error.hpp"

namespace fsdp {
namespace {

// The values an enum-typed key accepts, in the order error messages, --list-keys and the docs
// list them: every value of the enum's EnumNames table (config.hpp), spelled as the table
// spells it; conversion is exact and case-sensitive.
template <class E>
struct ConfigValues {
  static std::vector<E> values() { return enum_values<E>(); }
};
// DType keys (mixed_precision.*_dtype) take the floating types FSDP mixed precision uses.
template <>
struct ConfigValues<DType> {
  static std::vector<DType> values() { return {DType::f32, DType::bf16, DType::f16}; }
};

template <class T>
constexpr bool kIsConfigEnum = NamedEnum<T>;

enum Resume : bool { kFixed = false, kMayChange = true };

using Range = KeyRange;
constexpr Range kAny{};
constexpr Range at_least(int64_t lo) { return KeyRange::at_least(lo); }
constexpr Range above(double lo) { return KeyRange::above(lo); }
constexpr Range nonnegative() { return KeyRange::nonnegative(); }
constexpr Range open_unit() { return KeyRange::open_unit(); }
constexpr Range unit_interval() { return KeyRange::unit_interval(); }
// The ranges with their own wording.
constexpr Range kPadVocabRange{true, Range::closed, Range::closed, 1,
                               static_cast<double>(kMaxPadVocabMultiple), "x", "; 1 = no padding"};
constexpr Range kRecomputeLayersRange{true, Range::closed, Range::none, -1, 0, "x",
                                      "; -1 = every block"};
constexpr Range kAtLeastOne{false, Range::closed, Range::none, 1, 0, "x", ""};
constexpr Range kPeakFlopsRange{false, Range::closed, Range::none, 0, 0, "x",
                                " FLOP/s; 0 = the device's peak"};
constexpr Range kOffloadRatioRange{false, Range::closed, Range::closed, 0, 1, "x",
                                   "; 0 = auto: the most on the device that the plan fits"};
constexpr Range kLearningRateRange{false, Range::open, Range::closed, 0, kMaxLearningRate,
                                   "lr", ""};

// What the key table says of a key besides its field. `range` bounds a number (kAny: the
// family checks its own keys, or the key is no number); `peer` is the name of the same knob
// in PyTorch, Accelerate, DeepSpeed or Hugging Face ("" for none); `doc` is one line, the
// first sentence of the key's row in docs/config.md (Config.DocsListEveryKeyWithItsDefault).
struct KeyInfo {
  Resume resume;
  Range range;
  const char* peer;
  const char* doc;
};

// The key table: calls f(section, key, field, info) for every key of the config, sections in
// output order. C is Config or const Config. `info.resume` says whether --resume may
// change the key (docs/checkpoint.md "Resume checks": how long to train, how to log,
// evaluate and save, where to run and how to talk change neither the model, its optimizer
// state nor the sample sequence; the learning-rate schedule and clipping may change, as
// restarting with a lower lr after a loss spike is common practice; FSDP's execution knobs do
// not change the numerics, and a change of layout (sharding_strategy, mesh) or of the
// vocabulary padding is resharded or re-padded on load). The family's [model] keys never may.
template <class C, class F>
void visit_keys(C& c, F&& f) {
  f("model", "type", c.model.type,
    {kFixed, kAny, "HF config.json model_type", "The model family."});
  f("model", "init_from", c.model.init_from,
    {kMayChange, kAny, "HF from_pretrained(path)", "Fine-tune from published weights."});
  f("model", "pad_vocab_multiple", c.model.pad_vocab_multiple,
    {kMayChange, kPadVocabRange, "Megatron-LM --make-vocab-size-divisible-by",
     "Rows of the token embedding and LM head are padded to a multiple of this."});
  // The family's own keys (ModelConfig::of filled them in from its schema), in its order,
  // typed as their declared defaults.
  for (auto& [name, value] : c.model.values) {
    // Named as the family's Hugging Face config names them; the docs are the schema's.
    std::visit([&](auto& v) { f("model", name.c_str(), v, KeyInfo{kFixed, kAny, "", ""}); },
               value);
  }
  // The causal LMs' LM-head execution (after the family's keys: not a config.json attribute).
  f("model", "fused_linear_cross_entropy", c.model.fused_linear_cross_entropy,
    {kMayChange, kAny, "Liger-Kernel fused_linear_cross_entropy",
     "Compute the LM head and the cross-entropy over chunks of rows, so no [tokens, vocabulary] "
     "logits are kept."});
  f("model", "fused_linear_cross_entropy_chunk_rows", c.model.fused_linear_cross_entropy_chunk_rows,
    {kMayChange, at_least(0), "", "Rows (tokens) per chunk of `fused_linear_cross_entropy`."});
  f("data", "source", c.data.source, {kFixed, kAny, "", "Where tokens come from."});
  f("data", "path", c.data.path, {kMayChange, kAny, "", "HDF5 token file (see docs/data.md)."});
  f("data", "paths", c.data.paths,
    {kMayChange, kAny, "Megatron-LM --data-path",
     "HDF5 token files of a data mixture, sampled by `weights` (docs/data.md \"Data mixtures\")."});
  f("data", "weights", c.data.weights,
    {kMayChange, kAny, "Megatron-LM --data-path weights",
     "Sampling weight of each file of `paths`, in order."});
  f("data", "objective", c.data.objective, {kFixed, kAny, "", "What a sample is (docs/data.md)."});
  f("data", "seq_len", c.data.seq_len,
    {kFixed, at_least(1), "HF run_clm.py --block_size", "Sample length in tokens."});
  f("data", "max_input_len", c.data.max_input_len,
    {kFixed, at_least(1), "HF run_summarization.py --max_source_length",
     "`seq2seq`: encoder tokens per row."});
  f("data", "max_target_len", c.data.max_target_len,
    {kFixed, at_least(1), "HF run_summarization.py --max_target_length",
     "`seq2seq`: target tokens per row."});
  f("data", "noise_density", c.data.noise_density,
    {kFixed, open_unit(), "T5 span_corruption noise_density",
     "`span_corruption`: fraction of tokens masked (T5 paper)."});
  f("data", "mean_noise_span_length", c.data.mean_noise_span_length,
    {kFixed, kAtLeastOne, "T5 span_corruption mean_noise_span_length",
     "`span_corruption`: mean length of a masked span (T5 paper)."});
  f("data", "attn_mask_type", c.data.attn_mask_type,
    {kMayChange, kAny, "torchtitan attn_mask_type",
     "What a token attends to: `causal` (every earlier token of its row) or `block_causal` "
     "(only earlier tokens of its own document)."});
  f("data", "reset_position_ids", c.data.reset_position_ids,
    {kMayChange, kAny, "Megatron-LM --reset-position-ids",
     "With `block_causal`: positions (RoPE's; GPT-2's `wpe` rows) restart at 0 at each "
     "document, as Hugging Face's padding-free packing's position_ids."});
  f("data", "eod_mask_loss", c.data.eod_mask_loss,
    {kMayChange, kAny, "Megatron-LM --eod-mask-loss",
     "With `block_causal`: no loss on the token after each EOS (the next document's first, "
     "predicted across the boundary)."});
  f("data", "packing", c.data.packing,
    {kFixed, kAny, "TRL SFTConfig.packing",
     "`sft`: pack several examples into each row (best-fit decreasing), each attending only "
     "to itself."});
  f("data", "eos_token_id", c.data.eos_token_id,
    {kMayChange, at_least(-1), "HF config.json eos_token_id",
     "The token that ends a document for `block_causal`; -1: the data file's `eos_id` "
     "attribute."});
  f("train", "global_batch_size", c.train.global_batch_size,
    {kFixed, at_least(1), "DeepSpeed train_batch_size",
     "Sequences per optimizer step over all data-parallel ranks."});
  f("train", "micro_batch_size", c.train.micro_batch_size,
    {kMayChange, at_least(0), "DeepSpeed train_micro_batch_size_per_gpu",
     "Gradient accumulation."});
  f("train", "max_steps", c.train.max_steps,
    {kMayChange, at_least(1), "HF TrainingArguments.max_steps", "Optimizer steps to train."});
  f("train", "seed", c.train.seed,
    {kFixed, kAny, "HF TrainingArguments.seed", "Seed of every random number."});
  f("train", "run_dir", c.train.run_dir,
    {kMayChange, kAny, "HF TrainingArguments.output_dir", "Output directory."});
  f("train", "log_every", c.train.log_every,
    {kMayChange, at_least(1), "HF TrainingArguments.logging_steps",
     "Steps between progress lines on rank 0's stdout."});
  f("train", "num_threads", c.train.num_threads,
    {kMayChange, at_least(0), "torch.set_num_threads", "CPU threads per rank."});
  f("train", "device", c.train.device, {kMayChange, kAny, "torch.device", "Where the model runs."});
  f("train", "cuda_graphs", c.train.cuda_graphs,
    {kMayChange, kAny, "torch.compile mode=\"reduce-overhead\"",
     "Capture the model's kernels between the FSDP hooks as CUDA graphs and replay them."});
  f("train", "skip_nonfinite", c.train.skip_nonfinite,
    {kMayChange, kAny, "", "The non-finite guard."});
  f("train", "check_memory", c.train.check_memory,
    {kMayChange, kAny, "",
     "Before allocating anything, compare the memory plan with what this rank may use."});
  f("train", "peak_flops", c.train.peak_flops,
    {kMayChange, kPeakFlopsRange, "", "Peak FLOP/s of one rank, the denominator of `mfu`."});
  f("train", "profile_steps", c.train.profile_steps,
    {kMayChange, kAny, "torch.profiler.schedule", "The built-in profiler."});
  f("optim", "name", c.optim.name, {kFixed, kAny, "HF TrainingArguments.optim", "The optimizer."});
  f("optim", "lr", c.optim.lr,
    {kMayChange, kLearningRateRange, "torch.optim.AdamW lr", "Peak learning rate."});
  f("optim", "min_lr", c.optim.min_lr,
    {kMayChange, nonnegative(), "torch CosineAnnealingLR eta_min", "Floor of the decay."});
  f("optim", "lr_scheduler_type", c.optim.lr_scheduler_type,
    {kMayChange, kAny, "HF TrainingArguments.lr_scheduler_type",
     "The learning-rate schedule after warmup."});
  f("optim", "warmup_steps", c.optim.warmup_steps,
    {kMayChange, at_least(0), "HF TrainingArguments.warmup_steps",
     "Linear warmup from 0 to `lr` over this many steps."});
  f("optim", "decay_steps", c.optim.decay_steps,
    {kMayChange, at_least(0), "torch CosineAnnealingLR T_max",
     "Step at which the decay reaches `min_lr`, counted from step 0 (warmup included)."});
  f("optim", "num_decay_steps", c.optim.num_decay_steps,
    {kMayChange, at_least(0), "HF get_wsd_schedule num_decay_steps",
     "warmup_stable_decay: steps of the final decay, which ends at `decay_steps`."});
  f("optim", "decay_type", c.optim.decay_type,
    {kMayChange, kAny, "HF get_wsd_schedule decay_type",
     "warmup_stable_decay: the shape of the final decay."});
  f("optim", "weight_decay", c.optim.weight_decay,
    {kFixed, nonnegative(), "torch.optim.AdamW weight_decay",
     "Decoupled weight decay for AdamW (`torch.optim.AdamW`)."});
  f("optim", "grad_clip", c.optim.grad_clip,
    {kMayChange, nonnegative(), "torch.nn.utils.clip_grad_norm_ max_norm",
     "Max global L2 norm of all gradients."});
  f("optim", "beta1", c.optim.beta1,
    {kFixed, unit_interval(), "torch.optim.AdamW betas[0]",
     "AdamW first-moment decay (`betas[0]`)."});
  f("optim", "beta2", c.optim.beta2,
    {kFixed, unit_interval(), "torch.optim.AdamW betas[1]",
     "AdamW second-moment decay (`betas[1]`)."});
  f("optim", "eps", c.optim.eps,
    {kFixed, {false, Range::open, Range::open, 0, 1, "eps", ""}, "torch.optim.AdamW eps",
     "AdamW epsilon."});
  f("optim", "momentum", c.optim.momentum,
    {kFixed, unit_interval(), "torch.optim.SGD momentum", "SGD momentum (SGD only)."});
  f("optim", "moe_router_bias_update_rate", c.optim.moe_router_bias_update_rate,
    {kMayChange, nonnegative(), "Megatron-LM --moe-router-bias-update-rate",
     "Auxiliary-loss-free load balancing: after each step every router's selection bias "
     "(`e_score_correction_bias`) moves by this toward balance; 0 = off."});
  f("fsdp", "sharding_strategy", c.fsdp.sharding_strategy,
    {kMayChange, kAny, "PyTorch FSDP sharding_strategy", "What is sharded, and over which ranks."});
  f("fsdp", "auto_wrap_policy", c.fsdp.auto_wrap_policy,
    {kFixed, kAny, "Accelerate fsdp_auto_wrap_policy", "How modules are grouped into FSDP units."});
  f("fsdp", "transformer_layer_cls_to_wrap", c.fsdp.transformer_layer_cls_to_wrap,
    {kFixed, kAny, "Accelerate fsdp_transformer_layer_cls_to_wrap",
     "Module classes that get their own unit."});
  f("fsdp", "backward_prefetch", c.fsdp.backward_prefetch,
    {kMayChange, kAny, "PyTorch FSDP backward_prefetch",
     "When backward all-gathers the next unit."});
  f("fsdp", "forward_prefetch", c.fsdp.forward_prefetch,
    {kMayChange, kAny, "PyTorch FSDP forward_prefetch",
     "Issue the all-gather of the next unit (in forward order) before the current unit's "
     "forward."});
  f("fsdp", "limit_all_gathers", c.fsdp.limit_all_gathers,
    {kMayChange, kAny, "PyTorch FSDP limit_all_gathers",
     "At most two units besides the root unsharded at once."});
  f("fsdp", "activation_checkpointing", c.fsdp.activation_checkpointing,
    {kMayChange, kAny, "Accelerate fsdp_activation_checkpointing",
     "Keep only each wrapped block's input during forward and recompute the rest in backward."});
  f("fsdp", "recompute_num_layers", c.fsdp.recompute_num_layers,
    {kMayChange, kRecomputeLayersRange, "Megatron-LM recompute_num_layers (recompute_method block)",
     "With activation_checkpointing: only the first N transformer blocks in forward order "
     "recompute; the others keep their internals from forward (-1: every block)."});
  f("fsdp", "cpu_offload", c.fsdp.cpu_offload,
    {kMayChange, kAny, "PyTorch FSDP CPUOffload(offload_params)",
     "Keep the fp32 shards, their gradients and the optimizer state in host memory."});
  f("fsdp", "offload_optimizer", c.fsdp.offload_optimizer,
    {kMayChange, kAny, "DeepSpeed zero_optimization.offload_optimizer",
     "Keep the fp32 master shards, their gradients and the optimizer state in host memory, "
     "the param_dtype shards on the device."});
  f("fsdp", "offload_optimizer_ratio", c.fsdp.offload_optimizer_ratio,
    {kMayChange, kOffloadRatioRange, "DeepSpeed zero_optimization.offload_optimizer.ratio",
     "With offload_optimizer: the fraction of the parameters whose master shards, gradients "
     "and optimizer state are offloaded; the first units in forward order keep the rest's on "
     "the device (0: the smallest fraction whose memory plan fits the device)."});
  f("fsdp", "delayed_parameter_update", c.fsdp.delayed_parameter_update,
    {kMayChange, kAny, "ZeRO-Offload one-step delayed parameter update (DPU)",
     "With offload_optimizer: run the host's update of each step beside the next step's "
     "forward and backward, which then use the parameters from before that update."});
  f("fsdp", "delayed_parameter_update_warmup_steps", c.fsdp.delayed_parameter_update_warmup_steps,
    {kMayChange, at_least(0), "",
     "Steps whose update is not delayed before delayed_parameter_update takes effect."});
  f("mixed_precision", "param_dtype", c.mixed_precision.param_dtype,
    {kFixed, kAny, "PyTorch FSDP MixedPrecision.param_dtype",
     "Dtype of the unsharded parameters and of the compute (GEMMs, activations)."});
  f("mixed_precision", "reduce_dtype", c.mixed_precision.reduce_dtype,
    {kFixed, kAny, "PyTorch FSDP MixedPrecision.reduce_dtype",
     "Dtype in which gradients are reduce-scattered."});
  f("mixed_precision", "init_scale", c.mixed_precision.init_scale,
    {kFixed, above(0), "torch.amp.GradScaler init_scale", "Initial loss scale."});
  f("mixed_precision", "growth_factor", c.mixed_precision.growth_factor,
    {kFixed, above(1), "torch.amp.GradScaler growth_factor",
     "The scale is multiplied by this after `growth_interval` clean steps."});
  f("mixed_precision", "backoff_factor", c.mixed_precision.backoff_factor,
    {kFixed, open_unit(), "torch.amp.GradScaler backoff_factor",
     "The scale is multiplied by this on a step with inf/NaN gradients."});
  f("mixed_precision", "growth_interval", c.mixed_precision.growth_interval,
    {kFixed, at_least(1), "torch.amp.GradScaler growth_interval",
     "Consecutive clean steps before the scale grows."});
  f("mesh", "shard_size", c.mesh.shard_size,
    {kMayChange, at_least(0), "torch init_device_mesh mesh_shape[1]", "Ranks per shard group."});
  f("comm", "backend", c.comm.backend,
    {kMayChange, kAny, "torch.distributed.init_process_group backend",
     "The collectives library of the device mesh."});
  f("comm", "timeout_s", c.comm.timeout_s,
    {kMayChange, above(0), "torch.distributed.init_process_group timeout",
     "Seconds a rank may wait for a collective."});
  f("checkpoint", "enable", c.checkpoint.enable,
    {kMayChange, kAny, "torchtitan checkpoint.enable",
     "Write checkpoints (periodic, final and on a stop signal)."});
  f("checkpoint", "every", c.checkpoint.every,
    {kMayChange, at_least(0), "HF TrainingArguments.save_steps",
     "Steps between sharded checkpoints under `run_dir/checkpoints/`."});
  f("checkpoint", "async_save", c.checkpoint.async_save,
    {kMayChange, kAny, "torch.distributed.checkpoint.async_save",
     "Write periodic checkpoints from a background thread while training goes on."});
  f("checkpoint", "save_total_limit", c.checkpoint.save_total_limit,
    {kMayChange, at_least(0), "HF TrainingArguments.save_total_limit",
     "Checkpoints kept in `run_dir/checkpoints/`; the oldest beyond it are removed."});
  f("eval", "every", c.eval.every,
    {kMayChange, at_least(0), "HF TrainingArguments.eval_steps",
     "Steps between validation passes (mean loss over the validation split)."});
  f("eval", "max_windows", c.eval.max_windows,
    {kMayChange, at_least(0), "HF run_clm.py --max_eval_samples",
     "Most validation samples per pass."});
  f("eval", "on_start", c.eval.on_start,
    {kMayChange, kAny, "HF TrainingArguments.eval_on_start",
     "Also evaluate before the first step."});
}

// A default config of the family `schema` (whose visit lists that family's [model] keys).
// The keys whose default is the model's too: the wrap classes (Hugging Face's
// _no_split_modules) and the objective (the family's first), so --list-keys and the docs
// show what a run of the family gets.
Config config_of_type(const ModelSchema& schema) {
  Config c;
  c.model = ModelConfig::of(schema);
  c.fsdp.transformer_layer_cls_to_wrap = schema.wrap_classes();
  c.data.objective = schema.objectives().front();
  return c;
}

// All "section.key" names for the family `schema`, in visit order.
std::vector<std::string> all_keys(const ModelSchema& schema) {
  std::vector<std::string> keys;
  const Config c = config_of_type(schema);
  visit_keys(c, [&](const char* s, const char* k, const auto&, const KeyInfo&) {
    keys.push_back(std::string(s) + "." + k);
  });
  return keys;
}

bool is_section(const std::string& name) {
  bool found = false;
  const Config c;
  visit_keys(c, [&](const char* s, const char*, const auto&, const KeyInfo&) {
    found = found || name == s;
  });
  return found;
}

bool is_key(const std::string& full, const ModelSchema& schema) {
  const auto keys = all_keys(schema);
  return std::find(keys.begin(), keys.end(), full) != keys.end();
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1u : 0u)});
      diag = up;
    }
  }
  return row[b.size()];
}

// " (did you mean 'fsdp.sharding_strategy'?)" for a near miss, else "". A bare key written
// outside any section is compared with the key part too ("seed" -> 'train.seed').
std::string suggestion(const std::string& wrong, const ModelSchema& schema) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, wrong.size() / 4) + 1;
  for (const auto& full : all_keys(schema)) {
    std::size_t d = edit_distance(wrong, full);
    if (wrong.find('.') == std::string::npos) {
      d = std::min(d, edit_distance(wrong, full.substr(full.find('.') + 1)));
    }
    if (d < best_d) {
      best_d = d;
      best = full;
    }
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

std::string type_name(toml::node_type t) {
  switch (t) {
    case toml::node_type::table: return "table";
    case toml::node_type::array: return "array";
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    default: return "nothing";
  }
}

std::string quoted(const std::string& s) { return "\"" + s + "\""; }
// "an integer", "a string": a type name as an error message puts it.
std::string with_article(const std::string& noun) {
  return (noun.find_first_of("aeiou") == 0 ? "an " : "a ") + noun;
}

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) out += (i ? sep : "") + items[i];
  return out;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

template <class E>
std::string name_of(E v) {
  return std::string(to_string(v));
}

template <class E>
std::vector<std::string> config_names() {
  std::vector<std::string> names;
  for (auto v : ConfigValues<E>::values()) names.push_back(name_of(v));
  return names;
}

template <class E>
bool lookup_enum(const std::string& name, E* out) {
  const std::optional<E> v = enum_from_name<E>(name);
  const std::vector<E> accepted = ConfigValues<E>::values();
  if (!v || std::find(accepted.begin(), accepted.end(), *v) == accepted.end()) return false;
  *out = *v;
  return true;
}

// "<key>: unknown value "X" (expected one of A, B, C)"
template <class E>
std::string unknown_value(const std::string& key, const std::string& name) {
  return key + ": unknown value " + quoted(name) + " (expected one of " + join(config_names<E>()) +
         ")";
}

// One `--set section.key=value`, its value parsed as the TOML snippet `k = <value>` (a bare
// word that is not valid TOML is kept as a string).
struct Override {
  std::string text;   // the whole argument, for messages
  std::string raw;    // the value text as given
  toml::table value;  // {k = <value>}
};

Override parse_override(const std::string& text, std::string* full_key) {
  const auto eq = text.find('=');
  const std::string malformed = "--set " + text + ": expected section.key=value";
  if (eq == std::string::npos) throw InputError(malformed);
  const std::string key = trim(text.substr(0, eq));
  const auto dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == key.size()) throw InputError(malformed);
  Override o;
  o.text = text;
  o.raw = trim(text.substr(eq + 1));
  bool parsed = false;
  try {
    toml::table t = toml::parse("k = " + o.raw, std::string_view("--set"));
    if (t.size() == 1 && t.contains("k")) {
      o.value = std::move(t);
      parsed = true;
    }
  } catch (const toml::parse_error& e) {
    // A value that was meant as TOML (an array, a quoted string, a table) must parse.
    if (!o.raw.empty() && std::string_view("[{\"'").find(o.raw.front()) != std::string::npos) {
      std::string what(e.description());
      std::replace(what.begin(), what.end(), '\n', ' ');
      throw InputError("--set " + text + ": " + what);
    }
  }
  if (!parsed) o.value.insert_or_assign("k", o.raw);
  *full_key = key;
  return o;
}

// Whether `text` is written as a number: optional sign, digits, optional fraction and
// exponent ("99999999999999999999", "-1e309", "2.5").
bool looks_numeric(const std::string& text) {
  std::size_t i = 0;
  if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
  std::size_t digits = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
  if (i < text.size() && text[i] == '.') {
    ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    std::size_t exp = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i, ++exp;
    if (exp == 0) return false;
  }
  return i == text.size();
}

// Converts `node` into `field` (its C++ type picks the rule), or throws "<origin>: <key>:
// expected ..., got ...". `raw` is the override text (null for file values): a string key
// given a non-string override value takes the text as written.
template <class T>
void convert(const toml::node& node, const std::string& origin, const std::string& key,
             const std::string* raw, T& field) {
  auto wrong = [&](const char* expected) {
    // An override that reads as a number TOML cannot hold (an integer beyond int64, 1e309)
    // arrives as a bare-word string: say the number is out of range, not that it is a string.
    if (raw && node.is_string() && looks_numeric(*raw)) {
      return InputError(origin + ": " + key + ": " + *raw + " is out of range (expected " +
                        expected + (std::string(expected).find("integer") != std::string::npos
                                        ? " within 64 bits, |x| < 2^63)"
                                        : ", a finite double)"));
    }
    return InputError(origin + ": " + key + ": expected " + expected + ", got " +
                      type_name(node.type()));
  };
  if constexpr (std::is_same_v<T, std::string>) {
    if (const auto* s = node.as_string()) {
      field = s->get();
    } else if (raw) {
      field = *raw;
    } else {
      throw wrong("a string");
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    const auto* b = node.as_boolean();
    if (!b) throw wrong("a boolean (true or false)");
    field = b->get();
  } else if constexpr (std::is_same_v<T, int64_t>) {
    const auto* i = node.as_integer();
    if (!i) throw wrong("an integer");
    field = i->get();
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    const auto* i = node.as_integer();
    if (!i) throw wrong("a non-negative integer");
    if (i->get() < 0) {
      throw InputError(origin + ": " + key + ": " + std::to_string(i->get()) +
                       " is negative (expected a non-negative integer)");
    }
    field = static_cast<uint64_t>(i->get());
  } else if constexpr (std::is_same_v<T, double>) {
    if (const auto* f = node.as_floating_point()) {
      field = f->get();
    } else if (const auto* i = node.as_integer()) {
      field = static_cast<double>(i->get());
    } else {
      throw wrong("a number");
    }
    if (!std::isfinite(field)) {
      throw InputError(origin + ": " + key + ": expected a finite number, got " +
                       (std::isnan(field) ? "nan" : "inf"));
    }
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    // An array of strings; a single string is taken as a comma-separated list
    // (Accelerate's fsdp_transformer_layer_cls_to_wrap = "GPT2Block,T5Block").
    std::vector<std::string> out;
    if (const auto* a = node.as_array()) {
      for (const auto& e : *a) {
        const auto* s = e.as_string();
        if (!s) {
          throw InputError(origin + ": " + key + ": expected an array of strings, got an " +
                           type_name(e.type()) + " element");
        }
        out.push_back(s->get());
      }
    } else if (const auto* s = node.as_string()) {
      std::stringstream ss(s->get());
      for (std::string item; std::getline(ss, item, ',');) {
        if (!trim(item).empty()) out.push_back(trim(item));
      }
    } else {
      throw wrong("an array of strings");
    }
    field = std::move(out);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    const auto* a = node.as_array();
    if (!a) throw wrong("an array of integers");
    std::vector<int64_t> out;
    for (const auto& e : *a) {
      const auto* i = e.as_integer();
      if (!i) {
        throw InputError(origin + ": " + key + ": expected an array of integers, got " +
                         with_article(type_name(e.type())) + " element");
      }
      out.push_back(i->get());
    }
    field = std::move(out);
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    const auto* a = node.as_array();
    if (!a) throw wrong("an array of numbers");
    std::vector<double> out;
    for (const auto& e : *a) {
      const auto v = e.value<double>();  // a float, or an integer read as one
      if (!v || e.is_boolean()) {
        throw InputError(origin + ": " + key + ": expected an array of numbers, got " +
                         with_article(type_name(e.type())) + " element");
      }
      if (!std::isfinite(*v)) {
        throw InputError(origin + ": " + key + ": expected finite numbers, got " +
                         (std::isnan(*v) ? "nan" : "inf"));
      }
      out.push_back(*v);
    }
    field = std::move(out);
  } else if constexpr (kIsConfigEnum<T>) {
    // An enum (ShardingStrategy, AutoWrapPolicy, BackwardPrefetch, DataSource, Objective,
    // OptimizerKind, DType, ...): a string spelled exactly as one of ConfigValues<T>.
    const auto* s = node.as_string();
    if (!s) throw wrong("a string");
    if (!lookup_enum(s->get(), &field)) {
      throw InputError(origin + ": " + unknown_value<T>(key, s->get()));
    }
  } else {
    static_assert(!sizeof(T), "visit_keys has a field type convert() does not handle");
  }
}

// Checks the resolved config; `origin_of(key)` says where a key's value came from.
template <class OriginOf>
void validate(const Config& c, const ModelSchema& family, OriginOf&& origin_of) {
  auto fail = [&](const std::string& key, const std::string& what) {
    const std::string where = origin_of(key);
    return InputError((where.empty() ? "" : where + ": ") + key + ": " + what);
  };
  const auto num = format_number;

  // The key table's ranges (one message form), [model] first: the family's checks below
  // may relate its keys to others.
  auto check_ranges = [&](bool model_section) {
    visit_keys(c, [&](const char* sec, const char* key, const auto& field, const KeyInfo& info) {
      const Range& r = info.range;
      using T = std::decay_t<decltype(field)>;
      if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, double>) {
        if ((std::string(sec) == "model") != model_section) return;
        if (!r.bounded()) return;
        if (!r.contains(static_cast<double>(field))) {
          const std::string v = std::is_same_v<T, int64_t>
                                    ? std::to_string(static_cast<int64_t>(field))
                                    : num(static_cast<double>(field));
          throw fail(std::string(sec) + "." + key,
                     v + " is out of range (expected " + r.text() + ")");
        }
      }
    });
  };

  // model: the ranges and choices the family declares with its keys, then the family's own
  // checks (relations between its keys and to the data lengths) and its objectives
  check_ranges(true);
  for (const ModelKey& k : family.keys()) {
    const ModelValue* v = c.model.find(k.name);
    if (!v) continue;  // ModelConfig::of filled every key in; a Config built in code may not
    if (const std::string bad = value_violation(k.range, k.choices, *v); !bad.empty()) {
      throw fail("model." + k.name, bad);
    }
  }
  family.validate(c, fail);
  {
    const auto objectives = family.objectives();
    if (std::find(objectives.begin(), objectives.end(), c.data.objective) == objectives.end()) {
      std::vector<std::string> names;
      for (Objective o : objectives) names.push_back(quoted(to_string(o)));
      throw fail("data.objective", quoted(to_string(c.data.objective)) +
                                       " is not an objective of model.type = " +
                                       quoted(c.model.type) + " (expected " + join(names, " or ") + ")");
    }
  }
  check_ranges(false);

  // What a range cannot say: keys required or related to others. (The enum keys were
  // checked on conversion.)
  if (!c.data.paths.empty()) {
    if (c.data.source != DataSource::hdf5) {
      throw fail("data.paths", std::string("needs data.source = \"hdf5\" (got \"") +
                                   to_string(c.data.source) + "\")");
    }
    if (!c.data.path.empty()) {
      throw fail("data.paths", "give data.path (one file) or data.paths (a mixture), not both");
    }
    for (std::size_t i = 0; i < c.data.paths.size(); ++i) {
      if (c.data.paths[i].empty()) {
        throw fail("data.paths", "element " + std::to_string(i) + " is an empty path");
      }
    }
  }
  if (!c.data.weights.empty()) {
    if (c.data.weights.size() != c.data.paths.size()) {
      throw fail("data.weights", std::to_string(c.data.weights.size()) + " weights for " +
                                     std::to_string(c.data.paths.size()) +
                                     " data.paths (expected one weight per file, or none)");
    }
    for (std::size_t i = 0; i < c.data.weights.size(); ++i) {
      if (!(c.data.weights[i] > 0)) {
        throw fail("data.weights", "element " + std::to_string(i) + " is " +
                                       num(c.data.weights[i]) + " (expected > 0)");
      }
    }
  }
  if (c.data.packing && c.data.objective != Objective::sft) {
    throw fail("data.packing", std::string("true needs data.objective = \"sft\" (got \"") +
                                   to_string(c.data.objective) +
                                   "\"; causal_lm windows are packed already)");
  }
  if (c.data.packing && c.data.attn_mask_type != AttnMaskType::block_causal) {
    throw fail("data.packing",
               "true needs data.attn_mask_type = \"block_causal\" (each packed example attends "
               "only to itself, as TRL's padding_free; set it)");
  }
  if (c.data.attn_mask_type == AttnMaskType::block_causal &&
      c.data.objective != Objective::causal_lm && !c.data.packing) {
    throw fail("data.attn_mask_type",
               std::string("\"block_causal\" needs data.objective = \"causal_lm\" (got \"") +
                   to_string(c.data.objective) +
                   "\"; or \"sft\" with data.packing = true; or set data.attn_mask_type = "
                   "\"causal\")");
  }
  if (c.data.eod_mask_loss && (c.data.attn_mask_type != AttnMaskType::block_causal ||
                                c.data.objective != Objective::causal_lm)) {
    throw fail("data.eod_mask_loss",
               "true needs data.objective = \"causal_lm\" with data.attn_mask_type = "
               "\"block_causal\" (the EOS that ends each document is what it masks after)");
  }
  if (c.data.reset_position_ids && c.data.attn_mask_type != AttnMaskType::block_causal) {
    throw fail("data.reset_position_ids",
               "true needs data.attn_mask_type = \"block_causal\" (positions restart at each "
               "document only with document masking)");
  }
  if (c.data.source == DataSource::hdf5 && c.data.path.empty() && c.data.paths.empty()) {
    throw fail("data.path", "required (path to an HDF5 token file, see docs/data.md)");
  }
  if (c.train.run_dir.empty()) throw fail("train.run_dir", "must not be empty");
  if (const auto& p = c.train.profile_steps; !p.empty()) {
    if (p.size() != 2) {
      throw fail("train.profile_steps", "expected [first, last] (two step numbers) or [], got " +
                                            std::to_string(p.size()) + " values");
    }
    if (const std::string why = profile_steps_error(p[0], p[1]); !why.empty()) {
      throw fail("train.profile_steps", why);
    }
  }
  const auto& o = c.optim;
  if (o.min_lr > o.lr) {
    throw fail("optim.min_lr",
               num(o.min_lr) + " is out of range (expected 0 <= min_lr <= optim.lr = " +
                   num(o.lr) + ")");
  }
  if (o.decay_steps != 0 && o.decay_steps < o.warmup_steps) {
    throw fail("optim.decay_steps", std::to_string(o.decay_steps) +
                                        " is less than optim.warmup_steps = " +
                                        std::to_string(o.warmup_steps) +
                                        " (expected 0 or >= warmup_steps)");
  }
  if (o.lr_scheduler_type == LrSchedulerType::warmup_stable_decay) {
    const int64_t end = o.decay_steps > 0 ? o.decay_steps : c.train.max_steps;
    if (o.num_decay_steps < 1 || o.num_decay_steps > end - o.warmup_steps) {
      throw fail("optim.num_decay_steps",
                 std::to_string(o.num_decay_steps) + " is out of range for optim.lr_scheduler_type = "
                 "\"warmup_stable_decay\" (expected 1 <= num_decay_steps <= " +
                     std::string(o.decay_steps > 0 ? "optim.decay_steps" : "train.max_steps") + " - optim.warmup_steps = " +
                     std::to_string(end - o.warmup_steps) + ")");
    }
  }
  const std::vector<std::string> classes = family.wrap_classes();
  for (const auto& cls : c.fsdp.transformer_layer_cls_to_wrap) {
    if (std::find(classes.begin(), classes.end(), cls) == classes.end()) {
      throw fail("fsdp.transformer_layer_cls_to_wrap",
                 "unknown module class " + quoted(cls) + " for model.type = " +
                     quoted(c.model.type) + " (expected one of " + join(classes) + ")");
    }
  }
  if (c.fsdp.auto_wrap_policy == AutoWrapPolicy::TRANSFORMER_BASED_WRAP &&
      c.fsdp.transformer_layer_cls_to_wrap.empty()) {
    throw fail("fsdp.transformer_layer_cls_to_wrap",
               "empty with fsdp.auto_wrap_policy = \"TRANSFORMER_BASED_WRAP\" (expected some of " +
                   join(classes) + ", or auto_wrap_policy = \"NO_WRAP\")");
  }
  if (c.comm.backend == CommBackend::nccl && c.train.device == DeviceKind::cpu) {
    throw fail("comm.backend", "\"nccl\" needs train.device = \"cuda\" or \"auto\"");
  }
  // offload_optimizer_ratio is ignored unless offload_optimizer alone is on (as DeepSpeed's
  // ratio, inside its offload_optimizer block); beside the delayed update it is an error.
  if (c.fsdp.offload_optimizer_ratio < 1 && c.fsdp.params_resident() &&
      c.fsdp.delayed_parameter_update) {
    throw fail("fsdp.offload_optimizer_ratio",
               "below 1 is not supported with fsdp.delayed_parameter_update (the units on the "
               "device would step undelayed)");
  }
  if (!c.fsdp.activation_checkpointing && c.fsdp.recompute_num_layers >= 0) {
    throw fail("fsdp.recompute_num_layers",
               "must be -1 with fsdp.activation_checkpointing = false (no block recomputes; or "
               "set fsdp.activation_checkpointing = true)");
  }
  if (!c.checkpoint.enable && c.checkpoint.every > 0) {
    throw fail("checkpoint.every",
               "must be 0 with checkpoint.enable = false (no checkpoint is written; or set "
               "checkpoint.enable = true)");
  }
  if (c.fsdp.delayed_parameter_update && !c.fsdp.params_resident()) {
    throw fail("fsdp.delayed_parameter_update",
               "needs fsdp.offload_optimizer = true and fsdp.cpu_offload = false (the delayed "
               "update keeps the device's param_dtype shards from before it)");
  }
}

}  // namespace

void check_router_bias_update(const Config& c, bool has_router_bias, const KeyFail& fail) {
  if (c.optim.moe_router_bias_update_rate > 0 && !has_router_bias) {
    throw fail("optim.moe_router_bias_update_rate",
               "> 0 needs routers with a selection bias (e_score_correction_bias: model.type "
               "glm4_moe or deepseek_v3; expected 0 for \"" + c.model.type + "\")");
  }
}

void check_recompute_num_layers(const Config& c, int64_t num_blocks, const KeyFail& fail) {
  if (c.fsdp.activation_checkpointing && c.fsdp.recompute_num_layers > num_blocks) {
    throw fail("fsdp.recompute_num_layers",
               std::to_string(c.fsdp.recompute_num_layers) + " exceeds the model's " +
                   std::to_string(num_blocks) + " transformer blocks (expected -1 <= x <= " +
                   std::to_string(num_blocks) + ")");
  }
}

namespace {

// TOML text of one value, read back exactly by toml++.
std::string toml_value(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (ch < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", ch);
          out += buf;
        } else {
          out += static_cast<char>(ch);
        }
    }
  }
  return out + "\"";
}
std::string toml_value(int64_t v) { return std::to_string(v); }
std::string toml_value(uint64_t v) { return std::to_string(v); }
std::string toml_value(bool v) { return v ? "true" : "false"; }
std::string toml_value(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}
template <class E>
  requires kIsConfigEnum<E>
std::string toml_value(E v) {
  return toml_value(name_of(v));
}
// An array of the elements' TOML texts. (Appended, not "[" + ... + "]": GCC 12's -Wrestrict
// misfires on that concatenation once inlined.)
template <class T>
std::string toml_array(const std::vector<T>& v) {
  std::vector<std::string> items;
  for (const T& e : v) {
    if constexpr (std::is_same_v<T, int64_t>) {
      items.push_back(std::to_string(e));
    } else {
      items.push_back(toml_value(e));
    }
  }
  std::string out = "[";
  out += join(items);
  out += ']';
  return out;
}
std::string toml_value(const std::vector<int64_t>& v) { return toml_array(v); }
std::string toml_value(const std::vector<double>& v) { return toml_array(v); }
std::string toml_value(const std::vector<std::string>& v) { return toml_array(v); }

}  // namespace

ShardingStrategy parse_sharding_strategy(const std::string& name) {
  ShardingStrategy s{};
  if (!lookup_enum(name, &s)) {
    throw InputError(unknown_value<ShardingStrategy>("fsdp.sharding_strategy", name));
  }
  return s;
}

std::string profile_steps_error(int64_t first, int64_t last) {
  if (first < 1) return "first step " + std::to_string(first) + " is out of range (expected >= 1)";
  if (last < first) {
    return "last step " + std::to_string(last) + " is before the first step " +
           std::to_string(first) + " (expected first <= last)";
  }
  return "";
}

namespace {

// Other names a key is accepted under (the table's name is what to_toml writes), e.g.
// Accelerate's fsdp_offload_params for PyTorch's CPUOffload.
struct KeyAlias {
  const char* section;
  const char* alias;
  const char* key;
};
constexpr KeyAlias kKeyAliases[] = {{"fsdp", "offload_params", "cpu_offload"}};

// "section.alias" -> "section.key"; any other name unchanged.
std::string canonical_key(const std::string& full) {
  for (const KeyAlias& a : kKeyAliases) {
    if (full == std::string(a.section) + "." + a.alias) return std::string(a.section) + "." + a.key;
  }
  return full;
}

// Renames each alias of the file to its key; InputError when the file gives both.
void resolve_aliases(toml::table& doc, const std::string& origin) {
  for (const KeyAlias& a : kKeyAliases) {
    auto* t = doc.get_as<toml::table>(a.section);
    if (!t || !t->contains(a.alias)) continue;
    const std::string sec(a.section);
    if (t->contains(a.key)) {
      throw InputError(origin + ": " + sec + "." + a.alias + " and " + sec + "." + a.key +
                       " are both given (the first is another name of the second)");
    }
    t->get(a.alias)->visit([&](const auto& value) { t->insert(a.key, value); });
    t->erase(a.alias);
  }
}

// A [model] key with a dot names a field of a nested Hugging Face config dict
// ("rope_scaling.factor"); the file may write it as a dotted key, an inline table
// (rope_scaling = { factor = 8.0 }) or a [model.rope_scaling] section. This flattens every
// sub-table of [model] into such keys, so the rest of parsing sees one level.
void flatten_model_table(toml::table& doc) {
  auto* model = doc.get_as<toml::table>("model");
  if (!model) return;
  for (bool again = true; again;) {
    again = false;
    for (auto it = model->begin(); it != model->end(); ++it) {
      const toml::table* sub = it->second.as_table();
      if (!sub) continue;
      const std::string prefix(it->first.str());
      const toml::table copy = *sub;
      model->erase(it);
      for (const auto& [k, v] : copy) {
        v.visit([&](const auto& value) { model->insert(prefix + "." + std::string(k.str()), value); });
      }
      again = true;
      break;
    }
  }
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides, const ModelSchemas& models) {
  toml::table doc;
  try {
    doc = toml::parse(toml_text, std::string_view(origin));
  } catch (const toml::parse_error& e) {
    const auto& pos = e.source().begin;
    std::string what(e.description());
    std::replace(what.begin(), what.end(), '\n', ' ');
    throw InputError(origin + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column) +
                     ": " + what);
  }

  // Overrides, last one wins (their keys are checked once model.type is known).
  std::map<std::string, Override> set;
  for (const auto& text : overrides) {
    std::string key;
    Override o = parse_override(text, &key);
    set.insert_or_assign(canonical_key(key), std::move(o));
  }
  resolve_aliases(doc, origin);
  flatten_model_table(doc);

  // model.type first: it decides which [model] keys exist.
  std::string type = Config{}.model.type;
  std::string type_origin = origin;
  if (auto it = set.find("model.type"); it != set.end()) {
    type_origin = "--set " + it->second.text;
    convert(*it->second.value.get("k"), type_origin, "model.type", &it->second.raw, type);
  } else if (const auto* t = doc.get_as<toml::table>("model")) {
    if (const auto* node = t->get("type")) convert(*node, origin, "model.type", nullptr, type);
  }
  const ModelSchema* schema_ptr = nullptr;
  try {
    schema_ptr = &model_schema(models, type);
  } catch (const Error& e) {
    throw InputError(type_origin + ": " + e.what());
  }
  const ModelSchema& schema = *schema_ptr;
  for (const auto& [key, o] : set) {
    if (!is_key(key, schema)) {
      throw InputError("--set " + o.text + ": unknown key '" + key + "'" + suggestion(key, schema) +
                       (key.rfind("model.", 0) == 0 ? " for model.type = " + fsdp::quoted(type) : ""));
    }
  }

  // Unknown sections and keys in the file.
  for (const auto& [sec_key, sec_node] : doc) {
    const std::string sec(sec_key.str());
    const auto* table = sec_node.as_table();
    if (!is_section(sec)) {
      // Name the first key inside, so the suggestion can be a full key.
      std::string wrong = sec;
      if (table && !table->empty()) wrong += "." + std::string(table->begin()->first.str());
      throw InputError(origin + ": unknown key '" + wrong + "'" + suggestion(wrong, schema));
    }
    if (!table) {
      throw InputError(origin + ": " + sec + ": expected a table ([" + sec + "]), got " +
                       type_name(sec_node.type()));
    }
    for (const auto& [key, node] : *table) {
      const std::string full = sec + "." + std::string(key.str());
      if (!is_key(full, schema)) {
        throw InputError(origin + ": unknown key '" + full + "'" + suggestion(full, schema) +
                         (sec == "model" ? " for model.type = " + fsdp::quoted(type) : ""));
      }
    }
  }

  Config config = config_of_type(schema);
  config.source_path = origin;
  std::map<std::string, std::string> origins;  // key -> "--set ..." for overridden keys
  std::set<std::string> given;  // keys the file or an override set
  visit_keys(config, [&](const char* sec, const char* key, auto& field, const KeyInfo&) {
    const std::string full = std::string(sec) + "." + key;
    if (auto it = set.find(full); it != set.end()) {
      const std::string where = "--set " + it->second.text;
      origins[full] = where;
      convert(*it->second.value.get("k"), where, full, &it->second.raw, field);
      given.insert(full);
    } else if (const auto* t = doc.get_as<toml::table>(sec)) {
      if (const auto* node = t->get(key)) {
        convert(*node, origin, full, nullptr, field);
        given.insert(full);
      }
    }
  });
  // Keys whose default is the model's: the wrap classes (Hugging Face's _no_split_modules)
  // and the objective (its first: causal_lm for GPT-2, seq2seq for T5).
  if (!given.count("fsdp.transformer_layer_cls_to_wrap")) {
    config.fsdp.transformer_layer_cls_to_wrap = schema.wrap_classes();
  }
  if (!given.count("data.objective")) config.data.objective = schema.objectives().front();

  validate(config, schema, [&](const std::string& key) {
    auto it = origins.find(key);
    return it == origins.end() ? origin : it->second;
  });
  return config;
}

Config load_config(const std::string& toml_path, const std::vector<std::string>& overrides,
                   const ModelSchemas& models) {
  std::error_code ec;
  std::ifstream in;
  // stat before open: opening a FIFO would block until a writer comes.
  const auto st = std::filesystem::status(toml_path, ec);
  if (!ec && std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    throw InputError(toml_path + ": cannot read config file (" +
                     (std::filesystem::is_directory(st) ? "a directory" :
                      std::filesystem::is_fifo(st)      ? "a FIFO" : "not a regular file") +
                     ", expected a TOML file)");
  }
  in.open(toml_path, std::ios::binary);
  std::ostringstream text;
  if (in.is_open()) text << in.rdbuf();
  if (!in.is_open() || in.bad()) throw InputError(toml_path + ": cannot read config file");
  return parse_config(text.str(), toml_path, overrides, models);
}

std::string to_toml(const Config& config) {
  std::string out;
  std::string current;
  visit_keys(config, [&](const char* sec, const char* key, const auto& field,
                         const KeyInfo&) {
    if (current != sec) {
      out += (current.empty() ? "[" : "\n[") + std::string(sec) + "]\n";
      current = sec;
    }
    out += std::string(key) + " = " + toml_value(field) + "\n";
  });
  return out;
}

namespace {

// A field's type as docs/config.md's type column names it when the key has no range.
template <class T>
std::string type_text() {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>) return "integer";
  else if constexpr (std::is_same_v<T, double>) return "float";
  else if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, std::vector<std::string>>) return "array of strings";
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return "array of integers";
  else if constexpr (std::is_same_v<T, std::vector<double>>) return "array of floats";
  else if constexpr (kIsConfigEnum<T>) return "one of " + join(config_names<T>());
  else static_assert(!sizeof(T), "type_text: a field type the key table does not describe");
}

}  // namespace

std::vector<KeyDescription> describe_keys(const ModelSchema& family) {
  std::map<std::string, ModelKey> family_keys;
  for (const ModelKey& k : family.keys()) family_keys.emplace(k.name, k);
  const Config defaults = config_of_type(family);
  std::vector<KeyDescription> out;
  visit_keys(defaults, [&](const char* sec, const char* key, const auto& field,
                           const KeyInfo& info) {
    using T = std::decay_t<decltype(field)>;
    KeyDescription d;
    d.key = std::string(sec) + "." + key;
    d.type = info.range.bounded() ? info.range.doc_type() : type_text<T>();
    d.default_value = toml_value(field);
    d.peer = info.peer;
    d.doc = info.doc;
    d.resume_may_change = info.resume == kMayChange;
    if (auto it = family_keys.find(key); std::string(sec) == "model" && it != family_keys.end()) {
      const ModelKey& k = it->second;
      d.peer = k.hf_name.empty() ? "" : "HF " + family.hf_config_class() + "." + k.hf_name;
      d.doc = k.doc;
      if (k.range.bounded()) {  // an array's range bounds each element
        d.type = (std::is_same_v<T, std::vector<double>> ? "array of floats, each " : "") +
                 k.range.doc_type();
      }
      if (!k.choices.empty()) d.type = "one of " + join(k.choices);
      d.family_key = true;
    }
    out.push_back(std::move(d));
  });
  return out;
}

void check_config(const Config& config, const ModelSchemas& models) {
  validate(config, model_schema(models, config.model.type),
           [](const std::string&) { return std::string(); });
}

bool resume_may_change(const std::string& key) {
  static const std::set<std::string> may_change = [] {
    std::set<std::string> keys;
    const Config defaults;
    visit_keys(defaults, [&](const char* sec, const char* k, const auto&, const KeyInfo& info) {
      if (info.resume == kMayChange) keys.insert(std::string(sec) + "." + k);
    });
    return keys;
  }();
  return may_change.count(key) != 0;
}


// ---- ModelConfig and the schemas -----------------------------------------------------------

std::string KeyRange::bounds(const char* name) const {
  // An integer range prints its bounds as integers (16777216, not 1.67772e+07).
  auto num = [&](double x) {
    return integer ? std::to_string(static_cast<int64_t>(x)) : format_number(x);
  };
  if (hi_bound == none) return std::string(lo_bound == open ? "> " : ">= ") + num(lo);
  return num(lo) + (lo_bound == open ? " < " : " <= ") + name +
         (hi_bound == open ? " < " : " <= ") + num(hi);
}
std::string KeyRange::text() const { return (integer ? "an integer " : "") + bounds(var) + note; }
std::string KeyRange::doc_type() const {
  return std::string(integer ? "integer" : "float") + (hi_bound == none ? " " : ", ") +
         bounds("x");
}

std::string value_violation(const KeyRange& range, const std::vector<std::string>& choices,
                            const ModelValue& v) {
  if (const auto* a = std::get_if<std::vector<double>>(&v); a && range.bounded()) {
    for (std::size_t i = 0; i < a->size(); ++i) {  // each element in the range
      if (!range.contains((*a)[i])) {
        return "element " + std::to_string(i) + " = " + format_number((*a)[i]) +
               " is out of range (expected " + range.text() + ")";
      }
    }
  }
  if (range.bounded() && (v.index() == 0 || v.index() == 1)) {
    const double x = v.index() == 0 ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
    if (!range.contains(x)) {
      return (v.index() == 0 ? std::to_string(std::get<int64_t>(v)) : format_number(x)) +
             " is out of range (expected " + range.text() + ")";
    }
  }
  if (const auto* s = std::get_if<std::string>(&v); s && !choices.empty() &&
      std::find(choices.begin(), choices.end(), *s) == choices.end()) {
    return "unknown value " + quoted(*s) + " (expected one of " + join(choices) + ")";
  }
  return {};
}

const char* value_type_name(const ModelValue& v) {
  switch (v.index()) {
    case 0: return "an integer";
    case 1: return "a number";
    case 2: return "a boolean";
    case 3: return "a string";
    default: return "an array of numbers";
  }
}

bool model_value_from_json(const nlohmann::json& v, const ModelValue& like, ModelValue* out) {
  switch (like.index()) {
    case 0:
      if (!v.is_number_integer()) return false;
      *out = v.get<int64_t>();
      return true;
    case 1:
      if (!v.is_number()) return false;
      *out = v.get<double>();
      return true;
    case 2:
      if (!v.is_boolean()) return false;
      *out = v.get<bool>();
      return true;
    case 3:
      if (!v.is_string()) return false;
      *out = v.get<std::string>();
      return true;
    default: {
      if (!v.is_array()) return false;
      std::vector<double> a;
      for (const nlohmann::json& e : v) {
        if (!e.is_number()) return false;
        a.push_back(e.get<double>());
      }
      *out = std::move(a);
      return true;
    }
  }
}

namespace {

const ModelValue& lookup(const ModelConfig& c, const std::string& key) {
  if (const ModelValue* v = c.find(key)) return *v;
  throw Error("model." + key + ": not a key of model.type = \"" + c.type + "\"");
}

template <class T>
const T& typed(const ModelConfig& c, const std::string& key) {
  const ModelValue& v = lookup(c, key);
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw Error("model." + key + ": holds " + value_type_name(v) + ", read as another type");
}

}  // namespace

ModelConfig ModelConfig::of(const ModelSchema& schema) {
  ModelConfig c;
  c.type = schema.type();
  for (const ModelKey& k : schema.keys()) c.values.emplace_back(k.name, k.default_value);
  return c;
}

const ModelValue* ModelConfig::find(const std::string& key) const {
  for (const auto& [name, value] : values) {
    if (name == key) return &value;
  }
  return nullptr;
}

int64_t ModelConfig::integer(const std::string& key) const { return typed<int64_t>(*this, key); }
double ModelConfig::number(const std::string& key) const { return typed<double>(*this, key); }
bool ModelConfig::boolean(const std::string& key) const { return typed<bool>(*this, key); }
const std::string& ModelConfig::string(const std::string& key) const {
  return typed<std::string>(*this, key);
}

void ModelConfig::set(const std::string& key, ModelValue value) {
  for (auto& [name, old] : values) {
    if (name != key) continue;
    if (old.index() != value.index()) {
      throw Error("model." + key + ": expected " + std::string(value_type_name(old)) + ", got " +
                  value_type_name(value));
    }
    old = std::move(value);
    return;
  }
  lookup(*this, key);  // throws: not a key of the family
}

const ModelSchema& model_schema(const ModelSchemas& models, const std::string& type) {
  std::string names;
  for (const ModelSchema* m : models) {
    if (m->type() == type) return *m;
    names += (names.empty() ? "" : ", ") + m->type();
  }
  throw InputError("model.type: unknown value \"" + type + "\" (expected one of " + names + ")");
}

}  // namespace fsdp
