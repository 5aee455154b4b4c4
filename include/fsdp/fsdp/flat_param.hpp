// fsdp/fsdp/flat_param.hpp: the FlatParameter layout of one FSDP unit.
//
// As in PyTorch FSDP (torch.distributed.fsdp FlatParameter) and llm.c's ShardInfo: the
// unit's parameters are packed, in declaration order, into one flat fp32 buffer, padded
// at the end to a multiple of the number of shards; shard s owns the contiguous slice
// [s * shard_numel, (s+1) * shard_numel). The layout is pure metadata: it is what a
// checkpoint stores to rebuild full tensors without the training config.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

// How a parameter is initialised (GPT-2 initialisation, counter-based RNG).
// normal: N(0, init_std); zeros; ones; log_uniform: log(U(init_low, init_high)) (Qwen3.5's
// A_log: HF's torch.empty(n).uniform_(0.01, 16).log_()).
enum class InitKind : int { normal = 0, zeros = 1, ones = 2, log_uniform = 3 };

// One original parameter inside a FlatParameter.
struct ParamSpec {
  std::string name;              // Hugging Face-style, e.g. "h.0.attn.c_attn.weight"
  std::vector<int64_t> shape;    // logical shape as the model uses it (row-major)
  InitKind init = InitKind::normal;
  float init_std = 0.02f;        // for InitKind::normal
  bool weight_decay = true;      // AdamW decay applies (false: biases, LayerNorm, embeddings)
  // Vocabulary-indexed matrices (token embedding, LM head) padded for GEMM alignment
  // (model.pad_vocab_multiple, Megatron-LM's --make-vocab-size-divisible-by): shape[0] is the
  // padded vocabulary and rows [vocab_rows, shape[0]) are padding: initialised to 0, outside
  // the softmax (so their gradient is 0 and they stay 0 under AdamW/SGD), and cut off where
  // tensors leave or enter fsdp_train (fsdp_merge, init_from), which see [vocab_rows, ...].
  // 0: not a vocabulary matrix; every row is the model's.
  int64_t vocab_rows = 0;
  // A row initialised to 0 whatever `init` says (nn.Embedding's padding_idx: HF's
  // _init_weights zeroes it); -1: none. Initialisation only: training changes it like any row.
  int64_t zero_row = -1;
  float init_low = 0.f, init_high = 1.f;  // for InitKind::log_uniform
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  // The model's own shape: shape with shape[0] = vocab_rows when vocab_rows > 0.
  std::vector<int64_t> unpadded_shape() const {
    std::vector<int64_t> s = shape;
    if (vocab_rows > 0 && !s.empty()) s[0] = vocab_rows;
    return s;
  }
  // Elements of the model's own rows: a row-major prefix [0, unpadded_numel()) of the tensor.
  int64_t unpadded_numel() const {
    int64_t n = 1;
    for (int64_t d : unpadded_shape()) n *= d;
    return n;
  }
};

// A parameter placed in the flat buffer: elements [offset, offset + numel()).
struct FlatEntry {
  ParamSpec spec;
  int64_t offset = 0;
};

struct FlatParamLayout {
  std::string unit_name;         // e.g. "root", "h.0"
  std::vector<FlatEntry> entries;
  int64_t numel = 0;             // sum of entry numels (unpadded)
  int64_t num_shards = 1;        // shard-group size this layout was built for
  int64_t padded_numel = 0;      // numel rounded up to a multiple of num_shards
  int64_t shard_numel = 0;       // padded_numel / num_shards

  // Packs `params` in order and pads for `num_shards` shards.
  static FlatParamLayout build(std::string unit_name, std::vector<ParamSpec> params,
                               int64_t num_shards);
  // [begin, end) of shard s in flat coordinates (may extend into the padding).
  int64_t shard_begin(int64_t s) const { return s * shard_numel; }
  int64_t shard_end(int64_t s) const { return (s + 1) * shard_numel; }
};

}  // namespace fsdp
